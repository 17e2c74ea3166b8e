"""Regenerates the committed gRPC modules from `sensor.proto` (the source of truth):
``python -m gsim.bridges.api.protogen`` after editing the proto. A test fails when the committed modules are stale.

The proto is compiled as ``gsim/bridges/api/sensor.proto`` (protoc's virtual include path), so the generated
modules import each other as ``gsim.bridges.api.sensor_pb2`` and the descriptor's file name cannot clash with
another package's ``sensor.proto``."""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "sensor.proto"
GENERATED = ("sensor_pb2.py", "sensor_pb2.pyi", "sensor_pb2_grpc.py")


def generate(out: Path) -> None:
    """Writes the generated modules into ``out`` (needs grpcio-tools, the ``test`` extra)."""
    try:
        from grpc_tools import protoc
        import grpc_tools
    except ImportError:
        raise SystemExit("protogen: needs grpcio-tools (pip install -e '.[test]')") from None
    with tempfile.TemporaryDirectory() as tmp:
        include = Path(grpc_tools.__file__).parent / "_proto"  # the well-known types (struct.proto)
        rc = protoc.main(["protoc", f"-Igsim/bridges/api={HERE}", f"-I{include}", f"--python_out={tmp}",
                          f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", str(PROTO)])
        if rc != 0:
            raise SystemExit(f"protogen: protoc failed on {PROTO} (exit {rc})")
        out.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            shutil.copyfile(Path(tmp) / "gsim" / "bridges" / "api" / name, out / name)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
    print(f"wrote {', '.join(GENERATED)}")
