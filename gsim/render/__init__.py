"""Camera rendering: one protocol, a registry of backends, and `render_camera`.

A backend is a function ``render(surfels, camera, T_world_camera, options) -> CameraFrame``
plus a probe that says why it cannot run here (None when it can).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Union

import numpy as np

from ..cameras import FisheyeCamera, OpenCVCamera, PinholeCamera
from ..errors import InputError, Unavailable
from ..scene import Scene, world_surfels
from ..surfels import Surfels
from ..transforms import check_pose, interpolate_pose
from .common import CameraFrame, RenderOptions, frame_to_numpy, map_frame, resolve_options


def _always() -> Optional[str]:
    return None


def _numba_reason() -> Optional[str]:
    try:
        import numba  # noqa: F401
    except ImportError as e:
        return f"numba is not installed ({e})"
    return None


def _gsplat_reason() -> Optional[str]:
    from .gsplat_backend import unavailable_reason
    return unavailable_reason()


@dataclass(frozen=True)
class Backend:
    name: str
    module: str  # imported lazily: gsim --help and gsim.info stay fast
    probe: Callable[[], Optional[str]]
    differentiable: bool
    takes_parts: bool = False  # renders `Scene.placed` parts (actors in their own frames) without a copy

    def render(self, surfels, camera, T_world_camera, options) -> CameraFrame:
        return importlib.import_module(self.module, __name__).render(surfels, camera, T_world_camera, options)


BACKENDS: Dict[str, Backend] = {
    "torch": Backend("torch", ".torch_backend", _always, True),
    "numba": Backend("numba", ".numba_backend", _numba_reason, True, takes_parts=True),  # CPU tensors
    "gsplat": Backend("gsplat", ".gsplat_backend", _gsplat_reason, True),
}


def backend_report() -> Dict[str, str]:
    """Each backend's status: 'available' or the reason it is not."""
    return {name: (b.probe() or "available") for name, b in BACKENDS.items()}


def available_backends() -> List[str]:
    """Names of the camera backends that can render on this machine."""
    return [name for name, b in BACKENDS.items() if b.probe() is None]


def pick_backend(backend: str, surfels: Surfels, surfaces: bool = False) -> Backend:
    """The backend that renders ``surfels``: the one named (Unavailable where its probe fails), or for "auto"
    gsplat where it runs, else numba (the torch reference for tensors that need gradients off the CPU); with
    ``surfaces`` (`RenderOptions.surface_eps`), which gsplat does not composite, not gsplat."""
    if backend == "auto":
        if not surfaces and BACKENDS["gsplat"].probe() is None:
            return BACKENDS["gsplat"]
        needs_grad = surfels.is_torch and any(getattr(x, "requires_grad", False) for x in surfels.arrays().values())
        # numba's backward runs on the CPU; tensors elsewhere take the torch reference
        return BACKENDS["torch" if needs_grad and surfels.means.device.type != "cpu" else "numba"]
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}; choose one of {['auto', *BACKENDS]}")
    b = BACKENDS[backend]
    reason = b.probe()
    if reason is not None:
        raise Unavailable(f"backend {backend!r} is not available: {reason}")
    return b


def scene_options(scene: Scene, options: Optional[RenderOptions]) -> RenderOptions:
    """``options`` for drawing ``scene``: its surfels composited as they were fitted (`Scene.surface_eps`)."""
    options = resolve_options(options)
    return replace(options, surface_eps=scene.surface_eps) if scene.surface_eps else options


ROLLING_SHUTTER_BANDS = 16  # bands of rows of a rolling-shutter image, each rendered at its own pose and time


def render_camera(scene_or_surfels: Union[Scene, Surfels],
                  camera: Union[PinholeCamera, OpenCVCamera, FisheyeCamera],
                  T_world_camera, backend: str = "auto", timestamp_us: Optional[int] = None,
                  options: Optional[RenderOptions] = None, sensor: Optional[str] = None,
                  readout_us: int = 0) -> CameraFrame:
    """Render a camera image of a scene (at ``timestamp_us``) or of world-frame surfels.

    ``T_world_camera`` maps OpenCV camera-frame points to world points (4x4), or is a trajectory
    (timestamps_us (K,), poses (K,4,4)) interpolated at the exposure time. ``readout_us`` > 0: a rolling
    shutter whose rows are exposed from ``timestamp_us`` (row 0) to ``timestamp_us + readout_us`` (the last
    row); the image is rendered in `ROLLING_SHUTTER_BANDS` bands of rows, each exactly (a cropped camera) at
    the camera pose and actor poses of its middle row's time. A scene's image is its
    surfels over its sky (where it has one), through the appearance affine of the log camera ``sensor``
    (where given and the scene has one), clipped to [0, 1]; alpha and depth are the surfels'. Returns a
    `CameraFrame`; its arrays are torch tensors when the surfels are tensors (differentiable
    with every backend but numba on non-CPU tensors), numpy arrays otherwise.
    """
    if not isinstance(camera, (PinholeCamera, OpenCVCamera, FisheyeCamera)):
        raise TypeError(f"render_camera: expected a gsim camera model, got {type(camera).__name__}")
    if not isinstance(readout_us, (int, np.integer)) or readout_us < 0:
        raise InputError(f"render_camera: readout_us must be an integer >= 0 microseconds, got {readout_us!r}")
    if readout_us or isinstance(T_world_camera, tuple):
        return _rolling(scene_or_surfels, camera, T_world_camera, backend, timestamp_us, options, sensor, readout_us)
    T = check_pose(T_world_camera, "T_world_camera")
    options = resolve_options(options)
    if isinstance(scene_or_surfels, Scene):  # actors with a level of detail: as many surfels as this view needs
        options = scene_options(scene_or_surfels, options)
        parts = scene_or_surfels.placed(timestamp_us, eye=T[:3, 3], focal_px=float(camera.fx))
        surfels = parts[0].surfels
        b = pick_backend(backend, surfels, bool(options.surface_eps))
        if len(parts) == 1:
            what = surfels
        elif b.takes_parts and not options.distortion:
            what = parts
        else:
            what = surfels = world_surfels(parts)
    elif isinstance(scene_or_surfels, Surfels):
        what = surfels = scene_or_surfels
        b = pick_backend(backend, surfels, bool(options.surface_eps))
    else:
        raise TypeError(f"render_camera: expected a Scene or Surfels, got {type(scene_or_surfels).__name__}")
    frame = b.render(what, camera, T, options)
    if isinstance(scene_or_surfels, Scene):
        frame = _composed(frame, scene_or_surfels, camera, T, sensor)
    if not surfels.is_torch:
        return frame_to_numpy(frame)
    if hasattr(frame.rgb, "detach"):
        return frame
    import torch
    return map_frame(frame, lambda x: torch.as_tensor(np.ascontiguousarray(x), device=surfels.means.device))


def _rolling(scene_or_surfels, camera, trajectory, backend, timestamp_us, options, sensor, readout_us) -> CameraFrame:
    """`render_camera` with a pose trajectory or a rolling shutter: bands of rows, each a cropped camera."""
    if isinstance(trajectory, tuple):
        if len(trajectory) != 2:
            raise InputError("render_camera: a trajectory T_world_camera is (timestamps_us (K,), poses (K,4,4))")
        ts, poses = np.asarray(trajectory[0]), np.asarray(trajectory[1], np.float64)
        if ts.ndim != 1 or len(ts) == 0 or ts.dtype.kind not in "iu" or np.any(np.diff(ts) <= 0) \
                or poses.shape != (len(ts), 4, 4):
            raise InputError("render_camera: a trajectory T_world_camera needs strictly increasing integer "
                             f"timestamps_us (K,) and poses (K,4,4), got {ts.shape} {ts.dtype} and {poses.shape}")
        for i, P in enumerate(poses):
            check_pose(P, f"T_world_camera poses[{i}]")
        if timestamp_us is None:
            raise InputError("render_camera: a trajectory T_world_camera needs timestamp_us (the exposure's start)")
    else:
        ts, poses = np.zeros(1, np.int64), check_pose(trajectory, "T_world_camera")[None]
    t0 = 0 if timestamp_us is None else int(timestamp_us)
    if not readout_us:
        return render_camera(scene_or_surfels, camera, interpolate_pose(ts, poses, t0), backend, timestamp_us,
                             options, sensor)
    edges = np.linspace(0, camera.height, min(ROLLING_SHUTTER_BANDS, camera.height) + 1).round().astype(int)
    bands = []
    for r0, r1 in zip(edges[:-1], edges[1:]):
        t = t0 + int(round(readout_us * (r0 + r1) / (2 * camera.height)))
        band = replace(camera, height=int(r1 - r0), cy=camera.cy - float(r0))
        bands.append(render_camera(scene_or_surfels, band, interpolate_pose(ts, poses, t), backend,
                                   None if timestamp_us is None else t, options, sensor))
    cat = np.concatenate
    if hasattr(bands[0].rgb, "detach"):
        import torch
        cat = torch.cat
    return CameraFrame(**{k: None if getattr(bands[0], k) is None else cat([getattr(b, k) for b in bands])
                          for k in ("rgb", "alpha", "depth", "normal", "distortion")})


def _composed(frame: CameraFrame, scene: Scene, camera, T_world_camera: np.ndarray, sensor: Optional[str]) -> CameraFrame:
    """The frame's rgb over the scene's sky and through the camera's appearance affine (see `render_camera`)."""
    affine = scene.appearance.get(sensor) if sensor is not None else None
    if scene.sky is None and affine is None:
        return frame
    from ..appearance import camera_ray_directions, compose
    rgb = compose(frame.rgb, frame.alpha, scene.sky, camera_ray_directions(camera, T_world_camera), affine)
    return replace(frame, rgb=rgb.clamp(0, 1) if hasattr(rgb, "clamp") else np.clip(rgb, 0, 1))
