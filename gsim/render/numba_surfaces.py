"""The numba backend's surface compositing (`RenderOptions.surface_eps`), forward and backward, on the CPU.

The same image as the torch reference's `_surface_weights`: a pixel's contributions, by their ray-plane hit
depths, fall into surfaces (runs of hits each within eps of the one before); a surface takes the transmittance of
the surfaces in front and splits its coverage 1 - prod(1 - alpha) by alpha times screen area. The tile lists come
in centre-depth order, which is not the hits' order, so nothing is composited while a list streams in: each pixel
keeps its surfaces as sums (the hit range, log prod(1 - alpha), the sum of the shares and the share-weighted
features), sorted and apart by more than eps, joins each contribution to the surface its hit falls in or opens a
new one, and merges two that a hit brings together. So the surfaces are exactly the torch reference's, and once
the list is done they are composited front to back. Up to NS surfaces a pixel: the next joins the nearer of its
neighbours (a pixel seen through many half-transparent layers; the torch reference has no cap). A hit counts
within SURFACE_REACH of its surfel's centre depth, so a pixel stops, as exactly as front to back, once the surfaces
in front take its transmittance to T_MIN and the centres arriving lie beyond their reach.

Every output is linear in the surfaces' share-weighted feature sums (rgb, hit depth, normal, and m and m^2 of the
distortion's mapped depth m = DISTORTION_SCALE / z), with coefficients set by the surfaces' alphas: a
contribution's gradient needs only the final sums, so the backward visits the list in any order, finding each
contribution's surface by its hit depth (the surfaces' ranges are disjoint and hold their members' hits).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ..cameras import Camera
from .common import SURFACE_REACH, TILE_SIZE, CameraFrame, RenderOptions, tile_table
from .numba_raster import A_MIN, D_SCALE, F_INV_SQ, MAX_A, T_END, _geometry, _span, _splat, bin_surfels
from .numba_tiles import FASTMATH, ONE, small_chunks

NS = 16  # surfaces kept per pixel
# a surface's sums: hit range, log prod(1 - alpha), sum of shares, then the share-weighted features
LO, HI, LOGP, SHARE, F0 = 0, 1, 2, 3, 4
N_FEAT = 9  # r g b z nx ny nz m m^2
NF = F0 + N_FEAT
PIX = TILE_SIZE * TILE_SIZE
TINY_AREA = np.float32(1e-6)
REACH, INV_REACH = np.float32(SURFACE_REACH), np.float32(1 / SURFACE_REACH)


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def _hit(geo, z3, use3, near, fx, fy):
    """(hit depth, d depth / d centre depth (0: the plane's hit), share per alpha): the plane's hit where the ray meets
    it beyond the near plane, within SURFACE_REACH of the centre's depth, else the centre's depth; a surfel the
    low-pass draws covers its screen area 2 sigma_u sigma_v px^2 (det = s_u s_v (n . c), so sigma_u sigma_v =
    |det| fx fy / cz^3), up to 1 (torch_backend's)."""
    det, cz = geo[7], geo[11]
    area = min(max(np.float32(2) * abs(det) * fx * fy / (cz * cz * cz), TINY_AREA), ONE)
    lo, hi = cz * INV_REACH, cz * REACH
    if not (np.isfinite(z3) and z3 > near):
        z, dz = cz, ONE
    elif z3 < lo:
        z, dz = lo, INV_REACH
    elif z3 > hi:
        z, dz = hi, REACH
    else:
        z, dz = z3, np.float32(0)
    return z, dz, (ONE if use3 else area)


@njit(cache=True, inline="always")
def _surface_of(co, p, n, z):
    """The surface whose range holds hit z (the first whose top, co[p, k, 0], is not below it; the last if none)."""
    k = 0
    while k < n - 1 and z > co[p, k, 0]:
        k += 1
    return k


@njit(cache=True, inline="always")
def _drop(sl, p, k, n):
    """Slots k+1..n-1 move down by one (slot k is overwritten)."""
    for s in range(k, n - 1):
        for f in range(NF):
            sl[p, s, f] = sl[p, s + 1, f]


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _add(sl, p, n, z, eps1, l1a, share, feat):
    """Pixel p's n surfaces (sorted, apart by more than eps) with a contribution at hit z added; returns the new
    count."""
    k = 0
    while k < n and z > sl[p, k, HI] * eps1:
        k += 1
    if not (k < n and z * eps1 >= sl[p, k, LO]):  # no surface holds it
        if n < NS:  # a new one at k
            for s in range(n, k, -1):
                for f in range(NF):
                    sl[p, s, f] = sl[p, s - 1, f]
            for f in range(NF):
                sl[p, k, f] = 0
            sl[p, k, LO] = sl[p, k, HI] = z
            n += 1
        elif k == n or (k > 0 and z * z < sl[p, k - 1, HI] * sl[p, k, LO]):  # full: the nearer neighbour (ratio)
            k -= 1
    sl[p, k, LO] = min(sl[p, k, LO], z)
    sl[p, k, HI] = max(sl[p, k, HI], z)
    sl[p, k, LOGP] += l1a
    sl[p, k, SHARE] += share
    for f in range(N_FEAT):
        sl[p, k, F0 + f] += share * feat[f]
    # its top may now reach the next surface (its bottom cannot reach the one before: the search passed it)
    if k + 1 < n and sl[p, k, HI] * eps1 >= sl[p, k + 1, LO]:
        sl[p, k, HI] = sl[p, k + 1, HI]
        for f in range(LOGP, NF):
            sl[p, k, f] += sl[p, k + 1, f]
        _drop(sl, p, k + 1, n)
        n -= 1
    return n


@njit(cache=True, inline="always")
def _reach(sl, n, p, eps1, log_end):
    """How deep a later surfel's centre may lie and still count at pixel p: while the surfaces in front of one take
    the transmittance to T_MIN, a hit must join that one or lie in front of it (inf until they do)."""
    lt = np.float32(0)
    for s in range(n):
        lt += sl[p, s, LOGP]
        if lt <= log_end:
            return sl[p, s, HI] * eps1 * REACH
    return np.float32(np.inf)


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _gather_tile(t, start, lst, rec, ray_u, ray_v, row_v, col_u, fx, fy, near, eps1, sl, px):
    """Tile t's surfaces: sl (PIX, NS, NF) the sums, px (PIX, 5) [u, v, surfaces, entries up to the last one
    taken, how deep a later centre may lie (_reach; -1: done)]."""
    log_end = np.float32(math.log(T_END))
    live = 0
    for p in range(PIX):
        u = ray_u[t, p]
        px[p, 0], px[p, 1], px[p, 2], px[p, 3], px[p, 4] = u, ray_v[t, p], 0, 0, np.inf
        if np.isfinite(u):
            live += 1
        else:
            px[p, 4] = -1  # no ray: never composited
    feat = np.empty(N_FEAT, np.float32)
    for k in range(start[t], start[t + 1]):
        if live == 0:
            break
        j = lst[k]
        y0, y1 = _span(row_v, t, rec[j, 20], rec[j, 21])
        x0, x1 = _span(col_u, t, rec[j, 18], rec[j, 19])
        geo = _geometry(rec, j)
        cz = geo[11]
        for c in range(3):
            feat[c] = rec[j, 11 + c]
            feat[4 + c] = rec[j, 14 + c]
        n_done = np.float32(k - start[t] + 1)
        for py in range(y0, y1):
            for qx in range(x0, x1):
                p = py * TILE_SIZE + qx
                if px[p, 4] < cz:  # done: the centres from here on lie beyond its reach (or no ray)
                    if px[p, 4] >= 0:
                        px[p, 4] = -1
                        live -= 1
                    continue
                al, _, use3, _, _, _, _, _, _, _, z3 = _splat(px[p, 0], px[p, 1], geo, fx, fy, near)
                if al < A_MIN:
                    continue
                z, _, share = _hit(geo, z3, use3, near, fx, fy)
                m = D_SCALE / z
                feat[3], feat[7], feat[8] = z, m, m * m
                n = _add(sl, p, int(px[p, 2]), z, eps1, math.log1p(-al), al * share, feat)
                px[p, 2], px[p, 3] = n, n_done
                px[p, 4] = _reach(sl, n, p, eps1, log_end)


@njit(cache=True)
def _composite(sl, p, n, out):
    """out[:10] = the pixel's [sum w rgb, alpha, sum w z, sum w normal, sum w m, sum w m^2] (float64)."""
    out[:] = 0.0
    log_t = 0.0
    for s in range(n):
        lp = np.float64(sl[p, s, LOGP])
        c = math.exp(log_t) * -math.expm1(lp)
        out[3] += c
        c /= sl[p, s, SHARE]
        for f in range(3):
            out[f] += c * sl[p, s, F0 + f]
        for f in range(3, N_FEAT):
            out[f + 1] += c * sl[p, s, F0 + f]
        log_t += lp


@njit(parallel=True, cache=True)
def _rasterize(start, lst, rec, ray_u, ray_v, pixel, row_v, col_u, fx, fy, near, eps1, acc, dist, keep, slots,
               state):
    """acc (P, 8) [sum w rgb, alpha, sum w z, sum w normal] (no background), dist (P,) the distortion; with
    ``keep`` also every pixel's surfaces slots (P, NS, NF) and state (P, 2) [surfaces, entries up to the last
    taken] (what the backward reads)."""
    for t in prange(ray_u.shape[0]):
        sl = np.empty((PIX, NS, NF), np.float32)
        px = np.empty((PIX, 5), np.float32)
        out = np.empty(10)
        _gather_tile(t, start, lst, rec, ray_u, ray_v, row_v, col_u, fx, fy, near, eps1, sl, px)
        for p in range(PIX):
            q = pixel[t, p]
            if q < 0:
                continue
            n = int(px[p, 2])
            _composite(sl, p, n, out)
            for c in range(8):
                acc[q, c] = out[c]
            dist[q] = out[3] * out[9] - out[8] * out[8]  # A sum w m^2 - (sum w m)^2 = A sum w (m - mean)^2
            if keep:
                for s in range(n):
                    for f in range(NF):
                        slots[q, s, f] = sl[p, s, f]
                state[q, 0], state[q, 1] = n, px[p, 3]


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _backward_tile(t, start, lst, rec, ray_u, ray_v, pixel, row_v, col_u, fx, fy, near, slots, state, g_acc, g_dist,
                   co, px, g, grad):
    """Tile t's list entries' gradients: grad[k] = dL/d record of entry k's surfel from this tile's pixels.
    Per pixel and surface: co [top of the range, weight per share c = T (1 - P) / sum share, dL/d log P's
    alpha factor T P G - S_behind, G' = sum of g . the mean feature]; px [u, v, surfaces, entries]; g the
    feature gradients."""
    zero = np.float32(0.0)
    f_sq_x, f_sq_y = np.float32(2) * F_INV_SQ * fx * fx, np.float32(2) * F_INV_SQ * fy * fy
    tot = np.empty(10)
    own = np.empty(NS)
    for p in range(PIX):
        q = pixel[t, p]
        u = ray_u[t, p]
        px[p, 0], px[p, 1], px[p, 2], px[p, 3] = u, ray_v[t, p], 0, 0
        if q < 0 or not np.isfinite(u):
            continue
        n = int(state[q, 0])
        px[p, 2], px[p, 3] = n, state[q, 1]
        _composite(slots, q, n, tot)
        gd = np.float64(g_dist[q])
        # the distortion A sum w m^2 - (sum w m)^2 through the alpha, m and m^2 sums
        g_alpha = g_acc[q, 3] + gd * tot[9]
        for f in range(3):
            g[p, f] = g_acc[q, f]
        for f in range(3, 7):
            g[p, f] = g_acc[q, f + 1]
        g[p, 7], g[p, 8] = -2 * gd * tot[8], gd * tot[3]
        log_t = 0.0
        for s in range(n):
            lp = np.float64(slots[q, s, LOGP])
            gf = 0.0
            for f in range(N_FEAT):
                gf += g[p, f] * slots[q, s, F0 + f]
            gf /= slots[q, s, SHARE]
            T = math.exp(log_t)
            own[s] = T * -math.expm1(lp) * (gf + g_alpha)  # T (1 - P) G
            co[p, s, 0] = slots[q, s, HI]
            co[p, s, 1] = T * -math.expm1(lp) / slots[q, s, SHARE]
            co[p, s, 2] = T * math.exp(lp) * (gf + g_alpha)
            co[p, s, 3] = gf
            log_t += lp
        behind = 0.0  # S_behind: what the surfaces behind show, each scaled by this one's P
        for s in range(n - 1, -1, -1):
            co[p, s, 2] -= behind
            behind += own[s]
    for k in range(start[t], start[t + 1]):
        kl = np.float32(k - start[t])
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
            for qx in range(x0, x1):
                p = py * TILE_SIZE + qx
                if kl >= px[p, 3]:
                    continue  # not taken in the forward (no ray, or past the pixel's stop)
                u, v = px[p, 0], px[p, 1]
                al, _, use3, gauss, du, dv, qa, qb, qz, rho3, z3 = _splat(u, v, geo, fx, fy, near)
                if al < A_MIN:
                    continue
                z, dz, area = _hit(geo, z3, use3, near, fx, fy)
                s = _surface_of(co, p, int(px[p, 2]), z)
                c, a_coef, gf_mean = co[p, s, 1], co[p, s, 2], co[p, s, 3]
                m = D_SCALE / z
                gf = (g[p, 0] * cr + g[p, 1] * cg + g[p, 2] * cb + g[p, 3] * z + g[p, 4] * nx + g[p, 5] * ny
                      + g[p, 6] * nz + g[p, 7] * m + g[p, 8] * m * m)
                w = c * al * area  # its weight
                g_al = a_coef / (ONE - al) + area * c * (gf - gf_mean) if op * gauss <= MAX_A else zero
                gr += w * g[p, 0]
                gg += w * g[p, 1]
                gb += w * g[p, 2]
                gnx += w * g[p, 4]
                gny += w * g[p, 5]
                gnz += w * g[p, 6]
                g_zz = w * (g[p, 3] - (g[p, 7] + 2 * g[p, 8] * m) * m / z)  # dm/dz = -m / z
                gop += g_al * gauss
                g_rho = np.float32(-0.5) * g_al * op * gauss
                iq = ONE / qz
                if use3:  # the ray-splat distance
                    g_qa, g_qb = 2 * g_rho * qa * iq * iq, 2 * g_rho * qb * iq * iq
                    g_qz = -2 * g_rho * rho3 * iq
                    g_du, g_dv = g_qa * a00 + g_qb * a10, g_qa * a01 + g_qb * a11
                else:  # the low-pass's
                    g_qa = g_qb = g_qz = zero
                    g_du, g_dv = g_rho * f_sq_x * du, g_rho * f_sq_y * dv
                if dz == 0:  # the depth is the plane's hit z3 = det / qz
                    g_qz -= g_zz * z3 * iq
                    gdet += g_zz * iq
                else:  # the centre's depth, or a multiple of it
                    gcz += g_zz * dz
                g00 += g_qa * du
                g01 += g_qa * dv
                g10 += g_qb * du
                g11 += g_qb * dv
                g20 += g_qz * u
                g21 += g_qz * v
                g22 += g_qz
                guc -= g_du
                gvc -= g_dv
        grad[k, 0], grad[k, 1], grad[k, 2], grad[k, 3], grad[k, 4], grad[k, 5] = g00, g01, g10, g11, g20, g21
        grad[k, 6], grad[k, 7], grad[k, 8], grad[k, 9], grad[k, 10], grad[k, 11] = g22, gdet, guc, gvc, gop, gr
        grad[k, 12], grad[k, 13], grad[k, 14], grad[k, 15], grad[k, 16], grad[k, 17] = gg, gb, gnx, gny, gnz, gcz


@njit(parallel=True, cache=True)
def _backward(start, lst, rec, ray_u, ray_v, pixel, row_v, col_u, fx, fy, near, slots, state, g_acc, g_dist, grad):
    """grad (entries, N_RECORD): each list entry's dL/d record (see _backward_tile)."""
    for t in prange(ray_u.shape[0]):
        co = np.empty((PIX, NS, 4), np.float32)
        px = np.empty((PIX, 4), np.float32)
        g = np.empty((PIX, N_FEAT), np.float32)
        _backward_tile(t, start, lst, rec, ray_u, ray_v, pixel, row_v, col_u, fx, fy, near, slots, state, g_acc,
                       g_dist, co, px, g, grad)


def composite(args, P: int, eps: float, keep: bool):
    """(acc (P, 8), distortion (P,), what `backward` needs or None) of numba_grad's pixel stage arguments
    ``args`` (the binning, the tile table's arrays, fx, fy, near) composited as surfaces, P pixels."""
    acc, dist = np.empty((P, 8), np.float32), np.empty(P, np.float32)
    slots = np.empty((P if keep else 0, NS, NF), np.float32)
    state = np.empty((P if keep else 0, 2), np.float32)
    with small_chunks():
        _rasterize(*args, np.float32(1 + eps), acc, dist, keep, slots, state)
    return acc, dist, (slots, state) if keep else None


def backward(args, saved, g_acc: np.ndarray, g_dist: np.ndarray, grad: np.ndarray) -> None:
    """grad (entries, N_RECORD): each list entry's dL/d record from float32 output gradients."""
    with small_chunks():
        _backward(*args, *saved, g_acc, g_dist, grad)


def rasterize(surfels, camera: Camera, T_world_camera: np.ndarray, options: RenderOptions) -> CameraFrame:
    """The forward image of numpy ``surfels`` (Surfels or `Scene.placed` parts) composited as surfaces."""
    tab = tile_table(camera)
    rec, start, lst, _ = bin_surfels(surfels, camera, T_world_camera, options)
    args = (start, lst, rec, tab.ray_u, tab.ray_v, tab.pixel, tab.row_v, tab.col_u, np.float32(camera.fx),
            np.float32(camera.fy), np.float32(options.near))
    H, W = camera.height, camera.width
    acc, dist, _ = composite(args, H * W, options.surface_eps, keep=False)
    alpha = acc[:, 3]
    inv = np.where(alpha > 0, 1 / np.maximum(alpha, 1e-30), 0)[:, None]
    rgb = acc[:, :3] + (1 - alpha)[:, None] * np.asarray(options.background, np.float32)
    return CameraFrame(rgb=rgb.reshape(H, W, 3), alpha=alpha.reshape(H, W), depth=(acc[:, 4:5] * inv).reshape(H, W),
                       normal=(acc[:, 5:8] * inv).reshape(H, W, 3).astype(np.float32),
                       distortion=dist.reshape(H, W) if options.distortion else None)
