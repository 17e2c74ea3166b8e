"""Optimisation pieces of reconstruction: Adam against torch's, densification bookkeeping."""
import numpy as np
import pytest
import torch

from gsim import Surfels
from gsim.scenes.reconstruction.model import SceneModel
from gsim.scenes.reconstruction.optim import Adam, DensifyOptions, Densifier


def test_adam_matches_torch_adam():
    torch.manual_seed(0)
    target = torch.randn(5, 3)
    ours = {"x": torch.zeros(5, 3, requires_grad=True)}
    ref = torch.zeros(5, 3, requires_grad=True)
    adam, tadam = Adam({"x": 0.05}), torch.optim.Adam([ref], lr=0.05, eps=1e-15)
    for _ in range(50):
        ((ours["x"] - target) ** 2).sum().backward()
        adam.step(ours)
        tadam.zero_grad()
        ((ref - target) ** 2).sum().backward()
        tadam.step()
    assert torch.allclose(ours["x"], ref, atol=1e-5)
    assert ours["x"].grad is None  # step clears gradients


def test_sparse_adam_leaves_rows_without_gradient_alone():
    torch.manual_seed(0)
    target = torch.randn(3, 4)
    ours = {"x": torch.zeros(3, 4, requires_grad=True)}
    adam = Adam({"x": 0.05}, sparse=["x"])
    for i in range(40):
        row = 2 if i == 0 else i % 2  # row 2 is seen once, rows 0 and 1 every other step
        ((ours["x"][row] - target[row]) ** 2).sum().backward()
        adam.step(ours)
    after_visit = ours["x"][2].detach().clone()
    assert torch.allclose(after_visit, 0.05 * torch.sign(target[2]), atol=1e-4)  # one Adam step of lr, towards it
    for _ in range(20):  # dense Adam would keep moving row 2 on its momentum
        ((ours["x"][0] - target[0]) ** 2).sum().backward()
        adam.step(ours)
    assert torch.equal(ours["x"][2], after_visit)
    assert not torch.equal(ours["x"][0], torch.zeros(4)) and ours["x"].grad is None


def test_batched_sparse_adam_equals_one_tensor_at_a_time():
    """Sparse tensors of two row shapes, batched by shape in one step, with dense ones and rate scales: bit for bit
    what each alone gets (a dense tensor alone is torch's Adam, checked above; a sparse one alone, below)."""
    gen = torch.Generator().manual_seed(0)
    shapes = {"pose/a": (3, 4), "pose/b": (5, 4), "view/rot": (4, 3), "means": (7, 3), "sky": (2, 2, 3)}
    lrs = {k: 0.01 * (i + 1) for i, k in enumerate(shapes)}
    sparse = ["pose/a", "pose/b", "view/rot"]
    together = {k: torch.randn(shape, generator=gen) for k, shape in shapes.items()}
    alone = {k: v.clone() for k, v in together.items()}
    adam, singles = Adam(lrs, sparse), {k: Adam({k: lrs[k]}, [k] if k in sparse else []) for k in shapes}
    for it in range(12):
        grads = {k: torch.randn(shape, generator=gen) for k, shape in shapes.items()}
        for k in sparse:
            grads[k][torch.arange(len(grads[k])) % 3 != it % 3] = 0  # each row seen every third step
        for k in shapes:
            together[k].grad, alone[k].grad = grads[k].clone(), grads[k].clone()
        adam.step(together, {"pose/b": 0.5, "means": 0.25})
        for k in shapes:
            singles[k].step({k: alone[k]}, {k: {"pose/b": 0.5, "means": 0.25}.get(k, 1.0)})
    for k in shapes:
        assert torch.equal(together[k], alone[k]), k
        assert torch.equal(adam.m[k], singles[k].m[k]) and torch.equal(adam.v[k], singles[k].v[k]), k
    assert all(p.grad is None for p in together.values())


def _model(n=6):
    rng = np.random.default_rng(0)
    s = Surfels(rng.normal(size=(n, 3)).astype(np.float32), np.tile([1.0, 0, 0, 0], (n, 1)).astype(np.float32),
                np.full((n, 2), 0.05, np.float32), np.full(n, 0.5, np.float32), np.full((n, 3), 0.5, np.float32))
    return SceneModel.from_surfels(s, {}, [], ["front"])


def test_densifier_clones_splits_prunes_and_remaps_adam():
    model = _model()
    with torch.no_grad():
        model.params["log_scales"][1] = np.log(0.5)  # large: split, not clone
        model.params["logit_opacities"][5] = -10.0  # transparent: pruned
    adam = Adam({k: 1e-3 for k in model.params})
    for p in model.params.values():
        p.grad = torch.ones_like(p)
    adam.step(model.params)
    d = Densifier(DensifyOptions(start=0, stop=10, every=1, grad_threshold=1e-3, split_scale=0.01,
                                 prune_opacity=0.005, prune_scale=1.0), scene_scale=10.0)
    grad = torch.zeros(6, 3)
    grad[[0, 1]] = 1.0  # surfels 0 and 1 have large image-plane gradients
    d.accumulate(grad, torch.full((6,), 10.0), focal=100.0, width=100)
    parent = model.params["means"][1].detach().clone()
    parent_log_scale = model.params["log_scales"][1].detach().clone()
    counts = d.step(model, adam, 1, torch.Generator().manual_seed(0))
    assert counts == {"cloned": 1, "split": 1, "pruned": 1}
    assert len(model) == 6 - 1 - 1 + 1 + 2  # minus pruned and split parent, plus a clone and two children
    assert all(adam.m[k].shape == p.shape and adam.v[k].shape == p.shape for k, p in model.params.items())
    assert torch.all(adam.m["means"][-3:] == 0)  # new surfels start with fresh moments
    children = model.params["means"][-2:].detach()
    assert torch.allclose(model.params["log_scales"][-2:], parent_log_scale - np.log(1.6))
    assert not torch.allclose(children[0], children[1]) and torch.all((children - parent).norm(dim=-1) < 3.0)
    assert (model.owner == -1).all() and model.params["means"].requires_grad
    # off-schedule iterations change nothing
    assert d.step(model, adam, 20, torch.Generator()) == {}


def test_actor_pose_offsets_move_the_actor_and_are_saved():
    from gsim.scenes.log import ActorTrack
    from gsim.transforms import quat_to_rotmat
    rng = np.random.default_rng(1)
    n = 4
    local = Surfels(rng.normal(size=(n, 3)).astype(np.float32), np.tile([1.0, 0, 0, 0], (n, 1)).astype(np.float32),
                    np.full((n, 2), 0.05, np.float32), np.full(n, 0.5, np.float32), np.full((n, 3), 0.5, np.float32))
    poses = np.tile(np.eye(4), (3, 1, 1))
    poses[:, 0, 3] = [0.0, 1.0, 2.0]
    poses[1, :2, :2] = [[0.0, -1.0], [1.0, 0.0]]  # the middle pose turned 90 deg
    track = ActorTrack("car", "car", (4.0, 2.0, 1.5), np.array([0, 100_000, 200_000]), poses)
    bg = Surfels(*(x[:2] for x in (local.means, local.quats, local.scales, local.opacities, local.colors)))
    model = SceneModel.from_surfels(bg, {"car": local}, [track], ["front"])
    world = model.surfels_at(100_000)
    np.testing.assert_allclose(world.means[2:].detach().numpy(), local.means @ poses[1, :3, :3].T + poses[1, :3, 3],
                               atol=1e-5)  # zero offsets: the track as given
    with torch.no_grad():
        model.pose_offsets["car"][1] = torch.tensor([0.5, 0.0, 0.1, np.pi / 2])  # forward 0.5 m in the box, up, turn
    T = model.track_poses()[0][1][1]
    world = model.surfels_at(100_000)
    np.testing.assert_allclose(T[:3, 3], [1.0, 0.5, 0.1], atol=1e-6)  # the box's x is the world's y there
    np.testing.assert_allclose(T[:2, :2], [[-1.0, 0.0], [0.0, -1.0]], atol=1e-6)
    np.testing.assert_allclose(world.means[2:].detach().numpy(), local.means @ T[:3, :3].T + T[:3, 3], atol=1e-5)
    R = quat_to_rotmat(torch.nn.functional.normalize(world.quats[2:], dim=-1).detach().numpy().astype(np.float64))
    np.testing.assert_allclose(R, np.broadcast_to(T[:3, :3], R.shape), atol=1e-5)
    # halfway to the next pose the offset is interpolated, and photometric gradients reach it
    model.surfels_at(150_000).means.sum().backward()
    g = model.pose_offsets["car"].grad
    assert g[1].abs().sum() > 0 and g[2].abs().sum() > 0 and g[0].abs().sum() == 0
    # the saved scene carries the refined poses; a checkpoint restores the offsets
    scene = model.to_scene()
    np.testing.assert_allclose(scene.actors[0].track_poses[1], T, atol=1e-6)
    again = SceneModel.from_state(model.state_dict(), [track], list(model.affine))
    assert torch.equal(again.pose_offsets["car"], model.pose_offsets["car"])
    assert np.array_equal(again.pose_knots["car"], model.pose_knots["car"])


def test_pose_offsets_learnt_at_training_times_blend_between_them():
    """Knots at the training views' times: the track pose at a held-out time between two of them
    takes their offsets' blend, not zero; knots are clamped to the track's span."""
    from gsim.scenes.log import ActorTrack
    poses = np.tile(np.eye(4), (5, 1, 1))
    poses[:, 0, 3] = np.arange(5.0)
    track = ActorTrack("car", "car", (4.0, 2.0, 1.5), np.arange(5) * 100_000 + 100_000, poses)
    local = Surfels(np.zeros((1, 3), np.float32), np.array([[1.0, 0, 0, 0]], np.float32), np.full((1, 2), 0.05, np.float32),
                    np.full(1, 0.5, np.float32), np.full((1, 3), 0.5, np.float32))
    model = SceneModel.from_surfels(local, {"car": local}, [track], ["front"], knots_us=[0, 200_000, 400_000, 900_000])
    assert model.pose_knots["car"].tolist() == [100_000, 200_000, 400_000, 500_000]
    with torch.no_grad():
        model.pose_offsets["car"][1] = torch.tensor([0.2, 0.0, 0.0, 0.0])
        model.pose_offsets["car"][2] = torch.tensor([0.4, 0.0, 0.0, 0.0])
    T = model.track_poses()[0][1]
    np.testing.assert_allclose(T[:, 0, 3] - poses[:, 0, 3], [0.0, 0.2, 0.3, 0.4, 0.0], atol=1e-6)
    np.testing.assert_allclose(model.surfels_at(300_000).means[1].detach().numpy(), [2.3, 0, 0], atol=1e-6)


def test_view_pose_corrections_render_as_the_corrected_camera_and_are_saved(tmp_path):
    """Training renders the corrected surfels from the log's pose; the scene keeps C with C @ T the corrected camera
    pose, blended between the knots: both give the same image, and the correction survives save, load and
    checkpoint."""
    from gsim.cameras import PinholeCamera
    from gsim.render import render_camera
    from gsim.scene import load_scene
    rng = np.random.default_rng(3)
    n = 300
    s = Surfels(np.c_[rng.uniform(-3, 3, (n, 2)), rng.uniform(6, 12, n)].astype(np.float32),
                np.tile([1.0, 0, 0, 0], (n, 1)).astype(np.float32), np.full((n, 2), 0.15, np.float32),
                np.full(n, 0.8, np.float32), rng.uniform(0, 1, (n, 3)).astype(np.float32))
    centres = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    model = SceneModel.from_surfels(s, {}, [], ["front"], knots_us=[0, 100_000], view_centres=centres)
    with torch.no_grad():
        model.view_offsets["rot"][:] = torch.tensor([[0.01, -0.02, 0.015], [0.0, 0.0, 0.0]])
        model.view_offsets["trans"][:] = torch.tensor([[0.05, 0.02, -0.03], [0.0, 0.0, 0.0]])
    cam = PinholeCamera(64, 48, 50.0, 50.0, 32.0, 24.0)
    T = np.eye(4)
    scene = model.to_scene()
    trained = render_camera(model.corrected(model.surfels_at(0), 0), cam, T).rgb.detach().numpy()
    shown = render_camera(scene.background, cam, scene.log_pose(T, 0)).rgb
    np.testing.assert_allclose(trained, shown, atol=1e-3)
    assert np.abs(shown - render_camera(scene.background, cam, T).rgb).max() > 0.1  # the correction shows
    # between knots the corrected poses blend (a held-out view); at the last knot nothing was corrected
    C0 = scene.log_pose(T, 0)
    half = scene.log_pose(T, 50_000)
    np.testing.assert_allclose(half[:3, 3], C0[:3, 3] / 2, atol=1e-9)
    assert np.allclose(scene.log_pose(T, 100_000), T) and np.allclose(scene.log_pose(T, 200_000), T)
    with pytest.raises(ValueError, match="50000 us"):
        model.corrected(model.surfels_at(50_000), 50_000)
    # differentiable in the corrections: the photometric gradient reaches the knot's rotation and translation
    render_camera(model.corrected(model.surfels_at(0), 0), cam, T).rgb.sum().backward()
    assert model.view_offsets["rot"].grad[0].abs().sum() > 0 and model.view_offsets["trans"].grad[0].abs().sum() > 0
    scene.save(tmp_path / "scene")
    np.testing.assert_allclose(load_scene(tmp_path / "scene").log_pose(T, 30_000), scene.log_pose(T, 30_000))
    again = SceneModel.from_state(model.state_dict(), [], list(model.affine))
    assert torch.equal(again.view_offsets["rot"], model.view_offsets["rot"])
    np.testing.assert_allclose(again.pose_corrections()[1], model.pose_corrections()[1])
