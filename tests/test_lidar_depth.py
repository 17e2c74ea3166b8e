"""gsim.scenes.reconstruction.lidar_depth and the reference paste built on it: depth for any camera from the log's LiDAR, real
pixels pasted where references agree."""
import json

import numpy as np
import pytest

import gsim
from gsim.diffusion.references import ReferencePaste, agreement, training_lidar
from gsim.errors import InputError
from gsim.scenes.evaluation.lane_shift import street_of
from gsim.scenes.reconstruction.lidar_depth import LidarDepth
from gsim.scenes.log import LogWriter, load_log
from gsim.scenes.evaluation.render_path import offset_pose
from gsim.scenes.synth import SynthOptions, render_camera, synthesize
from gsim.scenes.reconstruction.views import split_frames
from support import plane


@pytest.fixture(scope="module")
def street(tmp_path_factory):
    """A 1.6 s synthetic street (moving cars with tracks) at 96x60 with a 32-beam LiDAR."""
    root = tmp_path_factory.mktemp("lidar_depth")
    opts = SynthOptions(n_frames=16, width=96, height=60, supersample=1, lidar_azimuth_resolution_deg=1.0)
    synthesize(root / "log", seed=3, options=opts, progress=False)
    return load_log(root / "log")


def test_depth_of_held_out_and_shifted_views_is_the_streets_exact_depth(street):
    """The training frames' LiDAR, projected into views it never came from (held-out frames, and those shifted
    2 m sideways), gives the street's exact depth within 5% on most pixels that have one."""
    lidar, st = LidarDepth(street), street_of(street)[0]
    agree, covered = [], []
    for f in split_frames(street, 8)[1]:
        for sensor, obs in f.cameras.items():
            camera = street.cameras[sensor].camera
            for left in (0.0, 2.0):
                T = offset_pose(street, sensor, obs.timestamp_us, 0.0, left)
                depth = lidar(camera, T, obs.timestamp_us)
                _, exact = render_camera(st, camera, T, obs.timestamp_us, 1)
                both = (depth > 0) & (exact > 0)
                covered.append(both.sum() / (exact > 0).sum())
                agree.append(np.mean(np.abs(depth[both] / exact[both] - 1) < 0.05))
    assert np.median(agree) > 0.85 and min(agree) > 0.7, agree
    assert np.median(covered) > 0.7, covered


def test_tracked_actors_are_placed_at_the_asked_time(street):
    """Where the depth at a view's own time and at another time differ (the cars moved), the own time's is the
    street's exact depth far more often: each actor's points follow its track."""
    lidar, st = LidarDepth(street), street_of(street)[0]
    last = int(street.frames[-1].timestamp_us)
    right = wrong = differ = 0
    for f in split_frames(street, 8)[1]:
        for sensor, obs in f.cameras.items():
            camera = street.cameras[sensor].camera
            T = street.T_world_camera(obs)
            own, other = lidar(camera, T, obs.timestamp_us), lidar(camera, T, last if f.index < 8 else 0)
            exact = render_camera(st, camera, T, obs.timestamp_us, 1)[1]
            moved = (own > 0) & (other > 0) & (exact > 0) & (np.abs(own / np.maximum(other, 1e-6) - 1) > 0.05)
            differ += moved.sum()
            right += (np.abs(own[moved] / exact[moved] - 1) < 0.05).sum()
            wrong += (np.abs(other[moved] / exact[moved] - 1) < 0.05).sum()
    assert differ > 50, "the street's cars should move through the held-out views"
    # (at 96x60 many of those pixels are a car's edge, interpolated between it and what is behind it)
    assert right > 0.3 * differ and right > 5 * wrong, (right, wrong, differ)


def test_bad_input_is_named(street, tmp_path):
    with LogWriter(tmp_path / "nolidar", "n", "test") as w:
        w.add_camera("front", gsim.PinholeCamera(8, 8, 8.0, 8.0, 4.0, 4.0), np.eye(4))
        w.add_ego_pose(0, np.eye(4))
        w.add_frame(0, {"front": w.image("front", 0, 0, np.zeros((8, 8, 3)))}, {})
    with pytest.raises(InputError, match="nolidar.*no LiDAR"):
        LidarDepth(load_log(tmp_path / "nolidar"), holdout_every=0)
    with pytest.raises(InputError, match="voxel_m"):
        LidarDepth(street, voxel_m=0)
    lidar = LidarDepth(street)
    with pytest.raises(InputError, match="camera"):
        lidar("front", np.eye(4), 0)
    with pytest.raises(InputError, match="T_world_camera"):
        lidar(street.cameras["front"].camera, np.zeros((4, 4)), 0)


def test_agreement_keeps_pixels_where_two_references_agree():
    a = np.full((2, 3, 3), 0.5, np.float32)
    b = a.copy()
    b[0, 1] = 0.9  # disagrees there
    va, vb = np.ones((2, 3), bool), np.ones((2, 3), bool)
    vb[1, 2] = False  # only one valid there
    colour, agreed = agreement([(a, va), (b + 0.01, vb)], tolerance=0.03)
    assert agreed.tolist() == [[True, False, True], [True, True, False]]
    assert np.allclose(colour[agreed], 0.505) and np.all(colour[~agreed] == 0)
    with pytest.raises(InputError, match="tolerance"):
        agreement([(a, va)], tolerance=-1)
    with pytest.raises(InputError, match="none"):
        agreement([])


def test_the_paste_puts_the_logs_real_pixels_where_a_wrong_scene_renders(street):
    """A scene that knows nothing of the street (a grey plane): repaired, a view 1 m beside a held-out frame takes the
    street's real images where the references agree, and those pixels are the street's own image there."""
    from gsim.images import render_image
    scene = gsim.Scene(background=plane(extent=60.0, spacing=0.5))
    st = street_of(street)[0]
    paste = ReferencePaste()
    f = split_frames(street, 8)[1][1]
    obs = f.cameras["front"]
    camera = street.cameras["front"].camera
    T = offset_pose(street, "front", obs.timestamp_us, 0.0, 1.0)
    rgb, alpha, depth = render_image(scene, camera, T, obs.timestamp_us, "front")
    out = paste.repair_view(scene, street, camera, T, obs.timestamp_us, rgb, alpha, depth, sensor="front")
    truth = render_camera(st, camera, T, obs.timestamp_us, 1)[0] / 255.0
    pasted = np.abs(out - rgb).mean(-1) > 1e-6
    assert pasted.mean() > 0.1  # (not where the plane is the road: there its depth is the LiDAR's)
    assert np.abs(out - truth)[pasted].mean() < 0.5 * np.abs(rgb - truth)[pasted].mean()
    assert np.median(np.abs(out - truth)[pasted].mean(-1)) < 0.05
    assert np.array_equal(out, paste.repair_view(scene, street, camera, T, obs.timestamp_us, rgb, alpha, depth,
                                                 sensor="front", seed=5))  # nothing drawn: the same every time
    with pytest.raises(InputError, match="log"):
        paste.repair_view(scene, None, camera, T, obs.timestamp_us, rgb, alpha, depth)
    with pytest.raises(InputError, match="view of a log"):
        paste.repair_image(rgb, alpha, depth)


def test_eval_measures_the_paste(street, tmp_path):
    from gsim.cli import main
    scene = gsim.Scene(background=plane(extent=60.0, spacing=0.5))
    scene.save(tmp_path / "scene")
    assert main(["eval", str(tmp_path / "scene"), str(street.root), "--out", str(tmp_path / "e"), "--shifts", "1",
                 "--paste-references"]) == 0
    m = json.loads((tmp_path / "e" / "metrics.json").read_text())
    shifted = m["lane_shift"][0]
    assert shifted["repaired_psnr"] > shifted["psnr"] + 1.0
    assert main(["eval", str(tmp_path / "scene"), str(street.root), "--out", str(tmp_path / "e2"),
                 "--paste-references", "--repair", str(tmp_path)]) == 2
    # ahead of what a reconstruction saw: the last frames, with no reference taken from them
    assert main(["eval", str(tmp_path / "scene"), str(street.root), "--out", str(tmp_path / "e3"), "--frames", "12:",
                 "--paste-references"]) == 0
    m = json.loads((tmp_path / "e3" / "metrics.json").read_text())
    assert m["held_out_frames"] == [12, 13, 14, 15] and m["frames"] == [12, None]
    assert m["repaired_psnr"] > m["psnr"]
    assert main(["eval", str(tmp_path / "scene"), str(street.root), "--out", str(tmp_path / "e4"), "--frames",
                 "40:50"]) == 2
    for bad in ("12", "5:3", "-1:4", "a:b"):
        with pytest.raises(SystemExit, match="2"):  # argparse's one-line error names the option
            main(["eval", str(tmp_path / "scene"), str(street.root), "--out", str(tmp_path / "e5"), "--frames", bad])
    assert main(["reconstruct", str(street.root), str(tmp_path / "r"), "--train-span", "0,0.5", "--iterations",
                 "2"]) == 0
    assert json.loads((tmp_path / "r" / "train.json").read_text())["config"]["train_span"] == [0.0, 0.5]
    for bad in ("0.75", "0.5,0.2", "0,1.5", "x,y"):
        with pytest.raises(SystemExit, match="2"):
            main(["reconstruct", str(street.root), str(tmp_path / "r"), "--train-span", bad])


def test_excluded_frames_give_no_reference_and_no_lidar(street):
    from gsim.images import render_image
    scene = gsim.Scene(background=plane(extent=60.0, spacing=0.5))
    paste = ReferencePaste()
    train = [f.index for f in split_frames(street, 8)[0]]
    assert len(training_lidar(street, 8, train[:8]).static) < len(training_lidar(street).static)
    obs = street.frames[3].cameras["front"]
    camera, T = street.cameras["front"].camera, street.T_world_camera(obs)
    rgb, alpha, depth = render_image(scene, camera, T, obs.timestamp_us, "front")
    with pytest.raises(InputError, match="no training views"):
        paste.repair_view(scene, street, camera, T, obs.timestamp_us, rgb, alpha, depth, exclude=train)
