"""Lane-shift ground truth: the synthetic street re-created from its log renders the logged images exactly,
shifted poses differ, `evaluate(..., shifts=, ahead=)` reports both sides and the extension, and a log
without ground truth off the driven path is a clear error."""
import dataclasses
import json

import numpy as np
import pytest

import gsim
from gsim.scenes.evaluation.evaluate import evaluate
from gsim.scenes.evaluation.lane_shift import street_of, truth
from gsim.scenes.evaluation.render_path import offset_pose
from gsim.scenes.log import load_log
from gsim.scenes.synth import SynthOptions, synthesize

SMALL = SynthOptions(n_frames=17, width=48, height=32, supersample=1, lidar_beams=8, lidar_azimuth_resolution_deg=2.0)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("shift") / "log", seed=3, options=SMALL, progress=False)


def test_the_recreated_street_renders_the_logged_images_and_shifted_views_differ(log_dir):
    log = load_log(log_dir)
    street, options = street_of(log)
    assert options == SMALL
    for f in (log.frames[0], log.frames[8]):
        obs = f.cameras["front"]
        T = offset_pose(log, "front", f.timestamp_us)
        assert np.allclose(T, log.T_world_camera(obs))
        assert np.array_equal(truth(street, options, log, "front", T, f.timestamp_us), log.image(obs))
        left = truth(street, options, log, "front", offset_pose(log, "front", f.timestamp_us, left_m=2.0), f.timestamp_us)
        assert np.abs(left - log.image(obs)).mean() > 0.02
    half = truth(street, options, log, "front", T, f.timestamp_us, downscale=2)
    assert half.shape == (16, 24, 3) and np.allclose(half, gsim.cameras.downscale_image(log.image(obs), 2))


def test_evaluate_reports_both_sides_of_each_shift_and_the_path_ahead(log_dir, tmp_path):
    from gsim.street import street_surfels
    gsim.Scene(background=street_surfels(3000)).save(tmp_path / "scene")
    m = evaluate(tmp_path / "scene", log_dir, tmp_path / "eval", progress=False, shifts=(1.0, 2.0), ahead=(5.0,))
    assert len(m["views"]) == 9  # held-out frames 0, 8 and 16, three cameras
    views = 3  # frame 8's: 0 and 16 lie outside the training frames' span (the scene's edges)
    assert m["edge_frames"] == [0, 16]
    assert [r["shift_m"] for r in m["lane_shift"]] == [1.0, 2.0]
    assert all(r["views"] + r["views_left_out"] == 2 * views for r in m["lane_shift"])
    assert m["unshifted"]["views"] + m["unshifted"]["views_left_out"] == views
    assert m["ahead"][0]["ahead_m"] == 5.0 and m["ahead"][0]["views"] + m["ahead"][0]["views_left_out"] == 3
    for r in m["lane_shift"] + m["ahead"]:
        assert np.isfinite(r["psnr"]) and 0 <= r["low_alpha_fraction"] <= 1 and -1 <= r["ssim"] <= 1
    saved = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert saved["lane_shift"] == m["lane_shift"]
    assert len(list((tmp_path / "eval" / "offsets").glob("lane_shift_*.png"))) == 2 * 2 * views


def test_a_log_without_ground_truth_off_the_path_is_refused_before_any_work(log_dir, tmp_path):
    real = dataclasses.replace(load_log(log_dir), source="gsim.scenes.formats.kitti_raw")
    with pytest.raises(ValueError, match="no ground truth off the driven path"):
        street_of(real)
    gsim.Scene(background=gsim.street.street_surfels(100)).save(tmp_path / "scene")
    with pytest.raises(ValueError, match="distances"):
        evaluate(tmp_path / "scene", log_dir, tmp_path / "eval", progress=False, shifts=(-1.0,))
    assert not (tmp_path / "eval").exists()


def test_gsim_truth_renders_a_shifted_trajectory(log_dir, tmp_path):
    from gsim.cli import main
    assert main(["trajectory", str(log_dir), str(tmp_path / "t.json"), "--shift-m", "2"]) == 0
    assert main(["truth", str(log_dir), "--trajectory", str(tmp_path / "t.json"), "--out", str(tmp_path / "gt")]) == 0
    log = load_log(log_dir)
    street, options = street_of(log)
    f = log.frames[4]
    want = truth(street, options, log, "front", offset_pose(log, "front", f.timestamp_us, left_m=2.0), f.timestamp_us)
    from PIL import Image
    got = np.asarray(Image.open(tmp_path / "gt" / "rgb" / "000004.png"), np.float32) / 255
    assert np.array_equal(got, want) and len(list((tmp_path / "gt" / "depth").glob("*.png"))) == SMALL.n_frames
    assert main(["truth", str(log_dir), "--trajectory", str(tmp_path / "missing.json"), "--out", str(tmp_path / "x")]) == 2


def test_the_lidar_off_the_path_is_measured_against_the_exact_sweep(log_dir, tmp_path):
    from gsim.street import street_surfels
    from gsim.scenes.evaluation.lane_shift import shifted_sweeps
    log = load_log(log_dir)
    street, _ = street_of(log)
    gsim.Scene(background=street_surfels(3000)).save(tmp_path / "scene")
    scene = gsim.load_scene(tmp_path / "scene")
    held = [log.frames[0], log.frames[8]]
    at = shifted_sweeps(scene, log, street, held, 0.0)
    assert at["sweeps"] + at["sweeps_left_out"] == 2 and 0 <= at["ray_drop_accuracy"] <= 1
    # unshifted, the street's exact sweep is the log's own: the scene's errors against it are evaluate's
    from gsim.scenes.reconstruction.lidar_rays import sweep_rays, points_rays
    from gsim.scenes import synth
    obs = log.frames[0].lidars["top"]
    exact = synth.lidar_sweep(street, log.lidars["top"].T_vehicle_lidar, log.lidars["top"].beams, obs.timestamp_us)
    a, b = sweep_rays(log, obs), points_rays(exact, "top", obs.timestamp_us, log.lidars["top"])
    assert np.allclose(a.range, b.range, atol=1e-4) and np.array_equal(a.times_us, b.times_us)
    m = evaluate(tmp_path / "scene", log_dir, tmp_path / "eval", progress=False, shifts=(2.0,))
    lid = m["lane_shift"][0]["lidar"]
    assert lid["sweeps"] + lid["sweeps_left_out"] == 2 and np.isfinite(lid["chamfer_m"])  # frame 8, both sides
    assert "LiDAR range median" in (tmp_path / "eval" / "metrics.md").read_text()
