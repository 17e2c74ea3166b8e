"""Rendered sweeps on disk, and LiDAR trajectory files.

Per sweep ``n`` (all written atomically):
    points/NNNNNN.npy    float32 (M,6): x, y, z (sensor frame, m), range (m), ring, time offset (us)
    points/NNNNNN.ply    binary little-endian PLY: x, y, z float32, ring uint16, time_offset_us int32
    points/NNNNNN.pcd    binary PCD v0.7 with the same fields (PCL, Open3D and ROS tools read it)
    points/NNNNNN.bin    KITTI velodyne layout: float32 x, y, z, intensity per point (only when the
                         scene has a LiDAR head: no made-up intensity column)
    range/NNNNNN.png     16-bit range image (row = laser index as in the spec, column = firing order):
                         metres x 256 (the KITTI depth convention), 0 = no return
With intensity, the .npy gains a 7th column and the .ply/.pcd an ``intensity`` field.

A LiDAR trajectory file (JSON) is a list of timed sensor poses:
    {"schema_version": 1, "frames": [{"timestamp_us": 0, "T_world_lidar": [[...4 rows...]]}, ...]}
"""
from __future__ import annotations

from pathlib import Path
from typing import Tuple

import numpy as np

from gsim.io import atomic_path, write_depth_png
from gsim.trajectory import load_timed_poses

FIELDS = (("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("ring", "<u2"), ("time_offset_us", "<i4"))
PLY_TYPES = {"<f4": ("float", "F", 4), "<u2": ("ushort", "U", 2), "<i4": ("int", "I", 4)}


def _records(frame) -> np.ndarray:
    fields = FIELDS + ((("intensity", "<f4"),) if frame.intensity is not None else ())
    rec = np.empty(len(frame.points), np.dtype(list(fields)))
    rec["x"], rec["y"], rec["z"] = frame.points.T
    rec["ring"], rec["time_offset_us"] = frame.ring, frame.time_offset_us
    if frame.intensity is not None:
        rec["intensity"] = frame.intensity
    return rec


def write_sweep(frame, out_dir, index: int) -> None:
    """Write one `LidarFrame` in every format above under ``out_dir``."""
    out, name = Path(out_dir), f"{index:06d}"
    cols = [frame.points, frame.ranges, frame.ring, frame.time_offset_us]
    if frame.intensity is not None:
        cols.append(frame.intensity)
        with atomic_path(out / "points" / f"{name}.bin") as tmp:
            tmp.write_bytes(np.column_stack([frame.points, frame.intensity]).astype("<f4").tobytes())
    with atomic_path(out / "points" / f"{name}.npy", suffix=".npy") as tmp:
        np.save(tmp, np.column_stack(cols).astype(np.float32))
    rec = _records(frame)
    names = rec.dtype.names
    types = [PLY_TYPES[rec.dtype[k].str] for k in names]
    ply = ("ply\nformat binary_little_endian 1.0\n" f"element vertex {len(rec)}\n"
           + "".join(f"property {t[0]} {k}\n" for k, t in zip(names, types)) + "end_header\n")
    with atomic_path(out / "points" / f"{name}.ply") as tmp:
        tmp.write_bytes(ply.encode() + rec.tobytes())
    pcd = ("# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\n"
           f"FIELDS {' '.join(names)}\nSIZE {' '.join(str(t[2]) for t in types)}\n"
           f"TYPE {' '.join(t[1] for t in types)}\nCOUNT {' '.join('1' for _ in names)}\n"
           f"WIDTH {len(rec)}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {len(rec)}\nDATA binary\n")
    with atomic_path(out / "points" / f"{name}.pcd") as tmp:
        tmp.write_bytes(pcd.encode() + rec.tobytes())
    write_depth_png(out / "range" / f"{name}.png", frame.range_image)


def load_lidar_trajectory(path) -> Tuple[np.ndarray, np.ndarray]:
    """(timestamps_us (n,) int64, T_world_lidar (n,4,4)); errors name the file and the field."""
    _, ts, poses = load_timed_poses(path, "T_world_lidar", "LiDAR trajectory")
    return ts, poses
