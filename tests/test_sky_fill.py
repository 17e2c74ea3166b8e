"""The sky map's unseen texels follow a smooth fill of the texels some sky pixel looks along (`sky_fill`): which
texels count as seen, the membrane's properties, and the trainer keeping the map filled after each step."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import torch

from gsim.scenes.reconstruction import train as train_mod
from gsim.scenes.reconstruction.sky_fill import SkyFill, _membrane
from gsim.scenes.reconstruction.train import preset
from gsim.scenes.synth import synthesize
from test_sky_mask import OPTS

H, W = 8, 16


def _view(dirs, sky):
    return SimpleNamespace(dirs_world=np.asarray(dirs, np.float32).reshape(1, -1, 3),
                           sky=None if sky is None else np.asarray(sky, np.float32).reshape(1, -1))


def test_the_seen_texels_are_where_sky_pixels_look():
    # ahead along +x at the horizon: azimuth 0 is the middle column, the horizon the middle row; straight up: row 0
    v = _view([[1, 0, 0], [0, 0, 2], [0, 1, 0]], [1, 1, 0])  # the third pixel is no sky
    fill = SkyFill.of([v, _view([[1, 0, 0]], None)], (H, W))
    assert set(fill.known.tolist()) == {(H // 2) * W + W // 2, 0 * W + W // 2}
    assert len(fill.unknown) == H * W - 2 and fill.weights.shape == (H * W - 2, 2)
    assert SkyFill.of([_view([[1, 0, 0]], [0])], (H, W)) is None  # no sky pixel: nothing to fill from


def test_the_fill_is_a_smooth_membrane_that_keeps_the_seen_texels():
    known = np.zeros((H, W), bool)
    known[2:5, 5:9] = True
    fill = SkyFill(*(torch.from_numpy(x) for x in _membrane(known)))
    k = fill.known
    sky = torch.rand(H, W, 3)
    seen = sky.reshape(-1, 3)[k].clone()
    fill.apply(sky)
    flat = sky.reshape(-1, 3)
    assert torch.equal(flat[k], seen)  # the seen texels keep what they learnt
    assert (flat.min(0).values >= seen.min(0).values - 1e-5).all() and (flat.max(0).values <= seen.max(0).values + 1e-5).all()
    # each unseen texel the mean of its four neighbours (columns wrap, the first and last rows reflect)
    g = sky.numpy()
    up, down = g[np.clip(np.arange(H) - 1, 0, H - 1)], g[np.clip(np.arange(H) + 1, 0, H - 1)]
    mean = (up + down + np.roll(g, 1, 1) + np.roll(g, -1, 1)) / 4
    assert np.allclose(g[~known], mean[~known], atol=1e-5)
    const = torch.full((H, W, 3), 0.3)
    const.reshape(-1, 3)[fill.unknown] = 0.9
    fill.apply(const)
    assert torch.allclose(const, torch.full((H, W, 3), 0.3), atol=1e-5)  # a constant sky stays constant


def test_training_keeps_the_unseen_sky_filled(tmp_path):
    log = synthesize(tmp_path / "log", seed=0, options=dataclasses.replace(OPTS, n_frames=9), progress=False)
    t = train_mod.start(log, preset("cpu", backend="torch", iterations=10, lidar_every=100, sky_fill=True))
    fill = t.run.sky_fill
    assert fill is not None and 0 < len(fill.known) < len(fill.known) + len(fill.unknown)
    for i in range(2):
        train_mod.train_step(t.run, t.views[i], t.sweeps, t.log)
        t.run.step += 1
    sky = t.run.model.sky.detach()
    flat = sky.reshape(-1, 3)
    assert not torch.allclose(flat[fill.known], flat[fill.known][:1])  # the seen texels learnt
    assert torch.allclose(flat[fill.unknown], fill.weights @ flat[fill.known], atol=1e-5)
    off = train_mod.start(log, preset("cpu", backend="torch", iterations=10))  # off by default
    assert off.run.sky_fill is None
