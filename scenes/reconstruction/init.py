"""Initial surfels from LiDAR: points coloured by the images, split into background and actors.

Every training sweep is taken to the world (per-point times when the log has them). A
point inside a tracked actor's box at the sweep's time goes to that actor, in its box
frame (actors are rigid, so their points pile up across frames); the rest is background.
Each set is averaged on a voxel grid; a surfel per voxel lies in the plane fitted (PCA)
to the points around it, facing the sensor, with scales from the voxel size. Colours come
from projecting the points into the same frames' images (occluded points get none).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from gsim.cameras import Camera
from gsim.errors import InputError
from gsim.surfels import Surfels, rgb_to_sh
from gsim.transforms import interpolate_poses, rotmat_to_quat, transform_each

from ..log import DrivingLog, Frame
from .sky_mask import SkyPixels
from .views import CLIP_M, Ignored, above_top_beam, ignored_points, sweep_world, top_beam_tan, visible_points

UNSEEN_GRAY = 0.5


@dataclass(frozen=True)
class InitOptions:
    voxel_m: float = 0.1  # background voxel; actors use half of it (they are small and close)
    max_surfels: int = 300_000  # the voxel grows until the background fits
    max_actor_surfels: int = 20_000  # and each actor's (a rigid actor piles up every frame's points)
    opacity: float = 0.5
    box_margin_m: float = 0.15  # points this far outside a box still belong to its actor
    scale_factor: float = 0.6  # surfel sigma = factor * voxel (neighbours overlap)
    sh_degree: int = 0
    above_stride: int = 4  # pixels between the image points seeded above the LiDAR's top beam (0: none)
    above_max_depth_m: float = 60.0  # columns whose highest LiDAR point is farther get none
    unseen_voxel: float = 3.0  # background points no training camera saw: this many voxels (the LiDAR's alone)
    far_range: float = 1.25  # seeds along the empty LiDAR rays at or above the horizon, at this many times the
    # sensor's maximum range, coloured by the cameras: what lies beyond the LiDAR's reach (0: none)
    far_voxel_m: float = 1.0  # their voxel (a pixel there spans half a metre)


@dataclass
class _Points:
    xyz: List[np.ndarray]
    origin: List[np.ndarray]
    rgb: List[np.ndarray]
    seen: List[np.ndarray]


@dataclass(frozen=True, eq=False)
class _Seen:
    """One camera of a frame looking at a sweep's world points: its model, pose, image and the
    points it sees (indices, flat pixels, camera z; see views.visible_points)."""

    camera: Camera
    T_world_camera: np.ndarray
    image: np.ndarray
    idx: np.ndarray
    pix: np.ndarray
    z: np.ndarray
    sky: Optional[np.ndarray] = None  # (H,W) bool: the pixels that see the sky (`sky_mask`), None: not known


def _cameras_seeing(log: DrivingLog, frame: Frame, world: np.ndarray, sky: Optional[SkyPixels] = None) -> List[_Seen]:
    """Each camera of ``frame`` with what it sees of ``world`` (each image decoded once) and its sky pixels."""
    out = []
    for obs in frame.cameras.values():
        cam, T = log.cameras[obs.sensor].camera, log.T_world_camera(obs)
        mask = None if sky is None else sky.full_size(frame.index, obs.sensor, cam.height, cam.width)
        out.append(_Seen(cam, T, log.image(obs), *visible_points(cam, T, world), sky=mask))
    return out


def _above_lidar(seen: Sequence[_Seen], world: np.ndarray, background: np.ndarray, opt: InitOptions,
                 clipped: Optional[np.ndarray] = None):
    """Points for what the cameras see above the LiDAR's top beam (upper facades, tree crowns): in
    column blocks of ``above_stride`` pixels, the pixels above the block's highest visible LiDAR
    point, back-projected at that point's camera depth (exact for a vertical surface seen by a
    level camera). Only where that point is background (``background`` mask) and at most 1 m
    below the camera (a wall, not the ground or a car roof). A block whose highest point is not
    background (an actor, a transient) and not ``clipped`` (near the top beam) hides what is above
    it: it takes the wall depth interpolated from the blocks on either side (a bridge over the car
    ahead). One whose highest point is ``clipped`` may go on above it, as a truck beside the ego does:
    its pixels take that point's depth, for the caller to give to the point's owner (up to its box's
    top). Without ``clipped`` (the beams unknown) non-background blocks get none. Returns (xyz, origin,
    rgb, src), world frame; src: the LiDAR point whose depth each took (-1: interpolated walls)."""
    xyz, origin, rgb, src = [], [], [], []
    for c in seen:
        cam, T, idx, pix, z = c.camera, c.T_world_camera, c.idx, c.pix, c.z
        s, W = opt.above_stride, cam.width
        block, v = pix % W // s, pix // W  # column blocks of s pixels
        top = np.full(W // s + 1, cam.height, np.int64)
        np.minimum.at(top, block, v)
        at_top = v == top[block]
        b_top, i_top, z_top = block[at_top], idx[at_top], z[at_top]  # each block's highest points
        ours = background[i_top]
        wall = ours & (world[i_top, 2] > T[2, 3] - 1.0) & (z_top <= opt.above_max_depth_m)
        depth, from_point = np.zeros(len(top)), np.full(len(top), -1)
        depth[b_top[wall]], from_point[b_top[wall]] = z_top[wall], i_top[wall]
        walls = np.nonzero(depth > 0)[0]
        if len(walls) == 0:
            continue
        if clipped is not None:
            held = ~ours & clipped[i_top]
            depth[b_top[held]], from_point[b_top[held]] = z_top[held], i_top[held]
            hidden = np.setdiff1d(b_top[~ours & ~clipped[i_top]], walls)
            depth[hidden], from_point[hidden] = np.interp(hidden, walls, depth[walls]), -1
        blocks = np.nonzero(depth > 0)[0]
        bb, vv = np.meshgrid(blocks, np.arange(s // 2, cam.height, s))
        sel = vv < top[bb]
        bb, vv = bb[sel], vv[sel]
        uu = np.minimum(bb * s + s // 2, W - 1)
        if c.sky is not None:  # no seeds in the sky: at the wall depth they are a shell that slides over what is far
            clear = ~c.sky[vv, uu]
            bb, vv, uu = bb[clear], vv[clear], uu[clear]
        rays = cam.ray_table()[vv, uu]
        ok = np.isfinite(rays).all(1)
        uu, vv, rays = uu[ok], vv[ok], rays[ok]
        d = depth[bb[ok]][:, None]
        pc = np.concatenate([rays * d, d], 1)
        xyz.append(pc @ T[:3, :3].T + T[:3, 3])
        origin.append(np.broadcast_to(T[:3, 3], (len(pc), 3)))
        rgb.append(c.image[vv, uu])
        src.append(from_point[bb[ok]])
    if not xyz:
        return np.zeros((0, 3)), np.zeros((0, 3)), np.zeros((0, 3), np.float32), np.zeros(0, np.int64)
    return np.concatenate(xyz), np.concatenate(origin), np.concatenate(rgb), np.concatenate(src)


def _colour(seen: Sequence[_Seen], n: int) -> Tuple[np.ndarray, np.ndarray]:
    """(n,3) colours of the points from the first camera that sees each, and which were seen."""
    rgb, was_seen = np.full((n, 3), UNSEEN_GRAY, np.float32), np.zeros(n, bool)
    for c in seen:
        new = ~was_seen[c.idx]
        rgb[c.idx[new]] = c.image.reshape(-1, 3)[c.pix[new]]
        was_seen[c.idx[new]] = True
    return rgb, was_seen


def collect_points(log: DrivingLog, frames: Sequence[Frame], opt: InitOptions, progress: bool = False,
                   ignored: Ignored = {}, sky: Optional[SkyPixels] = None):
    """LiDAR points of ``frames``: background (world) and per actor (box frame), with colours; points in
    ``ignored`` (transients) go nowhere, nor image points seeded above the LiDAR where ``sky`` says sky."""
    bg, far = _Points([], [], [], []), _Points([], [], [], [])
    actors: Dict[str, _Points] = {a.id: _Points([], [], [], []) for a in log.actors}
    it = frames
    if progress:
        from tqdm import tqdm
        it = tqdm(frames, desc="init: lidar", unit="frame")
    for f in it:
        for obs in f.lidars.values():
            world, origin, _, t = sweep_world(log, obs)
            cams = _cameras_seeing(log, f, world, sky)
            rgb, seen = _colour(cams, len(world))
            owner = np.where(ignored_points(ignored, obs, len(world)), -2, -1)  # -1 background, -2 nobody's
            for k, a in enumerate(log.actors):
                inside, local, T_aw = points_in_box(a, world, t, opt.box_margin_m)
                inside &= owner == -1
                if inside.any():
                    _add(actors[a.id], local[inside], transform_each(T_aw[inside], origin[inside]), rgb[inside],
                         seen[inside])
                    owner[inside] = k
            free = owner == -1
            _add(bg, world[free], origin[free], rgb[free], seen[free])
            if opt.above_stride:
                tan = top_beam_tan(log, obs)
                clipped = None if tan is None else above_top_beam(tan, world, origin) > -CLIP_M
                xyz, org, col, src = _above_lidar(cams, world, free, opt, clipped)
                whose = np.where(src >= 0, owner[np.maximum(src, 0)], -1)
                _add(bg, xyz[whose == -1], org[whose == -1], col[whose == -1], np.ones((whose == -1).sum(), bool))
                for k, a in enumerate(log.actors):  # above an actor's clipped top: its own, up to its box's top
                    mine = whose == k
                    if mine.any():
                        inside, local, T_aw = points_in_box(a, xyz[mine], t[src[mine]], opt.box_margin_m)
                        _add(actors[a.id], local[inside], transform_each(T_aw[inside], org[mine][inside]),
                             col[mine][inside], np.ones(inside.sum(), bool))
            if opt.far_range and log.lidars[obs.sensor].beams is not None:
                _add(far, *_beyond_reach(log, obs, cams, opt))
    return bg, far, actors


def _beyond_reach(log: DrivingLog, obs, cams: Sequence[_Seen], opt: InitOptions):
    """Points (xyz, origin, rgb, seen) for what the cameras see along the sweep's empty rays at or above the
    horizon (`SweepRays.free`): nothing is there within the sensor's range, so whatever a camera sees that way
    (a street's far end, hills, the sky near the horizon) lies beyond it; they go at ``opt.far_range`` times the
    range. Rays no camera sees give none. A sky mask does not stop them: beyond the range it cannot tell a uniform
    facade from the sky, and a far shell painted with the sky looks the same from a few metres aside."""
    from .lidar_rays import sweep_rays
    r = sweep_rays(log, obs)
    free = r.free()
    P = r.poses(log)[free]
    origin = P[:, :3, 3]
    xyz = origin + opt.far_range * log.lidars[obs.sensor].beams.max_range_m * np.einsum("nij,nj->ni", P[:, :3, :3],
                                                                                       r.dirs[free])
    seen = [dataclasses.replace(c, idx=idx, pix=pix, z=z)
            for c in cams for idx, pix, z in [visible_points(c.camera, c.T_world_camera, xyz)]]
    rgb, was_seen = _colour(seen, len(xyz))
    return xyz[was_seen], origin[was_seen], rgb[was_seen], np.ones(int(was_seen.sum()), bool)


def _add(p: _Points, xyz, origin, rgb, seen) -> None:
    p.xyz.append(xyz)
    p.origin.append(origin)
    p.rgb.append(rgb)
    p.seen.append(seen)


def points_in_box(a, world: np.ndarray, t: np.ndarray, margin: float):
    """(inside, box-frame points, T_box_world per point) of world points at their own times (a rolling sweep)."""
    times, inv = np.unique(t, return_inverse=True)
    T_aw = np.linalg.inv(interpolate_poses(a.timestamps_us, a.poses, times))[inv]
    local = transform_each(T_aw, world)
    return np.all(np.abs(local) <= np.asarray(a.size) / 2 + margin, axis=1), local, T_aw



def voxel_keys(xyz: np.ndarray, voxel: float) -> np.ndarray:
    """(N,) int64: one key per ``voxel``-sized cell of the points (N,3), equal for points in the same cell."""
    ijk = np.floor(xyz / voxel).astype(np.int64)
    ijk -= ijk.min(0)
    dims = ijk.max(0) + 1
    return (ijk[:, 0] * dims[1] + ijk[:, 1]) * dims[2] + ijk[:, 2]


def _group_mean(keys: np.ndarray, values: np.ndarray, weights=None) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unique keys, inverse, mean of values per key) with optional per-row weights."""
    uniq, inv = np.unique(keys, return_inverse=True)
    w = np.ones(len(keys)) if weights is None else weights.astype(np.float64)
    tot = np.bincount(inv, w, len(uniq))
    mean = np.stack([np.bincount(inv, w * values[:, k], len(uniq)) for k in range(values.shape[1])], 1)
    return uniq, inv, mean / np.maximum(tot, 1e-12)[:, None]


def _normals(xyz: np.ndarray, origin: np.ndarray, voxel: float) -> np.ndarray:
    """Per point: the normal of the plane fitted to the points of its (4x coarser) voxel,
    turned towards the sensor; the sensor direction where the fit is ill-posed."""
    to_sensor = origin - xyz
    to_sensor /= np.maximum(np.linalg.norm(to_sensor, axis=1, keepdims=True), 1e-9)
    _, inv, mean = _group_mean(voxel_keys(xyz, 4 * voxel), xyz)
    d = xyz - mean[inv]
    outer = (d[:, :, None] * d[:, None, :]).reshape(-1, 9)
    cov = np.stack([np.bincount(inv, outer[:, k], len(mean)) for k in range(9)], 1).reshape(-1, 3, 3)
    count = np.bincount(inv, minlength=len(mean))
    evals, evecs = np.linalg.eigh(cov / np.maximum(count, 1)[:, None, None])
    n = evecs[:, :, 0][inv]  # smallest eigenvalue: the plane normal
    flat = (count[inv] >= 5) & (evals[inv, 0] < 0.1 * evals[inv, 1])
    n = np.where(flat[:, None], n, to_sensor)
    return n * np.sign(np.sum(n * to_sensor, axis=1, keepdims=True) + 1e-12)


def frame_from_normal(n: np.ndarray) -> np.ndarray:
    """(N,3,3) rotations whose third column is the unit normal n."""
    helper = np.where(np.abs(n[:, 2:3]) < 0.9, [[0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0]])
    x = np.cross(helper, n)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return np.stack([x, np.cross(n, x), n], 2)


def surfels_from_points(p: _Points, voxel: float, opt: InitOptions) -> Surfels:
    """One surfel per occupied voxel (empty Surfels when there are no points)."""
    k = (opt.sh_degree + 1) ** 2
    if not p.xyz or sum(len(x) for x in p.xyz) == 0:
        return Surfels(np.zeros((0, 3), np.float32), np.zeros((0, 4), np.float32), np.zeros((0, 2), np.float32),
                       np.zeros(0, np.float32), np.zeros((0, k, 3), np.float32))
    xyz, origin = np.concatenate(p.xyz), np.concatenate(p.origin)
    rgb, seen = np.concatenate(p.rgb), np.concatenate(p.seen)
    normal = _normals(xyz, origin, voxel)
    keys = voxel_keys(xyz, voxel)
    _, _, mean_xyz = _group_mean(keys, xyz)
    # sparse regions (far ground between LiDAR rings) get larger surfels: the spacing of the
    # occupied voxels around each one, from their count in its 4x coarser voxel (a surface)
    _, inv, _ = _group_mean(voxel_keys(mean_xyz, 4 * voxel), mean_xyz)
    spacing = 4 * voxel / np.sqrt(np.bincount(inv)[inv])
    sigma = opt.scale_factor * np.clip(spacing, voxel, 4 * voxel)
    _, _, mean_n = _group_mean(keys, normal)
    _, _, mean_rgb = _group_mean(keys, rgb, weights=seen + 1e-3)  # seen colours win
    norm = np.linalg.norm(mean_n, axis=1, keepdims=True)
    mean_n = np.where(norm > 1e-6, mean_n / np.maximum(norm, 1e-12), [[0.0, 0.0, 1.0]])  # opposite normals cancel
    n = len(mean_xyz)
    sh = np.zeros((n, k, 3), np.float32)
    sh[:, 0] = rgb_to_sh(mean_rgb)
    f = np.float32
    return Surfels(mean_xyz.astype(f), rotmat_to_quat(frame_from_normal(mean_n)).astype(f),
                   np.repeat(sigma[:, None], 2, 1).astype(f), np.full(n, opt.opacity, f), sh)


def initial_surfels(log: DrivingLog, frames: Sequence[Frame], opt: InitOptions = InitOptions(),
                    progress: bool = False, ignored: Ignored = {},
                    sky: Optional[SkyPixels] = None) -> Tuple[Surfels, Dict[str, Surfels]]:
    """(background surfels in the world, {actor id: surfels in its box frame}) from the frames' LiDAR,
    leaving out the points in ``ignored`` and seeding none on the views' ``sky`` pixels."""
    if not any(f.lidars for f in frames):
        raise InputError(f"{log.root}: reconstruction needs LiDAR sweeps to initialise surfels; "
                         f"the training frames have none")
    bg, far, actors = collect_points(log, frames, opt, progress, ignored, sky)
    return (Surfels.concatenate([_within(bg, opt.voxel_m, opt.max_surfels, opt, opt.unseen_voxel),
                                 surfels_from_points(far, opt.far_voxel_m, opt)]),
            {aid: _within(p, opt.voxel_m / 2, opt.max_actor_surfels, opt) for aid, p in actors.items()})


def _within(p: _Points, voxel: float, budget: int, opt: InitOptions, unseen: float = 1.0) -> Surfels:
    """Surfels of ``p`` on the finest voxel from ``voxel`` up (x1.25 a step) that gives at most ``budget``;
    points no camera saw on ``unseen`` times that voxel (only the LiDAR renders them: on KITTI half the
    background is behind and beside the ego, and every surfel costs a training step time)."""
    parts = [(p, 1.0)] if unseen == 1.0 else [(_subset(p, True), 1.0), (_subset(p, False), unseen)]
    while True:
        s = Surfels.concatenate([surfels_from_points(q, voxel * f, opt) for q, f in parts])
        if len(s) <= budget:
            return s
        voxel *= 1.25


def _subset(p: _Points, seen: bool) -> _Points:
    """The points a camera saw (``seen``) or the others."""
    keep = [s == seen for s in p.seen]
    return _Points(*([x[k] for x, k in zip(getattr(p, f), keep)] for f in ("xyz", "origin", "rgb", "seen")))
