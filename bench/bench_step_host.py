"""A training step's host time: the `cuda` preset's step (`sync=False`, as a GPU run steps) run on the CPU with the
torch backend on a tiny model (3000 background surfels and 200 per actor, images downscaled 8x), so that the
tensors' own work is small and what is timed is mostly Python and dispatch, the part of a GPU step the GPU waits
for when it is not hidden. After one pass over the views (each view's time seen once, as in a run), times
--steps steps; prints the median step and, from cProfile, the mean milliseconds a step spends in the model's
world-frame surfels (`SceneModel.surfels_at`: the actors' poses and colours), in rendering and in the backward
(means: every 8th step also traces LiDAR rays).

Usage: python bench/bench_step_host.py LOG [--steps 40] [--profile FILE]
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
from pathlib import Path

import torch

from bench_scene_step import timed_steps, write_profile
from gsim.scenes.reconstruction.init import InitOptions
from gsim.scenes.reconstruction.train import preset, start, train_step


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--profile", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = preset("cuda", backend="torch", downscale=8, lidar_rays=512, movers=False,
                 init=InitOptions(sh_degree=1, max_surfels=3000, max_actor_surfels=200))
    t = start(args.log, cfg)
    run = t.run
    run.step = cfg.normal_from + 100  # every loss on (normals, robust mask)

    def step(i: int) -> None:
        train_step(run, t.views[i % len(t.views)], t.sweeps, t.log, robust=t.robust, sync=False)
        run.step += 1
    for i in range(len(t.views)):
        step(i)
    prof = cProfile.Profile()
    times = timed_steps(step, range(args.steps), prof)
    stats = pstats.Stats(prof)

    def per_step(name: str, module: str) -> float:  # ms a step in function ``name`` of a file ending ``module``
        return round(1e3 * sum(v[3] for k, v in stats.stats.items() if k[2] == name and k[0].endswith(module))
                     / args.steps, 2)
    result = {"log": str(args.log), "surfels": len(run.model), "actors": len(run.model.tracks), "steps": args.steps,
              "median_step_ms": round(1e3 * statistics.median(times), 1),
              "surfels_at_ms": per_step("surfels_at", "model.py"),
              "render_ms": per_step("render_camera", "render/__init__.py"),
              "backward_ms": per_step("backward", "torch/_tensor.py")}
    if args.profile:
        write_profile(prof, args.profile)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
