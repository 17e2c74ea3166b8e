"""`gsim eval SCENE LOG --out DIR`: held-out view metrics of a reconstructed scene.

Held-out frames are every ``holdout_every``-th frame (index % n == 0), the ones the trainer
never sees. Per view: PSNR, SSIM (Gaussian 11x11) and, for logs with LiDAR, the absolute
error between the rendered depth and the LiDAR depth at the LiDAR points the camera sees
(metres; a point where nothing was rendered counts with the rendered depth 0). Top-level
numbers are means over the held-out views (LiDAR errors: mean over views of the per-view
median and mean). Writes DIR/metrics.json, DIR/metrics.md and DIR/views/*.png
(render | ground truth | error map).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gsim.appearance import camera_ray_directions, compose
from gsim.io import to_uint8, write_bytes, write_json, write_png
from gsim.render import render_camera
from gsim.scene import Scene, load_scene

from .log import load_log
from .losses import psnr, ssim
from .views import View, make_views, split_frames


def render_image(scene: Scene, camera, T_world_camera, timestamp_us: int, sensor: str, backend: str = "auto"):
    """(rgb with the sky and the camera sensor's affine, alpha, depth), numpy."""
    f = render_camera(scene, camera, T_world_camera, backend=backend, timestamp_us=timestamp_us)
    rgb = compose(f.rgb, f.alpha, scene.sky, camera_ray_directions(camera, T_world_camera),
                  scene.appearance.get(sensor))
    return np.clip(rgb, 0, 1), f.alpha, f.depth


def error_map(a: np.ndarray, b: np.ndarray, full_scale: float = 0.25) -> np.ndarray:
    """(H,W,3) uint8 heat map of the mean absolute RGB error (black 0 -> red -> yellow -> white at full_scale)."""
    e = np.abs(a - b).mean(-1) / full_scale
    return to_uint8(np.stack([3 * e, 3 * e - 1, 3 * e - 2], -1))


def _table(metrics: dict) -> str:
    has_lidar = "lidar_depth_median_abs_m" in metrics
    head = "| view | PSNR dB | SSIM |" + (" LiDAR depth median m | mean m |" if has_lidar else "")
    rows = [head, "|" + "---|" * (5 if has_lidar else 3)]
    for v in metrics["views"] + [{"name": "**mean**", **metrics}]:
        r = f"| {v['name']} | {v['psnr']:.2f} | {v['ssim']:.4f} |"
        if has_lidar:
            r += f" {v['lidar_depth_median_abs_m']:.3f} | {v['lidar_depth_mean_abs_m']:.3f} |"
        rows.append(r)
    return "\n".join(rows) + "\n"


def evaluate(scene_path, log_path, out, holdout_every: int = 8, downscale: int = 1, backend: str = "auto",
             progress: bool = True, write_images: bool = True) -> dict:
    scene, log = load_scene(scene_path), load_log(log_path)
    _, held = split_frames(log, holdout_every)
    if not held:
        raise ValueError(f"{log_path}: no held-out frames with holdout_every={holdout_every}")
    out = Path(out)
    views = make_views(log, held, downscale)
    it = views
    if progress:
        from tqdm import tqdm
        it = tqdm(views, desc="evaluate", unit="view")
    per_view, has_lidar = [], any(f.lidars for f in held)
    for v in it:
        rgb, alpha, depth = render_image(scene, v.camera, v.T_world_camera, v.timestamp_us, v.sensor, backend)
        name = f"{v.frame:06d}_{v.sensor}"
        m = {"name": name, "frame": v.frame, "sensor": v.sensor, "timestamp_us": v.timestamp_us,
             "psnr": psnr(rgb, v.image),
             "ssim": float(ssim(torch.from_numpy(rgb.astype(np.float32)), torch.from_numpy(v.image)))}
        if has_lidar:
            err = np.abs(depth.reshape(-1)[v.lidar_pix] - v.lidar_depth)
            m.update(lidar_points=int(len(err)),
                     lidar_depth_median_abs_m=float(np.median(err)) if len(err) else float("nan"),
                     lidar_depth_mean_abs_m=float(err.mean()) if len(err) else float("nan"))
        per_view.append(m)
        if write_images:
            write_png(out / "views" / f"{name}.png",
                      np.concatenate([to_uint8(rgb), to_uint8(v.image), error_map(rgb, v.image)], 1))
    metrics = {"scene": str(scene_path), "log": str(log_path), "holdout_every": holdout_every, "downscale": downscale,
               "held_out_frames": [f.index for f in held],
               "psnr": float(np.mean([m["psnr"] for m in per_view])),
               "ssim": float(np.mean([m["ssim"] for m in per_view]))}
    if has_lidar:
        for k in ("lidar_depth_median_abs_m", "lidar_depth_mean_abs_m"):
            metrics[k] = float(np.nanmean([m[k] for m in per_view]))
    metrics["views"] = per_view
    write_json(out / "metrics.json", metrics)
    write_bytes(out / "metrics.md", _table(metrics).encode())
    return metrics
