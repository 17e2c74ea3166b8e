"""Reconstruction losses (torch; images (H,W,3) in [0,1], depth in metres); the image metrics (psnr, ssim) are
gsim.images'."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from gsim.images import psnr, ssim  # noqa: F401  (psnr: the trainer's metric, as losses.psnr)


def photometric(rgb: torch.Tensor, target: torch.Tensor, ssim_weight: float,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(1 - w) L1 + w D-SSIM, with D-SSIM = 1 - SSIM (the 3DGS loss); with a (H,W) ``mask`` in [0,1], both
    are mask-weighted means (pixels at 0 do not count)."""
    l1 = (rgb - target).abs().mean(-1)
    l1 = l1.mean() if mask is None else (l1 * mask).sum() / mask.sum().clamp_min(1.0)
    return (1 - ssim_weight) * l1 + ssim_weight * (1 - ssim(rgb, target, mask))


def robust_mask(rgb: torch.Tensor, target: torch.Tensor, k: float, floor: float, window: int = 7,
                region: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(H,W) float weights in (0, 1] that turn down outliers: transients that no actor explains (a
    pedestrian, a car that crept). A pixel is an outlier where its ``window`` x ``window`` mean absolute
    residual r exceeds both ``k`` x the image's median and ``floor`` (blobs of large error, not edges);
    it weighs (threshold / r)^2, a Cauchy-like falloff that never reaches 0, so static structure the
    model has not fitted yet keeps pulling it (a hard 0/1 mask locked such regions out: KITTI at
    downscale 4, 1000 steps, 22.18 dB hard, 22.48 dB soft, 22.60 dB without). ``region`` ((H,W) bool):
    where outliers may be turned down (elsewhere every pixel weighs 1)."""
    r = (rgb.detach() - target).abs().mean(-1)[None, None]
    r = F.avg_pool2d(r, window, stride=1, padding=window // 2, count_include_pad=False)[0, 0]
    thr = torch.clamp(k * r.median(), min=floor)
    w = torch.clamp(thr / r.clamp(min=1e-12), max=1.0) ** 2
    if region is not None:
        w = torch.where(region, w, torch.ones_like(w))
    return w.to(rgb.dtype)


def lidar_depth(depth: torch.Tensor, alpha: torch.Tensor, pix: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Mean |rendered depth - LiDAR depth| (m) at the LiDAR pixels, plus 1 - alpha there (a LiDAR
    return means something opaque is there); 0 without points."""
    if len(pix) == 0:
        return depth.sum() * 0
    d, a = depth.reshape(-1)[pix], alpha.reshape(-1)[pix]
    return (d - z).abs().mean() + (1 - a).mean()


def sky_opacity(alpha: torch.Tensor, sky: torch.Tensor, ranges: Optional[torch.Tensor] = None,
                reach: Optional[float] = None) -> torch.Tensor:
    """Mean rendered alpha over the pixels a (H,W) ``sky`` mask marks (0 without any): surfels there are a shell
    that parallax slides over what lies behind it, and the sky model behind them learns nothing. With ``ranges``
    (H,W; the rendered surface's distance) and ``reach`` (the LiDAR's range), only pixels whose surface lies
    within the reach count: beyond it the mask cannot tell the sky from a uniform far facade (neither returns a
    ray, both look the same from everywhere on the drive), which surfels there may paint."""
    if reach is not None:
        sky = sky * (ranges.detach() < reach)
    return (alpha * sky).sum() / sky.sum().clamp_min(1.0)


def lidar_rays(out: dict, target_range: torch.Tensor, target_intensity: torch.Tensor):
    """(range, intensity, ray-drop) losses of rendered LiDAR rays (scenes.reconstruction.lidar_fit.render_rays) against a
    sweep's rays (range 0 = dropped): range L1 (m) + (1 - alpha) on returns; MSE of the head's intensity on
    returns; BCE of its ray-drop logit on the rays where the scene has a surface (alpha >= 0.5); 0 where there are
    no such rays. Means over masks, not over selected rays: no host synchronisation on a GPU."""
    ret = target_range > 0
    n_ret = ret.sum().clamp_min(1)
    on_returns = lambda x: torch.where(ret, x, 0.0).sum() / n_ret  # noqa: E731
    rng = on_returns((out["range"] - target_range).abs() + 1 - out["alpha"])
    # (a dropped ray's intensity is moot, and may be NaN: zeroed before it meets a gradient)
    inten = on_returns((torch.sigmoid(out["logits"][:, 0]) - torch.where(ret, target_intensity, 0.0)) ** 2)
    surf = out["alpha"].detach() >= 0.5
    bce = F.binary_cross_entropy_with_logits(out["logits"][:, 1], (~ret).float(), reduction="none")
    return rng, inten, torch.where(surf, bce, 0.0).sum() / surf.sum().clamp_min(1)


def free_space(near_alpha: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """Mean alpha within the sensor's range (`render_rays`' near_alpha) over the rays ``free`` marks: rays that
    returned nothing pass no surface before the range ends (0 without any)."""
    return (near_alpha * free).sum() / free.sum().clamp_min(1)


def opacity_entropy(logit_opacities: torch.Tensor) -> torch.Tensor:
    """Mean binary entropy (nats) of the opacities: 0 when each is 0 or 1. Half-transparent layers that add up to
    the right colour from the training views come apart from any other (a surface there is opaque or absent)."""
    p = torch.sigmoid(logit_opacities)
    return -(p * F.logsigmoid(logit_opacities) + (1 - p) * F.logsigmoid(-logit_opacities)).mean()


def depth_normals(depth: torch.Tensor, rays: torch.Tensor) -> torch.Tensor:
    """(H-1,W-1,3) camera-frame normals of the surface of a depth map, facing the camera.
    rays (H,W,2) are the pixels' x/z, y/z (camera.ray_table())."""
    p = torch.cat([rays * depth[..., None], depth[..., None]], -1)
    dx, dy = p[:-1, 1:] - p[:-1, :-1], p[1:, :-1] - p[:-1, :-1]
    n = F.normalize(torch.cross(dx, dy, dim=-1), dim=-1)
    return n * -torch.sign((n * p[:-1, :-1]).sum(-1, keepdim=True) + 1e-12)


def normal_consistency(normal: torch.Tensor, depth: torch.Tensor, alpha: torch.Tensor,
                       rays: torch.Tensor) -> torch.Tensor:
    """2DGS normal consistency: alpha-weighted mean of 1 - <rendered normal, depth-gradient normal>."""
    valid = torch.isfinite(rays).all(-1)
    rays = torch.where(valid[..., None], rays, torch.zeros_like(rays))
    nd = depth_normals(depth, rays)
    w = alpha[:-1, :-1] * (depth[:-1, :-1] > 0) * valid[:-1, :-1] * valid[1:, 1:]
    return (w * (1 - (normal[:-1, :-1] * nd).sum(-1))).sum() / w.sum().clamp_min(1.0)
