"""Off the driven path: a reconstruction rendered along the log's camera paths shifted sideways (a lane
change: +y is left in the vehicle frame) and ahead of the last frame, measured against exact ground truth.

Only the synthetic street has ground truth there: its log records its seed and options, from which the
street is re-created and ray cast at the shifted poses (`truth`). A real log has none off the driven path:
`street_of` says so (a ValueError naming the log)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

from gsim.cameras import downscale_image
from gsim.errors import InputError

from .. import synth
from .render_path import offset_pose

OPTIONS_NOTE = "options: "


def street_of(log) -> Tuple[object, "synth.SynthOptions"]:
    """The synthetic street (and its options) that made ``log``, re-created from the seed and options the log
    records; a ValueError for any other log (no ground truth off the driven path)."""
    notes = [n for n in log.notes if n.startswith(OPTIONS_NOTE)]
    if log.source != "gsim.scenes.synth" or not notes or "seed" not in log.name:
        raise InputError(f"{log.root}: a {log.source} log has no ground truth off the driven path; lane-shift "
                         f"metrics need a synthetic street log (gsim synth)")
    seed = int(log.name.rsplit("seed", 1)[1])
    options = synth.SynthOptions.from_dict(json.loads(notes[0][len(OPTIONS_NOTE):]))
    if not synth.made_by(log, seed, options):
        raise InputError(f"{log.root}: the log's name and notes do not describe one synthetic street")
    return synth.build_street(seed, options), options


def truth(street, options, log, sensor: str, T_world_camera: np.ndarray, timestamp_us: int,
          downscale: int = 1) -> np.ndarray:
    """(H,W,3) float32 in [0,1]: the synthetic street's exact image from a pose, as the log's images are
    made (the log camera at full size, box-averaged by ``downscale`` like the evaluation's)."""
    rgb, _ = synth.render_camera(street, log.cameras[sensor].camera, T_world_camera, timestamp_us, options.supersample)
    return downscale_image(rgb.astype(np.float32) / 255.0, downscale)


def render_truth(log, trajectory, out: Path, progress: bool = True) -> int:
    """The synthetic street's exact images along any camera ``trajectory`` (e.g. `gsim trajectory --shift-m`):
    out/rgb/NNNNNN.png and out/depth/NNNNNN.png (16-bit, metres x 256, 0 = sky), as `gsim render` writes a
    reconstruction's; returns the number of frames."""
    from gsim.io import write_depth_png, write_png
    street, options = street_of(log)
    items = list(zip(trajectory.timestamps_us, trajectory.poses))
    if progress:
        from tqdm import tqdm
        items = tqdm(items, desc="ground truth", unit="frame")
    for i, (t, T) in enumerate(items):
        rgb, depth = synth.render_camera(street, trajectory.camera, T, int(t), options.supersample)
        write_png(Path(out) / "rgb" / f"{i:06d}.png", rgb)
        write_depth_png(Path(out) / "depth" / f"{i:06d}.png", depth)
    return len(trajectory.poses)


def offsets(shifts: Sequence[float], ahead: Sequence[float]) -> List[Tuple[str, float, float, float]]:
    """(kind, distance, ahead_m, left_m) of each evaluated offset: both sides of every shift, then ``ahead``."""
    out = []
    for s in shifts:
        out += [("lane_shift", float(s), 0.0, float(s)), ("lane_shift", float(s), 0.0, -float(s))]
    return out + [("ahead", float(a), float(a), 0.0) for a in ahead]


def evaluate_offsets(scene, log, views, shifts: Sequence[float], ahead: Sequence[float], downscale: int, out: Path,
                     backend: str = "auto", write_images: bool = True, progress: bool = True, repair=None,
                     holdout_every: int = 8) -> dict:
    """Renders ``scene`` at each held-out view moved sideways by every shift (both sides) and, from the last
    held-out frame, ahead by every distance; returns {"lane_shift": [{shift_m, psnr, ssim,
    low_alpha_fraction, views}], "ahead": [{ahead_m, ...}]} (both sides averaged) and writes side-by-side
    images (render | truth | error) to out/offsets/. ``repair``: a repairer (`gsim.diffusion.open_repairer`); the
    repaired renders are measured too (``repaired_psnr``, ``repaired_ssim``) and drawn after the render; one with
    ``repair_view`` (a repair model) is given the view, for references from the log's training views
    (``holdout_every``: which frames those are)."""
    from gsim.io import to_uint8, write_png
    from gsim.images import error_map, image_metrics, render_image, repaired
    from gsim.resident import Renderer
    street, options = street_of(log)
    last = max(v.frame for v in views)
    jobs = [(k, d, dx, dy, v) for k, d, dx, dy in offsets(shifts, ahead) for v in views
            if k == "lane_shift" or v.frame == last]
    if progress:
        from tqdm import tqdm
        jobs = tqdm(jobs, desc="off the path", unit="view")
    rows = {}
    renderer = Renderer(scene, backend)
    for kind, dist, dx, dy, v in jobs:
        T = offset_pose(log, v.sensor, v.timestamp_us, dx, dy)
        rgb, alpha, depth = render_image(renderer, v.camera, scene.log_pose(T, v.timestamp_us), v.timestamp_us,
                                         v.sensor)
        gt = truth(street, options, log, v.sensor, T, v.timestamp_us, downscale)
        m = {**image_metrics(rgb, gt), "low_alpha_fraction": float(np.mean(alpha < 0.5))}
        shown = [rgb]
        if repair is not None:
            fixed = repaired(repair, renderer, log, v.camera, T, v.timestamp_us, rgb, alpha, depth, sensor=v.sensor,
                             holdout_every=holdout_every, downscale=downscale)
            m.update({f"repaired_{k}": x for k, x in image_metrics(fixed, gt).items()})
            shown.append(fixed)
        rows.setdefault((kind, dist), []).append(m)
        if write_images:
            write_png(out / "offsets" / f"{kind}_{dx:+.1f}_{dy:+.1f}_{v.frame:06d}_{v.sensor}.png",
                      np.concatenate([to_uint8(x) for x in shown] + [to_uint8(gt), error_map(shown[-1], gt)], 1))
    result = {"lane_shift": [], "ahead": []}
    for (kind, dist), ms in rows.items():
        key = "shift_m" if kind == "lane_shift" else "ahead_m"
        result[kind].append({key: dist, "views": len(ms),
                             **{k: float(np.mean([m[k] for m in ms])) for k in ms[0]}})
    return result
