"""Fast CPU camera backend: a parallel tile rasterizer in numba (forward only).

Same math as the torch reference (see torch_backend's docstring), in float32 per
pixel. Steps: per-surfel preprocessing (parallel), a two-level surfel/tile overlap
search on the z=1 ray plane (parallel), a counting sort of (tile, surfel) pairs in
centre-depth order, and per-tile compositing (parallel over tiles, small chunks so
that the two cores share uneven tiles).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

from ..cameras import Camera
from ..surfels import Surfels
from .common import (ALPHA_THRESHOLD, FILTER_INV_SQUARE, MAX_ALPHA, T_MIN, CameraFrame, RenderOptions,
                     tile_table, world_to_camera)
from .torch_backend import SH_C

# No 'nnan'/'ninf': bounds use +-inf and pixels without a ray are NaN.
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}
# Per-surfel record: adj(H) entries a00 a01 a10 a11 a20 a21 a22 (0-6; a02, a12 are not needed
# since pixel offsets are taken from the centre ray), det 7, centre ray u,v 8-9, opacity 10,
# (unused 11), rgb 12-14, normal 15-17, centre depth 18, footprint bounds 19-22.
REC = 23
C0, C1 = SH_C[0], SH_C[1]
C2, C3 = SH_C[2], SH_C[3]


@njit(cache=True, fastmath=FASTMATH)
def _sh_channel(sh, ch, x, y, z):
    k = sh.shape[0]
    r = C0 * sh[0, ch]
    if k > 1:
        r += C1 * (-y * sh[1, ch] + z * sh[2, ch] - x * sh[3, ch])
    if k > 4:
        xx, yy, zz = x * x, y * y, z * z
        r += (C2[0] * x * y * sh[4, ch] + C2[1] * y * z * sh[5, ch] + C2[2] * (2 * zz - xx - yy) * sh[6, ch]
              + C2[3] * x * z * sh[7, ch] + C2[4] * (xx - yy) * sh[8, ch])
        if k > 9:
            r += (C3[0] * y * (3 * xx - yy) * sh[9, ch] + C3[1] * x * y * z * sh[10, ch]
                  + C3[2] * y * (4 * zz - xx - yy) * sh[11, ch] + C3[3] * z * (2 * zz - 3 * xx - 3 * yy) * sh[12, ch]
                  + C3[4] * x * (4 * zz - xx - yy) * sh[13, ch] + C3[5] * z * (xx - yy) * sh[14, ch]
                  + C3[6] * x * (xx - 3 * yy) * sh[15, ch])
    return r


@njit(cache=True)
def _clipped_disk_bounds(c0, c1, c2, u0, u1, u2, v0, v1, v2, near, out):
    """[umin, umax, vmin, vmax] of the image of the disk c + (cos t) u + (sin t) v clipped to z >= near.

    The disk is enclosed by a circumscribed 16-gon, clipped by the plane, projected vertex by vertex.
    """
    n = 16
    rad = 1.0 / math.cos(math.pi / n)
    out[0], out[1], out[2], out[3] = np.inf, -np.inf, np.inf, -np.inf
    for j in range(n):
        for e in range(2):  # the vertex itself, then where the edge to the next one crosses z = near
            t0, t1 = 2 * math.pi * j / n, 2 * math.pi * (j + 1) / n
            ca, sa, cb, sb = rad * math.cos(t0), rad * math.sin(t0), rad * math.cos(t1), rad * math.sin(t1)
            pz, qz = c2 + ca * u2 + sa * v2, c2 + cb * u2 + sb * v2
            if e == 0:
                if pz < near:
                    continue
                f = 0.0
            else:
                if (pz - near) * (qz - near) >= 0:
                    continue
                f = (near - pz) / (qz - pz)
            x = c0 + ((1 - f) * ca + f * cb) * u0 + ((1 - f) * sa + f * sb) * v0
            y = c1 + ((1 - f) * ca + f * cb) * u1 + ((1 - f) * sa + f * sb) * v1
            z = max(pz + f * (qz - pz), near)
            out[0], out[1] = min(out[0], x / z), max(out[1], x / z)
            out[2], out[3] = min(out[2], y / z), max(out[3], y / z)
    pad = 1e-6
    out[0], out[1], out[2], out[3] = out[0] - pad * (1 + abs(out[0])), out[1] + pad * (1 + abs(out[1])), \
        out[2] - pad * (1 + abs(out[2])), out[3] + pad * (1 + abs(out[3]))


@njit(parallel=True, cache=True)
def _preprocess(means, quats, scales, opac, sh, Rcw, tcw, cen, fx, fy, near, far, rec, bounds, depth, valid):
    for i in prange(means.shape[0]):
        valid[i] = False
        o = opac[i]
        if o * 255.0 <= 1.0:
            continue
        m0, m1, m2 = means[i, 0], means[i, 1], means[i, 2]
        c0 = Rcw[0, 0] * m0 + Rcw[0, 1] * m1 + Rcw[0, 2] * m2 + tcw[0]
        c1 = Rcw[1, 0] * m0 + Rcw[1, 1] * m1 + Rcw[1, 2] * m2 + tcw[1]
        c2 = Rcw[2, 0] * m0 + Rcw[2, 1] * m1 + Rcw[2, 2] * m2 + tcw[2]
        if not (c2 > near and c2 < far):
            continue
        qw, qx, qy, qz = quats[i, 0], quats[i, 1], quats[i, 2], quats[i, 3]
        qn = math.sqrt(qw * qw + qx * qx + qy * qy + qz * qz)
        qw, qx, qy, qz = qw / qn, qx / qn, qy / qn, qz / qn
        # surfel axes (columns of the world rotation) taken into the camera frame; scalar code,
        # since small arrays allocated per surfel cost more than the arithmetic
        ex0, ex1, ex2 = 1 - 2 * (qy * qy + qz * qz), 2 * (qx * qy + qw * qz), 2 * (qx * qz - qw * qy)
        ey0, ey1, ey2 = 2 * (qx * qy - qw * qz), 1 - 2 * (qx * qx + qz * qz), 2 * (qy * qz + qw * qx)
        ez0, ez1, ez2 = 2 * (qx * qz + qw * qy), 2 * (qy * qz - qw * qx), 1 - 2 * (qx * qx + qy * qy)
        s0, s1 = scales[i, 0], scales[i, 1]
        u0 = (Rcw[0, 0] * ex0 + Rcw[0, 1] * ex1 + Rcw[0, 2] * ex2) * s0
        u1 = (Rcw[1, 0] * ex0 + Rcw[1, 1] * ex1 + Rcw[1, 2] * ex2) * s0
        u2 = (Rcw[2, 0] * ex0 + Rcw[2, 1] * ex1 + Rcw[2, 2] * ex2) * s0
        v0 = (Rcw[0, 0] * ey0 + Rcw[0, 1] * ey1 + Rcw[0, 2] * ey2) * s1
        v1 = (Rcw[1, 0] * ey0 + Rcw[1, 1] * ey1 + Rcw[1, 2] * ey2) * s1
        v2 = (Rcw[2, 0] * ey0 + Rcw[2, 1] * ey1 + Rcw[2, 2] * ey2) * s1
        n0 = Rcw[0, 0] * ez0 + Rcw[0, 1] * ez1 + Rcw[0, 2] * ez2
        n1 = Rcw[1, 0] * ez0 + Rcw[1, 1] * ez1 + Rcw[1, 2] * ez2
        n2 = Rcw[2, 0] * ez0 + Rcw[2, 1] * ez1 + Rcw[2, 2] * ez2
        if n0 * c0 + n1 * c1 + n2 * c2 > 0:  # face the camera
            n0, n1, n2 = -n0, -n1, -n2
        # rows of adj(H), H = [tu, tv, c]: tv x c, c x tu, tu x tv
        a00, a01, a02 = v1 * c2 - v2 * c1, v2 * c0 - v0 * c2, v0 * c1 - v1 * c0
        a10, a11 = c1 * u2 - c2 * u1, c2 * u0 - c0 * u2
        a20, a21, a22 = u1 * v2 - u2 * v1, u2 * v0 - u0 * v2, u0 * v1 - u1 * v0
        uc, vc = c0 / c2, c1 / c2
        lg = math.log(o * 255.0)
        rc = rec[i]
        rc[0], rc[1], rc[2], rc[3] = a00, a01, a10, a11
        rc[4], rc[5], rc[6], rc[7] = a20, a21, a22, u0 * a00 + u1 * a01 + u2 * a02
        rc[8], rc[9], rc[10], rc[11] = uc, vc, o, 2.0 * lg
        d0, d1, d2 = m0 - cen[0], m1 - cen[1], m2 - cen[2]
        dn = math.sqrt(d0 * d0 + d1 * d1 + d2 * d2)
        if dn > 1e-12:
            d0, d1, d2 = d0 / dn, d1 / dn, d2 / dn
        for ch in range(3):
            rc[12 + ch] = max(_sh_channel(sh[i], ch, d0, d1, d2) + 0.5, 0.0)
        rc[15], rc[16], rc[17], rc[18] = n0, n1, n2, c2
        # footprint bounds on the z=1 plane (see torch_backend._footprint_bounds)
        k3 = math.sqrt(2.0 * lg)
        r2u = math.sqrt(lg / (0.5 * FILTER_INV_SQUARE)) / fx
        r2v = math.sqrt(lg / (0.5 * FILTER_INV_SQUARE)) / fy
        t00, t01, t02 = k3 * u0, k3 * v0, c0
        t10, t11, t12 = k3 * u1, k3 * v1, c1
        t20, t21, t22 = k3 * u2, k3 * v2, c2
        dd = t20 * t20 + t21 * t21 - t22 * t22
        if dd < 0:
            cu = (t00 * t20 + t01 * t21 - t02 * t22) / dd
            cv = (t10 * t20 + t11 * t21 - t12 * t22) / dd
            hu = math.sqrt(max(cu * cu - (t00 * t00 + t01 * t01 - t02 * t02) / dd, 0.0))
            hv = math.sqrt(max(cv * cv - (t10 * t10 + t11 * t11 - t12 * t12) / dd, 0.0))
            b0, b1, b2, b3 = min(cu - hu, uc - r2u), max(cu + hu, uc + r2u), min(cv - hv, vc - r2v), max(cv + hv, vc + r2v)
            bounds[i, 0] = b0 - 1e-6 * (1 + abs(b0))
            bounds[i, 1] = b1 + 1e-6 * (1 + abs(b1))
            bounds[i, 2] = b2 - 1e-6 * (1 + abs(b2))
            bounds[i, 3] = b3 + 1e-6 * (1 + abs(b3))
        else:  # the disk reaches the camera plane: bound the part at z >= near instead
            _clipped_disk_bounds(c0, c1, c2, k3 * u0, k3 * u1, k3 * u2, k3 * v0, k3 * v1, k3 * v2,
                                 near, bounds[i])
            b = bounds[i]
            b[0], b[1] = min(b[0], uc - r2u), max(b[1], uc + r2u)
            b[2], b[3] = min(b[2], vc - r2v), max(b[3], vc + r2v)
        rc[19], rc[20], rc[21], rc[22] = bounds[i, 0], bounds[i, 1], bounds[i, 2], bounds[i, 3]
        depth[i] = c2
        valid[i] = True


# float32 constants keep the pixel loop in single precision (Python literals are float64)
f32 = np.float32
ONE, M_HALF, EXP_FLOOR, MAX_A, A_MIN, T_END = f32(1), f32(-0.5), f32(-5.6), f32(MAX_ALPHA), f32(ALPHA_THRESHOLD), f32(T_MIN)
F_INV_SQ = f32(FILTER_INV_SQUARE)
E16, E2, E6, E24, E120, E720, E5040 = f32(1 / 16), f32(1 / 2), f32(1 / 6), f32(1 / 24), f32(1 / 120), f32(1 / 720), f32(1 / 5040)


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _exp_neg(x):
    """exp(x) for x in [-6, 0] to ~1e-7 relative, branch-free so the pixel loop vectorizes:
    a degree-7 Taylor series at x/16, squared four times."""
    y = x * E16
    p = ONE + y * (ONE + y * (E2 + y * (E6 + y * (E24 + y * (E120 + y * (E720 + y * E5040))))))
    p = p * p
    p = p * p
    p = p * p
    return p * p


@njit(cache=True, inline="always")
def _span(ranges, lo, hi):
    """First and one-past-last index whose [min, max] range meets [lo, hi] (empty: first >= last)."""
    first, last = ranges.shape[0], 0
    for k in range(ranges.shape[0]):
        if ranges[k, 0] <= hi and ranges[k, 1] >= lo:
            first = min(first, k)
            last = k + 1
    return first, last


@njit(parallel=True, cache=True)
def _bin(order, bounds, tile_bounds, tile_col_u, tile_row_v, offsets, pair_tile, write):
    """Count (write=False, into offsets[j+1]) or write the tiles each surfel order[j] overlaps."""
    tx = tile_col_u.shape[0]
    for j in prange(order.shape[0]):
        b = bounds[order[j]]
        k = offsets[j] if write else 0
        x0, x1 = _span(tile_col_u, b[0], b[1])
        y0, y1 = _span(tile_row_v, b[2], b[3])
        for ty in range(y0, y1):
            for tx_ in range(x0, x1):
                t = ty * tx + tx_
                tb = tile_bounds[t]
                if b[0] <= tb[1] and b[1] >= tb[0] and b[2] <= tb[3] and b[3] >= tb[2]:
                    if write:
                        pair_tile[k] = t
                    k += 1
        if not write:
            offsets[j + 1] = k


@njit(cache=True)
def _sort_pairs(order, offsets, pair_tile, n_tiles):
    """Counting sort of pairs by tile; within a tile, surfels stay in depth order."""
    start = np.zeros(n_tiles + 1, np.int64)
    for p in range(pair_tile.shape[0]):
        start[pair_tile[p] + 1] += 1
    for t in range(n_tiles):
        start[t + 1] += start[t]
    pos = start[:-1].copy()
    lst = np.empty(pair_tile.shape[0], np.int64)
    for j in range(order.shape[0]):
        for p in range(offsets[j], offsets[j + 1]):
            t = pair_tile[p]
            lst[pos[t]] = order[j]
            pos[t] += 1
    return start, lst


@njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _rasterize(start, lst, rec, ray_u, ray_v, pixel, row_v, col_u, fx, fy, near, bg, rgb, alpha, depth, normal):
    n_tiles, P = ray_u.shape[0], ray_u.shape[1]
    ts = row_v.shape[1]
    one, zero = np.float32(1.0), np.float32(0.0)
    for t in prange(n_tiles):
        acc = np.zeros((8, P), np.float32)
        # transmittance; 0 marks a finished pixel (or one without a ray), so it takes no more
        T = np.where(np.isfinite(ray_u[t]), one, zero)
        live = 0
        for p in range(P):
            live += T[p] > 0
        u_t, v_t = ray_u[t], ray_v[t]
        for k in range(start[t], start[t + 1]):
            if live == 0:
                break
            r = rec[lst[k]]
            # only the rows and columns whose rays can fall inside the footprint bound
            y0, y1 = _span(row_v[t], r[21], r[22])
            x0, x1 = _span(col_u[t], r[19], r[20])
            a00, a01, a10, a11 = r[0], r[1], r[2], r[3]
            a20, a21, a22, det = r[4], r[5], r[6], r[7]
            uc, vc, op, cz = r[8], r[9], r[10], r[18]
            cr, cg, cb, nx, ny, nz = r[12], r[13], r[14], r[15], r[16], r[17]
            zero = np.float32(0.0)
            for py in range(y0, y1):
                lo, hi = py * ts + x0, py * ts + x1
                # contiguous 1D views and a branch-free body: LLVM vectorizes the pixel loop
                u_, v_, T_ = u_t[lo:hi], v_t[lo:hi], T[lo:hi]
                a0, a1, a2, a3 = acc[0, lo:hi], acc[1, lo:hi], acc[2, lo:hi], acc[3, lo:hi]
                a4, a5, a6, a7 = acc[4, lo:hi], acc[5, lo:hi], acc[6, lo:hi], acc[7, lo:hi]
                stops = zero
                for p in range(hi - lo):
                    u, v = u_[p], v_[p]
                    du, dv = u - uc, v - vc
                    pu, pv = du * fx, dv * fy
                    rho2 = F_INV_SQ * (pu * pu + pv * pv)
                    qz = a20 * u + a21 * v + a22
                    qa = a00 * du + a01 * dv
                    qb = a10 * du + a11 * dv
                    q2, qz2 = qa * qa + qb * qb, qz * qz
                    # computed unconditionally (NaN/inf in lanes that are not selected) so that LLVM
                    # turns every choice into a vector select
                    rho3, z3 = q2 / qz2, det / qz
                    # the ray-splat hit wins when it lies beyond the near plane and rho_3d <= rho_2d
                    use3 = (qz * det > zero) & (abs(det) > near * abs(qz)) & (q2 <= rho2 * qz2)
                    rho = rho3 if use3 else rho2
                    z = z3 if use3 else cz
                    al = min(op * _exp_neg(max(M_HALF * rho, EXP_FLOOR)), MAX_A)  # e^-5.6 < 1/255
                    Tp = T_[p]
                    nT = Tp * (ONE - al)
                    take = (al >= A_MIN) & (Tp > zero)
                    stop = take & (nT <= T_END)  # exclusive: this surfel is not composited
                    w = al * Tp if take & ~stop else zero
                    a0[p] += w * cr
                    a1[p] += w * cg
                    a2[p] += w * cb
                    a3[p] += w
                    a4[p] += w * z
                    a5[p] += w * nx
                    a6[p] += w * ny
                    a7[p] += w * nz
                    T_[p] = zero if stop else (nT if take else Tp)
                    stops += ONE if stop else zero
                live -= int(stops)
        for p in range(P):  # finish: over the background, depth and normal divided by alpha
            q = pixel[t, p]
            if q < 0:
                continue
            a = acc[3, p]
            alpha[q] = a
            for ch in range(3):
                rgb[q, ch] = acc[ch, p] + (1 - a) * bg[ch]
            inv = 1 / a if a > 0 else 0.0
            depth[q] = acc[4, p] * inv
            for ch in range(3):
                normal[q, ch] = acc[5 + ch, p] * inv


def render(surfels: Surfels, camera: Camera, T_world_camera: np.ndarray, options: RenderOptions) -> CameraFrame:
    s = surfels.numpy()
    f32 = lambda x: np.ascontiguousarray(x, dtype=np.float32)
    N = len(s)
    R_cw, t_cw, cen = world_to_camera(T_world_camera)
    rec = np.empty((N, REC), np.float32)
    bounds = np.empty((N, 4), np.float64)
    depth = np.empty(N, np.float64)
    valid = np.empty(N, np.bool_)
    _preprocess(np.ascontiguousarray(s.means, np.float64), np.ascontiguousarray(s.quats, np.float64),
                np.ascontiguousarray(s.scales, np.float64), np.ascontiguousarray(s.opacities, np.float64),
                f32(s.colors), R_cw, t_cw, cen, float(camera.fx), float(camera.fy),
                float(options.near), float(options.far), rec, bounds, depth, valid)
    ids = np.nonzero(valid)[0]
    order = ids[np.argsort(depth[ids], kind="stable")]
    tab = tile_table(camera)
    offsets = np.zeros(len(order) + 1, np.int64)
    _bin(order, bounds, tab.bounds, tab.tile_col_u, tab.tile_row_v, offsets, offsets, False)
    np.cumsum(offsets, out=offsets)
    pair_tile = np.empty(offsets[-1], np.int64)
    _bin(order, bounds, tab.bounds, tab.tile_col_u, tab.tile_row_v, offsets, pair_tile, True)
    start, lst = _sort_pairs(order, offsets, pair_tile, len(tab.bounds))
    H, W = camera.height, camera.width
    rgb, normal = np.empty((H * W, 3), np.float32), np.empty((H * W, 3), np.float32)
    alpha, depth_img = np.empty(H * W, np.float32), np.empty(H * W, np.float32)
    # small chunks: tiles differ widely in cost, and prange otherwise splits them evenly
    previous = numba.set_parallel_chunksize(2)
    try:
        _rasterize(start, lst, rec, tab.ray_u, tab.ray_v, tab.pixel, tab.row_v, tab.col_u, np.float32(camera.fx),
                   np.float32(camera.fy), np.float32(options.near), np.asarray(options.background, np.float32),
                   rgb, alpha, depth_img, normal)
    finally:
        numba.set_parallel_chunksize(previous)
    return CameraFrame(rgb=rgb.reshape(H, W, 3), alpha=alpha.reshape(H, W), depth=depth_img.reshape(H, W),
                       normal=normal.reshape(H, W, 3))
