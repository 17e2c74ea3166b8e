"""`gsim convert rosbag` on the KITTI raw sample laid out as a car's recorder writes it (`tests/kitti_bag.py`: JPEG
CompressedImage + CameraInfo, PointCloud2 as the head saw it with ring and per-point time, tf_static, Odometry).

Usage: python bench/bench_rosbag.py OUT [--frames 40] [--storage mcap] [--repeats 3] [--images jpeg|png]
Writes OUT/kitti (the KITTI converter's log), OUT/bag, OUT/bag_log (the last conversion) and prints one JSON line:
the conversion's median seconds and frames/s. Reconstruct both logs with `bench/bench_reconstruct.py --log` to
compare their held-out PSNR (issue 61 asks for 0.3 dB).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gsim.scenes.formats.kitti_raw import convert_kitti_raw  # noqa: E402
from gsim.scenes.formats.rosbag import convert_rosbag  # noqa: E402
from gsim.scenes.log import validate_log  # noqa: E402

KITTI = Path(__file__).resolve().parents[2] / "shared" / "data" / "kitti_raw" / "2011_09_26"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--storage", default="mcap", choices=("rosbag1", "sqlite3", "mcap"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--images", default="jpeg", choices=("jpeg", "png"),
                    help="CompressedImage format: jpeg (quality 95, as camera drivers) or png (lossless)")
    a = ap.parse_args(argv)
    from kitti_bag import kitti_messages
    from rosbag_writer import write_bag
    a.out.mkdir(parents=True, exist_ok=True)
    ref = validate_log(convert_kitti_raw(KITTI, a.out / "kitti", max_frames=a.frames, progress=False))
    bag = a.out / ("bag.bag" if a.storage == "rosbag1" else "bag")
    shutil.rmtree(bag, ignore_errors=True)
    bag.unlink(missing_ok=True)
    write_bag(bag, a.storage, kitti_messages(ref, image_format=a.images))
    seconds = []
    for _ in range(a.repeats):
        shutil.rmtree(a.out / "bag_log", ignore_errors=True)
        t0 = time.perf_counter()
        convert_rosbag(bag, a.out / "bag_log", progress=False)
        seconds.append(time.perf_counter() - t0)
    med = statistics.median(seconds)
    row = {"frames": len(ref.frames), "storage": a.storage, "images": a.images, "seconds": [round(s, 3) for s in seconds],
           "median_s": round(med, 3), "frames_per_s": round(len(ref.frames) / med, 1)}
    print(json.dumps(row))
    return row


if __name__ == "__main__":
    main()
