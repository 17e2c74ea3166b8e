"""A hand-built street of surfels and a drive through it (`gsim street`, the benchmarks).

A ground plane (asphalt, lane markings, sidewalks), two textured facades and
scattered objects (parked cars, poles), tiled by overlapping surfels, deterministic
from a seed. (`gsim demo`, the main job, is `gsim.scenes.demo`: a reconstructed log.)
World frame: x along the street, y left, z up (metres).
"""
from __future__ import annotations

import numpy as np

from .cameras import PinholeCamera
from .errors import InputError
from .surfels import Surfels
from .transforms import rotmat_to_quat

STREET_HALF_WIDTH = 10.0  # facades stand at y = +-10 m
STREET_X = (-20.0, 80.0)
FACADE_HEIGHT = 12.0
# OpenCV camera axes in a vehicle frame (x forward, y left, z up): right = -y, down = -z, forward = x
R_VEHICLE_CAMERA = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])


def _patch(origin, u_axis, v_axis, count, rng, color_fn):
    """About ``count`` overlapping surfels tiling the parallelogram origin + [0,1]u + [0,1]v."""
    u_axis, v_axis = np.asarray(u_axis, float), np.asarray(v_axis, float)
    lu, lv = np.linalg.norm(u_axis), np.linalg.norm(v_axis)
    spacing = np.sqrt(lu * lv / max(count, 1))
    nu, nv = max(1, int(round(lu / spacing))), max(1, int(round(lv / spacing)))
    a, b = np.meshgrid((np.arange(nu) + 0.5) / nu, (np.arange(nv) + 0.5) / nv, indexing="ij")
    a = (a.ravel() + rng.uniform(-0.3, 0.3, a.size) / nu).clip(0, 1)
    b = (b.ravel() + rng.uniform(-0.3, 0.3, b.size) / nv).clip(0, 1)
    means = np.asarray(origin, float) + a[:, None] * u_axis + b[:, None] * v_axis
    uh, vh = u_axis / lu, v_axis / lv
    n = np.cross(uh, vh)
    # random in-plane rotation so the tiling shows no grid pattern
    th = rng.uniform(0, np.pi, a.size)
    x = np.cos(th)[:, None] * uh + np.sin(th)[:, None] * vh
    y = np.cross(n, x)
    R = np.stack([x, y, np.broadcast_to(n, x.shape)], axis=2)
    scales = np.stack([np.full(a.size, lu / nu), np.full(a.size, lv / nv)], 1) * rng.uniform(0.55, 0.8, (a.size, 1))
    return means, rotmat_to_quat(R), scales, color_fn(a, b, means)


def _asphalt(a, b, p):
    y = p[:, 1]
    c = np.where(np.abs(y)[:, None] > 7.0, [0.62, 0.6, 0.57], [0.22, 0.22, 0.24])  # sidewalk | road
    dash = (np.abs(y) < 0.12) & (np.mod(p[:, 0], 6.0) < 3.0)
    edge = np.abs(np.abs(y) - 6.7) < 0.1
    c = np.where((dash | edge)[:, None], [0.93, 0.93, 0.9], c)
    return c


def _facade(base):
    def fn(a, b, p):
        x, z = p[:, 0], p[:, 2]
        window = (np.mod(x, 4.0) > 1.2) & (np.mod(x, 4.0) < 2.8) & (np.mod(z, 3.5) > 1.2) & (z > 1.0)
        door = (np.mod(x, 16.0) < 1.6) & (z < 2.4)
        c = np.where(window[:, None], [0.35, 0.45, 0.55], base)
        return np.where(door[:, None], [0.3, 0.2, 0.12], c)
    return fn


def _flat(color):
    return lambda a, b, p: np.broadcast_to(np.asarray(color, float), (len(p), 3))


def street_surfels(n: int = 100_000, seed: int = 0) -> Surfels:
    """Exactly ``n`` surfels (float32) of a street: 45% ground, 35% facades, 20% objects."""
    if n < 100:
        raise InputError(f"street_surfels: n must be at least 100, got {n}")
    rng = np.random.default_rng(seed)
    target, n = n, int(n * 1.03)  # patches round their counts: build a few more, keep a random n
    x0, x1 = STREET_X
    L = x1 - x0
    parts = [_patch([x0, -STREET_HALF_WIDTH, 0], [L, 0, 0], [0, 2 * STREET_HALF_WIDTH, 0], int(0.45 * n), rng, _asphalt)]
    for side, base in ((1, [0.72, 0.55, 0.42]), (-1, [0.78, 0.76, 0.7])):
        y = side * STREET_HALF_WIDTH
        # normal faces the street: u along x, v up for the left facade, reversed for the right
        u = [L, 0, 0] if side > 0 else [-L, 0, 0]
        origin = [x0, y, 0] if side > 0 else [x1, y, 0]
        parts.append(_patch(origin, u, [0, 0, FACADE_HEIGHT], int(0.175 * n), rng, _facade(base)))
    n_obj = n - sum(len(p[0]) for p in parts)
    cars = rng.integers(10, 16)
    per_car = n_obj * 3 // 4 // cars
    for k in range(cars):
        side = 1 if k % 2 else -1
        cx, cy = x0 + 8 + k * (L - 16) / cars + rng.uniform(-1, 1), side * rng.uniform(4.8, 5.6)
        color = rng.uniform(0.1, 0.9, 3)
        lx, ly, lz = 4.4, 1.8, 1.5
        o = np.array([cx - lx / 2, cy - ly / 2, 0.2])
        faces = [(o + [0, 0, lz], [lx, 0, 0], [0, ly, 0]),  # roof
                 (o, [0, ly, 0], [0, 0, lz]), (o + [lx, 0, 0], [0, 0, lz], [0, ly, 0]),  # back, front
                 (o, [0, 0, lz], [lx, 0, 0]), (o + [0, ly, 0], [lx, 0, 0], [0, 0, lz])]  # sides
        for f in faces:
            parts.append(_patch(f[0], f[1], f[2], per_car // 5, rng, _flat(color)))
    poles = rng.integers(8, 12)
    per_pole = max(4, (n - sum(len(p[0]) for p in parts)) // poles)
    for k in range(poles):
        side = 1 if k % 2 else -1
        px, py = x0 + 5 + k * (L - 10) / poles, side * 7.6
        for face in range(4):  # a square pole, 0.25 m wide, 5 m tall
            ang = face * np.pi / 2
            d, e = np.array([np.cos(ang), np.sin(ang), 0]), np.array([-np.sin(ang), np.cos(ang), 0])
            parts.append(_patch([px, py, 0] + 0.125 * (d - e), 0.25 * e, [0, 0, 5.0], per_pole // 4, rng,
                                _flat([0.25, 0.27, 0.25])))
    keep = np.sort(rng.choice(sum(len(p[0]) for p in parts), target, replace=False))
    means, quats, scales, colors = (np.concatenate([p[i] for p in parts])[keep] for i in range(4))
    colors = np.clip(colors + rng.normal(0, 0.03, colors.shape), 0, 1)
    opac = rng.uniform(0.85, 0.99, len(means))
    f = np.float32
    return Surfels(means.astype(f), quats.astype(f), scales.astype(f), opac.astype(f), colors.astype(f))


def demo_camera(width: int = 640, height: int = 360) -> PinholeCamera:
    """A forward camera with a 90 degree horizontal field of view."""
    return PinholeCamera(width, height, width / 2, width / 2, width / 2, height / 2)


def drive_trajectory(n_frames: int = 48, length_m: float = 30.0, lateral_m: float = 1.5,
                     height_m: float = 1.6) -> np.ndarray:
    """(n,4,4) T_world_camera along the street, weaving ``lateral_m`` off the lane centre."""
    T = np.tile(np.eye(4), (n_frames, 1, 1))
    s = np.linspace(0, 1, n_frames)
    x = s * length_m
    y = -3.0 + lateral_m * np.sin(2 * np.pi * s)
    yaw = np.arctan2(np.gradient(y), np.gradient(x))
    for i in range(n_frames):
        c, sn = np.cos(yaw[i]), np.sin(yaw[i])
        R_world_vehicle = np.array([[c, -sn, 0], [sn, c, 0], [0, 0, 1]])
        T[i, :3, :3] = R_world_vehicle @ R_VEHICLE_CAMERA
        T[i, :3, 3] = [x[i], y[i], height_m]
    return T
