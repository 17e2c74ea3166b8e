"""Camera images of a scene as numpy arrays, and how they compare with the truth: `render_image`, `psnr`,
`ssim`, `image_metrics` and `error_map` (images (H,W,3) float RGB in [0,1]). Evaluation, the trainer's
losses, edited-scene outputs, diffusion and the closed loop share them from here."""
from __future__ import annotations

import functools
import math
from typing import Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from .io import to_uint8
from .render import render_camera
from .resident import Renderer
from .scene import Scene

SSIM_WINDOW, SSIM_SIGMA = 11, 1.5


def render_image(scene: Union[Scene, Renderer], camera, T_world_camera, timestamp_us: int, sensor: str,
                 backend: str = "auto") -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rgb (H,W,3) with the sky and the log camera ``sensor``'s appearance affine, alpha (H,W), depth (H,W) m)
    of ``scene`` at ``timestamp_us`` seen from ``T_world_camera`` (OpenCV camera -> world, 4x4), numpy. ``scene``
    may be a `Renderer` holding one on its device (``backend`` is then the renderer's): many views of a scene."""
    if isinstance(scene, Renderer):
        f = scene.camera(camera, T_world_camera, timestamp_us, sensor, numpy=True)
    else:
        f = render_camera(scene, camera, T_world_camera, backend=backend, timestamp_us=timestamp_us, sensor=sensor)
    return f.rgb, f.alpha, f.depth


def repaired(repair, scene, log, camera, T_world_camera, timestamp_us: int, rgb, alpha, depth, seed: int = 0,
             **view) -> np.ndarray:
    """A repairer's (`gsim.diffusion.open_repairer`) image of a render (its noise drawn from ``seed``): a repair
    model (one with ``repair_view``) is given the view too, for references from ``log``'s training images (``view``:
    its sensor, holdout_every, downscale, and the frame indices to exclude); any other repairer sees the render
    alone."""
    if hasattr(repair, "repair_view"):
        return repair.repair_view(scene, log, camera, T_world_camera, timestamp_us, rgb, alpha, depth, seed=seed,
                                  **view)
    return repair.repair_image(rgb, alpha, depth, seed)


@functools.lru_cache(maxsize=8)  # (made once per dtype and device: a training step's SSIM needs it every step)
def _gauss_window(dtype, device) -> torch.Tensor:
    x = torch.arange(SSIM_WINDOW, dtype=dtype, device=device) - SSIM_WINDOW // 2
    g = torch.exp(-x * x / (2 * SSIM_SIGMA ** 2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).expand(3, 1, SSIM_WINDOW, SSIM_WINDOW)


def ssim(a: torch.Tensor, b: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean SSIM of two (H,W,3) images (Gaussian 11x11 window, sigma 1.5, as Wang et al. 2004); with a
    (H,W) ``mask``, the mask-weighted mean over the windows' centres. Differentiable."""
    x, y = a.permute(2, 0, 1)[None], b.permute(2, 0, 1)[None]
    w = _gauss_window(a.dtype, a.device)
    conv = lambda t: F.conv2d(t, w, groups=3)
    mx, my = conv(x), conv(y)
    sxx, syy, sxy = conv(x * x) - mx * mx, conv(y * y) - my * my, conv(x * y) - mx * my
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    if mask is None:
        return s.mean()
    h = SSIM_WINDOW // 2
    w = mask[h:mask.shape[0] - h, h:mask.shape[1] - h]
    return (s[0].mean(0) * w).sum() / w.sum().clamp_min(1.0)


def psnr(a, b) -> float:
    """PSNR in dB of images in [0,1] (numpy or torch)."""
    mse = float(((torch.as_tensor(a) - torch.as_tensor(b)) ** 2).mean())
    return 10 * math.log10(1.0 / max(mse, 1e-12))


def image_metrics(rgb: np.ndarray, truth: np.ndarray) -> dict:
    """{"psnr": dB, "ssim": SSIM} of an (H,W,3) image against the truth."""
    return {"psnr": psnr(rgb, truth),
            "ssim": float(ssim(torch.from_numpy(rgb.astype(np.float32)), torch.from_numpy(truth.astype(np.float32))))}


def error_map(a: np.ndarray, b: np.ndarray, full_scale: float = 0.25) -> np.ndarray:
    """(H,W,3) uint8 heat map of the mean absolute RGB error (black 0 -> red -> yellow -> white at full_scale)."""
    e = np.abs(a - b).mean(-1) / full_scale
    return to_uint8(np.stack([3 * e, 3 * e - 1, 3 * e - 2], -1))
