"""What the numba camera rasterizer (gsim.render.numba_raster) and the LiDAR kernels (gsim.lidar.kernel,
gsim.lidar.sweep) share: the fast-math flags, a surfel's Gaussian falloff, the depth-ordered per-tile surfel
lists (a tile is a block of pixels, a cell of the LiDAR's angle grid or a strip of a sweep) and prange's chunk
size. One copy, so that a camera pixel and a LiDAR ray weigh the same surfel alike.
"""
from __future__ import annotations

import contextlib

import numba
import numpy as np
from numba import njit, prange

# No 'nnan'/'ninf': bounds use +-inf, and the pixel loop computes inf/NaN in lanes it does not select.
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}

# float32 constants keep the pixel and ray loops in single precision (Python literals are float64)
f32 = np.float32
ONE, M_HALF, EXP_FLOOR = f32(1), f32(-0.5), f32(-5.6)
E16, E2, E6, E24, E120, E720, E5040 = f32(1 / 16), f32(1 / 2), f32(1 / 6), f32(1 / 24), f32(1 / 120), f32(1 / 720), f32(1 / 5040)


@njit(cache=True, fastmath=FASTMATH, inline="always")
def exp_neg(x):
    """exp(x) for x in [-6, 0] to ~1e-7 relative, branch-free so the pixel loop vectorizes:
    a degree-7 Taylor series at x/16, squared four times."""
    y = x * E16
    p = ONE + y * (ONE + y * (E2 + y * (E6 + y * (E24 + y * (E120 + y * (E720 + y * E5040))))))
    p = p * p
    p = p * p
    p = p * p
    return p * p


@njit(cache=True, fastmath=FASTMATH, inline="always")
def gaussian(rho):
    """exp(-rho / 2) of a float32 squared Mahalanobis distance, floored at e^-5.6 < 1/255 (where no opacity
    reaches the alpha threshold), within `exp_neg`'s range."""
    return exp_neg(max(M_HALF * rho, EXP_FLOOR))


@njit(cache=True)
def depth_keys(depth, rect):
    """Sort keys of the surfels that meet a tile: the float32 depth's bits (positive floats order like
    their bits) above the index, so that a plain sort of the keys is a stable sort by depth."""
    bits = depth.view(np.int32)
    n = 0
    for i in range(rect.shape[0]):
        n += rect[i, 0] < rect[i, 1]
    keys = np.empty(n, np.int64)
    n = 0
    for i in range(rect.shape[0]):
        if rect[i, 0] < rect[i, 1]:
            keys[n] = (np.int64(bits[i]) << 32) | i
            n += 1
    return keys


@njit(cache=True, inline="always")
def _overlaps(bounds, i, tile_bounds, t):
    """Whether surfel i's footprint bound meets tile t's ray bounds."""
    return ((bounds[i, 0] <= tile_bounds[t, 1]) & (bounds[i, 1] >= tile_bounds[t, 0])
            & (bounds[i, 2] <= tile_bounds[t, 3]) & (bounds[i, 3] >= tile_bounds[t, 2]))


@njit(parallel=True, cache=True)
def tile_lists(order, rect, bounds, tile_bounds, tiles_x, n_parts, wrap=False):
    """Counting sort of the (tile, surfel) overlaps by tile, surfels in ``order`` within a tile: tile
    t's list is lst[start[t]:start[t + 1]]. In parallel over n_parts parts of ``order``, each with its
    own slots in every tile's list. ``wrap``: the rectangles are exact (no bounds test: bounds and
    tile_bounds only give the number of tiles) and their x range may run past tiles_x, wrapping
    around (a 360-degree azimuth grid)."""
    n_tiles, n = tile_bounds.shape[0], order.shape[0]
    pos = np.zeros((n_parts, n_tiles), np.int64)
    for part in prange(n_parts):
        for j in range(part * n // n_parts, (part + 1) * n // n_parts):
            i = order[j]
            for ty in range(rect[i, 2], rect[i, 3]):
                for tx in range(rect[i, 0], rect[i, 1]):
                    t = ty * tiles_x + (tx - tiles_x if tx >= tiles_x else tx)
                    if wrap:
                        pos[part, t] += 1
                    else:
                        pos[part, t] += _overlaps(bounds, i, tile_bounds, t)
    start = np.empty(n_tiles + 1, np.int64)
    total = 0
    for t in range(n_tiles):
        start[t] = total
        for part in range(n_parts):
            total, pos[part, t] = total + pos[part, t], total
    start[n_tiles] = total
    lst = np.empty(total, np.int32)
    for part in prange(n_parts):
        for j in range(part * n // n_parts, (part + 1) * n // n_parts):
            i = order[j]
            for ty in range(rect[i, 2], rect[i, 3]):
                for tx in range(rect[i, 0], rect[i, 1]):
                    t = ty * tiles_x + (tx - tiles_x if tx >= tiles_x else tx)
                    if wrap or _overlaps(bounds, i, tile_bounds, t):  # (short-circuits: bounds unused when wrap)
                        lst[pos[part, t]] = i
                        pos[part, t] += 1
    return start, lst


@contextlib.contextmanager
def small_chunks(size: int = 2):
    """prange in chunks of ``size`` (default 2, for tiles): items differ widely in cost (tiles; surfels, which
    come grouped by kind), and prange otherwise splits them evenly."""
    previous = numba.set_parallel_chunksize(size)
    try:
        yield
    finally:
        numba.set_parallel_chunksize(previous)
