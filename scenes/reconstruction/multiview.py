"""Multi-view photometric consistency (PGSR's, warped per pixel): a view's rendered depth carries each of its
pixels into the neighbouring training views of the same camera; each neighbour's image sampled there must match
the view's own image window by window (normalised cross-correlation: the two exposures need not agree). A surface
that one image alone accepts at a wrong distance, which slides across what lies behind it once the camera leaves
the driven path, is contradicted by a second camera that saw it from elsewhere. Where a neighbour does not see the
pixel's surface (occluded, outside its image) the other neighbour answers: the cost is the smaller of the two
(the per-pixel minimum of self-supervised depth, which leaves occlusions out)."""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import torch
import torch.nn.functional as F

WINDOW = 7  # pixels of the NCC window (PGSR's patch)
MIN_VAR = 1e-4  # the view's window must vary at least this much (intensity^2: 0.01 std): NCC is noise on flat ones
MIN_Z = 0.1  # m in front of the neighbour's camera


def neighbours(views: Sequence) -> Dict[int, List[int]]:
    """Index of each view -> the indices of its neighbours: the same camera's views of the nearest training frame
    before and after it (one at the log's ends)."""
    by_sensor: Dict[str, List[int]] = {}
    for i, v in enumerate(views):
        by_sensor.setdefault(v.sensor, []).append(i)
    out = {}
    for idx in by_sensor.values():
        idx = sorted(idx, key=lambda i: views[i].timestamp_us)
        for k, i in enumerate(idx):
            out[i] = [idx[j] for j in (k - 1, k + 1) if 0 <= j < len(idx)]
    return out


def warp(depth: torch.Tensor, rays: torch.Tensor, T_dst_src: np.ndarray, camera):
    """Where the source view's pixels land in a destination camera: ((H,W,2) grid_sample coordinates in [-1, 1],
    (H,W) bool valid). depth (H,W): camera z of the source's surface; rays (H,W,2): the source pixels' x/z, y/z
    (NaN-free); T_dst_src: the source camera in the destination's frame."""
    T = torch.as_tensor(T_dst_src, dtype=depth.dtype, device=depth.device)
    p = torch.cat([rays * depth[..., None], depth[..., None]], -1) @ T[:3, :3].T + T[:3, 3]
    z = p[..., 2]
    front = z > MIN_Z
    zs = torch.where(front, z, torch.ones_like(z))
    u, v, ok = camera.pixels(p[..., 0] / zs, p[..., 1] / zs)
    grid = torch.stack([2 * u / camera.width - 1, 2 * v / camera.height - 1], -1)
    inside = (grid.abs() < 1).all(-1)
    return grid, front & ok & inside


def _window_mean(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(x[None, None], WINDOW, stride=1, padding=WINDOW // 2, count_include_pad=False)[0, 0]


def window_stats(a: torch.Tensor):
    """(mean, variance) of the WINDOW x WINDOW windows of a (H,W) grey image."""
    m = _window_mean(a)
    return m, (_window_mean(a * a) - m * m).clamp_min(0)


def ncc_cost(a: torch.Tensor, b: torch.Tensor, a_stats=None) -> torch.Tensor:
    """(H,W) 1 - NCC of the WINDOW x WINDOW windows of two (H,W) grey images, in [0, 2] (``a_stats``: `window_stats`
    of ``a``, when known)."""
    ma, va = a_stats or window_stats(a)
    mb, vb = window_stats(b)
    cov = _window_mean(a * b) - ma * mb
    return 1 - cov / torch.sqrt(va * vb + 1e-8)


def consistency(depth: torch.Tensor, valid: torch.Tensor, rays: torch.Tensor, image: torch.Tensor,
                T_world_camera: np.ndarray, others: Sequence) -> torch.Tensor:
    """Mean per-pixel minimum over ``others`` ((grey image (H',W'), camera, T_world_camera) of neighbouring views)
    of the NCC cost between ``image`` and the neighbour's image warped into it through ``depth`` (H,W), over the
    ``valid`` (H,W bool) pixels whose window has texture (variance >= MIN_VAR) and lands in some neighbour's image
    whole; 0 where there are none."""
    grey = image.mean(-1)
    stats = window_stats(grey)
    best = torch.full_like(depth, float("inf"))
    for img, cam, T in others:
        grid, seen = warp(depth, rays, np.linalg.inv(T) @ T_world_camera, cam)
        warped = F.grid_sample(img[None, None], grid[None], align_corners=False, padding_mode="border")[0, 0]
        seen = _window_mean(seen.to(depth.dtype)) > 1 - 1e-6
        cost = torch.where(seen, ncc_cost(grey, warped, stats), torch.full_like(depth, float("inf")))
        best = torch.minimum(best, cost)
    use = valid & (stats[1] >= MIN_VAR) & torch.isfinite(best)
    return torch.where(use, best, torch.zeros_like(best)).sum() / use.sum().clamp_min(1)
