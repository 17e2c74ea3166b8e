"""SUMO traffic for the closed loop: network geometry from a driven path, pose conventions (front bumper and
navigational angle vs gsim's box centre and yaw), reactive traffic, the ego's life on its route, determinism
and failures."""
import math
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

pytest.importorskip("sumolib", reason="SUMO's sumolib is not installed (pip install 'gsim[sumo]')")
pytest.importorskip("libsumo", reason="libsumo is not installed (pip install 'gsim[sumo]')")

from gsim.bridges.closed_loop.sumo import RoadSpec, SumoError, SumoTraffic, build_network, run_netconvert, load_network

W = 3.5  # lane width used throughout


def _straight(n=2001, length=200.0, heading=0.0):
    """A dense log-like path (10 cm spacing) from the origin along `heading` (rad)."""
    s = np.linspace(0.0, length, n)
    return np.stack([s * math.cos(heading), s * math.sin(heading)], axis=1)


def _arc(radius=300.0, length=200.0, n=1000):
    """A gently left-curving path starting at (10, -5) heading +x."""
    th = np.linspace(0.0, length / radius, n)
    return np.stack([radius * np.sin(th) + 10.0, radius * (1.0 - np.cos(th)) - 5.0], axis=1)


def _log_like(path, noise_m=0.005, seed=0):
    """A path as a log records it: the ego waits at the start (repeated poses) and positions jitter."""
    rng = np.random.default_rng(seed)
    path = np.vstack([np.repeat(path[:1], 50, axis=0), path])
    return path + rng.normal(0.0, noise_m, path.shape)


def _length(p):
    return float(np.linalg.norm(np.diff(p, axis=0), axis=1).sum())


def _polyline(points):
    keep = np.concatenate([[True], np.linalg.norm(np.diff(points, axis=0), axis=1) > 1e-9])
    return points[keep]


def _project(pts, line):
    """(distance, signed lateral offset (+ left), arc length) of each point to a polyline."""
    a, b = line[:-1], line[1:]
    ab = b - a
    den = np.sum(ab * ab, axis=1)
    t = np.clip(np.einsum("nmk,mk->nm", pts[:, None] - a[None], ab) / den, 0.0, 1.0)
    d2 = np.sum((a[None] + t[..., None] * ab[None] - pts[:, None]) ** 2, axis=-1)
    j = np.argmin(d2, axis=1)
    rows = np.arange(len(pts))
    rel = pts - a[j]
    cross = (ab[j, 0] * rel[:, 1] - ab[j, 1] * rel[:, 0]) / np.sqrt(den[j])
    cum = np.concatenate([[0.0], np.cumsum(np.sqrt(den))])
    return np.sqrt(d2[rows, j]), cross, cum[j] + t[rows, j] * np.sqrt(den[j])


def _lane_line(net, route, lane):
    shapes = dict((i, s) for i, s, _ in net.lanes())
    return _polyline(np.vstack([shapes[f"{e}_{lane}"] for e in route]))


def _resample(line, step=1.0):
    cum = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(line, axis=0), axis=1))])
    s = np.linspace(0.0, cum[-1], int(cum[-1] / step) + 2)
    return np.stack([np.interp(s, cum, line[:, 0]), np.interp(s, cum, line[:, 1])], axis=1)


@pytest.fixture(scope="module")
def straight_net(tmp_path_factory):
    return build_network(_straight(), RoadSpec(lanes=1, opposite_lanes=1), tmp_path_factory.mktemp("straight"))


@pytest.fixture(scope="module")
def curved_net(tmp_path_factory):
    spec = RoadSpec(lanes=2, ego_lane=1, opposite_lanes=1)
    return build_network(_arc(), spec, tmp_path_factory.mktemp("curved"))


# -- network geometry ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", ["straight", "curved"])
def test_network_lanes_follow_the_driven_path(shape, tmp_path):
    path = _straight() if shape == "straight" else _log_like(_arc())
    spec = RoadSpec(lanes=2, ego_lane=1, opposite_lanes=1) if shape == "curved" else RoadSpec(lanes=2, opposite_lanes=2)
    net = build_network(path, spec, tmp_path)
    assert net.path == tmp_path / "road.net.xml" and net.path.is_file()
    assert not list(tmp_path.glob("*.tmp.xml"))  # the atomic write left no temp file
    assert len(net.forward_route) >= 8 and len(net.opposite_route) == len(net.forward_route)
    assert all(net.lane_count(e) == spec.lanes for e in net.forward_route)
    assert all(net.lane_count(e) == spec.opposite_lanes for e in net.opposite_route)
    assert {round(w, 6) for _, _, w in net.lanes()} == {W}
    clean_length = _length(_straight() if shape == "straight" else _arc())
    assert net.length_m == pytest.approx(clean_length + 2 * spec.extend_m, abs=1.0)

    ego = _lane_line(net, net.forward_route, spec.ego_lane)
    dist, _, _ = _project(path[::5], ego)  # driven path -> ego lane centre
    assert dist.max() < 0.05, dist.max()
    dist, _, s = _project(_resample(ego), _polyline(path))  # ego lane centre -> driven path, where they overlap
    inside = (s > 0.5) & (s < s.max() - 0.5)
    assert inside.sum() > 100 and dist[inside].max() < 0.05

    # every lane lies parallel to the ego lane at its offset; the opposite carriageway is to the left
    for route, n, first, forward in ((net.forward_route, spec.lanes, -spec.ego_lane, True),
                                     (net.opposite_route, spec.opposite_lanes, spec.lanes - spec.ego_lane, False)):
        for lane in range(n):
            line = _resample(_lane_line(net, route, lane))
            _, lateral, s = _project(line, ego)
            inside = (s > 1.0) & (s < s.max() - 1.0)
            # lane 0 is the rightmost in its own driving direction
            expected = (first + lane) * W if forward else (first + n - 1 - lane) * W
            assert np.abs(lateral[inside] - expected).max() < 0.05, (lane, expected)
    # driving directions: the forward lanes run along the path, the opposite ones against it
    fwd = _lane_line(net, net.forward_route, 0)
    opp = _lane_line(net, net.opposite_route, 0)
    d = path[-1] - path[0]
    assert (fwd[-1] - fwd[0]) @ d > 0 and (opp[-1] - opp[0]) @ d < 0


def test_network_round_trips_through_load_network(straight_net):
    again = load_network(straight_net.path)
    assert again.forward_route == straight_net.forward_route
    assert again.opposite_route == straight_net.opposite_route
    assert again.length_m == pytest.approx(straight_net.length_m, abs=1e-6)
    xy = np.array([[1.0, 2.0], [-30.0, 4.5]])
    np.testing.assert_allclose(again.to_sumo(xy), xy)
    np.testing.assert_allclose(again.route_distance([[0.0, 0.0], [100.0, 0.3]]), [150.0, 250.0], atol=1e-6)


def test_load_network_honours_net_offset_and_transform(straight_net, tmp_path):
    """A net written with netconvert's default normalization has a netOffset; to_world undoes it."""
    import sumolib
    out = tmp_path / "shifted.net.xml"
    subprocess.run([sumolib.checkBinary("netconvert"), "-n", str(straight_net.path.with_name("road.nod.xml")),
                    "-e", str(straight_net.path.with_name("road.edg.xml")), "-o", str(out),
                    "--xml-validation", "never", "--precision", "4"], check=True, capture_output=True)
    shifted = load_network(out)
    assert np.abs(shifted._offset).max() > 100.0  # the normalization moved the net
    theirs = {i: s for i, s, _ in shifted.lanes()}
    for lane_id, shape, _ in straight_net.lanes():
        np.testing.assert_allclose(theirs[lane_id], shape, atol=2e-3)

    yaw = math.radians(30.0)
    T = np.eye(4)
    T[:2, :2] = [[math.cos(yaw), -math.sin(yaw)], [math.sin(yaw), math.cos(yaw)]]
    T[:3, 3] = [1000.0, -500.0, 3.0]
    moved = load_network(out, T_world_net=T)
    pts = np.array([[0.0, 0.0], [50.0, 1.75], [-120.0, -1.75]])
    world = pts @ T[:2, :2].T + T[:2, 3]
    np.testing.assert_allclose(moved.to_world(shifted.to_sumo(pts)), world, atol=1e-9)
    np.testing.assert_allclose(moved.to_sumo(world), shifted.to_sumo(pts), atol=1e-9)
    assert moved.yaw_to_world(0.0) == pytest.approx(yaw)

    for bad in (np.diag([2.0, 2.0, 1.0, 1.0]), np.diag([1.0, -1.0, 1.0, 1.0]), np.eye(3)):
        with pytest.raises(ValueError, match="T_world_net"):
            load_network(out, T_world_net=bad)
    tilted = np.eye(4)
    tilted[1:3, 1:3] = [[0.0, -1.0], [1.0, 0.0]]
    with pytest.raises(ValueError, match="rotation about z"):
        load_network(out, T_world_net=tilted)


# -- poses ---------------------------------------------------------------------------------------------------

def _raw_pose(traffic, veh_id):
    """Box centre and yaw computed here from SUMO's own front bumper, angle and length (SUMO frame)."""
    v = traffic._api.vehicle
    fx, fy = v.getPosition(veh_id)
    yaw = math.radians(90.0 - v.getAngle(veh_id))
    half = 0.5 * v.getLength(veh_id)
    return fx - half * math.cos(yaw), fy - half * math.sin(yaw), yaw, v.getAngle(veh_id)


@pytest.mark.parametrize("heading_deg", [0.0, 90.0])
def test_vehicle_pose_conventions(heading_deg, tmp_path):
    net = build_network(_straight(heading=math.radians(heading_deg)), RoadSpec(lanes=1, opposite_lanes=1), tmp_path)
    heading = math.radians(heading_deg)
    u = np.array([math.cos(heading), math.sin(heading)])
    left = np.array([-u[1], u[0]])
    with SumoTraffic(net) as traffic:
        traffic.add_vehicle("fwd", "forward", 0, pos_m=100.0, speed_mps=0.0, vclass="truck")
        traffic.add_vehicle("opp", "opposite", 0, pos_m=100.0, speed_mps=0.0, vclass="bus")
        traffic.add_ego(*(30.0 * u), heading, 0.0, length_m=4.6, width_m=1.9)
        by_id = {v.id: v for v in traffic.step()}
        assert set(by_id) == {"fwd", "opp"}

        fwd, opp = by_id["fwd"], by_id["opp"]
        # the forward route starts extend_m (150 m) before the path; its lane centre is the path
        np.testing.assert_allclose([fwd.x, fwd.y], (100.0 - 150.0) * u, atol=0.01)
        assert fwd.yaw == pytest.approx(heading, abs=1e-6)
        assert (fwd.vclass, fwd.length_m, fwd.width_m, fwd.height_m) == ("truck", 8.0, 2.5, 3.5)
        # the opposite lane is one lane width to the left, driving the other way
        np.testing.assert_allclose([opp.x, opp.y], (350.0 - 100.0) * u + W * left, atol=0.01)
        assert abs(math.cos(opp.yaw - (heading + math.pi)) - 1.0) < 1e-9

        for v in (fwd, opp):
            cx, cy, yaw, angle = _raw_pose(traffic, v.id)
            assert (v.x, v.y) == pytest.approx((cx, cy), abs=0.01)
            assert math.cos(v.yaw - yaw) == pytest.approx(1.0, abs=1e-9)
            # SUMO's front bumper is half a length ahead of the box centre
            front = np.array(traffic._api.vehicle.getPosition(v.id))
            np.testing.assert_allclose(front, [v.x + 0.5 * v.length_m * math.cos(v.yaw),
                                               v.y + 0.5 * v.length_m * math.sin(v.yaw)], atol=0.01)
        # navigational angles: east = 90 deg, north = 0 deg (clockwise from north)
        assert _raw_pose(traffic, "fwd")[3] == pytest.approx((90.0 - heading_deg) % 360.0, abs=1e-6)

        ego = traffic.ego_state()
        np.testing.assert_allclose([ego.x, ego.y], 30.0 * u, atol=0.01)
        assert ego.yaw == pytest.approx(heading, abs=1e-6) and ego.length_m == pytest.approx(4.6)
        np.testing.assert_allclose(traffic._api.vehicle.getPosition("ego"), (30.0 + 2.3) * u, atol=0.01)


def test_poses_in_a_rotated_world(straight_net):
    """With T_world_net, scene poses are the transformed SUMO poses (yaw turned by the rotation)."""
    yaw = math.radians(-40.0)
    T = np.eye(4)
    T[:2, :2] = [[math.cos(yaw), -math.sin(yaw)], [math.sin(yaw), math.cos(yaw)]]
    T[:2, 3] = [12.0, 34.0]
    net = load_network(straight_net.path, T_world_net=T)
    with SumoTraffic(net) as traffic:
        traffic.add_vehicle("a", "forward", 0, pos_m=200.0, speed_mps=5.0)
        ego_xy = T[:2, :2] @ [80.0, 0.0] + T[:2, 3]
        traffic.add_ego(ego_xy[0], ego_xy[1], yaw, 3.0)
        (a,) = traffic.step()
        cx, cy, _, _ = _raw_pose(traffic, "a")
        np.testing.assert_allclose([a.x, a.y], T[:2, :2] @ [cx, cy] + T[:2, 3], atol=1e-6)
        np.testing.assert_allclose([a.x, a.y], T[:2, :2] @ [50.0, 0.0] + T[:2, 3], atol=0.01)
        assert a.yaw == pytest.approx(yaw, abs=1e-6) and a.speed_mps == pytest.approx(5.0)
        np.testing.assert_allclose(traffic._api.vehicle.getPosition("ego"), [82.4, 0.0], atol=0.01)
        ego = traffic.ego_state()
        np.testing.assert_allclose([ego.x, ego.y], ego_xy, atol=0.01)
        assert ego.yaw == pytest.approx(yaw, abs=1e-6)


def test_add_at_hands_a_log_actor_to_sumo(straight_net):
    with SumoTraffic(straight_net) as traffic:
        traffic.add_at("fwd_actor", 40.0, 0.2, 0.02, 18.0, "passenger", length_m=4.4, width_m=1.7)
        traffic.add_at("opp_actor", 60.0, 3.4, math.pi - 0.03, 9.0, "truck")
        by_id = {v.id: v for v in traffic.step()}
        f, o = by_id["fwd_actor"], by_id["opp_actor"]
        # SUMO snaps the front bumper onto the lane centre of the route matching the heading and keeps the
        # actor's heading for this step: the box centre is within L/2 * sin(yaw error) of the lane centre
        assert (f.x, f.y, f.yaw, f.length_m, f.width_m) == pytest.approx((40.0, 0.0, 0.02, 4.4, 1.7), abs=0.05)
        assert f.speed_mps == pytest.approx(18.0)  # above the limit: kept (its speed factor is raised)
        assert (o.x, o.y, o.length_m) == pytest.approx((60.0, W - 4.0 * math.sin(0.03), 8.0), abs=0.01)
        assert o.yaw == pytest.approx(math.pi - 0.03, abs=1e-6)
        for _ in range(10):
            by_id = {v.id: v for v in traffic.step()}
        f, o = by_id["fwd_actor"], by_id["opp_actor"]
        assert f.x > 40.0 + 10 * 0.1 * 17.0 and f.speed_mps > 17.0 and f.yaw == pytest.approx(0.0, abs=1e-6)
        assert o.x < 60.0 - 5.0 and abs(o.yaw) == pytest.approx(math.pi, abs=1e-6) and o.y == pytest.approx(W)


# -- behaviour -----------------------------------------------------------------------------------------------

def test_traffic_stops_behind_a_stopped_ego(straight_net):
    ego_x, ego_len = 100.0, 4.8
    with SumoTraffic(straight_net, seed=3) as traffic:
        traffic.add_ego(ego_x, 0.0, 0.0, 0.0, length_m=ego_len)
        s_ego = float(straight_net.route_distance([[ego_x, 0.0]])[0])
        traffic.add_vehicle("follower", "forward", 0, pos_m=s_ego - 70.0, speed_mps=10.0)
        gaps, speeds = [], []
        for _ in range(250):
            traffic.set_ego(ego_x, 0.0, 0.0, 0.0)
            (f,) = [v for v in traffic.step() if v.id == "follower"]
            gaps.append((ego_x - 0.5 * ego_len) - (f.x + 0.5 * f.length_m))
            speeds.append(f.speed_mps)
        assert speeds[0] == pytest.approx(10.0, abs=0.5)
        assert min(gaps) > 0.5, min(gaps)
        assert speeds[-1] < 0.1 and gaps[-1] < 10.0  # it came up to the ego and stopped
        assert traffic.ego_state().speed_mps == 0.0


def test_ego_stays_on_its_route_and_is_readded(curved_net):
    net = curved_net
    line = _lane_line(net, net.forward_route, net.ego_lane)
    cum = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(line, axis=0), axis=1))])
    speed, dt = 25.0, 0.1

    def pose(s):
        x, y = np.interp(s, cum, line[:, 0]), np.interp(s, cum, line[:, 1])
        dx = np.interp(s + 0.5, cum, line[:, 0]) - np.interp(s - 0.5, cum, line[:, 0])
        dy = np.interp(s + 0.5, cum, line[:, 1]) - np.interp(s - 0.5, cum, line[:, 1])
        return float(x), float(y), math.atan2(dy, dx)

    with SumoTraffic(net, step_s=dt) as traffic:
        s = 5.0
        traffic.add_ego(*pose(s), speed)
        roads = []
        while s < cum[-1] - 5.0:
            traffic.step()
            ego = traffic.ego_state()
            assert ego is not None, f"ego vanished at route distance {s:.1f} m"
            assert math.dist((ego.x, ego.y), pose(s)[:2]) < 0.05
            roads.append(traffic._api.vehicle.getRoadID("ego"))
            s = min(s + speed * dt, cum[-1] - 5.0 + 1e-9)
            traffic.set_ego(*pose(s), speed)
        assert traffic.ego_readds == 0
        assert set(net.forward_route) <= set(roads)  # it really drove over every edge

        # left alone, the ego drives off the route's end; the bridge puts it back where it was last put
        for _ in range(5):
            traffic.step()
        assert traffic.ego_readds >= 1
        traffic.set_ego(*pose(250.0), 5.0)
        traffic.step()
        ego = traffic.ego_state()
        assert ego is not None and math.dist((ego.x, ego.y), pose(250.0)[:2]) < 0.05


def _run(net, rng_seed, steps=40, client="libsumo"):
    with SumoTraffic(net, seed=5, client=client) as traffic:
        traffic.add_ego(0.0, 0.0, 0.0, 8.0)
        ids = traffic.spawn_density(40.0, rng_seed=rng_seed, keep_clear_m=(-30.0, 15.0))
        first = traffic.step()
        history = [first]
        for k in range(steps):
            traffic.set_ego(0.8 * (k + 1), 0.0, 0.0, 8.0)
            history.append(traffic.step())
        return ids, history


def test_spawn_density_is_deterministic_and_keeps_clear(straight_net):
    ids, history = _run(straight_net, rng_seed=11)
    ids2, history2 = _run(straight_net, rng_seed=11)
    assert ids == ids2 and history == history2
    _, other = _run(straight_net, rng_seed=12, steps=0)
    assert other[0] != history[0]
    pytest.importorskip("traci", reason="traci is not installed")
    assert _run(straight_net, rng_seed=11, steps=10, client="traci") == (ids, history[:11])  # same SUMO, same run

    first = history[0]
    assert [v.id for v in first] == sorted(ids)  # every vehicle was inserted at the first step
    lanes = 2 * straight_net.length_m / 1000.0
    assert 0.6 * 40.0 * lanes < len(first) <= 1.2 * 40.0 * lanes
    assert {v.vclass for v in first} == {"passenger", "truck", "bus"}
    s = straight_net.route_distance([[v.x, v.y] for v in first])
    half = np.array([v.length_m / 2 for v in first])
    s_ego = 150.0
    assert np.all((s + half < s_ego - 30.0) | (s - half > s_ego + 15.0))
    on_forward = np.array([math.cos(v.yaw) > 0 for v in first])
    assert on_forward.any() and (~on_forward).any()
    # departures near the limit, slower only behind the ego where they must be able to stop for it
    ahead = np.array([v.speed_mps for v, fw, si in zip(first, on_forward, s) if not fw or si > s_ego])
    assert np.all((ahead > 0.85 * 13.9) & (ahead <= 13.9 + 1e-6))


def test_spawned_traffic_behind_a_stopped_ego_can_stop(straight_net):
    ego_x, ego_len = 60.0, 4.8
    with SumoTraffic(straight_net, seed=2) as traffic:
        traffic.add_ego(ego_x, 0.0, 0.0, 0.0, length_m=ego_len)
        ids = traffic.spawn_density(45.0, rng_seed=4, vclass_mix={"passenger": 1.0}, keep_clear_m=(-6.0, 6.0))
        first = traffic.step()
        assert len(first) == len(ids)  # nobody waits for a safe insertion
        behind = [v.id for v in first if math.cos(v.yaw) > 0 and v.x < ego_x]
        assert len(behind) >= 5
        closest, braking = [], []
        for _ in range(150):
            traffic.set_ego(ego_x, 0.0, 0.0, 0.0)
            vehicles = [v for v in traffic.step() if v.id in behind]
            closest.append(min((ego_x - 0.5 * ego_len) - (v.x + 0.5 * v.length_m) for v in vehicles))
            braking.append(min(v.accel_mps2 for v in vehicles))
        assert min(closest) > 0.5 and closest[-1] < 6.0  # queued up behind the ego without reaching it
        assert min(braking) > -4.5  # they departed slow enough to stop with SUMO's normal deceleration


# -- bad input and failures ----------------------------------------------------------------------------------

def test_bad_paths_and_specs(tmp_path):
    with pytest.raises(ValueError, match="NaN"):
        build_network(np.array([[0.0, 0.0], [np.nan, 1.0], [10.0, 0.0]]), RoadSpec(), tmp_path)
    with pytest.raises(ValueError, match="at least 2 points"):
        build_network(np.zeros((1, 2)), RoadSpec(), tmp_path)
    with pytest.raises(ValueError, match=r"shape \(N, 2\)"):
        build_network(np.zeros((5, 3)), RoadSpec(), tmp_path)
    with pytest.raises(ValueError, match="longer than 1 m"):
        build_network([[0.0, 0.0], [0.5, 0.0]], RoadSpec(), tmp_path)
    with pytest.raises(ValueError, match="less than 1 m away"):
        build_network([[0.0, 0.0], [0.6, 0.0], [0.0, 0.05]], RoadSpec(), tmp_path)
    with pytest.raises(ValueError, match="90 degrees"):
        build_network([[0.0, 0.0], [20.0, 0.0], [0.0, 1.0]], RoadSpec(), tmp_path)
    with pytest.raises(ValueError, match="curved too tightly"):
        build_network(_arc(radius=4.0, length=10.0), RoadSpec(lanes=3), tmp_path)
    for field, value in [("lanes", 0), ("lanes", 1.5), ("lanes", True), ("lane_width_m", -3.5),
                         ("lane_width_m", float("nan")), ("opposite_lanes", -1), ("ego_lane", 1),
                         ("speed_limit_mps", 0.0), ("extend_m", -1.0), ("edge_length_m", 1.0)]:
        with pytest.raises(ValueError, match=f"RoadSpec.{field}"):
            RoadSpec(**{field: value})
    spec = RoadSpec(lanes=3, ego_lane=2)
    assert RoadSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="unknown fields"):
        RoadSpec.from_dict({"schema_version": 1, "lanez": 2})
    assert not list(tmp_path.glob("*.net.xml"))


def test_broken_networks(tmp_path, straight_net):
    with pytest.raises(FileNotFoundError):
        load_network(tmp_path / "missing.net.xml")
    broken = tmp_path / "broken.net.xml"
    broken.write_text(straight_net.path.read_text()[:3000])  # cut off mid-file
    with pytest.raises(ValueError, match="not a readable SUMO network"):
        load_network(broken)
    empty = tmp_path / "empty.net.xml"
    empty.write_text('<net version="1.20"><location netOffset="0.00,0.00" convBoundary="0.00,0.00,1.00,1.00" '
                     'origBoundary="0.00,0.00,1.00,1.00" projParameter="!"/></net>')
    with pytest.raises(ValueError, match="no edges"):
        load_network(empty)
    with pytest.raises(ValueError, match="does not connect"):
        load_network(straight_net.path, forward_route=["gsim_f0", "gsim_f2"])
    with pytest.raises(ValueError, match="not a normal edge"):
        load_network(straight_net.path, forward_route=["nope"])


def test_netconvert_failure_names_the_command_and_message(tmp_path):
    nod, edg = tmp_path / "x.nod.xml", tmp_path / "x.edg.xml"
    nod.write_text('<nodes><node id="a" x="0" y="0"/></nodes>')
    edg.write_text('<edges><edge id="e" from="a" to="ghost" numLanes="1"/></edges>')
    with pytest.raises(SumoError) as info:
        run_netconvert(["--node-files", str(nod), "--edge-files", str(edg)], tmp_path / "x.net.xml")
    msg = str(info.value)
    assert "netconvert" in msg and "--node-files" in msg and "ghost" in msg and "not known" in msg
    assert not list(tmp_path.glob("*.net.xml")) and not list(tmp_path.glob(".*tmp*"))


def test_traffic_input_errors(straight_net, tmp_path):
    with pytest.raises(ValueError, match="client='traci'"):
        SumoTraffic(straight_net, gui=True)
    with pytest.raises(ValueError, match="step_s"):
        SumoTraffic(straight_net, step_s=0.0)
    one_way = build_network(_straight(), RoadSpec(opposite_lanes=0), tmp_path)
    assert one_way.opposite_route == []
    with SumoTraffic(one_way) as traffic:
        with pytest.raises(ValueError, match="no opposite route"):
            traffic.add_vehicle("x", "opposite", 0, 100.0, 5.0)
        with pytest.raises(ValueError, match="lane"):
            traffic.add_vehicle("x", "forward", 1, 100.0, 5.0)
        with pytest.raises(ValueError, match="pos_m"):
            traffic.add_vehicle("x", "forward", 0, 1e4, 5.0)
        with pytest.raises(ValueError, match="vclass"):
            traffic.add_vehicle("x", "forward", 0, 100.0, 5.0, vclass="tank")
        with pytest.raises(ValueError, match="ego"):
            traffic.add_vehicle("ego", "forward", 0, 100.0, 5.0)
        with pytest.raises(ValueError, match="add_ego first"):
            traffic.set_ego(0.0, 0.0, 0.0, 1.0)
        with pytest.raises(ValueError, match="speed"):
            traffic.add_ego(0.0, 0.0, 0.0, float("nan"))
        traffic.add_vehicle("x", "forward", 0, 100.0, 5.0)
        with pytest.raises(SumoError, match="add_vehicle.*x"):  # SUMO's own refusal, wrapped
            traffic.add_vehicle("x", "forward", 0, 200.0, 5.0)
        # one libsumo simulation per process
        with pytest.raises(SumoError, match="one libsumo simulation per process"):
            SumoTraffic(one_way)
        assert len(traffic.step()) == 1  # the running one is untouched
    with SumoTraffic(one_way, step_s=0.5, begin_s=5.0) as again:  # and the slot is free after close
        assert again.time_s == 5.0
        assert again.step() == [] and again.time_s == 5.5


def _sumo_children():
    """Process ids of SUMO servers started by this process (Linux /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"--remote-port" in cmd:
            pids.append(int(entry))
    return pids


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the SUMO process through /proc (Linux)")
def test_killed_traci_sumo_raises_instead_of_hanging(straight_net):
    pytest.importorskip("traci", reason="traci is not installed")
    before = set(_sumo_children())
    traffic = SumoTraffic(straight_net, client="traci")
    try:
        traffic.add_vehicle("a", "forward", 0, 100.0, 10.0)
        assert len(traffic.step()) == 1
        (pid,) = set(_sumo_children()) - before
        os.kill(pid, signal.SIGKILL)
        for _ in range(200):  # wait until the kernel has ended it
            if pid not in _sumo_children():
                break
            time.sleep(0.01)
        outcome = {}

        def step():
            try:
                traffic.step()
            except Exception as e:  # noqa: BLE001 - the test inspects it
                outcome["error"] = e

        worker = threading.Thread(target=step, daemon=True)
        worker.start()
        worker.join(timeout=20.0)
        assert not worker.is_alive(), "step() hung on a dead SUMO"
        error = outcome.get("error")
        assert isinstance(error, SumoError), error
        assert "step 1" in str(error) and "Connection closed" in str(error)
        with pytest.raises(SumoError, match="closed"):
            traffic.step()
    finally:
        traffic.close()
