"""What every camera backend shares: the 2DGS constants, options, outputs and tile tables.

The image is defined per pixel (dense math): the backends' tiles only prune work.
A surfel's screen footprint is bounded on the z=1 ray plane by the exact region where
its alpha can reach the 1/255 threshold, and a tile's by the rays of its pixels, so
pruning never changes a pixel, for any camera model.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np
from ..errors import InputError

ALPHA_THRESHOLD = 1.0 / 255.0  # contributions below are skipped
MAX_ALPHA = 0.999
T_MIN = 1e-4  # a pixel is done once its transmittance would fall to this (exclusive)
# Surface compositing (RenderOptions.surface_eps) takes a surfel's ray-plane hit depth within this factor of its
# centre's depth: a surfel the low-pass draws edge-on has a plane that the ray meets anywhere, even at the camera.
SURFACE_REACH = 1.25
FILTER_INV_SQUARE = 2.0  # 2DGS object-space low-pass: rho_2d = 2 |pixel - centre|^2
TILE_SIZE = 16
# Depth distortion (2DGS): depths z are mapped to m = DISTORTION_SCALE / z, 2DGS's NDC-like
# m = far (z - near) / ((far - near) z) with its near 0.2 m and far 100 m, less the constant
# far / (far - near), which the distortion does not see; so the values equal 2DGS's, and the
# accumulators stay small (no cancellation against a constant near 1 in float32).
DISTORTION_NEAR, DISTORTION_FAR = 0.2, 100.0
DISTORTION_SCALE = DISTORTION_FAR * DISTORTION_NEAR / (DISTORTION_FAR - DISTORTION_NEAR)
# The per-surfel record, the pixel stage's inputs shared by the torch and numba backends: rows
# 0-1 and the full row 2 of adj(H) (a00 a01 a10 a11 a20 a21 a22; a02, a12 are not needed since
# pixel offsets are taken from the centre ray), det(H), centre ray (uc, vc), opacity, rgb,
# normal (camera frame, facing the camera), centre depth.
RECORD_FIELDS = ("a00", "a01", "a10", "a11", "a20", "a21", "a22", "det", "uc", "vc", "opacity",
                 "r", "g", "b", "nx", "ny", "nz", "cz")
N_RECORD = len(RECORD_FIELDS)


@dataclass(frozen=True)
class RenderOptions:
    """near/far (m) cull surfels by the camera z of their centre; background is RGB in [0,1];
    distortion: also render the depth distortion (`CameraFrame.distortion`); surface_eps > 0: a run of surfels
    whose ray-plane hits each lie within this fraction of the one before composites as one surface (it takes the
    transmittance of what lies in front and splits its coverage by what each covers, as EWA surface splatting
    blends), where 0 composites every surfel front to back by its centre's depth (2DGS, gsplat), which shows a
    surface seen at a grazing angle from its near side (`bench/bench_splat_bias.py`); the torch and numba backends
    have it, gsplat's kernels do not."""

    near: float = 0.01
    far: float = 1e10
    background: Tuple[float, float, float] = (0.0, 0.0, 0.0)
    distortion: bool = False
    surface_eps: float = 0.0

    def __post_init__(self):
        if not (0 < self.near < self.far):
            raise InputError(f"RenderOptions: need 0 < near < far, got near={self.near}, far={self.far}")
        if not (isinstance(self.surface_eps, (int, float)) and 0 <= self.surface_eps < 1):
            raise InputError(f"RenderOptions.surface_eps: expected a fraction in [0, 1), got {self.surface_eps!r}")
        if len(self.background) != 3 or not all(np.isfinite(self.background)):
            raise InputError(f"RenderOptions.background: expected 3 finite values, got {self.background}")


def centre_depth_only(options: RenderOptions, backend: str) -> None:
    """Refuses `RenderOptions.surface_eps` in a backend that composites by the surfels' centre depth only."""
    if options.surface_eps:
        raise InputError(f"RenderOptions.surface_eps: the {backend} backend composites surfels by their centres' "
                         f"depth only; the torch and numba backends composite surfaces (backend='numba' or 'torch')")


@dataclass(frozen=True, eq=False)
class CameraFrame:
    """A rendered camera image. rgb (H,W,3) in [0,1] over the background; alpha (H,W);
    depth (H,W) m, the camera z of the ray-surfel hits, alpha-weighted and divided by
    alpha (0 where alpha is 0); normal (H,W,3) in the camera frame (OpenCV), alpha-weighted
    and divided by alpha, facing the camera; distortion (H,W) or None unless asked for
    (`RenderOptions.distortion`): 2DGS's depth distortion sum_{i<j} w_i w_j (m_i - m_j)^2 over the
    composited surfels, weights w = alpha T, m = DISTORTION_SCALE / z of the hit depths z (see
    above). The squared form is order-free: it is A sum_i w_i (m_i - mean)^2, A = sum_i w_i, so it
    needs no sort by hit depth (compositing goes by centre depth) and sums stably in one pass.
    numpy arrays, or tensors for torch input."""

    rgb: Any
    alpha: Any
    depth: Any
    normal: Any
    distortion: Any = None


def opacity_cutoffs(opacity: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Radii beyond which alpha < 1/255: in surfel sigmas (3D) and in pixels (2D filter)."""
    lg = np.log(np.maximum(opacity * 255.0, 1.0))
    return np.sqrt(2.0 * lg), np.sqrt(lg / (0.5 * FILTER_INV_SQUARE))


@dataclass(frozen=True, eq=False)
class TileTable:
    """Per-tile pixel rays and ray-plane ranges for one camera.

    rays (n_tiles, TILE_SIZE**2, 2) float32, NaN for pixels outside the image or
    without a ray; pixel (n_tiles, TILE_SIZE**2) int64 flat pixel index or -1;
    bounds (n_tiles, 4) [umin, umax, vmin, vmax] (empty tiles: +inf, -inf);
    tile_col_u (2, tiles_x) a [umin; umax] range of each column of tiles and tile_row_v
    (2, tiles_y) a [vmin; vmax] range of each row of tiles; row_v (n_tiles, 2, TILE_SIZE)
    float32 and col_u the same for the pixel rows and columns inside each tile. Each
    range holds its pixels' rays, and the mins and the maxes are each nondecreasing
    (see ``_ranges``), so the indices whose range meets [lo, hi] are counted: from
    #(max < lo) to #(min <= hi). A footprint bound thus selects a rectangle of tiles,
    and in a tile a rectangle of pixels, without missing any pixel for any camera model.
    """

    tiles_x: int
    tiles_y: int
    rays: np.ndarray
    pixel: np.ndarray
    bounds: np.ndarray
    tile_col_u: np.ndarray
    tile_row_v: np.ndarray
    row_v: np.ndarray
    col_u: np.ndarray

    @functools.cached_property
    def ray_u(self) -> np.ndarray:
        return np.ascontiguousarray(self.rays[..., 0])

    @functools.cached_property
    def ray_v(self) -> np.ndarray:
        return np.ascontiguousarray(self.rays[..., 1])


def _minmax(x: np.ndarray, axis) -> np.ndarray:
    """[..., 2] = [min, max] of ``x`` over ``axis``, ignoring NaN ((+inf, -inf) when all NaN)."""
    ok = np.isfinite(x)
    return np.stack([np.where(ok, x, np.inf).min(axis), np.where(ok, x, -np.inf).max(axis)], -1)


def _ranges(x: np.ndarray, axis) -> np.ndarray:
    """[..., 2, n]: ranges [lo; hi] that hold ``_minmax(x, axis)`` (n: the last axis left), widened so
    that lo and hi are nondecreasing: lo the running min from the end, hi the running max from the start.
    Rays monotone along that axis, as for the usual cameras, leave them unchanged; empty ranges (no ray)
    take their neighbours'."""
    m = _minmax(x, axis)
    lo = np.minimum.accumulate(m[..., ::-1, 0], -1)[..., ::-1]
    return np.ascontiguousarray(np.stack([lo, np.maximum.accumulate(m[..., 1], -1)], -2))


@functools.lru_cache(maxsize=16)
def tile_table(camera) -> TileTable:
    """The tile table of ``camera`` (cached; cameras are frozen and hashable)."""
    H, W, ts = camera.height, camera.width, TILE_SIZE
    tx, ty = -(-W // ts), -(-H // ts)
    table = np.full((ty * ts, tx * ts, 2), np.nan)
    table[:H, :W] = camera.ray_table()
    pix = np.full((ty * ts, tx * ts), -1, dtype=np.int64)
    pix[:H, :W] = np.arange(H * W).reshape(H, W)
    grid = table.reshape(ty, ts, tx, ts, 2)  # (tile row, pixel row, tile col, pixel col, uv)
    u, v = grid[..., 0], grid[..., 1]
    bounds = np.concatenate([_minmax(u, (1, 3)), _minmax(v, (1, 3))], -1).reshape(-1, 4)
    row_v = _ranges(v.transpose(0, 2, 1, 3), 3).reshape(ty * tx, 2, ts)
    col_u = _ranges(u.transpose(0, 2, 3, 1), 3).reshape(ty * tx, 2, ts)
    f32 = lambda x: np.ascontiguousarray(x, dtype=np.float32)
    return TileTable(tx, ty, f32(grid.transpose(0, 2, 1, 3, 4).reshape(ty * tx, ts * ts, 2)),
                     pix.reshape(ty, ts, tx, ts).transpose(0, 2, 1, 3).reshape(ty * tx, ts * ts),
                     bounds, _ranges(u.transpose(0, 1, 3, 2), (0, 1, 2)), _ranges(v, (1, 2, 3)), f32(row_v), f32(col_u))


def world_to_camera(T_world_camera: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(R_cw, t_cw, camera centre in world) from a checked T_world_camera."""
    R_wc, c = T_world_camera[:3, :3], T_world_camera[:3, 3]
    return R_wc.T, -R_wc.T @ c, c


def map_frame(frame: CameraFrame, fn) -> CameraFrame:
    """``frame`` with ``fn`` applied to each of its images (distortion stays None when absent)."""
    return CameraFrame(rgb=fn(frame.rgb), alpha=fn(frame.alpha), depth=fn(frame.depth), normal=fn(frame.normal),
                       distortion=None if frame.distortion is None else fn(frame.distortion))


def to_numpy(x):
    """An image as numpy: a tensor brought to the host, an array as it is."""
    return x.detach().cpu().numpy() if hasattr(x, "detach") else x


def to_device(x, device, dtype=None):
    """An array (or a tensor) as a tensor on ``device``, without making the host wait for a GPU: torch's plain
    host-to-GPU copy synchronises the stream after it (the host waits for every queued kernel), where a
    non-blocking copy from pageable memory is staged at once and ordered on the stream (safe to reuse the
    array after). Copies to the host stay blocking: their data must be there when read."""
    import torch
    t = x if torch.is_tensor(x) else torch.as_tensor(np.ascontiguousarray(x))  # (numpy's float64 for floats)
    device = torch.device(device)
    return t.to(device=device, dtype=dtype, non_blocking=device.type != "cpu" and t.device.type == "cpu")


def frame_to_numpy(frame: CameraFrame) -> CameraFrame:
    return map_frame(frame, to_numpy)


def resolve_options(options: Optional[RenderOptions]) -> RenderOptions:
    return options if options is not None else RenderOptions()
