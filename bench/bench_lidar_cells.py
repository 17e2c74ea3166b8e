"""How much list the CUDA LiDAR composite walks, counted on the CPU: per ray, per warp of 32 rays, per block.

Usage: python bench/bench_lidar_cells.py [--surfels 1000000] [--speed 10] [--spec velodyne-hdl64e]
       [--rays-per-cell 16] [--segment 1024] [--out FILE.json]
One rolling sweep of the demo street (bench_lidar_cuda's scene and poses) binned as lidar.kernel_cuda bins it
(lidar.kernel's `bin_bundle`: the grid, caps and depth order both kernels share); then each ray's walk through its
cell's list as the composite walks it (the cap test, alpha, front to back until its transmittance runs out: this
script's own loop over lidar.kernel's functions). A GPU runs a warp as long as its longest ray, so the sweep takes
as long as its slowest warps: the max and the share of the walk the top 1% of warps hold say how uneven it is.
The blocks: `_composite_cells` gives a block up to 32 rays of one cell and walks its list 32 entries a round
until its rays are done; "whole" counts the rounds with every list in one block, "segmented" with lists past
--segment entries cut as `Tracer._units` cuts them (a block per segment, plus the scan's rounds: each segment but
the last walked with its own transmittance). The longest block is the sweep's floor; the total its work.
Prints one JSON line (--out writes it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).parent))
from bench_lidar_cuda import street_poses, street_scene  # noqa: E402

import gsim.lidar.kernel as K  # noqa: E402
import gsim.lidar.render as lr  # noqa: E402
from gsim.lidar import LidarSpec  # noqa: E402
from gsim.lidar.kernel_cuda import SEGMENT  # noqa: E402
from gsim.render.numba_tiles import ONE  # noqa: E402


@njit(cache=True)
def _walk(k0, k1, T, r, cap, lst, rec, origins, dirs, o_ref, inv2, hit):
    """Ray r's walk through the list entries k0:k1 from transmittance T: (the entries it visits, those inside
    their caps)."""
    o0, o1, o2 = K.f32(origins[r, 0] - o_ref[0]), K.f32(origins[r, 1] - o_ref[1]), K.f32(origins[r, 2] - o_ref[2])
    d0, d1, d2 = K.f32(dirs[r, 0]), K.f32(dirs[r, 1]), K.f32(dirs[r, 2])
    acc, steps, taken = K.ZERO, 0, 0
    for k in range(k0, k1):
        if T == K.ZERO:
            break
        steps += 1
        j = lst[k]
        if d0 * cap[j, 3] + d1 * cap[j, 4] + d2 * cap[j, 5] < cap[j, 6]:
            continue
        taken += 1
        al, _, _ = K.alpha_range(cap[j, 0] - o0, cap[j, 1] - o1, cap[j, 2] - o2, d0, d1, d2,
                                 K.surfel_geometry(rec, j), inv2)
        T, w, _ = K.composite_step(T, acc, al, hit)
        acc += w
    return steps, taken


@njit(cache=True)
def _walks(cell_start, lst, ray_cell, rays, cap, rec, origins, dirs, o_ref, inv2, hit, segment, steps, taken, scan):
    """Per ray (in cell order): the list entries it visits (steps) and those inside their caps (taken); per
    segment of its list but the last, the entries its scan visits (scan, (rays, segments))."""
    for t in range(rays.shape[0]):
        c, r = ray_cell[t], rays[t]
        k0, k1 = cell_start[c], cell_start[c + 1]
        steps[t], taken[t] = _walk(k0, k1, ONE, r, cap, lst, rec, origins, dirs, o_ref, inv2, hit)
        if k1 - k0 > segment:
            for s in range((k1 - k0 - 1) // segment):
                scan[t, s] = _walk(k0 + s * segment, k0 + (s + 1) * segment, ONE, r, cap, lst, rec, origins, dirs,
                                   o_ref, inv2, hit)[0]


def blocks(steps: np.ndarray, scan: np.ndarray, cell: np.ndarray, length: np.ndarray, segment: int,
           warp: int = 32) -> dict:
    """The composite's blocks' rounds (a round: ``warp`` list entries loaded, each ray compositing them), whole
    lists and segmented: the longest block's, the total, the blocks; rays in cell order (cell, list length)."""
    first = np.r_[0, np.nonzero(np.diff(cell))[0] + 1]
    n = np.diff(np.r_[first, len(cell)])
    width = int(min(warp, n.max()))
    whole, seg_rounds, n_seg = [], [], 0
    for f, m in zip(first, n):
        nseg = max(1, -(-int(length[f]) // segment))
        for c0 in range(f, f + m, width):
            s = steps[c0:min(f + m, c0 + width)]
            whole.append(-(-int(s.max()) // width))
            if nseg == 1:
                seg_rounds.append(whole[-1])
                continue
            for g in range(nseg):  # the composite's walk in segment g, then (all but the last) the scan's
                seg_rounds.append(-(-int(np.clip(s - g * segment, 0, segment).max()) // width))
                if g < nseg - 1:
                    seg_rounds.append(-(-int(scan[c0:c0 + len(s), g].max()) // width))
            n_seg += nseg
    whole, seg_rounds = np.array(whole), np.array(seg_rounds)
    return {"width": width, "blocks_whole": len(whole), "rounds_whole_max": int(whole.max()),
            "rounds_whole_total": int(whole.sum()), "rounds_whole_median": float(np.median(whole)),
            "blocks_segmented": len(seg_rounds), "rounds_segmented_max": int(seg_rounds.max()),
            "rounds_segmented_total": int(seg_rounds.sum()), "split_chunks_segments": n_seg}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--surfels", type=int, default=1_000_000)
    ap.add_argument("--speed", type=float, default=10.0)
    ap.add_argument("--spec", default="velodyne-hdl64e")
    ap.add_argument("--rays-per-cell", type=float, default=K.RAYS_PER_CELL)
    ap.add_argument("--segment", type=int, default=SEGMENT, help="list entries a segment")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    K.RAYS_PER_CELL = args.rays_per_cell  # (read by grid_of at each call)
    spec = LidarSpec.preset(args.spec)
    groups, lay = lr.surfel_groups(street_scene(args.surfels)), lr.sweep_layout(spec)
    (trajectory, t0), = street_poses(spec, 0, args.speed)
    times = t0 + lay.column_us
    sensor = lr.sensor_poses(trajectory, t0, times, True)
    dirs = np.einsum("cij,lcj->lci", sensor[:, :3, :3], lay.directions).reshape(-1, 3)
    column = np.tile(np.arange(len(times)), lay.directions.shape[0])
    origins = np.ascontiguousarray(sensor[column, :3, 3])
    wfg, _ = lr.group_poses(groups, times)
    by_column = np.argsort(column, kind="stable")
    bounds = np.searchsorted(column[by_column], np.arange(len(times) + 1))
    steps, taken, lengths, cells, scans, pairs, n_cells = [], [], [], [], [], 0, 0
    for cols in lr.bundle_columns(sensor[:, :3, 3], wfg[1:], len(dirs)):
        rays = by_column[bounds[cols[0]]:bounds[cols[-1] + 1]]
        o_ref, R_ref, margin, ref = lr.bundle_frame(groups, sensor, wfg, cols)
        cell, cap, cell_start, lst = K.bin_bundle(groups.rec, groups.scales, groups.group, ref, margin, dirs, rays,
                                                  o_ref, R_ref, lr.BEAM_DIVERGENCE_RAD)
        order = np.argsort(cell, kind="stable")
        s, k = np.zeros(len(rays), np.int64), np.zeros(len(rays), np.int64)
        scan = np.zeros((len(rays), max(1, int(np.diff(cell_start).max()) // args.segment)), np.int64)
        _walks(cell_start, lst, cell[order], rays[order], cap, groups.rec, origins, dirs, o_ref,
               K.f32(1.0 / lr.BEAM_DIVERGENCE_RAD ** 2), K.f32(0.5), args.segment, s, k, scan)
        steps.append(s)
        taken.append(k)
        scans.append(scan)
        lengths.append(np.diff(cell_start)[cell[order]])
        cells.append(cell[order] + n_cells)  # (numbered bundle after bundle, as the GPU's)
        n_cells += len(cell_start) - 1
        pairs += int(cell_start[-1])
    s, k, ln = np.concatenate(steps), np.concatenate(taken), np.concatenate(lengths)
    width = max(x.shape[1] for x in scans)
    scan = np.concatenate([np.pad(x, ((0, 0), (0, width - x.shape[1]))) for x in scans])
    warp = np.r_[s, np.zeros(-len(s) % 32, np.int64)].reshape(-1, 32).max(1)
    res = {"surfels": args.surfels, "spec": args.spec, "speed_mps": args.speed, "rays_per_cell": args.rays_per_cell,
           "rays": len(s), "bundles": len(steps), "pairs": pairs, "list_mean": float(ln.mean()),
           "list_max": int(ln.max()), "steps_mean": float(s.mean()), "steps_median": float(np.median(s)),
           "steps_p99": float(np.percentile(s, 99)), "steps_max": int(s.max()), "in_cap_mean": float(k.mean()),
           "warp_steps_max": int(warp.max()), "warp_padding": float(warp.sum() * 32 / s.sum()),
           "top1pct_warps_share": float(np.sort(warp)[-max(1, len(warp) // 100):].sum() / warp.sum()),
           "segment": args.segment, **blocks(s, scan, np.concatenate(cells), ln, args.segment)}
    print(json.dumps(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
