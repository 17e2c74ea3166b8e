"""Coplanar surfels composited as one surface (`RenderOptions.surface_eps`): the torch reference, the numba
backend's forward and backward against it, a scene that carries it."""
import dataclasses

import numpy as np
import pytest
import torch

from gsim.cameras import PinholeCamera
from gsim.errors import InputError
from gsim.render import render_camera
from gsim.render.common import RenderOptions
from gsim.scene import Scene, load_scene
from gsim.surfels import Surfels
from support import PIN, random_scene
from test_render_grad import LOOK, NEAR, PARAMS, assert_forward_close, hard_scene, linear_loss_weights, render_with_grad

CAM = PinholeCamera(160, 100, 114.0, 114.0, 80, 50)  # 70 degrees wide
T_FORWARD = np.array([[0.0, 0, 1, 0], [-1, 0, 0, 0], [0, -1, 0, 1.6], [0, 0, 0, 1]])  # 1.6 m up, along x


def road(spacing=0.2, sigma=0.12) -> Surfels:
    """A flat road of lying surfels (1-50 m ahead) whose grey encodes their x (x / 80)."""
    x, y = (a.ravel() for a in np.meshgrid(np.arange(1, 50, spacing), np.arange(-2, 2, spacing), indexing="ij"))
    n = len(x)
    return Surfels(np.c_[x, y, np.zeros(n)].astype(np.float32), np.tile([1.0, 0, 0, 0], (n, 1)).astype(np.float32),
                   np.full((n, 2), sigma, np.float32), np.full(n, 0.95, np.float32),
                   np.repeat((x / 80)[:, None], 3, 1).astype(np.float32))


def centre_column(frame):
    rgb, alpha, depth = (np.asarray(a).reshape(CAM.height, CAM.width, -1)[:, 79:81].mean(1)
                         for a in (frame.rgb, frame.alpha, frame.depth))
    return rgb[:, 0] / np.maximum(alpha[:, 0], 1e-9) * 80, depth[:, 0]


def test_a_road_renders_at_its_depth_and_its_own_colour_far_away():
    exact = {r: 1.6 * CAM.fy / (r + 0.5 - CAM.cy) for r in (80, 60, 57)}  # 6, 17, 24 m
    x_c, z_c = centre_column(render_camera(road(), CAM, T_FORWARD, backend="torch"))
    x_s, z_s = centre_column(render_camera(road(), CAM, T_FORWARD, backend="torch",
                                           options=RenderOptions(surface_eps=0.01)))
    for r, d in exact.items():
        row_m = d * d / (1.6 * CAM.fy)  # the road one pixel row spans there
        assert z_s[r] == pytest.approx(d, rel=0.005), r  # the plane's hit depth
        assert abs(x_s[r] - d) < 0.15 * row_m, r  # the colour of the road there, within the pixel
    # by centre depth the far rows show the road's near side, a pixel off and more (what surface_eps is for)
    assert z_c[57] < 0.9 * exact[57] and x_c[57] < exact[57] - exact[57] ** 2 / (1.6 * CAM.fy)


def test_surfaces_split_a_pixels_coverage_and_never_change_it():
    a = render_camera(road(), CAM, T_FORWARD, backend="torch")
    b = render_camera(road(), CAM, T_FORWARD, backend="torch", options=RenderOptions(surface_eps=0.01))
    # (front to back stops where the transmittance would fall below 1e-4, a surface takes all its coverage)
    np.testing.assert_allclose(np.asarray(b.alpha), np.asarray(a.alpha), atol=1e-3)


FACING = [np.sqrt(0.5), 0, -np.sqrt(0.5), 0]  # normal along -x: facing the camera
LYING = [1.0, 0, 0, 0]  # normal up: at the camera's height, seen edge-on


def layers(q=FACING) -> Surfels:
    """One wide surfel 5 m ahead (half transparent, red) and one 10 m ahead (blue)."""
    q = np.array([q] * 2, np.float32)
    means = np.array([[5.0, 0, 1.6], [10.0, 0, 1.6]], np.float32)
    return Surfels(means, q, np.full((2, 2), 3.0, np.float32), np.array([0.5, 0.9], np.float32),
                   np.array([[1.0, 0, 0], [0, 0, 1.0]], np.float32))


@pytest.mark.parametrize("q", [FACING, LYING])
def test_separate_surfaces_composite_front_to_back_as_before(q):
    a = render_camera(layers(q), CAM, T_FORWARD, backend="torch")
    b = render_camera(layers(q), CAM, T_FORWARD, backend="torch", options=RenderOptions(surface_eps=0.01))
    for name in ("rgb", "alpha"):
        np.testing.assert_allclose(np.asarray(getattr(b, name)), np.asarray(getattr(a, name)), atol=1e-5)
    if q is FACING:  # (edge-on, the low-pass draws them at their centres' depth; surfaces at their planes')
        np.testing.assert_allclose(np.asarray(b.depth), np.asarray(a.depth), atol=1e-4)
        centre = np.asarray(a.rgb).reshape(CAM.height, CAM.width, 3)[50, 80]
        assert centre[0] > 0.45 and centre[2] > 0.4  # both layers show: 0.5 red, 0.5 x 0.9 blue


def test_gradients_reach_the_surfels():
    s = road(spacing=0.4, sigma=0.25).torch()
    for name in ("means", "colors", "opacities"):
        getattr(s, name).requires_grad_(True)
    f = render_camera(s, CAM, T_FORWARD, backend="torch", options=RenderOptions(surface_eps=0.01))
    (f.rgb.sum() + f.depth.sum() * 1e-3).backward()
    for name in ("means", "colors", "opacities"):
        g = getattr(s, name).grad
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, name


C28, S28 = np.cos(np.radians(28)), np.sin(np.radians(28))
# pitched down 28 degrees: the road's far end (where a pixel's hits spread over more than NS surfaces) out of view
T_DOWN = np.array([[0.0, -S28, C28, 0], [-1, 0, 0, 0], [0, -C28, -S28, 1.6], [0, 0, 0, 1]])
NUMBA_CASES = {  # (surfels, camera, pose, options)
    "road": (road(spacing=0.4, sigma=0.25), CAM, T_DOWN, RenderOptions(surface_eps=0.01, background=(0.1, 0.5, 0.2))),
    "layers": (layers(), CAM, T_FORWARD, RenderOptions(surface_eps=0.01, distortion=True)),
    "random": (random_scene(200, seed=10, sh_degree=0), PIN, LOOK, RenderOptions(surface_eps=0.01, distortion=True)),
    # near-plane crossings, alpha clamped at 0.999, opaque stacks
    "hard": (hard_scene(0, 0), PIN, LOOK, RenderOptions(surface_eps=0.01, distortion=True, near=NEAR)),
}


@pytest.mark.parametrize("case", NUMBA_CASES)
def test_numba_composites_the_same_surfaces(case):
    s, cam, T, opts = NUMBA_CASES[case]
    a, _ = render_with_grad(s, cam, T, "torch", opts)
    b, _ = render_with_grad(s, cam, T, "numba", opts)
    keys = ("rgb", "alpha", "depth", "normal") + (("distortion",) if opts.distortion else ())
    assert_forward_close(a, b, keys)
    plain = render_camera(s, cam, T, backend="numba", options=opts)  # the forward-only path: the same image
    for k in keys[:4]:
        np.testing.assert_allclose(getattr(plain, k), getattr(b, k).detach().numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", NUMBA_CASES)
def test_numba_surface_gradients_match_torch(case):
    s, cam, T, opts = NUMBA_CASES[case]
    a, _ = render_with_grad(s, cam, T, "torch", opts)
    w = linear_loss_weights(a, seed=1, outputs=("rgb", "alpha", "depth", "normal")
                            + (("distortion",) if opts.distortion else ()))
    _, ga = render_with_grad(s, cam, T, "torch", opts, w)
    _, gb = render_with_grad(s, cam, T, "numba", opts, w)
    for k in PARAMS:
        x, y = ga[k].flatten().double(), gb[k].flatten().double()
        if case == "layers" and k == "scales":
            continue  # (two surfels wider than the view: their scales barely move a pixel)
        assert x.norm() > 0, k
        rel = float((x - y).norm() / x.norm())
        assert rel < 1e-3, (k, rel)


@pytest.mark.parametrize("backend", ["torch", "numba"])
def test_an_edge_on_surfel_stays_behind_what_is_in_front_of_its_centre(backend):
    """A lying surfel 20 m ahead, 5 cm below the camera: drawn by the low-pass, its plane meets the rays a pixel
    below the horizon 6 m ahead. Its hit counts within SURFACE_REACH of its centre's depth, so the red wall 10 m
    ahead still hides it."""
    q = np.array([FACING, LYING], np.float32)
    means = np.array([[10.0, 0, 1.6], [20.0, 0, 1.55]], np.float32)
    s = Surfels(means, q, np.array([[3.0, 3.0], [0.3, 0.3]], np.float32), np.array([0.99, 0.95], np.float32),
                np.array([[1.0, 0, 0], [0, 1.0, 0]], np.float32))
    f = render_camera(s, CAM, T_FORWARD, backend=backend, options=RenderOptions(surface_eps=0.01))
    rgb, depth = np.asarray(f.rgb)[50:52, 78:82], np.asarray(f.depth)[50:52, 78:82]
    assert rgb[..., 0].min() > 0.98 and rgb[..., 1].max() < 0.02
    np.testing.assert_allclose(depth, 10.0, rtol=0.02)


def test_a_pixel_keeps_at_most_NS_surfaces_and_the_next_joins_its_nearer_neighbour():
    from gsim.render.numba_surfaces import NS
    n = NS + 4  # facing layers 2% apart: each its own surface
    q = np.array([FACING] * n, np.float32)
    means = np.c_[5.0 * 1.02 ** np.arange(n), np.zeros(n), np.full(n, 1.6)].astype(np.float32)
    s = Surfels(means, q, np.full((n, 2), 3.0, np.float32), np.full(n, 0.2, np.float32),
                np.random.default_rng(0).uniform(0, 1, (n, 3)).astype(np.float32))
    opts = RenderOptions(surface_eps=0.01)
    a = render_camera(s, CAM, T_FORWARD, backend="torch", options=opts)
    b = render_camera(s, CAM, T_FORWARD, backend="numba", options=opts)
    np.testing.assert_allclose(b.alpha, np.asarray(a.alpha), atol=1e-5)  # the coverage is every surfel's
    err = np.abs(b.rgb - np.asarray(a.rgb)).max()
    assert 1e-4 < err < 0.05  # the last layers merged: close, not the same


def test_a_scene_renders_as_it_was_fitted(tmp_path):
    s = road()
    scene = Scene(background=s, surface_eps=0.01)
    scene.save(tmp_path / "scene")
    back = load_scene(tmp_path / "scene")
    assert back.surface_eps == 0.01
    want = render_camera(s, CAM, T_FORWARD, backend="numba", options=RenderOptions(surface_eps=0.01))
    got = render_camera(back, CAM, T_FORWARD, backend="numba")
    np.testing.assert_array_equal(got.depth, want.depth)
    plain = dataclasses.replace(back, surface_eps=0.0)
    assert not np.array_equal(render_camera(plain, CAM, T_FORWARD, backend="numba").depth, want.depth)
    with pytest.raises(InputError, match="Scene.surface_eps"):
        Scene(background=s, surface_eps=1.5)


def test_bad_values_are_named():
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(InputError, match="surface_eps"):
            RenderOptions(surface_eps=bad)


def test_training_with_surfaces_needs_a_backend_that_has_them(tmp_path):
    from gsim.scenes.reconstruction.train import preset, start
    with pytest.raises(InputError, match="gsplat composites surfels by their centres' depth only"):
        start(tmp_path / "no-log", preset("cuda", surface_eps=0.01))
    with pytest.raises(InputError, match="surface_eps"):
        start(tmp_path / "no-log", preset("cpu", surface_eps=2.0))


def test_a_scene_of_surfaces_is_drawn_so_by_every_path_and_auto_never_picks_gsplat(monkeypatch):
    import gsim.render as render
    from gsim.resident import Renderer
    scene = Scene(background=road(spacing=0.4, sigma=0.25), surface_eps=0.01)
    want = render_camera(scene.background, CAM, T_DOWN, backend="numba", options=RenderOptions(surface_eps=0.01))
    for backend in ("auto", "torch"):  # the host path (numba) and the device path (the torch backend)
        got = Renderer(scene, backend).camera(CAM, T_DOWN, numpy=True)
        np.testing.assert_allclose(got.depth, want.depth, rtol=1e-4)
    gsplat = dataclasses.replace(render.BACKENDS["gsplat"], probe=lambda: None)  # as if gsplat ran here
    monkeypatch.setitem(render.BACKENDS, "gsplat", gsplat)
    assert render.pick_backend("auto", scene.background).name == "gsplat"
    assert render.pick_backend("auto", scene.background, surfaces=True).name == "numba"
    assert Renderer(scene).backend == "numba"
