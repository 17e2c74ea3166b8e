"""The built-in starter assets, made by code (no download): sedan, SUV, truck, bus, pedestrian, cyclist,
traffic cone, barrier.

Each is a handful of convex trimesh parts (hulls, boxes, cylinders, spheres, tori) with colours and
LiDAR reflectances, sampled into surfels by `gsim.editing.mesh` like any mesh asset. Samples of one
part inside another are dropped (nobody sees them). The colours carry baked shading (a sky light
from above and darker undersides), as a reconstruction's do, so shapes read in a render.
Box frame: x forward, y left, z up, origin at the centre of the bottom face.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

import numpy as np
from gsim.errors import NotFound

from .mesh import sample_mesh, surfels_from_samples

GLASS = (0.10, 0.12, 0.15)
TYRE = (0.05, 0.05, 0.05)
RIM = (0.55, 0.55, 0.57)
HEADLIGHT = (0.95, 0.93, 0.85)
TAILLIGHT = (0.70, 0.04, 0.04)
PLATE = (0.92, 0.92, 0.90)
# KITTI-style reflectances in [0, 1]: paint is middling, glass and rubber are dark, plates and cones'
# bands are retro-reflective
R_PAINT, R_GLASS, R_TYRE, R_LIGHT, R_RETRO, R_CLOTH = 0.25, 0.05, 0.05, 0.5, 0.9, 0.3

Colour = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (points, normals) -> (N,3) RGB


@dataclass
class Part:
    mesh: object  # a convex trimesh.Trimesh
    rgb: object  # an RGB triple or a Colour function
    reflectance: float = R_PAINT


def _hull(points) -> object:
    import trimesh
    return trimesh.convex.convex_hull(np.asarray(points, float))


def _box(lo, hi) -> object:
    import trimesh
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    return trimesh.creation.box(extents=hi - lo, transform=_translate((lo + hi) / 2))


def _translate(t) -> np.ndarray:
    T = np.eye(4)
    T[:3, 3] = t
    return T


def _cylinder(radius, a, b, sections=24) -> object:
    import trimesh
    return trimesh.creation.cylinder(radius=radius, segment=np.array([a, b], float), sections=sections)


def _sphere(radius, centre) -> object:
    import trimesh
    m = trimesh.creation.icosphere(subdivisions=2, radius=radius)
    m.apply_translation(centre)
    return m


def _prism(profile_xz, half_width, bottom_inset: float = 0.0) -> object:
    """A convex profile in the x-z plane extruded across y (+-half_width), narrowing linearly by
    ``bottom_inset`` towards its lowest point (a car's sides tuck in above the wheels)."""
    p = np.asarray(profile_xz, float)
    z0, z1 = p[:, 1].min(), p[:, 1].max()
    return _hull([(x, s * (half_width - bottom_inset * (z1 - z) / (z1 - z0)), z) for x, z in p for s in (-1, 1)])


def _wheel(x, y, radius, width) -> List[Part]:
    """A tyre (a cylinder along y) whose outer disc shows a rim."""
    side = np.sign(y)

    def colour(p, n):
        r = np.hypot(p[:, 0] - x, p[:, 2] - radius)
        rim = (np.abs(n[:, 1]) > 0.9) & (r < 0.62 * radius) & (p[:, 1] * side > abs(y))
        return np.where(rim[:, None], RIM, TYRE)

    return [Part(_cylinder(radius, (x, y - width / 2, radius), (x, y + width / 2, radius)), colour, R_TYRE)]


def _car(length, width, height, belt, hood, paint, hatch: bool) -> List[Part]:
    """A car: a rounded lower body up to the belt line, a glass cabin with pillars, wheels, lights, plates."""
    L, W, H = length / 2, width / 2, height
    clear = 0.18
    body = _prism([(L, clear + 0.12), (L, hood - 0.12), (L - 0.2, hood), (0.25 * L, belt), (-0.8 * L, belt + 0.03),
                   (-L, belt - (0.25 if hatch else 0.05)), (-L, clear + 0.15), (-0.9 * L, clear), (0.9 * L, clear)],
                  W, bottom_inset=0.14)
    roof_front, roof_rear = (0.0, -0.75 * L) if hatch else (0.05 * L, -0.45 * L)
    cabin_rear = -0.95 * L if hatch else -0.72 * L
    cabin = _hull([(x, s * hw, z) for s in (-1, 1) for x, z, hw in
                   ((0.45 * L, belt - 0.02, W - 0.08), (cabin_rear, belt - 0.02, W - 0.08),
                    (roof_front, H, W - 0.2), (roof_rear, H, W - 0.2))])
    b_pillar = 0.5 * (roof_front + roof_rear) - 0.05 * L

    def cabin_colour(p, n):
        body_part = ((n[:, 2] > 0.9) | ((np.abs(n[:, 1]) > 0.6) & (np.abs(p[:, 0] - b_pillar) < 0.06))
                     | ((np.abs(n[:, 0]) > 0.3) & (np.abs(p[:, 1]) > W - 0.3)) | (p[:, 2] > H - 0.05))
        return np.where(body_part[:, None], paint, GLASS)

    r = 0.33 if height < 1.6 else 0.37
    parts = [Part(body, paint), Part(cabin, cabin_colour, R_GLASS)]
    for x in (0.62 * L, -0.62 * L):
        for y in (W - 0.13, -(W - 0.13)):
            parts += _wheel(x, y, r, 0.22)
    for s in (-1, 1):
        parts.append(Part(_box((L - 0.1, s * (W - 0.15) - 0.15, hood - 0.22), (L + 0.02, s * (W - 0.15) + 0.15,
                                                                                 hood - 0.08)), HEADLIGHT, R_LIGHT))
        parts.append(Part(_box((-L - 0.02, s * (W - 0.12) - 0.14, belt - 0.2), (-L + 0.1, s * (W - 0.12) + 0.14,
                                                                                 belt - 0.06)), TAILLIGHT, R_LIGHT))
        parts.append(Part(_box((0.4 * L - 0.1, s * W - 0.08, belt + 0.05), (0.4 * L + 0.05, s * W + 0.08,
                                                                             belt + 0.2)), paint))  # mirrors
    parts.append(Part(_box((L - 0.05, -0.26, clear + 0.2), (L + 0.03, 0.26, clear + 0.32)), PLATE, R_RETRO))
    parts.append(Part(_box((-L - 0.03, -0.26, clear + 0.35), (-L + 0.05, 0.26, clear + 0.47)), PLATE, R_RETRO))
    parts.append(Part(_box((L - 0.05, -0.4, hood - 0.3), (L + 0.01, 0.4, hood - 0.12)), (0.08, 0.08, 0.08)))
    return parts


def _truck(paint) -> List[Part]:
    """A box truck: a cab with a windscreen, a cargo box, a chassis, six wheels."""
    cab_x0, cab_x1, W = 2.1, 3.9, 1.25

    def cab_colour(p, n):
        screen = (n[:, 0] > 0.5) & (p[:, 2] > 1.75) & (p[:, 2] < 2.75) & (np.abs(p[:, 1]) < W - 0.12)
        side = (np.abs(n[:, 1]) > 0.9) & (p[:, 2] > 1.8) & (p[:, 2] < 2.6) & (p[:, 0] > cab_x0 + 0.9)
        return np.where((screen | side)[:, None], GLASS, paint)

    parts = [Part(_prism([(cab_x0, 0.55), (cab_x1, 0.55), (cab_x1, 2.4), (cab_x1 - 0.25, 2.95), (cab_x0, 2.95)], W),
                  cab_colour),
             Part(_box((-3.95, -W, 0.95), (cab_x0 - 0.1, W, 3.5)), (0.86, 0.86, 0.84)),
             Part(_box((-3.8, -0.5, 0.5), (cab_x1 - 0.2, 0.5, 0.95)), (0.12, 0.12, 0.12)),
             Part(_box((cab_x1 - 0.05, -W, 0.45), (cab_x1 + 0.08, W, 0.75)), (0.15, 0.15, 0.15))]
    for x in (3.0, -1.9, -3.05):
        for y in (W - 0.18, -(W - 0.18)):
            parts += _wheel(x, y, 0.5, 0.3)
    for s in (-1, 1):
        parts.append(Part(_box((cab_x1, s * 0.95 - 0.15, 0.8), (cab_x1 + 0.1, s * 0.95 + 0.15, 0.95)), HEADLIGHT,
                          R_LIGHT))
        parts.append(Part(_box((-4.0, s * 1.0 - 0.12, 1.0), (-3.9, s * 1.0 + 0.12, 1.2)), TAILLIGHT, R_LIGHT))
    return parts


def _bus(paint) -> List[Part]:
    """A city bus: a long body with a band of windows and pillars, a tall windscreen, four wheels."""
    L, W, H = 6.0, 1.27, 3.1

    def colour(p, n):
        band = (p[:, 2] > 1.25) & (p[:, 2] < 2.55)
        side = (np.abs(n[:, 1]) > 0.9) & band & (np.mod(p[:, 0] + L, 1.4) > 0.15) & (p[:, 0] < L - 0.2)
        screen = (n[:, 0] > 0.5) & (p[:, 2] > 0.95) & (p[:, 2] < 2.85) & (np.abs(p[:, 1]) < W - 0.08)
        rear = (n[:, 0] < -0.5) & band & (np.abs(p[:, 1]) < W - 0.25)
        return np.where((side | screen | rear)[:, None], GLASS, paint)

    parts = [Part(_prism([(-L, 0.3), (L - 0.1, 0.3), (L, 0.5), (L, H - 0.15), (L - 0.15, H), (-L + 0.1, H),
                          (-L, H - 0.15)], W), colour)]
    for x in (L - 2.6, -L + 3.0):
        for y in (W - 0.15, -(W - 0.15)):
            parts += _wheel(x, y, 0.5, 0.3)
    for s in (-1, 1):
        parts.append(Part(_box((L - 0.05, s * 1.0 - 0.15, 0.55), (L + 0.04, s * 1.0 + 0.15, 0.75)), HEADLIGHT,
                          R_LIGHT))
        parts.append(Part(_box((-L - 0.04, s * 1.05 - 0.1, 0.6), (-L + 0.05, s * 1.05 + 0.1, 1.0)), TAILLIGHT,
                          R_LIGHT))
    return parts


SKIN, HAIR = (0.80, 0.62, 0.50), (0.15, 0.10, 0.07)


def _person(shirt, trousers, x0=0.0, seated: bool = False) -> List[Part]:
    """A person standing (legs apart in a stride, arms hanging) or seated on a bicycle (``seated``),
    facing +x, centred at x0."""
    parts = []
    if seated:
        hip = np.array([x0 - 0.25, 0.0, 1.0])
        shoulder_c = hip + np.array([0.3, 0.0, 0.5])  # leaning forward to the handlebar
        for s, foot in ((1, (x0 + 0.1, 0.12, 0.35)), (-1, (x0 - 0.15, -0.12, 0.2))):
            knee = np.array([x0 + 0.05, s * 0.12, 0.75])
            parts.append(Part(_cylinder(0.065, hip + (0, s * 0.1, 0), knee), trousers, R_CLOTH))
            parts.append(Part(_cylinder(0.055, knee, foot), trousers, R_CLOTH))
        hands = [np.array([x0 + 0.35, s * 0.25, 1.1]) for s in (1, -1)]
    else:
        hip = np.array([x0, 0.0, 0.9])
        shoulder_c = hip + np.array([0.0, 0.0, 0.52])
        for s, dx in ((1, 0.14), (-1, -0.12)):
            foot = np.array([x0 + dx, s * 0.1, 0.06])
            parts.append(Part(_cylinder(0.075, hip + (0, s * 0.1, 0.02), foot), trousers, R_CLOTH))
            parts.append(Part(_box(foot + (-0.06, -0.05, -0.06), foot + (0.16, 0.05, 0.02)), (0.1, 0.1, 0.1),
                              R_CLOTH))
        hands = [np.array([x0 - 0.1 * s, s * 0.26, 0.88]) for s in (1, -1)]
    parts.append(Part(_hull([hip + (dx, dy, 0) for dx in (-0.11, 0.11) for dy in (-0.17, 0.17)]
                            + [shoulder_c + (dx, dy, 0) for dx in (-0.12, 0.12) for dy in (-0.22, 0.22)]),
                      shirt, R_CLOTH))
    for s, hand in zip((1, -1), hands):
        sh = shoulder_c + (0, s * 0.22, -0.05)
        parts.append(Part(_cylinder(0.05, sh, hand), shirt, R_CLOTH))
        parts.append(Part(_sphere(0.045, hand), SKIN, R_CLOTH))
    head = shoulder_c + (0.02, 0, 0.2)
    parts.append(Part(_cylinder(0.045, shoulder_c, head), SKIN, R_CLOTH))
    parts.append(Part(_sphere(0.11, head + (0, 0, 0.05)),
                      lambda p, n: np.where((p[:, 2] > head[2] + 0.08)[:, None] | (n[:, 0] < -0.3)[:, None], HAIR,
                                            SKIN), R_CLOTH))
    return parts


def _bicycle(frame_rgb) -> List[Part]:
    import trimesh
    parts = []
    for x in (0.52, -0.52):
        t = trimesh.creation.torus(major_radius=0.31, minor_radius=0.025, major_sections=40, minor_sections=8)
        t.apply_transform(np.array([[1, 0, 0, x], [0, 0, -1, 0], [0, 1, 0, 0.34], [0, 0, 0, 1]], float))
        parts.append(Part(t, TYRE, R_TYRE))
    crank, seat, head = np.array([0.0, 0, 0.3]), np.array([-0.2, 0, 0.95]), np.array([0.38, 0, 0.9])
    for a, b in ((crank, seat), (crank, head), (seat, head - (0.05, 0, 0.1)), ((-0.52, 0, 0.34), crank),
                 ((-0.52, 0, 0.34), seat), ((0.52, 0, 0.34), head)):
        parts.append(Part(_cylinder(0.02, a, b, sections=10), frame_rgb, R_PAINT))
    parts.append(Part(_cylinder(0.018, head + (0, -0.28, 0.15), head + (0, 0.28, 0.15), sections=10), TYRE))
    return parts


def _cone() -> List[Part]:
    import trimesh
    orange, white = (0.95, 0.35, 0.05), (0.95, 0.95, 0.95)
    cone = trimesh.creation.cone(radius=0.15, height=0.68, sections=32)
    cone.apply_translation((0, 0, 0.03))

    def colour(p, n):
        band = ((p[:, 2] > 0.3) & (p[:, 2] < 0.42)) | ((p[:, 2] > 0.5) & (p[:, 2] < 0.56))
        return np.where(band[:, None], white, orange)

    return [Part(cone, colour, R_RETRO), Part(_box((-0.2, -0.2, 0.0), (0.2, 0.2, 0.03)), (0.08, 0.08, 0.08))]


def _barrier() -> List[Part]:
    """A concrete jersey barrier with red and white reflective stripes."""
    profile = [(0.3, 0.0), (0.3, 0.08), (0.12, 0.33), (0.1, 0.8), (-0.1, 0.8), (-0.12, 0.33), (-0.3, 0.08),
               (-0.3, 0.0)]
    body = _hull([(s * 1.0, y, z) for y, z in profile for s in (-1, 1)])

    def colour(p, n):
        stripe = (p[:, 2] > 0.55) & (p[:, 2] < 0.7)
        red = np.mod(p[:, 0] + 1.0, 0.5) < 0.25
        rgb = np.where(stripe[:, None], np.where(red[:, None], (0.8, 0.08, 0.06), (0.95, 0.95, 0.95)),
                       (0.68, 0.67, 0.64))
        return rgb

    return [Part(body, colour, 0.35)]


# id: (category, builder, surfel spacing m: a few pixels at street distances, about a reconstructed actor's
# surfel count, so that twenty inserted actors cost a frame little)
STARTER: Dict[str, Tuple[str, Callable[[], List[Part]], float]] = {
    "sedan": ("car", lambda: _car(4.6, 1.8, 1.45, 0.88, 0.78, (0.55, 0.06, 0.06), hatch=False), 0.05),
    "suv": ("car", lambda: _car(4.7, 1.9, 1.75, 1.05, 0.98, (0.20, 0.24, 0.30), hatch=True), 0.05),
    "truck": ("truck", lambda: _truck((0.1, 0.25, 0.55)), 0.08),
    "bus": ("bus", lambda: _bus((0.9, 0.75, 0.1)), 0.08),
    "pedestrian": ("pedestrian", lambda: _person((0.15, 0.45, 0.25), (0.15, 0.18, 0.32)), 0.02),
    "cyclist": ("cyclist", lambda: _bicycle((0.1, 0.3, 0.7)) + _person((0.8, 0.2, 0.1), (0.1, 0.1, 0.12),
                                                                      seated=True), 0.02),
    "cone": ("cone", _cone, 0.02),
    "barrier": ("barrier", _barrier, 0.05),
}


def _inside_any(points: np.ndarray, parts: List[Part], skip: int) -> np.ndarray:
    """Points strictly inside a convex part other than ``skip`` (its faces' half-spaces)."""
    out = np.zeros(len(points), bool)
    for k, part in enumerate(parts):
        if k == skip:
            continue
        m = part.mesh
        lo, hi = m.bounds
        cand = np.nonzero(np.all((points > lo) & (points < hi), axis=1))[0]
        if len(cand) == 0:
            continue
        d = (points[cand, None, :] - m.triangles[None, :, 0, :]) * m.face_normals[None]
        out[cand[np.all(d.sum(-1) < -1e-3, axis=1)]] = True
    return out


def _shade(rgb: np.ndarray, points: np.ndarray, normals: np.ndarray, height: float) -> np.ndarray:
    """Baked light: a sky from above (Lambert on a broad source) and darker low parts."""
    sky = 0.62 + 0.38 * (0.5 + 0.5 * normals[:, 2])
    low = 0.8 + 0.2 * np.clip(points[:, 2] / max(0.5 * height, 1e-3), 0, 1)
    return np.clip(rgb * (sky * low)[:, None], 0, 1)


def build(asset_id: str, seed: int = 0):
    """The starter asset ``asset_id`` as (category, surfels in its box frame, (l, w, h) m, reflectance (N,))."""
    if asset_id not in STARTER:
        raise NotFound(f"no built-in asset {asset_id!r}; the starter set has {sorted(STARTER)}")
    category, parts_fn, spacing = STARTER[asset_id]
    parts = parts_fn()
    pts, nrm, rgb, refl = [], [], [], []
    for k, part in enumerate(parts):
        p, n, _ = sample_mesh(part.mesh, spacing, seed + k)
        keep = ~_inside_any(p, parts, k)
        p, n = p[keep], n[keep]
        c = part.rgb(p, n) if callable(part.rgb) else np.broadcast_to(np.asarray(part.rgb, float), p.shape)
        pts.append(p)
        nrm.append(n)
        rgb.append(np.asarray(c, float))
        refl.append(np.full(len(p), part.reflectance))
    p, n, c = np.concatenate(pts), np.concatenate(nrm), np.concatenate(rgb)
    lo, hi = p.min(0), p.max(0)
    size = (float(hi[0] - lo[0]), float(hi[1] - lo[1]), float(hi[2]))
    rng = np.random.default_rng(seed)
    c = _shade(c, p, n, size[2]) * rng.uniform(0.96, 1.04, (len(p), 1))  # a little grain, like a real surface
    surfels = surfels_from_samples(p, n, np.clip(c, 0, 1), spacing, seed=seed)
    return category, surfels, size, np.concatenate(refl).astype(np.float32)
