"""Full training-step benchmark on a reconstruction's checkpoint: `scenes.train.train_step` (render,
losses, the LiDAR ray batch every ``lidar_every`` steps, Adam), at the checkpoint's surfels and settings.

Usage: python bench/bench_scene_step.py RECON [--steps 40]
RECON is a `gsim reconstruct` output folder (its checkpoint.safetensors and train.json; the log it names is
loaded, its movers found again as in training). Steps run from the checkpoint's step on, over the
training views in order, without densification. Prints the median step time and writes nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from gsim.scenes.train import CHECKPOINT, TrainConfig, load_state, start, train_step


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recon", type=Path)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args(argv)
    state = load_state(args.recon / CHECKPOINT)
    log_path = json.loads((args.recon / "train.json").read_text())["log"]
    t = start(log_path, TrainConfig.from_dict(state["config"]), state)
    run, times = t.run, []
    for i in range(args.steps + 1):  # the first step compiles the kernels (numba's cache may be cold)
        t0 = time.perf_counter()
        train_step(run, t.views[i % len(t.views)], t.sweeps, t.log, robust=t.robust)
        run.step += 1
        times.append(time.perf_counter() - t0)
    result = {"recon": str(args.recon), "surfels": len(run.model), "downscale": run.cfg.downscale,
              "steps": args.steps, "median_step_s": round(statistics.median(times[1:]), 4),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
