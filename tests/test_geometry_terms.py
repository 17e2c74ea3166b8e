"""The geometry terms: multi-view consistency (neighbours, the warp between views, checked through the synthetic
street's exact depth on its pinhole and its distorted cameras, and the NCC cost, which the true depth minimises) and
the opacities' entropy."""
import types

import numpy as np
import pytest
import torch

from gsim.scenes.log import load_log
from gsim.scenes.reconstruction import multiview
from gsim.scenes.reconstruction.train import preset, start, train_step
from gsim.scenes.reconstruction.views import make_views, split_frames
from gsim.scenes.synth import SynthOptions, build_street, render_camera, synthesize

OPTS = SynthOptions(n_frames=17, width=160, height=100, supersample=1, lidar_beams=16,
                    lidar_azimuth_resolution_deg=1.0)


@pytest.fixture(scope="module")
def street(tmp_path_factory):
    path = synthesize(tmp_path_factory.mktemp("mv") / "log", seed=0, options=OPTS, progress=False)
    log = load_log(path)
    return path, log, make_views(log, split_frames(log, 8)[0])


def test_neighbours_are_the_same_cameras_nearest_frames():
    views = [types.SimpleNamespace(sensor=s, timestamp_us=t) for s, t in
             [("a", 30), ("b", 10), ("a", 10), ("a", 20), ("b", 20)]]
    assert multiview.neighbours(views) == {2: [3], 3: [2, 0], 0: [3], 1: [4], 4: [1]}


def _cost(view, depth, others):
    rays = torch.nan_to_num(torch.tensor(view.camera.ray_table(), dtype=torch.float32))
    valid = torch.as_tensor(depth > 0)
    return multiview.consistency(depth_t := torch.as_tensor(depth), valid, rays, torch.as_tensor(view.image),
                                 view.T_world_camera, others), depth_t


@pytest.mark.parametrize("sensor", ["front", "front_left"])
def test_the_true_depth_makes_the_views_agree(street, sensor):
    """Warped through the street's exact depth, the neighbours' images agree with the view better than through a
    depth 20% off either way (the front camera, whose neighbours lie along its axis, sees less parallax than the
    side camera); the cost's gradient reaches the depth."""
    _, log, views = street
    idx = next(i for i, v in enumerate(views) if v.sensor == sensor and v.frame == 4)
    view = views[idx]
    others = [(torch.as_tensor(views[j].image).mean(-1), views[j].camera, views[j].T_world_camera)
              for j in multiview.neighbours(views)[idx]]
    assert len(others) == 2
    _, depth = render_camera(build_street(0, OPTS), view.camera, view.T_world_camera, view.timestamp_us, 1)
    true, _ = _cost(view, depth, others)
    near, _ = _cost(view, depth * 0.8, others)
    far, d = _cost(view, depth * 1.25, others)
    assert float(true) + (0.025 if sensor == "front" else 0.1) < min(float(near), float(far))
    d.requires_grad_(True)
    cost = multiview.consistency(d, torch.as_tensor(depth > 0),
                                 torch.nan_to_num(torch.tensor(view.camera.ray_table(), dtype=torch.float32)),
                                 torch.as_tensor(view.image), view.T_world_camera, others)
    cost.backward()
    assert torch.isfinite(d.grad).all() and (d.grad != 0).sum() > 100


def test_warp_leaves_out_what_falls_outside_or_behind():
    from gsim.cameras import PinholeCamera
    cam = PinholeCamera(20, 10, 10.0, 10.0, 10.0, 5.0)
    rays = torch.as_tensor(np.nan_to_num(cam.ray_table()), dtype=torch.float32)
    depth = torch.full((10, 20), 5.0)
    grid, ok = multiview.warp(depth, rays, np.eye(4), cam)
    assert ok.all() and torch.allclose(grid[0, 0], torch.tensor([-1 + 1 / 20, -1 + 1 / 10]))
    T = np.eye(4)
    T[2, 3] = -6.0  # every point behind the destination camera
    assert not multiview.warp(depth, rays, T, cam)[1].any()
    T = np.eye(4)
    T[0, 3] = 100.0  # every point far right of its image
    assert not multiview.warp(depth, rays, T, cam)[1].any()


def test_a_run_with_the_term_trains(street):
    path, _, _ = street
    cfg = preset("cpu", iterations=4, normal_from=0, multiview_weight=0.15, lidar_rays=0)
    t = start(path, cfg)
    assert len(t.run.neighbours) == len(t.views)
    for _ in range(3):
        loss, _ = train_step(t.run, t.views[0], t.sweeps, t.log)
        t.run.step += 1
        assert np.isfinite(loss)


def test_opacity_entropy_pushes_opacities_to_0_or_1():
    from gsim.scenes.reconstruction.losses import opacity_entropy
    x = torch.tensor([-3.0, -0.5, 0.0, 0.5, 3.0], requires_grad=True)
    h = opacity_entropy(x)
    p = torch.sigmoid(x.detach())
    assert float(h.detach()) == pytest.approx(float((-(p * p.log() + (1 - p) * (1 - p).log())).mean()), rel=1e-5)
    h.backward()
    # descending the gradient moves each logit away from 0 (and leaves 0 itself where it is)
    assert (x.grad[[0, 1]] > 0).all() and (x.grad[[3, 4]] < 0).all() and float(x.grad[2]) == 0
    assert float(opacity_entropy(torch.tensor([-30.0, 30.0]))) < 1e-6
