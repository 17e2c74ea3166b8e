"""The canonical gsim driving log: a directory with a JSON manifest and sensor files.

    log.json                      manifest (format "gsim-log", schema_version 2; version 1 logs load too)
    cameras/<name>/<n>.png|jpg    images (RGB, 8 bit)
    depth/<name>/<n>.npy          optional ground-truth depth, float32 (H,W) camera z in metres, 0 = none
    lidars/<name>/<n>.npy         sweeps, float32 (N,4) x,y,z,intensity in the sensor frame, or (N,5)
                                  with a per-point time offset in microseconds from the sweep's timestamp;
                                  intensity in [0, 1] (converters scale the dataset's own range, and say so)
    lidars/<name>/<n>_second.npy  optional second (weaker, farther) returns of the same sweep, same layout

Manifest fields::

    {"format": "gsim-log", "schema_version": 2, "name": str, "source": str, "notes": [str],
     "sensors": {"cameras": {NAME: {<camera model dict>, "T_vehicle_camera": 4x4, "readout_us": int (2, optional)}},
                 "lidars": {NAME: {"T_vehicle_lidar": 4x4, "beams": null | {"elevations_deg": [...],
                           "azimuth_resolution_deg": f, "min_range_m": f, "max_range_m": f}}}},
     "ego_poses": [{"timestamp_us": int, "T_world_vehicle": 4x4}, ...],
     "frames": [{"timestamp_us": int,
                 "cameras": {NAME: {"timestamp_us": int, "image": path, "depth": path (optional)}},
                 "lidars": {NAME: {"timestamp_us": int, "points": path, "second_returns": path (2, optional)}}},
                ...],
     "actors": [{"id": str, "category": str, "size": [l, w, h], "metadata": {str: str|number|bool} (2, optional),
                 "track": [{"timestamp_us": int, "T_world_actor": 4x4}, ...]}]}

Fields marked (2) are new in schema version 2. ``readout_us``: a rolling shutter whose rows are exposed from
the image's ``timestamp_us`` (row 0, the top) to ``timestamp_us + readout_us`` (the last row), as
`gsim.render_camera` takes it; 0 or absent is a global shutter. ``metadata``: what the dataset said of an actor
that gsim does not use (its own id and class, attributes). ``category``: one of `ACTOR_CATEGORIES` where the
converter can map the dataset's class (its own class kept in ``metadata["class"]``).

Frames: vehicle x forward, y left, z up; cameras OpenCV; world z up; T_dst_src; times in
integer microseconds. Sensor poses come from the ego pose interpolated at the sensor's
timestamp composed with its extrinsic. Paths are relative and stay inside the log.
`load_log` checks the manifest; `validate_log` also opens every file.

Written by: `gsim synth` (`gsim.scenes.synth`) and the converters, `gsim convert FORMAT` (one module each, its
docstring the dataset's conventions): kitti-raw (`kitti_raw`), kitti-tracking (`kitti_tracking`), waymo (`waymo`),
nuscenes and Lyft (`nuscenes`), av2 (`av2`), dgp (`dgp`), nerfstudio (`nerfstudio`), ROS bags (`rosbag`); and by
simulation: scenario renders (`gsim.editing.outputs`) and closed-loop runs (`gsim.bridges.recording.record`).
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from gsim.cameras import Camera, camera_from_dict
from gsim.errors import InputError, check_name
from gsim.io import atomic_directory, read_manifest, write_json
from gsim.transforms import check_pose, interpolate_pose

FORMAT = "gsim-log"
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1 has no readout_us, second_returns or actor metadata
MANIFEST = "log.json"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
# zlib level of the PNGs a writer encodes: 1 takes a third of the time of PIL's default 6 for about a quarter more
# bytes (a 320x200 render: 4.9 against 14.4 ms), and simulators write a log every step (the closed loop, scenarios)
PNG_LEVEL = 1
# the actor classes gsim's parts know (the asset library, the loop's traffic, the scenario outputs' labels)
ACTOR_CATEGORIES = ("car", "truck", "bus", "pedestrian", "cyclist", "motorcycle", "cone", "barrier", "sign", "other")


class LogFormatError(InputError):
    """A driving log that cannot be read; the message names the file and the field."""


@dataclass(frozen=True)
class LidarBeams:
    """A spinning LiDAR's beam model (where known): one elevation per beam, degrees up from the xy plane."""

    elevations_deg: Tuple[float, ...]
    azimuth_resolution_deg: float
    min_range_m: float
    max_range_m: float

    def to_dict(self) -> dict:
        return {"elevations_deg": list(self.elevations_deg), "azimuth_resolution_deg": self.azimuth_resolution_deg,
                "min_range_m": self.min_range_m, "max_range_m": self.max_range_m}


@dataclass(frozen=True, eq=False)
class CameraSensor:
    name: str
    camera: Camera
    T_vehicle_camera: np.ndarray
    readout_us: int = 0  # rolling shutter: the last row is exposed this long after the first (0: global shutter)


@dataclass(frozen=True, eq=False)
class LidarSensor:
    name: str
    T_vehicle_lidar: np.ndarray
    beams: Optional[LidarBeams] = None


@dataclass(frozen=True)
class CameraObs:
    sensor: str
    timestamp_us: int
    image: str  # path relative to the log root
    depth: Optional[str] = None


@dataclass(frozen=True)
class LidarObs:
    sensor: str
    timestamp_us: int
    points: str
    second_returns: Optional[str] = None  # a sweep of the same layout holding each beam's second return


@dataclass(frozen=True)
class Frame:
    index: int
    timestamp_us: int
    cameras: Dict[str, CameraObs]
    lidars: Dict[str, LidarObs]


@dataclass(frozen=True, eq=False)
class ActorTrack:
    """A tracked rigid actor: box size (length x, width y, height z, metres, box frame centred) and timed poses."""

    id: str
    category: str
    size: Tuple[float, float, float]
    timestamps_us: np.ndarray  # (T,) int64 strictly increasing
    poses: np.ndarray  # (T,4,4) T_world_actor
    metadata: Dict[str, object] = field(default_factory=dict)  # the dataset's own id, class, attributes

    def pose_at(self, timestamp_us: int) -> np.ndarray:
        return interpolate_pose(self.timestamps_us, self.poses, int(timestamp_us))


@dataclass(frozen=True, eq=False)
class DrivingLog:
    root: Path
    name: str
    source: str
    notes: Tuple[str, ...]
    cameras: Dict[str, CameraSensor]
    lidars: Dict[str, LidarSensor]
    ego_timestamps_us: np.ndarray  # (P,) int64
    ego_poses: np.ndarray  # (P,4,4) T_world_vehicle
    frames: Tuple[Frame, ...]
    actors: Tuple[ActorTrack, ...] = field(default_factory=tuple)

    def T_world_vehicle(self, timestamp_us: int) -> np.ndarray:
        return interpolate_pose(self.ego_timestamps_us, self.ego_poses, int(timestamp_us))

    def T_world_camera(self, obs: CameraObs) -> np.ndarray:
        return self.T_world_vehicle(obs.timestamp_us) @ self.cameras[obs.sensor].T_vehicle_camera

    def T_world_lidar(self, obs: LidarObs) -> np.ndarray:
        return self.T_world_vehicle(obs.timestamp_us) @ self.lidars[obs.sensor].T_vehicle_lidar

    def camera_observations(self) -> Iterator[Tuple[Frame, CameraObs]]:
        for f in self.frames:
            for obs in f.cameras.values():
                yield f, obs

    def image(self, obs: CameraObs) -> np.ndarray:
        """(H,W,3) float32 RGB in [0,1]."""
        return read_image(self.root / obs.image, self.cameras[obs.sensor].camera)

    def depth(self, obs: CameraObs) -> Optional[np.ndarray]:
        """Ground-truth (H,W) float32 camera z in metres (0 = none), or None if the log has none."""
        if obs.depth is None:
            return None
        cam = self.cameras[obs.sensor].camera
        return read_array(self.root / obs.depth, (cam.height, cam.width))

    def sweep(self, obs: LidarObs) -> np.ndarray:
        """(N,4) or (N,5) float32: x, y, z (sensor frame, m), intensity[, time offset us]."""
        return read_sweep(self.root / obs.points)

    def second_returns(self, obs: LidarObs) -> Optional[np.ndarray]:
        """The sweep's second returns (same layout as `sweep`), or None where the log has none."""
        return None if obs.second_returns is None else read_sweep(self.root / obs.second_returns)


def read_image(path: Path, camera: Camera) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError
    try:
        with Image.open(path) as im:
            rgb = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
    except FileNotFoundError:
        raise LogFormatError(f"{path}: image file missing") from None
    except (UnidentifiedImageError, OSError) as e:
        raise LogFormatError(f"{path}: not a readable image ({e})") from None
    if rgb.shape[:2] != (camera.height, camera.width):
        raise LogFormatError(f"{path}: image is {rgb.shape[1]}x{rgb.shape[0]}, the camera model says "
                             f"{camera.width}x{camera.height}")
    return rgb


def _load_npy(path: Path) -> np.ndarray:
    if not path.is_file():
        raise LogFormatError(f"{path}: file missing")
    try:
        return np.load(path, allow_pickle=False)
    except Exception as e:  # numpy raises several types for truncated or foreign files
        raise LogFormatError(f"{path}: not a readable .npy array ({e})") from None


def read_array(path: Path, shape: Tuple[int, int]) -> np.ndarray:
    a = _load_npy(path)
    if a.shape != shape or a.dtype != np.float32:
        raise LogFormatError(f"{path}: expected float32 {shape}, got {a.dtype} {a.shape}")
    return a


def read_sweep(path: Path) -> np.ndarray:
    a = _load_npy(path)
    if a.dtype != np.float32 or a.ndim != 2 or a.shape[1] not in (4, 5):
        raise LogFormatError(f"{path}: expected float32 (N,4) x,y,z,intensity or (N,5) with time offsets, "
                             f"got {a.dtype} {a.shape}")
    if not np.all(np.isfinite(a)):
        raise LogFormatError(f"{path}: contains NaN or inf")
    return a


# --------------------------------------------------------------------------- reading the manifest

class _Reader:
    """Manifest field access whose errors name the file and the field path."""

    def __init__(self, mpath: Path):
        self.mpath = mpath

    def fail(self, where: str, what: str):
        raise LogFormatError(f"{self.mpath}: {where}: {what}")

    def name(self, name, where: str) -> None:
        """Sensor names and actor ids become folder and file names: one safe path component."""
        try:
            check_name(name, where)
        except InputError as e:
            raise LogFormatError(f"{self.mpath}: {e}") from None

    def get(self, d, key: str, where: str, kind=None):
        if not isinstance(d, dict) or key not in d:
            self.fail(f"{where}.{key}" if where else key, "missing")
        v = d[key]
        if kind is not None and not isinstance(v, kind):
            self.fail(f"{where}.{key}" if where else key, f"expected {getattr(kind, '__name__', kind)}, "
                      f"got {type(v).__name__}")
        return v

    def timestamp(self, d, where: str) -> int:
        t = self.get(d, "timestamp_us", where)
        if not isinstance(t, int) or isinstance(t, bool):
            self.fail(f"{where}.timestamp_us", f"expected an integer (microseconds), got {t!r}")
        return t

    def pose(self, d, key: str, where: str) -> np.ndarray:
        v = self.get(d, key, where)
        try:
            return check_pose(np.asarray(v, dtype=np.float64), f"{self.mpath}: {where}.{key}")
        except (TypeError, ValueError) as e:
            raise LogFormatError(str(e) if str(self.mpath) in str(e) else f"{self.mpath}: {where}.{key}: {e}") from None

    def path(self, root: Path, rel, where: str) -> str:
        if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
            self.fail(where, f"must be a relative path inside the log, got {rel!r}")
        return rel

    def increasing(self, ts: List[int], where: str) -> None:
        for i in range(1, len(ts)):
            if ts[i] <= ts[i - 1]:
                self.fail(f"{where}[{i}].timestamp_us", f"timestamps out of order ({ts[i]} after {ts[i - 1]})")


def _beams(r: _Reader, d, where: str) -> Optional[LidarBeams]:
    if d is None:
        return None
    el = r.get(d, "elevations_deg", where, list)
    nums = [r.get(d, k, where, (int, float)) for k in ("azimuth_resolution_deg", "min_range_m", "max_range_m")]
    if not el or not all(isinstance(e, (int, float)) and math.isfinite(e) for e in el):
        r.fail(f"{where}.elevations_deg", "expected a non-empty list of finite numbers")
    if not (all(math.isfinite(x) for x in nums) and nums[0] > 0 and 0 <= nums[1] < nums[2]):
        r.fail(where, "expected finite azimuth_resolution_deg > 0 and 0 <= min_range_m < max_range_m")
    return LidarBeams(tuple(float(e) for e in el), *(float(x) for x in nums))


def load_log(path) -> DrivingLog:
    """Read and check a log's manifest (files are opened lazily; see `validate_log`)."""
    root = Path(path)
    mpath = root / MANIFEST
    if not mpath.exists():
        raise LogFormatError(f"{root}: not a gsim log directory (no {MANIFEST})")
    m = read_manifest(mpath, "log manifest", READABLE_VERSIONS, LogFormatError)
    r = _Reader(mpath)
    if m.get("format") != FORMAT:
        r.fail("format", f"must be {FORMAT!r}")
    sensors = r.get(m, "sensors", "", dict)
    cameras: Dict[str, CameraSensor] = {}
    for name, d in r.get(sensors, "cameras", "sensors", dict).items():
        where = f"sensors.cameras.{name}"
        r.name(name, where)
        if not isinstance(d, dict):
            r.fail(where, "expected an object")
        T = r.pose(d, "T_vehicle_camera", where)
        readout = d.get("readout_us", 0)
        if not isinstance(readout, int) or isinstance(readout, bool) or not 0 <= readout <= 1_000_000:
            r.fail(f"{where}.readout_us", f"expected an integer 0..1000000 (microseconds), got {readout!r}")
        try:
            cam = camera_from_dict({k: v for k, v in d.items() if k not in ("T_vehicle_camera", "readout_us")}, where)
        except ValueError as e:
            raise LogFormatError(f"{mpath}: {e}") from None
        cameras[name] = CameraSensor(name, cam, T, readout)
    lidars: Dict[str, LidarSensor] = {}
    for name, d in r.get(sensors, "lidars", "sensors", dict).items():
        where = f"sensors.lidars.{name}"
        r.name(name, where)
        if not isinstance(d, dict):
            r.fail(where, "expected an object")
        lidars[name] = LidarSensor(name, r.pose(d, "T_vehicle_lidar", where), _beams(r, d.get("beams"), f"{where}.beams"))
    if not cameras and not lidars:
        r.fail("sensors", "no cameras and no lidars")

    ego = r.get(m, "ego_poses", "", list)
    if not ego:
        r.fail("ego_poses", "must be a non-empty list")
    ego_ts = [r.timestamp(e, f"ego_poses[{i}]") for i, e in enumerate(ego)]
    r.increasing(ego_ts, "ego_poses")
    ego_T = np.stack([r.pose(e, "T_world_vehicle", f"ego_poses[{i}]") for i, e in enumerate(ego)])

    frames = []
    for i, f in enumerate(r.get(m, "frames", "", list)):
        where = f"frames[{i}]"
        t = r.timestamp(f, where)
        cams, lids = {}, {}
        for name, o in r.get(f, "cameras", where, dict).items():
            w = f"{where}.cameras.{name}"
            if name not in cameras:
                r.fail(w, f"unknown camera (sensors.cameras has {sorted(cameras)})")
            depth = o.get("depth") if isinstance(o, dict) else None
            cams[name] = CameraObs(name, r.timestamp(o, w), r.path(root, r.get(o, "image", w), f"{w}.image"),
                                   None if depth is None else r.path(root, depth, f"{w}.depth"))
        for name, o in r.get(f, "lidars", where, dict).items():
            w = f"{where}.lidars.{name}"
            if name not in lidars:
                r.fail(w, f"unknown lidar (sensors.lidars has {sorted(lidars)})")
            second = o.get("second_returns")
            lids[name] = LidarObs(name, r.timestamp(o, w), r.path(root, r.get(o, "points", w), f"{w}.points"),
                                  None if second is None else r.path(root, second, f"{w}.second_returns"))
        frames.append(Frame(i, t, cams, lids))
    if not frames:
        r.fail("frames", "must be a non-empty list")
    r.increasing([f.timestamp_us for f in frames], "frames")

    actors = []
    for i, a in enumerate(m.get("actors", [])):
        where = f"actors[{i}]"
        r.name(r.get(a, "id", where, str), f"{where}.id")
        aid = a["id"]
        size = r.get(a, "size", where, list)
        if len(size) != 3 or not all(isinstance(s, (int, float)) and math.isfinite(s) and s > 0 for s in size):
            r.fail(f"{where}.size", f"expected [length, width, height] > 0 metres, got {size!r}")
        track = r.get(a, "track", where, list)
        if not track:
            r.fail(f"{where}.track", "must be a non-empty list")
        ts = [r.timestamp(p, f"{where}.track[{k}]") for k, p in enumerate(track)]
        r.increasing(ts, f"{where}.track")
        poses = np.stack([r.pose(p, "T_world_actor", f"{where}.track[{k}]") for k, p in enumerate(track)])
        meta = a.get("metadata", {})
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float, bool))
                                                 for k, v in meta.items()):
            r.fail(f"{where}.metadata", "expected an object of names to strings, numbers or booleans")
        actors.append(ActorTrack(aid, r.get(a, "category", where, str), tuple(float(s) for s in size),
                                 np.asarray(ts, np.int64), poses, dict(meta)))
    if len({a.id for a in actors}) != len(actors):
        r.fail("actors", "actor ids must be unique")
    notes = m.get("notes", [])
    return DrivingLog(root, str(m.get("name", root.name)), str(m.get("source", "unknown")),
                      tuple(str(n) for n in notes), cameras, lidars, np.asarray(ego_ts, np.int64), ego_T,
                      tuple(frames), tuple(actors))


def validate_log(path, progress: bool = False) -> DrivingLog:
    """`load_log` plus every referenced file opened and checked (size, dtype, shape, finiteness)."""
    log = load_log(path)
    items = [(f, o) for f in log.frames for o in (*f.cameras.values(), *f.lidars.values())]
    if progress:
        from tqdm import tqdm
        items = tqdm(items, desc="validate", unit="file")
    for _, o in items:
        if isinstance(o, CameraObs):
            log.image(o)
            log.depth(o)
        else:
            log.sweep(o)
            log.second_returns(o)
    return log


# --------------------------------------------------------------------------- writing

class LogWriter:
    """Builds a log directory in a temporary folder; `close()` writes the manifest, validates and
    renames it into place, so a failed conversion never leaves a half-written log.

        with LogWriter(out, name="drive", source="kitti-raw") as w:
            w.add_camera("cam", camera, T_vehicle_camera)
            w.add_frame(t, cameras={"cam": w.image("cam", idx, rgb_uint8)}, lidars={...})
    """

    def __init__(self, path, name: str, source: str):
        self.path = Path(path)
        self._ctx = atomic_directory(self.path, MANIFEST)
        self.name, self.source = name, source
        self.notes: List[str] = []
        self.sensors = {"cameras": {}, "lidars": {}}
        self.ego: List[dict] = []
        self.frames: List[dict] = []
        self.actors: List[dict] = []

    def __enter__(self) -> "LogWriter":
        self.root = self._ctx.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            try:
                write_json(self.root / MANIFEST, self.manifest())
                validate_log(self.root)
            except BaseException as e:
                self._ctx.__exit__(type(e), e, e.__traceback__)  # removes the temporary folder
                raise
        return self._ctx.__exit__(exc_type, exc, tb)

    def manifest(self) -> dict:
        return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "name": self.name, "source": self.source,
                "notes": self.notes, "sensors": self.sensors, "ego_poses": self.ego, "frames": self.frames,
                "actors": self.actors}

    def add_camera(self, name: str, camera: Camera, T_vehicle_camera, readout_us: int = 0) -> None:
        check_name(name, "camera name")
        self.sensors["cameras"][name] = {**camera.to_dict(),
                                         "T_vehicle_camera": check_pose(T_vehicle_camera, f"camera {name}").tolist()}
        if readout_us:
            self.sensors["cameras"][name]["readout_us"] = int(readout_us)

    def add_lidar(self, name: str, T_vehicle_lidar, beams: Optional[LidarBeams] = None) -> None:
        check_name(name, "LiDAR name")
        self.sensors["lidars"][name] = {"T_vehicle_lidar": check_pose(T_vehicle_lidar, f"lidar {name}").tolist(),
                                        "beams": None if beams is None else beams.to_dict()}

    def add_ego_pose(self, timestamp_us: int, T_world_vehicle) -> None:
        self.ego.append({"timestamp_us": int(timestamp_us),
                         "T_world_vehicle": check_pose(T_world_vehicle, f"ego pose at {timestamp_us} us").tolist()})

    def add_actor(self, track: ActorTrack) -> None:
        self.actors.append({"id": track.id, "category": track.category, "size": [float(s) for s in track.size],
                            **({"metadata": dict(track.metadata)} if track.metadata else {}),
                            "track": [{"timestamp_us": int(t), "T_world_actor": T.tolist()}
                                      for t, T in zip(track.timestamps_us, track.poses)]})

    def _file(self, rel: str) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def image(self, sensor: str, index: int, timestamp_us: int, rgb: Optional[np.ndarray] = None,
              src: Optional[Path] = None, depth: Optional[np.ndarray] = None) -> dict:
        """Store an image (uint8 (H,W,3) array, or a PNG/JPEG file copied as is) and optional depth;
        returns the frame entry for ``add_frame``."""
        from PIL import Image
        if src is not None:
            rel = f"cameras/{sensor}/{index:06d}{Path(src).suffix.lower()}"
            shutil.copyfile(src, self._file(rel))
        else:
            rel = f"cameras/{sensor}/{index:06d}.png"
            Image.fromarray(np.asarray(rgb, np.uint8)).save(self._file(rel), format="PNG", compress_level=PNG_LEVEL)
        entry = {"timestamp_us": int(timestamp_us), "image": rel}
        if depth is not None:
            entry["depth"] = f"depth/{sensor}/{index:06d}.npy"
            np.save(self._file(entry["depth"]), np.asarray(depth, np.float32))
        return entry

    def sweep(self, sensor: str, index: int, timestamp_us: int, points: np.ndarray,
              second_returns: Optional[np.ndarray] = None) -> dict:
        """Store a (N,4|5) float32 sweep (and its second returns); returns the frame entry for ``add_frame``."""
        entry = {"timestamp_us": int(timestamp_us), "points": f"lidars/{sensor}/{index:06d}.npy"}
        np.save(self._file(entry["points"]), np.ascontiguousarray(points, np.float32))
        if second_returns is not None:
            entry["second_returns"] = f"lidars/{sensor}/{index:06d}_second.npy"
            np.save(self._file(entry["second_returns"]), np.ascontiguousarray(second_returns, np.float32))
        return entry

    def add_frame(self, timestamp_us: int, cameras: Dict[str, dict], lidars: Dict[str, dict]) -> None:
        self.frames.append({"timestamp_us": int(timestamp_us), "cameras": cameras, "lidars": lidars})


def scene_and_log_dirs(p: Path) -> Tuple[Path, Path]:
    """A scene or reconstruction directory's scene folder and its log's (which may not exist): a scene folder's
    log is the one its training record (train.json beside it) names, else a `log` folder beside it; a
    reconstruction's output (`gsim reconstruct LOG OUT`: OUT/scene, OUT/train.json) is its scene folder's; a demo
    directory (`gsim demo`'s) holds recon/scene and log."""
    if (p / "scene.json").is_file():
        record = p.parent / "train.json"
        try:
            return p, Path(json.loads(record.read_text())["log"]) if record.is_file() else p.parent / "log"
        except (OSError, ValueError, KeyError, TypeError) as e:  # (unreadable, not JSON, no "log" path)
            raise InputError(f"{record}: expected a training record (JSON) with the log's path in 'log' "
                             f"({type(e).__name__}: {e})") from None
    if (p / "scene" / "scene.json").is_file():
        return scene_and_log_dirs(p / "scene")
    scene_dir = p / "recon" / "scene"
    if not (scene_dir / "scene.json").is_file():
        raise InputError(f"{p}: no scene.json, nor scene/scene.json or recon/scene/scene.json (a reconstruction "
                         f"directory as `gsim reconstruct` or `gsim demo` writes)")
    return scene_dir, p / "log"
