"""CommonRoad's vehicle models as the closed loop's ego dynamics (``commonroad-vehicle-models``, module
``vehiclemodels``; the ``dynamics`` extra): kinematic single track KS, single track ST (tyre slip), single track
with drivetrain STD and multi-body MB, with CommonRoad's parameter sets 1-4 (`VEHICLES`).

The package gives each model's derivative f(x, u, p) (its input constraints, steering angle and rate and the
acceleration's power limit, applied inside f) and its initial states; this module integrates f over one loop step
with `SUBSTEP_S`-long classical Runge-Kutta sub-steps, the inputs u = (steering velocity rad/s, longitudinal
acceleration m/s^2) held over the step, and turns CommonRoad's state into the loop's `EgoState`:
- reference point: KS's is the rear axle, as `EgoState`'s; ST's, STD's and MB's is the centre of mass, ``p.b``
  ahead of the rear axle along the heading (the rear axle is placed there from the yaw);
- speed: the rear axle's speed along the heading (KS: x4; ST, STD: x4 cos(slip); MB: x4, its longitudinal speed);
- no reversing, as the bicycle model: a sub-step that would take the longitudinal speed below 0 ends at rest
  (speeds, yaw rate, slip and wheel speeds 0; the pose and steering angle kept), and a sub-step that starts at rest
  under a negative acceleration is integrated with an acceleration of 0 (a brake holds the car).
Frames and units as `gsim.bridges.closed_loop.dynamics`: world x-y plane, metres, radians, yaw from +x
counter-clockwise (CommonRoad's own convention).
"""
from __future__ import annotations

import importlib
import math
from typing import Callable, List, Optional, Tuple

from gsim.errors import InputError

from .dynamics import Controls, EgoState, VehicleParams, check_dt, wrap_angle

MODELS = ("ks", "st", "std", "mb")  # the loop's --dynamics besides "bicycle" (dynamics.BicycleModel)
VEHICLES = {1: "Ford Escort", 2: "BMW 320i", 3: "VW Vanagon", 4: "semi-trailer truck"}  # CommonRoad's ids
# the Runge-Kutta sub-step per model (s): ST's, STD's and MB's tyre terms divide by the speed, so they are stiff at
# walking pace. Measured (vehicle 2, 2 s from rest at 1 m/s^2 and 0.1 rad/s of steering): twice these diverge,
# half of them moves the end by under 3 mm
SUBSTEP_S = {"ks": 0.01, "st": 0.001, "std": 0.0005, "mb": 0.0005}
INTEGRATOR = "rk4"
# the `VehicleParams` fields a CommonRoad parameter set gives (`vehicle_limits`)
LIMIT_FIELDS = ("wheelbase_m", "max_steer_rad", "max_steer_rate_rps", "max_accel_mps2", "max_decel_mps2",
                "max_speed_mps")
# the state's entries that are velocities (set to 0 at rest), by model, 0-based in CommonRoad's order
_MOTION = {"ks": (3,), "st": (3, 5, 6), "std": (3, 5, 6, 7, 8),
           "mb": (3, 5, 7, 9, 10, 12, 14, 15, 17, 19, 20, 22, 23, 24, 25, 26)}


def vehicle_parameters(vehicle: int):
    """CommonRoad's parameter set ``vehicle`` (1-4, `VEHICLES`)."""
    if vehicle not in VEHICLES:
        raise InputError(f"vehicle: expected one of CommonRoad's parameter sets "
                         f"{', '.join(f'{k} ({v})' for k, v in VEHICLES.items())}, got {vehicle!r}")
    from vehiclemodels.vehicle_parameters import setup_vehicle_parameters
    return setup_vehicle_parameters(vehicle_id=vehicle)


def vehicle_limits(vehicle: int) -> dict:
    """`VehicleParams` fields from CommonRoad's parameter set: the wheelbase and the input constraints (steering
    angle and rate, acceleration; CommonRoad brakes as hard as it accelerates), so that the loop's tracker and its
    check of an agent's controls use the model's own limits."""
    p = vehicle_parameters(vehicle)
    return dict(zip(LIMIT_FIELDS, (p.a + p.b, min(-p.steering.min, p.steering.max),
                                   min(-p.steering.v_min, p.steering.v_max), p.longitudinal.a_max,
                                   p.longitudinal.a_max, p.longitudinal.v_max)))


def _rk4(f: Callable, x: List[float], u: List[float], p, h: float) -> List[float]:
    k1 = f(x, u, p)
    k2 = f([a + h / 2 * b for a, b in zip(x, k1)], u, p)
    k3 = f([a + h / 2 * b for a, b in zip(x, k2)], u, p)
    k4 = f([a + h * b for a, b in zip(x, k3)], u, p)
    return [a + h / 6 * (b + 2 * c + 2 * d + e) for a, b, c, d, e in zip(x, k1, k2, k3, k4)]


class CommonRoadModel:
    """One of CommonRoad's models (`MODELS`) with parameter set ``vehicle``: ``step(state, controls, dt_s)`` as
    `dynamics.BicycleModel.step`. The model keeps CommonRoad's full state (``x``, in CommonRoad's order) from
    step to step: ``state`` must be the one the last `step` returned, or a new start (`start` is then called
    for it: the model's remaining states from its rest, e.g. no yaw rate or slip)."""

    def __init__(self, model: str, vehicle: int, params: VehicleParams):
        if model not in MODELS:
            raise InputError(f"dynamics: expected bicycle or one of CommonRoad's models {', '.join(MODELS)}, "
                             f"got {model!r}")
        self.model, self.vehicle, self.params = model, vehicle, params
        self.p = vehicle_parameters(vehicle)
        needs = {"ks": (), "st": ("I_z", "h_s"), "std": ("I_z", "h_s", "R_w"), "mb": ("I_z", "h_s", "R_w")}[model]
        if any(getattr(self.p, k, None) is None for k in needs):
            raise InputError(f"dynamics {model}: CommonRoad's vehicle {vehicle} ({VEHICLES[vehicle]}) has no inertia, "
                             f"tyre and wheel parameters (commonroad-vehicle-models defines them for vehicles 1-3); "
                             f"use ks for it")
        self.f = getattr(importlib.import_module(f"vehiclemodels.vehicle_dynamics_{model}"),
                         f"vehicle_dynamics_{model}")
        self.x: Optional[List[float]] = None
        self._last: Optional[EgoState] = None
        self.u: Tuple[float, float] = (0.0, 0.0)  # the inputs of the last step (steering velocity, acceleration)
        self.substeps = 0  # of the last step

    @property
    def cog_ahead_m(self) -> float:
        """How far the model's reference point lies ahead of the rear axle (m)."""
        return 0.0 if self.model == "ks" else float(self.p.b)

    def start(self, state: EgoState) -> None:
        """CommonRoad's state for ``state`` (rear axle, its speed along the heading, steering angle), rolling without
        slip as the kinematic model has it (slip angle atan(b/l tan(steer)), yaw rate v tan(steer)/l, the centre of
        mass at v / cos(slip): the inverse of `_ego`), by the package's own init functions."""
        c, s = math.cos(state.yaw_rad), math.sin(state.yaw_rad)
        d, lwb = self.cog_ahead_m, self.p.a + self.p.b
        slip = math.atan(self.p.b / lwb * math.tan(state.steer_rad))
        v = state.speed_mps / math.cos(slip) if self.model in ("st", "std") else state.speed_mps
        core = [state.x_m + d * c, state.y_m + d * s, state.steer_rad, v, state.yaw_rad]
        turning = [state.speed_mps * math.tan(state.steer_rad) / lwb, slip]
        init = importlib.import_module(f"vehiclemodels.init_{self.model}")
        if self.model == "ks":
            self.x = list(init.init_ks(core))
        elif self.model == "st":
            self.x = list(init.init_st(core + turning))
        else:
            self.x = list(getattr(init, f"init_{self.model}")(core + turning, self.p))
        self._last = state

    def step(self, state: EgoState, controls: Controls, dt_s: float) -> EgoState:
        """The state ``dt_s`` seconds after ``state`` under ``controls`` (accel_mps2, steer_rate_rps: CommonRoad's
        u, constrained by the package)."""
        dt = check_dt(dt_s)
        controls.check()
        if self.x is None or state is not self._last:
            self.start(state)
        n = max(1, math.ceil(dt / SUBSTEP_S[self.model] - 1e-9))
        u = [float(controls.steer_rate_rps), float(controls.accel_mps2)]
        x, hold = self.x, [u[0], 0.0]
        for _ in range(n):
            # no reversing (as BicycleModel): a brake holds a car at rest, and a sub-step that would take it below
            # 0 m/s ends at rest
            x = _rk4(self.f, x, hold if u[1] < 0.0 and self._forward_speed(x) <= 0.0 else u, self.p, dt / n)
            if self._forward_speed(x) < 0.0:
                for i in _MOTION[self.model]:
                    x[i] = 0.0
        if not all(math.isfinite(v) for v in x):
            raise InputError(f"dynamics {self.model}: the state became non-finite in a step of {dt} s from "
                             f"{state.to_dict()} under {controls} (vehicle {self.vehicle})")
        self.x, self.u, self.substeps = x, (u[0], u[1]), n
        self._last = self._ego(x, state.timestamp_us + round(dt * 1e6))
        return self._last

    def _forward_speed(self, x: List[float]) -> float:
        """The rear axle's speed along the heading."""
        return x[3] * math.cos(x[6]) if self.model in ("st", "std") else x[3]

    def _ego(self, x: List[float], timestamp_us: int) -> EgoState:
        from vehiclemodels.utils.acceleration_constraints import acceleration_constraints
        yaw, d, v = x[4], self.cog_ahead_m, max(self._forward_speed(x), 0.0)
        a = acceleration_constraints(x[3], self.u[1], self.p.longitudinal) if v > 0 else 0.0
        return EgoState(x_m=x[0] - d * math.cos(yaw), y_m=x[1] - d * math.sin(yaw), yaw_rad=wrap_angle(yaw),
                        speed_mps=v, steer_rad=x[2], accel_mps2=float(a), timestamp_us=timestamp_us)

    def yaw_rate(self, state: EgoState) -> float:
        """The yaw rate (rad/s) of the last step's end: the model's own (x6) where it has one, else kinematic."""
        if self.model == "ks" or self.x is None:
            return state.speed_mps * math.tan(state.steer_rad) / self.params.wheelbase_m
        return float(self.x[5])

    def record(self, state: EgoState, controls: Optional[Controls], dt_s: float) -> dict:
        """As `dynamics.BicycleModel.record`: x CommonRoad's state that ``state`` stands for, u the inputs given to
        the package's f over the step that ended there (None at the start)."""
        if self.x is None or state is not self._last:
            self.start(state)
        return {"model": self.model, "x": list(self.x), "u": None if controls is None else list(self.u),
                "dt": dt_s, "substeps": 0 if controls is None else self.substeps, "integrator": INTEGRATOR}
