"""The ray-surfel LiDAR kernel on an NVIDIA GPU (numba-cuda): lidar.kernel's model, ray for ray.

Why numba-cuda: it is the CPU kernels' own language, so the per-surfel and per-ray maths are lidar.kernel's
njit functions themselves (`surfel_cap`, `alpha_range`, `actor_hit`, `composite_step`: numba compiles a CPU
function called from a CUDA kernel for the GPU), not a port that could drift; its CUDA simulator
(NUMBA_ENABLE_CUDASIM=1) runs the same kernels on a CPU, which the tests use on tiny cases; and the GPU
machines have it installed (NVIDIA Warp's wheel is too big to carry there, and Triton has no per-thread loops
over variable-length lists to speak of).

A bundle of rays (lidar.render's bundles: columns close in time, one reference pose) is binned in three steps,
gsplat's tile-intersection scheme on the LiDAR's angle grid, for as many bundles at once as PASS_SLOTS allows
(a sweep's 10-15 bundles in one or two passes: binned one by one, the GPU waited on the host's launches and
syncs for 80% of a sweep on an H200):
1. one thread per (surfel, bundle): its cap and the rectangle of the bundle's grid cells it can reach
   (`surfel_cap`); the pairs that reach a cell get a slot (their caps are the bundle's own: its reference pose);
2. one thread per slot writes a key per cell it meets, (cell << 32) | its depth's float32 bits, beside its
   slot, at its offset in the prefix sum of the rectangle areas; cells are numbered bundle after bundle;
3. one device radix sort (torch.sort, stable) orders the keys: each cell's surfels are then a slice in
   depth order, ties by index, as the CPU's depth keys and counting sort give them.
Then every bundle's rays are composited together (`result`: one launch, or a scan, the composite and the sums where
lists are split; a bundle alone is a few thousand rays, too few threads to fill a GPU), a thread per ray through its
cell's list front to back until its transmittance runs out, culling by the caps as the CPU does. A cell's rays (16
on average in a sweep) share a block, whose threads load the list's next entries into shared memory together
(`_composite_cells`): a sweep's time is its slowest warps', and along a street they walk tens of thousands of
entries (36766 at most on the 1M-surfel street, HDL-64E: counted on the CPU), one dependent load after another when
each thread read its own. A list longer than SEGMENT entries is cut into segments of a block each (the street's
longest list took its block 1314 rounds of 28 entries where the median block took 3, counted on the CPU: the sweep
waited on a few blocks), so the segments first scan their own transmittance and candidate count (`_segment_starts`
turns them into each segment's start), then composite from the ray's state before them, and `_segment_sums` adds
their sums in list order (the result numba's but for float32 rounding, the same bits every run). Cells of one ray (a
sparse batch) take a thread each (`_composite_rays`).
Each bundle's grid and its rays' cells are computed on the device for all bundles at once, by the numba
kernel's own functions (`seam_bins`, `grid_cells`; `grid_of` on the host from their extents: one sync); a pass
syncs twice more (its slot and pair counts size the sort).
Outputs are float32 device tensors (the CPU kernel accumulates in float32 too).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import Optional

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 overloads this alias of vstack on its first compile, and
    np.row_stack = np.vstack  # numpy 2.5 removed it: without it every CUDA kernel fails to compile (seen on an H200)
from numba import cuda, njit  # noqa: E402

from gsim.render.common import to_device
from gsim.render.numba_tiles import ONE

from .groups import SurfelGroups
from .kernel import (N_REC, SEAM_BINS, T_END, ZERO, actor_hit, alpha_range, composite_step, f32, grid_cells, grid_of,
                     seam_bins, surfel_cap, surfel_geometry, surfel_record)

THREADS = 128


def simulated() -> bool:
    """True under numba's CUDA simulator (kernels run as Python on the CPU: for tests on tiny inputs)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


# the rays of one cell a block composites together, and the list entries it loads at a time
WARP = 32
# the fewest rays a cell's block shares its loads among: an SM runs at most 32 blocks at once (H100), so blocks of
# w threads keep at most 32 w threads busy where the registers allow about 680 (94 a thread, ptxas); below this
# (a sparse training batch's cells hold 1-3 rays) a thread per ray in 128-thread blocks keeps more loads in flight
SHARED_FROM = 4
N_GEO = N_REC - 3  # surfel_geometry's numbers (a literal for the shared arrays' shapes)
# a cell's list longer than this is composited in segments, a block each, their sums then added in list order: a
# few cells' lists along a street run to tens of thousands of entries, and a sweep lasted as long as the block that
# walked the longest (bench_lidar_cells: 1314 rounds of 28 entries where the median block took 3)
SEGMENT = 1024


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
    i, b = cuda.grid(1), cuda.blockIdx.y  # surfel i, bundle b (the grid's second axis)
    if i < rec.shape[0]:
        _cap_of(i, rec, scales, group, world_from_group[b], o_ref[b], R_ref[b], margin[b], tan_div, grid[b], rect[b],
                depth[b], cap[b])


@cuda.jit
def _pairs(rect, depth_bits, offset, bundle, n_az, cell_offset, keys, values):  # one thread per slot
    i = cuda.grid(1)
    if i < rect.shape[0]:
        k, b = offset[i], bundle[i]
        n, c0 = n_az[b], cell_offset[b]
        for y in range(rect[i, 2], rect[i, 3]):
            for x in range(rect[i, 0], rect[i, 1]):
                keys[k] = (np.int64(c0 + y * n + (x - n if x >= n else x)) << 32) | np.int64(depth_bits[i])
                values[k] = i
                k += 1


@njit(inline="always")  # (inlined into the kernels: numba-cuda compiles no separate device function)
def _reaches(ray, c3, c4, c5, c6):
    """Whether the ray's direction lies in the entry's cap (c3..c6 of its 7): outside it the ray cannot reach the
    alpha threshold. Tested before anything else of the entry is read (most entries fail it)."""
    return not ray[4] * c3 + ray[5] * c4 + ray[6] * c5 < c6  # (as the CPU kernel tests it)


@njit(inline="always")  # (inlined into the kernels: numba-cuda compiles no separate device function)
def _take(state, ray, c0, c1, c2, geo, j, g, group_from_world, column, origins, dirs, rec, feats, inv2, hit, fr,
          feat_sum, cand, scan):
    """One list entry that the ray `_reaches` (its cap's centre c0..c2, geometry, surfel j, group g) composited into
    a ray's state (T, acc, range sum, median, normal, candidates taken); ray = (r, the origin relative to the
    bundle's reference, the direction). The weighted features go to feat_sum[fr], the candidates to cand[r];
    ``scan`` writes neither (a segment's transmittance and count alone). Returns the new state."""
    T, acc, rs, med, nx, ny, nz, n_cand = state
    r, o0, o1, o2, d0, d1, d2 = ray
    if g == 0:
        al, rng, nd = alpha_range(c0 - o0, c1 - o1, c2 - o2, d0, d1, d2, geo, inv2)
        s = -ONE if nd > ZERO else ONE
        n0, n1, n2 = s * geo[6], s * geo[7], s * geo[8]
    else:
        al, rng, n0, n1, n2 = _actor(group_from_world, g, column[r], origins[r, 0], origins[r, 1], origins[r, 2],
                                     dirs[r, 0], dirs[r, 1], dirs[r, 2], rec, j, geo, inv2)
    T, w, crossed = composite_step(T, acc, al, hit)
    if w > ZERO:
        acc += w
        rs += w * rng
        if crossed:
            med = rng
        nx += w * n0
        ny += w * n1
        nz += w * n2
        if n_cand < cand.shape[1]:
            if not scan:
                cand[r, n_cand] = j
            n_cand += 1
        if not scan:
            for f in range(feats.shape[1]):
                feat_sum[fr, f] += w * feats[j, f]
    return T, acc, rs, med, nx, ny, nz, n_cand


@njit(inline="always")  # (inlined into the kernels: numba-cuda compiles no separate device function)
def _ray(t, rays, ray_bundle, o_refs, origins, dirs):
    """Ray t of the cell order: (its index r, its origin relative to its bundle's reference, its direction)."""
    r, b = rays[t], ray_bundle[t]
    return (r, f32(origins[r, 0] - o_refs[b, 0]), f32(origins[r, 1] - o_refs[b, 1]), f32(origins[r, 2] - o_refs[b, 2]),
            f32(dirs[r, 0]), f32(dirs[r, 1]), f32(dirs[r, 2]))


@njit(inline="always")  # (inlined into the kernels: numba-cuda compiles no separate device function)
def _store(state, r, alpha, range_sum, median, normal):
    T, acc, rs, med, nx, ny, nz, n_cand = state
    alpha[r], range_sum[r], median[r] = acc, rs, med
    normal[r, 0], normal[r, 1], normal[r, 2] = nx, ny, nz


if simulated():  # (see _record above)
    _reaches, _take, _ray, _store = _reaches.py_func, _take.py_func, _ray.py_func, _store.py_func


@cuda.jit
def _composite_rays(units, lst, src, rays, ray_bundle, rec, cap, feats, group, group_from_world, o_refs, origins,
                    dirs, column, inv2, hit, alpha, range_sum, median, normal, feat_sum, cand):
    """A thread per unit of one ray (cells of few rays: a sparse batch), each reading its cell's list itself."""
    u = cuda.grid(1)
    if u >= units.shape[0]:
        return
    ray = _ray(units[u, 0], rays, ray_bundle, o_refs, origins, dirs)
    state = (ONE, ZERO, ZERO, ZERO, ZERO, ZERO, ZERO, 0)
    for k in range(units[u, 2], units[u, 3]):
        if state[0] == ZERO:
            break
        q = lst[k]  # the slot in the bundle tables (caps), src[q] the surfel
        if _reaches(ray, cap[q, 3], cap[q, 4], cap[q, 5], cap[q, 6]):
            j = src[q]
            state = _take(state, ray, cap[q, 0], cap[q, 1], cap[q, 2], _geometry(rec, j), j, group[j],
                          group_from_world, column, origins, dirs, rec, feats, inv2, hit, ray[0], feat_sum, cand, False)
    _store(state, ray[0], alpha, range_sum, median, normal)


@cuda.jit
def _composite_cells(units, lst, src, rays, ray_bundle, rec, cap, feats, group, group_from_world, o_refs, origins,
                     dirs, column, inv2, hit, start_T, start_n, part, part_feat, alpha, range_sum, median, normal,
                     feat_sum, cand, scan):
    """A block per unit (`Tracer._units`: up to its width, at most WARP, rays of one cell, a thread per ray, and
    the list entries k0:k1 of the cell): the threads load the next width entries into shared memory together,
    then each ray composites them in order (a long list's entries cost one load latency a round, not one each).
    A unit of a whole list writes its rays' outputs; a segment of a split list (row0 >= 0: its lane's row is
    row0 + lane * nseg) starts from the ray's transmittance and candidate count before it (start_T, start_n) and
    writes its sums to part and part_feat, or with ``scan`` its own transmittance and count to start_T, start_n."""
    lane, u, width = cuda.threadIdx.x, cuda.blockIdx.x, cuda.blockDim.x
    sh_cap = cuda.shared.array((WARP, 7), np.float32)
    sh_geo = cuda.shared.array((WARP, N_GEO), np.float32)
    sh_src = cuda.shared.array(WARP, np.int64)
    sh_grp = cuda.shared.array(WARP, np.int64)
    first, n, k0, k1, row0, nseg = units[u, 0], units[u, 1], units[u, 2], units[u, 3], units[u, 4], units[u, 5]
    ray = _ray(first + min(lane, n - 1), rays, ray_bundle, o_refs, origins, dirs)
    row = row0 + lane * nseg if row0 >= 0 and lane < n else -1
    T0, n0, hit_r = ONE, 0, hit
    if row >= 0 and not scan:
        T0, n0 = start_T[row], start_n[row]
        hit_r = hit - (ONE - T0)  # the crossing of hit by the accumulated alpha (1 - T0 before this segment)
    state = (T0, ZERO, ZERO, ZERO, ZERO, ZERO, ZERO, n0)
    fr, feat_out = ray[0], feat_sum
    if row >= 0:
        fr, feat_out = row, part_feat
    done = lane >= n or T0 == ZERO
    while k0 < k1:
        if cuda.syncthreads_and(1 if done else 0):  # the block's rays all done (the barrier also guards the shared loads)
            break
        if k0 + lane < k1:
            q = lst[k0 + lane]
            j = src[q]
            for i in range(7):
                sh_cap[lane, i] = cap[q, i]
            (sh_geo[lane, 0], sh_geo[lane, 1], sh_geo[lane, 2], sh_geo[lane, 3], sh_geo[lane, 4], sh_geo[lane, 5],
             sh_geo[lane, 6], sh_geo[lane, 7], sh_geo[lane, 8], sh_geo[lane, 9]) = _geometry(rec, j)
            sh_src[lane], sh_grp[lane] = j, group[j]
        cuda.syncthreads()
        for e in range(min(width, k1 - k0)):
            if done or state[0] == ZERO:
                done = True
                break
            if _reaches(ray, sh_cap[e, 3], sh_cap[e, 4], sh_cap[e, 5], sh_cap[e, 6]):
                geo = (sh_geo[e, 0], sh_geo[e, 1], sh_geo[e, 2], sh_geo[e, 3], sh_geo[e, 4], sh_geo[e, 5],
                       sh_geo[e, 6], sh_geo[e, 7], sh_geo[e, 8], sh_geo[e, 9])
                state = _take(state, ray, sh_cap[e, 0], sh_cap[e, 1], sh_cap[e, 2], geo, sh_src[e], sh_grp[e],
                              group_from_world, column, origins, dirs, rec, feats, inv2, hit_r, fr, feat_out, cand,
                              scan)
        k0 += width
    if lane < n:
        if row < 0:
            _store(state, ray[0], alpha, range_sum, median, normal)
        elif scan:
            start_T[row], start_n[row] = state[0], state[7]
        else:
            part[row, 0], part[row, 1], part[row, 2] = state[1], state[2], state[3]
            part[row, 3], part[row, 4], part[row, 5] = state[4], state[5], state[6]


@cuda.jit
def _segment_starts(splits, start_T, start_n):
    """A thread per ray of a split list (splits: its position in the cell order, first row, segments): each
    segment's own transmittance and count (the scan) become the ray's before it, in list order; a segment that
    takes the transmittance to T_MIN stops the ray (later segments start at 0: `composite_step`'s stop)."""
    i = cuda.grid(1)
    if i < splits.shape[0]:
        row0, nseg = splits[i, 1], splits[i, 2]
        T, m = ONE, 0
        for s in range(nseg):
            tT, tn = start_T[row0 + s], start_n[row0 + s]
            start_T[row0 + s], start_n[row0 + s] = T, m
            T = T * tT
            T = ZERO if T <= T_END else T
            m += tn


@cuda.jit
def _segment_sums(splits, rays, part, part_feat, alpha, range_sum, median, normal, feat_sum):
    """A thread per ray of a split list: its segments' sums added in list order (the same bits every run), its
    median the segment's where the accumulated alpha crossed the hit threshold."""
    i = cuda.grid(1)
    if i < splits.shape[0]:
        r, row0, nseg = rays[splits[i, 0]], splits[i, 1], splits[i, 2]
        acc, rs, med, nx, ny, nz = ZERO, ZERO, ZERO, ZERO, ZERO, ZERO
        for s in range(nseg):
            p = row0 + s
            acc, rs, nx, ny, nz = acc + part[p, 0], rs + part[p, 1], nx + part[p, 3], ny + part[p, 4], nz + part[p, 5]
            med = part[p, 2] if med == ZERO else med
            for f in range(feat_sum.shape[1]):
                feat_sum[r, f] += part_feat[p, f]
        alpha[r], range_sum[r], median[r] = acc, rs, med
        normal[r, 0], normal[r, 1], normal[r, 2] = nx, ny, nz


def _blocks(n: int) -> int:
    return max(1, (n + THREADS - 1) // THREADS)


def _on(kernel, grid, block):
    """``kernel`` launched on torch's current stream, behind the torch work that made its inputs (numba's own
    default would be the legacy stream, whatever stream torch is on)."""
    if simulated():  # (the simulator has no streams)
        return kernel[grid, block]
    import torch
    return kernel[grid, block, _numba_stream(torch.cuda.current_stream().cuda_stream)]


@functools.lru_cache(maxsize=16)
def _numba_stream(handle: int):
    return cuda.external_stream(handle)


_STREAMS = {}  # device index -> the LiDAR's own stream


@contextlib.contextmanager
def own_stream(after_current: bool):
    """The GPU work in the block on the LiDAR's own stream (one per GPU): a sweep rendered in a thread beside the
    cameras then neither waits for their kernels at its downloads nor makes them wait for its own (with both on
    the legacy stream the loop's sweep took 2.4x its time alone on an H200). ``after_current``: its
    inputs come from torch's current stream (a trainer's tensors), so it starts after what that stream has
    queued; the LiDAR's own uploads need not (`device_surfels` waits for its copies once). Outputs left on the
    device must be waited for by their reader's stream."""
    if simulated():
        yield
        return
    import torch
    index = torch.cuda.current_device()
    if index not in _STREAMS:
        _STREAMS[index] = torch.cuda.Stream(index)
    stream = _STREAMS[index]
    if after_current:
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield


# the most (bundle, surfel) pairs a binning pass holds on the device (64 bytes each): a sweep's bundles are
# binned together in as few passes as this allows (a 1M-surfel scene: 8 bundles a pass, 512 MB)
PASS_SLOTS = 8 << 20


class Tracer:
    """One `lidar.render.trace` on the device: the surfels (cached on their SurfelGroups, so a scene is uploaded
    once), the rays and the outputs live there. `bundle` notes a bundle (a range of the rays in column order);
    `result` grids every bundle's rays at once on the device (one host sync brings the grids' extents back:
    the host's numpy grid of every bundle was a third of a sweep's time), bins the bundles together (a launch
    per step for as many bundles as PASS_SLOTS allows: each bundle's binning alone was a few small launches and
    host syncs on a GPU that waited for them) and composites every ray in one launch."""

    def __init__(self, groups, group_from_world: np.ndarray, sensor: np.ndarray, dirs, column: np.ndarray,
                 candidates: int = 0):
        import torch
        self.torch = torch
        self.device = device()
        self.surfels = device_surfels(groups, self.device)
        t = self.tensor
        self.gfw, self.column = t(group_from_world), t(column, torch.int64)
        self.origins = t(sensor[:, :3, 3])[self.column]
        self.dirs = t(dirs, torch.float64)  # (world directions, numpy or already on the device)
        self.by_column = torch.argsort(self.column, stable=True)
        R, F = len(column), groups.features.shape[1]
        z = lambda *shape: torch.zeros(shape, dtype=torch.float32, device=self.device)  # noqa: E731
        self.out = {"alpha": z(R), "range_sum": z(R), "median": z(R), "normal": z(R, 3), "features": z(R, F),
                    "candidates": torch.full((R, candidates), -1, dtype=torch.int64, device=self.device)}
        self.bundles = []  # per bundle: world_from_group, margin, o_ref, R_ref, its rays' range in column order
        self.tan_div = self.inv2 = self.hit = None

    def tensor(self, x, dtype=None):
        return to_device(x, self.device, dtype)

    def bundle(self, world_from_group: np.ndarray, margin: np.ndarray, o_ref: np.ndarray, R_ref: np.ndarray,
               start: int, stop: int, divergence: float, hit_alpha: float) -> None:
        """Note the rays start:stop of this trace in column order (a bundle follows the one before it) as a
        bundle seen from the reference (o_ref, R_ref)."""
        self.bundles.append((world_from_group, margin, o_ref, R_ref, start, stop))
        self.tan_div, self.inv2, self.hit = math.tan(divergence), f32(1.0 / divergence ** 2), f32(hit_alpha)

    def _cells(self):
        """Every bundle's `ray_grid` at once: the grids (B,7) on the host, and the rays sorted by cell (cells
        numbered bundle after bundle) with their cells and bundles, on the device."""
        torch, t = self.torch, self.tensor
        _, _, _, R_ref, start, stop = zip(*self.bundles)
        count = np.subtract(stop, start)
        B, R = len(count), int(count.sum())
        rays = self.by_column[start[0]:stop[-1]]
        bundle = torch.repeat_interleave(torch.arange(B, device=self.device), t(count), output_size=R)
        d = torch.einsum("rji,rj->ri", t(np.stack(R_ref))[bundle], self.dirs[rays])  # R_ref^T d, as bundle_grid
        az, el = torch.atan2(d[:, 1], d[:, 0]), torch.asin(d[:, 2].clamp(-1.0, 1.0))
        occupied = torch.zeros(B * SEAM_BINS, dtype=torch.float64, device=self.device)
        occupied[bundle * SEAM_BINS + seam_bins(az)] = 1.0
        inf = torch.full((B,), math.inf, dtype=torch.float64, device=self.device)
        extent = torch.cat([occupied.view(B, SEAM_BINS), inf.scatter_reduce(0, bundle, el, "amin")[:, None],
                            (-inf).scatter_reduce(0, bundle, el, "amax")[:, None]], 1).cpu().numpy()  # (a sync)
        grids = np.stack([grid_of(e[:SEAM_BINS] > 0, e[SEAM_BINS], e[SEAM_BINS + 1], n) for e, n in zip(extent, count)])
        first_cell = np.concatenate([[0], np.cumsum((grids[:, 2] * grids[:, 5]).astype(np.int64))])
        cell = grid_cells(az, el, t(grids)[bundle]) + t(first_cell[:-1])[bundle]
        order = torch.argsort(cell, stable=True)
        return grids, rays[order], cell[order], bundle[order]

    def _bin(self, bundles, grid: np.ndarray):
        """Bin ``bundles`` (their grids ``grid``) in one pass: per grid cell of theirs (numbered bundle after
        bundle) a depth-ordered list of slots (a bundle's surfel with its cap). Returns cell_start (cells + 1),
        the lists, each slot's surfel and its cap."""
        torch, s, a = self.torch, self.surfels, _array
        n, B = len(s["rec"]), len(bundles)
        wfg, margin, o_ref, R_ref, _, _ = zip(*bundles)
        cells_per = (grid[:, 2] * grid[:, 5]).astype(np.int64)
        cell_off = np.concatenate([[0], np.cumsum(cells_per)])
        # (not zeroed: _caps writes a culled surfel's x0 = x1, so its area is 0 and the rest of its row is never read;
        # zeroing these took 0.5 GB of writes a pass on the 1M street)
        rect = torch.empty((B, n, 4), dtype=torch.int64, device=self.device)
        depth = torch.empty((B, n), dtype=torch.float32, device=self.device)
        cap = torch.empty((B, n, 7), dtype=torch.float32, device=self.device)
        t = self.tensor
        _on(_caps, (_blocks(n), B), THREADS)(a(s["rec"]), a(s["scales"]), a(s["group"]), a(t(np.stack(wfg))),
                                             a(t(np.stack(o_ref))), a(t(np.stack(R_ref))), a(t(np.stack(margin))),
                                             self.tan_div, a(t(grid)), a(rect), a(depth), a(cap))
        rect, depth, cap = rect.view(B * n, 4), depth.view(-1), cap.view(B * n, 7)
        area = (rect[:, 1] - rect[:, 0]) * (rect[:, 3] - rect[:, 2])
        slot = torch.nonzero(area > 0)[:, 0]  # (a host sync: the slot count)
        rect, depth, area = rect[slot], depth[slot], area[slot]
        end = torch.cumsum(area, 0)
        total = int(end[-1]) if len(slot) else 0  # (a host sync: the pair count sizes the sort)
        keys = torch.empty(total, dtype=torch.int64, device=self.device)
        values = torch.empty(total, dtype=torch.int64, device=self.device)
        bundle = torch.div(slot, n, rounding_mode="floor")
        _on(_pairs, _blocks(len(slot)), THREADS)(a(rect), a(depth.view(torch.int32)), a(end - area), a(bundle),
                                                 a(t(grid[:, 2], torch.int64)), a(t(cell_off[:-1])), a(keys),
                                                 a(values))
        keys, perm = torch.sort(keys, stable=True)
        cell_start = torch.searchsorted(keys >> 32, torch.arange(int(cell_off[-1]) + 1, device=self.device))
        return cell_start, values[perm], slot % n, cap[slot]

    def _units(self, ray_cell, cell_start):
        """The composite's units (the rays sorted by cell, ``cell_start`` their cells' lists): up to ``width`` rays
        of one cell each, ``width`` the most rays a cell has, at most WARP, and 1 below SHARED_FROM (width 1:
        `_composite_rays`, a thread per ray; else `_composite_cells`, a block per unit, a list longer than SEGMENT
        in segments of a unit each). Returns the width, the units (first ray, ray count, list entries k0:k1, the
        first ray's row of a segment's sums or -1, segments), those of the segments' scan (all but each list's
        last), the split rays (position in the cell order, first row, segments) and the rows, the tables on the
        device (one sync: the cells' ray counts and lists)."""
        n_cells = len(cell_start) - 1
        host = self.torch.cat([self.torch.bincount(ray_cell, minlength=n_cells), cell_start]).cpu().numpy()
        per_cell, start = host[:n_cells], host[n_cells:]
        width = int(min(WARP, max(1, per_cell.max())))
        width = width if width >= SHARED_FROM else 1
        chunks = -(-per_cell // width)
        cell = np.repeat(np.arange(n_cells), chunks)
        k = np.arange(len(cell)) - np.repeat(np.cumsum(chunks) - chunks, chunks)  # the block's chunk in its cell
        first = np.repeat(np.cumsum(per_cell) - per_cell, chunks) + width * k
        count = np.minimum(per_cell[cell] - width * k, width)
        nseg = np.maximum(1, -(-(start[cell + 1] - start[cell]) // SEGMENT)) if width > 1 else np.ones_like(cell)
        rows = np.where(nseg > 1, count * nseg, 0)  # a split chunk's rows: its rays' segments, ray after ray
        base = np.cumsum(rows) - rows
        ch = np.repeat(np.arange(len(cell)), nseg)  # a unit per segment
        seg = np.arange(len(ch)) - np.repeat(np.cumsum(nseg) - nseg, nseg)
        k0, end = start[cell[ch]] + seg * SEGMENT, start[cell[ch] + 1]
        units = np.stack([first[ch], count[ch], k0, np.where(nseg[ch] > 1, np.minimum(k0 + SEGMENT, end), end),
                          np.where(nseg[ch] > 1, base[ch] + seg, -1), nseg[ch]], 1)
        split = np.nonzero(nseg > 1)[0]
        lane_of = np.repeat(split, count[split])
        lane = np.arange(len(lane_of)) - np.repeat(np.cumsum(count[split]) - count[split], count[split])
        splits = np.stack([first[lane_of] + lane, base[lane_of] + lane * nseg[lane_of], nseg[lane_of]], 1)
        t = self.tensor
        return (width, t(units), t(units[(nseg[ch] > 1) & (seg < nseg[ch] - 1)]), t(splits.reshape(-1, 3)),
                int(rows.sum()))

    def result(self, device: bool = False) -> dict:
        """trace's outputs: numpy arrays (float64, as the CPU kernel's), or with ``device`` float32 tensors left
        on the device. The bundles are binned in passes of at most PASS_SLOTS (bundle, surfel) pairs, then every
        ray is composited in one launch, each pass's list entries and slots offset past the passes before it."""
        torch, o = self.torch, self.out
        if self.bundles:
            grids, rays, ray_cell, ray_bundle = self._cells()
            per = max(1, PASS_SLOTS // max(1, len(self.surfels["rec"])))
            passes = [self._bin(self.bundles[k:k + per], grids[k:k + per]) for k in range(0, len(self.bundles), per)]
            starts, lsts, srcs, caps = zip(*passes)
            off = lambda sizes: np.cumsum([0] + [len(x) for x in sizes[:-1]])  # noqa: E731
            pair_off, slot_off = off(lsts), off(srcs)
            cat = torch.cat
            cell_start = cat([st[:-1] + p for st, p in zip(starts, pair_off)]
                             + [self.tensor([sum(len(x) for x in lsts)], torch.int64)])
            s, a = self.surfels, _array
            width, units, scan, splits, rows = self._units(ray_cell, cell_start)
            # (each tensor as the kernels take it once: the segments' launches share them)
            args = [a(x) for x in (cat([x + q for x, q in zip(lsts, slot_off)]), cat(srcs), rays, ray_bundle,
                                   s["rec"], cat(caps), s["features"], s["group"], self.gfw,
                                   self.tensor(np.stack([b[2] for b in self.bundles])), self.origins, self.dirs,
                                   self.column)]
            outs = [a(o[k]) for k in ("alpha", "range_sum", "median", "normal", "features", "candidates")]
            if width == 1:
                _on(_composite_rays, _blocks(len(units)), THREADS)(a(units), *args, self.inv2, self.hit, *outs)
            else:
                z = lambda *shape: torch.zeros(shape, dtype=torch.float32, device=self.device)  # noqa: E731
                parts = [a(x) for x in (z(rows) + 1, torch.zeros(rows, dtype=torch.int64, device=self.device),
                                        z(rows, 6), z(rows, o["features"].shape[1]))]  # start_T, start_n, sums
                if rows:
                    _on(_composite_cells, len(scan), width)(a(scan), *args, self.inv2, self.hit, *parts, *outs, True)
                    _on(_segment_starts, _blocks(len(splits)), THREADS)(a(splits), parts[0], parts[1])
                _on(_composite_cells, len(units), width)(a(units), *args, self.inv2, self.hit, *parts, *outs, False)
                if rows:
                    _on(_segment_sums, _blocks(len(splits)), THREADS)(a(splits), args[2], parts[2], parts[3],
                                                                      *outs[:5])  # (args[2]: the rays)
            self.bundles = []
        if device:
            return dict(o)
        return {k: v.cpu().numpy().astype(np.int64 if k == "candidates" else np.float64) for k, v in o.items()}


def device():
    """The kernels' torch device: the GPU, or the host under the simulator."""
    import torch
    return torch.device("cpu" if simulated() else "cuda")


@functools.lru_cache(maxsize=8)
def _directions(lay):
    return to_device(lay.directions, device())


def sweep_directions(lay, sensor: np.ndarray):
    """A sweep's world ray directions (L*C,3) float64 on the device: its layout's (lidar.render's, uploaded once
    per layout) turned by each column's sensor rotation (C,3,3 of sensor), as render_lidar turns them on the host."""
    import torch
    rot = to_device(sensor[:, :3, :3], device())
    return torch.einsum("cij,lcj->lci", rot, _directions(lay)).reshape(-1, 3)


def download(out: dict, hit, intensity, drop):
    """What a LiDAR frame is made of, from a trace left on the device and its returns (lidar.render._returns),
    in one copy to the host: (out's alpha, range_sum, median and normal, hit, intensity, drop) as numpy."""
    import torch
    cols = [out["alpha"], out["range_sum"], out["median"], hit] + ([intensity, drop] if intensity is not None else [])
    host = torch.cat([c.float()[:, None] for c in cols] + [out["normal"].float()], 1).cpu().numpy()
    flat = [np.ascontiguousarray(host[:, k]) for k in range(len(cols))] + [None, None]
    sums = {"alpha": flat[0], "range_sum": flat[1], "median": flat[2], "normal": np.ascontiguousarray(host[:, -3:])}
    return sums, flat[3] > 0, flat[4], flat[5]


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
        up = {"rec": to_device(groups.rec, device, torch.float32),
              "scales": to_device(groups.scales, device, torch.float32),
              "features": to_device(groups.features, device, torch.float32),
              "group": to_device(groups.group, device, torch.int64)}
        if torch.device(device).type == "cuda":  # (once a scene: any stream may read the copies from now on)
            torch.cuda.current_stream().synchronize()
        groups.cache[key] = up
    return groups.cache[key]


def device_groups(means, quats, scales, opacities, features, group, tracks):
    """`SurfelGroups.build` on the device from torch tensors there (a trainer's activated parameters): records,
    scales, features and group ids stay there, for the cuda backend (the groups' radii, G numbers, come to the
    host; quats are not kept: the numba strip kernel's discs are not made from them)."""
    import torch

    dev, n = means.device, len(means)
    f64 = lambda x: x.detach().to(torch.float64).contiguous()  # noqa: E731  (as build: float64 maths)
    rec = torch.empty((n, N_REC), dtype=torch.float32, device=dev)
    _on(_records, _blocks(n), THREADS)(_array(f64(means)), _array(f64(quats)), _array(f64(scales)),
                                       _array(f64(opacities)), _array(rec))
    group = group.to(torch.int64)
    act = group > 0
    reach = (f64(means).norm(dim=1) + 3.5 * f64(scales).max(1).values)[act]
    radius = torch.zeros(1 + len(tracks), dtype=torch.float64, device=dev).scatter_reduce(0, group[act], reach, "amax")
    feats = features.detach().float() if features is not None else torch.zeros((n, 0), device=dev)
    return SurfelGroups(rec, None, scales.detach().float(), feats, group, tuple(tracks), radius.cpu().numpy())
