"""TRI DGP (e.g. DDAD) -> gsim driving logs.

A DGP scene is a JSON file (``scene_<sha1>.json``) listing datums (images, point clouds) with a
world pose each, and samples grouping one datum per sensor with a calibration key
(``calibration/<key>.json``: per sensor name, intrinsics and extrinsics). Protobuf JSON leaves out
fields at their default, so a missing number reads as 0.

Frames: the vehicle frame is the frame DGP's calibration extrinsics are expressed in (its ego
body frame; in DDAD it is the LiDAR frame). Each datum records its sensor's world pose, so it
implies an ego pose ``pose @ inv(extrinsic)`` at its time. Real scenes' datums of one time
disagree on it by millimetres (a DDAD scene: median 6 mm, max 9 mm / 0.02 deg), so the ego pose
of a time comes from one reference datum: the LiDAR's (the first LiDAR by name), at a time with
no LiDAR datum the first camera by name that has one (the order of ``_reference_order``). Each
other datum of that time is compared with it, the statistics go to the log's notes, and the
scene is refused only beyond ``EGO_DISAGREEMENT_BOUND``. Such a sensor's extrinsic becomes the
mean of what its datums imply, ``inv(T_world_vehicle) @ pose``: DGP projects with the recorded
poses (``inv(T_world_camera) @ T_world_lidar``), and a disagreement constant per sensor (a
calibration offset, the usual case) is then absorbed, so every datum keeps its own world pose
exactly; what varies from datum to datum is reported as the residual. Cameras are OpenCV with
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

from gsim.errors import InputError
from gsim.scenes.formats.convert_util import (OPENCV_PIXEL_CENTRE_SHIFT, camera_from_params, check_image, make_pose,
                                              mean_pose, pose_difference, timestamp_us)
from gsim.scenes.log import ActorTrack, LogFormatError, LogWriter
from gsim.transforms import invert, quat_to_rotmat

DATASET_PREFIX = "scene_dataset"  # scene_dataset_v1.0.json lists scenes; scene_<sha1>.json is one
BOX_3D = "1"  # DGP's annotation type id of bounding_box_3d (ontology and datum annotation keys)
# metres, degrees: how far the ego pose a datum implies may be from its time's reference datum's. Calibration
# error (millimetres, hundredths of a degree) and timing (a pose taken at the exposure while the datum carries
# the sweep's time: 30 m/s x 10 ms = 0.3 m, 30 deg/s x 10 ms = 0.3 deg) stay below; a datum of another time,
# a wrong extrinsic or a swapped pose is metres or tens of degrees off.
EGO_DISAGREEMENT_BOUND = (0.5, 2.0)
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
            raise InputError(f"{src}: expected one scene.json or scene_*.json, found "
                             f"{[p.name for p in found] or 'none'} (pass a scene JSON or the dataset JSON)")
        else:
            return found, False
    d = _load_json(src)
    if "scene_splits" not in d:
        if "samples" not in d:
            raise InputError(f"{src}: neither a DGP scene (no 'samples') nor a dataset (no 'scene_splits')")
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
        raise InputError(f"{src}: no such scene directory or JSON file")
    scenes, dataset = _scene_files(src)
    if not dataset:
        return [_convert_scene(scenes[0], out, progress)]
    names = [p.parent.name for p in scenes]
    if len(set(names)) != len(names):
        raise InputError(f"{src}: several scenes share a folder name ({names}); convert them one by one")
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
    T_world_sensor: np.ndarray  # the datum's recorded pose


@dataclass
class _Box:
    class_id: int
    file: Path
    sizes: List[Tuple[float, float, float]] = field(default_factory=list)  # (length, width, height) per sample
    track: Dict[int, np.ndarray] = field(default_factory=dict)  # timestamp -> T_world_actor


@dataclass
class _Scene:
    sensors: Dict[str, tuple] = field(default_factory=dict)  # name -> (kind, intrinsics dict, T_vehicle_sensor, camera)
    frames: List[Tuple[int, Dict[str, _Datum]]] = field(default_factory=list)
    boxes: Dict[str, _Box] = field(default_factory=dict)  # by instance id
    skipped: set = field(default_factory=set)  # datum types gsim does not convert


def _read_datum(scene: _Scene, calib: dict, d: dict, where: str, root: Path) -> Optional[_Datum]:
    """Check one datum against the calibration, record its sensor, its ego pose and its boxes."""
    ident = _get(d, "id", where, dict)
    name = _get(ident, "name", f"{where}.id", str)
    t = timestamp_us(_get(ident, "timestamp", f"{where}.id"), f"{where}.id.timestamp")
    value = _get(d, "datum", where, dict)
    field_ = "image" if "image" in value else "point_cloud" if "point_cloud" in value else None
    if field_ is None:
        scene.skipped.update(value)
        return None
    dw = f"{where}.datum.{field_}"
    datum = _Datum(name, "camera" if field_ == "image" else "lidar", t, value[field_], dw,
                   _pose(value[field_].get("pose"), f"{dw}.pose"))
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
    box_file = datum.value.get("annotations", {}).get(BOX_3D) if datum.kind == "lidar" else None
    if box_file is not None:
        _add_boxes(root / box_file, t, datum.T_world_sensor, scene.boxes)
    return datum


def _reference_order(datums: List[_Datum]) -> List[str]:
    """Sensors in the order they give a time its ego pose: LiDARs, then cameras, each by name."""
    kinds = {d.sensor: d.kind for d in datums}
    return sorted(kinds, key=lambda n: (kinds[n] != "lidar", n))


def reference_ego(datums: List[_Datum], extrinsics: Dict[str, np.ndarray]
                  ) -> Tuple[Dict[int, np.ndarray], Dict[str, np.ndarray], List[str]]:
    """Ego poses from one reference datum per time (see the module docstring).

    ``extrinsics``: {sensor: T_vehicle_sensor} from the calibration. Returns ({time: T_world_vehicle},
    {sensor: T_vehicle_sensor for the log}, notes: the rule, then the disagreement of each sensor compared
    with a reference). Raises LogFormatError naming the datum, the sensor, the time and the numbers beyond
    EGO_DISAGREEMENT_BOUND."""
    ego: Dict[int, Tuple[np.ndarray, _Datum]] = {}  # time -> (T_world_vehicle, its reference datum)
    order = _reference_order(datums)
    used, notes = {}, [f"ego pose of a time: the recorded world pose of the first of {order} with a datum at that "
                       f"time (its reference datum), through that sensor's extrinsic; the other datums of the time "
                       f"are compared with it:"]
    for name in order:
        own = [d for d in datums if d.sensor == name]
        shared = [d for d in own if d.timestamp_us in ego]
        T = extrinsics[name]
        if shared:
            diffs = np.array([_disagreement(d, T, *ego[d.timestamp_us]) for d in shared])
            implied = [invert(ego[d.timestamp_us][0]) @ d.T_world_sensor for d in shared]
            T = mean_pose(implied)  # reproduces every datum's own pose when the disagreement is constant
            residual = np.max([pose_difference(T, I) for I in implied], axis=0)
            med, worst = np.median(diffs, axis=0), diffs.max(axis=0)
            refs = ", ".join(sorted({ego[d.timestamp_us][1].sensor for d in shared}))
            notes.append(f"{name}: {len(shared)} datums at the times of reference datums ({refs}) imply ego poses "
                         f"median {med[0]:.3g} m / {med[1]:.3g} deg, max {worst[0]:.3g} m / {worst[1]:.3g} deg "
                         f"from theirs; its extrinsic is their mean, which keeps each datum's own world pose within "
                         f"{residual[0]:.3g} m / {residual[1]:.3g} deg")
        for d in own:
            ego.setdefault(d.timestamp_us, (d.T_world_sensor @ invert(T), d))
        used[name] = T
    return {t: E for t, (E, _) in ego.items()}, used, notes


def _disagreement(d: _Datum, T_vehicle_sensor: np.ndarray, T_world_vehicle: np.ndarray, ref: _Datum
                  ) -> Tuple[float, float]:
    """(metres, degrees) between the ego pose datum ``d`` implies and its time's reference one, within the bound."""
    m, deg = pose_difference(T_world_vehicle, d.T_world_sensor @ invert(T_vehicle_sensor))
    if m > EGO_DISAGREEMENT_BOUND[0] or deg > EGO_DISAGREEMENT_BOUND[1]:
        raise LogFormatError(f"{d.where}.pose: sensor {d.sensor!r} at {d.timestamp_us} us implies an ego pose "
                             f"{m:.3f} m / {deg:.3f} deg from the one of {ref.sensor!r}'s datum at that time "
                             f"({ref.where}); the bound is {EGO_DISAGREEMENT_BOUND[0]} m / "
                             f"{EGO_DISAGREEMENT_BOUND[1]} deg")
    return m, deg


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
            datum = _read_datum(out, calib, data[key], f"{where}: datum {key}", root)
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
    ego, extrinsics, ego_notes = reference_ego([d for _, obs in scene.frames for d in obs.values()],
                                               {n: v[2] for n, v in scene.sensors.items()})
    with LogWriter(out, name=name, source="dgp") as w:
        for n, (kind, _, _, cam) in scene.sensors.items():
            if kind == "camera":
                w.add_camera(n, cam, extrinsics[n])
            else:
                w.add_lidar(n, extrinsics[n])
        for t in sorted(ego):
            w.add_ego_pose(t, ego[t])
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
            "vehicle frame = DGP's calibration (ego) frame", *ego_notes,
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


# gsim convert's subcommand for this format: its help line, what SRC (and OUT) is, options the converter takes
HELP = "TRI's DGP (DDAD): a scene folder or the dataset JSON (every scene)"
SRC = "a scene folder or a scene_dataset*.json"
