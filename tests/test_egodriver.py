"""AlpaSim egodriver policies as closed-loop agents (gsim.bridges.closed_loop.egodriver) over real gRPC: the
reference policy of carla-driver-interface served in its own process in both of its modes, what gsim sends it
(cameras in the contract revision it speaks, images, egomotion, route, ground truth), its plans followed, and a
dead, hanging or nonsensical server."""
import json
import socket
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("carla_driver_interface", reason="needs the alpasim extra (carla-driver-interface)")
pytest.importorskip("libsumo", reason="needs the sumo extra")

import grpc  # noqa: E402
from carla_driver_interface import protocol  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from gsim.bridges.closed_loop.runner import AgentError, run  # noqa: E402
from gsim.errors import GsimWarning, InputError  # noqa: E402
from support import scenario  # noqa: E402

CLI = Path(sys.executable).with_name("carla-driver-interface")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steps(out):
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


@pytest.fixture(params=["alpasim", "carla"])
def policy(request, tmp_path):
    """carla-driver-interface's route_follower served on 127.0.0.1 in its own process (stopped at the end)."""
    port = free_port()
    p = subprocess.Popen([str(CLI), "serve", "--policy", "route_follower", "--mode", request.param, "--host",
                          "127.0.0.1", "--port", str(port), "--cruise-speed", "6"],
                         stdout=subprocess.DEVNULL, stderr=open(tmp_path / "policy.log", "w"))
    try:
        grpc.channel_ready_future(grpc.insecure_channel(f"127.0.0.1:{port}")).result(timeout=30)
        yield f"127.0.0.1:{port}"
    finally:
        p.terminate()
        p.wait(10)


def test_the_reference_policy_drives_the_lane_over_grpc(loop_street, tmp_path, policy):
    m = run(scenario(loop_street, "ego"), f"egodriver:{policy}", tmp_path / "r", progress=False, max_steps=15)
    assert m["completed"] and m["steps"] == 15 and m["collision"] is False and m["ended_by_agent"] is None
    rows = steps(tmp_path / "r")
    x = np.array([r["ego"]["x_m"] for r in rows])
    y = np.array([r["ego"]["y_m"] for r in rows])
    assert x[-1] - x[0] > 5.0 and np.all(np.diff(x) > 0)  # it drove ahead, along its lane (y = -1.75)
    assert np.abs(y + 1.75).max() < 0.3 and m["drivable_area_compliance"] == 1.0
    assert (tmp_path / "r" / "run.mcap").is_file() and (tmp_path / "r" / "log" / "log.json").is_file()


class Recorder(protocol.EgodriverServiceServicer):
    """A policy server of the test's own: records what it is sent; its drive answers ``plan(request)``."""

    def __init__(self, plan, terminate_at=None, hang_s=0.0):
        self.plan, self.terminate_at, self.hang_s, self.calls = plan, terminate_at, hang_s, []

    def _note(self, name, request, context=None):
        self.calls.append((name, request, None if context is None else dict(context.invocation_metadata())))
        return protocol.Empty()

    def get_version(self, request, context):
        from carla_driver_interface.contract import contract_metadata
        context.send_initial_metadata(contract_metadata(2))
        return protocol.VersionId(version_id="test-policy")

    def start_session(self, request, context):
        self._note("start_session", request, context)
        return protocol.SessionRequestStatus()

    def close_session(self, request, context):
        return self._note("close_session", request)

    def submit_image_observation(self, request, context):
        return self._note("image", request)

    def submit_egomotion_observation(self, request, context):
        return self._note("egomotion", request)

    def submit_route(self, request, context):
        return self._note("route", request)

    def submit_recording_ground_truth(self, request, context):
        return self._note("ground_truth", request)

    def drive(self, request, context):
        self._note("drive", request)
        time.sleep(self.hang_s)
        drives = sum(c[0] == "drive" for c in self.calls)
        response = protocol.DriveResponse(terminate_session=drives == self.terminate_at)
        response.trajectory.CopyFrom(self.plan(request))
        return response


@pytest.fixture
def own_server():
    servers = []

    def start(servicer):
        server = grpc.server(futures.ThreadPoolExecutor(4))
        protocol.add_EgodriverServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(0)


def straight_plan(speed):
    """A plan along +x at ``speed`` from the ego's logged start (x = 0, y = -1.75), 2 s at 10 Hz."""
    def plan(request):
        t0 = request.time_now_us
        return protocol.Trajectory(poses=[protocol.PoseAtTime(timestamp_us=t0 + k * 100_000, pose=protocol.Pose(
            vec=protocol.Vec3(x=speed * (t0 + k * 100_000) * 1e-6, y=-1.75), quat=protocol.Quat(w=1.0)))
            for k in range(21)])
    return plan


def test_what_gsim_sends_a_policy(loop_street, tmp_path, own_server):
    """Cameras in revision 2 (the optical frame in the rig) with the scenario's seed; each step one image per camera
    (JPEG, or PNG on request), the rig's history, the route and the logged path ahead in their frames; a session
    closed at the end; terminate_session ends the run as completed."""
    servicer = Recorder(straight_plan(5.0), terminate_at=6)
    target = own_server(servicer)
    m = run(scenario(loop_street, "sent"), f"egodriver:{target}", tmp_path / "s", seed=7, progress=False,
            max_steps=10, agent_options={"image_format": "png"})
    assert m["completed"] and m["steps"] == 5 and "terminate_session" in m["ended_by_agent"]
    names = [c[0] for c in servicer.calls]
    assert names[0] == "start_session" and names[-1] == "close_session" and names.count("drive") == 6
    start, meta = servicer.calls[0][1], servicer.calls[0][2]
    assert start.random_seed == 7 and meta.get("carla-driver-interface-contract") == "2"
    (cam,) = start.rollout_spec.vehicle.available_cameras
    assert cam.logical_id == "front" and cam.intrinsics.resolution_w == 96 and cam.intrinsics.HasField(
        "opencv_pinhole_param")
    from gsim.bridges.closed_loop.alpasim import pose_matrix
    R = pose_matrix(cam.rig_to_camera)[:3, :3]
    assert np.allclose(R[:, 2], [1, 0, 0], atol=0.05) and np.allclose(R[:, 1], [0, 0, -1], atol=0.05)  # optical
    images = [c[1] for c in servicer.calls if c[0] == "image"]
    assert len(images) == 6 and images[0].camera_image.image_bytes[:8] == b"\x89PNG\r\n\x1a\n"
    assert images[2].camera_image.frame_start_us == images[2].camera_image.frame_end_us == 200_000
    ego = [c[1] for c in servicer.calls if c[0] == "egomotion"]
    assert len(ego[-1].trajectory.poses) == 6 and len(ego[-1].dynamic_states) == 6
    last = ego[-1].trajectory.poses[-1]
    assert last.timestamp_us == 500_000 and abs(last.pose.vec.y + 1.75) < 0.2 and abs(last.pose.vec.z) < 0.05
    route = [c[1] for c in servicer.calls if c[0] == "route"][-1].route
    assert route.waypoints[10].x == pytest.approx(10.0, abs=0.3) and abs(route.waypoints[10].y) < 0.3  # rig frame
    truth = [c[1] for c in servicer.calls if c[0] == "ground_truth"][0].ground_truth.trajectory
    assert truth.poses[0].timestamp_us == 0 and len(truth.poses) > 20
    rows = steps(tmp_path / "s")
    assert rows[-1]["ego"]["x_m"] > 1.0  # the plan's 5 m/s was followed


@pytest.mark.parametrize("plan,why", [
    (lambda r: protocol.Trajectory(), "an empty trajectory"),
    (lambda r: protocol.Trajectory(poses=[protocol.PoseAtTime(timestamp_us=r.time_now_us,
                                                              pose=protocol.Pose(quat=protocol.Quat(w=1)))]),
     "no pose after now"),
    (lambda r: protocol.Trajectory(poses=[protocol.PoseAtTime(timestamp_us=r.time_now_us + 100_000, pose=protocol.Pose(
        vec=protocol.Vec3(x=float("nan")), quat=protocol.Quat(w=1)))]), "a non-finite position"),
])
def test_a_plan_that_cannot_be_followed_brakes_to_a_stop_in_lane(loop_street, tmp_path, own_server, plan, why):
    target = own_server(Recorder(plan))
    with pytest.warns(GsimWarning, match=f"{why}.*brake to a stop along the route"):
        m = run(scenario(loop_street, "bad"), f"egodriver:{target}", tmp_path / "b", progress=False, max_steps=25)
    assert m["completed"] and m["collision"] is False
    rows = steps(tmp_path / "b")
    v = [r["ego"]["speed_mps"] for r in rows]
    assert v[0] > 3.0 and v[-1] == 0.0 and all(abs(r["ego"]["y_m"] + 1.75) < 0.3 for r in rows)


def test_a_dead_or_hanging_server_stops_the_run_naming_the_call_and_keeps_it(loop_street, tmp_path, own_server):
    with pytest.raises(AgentError, match=r"step 0: .*no policy server answers within 1 s"):
        run(scenario(loop_street, "dead"), f"egodriver:127.0.0.1:{free_port()}", tmp_path / "d", progress=False,
            max_steps=5, agent_options={"deadline_s": 1.0})
    assert json.loads((tmp_path / "d" / "metrics.json").read_text())["completed"] is False
    slow = Recorder(straight_plan(5.0), hang_s=3.0)
    target = own_server(slow)
    t = time.perf_counter()
    with pytest.raises(AgentError, match=r"step 1: .*drive \(before step 1\) failed: DEADLINE_EXCEEDED"):
        run(scenario(loop_street, "hang"), f"egodriver:{target}", tmp_path / "h", progress=False, max_steps=5,
            agent_options={"deadline_s": 0.5})
    assert time.perf_counter() - t < 30
    assert len(steps(tmp_path / "h")) == 1  # the start, kept
    time.sleep(3.5)  # the servicer's sleeping drive ends before the server stops
    assert [c[0] for c in slow.calls][-1] == "close_session"  # sent after the failure too


def test_bad_egodriver_specs_are_refused_before_anything_starts():
    from gsim.bridges.closed_loop.agents import load_agent
    for spec in ("egodriver:", "egodriver:nohostport"):
        with pytest.raises(InputError, match="egodriver:HOST:PORT"):
            load_agent(spec)
    with pytest.raises(InputError, match="jpeg or png"):
        load_agent("egodriver:127.0.0.1:1", image_format="gif")
    with pytest.raises(InputError, match="deadline"):
        load_agent("egodriver:127.0.0.1:1", deadline_s=0)
