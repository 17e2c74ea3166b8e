"""Waymo Open Dataset v1 (one segment's ``Frame`` TFRecord) -> gsim driving log. No TensorFlow.

Reading: a TFRecord is a sequence of records ``u64 length, u32 masked CRC32C of the length bytes, data, u32 masked
CRC32C of the data`` (little endian; masked = ((crc >> 15 | crc << 17) + 0xa282ead8) mod 2^32); both CRCs are
checked (`read_records`, numpy CRC32C) and an error names the record and its byte offset. Each record is one
``Frame`` protobuf, decoded with protobuf against gsim's own minimal schema (`_SCHEMA`): the field numbers and wire
types of the fields gsim reads, built as a descriptor in code (no .proto file, no generated module), in a private
descriptor pool; enums are read as their int32 values. Waymo's v2 layout (parquet components) is refused.

Conventions, each conversion written out:

- Time: ``Frame.timestamp_micros`` is the frame's time and the start of the TOP LiDAR's sweep; Waymo's other times
  are float seconds since the epoch -> integer microseconds, ``round(s * 1e6)``.
- World = Waymo's global frame (metres, z up), kept as is. Vehicle = Waymo's vehicle frame (x forward, y left,
  z up), as gsim's. Waymo poses are ``T_global_vehicle`` (4x4 row major); extrinsics ``T_vehicle_sensor``.
- Ego poses, from what each frame has: every image's own pose at its ``pose_timestamp``, and the TOP LiDAR's
  per-pixel poses (``range_image_top_pose``: roll, pitch, yaw, x, y, z; R = Rz(yaw) Ry(pitch) Rx(roll)) of one
  column every ``EGO_SAMPLE_US`` at that column's time (below); a frame with neither gives its ``Frame.pose`` at
  the sweep's middle (``timestamp_micros + SWEEP_US / 2``: Waymo says the frame pose is "roughly" the middle of the
  frame; it has no time of its own). The notes give how far each camera pose is from the TOP's poses at its time.
- Cameras: Waymo's camera frame is x forward, y left, z up; ``T_vehicle_camera = extrinsic @ [R_WAYMO_OPENCV | 0]``
  (OpenCV x right = Waymo -y, y down = -z, z forward = x). Intrinsics [f_u, f_v, c_u, c_v, k1, k2, p1, p2, k3]
  are OpenCV's radial-tangential model; Waymo's pixel coordinates put 0 at the left edge of the first pixel (its
  dataset.proto), as gsim's, so the principal point is NOT shifted (on the real sample gsim's projection of the 3D
  labels equals Waymo's own ``projected_lidar_labels`` to 0.2 px; with a +0.5 px shift it is 0.5 px off).
  JPEG bytes are copied as they are. Timing: ``camera_trigger_time`` .. ``camera_readout_done_time`` spans the
  exposure and readout, ``shutter`` is one line's exposure. TOP_TO_BOTTOM: the image's time is the first row's
  mid-exposure (trigger + shutter / 2) and ``readout_us`` = readout done - trigger - shutter (the camera's median
  over the segment); GLOBAL_SHUTTER: trigger + shutter / 2. Directions gsim's rolling shutter (rows, top first)
  cannot express (LEFT_TO_RIGHT, Waymo's cameras; RIGHT_TO_LEFT, BOTTOM_TO_TOP, UNKNOWN) are timed at the middle
  line's mid-exposure ((trigger + readout done) / 2) as a global shutter, and the notes say so.
- LiDAR range images (zlib-compressed ``MatrixFloat`` [H, W, C]: range, intensity, elongation, ...): row r has
  inclination ``incl[H - 1 - r]`` of the laser's ascending ``beam_inclinations`` (where empty, H uniform steps
  ``min + (i + 0.5) (max - min) / H``); column c has azimuth ``pi - 2 pi (c + 0.5) / W`` in the vehicle's yaw,
  ``- atan2(E[1,0], E[0,0])`` in the laser's own frame (E its extrinsic); a point is ``range * (cos i cos a,
  cos i sin a, sin i)`` in the laser frame, where range > 0. First returns are the sweep, second returns its
  ``second_returns``. Intensity (unbounded, mostly 0..1) -> ``tanh(intensity)`` in [0, 1).
- De-skew (TOP, whose range image has per-pixel poses): the points stay in the laser frame at their own time
  (what the range image holds) with a per-point time offset (N,5): the TOP spins clockwise (seen from above) from
  azimuth +180 deg over ``SWEEP_US``, starting at ``timestamp_micros``, so column c fires at ``(c + 0.5) * SWEEP_US
  / W`` (checked on the real sample: each camera is triggered so that its middle column's mid-exposure is when
  the TOP sweeps the camera's azimuth, to 0.4 ms). The column poses kept as ego poses at those times give every
  point its own pixel pose back through gsim's interpolation (`overlay.sweep_in_world`); the notes give the
  largest distance between the two over the segment. Range images without per-pixel poses (the side LiDARs) are
  Waymo's "virtual" ones: points in the vehicle frame of ``Frame.pose``; they become a (N,4) sweep in the laser
  frame at ``t_ref``, the frame's ego pose time nearest the sweep's middle: ``inv(E(t_ref) @ T_vehicle_lidar) @
  Frame.pose @ T_vehicle_lidar @ p`` (exact in the world).
- Beams: elevations = the inclinations, azimuth resolution 360 / W; the format has no range limits, so
  min/max range are the segment's observed extremes (noted).
- Actors: ``laser_labels``: box centre (center_x, y, z), length along the heading (yaw about z), width, height in
  the vehicle frame of ``Frame.pose``: ``T_world_actor = Frame.pose @ [Rz(heading) | centre]``. A label fits points
  taken when the TOP swept the object, so its time is the frame's time plus the column time of the centre's
  azimuth seen from the TOP. Tracked by label id (`TrackBuilder`, ids starting with '-' made safe); types:
  `CATEGORIES` (Waymo's vehicle class covers trucks and buses: "car").
- Partial segments convert to what they have: laser entries without range images are skipped (the camera-only
  samples carry such), sensors calibrated but never recorded are left out, a segment of cameras only or LiDARs only
  gives a log of those (all noted). Refused, naming the record and the field: a sensor without calibration, an
  image without its pose, laser_labels or side range images without ``Frame.pose``, a frame without any pose,
  frames out of time order or of another segment, calibrations that change within the segment.
- Not converted: camera labels, projected labels, segmentation, flow, elongation, no-label zones, maps.
"""
from __future__ import annotations

import functools
import io
import math
import os
import struct
import tempfile
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from gsim.errors import InputError, MissingExtra
from gsim.scenes.formats.convert_util import TrackBuilder, actor_id, camera_from_params, make_pose, pose_difference
from gsim.scenes.log import LidarBeams, LogFormatError, LogWriter
from gsim.transforms import interpolate_poses, invert, transform_each

SWEEP_US = 100_000  # the TOP LiDAR spins at 10 Hz, one sweep per frame
EGO_SAMPLE_US = 5_000  # one TOP column pose per 5 ms: interpolating between them is off by < 0.01 mm at 3 m/s^2
MAX_DESKEW_ERROR_M = 0.3  # beyond this, the per-pixel poses are not one smooth motion: refused
CAMERA_NAMES = {1: "front", 2: "front_left", 3: "front_right", 4: "side_left", 5: "side_right", 6: "rear_left",
                7: "rear", 8: "rear_right"}  # CameraName.Name
LASER_NAMES = {1: "top", 2: "front", 3: "side_left", 4: "side_right", 5: "rear"}  # LaserName.Name
TOP = 1
LABEL_TYPES = {0: "TYPE_UNKNOWN", 1: "TYPE_VEHICLE", 2: "TYPE_PEDESTRIAN", 3: "TYPE_SIGN", 4: "TYPE_CYCLIST"}
CATEGORIES = {"TYPE_VEHICLE": "car", "TYPE_PEDESTRIAN": "pedestrian", "TYPE_SIGN": "sign", "TYPE_CYCLIST": "cyclist"}
# CameraCalibration.RollingShutterReadOutDirection
SHUTTER = {0: "UNKNOWN", 1: "TOP_TO_BOTTOM", 2: "LEFT_TO_RIGHT", 3: "BOTTOM_TO_TOP", 4: "RIGHT_TO_LEFT",
           5: "GLOBAL_SHUTTER"}
# Waymo camera axes (x forward, y left, z up) of OpenCV's x right, y down, z forward (columns)
R_WAYMO_OPENCV = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
INTRINSICS = ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2", "k3")  # CameraCalibration.intrinsic, in order
V2_COMPONENTS = ("camera_image", "camera_calibration", "lidar", "lidar_calibration", "lidar_pose", "vehicle_pose",
                 "lidar_box")

# --------------------------------------------------------------------------- schema
# message -> (field name, number, type, label): the wire format's numbers and types of the fields gsim reads
# (Waymo's dataset.proto and label.proto; Label.Box is "Box" here). label: "optional" unless given.
_SCHEMA = {
    "MatrixShape": (("dims", 1, "int32", "repeated"),),
    "MatrixFloat": (("data", 1, "float", "packed"), ("shape", 2, "MatrixShape")),
    "Transform": (("transform", 1, "double", "repeated"),),
    "CameraCalibration": (("name", 1, "int32"), ("intrinsic", 2, "double", "repeated"), ("extrinsic", 3, "Transform"),
                          ("width", 4, "int32"), ("height", 5, "int32"), ("rolling_shutter_direction", 6, "int32")),
    "LaserCalibration": (("name", 1, "int32"), ("beam_inclinations", 2, "double", "repeated"),
                         ("beam_inclination_min", 3, "double"), ("beam_inclination_max", 4, "double"),
                         ("extrinsic", 5, "Transform")),
    "Context": (("name", 1, "string"), ("camera_calibrations", 2, "CameraCalibration", "repeated"),
                ("laser_calibrations", 3, "LaserCalibration", "repeated")),
    "RangeImage": (("range_image", 1, "MatrixFloat"), ("range_image_compressed", 2, "bytes"),
                   ("range_image_pose_compressed", 4, "bytes")),
    "CameraImage": (("name", 1, "int32"), ("image", 2, "bytes"), ("pose", 3, "Transform"),
                    ("pose_timestamp", 5, "double"), ("shutter", 6, "double"), ("camera_trigger_time", 7, "double"),
                    ("camera_readout_done_time", 8, "double")),
    "Laser": (("name", 1, "int32"), ("ri_return1", 2, "RangeImage"), ("ri_return2", 3, "RangeImage")),
    "Box": (("center_x", 1, "double"), ("center_y", 2, "double"), ("center_z", 3, "double"), ("width", 4, "double"),
            ("length", 5, "double"), ("height", 6, "double"), ("heading", 7, "double")),
    "Label": (("box", 1, "Box"), ("type", 3, "int32"), ("id", 4, "string")),
    "Frame": (("context", 1, "Context"), ("timestamp_micros", 2, "int64"), ("pose", 3, "Transform"),
              ("images", 4, "CameraImage", "repeated"), ("lasers", 5, "Laser", "repeated"),
              ("laser_labels", 6, "Label", "repeated")),
}
SCHEMA_PACKAGE = "gsim.waymo"


@functools.lru_cache(maxsize=1)
def schema() -> SimpleNamespace:
    """The message classes of `_SCHEMA` (``schema().Frame`` ...), built in a private descriptor pool."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError as e:
        raise MissingExtra(f"reading Waymo TFRecords needs protobuf ({e}); install it with: "
                           f"pip install -e \".[formats]\"") from None
    F = descriptor_pb2.FieldDescriptorProto
    scalars = {"int32": F.TYPE_INT32, "int64": F.TYPE_INT64, "float": F.TYPE_FLOAT, "double": F.TYPE_DOUBLE,
               "string": F.TYPE_STRING, "bytes": F.TYPE_BYTES}
    fdp = descriptor_pb2.FileDescriptorProto(name="gsim/scenes/waymo_v1.proto", package=SCHEMA_PACKAGE,
                                             syntax="proto2")
    for message, fields in _SCHEMA.items():
        m = fdp.message_type.add(name=message)
        for name, number, kind, *label in fields:
            label = label[0] if label else "optional"
            f = m.field.add(name=name, number=number,
                            label=F.LABEL_OPTIONAL if label == "optional" else F.LABEL_REPEATED)
            if kind in scalars:
                f.type = scalars[kind]
            else:
                f.type, f.type_name = F.TYPE_MESSAGE, f".{SCHEMA_PACKAGE}.{kind}"
            if label == "packed":
                f.options.packed = True
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return SimpleNamespace(**{m: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{SCHEMA_PACKAGE}.{m}"))
                              for m in _SCHEMA})


# --------------------------------------------------------------------------- TFRecord framing

def _crc_tables() -> np.ndarray:
    """(4, 256): [0] the byte-at-a-time table of CRC-32C (Castagnoli, reflected), [k] a byte followed by k zero
    bytes (slicing by 4)."""
    t = np.zeros((4, 256), np.uint32)
    t[0] = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t[0] = np.where(t[0] & 1, (t[0] >> 1) ^ np.uint32(0x82F63B78), t[0] >> 1)
    for k in range(1, 4):
        t[k] = (t[k - 1] >> 8) ^ t[0][t[k - 1] & 0xFF]
    return t


_CRC_TABLES = _crc_tables()
_CRC_TABLE = _CRC_TABLES[0]
_CRC_TABLE_LIST = _CRC_TABLE.tolist()
_CRC_LANE = 1024  # bytes per lane of the vectorised CRC
_CRC_SHIFTS: List[np.ndarray] = []  # [k]: (4,256) tables of "feed _CRC_LANE * 2**k zero bytes" on a raw CRC


def _crc_apply(tables: np.ndarray, x: np.ndarray) -> np.ndarray:
    return tables[0][x & 0xFF] ^ tables[1][(x >> 8) & 0xFF] ^ tables[2][(x >> 16) & 0xFF] ^ tables[3][x >> 24]


def _crc_shift(k: int) -> np.ndarray:
    """A raw CRC (no init, no final xor) is GF(2)-linear: feeding n zero bytes is a 32x32 bit matrix, kept as the
    byte tables of its columns' images."""
    bits = np.uint32(1) << np.arange(32, dtype=np.uint32)
    while len(_CRC_SHIFTS) <= k:
        if _CRC_SHIFTS:
            cols = _crc_apply(_CRC_SHIFTS[-1], _crc_apply(_CRC_SHIFTS[-1], bits))  # twice the previous length
        else:
            cols = bits
            for _ in range(_CRC_LANE):
                cols = _CRC_TABLE[cols & 0xFF] ^ (cols >> 8)
        v = np.arange(256)
        tables = np.zeros((4, 256), np.uint32)
        for i in range(32):
            tables[i // 8] ^= np.where((v >> (i % 8)) & 1, cols[i], 0).astype(np.uint32)
        _CRC_SHIFTS.append(tables)
    return _CRC_SHIFTS[k]


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``. Long inputs run as many lanes at once: leading zero bytes leave a raw CRC
    unchanged, so the data is zero-padded in front to a power-of-two count of equal lanes, the initial value
    0xFFFFFFFF is folded into the first 4 data bytes, and lane CRCs combine pairwise (``crc(A B) = shift_|B|(crc(A))
    ^ crc(B)``)."""
    n = len(data)
    if n < 4 * _CRC_LANE:
        c = 0xFFFFFFFF
        for b in data:
            c = _CRC_TABLE_LIST[(c ^ b) & 0xFF] ^ (c >> 8)
        return c ^ 0xFFFFFFFF
    lanes = 1 << (-(-n // _CRC_LANE) - 1).bit_length()
    buf = np.zeros(lanes * _CRC_LANE, np.uint8)
    buf[-n:] = np.frombuffer(data, np.uint8)
    buf[-n:-n + 4] ^= 0xFF
    c = np.zeros(lanes, np.uint32)
    t0, t1, t2, t3 = _CRC_TABLES
    for word in buf.view("<u4").reshape(lanes, _CRC_LANE // 4).T.copy():  # 4 bytes of every lane a step
        c ^= word
        c = t3[c & 0xFF] ^ t2[(c >> 8) & 0xFF] ^ t1[(c >> 16) & 0xFF] ^ t0[c >> 24]
    k = 0
    while len(c) > 1:
        c = _crc_apply(_crc_shift(k), c[0::2]) ^ c[1::2]
        k += 1
    return int(c[0]) ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C."""
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path: Path) -> Iterator[Tuple[int, int, bytes]]:
    """(record index, byte offset, data) of each record of a TFRecord file, CRCs checked."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        k = offset = 0
        while offset < size:
            where = f"{path}: record {k} at byte {offset}"
            head = f.read(12)
            if len(head) < 12:
                raise LogFormatError(f"{where}: truncated header ({len(head)} of 12 bytes)")
            n, crc = struct.unpack("<QI", head)
            if masked_crc32c(head[:8]) != crc:
                raise LogFormatError(f"{where}: length CRC mismatch: corrupt, or not a TFRecord file")
            if offset + 16 + n > size:
                raise LogFormatError(f"{where}: truncated: the record needs {16 + n} bytes, the file has "
                                     f"{size - offset} left")
            data = f.read(n)
            if masked_crc32c(data) != struct.unpack("<I", f.read(4))[0]:
                raise LogFormatError(f"{where}: data CRC mismatch ({n} bytes): the record is corrupt")
            yield k, offset, data
            k += 1
            offset += 16 + n


# --------------------------------------------------------------------------- decoding

def _transform(t, where: str) -> np.ndarray:
    """A Waymo Transform (16 doubles, row major) -> rigid 4x4."""
    v = np.asarray(t.transform, np.float64)
    if v.size != 16:
        raise LogFormatError(f"{where}.transform: expected 16 numbers (4x4 row major), got {v.size}")
    T = v.reshape(4, 4)
    R = T[:3, :3]
    if (not np.all(np.isfinite(T)) or np.abs(T[3] - [0, 0, 0, 1]).max() > 1e-9
            or np.abs(R @ R.T - np.eye(3)).max() > 1e-6 or np.linalg.det(R) < 0):
        raise LogFormatError(f"{where}.transform: not a rigid transform (orthonormal rotation, last row 0 0 0 1)")
    return T


def _euler_poses(v: np.ndarray) -> np.ndarray:
    """(..., 6) roll, pitch, yaw, x, y, z -> (..., 4, 4) with R = Rz(yaw) Ry(pitch) Rx(roll)."""
    v = np.asarray(v, np.float64)
    cr, sr, cp, sp, cy, sy = (f(v[..., i]) for i in range(3) for f in (np.cos, np.sin))
    T = np.zeros(v.shape[:-1] + (4, 4))
    T[..., 0, :3] = np.stack([cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr], -1)
    T[..., 1, :3] = np.stack([sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr], -1)
    T[..., 2, :3] = np.stack([-sp, cp * sr, cp * cr], -1)
    T[..., :3, 3] = v[..., 3:6]
    T[..., 3, 3] = 1.0
    return T


def _matrix(pb, blob: bytes, where: str, channels: int, message=None) -> np.ndarray:
    """A zlib-compressed MatrixFloat (or an already decoded ``message``) -> (H, W, C) float32, C >= channels."""
    from google.protobuf.message import DecodeError
    m = message
    if m is None:
        try:
            m = pb.MatrixFloat.FromString(zlib.decompress(blob))
        except zlib.error as e:
            raise LogFormatError(f"{where}: not zlib-compressed data ({e})") from None
        except DecodeError as e:
            raise LogFormatError(f"{where}: not a MatrixFloat ({e})") from None
    dims = tuple(m.shape.dims)
    a = np.asarray(m.data, np.float32)
    if len(dims) != 3 or min(dims) < 1 or dims[2] < channels or math.prod(dims) != a.size:
        raise LogFormatError(f"{where}: expected a [H, W, >={channels}] matrix, got shape {list(dims)} with "
                             f"{a.size} values")
    return a.reshape(dims)


def _inclinations(calib, height: int, where: str) -> np.ndarray:
    """Ascending inclinations (radians), one per range-image row from the bottom one."""
    beams = np.asarray(calib.beam_inclinations, np.float64)
    if beams.size == 0:
        lo, hi = calib.beam_inclination_min, calib.beam_inclination_max
        if not lo < hi:
            raise LogFormatError(f"{where}: beam_inclinations empty and beam_inclination_min {lo} >= max {hi}")
        return lo + (np.arange(height) + 0.5) * (hi - lo) / height
    if beams.size != height:
        raise LogFormatError(f"{where}.beam_inclinations: {beams.size} beams, the range image has {height} rows")
    return beams


def column_azimuths(width: int, T_vehicle_lidar: np.ndarray) -> np.ndarray:
    """Azimuth (radians, laser frame) of each range-image column."""
    yaw = math.atan2(T_vehicle_lidar[1, 0], T_vehicle_lidar[0, 0])
    return math.pi - 2 * math.pi * (np.arange(width) + 0.5) / width - yaw


def column_offsets_us(width: int) -> np.ndarray:
    """Each range-image column's firing time after the sweep's start (the TOP's clockwise spin from +180 deg)."""
    return np.round((np.arange(width) + 0.5) * SWEEP_US / width).astype(np.int64)


def azimuth_offset_us(x: float, y: float) -> int:
    """The sweep time of the vehicle-frame direction (x, y) (seen from the TOP)."""
    return int(round((math.pi - math.atan2(y, x)) / (2 * math.pi) * SWEEP_US)) % SWEEP_US


# --------------------------------------------------------------------------- conversion

class _Laser:
    """What the segment says of one LiDAR: calibration, range-image size, observed ranges."""

    def __init__(self, name: str, calib, where: str):
        self.name, self.calib, self.where = name, calib, where
        self.T = _transform(calib.extrinsic, f"{where}.extrinsic")
        self.shape: Optional[Tuple[int, int]] = None
        self.incl: Optional[np.ndarray] = None  # ascending inclinations, radians
        self.dirs: Optional[np.ndarray] = None  # (H, W, 3) unit directions in the laser frame, row 0 the highest
        self.ranges = [math.inf, 0.0]
        self.sweeps = 0

    def points(self, ri: np.ndarray, where: str) -> Tuple[np.ndarray, np.ndarray]:
        """(valid (H, W) bool, (H, W, 3) laser-frame points) of one return's range image."""
        h, w = ri.shape[:2]
        if self.shape is None:
            self.shape, self.incl = (h, w), _inclinations(self.calib, h, self.where)
            incl, az = self.incl[::-1, None], column_azimuths(w, self.T)[None]
            self.dirs = np.stack(np.broadcast_arrays(np.cos(incl) * np.cos(az), np.cos(incl) * np.sin(az),
                                                     np.sin(incl)), -1)
        elif self.shape != (h, w):
            raise LogFormatError(f"{where}: range image is {h}x{w}, earlier ones of this laser {self.shape[0]}x"
                                 f"{self.shape[1]}")
        r = ri[..., 0].astype(np.float64)
        if not np.all(np.isfinite(r)):
            raise LogFormatError(f"{where}: range channel has NaN or inf")
        valid = r > 0
        if valid.any():
            self.ranges = [min(self.ranges[0], float(r[valid].min())), max(self.ranges[1], float(r[valid].max()))]
        return valid, self.dirs * r[..., None]

    def beams(self) -> LidarBeams:
        lo, hi = math.floor(self.ranges[0] * 100) / 100, math.ceil(self.ranges[1] * 100) / 100
        return LidarBeams(tuple(np.degrees(self.incl).tolist()), 360.0 / self.shape[1], lo, max(hi, lo + 0.01))


def _intensity(ri: np.ndarray, valid: np.ndarray, where: str) -> np.ndarray:
    i = ri[..., 1][valid].astype(np.float64)
    if not np.all(np.isfinite(i)) or (i < 0).any():
        raise LogFormatError(f"{where}: intensity channel has values that are negative, NaN or inf")
    return np.tanh(i)


def camera_timing(direction: int, trigger_s: float, done_s: float, shutter_s: float, pose_s: float,
                  where: str) -> Tuple[int, int, str]:
    """(image timestamp_us, readout_us, how it was timed) of one CameraImage (see the module docstring)."""
    if trigger_s > 0 and done_s >= trigger_s:
        if direction == 1:  # TOP_TO_BOTTOM
            readout = done_s - trigger_s - shutter_s
            if readout < 0 or shutter_s < 0:
                raise LogFormatError(f"{where}: shutter {shutter_s} s is negative or longer than trigger to readout "
                                     f"done ({done_s - trigger_s} s)")
            return round((trigger_s + shutter_s / 2) * 1e6), round(readout * 1e6), "rows"
        if direction == 5:  # GLOBAL_SHUTTER
            return round((trigger_s + shutter_s / 2) * 1e6), 0, "global"
        return round((trigger_s + done_s) / 2 * 1e6), 0, "middle"
    if pose_s <= 0:
        raise LogFormatError(f"{where}: no camera_trigger_time / camera_readout_done_time and no pose_timestamp")
    return round(pose_s * 1e6), 0, "pose"


class _Segment:
    """Everything of the segment but the files: sensors, ego poses, labels, statistics for the notes."""

    def __init__(self, src: Path):
        self.src = src
        self.context = None
        self.cameras: Dict[int, dict] = {}  # name enum -> {name, camera, T, direction, readouts, timing}
        self.lasers: Dict[int, _Laser] = {}
        self.ego: Dict[int, np.ndarray] = {}
        self.windows: List[Tuple[int, int, int]] = []  # (first, last ego time, record) per frame
        self.tracks = TrackBuilder(CATEGORIES)
        self.top_xy = (0.0, 0.0)
        self.frame_times: List[int] = []
        self.deskew_error = 0.0
        self.camera_vs_top: List[Tuple[float, float]] = []
        self.frame_pose_ego = 0
        self.raw_sweeps = 0
        self.virtual_sweeps = 0
        self.empty_lasers = 0
        self.unknown_names: set = set()

    def start(self, ctx, where: str) -> None:
        """Sensors from the first frame's context; later frames' must be the same."""
        if self.context is None:
            self.context = ctx
            for k, c in enumerate(ctx.camera_calibrations):
                self._add_camera(c, f"{where}: context.camera_calibrations[{k}]")
            for k, c in enumerate(ctx.laser_calibrations):
                w = f"{where}: context.laser_calibrations[{k}]"
                if c.name in self.lasers:
                    raise LogFormatError(f"{w}.name: laser {c.name} calibrated twice")
                self.lasers[c.name] = _Laser(self._name(LASER_NAMES, c.name, "laser"), c, w)
                if c.name == TOP:
                    self.top_xy = tuple(self.lasers[c.name].T[:2, 3])
        elif ctx.name != self.context.name:
            raise LogFormatError(f"{where}: context.name {ctx.name!r} is another segment than the first frame's "
                                 f"{self.context.name!r} (a file holds one segment)")
        elif (list(ctx.camera_calibrations) != list(self.context.camera_calibrations)
              or list(ctx.laser_calibrations) != list(self.context.laser_calibrations)):
            raise LogFormatError(f"{where}: context calibrations differ from the first frame's (a gsim log has "
                                 f"fixed sensors)")

    def _name(self, names: Dict[int, str], value: int, kind: str) -> str:
        if value not in names:
            self.unknown_names.add(f"{kind} {value}")
            return f"{kind}_{value}"
        return names[value]

    def _add_camera(self, c, where: str) -> None:
        if c.name in self.cameras:
            raise LogFormatError(f"{where}.name: camera {c.name} calibrated twice")
        k = np.asarray(c.intrinsic, np.float64)
        if k.size != 9 or not np.all(np.isfinite(k)):
            raise LogFormatError(f"{where}.intrinsic: expected 9 finite numbers [f_u, f_v, c_u, c_v, k1, k2, p1, "
                                 f"p2, k3], got {k.size}")
        if c.width <= 0 or c.height <= 0:
            raise LogFormatError(f"{where}: width/height missing (got {c.width}x{c.height})")
        cam = camera_from_params(where, c.width, c.height, **dict(zip(INTRINSICS, k.tolist())))
        T = _transform(c.extrinsic, f"{where}.extrinsic") @ make_pose(R_WAYMO_OPENCV, np.zeros(3))
        self.cameras[c.name] = {"name": self._name(CAMERA_NAMES, c.name, "camera"), "camera": cam, "T": T,
                                "direction": c.rolling_shutter_direction, "readouts": [], "timing": set(),
                                "images": 0}

    def add_ego(self, frame_ego: Dict[int, np.ndarray], k: int) -> None:
        if not frame_ego:
            return
        times = sorted(frame_ego)
        self.windows.append((times[0], times[-1], k))
        self.ego.update(frame_ego)

    def check_windows(self) -> None:
        w = sorted(self.windows)
        for a, b in zip(w, w[1:]):
            if b[0] <= a[1]:
                raise LogFormatError(f"{self.src}: records {a[2]} and {b[2]} have ego poses interleaved in time "
                                     f"({a[0]}..{a[1]} and {b[0]}..{b[1]} us): frames must not overlap")


def _check_source(src: Path) -> None:
    if src.is_dir() or src.suffix == ".parquet":
        parquet = src.suffix == ".parquet" or any(src.rglob("*.parquet"))
        if parquet:
            raise InputError(f"{src}: Waymo's v2 layout (parquet components) is not supported; gsim convert waymo "
                             f"reads the v1 format, one segment's .tfrecord file of Frame records (the v2 layout "
                             f"would need the components {', '.join(V2_COMPONENTS)} of the segment)")
        found = sorted(p.name for p in src.glob("*.tfrecord"))
        raise InputError(f"{src}: expected one segment's .tfrecord file (Waymo v1 Frame records), got a folder"
                         + (f" ({len(found)} .tfrecord files in it, e.g. {found[0]}: convert each)" if found else ""))
    if not src.is_file():
        raise InputError(f"{src}: no such file (expected one segment's .tfrecord)")


def convert_waymo(src, out, progress: bool = True) -> Path:
    """Convert one Waymo Open Dataset v1 segment (a .tfrecord of Frame records) into a gsim log at ``out``."""
    from tqdm import tqdm
    src, out = Path(src), Path(out)
    _check_source(src)
    pb = schema()
    seg = _Segment(src)
    with tempfile.TemporaryDirectory() as tmp, LogWriter(out, name="waymo", source="waymo-open-dataset-v1") as w:
        with tqdm(total=src.stat().st_size, desc=f"waymo {src.name}", unit="B", unit_scale=True,
                  disable=not progress) as bar:
            for k, offset, data in read_records(src):
                _convert_frame(pb, seg, w, k, f"{src}: record {k} (byte {offset})", data, Path(tmp))
                bar.update(16 + len(data))
        if not seg.frame_times:
            raise LogFormatError(f"{src}: no records (an empty TFRecord file)")
        _finish(seg, w)
    return out


def _convert_frame(pb, seg: _Segment, w: LogWriter, k: int, where: str, data: bytes, tmp: Path) -> None:
    from google.protobuf.message import DecodeError
    try:
        frame = pb.Frame.FromString(data)
    except DecodeError as e:
        raise LogFormatError(f"{where}: not a Waymo Frame protobuf ({e})") from None
    if not frame.HasField("context"):
        raise LogFormatError(f"{where}: context missing")
    seg.start(frame.context, where)
    if k == 0:
        w.name = actor_id(frame.context.name or seg.src.stem)
    t0 = frame.timestamp_micros
    if t0 <= 0:
        raise LogFormatError(f"{where}: timestamp_micros missing or not positive ({t0})")
    if seg.frame_times and t0 <= seg.frame_times[-1]:
        raise LogFormatError(f"{where}: timestamp_micros {t0} is not after the previous frame's "
                             f"{seg.frame_times[-1]} (frames must be in time order)")
    seg.frame_times.append(t0)
    frame_pose = _transform(frame.pose, f"{where}: pose") if frame.HasField("pose") else None
    ego: Dict[int, np.ndarray] = {}  # this frame's ego poses (first one of a microsecond kept)
    cams = _images(seg, w, frame, len(seg.frame_times) - 1, where, ego, tmp)
    lids: Dict[str, dict] = {}
    virtual = []
    for j, laser in enumerate(frame.lasers):
        lw = f"{where}: lasers[{j}]"
        if not any(ri.range_image_compressed or ri.HasField("range_image")
                   for ri in (laser.ri_return1, laser.ri_return2)):
            seg.empty_lasers += 1  # an entry without returns (the camera-only samples have such)
            continue
        if laser.name not in seg.lasers:
            raise LogFormatError(f"{lw}.name: laser {laser.name} has no calibration in context.laser_calibrations")
        if laser.ri_return1.range_image_pose_compressed:
            _raw_sweep(pb, seg, w, laser, len(seg.frame_times) - 1, t0, lw, ego, lids)
        else:
            virtual.append((j, laser))
    if virtual:
        if frame_pose is None:
            raise LogFormatError(f"{where}: pose missing (the vehicle frame of the range images without per-pixel "
                                 f"poses)")
        mid = t0 + SWEEP_US // 2
        if not ego:
            ego[mid] = frame_pose
            seg.frame_pose_ego += 1
        t_ref = min(ego, key=lambda t: (abs(t - mid), t))
        for j, laser in virtual:
            _virtual_sweep(pb, seg, w, laser, len(seg.frame_times) - 1, t_ref, ego[t_ref], frame_pose,
                           f"{where}: lasers[{j}]", lids)
    if frame.laser_labels:
        if frame_pose is None:
            raise LogFormatError(f"{where}: pose missing (the vehicle frame of laser_labels)")
        _labels(seg, frame.laser_labels, t0, frame_pose, where)
    if not ego and frame_pose is not None:
        ego[t0 + SWEEP_US // 2] = frame_pose
        seg.frame_pose_ego += 1
    if not ego:
        raise LogFormatError(f"{where}: no vehicle pose (no image poses, no TOP per-pixel poses, no frame pose)")
    seg.add_ego(ego, k)
    w.add_frame(t0, cameras=cams, lidars=lids)


def _images(seg: _Segment, w: LogWriter, frame, index: int, where: str, ego: Dict[int, np.ndarray],
            tmp: Path) -> Dict[str, dict]:
    from PIL import Image, UnidentifiedImageError
    cams = {}
    for j, im in enumerate(frame.images):
        iw = f"{where}: images[{j}]"
        if im.name not in seg.cameras:
            raise LogFormatError(f"{iw}.name: camera {im.name} has no calibration in context.camera_calibrations")
        c = seg.cameras[im.name]
        iw = f"{iw} ({c['name']})"
        if c["name"] in cams:
            raise LogFormatError(f"{iw}: a second image of this camera in the frame")
        if not im.HasField("pose"):
            raise LogFormatError(f"{iw}.pose: missing (the vehicle pose of the image)")
        T = _transform(im.pose, f"{iw}.pose")
        t, readout, how = camera_timing(c["direction"], im.camera_trigger_time, im.camera_readout_done_time,
                                        im.shutter, im.pose_timestamp, iw)
        if im.pose_timestamp <= 0:
            raise LogFormatError(f"{iw}.pose_timestamp: missing (the time of the image's pose)")
        ego.setdefault(round(im.pose_timestamp * 1e6), T)
        c["readouts"].append(readout)
        c["timing"].add(how)
        try:
            with Image.open(io.BytesIO(im.image)) as pil:
                size, fmt = pil.size, pil.format
        except (UnidentifiedImageError, OSError) as e:
            raise LogFormatError(f"{iw}.image: not a readable image ({e})") from None
        if fmt != "JPEG":
            raise LogFormatError(f"{iw}.image: a {fmt} image; expected JPEG")
        cam = c["camera"]
        if size != (cam.width, cam.height):
            raise LogFormatError(f"{iw}.image: {size[0]}x{size[1]}, its calibration says {cam.width}x{cam.height}")
        path = tmp / "image.jpg"
        path.write_bytes(im.image)
        cams[c["name"]] = w.image(c["name"], index, t, src=path)
        c["images"] += 1
    return cams


def _raw_sweep(pb, seg: _Segment, w: LogWriter, laser, index: int, t0: int, where: str,
               ego: Dict[int, np.ndarray], lids: Dict[str, dict]) -> None:
    """A range image with per-pixel poses: (N,5) sweeps in the laser frame at each point's own time; one column
    pose every EGO_SAMPLE_US joins the frame's ego poses (time -> T_world_vehicle)."""
    L = seg.lasers[laser.name]
    returns = []
    for r, ri in enumerate((laser.ri_return1, laser.ri_return2)):
        rw = f"{where}.ri_return{r + 1}"
        a = _range_image(pb, ri, rw)
        if a is None and r == 0:
            raise LogFormatError(f"{rw}: range_image_pose_compressed without range_image_compressed")
        if a is not None:
            returns.append((a, rw) + L.points(a, rw))
    pose_w = f"{where}.ri_return1.range_image_pose_compressed"
    pose_img = _matrix(pb, laser.ri_return1.range_image_pose_compressed, pose_w, 6)
    if pose_img.shape[:2] != L.shape:
        raise LogFormatError(f"{pose_w}: {pose_img.shape[0]}x{pose_img.shape[1]}, the range image is "
                             f"{L.shape[0]}x{L.shape[1]}")
    any_valid = np.any([v for _, _, v, _ in returns], axis=0)
    cols = np.nonzero(any_valid.any(0))[0]
    if len(cols) == 0:
        return
    offsets = column_offsets_us(L.shape[1])
    rows = np.argmax(any_valid[:, cols], axis=0)  # each column's pose: its first row with a return
    bucket = offsets[cols] // EGO_SAMPLE_US
    keep = np.r_[True, bucket[1:] != bucket[:-1]]
    keep[-1] = True
    samples = dict(zip((t0 + offsets[cols[keep]]).tolist(), _euler_poses(pose_img[rows[keep], cols[keep]])))
    _compare_image_poses(seg, ego, samples)
    for t, T in samples.items():
        ego.setdefault(t, T)
    times = np.asarray(sorted(ego))
    T_col = interpolate_poses(times, np.stack([ego[t] for t in times]), t0 + offsets) @ L.T
    entry = []
    for a, rw, valid, xyz in returns:
        rr, cc = np.nonzero(valid)
        p = xyz[rr, cc]
        exact = transform_each(_euler_poses(pose_img[rr, cc]) @ L.T, p)
        interp = transform_each(T_col[cc], p)
        err = float(np.linalg.norm(exact - interp, axis=1).max()) if len(p) else 0.0
        if err > MAX_DESKEW_ERROR_M:
            raise LogFormatError(f"{pose_w}: a point of {rw} lies {err:.3f} m from where its own pixel pose puts it "
                                 f"when the frame's ego poses (image poses, TOP column poses) are interpolated at "
                                 f"its column's time (bound {MAX_DESKEW_ERROR_M} m): the poses are not one smooth "
                                 f"motion")
        seg.deskew_error = max(seg.deskew_error, err)
        entry.append(np.column_stack([p, _intensity(a, valid, rw), offsets[cc]]).astype(np.float32))
    lids[L.name] = w.sweep(L.name, index, t0, entry[0], entry[1] if len(entry) > 1 else None)
    L.sweeps += 1
    seg.raw_sweeps += 1


def _range_image(pb, ri, where: str) -> Optional[np.ndarray]:
    """One return's (H, W, C) range image, or None where the frame has none."""
    if ri.range_image_compressed:
        return _matrix(pb, ri.range_image_compressed, f"{where}.range_image_compressed", 2)
    if ri.HasField("range_image"):  # the deprecated uncompressed field
        return _matrix(pb, b"", f"{where}.range_image", 2, ri.range_image)
    return None


def _virtual_sweep(pb, seg: _Segment, w: LogWriter, laser, index: int, t_ref: int, T_world_vehicle: np.ndarray,
                   frame_pose: np.ndarray, where: str, lids: Dict[str, dict]) -> None:
    """A range image without per-pixel poses (points in the frame pose's vehicle frame) -> (N,4) sweeps in the
    laser frame at t_ref."""
    L = seg.lasers[laser.name]
    M = invert(T_world_vehicle @ L.T) @ frame_pose @ L.T
    entry = []
    for r, ri in enumerate((laser.ri_return1, laser.ri_return2)):
        rw = f"{where}.ri_return{r + 1}"
        a = _range_image(pb, ri, rw)
        if a is None:
            break
        valid, xyz = L.points(a, rw)
        p = xyz[valid] @ np.ascontiguousarray(M[:3, :3].T) + M[:3, 3]  # (a strided right operand is slow)
        entry.append(np.column_stack([p, _intensity(a, valid, rw)]).astype(np.float32))
    if entry and len(entry[0]):
        lids[L.name] = w.sweep(L.name, index, t_ref, entry[0], entry[1] if len(entry) > 1 else None)
        L.sweeps += 1
        seg.virtual_sweeps += 1


def _compare_image_poses(seg: _Segment, ego: Dict[int, np.ndarray], top: Dict[int, np.ndarray]) -> None:
    """How far each image pose of the frame is from the TOP's column poses interpolated at its time (notes)."""
    if len(top) < 2:
        return
    times = np.asarray(sorted(top))
    poses = np.stack([top[t] for t in times])
    for t, T in ego.items():
        if times[0] < t < times[-1]:
            seg.camera_vs_top.append(pose_difference(interpolate_poses(times, poses, [t])[0], T))


def _labels(seg: _Segment, labels, t0: int, frame_pose: np.ndarray, where: str) -> None:
    for j, lab in enumerate(labels):
        lw = f"{where}: laser_labels[{j}]"
        if not lab.id:
            raise LogFormatError(f"{lw}.id: missing")
        if not lab.HasField("box"):
            raise LogFormatError(f"{lw}.box: missing")
        b = lab.box
        c, s = math.cos(b.heading), math.sin(b.heading)
        T = make_pose([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], [b.center_x, b.center_y, b.center_z])
        t = t0 + azimuth_offset_us(b.center_x - seg.top_xy[0], b.center_y - seg.top_xy[1])
        seg.tracks.add(lab.id, LABEL_TYPES.get(lab.type, f"TYPE_{lab.type}"), t, frame_pose @ T,
                       (b.length, b.width, b.height), f"{lw}.box")


def _finish(seg: _Segment, w: LogWriter) -> None:
    seg.check_windows()
    for t in sorted(seg.ego):
        w.add_ego_pose(t, seg.ego[t])
    notes = [f"Waymo Open Dataset v1 segment {seg.context.name} ({len(seg.frame_times)} frames)",
             "world = Waymo's global frame; vehicle = Waymo's vehicle frame; cameras: Waymo camera axes (x forward, "
             "y left, z up) turned to OpenCV's; principal points not shifted (Waymo's pixel 0 is the first pixel's "
             "left edge, as gsim's)"]
    unmodelled: Dict[str, List[str]] = {}
    for c in seg.cameras.values():
        if not c["images"]:
            continue
        readout = int(np.median(c["readouts"]))
        w.add_camera(c["name"], c["camera"], c["T"], readout)
        if "middle" in c["timing"]:
            unmodelled.setdefault(SHUTTER.get(c["direction"], str(c["direction"])), []).append(c["name"])
        if "rows" in c["timing"]:
            notes.append(f"camera {c['name']}: rolling shutter TOP_TO_BOTTOM, readout_us = median {readout} "
                         f"(images {min(c['readouts'])}..{max(c['readouts'])})")
        if "pose" in c["timing"]:
            notes.append(f"camera {c['name']}: images without trigger/readout times are timed at their "
                         f"pose_timestamp")
    for direction, names in unmodelled.items():
        notes.append(f"cameras {', '.join(names)}: rolling shutter {direction}, which gsim's (rows, top first) "
                     f"cannot express: images timed at their middle line's mid-exposure, as a global shutter")
    for L in seg.lasers.values():
        if L.sweeps:
            w.add_lidar(L.name, L.T, L.beams())
    for kind, names in (("cameras", [c["name"] for c in seg.cameras.values() if not c["images"]]),
                        ("lasers", [L.name for L in seg.lasers.values() if not L.sweeps])):
        if names:
            notes.append(f"{kind} calibrated but never recorded in the segment, left out: {', '.join(names)}")
    if any(L.sweeps for L in seg.lasers.values()):
        notes.append("LiDAR intensity = tanh(Waymo intensity); beams' min/max range = the segment's observed "
                     "ranges (the format has no range limits)")
    if seg.raw_sweeps:
        notes.append(f"TOP sweeps: points in the laser frame at their own column's time (t + (c + 0.5) * "
                     f"{SWEEP_US} / W us, clockwise from +180 deg); ego poses = one column pose every "
                     f"{EGO_SAMPLE_US} us and the images' poses; interpolated, they put every point within "
                     f"{seg.deskew_error * 1000:.2f} mm of its own pixel pose's place")
    if seg.virtual_sweeps:
        notes.append("range images without per-pixel poses (side LiDARs): points from Frame.pose's vehicle frame "
                     "into the laser frame at the frame's ego pose time nearest its middle, as (N,4) sweeps")
    if seg.camera_vs_top:
        d = np.asarray(seg.camera_vs_top)
        notes.append(f"image poses vs the TOP's column poses at the same time: median {np.median(d[:, 0]) * 1000:.1f}"
                     f" mm / {np.median(d[:, 1]):.4f} deg, max {d[:, 0].max() * 1000:.1f} mm / {d[:, 1].max():.4f}"
                     f" deg")
    if seg.frame_pose_ego:
        notes.append(f"{seg.frame_pose_ego} frames have neither image poses nor per-pixel poses: their Frame.pose "
                     f"is the ego pose at timestamp_micros + {SWEEP_US // 2} us")
    if seg.empty_lasers:
        notes.append(f"{seg.empty_lasers} laser entries without range images skipped")
    if seg.unknown_names:
        notes.append(f"sensor name values outside Waymo's enums, named by number: {sorted(seg.unknown_names)}")
    for track in seg.tracks.tracks():
        w.add_actor(track)
    if len(seg.tracks):
        notes.append("actors: laser_labels tracked by id, each box timed when the TOP swept its centre's azimuth; "
                     "TYPE_VEHICLE -> car (Waymo's vehicle class includes trucks and buses)")
    notes.append("not converted: camera labels, projected labels, segmentation, scene flow, elongation, "
                 "no-label zones, maps")
    w.notes.extend(notes)


# gsim convert's subcommand for this format: its help line, what SRC (and OUT) is, options the converter takes
HELP = ("Waymo Open Dataset v1: one segment's .tfrecord of Frame records (no TensorFlow; the v2 parquet layout is "
        "not supported)")
SRC = "the segment's .tfrecord file"
