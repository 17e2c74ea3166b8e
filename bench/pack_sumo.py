"""Pack SUMO and the closed loop's other packages for a machine that has no network and takes little data per
call (a lent GPU: bench/gpu_loop.sh unpacks and runs them).

    python bench/pack_sumo.py pack OUT [--python 3.12] [--part-mb 60]
    python bench/pack_sumo.py unpack DEST PARTDIR...      (on the target: DEST/site then holds everything)

Downloads, without dependencies, for that CPython on manylinux x86-64: the `sumo` extra's pinned wheels
(pyproject.toml), pydantic and trimesh (scenarios and assets) and the few packages they need that a CUDA image lacks
(mcap's zstandard and lz4 among them: the recording compresses its chunks). Of the two SUMO wheels it keeps what the
closed loop loads: libsumo's module and its bundled libraries, netconvert (its libraries are libsumo's: the same
files, linked, not stored twice) and SUMO's XML schemas and type maps, in one xz tar (about 270 MB unpacked, 56 MB
packed); the other wheels go beside it, and last, so that they start a part of their own, the `serve` extra's (gsim
serve there: grpcio 1.85.1, 7.7 MB) and diffusers with what it imports that the image may lack (the repair
model's speed there: bench/bench_repair_speed.py). OUT gets parts of at most --part-mb MB each (OUT/1, OUT/2, ...:
one folder per device call) and a manifest naming them. `unpack` joins the tar's pieces from the part folders,
extracts it into DEST/site, installs the wheels there (pip, no network; a later call's unpack adds the wheels not
yet there) and prints the variables that make them the ones used: PYTHONPATH, SUMO_HOME and, where the machine lacks
libraries that libsumo's bundled ones link (a CUDA image has no libGL or libXrender: SUMO's GUI code, which a headless
loop never calls), LD_LIBRARY_PATH with stand-ins for them built there: STUB libraries whose functions do nothing, named
as stubs in DEST/gui-stubs.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what the sumo and editing extras need beyond themselves that a CUDA image (numpy, protobuf, pyyaml) lacks
EXTRA = ["pydantic==2.12.5", "pydantic-core==2.41.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
         "cloudpickle==3.1.3", "farama-notifications==0.0.6", "zstandard==0.25.0", "lz4==4.4.5"]
# what diffusers 0.42.1 imports beyond a CUDA image's torch (filelock, fsspec, typing-extensions), numpy, pillow,
# packaging, pyyaml, tqdm and safetensors: its dependency closure as installed on 2026-11-27
DIFFUSERS_DEPS = ["huggingface-hub==2.4.0", "hf-xet==1.8.0", "httpx2==2.16.2", "httpcore2==2.16.2", "anyio==4.16.0",
                  "h11==0.16.0", "certifi==2026.10.19.post1", "idna==3.20", "click==8.5.1", "regex==2026.11.19",
                  "requests==2.34.2", "urllib3==2.8.0", "charset-normalizer==3.5.3", "importlib-metadata==10.2.0",
                  "zipp==4.1.2", "lazy-importer==0.1.0", "truststore==0.10.5"]
KEEP_SUMO = re.compile(r"sumo/(bin/netconvert|data/xsd/.*|data/typemap/.*|__init__\.py)$")


def pins(extra: str) -> list:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
    return [d for d in deps if "==" in d]


def download(specs: list, python: str, dest: Path) -> None:
    platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
                                             "manylinux_2_17_x86_64", "manylinux2014_x86_64")]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    f"--python-version={python}", "--implementation=cp", *platforms, "-d", str(dest), *specs],
                   check=True)


def sumo_tar(libsumo_whl: Path, sumo_whl: Path) -> bytes:
    """The xz tar of libsumo (module and libraries), netconvert, its libraries as links to libsumo's where the
    bytes are the same, and SUMO's schemas and type maps."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar, zipfile.ZipFile(libsumo_whl) as lib, \
            zipfile.ZipFile(sumo_whl) as sumo:
        digests = {}
        for info in lib.infolist():
            if info.filename.startswith(("libsumo/", "libsumo.libs/")) and not info.is_dir():
                data = lib.read(info)
                digests[Path(info.filename).name] = hashlib.sha256(data).hexdigest()
                _add(tar, info.filename, data, info)
        for info in sumo.infolist():
            name = info.filename
            if info.is_dir():
                continue
            if KEEP_SUMO.match(name):
                _add(tar, name, sumo.read(info), info)
            elif name.startswith("eclipse_sumo.libs/"):
                data, base = sumo.read(info), Path(name).name
                if digests.get(base) == hashlib.sha256(data).hexdigest():
                    link = tarfile.TarInfo(name)
                    link.type, link.linkname = tarfile.SYMTYPE, f"../libsumo.libs/{base}"
                    tar.addfile(link)
                else:
                    _add(tar, name, data, info)
    return lzma.compress(buf.getvalue(), preset=9)


def _add(tar: tarfile.TarFile, name: str, data: bytes, info: zipfile.ZipInfo) -> None:
    t = tarfile.TarInfo(name)
    t.size, t.mode = len(data), (info.external_attr >> 16) & 0o777 or 0o644
    tar.addfile(t, io.BytesIO(data))


def unpack(dest: Path, part_dirs: list) -> None:
    files = sorted((f for d in part_dirs if Path(d).is_dir() for f in Path(d).iterdir()), key=lambda f: f.name)
    site = dest / "site"
    site.mkdir(parents=True, exist_ok=True)
    if not (site / "libsumo").is_dir():
        tar = b"".join(f.read_bytes() for f in files if f.name.startswith("sumo.tar.xz."))
        with tarfile.open(fileobj=io.BytesIO(lzma.decompress(tar))) as t:
            t.extractall(site, filter="tar")  # (the links stay inside: eclipse_sumo.libs -> libsumo.libs)
    installed = {d.name.removesuffix(".dist-info").lower() for d in site.glob("*.dist-info")}
    wheels = [str(f) for f in files if f.suffix == ".whl" and "-".join(f.name.split("-")[:2]).lower() not in installed]
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(site), *wheels], check=True)
    stubs = gui_stubs(site, dest / "gui-stubs")
    print(f"export PYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}} SUMO_HOME={site / 'sumo'}"
          + (f" LD_LIBRARY_PATH={stubs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" if stubs else ""))


def gui_stubs(site: Path, out: Path):
    """Stand-ins for the libraries libsumo's bundled ones link that this machine lacks (libGL, libXrender on a
    CUDA image): one C file defining every GL and X function those libraries import as doing nothing, built as
    each missing name; SUMO's GUI code alone calls them. The stubs' folder, or None where nothing is missing."""
    libs = sorted(site.glob("libsumo/_libsumo*.so")) + sorted(site.glob("libsumo.libs/*.so*"))
    ldd = subprocess.run(["ldd", *map(str, libs)], capture_output=True, text=True).stdout
    missing = sorted({line.split()[0] for line in ldd.splitlines() if "not found" in line})
    if not missing:
        return None
    nm = subprocess.run(["nm", "-D", "--undefined-only", *map(str, libs)], capture_output=True, text=True).stdout
    names = sorted({w.split("@")[0] for w in nm.split() if re.fullmatch(r"(gl|X|GLX)\w+(@\S+)?", w)})
    out.mkdir(parents=True, exist_ok=True)
    src = out / "gui_stubs.c"
    src.write_text("/* STUBS: libsumo's GUI libraries link these; a headless SUMO never calls them. */\n"
                   + "".join(f"void {n}(void) {{}}\n" for n in names))
    for lib in missing:
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out / lib), str(src)], check=True)
    print(f"built stub libraries for {', '.join(missing)} ({len(names)} GL/X functions that do nothing) in {out}",
          file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pk = sub.add_parser("pack")
    pk.add_argument("out", type=Path)
    pk.add_argument("--python", default="3.12", help="the target machine's CPython (major.minor)")
    pk.add_argument("--part-mb", type=float, default=60.0)
    up = sub.add_parser("unpack")
    up.add_argument("dest", type=Path)
    up.add_argument("parts", nargs="+", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "unpack":
        unpack(a.dest, a.parts)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp)
        download(pins("sumo") + [d for d in pins("editing") if d.startswith("trimesh")] + EXTRA, a.python, wheels)
        libsumo, sumo = (next(wheels.glob(f"{n}-*.whl")) for n in ("libsumo", "eclipse_sumo"))
        blobs = [("sumo.tar.xz", sumo_tar(libsumo, sumo))]
        blobs += [(w.name, w.read_bytes()) for w in sorted(wheels.glob("*.whl")) if w not in (libsumo, sumo)]
        download(pins("serve") + ["protobuf==7.35.1"], a.python, wheels / "serve")
        blobs += [(w.name, w.read_bytes()) for w in sorted((wheels / "serve").glob("*.whl"))]
        download([d for d in pins("diffusion") if d.startswith("diffusers")] + DIFFUSERS_DEPS, a.python,
                 wheels / "diffusion")
        blobs += [(w.name, w.read_bytes()) for w in sorted((wheels / "diffusion").glob("*.whl"))]
    if a.out.exists():
        shutil.rmtree(a.out)
    limit, parts, size = a.part_mb * 1e6, [[]], 0
    for name, data in blobs:  # the tar is cut where a part fills up; a wheel goes whole into the next part
        while data:
            room = int(limit - size)
            if room <= 0 or (not name.endswith(".xz") and len(data) > room):
                parts.append([])
                size, room = 0, int(limit)
            chunk, data = data[:room], data[room:]
            piece = f"{name}.{sum(n.startswith(name) for p in parts for n in p):03d}" if name.endswith(".xz") else name
            d = a.out / str(len(parts))
            d.mkdir(parents=True, exist_ok=True)
            (d / piece).write_bytes(chunk)
            parts[-1].append(piece)
            size += len(chunk)
    (a.out / "manifest.json").write_text(json.dumps({"python": a.python, "parts": parts}, indent=1))
    for i, p in enumerate(parts, 1):
        print(f"{a.out / str(i)}: {sum((a.out / str(i) / n).stat().st_size for n in p) / 1e6:.1f} MB, {len(p)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
