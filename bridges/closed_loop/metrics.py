"""Driving metrics of a closed-loop run, per step and per run, from boxes and the road (docs/closed_loop.md
gives the formulas, thresholds and how the score relates to NAVSIM's PDMS and HUGSIM's HD-Score).

Per step: contact with any actor (collision), whether it is at fault (not when the ego stands still or is
hit from behind), whether the ego's footprint lies on the road (its four corners in some lane), the time to
collision under constant velocities within TTC_HORIZON_S, progress along the route, and the ego's
longitudinal/lateral acceleration, jerk, yaw rate and yaw acceleration. Per run: NC, DAC, TTC, EP, C (the
PDMS sub-scores), route completion and score = NC x DAC x (5 TTC + 5 EP + 2 C) / 12.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Sequence

import numpy as np

from gsim.boxes import footprint, overlap
from gsim.errors import InputError

from .road import Road

TTC_HORIZON_S = 1.0
TTC_STEP_S = 0.1
STOPPED_MPS = 0.1  # below this the ego is standing: contact is not its fault, nor a time to collision
EP_MIN_REFERENCE_M = 5.0  # NAVSIM: when the reference progresses less than this, EP is 1
STATIC_CATEGORIES = ("cone", "barrier", "sign", "other")  # NAVSIM: contact with a static object counts half
# nuPlan / NAVSIM comfort bounds
COMFORT = {"lon_accel_mps2": (-4.05, 2.40), "lat_accel_mps2": (-4.89, 4.89), "jerk_mps3": (-8.37, 8.37),
           "lon_jerk_mps3": (-4.13, 4.13), "yaw_rate_rps": (-0.95, 0.95), "yaw_accel_rps2": (-1.93, 1.93)}


@dataclass(frozen=True)
class Box:
    """An upright box in the world: centre (x, y, z) m, yaw rad (from +x, counter-clockwise), size m,
    velocity (vx, vy) m/s in the world."""

    id: str
    category: str
    x: float
    y: float
    z: float
    yaw: float
    length: float
    width: float
    height: float
    vx: float = 0.0
    vy: float = 0.0

    @property
    def T(self) -> np.ndarray:
        """T_world_box, the box centre's pose (yaw only)."""
        c, s = np.cos(self.yaw), np.sin(self.yaw)
        T = np.eye(4)
        T[:2, :2] = [[c, -s], [s, c]]
        T[:3, 3] = (self.x, self.y, self.z)
        return T

    @property
    def size(self):
        return (self.length, self.width, self.height)

    def moved(self, dt_s: float) -> "Box":
        return replace(self, x=self.x + self.vx * dt_s, y=self.y + self.vy * dt_s)

    def footprint(self) -> np.ndarray:
        return footprint(self.T, self.size)


def _touch(a: Box, b: Box) -> bool:
    if np.hypot(a.x - b.x, a.y - b.y) > 0.5 * (np.hypot(a.length, a.width) + np.hypot(b.length, b.width)):
        return False  # (most pairs: their bounding circles are apart)
    shared, dz = overlap(a.T, a.size, b.T, b.size)
    return dz > 0 and shared > 1e-6


def _behind(ego: Box, other: Box) -> bool:
    """Whether ``other``'s centre lies behind the ego's rear bumper (it ran into the ego)."""
    dx, dy = other.x - ego.x, other.y - ego.y
    return np.cos(ego.yaw) * dx + np.sin(ego.yaw) * dy < -ego.length / 2


@dataclass(frozen=True)
class EgoKinematics:
    """The ego's motion at a step: speed, longitudinal acceleration, yaw rate (from the dynamics)."""
    speed_mps: float
    accel_mps2: float
    yaw_rate_rps: float


class MetricsTracker:
    """Accumulates the per-step metrics of one run; `summary` gives the run's."""

    def __init__(self, road: Road, step_s: float, reference_progress_m: float, initial: EgoKinematics):
        """``initial``: the ego's motion at the start (the first step's jerk is measured from it)."""
        self.road, self.dt, self.reference = road, float(step_s), float(reference_progress_m)
        self.steps: List[Dict] = []
        self._prev = {"lon_accel_mps2": initial.accel_mps2, "yaw_rate_rps": initial.yaw_rate_rps,
                      "lat_accel_mps2": initial.speed_mps * initial.yaw_rate_rps}

    def step(self, t_us: int, ego: Box, kin: EgoKinematics, actors: Sequence[Box]) -> Dict:
        """The metrics of one step (also kept for `summary`)."""
        moving = kin.speed_mps > STOPPED_MPS
        hits = [a for a in actors if _touch(ego, a)]
        at_fault = [a for a in hits if moving and not _behind(ego, a)]
        ttc = None
        others = [a for a in actors if a not in hits and not _behind(ego, a)] if moving else []
        if others:  # (the bounding circles of all at once first: `_touch`'s own first test, the same sums)
            p = np.array([[a.x, a.y, a.vx, a.vy, np.hypot(a.length, a.width)] for a in others])
            for k in range(1, int(round(TTC_HORIZON_S / TTC_STEP_S)) + 1):
                tau = k * TTC_STEP_S
                e = ego.moved(tau)
                near = (np.hypot(e.x - (p[:, 0] + p[:, 2] * tau), e.y - (p[:, 1] + p[:, 3] * tau))
                        <= 0.5 * (np.hypot(e.length, e.width) + p[:, 4]))
                if any(_touch(e, others[i].moved(tau)) for i in np.flatnonzero(near)):
                    ttc = tau
                    break
        lat = kin.speed_mps * kin.yaw_rate_rps
        acc = np.array([kin.accel_mps2, lat])
        m = {"t_us": int(t_us), "collision": bool(hits), "collision_with": [a.id for a in hits],
             "at_fault_collision": bool(at_fault),
             "at_fault_static_only": bool(at_fault) and all(a.category in STATIC_CATEGORIES for a in at_fault),
             "on_road": bool(self.road.on_road(ego.footprint()).all()), "ttc_s": ttc,
             "progress_m": self.road.progress((ego.x, ego.y)), "speed_mps": kin.speed_mps,
             "lon_accel_mps2": kin.accel_mps2, "lat_accel_mps2": lat, "yaw_rate_rps": kin.yaw_rate_rps,
             "jerk_mps3": 0.0, "lon_jerk_mps3": 0.0, "yaw_accel_rps2": 0.0}
        prev_acc = np.array([self._prev["lon_accel_mps2"], self._prev["lat_accel_mps2"]])
        m["lon_jerk_mps3"] = (kin.accel_mps2 - self._prev["lon_accel_mps2"]) / self.dt
        m["jerk_mps3"] = float(np.linalg.norm(acc - prev_acc)) / self.dt
        m["yaw_accel_rps2"] = (kin.yaw_rate_rps - self._prev["yaw_rate_rps"]) / self.dt
        m["comfortable"] = all(lo <= m[k] <= hi for k, (lo, hi) in COMFORT.items())
        self._prev = m
        self.steps.append(m)
        return m

    def summary(self) -> Dict:
        """The run's metrics (keys documented in docs/closed_loop.md)."""
        if not self.steps:
            raise InputError("metrics: no step was run")
        s = self.steps
        fault = [m for m in s if m["at_fault_collision"]]
        nc = 1.0 if not fault else (0.5 if all(m["at_fault_static_only"] for m in fault) else 0.0)
        dac = float(all(m["on_road"] for m in s))
        ttc = float(all(m["ttc_s"] is None for m in s))
        progress = max(s[-1]["progress_m"], 0.0)
        ep = 1.0 if self.reference < EP_MIN_REFERENCE_M else float(np.clip(progress / self.reference, 0.0, 1.0))
        comfort = float(all(m["comfortable"] for m in s))
        first = next((m for m in s if m["collision"]), None)
        out = {"collision": first is not None, "score": nc * dac * (5 * ttc + 5 * ep + 2 * comfort) / 12,
               "route_completion": float(np.clip(progress / self.road.length_m, 0.0, 1.0)), "steps": len(s),
               "no_collision": nc, "drivable_area_compliance": dac, "time_to_collision": ttc, "ego_progress": ep,
               "comfort": comfort, "progress_m": progress, "reference_progress_m": self.reference,
               "route_length_m": self.road.length_m,
               "first_collision": None if first is None else {"t_us": first["t_us"], "with": first["collision_with"]},
               "min_ttc_s": min((m["ttc_s"] for m in s if m["ttc_s"] is not None), default=None),
               "off_road_steps": sum(not m["on_road"] for m in s),
               "max_abs": {k: float(max(abs(m[k]) for m in s)) for k in COMFORT}}
        return out
