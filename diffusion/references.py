"""Reference images for repair: the log's real training images warped into a target view (shifted, ahead, or a
held-out one) through a depth (the reconstruction's, or the log's LiDAR), with where each real pixel is valid.

A render off the driven path is blurred or holed where the log saw little; the real images of the nearest
training views often saw the same surfaces, sharp. `warp` moves one of them into the target view by backward
warping: each target pixel's rendered depth places a point, the point is projected into the source camera and the
real image is sampled there, valid only where the source's own (rendered) depth agrees that it saw that point and
not something nearer (occlusion). `nearest_training_views` picks the sources; `references` does both for a
reconstruction and its log, through the reconstruction's rendered depth or the log's LiDAR (`LidarDepth`);
`agreement` keeps the pixels where two references agree and `ReferencePaste` pastes them over a render: a repairer
without a model. Numpy throughout; cameras are any gsim model, distortion included."""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

from gsim.cameras import Camera, downscale_image
from gsim.errors import InputError
from gsim.images import render_image
from gsim.resident import Renderer
from gsim.scene import Scene
from gsim.scenes.reconstruction.lidar_depth import LidarDepth
from gsim.scenes.reconstruction.views import split_frames
from gsim.transforms import check_pose, invert

DEPTH_TOLERANCE = 0.05  # relative: a source depth this close to the point's source-camera z saw that point
SAME_SURFACE = 0.25  # relative inverse depth: a source pixel farther from the point's lies on another surface
SOLID_ALPHA = 0.5  # a rendered pixel's depth counts where its alpha reaches this (else: no surface known)
DIRECTION_M = 10.0  # nearest views: metres that a viewing direction turned by 90 degrees counts as
SENSOR_M = 2.0  # nearest views: metres that another camera of the log counts as (its exposure and lens differ)
TIME_M_PER_S = 1.0  # nearest views: metres that a second apart counts as (the log's actors move in between)
GEOMETRY_AGREES = 0.05  # relative: a render's depth this near the LiDAR's has the right geometry there
AGREE = 0.03  # mean RGB spread (images in [0,1]) within which references agree (seed 7: 0.03 kept more gain than 0.06)


def _image(a, camera: Camera, name: str, channels: Optional[int] = None) -> np.ndarray:
    """``a`` as float64, checked to be (H,W) or (H,W,channels) of ``camera``'s size."""
    a = np.asarray(a)
    shape = (camera.height, camera.width) + (() if channels is None else (channels,))
    if a.shape != shape or a.dtype.kind not in "fiu":
        raise InputError(f"{name}: expected a numeric array of shape {shape} (the camera's height and width), got "
                         f"{a.shape} {a.dtype}")
    return a.astype(np.float64)


def solid_depth(alpha: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """A render's depth where its alpha reaches `SOLID_ALPHA`, 0 (no surface known) elsewhere: what `warp` takes."""
    return np.where(alpha >= SOLID_ALPHA, depth, 0.0)


def warp(source_rgb: np.ndarray, source_depth: np.ndarray, source_camera: Camera, T_world_source: np.ndarray,
         target_depth: np.ndarray, target_camera: Camera, T_world_target: np.ndarray,
         depth_tolerance: float = DEPTH_TOLERANCE) -> Tuple[np.ndarray, np.ndarray]:
    """The source image seen from the target camera: (warped (H,W,3) float32, valid (H,W) bool), H and W the
    target's; warped is 0 where not valid.

    Backward warping: a target pixel with a depth (camera z, m, > 0; 0 or non-finite: none) is the point at that
    depth on its ray (``target_camera``'s model), moved into the source camera (``T_world_*``: OpenCV camera ->
    world) and projected with ``source_camera``'s model; the source image is sampled bilinearly there (pixel
    centres at +0.5). Valid where the point lands in front of the source camera, between its outermost pixel
    centres, and the source saw it: ``source_depth`` (camera z, m; 0: nothing seen) interpolated as inverse depth
    (exact across a plane for a pinhole camera, so slanted ground agrees at any distance) is within
    ``depth_tolerance`` (relative) of the point's source-camera z. A nearer one means the source saw something in
    front of the point (occlusion), a farther one that the depths disagree. Source pixels on another surface than
    the point (inverse depth off by more than `SAME_SURFACE`) take no part in the sample, so colour does not bleed
    across depth edges; a point most of whose bilinear weight is on another surface is not valid."""
    src = _image(source_rgb, source_camera, "source_rgb", 3)
    src_depth = _image(source_depth, source_camera, "source_depth")
    tgt_depth = _image(target_depth, target_camera, "target_depth")
    T_st = invert(check_pose(T_world_source, "T_world_source")) @ check_pose(T_world_target, "T_world_target")
    if not (isinstance(depth_tolerance, (int, float)) and math.isfinite(depth_tolerance) and depth_tolerance > 0):
        raise InputError(f"depth_tolerance: expected a finite number > 0 (relative), got {depth_tolerance!r}")
    H, W = tgt_depth.shape
    rays = target_camera.ray_table().reshape(-1, 2)
    z = tgt_depth.ravel()
    pix = np.flatnonzero(np.isfinite(z) & (z > 0) & np.isfinite(rays[:, 0]))
    p = np.concatenate([rays[pix] * z[pix, None], z[pix, None]], 1) @ T_st[:3, :3].T + T_st[:3, 3]
    uv, ok = source_camera.project(p)
    x, y = uv[:, 0] - 0.5, uv[:, 1] - 0.5  # (pixel centres at integers)
    Hs, Ws = src_depth.shape
    e = 1e-6  # pixels: a round trip through a distortion model's inverse lands this near the centre it left
    ok &= (x >= -e) & (x <= Ws - 1 + e) & (y >= -e) & (y <= Hs - 1 + e)
    pix, x, y, inv_p = pix[ok], np.clip(x[ok], 0, Ws - 1), np.clip(y[ok], 0, Hs - 1), 1.0 / p[ok, 2]
    x0 = np.minimum(np.floor(x).astype(np.int64), max(Ws - 2, 0))
    y0 = np.minimum(np.floor(y).astype(np.int64), max(Hs - 2, 0))
    fx, fy = x - x0, y - y0
    x1, y1 = np.minimum(x0 + 1, Ws - 1), np.minimum(y0 + 1, Hs - 1)
    rows, cols = np.stack([y0, y0, y1, y1]), np.stack([x0, x1, x0, x1])  # (4, N): the four neighbours
    weights = np.stack([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy])
    d = src_depth[rows, cols]
    with np.errstate(divide="ignore"):
        inv = np.where(np.isfinite(d) & (d > 0), 1.0 / d, 0.0)
    weights = weights * (np.abs(inv - inv_p) <= SAME_SURFACE * inv_p)
    total = weights.sum(0)
    seen = (weights * inv).sum(0) / np.maximum(total, 1e-12)
    good = (total >= 0.5) & (np.abs(seen / inv_p - 1) <= depth_tolerance)
    warped = np.zeros((H * W, 3), np.float32)
    warped[pix[good]] = np.einsum("kn,knc->nc", weights[:, good], src[rows[:, good], cols[:, good]]) \
        / total[good, None]
    valid = np.zeros(H * W, bool)
    valid[pix[good]] = True
    return warped.reshape(H, W, 3), valid.reshape(H, W)


def nearest_training_views(log, T_world_target: np.ndarray, timestamp_us: int, k: int = 2,
                           sensor: Optional[str] = None, holdout_every: int = 8, exclude: Sequence[int] = ()) -> list:
    """The ``k`` training views of ``log`` nearest a target camera, nearest first: [(Frame, CameraObs)].

    Training views: the frames the reconstruction saw (`gsim.scenes.reconstruction.views.split_frames` with ``holdout_every``, as
    the trainer and the evaluation split), less the frame indices in ``exclude``. Nearness, in metres: the distance
    between the cameras (``T_world_target``, a log pose: OpenCV camera -> world), plus `DIRECTION_M` x (1 - the
    cosine between their optical axes), plus `TIME_M_PER_S` per second from ``timestamp_us``, plus `SENSOR_M` for a
    camera other than ``sensor`` (the target's log camera; None: no preference)."""
    T = check_pose(T_world_target, "T_world_target")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise InputError(f"k: expected an integer >= 1 (views), got {k!r}")
    if sensor is not None and sensor not in log.cameras:
        raise InputError(f"sensor: no camera {sensor!r} in {log.root}; its cameras are {sorted(log.cameras)}")
    skip = {int(i) for i in exclude}
    obs = [(f, o) for f in split_frames(log, holdout_every)[0] if f.index not in skip for o in f.cameras.values()]
    if not obs:
        raise InputError(f"{log.root}: no training views to take references from (held out: frame index % "
                         f"{holdout_every} == 0; excluded: {sorted(skip)})")
    poses = np.stack([log.T_world_camera(o) for _, o in obs])
    times = np.array([o.timestamp_us for _, o in obs], np.float64)
    score = (np.linalg.norm(poses[:, :3, 3] - T[:3, 3], axis=1) + DIRECTION_M * (1 - poses[:, :3, 2] @ T[:3, 2])
             + TIME_M_PER_S * np.abs(times - int(timestamp_us)) * 1e-6
             + SENSOR_M * np.array([sensor is not None and o.sensor != sensor for _, o in obs]))
    return [obs[i] for i in np.argsort(score, kind="stable")[:k]]


def references(scene, log, target_camera: Camera, T_world_target: np.ndarray, timestamp_us: int, k: int = 2,
               sensor: Optional[str] = None, holdout_every: int = 8, downscale: Optional[int] = None,
               exclude: Sequence[int] = (), target_depth: Optional[np.ndarray] = None,
               depth_tolerance: float = DEPTH_TOLERANCE, lidar: Optional[LidarDepth] = None
               ) -> List[Tuple[np.ndarray, np.ndarray]]:
    """[(warped (H,W,3) float32, valid (H,W) bool)] of the ``k`` nearest training views' real images
    (`nearest_training_views`), nearest first, warped into the target camera (`warp`).

    ``scene``: a reconstruction of ``log`` (a `Scene`, or a `Renderer` holding one); ``T_world_target``: a log pose
    (OpenCV camera -> world) at ``timestamp_us``, e.g. a log camera moved by `gsim.scenes.evaluation.render_path.offset_pose`.
    The log's images have no depth: the target's depth and each source's (the occlusion test) are the scene's
    renders, counted where their alpha reaches `SOLID_ALPHA`, and the target and the sources are placed where the
    scene puts the log's poses (`Scene.log_pose`); ``target_depth``: the target's rendered depth if the caller has it
    (else rendered here). With ``lidar`` (a `gsim.scenes.reconstruction.lidar_depth.LidarDepth` of ``log``) both depths are the
    log's LiDAR instead, at the log's poses: the reconstruction's geometry, wrong off the path in the same way from
    every pose, no longer decides where the real pixels go. ``downscale``: of the log's images, to
    ``target_camera``'s scale (None: the scene's training downscale, 1 where it has none recorded). ``sensor``,
    ``holdout_every``, ``exclude``: as in `nearest_training_views`."""
    if not isinstance(scene, (Scene, Renderer)):
        raise InputError(f"scene: expected a gsim Scene or Renderer, got {type(scene).__name__}")
    if lidar is not None and target_depth is not None:
        raise InputError("references: give target_depth (a render's) or lidar (the log's LiDAR depth), not both")
    placed = scene.scene if isinstance(scene, Renderer) else scene
    if downscale is None:
        downscale = placed.train_downscale or 1
    t = int(timestamp_us)
    T_target = check_pose(T_world_target, "T_world_target")
    if lidar is not None:
        target_depth = lidar(target_camera, T_target, t)
    else:
        T_target = placed.log_pose(T_target, t)
        if target_depth is None:
            _, alpha, depth = render_image(scene, target_camera, T_target, t, sensor)
            target_depth = solid_depth(alpha, depth)
    out = []
    for _, obs in nearest_training_views(log, T_world_target, t, k, sensor, holdout_every, exclude):
        camera = log.cameras[obs.sensor].camera.downscaled(downscale)
        if lidar is not None:
            T_source = log.T_world_camera(obs)
            source_depth = lidar(camera, T_source, obs.timestamp_us)
        else:
            T_source = placed.log_pose(log.T_world_camera(obs), obs.timestamp_us)
            _, alpha, depth = render_image(scene, camera, T_source, obs.timestamp_us, obs.sensor)
            source_depth = solid_depth(alpha, depth)
        out.append(warp(downscale_image(log.image(obs), downscale), source_depth, camera, T_source, target_depth,
                        target_camera, T_target, depth_tolerance))
    return out


def agreement(found: Sequence[Tuple[np.ndarray, np.ndarray]], tolerance: float = AGREE
              ) -> Tuple[np.ndarray, np.ndarray]:
    """(colour (H,W,3) float32, agreed (H,W) bool) of references (``found``: [(warped, valid)] as `references`
    returns them): agreed where at least two are valid and their colours differ by at most ``tolerance`` (the mean
    over RGB of the largest minus the smallest valid value, images in [0,1]); colour: the valid ones' mean there, 0
    elsewhere. Two real images that land on the same colour from different poses put it at the right place: a wrong
    depth sends them to different texture."""
    if not found:
        raise InputError("agreement: expected at least one (warped, valid) reference, got none")
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise InputError(f"tolerance: expected a finite number >= 0 (RGB in [0,1]), got {tolerance!r}")
    warped = np.stack([np.asarray(w, np.float32) for w, _ in found])
    valid = np.stack([np.asarray(v, bool) for _, v in found])
    count = valid.sum(0)
    high = np.where(valid[..., None], warped, -np.inf).max(0)
    low = np.where(valid[..., None], warped, np.inf).min(0)
    with np.errstate(invalid="ignore"):  # (-inf - inf where none is valid: not agreed)
        agreed = (count >= 2) & ((high - low).mean(-1) <= tolerance)
    colour = (warped * valid[..., None]).sum(0) / np.maximum(count, 1)[..., None]
    return np.where(agreed[..., None], colour, 0.0).astype(np.float32), agreed


def view_references(scene, log, camera: Camera, T_world_target: np.ndarray, timestamp_us: int, k: int,
                    alpha: np.ndarray, depth: np.ndarray, lidar: Optional[LidarDepth] = None,
                    **nearest) -> List[Tuple[np.ndarray, np.ndarray]]:
    """`references` of a view the scene has rendered: the ``k`` nearest training images warped in through
    ``lidar``'s depth where given, else through the render's (``alpha``, ``depth``); ``nearest``: sensor,
    holdout_every, downscale, exclude, as `references` takes them."""
    return references(scene, log, camera, T_world_target, timestamp_us, k, lidar=lidar,
                      target_depth=None if lidar is not None else solid_depth(alpha, depth), **nearest)


def agreed_references(scene, log, camera: Camera, T_world_target: np.ndarray, timestamp_us: int, k: int,
                      alpha: np.ndarray, depth: np.ndarray, lidar: Optional[LidarDepth] = None,
                      tolerance: float = AGREE, **nearest) -> Tuple[np.ndarray, np.ndarray]:
    """`agreement` of a view's `view_references` (the same arguments)."""
    return agreement(view_references(scene, log, camera, T_world_target, timestamp_us, k, alpha, depth, lidar,
                                     **nearest), tolerance)


_LIDAR: list = [None, {}]  # the log whose LidarDepths are kept, and those, by (holdout_every, excluded frames)


def training_lidar(log, holdout_every: int = 8, exclude: Sequence[int] = ()) -> Optional[LidarDepth]:
    """The `LidarDepth` of ``log``'s training frames less those in ``exclude``; None where they have no LiDAR.
    Built once per log, split and exclusion, for every caller (the paste, the gate, a repair model's references);
    one log's are kept at a time (a LidarDepth holds its sweeps' points)."""
    skip = frozenset(int(i) for i in exclude)
    if _LIDAR[0] is not log:
        _LIDAR[:] = [log, {}]
    built = _LIDAR[1]
    if (holdout_every, skip) not in built:
        frames = [f for f in split_frames(log, holdout_every)[0] if f.index not in skip]
        built[holdout_every, skip] = LidarDepth(log, frames) if any(f.lidars for f in frames) else None
    return built[holdout_every, skip]


def model_references(config, scene, log, camera: Camera, T_world_target: np.ndarray, timestamp_us: int,
                     alpha: np.ndarray, depth: np.ndarray, lidar_exclude: Optional[Sequence[int]] = None,
                     **nearest) -> List[Tuple[np.ndarray, np.ndarray]]:
    """The references a repair model with `RepairConfig` ``config`` takes for a view (its ``config.references``
    nearest training images, `view_references`): warped through the log's LiDAR (`training_lidar` of the training
    frames less ``lidar_exclude``, by default the excluded images' frames) where ``config.reference_depth`` is
    "lidar" and the log has LiDAR, else through the render's depth (``alpha``, ``depth``: the scene's render of the
    view). ``nearest``: sensor, holdout_every, downscale, exclude, as `references` takes them."""
    if lidar_exclude is None:
        lidar_exclude = nearest.get("exclude", ())
    lidar = training_lidar(log, nearest.get("holdout_every", 8), lidar_exclude) \
        if config.reference_depth == "lidar" else None
    return view_references(scene, log, camera, T_world_target, timestamp_us, config.references, alpha, depth, lidar,
                           **nearest)


class ReferencePaste:
    """A repairer without a model: the render with the log's real training images pasted where at least two of
    the ``k`` nearest agree (`agreement`), warped into the view through the log's LiDAR depth (`references` with a
    `training_lidar` of the log; logs without LiDAR: through the render's depth), unless the render
    already has their colour or its depth is the LiDAR's (`GEOMETRY_AGREES`: its geometry is right there, and its
    pixels are sharper than resampled ones). Elsewhere the render stays as it is. It needs the view and its log
    (`repair_view`); ``log``: the one to use when a caller has none (``gsim render``)."""

    def __init__(self, k: int = 3, tolerance: float = AGREE, log=None):
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 2:
            raise InputError(f"k: expected an integer >= 2 (references that must agree), got {k!r}")
        self.k, self.tolerance, self.log = int(k), tolerance, log

    def with_log(self, log) -> "ReferencePaste":
        return ReferencePaste(self.k, self.tolerance, log)

    def repair_image(self, rgb, alpha, depth, seed: int = 0, mask=None) -> np.ndarray:
        raise InputError("the reference paste repairs a view of a log (its real training images): it has no image "
                         "of its own to give; render with the log (gsim render --references-log LOG)")

    def repair_view(self, scene, log, camera, T_world_target: np.ndarray, timestamp_us: int, rgb: np.ndarray,
                    alpha: np.ndarray, depth: np.ndarray, sensor: Optional[str] = None, seed: int = 0,
                    holdout_every: int = 8, downscale: Optional[int] = None, exclude: Sequence[int] = ()) -> np.ndarray:
        """``rgb`` (``scene``'s render of ``camera`` at the log pose ``T_world_target``, ``timestamp_us``) with the
        agreed real pixels pasted; neither the images nor the LiDAR of the frame indices in ``exclude`` are used;
        ``seed`` is unused (nothing is drawn)."""
        log = self.log if log is None else log
        if log is None:
            raise InputError("the reference paste needs the log whose training images it pastes")
        lidar = training_lidar(log, holdout_every, exclude)
        colour, agreed = agreed_references(scene, log, camera, T_world_target, timestamp_us, self.k, alpha, depth,
                                           lidar, self.tolerance, sensor=sensor, holdout_every=holdout_every,
                                           downscale=downscale, exclude=exclude)
        rgb = np.asarray(rgb, np.float32)
        # where the render already agrees with them it stays: it is sharper than resampled real pixels
        pasted = agreed & (np.abs(colour - rgb).mean(-1) > self.tolerance)
        if lidar is not None:  # and where its geometry is the LiDAR's, the render is right: it stays there too
            measured = lidar(camera, T_world_target, timestamp_us)
            drawn = solid_depth(alpha, depth)
            pasted &= ~((measured > 0) & (np.abs(drawn - measured) <= GEOMETRY_AGREES * measured))
        return np.where(pasted[..., None], colour, rgb)
