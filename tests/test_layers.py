"""Shared code lives low and public: what a module imports at import time, and from where."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from gsim.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


# the top-level folders as pyproject.toml maps them into the gsim namespace, lowest layer first
FOLDERS = {"gsim": "gsim", "lidar": "gsim.lidar", "scenes": "gsim.scenes", "editing": "gsim.editing",
           "diffusion": "gsim.diffusion", "bridges": "gsim.bridges"}
# core < lidar < scenes < editing, diffusion < bridges: a module may import its own layer's and lower layers' alone
RANK = {"gsim": 0, "gsim.lidar": 1, "gsim.scenes": 2, "gsim.editing": 3, "gsim.diffusion": 3, "gsim.bridges": 4}


def _modules() -> dict:
    """{module name: file} of every gsim module in the repository (packages by their __init__.py)."""
    found = {}
    for folder, package in FOLDERS.items():
        for f in (ROOT / folder).rglob("*.py"):
            parts = f.relative_to(ROOT / folder).with_suffix("").parts
            found[".".join((package,) + parts[:-1] + (() if parts[-1] == "__init__" else parts[-1:]))] = f
    return found


def _imports(path: Path, top_level_only: bool = False):
    """(module, names) of every import statement in a gsim file (or those at module level: not inside a function or
    a class), relative ones resolved against its package."""
    folder = path.relative_to(ROOT).parts[0]
    package = ".".join((FOLDERS[folder],) + path.relative_to(ROOT / folder).parent.parts)
    tree = ast.parse(path.read_text())
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, (ast.If, ast.Try)) and top_level_only:  # (guarded imports at module level count)
            yield from (x for n in ast.walk(node) for x in _statement(n, package))
        else:
            yield from _statement(node, package)


def _statement(node, package: str):
    if isinstance(node, ast.ImportFrom):
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package if node.level else ""
        module = ".".join(x for x in (base, node.module) if x)
        yield module, [a.name for a in node.names]
    elif isinstance(node, ast.Import):
        for a in node.names:
            yield a.name, []


def _graph(top_level_only: bool) -> dict:
    """{module: the gsim modules it imports}: `from package import module` names the module, else the longest
    known prefix of what is imported."""
    modules = _modules()

    def known(name):
        return next((name.rsplit(".", k)[0] for k in range(name.count(".") + 1) if name.rsplit(".", k)[0] in modules),
                    None)

    graph = {}
    for m, f in modules.items():
        targets = {known(f"{mod}.{n}") if f"{mod}.{n}" in modules else known(mod)
                   for mod, names in _imports(f, top_level_only) for n in (names or [""])}
        graph[m] = sorted(t for t in targets if t and t != m)
    return graph


def _layer(module: str) -> str:
    head = ".".join(module.split(".")[:2])
    return head if head in RANK else "gsim"


def test_no_module_imports_another_that_imports_it_back():
    """No import circle between gsim's modules, however long, counting imports inside functions (a reader meets a
    circle either way)."""
    graph, index, low, stack, circles = _graph(top_level_only=False), {}, {}, [], []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles


def test_no_module_level_import_runs_up_the_layers():
    """A module imports its own layer and the layers below at import time; a higher layer only inside a function
    (loaded on use). The one exception is gsim's public face, gsim/__init__.py, which re-exports the LiDAR layer's
    entry points (numpy-only at import) beside the core's."""
    up = [(m, t) for m, targets in _graph(top_level_only=True).items() for t in targets
          if m != "gsim" and (RANK[_layer(t)] > RANK[_layer(m)]
                              or (RANK[_layer(t)] == RANK[_layer(m)] and _layer(t) != _layer(m)))]
    assert not up


def test_the_import_graph_sees_what_it_checks():
    """The walk finds the modules and edges the two tests above judge (a walk that found nothing would pass them)."""
    graph = _graph(top_level_only=False)
    assert len(graph) > 100 and "gsim.scenes.formats.kitti_raw" in graph and "gsim.lidar.groups" in graph
    assert "gsim.lidar.groups" in graph["gsim.lidar.render"] and "gsim.sh" in graph["gsim.surfels"]
    assert "gsim.lidar.heads" in graph["gsim.scene"]  # inside a function: a circle's edge all the same
    assert "gsim.lidar.heads" not in _graph(top_level_only=True)["gsim.scene"]


def test_the_network_client_does_not_import_gymnasium():
    pytest.importorskip("grpc")
    code = "import sys, gsim.bridges.api.client; assert 'gymnasium' not in sys.modules, 'gymnasium imported'"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_the_gymnasium_environment_registers_from_its_own_module():
    gymnasium = pytest.importorskip("gymnasium")
    # the id names the module, which gymnasium imports; the environment's own check of its arguments answers
    with pytest.raises(InputError, match="action must be"):
        gymnasium.make("gsim.bridges.closed_loop.env:gsim/ClosedLoop-v0", action="steer")
    assert "gsim/ClosedLoop-v0" in gymnasium.registry


def test_render_and_image_metrics_come_from_core_not_the_evaluation():
    """editing, diffusion, bridges and the lane-shift evaluation take renders and image metrics from gsim.images,
    never from gsim.scenes.evaluation.evaluate (which imports evaluation.lane_shift: no cycle); running the
    evaluation itself (`evaluate`, as gsim batch does for each log) is the one thing they may take from it."""
    files = [f for d in ("editing", "diffusion", "bridges") for f in (ROOT / d).rglob("*.py")]
    files.append(ROOT / "scenes" / "evaluation" / "lane_shift.py")
    bad = [(f.name, m, names) for f in files for m, names in _imports(f)
           if m == "gsim.scenes.evaluation.evaluate" and (f.name == "lane_shift.py" or set(names) != {"evaluate"})]
    assert not bad


def test_lidar_kernels_import_no_private_name_of_the_camera_backend():
    bad = [(f.name, m, n) for f in (ROOT / "lidar").glob("*.py") for m, names in _imports(f)
           if m.startswith("gsim.render") for n in names if n.startswith("_")]
    assert not bad


def test_every_package_is_in_the_distribution():
    """pyproject.toml lists each package (a wheel holds only those): a new subpackage missing there would import
    here, from the checkout, and not from an installed wheel."""
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+)
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert listed == {m for m, f in _modules().items() if f.name == "__init__.py"}
