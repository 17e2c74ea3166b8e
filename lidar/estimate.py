"""Estimate a spinning LiDAR's beam table from real sweeps (numpy only).

Each laser of a spinning LiDAR sweeps a cone: in the sensor frame (x forward, y left, z up) its
returns satisfy ``z = tan(elevation) * rho + h`` with ``rho = hypot(x, y)`` (metres) and ``h`` the
height of the laser's beam origin above the sensor origin (the HDL-64E's lasers sit ~0.1-0.2 m off
it; KITTI's points keep that offset). So in the plane (u, t) = (1/rho, z/rho) every laser is a line
``t = tan(elevation) + h u``, and ``atan2(z, rho)`` alone is biased by up to ~1 deg for near
returns. The estimator therefore fits one line per laser ("k-lines"):

1. initial lines: for the offsets ``h`` that make the histogram of ``atan(t - h u)`` sharpest
   (one per laser block), that histogram's most prominent peaks;
2. alternate assigning each point to its nearest line and refitting (a, h) per laser by least
   squares on its inliers, ``h`` pulled toward the median of its neighbours in elevation (lasers
   that only see the ground at one range cannot pin ``h`` alone);
3. when ``n_lasers`` is given, reach that count and repair merged or duplicated lasers: split the
   line whose split saves the most robust cost, drop the one whose loss costs least, while it pays.

The azimuth resolution is the median azimuth step between neighbouring returns of one laser in
one sweep (degrees).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
from gsim.errors import InputError

__all__ = ["BeamEstimate", "estimate_beams"]

_BIN_DEG = 0.02  # histogram bin for the initial peaks (deg)
_MIN_SEP_DEG = 0.05  # two initial peaks closer than this are one laser
_RIDGE = 1e-3  # weight (1/m^2, per point) of the neighbours' h, against the variance of a laser's 1/rho
_H_GRID_M = np.round(np.arange(-0.5, 0.5001, 0.01), 3)  # candidate beam-origin heights


@dataclass(frozen=True, eq=False)
class BeamEstimate:
    """Estimated beam table, lasers sorted by elevation, top first.

    elevations_deg: (L,) degrees up from the sensor's xy plane, descending.
    counts: (L,) int64 number of (subsampled) returns assigned to each laser.
    vertical_offsets_m: (L,) fitted beam-origin height h (metres) of each laser's cone.
    azimuth_resolution_deg: median azimuth step between neighbouring returns of one laser
      (degrees per column at the sweeps' spin rate); NaN when no laser had two returns.
    """

    elevations_deg: np.ndarray
    counts: np.ndarray
    vertical_offsets_m: np.ndarray
    azimuth_resolution_deg: float


SweepsLike = Union[np.ndarray, Sequence[np.ndarray]]


def _as_sweeps(sweeps: SweepsLike) -> list:
    arrays = [sweeps] if isinstance(sweeps, np.ndarray) and sweeps.ndim == 2 else list(sweeps)
    if not arrays:
        raise InputError("sweeps: expected at least one (N, >=3) array of sensor-frame points")
    out = []
    for i, a in enumerate(arrays):
        a = np.asarray(a)
        if a.ndim != 2 or a.shape[1] < 3:
            raise InputError(f"sweeps[{i}]: expected an (N, >=3) array of x, y, z (metres), got shape {a.shape}")
        out.append(a[:, :3].astype(np.float64))
    return out


def _hist(u, t, h, lo, nb):
    k = ((np.degrees(np.arctan(t - h * u)) - lo) / _BIN_DEG).astype(np.int64)
    return np.bincount(np.clip(k, 0, nb - 1), minlength=nb).astype(np.float64)


def _initial_lines(u, t, n_lasers):
    """(a, h) of the initial lines from the sharpest histograms of atan(t - h u)."""
    angles = np.degrees(np.arctan(t))
    lo = angles.min() - 2.0
    nb = int((angles.max() + 2.0 - lo) / _BIN_DEG) + 1
    sharp = np.array([np.square(_hist(u, t, h, lo, nb)).sum() for h in _H_GRID_M])
    local = (sharp >= np.roll(sharp, 1)) & (sharp >= np.roll(sharp, -1))
    local[[0, -1]] = False
    modes = _H_GRID_M[local & (sharp >= 0.3 * sharp.max())]
    if len(modes) == 0:
        modes = _H_GRID_M[[int(np.argmax(sharp))]]
    cands = []  # (prominence, elevation_deg, h)
    for h in modes:
        hist = _hist(u, t, h, lo, nb)
        smooth = np.convolve(hist, [0.25, 0.5, 0.25], "same")
        background = np.convolve(hist, np.ones(31) / 31, "same")
        peaks = np.nonzero((smooth[1:-1] >= smooth[:-2]) & (smooth[1:-1] > smooth[2:]))[0] + 1
        cands += [(smooth[p] - background[p], lo + (p + 0.5) * _BIN_DEG, h) for p in peaks]
    cands.sort(key=lambda c: -c[0])
    if n_lasers is None and cands:
        keep = [c for c in cands if c[0] > 0]
        top = np.percentile([c[0] for c in keep], 90) if keep else 0.0
        cands = [c for c in keep if c[0] >= 0.1 * top]
    chosen = []
    for c in cands:
        if all(abs(c[1] - d[1]) >= _MIN_SEP_DEG for d in chosen):
            chosen.append(c)
        if n_lasers is not None and len(chosen) == n_lasers:
            break
    return (np.tan(np.radians([c[1] for c in chosen])), np.array([c[2] for c in chosen], np.float64))


def _assign(u, t, a, h):
    r = t[:, None] - (a[None, :] + h[None, :] * u[:, None])
    lab = np.abs(r).argmin(1)
    return lab, r[np.arange(len(t)), lab]


def _neighbour_median(a, h, half=4):
    """Per line, the median h of itself and its ``half`` neighbours on each side in elevation order
    (robust at a jump between two laser blocks)."""
    order = np.argsort(a)
    hs = h[order]
    out = np.empty_like(h)
    for i, k in enumerate(order):
        out[k] = np.median(hs[max(i - half, 0):i + half + 1])
    return out


def _refit(u, t, a, h, iters):
    """k-lines: assign to the nearest line, then per line least squares on its inliers (residual
    within 3x the median), with ``h`` pulled toward its neighbours' (see `_neighbour_median`)."""
    for _ in range(iters):
        lab, res = _assign(u, t, a, h)
        h0 = _neighbour_median(a, h)
        a_new, h_new = a.copy(), h.copy()
        for k in range(len(a)):
            idx = np.nonzero(lab == k)[0]
            if len(idx) < 3:
                continue
            r = np.abs(res[idx])
            idx = idx[r <= max(3.0 * np.median(r), 1e-12)]
            uk, tk, n = u[idx], t[idx], len(idx)
            lam = _RIDGE * n
            m = np.array([[n, uk.sum()], [uk.sum(), uk @ uk + lam]])
            a_new[k], h_new[k] = np.linalg.solve(m, [tk.sum(), uk @ tk + lam * h0[k]])
        done = np.allclose(a_new, a, rtol=0, atol=1e-10) and np.allclose(h_new, h, rtol=0, atol=1e-9)
        a, h = a_new, h_new
        if done:
            break
    return a, h


def _costs(u, t, a, h, cap):
    """Per point: nearest line, its residual, and the robust costs min(|r|, cap) to the nearest and
    second-nearest lines."""
    r = np.abs(t[:, None] - (a[None, :] + h[None, :] * u[:, None]))
    two = np.partition(r, 1, axis=1)[:, :2] if r.shape[1] > 1 else np.concatenate([r, np.full_like(r, cap)], 1)
    lab = r.argmin(1)
    res = t - (a[lab] + h[lab] * u)
    return lab, res, np.minimum(two[:, 0], cap), np.minimum(two[:, 1], cap)


def _split_merge(u, t, a, h, n_lasers, rounds=16):
    """Reach ``n_lasers`` lines and fix merged/duplicated lasers: split the line whose split saves
    the most robust cost, dropping the line whose removal costs least, while that pays off."""
    _, res, _, _ = _costs(u, t, a, h, np.inf)
    cap = max(4.0 * float(np.median(np.abs(res))), 1e-9)
    for _ in range(rounds + n_lasers):
        lab, res, c1, c2 = _costs(u, t, a, h, cap)
        gains, splits = np.zeros(len(a)), []
        for k in range(len(a)):
            rk = res[lab == k]
            hi = float(np.median(rk[rk > 0])) if (rk > 0).any() else 0.0
            lo = float(np.median(rk[rk < 0])) if (rk < 0).any() else 0.0
            after = np.minimum(np.minimum(np.abs(rk - hi), np.abs(rk - lo)), cap).sum()
            gains[k] = np.minimum(np.abs(rk), cap).sum() - after
            splits.append((hi, lo))
        w = int(np.argmax(gains))
        if len(a) < n_lasers:
            drop = None
        else:
            drop_cost = np.bincount(lab, weights=c2 - c1, minlength=len(a))
            drop_cost[w] = np.inf
            drop = int(np.argmin(drop_cost))
            if gains[w] <= drop_cost[drop] + 1e-12:
                break
        hi, lo = splits[w]
        a, h = np.append(a, a[w] + lo), np.append(h, h[w])
        a[w] += hi
        if drop is not None:
            a, h = np.delete(a, drop), np.delete(h, drop)
        a, h = _refit(u, t, a, h, 20)
    return a, h


def _azimuth_resolution(sweeps, a, h, min_range_m) -> float:
    steps = []
    for p in sweeps:
        rho = np.hypot(p[:, 0], p[:, 1])
        ok = np.isfinite(p).all(1) & (rho > min_range_m)
        p, rho = p[ok], rho[ok]
        lab, _ = _assign(1.0 / rho, p[:, 2] / rho, a, h)
        az = np.degrees(np.arctan2(p[:, 1], p[:, 0]))
        for k in range(len(a)):
            d = np.diff(np.sort(az[lab == k]))
            d = d[d > 1e-9]
            if len(d) >= 2:
                steps.append(np.median(d))
    return float(np.median(steps)) if steps else float("nan")


def estimate_beams(sweeps: SweepsLike, n_lasers: Optional[int] = None, *, min_range_m: float = 2.5,
                   max_points: int = 150_000, seed: int = 0) -> BeamEstimate:
    """Estimate the elevation table (and azimuth resolution) of the spinning LiDAR that recorded ``sweeps``.

    sweeps: one (N, >=3) array or a sequence of them, points x, y, z in the sensor frame (metres;
      extra columns such as reflectance are ignored). Returns closer than ``min_range_m`` in the
      xy plane are ignored. At most ``max_points`` returns (random, ``seed``) fit the lines.
    n_lasers: the number of lasers if known; otherwise the prominent elevation peaks are counted.
    """
    if n_lasers is not None and (not isinstance(n_lasers, (int, np.integer)) or n_lasers < 1):
        raise InputError(f"n_lasers: expected a positive integer or None, got {n_lasers!r}")
    arrays = _as_sweeps(sweeps)
    p = np.concatenate(arrays)
    rho = np.hypot(p[:, 0], p[:, 1])
    ok = np.isfinite(p).all(1) & (rho > min_range_m)
    p, rho = p[ok], rho[ok]
    if len(p) < 10 * (n_lasers or 1):
        raise InputError(f"sweeps: only {len(p)} returns beyond {min_range_m} m, too few to estimate beams")
    if len(p) > max_points:
        pick = np.random.default_rng(seed).choice(len(p), max_points, replace=False)
        p, rho = p[pick], rho[pick]
    u, t = 1.0 / rho, p[:, 2] / rho
    a, h = _initial_lines(u, t, n_lasers)
    if len(a) == 0:
        raise InputError("sweeps: no elevation peaks found (are the points in the sensor frame?)")
    a, h = _refit(u, t, a, h, 30)
    if n_lasers is not None:
        a, h = _split_merge(u, t, a, h, n_lasers)
    lab, _ = _assign(u, t, a, h)
    counts = np.bincount(lab, minlength=len(a)).astype(np.int64)
    el = np.degrees(np.arctan(a))
    order = np.argsort(-el)
    return BeamEstimate(el[order], counts[order], h[order],
                        _azimuth_resolution(arrays, a[order], h[order], min_range_m))
