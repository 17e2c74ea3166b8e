"""Pictures of assets: a thumbnail (a three-quarter front view) and a turntable (frames around it)."""
from __future__ import annotations

from typing import List

import numpy as np

from gsim.cameras import PinholeCamera
from gsim.render import render_camera
from gsim.render.common import RenderOptions
from gsim.transforms import look_at

BACKDROP = (0.82, 0.84, 0.86)


def view(asset, azimuth_deg: float, width: int = 320, height: int = 240, backend: str = "numba") -> np.ndarray:
    """(H,W,3) RGB in [0,1] of ``asset`` seen from ``azimuth_deg`` (0: from the front, counter-clockwise
    seen from above), 20 degrees above the horizon, framed to fit its box."""
    l, w, h = asset.size
    radius = 0.5 * float(np.linalg.norm(asset.size))
    f = 0.9 * min(width, height)  # a 60-odd degree field of view
    dist = 1.05 * radius * f / (0.5 * min(width, height))
    a, el = np.radians(azimuth_deg), np.radians(20.0)
    target = np.array([0.0, 0.0, h / 2])
    eye = target + dist * np.array([np.cos(a) * np.cos(el), np.sin(a) * np.cos(el), np.sin(el)])
    cam = PinholeCamera(width=width, height=height, fx=f, fy=f, cx=width / 2, cy=height / 2)
    frame = render_camera(asset.surfels, cam, look_at(eye, target), backend=backend,
                          options=RenderOptions(background=BACKDROP))
    return np.asarray(frame.rgb)


def thumbnail(asset, backend: str = "numba") -> np.ndarray:
    return view(asset, 35.0, backend=backend)


def turntable(asset, frames: int = 36, width: int = 320, height: int = 240, backend: str = "numba") -> List[np.ndarray]:
    """``frames`` views all around the asset, starting from the front."""
    return [view(asset, 360.0 * k / frames, width, height, backend) for k in range(frames)]
