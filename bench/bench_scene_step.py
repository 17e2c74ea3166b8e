"""Full training-step benchmark on a reconstruction's checkpoint: `scenes.reconstruction.train.train_step` (render,
losses, the LiDAR ray batch every ``lidar_every`` steps, Adam), at the checkpoint's surfels and settings.

Usage: python bench/bench_scene_step.py RECON [--steps 40] [--profile FILE]
RECON is a `gsim reconstruct` output folder (its checkpoint.safetensors and train.json; the log it names is
loaded, its movers found again as in training). Steps run from the checkpoint's step on, over the
training views in order, without densification, after warm-up steps up to and including the first LiDAR ray
batch (the kernels' compilation). Prints the median step time and, on a GPU, the mean (the device synchronised
at the end: a step's host time runs ahead of the GPU's); --profile writes cProfile's 45 costliest calls of the
timed steps (by cumulative time) to FILE.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import time
from pathlib import Path

import torch

from gsim.scenes.reconstruction.train import CHECKPOINT, TrainConfig, load_state, start, train_step


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recon", type=Path)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--profile", type=Path, default=None)
    args = ap.parse_args(argv)
    state = load_state(args.recon / CHECKPOINT)
    log_path = json.loads((args.recon / "train.json").read_text())["log"]
    t = start(log_path, TrainConfig.from_dict(state["config"]), state)
    run = t.run

    def step(i: int) -> None:
        train_step(run, t.views[i % len(t.views)], t.sweeps, t.log, robust=t.robust)
        run.step += 1
    warm = 0
    while warm == 0 or (run.step - 1) % run.cfg.lidar_every:  # through the first LiDAR batch (numba's cache, CUDA)
        step(warm)
        warm += 1
    sync = torch.cuda.synchronize if run.model.device.type == "cuda" else lambda: None
    sync()
    prof = cProfile.Profile() if args.profile else None
    start_all = time.perf_counter()
    times = timed_steps(step, range(warm, warm + args.steps), prof)
    sync()
    result = {"recon": str(args.recon), "surfels": len(run.model), "downscale": run.cfg.downscale,
              "steps": args.steps, "median_step_s": round(statistics.median(times), 4),
              "mean_step_s_synchronised": round((time.perf_counter() - start_all) / args.steps, 4),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    if prof:
        write_profile(prof, args.profile)
    print(json.dumps(result))
    return result


def timed_steps(step, indices, prof=None) -> list:
    """The seconds each ``step(i)`` took, profiled by ``prof`` (a cProfile.Profile) when given."""
    times = []
    for i in indices:
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        step(i)
        if prof:
            prof.disable()
        times.append(time.perf_counter() - t0)
    return times


def write_profile(prof, path: Path) -> None:
    """cProfile's 45 costliest calls by cumulative time, as text."""
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(45)
    path.write_text(text.getvalue())


if __name__ == "__main__":
    main()
