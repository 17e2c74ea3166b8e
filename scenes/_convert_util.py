"""Helpers shared by the dataset converters: camera models from calibration numbers, image checks,
timestamps and poses. Errors name the source file and the field."""
from __future__ import annotations

import datetime as _dt
import math
import re
from pathlib import Path
from typing import Tuple

import numpy as np

from gsim.cameras import Camera, FisheyeCamera, OpenCVCamera, PinholeCamera
from gsim.errors import InputError
from gsim.scenes.log import LogFormatError

# OpenCV (and so KITTI and DGP calibrations) puts pixel centres at integer coordinates; gsim puts
# them at +0.5 (gsim/cameras.py), so a principal point moves by half a pixel on the way in.
OPENCV_PIXEL_CENTRE_SHIFT = 0.5


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
