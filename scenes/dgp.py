"""TRI DGP (e.g. DDAD) -> gsim driving logs.

A DGP scene is a JSON file (``scene_<sha1>.json``) listing datums (images, point clouds) with a
world pose each, and samples grouping one datum per sensor with a calibration key
(``calibration/<key>.json``: per sensor name, intrinsics and extrinsics). Protobuf JSON leaves out
fields at their default, so a missing number reads as 0.

Frames: the vehicle frame is the frame DGP's calibration extrinsics are expressed in (its ego
body frame; in DDAD it is the LiDAR frame). Each datum's world pose gives an ego pose at the
datum's time, ``T_world_vehicle = pose @ inv(extrinsic)``, so every sensor keeps DGP's own world
pose at its capture time; datums of one time must agree (``EGO_TOLERANCE``). Cameras are OpenCV
(a LiDAR point reaches camera pixels through ``inv(T_world_camera) @ T_world_lidar`` and K) with
the principal point shifted +0.5 px to gsim's pixel-centre convention. Actors come from the
LiDAR datums' 3D boxes (pose in the LiDAR frame; DGP boxes have length along x, width along y,
height along z, as gsim's box frame), tracked by ``instance_id``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from gsim.scenes._convert_util import (OPENCV_PIXEL_CENTRE_SHIFT, camera_from_params, check_image, make_pose,
                                       timestamp_us)
from gsim.scenes.log import ActorTrack, LogFormatError, LogWriter
from gsim.transforms import invert, quat_to_rotmat

DATASET_PREFIX = "scene_dataset"  # scene_dataset_v1.0.json lists scenes; scene_<sha1>.json is one
BOX_3D = "1"  # DGP's annotation type id of bounding_box_3d (ontology and datum annotation keys)
EGO_TOLERANCE = (0.005, 0.05)  # metres, degrees: datums of one timestamp must imply the same ego pose
# Intrinsics fields beyond the radial-tangential model (k1, k2, p1, p2, k3): must be 0 to convert.
UNSUPPORTED_INTRINSICS = ("skew", "fisheye", "k4", "k5", "k6", "s1", "s2", "s3", "s4", "taux", "tauy",
                          "alpha", "beta", "w", "xi", "equirectangular")


def _load_json(path: Path) -> dict:
    if not path.is_file():
        raise LogFormatError(f"{path}: file missing")
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LogFormatError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(d, dict):
        raise LogFormatError(f"{path}: expected a JSON object")
    return d


def _get(d, key: str, where: str, kind=None):
    if not isinstance(d, dict) or key not in d:
        raise LogFormatError(f"{where}.{key}: missing")
    if kind is not None and not isinstance(d[key], kind):
        raise LogFormatError(f"{where}.{key}: expected {kind.__name__}, got {type(d[key]).__name__}")
    return d[key]


def _number(d: dict, key: str, where: str) -> float:
    v = d.get(key, 0.0)  # protobuf JSON omits zeros
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise LogFormatError(f"{where}.{key}: expected a finite number, got {v!r}")
    return float(v)


def _pose(d, where: str) -> np.ndarray:
    """DGP Pose {translation {x,y,z}, rotation {qw,qx,qy,qz}} -> 4x4 (unit-normalised quaternion)."""
    if not isinstance(d, dict):
        raise LogFormatError(f"{where}: missing")
    r, t = d.get("rotation", {}), d.get("translation", {})
    q = np.array([_number(r, k, f"{where}.rotation") for k in ("qw", "qx", "qy", "qz")])
    if abs(np.linalg.norm(q) - 1) > 1e-3:
        raise LogFormatError(f"{where}.rotation: not a unit quaternion (norm {np.linalg.norm(q):.6g})")
    return make_pose(quat_to_rotmat(q / np.linalg.norm(q)), [_number(t, k, f"{where}.translation") for k in "xyz"])


def _scene_files(src: Path) -> Tuple[List[Path], bool]:
    """(scene JSON files, whether src is a dataset JSON listing them)."""
    if src.is_dir():
        found = sorted(p for p in {*src.glob("scene.json"), *src.glob("scene_*.json")}
                       if not p.name.startswith(DATASET_PREFIX))
        datasets = sorted(src.glob(f"{DATASET_PREFIX}*.json"))
        if not found and len(datasets) == 1:  # a dataset's root folder
            src = datasets[0]
        elif len(found) != 1:
            raise ValueError(f"{src}: expected one scene.json or scene_*.json, found "
                             f"{[p.name for p in found] or 'none'} (pass a scene JSON or the dataset JSON)")
        else:
            return found, False
    d = _load_json(src)
    if "scene_splits" not in d:
        if "samples" not in d:
            raise ValueError(f"{src}: neither a DGP scene (no 'samples') nor a dataset (no 'scene_splits')")
        return [src], False
    files: List[Path] = []
    for split, v in _get(d, "scene_splits", str(src), dict).items():
        for f in _get(v, "filenames", f"{src}: scene_splits.{split}", list):
            p = src.parent / f
            if p not in files:
                files.append(p)
    if not files:
        raise LogFormatError(f"{src}: scene_splits lists no scenes")
    return files, True


def convert_dgp(src, out, progress: bool = True) -> List[Path]:
    """Convert DGP scenes to gsim logs; returns the log paths.

    ``src``: a scene directory (holding scene.json or scene_*.json) or a scene JSON -> one log at
    ``out``; a dataset JSON (scene_dataset_v1.0.json, ``scene_splits``) or the folder holding it ->
    one log per listed scene at ``out/<scene folder name>``."""
    src, out = Path(src), Path(out)
    if not src.exists():
        raise ValueError(f"{src}: no such scene directory or JSON file")
    scenes, dataset = _scene_files(src)
    if not dataset:
        return [_convert_scene(scenes[0], out, progress)]
    names = [p.parent.name for p in scenes]
    if len(set(names)) != len(names):
        raise ValueError(f"{src}: several scenes share a folder name ({names}); convert them one by one")
    return [_convert_scene(p, out / n, progress) for p, n in zip(scenes, names)]


def _calibration(root: Path, key: str, cache: Dict[str, dict]) -> dict:
    """{sensor name: (intrinsics dict, T_vehicle_sensor)} of calibration/<key>.json."""
    if key not in cache:
        path = root / "calibration" / f"{key}.json"
        c = _load_json(path)
        names = _get(c, "names", str(path), list)
        intr = _get(c, "intrinsics", str(path), list)
        ext = _get(c, "extrinsics", str(path), list)
        if not len(names) == len(intr) == len(ext):
            raise LogFormatError(f"{path}: names, intrinsics and extrinsics differ in length")
        cache[key] = {n: (i, _pose(e, f"{path}: extrinsics[{k}]")) for k, (n, i, e) in enumerate(zip(names, intr, ext))}
    return cache[key]


def _camera(intr: dict, width: int, height: int, where: str):
    bad = [k for k in UNSUPPORTED_INTRINSICS if _number(intr, k, where)]
    if bad:
        raise LogFormatError(f"{where}: {bad} not supported (gsim converts the radial-tangential model "
                             f"k1, k2, p1, p2, k3 only)")
    v = {k: _number(intr, k, where) for k in ("fx", "fy", "cx", "cy", "k1", "k2", "k3", "p1", "p2")}
    v["cx"] += OPENCV_PIXEL_CENTRE_SHIFT
    v["cy"] += OPENCV_PIXEL_CENTRE_SHIFT
    return camera_from_params(where, width, height, **v)


def _same_pose(A: np.ndarray, B: np.ndarray) -> bool:
    D = invert(A) @ B
    angle = math.degrees(math.acos(min(1.0, max(-1.0, (np.trace(D[:3, :3]) - 1) / 2))))
    return np.linalg.norm(D[:3, 3]) <= EGO_TOLERANCE[0] and angle <= EGO_TOLERANCE[1]


def _sweep(path: Path, point_format: list) -> np.ndarray:
    """(N,4) float32 x, y, z, intensity (0 where the cloud has none) from a DGP .npz (key 'data')."""
    try:
        with np.load(path) as z:
            a = np.asarray(z["data"], np.float64)
    except FileNotFoundError:
        raise LogFormatError(f"{path}: point cloud missing") from None
    except Exception as e:  # numpy raises several types for broken archives
        raise LogFormatError(f"{path}: not a readable .npz with key 'data' ({e})") from None
    cols = [c.upper() for c in point_format] if point_format else ["X", "Y", "Z", "INTENSITY"]
    if a.ndim != 2 or a.shape[1] != len(cols) or not {"X", "Y", "Z"} <= set(cols):
        raise LogFormatError(f"{path}: data is {a.shape}, the datum's point_format is {cols}")
    pts = np.zeros((len(a), 4), np.float32)
    for j, c in enumerate(("X", "Y", "Z", "INTENSITY")):
        if c in cols:
            pts[:, j] = a[:, cols.index(c)]
    if not np.all(np.isfinite(pts)):
        raise LogFormatError(f"{path}: contains NaN or inf")
    return pts


@dataclass
class _Datum:
    sensor: str
    kind: str  # "camera" | "lidar"
    timestamp_us: int
    value: dict  # the datum's image or point_cloud record
    where: str  # "<scene file>: datum <key>.datum.<image|point_cloud>", for errors


@dataclass
class _Box:
    class_id: int
    file: Path
    sizes: List[Tuple[float, float, float]] = field(default_factory=list)  # (length, width, height) per sample
    track: Dict[int, np.ndarray] = field(default_factory=dict)  # timestamp -> T_world_actor


@dataclass
class _Scene:
    sensors: Dict[str, tuple] = field(default_factory=dict)  # name -> (kind, intrinsics dict, T_vehicle_sensor, camera)
    ego: Dict[int, Tuple[np.ndarray, str]] = field(default_factory=dict)  # time -> (T_world_vehicle, datum key)
    frames: List[Tuple[int, Dict[str, _Datum]]] = field(default_factory=list)
    boxes: Dict[str, _Box] = field(default_factory=dict)  # by instance id
    skipped: set = field(default_factory=set)  # datum types gsim does not convert


def _read_datum(scene: _Scene, calib: dict, key: str, d: dict, where: str, root: Path) -> Optional[_Datum]:
    """Check one datum against the calibration, record its sensor, its ego pose and its boxes."""
    ident = _get(d, "id", where, dict)
    name = _get(ident, "name", f"{where}.id", str)
    t = timestamp_us(_get(ident, "timestamp", f"{where}.id"), f"{where}.id.timestamp")
    value = _get(d, "datum", where, dict)
    field_ = "image" if "image" in value else "point_cloud" if "point_cloud" in value else None
    if field_ is None:
        scene.skipped.update(value)
        return None
    datum = _Datum(name, "camera" if field_ == "image" else "lidar", t, value[field_], f"{where}.datum.{field_}")
    if name not in calib:
        raise LogFormatError(f"{where}: sensor {name!r} has no calibration (calibration has {sorted(calib)})")
    intr, T_vehicle_sensor = calib[name]
    cam = None
    if datum.kind == "camera":
        cam = _camera(intr, _get(datum.value, "width", datum.where, int), _get(datum.value, "height", datum.where, int),
                      f"calibration intrinsics of {name}")
    sensor = (datum.kind, intr, T_vehicle_sensor, cam)
    prev = scene.sensors.setdefault(name, sensor)
    if prev[:2] != sensor[:2] or not np.array_equal(prev[2], T_vehicle_sensor) or prev[3] != cam:
        raise LogFormatError(f"{where}: sensor {name!r} changes kind or calibration within the scene "
                             f"(a gsim log has fixed sensors)")
    T_world_sensor = _pose(datum.value.get("pose"), f"{datum.where}.pose")
    T_world_vehicle = T_world_sensor @ invert(T_vehicle_sensor)
    if t in scene.ego and not _same_pose(scene.ego[t][0], T_world_vehicle):
        raise LogFormatError(f"{datum.where}.pose: implies an ego pose at {t} us that differs from datum "
                             f"{scene.ego[t][1]}'s by more than {EGO_TOLERANCE[0]} m / {EGO_TOLERANCE[1]} deg")
    scene.ego.setdefault(t, (T_world_vehicle, key))
    box_file = datum.value.get("annotations", {}).get(BOX_3D) if datum.kind == "lidar" else None
    if box_file is not None:
        _add_boxes(root / box_file, t, T_world_sensor, scene.boxes)
    return datum


def _read_scene(scene_path: Path, scene: dict) -> _Scene:
    root, where = scene_path.parent, str(scene_path)
    data = {_get(d, "key", f"{where}: data[{k}]", str): d for k, d in enumerate(_get(scene, "data", where, list))}
    samples = _get(scene, "samples", where, list)
    if not samples:
        raise LogFormatError(f"{where}: samples: empty")
    out, calib_cache = _Scene(), {}
    for i, s in enumerate(samples):
        sw = f"{where}: samples[{i}]"
        calib = _calibration(root, _get(s, "calibration_key", sw, str), calib_cache)
        obs: Dict[str, _Datum] = {}
        for key in _get(s, "datum_keys", sw, list):
            if key not in data:
                raise LogFormatError(f"{sw}.datum_keys: {key!r} is not a datum of the scene")
            datum = _read_datum(out, calib, key, data[key], f"{where}: datum {key}", root)
            if datum is not None:
                if datum.sensor in obs:
                    raise LogFormatError(f"{sw}: two datums of sensor {datum.sensor!r}")
                obs[datum.sensor] = datum
        out.frames.append((timestamp_us(_get(_get(s, "id", sw, dict), "timestamp", f"{sw}.id"), f"{sw}.id.timestamp"),
                           obs))
    return out


def _convert_scene(scene_path: Path, out: Path, progress: bool) -> Path:
    from tqdm import tqdm
    root = scene_path.parent
    raw = _load_json(scene_path)
    scene = _read_scene(scene_path, raw)
    categories = _categories(root, raw, str(scene_path)) if scene.boxes else {}
    name = str(raw.get("name") or root.name)
    with LogWriter(out, name=name, source="dgp") as w:
        for n, (kind, _, T, cam) in scene.sensors.items():
            if kind == "camera":
                w.add_camera(n, cam, T)
            else:
                w.add_lidar(n, T)
        for t in sorted(scene.ego):
            w.add_ego_pose(t, scene.ego[t][0])
        for k, (t, obs) in enumerate(tqdm(scene.frames, desc=f"dgp {name}", unit="sample", disable=not progress)):
            cams, lids = {}, {}
            for n, d in obs.items():
                path = root / _get(d.value, "filename", d.where, str)
                if d.kind == "camera":
                    cam = scene.sensors[n][3]
                    check_image(path, cam.width, cam.height, f"{d.where} width/height")
                    cams[n] = w.image(n, k, d.timestamp_us, src=path)
                else:
                    lids[n] = w.sweep(n, k, d.timestamp_us, _sweep(path, d.value.get("point_format", [])))
            w.add_frame(t, cameras=cams, lidars=lids)
        for aid, b in scene.boxes.items():
            if b.class_id not in categories:
                raise LogFormatError(f"{b.file}: class_id {b.class_id} is not in the bounding_box_3d ontology")
            ts = sorted(b.track)
            size = tuple(np.median(b.sizes, axis=0))  # one rigid box per track; annotators may vary it
            w.add_actor(ActorTrack(aid, categories[b.class_id], size, np.asarray(ts, np.int64),
                                   np.stack([b.track[t] for t in ts])))
        w.notes.extend([
            "vehicle frame = DGP's calibration (ego) frame; ego poses from every datum's world pose at its own time",
            "camera principal points shifted by +0.5 px (OpenCV pixel centres -> gsim's)",
            "actors: LiDAR 3D boxes tracked by instance_id; size = median [length, width, height] over the track"]
            + ([f"skipped datum types: {sorted(scene.skipped)}"] if scene.skipped else []))
    return out


def _add_boxes(path: Path, t: int, T_world_lidar: np.ndarray, boxes: Dict[str, _Box]) -> None:
    for k, a in enumerate(_get(_load_json(path), "annotations", str(path), list)):
        aw = f"{path}: annotations[{k}]"
        box = _get(a, "box", aw, dict)
        size = tuple(_number(box, f, f"{aw}.box") for f in ("length", "width", "height"))
        if min(size) <= 0:
            raise LogFormatError(f"{aw}.box: length, width, height must be > 0, got {size}")
        aid = str(_get(a, "instance_id", aw, int))
        b = boxes.setdefault(aid, _Box(int(_number(a, "class_id", aw)), path))
        if t in b.track:
            raise LogFormatError(f"{aw}: instance_id {aid} appears twice at {t} us")
        b.sizes.append(size)
        b.track[t] = T_world_lidar @ _pose(box.get("pose"), f"{aw}.box.pose")


def _categories(root: Path, scene: dict, where: str) -> Dict[int, str]:
    key = _get(_get(scene, "ontologies", where, dict), BOX_3D, f"{where}: ontologies", str)
    path = root / "ontology" / f"{key}.json"
    items = _get(_load_json(path), "items", str(path), list)
    return {int(_number(it, "id", f"{path}: items[{k}]")): str(_get(it, "name", f"{path}: items[{k}]", str))
            for k, it in enumerate(items)}
