"""Pack a gsim log small, losslessly, for a machine that takes little data (bench/gpu_check.sh), or unpack it.

    python bench/pack_log.py pack LOG PACKED      |      python bench/pack_log.py unpack PACKED LOG

Sweeps (.npy, float32 rows) are xz-compressed through a delta filter one row apart (neighbouring points of a
scan are close: KITTI's sweeps go to 31%); every other file is copied. Unpacking gives the files back bit for bit.
"""
from __future__ import annotations

import lzma
import shutil
import sys
from pathlib import Path

import numpy as np


def _filters(row_bytes: int) -> list:
    return [{"id": lzma.FILTER_DELTA, "dist": row_bytes}, {"id": lzma.FILTER_LZMA2, "preset": 9}]


def pack(src: Path, dst: Path) -> None:
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        if f.suffix == ".npy":
            a = np.load(f, mmap_mode="r")
            row = a.itemsize * (a.shape[1] if a.ndim == 2 else 1)
            out.with_name(f"{out.name}.{row}.xz").write_bytes(
                lzma.compress(f.read_bytes(), format=lzma.FORMAT_XZ, filters=_filters(row)))
        else:
            shutil.copy2(f, out)


def unpack(src: Path, dst: Path) -> None:
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        if f.name.endswith(".xz"):
            out.with_name(f.name.rsplit(".", 2)[0]).write_bytes(lzma.decompress(f.read_bytes()))
        else:
            shutil.copy2(f, out)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        sys.exit(__doc__)
    {"pack": pack, "unpack": unpack}[sys.argv[1]](Path(sys.argv[2]), Path(sys.argv[3]))
