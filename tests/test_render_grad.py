"""Differentiable numba rendering and the depth distortion: parity with the torch reference
(forward: tolerance and mismatch ratio; backward: relative L2 and cosine), an analytic
distortion, gradcheck of the reference's distortion, bad input."""
import math

import numpy as np
import pytest
import torch

import gsim
from gsim.render import pick_backend
from gsim.render.common import DISTORTION_FAR, DISTORTION_NEAR, DISTORTION_SCALE, RenderOptions
from support import CAMERAS, PIN, one_surfel, random_scene

PARAMS = ("means", "quats", "scales", "opacities", "colors")
OUTPUTS = ("rgb", "alpha", "depth", "normal", "distortion")
LOOK = gsim.transforms.look_at([0.3, -0.2, -0.5], [0, 0, 6], up=(0, -1, 0))
NEAR = 0.15


def hard_scene(seed, sh_degree):
    """A random scene seen from LOOK, plus surfels at 0.05-0.5 m from the camera (some culled by
    NEAR, some crossing it, so that ray hits in front of it are refused) and a stack of large
    opaque surfels (alpha clamps to 0.999 and pixels stop at the transmittance floor)."""
    rng = np.random.default_rng(seed)
    close = random_scene(16, seed + 1, sh_degree, spread=(0.08, 0.05, 0.12), z=0.25)  # camera frame
    close = gsim.Surfels(close.means @ LOOK[:3, :3].T + LOOK[:3, 3], close.quats,
                         close.scales * rng.uniform(0.03, 0.4, (16, 1)), close.opacities * 0.6, close.colors)
    parts = [random_scene(120, seed, sh_degree), close]
    k = (sh_degree + 1) ** 2
    for z in (3.0, 3.3, 3.6):
        sh = np.zeros((1, k, 3))
        sh[0, 0] = rng.normal(size=3) * 0.5
        q = np.r_[1.0, rng.normal(size=3) * 0.1]
        parts.append(gsim.Surfels(np.array([[rng.normal() * 0.2, rng.normal() * 0.2, z]]), q[None] / np.linalg.norm(q),
                                  np.array([[0.8, 0.6]]), np.array([1.0]), sh))
    return gsim.Surfels.concatenate(parts)


def render_with_grad(s, cam, T, backend, opts, weights=None):
    """The frame and the gradients of a linear loss sum_k <weights_k, output_k> (float32 leaves)."""
    st = s.torch(dtype=torch.float32)
    leaves = {k: getattr(st, k).clone().requires_grad_(True) for k in PARAMS}
    f = gsim.render_camera(gsim.Surfels(**leaves), cam, T, backend=backend, options=opts)
    if weights is not None:
        sum((w * getattr(f, k)).sum() for k, w in weights.items()).backward()
    return f, {k: v.grad for k, v in leaves.items()}


def linear_loss_weights(frame, seed, outputs):
    g = torch.Generator().manual_seed(seed)
    w = {k: torch.randn(getattr(frame, k).shape, generator=g) for k in outputs}
    if "distortion" in w:  # distortion is small (m ~ 0.2 / z): scale it to weigh like the others
        w["distortion"] /= frame.distortion.detach().abs().mean() + 1e-12
    return w


def assert_forward_close(a, b, keys=OUTPUTS):
    for k in keys:
        x, y = getattr(a, k).detach(), getattr(b, k).detach()
        err = (x - y).abs()
        tol = 1e-3 * max(float(x.abs().max()), 1e-6) if k == "distortion" else 1e-3
        assert float(err.max()) < 10 * tol and float((err > tol).float().mean()) < 1e-3, k


@pytest.mark.parametrize("cam", CAMERAS, ids=lambda c: c.model)
@pytest.mark.parametrize("sh_degree", [0, 3])
def test_forward_with_grad_matches_torch(cam, sh_degree):
    s = random_scene(200, seed=10 + sh_degree, sh_degree=sh_degree)
    opts = RenderOptions(background=(0.2, 0.3, 0.4), distortion=True)
    a, _ = render_with_grad(s, cam, LOOK, "torch", opts)
    b, _ = render_with_grad(s, cam, LOOK, "numba", opts)
    assert b.rgb.requires_grad and b.distortion.requires_grad
    assert float(a.alpha.detach().max()) > 0.5 and float(a.distortion.detach().max()) > 0
    assert_forward_close(a, b)
    # the differentiable path draws the same image as the forward-only one
    plain = gsim.render_camera(s, cam, LOOK, backend="numba", options=RenderOptions(background=(0.2, 0.3, 0.4)))
    assert plain.distortion is None
    for k in OUTPUTS[:4]:
        err = np.abs(getattr(plain, k) - getattr(b, k).detach().numpy())
        assert err.max() < 1e-2 and (err > 1e-4).mean() < 1e-3, k


@pytest.mark.parametrize("cam", CAMERAS[:2], ids=lambda c: c.model)
@pytest.mark.parametrize("sh_degree", [0, 1, 3])
@pytest.mark.parametrize("outputs", [OUTPUTS, ("distortion",)], ids=["all", "distortion"])
def test_backward_matches_torch(cam, sh_degree, outputs):
    s = hard_scene(seed=sh_degree, sh_degree=sh_degree)
    opts = RenderOptions(near=NEAR, background=(0.1, 0.5, 0.2), distortion=True)
    a, _ = render_with_grad(s, cam, LOOK, "torch", opts)
    assert float(a.alpha.detach().max()) > 0.998  # the clamp at 0.999 is exercised
    w = linear_loss_weights(a, seed=sh_degree, outputs=outputs)
    _, ga = render_with_grad(s, cam, LOOK, "torch", opts, w)
    _, gb = render_with_grad(s, cam, LOOK, "numba", opts, w)
    for k in PARAMS[:4] if outputs == ("distortion",) else PARAMS:  # colours do not move depths
        x, y = ga[k].flatten().double(), gb[k].flatten().double()
        assert x.norm() > 0, k
        rel = float((x - y).norm() / x.norm())
        cos = float(torch.nn.functional.cosine_similarity(x, y, dim=0))
        assert rel < 1e-3 and cos > 0.9999, (k, rel, cos)


def test_numba_gradients_do_not_depend_on_the_threads():
    """The backward sums each surfel's per-tile gradients in list order, not in the order threads finish tiles:
    one thread and two give the same bits (so a reconstruction is reproducible)."""
    import numba
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two numba threads")
    s = gsim.Surfels.concatenate([random_scene(400, seed=s, sh_degree=1) for s in range(3)])
    opts = RenderOptions(background=(0.1, 0.5, 0.2), distortion=True)
    f, _ = render_with_grad(s, PIN, LOOK, "torch", opts)
    w = linear_loss_weights(f, seed=4, outputs=OUTPUTS)
    grads = []
    previous = numba.get_num_threads()
    try:
        for n in (1, 2, 2):
            numba.set_num_threads(n)
            grads.append(render_with_grad(s, PIN, LOOK, "numba", opts, w)[1])
    finally:
        numba.set_num_threads(previous)
    for k in PARAMS:
        assert grads[0][k].abs().sum() > 0, k
        assert torch.equal(grads[0][k], grads[1][k]) and torch.equal(grads[1][k], grads[2][k]), k


@pytest.mark.parametrize("backend", ["torch", "numba"])
def test_distortion_of_two_layers(backend):
    # two fronto-parallel layers on the axis: w1 = a1, w2 = (1 - a1) a2, distortion w1 w2 (m1 - m2)^2
    near = one_surfel([0, 0, 1.0], scales=(5, 5), opacity=0.5)
    far = one_surfel([0, 0, 4.0], scales=(5, 5), opacity=0.8)
    f = gsim.render_camera(gsim.Surfels.concatenate([far, near]), PIN, np.eye(4), backend=backend,
                           options=RenderOptions(distortion=True))
    assert isinstance(f.distortion, np.ndarray) and f.distortion.shape == (64, 64)
    u = PIN.ray_table()[32, 32]
    a1 = 0.5 * math.exp(-0.5 * (u @ u) * 1.0 / 25)
    a2 = 0.8 * math.exp(-0.5 * (u @ u) * 16.0 / 25)
    m1, m2 = DISTORTION_SCALE / 1.0, DISTORTION_SCALE / 4.0
    expect = a1 * (1 - a1) * a2 * (m1 - m2) ** 2
    assert abs(f.distortion[32, 32] - expect) < 1e-5 * expect
    # 2DGS's NDC mapping differs from m by a constant only, which the distortion does not see
    ndc = lambda z: DISTORTION_FAR * (z - DISTORTION_NEAR) / ((DISTORTION_FAR - DISTORTION_NEAR) * z)
    assert abs((ndc(1.0) - ndc(4.0)) ** 2 - (m1 - m2) ** 2) < 1e-12
    # one layer alone: no distortion
    alone = gsim.render_camera(near, PIN, np.eye(4), backend=backend, options=RenderOptions(distortion=True))
    assert np.abs(alone.distortion).max() < 1e-9
    assert gsim.render_camera(near, PIN, np.eye(4), backend=backend).distortion is None


def test_gradcheck_torch_distortion_float64():
    s = random_scene(3, seed=5, sh_degree=0, spread=(0.2, 0.15, 0.6), z=1.2)
    cam = gsim.PinholeCamera(10, 8, 8.0, 8.0, 5.0, 4.0)
    params = [torch.tensor(x, dtype=torch.float64, requires_grad=True)
              for x in (s.means, s.quats, s.scales * 2, s.opacities * 0.8, s.colors)]
    wts = torch.rand((8, 10), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    opts = RenderOptions(distortion=True)

    def f(*p):
        out = gsim.render_camera(gsim.Surfels(*p), cam, np.eye(4), backend="torch", options=opts)
        return (wts * out.distortion).sum() * 100

    assert float(f(*params).detach()) > 0.1  # several layers overlap: the check is not of a constant
    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_numba_differentiable_is_the_auto_choice_on_cpu():
    assert gsim.render.BACKENDS["numba"].differentiable
    st = random_scene(5, seed=0).torch(dtype=torch.float32)
    leaves = gsim.Surfels(st.means.requires_grad_(True), st.quats, st.scales, st.opacities, st.colors)
    assert pick_backend("auto", leaves).name == ("gsplat" if "gsplat" in gsim.available_backends() else "numba")


def _on_meta(s):
    """``s`` with tensors on the meta device, standing in for CUDA (Surfels' checks need values)."""
    st = s.torch(dtype=torch.float32)
    out = object.__new__(gsim.Surfels)
    for k in PARAMS:
        object.__setattr__(out, k, getattr(st, k).to("meta").requires_grad_(k == "means"))
    object.__setattr__(out, "features", None)
    return out


def test_numba_grads_need_cpu_tensors():
    s = _on_meta(random_scene(5, seed=0))
    with pytest.raises(ValueError, match="numba backend: .*need CPU tensors, got surfels on meta"):
        gsim.render_camera(s, PIN, np.eye(4), backend="numba")
    if "gsplat" not in gsim.available_backends():
        assert pick_backend("auto", s).name == "torch"  # grads off the CPU: the torch reference


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_numba_grads_on_cuda_tensors_are_refused():
    st = random_scene(5, seed=0).torch(device="cuda", dtype=torch.float32)
    s = gsim.Surfels(st.means.requires_grad_(True), st.quats, st.scales, st.opacities, st.colors)
    with pytest.raises(ValueError, match="need CPU tensors, got surfels on cuda"):
        gsim.render_camera(s, PIN, np.eye(4), backend="numba")


def test_gsplat_refuses_distortion():
    from gsim.render import gsplat_backend
    with pytest.raises(NotImplementedError, match="distortion"):
        gsplat_backend.render(random_scene(5, seed=0), PIN, np.eye(4), RenderOptions(distortion=True))
