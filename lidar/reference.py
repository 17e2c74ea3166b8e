"""The torch twin of lidar.kernel: the same ray-surfel math, differentiable, on any device.

`composite` takes rays and, per ray, the surfels to composite in order (a padded candidate
list: the numba kernel's record of contributors, or `all_candidates` for the binning-free oracle)
and returns what the kernel returns, as tensors with gradients to the surfels' means, quats,
scales, opacities and features. Training draws rays from real sweeps, lets the numba kernel find
each ray's contributors, and recomposites them here.
"""
from __future__ import annotations

from typing import Dict

import torch

from gsim.render.common import ALPHA_THRESHOLD, FILTER_INV_SQUARE, MAX_ALPHA, T_MIN
from gsim.render.torch_backend import quat_to_rotmat

from .kernel import NEAR


def all_candidates(means_world: torch.Tensor, o_ref: torch.Tensor, n_rays: int) -> torch.Tensor:
    """(n_rays, N) every surfel for every ray, ordered by centre distance from ``o_ref`` (the kernel's order)."""
    order = torch.argsort((means_world - o_ref).norm(dim=-1), stable=True)
    return order[None].expand(n_rays, -1)


def composite(origins: torch.Tensor, dirs: torch.Tensor, column: torch.Tensor, means: torch.Tensor,
              quats: torch.Tensor, scales: torch.Tensor, opacities: torch.Tensor, features: torch.Tensor,
              group: torch.Tensor, group_from_world: torch.Tensor, candidates: torch.Tensor, divergence: float,
              hit_alpha: float) -> Dict[str, torch.Tensor]:
    """Composite rays (R,) against their candidates (R,K) (-1 = none), surfels in their groups' frames.

    origins, dirs (R,3) world; column (R,) index into group_from_world (G,C,3,4); features (N,F).
    Returns alpha (R,), range_sum (R,) (alpha-weighted ranges), median (R,), normal (R,3) and
    features (R,F) (alpha-weighted sums), as lidar.kernel; and each candidate's weight and range (R,K)."""
    valid = candidates >= 0
    j = candidates.clamp_min(0)
    # gathers by index_select: its backward sums in a fixed order (indexing's backward may not), so a
    # training run is repeatable bit for bit
    take = lambda x: torch.index_select(x, 0, j.reshape(-1)).reshape(j.shape + x.shape[1:])
    if group_from_world.shape[0] == 1:  # the world alone: no ray needs taking into another frame
        A = None
        o, d = origins[:, None].expand(j.shape + (3,)), dirs[:, None].expand(j.shape + (3,))
    else:
        A = group_from_world[take(group), column[:, None].expand_as(j)]  # (R,K,3,4)
        o = torch.einsum("rkab,rb->rka", A[..., :3], origins) + A[..., 3]
        d = torch.einsum("rkab,rb->rka", A[..., :3], dirs)
    Rm = quat_to_rotmat(torch.nn.functional.normalize(quats, dim=-1))  # (N,3,3): columns e_u, e_v, n
    Rj, sj = take(Rm), take(scales)
    eu, ev, n = Rj[..., 0] / sj[..., 0:1], Rj[..., 1] / sj[..., 1:2], Rj[..., 2]
    p = take(means) - o
    tc = (p * d).sum(-1)
    ok = valid & (tc > NEAR)
    tc_safe = torch.where(ok, tc, torch.ones_like(tc))
    rho2 = FILTER_INV_SQUARE / divergence ** 2 * ((p * p).sum(-1) - tc_safe ** 2).clamp_min(0) / tc_safe ** 2
    nd = (n * d).sum(-1)
    nd_safe = torch.where(nd != 0, nd, torch.ones_like(nd))
    t = (n * p).sum(-1) / nd_safe
    # a hit behind the ray or at grazing incidence far away never wins; keep its maths finite, since
    # where() passes its unused branch zero gradients, which become NaN against an inf
    plane = (nd != 0) & (t > NEAR) & (t < 1e6)
    t = torch.where(plane, t, torch.zeros_like(t))
    h = t[..., None] * d - p
    a, b = (h * eu).sum(-1), (h * ev).sum(-1)
    rho3 = a * a + b * b
    use3 = plane & (rho3 <= rho2)
    rho = torch.where(use3, rho3, rho2)
    rng = torch.where(use3, t, tc)
    al = torch.clamp(take(opacities) * torch.exp(-0.5 * rho), max=MAX_ALPHA)
    al = torch.where(ok & (al >= ALPHA_THRESHOLD), al, torch.zeros_like(al))
    after = torch.cumprod(1 - al, -1)
    before = torch.cat([torch.ones_like(after[:, :1]), after[:, :-1]], -1)
    stop = (al > 0) & (after <= T_MIN)  # the first such surfel and all after it are not composited
    keep = torch.cumsum(stop.to(torch.int64), -1) == 0
    w = al * before * keep
    acc = torch.cumsum(w, -1)
    crossed = (acc >= hit_alpha) & (acc - w < hit_alpha) & (w > 0)
    median = (crossed * rng).sum(-1)
    s = torch.where(nd > 0, -torch.ones_like(nd), torch.ones_like(nd))[..., None]
    n_world = n if A is None else torch.einsum("rkba,rkb->rka", A[..., :3], n)  # A^T n
    F = features.shape[1]
    return {"alpha": w.sum(-1), "range_sum": (w * rng).sum(-1), "median": median,
            "normal": (w[..., None] * s * n_world).sum(1),
            "features": (w[..., None] * take(features)).sum(1) if F else w.new_zeros(len(w), 0),
            "weights": w, "ranges": rng}
