"""`Renderer`: a scene put on a device once and rendered many times (the closed loop, the server, evaluation).

`gsim.render_camera` and `gsim.render_lidar` take a numpy scene and give numpy outputs: right for one image, but
on a GPU every call would upload the surfels and download every output. A `Renderer` keeps the scene where its
renderer reads it:
- device path (backend "gsplat" on CUDA; "torch" on any torch device, the reference that tests this path on a
  CPU): the background and every actor's surfels (in its box frame, concatenated once) are float32 tensors on
  the device, and so are the sky and the appearance affines. A call composes the actors' poses at its time there
  (`move_rows`: means, quaternions, view-dependent colour), renders the cameras of that time, those that share an
  image size in one batched gsplat call, adds the sky and the camera's affine there, and leaves the outputs on the
  device unless ``numpy`` is asked for. LiDAR sweeps go to the CUDA kernel (lidar.kernel_cuda), whose copy of the
  surfels is kept with the scene's own surfel sets (a scene whose actors move keeps its surfel sets).
- host path (backend "numba"): numba reads the scene's numpy arrays where they are; `cameras` and `lidar` give
  exactly what `render_camera` and `render_lidar` give.
Neither path takes a rolling-shutter camera (``readout_us``): that stays with `render_camera`. The device path
renders actors at full detail (no level of detail: the GPU has the room).
"""
from __future__ import annotations

from dataclasses import replace
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .errors import InputError
from .render import BACKENDS, pick_backend, render_camera, scene_options
from .render.common import CameraFrame, RenderOptions, frame_to_numpy, to_device
from .scene import Scene
from .surfels import Surfels, move_rows
from .transforms import check_pose, rotmat_to_quat

View = Tuple[object, np.ndarray, Optional[str]]  # (camera, T_world_camera, log camera name or None)


class Renderer:
    """A scene resident on a device. backend: "auto" (gsplat where CUDA and gsplat work and the scene is not
    composited as surfaces, `Scene.surface_eps`; else numba), "gsplat",
    "numba" or "torch"; device: the torch device of the torch backend (gsplat: "cuda"; numba: the host)."""

    def __init__(self, scene: Scene, backend: str = "auto", device: Optional[str] = None):
        if not isinstance(scene, Scene):
            raise TypeError(f"Renderer: expected a Scene, got {type(scene).__name__}")
        # (an unknown or unavailable one: its error; "auto" for a scene of surfaces: not gsplat, which refuses them)
        self.backend = pick_backend(backend, scene.background, bool(scene.surface_eps)).name
        self.device = "cpu"
        if self.backend != "numba":
            import torch
            self.device = torch.device("cuda" if self.backend == "gsplat" else (device or "cpu"))
        self._sets = {}  # id(a numpy surfel set) -> (the set, its camera surfels on the device)
        self._key = None  # the ids of the surfel sets the device's concatenation holds
        self._rays = {}  # camera -> (H,W,3) unit ray directions in the camera frame, on the device
        self.scene = None
        self.update(scene)

    @property
    def lidar_backend(self) -> str:
        """The LiDAR kernel for this renderer's device (`gsim.lidar.render.lidar_backend_on`: the CUDA one on a
        GPU where numba-cuda runs, else numba, on a GPU with a warning that says why)."""
        from gsim.lidar.render import lidar_backend_on  # (the LiDAR layer sits above core: loaded on use)
        return lidar_backend_on(self.device)

    @property
    def lidar_beside_cameras(self) -> bool:
        """Whether a LiDAR sweep may render in another thread while this renderer's cameras render: on the GPU
        (gsplat runs no numba CPU kernel, so only the sweep's thread uses numba's threading layer; the host's
        Python of one overlaps the GPU work of the other), or where numba's threading layer runs parallel kernels
        from two threads at once (omp and tbb do; the workqueue layer aborts the process)."""
        if self.backend == "gsplat":
            return True
        import numba
        try:
            return numba.threading_layer() in ("omp", "tbb")
        except ValueError:  # no parallel kernel has run yet: the layer is not chosen
            return False

    def update(self, scene: Scene) -> None:
        """Render ``scene`` from now on. Surfel sets already on the device (the same Surfels objects: a closed
        loop's actors on new tracks, its vehicles that stay) are not uploaded again: the device concatenates what
        it has; the sky and the affines are uploaded when they are other objects."""
        if not isinstance(scene, Scene):
            raise TypeError(f"Renderer: expected a Scene, got {type(scene).__name__}")
        old, self.scene = self.scene, scene
        self._at = (None, None)  # the last time's world-frame surfels
        if self.backend == "numba":
            return
        import torch
        dt = torch.float32
        parts = [scene.background] + [a.surfels for a in scene.actors]
        key = tuple(id(p) for p in parts)
        if key != self._key:
            # (LiDAR features are no camera's business: actors without them join a background with them)
            up = lambda p: Surfels.derived(p.means, p.quats, p.scales, p.opacities, p.colors).torch(  # noqa: E731
                device=self.device, dtype=dt)
            self._sets = {id(p): self._sets.get(id(p)) or (p, up(p.numpy())) for p in parts}
            self._surfels = Surfels.concatenate([self._sets[id(p)][1] for p in parts])
            owner = np.repeat(np.arange(-1, len(scene.actors)), [len(p.means) for p in parts])
            self._rows = torch.as_tensor(np.nonzero(owner >= 0)[0], device=self.device)
            self._owner = torch.as_tensor(owner[owner >= 0], device=self.device)
            self._key = key
        if old is None or scene.sky is not old.sky:
            from .appearance import Sky
            self._sky = None if scene.sky is None else Sky(torch.as_tensor(np.asarray(scene.sky.envmap), dtype=dt,
                                                                           device=self.device))
        if old is None or scene.appearance is not old.appearance:
            self._affine = {k: torch.as_tensor(v, dtype=dt, device=self.device) for k, v in scene.appearance.items()}

    def surfels_at(self, timestamp_us: Optional[int]) -> Surfels:
        """World-frame surfels on the device at ``timestamp_us`` (kept for the next call at the same time)."""
        if not self.scene.actors:
            return self._surfels
        if timestamp_us is None:
            raise InputError("Renderer: this scene has actors; give timestamp_us (integer microseconds)")
        if self._at[0] != int(timestamp_us):
            import torch
            P = np.stack([a.pose_at(int(timestamp_us)) for a in self.scene.actors])
            on = lambda x: to_device(x, self.device, torch.float32)  # noqa: E731
            moved = move_rows(self._surfels, self._rows, self._owner, on(P[:, :3, :3]), on(P[:, :3, 3]),
                              on(rotmat_to_quat(P[:, :3, :3])))
            self._at = (int(timestamp_us), moved)
        return self._at[1]

    def cameras(self, views: Sequence[View], timestamp_us: Optional[int] = None,
                options: Optional[RenderOptions] = None, numpy: bool = False) -> List[CameraFrame]:
        """The views (camera, T_world_camera, log camera name or None for its appearance affine) at one time, as
        `render_camera` renders them: torch tensors on the device (numpy arrays on the host path, or with
        ``numpy``)."""
        views = _checked(views)
        if self.backend == "numba":
            return [render_camera(self.scene, c, T, "numba", timestamp_us, options, n) for c, T, n in views]
        options = scene_options(self.scene, options)
        s = self.surfels_at(timestamp_us)
        if self.backend == "gsplat":
            from .render.gsplat_backend import render_batch
            frames = render_batch(s, [c for c, _, _ in views], [T for _, T, _ in views], options)
        else:
            frames = [BACKENDS[self.backend].render(s, c, T, options) for c, T, _ in views]
        frames = [replace(f, rgb=self._composed(f.rgb, f.alpha, c, T, n)) for f, (c, T, n) in zip(frames, views)]
        return [frame_to_numpy(f) for f in frames] if numpy else frames

    def images(self, views: Sequence[View], timestamp_us: Optional[int] = None,
               options: Optional[RenderOptions] = None) -> List[np.ndarray]:
        """The views' colour images as a camera gives them, (H,W,3) uint8 numpy (`cameras`' rgb, 8 bits): on the
        GPU rendered without depth or normals (gsplat composites 3 channels a pixel instead of 8) and brought
        back in one copy per image size."""
        from .io import to_uint8
        if self.backend != "gsplat":
            return [to_uint8(f.rgb) for f in self.cameras(views, timestamp_us, options)]
        import torch

        from .render.gsplat_backend import render_batch
        views = _checked(views)
        pairs = render_batch(self.surfels_at(timestamp_us), [c for c, _, _ in views], [T for _, T, _ in views],
                             scene_options(self.scene, options), rgb_only=True)
        rgb = [self._composed(x, a, c, T, n) for (x, a), (c, T, n) in zip(pairs, views)]
        out: List[Optional[np.ndarray]] = [None] * len(rgb)
        for shape in dict.fromkeys(x.shape for x in rgb):
            idx = [i for i, x in enumerate(rgb) if x.shape == shape]
            for i, img in zip(idx, to_uint8(torch.stack([rgb[i] for i in idx]))):
                out[i] = img
        return out

    def camera(self, camera, T_world_camera, timestamp_us: Optional[int] = None, sensor: Optional[str] = None,
               options: Optional[RenderOptions] = None, numpy: bool = False) -> CameraFrame:
        """One view (see `cameras`)."""
        return self.cameras([(camera, T_world_camera, sensor)], timestamp_us, options, numpy)[0]

    def lidar(self, spec, T_world_lidar, timestamp_us: Optional[int] = None, hit_alpha: float = 0.5,
              rolling: bool = True):
        """`gsim.render_lidar` of the scene: the CUDA kernel on the GPU paths, numba on the host (numpy out)."""
        from gsim.lidar import render_lidar  # the LiDAR layer, loaded on first use (core sits below it)
        return render_lidar(self.scene, spec, T_world_lidar, self.lidar_backend, timestamp_us, hit_alpha, rolling)

    def _composed(self, rgb, alpha, camera, T: np.ndarray, sensor: Optional[str]):
        """`render_camera`'s sky and appearance affine over rgb (H,W,3) with alpha (H,W), on the device."""
        from .appearance import compose
        affine = self._affine.get(sensor) if sensor is not None else None
        if self._sky is None and affine is None:
            return rgb
        dirs = None
        if self._sky is not None:
            import torch
            if camera not in self._rays:
                from .appearance import camera_ray_directions
                self._rays[camera] = to_device(camera_ray_directions(camera, np.eye(4)), self.device)
            dirs = self._rays[camera] @ to_device(T[:3, :3].T, self.device, torch.float32)
        return compose(rgb, alpha, self._sky, dirs, affine).clamp(0, 1)


def _checked(views: Sequence[View]) -> list:
    """The views with their poses checked (`check_pose`), each named by its place in the list."""
    return [(c, check_pose(T, f"views[{i}] T_world_camera"), n) for i, (c, T, n) in enumerate(views)]
