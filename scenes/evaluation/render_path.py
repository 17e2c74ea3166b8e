"""Render trajectories from a log's camera (`gsim trajectory`, and the demo's shifted-path video).

A path follows one camera of the log, frame by frame, optionally shifted sideways in the vehicle
frame (y left): T_world_camera' = T_world_vehicle @ Translate(0, shift_m, 0) @ T_vehicle_camera.
At zero shift the poses are the log's own camera poses, so renders along the path are the
views the log's images were taken from.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from gsim.errors import InputError
from gsim.trajectory import Trajectory

from ..log import DrivingLog
from ..reconstruction.views import split_frames

FRAME_SETS = ("all", "train", "holdout")


def path_camera(log: DrivingLog, sensor: Optional[str] = None) -> str:
    """``sensor`` checked against the log's cameras; None picks "front" when the log has it, else the first."""
    if not log.cameras:
        raise InputError(f"{log.root}: the log has no cameras")
    if sensor is None:
        sensor = "front" if "front" in log.cameras else sorted(log.cameras)[0]
    if sensor not in log.cameras:
        raise InputError(f"{log.root}: no camera {sensor!r}; the log's cameras are {sorted(log.cameras)}")
    return sensor


def camera_path(log: DrivingLog, sensor: Optional[str] = None, shift_m: float = 0.0, frames: str = "all",
                every: int = 1, holdout_every: int = 8, downscale: int = 1, scene=None) -> Trajectory:
    """The trajectory of the log camera ``sensor`` (see `path_camera`) moved ``shift_m`` metres to the
    vehicle's left (negative: right), with the camera's own model (intrinsics divided by ``downscale``).

    ``frames`` is "all", "train" or "holdout" (the split of `scenes.reconstruction.views.split_frames` with
    ``holdout_every``), of which every ``every``-th is kept. A frame without an image of the camera
    takes the frame's timestamp. ``scene``: a reconstruction of the log whose training refined its poses
    (`Scene.pose_corrections`): the path is where that scene puts the camera (`Scene.log_pose`), so that a
    zero shift renders the log's views as evaluation does."""
    sensor = path_camera(log, sensor)
    if frames not in FRAME_SETS:
        raise InputError(f"camera_path: frames must be one of {FRAME_SETS}, got {frames!r}")
    if every < 1:
        raise InputError(f"camera_path: every must be >= 1, got {every}")
    chosen = log.frames if frames == "all" else split_frames(log, holdout_every)[frames == "holdout"]
    chosen = chosen[::every]
    if not chosen:
        raise InputError(f"{log.root}: no {frames} frames (held out: frame index % {holdout_every} == 0)")
    times = np.array([f.cameras[sensor].timestamp_us if sensor in f.cameras else f.timestamp_us for f in chosen],
                     dtype=np.int64)
    poses = np.stack([offset_pose(log, sensor, int(t), left_m=shift_m) for t in times])
    if scene is not None:
        poses = scene.log_pose(poses, times)
    return Trajectory(log.cameras[sensor].camera.downscaled(downscale), times, poses)


def vehicle_offset(ahead_m: float = 0.0, left_m: float = 0.0) -> np.ndarray:
    """(4,4): the vehicle moved ``ahead_m`` forward and ``left_m`` to its left, in its own frame (T_vehicle_moved)."""
    offset = np.eye(4)
    offset[:2, 3] = ahead_m, left_m
    return offset


def offset_pose(log: DrivingLog, sensor: str, timestamp_us: int, ahead_m: float = 0.0, left_m: float = 0.0) -> np.ndarray:
    """T_world_camera of the log camera ``sensor`` at ``timestamp_us`` with the vehicle moved ``ahead_m``
    forward and ``left_m`` to its left, in its own frame."""
    return log.T_world_vehicle(timestamp_us) @ vehicle_offset(ahead_m, left_m) @ log.cameras[sensor].T_vehicle_camera
