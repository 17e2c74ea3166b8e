"""Scene edits: insert an asset with a track, remove an actor, move actors. Each is a pure function
``Scene -> Scene`` that leaves its input untouched.

Insertion puts the asset on the scene's own ground (the lowest layer of upward-facing background
surfels under its footprint, a fitted plane gives the height and the tilt), brings its colours to
the scene's exposure and colour balance (grey-world statistics of the background), gives it a soft
contact shadow (dark translucent surfels on the ground, moving with it) and LiDAR features (each
surfel takes the features of a background surfel whose decoded intensity matches its reflectance),
and refuses a placement whose box overlaps another actor at any time.

Removal drops the actor, the background surfels left inside its boxes (a reconstruction bakes some
of an actor into the background), and fills the ground it always covered (never seen) from the
ring of ground around it: the plane continues, colours and features are copied from the ring.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence, Tuple

import numpy as np

from gsim.boxes import footprint, overlap
from gsim.errors import InputError, check_name
from gsim.scene import Actor, Scene
from gsim.surfels import Surfels, rgb_to_sh, sh_to_rgb
from gsim.transforms import quat_to_rotmat, rotmat_to_quat

UP_COS = 0.8  # a surfel whose normal is within ~37 degrees of vertical may be ground
GROUND_LAYER_M = 0.3  # the ground is the lowest layer: surfels this far above its low percentile
MIN_GROUND_SURFELS = 8
GROUND_MARGIN_M = 0.5  # the ground is fitted under the footprint grown by this much (small assets)
GROUND_TOLERANCE_M = 0.3  # a box bottom this far from the ground sinks into it or floats
REFERENCE_LUMA = 0.42  # the starter assets' median luminance (neutral daylight)
DEFAULT_REFLECTANCE = 0.2


class EditError(InputError):
    """An edit that cannot be made as asked (overlaps, no ground, unknown actor): the message says why."""


def _normals(s: Surfels) -> np.ndarray:
    return quat_to_rotmat(np.asarray(s.quats, np.float64))[:, :, 2]


class Ground:
    """The scene's ground: the upward-facing background surfels, queried under footprints."""

    def __init__(self, background: Surfels):
        s = background.numpy()
        n = _normals(s) if len(s) else np.zeros((0, 3))
        up = np.abs(n[:, 2]) > UP_COS
        self.index = np.nonzero(up)[0]
        self.xyz = s.means[up].astype(np.float64)
        # sorted by x: a footprint's candidates are one slice (a closed loop places every vehicle every step)
        self.by_x = np.argsort(self.xyz[:, 0], kind="stable")
        self.x_sorted = self.xyz[self.by_x, 0]

    def under(self, rect: np.ndarray) -> np.ndarray:
        """Indices (into self.xyz) of ground surfels inside a convex xy polygon (K,2), lowest layer only."""
        lo, hi = rect.min(0), rect.max(0)
        span = self.by_x[np.searchsorted(self.x_sorted, lo[0]):np.searchsorted(self.x_sorted, hi[0], side="right")]
        cand = np.sort(span[(self.xyz[span, 1] >= lo[1]) & (self.xyz[span, 1] <= hi[1])])
        p = self.xyz[cand, :2]
        inside = np.ones(len(cand), bool)
        for i in range(len(rect)):
            a, b = rect[i], rect[(i + 1) % len(rect)]
            inside &= (b[0] - a[0]) * (p[:, 1] - a[1]) - (b[1] - a[1]) * (p[:, 0] - a[0]) >= 0
        cand = cand[inside]
        if len(cand) == 0:
            return cand
        z = self.xyz[cand, 2]
        return cand[z <= np.percentile(z, 10) + GROUND_LAYER_M]

    def plane(self, rect: np.ndarray, what: str) -> np.ndarray:
        """(a, b, c) of z = a x + b y + c fitted to the ground inside ``rect`` (one pass of outlier removal)."""
        idx = self.under(rect)
        if len(idx) < MIN_GROUND_SURFELS:
            raise EditError(f"{what}: {len(idx)} ground surfels under the footprint (need {MIN_GROUND_SURFELS}); "
                            f"the scene has no ground there (place it with on_ground=False)")
        p = self.xyz[idx]
        A = np.c_[p[:, :2], np.ones(len(p))]
        coef = np.linalg.lstsq(A, p[:, 2], rcond=None)[0]
        ok = np.abs(A @ coef - p[:, 2]) < 0.1
        if ok.sum() >= MIN_GROUND_SURFELS:
            coef = np.linalg.lstsq(A[ok], p[ok, 2], rcond=None)[0]
        return coef


def _box_centre(T_bottom: np.ndarray, height: float) -> np.ndarray:
    """The box-centre pose of an asset frame (origin on the bottom face)."""
    T = T_bottom.copy()
    T[:3, 3] += T[:3, 2] * height / 2
    return T


def on_plane(T: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """``T`` (an asset's bottom-centre pose) moved onto the plane z = a x + b y + c: its heading kept,
    z and tilt from the plane."""
    n = np.array([-coef[0], -coef[1], 1.0])
    n /= np.linalg.norm(n)
    fwd = T[:3, 0] - n * (T[:3, 0] @ n)
    if np.linalg.norm(fwd) < 1e-6:
        raise EditError("a pose's x axis points straight up; give a heading in the ground plane")
    fwd /= np.linalg.norm(fwd)
    out = np.eye(4)
    out[:3, 0], out[:3, 1], out[:3, 2] = fwd, np.cross(n, fwd), n
    x, y = T[0, 3], T[1, 3]
    out[:3, 3] = (x, y, coef[0] * x + coef[1] * y + coef[2])
    return out


def lidar_features(scene: Scene, reflectance: np.ndarray) -> Optional[np.ndarray]:
    """(N,F) features of ``scene``'s LiDAR head for surfels of the given reflectances: each takes those of
    a background surfel whose decoded intensity (at 15 m, 35 degrees incidence) is nearest. None when the
    scene's surfels carry no features; zeros when it has features but no head to decode them."""
    bg = scene.background.numpy()
    if bg.features is None:
        return None
    if scene.lidar_head is None or len(bg) == 0:
        return np.zeros((len(reflectance), bg.features.shape[1]), np.float32)
    from .sources import nominal_intensity
    pick = np.random.default_rng(0).choice(len(bg), min(len(bg), 20000), replace=False)
    f = bg.features[pick].astype(np.float32)
    intensity = nominal_intensity(scene.lidar_head, f)
    order = np.argsort(intensity)
    k = np.clip(np.searchsorted(intensity[order], reflectance), 0, len(order) - 1)
    return f[order[k]]


def harmonize(rgb: np.ndarray, scene: Scene) -> np.ndarray:
    """Asset colours (N,3) brought to the scene's exposure and colour balance: per-channel gains of the
    background's median colour over its median luminance (white balance, clipped to [0.7, 1.4]) times the
    background's median luminance over the assets' reference (exposure, clipped to [0.5, 1.5])."""
    bg = scene.background.numpy()
    if len(bg) == 0:
        return rgb
    c = np.clip(sh_to_rgb(bg.colors[:, 0, :].astype(np.float64)), 0, 1)
    luma = c @ np.array([0.299, 0.587, 0.114])
    med = np.median(c, axis=0)
    wb = np.clip(med / max(float(np.median(luma)), 1e-3), 0.7, 1.4)
    exposure = np.clip(float(np.median(luma)) / REFERENCE_LUMA, 0.5, 1.5)
    return np.clip(rgb * wb * exposure, 0, 1)


def contact_shadow(size: Tuple[float, float, float], spacing_m: float = 0.08, strength: float = 0.55) -> Surfels:
    """Dark translucent surfels 2 cm above the ground under a box (asset frame): opacity ``strength``
    under the footprint, fading to zero 0.4 m beyond it."""
    l, w, _ = size
    fade = 0.4
    xs = np.arange(-l / 2 - fade, l / 2 + fade + 1e-9, spacing_m)
    ys = np.arange(-w / 2 - fade, w / 2 + fade + 1e-9, spacing_m)
    X, Y = np.meshgrid(xs, ys, indexing="ij")
    dx = np.maximum(np.abs(X) - l / 2, 0)
    dy = np.maximum(np.abs(Y) - w / 2, 0)
    t = np.clip(1 - np.hypot(dx, dy) / fade, 0, 1)
    op = (strength * t * t * (3 - 2 * t)).ravel()  # smoothstep
    keep = op > 0.01
    m = int(keep.sum())
    means = np.c_[X.ravel()[keep], Y.ravel()[keep], np.full(m, 0.02)]
    return Surfels(means=means.astype(np.float32), quats=np.tile(np.float32([1, 0, 0, 0]), (m, 1)),
                   scales=np.full((m, 2), 0.8 * spacing_m, np.float32), opacities=op[keep].astype(np.float32),
                   colors=rgb_to_sh(np.full((m, 1, 3), 0.02)).astype(np.float32))


def spacing(s: Surfels) -> float:
    """The mean spacing (m) of surfels scattered at random on a surface, 1 / sqrt(density): 2.13 x the
    median distance to the nearest neighbour (a 2D Poisson sample's median is sqrt(ln 2 / pi) / sqrt(density))."""
    from scipy.spatial import cKDTree
    m = np.asarray(s.means, np.float64)
    return 2.13 * float(np.median(cKDTree(m).query(m, 2)[0][:, 1])) if len(m) > 1 else 0.05


def _actor_surfels(scene: Scene, asset, harmonized: bool, shadow: bool) -> Tuple[Surfels, int]:
    """The asset's surfels for ``scene`` (harmonized colours, LiDAR features) and the contact shadow's
    surfels after them, each in random order (so that a prefix is a level of detail, `Actor.detail`);
    returns (surfels, shadow count)."""
    rng = np.random.default_rng(0)
    order = rng.permutation(len(asset.surfels))
    s = asset.surfels.numpy().subset(order)
    dc = sh_to_rgb(s.colors[:, 0, :].astype(np.float64))
    if harmonized:
        dc = harmonize(dc, scene)
    colors = s.colors.copy()
    colors[:, 0, :] = rgb_to_sh(dc)
    refl = asset.reflectance[order] if asset.reflectance is not None else np.full(len(s), DEFAULT_REFLECTANCE,
                                                                                   np.float32)
    parts = [Surfels.derived(s.means, s.quats, s.scales, s.opacities, colors.astype(np.float32))]
    if shadow:
        sh = contact_shadow(asset.size)
        sh = sh.subset(rng.permutation(len(sh)))
        parts.append(sh)
        refl = np.r_[refl, np.full(len(sh), DEFAULT_REFLECTANCE, np.float32)]
    out = Surfels.concatenate(parts)
    feats = lidar_features(scene, refl)
    return (out if feats is None else replace(out, features=feats)), len(out) - len(s)


def _unique_id(scene: Scene, base: str) -> str:
    taken = {a.id for a in scene.actors}
    base = base[:120]  # room for the suffix within a name's 128 characters
    k = 0
    while f"{base}_{k}" in taken:
        k += 1
    return f"{base}_{k}"


def check_overlaps(actors: Sequence[Actor], new: Sequence[Actor], min_area_m2: float = 0.01) -> None:
    """EditError naming the actors and the time when a box of ``new`` overlaps another actor's box
    (footprints sharing more than ``min_area_m2`` and heights overlapping) at a time both exist."""
    others = list(actors)
    for a in new:
        for b in others:
            if b is a:
                continue
            lo = max(a.track_timestamps_us[0], b.track_timestamps_us[0])
            hi = min(a.track_timestamps_us[-1], b.track_timestamps_us[-1])
            if lo > hi:
                continue
            times = np.union1d(a.track_timestamps_us, b.track_timestamps_us)
            for t in times[(times >= lo) & (times <= hi)]:
                shared, dz = overlap(a.pose_at(int(t)), a.size, b.pose_at(int(t)), b.size)
                if dz > 0 and shared > min_area_m2:
                    raise EditError(f"actor {a.id!r} overlaps actor {b.id!r} at t={int(t)} us "
                                    f"({shared:.2f} m^2 of footprint); move it or allow overlaps")
        others.append(a)


def asset_actor(scene: Scene, asset, actor_id: str, timestamps_us, poses, harmonized: bool = True,
                shadow: bool = True) -> Actor:
    """An actor of ``asset`` made for ``scene`` (harmonized colours, LiDAR features, contact shadow) on a
    track of box-centre poses (T,4,4) at ``timestamps_us`` (T,), as they are: no ground placement, no
    overlap check (`insert_actor` does both). Actors that share an asset can share its surfels:
    ``dataclasses.replace(actor, id=..., track_...=...)``."""
    lift = np.eye(4)  # the surfels live in the box-centre frame like every actor's
    lift[2, 3] = -asset.size[2] / 2
    surfels, n_shadow = _actor_surfels(scene, asset, harmonized, shadow)
    return Actor(id=actor_id, category=asset.category, size=tuple(asset.size), surfels=surfels.transformed(lift),
                 track_timestamps_us=np.asarray(timestamps_us, np.int64), track_poses=np.asarray(poses, np.float64),
                 shadow_surfels=n_shadow, lod_spacing_m=spacing(asset.surfels), closed=asset.closed)


def insert_actor(scene: Scene, asset, timestamps_us, poses, actor_id: Optional[str] = None, on_ground: bool = True,
                 harmonized: bool = True, shadow: bool = True, allow_overlap: bool = False) -> Scene:
    """``scene`` with ``asset`` added as an actor moving along ``poses`` (T,4,4) T_world_actor at
    ``timestamps_us`` (T,), the asset frame's origin being the bottom-face centre of its box.

    ``on_ground``: each pose's height and tilt come from the scene's ground under the footprint (its x-y
    position and heading are kept); without it a box bottom farther than GROUND_TOLERANCE_M from the
    ground there is refused (sinking or floating) unless ``allow_overlap``. The new actor's track holds
    box-centre poses, as every actor's does (`Scene` actors are centred, the asset frame is not)."""
    ts = np.asarray(timestamps_us)
    P = np.asarray(poses, np.float64)
    if ts.ndim != 1 or P.shape != (len(ts), 4, 4):
        raise EditError(f"insert_actor: expected timestamps_us (T,) and poses (T,4,4), got {ts.shape} and {P.shape}")
    aid = _unique_id(scene, asset.id) if actor_id is None else check_name(actor_id, "insert_actor: actor_id")
    if any(a.id == aid for a in scene.actors):
        raise EditError(f"insert_actor: the scene already has an actor {aid!r}")
    ground = Ground(scene.background)
    placed = []
    for i, T in enumerate(P):
        what = f"insert_actor {aid!r} at t={int(ts[i])} us"
        l, w, h = asset.size
        rect = footprint(T, (l + 2 * GROUND_MARGIN_M, w + 2 * GROUND_MARGIN_M, h))
        if on_ground:
            T = on_plane(T, ground.plane(rect, what))
        elif not allow_overlap and len(ground.under(rect)) >= MIN_GROUND_SURFELS:
            c = ground.plane(rect, what)
            gap = T[2, 3] - (c[0] * T[0, 3] + c[1] * T[1, 3] + c[2])
            if abs(gap) > GROUND_TOLERANCE_M:
                raise EditError(f"{what}: its bottom is {gap:+.2f} m from the ground ({'floats' if gap > 0 else 'sinks'}"
                                f"; tolerance {GROUND_TOLERANCE_M} m): use on_ground=True")
        placed.append(_box_centre(T, asset.size[2]))
    actor = asset_actor(scene, asset, aid, ts, np.stack(placed), harmonized, shadow)
    if not allow_overlap:
        check_overlaps(scene.actors, [actor])
    return replace(scene, actors=tuple(scene.actors) + (actor,))


def move_actor(scene: Scene, actor_id: str, shift_m=(0.0, 0.0, 0.0), speed_scale: float = 1.0,
               track: Optional[Tuple[np.ndarray, np.ndarray]] = None, allow_overlap: bool = False) -> Scene:
    """``scene`` with actor ``actor_id`` re-routed: a new ``track`` (timestamps_us (T,), poses (T,4,4) whose
    x-y position and heading are kept, put on the ground like `insert_actor`'s), then every pose shifted by
    ``shift_m`` in the actor's own frame (x forward, y left, z up), then its times from the first one
    divided by ``speed_scale`` (> 1: faster). Refused when the moved box overlaps another actor."""
    ids = [a.id for a in scene.actors]
    if actor_id not in ids:
        raise EditError(f"move_actor: no actor {actor_id!r} in the scene; it has {ids}")
    if not speed_scale > 0:
        raise EditError(f"move_actor: speed_scale must be > 0, got {speed_scale}")
    a = scene.actors[ids.index(actor_id)]
    ts, poses = a.track_timestamps_us, a.track_poses.copy()
    if track is not None:
        ts, new = np.asarray(track[0], np.int64), np.asarray(track[1], np.float64)
        ground = Ground(scene.background)
        l, w, h = a.size
        poses = np.stack([_box_centre(on_plane(P, ground.plane(footprint(P, (l + 1, w + 1, h)),
                                                                f"move_actor {a.id!r} at t={int(t)} us")), h)
                          for t, P in zip(ts, new)])
    poses[:, :3, 3] += np.einsum("nij,j->ni", poses[:, :3, :3], np.asarray(shift_m, float))
    if speed_scale != 1.0:
        ts = ts[0] + np.round((ts - ts[0]) / speed_scale).astype(np.int64)
        keep = np.r_[True, np.diff(ts) > 0]
        ts, poses = ts[keep], poses[keep]
    moved = replace(a, track_timestamps_us=ts, track_poses=poses)
    if not allow_overlap:
        check_overlaps([x for x in scene.actors if x.id != a.id], [moved])
    return replace(scene, actors=tuple(x if x.id != a.id else moved for x in scene.actors))


def _inside_box(points: np.ndarray, T_world_box: np.ndarray, size, margin: float = 0.0) -> np.ndarray:
    local = (points - T_world_box[:3, 3]) @ T_world_box[:3, :3]
    return np.all(np.abs(local) <= np.asarray(size) / 2 + margin, axis=1)


def remove_actor(scene: Scene, actor_id: str, fill: bool = True, fill_spacing_m: float = 0.1) -> Scene:
    """``scene`` without actor ``actor_id``: its surfels go, and so do background surfels inside its boxes
    above the ground (what the reconstruction baked of it); with ``fill`` the ground it always covered is
    filled from the ring around it (see the module docstring)."""
    ids = [a.id for a in scene.actors]
    if actor_id not in ids:
        raise EditError(f"remove_actor: no actor {actor_id!r} in the scene; it has {ids}")
    actor = scene.actors[ids.index(actor_id)]
    bg = scene.background.numpy()
    ground = Ground(bg)
    poses = actor.track_poses
    drop = np.zeros(len(bg), bool)
    means = bg.means.astype(np.float64)
    for T in poses:
        inside = _inside_box(means, T, actor.size, 0.1)
        low = T[:3, 3] - T[:3, 2] * actor.size[2] / 2  # bottom centre
        above = (bg.means[:, 2] - low[2]) > 0.15
        drop |= inside & above
    keep = ~drop
    parts = [bg.subset(keep)]
    if fill:
        patch = _fill_footprints(bg, ground, actor, fill_spacing_m)
        if patch is not None:
            parts.append(patch)
    background = Surfels.concatenate(parts) if len(parts) > 1 else parts[0]
    return replace(scene, background=background, actors=tuple(a for a in scene.actors if a.id != actor_id))


def _fill_footprints(bg: Surfels, ground: Ground, actor: Actor, spacing: float) -> Optional[Surfels]:
    """Ground surfels for the cells of the actor's footprints that hold no ground (never seen), on the
    plane of the ring of ground around them, coloured (and featured) like ring surfels ahead of or behind
    the actor at the same lateral offset."""
    from scipy.spatial import cKDTree
    rects = [footprint(T, actor.size) for T in actor.track_poses]
    allpts = np.concatenate(rects)
    lo, hi = allpts.min(0) - 0.2, allpts.max(0) + 0.2
    xs, ys = np.arange(lo[0], hi[0], spacing), np.arange(lo[1], hi[1], spacing)
    X, Y = np.meshgrid(xs, ys, indexing="ij")
    cells = np.c_[X.ravel(), Y.ravel()]
    covered = np.zeros(len(cells), bool)
    for T in actor.track_poses:
        covered |= _inside_box(np.c_[cells, np.full(len(cells), T[2, 3])], T, (actor.size[0] + 0.2, actor.size[1] + 0.2,
                                                                                 np.inf))
    cells = cells[covered]
    # the ring: ground within 2 m of the footprints (the footprints' own ground, if any, included)
    ring_rect = np.array([[lo[0] - 2, lo[1] - 2], [hi[0] + 2, lo[1] - 2], [hi[0] + 2, hi[1] + 2], [lo[0] - 2, hi[1] + 2]])
    ring = ground.under(ring_rect)
    if len(cells) == 0 or len(ring) < MIN_GROUND_SURFELS:
        return None  # nothing to continue: the hole stays (a scene without ground there)
    ring_tree = cKDTree(ground.xyz[ring, :2])
    gap = float(np.median(ring_tree.query(ground.xyz[ring, :2], 2)[0][:, 1]))  # the ground's own spacing
    has = np.array([len(x) > 0 for x in cKDTree(ground.xyz[:, :2]).query_ball_point(cells, 1.5 * max(spacing, gap))])
    holes = cells[~has]
    if len(holes) == 0:
        return None
    coef = ground.plane(ring_rect, f"remove_actor {actor.id!r}")
    # colours: the ground continues along the actor's length (the kerb, the lane's edge and its markings
    # run past a parked car): each hole copies a random one of the 4 ring surfels outside the footprint
    # nearest in a metric that makes 1 m sideways cost as much as 25 m along (the first pose's frame)
    T0 = actor.track_poses[0]
    to_local = lambda p: (p - T0[:2, 3]) @ T0[:2, :2]  # noqa: E731 (x along the actor, y to its left)
    ring_l = to_local(ground.xyz[ring, :2])
    out = ~np.all(np.abs(ring_l) <= np.asarray(actor.size[:2]) / 2 + 0.1, axis=1)
    if out.sum() < MIN_GROUND_SURFELS:
        out[:] = True
    scale = np.array([0.2, 5.0])
    k = min(4, int(out.sum()))
    _, nn = cKDTree(ring_l[out] * scale).query(to_local(holes) * scale, k)
    nn = np.asarray(nn).reshape(len(holes), k)
    rng = np.random.default_rng(0)
    src = ground.index[ring[np.nonzero(out)[0][nn[np.arange(len(holes)), rng.integers(0, k, len(holes))]]]]
    m = len(holes)
    R = on_plane(np.eye(4), coef)[:3, :3]  # lying on the plane
    z = holes @ coef[:2] + coef[2]
    return Surfels(means=np.c_[holes, z].astype(np.float32), quats=np.tile(rotmat_to_quat(R), (m, 1)).astype(np.float32),
                   scales=np.full((m, 2), 0.7 * spacing, np.float32), opacities=np.full(m, 0.95, np.float32),
                   colors=bg.colors[src].astype(np.float32),
                   features=None if bg.features is None else bg.features[src].astype(np.float32))
