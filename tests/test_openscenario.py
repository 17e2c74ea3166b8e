"""OpenSCENARIO in (gsim.bridges.openscenario): files written here with scenariogeneration (not by gsim), played by the
storyboard, imported as gsim scenarios, run in the closed loop; export then import is the identity; bad files are
one line each, and nothing runs or is written."""
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sumolib", reason="needs the sumo extra")
pytest.importorskip("yaml")
xosc = pytest.importorskip("scenariogeneration.xosc", reason="needs the scenarios extra (scenariogeneration)")
sys.path.insert(0, str(Path(__file__).parent))
from gsim.bridges.closed_loop.opendrive import export_road, road_network  # noqa: E402
from gsim.bridges.openscenario.lanes import LaneMap  # noqa: E402
from gsim.bridges.openscenario.load import read_xosc  # noqa: E402
from gsim.bridges.openscenario.read import read_plan  # noqa: E402
from gsim.bridges.openscenario.storyboard import Storyboard  # noqa: E402
from gsim.cli import main  # noqa: E402
from gsim.errors import InputError  # noqa: E402
from support import scenario  # noqa: E402

CAR_BOX = (1.9, 4.6, 1.5, 1.3, 0.0, 0.75)  # width, length, height, centre x, y, z (the reference point: rear axle)


def car():
    return xosc.Vehicle("car", xosc.VehicleCategory.car, xosc.BoundingBox(*CAR_BOX), xosc.Axle(0.5, 0.6, 1.6, 2.7, 0.3),
                        xosc.Axle(0.5, 0.6, 1.6, 0.0, 0.3), 50, 10, 10)


def _examples():
    """scenarios/openscenario/make_examples.py: the examples' script, whose helpers write the files of these tests."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_examples", EXAMPLES / "make_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLES = Path(__file__).parents[1] / "scenarios" / "openscenario"
EX = _examples()
step_speed, at_time = EX.speed, EX.at_time


def write(path, scene, entities, init, events=(), stop_s=5.0, road="road.xodr", params=None, deleted=(), minor=3):
    """A scenario file on ``scene`` (see make_examples.write); ``params`` {name: (type, value)}."""
    import os
    decl = [xosc.Parameter(k, kind, v) for k, (kind, v) in (params or {}).items()]
    EX.write(path, entities, init, events, deleted, stop_s, decl,
             None if scene is None else os.path.relpath(scene, Path(path).parent), road, minor)
    return str(path)


@pytest.fixture(scope="module")
def roads(loop_street, tmp_path_factory):
    """The loop street's road as OpenDRIVE: one lane each way (its default), and two forward lanes and one back."""
    d = tmp_path_factory.mktemp("roads")
    export_road(str(loop_street), d / "one" / "road.xodr")
    two = scenario(loop_street, "two_lanes", road={"lanes": 2, "lane_width_m": 3.5, "opposite_lanes": 1})
    export_road(two, d / "two" / "road.xodr")
    return d


def braking(folder, scene, brake_at="1.0"):
    """The issue's file: a car put into the ego's lane 12 m ahead at 6 m/s, braking at 4 m/s^2 from a time trigger
    (a parameter)."""
    return write(folder / "braking.xosc", scene, {"ego": car(), "braker": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                  ("braker", xosc.TeleportAction(xosc.WorldPosition(12.0, -1.75, 0.0, 0.0))),
                  ("braker", step_speed(6.0))],
                 [("brake", "braker", [("brake", xosc.AbsoluteSpeedAction(0.0, xosc.TransitionDynamics(
                     xosc.DynamicsShapes.linear, xosc.DynamicsDimension.rate, 4.0)))], at_time("at", "$brake_at"))],
                 params={"brake_at": (xosc.ParameterType.double, brake_at)})


def play(path, lanes, ego, seconds, step=0.1, params=None):
    """The storyboard of ``path`` played for ``seconds`` with the ego where ``ego(t)`` says; states per step."""
    sb = Storyboard(read_plan(path, params), lanes)
    sb.start(0, ego(0.0))
    out = [(0.0, {n: sb.pose(n) for n in sb.states})]
    for k in range(1, int(round(seconds / step)) + 1):
        t = k * step
        sb.step(int(round(t * 1e6)), ego(t))
        out.append((t, {n: sb.pose(n) for n in sb.states}))
    return sb, out


def parked_ego(t):
    return (0.0, -1.6, 0.0, 0.0)


def test_the_issues_file_runs_in_the_closed_loop_and_the_privileged_agent_stops_behind(loop_street, roads, tmp_path):
    """Done: the car starts where the file puts it, goes 6 m/s, brakes from the trigger at 4 m/s^2 to a stop, and the
    privileged agent stops behind it; the StopTrigger ends the run."""
    import shutil
    shutil.copy(roads / "one" / "road.xodr", tmp_path / "road.xodr")
    path = braking(tmp_path, loop_street)
    assert main(["closed-loop", path, "--agent", "privileged", "--out", str(tmp_path / "run"), "--no-video"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    box = [next(a for a in r["actors"] if a["id"] == "braker") for r in rows]
    xy = np.array([b["xyz"][:2] for b in box])
    x = xy[:, 0]
    assert box[0]["xyz"][:2] == pytest.approx([12.0 + 1.3, -1.75], abs=0.1)  # the reference point + the box's centre
    v = np.linalg.norm(np.diff(xy, axis=0), axis=1) / 0.1  # (speed over each step; it follows its lane)
    # 6 m/s (the first step turns it onto its lane) until the trigger fires, at the first step past 1.0 s: 1.1 s
    assert np.allclose(v[1:11], 6.0, atol=0.01) and v[0] == pytest.approx(6.0, abs=0.05)
    assert v[11:14] == pytest.approx([6 - 4 * 0.05, 6 - 4 * 0.15, 6 - 4 * 0.25], abs=0.02)  # then 4 m/s^2
    assert np.allclose(v[30:], 0.0, atol=1e-6) and x[-1] == pytest.approx(13.3 + 6 * 1.1 + 6 ** 2 / 8, abs=0.1)
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert not m["collision"] and m["steps"] == 51 and m["ended_by_scenario"].startswith("the scenario's StopTrigger")
    ego = rows[-1]["ego_box"]
    assert rows[-1]["ego"]["speed_mps"] < 0.5 and ego["xyz"][0] + ego["size"][0] / 2 < x[-1] - box[-1]["size"][0] / 2


def test_a_parameter_moves_the_trigger_and_a_speed_change_keeps_its_shape_and_span(loop_street, roads, tmp_path):
    lanes = LaneMap.read(roads / "one" / "road.xodr")
    path = braking(tmp_path, loop_street)
    for when, params in ((1.1, None), (2.1, {"brake_at": "2.0"})):
        sb, states = play(path, lanes, parked_ego, 5.0, params=params)
        speed = {round(t, 1): s["braker"][3] for t, s in states}
        assert speed[round(when - 0.1, 1)] == 6.0 and speed[round(when + 0.5, 1)] == pytest.approx(4.0)
        assert speed[round(when + 1.5, 1)] == pytest.approx(0.0, abs=1e-9)
    # cubic over a time, sinusoidal over a distance
    path = write(tmp_path / "shapes.xosc", loop_street, {"ego": car(), "a": car(), "b": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                  ("a", xosc.TeleportAction(xosc.WorldPosition(10.0, -1.75, 0.0, 0.0))), ("a", step_speed(2.0)),
                  ("b", xosc.TeleportAction(xosc.WorldPosition(-20.0, -1.75, 0.0, 0.0))), ("b", step_speed(2.0))],
                 [("up", "a", [("up", xosc.AbsoluteSpeedAction(6.0, xosc.TransitionDynamics(
                     xosc.DynamicsShapes.cubic, xosc.DynamicsDimension.time, 2.0)))], at_time("t", 0.0)),
                  ("far", "b", [("far", xosc.AbsoluteSpeedAction(6.0, xosc.TransitionDynamics(
                      xosc.DynamicsShapes.sinusoidal, xosc.DynamicsDimension.distance, 8.0)))], at_time("t2", 0.0))])
    sb, states = play(path, lanes, parked_ego, 4.0)
    a = {round(t, 1): s["a"][3] for t, s in states}
    assert a[0.1] == 2.0 and a[1.1] == pytest.approx(4.0) and a[2.1] == pytest.approx(6.0)  # halfway at 1 s of 2
    b = {round(t, 1): s["b"][3] for t, s in states}
    assert b[1.1] == pytest.approx(4.0) and b[2.1] == pytest.approx(6.0)  # 8 m at a mean 4 m/s: 2 s from 0.1 s


def test_lane_positions_land_on_the_loops_lanes(loop_street, roads, tmp_path):
    """A LanePosition (road, lane, s, offset) lands on the lane the closed loop drives (SUMO's, read by sumolib, not
    by gsim's OpenDRIVE reader): on its centre, s apart as s says, offset to the left."""
    lanes = LaneMap.read(roads / "one" / "road.xodr")
    net, _ = road_network(str(loop_street), tmp_path / "net")
    ego_lane = [shape for lid, shape, _ in net.lanes() if not lid.startswith(":")]
    road = next(p.road for p in lanes.pieces if p.lane == -1 and p.centre.project((10.0, -1.75))[2][0] < 0.5)
    path = write(tmp_path / "lanes.xosc", loop_street, {"ego": car(), "a": car(), "b": car(), "c": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                  ("a", xosc.TeleportAction(xosc.LanePosition(5.0, 0.0, -1, road))),
                  ("b", xosc.TeleportAction(xosc.LanePosition(25.0, 0.0, -1, road))),
                  ("c", xosc.TeleportAction(xosc.LanePosition(25.0, 0.5, -1, road)))])
    sb, states = play(path, lanes, parked_ego, 0.0)
    pa, pb, pc = (np.array(states[0][1][n][:2]) for n in "abc")

    def cross(p):
        from test_opendrive import cross_track
        return min(cross_track(shape, p[None])[0] for shape in ego_lane)
    assert cross(pa) < 0.1 and cross(pb) < 0.1 and np.linalg.norm(pb - pa) == pytest.approx(20.0, abs=0.1)
    h = states[0][1]["b"][2]
    assert pc - pb == pytest.approx(0.5 * np.array([-math.sin(h), math.cos(h)]), abs=0.02)


def test_a_lane_change_ends_in_the_target_lane(loop_street, roads, tmp_path):
    """On two forward lanes: a car on the left lane changes one lane right (relative to itself) over 30 m; it ends on
    the right lane's centre (SUMO's lane, read by sumolib) having travelled the distance the file says."""
    lanes = LaneMap.read(roads / "two" / "road.xodr")
    two = scenario(loop_street, "two_lanes_again", road={"lanes": 2, "lane_width_m": 3.5, "opposite_lanes": 1})
    net, _ = road_network(two, tmp_path / "net")
    right = [shape for lid, shape, _ in net.lanes() if lid.endswith("_0") and not lid.startswith(":")]
    left_lane = [shape for lid, shape, _ in net.lanes() if lid.endswith("_1") and not lid.startswith(":")]
    from test_opendrive import cross_track
    start = next(p.centre.at(10.0)[0][0] for p in lanes.pieces if p.lane == -1 and p.centre.length > 20
                 and p.centre.project((10.0, 0.0))[2][0] < 3.0)
    assert min(cross_track(s, start[None])[0] for s in left_lane) < 0.1  # (lane -1: the left of the two)
    path = write(tmp_path / "change.xosc", loop_street, {"ego": car(), "changer": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                  ("changer", xosc.TeleportAction(xosc.WorldPosition(float(start[0]), float(start[1]), 0.0, 0.0))),
                  ("changer", step_speed(10.0))],
                 [("change", "changer", [("change", xosc.RelativeLaneChangeAction(
                     -1, "changer", xosc.TransitionDynamics(xosc.DynamicsShapes.sinusoidal,
                                                            xosc.DynamicsDimension.distance, 30.0)))],
                   at_time("go", 0.5))])
    sb, states = play(path, lanes, parked_ego, 6.0)
    assert ("action", "change") in sb.ended
    ended = sb.ended[("action", "change")]
    assert ended == pytest.approx(0.6 + 3.0, abs=0.11)  # 30 m at 10 m/s from the first step after 0.5 s
    end = np.array(states[-1][1]["changer"][:2])
    assert min(cross_track(s, end[None])[0] for s in right) < 0.1
    halfway = next(s for t, s in states if abs(t - 2.1) < 1e-6)["changer"][:2]
    assert 1.2 < min(cross_track(s, np.array(halfway)[None])[0] for s in right) < 2.3  # (sinusoidal: half way)


def test_a_relative_distance_trigger_fires_at_its_distance(loop_street, roads, tmp_path):
    """A standing car starts off when the ego (driving up at 5 m/s) is within 10 m of it, centre to centre along its
    heading, and a second one when the free space between their boxes is under 4 m."""
    lanes = LaneMap.read(roads / "one" / "road.xodr")
    cond = lambda n, free, d: xosc.EntityTrigger(n, 0, xosc.ConditionEdge.none, xosc.RelativeDistanceCondition(  # noqa
        d, xosc.Rule.lessThan, xosc.RelativeDistanceType.longitudinal, "ego", freespace=free), n.split("_")[0])
    path = write(tmp_path / "dist.xosc", loop_street, {"ego": car(), "w": car(), "f": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                  ("w", xosc.TeleportAction(xosc.WorldPosition(30.33, -1.75, 0.0, 0.0))),
                  ("f", xosc.TeleportAction(xosc.WorldPosition(45.27, -1.75, 0.0, 0.0)))],
                 [("go", "w", [("go", step_speed(5.0))], cond("w_near", False, 10.0)),
                  ("go_f", "f", [("go_f", step_speed(5.0))], cond("f_near", True, 4.0))], stop_s=20.0)
    sb, states = play(path, lanes, lambda t: (5.0 * t, -1.6, 0.0, 5.0), 12.0)
    for who, free, d in (("w", False, 10.0), ("f", True, 4.0)):
        t = sb.started[("event", "go" if who == "w" else "go_f")]
        gap = lambda t: abs((30.33 if who == "w" else 45.27) + 1.3 - (5.0 * t + 1.3)) - (4.6 if free else 0)  # noqa
        assert gap(t) < d <= gap(t - 0.1)  # it fired at the first step within the distance


def test_trajectories_polyline_in_time_and_a_clothoid_at_speed(loop_street, roads, tmp_path):
    lanes = LaneMap.read(roads / "one" / "road.xodr")
    poly = xosc.Trajectory("p", False)
    poly.add_shape(xosc.Polyline([0.0, 1.0, 3.0], [xosc.WorldPosition(10, -1.75, 0, 0),
                                                   xosc.WorldPosition(14, -1.75, 0, 0),
                                                   xosc.WorldPosition(18, 1.25, 0, 0.5)]))
    clo = xosc.Trajectory("c", False)
    clo.add_shape(xosc.Clothoid(0.0, 0.01, 20.0, xosc.WorldPosition(-10, -5, 0, 0)))
    follow = lambda t, timed: xosc.FollowTrajectoryAction(t, xosc.FollowingMode.position, *(  # noqa: E731
        (xosc.ReferenceContext.relative, 1, 0) if timed else ()))
    path = write(tmp_path / "traj.xosc", loop_street, {"ego": car(), "p": car(), "c": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                  ("p", xosc.TeleportAction(xosc.WorldPosition(10.0, -1.75, 0.0, 0.0))),
                  ("c", xosc.TeleportAction(xosc.WorldPosition(-10.0, -5.0, 0.0, 0.0))), ("c", step_speed(5.0))],
                 [("pe", "p", [("pa", follow(poly, True))], at_time("tp", 0.5)),
                  ("ce", "c", [("ca", follow(clo, False))], at_time("tc", 0.0))])
    sb, states = play(path, lanes, parked_ego, 5.0)
    at = {round(t, 1): s for t, s in states}
    assert at[1.6]["p"][:2] == pytest.approx((14.0, -1.75), abs=1e-6)  # vertex 2 at 1 s past the start (0.6 s)
    assert at[1.7]["p"][:2] == pytest.approx((14.0 + 4 * 0.1 / 2, -1.75 + 3 * 0.1 / 2), abs=1e-6)  # 0.1 s on
    assert at[3.6]["p"][:3] == pytest.approx((18.0, 1.25, 0.5), abs=1e-6)  # its end, at 0.6 + 3 s
    # the clothoid at 5 m/s: 20 m in 4 s, heading 0.01 * 20^2 / 2 = 2 rad at its end
    assert ("action", "ca") in sb.ended and sb.ended[("action", "ca")] == pytest.approx(4.1, abs=0.11)
    assert at[2.1]["c"][2] == pytest.approx(0.01 * 10.0 ** 2 / 2, abs=1e-6)  # 10 m along it at 2.1 s


def test_relative_lane_position_lane_offset_and_the_other_conditions(loop_street, roads, tmp_path):
    """A car put 10 m ahead of another on its lane (RelativeLanePosition) moves 0.8 m left in its lane (LaneOffset,
    cubic, at most 1 m/s^2: sqrt(6 x 0.8 / 1) s); when that event ends (StoryboardElementState) the other car starts;
    after it has travelled 5 m (TraveledDistance) a third one starts, and a fourth when the first car's reference point
    is within 1 m of a position (ReachPosition, the first car then at 4 m/s). OpenSCENARIO 1.1 (ReachPosition went in
    1.2)."""
    lanes = LaneMap.read(roads / "one" / "road.xodr")
    state = xosc.ValueTrigger("offset_done", 0, xosc.ConditionEdge.none, xosc.StoryboardElementStateCondition(
        xosc.StoryboardElementType.event, "shift", xosc.StoryboardElementState.endTransition))
    travelled = xosc.EntityTrigger("five_m", 0, xosc.ConditionEdge.none, xosc.TraveledDistanceCondition(5.0), "b")
    reach = xosc.EntityTrigger("there", 0, xosc.ConditionEdge.none,
                               xosc.ReachPositionCondition(xosc.WorldPosition(30.0, -1.75 + 0.8), 1.0), "a")
    path = write(tmp_path / "conditions.xosc", loop_street, {"ego": car(), "a": car(), "b": car(), "c": car(),
                                                              "d": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                  ("b", xosc.TeleportAction(xosc.WorldPosition(5.0, -1.75, 0.0, 0.0))),
                  ("a", xosc.TeleportAction(xosc.RelativeLanePosition(0, "b", 0.0, ds=10.0))), ("a", step_speed(4.0)),
                  ("c", xosc.TeleportAction(xosc.WorldPosition(-30.0, -1.75, 0.0, 0.0))),
                  ("d", xosc.TeleportAction(xosc.WorldPosition(-40.0, -1.75, 0.0, 0.0)))],
                 [("shift", "a", [("shift", xosc.AbsoluteLaneOffsetAction(0.8, xosc.DynamicsShapes.cubic, 1.0))],
                   at_time("t", 0.5)),
                  ("go_b", "b", [("go_b", step_speed(5.0))], state),
                  ("go_c", "c", [("go_c", step_speed(3.0))], travelled),
                  ("go_d", "d", [("go_d", step_speed(3.0))], reach)], stop_s=20.0, minor=1)
    sb, states = play(path, lanes, parked_ego, 8.0)
    at = {round(t, 1): s for t, s in states}
    a0, b0 = np.array(at[0.0]["a"][:2]), np.array(at[0.0]["b"][:2])
    from test_opendrive import cross_track
    net, _ = road_network(str(loop_street), tmp_path / "net")
    lane = [shape for lid, shape, _ in net.lanes() if not lid.startswith(":")]
    assert np.linalg.norm(a0 - b0) == pytest.approx(10.0, abs=0.05)
    assert min(cross_track(x, a0[None])[0] for x in lane) < 0.25  # (b was put 0.15 m off the centre; a on it)
    shift = math.sqrt(6 * 0.8 / 1.0)
    assert sb.ended[("event", "shift")] == pytest.approx(0.6 + shift, abs=0.11)
    end = np.array(at[4.0]["a"][:2])
    assert min(cross_track(x, end[None])[0] for x in lane) == pytest.approx(0.8, abs=0.05)
    assert sb.started[("event", "go_b")] == pytest.approx(sb.ended[("event", "shift")] + 0.1, abs=1e-6)
    b_go = sb.started[("event", "go_b")]
    assert sb.started[("event", "go_c")] == pytest.approx(b_go + 1.0 + 0.1, abs=0.11)  # 5 m at 5 m/s (+ a step)
    reach_t = sb.started[("event", "go_d")]
    x_a = np.array(at[round(reach_t, 1)]["a"][:2])
    assert np.linalg.norm(x_a - (30.0, -0.95)) <= 1.0 < np.linalg.norm(np.array(at[round(reach_t - 0.1, 1)]["a"][:2])
                                                                      - (30.0, -0.95))


def _tracks(world, frames):
    return {a.id: np.array([[*a.pose_at(f.timestamp_us)[:2, 3], math.atan2(a.pose_at(f.timestamp_us)[1, 0],
                                                                          a.pose_at(f.timestamp_us)[0, 0])]
                            for f in frames]) for a in world.scene.actors}


@pytest.mark.parametrize("edits", [
    [{"kind": "remove", "actor": "parked"},
     {"kind": "insert", "asset": "sedan", "id": "ahead", "track": {"path": [[10.0, -1.75], [20.0, -1.0], [40.0, -1.0]],
                                                                   "speed_mps": [4.0, 6.0, 6.0]}},
     {"kind": "insert", "asset": "cone", "id": "cone", "track": {"poses": [{"t_us": 0, "xyz": [8.0, 1.0, 0.0]}]}}],
    [{"kind": "move", "actor": "parked", "shift_m": [1.0, 0.5, 0.0]},
     {"kind": "insert", "asset": "pedestrian", "id": "walker", "track": {"path": [[15.0, 3.5], [15.0, 0.5]],
                                                                        "speed_mps": 1.4, "start_us": 500000}}]])
def test_export_then_import_is_the_identity(loop_street, tmp_path, edits):
    """The same actors on the same tracks (within 0.1 m, and headings) at every frame, the ego on its path."""
    from gsim.bridges.closed_loop.scenario import load_loop_scenario
    from gsim.editing.world import apply
    path = scenario(loop_street, "round_trip", edits, ego={"shift_m": 0.3})
    assert main(["scenario", "export", path, str(tmp_path / "x")]) == 0
    assert main(["scenario", "import", str(tmp_path / "x" / "round_trip.xosc"), str(tmp_path / "back.yaml")]) == 0
    before = apply(load_loop_scenario(path), ego_overlaps=True)
    after = apply(load_loop_scenario(tmp_path / "back.yaml"), ego_overlaps=True)
    a, b = _tracks(before, before.frames), _tracks(after, before.frames)
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.abs(a[k][:, :2] - b[k][:, :2]).max() < 0.1, k
        assert np.abs(np.angle(np.exp(1j * (a[k][:, 2] - b[k][:, 2])))).max() < 0.02, k
    assert np.abs(before.ego_poses[:, :3, 3] - after.ego_poses[:, :3, 3]).max() < 0.01


def test_import_and_render_and_validate_read_openscenario(loop_street, roads, tmp_path, capsys):
    import shutil
    import yaml
    shutil.copy(roads / "one" / "road.xodr", tmp_path / "road.xodr")
    path = braking(tmp_path, loop_street)
    assert main(["scenario", "import", path, str(tmp_path / "b.yaml"), "--param", "brake_at=0.5"]) == 0
    d = yaml.safe_load((tmp_path / "b.yaml").read_text())
    assert d["scene"] == "../" + Path(loop_street).name + "/scene" or (tmp_path / d["scene"]).resolve() == \
        (loop_street / "scene").resolve()
    poses = d["edits"][0]["track"]["poses"]
    assert d["edits"][0]["kind"] == "insert" and d["edits"][0]["asset"] == "sedan" and poses[0]["xyz"][0] == 13.3
    assert main(["scenario", "validate", path, "--check", "--param", "brake_at=9"]) == 0  # (not into the logged ego)
    assert "valid scenario 'braking'" in capsys.readouterr().out
    assert main(["scenario", "render", path, "--out", str(tmp_path / "render"), "--param", "brake_at=9"]) == 0
    assert (tmp_path / "render" / "log" / "log.json").is_file()


def _bad(tmp_path, capsys, path, match, *extra):
    out = tmp_path / "never"
    assert main(["scenario", "import", str(path), str(out / "x.yaml"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    assert main(["closed-loop", str(path), "--out", str(out), *extra]) == 2
    assert match in capsys.readouterr().err
    assert not out.exists()
    return err


def test_bad_files_are_one_line_each_and_nothing_runs(loop_street, roads, tmp_path, capsys):
    import shutil
    shutil.copy(roads / "one" / "road.xodr", tmp_path / "road.xodr")
    good = Path(braking(tmp_path, loop_street))
    text = good.read_text()
    lines = text.splitlines()

    def variant(name, new):
        p = tmp_path / f"{name}.xosc"
        p.write_text(new)
        return p
    line = next(i for i, s in enumerate(lines, 1) if "<Performance" in s)
    err = _bad(tmp_path, capsys, variant("schema", text.replace('maxSpeed="50.0" ', "", 1)),
               f"schema.xosc:{line}: <Performance> breaks the OpenSCENARIO 1.3 schema")
    assert "maxSpeed" in err
    tod = text.replace('<SimulationTimeCondition value="5.0" rule="greaterThan"/>',
                       '<TimeOfDayCondition dateTime="2026-11-28T10:00:00" rule="greaterThan"/>')
    line = next(i for i, s in enumerate(tod.splitlines(), 1) if "TimeOfDayCondition" in s)
    _bad(tmp_path, capsys, variant("unsupported", tod),
         f"unsupported.xosc:{line}: <TimeOfDayCondition> is outside gsim's OpenSCENARIO subset")
    _bad(tmp_path, capsys, variant("ghost", text.replace('<EntityRef entityRef="braker"/>',
                                                         '<EntityRef entityRef="ghost"/>')),
         "<EntityRef entityRef='ghost'> in maneuver group 'brake_group': no such entity")
    nan = text.replace('<WorldPosition x="12.0"', '<WorldPosition x="INF"')
    line = next(i for i, s in enumerate(nan.splitlines(), 1) if 'x="INF"' in s)
    _bad(tmp_path, capsys, variant("inf", nan), f"inf.xosc:{line}: <WorldPosition> x='INF' is not a finite number")
    lanes = LaneMap.read(tmp_path / "road.xodr")
    road = lanes.pieces[0].road
    lane = text.replace('<WorldPosition x="12.0" y="-1.75" z="0.0" h="0.0"/>',
                        f'<LanePosition roadId="{road}" laneId="-3" offset="0" s="5"/>')
    line = next(i for i, s in enumerate(lane.splitlines(), 1) if "laneId=\"-3\"" in s)
    _bad(tmp_path, capsys, variant("lane", lane), f"lane.xosc:{line}: road {road!r} has no lane -3 (it has [-1])")
    elsewhere = tmp_path.parent / "not_a_scene"
    elsewhere.mkdir(exist_ok=True)
    _bad(tmp_path, capsys, variant("outside", _scene(text, "../not_a_scene")), "SceneGraphFile")
    _bad(tmp_path, capsys, good, "declares no parameter 'brake'", "--param", "brake=1")
    _bad(tmp_path, capsys, good, "--param x: expected NAME=VALUE", "--param", "x")
    yaml_file = scenario(loop_street, "plain")  # (a scenario YAML takes no OpenSCENARIO options)
    assert main(["closed-loop", yaml_file, "--param", "x=1", "--out", str(tmp_path / "never")]) == 2
    assert "--param, --ego and --scene are for OpenSCENARIO files" in capsys.readouterr().err


def _scene(text, new):
    import re
    return re.sub(r'<SceneGraphFile filepath="[^"]*"/>', f'<SceneGraphFile filepath="{new}"/>', text)


def test_deleting_a_scene_actor_removes_it_and_the_shipped_examples_read(loop_street, roads, tmp_path):
    import shutil
    shutil.copy(roads / "one" / "road.xodr", tmp_path / "road.xodr")
    path = write(tmp_path / "del.xosc", loop_street, {"ego": car(), "parked": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0)))], deleted=["parked"])
    im = read_xosc(path)
    assert [e.kind for e in im.scenario.edits] == ["remove"] and im.scenario.edits[0].actor == "parked"
    shipped = sorted(EXAMPLES.glob("*.xosc"))
    assert len(shipped) == 6
    for p in shipped:  # the examples read (schema, subset), on the demo street, gsim's own road
        plan = read_plan(p)
        assert plan.ego == "ego" and plan.road is None and plan.scene.name == "demo"
    EX.main(tmp_path / "again")  # and they are what their script writes
    for p in shipped:
        assert (tmp_path / "again" / p.name).read_text() == p.read_text(), p.name


def test_an_opendrive_road_written_by_scenariogeneration_has_its_lanes_where_the_standard_puts_them(tmp_path):
    """A line, an arc and a spiral, two lanes each way (scenariogeneration's xodr writer, not SUMO's): lane centres at
    their analytic places, lanes to the left across the centre line, and a car runs straight on past the road's end."""
    xodr = pytest.importorskip("scenariogeneration.xodr")
    road = xodr.create_road([xodr.Line(50), xodr.Arc(0.02, angle=0.5), xodr.Spiral(0.02, 0.0, 30)], id=1,
                            left_lanes=2, right_lanes=2, lane_width=3.5)
    odr = xodr.OpenDrive("t")
    odr.add_road(road)
    odr.adjust_roads_and_lanes()
    odr.write_xml(str(tmp_path / "road.xodr"))
    lanes = LaneMap.read(tmp_path / "road.xodr")
    assert lanes.lane_point("1", -1, 20.0, 0.0, "t") == pytest.approx((20.0, -1.75, 0.0), abs=1e-3)
    x, y, h = lanes.lane_point("1", 2, 20.0, 0.0, "t")
    assert (x, y) == pytest.approx((20.0, 5.25), abs=1e-3) and abs(math.remainder(h - math.pi, 2 * math.pi)) < 1e-6
    h = 0.02 * 12.5  # 12.5 m into the arc of radius 50 about (50, 50)
    centre = np.array([50 + 50 * math.sin(h), 50 - 50 * math.cos(h)]) + 1.75 * np.array([math.sin(h), -math.cos(h)])
    x, y, heading = lanes.lane_point("1", -1, 62.5, 0.0, "t")
    assert (x, y) == pytest.approx(tuple(centre), abs=2e-3)
    assert heading == pytest.approx(h, abs=0.02 * 0.5 / 2 + 1e-6)  # (a chord's heading: the samples are 0.5 m apart)
    minus1 = next(i for i, p in enumerate(lanes.pieces) if p.lane == -1)
    assert [lanes.pieces[lanes.neighbour(minus1, k)].lane for k in (1, 2, -1)] == [1, 2, -2]
    # road positions: on the reference line's analytic places; relative ones from an entity's place on its road
    reference = np.array([50 + 50 * math.sin(0.25), 50 - 50 * math.cos(0.25)])
    assert lanes.road_point("1", 62.5, 0.0, "t")[:2] == pytest.approx(tuple(reference), abs=2e-3)
    assert lanes.road_point("1", 20.0, -1.75, "t") == pytest.approx((20.0, -1.75, 0.0), abs=1e-6)
    with pytest.raises(InputError, match="s = 500 m is off road '1'"):
        lanes.road_point("1", 500.0, 0.0, "t")
    plan = read_plan(write(tmp_path / "road.xosc", None, {"ego": car(), "a": car(), "b": car()},
                           [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.75, 0.0, 0.0))),
                            ("a", xosc.TeleportAction(xosc.RoadPosition(20.0, -1.75, 1))),
                            ("b", xosc.TeleportAction(xosc.RelativeRoadPosition(10.0, 3.5, "a")))], stop_s=None))
    sb = Storyboard(plan, lanes)
    sb.start(0, (0.0, -1.75, 0.0, 0.0))
    assert sb.pose("b")[:3] == pytest.approx((30.0, 1.75, 0.0), abs=1e-6)
    assert lanes.neighbour(minus1, 3) is None
    plan = read_plan(write(tmp_path / "end.xosc", None, {"ego": car(), "a": car()},
                           [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.75, 0.0, 0.0))),
                            ("a", xosc.TeleportAction(xosc.LanePosition(95.0, 0.0, -1, "1"))),
                            ("a", step_speed(10.0))]))
    sb = Storyboard(plan, lanes)
    sb.start(0, (0.0, -1.75, 0.0, 0.0))
    for k in range(1, 31):
        sb.step(k * 100_000, (0.0, -1.75, 0.0, 0.0))
    end_xy, end_h = lanes.chain(minus1).at(1e9)
    x, y, h, v = sb.pose("a")
    travelled = 30.0 - (lanes.chain(minus1).length - lanes.chain(minus1).project((*lanes.lane_point("1", -1, 95.0, 0.0,
                                                                                                      "t")[:2],))[0][0])
    assert v == 10.0 and h == pytest.approx(end_h[0], abs=1e-6)
    assert (x, y) == pytest.approx(tuple(end_xy[0] + travelled * np.array([math.cos(h), math.sin(h)])), abs=0.02)


def test_a_cancelled_trajectory_leaves_its_car_where_it_is_and_parameters_set_enumerations(loop_street, roads,
                                                                                          tmp_path):
    """A timed trajectory replaced by a speed action: the car goes on from where the trajectory left it (no jump back
    to its old lane position); a condition's rule and edge and an event's priority given by parameters."""
    import shutil
    shutil.copy(roads / "one" / "road.xodr", tmp_path / "road.xodr")
    lanes = LaneMap.read(tmp_path / "road.xodr")
    line = xosc.Trajectory("line", False)
    line.add_shape(xosc.Polyline([0.0, 4.0], [xosc.WorldPosition(14, -1.75, 0, 0),
                                              xosc.WorldPosition(54, -1.75, 0, 0)]))
    follow = xosc.FollowTrajectoryAction(line, xosc.FollowingMode.position, xosc.ReferenceContext.absolute, 1, 0)
    path = write(tmp_path / "cancel.xosc", loop_street, {"ego": car(), "a": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                  ("a", xosc.TeleportAction(xosc.WorldPosition(14.0, -1.75, 0.0, 0.0)))],
                 [("go", "a", [("go", follow)], EX.at_start("t0")), ("slow", "a", [("slow", step_speed(2.0))],
                                                                    at_time("t2", 2.0))],
                 params={"rule": (xosc.ParameterType.string, "greaterThan"),
                         "edge": (xosc.ParameterType.string, "rising")})
    text = Path(path).read_text()
    text = text.replace('rule="greaterThan"', 'rule="$rule"').replace('conditionEdge="rising"', 'conditionEdge="$edge"')
    Path(path).write_text(text)
    sb, states = play(path, lanes, parked_ego, 4.0)
    x = [s["a"][0] for _, s in states]
    assert x[20] == pytest.approx(34.0, abs=1e-6)  # 2.0 s: half way along the timed line
    assert x[21] == pytest.approx(34.0 + 10.0 * 0.1, abs=1e-6)  # the speed action fires at 2.1 s (first step > 2)
    assert np.all(np.diff(x[22:]) == pytest.approx(0.2, abs=0.01))  # then 2 m/s on from there


def test_more_bad_files_are_refused_with_their_line(loop_street, roads, tmp_path, capsys):
    """References to a deleted entity, a DOCTYPE, two events of one name, an undeclared enumeration value."""
    import shutil
    shutil.copy(roads / "one" / "road.xodr", tmp_path / "road.xodr")
    deleted = write(tmp_path / "deleted.xosc", loop_street, {"ego": car(), "a": car(), "parked": car()},
                    [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                     ("a", xosc.TeleportAction(xosc.RelativeObjectPosition("parked", 5.0, 0.0)))], deleted=["parked"])
    _bad(tmp_path, capsys, deleted, "'init_a_0' refers to 'parked', which Init deletes")
    good = Path(braking(tmp_path, loop_street)).read_text()
    dtd = tmp_path / "dtd.xosc"
    dtd.write_text(good.replace("<OpenSCENARIO", '<!DOCTYPE OpenSCENARIO [<!ENTITY x "y">]>\n<OpenSCENARIO', 1))
    _bad(tmp_path, capsys, dtd, "dtd.xosc:1: a DOCTYPE (a DTD, entities) is outside gsim's subset")
    two = write(tmp_path / "two.xosc", loop_street, {"ego": car(), "a": car(), "b": car()},
                [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                 ("a", xosc.TeleportAction(xosc.WorldPosition(20.0, -1.75, 0.0, 0.0))),
                 ("b", xosc.TeleportAction(xosc.WorldPosition(30.0, -1.75, 0.0, 0.0)))],
                [("go", "a", [("go_a", step_speed(1.0))], at_time("t", 1.0)),
                 ("go", "b", [("go_b", step_speed(1.0))], at_time("u", 1.0))])
    _bad(tmp_path, capsys, two, "a second event named 'go'")
    enum = tmp_path / "enum.xosc"
    enum.write_text(good.replace('rule="greaterThan"', 'rule="$brake_at"', 1))
    _bad(tmp_path, capsys, enum, "rule='1.0': gsim reads greaterThan, lessThan")
    # a LogicFile whose lanes are not the loop's (a straight road 1.5 m to the left of the street's): refused
    xodr = pytest.importorskip("scenariogeneration.xodr")
    road = xodr.create_road(xodr.Line(200), id=1, left_lanes=1, right_lanes=1, lane_width=3.5)
    road.planview.set_start_point(-60.0, 1.5, 0.0)
    odr = xodr.OpenDrive("off")
    odr.add_road(road)
    odr.adjust_roads_and_lanes()
    (tmp_path / "off").mkdir()
    odr.write_xml(str(tmp_path / "off" / "road.xodr"))
    off = tmp_path / "off" / "braking.xosc"
    off.write_text(_scene(good, str(loop_street)))
    err = _bad(tmp_path, capsys, off, "off this file's along the logged path (tolerance 0.5 m)")
    assert 1.5 < float(err.split("up to ")[1].split(" m")[0]) < 2.0


def test_speed_standstill_headway_ttc_and_distance_conditions(loop_street, roads, tmp_path):
    """Each condition fires at the first step where its value passes the threshold: a car speeding up at 2 m/s^2
    (Speed, Acceleration, RelativeSpeed against the ego's 5 m/s), one standing (StandStill 1 s), the ego driving at
    5 m/s towards a standing car 50 m ahead (TimeHeadway 2.95 s: 14.75 m, TimeToCollision 1.95 s: 9.75 m, centre to
    centre) and the car reaching a position (Distance 3 m)."""
    lanes = LaneMap.read(roads / "one" / "road.xodr")
    on = lambda name, cond, who: xosc.EntityTrigger(name, 0, xosc.ConditionEdge.none, cond, who)  # noqa: E731
    conds = {"fast": on("fast", xosc.SpeedCondition(4.9, xosc.Rule.greaterThan), "a"),
             "pushing": on("pushing", xosc.AccelerationCondition(1.5, xosc.Rule.greaterThan), "a"),
             "faster": on("faster", xosc.RelativeSpeedCondition(0.1, xosc.Rule.greaterThan, "ego"), "a"),
             "still": on("still", xosc.StandStillCondition(1.0), "s"),
             "headway": on("headway", xosc.TimeHeadwayCondition("w", 2.95, xosc.Rule.lessThan, freespace=False), "ego"),
             "ttc": on("ttc", xosc.TimeToCollisionCondition(1.95, xosc.Rule.lessThan, freespace=False, entity="w"),
                       "ego"),
             "near": on("near", xosc.DistanceCondition(3.0, xosc.Rule.lessThan, xosc.WorldPosition(-10.0, -4.0),
                                                       freespace=False,
                                                       distance_type=xosc.RelativeDistanceType.euclidianDistance),
                        "a")}
    entities = {"ego": car(), "a": car(), "s": car(), "w": car(), **{f"x_{k}": car() for k in conds}}
    init = [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
            ("a", xosc.TeleportAction(xosc.WorldPosition(-40.0, -4.0, 0.0, 0.0))),
            ("s", xosc.TeleportAction(xosc.WorldPosition(-60.0, -4.0, 0.0, 0.0))),
            ("w", xosc.TeleportAction(xosc.WorldPosition(50.0, -1.75, 0.0, 0.0)))]
    init += [(f"x_{k}", xosc.TeleportAction(xosc.WorldPosition(-80.0 - 8 * i, 6.0, 0.0, 0.0)))
             for i, k in enumerate(conds)]
    events = [("speed_up", "a", [("speed_up", xosc.AbsoluteSpeedAction(20.0, xosc.TransitionDynamics(
        xosc.DynamicsShapes.linear, xosc.DynamicsDimension.rate, 2.0)))], EX.at_start("now"))]
    events += [(k, f"x_{k}", [(f"{k}_go", step_speed(1.0))], c) for k, c in conds.items()]
    path = write(tmp_path / "more.xosc", loop_street, entities, init, events, stop_s=20.0)
    sb, states = play(path, lanes, lambda t: (5.0 * t, -1.6, 0.0, 5.0), 9.0)
    when = {k: sb.started.get(("event", k)) for k in conds}
    # a's speed after t s is 2 t (from 0 at time 0); its box centre 1.3 m ahead of its reference point
    assert when["fast"] == pytest.approx(2.5, abs=1e-6) and when["faster"] == pytest.approx(2.6, abs=1e-6)
    assert when["still"] == pytest.approx(1.0, abs=1e-6)
    assert when["pushing"] == pytest.approx(0.1, abs=1e-6)  # (its acceleration over the first step)
    assert when["headway"] == pytest.approx(7.1, abs=1e-6) and when["ttc"] == pytest.approx(8.1, abs=1e-6)
    x_at = lambda t: -40.0 + 1.3 + t * t  # noqa: E731  (1/2 a t^2 with a = 2)
    t = when["near"]
    assert abs(x_at(t) + 10.0) < 3.0 <= abs(x_at(t - 0.1) + 10.0) + 0.1


def test_gsim_serve_serves_an_openscenario_file_whose_sessions_play_its_storyboard(loop_street, roads, tmp_path):
    """`gsim serve FILE.xosc`: a served scenario (its name the id); a session of it (the Run the server makes for
    StartSession) drives the file's car as the storyboard says."""
    import shutil
    pytest.importorskip("grpc", reason="needs the serve extra")
    from gsim.bridges.api.server import load_served
    from gsim.bridges.closed_loop.runner import Run
    shutil.copy(roads / "one" / "road.xodr", tmp_path / "road.xodr")
    served = load_served(braking(tmp_path, loop_street))
    assert served.id == "braking" and served.kind == "scenario" and served.scenario.storyboard is not None
    assert served.scenario.with_dynamics("ks").storyboard is served.scenario.storyboard  # (gsim closed-loop --dynamics)
    run = Run(served.scenario, tmp_path / "session", "remote", render=False, video=False)
    try:
        obs = run.start()
        for _ in range(5):
            obs, _, _ = run.step([[0.5, 3.0, 0.0], [1.0, 6.0, 0.0]])
    finally:
        run.finish()
    car = next(b for b in obs.actors if b.id == "braker")
    assert math.hypot(car.vx, car.vy) == pytest.approx(6.0, abs=0.05) and car.x == pytest.approx(13.3 + 3.0, abs=0.1)


def test_entities_from_a_catalog_with_parameter_assignments(loop_street, roads, tmp_path, capsys):
    """A vehicle catalog written by scenariogeneration (an entry whose length is a parameter): the scenario's entity
    takes the entry's box, the reference's assignment over the entry's default; a missing entry is one line."""
    import shutil
    shutil.copy(roads / "one" / "road.xodr", tmp_path / "road.xodr")
    (tmp_path / "catalogs").mkdir()
    entry = xosc.Vehicle("long_car", xosc.VehicleCategory.car, xosc.BoundingBox(2.0, "$length", 1.6, 1.4, 0.0, 0.8),
                         xosc.Axle(0.5, 0.6, 1.7, 2.8, 0.3), xosc.Axle(0.5, 0.6, 1.7, 0.0, 0.3), 50, 8, 9)
    entry.add_parameter(xosc.Parameter("length", xosc.ParameterType.double, "4.5"))
    catalog = xosc.CatalogFile()
    catalog.create_catalog(str(tmp_path / "catalogs" / "Cars.xosc"), "Cars", "cars", "tests")
    catalog.add_to_catalog(entry)
    catalog.dump()
    path = Path(braking(tmp_path, loop_street))
    text = path.read_text()
    ref = ('<CatalogReference catalogName="Cars" entryName="long_car"><ParameterAssignments>'
           '<ParameterAssignment parameterRef="length" value="5.5"/></ParameterAssignments></CatalogReference>')
    import re
    text = re.sub(r'(<ScenarioObject name="braker">)\s*<Vehicle .*?</Vehicle>', r"\1" + ref, text, flags=re.S)
    text = text.replace("<CatalogLocations/>", '<CatalogLocations><VehicleCatalog><Directory path="catalogs"/>'
                                               '</VehicleCatalog></CatalogLocations>')
    path.write_text(text)
    plan = read_plan(path)
    assert plan.entities["braker"].size == (5.5, 2.0, 1.6) and plan.entities["braker"].centre == (1.4, 0.0, 0.8)
    assert read_xosc(path).scenario.edits[0].asset == "suv"  # (the library's asset nearest 5.5 x 2.0 x 1.6)
    missing = tmp_path / "missing.xosc"
    missing.write_text(text.replace('entryName="long_car"', 'entryName="short_car"'))
    _bad(tmp_path, capsys, missing, "catalog 'Cars'")


def test_relative_target_speeds_and_the_egos_controller(loop_street, roads, tmp_path, capsys):
    """A car keeps the ego's speed plus 1 m/s (continuous: it follows the ego's speed changes); another goes to half
    the ego's speed in 2 s (linear) and keeps it; the ego's ActivateControllerAction in Init is accepted (the agent is
    its controller), another entity's is refused."""
    import shutil
    shutil.copy(roads / "one" / "road.xodr", tmp_path / "road.xodr")
    lanes = LaneMap.read(tmp_path / "road.xodr")
    step = xosc.TransitionDynamics(xosc.DynamicsShapes.step, xosc.DynamicsDimension.time, 0)
    linear = xosc.TransitionDynamics(xosc.DynamicsShapes.linear, xosc.DynamicsDimension.time, 2.0)
    init = [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
            ("ego", xosc.ActivateControllerAction(True, True)),
            ("a", xosc.TeleportAction(xosc.WorldPosition(-40.0, -4.0, 0.0, 0.0))),
            ("b", xosc.TeleportAction(xosc.WorldPosition(-60.0, -4.0, 0.0, 0.0)))]
    events = [("keep", "a", [("keep", xosc.RelativeSpeedAction(1.0, "ego", step, xosc.SpeedTargetValueType.delta,
                                                                True))], EX.at_start("t0")),
              ("half", "b", [("half", xosc.RelativeSpeedAction(0.5, "ego", linear, xosc.SpeedTargetValueType.factor,
                                                                False))], EX.at_start("t1"))]
    path = write(tmp_path / "relative.xosc", loop_street, {"ego": car(), "a": car(), "b": car()}, init, events,
                 stop_s=20.0)
    ego_speed = lambda t: 4.0 if t < 1.0 else 8.0  # noqa: E731
    sb, states = play(path, lanes, lambda t: (0.0, -1.6, 0.0, ego_speed(t)), 4.0)
    at = {round(t, 1): s for t, s in states}
    assert at[0.5]["a"][3] == pytest.approx(5.0) and at[1.5]["a"][3] == pytest.approx(9.0)
    assert ("action", "keep") not in sb.ended  # (continuous: it runs on)
    assert at[0.5]["b"][3] == pytest.approx(0.5 * 0.25 * 4.0) and at[1.5]["b"][3] == pytest.approx(0.75 * 4.0)
    assert at[3.0]["b"][3] == pytest.approx(4.0) and ("action", "half") in sb.ended
    bad = tmp_path / "controller.xosc"
    bad.write_text(Path(path).read_text().replace('<Private entityRef="a">', '<Private entityRef="a"><PrivateAction>'
                                                  '<ControllerAction><ActivateControllerAction lateral="true" '
                                                  'longitudinal="true"/></ControllerAction></PrivateAction>', 1))
    _bad(tmp_path, capsys, bad, "<ActivateControllerAction> of 'a': only the ego takes a controller")


def test_a_car_driving_against_its_lanes_direction_follows_it_and_changes_lanes_as_it_drives(tmp_path):
    """On a road written by scenariogeneration (two lanes each way): a car put on lane 1 facing along s (esmini's
    ALKS files drive lane 1 so) follows it along s, and a lane change one lane to its right takes it to lane -1."""
    xodr = pytest.importorskip("scenariogeneration.xodr")
    road = xodr.create_road(xodr.Line(300), id=1, left_lanes=2, right_lanes=2, lane_width=3.5)
    odr = xodr.OpenDrive("t")
    odr.add_road(road)
    odr.adjust_roads_and_lanes()
    odr.write_xml(str(tmp_path / "road.xodr"))
    lanes = LaneMap.read(tmp_path / "road.xodr")
    turned = xosc.LanePosition(20.0, 0.0, 1, "1", xosc.Orientation(h=math.pi, reference=xosc.ReferenceContext.relative))
    path = write(tmp_path / "against.xosc", None, {"ego": car(), "a": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.75, 0.0, 0.0))),
                  ("a", xosc.TeleportAction(turned)), ("a", step_speed(10.0))],
                 [("right", "a", [("right", xosc.RelativeLaneChangeAction(-1, "a", xosc.TransitionDynamics(
                     xosc.DynamicsShapes.sinusoidal, xosc.DynamicsDimension.distance, 20.0)))], at_time("t", 1.0))])
    sb, states = play(path, lanes, lambda t: (0.0, -1.75, 0.0, 0.0), 5.0)
    at = {round(t, 1): s for t, s in states}
    assert at[0.0]["a"][:2] == pytest.approx((20.0, 1.75), abs=1e-6) and math.cos(at[0.0]["a"][2]) == pytest.approx(1.0)
    assert at[1.0]["a"][:2] == pytest.approx((30.0, 1.75), abs=1e-6)  # along s, on lane 1's centre
    assert at[4.0]["a"][1] == pytest.approx(-1.75, abs=1e-3) and at[4.0]["a"][0] == pytest.approx(60.0, abs=1e-3)
    assert ("action", "right") in sb.ended


def test_expressions_are_evaluated_by_their_grammar_not_by_python():
    from gsim.bridges.openscenario.expressions import as_text, evaluate
    p = {"v": "50", "flag": "true", "name": "car"}
    assert evaluate("${$v / 3.6}", p) == pytest.approx(13.8888889)
    assert evaluate("${2 + 3 * 4 - -1}", p) == 15.0 and evaluate("${(2 + 3) * 4 % 7}", p) == 6.0
    assert evaluate("${max(1, $v, 3) + round(2.5) + pow(2, 3) + sqrt(16)}", p) == 50 + 3 + 8 + 4
    assert evaluate("${$v > 10 and not false or $flag}", p) is True and evaluate("${1 == 2}", p) is False
    assert as_text(evaluate("${100 / 4}", p)) == "25" and as_text(evaluate("${1 / 4}", p)) == "0.25"
    for bad, why in (("${1 / 0}", "division by zero"), ("${$nope + 1}", "no parameter $nope"),
                     ("${2 +}", "unexpected end"), ("${__import__('os')}", "unexpected"), ("${sqrt(-1)}", "sqrt"),
                     ("${$name * 2}", "not a number"), ("${1e308 * 1e308}", "not finite"), ("${(1}", "expected )")):
        with pytest.raises(ValueError, match=re.escape(why)):
            evaluate(bad, p)


def test_a_file_with_expressions_negative_rates_and_an_empty_trailer_plays(loop_street, roads, tmp_path):
    """As esmini's files are written: a speed in km/h turned to m/s by an expression, a deceleration written as a
    negative rate, and a catalog-style vehicle with a trailer hitch and an empty trailer reference."""
    import shutil
    shutil.copy(roads / "one" / "road.xodr", tmp_path / "road.xodr")
    lanes = LaneMap.read(tmp_path / "road.xodr")
    text = Path(braking(tmp_path, loop_street)).read_text()
    text = text.replace('<ParameterDeclaration name="brake_at" parameterType="double" value="1.0"/>',
                        '<ParameterDeclaration name="brake_at" parameterType="double" value="1.0"/>'
                        '<ParameterDeclaration name="kmh" parameterType="double" value="${$brake_at * 21.6}"/>')
    text = text.replace('<AbsoluteTargetSpeed value="6.0"/>', '<AbsoluteTargetSpeed value="${$kmh / 3.6}"/>')
    text = text.replace('value="4.0" dynamicsDimension="rate"', 'value="-4.0" dynamicsDimension="rate"')
    text = text.replace('</Axles>', '</Axles><TrailerHitch dx="-1.2"/><Trailer><TrailerRef entityRef=""/></Trailer>', 1)
    path = tmp_path / "esmini_like.xosc"
    path.write_text(text)
    sb, states = play(path, lanes, parked_ego, 3.0)
    speed = {round(t, 1): s["braker"][3] for t, s in states}
    assert speed[1.0] == pytest.approx(6.0) and speed[1.6] == pytest.approx(4.0) and speed[2.6] == pytest.approx(0.0)


def test_a_storys_state_is_its_acts(loop_street, roads, tmp_path):
    """A story starts with its first act and is running while its acts run; an event waiting for the story's start
    transition starts at the next step."""
    lanes = LaneMap.read(roads / "one" / "road.xodr")
    started = xosc.ValueTrigger("story_on", 0, xosc.ConditionEdge.none, xosc.StoryboardElementStateCondition(
        xosc.StoryboardElementType.story, "story", xosc.StoryboardElementState.startTransition))
    path = write(tmp_path / "story.xosc", loop_street, {"ego": car(), "a": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                  ("a", xosc.TeleportAction(xosc.WorldPosition(20.0, -1.75, 0.0, 0.0)))],
                 [("go", "a", [("go", step_speed(3.0))], started)])
    sb, states = play(path, lanes, parked_ego, 1.0)
    assert sb.started[("story", "story")] == 0.0 and sb.started[("event", "go")] == pytest.approx(0.1)
    assert ("story", "story") in sb.ended  # (its one act has ended: its event's action is done)


def test_a_car_keeps_its_distance_and_its_time_gap_behind_another(loop_street, roads, tmp_path):
    """LongitudinalDistanceAction: without constraints a car keeps 10 m (centre to centre) behind the ego as the ego
    drives at 5 m/s; with maxAcceleration 2 m/s^2 another closes on a 1.5 s time gap gradually and keeps it."""
    lanes = LaneMap.read(roads / "one" / "road.xodr")
    keep = xosc.LongitudinalDistanceAction("ego", freespace=False, distance=10.0)
    gap = xosc.LongitudinalDistanceAction("ego", freespace=False, timeGap=1.5, max_acceleration=2.0,
                                          max_deceleration=6.0, max_speed=30.0)
    path = write(tmp_path / "keep.xosc", loop_street, {"ego": car(), "a": car(), "b": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                  ("a", xosc.TeleportAction(xosc.WorldPosition(-25.0, -9.0, 0.0, 0.0))),  # (off the road: they
                  ("b", xosc.TeleportAction(xosc.WorldPosition(-40.0, -12.0, 0.0, 0.0)))],  # go straight on)
                 [("keep", "a", [("keep", keep)], EX.at_start("k")), ("gap", "b", [("gap", gap)], EX.at_start("g"))],
                 stop_s=30.0)
    sb, states = play(path, lanes, lambda t: (5.0 * t, -1.6, 0.0, 5.0), 20.0)
    at = {round(t, 1): s for t, s in states}
    behind = lambda t, who="a": 5.0 * t - at[t][who][0]  # noqa: E731  (along x: both box centres 1.3 m ahead)
    assert behind(0.1) == pytest.approx(10.0, abs=1e-6) and behind(5.0) == pytest.approx(10.0, abs=1e-6)
    assert at[5.0]["a"][3] == pytest.approx(5.0, abs=1e-6)
    speeds = np.array([s["b"][3] for _, s in states])
    assert np.diff(speeds).max() <= 2.0 * 0.1 + 1e-9  # never faster than its constraint
    assert at[20.0]["b"][3] == pytest.approx(5.0, abs=0.01)
    assert behind(20.0, "b") == pytest.approx(1.5 * 5.0, abs=0.05)  # 1.5 s at 5 m/s behind


def test_a_condition_delay_fires_what_held_that_long_ago(loop_street, roads, tmp_path):
    """delay 0.5 s: a level condition (time > 1 s, true from 1.1 s) starts its event at 1.6 s; a rising edge (true at
    1.1 s only) starts its event at 1.6 s too."""
    lanes = LaneMap.read(roads / "one" / "road.xodr")
    late = lambda name, edge: xosc.ValueTrigger(name, 0.5, edge, xosc.SimulationTimeCondition(  # noqa: E731
        1.0, xosc.Rule.greaterThan))
    path = write(tmp_path / "delay.xosc", loop_street, {"ego": car(), "a": car(), "b": car()},
                 [("ego", xosc.TeleportAction(xosc.WorldPosition(0.0, -1.6, 0.0, 0.0))),
                  ("a", xosc.TeleportAction(xosc.WorldPosition(20.0, -1.75, 0.0, 0.0))),
                  ("b", xosc.TeleportAction(xosc.WorldPosition(30.0, -1.75, 0.0, 0.0)))],
                 [("level", "a", [("level", step_speed(1.0))], late("lv", xosc.ConditionEdge.none)),
                  ("edge", "b", [("edge", step_speed(1.0))], late("ed", xosc.ConditionEdge.rising))])
    sb, states = play(path, lanes, parked_ego, 3.0)
    assert sb.started[("event", "level")] == pytest.approx(1.6) and sb.started[("event", "edge")] == pytest.approx(1.6)
