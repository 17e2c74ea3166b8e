"""The numba backend's differentiable path (and its distortion output), on the CPU.

Split as in gsplat: the per-surfel stage is torch_backend.project (autograd carries its
gradients to means, quats, scales, opacities and SH colours); the pixel stage is numba,
wrapped in a torch.autograd.Function of the per-surfel records. Binning (bounds, tile
lists, depth order) is numba_raster's and is not differentiated.

Forward: numba_raster's compositor with tracking, which keeps per pixel the final
transmittance, the number of list entries up to the last composited surfel, and the
distortion's running mean and M2. Backward: per tile, its list back to front from that
last entry; each surfel's transmittance is recovered by dividing by (1 - alpha), and the
alphas and the composited pairs are those of the forward (the shared _splat, the same
spans and the recorded last entry). Each tile list entry gets its own gradient (tiles run in parallel and
share surfels), summed per surfel in list order afterwards: the same input gives the same gradients.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange
from torch.autograd.function import once_differentiable

from ..cameras import Camera
from ..errors import InputError
from ..surfels import Surfels
from . import numba_surfaces
from .common import N_RECORD, TILE_SIZE, CameraFrame, RenderOptions, tile_table, world_to_camera
from .numba_raster import (A_MIN, D_SCALE, F_INV_SQ, LANES, MAX_A, N_PLANES_TRACKED, PA, PF, PL, PLANE, PM, PM2, PR,
                           PT, ROW, U_LANES, C0, _geometry, _make_compositor, _span, _splat, bin_surfels, f64)
from .numba_tiles import FASTMATH, ONE, small_chunks
from .torch_backend import finish, project

_composite_tile_tracked = _make_compositor(True)


@njit(parallel=True, cache=True)
def _rasterize_tracked(start, lst, rec, ray_u, ray_v, pixel, row_v, col_u, fx, fy, near, acc, dist, aux):
    """acc (P, 8) [sum w rgb, alpha, sum w z, sum w normal] (no background), dist (P,) the distortion,
    aux (P, 4) [final transmittance, entries up to the last composited, mean of m, M2 of m]."""
    for t in prange(ray_u.shape[0]):
        st = np.empty(N_PLANES_TRACKED * PLANE, np.float32)
        live_row = np.empty(TILE_SIZE, np.bool_)
        _composite_tile_tracked(t, start, lst, rec, ray_u, ray_v, row_v, col_u, fx, fy, near, st, live_row)
        for p in range(TILE_SIZE * TILE_SIZE):
            q = pixel[t, p]
            if q < 0:
                continue
            i = np.uint64(p // TILE_SIZE * ROW + p % TILE_SIZE)
            for ch in range(8):  # the accumulator planes PR..PNZ are consecutive
                acc[q, ch] = st[PR + np.uint64(ch * PLANE) + i]
            dist[q] = st[PA + i] * st[PM2 + i]  # sum_{i<j} w_i w_j (m_i - m_j)^2 = A sum_i w_i (m_i - mean)^2
            aux[q, 0] = st[PT + i] + st[PF + i]  # one of them is 0
            aux[q, 1], aux[q, 2], aux[q, 3] = st[PL + i], st[PM + i], st[PM2 + i]


# Backward tile state, planes as in the forward: rays, transmittance (after the surfel being
# visited), entries up to the last composited, S = sum of w dL/dw over the surfels behind, alpha,
# distortion mean and M2, then the upstream gradients of the 8 accumulators and of the distortion.
# Offsets are uint64 constants, one per plane, as in the forward: a signed index anywhere in the
# pixel loop (even a product with a constant) brings back the wraparound check, and LLVM then
# no longer vectorizes it.
N_BPLANES = 17
BU, BV, BT, BL, BS, BA, BM, BM2, BGR, BGG, BGB, BGA, BGZ, BGNX, BGNY, BGNZ, BGD = (
    np.uint64(k * PLANE) for k in range(N_BPLANES))


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _backward_tile(t, start, lst, rec, ray_u, ray_v, pixel, row_v, col_u, fx, fy, near, acc, aux, g_acc, g_dist,
                   st, row_last, grad):
    """Tile t's list entries' gradients: grad[k] = dL/d record of entry k's surfel from this tile's pixels."""
    zero = np.float32(0.0)
    st[:] = zero
    for p in range(TILE_SIZE * TILE_SIZE):
        q = pixel[t, p]
        u = ray_u[t, p]
        if q < 0 or not np.isfinite(u):
            continue
        i = np.uint64(p // TILE_SIZE * ROW + p % TILE_SIZE)
        st[BU + i], st[BV + i] = u, ray_v[t, p]
        st[BT + i], st[BL + i], st[BM + i], st[BM2 + i] = aux[q, 0], aux[q, 1], aux[q, 2], aux[q, 3]
        st[BA + i], st[BGD + i] = acc[q, 3], g_dist[q]
        for ch in range(8):  # the gradient planes BGR..BGNZ are consecutive
            st[BGR + np.uint64(ch * PLANE) + i] = g_acc[q, ch]
    n_max = zero
    for py in range(TILE_SIZE):
        r = zero
        for px in range(TILE_SIZE):
            r = max(r, st[BL + np.uint64(py * ROW + px)])
        row_last[py] = r
        n_max = max(n_max, r)
    two, f_sq_x, f_sq_y = np.float32(2), np.float32(2) * F_INV_SQ * fx * fx, np.float32(2) * F_INV_SQ * fy * fy
    for k in range(start[t] + int(n_max), start[t + 1]):  # entries past every pixel's last composited one
        for c in range(N_RECORD):
            grad[k, c] = zero
    for k in range(start[t] + int(n_max) - 1, start[t] - 1, -1):
        kl = np.float32(k - start[t])  # composited in the forward where kl < the pixel's entry count
        j = lst[k]
        y0, y1 = _span(row_v, t, rec[j, 20], rec[j, 21])
        x0, x1 = _span(col_u, t, rec[j, 18], rec[j, 19])
        geo = _geometry(rec, j)
        a00, a01, a10, a11, op = geo[0], geo[1], geo[2], geo[3], geo[10]
        cr, cg, cb = rec[j, 11], rec[j, 12], rec[j, 13]
        nx, ny, nz = rec[j, 14], rec[j, 15], rec[j, 16]
        g00 = g01 = g10 = g11 = g20 = g21 = g22 = gdet = guc = gvc = gop = zero
        gr = gg = gb = gnx = gny = gnz = gcz = zero
        for py in range(y0, y1):
            if row_last[py] <= kl:
                continue
            for px in range(x0, x1, LANES):
                row = np.uint64(py * ROW + px)
                for lane in range(U_LANES):  # branch-free, as the forward
                    i = row + lane
                    u, v = st[BU + i], st[BV + i]
                    al, z, use3, gauss, du, dv, qa, qb, qz, rho3, z3 = _splat(u, v, geo, fx, fy, near)
                    ok = (al >= A_MIN) & (kl < st[BL + i])
                    inv_1a = ONE / (ONE - al)
                    T_after = st[BT + i]
                    T = T_after * inv_1a
                    w = al * T if ok else zero
                    a = st[BA + i]
                    gd = st[BGD + i]
                    m = D_SCALE / z
                    dm = m - st[BM + i]
                    g_r, g_g, g_b, g_z = st[BGR + i], st[BGG + i], st[BGB + i], st[BGZ + i]
                    g_nx, g_ny, g_nz = st[BGNX + i], st[BGNY + i], st[BGNZ + i]
                    # dL/dw of this surfel's weight: its values, and the distortion's
                    # d/dw_i [A sum w (m - mean)^2] = M2 + A (m_i - mean)^2
                    dldw = (g_r * cr + g_g * cg + g_b * cb + st[BGA + i] + g_z * z
                            + g_nx * nx + g_ny * ny + g_nz * nz + gd * (st[BM2 + i] + a * dm * dm))
                    s_behind = st[BS + i]
                    # w_i = alpha_i T_i, and the surfels behind see T scaled by (1 - alpha_i)
                    g_al = T * dldw - s_behind * inv_1a if ok & (op * gauss <= MAX_A) else zero
                    st[BS + i] = s_behind + w * dldw
                    st[BT + i] = T if ok else T_after
                    gr += w * g_r
                    gg += w * g_g
                    gb += w * g_b
                    gnx += w * g_nx
                    gny += w * g_ny
                    gnz += w * g_nz
                    # dL/dz: the depth accumulator, and the distortion's 2 w A (m - mean) dm/dz, dm/dz = -m/z
                    g_zz = w * (g_z - two * gd * a * dm * m / z)
                    gop += g_al * gauss
                    g_rho = np.float32(-0.5) * g_al * op * gauss
                    # the ray-splat branch (rho3, z3) or the filter's (rho2, centre depth); the other
                    # branch's intermediates may be inf/NaN, hence selects rather than zero factors
                    iq = ONE / qz
                    g_qa = two * g_rho * qa * iq * iq if use3 else zero
                    g_qb = two * g_rho * qb * iq * iq if use3 else zero
                    g_qz = -(two * g_rho * rho3 + g_zz * z3) * iq if use3 else zero
                    gdet += g_zz * iq if use3 else zero
                    gcz += zero if use3 else g_zz
                    g_du = g_qa * a00 + g_qb * a10 + (zero if use3 else g_rho * f_sq_x * du)
                    g_dv = g_qa * a01 + g_qb * a11 + (zero if use3 else g_rho * f_sq_y * dv)
                    g00 += g_qa * du
                    g01 += g_qa * dv
                    g10 += g_qb * du
                    g11 += g_qb * dv
                    g20 += g_qz * u
                    g21 += g_qz * v
                    g22 += g_qz
                    guc -= g_du
                    gvc -= g_dv
        grad[k, 0] = g00
        grad[k, 1] = g01
        grad[k, 2] = g10
        grad[k, 3] = g11
        grad[k, 4] = g20
        grad[k, 5] = g21
        grad[k, 6] = g22
        grad[k, 7] = gdet
        grad[k, 8] = guc
        grad[k, 9] = gvc
        grad[k, 10] = gop
        grad[k, 11] = gr
        grad[k, 12] = gg
        grad[k, 13] = gb
        grad[k, 14] = gnx
        grad[k, 15] = gny
        grad[k, 16] = gnz
        grad[k, 17] = gcz


@njit(parallel=True, cache=True)
def _backward(start, lst, rec, ray_u, ray_v, pixel, row_v, col_u, fx, fy, near, acc, aux, g_acc, g_dist, grad):
    """grad (entries, N_RECORD): each list entry's dL/d record (see _backward_tile)."""
    for t in prange(ray_u.shape[0]):
        st = np.empty(N_BPLANES * PLANE, np.float32)
        row_last = np.empty(TILE_SIZE, np.float32)
        _backward_tile(t, start, lst, rec, ray_u, ray_v, pixel, row_v, col_u, fx, fy, near, acc, aux, g_acc, g_dist,
                       st, row_last, grad)


@njit(cache=True)
def _sum_entries(lst, grad, out):
    """out[j] = the sum of grad[k] over the list entries k of surfel j, in list order whichever thread ran which
    tile: a run's gradients, and so its training, are reproducible. One pass, row by row (a few ms)."""
    for k in range(lst.shape[0]):
        j = lst[k]
        for c in range(N_RECORD):
            out[j, c] += grad[k, c]


@njit(cache=True)
def _axes(w, x, y, z):
    """The rotation columns (ex, ey, ez) of a unit quaternion (torch_backend.quat_to_rotmat)."""
    return ((1 - 2 * (y * y + z * z), 2 * (x * y + w * z), 2 * (x * z - w * y)),
            (2 * (x * y - w * z), 1 - 2 * (x * x + z * z), 2 * (y * z + w * x)),
            (2 * (x * z + w * y), 2 * (y * z - w * x), 1 - 2 * (x * x + y * y)))


@njit(cache=True)
def _turn(R, e, k):
    """R (k e)."""
    return ((R[0, 0] * e[0] + R[0, 1] * e[1] + R[0, 2] * e[2]) * k,
            (R[1, 0] * e[0] + R[1, 1] * e[1] + R[1, 2] * e[2]) * k,
            (R[2, 0] * e[0] + R[2, 1] * e[1] + R[2, 2] * e[2]) * k)


@njit(cache=True)
def _back(R, g):
    """R^T g."""
    return (R[0, 0] * g[0] + R[1, 0] * g[1] + R[2, 0] * g[2], R[0, 1] * g[0] + R[1, 1] * g[1] + R[2, 1] * g[2],
            R[0, 2] * g[0] + R[1, 2] * g[1] + R[2, 2] * g[2])


@njit(cache=True)
def _cross(a, b):
    return a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]


@njit(parallel=True, cache=True)
def _project_backward(means, quats, scales, sh, idx, R, t, near, g_rec, g_means, g_quats, g_scales, g_opac, g_sh):
    """The gradients g_rec (M, N_RECORD) of surfels idx's records (torch_backend.project's, SH degree 0) taken
    to the surfels (rows idx, each once)."""
    for j in prange(idx.shape[0]):
        i = idx[j]
        m0, m1, m2 = f64(means[i, 0]), f64(means[i, 1]), f64(means[i, 2])
        c = (R[0, 0] * m0 + R[0, 1] * m1 + R[0, 2] * m2 + t[0], R[1, 0] * m0 + R[1, 1] * m1 + R[1, 2] * m2 + t[1],
             R[2, 0] * m0 + R[2, 1] * m1 + R[2, 2] * m2 + t[2])
        w, x, y, z = f64(quats[i, 0]), f64(quats[i, 1]), f64(quats[i, 2]), f64(quats[i, 3])
        qn = math.sqrt(w * w + x * x + y * y + z * z)
        w, x, y, z = w / qn, x / qn, y / qn, z / qn
        ex, ey, ez = _axes(w, x, y, z)
        s0, s1 = f64(scales[i, 0]), f64(scales[i, 1])
        tu, tv, nn = _turn(R, ex, s0), _turn(R, ey, s1), _turn(R, ez, 1.0)
        sign = -1.0 if nn[0] * c[0] + nn[1] * c[1] + nn[2] * c[2] > 0 else 1.0
        g = g_rec
        g_a0, g_a1 = (f64(g[j, 0]), f64(g[j, 1]), 0.0), (f64(g[j, 2]), f64(g[j, 3]), 0.0)
        g_a2, g_det = (f64(g[j, 4]), f64(g[j, 5]), f64(g[j, 6])), f64(g[j, 7])
        # det = tu . (tv x c): d/dtu = tv x c, d/dtv = c x tu, d/dc = tu x tv;
        # a0 = tv x c, a1 = c x tu, a2 = tu x tv, and for u = a x b: dL/da = b x dL/du, dL/db = dL/du x a
        a0, a1, a2 = _cross(tv, c), _cross(c, tu), _cross(tu, tv)
        tu_a1, tu_a2 = _cross(g_a1, c), _cross(tv, g_a2)
        tv_a0, tv_a2 = _cross(c, g_a0), _cross(g_a2, tu)
        c_a0, c_a1 = _cross(g_a0, tv), _cross(tu, g_a1)
        gtu = (g_det * a0[0] + tu_a1[0] + tu_a2[0], g_det * a0[1] + tu_a1[1] + tu_a2[1],
               g_det * a0[2] + tu_a1[2] + tu_a2[2])
        gtv = (g_det * a1[0] + tv_a0[0] + tv_a2[0], g_det * a1[1] + tv_a0[1] + tv_a2[1],
               g_det * a1[2] + tv_a0[2] + tv_a2[2])
        gc0 = g_det * a2[0] + c_a0[0] + c_a1[0]
        gc1 = g_det * a2[1] + c_a0[1] + c_a1[1]
        gc2 = g_det * a2[2] + c_a0[2] + c_a1[2] + f64(g[j, 17])
        gu, gv = f64(g[j, 8]), f64(g[j, 9])
        if c[2] > near:
            gc0, gc1 = gc0 + gu / c[2], gc1 + gv / c[2]
            gc2 -= (gu * c[0] + gv * c[1]) / (c[2] * c[2])
        else:
            gc0, gc1 = gc0 + gu, gc1 + gv
        gm = _back(R, (gc0, gc1, gc2))
        for k in range(3):
            g_means[i, k] = gm[k]
        # tu = R ex s0, tv = R ey s1, n = sign R ez
        bu, bv = _back(R, gtu), _back(R, gtv)
        g_scales[i, 0] = ex[0] * bu[0] + ex[1] * bu[1] + ex[2] * bu[2]
        g_scales[i, 1] = ey[0] * bv[0] + ey[1] * bv[1] + ey[2] * bv[2]
        gx, gy = (bu[0] * s0, bu[1] * s0, bu[2] * s0), (bv[0] * s1, bv[1] * s1, bv[2] * s1)  # dL/d ex, ey
        gz = _back(R, (sign * f64(g[j, 14]), sign * f64(g[j, 15]), sign * f64(g[j, 16])))  # dL/d ez
        # the rotation's columns from the normalised quaternion, then the normalisation
        gw = 2 * (gx[1] * z - gx[2] * y - gy[0] * z + gy[2] * x + gz[0] * y - gz[1] * x)
        gqx = 2 * (gx[1] * y + gx[2] * z + gy[0] * y - 2 * gy[1] * x + gy[2] * w + gz[0] * z - gz[1] * w
                   - 2 * gz[2] * x)
        gqy = 2 * (-2 * gx[0] * y + gx[1] * x - gx[2] * w + gy[0] * x + gy[2] * z + gz[0] * w + gz[1] * z
                   - 2 * gz[2] * y)
        gqz = 2 * (-2 * gx[0] * z + gx[1] * w + gx[2] * x - gy[0] * w - 2 * gy[1] * z + gy[2] * y + gz[0] * x
                   + gz[1] * y)
        dot = w * gw + x * gqx + y * gqy + z * gqz
        g_quats[i, 0], g_quats[i, 1] = (gw - w * dot) / qn, (gqx - x * dot) / qn
        g_quats[i, 2], g_quats[i, 3] = (gqy - y * dot) / qn, (gqz - z * dot) / qn
        g_opac[i] = g[j, 10]
        for ch in range(3):
            g_sh[i, 0, ch] = C0 * f64(g[j, 11 + ch]) if C0 * f64(sh[i, 0, ch]) + 0.5 >= 0 else 0.0


class _Projection(torch.autograd.Function):
    """The per-surfel stage of SH degree 0 surfels (the cpu preset's), differentiable: the records (M, N_RECORD)
    of surfels ``idx`` that the binning computed (numba_raster._preprocess, the same maths as
    torch_backend.project: the reference, and the path for higher degrees), with _project_backward's gradients."""

    @staticmethod
    def forward(ctx, means, quats, scales, opacities, colors, records, idx, T_world_camera, near):
        R, t, _ = world_to_camera(T_world_camera)
        ctx.saved = ([x.detach().numpy() for x in (means, quats, scales, opacities, colors)], idx, R, t, near)
        return torch.from_numpy(np.ascontiguousarray(records[:, :N_RECORD])).to(means.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_rec):
        (means, quats, scales, opac, sh), idx, R, t, near = ctx.saved
        grads = [np.zeros(x.shape, x.dtype) for x in (means, quats, scales, opac, sh)]
        _project_backward(means, quats, scales, sh, idx, R, t, near, np.ascontiguousarray(g_rec.numpy()), *grads)
        return (*(torch.from_numpy(x) for x in grads), None, None, None, None)


class _PixelStage(torch.autograd.Function):
    """records (N, N_RECORD) -> acc (P, 8), distortion (P,) on the numba tile lists of ``binning`` (composited
    front to back, or as surfaces: numba_surfaces)."""

    @staticmethod
    def forward(ctx, records, binning, camera, near, surface_eps):
        rec, start, lst = binning
        rec[:, :N_RECORD] = records.detach().cpu().numpy()  # bounds (18-21) stay numba's
        tab = tile_table(camera)
        P = camera.height * camera.width
        args = (start, lst, rec, tab.ray_u, tab.ray_v, tab.pixel, tab.row_v, tab.col_u, np.float32(camera.fx),
                np.float32(camera.fy), np.float32(near))
        if surface_eps:
            acc, dist, aux = numba_surfaces.composite(args, P, surface_eps, keep=True)
        else:
            acc, dist, aux = np.empty((P, 8), np.float32), np.empty(P, np.float32), np.empty((P, 4), np.float32)
            with small_chunks():
                _rasterize_tracked(*args, acc, dist, aux)
        ctx.saved = (args, acc, aux, surface_eps)
        dt = records.dtype
        return torch.from_numpy(acc).to(dt), torch.from_numpy(dist).to(dt)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_acc, g_dist):
        args, acc, aux, surface_eps = ctx.saved
        f32 = lambda g: np.ascontiguousarray(g.detach().cpu().numpy(), np.float32)
        start, lst, rec = args[:3]
        grad = np.empty((len(lst), N_RECORD), np.float32)  # every entry is written
        if surface_eps:
            numba_surfaces.backward(args, aux, f32(g_acc), f32(g_dist), grad)
        else:
            with small_chunks():
                _backward(*args, acc, aux, f32(g_acc), f32(g_dist), grad)
        out = np.zeros((rec.shape[0], N_RECORD), np.float32)
        _sum_entries(lst, grad, out)
        return torch.from_numpy(out).to(g_acc.dtype), None, None, None, None


def render(surfels: Surfels, camera: Camera, T_world_camera: np.ndarray, options: RenderOptions) -> CameraFrame:
    """numba_backend.render for differentiable tensors or the distortion output (CPU tensors or numpy)."""
    s = surfels if surfels.is_torch else surfels.torch()
    if s.means.device.type != "cpu":
        raise InputError(f"numba backend: differentiable rendering and the distortion output need CPU tensors, "
                         f"got surfels on {s.means.device}; use backend='torch' or 'gsplat' there, "
                         f"or move the surfels to the CPU")
    rec, start, lst, order = bin_surfels(surfels.numpy(), camera, T_world_camera, options)
    # project only the surfels that meet a tile (often a small part of a street): the per-surfel stage
    # and its backward then scale with what the camera sees
    if s.colors.shape[1] == 1:
        fields = [s.means, s.quats, s.scales, s.opacities, s.colors]
        records = _Projection.apply(*[x.contiguous() for x in fields], rec, order, T_world_camera, float(options.near))
    else:  # view-dependent colours: torch's projection (autograd through the SH basis)
        idx = torch.from_numpy(order).to(s.means.device)
        seen = Surfels.derived(**{k: v.index_select(0, idx) for k, v in s.arrays().items()})
        records = project(seen, T_world_camera, options.near).records
    binning = (rec.copy(), start, lst)  # kept for the backward: a copy of the binning's scratch records
    acc, dist = _PixelStage.apply(records, binning, camera, options.near, options.surface_eps)
    return finish(acc, dist if options.distortion else None, options.background, camera.height, camera.width)
