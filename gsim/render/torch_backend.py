"""The reference camera backend: pure PyTorch, differentiable, any device.

It is the oracle for the other backends and the CPU training path. Per pixel it
evaluates, front to back in centre-depth order, every surfel whose footprint bound
overlaps the pixel's tile (independent of the numba binning code), with the exact
2DGS math:

- the ray r = (u, v, 1) of the pixel hits the surfel plane at local (a, b) with
  (a, b, 1) ~ adj(H) r, H = [t_u, t_v, c] (tangent axes scaled by the scales, centre);
  the hit's camera z is det(H) / (adj(H) r)_z;
- rho_3d = a^2 + b^2 (+inf unless the hit is beyond the near plane), rho_2d =
  2 |pixel offset from the projected centre|^2 (pixels, low-pass filter);
  alpha = min(0.999, opacity * exp(-min(rho)/2)), skipped below 1/255;
- depth is the hit's z when rho_3d wins, the centre's z when the filter wins (2DGS);
- compositing stops (exclusive) once transmittance would fall to 1e-4.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..cameras import Camera
from ..sh import eval_sh
from ..surfels import Surfels
from .common import (ALPHA_THRESHOLD, DISTORTION_SCALE, FILTER_INV_SQUARE, MAX_ALPHA, SURFACE_REACH, T_MIN,
                     CameraFrame, RenderOptions, opacity_cutoffs, tile_table, world_to_camera)

PAIR_BUDGET = 1 << 21  # pixel-surfel pairs evaluated per batch (bounds memory)


def quat_to_rotmat(q: torch.Tensor) -> torch.Tensor:
    q = q / q.norm(dim=1, keepdim=True)
    w, x, y, z = q.unbind(1)
    return torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], 1).view(-1, 3, 3)


def _footprint_bounds(c, tu, tv, k3, r2d_u, r2d_v):
    """[umin, umax, vmin, vmax] on the z=1 plane of where alpha can reach 1/255 (float64)."""
    # Image of the k3-sigma ellipse c + k3 (cos t tu + sin t tv): the 2DGS conic AABB.
    T0 = torch.stack([k3 * tu[:, 0], k3 * tv[:, 0], c[:, 0]], 1)
    T1 = torch.stack([k3 * tu[:, 1], k3 * tv[:, 1], c[:, 1]], 1)
    T2 = torch.stack([k3 * tu[:, 2], k3 * tv[:, 2], c[:, 2]], 1)
    sgn = torch.tensor([1.0, 1.0, -1.0], dtype=c.dtype, device=c.device)
    d = (T2 * T2 * sgn).sum(1)
    ellipse = d < 0  # else the disk reaches the camera plane: unbounded image
    f = sgn / torch.where(ellipse, d, -torch.ones_like(d))[:, None]
    cu, cv = (T0 * T2 * f).sum(1), (T1 * T2 * f).sum(1)
    hu = (cu * cu - (T0 * T0 * f).sum(1)).clamp_min(0).sqrt()
    hv = (cv * cv - (T1 * T1 * f).sum(1)).clamp_min(0).sqrt()
    inf = torch.full_like(cu, float("inf"))
    lo_u, hi_u = torch.where(ellipse, cu - hu, -inf), torch.where(ellipse, cu + hu, inf)
    lo_v, hi_v = torch.where(ellipse, cv - hv, -inf), torch.where(ellipse, cv + hv, inf)
    uc, vc = c[:, 0] / c[:, 2], c[:, 1] / c[:, 2]
    b = torch.stack([torch.minimum(lo_u, uc - r2d_u), torch.maximum(hi_u, uc + r2d_u),
                     torch.minimum(lo_v, vc - r2d_v), torch.maximum(hi_v, vc + r2d_v)], 1)
    pad = 1e-6 * (1 + b.abs())
    return b + torch.stack([-pad[:, 0], pad[:, 1], -pad[:, 2], pad[:, 3]], 1)


@dataclass(frozen=True, eq=False)
class Projection:
    """Per-surfel camera-frame quantities, differentiable: centre c (N,3) and scaled tangent axes
    tu, tv (N,3) (camera frame, m), and the pixel stage's records (N, N_RECORD) (common.RECORD_FIELDS)."""

    c: torch.Tensor
    tu: torch.Tensor
    tv: torch.Tensor
    records: torch.Tensor


def project(s: Surfels, T_world_camera: np.ndarray, near: float) -> Projection:
    """The per-surfel stage shared by the torch reference and the numba backward (torch surfels)."""
    dev, dt = s.means.device, s.means.dtype
    R_cw, t_cw, cam_centre = (torch.as_tensor(x, dtype=dt, device=dev) for x in world_to_camera(T_world_camera))
    Rw = quat_to_rotmat(s.quats)
    c = s.means @ R_cw.T + t_cw
    tu = (Rw[:, :, 0] * s.scales[:, 0:1]) @ R_cw.T
    tv = (Rw[:, :, 1] * s.scales[:, 1:2]) @ R_cw.T
    n = Rw[:, :, 2] @ R_cw.T
    n = torch.where(((n * c).sum(1) > 0)[:, None], -n, n)  # face the camera
    # rows of adj(H), H = [tu, tv, c]: tv x c, c x tu, tu x tv
    a0, a1, a2 = torch.cross(tv, c, dim=1), torch.cross(c, tu, dim=1), torch.cross(tu, tv, dim=1)
    det = (tu * a0).sum(1, keepdim=True)
    dirs = s.means - cam_centre
    rgb = (eval_sh(s.colors, dirs / dirs.norm(dim=1, keepdim=True).clamp_min(1e-12)) + 0.5).clamp_min(0)
    cz = c[:, 2:3]
    # culled surfels (z <= near) never reach a pixel; a safe divisor keeps their gradients finite
    uv = c[:, :2] / torch.where(cz > near, cz, torch.ones_like(cz))
    records = torch.cat([a0[:, :2], a1[:, :2], a2, det, uv, s.opacities[:, None], rgb, n, cz], 1)
    return Projection(c, tu, tv, records)


def finish(acc: torch.Tensor, distortion: Optional[torch.Tensor], background, H: int, W: int) -> CameraFrame:
    """The frame from per-pixel accumulators (H*W, 8) [sum w rgb, alpha, sum w z, sum w normal]:
    over the background, depth and normal divided by alpha."""
    bg = torch.as_tensor(background, dtype=acc.dtype, device=acc.device)
    alpha = acc[:, 3]
    rgb = acc[:, :3] + (1 - alpha)[:, None] * bg
    safe = alpha.clamp_min(1e-10)
    depth = torch.where(alpha > 0, acc[:, 4] / safe, torch.zeros_like(alpha))
    normal = torch.where((alpha > 0)[:, None], acc[:, 5:8] / safe[:, None], torch.zeros_like(acc[:, 5:8]))
    return CameraFrame(rgb=rgb.view(H, W, 3), alpha=alpha.view(H, W), depth=depth.view(H, W),
                       normal=normal.view(H, W, 3), distortion=None if distortion is None else distortion.view(H, W))


def render(surfels: Surfels, camera: Camera, T_world_camera: np.ndarray, options: RenderOptions) -> CameraFrame:
    s = surfels if surfels.is_torch else surfels.torch()
    dev, dt = s.means.device, s.means.dtype
    H, W = camera.height, camera.width
    proj = project(s, T_world_camera, options.near)

    with torch.no_grad():
        k3, r2d = (torch.as_tensor(x, device=dev, dtype=torch.float64)
                   for x in opacity_cutoffs(s.opacities.detach().double().cpu().numpy()))
        cz = proj.c[:, 2].detach()
        valid = (cz > options.near) & (cz < options.far) & (k3 > 0)
        ids = torch.nonzero(valid).squeeze(1)
        ids = ids[torch.sort(cz[ids], stable=True).indices]  # front to back
        cd = lambda x: x.detach()[ids].double()
        bounds = _footprint_bounds(cd(proj.c), cd(proj.tu), cd(proj.tv), k3[ids], r2d[ids] / camera.fx,
                                   r2d[ids] / camera.fy)

    tab = tile_table(camera)
    n_out = 9 if options.distortion else 8
    out = torch.zeros(H * W, n_out, dtype=dt, device=dev)
    tiles = np.nonzero(np.isfinite(tab.bounds[:, 0]))[0]
    tb = torch.as_tensor(tab.bounds, device=dev)
    # candidate lists per tile, in depth order, batched so that pairs stay within budget
    masks = [((bounds[None, :, 0] <= tb[t, 1, None]) & (bounds[None, :, 1] >= tb[t, 0, None])
              & (bounds[None, :, 2] <= tb[t, 3, None]) & (bounds[None, :, 3] >= tb[t, 2, None]))
             for t in np.array_split(tiles, max(1, len(tiles) * len(ids) // 4_000_000 + 1))]
    mask = torch.cat(masks, 0) if masks else torch.zeros(0, len(ids), dtype=torch.bool)
    counts = mask.sum(1).cpu().numpy()
    P = tab.rays.shape[1]
    start = 0
    while start < len(tiles):
        stop = start + 1
        while stop < len(tiles) and (stop + 1 - start) * P * max(1, counts[start:stop + 1].max()) <= PAIR_BUDGET:
            stop += 1
        vals, pix = _render_tiles(tab, tiles[start:stop], mask[start:stop], ids, proj.records, camera, options)
        out = out.index_copy(0, pix, vals)
        start = stop
    return finish(out[:, :8], out[:, 8] if options.distortion else None, options.background, H, W)


def _render_tiles(tab, tiles, mask, ids, records, camera, options):
    """Composite a batch of tiles; returns (pixels, 8 or 9) [rgb*w, alpha, depth*w, normal*w(, distortion)]
    and flat pixel ids."""
    dev, dt = records.device, records.dtype
    nb = len(tiles)
    counts = mask.sum(1)
    K = max(1, int(counts.max()))
    rows, cols = torch.nonzero(mask, as_tuple=True)
    slot = torch.arange(len(rows), device=dev) - (torch.cumsum(counts, 0) - counts)[rows]
    idx = torch.zeros(nb, K, dtype=torch.long, device=dev)
    used = torch.zeros(nb, K, dtype=torch.bool, device=dev)
    idx[rows, slot] = ids[cols]
    used[rows, slot] = True

    rays = torch.as_tensor(tab.rays[tiles], device=dev, dtype=dt)  # (nb,P,2)
    pix = torch.as_tensor(tab.pixel[tiles], device=dev)
    ok_pix = torch.isfinite(rays[..., 0]) & (pix >= 0)
    u = torch.nan_to_num(rays[..., 0])[:, :, None]
    v = torch.nan_to_num(rays[..., 1])[:, :, None]
    a00, a01, a10, a11, a20, a21, a22, det, uc, vc, opac, *_, cz = records[idx][:, None].unbind(-1)  # (nb,1,K)
    du, dv = u - uc, v - vc
    # adj(H) rows 0 and 1 are orthogonal to the centre ray, so only the offset from it counts
    qa = a00 * du + a01 * dv
    qb = a10 * du + a11 * dv
    qz = a20 * u + a21 * v + a22
    hit = (qz.abs() > 1e-30) & (det * qz > 0) & (det.abs() > options.near * qz.abs())  # z > near
    pu, pv = du * camera.fx, dv * camera.fy
    rho2 = FILTER_INV_SQUARE * (pu * pu + pv * pv)
    with torch.no_grad():  # which of the two distances counts, then the ray-splat one only where it does: a
        # division whose result is not taken still back-propagates 0 x (its derivative), NaN where a ray grazes
        # the surfel's plane (qz near 0: seen on the synthetic street, every surfel NaN after one step)
        q2 = torch.where(hit, qz * qz, torch.ones_like(qz))
        use3 = hit & ((qa * qa + qb * qb) / q2 <= rho2)
    qz_safe = torch.where(use3, qz, torch.ones_like(qz))
    rho = torch.where(use3, (qa * qa + qb * qb) / (qz_safe * qz_safe), rho2)
    alpha = torch.clamp_max(opac * torch.exp(-0.5 * rho), MAX_ALPHA)
    alpha = torch.where((alpha >= ALPHA_THRESHOLD) & used[:, None] & ok_pix[:, :, None], alpha,
                        torch.zeros_like(alpha))
    if options.surface_eps:
        # a surfel the low-pass draws (smaller than a pixel) covers its area on screen, 2 sigma_u sigma_v px^2 (the
        # low-pass alone: 1); det = s1 s2 (n . c), so sigma_u sigma_v = |det| fx fy / cz^3
        area = torch.where(use3, torch.ones_like(qz),
                           torch.clamp(2 * det.abs() * camera.fx * camera.fy / cz.clamp_min(1e-9) ** 3, 1e-6, 1.0))
        z_plane = det / torch.where(hit, qz, torch.ones_like(qz))
        z_plane = torch.minimum(torch.maximum(z_plane, cz / SURFACE_REACH), cz * SURFACE_REACH)
        w, z = _surface_weights(alpha, torch.where(hit, z_plane, cz.expand_as(qz)), area.detach(),
                                options.surface_eps)
    else:
        z = torch.where(use3, det / qz_safe, cz.expand_as(qz))
        trans_incl = torch.cumprod(1 - alpha, dim=2)
        trans_excl = torch.cat([torch.ones_like(trans_incl[..., :1]), trans_incl[..., :-1]], 2)
        w = alpha * trans_excl * (trans_incl > T_MIN)
    f = records[idx]  # (nb,K,18)
    vals = [torch.einsum("bpk,bkc->bpc", w, f[..., 11:14]), w.sum(2, keepdim=True),
            (w * z).sum(2, keepdim=True), torch.einsum("bpk,bkc->bpc", w, f[..., 14:17])]
    if options.distortion:
        m = DISTORTION_SCALE / torch.where(w > 0, z, torch.ones_like(z))  # z > near where w > 0
        a = w.sum(2, keepdim=True)
        mean = (w * m).sum(2, keepdim=True) / a.clamp_min(1e-30)
        vals.append(a * (w * (m - mean) ** 2).sum(2, keepdim=True))  # A sum w (m - mean)^2, no cancellation
    keep = ok_pix.reshape(-1)
    return torch.cat(vals, 2).reshape(len(keep), -1)[keep], pix.reshape(-1)[keep]


def _surface_weights(alpha: torch.Tensor, z: torch.Tensor, area: torch.Tensor, eps: float):
    """(weights, depths) of (...,K) contributions with alphas ``alpha``, ray-plane hit depths ``z`` and screen
    areas ``area`` (relative), composited as surfaces (`RenderOptions.surface_eps`): sorted by z, a surface is a run
    of hits each within ``eps`` of the one before (relative); it takes the transmittance of the surfaces in front
    and splits its coverage 1 - prod(1 - alpha) by alpha_i area_i. The surfaces partition the contributions, so
    the pixel's alpha is the same as front to back; on one plane every hit has the same depth, and the pixel shows
    the plane's surfels at the ray's hit, each as much as it covers, not its nearest ones."""
    key = torch.where(alpha > 0, z, torch.full_like(z, float("inf"))).detach()
    key, order = torch.sort(key, dim=-1, stable=True)
    a = torch.gather(alpha, -1, order)
    share = a * torch.gather(area.expand_as(alpha), -1, order)
    log_t = torch.cumsum(torch.log1p(-a), -1)  # log transmittance after each (inclusive)
    sum_share = torch.cumsum(share, -1)
    k = torch.arange(key.shape[-1], device=key.device).expand_as(key)
    starts = torch.ones_like(key, dtype=torch.bool)
    starts[..., 1:] = key[..., 1:] > key[..., :-1] * (1 + eps)
    ends = torch.ones_like(starts)
    ends[..., :-1] = starts[..., 1:]
    lo = torch.cummax(torch.where(starts, k, torch.zeros_like(k)), -1).values  # each one's surface: first, last
    hi = torch.cummin(torch.where(ends, k, torch.full_like(k, key.shape[-1])).flip(-1), -1).values.flip(-1)
    front = torch.gather(log_t - torch.log1p(-a), -1, lo)
    coverage = 1 - torch.exp(torch.gather(log_t, -1, hi) - front)
    total = torch.gather(sum_share, -1, hi) - torch.gather(sum_share - share, -1, lo)
    w = torch.where(a > 0, torch.exp(front) * share * coverage / total.clamp_min(1e-30), torch.zeros_like(a))
    return torch.gather(w, -1, torch.argsort(order, -1)), z
