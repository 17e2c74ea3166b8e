"""The road as one surface: a height field fitted to the LiDAR's ground returns, and a term that holds the
surfels near it on it.

Trained on images from the driven path alone, road surfels spread a few centimetres above and below the road
(on the demo street 5-95% of them within -8..+3 cm) and still reproduce the training views: each sits on its
training ray. At a grazing angle a few centimetres of height are a large step along that ray, so from 3 m aside
the lane markings land in the wrong place. The field: the ground plane cut into `GroundOptions.cell_m` cells;
a cell's height is the low percentile of the training sweeps' points in it, kept only where the cell is flat
(its median point within `GroundOptions.flat_m` of that height: no car, wall, pole or curb in it) and no more
than `GroundOptions.step_m` above the lowest such cell around it (a car's flat roof is not the road). The term
(`road_loss`): for the background surfels within `GroundOptions.band_m` of a kept cell's height that lie rather
than stand (a curb's face is left alone), their squared height above it (in units of the band). Their tilt is left
to the images: also pressing the normals flat (1 - |n_z|) cost the held-out views three times as much for the same
gain 3 m aside (BENCHMARKS).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from .views import Ignored, ignored_points, sweep_world


@dataclass(frozen=True)
class GroundOptions:
    cell_m: float = 0.5
    flat_m: float = 0.04  # a cell's median point at most this above its ground height, else it is not all ground
    band_m: float = 0.25  # surfels this close to a cell's height are the road's ...
    lying_nz: float = 0.7  # ... when they lie (|normal z| at least this): a curb's face or a wall's foot stands
    step_m: float = 0.3  # a flat cell more than this above the lowest within reach_m is a roof, not ground
    reach_m: float = 4.0
    min_points: int = 4


@dataclass(frozen=True, eq=False)
class GroundField:
    """Heights (ny, nx) of the cells from (x0, y0) (metres, world frame; NaN: no ground known there)."""

    x0: float
    y0: float
    cell_m: float
    heights: np.ndarray
    _on: dict = field(default_factory=dict, repr=False)  # the heights as a tensor per device and dtype (uploaded once)

    @staticmethod
    def fit(log, frames: Sequence, opt: GroundOptions = GroundOptions(), ignored: Ignored = {}) -> "GroundField":
        """The field of the frames' sweeps (points in ``ignored`` left out)."""
        pts = [np.zeros((0, 3))]
        for f in frames:
            for obs in f.lidars.values():
                w = sweep_world(log, obs)[0]
                pts.append(w[~ignored_points(ignored, obs, len(w))])
        p = np.concatenate(pts)
        if len(p) == 0:
            return GroundField(0.0, 0.0, opt.cell_m, np.full((0, 0), np.nan))
        lo = p[:, :2].min(0)
        ij = np.floor((p[:, :2] - lo) / opt.cell_m).astype(np.int64)
        nx, ny = ij.max(0) + 1
        cell = ij[:, 1] * nx + ij[:, 0]
        order = np.lexsort((p[:, 2], cell))
        cell, z = cell[order], p[order, 2]
        count = np.bincount(cell, minlength=nx * ny)
        start = np.concatenate([[0], np.cumsum(count)[:-1]])
        ok = count >= opt.min_points
        low = np.full(nx * ny, np.nan)
        mid = np.full(nx * ny, np.nan)
        low[ok] = z[start[ok] + count[ok] // 10]
        mid[ok] = z[start[ok] + count[ok] // 2]
        heights = np.where(mid - low <= opt.flat_m, low, np.nan).reshape(ny, nx)
        from scipy.ndimage import minimum_filter
        r = int(round(opt.reach_m / opt.cell_m))
        lowest = minimum_filter(np.where(np.isnan(heights), np.inf, heights), 2 * r + 1, mode="nearest")
        heights = np.where(heights - lowest <= opt.step_m, heights, np.nan)  # a car's roof is not the road
        return GroundField(float(lo[0]), float(lo[1]), opt.cell_m, heights)

    def height(self, xy: torch.Tensor) -> torch.Tensor:
        """(N,) ground height under (N,2) world points; NaN outside the field or where no ground is known."""
        h = self._on.get((xy.device, xy.dtype))
        if h is None:
            h = self._on[(xy.device, xy.dtype)] = torch.as_tensor(self.heights, dtype=xy.dtype, device=xy.device)
        if h.numel() == 0:
            return torch.full(xy.shape[:1], float("nan"), dtype=xy.dtype, device=xy.device)
        i = torch.floor((xy[:, 0] - self.x0) / self.cell_m).long()
        j = torch.floor((xy[:, 1] - self.y0) / self.cell_m).long()
        inside = (i >= 0) & (i < h.shape[1]) & (j >= 0) & (j < h.shape[0])
        got = h[j.clamp(0, h.shape[0] - 1), i.clamp(0, h.shape[1] - 1)]
        return torch.where(inside, got, torch.full_like(got, float("nan")))


def road_loss(field: GroundField, means: torch.Tensor, quats: torch.Tensor, background: torch.Tensor,
              band_m: float, lying_nz: float = GroundOptions.lying_nz) -> torch.Tensor:
    """Mean over the ``background`` (N,) surfels within ``band_m`` of the field's height that lie (|n_z| >=
    ``lying_nz``; n: the surfel's normal, the third column of its rotation; quats (w,x,y,z), any norm) of
    ((z - h) / band)^2; 0 without."""
    h = field.height(means[:, :2].detach())
    dz = means[:, 2] - torch.nan_to_num(h, nan=0.0)
    q = torch.nn.functional.normalize(quats.detach(), dim=-1)
    x, y = q[:, 1], q[:, 2]
    nz = 1 - 2 * (x * x + y * y)
    on = background & torch.isfinite(h) & (dz.detach().abs() < band_m) & (nz.abs() >= lying_nz)
    term = (dz / band_m) ** 2
    return torch.where(on, term, torch.zeros_like(term)).sum() / on.sum().clamp_min(1)
