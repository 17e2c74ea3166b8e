"""ROS 2 bags of what gsim renders: a rosbag2 folder (MCAP storage, CDR) that ``ros2 bag play`` replays as
sensor_msgs, written with `rosbags` and its ROS 2 message types (the ros2 extra, imported on first use: ``gsim
--help`` never loads it). The types are those of ROS 2 Jazzy and later; Humble's differ in
visualization_msgs/Marker alone (no texture fields), so a Humble machine replays every topic but the markers.

Topics (NAME: the sensor's name, characters outside [A-Za-z0-9_] as '_', as ROS topic names allow):

    /clock                            rosgraph_msgs/Clock, at each step
    /tf_static                        tf2_msgs/TFMessage: base_link -> each sensor's frame, once (transient local)
    /tf                               map -> base_link at each step
    /gsim/ego/odom                    nav_msgs/Odometry of the ego (map -> base_link); its twist in base_link where
                                      the command knows it (closed loop), else zero with covariance[0] = -1
    /gsim/camera/NAME/image_raw       sensor_msgs/Image rgb8, or (JPEG) image_raw/compressed CompressedImage
    /gsim/camera/NAME/camera_info     sensor_msgs/CameraInfo, with each image
    /gsim/lidar/NAME/points           sensor_msgs/PointCloud2 in the LiDAR's frame: x, y, z, intensity (float32),
                                      ring (uint16: the laser's index in the spec), time (float32 s from the stamp)
    /gsim/actors/markers              visualization_msgs/MarkerArray in map: a DELETEALL, then one CUBE per actor
                                      (its box; ns its class, id a number kept for the run, text its gsim id)

vision_msgs/Detection3DArray is not written: rosbags' type store has no vision_msgs types.

Frames: ``map`` is gsim's world, ``base_link`` the vehicle frame (x forward, y left, z up), ``camera_NAME_optical_frame``
gsim's camera frame (x right, y down, z forward: ROS's optical frame), ``lidar_NAME`` the LiDAR's. CameraInfo maps
gsim's camera models back as `gsim convert rosbag` reads them: pinhole -> plumb_bob with D zero, OpenCV ->
plumb_bob (k1 k2 p1 p2 k3), fisheye -> equidistant (k1..k4); the principal point half a pixel less (ROS puts pixel
centres at integers); R identity, P = [K | 0].

Stamps are the sim time (timestamp_us) as header stamps and as the bag's record times; each topic's increase.
The bag is written in a temporary folder beside its path and renamed into place by `Ros2BagWriter.close`; an error
(leaving its ``with`` block) removes it. An existing path is refused, never replaced.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from .cameras import OPENCV_PIXEL_CENTRE_SHIFT, Camera
from .errors import InputError
from .io import image_bytes
from .transforms import check_pose, rotmat_to_quat

IMAGE, COMPRESSED_IMAGE = "sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage"
INFO, CLOUD = "sensor_msgs/msg/CameraInfo", "sensor_msgs/msg/PointCloud2"
ODOMETRY, TF_MESSAGE = "nav_msgs/msg/Odometry", "tf2_msgs/msg/TFMessage"
MARKER_ARRAY, CLOCK_MESSAGE = "visualization_msgs/msg/MarkerArray", "rosgraph_msgs/msg/Clock"
POINT_TYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 8: "f8"}  # PointField datatypes
PRIMITIVES = {"bool": bool, "byte": np.uint8, "char": np.uint8, "int8": np.int8, "uint8": np.uint8,
              "int16": np.int16, "uint16": np.uint16, "int32": np.int32, "uint32": np.uint32, "int64": np.int64,
              "uint64": np.uint64, "float32": np.float32, "float64": np.float64}

MAP, BASE = "map", "base_link"
CLOCK, TF, TF_STATIC = "/clock", "/tf", "/tf_static"
ODOM_TOPIC, MARKER_TOPIC = "/gsim/ego/odom", "/gsim/actors/markers"
# gsim's camera frame in a vehicle frame looking along its x: the rig of a camera without a vehicle (gsim render)
T_BASE_OPTICAL = np.array([[0.0, 0, 1, 0], [-1, 0, 0, 0], [0, -1, 0, 0], [0, 0, 0, 1]])
POINT = np.dtype({"names": ["x", "y", "z", "intensity", "ring", "time"],
                  "formats": ["<f4", "<f4", "<f4", "<f4", "<u2", "<f4"], "offsets": [0, 4, 8, 12, 16, 20],
                  "itemsize": 24})  # a Velodyne driver's fields, 4-byte aligned
JPEG_FORMAT = "rgb8; jpeg compressed bgr8"  # image_transport's: the source encoding; what a JPEG decoder gives
ACTOR_RGBA = (1.0, 0.5, 0.1, 0.5)
DELETEALL, CUBE = 3, 1  # visualization_msgs/Marker's action and type


@dataclass(frozen=True)
class BagOptions:
    """A ROS 2 bag to write (``--ros2-bag DIR``, ``--ros2-jpeg``): the rosbag2 folder (must not exist), and camera
    images as JPEG CompressedImage of ``jpeg_quality`` (1-100) instead of raw rgb8 Image."""

    path: Path
    jpeg: bool = False
    jpeg_quality: int = 90


@dataclass(frozen=True)
class ActorBox:
    """An actor at a step: id, class, T (4x4 T_map_box of the box's centre, x along its length, z up) and size
    (length, width, height) m. The closed loop's boxes have the same attributes."""

    id: str
    category: str
    T: np.ndarray
    size: Tuple[float, float, float]


def scene_boxes(scene, timestamp_us: int):
    """The scene's actors' boxes at a time (`gsim.Scene` actors' poses are their boxes' centres)."""
    return [ActorBox(a.id, a.category, a.pose_at(int(timestamp_us)), tuple(a.size)) for a in scene.actors]


# --------------------------------------------------------------------------- messages as dicts

def build(ts, typ: str, values: dict, make=None):
    """A message of type ``typ`` from the type store ``ts``, from nested dicts of field names (case-insensitive: ROS
    1's CameraInfo says ``K`` where ROS 2 says ``k``); fields left out are zero or empty. ``make(typ, fields)`` makes
    each (nested) message from its fields (default: the type store's own classes; the ROS 2 agent makes cyclonedds
    ones, `gsim.bridges.ros2.messages`)."""
    from rosbags.typesys.base import Nodetype
    given = {k.lower(): v for k, v in (values or {}).items()}
    kw = {}
    for name, (node, desc) in ts.fielddefs[typ][1]:
        v = given.get(name.lower())
        if node == Nodetype.NAME:
            kw[name] = build(ts, desc, v, make)
        elif node == Nodetype.BASE:
            kw[name] = v if v is not None else ("" if desc[0] == "string" else PRIMITIVES[desc[0]](0))
        else:
            (enode, edesc), size = desc
            if enode == Nodetype.NAME:
                kw[name] = [build(ts, edesc, x, make) for x in (v or [])]
            elif edesc[0] == "string":
                kw[name] = list(v or [])
            else:
                kw[name] = np.asarray(v if v is not None else np.zeros(size), PRIMITIVES[edesc[0]])
    return ts.types[typ](**kw) if make is None else make(typ, kw)


def ros_time(stamp_ns: int) -> dict:
    """A builtin_interfaces/Time."""
    return {"sec": stamp_ns // 1_000_000_000, "nanosec": stamp_ns % 1_000_000_000}


def header(stamp_ns: int, frame_id: str) -> dict:
    return {"stamp": ros_time(stamp_ns), "frame_id": frame_id}


def pose(T: np.ndarray) -> dict:
    """A geometry_msgs/Pose of T."""
    w, x, y, z = rotmat_to_quat(np.asarray(T)[:3, :3])
    return {"position": dict(zip("xyz", T[:3, 3])), "orientation": {"x": x, "y": y, "z": z, "w": w}}


def transform(parent: str, child: str, stamp_ns: int, T: np.ndarray) -> dict:
    """A geometry_msgs/TransformStamped of T_parent_child."""
    p = pose(T)
    return {"header": header(stamp_ns, parent), "child_frame_id": child,
            "transform": {"translation": p["position"], "rotation": p["orientation"]}}


def cloud(stamp_ns: int, frame_id: str, points: np.ndarray, big_endian: bool = False) -> dict:
    """A sensor_msgs/PointCloud2 (one row) of a numpy structured array; its fields' names, types and offsets."""
    dt = points.dtype
    codes = {v: k for k, v in POINT_TYPES.items()}
    fields = [{"name": n, "offset": dt.fields[n][1], "datatype": codes[dt.fields[n][0].str[1:]], "count": 1}
              for n in dt.names]
    want = dt.newbyteorder(">" if big_endian else "<")
    data = points
    if dt != want or not points.flags.c_contiguous:  # else no copy (a 74k-point sweep: 1.8 MB)
        data = np.zeros(len(points), want)  # field by field: the padding between fields zero, not astype's garbage
        for n in dt.names:
            data[n] = points[n]
    return {"header": header(stamp_ns, frame_id), "height": 1, "width": len(points), "fields": fields,
            "is_bigendian": big_endian, "point_step": dt.itemsize, "row_step": dt.itemsize * len(points),
            "data": data.view(np.uint8).reshape(-1), "is_dense": True}


def lidar_points(points: np.ndarray, intensity: Optional[np.ndarray], ring: np.ndarray,
                 time_offset_us: np.ndarray) -> np.ndarray:
    """A sweep as `POINT` records: points (N,3) m, intensity (N,) (None: zeros), ring (N,), time offsets (N,) us."""
    rec = np.zeros(len(points), POINT)
    rec["x"], rec["y"], rec["z"] = np.asarray(points).T
    rec["intensity"] = 0.0 if intensity is None else intensity
    rec["ring"], rec["time"] = ring, np.asarray(time_offset_us, np.float64) / 1e6
    return rec


def image(stamp_ns: int, frame_id: str, rgb: np.ndarray) -> dict:
    """A sensor_msgs/Image rgb8 of an (H,W,3) uint8 image."""
    h, w = rgb.shape[:2]
    return {"header": header(stamp_ns, frame_id), "height": h, "width": w, "encoding": "rgb8", "step": 3 * w,
            "data": np.ascontiguousarray(rgb).reshape(-1)}


def odometry(stamp_ns: int, T_map_base: np.ndarray,
             twist: Optional[Tuple[Sequence[float], Sequence[float]]] = None) -> dict:
    """The nav_msgs/Odometry of the vehicle at ``T_map_base`` with ``twist`` ((vx, vy, vz) m/s, (wx, wy, wz) rad/s
    in base_link; None: unknown, zero with covariance[0] = -1, sensor_msgs' convention for "no estimate")."""
    covariance = np.zeros(36)
    if twist is None:
        covariance[0] = -1
    linear, angular = twist if twist is not None else ((0.0,) * 3, (0.0,) * 3)
    return {"header": header(stamp_ns, MAP), "child_frame_id": BASE, "pose": {"pose": pose(T_map_base)},
            "twist": {"twist": {"linear": dict(zip("xyz", map(float, linear))),
                                "angular": dict(zip("xyz", map(float, angular)))}, "covariance": covariance}}


def camera_info(camera: Camera, stamp_ns: int, frame_id: str) -> dict:
    """The sensor_msgs/CameraInfo of a gsim camera (see the module's docstring)."""
    fx, fy = camera.fx, camera.fy
    cx, cy = camera.cx - OPENCV_PIXEL_CENTRE_SHIFT, camera.cy - OPENCV_PIXEL_CENTRE_SHIFT
    if camera.model == "fisheye":
        model, d = "equidistant", [camera.k1, camera.k2, camera.k3, camera.k4]
    elif camera.model == "opencv":
        model, d = "plumb_bob", [camera.k1, camera.k2, camera.p1, camera.p2, camera.k3]
    else:
        model, d = "plumb_bob", [0.0] * 5
    return {"header": header(stamp_ns, frame_id), "height": camera.height, "width": camera.width,
            "distortion_model": model, "d": d, "k": [fx, 0, cx, 0, fy, cy, 0, 0, 1], "r": np.eye(3).ravel(),
            "p": [fx, 0, cx, 0, 0, fy, cy, 0, 0, 0, 1, 0]}


def topic_token(name: str) -> str:
    """A sensor name as a ROS topic name token: [A-Za-z0-9_], not starting with a digit."""
    token = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return f"_{token}" if token[:1].isdigit() else token


def _tokens(names, what: str) -> Dict[str, str]:
    tokens = {n: topic_token(n) for n in names}
    clash = sorted(n for n in names if list(tokens.values()).count(tokens[n]) > 1)
    if clash:
        raise InputError(f"ROS 2 bag: the {what} {clash} share the topic name {tokens[clash[0]]!r} (ROS topic names "
                         f"take letters, digits and '_' only)")
    return tokens


# --------------------------------------------------------------------------- the writer

class Ros2BagWriter:
    """Writes one ROS 2 bag (see the module's docstring) step by step: `step` (clock, tf, odometry, markers; the
    first call also /tf_static), then the step's `image` and `sweep` calls. A context manager: its block's error
    removes the bag, else it is closed into place; or call `close` (a closed-loop run that failed keeps its completed
    steps: ``complete=False`` and the reason go into metadata.yaml's custom_data)."""

    def __init__(self, options: BagOptions, cameras: Dict[str, Tuple[Camera, np.ndarray]],
                 lidars: Dict[str, np.ndarray]):
        """``cameras`` {name: (camera model, T_base_camera)}, ``lidars`` {name: T_base_lidar}: the rig."""
        from rosbags.rosbag2 import StoragePlugin, Writer
        from rosbags.typesys import Stores, get_typestore
        self.options, self.path = options, Path(options.path)
        if not 1 <= options.jpeg_quality <= 100:
            raise InputError(f"ROS 2 bag: JPEG quality must be 1-100, got {options.jpeg_quality}")
        cams, lids = _tokens(cameras, "cameras"), _tokens(lidars, "LiDARs")
        self.cameras = {n: (cam, check_pose(T, f"camera {n}: T_base_camera"), f"/gsim/camera/{cams[n]}",
                            f"camera_{cams[n]}_optical_frame") for n, (cam, T) in cameras.items()}
        self.lidars = {n: (check_pose(T, f"LiDAR {n}: T_base_lidar"), f"/gsim/lidar/{lids[n]}/points",
                           f"lidar_{lids[n]}") for n, T in lidars.items()}
        if self.path.exists():
            raise InputError(f"{self.path}: exists already; gsim writes a ROS 2 bag into a new folder (remove it or "
                             f"name another)")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.tmp-", dir=self.path.parent))
        except OSError as e:  # named by the path the user gave, not the temporary one
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        self.ts = get_typestore(Stores.LATEST)
        # metadata version 8 (Jazzy's): its QoS profiles are the text older rosbag2 releases read too
        self._bag = Writer(self._tmp / self.path.name, version=8, storage_plugin=StoragePlugin.MCAP)
        self._bag.open()
        self._connections: Dict[str, object] = {}
        self._last_ns: Dict[str, int] = {}
        self._marker_ids: Dict[str, int] = {}
        self.steps = 0

    def __enter__(self) -> "Ros2BagWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close()
        else:
            self.abort()

    def _write(self, topic: str, typ: str, stamp_ns: int, values: dict) -> None:
        """Serialize a message (record time = its stamp); a topic's first message adds its connection."""
        last = self._last_ns.get(topic)
        if last is not None and stamp_ns <= last:
            raise InputError(f"ROS 2 bag {self.path}: {topic}: stamp {stamp_ns // 1000} us is not after the previous "
                             f"{last // 1000} us; a bag's stamps must increase (are the frames' times in order?)")
        self._last_ns[topic] = stamp_ns
        if topic not in self._connections:
            self._connections[topic] = self._bag.add_connection(topic, typ, typestore=self.ts,
                                                                offered_qos_profiles=_qos(topic))
        data = self.ts.serialize_cdr(build(self.ts, typ, values), typ)
        self._bag.write(self._connections[topic], stamp_ns, bytes(data))

    @staticmethod
    def _stamp(timestamp_us: int) -> int:
        if isinstance(timestamp_us, (bool, np.bool_)) or not isinstance(timestamp_us, (int, np.integer)) \
                or timestamp_us < 0:
            raise InputError(f"ROS 2 bag: a time must be an integer >= 0 microseconds, got {timestamp_us!r}")
        return int(timestamp_us) * 1000

    def step(self, timestamp_us: int, T_map_base: np.ndarray,
             twist: Optional[Tuple[Sequence[float], Sequence[float]]] = None, actors: Sequence = ()) -> None:
        """A step at sim time ``timestamp_us``: /clock, /tf and the odometry of the vehicle at ``T_map_base``,
        ``twist`` ((vx, vy, vz) m/s, (wx, wy, wz) rad/s in base_link; None: unknown) and the ``actors``' markers
        (`ActorBox`es or objects with their attributes). The first step also writes /tf_static."""
        ns = self._stamp(timestamp_us)
        T = check_pose(T_map_base, "ROS 2 bag: T_map_base")
        self.steps += 1
        if TF_STATIC not in self._last_ns:
            mounts = [transform(BASE, frame, ns, T_bc) for _, T_bc, _, frame in self.cameras.values()]
            mounts += [transform(BASE, frame, ns, T_bl) for T_bl, _, frame in self.lidars.values()]
            self._write(TF_STATIC, TF_MESSAGE, ns, {"transforms": mounts})
        self._write(CLOCK, CLOCK_MESSAGE, ns, {"clock": ros_time(ns)})
        self._write(TF, TF_MESSAGE, ns, {"transforms": [transform(MAP, BASE, ns, T)]})
        self._write(ODOM_TOPIC, ODOMETRY, ns, odometry(ns, T, twist))
        r, g, b, a = ACTOR_RGBA
        markers = [{"header": header(ns, MAP), "action": DELETEALL}]
        for box in actors:
            markers.append({"header": header(ns, MAP), "ns": box.category, "type": CUBE, "text": box.id,
                            "id": self._marker_ids.setdefault(box.id, len(self._marker_ids)),
                            "pose": pose(check_pose(box.T, f"ROS 2 bag: actor {box.id}: T")),
                            "scale": dict(zip("xyz", map(float, box.size))), "color": {"r": r, "g": g, "b": b, "a": a}})
        self._write(MARKER_TOPIC, MARKER_ARRAY, ns, {"markers": markers})

    def image(self, name: str, timestamp_us: int, rgb: np.ndarray) -> None:
        """Camera ``name``'s (H,W,3) uint8 image and its CameraInfo."""
        camera, _, topic, frame = self.cameras[name]
        ns = self._stamp(timestamp_us)
        if rgb.dtype != np.uint8 or rgb.shape != (camera.height, camera.width, 3):
            raise InputError(f"ROS 2 bag: camera {name}: a {rgb.dtype} image of shape {rgb.shape}, expected uint8 "
                             f"({camera.height}, {camera.width}, 3)")
        if self.options.jpeg:
            self._write(f"{topic}/image_raw/compressed", COMPRESSED_IMAGE, ns, {
                "header": header(ns, frame), "format": JPEG_FORMAT,
                "data": np.frombuffer(image_bytes(rgb, "jpeg", self.options.jpeg_quality), np.uint8)})
        else:
            self._write(f"{topic}/image_raw", IMAGE, ns, image(ns, frame, rgb))
        self._write(f"{topic}/camera_info", INFO, ns, camera_info(camera, ns, frame))

    def sweep(self, name: str, timestamp_us: int, points: np.ndarray, intensity: Optional[np.ndarray],
              ring: np.ndarray, time_offset_us: np.ndarray) -> None:
        """LiDAR ``name``'s sweep stamped ``timestamp_us``: points (N,3) m in its frame, intensity (N,) in [0,1]
        (None: zeros), ring (N,) laser indices and time_offset_us (N,) each point's time from the stamp."""
        _, topic, frame = self.lidars[name]
        ns = self._stamp(timestamp_us)
        pts = np.asarray(points)
        if pts.ndim != 2 or pts.shape[1] != 3:
            raise InputError(f"ROS 2 bag: LiDAR {name}: points of shape {pts.shape}, expected (N,3)")
        self._write(topic, CLOUD, ns, cloud(ns, frame, lidar_points(pts, intensity, ring, time_offset_us)))

    def close(self, complete: bool = True, reason: str = "") -> Path:
        """Finish the bag and rename it into place; returns its path. ``complete`` False (``reason`` says why)
        marks a recording that stopped early."""
        try:
            if not complete:
                self._bag.set_custom_data("gsim.complete", "false")
                self._bag.set_custom_data("gsim.reason", reason)
            self._bag.close()
            if self.path.exists():  # (appeared while the bag was written)
                raise InputError(f"{self.path}: exists already; the ROS 2 bag is not moved there")
            os.rename(self._tmp / self.path.name, self.path)
            os.rmdir(self._tmp)
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Remove the unfinished bag."""
        with contextlib.suppress(Exception):
            self._bag.close()  # (releases the storage file)
        shutil.rmtree(self._tmp, ignore_errors=True)


def _qos(topic: str) -> list:
    """/tf_static as tf2's static broadcaster offers it (transient local: a late listener still gets it); the rest
    with the default profile (empty)."""
    if topic != TF_STATIC:
        return []
    from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
    zero = QosTime(0, 0)
    return [Qos(QosHistory.KEEP_LAST, 1, QosReliability.RELIABLE, QosDurability.TRANSIENT_LOCAL, zero, zero,
                QosLiveliness.AUTOMATIC, zero, False)]


def open_bag(options: Optional[BagOptions], cameras: Dict[str, Tuple[Camera, np.ndarray]],
             lidars: Dict[str, np.ndarray]):
    """A `Ros2BagWriter` for ``options``, or (None) a context that gives None: ``with open_bag(...) as bag:``."""
    return contextlib.nullcontext() if options is None else Ros2BagWriter(options, cameras, lidars)
