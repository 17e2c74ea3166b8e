"""gsim.diffusion.references: real training images warped into a target view through depth, with validity."""
from pathlib import Path

import numpy as np
import pytest

import gsim
from gsim.diffusion.references import nearest_training_views, references, warp
from gsim.errors import InputError
from gsim.scenes.log import CameraObs, CameraSensor, DrivingLog, Frame, LogWriter, load_log
from support import plane

PIN = gsim.PinholeCamera(64, 48, 50.0, 50.0, 32.0, 24.0)
DISTORTED = gsim.OpenCVCamera(64, 48, 50.0, 52.0, 31.0, 25.0, k1=-0.08, k2=0.012, p1=0.001)
NORMAL, OFFSET = np.array([-0.3, -0.2, 1.0]), 10.0  # the textured plane: NORMAL . X = OFFSET (world, m)
OCCLUDER_Z, OCCLUDER = 1.5, (1.2, 1.8, -0.3, 0.3)  # a square in the plane Z = 1.5: X and Y ranges (m)


def pose(t, yaw=0.0):
    """Camera -> world: turned by ``yaw`` about the camera's y axis (down), at ``t``."""
    T = np.eye(4)
    c, s = np.cos(yaw), np.sin(yaw)
    T[:3, :3] = [[c, 0, s], [0, 1, 0], [-s, 0, c]]
    T[:3, 3] = t
    return T


def texture(X):
    """A smooth colour of world points (N,3): bilinear sampling of its images is nearly exact."""
    return np.stack([0.5 + 0.3 * np.sin(0.35 * X[:, 0] + 0.2 * X[:, 1] + p) for p in (0.0, 1.0, 2.0)], 1)


def view(camera, T, occluder=False):
    """The exact (rgb (H,W,3), depth (H,W)) of the plane (and, with ``occluder``, the red square) from a camera,
    one ray through each pixel centre."""
    rays = np.concatenate([camera.ray_table().reshape(-1, 2), np.ones((camera.width * camera.height, 1))], 1)
    d, o = rays @ T[:3, :3].T, T[:3, 3]
    t = (OFFSET - NORMAL @ o) / (d @ NORMAL)  # camera z, since the rays have z = 1
    rgb = texture(o + d * t[:, None])
    if occluder:
        s = (OCCLUDER_Z - o[2]) / d[:, 2]
        X = o + d * s[:, None]
        hit = (s > 0) & (s < t) & (X[:, 0] > OCCLUDER[0]) & (X[:, 0] < OCCLUDER[1]) & (X[:, 1] > OCCLUDER[2]) \
            & (X[:, 1] < OCCLUDER[3])
        t, rgb[hit] = np.where(hit, s, t), (1.0, 0.0, 0.0)
    shape = (camera.height, camera.width)
    return rgb.reshape(shape + (3,)), t.reshape(shape)


def in_source(source_camera, T_source, target_camera, T_target, target_depth):
    """(H,W,2) where each target pixel's point lands in the source image (pixels), (H,W) bool: between its
    outermost pixel centres."""
    rays = np.concatenate([target_camera.ray_table(), np.ones(target_depth.shape + (1,))], -1) * target_depth[..., None]
    T = np.linalg.inv(T_source) @ T_target
    uv, ok = source_camera.project(rays.reshape(-1, 3) @ T[:3, :3].T + T[:3, 3])
    W, H = source_camera.width, source_camera.height
    ok &= (uv[:, 0] >= 0.5) & (uv[:, 0] <= W - 0.5) & (uv[:, 1] >= 0.5) & (uv[:, 1] <= H - 0.5)
    return uv.reshape(target_depth.shape + (2,)), ok.reshape(target_depth.shape)


@pytest.mark.parametrize("target_camera, source_camera", [(PIN, PIN), (DISTORTED, PIN), (PIN, DISTORTED)],
                         ids=["pinhole", "distorted-target", "distorted-source"])
def test_warping_a_known_plane_gives_the_true_target_image_where_valid(target_camera, source_camera):
    T_target, T_source = pose([0.0, 0.0, 0.0]), pose([1.0, -0.3, 0.5], yaw=-0.08)
    truth, target_depth = view(target_camera, T_target)
    source_rgb, source_depth = view(source_camera, T_source)
    warped, valid = warp(source_rgb, source_depth, source_camera, T_source, target_depth, target_camera, T_target)
    assert warped.shape == truth.shape and warped.dtype == np.float32 and valid.dtype == bool
    _, overlap = in_source(source_camera, T_source, target_camera, T_target, target_depth)
    assert overlap.mean() > 0.6  # (the test means something)
    assert (valid == overlap).mean() > 0.995 and not (valid & ~overlap).any()
    assert np.abs(warped - truth)[valid].max() < 1e-3
    assert not warped[~valid].any()


def test_the_same_pose_warps_to_the_image_itself():
    rgb, depth = view(DISTORTED, pose([0.2, 0.1, 0.0], yaw=0.1))
    warped, valid = warp(rgb, depth, DISTORTED, pose([0.2, 0.1, 0.0], yaw=0.1), depth, DISTORTED,
                         pose([0.2, 0.1, 0.0], yaw=0.1))
    assert valid.all() and np.abs(warped - rgb).max() < 1e-6


def test_pixels_the_source_saw_an_occluder_at_are_not_valid_and_the_rest_is():
    """The red square is 1.5 m in front of the source camera, outside the target's view: the target's points
    behind it (as the source sees them) are not valid, the others are, and no red leaks into what is valid."""
    T_target, T_source = pose([0.0, 0.0, 0.0]), pose([1.5, 0.0, 0.0])
    truth, target_depth = view(PIN, T_target)
    source_rgb, source_depth = view(PIN, T_source, occluder=True)
    red = (source_rgb == (1.0, 0.0, 0.0)).all(-1)
    assert 0.02 < red.mean() < 0.2  # the source sees it
    warped, valid = warp(source_rgb, source_depth, PIN, T_source, target_depth, PIN, T_target)
    uv, overlap = in_source(PIN, T_source, PIN, T_target, target_depth)
    u0, u1 = (PIN.fx * (np.array(OCCLUDER[:2]) - 1.5) / OCCLUDER_Z + PIN.cx)  # the square in source pixels
    v0, v1 = (PIN.fy * np.array(OCCLUDER[2:]) / OCCLUDER_Z + PIN.cy)
    inside = lambda m: (uv[..., 0] > u0 - m) & (uv[..., 0] < u1 + m) & (uv[..., 1] > v0 - m) & (uv[..., 1] < v1 + m)
    behind, clear = overlap & inside(-1.0), overlap & ~inside(1.5)
    assert behind.sum() > 50 and clear.sum() > 500
    assert not valid[behind].any()
    assert valid[clear].all()
    assert np.abs(warped - truth)[valid].max() < 0.1  # near the square's edge: a neighbour pixel's colour
    assert np.abs(warped - truth)[clear].max() < 1e-3


def test_colour_does_not_bleed_across_a_depth_edge():
    """The source sees a nearer red surface on its right half; the target's points land half a pixel between
    source pixels: those beside the edge take their colour from the far surface's pixels alone, even with a
    tolerance loose enough to accept the blended depth."""
    A = np.array([0.2, 0.4, 0.6])
    source_rgb, source_depth = np.tile(A, (48, 64, 1)), np.full((48, 64), 10.0)
    source_rgb[:, 32:], source_depth[:, 32:] = (1.0, 0.0, 0.0), 5.0
    # 0.1 m to the right at 10 m: target pixel j lands at source column j - 0.5, between columns j - 1 and j
    warped, valid = warp(source_rgb, source_depth, PIN, pose([0.1, 0.0, 0.0]), np.full((48, 64), 10.0), PIN,
                         np.eye(4), depth_tolerance=0.6)
    assert valid[:, 1:33].all() and not valid[:, 33:].any()
    assert np.abs(warped[valid] - A).max() < 1e-6


def test_a_point_the_source_saw_nearer_or_farther_is_not_valid():
    """Depths that disagree beyond the tolerance (the target's render is wrong there) are no reference."""
    T_target, T_source = pose([0.0, 0.0, 0.0]), pose([1.0, 0.0, 0.0])
    _, target_depth = view(PIN, T_target)
    source_rgb, source_depth = view(PIN, T_source)
    for scale, expect in ((1.03, True), (1.08, False), (0.92, False)):
        _, valid = warp(source_rgb, source_depth * scale, PIN, T_source, target_depth, PIN, T_target,
                        depth_tolerance=0.05)
        _, overlap = in_source(PIN, T_source, PIN, T_target, target_depth)
        assert valid[overlap].mean() > 0.99 if expect else not valid.any()


FRONT = np.array([[0, 0, 1], [-1, 0, 0], [0, -1, 0]], float)  # OpenCV camera -> vehicle (x forward, z up)
LEFT = np.array([[1, 0, 0], [0, 0, 1], [0, -1, 0]], float)  # looking along the vehicle's y


def _log(cameras=("front", "left")) -> DrivingLog:
    """17 frames 1 m apart along x, 0.1 s apart; "front" looks along x, "left" along y (no files)."""
    sensors = {}
    for name in cameras:
        T = np.eye(4)
        T[:3, :3] = FRONT if name == "front" else LEFT
        sensors[name] = CameraSensor(name, PIN, T)
    times = np.arange(17, dtype=np.int64) * 100_000
    poses = np.stack([pose([float(i), 0.0, 0.0]) for i in range(17)])  # (rotation-free: vehicle = world axes)
    frames = tuple(Frame(i, int(t), {c: CameraObs(c, int(t), f"cameras/{c}/{i:06d}.png") for c in cameras}, {})
                   for i, t in enumerate(times))
    return DrivingLog(Path("."), "test", "test", (), sensors, {}, times, poses, frames)


def test_nearest_training_views_are_the_nearest_and_never_held_out():
    log = _log()
    front = log.cameras["front"].T_vehicle_camera
    # at frame 8 (held out with holdout_every=8): its neighbours 7 and 9, the front camera's
    got = nearest_training_views(log, pose([8.0, 0, 0]) @ front, 800_000, k=2, sensor="front")
    assert sorted(f.index for f, _ in got) == [7, 9] and {o.sensor for _, o in got} == {"front"}
    # beside frame 3, 2 m to the left: frame 3 first, then 2 or 4
    got = nearest_training_views(log, pose([3.0, 2.0, 0]) @ front, 300_000, k=3, sensor="front")
    assert [f.index for f, _ in got][0] == 3 and {f.index for f, _ in got[1:]} == {2, 4}
    # no held-out frame, ever, even where one is nearest
    for x in np.linspace(0, 16, 33):
        got = nearest_training_views(log, pose([x, 0, 0]) @ front, int(x * 1e5), k=4, holdout_every=4)
        assert all(f.index % 4 for f, _ in got)
    assert [f.index for f, _ in nearest_training_views(log, pose([3.0, 0, 0]) @ front, 300_000, k=1,
                                                       exclude=[3])][0] in (2, 4)
    # looking to the left: the left camera, even though the front one stands at the same place
    left = log.cameras["left"].T_vehicle_camera
    assert nearest_training_views(log, pose([5.0, 0, 0]) @ left, 500_000, k=1)[0][1].sensor == "left"


def test_bad_input_names_the_argument():
    rgb, depth = view(PIN, np.eye(4))
    args = dict(source_rgb=rgb, source_depth=depth, source_camera=PIN, T_world_source=np.eye(4), target_depth=depth,
                target_camera=PIN, T_world_target=np.eye(4))
    for name, bad in (("source_rgb", rgb[:, :, :2]), ("source_depth", depth[1:]), ("target_depth", depth.T),
                      ("T_world_source", np.eye(3)), ("T_world_target", np.full((4, 4), np.nan)),
                      ("depth_tolerance", -0.1)):
        with pytest.raises(InputError, match=name):
            warp(**{**args, name: bad})
    with pytest.raises(InputError, match="target_depth"):
        warp(**{**args, "target_camera": DISTORTED, "target_depth": np.zeros((10, 10))})
    log = _log()
    for kw, name in ((dict(k=0), "k"), (dict(sensor="rear"), "sensor")):
        with pytest.raises(InputError, match=name):
            nearest_training_views(log, np.eye(4), 0, **kw)
    with pytest.raises(InputError, match="no training views"):
        nearest_training_views(_log(("front",)), np.eye(4), 0, exclude=range(17))
    with pytest.raises(InputError, match="scene"):
        references("scene", log, PIN, np.eye(4), 0)


def test_references_of_a_rendered_street_match_the_render_at_a_shifted_pose(tmp_path):
    """A log whose images are the scene's own renders: the references warped into a shifted camera are that
    camera's render where valid (up to the images' 8 bits and the checkerboard's edges, resampled)."""
    from gsim.images import render_image
    scene = gsim.Scene(background=plane(extent=40.0, spacing=0.5))
    camera = gsim.PinholeCamera(64, 40, 40.0, 40.0, 32.0, 20.0)
    T_vc = np.eye(4)
    T_vc[:3, :3], T_vc[:3, 3] = FRONT, (0.0, 0.0, 1.5)
    with LogWriter(tmp_path / "log", "refs", "test") as w:
        w.add_camera("front", camera, T_vc)
        for i in range(9):
            T_wv = pose([float(i), 0.0, 0.0])
            w.add_ego_pose(i * 100_000, T_wv)
            rgb = render_image(scene, camera, T_wv @ T_vc, i * 100_000, "front")[0]
            w.add_frame(i * 100_000, {"front": w.image("front", i, i * 100_000, np.round(rgb * 255))}, {})
    log = load_log(tmp_path / "log")
    T = pose([4.0, 0.7, 0.0]) @ T_vc  # frame 4 (held out: holdout_every=4) moved 0.7 m to the left
    truth, alpha, _ = render_image(scene, camera, T, 400_000, "front")
    refs = references(scene, log, camera, T, 400_000, k=2, holdout_every=4)
    assert len(refs) == 2
    for warped, valid in refs:
        assert valid[alpha > 0.99].mean() > 0.5 and not valid[alpha < 0.5].any()
        assert np.abs(warped - truth)[valid].mean() < 0.02
