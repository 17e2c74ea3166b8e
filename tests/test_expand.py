"""Scene expansion (`gsim.diffusion.expand`): where new surfels go, the distillation end to end on a tiny
reconstruction (the training views keep their quality), and bad input."""
import dataclasses
import json

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

import gsim  # noqa: E402
from gsim.diffusion.expand import ExpandOptions, clear_pose, expand, fill_points, seen_through  # noqa: E402
from gsim.diffusion.repair import RepairConfig, RepairModel  # noqa: E402
from gsim.errors import InputError  # noqa: E402
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


def test_fills_a_training_view_saw_through_are_dropped():
    """From a moved camera, the surface nearest a hole can be a foreground one; a fill at its depth would float
    in space the log's own camera saw empty (the 3 m stage of seed 7 diverged on such fills): it is dropped."""
    cam = gsim.PinholeCamera(40, 30, 20.0, 20.0, 20.0, 15.0)
    T = look_at([0.0, 0.0, 1.5], [10.0, 0.0, 1.5])
    wall = np.full((30, 40), 12.0)  # the training view saw a wall 12 m ahead
    wall[:, :5] = np.inf  # the sky in its left columns
    wall[:, 35:] = 0.0  # and something not solid in its right ones (nothing known there)
    seen = [(cam, T, wall)]
    points = np.array([[6.0, 0.0, 1.5],  # in front of the wall: seen through
                       [11.5, 0.0, 1.5],  # within the margin (10% of 12 m) before it: kept
                       [14.0, 0.0, 1.5],  # behind it: unknown, kept
                       [6.0, 0.0, -20.0],  # below the view: unknown, kept
                       [-6.0, 0.0, 1.5],  # behind the camera: kept
                       [40.0, 33.0, 1.5],  # where it saw the sky, however far: seen through
                       [6.0, -5.0, 1.5]])  # where it saw nothing solid nor the sky: kept
    assert seen_through(points, seen, 0.1).tolist() == [True, False, False, False, False, True, False]
    # a camera 3 m to the right sees a hole (a gap between foreground posts 5 m ahead): its fill would sit at
    # the posts' depth, in front of the wall the training view saw; the hole stays empty
    moved = look_at([0.0, -3.0, 1.5], [10.0, -3.0, 1.5])
    depth = np.full((30, 40), 5.0)
    alpha = np.ones((30, 40), np.float32)
    alpha[10:14, 18:22] = 0.0
    image = np.full((30, 40, 3), 0.3, np.float32)
    opt = ExpandOptions(fill_stride=1)
    assert len(fill_points(cam, moved, image, alpha, depth, opt)[0]) == 16
    pts, *_, filled = fill_points(cam, moved, image, alpha, depth, opt, seen)
    assert len(pts) == 0 and not filled.any()


def test_sights_are_what_a_training_view_saw_surface_or_sky():
    from types import SimpleNamespace

    from gsim.diffusion.expand import sights
    from support import plane
    cam = gsim.PinholeCamera(40, 30, 20.0, 20.0, 20.0, 15.0)
    view = SimpleNamespace(camera=cam, T_world_camera=look_at([0.0, 0.0, 1.5], [10.0, 0.0, 1.5]), timestamp_us=0,
                           sensor="front")
    [(_, T, far)] = sights(gsim.Scene(background=plane()), [view])  # a ground plane 30 m around, nothing above
    assert np.allclose(T, view.T_world_camera)
    assert np.isinf(far[:12]).all()  # above the horizon: the sky
    rows = np.arange(24, 30)
    assert np.allclose(far[24:, 20], 1.5 * 20.0 / (rows + 0.5 - 15.0), rtol=0.05)  # the ground's camera z
    # a fill floating in the sky ahead (a wall put in a sky pocket) is seen through; one under the road is not
    assert seen_through(np.array([[8.0, 0.0, 3.0], [4.0, 0.0, -0.5]]), [(cam, T, far)], 0.1).tolist() == [True, False]


def test_a_moved_camera_teaches_only_from_free_space_with_room_around_it():
    cam = gsim.PinholeCamera(40, 30, 20.0, 20.0, 20.0, 15.0)
    seen = [(cam, look_at([0.0, 0.0, 1.5], [10.0, 0.0, 1.5]), np.full((30, 40), 12.0))]  # a wall 12 m ahead
    far, solid = np.full((30, 40), 8.0), np.ones((30, 40))
    moved = lambda x: look_at([x, 0.5, 1.5], [x + 10.0, 0.5, 1.5])  # noqa: E731
    opt = ExpandOptions()
    assert clear_pose(moved(3.0), solid, far, seen, opt)  # the log saw through where it stands
    assert not clear_pose(moved(13.0), solid, far, seen, opt)  # behind the wall: inside something
    flank = far.copy()
    flank[:, :8] = 0.6  # a car's flank 0.6 m away fills a fifth of the view
    assert not clear_pose(moved(3.0), solid, flank, seen, opt)
    assert clear_pose(moved(3.0), np.where(flank < 1, 0.0, solid), flank, seen, opt)  # (a transparent one: fine)


def test_options_are_checked():
    assert ExpandOptions(shifts=(3, 1, 2)).shifts == (1.0, 2.0, 3.0)
    for bad in ((0,), (-1, 2), (11,)):
        with pytest.raises(ValueError, match="shifts"):
            ExpandOptions(shifts=bad)
    with pytest.raises(ValueError, match="shifts or ahead"):
        ExpandOptions(shifts=())
    with pytest.raises(ValueError, match="iterations"):
        ExpandOptions(iterations=0)
    for bad in (dict(carve_margin=1.0), dict(carve_margin=float("nan")), dict(clearance_m=-1.0), dict(max_near=1.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ExpandOptions(**bad)


@pytest.fixture(scope="module")
def recon(tmp_path_factory):
    from gsim.scenes.reconstruction.init import InitOptions
    from gsim.scenes.synth import SynthOptions, synthesize
    from gsim.scenes.reconstruction.train import preset, reconstruct
    root = tmp_path_factory.mktemp("expand")
    log = synthesize(root / "log", seed=3, options=SynthOptions(n_frames=9, width=64, height=40, supersample=1,
                                                                lidar_beams=16, lidar_azimuth_resolution_deg=1.0),
                     progress=False)
    cfg = preset("cpu", iterations=40, checkpoint_every=40, downscale=2,
                 init=InitOptions(voxel_m=0.4, max_surfels=20_000))
    return log, reconstruct(log, root / "out", cfg, progress=False)


def _train_psnr(scene, log):
    from gsim.images import image_metrics, render_image
    from gsim.scenes.log import load_log
    from gsim.scenes.reconstruction.views import make_views, split_frames
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


def test_pseudo_views_teach_only_where_the_references_agree(recon, tmp_path, monkeypatch):
    """The confidence gate: a pseudo view's mask is cut to where the real references agree (here, as if they agreed
    on the left half only), and the stage says what share passed; without the gate the right half teaches too."""
    import gsim.diffusion.expand as ex
    log, scene_dir = recon
    model = RepairModel.new(RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20))
    torch.nn.init.normal_(model.unet.conv_out.weight, std=0.05)  # a model that changes what it sees
    masks, real_view = [], ex.pseudo_view
    monkeypatch.setattr(ex, "pseudo_view", lambda v, T, image, mask: masks.append(mask.copy()) or
                        real_view(v, T, image, mask))

    def left_half(scene, log, camera, T, t, k, alpha, depth, lidar, **nearest):
        agreed = np.zeros(alpha.shape, bool)
        agreed[:, :agreed.shape[1] // 2] = True
        return None, agreed
    monkeypatch.setattr(ex, "agreed_references", left_half)
    opts = ExpandOptions(shifts=(1.0,), iterations=5, every=4)
    stage = expand(scene_dir, log, model, tmp_path / "x", opts, progress=False)["stages"][0]
    assert masks and not any(m[:, m.shape[1] // 2:].any() for m in masks)
    assert 0 < stage["gate_pass_fraction"] < 1
    masks.clear()
    stage = expand(scene_dir, log, model, tmp_path / "y", dataclasses.replace(opts, gate=False), progress=False)
    assert stage["stages"][0]["gate_pass_fraction"] is None and any(m[:, m.shape[1] // 2:].any() for m in masks)
    for out in ("x", "y"):  # the scene keeps the LiDAR head it was trained with, gated or not
        assert gsim.load_scene(tmp_path / out / "scene").lidar_head is not None


def test_a_scene_without_its_checkpoint_is_refused(recon, tmp_path):
    log, scene_dir = recon
    gsim.load_scene(scene_dir).save(tmp_path / "alone" / "scene")
    with pytest.raises(InputError, match="gsim reconstruct --out"):
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


@pytest.fixture(scope="module")
def small_recon(tmp_path_factory):
    """A smaller reconstruction of another synthetic seed (5)."""
    from gsim.scenes.reconstruction.init import InitOptions
    from gsim.scenes.synth import SynthOptions, synthesize
    from gsim.scenes.reconstruction.train import preset, reconstruct
    root = tmp_path_factory.mktemp("guard")
    log = synthesize(root / "log", seed=5, options=SynthOptions(
        n_frames=9, width=48, height=32, supersample=1, lidar_beams=8, lidar_azimuth_resolution_deg=2.0),
        progress=False)
    cfg = preset("cpu", iterations=30, checkpoint_every=30, downscale=2, init=InitOptions(voxel_m=0.5,
                                                                                         max_surfels=8_000))
    return log, reconstruct(log, root / "out", cfg, progress=False)


@pytest.fixture(params=["recon", "small_recon"], ids=["seed3", "seed5"])
def either_recon(request):
    """The fix and the guard on two seeds."""
    return request.getfixturevalue(request.param)


def collapse_at_stage(monkeypatch, stage: int):
    """From the given stage (1-based) on, the first surfels a stage adds come with every opacity pushed near 0:
    the collapse seen when an expansion diverged (the background's median opacity fell 0.66 -> 0.39)."""
    import gsim.diffusion.expand as ex
    import gsim.scenes.reconstruction.train as tr
    stages, add = [], ex.add_surfels

    def counting(run):
        stages.append(False)
        return real_snapshot(run)

    def collapsing(run, *fill):
        n = add(run, *fill)
        if len(stages) >= stage and not stages[-1]:
            stages[-1] = True
            with torch.no_grad():
                run.model.params["logit_opacities"] -= 8.0
        return n
    real_snapshot = tr.snapshot
    monkeypatch.setattr(tr, "snapshot", counting)
    monkeypatch.setattr(ex, "add_surfels", collapsing)


def test_a_collapsing_stage_is_undone_and_the_last_good_scene_kept(either_recon, tmp_path, monkeypatch):
    log, scene_dir = either_recon
    collapse_at_stage(monkeypatch, 2)
    model = RepairModel.new(RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20))
    opts = ExpandOptions(shifts=(1.0, 2.0, 3.0), iterations=30, every=4, allow_worse=True)
    with pytest.warns(UserWarning, match="2 m beside stage was undone"):
        summary = expand(scene_dir, log, model, tmp_path / "x", opts, progress=False)
    first, second = summary["stages"]  # the 3 m stage never ran: it would build on the undone one
    assert first["kept"] and not second["kept"] and "stopped" in second
    assert second["surfels"] == first["surfels"]  # back to the first stage's scene, its added surfels included
    assert json.loads((tmp_path / "x" / "expand.json").read_text())["stages"][1]["kept"] is False
    before, after = gsim.load_scene(scene_dir), gsim.load_scene(tmp_path / "x" / "scene")
    assert len(after.background) + sum(len(a.surfels) for a in after.actors) == first["surfels"]
    assert np.median(after.background.opacities) > 0.5 * np.median(before.background.opacities)  # not collapsed


def test_an_expansion_with_no_stage_kept_writes_no_scene(small_recon, tmp_path, monkeypatch):
    from gsim.diffusion.expand import ExpansionRefused
    log, scene_dir = small_recon
    collapse_at_stage(monkeypatch, 1)
    model = RepairModel.new(RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20))
    with pytest.warns(UserWarning, match="undone"), pytest.raises(ExpansionRefused, match="no stage could be kept"):
        expand(scene_dir, log, model, tmp_path / "x", ExpandOptions(shifts=(1.0,), iterations=20, every=4),
               progress=False)
    assert not (tmp_path / "x" / "scene").exists() and not (tmp_path / "x" / "checkpoint.safetensors").exists()
    assert json.loads((tmp_path / "x" / "expand.json").read_text())["refused"] == "no stage could be kept"


def test_a_scene_worse_on_held_out_views_is_refused_unless_allowed(small_recon, tmp_path, monkeypatch):
    import gsim.diffusion.expand as ex
    from gsim.diffusion.expand import ExpansionRefused
    log, scene_dir = small_recon
    measured = []
    real = ex.held_out_psnr

    def worse(scene, views):  # the real measurement, then 0.3 dB off it after the expansion
        measured.append(real(scene, views))
        return measured[0] - 0.3 * (len(measured) - 1)
    monkeypatch.setattr(ex, "held_out_psnr", worse)
    model = RepairModel.new(RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20))
    opts = ExpandOptions(shifts=(1.0,), iterations=10, every=4)
    with pytest.raises(ExpansionRefused, match="0.30 dB worse"):
        expand(scene_dir, log, model, tmp_path / "x", opts, progress=False)
    assert not (tmp_path / "x" / "scene").exists()
    assert 10 < measured[0] < 60  # a real PSNR of the log's held-out views
    measured.clear()
    s = expand(scene_dir, log, model, tmp_path / "y", dataclasses.replace(opts, allow_worse=True), progress=False)
    assert s["held_out_psnr_after"] == pytest.approx(s["held_out_psnr_before"] - 0.3)
    assert (tmp_path / "y" / "scene" / "scene.json").is_file()


def test_pseudo_views_leave_the_training_views_pose_corrections_alone(either_recon):
    """A pseudo view is rendered where the scene puts its camera; learning the training view's pose correction
    from it (a repaired image taken metres away) dragged the scene's poses."""
    from gsim.diffusion.expand import checkpoint_of, pseudo_view
    from gsim.scenes.reconstruction.train import TrainConfig, load_state, start, train_step
    log, scene_dir = either_recon
    state = load_state(checkpoint_of(scene_dir))
    t = start(log, TrainConfig.from_dict(state["config"]), state)
    assert t.run.cfg.refines_views
    v = t.views[3]
    offsets = lambda: [x.detach().clone() for x in t.run.model.view_offsets.values()]  # noqa: E731
    was = offsets()
    fake = pseudo_view(v, v.T_world_camera, np.clip(v.image[::-1] + 0.2, 0, 1), np.ones(v.image.shape[:2]))
    for _ in range(3):
        train_step(t.run, fake, {}, t.log)
    assert all(torch.equal(a, b) for a, b in zip(was, offsets()))
    train_step(t.run, dataclasses.replace(fake, pose_corrected=False), {}, t.log)  # a view that may learn it
    assert not all(torch.equal(a, b) for a, b in zip(was, offsets()))


def test_a_model_with_reference_slots_repairs_each_pseudo_view_with_its_references(recon, tmp_path, monkeypatch):
    from gsim.diffusion import references as refs_mod
    log, scene_dir = recon
    model = RepairModel.new(RepairConfig(channels=(8, 16), train_timesteps=100, repair_t=20, references=2))
    torch.nn.init.normal_(model.unet.conv_out.weight, std=0.05)
    real, found = refs_mod.references, []

    def spy(*args, **kwargs):
        found.append(real(*args, **kwargs))
        return found[-1]
    monkeypatch.setattr(refs_mod, "references", spy)
    # (without the confidence gate, whose own references would be counted too)
    summary = expand(scene_dir, log, model, tmp_path / "x", ExpandOptions(shifts=(1.0,), iterations=5, every=4,
                                                                          gate=False), progress=False)
    assert summary["stages"][0]["pseudo_views"] == 2 * 6 == len(found)  # every repaired view had its references
    assert all(len(r) == 2 for r in found) and any(valid.any() for r in found for _, valid in r)
