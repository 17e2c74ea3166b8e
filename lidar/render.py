"""`render_lidar`: a LiDAR sweep of a scene by exact ray-surfel compositing (lidar.kernel).

Rolling sweep: each column fires at its own time (the spec's timing model), and the sensor's pose
and every actor's pose are taken at that time: from a sensor trajectory (timestamps, poses)
interpolated like the logs' poses, and from the actors' tracks. The sweep is cut into bundles of
consecutive columns over which the sensor and the actors move at most BUNDLE_SPREAD_M (fewer when the
rays are few); each bundle is binned from its middle column's pose, with margins for the motion.
``rolling=False`` holds everything at the sweep start.
Points are reported in the sensor frame of their own column (what a spinning LiDAR reports).

Range: the median (where the accumulated alpha first reaches ``hit_alpha``, a first-return
model; a ray returns when it does, within the spec's ranges); the alpha-normalised expected range
is in ``expected_range_image``. The beam is a cone of BEAM_DIVERGENCE_RAD, the low-pass filter's
"pixel": a surfel between two beams is missed, as a real sensor misses it. Exact (float32 where the
kernel accumulates) wherever the ray-plane hit decides; at grazing incidence (a few degrees) the 2DGS
filter can win for surfels whose centres lie almost on the ray and gives their centre distance.
Intensity and ray drop come from the scene's LiDAR head (lidar.heads) when it has one.
"""
from __future__ import annotations

import contextlib
import functools
import math
import warnings
from dataclasses import dataclass
from typing import List, Optional, Union

import numpy as np

from gsim.errors import GsimWarning, InputError, Unavailable
from gsim.lidar.groups import SurfelGroups, surfel_groups
from gsim.lidar.spec import LidarSpec, RayTableSpec

BEAM_DIVERGENCE_RAD = 3e-3  # full angle; spec sheets give 1.5-3 mrad (HDL-64E ~2, VLP-16 3)
BUNDLE_SPREAD_M = 0.1  # how far the sensor or an actor may move within one bundle of columns
MAX_BUNDLES = 64
MIN_BUNDLE_RAYS = 8192


@dataclass(frozen=True, eq=False)
class LidarFrame:
    """A rendered sweep. For the rays that returned: points (M,3) float32 in the sensor frame (of the
    ray's own column), ranges (M,) m, ring (M,) laser index (row), column (M,), time_offset_us (M,)
    int64 firing time from the sweep start, normals (M,3) float32 sensor frame, facing the sensor,
    intensity (M,) float32 in [0,1] (None when the scene has no LiDAR head). Per ray (lasers,
    columns): range_image float32 m (0 = no return), expected_range_image (alpha-normalised, 0 where
    alpha is 0), alpha_image, drop_probability_image (None without a head). A ray table
    (`RayTableSpec`) is one row of N rays."""

    points: np.ndarray
    ranges: np.ndarray
    ring: np.ndarray
    column: np.ndarray
    time_offset_us: np.ndarray
    normals: np.ndarray
    range_image: np.ndarray
    expected_range_image: np.ndarray
    alpha_image: np.ndarray
    intensity: Optional[np.ndarray] = None
    drop_probability_image: Optional[np.ndarray] = None


@dataclass(frozen=True, eq=False)
class SweepLayout:
    """A spec's rays: what every sweep of it shares (`sweep_layout`)."""

    directions: np.ndarray  # (L,C,3) sensor frame
    time_offsets_us: np.ndarray  # (L,C) int64
    column_us: np.ndarray  # (C,) int64: when a column fires (its first laser)
    rows: Optional[tuple]  # a spinning sensor's lasers for lidar.sweep (render_strips' rows); None: a ray table


@functools.lru_cache(maxsize=16)
def sweep_layout(spec) -> SweepLayout:
    """The layout of a LidarSpec or RayTableSpec (cached: a simulator renders many sweeps of one spec)."""
    d, t = spec.ray_directions(), spec.time_offsets_us()
    if isinstance(spec, RayTableSpec):
        return SweepLayout(d[None], t[None], t[None].min(0), None)
    el = np.radians(spec.elevations_deg)
    row_of = np.argsort(el, kind="stable")
    step = math.radians(spec.azimuth_resolution_deg) * (1 if spec.spin == "ccw" else -1)
    row_az = np.radians(spec.start_azimuth_deg + np.asarray(spec.azimuth_offsets_deg, np.float64)
                        + np.zeros(spec.lasers))
    return SweepLayout(d, t, t.min(0), (np.sin(el[row_of]), row_of, row_az, step))


def sensor_poses(T_world_lidar, timestamp_us: Optional[int], times_us: np.ndarray, rolling: bool) -> np.ndarray:
    """(C,4,4) sensor pose at each column's firing time."""
    from gsim.transforms import check_pose, interpolate_poses
    if isinstance(T_world_lidar, tuple):
        ts, poses = T_world_lidar
        ts = np.asarray(ts, np.int64)
        poses = np.asarray(poses, np.float64)
        if ts.ndim != 1 or len(ts) == 0 or poses.shape != (len(ts), 4, 4) or np.any(np.diff(ts) <= 0):
            raise InputError("render_lidar: a trajectory is (timestamps_us (K,) strictly increasing, poses (K,4,4))")
        for i, T in enumerate(poses):
            check_pose(T, f"trajectory pose {i}")
        if timestamp_us is None:
            raise InputError("render_lidar: give timestamp_us (the sweep start) with a trajectory")
        at = times_us if rolling else np.full(len(times_us), timestamp_us)
        return interpolate_poses(ts, poses, at)
    T = check_pose(T_world_lidar, "T_world_lidar")
    return np.broadcast_to(T, (len(times_us), 4, 4))


def bundle_columns(origins: np.ndarray, actor_poses: np.ndarray, n_rays: int) -> List[np.ndarray]:
    """Consecutive column ranges over which the sensor and each actor origin move about BUNDLE_SPREAD_M; at
    least MIN_BUNDLE_RAYS rays per bundle (each bundle bins every surfel again: with few rays, as in a training
    batch, wider margins cost less than more binning)."""
    C = len(origins)
    n = int(min(MAX_BUNDLES, C, max(1, n_rays // MIN_BUNDLE_RAYS), _spread_bundles(origins, actor_poses)))
    return np.array_split(np.arange(C), n)


def _spread_bundles(origins: np.ndarray, actor_poses: np.ndarray) -> int:
    """How many bundles keep the sensor's and each actor's path within one under BUNDLE_SPREAD_M."""
    path = np.linalg.norm(np.diff(origins, axis=0), axis=1).sum()
    for P in actor_poses:
        path = max(path, np.linalg.norm(np.diff(P[:, :3, 3], axis=0), axis=1).sum())
    return max(1, math.ceil(path / BUNDLE_SPREAD_M))


def _rotation_angle(R: np.ndarray) -> np.ndarray:
    return np.arccos(np.clip((np.trace(R, axis1=-2, axis2=-1) - 1) / 2, -1.0, 1.0))


def render_lidar(scene_or_surfels, spec: Union[LidarSpec, RayTableSpec], T_world_lidar, backend: str = "auto",
                 timestamp_us: Optional[int] = None, hit_alpha: float = 0.5, rolling: bool = True,
                 head=None) -> LidarFrame:
    """Render one sweep of ``spec`` starting at ``timestamp_us`` (microseconds) of a Scene or of world-frame
    Surfels. ``T_world_lidar``: the sensor pose (4x4, sensor -> world) held over the sweep, or a trajectory
    (timestamps_us (K,), poses (K,4,4)) from which each column's pose is interpolated (``rolling``; else
    the pose at timestamp_us). Actors move along their tracks per column when ``rolling``.
    backend: "numba" (the CPU kernels), "cuda" (lidar.kernel_cuda, an NVIDIA GPU), "auto" (cuda where a GPU is,
    else numba) or "torch" (the reference twin, any device; binning-free and slow on big scenes). head: the
    `LidarHead` that decodes the surfels' features into intensity and ray drop (default: the scene's own; none:
    intensity is None and only geometry drops rays). numpy out."""
    if not isinstance(spec, (LidarSpec, RayTableSpec)):
        raise InputError(f"render_lidar: spec must be a gsim.lidar.LidarSpec (e.g. LidarSpec.preset("
                         f"'velodyne-hdl64e')) or RayTableSpec, got {type(spec).__name__}")
    if not 0 < hit_alpha < 1:
        raise InputError(f"render_lidar: hit_alpha must lie in (0, 1), got {hit_alpha}")
    name = pick_lidar_backend(backend)
    groups = surfel_groups(scene_or_surfels)
    if groups.tracks and timestamp_us is None:
        raise InputError("render_lidar: this scene has actors; give timestamp_us (integer microseconds)")
    lay = sweep_layout(spec)
    t0 = 0 if timestamp_us is None else int(timestamp_us)
    times = t0 + lay.column_us if rolling else np.full(len(lay.column_us), t0)
    sensor = sensor_poses(T_world_lidar, timestamp_us, times, rolling)
    L, C = lay.directions.shape[:2]
    head = _head(scene_or_surfels, head, groups)
    sweep = name == "numba" and lay.rows is not None  # the strip kernel turns the directions itself
    if name == "cuda":  # the rays, the trace and the head on the GPU, on the LiDAR's stream; one download
        from . import kernel_cuda
        stream = kernel_cuda.own_stream(not isinstance(groups.rec, np.ndarray))
    else:
        stream = contextlib.nullcontext()
    with stream:
        if name == "cuda":
            dirs = kernel_cuda.sweep_directions(lay, sensor)
        else:
            dirs = None if sweep and head is None else \
                np.einsum("cij,lcj->lci", sensor[:, :3, :3], lay.directions).reshape(-1, 3)
        if sweep:
            out = trace_sweep(groups, lay, sensor, times, hit_alpha)
        else:
            out = trace(groups, sensor, times, dirs, np.tile(np.arange(C), L), hit_alpha, name, device=name == "cuda")
        hit, intensity, drop = _returns(out, dirs, hit_alpha, spec.min_range_m, spec.max_range_m, head)
        if name == "cuda":
            out, hit, intensity, drop = kernel_cuda.download(out, hit, intensity, drop)
    return _frame(lay, out, sensor, hit, intensity, drop)


def _head(scene_or_surfels, head, groups: SurfelGroups):
    """The head to decode with (the one given, else the scene's own, else None), checked against the surfels."""
    from .heads import FEATURES
    head = head if head is not None else getattr(scene_or_surfels, "lidar_head", None)
    if head is not None and groups.features.shape[1] != FEATURES:
        raise InputError(f"render_lidar: the LiDAR head decodes {FEATURES} features per surfel, the surfels have "
                         f"{groups.features.shape[1]}")
    return head


def _returns(out: dict, dirs: np.ndarray, hit_alpha: float, min_range_m: float, max_range_m: float, head):
    """Which traced rays return (alpha reaches hit_alpha, the first-return range within the sensor's, and the
    head, if any, does not drop them), with the head's intensity and drop probability (1 where nothing was
    hit; both None without a head). numpy, or torch tensors on their device."""
    alpha, median = out["alpha"], out["median"]
    hit = (alpha >= hit_alpha) & (median >= min_range_m) & (median <= max_range_m)
    if head is None:
        return hit, None, None
    intensity, p = head(out, dirs)
    if isinstance(p, np.ndarray):
        drop = np.where(alpha >= hit_alpha, p, 1.0).astype(np.float32)
    else:
        drop = p.float().masked_fill(alpha < hit_alpha, 1.0)
    return hit & (drop < 0.5), intensity, drop


def lidar_backend_on(device) -> str:
    """The kernel for surfels kept on the torch ``device``: the CUDA one on a GPU where numba-cuda runs (the `cuda`
    extra), numba otherwise (on a GPU with a warning that says why the CUDA kernel does not run)."""
    if not str(device).startswith("cuda"):
        return "numba"
    from .kernel_cuda import unavailable_reason
    reason = unavailable_reason()
    if reason is not None:
        warnings.warn(f"LiDAR rays trace with numba on the CPU, not on the GPU: {reason}", GsimWarning, stacklevel=3)
        return "numba"
    return "cuda"


def pick_lidar_backend(backend: str) -> str:
    """The kernel to trace with: "auto" takes the CUDA kernel on a GPU (never the simulator's), else numba."""
    if backend not in ("auto", "numba", "cuda", "torch"):
        raise InputError(f"render_lidar: backend must be 'auto', 'numba', 'cuda' or 'torch', got {backend!r}")
    from .kernel_cuda import simulated, unavailable_reason
    if backend == "auto":
        backend = "cuda" if not simulated() and unavailable_reason() is None else "numba"
    if backend == "cuda":
        reason = unavailable_reason()
    else:
        from gsim.render import BACKENDS
        reason = BACKENDS[backend].probe()
    if reason is not None:
        raise Unavailable(f"render_lidar: backend {backend!r} is not available: {reason}")
    return backend


def render_rays(scene_or_surfels, T_world_lidar: np.ndarray, times_us: np.ndarray, dirs: np.ndarray,
                min_range_m: float, max_range_m: float, backend: str = "auto", hit_alpha: float = 0.5,
                head=None) -> dict:
    """Arbitrary rays, each fired at its own time from its own sensor pose: T_world_lidar (R,4,4), times_us
    (R,) (the actors' poses), dirs (R,3) unit, sensor frame. Returns {"range": (R,) m, 0 = no return,
    "intensity": (R,) or None, "drop_probability": (R,) or None} (see `render_lidar`)."""
    groups = surfel_groups(scene_or_surfels)
    head = _head(scene_or_surfels, head, groups)
    out, order, _, world = trace_rays(groups, T_world_lidar, times_us, dirs, hit_alpha, pick_lidar_backend(backend))
    hit, intensity, drop = _returns(out, world, hit_alpha, min_range_m, max_range_m, head)
    back = np.argsort(order)
    pick = lambda x: None if x is None else x[back].astype(np.float32)
    return {"range": pick(np.where(hit, out["median"], 0.0)), "intensity": pick(intensity),
            "drop_probability": pick(drop)}


def trace_rays(groups: SurfelGroups, T_world_lidar: np.ndarray, times_us: np.ndarray, dirs: np.ndarray,
               hit_alpha: float, backend: str = "numba", candidates: int = 0, device: bool = False):
    """`trace` of rays each with its own sensor pose (R,4,4), time (R,) and sensor-frame direction (R,3), taken
    in time order: (trace's output, the order, the poses and the world directions in that order); ``device``
    as `trace`'s."""
    order = np.argsort(times_us, kind="stable")
    poses = np.asarray(T_world_lidar, np.float64)[order]
    world = np.einsum("rij,rj->ri", poses[:, :3, :3], np.asarray(dirs, np.float64)[order])
    out = trace(groups, poses, np.asarray(times_us)[order], world, np.arange(len(order)), hit_alpha, backend,
                candidates, device)
    return out, order, poses, world


def trace(groups: SurfelGroups, sensor: np.ndarray, times_us: np.ndarray, dirs, column: np.ndarray,
          hit_alpha: float, backend: str = "numba", candidates: int = 0, device: bool = False) -> dict:
    """Composite rays fired from "columns": sensor (C,4,4) the pose of each column (its origin), times_us (C,)
    its time (the actors' poses), columns in time order; dirs (R,3) unit world directions (cuda: numpy or a
    tensor on the GPU), column (R,) each ray's column. Returns (R,) arrays (see lidar.kernel: alpha, range_sum,
    median, normal, features) plus group_from_world (G,C,3,4) and, with ``candidates`` K > 0, each ray's first K
    contributors. ``device`` (cuda): the arrays are float32 tensors left on the GPU."""
    C, R = len(sensor), len(dirs)
    world_from_group, group_from_world = group_poses(groups, times_us)
    bounds = np.concatenate([[0], np.cumsum(np.bincount(column, minlength=C))])  # each column's rays, by column
    if backend == "cuda":  # the rays and outputs live on the device until `result`
        from .kernel_cuda import Tracer
        tracer = Tracer(groups, group_from_world, sensor, dirs, column, candidates)
    else:
        origins = np.ascontiguousarray(sensor[column, :3, 3])
        dirs = np.ascontiguousarray(dirs, np.float64)
        by_column = np.argsort(column, kind="stable")
        out = _outputs(R, groups.features.shape[1], candidates)
    for cols in bundle_columns(sensor[:, :3, 3], world_from_group[1:], R):
        start, stop = bounds[cols[0]], bounds[cols[-1] + 1]
        if start == stop:
            continue
        o_ref, R_ref, margin, ref = bundle_frame(groups, sensor, world_from_group, cols)
        if backend == "numba":
            from .kernel import render_bundle
            render_bundle(groups.rec, groups.scales, groups.features, groups.group, ref, group_from_world, margin,
                          origins, dirs, column, o_ref, R_ref, BEAM_DIVERGENCE_RAD, hit_alpha, out,
                          by_column[start:stop])
        elif backend == "cuda":
            tracer.bundle(ref, margin, o_ref, R_ref, start, stop, BEAM_DIVERGENCE_RAD, hit_alpha)
        else:
            _torch_bundle(groups, ref, group_from_world, margin, origins, dirs, column, o_ref, hit_alpha, out,
                          by_column[start:stop])
    if backend == "cuda":
        out = tracer.result(device)
    out["group_from_world"] = group_from_world
    return out


def _outputs(R: int, F: int, candidates: int = 0) -> dict:
    return {"alpha": np.zeros(R), "range_sum": np.zeros(R), "median": np.zeros(R), "normal": np.zeros((R, 3)),
            "features": np.zeros((R, F)), "candidates": np.full((R, candidates), -1, np.int64)}


def group_poses(groups: SurfelGroups, times_us: np.ndarray):
    """Each group's pose at each time: world_from_group (G,C,4,4) and group_from_world (G,C,3,4)."""
    from gsim.transforms import interpolate_poses, invert
    world_from_group = np.tile(np.eye(4), (1 + len(groups.tracks), len(times_us), 1, 1))
    moving = {}  # a parked actor's track is one pose repeated: nothing to interpolate
    for g, (ts, poses) in enumerate(groups.tracks, start=1):
        if np.all(poses == poses[:1]):
            world_from_group[g] = poses[0]
        else:
            moving.setdefault(np.asarray(ts, np.int64).tobytes(), []).append(g)
    for gs in moving.values():  # tracks with the same times (a simulator's vehicles) in one batch
        world_from_group[gs] = interpolate_poses(groups.tracks[gs[0] - 1][0],
                                                 np.stack([groups.tracks[g - 1][1] for g in gs]), times_us)
    return world_from_group, np.ascontiguousarray(invert(world_from_group)[..., :3, :])


def bundle_frame(groups: SurfelGroups, sensor: np.ndarray, world_from_group: np.ndarray, cols: np.ndarray):
    """The reference of columns ``cols``, their middle column's pose: its origin, rotation, each group's pose
    (G,3,4), and each group's margin (G,): how far (m) the columns' origins and the group's surfels can be
    from where the reference puts them."""
    mid = cols[len(cols) // 2]
    o_ref, R_ref = sensor[mid, :3, 3].copy(), np.ascontiguousarray(sensor[mid, :3, :3])
    margin = np.full(len(world_from_group), float(np.linalg.norm(sensor[cols, :3, 3] - o_ref, axis=1).max()))
    from .kernel import actor_margins
    actor_margins(world_from_group, np.asarray(cols, np.int64), mid, np.asarray(groups.radius, np.float64), margin)
    return o_ref, R_ref, margin, np.ascontiguousarray(world_from_group[:, mid, :3, :])


def trace_sweep(groups: SurfelGroups, lay: "SweepLayout", sensor: np.ndarray, times_us: np.ndarray,
                hit_alpha: float) -> dict:
    """`trace` of a whole spinning sweep by the numba strip kernel (lidar.sweep): sensor (C,4,4) and times_us
    (C,) per column, ray r = laser C + column along the layout's directions. The returned arrays are buffers
    that this thread's next sweep overwrites."""
    from .kernel import scratch
    from .sweep import render_strips, strip_width
    C = len(sensor)
    world_from_group, group_from_world = group_poses(groups, times_us)
    still = bool(np.all(sensor == sensor[:1]) and np.all(world_from_group == world_from_group[:, :1]))
    # rolling: each strip is sorted from its own reference, so it spans as little motion as trace's bundles
    strips = 1 if still else _spread_bundles(sensor[:, :3, 3], world_from_group[1:])
    width = strip_width(lay.directions.shape[0], strips, C)
    spans = [np.arange(C)] + ([] if still else [np.arange(a, min(a + width, C)) for a in range(0, C, width)])
    frames = []
    for cols in spans:
        o_ref, R_ref, margin, ref = bundle_frame(groups, sensor, world_from_group, cols)
        M = np.einsum("ji,gjk->gik", R_ref, ref)  # reference_from_group: R^T [A | t - o_ref]
        M[:, :, 3] -= R_ref.T @ o_ref
        turn = float(_rotation_angle(np.einsum("ji,cjk->cik", R_ref, sensor[cols, :3, :3])).max())
        frames.append((M, o_ref, margin, [math.sin(turn), math.cos(turn)]))
    M, o_ref, margin, turn = (np.ascontiguousarray(np.stack(x), np.float64) for x in zip(*frames))
    R, F = lay.directions.shape[0] * C, groups.features.shape[1]
    # the strips write every ray's sums: buffers reused between sweeps (fresh pages cost more than the writes)
    out = {k: scratch("sweep_" + k, (R,) + shape, np.float32) for k, shape in
           (("alpha", ()), ("range_sum", ()), ("median", ()), ("normal", (3,)), ("features", (F,)))}
    render_strips(groups.disk, groups.rec, groups.features, groups.group, M, o_ref, margin, turn, group_from_world,
                  lay.rows, width, np.ascontiguousarray(sensor[:, :3, 3]), _rotations(sensor),
                  lay.directions.reshape(-1, 3), BEAM_DIVERGENCE_RAD, hit_alpha, out)
    out["group_from_world"] = group_from_world
    return out


def _torch_bundle(groups, ref, group_from_world, margin, origins, dirs, column, o_ref, hit_alpha, out, rays,
                  chunk: int = 4096) -> None:
    """The reference: every surfel whose cap (the kernel's, recomputed here) holds a ray is composited
    for it, in the kernel's order, by lidar.reference.composite; on the GPU when torch has CUDA."""
    import torch
    from .reference import composite
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t = lambda x, dt=torch.float64: torch.as_tensor(np.ascontiguousarray(x), dtype=dt, device=dev)
    rec = t(groups.rec)
    means, op, g = rec[:, :3], rec[:, 12], t(groups.group, torch.int64)
    W = t(ref)
    c = torch.einsum("nab,nb->na", W[g][..., :3], means) + W[g][..., 3] - t(o_ref)
    dist = c.norm(dim=-1)
    lg = torch.log((op * 255).clamp_min(1.0))
    r3 = torch.sqrt(2 * lg) * t(groups.scales).max(1).values
    m = t(margin)[g]
    rho = (torch.asin((r3 / (dist - m)).clamp(0, 1)) + torch.atan(math.tan(BEAM_DIVERGENCE_RAD) * torch.sqrt(lg))
           + torch.asin((m / dist).clamp(0, 1)) + 1e-6)
    full = (dist <= m + r3 + 0.01) | (rho >= math.pi / 2)
    cos_rho = torch.where(full, -2.0 * torch.ones_like(rho), torch.cos(rho))
    live = op * 255 > 1.0
    order = torch.argsort(torch.where(live, dist, math.inf), stable=True)
    order = order[live[order]]
    u = c[order] / dist[order, None]
    quats = t(groups.quats)
    scales = t(groups.scales)
    gfw = t(group_from_world)
    feats = t(groups.features)
    for k in range(0, len(rays), chunk):
        r = rays[k:k + chunk]
        d = t(dirs[r])
        hit = (d @ u.T) >= cos_rho[order][None]
        K = int(hit.sum(1).max()) if len(order) else 0
        idx = torch.sort(torch.where(hit, torch.arange(len(order), device=dev)[None], len(order)), dim=1).values[:, :K]
        cand = torch.where(idx < len(order), torch.cat([order, order.new_full((1,), -1)])[idx], -1)
        res = composite(t(origins[r]), d, t(column[r], torch.int64), means, quats, scales, op, feats, g, gfw, cand,
                        BEAM_DIVERGENCE_RAD, hit_alpha)
        for key in ("alpha", "range_sum", "median", "normal", "features"):
            out[key][r] = res[key].cpu().numpy()


def _rotations(sensor: np.ndarray) -> np.ndarray:
    """The sensor's rotation per column (C,3,3), or (1,3,3) when it does not turn (the kernels' convention)."""
    rot = np.ascontiguousarray(sensor[:, :3, :3])
    return rot[:1] if np.all(rot == rot[:1]) else rot


def _frame(lay: SweepLayout, out: dict, sensor: np.ndarray, hit: np.ndarray, intensity, drop) -> LidarFrame:
    from .kernel import fill_frame
    L, C = lay.directions.shape[:2]
    start = np.zeros(L + 1, np.int64)
    np.cumsum(hit.reshape(L, C).sum(1), out=start[1:])
    M = int(start[-1])
    f = {"points": np.empty((M, 3), np.float32), "ranges": np.empty(M, np.float32), "ring": np.empty(M, np.int64),
         "column": np.empty(M, np.int64), "time_offset_us": np.empty(M, np.int64),
         "normals": np.empty((M, 3), np.float32),
         "intensity": np.empty(M if intensity is not None else 0, np.float32),
         "range_image": np.empty((L, C), np.float32), "expected_range_image": np.empty((L, C), np.float32),
         "alpha_image": np.empty((L, C), np.float32)}
    fill_frame(hit, start, out["alpha"], out["range_sum"], out["median"], out["normal"],
               f["intensity"] if intensity is None else np.ascontiguousarray(intensity, np.float32),
               lay.directions.reshape(-1, 3), lay.time_offsets_us.reshape(-1), _rotations(sensor), *f.values())
    return LidarFrame(**{**f, "intensity": None if intensity is None else f["intensity"]},
                      drop_probability_image=None if drop is None else drop.reshape(L, C))

