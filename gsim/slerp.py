"""`gsim.transforms.interpolate_poses`' kernel in numba, kept apart: the command line loads gsim.transforms to list
its commands, and numba is among what it must not load then."""
from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True)
def slerp_tracks(times_us, quats, trans, t, out):
    """`interpolate_poses` pose by pose (a rolling LiDAR sweep asks every actor's pose at each of thousands of
    columns: numpy's array steps took 5 ms a sweep for 20 actors): N tracks sharing their times (T,), quats
    (N,T,4), translations (N,T,3), at the times t (M,) into out (N,M,4,4). Nearly equal rotations (|q0.q1| >
    0.9995) are interpolated linearly, then normalised."""
    n_t = times_us.shape[0]
    for m in range(t.shape[0]):
        i = min(max(np.searchsorted(times_us, t[m], side="right"), 1), n_t - 1)
        span = times_us[i] - times_us[i - 1]
        a = min(max((t[m] - times_us[i - 1]) / span, 0.0), 1.0) if span > 0 else 1.0  # (a repeated time: the later)
        for n in range(quats.shape[0]):
            q0, q1 = quats[n, i - 1], quats[n, i]
            d = q0[0] * q1[0] + q0[1] * q1[1] + q0[2] * q1[2] + q0[3] * q1[3]
            s = -1.0 if d < 0 else 1.0
            d = abs(d)
            if d > 0.9995:
                w0, w1 = 1 - a, a
            else:
                th = math.acos(min(d, 1.0))
                w0, w1 = math.sin((1 - a) * th) / math.sin(th), math.sin(a * th) / math.sin(th)
            w, x, y, z = (w0 * q0[0] + w1 * s * q1[0], w0 * q0[1] + w1 * s * q1[1], w0 * q0[2] + w1 * s * q1[2],
                          w0 * q0[3] + w1 * s * q1[3])
            norm = math.sqrt(w * w + x * x + y * y + z * z)
            w, x, y, z = w / norm, x / norm, y / norm, z / norm
            T = out[n, m]
            T[0, 0], T[0, 1], T[0, 2] = 1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)
            T[1, 0], T[1, 1], T[1, 2] = 2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)
            T[2, 0], T[2, 1], T[2, 2] = 2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)
            for k in range(3):
                T[k, 3] = (1 - a) * trans[n, i - 1, k] + a * trans[n, i, k]
            T[3, 0], T[3, 1], T[3, 2], T[3, 3] = 0.0, 0.0, 0.0, 1.0
