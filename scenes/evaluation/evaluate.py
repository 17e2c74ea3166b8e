"""`gsim eval SCENE LOG --out DIR`: held-out view metrics of a reconstructed scene.

Held-out frames are every ``holdout_every``-th frame (index % n == 0), the ones the trainer
never sees, box-averaged by the scene's training downscale unless told otherwise. Per view:
PSNR, SSIM (Gaussian 11x11) and, for logs with LiDAR, the absolute
error between the rendered depth and the LiDAR depth at the LiDAR points the camera sees
(metres; a point where nothing was rendered counts with the rendered depth 0). Top-level
numbers are means over the held-out views (LiDAR errors: mean over views of the per-view
median and mean). Writes DIR/metrics.json, DIR/metrics.md and DIR/views/*.png
(render | ground truth | error map).

Held-out LiDAR sweeps are rendered ray by ray along the real sweep's own rays (scenes.reconstruction.lidar_rays:
each point's direction and firing time, and with a beam model every empty cell of the beam grid)
and compared with gsim.lidar.metrics: range errors, Chamfer distance, ray-drop accuracy, intensity
RMSE (scenes with a LiDAR head); top-level ``lidar_*`` numbers are means over the sweeps, and
DIR/lidar/*.png shows each sweep from above, rendered (left) beside the real one (right).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np

from gsim.errors import GsimWarning, InputError
from gsim.images import error_map, image_metrics, render_image, repaired
from gsim.io import to_uint8, write_bytes, write_json, write_png
from gsim.resident import Renderer
from gsim.scene import Scene, load_scene

from .lane_shift import evaluate_offsets, offpath_table, street_of
from ..reconstruction.lidar_rays import sweep_rays
from ..log import load_log
from ..reconstruction.views import make_views, split_frames


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


def _lidar_sweeps(scene: Scene, log, held, out: Path, progress: bool, write_images: bool) -> list:
    from gsim.lidar.metrics import birds_eye, ray_metrics
    from gsim.lidar.render import render_rays
    items = [(f, obs) for f in held for obs in f.lidars.values()]
    if progress:
        from tqdm import tqdm
        items = tqdm(items, desc="evaluate LiDAR", unit="sweep")
    results = []
    for f, obs in items:
        rays = sweep_rays(log, obs)
        beams = log.lidars[obs.sensor].beams
        lo, hi = (beams.min_range_m, beams.max_range_m) if beams is not None else (0.0, np.inf)
        r = render_rays(scene, scene.log_pose(rays.poses(log), rays.times_us), rays.times_us, rays.dirs, lo, hi)
        m = {"name": f"{f.index:06d}_{obs.sensor}", "frame": f.index, "sensor": obs.sensor,
             **ray_metrics(r["range"], rays.range, rays.dirs, r["intensity"], rays.intensity, rays.grid is not None)}
        results.append(m)
        if write_images:
            pts = lambda rng: rays.dirs[rng > 0] * rng[rng > 0, None]
            write_png(out / "lidar" / f"{m['name']}.png", np.concatenate(
                [birds_eye(pts(r["range"]), color=(120, 220, 255)), np.full((400, 4, 3), 80, np.uint8),
                 birds_eye(pts(rays.range), color=(255, 200, 120))], 1))
    return results


def evaluate(scene_path, log_path, out, holdout_every: int = 8, downscale: Optional[int] = None,
             backend: str = "auto", progress: bool = True, write_images: bool = True,
             shifts: Sequence[float] = (), ahead: Sequence[float] = (), repair=None,
             frames: Optional[Tuple[int, Optional[int]]] = None) -> dict:
    """Held-out metrics of the scene at ``scene_path`` on the log at ``log_path``, written to ``out``.

    Images are box-averaged by ``downscale``; None takes the scene's training downscale (1 when the
    scene has none recorded). A different explicit factor is allowed (evaluating at another
    resolution on purpose) but warned about: its metrics do not compare with the training's.
    ``shifts`` (m) and ``ahead`` (m): also the held-out views shifted sideways (both sides) and the last one
    moved ahead, against the synthetic street's exact images (`gsim.scenes.evaluation.lane_shift`; metrics.json
    ``lane_shift`` and ``ahead``); a real log has no ground truth there (a ValueError before any work).
    ``repair``: a repairer (`gsim.diffusion.open_repairer`): every render is also repaired and measured
    (``repaired_psnr``, ``repaired_ssim`` beside each PSNR and SSIM); one with ``repair_view`` (a repair model) is
    given the view, for references from the log's training views (never a held-out frame). ``frames``: (first,
    last) log frame indices, last excluded (None: to the end), evaluated instead of the held-out frames, e.g. those
    after a reconstruction's ``train_span`` (an extrapolation check a real log allows); a repairer takes no
    references from them."""
    scene, log = load_scene(scene_path), load_log(log_path)
    if shifts or ahead:
        street_of(log)  # a log without ground truth off the path fails here, not after the held-out views
        if any(not (isinstance(d, (int, float)) and 0 < d <= 50) for d in (*shifts, *ahead)):
            raise InputError(f"shifts / ahead: expected distances in (0, 50] metres, got {list(shifts)} / {list(ahead)}")
    if downscale is None:
        downscale = scene.train_downscale or 1
    elif scene.train_downscale is not None and downscale != scene.train_downscale:
        warnings.warn(f"{scene_path}: evaluating at downscale {downscale}, but the scene was trained at downscale "
                      f"{scene.train_downscale}", GsimWarning, stacklevel=2)
    if frames is None:
        _, held = split_frames(log, holdout_every)
        if not held:
            raise InputError(f"{log_path}: no held-out frames (frame index % {holdout_every} == 0)")
    else:
        first, last = frames
        held = [f for f in log.frames if first <= f.index and (last is None or f.index < last)]
        if not held:
            end = "the end" if last is None else last
            raise InputError(f"frames: no frame of {log_path} has an index in [{first}, {end}) (its frames: "
                             f"{log.frames[0].index} to {log.frames[-1].index})")
    out = Path(out)
    views = make_views(log, held, downscale)
    it = views
    if progress:
        from tqdm import tqdm
        it = tqdm(views, desc="evaluate", unit="view")
    per_view, has_lidar = [], any(f.lidars for f in held)
    unseen = tuple(f.index for f in held) if frames is not None else ()  # (held-out frames are never references)
    renderer = Renderer(scene, backend)  # the scene put on the renderer's device once for every view
    for v in it:
        rgb, alpha, depth = render_image(renderer, v.camera, scene.log_pose(v.T_world_camera, v.timestamp_us),
                                         v.timestamp_us, v.sensor)
        name = f"{v.frame:06d}_{v.sensor}"
        m = {"name": name, "frame": v.frame, "sensor": v.sensor, "timestamp_us": v.timestamp_us,
             **image_metrics(rgb, v.image)}
        if repair is not None:
            fixed = repaired(repair, renderer, log, v.camera, v.T_world_camera, v.timestamp_us, rgb, alpha, depth,
                             sensor=v.sensor, holdout_every=holdout_every, downscale=downscale,
                             exclude=unseen)
            m.update({f"repaired_{k}": x for k, x in image_metrics(fixed, v.image).items()})
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
               "train_downscale": scene.train_downscale,
               "held_out_frames": [f.index for f in held], "frames": None if frames is None else list(frames),
               **{k: float(np.mean([m[k] for m in per_view])) for k in per_view[0]
                  if k in ("psnr", "ssim", "repaired_psnr", "repaired_ssim")}}
    if has_lidar:
        for k in ("lidar_depth_median_abs_m", "lidar_depth_mean_abs_m"):
            metrics[k] = float(np.nanmean([m[k] for m in per_view]))
    sweeps = _lidar_sweeps(scene, log, held, out, progress, write_images)
    if sweeps:
        for k in ("range_median_abs_m", "range_mean_abs_m", "chamfer_m", "ray_drop_accuracy", "intensity_rmse"):
            vals = [m[k] for m in sweeps if k in m]
            if vals:
                metrics[f"lidar_{k}"] = float(np.nanmean(vals))
        metrics["lidar_sweeps"] = sweeps
    if shifts or ahead:
        metrics.update(evaluate_offsets(scene, log, views, shifts, ahead, downscale, out, backend, write_images,
                                        progress, repair, holdout_every))
    metrics["views"] = per_view
    write_json(out / "metrics.json", metrics)
    table = _table(metrics) + (f"\nOff the driven path, against the exact street:\n\n{offpath_table(metrics)}"
                               if shifts or ahead else "")
    write_bytes(out / "metrics.md", table.encode())
    return metrics
