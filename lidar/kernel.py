"""Ray-surfel LiDAR kernel (numba, CPU): exact 2DGS hits along arbitrary rays, binned on a sphere.

Rays are given in the world: an origin, a unit direction and a column (the firing time's index).
Surfels each live in a frame: group 0 is the world, group g >= 1 an actor's box frame whose pose
can differ per column (``group_from_world`` (G, C, 3, 4)), so a rolling sweep sees the sensor and
every actor where they were when each column fired: a ray is taken into the surfel's frame at its
own column, where the ray-plane hit is exact.

Per ray and surfel (the camera math of gsim.render, with angles in place of pixels):
- the hit t = n.(m - o) / n.d on the surfel plane, local (a, b) = ((p - m).e_u / s_u, (p - m).e_v / s_v),
  rho_3d = a^2 + b^2 (+inf unless t > NEAR);
- the low-pass filter: the beam is a cone of full angle ``divergence``, which plays the camera's
  pixel: rho_2d = FILTER_INV_SQUARE (tan of the angle between the ray and the centre / divergence)^2;
- alpha = min(MAX_ALPHA, opacity exp(-min(rho)/2)), skipped below ALPHA_THRESHOLD; the range is t when
  rho_3d wins, else the centre's distance along the ray;
- front to back by centre distance from the bundle's reference origin; a ray stops (exclusive) once
  its transmittance would fall to T_MIN.
Out per ray: accumulated alpha, the alpha-weighted range sum, the median range (where the
accumulated alpha first reaches ``hit_alpha``), the alpha-weighted world normal (facing the ray)
and feature sums, and optionally the first K contributing surfels (what the torch twin,
lidar.reference, recomposites with gradients).

Binning: a bundle of rays (columns close in time) is binned on a uniform (azimuth, elevation) grid
of its reference frame. Each surfel goes to the cells that the spherical cap holding every ray
that can reach alpha >= ALPHA_THRESHOLD meets: its 3D cutoff sphere seen from the reference origin,
widened by the filter's angle and by how far the bundle's origins (and the surfel's actor) move
from the reference pose. So binning never changes a ray's result, only the work.
The cell lists are the camera rasterizer's depth keys and counting sort (gsim.render.numba_tiles).
"""
from __future__ import annotations

import math
import threading

import numba
import numpy as np
from numba import njit, prange

from gsim.render.common import ALPHA_THRESHOLD, FILTER_INV_SQUARE, MAX_ALPHA, T_MIN
from gsim.render.numba_tiles import FASTMATH, ONE, depth_keys, f32, gaussian, small_chunks, tile_lists

NEAR = 0.01  # m: hits and centres closer along the ray are ignored
RAYS_PER_CELL = 16
MAX_CELL_RAD = math.radians(2.0)  # sparse rays (a training batch): small cells keep the surfel lists short
CAP_SLACK = 2e-3  # rad: the float32 test d.u >= cos(rho) resolves small angles only to ~4e-4 rad
SEAM_BINS = 720  # resolution of the search for an empty azimuth arc (0.5 degrees)
N_REC = 13  # per surfel: centre (3), e_u / s_u (3), e_v / s_v (3), unit normal (3), opacity


@njit(parallel=True, cache=True)
def surfel_records(means, quats, scales, opac, rec):
    """`surfel_record` of every surfel."""
    for i in prange(means.shape[0]):
        surfel_record(i, means, quats, scales, opac, rec)


@njit(cache=True, inline="always")
def surfel_record(i, means, quats, scales, opac, rec):
    """Surfel i's record (in its own frame): centre, inverse-scaled tangent axes, normal, opacity (float64
    maths). One thread's work: the CPU loop's and the CUDA kernel's (lidar.kernel_cuda)."""
    qw, qx, qy, qz = float(quats[i, 0]), float(quats[i, 1]), float(quats[i, 2]), float(quats[i, 3])
    qn = math.sqrt(qw * qw + qx * qx + qy * qy + qz * qz)
    qw, qx, qy, qz = qw / qn, qx / qn, qy / qn, qz / qn
    s0, s1 = 1.0 / float(scales[i, 0]), 1.0 / float(scales[i, 1])
    rec[i, 0], rec[i, 1], rec[i, 2] = means[i, 0], means[i, 1], means[i, 2]
    rec[i, 3] = (1 - 2 * (qy * qy + qz * qz)) * s0
    rec[i, 4] = 2 * (qx * qy + qw * qz) * s0
    rec[i, 5] = 2 * (qx * qz - qw * qy) * s0
    rec[i, 6] = 2 * (qx * qy - qw * qz) * s1
    rec[i, 7] = (1 - 2 * (qx * qx + qz * qz)) * s1
    rec[i, 8] = 2 * (qy * qz + qw * qx) * s1
    rec[i, 9] = 2 * (qx * qz + qw * qy)
    rec[i, 10] = 2 * (qy * qz - qw * qx)
    rec[i, 11] = 1 - 2 * (qx * qx + qy * qy)
    rec[i, 12] = opac[i]


@njit(parallel=True, cache=True)
def _caps(rec, scales, group, world_from_group, o_ref, R_ref, margin, tan_div, grid, rect, depth, cap):
    """`surfel_cap` of every surfel."""
    for i in prange(rec.shape[0]):
        surfel_cap(i, rec, scales, group, world_from_group, o_ref, R_ref, margin, tan_div, grid, rect, depth, cap)


@njit(cache=True, inline="always")
def surfel_cap(i, rec, scales, group, world_from_group, o_ref, R_ref, margin, tan_div, grid, rect, depth, cap):
    """The cells surfel i can reach (see the module docstring) as rect[i] = x0, x1, y0, y1 (empty: x0 = x1;
    x1 may pass n_az on a full-circle grid, wrapping around), its centre distance from the reference origin,
    and cap[i]: the centre relative to that origin and its direction (world axes), and the cosine of the
    cap's angular radius (-2: every direction). grid = (az_lo, az_step, n_az, el_lo, el_step, n_el, circle),
    angles in the reference frame (radians). One thread's work: the CPU loop's and the CUDA kernel's
    (lidar.kernel_cuda)."""
    az_lo, az_step, n_az, el_lo, el_step, n_el = grid[0], grid[1], int(grid[2]), grid[3], grid[4], int(grid[5])
    circle = grid[6] > 0
    rect[i, 0], rect[i, 1] = 0, 0
    o = float(rec[i, 12])
    if o * 255.0 <= 1.0:
        return
    g = group[i]
    m0, m1, m2 = float(rec[i, 0]), float(rec[i, 1]), float(rec[i, 2])
    W = world_from_group[g]
    w0 = W[0, 0] * m0 + W[0, 1] * m1 + W[0, 2] * m2 + W[0, 3] - o_ref[0]
    w1 = W[1, 0] * m0 + W[1, 1] * m1 + W[1, 2] * m2 + W[1, 3] - o_ref[1]
    w2 = W[2, 0] * m0 + W[2, 1] * m1 + W[2, 2] * m2 + W[2, 3] - o_ref[2]
    dist = math.sqrt(w0 * w0 + w1 * w1 + w2 * w2)
    lg = math.log(o * 255.0)
    r3 = math.sqrt(2.0 * lg) * max(float(scales[i, 0]), float(scales[i, 1]))
    d = margin[g]
    full = dist <= d + r3 + NEAR
    rho = 0.0
    if not full:  # the filter's angle: tan_div sqrt(lg) >= its atan
        rho = max(math.asin(r3 / (dist - d)), tan_div * math.sqrt(lg)) + (math.asin(d / dist) if d > 0 else 0.0)
        rho += CAP_SLACK
        full = rho >= 0.5 * math.pi
    inv = 1.0 / max(dist, 1e-30)
    cap[i, 0], cap[i, 1], cap[i, 2] = w0, w1, w2
    cap[i, 3], cap[i, 4], cap[i, 5] = w0 * inv, w1 * inv, w2 * inv
    cap[i, 6] = -2.0 if full else math.cos(rho)
    depth[i] = dist
    full_az = full
    if full:
        y0, y1 = 0, n_el
    else:
        q0 = R_ref[0, 0] * w0 + R_ref[1, 0] * w1 + R_ref[2, 0] * w2
        q1 = R_ref[0, 1] * w0 + R_ref[1, 1] * w1 + R_ref[2, 1] * w2
        sin_el = (R_ref[0, 2] * w0 + R_ref[1, 2] * w1 + R_ref[2, 2] * w2) * inv
        el_c = math.asin(max(-1.0, min(1.0, sin_el)))
        y0 = max(0, int(math.floor((el_c - rho - el_lo) / el_step)))
        y1 = min(n_el, int(math.floor((el_c + rho - el_lo) / el_step)) + 1)
        ce, sr = math.sqrt(max(1.0 - sin_el * sin_el, 0.0)), math.sin(rho)
        full_az = ce <= sr
    if y0 >= y1:
        return
    if full_az:
        x0, x1 = 0, n_az
    else:
        half = math.asin(sr / ce)
        a = (math.atan2(q1, q0) - az_lo) % (2 * math.pi)  # the centre, from az_lo: [0, 2 pi)
        xa, xb = int(math.floor((a - half) / az_step)), int(math.floor((a + half) / az_step)) + 1
        if circle:
            x0, x1 = (xa + n_az, xb + n_az) if xa < 0 else (xa, xb)
            if x1 - x0 >= n_az:
                x0, x1 = 0, n_az
        else:  # a partial grid: the cap, or its copy one turn either side, may meet it (the union's span)
            x0, x1 = max(xa, 0), min(xb, n_az)
            for turn in (2 * math.pi, -2 * math.pi):
                c0 = max(int(math.floor((a + turn - half) / az_step)), 0)
                c1 = min(int(math.floor((a + turn + half) / az_step)) + 1, n_az)
                if c0 < c1:
                    x0, x1 = (min(x0, c0), max(x1, c1)) if x0 < x1 else (c0, c1)
    if x0 < x1:
        rect[i, 0], rect[i, 1], rect[i, 2], rect[i, 3] = x0, x1, y0, y1


@njit(cache=True)
def _ray_lists(cell, n_cells):
    """Counting sort of rays by cell: cell c's rays are order[start[c]:start[c + 1]]."""
    start = np.zeros(n_cells + 1, np.int64)
    for r in range(cell.shape[0]):
        start[cell[r] + 1] += 1
    for c in range(n_cells):
        start[c + 1] += start[c]
    pos = start[:-1].copy()
    order = np.empty(cell.shape[0], np.int64)
    for r in range(cell.shape[0]):
        order[pos[cell[r]]] = r
        pos[cell[r]] += 1
    return start, order


ZERO = f32(0)
MAX_A, A_MIN, T_END = f32(MAX_ALPHA), f32(ALPHA_THRESHOLD), f32(T_MIN)
F_INV_SQ, NEAR32 = f32(FILTER_INV_SQUARE), f32(NEAR)
# A cell's state, per chunk of LANES rays: planes of LANES (ray origin relative to the reference origin,
# direction, transmittance, alpha, range sum, median, normal, this surfel's weight). The plane offsets
# are uint64 constants, as in the camera compositor: no negative-index wraparound, and LLVM can prove
# that the planes do not alias, so the lane loop compiles to vector code.
LANES = 8
N_PLANES = 14
OX, OY, OZ, DX, DY, DZ, PT, PA, PRS, PMED, PNX, PNY, PNZ, PW = (np.uint64(k * LANES) for k in range(N_PLANES))
U_LANES, CHUNK = np.uint64(LANES), N_PLANES * LANES
REFRESH = 16  # surfels between checks for a cell whose rays are all done


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def alpha_range(p0, p1, p2, d0, d1, d2, geo, inv_div2):
    """A surfel's alpha and range along a ray (p = centre - origin, d unit; the surfel's frame), and
    n.d (its sign turns the normal to face the ray). Branch-free, so that the lane loop vectorizes;
    the surfel comes as scalars (`surfel_geometry`): loads from its record inside the loop could alias the
    state's stores, which stops LLVM from vectorizing."""
    eu0, eu1, eu2, ev0, ev1, ev2, nx, ny, nz, op = geo
    tc = p0 * d0 + p1 * d1 + p2 * d2
    front = tc > NEAR32
    tcs = tc if front else ONE
    rho2 = F_INV_SQ * inv_div2 * max(p0 * p0 + p1 * p1 + p2 * p2 - tcs * tcs, ZERO) / (tcs * tcs)
    nd = nx * d0 + ny * d1 + nz * d2
    t = (nx * p0 + ny * p1 + nz * p2) / (nd if nd != ZERO else ONE)
    h0, h1, h2 = t * d0 - p0, t * d1 - p1, t * d2 - p2
    a = h0 * eu0 + h1 * eu1 + h2 * eu2
    b = h0 * ev0 + h1 * ev1 + h2 * ev2
    rho3 = a * a + b * b
    use3 = (nd != ZERO) & (t > NEAR32) & (rho3 <= rho2)
    al = min(op * gaussian(rho3 if use3 else rho2), MAX_A)
    return (al if front else ZERO), (t if use3 else tc), nd


@njit(cache=True, inline="always")
def surfel_geometry(rec, j):
    """What `alpha_range` reads of surfel j's record (N_REC), as scalars loaded once outside the lane loop."""
    return (rec[j, 3], rec[j, 4], rec[j, 5], rec[j, 6], rec[j, 7], rec[j, 8], rec[j, 9], rec[j, 10], rec[j, 11],
            rec[j, 12])


@njit(cache=True, fastmath=FASTMATH, inline="always")
def composite_step(T, acc, al, hit_alpha):
    """One surfel's alpha into a ray whose transmittance is T and accumulated alpha acc: (the new T, the surfel's
    weight, whether acc reaches hit_alpha with it). Front to back; a ray stops (exclusive) where T would fall
    to T_MIN. Branch-free, so that the CPU's lane loop vectorizes; lidar.kernel_cuda composites with it too."""
    nT = T * (ONE - al)
    take = al >= A_MIN
    stop = take & (nT <= T_END)  # exclusive: this surfel is not composited
    w = al * T if take & ~stop else ZERO
    crossed = (w > ZERO) & (acc < hit_alpha) & (acc + w >= hit_alpha)
    return (ZERO if stop else (nT if take else T)), w, crossed


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _update(st, i, al, rng, n0, n1, n2, hit_alpha):
    """Composite one surfel's (alpha, range, facing normal) into the ray at i (`composite_step`)."""
    T, w, crossed = composite_step(st[PT + i], st[PA + i], al, hit_alpha)
    st[PA + i] += w
    st[PRS + i] += w * rng
    st[PMED + i] = rng if crossed else st[PMED + i]
    st[PNX + i] += w * n0
    st[PNY + i] += w * n1
    st[PNZ + i] += w * n2
    st[PW + i] = w
    st[PT + i] = T


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def world_lanes(st, base, w0, w1, w2, geo, nx, ny, nz, inv2, hit) -> None:
    """Composite a world-frame surfel (centre w relative to the reference origin, unit normal n) into the
    LANES rays of the chunk at ``base`` (vector code: rays it misses, or that are done, take nothing)."""
    for lane in range(U_LANES):
        i = base + lane
        d0, d1, d2 = st[DX + i], st[DY + i], st[DZ + i]
        al, rng, nd = alpha_range(w0 - st[OX + i], w1 - st[OY + i], w2 - st[OZ + i], d0, d1, d2, geo, inv2)
        s = -ONE if nd > ZERO else ONE
        _update(st, i, al, rng, s * nx, s * ny, s * nz, hit)


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def _world_chunk(st, base, w0, w1, w2, u0, u1, u2, cos_rho, geo, nx, ny, nz, inv2, hit) -> None:
    """world_lanes for the chunk's rays when one that is not done lies in the surfel's cap (u, cos_rho): most
    chunks of a cell have none, and then only have their weights zeroed. The cap only culls: a ray's alpha
    decides (the cap holds every ray that reaches the threshold, with CAP_SLACK for float32)."""
    reach = 0
    for lane in range(U_LANES):
        i = base + lane
        inside = st[DX + i] * u0 + st[DY + i] * u1 + st[DZ + i] * u2 >= cos_rho
        reach += inside & (st[PT + i] > ZERO)
    if reach == 0:
        for lane in range(U_LANES):
            st[PW + base + lane] = ZERO
    else:
        world_lanes(st, base, w0, w1, w2, geo, nx, ny, nz, inv2, hit)


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def actor_hit(A, g, c, o0, o1, o2, e0, e1, e2, rec, j, geo, inv2):
    """Actor surfel j along the world ray (origin o, direction e) fired at column c: the ray taken into the
    actor's frame by A[g, c] (3,4), its group_from_world at that time (A comes whole: a slice per ray would
    touch its reference count from every thread). Returns alpha, range and the world normal facing the ray."""
    p0 = rec[j, 0] - (A[g, c, 0, 0] * o0 + A[g, c, 0, 1] * o1 + A[g, c, 0, 2] * o2 + A[g, c, 0, 3])
    p1 = rec[j, 1] - (A[g, c, 1, 0] * o0 + A[g, c, 1, 1] * o1 + A[g, c, 1, 2] * o2 + A[g, c, 1, 3])
    p2 = rec[j, 2] - (A[g, c, 2, 0] * o0 + A[g, c, 2, 1] * o1 + A[g, c, 2, 2] * o2 + A[g, c, 2, 3])
    d0 = A[g, c, 0, 0] * e0 + A[g, c, 0, 1] * e1 + A[g, c, 0, 2] * e2
    d1 = A[g, c, 1, 0] * e0 + A[g, c, 1, 1] * e1 + A[g, c, 1, 2] * e2
    d2 = A[g, c, 2, 0] * e0 + A[g, c, 2, 1] * e1 + A[g, c, 2, 2] * e2
    al, rng, nd = alpha_range(f32(p0), f32(p1), f32(p2), f32(d0), f32(d1), f32(d2), geo, inv2)
    s = -1.0 if nd > 0 else 1.0
    nx, ny, nz = rec[j, 9], rec[j, 10], rec[j, 11]  # A^T n: the normal in the world
    return (al, rng, f32(s * (A[g, c, 0, 0] * nx + A[g, c, 1, 0] * ny + A[g, c, 2, 0] * nz)),
            f32(s * (A[g, c, 0, 1] * nx + A[g, c, 1, 1] * ny + A[g, c, 2, 1] * nz)),
            f32(s * (A[g, c, 0, 2] * nx + A[g, c, 1, 2] * ny + A[g, c, 2, 2] * nz)))


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def actor_ray(st, i, A, g, c, o0, o1, o2, e0, e1, e2, rec, j, geo, inv2, hit) -> None:
    """Composite actor surfel j (`actor_hit`) into the ray at i."""
    al, rng, n0, n1, n2 = actor_hit(A, g, c, o0, o1, o2, e0, e1, e2, rec, j, geo, inv2)
    _update(st, i, al, rng, n0, n1, n2, hit)


def _make_compositor(track: bool):
    """The cell compositor; ``track`` (a closure constant) also records each ray's first K contributors."""

    @njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
    def composite(cell_start, lst, ray_start, ray_order, rec, cap, feats, group, group_from_world, o_ref, origins,
                  dirs, column, inv_div2, hit_alpha, alpha, range_sum, median, normal, feat_sum, cand):
        F, K = feats.shape[1], cand.shape[1]
        hit = f32(hit_alpha)
        inv2 = f32(inv_div2)
        for c in prange(cell_start.shape[0] - 1):
            r0, r1 = ray_start[c], ray_start[c + 1]
            if r0 == r1:
                continue
            n = r1 - r0
            chunks = (n + LANES - 1) // LANES
            st = np.zeros(chunks * CHUNK, np.float32)
            fst = np.zeros(chunks * LANES * F, np.float32)
            n_cand = np.zeros(n, np.int64)
            for q in range(n):
                r = ray_order[r0 + q]
                i = np.uint64(q // LANES * CHUNK + q % LANES)
                st[OX + i] = origins[r, 0] - o_ref[0]
                st[OY + i] = origins[r, 1] - o_ref[1]
                st[OZ + i] = origins[r, 2] - o_ref[2]
                st[DX + i], st[DY + i], st[DZ + i] = dirs[r, 0], dirs[r, 1], dirs[r, 2]
                st[PT + i] = ONE
            for k0 in range(cell_start[c], cell_start[c + 1], REFRESH):
                live = ZERO
                for ch in range(chunks):
                    for lane in range(U_LANES):
                        live += st[np.uint64(ch * CHUNK) + PT + lane]
                if live == ZERO:
                    break
                for k in range(k0, min(k0 + REFRESH, cell_start[c + 1])):
                    j = lst[k]
                    g = group[j]
                    geo = surfel_geometry(rec, j)
                    w0, w1, w2, cos_rho = cap[j, 0], cap[j, 1], cap[j, 2], cap[j, 6]
                    u0, u1, u2 = cap[j, 3], cap[j, 4], cap[j, 5]
                    if g == 0:  # the world frame: LANES rays at once
                        nx, ny, nz = rec[j, 9], rec[j, 10], rec[j, 11]
                        for ch in range(chunks):
                            _world_chunk(st, np.uint64(ch * CHUNK), w0, w1, w2, u0, u1, u2, cos_rho, geo, nx, ny, nz,
                                         inv2, hit)
                    else:  # an actor: each ray taken into its frame at the ray's column
                        for q in range(n):
                            r = ray_order[r0 + q]
                            i = np.uint64(q // LANES * CHUNK + q % LANES)
                            st[PW + i] = ZERO
                            if st[PT + i] == ZERO or (dirs[r, 0] * u0 + dirs[r, 1] * u1 + dirs[r, 2] * u2 < cos_rho):
                                continue
                            actor_ray(st, i, group_from_world, g, column[r], origins[r, 0], origins[r, 1],
                                      origins[r, 2], dirs[r, 0], dirs[r, 1], dirs[r, 2], rec, j, geo, inv2, hit)
                    for f in range(F):
                        fj = feats[j, f]
                        for q in range(n):
                            fst[q * F + f] += st[PW + np.uint64(q // LANES * CHUNK + q % LANES)] * fj
                    if track:
                        for q in range(n):
                            if st[PW + np.uint64(q // LANES * CHUNK + q % LANES)] > ZERO and n_cand[q] < K:
                                cand[ray_order[r0 + q], n_cand[q]] = j
                                n_cand[q] += 1
            for q in range(n):
                r = ray_order[r0 + q]
                i = np.uint64(q // LANES * CHUNK + q % LANES)
                alpha[r], range_sum[r], median[r] = st[PA + i], st[PRS + i], st[PMED + i]
                normal[r, 0], normal[r, 1], normal[r, 2] = st[PNX + i], st[PNY + i], st[PNZ + i]
                for f in range(F):
                    feat_sum[r, f] = fst[q * F + f]

    return composite


_composite = _make_compositor(False)
_composite_tracked = _make_compositor(True)


def ray_grid(az, el):
    """A uniform (azimuth, elevation) grid over the rays' directions (radians, reference frame):
    (az_lo, az_step, n_az, el_lo, el_step, n_el, circle) and each ray's cell (`grid_of`, `grid_cells`)."""
    grid = grid_of(np.bincount(seam_bins(az), minlength=SEAM_BINS) > 0, float(el.min()), float(el.max()), len(az))
    return grid, grid_cells(az, el, grid)


def _int64(x):
    return x.astype(np.int64) if isinstance(x, np.ndarray) else x.long()


def seam_bins(az):
    """Each azimuth's bin of SEAM_BINS around the circle (numpy or torch alike: the CUDA kernel's grids)."""
    return _int64((az + np.pi) * (SEAM_BINS / (2 * np.pi))) % SEAM_BINS


def grid_of(occupied: np.ndarray, el_min: float, el_max: float, n_rays: int) -> np.ndarray:
    """`ray_grid`'s numbers from its rays' occupied seam bins (SEAM_BINS,) bool, elevation range and count. The
    azimuth range is the whole circle when the rays leave no empty arc of SEAM_BINS; else it starts after the
    largest one."""
    bin_w = 2 * np.pi / SEAM_BINS
    if occupied.all():
        az_lo, span, circle = -np.pi, 2 * np.pi, 1.0
    else:
        empty = np.concatenate([~occupied, ~occupied])  # circular: the longest run of empty bins
        runs = np.diff(np.concatenate([[0], empty.astype(np.int8), [0]]))
        starts, ends = np.nonzero(runs == 1)[0], np.nonzero(runs == -1)[0]
        k = int(np.argmax(np.minimum(ends - starts, SEAM_BINS)))
        az_lo = -np.pi + (ends[k] % SEAM_BINS) * bin_w
        span, circle = (SEAM_BINS - min(ends[k] - starts[k], SEAM_BINS)) * bin_w, 0.0
    el_lo, el_span = el_min, max(el_max - el_min, 1e-9)
    step = min(max(math.sqrt(span * el_span * RAYS_PER_CELL / n_rays), 1e-6), MAX_CELL_RAD)
    n_az = max(1, min(int(math.ceil(span / step)), 1 << 14))
    n_el = max(1, min(int(math.ceil(el_span / step)), 1 << 10))
    return np.array([az_lo, span / n_az, n_az, el_lo, el_span * (1 + 1e-9) / n_el + 1e-12, n_el, circle])


def grid_cells(az, el, grid):
    """Each direction's cell in ``grid`` (ray_grid's 7 numbers, or a row of them per direction), numpy or torch
    alike (the CUDA kernel's cells are the numba kernel's)."""
    x = _int64(((az - grid[..., 0]) % (2 * np.pi)) // grid[..., 1]).clip(max=_int64(grid[..., 2]) - 1)
    y = _int64((el - grid[..., 3]) // grid[..., 4]).clip(max=_int64(grid[..., 5]) - 1)
    return y * _int64(grid[..., 2]) + x


def bundle_grid(dirs, rays, R_ref):
    """`ray_grid` of the rays ``rays`` (world directions ``dirs``, numpy) in the reference frame R_ref."""
    d_ref = np.einsum("ji,rj->ri", R_ref, dirs[rays])  # R_ref^T d (einsum: a BLAS call leaves its threads spinning)
    return ray_grid(np.arctan2(d_ref[:, 1], d_ref[:, 0]), np.arcsin(np.clip(d_ref[:, 2], -1.0, 1.0)))


_WORK = threading.local()


def scratch(name: str, shape: tuple, dtype) -> np.ndarray:
    """A scratch array kept per thread and reused across calls: fresh pages of large arrays cost more to fault
    in than the binning that fills them."""
    n = int(np.prod(shape))
    buf = getattr(_WORK, name, None)
    if buf is None or buf.size < n or buf.dtype != dtype:
        buf = np.empty(n, dtype)
        setattr(_WORK, name, buf)
    return buf[:n].reshape(shape)


def bin_bundle(rec, scales, group, world_from_group, margin, dirs, rays, o_ref, R_ref, divergence: float):
    """A bundle's binning (see the module docstring): each ray's cell, each surfel's cap (N,7), and per cell of the
    bundle's grid its surfels in depth order, lst[cell_start[c]:cell_start[c + 1]]. cap is this thread's scratch:
    the next bundle overwrites it."""
    grid, cell = bundle_grid(dirs, rays, R_ref)
    n = rec.shape[0]
    rect, depth = scratch("rect", (n, 4), np.int64), scratch("depth", (n,), np.float32)
    cap = scratch("cap", (n, 7), np.float32)
    _caps(rec, scales, group, world_from_group, o_ref, R_ref, margin, math.tan(divergence), grid, rect, depth, cap)
    keys = depth_keys(depth, rect)
    keys.sort()
    n_az, n_cells = int(grid[2]), int(grid[2] * grid[5])
    cell_start, lst = tile_lists(keys & 0xFFFFFFFF, rect, rect[:0], np.empty((n_cells, 0)), n_az,
                                 numba.get_num_threads(), True)  # wrap: exact rectangles, no bounds
    return cell, cap, cell_start, lst


def render_bundle(rec, scales, feats, group, world_from_group, group_from_world, margin, origins, dirs, column,
                  o_ref, R_ref, divergence: float, hit_alpha: float, out: dict, rays: np.ndarray) -> None:
    """Composite the rays ``rays`` (indices into origins/dirs/column) into the arrays of ``out``.

    world_from_group (G,3,4): each group's pose at the reference time; margin (G,): how far (m) a
    group's surfels and the bundle's ray origins can be from where the reference pose puts them."""
    cell, cap, cell_start, lst = bin_bundle(rec, scales, group, world_from_group, margin, dirs, rays, o_ref, R_ref,
                                            divergence)
    ray_start, order = _ray_lists(cell, len(cell_start) - 1)
    fn = _composite_tracked if out["candidates"].shape[1] else _composite
    with small_chunks():
        fn(cell_start, lst, ray_start, rays[order], rec, cap, feats, group, group_from_world, o_ref, origins, dirs,
           column, 1.0 / divergence ** 2, hit_alpha, out["alpha"], out["range_sum"], out["median"], out["normal"],
           out["features"], out["candidates"])


@njit(parallel=True, cache=True)
def fill_frame(hit, start, alpha, range_sum, median, normal, intensity, directions, time_offsets, rot, points,
               ranges, ring, column, times, normals, intensity_out, range_image, expected, alpha_image):
    """render_lidar's frame from a trace, laser by laser (laser l's returns from start[l]): points along the
    sensor-frame directions, normals turned into the sensor frame of their column (rot (C,3,3), or (1,3,3)
    for one orientation) and normalised."""
    L, C = range_image.shape
    for l in prange(L):
        m = start[l]
        for c in range(C):
            r = l * C + c
            a = alpha[r]
            alpha_image[l, c] = a
            expected[l, c] = range_sum[r] / a if a > 0 else 0.0
            range_image[l, c] = median[r] if hit[r] else 0.0
            if not hit[r]:
                continue
            d = median[r]
            R = rot[c if rot.shape[0] > 1 else 0]
            n0 = R[0, 0] * normal[r, 0] + R[1, 0] * normal[r, 1] + R[2, 0] * normal[r, 2]
            n1 = R[0, 1] * normal[r, 0] + R[1, 1] * normal[r, 1] + R[2, 1] * normal[r, 2]
            n2 = R[0, 2] * normal[r, 0] + R[1, 2] * normal[r, 1] + R[2, 2] * normal[r, 2]
            inv = 1.0 / max(math.sqrt(n0 * n0 + n1 * n1 + n2 * n2), 1e-12)
            for k in range(3):
                points[m, k] = directions[r, k] * d
            normals[m, 0], normals[m, 1], normals[m, 2] = n0 * inv, n1 * inv, n2 * inv
            ranges[m], ring[m], column[m], times[m] = d, l, c, time_offsets[r]
            if intensity_out.shape[0]:
                intensity_out[m] = intensity[r]
            m += 1


@njit(cache=True)
def actor_margins(world_from_group, cols, mid, radius, margin):
    """`lidar.render.bundle_frame`'s actors' margins (groups 1..G-1): 1.05 x the most, over the columns, that the
    group's origin moves from its pose at the middle column plus its turn (rad) x its radius, + 1 mm (numpy's array
    steps over (actors, columns) took 0.7 ms a bundle for 24 actors)."""
    for g in range(1, world_from_group.shape[0]):
        M = world_from_group[g, mid]
        most = 0.0
        for c in cols:
            P = world_from_group[g, c]
            move = math.sqrt((P[0, 3] - M[0, 3]) ** 2 + (P[1, 3] - M[1, 3]) ** 2 + (P[2, 3] - M[2, 3]) ** 2)
            trace = 0.0  # of P R_mid^T: sum_ij P_ij M_ij
            for i in range(3):
                for j in range(3):
                    trace += P[i, j] * M[i, j]
            most = max(most, move + math.acos(min(max((trace - 1) / 2, -1.0), 1.0)) * radius[g])
        margin[g] += 1.05 * most + 1e-3
