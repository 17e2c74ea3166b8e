"""The CUDA LiDAR kernel (gsim.lidar.kernel_cuda) against the numba kernels: speed and parity, per scene and sensor.

Usage: python bench/bench_lidar_cuda.py [--surfels 1000000] [--sweeps 10] [--speed 10]
       [--scene DIR --log LOG] [--specs velodyne-hdl64e,ouster-os1-128] [--out FILE.json] [--profile]
Scenes: the demo street (`street_surfels`, with random LiDAR features and a random LiDAR head, so that ray drop
is decided as in a reconstruction) and, with --scene/--log, a reconstructed scene (its own head) swept from its
log's LiDAR poses. Sweeps roll: the sensor drives forward at --speed m/s while it spins (the street), or moves
along the log's poses (the scene). Per scene and sensor: the median wall time of a sweep after one warm-up (JIT,
upload) for each backend, the CUDA kernel's rays/s, and its parity with numba over the same sweeps: the share of
rays whose return decision (geometry, range window and ray drop) is equal, and the median and 99th percentile
|range difference| over the rays both return; and the same for the first sweep's rays through `render_rays` with
numba's ray kernel and the CUDA kernel (the kernels' own agreement: numba's spinning sweeps use its strip kernel);
and the CUDA sweeps again with every cell list in one block (no `SEGMENT`s: the composite before 36a7557).
Prints a table and a JSON line; --out writes the JSON. --profile: torch.profiler's table of three CUDA sweeps of
the first scene and sensor (kernels by their own GPU time: numba's and torch's alike; the wall time beside it).
Needs a CUDA GPU (or NUMBA_ENABLE_CUDASIM=1 with a tiny --surfels and a VLP-16: the simulator is very slow).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from gsim.lidar import LidarSpec, kernel_cuda, render_lidar
from gsim.lidar.heads import FEATURES, HIDDEN, INPUTS, LidarHead
from gsim.scene import Scene
from gsim.street import street_surfels


def street_scene(n: int) -> Scene:
    """The demo street with random features and head (seeded): drop probabilities spread over (0, 1)."""
    from dataclasses import replace
    rng = np.random.default_rng(0)
    s = street_surfels(n)
    head = LidarHead(rng.normal(0, 0.6, (INPUTS, HIDDEN)), rng.normal(0, 0.1, HIDDEN), rng.normal(0, 0.6, (HIDDEN, 2)),
                     np.zeros(2))
    return Scene(background=replace(s, features=rng.normal(0, 1, (len(s.means), FEATURES)).astype(np.float32)),
                 lidar_head=head)


def street_poses(spec: LidarSpec, sweeps: int, speed: float):
    """(trajectory, start time) per sweep: 1.9 m above the street, driving along x at ``speed``."""
    out = []
    for k in range(sweeps + 1):
        T0 = np.eye(4)
        T0[:3, 3] = [-20.0 + 3.0 * k, 0.0, 1.9]
        T1 = T0.copy()
        T1[0, 3] += speed / spec.spin_hz
        out.append(((np.array([0, round(1e6 / spec.spin_hz)]), np.stack([T0, T1])), 0))
    return out


def log_poses(log, sweeps: int):
    """(trajectory, start time) per sweep: the log's LiDAR poses, every frame, from evenly spread frames."""
    obs = [o for f in log.frames for o in f.lidars.values()]
    times = np.array([o.timestamp_us for o in obs], np.int64)
    poses = np.stack([log.T_world_lidar(o) for o in obs])
    keep = np.r_[True, np.diff(times) > 0]
    times, poses = times[keep], poses[keep]
    pick = np.linspace(0, len(times) - 2, sweeps + 1).round().astype(int)
    return [((times, poses), int(times[i])) for i in pick]


def run(scene: Scene, spec: LidarSpec, sweeps, backend: str):
    frames, secs = [], []
    for traj, t in sweeps:
        t0 = time.perf_counter()
        frames.append(render_lidar(scene, spec, traj, backend=backend, timestamp_us=t))
        secs.append(time.perf_counter() - t0)
    return frames, secs[1:]  # the first: warm-up


def parity(a, b) -> dict:
    ra, rb = np.stack([f.range_image for f in a]), np.stack([f.range_image for f in b])
    both = (ra > 0) & (rb > 0)
    diff = np.abs(ra[both] - rb[both])
    return {"decisions_equal": float(np.mean((ra > 0) == (rb > 0))), "returns": float(np.mean(ra > 0)),
            "median_abs_range_diff_mm": float(np.median(diff) * 1e3) if diff.size else None,
            "p99_abs_range_diff_mm": float(np.percentile(diff, 99) * 1e3) if diff.size else None}


def ray_parity(scene: Scene, spec: LidarSpec, sweep) -> dict:
    """The first sweep's rays through `render_rays` with numba's ray kernel and with the CUDA kernel: the same
    binning and order, so this is the kernels' own agreement (numba's spinning sweeps use its strip kernel, whose
    order differs where surfels nearly tie in distance)."""
    from gsim.lidar import render_rays
    from gsim.transforms import interpolate_poses
    (ts, poses), t0 = sweep
    dirs, offsets = spec.ray_directions().reshape(-1, 3), spec.time_offsets_us().reshape(-1)
    times = t0 + offsets
    T = interpolate_poses(np.asarray(ts), np.asarray(poses), times)
    a, b = (render_rays(scene, T, times, dirs, spec.min_range_m, spec.max_range_m, backend=k)
            for k in ("numba", "cuda"))
    both = (a["range"] > 0) & (b["range"] > 0)
    diff = np.abs(a["range"][both] - b["range"][both])
    return {"rays_decisions_equal": float(np.mean((a["range"] > 0) == (b["range"] > 0))),
            "rays_median_abs_range_diff_mm": float(np.median(diff) * 1e3) if diff.size else None}


def profile_sweeps(scene: Scene, spec: LidarSpec, sweeps, rows: int = 14) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for traj, t in sweeps[1:4]:
            render_lidar(scene, spec, traj, backend="cuda", timestamp_us=t)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=60)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--surfels", type=int, default=1_000_000)
    ap.add_argument("--sweeps", type=int, default=10)
    ap.add_argument("--speed", type=float, default=10.0, help="m/s: the street sensor's speed while it spins")
    ap.add_argument("--scene", help="a reconstructed scene directory (with --log)")
    ap.add_argument("--log", help="the scene's log: its LiDAR poses place the sweeps")
    ap.add_argument("--specs", default="velodyne-hdl64e,ouster-os1-128")
    ap.add_argument("--out")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    if bool(a.scene) != bool(a.log):
        ap.error("--scene and --log go together")
    scenes = [("street", street_scene(a.surfels), None)]
    if a.scene:
        from gsim.scene import load_scene
        from gsim.scenes.log import load_log
        scenes.append((a.scene, load_scene(a.scene), load_log(a.log)))
    rows = []
    for name, scene, log in scenes:
        for spec_name in a.specs.split(","):
            spec = LidarSpec.preset(spec_name)
            sweeps = street_poses(spec, a.sweeps, a.speed) if log is None else log_poses(log, a.sweeps)
            ref, t_numba = run(scene, spec, sweeps, "numba")
            got, t_cuda = run(scene, spec, sweeps, "cuda")
            segment, kernel_cuda.SEGMENT = kernel_cuda.SEGMENT, 1 << 62  # every list in one block (before 36a7557)
            try:
                whole, t_whole = run(scene, spec, sweeps, "cuda")
            finally:
                kernel_cuda.SEGMENT = segment
            rays = ref[0].range_image.size
            row = {"scene": name, "spec": spec_name, "rays": rays, "surfels": len(scene.background.means),
                   "numba_ms": 1e3 * statistics.median(t_numba), "cuda_ms": 1e3 * statistics.median(t_cuda),
                   "cuda_mrays_s": rays / statistics.median(t_cuda) / 1e6, **parity(ref, got),
                   **ray_parity(scene, spec, sweeps[0]), "cuda_whole_lists_ms": 1e3 * statistics.median(t_whole),
                   "whole_lists_decisions_equal": parity(whole, got)["decisions_equal"]}
            rows.append(row)
            print(f"{name[-30:]:>30} {spec_name:>16} {rays:>7} rays  numba {row['numba_ms']:8.1f} ms  cuda "
                  f"{row['cuda_ms']:7.2f} ms ({row['cuda_mrays_s']:6.2f} M rays/s)  decisions equal "
                  f"{row['decisions_equal']:.5f}  |dr| median {row['median_abs_range_diff_mm']} mm, p99 "
                  f"{row['p99_abs_range_diff_mm']} mm; ray kernels: decisions equal {row['rays_decisions_equal']:.5f}, "
                  f"|dr| median {row['rays_median_abs_range_diff_mm']} mm; lists whole (no segments) "
                  f"{row['cuda_whole_lists_ms']:7.2f} ms, decisions equal {row['whole_lists_decisions_equal']:.5f}",
                  flush=True)
            if a.profile and len(rows) == 1:
                print(profile_sweeps(scene, spec, sweeps), flush=True)
    result = {"rows": rows, "argv": sys.argv[1:] if argv is None else argv}
    print(json.dumps(result))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
