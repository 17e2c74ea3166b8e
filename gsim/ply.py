"""Read and write 3D/2D Gaussian Splatting ``.ply`` files (numpy only).

The file stores *raw* (pre-activation) values per vertex, in the frame the splats
were trained in (here: the world frame, metres): ``x y z`` position, ``f_dc_0..2`` /
``f_rest_*`` SH coefficients (``f_rest`` channel-major: index ``c*(K-1) + k`` holds
coefficient ``k+1`` of channel ``c``), ``opacity`` (a logit), ``scale_i`` (natural log
of metres) and ``rot_0..3`` (a wxyz quaternion, not necessarily normalized).
`load_ply` activates them in float64 into a `Surfels` (sigmoid, exp, normalize);
`save_ply` writes the 3DGS property order as little-endian float32.

3DGS files have three scales: the axis with the smallest scale becomes the surfel
normal (local z), the other two the tangent axes. `save_ply` writes, for layout
"3dgs", ``scale_2 = min(scale_0, scale_1) - ln(1000)`` (a disk 1000x thinner than its
smaller axis), so splat viewers show a flat disk and `load_ply` picks axis 2 back.

Exactness: PLY -> `load_ply` -> `save_ply` reproduces the raw float32 values
bit-exactly when the file's quaternions are unit-norm within float32 (|norm-1| <=
1e-6: such quaternions are kept as stored, others are normalized), its opacity logits
satisfy |logit| <= 20 and no logit / log-scale is a nonzero value of magnitude below
~1e-7 (float64 sigmoid/logit and exp/log then round-trip within float32 precision),
and, for 3DGS files, ``scale_2`` is the value `save_ply` writes (it is not stored in
`Surfels`). `save_ply` clamps opacities to [1e-12, 1-1e-12] and scales to >= 1e-12 m
so that 0 and 1 give finite logits/logs. SH degree is kept; per-surfel ``features``
are not stored in PLY. gsim scene directories (`gsim.save_scene`) are bit-exact.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Union

import numpy as np

from .errors import InputError, SceneFormatError
from .io import atomic_path
from .surfels import Surfels
from .transforms import quat_to_rotmat, rotmat_to_quat

PathLike = Union[str, os.PathLike]

_TYPES = {"char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1", "short": "i2", "int16": "i2",
          "ushort": "u2", "uint16": "u2", "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
          "float": "f4", "float32": "f4", "double": "f8", "float64": "f8"}
_FORMATS = {"ascii": None, "binary_little_endian": "<", "binary_big_endian": ">"}
_REQUIRED = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1",
             "rot_0", "rot_1", "rot_2", "rot_3"]
_QUAT_UNIT_TOL = 1e-6  # quaternions this close to unit norm are kept as stored (exact round trip)
_OPACITY_EPS = 1e-12
_MIN_SCALE = 1e-12  # m
_LN_1000 = float(np.log(1000.0))


def _parse_header(data: bytes, path: Path):
    """Return (format, elements, data offset); elements are (name, count, [(name, type|None)])."""
    err = lambda msg: SceneFormatError(f"{path}: {msg}")
    if not re.match(rb"ply\r?\n", data[:5]):
        raise err("not a PLY file (expected the magic line 'ply' at the start)")
    m = re.search(rb"\nend_header[ \t]*\r?\n", data)
    if m is None:
        raise err("PLY header has no 'end_header' line")
    try:
        lines = data[:m.start()].decode("ascii").splitlines()[1:]
    except UnicodeDecodeError:
        raise err("PLY header is not ASCII text") from None
    fmt, elements = None, []
    for line in lines:
        tok = line.split()
        if not tok or tok[0] in ("comment", "obj_info"):
            continue
        if tok[0] == "format":
            if len(tok) != 3 or tok[1] not in _FORMATS or tok[2] != "1.0":
                raise err(f"unsupported format line {line.strip()!r}; expected 'format "
                          f"binary_little_endian|binary_big_endian|ascii 1.0'")
            fmt = tok[1]
        elif tok[0] == "element":
            if len(tok) != 3 or not tok[2].isdigit():
                raise err(f"bad element line {line.strip()!r}; expected 'element <name> <count>'")
            elements.append((tok[1], int(tok[2]), []))
        elif tok[0] == "property":
            if not elements:
                raise err(f"property line {line.strip()!r} before any element")
            if len(tok) == 5 and tok[1] == "list":
                elements[-1][2].append((tok[4], None))
            elif len(tok) == 3 and tok[1] in _TYPES:
                elements[-1][2].append((tok[2], _TYPES[tok[1]]))
            else:
                raise err(f"unsupported property line {line.strip()!r}; expected 'property <type> "
                          f"<name>' with type one of {sorted(_TYPES)}")
        else:
            raise err(f"unknown header line {line.strip()!r}")
    if fmt is None:
        raise err("PLY header has no 'format' line")
    if [e[0] for e in elements].count("vertex") != 1:
        raise err("expected exactly one 'element vertex N' in the header")
    return fmt, elements, m.end()


def _read_columns(path: Path) -> dict:
    """Vertex properties of a PLY file as float64 columns (values as stored, cast via their type)."""
    data = path.read_bytes()
    fmt, elements, off = _parse_header(data, path)
    err = lambda msg: SceneFormatError(f"{path}: {msg}")
    vi = [e[0] for e in elements].index("vertex")
    n, props = elements[vi][1], elements[vi][2]
    names = [p[0] for p in props]
    if any(t is None for _, t in props):
        raise err("element 'vertex' has a list property; expected scalar properties only")
    if len(set(names)) != len(names):
        raise err(f"element 'vertex' has duplicate property names {names}")
    if fmt == "ascii":
        try:
            rows = [r for r in data[off:].decode("ascii").splitlines() if r.strip()]
        except UnicodeDecodeError:
            raise err("ascii PLY body is not ASCII text") from None
        start = sum(e[1] for e in elements[:vi])
        rows = rows[start:start + n]
        if len(rows) < n:
            raise err(f"truncated: expected {n} vertex rows, found {len(rows)}")
        toks = [r.split() for r in rows]
        bad = next((i for i, t in enumerate(toks) if len(t) != len(names)), None)
        if bad is not None:
            raise err(f"vertex row {bad} has {len(toks[bad])} values; expected {len(names)} ({' '.join(names)})")
        try:
            vals = np.array(toks, dtype=np.float64).reshape(n, len(names))
        except ValueError as e:
            raise err(f"vertex data is not numeric ({e})") from None
        return {p: vals[:, j].astype(t).astype(np.float64) for j, (p, t) in enumerate(props)}
    end = _FORMATS[fmt]
    dtypes, total = [], off
    for name, count, eprops in elements:
        if any(t is None for _, t in eprops):
            raise err(f"element '{name}' has a list property; cannot skip it in a binary file")
        dt = np.dtype([(p, end + t) for p, t in eprops])
        dtypes.append(dt)
        total += count * dt.itemsize
    if len(data) < total:
        raise err(f"truncated: elements {[e[0] for e in elements]} need {total - off} bytes after the "
                  f"header, found {len(data) - off}")
    voff = off + sum(e[1] * dt.itemsize for e, dt in zip(elements[:vi], dtypes[:vi]))
    arr = np.frombuffer(data, dtype=dtypes[vi], count=n, offset=voff)
    return {p: arr[p].astype(np.float64) for p in names}


def load_ply(path: PathLike) -> Surfels:
    """Load a 3DGS/2DGS ``.ply`` as float64 `Surfels` (activated; frame of the file, metres)."""
    path = Path(path)
    try:
        cols = _read_columns(path)
    except OSError as e:
        raise SceneFormatError(f"{path}: cannot read file ({e})") from None
    err = lambda msg: SceneFormatError(f"{path}: {msg}")
    missing = [p for p in _REQUIRED if p not in cols]
    if missing:
        raise err(f"missing required vertex properties {missing}")
    rest = sorted((int(p[7:]) for p in cols if re.fullmatch(r"f_rest_\d+", p)))
    m = len(rest)
    if rest != list(range(m)) or m not in (0, 9, 24, 45):
        raise err(f"bad f_rest properties: found {m} (indices {rest[:3]}...); expected f_rest_0..f_rest_"
                  f"{{M-1}} with M = 3*(K-1) in 0, 9, 24, 45 (SH degree 0-3)")
    three = "scale_2" in cols
    used = _REQUIRED + [f"f_rest_{i}" for i in range(m)] + (["scale_2"] if three else [])
    for p in used:
        bad = np.flatnonzero(~np.isfinite(cols[p]))
        if bad.size:
            raise err(f"property '{p}' is not finite ({cols[p][bad[0]]}) at vertex row {bad[0]}")
    n = len(cols["x"])
    q = np.stack([cols[f"rot_{i}"] for i in range(4)], 1)
    norm = np.linalg.norm(q, axis=1, keepdims=True)
    zero = np.flatnonzero(norm[:, 0] == 0)
    if zero.size:
        raise err(f"properties 'rot_0..3' (quaternion) are all zero at vertex row {zero[0]}")
    q = np.where(np.abs(norm - 1) > _QUAT_UNIT_TOL, q / norm, q)
    raw = np.stack([cols[f"scale_{i}"] for i in range(3 if three else 2)], 1)
    if three:  # the smallest axis becomes the normal (local z); ties prefer axis 2
        axis = np.where(raw[:, 2] <= raw[:, :2].min(1), 2, np.argmin(raw[:, :2], 1))
        tangent = raw[:, :2].copy()
        for a, (o1, o2), flip in ((0, (1, 2), False), (1, (0, 2), True)):
            sel = axis == a
            if sel.any():
                R = quat_to_rotmat(q[sel])
                Rn = np.stack([R[:, :, o1], R[:, :, o2], R[:, :, a]], axis=2)
                if flip:  # a transposition of columns: negate the normal to keep det +1
                    Rn[:, :, 2] *= -1
                q[sel] = rotmat_to_quat(Rn)
                tangent[sel] = raw[sel][:, [o1, o2]]
        raw = tangent
    with np.errstate(over="ignore"):
        scales = np.exp(raw)
    bad = np.argwhere(~np.isfinite(scales))
    if bad.size:
        raise err(f"property 'scale_*' at vertex row {bad[0][0]} overflows exp() (log-scale too large)")
    rest_arr = np.stack([cols[f"f_rest_{i}"] for i in range(m)], 1) if m else np.zeros((n, 0))
    colors = np.concatenate([np.stack([cols[f"f_dc_{c}"] for c in range(3)], 1)[:, None, :],
                             rest_arr.reshape(n, 3, m // 3).transpose(0, 2, 1)], axis=1)
    logit = cols["opacity"]
    try:
        return Surfels(means=np.stack([cols["x"], cols["y"], cols["z"]], 1), quats=q, scales=scales,
                       opacities=np.exp(-np.logaddexp(0.0, -logit)), colors=colors)
    except (ValueError, TypeError) as e:
        raise err(str(e)) from None


def save_ply(surfels: Surfels, path: PathLike, layout: str = "3dgs") -> None:
    """Write ``surfels`` (numpy or torch) as a binary little-endian float32 3DGS/2DGS ``.ply``, atomically.

    ``layout`` is "3dgs" (three scales, ``scale_2`` a thin disk) or "2dgs" (two scales).
    """
    if layout not in ("3dgs", "2dgs"):
        raise InputError(f"save_ply: unknown layout {layout!r}; expected '3dgs' or '2dgs'")
    s = surfels.numpy()
    n, k = len(s), s.colors.shape[1]
    f64 = lambda a: np.asarray(a, dtype=np.float64)
    op = np.clip(f64(s.opacities), _OPACITY_EPS, 1 - _OPACITY_EPS)
    scale_raw = np.log(np.maximum(f64(s.scales), _MIN_SCALE)).astype(np.float32)
    colors = f64(s.colors)
    cols = [f64(s.means), np.zeros((n, 3)), colors[:, 0, :],
            colors[:, 1:, :].transpose(0, 2, 1).reshape(n, 3 * (k - 1)),
            (np.log(op) - np.log1p(-op))[:, None], scale_raw]
    names = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    names += [f"f_rest_{i}" for i in range(3 * (k - 1))] + ["opacity", "scale_0", "scale_1"]
    if layout == "3dgs":
        cols.append(f64(scale_raw).min(1, keepdims=True) - _LN_1000)
        names.append("scale_2")
    cols.append(f64(s.quats))
    names += ["rot_0", "rot_1", "rot_2", "rot_3"]
    body = np.concatenate([c.astype(np.float32) for c in cols], axis=1).astype("<f4")
    header = ["ply", "format binary_little_endian 1.0", f"element vertex {n}"]
    header += [f"property float {p}" for p in names] + ["end_header", ""]
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write("\n".join(header).encode("ascii"))
            f.write(np.ascontiguousarray(body).tobytes())
