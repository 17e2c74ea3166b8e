"""LiDAR rendering benchmark: sweeps of the demo street (`gsim.demo.street_surfels`) along its drive.

Usage: python bench/bench_lidar.py [--surfels 200000] [--lasers 64] [--columns 2048] [--sweeps 10]
       [--backends numba]
The sensor: `lasers` beams evenly from +22.5 to -22.5 deg (an OS1-like pattern), `columns` per
revolution, 1.9 m above the street. Prints the median wall time per sweep after one warm-up sweep.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

from gsim.demo import drive_trajectory, street_surfels
from gsim.lidar import LidarSpec, render_lidar


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--surfels", type=int, default=200_000)
    ap.add_argument("--lasers", type=int, default=64)
    ap.add_argument("--columns", type=int, default=2048)
    ap.add_argument("--sweeps", type=int, default=10)
    ap.add_argument("--backends", default="numba")
    args = ap.parse_args(argv)
    surfels = street_surfels(args.surfels)
    spec = LidarSpec(name=f"bench-{args.lasers}x{args.columns}",
                     elevations_deg=tuple(np.linspace(22.5, -22.5, args.lasers).tolist()),
                     azimuth_resolution_deg=360.0 / args.columns, spin_hz=10.0, min_range_m=0.5, max_range_m=120.0)
    poses = []
    for T_cam in drive_trajectory(args.sweeps + 1):  # the drive's camera poses, turned to a LiDAR's axes
        T = np.eye(4)
        T[:3, 3] = T_cam[:3, 3] + [0.0, 0.0, 0.3]
        poses.append(T)
    out = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
           "surfels": len(surfels), "rays": args.lasers * args.columns}
    for backend in args.backends.split(","):
        render_lidar(surfels, spec, poses[0], backend=backend)  # warm-up: JIT, tile tables
        times, returns = [], []
        for T in poses[1:]:
            t0 = time.perf_counter()
            f = render_lidar(surfels, spec, T, backend=backend)
            times.append(time.perf_counter() - t0)
            returns.append(len(f.points))
        out[backend] = {"median_ms": round(1000 * statistics.median(times), 1), "sweeps": len(times),
                        "median_returns": int(statistics.median(returns))}
        print(f"{backend}: {args.lasers}x{args.columns} rays, {len(surfels)} surfels: median "
              f"{out[backend]['median_ms']} ms/sweep ({1000 / out[backend]['median_ms']:.1f} sweeps/s), "
              f"{out[backend]['median_returns']} returns")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
