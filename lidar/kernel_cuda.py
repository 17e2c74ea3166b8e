"""The ray-surfel LiDAR kernel on an NVIDIA GPU (numba-cuda): lidar.kernel's model, ray for ray.

Why numba-cuda: it is the CPU kernels' own language, so the per-surfel and per-ray maths are lidar.kernel's
njit functions themselves (`surfel_cap`, `alpha_range`, `actor_hit`, `composite_step`: numba compiles a CPU
function called from a CUDA kernel for the GPU), not a port that could drift; its CUDA simulator
(NUMBA_ENABLE_CUDASIM=1) runs the same kernels on a CPU, which the tests use on tiny cases; and the GPU
machines have it installed (NVIDIA Warp's wheel is too big to carry there, and Triton has no per-thread loops
over variable-length lists to speak of).

A bundle of rays (lidar.render's bundles: columns close in time, one reference pose) is traced in four steps,
gsplat's tile-intersection scheme on the LiDAR's angle grid:
1. one thread per surfel: its cap and the rectangle of grid cells it can reach (`surfel_cap`);
2. one thread per surfel writes a key per cell it meets, (cell << 32) | its depth's float32 bits, beside
   its index, at its offset in the prefix sum of the rectangle areas;
3. one device radix sort (torch.sort, stable) orders the keys: each cell's surfels are then a slice in
   depth order, ties by index, as the CPU's depth keys and counting sort give them;
4. one thread per ray (rays in cell order, so a warp reads one list) composites its cell's surfels front to
   back until its transmittance runs out, culling by the caps as the CPU does.
The grid and each ray's cell are computed on the device too (`bundle_grid` on tensors: only the seam search's
SEAM_BINS occupancy and the grid's seven numbers come to the host, with the pair count that sizes the sort).
Outputs are float32 device tensors (the CPU kernel accumulates in float32 too).
"""
from __future__ import annotations

import functools
import math
import os
from typing import Optional

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 overloads this alias of vstack on its first compile, and
    np.row_stack = np.vstack  # numpy 2.5 removed it: without it every CUDA kernel fails to compile (seen on an H200)
from numba import cuda  # noqa: E402

from gsim.render.numba_tiles import ONE

from .kernel import (N_REC, ZERO, actor_hit, alpha_range, bundle_grid, composite_step, f32, surfel_cap,
                     surfel_geometry, surfel_record)

THREADS = 128


def simulated() -> bool:
    """True under numba's CUDA simulator (kernels run as Python on the CPU: for tests on tiny inputs)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> Optional[str]:
    """None when the kernels run here (a CUDA GPU, or the simulator), else why not."""
    try:
        import torch
    except ImportError as e:
        return f"torch is not importable ({e})"
    if simulated():
        return None
    if not torch.cuda.is_available():
        return "CUDA is not available (torch.cuda.is_available() is False)"
    try:
        if not cuda.is_available():
            return "numba finds no CUDA driver or GPU (numba.cuda.is_available() is False); install numba-cuda"
    except Exception as e:  # a broken CUDA install: report it, do not fall back silently
        return f"numba.cuda failed: {type(e).__name__}: {e}"
    return None


# the simulator cannot pass its arrays to compiled functions: it runs their Python source instead
_record, _cap_of, _geometry, _actor = (
    (f.py_func for f in (surfel_record, surfel_cap, surfel_geometry, actor_hit)) if simulated()
    else (surfel_record, surfel_cap, surfel_geometry, actor_hit))


@cuda.jit
def _records(means, quats, scales, opac, rec):
    i = cuda.grid(1)
    if i < means.shape[0]:
        _record(i, means, quats, scales, opac, rec)


@cuda.jit
def _caps(rec, scales, group, world_from_group, o_ref, R_ref, margin, tan_div, grid, rect, depth, cap):
    i = cuda.grid(1)
    if i < rec.shape[0]:
        _cap_of(i, rec, scales, group, world_from_group, o_ref, R_ref, margin, tan_div, grid, rect, depth, cap)


@cuda.jit
def _pairs(rect, depth_bits, offset, n_az, keys, values):
    i = cuda.grid(1)
    if i < rect.shape[0]:
        k = offset[i]
        for y in range(rect[i, 2], rect[i, 3]):
            for x in range(rect[i, 0], rect[i, 1]):
                keys[k] = (np.int64(y * n_az + (x - n_az if x >= n_az else x)) << 32) | np.int64(depth_bits[i])
                values[k] = i
                k += 1


@cuda.jit
def _composite(cell_start, lst, ray_cell, rays, rec, cap, feats, group, group_from_world, o_ref, origins, dirs,
              column, inv2, hit, alpha, range_sum, median, normal, feat_sum, cand):
    t = cuda.grid(1)
    if t >= rays.shape[0]:
        return
    r, c = rays[t], ray_cell[t]
    o0, o1, o2 = f32(origins[r, 0] - o_ref[0]), f32(origins[r, 1] - o_ref[1]), f32(origins[r, 2] - o_ref[2])
    d0, d1, d2 = f32(dirs[r, 0]), f32(dirs[r, 1]), f32(dirs[r, 2])
    T, acc, rs, med, nx, ny, nz, n_cand = ONE, ZERO, ZERO, ZERO, ZERO, ZERO, ZERO, 0
    for k in range(cell_start[c], cell_start[c + 1]):
        if T == ZERO:
            break
        j = lst[k]
        if d0 * cap[j, 3] + d1 * cap[j, 4] + d2 * cap[j, 5] < cap[j, 6]:
            continue  # outside its cap: the ray cannot reach the alpha threshold
        geo = _geometry(rec, j)
        g = group[j]
        if g == 0:
            al, rng, nd = alpha_range(cap[j, 0] - o0, cap[j, 1] - o1, cap[j, 2] - o2, d0, d1, d2, geo, inv2)
            s = -ONE if nd > ZERO else ONE
            n0, n1, n2 = s * rec[j, 9], s * rec[j, 10], s * rec[j, 11]
        else:
            al, rng, n0, n1, n2 = _actor(group_from_world, g, column[r], origins[r, 0], origins[r, 1],
                                            origins[r, 2], dirs[r, 0], dirs[r, 1], dirs[r, 2], rec, j, geo,
                                            inv2)
        T, w, crossed = composite_step(T, acc, al, hit)
        if w > ZERO:
            acc += w
            rs += w * rng
            if crossed:
                med = rng
            nx += w * n0
            ny += w * n1
            nz += w * n2
            for f in range(feats.shape[1]):
                feat_sum[r, f] += w * feats[j, f]
            if n_cand < cand.shape[1]:
                cand[r, n_cand] = j
                n_cand += 1
    alpha[r], range_sum[r], median[r] = acc, rs, med
    normal[r, 0], normal[r, 1], normal[r, 2] = nx, ny, nz


def _blocks(n: int) -> int:
    return max(1, (n + THREADS - 1) // THREADS)


class Tracer:
    """One `lidar.render.trace` on the device: the surfels (cached on their SurfelGroups, so a scene is uploaded
    once), the rays and the outputs live there; `bundle` traces one bundle, `result` returns trace's dict."""

    def __init__(self, groups, group_from_world: np.ndarray, origins: np.ndarray, dirs: np.ndarray,
                 column: np.ndarray, candidates: int = 0):
        import torch
        self.torch = torch
        self.device = torch.device("cpu" if simulated() else "cuda")
        self.surfels = device_surfels(groups, self.device)
        t = self.tensor
        self.gfw, self.origins, self.dirs = t(group_from_world), t(origins), t(dirs)
        self.column = t(column, torch.int64)
        R, F = len(dirs), groups.features.shape[1]
        z = lambda *shape: torch.zeros(shape, dtype=torch.float32, device=self.device)
        self.out = {"alpha": z(R), "range_sum": z(R), "median": z(R), "normal": z(R, 3), "features": z(R, F),
                    "candidates": torch.full((R, candidates), -1, dtype=torch.int64, device=self.device)}

    def tensor(self, x, dtype=None):
        return self.torch.as_tensor(np.ascontiguousarray(x), dtype=dtype, device=self.device)

    def bundle(self, world_from_group: np.ndarray, margin: np.ndarray, o_ref: np.ndarray, R_ref: np.ndarray,
               rays: np.ndarray, divergence: float, hit_alpha: float) -> None:
        """Trace rays ``rays`` (indices) of this trace from the reference (o_ref, R_ref)."""
        torch = self.torch
        s = self.surfels
        rays, o_ref, R_ref = self.tensor(rays), self.tensor(o_ref), self.tensor(R_ref)
        grid, cell = bundle_grid(self.dirs, rays, R_ref)
        n, n_az, n_cells = len(s["rec"]), int(grid[2]), int(grid[2] * grid[5])
        rect = torch.zeros((n, 4), dtype=torch.int64, device=self.device)
        depth = torch.zeros(n, dtype=torch.float32, device=self.device)
        cap = torch.zeros((n, 7), dtype=torch.float32, device=self.device)
        a = _array
        _caps[_blocks(n), THREADS](a(s["rec"]), a(s["scales"]), a(s["group"]), a(self.tensor(world_from_group)),
                                  a(o_ref), a(R_ref), a(self.tensor(margin)),
                                  math.tan(divergence), a(self.tensor(grid)), a(rect), a(depth), a(cap))
        area = (rect[:, 1] - rect[:, 0]) * (rect[:, 3] - rect[:, 2])
        end = torch.cumsum(area, 0)
        total = int(end[-1]) if n else 0  # the one host sync of the binning: the pair count sizes the sort
        keys = torch.empty(total, dtype=torch.int64, device=self.device)
        values = torch.empty(total, dtype=torch.int64, device=self.device)
        _pairs[_blocks(n), THREADS](a(rect), a(depth.view(torch.int32)), a(end - area), n_az, a(keys), a(values))
        keys, perm = torch.sort(keys, stable=True)
        lst = values[perm]
        cell_start = torch.searchsorted(keys >> 32, torch.arange(n_cells + 1, device=self.device))
        cell, by_cell = torch.sort(cell, stable=True)
        o = self.out
        _composite[_blocks(len(rays)), THREADS](
            a(cell_start), a(lst), a(cell), a(rays[by_cell]), a(s["rec"]), a(cap),
            a(s["features"]), a(s["group"]), a(self.gfw), a(o_ref), a(self.origins), a(self.dirs),
            a(self.column), f32(1.0 / divergence ** 2), f32(hit_alpha), a(o["alpha"]), a(o["range_sum"]),
            a(o["median"]), a(o["normal"]), a(o["features"]), a(o["candidates"]))

    def result(self) -> dict:
        """trace's outputs as numpy arrays (float64, as the CPU kernel's)."""
        return {k: v.cpu().numpy().astype(np.int64 if k == "candidates" else np.float64)
                for k, v in self.out.items()}


def _array(t):
    """A torch tensor as the kernels take it: a CUDA array view on the GPU, the tensor's numpy view in the
    simulator (writes land in the tensor)."""
    if t.device.type == "cpu":
        return t.numpy()
    if t.numel() == 0:  # (no features, no candidates) an empty numba array: no null device pointer to resolve
        return cuda.device_array(tuple(t.shape), np.dtype(str(t.dtype).removeprefix("torch.")))
    return cuda.as_cuda_array(t.detach())


def device_surfels(groups, device) -> dict:
    """The surfels of a SurfelGroups on ``device`` (records, scales, features, group ids): those of `device_groups`
    as they are, numpy ones uploaded once and kept in the groups' cache."""
    import torch
    if torch.is_tensor(groups.rec):
        return {"rec": groups.rec, "scales": groups.scales, "features": groups.features, "group": groups.group}
    key = f"device:{device}"
    if key not in groups.cache:
        t = lambda x, dt: torch.as_tensor(np.ascontiguousarray(x), dtype=dt, device=device)  # noqa: E731
        groups.cache[key] = {"rec": t(groups.rec, torch.float32), "scales": t(groups.scales, torch.float32),
                             "features": t(groups.features, torch.float32), "group": t(groups.group, torch.int64)}
    return groups.cache[key]


def device_groups(means, quats, scales, opacities, features, group, tracks):
    """`SurfelGroups.build` on the device from torch tensors there (a trainer's activated parameters): records,
    scales, features and group ids stay there, for the cuda backend (the groups' radii, G numbers, come to the
    host; quats are not kept: the numba strip kernel's discs are not made from them)."""
    import torch

    from .render import SurfelGroups
    dev, n = means.device, len(means)
    f64 = lambda x: x.detach().to(torch.float64).contiguous()  # noqa: E731  (as build: float64 maths)
    rec = torch.empty((n, N_REC), dtype=torch.float32, device=dev)
    _records[_blocks(n), THREADS](_array(f64(means)), _array(f64(quats)), _array(f64(scales)),
                                  _array(f64(opacities)), _array(rec))
    group = group.to(torch.int64)
    act = group > 0
    reach = (f64(means).norm(dim=1) + 3.5 * f64(scales).max(1).values)[act]
    radius = torch.zeros(1 + len(tracks), dtype=torch.float64, device=dev).scatter_reduce(0, group[act], reach, "amax")
    feats = features.detach().float() if features is not None else torch.zeros((n, 0), device=dev)
    return SurfelGroups(rec, None, scales.detach().float(), feats, group, tuple(tracks), radius.cpu().numpy())
