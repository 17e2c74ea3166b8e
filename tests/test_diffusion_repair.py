"""The repair model (a small conditional diffusion model from diffusers' components): its loss falls, one-pass
repair keeps shapes and ranges, it saves and loads in diffusers' format, and `train` runs end to end on a
tiny synthetic log (degraded reconstructions, pairs, checkpoints, resume, the model card)."""
import json
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

import gsim  # noqa: E402
from gsim.diffusion import train as train_mod  # noqa: E402
from gsim.diffusion.repair import RepairConfig, RepairModel  # noqa: E402
from gsim.diffusion.train import TrainOptions, train  # noqa: E402
from gsim.errors import InputError  # noqa: E402
from gsim.scenes.synth import SynthOptions, synthesize  # noqa: E402

TINY = RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20)


def batch(seed=0, n=2, s=16):
    g = torch.Generator().manual_seed(seed)
    real = torch.rand(n, 3, s, s, generator=g)
    return real, (real + 0.2 * torch.randn(n, 3, s, s, generator=g)).clamp(0, 1), torch.ones(n, 1, s, s), \
        torch.full((n, 1, s, s), 4.0)


def test_the_loss_falls_and_repair_keeps_shapes_and_ranges():
    torch.manual_seed(0)
    m = RepairModel.new(TINY)
    real, rgb, alpha, depth = batch()
    assert torch.allclose(m.repair(rgb, alpha, depth), rgb, atol=1e-6)  # residual: an untrained model changes nothing
    opt = torch.optim.Adam(m.unet.parameters(), 3e-3)
    losses = []
    for _ in range(60):
        loss = m.loss(real, rgb, alpha, depth, generator=torch.Generator().manual_seed(len(losses)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < 0.7 * np.mean(losses[:10])
    out = m.repair(rgb, alpha, depth)
    assert (out - rgb).abs().mean() > 1e-3  # what it learned, not the render passed through
    assert out.shape == rgb.shape and out.dtype == torch.float32 and 0 <= out.min() and out.max() <= 1
    img = m.repair_image(np.random.rand(13, 21, 3), np.ones((13, 21)), np.full((13, 21), 3.0))  # padded, cropped back
    assert img.shape == (13, 21, 3)
    with pytest.raises(ValueError, match="multiples of 2"):
        m.repair(rgb[:, :, :15], alpha[:, :, :15], depth[:, :, :15])


def test_save_and_load_round_trip(tmp_path):
    m = RepairModel.new(TINY)
    real, rgb, alpha, depth = batch(1)
    m.save(tmp_path / "model", "card")
    back = RepairModel.load(tmp_path / "model")
    assert back.config == TINY
    assert torch.equal(back.repair(rgb, alpha, depth, seed=3), m.repair(rgb, alpha, depth, seed=3))
    with pytest.raises(FileNotFoundError, match="gsim diffusion train"):
        RepairModel.load(tmp_path / "none")
    (tmp_path / "model" / "unet" / "config.json").write_text("{broken")
    with pytest.raises(ValueError, match="unreadable repair model"):
        RepairModel.load(tmp_path / "model")


def test_train_end_to_end_resumes_and_writes_a_card(tmp_path, monkeypatch):
    log = synthesize(tmp_path / "log", seed=1, options=SynthOptions(n_frames=9, width=48, height=32, supersample=1,
                                                                      lidar_beams=8, lidar_azimuth_resolution_deg=2.0),
                     progress=False)
    from gsim.street import street_surfels
    gsim.Scene(background=street_surfels(2000)).save(tmp_path / "scene")
    opts = TrainOptions(steps=6, batch=2, crop=16, checkpoint_every=3, degraded=((2, 3),), extrapolated=((0, 0.5, 3),))
    card = train(tmp_path / "scene", log, tmp_path / "model", opts, TINY, progress=False)
    assert card["pairs"] == {"scene": 21, "every2-3": 21, "span0-0.5-3": 21}  # 7 training frames x 3 cameras each
    span = json.loads((tmp_path / "model-work" / "degraded-span0-0.5-3" / "train.json").read_text())
    assert span["train_frames"] == [1, 2, 3, 4]  # the first half of the training frames 1-7
    assert (tmp_path / "model" / "README.md").read_text().startswith("# gsim repair model")
    assert json.loads((tmp_path / "model" / "card.json").read_text())["steps"] == 6
    first = RepairModel.load(tmp_path / "model")
    # killed after step 4 (the checkpoint of step 3 the last), resumed: the same weights as the run straight through
    (tmp_path / "killed-work").mkdir()
    shutil.copy(tmp_path / "model-work" / "pairs.npz", tmp_path / "killed-work")  # no degraded reconstructions again
    real_batch, calls = train_mod._batch, []

    def killed_at_4(*args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_batch(*args)
    monkeypatch.setattr(train_mod, "_batch", killed_at_4)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "scene", log, tmp_path / "killed", opts, TINY, work=tmp_path / "killed-work", progress=False)
    monkeypatch.setattr(train_mod, "_batch", real_batch)
    train(tmp_path / "scene", log, tmp_path / "killed", opts, TINY, work=tmp_path / "killed-work", resume=True,
          progress=False)
    resumed = RepairModel.load(tmp_path / "killed").unet.state_dict()
    assert all(torch.equal(v, resumed[k]) for k, v in first.unet.state_dict().items())
    with pytest.raises(InputError, match=r"checkpoint.safetensors: unet/.*expected shape"):  # another model's
        train(tmp_path / "scene", log, tmp_path / "killed", opts, RepairConfig(channels=(16, 32)),
              work=tmp_path / "killed-work", resume=True, progress=False)
    again = train(tmp_path / "scene", log, tmp_path / "model", TrainOptions(steps=8, batch=2, crop=16, degraded=((2, 3),),
                                                                            extrapolated=((0, 0.5, 3),)),
                  TINY, resume=True, progress=False)  # the pairs and the degraded scene are reused; 2 more steps
    assert again["steps"] == 8 and RepairModel.load(tmp_path / "model").config == first.config
    with pytest.raises(ValueError, match="crop"):
        train(tmp_path / "scene", log, tmp_path / "m2", TrainOptions(crop=15), TINY, progress=False)


def test_gsim_render_repair_writes_repaired_frames_beside_the_renders(tmp_path):
    from gsim.cli import main
    from gsim.street import street_surfels
    from gsim.trajectory import Trajectory
    gsim.Scene(background=street_surfels(2000)).save(tmp_path / "scene")
    T = np.eye(4)
    T[:3, :3] = [[0, 0, 1], [-1, 0, 0], [0, -1, 0]]
    T[:3, 3] = [0.0, -1.5, 1.5]
    Trajectory(gsim.PinholeCamera(30, 20, 20.0, 20.0, 15.0, 10.0), np.array([0, 100_000]), np.stack([T, T])) \
        .save(tmp_path / "t.json")
    m = RepairModel.new(TINY)
    torch.nn.init.normal_(m.unet.conv_out.weight, std=0.1)  # a model that changes things
    m.save(tmp_path / "model")
    assert main(["render", str(tmp_path / "scene"), "--trajectory", str(tmp_path / "t.json"), "--out",
                 str(tmp_path / "r"), "--repair", str(tmp_path / "model"), "--no-video"]) == 0
    from PIL import Image
    a, b = (np.asarray(Image.open(tmp_path / "r" / d / "000001.png"), np.float32) for d in ("render", "rgb"))
    assert a.shape == b.shape == (20, 30, 3) and np.abs(a - b).mean() > 1
    assert main(["render", str(tmp_path / "scene"), "--trajectory", str(tmp_path / "t.json"), "--out",
                 str(tmp_path / "r2"), "--repair", str(tmp_path / "none")]) == 2


def test_masked_repair_changes_only_the_mask():
    m = RepairModel.new(TINY)
    torch.nn.init.normal_(m.unet.conv_out.weight, std=0.1)  # a model that changes what it sees
    real, rgb, alpha, depth = batch(2)
    mask = torch.zeros(2, 1, 16, 16)
    mask[..., 4:10, 6:12] = 1
    out = m.repair(rgb, alpha, depth, mask=mask)
    assert torch.allclose(out * (1 - mask), rgb * (1 - mask), atol=1e-6)
    assert (out - rgb)[..., 4:10, 6:12].abs().mean() > 1e-3
    img = m.repair_image(rgb[0].permute(1, 2, 0).numpy(), np.ones((16, 16)), np.full((16, 16), 4.0),
                         mask=mask[0, 0].numpy())
    assert np.allclose(img, out[0].permute(1, 2, 0).numpy(), atol=1e-6)


def test_a_repair_model_with_pickled_weights_is_refused_unread(tmp_path):
    """Weights come from safetensors only: a folder someone sent with a pickled .bin is refused, never unpickled."""
    from pathlib import Path

    from gsim.errors import InputError

    class Plant:
        def __reduce__(self):
            return Path.touch, (tmp_path / "planted",)
    RepairModel.new(RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20)).save(tmp_path / "m")
    for f in (tmp_path / "m" / "unet").glob("*.safetensors"):
        f.unlink()
    torch.save({"conv_in.weight": Plant()}, tmp_path / "m" / "unet" / "diffusion_pytorch_model.bin")
    with pytest.raises(InputError, match="unreadable repair model"):
        RepairModel.load(tmp_path / "m")
    assert not (tmp_path / "planted").exists()
