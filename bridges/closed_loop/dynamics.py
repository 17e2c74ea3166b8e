"""Ego-vehicle dynamics for the closed loop: a kinematic bicycle model and its trajectory tracker.

Frames and units (docs/architecture.md): world frame right-handed, metres, z up; the ego frame is the vehicle
frame (x forward, y left, z up) with its origin at the REAR AXLE centre on the ground; yaw is
counter-clockwise from world +x in radians; time is integer microseconds (``timestamp_us``), step
lengths are seconds (``dt_s``).

- ``BicycleModel.step(state, controls, dt_s)`` advances an ``EgoState`` by one step. Within a step the
  acceleration is constant (the speed piecewise linear: it stops at 0 or max_speed) and the curvature is
  constant (the steer at the middle of the step), and the model integrates that exactly: the pose lies
  on the arc whatever ``dt_s`` is, so a fixed-steer, fixed-speed run ends on the same circle for any
  step length.
- ``TrajectoryTracker.controls(state, waypoints, dt_s)`` turns timed ego-frame waypoints into
  ``Controls``: pure pursuit for the steer, a PID on speed for the acceleration.
- ``path_waypoints(path_xy_world, state, speed_mps)`` makes such waypoints from a world-frame route
  driven at a constant speed, braking to a stop at its end (agents that follow a route).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

import numpy as np

from gsim.config import Config
from gsim.errors import InputError

STANDSTILL_MPS = 0.05  # a planned speed below this means "stop here": brake to a standstill
_SINC_SERIES_BELOW = 1e-4  # |u| under which sin(u)/u = 1 - u^2/6 is exact in float64 (next term u^4/120)


class ActionError(InputError):
    """Controls that cannot be applied (NaN, inf, not a number); the message names the step and field."""


def _is_real(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _check_positive_time(name: str, v) -> float:
    """A step or horizon length in seconds: finite and > 0."""
    if not (_is_real(v) and math.isfinite(v) and v > 0):
        raise InputError(f"{name}: expected a finite time > 0 s, got {v!r}")
    return float(v)


def check_dt(v) -> float:
    """A step length: finite, > 0 and at least 1 us (the timestamps are integer microseconds)."""
    dt = _check_positive_time("dt_s", v)
    if round(dt * 1e6) < 1:
        raise InputError(f"dt_s: expected a step of at least 1 us (timestamps are integer microseconds), got {v!r}")
    return dt


def wrap_angle(angle: float) -> float:
    """An angle in radians wrapped to [-pi, pi]."""
    return math.remainder(angle, 2.0 * math.pi)


def _sinc(u: float) -> float:
    """sin(u)/u, safe at u -> 0."""
    return 1.0 - u * u / 6.0 if abs(u) < _SINC_SERIES_BELOW else math.sin(u) / u


@dataclass(frozen=True)
class VehicleParams(Config):
    """A vehicle's size and limits: metres, seconds, radians; decelerations are positive numbers.

    ``rear_axle_to_centre_m`` is how far the box centre lies ahead of the rear axle (along vehicle +x).
    """

    wheelbase_m: float = 2.8
    length_m: float = 4.6
    width_m: float = 1.9
    height_m: float = 1.6
    rear_axle_to_centre_m: float = 1.4
    max_accel_mps2: float = 3.0
    max_decel_mps2: float = 8.0
    max_steer_rad: float = 0.6
    max_steer_rate_rps: float = 0.7
    max_speed_mps: float = 40.0

    def __post_init__(self):
        expected = {"wheelbase_m": "a finite length > 0 m", "length_m": "a finite length > 0 m",
                    "width_m": "a finite length > 0 m", "height_m": "a finite length > 0 m",
                    "max_accel_mps2": "a finite acceleration > 0 m/s^2",
                    "max_decel_mps2": "a finite deceleration > 0 m/s^2 (a positive number)",
                    "max_steer_rate_rps": "a finite steer rate > 0 rad/s",
                    "max_speed_mps": "a finite speed > 0 m/s"}
        for name, what in expected.items():
            v = getattr(self, name)
            if not (_is_real(v) and math.isfinite(v) and v > 0):
                raise InputError(f"VehicleParams.{name}: expected {what}, got {v!r}")
        v = self.max_steer_rad
        if not (_is_real(v) and 0 < v < math.pi / 2):  # tan(steer) must stay finite
            raise InputError(f"VehicleParams.max_steer_rad: expected an angle in (0, pi/2) rad, got {v!r}")
        v = self.rear_axle_to_centre_m
        if not (_is_real(v) and math.isfinite(v) and abs(v) <= self.length_m / 2):
            raise InputError(f"VehicleParams.rear_axle_to_centre_m: expected a finite offset within "
                             f"+-length_m/2 = +-{self.length_m / 2} m (the rear axle is inside the box), got {v!r}")


@dataclass(frozen=True)
class EgoState:
    """The ego at one time: rear-axle centre (x_m, y_m) in the world x-y plane (m), yaw_rad (from world
    +x, counter-clockwise), speed_mps (>= 0: no reversing), steer_rad (front-wheel angle, left positive),
    accel_mps2 (the longitudinal acceleration acting at the end of the last step, m/s^2) and timestamp_us.
    """

    x_m: float
    y_m: float
    yaw_rad: float
    speed_mps: float
    steer_rad: float = 0.0
    accel_mps2: float = 0.0
    timestamp_us: int = 0

    def __post_init__(self):
        for name in ("x_m", "y_m", "yaw_rad", "speed_mps", "steer_rad", "accel_mps2"):
            v = getattr(self, name)
            if not (_is_real(v) and math.isfinite(v)):
                raise InputError(f"EgoState.{name}: expected a finite number, got {v!r}")
        if self.speed_mps < 0:
            raise InputError(f"EgoState.speed_mps: expected a speed >= 0 m/s (no reversing), got {self.speed_mps!r}")
        if not isinstance(self.timestamp_us, (int, np.integer)) or isinstance(self.timestamp_us, bool):
            raise InputError(f"EgoState.timestamp_us: expected an integer (microseconds), got {self.timestamp_us!r}")
        object.__setattr__(self, "timestamp_us", int(self.timestamp_us))

    def T_world_rear_axle(self, z: float = 0.0) -> np.ndarray:
        """4x4 float64 pose of the rear-axle frame (x forward, y left, z up) in the world: yaw only, at height z (m)."""
        c, s = math.cos(self.yaw_rad), math.sin(self.yaw_rad)
        T = np.eye(4)
        T[:2, :2] = [[c, -s], [s, c]]
        T[:3, 3] = [self.x_m, self.y_m, z]
        return T

    def box_centre_xy(self, params: VehicleParams) -> Tuple[float, float]:
        """World (x, y) of the vehicle box's centre, ``params.rear_axle_to_centre_m`` ahead of the rear axle."""
        d = params.rear_axle_to_centre_m
        return self.x_m + d * math.cos(self.yaw_rad), self.y_m + d * math.sin(self.yaw_rad)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Controls:
    """One step's command: accel_mps2 (m/s^2, negative brakes) and steer_rate_rps (rad/s, left positive).

    Any finite value is a valid command: ``BicycleModel.step`` clips it to the vehicle's limits.
    """

    accel_mps2: float
    steer_rate_rps: float

    def check(self, step: Optional[int] = None) -> None:
        """Raise ``ActionError`` naming the step (when given) and the field if a value is not a finite number."""
        for name in ("accel_mps2", "steer_rate_rps"):
            v = getattr(self, name)
            if not (_is_real(v) and math.isfinite(v)):
                where = f"step {step}: " if step is not None else ""
                raise ActionError(f"{where}Controls.{name}: expected a finite number, got {v!r}")


def yaw_rate(state: EgoState, params: VehicleParams) -> float:
    """Yaw rate (rad/s) of the bicycle model in ``state``: speed * tan(steer) / wheelbase."""
    return state.speed_mps * math.tan(state.steer_rad) / params.wheelbase_m


def lateral_accel(state: EgoState, params: VehicleParams) -> float:
    """Lateral (centripetal) acceleration (m/s^2, left positive) of the rear axle: speed * yaw rate."""
    return state.speed_mps * yaw_rate(state, params)


def _speed_profile(v0: float, a: float, dt: float, v_max: float) -> Tuple[float, float, float]:
    """Constant acceleration ``a`` for ``dt`` s from ``v0``, the speed held in [0, v_max]:
    (distance m, end speed m/s, acceleration acting at the end m/s^2)."""
    v1 = v0 + a * dt
    if v1 < 0.0:  # stops within the step and stays stopped (no reversing)
        return v0 * v0 / (-2.0 * a), 0.0, 0.0
    if v1 > v_max:  # reaches the top speed within the step and holds it
        t = (v_max - v0) / a
        return v0 * t + 0.5 * a * t * t + v_max * (dt - t), v_max, 0.0
    held = (v1 == 0.0 and a < 0) or (v1 == v_max and a > 0)
    return v0 * dt + 0.5 * a * dt * dt, v1, 0.0 if held else a


class BicycleModel:
    """Kinematic bicycle about the rear axle, integrated exactly for piecewise-constant inputs.

    One step of ``dt_s``: the acceleration is clipped to [-max_decel, max_accel] and the steer rate to
    +-max_steer_rate; the steer follows the clipped rate and is clipped to +-max_steer; the speed is
    linear in time and held in [0, max_speed] (it stops at 0 within the step: no reversing), and the
    distance s is that piecewise-linear speed's exact integral. The curvature k = tan(steer)/wheelbase
    uses the steer at the middle of the step and is constant within it, so the rear axle moves along an
    arc: heading change k*s and the arc's chord, 2 sin(k s / 2) / k long at heading yaw + k s / 2.
    A state beyond the limits (steer, speed) starts from its clipped values. The new state's accel_mps2
    is the clipped command, or 0 once the speed is held at 0 or max_speed. Pure and deterministic; the
    timestamp advances by round(dt_s * 1e6) us.
    """

    def __init__(self, params: VehicleParams = VehicleParams()):
        if not isinstance(params, VehicleParams):
            raise InputError(f"params: expected a VehicleParams, got {type(params).__name__}")
        self.params = params

    def step(self, state: EgoState, controls: Controls, dt_s: float) -> EgoState:
        """The state ``dt_s`` seconds after ``state`` under ``controls`` (see the class docstring)."""
        p = self.params
        dt = check_dt(dt_s)
        controls.check()
        rate, a = self.applied(controls)
        steer0 = min(max(state.steer_rad, -p.max_steer_rad), p.max_steer_rad)
        steer1 = min(max(steer0 + rate * dt, -p.max_steer_rad), p.max_steer_rad)
        steer_mid = min(max(steer0 + rate * dt / 2, -p.max_steer_rad), p.max_steer_rad)
        v0 = min(state.speed_mps, p.max_speed_mps)
        s, v1, a_end = _speed_profile(v0, a, dt, p.max_speed_mps)
        dyaw = math.tan(steer_mid) / p.wheelbase_m * s
        chord, heading = s * _sinc(dyaw / 2), state.yaw_rad + dyaw / 2
        return EgoState(x_m=state.x_m + chord * math.cos(heading), y_m=state.y_m + chord * math.sin(heading),
                        yaw_rad=wrap_angle(state.yaw_rad + dyaw), speed_mps=v1, steer_rad=steer1, accel_mps2=a_end,
                        timestamp_us=state.timestamp_us + round(dt * 1e6))

    def applied(self, controls: Controls) -> Tuple[float, float]:
        """The inputs a step applies: (steer rate rad/s, acceleration m/s^2) clipped to the vehicle's limits."""
        p = self.params
        return (min(max(controls.steer_rate_rps, -p.max_steer_rate_rps), p.max_steer_rate_rps),
                min(max(controls.accel_mps2, -p.max_decel_mps2), p.max_accel_mps2))

    def yaw_rate(self, state: EgoState) -> float:
        return yaw_rate(state, self.params)

    def record(self, state: EgoState, controls: Optional[Controls], dt_s: float) -> dict:
        """What a run's steps.jsonl keeps of the step that ended in ``state`` under ``controls`` (None: the start),
        enough to re-integrate it (docs/closed_loop.md): x in the order of CommonRoad's KS state (x, y, steering angle, speed, yaw; the rear axle), u the applied
        (steering velocity, acceleration)."""
        return {"model": "bicycle", "x": [state.x_m, state.y_m, state.steer_rad, state.speed_mps, state.yaw_rad],
                "u": None if controls is None else list(self.applied(controls)), "dt": dt_s,
                "substeps": 0 if controls is None else 1, "integrator": "exact arc"}


def _check_waypoints(waypoints) -> np.ndarray:
    """(K,3) finite float64 rows (t_s > 0 strictly increasing, x_m, y_m), or a ValueError naming the problem."""
    try:
        w = np.asarray(waypoints, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InputError(f"waypoints: expected a (K,3) array of numbers (t_s, x_m, y_m), got {e}") from None
    if w.ndim != 2 or w.shape[1] != 3 or len(w) == 0:
        raise InputError(f"waypoints: expected shape (K,3) with K >= 1 (t_s, x_m, y_m), got {w.shape}")
    if not np.isfinite(w).all():
        raise InputError("waypoints: expected finite values, got NaN or inf")
    t = w[:, 0]
    if t[0] <= 0 or np.any(np.diff(t) <= 0):
        raise InputError(f"waypoints: expected times t_s > 0 and strictly increasing, got {t.tolist()}")
    return w


def _circle_exit(a: np.ndarray, d: np.ndarray, radius: float) -> float:
    """u >= 0 where a + u d crosses the circle |x| = radius about the origin, outward (|a| < radius, d != 0)."""
    A, B, C = d @ d, 2.0 * (a @ d), a @ a - radius * radius
    return (-B + math.sqrt(B * B - 4.0 * A * C)) / (2.0 * A)


def _lookahead_point(poly: np.ndarray, ld: float) -> Optional[np.ndarray]:
    """Where the polyline ``poly`` (M,2), starting at the origin, first leaves the circle of radius ``ld``;
    past its end, along its last non-degenerate segment extended. None if every point is at the origin."""
    r = np.hypot(poly[:, 0], poly[:, 1])
    out = np.nonzero(r >= ld)[0]
    if len(out):
        i = out[0]  # poly[i-1] is inside (poly[0] is the origin): the segment i-1 -> i crosses the circle
        a, d = poly[i - 1], poly[i] - poly[i - 1]
        return a + min(_circle_exit(a, d, ld), 1.0) * d
    seg = np.diff(poly, axis=0)
    moving = np.nonzero(np.hypot(seg[:, 0], seg[:, 1]) > 0)[0]
    if not len(moving):
        return None
    j = moving[-1]
    return poly[-1] + _circle_exit(poly[-1], seg[j], ld) * seg[j]


class TrajectoryTracker:
    """Follows timed ego-frame waypoints with a ``BicycleModel``-like vehicle.

    Lateral: pure pursuit about the rear axle on the polyline from the origin through the waypoints.
    The lookahead point is where that polyline leaves the circle of radius
    ld = max(min_lookahead_m, lookahead_s * speed) (the last segment extended if it ends inside), and the
    target steer is atan(2 L sin(alpha) / ld), alpha its bearing; the command is the steer rate that
    reaches it in one step (the model clips rate and angle).

    Longitudinal: the target speed is the plan's mean speed up to t* = lookahead_s clipped to the
    waypoints' time span: the arc length along the polyline (linear in time between waypoints) at t*,
    divided by t*. Averaging over a second is robust to waypoint spacing and noise, is exact for a
    constant-speed plan (and, for a plan with constant acceleration, is its speed at t*/2: a small lead
    that offsets the PID's lag), and folds the ego's lag or lead on a timed plan into the target. A first
    waypoint behind the ego counts as negative progress, so a plan the ego has overrun asks for a stop.
    A PID on the speed error gives the acceleration; the integral is clamped so that ki * integral stays
    within the acceleration limits, and it does not grow while the output is saturated (anti-windup).
    A target below ``STANDSTILL_MPS`` means stop: at least the deceleration that stops within the step,
    and the PID state is cleared.
    """

    def __init__(self, params: VehicleParams = VehicleParams(), lookahead_s: float = 1.0,
                 min_lookahead_m: float = 3.0, kp: float = 1.0, ki: float = 0.1, kd: float = 0.0):
        if not isinstance(params, VehicleParams):
            raise InputError(f"params: expected a VehicleParams, got {type(params).__name__}")
        for name, v, what in (("lookahead_s", lookahead_s, "a finite time > 0 s"),
                              ("min_lookahead_m", min_lookahead_m, "a finite distance > 0 m")):
            if not (_is_real(v) and math.isfinite(v) and v > 0):
                raise InputError(f"TrajectoryTracker.{name}: expected {what}, got {v!r}")
        for name, v in (("kp", kp), ("ki", ki), ("kd", kd)):
            if not (_is_real(v) and math.isfinite(v) and v >= 0):
                raise InputError(f"TrajectoryTracker.{name}: expected a finite gain >= 0, got {v!r}")
        self.params, self.lookahead_s, self.min_lookahead_m = params, float(lookahead_s), float(min_lookahead_m)
        self.kp, self.ki, self.kd = float(kp), float(ki), float(kd)
        self.reset()

    def reset(self) -> None:
        """Clear the speed PID's integral and previous error (a new run, or after a teleport)."""
        self._integral = 0.0
        self._prev_error: Optional[float] = None

    def target_speed(self, waypoints: np.ndarray) -> float:
        """The plan's mean speed (m/s) from now to t* (see the class docstring), in [0, max_speed]."""
        w = _check_waypoints(waypoints)
        first = math.copysign(math.hypot(w[0, 1], w[0, 2]), w[0, 1])  # behind the ego: negative progress
        s = np.concatenate([[0.0, first], first + np.cumsum(np.hypot(*np.diff(w[:, 1:], axis=0).T))])
        t = np.concatenate([[0.0], w[:, 0]])
        t_star = min(max(self.lookahead_s, t[1]), t[-1])
        return min(max(float(np.interp(t_star, t, s)) / t_star, 0.0), self.params.max_speed_mps)

    def controls(self, state: EgoState, waypoints: np.ndarray, dt_s: float) -> Controls:
        """Controls for the next ``dt_s`` s towards ``waypoints`` (K,3): rows (t_s after now, x_m, y_m) in
        the ego (rear-axle) frame, t_s > 0 and strictly increasing."""
        p = self.params
        dt = check_dt(dt_s)
        w = _check_waypoints(waypoints)
        poly = np.vstack([[0.0, 0.0], w[:, 1:]])

        ld = max(self.min_lookahead_m, self.lookahead_s * state.speed_mps)
        target = _lookahead_point(poly, ld)
        if target is None:  # the plan is "stay here": keep the wheels where they are
            steer = state.steer_rad
        else:
            sin_alpha = target[1] / ld  # |target| == ld
            steer = math.atan(2.0 * p.wheelbase_m * sin_alpha / ld)
        steer = min(max(steer, -p.max_steer_rad), p.max_steer_rad)

        v_target = self.target_speed(w)
        error = v_target - state.speed_mps
        if v_target < STANDSTILL_MPS:
            self.reset()
            accel = min(self.kp * error, -state.speed_mps / dt)
        else:
            deriv = 0.0 if self._prev_error is None else (error - self._prev_error) / dt
            self._prev_error = error
            integral = self._integral + error * dt
            if self.ki > 0:
                integral = min(max(integral, -p.max_decel_mps2 / self.ki), p.max_accel_mps2 / self.ki)
            raw = self.kp * error + self.ki * integral + self.kd * deriv
            saturated = raw > p.max_accel_mps2 or raw < -p.max_decel_mps2
            if not (saturated and error * raw > 0):  # integrate only while it can still act
                self._integral = integral
            accel = raw
        accel = min(max(accel, -p.max_decel_mps2), p.max_accel_mps2)
        return Controls(accel_mps2=accel, steer_rate_rps=(steer - state.steer_rad) / dt)


def _route_progress(t: np.ndarray, speed: float, to_end: float, decel: float) -> np.ndarray:
    """Distance (m) covered at times ``t`` (s) by cruising at ``speed`` and then braking at ``decel`` to stop
    exactly ``to_end`` m ahead (braking from the start, from the speed that stops there, if it is too close)."""
    if speed == 0.0:
        return np.zeros_like(t)
    brake = speed * speed / (2.0 * decel)
    t_cruise = max(to_end - brake, 0.0) / speed
    v_brake = speed if to_end > brake else math.sqrt(2.0 * decel * to_end)
    tau = np.clip(t - t_cruise, 0.0, v_brake / decel)
    s = speed * np.minimum(t, t_cruise) + v_brake * tau - 0.5 * decel * tau * tau
    return np.minimum(s, to_end)


def path_waypoints(path_xy_world: np.ndarray, state: EgoState, speed_mps: float, horizon_s: float = 3.0,
                   dt_s: float = 0.5, stop_decel_mps2: float = 2.0) -> np.ndarray:
    """Timed ego-frame waypoints (K,3) (t_s, x_m, y_m) driving the world-frame route ``path_xy_world`` (N,2)
    at ``speed_mps`` from the point on it nearest the ego's rear axle.

    Waypoints are every ``dt_s`` s up to ``horizon_s`` (K = floor(horizon_s / dt_s), at least 1). The
    route's end is a stop, reached braking at ``stop_decel_mps2`` (m/s^2, > 0). The nearest point is the
    global one: for a route that passes the same place twice, pass only the part ahead.
    """
    try:
        path = np.asarray(path_xy_world, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InputError(f"path_xy_world: expected an (N,2) array of numbers, got {e}") from None
    if path.ndim != 2 or path.shape[1] != 2:
        raise InputError(f"path_xy_world: expected shape (N,2), got {path.shape}")
    if not np.isfinite(path).all():
        raise InputError("path_xy_world: expected finite values, got NaN or inf")
    if not (_is_real(speed_mps) and math.isfinite(speed_mps) and speed_mps >= 0):
        raise InputError(f"speed_mps: expected a finite speed >= 0 m/s, got {speed_mps!r}")
    if not (_is_real(stop_decel_mps2) and math.isfinite(stop_decel_mps2) and stop_decel_mps2 > 0):
        raise InputError(f"stop_decel_mps2: expected a finite deceleration > 0 m/s^2, got {stop_decel_mps2!r}")
    horizon_s, dt_s = _check_positive_time("horizon_s", horizon_s), _check_positive_time("dt_s", dt_s)
    if len(path):  # repeated points would give zero-length segments, which neither project nor interpolate
        path = path[np.concatenate([[True], np.any(np.diff(path, axis=0) != 0, axis=1)])]
    if len(path) < 2:
        raise InputError(f"path_xy_world: expected at least 2 distinct points, got {len(path)}")

    q = np.array([state.x_m, state.y_m])
    seg = np.diff(path, axis=0)
    seg_len = np.hypot(seg[:, 0], seg[:, 1])
    u = np.clip(np.einsum("ij,ij->i", q - path[:-1], seg) / seg_len ** 2, 0.0, 1.0)
    gap = path[:-1] + u[:, None] * seg - q
    i = int(np.argmin(np.einsum("ij,ij->i", gap, gap)))
    s_along = np.concatenate([[0.0], np.cumsum(seg_len)])
    s0 = s_along[i] + u[i] * seg_len[i]

    t = dt_s * np.arange(1, max(1, math.floor(horizon_s / dt_s + 1e-9)) + 1)
    s = s0 + _route_progress(t, float(speed_mps), s_along[-1] - s0, float(stop_decel_mps2))
    d = np.stack([np.interp(s, s_along, path[:, 0]), np.interp(s, s_along, path[:, 1])], axis=1) - q
    c, sn = math.cos(state.yaw_rad), math.sin(state.yaw_rad)
    return np.stack([t, c * d[:, 0] + sn * d[:, 1], -sn * d[:, 0] + c * d[:, 1]], axis=1)
