"""Spinning-sweep kernel (numba, CPU): a sweep composited as an image of (laser, column) rays.

A spinning sensor's rays are regular: laser l fires at elevation el_l and azimuth a_l + step c in column c
(sensor frame). So instead of binning rays (lidar.kernel, for any rays), the sweep is cut into strips of
consecutive columns; a surfel goes to the strips its footprint meets, and within a strip to the lasers
(sorted by elevation) and the runs of columns that its footprint covers, LANES columns at a time.

The footprint holds every ray that can reach alpha >= ALPHA_THRESHOLD (as lidar.kernel's caps, but
tighter): the elevation and azimuth extent of the surfel's cutoff disc seen from the reference origin,
joined with the low-pass filter's cone around its centre, widened by how far the rays' origins (and the
surfel's actor) move from the reference pose and how far the sensor turns. So it changes the work, never a
ray's result: the compositing (front to back by centre distance from the reference origin) is lidar.kernel's.

A still sweep (one sensor pose, actors still) has one reference: footprints are computed once and the strips
take the surfels in one global depth order. A rolling sweep gives each strip its own reference (its middle
column's pose); surfels go to strips by their footprint from the sweep's middle pose, widened by the whole
sweep's motion, and each strip recomputes the footprints from its own and sorts them.
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

from gsim.render.numba_tiles import FASTMATH, ONE, depth_keys, f32, small_chunks, tile_lists

from .kernel import (CHUNK, DX, DY, DZ, LANES, NEAR, OX, OY, OZ, PA, PMED, PNX, PNY, PNZ, PRS, PT, PW, ZERO,
                     actor_ray, scratch, surfel_geometry, world_lanes)

N_DISK = 11  # per surfel (own frame): centre (3), cutoff disc axes U, V (3 + 3), their larger length, sqrt(ln 255 o)
FULL = 4.0  # an azimuth half-width past pi: every column
EPS = 1e-5  # slack on the footprint's sines and angles: far above the float32 kernel's rounding and _atan2's error
RAYS_PER_STRIP = 4096  # per strip (64 lasers x 64 columns): its state, ~230 KB, stays in the core's L2
SURFEL_CHUNK = 4096  # prange chunk over surfels


@njit(parallel=True, cache=True)
def surfel_disks(rec, scales, disk):
    """Per surfel: its alpha >= ALPHA_THRESHOLD disc (centre, axes e_u s_u r and e_v s_v r with
    r = sqrt(2 ln 255 o)), the disc's radius, and sqrt(ln 255 o) for the filter's cone (-1: never visible)."""
    for i in prange(rec.shape[0]):
        o = float(rec[i, 12])
        lg = math.log(max(o, 1e-30) * 255.0)
        r = math.sqrt(2.0 * max(lg, 0.0))
        su, sv = float(scales[i, 0]), float(scales[i, 1])
        for k in range(3):
            disk[i, k] = rec[i, k]
            disk[i, 3 + k] = rec[i, 3 + k] * su * su * r  # rec holds e_u / s_u
            disk[i, 6 + k] = rec[i, 6 + k] * sv * sv * r
        disk[i, 9] = r * max(su, sv)
        disk[i, 10] = math.sqrt(lg) if lg > 0 else -1.0


ATAN = (0.999999747571931, -0.333314448431257, 0.19964464931412923, -0.13998076965206588, 0.09871479965502332,
        -0.05905339094129117, 0.024049005641056165, -0.004661610488046294)  # odd fit on [0, 1], |error| < 2e-7


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _atan2(y, x):
    """atan2 to within 2e-7 rad (far inside EPS), a polynomial: libm's costs a fifth of the footprint."""
    ax, ay = abs(x), abs(y)
    a = min(ax, ay) / max(ax, ay, 1e-300)
    s = a * a
    r = a * (ATAN[0] + s * (ATAN[1] + s * (ATAN[2] + s * (ATAN[3] + s * (ATAN[4] + s * (ATAN[5] + s * (
        ATAN[6] + s * ATAN[7])))))))
    r = 0.5 * math.pi - r if ay > ax else r
    r = math.pi - r if x < 0 else r
    return -r if y < 0 else r


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _footprint(disk, j, M, k, g, d, sin_t, cos_t, tan_div):
    """Surfel j's footprint seen from a reference pose, M[k, g] (3,4) reference_from_group, for rays leaving within
    d (m) of its origin and turned by at most t: (centre distance, sine of the lowest and highest elevation,
    centre azimuth, azimuth half-width (FULL: all)); distance -1: it reaches no ray. (M comes whole with its
    indices: a slice per surfel would touch its reference count from every thread.)"""
    sq = disk[j, 10]
    if sq < 0:
        return -1.0, 0.0, 0.0, 0.0, 0.0
    m0, m1, m2 = disk[j, 0], disk[j, 1], disk[j, 2]
    q0 = M[k, g, 0, 0] * m0 + M[k, g, 0, 1] * m1 + M[k, g, 0, 2] * m2 + M[k, g, 0, 3]
    q1 = M[k, g, 1, 0] * m0 + M[k, g, 1, 1] * m1 + M[k, g, 1, 2] * m2 + M[k, g, 1, 3]
    q2 = M[k, g, 2, 0] * m0 + M[k, g, 2, 1] * m1 + M[k, g, 2, 2] * m2 + M[k, g, 2, 3]
    r3 = disk[j, 9]
    h = math.sqrt(q0 * q0 + q1 * q1)
    dist = math.sqrt(h * h + q2 * q2)
    if dist <= d + r3 + NEAR:
        return dist, -2.0, 2.0, 0.0, FULL
    a0 = M[k, g, 0, 0] * disk[j, 3] + M[k, g, 0, 1] * disk[j, 4] + M[k, g, 0, 2] * disk[j, 5]
    a1 = M[k, g, 1, 0] * disk[j, 3] + M[k, g, 1, 1] * disk[j, 4] + M[k, g, 1, 2] * disk[j, 5]
    a2 = M[k, g, 2, 0] * disk[j, 3] + M[k, g, 2, 1] * disk[j, 4] + M[k, g, 2, 2] * disk[j, 5]
    b0 = M[k, g, 0, 0] * disk[j, 6] + M[k, g, 0, 1] * disk[j, 7] + M[k, g, 0, 2] * disk[j, 8]
    b1 = M[k, g, 1, 0] * disk[j, 6] + M[k, g, 1, 1] * disk[j, 7] + M[k, g, 1, 2] * disk[j, 8]
    b2 = M[k, g, 2, 0] * disk[j, 6] + M[k, g, 2, 1] * disk[j, 7] + M[k, g, 2, 2] * disk[j, 8]
    # the disc: height over distance, the distance within r3 of the centre's
    near, far = dist - r3, dist + r3
    ez = math.sqrt(a2 * a2 + b2 * b2)
    z_hi, z_lo = q2 + ez, q2 - ez
    s_hi = min(z_hi / (near if z_hi >= 0 else far), 1.0)
    s_lo = max(z_lo / (far if z_lo >= 0 else near), -1.0)
    half = FULL  # azimuth: the disc's sideways extent over its least forward one (a tangent >= the angle)
    if h > 0:
        nx, ny = q0 / h, q1 / h
        at, bt, an, bn = a1 * nx - a0 * ny, b1 * nx - b0 * ny, a0 * nx + a1 * ny, b0 * nx + b1 * ny
        forward = h - math.sqrt(an * an + bn * bn)
        if forward > 0:
            half = math.sqrt(at * at + bt * bt) / forward
    # the filter's cone around the centre: an angle <= asin(sf) (tan_div sqrt(lg) >= the angle's tangent)
    sf, sc, cc = min(tan_div * sq, 1.0), q2 / dist, h / dist
    if sf >= cc:
        return dist, -2.0, 2.0, 0.0, FULL
    cf = math.sqrt(1.0 - sf * sf)
    s_hi, s_lo = max(s_hi, sc * cf + cc * sf), min(s_lo, sc * cf - cc * sf)
    y = sf / cc
    half = max(half, y / math.sqrt(1.0 - y * y))  # tan(asin y) >= asin y
    if d > 0 or sin_t > 0:  # motion: any ray within the angle asin(d / near) + t of a footprint direction
        a = min(d / near, 1.0)
        ca = math.sqrt(1.0 - a * a)
        sd, cd = a * cos_t + ca * sin_t, ca * cos_t - a * sin_t
        if cd <= 0:
            return dist, -2.0, 2.0, 0.0, FULL
        ce = math.sqrt(max(1.0 - max(s_lo * s_lo, s_hi * s_hi), 0.0))  # cos of the largest |elevation|
        if ce <= sd:
            half = FULL
        else:
            y = sd / ce
            half += y / math.sqrt(1.0 - y * y)
        ch, cl = math.sqrt(max(1.0 - s_hi * s_hi, 0.0)), math.sqrt(max(1.0 - s_lo * s_lo, 0.0))
        s_hi = 1.0 if (s_hi >= 0 and ch <= sd) else s_hi * cd + ch * sd
        s_lo = -1.0 if (s_lo <= 0 and cl <= sd) else s_lo * cd - cl * sd
    return dist, s_lo - EPS, s_hi + EPS, _atan2(q1, q0), min(half + EPS, FULL)


@njit(cache=True, inline="always")
def _count_below(v, x, inclusive):
    """How many of v are below x (or at most x): np.searchsorted on a sorted v, but branch-free (a binary
    search's mispredicted branches cost more than counting all of a few dozen lasers in vector code)."""
    n = 0
    for i in range(v.shape[0]):
        n += (v[i] <= x) if inclusive else (v[i] < x)
    return n


@njit(cache=True, inline="always")
def _centre_column(az_c, row_az, inv_step, n_cols):
    """The (fractional) column in [0, n_cols) whose nominal azimuth in this row is az_c (inv_step = 1 / step:
    products, not divisions, in the per-laser loops)."""
    cm = (az_c - row_az) * inv_step
    return cm - n_cols * math.floor(cm * (1.0 / n_cols))


@njit(parallel=True, cache=True)
def _footprints(disk, group, M, margin, sin_t, cos_t, tan_div, row_sin, az_min, az_max, step, n_cols, width, fp,
                rect):
    """fp[j] = _footprint of every surfel from the reference M[0] (G,3,4), margin (G,), and its strips as
    rect[j] = x0, x1, 0, 1 (x1 may pass the strip count: wrapping; empty: x0 = x1) from that footprint over the
    lasers whose elevation it spans (az_min / az_max: _range_tables of their column-0 azimuths, elevation order)."""
    n_strips = (n_cols + width - 1) // width
    hw_full = n_cols - width - 1
    for j in prange(disk.shape[0]):
        g = group[j]
        dist, s_lo, s_hi, az_c, half = _footprint(disk, j, M, 0, g, margin[g], sin_t, cos_t, tan_div)
        fp[j, 0], fp[j, 1], fp[j, 2], fp[j, 3], fp[j, 4] = dist, s_lo, s_hi, az_c, half
        rect[j, 0], rect[j, 1], rect[j, 2], rect[j, 3] = 0, 0, 0, 1
        if dist < 0:
            continue
        k0, k1 = _count_below(row_sin, s_lo, False), _count_below(row_sin, s_hi, True)
        if k0 >= k1:
            continue
        hw = half / abs(step)
        if 2 * hw >= hw_full:
            rect[j, 1] = n_strips
            continue
        level = 0
        while (2 << level) <= k1 - k0:
            level += 1
        a_lo = min(az_min[level, k0], az_min[level, k1 - (1 << level)])
        a_hi = max(az_max[level, k0], az_max[level, k1 - (1 << level)])
        first = _centre_column(az_c, a_lo, 1.0 / step, n_cols)  # the lasers' centre columns, unwrapped from it
        other = first + (a_lo - a_hi) / step
        lo, hi = min(first, other), max(first, other)
        c_lo, c_hi = int(math.ceil(lo - hw)), int(math.floor(hi + hw))
        if c_hi - c_lo + 1 >= hw_full:
            rect[j, 1] = n_strips
            continue
        shift = (c_lo // n_cols) * n_cols
        c_lo, c_hi = c_lo - shift, c_hi - shift
        x0 = c_lo // width
        if c_hi < n_cols:
            x1 = c_hi // width + 1
        else:
            x1 = n_strips + (c_hi - n_cols) // width + 1
            if x1 - n_strips > x0:
                x0, x1 = 0, n_strips
        rect[j, 0], rect[j, 1] = x0, x1


@njit(cache=True)
def _front_to_back(dist, idx):
    """idx ordered by dist (float32, >= 0), ties in idx's order: a least-significant-digit radix sort of the
    distances' bits (positive floats order like their bits), 11 bits a pass, stable; a strip's few ten
    thousand surfels sort in a tenth of a merge sort's time."""
    n = idx.shape[0]
    keys, out_keys = dist.view(np.uint32) & np.uint32(0x7FFFFFFF), np.empty(n, np.uint32)  # -0.0 as 0.0
    idx, out_idx = idx.copy(), np.empty(n, idx.dtype)
    for shift in range(0, 32, 11):
        count = np.zeros(2049, np.int64)
        for x in range(n):
            count[((keys[x] >> shift) & 2047) + 1] += 1
        for b in range(2048):
            count[b + 1] += count[b]
        for x in range(n):
            b = (keys[x] >> shift) & 2047
            out_keys[count[b]], out_idx[count[b]] = keys[x], idx[x]
            count[b] += 1
        keys, out_keys, idx, out_idx = out_keys, keys, out_idx, idx
    return idx


@njit(cache=True, inline="always")
def _world_dir(rot, sdirs, r, c):
    """Ray r's world direction: its sensor-frame one turned by its column's rotation (one for all: rot (1,3,3))."""
    R = c if rot.shape[0] > 1 else 0
    d0, d1, d2 = sdirs[r, 0], sdirs[r, 1], sdirs[r, 2]
    return (rot[R, 0, 0] * d0 + rot[R, 0, 1] * d1 + rot[R, 0, 2] * d2,
            rot[R, 1, 0] * d0 + rot[R, 1, 1] * d1 + rot[R, 1, 2] * d2,
            rot[R, 2, 0] * d0 + rot[R, 2, 1] * d1 + rot[R, 2, 2] * d2)


@njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _composite_strips(strip_start, lst, fp, shared, disk, rec, feats, group, M, o_ref, margin, turn,
                      group_from_world, row_sin, row_of, row_az, step, width, origins, rot, sdirs, tan_div,
                      inv_div2, hit_alpha, alpha, range_sum, median, normal, feat_sum):
    """Composite each strip's surfels (lst[strip_start[s]:strip_start[s + 1]]) into its rays.
    Strip s: columns [s width, (s + 1) width), reference origin o_ref[s], M[s] (G,3,4) reference_from_group,
    margin[s] (G,), turn[s] = (sin, cos) of how far the sensor turns from the reference. ``shared``: every
    strip has the reference of fp (footprints) and the list's depth order; else each strip recomputes and
    sorts them. Rays: r = laser n_cols + column from origins (n_cols,3) (world) along sdirs (R,3) (sensor frame)
    turned by rot (n_cols,3,3), or (1,3,3) for one sensor orientation."""
    n_cols, L, F = origins.shape[0], row_sin.shape[0], feats.shape[1]
    cpr = width // LANES  # chunks per laser row
    hit, inv2 = f32(hit_alpha), f32(inv_div2)
    inv_step, inv_sstep = 1.0 / abs(step), 1.0 / step
    full_row = n_cols - width - 1
    for s in prange(strip_start.shape[0] - 1):
        k0, k1 = strip_start[s], strip_start[s + 1]
        c0 = s * width
        c1 = min(c0 + width, n_cols)
        st = np.zeros(L * cpr * CHUNK, np.float32)
        fst = np.zeros(L * cpr * LANES * F, np.float32)
        for l in range(L):
            for c in range(c0, c1):
                i = np.uint64((l * cpr + (c - c0) // LANES) * CHUNK + (c - c0) % LANES)
                r = l * n_cols + c
                st[OX + i], st[OY + i], st[OZ + i] = (origins[c, 0] - o_ref[s, 0], origins[c, 1] - o_ref[s, 1],
                                                      origins[c, 2] - o_ref[s, 2])
                st[DX + i], st[DY + i], st[DZ + i] = _world_dir(rot, sdirs, r, c)
                st[PT + i] = ONE
        # the strip's live surfels (a footprint over at least one laser), front to back, gathered into compact
        # rows: the compositing then reads them in order (random reads of the records, spread over the whole
        # scene, cost more than the compositing when they are interleaved with it)
        n = k1 - k0
        loc = np.empty((n, 5), np.float32)
        keep = np.empty(n, np.int64)
        m = 0
        for q in range(n):
            j = lst[k0 + q]
            if shared:  # (scalars: a row view per surfel would touch fp's reference count from every thread)
                loc[q, 0], loc[q, 1], loc[q, 2], loc[q, 3], loc[q, 4] = fp[j, 0], fp[j, 1], fp[j, 2], fp[j, 3], fp[j, 4]
            else:
                loc[q, 0], loc[q, 1], loc[q, 2], loc[q, 3], loc[q, 4] = _footprint(
                    disk, j, M, s, group[j], margin[s, group[j]], turn[s, 0], turn[s, 1], tan_div)
            k = _count_below(row_sin, loc[q, 1], False)
            if loc[q, 0] >= 0 and k < L and row_sin[k] <= loc[q, 2]:
                keep[m] = q
                m += 1
        keep = keep[:m] if shared else _front_to_back(loc[keep[:m], 0], keep[:m])
        R = rec.shape[1]
        rows = np.empty((m, R + F), np.float32)
        cfp = np.empty((m, 5), np.float32)
        cgroup = np.empty(m, np.int64)
        for p in range(m):
            q = keep[p]
            j = lst[k0 + q]
            for x in range(R):
                rows[p, x] = rec[j, x]
            for x in range(F):
                rows[p, R + x] = feats[j, x]
            for x in range(5):
                cfp[p, x] = loc[q, x]
            cgroup[p] = group[j]
        for j in range(m):
            dist, s_lo, s_hi, az_c, half = cfp[j, 0], cfp[j, 1], cfp[j, 2], cfp[j, 3], cfp[j, 4]
            hw = half * inv_step
            g = cgroup[j]
            geo = surfel_geometry(rows, j)
            w0, w1, w2 = f32(rows[j, 0] - o_ref[s, 0]), f32(rows[j, 1] - o_ref[s, 1]), f32(rows[j, 2] - o_ref[s, 2])
            nx, ny, nz = rows[j, 9], rows[j, 10], rows[j, 11]
            k = _count_below(row_sin, s_lo, False)
            while k < L and row_sin[k] <= s_hi:
                l = row_of[k]
                k += 1
                if 2 * hw >= full_row:
                    a, b, shifts = c0, c1, 1  # the whole strip, once
                else:
                    cm = _centre_column(az_c, row_az[l], inv_sstep, n_cols)
                    a, b, shifts = int(math.ceil(cm - hw)) - n_cols, int(math.floor(cm + hw)) + 1 - n_cols, 3
                for _ in range(shifts):  # the run, and its copies one turn either side (one meets the strip)
                    x0, x1 = max(a, c0), min(b, c1)
                    a, b = a + n_cols, b + n_cols
                    if x0 >= x1:
                        continue
                    for ch in range((x0 - c0) // LANES, (x1 - 1 - c0) // LANES + 1):
                        base = np.uint64((l * cpr + ch) * CHUNK)
                        if g == 0:
                            world_lanes(st, base, w0, w1, w2, geo, nx, ny, nz, inv2, hit)
                        else:  # an actor: each ray taken into its frame at its column
                            for lane in range(LANES):
                                i = base + np.uint64(lane)
                                st[PW + i] = ZERO
                                c = c0 + ch * LANES + lane
                                if c < c1 and st[PT + i] > ZERO:
                                    e0, e1, e2 = _world_dir(rot, sdirs, l * n_cols + c, c)
                                    actor_ray(st, i, group_from_world, g, c, origins[c, 0], origins[c, 1],
                                              origins[c, 2], e0, e1, e2, rows, j, geo, inv2, hit)
                        took = ZERO  # most chunks in a footprint take nothing: skip their feature sums
                        for lane in range(LANES):
                            took = max(took, st[PW + base + np.uint64(lane)])
                        if took == ZERO:
                            continue
                        for f in range(F):
                            fj = rows[j, R + f]
                            fb = ((l * cpr + ch) * F + f) * LANES
                            for lane in range(LANES):
                                fst[fb + lane] += st[PW + base + np.uint64(lane)] * fj
        for l in range(L):
            for c in range(c0, c1):
                x = c - c0
                i = np.uint64((l * cpr + x // LANES) * CHUNK + x % LANES)
                r = l * n_cols + c
                alpha[r], range_sum[r], median[r] = st[PA + i], st[PRS + i], st[PMED + i]
                normal[r, 0], normal[r, 1], normal[r, 2] = st[PNX + i], st[PNY + i], st[PNZ + i]
                for f in range(F):
                    feat_sum[r, f] = fst[((l * cpr + x // LANES) * F + f) * LANES + x % LANES]


def _range_tables(v: np.ndarray):
    """Sparse tables of v's minimum and maximum over [k, k + 2^level) (levels, len(v)): any range's in O(1)."""
    lo, hi = [v], [v]
    while 2 << (len(lo) - 1) <= len(v):
        h = 1 << (len(lo) - 1)
        lo.append(np.pad(np.minimum(lo[-1][:-h], lo[-1][h:]), (0, h), mode="edge"))
        hi.append(np.pad(np.maximum(hi[-1][:-h], hi[-1][h:]), (0, h), mode="edge"))
    return np.stack(lo), np.stack(hi)


def strip_width(lasers: int, strips: int, columns: int) -> int:
    """Columns per strip, LANES-aligned: about RAYS_PER_STRIP rays (a strip's state stays in the core's cache),
    and at least ``strips`` strips."""
    return int(max(LANES, min(256, RAYS_PER_STRIP // lasers, columns // strips) // LANES * LANES))


def render_strips(disk, rec, feats, group, M, o_ref, margin, turn, group_from_world, rows, width, origins, rot, sdirs,
                  divergence: float, hit_alpha: float, out: dict) -> None:
    """Composite a spinning sweep (see the module docstring) into the (R,) arrays of ``out``. Frames: M (K,G,3,4)
    reference_from_group, o_ref (K,3), margin (K,G), turn (K,2): K = 1, one reference for every strip (a still
    sweep), or 1 + the strip count: the whole sweep's (to pick each surfel's strips), then each strip's.
    rows = (row_sin (L,) sorted, row_of (L,) the laser of each, row_az (L,) each laser's azimuth in column 0,
    step) (radians): laser l's ray in column c points at elevation asin(row_sin) and azimuth row_az[l] + c step,
    sdirs (L C,3) in the sensor frame; origins (C,3) and rot (C,3,3) (or (1,3,3): one orientation) the sensor's
    pose per column."""
    row_sin, row_of, row_az, step = rows
    n_cols = len(origins)
    n_strips = (n_cols + width - 1) // width
    tan_div = math.tan(divergence)
    fp, rect = scratch("fp", (len(rec), 5), np.float32), scratch("strip_rect", (len(rec), 4), np.int32)
    az_min, az_max = _range_tables(row_az[row_of])
    with small_chunks(SURFEL_CHUNK):
        _footprints(disk, group, M, margin[0], turn[0, 0], turn[0, 1], tan_div, row_sin, az_min, az_max, step, n_cols,
                    width, fp, rect)
    keys = depth_keys(fp[:, 0].copy(), rect)
    shared = len(M) == 1
    if shared:
        keys.sort()  # one depth order for all strips
    start, lst = tile_lists(keys & 0xFFFFFFFF, rect, rect[:0], np.empty((n_strips, 0)), n_strips,
                             numba.get_num_threads(), True)
    pick = (lambda x: np.ascontiguousarray(np.broadcast_to(x, (n_strips,) + x.shape[1:]))) if shared else \
        (lambda x: np.ascontiguousarray(x[1:]))
    with small_chunks(1):
        _composite_strips(start, lst, fp, shared, disk, rec, feats, group, pick(M), pick(o_ref), pick(margin),
                          pick(turn), group_from_world, row_sin, row_of, row_az, step, width, origins, rot, sdirs,
                          tan_div, 1.0 / divergence ** 2, hit_alpha, out["alpha"], out["range_sum"], out["median"],
                          out["normal"], out["features"])
