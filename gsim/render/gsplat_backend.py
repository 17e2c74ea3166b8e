"""NVIDIA GPU camera backend through gsplat's public 2DGS building blocks (composed as its ``rasterization_2dgs``
composes them, without its host waits: see `rasterize`).

gsplat compiles its CUDA code on first use, so availability is probed once with a
tiny render and the reason is kept when it fails. Differences from the reference,
both gsplat's own choices: its expected depth composites each surfel's centre depth
(not the per-pixel hit depth), and it has no distortion model, so distorted cameras
are rendered as a pinhole image covering their rays and resampled bilinearly
(approximate, unlike the exact per-ray torch/numba backends).
"""
from __future__ import annotations

import functools
import math
from typing import List, Optional, Sequence

import numpy as np
from gsim.errors import Unavailable

from ..cameras import Camera, PinholeCamera
from ..surfels import Surfels
from ..transforms import invert
from .common import CameraFrame, RenderOptions, to_device


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> Optional[str]:
    """None when gsplat renders on this machine, else why not."""
    try:
        import torch
    except ImportError as e:
        return f"torch is not importable ({e})"
    if not torch.cuda.is_available():
        return "CUDA is not available (torch.cuda.is_available() is False)"
    try:
        import gsplat
    except ImportError as e:
        return f"gsplat is not installed ({e}); install it with pip install 'gsim[cuda]'"
    try:
        dev = "cuda"
        gsplat.rasterization_2dgs(
            torch.zeros(1, 3, device=dev) + torch.tensor([0.0, 0.0, 2.0], device=dev),
            torch.tensor([[1.0, 0, 0, 0]], device=dev), torch.full((1, 3), 0.1, device=dev),
            # colours as SH coefficients (N,K,3), as `render` passes them: gsplat 1.5.3 takes plain (N,D)
            # colours only per camera, (C,N,D)
            torch.ones(1, device=dev) * 0.5, torch.ones(1, 1, 3, device=dev), torch.eye(4, device=dev)[None],
            torch.tensor([[[10.0, 0, 8], [0, 10.0, 8], [0, 0, 1]]], device=dev), 16, 16, sh_degree=0)
        torch.cuda.synchronize()
    except Exception as e:  # compilation or launch failure: report it, do not fall back silently
        return f"gsplat failed to run its CUDA kernels: {type(e).__name__}: {e}"
    return None


@functools.lru_cache(maxsize=16)  # (a frame's host time otherwise: four passes over a 2M-ray table)
def _pinhole_cover(camera: Camera) -> PinholeCamera:
    """A pinhole camera, same focal lengths, whose image covers every ray of ``camera``."""
    rays = camera.ray_table()
    u, v = rays[..., 0], rays[..., 1]
    umin, umax, vmin, vmax = np.nanmin(u), np.nanmax(u), np.nanmin(v), np.nanmax(v)
    w = int(math.ceil((umax - umin) * camera.fx)) + 4
    h = int(math.ceil((vmax - vmin) * camera.fy)) + 4
    return PinholeCamera(w, h, camera.fx, camera.fy, -umin * camera.fx + 2, -vmin * camera.fy + 2)


@functools.lru_cache(maxsize=16)
def _cover_grid(camera: Camera, device):
    """(1,H,W,2) where each pixel of ``camera`` falls in its pinhole cover's image (grid_sample's coordinates;
    outside where the model has no ray), on the device: made once per camera, not uploaded a frame at a time."""
    import torch
    rays, pin = camera.ray_table(), _pinhole_cover(camera)
    grid = np.stack([(rays[..., 0] * pin.fx + pin.cx) / pin.width, (rays[..., 1] * pin.fy + pin.cy) / pin.height], -1)
    return to_device(np.nan_to_num(grid * 2 - 1, nan=-2.0)[None], device, torch.float32)


def rasterize(s: Surfels, sh_degree: int, viewmats, Ks, centres, size, bg, options: RenderOptions):
    """gsplat's 2DGS pipeline, its public building blocks composed as its `rasterization_2dgs` composes them for
    render_mode "RGB+ED" (unpacked, 16-pixel tiles, eps2d 0.3, no radius clip), less what makes the host wait for
    the GPU and what gsim does not use: that function inverts the view matrices on the GPU three times (each
    `torch.linalg.inv` on CUDA synchronises: the host then waited for the rasterization itself), for the cameras'
    centres (here from the host's poses), for normals from the depth (unused) and to turn the rendered normals to
    the world (here they stay in the camera frame, where gsim wants them). The one wait left is gsplat's tile
    intersection reading its intersection count. ``s``: float32 surfels on the GPU; viewmats (C,4,4), Ks (C,3,3),
    centres (C,3), bg (4,) rgb and depth. Returns rgb and expected depth (C,H,W,4), alpha (C,H,W,1), and the
    alpha-weighted camera-frame normals (C,H,W,3)."""
    import torch
    from gsplat import (fully_fused_projection_2dgs, isect_offset_encode, isect_tiles, rasterize_to_pixels_2dgs,
                        spherical_harmonics)
    (width, height), C, tile = size, len(viewmats), 16
    scales3 = torch.cat([s.scales, torch.ones_like(s.scales[:, :1])], 1)  # gsplat ignores the 3rd
    radii, means2d, depths, ray_transforms, normals = fully_fused_projection_2dgs(
        s.means, s.quats, scales3, viewmats, Ks, width, height, eps2d=0.3, near_plane=options.near,
        far_plane=options.far, radius_clip=0.0, packed=False)
    tiles_w, tiles_h = math.ceil(width / tile), math.ceil(height / tile)
    _, isect_ids, flatten_ids = isect_tiles(means2d, radii, depths, tile, tiles_w, tiles_h, packed=False)
    offsets = isect_offset_encode(isect_ids, C, tiles_w, tiles_h).reshape(C, tiles_h, tiles_w)
    rgb = spherical_harmonics(sh_degree, s.means[None] - centres[:, None], s.colors[None].expand(C, -1, -1, -1),
                              masks=(radii > 0).all(dim=-1))
    colors = torch.cat([torch.clamp_min(rgb + 0.5, 0.0), depths[..., None]], -1)  # (gsplat's SH offset)
    densify = torch.zeros_like(means2d, requires_grad=True)  # (gsplat's screen-space gradient slot: unused here)
    out, alphas, normals, _, _ = rasterize_to_pixels_2dgs(
        means2d, ray_transforms, colors, s.opacities[None].expand(C, -1), normals, densify, width, height, tile,
        offsets, flatten_ids, backgrounds=bg[None].expand(C, -1))
    return torch.cat([out[..., :3], out[..., 3:4] / alphas.clamp(min=1e-10)], -1), alphas, normals


def render(surfels: Surfels, camera: Camera, T_world_camera: np.ndarray, options: RenderOptions) -> CameraFrame:
    return render_batch(surfels, [camera], [T_world_camera], options)[0]


def render_batch(surfels: Surfels, cameras: Sequence[Camera], poses: Sequence[np.ndarray],
                 options: RenderOptions) -> List[CameraFrame]:
    """Several cameras of one surfel set: the cameras whose (pinhole, or pinhole cover) images share a size in one
    rasterization call (gsplat takes a batch of view matrices). Outputs stay on the GPU."""
    if options.distortion:
        # gsplat's render_distort is another loss: L1 of centre depths in metres, not 2DGS's squared
        # form of the per-pixel hit depths that CameraFrame.distortion is (see common.CameraFrame)
        raise NotImplementedError("gsplat backend: RenderOptions(distortion=True) is not supported (gsplat's "
                                  "render_distort is a different definition); use the torch or numba backend")
    import torch
    import torch.nn.functional as F

    reason = unavailable_reason()
    if reason is not None:
        raise Unavailable(f"gsplat backend not available: {reason}")
    s = surfels.torch(device="cuda", dtype=torch.float32)  # gsplat's kernels take float32; keeps autograd
    dev, dt = s.means.device, s.means.dtype
    bg = to_device(np.append(options.background, 0.0), dev, dt)  # (the depth channel's background: 0)
    pins = [c if isinstance(c, PinholeCamera) else _pinhole_cover(c) for c in cameras]
    T_world_camera = np.stack([np.asarray(T, np.float64) for T in poses])
    views = invert(T_world_camera)  # gsplat's view matrices: world to camera
    frames: List[Optional[CameraFrame]] = [None] * len(cameras)
    for size in dict.fromkeys((p.width, p.height) for p in pins):
        idx = [i for i, p in enumerate(pins) if (p.width, p.height) == size]
        colors, alphas, normals = rasterize(s, surfels.sh_degree, to_device(views[idx], dev, dt),
                                            to_device(np.stack([pins[i].K for i in idx]), dev, dt),
                                            to_device(T_world_camera[idx, :3, 3], dev, dt), size, bg, options)
        for b, i in enumerate(idx):
            alpha = alphas[b, ..., 0]
            normal = torch.where((alpha > 0)[..., None], normals[b] / alpha.clamp_min(1e-10)[..., None], 0.0)
            img = torch.cat([colors[b, ..., :3], alpha[..., None], colors[b, ..., 3:4], normal], -1)
            camera, pin = cameras[i], pins[i]
            if pin is not camera:  # resample the cover image at each pixel's ray
                img = F.grid_sample(img.permute(2, 0, 1)[None], _cover_grid(camera, dev), align_corners=False)
                img = img[0].permute(1, 2, 0)
            frames[i] = CameraFrame(rgb=img[..., :3], alpha=img[..., 3], depth=img[..., 4], normal=img[..., 5:8])
    return frames
