"""LiDAR head (intensity, ray drop), feature compositing, sweeps as rays, and the LiDAR metrics."""
import numpy as np
import pytest

import gsim
from gsim.lidar import LidarSpec
from gsim.lidar.heads import FEATURES, HIDDEN, INPUTS, LidarHead
from gsim.lidar.metrics import chamfer, nearest_distances, ray_metrics
from gsim.lidar.render import render_lidar

VLP16 = LidarSpec.preset("velodyne-vlp16")


def random_surfels(n, seed, features=True):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, 4))
    return gsim.Surfels(np.c_[rng.uniform(-15, 15, (n, 2)), rng.uniform(-2, 2, n)],
                        q / np.linalg.norm(q, axis=1, keepdims=True), rng.uniform(0.3, 1.5, (n, 2)),
                        rng.uniform(0.3, 0.99, n), rng.uniform(0, 1, (n, 3)),
                        rng.normal(size=(n, FEATURES)).astype(np.float32) if features else None)


def random_head(seed, drop_bias=-3.0):
    rng = np.random.default_rng(seed)
    return LidarHead(rng.normal(0, 0.5, (INPUTS, HIDDEN)), rng.normal(0, 0.1, HIDDEN), rng.normal(0, 0.5, (HIDDEN, 2)),
                     np.array([0.0, drop_bias]))


def test_numba_and_torch_agree_on_intensity_and_drop():
    s, head = random_surfels(400, 0), random_head(1)
    a, b = (render_lidar(s, VLP16, np.eye(4), backend=k, head=head) for k in ("numba", "torch"))
    both = (a.range_image > 0) & (b.range_image > 0)
    assert both.sum() > 1000 and np.mean((a.range_image > 0) != (b.range_image > 0)) < 0.005
    ia, ib = np.zeros(a.range_image.shape), np.zeros(b.range_image.shape)
    ia[a.ring, a.column], ib[b.ring, b.column] = a.intensity, b.intensity
    assert np.mean(np.abs(ia[both] - ib[both]) > 1e-3) < 0.005
    assert np.mean(np.abs(a.drop_probability_image - b.drop_probability_image) > 1e-3) < 0.005
    assert np.all((a.intensity >= 0) & (a.intensity <= 1)) and a.intensity.std() > 0.01


def test_the_head_decides_ray_drop():
    s = random_surfels(400, 0)
    plain = render_lidar(s, VLP16, np.eye(4))  # no head: geometry alone
    keep = render_lidar(s, VLP16, np.eye(4), head=random_head(1, drop_bias=-20.0))
    drop = render_lidar(s, VLP16, np.eye(4), head=random_head(1, drop_bias=+20.0))
    assert plain.intensity is None and plain.drop_probability_image is None
    assert np.array_equal(keep.range_image, plain.range_image) and len(drop.points) == 0
    assert np.all(drop.drop_probability_image > 0.5)
    with pytest.raises(ValueError, match="features"):
        render_lidar(random_surfels(50, 2, features=False), VLP16, np.eye(4), head=random_head(1))


def test_head_files_round_trip_and_refuse_bad_input(tmp_path):
    head = random_head(3)
    scene = gsim.Scene(background=random_surfels(50, 4), lidar_head=head)
    scene.save(tmp_path / "scene")
    back = gsim.load_scene(tmp_path / "scene")
    assert np.array_equal(back.lidar_head.w1, head.w1) and np.array_equal(back.background.features,
                                                                          scene.background.features)
    d = head.to_dict()
    with pytest.raises(ValueError, match="schema_version"):
        LidarHead.from_dict({**d, "schema_version": 9})
    with pytest.raises(ValueError, match="w1"):
        LidarHead.from_dict({**d, "w1": [[1.0]]})
    (tmp_path / "scene" / "lidar_head.json").write_text("{not json")
    with pytest.raises(ValueError, match="lidar_head.json"):
        gsim.load_scene(tmp_path / "scene")


def test_nearest_distances_are_exact():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-20, 20, (500, 3)), rng.uniform(-20, 20, (300, 3))
    brute = np.sqrt(((a[:, None] - b[None]) ** 2).sum(-1)).min(1)
    assert np.allclose(nearest_distances(a, b), brute)
    assert chamfer(a, a) == 0 and np.isclose(chamfer(a, b), brute.mean() + np.sqrt(((b[:, None] - a[None]) ** 2)
                                                                                 .sum(-1)).min(1).mean())


def test_ray_metrics_on_a_known_case():
    dirs = np.tile([1.0, 0, 0], (4, 1))
    m = ray_metrics(np.array([10.0, 0.0, 5.0, 7.0]), np.array([10.5, 3.0, 0.0, 7.0]), dirs,
                    np.array([0.2, 0, 0, 0.4]), np.array([0.5, 0, 0, 0.4]))
    assert m["both_return"] == 2 and m["range_median_abs_m"] == 0.25 and m["range_mean_abs_m"] == 0.25
    assert m["ray_drop_accuracy"] == 0.5 and np.isclose(m["intensity_rmse"], np.sqrt(0.09 / 2))


def test_sweep_rays_put_points_on_the_beam_grid_and_label_drops(tmp_path):
    from gsim.scenes.reconstruction.lidar_rays import sweep_rays
    from gsim.scenes.log import load_log
    from gsim.scenes.synth import SynthOptions, synthesize
    opts = SynthOptions(n_frames=2, width=32, height=20, supersample=1, lidar_beams=8,
                        lidar_azimuth_resolution_deg=2.0)
    log = load_log(synthesize(tmp_path / "log", seed=1, options=opts, progress=False))
    obs = next(iter(log.frames[0].lidars.values()))
    r = sweep_rays(log, obs)
    pts = log.sweep(obs)
    assert r.grid == (8, 180) and len(r.range) == 8 * 180
    assert len(np.unique(r.ring * 180 + r.column)) == 8 * 180  # each cell once
    ret = r.range > 0
    assert ret.sum() == len(pts)  # the synthetic sensor fires one ray per cell
    el = np.degrees(np.arcsin(r.dirs[:, 2]))
    assert np.allclose(el, np.asarray(log.lidars[obs.sensor].beams.elevations_deg)[r.ring], atol=1e-3)
    assert np.all(r.times_us >= obs.timestamp_us) and np.all(r.times_us < obs.timestamp_us + 100_000)
