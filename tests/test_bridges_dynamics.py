"""Ego dynamics (gsim.bridges.closed_loop.dynamics): the bicycle model against closed forms, its limits, the tracking
controller on a lane change, a circle and a route's end, determinism, and clear errors for bad input."""
import math

import numpy as np
import pytest

from gsim.bridges.closed_loop.dynamics import (ActionError, BicycleModel, Controls, EgoState, TrajectoryTracker,
                                               VehicleParams, lateral_accel, path_waypoints, yaw_rate)

P = VehicleParams()


def drive(model, state, controls, dt, n):
    for _ in range(n):
        state = model.step(state, controls, dt)
    return state


def cross_track(path, pts):
    """Distance (m) from each point (M,2) to the polyline (N,2)."""
    a, seg = path[:-1], np.diff(path, axis=0)
    u = np.clip(np.einsum("mnk,nk->mn", pts[:, None] - a, seg) / (seg ** 2).sum(1), 0, 1)
    return np.linalg.norm(a + u[..., None] * seg - pts[:, None], axis=2).min(1)


def follow(path, v_target, v0, n, dt=0.1, yaw0=0.0):
    """Closed loop: path_waypoints -> tracker -> model every dt s from the path's first point."""
    model, tracker = BicycleModel(P), TrajectoryTracker(P)
    states = [EgoState(path[0, 0], path[0, 1], yaw0, v0)]
    for k in range(n):
        c = tracker.controls(states[-1], path_waypoints(path, states[-1], v_target), dt)
        c.check(k)
        states.append(model.step(states[-1], c, dt))
    return states


# --- the bicycle model against closed forms ---

@pytest.mark.parametrize("steer", [0.3, -0.12])
def test_constant_steer_and_speed_follow_the_analytic_circle_for_any_step(steer):
    L, v, yaw0, p0, T = P.wheelbase_m, 12.0, 0.4, np.array([1.0, -2.0]), 2.0
    R = L / math.tan(steer)  # signed: negative turns right
    centre = p0 + R * np.array([-math.sin(yaw0), math.cos(yaw0)])
    yaw = yaw0 + v * T * math.tan(steer) / L
    expected = centre + R * np.array([math.sin(yaw), -math.cos(yaw)])
    ends = []
    for dt in (0.1, 0.05, 0.025):
        s = drive(BicycleModel(P), EgoState(*p0, yaw0, v, steer_rad=steer), Controls(0.0, 0.0), dt, round(T / dt))
        assert s.timestamp_us == 2_000_000
        assert np.hypot(s.x_m - centre[0], s.y_m - centre[1]) == pytest.approx(abs(R), rel=1e-12)
        assert np.allclose([s.x_m, s.y_m], expected, rtol=0, atol=1e-9 * abs(R))
        assert abs(math.remainder(s.yaw_rad - yaw, 2 * math.pi)) < 1e-12
        ends.append((s.x_m, s.y_m, s.yaw_rad))
    assert np.allclose(ends, ends[0], rtol=0, atol=1e-9 * abs(R))


def test_yaw_stays_wrapped_and_a_full_circle_closes():
    steer, v = 0.4, 8.0
    R = P.wheelbase_m / math.tan(steer)
    dt = 0.01
    n = 2 * math.pi * R / v / dt  # not a whole number of steps: finish with the remainder
    model, s = BicycleModel(P), EgoState(3.0, 4.0, 3.0, v, steer_rad=steer)
    yaws = []
    for _ in range(int(n)):
        s = model.step(s, Controls(0.0, 0.0), dt)
        yaws.append(s.yaw_rad)
    s = model.step(s, Controls(0.0, 0.0), (n - int(n)) * dt)
    assert all(-math.pi <= y <= math.pi for y in yaws) and max(yaws) - min(yaws) > 6.0
    assert np.allclose([s.x_m, s.y_m, s.yaw_rad], [3.0, 4.0, 3.0], atol=1e-9)


def test_straight_acceleration_distance_and_the_acceleration_limit():
    model, dt, n = BicycleModel(P), 0.1, 30
    s = drive(model, EgoState(0.0, 0.0, 0.0, 5.0), Controls(2.0, 0.0), dt, n)
    assert s.x_m == pytest.approx(5.0 * 3 + 0.5 * 2.0 * 9, abs=1e-9) and s.y_m == 0.0
    assert s.speed_mps == pytest.approx(11.0) and s.accel_mps2 == 2.0
    s = drive(model, EgoState(0.0, 0.0, 0.0, 5.0), Controls(10.0, 0.0), dt, n)  # clipped to max_accel 3
    assert s.x_m == pytest.approx(5.0 * 3 + 0.5 * 3.0 * 9, abs=1e-9)
    assert s.speed_mps == pytest.approx(14.0) and s.accel_mps2 == P.max_accel_mps2


def test_top_speed_is_held_with_the_exact_distance():
    s = BicycleModel(P).step(EgoState(0.0, 0.0, 0.0, 39.0), Controls(3.0, 0.0), 1.0)
    t = 1 / 3  # 39 -> 40 m/s, then 40 m/s for the rest of the second
    assert s.speed_mps == 40.0 and s.accel_mps2 == 0.0
    assert s.x_m == pytest.approx(39 * t + 1.5 * t * t + 40 * (1 - t), abs=1e-12)


def test_braking_stops_at_the_analytic_distance_and_never_reverses():
    model, v0 = BicycleModel(P), 10.0
    s = drive(model, EgoState(0.0, 0.0, 0.7, v0, steer_rad=0.0), Controls(-20.0, 0.0), 0.1, 13)  # stops at 1.25 s
    stop = v0 ** 2 / (2 * P.max_decel_mps2)  # 6.25 m, the command clipped to max_decel
    assert s.speed_mps == 0.0 and s.accel_mps2 == 0.0
    assert math.hypot(s.x_m, s.y_m) == pytest.approx(stop, abs=1e-12)
    later = drive(model, s, Controls(-5.0, 0.0), 0.1, 10)
    assert (later.x_m, later.y_m, later.speed_mps) == (s.x_m, s.y_m, 0.0)


def test_steer_rate_and_steer_angle_limits():
    model, dt = BicycleModel(P), 0.1
    for sign in (1.0, -1.0):
        s, steers = EgoState(0.0, 0.0, 0.0, 10.0), [0.0]
        for _ in range(15):
            s = model.step(s, Controls(0.0, sign * 5.0), dt)
            steers.append(s.steer_rad)
        steps = np.diff(steers)
        assert np.all(np.abs(steps) <= P.max_steer_rate_rps * dt + 1e-15)
        assert steps[0] == pytest.approx(sign * P.max_steer_rate_rps * dt)
        assert max(abs(x) for x in steers) == pytest.approx(P.max_steer_rad)  # reached, never exceeded
        assert all(abs(x) <= P.max_steer_rad for x in steers)
    # the first step turns with the steer at mid-step: half of the clipped rate's change
    s = model.step(EgoState(0.0, 0.0, 0.0, 10.0), Controls(0.0, 5.0), dt)
    assert s.yaw_rad == pytest.approx(math.tan(0.035) / P.wheelbase_m * 1.0, rel=1e-12)


def test_yaw_rate_and_lateral_accel_match_the_model():
    s = EgoState(0.0, 0.0, 0.0, 10.0, steer_rad=0.2)
    assert yaw_rate(s, P) == pytest.approx(10.0 * math.tan(0.2) / P.wheelbase_m)
    assert lateral_accel(s, P) == pytest.approx(10.0 * yaw_rate(s, P))
    after = BicycleModel(P).step(s, Controls(0.0, 0.0), 0.05)
    assert after.yaw_rad == pytest.approx(yaw_rate(s, P) * 0.05, rel=1e-12)


def test_rear_axle_pose_and_box_centre():
    s = EgoState(2.0, 3.0, math.pi / 2, 0.0)
    T = s.T_world_rear_axle(z=0.5)
    assert T.dtype == np.float64 and T.shape == (4, 4)
    assert np.allclose(T @ [1.0, 0.0, 0.0, 1.0], [2.0, 4.0, 0.5, 1.0])  # vehicle +x is world +y
    assert np.allclose(T[:3, :3] @ T[:3, :3].T, np.eye(3))
    assert np.allclose(s.box_centre_xy(P), (T @ [P.rear_axle_to_centre_m, 0, 0, 1])[:2])
    assert s.to_dict()["timestamp_us"] == 0 and set(s.to_dict()) >= {"x_m", "yaw_rad", "steer_rad"}


# --- waypoints and the tracker ---

def test_path_waypoints_in_the_ego_frame_and_the_stop_at_the_route_end():
    path = np.array([[0.0, 0.0], [100.0, 0.0]])
    w = path_waypoints(path, EgoState(10.0, 1.0, 0.0, 5.0), 5.0, horizon_s=2.0, dt_s=0.5)
    assert np.allclose(w, [[0.5, 2.5, -1.0], [1.0, 5.0, -1.0], [1.5, 7.5, -1.0], [2.0, 10.0, -1.0]])
    # heading world +y, the path on its right: ego x is world +y, ego y is world -x
    w = path_waypoints(np.array([[1.0, 0.0], [1.0, 50.0]]), EgoState(0.0, 5.0, math.pi / 2, 0.0), 4.0, 1.0, 0.5)
    assert np.allclose(w, [[0.5, 2.0, -1.0], [1.0, 4.0, -1.0]])
    # 10 m before the end at 10 m/s: braking at 2 m/s^2 from sqrt(2 * 2 * 10) m/s, stopped at the end
    w = path_waypoints(path, EgoState(90.0, 0.0, 0.0, 10.0), 10.0, horizon_s=4.0, dt_s=1.0, stop_decel_mps2=2.0)
    v, tau = math.sqrt(40.0), np.minimum([1.0, 2.0, 3.0, 4.0], math.sqrt(40.0) / 2)  # stopped after v/2 s
    assert np.allclose(w[:, 1], v * tau - tau * tau) and w[-1, 1] == 10.0


def test_target_speed_rule():
    tracker = TrajectoryTracker(P)
    t = np.arange(1, 7) * 0.5
    assert tracker.target_speed(np.stack([t, 7.0 * t, 0 * t], 1)) == pytest.approx(7.0)  # constant speed: exact
    assert tracker.target_speed(np.stack([t, 2.0 * t ** 2 / 2, 0 * t], 1)) == pytest.approx(1.0)  # a=2: v(0.5 s)
    assert tracker.target_speed(np.stack([t, -3.0 + 0 * t, 0 * t], 1)) == 0.0  # overrun: stop, never reverse


def test_tracker_steers_towards_the_side_of_the_path():
    tracker, t = TrajectoryTracker(P), np.arange(1, 7) * 0.5
    for side in (1.0, -1.0):
        s = EgoState(0.0, 0.0, 0.0, 10.0)
        c = tracker.controls(s, np.stack([t, 10.0 * t, side * np.full(6, 1.0)], 1), 0.1)
        target = math.atan(2 * P.wheelbase_m * side * 1.0 / 10.0 ** 2)  # lookahead point (sqrt(99), 1) at 10 m
        assert c.steer_rate_rps == pytest.approx(target / 0.1)
        # target speed: the polyline (0,0) -> (5,+-1) -> (10,+-1) over its 1 s: sqrt(26) + 5 m/s; PI, first step
        e = math.sqrt(26.0) + 5.0 - 10.0
        assert c.accel_mps2 == pytest.approx(1.0 * e + 0.1 * e * 0.1)
        tracker.reset()


def lane_change_path():
    x = np.linspace(-50.0, 200.0, 2501)
    return np.stack([x, 3.5 * (1 - np.cos(np.pi * np.clip(x, 0, 40) / 40)) / 2], 1)  # 3.5 m over 40 m


def test_tracker_follows_a_lane_change():
    # measured: max cross-track 0.094 m (0.102 m starting from 6 m/s): pure pursuit at ld = 10 m cuts the
    # S-curve's bends (peak curvature 1/93 m^-1); the bound leaves ~50% margin, not room for a broken controller
    path = lane_change_path()
    states = follow(path, 10.0, 10.0, 120)
    pts = np.array([[s.x_m, s.y_m] for s in states])
    assert pts[-1, 0] > 60.0 and abs(pts[-1, 1] - 3.5) < 0.02  # through the manoeuvre and settled in the lane
    assert cross_track(path, pts).max() < 0.15
    assert max(abs(s.speed_mps - 10.0) for s in states) < 0.05


def test_tracker_follows_a_circle_and_settles_on_speed():
    # R = 30 m at 10 m/s (lateral 3.3 m/s^2) from 7 m/s, the wheels straight: measured max cross-track
    # 0.050 m while the steer ramps up and the speed changes, then 0.019 m after 5 s (pure pursuit's
    # steady state on a circle is the circle itself; what is left is the 5 m waypoint chords' sag and the
    # one-step steer lag); the speed overshoots by 0.18 m/s (the PI's integral, ki = 0.1) and decays
    R = 30.0
    th = np.linspace(0.0, 1.9 * np.pi, 2000)  # under a lap: the nearest point is never on a later lap
    path = np.stack([R * np.sin(th), R * (1 - np.cos(th))], 1)
    states = follow(path, 10.0, 7.0, 140)
    pts = np.array([[s.x_m, s.y_m] for s in states])
    err = np.abs(np.hypot(pts[:, 0], pts[:, 1] - R) - R)
    assert err.max() < 0.1 and err[50:].max() < 0.03
    speed = np.array([s.speed_mps for s in states])
    assert np.abs(speed[50:] - 10.0).max() < 0.3
    assert abs(states[-1].steer_rad - math.atan(P.wheelbase_m / R)) < 0.005  # the circle's steady steer


def test_tracker_stops_at_the_route_end_and_stays():
    path = np.array([[0.0, 0.0], [60.0, 0.0]])
    states = follow(path, 10.0, 10.0, 120)
    stopped = [k for k, s in enumerate(states) if s.speed_mps == 0.0]
    assert stopped and all(s.speed_mps == 0.0 for s in states[stopped[0]:])
    assert abs(states[-1].x_m - 60.0) < 0.5  # measured 0.26 m past the end (the speed PID's lag)


def test_two_runs_are_identical():
    a, b = follow(lane_change_path(), 10.0, 6.0, 60), follow(lane_change_path(), 10.0, 6.0, 60)
    assert a == b and a[-1].timestamp_us == 6_000_000


def test_reset_clears_the_integral():
    tracker, t = TrajectoryTracker(P), np.arange(1, 7) * 0.5
    w, s = np.stack([t, 10.0 * t, 0 * t], 1), EgoState(0.0, 0.0, 0.0, 9.5)
    first = tracker.controls(s, w, 0.1).accel_mps2
    assert tracker.controls(s, w, 0.1).accel_mps2 > first  # the integral grew
    tracker.reset()
    assert tracker.controls(s, w, 0.1).accel_mps2 == first


# --- configuration and bad input ---

def test_params_round_trip_and_validation():
    p = VehicleParams(wheelbase_m=3.1, max_speed_mps=30.0)
    assert VehicleParams.from_dict(p.to_dict()) == p and p.to_dict()["schema_version"] == 1
    with pytest.raises(ValueError, match=r"VehicleParams\.wheelbase_m: expected a finite length > 0 m, got -1"):
        VehicleParams(wheelbase_m=-1)
    with pytest.raises(ValueError, match=r"VehicleParams\.max_decel_mps2: .*positive"):
        VehicleParams(max_decel_mps2=-8.0)
    with pytest.raises(ValueError, match=r"VehicleParams\.max_steer_rad"):
        VehicleParams(max_steer_rad=2.0)
    with pytest.raises(ValueError, match=r"VehicleParams\.max_speed_mps"):
        VehicleParams(max_speed_mps=float("nan"))
    with pytest.raises(ValueError, match=r"VehicleParams\.rear_axle_to_centre_m"):
        VehicleParams(rear_axle_to_centre_m=5.0)
    with pytest.raises(ValueError, match=r"unknown fields \['wheel_base'\]"):
        VehicleParams.from_dict({"schema_version": 1, "wheel_base": 2.0})
    with pytest.raises(ValueError, match=r"schema_version"):
        VehicleParams.from_dict({"wheelbase_m": 2.0})


def test_nan_controls_raise_an_action_error_naming_the_step_and_field():
    with pytest.raises(ActionError, match=r"step 17: Controls\.accel_mps2"):
        Controls(float("nan"), 0.0).check(17)
    with pytest.raises(ActionError, match=r"step 3: Controls\.steer_rate_rps"):
        Controls(0.0, float("inf")).check(3)
    with pytest.raises(ActionError, match=r"Controls\.accel_mps2"):
        BicycleModel(P).step(EgoState(0.0, 0.0, 0.0, 1.0), Controls(float("nan"), 0.0), 0.1)
    assert issubclass(ActionError, ValueError)


def test_bad_states_steps_and_waypoints():
    s, model, tracker = EgoState(0.0, 0.0, 0.0, 5.0), BicycleModel(P), TrajectoryTracker(P)
    with pytest.raises(ValueError, match=r"EgoState\.speed_mps: expected a speed >= 0"):
        EgoState(0.0, 0.0, 0.0, -1.0)
    with pytest.raises(ValueError, match=r"EgoState\.yaw_rad"):
        EgoState(0.0, 0.0, float("nan"), 1.0)
    with pytest.raises(ValueError, match=r"EgoState\.timestamp_us: expected an integer"):
        EgoState(0.0, 0.0, 0.0, 1.0, timestamp_us=0.5)
    for dt in (0.0, -0.1, float("nan"), 1e-8):
        with pytest.raises(ValueError, match=r"dt_s: expected"):
            model.step(s, Controls(0.0, 0.0), dt)
    good = np.array([[0.5, 2.5, 0.0], [1.0, 5.0, 0.0]])
    with pytest.raises(ValueError, match=r"dt_s: expected"):
        tracker.controls(s, good, 0.0)
    bad = {r"shape \(K,3\)": good[:, :2], r"shape \(K,3\).*\(0, 3\)": np.zeros((0, 3)),
           "strictly increasing": good[::-1], "t_s > 0": good - [0.5, 0, 0],
           "finite": np.where(np.eye(2, 3, 1) > 0, np.nan, good)}
    for msg, w in bad.items():
        with pytest.raises(ValueError, match=r"waypoints: expected .*" + msg):
            tracker.controls(s, w, 0.1)
    with pytest.raises(ValueError, match=r"path_xy_world: expected shape \(N,2\)"):
        path_waypoints(np.zeros((4, 3)), s, 5.0)
    with pytest.raises(ValueError, match=r"path_xy_world: expected at least 2 distinct points"):
        path_waypoints(np.ones((4, 2)), s, 5.0)
    with pytest.raises(ValueError, match=r"speed_mps: expected a finite speed >= 0"):
        path_waypoints(np.array([[0.0, 0.0], [1.0, 0.0]]), s, -2.0)
    with pytest.raises(ValueError, match=r"TrajectoryTracker\.ki: expected a finite gain >= 0"):
        TrajectoryTracker(P, ki=-0.1)
