"""Coplanar surfels composited as one surface (`RenderOptions.surface_eps`, the torch backend)."""
import numpy as np
import pytest
import torch

from gsim.cameras import PinholeCamera
from gsim.errors import InputError
from gsim.render import render_camera
from gsim.render.common import RenderOptions
from gsim.surfels import Surfels

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


def test_backends_that_composite_by_centre_depth_refuse_it_and_bad_values_are_named():
    with pytest.raises(InputError, match="numba backend composites surfels by their centres' depth only"):
        render_camera(layers(), CAM, T_FORWARD, backend="numba", options=RenderOptions(surface_eps=0.01))
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(InputError, match="surface_eps"):
            RenderOptions(surface_eps=bad)
