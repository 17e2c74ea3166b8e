"""Fast CPU camera backend (numba): numpy surfels take the forward rasterizer (numba_raster); differentiable tensors
and the distortion output take numba_grad's path, which shares its binning and compositor."""
from __future__ import annotations

import numpy as np

from ..cameras import Camera
from ..surfels import Surfels
from . import numba_surfaces
from .common import CameraFrame, RenderOptions
from .numba_raster import rasterize


def _needs_grad(surfels: Surfels) -> bool:
    import torch
    return torch.is_grad_enabled() and any(x.requires_grad for x in surfels.arrays().values())


def render(surfels, camera: Camera, T_world_camera: np.ndarray, options: RenderOptions) -> CameraFrame:
    """``surfels``: Surfels, or `Scene.placed` parts of numpy surfels (drawn without moving or copying
    them; not with the distortion output)."""
    if isinstance(surfels, list):
        if options.distortion:
            raise ValueError("numba backend: the distortion output needs world-frame surfels (Scene.at), not parts")
    elif options.distortion or (surfels.is_torch and _needs_grad(surfels)):
        from .numba_grad import render as render_tracked  # (torch: loaded for tensors alone)
        return render_tracked(surfels, camera, T_world_camera, options)
    else:
        surfels = surfels.numpy()
    if options.surface_eps:
        return numba_surfaces.rasterize(surfels, camera, T_world_camera, options)
    return rasterize(surfels, camera, T_world_camera, options)
