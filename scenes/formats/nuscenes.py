"""nuScenes (and Lyft Level 5, which uses the same schema) -> gsim driving logs.

A dataset root holds a table folder (``v1.0-mini``, ``v1.0-trainval``, Lyft's ``v1.01-train``): JSON lists of
records linked by ``token``s. Read here: ``scene``, ``sample`` (keyframes), ``sample_data`` (one sensor file each,
keyframe or sweep, path ``filename`` relative to the root), ``ego_pose``, ``calibrated_sensor``, ``sensor``,
``sample_annotation``, ``instance`` and ``category``. Radar sample_data are left out (gsim logs have no radar).

Frames and conventions (T_dst_src maps src points to dst; quaternions are (w, x, y, z) in the tables as in gsim):

- vehicle frame = the dataset's ego frame (x forward, y left, z up); world = its global (map) frame, kept as is.
- ``calibrated_sensor`` translation t, rotation q: ``T_vehicle_sensor = [R(q) | t]`` for cameras and LiDARs alike.
- Cameras are OpenCV already (x right, y down, z forward); ``camera_intrinsic`` is a 3x3 pinhole K of undistorted
  images (no distortion model), so fx, fy from K and the principal point + 0.5 px (OpenCV pixel centres -> gsim's).
  The image size is the sample_data's ``width`` x ``height``; files are copied as they are.
- ``ego_pose`` translation t, rotation q: ``T_world_vehicle = [R(q) | t]`` at the time of the sample_data that
  names it. nuScenes stamps the pose with that time; Lyft stamps every pose of a sample with the sample's (LiDAR)
  time although the camera poses are taken at the cameras' own times (the vehicle moves 1.1 m across one Lyft
  sample's poses, at the speed their sample_data times imply), so the sample_data's time is used and the largest
  difference goes to the notes. Times are microseconds (Lyft writes them as floats: rounded).
- LiDAR files (``.pcd.bin`` in nuScenes, ``.bin`` in Lyft): little-endian float32 records of 5 values x, y, z
  (sensor frame, metres), intensity 0-255 (scaled to [0, 1] by / 255) and ring index (dropped: no beam table is
  known, so ``beams`` is null). nuScenes' sweeps are ego-motion compensated to the sweep's timestamp (its paper;
  Lyft's are read the same way), so a sweep has no per-point times. A file whose size is not a whole number of
  records is refused (one Lyft file is known to be truncated).
- ``sample_annotation`` translation = box centre in the world, rotation q with the box's x along its length,
  ``size = [width, length, height]`` (note the order): ``T_world_actor = [R(q) | t]``, gsim size
  (length, width, height) = (size[1], size[0], size[2]), at the sample's timestamp. Boxes are tracked by their
  ``instance`` token; the category name maps to a gsim category (`CATEGORIES`) and is kept in the metadata.

Frames: every keyframe sample is a frame (time = the sample's timestamp, its sample_data grouped as the sample
groups them). Sweeps (non-keyframe sample_data) are kept: each sweep of the reference sensor (LIDAR_TOP, else
the first LiDAR by name, else CAM_FRONT, else the first camera) starts a frame, and every other sweep joins the
frame whose reference datum is nearest to its own time minus its sensor's usual offset from the reference at
the keyframes (nuScenes' cameras fire up to 45 ms before LIDAR_TOP's timestamp, Lyft's up to 103 ms), when
within half the reference's period and the frame has no datum of that sensor yet; else it makes a frame of
its own (counted in the notes). Without any sweep file on disk (a download of the keyframes only) the log has
the keyframes and says so; any other missing sensor file is refused, naming it.
"""
from __future__ import annotations

import json
import math
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from gsim.cameras import PinholeCamera
from gsim.errors import NAME_RE, InputError
from gsim.scenes.formats.convert_util import (OPENCV_PIXEL_CENTRE_SHIFT, TrackBuilder, camera_from_params, check_image,
                                              make_pose)
from gsim.scenes.log import LogFormatError, LogWriter
from gsim.transforms import quat_to_rotmat

# the tables a conversion reads (a complete nuScenes or Lyft table folder has more: log, map, attribute, ...)
TABLES = ("scene", "sample", "sample_data", "ego_pose", "calibrated_sensor", "sensor", "sample_annotation",
          "instance", "category")
POINT_FIELDS = ("x", "y", "z", "intensity", "ring")  # float32 each, in every LiDAR file
INTENSITY_MAX = 255.0
REFERENCE_ORDER = ("LIDAR_TOP", "CAM_FRONT")  # preferred frame references, before the others by modality and name
# nuScenes' 23 classes and Lyft's 9 -> gsim categories; the rest (animals, debris, pushable objects, bicycle racks,
# Lyft's other_vehicle and emergency_vehicle) are "other". A bicycle is gsim's two-wheeler "cyclist", ridden or not
# (the dataset's attributes say which, per box).
CATEGORIES = {
    "vehicle.car": "car", "vehicle.emergency.police": "car", "vehicle.truck": "truck", "vehicle.construction": "truck",
    "vehicle.trailer": "truck", "vehicle.emergency.ambulance": "truck", "vehicle.bus.rigid": "bus",
    "vehicle.bus.bendy": "bus", "vehicle.bicycle": "cyclist", "vehicle.motorcycle": "motorcycle",
    "human.pedestrian.adult": "pedestrian", "human.pedestrian.child": "pedestrian",
    "human.pedestrian.construction_worker": "pedestrian", "human.pedestrian.police_officer": "pedestrian",
    "human.pedestrian.wheelchair": "pedestrian", "human.pedestrian.stroller": "pedestrian",
    "human.pedestrian.personal_mobility": "pedestrian", "movable_object.trafficcone": "cone",
    "movable_object.barrier": "barrier",
    "car": "car", "truck": "truck", "bus": "bus", "pedestrian": "pedestrian", "bicycle": "cyclist",
    "motorcycle": "motorcycle"}


# --------------------------------------------------------------------------- tables

class _Tables:
    """The table folder's records, indexed by token; errors name the file, the record and the field."""

    def __init__(self, folder: Path):
        self.folder = folder
        missing = [t for t in TABLES if not (folder / f"{t}.json").is_file()]
        if missing:
            raise LogFormatError(f"{folder}: table{'s' if len(missing) > 1 else ''} missing: "
                                 f"{', '.join(t + '.json' for t in missing)} (a conversion reads {', '.join(TABLES)})")
        self.rows: Dict[str, List[dict]] = {}
        self.index: Dict[str, Dict[str, int]] = {}
        for t in TABLES:
            path = folder / f"{t}.json"
            try:
                rows = json.loads(path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise LogFormatError(f"{path}: invalid JSON ({e})") from None
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise LogFormatError(f"{path}: expected a JSON list of records (objects)")
            idx = {}
            for i, r in enumerate(rows):
                tok = r.get("token")
                if not isinstance(tok, str) or not tok:
                    raise LogFormatError(f"{self.where(t, i)}.token: expected a non-empty string, got {tok!r}")
                if tok in idx:
                    raise LogFormatError(f"{self.where(t, i)}.token: {tok!r} repeats record {idx[tok]}")
                idx[tok] = i
            self.rows[t], self.index[t] = rows, idx

    def where(self, table: str, i: int) -> str:
        return f"{self.folder / table}.json[{i}]"

    def ref(self, table: str, rec: dict, key: str, where: str) -> Tuple[dict, str]:
        """The ``table`` record that field ``key`` of ``rec`` names, and its location."""
        tok = _str(rec, key, where)
        if tok not in self.index[table]:
            raise LogFormatError(f"{where}.{key}: {tok!r} is not a token of {table}.json")
        i = self.index[table][tok]
        return self.rows[table][i], self.where(table, i)


def _get(rec: dict, key: str, where: str):
    if key not in rec:
        raise LogFormatError(f"{where}.{key}: missing")
    return rec[key]


def _str(rec: dict, key: str, where: str) -> str:
    v = _get(rec, key, where)
    if not isinstance(v, str):
        raise LogFormatError(f"{where}.{key}: expected a string, got {v!r}")
    return v


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _time(rec: dict, key: str, where: str) -> int:
    v = _get(rec, key, where)
    if not _real(v) or v < 0:
        raise LogFormatError(f"{where}.{key}: expected a time in microseconds, got {v!r}")
    return int(round(v))


def _numbers(rec: dict, key: str, where: str, n: int) -> np.ndarray:
    v = _get(rec, key, where)
    if not isinstance(v, list) or len(v) != n or not all(_real(x) for x in v):
        raise LogFormatError(f"{where}.{key}: expected {n} finite numbers, got {v!r}")
    return np.array(v, np.float64)


def _pose(rec: dict, where: str) -> np.ndarray:
    """[R(q) | t] from a record's ``rotation`` (w, x, y, z) and ``translation``."""
    q = _numbers(rec, "rotation", where, 4)
    norm = np.linalg.norm(q)
    if abs(norm - 1) > 1e-3:
        raise LogFormatError(f"{where}.rotation: not a unit quaternion (w, x, y, z), norm {norm:.6g}")
    return make_pose(quat_to_rotmat(q / norm), _numbers(rec, "translation", where, 3))


def _table_folder(root: Path, version: Optional[str]) -> Path:
    if version is not None:
        folder = root / version
        if not folder.is_dir():
            raise InputError(f"{folder}: no such table folder (version {version!r})")
        return folder
    found = sorted(p for p in root.iterdir() if p.is_dir() and any((p / f"{t}.json").is_file() for t in TABLES))
    if len(found) != 1:
        raise InputError(f"{root}: expected one table folder (holding {', '.join(t + '.json' for t in TABLES[:3])}, "
                         f"...), found {[p.name for p in found] or 'none'}; name it with --version")
    return found[0]


# --------------------------------------------------------------------------- one scene

@dataclass
class _Datum:
    token: str
    channel: str
    modality: str  # "camera" | "lidar"
    timestamp_us: int
    key: bool
    sample: str
    path: Path
    where: str  # its sample_data record, for errors


@dataclass
class _Sensor:
    modality: str
    T_vehicle_sensor: np.ndarray
    calibration: dict  # the calibrated_sensor record (for the consistency check)
    where: str
    camera: Optional[PinholeCamera] = None


@dataclass
class _Scene:
    name: str
    sensors: Dict[str, _Sensor] = field(default_factory=dict)
    datums: List[_Datum] = field(default_factory=list)
    ego: Dict[int, Tuple[np.ndarray, str]] = field(default_factory=dict)  # time -> (T_world_vehicle, where)
    sample_times: Dict[str, int] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)


def _camera(cal: dict, where: str, width: int, height: int, sd_where: str) -> PinholeCamera:
    K = _get(cal, "camera_intrinsic", where)
    if not (isinstance(K, list) and len(K) == 3 and all(isinstance(r, list) and len(r) == 3 and all(map(_real, r))
                                                         for r in K)):
        raise LogFormatError(f"{where}.camera_intrinsic: expected a 3x3 matrix of numbers, got {K!r}")
    K = np.array(K, np.float64)
    if K[0, 1] or K[1, 0] or K[2, 0] or K[2, 1] or K[2, 2] != 1:
        raise LogFormatError(f"{where}.camera_intrinsic: expected [[fx, 0, cx], [0, fy, cy], [0, 0, 1]], got "
                             f"{K.tolist()}")
    return camera_from_params(f"{where}.camera_intrinsic with {sd_where}.width/height", width, height, K[0, 0],
                              K[1, 1], K[0, 2] + OPENCV_PIXEL_CENTRE_SHIFT, K[1, 2] + OPENCV_PIXEL_CENTRE_SHIFT)


def _add_sensor(sensors: Dict[str, _Sensor], channel: str, modality: str, cal: dict, cal_where: str, sd: dict,
                where: str) -> None:
    """Record the sensor of sample_data ``sd`` at its first datum; later ones must have the same calibration."""
    prev = sensors.get(channel)
    if prev is None:
        cam = (_camera(cal, cal_where, _size(sd, "width", where), _size(sd, "height", where), where)
               if modality == "camera" else None)
        sensors[channel] = _Sensor(modality, _pose(cal, cal_where), cal, cal_where, cam)
        return
    if prev.modality != modality or ({k: v for k, v in cal.items() if k != "token"}
                                     != {k: v for k, v in prev.calibration.items() if k != "token"}):
        raise LogFormatError(f"{where}: sensor {channel} is calibrated by {cal_where}, other sample_data of the scene "
                             f"by {prev.where}, which differs (a gsim log has fixed sensors)")
    if modality == "camera" and (sd.get("width"), sd.get("height")) != (prev.camera.width, prev.camera.height):
        raise LogFormatError(f"{where}.width/height: {sd.get('width')}x{sd.get('height')}, other {channel} images "
                             f"are {prev.camera.width}x{prev.camera.height}")


def _size(rec: dict, key: str, where: str) -> int:
    v = _get(rec, key, where)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise LogFormatError(f"{where}.{key}: expected the image size in pixels (> 0), got {v!r}")
    return v


def _read_scene(db: _Tables, root: Path, scene: dict, scene_where: str, by_sample: Dict[str, List[int]],
                samples: List[int]) -> _Scene:
    """The scene's sensors, sample_data and ego poses."""
    out = _Scene(_str(scene, "name", scene_where))
    radar, ego_clock = 0, []
    for i in samples:
        row = db.rows["sample"][i]
        out.sample_times[row["token"]] = _time(row, "timestamp", db.where("sample", i))
    for s in out.sample_times:
        for i in by_sample.get(s, []):
            sd, where = db.rows["sample_data"][i], db.where("sample_data", i)
            cal, cal_where = db.ref("calibrated_sensor", sd, "calibrated_sensor_token", where)
            sensor, sensor_where = db.ref("sensor", cal, "sensor_token", cal_where)
            modality, channel = _str(sensor, "modality", sensor_where), _str(sensor, "channel", sensor_where)
            if modality == "radar":
                radar += 1
                continue
            if modality not in ("camera", "lidar"):
                raise LogFormatError(f"{sensor_where}.modality: expected camera, lidar or radar, got {modality!r}")
            if not NAME_RE.fullmatch(channel):
                raise LogFormatError(f"{sensor_where}.channel: {channel!r} is not a usable sensor name")
            key = _get(sd, "is_key_frame", where)
            if not isinstance(key, bool):
                raise LogFormatError(f"{where}.is_key_frame: expected true or false, got {key!r}")
            t = _time(sd, "timestamp", where)
            _add_sensor(out.sensors, channel, modality, cal, cal_where, sd, where)
            pose, pose_where = db.ref("ego_pose", sd, "ego_pose_token", where)
            T = _pose(pose, pose_where)
            ego_clock.append(abs(_time(pose, "timestamp", pose_where) - t))
            if t in out.ego and np.abs(out.ego[t][0] - T).max() > 1e-9:
                raise LogFormatError(f"{pose_where}: the ego pose at {t} us (the time of {where}) differs from "
                                     f"{out.ego[t][1]}, also at that time")
            out.ego.setdefault(t, (T, pose_where))
            out.datums.append(_Datum(sd["token"], channel, modality, t, key, s, root / _str(sd, "filename", where),
                                     where))
    if not out.datums:
        raise LogFormatError(f"{scene_where}: scene {out.name} has no camera or LiDAR sample_data "
                             f"(sample_data.json has none for its {len(samples)} samples)")
    if radar:
        out.notes.append(f"radar: {radar} radar sample_data left out (gsim logs have no radar)")
    if max(ego_clock) > 0:
        out.notes.append(f"ego_pose timestamps differ from their sample_data's by up to {max(ego_clock) / 1000:.3f} "
                         f"ms (Lyft stamps a sample's poses with its LiDAR time); each pose is placed at its "
                         f"sample_data's time")
    return out


def _check_files(scene: _Scene) -> None:
    """Refuse a missing sensor file, except all sweep files missing (keyframes only, noted)."""
    missing = [d for d in scene.datums if not d.path.is_file()]
    sweeps = [d for d in scene.datums if not d.key]
    if missing and missing == sweeps and len(sweeps) < len(scene.datums):
        scene.datums = [d for d in scene.datums if d.key]
        scene.sensors = {c: s for c, s in scene.sensors.items() if any(d.channel == c for d in scene.datums)}
        scene.notes.append(f"keyframes only: none of the scene's {len(sweeps)} sweep files (non-keyframe sample_data) "
                           f"is under the dataset root")
        return
    if missing:
        d = min(missing, key=lambda d: (d.timestamp_us, d.channel))
        raise LogFormatError(f"{d.path}: sensor file missing ({d.where}, {d.channel} at {d.timestamp_us} us); "
                             f"{len(missing)} of the scene's {len(scene.datums)} files are missing")


def _reference(channels: Dict[str, str]) -> str:
    """The frame reference among {channel: modality}: LIDAR_TOP, other LiDARs, CAM_FRONT, other cameras."""
    return min(channels, key=lambda c: (channels[c] != "lidar", c not in REFERENCE_ORDER, c))


def group_frames(datums: List[_Datum], sample_times: Dict[str, int]
                 ) -> Tuple[List[Tuple[int, Dict[str, _Datum]]], List[str]]:
    """[(frame time, {channel: datum})] in time order, and notes (see the module docstring)."""
    frames: Dict[Tuple[str, str], Tuple[int, Dict[str, _Datum]]] = {}  # ("sample" | "sweep", token) -> frame

    def join(key: Tuple[str, str], t: int, d: _Datum) -> None:
        f = frames.setdefault(key, (t, {}))[1]
        if d.channel in f:
            raise LogFormatError(f"{d.where}: a second keyframe datum of {d.channel} in sample {d.sample} (the other "
                                 f"is {f[d.channel].where})")
        f[d.channel] = d

    for d in datums:
        if d.key:
            join(("sample", d.sample), sample_times[d.sample], d)
    sweeps = sorted((d for d in datums if not d.key), key=lambda d: (d.timestamp_us, d.channel))
    if not sweeps:
        return _merge(frames.values()), [f"frames: the {len(frames)} keyframe samples"]
    keyframes = len(frames)
    ref = _reference({d.channel: d.modality for d in datums})
    offsets = {}  # each sensor's median time from the reference's datum in the keyframes having both
    for c in {d.channel for d in datums}:
        lags = [f[c].timestamp_us - f[ref].timestamp_us for _, f in frames.values() if c in f and ref in f]
        offsets[c] = int(np.median(lags)) if lags else 0
    for d in sweeps:
        if d.channel == ref:
            join(("sweep", d.token), d.timestamp_us, d)
    anchors = sorted(((f[ref].timestamp_us, f) for _, f in frames.values() if ref in f), key=lambda a: a[0])
    times = [t for t, _ in anchors]
    period = float(np.median(np.diff(times))) if len(times) > 1 else 0.0
    alone = 0
    for d in sweeps:
        if d.channel == ref:
            continue
        target = d.timestamp_us - offsets[d.channel]
        k = bisect_left(times, target)
        near = min((j for j in (k - 1, k) if 0 <= j < len(times)), key=lambda j: abs(times[j] - target), default=None)
        if near is not None and abs(times[near] - target) <= period / 2 and d.channel not in anchors[near][1]:
            anchors[near][1][d.channel] = d
        else:
            join(("sweep", d.token), d.timestamp_us, d)
            alone += 1
    lags = ", ".join(f"{c} {o / 1000:+.1f} ms" for c, o in sorted(offsets.items()) if c != ref)
    return _merge(frames.values()), [
        f"frames: the {keyframes} keyframe samples and {sum(d.channel == ref for d in sweeps)} {ref} sweeps, each with "
        f"the other sensors' sweeps nearest to it after their usual offset from {ref} at the keyframes ({lags})"
        + (f"; {alone} sweeps with no such frame make frames of their own" if alone else "")]


def _merge(frames) -> List[Tuple[int, Dict[str, _Datum]]]:
    """Frames of one time (frames of their own can share a time: Lyft's CAM_FRONT and CAM_FRONT_ZOOMED) as one."""
    merged: Dict[int, Dict[str, _Datum]] = {}
    for t, f in sorted(frames, key=lambda x: x[0]):
        clash = sorted(set(merged.get(t, {})) & set(f))
        if clash:
            c = clash[0]
            raise LogFormatError(f"{f[c].where}: {c} has two sample_data at frame time {t} us (the other is "
                                 f"{merged[t][c].where})")
        merged.setdefault(t, {}).update(f)
    return sorted(merged.items())


def read_points(path: Path) -> np.ndarray:
    """(N,4) float32 x, y, z, intensity in [0, 1] from a nuScenes/Lyft LiDAR file (5 float32 a point)."""
    try:
        raw = np.fromfile(path, dtype="<f4")
    except OSError as e:
        raise LogFormatError(f"{path}: unreadable LiDAR file ({e})") from None
    n = len(POINT_FIELDS)
    if raw.size % n:
        raise LogFormatError(f"{path}: {raw.size * 4} bytes is not a whole number of {n}-float32 records "
                             f"({', '.join(POINT_FIELDS)}): a truncated or foreign file")
    a = raw.reshape(-1, n)
    if not np.all(np.isfinite(a[:, :4])):
        raise LogFormatError(f"{path}: contains NaN or inf")
    if a.size and (a[:, 3].min() < 0 or a[:, 3].max() > INTENSITY_MAX):
        raise LogFormatError(f"{path}: intensity (4th value) must be in [0, {INTENSITY_MAX:g}], got "
                             f"[{a[:, 3].min():g}, {a[:, 3].max():g}]")
    return np.column_stack([a[:, :3], a[:, 3] / np.float32(INTENSITY_MAX)]).astype(np.float32)


def _tracks(db: _Tables, scene: _Scene, by_sample: Dict[str, List[int]]) -> Tuple[list, Dict[str, int]]:
    """The scene's annotated boxes as tracks (one per instance token), and the count of boxes per class."""
    tb, counts = TrackBuilder(CATEGORIES), {}
    for s, t in scene.sample_times.items():
        for i in by_sample.get(s, []):
            a, where = db.rows["sample_annotation"][i], db.where("sample_annotation", i)
            inst, inst_where = db.ref("instance", a, "instance_token", where)
            cat, cat_where = db.ref("category", inst, "category_token", inst_where)
            name = _str(cat, "name", cat_where)
            w, length, h = _numbers(a, "size", where, 3)
            tb.add(inst["token"], name, t, _pose(a, where), (length, w, h), f"{where}.size")
            counts[name] = counts.get(name, 0) + 1
    return tb.tracks(), counts


def _write(scene: _Scene, frames, tracks, out: Path, notes: List[str], progress: bool) -> Path:
    from tqdm import tqdm
    with LogWriter(out, name=scene.name, source="nuscenes") as w:
        for name, s in sorted(scene.sensors.items()):
            if s.modality == "camera":
                w.add_camera(name, s.camera, s.T_vehicle_sensor)
            else:
                w.add_lidar(name, s.T_vehicle_sensor)
        for t in sorted(scene.ego):
            w.add_ego_pose(t, scene.ego[t][0])
        for k, (t, obs) in enumerate(tqdm(frames, desc=f"nuscenes {scene.name}", unit="frame", disable=not progress)):
            cams, lids = {}, {}
            for name, d in sorted(obs.items()):
                if d.modality == "camera":
                    cam = scene.sensors[name].camera
                    check_image(d.path, cam.width, cam.height, f"{d.where}.width/height")
                    cams[name] = w.image(name, k, d.timestamp_us, src=d.path)
                else:
                    lids[name] = w.sweep(name, k, d.timestamp_us, read_points(d.path))
            w.add_frame(t, cameras=cams, lidars=lids)
        for a in tracks:
            w.add_actor(a)
        w.notes.extend(notes)
    return out


def _notes(version: str, modalities: set, notes: List[str], classes: Dict[str, int]) -> List[str]:
    return [f"tables: {version} (nuScenes schema); vehicle frame = the ego frame (x forward, y left, z up); world = "
            f"the dataset's global frame",
            "calibrated_sensor = T_vehicle_sensor" + ("; cameras: pinhole K of undistorted images, principal point "
                                                      "+0.5 px (OpenCV pixel centres -> gsim's)"
                                                      if "camera" in modalities else ""),
            "ego poses: one per sample_data, at its timestamp", *notes,
            "LiDAR: 5 float32 a point (x, y, z, intensity 0-255 scaled by 1/255 to [0, 1], ring dropped); "
            "ego-motion compensated by the dataset to the sweep time (no per-point times); beam table unknown"
            if "lidar" in modalities else "no LiDAR sample_data in this scene: a camera-only log",
            *([] if "camera" in modalities else ["no camera sample_data in this scene: a LiDAR-only log"]),
            f"actors: {sum(classes.values())} sample_annotation boxes at the keyframes, tracked by instance token; "
            f"size [width, length, height] -> (length, width, height); classes {dict(sorted(classes.items()))} -> "
            f"gsim categories, the class kept in metadata"]


def convert_nuscenes(dataroot, out, scene: Optional[str] = None, version: Optional[str] = None,
                     progress: bool = True) -> List[Path]:
    """Convert nuScenes-schema scenes (nuScenes, Lyft Level 5) to gsim logs; returns the log paths.

    ``dataroot``: the folder holding the table folder and the files sample_data names (``samples/``, ``sweeps/``;
    Lyft: ``images/``, ``lidar/``). ``version``: the table folder's name (default: the one folder there holding
    tables). ``scene``: a scene's name -> its log at ``out``; without it, every scene -> ``out/<scene name>``."""
    root, out = Path(dataroot), Path(out)
    if not root.is_dir():
        raise InputError(f"{root}: no such dataset folder")
    db = _Tables(_table_folder(root, version))
    scene_rows = list(enumerate(db.rows["scene"]))
    if scene is not None:
        scene_rows = [(i, s) for i, s in scene_rows if s.get("name") == scene]
        if not scene_rows:
            names = [str(s.get("name")) for s in db.rows["scene"]]
            raise InputError(f"{db.folder}/scene.json: no scene named {scene!r} (it has {len(names)}: "
                             f"{', '.join(names[:20])}{', ...' if len(names) > 20 else ''})")
    if not scene_rows:
        raise LogFormatError(f"{db.folder}/scene.json: no scenes")
    by_scene: Dict[str, List[int]] = {}
    for i, s in enumerate(db.rows["sample"]):
        by_scene.setdefault(_str(s, "scene_token", db.where("sample", i)), []).append(i)
    by_sample: Dict[str, List[int]] = {}
    for i, sd in enumerate(db.rows["sample_data"]):
        by_sample.setdefault(_str(sd, "sample_token", db.where("sample_data", i)), []).append(i)
    ann_by_sample: Dict[str, List[int]] = {}
    for i, a in enumerate(db.rows["sample_annotation"]):
        ann_by_sample.setdefault(_str(a, "sample_token", db.where("sample_annotation", i)), []).append(i)
    logs = []
    for i, s in scene_rows:
        where = db.where("scene", i)
        samples = by_scene.get(s["token"], [])
        if not samples:
            raise LogFormatError(f"{where}: scene {s.get('name')!r} has no samples in sample.json")
        sc = _read_scene(db, root, s, where, by_sample, samples)
        if scene is None and not NAME_RE.fullmatch(sc.name):
            raise LogFormatError(f"{where}.name: {sc.name!r} cannot name a log folder")
        _check_files(sc)
        frames, frame_notes = group_frames(sc.datums, sc.sample_times)
        tracks, classes = _tracks(db, sc, ann_by_sample)
        notes = _notes(db.folder.name, {d.modality for d in sc.datums}, frame_notes + sc.notes, classes)
        logs.append(_write(sc, frames, tracks, out if scene is not None else out / sc.name, notes, progress))
    return logs


# gsim convert's subcommand for this format: its help line, what SRC (and OUT) is, options the converter takes
HELP = ("nuScenes or Lyft Level 5 (same schema): the dataset root holding a table folder (v1.0-mini, v1.01-train, "
        "...) and the sensor files")
SRC = "the dataset root (DATAROOT)"
OUT = "the log folder with --scene, else the folder of one log per scene"


def add_options(parser) -> None:
    parser.add_argument("--scene", default=None, help="convert this scene only (e.g. scene-0061); default: every scene")
    parser.add_argument("--version", default=None, help="the table folder (e.g. v1.0-mini, v1.01-train); default: the "
                                                        "one folder under DATAROOT holding tables")
