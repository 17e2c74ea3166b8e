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

from gsim.cameras import Camera, FisheyeCamera, OpenCVCamera, PinholeCamera
from gsim.errors import NAME_RE, InputError
from gsim.scenes.log import ACTOR_CATEGORIES, ActorTrack, LogFormatError

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

