"""gsim.io.read_manifest, the one reader of gsim's JSON manifests, and the loaders built on it: every way a
manifest file can be wrong is one error of the loader's own type that names the file."""
import errno
import json
from pathlib import Path

import pytest

from gsim.errors import InputError, SceneFormatError
from gsim.io import read_manifest


@pytest.fixture
def deny_reading(monkeypatch):
    """Make reading one file fail as an unreadable file does (the tests may run as root, who reads anything)."""
    def deny(path):
        real = Path.read_bytes

        def read_bytes(self):
            if self == path:
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return real(self)
        monkeypatch.setattr(Path, "read_bytes", read_bytes)
    return deny


def _write(path: Path, content) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


# each bad manifest: (what to write, or "dir" / "deny"; words the message must hold)
BAD = {
    "missing": (None, ["no such file", "test manifest"]),
    "directory": ("dir", ["is a directory"]),
    "unreadable": ("deny", ["cannot read", "Permission denied"]),
    "not UTF-8": (b'{"schema_version": 1, "name": "caf\xe9"}', ["not UTF-8", "byte 34"]),
    "invalid JSON": ('{"schema_version": 1,\n "name": }', ["not valid JSON", "line 2, column 10"]),
    "an array": ("[1, 2]", ["must be a JSON object", "an array"]),
    "no version": ('{"name": "x"}', ["'schema_version' is missing", "versions 1, 2"]),
    "unknown version": ('{"schema_version": 3}', ["'schema_version' is 3", "versions 1, 2"]),
    "version true": ('{"schema_version": true}', ["'schema_version' is True"]),
    "version 1.0": ('{"schema_version": 1.0}', ["'schema_version' is 1.0"]),
}


def _break(path: Path, how, deny_reading) -> None:
    if how == "dir":
        path.mkdir(parents=True)
    elif how == "deny":
        _write(path, '{"schema_version": 1}')
        deny_reading(path)
    elif how is not None:
        _write(path, how)


@pytest.mark.parametrize("case", BAD)
def test_each_bad_manifest_is_one_error_naming_the_file(tmp_path, deny_reading, case):
    how, words = BAD[case]
    path = tmp_path / "m.json"
    _break(path, how, deny_reading)
    with pytest.raises(InputError) as e:
        read_manifest(path, "test manifest", (1, 2))
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg, msg
    assert all(w in msg for w in words), msg


def test_a_good_manifest_reads_and_errors_take_the_callers_type(tmp_path):
    path = _write(tmp_path / "m.json", json.dumps({"schema_version": 2, "name": "café"}))
    assert read_manifest(path, "test manifest", (1, 2)) == {"schema_version": 2, "name": "café"}
    with pytest.raises(SceneFormatError, match="'schema_version' is 2; this gsim reads version 1$"):
        read_manifest(path, "scene manifest", (1,), SceneFormatError)


def _scene(root: Path):
    from gsim.scene import load_scene
    return root / "scene.json", lambda: load_scene(root), SceneFormatError


def _log(root: Path):
    from gsim.scenes.log import LogFormatError, load_log
    return root / "log.json", lambda: load_log(root), LogFormatError


def _trajectory(root: Path):
    from gsim.trajectory import load_trajectory
    return root / "t.json", lambda: load_trajectory(root / "t.json"), InputError


def _lidar_head(root: Path):
    from gsim.lidar.heads import LidarHead
    return root / "lidar_head.json", lambda: LidarHead.load(root / "lidar_head.json"), InputError


def _repair_model(root: Path):
    pytest.importorskip("diffusers")
    from gsim.diffusion.repair import SETTINGS, RepairModel
    for sub in ("unet", "scheduler"):
        (root / sub).mkdir(parents=True)
    return root / SETTINGS, lambda: RepairModel.load(root), InputError


@pytest.mark.parametrize("loader", [_scene, _log, _trajectory, _lidar_head, _repair_model])
@pytest.mark.parametrize("case", ["directory", "unreadable", "not UTF-8", "invalid JSON", "an array", "no version"])
def test_every_manifest_loader_reads_through_the_one_reader(tmp_path, deny_reading, loader, case):
    path, load, error = loader(tmp_path / "x")
    _break(path, BAD[case][0], deny_reading)
    with pytest.raises(error) as e:
        load()
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and BAD[case][1][0] in msg, msg


def test_a_manifest_nested_beyond_reason_is_bad_input_not_a_crash(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(InputError, match="nests too deeply"):
        read_manifest(p, "scene manifest", (1,))


def test_a_scenario_nested_beyond_reason_is_bad_input(tmp_path):
    pytest.importorskip("yaml")
    pytest.importorskip("pydantic")
    from gsim.editing.scenario import ScenarioError, load_scenario
    p = tmp_path / "deep.yaml"
    p.write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ScenarioError, match="nests too deeply|not valid YAML"):
        load_scenario(p)


def test_a_symlink_loop_is_refused_as_a_path(tmp_path):
    from gsim.io import child_path
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(InputError, match="leads outside"):
        child_path(tmp_path, "loop", "asset id")
