"""Atomic file output: write next to the destination, then rename into place; and the one reader of
gsim's JSON manifests (`read_manifest`).

A reader (or a killed run) never sees a half-written file: either the previous
version or the complete new one.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Collection, Iterator, Type

import numpy as np

from .errors import InputError, check_name


def umask_mode(base: int) -> int:
    """``base`` permissions as the process umask allows (what open() would give)."""
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def child_path(root, name: str, what: str) -> Path:
    """``root / name`` for a ``name`` that becomes a file or folder name (a scenario name, an asset or session id):
    a full match of `gsim.errors.NAME_PATTERN`, and a path that resolves inside ``root`` (so a symlink planted
    at ``root / name`` cannot lead a write elsewhere). Else an `InputError` naming ``what``."""
    check_name(name, what)
    path = Path(root) / name
    try:
        inside = path.resolve().parent == Path(root).resolve()
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise InputError(f"{what}: {path} leads outside {root} (a link?); refusing to write there")
    return path


def _at_destination(e: BaseException, tmp: Path, path: Path):
    """For an OSError about the temporary file or folder (or about no file: a full disk in write()), the same
    error naming the destination, the path the user gave and knows; else None."""
    if not isinstance(e, OSError) or e.errno is None:
        return None
    name = None if e.filename is None else str(e.filename)
    if name is not None and name != str(tmp) and not name.startswith(str(tmp) + os.sep):
        return None
    return OSError(e.errno, e.strerror, str(path) + ("" if name is None else name[len(str(tmp)):]))


@contextlib.contextmanager
def atomic_path(path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, on error it is removed.

    ``suffix`` keeps the extension for writers that infer the format from the name (video).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, umask_mode(0o666))  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        named = _at_destination(e, Path(tmp), path)
        if named is not None:
            raise named from e
        raise


@contextlib.contextmanager
def atomic_directory(path, marker: str) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; on success it replaces ``path``, on error it is removed.

    An existing ``path`` is replaced only if it holds ``marker`` (the manifest of the same kind of
    directory), so a wrong output path never deletes a user's unrelated folder. A failed swap puts
    the previous directory back.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not (path / marker).is_file():
        raise FileExistsError(f"{path}: exists and has no {marker}; refusing to replace it")
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old = path.parent / f".{path.name}.old-{tmp.name.rsplit('-', 1)[-1]}"
    try:
        os.chmod(tmp, umask_mode(0o777))  # mkdtemp creates 0700
        yield tmp
        if path.exists():
            os.rename(path, old)
        try:
            os.rename(tmp, path)
        except BaseException:
            if old.exists():
                os.rename(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        named = _at_destination(e, tmp, path)
        if named is not None:
            raise named from e
        raise


def write_bytes(path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json(path, obj) -> None:
    write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def to_uint8(rgb) -> np.ndarray:
    """(H,W,3) float RGB in [0,1] -> uint8 numpy. A torch tensor is converted where it lies (a frame on a GPU: a
    byte a channel comes back, not four)."""
    from .surfels import is_tensor
    if is_tensor(rgb):
        import torch
        return (rgb.detach().float().clamp(0, 1) * 255 + 0.5).to(torch.uint8).cpu().numpy()
    return (np.clip(np.asarray(rgb, dtype=np.float32), 0, 1) * 255 + 0.5).astype(np.uint8)


def image_bytes(rgb: np.ndarray, fmt: str, quality: int = 90) -> bytes:
    """uint8 (H,W,3) RGB encoded as "png" (fast: zlib level 1) or "jpeg" (``quality`` 1-100), for the wire."""
    import io
    from PIL import Image
    buf = io.BytesIO()
    if fmt == "png":
        Image.fromarray(rgb).save(buf, format="PNG", compress_level=1)
    elif fmt == "jpeg":
        Image.fromarray(rgb).save(buf, format="JPEG", quality=int(quality))
    else:
        raise InputError(f"image format: expected png or jpeg, got {fmt!r}")
    return buf.getvalue()


def write_png(path, image: np.ndarray) -> None:
    """uint8 (H,W[,3]) or uint16 (H,W) image as PNG."""
    from PIL import Image
    with atomic_path(path, suffix=".png") as tmp:
        Image.fromarray(image).save(tmp, format="PNG")


def write_depth_png(path, depth_m: np.ndarray) -> None:
    """Depth as 16-bit PNG in the KITTI convention: value = metres * 256, 0 = no depth."""
    d = np.clip(np.nan_to_num(np.asarray(depth_m, np.float64)) * 256.0 + 0.5, 0, 65535)
    write_png(path, d.astype(np.uint16))


def write_video(path, frames_uint8, fps: float) -> None:
    """H.264 MP4 from uint8 (H,W,3) frames (ffmpeg from the imageio-ffmpeg wheel)."""
    import imageio.v2 as imageio
    # imageio-ffmpeg starts ffmpeg with preexec_fn=os.setpgrp (so Ctrl-C spares it): Python code in a forked child
    # of a threaded process (the server's gRPC threads, numba's OpenMP pool) can crash or hang there (seen: a
    # segfault in a served session's video). Its documented switch turns that off; ffmpeg then sees Ctrl-C too.
    os.environ.setdefault("IMAGEIO_FFMPEG_NO_PREVENT_SIGINT", "1")
    with atomic_path(path, suffix=".mp4") as tmp:
        # macro_block_size=1: keep odd sizes exact rather than resizing them
        with imageio.get_writer(tmp, format="FFMPEG", fps=fps, codec="libx264", quality=8,
                                macro_block_size=1, pixelformat="yuv420p",
                                output_params=["-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2"]) as w:
            for f in frames_uint8:
                w.append_data(f)


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


def check_schema_version(d: dict, versions: Collection[int], where: str, error: Type[InputError] = InputError) -> int:
    """``d["schema_version"]`` if it is one of ``versions`` (an integer), else an ``error`` naming ``where``."""
    v = d.get("schema_version")
    if type(v) is not int or v not in versions:  # (True == 1 and 1.0 == 1: neither is a version)
        got = "is missing" if "schema_version" not in d else f"is {v!r}"
        raise error(f"{where}: field 'schema_version' {got}; this gsim reads version"
                    f"{'s' if len(versions) > 1 else ''} {', '.join(map(str, sorted(versions)))}")
    return v


def read_manifest(path, what: str, versions: Collection[int], error: Type[InputError] = InputError) -> dict:
    """The JSON object in the file at ``path`` (a ``what``: "scene manifest", "LiDAR head", ...) whose
    ``schema_version`` is one of ``versions``. A missing path, a directory, an unreadable file, text that is not
    UTF-8 or not JSON, JSON that is not an object and a missing or unknown version are each an ``error`` (an
    `InputError` subclass: the loader's own) naming the file; the loader checks the fields."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such file (expected a {what}, a JSON file)") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, expected a {what} (a JSON file)") from None
    except OSError as e:
        raise error(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: the {what} is not UTF-8 text (byte {e.start})") from None
    try:
        d = json.loads(text)  # (NaN and Infinity parse: each loader's field checks refuse them, naming the field)
    except json.JSONDecodeError as e:
        raise error(f"{path}: the {what} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise error(f"{path}: the {what} nests too deeply to be a manifest") from None
    if not isinstance(d, dict):
        raise error(f"{path}: the {what} must be a JSON object, got {_JSON_KINDS.get(type(d), type(d).__name__)}")
    check_schema_version(d, versions, str(path), error)
    return d
