"""The numba camera backend's forward rasterizer: a parallel tile rasterizer on the CPU.

Same math as the torch reference (see torch_backend's docstring), in float32 per
pixel. Steps: per-surfel preprocessing and search of the rectangle of tiles that the
footprint bound meets (parallel), a sort of those surfels by centre depth, per-tile
surfel lists in that order (a parallel counting sort), and per-tile compositing
(parallel over tiles, in small prange chunks so that the two cores share uneven
tiles), LANES pixels of a row at a time as one vector.

Arrays are indexed by scalars in every loop: an array view costs an atomic reference
count, which two threads touching the same array make slow.

numba_grad's differentiable path (and the distortion output) shares the binning and the compositor here;
numba_backend chooses between the two.
"""
from __future__ import annotations

import math
import threading

import numba
import numpy as np
from numba import njit, prange

from ..cameras import Camera
from ..scene import Part
from ..sh import SH_C
from ..surfels import Surfels
from .common import (ALPHA_THRESHOLD, DISTORTION_SCALE, FILTER_INV_SQUARE, MAX_ALPHA, N_RECORD, T_MIN, TILE_SIZE,
                     CameraFrame, RenderOptions, tile_table, world_to_camera)
from .numba_tiles import FASTMATH, ONE, depth_keys, gaussian, small_chunks, tile_lists

# Per-surfel record: common.RECORD_FIELDS (0-17), then the footprint bounds umin umax vmin vmax (18-21).
REC = N_RECORD + 4
C0, C1 = SH_C[0], SH_C[1]
C2, C3 = SH_C[2], SH_C[3]
f64 = np.float64


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _sh_channel(sh, i, ch, x, y, z):
    k = sh.shape[1]
    r = C0 * sh[i, 0, ch]
    if k > 1:
        r += C1 * (-y * sh[i, 1, ch] + z * sh[i, 2, ch] - x * sh[i, 3, ch])
    if k > 4:
        xx, yy, zz = x * x, y * y, z * z
        r += (C2[0] * x * y * sh[i, 4, ch] + C2[1] * y * z * sh[i, 5, ch]
              + C2[2] * (2 * zz - xx - yy) * sh[i, 6, ch] + C2[3] * x * z * sh[i, 7, ch]
              + C2[4] * (xx - yy) * sh[i, 8, ch])
        if k > 9:
            r += (C3[0] * y * (3 * xx - yy) * sh[i, 9, ch] + C3[1] * x * y * z * sh[i, 10, ch]
                  + C3[2] * y * (4 * zz - xx - yy) * sh[i, 11, ch]
                  + C3[3] * z * (2 * zz - 3 * xx - 3 * yy) * sh[i, 12, ch]
                  + C3[4] * x * (4 * zz - xx - yy) * sh[i, 13, ch] + C3[5] * z * (xx - yy) * sh[i, 14, ch]
                  + C3[6] * x * (xx - 3 * yy) * sh[i, 15, ch])
    return r


@njit(cache=True)
def _clipped_disk_bounds(c0, c1, c2, u0, u1, u2, v0, v1, v2, near):
    """[umin, umax, vmin, vmax] of the image of the disk c + (cos t) u + (sin t) v clipped to z >= near.

    The disk is enclosed by a circumscribed 16-gon, clipped by the plane, projected vertex by vertex.
    """
    n = 16
    rad = 1.0 / math.cos(math.pi / n)
    b0, b1, b2, b3 = np.inf, -np.inf, np.inf, -np.inf
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
            b0, b1 = min(b0, x / z), max(b1, x / z)
            b2, b3 = min(b2, y / z), max(b3, y / z)
    return b0, b1, b2, b3


@njit(cache=True, inline="always")
def _beyond(x, z, u, r):
    """Whether the sphere of radius r about (x, ., z) lies wholly where x > u z (past the plane x = u z)."""
    return x - u * z > r * math.sqrt(1.0 + u * u)


@njit(parallel=True, cache=True)
def _preprocess(means, quats, scales, opac, sh, Rcw, tcw, cen, fx, fy, near, far, tile_col_u, tile_row_v,
                rec, depth, rect, closed=False):
    """Per surfel: the rectangle of tiles [x0, x1) x [y0, y1) that its footprint bound meets, as
    rect[i] = x0, x1, y0, y1 (x0 = x1 = 0 for culled surfels), and for the others its record (with
    its footprint bound) and float32 centre depth. ``closed``: the surfels cover closed surfaces with
    outward normals, so those facing away are culled (the surface's near side hides them)."""
    # the pixels' rays span [u_lo, u_hi] x [v_lo, v_hi] on the z=1 plane (unbounded past 90 degrees off axis)
    u_lo, u_hi = tile_col_u[0, 0, 0], tile_col_u[0, 1, tile_col_u.shape[2] - 1]
    v_lo, v_hi = tile_row_v[0, 0, 0], tile_row_v[0, 1, tile_row_v.shape[2] - 1]
    bounded = np.isfinite(u_lo) and np.isfinite(u_hi) and np.isfinite(v_lo) and np.isfinite(v_hi)
    pad = 1e-5 * (1 + max(abs(u_lo), abs(u_hi), abs(v_lo), abs(v_hi)))  # more than the footprint bounds' padding
    u_lo, u_hi, v_lo, v_hi = u_lo - pad, u_hi + pad, v_lo - pad, v_hi + pad
    for i in prange(means.shape[0]):
        rect[i, 0], rect[i, 1] = 0, 0
        o = f64(opac[i])  # float64 maths for any input dtype (numba's float() keeps float32)
        if o * 255.0 <= 1.0:
            continue
        m0, m1, m2 = f64(means[i, 0]), f64(means[i, 1]), f64(means[i, 2])
        c0 = Rcw[0, 0] * m0 + Rcw[0, 1] * m1 + Rcw[0, 2] * m2 + tcw[0]
        c1 = Rcw[1, 0] * m0 + Rcw[1, 1] * m1 + Rcw[1, 2] * m2 + tcw[1]
        c2 = Rcw[2, 0] * m0 + Rcw[2, 1] * m1 + Rcw[2, 2] * m2 + tcw[2]
        if not (c2 > near and c2 < far):
            continue
        lg = math.log(o * 255.0)
        k3 = math.sqrt(2.0 * lg)
        r2u = math.sqrt(lg / (0.5 * FILTER_INV_SQUARE)) / fx
        r2v = math.sqrt(lg / (0.5 * FILTER_INV_SQUARE)) / fy
        s0, s1 = f64(scales[i, 0]), f64(scales[i, 1])
        # Out of view, tested early and conservatively (most surfels of a part that is partly in view are
        # not): the footprint lies in the sphere of the k3-sigma disk and the filter's r2 about the centre
        # ray, so a sphere wholly beyond a side of the pixels' pyramid widened by r2 cannot reach a pixel.
        r = k3 * max(s0, s1) * 1.001 + 1e-9
        if bounded and (_beyond(c0, c2, u_hi + r2u, r) or _beyond(-c0, c2, r2u - u_lo, r)
                        or _beyond(c1, c2, v_hi + r2v, r) or _beyond(-c1, c2, r2v - v_lo, r)):
            continue
        qw, qx, qy, qz = f64(quats[i, 0]), f64(quats[i, 1]), f64(quats[i, 2]), f64(quats[i, 3])
        qn = math.sqrt(qw * qw + qx * qx + qy * qy + qz * qz)
        qw, qx, qy, qz = qw / qn, qx / qn, qy / qn, qz / qn
        # surfel axes (columns of the world rotation) taken into the camera frame; scalar code,
        # since small arrays allocated per surfel cost more than the arithmetic. The normal first: a
        # closed surface's surfels that face away are culled before the rest is computed.
        ez0, ez1, ez2 = 2 * (qx * qz + qw * qy), 2 * (qy * qz - qw * qx), 1 - 2 * (qx * qx + qy * qy)
        n0 = Rcw[0, 0] * ez0 + Rcw[0, 1] * ez1 + Rcw[0, 2] * ez2
        n1 = Rcw[1, 0] * ez0 + Rcw[1, 1] * ez1 + Rcw[1, 2] * ez2
        n2 = Rcw[2, 0] * ez0 + Rcw[2, 1] * ez1 + Rcw[2, 2] * ez2
        if n0 * c0 + n1 * c1 + n2 * c2 > 0:  # face the camera
            if closed:
                continue
            n0, n1, n2 = -n0, -n1, -n2
        ex0, ex1, ex2 = 1 - 2 * (qy * qy + qz * qz), 2 * (qx * qy + qw * qz), 2 * (qx * qz - qw * qy)
        ey0, ey1, ey2 = 2 * (qx * qy - qw * qz), 1 - 2 * (qx * qx + qz * qz), 2 * (qy * qz + qw * qx)
        u0 = (Rcw[0, 0] * ex0 + Rcw[0, 1] * ex1 + Rcw[0, 2] * ex2) * s0
        u1 = (Rcw[1, 0] * ex0 + Rcw[1, 1] * ex1 + Rcw[1, 2] * ex2) * s0
        u2 = (Rcw[2, 0] * ex0 + Rcw[2, 1] * ex1 + Rcw[2, 2] * ex2) * s0
        v0 = (Rcw[0, 0] * ey0 + Rcw[0, 1] * ey1 + Rcw[0, 2] * ey2) * s1
        v1 = (Rcw[1, 0] * ey0 + Rcw[1, 1] * ey1 + Rcw[1, 2] * ey2) * s1
        v2 = (Rcw[2, 0] * ey0 + Rcw[2, 1] * ey1 + Rcw[2, 2] * ey2) * s1
        # rows of adj(H), H = [tu, tv, c]: tv x c, c x tu, tu x tv
        a00, a01, a02 = v1 * c2 - v2 * c1, v2 * c0 - v0 * c2, v0 * c1 - v1 * c0
        a10, a11 = c1 * u2 - c2 * u1, c2 * u0 - c0 * u2
        a20, a21, a22 = u1 * v2 - u2 * v1, u2 * v0 - u0 * v2, u0 * v1 - u1 * v0
        uc, vc = c0 / c2, c1 / c2
        # footprint bounds on the z=1 plane (see torch_backend._footprint_bounds)
        t00, t01, t02 = k3 * u0, k3 * v0, c0
        t10, t11, t12 = k3 * u1, k3 * v1, c1
        t20, t21, t22 = k3 * u2, k3 * v2, c2
        dd = t20 * t20 + t21 * t21 - t22 * t22
        if dd < 0:
            cu = (t00 * t20 + t01 * t21 - t02 * t22) / dd
            cv = (t10 * t20 + t11 * t21 - t12 * t22) / dd
            hu = math.sqrt(max(cu * cu - (t00 * t00 + t01 * t01 - t02 * t02) / dd, 0.0))
            hv = math.sqrt(max(cv * cv - (t10 * t10 + t11 * t11 - t12 * t12) / dd, 0.0))
            b0, b1, b2, b3 = cu - hu, cu + hu, cv - hv, cv + hv
        else:  # the disk reaches the camera plane: bound the part at z >= near instead
            b0, b1, b2, b3 = _clipped_disk_bounds(c0, c1, c2, k3 * u0, k3 * u1, k3 * u2, k3 * v0, k3 * v1, k3 * v2,
                                                  near)
        b0, b1, b2, b3 = min(b0, uc - r2u), max(b1, uc + r2u), min(b2, vc - r2v), max(b3, vc + r2v)
        b0, b1 = b0 - 1e-6 * (1 + abs(b0)), b1 + 1e-6 * (1 + abs(b1))
        b2, b3 = b2 - 1e-6 * (1 + abs(b2)), b3 + 1e-6 * (1 + abs(b3))
        x0, x1 = _span(tile_col_u, 0, b0, b1)
        y0, y1 = _span(tile_row_v, 0, b2, b3)
        if not (x0 < x1 and y0 < y1):
            continue
        rect[i, 0], rect[i, 1], rect[i, 2], rect[i, 3] = x0, x1, y0, y1
        # the record, written entry by entry: a view per surfel would cost a reference count
        rec[i, 0], rec[i, 1], rec[i, 2], rec[i, 3] = a00, a01, a10, a11
        rec[i, 4], rec[i, 5], rec[i, 6], rec[i, 7] = a20, a21, a22, u0 * a00 + u1 * a01 + u2 * a02
        rec[i, 8], rec[i, 9], rec[i, 10] = uc, vc, o
        d0, d1, d2 = m0 - cen[0], m1 - cen[1], m2 - cen[2]
        dn = math.sqrt(d0 * d0 + d1 * d1 + d2 * d2)
        if dn > 1e-12:
            d0, d1, d2 = d0 / dn, d1 / dn, d2 / dn
        for ch in range(3):
            rec[i, 11 + ch] = max(_sh_channel(sh, i, ch, d0, d1, d2) + 0.5, 0.0)
        rec[i, 14], rec[i, 15], rec[i, 16], rec[i, 17] = n0, n1, n2, c2
        rec[i, 18], rec[i, 19], rec[i, 20], rec[i, 21] = b0, b1, b2, b3
        depth[i] = c2


# float32 constants keep the pixel loop in single precision (Python literals are float64)
f32 = np.float32
MAX_A, A_MIN, T_END = f32(MAX_ALPHA), f32(ALPHA_THRESHOLD), f32(T_MIN)
F_INV_SQ, D_SCALE = f32(FILTER_INV_SQUARE), f32(DISTORTION_SCALE)


@njit(cache=True, inline="always")
def _geometry(rec, j):
    """What _splat reads of surfel j's record (loaded once per surfel, outside the pixel loop)."""
    return (rec[j, 0], rec[j, 1], rec[j, 2], rec[j, 3], rec[j, 4], rec[j, 5], rec[j, 6], rec[j, 7], rec[j, 8],
            rec[j, 9], rec[j, 10], rec[j, 17])


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def _splat(u, v, geo, fx, fy, near):
    """A surfel's alpha and depth z at ray (u, v), and the intermediates the backward needs:
    (alpha, z, use3, gaussian, du, dv, qa, qb, qz, rho3, z3). Branch-free: rho3 and z3 may be inf/NaN
    where use3 is False. The forward and the backward share it, so they select the same pixels."""
    a00, a01, a10, a11, a20, a21, a22, det, uc, vc, op, cz = geo
    du, dv = u - uc, v - vc
    pu, pv = du * fx, dv * fy
    rho2 = F_INV_SQ * (pu * pu + pv * pv)
    qz = a20 * u + a21 * v + a22
    qa = a00 * du + a01 * dv
    qb = a10 * du + a11 * dv
    rho3, z3 = (qa * qa + qb * qb) / (qz * qz), det / qz
    # the ray-splat hit wins when it lies beyond the near plane and rho_3d <= rho_2d
    use3 = (z3 > near) & (rho3 <= rho2)
    rho = rho3 if use3 else rho2
    gauss = gaussian(rho)
    return min(op * gauss, MAX_A), z3 if use3 else cz, use3, gauss, du, dv, qa, qb, qz, rho3, z3


@njit(cache=True, inline="always")
def _span(ranges, t, lo, hi):
    """First and one-past-last k whose range [ranges[t, 0, k], ranges[t, 1, k]] can meet [lo, hi] (empty:
    first >= last): branch-free counts, since the tile table's ranges are nondecreasing."""
    first, last = 0, 0
    for k in range(ranges.shape[2]):
        first += ranges[t, 1, k] < lo
        last += ranges[t, 0, k] <= hi
    return first, last


# A tile's state is one flat float32 array of planes (ray u, v, transmittance, then rgb, alpha, depth,
# normal accumulators), each TILE_SIZE rows of stride ROW: the row's pixels, then LANES dead ones
# (T = 0), so that a LANES-wide chunk starting at any pixel of a row stays in the row. The plane
# offsets are uint64 constants: unsigned indices skip numba's negative-index wraparound, and
# constant offsets let LLVM prove that the planes do not alias, so that the chunk loop compiles to
# a single masked vector iteration, without the scalar epilogue of short variable-length rows.
# The tracking compositor adds: the transmittance at the stop, the number of list entries up to the
# last composited one, and the running mean and M2 (Welford) of the distortion's mapped depth.
LANES = 8
ROW = TILE_SIZE + LANES
PLANE = TILE_SIZE * ROW
N_PLANES, N_PLANES_TRACKED = 11, 15
PU, PV, PT, PR, PG, PB, PA, PZ, PNX, PNY, PNZ, PF, PL, PM, PM2 = (np.uint64(k * PLANE) for k in range(N_PLANES_TRACKED))
U_LANES, U_TILE_SIZE = np.uint64(LANES), np.uint64(TILE_SIZE)
REFRESH = 16  # surfels between searches for finished rows


def _make_compositor(track: bool):
    """The tile compositor, with or without tracking (see the planes above). ``track`` is a closure
    constant, so the plain forward compiles without the tracking work."""

    @njit(cache=True, fastmath=FASTMATH, error_model="numpy")
    def composite(t, start, lst, rec, ray_u, ray_v, row_v, col_u, fx, fy, near, st, live_row):
        """Composite tile t's surfel list front to back into its state st (see above)."""
        zero = np.float32(0.0)
        st[:] = zero
        for py in range(TILE_SIZE):
            for px in range(TILE_SIZE):
                u = ray_u[t, py * TILE_SIZE + px]
                if np.isfinite(u):
                    i = py * ROW + px
                    st[PU + i], st[PV + i], st[PT + i] = u, ray_v[t, py * TILE_SIZE + px], ONE
        end = start[t + 1]
        for k0 in range(start[t], end, REFRESH):
            # The rows with unfinished pixels (finished ones, and those without a ray, have T = 0), found
            # every few surfels: cheaper than counting in every chunk the pixels that finish.
            n_live = 0
            for py in range(TILE_SIZE):
                row = np.uint64(py * ROW)
                total = zero
                for px in range(U_TILE_SIZE):
                    total += st[PT + row + px]
                live_row[py] = total > zero
                n_live += total > zero
            if n_live == 0:
                break
            for k in range(k0, min(k0 + REFRESH, end)):
                j = lst[k]
                # only the rows and columns whose rays can fall inside the footprint bound
                y0, y1 = _span(row_v, t, rec[j, 20], rec[j, 21])
                x0, x1 = _span(col_u, t, rec[j, 18], rec[j, 19])
                geo = _geometry(rec, j)
                cr, cg, cb = rec[j, 11], rec[j, 12], rec[j, 13]
                nx, ny, nz = rec[j, 14], rec[j, 15], rec[j, 16]
                n_done = np.float32(k - start[t] + 1)  # exact: a tile's list is far below 2^24 entries
                for py in range(y0, y1):
                    if not live_row[py]:
                        continue
                    for px in range(x0, x1, LANES):
                        row = np.uint64(py * ROW + px)
                        for lane in range(U_LANES):  # branch-free: every choice becomes a vector select
                            i = row + lane
                            al, z = _splat(st[PU + i], st[PV + i], geo, fx, fy, near)[:2]
                            # finished pixels need no test: with T = 0, w = 0 and T stays 0
                            T = st[PT + i]
                            nT = T * (ONE - al)
                            take = al >= A_MIN
                            stop = take & (nT <= T_END)  # exclusive: this surfel is not composited
                            done = take & ~stop
                            w = al * T if done else zero
                            st[PR + i] += w * cr
                            st[PG + i] += w * cg
                            st[PB + i] += w * cb
                            st[PA + i] += w
                            st[PZ + i] += w * z
                            st[PNX + i] += w * nx
                            st[PNY + i] += w * ny
                            st[PNZ + i] += w * nz
                            st[PT + i] = zero if stop else (nT if take else T)
                            if track:
                                st[PF + i] += T if stop else zero  # once: a stopped pixel has T = 0
                                st[PL + i] = n_done if done else st[PL + i]
                                m = D_SCALE / z  # z > near > 0
                                mean = st[PM + i]
                                d = m - mean
                                mean += (w / st[PA + i] if done else zero) * d
                                st[PM + i] = mean
                                st[PM2 + i] += w * d * (m - mean)

    return composite


_composite_tile = _make_compositor(False)


@njit(parallel=True, cache=True)
def _rasterize(start, lst, rec, ray_u, ray_v, pixel, row_v, col_u, fx, fy, near, bg, rgb, alpha, depth, normal):
    for t in prange(ray_u.shape[0]):
        st = np.empty(N_PLANES * PLANE, np.float32)
        live_row = np.empty(TILE_SIZE, np.bool_)
        _composite_tile(t, start, lst, rec, ray_u, ray_v, row_v, col_u, fx, fy, near, st, live_row)
        for p in range(TILE_SIZE * TILE_SIZE):  # finish: over the background, depth and normal divided by alpha
            q = pixel[t, p]
            if q < 0:
                continue
            i = np.uint64(p // TILE_SIZE * ROW + p % TILE_SIZE)
            a = st[PA + i]
            alpha[q] = a
            inv = 1 / a if a > 0 else 0.0
            depth[q] = st[PZ + i] * inv
            for ch in range(3):
                rgb[q, ch] = st[PR + np.uint64(ch * PLANE) + i] + (1 - a) * bg[ch]
                normal[q, ch] = st[PNX + np.uint64(ch * PLANE) + i] * inv


def _out_of_view(part: Part, T_world_camera: np.ndarray, camera: Camera, tab, options: RenderOptions) -> bool:
    """Whether a part's bounding sphere lies wholly outside the view: behind the near plane, past the far
    one, or beyond a side of the pyramid of the pixels' rays (widened by 4 pixels for the screen-space
    filter), so that none of its surfels can reach a pixel."""
    if part.radius is None or part.T_world_part is None:
        return False
    R_cw, t_cw, _ = world_to_camera(T_world_camera)
    x, y, z = R_cw @ part.T_world_part[:3, 3] + t_cw
    r = part.radius
    if z + r <= options.near or z - r >= options.far:
        return True
    u0, u1 = tab.tile_col_u[0, 0] - 4 / camera.fx, tab.tile_col_u[1, -1] + 4 / camera.fx
    v0, v1 = tab.tile_row_v[0, 0] - 4 / camera.fy, tab.tile_row_v[1, -1] + 4 / camera.fy
    if not np.all(np.isfinite([u0, u1, v0, v1])):
        return False
    return bool(_beyond(x, z, u1, r) or _beyond(-x, z, -u0, r) or _beyond(y, z, v1, r) or _beyond(-y, z, -v0, r))


@njit(parallel=True, cache=True)
def _gather(order, rec_in, rect_in, rec, rect):
    """Rows ``order`` of the records and the rectangles, in that order."""
    for j in prange(order.shape[0]):
        i = order[j]
        for k in range(REC):
            rec[j, k] = rec_in[i, k]
        for k in range(4):
            rect[j, k] = rect_in[i, k]


_scratch = threading.local()


def _workspace(n: int) -> list:
    """This thread's scratch arrays for n surfels, kept between renders: fresh arrays of this size (tens of MB
    a frame) cost more in page faults than the preprocessing costs in arithmetic. They grow to the largest
    scene rendered. Records, depths and tile rectangles of all the surfels, then the same records and
    rectangles of those that meet a tile (bin_surfels returns those records)."""
    w = getattr(_scratch, "arrays", None)
    if w is None or len(w[0]) < n:
        cap = n + n // 4
        w = (np.empty((cap, REC), np.float32), np.empty(cap, np.float32), np.empty((cap, 4), np.int32),
             np.empty((cap, REC), np.float32), np.empty((cap, 4), np.int32))
        _scratch.arrays = w
    return [a[:n] for a in w]


_preprocess_serial = njit(cache=True)(_preprocess.py_func)  # (prange runs as range)
SERIAL_BELOW = 8192  # surfels: a part smaller than this is preprocessed on one thread


def bin_surfels(parts, camera: Camera, T_world_camera: np.ndarray, options: RenderOptions):
    """The records (M, REC) float32 (from float64 maths) of the M surfels that meet a tile, in depth order
    (this thread's scratch memory: valid until its next bin_surfels; copy them to keep them), the tiles'
    lists of them (start, lst; see numba_tiles.tile_lists) and which surfel each is (order (M,), an index into the
    surfels or the parts' surfels one after the other). For numpy surfels or `Scene.placed` parts: each
    part is projected from its own frame, with the camera's pose in that frame (records are in camera and
    screen space, so they compose), and nothing is moved or copied."""
    tab = tile_table(camera)
    if isinstance(parts, Surfels):
        parts = [Part(parts, None)]
    parts = [p for p in parts if not _out_of_view(p, T_world_camera, camera, tab, options)]
    N = sum(len(p.surfels) for p in parts)
    rec_all, depth, rect_all, rec, rect = _workspace(N)
    c = np.ascontiguousarray  # any float dtype: the maths is float64 inside
    o = 0
    for s, T_world_part, closed, _ in parts:
        n = len(s)
        T = T_world_camera if T_world_part is None else np.linalg.inv(T_world_part) @ T_world_camera
        R_cw, t_cw, cen = world_to_camera(T)
        sl = slice(o, o + n)
        # a small part (an actor) alone: waking numba's threads for it costs more than its work
        (_preprocess if n >= SERIAL_BELOW else _preprocess_serial)(
            c(s.means), c(s.quats), c(s.scales), c(s.opacities), c(s.colors, np.float32), R_cw, t_cw, cen,
            float(camera.fx), float(camera.fy), float(options.near), float(options.far),
            tab.tile_col_u[None], tab.tile_row_v[None], rec_all[sl], depth[sl], rect_all[sl], closed)
        o += n
    keys = depth_keys(depth, rect_all)
    keys.sort()  # numpy's (vectorized) sort
    order = keys & 0xFFFFFFFF
    # in depth order and compact: the lists then read records in increasing order, and nothing is kept of the
    # surfels that meet no tile
    M = len(order)
    rec, rect = rec[:M], rect[:M]
    _gather(order, rec_all, rect_all, rec, rect)
    # the footprint bounds as the records hold them: padded outward in float64 by more than float32 rounds
    start, lst = tile_lists(np.arange(M), rect, rec[:, 18:22], tab.bounds, tab.tiles_x, numba.get_num_threads())
    return rec, start, lst, order


def rasterize(surfels, camera: Camera, T_world_camera: np.ndarray, options: RenderOptions) -> CameraFrame:
    """The forward image of numpy ``surfels`` (Surfels, or `Scene.placed` parts drawn without moving or copying
    them)."""
    tab = tile_table(camera)
    rec, start, lst, _ = bin_surfels(surfels, camera, T_world_camera, options)
    H, W = camera.height, camera.width
    rgb, normal = np.empty((H * W, 3), np.float32), np.empty((H * W, 3), np.float32)
    alpha, depth_img = np.empty(H * W, np.float32), np.empty(H * W, np.float32)
    with small_chunks():
        _rasterize(start, lst, rec, tab.ray_u, tab.ray_v, tab.pixel, tab.row_v, tab.col_u, np.float32(camera.fx),
                   np.float32(camera.fy), np.float32(options.near), np.asarray(options.background, np.float32),
                   rgb, alpha, depth_img, normal)
    return CameraFrame(rgb=rgb.reshape(H, W, 3), alpha=alpha.reshape(H, W), depth=depth_img.reshape(H, W),
                       normal=normal.reshape(H, W, 3))
