"""Moving-object detection benchmark: the synthetic street with its tracks withheld, against its own tracks.

Synthesizes the street (seed 0) with and without actor tracks, finds the movers in the training frames of
the unannotated log (as `gsim reconstruct` does), and scores every frame (held-out ones too: the tracks
reach them by interpolation) where a moving car is within --radius metres: the best box IoU of a found
track with the car's true box. Writes OUT/movers.json and per frame OUT/bev/NNNNNN.png (found boxes green,
true boxes blue, ignored points red), and prints the share of frames with IoU >= 0.5.
The reconstruction with and without tracks: bench_reconstruct.py --log OUT/street and OUT/street-no-tracks.

Usage: python bench/bench_movers.py [--out out/bench/movers] [--radius 30]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from gsim.io import write_json, write_png
from gsim.scenes.log import load_log
from gsim.boxes import box_iou
from gsim.scenes.reconstruction.movers import birds_eye_boxes, detect_movers
from gsim.scenes.synth import SynthOptions, synthesize
from gsim.scenes.reconstruction.views import split_frames


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/bench/movers")
    ap.add_argument("--radius", type=float, default=30.0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    truth = load_log(synthesize(out / "street", seed=0))
    bare = load_log(synthesize(out / "street-no-tracks", seed=0, options=SynthOptions(tracks=False)))
    train, _ = split_frames(bare)
    t0 = time.perf_counter()
    found = detect_movers(bare, train, progress=True)
    detect_s = time.perf_counter() - t0
    moving = [a for a in truth.actors if np.linalg.norm(a.poses[-1, :3, 3] - a.poses[0, :3, 3]) > 1.0]
    rows = []
    for f in truth.frames:
        obs = next(iter(f.lidars.values()))
        t = obs.timestamp_us
        ego = truth.T_world_vehicle(t)[:2, 3]
        boxes = [(a.pose_at(t), a.size, (90, 140, 255), "") for a in moving]
        boxes += [(tr.pose_at(t), tr.size, (80, 255, 80), tr.id[-3:]) for tr in found.tracks
                  if tr.timestamps_us[0] <= t <= tr.timestamps_us[-1]]
        for a in moving:
            dist = float(np.linalg.norm(a.pose_at(t)[:2, 3] - ego))
            if dist <= args.radius:
                iou = max([box_iou(a.pose_at(t), a.size, tr.pose_at(t), tr.size) for tr in found.tracks], default=0.0)
                rows.append({"frame": f.index, "car": a.id, "distance_m": round(dist, 2), "iou": round(iou, 4),
                             "held_out": f not in train})
        write_png(out / "bev" / f"{f.index:06d}.png",
                  birds_eye_boxes(bare, obs, boxes, found.ignored))
    ious = np.array([r["iou"] for r in rows])
    result = {"frames_scored": len(rows), "iou_at_least_0.5": float(np.mean(ious >= 0.5)) if len(rows) else None,
              "median_iou": float(np.median(ious)) if len(rows) else None, "detect_s": round(detect_s, 2),
              "movers": found.summary(), "per_frame": rows}
    write_json(out / "movers.json", result)
    print(f"moving cars within {args.radius:g} m: {len(rows)} car-frames, IoU >= 0.5 in "
          f"{100 * result['iou_at_least_0.5']:.1f}%, median IoU {result['median_iou']:.3f}; "
          f"{len(found.tracks)} tracks, detection {detect_s:.1f} s")
    return result


if __name__ == "__main__":
    main()
