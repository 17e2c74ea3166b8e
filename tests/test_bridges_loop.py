"""The closed loop on a small synthetic street: replay of the unedited log, lidar-aeb against a car across
its lane (and replay into it), reproducible SUMO traffic, the recorded run (metrics, video, log, MCAP),
agent faults, bad scenarios and the Gymnasium environment."""
import json

import numpy as np
import pytest

pytest.importorskip("sumolib")
pytest.importorskip("libsumo")
pytest.importorskip("trimesh")
pytest.importorskip("gymnasium")
yaml = pytest.importorskip("yaml")

import gsim  # noqa: E402
from gsim.bridges.closed_loop.dynamics import ActionError, Controls  # noqa: E402
from gsim.bridges.closed_loop.runner import AgentError, run  # noqa: E402
from gsim.bridges.closed_loop.scenario import ScenarioError, load_loop_scenario  # noqa: E402
from gsim.scenes.log import validate_log  # noqa: E402
from support import ACROSS, scenario  # noqa: E402

def steps(out):
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def test_replay_of_the_unedited_log_drives_it_without_collision(loop_street, tmp_path):
    m = run(scenario(loop_street, "free"), "replay", tmp_path / "r", progress=False)
    assert m["collision"] is False and m["completed"] is True
    assert m["route_completion"] > 0.97 and m["drivable_area_compliance"] == 1.0 and m["score"] > 0.9
    # the replayed ego stays on the logged path
    log = gsim.scenes.log.load_log(loop_street / "log")
    rows = steps(tmp_path / "r")
    dev = [np.linalg.norm(np.array([s["ego"]["x_m"], s["ego"]["y_m"]]) - log.T_world_vehicle(s["t_us"])[:2, 3])
           for s in rows]
    assert max(dev) < 0.3
    # progress counts from where the run starts, at the box centre: the first step's is the distance driven
    assert abs(rows[1]["metrics"]["progress_m"] - 0.1 * rows[0]["ego"]["speed_mps"]) < 0.05


def test_lidar_aeb_stops_before_a_car_across_its_lane_and_replay_hits_it(loop_street, tmp_path):
    path = scenario(loop_street, "across", ACROSS)
    aeb = run(path, "lidar-aeb", tmp_path / "aeb", progress=False)
    assert aeb["collision"] is False
    last = steps(tmp_path / "aeb")[-1]
    assert last["ego"]["speed_mps"] < 0.05
    front = last["ego_box"]["xyz"][0] + last["ego_box"]["size"][0] / 2
    car = next(a for a in last["actors"] if a["id"] == "across")
    assert 0.0 < car["xyz"][0] - car["size"][1] / 2 - front < 4.0  # stopped short of it, not far away
    replay = run(path, "replay", tmp_path / "replay", progress=False)
    assert replay["collision"] is True and replay["first_collision"]["with"] == ["across"]
    assert replay["no_collision"] == 0.0 and replay["score"] == 0.0
    priv = run(path, "privileged", tmp_path / "priv", progress=False)
    assert priv["collision"] is False and priv["score"] > aeb["score"] - 1e-9


def test_sumo_traffic_is_reproducible_for_a_seed(loop_street, tmp_path):
    path = scenario(loop_street, "traffic", traffic={"density_per_km_lane": 40})
    strip = lambda rows: [{k: r[k] for k in ("ego", "actors", "metrics")} for r in rows]  # noqa: E731
    a = run(path, "privileged", tmp_path / "a", seed=3, progress=False, render=False)
    b = run(path, "privileged", tmp_path / "b", seed=3, progress=False, render=False)
    run(path, "privileged", tmp_path / "c", seed=4, progress=False, render=False)
    ra, rb, rc = steps(tmp_path / "a"), steps(tmp_path / "b"), steps(tmp_path / "c")
    assert len(ra[-1]["actors"]) > 2  # SUMO's vehicles are there as actors, moving boxes as they drive
    assert max(np.hypot(*a["velocity"]) for a in ra[-1]["actors"]) > 1.0
    assert strip(ra) == strip(rb) and a["score"] == b["score"]
    assert strip(ra) != strip(rc)
    # with the sensors rendered and an agent that reads them
    path = scenario(loop_street, "across_repro", ACROSS)
    run(path, "lidar-aeb", tmp_path / "d", seed=1, progress=False)
    run(path, "lidar-aeb", tmp_path / "e", seed=1, progress=False)
    assert steps(tmp_path / "d") == steps(tmp_path / "e")


def test_a_network_of_your_own_with_its_transform(loop_street, tmp_path):
    """A user's .net.xml in its own frame (here: the street's network turned 90 degrees and shifted), with the
    transform to the world and its routes: SUMO traffic lands on the road, the replay stays on it."""
    import shutil
    from gsim.bridges.closed_loop.sumo import RoadSpec, build_network
    log = gsim.scenes.log.load_log(loop_street / "log")
    T = np.array([[0.0, -1, 0, 100], [1, 0, 0, -40], [0, 0, 1, 0], [0, 0, 0, 1]])  # T_net_world
    path = log.ego_poses[:, :2, 3] @ T[:2, :2].T + T[:2, 3]
    built = build_network(path, RoadSpec(), tmp_path / "net")
    shutil.copy(built.path, tmp_path / "mine.net.xml")
    road = {"net": str(tmp_path / "mine.net.xml"), "T_world_net": np.linalg.inv(T).tolist(),
            "forward_route": built.forward_route, "opposite_route": built.opposite_route}
    m = run(scenario(loop_street, "own_net", road=road, traffic={"density_per_km_lane": 20}), "replay", tmp_path / "own",
            progress=False, render=False)
    assert m["drivable_area_compliance"] == 1.0 and m["route_completion"] > 0.97 and not m["collision"]
    from gsim.bridges.closed_loop.road import Polyline
    cars = np.array([a["xyz"][:2] for a in steps(tmp_path / "own")[-1]["actors"] if a["id"] != "parked"])
    in_net = cars @ T[:2, :2].T + T[:2, 3]  # where they are in the net's own frame
    lanes = [Polyline(c) for _, c, _ in built.lanes() if np.ptp(c, axis=0).max() > 0]
    assert len(cars) > 3 and max(min(lane.project(p)[2][0] for lane in lanes) for p in in_net) < 0.3


def test_a_run_writes_metrics_video_log_and_mcap(loop_street, tmp_path):
    out = tmp_path / "run"
    m = run(scenario(loop_street, "rec", ACROSS), "lidar-aeb", out, progress=False)
    saved = json.loads((out / "metrics.json").read_text())
    for k in ("collision", "score", "route_completion", "steps", "no_collision", "drivable_area_compliance",
              "time_to_collision", "ego_progress", "comfort"):
        assert k in saved
    assert saved["score"] == m["score"] and 0.0 <= saved["score"] <= 1.0
    assert "score" in (out / "metrics.md").read_text()
    assert (out / "video.mp4").stat().st_size > 1000
    log = validate_log(out / "log")
    assert len(log.frames) == m["steps"] + 1 and {a.id for a in log.actors} >= {"across", "parked"}
    f, before = log.frames[2], log.frames[1]
    (obs,) = f.lidars.values()
    fired = obs.timestamp_us + log.sweep(obs)[:, 4]  # each return's time: within the step that ends at the frame
    assert fired.min() >= before.timestamp_us and fired.max() <= f.timestamp_us and fired.max() > fired.min()
    from mcap.reader import make_reader
    with open(out / "run.mcap", "rb") as f:
        summary = make_reader(f).get_summary()
    topics = {c.topic: summary.schemas[c.schema_id].name for c in summary.channels.values()}
    assert topics["/camera/front"] == "foxglove.CompressedImage" and topics["/lidar/top"] == "foxglove.PointCloud"
    assert topics["/tf"] == "foxglove.FrameTransform" and topics["/boxes"] == "foxglove.SceneUpdate"
    assert "/step" in topics
    counts = summary.statistics.channel_message_counts
    by_topic = {summary.channels[k].topic: v for k, v in counts.items()}
    assert by_topic["/camera/front"] == m["steps"] + 1 and by_topic["/boxes"] == m["steps"] + 1
    assert recording(out)["complete"] == "true"


def test_a_run_without_video_needs_no_ffmpeg(loop_street, tmp_path, monkeypatch):
    from gsim.bridges.recording import record
    monkeypatch.setattr(record, "write_video", lambda *a, **k: pytest.fail("no video was asked for"))
    m = run(scenario(loop_street, "novideo", ACROSS), "replay", tmp_path / "nv", progress=False, render=False,
            max_steps=3, video=False)
    assert m["steps"] == 3 and (tmp_path / "nv" / "metrics.json").is_file()
    assert not (tmp_path / "nv" / "video.mp4").exists()


def recording(out) -> dict:
    """The MCAP file's gsim.recording metadata (complete, reason)."""
    from mcap.reader import make_reader
    with open(out / "run.mcap", "rb") as f:
        return next(dict(r.metadata) for r in make_reader(f).iter_metadata() if r.name == "gsim.recording")


class NaNAgent:
    """Brakes, then returns NaN at its third step."""

    def __init__(self):
        self.k = 0

    def act(self, obs):
        self.k += 1
        return Controls(float("nan") if self.k == 3 else -1.0, 0.0)


class FloorItAgent:
    """Asks for more acceleration than the car has."""

    def act(self, obs):
        return Controls(20.0, 0.0)


class RaisingAgent:
    def act(self, obs):
        raise KeyError("boom")


def test_agent_faults_stop_the_run_with_the_step_and_keep_what_was_done(loop_street, tmp_path):
    path = scenario(loop_street, "faults")
    with pytest.raises(ActionError, match="step 3"):
        run(path, "test_bridges_loop:NaNAgent", tmp_path / "nan", progress=False, render=False)
    saved = json.loads((tmp_path / "nan" / "metrics.json").read_text())
    assert saved["completed"] is False and "step 3" in saved["error"] and saved["steps"] == 2
    assert len(steps(tmp_path / "nan")) == 3  # the start and the two completed steps
    assert recording(tmp_path / "nan")["complete"] == "false"  # run.mcap itself, finished, not a .part
    with pytest.raises(ActionError, match="step 1.*limits"):
        run(path, "test_bridges_loop:FloorItAgent", tmp_path / "range", progress=False, render=False)
    with pytest.raises(AgentError, match="step 1.*KeyError"):
        run(path, "test_bridges_loop:RaisingAgent", tmp_path / "raise", progress=False, render=False)
    with pytest.raises(ValueError, match="unknown agent"):
        run(path, "nobody", tmp_path / "nobody", progress=False)
    assert not (tmp_path / "nobody").exists()


AGENT_SCRIPT = """
import json, sys
import numpy as np
for line in sys.stdin:
    msg = json.loads(line)
    if msg["type"] == "reset":
        assert msg["vehicle"]["wheelbase_m"] > 0 and len(msg["route_xy"]) > 1
        continue
    pts = np.load(msg["lidars"]["top"])
    assert pts.shape[1] == 5 and np.load(msg["cameras"]["front"]).shape == (60, 96, 3)
    print(json.dumps({"accel_mps2": -6.0, "steer_rate_rps": 0.0}), flush=True)
"""


def test_an_agent_in_its_own_process_drives_over_json_lines(loop_street, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT)
    import sys
    m = run(scenario(loop_street, "exec", ACROSS), f"exec:{sys.executable} {script}", tmp_path / "exec", progress=False)
    assert m["completed"] and not m["collision"]
    assert steps(tmp_path / "exec")[-1]["ego"]["speed_mps"] == 0.0  # it braked all the way
    with pytest.raises(AgentError, match="step [01].*exited"):  # at the reset line or the first step: a race
        run(scenario(loop_street, "exec2"), f"exec:{sys.executable} -c pass", tmp_path / "exec2", progress=False,
            render=False)


def test_a_sumo_failure_stops_the_run_naming_the_step_and_keeps_it(loop_street, tmp_path, monkeypatch):
    """SUMO dying (gsim.bridges.closed_loop.sumo raises SumoError, tested with a killed SUMO in test_bridges_sumo) ends
    the run with an error that names the step, after every completed step was recorded."""
    from gsim.bridges.closed_loop import sumo
    from gsim.bridges.closed_loop.loop import LoopError
    real = sumo.SumoTraffic.step
    calls = []

    def dying(self):
        calls.append(1)
        if len(calls) == 4:
            raise sumo.SumoError("Connection closed by SUMO (a stand-in for a crash)")
        return real(self)

    monkeypatch.setattr(sumo.SumoTraffic, "step", dying)
    path = scenario(loop_street, "sumo_dies", traffic={"density_per_km_lane": 20})
    with pytest.raises(LoopError, match="step 4: SUMO failed"):
        run(path, "privileged", tmp_path / "dies", progress=False, render=False)
    saved = json.loads((tmp_path / "dies" / "metrics.json").read_text())
    assert saved["completed"] is False and saved["steps"] == 3 and len(steps(tmp_path / "dies")) == 4
    validate_log(tmp_path / "dies" / "log")


def test_log_actors_handed_to_sumo_keep_their_surfels_and_react(loop_street, tmp_path):
    from gsim.bridges.closed_loop.loop import ClosedLoop
    lead = [{"kind": "insert", "asset": "suv", "id": "lead",
             "track": {"path": [[12.0, -1.75], [60.0, -1.75]], "speed_mps": 8.0}}]
    sc = load_loop_scenario(scenario(loop_street, "handover", lead, log_actors={"mode": "sumo", "handover_s": 0.5}))
    with ClosedLoop(sc, seed=0, render=False) as loop:
        obs = loop.reset()
        before = [a for a in loop.scene_at().actors if a.id == "lead"][0]
        for _ in range(15):
            obs, m, _ = loop.step(Controls(0.0, 0.0))
        assert "lead" in {v.id for v in loop.traffic_vehicles}  # SUMO drives it now
        drawn = [a for a in loop.scene_at().actors if a.id == "lead"]
        assert len(drawn) == 1 and drawn[0].surfels is before.surfels  # its own surfels, not a library car
        x = [a.x for a in obs.actors if a.id == "lead"][0]
        assert x > 12.0 + 8.0 * 0.5 + 3.0  # it drove on under SUMO


def test_bad_closed_loop_scenarios_are_refused_naming_the_field(loop_street, tmp_path):
    with pytest.raises(ScenarioError, match="closed_loop.road"):
        load_loop_scenario(scenario(loop_street, "bad", road={"lanes": 1, "ego_lane": 2}))
    with pytest.raises(ScenarioError, match="closed_loop.step_s"):
        load_loop_scenario(scenario(loop_street, "bad2", step_s=-1))
    with pytest.raises(FileNotFoundError, match="shipped"):
        load_loop_scenario("no-such-scenario")


def test_gymnasium_environment_passes_check_env(loop_street):
    import gymnasium
    from gymnasium.utils.env_checker import check_env
    import gsim.bridges.closed_loop.env  # noqa: F401  (registers gsim/ClosedLoop-v0)
    env = gymnasium.make("gsim/ClosedLoop-v0", scenario=scenario(loop_street, "gym", ACROSS))
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    assert obs["cameras"]["front"].shape == (60, 96, 3) and obs["route"].shape == (61, 2)
    total, done = 0.0, False
    while not done:  # full braking: it never reaches the car
        obs, r, term, trunc, info = env.step(np.array([-8.0, 0.0], np.float32))
        total += r
        done = term or trunc
    assert trunc and not info["run"]["collision"]
    env.close()


def test_route_extensions_follow_the_path_over_metres_not_jitter():
    from gsim.bridges.closed_loop.loop import LoopError, _extended
    rng = np.random.default_rng(0)
    path = np.c_[np.linspace(0.0, 20.0, 201), np.zeros(201)]
    path[:5] = path[0] + rng.normal(0, 0.01, (5, 2))  # a standing start: centimetres of jitter
    ext = _extended(path, 100.0)
    assert np.allclose(ext[0], [-100.0, 0.0], atol=1.0) and np.allclose(ext[-1], [120.0, 0.0], atol=1.0)
    with pytest.raises(LoopError, match="moves 0.0"):
        _extended(np.zeros((10, 2)) + rng.normal(0, 0.01, (10, 2)), 100.0)


def _rk4_steps(f, x, u, p, dt, n):
    """Re-integrating a steps.jsonl line from the line before, as docs/closed_loop.md says: n classical Runge-Kutta
    sub-steps of the package's f, a brake holding the car at rest, a sub-step below 0 m/s ending at rest."""
    motion = {7: (3, 5, 6)}  # ST's velocity entries
    for _ in range(n):
        v = lambda y: y[3] * np.cos(y[6])  # noqa: E731  (the rear axle's speed along the heading)
        w = [u[0], 0.0] if u[1] < 0 and v(x) <= 0 else u
        k1 = np.array(f(list(x), w, p))
        k2 = np.array(f(list(x + dt / n / 2 * k1), w, p))
        k3 = np.array(f(list(x + dt / n / 2 * k2), w, p))
        k4 = np.array(f(list(x + dt / n * k3), w, p))
        x = x + dt / n / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        if v(x) < 0:
            x[list(motion[len(x)])] = 0.0
    return x


def test_the_ego_on_commonroads_single_track_records_what_re_integrates(loop_street, tmp_path):
    """ego: {dynamics: st}: the run drives on CommonRoad's ST (vehicle 2 by default), and each steps.jsonl line's
    dynamics re-integrate from the line before with the package's own derivative."""
    pytest.importorskip("vehiclemodels")
    from vehiclemodels.vehicle_dynamics_st import vehicle_dynamics_st
    from vehiclemodels.vehicle_parameters import setup_vehicle_parameters
    m = run(scenario(loop_street, "st", ego={"dynamics": "st"}), "privileged", tmp_path / "st", progress=False,
            render=False, max_steps=12)
    assert m["steps"] == 12 and m["collision"] is False
    rows = steps(tmp_path / "st")
    d = [r["dynamics"] for r in rows]
    assert {(x["model"], x["vehicle"], x["integrator"]) for x in d} == {("st", 2, "rk4")}
    assert d[0]["u"] is None and d[0]["substeps"] == 0 and all(x["substeps"] == 100 and x["dt"] == 0.1 for x in d[1:])
    p = setup_vehicle_parameters(vehicle_id=2)
    for a, b in zip(d, d[1:]):
        again = _rk4_steps(vehicle_dynamics_st, np.array(a["x"]), b["u"], p, b["dt"], b["substeps"])
        assert np.abs(again - np.array(b["x"])).max() < 1e-9
    # the line's ego state is the rear axle of CommonRoad's centre of mass (p.b ahead of it along the yaw)
    x, ego = d[-1]["x"], rows[-1]["ego"]
    assert abs(ego["x_m"] + p.b * np.cos(x[4]) - x[0]) < 1e-9 and abs(ego["y_m"] + p.b * np.sin(x[4]) - x[1]) < 1e-9
    assert any(abs(x["u"][1]) > 0 for x in d[1:])  # the tracker drove it


def test_the_bicycle_records_its_state_and_commonroads_limits_come_from_one_place(loop_street, tmp_path):
    run(scenario(loop_street, "bike"), "privileged", tmp_path / "b", progress=False, render=False, max_steps=3)
    d = [r["dynamics"] for r in steps(tmp_path / "b")]
    assert [(x["model"], x["vehicle"], x["integrator"], x["substeps"]) for x in d] == \
        [("bicycle", None, "exact arc", 0)] + [("bicycle", None, "exact arc", 1)] * 3
    assert len(d[1]["x"]) == 5 and len(d[1]["u"]) == 2
    with pytest.raises(ScenarioError, match="closed_loop.vehicle sets wheelbase_m, which CommonRoad's parameter set"):
        load_loop_scenario(scenario(loop_street, "clash", ego={"dynamics": "ks"}, vehicle={"wheelbase_m": 3.0}))
    with pytest.raises(ScenarioError, match="ego.dynamics"):
        load_loop_scenario(scenario(loop_street, "nodyn", ego={"dynamics": "dt"}))
    sc = load_loop_scenario(scenario(loop_street, "cli")).with_dynamics("mb", 3)
    assert (sc.ego.dynamics, sc.ego.vehicle, sc.vehicle_id) == ("mb", 3, 3)
    assert load_loop_scenario(scenario(loop_street, "cli2")).with_dynamics("st").vehicle_id == 2


def test_closed_loop_takes_the_ego_model_and_vehicle_on_its_command_line():
    from gsim.cli import build_parser
    a = build_parser().parse_args(["closed-loop", "s.yaml", "--out", "o", "--dynamics", "st", "--vehicle", "3"])
    assert (a.dynamics, a.vehicle) == ("st", 3)
    a = build_parser().parse_args(["closed-loop", "s.yaml", "--out", "o"])
    assert (a.dynamics, a.vehicle) == (None, None)  # the scenario's
    for bad in (["--vehicle", "5"], ["--dynamics", "dt"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["closed-loop", "s.yaml", "--out", "o", *bad])


def test_the_shipped_scenarios_load_by_name():
    from gsim.bridges.closed_loop.scenario import SHIPPED, shipped_path
    for name in SHIPPED:
        assert shipped_path(name).is_file(), name
        assert load_loop_scenario(name).name == name
