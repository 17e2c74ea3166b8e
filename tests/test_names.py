"""Names that become file or folder names (scenario names, asset ids, actor ids, sensor names) are refused
unless they are one safe path component: a clear error naming the field, and nothing written anywhere."""
import json

import numpy as np
import pytest

trimesh = pytest.importorskip("trimesh")
pytest.importorskip("yaml")

import gsim  # noqa: E402
from gsim.bridges.closed_loop.scenario import load_loop_scenario  # noqa: E402
from gsim.editing import AssetLibrary, asset_from_actor, asset_from_mesh, insert_actor  # noqa: E402
from gsim.editing.library import Asset, Source, load_asset  # noqa: E402
from gsim.editing.scenario import ScenarioError, load_scenario, parse_scenario  # noqa: E402
from gsim.errors import InputError  # noqa: E402
from gsim.surfels import rgb_to_sh  # noqa: E402


def bad_names(tmp_path):
    """A parent step, an absolute path (inside tmp_path, so that a write there would show), a subfolder, the
    empty name, a 300-character name and a non-ASCII one."""
    return ["../x", str(tmp_path / "abs"), "a/b", "", "n" * 300, "naïve"]


def files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def block(asset_id="block") -> Asset:
    """A small asset: surfels on the faces of a 1 m cube."""
    g = np.linspace(-0.45, 0.45, 6)
    a, b = [x.ravel() for x in np.meshgrid(g, g)]
    pts = np.concatenate([np.roll(np.c_[a, b, np.full_like(a, s * 0.5)], k, axis=1) for k in range(3) for s in (-1, 1)])
    pts[:, 2] += 0.5
    m = len(pts)
    s = gsim.Surfels(pts, np.tile([1.0, 0, 0, 0], (m, 1)), np.full((m, 2), 0.1), np.full(m, 0.9),
                     rgb_to_sh(np.full((m, 1, 3), 0.5)))
    return Asset(asset_id, "other", (1.0, 1.0, 1.0), s, Source(kind="builtin", detail="test"))


def scenario_dict(tmp_path, **over):
    d = {"schema_version": 1, "name": "ok", "scene": str(tmp_path / "scene"), "log": str(tmp_path / "log"),
         "edits": [{"kind": "insert", "asset": "cone", "id": "c1",
                    "track": {"poses": [{"t_us": 0, "xyz": [9, 0, 0]}]}}],
         "output": str(tmp_path / "out" / "o")}
    d.update(over)
    return d


def test_scenario_names_are_refused_by_the_cli_and_nothing_is_written(tmp_path, capsys):
    from gsim.cli import main
    (tmp_path / "out").mkdir()
    for k, name in enumerate(bad_names(tmp_path)):
        path = tmp_path / f"s{k}.yaml"
        path.write_text(json.dumps(scenario_dict(tmp_path, name=name)))
        before = files(tmp_path)
        for action in ("render", "apply"):
            assert main(["scenario", action, str(path)]) == 2, name
            err = capsys.readouterr().err
            assert "name: scenario name:" in err and "is not a valid name" in err and "Traceback" not in err
        with pytest.raises(ScenarioError, match=r"s\d\.yaml: name: scenario name: .* is not a valid name"):
            load_scenario(path)
        with pytest.raises(ScenarioError, match=r"name: scenario name: .* is not a valid name"):
            load_loop_scenario(path)  # a closed-loop run's folder is named after its scenario
        assert files(tmp_path) == before


@pytest.mark.parametrize("field", ["insert id", "insert asset", "remove actor", "move actor", "camera", "lidar"])
def test_ids_in_edits_and_sensor_names_are_refused_naming_the_field(tmp_path, field):
    for name in bad_names(tmp_path):
        d = scenario_dict(tmp_path)
        ins = d["edits"][0]
        if field == "insert id":
            ins["id"], where = name, r"edits\[0\]\.id: actor id: "
        elif field == "insert asset":
            ins["asset"], where = name, r"edits\[0\]\.asset: asset id: "
        elif field in ("remove actor", "move actor"):
            d["edits"].append({"kind": field.split()[0], "actor": name})
            where = r"edits\[1\]\.actor: actor id: "
        else:
            d["sensors"] = {f"{field}s": ["front", name]}
            where = rf"sensors\.{field}s\[1\]: sensor name: "
        with pytest.raises(ScenarioError, match=where + r".* is not a valid name \(expected 1-128 characters"):
            parse_scenario(d)


def test_insert_actor_refuses_an_actor_id_that_is_no_name(tmp_path):
    scene = gsim.Scene(background=block().surfels)
    for name in bad_names(tmp_path):
        with pytest.raises(InputError, match=r"insert_actor: actor_id: .* is not a valid name"):
            insert_actor(scene, block(), [0], [np.eye(4)], actor_id=name, on_ground=False, allow_overlap=True)
    # without an id the asset's own gives one, kept within a name's length
    long = insert_actor(scene, block("b" * 128), [0], [np.eye(4)], on_ground=False, allow_overlap=True)
    assert long.actors[0].id == "b" * 120 + "_0"


def test_asset_ids_are_refused_by_the_library_and_the_cli_and_nothing_is_written(tmp_path, capsys):
    from gsim.cli import main
    trimesh.creation.box(extents=(0.5, 0.5, 1.0)).export(tmp_path / "post.obj")
    lib = tmp_path / "lib"
    before = files(tmp_path)
    for name in bad_names(tmp_path):
        with pytest.raises(InputError, match=r"asset id: .* is not a valid name"):
            block(name)
        with pytest.raises(InputError, match=r"asset id: .* is not a valid name"):
            asset_from_mesh(tmp_path / "post.obj", name, "sign")
        assert main(["library", "add-mesh", str(tmp_path / "post.obj"), str(lib), "--id", name,
                     "--category", "sign"]) == 2
        err = capsys.readouterr().err
        assert "asset id:" in err and "is not a valid name" in err and "Traceback" not in err
        assert files(tmp_path) == before
    # an actor's id that is no name makes no asset either (its id is the asset's by default)
    scene = insert_actor(gsim.Scene(background=block().surfels), block(), [0], [np.eye(4)], actor_id="ok",
                         on_ground=False, allow_overlap=True)
    scene.save(tmp_path / "scene")
    with pytest.raises(InputError, match=r"asset id: '' is not a valid name"):
        asset_from_actor(tmp_path / "scene", "ok", "")


def test_a_link_planted_in_the_library_cannot_lead_a_write_outside(tmp_path):
    lib, outside = tmp_path / "lib", tmp_path / "outside"
    lib.mkdir()
    outside.mkdir()
    (lib / "block").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InputError, match=r"asset id: .*block leads outside"):
        AssetLibrary(lib).add(block(), overwrite=True)
    assert files(outside) == [] and (lib / "block").is_symlink()


def test_a_manifest_whose_id_is_no_name_is_refused(tmp_path):
    lib = AssetLibrary(tmp_path / "lib")
    folder = lib.add(block())
    m = json.loads((folder / "asset.json").read_text())
    for name in ("../x", "a/b", ""):
        m["id"] = name
        (folder / "asset.json").write_text(json.dumps(m))
        with pytest.raises(gsim.SceneFormatError, match=r"asset.json: id: asset id: .* is not a valid name"):
            load_asset(folder)


def test_a_batch_agent_spec_never_becomes_a_path():
    """Agent specs name folders of a closed-loop batch: a valid name is its own folder; a module or command spec
    (which may hold '/', '..' or spaces) gets its safe characters and a hash of the whole spec."""
    from gsim.bridges.closed_loop.runner import agent_folder
    from gsim.errors import check_name
    assert agent_folder("lidar-aeb") == "lidar-aeb"
    specs = ["exec:../../x", "exec:/bin/agent --x", "mod.sub:Agent", "exec:" + "a" * 300, "exec:naïve", "exec:.."]
    folders = [agent_folder(s) for s in specs]
    for spec, f in zip(specs, folders):
        assert check_name(f, "agent folder") == f, spec
    assert len(set(folders)) == len(specs)
    assert agent_folder("exec:a b") != agent_folder("exec:a/b")  # the same slug, told apart by the hash
