"""Which training pixels see the sky, found from the log itself (no segmentation model).

Three facts of a log tell the sky: (1) the sky's colour depends on the viewing direction alone, so from every
camera position along the drive the same world direction shows it the same, where a surface at a finite
distance drifts across directions as the camera moves; (2) a LiDAR ray well above the horizon
(`SkyOptions.seed_elevation_deg`) that returns nothing met no surface within the sensor's range; (3) the sky is smooth, and bounded by edges where structure begins.
A pixel is sky when it lies above the highest LiDAR return of its column (the LiDAR saw nothing there), its
colour agrees with its direction's median over the training views and the agreeing views stand at least
`SkyOptions.baseline_m` apart (1), and it belongs to a smooth region (no colour step above
`SkyOptions.step`) that holds a direction an empty LiDAR ray looked along (2, 3) or, in later rounds, one that
another view's sky region holds: so the sky found below the LiDAR's top beam reaches the sky above it. A uniform
facade band passes (1) (seen along a parallel drive it looks the same from everywhere) but not (2, 3). A log
whose cameras never move `baseline_m`, or whose LiDAR has no beam model (no empty rays) or no beam that high
(KITTI's HDL-64E: +2 degrees), gets no masks and trains as without them.

The trainer uses the masks twice: the initialisation seeds no surfels on sky pixels (its above-LiDAR seeds put
them at the wall depth: a shell of sky-coloured surfels at 27-57 m that slides over far buildings from a
shifted view), and an opacity term keeps surfels out of them, so that the sky model owns the sky.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np


@dataclass(frozen=True)
class SkyOptions:
    bin_deg: float = 0.5  # world-direction bins (azimuth x elevation) whose colours are compared across views
    tolerance: float = 0.05  # mean absolute RGB difference (in [0,1]) from the direction's median that still agrees
    baseline_m: float = 3.0  # the agreeing views' camera centres must span at least this
    margin_px: int = 2  # columns either side whose highest LiDAR return also bounds a column's candidates
    step: float = 0.04  # mean absolute RGB difference between neighbouring pixels that ends a smooth region
    rounds: int = 3  # passes of sky directions from view to view
    seed_elevation_deg: float = 5.0  # empty LiDAR rays at least this far above the horizon seed the sky (nearer the
    # horizon an empty ray often meets structure beyond the sensor's range: KITTI's trees and bridge past 120 m)


@dataclass(frozen=True)
class SkyPixels:
    """The training views' sky masks by (frame index, camera), at the training ``downscale``."""

    masks: Dict[Tuple[int, str], np.ndarray]
    downscale: int = 1

    def full_size(self, frame: int, sensor: str, height: int, width: int) -> Optional[np.ndarray]:
        """(height, width) bool: the mask of that view at the log image's own size (a pixel takes the mask of
        the downscaled pixel it falls in; the cropped edge is not sky), or None without one."""
        m = self.masks.get((frame, sensor))
        if m is None:
            return None
        up = np.repeat(np.repeat(m > 0, self.downscale, 0), self.downscale, 1)
        out = np.zeros((height, width), bool)
        out[:up.shape[0], :up.shape[1]] = up[:height, :width]
        return out


def _median_by_key(key: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """(n, C) per-key median (the upper one of an even count) of (N, C) values; keys without values get NaN."""
    out = np.full((n, values.shape[1]), np.nan, np.float32)
    count = np.bincount(key, minlength=n)
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    has = count > 0
    for c in range(values.shape[1]):
        order = np.lexsort((values[:, c], key))
        out[has, c] = values[order[start[has] + count[has] // 2], c]
    return out


def _bins(dirs: np.ndarray, bin_deg: float) -> np.ndarray:
    """(N,) int64 azimuth x elevation bin of (N,3) world directions."""
    n_az, n_el = int(round(360 / bin_deg)), int(round(180 / bin_deg))
    d = dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
    az = np.floor((np.degrees(np.arctan2(d[:, 1], d[:, 0])) + 180) / bin_deg).astype(np.int64) % n_az
    el = np.clip(np.floor((np.degrees(np.arcsin(np.clip(d[:, 2], -1, 1))) + 90) / bin_deg), 0, n_el - 1)
    return el.astype(np.int64) * n_az + az


def empty_directions(log, frames, min_elevation_deg: float = SkyOptions.seed_elevation_deg) -> np.ndarray:
    """(N,3) world directions of the frames' LiDAR rays at least ``min_elevation_deg`` above the horizon that
    returned nothing (cells of the beam grid without a point; none without a beam model)."""
    from .lidar_rays import sweep_rays
    out = [np.zeros((0, 3))]
    for f in frames:
        for obs in f.lidars.values():
            r = sweep_rays(log, obs)
            empty = r.range == 0
            if empty.any():
                d = np.einsum("nij,nj->ni", r.poses(log)[empty][:, :3, :3], r.dirs[empty])
                out.append(d[d[:, 2] > np.sin(np.radians(min_elevation_deg))])
    return np.concatenate(out)


def _smooth_regions(image: np.ndarray, allowed: np.ndarray, step: float) -> np.ndarray:
    """(H,W) int labels (0: none) of the 4-connected regions of ``allowed`` pixels without a colour step above
    ``step`` to any neighbour inside them."""
    from scipy import ndimage
    dx = np.abs(np.diff(image, axis=1)).mean(-1) > step
    dy = np.abs(np.diff(image, axis=0)).mean(-1) > step
    edge = np.zeros(allowed.shape, bool)
    edge[:, 1:] |= dx
    edge[:, :-1] |= dx
    edge[1:] |= dy
    edge[:-1] |= dy
    return ndimage.label(allowed & ~edge)[0]


def sky_masks(views: Sequence, empty_dirs: np.ndarray, opt: SkyOptions = SkyOptions()) -> List[Optional[np.ndarray]]:
    """Per view (`views.View`: image, dirs_world, lidar_pix, T_world_camera), its (H,W) float32 sky mask (1: sky);
    None for every view when the cameras' centres span less than ``opt.baseline_m`` or there are no
    ``empty_dirs`` (`empty_directions`) to start from."""
    centres = np.stack([v.T_world_camera[:3, 3] for v in views]) if len(views) else np.zeros((0, 3))
    if len(views) == 0 or len(empty_dirs) == 0 or np.linalg.norm(centres.max(0) - centres.min(0)) < opt.baseline_m:
        return [None] * len(views)
    keys, colours, owner, where = [], [], [], []
    for i, v in enumerate(views):
        cand = ~v.lidar_covered(2 * opt.margin_px + 1) & np.isfinite(v.dirs_world).all(-1)
        keys.append(_bins(v.dirs_world[cand].astype(np.float64), opt.bin_deg))
        colours.append(v.image[cand])
        owner.append(np.full(int(cand.sum()), i, np.int64))
        where.append(np.flatnonzero(cand))
    key, rgb, own = np.concatenate(keys), np.concatenate(colours).astype(np.float32), np.concatenate(owner)
    uniq, key = np.unique(key, return_inverse=True)
    median = _median_by_key(key, rgb, len(uniq))
    agree = np.abs(rgb - median[key]).mean(1) <= opt.tolerance
    lo = np.full((len(uniq), 3), np.inf)
    hi = np.full((len(uniq), 3), -np.inf)
    np.minimum.at(lo, key[agree], centres[own[agree]])
    np.maximum.at(hi, key[agree], centres[own[agree]])
    span = np.linalg.norm(np.where(np.isfinite(hi - lo), hi - lo, 0.0), axis=1)
    steady = agree & (span >= opt.baseline_m)[key]  # (1): the direction's colour, not a surface's
    known = np.isin(uniq, _bins(empty_dirs, opt.bin_deg))  # (2): directions an empty LiDAR ray looked along
    cuts = np.cumsum([0] + [len(w) for w in where])
    regions = []
    for v, w, a, b in zip(views, where, cuts[:-1], cuts[1:]):
        allowed = np.zeros(v.camera.height * v.camera.width, bool)
        allowed[w] = steady[a:b]
        labels = _smooth_regions(v.image, allowed.reshape(v.camera.height, v.camera.width), opt.step).reshape(-1)
        regions.append(labels[w])
    sky = np.zeros(len(key), bool)
    for _ in range(opt.rounds):
        for lab, a, b in zip(regions, cuts[:-1], cuts[1:]):
            seeded = np.unique(lab[(lab > 0) & known[key[a:b]]])
            sky[a:b] = np.isin(lab, seeded) & (lab > 0)
        known[key[sky]] = True  # (3): a sky region's directions seed the other views' regions
    out = []
    for v, w, a, b in zip(views, where, cuts[:-1], cuts[1:]):
        m = np.zeros(v.camera.height * v.camera.width, np.float32)
        m[w] = sky[a:b]
        out.append(m.reshape(v.camera.height, v.camera.width))
    return out
