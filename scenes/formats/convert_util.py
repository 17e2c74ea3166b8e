"""Helpers shared by the dataset converters: camera models from calibration numbers, image checks,
timestamps and poses. Errors name the source file and the field."""
from __future__ import annotations

import datetime as _dt
import hashlib
import math
import re
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from gsim.cameras import OPENCV_PIXEL_CENTRE_SHIFT, Camera, FisheyeCamera, OpenCVCamera, PinholeCamera
from gsim.errors import NAME_RE, InputError, MissingExtra
from gsim.scenes.log import ACTOR_CATEGORIES, ActorTrack, LogFormatError


def camera_from_params(where: str, width: int, height: int, fx: float, fy: float, cx: float, cy: float,
                       fisheye: bool = False, k1: float = 0.0, k2: float = 0.0, k3: float = 0.0,
                       k4: float = 0.0, p1: float = 0.0, p2: float = 0.0) -> Camera:
    """A gsim camera from OpenCV-style parameters (principal point already in gsim's pixel convention).

    Radial-tangential without distortion is a `PinholeCamera`; ``fisheye`` selects OpenCV's
    equidistant model (k1..k4, no tangential terms). ``where`` names the source in errors."""
    try:
        if fisheye:
            if p1 or p2:
                raise InputError("a fisheye (equidistant) camera has no tangential terms p1, p2")
            return FisheyeCamera(int(width), int(height), fx, fy, cx, cy, k1, k2, k3, k4)
        if k4:
            raise InputError("k4 is not part of the radial-tangential model (k1, k2, p1, p2, k3)")
        if not any((k1, k2, k3, p1, p2)):
            return PinholeCamera(int(width), int(height), fx, fy, cx, cy)
        return OpenCVCamera(int(width), int(height), fx, fy, cx, cy, k1, k2, p1, p2, k3)
    except (TypeError, ValueError) as e:
        raise LogFormatError(f"{where}: {e}") from None


def check_image(path: Path, width: int, height: int, where: str) -> None:
    """Raise LogFormatError naming ``path`` and ``where`` (the source of the expected size) unless ``path``
    is a readable image of ``width`` x ``height`` pixels. Reads the header only."""
    from PIL import Image, UnidentifiedImageError
    try:
        with Image.open(path) as im:
            size = im.size
    except FileNotFoundError:
        raise LogFormatError(f"{path}: image missing ({where})") from None
    except (UnidentifiedImageError, OSError) as e:
        raise LogFormatError(f"{path}: not a readable image ({where}: {e})") from None
    if size != (width, height):
        raise LogFormatError(f"{path}: image is {size[0]}x{size[1]}, {where} says {width}x{height}")


_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?Z?")


def timestamp_us(text: str, where: str) -> int:
    """'YYYY-MM-DD[T ]HH:MM:SS[.fraction][Z]' (UTC, any number of fraction digits) -> integer microseconds
    since 1970-01-01, exact (no float seconds); digits beyond the microsecond are truncated."""
    m = _TIME.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise LogFormatError(f"{where}: expected a time 'YYYY-MM-DD HH:MM:SS.ffffff', got {text!r}")
    try:
        t = _dt.datetime(*(int(g) for g in m.groups()[:6]), tzinfo=_dt.timezone.utc)
    except ValueError as e:
        raise LogFormatError(f"{where}: {text!r}: {e}") from None
    d = t - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
    return (d.days * 86400 + d.seconds) * 1_000_000 + int(((m.group(7) or "") + "000000")[:6])


def ns_to_us(ns):
    """Nanoseconds (int or int64 array) -> microseconds, rounded to the nearest, halves up."""
    return (ns + 500) // 1000


def make_pose(R, t) -> np.ndarray:
    """4x4 rigid transform from a 3x3 rotation and a translation."""
    T = np.eye(4)
    T[:3, :3] = R
    T[:3, 3] = t
    return T


def nearest_rotation(R: np.ndarray) -> np.ndarray:
    """The rotation matrix nearest to ``R`` (Frobenius norm): makes rounded calibration matrices
    (R R^T - I ~ 1e-7) and sums of rotations (a chordal mean) rigid to float64 precision."""
    U, _, Vt = np.linalg.svd(R)
    return U @ np.diag([1.0, 1.0, np.linalg.det(U @ Vt)]) @ Vt


def mean_pose(poses: np.ndarray) -> np.ndarray:
    """(N,4,4) -> 4x4: mean translation and chordal mean rotation, for poses a few degrees apart at most."""
    poses = np.asarray(poses, np.float64)
    return make_pose(nearest_rotation(poses[:, :3, :3].sum(0)), poses[:, :3, 3].mean(0))


def pose_difference(A: np.ndarray, B: np.ndarray) -> Tuple[float, float]:
    """(metres, degrees): the translation length and rotation angle of ``inv(A) @ B``."""
    D = np.linalg.solve(A, B)
    R = D[:3, :3]
    sin2 = np.linalg.norm([R[2, 1] - R[1, 2], R[0, 2] - R[2, 0], R[1, 0] - R[0, 1]])  # 2 sin(angle)
    return float(np.linalg.norm(D[:3, 3])), math.degrees(math.atan2(sin2, np.trace(R) - 1))  # exact near 0


def actor_id(source_id: str) -> str:
    """A dataset's object id as a gsim actor id (a safe file name, `gsim.errors.NAME_PATTERN`): kept where it is
    one; else its other characters become '_' and an 8-digit hash of the original is appended, so the id is stable
    (the same in every log and segment) and two ids that differ only in such characters stay apart."""
    source_id = str(source_id)
    if NAME_RE.fullmatch(source_id):
        return source_id
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", source_id).lstrip(".-")[:110] or "actor"
    return f"{safe}_{hashlib.sha1(source_id.encode()).hexdigest()[:8]}"


class TrackBuilder:
    """Annotated boxes (one per object and time) collected into `ActorTrack`s.

    ``add`` takes each box's dataset id, class and centre pose ``T_world_actor`` (x along the box's length, z up);
    ``tracks()`` sorts each object's boxes by time, takes the median of its sizes (annotators' sizes jitter from
    frame to frame; a rigid actor has one) and keeps the dataset's id and class in the track's metadata.
    ``categories`` maps the dataset's classes to `ACTOR_CATEGORIES` (unknown classes become "other")."""

    def __init__(self, categories: Dict[str, str]):
        bad = sorted(set(categories.values()) - set(ACTOR_CATEGORIES))
        if bad:
            raise ValueError(f"TrackBuilder: {bad} are not gsim actor categories {ACTOR_CATEGORIES}")
        self.categories = categories
        self._boxes: Dict[str, dict] = {}

    def add(self, source_id, source_class: str, timestamp_us: int, T_world_actor: np.ndarray, size, where: str,
            **metadata) -> None:
        """One box; ``where`` names the file and field it came from (in errors). Extra keyword arguments (numbers,
        strings) join the track's metadata."""
        size = tuple(float(x) for x in size)
        if len(size) != 3 or not all(math.isfinite(x) and x > 0 for x in size):
            raise LogFormatError(f"{where}: box size must be 3 finite lengths > 0 metres, got {size}")
        T = np.asarray(T_world_actor, np.float64)
        if T.shape != (4, 4) or not np.all(np.isfinite(T)):
            raise LogFormatError(f"{where}: box pose must be a finite 4x4 transform")
        b = self._boxes.setdefault(str(source_id), {"class": str(source_class), "boxes": {}, "meta": {}})
        if int(timestamp_us) in b["boxes"]:
            raise LogFormatError(f"{where}: object {source_id} has two boxes at {int(timestamp_us)} us")
        b["boxes"][int(timestamp_us)] = (T, size)
        b["meta"].update(metadata)

    def tracks(self) -> List[ActorTrack]:
        out, seen = [], {}
        for sid in sorted(self._boxes):
            b = self._boxes[sid]
            aid = actor_id(sid)
            if aid in seen:
                raise LogFormatError(f"object ids {seen[aid]!r} and {sid!r} map to the same actor id {aid!r}")
            seen[aid] = sid
            ts = sorted(b["boxes"])
            sizes = np.array([b["boxes"][t][1] for t in ts])
            meta = {**b["meta"], "class": b["class"], **({"source_id": sid} if aid != sid else {})}
            out.append(ActorTrack(aid, self.categories.get(b["class"], "other"), tuple(np.median(sizes, 0).tolist()),
                                  np.asarray(ts, np.int64), np.stack([b["boxes"][t][0] for t in ts]), meta))
        return out

    def __len__(self) -> int:
        return len(self._boxes)


def rectified_camera(P: np.ndarray, width: int, height: int, where: str) -> Tuple[PinholeCamera, np.ndarray]:
    """(camera model K, T_cam_rect = [I | K^-1 p4]) of a rectified projection matrix ``P = K [I | t]`` (3x4), so
    that ``P @ X_rect`` is K applied to ``T_cam_rect @ X_rect``; ``where`` names the matrix in errors."""
    K = P[:, :3]
    if K[0, 1] != 0 or K[1, 0] != 0 or np.any(K[2] != [0, 0, 1]) or K[0, 0] <= 0 or K[1, 1] <= 0:
        raise LogFormatError(f"{where}: expected K [I | t] with K = [[fx,0,cx],[0,fy,cy],[0,0,1]]")
    camera = PinholeCamera(width, height, K[0, 0], K[1, 1], K[0, 2] + OPENCV_PIXEL_CENTRE_SHIFT,
                           K[1, 2] + OPENCV_PIXEL_CENTRE_SHIFT)
    return camera, make_pose(np.eye(3), np.linalg.solve(K, P[:, 3]))


class LidarOdometry:
    """Ego poses of a log without any, estimated by kiss-icp on its sweeps as recorded (no deskew: KITTI's carry no
    per-point times); register the sweeps in time order, then smooth the poses with `smoothed_odometry`."""

    def __init__(self, why: str):
        """``why``: the reason the log needs odometry (in the error when kiss-icp is missing)."""
        try:
            from kiss_icp.config import load_config
            from kiss_icp.kiss_icp import KissICP
        except ImportError as e:
            raise MissingExtra(f"{why}, so gsim estimates them with kiss-icp LiDAR "
                              f"odometry, which is not installed ({e}); install it with: "
                              f"pip install -e \".[lidar]\"") from None
        config = load_config(None)  # defaults: 100 m range, 1 m voxels
        config.data.deskew = False
        self.icp = KissICP(config)

    def __call__(self, points: np.ndarray) -> np.ndarray:
        """Register a sweep (N,3) in the sensor frame; returns T_world_lidar (world = first sweep)."""
        self.icp.register_frame(np.asarray(points, np.float64), np.zeros(0))
        return self.icp.last_pose.copy()


# LiDAR odometry's positions are smoothed with a motion prior (a Whittaker smoother: least squares against the
# estimates with a penalty on acceleration). On the KITTI raw sample's stop-and-go drive kiss-icp's steps jitter by
# 3-5 cm (its speed jumps between 1.0 and 2.6 m/s from one sweep to the next, 4.8 m/s^2 rms), which a car cannot do; a
# reconstruction on them renders its held-out views several centimetres off (BENCHMARKS.md).
ODOMETRY_NOISE_M = 0.03  # the estimates' position noise
ODOMETRY_ACCEL_MPS2 = 1.0  # the acceleration the prior expects (one sigma)


def smooth_positions(times_us: np.ndarray, poses: np.ndarray) -> np.ndarray:
    """``poses`` (T,4,4) with their positions smoothed (orientations kept: their jitter is hundredths of a
    degree): minimise sum |p - p_est|^2 / noise^2 + sum |a|^2 / accel^2 over the positions p, a the second
    divided differences at the inner times (any spacing)."""
    from scipy.sparse import diags, identity
    from scipy.sparse.linalg import spsolve
    t = np.asarray(times_us, np.float64) / 1e6
    n = len(t)
    if n < 3:
        return poses
    h = np.diff(t)
    if np.any(h <= 0):
        raise InputError("smooth_positions: times must increase")
    # a_k = 2 / (h_{k-1} + h_k) * ((p_{k+1} - p_k) / h_k - (p_k - p_{k-1}) / h_{k-1}), k = 1..n-2
    w = 2 / (h[:-1] + h[1:])
    D = diags([w / h[:-1], -w * (1 / h[:-1] + 1 / h[1:]), w / h[1:]], [0, 1, 2], shape=(n - 2, n))
    A = (identity(n) / ODOMETRY_NOISE_M ** 2 + D.T @ D / ODOMETRY_ACCEL_MPS2 ** 2).tocsc()
    out = np.array(poses, np.float64)
    out[:, :3, 3] = spsolve(A, poses[:, :3, 3] / ODOMETRY_NOISE_M ** 2)
    return out


def smoothed_odometry(times_us: np.ndarray, raw: np.ndarray) -> Tuple[np.ndarray, str]:
    """(the odometry poses (T,4,4) at ``times_us`` with `smooth_positions`, the log's note on what that moved)."""
    poses = smooth_positions(times_us, raw)
    moved = np.linalg.norm(poses[:, :3, 3] - raw[:, :3, 3], axis=1) * 100
    return poses, (f"odometry positions smoothed (acceleration prior {ODOMETRY_ACCEL_MPS2:g} m/s^2, estimate noise "
                   f"{ODOMETRY_NOISE_M * 100:g} cm): moved by median {np.median(moved):.1f} cm, at most "
                   f"{moved.max():.1f} cm")
