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
# rho cut-off 11, rgb 12-14, normal 15-17, centre depth 18.
REC = 19
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


@njit(cache=True, inline="always")
def _cross(a, b):
    return np.array([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])


@njit(parallel=True, cache=True)
def _preprocess(means, quats, scales, opac, sh, Rcw, tcw, cen, fx, fy, near, far, rec, bounds, depth, valid):
    for i in prange(means.shape[0]):
        valid[i] = False
        o = opac[i]
        if o * 255.0 <= 1.0:
            continue
        m = means[i]
        c = np.empty(3)
        for r in range(3):
            c[r] = Rcw[r, 0] * m[0] + Rcw[r, 1] * m[1] + Rcw[r, 2] * m[2] + tcw[r]
        if not (c[2] > near and c[2] < far):
            continue
        qw, qx, qy, qz = quats[i, 0], quats[i, 1], quats[i, 2], quats[i, 3]
        qn = math.sqrt(qw * qw + qx * qx + qy * qy + qz * qz)
        qw, qx, qy, qz = qw / qn, qx / qn, qy / qn, qz / qn
        Rw = np.array([[1 - 2 * (qy * qy + qz * qz), 2 * (qx * qy - qw * qz), 2 * (qx * qz + qw * qy)],
                       [2 * (qx * qy + qw * qz), 1 - 2 * (qx * qx + qz * qz), 2 * (qy * qz - qw * qx)],
                       [2 * (qx * qz - qw * qy), 2 * (qy * qz + qw * qx), 1 - 2 * (qx * qx + qy * qy)]])
        M = np.empty((3, 3))  # surfel axes in the camera frame (no BLAS in numba without scipy)
        for r in range(3):
            for k in range(3):
                M[r, k] = Rcw[r, 0] * Rw[0, k] + Rcw[r, 1] * Rw[1, k] + Rcw[r, 2] * Rw[2, k]
        tu = M[:, 0] * scales[i, 0]
        tv = M[:, 1] * scales[i, 1]
        n = M[:, 2].copy()
        if n[0] * c[0] + n[1] * c[1] + n[2] * c[2] > 0:
            n = -n
        a0 = _cross(tv, c)
        a1 = _cross(c, tu)
        a2 = _cross(tu, tv)
        rc = rec[i]
        rc[0], rc[1], rc[2], rc[3] = a0[0], a0[1], a1[0], a1[1]
        rc[4], rc[5], rc[6] = a2[0], a2[1], a2[2]
        rc[7] = tu[0] * a0[0] + tu[1] * a0[1] + tu[2] * a0[2]
        uc, vc = c[0] / c[2], c[1] / c[2]
        lg = math.log(o * 255.0)
        rc[8], rc[9], rc[10], rc[11] = uc, vc, o, 2.0 * lg
        d = m - cen
        dn = math.sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2])
        if dn > 1e-12:
            d /= dn
        for ch in range(3):
            rc[12 + ch] = max(_sh_channel(sh[i], ch, d[0], d[1], d[2]) + 0.5, 0.0)
        rc[15], rc[16], rc[17], rc[18] = n[0], n[1], n[2], c[2]
        # footprint bounds on the z=1 plane (see torch_backend._footprint_bounds)
        k3 = math.sqrt(2.0 * lg)
        r2u = math.sqrt(lg / (0.5 * FILTER_INV_SQUARE)) / fx
        r2v = math.sqrt(lg / (0.5 * FILTER_INV_SQUARE)) / fy
        t00, t01, t02 = k3 * tu[0], k3 * tv[0], c[0]
        t10, t11, t12 = k3 * tu[1], k3 * tv[1], c[1]
        t20, t21, t22 = k3 * tu[2], k3 * tv[2], c[2]
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
        else:  # the disk reaches the camera plane: its image is unbounded
            bounds[i, 0], bounds[i, 1], bounds[i, 2], bounds[i, 3] = -np.inf, np.inf, -np.inf, np.inf
        depth[i] = c[2]
        valid[i] = True


@njit(cache=True, inline="always")
def _overlap(b, t):
    return b[0] <= t[1] and b[1] >= t[0] and b[2] <= t[3] and b[3] >= t[2]


@njit(parallel=True, cache=True)
def _bin(order, bounds, tile_bounds, super_bounds, super_tiles, offsets, pair_tile, write):
    """Count (write=False, into offsets[j+1]) or write the tiles each surfel order[j] overlaps."""
    for j in prange(order.shape[0]):
        b = bounds[order[j]]
        k = offsets[j] if write else 0
        for g in range(super_bounds.shape[0]):
            if _overlap(b, super_bounds[g]):
                for t in super_tiles[g]:
                    if t >= 0 and _overlap(b, tile_bounds[t]):
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


@njit(parallel=True, cache=True, fastmath=FASTMATH)
def _rasterize(start, lst, rec, rays, fx, fy, out):
    n_tiles, P = rays.shape[0], rays.shape[1]
    for t in prange(n_tiles):
        acc = out[t]
        acc[:] = 0.0
        s0, s1 = start[t], start[t + 1]
        if s0 == s1:
            continue
        T = np.ones(P, np.float32)
        done = np.zeros(P, np.bool_)
        ndone = 0
        for p in range(P):
            if not np.isfinite(rays[t, p, 0]):
                done[p] = True
                ndone += 1
        for k in range(s0, s1):
            if ndone == P:
                break
            r = rec[lst[k]]
            a00, a01, a10, a11 = r[0], r[1], r[2], r[3]
            a20, a21, a22, det = r[4], r[5], r[6], r[7]
            uc, vc, op, cut, cz = r[8], r[9], r[10], r[11], r[18]
            for p in range(P):
                if done[p]:
                    continue
                u, v = rays[t, p, 0], rays[t, p, 1]
                du, dv = u - uc, v - vc
                pu, pv = du * fx, dv * fy
                rho = FILTER_INV_SQUARE * (pu * pu + pv * pv)
                qz = a20 * u + a21 * v + a22
                use3 = False
                if qz * det > 0:
                    qa = a00 * du + a01 * dv
                    qb = a10 * du + a11 * dv
                    rho3 = (qa * qa + qb * qb) / (qz * qz)
                    if rho3 <= rho:
                        rho = rho3
                        use3 = True
                if rho > cut:
                    continue
                al = min(op * math.exp(-0.5 * rho), MAX_ALPHA)
                if al < ALPHA_THRESHOLD:
                    continue
                nT = T[p] * (1 - al)
                if nT <= T_MIN:
                    done[p] = True
                    ndone += 1
                    continue
                w = al * T[p]
                z = det / qz if use3 else cz
                acc[p, 0] += w * r[12]
                acc[p, 1] += w * r[13]
                acc[p, 2] += w * r[14]
                acc[p, 3] += w
                acc[p, 4] += w * z
                acc[p, 5] += w * r[15]
                acc[p, 6] += w * r[16]
                acc[p, 7] += w * r[17]
                T[p] = nT


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
    _bin(order, bounds, tab.bounds, tab.super_bounds, tab.super_tiles, offsets, offsets, False)
    np.cumsum(offsets, out=offsets)
    pair_tile = np.empty(offsets[-1], np.int64)
    _bin(order, bounds, tab.bounds, tab.super_bounds, tab.super_tiles, offsets, pair_tile, True)
    start, lst = _sort_pairs(order, offsets, pair_tile, len(tab.bounds))
    out = np.empty(tab.rays.shape[:2] + (8,), np.float32)
    # small chunks: tiles differ widely in cost, and prange otherwise splits them evenly
    previous = numba.set_parallel_chunksize(2)
    try:
        _rasterize(start, lst, rec, tab.rays, np.float32(camera.fx), np.float32(camera.fy), out)
    finally:
        numba.set_parallel_chunksize(previous)
    H, W = camera.height, camera.width
    keep = tab.pixel.reshape(-1) >= 0
    img = np.empty((H * W, 8), np.float32)
    img[tab.pixel.reshape(-1)[keep]] = out.reshape(-1, 8)[keep]
    alpha = img[:, 3]
    rgb = img[:, :3] + (1 - alpha)[:, None] * np.asarray(options.background, np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        depth_img = np.where(alpha > 0, img[:, 4] / alpha, 0).astype(np.float32)
        normal = np.where(alpha[:, None] > 0, img[:, 5:8] / alpha[:, None], 0).astype(np.float32)
    return CameraFrame(rgb=rgb.reshape(H, W, 3), alpha=alpha.reshape(H, W).copy(),
                       depth=depth_img.reshape(H, W), normal=normal.reshape(H, W, 3))
