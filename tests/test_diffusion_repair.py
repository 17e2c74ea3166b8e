"""The repair model (a small conditional diffusion model from diffusers' components): its loss falls, one-pass
repair keeps shapes and ranges, it saves and loads in diffusers' format, and `train` runs end to end on a
tiny synthetic log (degraded reconstructions, pairs, checkpoints, resume, the model card)."""
import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

import gsim  # noqa: E402
from gsim.diffusion import train as train_mod  # noqa: E402
from gsim.diffusion.repair import RepairConfig, RepairModel, repair_device  # noqa: E402
from gsim.diffusion.train import TrainOptions, train  # noqa: E402
from gsim.errors import InputError, Unavailable  # noqa: E402
from gsim.scenes.synth import SynthOptions, synthesize  # noqa: E402

TINY = RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20)


def batch(seed=0, n=2, s=16):
    g = torch.Generator().manual_seed(seed)
    real = torch.rand(n, 3, s, s, generator=g)
    return real, (real + 0.2 * torch.randn(n, 3, s, s, generator=g)).clamp(0, 1), torch.ones(n, 1, s, s), \
        torch.full((n, 1, s, s), 4.0)


def random_pairs(sources, s=16):
    """Pairs of random 16x16 images without references, one per entry of ``sources``."""
    rng, n = np.random.default_rng(0), len(sources)
    return train_mod.Pairs(rng.integers(0, 255, (n, s, s, 3), np.uint8), np.full((n, s, s), 255, np.uint8),
                           np.full((n, s, s), 4.0, np.float16), rng.integers(0, 255, (n, s, s, 3), np.uint8),
                           list(sources), np.zeros((n, 0, s, s, 3), np.uint8), np.zeros((n, 0, s, s), bool))


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


def test_the_render_objective_learns_the_correction_repair_applies():
    """A systematic error (the render's contrast halved): the model trained on what repair sees (the render noised
    to repair_t, the default objective) learns to undo it."""
    g = torch.Generator().manual_seed(0)
    real = torch.rand(4, 3, 16, 16, generator=g)
    rgb = 0.5 * real + 0.25
    alpha, depth = torch.ones(4, 1, 16, 16), torch.full((4, 1, 16, 16), 4.0)
    torch.manual_seed(0)
    m = RepairModel.new(TINY)
    assert m.config.train_input == "render"
    opt = torch.optim.Adam(m.unet.parameters(), 3e-3)
    for step in range(150):
        loss = m.loss(real, rgb, alpha, depth, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    before, after = (rgb - real).abs().mean().item(), (m.repair(rgb, alpha, depth) - real).abs().mean().item()
    assert after < 0.2 * before, (before, after)


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


def test_the_device_is_chosen_by_name_and_cuda_refused_without_it(tmp_path):
    assert repair_device("cpu") == torch.device("cpu")
    assert repair_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(InputError, match="device: expected 'auto', 'cpu' or 'cuda', got 'gpu'"):
        repair_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(Unavailable, match="CUDA is not available here"):
            repair_device("cuda")
    RepairModel.new(TINY).save(tmp_path / "m")
    assert RepairModel.load(tmp_path / "m").device == torch.device("cpu")


@pytest.mark.cuda
def test_training_and_repair_on_cuda_match_the_cpu(tmp_path):
    """The same seed on the GPU: the same noise and crops (drawn on the CPU), so the losses and the repairs agree
    with the CPU's to float tolerance."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA here")
    pairs = random_pairs(["seed1"] * 3)
    opts = TrainOptions(steps=5, batch=2, crop=16)
    cards = [train(tmp_path / "scene", tmp_path / "log", tmp_path / d, opts, TINY, progress=False, pairs=pairs,
                   device=d) for d in ("cpu", "cuda")]
    assert cards[1]["device"].startswith("cuda")
    assert cards[0]["loss_first_100"] == pytest.approx(cards[1]["loss_first_100"], rel=1e-3)
    real, rgb, alpha, depth = batch(2)
    on = [RepairModel.load(tmp_path / d, device=d).repair(rgb.to(d), alpha.to(d), depth.to(d), seed=1).cpu()
          for d in ("cpu", "cuda")]
    assert torch.allclose(on[0], on[1], atol=1e-3)


def test_a_failed_save_keeps_the_previous_model_and_its_card(tmp_path, monkeypatch):
    """The model directory and its card are written atomically: a save that fails half-way (its UNet written, its
    scheduler not) leaves the previous model, card included, and no temporary folder."""
    RepairModel.new(TINY).save(tmp_path / "m", "card one", {"steps": 1})
    other = RepairModel.new(dataclasses.replace(TINY, repair_t=30))

    def disk_full(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(type(other.scheduler), "save_pretrained", disk_full)
    with pytest.raises(OSError, match="disk full"):
        other.save(tmp_path / "m", "card two", {"steps": 2})
    assert (tmp_path / "m" / "README.md").read_text() == "card one"
    assert json.loads((tmp_path / "m" / "card.json").read_text()) == {"steps": 1}
    assert RepairModel.load(tmp_path / "m").config == TINY and [p.name for p in tmp_path.iterdir()] == ["m"]


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


def test_train_on_given_pairs_makes_none_of_its_own(tmp_path, monkeypatch):
    """bench/bench_offpath_pairs.py's path: pairs from elsewhere (synthetic streets off the path) are trained on as
    they are; no degraded reconstruction is made."""
    monkeypatch.setattr(train_mod, "make_pairs", lambda *a, **k: pytest.fail("made pairs of its own"))
    pairs = random_pairs(["seed1", "seed1", "seed2"])
    card = train(tmp_path / "scene", tmp_path / "log", tmp_path / "m", TrainOptions(steps=2, batch=2, crop=16), TINY,
                 progress=False, pairs=pairs)
    assert card["pairs"] == {"seed1": 2, "seed2": 1} and card["image_size"] == [16, 16]
    assert RepairModel.load(tmp_path / "m").config == TINY


def test_training_can_start_from_a_model_with_the_same_settings(tmp_path):
    """``init`` (`gsim diffusion train --init`): fine-tuning a pretrained model starts from its weights (at a
    learning rate of 0 they stay as they were), says so in the card, and refuses a model of other settings."""
    pairs = random_pairs(["seed1"] * 3)
    train(tmp_path / "scene", tmp_path / "log", tmp_path / "pre", TrainOptions(steps=3, batch=2, crop=16), TINY,
          progress=False, pairs=pairs)
    pre = RepairModel.load(tmp_path / "pre").unet.state_dict()
    assert any(v.abs().sum() > 0 for k, v in pre.items() if k.startswith("conv_out"))  # (it moved off zero)
    l2 = dataclasses.replace(TINY, loss="l2")
    card = train(tmp_path / "scene", tmp_path / "log", tmp_path / "fine",
                 TrainOptions(steps=2, batch=2, crop=16, lr=0.0), l2, progress=False, pairs=pairs,
                 init=tmp_path / "pre")
    fine = RepairModel.load(tmp_path / "fine")
    assert fine.config == l2 and all(torch.equal(v, fine.unet.state_dict()[k]) for k, v in pre.items())
    assert card["init"] == str((tmp_path / "pre").resolve()) and "starting from the model" in \
        (tmp_path / "fine" / "README.md").read_text()
    with pytest.raises(InputError, match=r"pre: cannot start from this repair model: its references is 0 .*, this "
                                         r"training's 1"):
        train(tmp_path / "scene", tmp_path / "log", tmp_path / "other", TrainOptions(steps=1, batch=2, crop=16),
              dataclasses.replace(TINY, references=1), progress=False, pairs=pairs, init=tmp_path / "pre")
    with pytest.raises(FileNotFoundError, match="no repair model here"):
        train(tmp_path / "scene", tmp_path / "log", tmp_path / "other", TrainOptions(steps=1, batch=2, crop=16), TINY,
              progress=False, pairs=pairs, init=tmp_path / "nothing")


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


# --- reference-conditioned models (RepairConfig.references) -------------------------------------------------

def refs(seed=0, n=2, k=2, s=16):
    """(n,k,4,s,s): random warped rgb and a random valid mask."""
    g = torch.Generator().manual_seed(seed)
    valid = (torch.rand(n, k, 1, s, s, generator=g) > 0.5).float()
    return torch.cat([torch.rand(n, k, 3, s, s, generator=g), valid], 2)


def test_reference_slots_set_the_unet_channels_and_old_settings_load(tmp_path):
    assert RepairModel.new(TINY).unet.config.in_channels == 8
    assert RepairModel.new(RepairConfig(channels=(8, 16), references=3)).unet.config.in_channels == 8 + 12
    m = RepairModel.new(TINY)
    m.save(tmp_path / "old")
    settings = json.loads((tmp_path / "old" / "gsim_repair.json").read_text())
    del settings["references"], settings["train_input"]  # a model directory written before the fields
    (tmp_path / "old" / "gsim_repair.json").write_text(json.dumps(settings))
    assert RepairModel.load(tmp_path / "old").config.references == 0
    assert RepairModel.load(tmp_path / "old").config.train_input == "real"  # trained before the field: DDPM's
    settings["references"] = 2  # settings that disagree with the weights
    (tmp_path / "old" / "gsim_repair.json").write_text(json.dumps(settings))
    with pytest.raises(InputError, match="takes 8 channels"):
        RepairModel.load(tmp_path / "old")
    with pytest.raises(InputError, match="RepairConfig.references"):
        RepairConfig(references=-1)


def test_references_condition_the_model_missing_ones_are_invalid_and_refused_without_slots():
    cfg = RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20, references=2)
    m = RepairModel.new(cfg)
    real, rgb, alpha, depth = batch()
    r = refs()
    assert torch.equal(m.repair(rgb, alpha, depth, references=r), m.repair(rgb, alpha, depth))  # residual, zero out
    assert torch.allclose(m.repair(rgb, alpha, depth, references=r), rgb, atol=1e-6)
    torch.nn.init.normal_(m.unet.conv_out.weight, std=0.1)  # a model that uses what it sees
    out = m.repair(rgb, alpha, depth, seed=5, references=r)
    assert torch.equal(out, m.repair(rgb, alpha, depth, seed=5, references=r))  # deterministic per seed
    assert (out - m.repair(rgb, alpha, depth, seed=5)).abs().mean() > 1e-4  # the references matter
    # missing slots are invalid: one reference given is the same as it and an all-invalid second one
    invalid = torch.zeros_like(r[:, :1])
    assert torch.equal(m.repair(rgb, alpha, depth, references=r[:, :1]),
                       m.repair(rgb, alpha, depth, references=torch.cat([r[:, :1], invalid], 1)))
    assert torch.equal(m.repair(rgb, alpha, depth), m.repair(rgb, alpha, depth, references=torch.cat([invalid] * 2, 1)))
    loss = m.loss(real, rgb, alpha, depth, generator=torch.Generator().manual_seed(0), references=r)
    loss.backward()
    assert torch.isfinite(loss) and m.unet.conv_in.weight.grad[:, 8:].abs().sum() > 0  # reference channels learn
    # numpy: (warped, valid) pairs, padded to the UNet's multiple and cropped back like the render
    npr = [(r[0, i, :3].permute(1, 2, 0).numpy(), r[0, i, 3].numpy() > 0) for i in range(2)]
    img = m.repair_image(rgb[0].permute(1, 2, 0).numpy(), np.ones((16, 16)), np.full((16, 16), 4.0), seed=5,
                         references=npr)
    assert np.allclose(img, out[0].permute(1, 2, 0).numpy(), atol=1e-6)
    odd = m.repair_image(np.random.rand(13, 21, 3), np.ones((13, 21)), np.full((13, 21), 3.0),
                         references=[(np.random.rand(13, 21, 3), np.ones((13, 21), bool))])
    assert odd.shape == (13, 21, 3)
    with pytest.raises(InputError, match=r"references\[0\]"):
        m.repair_image(np.random.rand(13, 21, 3), np.ones((13, 21)), np.full((13, 21), 3.0),
                       references=[(np.random.rand(12, 21, 3), np.ones((13, 21), bool))])
    with pytest.raises(InputError, match="references: expected"):
        m.repair(rgb, alpha, depth, references=refs(k=3))  # more than the model's slots
    with pytest.raises(InputError, match="takes none"):
        RepairModel.new(TINY).repair(rgb, alpha, depth, references=r)


def test_training_with_references_is_deterministic_and_never_takes_the_target_frame(tmp_path, monkeypatch):
    from gsim.diffusion import references as refs_mod
    log = synthesize(tmp_path / "log", seed=1, options=SynthOptions(n_frames=9, width=48, height=32, supersample=1,
                                                                      lidar_beams=8, lidar_azimuth_resolution_deg=2.0),
                     progress=False)
    from gsim.scenes.log import load_log
    from gsim.street import street_surfels
    gsim.Scene(background=street_surfels(2000)).save(tmp_path / "scene")
    nearest, calls = refs_mod.nearest_training_views, []

    def spy(log, T, timestamp_us, k=2, sensor=None, holdout_every=8, exclude=()):
        found = nearest(log, T, timestamp_us, k, sensor, holdout_every, exclude)
        calls.append((timestamp_us, sensor, list(exclude), [f.index for f, _ in found]))
        return found
    monkeypatch.setattr(refs_mod, "nearest_training_views", spy)
    cfg = RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20, references=2)
    opts = TrainOptions(steps=3, batch=2, crop=16, degraded=(), extrapolated=())
    card = train(tmp_path / "scene", log, tmp_path / "a", opts, cfg, progress=False)
    assert card["pairs"] == {"scene": 21} and len(calls) == 21
    frame_of = {(o.timestamp_us, o.sensor): f.index for f, o in load_log(log).camera_observations()}
    for t, sensor, exclude, found in calls:
        assert exclude == [frame_of[t, sensor]] and len(found) == 2
        assert all(i not in exclude and i % 8 for i in found)  # never the target's frame, never a held-out one
    z = np.load(tmp_path / "a-work" / "pairs.npz")
    assert z["warped"].shape == (21, 2, 32, 48, 3) and z["valid"].shape == (21, 2, 32, 48) and z["valid"].any()
    m = RepairModel.load(tmp_path / "a")
    assert m.config.references == 2 and m.unet.config.in_channels == 16
    train(tmp_path / "scene", log, tmp_path / "b", opts, cfg, progress=False)  # again, from nothing: the same model
    again = RepairModel.load(tmp_path / "b").unet.state_dict()
    assert all(torch.equal(v, again[k]) for k, v in m.unet.state_dict().items())
    assert np.array_equal(np.load(tmp_path / "b-work" / "pairs.npz")["warped"], z["warped"])


def test_a_model_of_a_reconstruction_of_part_of_the_drive_sees_nothing_of_the_rest(tmp_path, monkeypatch):
    """A reconstruction trained on frames 1-4 of 1-7 (`gsim reconstruct --train-span`; its train.json says which):
    the pairs are of those frames, their degraded reconstructions see no others, and no reference comes from
    frames 5-7, neither their images nor their LiDAR: the frames after the span still measure extrapolation."""
    from gsim.diffusion import references as refs_mod
    from gsim.diffusion.train import trained_frames
    from gsim.street import street_surfels
    log = synthesize(tmp_path / "log", seed=1, options=SynthOptions(n_frames=9, width=48, height=32, supersample=1,
                                                                      lidar_beams=8, lidar_azimuth_resolution_deg=2.0),
                     progress=False)
    gsim.Scene(background=street_surfels(2000)).save(tmp_path / "r" / "scene")
    record = {"config": {"holdout_every": 8}, "train_frames": [1, 2, 3, 4]}
    (tmp_path / "r" / "train.json").write_text(json.dumps(record))
    assert trained_frames(tmp_path / "r" / "scene") == (8, [1, 2, 3, 4])
    assert trained_frames(tmp_path / "scene") == (8, None)  # (no record: every training frame)
    nearest, lidar, found, lidars = refs_mod.nearest_training_views, refs_mod.training_lidar, [], []

    def spy(*a, **k):
        out = nearest(*a, **k)
        found.extend(f.index for f, _ in out)
        return out

    def spy_lidar(log, holdout_every=8, exclude=()):
        lidars.append(tuple(exclude))
        return lidar(log, holdout_every, exclude)
    monkeypatch.setattr(refs_mod, "nearest_training_views", spy)
    monkeypatch.setattr(refs_mod, "training_lidar", spy_lidar)
    cfg = RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20, references=2, reference_depth="lidar")
    opts = TrainOptions(steps=2, batch=2, crop=16, degraded=((2, 3),), extrapolated=((0, 0.5, 3),))
    card = train(tmp_path / "r" / "scene", log, tmp_path / "m", opts, cfg, progress=False)
    assert card["pairs"] == {"scene": 12, "every2-3": 12, "span0-0.5-3": 12}  # frames 1-4 x 3 cameras
    assert set(found) <= {1, 2, 3, 4} and set(lidars) == {(5, 6, 7)}
    seen = {n: json.loads((tmp_path / "m-work" / f"degraded-{n}" / "train.json").read_text())["train_frames"]
            for n in ("every2-3", "span0-0.5-3")}
    assert seen == {"every2-3": [1, 3], "span0-0.5-3": [1, 2]}
    assert list(np.load(tmp_path / "m-work" / "pairs.npz")["frames"]) == [1, 2, 3, 4]


def test_references_through_the_logs_lidar(tmp_path, monkeypatch):
    """reference_depth "lidar": the pairs' and the repairs' references are warped through the log's LiDAR (one
    LidarDepth per log), the pairs' cache says through what and is not reused for the other depth."""
    from dataclasses import replace

    from gsim.diffusion import references as refs_mod
    from gsim.street import street_surfels
    log = synthesize(tmp_path / "log", seed=1, options=SynthOptions(n_frames=9, width=48, height=32, supersample=1,
                                                                      lidar_beams=8, lidar_azimuth_resolution_deg=2.0),
                     progress=False)
    gsim.Scene(background=street_surfels(2000)).save(tmp_path / "scene")
    real, through, built = refs_mod.references, [], []
    monkeypatch.setattr(refs_mod, "references", lambda *a, **k: through.append(k["lidar"]) or real(*a, **k))

    class Counted(refs_mod.LidarDepth):  # each LidarDepth built
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(refs_mod, "LidarDepth", Counted)
    cfg = RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20, references=2, reference_depth="lidar")
    opts = TrainOptions(steps=2, batch=2, crop=16, degraded=(), extrapolated=())
    train(tmp_path / "scene", log, tmp_path / "a", opts, cfg, progress=False)
    assert len(through) == 21 and all(isinstance(x, refs_mod.LidarDepth) for x in through) and len(built) == 1
    z = np.load(tmp_path / "a-work" / "pairs.npz")
    assert str(z["reference_depth"]) == "lidar" and z["valid"].any()
    m = RepairModel.load(tmp_path / "a")
    assert m.config.reference_depth == "lidar"
    through.clear()
    train(tmp_path / "scene", log, tmp_path / "a", opts, replace(cfg, reference_depth="render"), progress=False)
    assert len(through) == 21 and all(x is None for x in through)  # the cache was made through the LiDAR: remade
    assert not np.array_equal(np.load(tmp_path / "a-work" / "pairs.npz")["warped"], z["warped"])
    from gsim.scenes.log import load_log
    lg, through[:] = load_log(log), []
    obs = next(o for f, o in lg.camera_observations() if f.index == 3)
    cam = lg.cameras[obs.sensor].camera
    rgb, alpha, depth = np.full((32, 48, 3), 0.5, np.float32), np.ones((32, 48), np.float32), np.full((32, 48), 9.0)
    m.repair_view(gsim.load_scene(tmp_path / "scene"), lg, cam, lg.T_world_camera(obs), obs.timestamp_us, rgb,
                  alpha, depth, obs.sensor)
    assert len(through) == 1 and isinstance(through[0], refs_mod.LidarDepth) and len(built) == 2  # (another log)
    with pytest.raises(InputError, match="reference_depth"):
        RepairConfig(reference_depth="exact")

def reference_setup(tmp_path, monkeypatch):
    """A small synthetic log, a street scene, a 2-slot repair model with a non-zero output layer (so references
    change its repairs) and a spy on `references.references`; returns (log path, the spied calls' results)."""
    from gsim.diffusion import references as refs_mod
    from gsim.street import street_surfels
    log = synthesize(tmp_path / "log", seed=1, options=SynthOptions(n_frames=17, width=48, height=32, supersample=1,
                                                                      lidar_beams=8, lidar_azimuth_resolution_deg=2.0),
                     progress=False)
    gsim.Scene(background=street_surfels(2000)).save(tmp_path / "scene")
    m = RepairModel.new(RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20, references=2))
    torch.nn.init.normal_(m.unet.conv_out.weight, std=0.1)
    m.save(tmp_path / "model")
    real, calls = refs_mod.references, []

    def spy(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return calls[-1]
    monkeypatch.setattr(refs_mod, "references", spy)
    return log, calls


def test_gsim_eval_repairs_held_out_and_shifted_views_with_their_references(tmp_path, monkeypatch):
    from gsim.cli import main
    log, calls = reference_setup(tmp_path, monkeypatch)
    assert main(["eval", str(tmp_path / "scene"), str(log), "--out", str(tmp_path / "e"), "--shifts", "1",
                 "--repair", str(tmp_path / "model")]) == 0
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert "repaired_psnr" in metrics and "repaired_psnr" in metrics["lane_shift"][0]
    assert len(calls) == 3 * 3 + 2 * 3  # held-out frames 0, 8 and 16, 3 cameras; frame 8 shifted to both sides
    assert all(len(r) == 2 for r in calls)


def test_gsim_render_repairs_with_references_from_a_log(tmp_path, monkeypatch):
    from gsim.cli import main
    from gsim.scenes.log import load_log
    from gsim.trajectory import Trajectory
    log, calls = reference_setup(tmp_path, monkeypatch)
    lg = load_log(log)
    obs = [f.cameras[sorted(f.cameras)[0]] for f in lg.frames[3:5]]
    Trajectory(lg.cameras[obs[0].sensor].camera, np.array([o.timestamp_us for o in obs]),
               np.stack([lg.T_world_camera(o) for o in obs])).save(tmp_path / "t.json")
    args = ["render", str(tmp_path / "scene"), "--trajectory", str(tmp_path / "t.json"), "--no-video", "--repair"]
    assert main(args + [str(tmp_path / "model"), "--out", str(tmp_path / "r"), "--references-log", str(log)]) == 0
    assert len(calls) == 2 and all(len(r) == 2 and r[0][1].any() for r in calls)  # each frame's nearest views seen
    assert main(args + [str(tmp_path / "model"), "--out", str(tmp_path / "r2")]) == 0  # no log: the render alone
    assert len(calls) == 2
    RepairModel.new(TINY).save(tmp_path / "plain")
    assert main(args + [str(tmp_path / "plain"), "--out", str(tmp_path / "r3"), "--references-log", str(log)]) == 2


def test_render_says_when_a_reference_model_gets_no_log(tmp_path, capsys):
    """`gsim render --repair` of a model with reference slots and no --references-log: said on stderr."""
    from argparse import Namespace

    from gsim.diffusion.cli import open_render_repairer
    RepairModel.new(RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20, references=2)).save(tmp_path / "m")
    a = Namespace(repair=str(tmp_path / "m"), pretrained=None, controlnet=None, strength=0.35, sd_steps=20,
                  paste_references=False, references_log=None)
    assert open_render_repairer(a).config.references == 2
    err = capsys.readouterr().err
    assert "takes 2 reference(s)" in err and "without --references-log" in err
    RepairModel.new(RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20)).save(tmp_path / "m0")
    open_render_repairer(Namespace(**{**vars(a), "repair": str(tmp_path / "m0")}))
    assert capsys.readouterr().err == ""
