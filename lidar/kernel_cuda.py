"""The ray-surfel LiDAR kernel on an NVIDIA GPU (numba-cuda): lidar.kernel's model, ray for ray.

Why numba-cuda: it is the CPU kernels' own language, so the per-surfel and per-ray maths are lidar.kernel's
njit functions themselves (`surfel_cap`, `alpha_range`, `actor_hit`, `composite_step`: numba compiles a CPU
function called from a CUDA kernel for the GPU), not a port that could drift; its CUDA simulator
(NUMBA_ENABLE_CUDASIM=1) runs the same kernels on a CPU, which the tests use on tiny cases; and the GPU
machines have it installed (NVIDIA Warp's wheel is too big to carry there, and Triton has no per-thread loops
over variable-length lists to speak of).

A bundle of rays (lidar.render's bundles: columns close in time, one reference pose) is binned in three steps,
gsplat's tile-intersection scheme on the LiDAR's angle grid:
1. one thread per surfel: its cap and the rectangle of grid cells it can reach (`surfel_cap`); the surfels
   that reach a cell get a slot in the bundle's table (their caps are the bundle's own: its reference pose);
2. one thread per slot writes a key per cell it meets, (cell << 32) | its depth's float32 bits, beside
   its slot, at its offset in the prefix sum of the rectangle areas;
3. one device radix sort (torch.sort, stable) orders the keys: each cell's surfels are then a slice in
   depth order, ties by index, as the CPU's depth keys and counting sort give them.
Then every bundle's rays are composited in ONE launch (`result`), one thread per ray (rays in cell order, so a
warp reads one list), each through its bundle's cell list front to back until its transmittance runs out,
culling by the caps as the CPU does: a bundle alone is a few thousand rays, too few threads to fill a GPU.
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
def _pairs(rect, depth_bits, offset, n_az, keys, values):  # (a bundle's slots: rect and depth_bits are theirs)
    i = cuda.grid(1)
    if i < rect.shape[0]:
        k = offset[i]
        for y in range(rect[i, 2], rect[i, 3]):
            for x in range(rect[i, 0], rect[i, 1]):
                keys[k] = (np.int64(y * n_az + (x - n_az if x >= n_az else x)) << 32) | np.int64(depth_bits[i])
                values[k] = i
                k += 1


@cuda.jit
def _composite(cell_start, lst, src, ray_cell, rays, ray_bundle, rec, cap, feats, group, group_from_world, o_refs,
               origins, dirs, column, inv2, hit, alpha, range_sum, median, normal, feat_sum, cand):
    t = cuda.grid(1)
    if t >= rays.shape[0]:
        return
    r, c, b = rays[t], ray_cell[t], ray_bundle[t]
    o0, o1, o2 = (f32(origins[r, 0] - o_refs[b, 0]), f32(origins[r, 1] - o_refs[b, 1]),
                  f32(origins[r, 2] - o_refs[b, 2]))
    d0, d1, d2 = f32(dirs[r, 0]), f32(dirs[r, 1]), f32(dirs[r, 2])
    T, acc, rs, med, nx, ny, nz, n_cand = ONE, ZERO, ZERO, ZERO, ZERO, ZERO, ZERO, 0
    for k in range(cell_start[c], cell_start[c + 1]):
        if T == ZERO:
            break
        q = lst[k]  # the slot in the bundle tables (caps), src[q] the surfel
        if d0 * cap[q, 3] + d1 * cap[q, 4] + d2 * cap[q, 5] < cap[q, 6]:
            continue  # outside its cap: the ray cannot reach the alpha threshold
        j = src[q]
        geo = _geometry(rec, j)
        g = group[j]
        if g == 0:
            al, rng, nd = alpha_range(cap[q, 0] - o0, cap[q, 1] - o1, cap[q, 2] - o2, d0, d1, d2, geo, inv2)
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
    once), the rays and the outputs live there; `bundle` bins one bundle, `result` composites every bundle's rays
    in one launch and returns trace's dict."""

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
        self.inv2 = self.hit = None
        self.bins = []  # per bundle: cell_start, lst (slots), src (slot -> surfel), cap (slots), rays, cells, o_ref

    def tensor(self, x, dtype=None):
        return self.torch.as_tensor(np.ascontiguousarray(x), dtype=dtype, device=self.device)

    def bundle(self, world_from_group: np.ndarray, margin: np.ndarray, o_ref: np.ndarray, R_ref: np.ndarray,
               rays: np.ndarray, divergence: float, hit_alpha: float) -> None:
        """Bin the surfels for rays ``rays`` (indices) of this trace, seen from the reference (o_ref, R_ref)."""
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
        src = torch.nonzero(area > 0)[:, 0]  # the bundle's slots (a host sync: their count)
        rect, depth, area = rect[src], depth[src], area[src]
        end = torch.cumsum(area, 0)
        total = int(end[-1]) if len(src) else 0  # (a host sync: the pair count sizes the sort)
        keys = torch.empty(total, dtype=torch.int64, device=self.device)
        values = torch.empty(total, dtype=torch.int64, device=self.device)
        _pairs[_blocks(len(src)), THREADS](a(rect), a(depth.view(torch.int32)), a(end - area), n_az, a(keys),
                                           a(values))
        keys, perm = torch.sort(keys, stable=True)
        cell_start = torch.searchsorted(keys >> 32, torch.arange(n_cells + 1, device=self.device))
        cell, by_cell = torch.sort(cell, stable=True)
        self.bins.append((cell_start, values[perm], src, cap[src], rays[by_cell], cell, o_ref))
        self.inv2, self.hit = f32(1.0 / divergence ** 2), f32(hit_alpha)

    def result(self) -> dict:
        """trace's outputs as numpy arrays (float64, as the CPU kernel's): every bundle's rays composited in one
        launch, each bundle's cells, list entries and slots offset past the bundles before it."""
        torch, o = self.torch, self.out
        if self.bins:
            starts, lsts, srcs, caps, rays, cells, o_refs = zip(*self.bins)
            off = lambda sizes: np.cumsum([0] + [len(x) for x in sizes[:-1]])  # noqa: E731
            pair_off, slot_off, cell_off = off(lsts), off(srcs), off([c[:-1] for c in starts])
            cat = torch.cat
            cell_start = cat([st[:-1] + p for st, p in zip(starts, pair_off)]
                             + [self.tensor([sum(len(x) for x in lsts)], torch.int64)])
            ray_bundle = cat([torch.full((len(r),), b, dtype=torch.int64, device=self.device)
                              for b, r in enumerate(rays)])
            s, a = self.surfels, _array
            rays = cat(rays)
            _composite[_blocks(len(rays)), THREADS](
                a(cell_start), a(cat([x + q for x, q in zip(lsts, slot_off)])), a(cat(srcs)),
                a(cat([c + q for c, q in zip(cells, cell_off)])), a(rays), a(ray_bundle), a(s["rec"]),
                a(cat(caps)), a(s["features"]), a(s["group"]), a(self.gfw), a(torch.stack(o_refs)),
                a(self.origins), a(self.dirs), a(self.column), self.inv2, self.hit, a(o["alpha"]),
                a(o["range_sum"]), a(o["median"]), a(o["normal"]), a(o["features"]), a(o["candidates"]))
            self.bins = []
        return {k: v.cpu().numpy().astype(np.int64 if k == "candidates" else np.float64) for k, v in o.items()}


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
