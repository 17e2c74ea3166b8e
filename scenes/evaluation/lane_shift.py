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
from .render_path import vehicle_offset

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


# A car's box in the vehicle frame (x forward, y left, z up; the synthetic ego's origin is on the ground, its
# cameras 1.8 m ahead of it and 1.6 m up): a shifted view is one a vehicle could have only where this box, raised
# off the ground by a curb's height, is free, and no surface is nearer its camera than NEAR_M.
EGO_BOX_M = np.array([[-1.0, -0.95, 0.2], [3.6, 0.95, 1.6]])
NEAR_M = 0.3


def drivable(street, T_world_vehicle: np.ndarray, timestamp_us: int, hits=None) -> bool:
    """Whether the ego could stand at ``T_world_vehicle``: its box (`EGO_BOX_M`, sampled every ~0.3 m) is inside no
    solid of the street at that time, and the camera's view (``hits``, `synth.camera_hits`; None: no camera) meets
    no surface nearer than `NEAR_M` (a camera against a parked car's flank sees nothing a vehicle's camera could)."""
    lo, hi = EGO_BOX_M
    axes = [np.linspace(a, b, max(2, int(np.ceil((b - a) / 0.3)) + 1)) for a, b in zip(lo, hi)]
    box = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
    world = box @ T_world_vehicle[:3, :3].T + T_world_vehicle[:3, 3]
    near = hits is not None and bool(((hits.prim >= 0) & (hits.t < NEAR_M)).any())
    return not near and not bool(street.occupied(world, timestamp_us).any())


LIDAR_KEYS = ("range_median_abs_m", "range_mean_abs_m", "chamfer_m", "ray_drop_accuracy")


def shifted_sweeps(scene, log, street, frames, left_m: float) -> dict:
    """The scene's LiDAR sweeps from the log's LiDAR moved ``left_m`` sideways at each of ``frames``, against the
    street's exact sweeps there, ray by ray (the exact sweep's rays and its beam grid's empty cells):
    {sweeps, sweeps_left_out (the ego could not stand there), and the means of `LIDAR_KEYS`}; {} without LiDAR."""
    import dataclasses
    from gsim.lidar.metrics import ray_metrics
    from gsim.lidar.render import render_rays
    from ..reconstruction.lidar_rays import points_rays
    offset = vehicle_offset(left_m=left_m)
    got, left_out = [], 0
    for f in frames:
        for obs in f.lidars.values():
            spec = log.lidars[obs.sensor]
            if spec.beams is None:
                continue
            if not drivable(street, log.T_world_vehicle(obs.timestamp_us) @ offset, obs.timestamp_us):
                left_out += 1
                continue
            moved = dataclasses.replace(spec, T_vehicle_lidar=offset @ spec.T_vehicle_lidar)
            rays = points_rays(synth.lidar_sweep(street, moved.T_vehicle_lidar, spec.beams, obs.timestamp_us),
                               obs.sensor, obs.timestamp_us, moved)
            r = render_rays(scene, scene.log_pose(rays.poses(log), rays.times_us), rays.times_us, rays.dirs,
                            spec.beams.min_range_m, spec.beams.max_range_m)
            got.append(ray_metrics(r["range"], rays.range, rays.dirs))
    if not got and not left_out:
        return {}
    return {"sweeps": len(got), "sweeps_left_out": left_out,
            **{k: float(np.nanmean([m[k] for m in got])) if got else float("nan") for k in LIDAR_KEYS}}


def offsets(shifts: Sequence[float], ahead: Sequence[float]) -> List[Tuple[str, float, float, float]]:
    """(kind, distance, ahead_m, left_m) of each evaluated offset: both sides of every shift, then ``ahead``."""
    out = []
    for s in shifts:
        out += [("lane_shift", float(s), 0.0, float(s)), ("lane_shift", float(s), 0.0, -float(s))]
    return out + [("ahead", float(a), float(a), 0.0) for a in ahead]


def evaluate_offsets(scene, log, views, shifts: Sequence[float], ahead: Sequence[float], downscale: int, out: Path,
                     backend: str = "auto", write_images: bool = True, progress: bool = True, repair=None,
                     holdout_every: int = 8) -> dict:
    """Renders ``scene`` at each held-out view, moved sideways by every shift (both sides) and, from the last
    held-out frame, ahead by every distance, against the synthetic street's exact images. Returns
    {"unshifted": {...}, "lane_shift": [{shift_m, ...}], "ahead": [{ahead_m, ...}], "edge_frames": [...]} (both
    sides together; unshifted: the held-out views themselves, measured the same way; edge_frames: the held-out
    frames outside the training frames' time span, the scene's edges, left out of unshifted and lane_shift), each
    with:

    - ``views``: the views a vehicle could have (`drivable`) and ``views_left_out``: the others (a camera inside or
      against a parked car or a tree); ``psnr``, ``ssim`` and ``low_alpha_fraction`` over the drivable views,
      ``psnr_all`` and ``ssim_all`` over every view;
    - ``depth_absrel`` and ``depth_within_5pct``: the rendered depth against the exact depth on surface pixels;
    - ``regions`` and ``geometry``: each pixel class's share of the pixels and of the squared error, and its PSNR
      (`error_split`: sky / far / road / near; depth right / wrong / never seen by a training camera; the lane
      markings, the objects' edges and what the training views saw only coarser across them);
    - ``lidar`` (not ahead): the scene's sweeps from the moved LiDAR against the street's exact ones
      (`shifted_sweeps`).

    Side-by-side images (render | truth | error) go to out/offsets/ (a left-out view's name ends in _blocked).
    ``repair``: a repairer (`gsim.diffusion.open_repairer`); the repaired renders are measured too
    (``repaired_psnr``, ``repaired_ssim``) and drawn after the render; one with ``repair_view`` (a repair model) is
    given the view, for references from the log's training views (``holdout_every``: which frames those are)."""
    from gsim.io import to_uint8, write_png
    from gsim.images import error_map, image_metrics, render_image, repaired
    from gsim.resident import Renderer
    from .error_split import Coverage, Split
    from ..reconstruction.views import split_frames
    street, options = street_of(log)
    train = split_frames(log, holdout_every)[0]
    coverage = Coverage.of(log, street, train)
    last = max(v.frame for v in views)
    # a held-out frame before the first training frame or after the last is the scene's edge: what it sees beside
    # the path no training camera saw (frame 0 of the demo street: 7-18% of its pixels), an extrapolation, not a
    # view off the path
    span = (min(f.timestamp_us for f in train), max(f.timestamp_us for f in train)) if train else (0, -1)
    inside = {v.frame for v in views if span[0] < v.timestamp_us < span[1]}
    moves = [("unshifted", 0.0, 0.0, 0.0)] + offsets(shifts, ahead)
    jobs = [(k, d, dx, dy, v) for k, d, dx, dy in moves for v in views
            if (v.frame == last if k == "ahead" else v.frame in inside)]
    if progress:
        from tqdm import tqdm
        jobs = tqdm(jobs, desc="off the path", unit="view")
    rows, splits = {}, {}
    renderer = Renderer(scene, backend)
    for kind, dist, dx, dy, v in jobs:
        T_vehicle = log.T_world_vehicle(v.timestamp_us) @ vehicle_offset(dx, dy)
        T = T_vehicle @ log.cameras[v.sensor].T_vehicle_camera
        rgb, alpha, depth = render_image(renderer, v.camera, scene.log_pose(T, v.timestamp_us), v.timestamp_us,
                                         v.sensor)
        gt = truth(street, options, log, v.sensor, T, v.timestamp_us, downscale)
        hits = synth.camera_hits(street, v.camera, T, v.timestamp_us)
        ok = drivable(street, T_vehicle, v.timestamp_us, hits)
        m = {**image_metrics(rgb, gt), "low_alpha_fraction": float(np.mean(alpha < 0.5)), "drivable": ok}
        shown = [rgb]
        if repair is not None and kind != "unshifted":  # (evaluate repairs the held-out views themselves)
            fixed = repaired(repair, renderer, log, v.camera, T, v.timestamp_us, rgb, alpha, depth, sensor=v.sensor,
                             holdout_every=holdout_every, downscale=downscale)
            m.update({f"repaired_{k}": x for k, x in image_metrics(fixed, gt).items()})
            shown.append(fixed)
        rows.setdefault((kind, dist), []).append(m)
        if ok:
            splits.setdefault((kind, dist), Split()).add(
                rgb, alpha, depth, gt, hits, coverage.coarseness(hits, v.camera, T, v.timestamp_us))
        if write_images:
            name = f"{kind}_{dx:+.1f}_{dy:+.1f}_{v.frame:06d}_{v.sensor}{'' if ok else '_blocked'}.png"
            write_png(out / "offsets" / name,
                      np.concatenate([to_uint8(x) for x in shown] + [to_uint8(gt), error_map(shown[-1], gt)], 1))
    result = {"unshifted": [], "lane_shift": [], "ahead": []}
    for (kind, dist), ms in rows.items():
        valid = [m for m in ms if m["drivable"]]
        keys = [k for k in ms[0] if k != "drivable"]
        mean = lambda group, k: float(np.mean([m[k] for m in group])) if group else float("nan")  # noqa: E731
        result[kind].append({"ahead_m" if kind == "ahead" else "shift_m": dist, "views": len(valid),
                             "views_left_out": len(ms) - len(valid), **{k: mean(valid, k) for k in keys},
                             "psnr_all": mean(ms, "psnr"), "ssim_all": mean(ms, "ssim"),
                             **(splits[(kind, dist)].summary() if (kind, dist) in splits else {})})
    held, lidar = [f for f in log.frames if f.index in inside], {}
    for kind, dist, dx, dy in moves:
        if kind != "ahead":
            lidar.setdefault((kind, dist), []).append(shifted_sweeps(scene, log, street, held, dy))
    for (kind, dist), sides in lidar.items():
        sides = [s for s in sides if s]
        n = sum(s["sweeps"] for s in sides)
        if sides:
            row = next(r for r in result[kind] if r["shift_m"] == dist)
            row["lidar"] = {"sweeps": n, "sweeps_left_out": sum(s["sweeps_left_out"] for s in sides),
                            **{k: float(sum(s[k] * s["sweeps"] for s in sides if s["sweeps"]) / n) if n
                               else float("nan") for k in LIDAR_KEYS}}
    result["unshifted"] = result["unshifted"][0] if result["unshifted"] else {}
    result["edge_frames"] = sorted({v.frame for v in views} - inside)
    return result


def offpath_table(metrics: dict) -> str:
    """Markdown: a row per offset of `evaluate_offsets`' result (the unshifted held-out views first): PSNR over the
    drivable views and over all, SSIM, the depth against the exact depth, and each pixel class as
    "pixel share / error share / PSNR"."""
    from .error_split import DETAIL, GEOMETRY, REGIONS
    rows = [("held out", metrics["unshifted"])] * bool(metrics["unshifted"]) \
        + [(f"{r['shift_m']:g} m aside", r) for r in metrics["lane_shift"]] \
        + [(f"{r['ahead_m']:g} m ahead", r) for r in metrics["ahead"]]
    classes = [(g, k) for g, keys in (("regions", REGIONS), ("geometry", GEOMETRY), ("detail", DETAIL)) for k in keys]
    head = ("| view | views (left out) | PSNR dB | all views | SSIM | depth AbsRel | within 5% | "
            + " | ".join(f"{k}: px / err / dB" for _, k in classes) + " | LiDAR range median / Chamfer m, drop acc. |")
    out = [head, "|" + "---|" * (8 + len(classes))]
    for name, r in rows:
        cells = [f"{r[g][k]['pixel_share']:.0%} / {r[g][k]['error_share']:.0%} / "
                 + ("-" if r[g][k]["psnr"] is None else f"{r[g][k]['psnr']:.1f}") if g in r else "-"
                 for g, k in classes]
        depth = (f"{r['depth_absrel']:.3f} | {r['depth_within_5pct']:.0%}" if "depth_absrel" in r else "- | -")
        li = r.get("lidar")
        sweep = (f"{li['range_median_abs_m']:.3f} / {li['chamfer_m']:.3f}, {li['ray_drop_accuracy']:.3f} "
                 f"({li['sweeps']} sweeps)" if li and li["sweeps"] else "-")
        out.append(f"| {name} | {r['views']} ({r['views_left_out']}) | {r['psnr']:.2f} | {r['psnr_all']:.2f} | "
                   f"{r['ssim']:.4f} | {depth} | " + " | ".join(cells) + f" | {sweep} |")
    edges = metrics.get("edge_frames")
    note = f"\nHeld-out frames {edges} lie outside the training frames' span (the scene's edges): not shifted.\n"
    return "\n".join(out) + "\n" + (note if edges else "")
