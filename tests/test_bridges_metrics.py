"""Closed-loop metrics on hand-made cases: collisions and fault, static objects, time to collision, the road,
comfort, progress and the PDMS-form score (docs/closed_loop.md)."""
import math

import numpy as np
import pytest

from gsim.bridges.closed_loop.metrics import Box, EgoKinematics, MetricsTracker
from gsim.bridges.closed_loop.road import Polyline, Road

ROAD = Road.build([("lane", np.array([[-100.0, 0.0], [100.0, 0.0]]), 3.5)], np.array([[-100.0, 0.0], [100.0, 0.0]]),
                  (0.0, 0.0), (50.0, 0.0))
STILL = EgoKinematics(0.0, 0.0, 0.0)


def car(x, y=0.0, yaw=0.0, vx=0.0, name="car", category="car", length=4.6, width=1.9):
    return Box(name, category, x, y, 0.75, yaw, length, width, 1.5, vx, 0.0)


def one_step(ego, kin, actors, start=STILL, reference=50.0):
    t = MetricsTracker(ROAD, 0.1, reference, start)
    return t.step(100_000, ego, kin, actors), t


def test_contact_and_fault():
    moving = EgoKinematics(5.0, 0.0, 0.0)
    m, t = one_step(car(0.0, vx=5.0, name="ego"), moving, [car(4.0)])  # a car ahead, touching
    assert m["collision"] and m["at_fault_collision"] and m["collision_with"] == ["car"]
    assert t.summary()["no_collision"] == 0.0 and t.summary()["score"] == 0.0
    m, t = one_step(car(0.0, vx=5.0, name="ego"), moving, [car(-4.0)])  # hit from behind
    assert m["collision"] and not m["at_fault_collision"] and t.summary()["no_collision"] == 1.0
    m, _ = one_step(car(0.0, name="ego"), STILL, [car(4.0)])  # standing: not its fault
    assert m["collision"] and not m["at_fault_collision"]
    _, t = one_step(car(0.0, vx=5.0, name="ego"), moving, [car(2.2, category="cone", length=0.4, width=0.4)])
    assert t.summary()["no_collision"] == 0.5  # NAVSIM: a static object counts half
    m, _ = one_step(car(0.0, vx=5.0, name="ego"), moving, [car(4.0, y=2.5)])  # beside, apart
    assert not m["collision"]


def test_time_to_collision_under_constant_velocities():
    moving = EgoKinematics(10.0, 0.0, 0.0)
    m, _ = one_step(car(0.0, vx=10.0, name="ego"), moving, [car(10.0)])  # 5.4 m of gap at 10 m/s
    assert m["ttc_s"] == pytest.approx(0.6)
    m, _ = one_step(car(0.0, vx=10.0, name="ego"), moving, [car(20.0)])
    assert m["ttc_s"] is None
    m, _ = one_step(car(0.0, vx=10.0, name="ego"), moving, [car(10.0, vx=10.0)])  # same speed: never
    assert m["ttc_s"] is None


def test_road_comfort_progress_and_score():
    kin = EgoKinematics(5.0, 0.0, 0.0)
    m, t = one_step(car(0.0, y=1.2, name="ego"), kin, [])  # its left side over the lane's edge
    assert not m["on_road"] and t.summary()["drivable_area_compliance"] == 0.0
    m, t = one_step(car(10.0, name="ego"), EgoKinematics(5.0, 3.0, 0.0), [], start=EgoKinematics(5.0, 3.0, 0.0))
    assert not m["comfortable"] and m["lon_jerk_mps3"] == 0.0  # 3.0 m/s^2 is over the 2.40 bound
    m, _ = one_step(car(10.0, name="ego"), EgoKinematics(5.0, -1.0, 0.0), [])
    assert m["lon_jerk_mps3"] == pytest.approx(-10.0) and not m["comfortable"]  # a step from 0 to -1 m/s^2
    m, t = one_step(car(10.0, name="ego"), kin, [], reference=40.0)
    s = t.summary()
    assert m["progress_m"] == pytest.approx(10.0) and s["route_completion"] == pytest.approx(0.2)
    assert s["ego_progress"] == pytest.approx(0.25)
    assert s["score"] == pytest.approx(1.0 * 1.0 * (5 * 1 + 5 * 0.25 + 2 * 1) / 12)


def test_polyline_projection():
    line = Polyline([[0.0, 0.0], [10.0, 0.0], [10.0, 10.0]])
    s, lat, dist = line.project([[5.0, 1.0], [11.0, 5.0]])
    assert np.allclose(s, [5.0, 15.0]) and np.allclose(lat, [1.0, -1.0]) and np.allclose(dist, [1.0, 1.0])
    pts, yaw = line.at([5.0, 15.0])
    assert np.allclose(pts, [[5.0, 0.0], [10.0, 5.0]]) and np.allclose(yaw, [0.0, math.pi / 2])
    with pytest.raises(ValueError, match="route"):
        Road.build([("lane", np.array([[0.0, 0.0], [1.0, 0.0]]), 3.5)], np.array([[0.0, 0.0], [10.0, 0.0]]),
                   (5.0, 0.0), (2.0, 0.0))
