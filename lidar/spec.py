"""LiDAR sensor models as types: spinning LiDARs (`LidarSpec`) and generic ray tables (`RayTableSpec`).

Frame: the sensor's own, x forward, y left, z up (right-handed, metres). Angles in degrees:
elevation up from the xy plane; azimuth counter-clockwise about +z seen from above, 0 along +x.
Vendor tables in other conventions (Velodyne's and Hesai's azimuths grow clockwise from the front,
Ouster's lidar frame has x backwards) are converted where the presets are built.
Time: integer microseconds from the start of the sweep.

A spinning sweep is a grid of (lasers, columns) rays. Column ``c`` is fired at
``c * column_period_us`` with the rotor at ``start_azimuth_deg -/+ c * azimuth_resolution_deg``
(``-`` for a clockwise spin); laser ``l`` fires ``firing_offsets_us[l]`` later within the column and
points ``azimuth_offsets_deg[l]`` (counter-clockwise) beside the rotor angle, at ``elevations_deg[l]``.
Renderers only need `ray_directions()` and `time_offsets_us()`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import MISSING, dataclass, fields
from typing import ClassVar, Dict, Tuple

import numpy as np

from gsim.errors import InputError
from gsim.io import check_schema_version

SCHEMA_VERSION = 1
SPIN_DIRECTIONS = ("cw", "ccw")  # seen from above (+z): clockwise = decreasing azimuth over time


def _fail(cls: str, field: str, msg: str):
    raise InputError(f"{cls}.{field}: {msg}")


def _number(cls: str, field: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
        _fail(cls, field, f"expected a finite number, got {v!r}")
    return float(v)


def _table(cls: str, field: str, values, n=None, default=None) -> Tuple[float, ...]:
    """A per-laser/per-ray table as a tuple of finite floats; empty -> ``default`` filled to length n."""
    arr = np.asarray(values if values is not None else (), dtype=object).ravel()
    if arr.size == 0 and default is not None and n is not None:
        return (float(default),) * n
    out = tuple(_number(cls, f"{field}[{i}]", v) for i, v in enumerate(arr))
    if n is not None and len(out) != n:
        _fail(cls, field, f"expected {n} values (one per laser/ray), got {len(out)}")
    return out


def _check_ranges(cls: str, lo, hi) -> None:
    if lo < 0:
        _fail(cls, "min_range_m", f"must be >= 0 m, got {lo}")
    if lo >= hi:
        _fail(cls, "min_range_m", f"must be < max_range_m, got {lo} >= {hi}")


def _check_elevations(cls: str, field: str, el) -> None:
    bad = [i for i, e in enumerate(el) if not -90.0 <= e <= 90.0]
    if bad:
        _fail(cls, field, f"elevation {el[bad[0]]} deg at index {bad[0]} is outside [-90, 90]")


def _name_and_elevations(cls: str, name, elevations, unit: str) -> Tuple[float, ...]:
    """Check a spec's name and elevation table (at least one ``unit``); returns the table."""
    if not isinstance(name, str) or not name:
        _fail(cls, "name", f"expected a non-empty string, got {name!r}")
    el = _table(cls, "elevations_deg", elevations)
    if not el:
        _fail(cls, "elevations_deg", f"expected at least one {unit}")
    _check_elevations(cls, "elevations_deg", el)
    return el


def _directions(el_deg: np.ndarray, az_deg: np.ndarray) -> np.ndarray:
    el, az = np.radians(el_deg), np.radians(az_deg)
    return np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], -1)


class _SpecIO:
    kind: ClassVar[str]

    def to_dict(self) -> dict:
        """JSON-ready dict (lists for tables) with ``kind`` and ``schema_version``."""
        d = {"kind": self.kind, "schema_version": SCHEMA_VERSION}
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = list(v) if isinstance(v, tuple) else v
        return d

    @classmethod
    def from_dict(cls, d: dict):
        if not isinstance(d, dict):
            raise InputError(f"{cls.__name__}: expected a dict, got {type(d).__name__}")
        if d.get("kind") != cls.kind:
            _fail(cls.__name__, "kind", f"expected {cls.kind!r}, got {d.get('kind')!r}")
        check_schema_version(d, (SCHEMA_VERSION,), cls.__name__)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names - {"kind", "schema_version"})
        if unknown:
            _fail(cls.__name__, unknown[0], "unknown field")
        missing = [f.name for f in fields(cls) if f.name not in d and f.default is MISSING]
        if missing:
            _fail(cls.__name__, missing[0], "missing")
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class LidarSpec(_SpecIO):
    """A spinning multi-laser LiDAR (see the module docstring for frames and the firing model).

    name: model name. elevations_deg: (L,) per-laser elevation, any order (row l of the range image).
    azimuth_resolution_deg: rotor step per column at ``spin_hz``; must divide 360 (within 1e-6).
    spin_hz: revolutions per second (> 0). min_range_m / max_range_m: valid returns (metres).
    spin: "cw" or "ccw" seen from above. azimuth_offsets_deg: (L,) counter-clockwise offset of each
    laser from the rotor angle (empty = zeros). firing_offsets_us: (L,) firing time of each laser
    within its column, in [0, column_period_us) (empty = zeros). start_azimuth_deg: rotor azimuth of
    column 0, where the sweep starts; the presets start at the back (180 deg), where Ouster splits its
    frames, so the front is mid-sweep.
    """

    kind: ClassVar[str] = "spinning"
    name: str
    elevations_deg: Tuple[float, ...]
    azimuth_resolution_deg: float
    spin_hz: float
    min_range_m: float
    max_range_m: float
    spin: str = "cw"
    azimuth_offsets_deg: Tuple[float, ...] = ()
    firing_offsets_us: Tuple[float, ...] = ()
    start_azimuth_deg: float = 180.0

    def __post_init__(self):
        c = type(self).__name__
        el = _name_and_elevations(c, self.name, self.elevations_deg, "laser")
        n = len(el)
        scalars = {f: _number(c, f, getattr(self, f)) for f in
                   ("azimuth_resolution_deg", "spin_hz", "min_range_m", "max_range_m", "start_azimuth_deg")}
        res = scalars["azimuth_resolution_deg"]
        if not 0 < res <= 360 or abs(round(360.0 / res) * res - 360.0) > 1e-6:
            _fail(c, "azimuth_resolution_deg", f"must divide 360 deg into whole columns (within 1e-6), got {res}")
        if scalars["spin_hz"] <= 0:
            _fail(c, "spin_hz", f"must be > 0 Hz, got {scalars['spin_hz']}")
        _check_ranges(c, scalars["min_range_m"], scalars["max_range_m"])
        if self.spin not in SPIN_DIRECTIONS:
            _fail(c, "spin", f"expected one of {SPIN_DIRECTIONS}, got {self.spin!r}")
        az = _table(c, "azimuth_offsets_deg", self.azimuth_offsets_deg, n, default=0.0)
        if any(abs(a) >= 180 for a in az):
            _fail(c, "azimuth_offsets_deg", "offsets must lie in (-180, 180) deg")
        fire = _table(c, "firing_offsets_us", self.firing_offsets_us, n, default=0.0)
        period = 1e6 / (scalars["spin_hz"] * round(360.0 / res))
        if any(not 0 <= f < period for f in fire):
            _fail(c, "firing_offsets_us", f"each must lie in [0, column period {period:.3f} us)")
        for k, v in {"elevations_deg": el, "azimuth_offsets_deg": az, "firing_offsets_us": fire, **scalars}.items():
            object.__setattr__(self, k, v)

    @property
    def lasers(self) -> int:
        return len(self.elevations_deg)

    @property
    def columns(self) -> int:
        """Columns per revolution: round(360 / azimuth_resolution_deg)."""
        return int(round(360.0 / self.azimuth_resolution_deg))

    @property
    def column_period_us(self) -> float:
        """Time between columns (microseconds): 1e6 / (spin_hz * columns)."""
        return 1e6 / (self.spin_hz * self.columns)

    def column_azimuths_deg(self) -> np.ndarray:
        """(columns,) rotor azimuth of each column in firing order, degrees in [-180, 180)."""
        step = self.azimuth_resolution_deg if self.spin == "ccw" else -self.azimuth_resolution_deg
        az = self.start_azimuth_deg + step * np.arange(self.columns)
        return (az + 180.0) % 360.0 - 180.0

    def ray_directions(self) -> np.ndarray:
        """(lasers, columns, 3) float64 unit ray directions in the sensor frame, columns in firing order."""
        az = self.column_azimuths_deg()[None, :] + np.asarray(self.azimuth_offsets_deg)[:, None]
        el = np.broadcast_to(np.asarray(self.elevations_deg)[:, None], az.shape)
        return _directions(el, az)

    def time_offsets_us(self) -> np.ndarray:
        """(lasers, columns) int64 firing time of each ray, microseconds from the sweep start
        (increasing along the columns, all below 1e6 / spin_hz)."""
        t = np.arange(self.columns)[None, :] * self.column_period_us + np.asarray(self.firing_offsets_us)[:, None]
        return np.floor(t).astype(np.int64)

    @classmethod
    def preset(cls, name: str) -> "LidarSpec":
        """A preset from public spec sheets (see `preset_names()` and the sources in `PRESETS`)."""
        if name not in PRESETS:
            hint = (f" ({name!r} is not a spinning LiDAR: use RayTableSpec.preset)"
                    if name in _RAY_TABLE_BUILDERS else "")
            raise InputError(f"LidarSpec.preset: unknown name {name!r}{hint}; valid names: "
                             f"{', '.join(preset_names())}")
        return PRESETS[name]


@dataclass(frozen=True)
class RayTableSpec(_SpecIO):
    """A solid-state / flash LiDAR (or any fixed pattern): a table of N rays fired each frame.

    elevations_deg, azimuths_deg: (N,) ray directions (degrees, sensor frame, azimuth
    counter-clockwise from +x). firing_offsets_us: (N,) firing time of each ray from the frame start,
    in [0, 1e6 / frame_hz) (empty = all at once). Build from (N, 3) vectors with `from_directions`.
    """

    kind: ClassVar[str] = "ray_table"
    name: str
    elevations_deg: Tuple[float, ...]
    azimuths_deg: Tuple[float, ...]
    min_range_m: float
    max_range_m: float
    frame_hz: float = 10.0
    firing_offsets_us: Tuple[float, ...] = ()

    def __post_init__(self):
        c = type(self).__name__
        el = _name_and_elevations(c, self.name, self.elevations_deg, "ray")
        az = _table(c, "azimuths_deg", self.azimuths_deg, len(el))
        lo, hi, hz = (_number(c, f, getattr(self, f)) for f in ("min_range_m", "max_range_m", "frame_hz"))
        _check_ranges(c, lo, hi)
        if hz <= 0:
            _fail(c, "frame_hz", f"must be > 0 Hz, got {hz}")
        t = _table(c, "firing_offsets_us", self.firing_offsets_us, len(el), default=0.0)
        if any(not 0 <= x < 1e6 / hz for x in t):
            _fail(c, "firing_offsets_us", f"each must lie in [0, frame period {1e6 / hz:.1f} us)")
        for k, v in {"elevations_deg": el, "azimuths_deg": az, "min_range_m": lo, "max_range_m": hi,
                     "frame_hz": hz, "firing_offsets_us": t}.items():
            object.__setattr__(self, k, v)

    @classmethod
    def from_directions(cls, name: str, directions: np.ndarray, min_range_m: float, max_range_m: float,
                        frame_hz: float = 10.0, firing_offsets_us=()) -> "RayTableSpec":
        """From (N, 3) direction vectors in the sensor frame (any non-zero length)."""
        d = np.asarray(directions, dtype=np.float64)
        if d.ndim != 2 or d.shape[1] != 3 or len(d) == 0:
            _fail(cls.__name__, "directions", f"expected an (N, 3) array with N >= 1, got shape {d.shape}")
        norm = np.linalg.norm(d, axis=1)
        if not np.all(np.isfinite(norm) & (norm > 0)):
            _fail(cls.__name__, "directions", "every direction must be finite and non-zero")
        el = np.degrees(np.arcsin(np.clip(d[:, 2] / norm, -1.0, 1.0)))
        az = np.degrees(np.arctan2(d[:, 1], d[:, 0]))
        return cls(name, tuple(el.tolist()), tuple(az.tolist()), min_range_m, max_range_m, frame_hz,
                   tuple(np.asarray(firing_offsets_us, dtype=np.float64).ravel().tolist()))

    @classmethod
    def preset(cls, name: str) -> "RayTableSpec":
        """A fixed-pattern preset from public sources (see `ray_table_preset_names()`; the sources are in
        the builders' comments). Built on first use (the tables are large), then shared."""
        if name not in _RAY_TABLE_BUILDERS:
            raise InputError(f"RayTableSpec.preset: unknown name {name!r}; valid names: "
                             f"{', '.join(ray_table_preset_names())}")
        return _ray_table_preset(name)

    @property
    def rays(self) -> int:
        return len(self.elevations_deg)

    def ray_directions(self) -> np.ndarray:
        """(N, 3) float64 unit ray directions in the sensor frame."""
        return _directions(np.asarray(self.elevations_deg), np.asarray(self.azimuths_deg))

    def time_offsets_us(self) -> np.ndarray:
        """(N,) int64 firing time of each ray, microseconds from the frame start."""
        return np.floor(np.asarray(self.firing_offsets_us)).astype(np.int64)


def spec_from_dict(d: dict):
    """`LidarSpec` or `RayTableSpec` from its `to_dict()` form (dispatch on ``kind``)."""
    kinds = {LidarSpec.kind: LidarSpec, RayTableSpec.kind: RayTableSpec}
    if not isinstance(d, dict) or d.get("kind") not in kinds:
        raise InputError(f"lidar spec kind: expected one of {sorted(kinds)}, got "
                         f"{d.get('kind') if isinstance(d, dict) else type(d).__name__!r}")
    return kinds[d["kind"]].from_dict(d)


# ----------------------------------------------------------------------------------------------
# Presets. Tables are the makers' nominal (design) values or one unit's published calibration, as
# noted; a real unit differs by its own calibration (typically 0.1-0.4 deg). Rows are sorted top
# laser first. Spin directions, from each maker's documentation:
# - Velodyne: clockwise seen from above. The manuals' azimuth grows clockwise over time (their frame
#   is y forward, x right); velodyne_pointcloud maps a return to x = r cos(az - rot_correction),
#   y = -r sin(az - rot_correction) in x forward, y left.
# - Ouster: clockwise seen from above. The software manual's lidar frame uses
#   theta_encoder = 2 pi (1 - encoder_count / 90112), so the ccw angle falls as the encoder counts
#   up; its +x points back at the connector, and "data frames split at the back".
# - Hesai: clockwise seen from above. The Pandar manuals define the rotor azimuth (growing over a
#   sweep) and the channel azimuth offsets as "clockwise positive" in the top view (Appendix I,
#   Channel Distribution). The manuals' rotation figure was not readable in the copies searched.
# Every preset's sweep starts at the back (start_azimuth_deg = 180), as Ouster frames do. Velodyne
# and Hesai cut their sweeps where the driver says, so this is a convention here, not a fact of
# the sensor.
# ----------------------------------------------------------------------------------------------

def _spinning(name, elevations, res, lo, hi, az_cw=None, az_ccw=None, firing=None) -> LidarSpec:
    """A 10 Hz clockwise preset. The per-laser tables are sorted top first; azimuth offsets come
    either clockwise-positive (the vendors' convention) or counter-clockwise-positive."""
    el = np.asarray(elevations, np.float64)
    n = len(el)
    az = -np.asarray(az_cw, np.float64) if az_cw is not None else np.asarray(
        az_ccw if az_ccw is not None else np.zeros(n), np.float64)
    fire = np.asarray(firing if firing is not None else np.zeros(n), np.float64)
    order = np.argsort(-el, kind="stable")
    r = lambda x: tuple(float(v) for v in np.round(x[order], 6))  # noqa: E731
    return LidarSpec(name, r(el), res, 10.0, lo, hi, "cw", r(az), r(fire), 180.0)


def _hdl64e() -> LidarSpec:
    # Velodyne HDL-64E S2 (KITTI's sensor). Vertical FOV: +2 to -24.8 deg on the S2 sheet (26.8 deg);
    # commonly cited for KITTI as +2 to -24.9. Upper block: 32 lasers from +2 deg in 1/3 deg steps,
    # down to -8.33. Lower block: 32 lasers from -8.83 deg in equal steps to -24.9 (0.518
    # deg, usually quoted as "~1/2 deg"). APPROXIMATION: the often-quoted "-8.83 - 0.5 i" table ends
    # at -24.33, which contradicts that FOV. estimate_beams on the KITTI sample puts the bottom laser
    # at -25.0 and fits this table to within 0.4 deg (rms 0.19; tests/test_lidar_spec.py). Azimuth:
    # KITTI's returns are 0.1794 deg apart along a laser at 10 Hz (measured), that is 2000 columns
    # of 0.18 deg (about 1.28 M points/s, matching the sheet's ~1.3 M). Range: the sheet gives 120 m
    # (cars, foliage); 0.9 m is velodyne_pointcloud's default minimum. Firing: the S3 manual's "upper
    # and lower block fire in unison, one laser each at a time; six firings of each block take 139
    # us", that is ~0.724 us per laser. APPROXIMATION: the lasers fire in elevation order within a
    # block; the real order follows unit-specific laser ids. The per-unit rot_correction (up to +-9
    # deg in velodyne_pointcloud's 64e calibration files) is not nominal, so the azimuth offsets are 0.
    el = np.concatenate([2.0 - np.arange(32) / 3.0, np.linspace(-8.83, -24.9, 32)])
    return _spinning("velodyne-hdl64e", el, 0.18, 0.9, 120.0, firing=np.tile(np.arange(32) * 139.0 / 6 / 32, 2))


def _vlp16() -> LidarSpec:
    # Velodyne VLP-16 user manual (63-9243 Rev D): laser id k points at k deg (odd k) or k - 15 deg
    # (even k), that is -15..+15 in 2 deg steps, firing in id order 2.304 us apart, the 16 lasers
    # every 55.296 us (16 x 2.304 + 18.432 idle). Azimuth 0.2 deg at 600 rpm; the true cycle gives
    # 0.199 deg, so 1800 columns is the nominal grid. Range 100 m (sheet); min 0.9 m (the ROS
    # driver's VLP16 parameters). No azimuth offsets (one vertical column of lasers).
    k = np.arange(16)
    return _spinning("velodyne-vlp16", np.where(k % 2 == 1, k, k - 15), 0.2, 0.9, 100.0, firing=k * 2.304)


# VLP-32C laser ids 0..31: elevation (deg) and azimuth offset (deg). The elevations are the
# manual's (VLP-32C user manual 63-9325 Rev C, Table 9-6, Azimuth Offsets by Elevation); the
# offsets are the +-1.4/+-4.2 deg columns of that table, per laser as in the ROS driver's
# VeloView-VLP-32C.yaml rot_correction (radians there). The driver computes x, y from
# (azimuth - rot_correction) in Velodyne's clockwise convention, so +rot_correction is a
# counter-clockwise offset in x-forward, y-left.
_VLP32C_EL = (-25.0, -1.0, -1.667, -15.639, -11.31, 0.0, -0.667, -8.843, -7.254, 0.333, -0.333, -6.148,
              -5.333, 1.333, 0.667, -4.0, -4.667, 1.667, 1.0, -3.667, -3.333, 3.333, 2.333, -2.667,
              -3.0, 7.0, 4.667, -2.333, -2.0, 15.0, 10.333, -1.333)
_VLP32C_ROT = (1.4, -4.2, 1.4, -1.4, 1.4, -1.4, 4.2, -1.4, 1.4, -4.2, 1.4, -1.4, 4.2, -1.4, 4.2, -1.4,
               1.4, -4.2, 1.4, -4.2, 4.2, -1.4, 1.4, -1.4, 1.4, -1.4, 1.4, -4.2, 4.2, -1.4, 1.4, -1.4)


def _vlp32c() -> LidarSpec:
    # Firing: 16 pairs (ids 2k, 2k+1) 2.304 us apart in a 55.296 us cycle, as in the VLP-16.
    # APPROXIMATION: the pairing by consecutive ids is taken from the packet layout.
    # 0.2 deg at 600 rpm (1800 columns). Range 200 m (sheet, and the ROS driver's max_range);
    # min 0.9 m (driver).
    return _spinning("velodyne-vlp32c", _VLP32C_EL, 0.2, 0.9, 200.0, az_ccw=_VLP32C_ROT,
                     firing=(np.arange(32) // 2) * 2.304)


def _ouster_os1(n: int) -> LidarSpec:
    # Ouster OS1 Rev 6, uniform beams: 42.4 deg vertical FOV (+-21.2), n beams equally spaced. This
    # is the rev of the ouster-sdk sample metadata: ouster_ros/metadata/os1_64.json (OS-1-64-U02,
    # fw 2.0, beams +21.02..-21.41) and tests/pcaps/OS-1-128_v2.3.0_1024x10.json (840-103575-06,
    # +20.95..-21.82). Gen 1 OS1s (2019 sheet) spanned +-16.6 (64) or +-22.5 (128) instead. Both
    # units' beam_azimuth_angles follow a fixed column pattern (64: +1.4/-4.2; 128:
    # +4.2/+1.4/-1.4/-4.2 deg), used here. Ouster's xyz formula adds -beam_azimuth to the ccw
    # encoder angle, so the ccw offsets are the negated values. All beams of a column share one
    # timestamp (firing offsets 0). Columns: 1024 at 10 Hz, the default lidar_mode "1024x10".
    # Range: 0.8-120 m from the Gen 1 OS1 datasheet (80 % target). APPROXIMATION: later revs
    # advertise a shorter minimum.
    pattern = (1.4, -4.2) if n == 64 else (4.2, 1.4, -1.4, -4.2)
    return _spinning(f"ouster-os1-{n}", np.linspace(21.2, -21.2, n), 360.0 / 1024, 0.8, 120.0,
                     az_cw=np.resize(pattern, n))


# Hesai Pandar64 nominal channel table, channels 1 (top) .. 64: elevations are the
# pandarGeneral_elev_angle_map of HesaiLidar_General_SDK (src/PandarGeneralRaw/src/
# pandarGeneral_internal.cc); azimuths are its horizontal_azimuth_offset_map (degrees, clockwise
# positive as in the Pandar64 user manual's Appendix, Channel Distribution). tier4/nebula's
# calibration/hesai/64.csv lists the same azimuths.
_PANDAR64_EL = (14.882, 11.032, 8.059, 5.057, 3.04, 2.028, 1.86, 1.688, 1.522, 1.351, 1.184, 1.013, 0.846,
                0.675, 0.508, 0.337, 0.169, 0.0, -0.169, -0.337, -0.508, -0.675, -0.845, -1.013, -1.184,
                -1.351, -1.522, -1.688, -1.86, -2.028, -2.198, -2.365, -2.536, -2.7, -2.873, -3.04, -3.21,
                -3.375, -3.548, -3.712, -3.884, -4.05, -4.221, -4.385, -4.558, -4.72, -4.892, -5.057,
                -5.229, -5.391, -5.565, -5.726, -5.898, -6.061, -7.063, -8.059, -9.06, -9.885, -11.032,
                -12.006, -12.974, -13.93, -18.889, -24.897)
# Channels 1-6 and 55-64 sit at -1.042 deg; 7-54 cycle through six columns.
_PANDAR64_AZ_CW = (-1.042,) * 6 + (1.042, 3.125, 5.208, -5.208, -3.125, -1.042) * 8 + (-1.042,) * 10
# HesaiLidar_SDK_2.0 correction/firetime_correction/Pandar64_Firetime Correction File.csv:
# channel -> firing time (us) relative to the end of its block (block = one column, 55.56 us at
# 0.2 deg / 10 Hz); channels listed pairwise, 1.304 us then 1.968 us apart.
_PANDAR64_FIRE = {51: -3.62, 61: -3.62, 45: -4.924, 60: -4.924, 39: -6.228, 57: -6.228, 9: -7.532, 55: -7.532,
                  49: -8.836, 63: -8.836, 43: -10.14, 59: -10.14, 7: -11.444, 56: -11.444, 53: -12.748,
                  64: -12.748, 47: -14.052, 62: -14.052, 41: -15.356, 58: -15.356, 6: -16.66, 54: -16.66,
                  5: -17.964, 48: -17.964, 4: -19.268, 50: -19.268, 3: -20.572, 52: -20.572, 2: -21.876,
                  46: -21.876, 1: -23.18, 44: -23.18, 24: -25.148, 33: -25.148, 27: -27.116, 42: -27.116,
                  21: -29.084, 36: -29.084, 15: -31.052, 30: -31.052, 22: -33.02, 37: -33.02, 16: -34.988,
                  31: -34.988, 10: -36.956, 25: -36.956, 19: -38.924, 34: -38.924, 13: -40.892, 28: -40.892,
                  20: -42.86, 35: -42.86, 14: -44.828, 29: -44.828, 8: -46.796, 23: -46.796, 17: -48.764,
                  32: -48.764, 11: -50.732, 26: -50.732, 18: -52.7, 38: -52.7, 12: -54.668, 40: -54.668}


def _pandar64() -> LidarSpec:
    # 0.2 deg at 10 Hz (1800 columns, 55.56 us per block); range 0.3-200 m as on the spec sheet
    # (APPROXIMATION: not re-checked here against the current sheet). The firing offsets are measured
    # from the column start: column period + the file's (negative) firing time.
    period = 1e6 / (10.0 * 1800)
    fire = [period + _PANDAR64_FIRE[ch] for ch in range(1, 65)]
    return _spinning("hesai-pandar64", _PANDAR64_EL, 0.2, 0.3, 200.0, az_cw=_PANDAR64_AZ_CW, firing=fire)


# Hesai Pandar128 channels 1..128: tier4/nebula src/nebula_hesai/nebula_hesai_decoders/calibration/
# Pandar128E4X.csv (Laser id, Elevation, Azimuth; azimuth clockwise positive). APPROXIMATION: one
# unit's angle-correction file, not the manual's design table, which was not found; it spans
# +15.1..-24.7 deg against the sheet's 40 deg, -25..+15 (as quoted for the Pandar128E3X; the sheet itself
# could not be read here). Its 65 channels from +2.08 to -5.91 deg are 0.125 deg apart on average (this
# unit 0.10-0.15), the sheet's finest vertical resolution. Each public table found ends within 0.6 deg
# of the sheet's -25 and +15: this one, HesaiLidar_SDK_2.0's
# "correction/angle_correction/Pandar128E3X_Angle Correction File.csv" (another unit) +14.44..-25.02 and
# AWSIM's HesaiPandar128E4X laser table (GreenDinoBV/GD-AWSIM-Labs, an AWSIM-Labs fork,
# Assets/RGLUnityPlugin/Scripts/LidarModels/LaserArrayLibrary.cs) +14.99..-24.77.
_PANDAR128 = """
15.139 0.157 13.432 0.129 11.919 1.258 10.634 1.247 9.967 0.145 9.3 0.123 8.621 0.1 7.945 0.078
7.595 1.338 7.244 1.316 6.905 1.298 6.55 1.28 6.193 1.282 5.843 1.334 5.482 1.314 5.116 1.363
4.768 0.141 4.402 0.099 4.04 0.171 3.68 0.15 3.314 0.115 2.94 0.097 2.58 0.166 2.203 0.123
2.081 -3.092 1.967 1.374 1.844 4.55 1.71 -3.071 1.596 1.362 1.474 4.542 1.333 -3.033 1.23 1.385
1.109 4.535 0.97 -3.053 0.856 1.33 0.734 4.609 0.597 -3.085 0.477 1.314 0.361 4.528 0.217 -3.064
0.102 0.15 -0.012 2.981 -0.146 -1.431 -0.272 0.173 -0.387 2.954 -0.522 -1.445 -0.649 0.139 -0.757 2.941
-0.899 -1.478 -1.018 0.161 -1.135 3.027 -1.272 -1.455 -1.397 0.131 -1.512 3.015 -1.648 -1.495 -1.777 0.115
-1.884 2.985 -2.028 -1.47 -2.146 0.202 -2.261 3.012 -2.397 -1.505 -2.526 0.188 -2.639 2.975 -2.775 -1.521
-2.894 1.399 -3.016 4.636 -3.154 -3.055 -3.271 1.374 -3.394 4.623 -3.534 -3.068 -3.644 1.382 -3.768 4.595
-3.913 -3.078 -4.022 1.336 -4.149 4.621 -4.285 -3.093 -4.405 1.351 -4.52 4.587 -4.662 -3.104 -4.777 1.358
-4.896 4.613 -5.043 -3.119 -5.155 1.407 -5.272 4.677 -5.419 -3.126 -5.539 1.421 -5.654 4.665 -5.806 -3.147
-5.907 0.198 -6.288 0.194 -6.669 0.171 -7.039 0.178 -7.416 0.148 -7.794 0.149 -8.173 0.123 -8.546 0.126
-8.915 1.427 -9.295 1.408 -9.666 1.433 -10.041 1.386 -10.414 1.411 -10.785 1.385 -11.15 1.363 -11.521 1.362
-11.895 0.2 -12.26 0.179 -12.638 0.154 -12.992 0.133 -13.368 0.217 -13.727 0.194 -14.096 0.169 -14.451 0.147
-14.806 1.568 -15.167 1.59 -15.517 1.516 -15.881 1.536 -16.233 1.584 -16.585 1.557 -16.934 1.509 -17.288 1.533
-17.642 0.361 -18.332 0.336 -19.005 0.313 -19.665 0.285 -20.318 1.59 -21.598 1.551 -22.989 0.312 -24.71 0.302
"""


def _pandar128() -> LidarSpec:
    # 360 deg, standard mode 0.2 deg at 10 Hz (1800 columns; the Pandar128E3X manual's block start times,
    # 27.778 us per 0.1 deg in high-resolution mode, which halves the step on some channels and is not
    # modelled). Range 0.3-200 m as quoted from the spec sheet, whose table could not be read here;
    # AWSIM's Pandar128E4X laser table agrees: near-field minimum 0.3 m (1.4 m on the channels
    # without near-field firing), 200 m on the channels near the horizon, 30-140 m on the outer ones,
    # which one max_range_m cannot express. APPROXIMATION: firing offsets 0. The manual's per-channel
    # firing table depends on the operating state and on near/far-field firing.
    table = np.array(_PANDAR128.split(), np.float64).reshape(128, 2)
    return _spinning("hesai-pandar128", table[:, 0], 0.2, 0.3, 200.0, az_cw=table[:, 1])


PRESETS: Dict[str, LidarSpec] = {s.name: s for s in (
    _hdl64e(), _vlp16(), _vlp32c(), _ouster_os1(64), _ouster_os1(128), _pandar64(), _pandar128())}


def preset_names() -> Tuple[str, ...]:
    """The names `LidarSpec.preset` accepts (spinning LiDARs; see also `ray_table_preset_names`)."""
    return tuple(PRESETS)


# ----------------------------------------------------------------------------------------------
# Ray-table presets: LiDARs that do not sweep 360 degrees, which `LidarSpec` cannot express (its
# columns always divide a full revolution and fill the whole period 1 / spin_hz).
# ----------------------------------------------------------------------------------------------

# Hesai AT128 (AT128E2X) per-channel firing time within a column (us), channels 1..128: tier4/nebula
# src/nebula_hesai/nebula_hesai_decoders/include/nebula_hesai_decoders/decoders/pandar_at128.hpp
# (firing_time_offset_ns). AWSIM's AT128E2X laser table (tier4/AWSIM
# Assets/RGLUnityPlugin/Scripts/LidarModels/LaserArrayLibrary.cs, from the AT128E2X user manual
# A01-en-230510) has the same times but for channel 106 (4.112); HesaiLidar_SDK_2.0's
# "correction/firetime_correction/AT128E2X_Firetime Correction File.csv" differs in channels 5, 60, 80,
# 105 and 106 (by up to 9.9 us).
_AT128_FIRE_US = (
    0.0, 0.0, 8.24, 4.112, 4.144, 8.24, 0.0, 0.0, 12.424, 4.144, 4.112, 8.264, 12.376, 12.376, 8.264, 12.424,
    0.0, 0.0, 4.112, 8.24, 4.144, 0.0, 0.0, 4.144, 12.424, 8.264, 4.112, 12.376, 12.376, 12.424, 8.264, 0.848,
    2.504, 4.976, 6.616, 6.616, 9.112, 2.504, 0.848, 10.768, 13.28, 13.28, 4.976, 9.112, 14.928, 14.928, 10.768,
    2.504, 0.848, 6.616, 4.976, 9.112, 6.616, 0.848, 2.504, 13.28, 10.768, 4.976, 13.28, 14.928, 9.112, 10.768,
    14.928, 13.28, 0.848, 9.112, 13.28, 2.504, 4.976, 0.848, 2.504, 14.928, 10.768, 10.768, 14.928, 4.976, 6.616,
    6.616, 9.112, 0.848, 13.28, 13.28, 9.112, 4.976, 2.504, 2.504, 0.848, 10.768, 14.928, 14.928, 10.768, 6.616,
    4.976, 9.112, 6.616, 4.112, 12.424, 0.0, 4.144, 0.0, 0.0, 12.424, 0.0, 8.264, 4.112, 4.144, 8.24, 8.24,
    8.264, 12.376, 12.376, 12.424, 4.112, 4.144, 0.0, 0.0, 0.0, 0.0, 0.0, 12.424, 8.264, 8.24, 4.144, 8.264,
    8.24, 12.376, 12.376, 8.264)
AT128_COLUMNS = 1200  # 0.1 deg over the 120 deg field of view, one frame


def _at128() -> RayTableSpec:
    """Hesai AT128 (AT128E2X), a 128-channel hybrid solid-state LiDAR: a rotating three-facet mirror
    sweeps 128 stacked lasers across a 120 deg horizontal field of view, one facet per frame, 10 Hz.

    Sheet values (Hesai AT128E2X user manual A01-en-230510, as carried by the public code below; the
    manual's specification table itself could not be read here): 128 channels; 120 deg horizontal field
    of view at 0.1 deg; 25.4 deg vertical (-12.5 to +12.9) at 0.2 deg; 10 Hz; 200 m for the middle 64
    channels, 100 m for the outer ones (AWSIM's per-channel table); 0.5 m minimum (near-field firings).
    - Channels: tier4/nebula src/nebula_hesai/nebula_hesai_decoders/calibration/PandarAT128.csv, the
      design table: channel ch (1 = top) at 12.93 - 0.2 (ch - 1) deg (+12.93 .. -12.47), clockwise-positive
      azimuth offsets +2.4 / -0.65 alternating in channels 1-16, 33-48, 65-80, 97-112 and -2.4 / +0.65 in
      the others. AWSIM's AT128E2X table (from the manual) has the same angles. HesaiLidar_SDK_2.0's
      "correction/angle_correction/AT128E2X_Angle Correction File.dat" (one unit, v1.5) has the same
      azimuth offsets and elevations within 0.05 deg of these.
    - Field of view and resolution: nebula's PandarAT128 decoder (pandar_at128.hpp: fov 30..150 deg
      azimuth, -12.5..+12.9 deg elevation, peak resolution 0.1 x 0.2 deg), nebula's docs/filters.md
      (an AT128 frame is 1200 x 128) and HesaiLidar_SDK_2.0's AT128 parser (udp4_3_parser.cc: range image
      at 0.1 deg azimuth, 0.2 deg elevation).
    - Timing: nebula's decoder puts consecutive columns (blocks) 41.666 us apart; the motor turns at 200 rpm
      (nebula PandarAT128.param.yaml, rotation_speed) and a column's azimuth is twice the encoder's past
      its facet's start (udp4_3_parser.cc; the SDK's AT128E2X correction file lists 3 facets, 120 deg of
      the motor each), so 0.1 deg of azimuth is 0.05 deg of the motor,
      125/3 us, and the 1200 columns take 50 ms of each 100 ms frame. Channel firing times: _AT128_FIRE_US.
    - Range: 0.5 m is the near-field minimum and 200 m the far end, as in AWSIM's AT128 model
      (RGL plugin LidarConfiguration.cs: near field 0.5-7.2 m on the NF-enabled channels, far field
      beyond; LaserArrayLibrary.cs: per-channel 100 / 200 m).

    Frame: the SDK's and nebula's point-cloud frame, x through the middle of the field of view, y left,
    z up (their azimuth a, clockwise from +y, maps to 90 - a here). Column c points 59.95 - 0.1 c deg
    (left to right, the order the facet sweeps), each channel beside it by its offset; rays are stored
    column by column: ray c * 128 + l is channel l + 1 of column c (so a frame's 1 x N range image
    reshaped to (1200, 128) and transposed is the AT128's 128 x 1200 image), fired at c * 125/3 us plus
    the channel's firing time.

    APPROXIMATIONS (what the spec cannot express): one min / max range for all rays, where the AT128
    measures 0.5-7.2 m only on every fourth channel (at half the horizontal resolution), the other
    channels from 7.2 m, and the outer 64 channels reach 100 m rather than 200 m; the design angles,
    without a unit's per-azimuth corrections (up to 0.24 deg of elevation and 0.9 deg of azimuth in the
    SDK's sample file) or the facet-to-facet differences between frames; rays are not cut at the
    driver's 30..150 deg window (nebula's cloud_min_angle / cloud_max_angle), so channels reach
    +-62.35 deg; single return.
    """
    n = len(_AT128_FIRE_US)
    el = 12.93 - 0.2 * np.arange(n)
    group_sign = np.where((np.arange(n) // 16) % 2 == 0, 1.0, -1.0)
    az_cw = np.where(np.arange(n) % 2 == 0, 2.4, -0.65) * group_sign
    col = np.arange(AT128_COLUMNS)[:, None]
    az = (59.95 - 0.1 * col) - az_cw[None, :]  # counter-clockwise, x forward
    t = col * (125.0 / 3.0) + np.asarray(_AT128_FIRE_US)[None, :]
    r = lambda x: tuple(float(v) for v in np.round(np.broadcast_to(x, az.shape), 6).ravel())  # noqa: E731
    return RayTableSpec("hesai-at128", r(el[None, :]), r(az), 0.5, 200.0, 10.0, r(t))


_RAY_TABLE_BUILDERS = {"hesai-at128": _at128}


@functools.lru_cache(maxsize=None)
def _ray_table_preset(name: str) -> RayTableSpec:
    return _RAY_TABLE_BUILDERS[name]()


def ray_table_preset_names() -> Tuple[str, ...]:
    """The names `RayTableSpec.preset` accepts (LiDARs that do not sweep 360 degrees)."""
    return tuple(_RAY_TABLE_BUILDERS)


def lidar_preset(name: str):
    """A LiDAR preset by name: a spinning `LidarSpec` (`preset_names`) or a fixed-pattern `RayTableSpec`
    (`ray_table_preset_names`)."""
    return RayTableSpec.preset(name) if name in _RAY_TABLE_BUILDERS else LidarSpec.preset(name)
