"""CommonRoad's vehicle models as the closed loop's ego (gsim.bridges.closed_loop.vehicle_models): a step against the
package's own derivative under a reference integrator, ST against KS at walking pace, ST's side slip in a double lane
change at 20 m/s, no reversing, every model and parameter set running, and clear errors for bad input."""
import math

import numpy as np
import pytest

pytest.importorskip("vehiclemodels", reason="needs the dynamics extra (commonroad-vehicle-models)")

from gsim.bridges.closed_loop.dynamics import Controls, EgoState, VehicleParams  # noqa: E402
from gsim.bridges.closed_loop.vehicle_models import (MODELS, SUBSTEP_S, VEHICLES, CommonRoadModel,  # noqa: E402
                                                     vehicle_limits, vehicle_parameters)
from gsim.errors import InputError  # noqa: E402


def params(vehicle: int) -> VehicleParams:
    return VehicleParams.from_dict({**VehicleParams().to_dict(), **vehicle_limits(vehicle)})


def drive(model, v0, controls_at, n, dt=0.1):
    """States (rear axle) and CommonRoad states every step from (0, 0) heading +x at v0 m/s."""
    s, states, xs = EgoState(0.0, 0.0, 0.0, v0), [], []
    model.start(s)
    states.append(s), xs.append(list(model.x))
    for k in range(n):
        s = model.step(s, controls_at(k * dt), dt)
        states.append(s), xs.append(list(model.x))
    return states, xs


def cross_track(path, pts):
    """Distance (m) from each point (M,2) to the polyline (N,2)."""
    a, seg = path[:-1], np.diff(path, axis=0)
    u = np.clip(np.einsum("mnk,nk->mn", pts[:, None] - a, seg) / (seg ** 2).sum(1), 0, 1)
    return np.linalg.norm(a + u[..., None] * seg - pts[:, None], axis=2).min(1)


def xy(states):
    return np.array([[s.x_m, s.y_m] for s in states])


def turn(t):  # steer left to 0.1 rad, hold (a 26 m radius), steer back
    return Controls(0.0, 0.1 if t < 1.0 else -0.1 if 3.0 <= t < 4.0 else 0.0)


def double_lane_change(t):  # left, right, hold, right, left: a lane's width over and back at 20 m/s
    rates = [(0.0, 0.4, 0.3), (0.4, 1.2, -0.3), (1.2, 1.6, 0.3), (2.5, 2.9, -0.3), (2.9, 3.7, 0.3), (3.7, 4.1, -0.3)]
    return Controls(0.0, next((r for a, b, r in rates if a <= t < b), 0.0))


@pytest.mark.parametrize("model", MODELS)
def test_a_step_is_the_packages_derivative_integrated_exactly(model):
    """One 0.1 s step from a state in a turn equals scipy's DOP853 (rtol 1e-11) on the package's own f with the same
    inputs: the sub-steps integrate CommonRoad's model, nothing of gsim's own."""
    from scipy.integrate import solve_ivp
    m = CommonRoadModel(model, 2, params(2))
    states, xs = drive(m, 12.0, turn, 4)  # mid-manoeuvre: steering, yaw rate, slip all non-zero
    u = [0.2, 1.5]
    ref = solve_ivp(lambda t, x: m.f(list(x), u, m.p), (0.0, 0.1), xs[-1], method="DOP853", rtol=1e-11,
                    atol=1e-12).y[:, -1]
    m.step(states[-1], Controls(1.5, 0.2), 0.1)
    assert m.substeps == math.ceil(0.1 / SUBSTEP_S[model] - 1e-9) and m.u == (0.2, 1.5)
    assert np.abs(np.array(m.x) - ref).max() < 1e-6


def test_single_track_follows_the_kinematic_path_at_walking_pace():
    """At 3 m/s the tyres hardly slip: ST's rear axle stays within a few cm of KS's path through a bend (measured:
    3.8 cm at most, ST's tyres understeering its 26 m radius by 0.2 %)."""
    ks, _ = drive(CommonRoadModel("ks", 2, params(2)), 3.0, turn, 60)
    st, xs = drive(CommonRoadModel("st", 2, params(2)), 3.0, turn, 60)
    assert abs(ks[-1].yaw_rad - st[-1].yaw_rad) < 0.01 and ks[-1].yaw_rad > 0.3  # the bend was driven
    assert cross_track(xy(ks), xy(st)).max() < 0.06
    kinematic_slip = math.atan(1.4227170936 / 2.5789128 * math.tan(0.1))  # atan(b/l tan(steer)), vehicle 2
    assert max(abs(x[6]) for x in xs) < kinematic_slip + 0.002


def test_a_double_lane_change_at_speed_shows_the_single_tracks_side_slip():
    ks, ks_x = drive(CommonRoadModel("ks", 2, params(2)), 20.0, double_lane_change, 60)
    st, st_x = drive(CommonRoadModel("st", 2, params(2)), 20.0, double_lane_change, 60)
    assert max(s.y_m for s in ks) > 2.0  # the manoeuvre moved the car sideways a lane's width
    assert len(ks_x[0]) == 5  # KS has no slip state: its rear axle moves along its heading
    slip = np.array([x[6] for x in st_x])
    assert np.abs(slip).max() > 0.01 and np.sign(slip).min() < 0 < np.sign(slip).max()  # slips both ways
    assert cross_track(xy(ks), xy(st)).max() > 0.05  # and so leaves the kinematic path


@pytest.mark.parametrize("model", MODELS)
def test_braking_stops_without_reversing_and_it_starts_again(model):
    m = CommonRoadModel(model, 1, params(1))
    states, xs = drive(m, 5.0, lambda t: Controls(-8.0, 0.0), 20)
    # (STD's wheels creep it back 65 nm a step at rest before each sub-step ends at rest again)
    assert states[-1].speed_mps == 0.0 and all(b.x_m >= a.x_m - 1e-6 for a, b in zip(states, states[1:]))
    assert 1.4 < states[-1].x_m < 1.8  # 5 m/s at 8 m/s^2: 1.56 m (KS); the others' CoM runs on a little
    s = m.step(states[-1], Controls(1.0, 0.0), 0.1)
    assert 0.05 < s.speed_mps < 0.15 and s.x_m > states[-1].x_m


@pytest.mark.parametrize("vehicle", sorted(VEHICLES))
def test_every_parameter_set_drives_the_models_it_has_parameters_for(vehicle):
    for model in MODELS:
        if model != "ks" and vehicle == 4:
            with pytest.raises(InputError, match="vehicle 4 .semi-trailer truck. has no inertia, tyre and wheel"):
                CommonRoadModel(model, vehicle, params(vehicle))
            continue
        states, _ = drive(CommonRoadModel(model, vehicle, params(vehicle)), 10.0, turn, 50)
        driven = np.linalg.norm(np.diff(xy(states), axis=0), axis=1).sum()
        assert states[-1].yaw_rad > 0.5 and 45.0 < driven < 51.0, (model, vehicle, states[-1], driven)


def test_the_limits_are_the_parameter_sets():
    p = vehicle_parameters(2)
    lim = vehicle_limits(2)
    assert lim["wheelbase_m"] == pytest.approx(2.5789128) and lim["max_steer_rad"] == pytest.approx(1.066)
    assert lim["max_steer_rate_rps"] == pytest.approx(0.4) and lim["max_accel_mps2"] == p.longitudinal.a_max
    # the package's constraints act inside its f: a command beyond them steers at the limit
    m = CommonRoadModel("ks", 2, params(2))
    s = m.step(EgoState(0.0, 0.0, 0.0, 5.0), Controls(0.0, 3.0), 0.5)
    assert s.steer_rad == pytest.approx(0.2)


def test_bad_models_and_vehicles_are_refused_by_name():
    with pytest.raises(InputError, match="dynamics: expected bicycle or one of CommonRoad's models ks, st, std, mb"):
        CommonRoadModel("dt", 2, params(2))
    with pytest.raises(InputError, match="vehicle: expected one of CommonRoad's parameter sets 1 .Ford Escort."):
        vehicle_limits(5)
    m = CommonRoadModel("st", 2, params(2))
    with pytest.raises(InputError, match="dt_s"):
        m.step(EgoState(0.0, 0.0, 0.0, 5.0), Controls(0.0, 0.0), 0.0)
