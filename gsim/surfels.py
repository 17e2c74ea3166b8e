"""`Surfels`: a set of 2D Gaussian surfels (flat, two tangent scales), activated values.

Arrays are all numpy or all torch tensors (tensors keep their autograd graph, so the
torch backend can differentiate through them). Colors are stored as real spherical
harmonics coefficients (N,K,3), K in {1,4,9,16}; plain RGB (N,3) in [0,1] is turned
into the degree-0 coefficient on construction, the 3DGS convention
``rgb = SH_C0 * dc + 0.5``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np
from .errors import InputError
from .sh import SH_C0, eval_sh

_FIELDS = ("means", "quats", "scales", "opacities", "colors", "features")
QUAT_NORM_TOL = 1e-3


def _sh_basis(dirs, k: int):
    """(n,K) the renderers' K SH basis functions at unit directions (n,3) (a float64 tensor, or numpy)."""
    import torch
    t = dirs if torch.is_tensor(dirs) else torch.from_numpy(dirs)
    eye = torch.eye(k, dtype=t.dtype, device=t.device)[None, :, :, None].expand(len(t), k, k, 1)
    out = torch.cat([eval_sh(eye[:, :, j], t) for j in range(k)], 1)
    return out if torch.is_tensor(dirs) else out.numpy()


@functools.lru_cache(maxsize=None)
def _sh_fit(k: int) -> Tuple[np.ndarray, np.ndarray]:
    """Random unit directions (4K,3) and the pseudo-inverse of the basis there: the fixed half of every
    rotation's least-squares fit (actors are turned every frame)."""
    d = np.random.default_rng(0).normal(size=(4 * k, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    return d, np.linalg.pinv(_sh_basis(d, k))


@functools.lru_cache(maxsize=None)
def _sh_fit_on(k: int, device):
    from .render.common import to_device
    return tuple(to_device(x, device) for x in _sh_fit(k))


def sh_rotations(R, k: int):
    """(A,K,K) matrices taking the SH coefficients (K per channel, the renderers' basis) of a colour c(d) to those
    of c(R^T d): the colour of a surfel rotated by R, for each of the rotations R (A,3,3). Fitted exactly by least
    squares on random directions (each band maps to itself). numpy, or float64 tensors on R's device (a training
    step turns its actors' colours there: no copy to the host, which a GPU would wait for)."""
    import torch
    host = not torch.is_tensor(R)
    R = torch.from_numpy(np.asarray(R, np.float64)) if host else R.double()
    d, pinv = _sh_fit_on(k, R.device)
    basis = _sh_basis(torch.einsum("nj,aji->ani", d, R).reshape(-1, 3), k)  # at d @ R for each R
    M = pinv @ basis.reshape(len(R), len(d), k)
    return M.numpy() if host else M


def move_rows(s: "Surfels", rows, owner, R, t, q) -> "Surfels":
    """Torch surfels with the rows ``rows`` (indices) moved rigidly each by its owner's pose: owner (len(rows),)
    indexes R (A,3,3), t (A,3) and q (A,4), R's wxyz quaternion. A view-dependent colour turns with its owner (as
    `Surfels.transformed`). Differentiable; index_select and index_copy, whose backward sums in a fixed order
    (indexing's may not; and Surfels() would validate every array)."""
    import torch

    from .transforms import quat_multiply
    pick = lambda x, i: x.index_select(0, i)  # noqa: E731
    moved = torch.einsum("nij,nj->ni", pick(R, owner), pick(s.means, rows)) + pick(t, owner)
    means = s.means.index_copy(0, rows, moved)
    quats = s.quats.index_copy(0, rows, quat_multiply(pick(q, owner), pick(s.quats, rows)))
    colors = s.colors
    if colors.shape[1] > 1:
        M = sh_rotations(R.detach(), colors.shape[1]).to(colors.dtype)
        colors = colors.index_copy(0, rows, torch.einsum("nkj,njc->nkc", pick(M, owner), pick(colors, rows)))
    return Surfels.derived(means, quats, s.scales, s.opacities, colors, s.features)


def is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def rgb_to_sh(rgb):
    return (rgb - 0.5) / SH_C0


def sh_to_rgb(dc):
    return dc * SH_C0 + 0.5


def _all_finite(x) -> bool:
    if is_tensor(x):
        import torch
        return bool(torch.isfinite(x.detach()).all())
    return bool(np.all(np.isfinite(x)))


def _prepare(name: str, x, tensors: bool):
    if tensors:
        if not is_tensor(x):
            raise TypeError(f"Surfels.{name}: mix of torch tensors and numpy arrays; use one kind")
        if not x.is_floating_point():
            raise TypeError(f"Surfels.{name}: expected a floating-point tensor, got {x.dtype}")
        return x
    if is_tensor(x):
        raise TypeError(f"Surfels.{name}: mix of torch tensors and numpy arrays; use one kind")
    x = np.asarray(x)
    if x.dtype.kind not in "fiu":
        raise TypeError(f"Surfels.{name}: expected numbers, got dtype {x.dtype}")
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)


@dataclass(frozen=True, eq=False)
class Surfels:
    """N surfels in one frame (world, or an actor's box frame).

    means (N,3) m; quats (N,4) unit wxyz, the surfel's local x,y are its tangent
    axes and local z its normal; scales (N,2) m, standard deviations along the
    tangent axes; opacities (N,) in [0,1]; colors (N,K,3) SH coefficients (or (N,3)
    RGB on input); features (N,F) optional per-surfel features for neural heads.
    """

    means: Any
    quats: Any
    scales: Any
    opacities: Any
    colors: Any
    features: Optional[Any] = None

    def __post_init__(self):
        self._check_shapes()
        self._check_values()

    @classmethod
    def derived(cls, means, quats, scales, opacities, colors, features=None) -> "Surfels":
        """Surfels computed from valid ones or from activations (a conversion, a subset, a rigid motion, a
        model's parameters): types and shapes are checked, the values are not (finite, unit quaternions,
        ranges: a pass over every array, a tenth of a CPU training step)."""
        s = object.__new__(cls)
        for k, v in zip(_FIELDS, (means, quats, scales, opacities, colors, features)):
            object.__setattr__(s, k, v)
        s._check_shapes()
        return s

    def _fields_present(self) -> list:
        return list(_FIELDS if self.features is not None else _FIELDS[:-1])

    def _check_shapes(self) -> None:
        tensors = is_tensor(self.means)
        for f in self._fields_present():
            object.__setattr__(self, f, _prepare(f, getattr(self, f), tensors))
        m = self.means
        if m.ndim != 2 or m.shape[1] != 3:
            raise InputError(f"Surfels.means: expected shape (N,3), got {tuple(m.shape)}")
        n = m.shape[0]
        expect = {"quats": (n, 4), "scales": (n, 2), "opacities": (n,)}
        for f, shape in expect.items():
            if tuple(getattr(self, f).shape) != shape:
                raise InputError(f"Surfels.{f}: expected shape {shape}, got {tuple(getattr(self, f).shape)}")
        c = self.colors
        if c.ndim == 2 and c.shape == (n, 3):
            c = rgb_to_sh(c)[:, None, :]
            object.__setattr__(self, "colors", c)
        if c.ndim != 3 or c.shape[0] != n or c.shape[2] != 3 or c.shape[1] not in (1, 4, 9, 16):
            raise InputError(f"Surfels.colors: expected (N,3) RGB or (N,K,3) SH with K in 1,4,9,16 "
                             f"and N={n}, got {tuple(c.shape)}")
        if self.features is not None and (self.features.ndim != 2 or self.features.shape[0] != n):
            raise InputError(f"Surfels.features: expected shape (N,F) with N={n}, got {tuple(self.features.shape)}")

    def _check_values(self) -> None:
        tensors = self.is_torch
        for f in self._fields_present():
            if not _all_finite(getattr(self, f)):
                raise InputError(f"Surfels.{f}: contains NaN or inf")
        q = self.quats.detach() if tensors else self.quats
        norms = (q * q).sum(1) ** 0.5
        bad = (abs(norms - 1) > QUAT_NORM_TOL)
        if bool(bad.any()):
            i = int(bad.nonzero()[0][0]) if not tensors else int(bad.nonzero()[0, 0])
            raise InputError(f"Surfels.quats: quaternion {i} has norm {float(norms[i]):.6g}; expected "
                             f"unit wxyz quaternions (normalize them first; zero is not a rotation)")
        s = self.scales.detach() if tensors else self.scales
        if bool((s < 0).any()):
            raise InputError("Surfels.scales: expected scales >= 0 (metres, activated, not log)")
        o = self.opacities.detach() if tensors else self.opacities
        if bool(((o < 0) | (o > 1)).any()):
            raise InputError("Surfels.opacities: expected values in [0, 1] (activated, not logits)")

    def __len__(self) -> int:
        return int(self.means.shape[0])

    @property
    def sh_degree(self) -> int:
        return int(round(self.colors.shape[1] ** 0.5)) - 1

    @property
    def is_torch(self) -> bool:
        return is_tensor(self.means)

    def arrays(self) -> dict:
        """{name: array} of the fields the surfels have (features only where present)."""
        return {f: getattr(self, f) for f in self._fields_present()}

    def subset(self, idx) -> "Surfels":
        """The surfels at ``idx`` (indices, a boolean mask or a slice), in that order."""
        return Surfels.derived(**{k: v[idx] for k, v in self.arrays().items()})

    def thinned(self, fraction: float, seed: int = 0, at_least: int = 1) -> "Surfels":
        """A uniform random ``fraction`` of the surfels (at least ``at_least``), in their order, their tangent scales
        grown by sqrt(N / n) so that the surface they draw stays covered: fewer, larger surfels, a cheaper and
        blurrier image of the same scene. Same seed, same subset."""
        n = len(self)
        k = min(n, max(int(np.ceil(n * fraction)), at_least))
        if k == n:
            return self
        keep = np.sort(np.random.default_rng(seed).permutation(n)[:k])
        out = self.numpy().subset(keep)
        return Surfels.derived(out.means, out.quats, out.scales * np.float32(np.sqrt(n / k)), out.opacities,
                               out.colors, out.features)

    def numpy(self) -> "Surfels":
        """Detached numpy copy (no-op for numpy surfels)."""
        if not self.is_torch:
            return self
        return Surfels.derived(**{k: v.detach().cpu().numpy() for k, v in self.arrays().items()})

    def torch(self, device=None, dtype=None) -> "Surfels":
        """Torch view; numpy arrays are converted (no gradient), tensors moved/cast."""
        import torch
        conv = (lambda v: v.to(device=device, dtype=dtype)) if self.is_torch else \
            (lambda v: torch.as_tensor(v, device=device, dtype=dtype))
        return Surfels.derived(**{k: conv(v) for k, v in self.arrays().items()})

    @staticmethod
    def concatenate(parts: list["Surfels"]) -> "Surfels":
        """Concatenate surfel sets; SH degrees are padded with zeros to the largest."""
        if not parts:
            raise InputError("Surfels.concatenate: nothing to concatenate")
        k = max(p.colors.shape[1] for p in parts)
        has_feat = [p.features is not None for p in parts]
        if any(has_feat) and not all(has_feat):
            raise InputError("Surfels.concatenate: some parts have features and others do not")
        if parts[0].is_torch:
            import torch
            cat = lambda xs: torch.cat(xs, 0)
            pad = lambda c: torch.nn.functional.pad(c, (0, 0, 0, k - c.shape[1]))
        else:
            cat = lambda xs: np.concatenate(xs, 0)
            pad = lambda c: np.pad(c, ((0, 0), (0, k - c.shape[1]), (0, 0)))
        return Surfels.derived(means=cat([p.means for p in parts]), quats=cat([p.quats for p in parts]),
                       scales=cat([p.scales for p in parts]), opacities=cat([p.opacities for p in parts]),
                       colors=cat([pad(p.colors) for p in parts]),
                       features=cat([p.features for p in parts]) if all(has_feat) else None)

    def transformed(self, T_dst_src: np.ndarray) -> "Surfels":
        """These surfels moved by a rigid 4x4 transform (numpy surfels only)."""
        from .transforms import quat_multiply, rotmat_to_quat
        if self.is_torch:
            raise TypeError("Surfels.transformed: convert to numpy first (surfels.numpy())")
        R, t = T_dst_src[:3, :3], T_dst_src[:3, 3]
        means = (self.means.astype(np.float64) @ R.T + t).astype(self.means.dtype)
        quats = quat_multiply(rotmat_to_quat(R)[None], self.quats).astype(self.quats.dtype)
        colors = self.colors
        if colors.shape[1] > 1 and not np.allclose(R, np.eye(3)):
            colors = np.einsum("kj,njc->nkc", sh_rotations(R[None], colors.shape[1])[0], colors).astype(colors.dtype)
        return Surfels.derived(means=means, quats=quats, scales=self.scales, opacities=self.opacities,
                       colors=colors, features=self.features)
