"""Ray-surfel LiDAR rendering with the camera rasterizers' exact 2DGS math.

A sweep's rays are cut into azimuth sectors of SECTOR_DEG; each sector is a "ray grid camera":
rows are the lasers sorted by elevation (top first), columns the sector's rotor columns sorted
right to left seen from the sensor, and each entry is the ray (x/z, y/z) in the sector's OpenCV
frame (z along the sector's centre azimuth, y down). The camera backends render such a grid as
they render a distorted camera (per-pixel rays, tile ranges from the rays themselves), so every
ray meets every surfel's plane exactly and composites front to back with the same alpha,
low-pass filter and early stop. The filter's "pixel" is the beam's divergence (BEAM_DIVERGENCE_RAD),
not the ray spacing: a beam is a thin cone, and a surfel between two beams is missed, as a real
sensor misses it (a grid-sized filter would fatten far surfels into beams they are not on).

Range along a ray = rendered camera z * |(x/z, y/z, 1)| (the expected, alpha-normalised hit
depth). A ray returns when its accumulated alpha reaches ``hit_alpha`` and its range lies in the
spec's [min, max]. Exact (float32) wherever the ray-plane hit decides; at grazing incidence
(a few degrees) the 2DGS object-space filter can win for surfels whose centres lie almost on the
ray and contributes their centre depth instead (a few percent of range). Not modelled yet:
intensity and learned ray drop (neural heads) and the rolling sweep (the sensor is at one pose
for the whole sweep); `LidarFrame.intensity` is None.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import numpy as np

from gsim.lidar.spec import LidarSpec

SECTOR_DEG = 60.0
MAX_ELEVATION_DEG = 60.0  # a sector camera's rays must stay well inside its forward half-space
BEAM_DIVERGENCE_RAD = 3e-3  # full angle; spec sheets give 1.5-3 mrad (HDL-64E ~2, VLP-16 3)


@dataclass(frozen=True, eq=False)
class RayGridCamera:
    """A camera given by its rays: (height, width, 2) x/z, y/z in its OpenCV frame; fx, fy (per unit
    of x/z, y/z) set the low-pass filter's pixel. Hashed by identity (the tile tables cache on it)."""

    width: int
    height: int
    fx: float
    fy: float
    rays: np.ndarray

    def ray_table(self) -> np.ndarray:
        return self.rays


@dataclass(frozen=True, eq=False)
class _Sector:
    camera: RayGridCamera
    R_lidar_camera: np.ndarray  # (3,3)
    lasers: np.ndarray  # (H,) laser index of each row
    columns: np.ndarray  # (W,) column index of each grid column


@dataclass(frozen=True, eq=False)
class _Layout:
    """What a spec's sweeps share (computed once per spec): the sector cameras, and per ray
    (lasers, columns) the range per unit camera z, the sensor-frame direction and the firing time."""

    sectors: Tuple[_Sector, ...]
    norm: np.ndarray  # |(x/z, y/z, 1)|: range = depth * norm
    directions: np.ndarray  # (L,C,3)
    time_offsets_us: np.ndarray  # (L,C) int64


@dataclass(frozen=True, eq=False)
class LidarFrame:
    """A rendered sweep. points (M,3) float32 in the sensor frame for the rays that returned; ranges
    (M,) m; ring (M,) laser index; column (M,) column index; time_offset_us (M,) int64 firing time
    from the sweep start; range_image (lasers, columns) float32 m, 0 where the ray returned nothing;
    alpha_image (lasers, columns) accumulated opacity; intensity: None (not modelled yet)."""

    points: np.ndarray
    ranges: np.ndarray
    ring: np.ndarray
    column: np.ndarray
    time_offset_us: np.ndarray
    range_image: np.ndarray
    alpha_image: np.ndarray
    intensity: Optional[np.ndarray] = None


@functools.lru_cache(maxsize=16)
def _layout(spec: LidarSpec) -> _Layout:
    el = np.asarray(spec.elevations_deg)
    if np.abs(el).max() > MAX_ELEVATION_DEG:
        raise ValueError(f"render_lidar: {spec.name} has elevations up to {np.abs(el).max():.1f} deg; the "
                         f"sector renderer handles |elevation| <= {MAX_ELEVATION_DEG} deg")
    rows = np.argsort(-el, kind="stable")
    col_az = spec.column_azimuths_deg()
    ray_az = col_az[None, :] + np.asarray(spec.azimuth_offsets_deg)[:, None]  # (L, C)
    which = np.floor((col_az + 180.0) / SECTOR_DEG).astype(int) % round(360 / SECTOR_DEG)
    out, norm = [], np.ones((spec.lasers, spec.columns))
    for k in range(round(360 / SECTOR_DEG)):
        cols = np.nonzero(which == k)[0]
        if len(cols) == 0:
            continue
        cols = cols[np.argsort(-col_az[cols], kind="stable")]  # decreasing azimuth: image x to the right
        phi = math.radians(-180.0 + (k + 0.5) * SECTOR_DEG)
        R = np.array([[math.sin(phi), 0.0, math.cos(phi)], [-math.cos(phi), 0.0, math.sin(phi)], [0.0, -1.0, 0.0]])
        a, e = np.radians(ray_az[np.ix_(rows, cols)]), np.radians(el[rows])[:, None]
        d = np.stack(np.broadcast_arrays(np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)), -1) @ R
        rays = d[..., :2] / d[..., 2:]
        cam = RayGridCamera(len(cols), len(rows), 1.0 / BEAM_DIVERGENCE_RAD, 1.0 / BEAM_DIVERGENCE_RAD, rays)
        out.append(_Sector(cam, R, rows, cols))
        norm[np.ix_(rows, cols)] = np.sqrt(1.0 + (rays ** 2).sum(-1))
    return _Layout(tuple(out), norm, spec.ray_directions(), spec.time_offsets_us())


def render_lidar(scene_or_surfels, spec: LidarSpec, T_world_lidar, backend: str = "auto",
                 timestamp_us: Optional[int] = None, hit_alpha: float = 0.5) -> LidarFrame:
    """Render one sweep of ``spec`` from the sensor pose ``T_world_lidar`` (4x4, sensor -> world) of a
    Scene (at ``timestamp_us``) or of world-frame Surfels. backend: "auto" (numba on the CPU),
    "numba" or "torch" (the reference, any device). numpy out."""
    from gsim.render import BACKENDS
    from gsim.render.common import RenderOptions, frame_to_numpy
    from gsim.scene import Scene
    from gsim.surfels import Surfels
    from gsim.transforms import check_pose

    if not isinstance(spec, LidarSpec):
        raise ValueError(f"render_lidar: spec must be a gsim.lidar.LidarSpec (e.g. LidarSpec.preset("
                         f"'velodyne-hdl64e')), got {type(spec).__name__}")
    if not 0 < hit_alpha < 1:
        raise ValueError(f"render_lidar: hit_alpha must lie in (0, 1), got {hit_alpha}")
    T = check_pose(T_world_lidar, "T_world_lidar")
    if isinstance(scene_or_surfels, Scene):
        surfels: Union[Surfels, None] = scene_or_surfels.at(timestamp_us)
    elif isinstance(scene_or_surfels, Surfels):
        surfels = scene_or_surfels
    else:
        raise TypeError(f"render_lidar: expected a Scene or Surfels, got {type(scene_or_surfels).__name__}")
    name = "numba" if backend == "auto" else backend
    if name not in ("numba", "torch"):
        raise ValueError(f"render_lidar: backend must be 'auto', 'numba' or 'torch', got {backend!r}")
    reason = BACKENDS[name].probe()
    if reason is not None:
        raise RuntimeError(f"render_lidar: backend {name!r} is not available: {reason}")
    layout = _layout(spec)
    depth_img, alpha_img = np.zeros(layout.norm.shape), np.zeros(layout.norm.shape)
    options = RenderOptions(near=min(0.05, spec.min_range_m / 2) or 0.01)
    for sec in layout.sectors:
        T_wc = T.copy()
        T_wc[:3, :3] = T[:3, :3] @ sec.R_lidar_camera
        f = frame_to_numpy(BACKENDS[name].render(surfels, sec.camera, T_wc, options))
        idx = np.ix_(sec.lasers, sec.columns)
        depth_img[idx], alpha_img[idx] = f.depth, f.alpha
    ranges = depth_img * layout.norm
    hit = (alpha_img >= hit_alpha) & (ranges >= spec.min_range_m) & (ranges <= spec.max_range_m)
    range_image = np.where(hit, ranges, 0.0).astype(np.float32)
    ring, column = np.nonzero(hit)
    r = ranges[ring, column]
    return LidarFrame(points=(layout.directions[ring, column] * r[:, None]).astype(np.float32),
                      ranges=r.astype(np.float32), ring=ring, column=column,
                      time_offset_us=layout.time_offsets_us[ring, column], range_image=range_image,
                      alpha_image=alpha_img.astype(np.float32))
