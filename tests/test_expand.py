"""Scene expansion (`gsim.diffusion.expand`): where new surfels go, the distillation end to end on a tiny
reconstruction (the training views keep their quality), and bad input."""
import json

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

import gsim  # noqa: E402
from gsim.diffusion.expand import ExpandOptions, expand, fill_points  # noqa: E402
from gsim.diffusion.repair import RepairConfig, RepairModel  # noqa: E402
from gsim.transforms import look_at  # noqa: E402


def test_holes_take_the_enclosing_surface_the_ground_or_stay_sky():
    cam = gsim.PinholeCamera(40, 30, 20.0, 20.0, 20.0, 15.0)
    T = look_at([0.0, 0.0, 1.5], [10.0, 0.0, 1.5])  # looking along +x, 1.5 m above the ground z = 0
    H, W = 30, 40
    v = np.arange(H)[:, None] + 0.5
    road = np.where(v > 15, 1.5 * 20.0 / np.maximum(v - 15, 1e-6), 0.0) * np.ones((1, W))  # camera z on the road
    depth = np.where(road > 0, np.minimum(road, 8.0), 0.0)  # a wall 8 m ahead stands on the road
    depth[8:15] = 8.0  # and rises above the horizon; rows 0-7 are sky
    alpha = (depth > 0).astype(np.float32)
    alpha[10:14, 18:22] = 0.0  # a gap in the wall: takes the wall's depth
    alpha[25:30, :10] = 0.0  # unseen road: on the road
    alpha[0:12, 30:40] = 0.0  # sky reaching into the wall's corner: nothing
    image = np.full((H, W, 3), 0.3, np.float32)
    pts, rgb, normals, size, filled = fill_points(cam, T, image, alpha, depth, ExpandOptions(fill_stride=1))
    assert filled.sum() == len(pts) and not filled[:8].any()
    gap = np.abs(pts[:, 0] - 8.0) < 1e-3
    assert gap.sum() == 16 and len(pts) == 16 + 50  # the 4x4 gap and the 5x10 road hole, nothing of the sky
    assert np.allclose(pts[~gap, 2], 0.0, atol=1e-3) and np.allclose(normals[~gap], [0, 0, 1])
    assert np.allclose(normals[gap], [-1, 0, 0], atol=0.25) and np.allclose(rgb, 0.3) and (size > 0).all()
    assert len(fill_points(cam, T, image, np.ones((H, W)), depth, ExpandOptions())[0]) == 0


def test_options_are_checked():
    assert ExpandOptions(shifts=(3, 1, 2)).shifts == (1.0, 2.0, 3.0)
    for bad in ((0,), (-1, 2), (11,)):
        with pytest.raises(ValueError, match="shifts"):
            ExpandOptions(shifts=bad)
    with pytest.raises(ValueError, match="shifts or ahead"):
        ExpandOptions(shifts=())
    with pytest.raises(ValueError, match="iterations"):
        ExpandOptions(iterations=0)


@pytest.fixture(scope="module")
def recon(tmp_path_factory):
    from gsim.scenes.init import InitOptions
    from gsim.scenes.synth import SynthOptions, synthesize
    from gsim.scenes.train import preset, reconstruct
    root = tmp_path_factory.mktemp("expand")
    log = synthesize(root / "log", seed=3, options=SynthOptions(n_frames=9, width=64, height=40, supersample=1,
                                                                lidar_beams=16, lidar_azimuth_resolution_deg=1.0),
                     progress=False)
    cfg = preset("cpu", iterations=40, checkpoint_every=40, downscale=2,
                 init=InitOptions(voxel_m=0.4, max_surfels=20_000))
    return log, reconstruct(log, root / "out", cfg, progress=False)


def _train_psnr(scene, log):
    from gsim.scenes.evaluate import image_metrics, render_image
    from gsim.scenes.log import load_log
    from gsim.scenes.views import make_views, split_frames
    lg = load_log(log)
    views = make_views(lg, split_frames(lg)[0], 2)
    return np.mean([image_metrics(render_image(scene, v.camera, v.T_world_camera, v.timestamp_us, v.sensor)[0],
                                  v.image)["psnr"] for v in views])


def test_expand_distils_and_keeps_the_training_views(recon, tmp_path):
    log, scene_dir = recon
    model = RepairModel.new(RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20))
    torch.nn.init.normal_(model.unet.conv_out.weight, std=0.05)  # a model that changes what it sees
    opts = ExpandOptions(shifts=(1.0, 2.0), iterations=30, every=4)
    summary = expand(scene_dir, log, model, tmp_path / "x", opts, progress=False)
    assert [s["shift_m"] for s in summary["stages"]] == [1.0, 2.0]
    assert all(s["pseudo_views"] == 2 * 6 for s in summary["stages"])  # 21 training views, every 4th, both sides
    assert all(0 < s["taught_fraction"] <= 1 for s in summary["stages"])
    assert json.loads((tmp_path / "x" / "expand.json").read_text())["first_step"] == 40
    before, after = gsim.load_scene(scene_dir), gsim.load_scene(tmp_path / "x" / "scene")
    assert len(after.background) == summary["stages"][-1]["surfels"] - sum(len(a.surfels) for a in after.actors)
    assert _train_psnr(after, log) > _train_psnr(before, log) - 0.2
    again = expand(tmp_path / "x", log, model, tmp_path / "y", ExpandOptions(shifts=(), ahead=(5.0,), iterations=5),
                   progress=False)  # an expanded scene expands further (its checkpoint continues), here ahead
    assert again["first_step"] == 40 + 60
    assert again["stages"][0]["ahead_m"] == 5.0 and again["stages"][0]["pseudo_views"] == 3  # the last frame's cameras


def test_a_scene_without_its_checkpoint_is_refused(recon, tmp_path):
    log, scene_dir = recon
    gsim.load_scene(scene_dir).save(tmp_path / "alone" / "scene")
    with pytest.raises(FileNotFoundError, match="gsim reconstruct --out"):
        expand(tmp_path / "alone" / "scene", log, None, tmp_path / "x", progress=False)


def test_gsim_expand_without_a_model_says_how_to_get_one(recon, tmp_path, capsys):
    from gsim.cli import main
    log, scene_dir = recon
    assert main(["expand", str(scene_dir), str(log), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "gsim diffusion train" in err and "--pretrained" in err and not (tmp_path / "x").exists()
    assert main(["expand", str(scene_dir), str(log), "--out", str(tmp_path / "x"), "--model", str(tmp_path / "no")]) == 2
    assert "gsim diffusion train" in capsys.readouterr().err


def test_pseudo_views_teach_only_where_the_repair_changed_the_render_or_it_was_a_hole():
    from gsim.diffusion.expand import corrected
    render = np.full((20, 30, 3), 0.5, np.float32)
    repaired = render + 0.01  # the repair's noise softens everything a little: not a correction
    repaired[5:8, 10:14] = 0.9
    filled = np.zeros((20, 30), bool)
    filled[15:, 25:] = True
    m = corrected(render, repaired, filled, ExpandOptions())
    assert m[5:8, 10:14].all() and m[3:10, 8:16].all() and not m[:2].any()  # dilated by 2 px
    assert m[15:, 25:].all() and m.sum() == 7 * 8 + 5 * 5
