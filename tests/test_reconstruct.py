"""Reconstruction on a tiny synthetic log: initialisation, training, resume, evaluation, bad input."""
import contextlib
import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import gsim
from gsim.errors import InputError
from gsim.images import render_image
from gsim.scenes.reconstruction import losses, train as train_mod
from gsim.scenes.evaluation.evaluate import evaluate
from gsim.scenes.reconstruction.init import InitOptions, initial_surfels
from gsim.scenes.log import LogWriter, load_log
from gsim.scenes.reconstruction.model import SceneModel
from gsim.scenes.reconstruction.optim import DensifyOptions
from gsim.scenes.synth import SynthOptions, synthesize
from gsim.scenes.reconstruction.train import preset, reconstruct
from gsim.scenes.reconstruction.views import make_views, split_frames, sweep_world
from support import own_device_waits

TINY = SynthOptions(n_frames=9, width=64, height=40, supersample=1, lidar_beams=16, lidar_azimuth_resolution_deg=1.0)


def _cfg(**kw):
    base = dict(iterations=12, checkpoint_every=4, normal_from=3, init=InitOptions(voxel_m=0.4, max_surfels=20_000),
                densify=DensifyOptions(start=2, stop=12, every=3, grad_threshold=1e-5))
    return preset("cpu", **{**base, **kw})


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("synth") / "log", seed=3, options=TINY, progress=False)


@pytest.fixture(scope="module")
def trained(log_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("recon")
    # densification as in a real run (default threshold), not the test's aggressive one
    reconstruct(log_dir, out, _cfg(iterations=30, checkpoint_every=10, densify=DensifyOptions(start=10, stop=25, every=10)),
                progress=False)
    return out


def test_init_puts_actor_points_in_their_boxes(log_dir):
    log = load_log(log_dir)
    train, held = split_frames(log)
    assert [f.index for f in held] == [0, 8] and all(f.index % 8 for f in train)
    opt = InitOptions(voxel_m=0.2)
    bg, actors = initial_surfels(log, train, opt)
    assert len(bg) > 1000 and sum(len(a) for a in actors.values()) > 0
    for track in log.actors:
        s = actors[track.id]
        if len(s):  # box frame: inside the box (plus the margin)
            assert np.all(np.abs(s.means) <= np.asarray(track.size) / 2 + opt.box_margin_m + 1e-5)
        # and no background surfel sits inside any box at the training times
        for f in train:
            T = np.linalg.inv(track.pose_at(f.timestamp_us))
            local = bg.means @ T[:3, :3].T + T[:3, 3]
            assert not np.any(np.all(np.abs(local) < np.asarray(track.size) / 2 - 0.3, axis=1))
    # the road is flat: most surfels low above the ground face up
    low = bg.means[:, 2] < 0.05
    normals = gsim.transforms.quat_to_rotmat(bg.quats[low].astype(np.float64))[:, :, 2]
    assert np.median(normals[:, 2]) > 0.95


def test_unseen_points_take_a_coarser_voxel():
    """What no camera saw (the LiDAR's alone) takes ``unseen`` voxels; what a camera saw keeps the fine one."""
    from gsim.scenes.reconstruction.init import _Points, _within
    g = np.stack(np.meshgrid(np.arange(0, 6, 0.05), np.arange(0, 6, 0.05)), -1).reshape(-1, 2)
    xyz = np.c_[g, np.zeros(len(g))]
    seen = xyz[:, 0] < 3
    p = _Points([xyz], [xyz + [0, 0, 2]], [np.full((len(xyz), 3), 0.5)], [seen])
    same, coarse = (_within(p, 0.2, 10**6, InitOptions(), unseen) for unseen in (1.0, 3.0))
    n_left = lambda s: int((s.means[:, 0] < 2.9).sum())
    assert n_left(coarse) == n_left(same) > 0  # the seen half is the same
    right = lambda s: len(s) - n_left(s)
    assert 6 <= right(same) / right(coarse) <= 12  # about 3^2 fewer on a plane
    assert len(_within(p, 0.2, len(coarse) - 1, InitOptions(), 3.0)) < len(coarse)  # the budget still holds


def test_points_seeded_above_the_lidar_lie_on_the_facades(log_dir):
    """Image points seeded above the LiDAR's top beam, re-cast analytically from the side cameras
    (which face the facades; the front camera sees them at grazing angles, where a column's wall
    depth is only a first guess): most of those whose ray meets a building lie on it."""
    from gsim.scenes.reconstruction.init import _above_lidar, _cameras_seeing
    from gsim.scenes.synth import BUILDING, build_street
    log, street = load_log(log_dir), build_street(3, TINY)
    f = log.frames[4]
    world, _, _, _ = sweep_world(log, f.lidars["top"])
    xyz, origin, rgb, src = _above_lidar(_cameras_seeing(log, f, world), world, np.ones(len(world), bool),
                                         InitOptions(above_stride=2))
    assert np.all(src >= 0)  # each took the depth of a LiDAR point (no interpolation without actors)
    assert len(xyz) > 100 and rgb.shape == xyz.shape
    ratios = []
    for name in ("front_left", "front_right"):
        o = log.T_world_camera(f.cameras[name])[:3, 3]
        sel = np.all(np.isclose(origin, o), axis=1)
        assert sel.sum() > 30, name
        hits = street.raycast(o, xyz[sel] - o, f.timestamp_us)  # t = 1 on the seeded point
        ratios.append(hits.t[hits.material == BUILDING])
    ratios = np.concatenate(ratios)
    assert len(ratios) > 50
    # most lie on the facade below them; the rest on a building seen above it, farther away
    assert np.median(np.abs(ratios - 1)) < 0.02 and np.mean(np.abs(ratios - 1) < 0.05) > 0.6


def test_points_seeded_above_an_actor_take_the_walls_beside_it(log_dir):
    """Columns whose highest LiDAR point belongs to an actor below the top beam get seeds at the depth
    of the walls on either side (what is above the actor is behind it), and those lie on the facade;
    above an actor the top beam hits (a truck beside the ego, maybe taller than seen) they take its depth
    and name its point, so that they go to that actor (collect_points), none to the background."""
    from gsim.scenes.reconstruction.init import _above_lidar, _cameras_seeing
    from gsim.scenes.synth import BUILDING, build_street
    from gsim.scenes.reconstruction.views import CLIP_M, above_top_beam, top_beam_tan
    log, street = load_log(log_dir), build_street(3, TINY)
    f = log.frames[4]
    world, origin, _, _ = sweep_world(log, f.lidars["top"])
    T = log.T_world_camera(f.cameras["front_left"])
    Tcw = np.linalg.inv(T)
    seen = _cameras_seeing(log, f, world)
    left = next(c for c in seen if np.allclose(c.T_world_camera, T))
    W = left.camera.width
    lo, hi = int(0.4 * W), int(0.56 * W)  # columns that look at one facade (a step in depth is unknowable)
    band = np.zeros(len(world), bool)
    band[left.idx[(left.pix % W >= lo) & (left.pix % W < hi)]] = True

    def seeded_above_band(keep, background):
        w, o = world[keep], origin[keep]
        clipped = above_top_beam(top_beam_tan(log, f.lidars["top"]), w, o) > -CLIP_M
        xyz, org, _, src = _above_lidar(_cameras_seeing(log, f, w), w, background[keep],
                                        InitOptions(above_stride=2), clipped)
        cam = np.all(np.isclose(org, T[:3, 3]), axis=1)
        uv, _ = left.camera.project(xyz[cam] @ Tcw[:3, :3].T + Tcw[:3, 3])
        sel = (uv[:, 0] >= lo + 2) & (uv[:, 0] < hi - 2)
        src = src[cam][sel]
        return xyz[cam][sel], np.where(src >= 0, np.nonzero(keep)[0][np.maximum(src, 0)], -1)

    # an actor up to the camera's height hides the facade's foot; the beams above it find nothing
    low = world[:, 2] < T[2, 3]
    above, src = seeded_above_band(~band | low, ~band)
    # interpolated, or a wall point's at the band's edges (none before: the columns were left empty)
    assert len(above) > 10 and np.mean(src == -1) > 0.5 and not band[src[src >= 0]].any()
    hits = street.raycast(T[:3, 3], above - T[:3, 3], f.timestamp_us)
    ratios = hits.t[hits.material == BUILDING]
    assert len(ratios) > 5 and np.median(np.abs(ratios - 1)) < 0.05
    # an actor whose top the top beam hits: its own points' depths
    above, src = seeded_above_band(np.ones(len(world), bool), ~band)
    assert len(above) > 10 and np.all(band[src])
    depth = lambda x: np.linalg.norm(x - T[:3, 3], axis=1)
    assert np.median(np.abs(depth(above) - np.median(depth(world[src])))) < 1.0


def test_seeds_above_a_clipped_actor_go_into_its_box(log_dir, monkeypatch):
    """Where every LiDAR point counts as at the top beam (clipped), the image points above an actor's
    highest point are that actor's, in its box frame and within its box; the background gets none of them."""
    from gsim.scenes.reconstruction import init as init_mod
    log = load_log(log_dir)
    train, _ = split_frames(log)
    opt = InitOptions(above_stride=2)
    bg0, _, act0 = init_mod.collect_points(log, train, opt)
    monkeypatch.setattr(init_mod, "above_top_beam", lambda tan, w, o: np.zeros(len(w)))
    bg1, _, act1 = init_mod.collect_points(log, train, opt)
    count = lambda p: sum(len(x) for x in p.xyz)
    gained = {a.id: count(act1[a.id]) - count(act0[a.id]) for a in log.actors}
    assert sum(gained.values()) > 20 and min(gained.values()) >= 0
    for a in log.actors:
        xyz = np.concatenate(act1[a.id].xyz) if act1[a.id].xyz else np.zeros((0, 3))
        assert np.all(np.abs(xyz) <= np.asarray(a.size) / 2 + opt.box_margin_m + 1e-6)
    assert count(bg1) <= count(bg0)  # blocks over actors no longer interpolate walls: fewer, none moved in


def training_view_gain(log_dir, scene, init: InitOptions, backend: str = "auto") -> float:
    """Mean PSNR gain (dB) of ``scene`` over the initial surfels on two training views."""
    log = load_log(log_dir)
    train, _ = split_frames(log)
    views = make_views(log, train[:2])
    bg, actors = initial_surfels(log, train, init)
    init_scene = SceneModel.from_surfels(bg, actors, log.actors, sorted(log.cameras)).to_scene()

    def mean_psnr(sc):
        return np.mean([losses.psnr(render_image(sc, v.camera, v.T_world_camera, v.timestamp_us, v.sensor, backend)[0],
                                    v.image) for v in views])
    return mean_psnr(scene) - mean_psnr(init_scene)


def test_training_improves_training_views_and_scene_has_actors(log_dir, trained):
    log = load_log(log_dir)
    scene = gsim.load_scene(trained / "scene")
    assert training_view_gain(log_dir, scene, _cfg().init) > 1.0
    assert {a.id for a in scene.actors} <= {t.id for t in log.actors} and scene.actors
    assert scene.sky is not None and set(scene.appearance) == set(log.cameras)
    # actors ride their tracks: at two times the actor's surfels sit inside its box there
    a = scene.actors[0]
    track = next(t for t in log.actors if t.id == a.id)
    for t in (0, int(log.frames[-1].timestamp_us)):
        world = scene.at(t).means[-len(a.surfels):] if a is scene.actors[-1] else None
        placed = a.surfels.transformed(a.pose_at(t)).means
        T = np.linalg.inv(track.pose_at(t))
        local = placed @ T[:3, :3].T + T[:3, 3]
        assert np.all(np.abs(local) <= np.asarray(track.size) / 2 + 1.0)
        if world is not None:
            assert np.allclose(world, placed, atol=1e-5)
    meta = json.loads((trained / "train.json").read_text())
    assert meta["iterations"] == 30 and 0 not in meta["train_frames"] and 8 not in meta["train_frames"]


def test_geometry_losses_start_at_normal_from(log_dir):
    """The 2DGS depth distortion joins the loss from ``normal_from`` on, weighted by distortion_weight."""
    log = load_log(log_dir)
    train, _ = split_frames(log)
    view = make_views(log, train[:1])[0]
    bg, actors = initial_surfels(log, train, _cfg().init)

    def loss(step, weight):
        cfg = _cfg(normal_from=5, normal_weight=0.0, distortion_weight=weight)
        run = train_mod._Run(cfg, SceneModel.from_surfels(bg, actors, log.actors, sorted(log.cameras)), 1.0)
        run.step = step
        return train_mod.train_step(run, view, {}, log)[0]

    assert loss(4, 100.0) == loss(4, 0.0)  # before normal_from: no distortion term
    assert loss(5, 100.0) > loss(5, 0.0) + 1e-6


def test_the_torch_reference_trains_without_non_finite_parameters(tmp_path):
    """Rays that graze a surfel's plane (the ray-splat distance's denominator near 0) where the screen-space
    filter wins: the reference backed 0 x infinity into them, and every surfel was NaN after three steps of this
    street (the loss stayed finite: NaN surfels are culled)."""
    log = synthesize(tmp_path / "log", seed=3, options=dataclasses.replace(TINY, width=160, height=100),
                     progress=False)
    t = train_mod.start(log, preset("cpu", backend="torch", iterations=100))
    for i in range(3):
        train_mod.train_step(t.run, t.views[i], t.sweeps, t.log, robust=t.robust)
        t.run.step += 1
    for k, v in t.run.model.params.items():
        assert torch.isfinite(v).all(), k


def test_a_diverged_step_is_refused(log_dir):
    log = load_log(log_dir)
    train, _ = split_frames(log)
    view = make_views(log, train[:1])[0]
    bg, actors = initial_surfels(log, train, _cfg().init)
    run = train_mod._Run(_cfg(), SceneModel.from_surfels(bg, actors, log.actors, sorted(log.cameras)), 1.0)
    with torch.no_grad():
        run.model.params["sh"][:] = float("nan")
    with pytest.raises(FloatingPointError, match="loss is nan at step 0 .*diverged"):
        train_mod.train_step(run, view, {}, log)


def test_unsynchronised_steps_are_checked_when_settled(log_dir):
    """A GPU run's steps (sync=False) return device tensors and skip the per-step check; `_settled` reads a batch
    back at once, gives their PSNRs and names the first non-finite loss's step and view."""
    log = load_log(log_dir)
    train, _ = split_frames(log)
    views = make_views(log, train[:2])
    bg, actors = initial_surfels(log, train, _cfg().init)
    run = train_mod._Run(_cfg(), SceneModel.from_surfels(bg, actors, log.actors, sorted(log.cameras)), 1.0)
    pending = []
    for view in views:
        loss, mse = train_mod.train_step(run, view, {}, log, sync=False)
        assert torch.is_tensor(loss) and torch.is_tensor(mse) and loss.dim() == mse.dim() == 0
        pending.append((run.step, view, loss, mse))
        run.step += 1
    psnrs = train_mod._settled(pending)
    assert not pending and len(psnrs) == len(views) and all(10 < p < 60 for p in psnrs)
    with torch.no_grad():
        run.model.params["sh"][:] = float("nan")
    pending = [(7, views[1], train_mod.train_step(run, views[1], {}, log, sync=False)[0], torch.tensor(0.1))]
    with pytest.raises(FloatingPointError, match=f"loss is nan at step 7 \\(view of frame {views[1].frame}"):
        train_mod._settled(pending)


def test_resume_after_a_kill_ends_with_the_same_scene(log_dir, tmp_path, monkeypatch):
    cfg = _cfg()
    reconstruct(log_dir, tmp_path / "a", cfg, progress=False)
    real_step = train_mod.train_step

    def killed_at_6(run, *args, **kw):
        if run.step == 6:
            raise KeyboardInterrupt  # as a killed process: the checkpoint of step 4 is the last good one
        return real_step(run, *args, **kw)

    monkeypatch.setattr(train_mod, "train_step", killed_at_6)
    with pytest.raises(KeyboardInterrupt):
        reconstruct(log_dir, tmp_path / "b", cfg, progress=False)
    assert train_mod.load_state(tmp_path / "b" / train_mod.CHECKPOINT)["step"] == 4
    assert not list((tmp_path / "b").glob(".*tmp*"))
    monkeypatch.setattr(train_mod, "train_step", real_step)
    reconstruct(log_dir, tmp_path / "b", resume=True, progress=False)
    a, b = gsim.load_scene(tmp_path / "a" / "scene"), gsim.load_scene(tmp_path / "b" / "scene")
    assert len(a.background) == len(b.background)
    for k in ("means", "quats", "scales", "opacities", "colors", "features"):
        assert np.array_equal(getattr(a.background, k), getattr(b.background, k)), k
    assert np.array_equal(a.sky.envmap, b.sky.envmap)


def test_eval_writes_the_metrics_contract(log_dir, trained, tmp_path):
    m = evaluate(trained / "scene", log_dir, tmp_path / "eval", progress=False)
    on_disk = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    for k in ("psnr", "ssim", "lidar_depth_median_abs_m", "lidar_depth_mean_abs_m"):
        assert np.isfinite(on_disk[k]) and on_disk[k] == m[k]
    assert on_disk["held_out_frames"] == [0, 8]
    assert len(on_disk["views"]) == 2 * 3  # two held-out frames, three cameras
    assert 5 < m["psnr"] < 60 and 0 < m["ssim"] <= 1 and m["lidar_depth_median_abs_m"] >= 0
    images = sorted((tmp_path / "eval" / "views").glob("*.png"))
    assert len(images) == 6
    from PIL import Image
    assert Image.open(images[0]).size == (3 * TINY.width, TINY.height)
    assert "| **mean** |" in (tmp_path / "eval" / "metrics.md").read_text()
    # held-out sweeps, ray by ray: the SplatAD/NeuRAD metrics and a bird's-eye side-by-side per sweep
    for k in ("lidar_range_median_abs_m", "lidar_range_mean_abs_m", "lidar_chamfer_m", "lidar_ray_drop_accuracy",
              "lidar_intensity_rmse"):
        assert np.isfinite(on_disk[k]) and on_disk[k] >= 0, k
    assert 0.5 < m["lidar_ray_drop_accuracy"] <= 1 and m["lidar_range_median_abs_m"] < 1.0
    assert len(on_disk["lidar_sweeps"]) == 2 and len(list((tmp_path / "eval" / "lidar").glob("*.png"))) == 2


def test_trained_scene_has_a_lidar_head_that_gives_intensity(trained):
    scene = gsim.load_scene(trained / "scene")
    assert scene.lidar_head is not None and scene.background.features.shape[1] == 8
    f = gsim.render_lidar(scene, gsim.lidar.LidarSpec.preset("velodyne-vlp16"), np.eye(4), timestamp_us=0)
    assert f.intensity is not None and f.intensity.shape == f.ranges.shape
    assert np.all((f.intensity >= 0) & (f.intensity <= 1))
    assert f.drop_probability_image.shape == f.range_image.shape


def test_a_time_budget_stops_training_and_decays_the_rates_by_time(log_dir, tmp_path, monkeypatch):
    clock = iter(range(0, 1000, 10))  # each reading of the clock is 10 s after the last: the loop's first is t0
    monkeypatch.setattr(train_mod, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    decays, real_step = [], train_mod.Adam.step
    monkeypatch.setattr(train_mod.Adam, "step", lambda self, params, scales: decays.append(scales["means"])
                        or real_step(self, params, scales))
    reconstruct(log_dir, tmp_path, _cfg(max_train_s=45.0), progress=False)
    info = json.loads((tmp_path / "train.json").read_text())
    # readings at 10, 20, 30, 40 s run steps 0-3; the one at 50 s ends the loop with 12 iterations asked for
    assert info["steps"] == 4 and info["stopped_by_time_budget"] and info["iterations"] == 12
    assert train_mod.load_state(tmp_path / train_mod.CHECKPOINT)["step"] == 4
    assert gsim.load_scene(tmp_path / "scene").background is not None
    # the rates decay over the budget's share once it outruns the iterations' (step 3 of 12: 0.25 vs 40/45 s)
    np.testing.assert_allclose(decays, [0.01 ** (t / 45) for t in (10, 20, 30, 40)], rtol=1e-9)
    with pytest.raises(InputError, match="max_train_s"):
        preset("cpu", max_train_s=0)
    state = train_mod.load_state(tmp_path / train_mod.CHECKPOINT)
    assert state["config"]["max_train_s"] == 45.0


def test_cli_max_minutes(log_dir, tmp_path):
    from gsim.cli import main
    assert main(["reconstruct", str(log_dir), str(tmp_path / "r"), "--iterations", "2", "--max-minutes", "10",
                 "--road-weight", "0", "--sky-fill"]) == 0
    info = json.loads((tmp_path / "r" / "train.json").read_text())
    assert info["config"]["max_train_s"] == 600.0 and info["steps"] == 2 and not info["stopped_by_time_budget"]
    assert info["config"]["road_weight"] == 0.0 and info["config"]["sky_fill"]  # the defaults turned over
    for bad in ("0", "-1", "nan", "x"):
        with pytest.raises(SystemExit, match="2"):  # argparse's one-line error names the option
            main(["reconstruct", str(log_dir), str(tmp_path / "r2"), "--max-minutes", bad])


@pytest.mark.cuda
def test_cuda_preset_trains_on_the_gpu_and_resumes(log_dir, tmp_path, monkeypatch):
    reason = gsim.render.BACKENDS["gsplat"].probe()
    if reason is not None:
        pytest.skip(f"gsplat backend not available: {reason}")
    small = dict(iterations=60, checkpoint_every=20, normal_from=10, init=InitOptions(voxel_m=0.4, max_surfels=20_000),
                 densify=DensifyOptions(start=5, stop=50, every=5, grad_threshold=1e-5))
    real_step = train_mod.train_step

    def killed_at_30(run, *args, **kw):
        assert run.model.device.type == "cuda"
        if run.step == 30:
            raise KeyboardInterrupt
        return real_step(run, *args, **kw)
    monkeypatch.setattr(train_mod, "train_step", killed_at_30)
    with pytest.raises(KeyboardInterrupt):
        reconstruct(log_dir, tmp_path, preset("cuda", **small), progress=False)
    state = train_mod.load_state(tmp_path / train_mod.CHECKPOINT)
    assert state["step"] == 20 and state["model"]["params"]["means"].device.type == "cpu"  # loads anywhere
    assert state["adam"]["m"]["means"].device.type == "cpu"
    monkeypatch.setattr(train_mod, "train_step", real_step)
    reconstruct(log_dir, tmp_path, resume=True, progress=False)  # the moments go back to the GPU
    assert json.loads((tmp_path / "train.json").read_text())["iterations"] == 60
    assert training_view_gain(log_dir, gsim.load_scene(tmp_path / "scene"), small["init"], "gsplat") > 1.0


def test_bad_input(log_dir, tmp_path):
    with pytest.raises(InputError, match="no checkpoint"):
        reconstruct(log_dir, tmp_path / "none", resume=True, progress=False)
    with pytest.raises(ValueError, match="preset"):
        preset("gpu")
    with pytest.raises(ValueError, match="lidar_every"):
        preset("cpu", lidar_every=0)
    if gsim.render.BACKENDS["gsplat"].probe() is not None:
        with pytest.raises(RuntimeError, match="gsplat"):
            reconstruct(log_dir, tmp_path / "c", preset("cuda"), progress=False)
    # a camera-only log cannot initialise surfels
    log = load_log(log_dir)
    cam = log.cameras["front"]
    with LogWriter(tmp_path / "camonly", "camonly", "test") as w:
        w.add_camera("front", cam.camera, cam.T_vehicle_camera)
        for f in log.frames:
            w.add_ego_pose(f.timestamp_us, log.T_world_vehicle(f.timestamp_us))
            o = f.cameras["front"]
            w.add_frame(f.timestamp_us, {"front": w.image("front", f.index, o.timestamp_us,
                                                          src=log.root / o.image)}, {})
    with pytest.raises(ValueError, match="LiDAR"):
        reconstruct(tmp_path / "camonly", tmp_path / "d", _cfg(), progress=False)
    assert not (tmp_path / "d" / "scene").exists()
    with pytest.raises(ValueError, match="holdout_every"):
        reconstruct(log_dir, tmp_path / "e", dataclasses.replace(_cfg(), holdout_every=1), progress=False)


def test_demo_main_job_writes_every_output(tmp_path):
    """gsim demo's pipeline on a tiny street: log, scene, metrics, side-by-side views, novel-path video."""
    from gsim.scenes.demo import run_demo
    m = run_demo(tmp_path, seed=1, iterations=4, synth_options=TINY)
    assert load_log(tmp_path / "log").name == "synth-street-seed1"
    assert gsim.load_scene(tmp_path / "recon" / "scene").actors
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["psnr"] == m["psnr"]
    assert len(list((tmp_path / "eval" / "views").glob("*.png"))) == 6
    assert len(list((tmp_path / "novel" / "rgb").glob("*.png"))) == TINY.n_frames
    assert (tmp_path / "novel" / "video.mp4").stat().st_size > 0
    from gsim.scenes.synth import made_by
    log = load_log(tmp_path / "log")
    assert made_by(log, 1, TINY) and not made_by(log, 2, TINY) and not made_by(log, 1, SynthOptions())


def test_lidar_ray_losses_are_means_over_their_rays():
    """The LiDAR ray losses, written without a host synchronisation (masked sums), are the means over the
    returned rays (range, intensity) and over the rays with a surface (ray drop), whatever the other rays hold;
    0 where no ray qualifies."""
    import torch.nn.functional as F

    from gsim.scenes.reconstruction.losses import lidar_rays
    g = torch.Generator().manual_seed(0)
    R = 400
    alpha = torch.rand(R, generator=g, requires_grad=True)
    logits = torch.randn(R, 2, generator=g).requires_grad_()
    out = {"alpha": alpha, "range": torch.rand(R, generator=g) * 30, "logits": logits}
    target = torch.where(torch.rand(R, generator=g) > 0.3, torch.rand(R, generator=g) * 30, 0.0)
    intensity = torch.where(target > 0, torch.rand(R, generator=g), torch.nan)  # a dropped ray's is moot
    ret, surf = target > 0, alpha.detach() >= 0.5
    want = ((out["range"][ret] - target[ret]).abs().mean() + (1 - alpha[ret]).mean(),
            ((torch.sigmoid(out["logits"][ret, 0]) - intensity[ret]) ** 2).mean(),
            F.binary_cross_entropy_with_logits(out["logits"][surf, 1], (~ret[surf]).float()))
    got = lidar_rays(out, target, intensity)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want)), (got, want)
    sum(got).backward()
    assert torch.isfinite(alpha.grad).all() and (alpha.grad[~ret] == 0).all() and torch.isfinite(logits.grad).all()
    none = lidar_rays({**out, "alpha": alpha.detach() * 0}, torch.zeros(R), intensity)
    assert [float(x.detach()) for x in none] == [0.0, 0.0, 0.0]


def test_a_training_step_need_not_wait_on_the_device(log_dir):
    """``train_step(sync=False)`` (how a GPU run steps) issues no torch op that makes a CUDA host wait for the
    device: scalars read into Python, data-dependent sizes (nonzero, boolean selection, unique). Counted on the
    CPU by a dispatch mode, a LiDAR step and a camera-only step; numpy conversions are not seen here (the CPU
    kernels' own), nor what a GPU rasterizer does inside."""
    from torch.utils._python_dispatch import TorchDispatchMode

    waits = []

    class Waits(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            boolean = "index.Tensor" in name and any(getattr(i, "dtype", None) == torch.bool for i in args[1] or ())
            if boolean or any(k in name for k in ("_local_scalar_dense", "nonzero", "masked_select", "unique")):
                waits.append(name)
            return func(*args, **(kwargs or {}))

    t = train_mod.start(log_dir, _cfg(iterations=10, lidar_every=2))
    assert t.sweeps and t.run.model.owner.max() >= 0  # (actors: their rows are looked up once, at the first step)
    for i in range(3):  # steps 1 and 2 counted: a camera-only step and one with LiDAR rays
        with Waits() if i else contextlib.nullcontext():
            loss, mse = train_mod.train_step(t.run, t.views[i], t.sweeps, t.log, robust=t.robust, sync=False)
        t.run.step += 1
    assert torch.is_tensor(loss) and torch.is_tensor(mse)
    assert waits == []


@pytest.mark.cuda
def test_a_gpu_training_step_waits_only_inside_gsplat(log_dir):
    """The same on a GPU, where torch's sync debug mode also sees blocking copies to and from the host: a camera-only
    step of the cuda preset has no line of gsim's that makes the host wait (gsplat reads its tile count itself)."""
    reason = gsim.render.BACKENDS["gsplat"].probe()
    if reason is not None:
        pytest.skip(f"gsplat backend not available: {reason}")
    t = train_mod.start(log_dir, preset("cuda", iterations=10, lidar_every=4,
                                        init=InitOptions(voxel_m=0.4, max_surfels=20_000)))

    def step(i):
        train_mod.train_step(t.run, t.views[i], t.sweeps, t.log, robust=t.robust, sync=False)
        t.run.step += 1
    step(0)  # (a LiDAR step; each view's tensors are made on its first use)
    step(1)
    assert own_device_waits(lambda: step(1)) == []
