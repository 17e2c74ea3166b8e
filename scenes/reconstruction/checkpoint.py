"""Checkpoints that load without running code: one safetensors file whose header carries the rest as JSON.

``checkpoint.safetensors`` holds the tensors under flat names ("model/means", "adam/m/means", "rng/torch") and,
in its header's metadata under "gsim", one JSON object ``{"format": "gsim-checkpoint", "kind": ...,
"schema_version": 1, ...}`` with everything else (step counters, configuration, numpy's generator state).
safetensors is raw arrays described by a JSON header: reading one runs nothing from the file, where a torch
pickle (``checkpoint.pt``, which gsim wrote before) runs whatever code its author put in it. One file, replaced
atomically: a run killed while writing keeps its previous checkpoint whole.

A `Checkpoint` hands out what its caller expects (tensor names, dtypes, shapes, finite values; JSON fields of a
given form) and refuses anything else, the truncated or foreign file included, with an `InputError` naming the
file and the field.
"""
from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from gsim.errors import InputError, Unavailable
from gsim.io import atomic_path

FORMAT = "gsim-checkpoint"
SCHEMA_VERSION = 1
NAME = "checkpoint.safetensors"
LEGACY_NAME = "checkpoint.pt"  # a torch pickle: refused when read
_PICKLE_MAGIC = (b"PK\x03\x04", b"\x80")  # torch.save's zip archive; a bare pickle (protocol 2 and later)
_RESERVED = ("format", "kind", "schema_version")


def find(directory) -> Optional[Path]:
    """``directory``'s checkpoint, else its legacy pickle (which `read` refuses, saying why), else None."""
    for name in (NAME, LEGACY_NAME):
        if (Path(directory) / name).is_file():
            return Path(directory) / name
    return None


def write(path, kind: str, tensors: Mapping[str, torch.Tensor], meta: dict) -> None:
    """Write ``tensors`` (on the CPU, whatever their device) and the JSON object ``meta`` to ``path`` atomically."""
    header = json.dumps({"format": FORMAT, "kind": kind, "schema_version": SCHEMA_VERSION, **meta}, allow_nan=False)
    with atomic_path(path, ".safetensors") as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp), metadata={"gsim": header})


def _is_pickle(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head.startswith(_PICKLE_MAGIC)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def read(path, kind: str, legacy_advice: str) -> "Checkpoint":
    """The checkpoint at ``path`` of ``kind``, its header checked; ``legacy_advice`` ends the message that
    refuses a pickle (what the user can do instead; "{path}" in it becomes the file's path, quoted)."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            header, tensors = f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        if _is_pickle(path):
            raise InputError(f"{path}: a pickle (torch.save's format, and gsim's checkpoints' before), which gsim does "
                             f"not load: unpickling runs whatever code the file holds. "
                             f"{legacy_advice.replace('{path}', repr(str(path)))}") from None
        raise InputError(f"{path}: not a readable gsim checkpoint (truncated, or not safetensors: {e})") from None
    if "gsim" not in header:
        raise InputError(f"{path}: a safetensors file without gsim's header (metadata 'gsim'): not a gsim checkpoint")
    try:
        meta = json.loads(header["gsim"], parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise InputError(f"{path}: header 'gsim': not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f"{path}: header 'gsim': format: expected {FORMAT!r}: not a gsim checkpoint")
    ck = Checkpoint(path, meta, tensors)
    if meta.get("kind") != kind:
        raise ck.error("kind", f"expected {kind!r}, got {meta.get('kind')!r}")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise ck.error("schema_version", f"this gsim reads version {SCHEMA_VERSION}, got "
                                         f"{meta.get('schema_version')!r}")
    return ck


class Checkpoint:
    """A checkpoint's tensors and JSON header, given out as the caller expects them (`tensor`, `field`); `done`
    refuses what was not asked for."""

    def __init__(self, path: Path, meta: dict, tensors: Dict[str, torch.Tensor]):
        self.path, self.meta, self.tensors = path, meta, tensors
        self._taken = set(_RESERVED)

    def error(self, field: str, expectation: str) -> InputError:
        return InputError(f"{self.path}: {field}: {expectation}")

    def tensor(self, name: str, dtype: torch.dtype, shape: Sequence[Optional[int]]) -> torch.Tensor:
        """The tensor ``name`` with this dtype and shape (None: any length there); floats must be finite."""
        t = self.tensors.get(name)
        if t is None:
            raise self.error(name, "missing tensor")
        if t.dtype != dtype:
            raise self.error(name, f"expected dtype {dtype}, got {t.dtype}")
        if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
            want = ", ".join("any" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "")
            raise self.error(name, f"expected shape ({want}), got {tuple(t.shape)}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise self.error(name, "non-finite values (NaN or infinite)")
        self._taken.add(name)
        return t

    def field(self, name: str, spec: Any) -> Any:
        """The header's field ``name`` (a top-level key) if it has the form ``spec``: a type (bool, str, float:
        finite, ints allowed; int: a non-negative integer, as every count and seed a checkpoint holds), None
        (null), ``[spec]`` (a list of any length), ``{key: spec}`` (an object with exactly these keys),
        ``{str: spec}`` (an object with any keys) or a tuple of specs (any one of them)."""
        if name not in self.meta:
            raise self.error(name, "missing field")
        self._taken.add(name)
        _check(self.meta[name], spec, name, self)
        return self.meta[name]

    def numpy_rng(self, name: str) -> dict:
        """The field ``name``: a state of numpy's default bit generator (PCG64), as `bit_generator.state` gives."""
        state = self.field(name, {"bit_generator": str, "state": {"state": int, "inc": int}, "has_uint32": int,
                                  "uinteger": int})
        try:
            np.random.PCG64().state = state
        except (ValueError, TypeError, OverflowError) as e:
            raise self.error(name, f"not a PCG64 generator state ({e})") from None
        return state

    def torch_rng(self, name: str) -> torch.Tensor:
        """The tensor ``name``: a state of torch's CPU generator, as `Generator.get_state` gives."""
        state = self.tensor(name, torch.uint8, tuple(torch.Generator().get_state().shape))
        try:
            torch.Generator().set_state(state)
        except RuntimeError as e:
            raise self.error(name, f"not a torch generator state ({e})") from None
        return state

    def done(self) -> None:
        """Refuse tensors and header fields that nobody asked for (a file of another layout)."""
        extra = sorted(set(self.tensors) - self._taken) + sorted(set(self.meta) - self._taken)
        if extra:
            raise self.error(extra[0], f"unexpected entries {extra[:5]}{' ...' if len(extra) > 5 else ''}")


def _check(value: Any, spec: Any, field: str, ck: Checkpoint) -> None:
    if isinstance(spec, tuple):
        for s in spec:
            try:
                return _check(value, s, field, ck)
            except InputError:
                pass
        raise ck.error(field, f"expected {' or '.join(_name(s) for s in spec)}, got {_shown(value)}")
    if isinstance(spec, list):
        if not isinstance(value, list):
            raise ck.error(field, f"expected a list, got {_shown(value)}")
        for i, v in enumerate(value):
            _check(v, spec[0], f"{field}[{i}]", ck)
    elif isinstance(spec, dict):
        if not isinstance(value, dict):
            raise ck.error(field, f"expected an object, got {_shown(value)}")
        any_key = list(spec) == [str]
        if not any_key:
            missing, extra = sorted(spec.keys() - value.keys()), sorted(value.keys() - spec.keys())
            if missing or extra:
                raise ck.error(field, ", ".join([f"missing keys {missing}"] * bool(missing)
                                                + [f"unexpected keys {extra}"] * bool(extra)))
        for k, v in value.items():
            _check(v, spec[str] if any_key else spec[k], f"{field}.{k}", ck)
    elif not _SCALARS[spec](value):
        raise ck.error(field, f"expected {_name(spec)}, got {_shown(value)}")


_SCALARS = {None: lambda v: v is None, bool: lambda v: isinstance(v, bool), str: lambda v: isinstance(v, str),
            int: lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and _finite(v)}


def _finite(v) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer beyond any float
        return False


def _name(spec: Any) -> str:
    if isinstance(spec, (list, dict)):
        return "a list" if isinstance(spec, list) else "an object"
    return {None: "null", bool: "a boolean", str: "a string", int: "a non-negative integer",
            float: "a finite number"}[spec]


def _shown(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 40 else r[:37] + "..."


def load_legacy(path, trust_pickle: bool = False) -> Any:
    """The contents of a pickled checkpoint (``torch.save``), for an explicit conversion only: ``trust_pickle``
    says the caller trusts where the file came from. Even then it goes through torch's restricted unpickler
    (``weights_only=True``: tensors, containers, numbers and strings, here plus numpy arrays), which refuses
    code, but which torch releases before 2.6 could be led around: hence the explicit trust as well."""
    path = Path(path)
    if not trust_pickle:
        raise InputError(f"{path}: converting a pickled checkpoint unpickles it; pass trust_pickle=True, and only for "
                         f"a file whose source you trust")
    if not hasattr(torch.serialization, "safe_globals"):
        raise Unavailable(f"{path}: converting a pickled checkpoint needs torch >= 2.5 (torch.serialization."
                          f"safe_globals); this is torch {torch.__version__}")
    reconstruct = np.zeros(0).__reduce__()[0]  # numpy's array unpickling function, wherever this numpy keeps it
    dtypes = [type(np.dtype(t)) for t in (np.int64, np.float64, np.float32)]
    try:
        with torch.serialization.safe_globals([reconstruct, np.ndarray, np.dtype, bytes, *dtypes]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise InputError(f"{path}: not a checkpoint torch's restricted unpickler reads (it holds more than tensors, "
                         f"numbers and numpy arrays, or is damaged): {why}") from None
