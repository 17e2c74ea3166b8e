"""Frames, camera models and the Surfels type."""
import numpy as np
import pytest
import torch

import gsim
from gsim.cameras import camera_from_dict
from gsim.transforms import (check_pose, check_poses, interpolate_pose, interpolate_poses, invert, look_at, quat_multiply,
                             quat_to_rotmat, rotmat_to_quat)

CAMERAS = [
    gsim.PinholeCamera(64, 48, 50.0, 52.0, 31.0, 25.0),
    gsim.OpenCVCamera(64, 48, 50.0, 52.0, 31.0, 25.0, k1=-0.25, k2=0.08, p1=0.001, p2=-0.002, k3=-0.01),
    gsim.FisheyeCamera(64, 48, 25.0, 25.0, 32.0, 24.0, k1=0.03, k2=-0.01, k3=0.002, k4=-0.0005),
]


def test_quaternion_roundtrip_and_hamilton_convention():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(200, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q *= np.sign(q[:, :1])
    R = quat_to_rotmat(q)
    assert np.allclose(R @ R.transpose(0, 2, 1), np.eye(3), atol=1e-12)
    assert np.allclose(rotmat_to_quat(R), q, atol=1e-12)
    # 90 deg about z (wxyz): x -> y
    qz = np.array([np.cos(np.pi / 4), 0, 0, np.sin(np.pi / 4)])
    assert np.allclose(quat_to_rotmat(qz[None])[0] @ [1, 0, 0], [0, 1, 0])


def test_quaternion_product_is_the_rotations_product_in_numpy_and_torch_alike():
    rng = np.random.default_rng(1)
    a, b = (q / np.linalg.norm(q, axis=-1, keepdims=True) for q in rng.normal(size=(2, 50, 4)))
    ab = quat_multiply(a, b)
    assert np.allclose(quat_to_rotmat(ab), quat_to_rotmat(a) @ quat_to_rotmat(b), atol=1e-12)
    for x, y in ((a, b), (a[:1], b), (a[:, None], b[:7])):  # the same numbers, broadcasting alike
        got = quat_multiply(torch.from_numpy(x), torch.from_numpy(y))
        assert np.array_equal(got.numpy(), quat_multiply(x, y))


def test_check_pose_rejects_bad_poses():
    with pytest.raises(ValueError, match="4x4"):
        check_pose(np.eye(3), "T")
    T = np.eye(4)
    T[0, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        check_pose(T, "T")
    T = np.eye(4)
    T[:3, :3] *= 2
    with pytest.raises(ValueError, match="rigid"):
        check_pose(T, "T_world_camera")
    T = np.diag([1.0, 1.0, -1.0, 1.0])  # a reflection
    with pytest.raises(ValueError, match="rigid"):
        check_pose(T, "T")


def test_look_at_is_opencv_and_invert():
    T = look_at([0, 0, 1.5], [10, 0, 1.5])
    assert np.allclose(T[:3, 2], [1, 0, 0])  # z forward
    assert np.allclose(T[:3, 1], [0, 0, -1])  # y down
    assert np.allclose(T[:3, 0], [0, -1, 0])  # x right (world -y when looking along +x)
    assert np.allclose(invert(T) @ T, np.eye(4))


def test_interpolate_pose_midpoint_and_clamp():
    a, b = np.eye(4), np.eye(4)
    b[:3, :3] = quat_to_rotmat(np.array([[np.cos(np.pi / 4), 0, 0, np.sin(np.pi / 4)]]))[0]
    b[:3, 3] = [2, 0, 0]
    ts, poses = np.array([0, 100]), np.stack([a, b])
    mid = interpolate_pose(ts, poses, 50)
    assert np.allclose(mid[:3, 3], [1, 0, 0])
    assert np.isclose(np.arctan2(mid[1, 0], mid[0, 0]), np.pi / 4)
    assert np.allclose(interpolate_pose(ts, poses, -5), a)
    assert np.allclose(interpolate_pose(ts, poses, 500), b)


def test_interpolate_poses_vectorized_yaw_is_linear_in_time():
    """A track turning 120 deg about z: at fraction a of the interval the yaw is a * 120 deg (slerp),
    the position linear; each batched pose equals the one-at-a-time result; ends clamp."""
    th = np.radians(120)
    b = np.eye(4)
    b[:3, :3] = quat_to_rotmat(np.array([[np.cos(th / 2), 0, 0, np.sin(th / 2)]]))[0]
    b[:3, 3] = [4, -2, 1]
    ts, poses = np.array([1000, 2000]), np.stack([np.eye(4), b])
    t = np.array([0, 1000, 1250, 1500, 1999, 2000, 9000])
    T = interpolate_poses(ts, poses, t)
    a = np.clip((t - 1000) / 1000, 0, 1)
    assert np.allclose(np.arctan2(T[:, 1, 0], T[:, 0, 0]), a * th, atol=1e-9)
    assert np.allclose(T[:, :3, 3], a[:, None] * [4, -2, 1])
    for i, ti in enumerate(t):
        assert np.allclose(T[i], interpolate_pose(ts, poses, int(ti)))
    assert np.allclose(interpolate_poses(ts[:1], poses[:1], t), np.eye(4))  # a single pose holds


def test_interpolate_poses_edge_cases():
    """No times asked: no poses; a repeated time in the track: the later pose (not NaN); quaternions that do not
    fit the poses: an error, not memory written past the output."""
    poses = np.tile(np.eye(4), (3, 1, 1))
    poses[:, :3, 3] = [[0, 0, 0], [1, 0, 0], [2, 0, 0]]
    assert interpolate_poses(np.array([0, 100, 200]), poses, np.array([], np.int64)).shape == (0, 4, 4)
    assert interpolate_poses(np.array([0, 100, 200]), np.stack([poses] * 2), []).shape == (2, 0, 4, 4)
    got = interpolate_poses(np.array([0, 100, 100]), poses, [100, 150])
    assert np.array_equal(got, poses[[2, 2]])
    with pytest.raises(ValueError, match=r"quats shaped \(2, 3, 4\), expected \(3, 4\)"):
        interpolate_poses(np.array([0, 100, 200]), poses, [50], quats=np.tile([1.0, 0, 0, 0], (2, 3, 1)))


def test_interpolate_pose_is_interpolate_poses_one_at_a_time():
    rng = np.random.default_rng(4)
    q = rng.normal(size=(6, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q[2] = -q[1] + 1e-5  # the same rotation as the one before, opposite sign (nearly equal: the linear branch)
    q[2] /= np.linalg.norm(q[2])
    poses = np.tile(np.eye(4), (6, 1, 1))
    poses[:, :3, :3], poses[:, :3, 3] = quat_to_rotmat(q), rng.normal(size=(6, 3)) * 10
    ts = np.array([0, 100, 250, 400, 1000, 1001])
    t = np.concatenate([[-50, 0, 100, 1001, 2000], rng.integers(-10, 1100, 40)])
    batch = interpolate_poses(ts, poses, t)
    for quats in (None, q * np.sign(q[:, :1])):  # the track's quaternions given, as actors give them
        for i, ti in enumerate(t):
            assert np.allclose(interpolate_pose(ts, poses, int(ti), quats), batch[i], atol=1e-12)
    assert np.array_equal(interpolate_pose(ts[:1], poses[:1], 7), poses[0])
    # tracks that share their times, stacked: each as if alone, bit for bit (the LiDAR batches a simulator's vehicles)
    stack = np.stack([poses, poses[::-1], np.tile(poses[:1], (6, 1, 1))])
    together = interpolate_poses(ts, stack, t)
    assert together.shape == (3, len(t), 4, 4)
    assert all(np.array_equal(together[k], interpolate_poses(ts, stack[k], t)) for k in range(3))
    assert np.array_equal(interpolate_poses(ts[:1], stack[:, :1], t)[1], np.repeat(poses[-1:], len(t), 0))


@pytest.mark.parametrize("cam", CAMERAS, ids=lambda c: c.model)
def test_unproject_project_roundtrip(cam):
    jj, ii = np.meshgrid(np.arange(cam.width) + 0.5, np.arange(cam.height) + 0.5)
    px = np.stack([jj.ravel(), ii.ravel()], 1)
    rays, ok = cam.unproject(px)
    assert ok.mean() > 0.5
    uv, valid = cam.project(rays[ok] * 3.7)  # any depth along the ray
    assert valid.all()
    assert np.abs(uv - px[ok]).max() < 1e-6
    assert np.allclose(rays[:, 2], 1.0)


def test_opencv_projection_matches_the_formula():
    cam = CAMERAS[1]
    x, y, z = 0.3, -0.2, 2.0
    xn, yn = x / z, y / z
    r2 = xn * xn + yn * yn
    radial = 1 + cam.k1 * r2 + cam.k2 * r2 ** 2 + cam.k3 * r2 ** 3
    xd = xn * radial + 2 * cam.p1 * xn * yn + cam.p2 * (r2 + 2 * xn * xn)
    yd = yn * radial + cam.p1 * (r2 + 2 * yn * yn) + 2 * cam.p2 * xn * yn
    uv, ok = cam.project(np.array([[x, y, z]]))
    assert ok[0] and np.allclose(uv[0], [cam.fx * xd + cam.cx, cam.fy * yd + cam.cy], atol=1e-12)


def test_fisheye_projection_is_equidistant():
    cam = gsim.FisheyeCamera(100, 100, 30.0, 30.0, 50.0, 50.0)  # no distortion terms
    theta = np.deg2rad(60)
    uv, ok = cam.project(np.array([[np.sin(theta), 0, np.cos(theta)]]))
    assert ok[0] and np.isclose(uv[0, 0] - 50, 30 * theta)
    _, ok = cam.project(np.array([[1.0, 0, -0.1]]))  # behind: no projection
    assert not ok[0]


def test_pixels_of_torch_rays_match_numpy_and_carry_gradients():
    """`pixels` serves torch tensors too (the multi-view term's warp): the same pixels, differentiable."""
    rng = np.random.default_rng(0)
    xy = rng.uniform(-0.6, 0.6, (50, 2))
    for cam in CAMERAS:
        u, v, ok = cam.pixels(xy[:, 0], xy[:, 1])
        t = torch.tensor(xy, dtype=torch.float64, requires_grad=True)
        ut, vt, okt = cam.pixels(t[:, 0], t[:, 1])
        assert np.allclose(ut.detach().numpy(), u) and np.allclose(vt.detach().numpy(), v)
        assert np.array_equal(okt.numpy(), ok)
        (ut.sum() + vt.sum()).backward()
        assert torch.isfinite(t.grad).all() and (t.grad.abs() > 0).all()


def test_camera_validation_and_dict_roundtrip():
    for cam in CAMERAS:
        assert camera_from_dict(cam.to_dict()) == cam
    with pytest.raises(ValueError, match="width"):
        gsim.PinholeCamera(0, 10, 10, 10, 5, 5)
    with pytest.raises(ValueError, match="height"):
        gsim.PinholeCamera(10, -1, 10, 10, 5, 5)
    with pytest.raises(ValueError, match="focal"):
        gsim.PinholeCamera(10, 10, 0, 10, 5, 5)
    with pytest.raises(ValueError, match="finite"):
        gsim.OpenCVCamera(10, 10, 10, 10, 5, 5, k1=float("nan"))
    with pytest.raises(ValueError, match="model"):
        camera_from_dict({"model": "orthographic"})
    with pytest.raises(ValueError, match="unknown fields"):
        camera_from_dict({"model": "pinhole", "width": 2, "height": 2, "fx": 1, "fy": 1, "cx": 1, "cy": 1, "k1": 0})


def _surfel_args(n=4):
    rng = np.random.default_rng(1)
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return dict(means=rng.normal(size=(n, 3)), quats=q, scales=rng.uniform(0.1, 1, (n, 2)),
                opacities=rng.uniform(0.1, 1, n), colors=rng.uniform(0, 1, (n, 3)))


def test_surfels_rgb_becomes_sh_dc():
    a = _surfel_args()
    s = gsim.Surfels(**a)
    assert s.colors.shape == (4, 1, 3) and s.sh_degree == 0
    assert np.allclose(s.colors[:, 0] * 0.28209479177387814 + 0.5, a["colors"])
    t = gsim.Surfels(**{k: torch.as_tensor(v) for k, v in a.items()})
    assert t.is_torch and torch.allclose(t.colors[:, 0] * 0.28209479177387814 + 0.5, torch.as_tensor(a["colors"]))


@pytest.mark.parametrize("field,value,match", [
    ("means", np.zeros((4, 2)), r"means: expected shape \(N,3\)"),
    ("quats", np.zeros((4, 4)), "quaternion 0 has norm 0"),
    ("quats", np.tile([2.0, 0, 0, 0], (4, 1)), "norm 2"),
    ("scales", -np.ones((4, 2)), "scales >= 0"),
    ("opacities", np.full(4, 1.5), r"opacities: expected values in \[0, 1\]"),
    ("opacities", np.zeros(3), r"opacities: expected shape \(4,\)"),
    ("colors", np.zeros((4, 5, 3)), "colors"),
    ("means", np.full((4, 3), np.inf), "means: contains NaN or inf"),
    ("scales", np.full((4, 2), np.nan), "scales: contains NaN or inf"),
])
def test_surfels_bad_input(field, value, match):
    a = _surfel_args()
    a[field] = value
    with pytest.raises(ValueError, match=match):
        gsim.Surfels(**a)


def test_derived_surfels_check_shapes_not_values():
    a = _surfel_args()
    a["quats"] = np.zeros((4, 4))  # values are the caller's promise (activations, subsets of valid surfels)
    s = gsim.Surfels.derived(**a)
    assert s.colors.shape == (4, 1, 3) and s.features is None and len(s.numpy()) == 4
    a["means"] = np.zeros((4, 2))
    with pytest.raises(ValueError, match=r"means: expected shape \(N,3\)"):
        gsim.Surfels.derived(**a)


def test_surfels_refuses_mixed_array_kinds():
    a = _surfel_args()
    a["means"] = torch.as_tensor(a["means"])
    with pytest.raises(TypeError, match="mix"):
        gsim.Surfels(**a)


def test_concatenate_pads_sh():
    a = _surfel_args()
    s0 = gsim.Surfels(**a)
    a["colors"] = np.zeros((4, 9, 3))
    s2 = gsim.Surfels(**a)
    c = gsim.Surfels.concatenate([s0, s2])
    assert len(c) == 8 and c.sh_degree == 2 and np.all(c.colors[:4, 1:] == 0)


def test_downscaled_camera_matches_box_averaged_pixels():
    from gsim.cameras import downscale_image
    cam = gsim.OpenCVCamera(64, 48, 50.0, 52.0, 31.0, 25.0, k1=-0.1, p1=0.01)
    small = cam.downscaled(2)
    p = np.array([[0.3, -0.2, 2.0], [-0.5, 0.4, 3.0]])
    uv, ok = cam.project(p)
    uv2, ok2 = small.project(p)
    assert ok.all() and ok2.all() and np.allclose(uv2, uv / 2)
    img = np.random.default_rng(0).random((48, 64, 3)).astype(np.float32)
    down = downscale_image(img, 2)
    assert down.shape == (small.height, small.width, 3) and np.isclose(down[3, 5, 1], img[6:8, 10:12, 1].mean())
    with pytest.raises(ValueError, match="downscale"):
        cam.downscaled(0)


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_transformed_surfels_turn_their_view_dependent_colour(degree):
    """A rotated surfel seen from a rotated direction shows the colour it showed before (SH bands rotate)."""
    from gsim.sh import eval_sh
    rng = np.random.default_rng(degree)
    k = (degree + 1) ** 2
    s = gsim.Surfels(rng.normal(size=(6, 3)), np.tile([1.0, 0, 0, 0], (6, 1)), np.full((6, 2), 0.1), np.full(6, 0.5),
                     rng.normal(size=(6, k, 3)))
    q = rng.normal(size=4)
    T = np.eye(4)
    T[:3, :3] = quat_to_rotmat(q / np.linalg.norm(q))
    d = rng.normal(size=(6, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    before = eval_sh(torch.from_numpy(s.colors), torch.from_numpy(d))
    after = eval_sh(torch.from_numpy(s.transformed(T).colors), torch.from_numpy(d @ T[:3, :3].T))
    assert torch.allclose(before, after, atol=1e-5)


def test_check_poses_checks_each_pose_and_names_the_first_bad_one():
    P = np.tile(np.eye(4), (5, 1, 1))
    assert check_poses(P[:3], "track").shape == (3, 4, 4)
    P[3, 0, 0], P[4, 0, 3] = 2.0, np.nan
    with pytest.raises(ValueError, match=r"track\[3\]: not a rigid transform"):
        check_poses(P, "track")
    with pytest.raises(ValueError, match=r"track\[1\]: contains NaN"):
        check_poses(P[[0, 4]], "track")
    with pytest.raises(ValueError, match=r"track: expected \(N,4,4\)"):
        check_poses(np.eye(4), "track")


def test_move_rows_moves_each_row_as_its_owner_transforms_it():
    """The training model's batched move (one rotation per owner, view-dependent colours turned on the tensors'
    device) is `Surfels.transformed` of each row by its owner's pose."""
    from gsim.surfels import move_rows
    from gsim.transforms import rotmat_to_quat
    rng = np.random.default_rng(5)
    q = rng.normal(size=(6, 4))
    s = gsim.Surfels(rng.normal(size=(6, 3)), q / np.linalg.norm(q, axis=1, keepdims=True), np.full((6, 2), 0.1),
                     np.full(6, 0.5), rng.normal(size=(6, 9, 3)))
    T = np.tile(np.eye(4), (2, 1, 1))
    for k in range(2):
        a = rng.normal(size=4)
        T[k, :3, :3], T[k, :3, 3] = quat_to_rotmat(a / np.linalg.norm(a)), rng.normal(size=3)
    rows, owner = [1, 2, 4], [0, 1, 0]
    t = lambda x: torch.as_tensor(np.asarray(x))  # noqa: E731
    moved = move_rows(s.torch(dtype=torch.float64), t(rows), t(owner), t(T[:, :3, :3]), t(T[:, :3, 3]),
                      t(rotmat_to_quat(T[:, :3, :3]))).numpy()
    for r in range(6):
        want = s.subset([r]).transformed(T[owner[rows.index(r)]]) if r in rows else s.subset([r])
        for k in ("means", "colors"):
            assert np.allclose(getattr(moved, k)[r], getattr(want, k)[0], atol=1e-9), (r, k)
        assert np.allclose(np.abs(moved.quats[r] @ want.quats[0]), 1.0)


def test_a_thinned_scene_keeps_a_fraction_of_each_part_grown_to_cover_and_renders_close():
    from support import PIN, plane
    bg = plane(extent=3.0, spacing=0.1)  # 3600 surfels on the ground
    body = plane(extent=1.0, spacing=0.1)  # 400 surfels: fewer than LOD_MIN are kept whole
    shadow = plane(extent=2.0, spacing=0.2)
    actor = gsim.Actor("a", "car", (2, 2, 1), gsim.Surfels.concatenate([body, shadow]), np.array([0]),
                       np.eye(4)[None], shadow_surfels=len(shadow))
    scene = gsim.Scene(bg, (actor,))
    thin = scene.thinned(0.25, seed=3)
    assert len(thin.background) == 900 and len(thin.actors[0].surfels) == 400 + len(shadow) // 4
    assert thin.actors[0].shadow_surfels == len(shadow) // 4
    np.testing.assert_allclose(thin.background.scales, np.sqrt(4) * bg.scales[:900], rtol=1e-6)
    assert set(map(tuple, thin.background.means)) <= set(map(tuple, bg.means))  # a subset, not new surfels
    assert scene.thinned(0.25, seed=3).background.means.tobytes() == thin.background.means.tobytes()
    assert scene.thinned(1.0).background is bg
    T = look_at([0, 0, 8], [0, 0, 0], up=(0, 1, 0))
    full = gsim.render_camera(gsim.Scene(bg), PIN, T, backend="numba")
    part = gsim.render_camera(gsim.Scene(thin.background), PIN, T, backend="numba")
    a = part.alpha[16:48, 16:48]  # the grown surfels still cover the plane (a random subset leaves thin spots)
    assert a.mean() > 0.97 and a.min() > 0.8
    from gsim.images import psnr
    assert psnr(full.rgb, part.rgb) > 25


def test_to_device_takes_arrays_tensors_and_sequences_as_they_are():
    from gsim.render.common import to_device
    a = np.arange(12.0).reshape(3, 4)
    t = to_device(a[:, ::2].T, "cpu", torch.float32)  # a non-contiguous view, cast
    assert t.dtype == torch.float32 and t.shape == (2, 3) and np.array_equal(t.numpy(), a[:, ::2].T)
    x = torch.ones(3, dtype=torch.float64)
    assert to_device(x, "cpu") is x  # a tensor already there is not copied
    assert to_device((0.1, 0.2), torch.device("cpu"), torch.float64).tolist() == [0.1, 0.2]
