"""The Python client of the network sensor API (`gsim serve`): the same `CameraFrame` / `LidarFrame` types as
the in-process API, and closed-loop sessions as context managers.

    from gsim.bridges.api.client import SensorClient
    with SensorClient("127.0.0.1:50051") as c:
        scenes = c.list_scenes()                       # [SceneSummary(id='demo', kind='scene', ...), ...]
        d = c.describe_scene("demo")                   # cameras, LiDARs, actors, ego trajectory
        cam, T_vc = d.cameras["front"]
        T = d.ego_pose(d.start_us) @ T_vc
        f = c.render_camera("demo", "front", T, timestamp_us=d.start_us)       # f.rgb float32 (H,W,3)
        sweep = c.render_lidar("demo", "velodyne-hdl64e", T, timestamp_us=d.start_us)
        with c.session("stopped-car") as s:            # the caller drives: s.info, s.observation
            while not s.done:
                obs, metrics, done = s.step(Controls(0.5, 0.0))
        print(s.metrics, s.record_dir)

Errors are `grpc.RpcError`s with the server's status code and message (see `sensor.proto`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import grpc
import numpy as np

from gsim.errors import InputError
from gsim.lidar import LidarSpec
from gsim.transforms import interpolate_pose

from . import sensor_pb2 as pb
from . import sensor_pb2_grpc as pb_grpc
from .wire import (camera_frame, from_camera_model, from_lidar_spec, from_loop_info, from_observation, from_struct,
                   from_trajectory, from_transform, lidar_frame, to_array, to_camera_model, to_lidar_spec, to_transform)

ENCODINGS = {"raw": pb.RAW, "png": pb.PNG, "jpeg": pb.JPEG}
MAX_MESSAGE_BYTES = 1 << 30


@dataclass(frozen=True)
class SceneSummary:
    id: str
    kind: str  # "scene" or "scenario"
    start_us: int
    end_us: int
    actors: int
    closed_loop: bool


@dataclass(frozen=True)
class SceneDescription:
    """cameras {name: (camera model, T_vehicle_camera)}, lidars {name: (LidarSpec, T_vehicle_lidar)}, actors
    {id: (category, size_m, timestamps_us, T_world_actor poses)}, ego (timestamps_us, T_world_vehicle poses)."""

    id: str
    kind: str
    start_us: int
    end_us: int
    cameras: Dict[str, Tuple[object, np.ndarray]]
    lidars: Dict[str, Tuple[LidarSpec, np.ndarray]]
    actors: Dict[str, tuple]
    ego: Optional[Tuple[np.ndarray, np.ndarray]]
    closed_loop: bool

    def ego_pose(self, timestamp_us: int) -> np.ndarray:
        """T_world_vehicle of the (edited) log at ``timestamp_us``."""
        return interpolate_pose(self.ego[0], self.ego[1], int(timestamp_us))


def _actor_poses(actor_poses: Optional[Dict[str, np.ndarray]]):
    return [pb.ActorPose(actor_id=k, T_world_actor=to_transform(T)) for k, T in (actor_poses or {}).items()]


def _poses(req, **poses) -> None:
    for name, T in poses.items():
        if T is not None:
            getattr(req, name).CopyFrom(to_transform(T))


def _times(req, timestamp_us: Optional[int], end_timestamp_us: Optional[int]) -> None:
    if timestamp_us is not None:
        req.timestamp_us = int(timestamp_us)
    if end_timestamp_us is not None:
        req.end_timestamp_us = int(end_timestamp_us)


def _encoding(name: str) -> int:
    if name not in ENCODINGS:
        raise InputError(f"encoding: expected one of {', '.join(ENCODINGS)}, got {name!r}")
    return ENCODINGS[name]


class SensorClient:
    """A connection to `gsim serve` at ``address`` ("host:port"). ``token``: the server's bearer token;
    ``root_certificates``: PEM bytes of the CA for a TLS server (None: plaintext); ``timeout_s``: each call's
    deadline (sessions' start: ``start_timeout_s``)."""

    def __init__(self, address: str, token: Optional[str] = None, root_certificates: Optional[bytes] = None,
                 timeout_s: float = 120.0, start_timeout_s: float = 600.0, tls: bool = False):
        opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        if root_certificates is not None or tls:
            self.channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates), opts)
        else:
            self.channel = grpc.insecure_channel(address, opts)
        self.stub = pb_grpc.SensorServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s

    def _call(self, method: str, request, timeout: Optional[float] = None):
        return getattr(self.stub, method)(request, timeout=timeout or self.timeout_s, metadata=self.metadata)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "SensorClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ scenes
    def health(self, service: str = "") -> str:
        """The standard health check: "SERVING", "NOT_SERVING", ..."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        r = health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                           timeout=self.timeout_s, metadata=self.metadata)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)

    def server_info(self) -> dict:
        from google.protobuf.json_format import MessageToDict
        return MessageToDict(self._call("GetServerInfo", pb.ServerInfoRequest()), preserving_proto_field_name=True)

    def list_scenes(self) -> list:
        """The served scenes as `SceneSummary`s (``.id`` is what the other calls take)."""
        r = self._call("ListScenes", pb.ListScenesRequest())
        return [SceneSummary(s.id, s.kind, s.start_us, s.end_us, s.actors, s.closed_loop) for s in r.scenes]

    def describe_scene(self, scene_id: str) -> SceneDescription:
        d = self._call("DescribeScene", pb.DescribeSceneRequest(scene_id=scene_id))
        cams = {c.name: (from_camera_model(c.model, c.name, 1 << 62), from_transform(c.T_vehicle_camera, c.name))
                for c in d.cameras}
        lidars = {li.name: (from_lidar_spec(li.spec, li.name, 1 << 62), from_transform(li.T_vehicle_lidar, li.name))
                  for li in d.lidars}
        actors = {a.id: (a.category, tuple(a.size_m), *from_trajectory(a.track, a.id)) for a in d.actors}
        ego = from_trajectory(d.ego, "ego") if d.HasField("ego") else None
        return SceneDescription(d.id, d.kind, d.start_us, d.end_us, cams, lidars, actors, ego, d.closed_loop)

    # ------------------------------------------------------------------------------------------ rendering
    def render_camera(self, scene_id: str, camera, T_world_camera=None, timestamp_us: Optional[int] = None,
                      encoding: str = "raw", depth: bool = True, alpha: bool = True,
                      actor_poses: Optional[Dict[str, np.ndarray]] = None, T_world_vehicle=None,
                      jpeg_quality: int = 90, backend: str = "auto", readout_us: int = 0, T_world_camera_end=None,
                      T_world_vehicle_end=None, end_timestamp_us: Optional[int] = None):
        """A `CameraFrame` (normal None). ``camera``: a camera of the scene by name, or a gsim camera model;
        ``T_world_camera`` (camera -> world), or ``T_world_vehicle`` with a named camera. ``encoding`` of rgb:
        "raw" (the render's float32, bit for bit), "png" or "jpeg" (8 bits, returned as float32 / 255).
        A rolling shutter: ``readout_us``; a moving camera: its end pose at ``end_timestamp_us`` (as
        `gsim.render_camera` with a trajectory)."""
        req = pb.RenderCameraRequest(scene_id=scene_id, encoding=_encoding(encoding), depth=depth, alpha=alpha,
                                     jpeg_quality=jpeg_quality, backend="" if backend == "auto" else backend,
                                     actor_poses=_actor_poses(actor_poses), readout_us=readout_us)
        if isinstance(camera, str):
            req.camera_name = camera
        else:
            req.camera_model.CopyFrom(to_camera_model(camera))
        _poses(req, T_world_camera=T_world_camera, T_world_vehicle=T_world_vehicle,
               T_world_camera_end=T_world_camera_end, T_world_vehicle_end=T_world_vehicle_end)
        _times(req, timestamp_us, end_timestamp_us)
        return camera_frame(self._call("RenderCamera", req))

    def render_lidar(self, scene_id: str, spec, T_world_lidar=None, timestamp_us: Optional[int] = None,
                     T_world_lidar_end=None, end_timestamp_us: Optional[int] = None, freeze_time: bool = False,
                     actor_poses: Optional[Dict[str, np.ndarray]] = None, T_world_vehicle=None,
                     T_world_vehicle_end=None, hit_alpha: float = 0.5, backend: str = "auto"):
        """A `LidarFrame`. ``spec``: a `LidarSpec`, a preset name, or a LiDAR of the scene by name. The pose at
        ``timestamp_us`` (the sweep's start) and, for a moving sensor, at ``end_timestamp_us``; with a named
        LiDAR the vehicle's poses may be given instead. ``freeze_time``: no rolling sweep (everything at the start)."""
        from gsim.lidar.spec import preset_names
        req = pb.RenderLidarRequest(scene_id=scene_id, freeze_time=freeze_time, hit_alpha=hit_alpha,
                                    backend="" if backend == "auto" else backend, actor_poses=_actor_poses(actor_poses))
        if isinstance(spec, LidarSpec):
            req.spec.CopyFrom(to_lidar_spec(spec))
        elif spec in preset_names():
            req.preset = spec
        else:
            req.lidar_name = spec
        _poses(req, T_world_lidar=T_world_lidar, T_world_lidar_end=T_world_lidar_end, T_world_vehicle=T_world_vehicle,
               T_world_vehicle_end=T_world_vehicle_end)
        _times(req, timestamp_us, end_timestamp_us)
        return lidar_frame(self._call("RenderLidar", req))

    # ------------------------------------------------------------------------------------------ sessions
    def session(self, scenario: str, seed: int = 0, agent_name: str = "remote", max_steps: Optional[int] = None,
                encoding: str = "raw", jpeg_quality: int = 90) -> "RemoteSession":
        """Starts a closed-loop session on a served scenario; the caller is the agent (see `RemoteSession`)."""
        r = self._call("StartSession", pb.StartSessionRequest(
            scenario=scenario, seed=seed, agent_name=agent_name, max_steps=max_steps or 0,
            camera_encoding=_encoding(encoding), jpeg_quality=jpeg_quality), timeout=self.start_timeout_s)
        return RemoteSession(self, r.session_id, from_loop_info(r.info), from_observation(r.observation), r.steps,
                             r.idle_timeout_s)


@dataclass
class RemoteSession:
    """A closed-loop run on the server, driven from here: ``info`` (`LoopInfo`), ``observation`` (the latest
    `Observation`), ``step(action)`` -> (observation, step metrics, done) with ``action`` a `Controls` or
    timed vehicle-frame waypoints (K,3) (t_s, x, y); ``end()`` -> the run's metrics (also ``metrics``) and
    ``record_dir`` (on the server's machine). As a context manager it ends the session on exit."""

    client: SensorClient
    session_id: str
    info: object
    observation: object
    steps: int
    idle_timeout_s: float
    done: bool = False
    metrics: Optional[dict] = None
    record_dir: Optional[str] = None
    step_metrics: list = field(default_factory=list)

    def step(self, action):
        from ..closed_loop.dynamics import Controls
        req = pb.StepSessionRequest(session_id=self.session_id)
        if isinstance(action, Controls):
            req.controls.CopyFrom(pb.Controls(accel_mps2=action.accel_mps2, steer_rate_rps=action.steer_rate_rps))
        else:
            req.waypoints.CopyFrom(to_array(np.asarray(action, np.float64)))
        r = self.client._call("StepSession", req)
        self.observation, self.done = from_observation(r.observation), r.done
        m = from_struct(r.metrics)
        self.step_metrics.append(m)
        return self.observation, m, self.done

    def end(self) -> dict:
        if self.metrics is None:
            r = self.client._call("EndSession", pb.EndSessionRequest(session_id=self.session_id))
            self.metrics, self.record_dir = from_struct(r.metrics), r.record_dir
        return self.metrics

    def __enter__(self) -> "RemoteSession":
        return self

    def __exit__(self, *exc) -> None:
        self.end()


__all__ = ["SensorClient", "RemoteSession", "SceneSummary", "SceneDescription"]
