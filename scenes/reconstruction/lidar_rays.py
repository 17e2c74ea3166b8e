"""A log's LiDAR sweeps as rays: what reconstruction fits and evaluation compares, ray by ray.

A sweep becomes one ray per point (its own direction in the sensor frame, its firing time, its range
and intensity). When the log gives the sensor's beam model (`LidarBeams`), the sweep is also laid on
the (beam, azimuth bin) grid, points to the cell of their nearest beam elevation and their azimuth,
and every empty cell becomes a dropped ray (range 0) along the cell's nominal direction, fired when
that azimuth bin's points were (interpolated over the bins that have points): the ray-drop labels.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from gsim.errors import InputError
from gsim.transforms import interpolate_poses

from ..log import DrivingLog, LidarObs

OPEN_FROM_DEG = 0.0  # the lowest elevation whose empty cells count as open space (`SweepRays.free`)


@dataclass(frozen=True, eq=False)
class SweepRays:
    """One sweep's rays: dirs (R,3) unit, sensor frame; times_us (R,) int64 firing times; range (R,) m
    (0 = no return); intensity (R,) float32 (0 for drops); ring, column (R,) grid cell or -1
    (no beam model); grid (lasers, columns) or None; T_vehicle_lidar (4,4)."""

    sensor: str
    timestamp_us: int
    dirs: np.ndarray
    times_us: np.ndarray
    range: np.ndarray
    intensity: np.ndarray
    ring: np.ndarray
    column: np.ndarray
    grid: Optional[tuple]
    T_vehicle_lidar: np.ndarray

    def subset(self, idx: np.ndarray) -> "SweepRays":
        return SweepRays(self.sensor, self.timestamp_us, self.dirs[idx], self.times_us[idx], self.range[idx],
                         self.intensity[idx], self.ring[idx], self.column[idx], self.grid, self.T_vehicle_lidar)

    def free(self, min_elevation_deg: float = OPEN_FROM_DEG) -> np.ndarray:
        """(R,) bool: the beam grid's empty cells at or above ``min_elevation_deg`` (sensor frame): up there an
        empty cell is open space to the range's end (sky, a street beyond reach); below it a ray that returns
        nothing more likely met a dark or wet surface (ray drop), so those are not counted."""
        return (self.range == 0) & (self.ring >= 0) & (self.dirs[:, 2] >= np.sin(np.radians(min_elevation_deg)))

    def poses(self, log: DrivingLog) -> np.ndarray:
        """(R,4,4) T_world_lidar at each ray's time."""
        return interpolate_poses(log.ego_timestamps_us, log.ego_poses, self.times_us) @ self.T_vehicle_lidar


def sweep_rays(log: DrivingLog, obs: LidarObs, ignore: Optional[np.ndarray] = None) -> SweepRays:
    """The sweep's rays; points where ``ignore`` (N,) is True (transients) give no ray, and their grid cells
    no drop label either (something was there)."""
    pts = log.sweep(obs)
    if ignore is not None and len(ignore) != len(pts):
        raise InputError(f"{obs.points}: the ignore mask has {len(ignore)} entries for {len(pts)} points")
    return points_rays(pts, obs.sensor, obs.timestamp_us, log.lidars[obs.sensor], ignore)


def points_rays(pts: np.ndarray, name: str, timestamp_us: int, sensor, ignore: Optional[np.ndarray] = None) -> SweepRays:
    """`sweep_rays` of a sweep's points ((N,4|5) as `DrivingLog.sweep` gives them) from the LiDAR ``sensor`` (its
    beams and T_vehicle_lidar) named ``name``, started at ``timestamp_us``."""
    xyz = pts[:, :3].astype(np.float64)
    rng = np.linalg.norm(xyz, axis=1)
    ok = rng > 1e-6
    skip = np.zeros(len(pts), bool) if ignore is None else np.asarray(ignore, bool)[ok]
    xyz, rng, pts = xyz[ok], rng[ok], pts[ok]
    dirs = xyz / rng[:, None]
    times = timestamp_us + (pts[:, 4].astype(np.int64) if pts.shape[1] == 5 else np.zeros(len(pts), np.int64))
    inten = pts[:, 3].astype(np.float32)
    beams = sensor.beams
    if beams is None:
        keep = ~skip
        minus = -np.ones(int(keep.sum()), np.int64)
        return SweepRays(name, timestamp_us, dirs[keep], times[keep], rng[keep].astype(np.float32),
                         inten[keep], minus, minus, None, sensor.T_vehicle_lidar)
    el_table = np.asarray(beams.elevations_deg)
    order = np.argsort(el_table)
    el = np.degrees(np.arcsin(np.clip(dirs[:, 2], -1, 1)))
    k = np.clip(np.searchsorted(el_table[order], el), 1, len(el_table) - 1)
    lo, hi = order[k - 1], order[k]
    ring = np.where(np.abs(el - el_table[lo]) <= np.abs(el - el_table[hi]), lo, hi)
    if len(el_table) == 1:
        ring = np.zeros(len(pts), np.int64)
    C = int(round(360.0 / beams.azimuth_resolution_deg))
    col = (np.floor((np.degrees(np.arctan2(dirs[:, 1], dirs[:, 0])) + 180.0) / (360.0 / C)).astype(np.int64)) % C
    L = len(el_table)
    cell = ring * C + col
    first = np.lexsort((rng, cell))  # per cell, the nearest point is the one kept (a first return)
    keep = first[np.concatenate([[True], np.diff(cell[first]) != 0])]
    empty = np.setdiff1d(np.arange(L * C), cell[keep])
    keep = keep[~skip[keep]]
    col_time = np.full(C, np.nan)
    np.fmin.at(col_time, col[keep], times[keep].astype(np.float64))
    has = np.isfinite(col_time)
    if has.any():  # a bin without points fires between its neighbours (circularly)
        x = np.nonzero(has)[0]
        col_time = np.interp(np.arange(C), np.concatenate([x - C, x, x + C]), np.tile(col_time[has], 3))
    else:
        col_time[:] = timestamp_us
    e_ring, e_col = empty // C, empty % C
    az = np.radians(-180.0 + (e_col + 0.5) * 360.0 / C)
    e_el = np.radians(el_table[e_ring])
    e_dirs = np.stack([np.cos(e_el) * np.cos(az), np.cos(e_el) * np.sin(az), np.sin(e_el)], 1)
    n = len(empty)
    return SweepRays(name, timestamp_us, np.concatenate([dirs[keep], e_dirs]),
                     np.concatenate([times[keep], np.round(col_time[e_col]).astype(np.int64)]),
                     np.concatenate([rng[keep], np.zeros(n)]).astype(np.float32),
                     np.concatenate([inten[keep], np.zeros(n, np.float32)]),
                     np.concatenate([ring[keep], e_ring]), np.concatenate([col[keep], e_col]), (L, C),
                     sensor.T_vehicle_lidar)
