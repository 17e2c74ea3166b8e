"""Training-step benchmark: forward + backward of a photometric loss on the demo street.

One step renders a frame of the drive with surfels that need gradients (float32 leaves) and
back-propagates an L1 loss on rgb plus an L1 loss on depth, against the forward-only render of
the next frame of the drive.

Usage: python bench/experiments/bench_train_step.py [--surfels 100000] [--sizes 640x360,320x180]
       [--steps 10] [--backends numba,torch] [--torch-steps 1] [--distortion]
Prints per-backend and size the median step time, split into forward and backward.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

import gsim
from gsim.street import demo_camera, drive_trajectory, street_surfels
from gsim.render.common import RenderOptions

PARAMS = ("means", "quats", "scales", "opacities", "colors")


def time_steps(surfels, camera, poses, backend: str, options: RenderOptions) -> list:
    """(forward s, backward s) per step along ``poses``, after a warm-up step (JIT, tile tables)."""
    st = surfels.torch(dtype=torch.float32)
    leaves = {k: getattr(st, k).clone().requires_grad_(True) for k in PARAMS}
    s = gsim.Surfels(**leaves)
    times = []
    for n, i in enumerate([0, *range(len(poses) - 1)]):
        target = gsim.render_camera(st, camera, poses[i + 1], backend="numba")
        t0 = time.perf_counter()
        f = gsim.render_camera(s, camera, poses[i], backend=backend, options=options)
        loss = (f.rgb - target.rgb).abs().mean() + 0.1 * (f.depth - target.depth).abs().mean()
        if f.distortion is not None:
            loss = loss + f.distortion.mean()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        for v in leaves.values():
            v.grad = None
        if n > 0:
            times.append((t1 - t0, t2 - t1))
    return times


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--surfels", type=int, default=100_000)
    ap.add_argument("--sizes", default="640x360,320x180", help="comma-separated WIDTHxHEIGHT")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--torch-steps", type=int, default=1, help="steps for the (slow) torch reference")
    ap.add_argument("--backends", default="numba,torch")
    ap.add_argument("--distortion", action="store_true", help="also render (and add) the depth distortion")
    args = ap.parse_args(argv)
    surfels = street_surfels(args.surfels)
    options = RenderOptions(distortion=args.distortion)
    result = {"surfels": len(surfels), "distortion": args.distortion, "torch_threads": torch.get_num_threads(),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus", "runs": []}
    for size in args.sizes.split(","):
        w, h = (int(x) for x in size.split("x"))
        camera = demo_camera(w, h)
        for b in args.backends.split(","):
            n = args.torch_steps if b == "torch" else args.steps
            t = time_steps(surfels, camera, drive_trajectory(n + 1), b, options)
            fwd, bwd = (statistics.median(x) for x in zip(*t))
            step = statistics.median(f + b_ for f, b_ in t)
            result["runs"].append({"backend": b, "resolution": size, "steps": n, "median_step_ms": round(step * 1e3, 1),
                                   "median_forward_ms": round(fwd * 1e3, 1), "median_backward_ms": round(bwd * 1e3, 1)})
            print(f"{b:6s} {len(surfels)} surfels {size}: step median {step * 1e3:.1f} ms (forward {fwd * 1e3:.1f}, "
                  f"backward {bwd * 1e3:.1f}) over {n} steps", flush=True)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
