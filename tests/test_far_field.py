"""What lies beyond the LiDAR's reach: the empty rays at or above the horizon are open space to the sensor's range
(checked against the synthetic street's exact geometry), the free-space term, the alpha within range that
`render_rays` gives it, and the seeds placed beyond the range along those rays."""
import dataclasses

import numpy as np
import pytest
import torch

from gsim.scenes.log import load_log
from gsim.scenes.reconstruction import losses
from gsim.scenes.reconstruction.init import (InitOptions, _beyond_reach, _cameras_seeing, frame_from_normal,
                                              initial_surfels)
from gsim.scenes.reconstruction.lidar_fit import render_rays
from gsim.scenes.reconstruction.lidar_rays import sweep_rays
from gsim.scenes.reconstruction.model import SceneModel
from gsim.scenes.reconstruction.views import lidar_reach, split_frames
from gsim.scenes.synth import SynthOptions, build_street, synthesize
from gsim.surfels import Surfels
from gsim.transforms import rotmat_to_quat

OPTS = SynthOptions(n_frames=17, width=128, height=80, supersample=1, lidar_beams=16, lidar_azimuth_resolution_deg=1.0)


@pytest.fixture(scope="module")
def street(tmp_path_factory):
    log = load_log(synthesize(tmp_path_factory.mktemp("far") / "log", seed=0, options=OPTS, progress=False))
    return log, split_frames(log, 8)[0]


def _world_rays(log, rays, which):
    P = rays.poses(log)[which]
    return P[:, :3, 3], np.einsum("nij,nj->ni", P[:, :3, :3], rays.dirs[which])


def test_free_rays_meet_nothing_within_the_range(street):
    log, train = street
    f = train[2]
    obs = next(iter(f.lidars.values()))
    rays = sweep_rays(log, obs)
    free = rays.free()
    assert free.sum() > 100 and np.all(rays.range[free] == 0) and np.all(rays.dirs[free, 2] >= 0)
    # below the horizon an empty cell is not counted, whatever its cause
    assert not np.any(rays.free() & (rays.dirs[:, 2] < 0))
    o, d = _world_rays(log, rays, free)
    st = build_street(0, OPTS)
    reach = log.lidars[obs.sensor].beams.max_range_m
    for oi, di, ti in zip(o, d, rays.times_us[free]):
        hit = st.raycast(oi, di[None], int(ti))
        assert hit.prim[0] < 0 or hit.t[0] > reach


def test_free_space_is_the_mean_near_alpha_over_free_rays():
    near = torch.tensor([0.2, 0.6, 0.9, 0.0], requires_grad=True)
    free = torch.tensor([True, False, True, False])
    loss = losses.free_space(near, free)
    assert float(loss.detach()) == pytest.approx(0.55)
    loss.backward()
    assert near.grad.tolist() == [0.5, 0.0, 0.5, 0.0]
    assert float(losses.free_space(near.detach(), torch.zeros(4, dtype=torch.bool))) == 0.0


def test_near_alpha_leaves_out_what_lies_beyond_the_range(street):
    """Two surfels across one free ray: one at 10 m (opacity 0.3) and one at 1.5 x the range (0.9): the ray's
    alpha holds both, its alpha within the range the near one alone."""
    log, train = street
    obs = next(iter(train[2].lidars.values()))
    rays = sweep_rays(log, obs)
    one = rays.subset(np.nonzero(rays.free())[0][:1])
    o, d = _world_rays(log, one, slice(None))
    far = 1.5 * log.lidars[obs.sensor].beams.max_range_m
    means = np.stack([o[0] + 10 * d[0], o[0] + far * d[0]])
    q = rotmat_to_quat(frame_from_normal(-np.repeat(d, 2, 0)))
    bg = Surfels(means.astype(np.float32), q.astype(np.float32), np.full((2, 2), 0.5, np.float32),
                 np.array([0.3, 0.9], np.float32), np.full((2, 3), 0.5, np.float32))
    model = SceneModel.from_surfels(bg, {}, [], list(log.cameras))
    out = {k: v.detach() for k, v in render_rays(model, log, one).items()}
    assert float(out["near_alpha"][0]) == pytest.approx(0.3, abs=0.01)
    assert float(out["alpha"][0]) == pytest.approx(0.3 + 0.7 * 0.9, abs=0.01)
    no_beams = dataclasses.replace(log, lidars={k: dataclasses.replace(s, beams=None) for k, s in log.lidars.items()})
    assert float(render_rays(model, no_beams, one)["near_alpha"][0].detach()) == pytest.approx(float(out["alpha"][0]))


def test_seeds_beyond_the_reach_see_what_is_beyond_it(street):
    """The seeds lie at far_range x the range along free rays; a camera sees each on a pixel whose exact depth
    is beyond the LiDAR's range or the sky; none without a beam model."""
    log, train = street
    opt = InitOptions(far_range=1.25)
    reach = lidar_reach(log)
    assert reach == log.lidars[next(iter(log.lidars))].beams.max_range_m
    beyond = []
    for f in train[1:-1]:
        cams = _cameras_seeing(log, f, np.zeros((0, 3)))
        for obs in f.lidars.values():
            xyz, origin, rgb, seen = _beyond_reach(log, obs, cams, opt)
            assert len(xyz) and seen.all() and rgb.shape == (len(xyz), 3)
            assert np.allclose(np.linalg.norm(xyz - origin, axis=1), 1.25 * reach, rtol=1e-6)
            for sensor, c in zip(f.cameras, cams):
                T = np.linalg.inv(c.T_world_camera)
                uv, ok = c.camera.project(xyz @ T[:3, :3].T + T[:3, 3])
                ok &= (uv[:, 0] >= 0) & (uv[:, 0] < c.camera.width) & (uv[:, 1] >= 0) & (uv[:, 1] < c.camera.height)
                z = log.depth(f.cameras[sensor])[uv[ok, 1].astype(int), uv[ok, 0].astype(int)]
                beyond.append((z == 0) | (z > 0.9 * reach))
    assert np.concatenate(beyond).mean() > 0.9
    no_beams = dataclasses.replace(log, lidars={k: dataclasses.replace(s, beams=None) for k, s in log.lidars.items()})
    assert lidar_reach(no_beams) is None
    off = InitOptions(far_range=0.0)
    assert len(initial_surfels(no_beams, train[:3], opt)[0]) == len(initial_surfels(no_beams, train[:3], off)[0])
    assert len(initial_surfels(log, train[:3], opt)[0]) > len(initial_surfels(log, train[:3], off)[0])
