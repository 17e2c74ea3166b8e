"""A log's geometry drawn on its own images: LiDAR points (coloured by range) and actor boxes (wireframes) projected
through the log's calibration and poses. The quickest check that a converted log is right: points sit on the
objects that reflected them, boxes on the objects they label (`gsim overlay`)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np

from gsim.boxes import edge_points
from gsim.errors import InputError
from gsim.scenes.log import CameraObs, DrivingLog, LidarObs
from gsim.transforms import interpolate_poses, invert, transform_each

# an actor is drawn this close outside its track's times, at its nearest pose: datasets annotate at the LiDAR's
# time and cameras fire a little before or after it (nuScenes up to 45 ms, Lyft up to 103 ms)
TRACK_MARGIN_US = 150_000


def sweep_in_world(log: DrivingLog, obs: LidarObs, points: Optional[np.ndarray] = None) -> np.ndarray:
    """(N,3) world points of a sweep (or of ``points``, same layout): each point through the ego pose at its own
    time where the sweep has per-point time offsets (a rolling sweep), else at the sweep's timestamp."""
    p = log.sweep(obs) if points is None else points
    xyz = p[:, :3].astype(np.float64)
    T_vl = log.lidars[obs.sensor].T_vehicle_lidar
    if p.shape[1] == 5:
        T = interpolate_poses(log.ego_timestamps_us, log.ego_poses, obs.timestamp_us + p[:, 4].astype(np.int64))
        return transform_each(T @ T_vl, xyz)
    T = log.T_world_lidar(obs)
    return xyz @ T[:3, :3].T + T[:3, 3]


def in_camera(log: DrivingLog, obs: CameraObs, world: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """World points seen by a log camera: ((N,2) pixels, (N,) inside the image and valid, (N,3) camera-frame)."""
    cam = log.cameras[obs.sensor].camera
    T = invert(log.T_world_camera(obs))
    pc = world @ T[:3, :3].T + T[:3, 3]
    uv, ok = cam.project(pc)
    inside = ok & (uv[:, 0] >= 0) & (uv[:, 0] < cam.width) & (uv[:, 1] >= 0) & (uv[:, 1] < cam.height)
    return uv, inside, pc


def range_colours(r: np.ndarray, near: float = 2.0, far: float = 50.0) -> np.ndarray:
    """(N,3) uint8: red near, green, blue far."""
    t = np.clip((r - near) / (far - near), 0, 1)[:, None]
    return (255 * np.hstack([1 - t, 1 - np.abs(2 * t - 1), t])).astype(np.uint8)


def draw_dots(img: np.ndarray, uv: np.ndarray, colours: np.ndarray, size: int) -> None:
    """Paint (N,2) pixel positions into ``img`` (H,W,3) uint8 in place as ``size`` x ``size`` squares of their
    ``colours`` (N,3), clipped at the border: points that stay visible at any image size."""
    ij = np.floor(uv).astype(int)
    for di in range(size):
        for dj in range(size):
            img[np.clip(ij[:, 1] + di, 0, img.shape[0] - 1), np.clip(ij[:, 0] + dj, 0, img.shape[1] - 1)] = colours


def draw_overlay(log: DrivingLog, frame_index: int, camera: str, lidars: Optional[Sequence[str]] = None,
                 boxes: bool = True) -> np.ndarray:
    """(H,W,3) uint8: the frame's image of ``camera`` with the frame's sweeps (``lidars``, default all) as dots
    and the actors present at the image's time (within TRACK_MARGIN_US of their tracks) as wireframes (yellow,
    through the camera's own lens model)."""
    from PIL import Image, ImageDraw
    if not 0 <= frame_index < len(log.frames):
        raise InputError(f"{log.root}: frame {frame_index} out of range (the log has {len(log.frames)} frames)")
    frame = log.frames[frame_index]
    if camera not in frame.cameras:
        raise InputError(f"{log.root}: frame {frame_index} has no image of camera {camera!r} "
                         f"(it has {sorted(frame.cameras)})")
    obs = frame.cameras[camera]
    img = (log.image(obs) * 255 + 0.5).astype(np.uint8)
    dot = max(1, img.shape[1] // 800)
    for name in frame.lidars if lidars is None else lidars:
        if name not in frame.lidars:
            raise InputError(f"{log.root}: frame {frame_index} has no sweep of LiDAR {name!r} "
                             f"(it has {sorted(frame.lidars)})")
        uv, inside, pc = in_camera(log, obs, sweep_in_world(log, frame.lidars[name]))
        draw_dots(img, uv[inside], range_colours(np.linalg.norm(pc[inside], axis=1)), dot + 1)
    pil = Image.fromarray(img)
    if boxes:
        draw = ImageDraw.Draw(pil)
        t = obs.timestamp_us
        for a in log.actors:
            if not a.timestamps_us[0] - TRACK_MARGIN_US <= t <= a.timestamps_us[-1] + TRACK_MARGIN_US:
                continue
            n = 24
            uv, inside, pc = in_camera(log, obs, edge_points(a.pose_at(t), a.size, n))
            ok = (pc[:, 2] > 0.1) & inside
            for e in range(12):  # one polyline per edge, broken where a sample leaves the image
                s = slice(e * n, (e + 1) * n)
                for k in range(n - 1):
                    if ok[s][k] and ok[s][k + 1]:
                        draw.line([tuple(uv[s][k]), tuple(uv[s][k + 1])], fill=(255, 230, 0), width=dot + 1)
    return np.asarray(pil)


def write_overlay(log: DrivingLog, frame_index: int, camera: str, out: Path, **kw) -> Path:
    from gsim.io import write_png
    out = Path(out)
    write_png(out, draw_overlay(log, frame_index, camera, **kw))
    return out
