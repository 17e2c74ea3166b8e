"""The synthetic street: a procedural driving log rendered by an analytic ray caster, with exact ground truth.

``synthesize(out_dir, seed, options)`` writes a gsim driving log (``scenes.log``) of an ego car driving
down a straight street lined with buildings, trees, poles and parked cars, with 2-3 moving cars:

- three cameras: ``front`` (pinhole) and ``front_left`` / ``front_right`` (OpenCV radial distortion,
  rendered exactly from the model's per-pixel rays), each with a ground-truth depth map;
- a spinning LiDAR ``top`` with an exact rolling sweep: every azimuth column is cast from the ego pose
  and with the cars at its own time, and carries that time as its offset;
- ego poses every 10 ms, and every car as a tracked actor.

The renderer is not Gaussian splatting: rays are intersected exactly with a plane, boxes, vertical
cylinders and spheres, shaded Lambertian (a fixed sun plus sky ambient, so a surface's colour does not
depend on the view) from procedural albedo textures, and box-filtered over s x s samples per pixel;
both the ray caster and the shading are numba kernels. ``build_street`` returns the scene itself
(``Street.raycast``) so that tests can check the ground truth analytically.

World frame: x along the street, y left, z up, ground at z = 0 (metres). The ego drives along +x in
the right-hand lane (y = -1.75 m); the vehicle frame's origin is on the ground.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Dict, Tuple

import numpy as np
from numba import njit, prange

from gsim.cameras import Camera, OpenCVCamera, PinholeCamera
from gsim.config import Config
from gsim.errors import InputError
from gsim.street import R_VEHICLE_CAMERA

from .log import ActorTrack, LidarBeams, LogFormatError, LogWriter, load_log

FRAME_PERIOD_US = 100_000  # 10 Hz frames; the LiDAR spins once per frame
EGO_POSE_PERIOD_US = 10_000  # linear interpolation between these samples is off the true route by < 0.1 mm
LANE_WIDTH = 3.5
ROAD_HALF_WIDTH = 6.0  # one lane and a 2.5 m parking lane each side of the centre line
CURB_HEIGHT = 0.15
MARKING_HALF_WIDTH = 0.075
CELL_SIZE = 4.0  # xy cells of the static scene's acceleration grid, metres
T_EPS = 1e-7  # hits nearer than this along a ray are ignored

CAMERA_HFOV_DEG = 70.0
SIDE_CAMERA_YAW_DEG = 55.0
SIDE_DISTORTION = {"k1": -0.08, "k2": 0.012}
LIDAR_ELEVATION_DEG = (-25.0, 12.0)
LIDAR_MIN_RANGE_M = 1.0
T_VEHICLE_LIDAR = np.array([[1.0, 0, 0, 1.0], [0, 1, 0, 0], [0, 0, 1, 1.9], [0, 0, 0, 1]])

SUN = np.array([0.5, -0.4, 0.75]) / np.linalg.norm([0.5, -0.4, 0.75])
AMBIENT, DIFFUSE = 0.55, 0.6
SKY_HORIZON, SKY_ZENITH = np.array([0.80, 0.86, 0.93]), np.array([0.33, 0.52, 0.84])
LUMA = np.array([0.2126, 0.7152, 0.0722])

PLANE, BOX, CYLINDER, SPHERE = range(4)  # primitive kinds (the plane is the ground, z = 0)
GROUND, SIDEWALK, BUILDING, POLE, TRUNK, CROWN, CAR_BODY, CAR_CABIN = range(8)  # materials

# Tables as structured arrays of float64 fields; the kernels read them as 2D arrays by these columns.
BUILDING_FIELDS = ("x0", "x1", "y0", "y1", "height", "r", "g", "b", "ground_floor_m", "floor_m",
                   "window_pitch_m", "window_width_m", "window_height_m", "sill_m")
B_X0, B_X1, B_Y0, B_Y1, B_HEIGHT, B_R, B_G, B_B, B_GROUND, B_FLOOR, B_PITCH, B_WIN_W, B_WIN_H, B_SILL = range(14)
# A car: box size, paint, box centre at t = 0, constant heading (rad) and speed along it (m/s).
CAR_FIELDS = ("length", "width", "height", "r", "g", "b", "x", "y", "z", "yaw", "speed")
C_L, C_W, C_H, C_R, C_G, C_B, C_X, C_Y, C_Z, C_YAW, C_SPEED = range(11)
BUILDING_DTYPE = np.dtype([(f, "f8") for f in BUILDING_FIELDS])
CAR_DTYPE = np.dtype([(f, "f8") for f in CAR_FIELDS])

FACADE_COLORS = np.array([[0.78, 0.72, 0.62], [0.62, 0.36, 0.28], [0.70, 0.70, 0.68], [0.86, 0.84, 0.78],
                          [0.80, 0.72, 0.50], [0.55, 0.58, 0.60], [0.72, 0.55, 0.45]])
CAR_COLORS = np.array([[0.85, 0.85, 0.85], [0.08, 0.08, 0.09], [0.60, 0.62, 0.64], [0.35, 0.36, 0.38],
                       [0.60, 0.08, 0.07], [0.10, 0.20, 0.50], [0.10, 0.30, 0.20], [0.70, 0.62, 0.48]])


def _int_option(name: str, v, lo: int, hi: int) -> None:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not lo <= v <= hi:
        raise InputError(f"SynthOptions.{name}: expected an integer in [{lo}, {hi}], got {v!r}")


@dataclass(frozen=True)
class SynthOptions(Config):
    """Generator settings; the defaults make the project's embedded log."""

    n_frames: int = 40  # 10 Hz
    width: int = 320  # every camera's image size, pixels
    height: int = 200
    supersample: int = 3  # s x s samples per pixel; odd, so the centre sample is the pixel centre (depth)
    lidar_beams: int = 32  # elevations evenly from -25 to +12 degrees
    lidar_azimuth_resolution_deg: float = 0.4  # must divide 360
    lidar_max_range_m: float = 80.0
    tracks: bool = True  # False withholds the cars' actor tracks: the log of an unannotated drive
    omit: Tuple[str, ...] = ()  # car ids left out (the rest of the street is the same): ground truth for edits

    def __post_init__(self):
        _int_option("n_frames", self.n_frames, 1, 100_000)
        _int_option("width", self.width, 16, 8192)
        _int_option("height", self.height, 16, 8192)
        _int_option("supersample", self.supersample, 1, 9)
        if self.supersample % 2 == 0:
            raise InputError(f"SynthOptions.supersample: must be odd (the centre sample gives the depth map), "
                             f"got {self.supersample}")
        _int_option("lidar_beams", self.lidar_beams, 1, 1024)
        if not isinstance(self.tracks, bool):
            raise InputError(f"SynthOptions.tracks: expected true or false, got {self.tracks!r}")
        if isinstance(self.omit, str) or not all(isinstance(c, str) for c in self.omit):
            raise InputError(f"SynthOptions.omit: expected a list of car ids, got {self.omit!r}")
        object.__setattr__(self, "omit", tuple(self.omit))
        res = self.lidar_azimuth_resolution_deg
        if not (isinstance(res, (int, float)) and not isinstance(res, bool) and 0.01 <= res <= 90 and abs(360 / res - round(360 / res)) < 1e-6):
            raise InputError(f"SynthOptions.lidar_azimuth_resolution_deg: expected degrees in [0.01, 90] that "
                             f"divide 360, got {res!r}")
        r = self.lidar_max_range_m
        if not (isinstance(r, (int, float)) and math.isfinite(r) and r > LIDAR_MIN_RANGE_M):
            raise InputError(f"SynthOptions.lidar_max_range_m: expected a finite range > {LIDAR_MIN_RANGE_M} m, "
                             f"got {r!r}")

    def to_dict(self) -> dict:
        d = {"schema_version": self.SCHEMA_VERSION, **asdict(self)}
        if not self.omit:
            del d["omit"]  # so logs written before the option existed still match their options
        else:
            d["omit"] = list(self.omit)
        return d


def _yaw_poses(positions: np.ndarray, yaw: np.ndarray) -> np.ndarray:
    """(N,3) positions and (N,) headings (rad about z) -> (N,4,4) poses."""
    T = np.tile(np.eye(4), (len(yaw), 1, 1))
    c, s = np.cos(yaw), np.sin(yaw)
    T[:, 0, 0], T[:, 0, 1], T[:, 1, 0], T[:, 1, 1] = c, -s, s, c
    T[:, :3, 3] = positions
    return T


def _table(a: np.ndarray) -> np.ndarray:
    """A structured array of float64 fields as a (N, fields) array (a view)."""
    return a.view(np.float64).reshape(len(a), len(a.dtype.names))


@dataclass(frozen=True)
class EgoRoute:
    """The ego's drive: x = v t along the street, y weaving sinusoidally about the right lane's centre,
    heading along the path's tangent, on the ground (z = 0)."""

    speed_mps: float
    weave_m: float
    weave_period_s: float
    phase: float

    def poses(self, timestamps_us) -> np.ndarray:
        """(N,) integer microseconds -> (N,4,4) T_world_vehicle."""
        t = np.asarray(timestamps_us, np.float64) * 1e-6
        w = 2 * np.pi / self.weave_period_s
        y = -LANE_WIDTH / 2 + self.weave_m * np.sin(w * t + self.phase)
        yaw = np.arctan2(self.weave_m * w * np.cos(w * t + self.phase), self.speed_mps)
        return _yaw_poses(np.stack([self.speed_mps * t, y, np.zeros_like(t)], 1), yaw)


def _car_parts(cars: np.ndarray) -> np.ndarray:
    """(A,) CAR_DTYPE -> (2A, 6) boxes (min xyz, max xyz) in each car's box frame: body, then cabin."""
    l, w, h = cars["length"], cars["width"], cars["height"]
    zb = -h / 2 + 0.55 * h
    body = np.stack([-l / 2, -w / 2, -h / 2, l / 2, w / 2, zb], -1)
    cabin = np.stack([-0.32 * l, -0.45 * w, zb, 0.18 * l, 0.45 * w, h / 2], -1)
    return np.stack([body, cabin], 1).reshape(-1, 6)


@dataclass(frozen=True)
class Hits:
    """Nearest hits of N rays: ray parameter t (inf: none), primitive id and material (-1: none),
    world normal, and the hit point (world frame; a car's box frame for car hits)."""

    t: np.ndarray
    prim: np.ndarray
    material: np.ndarray
    normal: np.ndarray
    local: np.ndarray

    def take(self, idx) -> "Hits":
        return Hits(*(getattr(self, f.name)[idx] for f in fields(self)))


@dataclass(frozen=True, eq=False)
class Street:
    """A procedural street: static primitives, cars and the ego route (world frame, metres).

    Primitive ids: static ones index ``kinds``/``params`` (id 0 is the ground plane); car parts follow
    (``n_static + 2 a`` is car a's body, ``+ 1`` its cabin, boxes ``car_parts``). ``materials`` and
    ``refs`` cover all ids; ``refs`` index the material's table (``buildings``, ``crown_tints``, ``cars``).
    """

    seed: int
    kinds: np.ndarray  # (S,) PLANE | BOX | CYLINDER | SPHERE
    params: np.ndarray  # (S,6): box min xyz, max xyz; cylinder cx cy r z0 z1 -; sphere cx cy cz r - -
    materials: np.ndarray  # (S + 2A,)
    refs: np.ndarray  # (S + 2A,)
    buildings: np.ndarray  # BUILDING_DTYPE
    crown_tints: np.ndarray  # (trees, 3)
    cars: np.ndarray  # CAR_DTYPE
    car_ids: Tuple[str, ...]
    car_parts: np.ndarray  # (2A, 6)
    sidewalk_width: float
    raised_sidewalks: bool
    ego: EgoRoute
    salt: int  # texture noise seed
    grid: tuple  # see _grid

    def car_poses(self, timestamps_us) -> np.ndarray:
        """(T,) microseconds -> (T, A, 4, 4) T_world_actor (box centre, x forward)."""
        t = np.asarray(timestamps_us, np.float64) * 1e-6
        c = self.cars
        velocity = np.stack([np.cos(c["yaw"]), np.sin(c["yaw"]), np.zeros(len(c))], 1) * c["speed"][:, None]
        pos = np.stack([c["x"], c["y"], c["z"]], 1)[None] + velocity[None] * t[:, None, None]
        yaw = np.broadcast_to(c["yaw"], (len(t), len(c)))
        return _yaw_poses(pos.reshape(-1, 3), yaw.ravel()).reshape(len(t), len(c), 4, 4)

    def raycast(self, origin, directions, timestamp_us: int) -> Hits:
        """Rays origin + t d from one point (world frame; (N,3) directions, t in units of |d|) against
        the street at a time."""
        T = np.eye(4)
        T[:3, 3] = origin
        d = np.asarray(directions, np.float64).reshape(-1, 3)
        return self._cast(T[None], d, np.zeros(len(d), np.int64), self.car_poses([timestamp_us]))

    def occupied(self, points, timestamp_us: int) -> np.ndarray:
        """(N,) bool: which world points (N,3) lie inside a solid (a building, sidewalk, pole, trunk, crown or
        car at that time; the ground plane is not a solid)."""
        p = np.asarray(points, np.float64).reshape(-1, 3)
        inside = np.zeros(len(p), bool)
        for kind in (BOX, CYLINDER, SPHERE):
            q = self.params[self.kinds == kind][None]  # (1,S,6)
            x, y, z = p[:, 0:1], p[:, 1:2], p[:, 2:3]
            if kind == BOX:
                hit = ((x >= q[..., 0]) & (x <= q[..., 3]) & (y >= q[..., 1]) & (y <= q[..., 4])
                       & (z >= q[..., 2]) & (z <= q[..., 5]))
            elif kind == CYLINDER:
                hit = ((x - q[..., 0]) ** 2 + (y - q[..., 1]) ** 2 <= q[..., 2] ** 2) & (z >= q[..., 3]) & (z <= q[..., 4])
            else:
                hit = (x - q[..., 0]) ** 2 + (y - q[..., 1]) ** 2 + (z - q[..., 2]) ** 2 <= q[..., 3] ** 2
            inside |= hit.any(1)
        T_world_car = self.car_poses([timestamp_us])[0]  # (A,4,4)
        local = np.einsum("aji,anj->ani", T_world_car[:, :3, :3], p[None] - T_world_car[:, None, :3, 3])
        parts = self.car_parts.reshape(-1, 2, 6)  # (A, body|cabin, 6)
        within = ((local[:, :, None] >= parts[:, None, :, :3]) & (local[:, :, None] <= parts[:, None, :, 3:])).all(-1)
        return inside | within.any((0, 2))

    def _cast(self, sensor_poses, rays, slots, car_poses) -> Hits:
        """Ray r starts at sensor pose T = sensor_poses[slots[r]] (S,4,4, T_world_sensor), runs along
        T's rotation of rays[r] (sensor frame) and meets the cars at car_poses[slots[r]] (S,A,4,4):
        a slot is one sensor position and time (a camera frame; a LiDAR column)."""
        centres = car_poses[:, :, :3, 3]
        radius = 0.5 * np.linalg.norm(_table(self.cars)[:, C_L:C_H + 1], axis=1)
        order = np.argsort(centres[0, :, 0], kind="stable")
        # A car is a candidate for rays that cross x within `reach` of its centre in the first slot.
        reach = (radius + np.abs(centres[:, :, 0] - centres[:1, :, 0]).max(0, initial=0.0)).max(initial=0.0)
        cars = (np.ascontiguousarray(car_poses[:, :, :3, :3]), np.ascontiguousarray(centres), radius,
                self.car_parts, order, centres[0, order, 0], reach)
        t, prim, normal, local = _cast_kernel(np.ascontiguousarray(sensor_poses[:, :3]), np.ascontiguousarray(rays),
                                              slots, (self.kinds, self.params) + self.grid, cars)
        return Hits(t, prim, np.where(prim >= 0, self.materials[prim], -1), normal, local)

    @property
    def _textures(self) -> tuple:
        return (self.materials, self.refs, _table(self.buildings), _table(self.cars), self.car_parts,
                self.crown_tints, self.sidewalk_width, self.salt)


# --------------------------------------------------------------------------- the ray caster

@njit(cache=True, inline="always")
def _slab(o, d, lo, hi, t0, t1):
    """Clip the ray interval [t0, t1] to lo <= o + t d <= hi along one axis (empty: t0 > t1)."""
    if d == 0.0:
        return (t0, t1) if lo <= o <= hi else (np.inf, -np.inf)
    ta, tb = (lo - o) / d, (hi - o) / d
    return max(t0, min(ta, tb)), min(t1, max(ta, tb))


@njit(cache=True, inline="always")
def _rotate(T, s, x, y, z):
    """T[s][:3, :3] @ (x, y, z)."""
    return (T[s, 0, 0] * x + T[s, 0, 1] * y + T[s, 0, 2] * z, T[s, 1, 0] * x + T[s, 1, 1] * y + T[s, 1, 2] * z,
            T[s, 2, 0] * x + T[s, 2, 1] * y + T[s, 2, 2] * z)


@njit(cache=True, inline="always")
def _inv(d):
    return 1.0 / d if d != 0.0 else np.inf


@njit(cache=True, inline="always")
def _box(o0, o1, o2, v0, v1, v2, b, i):
    """A ray (origin o, inverse direction v = 1/d, inf where d = 0) against box b[i] = (min xyz, max xyz)
    from outside: (t, normal), or (inf, 0)."""
    tn, tf, axis = -np.inf, np.inf, 0
    for k in range(3):
        o = o0 if k == 0 else (o1 if k == 1 else o2)
        v = v0 if k == 0 else (v1 if k == 1 else v2)
        lo, hi = b[i, k], b[i, k + 3]
        if v == np.inf:
            if not lo <= o <= hi:
                return np.inf, 0.0, 0.0, 0.0
        else:
            ta, tb = (lo - o) * v, (hi - o) * v
            if ta > tb:
                ta, tb = tb, ta
            if ta > tn:
                tn, axis = ta, k
            tf = min(tf, tb)
    if tn > tf or tn <= T_EPS:
        return np.inf, 0.0, 0.0, 0.0
    s = -1.0 if (v0 if axis == 0 else (v1 if axis == 1 else v2)) > 0 else 1.0
    return tn, s * (axis == 0), s * (axis == 1), s * (axis == 2)


@njit(cache=True, inline="always")
def _static_hit(kind, p, i, o0, o1, o2, d0, d1, d2, v0, v1, v2):
    if kind == BOX:
        return _box(o0, o1, o2, v0, v1, v2, p, i)
    if kind == CYLINDER:  # vertical: side wall and top cap
        r, z0, z1 = p[i, 2], p[i, 3], p[i, 4]
        fx, fy = o0 - p[i, 0], o1 - p[i, 1]
        best, nx, ny, nz = np.inf, 0.0, 0.0, 0.0
        a = d0 * d0 + d1 * d1
        b = fx * d0 + fy * d1
        disc = b * b - a * (fx * fx + fy * fy - r * r)
        if a > 0 and disc >= 0:
            t = (-b - math.sqrt(disc)) / a
            if t > T_EPS and z0 <= o2 + t * d2 <= z1:
                best, nx, ny = t, (fx + t * d0) / r, (fy + t * d1) / r
        if d2 < 0:
            t = (z1 - o2) / d2
            if T_EPS < t < best and (fx + t * d0) ** 2 + (fy + t * d1) ** 2 <= r * r:
                best, nx, ny, nz = t, 0.0, 0.0, 1.0
        return best, nx, ny, nz
    # SPHERE
    fx, fy, fz, r = o0 - p[i, 0], o1 - p[i, 1], o2 - p[i, 2], p[i, 3]
    a = d0 * d0 + d1 * d1 + d2 * d2
    b = fx * d0 + fy * d1 + fz * d2
    disc = b * b - a * (fx * fx + fy * fy + fz * fz - r * r)
    if disc < 0:
        return np.inf, 0.0, 0.0, 0.0
    t = (-b - math.sqrt(disc)) / a
    if t <= T_EPS:
        return np.inf, 0.0, 0.0, 0.0
    return t, (fx + t * d0) / r, (fy + t * d1) / r, (fz + t * d2) / r


@njit(cache=True)
def _cast_rays(lo, hi, sensors, rays, slots, static, cars, out):
    """Rays lo..hi-1: the nearest hit's t, id, world normal and local point into ``out``."""
    kinds, params, gx, gy, cs, nx, ny, cell_start, cell_items, cell_zmax, zmax = static
    R, trans, radius, part_box, order, order_x, reach = cars
    t_out, id_out, normal, local = out
    n_static = kinds.shape[0]
    for r in range(lo, hi):
        s = slots[r]
        o0, o1, o2 = sensors[s, 0, 3], sensors[s, 1, 3], sensors[s, 2, 3]
        d0, d1, d2 = _rotate(sensors, s, rays[r, 0], rays[r, 1], rays[r, 2])
        v0, v1, v2 = _inv(d0), _inv(d1), _inv(d2)
        best, bid, n0, n1, n2 = np.inf, -1, 0.0, 0.0, 0.0
        if d2 < -1e-12 and o2 > 0:  # the ground plane (id 0)
            best, bid, n2 = -o2 / d2, 0, 1.0
        # Static primitives: walk the grid cells that the ray crosses in xy (2D DDA), near to far, until
        # the best hit lies within the cell, or the ray has risen above everything.
        t_in, t_end = _slab(o0, d0, gx, gx + nx * cs, 0.0, np.inf)
        t_in, t_end = _slab(o1, d1, gy, gy + ny * cs, t_in, t_end)
        if t_in < t_end and t_in < best:
            ix = min(max(int(math.floor((o0 + t_in * d0 - gx) / cs)), 0), nx - 1)
            iy = min(max(int(math.floor((o1 + t_in * d1 - gy) / cs)), 0), ny - 1)
            sx, sy = (1 if d0 > 0 else -1), (1 if d1 > 0 else -1)
            tx = (gx + (ix + (d0 > 0)) * cs - o0) / d0 if d0 != 0 else np.inf
            ty = (gy + (iy + (d1 > 0)) * cs - o1) / d1 if d1 != 0 else np.inf
            dtx = cs / abs(d0) if d0 != 0 else np.inf
            dty = cs / abs(d1) if d1 != 0 else np.inf
            while True:
                t_exit = min(tx, ty, t_end)
                c = ix * ny + iy
                if o2 + (t_in if d2 >= 0 else t_exit) * d2 <= cell_zmax[c]:  # the ray's lowest point here
                    for m in range(cell_start[c], cell_start[c + 1]):
                        i = cell_items[m]
                        th, h0, h1, h2 = _static_hit(kinds[i], params, i, o0, o1, o2, d0, d1, d2, v0, v1, v2)
                        if th < best:
                            best, bid, n0, n1, n2 = th, i, h0, h1, h2
                if best <= t_exit or t_exit >= t_end or (d2 >= 0 and o2 + t_exit * d2 > zmax):
                    break
                if tx < ty:
                    ix, tx = ix + sx, tx + dtx
                else:
                    iy, ty = iy + sy, ty + dty
                if not (0 <= ix < nx and 0 <= iy < ny):
                    break
                t_in = t_exit
        l0, l1, l2 = o0 + best * d0, o1 + best * d1, o2 + best * d2
        # Cars whose x is near the ray's x-range up to the best hit: bounding-sphere rejection, then the
        # two part boxes in the car's frame at this ray's time.
        dd = d0 * d0 + d1 * d1 + d2 * d2
        dx = best * d0 if d0 != 0 else 0.0  # not inf * 0
        first = np.searchsorted(order_x, min(o0, o0 + dx) - reach)
        last = np.searchsorted(order_x, max(o0, o0 + dx) + reach, side="right")
        for m in range(first, last):  # indices, not a slice: an array view costs an atomic refcount
            a = order[m]
            v0, v1, v2 = trans[s, a, 0] - o0, trans[s, a, 1] - o1, trans[s, a, 2] - o2
            vd = v0 * d0 + v1 * d1 + v2 * d2
            if (v0 * v0 + v1 * v1 + v2 * v2 - vd * vd / dd > radius[a] ** 2
                    or (vd - radius[a] * math.sqrt(dd)) / dd >= best):
                continue
            q0 = -(R[s, a, 0, 0] * v0 + R[s, a, 1, 0] * v1 + R[s, a, 2, 0] * v2)
            q1 = -(R[s, a, 0, 1] * v0 + R[s, a, 1, 1] * v1 + R[s, a, 2, 1] * v2)
            q2 = -(R[s, a, 0, 2] * v0 + R[s, a, 1, 2] * v1 + R[s, a, 2, 2] * v2)
            e0 = R[s, a, 0, 0] * d0 + R[s, a, 1, 0] * d1 + R[s, a, 2, 0] * d2
            e1 = R[s, a, 0, 1] * d0 + R[s, a, 1, 1] * d1 + R[s, a, 2, 1] * d2
            e2 = R[s, a, 0, 2] * d0 + R[s, a, 1, 2] * d1 + R[s, a, 2, 2] * d2
            w0, w1, w2 = _inv(e0), _inv(e1), _inv(e2)
            for j in range(2 * a, 2 * a + 2):
                th, h0, h1, h2 = _box(q0, q1, q2, w0, w1, w2, part_box, j)
                if th < best:
                    best, bid = th, n_static + j
                    n0 = R[s, a, 0, 0] * h0 + R[s, a, 0, 1] * h1 + R[s, a, 0, 2] * h2
                    n1 = R[s, a, 1, 0] * h0 + R[s, a, 1, 1] * h1 + R[s, a, 1, 2] * h2
                    n2 = R[s, a, 2, 0] * h0 + R[s, a, 2, 1] * h1 + R[s, a, 2, 2] * h2
                    l0, l1, l2 = q0 + th * e0, q1 + th * e1, q2 + th * e2
        if bid >= 0:
            t_out[r], id_out[r] = best, bid
            normal[r, 0], normal[r, 1], normal[r, 2] = n0, n1, n2
            local[r, 0], local[r, 1], local[r, 2] = l0, l1, l2


# Parallel loops run over chunks of rays and call a plain function per chunk: parfor-lowering a
# large loop body compiles several times slower, and arrays are handed over once per chunk.
CHUNK = 2048


@njit(cache=True, parallel=True)
def _cast_kernel(sensors, rays, slots, static, cars):
    n = rays.shape[0]
    out = (np.full(n, np.inf), np.full(n, -1, np.int64), np.zeros((n, 3)), np.zeros((n, 3)))
    for c in prange((n + CHUNK - 1) // CHUNK):
        _cast_rays(c * CHUNK, min(n, (c + 1) * CHUNK), sensors, rays, slots, static, cars, out)
    return out


# --------------------------------------------------------------------------- textures and shading

@njit(cache=True, inline="always")
def _noise(x, y, z, scale, salt):
    """Smooth noise in [0, 1] with features of ``scale`` metres: hashed lattice values, smoothstep-blended."""
    q0, q1, q2 = x / scale, y / scale, z / scale
    i0, i1, i2 = math.floor(q0), math.floor(q1), math.floor(q2)
    f0, f1, f2 = q0 - i0, q1 - i1, q2 - i2
    w0, w1, w2 = f0 * f0 * (3 - 2 * f0), f1 * f1 * (3 - 2 * f1), f2 * f2 * (3 - 2 * f2)
    acc = 0.0
    for c in range(8):
        a, b, e = c & 1, (c >> 1) & 1, c >> 2
        w = (w0 if a else 1 - w0) * (w1 if b else 1 - w1) * (w2 if e else 1 - w2)
        if w == 0.0:  # e.g. the upper corners on the ground (z = 0)
            continue
        h = ((((int(i0) + a) & 0xFFFFFF) * 73856093) ^ (((int(i1) + b) & 0xFFFFFF) * 19349663)
             ^ (((int(i2) + e) & 0xFFFFFF) * 83492791) ^ salt) & 0xFFFFFFFF
        h = ((h ^ (h >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
        h = ((h ^ (h >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
        h ^= h >> 16
        acc += w * (h / 4294967296.0)
    return acc


@njit(cache=True, inline="always")
def lane_marking(x, y):
    """Whether the road surface at world (x, y) is painted (the dashed centre line, the lane edges); scalars inside
    the kernels, arrays from Python."""
    ay = np.abs(y)
    return ((ay < MARKING_HALF_WIDTH) & (x % 9.0 < 3.0)) | (np.abs(ay - LANE_WIDTH) < MARKING_HALF_WIDTH)


@njit(cache=True, inline="always")
def _asphalt(x, y, z, salt):
    if lane_marking(x, y):
        return 0.86, 0.86, 0.82
    g = 0.26 + 0.06 * (_noise(x, y, z, 3.0, salt) - 0.5) + 0.03 * (_noise(x, y, z, 0.5, salt) - 0.5)
    return g, g, 1.05 * g


@njit(cache=True, inline="always")
def _paving(x, y, z, salt):
    fx, fy = x % 1.5, (abs(y) - ROAD_HALF_WIDTH) % 1.5
    g = 0.58 + 0.06 * (_noise(x, y, z, 2.0, salt) - 0.5)
    if min(fx, 1.5 - fx) < 0.025 or min(fy, 1.5 - fy) < 0.025:  # joints between 1.5 m slabs
        g *= 0.88
    return g, 0.98 * g, 0.94 * g


@njit(cache=True, inline="always")
def _glass(f):
    """Window glass, brightening towards the top (a sky reflection baked into the albedo)."""
    f = min(max(f, 0.0), 1.0)
    return 0.13 + 0.18 * f, 0.17 + 0.18 * f, 0.23 + 0.18 * f


@njit(cache=True, inline="always")
def _facade(b, i, x, y, z, n1, n2, salt):
    if n2 > 0.5:
        return 0.32, 0.31, 0.30  # roof
    if abs(n1) > 0.5:  # faces towards +-y run along x
        h, u, span = x, x - b[i, B_X0], b[i, B_X1] - b[i, B_X0]
    else:
        h, u, span = y, y - b[i, B_Y0], b[i, B_Y1] - b[i, B_Y0]
    bay = span / max(1.0, math.floor(span / b[i, B_PITCH]))  # whole bays, one window each
    ub = abs(u % bay - bay / 2)
    zf = z - b[i, B_GROUND]
    if z < 2.3 and ub < 0.55 and (u // bay) % 3 == 1:
        return 0.32, 0.22, 0.14  # door
    if zf < -0.5 and z > 0.7 and ub < 0.38 * bay:
        return _glass((z - 0.7) / (b[i, B_GROUND] - 1.2))  # shop window
    if zf > 0 and z < b[i, B_HEIGHT] - 1.0:
        zw, half_w, win_h = zf % b[i, B_FLOOR] - b[i, B_SILL], b[i, B_WIN_W] / 2, b[i, B_WIN_H]
        if ub < half_w and 0 < zw < win_h:
            return _glass(zw / win_h)
        if ub < half_w + 0.08 and -0.08 < zw < win_h + 0.08:
            return 0.86, 0.85, 0.80  # window trim
    g = 0.92 + 0.16 * _noise(h, z, 0.0, 2.0, salt)  # 2D, in the face's plane: half the lattice corners
    if z > b[i, B_HEIGHT] - 0.3:
        g *= 0.8  # cornice
    return b[i, B_R] * g, b[i, B_G] * g, b[i, B_B] * g


@njit(cache=True, inline="always")
def _car_paint(cars, parts, i, cabin, x, y, z, n0, n1):
    c, s = math.cos(cars[i, C_YAW]), math.sin(cars[i, C_YAW])
    nx, ny = c * n0 + s * n1, -s * n0 + c * n1  # the normal in the car's frame
    if cabin:
        j = 2 * i + 1
        if parts[j, 2] + 0.06 < z < parts[j, 5] - 0.08:
            side = (abs(ny) > 0.5 and parts[j, 0] + 0.12 < x < parts[j, 3] - 0.12
                    and abs(x - (parts[j, 0] + parts[j, 3]) / 2) > 0.05)  # side windows, a B-pillar
            if side or (abs(nx) > 0.5 and abs(y) < parts[j, 4] - 0.1):
                return 0.07, 0.09, 0.12
    else:
        zb, hw = z + cars[i, C_H] / 2, cars[i, C_W] / 2  # height above the car's bottom
        if zb < 0.32:
            return 0.05, 0.05, 0.05  # tyres and sills
        if abs(nx) > 0.5 and hw - 0.45 < abs(y) < hw - 0.12 and 0.55 < zb < 0.72:
            return (0.92, 0.92, 0.86) if nx > 0 else (0.70, 0.07, 0.05)  # head and tail lights
    return cars[i, C_R], cars[i, C_G], cars[i, C_B]


@njit(cache=True, inline="always")
def _albedo_at(k, prim, normal, local, tex):
    materials, refs, buildings, cars, parts, tints, sidewalk_width, salt = tex
    m, i = materials[prim[k]], refs[prim[k]]
    x, y, z = local[k, 0], local[k, 1], local[k, 2]
    if m == GROUND:
        ay = abs(y)
        if ay < ROAD_HALF_WIDTH:
            return _asphalt(x, y, z, salt)
        if ay < ROAD_HALF_WIDTH + sidewalk_width:
            return _paving(x, y, z, salt)
        g = 0.8 + 0.4 * _noise(x, y, z, 1.5, salt)  # verges: grass and dirt
        return 0.33 * g, 0.36 * g, 0.2 * g
    if m == SIDEWALK:
        return _paving(x, y, z, salt) if normal[k, 2] > 0.5 else (0.62, 0.61, 0.58)  # top, curb face
    if m == BUILDING:
        return _facade(buildings, i, x, y, z, normal[k, 1], normal[k, 2], salt)
    if m == POLE:
        return 0.42, 0.43, 0.45
    if m == TRUNK:
        g = 0.85 + 0.3 * _noise(x, y, z, 0.3, salt)
        return 0.33 * g, 0.24 * g, 0.16 * g
    if m == CROWN:
        g = 0.7 + 0.6 * _noise(x, y, z, 0.5, salt)
        return tints[i, 0] * g, tints[i, 1] * g, tints[i, 2] * g
    return _car_paint(cars, parts, i, m == CAR_CABIN, x, y, z, normal[k, 0], normal[k, 1])


@njit(cache=True)
def _shade_range(lo, hi, prim, normal, local, camera, rays, samples, lit, tex, out):
    """Outputs lo..hi-1, each the mean over ``samples`` consecutive rays of: the Lambertian colour or
    the sky (``lit``, a camera's pixels), or the bare albedo (LiDAR hits)."""
    for q in range(lo, hi):
        c0 = c1 = c2 = 0.0
        for k in range(q * samples, (q + 1) * samples):
            if prim[k] >= 0:
                a0, a1, a2 = _albedo_at(k, prim, normal, local, tex)
                light = (AMBIENT * (0.8 + 0.2 * normal[k, 2]) + DIFFUSE * max(
                    0.0, normal[k, 0] * SUN[0] + normal[k, 1] * SUN[1] + normal[k, 2] * SUN[2])) if lit else 1.0
                c0, c1, c2 = c0 + min(a0, 1.0) * light, c1 + min(a1, 1.0) * light, c2 + min(a2, 1.0) * light
            elif lit:  # sky: a gradient from the horizon to the zenith and a glow around the sun
                d0, d1, d2 = _rotate(camera, 0, rays[k, 0], rays[k, 1], rays[k, 2])
                inv = 1.0 / math.sqrt(d0 * d0 + d1 * d1 + d2 * d2)
                up = max(0.0, d2 * inv) ** 0.6
                glow = 0.12 * max(0.0, (d0 * SUN[0] + d1 * SUN[1] + d2 * SUN[2]) * inv) ** 6
                c0 += SKY_HORIZON[0] + (SKY_ZENITH[0] - SKY_HORIZON[0]) * up + glow
                c1 += SKY_HORIZON[1] + (SKY_ZENITH[1] - SKY_HORIZON[1]) * up + glow
                c2 += SKY_HORIZON[2] + (SKY_ZENITH[2] - SKY_HORIZON[2]) * up + glow
        out[q, 0], out[q, 1], out[q, 2] = c0 / samples, c1 / samples, c2 / samples


@njit(cache=True, parallel=True)
def _shade_kernel(prim, normal, local, camera, rays, samples, lit, tex):
    out = np.empty((prim.shape[0] // samples, 3))
    for c in prange((out.shape[0] + CHUNK - 1) // CHUNK):
        _shade_range(c * CHUNK, min(out.shape[0], (c + 1) * CHUNK), prim, normal, local, camera, rays, samples,
                     lit, tex, out)
    return out


# --------------------------------------------------------------------------- building the street

def _grid(kinds: np.ndarray, params: np.ndarray) -> tuple:
    """Uniform xy cells of CELL_SIZE listing the static primitives (not the ground) whose xy bounds meet
    them: (x0, y0, cell size, nx, ny, cell start (nx*ny+1), items, cell top z (nx*ny), top z)."""
    p = params
    box, cyl = kinds == BOX, kinds == CYLINDER
    radius = np.where(cyl, p[:, 2], p[:, 3])[:, None]
    lo = np.where(box[:, None], p[:, 0:2], p[:, 0:2] - radius)
    hi = np.where(box[:, None], p[:, 3:5], p[:, 0:2] + radius)
    ztop = np.select([box, cyl], [p[:, 5], p[:, 4]], p[:, 2] + p[:, 3])
    solid = np.nonzero(kinds != PLANE)[0]
    origin = np.floor(lo[solid].min(0))
    nx, ny = np.ceil((hi[solid].max(0) - origin) / CELL_SIZE).astype(int)
    cells = [[] for _ in range(nx * ny)]
    for i in solid:
        (ax, ay), (bx, by) = (lo[i] - origin) // CELL_SIZE, (hi[i] - origin) // CELL_SIZE
        for ix in range(int(ax), min(int(bx), nx - 1) + 1):
            for iy in range(int(ay), min(int(by), ny - 1) + 1):
                cells[ix * ny + iy].append(i)
    zmax = np.array([max((ztop[i] for i in c), default=-np.inf) for c in cells])
    start = np.cumsum([0] + [len(c) for c in cells]).astype(np.int64)
    items = np.array([i for c in cells for i in c], np.int64)
    return float(origin[0]), float(origin[1]), CELL_SIZE, int(nx), int(ny), start, items, zmax, float(zmax.max())


def _buildings(rng, side: int, x_lo: float, x_hi: float, street_edge: float) -> list:
    rows, x = [], x_lo
    while x < x_hi:
        if rng.random() < 0.25:
            x += rng.uniform(2.0, 5.0)  # an alley
        width, setback, depth = rng.uniform(8, 22), rng.uniform(0.0, 1.2), rng.uniform(10, 16)
        ground, floor = rng.uniform(3.6, 4.4), rng.uniform(2.9, 3.4)
        height = ground + (rng.integers(2, 7) - 1) * floor + rng.uniform(0.6, 1.2)  # top floor and a parapet
        pitch = rng.uniform(2.4, 3.6)
        color = FACADE_COLORS[rng.integers(len(FACADE_COLORS))] * rng.uniform(0.9, 1.05, 3)
        face = side * (street_edge + setback)
        y0, y1 = sorted((face, face + side * depth))
        rows.append((x, x + width, y0, y1, height, *color, ground, floor, pitch, pitch * rng.uniform(0.35, 0.55),
                     rng.uniform(1.3, 1.8), rng.uniform(0.7, 1.0)))
        x += width
    return rows


def _car(rng, x: float, y: float, yaw: float, speed: float) -> tuple:
    """A car row (CAR_FIELDS) with its box centred at (x, y) on the ground."""
    l, w, h = rng.uniform(3.9, 4.8), rng.uniform(1.7, 1.95), rng.uniform(1.4, 1.65)
    color = np.clip(CAR_COLORS[rng.integers(len(CAR_COLORS))] * rng.uniform(0.9, 1.1), 0, 1)
    return (l, w, h, *color, x, y, h / 2, yaw, speed)


def build_street(seed: int = 0, options: SynthOptions = SynthOptions()) -> Street:
    """The street of ``seed``, long enough for ``options.n_frames``. Each part draws from its own
    generator, so a longer drive extends the same street."""
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise InputError(f"seed: expected a non-negative integer, got {seed!r}")
    # one generator per part and side: how much a part draws depends on the street's length
    r_ego, r_layout, r_left, r_right, r_moving, r_tex, *r_sides = (
        np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(10))
    r_furniture, r_parked = dict(zip((1, -1), r_sides[:2])), dict(zip((1, -1), r_sides[2:]))
    ego = EgoRoute(r_ego.uniform(5.5, 7.5), r_ego.uniform(0.15, 0.35), r_ego.uniform(3.0, 5.0),
                   r_ego.uniform(0, 2 * np.pi))
    x_lo, x_hi = -40.0, ego.speed_mps * options.n_frames * FRAME_PERIOD_US * 1e-6 + 160.0
    sidewalk, raised = r_layout.uniform(2.5, 3.5), bool(r_layout.random() < 0.75)
    walk_z, edge = (CURB_HEIGHT if raised else 0.0), ROAD_HALF_WIDTH + sidewalk

    prims = [(PLANE, (0.0,) * 6, GROUND, 0)]  # (kind, params, material, ref)
    if raised:
        for side in (1, -1):
            y0, y1 = sorted((side * ROAD_HALF_WIDTH, side * edge))
            prims.append((BOX, (x_lo, y0, 0.0, x_hi, y1, CURB_HEIGHT), SIDEWALK, 0))
    buildings = np.array(_buildings(r_left, 1, x_lo, x_hi, edge) + _buildings(r_right, -1, x_lo, x_hi, edge),
                         BUILDING_DTYPE)
    prims += [(BOX, (b["x0"], b["y0"], 0.0, b["x1"], b["y1"], b["height"]), BUILDING, i)
              for i, b in enumerate(buildings)]
    tints = []
    for side in (1, -1):  # street furniture on the sidewalks: trees and lamp poles
        rf = r_furniture[side]
        x = x_lo + rf.uniform(2, 8)
        while x < x_hi:
            if rf.random() < 0.6:
                trunk_r, trunk_h, crown_r = (rf.uniform(0.12, 0.2), rf.uniform(2.2, 3.2),
                                             rf.uniform(1.3, 2.0))
                y, cz = side * (ROAD_HALF_WIDTH + 1.0), walk_z + trunk_h + 0.6 * crown_r
                prims.append((CYLINDER, (x, y, trunk_r, walk_z, cz, 0.0), TRUNK, 0))
                prims.append((SPHERE, (x, y, cz, crown_r, 0.0, 0.0), CROWN, len(tints)))
                tints.append(np.array([0.20, 0.36, 0.14]) * rf.uniform(0.85, 1.15, 3))
            else:
                prims.append((CYLINDER, (x, side * (ROAD_HALF_WIDTH + 0.45), 0.09, walk_z, walk_z + 6.5, 0.0),
                              POLE, 0))
            x += rf.uniform(8, 15)

    # Cars: moving ones first (a lead car in the ego lane, faster than the ego; 1-2 oncoming), then parked.
    cars = [_car(r_moving, r_moving.uniform(14, 22), -LANE_WIDTH / 2, 0.0, ego.speed_mps + r_moving.uniform(0.3, 1.5))]
    x = r_moving.uniform(40, 70)
    for _ in range(1 + int(r_moving.random() < 0.5)):
        cars.append(_car(r_moving, x, LANE_WIDTH / 2, np.pi, r_moving.uniform(6, 9)))
        x += r_moving.uniform(25, 45)
    n_moving = len(cars)
    for side in (1, -1):  # parked in the parking lanes, facing their side's traffic
        rp = r_parked[side]
        x = x_lo + rp.uniform(0, 6)
        while x < x_hi - 6:
            car = _car(rp, 0.0, side * (LANE_WIDTH + 1.25), (np.pi if side > 0 else 0.0)
                       + rp.uniform(-0.03, 0.03), 0.0)
            cars.append((*car[:C_X], x + car[C_L] / 2, *car[C_Y:]))
            x += car[C_L] + rp.uniform(3, 20)
    ids = [f"moving_{a}" if a < n_moving else f"parked_{a - n_moving:02d}" for a in range(len(cars))]
    unknown = sorted(set(options.omit) - set(ids))
    if unknown:
        raise InputError(f"SynthOptions.omit: no cars {unknown} in the street of seed {seed}; it has {ids}")
    keep = [a for a, i in enumerate(ids) if i not in options.omit]
    cars = np.array([cars[a] for a in keep], CAR_DTYPE)
    car_ids = tuple(ids[a] for a in keep)

    kinds = np.array([p[0] for p in prims], np.int64)
    params = np.array([p[1] for p in prims], np.float64)
    return Street(seed=int(seed), kinds=kinds, params=params,
                  materials=np.array([p[2] for p in prims] + [CAR_BODY, CAR_CABIN] * len(cars), np.int64),
                  refs=np.concatenate([[p[3] for p in prims], np.repeat(np.arange(len(cars)), 2)]).astype(np.int64),
                  buildings=buildings, crown_tints=np.array(tints).reshape(-1, 3), cars=cars,
                  car_ids=car_ids,
                  car_parts=_car_parts(cars), sidewalk_width=float(sidewalk), raised_sidewalks=raised, ego=ego,
                  salt=int(r_tex.integers(2 ** 31)), grid=_grid(kinds, params))


# --------------------------------------------------------------------------- sensors

@lru_cache(maxsize=8)
def _subpixel_rays(camera: Camera, s: int) -> np.ndarray:
    """(H*W*s*s, 3) camera-frame rays (x/z, y/z, 1) through an s x s grid in every pixel, the samples of a
    pixel consecutive; the model's own unprojection, so distortion is exact."""
    off = (np.arange(s) + 0.5) / s
    v = np.arange(camera.height)[:, None, None, None] + off[:, None]  # (H, 1, s, 1)
    u = np.arange(camera.width)[:, None, None] + off  # (W, 1, s)
    uu, vv = np.broadcast_arrays(u, v)  # (H, W, s, s): pixel row, column, sub-row, sub-column
    rays, _ = camera.unproject(np.stack([uu.ravel(), vv.ravel()], 1))
    return rays


def render_camera(st: Street, camera: Camera, T_world_camera: np.ndarray, timestamp_us: int,
                  supersample: int = 3) -> Tuple[np.ndarray, np.ndarray]:
    """(H,W,3) uint8 RGB, box-filtered over s x s samples per pixel, and (H,W) float32 depth: camera z
    (metres) along each pixel-centre ray, 0 where it sees the sky."""
    s2 = supersample * supersample
    rays = _subpixel_rays(camera, supersample)  # camera z = 1, so t is the depth
    T = np.asarray(T_world_camera, np.float64)[None]
    hits = st._cast(T, rays, np.zeros(len(rays), np.int64), st.car_poses([timestamp_us]))
    rgb = _shade_kernel(hits.prim, hits.normal, hits.local, np.ascontiguousarray(T[:, :3]), rays, s2, True,
                        st._textures)
    depth = np.where(hits.prim >= 0, hits.t, 0.0)[s2 // 2::s2]  # the centre sample is the pixel centre
    return (np.round(np.clip(rgb, 0, 1) * 255).astype(np.uint8).reshape(camera.height, camera.width, 3),
            depth.astype(np.float32).reshape(camera.height, camera.width))


def camera_hits(st: Street, camera: Camera, T_world_camera: np.ndarray, timestamp_us: int) -> Hits:
    """The street's nearest hits along the camera's pixel-centre rays, row-major (H*W): depth (camera z) in ``t``,
    what each pixel sees in ``material`` (-1: the sky), the hit in the world or its car's box frame in ``local``."""
    rays = _subpixel_rays(camera, 1)
    return st._cast(np.asarray(T_world_camera, np.float64)[None], rays, np.zeros(len(rays), np.int64),
                    st.car_poses([timestamp_us]))


def lidar_beams(options: SynthOptions) -> LidarBeams:
    return LidarBeams(tuple(np.linspace(*LIDAR_ELEVATION_DEG, options.lidar_beams).tolist()),
                      float(options.lidar_azimuth_resolution_deg), LIDAR_MIN_RANGE_M,
                      float(options.lidar_max_range_m))


def lidar_sweep(st: Street, T_vehicle_lidar: np.ndarray, beams: LidarBeams, timestamp_us: int) -> np.ndarray:
    """One counter-clockwise sweep from azimuth -180 deg over FRAME_PERIOD_US: (N,5) float32 x, y, z
    (the sensor frame at the point's own time), intensity (albedo luminance x cos incidence, in [0,1])
    and time offset (us). Each azimuth column is cast from the ego pose, and with the cars, at its time."""
    n_az, nb = round(360 / beams.azimuth_resolution_deg), len(beams.elevations_deg)
    offsets = np.arange(n_az) * FRAME_PERIOD_US // n_az
    az = np.radians(-180 + (np.arange(n_az) + 0.5) * beams.azimuth_resolution_deg)[:, None]
    el = np.radians(beams.elevations_deg)[None]
    dirs = np.stack(np.broadcast_arrays(np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)), -1)
    times = timestamp_us + offsets
    T = st.ego.poses(times) @ T_vehicle_lidar
    dirs = dirs.reshape(-1, 3)
    hits = st._cast(T, dirs, np.repeat(np.arange(n_az), nb), st.car_poses(times))
    keep = np.nonzero((hits.t >= beams.min_range_m) & (hits.t <= beams.max_range_m))[0]
    hits = hits.take(keep)
    world_dirs = np.einsum("nij,nj->ni", T[keep // nb, :3, :3], dirs[keep])
    cos_incidence = np.abs(np.einsum("ni,ni->n", hits.normal, world_dirs))
    albedo = _shade_kernel(hits.prim, hits.normal, hits.local, T[:1, :3], dirs[keep], 1, False, st._textures)
    intensity = np.clip((np.clip(albedo, 0, 1) * LUMA).sum(1) * cos_incidence, 0, 1)
    points = dirs[keep] * hits.t[:, None]
    return np.column_stack([points, intensity, offsets[keep // nb]]).astype(np.float32)


def _camera_rig(options: SynthOptions) -> Dict[str, Tuple[Camera, np.ndarray]]:
    """Camera models and T_vehicle_camera: a front pinhole, and side cameras yawed +-55 deg with barrel
    distortion; all 70 deg wide (before distortion) and 1.6 m above the ground."""
    w, h = options.width, options.height
    f = w / 2 / math.tan(math.radians(CAMERA_HFOV_DEG) / 2)
    rig = {}
    for name, yaw, y in (("front", 0.0, 0.0), ("front_left", SIDE_CAMERA_YAW_DEG, 0.4),
                         ("front_right", -SIDE_CAMERA_YAW_DEG, -0.4)):
        cam = (PinholeCamera(w, h, f, f, w / 2, h / 2) if yaw == 0
               else OpenCVCamera(w, h, f, f, w / 2, h / 2, **SIDE_DISTORTION))
        T = _yaw_poses(np.array([[1.8, y, 1.6]]), np.radians([yaw]))[0]
        T[:3, :3] = T[:3, :3] @ R_VEHICLE_CAMERA
        rig[name] = (cam, T)
    return rig


def _log_name(seed: int) -> str:
    return f"synth-street-seed{seed}"


def _options_note(options: SynthOptions) -> str:
    return "options: " + json.dumps(options.to_dict(), sort_keys=True)


def made_by(log, seed: int, options: SynthOptions) -> bool:
    """Whether a loaded log is the synthetic street of this seed and these options."""
    return log.source == "gsim.scenes.synth" and log.name == _log_name(seed) and _options_note(options) in log.notes


def reuse_or_synthesize(out_dir, seed: int = 0, options: SynthOptions = SynthOptions(),
                        progress: bool = True) -> Tuple[Path, bool]:
    """(the log at ``out_dir``, whether it was already there): a log of this seed and these options is kept, anything
    else there is replaced by a fresh `synthesize`."""
    try:
        if made_by(load_log(out_dir), seed, options):
            return Path(out_dir), True
    except LogFormatError:
        pass
    return synthesize(out_dir, seed, options, progress), False


def synthesize(out_dir, seed: int = 0, options: SynthOptions = SynthOptions(), progress: bool = True) -> Path:
    """Write the synthetic street of ``seed`` as a gsim driving log at ``out_dir`` (atomically; an existing
    log there is replaced) and return its path. Same seed and options, same bytes."""
    from tqdm import tqdm
    if not isinstance(options, SynthOptions):
        raise InputError(f"options: expected SynthOptions, got {type(options).__name__}")
    street = build_street(seed, options)
    rig, beams = _camera_rig(options), lidar_beams(options)
    frame_times = np.arange(options.n_frames, dtype=np.int64) * FRAME_PERIOD_US
    end = int(frame_times[-1]) + FRAME_PERIOD_US  # the last sweep ends here
    with LogWriter(out_dir, name=_log_name(seed), source="gsim.scenes.synth") as w:
        w.notes += [f"synthetic: procedural street generated by gsim.scenes.synth, seed {seed}",
                    f"renderer: analytic ray caster (exact ray-primitive intersection, {options.supersample}x"
                    f"{options.supersample} box-filtered samples per pixel, Lambertian sun and sky ambient), "
                    "not Gaussian splatting; depth maps, LiDAR, ego poses and actor tracks are exact",
                    _options_note(options)]
        for name, (cam, T) in rig.items():
            w.add_camera(name, cam, T)
        w.add_lidar("top", T_VEHICLE_LIDAR, beams)
        ego_times = np.arange(0, end + 1, EGO_POSE_PERIOD_US)
        for t, T in zip(ego_times, street.ego.poses(ego_times)):
            w.add_ego_pose(t, T)
        track_times = np.append(frame_times, end)
        track = street.car_poses(track_times)
        for a, aid in enumerate(street.car_ids if options.tracks else ()):
            size = tuple(_table(street.cars)[a, C_L:C_H + 1])
            w.add_actor(ActorTrack(aid, "car", size, track_times, track[:, a]))
        for i in tqdm(range(options.n_frames), desc="synth", unit="frame", disable=not progress):
            t = int(frame_times[i])
            T_world_vehicle = street.ego.poses([t])[0]
            cams = {}
            for name, (cam, T) in rig.items():
                rgb, depth = render_camera(street, cam, T_world_vehicle @ T, t, options.supersample)
                cams[name] = w.image(name, i, t, rgb=rgb, depth=depth)
            w.add_frame(t, cams, {"top": w.sweep("top", i, t, lidar_sweep(street, T_VEHICLE_LIDAR, beams, t))})
    return Path(out_dir)
