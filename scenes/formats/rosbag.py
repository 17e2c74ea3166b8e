"""ROS bags -> gsim driving log: a team's own recording, read with `rosbags` (pure Python, no ROS installation).

Bags: rosbag1 (a ``.bag`` file, or a folder of split ``.bag`` files) and rosbag2 (a folder with ``metadata.yaml``,
split or not, or a single ``.db3`` / ``.mcap`` file; sqlite3 or MCAP storage, zstd-compressed or not).

- Cameras: ``sensor_msgs/Image`` (rgb8, bgr8, rgba8, bgra8, mono8; bayer_* debayered with OpenCV) and
  ``CompressedImage`` (JPEG, PNG, stored as recorded), each with the ``CameraInfo`` beside it (``<ns>/camera_info``
  for ``<ns>/image_raw[/compressed]``, or ``--camera TOPIC:INFO_TOPIC``; its first message, the camera being taken
  not to change). plumb_bob is gsim's OpenCV model (k1, k2, p1, p2, k3), equidistant its fisheye (k1..k4);
  rational_polynomial is taken only where k4..k6 are 0 (it is plumb_bob then): gsim has no rational model, and other
  coefficients are refused, not approximated. A rectified image (an ``image_rect*`` topic, or ``--rectified TOPIC``)
  is the pinhole of P in the frame R rotates the optical frame into (as KITTI's P_rect). Principal points move by
  +0.5 px to gsim's pixel-centre convention. Image topics without a CameraInfo are left out (noted); a bag whose
  every image topic lacks one is refused.
- LiDARs: ``sensor_msgs/PointCloud2`` of any field layout: x, y, z (required); intensity or reflectivity, scaled to
  [0, 1] (integer fields by their type's maximum; float fields as they are when the first sweep's are within [0, 1],
  else by 1/255, or 1/65535 above 255); per-point time under `TIME_FIELDS`' names (`_offsets_us`: seconds or
  nanoseconds, relative to the message's stamp or since 1970), stored as the log's time-offset column (us from the
  sweep's stamp) that gsim de-skews with; with no such field the sweep has none (no de-skew). A ring or channel
  field gives the LiDAR's beam table (each ring's median elevation in the first sweep, beyond 10 m where it can, the median azimuth step
  between a ring's neighbouring points, the sweep's nearest and farthest return); the log keeps no per-point beam
  index. Points that are not finite, or exactly at the origin (drivers' "no return"), are dropped.
- Frames: one per sweep of the first LiDAR (else per image of the first camera), with each other sensor's message
  nearest in stamp within the tolerance; frames without one are left out and noted, and a topic that misses more
  than `MAX_UNMATCHED` of them is refused, the gap named. Times are the messages' header stamps.
- Geometry: ``/tf_static`` and ``/tf`` (T_parent_child) place each sensor's frame (its messages' header.frame_id)
  in the base frame, gsim's vehicle frame: ``--base-frame``, else base_link, base_footprint, the pose topic's child
  frame, the first LiDAR's frame (REP-103 gives base frames gsim's x forward, y left, z up). Camera optical frames
  (x right, y down, z forward) are gsim's camera frame as they are. The vehicle's pose: ``--pose TOPIC``
  (nav_msgs/Odometry, PoseStamped, PoseWithCovarianceStamped: the pose of the child frame, else of the base frame)
  or ``tf:PARENT``; else found in that order: Autoware's /localization/kinematic_state, tf from map, an Odometry
  topic, a pose topic, tf from odom. The world is that frame (z up by REP-105) moved so that the first pose is at
  the origin (map frames are often UTM, too far out for float32 rendering). A bag without any: LiDAR odometry
  (`convert_util.LidarOdometry`, as KITTI without oxts) on the first LiDAR, world = the first vehicle frame.
"""
from __future__ import annotations

import io
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from gsim.cameras import Camera
from gsim.errors import InputError, check_name
from gsim.ros2_bag import CLOUD, COMPRESSED_IMAGE, IMAGE, INFO, ODOMETRY, POINT_TYPES, TF_MESSAGE, TF_STATIC
from gsim.scenes.formats.convert_util import (OPENCV_PIXEL_CENTRE_SHIFT, LidarOdometry, camera_from_params,
                                              make_pose, nearest_rotation, ns_to_us, rectified_camera,
                                              smoothed_odometry)
from gsim.scenes.log import LidarBeams, LogWriter
from gsim.transforms import interpolate_pose, invert, quat_to_rotmat

POSES = (ODOMETRY, "geometry_msgs/msg/PoseStamped", "geometry_msgs/msg/PoseWithCovarianceStamped")
TF_TYPES = (TF_MESSAGE, "tf/msg/tfMessage")
AUTOWARE_POSE = "/localization/kinematic_state"
BASE_FRAMES = ("base_link", "base_footprint")
CHANNELS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}
BAYER = ("bayer_rggb8", "bayer_bggr8", "bayer_gbrg8", "bayer_grbg8")
COMPRESSED = {"JPEG": ".jpg", "PNG": ".png"}  # CompressedImage data by PIL's name: its file suffix
INTENSITY_FIELDS = ("intensity", "reflectivity")
TIME_FIELDS = ("time", "t", "timestamp", "time_stamp", "offset_time")  # Velodyne, Ouster, Hesai, Autoware, Livox
RING_FIELDS = ("ring", "channel")
ABSOLUTE_S = 1e6  # per-point times beyond these are since 1970 (a sweep lasts a fraction of a second)
ABSOLUTE_NS = 1e15
MAX_OFFSET_US = 1_000_000  # a per-point time further than this from its sweep's stamp is read wrongly
DEFAULT_TOLERANCE_MS = 50.0  # half a 10 Hz LiDAR's period
# a topic may miss a few frames (a sensor starting late, a dropped message); more is a wrong tolerance or topic
MAX_UNMATCHED = 0.1
MIN_ODOMETRY_SWEEPS = 2
BEAM_FROM_M, BEAM_MIN_POINTS = 10.0, 20  # a ring's elevation from its far returns (`_beams`)


@dataclass(frozen=True)
class RosbagOptions:
    """What `gsim convert rosbag` takes from a bag (its flags); empty or None: found in the bag."""

    camera: Sequence[str] = ()  # TOPIC or TOPIC:INFO_TOPIC
    lidar: Sequence[str] = ()
    pose: Optional[str] = None  # a pose topic or tf:PARENT
    base_frame: Optional[str] = None
    rectified: Sequence[str] = ()  # image topics whose CameraInfo P is their camera
    rate: Optional[float] = None  # at most this many frames a second (Hz)
    start: Optional[float] = None  # seconds from the bag's start (record time)
    end: Optional[float] = None
    tolerance_ms: float = DEFAULT_TOLERANCE_MS
    list_topics: bool = False


@dataclass(frozen=True)
class _Camera:
    name: str
    topic: str
    info: str
    rectified: bool


@dataclass
class _Plan:
    """What a conversion takes: cameras, {LiDAR name: topic}, the pose source (a topic, "tf:PARENT" or None for
    odometry), the base frame, and notes on what it leaves out."""

    cameras: List[_Camera]
    lidars: Dict[str, str]
    pose: Optional[str]
    base: str
    notes: List[str] = field(default_factory=list)

    @property
    def sensors(self) -> List[str]:
        """The sensor topics, the frames' reference first."""
        return [*self.lidars.values(), *(c.topic for c in self.cameras)]


# --------------------------------------------------------------------------- the bag

def _bag_paths(bag: Path) -> List[Path]:
    if bag.is_dir():
        if (bag / "metadata.yaml").is_file():
            return [bag]
        split = sorted(bag.glob("*.bag"))
        if split:
            return split
        raise InputError(f"{bag}: a folder without metadata.yaml (rosbag2) or .bag files (rosbag1)")
    if not bag.is_file():
        raise InputError(f"{bag}: no such file or folder (expected a ROS bag: .bag, .db3, .mcap or a rosbag2 folder)")
    if bag.suffix not in (".bag", ".db3", ".mcap"):
        raise InputError(f"{bag}: not a ROS bag (expected .bag, .db3, .mcap or a rosbag2 folder)")
    return [bag]


class _Bag:
    """An open bag: its topics' types, counts and frame ids, its tf tree, and its messages, deserialized, with
    reading errors naming the bag."""

    def __init__(self, path: Path):
        from rosbags.highlevel import AnyReader, AnyReaderError  # the ros2 extra
        from rosbags.rosbag1 import ReaderError as ReaderError1
        from rosbags.rosbag2 import ReaderError as ReaderError2
        from rosbags.typesys import Stores, get_typestore
        self.path = path
        self.errors = (AnyReaderError, ReaderError1, ReaderError2)
        try:  # a bag without message definitions (old rosbag2) is read with ROS 2's own
            self.reader = AnyReader(_bag_paths(path), default_typestore=get_typestore(Stores.LATEST))
            self.reader.open()
        except self.errors as e:
            raise InputError(f"{path}: not a readable ROS bag ({e}): truncated or damaged? (`rosbag reindex` or "
                             f"`ros2 bag reindex` repair an unfinished recording)") from None
        self.types = {name: info.msgtype for name, info in self.reader.topics.items()}
        self.counts = {name: info.msgcount for name, info in self.reader.topics.items()}
        self.start_ns = self.reader.start_time if self.reader.message_count else 0
        self.duration_s = self.reader.duration / 1e9 if self.reader.message_count else 0.0
        self._frame_ids: Dict[str, str] = {}
        self.tf = _Tf(path)
        for topic, _, msg in self.messages([t for t, typ in self.types.items() if typ in TF_TYPES]):
            self.tf.add(msg, static=topic == TF_STATIC)

    def close(self) -> None:
        self.reader.close()

    def messages(self, topics: Sequence[str], start_ns: Optional[int] = None, stop_ns: Optional[int] = None
                 ) -> Iterator[Tuple[str, int, object]]:
        """(topic, record time ns, message) of ``topics`` in record order, within [start_ns, stop_ns)."""
        connections = [c for c in self.reader.connections if c.topic in set(topics)]
        if not connections:
            return
        topic = None
        try:
            for c, t, raw in self.reader.messages(connections, start_ns, stop_ns):
                topic = c.topic
                yield topic, t, self.reader.deserialize(raw, c.msgtype)
        except self.errors as e:
            where = f" after a message of {topic}" if topic else ""
            raise InputError(f"{self.path}: unreadable{where} ({e}): truncated or damaged bag?") from None

    def frame_id(self, topic: str) -> str:
        """The header.frame_id of the topic's first message ('' when it has none)."""
        if topic not in self._frame_ids:
            msg = next((m for _, _, m in self.messages([topic])), None)
            self._frame_ids[topic] = _frame(msg.header.frame_id) if hasattr(msg, "header") else ""
        return self._frame_ids[topic]

    def of_type(self, *types: str) -> List[str]:
        return sorted(t for t, typ in self.types.items() if typ in types and self.counts[t])


@contextmanager
def _open(bag) -> Iterator[_Bag]:
    b = _Bag(Path(bag))
    try:
        yield b
    finally:
        b.close()


def _frame(name: str) -> str:
    return name.lstrip("/")  # ROS 1's tf allowed a leading slash


def _stamp_ns(msg) -> int:
    return int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)


def _pose_matrix(position, orientation) -> np.ndarray:
    q = [orientation.w, orientation.x, orientation.y, orientation.z]
    return make_pose(quat_to_rotmat(np.asarray(q, np.float64) / np.linalg.norm(q)),
                     [position.x, position.y, position.z])


class _Tf:
    """The tf tree of /tf_static and /tf: each child frame's parent and T_parent_child, fixed or timed."""

    def __init__(self, bag: Path):
        self.bag = bag
        self.static: Dict[str, Tuple[str, np.ndarray]] = {}
        self.timed: Dict[str, Tuple[str, Dict[int, np.ndarray]]] = {}
        self._tracks: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}  # a timed edge's (times, poses), once read

    def add(self, msg, static: bool) -> None:
        for tr in msg.transforms:
            parent, child = _frame(tr.header.frame_id), _frame(tr.child_frame_id)
            T = _pose_matrix(tr.transform.translation, tr.transform.rotation)
            if static:
                self.static[child] = (parent, T)
            else:
                self.timed.setdefault(child, (parent, {}))[1][ns_to_us(_stamp_ns(tr))] = T

    def frames(self) -> set:
        edges = [*self.static.items(), *self.timed.items()]
        return {f for child, (parent, _) in edges for f in (child, parent)}

    def _parent(self, frame: str) -> Optional[str]:
        edge = self.static.get(frame) or self.timed.get(frame)
        return None if edge is None else edge[0]

    def path(self, frame: str) -> List[str]:
        """The frame and its ancestors up to the tree's root."""
        out = [frame]
        while (p := self._parent(out[-1])) is not None and p not in out:
            out.append(p)
        return out

    def _edge(self, child: str, t_us: int) -> np.ndarray:
        if child in self.static:
            return self.static[child][1]
        if child not in self._tracks:
            track = self.timed[child][1]
            times = sorted(track)
            self._tracks[child] = np.array(times, np.int64), np.stack([track[t] for t in times])
        return interpolate_pose(*self._tracks[child], t_us)

    def _up(self, frame: str, ancestor: str, t_us: int) -> np.ndarray:
        T = np.eye(4)
        for f in self.path(frame)[:self.path(frame).index(ancestor)]:
            T = self._edge(f, t_us) @ T
        return T

    def lookup(self, target: str, source: str, t_us: int) -> np.ndarray:
        """T_target_source at ``t_us`` (timed edges interpolated, held beyond their ends)."""
        if target == source:
            return np.eye(4)
        up_s, up_t = self.path(source), self.path(target)
        common = next((f for f in up_s if f in up_t), None)
        if common is None:
            raise InputError(f"{self.bag}: tf: no chain from frame {source!r} to {target!r} in /tf_static and /tf "
                             f"({source!r} reaches {up_s[-1]!r}, {target!r} reaches {up_t[-1]!r}); record the "
                             f"missing transform or choose the base frame with --base-frame")
        return invert(self._up(target, common, t_us)) @ self._up(source, common, t_us)

    def timed_stamps(self, target: str, source: str) -> np.ndarray:
        """The stamps (us) of the timed edges between two frames (none: the chain is fixed)."""
        chain = set(self.path(source)) ^ set(self.path(target))
        return np.array(sorted({t for f in chain if f in self.timed for t in self.timed[f][1]}), np.int64)


# --------------------------------------------------------------------------- what to take

def _sensor(topic: str) -> str:
    """The topic's last namespace that is not its image or point cloud stream (/sensing/camera/front/image_raw/
    compressed -> front): the sensor it comes from."""
    p = [x for x in topic.split("/") if x and x != "compressed"]
    return (p[:-1] if len(p) > 1 and re.match(r"(image|point|cloud)", p[-1]) else p)[-1]


def _sensor_names(topics: Sequence[str]) -> Dict[str, str]:
    """{topic: a sensor name}: `_sensor`, the topic's whole path where two topics would share it."""
    names = {t: _sensor(t) if [_sensor(u) for u in topics].count(_sensor(t)) == 1 else
             "_".join(x for x in t.split("/") if x) for t in topics}
    return {t: check_name(re.sub(r"[^A-Za-z0-9_.-]", "_", n).lstrip(".-") or "sensor", f"sensor name of {t}")
            for t, n in names.items()}


def _stream(image: str) -> str:
    """An image topic without its image_transport suffix (a CompressedImage twin's /compressed)."""
    return image[:-len("/compressed")] if image.endswith("/compressed") else image


def _info_topic(image: str) -> str:
    """Where a camera driver publishes an image topic's CameraInfo: beside the image stream."""
    return f"{_stream(image).rsplit('/', 1)[0]}/camera_info"


def _select_cameras(bag: _Bag, opts: RosbagOptions, notes: List[str]) -> List[Tuple[str, str]]:
    """[(image topic, CameraInfo topic)]: the flags', else every image stream with a CameraInfo (an
    Image rather than its CompressedImage twin)."""
    images = bag.of_type(IMAGE, COMPRESSED_IMAGE)
    if opts.camera:
        out = []
        for spec in opts.camera:
            topic, _, info = spec.partition(":")
            if bag.types.get(topic) not in (IMAGE, COMPRESSED_IMAGE):
                raise InputError(f"{bag.path}: --camera {topic}: not an Image or CompressedImage topic of the bag "
                                 f"(its image topics: {images or 'none'})")
            info = info or _info_topic(topic)
            if bag.types.get(info) != INFO:
                raise InputError(f"{bag.path}: {topic}: a camera without a sensor_msgs/CameraInfo (no {info}); name "
                                 f"its topic with --camera {topic}:INFO_TOPIC")
            out.append((topic, info))
        return out
    streams = {}
    for topic in images:  # sorted: a raw stream comes before its /compressed twin
        streams.setdefault(_stream(topic), topic)
    missing = [t for t in streams.values() if bag.types.get(_info_topic(t)) != INFO]
    if missing and len(missing) == len(streams):
        raise InputError(f"{bag.path}: {missing[0]}: a camera without a sensor_msgs/CameraInfo (no "
                         f"{_info_topic(missing[0])}); name its topic with --camera {missing[0]}:INFO_TOPIC")
    if missing:
        notes.append(f"image topics left out, no CameraInfo beside them: {', '.join(missing)}")
    return [(t, _info_topic(t)) for t in streams.values() if t not in missing]


def _select_lidars(bag: _Bag, opts: RosbagOptions) -> List[str]:
    """The flags' PointCloud2 topics, else one per LiDAR: Autoware's /sensing/lidar/<name>/ ones (a concatenated
    cloud only alone), else every cloud; of one LiDAR's several clouds the raw one."""
    clouds = bag.of_type(CLOUD)
    if opts.lidar:
        for topic in opts.lidar:
            if bag.types.get(topic) != CLOUD:
                raise InputError(f"{bag.path}: --lidar {topic}: not a PointCloud2 topic of the bag (its "
                                 f"PointCloud2 topics: {clouds or 'none'})")
        return list(opts.lidar)
    sensing = [t for t in clouds if t.startswith("/sensing/lidar/")]
    if sensing:
        clouds = [t for t in sensing if "/concatenated/" not in t] or sensing
    best = {}
    for t in sorted(clouds, key=lambda t: ("raw" not in t.rsplit("/", 1)[-1], not t.endswith("_ex"), t)):
        best.setdefault(_sensor(t), t)
    return sorted(best.values())


def _select_pose(bag: _Bag, opts: RosbagOptions, base: Optional[str]) -> Optional[str]:
    """The flag's pose source, else the first found (see the module's docstring); None: LiDAR odometry."""
    poses = bag.of_type(*POSES)
    if opts.pose:
        if opts.pose.startswith("tf:"):
            bag.tf.lookup(opts.pose[3:], base or BASE_FRAMES[0], 0)  # raises naming the frames when unconnected
            return opts.pose
        if opts.pose not in poses:
            raise InputError(f"{bag.path}: --pose {opts.pose}: not an Odometry, PoseStamped or "
                             f"PoseWithCovarianceStamped topic of the bag (its pose topics: {poses or 'none'})")
        return opts.pose
    if AUTOWARE_POSE in poses and bag.types[AUTOWARE_POSE] == ODOMETRY:
        return AUTOWARE_POSE

    def tf_from(parent):
        return base is not None and parent in bag.tf.path(base)[1:] and len(bag.tf.timed_stamps(parent, base)) > 1
    if tf_from("map"):
        return "tf:map"
    odometry = bag.of_type(ODOMETRY)
    if odometry or poses:
        return (odometry or poses)[0]
    return "tf:odom" if tf_from("odom") else None


def _plan(bag: _Bag, opts: RosbagOptions) -> _Plan:
    """What to take from the bag; raises InputError naming the topic or frame that makes it impossible."""
    notes: List[str] = []
    cameras = _select_cameras(bag, opts, notes)
    lidars = _select_lidars(bag, opts)
    if not cameras and not lidars:
        raise InputError(f"{bag.path}: no sensor_msgs Image, CompressedImage or PointCloud2 topic with messages"
                         + ("" if any(bag.counts.values()) else " (the bag is empty)"))
    base = opts.base_frame or next((f for f in BASE_FRAMES if f in bag.tf.frames()), None)
    pose = _select_pose(bag, opts, base)
    if base is None and pose in bag.of_type(ODOMETRY):
        base = _frame(next(m for _, _, m in bag.messages([pose])).child_frame_id) or None
    if base is None:
        if not lidars:
            raise InputError(f"{bag.path}: no base frame (no base_link or base_footprint in /tf_static and /tf, no "
                             f"LiDAR to be the vehicle frame); choose one with --base-frame")
        base = bag.frame_id(lidars[0])
        notes.append(f"vehicle frame = the LiDAR frame {base!r} (no base_link or base_footprint in tf)")
    rectified = set(opts.rectified)
    if rectified - {t for t, _ in cameras}:
        raise InputError(f"{bag.path}: --rectified {sorted(rectified - {t for t, _ in cameras})[0]}: not one of the "
                         f"cameras taken ({[t for t, _ in cameras] or 'none'})")
    names = _sensor_names([t for t, _ in cameras])
    return _Plan([_Camera(names[t], t, info, t in rectified or re.search(r"/image_rect[^/]*(/compressed)?$", t)
                          is not None) for t, info in cameras],
                 {n: t for t, n in _sensor_names(lidars).items()}, pose, base, notes)


# --------------------------------------------------------------------------- sensors

def _info_field(info, name: str) -> np.ndarray:
    """A CameraInfo matrix by its ROS 2 name (ROS 1 spells D, K, R, P in capitals)."""
    return np.asarray(getattr(info, name) if hasattr(info, name) else getattr(info, name.upper()), np.float64)


def _camera_model(info, rectified: bool, where: str) -> Tuple[Camera, np.ndarray]:
    """(gsim camera, T_optical_camera: the camera's frame in the optical frame of the images' header.frame_id)."""
    w, h = int(info.width), int(info.height)
    K, D, R, P = (_info_field(info, k) for k in "kdrp")
    if w <= 0 or h <= 0 or K[0] <= 0 or K[4] <= 0 or K[1] != 0:
        raise InputError(f"{where}: not a calibrated camera (width {w}, height {h}, K {K.tolist()}; expected "
                         f"K = [fx, 0, cx, 0, fy, cy, 0, 0, 1] with fx, fy > 0)")
    if max(info.binning_x, info.binning_y) > 1 or (info.roi.width, info.roi.height) not in ((0, 0), (w, h)):
        raise InputError(f"{where}: binning or a region of interest; gsim takes full calibrated images only")
    if rectified:
        camera, T_cam_rect = rectified_camera(P.reshape(3, 4), w, h, f"{where}: P")
        rect = nearest_rotation(R.reshape(3, 3)) if R.any() else np.eye(3)  # drivers leave R zero when unused
        return camera, T_cam_rect @ make_pose(rect, np.zeros(3))
    model, d = info.distortion_model, [*D.tolist(), *[0.0] * 8]
    if model == "equidistant":
        dist = {"fisheye": True, "k1": d[0], "k2": d[1], "k3": d[2], "k4": d[3]}
    elif model in ("plumb_bob", "rational_polynomial") or not any(d):
        if any(d[5:8]):
            raise InputError(f"{where}: distortion_model {model} with k4..k6 = {d[5:8]}: gsim has no rational "
                             f"model (its cameras: pinhole, OpenCV k1 k2 p1 p2 k3, fisheye k1..k4) and does not "
                             f"approximate one; convert the rectified images (image_rect, with P) instead")
        dist = {"k1": d[0], "k2": d[1], "p1": d[2], "p2": d[3], "k3": d[4]}
    else:
        raise InputError(f"{where}: distortion_model {model!r} not supported (plumb_bob, equidistant, "
                         f"rational_polynomial with k4..k6 = 0, or a rectified image's P with --rectified)")
    shift = OPENCV_PIXEL_CENTRE_SHIFT
    return camera_from_params(where, w, h, K[0], K[4], K[2] + shift, K[5] + shift, **dist), np.eye(4)


def _check_encoding(msg, typ: str, where: str) -> None:
    """Raise for an Image encoding or a CompressedImage format gsim cannot read."""
    if typ == IMAGE:
        if msg.encoding not in CHANNELS and msg.encoding not in BAYER:
            raise InputError(f"{where}: image encoding {msg.encoding!r} not supported "
                             f"({', '.join([*CHANNELS, *BAYER])})")
        return
    words = re.findall(r"[a-z]+", msg.format.lower())
    if "compresseddepth" in words or not {"jpeg", "jpg", "png"} & set(words):
        raise InputError(f"{where}: compressed image format {msg.format!r} not supported (JPEG or PNG)")


def _image_rgb(msg, where: str) -> np.ndarray:
    """(H,W,3) uint8 RGB of a raw sensor_msgs/Image (rows ``step`` bytes apart)."""
    enc, h, w, step = msg.encoding, int(msg.height), int(msg.width), int(msg.step)
    ch = CHANNELS.get(enc, 1)
    data = np.asarray(msg.data, np.uint8)
    if step < w * ch or data.size < step * h:
        raise InputError(f"{where}: {data.size} bytes of data for a {w}x{h} {enc} image with rows of {step} bytes")
    a = data[:step * h].reshape(h, step)[:, :w * ch].reshape(h, w, ch)
    if enc in BAYER:
        import cv2  # the ros2 extra
        # cv_bridge's pairing: OpenCV names a Bayer pattern by its second row's second and third pixels
        code = {"bayer_rggb8": "BG", "bayer_bggr8": "RG", "bayer_gbrg8": "GR", "bayer_grbg8": "GB"}[enc]
        return cv2.cvtColor(np.ascontiguousarray(a[..., 0]), getattr(cv2, f"COLOR_Bayer{code}2RGB"))
    return {"rgb8": a, "bgr8": a[..., ::-1], "rgba8": a[..., :3], "bgra8": a[..., 2::-1],
            "mono8": np.repeat(a, 3, axis=2)}[enc]


def _encoded_image(msg, camera: Camera, tmp: Path, where: str) -> Path:
    """A CompressedImage's bytes in a file of ``tmp``, checked to be a JPEG or PNG of the camera's size."""
    from PIL import Image, UnidentifiedImageError
    data = bytes(msg.data)
    try:
        with Image.open(io.BytesIO(data)) as im:
            size, kind = im.size, im.format
    except (UnidentifiedImageError, OSError) as e:
        raise InputError(f"{where}: not a readable image ({e})") from None
    if kind not in COMPRESSED:
        raise InputError(f"{where}: a {kind} image; gsim takes JPEG or PNG")
    if size != (camera.width, camera.height):
        raise InputError(f"{where}: image is {size[0]}x{size[1]}, its CameraInfo says {camera.width}x{camera.height}")
    path = tmp / f"image{COMPRESSED[kind]}"
    path.write_bytes(data)
    return path


def _columns(msg, where: str) -> Dict[str, np.ndarray]:
    """{field: (N,) values} of the PointCloud2 fields gsim reads (x, y, z and those of `INTENSITY_FIELDS`,
    `TIME_FIELDS`, `RING_FIELDS` present), points in row order."""
    fields = {f.name: f for f in msg.fields}
    if not {"x", "y", "z"} <= set(fields):
        raise InputError(f"{where}: a PointCloud2 without x, y and z fields (its fields: {sorted(fields)})")
    names = [n for n in ("x", "y", "z", *INTENSITY_FIELDS, *TIME_FIELDS, *RING_FIELDS) if n in fields]
    order, step = ">" if msg.is_bigendian else "<", int(msg.point_step)
    formats = []
    for n in names:
        f = fields[n]
        if f.datatype not in POINT_TYPES or f.offset + np.dtype(POINT_TYPES[f.datatype]).itemsize > step:
            raise InputError(f"{where}: field {n}: datatype {f.datatype} at offset {f.offset} does not fit a point "
                             f"of {step} bytes")
        formats.append(order + POINT_TYPES[f.datatype])
    dtype = np.dtype({"names": names, "formats": formats, "offsets": [fields[n].offset for n in names],
                      "itemsize": step})
    h, w, row = int(msg.height), int(msg.width), int(msg.row_step)
    data = np.asarray(msg.data, np.uint8)
    if row < w * step or data.size < row * h:
        raise InputError(f"{where}: {data.size} bytes of data for {h} rows of {w} points of {step} bytes "
                         f"(row_step {row})")
    points = np.ascontiguousarray(data[:row * h].reshape(h, row)[:, :w * step]).view(dtype).reshape(-1)
    return {n: points[n] for n in names}


def _offsets_us(v: np.ndarray, stamp_ns: int, where: str) -> np.ndarray:
    """Per-point times -> int64 microseconds from the stamp: floats are seconds, integers nanoseconds, each
    absolute (since 1970) beyond `ABSOLUTE_S` / `ABSOLUTE_NS`, else relative to the stamp; floats beyond
    `ABSOLUTE_NS` are absolute nanoseconds (Livox's)."""
    if not v.size:
        return np.zeros(0, np.int64)
    if v.dtype.kind == "f":
        v = v.astype(np.float64)
        scale = np.median(np.abs(v))
        off = ((v - stamp_ns) / 1e3 if scale > ABSOLUTE_NS else
               (v - stamp_ns / 1e9) * 1e6 if scale > ABSOLUTE_S else v * 1e6)
        off = np.floor(off + 0.5).astype(np.int64)  # halves up, as ns_to_us
    else:
        v = v.astype(np.int64)
        off = ns_to_us(v - stamp_ns if v.max() > ABSOLUTE_NS else v)
    if np.abs(off).max() > MAX_OFFSET_US:
        raise InputError(f"{where}: per-point times up to {np.abs(off).max() / 1e6:.3g} s from the message's stamp; "
                         f"gsim reads float times as seconds and integer ones as nanoseconds, relative to the stamp "
                         f"or since 1970")
    return off


def _beams(xyz: np.ndarray, ring: np.ndarray) -> Optional[LidarBeams]:
    """A spinning LiDAR's beam table from one sweep's points (N,3) and their rings: each ring's median elevation
    over its returns beyond `BEAM_FROM_M` where it has `BEAM_MIN_POINTS` of them (a near return carries its laser's
    offset from the sensor's origin: KITTI's top lasers read 3.6-5.6 degrees over all their returns, 2.1-2.2 beyond
    10 m, against a nominal 2), else over all; the median azimuth step between a ring's neighbouring points; the
    nearest and farthest return."""
    elevation = np.degrees(np.arctan2(xyz[:, 2], np.hypot(xyz[:, 0], xyz[:, 1])))
    azimuth = np.degrees(np.arctan2(xyz[:, 1], xyz[:, 0]))
    reach = np.linalg.norm(xyz, axis=1)
    rings = np.unique(ring)
    steps = [np.median(np.diff(np.sort(azimuth[ring == r]))) for r in rings if np.sum(ring == r) > 1]
    step = float(np.median(steps)) if steps else 0.0
    if step <= 0 or not reach.size or reach.max() <= reach.min():
        return None
    table = []
    for r in rings:
        on, far = ring == r, (ring == r) & (reach > BEAM_FROM_M)
        table.append(float(np.median(elevation[far if far.sum() >= BEAM_MIN_POINTS else on])))
    return LidarBeams(tuple(table), step, float(reach.min()), float(reach.max()))


class _Cloud:
    """A LiDAR topic's PointCloud2 messages -> (N,4) or (N,5) float32 sweeps (x, y, z, intensity[, time offset
    us]) in its frame; the first sweep fixes the intensity scale and the beam table (`notes` say how)."""

    def __init__(self, topic: str, where: str):
        self.topic, self.where = topic, where
        self.scale: Optional[float] = None
        self.beams: Optional[LidarBeams] = None
        self.notes: List[str] = []

    def __call__(self, msg) -> np.ndarray:
        cols = _columns(msg, self.where)
        xyz = np.stack([cols["x"], cols["y"], cols["z"]], 1).astype(np.float64)
        keep = np.all(np.isfinite(xyz), 1) & np.any(xyz != 0, 1)
        xyz = xyz[keep]
        first = self.scale is None
        name = next((n for n in INTENSITY_FIELDS if n in cols), None)
        if name is None:
            self.scale, intensity = 1.0, np.zeros(len(xyz))
        else:
            v = cols[name][keep].astype(np.float64)
            if first:
                kind = cols[name].dtype
                top = v.max(initial=0)
                self.scale = (float(np.iinfo(kind).max) if kind.kind in "iu" else
                              1.0 if top <= 1 else 255.0 if top <= 255 else 65535.0)
            intensity = np.clip(v / self.scale, 0, 1)
        columns = [xyz, intensity[:, None]]
        time = next((n for n in TIME_FIELDS if n in cols), None)
        if time is not None:
            columns.append(_offsets_us(cols[time][keep], _stamp_ns(msg), f"{self.where}: field {time}")[:, None])
        if first:
            ring = next((n for n in RING_FIELDS if n in cols), None)
            self.beams = None if ring is None else _beams(xyz, cols[ring][keep])
            self.notes.append(
                f"LiDAR {self.topic}: intensity " + ("absent (0)" if name is None else f"from field {name!r}" + (
                    f" / {self.scale:g}" if self.scale != 1 else "")) + "; per-point time " +
                ("absent (no de-skew)" if time is None else f"from field {time!r} (floats s, integers ns; relative to "
                 f"the stamp, or since 1970 when large)") + "; beams " +
                ("unknown" if self.beams is None else f"from field {ring!r}: {len(self.beams.elevations_deg)} rings' "
                 f"median elevations in the first sweep, azimuth step {self.beams.azimuth_resolution_deg:.3f} deg, "
                 f"range {self.beams.min_range_m:.1f}-{self.beams.max_range_m:.1f} m") +
                "; points not finite or at the origin dropped")
        return np.concatenate(columns, 1).astype(np.float32)


# --------------------------------------------------------------------------- frames and poses

def _index(bag: _Bag, plan: _Plan, window: Tuple[Optional[int], Optional[int]], progress: bool
           ) -> Dict[str, np.ndarray]:
    """{sensor topic: header stamps (us) of its messages in the window, in record order}; image encodings checked."""
    from tqdm import tqdm
    stamps: Dict[str, list] = {t: [] for t in plan.sensors}
    for topic, _, msg in tqdm(bag.messages(plan.sensors, *window), desc="rosbag: index",
                              total=sum(bag.counts[t] for t in plan.sensors), unit="msg", disable=not progress):
        if bag.types[topic] != CLOUD:
            _check_encoding(msg, bag.types[topic], f"{bag.path}: {topic}")
        stamps[topic].append(ns_to_us(_stamp_ns(msg)))
    for topic, s in stamps.items():
        if not s:
            raise InputError(f"{bag.path}: {topic}: no messages between --start and --end")
    return {t: np.array(s, np.int64) for t, s in stamps.items()}


def _match(bag: _Bag, plan: _Plan, stamps: Dict[str, np.ndarray], opts: RosbagOptions
           ) -> Tuple[np.ndarray, Dict[str, np.ndarray], List[str]]:
    """(frame times (F,) us, {sensor topic: (F,) index of its message in each frame}, notes): one frame per
    message of the reference (the first LiDAR, else the first camera; the first of each 1/rate s with --rate), with
    each other topic's message nearest in stamp."""
    ref = plan.sensors[0]
    t = stamps[ref]
    order = np.argsort(t, kind="stable")
    keep = np.r_[True, np.diff(t[order]) > 0]  # one frame per stamp
    if opts.rate:  # greedily, each at least 1/rate after the last kept less half the reference's period (jitter)
        steps = np.diff(t[order[keep]])
        gap = 1e6 / opts.rate - (np.median(steps) / 2 if len(steps) else 0)
        last = None
        for i, ti in enumerate(t[order]):
            keep[i] &= last is None or ti - last >= gap
            last = ti if keep[i] else last
    picks = {ref: order[keep]}
    frames = t[picks[ref]]
    tolerance = opts.tolerance_ms * 1000
    ok = np.ones(len(frames), bool)
    notes = [f"frames: one per message of {ref}" + (f" (at most {opts.rate:g} Hz)" if opts.rate else "") +
             f", with each other sensor's message nearest in stamp within {opts.tolerance_ms:g} ms"]
    for topic in plan.sensors[1:]:
        o = np.argsort(stamps[topic], kind="stable")
        s = stamps[topic][o]
        k = np.searchsorted(s, frames)
        lo, hi = np.clip(k - 1, 0, len(s) - 1), np.clip(k, 0, len(s) - 1)
        j = np.where(np.abs(s[lo] - frames) <= np.abs(s[hi] - frames), lo, hi)
        gap = np.abs(s[j] - frames)
        miss = gap > tolerance
        worst = int(np.argmax(gap))
        said = (f"{miss.sum()} of the {len(frames)} frames have no message of {topic} within {opts.tolerance_ms:g} ms "
                f"(the largest gap {gap[worst] / 1000:.1f} ms, at stamp {frames[worst] / 1e6:.3f} s)")
        if miss.sum() > MAX_UNMATCHED * len(frames):
            raise InputError(f"{bag.path}: {topic}: {said}; widen --tolerance-ms or leave the topic out")
        if miss.any():
            notes.append(f"frames left out: {said}")
        ok &= ~miss
        picks[topic] = o[j]
    return frames[ok], {topic: p[ok] for topic, p in picks.items()}, notes


def _pose_track(bag: _Bag, plan: _Plan) -> Tuple[np.ndarray, np.ndarray, str]:
    """(times (P,) us, T_source_vehicle (P,4,4), what they are) of the plan's pose source, over the whole bag."""
    if plan.pose.startswith("tf:"):
        parent = plan.pose[3:]
        times = bag.tf.timed_stamps(parent, plan.base)
        if not len(times):
            raise InputError(f"{bag.path}: {plan.pose}: the chain from {parent!r} to {plan.base!r} has no /tf "
                             f"transform, only /tf_static ones: no motion")
        poses = [bag.tf.lookup(parent, plan.base, t) for t in times]
        what = f"tf from {parent!r} to {plan.base!r} at the stamps of its /tf transforms"
    else:
        track = {}
        for _, _, m in bag.messages([plan.pose]):
            pose = m.pose.pose if hasattr(m.pose, "pose") else m.pose  # Odometry, ...WithCovariance: a pose in pose
            child = _frame(getattr(m, "child_frame_id", "")) or plan.base
            t = ns_to_us(_stamp_ns(m))
            track.setdefault(t, _pose_matrix(pose.position, pose.orientation) @ bag.tf.lookup(child, plan.base, t))
        times = np.array(sorted(track), np.int64)
        poses = [track[t] for t in times]
        what = f"{plan.pose} ({bag.types[plan.pose]}) in frame {bag.frame_id(plan.pose)!r}, of {plan.base!r}"
    return times, np.stack(poses), what


def _covered(bag: _Bag, times: np.ndarray, frames: np.ndarray, picks: Dict[str, np.ndarray],
             stamps: Dict[str, np.ndarray], source: str) -> Tuple[np.ndarray, List[str]]:
    """(which frames have every sensor stamp within the poses' times, notes)."""
    lo = np.min([stamps[t][p] for t, p in picks.items()], 0)
    hi = np.max([stamps[t][p] for t, p in picks.items()], 0)
    ok = (lo >= times[0]) & (hi <= times[-1])
    if not ok.any():
        raise InputError(f"{bag.path}: {source}: poses from stamp {times[0] / 1e6:.3f} to {times[-1] / 1e6:.3f} s "
                         f"cover no frame (sensor stamps {lo.min() / 1e6:.3f} to {hi.max() / 1e6:.3f} s)")
    return ok, ([] if ok.all() else [f"frames left out: {np.sum(~ok)} of {len(ok)} outside the poses of {source} "
                                     f"(stamps {times[0] / 1e6:.3f} to {times[-1] / 1e6:.3f} s)"])


# --------------------------------------------------------------------------- conversion

class _Conversion:
    """A bag's conversion, everything checked before the log is written: the plan, the frames' messages, the
    sensors' models and extrinsics, the ego poses (or the odometry that will make them)."""

    def __init__(self, bag: _Bag, opts: RosbagOptions, progress: bool):
        self.bag, self.progress = bag, progress
        self.plan = plan = _plan(bag, opts)
        self.window = (None if opts.start is None else bag.start_ns + round(opts.start * 1e9),
                       None if opts.end is None else bag.start_ns + round(opts.end * 1e9))
        self.stamps = _index(bag, plan, self.window, progress)
        self.frames, self.picks, self.notes = _match(bag, plan, self.stamps, opts)
        self.odometry = None
        if plan.pose is None:
            self._check_odometry()
            self.odometry = LidarOdometry(f"{bag.path} has no pose source")
        else:
            times, poses, what = _pose_track(bag, plan)
            ok, left = _covered(bag, times, self.frames, self.picks, self.stamps, plan.pose)
            self.frames, self.picks = self.frames[ok], {t: p[ok] for t, p in self.picks.items()}
            lo = max(int(np.searchsorted(times, self.frames[0] - opts.tolerance_ms * 1000, "right")) - 1, 0)
            hi = int(np.searchsorted(times, self.frames[-1] + opts.tolerance_ms * 1000)) + 1
            self.ego_times, self.ego = times[lo:hi], poses[lo:hi].copy()
            origin = self.ego[0, :3, 3].copy()
            self.ego[:, :3, 3] -= origin  # map frames are often UTM: far out for float32 rendering
            self.notes += left + [f"ego poses: {what}; world = that frame moved by {(-origin).round(3).tolist()} m "
                                  f"(the first pose at the origin)"]
        t0 = int(self.frames[0])
        self.T_vehicle = {}
        for topic in plan.sensors:
            frame = bag.frame_id(topic)
            if not frame:
                raise InputError(f"{bag.path}: {topic}: header.frame_id is empty; gsim cannot place the sensor")
            self.T_vehicle[topic] = bag.tf.lookup(plan.base, frame, t0)
        self.cameras = {}
        for c in plan.cameras:
            where = f"{bag.path}: {c.info}"
            info = next(m for _, _, m in bag.messages([c.info]))
            camera, T_optical_camera = _camera_model(info, c.rectified, where)
            self.cameras[c.topic] = (camera, self.T_vehicle[c.topic] @ invert(T_optical_camera))
            self.notes.append(f"camera {c.name}: {c.topic} with {c.info} ({info.distortion_model or 'no model'}"
                              + (", rectified: the pinhole of P" if c.rectified else "")
                              + f" -> gsim {camera.model}), frame {bag.frame_id(c.topic)!r}")
        self.notes += plan.notes

    def _check_odometry(self) -> None:
        bag, plan = self.bag, self.plan
        why = (f"{bag.path}: no pose source (no Odometry, PoseStamped or PoseWithCovarianceStamped topic, no /tf from "
               f"map or odom to {plan.base!r})")
        if not plan.lidars:
            raise InputError(f"{why} and no LiDAR for odometry; name one with --pose")
        if len(self.frames) < MIN_ODOMETRY_SWEEPS:
            raise InputError(f"{why} and {len(self.frames)} sweep(s) of {plan.sensors[0]}: LiDAR odometry needs at "
                             f"least {MIN_ODOMETRY_SWEEPS}; name a pose source with --pose")

    def write(self, out) -> Path:
        from tqdm import tqdm
        bag, plan = self.bag, self.plan
        names = {**{t: n for n, t in plan.lidars.items()}, **{c.topic: c.name for c in plan.cameras}}
        clouds = {t: _Cloud(t, f"{bag.path}: {t}") for t in plan.lidars.values()}
        wanted: Dict[Tuple[str, int], List[int]] = {}
        for topic, picks in self.picks.items():
            for f, i in enumerate(picks):
                wanted.setdefault((topic, int(i)), []).append(f)
        entries = [({}, {}) for _ in self.frames]  # per frame: camera entries, LiDAR entries
        counts = dict.fromkeys(plan.sensors, 0)
        raw_odometry = {}
        with LogWriter(out, name=bag.path.stem, source="rosbag") as w, \
                tempfile.TemporaryDirectory() as tmp:
            for topic, (camera, T) in self.cameras.items():
                w.add_camera(names[topic], camera, T)
            stream = bag.messages(plan.sensors, *self.window)
            for topic, _, msg in tqdm(stream, desc="rosbag", total=sum(len(s) for s in self.stamps.values()),
                                      unit="msg", disable=not self.progress):
                i, counts[topic] = counts[topic], counts[topic] + 1
                t = ns_to_us(_stamp_ns(msg))
                for f in wanted.get((topic, i), ()):
                    if topic not in clouds:
                        entries[f][0][names[topic]] = self._image(w, names[topic], f, t, topic, msg, Path(tmp))
                        continue
                    points = clouds[topic](msg)
                    entries[f][1][names[topic]] = w.sweep(names[topic], f, t, points)
                    if self.odometry is not None and topic == plan.sensors[0]:
                        raw_odometry[f] = self.odometry(points[:, :3])
            for topic, cloud in clouds.items():
                w.add_lidar(names[topic], self.T_vehicle[topic], cloud.beams)
                self.notes += cloud.notes
            for t, (cams, lids) in zip(self.frames, entries):
                w.add_frame(int(t), cameras=cams, lidars=lids)
            if self.odometry is not None:
                self._odometry_poses(np.stack([raw_odometry[f] for f in range(len(self.frames))]))
            for t, T in zip(self.ego_times, self.ego):
                w.add_ego_pose(int(t), T)
            w.notes.extend(self.notes)
        return Path(out)

    def _image(self, w: LogWriter, name: str, index: int, t_us: int, topic: str, msg, tmp: Path) -> dict:
        """Store an Image (as PNG) or a CompressedImage (as recorded); returns its frame entry."""
        where, camera = f"{self.bag.path}: {topic}", self.cameras[topic][0]
        if self.bag.types[topic] != IMAGE:
            return w.image(name, index, t_us, src=_encoded_image(msg, camera, tmp, where))
        rgb = _image_rgb(msg, where)
        if rgb.shape[:2] != (camera.height, camera.width):
            raise InputError(f"{where}: image is {rgb.shape[1]}x{rgb.shape[0]}, its CameraInfo says "
                             f"{camera.width}x{camera.height}")
        return w.image(name, index, t_us, rgb=rgb)

    def _odometry_poses(self, T_world_lidar: np.ndarray) -> None:
        """Ego poses from the reference LiDAR's odometry (world = its first sweep's frame) smoothed as KITTI's, in
        the world of the first vehicle frame."""
        smoothed, note = smoothed_odometry(self.frames, T_world_lidar)
        T_vl = self.T_vehicle[self.plan.sensors[0]]
        self.ego_times, self.ego = self.frames, T_vl @ smoothed @ invert(T_vl)
        self.notes += [f"ego poses are kiss-icp LiDAR odometry estimates of {self.plan.sensors[0]} (the bag has no "
                       f"pose source), not ground truth; world = the first frame's vehicle frame (before smoothing)", note]


def describe_bag(bag, options: Optional[RosbagOptions] = None) -> str:
    """What `gsim convert rosbag BAG --list` prints: every topic (type, messages, mean rate over the bag, frame id),
    then what gsim would take with ``options`` (or why it cannot)."""
    opts = options or RosbagOptions()
    with _open(bag) as b:
        rows = [("topic", "type", "messages", "mean Hz", "frame")]
        for t in sorted(b.types):
            rate = f"{b.counts[t] / b.duration_s:.1f}" if b.duration_s else "-"
            rows.append((t, b.types[t] or "(several types)", str(b.counts[t]), rate,
                         b.frame_id(t) if b.counts[t] and b.types[t] else ""))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [f"{b.path}: {len(b.types)} topics, {sum(b.counts.values())} messages over {b.duration_s:.1f} s"]
        lines += ["  " + "  ".join(x.ljust(n) for x, n in zip(r, widths)) + "  " + r[4] for r in rows]
        try:
            plan = _plan(b, opts)
        except InputError as e:
            return "\n".join(lines + [f"gsim cannot convert it as it is: {e}"])
        lines.append("gsim would take:")
        lines += [f"  camera {c.name}: {c.topic} with {c.info}" + (" (rectified: P)" if c.rectified else "")
                  for c in plan.cameras]
        lines += [f"  lidar {n}: {t}" for n, t in plan.lidars.items()]
        lines.append(f"  frames: one per message of {plan.sensors[0]}")
        lines.append(f"  poses: {plan.pose or 'none in the bag: LiDAR odometry'}; vehicle frame {plan.base!r}")
        lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)


def convert_rosbag(bag, out=None, progress: bool = True, **options) -> Union[Path, List[Path]]:
    """Convert a ROS bag (see the module's docstring) to a gsim log at ``out``; returns ``out``.

    ``options``: `RosbagOptions`' fields (None keeps the default), as `gsim convert rosbag`'s flags. With
    ``list_topics`` it prints `describe_bag` instead, writes nothing and returns []. Raises InputError naming the
    bag and the topic or frame for what gsim cannot take; nothing is left at ``out`` then."""
    try:
        opts = RosbagOptions(**{k: v for k, v in options.items() if v is not None})
    except TypeError as e:
        raise InputError(f"convert_rosbag: {e}") from None
    if opts.start is not None and opts.end is not None and opts.end <= opts.start:
        raise InputError(f"--end {opts.end:g} s must be after --start {opts.start:g} s")
    if opts.list_topics:
        print(describe_bag(bag, opts))
        return []
    if out is None:
        raise InputError("gsim convert rosbag: OUT, the log folder to write, is missing (only --list needs none)")
    with _open(bag) as b:
        return _Conversion(b, opts, progress).write(out)


# gsim convert's subcommand for this format: its help line, what SRC and OUT are (OUT optional: --list), its options
HELP = "a ROS bag (rosbag1 .bag, rosbag2 .db3 / .mcap or its folder): cameras, LiDARs, tf and poses"
SRC = "the bag: a .bag, .db3 or .mcap file, a rosbag2 folder (metadata.yaml) or a folder of split .bag files"
OUT = "the log folder to write (not with --list)"
OUT_NARGS = "?"


def add_options(parser) -> None:
    from gsim.cli_args import finite_float
    parser.add_argument("--list", dest="list_topics", action="store_true",
                        help="print the bag's topics (type, count, rate, frame) and what gsim would take; write "
                             "nothing")
    parser.add_argument("--camera", action="append", metavar="TOPIC[:INFO_TOPIC]",
                        help="an image topic to take (repeat for several), with its CameraInfo topic when that is not "
                             "beside it (default: every image topic with a camera_info beside it)")
    parser.add_argument("--lidar", action="append", metavar="TOPIC",
                        help="a PointCloud2 topic to take (repeat for several; the first makes the frames; default: "
                             "one per LiDAR, Autoware's /sensing/lidar/* first)")
    parser.add_argument("--rectified", action="append", metavar="TOPIC",
                        help="an image topic whose images are rectified: its CameraInfo's P is its camera "
                             "(image_rect* topics are taken so)")
    parser.add_argument("--pose", metavar="TOPIC|tf:PARENT",
                        help="the vehicle's pose: an Odometry, PoseStamped or PoseWithCovarianceStamped topic, or tf "
                             "from PARENT (e.g. tf:map) to the base frame (default: found; none: LiDAR odometry)")
    parser.add_argument("--base-frame", default=None,
                        help="the vehicle's frame in tf (default: base_link, base_footprint, the pose's child frame, "
                             "else the first LiDAR's frame)")
    parser.add_argument("--rate", type=finite_float(0, low_open=True), default=None,
                        help="at most this many frames a second (Hz; default: every sweep)")
    parser.add_argument("--start", type=finite_float(0), default=None, help="seconds from the bag's start")
    parser.add_argument("--end", type=finite_float(0), default=None, help="seconds from the bag's start")
    parser.add_argument("--tolerance-ms", type=finite_float(0), default=DEFAULT_TOLERANCE_MS,
                        help="how far in stamp a camera image (or another LiDAR's sweep) may be from the frame's "
                             "sweep (ms)")
