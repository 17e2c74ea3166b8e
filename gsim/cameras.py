"""Camera models: a tagged union of pinhole, OpenCV radial-tangential and fisheye.

All models share the OpenCV camera frame (x right, y down, z forward) and pixel
convention: pixel (i, j) covers [j, j+1) x [i, i+1) with its centre at (j+0.5, i+0.5).
Projection maps camera-frame points to pixels; unprojection maps pixels to rays
(x/z, y/z, 1). Renderers only need the per-pixel ray table, so every model renders
exactly (no resampling): a ray is intersected with each surfel's plane.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import asdict, dataclass, fields
from typing import ClassVar, Union

import numpy as np
from .errors import InputError

# OpenCV (and so ROS, KITTI and DGP calibrations) puts pixel centres at integer coordinates, gsim at +0.5: a
# principal point moves by half a pixel on the way in (the converters) and back on the way out (ROS 2 bags, AlpaSim).
OPENCV_PIXEL_CENTRE_SHIFT = 0.5

# Rays are parametrised on the z=1 plane, so a fisheye's field of view is kept below 180 deg.
FISHEYE_MAX_THETA = math.radians(89.0)


def _check_intrinsics(cam) -> None:
    name = type(cam).__name__
    for f in ("width", "height"):
        v = getattr(cam, f)
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
            raise InputError(f"{name}.{f}: expected a positive integer number of pixels, got {v!r}")
    for f in fields(cam):
        v = getattr(cam, f.name)
        if f.name not in ("width", "height") and not (isinstance(v, (int, float, np.floating, np.integer))
                                                        and math.isfinite(v)):
            raise InputError(f"{name}.{f.name}: expected a finite number, got {v!r}")
    if cam.fx <= 0 or cam.fy <= 0:
        raise InputError(f"{name}: focal lengths fx, fy must be > 0 pixels, got {cam.fx}, {cam.fy}")


class _CameraBase:
    model: ClassVar[str]

    def __post_init__(self):
        _check_intrinsics(self)

    @property
    def K(self) -> np.ndarray:
        return np.array([[self.fx, 0, self.cx], [0, self.fy, self.cy], [0, 0, 1.0]])

    def to_dict(self) -> dict:
        return {"model": self.model, **asdict(self)}

    def project(self, points_camera: np.ndarray):
        """(N,3) camera-frame points -> ((N,2) pixels, (N,) valid). Invalid: behind or outside the model."""
        p = np.asarray(points_camera, dtype=np.float64)
        z = p[:, 2]
        front = z > 1e-9
        zs = np.where(front, z, 1.0)
        u, v, ok = self.pixels(p[:, 0] / zs, p[:, 1] / zs)
        return np.stack([u, v], 1), front & ok

    def pixels(self, x, y):
        """Rays (x/z, y/z; numpy or torch arrays, torch differentiable) -> (u, v, valid): their pixels."""
        xd, yd, ok = self._distort(x, y)
        return self.fx * xd + self.cx, self.fy * yd + self.cy, ok

    def unproject(self, pixels: np.ndarray):
        """(N,2) pixels -> ((N,3) rays (x/z, y/z, 1) in the camera frame, (N,) valid)."""
        uv = np.asarray(pixels, dtype=np.float64)
        xd = (uv[:, 0] - self.cx) / self.fx
        yd = (uv[:, 1] - self.cy) / self.fy
        x, y, ok = self._undistort(xd, yd)
        return np.stack([x, y, np.ones_like(x)], 1), ok

    def ray_table(self) -> np.ndarray:
        """(H,W,2) float64 ray (x/z, y/z) through each pixel centre; NaN where the model has no ray."""
        return _ray_table(self)

    # pinhole defaults. ``_distort`` takes numpy or torch arrays alike (torch: a differentiable warp between
    # views, `gsim.scenes.reconstruction.multiview`)
    def _distort(self, x, y):
        return x, y, x == x  # (False only at NaN)

    def _undistort(self, xd, yd):
        return xd, yd, np.ones(xd.shape, bool)


def _array_module(a):
    """torch for a torch tensor, else numpy: the distortion models' maths serves both."""
    if type(a).__module__.startswith("torch"):
        import torch
        return torch
    return np


def _first_fold(x: np.ndarray, derivative: np.ndarray, default: float) -> float:
    """The first sample of ``x`` where a distortion curve stops increasing (``default`` if never)."""
    bad = np.nonzero(derivative <= 0)[0]
    return float(x[bad[0]]) if len(bad) else default


@functools.lru_cache(maxsize=16)
def _ray_table(cam) -> np.ndarray:
    jj, ii = np.meshgrid(np.arange(cam.width) + 0.5, np.arange(cam.height) + 0.5)
    rays, ok = cam.unproject(np.stack([jj.ravel(), ii.ravel()], 1))
    table = rays[:, :2].copy()
    table[~ok] = np.nan
    table = table.reshape(cam.height, cam.width, 2)
    table.setflags(write=False)
    return table


@dataclass(frozen=True)
class _Intrinsics(_CameraBase):
    """Image size (pixels) and the linear part of every model: focal lengths and principal point."""

    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float

    def downscaled(self, factor: int):
        """The camera of images box-averaged by an integer ``factor`` (cropped to a multiple of it at
        the right and bottom): pixel coordinates divide by the factor, distortion is unchanged."""
        if not isinstance(factor, (int, np.integer)) or factor < 1 or factor > min(self.width, self.height):
            raise InputError(f"downscale factor: expected an integer in [1, {min(self.width, self.height)}], "
                             f"got {factor!r}")
        return dataclasses.replace(self, width=self.width // factor, height=self.height // factor,
                                   fx=self.fx / factor, fy=self.fy / factor, cx=self.cx / factor, cy=self.cy / factor)


def downscale_image(image: np.ndarray, factor: int) -> np.ndarray:
    """(H,W,...) image box-averaged by an integer factor, matching `downscaled` cameras."""
    if factor == 1:
        return image
    h, w = image.shape[0] // factor, image.shape[1] // factor
    x = image[:h * factor, :w * factor].reshape(h, factor, w, factor, *image.shape[2:])
    return x.mean(axis=(1, 3)).astype(image.dtype)


@dataclass(frozen=True)
class PinholeCamera(_Intrinsics):
    """Ideal pinhole: u = fx x/z + cx, v = fy y/z + cy (pixels)."""

    model: ClassVar[str] = "pinhole"


@dataclass(frozen=True)
class OpenCVCamera(_Intrinsics):
    """OpenCV radial-tangential (k1, k2, p1, p2, k3) model, as cv2.projectPoints.

    Points beyond the radius where the radial polynomial stops being monotonic are
    invalid (they would fold back into the image).
    """

    model: ClassVar[str] = "opencv"
    k1: float = 0.0
    k2: float = 0.0
    p1: float = 0.0
    p2: float = 0.0
    k3: float = 0.0

    @functools.cached_property
    def max_radius(self) -> float:
        """Largest undistorted radius (x/z, y/z plane) where r * radial(r) still increases."""
        r = np.linspace(0, 20, 200001)[1:]
        r2 = r * r
        return _first_fold(r, 1 + 3 * self.k1 * r2 + 5 * self.k2 * r2 ** 2 + 7 * self.k3 * r2 ** 3, float("inf"))

    def _distort(self, x, y):
        r2 = x * x + y * y
        radial = 1 + r2 * (self.k1 + r2 * (self.k2 + r2 * self.k3))
        xd = x * radial + 2 * self.p1 * x * y + self.p2 * (r2 + 2 * x * x)
        yd = y * radial + self.p1 * (r2 + 2 * y * y) + 2 * self.p2 * x * y
        return xd, yd, r2 < self.max_radius ** 2

    def _undistort(self, xd, yd):
        x, y = xd.copy(), yd.copy()
        for _ in range(30):  # Newton on the 2D distortion map, analytic Jacobian
            r2 = x * x + y * y
            radial = 1 + r2 * (self.k1 + r2 * (self.k2 + r2 * self.k3))
            dradial = 2 * (self.k1 + r2 * (2 * self.k2 + 3 * self.k3 * r2))  # d radial / d(r2) * 2
            fx_ = x * radial + 2 * self.p1 * x * y + self.p2 * (r2 + 2 * x * x) - xd
            fy_ = y * radial + self.p1 * (r2 + 2 * y * y) + 2 * self.p2 * x * y - yd
            a = radial + x * x * dradial + 2 * self.p1 * y + 6 * self.p2 * x
            b = x * y * dradial + 2 * self.p1 * x + 2 * self.p2 * y
            c = x * y * dradial + 2 * self.p1 * x + 2 * self.p2 * y
            d = radial + y * y * dradial + 6 * self.p1 * y + 2 * self.p2 * x
            det = a * d - b * c
            det = np.where(np.abs(det) < 1e-12, 1e-12, det)
            x = x - (d * fx_ - b * fy_) / det
            y = y - (a * fy_ - c * fx_) / det
        xr, yr, ok = self._distort(x, y)
        ok &= np.hypot(xr - xd, yr - yd) < 1e-9
        return x, y, ok & np.isfinite(x) & np.isfinite(y)


@dataclass(frozen=True)
class FisheyeCamera(_Intrinsics):
    """OpenCV fisheye (Kannala-Brandt, equidistant): theta_d = theta (1 + k1 t^2 + k2 t^4 + k3 t^6 + k4 t^8).

    theta is the angle to the optical axis; rays up to 89 deg off-axis are supported.
    """

    model: ClassVar[str] = "fisheye"
    k1: float = 0.0
    k2: float = 0.0
    k3: float = 0.0
    k4: float = 0.0

    @functools.cached_property
    def max_theta(self) -> float:
        t = np.linspace(0, FISHEYE_MAX_THETA, 100001)[1:]
        t2 = t * t
        deriv = 1 + t2 * (3 * self.k1 + t2 * (5 * self.k2 + t2 * (7 * self.k3 + 9 * self.k4 * t2)))
        return _first_fold(t, deriv, FISHEYE_MAX_THETA)

    def _theta_d(self, t):
        t2 = t * t
        return t * (1 + t2 * (self.k1 + t2 * (self.k2 + t2 * (self.k3 + t2 * self.k4))))

    def _distort(self, x, y):
        xp = _array_module(x)
        r = (x * x + y * y) ** 0.5
        theta = xp.arctan(r)
        scale = xp.where(r > 1e-12, self._theta_d(theta) / r.clip(min=1e-12), 1.0)
        return x * scale, y * scale, theta < self.max_theta

    def _undistort(self, xd, yd):
        td = np.hypot(xd, yd)
        t = np.minimum(td, self.max_theta)
        for _ in range(30):  # Newton on theta_d(theta) = td
            t2 = t * t
            f = self._theta_d(t) - td
            df = 1 + t2 * (3 * self.k1 + t2 * (5 * self.k2 + t2 * (7 * self.k3 + 9 * self.k4 * t2)))
            t = np.clip(t - f / df, 0.0, self.max_theta)
        ok = (np.abs(self._theta_d(t) - td) < 1e-9) & (t < self.max_theta)
        scale = np.where(td > 1e-12, np.tan(t) / np.maximum(td, 1e-12), 1.0)
        return xd * scale, yd * scale, ok


Camera = Union[PinholeCamera, OpenCVCamera, FisheyeCamera]
CAMERA_MODELS = {c.model: c for c in (PinholeCamera, OpenCVCamera, FisheyeCamera)}


def camera_from_dict(d: dict, where: str = "camera") -> Camera:
    """Inverse of ``camera.to_dict()``; errors name ``where`` and the field."""
    if not isinstance(d, dict) or d.get("model") not in CAMERA_MODELS:
        raise InputError(f"{where}.model: expected one of {sorted(CAMERA_MODELS)}, got "
                         f"{d.get('model') if isinstance(d, dict) else d!r}")
    cls = CAMERA_MODELS[d["model"]]
    names = {f.name for f in fields(cls)}
    unknown = set(d) - names - {"model"}
    if unknown:
        raise InputError(f"{where}: unknown fields {sorted(unknown)} for model {d['model']!r}")
    try:
        return cls(**{k: v for k, v in d.items() if k != "model"})
    except TypeError as e:
        raise InputError(f"{where}: {e}") from None
