"""Old import paths of modules that moved into subpackages (gsim.moved): the public ones import quietly, the others
with a FutureWarning naming the new path; either way the old name is the new module itself."""
import json
import subprocess
import sys
import warnings

import pytest

CONVERTERS = {"kitti_raw": "convert_kitti_raw", "kitti_tracking": "convert_kitti_tracking", "dgp": "convert_dgp",
              "nerfstudio": "import_nerfstudio", "waymo": "convert_waymo", "nuscenes": "convert_nuscenes",
              "av2": "convert_av2"}
DEPRECATED = {"gsim.scenes.train": "gsim.scenes.reconstruction.train",
              "gsim.scenes.evaluate": "gsim.scenes.evaluation.evaluate",
              "gsim.scenes.convert_util": "gsim.scenes.formats.convert_util",
              "gsim.bridges.loop": "gsim.bridges.closed_loop.loop",
              "gsim.bridges.runner": "gsim.bridges.closed_loop.runner",
              "gsim.bridges.record": "gsim.bridges.recording.record",
              "gsim.bridges.batch": "gsim.bridges.cluster.batch",
              "gsim.bridges.viewer": "gsim.bridges.browser.viewer"}


def _in_a_fresh_process(code: str):
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_the_converters_modules_keep_their_public_paths_quietly():
    code = ("import importlib, json, warnings\nwarnings.simplefilter('error')\n"
            f"names = {CONVERTERS!r}\n"
            "out = {m: getattr(importlib.import_module(f'gsim.scenes.{m}'), f) is "
            "getattr(importlib.import_module(f'gsim.scenes.formats.{m}'), f) for m, f in names.items()}\n"
            "from gsim.scenes.kitti_raw import convert_kitti_raw\nout['from'] = convert_kitti_raw.__module__\n"
            "print(json.dumps(out))")
    out = _in_a_fresh_process(code)
    assert out.pop("from") == "gsim.scenes.formats.kitti_raw"
    assert out == {m: True for m in CONVERTERS}


def test_the_network_client_and_the_gymnasium_id_keep_their_paths():
    pytest.importorskip("grpc")
    gymnasium = pytest.importorskip("gymnasium")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from gsim.bridges.api.client import SensorClient
        from gsim.bridges.client import SensorClient as old
        assert old is SensorClient
        import gsim.bridges.env  # noqa: F401  (what gymnasium imports for the old id)
    from gsim.errors import InputError
    with pytest.raises(InputError, match="action must be"):  # the environment's own check of its arguments answers
        gymnasium.make("gsim.bridges.env:gsim/ClosedLoop-v0", action="steer")


def test_the_other_old_paths_warn_and_give_the_new_module():
    code = ("import importlib, json, sys, warnings\n"
            f"moved = {DEPRECATED!r}\nout = {{}}\n"
            "for old, new in moved.items():\n"
            "    with warnings.catch_warnings(record=True) as w:\n"
            "        warnings.simplefilter('always')\n"
            "        m = importlib.import_module(old)\n"
            "    out[old] = [m is importlib.import_module(new), m.__name__, "
            "[f'{x.category.__name__}: {x.message}' for x in w if 'moved' in str(x.message)]]\n"
            "print(json.dumps(out))")
    out = _in_a_fresh_process(code)
    for old, new in DEPRECATED.items():
        same, name, said = out[old]
        assert same and name == new, old
        assert said == [f"FutureWarning: {old} moved to {new}; the old name goes in the next release"], old


def test_an_unknown_old_name_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        import gsim.scenes.no_such_module  # noqa: F401
