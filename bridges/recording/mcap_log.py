"""Record closed-loop runs as MCAP files with Foxglove schemas.

``McapRecorder`` writes camera images (``foxglove.CompressedImage``), LiDAR sweeps
(``foxglove.PointCloud``), the frame tree (``foxglove.FrameTransform`` on ``/tf``),
3D boxes (``foxglove.SceneUpdate``) and per-step JSON records (ego state, controls,
metrics) into one file that Foxglove opens as is.

Conventions: poses are gsim's 4x4 float64 ``T_parent_child`` (metres, right-handed);
time is integer microseconds and becomes MCAP log/publish time in nanoseconds
(``timestamp_us * 1000``) and the messages' header stamps.

Failure behaviour: data goes to ``<name>.<random>.part`` beside the final path and
is renamed into place only by ``close()``. ``close()`` always finalizes the file
(chunk, index and footer) so every message written so far is kept, and records
whether the run completed in the metadata record ``gsim.recording``
(``complete``: ``"true"``/``"false"``, ``reason``). Leaving a ``with`` block by an
exception (Ctrl-C included) calls ``close(complete=False, reason=...)``: a run
that crashes at step k leaves a readable file with steps 0..k-1 plus whatever
part of step k was already written, and the exception propagates. Only a killed
process (or a failure while finalizing) leaves the ``.part`` file behind.

Boxes: each ``boxes()`` call first deletes all entities of earlier steps on that
topic (a ``SceneEntityDeletion`` of type ALL stamped at this step), then adds the
new ones with lifetime zero; so actors that left the scene vanish and nothing
depends on the step period (a one-step lifetime would flicker when steps jitter).

mcap, mcap-protobuf-support and foxglove-schemas-protobuf are the optional
``sumo`` extra; they are imported on first use, so ``import gsim.bridges`` works
without them.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import tempfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace, TracebackType
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Type, Union

import numpy as np
from PIL import Image

from gsim.errors import InputError, MissingExtra
from gsim.transforms import check_pose, rotmat_to_quat

TF_TOPIC = "/tf"
METADATA_NAME = "gsim.recording"
_LABEL_LIFT_M = 0.5  # label centre above the box top, metres
_BOX_FIELDS = ("id", "T", "size", "color", "label")


@functools.lru_cache(maxsize=None)
def _deps() -> SimpleNamespace:
    """Import the optional MCAP/Foxglove packages once, with an actionable error."""
    try:
        from foxglove_schemas_protobuf.Color_pb2 import Color
        from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
        from foxglove_schemas_protobuf.CubePrimitive_pb2 import CubePrimitive
        from foxglove_schemas_protobuf.FrameTransform_pb2 import FrameTransform
        from foxglove_schemas_protobuf.PackedElementField_pb2 import PackedElementField
        from foxglove_schemas_protobuf.PointCloud_pb2 import PointCloud
        from foxglove_schemas_protobuf.Pose_pb2 import Pose
        from foxglove_schemas_protobuf.Quaternion_pb2 import Quaternion
        from foxglove_schemas_protobuf.SceneEntity_pb2 import SceneEntity
        from foxglove_schemas_protobuf.SceneEntityDeletion_pb2 import SceneEntityDeletion
        from foxglove_schemas_protobuf.SceneUpdate_pb2 import SceneUpdate
        from foxglove_schemas_protobuf.TextPrimitive_pb2 import TextPrimitive
        from foxglove_schemas_protobuf.Vector3_pb2 import Vector3
        from mcap.writer import LIBRARY_IDENTIFIER, Writer
        from mcap_protobuf.schema import build_file_descriptor_set
    except ImportError as exc:
        raise MissingExtra(
            "MCAP recording needs mcap, mcap-protobuf-support and foxglove-schemas-protobuf: "
            f'pip install -e ".[sumo]" (missing: {exc.name})') from exc
    return SimpleNamespace(**locals())


@dataclass(frozen=True)
class Box:
    """One 3D box for ``McapRecorder.boxes``.

    id: entity id, unique per call (the same actor keeps its id across steps).
    T: 4x4 pose of the box CENTRE in the call's ``frame_id`` (gsim asset frames sit at
       the bottom-face centre: lift them by h/2 first); box x along length, z up.
    size: (length, width, height) in metres.
    color: (r, g, b, a) in 0..1.
    label: optional text drawn above the box.
    """

    id: str
    T: Any
    size: Sequence[float]
    color: Sequence[float] = (0.2, 0.6, 1.0, 0.5)
    label: Optional[str] = None


BoxLike = Union[Box, Mapping[str, Any], Any]


class McapRecorder:
    """Write one MCAP file with Foxglove protobuf schemas and JSON channels.

    Use as a context manager, or call ``close()`` yourself (from ``finally`` too, with
    ``complete=False``, to keep a failed run's data). Channels and schemas are
    registered on a topic's first message; a topic keeps its message type.
    """

    def __init__(self, path: Union[str, os.PathLike], profile: str = "gsim") -> None:
        """path: the final file (e.g. ``out/run.mcap``); replaced if it exists, at close.
        profile: the MCAP header profile string."""
        self._fx = _deps()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".part")
        self.part_path = Path(tmp)
        self._stream = os.fdopen(fd, "wb")
        self._writer = self._fx.Writer(self._stream)
        self._writer.start(profile=profile, library=f"gsim; {self._fx.LIBRARY_IDENTIFIER}")
        self._schema_ids: Dict[Tuple[str, str, bytes], int] = {}
        self._channels: Dict[str, Tuple[int, str]] = {}  # topic -> (channel id, schema name)
        self._sequence: Dict[str, int] = {}
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> "McapRecorder":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if exc is None:
            self.close()
        else:
            self.close(complete=False, reason=f"{exc_type.__name__}: {exc}")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, complete: bool = True, reason: str = "") -> Path:
        """Finalize the file and rename it to ``path``; returns ``path``. Idempotent.

        complete=False marks a run that stopped early (``reason`` says why) in the
        ``gsim.recording`` metadata; the messages written so far are kept either way.
        If finalizing itself fails, the ``.part`` file stays for ``mcap recover``.
        """
        if self._closed:
            return self.path
        self._closed = True
        try:
            self._writer.add_metadata(METADATA_NAME, {"complete": str(bool(complete)).lower(),
                                                      "reason": reason})
            self._writer.finish()
            self._stream.flush()
            os.fsync(self._stream.fileno())  # the rename must not publish unwritten data
        finally:
            self._stream.close()
        os.replace(self.part_path, self.path)
        return self.path

    # -- messages ----------------------------------------------------------------------

    def frame_transform(self, timestamp_us: int, parent: str, child: str, T_parent_child: Any) -> None:
        """Publish ``T_parent_child`` (4x4 rigid, metres) as a foxglove.FrameTransform on ``/tf``."""
        stamp = self._check_stamp(timestamp_us, TF_TOPIC)
        _check_name(parent, "parent", TF_TOPIC)
        _check_name(child, "child", TF_TOPIC)
        T = check_pose(T_parent_child, f"T_parent_child ({parent} <- {child}) on topic '{TF_TOPIC}'")
        fx = self._fx
        msg = fx.FrameTransform(parent_frame_id=parent, child_frame_id=child,
                                translation=_vector3(fx, T[:3, 3]), rotation=_quaternion(fx, T[:3, :3]))
        msg.timestamp.FromNanoseconds(stamp)
        self._write_proto(TF_TOPIC, msg, stamp)

    def image(self, timestamp_us: int, topic: str, frame_id: str, rgb: Any,
              format: str = "jpeg", quality: int = 90) -> None:
        """Publish an (H,W,3) image as a foxglove.CompressedImage.

        rgb: uint8, or float in [0,1] (rounded to uint8). frame_id: the camera's optical
        frame (OpenCV: x right, y down, z forward, as Foxglove expects).
        format: 'jpeg' (quality 1..100) or 'png' (lossless; quality ignored).
        """
        stamp = self._check_stamp(timestamp_us, topic)
        _check_name(frame_id, "frame_id", topic)
        if format not in ("jpeg", "png"):
            raise InputError(f"format on topic '{topic}': expected 'jpeg' or 'png', got {format!r}")
        if format == "jpeg" and not 1 <= int(quality) <= 100:
            raise InputError(f"quality on topic '{topic}': expected 1..100, got {quality}")
        pixels = _to_uint8_rgb(rgb, topic)
        buf = BytesIO()
        if format == "jpeg":
            Image.fromarray(pixels).save(buf, format="JPEG", quality=int(quality))
        else:
            # Level 1: most of PNG's size gain at a fraction of the default level's time per step.
            Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)
        msg = self._fx.CompressedImage(frame_id=frame_id, data=buf.getvalue(), format=format)
        msg.timestamp.FromNanoseconds(stamp)
        self._write_proto(topic, msg, stamp)

    def point_cloud(self, timestamp_us: int, topic: str, frame_id: str, points: Any) -> None:
        """Publish (N,3) xyz or (N,4) xyz+intensity points (metres, in ``frame_id``) as a
        foxglove.PointCloud of packed little-endian float32 fields, pose identity."""
        stamp = self._check_stamp(timestamp_us, topic)
        _check_name(frame_id, "frame_id", topic)
        pts = np.asarray(points)
        if pts.ndim != 2 or pts.shape[1] not in (3, 4):
            raise InputError(f"points on topic '{topic}': expected shape (N,3) or (N,4), got {pts.shape}")
        if not (np.issubdtype(pts.dtype, np.floating) or np.issubdtype(pts.dtype, np.integer)):
            raise InputError(f"points on topic '{topic}': expected a real numeric array, got {pts.dtype}")
        packed = np.ascontiguousarray(pts, dtype="<f4")
        if not np.all(np.isfinite(packed)):
            raise InputError(f"points on topic '{topic}': contains NaN or inf (or values beyond float32); "
                             "drop invalid returns first")
        fx = self._fx
        names = ("x", "y", "z", "intensity")[: pts.shape[1]]
        fields = [fx.PackedElementField(name=n, offset=4 * i, type=fx.PackedElementField.FLOAT32)
                  for i, n in enumerate(names)]
        msg = fx.PointCloud(frame_id=frame_id, pose=_identity_pose(fx), point_stride=4 * len(names),
                            fields=fields, data=packed.tobytes())
        msg.timestamp.FromNanoseconds(stamp)
        self._write_proto(topic, msg, stamp)

    def boxes(self, timestamp_us: int, topic: str, frame_id: str, boxes: Sequence[BoxLike]) -> None:
        """Publish 3D boxes (``Box``, dicts with Box's keys, or objects with those attributes)
        as one foxglove.SceneUpdate: a deletion of all earlier entities on ``topic``, then
        one entity per box (id = box id) with a CubePrimitive and an optional label."""
        stamp = self._check_stamp(timestamp_us, topic)
        _check_name(frame_id, "frame_id", topic)
        fx = self._fx
        update = fx.SceneUpdate()
        deletion = update.deletions.add(type=fx.SceneEntityDeletion.ALL)
        deletion.timestamp.FromNanoseconds(stamp)
        seen = set()
        for i, item in enumerate(boxes):
            box, T, size, color = _check_box(item, i, topic)
            if box.id in seen:  # a second entity with the same id would silently replace the first
                raise InputError(f"boxes[{i}] on topic '{topic}': duplicate id {box.id!r}")
            seen.add(box.id)
            entity = update.entities.add(frame_id=frame_id, id=box.id)
            entity.timestamp.FromNanoseconds(stamp)
            entity.cubes.add(pose=_pose(fx, T), size=_vector3(fx, size), color=_color(fx, color))
            if box.label is not None:
                top = T @ np.array([0.0, 0.0, size[2] / 2 + _LABEL_LIFT_M, 1.0])
                entity.texts.add(pose=fx.Pose(position=_vector3(fx, top[:3]),
                                              orientation=fx.Quaternion(w=1.0)),
                                 billboard=True, font_size=14.0, scale_invariant=True,
                                 color=_color(fx, (1.0, 1.0, 1.0, 1.0)), text=box.label)
        self._write_proto(topic, update, stamp)

    def json(self, timestamp_us: int, topic: str, data: Mapping[str, Any],
             schema_name: Optional[str] = None) -> None:
        """Publish a dict (ego state, controls, metrics) on a JSON channel.

        numpy scalars/arrays and dataclasses are converted; NaN/inf become null (JSON has
        no such numbers). The jsonschema is inferred from the topic's first message and
        named ``schema_name`` (default: 'gsim' + topic with '/' -> '.', e.g. gsim.metrics).
        """
        stamp = self._check_stamp(timestamp_us, topic)
        if not isinstance(data, Mapping):
            raise InputError(f"data on topic '{topic}': expected a dict, got {type(data).__name__}")
        plain = _jsonable(data, f"data on topic '{topic}'")
        name = schema_name or "gsim" + topic.replace("/", ".")

        def schema() -> bytes:
            return json.dumps({"title": name, **_json_schema(plain)}).encode()

        payload = json.dumps(plain, allow_nan=False, separators=(",", ":")).encode()
        self._write(topic, name, "jsonschema", schema, "json", payload, stamp)

    # -- internals ---------------------------------------------------------------------

    def _check_stamp(self, timestamp_us: int, topic: str) -> int:
        """Validate the time and the recorder state; return the stamp in nanoseconds."""
        if self._closed:
            raise RuntimeError(f"McapRecorder for {self.path} is closed (writing topic '{topic}')")
        if not isinstance(topic, str) or not topic:
            raise InputError(f"topic: expected a non-empty string, got {topic!r}")
        if isinstance(timestamp_us, (bool, np.bool_)) or not isinstance(timestamp_us, (int, np.integer)):
            raise InputError(f"timestamp_us on topic '{topic}': expected an integer (microseconds), "
                             f"got {timestamp_us!r}")
        if timestamp_us < 0:
            raise InputError(f"timestamp_us on topic '{topic}': must be >= 0, got {timestamp_us}")
        return int(timestamp_us) * 1000

    def _write_proto(self, topic: str, msg: Any, stamp_ns: int) -> None:
        name = msg.DESCRIPTOR.full_name
        self._write(topic, name, "protobuf",
                    lambda: self._fx.build_file_descriptor_set(type(msg)).SerializeToString(),
                    "protobuf", msg.SerializeToString(), stamp_ns)

    def _write(self, topic: str, schema_name: str, schema_encoding: str, schema_data: Callable[[], bytes],
               message_encoding: str, payload: bytes, stamp_ns: int) -> None:
        """Register the topic's schema/channel on first use, then add one message."""
        if topic not in self._channels:
            data = schema_data()
            key = (schema_name, schema_encoding, data)
            if key not in self._schema_ids:
                self._schema_ids[key] = self._writer.register_schema(schema_name, schema_encoding, data)
            channel_id = self._writer.register_channel(topic, message_encoding, self._schema_ids[key])
            self._channels[topic] = (channel_id, schema_name)
            self._sequence[topic] = 0
        channel_id, registered = self._channels[topic]
        if registered != schema_name:
            raise InputError(f"topic '{topic}' carries {registered}; cannot write {schema_name} to it")
        self._writer.add_message(channel_id=channel_id, log_time=stamp_ns, data=payload,
                                 publish_time=stamp_ns, sequence=self._sequence[topic])
        self._sequence[topic] += 1


def _check_name(value: Any, arg: str, topic: str) -> None:
    if not isinstance(value, str) or not value:
        raise InputError(f"{arg} on topic '{topic}': expected a non-empty string, got {value!r}")


def _to_uint8_rgb(rgb: Any, topic: str) -> np.ndarray:
    """(H,W,3) uint8 or float [0,1] -> contiguous (H,W,3) uint8."""
    img = np.asarray(rgb)
    if img.ndim != 3 or img.shape[2] != 3 or img.shape[0] == 0 or img.shape[1] == 0:
        raise InputError(f"rgb on topic '{topic}': expected shape (H,W,3), got {img.shape}")
    if img.dtype == np.uint8:
        return np.ascontiguousarray(img)
    if not np.issubdtype(img.dtype, np.floating):
        raise InputError(f"rgb on topic '{topic}': expected uint8 or float in [0,1], got {img.dtype}")
    if not np.all(np.isfinite(img)) or img.min() < 0.0 or img.max() > 1.0:
        raise InputError(f"rgb on topic '{topic}': float values must be finite and in [0,1]")
    return np.round(img.astype(np.float32) * 255.0).astype(np.uint8)


def _check_box(item: BoxLike, i: int, topic: str) -> Tuple[Box, np.ndarray, np.ndarray, np.ndarray]:
    """Normalize one box item; return it with its validated pose, size and colour."""
    where = f"boxes[{i}] on topic '{topic}'"
    if isinstance(item, Box):
        box = item
    elif isinstance(item, Mapping):
        unknown = set(item) - set(_BOX_FIELDS)
        if unknown:  # catches typos such as 'lable' that would otherwise drop data silently
            raise InputError(f"{where}: unknown keys {sorted(unknown)}; expected {_BOX_FIELDS}")
        try:
            box = Box(**item)
        except TypeError as exc:
            raise InputError(f"{where}: {exc}") from None
    else:
        missing = [k for k in ("id", "T", "size") if not hasattr(item, k)]
        if missing:
            raise InputError(f"{where}: expected a Box, dict or object with id, T, size; missing {missing}")
        box = Box(id=item.id, T=item.T, size=item.size, color=getattr(item, "color", Box.color),
                  label=getattr(item, "label", None))
    if not isinstance(box.id, str) or not box.id:
        raise InputError(f"{where}: id must be a non-empty string, got {box.id!r}")
    where = f"boxes[{i}] (id {box.id!r}) on topic '{topic}'"
    T = check_pose(box.T, f"{where} T")
    size = np.asarray(box.size, dtype=np.float64)
    if size.shape != (3,) or not np.all(np.isfinite(size)) or np.any(size <= 0):
        raise InputError(f"{where}: size must be 3 finite positive lengths (l, w, h), got {box.size!r}")
    color = np.asarray(box.color, dtype=np.float64)
    if color.shape != (4,) or not np.all(np.isfinite(color)) or color.min() < 0 or color.max() > 1:
        raise InputError(f"{where}: color must be (r, g, b, a) in 0..1, got {box.color!r}")
    if box.label is not None and not isinstance(box.label, str):
        raise InputError(f"{where}: label must be a string or None, got {box.label!r}")
    return box, T, size, color


def _vector3(fx: SimpleNamespace, v: np.ndarray) -> Any:
    return fx.Vector3(x=float(v[0]), y=float(v[1]), z=float(v[2]))


def _quaternion(fx: SimpleNamespace, R: np.ndarray) -> Any:
    w, x, y, z = rotmat_to_quat(R)  # gsim order (w, x, y, z); Foxglove names the fields
    return fx.Quaternion(x=float(x), y=float(y), z=float(z), w=float(w))


def _pose(fx: SimpleNamespace, T: np.ndarray) -> Any:
    return fx.Pose(position=_vector3(fx, T[:3, 3]), orientation=_quaternion(fx, T[:3, :3]))


def _identity_pose(fx: SimpleNamespace) -> Any:
    return fx.Pose(position=fx.Vector3(), orientation=fx.Quaternion(w=1.0))


def _color(fx: SimpleNamespace, rgba: Sequence[float]) -> Any:
    return fx.Color(r=float(rgba[0]), g=float(rgba[1]), b=float(rgba[2]), a=float(rgba[3]))


def _jsonable(value: Any, where: str) -> Any:
    """Convert numpy values, tuples and dataclasses to plain JSON types; NaN/inf -> None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InputError(f"{where}: keys must be strings, got {k!r}")
            out[k] = _jsonable(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{j}]") for j, v in enumerate(value)]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    raise InputError(f"{where}: cannot encode {type(value).__name__} as JSON")


def _json_schema(value: Any) -> Dict[str, Any]:
    """A jsonschema describing ``value`` (plain JSON types), so Foxglove can offer its fields."""
    if isinstance(value, dict):
        return {"type": "object", "properties": {k: _json_schema(v) for k, v in value.items()}}
    if isinstance(value, list):
        return {"type": "array", "items": _json_schema(value[0])} if value else {"type": "array"}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "number"}  # an integer field may carry floats in later steps
    if isinstance(value, float):
        return {"type": ["number", "null"]}  # non-finite values are written as null
    if isinstance(value, str):
        return {"type": "string"}
    return {}  # None: any type
