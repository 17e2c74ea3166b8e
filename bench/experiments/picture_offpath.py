"""The README's off-path picture: (a) the reconstruction, (b) its render repaired, (c) the expanded scene and the
exact image, for held-out views of a synthetic street shifted sideways, one row per side.

Usage: python bench/experiments/picture_offpath.py --scene RECON/scene --expanded EXPANDED/scene --log LOG
       --out PICTURE.png (--paste-references | --repair MODEL_DIR) [--shift 3] [--frame N] [--sensor front]
--frame: a held-out frame index (default: the middle held-out frame). Prints each panel's PSNR."""
from __future__ import annotations

import argparse
import sys

import numpy as np

from gsim.diffusion import open_repairer
from gsim.images import psnr, render_image, repaired
from gsim.io import to_uint8, write_png
from gsim.scene import load_scene
from gsim.scenes.evaluation.lane_shift import street_of, truth
from gsim.scenes.log import load_log
from gsim.scenes.evaluation.render_path import offset_pose
from gsim.scenes.reconstruction.views import split_frames


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scene", required=True)
    ap.add_argument("--expanded", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--paste-references", action="store_true")
    ap.add_argument("--repair", default=None)
    ap.add_argument("--shift", type=float, default=3.0)
    ap.add_argument("--frame", type=int, default=None)
    ap.add_argument("--sensor", default="front")
    args = ap.parse_args()
    scene, expanded, log = load_scene(args.scene), load_scene(args.expanded), load_log(args.log)
    repair = open_repairer(args.repair, paste=args.paste_references)
    if repair is None:
        ap.error("give --paste-references or --repair MODEL_DIR")
    street, options = street_of(log)
    held = split_frames(log)[1]
    frame = held[len(held) // 2] if args.frame is None else next(f for f in held if f.index == args.frame)
    obs = frame.cameras[args.sensor]
    downscale = scene.train_downscale or 1
    camera = log.cameras[args.sensor].camera.downscaled(downscale)
    rows = []
    for left in (args.shift, -args.shift):
        T = offset_pose(log, args.sensor, obs.timestamp_us, 0.0, left)
        rgb, alpha, depth = render_image(scene, camera, scene.log_pose(T, obs.timestamp_us), obs.timestamp_us,
                                         args.sensor)
        fixed = repaired(repair, scene, log, camera, T, obs.timestamp_us, rgb, alpha, depth, sensor=args.sensor,
                         downscale=downscale)
        grown = render_image(expanded, camera, expanded.log_pose(T, obs.timestamp_us), obs.timestamp_us,
                             args.sensor)[0]
        exact = truth(street, options, log, args.sensor, T, obs.timestamp_us, downscale)
        print(f"{left:+g} m: (a) {psnr(rgb, exact):.2f} (b) {psnr(fixed, exact):.2f} (c) {psnr(grown, exact):.2f} dB")
        rows.append(np.concatenate([to_uint8(x) for x in (rgb, fixed, grown, exact)], 1))
    write_png(args.out, np.concatenate(rows, 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
