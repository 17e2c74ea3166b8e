"""Camera rendering benchmark: the demo street (ground, two facades, objects) along a drive.

Usage: python bench/bench_camera.py [--surfels 100000] [--width 640 --height 360]
       [--frames 20] [--backends numba,torch] [--torch-frames 3]
Prints per-backend median frame time and frames/s, and the numba/torch speed-up.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import gsim
from gsim.street import demo_camera, drive_trajectory, street_surfels


def time_backend(surfels, camera, poses, backend: str) -> list:
    gsim.render_camera(surfels, camera, poses[0], backend=backend)  # warm-up: JIT / caches
    times = []
    for T in poses:
        t0 = time.perf_counter()
        gsim.render_camera(surfels, camera, T, backend=backend)
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--surfels", type=int, default=100_000)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=360)
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--torch-frames", type=int, default=3, help="frames for the (slow) torch reference")
    ap.add_argument("--backends", default="numba,torch")
    args = ap.parse_args(argv)
    surfels = street_surfels(args.surfels)
    camera = demo_camera(args.width, args.height)
    poses = drive_trajectory(args.frames)
    result = {"surfels": len(surfels), "resolution": f"{args.width}x{args.height}",
              "machine": f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cpus",
              "backends": {}}
    for b in args.backends.split(","):
        if b not in gsim.available_backends():
            result["backends"][b] = {"unavailable": gsim.backend_report()[b]}
            continue
        n = args.torch_frames if b == "torch" else args.frames
        idx = np.linspace(0, len(poses) - 1, n).round().astype(int)
        t = time_backend(surfels, camera, poses[idx], b)
        med = statistics.median(t)
        result["backends"][b] = {"frames": n, "median_ms": round(med * 1e3, 2), "fps": round(1 / med, 2)}
        print(f"{b:7s} {len(surfels)} surfels {args.width}x{args.height}: median {med * 1e3:.1f} ms "
              f"({1 / med:.1f} frames/s) over {n} frames", flush=True)
    r = result["backends"]
    if "median_ms" in r.get("numba", {}) and "median_ms" in r.get("torch", {}):
        result["numba_speedup_over_torch"] = round(r["torch"]["median_ms"] / r["numba"]["median_ms"], 1)
        print(f"numba speed-up over torch: {result['numba_speedup_over_torch']}x")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
