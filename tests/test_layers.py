"""Shared code lives low and public: what a module imports at import time, and from where."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from gsim.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path):
    """(module, names) of every import statement in a file, relative ones resolved against its package."""
    package = "gsim" if path.parent.name == "gsim" else f"gsim.{path.parent.name}"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(x for x in (base, node.module) if x)
            yield module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def test_the_network_client_does_not_import_gymnasium():
    pytest.importorskip("grpc")
    code = "import sys, gsim.bridges.client; assert 'gymnasium' not in sys.modules, 'gymnasium imported'"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_the_gymnasium_environment_registers_from_its_own_module():
    gymnasium = pytest.importorskip("gymnasium")
    # the id names the module, which gymnasium imports; the environment's own check of its arguments answers
    with pytest.raises(InputError, match="action must be"):
        gymnasium.make("gsim.bridges.env:gsim/ClosedLoop-v0", action="steer")
    assert "gsim/ClosedLoop-v0" in gymnasium.registry


def test_render_and_image_metrics_come_from_core_not_the_evaluation():
    """editing, diffusion, bridges and the lane-shift evaluation take renders and image metrics from gsim.images,
    never from gsim.scenes.evaluate (which imports scenes.lane_shift: no cycle); running the evaluation itself
    (`evaluate`, as gsim batch does for each log) is the one thing they may take from it."""
    files = [f for d in ("editing", "diffusion", "bridges") for f in (ROOT / d).glob("*.py")]
    files.append(ROOT / "scenes" / "lane_shift.py")
    bad = [(f.name, m, names) for f in files for m, names in _imports(f)
           if m == "gsim.scenes.evaluate" and (f.name == "lane_shift.py" or set(names) != {"evaluate"})]
    assert not bad


def test_lidar_kernels_import_no_private_name_of_the_camera_backend():
    bad = [(f.name, m, n) for f in (ROOT / "lidar").glob("*.py") for m, names in _imports(f)
           if m.startswith("gsim.render") for n in names if n.startswith("_")]
    assert not bad
