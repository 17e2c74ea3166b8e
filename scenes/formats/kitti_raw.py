"""KITTI raw -> gsim driving log.

Reads one drive of a KITTI raw date folder: the rectified colour cameras image_02 (and image_03
when present) as pinhole cameras from P_rect_0x, the Velodyne HDL-64E sweeps, ego poses from
oxts GPS/IMU when the drive has them, else estimated by kiss-icp LiDAR odometry, and actors from
the drive's ``tracklet_labels.xml`` when it has one. KITTI loses a frame of one sensor now and
then (2011_09_26_drive_0009_sync has no sweeps for frames 177-180): such frames are left out
and noted; only a sensor missing more than ``MAX_MISSING_FRAMES`` of the drive (an incomplete
download) is refused.

Frames: the vehicle frame is the Velodyne frame (x forward, y left, z up). With oxts the world
is a local east-north-up frame (Mercator, as in the KITTI raw paper) with its origin at the first
pose; with odometry the world is the first sweep's Velodyne frame. KITTI's projection of a
Velodyne point X into camera i is ``P_rect_0i @ R_rect_00 @ T_cam0_velo @ X``; with
``P_rect_0i = K [I | t_i]`` that is camera i's rectified frame ``T_cami_velo = [I | t_i] R_rect_00
T_cam0_velo``, so ``T_vehicle_camera = inv(T_cami_velo)`` and the camera model is K. A tracklet
pose (tx, ty, tz, rx, ry, rz) is its box's bottom centre and rotation (yaw rz about z) in the
Velodyne frame of frame ``first_frame + i``; the actor's box frame is centred, so its origin is
lifted by h/2 along the box's z.
"""
from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from gsim.errors import InputError
from gsim.scenes.formats.convert_util import (LidarOdometry, check_image, make_pose, nearest_rotation,
                                              rectified_camera, smoothed_odometry, timestamp_us)
from gsim.lidar import LidarSpec
from gsim.scenes.log import ActorTrack, LidarBeams, LogFormatError, LogWriter
from gsim.transforms import interpolate_pose, invert

CALIB_CAM_TO_CAM = "calib_cam_to_cam.txt"
CALIB_VELO_TO_CAM = "calib_velo_to_cam.txt"
CALIB_IMU_TO_VELO = "calib_imu_to_velo.txt"
CAMERAS = ("image_02", "image_03")  # the colour cameras; image_00/01 are greyscale
LIDAR = "velodyne_points"
TRACKLETS = "tracklet_labels.xml"
FRAME_PERIOD_US = 100_000  # KITTI records at 10 Hz
EARTH_RADIUS_M = 6378137.0
# KITTI's losses are sporadic (2011_09_26_drive_0009_sync: 4 of 447 sweeps); a sensor folder missing more than this
# fraction of the drive's frames is an incomplete download or extraction, which dropping frames would hide.
MAX_MISSING_FRAMES = 0.1

# The HDL-64E preset's nominal table (gsim.lidar: datasheet blocks, the lower one down to -24.9 deg,
# which the sample's sweeps confirm) and its 0.18 deg azimuth step at 10 Hz (the sample's spacing
# of one laser's neighbouring returns); KITTI keeps returns up to 80 m.
_HDL64E = LidarSpec.preset("velodyne-hdl64e")
HDL64E = LidarBeams(elevations_deg=_HDL64E.elevations_deg, azimuth_resolution_deg=_HDL64E.azimuth_resolution_deg,
                    min_range_m=_HDL64E.min_range_m, max_range_m=80.0)


def read_calib(path: Path) -> Dict[str, str]:
    """{key: the rest of its line} of a KITTI calibration file: ``key: values`` lines (raw, tracking's P0..P3)
    or ``key values`` (tracking's R_rect, Tr_velo_cam, Tr_imu_velo have no colon)."""
    if not path.is_file():
        raise LogFormatError(f"{path}: calibration file missing")
    out = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition(":")
        if not sep or len(key.split()) != 1:
            key, _, value = line.strip().partition(" ")
        if key.strip():
            out[key.strip()] = value
    return out


def values(calib: Dict[str, str], path: Path, key: str, n: int) -> np.ndarray:
    if key not in calib:
        raise LogFormatError(f"{path}: {key}: missing")
    try:
        v = np.array([float(x) for x in calib[key].split()])
    except ValueError:
        raise LogFormatError(f"{path}: {key}: not a list of numbers") from None
    if v.size != n or not np.all(np.isfinite(v)):
        raise LogFormatError(f"{path}: {key}: expected {n} finite numbers, got {v.size}")
    return v


def read_calibration(date_dir: Path, cameras: List[str]) -> Dict[str, tuple]:
    """{camera folder: (PinholeCamera, T_velo_cam)} from the date folder's calibration files."""
    cam_path, velo_path = date_dir / CALIB_CAM_TO_CAM, date_dir / CALIB_VELO_TO_CAM
    cam, velo = read_calib(cam_path), read_calib(velo_path)
    T_cam0_velo = make_pose(nearest_rotation(values(velo, velo_path, "R", 9).reshape(3, 3)),
                            values(velo, velo_path, "T", 3))
    R_rect_00 = make_pose(nearest_rotation(values(cam, cam_path, "R_rect_00", 9).reshape(3, 3)), np.zeros(3))
    out = {}
    for name in cameras:
        i = name[-2:]
        w, h = values(cam, cam_path, f"S_rect_{i}", 2)
        if w != int(w) or h != int(h) or w <= 0 or h <= 0:
            raise LogFormatError(f"{cam_path}: S_rect_{i}: expected a positive integer image size, got {w} {h}")
        camera, T_cam_rect = rectified_camera(values(cam, cam_path, f"P_rect_{i}", 12).reshape(3, 4), int(w), int(h),
                                              f"{cam_path}: P_rect_{i}")
        out[name] = (camera, invert(T_cam_rect @ R_rect_00 @ T_cam0_velo))
    return out


def _find_drive(date_dir: Path, drive: Optional[str]) -> Path:
    if not date_dir.is_dir():
        raise InputError(f"{date_dir}: not a directory (expected a KITTI raw date folder with {CALIB_CAM_TO_CAM})")
    drives = sorted(p for p in date_dir.glob("*_drive_*_sync") if p.is_dir())
    if drive is not None:
        chosen = [p for p in drives if p.name == drive or p.name.endswith(f"_drive_{drive}_sync")]
        if len(chosen) != 1:
            raise InputError(f"{date_dir}: drive {drive!r} not found (drives: {[p.name for p in drives]})")
        return chosen[0]
    if (date_dir / CAMERAS[0]).is_dir():
        return date_dir  # the flattened layout: sensor folders beside the calibration files
    if len(drives) == 1:
        return drives[0]
    if not drives:
        raise InputError(f"{date_dir}: no {CAMERAS[0]}/ folder and no *_drive_NNNN_sync/ folder")
    raise InputError(f"{date_dir}: several drives ({', '.join(p.name for p in drives)}); choose one with drive=")


def _stems(folder: Path, suffix: str) -> List[str]:
    if not folder.is_dir():
        raise LogFormatError(f"{folder}: folder missing")
    return sorted(p.stem for p in folder.glob(f"*{suffix}"))


def _frames(drive_dir: Path, folders: Dict[str, str]) -> Tuple[List[str], List[str]]:
    """(frame names with a file in every sensor folder, notes on the frames left out).

    ``folders``: {sensor folder: file suffix}. Raises LogFormatError naming the first missing file when a
    folder lacks more than MAX_MISSING_FRAMES of the drive's frames."""
    stems = {}
    for sensor, suffix in folders.items():
        stems[sensor] = set(_stems(drive_dir / sensor / "data", suffix))
        if not all(s.isdigit() for s in stems[sensor]):
            raise LogFormatError(f"{drive_dir / sensor / 'data'}: expected frame files named by their index "
                                 f"(0000000000{suffix}, ...)")
    if not stems[LIDAR]:
        raise LogFormatError(f"{drive_dir / LIDAR / 'data'}: no .bin sweeps")
    drive = set().union(*stems.values())
    notes = []
    for sensor, suffix in folders.items():
        missing = sorted(drive - stems[sensor])
        if len(missing) > MAX_MISSING_FRAMES * len(drive):
            raise LogFormatError(f"{drive_dir / sensor / 'data' / (missing[0] + suffix)}: missing, as are "
                                 f"{len(missing) - 1} more of the drive's {len(drive)} frames (more than "
                                 f"{MAX_MISSING_FRAMES:.0%}: an incomplete download?)")
        if missing:
            notes.append(f"frames left out, {sensor} has no file for them: {', '.join(missing[:10])}"
                         + (f" and {len(missing) - 10} more" if len(missing) > 10 else ""))
    return sorted(set.intersection(*stems.values())), notes


def sweep_path_checked(path: Path) -> Path:
    size = path.stat().st_size
    if size == 0 or size % 16:
        raise LogFormatError(f"{path}: {size} bytes is not a whole number of float32 (x, y, z, reflectance) "
                             f"records of 16 bytes (truncated?)")
    return path


def read_sweep(path: Path) -> np.ndarray:
    pts = np.fromfile(path, dtype=np.float32).reshape(-1, 4)
    if not np.all(np.isfinite(pts)):
        raise LogFormatError(f"{path}: contains NaN or inf")
    return pts


def _timestamps(folder: Path, frames: List[str]) -> Optional[List[int]]:
    """Per-frame times from ``folder/timestamps.txt`` (line k is frame k), or None if the file is absent."""
    path = folder / "timestamps.txt"
    if not path.is_file():
        return None
    lines = path.read_text().splitlines()
    out = []
    for f in frames:
        k = int(f)
        if k >= len(lines):
            raise LogFormatError(f"{path}: no line {k + 1} for frame {f} (the file has {len(lines)} lines)")
        out.append(timestamp_us(lines[k], f"{path}: line {k + 1}"))
    return out


def _read_oxts(drive_dir: Path, date_dir: Path, frames: List[str]) -> np.ndarray:
    """(F,4,4) T_world_velo (`oxts_poses`) of the frames' oxts records and the IMU-Velodyne calibration."""
    path = date_dir / CALIB_IMU_TO_VELO
    calib = read_calib(path)
    T_imu_velo = invert(make_pose(nearest_rotation(values(calib, path, "R", 9).reshape(3, 3)),
                                  values(calib, path, "T", 3)))
    records = []
    for f in frames:
        p = drive_dir / "oxts" / "data" / f"{f}.txt"
        try:
            lat, lon, alt, roll, pitch, yaw = (float(x) for x in p.read_text().split()[:6])
        except ValueError:
            raise LogFormatError(f"{p}: expected lat lon alt roll pitch yaw ... numbers") from None
        records.append((lat, lon, alt, roll, pitch, yaw))
    return oxts_poses(np.array(records), T_imu_velo)


def oxts_poses(records: np.ndarray, T_imu_velo: np.ndarray) -> np.ndarray:
    """(F,4,4) T_world_velo from oxts GPS/IMU records (F,6) lat, lon (degrees), alt (m), roll, pitch, yaw (rad)
    of the IMU (x forward, y left, z up): Mercator east-north-up positions at the scale of the first record's
    latitude, world origin at the first record, composed with ``T_imu_velo`` (Velodyne points into the IMU)."""
    poses, scale, origin = [], None, None
    for lat, lon, alt, roll, pitch, yaw in np.asarray(records, np.float64):
        if scale is None:
            scale = math.cos(math.radians(lat))  # Mercator scale of the first record, kept for the drive
        t = np.array([scale * EARTH_RADIUS_M * math.radians(lon),
                      scale * EARTH_RADIUS_M * math.log(math.tan(math.radians(90.0 + lat) / 2)), alt])
        origin = t if origin is None else origin
        poses.append(make_pose(rotation(roll, pitch, yaw), t - origin) @ T_imu_velo)
    return np.stack(poses)


def rotation(roll: float, pitch: float, yaw: float) -> np.ndarray:
    """Rz(yaw) Ry(pitch) Rx(roll), radians: the oxts and tracklet convention."""
    cr, sr, cp, sp, cy, sy = (math.cos(roll), math.sin(roll), math.cos(pitch), math.sin(pitch),
                              math.cos(yaw), math.sin(yaw))
    return (np.array([[cy, -sy, 0], [sy, cy, 0], [0, 0, 1]]) @ np.array([[cp, 0, sp], [0, 1, 0], [-sp, 0, cp]])
            @ np.array([[1, 0, 0], [0, cr, -sr], [0, sr, cr]]))


@dataclass(frozen=True)
class Tracklet:
    """One object of ``tracklet_labels.xml``; pose i is in the Velodyne frame of frame ``first_frame + i``."""

    category: str  # objectType in lower case
    size: Tuple[float, float, float]  # length, width, height (m)
    first_frame: int
    poses: np.ndarray  # (N,6) tx, ty, tz (the box's bottom centre, m), rx, ry, rz (rad)


def _items(el: ET.Element, where: str) -> List[ET.Element]:
    """The <item> children of a boost-serialised list, checked against its <count> where present."""
    items = el.findall("item")
    count = el.findtext("count")
    if count is not None and count.strip() != str(len(items)):
        raise LogFormatError(f"{where}/count: says {count.strip()!r}, found {len(items)} <item> elements")
    return items


def _number(el: ET.Element, tag: str, where: str, kind: type = float):
    text = el.findtext(tag)
    if text is None:
        raise LogFormatError(f"{where}/{tag}: missing")
    try:
        v = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise LogFormatError(f"{where}/{tag}: expected {what}, got {text!r}") from None
    if not math.isfinite(v):
        raise LogFormatError(f"{where}/{tag}: expected a finite number, got {text!r}")
    return v


def read_tracklets(path: Path) -> List[Tracklet]:
    """Parse a KITTI raw ``tracklet_labels.xml``; errors name the file and the element."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        raise LogFormatError(f"{path}: not a readable XML file ({e})") from None
    tracklets = root if root.tag == "tracklets" else root.find("tracklets")
    if tracklets is None:
        raise LogFormatError(f"{path}: no <tracklets> element")
    out = []
    for i, item in enumerate(_items(tracklets, f"{path}: tracklets")):
        where = f"{path}: tracklets/item[{i}]"
        category = (item.findtext("objectType") or "").strip().lower()
        if not category:
            raise LogFormatError(f"{where}/objectType: missing")
        size = tuple(_number(item, k, where) for k in ("l", "w", "h"))
        if min(size) <= 0:
            raise LogFormatError(f"{where}: l, w, h must be > 0 metres, got {size}")
        first = _number(item, "first_frame", where, int)
        if first < 0:
            raise LogFormatError(f"{where}/first_frame: expected a frame index >= 0, got {first}")
        poses = item.find("poses")
        if poses is None:
            raise LogFormatError(f"{where}/poses: missing")
        rows = [[_number(p, k, f"{where}/poses/item[{j}]") for k in ("tx", "ty", "tz", "rx", "ry", "rz")]
                for j, p in enumerate(_items(poses, f"{where}/poses"))]
        if not rows:
            raise LogFormatError(f"{where}/poses: no <item>")
        out.append(Tracklet(category, size, first, np.array(rows)))
    return out


def _actors(tracklets: List[Tracklet], sweeps: Dict[int, Tuple[int, np.ndarray]]) -> List[ActorTrack]:
    """Actor tracks at the converted sweeps: {frame index: (timestamp_us, T_world_velo)}."""
    out = []
    for i, tr in enumerate(tracklets):
        ts, poses = [], []
        for j, (tx, ty, tz, rx, ry, rz) in enumerate(tr.poses):
            if tr.first_frame + j in sweeps:
                t, T_world_velo = sweeps[tr.first_frame + j]
                R = rotation(rx, ry, rz)
                ts.append(t)
                poses.append(T_world_velo @ make_pose(R, [tx, ty, tz] + R[:, 2] * tr.size[2] / 2))
        if ts:
            out.append(ActorTrack(f"tracklet_{i}", tr.category, tr.size, np.array(ts, np.int64), np.stack(poses)))
    return out


def convert_kitti_raw(date_dir, out, drive: Optional[str] = None, max_frames: Optional[int] = None,
                      progress: bool = True) -> Path:
    """Convert one KITTI raw drive to a gsim log at ``out``; returns ``out``.

    ``date_dir`` holds the calibration files; the drive's sensor folders are either beside them or in
    ``<date>_drive_NNNN_sync/`` (``drive`` = "NNNN" or the folder name chooses one of several).
    ``max_frames`` keeps the first frames only. Raises LogFormatError naming the file for missing or
    malformed input, ImportError when poses must be estimated and kiss-icp is missing."""
    from tqdm import tqdm
    date_dir = Path(date_dir)
    if max_frames is not None and (not isinstance(max_frames, int) or max_frames < 1):
        raise InputError(f"max_frames: expected a positive integer, got {max_frames!r}")
    drive_dir = _find_drive(date_dir, drive)
    cameras = [c for c in CAMERAS if (drive_dir / c).is_dir()]
    if CAMERAS[0] not in cameras:
        raise LogFormatError(f"{drive_dir / CAMERAS[0]}: folder missing")
    calib = read_calibration(date_dir, cameras)
    has_oxts = (drive_dir / "oxts" / "data").is_dir()
    frames, left_out = _frames(drive_dir, {LIDAR: ".bin", **{c: ".png" for c in cameras},
                                           **({"oxts": ".txt"} if has_oxts else {})})
    frames = frames[:max_frames]
    tracklets = read_tracklets(drive_dir / TRACKLETS) if (drive_dir / TRACKLETS).is_file() else []
    sweeps = [sweep_path_checked(drive_dir / LIDAR / "data" / f"{f}.bin") for f in frames]
    for cam in cameras:
        for f in frames:
            check_image(drive_dir / cam / "data" / f"{f}.png", calib[cam][0].width, calib[cam][0].height,
                        f"{CALIB_CAM_TO_CAM} S_rect_{cam[-2:]}")

    notes = ["vehicle frame = Velodyne frame (x forward, y left, z up); cameras are the rectified "
             "image_0x (P_rect_0x), principal points shifted by +0.5 px to gsim's pixel-centre convention", *left_out]
    times = {s: _timestamps(drive_dir / s, frames) for s in (*cameras, LIDAR, "oxts")}
    if any(times[s] is None for s in (*cameras, LIDAR)):
        notes.append("no timestamps.txt: times are frame index / 10 Hz")
        times = {s: [int(f) * FRAME_PERIOD_US for f in frames] for s in times}
    if has_oxts:
        ego = _read_oxts(drive_dir, date_dir, frames)
        ego_times = times["oxts"] or times[LIDAR]
        notes.append("ego poses from oxts GPS/IMU; world = local east-north-up (Mercator) at the first pose")
        odometry = None
    else:
        odometry = LidarOdometry("this drive has no oxts poses")
        ego_times = times[LIDAR]
        notes.append("ego poses are kiss-icp LiDAR odometry estimates (no oxts in this drive), not GNSS ground "
                     "truth; world = the first sweep's Velodyne frame")
    notes.append("LiDAR beams: nominal HDL-64E S2 elevation table (datasheet), not per-unit calibration")

    name = drive_dir.name if drive_dir != date_dir else f"kitti_raw_{date_dir.name}"
    with LogWriter(out, name=name, source="kitti-raw") as w:
        for cam in cameras:
            w.add_camera(cam, *calib[cam])
        w.add_lidar("velodyne", np.eye(4), HDL64E)
        ego_poses = []
        for k, f in enumerate(tqdm(frames, desc="kitti-raw", unit="frame", disable=not progress)):
            points = read_sweep(sweeps[k])
            ego_poses.append(ego[k] if odometry is None else odometry(points[:, :3]))
            w.add_frame(times[LIDAR][k],
                        cameras={c: w.image(c, k, times[c][k], src=drive_dir / c / "data" / f"{f}.png")
                                 for c in cameras},
                        lidars={"velodyne": w.sweep("velodyne", k, times[LIDAR][k], points)})
        if odometry is not None:
            ego_poses, note = smoothed_odometry(np.array(ego_times), np.stack(ego_poses))
            notes.append(note)
        for t, T in zip(ego_times, ego_poses):
            w.add_ego_pose(t, T)
        if tracklets:  # boxes at the sweeps' times, placed as the log places the sweeps (vehicle = Velodyne)
            sweep_poses = {int(f): (t, interpolate_pose(np.array(ego_times), np.stack(ego_poses), t))
                           for f, t in zip(frames, times[LIDAR])}
            actors = _actors(tracklets, sweep_poses)
            for a in actors:
                w.add_actor(a)
            notes.append(f"actors: {len(actors)} of the {len(tracklets)} tracklets in {TRACKLETS} (those seen in the "
                         f"converted frames); box centre = the tracklet's bottom centre lifted by h/2, category = "
                         f"objectType in lower case")
        w.notes.extend(notes)
    return Path(out)


# gsim convert's subcommand for this format: its help line, what SRC (and OUT) is, options the converter takes
HELP = "KITTI raw: a date folder (calib_*.txt) with one or more drives"
SRC = "the date folder with calib_*.txt"


def add_options(parser) -> None:
    parser.add_argument("--drive", default=None, help="the drive folder's name when the date folder has several")
