"""`gsim serve`: the network sensor API (`sensor.proto`) over gRPC, on the public API and the closed loop, and on the
same port AlpaSim's sensorsim service (`sensorsim`, with the alpasim extra).

Served scenes are loaded once at start: a reconstruction directory (``recon/scene`` and ``log`` inside, as `gsim demo`
writes; its id is the folder's name), a scene directory (``scene.json``; its log from the training record beside it), or
a scenario (a YAML file, an OpenSCENARIO file whose sessions play its storyboard against the client's ego, or a shipped
name; its id is the scenario's name; these also start closed-loop sessions). Calls are admitted up to ``workers +
queue`` at once; beyond that gRPC answers RESOURCE_EXHAUSTED, so memory stays bounded. Renders run ``workers`` at a time
(numba's CPU kernels already use every core for one render). A cancelled or expired call stops before its render.
Sessions that see no call for ``session_idle_s`` are ended, their records written; SIGTERM ends the server gracefully:
new calls are refused, in-flight ones finish, sessions are ended and recorded."""
from __future__ import annotations

import contextlib
import hmac
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, Optional, Tuple

import grpc
import numpy as np

from gsim.errors import GsimError, InputError, NotFound, check_name
from gsim.io import child_path, to_uint8
from gsim.lidar import LidarSpec, render_lidar
from gsim.render import available_backends, backend_report, render_camera
from gsim.render.common import to_numpy

from . import sensor_pb2 as pb
from . import sensor_pb2_grpc as pb_grpc
from .status import Capacity, Precondition, ShuttingDown, Stopped, log, request_parser, rpc
from .wire import (WireError, encode_image, from_array, from_camera_model, from_lidar_spec, from_transform,
                   lidar_response, to_array, to_camera_model, to_lidar_spec, to_loop_info, to_observation, to_struct,
                   to_trajectory, to_transform)

LOCALHOST = ("127.0.0.1", "localhost", "::1", "[::1]")
SERVICE = pb.DESCRIPTOR.services_by_name["SensorService"].full_name
# What one render may span (bounds on its work: a sweep's columns are traced in bundles of like poses)
MAX_MOTION_US, MAX_MOTION_M = 10_000_000, 200.0
MIN_SPIN_HZ, MAX_SPIN_HZ = 1.0, 100.0


@dataclass(frozen=True)
class Limits:
    """What one server does at once. workers: renders at once; queue: calls admitted beyond those (then
    RESOURCE_EXHAUSTED); max_pixels / max_rays per render; max_request_bytes per message received;
    max_sessions open at once; session_idle_s before an idle session is ended."""

    workers: int = 1
    queue: int = 16
    max_pixels: int = 4096 * 4096
    max_rays: int = 4_000_000
    max_request_bytes: int = 4 << 20
    max_response_bytes: int = 1 << 30
    max_sessions: int = 4
    session_idle_s: float = 300.0


@dataclass
class Served:
    """A served scene: the scene, its log's cameras and LiDARs (empty without a log), its (edited) ego
    trajectory and, for a scenario, the scenario (sessions start from it)."""

    id: str
    kind: str
    scene: object
    cameras: Dict[str, Tuple[object, np.ndarray]] = field(default_factory=dict)
    lidars: Dict[str, Tuple[LidarSpec, np.ndarray]] = field(default_factory=dict)
    ego: Optional[Tuple[np.ndarray, np.ndarray]] = None
    scenario: object = None

    @property
    def time_range(self) -> Tuple[int, int]:
        if self.ego is not None:
            return int(self.ego[0][0]), int(self.ego[0][-1])
        ts = [a.track_timestamps_us for a in self.scene.actors]
        return (int(min(t[0] for t in ts)), int(max(t[-1] for t in ts))) if ts else (0, 0)


def _folder_id(arg: str, p: Path) -> str:
    """The served id of a scene directory: its own name as the user wrote it (a symlink keeps its name), which
    must be a valid name (`gsim.errors.NAME_PATTERN`): it is refused, not renamed."""
    import os
    return check_name(os.path.basename(os.path.abspath(p)), f"{arg}: the folder's name (the served scene's id; "
                                                            f"rename the folder)")


def load_served(arg: str, progress: bool = False) -> Served:
    """One `gsim serve` argument as a served scene (see the module docstring); clear errors naming it."""
    from gsim.editing.outputs import mounted_rig
    from gsim.editing.scenario import Sensors
    from gsim.scene import load_scene
    from gsim.scenes.log import load_log, scene_and_log_dirs
    from ..closed_loop.scenario import SHIPPED, ensure_demo
    from ..openscenario.load import loop_scenario
    p = Path(arg)
    if str(arg) in SHIPPED or p.suffix in (".yaml", ".yml", ".xosc"):
        sc = loop_scenario(arg)  # (an OpenSCENARIO file's sessions play its storyboard against the client's ego)
        sid = check_name(sc.name, f"{arg}: the scenario's name (the served id)")
        if str(arg) in SHIPPED:
            ensure_demo(sc)
        from gsim.editing.world import apply
        world = apply(sc, progress=progress, ego_overlaps=True)
        cams, lidars = mounted_rig(world.log, sc.sensors)  # the scenario's own sensors, as its runs render them
        return Served(sid, "scenario", world.scene, cams, lidars, (world.ego_timestamps_us, world.ego_poses), sc)
    if not p.is_dir():
        raise InputError(f"{arg}: not a scene or reconstruction directory, a scenario file (.yaml, .xosc) or a "
                         f"shipped scenario ({', '.join(SHIPPED)})")
    scene_dir, log_dir = scene_and_log_dirs(p)
    sid = _folder_id(arg, p)
    scene = load_scene(scene_dir)
    if not (log_dir / "log.json").is_file():  # a scene without its log: explicit cameras and LiDAR specs only
        return Served(sid, "scene", scene)
    log = load_log(log_dir)
    cams, lidars = mounted_rig(log, Sensors())  # every camera, every LiDAR with a beam model
    return Served(sid, "scene", scene, cams, lidars, (log.ego_timestamps_us, log.ego_poses))


class _Session:
    def __init__(self, run, encoding: int, quality: int):
        self.run, self.encoding, self.quality = run, encoding, quality
        self.lock = threading.Lock()
        self.last_used = time.monotonic()
        self.over = False


def _add_service(servicer, server) -> None:
    """`sensor_pb2_grpc.add_SensorServiceServicer_to_server`, with request parsers that let the handler answer
    INVALID_ARGUMENT for bytes that are not the request's message."""
    handlers = {}
    for m in pb.DESCRIPTOR.services_by_name["SensorService"].methods:
        request, response = getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)
        handlers[m.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, m.name), request_deserializer=request_parser(request),
            response_serializer=response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


def _check_encoding(encoding: int, jpeg_quality: int, field: str) -> None:
    if encoding not in (pb.RAW, pb.PNG, pb.JPEG):
        raise WireError(f"{field}: unknown value {encoding}; RAW, PNG or JPEG")
    if jpeg_quality > 100:
        raise WireError(f"jpeg_quality: expected 1..100 (0: 90), got {jpeg_quality}")


class SensorServicer(pb_grpc.SensorServiceServicer):
    def __init__(self, served: Dict[str, Served], limits: Limits, sessions_dir: Path, backend: str = "auto"):
        self.served, self.limits, self.sessions_dir, self.backend = served, limits, Path(sessions_dir), backend
        self.slots = threading.Semaphore(limits.workers)
        self.sessions: Dict[str, _Session] = {}
        self.sessions_lock = threading.Lock()
        self.stopping = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="gsim-session-reaper", daemon=True)
        self._reaper.start()
        self._resident = threading.local()  # per worker thread: {(scene id, backend): gsim.resident.Renderer}

    # ---------------------------------------------------------------------------------------- helpers
    def served_scene(self, scene_id: str) -> Served:
        if scene_id not in self.served:
            raise NotFound(f"scene_id: no served scene {scene_id!r}; served: {', '.join(sorted(self.served))}")
        return self.served[scene_id]

    @contextlib.contextmanager
    def slot(self, context):
        """Holds a render slot, waited for while the call is alive; raises when it was cancelled or timed out."""
        while not self.slots.acquire(timeout=0.02):
            self._alive(context)
        try:
            self._alive(context)
            yield
        finally:
            self.slots.release()

    def _alive(self, context) -> None:
        if self.stopping.is_set():
            raise ShuttingDown("the server is shutting down")
        if not context.is_active():
            left = context.time_remaining()
            if left is not None and left <= 0:
                raise Stopped(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed before its render")
            raise Stopped(grpc.StatusCode.CANCELLED, "the call was cancelled")

    def checked_backend(self, name: str) -> str:
        name = name or self.backend
        if name != "auto" and name not in available_backends():
            why = backend_report().get(name, "unknown backend")
            raise WireError(f"backend: {name!r} is not available here ({why}); available: auto, "
                            f"{', '.join(available_backends())}")
        return name

    def renderer(self, served: Served, scene, backend: str):
        """This worker thread's resident renderer of a served scene (its actors as ``scene`` places them): the
        scene goes to the device once per thread, each call after that only moves the actors."""
        from gsim.resident import Renderer
        cache = self._resident.__dict__.setdefault("renderers", {})
        r = cache.get((served.id, backend))
        if r is None:
            r = cache[served.id, backend] = Renderer(scene, backend)
        else:
            r.update(scene)
        return r

    @staticmethod
    def _with_poses(scene, overrides, timestamp_us: Optional[int]):
        """The scene with some actors held at given poses."""
        if not overrides:
            return scene
        actors = {a.id: a for a in scene.actors}
        t = np.array([0 if timestamp_us is None else timestamp_us], np.int64)
        for i, o in enumerate(overrides):
            if o.actor_id not in actors:
                raise NotFound(f"actor_poses[{i}].actor_id: the scene has no actor {o.actor_id!r}")
            T = from_transform(o.T_world_actor, f"actor_poses[{i}].T_world_actor")
            actors[o.actor_id] = replace(actors[o.actor_id], track_timestamps_us=t, track_poses=T[None])
        return replace(scene, actors=tuple(actors[a.id] for a in scene.actors))

    @staticmethod
    def _time(request, field: str, scene) -> Optional[int]:
        if request.HasField(field):
            return int(getattr(request, field))
        if scene.actors:
            raise WireError(f"{field}: the scene has actors, so the time is needed (integer microseconds)")
        return None

    @staticmethod
    def _pose(request, field: str, vehicle_field: str, T_vehicle_sensor, what: str) -> Optional[np.ndarray]:
        """A sensor pose from ``field`` or, for a named sensor, from ``vehicle_field``; None when neither is set."""
        if request.HasField(field):
            if request.HasField(vehicle_field):
                raise WireError(f"{vehicle_field}: give either {field} or {vehicle_field}, not both")
            return from_transform(getattr(request, field), field)
        if request.HasField(vehicle_field):
            if T_vehicle_sensor is None:
                raise WireError(f"{vehicle_field}: only with a named {what} (its mounting is the scene's)")
            return from_transform(getattr(request, vehicle_field), vehicle_field) @ T_vehicle_sensor
        return None

    def _motion(self, request, T: np.ndarray, t: Optional[int], end_field: str, T_vehicle_sensor, what: str):
        """The sensor's pose, or its trajectory (timestamps_us, poses) from the start to the end pose."""
        T_end = self._pose(request, end_field, "T_world_vehicle_end", T_vehicle_sensor, what)
        if T_end is None and not request.HasField("end_timestamp_us"):
            return T
        if T_end is None or not request.HasField("end_timestamp_us") or t is None:
            raise WireError(f"end_timestamp_us: a moving sensor needs timestamp_us, end_timestamp_us and the end pose "
                            f"({end_field} or T_world_vehicle_end)")
        if request.end_timestamp_us <= t:
            raise WireError(f"end_timestamp_us: must be after timestamp_us ({request.end_timestamp_us} <= {t})")
        if request.end_timestamp_us - t > MAX_MOTION_US:
            raise WireError(f"end_timestamp_us: at most {MAX_MOTION_US} us after timestamp_us (one exposure or sweep)")
        if np.linalg.norm(T_end[:3, 3] - T[:3, 3]) > MAX_MOTION_M:
            raise WireError(f"{end_field}: the sensor moves more than {MAX_MOTION_M:g} m within one exposure or sweep")
        return np.array([t, request.end_timestamp_us], np.int64), np.stack([T, T_end])

    # ---------------------------------------------------------------------------------------- scenes
    @rpc
    def ListScenes(self, request, context):
        out = []
        for s in self.served.values():
            t0, t1 = s.time_range
            out.append(pb.SceneSummary(id=s.id, kind=s.kind, start_us=t0, end_us=t1, actors=len(s.scene.actors),
                                       closed_loop=s.scenario is not None))
        return pb.ListScenesResponse(scenes=out)

    @rpc
    def DescribeScene(self, request, context):
        s = self.served_scene(request.scene_id)
        t0, t1 = s.time_range
        return pb.SceneDescription(
            id=s.id, kind=s.kind, start_us=t0, end_us=t1, closed_loop=s.scenario is not None,
            cameras=[pb.NamedCamera(name=n, model=to_camera_model(c), T_vehicle_camera=to_transform(T))
                     for n, (c, T) in s.cameras.items()],
            lidars=[pb.NamedLidar(name=n, spec=to_lidar_spec(spec), T_vehicle_lidar=to_transform(T))
                    for n, (spec, T) in s.lidars.items()],
            actors=[pb.ActorInfo(id=a.id, category=a.category, size_m=list(map(float, a.size)),
                                 track=to_trajectory(a.track_timestamps_us, a.track_poses)) for a in s.scene.actors],
            ego=to_trajectory(*s.ego) if s.ego is not None else None)

    @rpc
    def GetServerInfo(self, request, context):
        from importlib.metadata import version
        from gsim.lidar.spec import preset_names
        L = self.limits
        return pb.ServerInfo(version=version("gsim"), backends=backend_report(), lidar_presets=preset_names(),
                             workers=L.workers, queue=L.queue, max_pixels=L.max_pixels, max_rays=L.max_rays,
                             max_sessions=L.max_sessions)

    # ---------------------------------------------------------------------------------------- rendering
    @rpc
    def RenderCamera(self, request, context):
        s = self.served_scene(request.scene_id)
        which = request.WhichOneof("camera")
        sensor, T_vc = None, None
        if which == "camera_name":
            if request.camera_name not in s.cameras:
                raise NotFound(f"camera_name: scene {s.id!r} has no camera {request.camera_name!r}; it has "
                               f"{sorted(s.cameras)}")
            sensor = request.camera_name
            camera, T_vc = s.cameras[sensor]
            if camera.width * camera.height > self.limits.max_pixels:
                raise WireError(f"camera_name: {sensor!r} has more pixels than max_pixels ({self.limits.max_pixels})")
        elif which == "camera_model":
            camera = from_camera_model(request.camera_model, "camera_model", self.limits.max_pixels)
        else:
            raise WireError("camera: give camera_name (a camera of the scene) or camera_model")
        T = self._pose(request, "T_world_camera", "T_world_vehicle", T_vc, "camera")
        if T is None:
            raise WireError("T_world_camera: the camera's pose is needed (or T_world_vehicle with camera_name)")
        t = self._time(request, "timestamp_us", s.scene)
        pose = self._motion(request, T, t, "T_world_camera_end", T_vc, "camera")
        if request.readout_us > 10_000_000:
            raise WireError(f"readout_us: expected at most 10 s of readout, got {request.readout_us} us")
        _check_encoding(request.encoding, request.jpeg_quality, "encoding")
        scene = self._with_poses(s.scene, request.actor_poses, t)
        backend = self.checked_backend(request.backend)
        with self.slot(context):
            t0 = time.perf_counter()
            if isinstance(pose, tuple) or request.readout_us:  # a moving or rolling-shutter camera
                f = render_camera(scene, camera, pose, backend=backend, timestamp_us=t, sensor=sensor,
                                  readout_us=int(request.readout_us))
            else:
                f = self.renderer(s, scene, backend).camera(camera, pose, t, sensor)
            # only what the reply carries comes to the host (from a GPU: 8-bit rgb unless RAW is asked for)
            rgb = to_numpy(f.rgb) if request.encoding == pb.RAW else to_uint8(f.rgb)
            depth = to_numpy(f.depth) if request.depth else None
            alpha = to_numpy(f.alpha) if request.alpha else None
            ms = (time.perf_counter() - t0) * 1e3
        return pb.RenderCameraResponse(rgb=encode_image(rgb, request.encoding, request.jpeg_quality or 90),
                                       depth=None if depth is None else to_array(depth),
                                       alpha=None if alpha is None else to_array(alpha), render_ms=ms)

    @rpc
    def RenderLidar(self, request, context):
        from gsim.lidar.spec import preset_names
        s = self.served_scene(request.scene_id)
        which = request.WhichOneof("lidar")
        T_vl = None
        if which == "preset":
            if request.preset not in preset_names():
                raise WireError(f"preset: unknown LiDAR preset {request.preset!r}; presets: {', '.join(preset_names())}")
            spec = LidarSpec.preset(request.preset)
        elif which == "lidar_name":
            if request.lidar_name not in s.lidars:
                raise NotFound(f"lidar_name: scene {s.id!r} has no LiDAR {request.lidar_name!r} with a beam model; "
                               f"it has {sorted(s.lidars)}")
            spec, T_vl = s.lidars[request.lidar_name]
        elif which == "spec":
            spec = from_lidar_spec(request.spec, "spec", self.limits.max_rays)
        else:
            raise WireError("lidar: give preset, lidar_name or spec")
        if not MIN_SPIN_HZ <= spec.spin_hz <= MAX_SPIN_HZ:  # (a slow spin stretches one sweep over minutes of motion)
            raise WireError(f"{which}: spin_hz {spec.spin_hz:g} is outside [{MIN_SPIN_HZ:g}, {MAX_SPIN_HZ:g}] Hz")
        if spec.lasers * spec.columns > self.limits.max_rays:
            raise WireError(f"{which}: {spec.lasers * spec.columns} rays is more than max_rays ({self.limits.max_rays})")
        T = self._pose(request, "T_world_lidar", "T_world_vehicle", T_vl, "LiDAR")
        if T is None:
            raise WireError("T_world_lidar: the LiDAR's pose is needed (or T_world_vehicle with lidar_name)")
        t = self._time(request, "timestamp_us", s.scene)
        pose = self._motion(request, T, t, "T_world_lidar_end", T_vl, "LiDAR")
        hit_alpha = request.hit_alpha or 0.5
        if not 0 < hit_alpha < 1:
            raise WireError(f"hit_alpha: expected a value in (0, 1) (0: 0.5), got {request.hit_alpha}")
        backend = request.backend or "auto"
        if backend not in ("auto", "numba", "cuda"):  # (the torch twin is a binning-free test reference: minutes)
            raise WireError(f"backend: expected auto, numba or cuda for LiDAR, got {backend!r}")
        scene = self._with_poses(s.scene, request.actor_poses, t)
        with self.slot(context):
            t0 = time.perf_counter()
            f = render_lidar(scene, spec, pose, backend=backend, timestamp_us=t, hit_alpha=hit_alpha,
                             rolling=not request.freeze_time)
            ms = (time.perf_counter() - t0) * 1e3
        return lidar_response(f, ms)

    # ---------------------------------------------------------------------------------------- sessions
    @rpc
    def StartSession(self, request, context):
        from ..closed_loop.runner import Run
        s = self.served.get(request.scenario)
        if s is None or s.scenario is None:
            names = sorted(k for k, v in self.served.items() if v.scenario is not None)
            raise NotFound(f"scenario: no served scenario {request.scenario!r}; served: {', '.join(names) or 'none'}")
        _check_encoding(request.camera_encoding, request.jpeg_quality, "camera_encoding")
        agent = check_name(request.agent_name or "remote", "agent_name")  # (as in batch runs' folder names)
        sid = secrets.token_hex(8)
        with self.sessions_lock:
            if self.stopping.is_set():
                raise ShuttingDown("the server is shutting down")
            if len(self.sessions) >= self.limits.max_sessions:
                raise Capacity(f"{len(self.sessions)} sessions are open (max_sessions {self.limits.max_sessions}); "
                                f"end one or retry later")
            self.sessions[sid] = session = _Session(None, request.camera_encoding, request.jpeg_quality or 90)
            session.lock.acquire()  # nobody steps it before it has started
        try:
            with self.slot(context):
                out = child_path(child_path(self.sessions_dir, s.id, "scene id"), sid, "session id")
                run = Run(s.scenario, out, agent, seed=int(request.seed),
                          max_steps=request.max_steps or None, client="traci")
                session.run = run
                try:
                    obs = run.start()
                except BaseException as e:
                    run.finish(e)
                    raise
        except BaseException:
            with self.sessions_lock:
                self.sessions.pop(sid, None)
            raise
        finally:
            session.last_used = time.monotonic()
            session.lock.release()
        loop = run.loop
        return pb.StartSessionResponse(session_id=sid, steps=run.n, idle_timeout_s=self.limits.session_idle_s,
                                       info=to_loop_info(loop.info, (loop.world.ego_timestamps_us, loop.world.ego_poses)),
                                       observation=to_observation(obs, session.encoding, session.quality))

    def _session(self, sid: str) -> _Session:
        with self.sessions_lock:
            if sid not in self.sessions:
                raise NotFound(f"session_id: no open session {sid!r} (ended, expired or never started)")
            return self.sessions[sid]

    @rpc
    def StepSession(self, request, context):
        from ..closed_loop.dynamics import Controls
        session = self._session(request.session_id)
        which = request.WhichOneof("action")
        if which == "controls":
            action = Controls(request.controls.accel_mps2, request.controls.steer_rate_rps)
        elif which == "waypoints":
            action = from_array(request.waypoints, "waypoints", "float64", (None, 3))
        else:
            raise WireError("action: give controls or waypoints")
        t_step = time.perf_counter()
        with session.lock:
            if session.over:
                raise Precondition(f"session {request.session_id}: the run is over; call EndSession")
            if request.session_id not in self.sessions:
                raise NotFound(f"session_id: session {request.session_id!r} has ended")
            try:
                with self.slot(context):
                    obs, m, done = self._step(session, request.session_id, action, t_step)
            finally:
                session.last_used = time.monotonic()
            session.over = done
        return pb.StepSessionResponse(observation=to_observation(obs, session.encoding, session.quality),
                                      metrics=to_struct(m), done=done)

    @staticmethod
    def _step(session: _Session, sid: str, action, t_step: float):
        from ..closed_loop.dynamics import ActionError
        from ..closed_loop.loop import LoopError
        try:
            return session.run.step(action, t_step)
        except ActionError as e:  # the state is unchanged: the caller may send a usable action
            raise WireError(f"action: {e}") from None
        except Exception as e:  # the run cannot go on (SUMO died, or a bug): it ends, its record is kept
            session.over = True
            session.run.finish(e)
            if not isinstance(e, GsimError):
                raise  # a bug: INTERNAL
            raise LoopError(f"session {sid}: the run stopped at step {session.run.done + 1}: "
                            f"{type(e).__name__}: {e}") from None

    @rpc
    def EndSession(self, request, context):
        session = self._session(request.session_id)
        with session.lock:
            with self.sessions_lock:
                self.sessions.pop(request.session_id, None)
            summary = session.run.finish()
        return pb.EndSessionResponse(metrics=to_struct(summary), record_dir=str(session.run.out.resolve()))

    def _reap(self) -> None:
        while not self.stopping.wait(1.0):
            now = time.monotonic()
            with self.sessions_lock:
                idle = [(k, s) for k, s in self.sessions.items() if now - s.last_used > self.limits.session_idle_s]
            for sid, s in idle:
                if s.lock.acquire(blocking=False):  # (a session mid-step is not idle)
                    try:
                        with self.sessions_lock:
                            self.sessions.pop(sid, None)
                        s.run.finish(TimeoutError(f"session {sid} expired after {self.limits.session_idle_s:g} s "
                                                  f"without a call"))
                    finally:
                        s.lock.release()

    def close_sessions(self, why: str) -> None:
        """Ends every open session (their records written), e.g. at shutdown."""
        self.stopping.set()
        with self.sessions_lock:
            open_ = list(self.sessions.items())
            self.sessions.clear()
        for sid, s in open_:
            with s.lock:
                if s.run is not None:
                    s.run.finish(RuntimeError(f"session {sid}: {why}"))


class _TokenCheck(grpc.ServerInterceptor):
    """Every call carries ``authorization: Bearer <token>`` metadata, or it is UNAUTHENTICATED."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        given = dict(details.invocation_metadata).get("authorization", "")
        if handler is None or hmac.compare_digest(given.encode(), self.expected):
            return handler
        why = "missing bearer token (metadata authorization: Bearer <token>)" if not given else "wrong bearer token"

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, why)
        kind = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
        return kind[(handler.request_streaming, handler.response_streaming)](
            deny, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)


@dataclass
class Server:
    """A running server: ``port`` (the bound one), ``stop(grace_s)``, ``wait()``."""

    grpc_server: object
    servicer: SensorServicer
    health: object
    port: int

    def stop(self, grace_s: float = 30.0) -> None:
        """Refuses new calls, lets in-flight ones finish (up to ``grace_s``), then ends every session."""
        self.health.enter_graceful_shutdown()
        self.servicer.stopping.set()
        self.grpc_server.stop(grace_s).wait()
        self.servicer.close_sessions("the server shut down")

    def wait(self) -> None:
        self.grpc_server.wait_for_termination()


def check_exposure(host: str, token: Optional[str], tls: Optional[Tuple[bytes, bytes]], insecure: bool) -> None:
    """An `InputError` unless a server on ``host`` is safe to reach: off the loopback it needs a bearer token,
    and TLS unless ``insecure`` (`start` checks it; a caller may check it before loading the scenes)."""
    if host in LOCALHOST:
        return
    if not token:
        raise InputError(f"--host {host}: a server reachable from other machines needs a bearer token "
                         f"(--token-file or GSIM_SERVE_TOKEN)")
    if not tls and not insecure:
        raise InputError(f"--host {host}: without TLS the bearer token would travel in clear; give --tls-cert and "
                         f"--tls-key, or --insecure (insecure=True) to accept that")


def start(served: Dict[str, Served], host: str = "127.0.0.1", port: int = 50051, token: Optional[str] = None,
          tls: Optional[Tuple[bytes, bytes]] = None, limits: Limits = Limits(), sessions_dir="out/sessions",
          backend: str = "auto", insecure: bool = False) -> Server:
    """Starts serving ``served`` on host:port (0: any free port); ``tls``: (private key, certificate chain) PEM.
    A host other than this machine's loopback needs a ``token``, and TLS too unless ``insecure`` (the token
    would travel in clear: a loud warning is logged)."""
    from concurrent.futures import ThreadPoolExecutor
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection
    check_exposure(host, token, tls, insecure)
    if host not in LOCALHOST and not tls:
        log.warning("INSECURE: serving on %s without TLS: the bearer token and every request travel in clear; "
                    "anyone on the network path can read the token and use the server", host)
    if limits.workers > 1 and backend != "gsplat":
        raise InputError(f"--workers {limits.workers}: the CPU kernels already use every core for one render (more "
                         f"workers add no throughput there, and numba's workqueue threading layer, where it is the "
                         f"one in use, cannot run two at once); more workers need --backend gsplat")
    admitted = limits.workers + limits.queue
    server = grpc.server(ThreadPoolExecutor(max_workers=admitted + 2, thread_name_prefix="gsim-serve"),
                         interceptors=[_TokenCheck(token)] if token else [], maximum_concurrent_rpcs=admitted,
                         options=[("grpc.max_receive_message_length", limits.max_request_bytes),
                                  ("grpc.max_send_message_length", limits.max_response_bytes)])
    servicer = SensorServicer(served, limits, Path(sessions_dir), backend)
    _add_service(servicer, server)  # (the generated registration would answer INTERNAL to undecodable bytes)
    services = (SERVICE,)
    try:
        from .sensorsim import SERVICE as SENSORSIM, add_sensorsim
        add_sensorsim(servicer, server)
        services += (SENSORSIM,)
    except ImportError as e:  # (the alpasim extra is in the default set-up; gsim's own API needs only serve)
        log.warning("AlpaSim's sensorsim service is not served: %s (pip install 'gsim[alpasim]')", e)
    hs = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection(services + (health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, grpc.ssl_server_credentials([tls])) if tls else \
        server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"could not bind {address} (in use, or not an address of this machine)")
    server.start()
    for name in ("",) + services:
        hs.set(name, health_pb2.HealthCheckResponse.SERVING)
    return Server(server, servicer, hs, bound)


def serve_forever(server: Server, grace_s: float = 30.0) -> None:
    """Serves until SIGTERM or SIGINT, then stops gracefully (see `Server.stop`)."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(0.5):
        pass
    print("gsim serve: stopping (in-flight calls finish, sessions are recorded)", flush=True)
    server.stop(grace_s)
    print("gsim serve: stopped", flush=True)


class ServerProcess:
    """`gsim serve ARGS --port 0` in a subprocess (for tests, benchmarks and scripts): ``address`` once it
    listens, ``lines`` (its output, read on a thread so that a full pipe never blocks it), ``stop()`` (SIGTERM,
    then its exit code and output). A context manager."""

    def __init__(self, args, env=None, cwd=None, start_timeout_s: float = 900.0):
        import os
        import re
        import subprocess
        import sys
        self.proc = subprocess.Popen([sys.executable, "-m", "gsim.cli", "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})}, cwd=cwd)
        self.lines = []
        listening = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.search(r"listening on (\S+):(\d+) ", line)
                if m and not listening.is_set():
                    self.address = f"{m.group(1)}:{m.group(2)}"
                    listening.set()
            listening.set()  # (it exited)
        self.drainer = threading.Thread(target=read, daemon=True)
        self.drainer.start()
        listening.wait(start_timeout_s)
        if not hasattr(self, "address"):
            self.proc.kill()
            raise RuntimeError("gsim serve did not start:\n" + "".join(self.lines))

    def stop(self, timeout: float = 60.0) -> Tuple[int, str]:
        self.proc.terminate()
        rc = self.proc.wait(timeout)
        self.drainer.join(10)
        return rc, "".join(self.lines)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            try:
                self.stop()
            except Exception:
                self.proc.kill()
