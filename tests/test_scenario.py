"""Scenario files: round trip, validation errors that name the field, the edits applied with their checks,
and the rendered outputs (a valid log with every track, masks, KITTI labels that project onto them)."""
import json

import numpy as np
import pytest

pytest.importorskip("trimesh")
pytest.importorskip("yaml")

import gsim  # noqa: E402
from gsim.editing import EditError  # noqa: E402
from gsim.editing.outputs import render_world  # noqa: E402
from gsim.editing.scenario import ScenarioError, load_scenario, parse_scenario, save_scenario  # noqa: E402
from gsim.editing.world import apply  # noqa: E402
from gsim.scenes.log import validate_log  # noqa: E402
from support import scenario_dict  # noqa: E402

def write(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def test_round_trip(tmp_path, edit_street):
    root, _ = edit_street
    sc = parse_scenario(scenario_dict(root))
    save_scenario(sc, tmp_path / "a.yaml")
    back = load_scenario(tmp_path / "a.yaml")
    assert back == sc
    save_scenario(back, tmp_path / "b.yaml")
    assert (tmp_path / "a.yaml").read_text() == (tmp_path / "b.yaml").read_text()


def test_validation_errors_name_the_field(tmp_path, edit_street):
    root, _ = edit_street
    bad = scenario_dict(root)
    bad["edits"][0]["track"]["speed_mps"] = -1
    with pytest.raises(ScenarioError, match=r"edits\[0\]\.track\.speed_mps: Input should be greater than or equal to 0"):
        parse_scenario(bad)
    with pytest.raises(ScenarioError, match=r"edits\[1\]\.actor: Field required"):
        parse_scenario(scenario_dict(root, edits=[{"kind": "insert", "asset": "sedan", "track": {"poses": [
            {"t_us": 0, "xyz": [1, 2, 0]}]}}, {"kind": "remove"}]))
    with pytest.raises(ScenarioError, match=r"time\.end_us: Input should be less than or equal to 4611686018427387904"):
        parse_scenario(scenario_dict(root, time={"end_us": 10 ** 30}))  # times fit numpy's int64
    with pytest.raises(ScenarioError, match=r"schema_version"):
        parse_scenario(scenario_dict(root, schema_version=7))
    with pytest.raises(ScenarioError, match=r"edits\[0\]\.track: give either poses or path"):
        parse_scenario(scenario_dict(root, edits=[{"kind": "insert", "asset": "sedan", "track": {}}]))
    with pytest.raises(ScenarioError, match=r"s.yaml: not valid YAML"):
        load_scenario(write(tmp_path, "edits: [unclosed\n"))
    with pytest.raises(ScenarioError, match=r"sensors\.downscale: Input should be a valid integer"):
        load_scenario(write(tmp_path, json.dumps(scenario_dict(root, sensors={"downscale": "two"}))))
    with pytest.raises(ScenarioError, match=r"expected a mapping"):
        load_scenario(write(tmp_path, "- just\n- a list\n"))


# (YAML spelling at a field, the field path the error names): NaN and infinities in every kind of number field
NON_FINITE = [
    ("edits: [{kind: insert, asset: sedan, track: {poses: [{t_us: 0, xyz: [1, .nan, 0]}]}}]",
     r"edits\[0\]\.track\.poses\[0\]\.xyz\[1\]"),
    ("edits: [{kind: insert, asset: sedan, track: {poses: [{t_us: 0, xyz: [1, 2, 0], yaw_deg: .inf}]}}]",
     r"edits\[0\]\.track\.poses\[0\]\.yaw_deg"),
    ("edits: [{kind: insert, asset: sedan, track: {poses: [{t_us: .inf, xyz: [1, 2, 0]}]}}]",
     r"edits\[0\]\.track\.poses\[0\]\.t_us"),
    ("edits: [{kind: insert, asset: sedan, track: {path: [[0, 0], [-.inf, 1]], speed_mps: 3}}]",
     r"edits\[0\]\.track\.path\[1\]\[0\]"),
    ("edits: [{kind: insert, asset: sedan, track: {path: [[0, 0], [9, 1]], speed_mps: .Inf}}]",
     r"edits\[0\]\.track\.speed_mps"),
    ("edits: [{kind: insert, asset: sedan, track: {path: [[0, 0], [9, 1]], speed_mps: [2, .NaN]}}]",
     r"edits\[0\]\.track\.speed_mps\[1\]"),
    ("edits: [{kind: move, actor: a, shift_m: [0, +.inf, 0]}]", r"edits\[0\]\.shift_m\[1\]"),
    ("edits: [{kind: move, actor: a, speed_scale: .inf}]", r"edits\[0\]\.speed_scale"),
    ("edits: [{kind: move, actor: a, speed_scale: 1.0e+999}]", r"edits\[0\]\.speed_scale"),
    ("ego: {shift_m: .NAN}", r"ego\.shift_m"),
    ("ego: {size_m: [4, 2, .inf]}", r"ego\.size_m\[2\]"),
    ("time: {end_us: .inf}", r"time\.end_us"),
]


@pytest.mark.parametrize("text,where", NON_FINITE)
def test_non_finite_numbers_are_refused_naming_the_field(tmp_path, text, where):
    head = "schema_version: 1\nname: t\nscene: s\nlog: l\noutput: o\n"
    with pytest.raises(ScenarioError, match=rf"s\.yaml: {where}: Input should be a finite number"):
        load_scenario(write(tmp_path, head + text + "\n"))


@pytest.mark.parametrize("text,where", NON_FINITE[:2] + [
    ("closed_loop: {duration_s: .inf}", r"closed_loop\.duration_s"),
    ("closed_loop: {step_s: .nan}", r"closed_loop\.step_s"),
    ("closed_loop: {target_speed_mps: .inf}", r"closed_loop\.target_speed_mps"),
    ("closed_loop: {road: {lane_width_m: .nan}}", r"closed_loop\.road\.lane_width_m"),
    ("closed_loop: {road: {net: n.net.xml, T_world_net: [[1, 0, 0, 0], [0, 1, 0, .nan], [0, 0, 1, 0], [0, 0, 0, 1]]}}",
     r"closed_loop\.road\.T_world_net\[1\]\[3\]"),
    ("closed_loop: {traffic: {vehicles: [{pos_m: -.inf}]}}", r"closed_loop\.traffic\.vehicles\[0\]\.pos_m"),
    ("closed_loop: {traffic: {vclass_mix: {passenger: .inf}}}", r"closed_loop\.traffic\.vclass_mix\.passenger"),
    ("closed_loop: {traffic: {keep_clear_m: [-.inf, 30]}}", r"closed_loop\.traffic\.keep_clear_m\[0\]"),
    ("closed_loop: {log_actors: {mode: sumo, handover_s: .inf}}", r"closed_loop\.log_actors\.handover_s"),
    ("closed_loop: {vehicle: {wheelbase_m: .nan}}", r"closed_loop\.vehicle\.wheelbase_m"),
])
def test_non_finite_numbers_are_refused_in_closed_loop_scenarios(tmp_path, text, where):
    from gsim.bridges.closed_loop.scenario import load_loop_scenario
    head = "schema_version: 1\nname: t\nscene: s\nlog: l\n"
    with pytest.raises(ScenarioError, match=rf"s\.yaml: {where}: Input should be a finite number"):
        load_loop_scenario(write(tmp_path, head + text + "\n"))


def test_bad_edits_are_clear_errors_and_write_nothing(edit_street):
    root, _ = edit_street

    def fails(match, **over):
        with pytest.raises(EditError, match=match):
            apply(parse_scenario(scenario_dict(root, **over)))

    fails(r"edits\[0\] \(insert\): unknown asset 'tank'",
          edits=[{"kind": "insert", "asset": "tank", "track": {"poses": [{"t_us": 0, "xyz": [20, 0, 0]}]}}])
    fails(r"edits\[0\] \(remove\): remove_actor: no actor 'nobody'", edits=[{"kind": "remove", "actor": "nobody"}])
    fails(r"edits\[1\] \(insert\): actor 'b' overlaps actor 'a' at t=0 us",
          edits=[{"kind": "insert", "asset": "suv", "id": "a", "track": {"poses": [{"t_us": 0, "xyz": [20, 0, 0]}]}},
                 {"kind": "insert", "asset": "sedan", "id": "b", "track": {"poses": [{"t_us": 0, "xyz": [21, 0, 0]}]}}])
    fails(r"edits\[0\] \(insert\): track: times \[0, 9000000\] us leave the log's span \[0, 400000\] us",
          edits=[{"kind": "insert", "asset": "cone", "track": {"poses": [{"t_us": 0, "xyz": [20, 0, 0]},
                                                                         {"t_us": 9000000, "xyz": [21, 0, 0]}]}}])
    fails(r"actor 'blocker' overlaps the ego vehicle at t=0 us",
          edits=[{"kind": "insert", "asset": "barrier", "id": "blocker",
                  "track": {"poses": [{"t_us": 0, "xyz": [1.5, -1.75, 0]}]}}])
    fails(r"time: the range", time={"start_us": 5_000_000})
    assert not (root / "out").exists()


def test_render_writes_a_log_with_every_track_and_labels_that_match_the_masks(edit_street):
    root, _ = edit_street
    sc = parse_scenario(scenario_dict(root))
    world = apply(sc)
    assert [a.id for a in world.scene.actors] == ["ahead"] and world.changed == ("ahead",)
    out = render_world(world, sc, progress=False)
    log = validate_log(out / "log")
    assert len(log.frames) == 5 and [a.id for a in log.actors] == ["ahead"]
    assert "top" in log.lidars and log.sweep(log.frames[0].lidars["top"]).shape[1] == 5
    # the inserted car drives along its path in the new log
    a = log.actors[0]
    p0, p1 = a.pose_at(0)[:3, 3], a.pose_at(400_000)[:3, 3]
    assert p1[0] - p0[0] == pytest.approx(2.0, abs=0.05) and p0[1] == pytest.approx(-1.75, abs=1e-3)
    assert (out / "video" / "front.mp4").is_file() and gsim.load_scene(out / "scene").actors[0].id == "ahead"
    from PIL import Image
    for i in range(5):
        labels = json.loads((out / "labels" / "front" / f"{i:06d}.json").read_text())
        mask = np.asarray(Image.open(out / "masks" / "front" / f"{i:06d}.png"))
        objs = labels["objects"]
        assert len(objs) == 1 and objs[0]["id"] == "ahead" and (mask == 1).sum() > 20
        x1, y1, x2, y2 = objs[0]["box2d"]
        v, u = np.nonzero(mask == 1)
        assert u.min() == x1 and v.min() == y1 and u.max() + 1 == x2 and v.max() + 1 == y2
        # the KITTI 3D box, projected with the calibration's P2, covers the instance's pixels (KITTI's convention:
        # pixel centres at integers, so the 2D box is the JSON's less 0.5)
        line = (out / "kitti" / "front" / "label_2" / f"{i:06d}.txt").read_text().split()
        assert line[0] == "Car" and [float(x) for x in line[4:8]] == [x1 - 0.5, y1 - 0.5, x2 - 0.5, y2 - 0.5]
        h, w, l, x, y, z, ry = map(float, line[8:15])
        calib = (out / "kitti" / "front" / "calib" / f"{i:06d}.txt").read_text().splitlines()
        P2 = np.array([float(t) for t in calib[2].split()[1:]]).reshape(3, 4)
        c = np.array([[sx * l / 2, -h * k, sz * w / 2] for sx in (-1, 1) for sz in (-1, 1) for k in (0, 1)])
        R = np.array([[np.cos(ry), 0, np.sin(ry)], [0, 1, 0], [-np.sin(ry), 0, np.cos(ry)]])
        pts = c @ R.T + (x, y, z)
        uvw = np.c_[pts, np.ones(8)] @ P2.T
        pu, pv = uvw[:, 0] / uvw[:, 2], uvw[:, 1] / uvw[:, 2]
        m = 2  # pixels: the screen-space filter and the surfels' overhang widen edges in this tiny image
        inside = (u >= pu.min() - m) & (u <= pu.max() + m) & (v >= pv.min() - m) & (v <= pv.max() + m)
        assert inside.mean() > 0.99
        assert (pu.max() - pu.min()) < 1.3 * (x2 - x1) + 2 * m  # and it is not a loose box either


def test_scenario_cli(edit_street, tmp_path, capsys):
    from gsim.cli import main
    root, _ = edit_street
    p = write(tmp_path, json.dumps(scenario_dict(root, output=str(tmp_path / "o"))))
    assert main(["scenario", "validate", str(p), "--check"]) == 0
    assert "valid scenario 't'" in capsys.readouterr().out
    assert main(["scenario", "apply", str(p)]) == 0
    assert [a.id for a in gsim.load_scene(tmp_path / "o" / "scene").actors] == ["ahead"]
    bad = write(tmp_path, json.dumps(scenario_dict(root, edits=[{"kind": "remove", "actor": "ghost"}])))
    assert main(["scenario", "render", str(bad)]) == 2
    assert "no actor 'ghost'" in capsys.readouterr().err
