"""NVIDIA GPU camera backend through gsplat's public 2DGS building blocks (composed as its ``rasterization_2dgs``
composes them, without its host waits: see `rasterize`).

gsplat compiles its CUDA code on first use, so availability is probed once with a
tiny render and the reason is kept when it fails. Differences from the reference:
gsplat composites values that are constant per surfel, so the depth comes from the sums of
per-surfel planes of inverse hit depth (`hit_depth`: exact where one surfel covers
the pixel, close to the reference's mean where surfels at different depths blend; gsplat's own
expected depth composites the surfels' centre depths); and gsplat has no distortion model, so
distorted cameras are rendered as a pinhole image covering their rays and resampled bilinearly
(approximate, unlike the exact per-ray torch/numba backends).
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import numpy as np
from gsim.errors import InputError, Unavailable

from ..cameras import Camera, PinholeCamera
from ..surfels import Surfels
from ..transforms import invert
from .common import CameraFrame, RenderOptions, centre_depth_only, to_device


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


# the most pixels a distorted camera's pinhole cover may have (gsplat's outputs for it: about 2 GB)
COVER_PIXELS = 32_000_000


@functools.lru_cache(maxsize=16)  # (a frame's host time otherwise: four passes over a 2M-ray table)
def _pinhole_cover(camera: Camera) -> PinholeCamera:
    """A pinhole camera, same focal lengths, whose image covers every ray of ``camera``. A camera whose rays reach
    too far off its axis for that (a wide fisheye: its cover grows as the tangent of its widest ray) is an
    InputError that names the backends that take it."""
    rays = camera.ray_table()
    u, v = rays[..., 0], rays[..., 1]
    umin, umax, vmin, vmax = np.nanmin(u), np.nanmax(u), np.nanmin(v), np.nanmax(v)
    w = int(math.ceil((umax - umin) * camera.fx)) + 4
    h = int(math.ceil((vmax - vmin) * camera.fy)) + 4
    if w * h > COVER_PIXELS:
        widest = math.degrees(math.atan(float(np.nanmax(np.hypot(u, v)))))
        raise InputError(f"gsplat backend: a {type(camera).__name__} of {camera.width}x{camera.height} whose rays "
                         f"reach {widest:.1f} degrees off its axis would render through a {w}x{h} pinhole image "
                         f"({w * h / 1e6:.0f} million pixels, at most {COVER_PIXELS / 1e6:.0f} million): render it "
                         "with backend 'numba' or 'torch', which trace each pixel's ray")
    return PinholeCamera(w, h, camera.fx, camera.fy, -umin * camera.fx + 2, -vmin * camera.fy + 2)


@functools.lru_cache(maxsize=16)
def _cover_grid(camera: Camera, device):
    """(1,H,W,2) where each pixel of ``camera`` falls in its pinhole cover's image (grid_sample's coordinates;
    outside where the model has no ray), on the device: made once per camera, not uploaded a frame at a time."""
    import torch
    rays, pin = camera.ray_table(), _pinhole_cover(camera)
    grid = np.stack([(rays[..., 0] * pin.fx + pin.cx) / pin.width, (rays[..., 1] * pin.fy + pin.cy) / pin.height], -1)
    return to_device(np.nan_to_num(grid * 2 - 1, nan=-2.0)[None], device, torch.float32)


# gsplat's cut-off radius in sigmas (alpha reaches 1/255 there) and its 2D filter's in pixels
CUTOFF_SIGMAS, FILTER_PX = 3.33, 2.35


def depth_channels(means_c, normals, reach, Ks, near: float):
    """What gsplat composites per camera and surfel (C,N,5) for `hit_depth`: the q for which the surfel's hit depth
    z along the ray through the normalised image point (x, y) is 1 / q.(x, y, 1), its plane's q = n / (n.c) (c its
    centre, n its normal, camera frame); then 1 / c_z and c_z (last: gsplat's median depth reads the last channel).
    Where the plane is not what the surfel's pixels see, q is the centre's (0, 0, 1 / c_z): a surfel nearly edge-on
    (its 2D filter covers pixels up to FILTER_PX from the centre, whose plane depths would stray more than half the
    centre's), or reaching the near plane within CUTOFF_SIGMAS of its largest scale ``reach`` (N,) (its plane would
    meet those rays behind the camera). Ks (C,3,3)."""
    import torch
    z = means_c[..., 2]
    nc = (normals * means_c).sum(-1)
    with torch.no_grad():
        focal = torch.minimum(Ks[:, 0, 0], Ks[:, 1, 1])[:, None]
        tilt = torch.sqrt((1.0 - normals[..., 2] ** 2).clamp_min(0.0))  # the largest z of a unit vector in the plane
        plane = (nc.abs() * focal >= 2 * FILTER_PX * z) & (z - CUTOFF_SIGMAS * reach * tilt > near)
        front = z > near
    inv_z = torch.where(front, 1.0 / torch.where(front, z, 1.0), 0.0)  # (behind: culled by gsplat, not rendered)
    q = torch.where(plane[..., None], normals / torch.where(plane, nc, 1.0)[..., None],
                    torch.stack([torch.zeros_like(z), torch.zeros_like(z), inv_z], -1))
    return torch.cat([q, inv_z[..., None], z[..., None]], -1)


def hit_depth(channels, alpha, Ks, size):
    """Depth (C,H,W) from the rendered sums (C,H,W,5) of the surfels' `depth_channels` and the alpha (C,H,W): the
    weighted harmonic mean of the hit depths along each pixel's (centre) ray, H = alpha / sum w q.(x, y, 1), times
    the ratio of the arithmetic to the harmonic mean of the centres' depths. That is the arithmetic mean of the hit
    depths (the reference backends' depth) where the blended surfels' hit depths are one multiple of their centres'
    (one surfel; surfels facing the camera), and H where their centres' depths agree; the harmonic mean alone
    would follow a near surfel's small share (gsplat's 2D filter lights pixels beside one that reaches behind the
    camera). 0 where alpha is 0."""
    import torch
    (width, height), dev, dt = size, channels.device, channels.dtype
    x = (torch.arange(width, device=dev, dtype=dt) + 0.5 - Ks[:, 0, 2, None]) / Ks[:, 0, 0, None]  # (C,W)
    y = (torch.arange(height, device=dev, dtype=dt) + 0.5 - Ks[:, 1, 2, None]) / Ks[:, 1, 1, None]  # (C,H)
    inv = channels[..., 0] * x[:, None, :] + channels[..., 1] * y[:, :, None] + channels[..., 2]
    seen = alpha > 0
    # (each surfel's term is positive by depth_channels' choice: the floor only keeps rounding from dividing by 0)
    den = torch.where(seen, alpha * torch.maximum(inv, alpha * 1e-6), 1.0)
    return torch.where(seen, channels[..., 3] * channels[..., 4] / den, 0.0)


def rasterize(s: Surfels, sh_degree: int, viewmats, Ks, centres, size, bg, options: RenderOptions,
              depth: bool = True):
    """gsplat's 2DGS pipeline, its public building blocks composed as its `rasterization_2dgs` composes them
    (unpacked, 16-pixel tiles, eps2d 0.3, no radius clip), less what makes the host wait for the GPU and what gsim
    does not use: that function inverts the view matrices on the GPU three times (each `torch.linalg.inv` on CUDA
    synchronises: the host then waited for the rasterization itself), for the cameras' centres (here from the
    host's poses), for normals from the depth (unused) and to turn the rendered normals to the world (here they
    stay in the camera frame, where gsim wants them). Its depth channel (the centres' depths) is replaced by the
    five of `depth_channels` (8 channels in all, a size gsplat's kernels take as they are), and the pixels are
    rasterized through `rasterize_pixels` (no wait in its backward). The one wait left is gsplat's tile
    intersection reading its intersection count. ``s``: float32 surfels on the GPU; viewmats
    (C,4,4), Ks (C,3,3), centres (C,3), bg (3,) rgb. Returns rgb (C,H,W,3), depth (C,H,W) (`hit_depth`; None
    without ``depth``: 3 channels composited instead of 8), alpha (C,H,W,1), and the alpha-weighted camera-frame
    normals (C,H,W,3)."""
    import torch
    from gsplat import fully_fused_projection_2dgs, isect_offset_encode, isect_tiles, spherical_harmonics
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
    colors, bgs = torch.clamp_min(rgb + 0.5, 0.0), bg  # (gsplat's SH offset)
    if depth:
        means_c = torch.einsum("cij,nj->cni", viewmats[:, :3, :3], s.means) + viewmats[:, None, :3, 3]
        colors = torch.cat([colors, depth_channels(means_c, normals, s.scales.max(1).values, Ks, options.near)], -1)
        bgs = torch.cat([bg, bg.new_zeros(5)])
    densify = torch.zeros_like(means2d)  # (gsplat's screen-space gradient slot: unused, so no graph kept for it)
    out, alphas, normals = rasterize_pixels(means2d, ray_transforms, colors, s.opacities[None].expand(C, -1), normals,
                                            densify, width, height, tile, offsets, flatten_ids, bgs[None].expand(C, -1))
    return out[..., :3], hit_depth(out[..., 3:], alphas[..., 0], Ks, size) if depth else None, alphas, normals


def rasterize_pixels(means2d, ray_transforms, colors, opacities, normals, densify, width: int, height: int, tile: int,
                     offsets, flatten_ids, backgrounds):
    """gsplat's `rasterize_to_pixels_2dgs` as gsim calls it (unpacked, no tile masks, no absgrad, distortion or
    median outputs; 3 or 8 channels, which its kernels take as they are): its forward and backward kernels through
    an autograd Function of gsim's own, because gsplat 1.5.3's ends its backward with `torch.cuda.synchronize()`:
    the host waited there for the GPU once a training step (10 ms of a 39 ms step on an H200). Returns the colours
    (C,H,W,ch), alphas (C,H,W,1) and alpha-weighted normals (C,H,W,3)."""
    contiguous = [x.contiguous() for x in (means2d, ray_transforms, colors, opacities, normals, densify, backgrounds)]
    return _pixels_function().apply(*contiguous, int(width), int(height), int(tile), offsets.contiguous(),
                                    flatten_ids.contiguous())


@functools.lru_cache(maxsize=1)
def _pixels_function():
    """The Function behind `rasterize_pixels` (made on first use: torch and gsplat load lazily here)."""
    import torch
    from gsplat.cuda._wrapper import _make_lazy_cuda_func as kernel  # gsplat 1.5.3's kernels, its argument order

    class Pixels2DGS(torch.autograd.Function):
        @staticmethod
        def forward(ctx, means2d, ray_transforms, colors, opacities, normals, densify, backgrounds, width, height,
                    tile, offsets, flatten_ids):
            out, alphas, out_normals, _, _, last_ids, median_ids = kernel("rasterize_to_pixels_2dgs_fwd")(
                means2d, ray_transforms, colors, opacities, normals, backgrounds, None, width, height, tile, offsets,
                flatten_ids)
            ctx.save_for_backward(means2d, ray_transforms, colors, opacities, normals, densify, backgrounds, offsets,
                                  flatten_ids, out, alphas, last_ids, median_ids)
            ctx.size = (width, height, tile)
            return out, alphas.float(), out_normals

        @staticmethod
        def backward(ctx, v_out, v_alphas, v_normals):
            (means2d, ray_transforms, colors, opacities, normals, densify, backgrounds, offsets, flatten_ids, out,
             alphas, last_ids, median_ids) = ctx.saved_tensors
            unused = torch.zeros_like(alphas, dtype=v_alphas.dtype)  # (the distortion's and median's: not outputs)
            _, v_means2d, v_ray_transforms, v_colors, v_opacities, v_normals_in, v_densify = kernel(
                "rasterize_to_pixels_2dgs_bwd")(
                means2d, ray_transforms, colors, opacities, normals, densify, backgrounds, None, *ctx.size, offsets,
                flatten_ids, out, alphas, last_ids, median_ids, v_out.contiguous(), v_alphas.contiguous(),
                v_normals.contiguous(), unused, unused, False)
            v_backgrounds = (v_out * (1.0 - alphas).float()).sum(dim=(-3, -2)) if ctx.needs_input_grad[6] else None
            return (v_means2d, v_ray_transforms, v_colors, v_opacities, v_normals_in, v_densify, v_backgrounds,
                    None, None, None, None, None)

    return Pixels2DGS


def render(surfels: Surfels, camera: Camera, T_world_camera: np.ndarray, options: RenderOptions) -> CameraFrame:
    return render_batch(surfels, [camera], [T_world_camera], options)[0]


def render_batch(surfels: Surfels, cameras: Sequence[Camera], poses: Sequence[np.ndarray],
                 options: RenderOptions, rgb_only: bool = False) -> list:
    """Several cameras of one surfel set: the cameras whose (pinhole, or pinhole cover) images share a size in one
    rasterization call (gsplat takes a batch of view matrices). Outputs stay on the GPU. ``rgb_only``: (rgb, alpha)
    pairs instead of frames, no depth or normals made (what a camera sensor gives: 3 channels composited, not 8)."""
    centre_depth_only(options, "gsplat")
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
    bg = to_device(np.asarray(options.background), dev, dt)
    pins = [c if isinstance(c, PinholeCamera) else _pinhole_cover(c) for c in cameras]
    T_world_camera = np.stack([np.asarray(T, np.float64) for T in poses])
    views = invert(T_world_camera)  # gsplat's view matrices: world to camera
    frames: list = [None] * len(cameras)
    for size in dict.fromkeys((p.width, p.height) for p in pins):
        idx = [i for i, p in enumerate(pins) if (p.width, p.height) == size]
        rgb, depth, alphas, normals = rasterize(s, surfels.sh_degree, to_device(views[idx], dev, dt),
                                                to_device(np.stack([pins[i].K for i in idx]), dev, dt),
                                                to_device(T_world_camera[idx, :3, 3], dev, dt), size, bg, options,
                                                not rgb_only)
        for b, i in enumerate(idx):
            alpha = alphas[b, ..., 0]
            img = torch.cat([rgb[b], alpha[..., None]], -1)
            if not rgb_only:
                normal = torch.where((alpha > 0)[..., None], normals[b] / alpha.clamp_min(1e-10)[..., None], 0.0)
                img = torch.cat([img, depth[b, ..., None], normal], -1)
            camera, pin = cameras[i], pins[i]
            if pin is not camera:  # resample the cover image at each pixel's ray
                img = F.grid_sample(img.permute(2, 0, 1)[None], _cover_grid(camera, dev), align_corners=False)
                img = img[0].permute(1, 2, 0)
            frames[i] = (img[..., :3], img[..., 3]) if rgb_only else \
                CameraFrame(rgb=img[..., :3], alpha=img[..., 3], depth=img[..., 4], normal=img[..., 5:8])
    return frames
