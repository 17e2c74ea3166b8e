"""The road of a closed-loop run in gsim's world frame: lane corridors (for drivable-area checks) and the
route the ego is asked to follow (for progress and completion).

A lane is a corridor: the points within half its width of its centre polyline. The route is a polyline
with an arc-length parameter s (metres); the run's route starts at s0 (where the ego starts) and ends at
s1 (the end of the driven path, not the network's extension past it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np
from gsim.errors import InputError


class Polyline:
    """A 2D polyline (N,2) with arc length: projection, points and headings at arc length s."""

    def __init__(self, xy, where: str = "polyline"):
        xy = np.asarray(xy, np.float64)
        if xy.ndim != 2 or xy.shape[1] != 2 or len(xy) < 2 or not np.all(np.isfinite(xy)):
            raise InputError(f"{where}: expected a finite (N,2) polyline with N >= 2, got shape {xy.shape}")
        seg = np.linalg.norm(np.diff(xy, axis=0), axis=1)
        keep = np.r_[True, seg > 1e-9]  # repeated points make zero-length segments
        self.xy = xy[keep]
        if len(self.xy) < 2:
            raise InputError(f"{where}: all points coincide")
        d = np.diff(self.xy, axis=0)
        self.seg_len = np.linalg.norm(d, axis=1)
        self.dirs = d / self.seg_len[:, None]
        self.s = np.r_[0.0, np.cumsum(self.seg_len)]

    @property
    def length(self) -> float:
        return float(self.s[-1])

    def project(self, p) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For points (M,2): arc length of the nearest point on the polyline (M,), signed lateral offset
        (M,) (left of the direction of travel positive) and distance (M,) to it."""
        p = np.atleast_2d(np.asarray(p, np.float64))
        rel = p[:, None, :] - self.xy[None, :-1, :]  # (M, S, 2)
        t = np.clip(np.einsum("msk,sk->ms", rel, self.dirs), 0.0, self.seg_len[None])
        foot = self.xy[None, :-1, :] + t[..., None] * self.dirs[None]
        dist = np.linalg.norm(p[:, None, :] - foot, axis=2)
        k = np.argmin(dist, axis=1)
        m = np.arange(len(p))
        r = rel[m, k]
        lateral = self.dirs[k, 0] * r[:, 1] - self.dirs[k, 1] * r[:, 0]
        return self.s[k] + t[m, k], lateral, dist[m, k]

    def at(self, s) -> Tuple[np.ndarray, np.ndarray]:
        """Points (M,2) and headings (M,) rad at arc lengths s (clamped to the polyline)."""
        s = np.clip(np.atleast_1d(np.asarray(s, np.float64)), 0.0, self.length)
        k = np.clip(np.searchsorted(self.s, s, side="right") - 1, 0, len(self.seg_len) - 1)
        pts = self.xy[k] + (s - self.s[k])[:, None] * self.dirs[k]
        return pts, np.arctan2(self.dirs[k, 1], self.dirs[k, 0])


@dataclass(frozen=True, eq=False)
class Lane:
    id: str
    centre: Polyline
    width_m: float


@dataclass(frozen=True, eq=False)
class Road:
    """Lanes (the drivable area) and the route, with the run's route span [s0, s1] m."""

    lanes: Tuple[Lane, ...]
    route: Polyline
    s0: float
    s1: float

    @staticmethod
    def build(lanes: Sequence[Tuple[str, np.ndarray, float]], route_xy, start_xy, end_xy) -> "Road":
        """From (lane id, centre polyline (M,2), width m) triples, the route polyline and the world x-y
        where the run starts and where its route ends."""
        route = Polyline(route_xy, "route")
        s0 = float(route.project(start_xy)[0][0])
        s1 = float(route.project(end_xy)[0][0])
        if not s1 > s0:
            raise InputError(f"route: its end (s = {s1:.1f} m) is not ahead of the start (s = {s0:.1f} m)")
        # a junction between two edges of a straight road is a lane of zero length: nothing to drive on
        lanes = [(i, c, w) for i, c, w in lanes if np.ptp(np.asarray(c, float), axis=0).max() > 1e-6]
        return Road(tuple(Lane(i, Polyline(c, f"lane {i}"), float(w)) for i, c, w in lanes), route, s0, s1)

    @property
    def length_m(self) -> float:
        return self.s1 - self.s0

    def on_road(self, points) -> np.ndarray:
        """(M,) bool: each world x-y point lies in some lane's corridor (2 cm of slack for rounding)."""
        p = np.atleast_2d(np.asarray(points, np.float64))
        inside = np.zeros(len(p), bool)
        for lane in self.lanes:
            inside |= lane.centre.project(p)[2] <= lane.width_m / 2 + 0.02
        return inside

    def progress(self, xy) -> float:
        """Arc length along the route from the run's start, m (negative behind it)."""
        return float(self.route.project(xy)[0][0]) - self.s0

    def ahead(self, xy, yaw: float, distance_m: float, step_m: float = 1.0) -> np.ndarray:
        """(K,2) route points from the point nearest ``xy`` on for ``distance_m``, in the frame of a
        vehicle at ``xy`` with heading ``yaw`` (x forward, y left)."""
        s = self.route.project(xy)[0][0] + np.arange(0.0, distance_m + 1e-9, step_m)
        pts = self.route.at(s)[0] - np.asarray(xy, np.float64)
        c, si = np.cos(yaw), np.sin(yaw)
        return np.c_[c * pts[:, 0] + si * pts[:, 1], -si * pts[:, 0] + c * pts[:, 1]]

