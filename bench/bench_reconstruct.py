"""Reconstruction benchmark: train a preset on a log, evaluate the held-out frames, report wall time.

Without --log it synthesizes the project's default street (seed 0) first. One run writes
OUT/recon (scene, checkpoint, train.json), OUT/eval (metrics.json, metrics.md, side-by-side
images) and OUT/bench.json, and prints a markdown row for BENCHMARKS.md.

Usage: python bench/bench_reconstruct.py [--log LOG] [--out out/bench/recon] [--preset cpu]
       [--iterations N] [--downscale D] [--no-lidar-losses] [--set JSON]
--set overrides TrainConfig fields for a trial, e.g. '{"robust_k": 0, "densify": {"max_surfels": 800000}}'.
--no-lidar-losses trains on the images alone (no LiDAR depth in the views, no LiDAR rays, no head): the
baseline that the LiDAR losses are compared against (the LiDAR still initialises the surfels).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from gsim.io import write_json
from gsim.scenes.evaluation.evaluate import evaluate
from gsim.scenes.synth import synthesize
from gsim.scenes.reconstruction.train import preset, reconstruct


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", help="a gsim log (default: synthesize the default street into OUT/log)")
    ap.add_argument("--out", default="out/bench/recon")
    ap.add_argument("--preset", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--iterations", type=int)
    ap.add_argument("--downscale", type=int)
    ap.add_argument("--no-lidar-losses", action="store_true")
    ap.add_argument("--no-movers", action="store_true", help="logs without tracks: no moving-object detection")
    ap.add_argument("--set", type=json.loads, default={}, metavar="JSON", help="TrainConfig fields to override")
    args = ap.parse_args(argv)
    out = Path(args.out)
    log = Path(args.log) if args.log else synthesize(out / "log", seed=0)
    overrides = {k: v for k, v in (("iterations", args.iterations), ("downscale", args.downscale)) if v is not None}
    if args.no_lidar_losses:
        overrides.update(lidar_weight=0.0, lidar_rays=0)
    if args.no_movers:
        overrides["movers"] = False
    cfg = preset(args.preset, **overrides)
    try:
        cfg = cfg.with_overrides(args.set)
    except (TypeError, AttributeError) as e:
        ap.error(f"--set {json.dumps(args.set)}: {e}")
    t0 = time.perf_counter()
    reconstruct(log, out / "recon", cfg)
    train_s = time.perf_counter() - t0
    m = evaluate(out / "recon" / "scene", log, out / "eval", holdout_every=cfg.holdout_every, downscale=cfg.downscale)
    surfels = json.loads((out / "recon" / "train.json").read_text())["surfels"]
    result = {"log": str(log), "preset": cfg.preset, "set": args.set, "backend": cfg.backend, "iterations": cfg.iterations,
              "downscale": cfg.downscale, "train_wall_s": round(train_s, 1),
              "s_per_1000_it": round(1000 * train_s / cfg.iterations, 1), "surfels": surfels,
              "psnr": m["psnr"], "ssim": m["ssim"],
              "lidar_losses": not args.no_lidar_losses, **{k: v for k, v in m.items() if k.startswith("lidar_")
                                                           and k != "lidar_sweeps"},
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"}
    write_json(out / "bench.json", result)
    lidar = (f" {m['lidar_depth_median_abs_m']:.3f} | {m['lidar_depth_mean_abs_m']:.3f} |"
             if "lidar_depth_median_abs_m" in m else " - | - |")
    print(f"| {Path(log).name} | {cfg.preset} ({cfg.backend}) | {cfg.iterations} | {train_s / 60:.1f} min | "
          f"{result['s_per_1000_it']} s | {m['psnr']:.2f} | {m['ssim']:.4f} |{lidar}")
    return result


if __name__ == "__main__":
    main()
