"""Training and evaluation views of a driving log: images, poses, ray directions and LiDAR depth.

A view is one camera image with what the losses and metrics need: its pose at the image's
timestamp, its world ray directions (for the sky) and the LiDAR points of the same frame
projected into it (sparse depth, occluded points removed). The split holds out every
``holdout_every``-th frame (frame index % n == 0, the field's convention); the trainer
never sees anything of a held-out frame, images or LiDAR.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

import numpy as np

from gsim.appearance import camera_ray_directions
from gsim.cameras import Camera, downscale_image
from gsim.errors import InputError
from gsim.transforms import interpolate_poses, transform_each

from ..log import DrivingLog, Frame, LidarObs


@dataclass(frozen=True, eq=False)
class View:
    frame: int
    sensor: str
    timestamp_us: int
    camera: Camera
    T_world_camera: np.ndarray
    image: np.ndarray  # (H,W,3) float32
    dirs_world: np.ndarray  # (H,W,3) float32 unit ray directions
    lidar_pix: np.ndarray  # (M,) int64 flat pixel indices
    lidar_depth: np.ndarray  # (M,) float32 camera z, metres
    mask: Optional[np.ndarray] = None  # (H,W) float32, 0 where transients (Ignored points) were seen; None: all 1
    sky: Optional[np.ndarray] = None  # (H,W) float32, 1 where the view sees the sky (`sky_mask`); None: not known
    # True for a pseudo view (`gsim.diffusion.expand`): T_world_camera is already where the scene puts the camera,
    # so no view pose correction applies, and none is learnt from an image that was not taken there
    pose_corrected: bool = False

    def lidar_covered(self, window: int = 9) -> np.ndarray:
        """(H,W) bool: pixels at or below the highest LiDAR point of their column (the lowest such row
        over ``window`` columns around): where the sweeps saw what the camera sees. Above it is what the
        initialisation could only guess (facades, crowns, a truck's top), not an untracked mover."""
        H, W = self.camera.height, self.camera.width
        top = np.full(W, H, np.int64)
        np.minimum.at(top, self.lidar_pix % W, self.lidar_pix // W)
        top = np.lib.stride_tricks.sliding_window_view(np.pad(top, window // 2, constant_values=H), window).min(1)
        return np.arange(H)[:, None] >= top[None, :]


Ignored = Mapping[str, np.ndarray]  # sweep file (LidarObs.points) -> (N,) bool: its points to leave out


def ignored_points(ignored: Ignored, obs: LidarObs, n: int) -> np.ndarray:
    """(n,) bool: the points of this sweep that the losses and the initialisation leave out."""
    m = ignored.get(obs.points)
    if m is None:
        return np.zeros(n, bool)
    if len(m) != n:
        raise ValueError(f"{obs.points}: the ignore mask has {len(m)} entries for {n} points")
    return m


def split_frames(log: DrivingLog, holdout_every: int = 8) -> Tuple[List[Frame], List[Frame]]:
    """(train, held-out) frames; holdout_every=0 trains on everything."""
    if holdout_every < 0 or holdout_every == 1:
        raise InputError(f"holdout_every must be 0 (no hold-out) or >= 2, got {holdout_every}")
    held = [f for f in log.frames if holdout_every and f.index % holdout_every == 0]
    train = [f for f in log.frames if not (holdout_every and f.index % holdout_every == 0)]
    return train, held


def sweep_world(log: DrivingLog, obs: LidarObs) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A sweep's points in the world: (M,3) points, (M,3) sensor origins, (M,) intensity, (M,) int64
    time of each point (us).

    With per-point time offsets each point is placed with the ego pose at its own time."""
    pts = log.sweep(obs)
    T_vl = log.lidars[obs.sensor].T_vehicle_lidar
    offsets = pts[:, 4].astype(np.int64) if pts.shape[1] == 5 else np.zeros(len(pts), np.int64)
    times, inv = np.unique(obs.timestamp_us + offsets, return_inverse=True)
    T = (interpolate_poses(log.ego_timestamps_us, log.ego_poses, times) @ T_vl)[inv]
    world = transform_each(T, pts[:, :3].astype(np.float64))
    return world, T[:, :3, 3], pts[:, 3], times[inv]


CLIP_M = 0.3  # a surface whose highest point is within this of the top beam may reach above it


def top_beam_tan(log: DrivingLog, obs: LidarObs) -> Optional[float]:
    """The tangent of the sweep's highest beam elevation, or None when the LiDAR's beams are unknown."""
    beams = log.lidars[obs.sensor].beams
    return None if beams is None else float(np.tan(np.radians(max(beams.elevations_deg))))


def lidar_reach(log: DrivingLog) -> Optional[float]:
    """The farthest range (m) any of the log's LiDARs returns from, or None when no beam model says."""
    ranges = [s.beams.max_range_m for s in log.lidars.values() if s.beams is not None]
    return max(ranges) if ranges else None


def above_top_beam(top_tan: float, points: np.ndarray, origins: np.ndarray) -> np.ndarray:
    """Height (m) of world points above the highest beam at their horizontal range from their sensor
    origins (a level LiDAR). Near zero: a surface whose top the LiDAR may have cut off."""
    rho = np.linalg.norm(points[:, :2] - origins[:, :2], axis=1)
    return points[:, 2] - (origins[:, 2] + rho * top_tan)


def in_image(camera: Camera, T_world_camera: np.ndarray, world: np.ndarray):
    """(uv (N,2) pixels, (N,) bool: projects inside the image, (N,3) camera-frame points)."""
    Tcw = np.linalg.inv(T_world_camera)
    pc = world @ Tcw[:3, :3].T + Tcw[:3, 3]
    uv, ok = camera.project(pc)
    ok &= (uv[:, 0] >= 0) & (uv[:, 0] < camera.width) & (uv[:, 1] >= 0) & (uv[:, 1] < camera.height)
    return uv, ok, pc


def visible_points(camera: Camera, T_world_camera: np.ndarray, world: np.ndarray, block: int = 4,
                   tolerance: float = 0.05):
    """Points of ``world`` that the camera sees: (indices, flat pixel, camera z).

    A point is kept when it projects into the image and lies within ``tolerance`` (relative)
    of the nearest point in its ``block``-pixel cell: LiDAR points hidden from the camera by
    parallax (behind a nearer surface) are dropped."""
    uv, ok, pc = in_image(camera, T_world_camera, world)
    idx = np.nonzero(ok)[0]
    u, v, z = uv[idx, 0].astype(np.int64), uv[idx, 1].astype(np.int64), pc[idx, 2]
    cell = (v // block) * (camera.width // block + 1) + u // block
    zmin = np.full(cell.max() + 1 if len(cell) else 1, np.inf)
    np.minimum.at(zmin, cell, z)
    keep = z <= zmin[cell] * (1 + tolerance)
    return idx[keep], (v * camera.width + u)[keep], z[keep].astype(np.float32)


def transient_mask(camera: Camera, T_world_camera: np.ndarray, world: np.ndarray,
                   dilate_deg: float = 1.0) -> Optional[np.ndarray]:
    """(H,W) float32 mask, 0 around the projections of ``world`` (transient points), 1 elsewhere; None when
    none projects. The dots are dilated by ``dilate_deg`` of view (LiDAR rings are ~0.4 deg apart on an
    HDL-64E, and a moving object's edges lie between its points)."""
    if len(world) == 0:
        return None
    uv, ok, _ = in_image(camera, T_world_camera, world)
    if not ok.any():
        return None
    hit = np.zeros((camera.height, camera.width), bool)
    hit[uv[ok, 1].astype(np.int64), uv[ok, 0].astype(np.int64)] = True
    from scipy.ndimage import binary_dilation
    r = max(1, int(np.ceil(camera.fx * np.radians(dilate_deg))))
    yy, xx = np.mgrid[-r:r + 1, -r:r + 1]
    return (~binary_dilation(hit, xx * xx + yy * yy <= r * r)).astype(np.float32)


def make_views(log: DrivingLog, frames: Sequence[Frame], downscale: int = 1, progress: bool = False,
               ignored: Ignored = {}) -> List[View]:
    """All camera views of ``frames`` (images box-averaged by ``downscale``) with LiDAR depth from
    the same frames' sweeps. Points in ``ignored`` (transients) give no depth; where they project the
    view's ``mask`` is 0."""
    items = [(f, obs) for f in frames for obs in f.cameras.values()]
    if progress:
        from tqdm import tqdm
        items = tqdm(items, desc="load views", unit="image")
    sweeps = {}
    views = []
    for f, obs in items:
        if f.index not in sweeps:
            parts = [sweep_world(log, o)[0] for o in f.lidars.values()]
            world = np.concatenate(parts) if parts else np.zeros((0, 3))
            skip = np.concatenate([ignored_points(ignored, o, len(p)) for o, p in zip(f.lidars.values(), parts)]
                                  ) if parts else np.zeros(0, bool)
            sweeps = {f.index: (world[~skip], world[skip])}
        static, transient = sweeps[f.index]
        cam = log.cameras[obs.sensor].camera.downscaled(downscale)
        T = log.T_world_camera(obs)
        _, pix, z = visible_points(cam, T, static)
        views.append(View(f.index, obs.sensor, obs.timestamp_us, cam, T, downscale_image(log.image(obs), downscale),
                          camera_ray_directions(cam, T), pix, z, transient_mask(cam, T, transient)))
    return views
