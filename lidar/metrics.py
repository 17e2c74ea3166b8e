"""LiDAR metrics (the ones SplatAD and NeuRAD report) and a bird's-eye image of sweeps.

`ray_metrics` compares a rendered sweep with the real one ray by ray (same rays: scenes.reconstruction.lidar_rays):
median and mean absolute range error and intensity RMSE over the rays where both return, ray-drop
accuracy over every ray (returned or not, the same in both), and the Chamfer distance between the
two point sets (mean nearest-neighbour distance each way, summed; exact, by a grid hash).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
from numba import njit, prange

CHAMFER_CELL_M = 0.5


@njit(parallel=True, cache=True)
def _nearest(query, ref, keys, starts, ends, cell):
    """Distance from each query point to its nearest ref point; ref sorted by its cell key; exact: the
    3x3x3 cells around a query hold every point within ``cell``, and a query without one is searched fully."""
    out = np.empty(query.shape[0])
    for i in prange(query.shape[0]):
        cx = int(math.floor(query[i, 0] / cell))
        cy = int(math.floor(query[i, 1] / cell))
        cz = int(math.floor(query[i, 2] / cell))
        best = np.inf
        for dx in range(-1, 2):
            for dy in range(-1, 2):
                for dz in range(-1, 2):
                    k = _key(cx + dx, cy + dy, cz + dz)
                    lo = np.searchsorted(keys, k)
                    if lo < keys.shape[0] and keys[lo] == k:
                        for j in range(starts[lo], ends[lo]):
                            d = ((query[i, 0] - ref[j, 0]) ** 2 + (query[i, 1] - ref[j, 1]) ** 2
                                 + (query[i, 2] - ref[j, 2]) ** 2)
                            best = min(best, d)
        if best > cell * cell:  # the nearest may lie beyond the neighbouring cells
            for j in range(ref.shape[0]):
                best = min(best, (query[i, 0] - ref[j, 0]) ** 2 + (query[i, 1] - ref[j, 1]) ** 2
                           + (query[i, 2] - ref[j, 2]) ** 2)
        out[i] = math.sqrt(best)
    return out


@njit(cache=True, inline="always")
def _key(x, y, z):
    return ((x + (1 << 20)) << 42) | ((y + (1 << 20)) << 21) | (z + (1 << 20))


def nearest_distances(query: np.ndarray, ref: np.ndarray, cell: float = CHAMFER_CELL_M) -> np.ndarray:
    """(Q,) exact distance (m) from each query point (Q,3) to its nearest point of ``ref`` (R,3), R >= 1."""
    ref = np.ascontiguousarray(ref, np.float64)
    c = np.floor(ref / cell).astype(np.int64) + (1 << 20)
    k = (c[:, 0] << 42) | (c[:, 1] << 21) | c[:, 2]
    order = np.argsort(k, kind="stable")
    keys, starts = np.unique(k[order], return_index=True)
    ends = np.append(starts[1:], len(order))
    return _nearest(np.ascontiguousarray(query, np.float64), ref[order], keys, starts, ends, float(cell))


def chamfer(a: np.ndarray, b: np.ndarray) -> float:
    """Mean nearest-neighbour distance from a to b plus from b to a (m); NaN if either is empty."""
    if len(a) == 0 or len(b) == 0:
        return float("nan")
    return float(nearest_distances(a, b).mean() + nearest_distances(b, a).mean())


def ray_metrics(rendered_range: np.ndarray, real_range: np.ndarray, dirs: np.ndarray,
                rendered_intensity: Optional[np.ndarray] = None, real_intensity: Optional[np.ndarray] = None,
                drop_labels: bool = True) -> dict:
    """Metrics of one sweep; ranges (R,) m with 0 = no return, dirs (R,3) sensor frame (points = dirs *
    range). ``drop_labels``: the real sweep's non-returns are rays (it has a beam grid), so ray-drop
    accuracy is defined."""
    both = (rendered_range > 0) & (real_range > 0)
    err = np.abs(rendered_range[both] - real_range[both])
    m = {"rays": int(len(real_range)), "both_return": int(both.sum()),
         "range_median_abs_m": float(np.median(err)) if len(err) else float("nan"),
         "range_mean_abs_m": float(err.mean()) if len(err) else float("nan"),
         "chamfer_m": chamfer(dirs[rendered_range > 0] * rendered_range[rendered_range > 0, None],
                              dirs[real_range > 0] * real_range[real_range > 0, None])}
    if drop_labels:
        m["ray_drop_accuracy"] = float(np.mean((rendered_range > 0) == (real_range > 0)))
    if rendered_intensity is not None and real_intensity is not None and both.any():
        m["intensity_rmse"] = float(np.sqrt(np.mean((rendered_intensity[both] - real_intensity[both]) ** 2)))
    return m


def birds_eye(points: np.ndarray, extent_m: float = 40.0, pixels: int = 400, color=(255, 255, 255)) -> np.ndarray:
    """(pixels, pixels, 3) uint8 top view of sensor-frame points (x up the image, y to the left), the sensor
    at the centre, +-extent_m shown, brightness by height (z from -3 m to +3 m)."""
    img = np.zeros((pixels, pixels, 3), np.uint8)
    s = pixels / (2 * extent_m)
    u = (pixels / 2 - points[:, 1] * s).astype(np.int64)
    v = (pixels / 2 - points[:, 0] * s).astype(np.int64)
    ok = (u >= 0) & (u < pixels) & (v >= 0) & (v < pixels)
    shade = np.clip((points[ok, 2] + 3.0) / 6.0, 0.25, 1.0)[:, None]
    img[v[ok], u[ok]] = (shade * np.asarray(color)).astype(np.uint8)
    return img
