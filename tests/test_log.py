"""scenes/log.py: the canonical driving log, its validator and its atomic writer, on small hand-made logs."""
import json
from pathlib import Path

import numpy as np
import pytest

from gsim.cameras import OpenCVCamera
from gsim.scenes.log import ActorTrack, LidarBeams, LogFormatError, LogWriter, load_log, validate_log
from gsim.transforms import look_at

CAM = OpenCVCamera(width=8, height=6, fx=7.0, fy=7.5, cx=4.1, cy=2.9, k1=-0.1, p2=0.01)
BEAMS = LidarBeams((2.0, 0.0, -2.0), 0.5, 0.5, 80.0)
T_VC = look_at([1.5, 0.0, 1.6], [11.5, 0.0, 1.6])  # camera at the windscreen, looking forward (+x)


def ego(k):
    T = np.eye(4)
    c, s = np.cos(0.1 * k), np.sin(0.1 * k)
    T[:3, :3] = [[c, -s, 0], [s, c, 0], [0, 0, 1]]
    T[:3, 3] = [2.0 * k, 0.3 * k, 0.0]
    return T


def write_log(path, n=3):
    rng = np.random.default_rng(0)
    with LogWriter(path, name="tiny", source="test") as w:
        w.add_camera("front", CAM, T_VC)
        w.add_lidar("top", np.eye(4), BEAMS)
        for k in range(n):
            t = 100_000 * k
            w.add_ego_pose(t, ego(k))
            rgb = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
            pts = rng.normal(size=(50, 4)).astype(np.float32)
            w.add_frame(t, cameras={"front": w.image("front", k, t + 10, rgb=rgb, depth=np.full((6, 8), 5.0))},
                        lidars={"top": w.sweep("top", k, t, pts)})
        w.add_actor(ActorTrack("car-1", "car", (4.5, 1.9, 1.5), np.array([0, 200_000]), np.stack([ego(1), ego(2)])))
        w.notes.append("hand-made")
    return path


@pytest.fixture
def log_dir(tmp_path):
    return write_log(tmp_path / "log")


def edit_manifest(log_dir, fn):
    m = json.loads((log_dir / "log.json").read_text())
    fn(m)
    (log_dir / "log.json").write_text(json.dumps(m))


def expect_error(log_dir, *fragments):
    with pytest.raises(LogFormatError) as e:
        validate_log(log_dir)
    for f in fragments:
        assert f in str(e.value), str(e.value)
    return str(e.value)


def test_valid_log_round_trips(log_dir):
    log = validate_log(log_dir)
    assert (log.name, log.source, log.notes) == ("tiny", "test", ("hand-made",))
    assert log.cameras["front"].camera == CAM and np.allclose(log.cameras["front"].T_vehicle_camera, T_VC)
    assert log.lidars["top"].beams == BEAMS
    assert [f.timestamp_us for f in log.frames] == [0, 100_000, 200_000]
    assert np.allclose(log.ego_poses[2], ego(2)) and np.allclose(log.T_world_vehicle(200_000), ego(2))
    obs = log.frames[1].cameras["front"]
    assert obs.timestamp_us == 100_010 and log.image(obs).shape == (6, 8, 3)
    assert np.all(log.depth(obs) == 5.0)
    rng = np.random.default_rng(0)
    rgb0 = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    pts0 = rng.normal(size=(50, 4)).astype(np.float32)
    assert np.array_equal(log.image(log.frames[0].cameras["front"]), rgb0 / np.float32(255))
    assert np.array_equal(log.sweep(log.frames[0].lidars["top"]), pts0)
    (a,) = log.actors
    assert (a.id, a.category, a.size) == ("car-1", "car", (4.5, 1.9, 1.5))
    assert np.allclose(a.pose_at(0), ego(1)) and np.allclose(a.pose_at(300_000), ego(2))
    # a sensor pose is the ego pose at the sensor's time composed with its extrinsic
    assert np.allclose(log.T_world_camera(obs), log.T_world_vehicle(100_010) @ T_VC)


def test_missing_image(log_dir):
    (log_dir / "cameras/front/000001.png").unlink()
    expect_error(log_dir, "cameras/front/000001.png", "missing")


def test_truncated_lidar_sweep(log_dir):
    p = log_dir / "lidars/top/000002.npy"
    p.write_bytes(p.read_bytes()[:-40])
    expect_error(log_dir, "lidars/top/000002.npy", "not a readable .npy")


def test_sweep_of_wrong_shape(log_dir):
    np.save(log_dir / "lidars/top/000000.npy", np.zeros((5, 3), np.float32))
    expect_error(log_dir, "lidars/top/000000.npy", "(N,4)")


def test_image_of_wrong_size(log_dir):
    from PIL import Image
    Image.new("RGB", (9, 6)).save(log_dir / "cameras/front/000000.png")
    expect_error(log_dir, "cameras/front/000000.png", "9x6", "8x6")


def test_non_rigid_pose(log_dir):
    edit_manifest(log_dir, lambda m: m["ego_poses"][1].update(T_world_vehicle=(2 * ego(1)).tolist()))
    expect_error(log_dir, "log.json", "ego_poses[1].T_world_vehicle", "not a rigid transform")


def test_non_finite_pose(log_dir):
    def fn(m):
        m["sensors"]["cameras"]["front"]["T_vehicle_camera"][0][3] = float("nan")
    edit_manifest(log_dir, fn)  # json writes NaN, which Python's json reads back
    expect_error(log_dir, "log.json", "sensors.cameras.front.T_vehicle_camera", "NaN")


def test_timestamps_out_of_order(log_dir):
    edit_manifest(log_dir, lambda m: m["frames"][2].update(timestamp_us=50_000))
    expect_error(log_dir, "frames[2].timestamp_us", "out of order")
    write_log(log_dir)
    edit_manifest(log_dir, lambda m: m["ego_poses"][1].update(timestamp_us=0))
    expect_error(log_dir, "ego_poses[1].timestamp_us", "out of order")


def test_non_integer_timestamp(log_dir):
    edit_manifest(log_dir, lambda m: m["frames"][0]["lidars"]["top"].update(timestamp_us=0.5))
    expect_error(log_dir, "frames[0].lidars.top.timestamp_us", "integer")


def test_unknown_sensor_in_frame(log_dir):
    def fn(m):
        m["frames"][1]["cameras"]["rear"] = m["frames"][1]["cameras"]["front"]
    edit_manifest(log_dir, fn)
    expect_error(log_dir, "frames[1].cameras.rear", "unknown camera")


@pytest.mark.parametrize("bad", ["../outside.png", "/etc/passwd", "cameras/../../x.png", ""])
def test_path_escaping_the_log(log_dir, bad):
    edit_manifest(log_dir, lambda m: m["frames"][0]["cameras"]["front"].update(image=bad))
    expect_error(log_dir, "frames[0].cameras.front.image", "relative path inside the log")


def test_bad_actor_and_missing_fields(log_dir):
    edit_manifest(log_dir, lambda m: m["actors"][0].update(size=[4.5, 0, 1.5]))
    expect_error(log_dir, "actors[0].size")
    write_log(log_dir)
    edit_manifest(log_dir, lambda m: m["actors"][0].update(id="../car"))
    expect_error(log_dir, "actors[0].id")
    write_log(log_dir)
    edit_manifest(log_dir, lambda m: m.pop("ego_poses"))
    expect_error(log_dir, "ego_poses", "missing")
    write_log(log_dir)
    edit_manifest(log_dir, lambda m: m.update(schema_version=99))
    expect_error(log_dir, "schema_version")
    with pytest.raises(LogFormatError, match="not a gsim log"):
        load_log(log_dir / "cameras")


def leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_writer_leaves_nothing_behind_on_failure(tmp_path):
    with pytest.raises(RuntimeError):
        with LogWriter(tmp_path / "a", name="a", source="test") as w:
            w.add_camera("front", CAM, T_VC)
            w.image("front", 0, 0, rgb=np.zeros((6, 8, 3), np.uint8))
            raise RuntimeError("converter failed half way")
    assert not (tmp_path / "a").exists() and leftovers(tmp_path) == []

    # a log the validator rejects at close (image size differs from the camera model) is not written either
    with pytest.raises(LogFormatError, match="camera model says 8x6"):
        with LogWriter(tmp_path / "b", name="b", source="test") as w:
            w.add_camera("front", CAM, T_VC)
            w.add_ego_pose(0, np.eye(4))
            w.add_frame(0, cameras={"front": w.image("front", 0, 0, rgb=np.zeros((5, 8, 3), np.uint8))}, lidars={})
    assert not (tmp_path / "b").exists() and leftovers(tmp_path) == []


def test_writer_replaces_only_logs_and_keeps_the_old_one_on_failure(tmp_path):
    old = write_log(tmp_path / "log", n=2)
    with pytest.raises(RuntimeError):
        with LogWriter(old, name="new", source="test"):
            raise RuntimeError("boom")
    assert len(validate_log(old).frames) == 2 and leftovers(tmp_path) == []
    write_log(old, n=3)  # a successful write replaces the previous log
    assert len(validate_log(old).frames) == 3 and leftovers(tmp_path) == []
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        write_log(tmp_path / "notes")
    assert (tmp_path / "notes" / "mine.txt").read_text() == "keep me"


def test_writer_rejects_bad_poses_when_adding(tmp_path):
    with pytest.raises(RuntimeError):
        with LogWriter(tmp_path / "c", name="c", source="test") as w:
            with pytest.raises(ValueError, match="ego pose at 7 us"):
                w.add_ego_pose(7, np.diag([1.0, 1.0, 2.0, 1.0]))
            raise RuntimeError("stop")
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("kind", ["cameras", "lidars"])
@pytest.mark.parametrize("bad", ["../x", "/abs", "a/b", "", "n" * 300, "naïve"])
def test_sensor_names_that_would_be_paths_are_refused(log_dir, kind, bad):
    """A sensor's name becomes folder and file names (evaluation views, movers, pseudo views, exports)."""
    def rename(m):
        sensors = m["sensors"][kind]
        sensors[bad] = sensors.pop(next(iter(sensors)))
    edit_manifest(log_dir, rename)
    expect_error(log_dir, f"sensors.{kind}.", "not a valid name")
    with pytest.raises(ValueError, match="not a valid name"):
        with LogWriter(log_dir.parent / "w", name="w", source="test") as w:
            (w.add_camera(bad, CAM, T_VC) if kind == "cameras" else w.add_lidar(bad, np.eye(4), BEAMS))
    assert not (log_dir.parent / "w").exists()


@pytest.mark.parametrize("field", ["azimuth_resolution_deg", "min_range_m", "max_range_m"])
def test_non_finite_beam_numbers_are_refused(log_dir, field):
    edit_manifest(log_dir, lambda m: m["sensors"]["lidars"]["top"]["beams"].update({field: float("inf")}))
    expect_error(log_dir, "sensors.lidars.top.beams", "finite")


def test_a_non_finite_actor_size_is_refused(log_dir):
    edit_manifest(log_dir, lambda m: m["actors"][0].update(size=[4.5, float("inf"), 1.5]))
    expect_error(log_dir, "actors[0].size")


def test_schema_2_fields_round_trip_and_version_1_logs_still_load(tmp_path):
    rng = np.random.default_rng(1)
    first, second = rng.normal(size=(40, 5)).astype(np.float32), rng.normal(size=(7, 5)).astype(np.float32)
    with LogWriter(tmp_path / "log", name="v2", source="test") as w:
        w.add_camera("front", CAM, T_VC, readout_us=24_000)
        w.add_lidar("top", np.eye(4), BEAMS)
        w.add_ego_pose(0, ego(0))
        w.add_frame(0, cameras={"front": w.image("front", 0, 0, rgb=np.zeros((6, 8, 3), np.uint8))},
                    lidars={"top": w.sweep("top", 0, 0, first, second_returns=second)})
        w.add_actor(ActorTrack("a", "car", (4, 2, 1.5), np.array([0]), ego(0)[None],
                               {"class": "TYPE_VEHICLE", "source_id": "-x/y", "speed": 3.5}))
    log = validate_log(tmp_path / "log")
    assert log.cameras["front"].readout_us == 24_000
    obs = log.frames[0].lidars["top"]
    assert np.array_equal(log.sweep(obs), first) and np.array_equal(log.second_returns(obs), second)
    assert log.actors[0].metadata == {"class": "TYPE_VEHICLE", "source_id": "-x/y", "speed": 3.5}
    # a version 1 log (no new fields) loads with their defaults
    old = write_log(tmp_path / "old")
    edit_manifest(old, lambda m: m.update(schema_version=1))
    log = validate_log(old)
    assert log.cameras["front"].readout_us == 0 and log.actors[0].metadata == {}
    assert log.second_returns(log.frames[0].lidars["top"]) is None


@pytest.mark.parametrize("field, value, fragment", [
    ("readout", -1, "sensors.cameras.front.readout_us"), ("readout", 1.5, "sensors.cameras.front.readout_us"),
    ("metadata", {"k": [1]}, "actors[0].metadata"), ("metadata", "x", "actors[0].metadata"),
    ("second", "../x.npy", "frames[0].lidars.top.second_returns"), ("second", "lidars/top/none.npy", "none.npy")])
def test_bad_schema_2_fields_are_named(log_dir, field, value, fragment):
    def edit(m):
        if field == "readout":
            m["sensors"]["cameras"]["front"]["readout_us"] = value
        elif field == "metadata":
            m["actors"][0]["metadata"] = value
        else:
            m["frames"][0]["lidars"]["top"]["second_returns"] = value
    edit_manifest(log_dir, edit)
    expect_error(log_dir, fragment)


def test_dataset_ids_become_stable_actor_ids_and_boxes_become_tracks():
    from gsim.scenes.formats.convert_util import TrackBuilder, actor_id
    assert actor_id("car_12") == "car_12"
    a, b = actor_id("-Kz8/Vc"), actor_id("_Kz8_Vc")
    assert a != b and a == actor_id("-Kz8/Vc") and a.startswith("Kz8_Vc_") and b == "_Kz8_Vc"
    tb = TrackBuilder({"Car": "car"})
    for t, length in ((200, 4.2), (0, 4.0), (100, 4.1)):
        tb.add("-id", "Car", t, ego(t // 100), (length, 1.8, 1.5), "labels.txt: line 1", occluded=0)
    tb.add("7", "Tram", 0, ego(0), (12, 2.5, 3), "labels.txt: line 4")
    tracks = {tr.metadata.get("source_id", tr.id): tr for tr in tb.tracks()}
    car, tram = tracks["-id"], tracks["7"]
    assert list(car.timestamps_us) == [0, 100, 200] and car.size == (4.1, 1.8, 1.5) and car.category == "car"
    assert np.array_equal(car.poses[2], ego(2)) and car.metadata == {"class": "Car", "source_id": "-id", "occluded": 0}
    assert tram.category == "other" and tram.id == "7" and tram.metadata == {"class": "Tram"}
    with pytest.raises(LogFormatError, match="labels.txt: line 9: object 7 has two boxes at 0 us"):
        tb.add("7", "Tram", 0, ego(0), (12, 2.5, 3), "labels.txt: line 9")
    with pytest.raises(LogFormatError, match="line 5: box size"):
        tb.add("8", "Car", 0, ego(0), (0, 2, 1), "labels.txt: line 5")


def test_scene_and_log_dirs_of_a_scene_a_reconstruction_and_a_demo(tmp_path):
    from gsim.errors import InputError
    from gsim.scenes.log import scene_and_log_dirs
    recon = tmp_path / "recon"
    (recon / "scene").mkdir(parents=True)
    (recon / "scene" / "scene.json").write_text("{}")
    assert scene_and_log_dirs(recon / "scene") == (recon / "scene", recon / "log")  # no record: a log beside it
    (recon / "train.json").write_text(json.dumps({"log": "/data/mylog"}))
    assert scene_and_log_dirs(recon / "scene") == (recon / "scene", Path("/data/mylog"))
    assert scene_and_log_dirs(recon) == (recon / "scene", Path("/data/mylog"))  # gsim reconstruct LOG OUT's OUT
    demo = tmp_path / "demo"
    (demo / "recon" / "scene").mkdir(parents=True)
    (demo / "recon" / "scene" / "scene.json").write_text("{}")
    assert scene_and_log_dirs(demo) == (demo / "recon" / "scene", demo / "log")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no scene.json"):
        scene_and_log_dirs(tmp_path / "empty")
