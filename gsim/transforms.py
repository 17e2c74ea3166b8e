"""Rigid transforms, quaternions and pose checks.

Conventions (docs/architecture.md): a transform ``T_dst_src`` is a 4x4 float64 matrix that
maps points from ``src`` to ``dst``; quaternions are (w, x, y, z).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
from .errors import InputError

RIGID_TOL = 1e-6


def quat_to_rotmat(q: np.ndarray) -> np.ndarray:
    """(N,4) unit wxyz quaternions -> (N,3,3) rotation matrices."""
    q = np.asarray(q, dtype=np.float64)
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    R = np.empty(q.shape[:-1] + (3, 3))
    R[..., 0, 0] = 1 - 2 * (y * y + z * z)
    R[..., 0, 1] = 2 * (x * y - w * z)
    R[..., 0, 2] = 2 * (x * z + w * y)
    R[..., 1, 0] = 2 * (x * y + w * z)
    R[..., 1, 1] = 1 - 2 * (x * x + z * z)
    R[..., 1, 2] = 2 * (y * z - w * x)
    R[..., 2, 0] = 2 * (x * z - w * y)
    R[..., 2, 1] = 2 * (y * z + w * x)
    R[..., 2, 2] = 1 - 2 * (x * x + y * y)
    return R


def rotmat_to_quat(R: np.ndarray) -> np.ndarray:
    """(N,3,3) rotation matrices -> (N,4) unit wxyz quaternions with w >= 0."""
    R = np.asarray(R, dtype=np.float64)
    m = R.reshape(-1, 3, 3)
    tr = m[:, 0, 0] + m[:, 1, 1] + m[:, 2, 2]
    # Shepperd's method: pick the largest of 4 candidate denominators per matrix.
    cand = np.stack([tr, m[:, 0, 0], m[:, 1, 1], m[:, 2, 2]], axis=1)
    k = np.argmax(cand, axis=1)
    q = np.empty((m.shape[0], 4))
    for case in range(4):
        s = k == case
        if not np.any(s):
            continue
        a = m[s]
        if case == 0:
            r = np.sqrt(1.0 + tr[s]) * 2
            q[s] = np.stack([0.25 * r, (a[:, 2, 1] - a[:, 1, 2]) / r,
                             (a[:, 0, 2] - a[:, 2, 0]) / r, (a[:, 1, 0] - a[:, 0, 1]) / r], 1)
        elif case == 1:
            r = np.sqrt(1.0 + a[:, 0, 0] - a[:, 1, 1] - a[:, 2, 2]) * 2
            q[s] = np.stack([(a[:, 2, 1] - a[:, 1, 2]) / r, 0.25 * r,
                             (a[:, 0, 1] + a[:, 1, 0]) / r, (a[:, 0, 2] + a[:, 2, 0]) / r], 1)
        elif case == 2:
            r = np.sqrt(1.0 + a[:, 1, 1] - a[:, 0, 0] - a[:, 2, 2]) * 2
            q[s] = np.stack([(a[:, 0, 2] - a[:, 2, 0]) / r, (a[:, 0, 1] + a[:, 1, 0]) / r,
                             0.25 * r, (a[:, 1, 2] + a[:, 2, 1]) / r], 1)
        else:
            r = np.sqrt(1.0 + a[:, 2, 2] - a[:, 0, 0] - a[:, 1, 1]) * 2
            q[s] = np.stack([(a[:, 1, 0] - a[:, 0, 1]) / r, (a[:, 0, 2] + a[:, 2, 0]) / r,
                             (a[:, 1, 2] + a[:, 2, 1]) / r, 0.25 * r], 1)
    q *= np.where(q[:, :1] < 0, -1.0, 1.0)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q.reshape(R.shape[:-2] + (4,))


def quat_multiply(a, b):
    """Hamilton product a*b of wxyz quaternions (broadcasting): float64 numpy, or torch tensors (differentiable,
    in their dtype)."""
    if type(a).__module__.startswith("torch"):
        # a's components times b's, permuted and signed: the same sums in the same order as below, in 14 kernels
        # instead of 31 (three products a training step: on a GPU every kernel is a launch)
        import torch
        bw, bx, by, bz = b.unbind(-1)
        nx, ny, nz = -bx, -by, -bz
        S = torch.stack
        return (a[..., 0:1] * b + a[..., 1:2] * S([nx, bw, nz, by], -1) + a[..., 2:3] * S([ny, bz, bw, nx], -1)
                + a[..., 3:4] * S([nz, ny, bx, bw], -1))
    aw, ax, ay, az = np.moveaxis(np.asarray(a, np.float64), -1, 0)
    bw, bx, by, bz = np.moveaxis(np.asarray(b, np.float64), -1, 0)
    return np.stack([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw], -1)


def check_pose(T, name: str = "pose") -> np.ndarray:
    """Return ``T`` as a 4x4 float64 rigid transform or raise ValueError naming ``name``."""
    T = np.asarray(T.detach().cpu().numpy() if hasattr(T, "detach") else T, dtype=np.float64)
    if T.shape != (4, 4):
        raise InputError(f"{name}: expected a 4x4 matrix, got shape {T.shape}")
    return _rigid(T[None], lambda i: name)[0]


def check_poses(P, name: str = "poses") -> np.ndarray:
    """`check_pose` of each of ``P`` (N,4,4) at once (a track of thousands of poses, a simulator's dozens of
    actors each step): returns them as float64 or raises InputError naming the first bad one, ``name[i]``."""
    P = np.asarray(P, dtype=np.float64)
    if P.ndim != 3 or P.shape[1:] != (4, 4):
        raise InputError(f"{name}: expected (N,4,4) matrices, got shape {P.shape}")
    return _rigid(P, lambda i: f"{name}[{i}]")


def _rigid(P: np.ndarray, name) -> np.ndarray:
    """``P`` (N,4,4) float64 if each is a rigid transform, else InputError for the first that is not (``name(i)``
    names it)."""
    R = P[:, :3, :3]
    finite = np.isfinite(P).all((1, 2))
    with np.errstate(invalid="ignore"):
        rigid = ((np.abs(R @ R.transpose(0, 2, 1) - np.eye(3)).max((1, 2)) <= RIGID_TOL * 100)
                 & (np.abs(np.linalg.det(R) - 1) <= 1e-4) & (np.abs(P[:, 3] - [0, 0, 0, 1]).max(1) <= RIGID_TOL))
    for i in np.flatnonzero(~(finite & rigid))[:1]:
        if not finite[i]:
            raise InputError(f"{name(i)}: contains NaN or inf")
        raise InputError(f"{name(i)}: not a rigid transform (rotation must be orthonormal with "
                         f"det +1 and the last row [0, 0, 0, 1])")
    return P


def invert(T: np.ndarray) -> np.ndarray:
    """Inverse of a rigid 4x4 transform, or of each of a stack (...,4,4)."""
    T = np.asarray(T, np.float64)
    Rt = np.swapaxes(T[..., :3, :3], -1, -2)
    Ti = np.zeros_like(T)
    Ti[..., :3, :3] = Rt
    Ti[..., :3, 3] = -np.einsum("...ij,...j->...i", Rt, T[..., :3, 3])
    Ti[..., 3, 3] = 1.0
    return Ti


def look_at(eye, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """T_world_camera for an OpenCV camera (x right, y down, z forward) at ``eye`` looking at ``target``."""
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    z = target - eye
    if np.linalg.norm(z) == 0:
        raise InputError("look_at: eye and target coincide")
    z /= np.linalg.norm(z)
    x = np.cross(z, up)
    if np.linalg.norm(x) < 1e-9:
        raise InputError("look_at: viewing direction is parallel to up")
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    T = np.eye(4)
    T[:3, 0], T[:3, 1], T[:3, 2], T[:3, 3] = x, y, z, eye
    return T


def transform_each(T: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Each point of ``points`` (N,3) moved by its own 4x4 transform ``T`` (N,4,4) (a rolling sweep's poses)."""
    return np.einsum("nij,nj->ni", T[:, :3, :3], points) + T[:, :3, 3]


def bracket(times_us: np.ndarray, t_us) -> Tuple[np.ndarray, np.ndarray]:
    """(i, a) per time of ``t_us`` (M,): it lies a of the way from times_us[i - 1] to times_us[i],
    clamped to the ends (a single time gives i = 0, a = 1: times_us[-1] is that time too; so does a time
    repeated in the track: its later entry)."""
    times_us = np.asarray(times_us, np.int64)
    t = np.atleast_1d(np.asarray(t_us, np.int64))
    if len(times_us) == 1:
        return np.zeros(len(t), np.int64), np.ones(len(t))
    i = np.clip(np.searchsorted(times_us, t, side="right"), 1, len(times_us) - 1)
    t0, span = times_us[i - 1], times_us[i] - times_us[i - 1]
    return i, np.where(span > 0, np.clip((t - t0) / np.maximum(span, 1), 0.0, 1.0), 1.0)


def interpolate_poses(times_us: np.ndarray, poses: np.ndarray, t_us, quats: Optional[np.ndarray] = None) -> np.ndarray:
    """Poses at the times ``t_us`` (M,) from a timed track (T,) / (T,4,4): (M,4,4), linear in
    translation, slerp in rotation. Times outside the track clamp to its ends (an actor holds
    its first/last pose). ``quats``: the track's rotations as (T,4) quaternions, when known.
    Tracks that share their times come stacked: poses (...,T,4,4), quats (...,T,4) -> (...,M,4,4)."""
    times_us = np.asarray(times_us, np.int64)
    poses = np.asarray(poses, np.float64)
    t = np.atleast_1d(np.asarray(t_us, np.int64))
    if len(times_us) == 1 or len(t) == 0:
        return np.repeat(poses[..., :1, :, :], len(t), -3)
    if quats is None:  # the keyframes used, each once (a long track queried at a few times converts a few)
        i, _ = bracket(times_us, t)
        k = np.unique(np.r_[i - 1, i])
        quats = np.zeros(poses.shape[:-2] + (4,))
        quats[..., k, :] = rotmat_to_quat(poses[..., k, :3, :3]).reshape(poses.shape[:-3] + (len(k), 4))
    from .slerp import slerp_tracks  # (numba: the command line loads this module without it)
    lead = poses.shape[:-3]
    out = np.empty(lead + (len(t), 4, 4))
    want = poses.shape[:-2] + (4,)
    quats = np.asarray(quats, np.float64)
    if quats.shape not in (want, want[-2:]):  # (one track's quaternions serve a stack)
        raise InputError(f"interpolate_poses: quats shaped {quats.shape}, expected {want} or {want[-2:]} for poses "
                         f"shaped {poses.shape}")
    quats = np.broadcast_to(quats, want)
    slerp_tracks(times_us, np.ascontiguousarray(quats).reshape(-1, len(times_us), 4),
                  np.ascontiguousarray(poses[..., :3, 3]).reshape(-1, len(times_us), 3), t,
                  out.reshape(-1, len(t), 4, 4))
    return out


def interpolate_pose(times_us: np.ndarray, poses: np.ndarray, t_us: int,
                     quats: Optional[np.ndarray] = None) -> np.ndarray:
    """The pose at one time ``t_us``, as `interpolate_poses` gives it, in scalar arithmetic: a scene places every
    actor for every view it renders, and the array version's set-up cost 0.25 ms a pose (5 ms of a frame with
    20 inserted actors)."""
    times_us = np.asarray(times_us, np.int64)
    if len(times_us) == 1:
        return np.array(poses[0], np.float64)
    t = int(t_us)
    i = min(max(int(np.searchsorted(times_us, t, side="right")), 1), len(times_us) - 1)
    t0, t1 = int(times_us[i - 1]), int(times_us[i])
    a = min(max((t - t0) / (t1 - t0), 0.0), 1.0)
    P0, P1 = np.asarray(poses[i - 1], np.float64), np.asarray(poses[i], np.float64)
    q01 = rotmat_to_quat(np.stack([P0[:3, :3], P1[:3, :3]])) if quats is None else quats[i - 1:i + 1]
    q0, q1 = q01[0].tolist(), q01[1].tolist()
    d = sum(u * v for u, v in zip(q0, q1))
    if d < 0:
        q1, d = [-v for v in q1], -d
    if d > 0.9995:  # nearly equal: linear, then normalised
        w0, w1 = 1 - a, a
    else:
        th = math.acos(min(d, 1.0))
        w0, w1 = math.sin((1 - a) * th) / math.sin(th), math.sin(a * th) / math.sin(th)
    q = [w0 * u + w1 * v for u, v in zip(q0, q1)]
    n = math.sqrt(sum(v * v for v in q))
    w, x, y, z = (v / n for v in q)
    p = (1 - a) * P0[:3, 3] + a * P1[:3, 3]
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y), p[0]],  # quat_to_rotmat's
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x), p[1]],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y), p[2]],
                     [0.0, 0.0, 0.0, 1.0]])
