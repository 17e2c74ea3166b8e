"""gsim's numba kernels compiled into numba's on-disk cache by a child process, so that every run loads them.

A numba kernel compiled in the process that runs it and the same kernel loaded from numba's cache do not always
compute the same bits: with ``fastmath`` (the backward kernel's "reassoc" lets LLVM vectorize its sums) the two
differ in the last digits (measured: the backward kernel on the same inputs, a cold and a warm cache; a 12-iteration
reconstruction's PSNR 13.602469937 against 13.602470297). Without a primed cache the first run after an install or
an edit would then differ from every later one, and a batch's runs from the same runs made alone. `prime` (called by
`reconstruct`; `gsim compile` by hand) runs gsim.scenes.kernel_workload (a tiny reconstruction, its evaluation and the
loop's sensors) in a child process when gsim's sources changed since the last priming; that child writes the cache and every process after it,
this one included, loads the same machine code. A stamp beside the cache records what was primed.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from gsim.errors import InputError

_primed = False  # this process primed
CHILD = "GSIM_KERNEL_CACHE_CHILD"  # set in the priming child's environment: it must not prime in turn


def _sources() -> list:
    import gsim
    dirs = [Path(gsim.__file__).parent, *(Path(p).parent for p in _subpackage_files())]
    return sorted({f for d in dirs for f in d.rglob("*.py")})


def _subpackage_files() -> list:
    from importlib.util import find_spec
    return [find_spec(f"gsim.{name}").origin for name in ("scenes", "lidar", "editing", "diffusion", "bridges")]


def stamp_path() -> Path:
    """The stamp: in NUMBA_CACHE_DIR when set, else beside gsim's own kernels (where numba caches them)."""
    import numba
    import gsim
    root = Path(numba.config.CACHE_DIR or Path(gsim.__file__).parent / "render" / "__pycache__")
    return root / "gsim-kernels.stamp"


def fingerprint() -> str:
    """What the cache was primed for: numba and Python, the cache folder and every gsim source file's size and mtime
    (numba's own test of a stale kernel)."""
    import numba
    h = hashlib.sha1(f"{numba.__version__}|{sys.version}|{numba.config.CACHE_DIR}".encode())
    for f in _sources():
        st = f.stat()
        h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def prime(progress: bool = True) -> bool:
    """Prime numba's cache in a child process unless it is primed for these sources (or this process already did:
    kernels it compiled itself stay as they are). Returns whether a child ran."""
    global _primed
    if _primed or os.environ.get(CHILD):
        return False
    _primed = True
    stamp, want = stamp_path(), fingerprint()
    try:
        if stamp.read_text() == want:
            return False
    except OSError:
        pass
    if progress:
        print("gsim: compiling its numba kernels into numba's cache (once per install or edit) ...", file=sys.stderr)
    done = subprocess.run([sys.executable, "-m", "gsim.scenes.kernel_workload"], capture_output=True, text=True,
                          env={**os.environ, CHILD: "1"})
    if done.returncode != 0:
        raise InputError(f"compiling gsim's kernels ({sys.executable} -m gsim.scenes.kernel_workload) failed:\n"
                         f"{done.stderr[-2000:]}")
    for line in done.stderr.splitlines():  # the child's own messages (not numba's or torch's warnings)
        if line.startswith("gsim: "):
            print(line, file=sys.stderr)
    return True


def write_stamp(value: str) -> None:
    """The stamp written atomically; where it cannot be, said on stderr (not fatal)."""
    stamp = stamp_path()
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        part = stamp.with_name(stamp.name + f".{os.getpid()}.part")
        part.write_text(value)
        os.replace(part, stamp)
    except OSError as e:  # (a read-only install: numba caches elsewhere, the stamp has no place)
        print(f"gsim: cannot write {stamp} ({e}); each reconstruction will check numba's cache in a child process "
              f"(seconds; set NUMBA_CACHE_DIR to a writable folder to avoid it)", file=sys.stderr)
