"""Sky masks from the log itself (direction-steady colour, empty LiDAR rays, smooth regions), checked against the
synthetic street's exact depth (0 = sky); the initialisation seeds nothing on them; the opacity term."""
import dataclasses

import numpy as np
import pytest
import torch

from gsim.scenes.log import load_log
from gsim.scenes.reconstruction import losses
from gsim.scenes.reconstruction.init import InitOptions, _above_lidar, _cameras_seeing
from gsim.scenes.reconstruction.sky_mask import SkyPixels, empty_directions, sky_masks
from gsim.scenes.reconstruction.views import make_views, split_frames, sweep_world
from gsim.scenes.synth import SynthOptions, synthesize

OPTS = SynthOptions(n_frames=17, width=128, height=80, supersample=1, lidar_beams=16, lidar_azimuth_resolution_deg=1.0)


@pytest.fixture(scope="module")
def street(tmp_path_factory):
    log = load_log(synthesize(tmp_path_factory.mktemp("sky") / "log", seed=0, options=OPTS, progress=False))
    train, _ = split_frames(log, 8)
    views = make_views(log, train)
    return log, train, views, sky_masks(views, empty_directions(log, train))


def _truth(log, frames, views):
    by = {(f.index, s): o for f in frames for s, o in f.cameras.items()}
    return [log.depth(by[(v.frame, v.sensor)]) == 0 for v in views]


def test_masks_find_the_sky_and_little_else(street):
    log, train, views, masks = street
    truth = _truth(log, train, views)
    m, t = np.concatenate([x.ravel() > 0 for x in masks]), np.concatenate([x.ravel() for x in truth])
    precision, recall = (m & t).sum() / m.sum(), (m & t).sum() / t.sum()
    assert precision > 0.95 and recall > 0.6, (precision, recall)


def test_no_masks_without_a_baseline_or_empty_rays(street):
    log, train, views, _ = street
    assert sky_masks(views[:1], empty_directions(log, train)) == [None]  # one camera position: no parallax
    assert sky_masks(views, np.zeros((0, 3))) == [None] * len(views)  # no beam model: nothing to start from
    no_beams = dataclasses.replace(log, lidars={k: dataclasses.replace(s, beams=None) for k, s in log.lidars.items()})
    assert len(empty_directions(no_beams, train)) == 0
    # near the horizon an empty ray may pass structure beyond the sensor's range: only rays well above it seed
    low = empty_directions(log, train, min_elevation_deg=0.0)
    high = empty_directions(log, train)
    assert len(high) > 0 and len(low) > len(high) and np.all(high[:, 2] > np.sin(np.radians(4.99)))


def test_the_initialisation_seeds_nothing_on_sky_pixels(street):
    log, train, views, masks = street
    f = train[3]
    world = np.concatenate([sweep_world(log, o)[0] for o in f.lidars.values()])
    sky = SkyPixels({(v.frame, v.sensor): m for v, m in zip(views, masks)})
    opt = InitOptions(above_stride=1)
    free = np.ones(len(world), bool)
    plain = _above_lidar(_cameras_seeing(log, f, world), world, free, opt)[0]
    seen = _cameras_seeing(log, f, world, sky)
    kept = _above_lidar(seen, world, free, opt)[0]
    assert sum(int(c.sky.sum()) for c in seen) > 0 and len(kept) < len(plain)
    def on_sky(points):  # the share of the points that some camera of the frame sees on its sky pixels
        hit = np.zeros(len(points), bool)
        for c in seen:
            T = np.linalg.inv(c.T_world_camera)
            uv, ok = c.camera.project(points @ T[:3, :3].T + T[:3, 3])
            ok &= (uv[:, 0] >= 0) & (uv[:, 0] < c.camera.width) & (uv[:, 1] >= 0) & (uv[:, 1] < c.camera.height)
            hit[ok] |= c.sky[uv[ok, 1].astype(int), uv[ok, 0].astype(int)]
        return hit.mean()
    assert on_sky(plain) > 0.05 and on_sky(kept) < 0.1 * on_sky(plain), (on_sky(plain), on_sky(kept))


def test_sky_pixels_scale_masks_to_the_log_images():
    m = np.array([[1, 0], [0, 1]], np.float32)
    full = SkyPixels({(3, "front"): m}, downscale=2).full_size(3, "front", 5, 4)
    assert full.shape == (5, 4) and full[:2, :2].all() and not full[:2, 2:].any() and not full[4].any()
    assert SkyPixels({}).full_size(0, "front", 5, 4) is None


def test_sky_opacity_is_the_mean_alpha_on_sky_pixels():
    alpha = torch.tensor([[0.2, 0.9], [0.4, 1.0]])
    sky = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert float(losses.sky_opacity(alpha, sky)) == pytest.approx(0.3)
    assert float(losses.sky_opacity(alpha, torch.zeros(2, 2))) == 0.0
    # with the LiDAR's reach, a sky pixel whose surface lies beyond it (a far facade the mask took) is not held
    ranges = torch.tensor([[30.0, 5.0], [120.0, 5.0]])
    assert float(losses.sky_opacity(alpha, sky, ranges, 80.0)) == pytest.approx(0.2)
    assert float(losses.sky_opacity(alpha, sky, ranges, None)) == pytest.approx(0.3)
