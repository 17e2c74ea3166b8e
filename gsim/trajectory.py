"""Camera trajectory files: one camera model and a list of timed poses (JSON).

    {"schema_version": 1,
     "camera": {"model": "pinhole", "width": 640, "height": 360, "fx": ..., ...},
     "frames": [{"timestamp_us": 0, "T_world_camera": [[...4 rows...]]}, ...]}

T_world_camera maps OpenCV camera points (x right, y down, z forward) to world points.
`gsim render` reads these files; `gsim street` writes one, `gsim trajectory` makes one from a log's camera.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cameras import Camera, camera_from_dict
from .errors import InputError
from .io import read_manifest, write_json
from .transforms import check_pose

SCHEMA_VERSION = 1


@dataclass(frozen=True, eq=False)
class Trajectory:
    """One camera model rendered at timed poses (an actor-bearing scene is placed at each timestamp)."""

    camera: Camera
    timestamps_us: np.ndarray  # (n,) int64, non-decreasing
    poses: np.ndarray  # (n,4,4) float64 T_world_camera

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "camera": self.camera.to_dict(),
                "frames": [{"timestamp_us": int(t), "T_world_camera": T.tolist()}
                           for t, T in zip(self.timestamps_us, self.poses)]}

    def save(self, path) -> None:
        write_json(path, self.to_dict())


def load_timed_poses(path, pose_key: str, what: str = "trajectory"):
    """(the file's dict, timestamps_us (n,) int64, poses (n,4,4)) of a JSON file with
    ``schema_version`` 1 and ``frames`` [{"timestamp_us": int, pose_key: 4x4}]; errors name the file
    and the field."""
    path = Path(path)
    d = read_manifest(path, what, (SCHEMA_VERSION,))
    frames = d.get("frames")
    if not isinstance(frames, list) or not frames:
        raise InputError(f"{path}: field 'frames' must be a non-empty list")
    ts, poses = [], []
    for i, f in enumerate(frames):
        where = f"{path}: frames[{i}]"
        if not isinstance(f, dict) or not isinstance(f.get("timestamp_us"), int) or isinstance(f.get("timestamp_us"), bool):
            raise InputError(f"{where}.timestamp_us: expected an integer (microseconds)")
        try:
            T = np.asarray(f.get(pose_key), dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError(f"{where}.{pose_key}: expected a 4x4 array of numbers") from None
        poses.append(check_pose(T, f"{where}.{pose_key}"))
        ts.append(f["timestamp_us"])
    ts = np.asarray(ts, dtype=np.int64)
    if np.any(np.diff(ts) < 0):
        raise InputError(f"{path}: frames' timestamp_us must not decrease")
    return d, ts, np.stack(poses)


def load_trajectory(path) -> Trajectory:
    """Read and validate a camera trajectory file; errors name the file and the field."""
    d, ts, poses = load_timed_poses(path, "T_world_camera")
    return Trajectory(camera_from_dict(d.get("camera"), f"{path}: camera"), ts, poses)
