"""Reference-conditioned repair's inputs, measured: the log's real training images warped into the held-out views
(0 m) and into them shifted sideways (`gsim eval --shifts`' views and shifts), pasted over the render where valid,
against the synthetic street's exact images.

Usage: python bench/bench_references.py [--scene out37/s7/recon/scene] [--log out37/s7/log] --out PICTURE.png
       [--shifts 1,2,3] [--k 2] [--depth render|lidar|exact] [--downscale N] [--holdout-every 8]
       [--depth-tolerance 0.05] [--backend auto]
--depth: where the warps' depths come from: the reconstruction's renders, the log's LiDAR (`LidarDepth`), or the
synthetic street's exact depth (the target's ray cast, the sources' from the log's depth maps: the upper bound no
real log has).
Per shift (both sides averaged): PSNR / SSIM of (a) the render and of the render with the k nearest training
images' warped pixels pasted where valid, (b) the nearest valid one's, (c) the mean of the valid ones, (d) where
two agree (`agreement`); the valid and agreed fractions; PSNR of the render and of the nearest warped pixel on the
valid pixels alone; the time per view of `references` (the sources' depths and the warps) and of the warps alone.
Prints a table and one JSON line; the picture: render | composite (b) | truth | valid mask, at the largest shift,
one row per side and camera of the middle held-out frame."""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import gsim.diffusion.references as refs_module
from gsim.cameras import downscale_image
from gsim.diffusion.references import SOLID_ALPHA, agreement, nearest_training_views, references, solid_depth
from gsim.images import image_metrics, psnr, render_image
from gsim.io import to_uint8, write_png
from gsim.resident import Renderer
from gsim.scene import load_scene
from gsim.scenes import synth
from gsim.scenes.evaluation.lane_shift import offsets, street_of
from gsim.scenes.reconstruction.lidar_depth import LidarDepth
from gsim.scenes.log import load_log
from gsim.scenes.evaluation.render_path import offset_pose
from gsim.scenes.reconstruction.views import make_views, split_frames


def composites(rgb: np.ndarray, found: list) -> tuple:
    """(nearest, mean, any valid): the render with, where valid, the nearest reference's pixel or the mean of the
    valid references' pixels (``found``: [(warped, valid)], nearest first)."""
    nearest, taken = rgb.copy(), np.zeros(rgb.shape[:2], bool)
    total, count = np.zeros_like(rgb), np.zeros(rgb.shape[:2])
    for warped, valid in found:
        nearest[valid & ~taken] = warped[valid & ~taken]
        taken |= valid
        total += warped * valid[..., None]
        count += valid
    mean = np.where(taken[..., None], total / np.maximum(count, 1)[..., None], rgb)
    return nearest, mean, taken


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scene", default="/work/out37/s7/recon/scene")
    ap.add_argument("--log", default="/work/out37/s7/log", help="the synthetic street log the scene was made from")
    ap.add_argument("--out", required=True, help="the picture (PNG)")
    ap.add_argument("--shifts", default="1,2,3")
    ap.add_argument("--k", type=int, default=2, help="references per view")
    ap.add_argument("--depth", choices=("render", "lidar", "exact"), default="render")
    ap.add_argument("--downscale", type=int, default=None, help="default: the scene's training downscale")
    ap.add_argument("--holdout-every", type=int, default=8)
    ap.add_argument("--depth-tolerance", type=float, default=refs_module.DEPTH_TOLERANCE)
    ap.add_argument("--backend", default="auto")
    args = ap.parse_args()
    scene, log = load_scene(args.scene), load_log(args.log)
    street, options = street_of(log)
    downscale = args.downscale or scene.train_downscale or 1
    views = make_views(log, split_frames(log, args.holdout_every)[1], downscale)
    shifts = [float(s) for s in args.shifts.split(",")]
    jobs = [("held_out", 0.0, 0.0, 0.0)] + offsets(shifts, ())
    shown_frame = sorted({v.frame for v in views})[len({v.frame for v in views}) // 2]
    renderer = Renderer(scene, args.backend)
    lidar = LidarDepth(log, holdout_every=args.holdout_every) if args.depth == "lidar" else None

    def exact(camera, T, t, sensor):
        """The street's image and exact depth from a log pose, box-averaged / subsampled to ``camera``'s scale."""
        rgb, depth = synth.render_camera(street, log.cameras[sensor].camera, T, t, options.supersample)
        return downscale_image(rgb.astype(np.float32) / 255.0, downscale), depth[::downscale, ::downscale]

    def exact_references(camera, T, t, sensor):
        out = []
        for _, obs in nearest_training_views(log, T, t, args.k, sensor, args.holdout_every):
            src = log.cameras[obs.sensor].camera.downscaled(downscale)
            out.append(refs_module.warp(downscale_image(log.image(obs), downscale),
                                        log.depth(obs)[::downscale, ::downscale], src, log.T_world_camera(obs),
                                        exact(camera, T, t, sensor)[1], camera, T, args.depth_tolerance))
        return out

    warp_s = [0.0]
    warp = refs_module.warp

    def timed_warp(*a, **kw):
        t = time.perf_counter()
        out = warp(*a, **kw)
        warp_s[0] += time.perf_counter() - t
        return out

    refs_module.warp = timed_warp  # (references looks warp up in its module: the warps alone are timed)
    rows, picture, t_refs, n = {}, [], 0.0, 0
    for kind, dist, dx, dy in jobs:
        for v in views:
            T = offset_pose(log, v.sensor, v.timestamp_us, dx, dy)
            rgb, alpha, depth = render_image(renderer, v.camera, scene.log_pose(T, v.timestamp_us), v.timestamp_us,
                                             v.sensor)
            gt = v.image if kind == "held_out" else exact(v.camera, T, v.timestamp_us, v.sensor)[0]
            t = time.perf_counter()
            if args.depth == "exact":
                found = exact_references(v.camera, T, v.timestamp_us, v.sensor)
            else:
                found = references(renderer, log, v.camera, T, v.timestamp_us, args.k, v.sensor, args.holdout_every,
                                   downscale, target_depth=None if lidar else solid_depth(alpha, depth),
                                   depth_tolerance=args.depth_tolerance, lidar=lidar)
            t_refs += time.perf_counter() - t
            n += 1
            nearest, mean, valid = composites(rgb, found)
            colour, agreed = agreement(found) if len(found) > 1 else (rgb, np.zeros(rgb.shape[:2], bool))
            first = found[0][1]
            m = {"render": image_metrics(rgb, gt), "nearest": image_metrics(nearest, gt),
                 "mean": image_metrics(mean, gt), "agreed": image_metrics(np.where(agreed[..., None], colour, rgb), gt),
                 "agreed_fraction": float(agreed.mean()), "valid": float(valid.mean()),
                 "valid_nearest": float(first.mean()),
                 "low_alpha": float((alpha < SOLID_ALPHA).mean()),
                 "render_psnr_on_valid": psnr(rgb[valid], gt[valid]) if valid.any() else float("nan"),
                 "composite_psnr_on_valid": psnr(nearest[valid], gt[valid]) if valid.any() else float("nan")}
            rows.setdefault(dist, []).append(m)
            if dist == max(shifts) and v.frame == shown_frame:
                mask = np.repeat(valid[..., None].astype(np.float32), 3, -1)
                picture.append(np.concatenate([to_uint8(x) for x in (rgb, nearest, gt, mask)], 1))
    refs_module.warp = warp
    table = {}
    for dist, ms in rows.items():
        mean_of = lambda f: float(np.nanmean([f(m) for m in ms]))  # noqa: E731
        table[f"{dist:g}"] = {
            "views": len(ms), **{f"{c}_{k}": mean_of(lambda m: m[c][k]) for c in ("render", "nearest", "mean",
                                                                                   "agreed") for k in ("psnr", "ssim")},
            **{k: mean_of(lambda m: m[k]) for k in ("valid", "valid_nearest", "agreed_fraction", "low_alpha",
                                                     "render_psnr_on_valid", "composite_psnr_on_valid")}}
    write_png(args.out, np.concatenate(picture, 0))
    print("| shift | views | render PSNR / SSIM | + nearest ref | + mean of refs | + where two agree | valid | "
          "valid (nearest) | agreed | PSNR on valid: render / ref |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d, r in table.items():
        where = "0 m (held-out)" if d == "0" else f"{d} m"
        print(f"| {where} | {r['views']} | " + " | ".join(f"{r[c + '_psnr']:.2f} / {r[c + '_ssim']:.3f}"
                                                      for c in ("render", "nearest", "mean", "agreed"))
              + f" | {r['valid']:.3f} | {r['valid_nearest']:.3f} | {r['agreed_fraction']:.3f} | "
                f"{r['render_psnr_on_valid']:.2f} / "
                f"{r['composite_psnr_on_valid']:.2f} |")
    cam = views[0].camera
    result = {"scene": args.scene, "log": args.log, "k": args.k, "depth": args.depth, "downscale": downscale,
              "depth_tolerance": args.depth_tolerance, "image": [cam.width, cam.height], "table": table,
              "references_ms_per_view": round(1e3 * t_refs / n, 1), "warp_ms_per_view": round(1e3 * warp_s[0] / n, 1),
              "backend": renderer.backend}
    print(f"references {result['references_ms_per_view']} ms per view ({args.k} sources rendered and warped), of "
          f"which the warps {result['warp_ms_per_view']} ms; {cam.width}x{cam.height}, backend {renderer.backend}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
