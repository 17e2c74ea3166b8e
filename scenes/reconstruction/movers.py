"""Moving objects found in a log's LiDAR without annotations: rigid actor tracks and transient points.

Most real logs have no actor tracks, and a reconstruction that bakes moving cars into the static
background smears them over the street. This module finds them from the sweeps themselves:

1. **Free-space contradictions.** A point of sweep i is *dynamic* when the rays of other sweeps
   passed through its place: in sweep j's range image (rows: beams, columns: azimuth bins, each
   column posed at its own firing time), the neighbourhood of the point's direction holds returns
   all farther than the point (plus a margin). A static surface can never be seen through; a car
   that drove away leaves space other sweeps see through. Unknown cells (no return) never count
   as free, so the test errs towards static.
2. **Objects.** Points above the local ground (a per-cell low percentile of every sweep, eroded
   so that cells under trucks take the road around them) are clustered per sweep (linked within
   ``cluster_m`` where both are dynamic, else ``static_link_m``); a cluster with enough dynamic points
   is a detection.
3. **Tracks.** Detections are associated over time (constant-velocity prediction, Hungarian
   assignment with a gate); a track seen often enough that moves far enough is a mover. Its box
   heading follows its motion, its size is a robust maximum of its extents over the frames (with
   ``clipped_height``, a class's usual height where the top beam never passed over it), and
   each frame's box is anchored on the faces the sensor sees (a LiDAR sees an L-shape), then
   smoothed over time. Movers become `ActorTrack`s, like annotated ones.
4. **Transients.** Dynamic clusters that no mover explains (a pedestrian seen twice, a car
   that only crept) are returned per sweep as points to ignore: the trainer leaves them out of
   the initial surfels and the LiDAR losses, and masks their projection (dilated) in the images.

Only the frames given (the training frames) are read: held-out frames stay unseen, and the tracks
reach their times by interpolation or a short extrapolation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numba
import numpy as np

from gsim.boxes import footprint
from gsim.errors import InputError
from gsim.transforms import interpolate_poses

from ..log import ActorTrack, DrivingLog, Frame, LidarObs
from .views import CLIP_M, Ignored, above_top_beam, ignored_points, sweep_world, top_beam_tan


MAX_VEHICLE_WIDTH_M = 2.6
# a box whose top the LiDAR never saw takes its class's usual height: EU trucks are up to 4 m tall
_CLIPPED_HEIGHT_M = {"truck": 3.8, "car": 1.7}


@dataclass(frozen=True)
class MoverOptions:
    max_range_m: float = 50.0  # points farther from the sensor are not examined (sparse, noisy)
    min_range_m: float = 3.0  # nearer returns are the ego vehicle itself
    ground_cell_m: float = 1.0
    ground_quantile: float = 0.05  # of a cell's heights over all sweeps
    ground_erode_cells: int = 1  # a cell's ground is the lowest of the cells this far around (trucks cover cells)
    ground_clearance_m: float = 0.3  # points this far above the local ground may belong to an object
    max_height_m: float = 4.5  # points higher above the ground are not road users
    free_margin_m: float = 0.5  # a ray passed through a point if it returned this much farther ...
    free_margin_rel: float = 0.03  # ... plus this fraction of the distance
    min_contradictions: int = 2  # sweeps that must see through a point to call it dynamic
    pair_window: int = 40  # sweeps before and after a sweep that look through its points
    cluster_m: float = 1.0  # dynamic points this close are one object (distant cars' rings are ~0.6 m apart)
    static_link_m: float = 0.5  # other points: cars queueing side by side stay apart
    clipped_height: bool = True  # a box whose top the top beam never passed takes its class's height (the
    # image points above its clipped top are seeded into it: KITTI at downscale 4, 1000 steps, 21.20 -> 22.18 dB)
    min_cluster_points: int = 20
    dynamic_fraction: float = 0.15  # of a cluster's points, for a detection
    min_dynamic_points: int = 10
    gate_m: float = 2.5  # association gate around the predicted position
    split_m: float = 2.5  # an unmatched detection this close to a matched one is the same object, cut by an occluder
    extend_gate_m: float = 1.5  # a mover's track continues through any cluster this close to its prediction
    max_missed: int = 3  # frames a track may go unseen
    min_track_frames: int = 3
    min_displacement_m: float = 1.0  # a mover's box travels at least this far
    smooth_frames: int = 2  # box centres: local linear fit over +-this many detections
    extrapolate_us: int = 150_000  # tracks reach this far beyond their first and last detection
    elevation_bin_deg: float = 0.4  # range-image rows for LiDARs without a beam table
    azimuth_bin_deg: float = 0.2  # and columns


@dataclass(frozen=True, eq=False)
class Movers:
    """What moves in a log: ``tracks`` (rigid actors in box frames, ids ``mover_NNN``) and ``ignored``,
    per sweep file (the LidarObs's ``points`` path) a bool mask over its points: transients no track
    explains. ``detections`` counts the dynamic clusters found, ``frames`` the sweeps examined."""

    tracks: Tuple[ActorTrack, ...]
    ignored: Dict[str, np.ndarray] = field(default_factory=dict)
    detections: int = 0
    frames: int = 0

    def summary(self) -> dict:
        return {"tracks": [{"id": t.id, "category": t.category, "size": [round(float(s), 3) for s in t.size],
                            "first_us": int(t.timestamps_us[0]), "last_us": int(t.timestamps_us[-1]),
                            "path_m": round(float(np.linalg.norm(t.poses[-1, :3, 3] - t.poses[0, :3, 3])), 2)}
                           for t in self.tracks],
                "detections": self.detections, "sweeps": self.frames,
                "ignored_points": int(sum(int(m.sum()) for m in self.ignored.values()))}


@dataclass(frozen=True, eq=False)
class _Sweep:
    obs: LidarObs
    world: np.ndarray  # (N,3) float64
    origin: np.ndarray  # (N,3)
    time: np.ndarray  # (N,) int64 us
    free: np.ndarray  # (rows, cols) float32 range image, min-filtered; 0 = unknown
    R_col: np.ndarray  # (cols,3,3) sensor<-world rotation at each column's firing time
    t_col: np.ndarray  # (cols,3)
    R_mid: np.ndarray  # (3,3) at the sweep's mean time
    t_mid: np.ndarray
    top_tan: Optional[float]  # tangent of the highest beam's elevation (None: the LiDAR's beams are unknown)


def _grid(log: DrivingLog, obs: LidarObs, opt: MoverOptions) -> Tuple[np.ndarray, float]:
    """(the range image's row elevations (L,) ascending, degrees; its azimuth bin, degrees)."""
    beams = log.lidars[obs.sensor].beams
    if beams is not None:
        return np.sort(np.asarray(beams.elevations_deg, np.float64)), float(beams.azimuth_resolution_deg)
    return np.arange(-45.0, 45.0 + 1e-9, opt.elevation_bin_deg), opt.azimuth_bin_deg


@numba.njit(cache=True)
def _cell(p, el_rows, az_bin, n_cols):
    """(row, column, range) of a sensor-frame point in a range image; row -1 when outside the rows."""
    r = np.sqrt(p[0] * p[0] + p[1] * p[1] + p[2] * p[2])
    if r < 1e-6:
        return -1, 0, 0.0
    el = np.degrees(np.arcsin(p[2] / r))
    k = np.searchsorted(el_rows, el)
    L = len(el_rows)
    if k == 0:
        row = 0
    elif k == L:
        row = L - 1
    else:
        row = k if el_rows[k] - el < el - el_rows[k - 1] else k - 1
    half = 0.5 * (el_rows[1] - el_rows[0]) if L > 1 else 1.0
    if el < el_rows[0] - half or el > el_rows[L - 1] + half:
        return -1, 0, r
    col = int(np.floor((np.degrees(np.arctan2(p[1], p[0])) + 180.0) / az_bin)) % n_cols
    return row, col, r


@numba.njit(cache=True)
def _range_image(local, el_rows, az_bin, n_cols):
    img = np.full((len(el_rows), n_cols), np.inf, np.float32)
    for i in range(len(local)):
        row, col, r = _cell(local[i], el_rows, az_bin, n_cols)
        if row >= 0 and r < img[row, col]:
            img[row, col] = r
    return img


@numba.njit(parallel=True, cache=True)
def _seen_through(points, R_mid, t_mid, R_col, t_col, free, el_rows, az_bin, margin_m, margin_rel, min_r):
    """(M,) bool: the viewer sweep's rays passed beyond each world point (see the module docstring)."""
    n_cols = free.shape[1]
    out = np.zeros(len(points), np.bool_)
    for i in numba.prange(len(points)):
        p = points[i]
        q = R_mid @ p + t_mid
        _, c0, _ = _cell(q, el_rows, az_bin, n_cols)
        q = R_col[c0] @ p + t_col[c0]
        row, col, d = _cell(q, el_rows, az_bin, n_cols)
        if row >= 0 and d >= min_r and free[row, col] > d * (1.0 + margin_rel) + margin_m:
            out[i] = True
    return out


def _min_filter(img: np.ndarray) -> np.ndarray:
    """3x3 minimum (azimuth wraps), unknown cells (inf) as 0: a ray counts as passing only where its
    neighbours' rays all returned beyond."""
    from scipy.ndimage import minimum_filter
    known = np.where(np.isfinite(img), img, 0.0).astype(np.float32)
    padded = np.concatenate([known[:, -1:], known, known[:, :1]], 1)
    return minimum_filter(padded, size=3, mode="nearest")[:, 1:-1]


def _load(log: DrivingLog, obs: LidarObs, opt: MoverOptions) -> _Sweep:
    world, origin, _, time = sweep_world(log, obs)
    el_rows, az_bin = _grid(log, obs, opt)
    n_cols = int(round(360.0 / az_bin))
    local = log.sweep(obs)[:, :3].astype(np.float64)
    free = _min_filter(_range_image(local, el_rows, az_bin, n_cols))
    col = (np.floor((np.degrees(np.arctan2(local[:, 1], local[:, 0])) + 180.0) / az_bin).astype(np.int64)) % n_cols
    # each column's firing time (mean of its points; columns without points between their neighbours)
    cnt = np.bincount(col, minlength=n_cols)
    tc = np.bincount(col, time.astype(np.float64), minlength=n_cols) / np.maximum(cnt, 1)
    has = cnt > 0
    if has.any():
        x = np.nonzero(has)[0]
        tc = np.interp(np.arange(n_cols), np.concatenate([x - n_cols, x, x + n_cols]), np.tile(tc[has], 3))
    else:
        tc[:] = obs.timestamp_us
    T_vl = log.lidars[obs.sensor].T_vehicle_lidar
    T = interpolate_poses(log.ego_timestamps_us, log.ego_poses, np.round(tc).astype(np.int64)) @ T_vl
    Tinv = np.linalg.inv(T)
    Tm = np.linalg.inv(log.T_world_vehicle(int(round(time.mean())) if len(time) else obs.timestamp_us) @ T_vl)
    return _Sweep(obs, world, origin, time, free, np.ascontiguousarray(Tinv[:, :3, :3]),
                  np.ascontiguousarray(Tinv[:, :3, 3]), Tm[:3, :3].copy(), Tm[:3, 3].copy(), top_beam_tan(log, obs))


def _ground(sweeps: Sequence[_Sweep], opt: MoverOptions, T_anchor: np.ndarray):
    """A function (M,2) world xy -> ground height: per cell a low quantile of every sweep's points,
    then the minimum over ``ground_erode_cells`` around (cells under a truck see only its side),
    cells without points filled from the nearest cell that has some. The cells are laid in the ground
    plane of ``T_anchor`` (the first sweep's LiDAR: its xy and heading), not of the world: which
    objects stand clear of the ground depends on where the cells fall, and the same sweeps must give
    the same movers whatever a log calls its world (a 0.5 m shift lost a car on the KITTI sample)."""
    from scipy.ndimage import distance_transform_edt, minimum_filter
    c, s_ = T_anchor[0, 0], T_anchor[1, 0]
    norm = np.hypot(c, s_)
    R = np.array([[c, s_], [-s_, c]]) / norm  # world xy -> the anchor's heading
    t = T_anchor[:2, 3]
    xyz = np.concatenate([s.world for s in sweeps])
    cell = opt.ground_cell_m
    ij = np.floor((xyz[:, :2] - t) @ R.T / cell).astype(np.int64)
    lo = ij.min(0)
    ij -= lo
    shape = tuple(ij.max(0) + 1)
    key = ij[:, 0] * shape[1] + ij[:, 1]
    order = np.lexsort((xyz[:, 2], key))
    k_sorted = key[order]
    first = np.concatenate([[0], np.nonzero(np.diff(k_sorted))[0] + 1])
    count = np.diff(np.append(first, len(order)))
    # a low percentile, not the minimum: multipath returns from shiny vehicles land below the road
    pick = order[first + np.floor(opt.ground_quantile * (count - 1)).astype(np.int64)]
    grid = np.full(shape, np.inf)
    grid.reshape(-1)[k_sorted[first]] = xyz[pick, 2]
    e = 2 * opt.ground_erode_cells + 1
    grid = minimum_filter(grid, size=e, mode="nearest")
    empty = ~np.isfinite(grid)
    if empty.all():
        raise InputError("movers: the sweeps have no points")
    idx = distance_transform_edt(empty, return_distances=False, return_indices=True)
    grid = grid[tuple(idx)]

    def height(xy: np.ndarray) -> np.ndarray:
        g = np.floor((xy - t) @ R.T / cell).astype(np.int64) - lo
        g = np.clip(g, 0, np.asarray(shape) - 1)
        return grid[g[:, 0], g[:, 1]]
    return height


def _clusters(xyz: np.ndarray, dynamic: np.ndarray, link_m: float, static_link_m: float) -> np.ndarray:
    """(N,) cluster label per point: connected components of points linked within ``static_link_m``, or
    within ``link_m`` where both are dynamic (a car creeping in a jam is one object, not one with the
    parked car half a metre beside it). Links join voxel centroids (voxels of static_link_m / 2, dynamic
    where most of their points are), so the cost follows the occupied volume, not the point count."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree
    if len(xyz) == 0:
        return np.zeros(0, np.int64)
    vox = np.floor(xyz / (static_link_m / 2)).astype(np.int64)
    _, inv = np.unique(vox, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    cnt = np.bincount(inv)
    centres = np.stack([np.bincount(inv, xyz[:, k]) for k in range(3)], 1) / cnt[:, None]
    dyn = np.nonzero(np.bincount(inv, dynamic) >= 0.5 * cnt)[0]
    pairs = cKDTree(centres).query_pairs(static_link_m, output_type="ndarray")
    if len(dyn) > 1:
        pairs = np.concatenate([pairs, dyn[cKDTree(centres[dyn]).query_pairs(link_m, output_type="ndarray")]])
    n = len(centres)
    g = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    _, lab = connected_components(g, directed=False)
    return lab[inv]


@dataclass
class _Detection:
    sweep: int
    idx: np.ndarray  # point indices in the sweep
    centre: np.ndarray  # (2,) xy centroid
    time_us: float


def _merge(a: _Detection, b: _Detection) -> _Detection:
    idx = np.concatenate([a.idx, b.idx])
    n_a, n_b = len(a.idx), len(b.idx)
    return _Detection(a.sweep, idx, (a.centre * n_a + b.centre * n_b) / (n_a + n_b),
                      (a.time_us * n_a + b.time_us * n_b) / (n_a + n_b))


@dataclass
class _Track:
    dets: List[_Detection]
    missed: int = 0

    def predict(self, t_us: float) -> np.ndarray:
        last = self.dets[-1]
        if len(self.dets) < 2:
            return last.centre
        prev = self.dets[-2]
        v = (last.centre - prev.centre) / max(last.time_us - prev.time_us, 1.0)
        return last.centre + v * (t_us - last.time_us)


def _associate(per_sweep: List[List[_Detection]], opt: MoverOptions) -> List[_Track]:
    from scipy.optimize import linear_sum_assignment
    live: List[_Track] = []
    done: List[_Track] = []
    for dets in per_sweep:
        if live and dets:
            t = dets[0].time_us
            cost = np.array([[np.linalg.norm(tr.predict(t) - d.centre) for d in dets] for tr in live])
            rows, cols = linear_sum_assignment(np.where(cost <= opt.gate_m, cost, 1e6))
            pairs = [(r, c) for r, c in zip(rows, cols) if cost[r, c] <= opt.gate_m]
        else:
            pairs = []
        matched_t, matched_d = {r for r, _ in pairs}, {c for _, c in pairs}
        for r, c in pairs:
            live[r].dets.append(dets[c])
            live[r].missed = 0
        # an object cut in two by an occluder: a detection next to a matched one joins it
        for c, d in enumerate(dets):
            if c in matched_d or not pairs:
                continue
            dist = [np.linalg.norm(dets[m].centre - d.centre) for _, m in pairs]
            k = int(np.argmin(dist))
            if dist[k] <= opt.split_m:
                r = pairs[k][0]
                live[r].dets[-1] = _merge(live[r].dets[-1], d)
                matched_d.add(c)
        for r, tr in enumerate(live):
            if r not in matched_t:
                tr.missed += 1
        done += [tr for tr in live if tr.missed > opt.max_missed]
        live = [tr for tr in live if tr.missed <= opt.max_missed]
        live += [_Track([d]) for c, d in enumerate(dets) if c not in matched_d]
    return done + live


def _extend(tr: _Track, clusters: List[List[_Detection]], pos: np.ndarray, used: set,
            opt: MoverOptions) -> None:
    """Continue a mover's track through the sweeps before its first and after its last detection with any
    cluster near its constant-velocity prediction: the last places of a car driving away (and the first of
    one coming) are never seen through by other sweeps, but they are still the car. ``pos``: each sweep's
    place in time order; ``clusters`` are in that order."""
    for step in (1, -1):
        k, missed = pos[(tr.dets[-1] if step == 1 else tr.dets[0]).sweep] + step, 0
        while 0 <= k < len(clusters) and missed <= opt.max_missed:
            a, b = (tr.dets[-2], tr.dets[-1]) if step == 1 else (tr.dets[1], tr.dets[0])
            free = [c for c in clusters[k] if id(c) not in used]
            if free:
                t = free[0].time_us
                v = (b.centre - a.centre) / (b.time_us - a.time_us) if b.time_us != a.time_us else 0.0
                guess = b.centre + v * (t - b.time_us)
                dist = [np.linalg.norm(c.centre - guess) for c in free]
                j = int(np.argmin(dist))
            if free and dist[j] <= opt.extend_gate_m:
                used.add(id(free[j]))
                if step == 1:
                    tr.dets.append(free[j])
                else:
                    tr.dets.insert(0, free[j])
                missed = 0
            else:
                missed += 1
            k += step


def _smooth(times: np.ndarray, values: np.ndarray, half: int) -> np.ndarray:
    """Each row replaced by a local linear fit in time over +-half neighbours (rigid bodies move smoothly)."""
    out = np.empty_like(values)
    for i in range(len(times)):
        lo, hi = max(0, i - half), min(len(times), i + half + 1)
        t = (times[lo:hi] - times[i]) * 1e-6
        if hi - lo >= 3 and np.ptp(t) > 0:
            A = np.stack([np.ones_like(t), t], 1)
            out[i] = np.linalg.lstsq(A, values[lo:hi], rcond=None)[0][0]
        else:
            out[i] = values[lo:hi].mean(0)
    return out


def _category(size: np.ndarray) -> str:
    """A class guessed from the box size (metres): what a user filtering actors needs first."""
    l, w, h = size
    if l >= 6.5:
        return "truck"
    if l >= 2.5:
        return "car"
    return "pedestrian" if h >= 1.2 and l < 1.2 else "unknown"


def _box_track(tr: _Track, sweeps: Sequence[_Sweep], ground, k: int, opt: MoverOptions):
    """The track's rigid box over time: (ActorTrack or None when it does not move enough)."""
    times = np.array([d.time_us for d in tr.dets])
    centres = np.stack([d.centre for d in tr.dets])
    # heading: the direction of travel, locally where the object moved, else overall
    travel = centres[-1] - centres[0]
    yaw = np.empty(len(times))
    for i in range(len(times)):
        lo, hi = max(0, i - 3), min(len(times) - 1, i + 3)
        d = centres[hi] - centres[lo]
        yaw[i] = np.arctan2(*(d if np.linalg.norm(d) > 0.5 else travel)[::-1])
    ext, near, tops, clipped = [], [], [], []
    for d, a in zip(tr.dets, yaw):
        s = sweeps[d.sweep]
        p = s.world[d.idx]
        c, si = np.cos(a), np.sin(a)
        R = np.array([[c, si], [-si, c]])  # world xy -> box-aligned axes
        q = (p[:, :2] - d.centre) @ R.T
        o = (s.origin[d.idx].mean(0)[:2] - d.centre) @ R.T
        ext.append(np.stack([q.min(0), q.max(0)]))
        near.append(o)
        tops.append(np.percentile(p[:, 2], 98) - ground(d.centre[None])[0])
        # a top within CLIP_M of the top beam may be cut off (only asked with clipped_height)
        clipped.append(opt.clipped_height and s.top_tan is not None
                       and np.percentile(above_top_beam(s.top_tan, p, s.origin[d.idx]), 98) > -CLIP_M)
    ext = np.stack(ext)  # (T, 2 [min,max], 2 [along, across])
    span = ext[:, 1] - ext[:, 0]
    size = np.percentile(span, 90, axis=0)
    # a vehicle seen only from behind or ahead shows its width, not its length: take a car's proportions
    # (length 2.4 x width); seen only from the side, the width is at least the length / 2.6 but no more
    # than a road vehicle's (2.6 m: a truck's side is long, not wide; wider means clusters that merged)
    if size[1] >= 1.4 and size[0] < size[1]:
        size[0] = 2.4 * size[1]
    size[1] = max(size[1], size[0] / 2.6)
    if size[0] >= 2.5:
        size[1] = min(size[1], MAX_VEHICLE_WIDTH_M)
    tops, clipped = np.array(tops), np.array(clipped)
    if not opt.clipped_height:
        h = float(np.percentile(tops, 90))
    elif clipped.all():  # never seen whole (a truck beside the ego is taller than the top beam passes)
        h = max(float(np.percentile(tops, 90)), _CLIPPED_HEIGHT_M.get(_category((*size, 0.0)), 0.0))
    else:
        h = float(np.percentile(tops[~clipped], 90))
    # each frame's centre: the observed middle where the whole extent was seen, else the seen face + half
    local = np.empty((len(times), 2))
    for i in range(len(times)):
        for ax in range(2):
            lo, hi = ext[i, :, ax]
            if hi - lo >= 0.8 * size[ax]:
                local[i, ax] = 0.5 * (lo + hi)
            elif near[i][ax] < 0.5 * (lo + hi):
                local[i, ax] = lo + size[ax] / 2
            else:
                local[i, ax] = hi - size[ax] / 2
    c, si = np.cos(yaw), np.sin(yaw)
    xy = centres + np.stack([c * local[:, 0] - si * local[:, 1], si * local[:, 0] + c * local[:, 1]], 1)
    xy = _smooth(times, xy, opt.smooth_frames)
    if np.linalg.norm(xy[-1] - xy[0]) < opt.min_displacement_m:
        return None
    yaw = np.unwrap(yaw)
    yaw = _smooth(times, yaw[:, None], opt.smooth_frames)[:, 0]
    z = ground(xy) + h / 2
    # extend a little beyond the first and last detection at the end velocities
    t = times.astype(np.float64)
    if len(t) >= 2:
        v0 = (xy[1] - xy[0]) / (t[1] - t[0])
        v1 = (xy[-1] - xy[-2]) / (t[-1] - t[-2])
        e = opt.extrapolate_us
        t = np.concatenate([[t[0] - e], t, [t[-1] + e]])
        xy = np.concatenate([[xy[0] - v0 * e], xy, [xy[-1] + v1 * e]])
        yaw = np.concatenate([[yaw[0]], yaw, [yaw[-1]]])
        z = np.concatenate([[z[0]], z, [z[-1]]])
    ts = np.round(t).astype(np.int64)
    keep = np.concatenate([[True], np.diff(ts) > 0])
    poses = np.tile(np.eye(4), (len(ts), 1, 1))
    poses[:, 0, 0], poses[:, 0, 1] = np.cos(yaw), -np.sin(yaw)
    poses[:, 1, 0], poses[:, 1, 1] = np.sin(yaw), np.cos(yaw)
    poses[:, :2, 3], poses[:, 2, 3] = xy, z
    box = np.array([size[0], size[1], h])
    return ActorTrack(f"mover_{k:03d}", _category(box), tuple(float(x) for x in np.maximum(box, 0.2)),
                      ts[keep], poses[keep])


def detect_movers(log: DrivingLog, frames: Sequence[Frame], opt: MoverOptions = MoverOptions(),
                  progress: bool = False) -> Movers:
    """Moving objects in the sweeps of ``frames`` (see the module docstring)."""
    obs_list = [o for f in frames for o in f.lidars.values()]
    if not obs_list:
        raise InputError(f"{log.root}: detecting moving objects needs LiDAR sweeps; the frames have none")
    it = obs_list
    if progress:
        from tqdm import tqdm
        it = tqdm(obs_list, desc="movers: sweeps", unit="sweep")
    sweeps = [_load(log, o, opt) for o in it]
    T_anchor = log.T_world_lidar(min(sweeps, key=lambda s: s.obs.timestamp_us).obs)  # (see `_ground`)
    ground = _ground(sweeps, opt, T_anchor)
    # candidates: above the ground, below the height of road users, within range
    cand = []
    for s in sweeps:
        hgt = s.world[:, 2] - ground(s.world[:, :2])
        r = np.linalg.norm(s.world - s.origin, axis=1)
        cand.append(np.nonzero((hgt > opt.ground_clearance_m) & (hgt < opt.max_height_m)
                               & (r >= opt.min_range_m) & (r <= opt.max_range_m))[0])
    # each sweep against the sweeps up to pair_window before and after it (the cost stays linear in the log)
    order = np.argsort([s.obs.timestamp_us for s in sweeps], kind="stable")
    rank = np.argsort(order)
    pairs = [(i, j) for i in range(len(sweeps)) for j in range(len(sweeps))
             if i != j and abs(int(rank[i]) - int(rank[j])) <= opt.pair_window]
    counts = [np.zeros(len(c), np.int32) for c in cand]
    grids = [_grid(log, s.obs, opt) for s in sweeps]
    it = pairs
    if progress:
        from tqdm import tqdm
        it = tqdm(pairs, desc="movers: free space", unit="pair")
    for i, j in it:
        v = sweeps[j]
        counts[i] += _seen_through(np.ascontiguousarray(sweeps[i].world[cand[i]]), v.R_mid, v.t_mid, v.R_col,
                                   v.t_col, v.free, *grids[j], opt.free_margin_m, opt.free_margin_rel,
                                   opt.min_range_m)
    clusters: List[List[_Detection]] = []  # every object-sized cluster of each sweep
    per_sweep: List[List[_Detection]] = []  # the dynamic ones
    for i, s in enumerate(sweeps):
        idx = cand[i]
        dyn = counts[i] >= opt.min_contradictions
        lab = _clusters(s.world[idx] - T_anchor[:3, 3], dyn, opt.cluster_m, opt.static_link_m)
        every, dets = [], []
        if len(lab):
            n = np.bincount(lab)
            nd = np.bincount(lab, dyn, len(n))
            for c in np.nonzero(n >= opt.min_cluster_points)[0]:
                pi = idx[lab == c]
                d = _Detection(i, pi, s.world[pi, :2].mean(0), float(s.time[pi].mean()))
                every.append(d)
                if nd[c] >= opt.min_dynamic_points and nd[c] >= opt.dynamic_fraction * n[c]:
                    dets.append(d)
        clusters.append(every)
        per_sweep.append(dets)
    tracks = _associate([per_sweep[i] for i in order], opt)
    used = {id(d) for tr in tracks for d in tr.dets}
    movers = []
    claimed = [np.zeros(len(s.world), bool) for s in sweeps]
    for tr in sorted(tracks, key=lambda tr: -len(tr.dets)):  # the best-seen objects claim clusters first
        if len(tr.dets) < opt.min_track_frames:
            continue
        _extend(tr, [clusters[i] for i in order], rank, used, opt)
        a = _box_track(tr, sweeps, ground, len(movers), opt)
        if a is not None:
            movers.append(a)
            for d in tr.dets:
                claimed[d.sweep][d.idx] = True
    n_det = sum(len(d) for d in per_sweep)
    ignored = {}
    for i, s in enumerate(sweeps):
        m = np.zeros(len(s.world), bool)
        for d in per_sweep[i]:
            if not claimed[i][d.idx].any():
                m[d.idx] = True
        if m.any():
            ignored[s.obs.points] = m
    return Movers(tuple(movers), ignored, n_det, len(sweeps))


def birds_eye_boxes(log: DrivingLog, obs: LidarObs, boxes, ignored: Ignored = {}, extent_m: float = 40.0,
                    pixels: int = 400) -> np.ndarray:
    """(pixels, pixels, 3) uint8 top view of a sweep around its sensor (x up the image, as
    `gsim.lidar.metrics.birds_eye`): static points grey, ``ignored`` ones red, and ``boxes``, a list of
    (T_world_box, size, rgb, label) at the sweep's time, drawn as footprints."""
    from PIL import Image, ImageDraw

    from gsim.lidar.metrics import birds_eye
    world = sweep_world(log, obs)[0]
    T_lw = np.linalg.inv(log.T_world_vehicle(obs.timestamp_us) @ log.lidars[obs.sensor].T_vehicle_lidar)
    local = world @ T_lw[:3, :3].T + T_lw[:3, 3]
    skip = ignored_points(ignored, obs, len(local))
    img = np.maximum(birds_eye(local[~skip], extent_m, pixels, (200, 200, 200)),
                     birds_eye(local[skip], extent_m, pixels, (255, 60, 60)))
    pil = Image.fromarray(img)
    draw = ImageDraw.Draw(pil)
    s = pixels / (2 * extent_m)
    for pose, size, rgb, label in boxes:
        xy = footprint(T_lw @ pose, size)  # the footprint in the sensor frame
        pts = [(pixels / 2 - y * s, pixels / 2 - x * s) for x, y in xy]
        draw.polygon(pts, outline=tuple(rgb))
        if label:
            draw.text(pts[0], label, fill=tuple(rgb))
    return np.asarray(pil)


def write_pictures(log: DrivingLog, frames: Sequence[Frame], movers: Movers, out) -> None:
    """OUT/NNNNNN_SENSOR.png per sweep of ``frames``: the found movers' boxes (green) over the sweep, with
    the ignored transient points in red."""
    from gsim.io import write_png
    for f in frames:
        for obs in f.lidars.values():
            boxes = [(t.pose_at(obs.timestamp_us), t.size, (80, 255, 80), t.id[-3:]) for t in movers.tracks
                     if t.timestamps_us[0] <= obs.timestamp_us <= t.timestamps_us[-1]]
            write_png(Path(out) / f"{f.index:06d}_{obs.sensor}.png",
                      birds_eye_boxes(log, obs, boxes, movers.ignored))
