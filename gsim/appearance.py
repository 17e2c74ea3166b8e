"""What a camera image gets beyond the surfels: the sky behind them and the camera's response.

The sky is an equirectangular (lat-long) RGB map of world directions (z up): row 0
looks straight up, the last row straight down; column 0 is azimuth -pi (atan2(y, x)),
increasing with azimuth. A pixel's colour is

    affine(rgb + (1 - alpha) * sky(ray direction)),   affine(c) = A[:, :3] @ c + A[:, 3],

with A the (3,4) affine of the camera sensor (exposure, white balance), identity by default.
numpy in, numpy out; torch in, torch out (differentiable: the trainer learns the sky map
and the affines through these functions).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .errors import InputError
from .surfels import is_tensor

IDENTITY_AFFINE = np.hstack([np.eye(3), np.zeros((3, 1))])


@dataclass(frozen=True, eq=False)
class Sky:
    """envmap (H,W,3) RGB in [0,1], lat-long in world directions (see the module docstring)."""

    envmap: Any

    def __post_init__(self):
        self._check_shape()
        e = self.envmap
        if not bool(e.detach().isfinite().all() if is_tensor(e) else np.isfinite(e).all()):
            raise InputError("Sky.envmap: contains NaN or inf")

    @classmethod
    def derived(cls, envmap) -> "Sky":
        """A sky computed by gsim itself (a trainer's map, every step): its shape is checked, its values are not
        (on a GPU that check is a host synchronisation a step)."""
        s = object.__new__(cls)
        object.__setattr__(s, "envmap", envmap)
        s._check_shape()
        return s

    def _check_shape(self) -> None:
        e = self.envmap
        if tuple(e.shape[2:]) != (3,) or e.ndim != 3 or e.shape[0] < 1 or e.shape[1] < 1:
            raise InputError(f"Sky.envmap: expected shape (H,W,3), got {tuple(e.shape)}")

    def color(self, dirs_world):
        """(...,3) directions (any length) in the world frame -> (...,3) sky RGB."""
        import torch
        import torch.nn.functional as F
        env = self.envmap if is_tensor(self.envmap) else torch.from_numpy(np.asarray(self.envmap, np.float32))
        d = dirs_world if is_tensor(dirs_world) else torch.from_numpy(np.asarray(dirs_world, np.float32))
        d = d.to(env.dtype)
        shape = d.shape[:-1]
        u, v = lat_long(d.reshape(-1, 3))
        h, w = env.shape[:2]
        img = env.permute(2, 0, 1)[None]
        img = torch.cat([img[..., -1:], img, img[..., :1]], -1)  # wrap around the azimuth seam
        gx = 2 * (u * w + 1) / (w + 2) - 1
        grid = torch.stack([gx, 2 * v - 1], -1)[None, None]
        out = F.grid_sample(img, grid, mode="bilinear", padding_mode="border", align_corners=False)
        out = out[0, :, 0].T.reshape(*shape, 3)
        return out if is_tensor(dirs_world) or is_tensor(self.envmap) else out.numpy()


def lat_long(d):
    """(N,3) torch world directions (any length) -> (u, v) in [0,1]: u around the azimuth from -pi, v from straight
    up (0) to straight down (1); texel (row, column) of an (H,W) map: (floor(v H), floor(u W))."""
    import torch
    n = torch.linalg.vector_norm(d, dim=-1).clamp_min(1e-12)
    return (torch.atan2(d[:, 1], d[:, 0]) / math.pi + 1) * 0.5, torch.acos((d[:, 2] / n).clamp(-1, 1)) / math.pi


@functools.lru_cache(maxsize=16)
def _unit_rays(camera) -> np.ndarray:
    """(H,W,3) float32 camera-frame unit directions of the pixel rays (cached: cameras are frozen and hashable)."""
    rays = camera.ray_table()  # (H,W,2) x/z, y/z
    d = np.concatenate([rays, np.ones(rays.shape[:2] + (1,))], -1)
    return (d / np.linalg.norm(d, axis=-1, keepdims=True)).astype(np.float32)


def camera_ray_directions(camera, T_world_camera):
    """(H,W,3) float32 world-frame unit directions of the camera's pixel rays (NaN where the model has none)."""
    return _unit_rays(camera) @ np.asarray(T_world_camera, np.float32)[:3, :3].T


def compose(rgb, alpha, sky: Optional[Sky] = None, dirs_world=None, affine=None):
    """affine(rgb + (1 - alpha) * sky(dirs)) per pixel; rgb (H,W,3), alpha (H,W), affine (3,4)."""
    if sky is not None:
        s = sky.color(dirs_world)
        if is_tensor(rgb) and not is_tensor(s):
            from .render.common import to_device  # (render sits above this module)
            s = to_device(s, rgb.device, rgb.dtype)
        s = s.nan_to_num(0.0) if is_tensor(s) else np.nan_to_num(s)
        rgb = rgb + (1 - alpha)[..., None] * s
    if affine is not None:
        if is_tensor(rgb) and not is_tensor(affine):
            from .render.common import to_device
            affine = to_device(np.asarray(affine), rgb.device, rgb.dtype)
        rgb = rgb @ affine[:, :3].T + affine[:, 3]
    return rgb
