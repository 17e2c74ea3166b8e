"""The closed loop's ego models at the loop's rate: gsim's bicycle and CommonRoad's KS, ST, STD and MB (vehicle 2 by
default), each driven by the loop's own tracker along two routes at 10 Hz: a 3.5 m lane change at 20 m/s and a
30 m radius circle at 10 m/s. Prints, per model and route, the median and 90th percentile of a step's time
(`model.step` alone) and the largest distance of the rear axle from the route after the first 2 s (how well and
how stably the tracker holds it), and whether every state stayed finite.

Usage: python bench/bench_dynamics.py [--vehicle 2] [--dt 0.1]
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

from gsim.bridges.closed_loop.dynamics import BicycleModel, EgoState, TrajectoryTracker, VehicleParams, path_waypoints
from gsim.bridges.closed_loop.vehicle_models import MODELS, CommonRoadModel, vehicle_limits


def routes():
    x = np.arange(0.0, 400.0, 0.5)
    lane = np.stack([x, 3.5 / (1 + np.exp(-(x - 60.0) / 6.0))], 1)  # a smooth 3.5 m lane change around x = 60 m
    a = np.arange(0.0, 2 * math.pi, 0.01)
    circle = np.stack([30.0 * np.sin(a), 30.0 * (1 - np.cos(a))], 1)
    return {"lane change 20 m/s": (lane, 20.0, 8.0), "circle r 30 m, 10 m/s": (circle, 10.0, 15.0)}


def cross_track(path, p):
    a, seg = path[:-1], np.diff(path, axis=0)
    u = np.clip(((p - a) * seg).sum(1) / (seg ** 2).sum(1), 0, 1)
    return float(np.linalg.norm(a + u[:, None] * seg - p, axis=1).min())


def drive(name, vehicle, path, speed, seconds, dt):
    params = VehicleParams.from_dict({**VehicleParams().to_dict(), **vehicle_limits(vehicle)})
    model = BicycleModel(params) if name == "bicycle" else CommonRoadModel(name, vehicle, params)
    tracker = TrajectoryTracker(params)
    s = EgoState(float(path[0, 0]), float(path[0, 1]), 0.0, speed)
    times, worst, finite = [], 0.0, True
    for k in range(round(seconds / dt)):
        c = tracker.controls(s, path_waypoints(path, s, speed), dt)
        t = time.perf_counter()
        s = model.step(s, c, dt)
        times.append(time.perf_counter() - t)
        finite &= all(math.isfinite(v) for v in (s.x_m, s.y_m, s.yaw_rad, s.speed_mps))
        if k * dt >= 2.0:
            worst = max(worst, cross_track(path, np.array([s.x_m, s.y_m])))
    q = statistics.quantiles(times, n=10)
    return {"median_ms": 1e3 * statistics.median(times), "p90_ms": 1e3 * q[-1], "max_cross_track_m": worst,
            "finite": finite}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vehicle", type=int, default=2)
    ap.add_argument("--dt", type=float, default=0.1)
    a = ap.parse_args(argv)
    out = {}
    for route, (path, speed, seconds) in routes().items():
        for name in ("bicycle",) + MODELS:
            r = out.setdefault(route, {})[name] = drive(name, a.vehicle, path, speed, seconds, a.dt)
            print(f"{route:24s} {name:8s} step median {r['median_ms']:7.3f} ms  p90 {r['p90_ms']:7.3f} ms  "
                  f"max cross-track {r['max_cross_track_m']:.3f} m  finite {r['finite']}")
    return out


if __name__ == "__main__":
    main()
