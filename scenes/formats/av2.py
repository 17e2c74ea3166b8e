"""Argoverse 2 Sensor Dataset (and the AV2 LiDAR Dataset's logs) -> gsim driving log.

An AV2 log folder (``<split>/<log id>/``) holds Apache Feather tables (Arrow IPC, read with pyarrow):

    city_SE3_egovehicle.feather               timestamp_ns, qw, qx, qy, qz, tx_m, ty_m, tz_m (~170 Hz)
    calibration/egovehicle_SE3_sensor.feather sensor_name, qw, qx, qy, qz, tx_m, ty_m, tz_m
    calibration/intrinsics.feather            sensor_name, fx_px, fy_px, cx_px, cy_px, k1, k2, k3,
                                              height_px, width_px (needed only where there are images)
    sensors/lidar/<timestamp_ns>.feather      x, y, z (float16, m), intensity (uint8), laser_number (0-63),
                                              offset_ns (from the sweep's timestamp)
    sensors/cameras/<camera>/<timestamp_ns>.jpg
    annotations.feather                       timestamp_ns, track_uuid, category, length_m, width_m, height_m,
                                              qw, qx, qy, qz, tx_m, ty_m, tz_m, num_interior_pts (optional)

Conventions, each conversion written out:

- Time: AV2 nanoseconds (an arbitrary epoch) -> integer microseconds rounded to the nearest, halves up:
  ``(ns + 500) // 1000``. Pose rows 1 ns apart (the table has such pairs, equal to 1e-9) that round to the same
  microsecond keep the first.
- World = AV2's city frame (metres, z up; the log's map frame). Vehicle = AV2's egovehicle frame (x forward,
  y left, z up), as gsim's. ``T_world_vehicle = city_SE3_egovehicle`` (a quaternion (w, x, y, z) and a
  translation); between rows gsim interpolates (linear translation, slerp rotation).
- ``T_vehicle_sensor = egovehicle_SE3_sensor`` of each sensor_name, for cameras and LiDARs alike.
- Cameras: AV2 camera frames are OpenCV's (x right, y down, z forward: ring_front_center's z axis is the
  vehicle's x, its y axis the vehicle's -z), so no axis change. "All camera imagery is provided in an
  undistorted format" (AV2 user guide; the devkit projects with K alone), so each camera is a
  `PinholeCamera` (fx_px, fy_px, cx_px + 0.5, cy_px + 0.5: AV2 puts pixel centres at integers, as OpenCV,
  gsim at +0.5) and k1, k2, k3 are ignored. The nine cameras are global shutter (readout 0). A camera whose
  folder holds no image is left out of the log (noted).
- LiDAR: a sweep file merges two Velodyne VLP-32C: laser_number 0-31 is ``up_lidar``, 32-63 ``down_lidar``
  (checked on the real sample: each half's per-laser elevations, in its own LiDAR's frame, are the VLP-32C
  table). AV2 has already motion-compensated every point into the egovehicle frame at the sweep's timestamp
  t. gsim stores points in the sensor frame at the point's own time, with that time as a 5th column, and its
  consumers place each point with the ego pose at t + offset. So each point goes back into its LiDAR's frame
  at its own time: ``p_lidar = inv(T_world_vehicle(t + o) @ T_vehicle_lidar) @ T_world_vehicle(t) @ p_ego``
  with ``o = offset_ns`` rounded to the microsecond, and o is stored: a consumer that applies the per-point
  ego pose gets AV2's compensated point back (exactly, up to float32), and each ray leaves from where the
  LiDAR was when it fired. x, y, z are float16 in AV2 (rounded by at most 2^-11 of a coordinate's size:
  1.6 cm at 50 m).
  Intensity uint8 0-255 -> [0, 1] by /255. Beams: the nominal VLP-32C table (datasheet, `LidarSpec`'s
  preset), not a per-unit calibration.
- Frames: one per sweep file (both LiDARs, the sweep's timestamp) with the images that follow it, at most one
  per camera; images of a camera seen again before the next sweep open a camera-only frame (AV2's cameras
  run at 20 Hz, its LiDARs at 10 Hz).
- Actors: annotations.feather cuboids: centre (tx, ty, tz) and rotation in the egovehicle frame at their
  timestamp, length along the box's x, width y, height z (as gsim's box frame), so
  ``T_world_actor = T_world_vehicle(t) @ [R(q) | t]``; tracked by track_uuid (`TrackBuilder`: the actor id is
  the uuid, AV2's class kept in metadata["class"], classes mapped by `CATEGORIES`).
- Span: annotations and poses cover the whole log, the sensor files may be fewer (a sample, a download in
  parts): cuboids and poses are kept within the converted sensor data's span (first timestamp to the last
  point's time) +- ``CROP_MARGIN_US`` (poses also the row on each side, for interpolation), and the count
  of what was dropped goes to the notes. A sensor time outside the pose table is refused (gsim would clamp).
- Partial logs: no pose table or no egovehicle_SE3_sensor.feather -> refused naming the file; images without
  intrinsics.feather -> refused; no annotations.feather -> no actors (noted); no sweeps -> a camera-only log,
  no images -> a LiDAR-only log (noted); neither -> refused. The map (map/) is not converted.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from gsim.errors import InputError, MissingExtra
from gsim.lidar import LidarSpec
from gsim.scenes.formats.convert_util import (OPENCV_PIXEL_CENTRE_SHIFT, TrackBuilder, camera_from_params, check_image,
                                              ns_to_us)
from gsim.scenes.log import LidarBeams, LogFormatError, LogWriter
from gsim.transforms import interpolate_poses, invert, quat_to_rotmat, transform_each

POSES = "city_SE3_egovehicle.feather"
EXTRINSICS = "calibration/egovehicle_SE3_sensor.feather"
INTRINSICS = "calibration/intrinsics.feather"
ANNOTATIONS = "annotations.feather"
LIDAR_DIR = "sensors/lidar"
CAMERA_DIR = "sensors/cameras"
LIDARS = (("up_lidar", 0), ("down_lidar", 32))  # name, first laser_number; 32 lasers each (two VLP-32C)
LASERS_PER_LIDAR = 32
INTENSITY_MAX = 255.0
# Two annotation periods (AV2 labels at 10 Hz): images just outside the sweeps' span still get bracketing boxes
CROP_MARGIN_US = 200_000
QUAT_NORM_TOLERANCE = 1e-3  # the tables' quaternions are unit to ~1e-9; beyond this a row is not a rotation

_VLP32C = LidarSpec.preset("velodyne-vlp32c")
VLP32C = LidarBeams(elevations_deg=tuple(_VLP32C.elevations_deg), azimuth_resolution_deg=_VLP32C.azimuth_resolution_deg,
                    min_range_m=_VLP32C.min_range_m, max_range_m=_VLP32C.max_range_m)

# AV2's 30 classes (user guide) -> gsim's actor categories; any other class becomes "other"
CATEGORIES = {
    "REGULAR_VEHICLE": "car",
    "LARGE_VEHICLE": "truck", "BOX_TRUCK": "truck", "TRUCK": "truck", "TRUCK_CAB": "truck",
    "BUS": "bus", "SCHOOL_BUS": "bus", "ARTICULATED_BUS": "bus",
    "PEDESTRIAN": "pedestrian", "OFFICIAL_SIGNALER": "pedestrian",
    "BICYCLIST": "cyclist", "BICYCLE": "cyclist",
    "MOTORCYCLIST": "motorcycle", "MOTORCYCLE": "motorcycle",
    "CONSTRUCTION_CONE": "cone",
    "BOLLARD": "barrier", "CONSTRUCTION_BARREL": "barrier",
    "SIGN": "sign", "STOP_SIGN": "sign", "MOBILE_PEDESTRIAN_SIGN": "sign",
}

_POSE_COLUMNS = ("qw", "qx", "qy", "qz", "tx_m", "ty_m", "tz_m")


def _pyarrow():
    try:
        import pyarrow.feather as feather
    except ImportError as e:
        raise MissingExtra(f"reading Argoverse 2 feather files needs pyarrow ({e}); install it with: "
                           f"pip install -e \".[formats]\"") from None
    return feather


def read_table(path: Path, columns: Dict[str, str]) -> Dict[str, object]:
    """The named columns of a feather file: kind "float" -> float64 array (finite), "int" -> int64 array,
    "str" -> list of str. Errors name the file and the column."""
    feather = _pyarrow()
    import pyarrow as pa
    if not path.is_file():
        raise LogFormatError(f"{path}: file missing")
    try:
        table = feather.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise LogFormatError(f"{path}: not a readable feather (Arrow IPC) file ({e})") from None
    out = {}
    for name, kind in columns.items():
        if name not in table.column_names:
            raise LogFormatError(f"{path}: column {name!r} missing (expected {list(columns)}, "
                                 f"the file has {table.column_names})")
        col = table[name]
        t = col.type
        ok = {"float": pa.types.is_floating(t) or pa.types.is_integer(t), "int": pa.types.is_integer(t),
              "str": pa.types.is_string(t) or pa.types.is_large_string(t)}[kind]
        if not ok:
            raise LogFormatError(f"{path}: column {name!r} is {t}, expected {'a number' if kind == 'float' else kind}")
        if col.null_count:
            raise LogFormatError(f"{path}: column {name!r} has {col.null_count} empty values")
        if kind == "str":
            out[name] = col.to_pylist()
            continue
        a = col.to_numpy().astype(np.float64 if kind == "float" else np.int64)
        if kind == "float" and not np.all(np.isfinite(a)):
            raise LogFormatError(f"{path}: column {name!r}: NaN or inf at row {int(np.argmin(np.isfinite(a)))}")
        out[name] = a
    return out


def _rigid(cols: Dict[str, np.ndarray], path: Path) -> np.ndarray:
    """(N,4,4) transforms from the columns qw, qx, qy, qz, tx_m, ty_m, tz_m (unit quaternions, renormalised)."""
    q = np.stack([cols[k] for k in _POSE_COLUMNS[:4]], 1)
    norm = np.linalg.norm(q, axis=1)
    bad = np.nonzero(np.abs(norm - 1) > QUAT_NORM_TOLERANCE)[0]
    if len(bad):
        raise LogFormatError(f"{path}: row {bad[0]}: qw, qx, qy, qz is not a unit quaternion (norm {norm[bad[0]]:.6g})")
    T = np.tile(np.eye(4), (len(q), 1, 1))
    T[:, :3, :3] = quat_to_rotmat(q / norm[:, None])
    T[:, :3, 3] = np.stack([cols[k] for k in _POSE_COLUMNS[4:]], 1)
    return T


def read_ego_poses(path: Path) -> Tuple[np.ndarray, np.ndarray, int]:
    """(times_us (P,), T_world_vehicle (P,4,4), rows dropped as repeats of a microsecond) of the pose table."""
    cols = read_table(path, {"timestamp_ns": "int", **{k: "float" for k in _POSE_COLUMNS}})
    ns = cols["timestamp_ns"]
    if len(ns) == 0:
        raise LogFormatError(f"{path}: no rows")
    back = np.nonzero(np.diff(ns) < 0)[0]
    if len(back):
        raise LogFormatError(f"{path}: row {back[0] + 1}: timestamp_ns out of order "
                             f"({ns[back[0] + 1]} after {ns[back[0]]})")
    us = ns_to_us(ns)
    keep = np.r_[True, np.diff(us) > 0]
    return us[keep], _rigid(cols, path)[keep], int((~keep).sum())


def read_extrinsics(path: Path) -> Dict[str, np.ndarray]:
    """{sensor_name: T_vehicle_sensor} of egovehicle_SE3_sensor.feather."""
    cols = read_table(path, {"sensor_name": "str", **{k: "float" for k in _POSE_COLUMNS}})
    names = cols["sensor_name"]
    if len(set(names)) != len(names):
        raise LogFormatError(f"{path}: sensor_name: a sensor appears twice ({sorted(names)})")
    return dict(zip(names, _rigid(cols, path)))


def read_intrinsics(path: Path) -> Dict[str, dict]:
    """{sensor_name: {fx_px, fy_px, cx_px, cy_px, k1, k2, k3, width_px, height_px}} of intrinsics.feather."""
    fields = ("fx_px", "fy_px", "cx_px", "cy_px", "k1", "k2", "k3")
    cols = read_table(path, {"sensor_name": "str", **{k: "float" for k in fields},
                             "height_px": "int", "width_px": "int"})
    names = cols["sensor_name"]
    if len(set(names)) != len(names):
        raise LogFormatError(f"{path}: sensor_name: a camera appears twice ({sorted(names)})")
    return {n: {k: cols[k][i].item() for k in (*fields, "width_px", "height_px")} for i, n in enumerate(names)}


def read_sweep(path: Path) -> Dict[str, np.ndarray]:
    """One sweep file: xyz (N,3) float64 egovehicle frame, intensity (N,) in [0,1], laser (N,), offset_ns (N,)."""
    cols = read_table(path, {"x": "float", "y": "float", "z": "float", "intensity": "int",
                             "laser_number": "int", "offset_ns": "int"})
    for name, hi in (("intensity", int(INTENSITY_MAX)), ("laser_number", 2 * LASERS_PER_LIDAR - 1)):
        bad = np.nonzero((cols[name] < 0) | (cols[name] > hi))[0]
        if len(bad):
            raise LogFormatError(f"{path}: column {name!r}: {cols[name][bad[0]]} at row {bad[0]}, expected 0..{hi}")
    return {"xyz": np.stack([cols["x"], cols["y"], cols["z"]], 1), "laser": cols["laser_number"],
            "intensity": (cols["intensity"] / INTENSITY_MAX).astype(np.float32), "offset_ns": cols["offset_ns"]}


def _timed_files(folder: Path, suffix: str) -> List[Tuple[int, Path]]:
    """(timestamp_ns, path) of the files named <timestamp_ns><suffix>, by time."""
    out = []
    for p in sorted(folder.glob(f"*{suffix}")):
        if not p.stem.isdigit():
            raise LogFormatError(f"{p}: expected a file named by its timestamp in nanoseconds (<digits>{suffix})")
        out.append((int(p.stem), p))
    return sorted(out)


def _unique_us(files: List[Tuple[int, Path]]) -> List[Tuple[int, Path]]:
    """(timestamp_us, path): two files of one sensor within a microsecond would be one observation twice."""
    out = [(ns_to_us(t), p) for t, p in files]
    for (a, pa_), (b, pb) in zip(out, out[1:]):
        if a == b:
            raise LogFormatError(f"{pb}: same microsecond ({b} us) as {pa_.name}: two observations of one sensor")
    return out


def to_lidar_frames(xyz_ego: np.ndarray, t_us: int, offsets_us: np.ndarray, T_vehicle_lidar: np.ndarray,
                    ego_times: np.ndarray, ego_poses: np.ndarray) -> np.ndarray:
    """(N,3) egovehicle-frame points compensated to ``t_us`` -> the LiDAR's frame at each point's own time
    ``t_us + offsets_us``: ``inv(T_world_vehicle(t + o) @ T_vehicle_lidar) @ T_world_vehicle(t) @ p``."""
    times, inv = np.unique(t_us + offsets_us, return_inverse=True)
    T_world_ego = interpolate_poses(ego_times, ego_poses, [t_us])[0]
    T_lidar_ego = invert(interpolate_poses(ego_times, ego_poses, times) @ T_vehicle_lidar) @ T_world_ego
    return transform_each(T_lidar_ego[inv.ravel()], xyz_ego)


def _events(log_dir: Path, cameras: List[str]) -> List[Tuple[int, int, str, Path]]:
    """(timestamp_us, 0 for a sweep | 1 for an image, sensor, file) by time, sweeps first at equal times."""
    ev = [(t, 0, "lidar", p) for t, p in _unique_us(_timed_files(log_dir / LIDAR_DIR, ".feather"))]
    for c in cameras:
        ev += [(t, 1, c, p) for t, p in _unique_us(_timed_files(log_dir / CAMERA_DIR / c, ".jpg"))]
    return sorted(ev, key=lambda e: e[:3])


def group_frames(events: List[Tuple[int, int, str, Path]]) -> List[List[Tuple[int, int, str, Path]]]:
    """Frames of observations (see the module docstring): a sweep opens a frame; so does a sensor seen again.
    A frame's time is its first observation's; strictly increasing since a sensor never repeats a microsecond."""
    frames: List[list] = []
    for e in events:
        if not frames or e[1] == 0 or any(o[1:3] == e[1:3] for o in frames[-1]):
            frames.append([])
        frames[-1].append(e)
    return frames


def _cameras(log_dir: Path, extrinsics: Dict[str, np.ndarray], notes: List[str]) -> Dict[str, tuple]:
    """{camera: (PinholeCamera, T_vehicle_camera)} of the camera folders holding images."""
    folder = log_dir / CAMERA_DIR
    named = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    with_images = [c for c in named if any((folder / c).glob("*.jpg"))]
    if not with_images:
        notes.append(f"no camera images (no {CAMERA_DIR}/<camera>/<timestamp_ns>.jpg): the log has no cameras")
        return {}
    if len(with_images) < len(named):
        notes.append(f"camera folders without images left out: {sorted(set(named) - set(with_images))}")
    intrinsics = read_intrinsics(log_dir / INTRINSICS)
    out = {}
    for c in with_images:
        if c not in intrinsics:
            raise LogFormatError(f"{log_dir / INTRINSICS}: camera {c!r} has images but no row "
                                 f"(rows: {sorted(intrinsics)})")
        if c not in extrinsics:
            raise LogFormatError(f"{log_dir / EXTRINSICS}: camera {c!r} has images but no row "
                                 f"(rows: {sorted(extrinsics)})")
        k = intrinsics[c]
        cam = camera_from_params(f"{log_dir / INTRINSICS}: {c}", k["width_px"], k["height_px"], k["fx_px"],
                                 k["fy_px"], k["cx_px"] + OPENCV_PIXEL_CENTRE_SHIFT,
                                 k["cy_px"] + OPENCV_PIXEL_CENTRE_SHIFT)
        out[c] = (cam, extrinsics[c])
    notes.append(f"cameras {with_images}: pinhole from fx_px, fy_px, cx_px + 0.5, cy_px + 0.5 (AV2 images are "
                 f"undistorted; k1, k2, k3 ignored), T_vehicle_camera = egovehicle_SE3_sensor (OpenCV axes), "
                 f"global shutter; images copied as they are")
    return out


def _span(frames, sweeps: Dict[Path, dict]) -> Tuple[int, int]:
    """First and last microsecond of the converted sensor data (a sweep's points' own times included)."""
    first, last = frames[0][0][0], frames[-1][-1][0]
    for t, kind, _, p in (o for f in frames for o in f):
        if kind == 0 and len(sweeps[p]["offset_ns"]):
            first = min(first, t + int(ns_to_us(sweeps[p]["offset_ns"].min())))
            last = max(last, t + int(ns_to_us(sweeps[p]["offset_ns"].max())))
    return first, last


def _crop_poses(times: np.ndarray, poses: np.ndarray, lo: int, hi: int) -> Tuple[np.ndarray, np.ndarray]:
    """Rows within [lo, hi] and the row on each side (so interpolation inside is that of the whole table)."""
    a = max(int(np.searchsorted(times, lo, side="left")) - 1, 0)
    b = min(int(np.searchsorted(times, hi, side="right")) + 1, len(times))
    return times[a:b], poses[a:b]


def _actors(path: Path, lo: int, hi: int, ego_times: np.ndarray, ego_poses: np.ndarray, notes: List[str]):
    if not path.is_file():
        notes.append(f"no {ANNOTATIONS}: the log has no actors")
        return []
    cols = read_table(path, {"timestamp_ns": "int", "track_uuid": "str", "category": "str", "length_m": "float",
                             "width_m": "float", "height_m": "float", **{k: "float" for k in _POSE_COLUMNS}})
    t_us = ns_to_us(cols["timestamp_ns"])
    rows = np.nonzero((t_us >= lo) & (t_us <= hi))[0]
    T_vehicle_box = _rigid({k: cols[k][rows] for k in _POSE_COLUMNS}, path)
    T_world_vehicle = interpolate_poses(ego_times, ego_poses, t_us[rows]) if len(rows) else np.zeros((0, 4, 4))
    builder = TrackBuilder(CATEGORIES)
    for k, i in enumerate(rows):
        builder.add(cols["track_uuid"][i], cols["category"][i], int(t_us[i]), T_world_vehicle[k] @ T_vehicle_box[k],
                    (cols["length_m"][i], cols["width_m"][i], cols["height_m"][i]), f"{path}: row {i}")
    tracks = builder.tracks()
    every = len(set(cols["track_uuid"]))
    notes.append(f"actors: {ANNOTATIONS} cuboids (centre, rotation in the egovehicle frame at their timestamp, "
                 f"length along x) tracked by track_uuid; kept {len(rows)} of {len(t_us)} cuboids ({len(tracks)} of "
                 f"{every} tracks) within the sensor data's span +-{CROP_MARGIN_US / 1e6:g} s; classes mapped to "
                 f"gsim categories (AV2's class in metadata 'class', unknown ones 'other')")
    return tracks


def convert_av2(log_dir, out, progress: bool = True) -> Path:
    """Convert one Argoverse 2 Sensor (or LiDAR) Dataset log folder to a gsim log at ``out``; returns ``out``.
    See the module docstring for every convention."""
    from tqdm import tqdm
    log_dir, out = Path(log_dir), Path(out)
    if not log_dir.is_dir():
        raise InputError(f"{log_dir}: not a directory (expected an Argoverse 2 log folder holding {POSES})")
    ego_times, ego_poses, repeats = read_ego_poses(log_dir / POSES)
    extrinsics = read_extrinsics(log_dir / EXTRINSICS)
    notes = ["world = AV2 city frame (metres, z up); vehicle = AV2 egovehicle frame (x forward, y left, z up); "
             "T_world_vehicle = city_SE3_egovehicle, T_vehicle_sensor = egovehicle_SE3_sensor",
             "times: AV2 nanoseconds rounded to the nearest microsecond (halves up)"]
    cameras = _cameras(log_dir, extrinsics, notes)
    events = _events(log_dir, list(cameras))
    if not events:
        raise LogFormatError(f"{log_dir}: no sensor data (no {LIDAR_DIR}/<timestamp_ns>.feather and no camera "
                             f"images)")
    frames = group_frames(events)
    sweeps = {p: read_sweep(p) for _, kind, _, p in events if kind == 0}
    lidars = [(name, first) for name, first in LIDARS
              if any(((s["laser"] >= first) & (s["laser"] < first + LASERS_PER_LIDAR)).any() for s in sweeps.values())]
    for name, _ in lidars:
        if name not in extrinsics:
            raise LogFormatError(f"{log_dir / EXTRINSICS}: no row for {name!r}, whose points the sweeps hold "
                                 f"(rows: {sorted(extrinsics)})")
    lo, hi = _span(frames, sweeps)
    if lo < ego_times[0] or hi > ego_times[-1]:
        raise LogFormatError(f"{log_dir / POSES}: poses span {ego_times[0]}..{ego_times[-1]} us, the sensor data "
                             f"{lo}..{hi} us: times outside have no ego pose")
    all_poses = len(ego_times)
    ego_times, ego_poses = _crop_poses(ego_times, ego_poses, lo - CROP_MARGIN_US, hi + CROP_MARGIN_US)
    notes.append(f"ego poses: {len(ego_times)} of {all_poses} distinct microseconds of {POSES} ({repeats} rows "
                 f"dropped as repeats of a microsecond), the sensor data's span +-{CROP_MARGIN_US / 1e6:g} s")
    if sweeps:
        notes += [f"LiDAR {[n for n, _ in lidars]}: the sweep files merge both VLP-32C (laser_number 0-31 up_lidar, "
                  f"32-63 down_lidar), motion-compensated by AV2 to the egovehicle frame at the sweep's timestamp; "
                  f"each point is put back into its LiDAR's frame at its own time (timestamp + offset_ns, rounded "
                  f"to the microsecond, stored as the 5th column), so the ego pose at that time restores AV2's point",
                  "LiDAR x, y, z: float16 in AV2 (relative precision 2^-11); intensity: uint8 0-255 divided by 255",
                  "LiDAR beams: the nominal VLP-32C elevation table (datasheet), not per-unit calibration"]
    else:
        notes.append(f"no LiDAR sweeps (no {LIDAR_DIR}/<timestamp_ns>.feather): the log has no LiDARs")
    if (log_dir / "map").is_dir():
        notes.append("not converted: map/ (vector map, ground height raster)")
    actors = _actors(log_dir / ANNOTATIONS, lo - CROP_MARGIN_US, hi + CROP_MARGIN_US, ego_times, ego_poses, notes)
    name = log_dir.resolve().name
    with LogWriter(out, name=name, source="argoverse2") as w:
        for c, (cam, T) in cameras.items():
            w.add_camera(c, cam, T)
        for n, _ in lidars:
            w.add_lidar(n, extrinsics[n], VLP32C)
        for t, T in zip(ego_times, ego_poses):
            w.add_ego_pose(int(t), T)
        for k, frame in enumerate(tqdm(frames, desc=f"av2 {name}", unit="frame", disable=not progress)):
            cams, lids = {}, {}
            for t, kind, sensor, path in frame:
                if kind == 1:
                    cam = cameras[sensor][0]
                    check_image(path, cam.width, cam.height, f"{log_dir / INTRINSICS} width_px/height_px of {sensor}")
                    cams[sensor] = w.image(sensor, k, t, src=path)
                    continue
                s = sweeps[path]
                for n, first in lidars:
                    m = (s["laser"] >= first) & (s["laser"] < first + LASERS_PER_LIDAR)
                    if not m.any():
                        continue
                    offsets = ns_to_us(s["offset_ns"][m])
                    xyz = to_lidar_frames(s["xyz"][m], t, offsets, extrinsics[n], ego_times, ego_poses)
                    lids[n] = w.sweep(n, k, t, np.column_stack([xyz, s["intensity"][m], offsets]))
            w.add_frame(frame[0][0], cameras=cams, lidars=lids)
        for a in actors:
            w.add_actor(a)
        w.notes.extend(notes + ["frames: one per sweep file with the images after it (one per camera); a camera seen "
                                "again before the next sweep opens a camera-only frame"])
    return out


# gsim convert's subcommand for this format: its help line, what SRC (and OUT) is, options the converter takes
HELP = ("Argoverse 2 Sensor (or LiDAR) Dataset: one log folder (city_SE3_egovehicle.feather, calibration/, sensors/); "
        "LiDAR-only logs too")
SRC = "the log folder, e.g. sensor/val/<log id>"
