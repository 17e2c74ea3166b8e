"""KITTI tracking -> gsim driving log.

One sequence SSSS of the tracking benchmark's ``training/`` (or ``testing/``, which has no labels) folder::

    image_02/SSSS/NNNNNN.png   left colour camera, rectified
    image_03/SSSS/NNNNNN.png   right colour camera, rectified
    velodyne/SSSS/NNNNNN.bin   Velodyne HDL-64E sweeps: float32 (x, y, z, reflectance) in the Velodyne frame
    calib/SSSS.txt             P0..P3 (3x4), R_rect (3x3), Tr_velo_cam (3x4), Tr_imu_velo (3x4)
    oxts/SSSS.txt              GPS/IMU: line k is frame k, the 30 fields of a KITTI raw oxts record
    label_02/SSSS.txt          frame, track_id, type, truncated, occluded, alpha, bbox (4), h, w, l, x, y, z,
                               rotation_y (one line per box; ``DontCare`` regions have track_id -1)

Conventions, each conversion written out:

- Time: tracking ships no timestamps, so frame k (its images, its sweep and oxts line k) is at k x 100 ms (10 Hz).
- Vehicle = the Velodyne frame (x forward, y left, z up), as in `gsim.scenes.formats.kitti_raw`: T_vehicle_lidar = I.
- Calibration: ``Tr_velo_cam`` = T_cam0_velo (Velodyne -> unrectified camera 0), ``R_rect`` = T_rect_cam0
  (camera 0 -> the rectified camera-0 frame), ``Tr_imu_velo`` = T_velo_imu (IMU -> Velodyne); the files of other
  tools' copies that use the object benchmark's names (R0_rect, Tr_velo_to_cam, Tr_imu_to_velo) read too. KITTI
  projects a Velodyne point X into camera i (2: image_02, 3: image_03) as ``P_i @ R_rect @ Tr_velo_cam @ X``;
  with ``P_i = K_i [I | t_i]`` that is K_i applied to ``T_cami_velo @ X``, ``T_cami_velo = [I | t_i] @ R_rect @
  Tr_velo_cam``, so ``T_vehicle_cami = inv(T_cami_velo)`` and the camera model is K_i with its principal point
  moved +0.5 px (gsim's pixel centres). The calibration gives no image size: each camera's comes from its first
  image, and every other image must match it.
- Ego poses: oxts line k's lat, lon, alt, roll, pitch, yaw (the IMU) as Mercator east-north-up positions
  (`kitti_raw.oxts_poses`), world origin at line 0's IMU position whatever frames are converted, and
  ``T_world_vehicle = T_world_imu @ inv(Tr_imu_velo)``. Every line becomes an ego pose: the whole sequence's
  trajectory, also where this download has no sensor files.
- Sweeps: reflectance is in [0, 1] already and kept as is (refused outside). KITTI's sweeps carry no per-point
  times: (N,4) sweeps placed with the pose at the frame's time.
- Labels: (x, y, z) is the box's bottom centre in the rectified camera-0 frame (x right, y down, z forward), h, w,
  l its height, width, length, and rotation_y its yaw about that frame's y axis: KITTI's box corners are
  ``Ry(ry) @ (+-l/2, 0 or -h, +-w/2) + (x, y, z)``, the length along the object's x, up along -y. gsim's box frame
  (x along the length, y the width, z up) in the rectified frame is ``R = Ry(ry) @ M``, ``M = [[1, 0, 0],
  [0, 0, -1], [0, 1, 0]]`` (gsim x -> KITTI x, gsim y -> KITTI z, gsim z -> KITTI -y), centred h/2 above the
  bottom: ``T_rect_actor = [Ry(ry) M | (x, y - h/2, z)]``, and ``T_world_actor = T_world_vehicle(frame) @
  inv(R_rect @ Tr_velo_cam) @ T_rect_actor``, size (l, w, h). In the Velodyne frame that is a heading of
  ``-ry - pi/2`` about an up axis within a degree of the Velodyne's z (the rectified camera's -y, kept exactly).
- Tracks: one actor per track_id (``track_<id>``, `TrackBuilder`: KITTI's type in metadata["class"] and the id in
  metadata["track_id"]; Car, Van -> car, Truck -> truck, Pedestrian, Person(_sitting) -> pedestrian, Cyclist ->
  cyclist, the others (Tram, Misc) -> other), over every labelled frame, like the ego poses. DontCare rows are
  dropped; per-box truncation, occlusion, alpha and 2D boxes are not converted.
- Partial sequences: frames are the indices with a file in image_02, image_03 or velodyne, each converted with the
  files it has (KITTI lost sweeps now and then: raw drive 2011_09_26_drive_0009 has none for frames 177-180, so
  such frames are camera-only). Unlike `kitti_raw` no share of missing frames is refused: every file is placed by
  its own frame index and the oxts line of that index, so a copy with some frames (the public sample: 2 of
  447) converts to exactly those, and the notes count what is missing against the oxts lines. A missing camera
  or velodyne folder leaves that sensor out (noted), no label file (the testing split) leaves out the actors
  (noted). Refused, naming the file: no calib/SSSS.txt or oxts/SSSS.txt (the extrinsics and the ego poses come
  from them), no sensor files at all, a frame or a label beyond the oxts lines.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from gsim.errors import NAME_RE, InputError
from gsim.scenes.formats import kitti_raw
from gsim.scenes.formats.convert_util import (TrackBuilder, check_image, make_pose, nearest_rotation,
                                              rectified_camera)
from gsim.scenes.log import LogFormatError, LogWriter
from gsim.transforms import invert

CAMERAS = {"image_02": "P2", "image_03": "P3"}  # the colour cameras and their projection matrices
LIDAR = "velodyne"
LABELS = "label_02"
FRAME_PERIOD_US = kitti_raw.FRAME_PERIOD_US
OXTS_FIELDS = 30
LABEL_FIELDS = 17
# calibration keys: the tracking devkit's name first, then the object benchmark's (some copies use those)
R_RECT = ("R_rect", "R0_rect")
TR_VELO_CAM = ("Tr_velo_cam", "Tr_velo_to_cam")
TR_IMU_VELO = ("Tr_imu_velo", "Tr_imu_to_velo")
CATEGORIES = {"Car": "car", "Van": "car", "Truck": "truck", "Pedestrian": "pedestrian", "Person": "pedestrian",
              "Person_sitting": "pedestrian", "Cyclist": "cyclist"}
# gsim's box axes in KITTI's object axes (columns): x -> x (length), y -> z (width), z -> -y (up)
M_KITTI_BOX = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])


def _matrix(calib: Dict[str, str], path: Path, keys: Tuple[str, ...], n: int) -> np.ndarray:
    key = next((k for k in keys if k in calib), keys[0])
    return kitti_raw.values(calib, path, key, n)


def _rigid(v: np.ndarray) -> np.ndarray:
    """4x4 from 12 numbers [R | t] row-major (the rotation made exactly orthonormal) or 9 numbers R."""
    m = v.reshape(3, -1)
    return make_pose(nearest_rotation(m[:, :3]), m[:, 3] if m.shape[1] == 4 else np.zeros(3))


def read_calibration(path: Path, cameras: Sequence[str]) -> Tuple[np.ndarray, np.ndarray, Dict[str, np.ndarray]]:
    """(T_rect_velo = R_rect @ Tr_velo_cam, T_velo_imu = Tr_imu_velo, {camera folder: its P_i (3x4)}) of a
    sequence's calib file."""
    calib = kitti_raw.read_calib(path)
    return (_rigid(_matrix(calib, path, R_RECT, 9)) @ _rigid(_matrix(calib, path, TR_VELO_CAM, 12)),
            _rigid(_matrix(calib, path, TR_IMU_VELO, 12)),
            {c: kitti_raw.values(calib, path, CAMERAS[c], 12).reshape(3, 4) for c in cameras})


def _frame_files(folder: Path, suffix: str) -> Dict[int, Path]:
    """{frame index: file} of a sensor's sequence folder ({} where it is absent)."""
    out = {}
    for p in sorted(folder.glob(f"*{suffix}")) if folder.is_dir() else ():
        if not p.stem.isdigit():
            raise LogFormatError(f"{p}: expected a file named by its frame index (000000{suffix}, ...)")
        out[int(p.stem)] = p
    return out


def read_oxts(path: Path, T_velo_imu: np.ndarray) -> np.ndarray:
    """(F,4,4) T_world_velo of every line of a sequence's oxts file (line k = frame k)."""
    if not path.is_file():
        raise LogFormatError(f"{path}: oxts file missing: KITTI tracking's ego poses come from it (GPS/IMU, one "
                             f"line per frame), and gsim places every sensor and box with them")
    lines = path.read_text().splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for k, line in enumerate(lines):
        try:
            v = [float(x) for x in line.split()]
        except ValueError:
            v = []
        if len(v) != OXTS_FIELDS or not all(math.isfinite(x) for x in v):
            raise LogFormatError(f"{path}: line {k + 1}: expected {OXTS_FIELDS} numbers (lat lon alt roll pitch yaw "
                                 f"vn ve ... orimode), got {line.strip()[:60]!r}")
        records.append(v[:6])
    if not records:
        raise LogFormatError(f"{path}: no oxts lines")
    return kitti_raw.oxts_poses(np.array(records), invert(T_velo_imu))


def _label_rows(path: Path) -> Tuple[List[tuple], int]:
    """([(frame, track_id, type, (h, w, l, x, y, z, ry), line number)] of a label file's boxes, the number of
    DontCare rows left out)."""
    rows, dont_care = [], 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        f = line.split()
        if not f:
            continue
        where = f"{path}: line {n}"
        if len(f) != LABEL_FIELDS:
            raise LogFormatError(f"{where}: expected {LABEL_FIELDS} fields (frame track_id type truncated occluded "
                                 f"alpha bbox(4) h w l x y z rotation_y), got {len(f)}")
        try:
            frame, track = int(f[0]), int(f[1])
            v = np.array([float(x) for x in f[10:17]])
        except ValueError:
            raise LogFormatError(f"{where}: expected integer frame and track_id and numbers for h w l x y z "
                                 f"rotation_y, got {line.strip()[:80]!r}") from None
        if f[2] == "DontCare":
            dont_care += 1
            continue
        if frame < 0 or track < 0:
            raise LogFormatError(f"{where}: frame and track_id must be >= 0 (track_id -1 is for DontCare), "
                                 f"got {frame} {track}")
        if not np.all(np.isfinite(v)) or np.any(v[:3] <= 0):
            raise LogFormatError(f"{where}: expected finite h w l > 0 m, x y z, rotation_y, got {v.tolist()}")
        rows.append((frame, track, f[2], v, n))
    return rows, dont_care


def _box_in_rect(h: float, w: float, l: float, x: float, y: float, z: float, ry: float) -> np.ndarray:
    """T_rect_actor: gsim's centred box frame of a KITTI label in the rectified camera-0 frame (module docstring)."""
    c, s = math.cos(ry), math.sin(ry)
    return make_pose(np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]]) @ M_KITTI_BOX, [x, y - h / 2, z])


def _image_size(path: Path) -> Tuple[int, int]:
    from PIL import Image, UnidentifiedImageError
    try:
        with Image.open(path) as im:
            return im.size
    except (UnidentifiedImageError, OSError) as e:
        raise LogFormatError(f"{path}: not a readable image ({e})") from None


def _span(frames: List[int]) -> str:
    """Sorted frame indices as ranges: '000000-000001, 000005'."""
    runs = []
    for f in frames:
        if runs and f == runs[-1][1] + 1:
            runs[-1][1] = f
        else:
            runs.append([f, f])
    text = [f"{a:06d}" if a == b else f"{a:06d}-{b:06d}" for a, b in runs]
    return ", ".join(text[:8]) + (f" and {len(text) - 8} more ranges" if len(text) > 8 else "")


def convert_kitti_tracking(training_dir, out, sequence: str, progress: bool = True) -> Path:
    """Convert sequence ``sequence`` ("0001" or 1) of a KITTI tracking ``training/`` or ``testing/`` folder to a gsim
    log at ``out``; returns ``out``. Raises LogFormatError naming the file for missing or malformed input."""
    from tqdm import tqdm
    root = Path(training_dir)
    if not root.is_dir():
        raise InputError(f"{root}: not a directory (expected a KITTI tracking training/ or testing/ folder)")
    if not str(sequence).strip().isdigit():
        raise InputError(f"sequence: expected a sequence number such as 0001, got {sequence!r}")
    seq = f"{int(sequence):04d}"
    if not (root / "calib").is_dir():
        raise LogFormatError(f"{root / 'calib'}: folder missing (expected a KITTI tracking training/ or testing/ "
                             f"folder with calib/, oxts/, image_02/, velodyne/)")
    sensors = {s: _frame_files(root / s / seq, ".png") for s in CAMERAS}
    sensors[LIDAR] = _frame_files(root / LIDAR / seq, ".bin")
    missing = [s for s, files in sensors.items() if not files]
    sensors = {s: files for s, files in sensors.items() if files}
    calib_path = root / "calib" / f"{seq}.txt"
    if not calib_path.is_file() and not sensors:
        have = sorted(p.stem for p in (root / "calib").glob("*.txt"))
        raise InputError(f"{root}: sequence {seq} not found (calib/ has {', '.join(have[:20]) or 'no sequences'})")
    T_rect_velo, T_velo_imu, projections = read_calibration(calib_path, [c for c in CAMERAS if c in sensors])
    oxts_path = root / "oxts" / f"{seq}.txt"
    ego = read_oxts(oxts_path, T_velo_imu)
    if not sensors:
        raise LogFormatError(f"{root}: no files in image_02/{seq}, image_03/{seq} or velodyne/{seq}: nothing to "
                             f"convert")
    frames = sorted(set().union(*sensors.values()))
    if frames[-1] >= len(ego):
        s = next(s for s in sensors if frames[-1] in sensors[s])
        raise LogFormatError(f"{sensors[s][frames[-1]]}: frame {frames[-1]} has no oxts line ({oxts_path} has "
                             f"{len(ego)} lines, one per frame)")

    cameras = {}
    for c, P in projections.items():
        first = sensors[c][min(sensors[c])]
        width, height = _image_size(first)
        camera, T_cam_rect = rectified_camera(P, width, height, f"{calib_path}: {CAMERAS[c]}")
        cameras[c] = (camera, invert(T_cam_rect @ T_rect_velo))
        for p in sensors[c].values():
            check_image(p, width, height, f"the size of {first.name}, the sequence's first {c} image")
    sweeps = {k: kitti_raw.sweep_path_checked(p) for k, p in sensors.get(LIDAR, {}).items()}

    notes = ["vehicle frame = Velodyne frame (x forward, y left, z up); cameras are the rectified image_02/03 "
             "(P2, P3 with R_rect, Tr_velo_cam), principal points shifted by +0.5 px to gsim's pixel-centre convention",
             "KITTI tracking has no timestamps: times are frame index / 10 Hz",
             f"ego poses from oxts GPS/IMU, all {len(ego)} lines of oxts/{seq}.txt (frames 000000-{len(ego) - 1:06d}); "
             "world = local east-north-up (Mercator) with its origin at frame 000000's IMU (oxts) position",
             "LiDAR beams: nominal HDL-64E S2 elevation table (datasheet), not per-unit calibration; reflectance in "
             "[0, 1] kept as intensity; sweeps have no per-point times"]
    notes += [f"no {s}/{seq} files: the log has no {s} sensor" for s in missing]
    if len(frames) < len(ego):
        notes.append(f"sensor files for {len(frames)} of the sequence's {len(ego)} frames (oxts lines): "
                     f"{_span(frames)}; the other frames are not in this copy")
    for s, files in sensors.items():
        lacking = sorted(set(frames) - set(files))
        if lacking:
            notes.append(f"{s} has no file for {len(lacking)} of the converted frames: {_span(lacking)}")

    label_path = root / LABELS / f"{seq}.txt"
    tracks = TrackBuilder(CATEGORIES)
    if label_path.is_file():
        rows, dont_care = _label_rows(label_path)
        for frame, track, kind, (h, w, l, x, y, z, ry), n in rows:
            where = f"{label_path}: line {n}"
            if frame >= len(ego):
                raise LogFormatError(f"{where}: frame {frame} has no oxts line ({oxts_path} has {len(ego)} lines)")
            T = ego[frame] @ invert(T_rect_velo) @ _box_in_rect(h, w, l, x, y, z, ry)
            tracks.add(f"track_{track}", kind, frame * FRAME_PERIOD_US, T, (l, w, h), where, track_id=track)
        labelled = sorted({r[0] for r in rows})
        notes.append(f"actors: the {len(tracks)} tracks of {LABELS}/{seq}.txt over all its labelled frames "
                     f"({_span(labelled) if labelled else 'none'}; {len(rows)} boxes, {dont_care} DontCare regions "
                     f"dropped); box centre = KITTI's bottom centre lifted by h/2, in the Velodyne frame via "
                     f"inv(R_rect @ Tr_velo_cam); KITTI's type in metadata['class']")
    else:
        notes.append(f"no {LABELS}/{seq}.txt (the testing split has none): no actors")

    name = f"kitti_tracking_{root.name}_{seq}"
    with LogWriter(out, name=name if NAME_RE.fullmatch(name) else f"kitti_tracking_{seq}",
                   source="kitti-tracking") as w:
        for c, (camera, T) in cameras.items():
            w.add_camera(c, camera, T)
        if sweeps:
            w.add_lidar(LIDAR, np.eye(4), kitti_raw.HDL64E)
        for k, T in enumerate(ego):
            w.add_ego_pose(k * FRAME_PERIOD_US, T)
        for i, k in enumerate(tqdm(frames, desc="kitti-tracking", unit="frame", disable=not progress)):
            t = k * FRAME_PERIOD_US
            lidars = {}
            if k in sweeps:
                points = kitti_raw.read_sweep(sweeps[k])
                if np.any((points[:, 3] < 0) | (points[:, 3] > 1)):
                    raise LogFormatError(f"{sweeps[k]}: reflectance outside [0, 1] (KITTI's range)")
                lidars[LIDAR] = w.sweep(LIDAR, i, t, points)
            w.add_frame(t, cameras={c: w.image(c, i, t, src=sensors[c][k]) for c in cameras if k in sensors[c]},
                        lidars=lidars)
        for a in tracks.tracks():
            w.add_actor(a)
        w.notes.extend(notes)
    return Path(out)


# gsim convert's subcommand for this format: its help line, what SRC (and OUT) is, options the converter takes
HELP = "KITTI tracking: one sequence of a training/ or testing/ folder"
SRC = "the training/ or testing/ folder (calib/, oxts/, image_02/, velodyne/, label_02/)"


def add_options(parser) -> None:
    parser.add_argument("--sequence", required=True, help="the sequence number, e.g. 0001")
