"""The closed loop's road as OpenDRIVE (gsim scenario export-road, gsim.bridges.closed_loop.opendrive): written by
SUMO's netconvert from the network the loop drives, and read back by netconvert into the same lanes."""
import sys
from pathlib import Path

import numpy as np
import pytest

sumolib = pytest.importorskip("sumolib", reason="needs the sumo extra")
pytest.importorskip("yaml")
sys.path.insert(0, str(Path(__file__).parent))
from gsim.bridges.closed_loop.opendrive import export_road, road_network  # noqa: E402
from gsim.bridges.closed_loop.sumo import run_netconvert  # noqa: E402
from gsim.cli import main  # noqa: E402
from gsim.errors import InputError  # noqa: E402
from support import scenario  # noqa: E402


def cross_track(path, pts):
    a, seg = path[:-1], np.diff(path, axis=0)
    u = np.clip(np.einsum("mnk,nk->mn", pts[:, None] - a, seg) / (seg ** 2).sum(1), 0, 1)
    return np.linalg.norm(a + u[..., None] * seg - pts[:, None], axis=2).min(1)


def test_the_exported_road_reads_back_as_the_loops_lanes(loop_street, tmp_path):
    """Two lanes forward and one back, 3.2 m: the .xodr names them with OpenDRIVE's signed ids, and netconvert's
    import of it lays lanes as wide along every lane centre line of the loop's network (within 5 cm)."""
    path = scenario(loop_street, "road", road={"lanes": 2, "lane_width_m": 3.2, "opposite_lanes": 1, "ego_lane": 0})
    r = export_road(path, tmp_path / "road.xodr")
    assert r["lanes"] == (2, 1) and r["lane_width_m"] == pytest.approx(3.2)
    text = (tmp_path / "road.xodr").read_text()
    assert "<OpenDRIVE" in text and 'id="-2"' in text and 'id="1"' in text
    net, _ = road_network(path, tmp_path / "again")
    run_netconvert(["--opendrive-files", str(tmp_path / "road.xodr")], tmp_path / "back.net.xml")
    back = sumolib.net.readNet(str(tmp_path / "back.net.xml"), withInternal=True)
    lanes = [(np.asarray(lane.getShape())[:, :2], lane.getWidth()) for e in back.getEdges(withInternal=True)
             for lane in e.getLanes()]
    ours = [(shape, width) for lid, shape, width in net.lanes() if not lid.startswith(":")]
    assert len(ours) >= 3
    for shape, width in ours:  # every point of our lane on some read-back lane of its width (edges split anew)
        near = [cross_track(back_shape, shape) for back_shape, w in lanes if abs(w - width) < 0.01]
        assert near and np.min(near, axis=0).max() < 0.05

def test_a_scene_directory_gets_the_default_road_and_the_command_line_writes_it(loop_street, tmp_path, capsys):
    assert main(["scenario", "export-road", str(loop_street), str(tmp_path / "r.xodr")]) == 0
    assert "1 lanes forward, 1 opposite, 3.5 m wide" in capsys.readouterr().out
    assert (tmp_path / "r.xodr").read_text().lstrip().startswith("<?xml")


def test_bad_export_requests_are_refused_and_write_nothing(loop_street, tmp_path, capsys):
    with pytest.raises(InputError, match="must end in .xodr"):
        export_road(str(loop_street), tmp_path / "r.xml")
    with pytest.raises(InputError, match="not a scenario file"):
        export_road(str(tmp_path / "nowhere"), tmp_path / "r.xodr")
    assert main(["scenario", "export-road", str(loop_street)]) == 2
    assert "give the .xodr file to write" in capsys.readouterr().err
    assert main(["scenario", "validate", str(loop_street / "x.yaml"), str(tmp_path / "r.xodr")]) == 2
    assert "only for export-road, export and import" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_scenario_exports_as_openscenario_that_parses_back_to_its_tracks(loop_street, tmp_path, capsys):
    """gsim scenario export: OUT/<name>.xosc (OpenSCENARIO 1.3) and OUT/road.xodr; scenariogeneration's own parser
    reads back each entity's teleport and the timed polyline of its track (gsim's world frame), the road and the
    scene it names."""
    xosc = pytest.importorskip("scenariogeneration.xosc", reason="needs the scenarios extra (scenariogeneration)")
    edits = [{"kind": "insert", "asset": "sedan", "id": "ahead",
              "track": {"path": [[10.0, -1.75], [30.0, -1.75]], "speed_mps": 5.0}}]
    path = scenario(loop_street, "export", edits)
    assert main(["scenario", "export", path, str(tmp_path / "out")]) == 0
    assert "export.xosc" in capsys.readouterr().out
    sc = xosc.ParseOpenScenario(str(tmp_path / "out" / "export.xosc"))
    assert sc.roadnetwork.road_file == "road.xodr" and (tmp_path / "out" / "road.xodr").is_file()
    assert (tmp_path / "out" / sc.roadnetwork.scene).resolve() == (loop_street / "scene").resolve()
    names = [o.name for o in sc.entities.scenario_objects]
    assert names[0] == "ego" and {"ahead", "parked"} <= set(names)
    from gsim.bridges.closed_loop.scenario import load_loop_scenario
    from gsim.editing.world import apply
    world = apply(load_loop_scenario(path), ego_overlaps=True)  # (as the closed loop applies it)
    t0 = int(world.frames[0].timestamp_us)
    ahead = next(a for a in world.scene.actors if a.id == "ahead")
    # the teleport and the polyline of "ahead": its vertices are the track's poses at their times from the first frame
    import xml.etree.ElementTree as ET
    root = ET.parse(tmp_path / "out" / "export.xosc").getroot()
    group = next(g for g in root.iter("ManeuverGroup") if g.find("Actors/EntityRef").get("entityRef") == "ahead")
    vertices = [(float(v.get("time")), float(v.find("Position/WorldPosition").get("x")),
                 float(v.find("Position/WorldPosition").get("y"))) for v in group.iter("Vertex")]
    keep = (ahead.track_timestamps_us >= t0) & (ahead.track_timestamps_us <= int(world.frames[-1].timestamp_us))
    want = [((t - t0) * 1e-6, T[0, 3], T[1, 3]) for t, T in zip(ahead.track_timestamps_us[keep],
                                                                  ahead.track_poses[keep])]
    assert len(vertices) == len(want) and np.allclose(vertices, want, atol=1e-6)
    private = next(p for p in root.iter("Private") if p.get("entityRef") == "ahead")
    start = private.find("PrivateAction/TeleportAction/Position/WorldPosition")
    assert (float(start.get("x")), float(start.get("y"))) == pytest.approx(want[0][1:], abs=1e-6)
