"""The network sensor API under abuse, against real `gsim serve` subprocesses on 127.0.0.1 (ephemeral ports),
reached only over the network: fuzzed and malformed requests of every RPC (never INTERNAL or UNKNOWN, the
server stays healthy), bytes that are not protobuf, oversized messages, concurrent clients against a small
admission queue (bounded memory), clients that vanish mid-call, deadlines too short, sessions that expire,
and SIGTERM under load (a clean exit, recorded sessions, no temporary files left)."""
import json
import math
import subprocess
import threading
import time
from collections import Counter

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("grpc_health")
pytest.importorskip("grpc_reflection")
hypothesis = pytest.importorskip("hypothesis")
psutil = pytest.importorskip("psutil")
pytest.importorskip("sumolib")
pytest.importorskip("yaml")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from google.protobuf.message import Message  # noqa: E402

import gsim  # noqa: E402
from gsim.bridges.api import sensor_pb2 as pb  # noqa: E402
from gsim.bridges.api import sensor_pb2_grpc as pb_grpc  # noqa: E402
from gsim.bridges.api.client import RemoteSession, SensorClient  # noqa: E402
from gsim.bridges.closed_loop.dynamics import Controls  # noqa: E402
from gsim.bridges.api.server import ServerProcess as Served  # noqa: E402
from support import start_server  # noqa: E402

SERVICE = "/gsim.sensor.v1.SensorService/"
METHODS = ("ListScenes", "DescribeScene", "RenderCamera", "RenderLidar", "StartSession", "StepSession", "EndSession",
           "GetServerInfo")
BUGS = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)  # a bug in gsim (or an unmapped error)
OK = grpc.StatusCode.OK
MAX_REQUEST_BYTES = 4 << 20  # the server's receive limit (Limits.max_request_bytes)
MAX_RSS_GROWTH_MB = 300  # the server's resident memory after the load round minus after the warm-up round
LOAD_THREADS, LOAD_CALLS = 8, 15  # clients, calls each
SIGTERM_EXIT_S = 20.0  # SIGTERM to exit under load (the in-flight calls are renders of tens of milliseconds)
CALL_TIMEOUT_S = 30.0
T_ACTORS_US = 1_000_000  # a time inside the scene's actor tracks
# camera -> world: at (0, 0, 1.5) looking along world +x (camera x right = world -y, y down = world -z)
T_WORLD_CAMERA = np.array([[0.0, 0, 1, 0], [-1, 0, 0, 0], [0, -1, 0, 1.5], [0, 0, 0, 1]])
T_WORLD_LIDAR = np.array([[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1.8], [0, 0, 0, 1]])
TINY = gsim.PinholeCamera(64, 48, 40.0, 40.0, 32.0, 24.0)
SMALL = gsim.PinholeCamera(160, 90, 100.0, 100.0, 80.0, 45.0)
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


# ------------------------------------------------------------------------------------------------ servers

def terminate(s: Served, timeout: float) -> int:
    """SIGTERM, then the exit code (pytest.fail when it has not exited within ``timeout``; then killed)."""
    s.proc.terminate()
    try:
        rc = s.proc.wait(timeout)
        s.drainer.join(10)  # (its last lines)
        return rc
    except subprocess.TimeoutExpired:
        s.proc.kill()
        s.proc.wait()
        pytest.fail(f"gsim serve did not exit within {timeout} s of SIGTERM:\n" + "".join(s.lines[-40:]))


def kill(s: Served) -> None:
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


@pytest.fixture(scope="module")
def server(loop_street):
    """The shared server: one worker and a queue of 2, so that 3 calls at once are admitted."""
    s = start_server(loop_street, "--queue", "2", "--sessions-dir", str(loop_street / "stress-sessions"))
    yield s
    try:
        assert terminate(s, 60) == 0, "".join(s.lines[-40:])
    finally:
        kill(s)


@pytest.fixture(scope="module")
def client(server):
    with SensorClient(server.address, timeout_s=CALL_TIMEOUT_S) as c:
        yield c


@pytest.fixture(scope="module")
def live_session(client):
    """An open session on the shared server that the fuzzed StepSession calls drive (or fail to)."""
    s = client.session("across", max_steps=0)
    yield s.session_id
    try:
        s.end()
    except grpc.RpcError as e:  # the fuzz may have ended it
        assert e.code() == grpc.StatusCode.NOT_FOUND, e


def status(fn, *a, **kw):
    """(status code, details) of a call (OK, "" when it succeeds)."""
    try:
        fn(*a, **kw)
        return OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details()


def render_tiny(c: SensorClient):
    return c.render_camera("scene", TINY, T_WORLD_CAMERA, timestamp_us=T_ACTORS_US)


# AlpaSim's sensorsim service on the same server (gsim.bridges.api.sensorsim), called with AlpaSim's messages
SENSORSIM = "/nre.grpc.protos.sensorsim.SensorsimService/"
SENSORSIM_METHODS = ("get_version", "get_available_scenes", "get_loaded_scenes", "get_available_cameras",
                     "get_available_trajectories", "get_available_ego_masks", "render_rgb", "render_lidar",
                     "batch_render_rgb", "render_aggregated")


def sensorsim_rgb(channel, timeout: float = CALL_TIMEOUT_S) -> bytes:
    """A small sensorsim render_rgb (PNG) of the still camera's view, as AlpaSim's runtime would ask for it."""
    from carla_driver_interface import protocol as P
    from gsim.bridges.closed_loop.alpasim import camera_spec, pose_message
    req = P.sensorsim_pb2.RGBRenderRequest(scene_id="scene", resolution_w=TINY.width, resolution_h=TINY.height,
                                           camera_intrinsics=camera_spec(TINY, "tiny"), frame_start_us=T_ACTORS_US,
                                           frame_end_us=T_ACTORS_US, image_format=P.ImageFormat.PNG)
    req.sensor_pose.start_pose.CopyFrom(pose_message(T_WORLD_CAMERA))
    req.sensor_pose.end_pose.CopyFrom(pose_message(T_WORLD_CAMERA))
    call = channel.unary_unary(SENSORSIM + "render_rgb", request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=P.sensorsim_pb2.RGBRenderReturn.FromString)
    return call(req, timeout=timeout).image_bytes


def assert_still_serving(s: Served) -> None:
    """The process runs, its health check says SERVING and a small render comes back."""
    assert s.proc.poll() is None, "gsim serve exited:\n" + "".join(s.lines[-40:])
    with SensorClient(s.address, timeout_s=CALL_TIMEOUT_S) as c:
        assert c.health() == "SERVING" and c.health("gsim.sensor.v1.SensorService") == "SERVING"
        f = render_tiny(c)
        assert f.rgb.shape == (48, 64, 3) and np.isfinite(f.rgb).all() and f.rgb.max() > 0


# ------------------------------------------------------------------------------------------------ strategies
# Each request starts as a valid one (it renders, steps, ...) and has up to 3 of its fields replaced by drawn
# values, good or malformed: the fuzz reaches the render and session paths, not only the first check.

NAN, INF = math.nan, math.inf
NUMBERS = st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-300, 1e300, -1e300, INF, -INF, NAN]))
INT64 = st.one_of(st.sampled_from([0, -1, 1, T_ACTORS_US, 2**31, 2**63 - 1, -2**63]), st.integers(-2**63, 2**63 - 1))
TEXT = st.text(max_size=12)


def mostly(good, bad, percent_good: int = 60):
    return st.integers(0, 99).flatmap(lambda k: good if k < percent_good else bad)


SCENE_IDS = mostly(st.sampled_from(["scene", "across"]),
                   st.one_of(st.sampled_from(["", "nope", "scene/", "../scene", "SCENE", "scene\x00"]), TEXT))
ENCODINGS = st.sampled_from([pb.RAW, pb.PNG, pb.JPEG, 3, -1, 2**31 - 1])
QUALITIES = st.sampled_from([0, 1, 90, 100, 101, 2**32 - 1])
BACKENDS = st.sampled_from(["", "auto", "numba", "torch", "gsplat", "cuda", "nope"])
TIMES = st.one_of(st.none(), st.sampled_from([T_ACTORS_US, T_ACTORS_US + 100_000]), INT64)


def rigid(yaw: float, x: float, y: float, z: float) -> np.ndarray:
    T = np.eye(4)
    c, s = math.cos(yaw), math.sin(yaw)
    T[:2, :2] = [[c, -s], [s, c]]
    T[:3, 3] = x, y, z
    return T


def changed(T: np.ndarray, i: int, v: float) -> list:
    m = T.ravel().copy()
    m[i] = v
    return m.tolist()


def transforms(valid: np.ndarray):
    """None (unset), the valid pose, another pose, or not a pose: wrong lengths, NaN, inf, huge, not rigid."""
    return st.one_of(
        st.none(), st.just(valid.ravel().tolist()),
        st.tuples(st.floats(-4, 4), st.floats(-50, 50), st.floats(-50, 50), st.floats(0, 3)).map(
            lambda a: (rigid(*a) @ valid).ravel().tolist()),
        st.lists(NUMBERS, max_size=20),
        st.tuples(st.integers(0, 15), NUMBERS).map(lambda a: changed(valid, *a)),
        st.tuples(st.floats(-4, 4), NUMBERS, NUMBERS, NUMBERS).map(
            lambda a: ((rigid(*a) @ valid) if all(map(math.isfinite, a)) else np.full((4, 4), a[1])).ravel().tolist()),
    ).map(lambda m: None if m is None else pb.Transform(m=m))


def fill(m, kw: dict):
    """Sets the fields of message ``m``: None leaves one unset, a tuple (field, value) sets a oneof."""
    for k, v in kw.items():
        if v is None:
            continue
        if isinstance(v, tuple):
            k, v = v
        if isinstance(v, Message):
            getattr(m, k).CopyFrom(v)
        elif isinstance(v, list):
            getattr(m, k).extend(v)
        else:
            setattr(m, k, v)
    return m


@st.composite
def mutated(draw, cls, bases, fields: dict, min_changes: int = 0):
    """A message of class ``cls``: one of ``bases`` (dicts of valid fields) with up to 3 fields drawn from
    ``fields`` (strategies)."""
    kw = dict(draw(st.sampled_from(bases)))
    for name in draw(st.lists(st.sampled_from(sorted(fields)), min_size=min_changes, max_size=3, unique=True)):
        kw[name] = draw(fields[name])
    return fill(cls(), kw)


PIXELS = st.one_of(st.integers(1, 64), st.just(0), st.integers(2**25, 2**32 - 1))  # tiny, zero or > max_pixels alone
COEFFS = st.one_of(st.just(0.0), st.floats(-0.2, 0.2), NUMBERS)
CAMERA_MODELS = mutated(
    pb.CameraModel, [dict(model=m, width=32, height=24, fx=20.0, fy=20.0, cx=16.0, cy=12.0)
                     for m in ("pinhole", "opencv", "fisheye")],
    {"model": st.one_of(st.sampled_from(["pinhole", "opencv", "fisheye", "", "Pinhole", "equirect"]), TEXT),
     "width": PIXELS, "height": PIXELS, "fx": NUMBERS, "fy": NUMBERS, "cx": NUMBERS, "cy": NUMBERS,
     **{k: COEFFS for k in ("k1", "k2", "k3", "k4", "p1", "p2")}})
ACTOR_IDS = mostly(st.just("parked"), st.one_of(st.sampled_from(["across", "", "nope"]), TEXT))
ACTOR_POSES = st.lists(st.builds(pb.ActorPose, actor_id=ACTOR_IDS, T_world_actor=transforms(
    rigid(0.0, 12.0, 4.75, 0.0)).map(lambda t: t or pb.Transform())), max_size=2)
LIDAR_LASERS = st.lists(st.one_of(st.floats(-25, 15), NUMBERS), max_size=4)
LIDAR_SPECS = st.one_of(
    mutated(pb.LidarSpec, [dict(name="tiny", elevations_deg=[-10.0, -2.0], azimuth_resolution_deg=10.0, spin_hz=10.0,
                                min_range_m=0.5, max_range_m=80.0)],
            {"name": TEXT, "elevations_deg": LIDAR_LASERS,
             "azimuth_resolution_deg": st.sampled_from([0.0, -1.0, NAN, INF, 1e-12, 0.7, 1.0, 7.0, 360.0, 720.0]),
             "spin_hz": NUMBERS, "min_range_m": NUMBERS, "max_range_m": NUMBERS,
             "spin": st.sampled_from(["cw", "ccw", "", "up", "CW"]), "azimuth_offsets_deg": LIDAR_LASERS,
             "firing_offsets_us": LIDAR_LASERS, "start_azimuth_deg": NUMBERS}),
    st.just(pb.LidarSpec(name="huge", elevations_deg=[0.0] * 100, azimuth_resolution_deg=1e-3, spin_hz=10,
                         min_range_m=1, max_range_m=100)))  # far more rays than max_rays


@st.composite
def waypoint_arrays(draw):
    """`Array`s: (K,3) float64 waypoints (finite or not), and garbage dtype, shape or data."""
    if draw(st.booleans()):
        k = draw(st.integers(0, 4))
        t = np.cumsum(draw(st.lists(st.floats(0.01, 1.0), min_size=k, max_size=k)))
        xy = draw(st.lists(st.one_of(st.floats(-10, 10), NUMBERS), min_size=2 * k, max_size=2 * k))
        a = np.c_[t, np.reshape(xy, (k, 2))] if k else np.zeros((0, 3))
        return pb.Array(dtype="float64", shape=a.shape, data=a.astype("<f8").tobytes())
    dtype = draw(st.one_of(st.sampled_from(["float64", "float32", "int64", "uint8", "", "complex128", "float16",
                                            "object", "<f8", "U5", "V8"]), TEXT))
    shape = draw(st.lists(st.one_of(st.integers(-3, 5), st.sampled_from([2**31, 2**62, 2**63 - 1])), max_size=4))
    return pb.Array(dtype=dtype, shape=shape, data=draw(st.binary(max_size=200)))


T_CAM = pb.Transform(m=T_WORLD_CAMERA.ravel().tolist())
T_LIDAR = pb.Transform(m=T_WORLD_LIDAR.ravel().tolist())
T_VEHICLE = pb.Transform(m=np.eye(4).ravel().tolist())
TINY_MODEL = pb.CameraModel(model="pinhole", width=32, height=24, fx=20.0, fy=20.0, cx=16.0, cy=12.0)
RENDER_CAMERA = mutated(
    pb.RenderCameraRequest,
    [dict(scene_id="scene", camera=("camera_model", TINY_MODEL), T_world_camera=T_CAM, timestamp_us=T_ACTORS_US),
     dict(scene_id="across", camera=("camera_name", "front"), T_world_vehicle=T_VEHICLE, timestamp_us=T_ACTORS_US,
          encoding=pb.PNG, depth=True, alpha=True)],
    {"scene_id": SCENE_IDS,
     "camera": st.one_of(st.none(), st.tuples(st.just("camera_model"), CAMERA_MODELS),
                         st.tuples(st.just("camera_name"), st.one_of(
                             st.sampled_from(["front", "front_left", "rear", ""]), TEXT))),
     "T_world_camera": transforms(T_WORLD_CAMERA), "T_world_vehicle": transforms(np.eye(4)), "timestamp_us": TIMES,
     "actor_poses": ACTOR_POSES, "depth": st.booleans(), "alpha": st.booleans(), "encoding": ENCODINGS,
     "jpeg_quality": QUALITIES, "backend": BACKENDS,
     "readout_us": st.sampled_from([0, 1, 30_000, 10_000_000, 10_000_001, 2**32 - 1]),
     "T_world_camera_end": transforms(T_WORLD_CAMERA), "T_world_vehicle_end": transforms(np.eye(4)),
     "end_timestamp_us": TIMES})
RENDER_LIDAR = mutated(
    pb.RenderLidarRequest,
    [dict(scene_id="scene", lidar=("preset", "velodyne-vlp16"), T_world_lidar=T_LIDAR, timestamp_us=T_ACTORS_US),
     dict(scene_id="scene", lidar=("lidar_name", "top"), T_world_vehicle=T_VEHICLE, timestamp_us=T_ACTORS_US,
          T_world_vehicle_end=pb.Transform(m=rigid(0.0, 1.0, 0.0, 0.0).ravel().tolist()),
          end_timestamp_us=T_ACTORS_US + 100_000),
     dict(scene_id="across", lidar=("spec", pb.LidarSpec(name="tiny", elevations_deg=[-10.0, -2.0],
                                                         azimuth_resolution_deg=10.0, spin_hz=10.0, min_range_m=0.5,
                                                         max_range_m=80.0)),
          T_world_lidar=T_LIDAR, timestamp_us=T_ACTORS_US, freeze_time=True)],
    {"scene_id": SCENE_IDS,
     "lidar": st.one_of(st.none(), st.tuples(st.just("spec"), LIDAR_SPECS),
                        st.tuples(st.just("preset"), st.one_of(st.sampled_from(["velodyne-vlp16", "nope", "", "VLP16"]),
                                                               TEXT)),
                        st.tuples(st.just("lidar_name"), st.one_of(st.sampled_from(["top", "nope", ""]), TEXT))),
     "T_world_lidar": transforms(T_WORLD_LIDAR), "T_world_vehicle": transforms(np.eye(4)),
     "T_world_lidar_end": transforms(T_WORLD_LIDAR), "T_world_vehicle_end": transforms(np.eye(4)),
     "timestamp_us": TIMES, "end_timestamp_us": TIMES, "freeze_time": st.booleans(), "actor_poses": ACTOR_POSES,
     "hit_alpha": st.one_of(st.sampled_from([0.0, 0.5, 0.999, 1.0, -1.0, 1e-300, NAN, INF]), NUMBERS),
     "backend": BACKENDS})
START_SESSION = mutated(
    pb.StartSessionRequest, [dict(scenario="across", agent_name="fuzz", max_steps=1)],
    {"scenario": st.one_of(st.sampled_from(["scene", "", "nope", "across "]), TEXT), "seed": INT64,
     "agent_name": st.one_of(st.sampled_from(["", "x" * 65, "bad name!", "a.b-c_d", "../x"]), TEXT),
     "max_steps": st.sampled_from([0, 2, 2**32 - 1]), "camera_encoding": ENCODINGS, "jpeg_quality": QUALITIES},
    min_changes=1)  # (a valid start costs a second: SUMO starts)
DESCRIBE_SCENE = st.builds(pb.DescribeSceneRequest, scene_id=SCENE_IDS)
END_SESSION = st.builds(pb.EndSessionRequest,
                        session_id=st.one_of(st.sampled_from(["", "0", "0" * 16, "across"]), TEXT))


def step_session(live: str):
    controls = st.builds(pb.Controls, accel_mps2=st.one_of(st.floats(-3, 3), NUMBERS),
                         steer_rate_rps=st.one_of(st.floats(-0.3, 0.3), NUMBERS))
    return mutated(
        pb.StepSessionRequest,
        [dict(session_id=live, action=("controls", pb.Controls(accel_mps2=0.5))),
         dict(session_id=live, action=("waypoints", pb.Array(dtype="float64", shape=[2, 3], data=np.array(
             [[0.5, 2.0, 0.0], [1.0, 4.0, 0.0]]).tobytes())))],
        {"session_id": mostly(st.just(live), st.one_of(st.sampled_from(["", "0", live + "0", live.upper(), live[:-1]]),
                                                         TEXT)),
         "action": st.one_of(st.none(), st.tuples(st.just("controls"), controls),
                             st.tuples(st.just("waypoints"), waypoint_arrays()))})


STRATEGIES = {"ListScenes": lambda live: st.nothing(), "DescribeScene": lambda live: DESCRIBE_SCENE,
              "RenderCamera": lambda live: RENDER_CAMERA, "RenderLidar": lambda live: RENDER_LIDAR,
              "StartSession": lambda live: START_SESSION, "StepSession": step_session,
              "EndSession": lambda live: END_SESSION, "GetServerInfo": lambda live: st.nothing()}
REQUESTS = {m.name: getattr(pb, m.input_type.name) for m in pb.DESCRIPTOR.services_by_name["SensorService"].methods}
FUZZ_EXAMPLES = {"StartSession": 20}  # (each valid start runs SUMO for a second); the others: FUZZ.max_examples
FUZZ_CODES = Counter()


def requests(method: str, live: str):
    """Fuzzed requests of ``method``, and its empty message."""
    return st.one_of(st.just(REQUESTS[method]()), STRATEGIES[method](live))


# ------------------------------------------------------------------------------------------------ fuzzing

def fuzz_call(client, method: str, req) -> None:
    try:
        r = getattr(client.stub, method)(req, timeout=CALL_TIMEOUT_S)
        code, details = OK, ""
    except grpc.RpcError as e:
        code, details, r = e.code(), e.details(), None
    FUZZ_CODES[method, code.name] += 1
    assert code not in BUGS, f"{method} answered {code.name}: {details}\nrequest: {req}" + "".join(server.lines[-30:])
    if method == "StartSession" and r is not None:
        client.stub.EndSession(pb.EndSessionRequest(session_id=r.session_id), timeout=CALL_TIMEOUT_S)


@pytest.mark.parametrize("method", [m for m in METHODS if m not in FUZZ_EXAMPLES])
@FUZZ
@given(data=st.data())
def test_fuzzed_requests_of_every_rpc_get_no_internal_or_unknown(server, client, live_session, method, data):
    """Random and malformed fields (NaN / inf / huge poses, transforms of the wrong length, zero-size and huge
    cameras, unknown models, presets, LiDARs, scenes and sessions, garbage waypoint arrays, extreme numbers,
    empty messages): any status but INTERNAL and UNKNOWN."""
    fuzz_call(client, method, data.draw(requests(method, live_session), label="request"))


@settings(FUZZ, max_examples=FUZZ_EXAMPLES["StartSession"])
@given(req=requests("StartSession", ""))
def test_fuzzed_session_starts_get_no_internal_or_unknown(server, client, req):
    """The same for StartSession (unknown scenarios, bad agent names, extreme seeds and step counts, unknown
    encodings); sessions that start are ended at once."""
    fuzz_call(client, "StartSession", req)


def test_the_server_is_healthy_after_the_fuzzing(server):
    print("\nfuzzed calls (method, status): count\n" +
          "\n".join(f"  {k}: {v}" for k, v in sorted(FUZZ_CODES.items())))
    assert_still_serving(server)
    if FUZZ_CODES:  # (this test alone: nothing to check about the fuzz)
        for method in METHODS:  # every RPC was called, and not only refused
            calls = sum(v for (m, _), v in FUZZ_CODES.items() if m == method)
            want = 1 if method in ("ListScenes", "GetServerInfo") else FUZZ_EXAMPLES.get(method, FUZZ.max_examples) // 2
            assert calls >= want, (method, calls)
        for method in ("RenderCamera", "RenderLidar", "StartSession", "StepSession", "DescribeScene"):
            assert FUZZ_CODES[method, "OK"] > 0, f"no fuzzed {method} succeeded: the fuzz misses the render paths"
            assert FUZZ_CODES[method, "INVALID_ARGUMENT"] + FUZZ_CODES[method, "NOT_FOUND"] > 0, method


@settings(FUZZ, max_examples=300)
@given(method=st.sampled_from(METHODS),
       payload=st.one_of(st.binary(max_size=300),
                         st.sampled_from([b"\xff", b"\xff\xff\xff\xff", b"\x0a\x05ab", b"\x0a\x02\xc3\x28",
                                          b"\x08", b"\x12\xff\xff\xff\xff\x0f", b"\x00\x00"])))
def test_bytes_that_are_not_protobuf_get_no_internal_or_unknown(server, method, payload):
    """Raw random bytes as any RPC's request: parsed (possibly as unknown fields) and answered, or refused as
    INVALID_ARGUMENT, never INTERNAL (gRPC's own answer to bytes its deserializer cannot parse)."""
    with grpc.insecure_channel(server.address) as ch:
        call = ch.unary_unary(SERVICE + method, request_serializer=None, response_deserializer=None)
        code, details = status(call, payload, timeout=CALL_TIMEOUT_S)
    assert code not in BUGS, f"{method} answered {code.name} to {payload!r}: {details}"


@settings(FUZZ, max_examples=200)
@given(method=st.sampled_from(SENSORSIM_METHODS),
       payload=st.one_of(st.binary(max_size=300),
                         st.sampled_from([b"\xff", b"\x0a\x05ab", b"\x0a\x02\xc3\x28", b"\x08", b"\x00\x00"])))
def test_bytes_to_the_sensorsim_service_get_no_internal_or_unknown(server, method, payload):
    """Raw random bytes as any sensorsim RPC's request: answered, or refused as INVALID_ARGUMENT (never INTERNAL)."""
    with grpc.insecure_channel(server.address) as ch:
        call = ch.unary_unary(SENSORSIM + method, request_serializer=None, response_deserializer=None)
        code, details = status(call, payload, timeout=CALL_TIMEOUT_S)
    assert code not in BUGS, f"{method} answered {code.name} to {payload!r}: {details}"


SENSORSIM_CODES = Counter()


def _sensorsim_requests():
    """Fuzzed AlpaSim render requests: scene ids, resolutions, camera models and coefficients, shutters, times,
    poses (NaN, huge, non-unit quaternions), actors, formats and qualities, LiDAR devices."""
    from carla_driver_interface import protocol as P
    S = P.sensorsim_pb2
    num = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([0.0, 1.0, 40.0]))
    vec = st.builds(P.Vec3, x=num, y=num, z=num)
    quat = st.one_of(st.just(P.Quat(w=1.0)), st.builds(P.Quat, w=num, x=num, y=num, z=num))
    from gsim.bridges.closed_loop.alpasim import camera_spec, pose_message
    pose = mostly(st.just(pose_message(T_WORLD_CAMERA)), st.builds(P.Pose, vec=vec, quat=quat), 70)
    pair = st.builds(S.PosePair, start_pose=pose, end_pose=pose)
    pinhole = st.builds(P.OpenCVPinholeCameraParam, principal_point_x=num, principal_point_y=num, focal_length_x=num,
                        focal_length_y=num, radial_coeffs=st.lists(num, max_size=4),
                        tangential_coeffs=st.lists(num, max_size=3))
    fisheye = st.builds(S.OpenCVFisheyeCameraParam, principal_point_x=num, principal_point_y=num, focal_length_x=num,
                        focal_length_y=num, radial_coeffs=st.lists(num, max_size=5), max_angle=num)
    size = st.integers(0, 5000)
    spec = mostly(st.just(camera_spec(TINY, "tiny")), st.one_of(st.builds(P.CameraSpec, opencv_pinhole_param=pinhole, resolution_w=size, resolution_h=size,
                               shutter_type=st.integers(0, 6)),
                     st.builds(P.CameraSpec, opencv_fisheye_param=fisheye, resolution_w=size, resolution_h=size),
                     st.builds(P.CameraSpec, ftheta_param=st.just(S.FthetaCameraParam())), st.just(P.CameraSpec())))
    times = mostly(st.just(T_ACTORS_US), st.integers(0, 2**40), 70)
    objects = mostly(st.just([]), st.lists(st.builds(S.DynamicObject, track_id=st.sampled_from(["parked", "ghost", ""]),
                                                     pose_pair=pair), max_size=2))
    rgb = st.builds(S.RGBRenderRequest, scene_id=mostly(st.just("scene"), st.sampled_from(["across", "", "nope"])),
                    resolution_w=mostly(st.integers(1, 64), st.integers(0, 3000)),
                    resolution_h=mostly(st.integers(1, 48), st.integers(0, 3000)), camera_intrinsics=spec,
                    frame_start_us=times, frame_end_us=times, sensor_pose=pair, dynamic_objects=objects,
                    image_format=mostly(st.sampled_from([1, 2]), st.integers(0, 8)), image_quality=num)
    lidar = st.builds(S.LidarRenderRequest, scene_id=mostly(st.just("scene"), st.just("nope")),
                      lidar_config=st.builds(S.LidarSpec, lidar_type=mostly(st.integers(0, 1), st.integers(2, 9))), frame_start_us=times,
                      frame_end_us=times, sensor_pose=pair, dynamic_objects=objects)
    return st.one_of(st.tuples(st.just("render_rgb"), rgb), st.tuples(st.just("render_lidar"), lidar),
                     st.tuples(st.just("batch_render_rgb"), st.builds(
                         S.BatchRGBRenderRequest, items=st.lists(st.builds(S.BatchRGBRenderRequestItem,
                                                                           camera_name=st.text(max_size=5),
                                                                           request=rgb), max_size=2))),
                     st.tuples(st.just("render_aggregated"), st.builds(
                         S.AggregatedRenderRequest, rgb_requests=st.lists(rgb, max_size=1),
                         lidar_requests=st.lists(lidar, max_size=1))))


@settings(FUZZ, max_examples=120)
@given(data=st.data())
def test_fuzzed_sensorsim_requests_get_no_internal_or_unknown(server, data):
    method, req = data.draw(_sensorsim_requests(), label="request")
    with grpc.insecure_channel(server.address) as ch:
        call = ch.unary_unary(SENSORSIM + method, request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=None)
        code, details = status(call, req, timeout=CALL_TIMEOUT_S)
    SENSORSIM_CODES[method, code.name] += 1
    assert code not in BUGS, f"{method} answered {code.name}: {details}\nrequest: {req}" + "".join(server.lines[-30:])


def test_the_sensorsim_fuzz_reached_the_renders(server):
    print("\nfuzzed sensorsim calls (method, status): count\n" +
          "\n".join(f"  {k}: {v}" for k, v in sorted(SENSORSIM_CODES.items())))
    if SENSORSIM_CODES:  # (this test alone: nothing to check about the fuzz)
        for method in ("render_rgb", "render_lidar"):  # rendered, and refused
            assert SENSORSIM_CODES[method, "OK"] > 0 and SENSORSIM_CODES[method, "INVALID_ARGUMENT"] > 0, method
    assert_still_serving(server)
    with grpc.insecure_channel(server.address) as ch:
        assert sensorsim_rgb(ch)[:4] == b"\x89PNG"


def test_undecodable_requests_are_invalid_argument_naming_the_request(server):
    # a truncated field, a string that is not UTF-8, an unterminated varint, a group that never ends
    for payload in (b"\x0a\x05ab", b"\x0a\x02\xc3\x28", b"\x08\xff\xff", b"\x0b"):
        with grpc.insecure_channel(server.address) as ch:
            for method in METHODS:
                call = ch.unary_unary(SERVICE + method, request_serializer=None, response_deserializer=None)
                code, details = status(call, payload, timeout=CALL_TIMEOUT_S)
                if method in ("ListScenes", "GetServerInfo") and payload == b"\x0a\x02\xc3\x28":
                    assert code == OK, (method, code, details)  # an unknown field 1 of an empty message: skipped
                    continue
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, payload, code, details)
                assert details.startswith("request:") and "gsim.sensor.v1." in details, details
    assert_still_serving(server)


def test_oversized_requests_get_resource_exhausted(server, client):
    """Bigger than the server's 4 MiB receive limit: RESOURCE_EXHAUSTED (gRPC's answer, before any parsing),
    for raw bytes and for well-formed messages of every RPC; just under the limit is parsed and judged."""
    big = MAX_REQUEST_BYTES + 1024
    with grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        for method in METHODS:
            call = ch.unary_unary(SERVICE + method, request_serializer=None, response_deserializer=None)
            code, details = status(call, b"\x0a" + b"\xff" * big, timeout=CALL_TIMEOUT_S)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details, (method, code, details)
    huge_id = "x" * big
    waypoints = pb.Array(dtype="float64", shape=[big // 24, 3], data=bytes(big // 24 * 24))
    for method, req in (("DescribeScene", pb.DescribeSceneRequest(scene_id=huge_id)),
                        ("RenderCamera", pb.RenderCameraRequest(scene_id=huge_id)),
                        ("RenderLidar", pb.RenderLidarRequest(scene_id="scene", preset=huge_id)),
                        ("StartSession", pb.StartSessionRequest(scenario=huge_id)),
                        ("StepSession", pb.StepSessionRequest(session_id="0", waypoints=waypoints)),
                        ("EndSession", pb.EndSessionRequest(session_id=huge_id))):
        assert req.ByteSize() > MAX_REQUEST_BYTES
        code, details = status(getattr(client.stub, method), req, timeout=CALL_TIMEOUT_S)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details, (method, code, details)
    # just under the limit: read, and refused for what it says
    code, details = status(client.stub.DescribeScene, pb.DescribeSceneRequest(scene_id="x" * (MAX_REQUEST_BYTES - 64)),
                           timeout=CALL_TIMEOUT_S)
    assert code == grpc.StatusCode.NOT_FOUND and details.startswith("scene_id"), (code, details[:200])
    assert len(details) < 1100 and details.endswith("more characters)"), details[-200:]  # (the id, cut short)
    assert_still_serving(server)


def test_malformed_fields_get_their_documented_codes(server, client):
    """Targeted cases of what the fuzz draws at random, with the status code and the field the message names."""
    session = client.session("across", max_steps=0)  # (the fuzz may have run the shared one to its end)
    live_session = session.session_id
    T = pb.Transform(m=T_WORLD_CAMERA.ravel().tolist())
    cam = pb.CameraModel(model="pinhole", width=32, height=24, fx=20, fy=20, cx=16, cy=12)

    def camera(**kw):
        base_ = dict(scene_id="scene", camera_model=cam, T_world_camera=T, timestamp_us=T_ACTORS_US)
        return pb.RenderCameraRequest(**{**base_, **kw})

    def lidar(**kw):
        base_ = dict(scene_id="scene", preset="velodyne-vlp16", T_world_lidar=T, timestamp_us=T_ACTORS_US)
        return pb.RenderLidarRequest(**{**base_, **kw})

    def waypoints(dtype="float64", shape=(1, 3), data=None):
        data = np.array([[0.5, 1.0, 0.0]]).tobytes() if data is None else data
        return pb.StepSessionRequest(session_id=live_session, waypoints=pb.Array(dtype=dtype, shape=shape, data=data))

    nan_pose, inf_pose = T_WORLD_CAMERA.copy(), T_WORLD_CAMERA.copy()
    nan_pose[0, 3], inf_pose[1, 1] = NAN, INF
    IA, NF = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    cases = [
        ("RenderCamera", camera(T_world_camera=pb.Transform(m=nan_pose.ravel())), IA, "T_world_camera"),
        ("RenderCamera", camera(T_world_camera=pb.Transform(m=inf_pose.ravel())), IA, "T_world_camera"),
        ("RenderCamera", camera(T_world_camera=pb.Transform(m=[1.0] * 15)), IA, "T_world_camera.m"),
        ("RenderCamera", camera(T_world_camera=pb.Transform()), IA, "T_world_camera.m"),
        ("RenderCamera", camera(camera_model=pb.CameraModel(model="pinhole", width=0, height=24, fx=1, fy=1)), IA,
         "camera_model.width"),
        ("RenderCamera", camera(camera_model=pb.CameraModel(model="pinhole", width=2**32 - 1, height=2**32 - 1, fx=1,
                                                            fy=1)), IA, "camera_model"),
        ("RenderCamera", camera(camera_model=pb.CameraModel(model="equirect", width=32, height=24)), IA,
         "camera_model.model"),
        ("RenderCamera", camera(camera_model=pb.CameraModel(model="pinhole", width=32, height=24, fx=20, fy=20,
                                                            k1=0.1)), IA, "camera_model.k1"),
        ("RenderCamera", camera(camera_model=pb.CameraModel(model="pinhole", width=32, height=24, fx=NAN, fy=20)), IA,
         "camera_model.fx"),
        ("RenderCamera", camera(camera_model=pb.CameraModel(model="opencv", width=32, height=24, fx=20, fy=20,
                                                            k1=INF)), IA, "camera_model.k1"),
        ("RenderCamera", camera(T_world_camera_end=pb.Transform(m=nan_pose.ravel()), end_timestamp_us=T_ACTORS_US + 1),
         IA, "T_world_camera_end"),
        ("RenderCamera", camera(scene_id="nope"), NF, "scene_id"),
        ("RenderCamera", camera(encoding=7), IA, "encoding"),
        ("RenderCamera", camera(jpeg_quality=2**32 - 1), IA, "jpeg_quality"),
        ("RenderCamera", camera(actor_poses=[pb.ActorPose(actor_id="nope", T_world_actor=T)]), NF,
         "actor_poses[0].actor_id"),
        ("RenderCamera", camera(actor_poses=[pb.ActorPose(actor_id="parked",
                                                          T_world_actor=pb.Transform(m=[NAN] * 16))]),
         IA, "actor_poses[0].T_world_actor"),
        ("RenderCamera", pb.RenderCameraRequest(), NF, "scene_id"),
        ("RenderLidar", lidar(preset="velodyne-nope"), IA, "preset"),
        ("RenderLidar", lidar(lidar_name="nope"), NF, "lidar_name"),
        ("RenderLidar", lidar(spec=pb.LidarSpec(elevations_deg=[0.0] * 100, azimuth_resolution_deg=1e-3, spin_hz=10,
                                                min_range_m=1, max_range_m=100)), IA, "spec"),
        ("RenderLidar", lidar(spec=pb.LidarSpec(elevations_deg=[0.0], azimuth_resolution_deg=NAN)), IA,
         "spec.azimuth_resolution_deg"),
        ("RenderLidar", lidar(spec=pb.LidarSpec(name="s", elevations_deg=[0.0], azimuth_resolution_deg=1, spin_hz=INF,
                                                min_range_m=1, max_range_m=100)), IA, "spec.spin_hz"),
        ("RenderLidar", lidar(spec=pb.LidarSpec(name="s", elevations_deg=[0.0, NAN], azimuth_resolution_deg=1,
                                                spin_hz=10, min_range_m=1, max_range_m=100)), IA,
         "spec.elevations_deg[1]"),
        ("RenderLidar", lidar(spec=pb.LidarSpec(name="s", elevations_deg=[0.0], azimuth_resolution_deg=1, spin_hz=10,
                                                min_range_m=1, max_range_m=-INF)), IA, "spec.max_range_m"),
        ("RenderLidar", lidar(spec=pb.LidarSpec(name="s", elevations_deg=[0.0], azimuth_resolution_deg=1, spin_hz=10,
                                                min_range_m=1, max_range_m=100, start_azimuth_deg=NAN)), IA,
         "spec.start_azimuth_deg"),
        ("RenderLidar", lidar(T_world_lidar_end=pb.Transform(m=inf_pose.ravel()), end_timestamp_us=T_ACTORS_US + 1),
         IA, "T_world_lidar_end"),
        ("RenderLidar", lidar(hit_alpha=-1.0), IA, "hit_alpha"),
        ("RenderLidar", lidar(hit_alpha=NAN), IA, "hit_alpha"),
        ("RenderLidar", lidar(end_timestamp_us=T_ACTORS_US - 1, T_world_lidar_end=T), IA, "end_timestamp_us"),
        ("RenderLidar", lidar(T_world_lidar=pb.Transform(m=[0.0] * 16)), IA, "T_world_lidar"),
        ("RenderLidar", pb.RenderLidarRequest(scene_id="scene"), IA, "lidar"),
        ("DescribeScene", pb.DescribeSceneRequest(scene_id="../scene"), NF, "scene_id"),
        ("StartSession", pb.StartSessionRequest(scenario="scene"), NF, "scenario"),
        ("StartSession", pb.StartSessionRequest(scenario="across", agent_name="bad name!"), IA, "agent_name"),
        ("StartSession", pb.StartSessionRequest(scenario="across", camera_encoding=-1), IA, "camera_encoding"),
        ("StepSession", pb.StepSessionRequest(session_id="nope", controls=pb.Controls()), NF, "session_id"),
        ("StepSession", pb.StepSessionRequest(session_id=live_session), IA, "action"),
        ("StepSession", waypoints(dtype="complex128"), IA, "waypoints.dtype"),
        ("StepSession", waypoints(dtype="float32"), IA, "waypoints.dtype"),
        ("StepSession", waypoints(shape=(1, 4)), IA, "waypoints.shape"),
        ("StepSession", waypoints(shape=(-1, 3)), IA, "waypoints.shape"),
        ("StepSession", waypoints(shape=(2**62, 3)), IA, "waypoints.data"),
        ("StepSession", waypoints(data=b"\x00" * 7), IA, "waypoints.data"),
        ("StepSession", waypoints(data=np.array([[0.5, NAN, 0.0]]).tobytes()), IA, "action"),
        ("StepSession", pb.StepSessionRequest(session_id=live_session, controls=pb.Controls(accel_mps2=INF)), IA,
         "action"),
        ("StepSession", pb.StepSessionRequest(session_id=live_session, controls=pb.Controls(steer_rate_rps=NAN)), IA,
         "action"),
        ("StepSession", waypoints(data=np.array([[INF, 1.0, 0.0]]).tobytes()), IA, "action"),
        ("EndSession", pb.EndSessionRequest(session_id=""), NF, "session_id"),
    ]
    for method, req, want, field in cases:
        code, details = status(getattr(client.stub, method), req, timeout=CALL_TIMEOUT_S)
        assert (code, details.split(":")[0]) == (want, field), (method, str(req)[:300], code, details)
    session.step(Controls(0.5, 0.0))  # the refused actions left the session usable
    assert session.end()["steps"] == 1
    assert_still_serving(server)


# ------------------------------------------------------------------------------------------------ load

def test_concurrent_clients_against_a_small_queue_keep_memory_bounded(server):
    """8 clients at once, each with its own channel, against 1 worker + a queue of 2: calls beyond those are
    RESOURCE_EXHAUSTED (admission control) and retried after a pause, as the status asks; nothing else fails,
    every request is served in the end, and the server's resident memory stays bounded."""
    proc = psutil.Process(server.proc.pid)

    def one(c: SensorClient, kind: str) -> None:
        if kind == "camera":
            f = c.render_camera("scene", SMALL, T_WORLD_CAMERA, timestamp_us=T_ACTORS_US)
            assert f.rgb.shape == (90, 160, 3) and f.depth.shape == (90, 160) and f.rgb.max() > 0
        elif kind == "lidar":
            f = c.render_lidar("scene", "velodyne-vlp16", T_WORLD_LIDAR, timestamp_us=T_ACTORS_US)
            assert len(f.ranges) > 100 and f.range_image.shape[0] == 16
        elif kind == "sensorsim":
            assert sensorsim_rgb(c.channel)[:8] == b"\x89PNG\r\n\x1a\n"
        else:
            assert {s.id for s in c.list_scenes()} == {"scene", "across"}

    def round_(calls: int) -> Counter:
        codes, lock = Counter(), threading.Lock()
        go = threading.Barrier(LOAD_THREADS)

        def note(key):
            with lock:
                codes[key] += 1

        def worker(i):
            with SensorClient(server.address, timeout_s=CALL_TIMEOUT_S) as c:
                go.wait()
                for k in range(calls):
                    kind = ("camera", "lidar", "scenes", "sensorsim")[(i + k) % 4]
                    give_up = time.monotonic() + 60
                    while True:
                        try:
                            one(c, kind)
                            note(("OK", kind))
                            break
                        except grpc.RpcError as e:
                            note((e.code().name, e.details()[:120]))
                            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                                break
                            if time.monotonic() > give_up:
                                note(("STARVED", kind))
                                break
                            time.sleep(0.005 + 0.01 * (k % 3))
                        except Exception as e:  # a wrong answer
                            note(("WRONG", f"{type(e).__name__}: {e}"))
                            break
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(LOAD_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a client hung"
        return codes

    round_(3)  # warm-up: every kind of call, JIT compiled, buffers and threads allocated
    rss0 = proc.memory_info().rss
    t0 = time.perf_counter()
    codes = round_(LOAD_CALLS)
    wall = time.perf_counter() - t0
    rss1 = proc.memory_info().rss
    growth = (rss1 - rss0) / 2**20
    ok = Counter({k: v for (c, k), v in codes.items() if c == "OK"})
    exhausted = sum(v for (c, _), v in codes.items() if c == "RESOURCE_EXHAUSTED")
    failed = {k: v for k, v in codes.items() if k[0] not in ("OK", "RESOURCE_EXHAUSTED")}
    print(f"\nload: {LOAD_THREADS} clients x {LOAD_CALLS} requests in {wall:.1f} s: {dict(ok)} served, {exhausted} "
          f"attempts RESOURCE_EXHAUSTED (retried); server RSS {rss0 / 2**20:.0f} -> {rss1 / 2**20:.0f} MiB "
          f"(growth {growth:+.1f} MiB, bound {MAX_RSS_GROWTH_MB} MiB)")
    assert not failed, failed
    assert sum(ok.values()) == LOAD_THREADS * LOAD_CALLS and set(ok) == {"camera", "lidar", "scenes", "sensorsim"}, \
        codes
    assert exhausted > 0, f"8 clients against 3 admitted calls were never refused: admission is not bounded {codes}"
    assert growth < MAX_RSS_GROWTH_MB
    assert_still_serving(server)


# ------------------------------------------------------------------------------------------------ faults

def big_render_request(width=1280, height=720) -> pb.RenderCameraRequest:
    """A render of about 0.1 s here: long enough to be cut off while it waits or runs."""
    return pb.RenderCameraRequest(
        scene_id="scene", camera_model=pb.CameraModel(model="pinhole", width=width, height=height, fx=width / 2,
                                                      fy=width / 2, cx=width / 2, cy=height / 2),
        T_world_camera=pb.Transform(m=T_WORLD_CAMERA.ravel().tolist()), timestamp_us=T_ACTORS_US, depth=True)


def all_slots_free(s: Served, timeout: float = 15.0) -> bool:
    """Whether 3 renders at once (workers + queue) all succeed within ``timeout``: a call abandoned before may
    still finish its render for a moment, but a leaked admission or worker slot would refuse or hang them."""
    give_up = time.monotonic() + timeout
    with SensorClient(s.address, timeout_s=CALL_TIMEOUT_S) as c:
        while time.monotonic() < give_up:
            futures = [c.stub.RenderCamera.future(big_render_request(320, 180), timeout=timeout) for _ in range(3)]
            codes = [f.code() for f in futures]
            if codes == [OK] * 3:
                assert all(f.result().rgb.raw.shape == [180, 320, 3] for f in futures)
                return True
            assert set(codes) <= {OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
            time.sleep(0.1)
    return False


def test_clients_that_vanish_mid_call_do_not_hurt_the_server(server):
    """A call cancelled while it renders, and a channel closed under a call that waits for the worker: both end
    CANCELLED at the client, and the server's slots are free again (a leaked one would refuse or hang renders)."""
    for _ in range(3):
        a = grpc.insecure_channel(server.address)
        b = grpc.insecure_channel(server.address)
        try:
            running = pb_grpc.SensorServiceStub(a).RenderCamera.future(big_render_request(1920, 1080),
                                                                       timeout=CALL_TIMEOUT_S)  # ~0.3 s here
            time.sleep(0.02)
            waiting = pb_grpc.SensorServiceStub(b).RenderCamera.future(big_render_request(), timeout=CALL_TIMEOUT_S)
            time.sleep(0.03)
            assert running.cancel(), running  # (False: it had already ended)
            assert running.cancelled()
            b.close()  # the client goes away with its call in flight
            with pytest.raises(grpc.RpcError) as e:
                waiting.result(timeout=CALL_TIMEOUT_S)
            assert e.value.code() == grpc.StatusCode.CANCELLED, e.value
            assert all_slots_free(server)
        finally:
            a.close()
            b.close()
    assert_still_serving(server)


def test_a_deadline_too_short_gets_deadline_exceeded(server, client):
    """A deadline that passes in flight, or while the call waits for the worker: DEADLINE_EXCEEDED at the
    client; the server goes on serving."""
    req = big_render_request()
    for _ in range(3):
        code, _ = status(client.stub.RenderCamera, req, timeout=0.001)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert all_slots_free(server)  # (the server may still render it: the call is admitted until it ends)
    busy = client.stub.RenderCamera.future(big_render_request(1920, 1080), timeout=CALL_TIMEOUT_S)
    time.sleep(0.02)
    code, _ = status(client.stub.RenderCamera, req, timeout=0.05)  # waits behind `busy`
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert busy.result().rgb.raw.shape == [1080, 1920, 3]
    assert all_slots_free(server)
    assert_still_serving(server)


def record_of(sessions, session_id: str):
    """The record directory of a session (``<scenario>/<id>``), its metrics.json and steps.jsonl rows."""
    rec = sessions / "across" / session_id
    metrics = json.loads((rec / "metrics.json").read_text())
    rows = [json.loads(line) for line in (rec / "steps.jsonl").read_text().splitlines()]
    return rec, metrics, rows


def test_an_idle_session_expires_and_keeps_its_record(loop_street, tmp_path):
    sessions = tmp_path / "sessions"
    s = start_server(loop_street, "--session-timeout-s", "2", "--max-sessions", "1", "--sessions-dir", str(sessions))
    try:
        with SensorClient(s.address, timeout_s=CALL_TIMEOUT_S) as c:
            run = c.session("across", max_steps=10)
            assert run.idle_timeout_s == 2.0
            run.step(Controls(0.5, 0.0))
            last_call = time.monotonic()
            metrics_json = sessions / "across" / run.session_id / "metrics.json"
            while not metrics_json.is_file():  # no call meanwhile: one would keep the session alive
                assert time.monotonic() - last_call < 20, "the idle session was not ended"
                time.sleep(0.05)
            # (the server's idle clock started a moment before the step's answer reached us)
            assert time.monotonic() - last_call >= 1.9, "the session was ended before its idle timeout"
            for call, req in ((c.stub.StepSession, pb.StepSessionRequest(session_id=run.session_id,
                                                                         controls=pb.Controls())),
                              (c.stub.EndSession, pb.EndSessionRequest(session_id=run.session_id))):
                code, details = status(call, req, timeout=CALL_TIMEOUT_S)
                assert code == grpc.StatusCode.NOT_FOUND and details.startswith("session_id"), (code, details)
            rec, metrics, rows = record_of(sessions, run.session_id)
            assert metrics["completed"] is False and "expired" in metrics["error"], metrics.get("error")
            assert metrics["steps"] == 1 and [r["step"] for r in rows] == [0, 1]
            # its place in the session table (max 1) is free again
            with c.session("across", max_steps=1) as again:
                again.step(Controls(0.0, 0.0))
            assert again.metrics["completed"] is True
            assert_still_serving(s)
        assert terminate(s, 60) == 0, "".join(s.lines[-40:])
    finally:
        kill(s)
    assert not [p for p in sessions.rglob("*") if ".tmp-" in p.name]


def test_sigterm_under_load_exits_cleanly_and_records_the_open_session(loop_street, tmp_path):
    """SIGTERM while 4 clients render and a session is open (and stepped): the server exits 0 in time, calls
    in flight succeed or end UNAVAILABLE / CANCELLED, the session's record is complete, no temporary files."""
    sessions = tmp_path / "sessions"
    s = start_server(loop_street, "--sessions-dir", str(sessions))
    codes, lock, stop = Counter(), threading.Lock(), threading.Event()
    try:
        with SensorClient(s.address, timeout_s=CALL_TIMEOUT_S) as c:
            run = c.session("across", max_steps=0)
            run.step(Controls(0.5, 0.0))
            render_tiny(c)

        def note(key):
            with lock:
                codes[key] += 1

        def renderer(i):
            with SensorClient(s.address, timeout_s=CALL_TIMEOUT_S) as cl:
                k = i
                while not stop.is_set():
                    k += 1
                    try:
                        if k % 3 == 1:
                            cl.render_camera("scene", SMALL, T_WORLD_CAMERA, timestamp_us=T_ACTORS_US)
                        elif k % 3 == 2:
                            sensorsim_rgb(cl.channel)
                        else:
                            cl.render_lidar("scene", "velodyne-vlp16", T_WORLD_LIDAR, timestamp_us=T_ACTORS_US)
                        note(("render", "OK"))
                    except grpc.RpcError as e:
                        note(("render", e.code().name))
                        if e.code() == grpc.StatusCode.UNAVAILABLE:
                            return

        def stepper():
            with SensorClient(s.address, timeout_s=CALL_TIMEOUT_S) as cl:
                mine = RemoteSession(cl, run.session_id, run.info, run.observation, run.steps, run.idle_timeout_s)
                while not stop.is_set() and not mine.done:
                    try:
                        mine.step(Controls(0.2, 0.0))
                        note(("step", "OK"))
                    except grpc.RpcError as e:
                        note(("step", e.code().name))
                        return

        threads = [threading.Thread(target=renderer, args=(i,)) for i in range(4)] + [threading.Thread(target=stepper)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        with lock:
            before = sum(v for (_, c_), v in codes.items() if c_ == "OK")
        assert before > 0, codes
        t_term = time.monotonic()
        rc = terminate(s, SIGTERM_EXIT_S)
        exit_s = time.monotonic() - t_term
        stop.set()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    finally:
        stop.set()
        kill(s)
    out = "".join(s.lines)
    print(f"\nSIGTERM under load: exit {rc} after {exit_s:.1f} s (bound {SIGTERM_EXIT_S:g} s); calls {dict(codes)}")
    assert rc == 0 and "gsim serve: stopped" in out, out[-3000:]
    bad = {k: v for k, v in codes.items() if k[1] not in ("OK", "UNAVAILABLE", "CANCELLED")}
    assert not bad, codes
    assert codes["render", "UNAVAILABLE"] >= 1  # the renderers saw the server go
    rec, metrics, rows = record_of(sessions, run.session_id)
    assert metrics["completed"] is False and "shut down" in metrics["error"], metrics.get("error")
    steps_ok = codes["step", "OK"] + 1
    assert metrics["steps"] == len(rows) - 1 and metrics["steps"] in (steps_ok, steps_ok + 1), (metrics["steps"], codes)
    assert (rec / "run.mcap").is_file() and (rec / "log" / "log.json").is_file()
    leftovers = [str(p) for p in sessions.rglob("*") if ".tmp-" in p.name]
    assert not leftovers, leftovers
