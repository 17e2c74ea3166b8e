"""Dense depth for any camera from a driving log's LiDAR: what the log measured, not what a reconstruction learnt.

`LidarDepth` gathers the training frames' sweeps once: a point inside a tracked actor's box at its own time goes to
that actor, in its box frame; the rest are the static world, thinned on a voxel grid. For a camera at a pose and a
time, the static points and every actor's points (placed by its track at that time) are projected; a point more
than `HIDDEN` (relative) behind the nearest point around it is hidden (the LiDAR saw it from elsewhere, through a gap
the camera does not have) and dropped; between the rest the depth is interpolated linearly in inverse depth over
their triangulation in the image (exact across a plane seen by a pinhole camera), up to ``max_gap_deg`` from the
nearest point. Beyond that, in the sky and above the highest beam the depth is 0: unknown.

Used where a reconstruction's own depth would repeat its errors: warping real images into views off the driven
path (`gsim.diffusion.references`)."""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Optional, Sequence

import numpy as np

from gsim.cameras import Camera
from gsim.errors import InputError
from gsim.transforms import check_pose

from .init import points_in_box, voxel_keys
from ..log import DrivingLog, Frame
from .views import in_image, split_frames, sweep_world

HIDDEN = 0.05  # relative: a point this much farther than the nearest one around it is behind a nearer surface
BOX_MARGIN_M = 0.3  # a point this near a tracked actor's box is not static (the boxes are a little tight)
CACHE = 64  # depth maps kept (a source view is asked for again by every target near it)


class LidarDepth:
    """The depth maps of ``log``'s LiDAR (see the module docstring). ``frames``: the sweeps used (default: the
    training frames, every ``holdout_every``-th held out as the trainer does); ``voxel_m``: the static points'
    thinning; ``block_deg``: the cells (degrees of view) whose 3x3 neighbourhood decides what is hidden;
    ``max_gap_deg``: the farthest a pixel may be from a projected point and get a depth."""

    def __init__(self, log: DrivingLog, frames: Optional[Sequence[Frame]] = None, holdout_every: int = 8,
                 voxel_m: float = 0.05, block_deg: float = 0.5, max_gap_deg: float = 1.5):
        for name, v in (("voxel_m", voxel_m), ("block_deg", block_deg), ("max_gap_deg", max_gap_deg)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"{name}: expected a finite number > 0, got {v!r}")
        frames = split_frames(log, holdout_every)[0] if frames is None else list(frames)
        sweeps = [o for f in frames for o in f.lidars.values()]
        if not sweeps:
            raise InputError(f"{log.root}: no LiDAR sweeps in the frames used ({len(frames)} frames): LiDAR depth "
                             f"needs a log with LiDAR")
        self.log, self.block_deg, self.max_gap_deg = log, float(block_deg), float(max_gap_deg)
        static, local = [], {a.id: [] for a in log.actors}
        for obs in sweeps:
            world, _, _, t = sweep_world(log, obs)
            free = np.ones(len(world), bool)
            for a in log.actors:
                inside, box, _ = points_in_box(a, world, t, BOX_MARGIN_M)
                free &= ~inside
                on = np.all(np.abs(box) <= np.asarray(a.size) / 2, axis=1)  # the actor's own: the box, no margin
                local[a.id].append(box[on])
            static.append(world[free])
        static = np.concatenate(static)
        self.static = static[np.sort(np.unique(voxel_keys(static, voxel_m), return_index=True)[1])]
        self.actors = [(a, np.concatenate(local[a.id])) for a in log.actors if sum(map(len, local[a.id]))]
        self._cache: "OrderedDict[tuple, np.ndarray]" = OrderedDict()

    def points_at(self, timestamp_us: int) -> np.ndarray:
        """(N,3) world points at ``timestamp_us``: the static ones and each actor's placed by its track."""
        parts = [self.static]
        for a, pts in self.actors:
            T = a.pose_at(int(timestamp_us))
            parts.append(pts @ T[:3, :3].T + T[:3, 3])
        return np.concatenate(parts)

    def __call__(self, camera: Camera, T_world_camera: np.ndarray, timestamp_us: int) -> np.ndarray:
        """(H,W) float32 camera z (m) of ``camera`` at the log pose ``T_world_camera`` (OpenCV camera -> world) at
        ``timestamp_us``; 0 where the LiDAR gives none."""
        if not isinstance(camera, Camera):
            raise InputError(f"camera: expected a gsim Camera, got {type(camera).__name__}")
        T = check_pose(T_world_camera, "T_world_camera")
        key = (repr(camera), T.tobytes(), int(timestamp_us))
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        depth = self._depth(camera, T, int(timestamp_us))
        self._cache[key] = depth
        if len(self._cache) > CACHE:
            self._cache.popitem(last=False)
        return depth

    def _depth(self, camera: Camera, T: np.ndarray, t: int) -> np.ndarray:
        from scipy.interpolate import LinearNDInterpolator
        from scipy.ndimage import distance_transform_edt, minimum_filter
        from scipy.spatial import QhullError
        H, W = camera.height, camera.width
        uv, ok, pc = in_image(camera, T, self.points_at(t))
        ok &= pc[:, 2] > 1e-3
        uv, z = uv[ok], pc[ok, 2]
        depth = np.zeros((H, W), np.float32)
        if len(z) < 3:
            return depth
        px_per_deg = camera.fx * math.tan(math.radians(1.0))
        block = max(1, int(round(self.block_deg * px_per_deg)))
        Hc, Wc = H // block + 1, W // block + 1
        cell = (uv[:, 1].astype(np.int64) // block) * Wc + uv[:, 0].astype(np.int64) // block
        near = np.full(Hc * Wc, np.inf)
        np.minimum.at(near, cell, z)
        near = minimum_filter(near.reshape(Hc, Wc), size=3, mode="nearest").ravel()
        seen = np.flatnonzero(z <= near[cell] * (1 + HIDDEN))
        pixel = uv[seen, 1].astype(np.int64) * W + uv[seen, 0].astype(np.int64)
        order = np.lexsort((z[seen], pixel))  # the nearest point of each pixel is enough to triangulate
        first = np.flatnonzero(np.r_[True, np.diff(pixel[order]) != 0])
        seen = seen[order[first]]
        uv, z = uv[seen], z[seen]
        hit = np.zeros((H, W), bool)
        hit[uv[:, 1].astype(np.int64), uv[:, 0].astype(np.int64)] = True
        close = distance_transform_edt(~hit) <= self.max_gap_deg * px_per_deg
        yy, xx = np.nonzero(close)
        try:
            inv = LinearNDInterpolator(uv, 1.0 / z)(np.stack([xx + 0.5, yy + 0.5], 1))
        except QhullError:  # all points on a line: no triangle to interpolate in
            return depth
        good = np.isfinite(inv) & (inv > 0)
        depth[yy[good], xx[good]] = 1.0 / inv[good]
        return depth
