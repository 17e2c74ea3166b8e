"""Boxes that stand upright (yaw, optionally tilted poses): footprints and overlaps.

A box pose is T_world_box at the box's centre (actors' tracks in logs), sizes are (l, w, h) metres.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np


def footprint(pose: np.ndarray, size) -> np.ndarray:
    """(4,2) world xy corners of a box's footprint, counter-clockwise."""
    l, w = size[0] / 2, size[1] / 2
    c = np.array([[l, w], [-l, w], [-l, -w], [l, -w]])
    return c @ pose[:2, :2].T + pose[:2, 3]


def corners(pose: np.ndarray, size) -> np.ndarray:
    """(8,3) world corners of a box; corner 4 ix + 2 iy + iz is at (+-l/2, +-w/2, +-h/2), minus where the bit is 0."""
    l, w, h = size
    c = np.array([[sx * l / 2, sy * w / 2, sz * h / 2] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
    return c @ pose[:3, :3].T + pose[:3, 3]


def edge_points(pose: np.ndarray, size, n: int = 32) -> np.ndarray:
    """(12 n, 3) world points along a box's 12 edges (n per edge, ends included): corners joined where one bit
    of their `corners` index differs. Projected through a camera model they draw the box's wireframe, curved
    where the lens is."""
    c = corners(pose, size)
    t = np.linspace(0.0, 1.0, n)[:, None]
    return np.concatenate([c[i] + t * (c[i | b] - c[i]) for b in (4, 2, 1) for i in range(8) if not i & b])


def _clip(poly: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The part of a convex polygon left of the directed line a -> b (Sutherland-Hodgman, one edge)."""
    side = lambda p: (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0])
    out = []
    for i in range(len(poly)):
        p, q = poly[i], poly[(i + 1) % len(poly)]
        sp, sq = side(p), side(q)
        if sp >= 0:
            out.append(p)
        if sp * sq < 0:
            out.append(p + (q - p) * sp / (sp - sq))
    return np.array(out).reshape(-1, 2)


def area(poly: np.ndarray) -> float:
    """Area of a simple polygon (K,2)."""
    if len(poly) < 3:
        return 0.0
    x, y = poly[:, 0], poly[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def overlap(pose_a: np.ndarray, size_a, pose_b: np.ndarray, size_b) -> Tuple[float, float]:
    """(footprint area shared m^2, height range shared m) of two upright boxes; (0, 0) when their
    heights do not meet. Poses T_world_box (box centre), sizes (l, w, h) metres."""
    za, zb = pose_a[2, 3], pose_b[2, 3]
    dz = min(za + size_a[2] / 2, zb + size_b[2] / 2) - max(za - size_a[2] / 2, zb - size_b[2] / 2)
    if dz <= 0:
        return 0.0, 0.0
    return footprint_overlap(footprint(pose_a, size_a), footprint(pose_b, size_b)), float(dz)


def box_iou(pose_a: np.ndarray, size_a, pose_b: np.ndarray, size_b) -> float:
    """3D IoU of two boxes that stand upright (yaw only): footprint overlap (convex clipping) times
    height overlap, over the union. Poses T_world_box (box centre), sizes (l, w, h) metres."""
    shared, dz = overlap(pose_a, size_a, pose_b, size_b)
    if dz <= 0:
        return 0.0
    v = shared * dz
    union = np.prod(size_a) + np.prod(size_b) - v
    return float(v / union) if union > 0 else 0.0


def footprint_overlap(rect_a: np.ndarray, rect_b: np.ndarray) -> float:
    """Area (m^2) shared by two convex counter-clockwise footprints (K,2)."""
    inter = rect_a
    for i in range(len(rect_b)):
        inter = _clip(inter, rect_b[i], rect_b[(i + 1) % len(rect_b)])
        if len(inter) == 0:
            return 0.0
    return area(inter)
