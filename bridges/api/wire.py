"""gsim's types to and from the network API's messages (`sensor.proto`), for the server and the client alike.

Reading a message checks it: a bad field raises `WireError` (a `gsim.errors.InputError`) whose message starts
with the field's path in the request (``camera_model.width``, ``actor_poses[2].T_world_actor``), which the
server returns as INVALID_ARGUMENT."""
from __future__ import annotations

import io
import json
import math
from dataclasses import fields
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from gsim.cameras import camera_from_dict
from gsim.errors import InputError
from gsim.lidar import LidarFrame, LidarSpec
from gsim.render.common import CameraFrame
from gsim.transforms import check_pose

from . import sensor_pb2 as pb

DTYPES = ("uint8", "int32", "int64", "float32", "float64")
CAMERA_COEFFS = {"pinhole": (), "opencv": ("k1", "k2", "p1", "p2", "k3"), "fisheye": ("k1", "k2", "k3", "k4")}


class WireError(InputError):
    """A request field that cannot be used: the message names it."""


# ------------------------------------------------------------------------------------------------ arrays

def to_array(a) -> pb.Array:
    a = np.ascontiguousarray(a)
    if a.dtype.name not in DTYPES:
        raise TypeError(f"to_array: dtype {a.dtype} is not one of {DTYPES}")
    return pb.Array(dtype=a.dtype.name, shape=a.shape, data=a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())


def from_array(m: pb.Array, field: str, dtype: Optional[str] = None, shape: Optional[Sequence] = None) -> np.ndarray:
    """The array of ``m``; ``dtype`` and ``shape`` (None entries: any length) are required when given."""
    if m.dtype not in DTYPES:
        raise WireError(f"{field}.dtype: expected one of {', '.join(DTYPES)}, got {m.dtype!r}")
    if dtype is not None and m.dtype != dtype:
        raise WireError(f"{field}.dtype: expected {dtype}, got {m.dtype}")
    dims = tuple(m.shape)
    if any(d < 0 for d in dims):
        raise WireError(f"{field}.shape: negative dimension in {list(dims)}")
    if shape is not None and (len(dims) != len(shape) or any(s is not None and d != s for d, s in zip(dims, shape))):
        want = "(" + ", ".join("N" if s is None else str(s) for s in shape) + ")"
        raise WireError(f"{field}.shape: expected {want}, got {list(dims)}")
    dt = np.dtype(m.dtype).newbyteorder("<")
    n = math.prod(dims)
    if n * dt.itemsize != len(m.data):
        raise WireError(f"{field}.data: {len(m.data)} bytes for shape {list(dims)} of {m.dtype} "
                        f"({n * dt.itemsize} expected)")
    return np.frombuffer(m.data, dtype=dt).astype(dt.newbyteorder("="), copy=False).reshape(dims)


def optional_array(m: pb.Array, field: str):
    """None for an unset (empty) array field, else the array."""
    return None if not m.dtype and not m.shape else from_array(m, field)


# ------------------------------------------------------------------------------------------------ poses

def to_transform(T) -> pb.Transform:
    return pb.Transform(m=np.asarray(T, np.float64).reshape(16).tolist())


def from_transform(m: pb.Transform, field: str) -> np.ndarray:
    if len(m.m) != 16:
        raise WireError(f"{field}.m: expected 16 values (a row-major 4x4 transform), got {len(m.m)}")
    try:
        return check_pose(np.array(m.m, np.float64).reshape(4, 4), field)
    except InputError as e:
        raise WireError(str(e)) from None


def to_trajectory(ts, poses) -> pb.Trajectory:
    return pb.Trajectory(timestamps_us=to_array(np.asarray(ts, np.int64)), poses=to_array(np.asarray(poses, np.float64)))


def from_trajectory(m: pb.Trajectory, field: str) -> Tuple[np.ndarray, np.ndarray]:
    ts = from_array(m.timestamps_us, f"{field}.timestamps_us", "int64", (None,))
    poses = from_array(m.poses, f"{field}.poses", "float64", (len(ts), 4, 4))
    return ts, poses


# ------------------------------------------------------------------------------------------------ sensors

def to_camera_model(cam) -> pb.CameraModel:
    return pb.CameraModel(**{k: v for k, v in cam.to_dict().items()})


def from_camera_model(m: pb.CameraModel, field: str, max_pixels: int):
    """The gsim camera of ``m``; at most ``max_pixels`` pixels."""
    if m.model not in CAMERA_COEFFS:
        raise WireError(f"{field}.model: expected one of {', '.join(CAMERA_COEFFS)}, got {m.model!r}")
    for name in ("width", "height"):
        if getattr(m, name) == 0:
            raise WireError(f"{field}.{name}: expected a positive number of pixels, got 0")
    if m.width * m.height > max_pixels:
        raise WireError(f"{field}: {m.width} x {m.height} pixels is more than this server renders at once "
                        f"({max_pixels}; GetServerInfo.max_pixels)")
    coeffs = CAMERA_COEFFS[m.model]
    for name in ("k1", "k2", "k3", "k4", "p1", "p2"):
        if name not in coeffs and getattr(m, name) != 0:
            raise WireError(f"{field}.{name}: the {m.model} model has no {name}; leave it 0")
    d = {"model": m.model, "width": int(m.width), "height": int(m.height), "fx": m.fx, "fy": m.fy, "cx": m.cx,
         "cy": m.cy, **{k: getattr(m, k) for k in coeffs}}
    try:
        return camera_from_dict(d, field)
    except InputError as e:  # the model's own checks name its class: name the request's field instead
        msg = str(e)
        for cls in ("PinholeCamera", "OpenCVCamera", "FisheyeCamera"):
            msg = msg.replace(cls, field)
        raise WireError(msg if msg.startswith(field) else f"{field}: {msg}") from None


def to_lidar_spec(spec: LidarSpec) -> pb.LidarSpec:
    d = {f.name: getattr(spec, f.name) for f in fields(spec)}
    return pb.LidarSpec(**{k: list(v) if isinstance(v, tuple) else v for k, v in d.items()})


def from_lidar_spec(m: pb.LidarSpec, field: str, max_rays: int) -> LidarSpec:
    d = {"name": m.name, "elevations_deg": tuple(m.elevations_deg), "azimuth_resolution_deg": m.azimuth_resolution_deg,
         "spin_hz": m.spin_hz, "min_range_m": m.min_range_m, "max_range_m": m.max_range_m, "spin": m.spin or "cw",
         "azimuth_offsets_deg": tuple(m.azimuth_offsets_deg), "firing_offsets_us": tuple(m.firing_offsets_us)}
    if m.HasField("start_azimuth_deg"):
        d["start_azimuth_deg"] = m.start_azimuth_deg
    res = m.azimuth_resolution_deg
    if not (math.isfinite(res) and res > 0):
        raise WireError(f"{field}.azimuth_resolution_deg: expected a finite number > 0, got {res}")
    if len(m.elevations_deg) * 360.0 / res > max_rays:
        raise WireError(f"{field}: {len(m.elevations_deg)} lasers x {360.0 / res:.0f} columns is more rays than "
                        f"this server renders at once ({max_rays}; GetServerInfo.max_rays)")
    try:
        return LidarSpec(**d)
    except InputError as e:  # the spec's own checks name its class (LidarSpec.spin_hz): name the request's field
        msg = str(e)
        raise WireError(field + msg[len("LidarSpec"):] if msg.startswith("LidarSpec") else f"{field}: {msg}") from None


# ------------------------------------------------------------------------------------------------ images

def encode_image(rgb, encoding: int, quality: int = 90) -> pb.EncodedImage:
    """RAW sends the array as it is (a render's float32 rgb, an observation's uint8); PNG and JPEG send 8 bits."""
    if encoding == pb.RAW:
        return pb.EncodedImage(encoding=pb.RAW, raw=to_array(rgb))
    from gsim.io import image_bytes, to_uint8
    img = rgb if rgb.dtype == np.uint8 else to_uint8(rgb)
    return pb.EncodedImage(encoding=encoding, data=image_bytes(img, "png" if encoding == pb.PNG else "jpeg",
                                                               quality or 90))


def decode_image(m: pb.EncodedImage, field: str = "image") -> np.ndarray:
    """RAW: the array sent; PNG / JPEG: uint8 (H,W,3)."""
    if m.encoding == pb.RAW:
        return from_array(m.raw, f"{field}.raw")
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(m.data)).convert("RGB"))


def camera_frame(m: pb.RenderCameraResponse) -> CameraFrame:
    """A `CameraFrame` from a response: rgb as sent (RAW: the server's float32; PNG / JPEG: uint8 / 255 as
    float32); depth and alpha None unless asked for; normal None (not sent)."""
    rgb = decode_image(m.rgb, "rgb")
    if rgb.dtype == np.uint8:
        rgb = rgb.astype(np.float32) / 255.0
    return CameraFrame(rgb=rgb, alpha=optional_array(m.alpha, "alpha"), depth=optional_array(m.depth, "depth"),
                       normal=None)


LIDAR_FIELDS = ("points", "ranges", "ring", "column", "time_offset_us", "normals", "intensity", "range_image",
                "expected_range_image", "alpha_image", "drop_probability_image")


def lidar_response(f: LidarFrame, render_ms: float) -> pb.RenderLidarResponse:
    return pb.RenderLidarResponse(render_ms=render_ms, **{k: to_array(getattr(f, k)) for k in LIDAR_FIELDS
                                                          if getattr(f, k) is not None})


def lidar_frame(m: pb.RenderLidarResponse) -> LidarFrame:
    return LidarFrame(**{k: optional_array(getattr(m, k), k) for k in LIDAR_FIELDS})


# ------------------------------------------------------------------------------------------------ sessions

def to_struct(d: dict):
    """A JSON-able dict (numpy scalars, NaN and inf allowed) as a google.protobuf.Struct."""
    from google.protobuf.struct_pb2 import Struct
    s = Struct()
    s.update(json.loads(json.dumps(d, default=lambda x: x.item() if hasattr(x, "item") else str(x))))
    return s


def from_struct(s) -> dict:
    from google.protobuf.json_format import MessageToDict
    return MessageToDict(s)


def to_observation(obs, encoding: int, quality: int) -> pb.Observation:
    e = obs.ego
    return pb.Observation(
        step=obs.step, timestamp_us=obs.timestamp_us, T_world_vehicle=to_transform(obs.T_world_vehicle),
        ego=pb.EgoState(x_m=e.x_m, y_m=e.y_m, yaw_rad=e.yaw_rad, speed_mps=e.speed_mps, steer_rad=e.steer_rad,
                        accel_mps2=e.accel_mps2, timestamp_us=e.timestamp_us),
        route=to_array(obs.route),
        cameras=[pb.NamedImage(name=n, image=encode_image(im, encoding, quality)) for n, im in obs.cameras.items()],
        lidars=[pb.NamedArray(name=n, array=to_array(a)) for n, a in obs.lidars.items()],
        lidar_ranges=[pb.NamedArray(name=n, array=to_array(a)) for n, a in obs.lidar_ranges.items()],
        actors=[pb.Box(**{f.name: getattr(b, f.name) for f in fields(b)}) for b in obs.actors])


def from_observation(m: pb.Observation):
    from ..closed_loop.dynamics import EgoState
    from ..closed_loop.loop import Observation
    from ..closed_loop.metrics import Box
    e = m.ego
    return Observation(
        step=m.step, timestamp_us=m.timestamp_us, T_world_vehicle=from_transform(m.T_world_vehicle, "T_world_vehicle"),
        ego=EgoState(e.x_m, e.y_m, e.yaw_rad, e.speed_mps, e.steer_rad, e.accel_mps2, e.timestamp_us),
        route=from_array(m.route, "route"), cameras={c.name: decode_image(c.image, c.name) for c in m.cameras},
        lidars={a.name: from_array(a.array, a.name) for a in m.lidars},
        lidar_ranges={a.name: from_array(a.array, a.name) for a in m.lidar_ranges},
        actors=tuple(Box(**{f.name: getattr(b, f.name) for f in fields(Box)}) for b in m.actors))


def to_loop_info(info, logged: Tuple[np.ndarray, np.ndarray]) -> pb.LoopInfo:
    return pb.LoopInfo(route_xy=to_array(np.asarray(info.route_xy, np.float64)),
                       params=pb.VehicleParams(**{f.name: getattr(info.params, f.name) for f in fields(info.params)}), step_s=info.step_s,
                       target_speed_mps=info.target_speed_mps, scenario=info.scenario,
                       logged=to_trajectory(*logged), logged_until_us=info.logged_until_us,
                       T_vehicle_lidar=[pb.NamedTransform(name=n, transform=to_transform(T))
                                        for n, T in info.T_vehicle_lidar.items()])


def from_loop_info(m: pb.LoopInfo):
    """The `LoopInfo` an in-process agent gets (its ``logged_pose`` interpolates the sent log trajectory)."""
    from gsim.transforms import interpolate_pose
    from ..closed_loop.dynamics import VehicleParams
    from ..closed_loop.loop import LoopInfo
    ts, poses = from_trajectory(m.logged, "logged")
    params = VehicleParams(**{f.name: getattr(m.params, f.name) for f in fields(VehicleParams)})
    lidars: Dict[str, np.ndarray] = {t.name: from_transform(t.transform, t.name) for t in m.T_vehicle_lidar}
    return LoopInfo(from_array(m.route_xy, "route_xy"), params, m.step_s, m.target_speed_mps, m.scenario,
                    lambda t_us: interpolate_pose(ts, poses, t_us), m.logged_until_us, lidars)
