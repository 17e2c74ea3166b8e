"""How fast the repair model trains and repairs on a device (issue 36: a model for a new log in under 30 min, a
640x360 frame repaired in under 1 s; and on a GPU where lent).

A fresh model of `gsim diffusion train`'s default settings (--references slots, through the LiDAR; its speed does
not depend on its weights) on random inputs: the median of --steps training steps (a batch of 4 crops of 64 pixels,
as `gsim diffusion train` takes them, after 3 warm-up steps) and of --repairs one-pass repairs of a WIDTHxHEIGHT frame
(`repair_image`, numpy in and out, after one warm-up). With --log (a log with LiDAR whose images are the frame's
size), also the median time to build a held-out view's references as a repair does (`model_references` through the
log's LiDAR: the sources' and the target's depth maps and the warps, numpy on the CPU; the LiDAR points gathered
once before, not timed): a frame's repair is the two together.

Usage: python bench/bench_repair_speed.py [--device auto] [--width 640] [--height 360] [--references 2]
       [--steps 30] [--repairs 10] [--log LOG] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from gsim.diffusion.references import model_references, training_lidar
from gsim.diffusion.repair import RepairConfig, RepairModel, repair_device
from gsim.diffusion.train import TrainOptions
from gsim.scene import Scene
from gsim.scenes.log import load_log
from gsim.scenes.reconstruction.views import make_views, split_frames
from gsim.street import street_surfels


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def reference_ms(log_dir, config: RepairConfig, n: int, size) -> float:
    """The median ms to build one held-out view's references (of the first ``n``), as `repair_view` does."""
    log = load_log(log_dir)
    views = make_views(log, split_frames(log, 8)[1], 1)[:n]
    if not views or (views[0].camera.height, views[0].camera.width) != tuple(size):
        raise SystemExit(f"--log {log_dir}: expected held-out views of {size[1]}x{size[0]} pixels")
    scene = Scene(background=street_surfels(100))  # (through the LiDAR the scene's geometry takes no part)
    training_lidar(log)
    times = []
    for v in views:
        blank = np.zeros((v.camera.height, v.camera.width))
        t0 = time.perf_counter()
        model_references(config, scene, log, v.camera, v.T_world_camera, v.timestamp_us, blank, blank,
                         sensor=v.sensor, downscale=1)
        times.append(time.perf_counter() - t0)
    return round(1e3 * float(np.median(times)), 1)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=360)
    ap.add_argument("--references", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repairs", type=int, default=10)
    ap.add_argument("--log", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    device = repair_device(a.device)
    config, opts = RepairConfig(references=a.references, reference_depth="lidar"), TrainOptions()
    model = RepairModel.new(config).to(device)
    opt = torch.optim.AdamW(model.unet.parameters(), lr=opts.lr)
    g = torch.Generator().manual_seed(0)
    B, c, k = opts.batch, opts.crop, a.references
    batch = [torch.rand(B, 3, c, c, generator=g), torch.rand(B, 3, c, c, generator=g), torch.ones(B, 1, c, c),
             torch.full((B, 1, c, c), 8.0), torch.rand(B, k, 4, c, c, generator=g).round() if k else None]
    batch = [None if x is None else x.to(device) for x in batch]
    step_s = []
    for i in range(a.steps + 3):
        _sync(device)
        t0 = time.perf_counter()
        loss = model.loss(*batch[:4], generator=g, references=batch[4])
        opt.zero_grad()
        loss.backward()
        opt.step()
        _sync(device)
        if i >= 3:
            step_s.append(time.perf_counter() - t0)
    model.unet.eval()
    rng = np.random.default_rng(0)
    H, W = a.height, a.width
    frame = (rng.random((H, W, 3)), np.ones((H, W)), np.full((H, W), 8.0))
    refs = [(rng.random((H, W, 3)), rng.random((H, W)) > 0.5) for _ in range(k)] or None
    repair_s = []
    for i in range(a.repairs + 1):
        t0 = time.perf_counter()
        model.repair_image(*frame, references=refs)  # (numpy out: synchronised)
        if i:
            repair_s.append(time.perf_counter() - t0)
    if a.log and k:
        result_refs = reference_ms(a.log, config, a.repairs, (H, W))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {"device": name, "torch": torch.__version__, "threads": torch.get_num_threads(), "references": k,
              "train_step_ms": round(1e3 * float(np.median(step_s)), 1),
              "train_default_steps_min": round(opts.steps * float(np.median(step_s)) / 60, 1),
              "frame": [W, H], "repair_ms": round(1e3 * float(np.median(repair_s)), 1)}
    if a.log and k:
        result.update(references_ms=result_refs, frame_ms=round(result["repair_ms"] + result_refs, 1))
    print(json.dumps(result))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
