"""The network sensor API against a real `gsim serve` in a subprocess on 127.0.0.1 (an ephemeral port),
reached only over the network: the committed generated modules are current, renders equal the in-process
API's bit for bit, a remote session records what the same run records in process, status codes for bad
input, and bearer tokens."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("grpc_health")
pytest.importorskip("grpc_reflection")
pytest.importorskip("sumolib")
yaml = pytest.importorskip("yaml")

import gsim  # noqa: E402
from gsim.bridges.api import sensor_pb2 as pb  # noqa: E402
from gsim.bridges.closed_loop.agents import load_agent  # noqa: E402
from gsim.bridges.api.client import SensorClient  # noqa: E402
from gsim.bridges.closed_loop.runner import run  # noqa: E402
from gsim.bridges.api.server import ServerProcess as Served  # noqa: E402
from support import ACROSS, scenario, start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(loop_street):
    s = start_server(loop_street)
    yield s
    s.stop()


def test_the_committed_grpc_modules_match_the_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    from gsim.bridges.api.protogen import GENERATED, HERE, generate
    generate(tmp_path)
    for name in GENERATED:
        assert (tmp_path / name).read_text() == (HERE / name).read_text(), \
            f"bridges/{name} is stale: run python -m gsim.bridges.api.protogen"


def test_scenes_are_listed_and_described(server, loop_street):
    with SensorClient(server.address) as c:
        assert c.health() == "SERVING"
        ids = {s.id: s for s in c.list_scenes()}
        assert set(ids) == {"scene", "across"} and ids["across"].closed_loop and not ids["scene"].closed_loop
        d = c.describe_scene("across")
        log = gsim.scenes.log.load_log(loop_street / "log")
        assert set(d.cameras) == {"front"} and set(d.lidars) == {"top"}  # the scenario's sensors
        assert np.array_equal(d.cameras["front"][1], log.cameras["front"].T_vehicle_camera)
        assert {"parked", "across"} <= set(d.actors) and d.actors["across"][1] == pytest.approx((4.6, 1.9, 1.5), abs=0.5)
        assert np.array_equal(d.ego[0], log.ego_timestamps_us)
        info = c.server_info()
        assert info["workers"] == 1 and "velodyne-hdl64e" in info["lidar_presets"]


def test_renders_equal_the_in_process_api_bit_for_bit(server, loop_street):
    scene = gsim.load_scene(loop_street / "scene")
    log = gsim.scenes.log.load_log(loop_street / "log")
    t = 1_000_000
    T_wv = log.T_world_vehicle(t)
    cam = gsim.FisheyeCamera(80, 50, 30.0, 31.0, 40.0, 25.0, k1=0.05)
    T_wc = T_wv @ log.cameras["front"].T_vehicle_camera
    spec = gsim.LidarSpec.preset("velodyne-vlp16")
    T_wl = T_wv @ log.lidars["top"].T_vehicle_lidar
    moved = {"parked": T_wv @ np.diag([1.0, 1, 1, 1]) + np.c_[np.zeros((4, 3)), [8.0, 0, 0, 0]]}
    with SensorClient(server.address) as c:
        for camera, kw, ref_kw in ((cam, {}, {}), ("front", {}, {"sensor": "front"})):
            ref_cam = cam if camera is cam else log.cameras["front"].camera
            f = c.render_camera("scene", camera, T_wc, timestamp_us=t, **kw)
            g = gsim.render_camera(scene, ref_cam, T_wc, timestamp_us=t, **ref_kw)
            for k in ("rgb", "alpha", "depth"):
                assert np.array_equal(getattr(f, k), getattr(g, k)), k
        f = c.render_camera("scene", "front", T_world_vehicle=T_wv, timestamp_us=t, encoding="png")
        assert np.abs(f.rgb - gsim.render_camera(scene, log.cameras["front"].camera, T_wc, timestamp_us=t,
                                                 sensor="front").rgb).max() <= 0.5 / 255 + 1e-6
        # an actor held elsewhere: the same as the scene with that actor's track replaced
        f = c.render_camera("scene", cam, T_wc, timestamp_us=t, actor_poses=moved)
        from dataclasses import replace
        a = replace(scene.actors[0], track_timestamps_us=np.array([t]), track_poses=moved["parked"][None])
        g = gsim.render_camera(replace(scene, actors=(a,)), cam, T_wc, timestamp_us=t)
        assert np.array_equal(f.rgb, g.rgb)
        # a rolling shutter on a moving camera
        T_wc_end = log.T_world_vehicle(t + 50_000) @ log.cameras["front"].T_vehicle_camera
        f = c.render_camera("scene", cam, T_wc, timestamp_us=t, readout_us=30_000, T_world_camera_end=T_wc_end,
                            end_timestamp_us=t + 50_000)
        g = gsim.render_camera(scene, cam, (np.array([t, t + 50_000]), np.stack([T_wc, T_wc_end])), timestamp_us=t,
                               readout_us=30_000)
        assert np.array_equal(f.rgb, g.rgb) and np.array_equal(f.depth, g.depth)
        # a rolling sweep of a moving sensor
        T_end = log.T_world_vehicle(t + 100_000) @ log.lidars["top"].T_vehicle_lidar
        r = c.render_lidar("scene", spec, T_wl, timestamp_us=t, T_world_lidar_end=T_end, end_timestamp_us=t + 100_000)
        k = gsim.render_lidar(scene, spec, (np.array([t, t + 100_000]), np.stack([T_wl, T_end])), timestamp_us=t)
        for name in ("points", "ranges", "ring", "column", "time_offset_us", "normals", "range_image",
                     "expected_range_image", "alpha_image"):
            assert np.array_equal(getattr(r, name), getattr(k, name)), name
        assert len(r.ranges) > 100


def test_a_remote_session_records_what_the_same_run_records_in_process(server, loop_street, tmp_path):
    path = scenario(loop_street, "across", ACROSS)
    local = run(path, "lidar-aeb", tmp_path / "local", progress=False, max_steps=12)
    agent = load_agent("lidar-aeb")
    with SensorClient(server.address) as c:
        with c.session("across", agent_name="lidar-aeb", max_steps=12) as s:
            agent.reset(s.info)
            obs = s.observation
            while not s.done:
                obs, m, done = s.step(agent.act(obs))
    remote = Path(s.record_dir)
    assert (remote / "steps.jsonl").read_text() == (tmp_path / "local" / "steps.jsonl").read_text()
    wall = ("wall_s", "timing_ms")
    saved = json.loads((remote / "metrics.json").read_text())
    assert {k: v for k, v in saved.items() if k not in wall} == {k: v for k, v in local.items() if k not in wall}
    assert s.metrics["steps"] == 12 and (remote / "run.mcap").is_file() and (remote / "log" / "log.json").is_file()


def test_bad_requests_get_meaningful_status_codes(server, loop_street):
    T = np.eye(4)
    cam = gsim.PinholeCamera(32, 24, 20.0, 20.0, 16.0, 12.0)
    with SensorClient(server.address) as c:
        def code(fn, *a, **kw):
            with pytest.raises(grpc.RpcError) as e:
                fn(*a, **kw)
            return e.value.code(), e.value.details()
        assert code(c.render_camera, "nope", cam, T, timestamp_us=0)[0] == grpc.StatusCode.NOT_FOUND
        assert code(c.render_camera, "scene", "rear", T, timestamp_us=0)[0] == grpc.StatusCode.NOT_FOUND
        st, msg = code(c.render_camera, "scene", cam, T)
        assert st == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("timestamp_us")
        bad = T.copy()
        bad[0, 3] = np.nan
        st, msg = code(c.render_camera, "scene", cam, bad, timestamp_us=0)
        assert st == grpc.StatusCode.INVALID_ARGUMENT and "T_world_camera" in msg
        st, msg = code(c.render_lidar, "scene", "no-such-lidar", T, timestamp_us=0)
        assert st == grpc.StatusCode.NOT_FOUND and msg.startswith("lidar_name")
        huge = pb.RenderCameraRequest(scene_id="scene", camera_model=pb.CameraModel(
            model="pinhole", width=100000, height=100000, fx=1, fy=1), T_world_camera=pb.Transform(m=T.ravel()),
            timestamp_us=0)
        st, msg = code(c.stub.RenderCamera, huge)
        assert st == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("camera_model")
        st, msg = code(c.stub.StepSession, pb.StepSessionRequest(session_id="0", controls=pb.Controls()))
        assert st == grpc.StatusCode.NOT_FOUND and msg.startswith("session_id")
        with c.session("across", max_steps=2) as s:
            st, msg = code(s.step, np.array([[0.1, np.nan, 0.0]]))
            assert st == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("action")
            s.step(np.array([[0.5, 2.0, 0.0], [1.0, 4.0, 0.0]]))  # the session goes on after a refused action
            s.step(np.array([[0.5, 2.0, 0.0], [1.0, 4.0, 0.0]]))
            assert s.done
            assert code(s.step, np.array([[0.5, 2.0, 0.0]]))[0] == grpc.StatusCode.FAILED_PRECONDITION
        assert s.metrics["steps"] == 2 and s.metrics["completed"]


def test_a_token_is_required_when_set_and_off_localhost(loop_street, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    s = Served([str(loop_street / "scene"), "--token-file", str(token)])
    try:
        for given, ok in ((None, False), ("wrong", False), ("s3cret", True)):
            with SensorClient(s.address, token=given) as c:
                if ok:
                    assert c.list_scenes()[0].id == "scene" and c.health() == "SERVING"
                else:
                    for call in (c.list_scenes, c.health):
                        with pytest.raises(grpc.RpcError) as e:
                            call()
                        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        assert s.stop()[0] == 0
    p = subprocess.run([sys.executable, "-m", "gsim.cli", "serve", str(loop_street / "scene"), "--host", "0.0.0.0"],
                       capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                            if k != "GSIM_SERVE_TOKEN"})
    assert p.returncode == 2 and "needs a bearer token" in p.stderr


def test_reflection_describes_the_service_without_the_proto(server):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
    with grpc.insecure_channel(server.address) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        services = set(db.get_services())
        assert {"gsim.sensor.v1.SensorService", "grpc.health.v1.Health"} <= services
        f = db.FindFileContainingSymbol("gsim.sensor.v1.SensorService")
        assert {m.name for m in f.service[0].method} >= {"RenderCamera", "RenderLidar", "StartSession"}


def test_tls_from_certificate_files(loop_street, tmp_path):
    import shutil
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    s = Served([str(loop_street / "scene"), "--tls-cert", str(cert), "--tls-key", str(key)])
    try:
        assert "(TLS," in "".join(s.lines)
        with SensorClient(s.address, root_certificates=cert.read_bytes()) as c:
            assert c.list_scenes()[0].id == "scene"
        with SensorClient(s.address, timeout_s=5) as plain:  # a plaintext client cannot talk to it
            with pytest.raises(grpc.RpcError) as e:
                plain.list_scenes()
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        assert s.stop()[0] == 0
    p = subprocess.run([sys.executable, "-m", "gsim.cli", "serve", str(loop_street / "scene"), "--tls-cert", str(cert)],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--tls-key" in p.stderr


# ------------------------------------------------------------------------------------------------ in process
# A server in this process, so that a test can plant a bug in it (monkeypatch) and read its log (caplog).

BAD_NAMES = ("../x", "/abs", "a/b", "", "x" * 300, "sz\u00e8ne")


@pytest.fixture(scope="module")
def in_process(loop_street, tmp_path_factory):
    from gsim.bridges.api.server import load_served, start
    served = {s.id: s for s in (load_served(str(loop_street / "scene")), load_served(scenario(loop_street, "across", ACROSS)))}
    sessions = tmp_path_factory.mktemp("in-process-sessions")
    s = start(served, port=0, sessions_dir=sessions)
    with SensorClient(f"127.0.0.1:{s.port}", timeout_s=60) as c:
        yield c, sessions
    s.stop(5)


def rpc_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=60)
    return e.value


CAMERA_REQUEST = pb.RenderCameraRequest(
    scene_id="scene", camera_model=pb.CameraModel(model="pinhole", width=8, height=6, fx=5, fy=5, cx=4, cy=3),
    T_world_camera=pb.Transform(m=np.eye(4).ravel()), timestamp_us=0)


@pytest.mark.parametrize("bug", [ZeroDivisionError("float division by zero"),
                                 ValueError("operands could not be broadcast together"), IndexError("index 3")])
def test_a_bug_is_internal_with_a_request_id_and_its_traceback_logged(in_process, monkeypatch, caplog, bug):
    """Not the client's fault: INTERNAL (never INVALID_ARGUMENT, even for a ValueError from numpy), "internal
    error" and a request id in the details and the trailing metadata; the traceback is logged under that id."""
    import logging
    import re
    from gsim.bridges.api import server, status

    def renderer(*a, **kw):
        raise bug
    monkeypatch.setattr(server.SensorServicer, "renderer", renderer)  # the still camera's path: a resident renderer
    caplog.set_level(logging.ERROR, logger=server.log.name)
    c, _ = in_process
    e = rpc_error(c.stub.RenderCamera, CAMERA_REQUEST)
    assert e.code() == grpc.StatusCode.INTERNAL and "internal error" in e.details(), e.details()
    rid = re.search(r"request id ([0-9a-f]{16})", e.details()).group(1)
    assert dict(e.trailing_metadata())[status.REQUEST_ID_KEY] == rid
    logged = [r for r in caplog.records if rid in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info[1] is bug and "RenderCamera" in logged[0].getMessage()
    assert "Traceback" in caplog.text and str(bug) not in e.details()  # (the details carry no internals)
    assert rpc_error(c.stub.RenderCamera, CAMERA_REQUEST).details() != e.details()  # a fresh id each call


def test_deliberate_errors_get_client_statuses(in_process, monkeypatch):
    from gsim.bridges.api import server
    from gsim.bridges.closed_loop.loop import LoopError
    from gsim.errors import InputError, MissingExtra, NotFound, SceneFormatError
    c, _ = in_process
    for error, code in ((InputError("camera_model: too dark"), grpc.StatusCode.INVALID_ARGUMENT),
                        (SceneFormatError("scene.json: field 'x'"), grpc.StatusCode.INVALID_ARGUMENT),
                        (NotFound("camera_name: no camera 'rear'"), grpc.StatusCode.NOT_FOUND),
                        (MissingExtra("needs gsplat: pip install 'gsim[cuda]'"), grpc.StatusCode.FAILED_PRECONDITION),
                        (LoopError("step 3: SUMO died"), grpc.StatusCode.ABORTED)):
        def renderer(*a, **kw):
            raise error
        monkeypatch.setattr(server.SensorServicer, "renderer", renderer)
        e = rpc_error(c.stub.RenderCamera, CAMERA_REQUEST)
        assert (e.code(), e.details()) == (code, str(error))
    monkeypatch.undo()
    e = rpc_error(c.stub.RenderCamera, pb.RenderCameraRequest(scene_id="nope"))
    assert e.code() == grpc.StatusCode.NOT_FOUND and e.details().startswith("scene_id: no served scene 'nope'")
    e = rpc_error(c.stub.StepSession, pb.StepSessionRequest(session_id="0" * 16, controls=pb.Controls()))
    assert e.code() == grpc.StatusCode.NOT_FOUND and e.details().startswith("session_id")


def test_a_bug_in_a_session_step_is_internal_and_the_run_is_recorded(in_process, monkeypatch):
    from gsim.bridges.closed_loop.runner import Run
    c, sessions = in_process
    sid = c.stub.StartSession(pb.StartSessionRequest(scenario="across", max_steps=5), timeout=600).session_id

    def step(self, action, t_step=None):
        raise IndexError("index 7 is out of bounds for axis 0 with size 7")
    monkeypatch.setattr(Run, "step", step)
    controls = pb.StepSessionRequest(session_id=sid, controls=pb.Controls(accel_mps2=0.5))
    assert rpc_error(c.stub.StepSession, controls).code() == grpc.StatusCode.INTERNAL
    e = rpc_error(c.stub.StepSession, controls)  # the run ended with the bug
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "the run is over" in e.details()
    end = c.stub.EndSession(pb.EndSessionRequest(session_id=sid), timeout=60)
    record = sessions / "across" / sid
    assert Path(end.record_dir) == record.resolve()
    metrics = json.loads((record / "metrics.json").read_text())
    assert metrics["completed"] is False and metrics["error"].startswith("IndexError: index 7")


def test_names_in_requests_never_become_paths(in_process):
    """Scene, scenario and session ids that are not names: NOT_FOUND, and nothing is written."""
    c, sessions = in_process
    before = sorted(sessions.rglob("*"))
    for bad in BAD_NAMES:
        for call, req in ((c.stub.DescribeScene, pb.DescribeSceneRequest(scene_id=bad)),
                          (c.stub.StartSession, pb.StartSessionRequest(scenario=bad)),
                          (c.stub.StepSession, pb.StepSessionRequest(session_id=bad, controls=pb.Controls())),
                          (c.stub.EndSession, pb.EndSessionRequest(session_id=bad))):
            e = rpc_error(call, req)
            assert e.code() == grpc.StatusCode.NOT_FOUND, (bad, e.details())
    assert sorted(sessions.rglob("*")) == before


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_scenario_whose_name_is_not_a_name_is_refused_at_load(loop_street, tmp_path, name):
    from gsim.bridges.api.server import load_served
    from gsim.errors import InputError
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "name": name, "scene": str(loop_street / "scene"),
                                    "log": str(loop_street / "log"), "edits": [], "closed_loop": {}}))
    with pytest.raises(InputError, match="name"):
        load_served(str(path))
    assert [p.name for p in tmp_path.iterdir()] == ["scenario.yaml"]


@pytest.mark.parametrize("folder", ["a b", "sz\u00e8ne", ".hidden", "-x", "x" * 200])
def test_a_scene_folder_whose_name_is_not_a_name_is_refused_at_load(loop_street, tmp_path, folder):
    """The folder's name is the served id: refused by name, not renamed (the names a file system can hold;
    the others as scenario names, above)."""
    from gsim.bridges.api.server import load_served
    from gsim.errors import InputError
    (tmp_path / folder).symlink_to(loop_street / "scene", target_is_directory=True)
    with pytest.raises(InputError, match="the folder's name") as e:
        load_served(str(tmp_path / folder))
    assert repr(folder)[:20] in str(e.value) and "rename the folder" in str(e.value)
    assert [p.name for p in tmp_path.iterdir()] == [folder]


def test_a_token_in_clear_is_refused_off_localhost_unless_insecure(monkeypatch, caplog):
    """Before anything binds: a public host with a token and no TLS is refused; --insecure starts (here, up to
    the bind, which the test stops) with a loud warning; TLS starts without one."""
    import logging
    from gsim.bridges.api import server
    from gsim.errors import InputError

    class Binding(Exception):
        pass

    def no_server(*a, **kw):
        raise Binding
    monkeypatch.setattr(grpc, "server", no_server)
    caplog.set_level(logging.WARNING, logger=server.log.name)
    with pytest.raises(InputError, match="travel in clear.*--tls-cert.*--insecure"):
        server.start({}, host="0.0.0.0", token="t")
    with pytest.raises(InputError, match="needs a bearer token"):
        server.start({}, host="0.0.0.0", insecure=True)
    assert not caplog.records
    for kw, warned in (({"insecure": True}, True), ({"tls": (b"key", b"cert")}, False), ({"host": "::1"}, False)):
        with pytest.raises(Binding):
            server.start({}, **{"host": "0.0.0.0", "token": "t", **kw})
        assert any("INSECURE" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records) == warned
        caplog.clear()
