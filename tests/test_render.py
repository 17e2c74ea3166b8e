"""Camera rendering: analytic cases, an independent dense oracle, backend parity, gradients."""
import math

import numpy as np
import pytest
import torch

import gsim
from gsim.render.common import RenderOptions
from support import CAMERAS, PIN, one_surfel, random_scene

BACKENDS = ["torch", "numba"]


def quat_axis_angle(axis, angle):
    axis = np.asarray(axis, float) / np.linalg.norm(axis)
    return np.concatenate([[math.cos(angle / 2)], math.sin(angle / 2) * axis])


def pixel_rays(cam):
    return cam.ray_table()  # (H,W,2) rays (x/z, y/z) through pixel centres


def dense_oracle(surfels, cam, near=0.01, bg=(0, 0, 0)):
    """A per-pixel numpy loop over all surfels (no tiles, no bounds): the 2DGS definition, camera = world."""
    s = surfels.numpy()
    from gsim.transforms import quat_to_rotmat
    R = quat_to_rotmat(s.quats / np.linalg.norm(s.quats, axis=1, keepdims=True))
    order = np.argsort(s.means[:, 2], kind="stable")
    rays = pixel_rays(cam)
    out = {k: np.zeros((cam.height, cam.width) + sh) for k, sh in
           (("rgb", (3,)), ("alpha", ()), ("depth", ()), ("normal", (3,)))}
    rgb_all = np.clip(s.colors[:, 0] * 0.28209479177387814 + 0.5, 0, None)  # SH degree 0 only
    for i in range(cam.height):
        for j in range(cam.width):
            u, v = rays[i, j]
            if not np.isfinite(u):
                continue
            r = np.array([u, v, 1.0])
            T, acc = 1.0, np.zeros(8)
            for k in order:
                c = s.means[k].astype(float)
                if c[2] <= near:
                    continue
                tu, tv, n = R[k][:, 0] * s.scales[k, 0], R[k][:, 1] * s.scales[k, 1], R[k][:, 2]
                # ray-plane hit: t r = c + a tu + b tv
                A = np.stack([tu, tv, -r], 1)
                rho3, z = np.inf, c[2]
                if abs(np.linalg.det(A)) > 1e-12:
                    a, b, t = np.linalg.solve(A, -c)
                    if t > near:
                        rho3, z3 = a * a + b * b, t
                d = np.array([(u - c[0] / c[2]) * cam.fx, (v - c[1] / c[2]) * cam.fy])
                rho2 = 2 * d @ d
                if rho3 <= rho2:
                    rho, z = rho3, z3
                else:
                    rho = rho2
                alpha = min(0.999, s.opacities[k] * math.exp(-0.5 * rho))
                if alpha < 1 / 255:
                    continue
                if T * (1 - alpha) <= 1e-4:
                    break
                w = alpha * T
                nn = -n if n @ c > 0 else n
                acc += w * np.concatenate([rgb_all[k], [1.0, z], nn])
                T *= 1 - alpha
            a = acc[3]
            out["rgb"][i, j] = acc[:3] + (1 - a) * np.asarray(bg)
            out["alpha"][i, j] = a
            out["depth"][i, j] = acc[4] / a if a > 0 else 0
            out["normal"][i, j] = acc[5:] / a if a > 0 else 0
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_fronto_parallel_surfel_exact_depth_and_footprint(backend):
    z, s, o = 5.0, 0.2, 0.9
    f = gsim.render_camera(one_surfel([0, 0, z], scales=(s, s), opacity=o), PIN, np.eye(4), backend=backend)
    rays = pixel_rays(PIN)
    rho3 = (rays[..., 0] ** 2 + rays[..., 1] ** 2) * z * z / (s * s)  # 3D Gaussian wins: 4 px sigma
    expect = np.minimum(o * np.exp(-0.5 * rho3), 0.999)
    expect[expect < 1 / 255] = 0
    assert np.abs(f.alpha - expect).max() < 1e-5
    hit = expect > 0
    assert hit.sum() > 100 and not np.any(f.alpha[~hit])  # the footprint, and nothing outside it
    assert np.abs(f.depth[hit] - z).max() < 1e-5
    assert np.allclose(f.normal[hit], [0, 0, -1], atol=1e-6)  # facing the camera
    assert np.allclose(f.rgb[..., 0], f.alpha * 1.0, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotated_surfel_ellipse_axes(backend):
    theta, z, s0, s1 = math.radians(30), 5.0, 0.4, 0.1
    f = gsim.render_camera(one_surfel([0, 0, z], quat_axis_angle([0, 0, 1], theta), (s0, s1), 1.0),
                           PIN, np.eye(4), backend=backend)
    rays = pixel_rays(PIN)
    x, y = rays[..., 0] * z, rays[..., 1] * z
    a = (math.cos(theta) * x + math.sin(theta) * y) / s0
    b = (-math.sin(theta) * x + math.cos(theta) * y) / s1
    px = np.stack([rays[..., 0] * PIN.fx, rays[..., 1] * PIN.fy], -1)
    rho = np.minimum(a * a + b * b, 2 * (px ** 2).sum(-1))  # with the object-space low-pass filter
    expect = np.minimum(np.exp(-0.5 * rho), 0.999)
    expect[expect < 1 / 255] = 0
    assert np.abs(f.alpha - expect).max() < 1e-5
    # the footprint is an ellipse with axes along 30 deg, ratio s0/s1 = 4
    w = f.alpha / f.alpha.sum()
    m = np.array([(w * px[..., 0]).sum(), (w * px[..., 1]).sum()])
    d = px - m
    cov = np.einsum("hw,hwi,hwj->ij", w, d, d)
    evals, evecs = np.linalg.eigh(cov)
    major = evecs[:, 1] * np.sign(evecs[0, 1])
    assert abs(math.degrees(math.atan2(major[1], major[0])) - 30) < 0.5
    assert abs(math.sqrt(evals[1] / evals[0]) - 4) < 0.1


@pytest.mark.parametrize("backend", BACKENDS)
def test_tilted_surfel_depth_is_the_ray_plane_hit(backend):
    phi, c = math.radians(50), np.array([0.1, -0.05, 4.0])
    f = gsim.render_camera(one_surfel(c, quat_axis_angle([1, 0, 0], phi), (0.5, 0.5), 0.95),
                           PIN, np.eye(4), backend=backend)
    n = np.array([0, -math.sin(phi), math.cos(phi)])
    rays = pixel_rays(PIN)
    r = np.concatenate([rays, np.ones(rays.shape[:2] + (1,))], -1)
    expect = (n @ c) / (r @ n)
    # away from the centre pixel, where the 2D filter may win and centre depth is used
    far = (rays[..., 0] * PIN.fx - c[0] / c[2] * PIN.fx) ** 2 + \
          (rays[..., 1] * PIN.fy - c[1] / c[2] * PIN.fy) ** 2 > 9
    hit = (f.alpha > 0.01) & far
    assert hit.sum() > 200
    assert np.abs(f.depth[hit] - expect[hit]).max() < 2e-4
    assert np.ptp(f.depth[hit]) > 1.0  # the depth really varies across the tilted surfel


@pytest.mark.parametrize("backend", BACKENDS)
def test_semi_transparent_compositing_in_depth_order(backend):
    red = one_surfel([0, 0, 4.0], scales=(3, 3), opacity=0.5, rgb=(1, 0, 0))
    blue = one_surfel([0, 0, 6.0], scales=(3, 3), opacity=0.8, rgb=(0, 0, 1))
    for pair in ([red, blue], [blue, red]):  # array order must not matter
        f = gsim.render_camera(gsim.Surfels.concatenate(pair), PIN, np.eye(4), backend=backend,
                               options=RenderOptions(background=(0, 1, 0)))
        u = pixel_rays(PIN)[32, 32]
        g = lambda z, s: math.exp(-0.5 * (u @ u) * z * z / (s * s))
        a1, a2 = 0.5 * g(4, 3), 0.8 * g(6, 3)
        w1, w2 = a1, (1 - a1) * a2
        assert np.allclose(f.rgb[32, 32], [w1, 1 - w1 - w2, w2], atol=1e-5)
        assert abs(f.depth[32, 32] - (4 * w1 + 6 * w2) / (w1 + w2)) < 1e-4


@pytest.mark.parametrize("cam", CAMERAS, ids=lambda c: c.model)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_dense_oracle(cam, backend):
    s = random_scene(40, seed=3, sh_degree=0, spread=(1.5, 1.0, 1.0), z=4.0)
    ref = dense_oracle(s, cam)
    f = gsim.render_camera(s, cam, np.eye(4), backend=backend)
    for k in ("rgb", "alpha", "normal"):
        err = np.abs(getattr(f, k) - ref[k])
        assert err.max() < 2e-3 and (err > 1e-4).mean() < 0.01, k
    derr = np.abs(f.depth - ref["depth"])
    assert (derr > 1e-3).mean() < 0.01


@pytest.mark.parametrize("cam", CAMERAS, ids=lambda c: c.model)
@pytest.mark.parametrize("sh_degree", [0, 1, 3])
def test_numba_matches_torch(cam, sh_degree):
    s = random_scene(300, seed=sh_degree, sh_degree=sh_degree)
    T = gsim.transforms.look_at([0.3, -0.2, -0.5], [0, 0, 6], up=(0, -1, 0))
    opts = RenderOptions(background=(0.2, 0.3, 0.4))
    a = gsim.render_camera(s, cam, T, backend="torch", options=opts)
    b = gsim.render_camera(s, cam, T, backend="numba", options=opts)
    assert a.alpha.max() > 0.5
    for k in ("rgb", "alpha", "normal", "depth"):
        err = np.abs(getattr(a, k) - getattr(b, k))
        assert err.max() < 1e-2 and (err > 1e-3).mean() < 1e-3, k


@pytest.mark.parametrize("cam", CAMERAS, ids=lambda c: c.model)
def test_numba_culls_out_of_view_surfels_without_changing_a_pixel(cam):
    """Surfels all around the view, many across its edges and some behind the camera: numba tests each one
    against the view before projecting it; torch projects them all. The images agree."""
    s = random_scene(600, seed=7, sh_degree=0, spread=(6.0, 5.0, 4.0), z=3.0)
    a = gsim.render_camera(s, cam, np.eye(4), backend="torch")
    b = gsim.render_camera(s, cam, np.eye(4), backend="numba")
    assert 0.1 < (a.alpha > 0.5).mean() < 1.0
    for k in ("rgb", "alpha", "normal", "depth"):
        err = np.abs(getattr(a, k) - getattr(b, k))
        assert err.max() < 1e-2 and (err > 1e-3).mean() < 1e-3, k


def test_numba_matches_torch_on_the_street():
    from gsim.street import demo_camera, drive_trajectory, street_surfels
    s = street_surfels(20_000, seed=1)
    cam, T = demo_camera(160, 90), drive_trajectory(5)[2]
    a = gsim.render_camera(s, cam, T, backend="torch")
    b = gsim.render_camera(s, cam, T, backend="numba")
    assert a.alpha.mean() > 0.5
    err = np.abs(a.rgb - b.rgb)
    assert (err > 2e-3).mean() < 1e-3
    assert (np.abs(a.depth - b.depth) > 1e-2 * np.maximum(a.depth, 1)).mean() < 1e-3


def test_gradcheck_torch_float64():
    s = random_scene(3, seed=7, sh_degree=1, spread=(0.3, 0.2, 0.1), z=3.0)
    cam = gsim.PinholeCamera(10, 8, 8.0, 8.0, 5.0, 4.0)
    params = [torch.tensor(x, dtype=torch.float64, requires_grad=True)
              for x in (s.means, s.quats, s.scales, s.opacities * 0.8, s.colors)]
    wts = [torch.randn(sh, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
           for sh in ((8, 10, 3), (8, 10), (8, 10), (8, 10, 3))]

    def f(*p):
        out = gsim.render_camera(gsim.Surfels(*p), cam, np.eye(4), backend="torch")
        return sum((w * x).sum() for w, x in zip(wts, (out.rgb, out.alpha, out.depth, out.normal)))

    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_output_types_follow_the_input():
    s = random_scene(20, seed=0)
    f = gsim.render_camera(s, PIN, np.eye(4))
    assert isinstance(f.rgb, np.ndarray) and f.rgb.shape == (64, 64, 3) and f.depth.shape == (64, 64)
    st = s.torch(dtype=torch.float32)
    means = st.means.clone().requires_grad_(True)
    ft = gsim.render_camera(gsim.Surfels(means, st.quats, st.scales, st.opacities, st.colors), PIN, np.eye(4))
    assert isinstance(ft.rgb, torch.Tensor)
    ft.rgb.sum().backward()  # auto picks the differentiable backend for tensors that need grad
    assert means.grad is not None and means.grad.abs().sum() > 0
    fn = gsim.render_camera(st, PIN, np.eye(4), backend="numba")
    assert isinstance(fn.alpha, torch.Tensor) and np.allclose(fn.alpha.numpy(), f.alpha, atol=1e-4)


def test_distorted_camera_places_a_small_surfel_where_the_model_projects_it():
    cam = gsim.OpenCVCamera(96, 64, 60.0, 60.0, 48.0, 32.0, k1=-0.3, k2=0.1)
    c = np.array([1.2, 0.6, 3.0])
    f = gsim.render_camera(one_surfel(c, scales=(0.01, 0.01)), cam, np.eye(4), backend="numba")
    jj, ii = np.meshgrid(np.arange(96) + 0.5, np.arange(64) + 0.5)
    w = f.alpha / f.alpha.sum()
    centroid = np.array([(w * jj).sum(), (w * ii).sum()])
    uv, ok = cam.project(c[None])
    assert ok[0] and np.linalg.norm(centroid - uv[0]) < 0.05


def test_scene_actor_follows_its_track():
    track = np.tile(np.eye(4), (2, 1, 1))
    track[1, 0, 3] = 2.0  # moves 2 m along x between t=0 and t=1 s
    actor = gsim.Actor("car_1", "car", (4.0, 2.0, 1.5), one_surfel([0, 0, 0], scales=(0.05, 0.05), opacity=1.0),
                       np.array([0, 1_000_000]), track)
    bg = one_surfel([0, 0, 50.0], scales=(0.01, 0.01), opacity=0.0)
    scene = gsim.Scene(background=bg, actors=(actor,))
    T = np.eye(4)
    T[2, 3] = -5.0  # camera 5 m behind the origin looking along +z
    f = gsim.render_camera(scene, PIN, T, timestamp_us=500_000)
    jj = np.arange(64) + 0.5
    col = (f.alpha.sum(0) * jj).sum() / f.alpha.sum()
    assert abs(col - (32 + 100 * 1.0 / 5.0)) < 0.1  # x = 1 m at 5 m depth
    with pytest.raises(ValueError, match="timestamp_us"):
        gsim.render_camera(scene, PIN, T)


def test_numba_draws_actors_in_their_own_frames_like_world_surfels():
    """A scene's parts (actors in their box frames, view-dependent colour included) render like the same
    surfels moved into the world."""
    rng = np.random.default_rng(3)
    P = np.eye(4)
    P[:3, :3] = gsim.transforms.quat_to_rotmat(quat_axis_angle(rng.normal(size=3), 0.9))
    P[:3, 3] = (0.5, -0.3, 1.0)
    pose_shift = np.eye(4)
    pose_shift[:3, 3] = (1.0, 0.2, -0.5)
    actors = tuple(gsim.Actor(f"a{k}", "car", (2.0, 2.0, 2.0), random_scene(300, k, sh_degree=2, z=0.0),
                              np.array([0, 1_000_000]), np.stack([P, P @ pose_shift]))
                   for k in range(2))
    scene = gsim.Scene(background=random_scene(500, 9, sh_degree=2), actors=actors)
    T = np.eye(4)
    T[2, 3] = -4.0
    parts = gsim.render_camera(scene, PIN, T, backend="numba", timestamp_us=400_000)
    world = gsim.render_camera(scene.at(400_000), PIN, T, backend="numba")
    for k in ("rgb", "alpha", "depth", "normal"):
        assert np.abs(getattr(parts, k) - getattr(world, k)).max() < 2e-4, k


def test_bad_render_input_is_reported():
    s = random_scene(5, seed=0)
    with pytest.raises(ValueError, match="unknown backend 'vulkan'"):
        gsim.render_camera(s, PIN, np.eye(4), backend="vulkan")
    with pytest.raises(ValueError, match="T_world_camera"):
        gsim.render_camera(s, PIN, np.ones((4, 4)))
    with pytest.raises(TypeError, match="camera model"):
        gsim.render_camera(s, object(), np.eye(4))
    with pytest.raises(TypeError, match="Scene or Surfels"):
        gsim.render_camera(np.zeros((3, 3)), PIN, np.eye(4))
    with pytest.raises(ValueError, match="near"):
        RenderOptions(near=0.0)
    if "gsplat" not in gsim.available_backends():
        with pytest.raises(RuntimeError, match="gsplat.*not available: .+"):
            gsim.render_camera(s, PIN, np.eye(4), backend="gsplat")


def test_backend_registry():
    names = gsim.available_backends()
    assert {"torch", "numba"} <= set(names)
    report = gsim.backend_report()
    assert set(report) == {"torch", "numba", "gsplat"}
    assert report["gsplat"] == "available" or len(report["gsplat"]) > 10
    assert ("gsplat" in names) == torch.cuda.is_available() or report["gsplat"] != "available"


needs_cuda = pytest.mark.skipif("gsplat" not in gsim.available_backends(),
                                reason="gsplat backend not available: " + gsim.backend_report()["gsplat"])


@pytest.mark.cuda
@needs_cuda
def test_gsplat_matches_torch_forward_and_backward():
    s = random_scene(500, seed=11, sh_degree=2).torch(device="cuda", dtype=torch.float32)
    cam = gsim.PinholeCamera(160, 120, 120.0, 120.0, 80.0, 60.0)
    T = gsim.transforms.look_at([0.2, 0.1, -0.5], [0, 0, 6], up=(0, -1, 0))
    leaves = {}

    def run(backend):
        p = {k: getattr(s, k).detach().clone().requires_grad_(True) for k in
             ("means", "quats", "scales", "opacities", "colors")}
        f = gsim.render_camera(gsim.Surfels(**p), cam, T, backend=backend)
        (f.rgb.sum() + f.alpha.sum()).backward(retain_graph=True)
        if backend == "gsplat":  # (its depth's gradients reach the surfels through gsplat's normals)
            assert all(bool(torch.isfinite(x).all()) for x in torch.autograd.grad(f.depth.sum(), list(p.values())[:3]))
        leaves[backend] = p
        return f
    a, b = run("torch"), run("gsplat")
    err = (a.rgb - b.rgb).abs()
    assert (err > 1e-2).float().mean() < 1e-2
    assert ((a.alpha - b.alpha).abs() > 1e-2).float().mean() < 1e-2
    # the hit depth from per-surfel planes (the CPU stand-in of bench/gsplat_composition_check.py: 3e-3)
    solid = (a.alpha > 0.9) & (b.alpha > 0.9)
    assert float((b.depth / a.depth - 1).abs()[solid].median()) < 1e-2
    for k in ("means", "opacities", "colors"):
        ga, gb = leaves["torch"][k].grad.flatten(), leaves["gsplat"][k].grad.flatten()
        assert torch.nn.functional.cosine_similarity(ga, gb, dim=0) > 0.95, k
        assert (ga - gb).norm() / ga.norm() < 0.3, k


@pytest.mark.cuda
@needs_cuda
def test_gsim_rasterize_pixels_is_gsplats_without_its_backward_wait(monkeypatch):
    """gsplat_backend.rasterize_pixels (gsim's Function around gsplat's 2DGS rasterization kernels) gives gsplat's
    rasterize_to_pixels_2dgs' outputs and gradients bit for bit, and its backward does not synchronise the GPU
    (gsplat 1.5.3's does: torch.cuda.synchronize() once a training step)."""
    from gsplat import fully_fused_projection_2dgs, isect_offset_encode, isect_tiles, rasterize_to_pixels_2dgs

    from gsim.render.gsplat_backend import rasterize_pixels
    s = random_scene(500, seed=12, sh_degree=0).torch(device="cuda", dtype=torch.float32)
    cam = gsim.PinholeCamera(96, 64, 80.0, 80.0, 48.0, 32.0)
    on = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.float32, device="cuda")  # noqa: E731
    V = on(gsim.transforms.invert(gsim.transforms.look_at([0.2, 0.1, -0.5], [0, 0, 6], up=(0, -1, 0))))[None]
    radii, means2d, depths, M, normals = fully_fused_projection_2dgs(
        s.means, s.quats, torch.cat([s.scales, torch.ones_like(s.scales[:, :1])], 1), V, on(cam.K)[None], 96, 64)
    _, ids, flat = isect_tiles(means2d, radii, depths, 16, 6, 4)
    offsets = isect_offset_encode(ids, 1, 6, 4).reshape(1, 4, 6)
    colors = torch.cat([s.colors[None, :, 0].clamp_min(0), torch.rand(1, len(s.means), 5, device="cuda")], -1)
    bg = torch.rand(1, 8, device="cuda")
    syncs = []
    sync = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(1) or sync(*a))
    runs = []
    for call in (lambda *x: rasterize_to_pixels_2dgs(*x, 96, 64, 16, offsets, flat, backgrounds=bg)[:3],
                 lambda *x: rasterize_pixels(*x, 96, 64, 16, offsets, flat, bg)):
        leaves = [x.detach().clone().requires_grad_(True) for x in
                  (means2d, M, colors, s.opacities[None].detach(), normals, torch.zeros_like(means2d))]
        outs = call(*leaves)
        n = len(syncs)
        loss = sum((o * torch.linspace(0, 1, o.numel(), device="cuda").view(o.shape)).sum() for o in outs)
        runs.append((outs, torch.autograd.grad(loss, leaves), len(syncs) - n))
    (theirs, their_grads, their_syncs), (ours, our_grads, our_syncs) = runs
    assert float(theirs[1].max()) > 0.5 and their_syncs == 1 and our_syncs == 0
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours))
    assert all(torch.equal(a, b) for a, b in zip(their_grads, our_grads))


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("camera", CAMERAS[1:], ids=["opencv", "fisheye"])
def test_gsplat_resamples_distorted_cameras_like_the_exact_backends(camera):
    # gsplat has no distortion model: a pinhole cover image resampled at each pixel's ray (approximate)
    s = random_scene(300, seed=5, sh_degree=0, z=4.0)
    T = gsim.transforms.look_at([0.0, 0.0, -0.5], [0, 0, 6], up=(0, -1, 0))
    a, b = (gsim.render_camera(s, camera, T, backend=k) for k in ("numba", "gsplat"))
    err = np.abs(np.asarray(a.rgb) - np.asarray(b.rgb)).max(-1)
    aerr = np.abs(np.asarray(a.alpha) - np.asarray(b.alpha))
    assert np.mean(err > 0.1) < 0.05 and np.mean(aerr > 0.1) < 0.05, (np.mean(err > 0.1), np.mean(aerr > 0.1))
    assert np.mean(err) < 0.03, np.mean(err)


def test_gsplat_cover_of_a_wide_fisheye_is_refused():
    """A distorted camera renders on gsplat through a pinhole image covering its rays; a fisheye whose rays reach
    89 degrees off its axis would need one of 1.6 billion pixels: a clear error instead of running out of memory."""
    from gsim.errors import InputError
    from gsim.render.gsplat_backend import _pinhole_cover
    cover = _pinhole_cover(CAMERAS[2])
    assert cover.width >= CAMERAS[2].width and cover.height >= CAMERAS[2].height
    wide = gsim.FisheyeCamera(1280, 960, 400.0, 400.0, 640.0, 480.0)
    with pytest.raises(InputError, match="FisheyeCamera of 1280x960 whose rays reach 8[89].* backend 'numba'"):
        _pinhole_cover(wide)


def _depth_channels(s: gsim.Surfels, camera):
    """gsplat_backend.depth_channels of surfels seen from the origin (camera = world), normals facing the camera."""
    from gsim.render.gsplat_backend import depth_channels
    from gsim.transforms import quat_to_rotmat
    n = quat_to_rotmat(s.quats / np.linalg.norm(s.quats, axis=1, keepdims=True))[:, :, 2]
    n = np.where((n * s.means).sum(1, keepdims=True) > 0, -n, n)
    t = lambda x: torch.as_tensor(np.asarray(x)[None], dtype=torch.float64)  # noqa: E731
    return depth_channels(t(s.means), t(n), t(s.scales.max(1))[0], t(camera.K), 0.01)[0]


def test_gsplat_depth_is_the_hit_depth_of_one_surfel():
    """gsplat composites values constant per surfel: from its depth channels (weighted by the surfel's weight w, as
    gsplat sums them) the backend's depth is the ray-surfel hit depth at every pixel, as the torch backend's."""
    from gsim.render.gsplat_backend import hit_depth
    s = one_surfel([0.2, 0.1, 3.0], quat=quat_axis_angle([1, 0.3, 0], 1.0), scales=(0.5, 0.3), opacity=0.99)
    ref = gsim.render_camera(s, PIN, np.eye(4), backend="torch")
    w = torch.as_tensor(ref.alpha)[None]
    depth = hit_depth(w[..., None] * _depth_channels(s, PIN)[0], w, torch.as_tensor(PIN.K)[None], (64, 64))[0]
    seen = ref.alpha > 0.05
    assert seen.sum() > 200 and np.ptp(ref.depth[seen]) > 0.5  # tilted: its depth spans half a metre
    assert np.allclose(depth.numpy()[seen], ref.depth[seen], rtol=1e-6)
    assert np.all(depth.numpy()[~(ref.alpha > 0)] == 0)


def test_gsplat_depth_blends_surfels_facing_the_camera_by_their_weights():
    from gsim.render.gsplat_backend import hit_depth
    s = gsim.Surfels.concatenate([one_surfel([0.0, 0.0, z]) for z in (2.0, 5.0)])
    ch = _depth_channels(s, PIN)
    w = torch.tensor([0.6, 0.3], dtype=torch.float64)  # (their weights at one pixel)
    depth = hit_depth((w[:, None] * ch).sum(0)[None, None, None].expand(1, 64, 64, 5), w.sum().expand(1, 64, 64),
                      torch.as_tensor(PIN.K)[None], (64, 64))
    assert torch.allclose(depth, torch.tensor(0.6 * 2 + 0.3 * 5, dtype=torch.float64) / 0.9)


@pytest.mark.parametrize("case", ["edge-on", "reaching the camera"])
def test_gsplat_depth_takes_the_centre_where_a_surfels_plane_is_not_what_it_shows(case):
    # edge-on: its 2D filter's pixels would get plane depths far from its own; near: its plane meets rays behind
    quat, centre = ((quat_axis_angle([0, 1, 0], math.pi / 2), [0.05, 0.0, 4.0]) if case == "edge-on" else
                    (quat_axis_angle([1, 0, 0], 1.2), [0.0, 0.0, 0.3]))
    ch = _depth_channels(one_surfel(centre, quat=quat, scales=(0.4, 0.4)), PIN)[0]
    assert torch.allclose(ch, torch.tensor([0, 0, 1 / centre[2], 1 / centre[2], centre[2]], dtype=torch.float64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_compositing_stops_at_the_transmittance_floor(backend):
    # three opaque layers: alpha clamps to 0.999, T = 1e-3 after the first, and the second
    # would take T to 1e-6 <= 1e-4, so the pixel is done (exclusive): only the first counts
    layers = [one_surfel([0, 0, z], scales=(20, 20), opacity=1.0, rgb=c)
              for z, c in ((2.0, (1, 0, 0)), (3.0, (0, 1, 0)), (4.0, (0, 0, 1)))]
    f = gsim.render_camera(gsim.Surfels.concatenate(layers), PIN, np.eye(4), backend=backend,
                           options=RenderOptions(background=(0, 0, 1)))
    assert np.allclose(f.alpha, 0.999, atol=1e-6)
    assert np.allclose(f.rgb[32, 32], [0.999, 0.0, 0.001], atol=1e-6)
    assert np.allclose(f.depth, 2.0, atol=1e-5)


def test_rolling_shutter_bands_render_at_their_rows_times():
    from dataclasses import replace
    from gsim.render import ROLLING_SHUTTER_BANDS
    from gsim.street import demo_camera, street_surfels
    s = street_surfels(20000)
    cam = demo_camera(96, 64)
    T0 = np.eye(4)
    T0[:3, :3] = [[0, 0, 1], [-1, 0, 0], [0, -1, 0]]  # looking along +x
    T0[:3, 3] = [0.0, -1.5, 1.5]
    T1 = T0.copy()
    T1[0, 3] += 2.0
    traj = (np.array([0, 100_000]), np.stack([T0, T1]))
    still = gsim.render_camera(s, cam, T0)
    assert np.array_equal(gsim.render_camera(s, cam, T0, readout_us=30_000).rgb, still.rgb)  # no motion, no change
    assert np.array_equal(gsim.render_camera(s, cam, traj, timestamp_us=0).rgb, still.rgb)  # global shutter: at t0
    f = gsim.render_camera(s, cam, traj, timestamp_us=0, readout_us=60_000)
    rows = 64 // ROLLING_SHUTTER_BANDS
    for b in (0, ROLLING_SHUTTER_BANDS - 1):  # each band is the image at its middle row's time, exactly
        r0 = b * rows
        t = int(round(60_000 * (2 * r0 + rows) / (2 * 64)))
        T = T0.copy()
        T[0, 3] += 2.0 * t / 100_000
        g = gsim.render_camera(s, replace(cam, height=rows, cy=cam.cy - r0), T)
        assert np.allclose(f.rgb[r0:r0 + rows], g.rgb, atol=1e-6) and np.allclose(f.depth[r0:r0 + rows], g.depth, atol=1e-5)
    assert np.abs(f.rgb[-rows:] - still.rgb[-rows:]).max() > 0.1  # the last rows moved 1.1 m on
    with pytest.raises(ValueError, match="readout_us"):
        gsim.render_camera(s, cam, T0, readout_us=-1)
    with pytest.raises(ValueError, match="timestamp_us"):
        gsim.render_camera(s, cam, traj, readout_us=1000)
