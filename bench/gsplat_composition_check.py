"""Check on a machine without a GPU that the gsplat backend's `rasterize` (gsplat's 2DGS building blocks composed
by gsim, without the host waits of gsplat's own `rasterization_2dgs`) computes what `rasterization_2dgs` computes
with render_mode "RGB+ED": rgb, alpha, normals (gsim's in the camera frame, gsplat's in the world) and their
gradients to the surfels; and how far its depth (`gsplat_backend.hit_depth`, from the surfels' planes, where
rasterization_2dgs composites their centres' depths) is from the torch reference backend's: exact for one surfel,
nearer than the centres' depths elsewhere. gsplat's CUDA kernels cannot run here: both compositions run on
stand-ins, gsplat's pure-torch projection, tile intersection and spherical harmonics and a dense rasterizer written
from its 2DGS kernel's per-pixel maths (its own torch reference needs CUDA), so what this checks is the composition
(arguments, shapes, the SH offset, the depth channels and their background, the normals' frame, the rgb alone
without them), not the kernels: the `cuda` tests compare those with the torch backend on a GPU. First, gsim's own
Function around gsplat's rasterization kernels (`rasterize_pixels`) against gsplat's `rasterize_to_pixels_2dgs`,
both on fake kernels: the same kernel arguments, outputs and gradients.

    pip install --no-deps --target /tmp/gsplat gsplat==1.5.3   (gsplat's Python code; nothing is compiled)
    PYTHONPATH=/tmp/gsplat python bench/gsplat_composition_check.py

Prints the largest differences per case and the depth's errors; fails where the differences exceed float32 rounding
or the depth is not nearer the reference's than the centres' depths at the median, 90th and 99th percentile.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import gsplat  # noqa: E402
import gsplat.rendering  # noqa: E402
from gsplat.cuda._wrapper import _make_lazy_cuda_func as kernel_maker  # noqa: E402
from gsplat.cuda._torch_impl import _isect_offset_encode, _isect_tiles, _spherical_harmonics  # noqa: E402
from gsplat.cuda._torch_impl_2dgs import _fully_fused_projection_2dgs  # noqa: E402

import gsim  # noqa: E402
from gsim.render import gsplat_backend  # noqa: E402
from gsim.render.common import RenderOptions  # noqa: E402
from gsim.street import drive_trajectory, street_surfels  # noqa: E402
from gsim.transforms import invert  # noqa: E402
from support import random_scene  # noqa: E402


def projection(means, quats, scales, viewmats, Ks, width, height, eps2d=0.3, near_plane=0.01, far_plane=1e10,
               radius_clip=0.0, packed=False, sparse_grad=False):
    assert not packed and radius_clip == 0.0
    return _fully_fused_projection_2dgs(means, quats, scales, viewmats, Ks, width, height, near_plane, far_plane)


def intersections(means2d, radii, depths, tile_size, tiles_w, tiles_h, sort=True, segmented=False, packed=False,
                  n_images=None, image_ids=None, gaussian_ids=None):
    assert not packed
    return _isect_tiles(means2d, radii, depths, tile_size, tiles_w, tiles_h, sort)


def harmonics(degree, dirs, coeffs, masks=None):
    out = _spherical_harmonics(degree, dirs, coeffs)
    return out if masks is None else torch.where(masks[..., None], out, 0.0)


def rasterizer(means2d, ray_transforms, colors, opacities, normals, densify, width, height, tile, offsets, flat,
               backgrounds=None, masks=None, packed=False, absgrad=False, distloss=False):
    """gsplat's 2DGS rasterization kernel's per-pixel maths, dense: for every pixel centre every surfel of the tile
    lists in centre depth order (the third row of its ray transform's last column), the ray-splat hit through the
    ray transform (h_u, h_v, their cross), the 2D filter, alpha clamped to 0.999 and skipped below 1/255, the pixel
    done (the surfel excluded) once the transmittance would fall to 1e-4."""
    ys, xs = torch.meshgrid(torch.arange(height) + 0.5, torch.arange(width) + 0.5, indexing="ij")
    px, py = xs.reshape(1, -1, 1, 1), ys.reshape(1, -1, 1, 1)
    order = torch.argsort(ray_transforms[..., 2, 2], dim=1)  # (C,N): the centres' camera z
    take = lambda x: torch.gather(x, 1, order.view(*order.shape, *[1] * (x.dim() - 2)).expand_as(x))  # noqa: E731
    listed = torch.zeros(means2d.shape[:2], dtype=torch.bool)  # in a tile's list: in view, in front of the camera
    listed.view(-1)[flat] = True
    M, xy, op = take(ray_transforms)[:, None], take(means2d)[:, None], take(opacities * listed)[:, None]
    h_u, h_v = px * M[..., 2, :] - M[..., 0, :], py * M[..., 2, :] - M[..., 1, :]
    cross = torch.linalg.cross(h_u, h_v)
    hit = cross[..., 2] != 0  # (the kernel skips a ray parallel to the splat)
    s3 = torch.where(hit, (cross[..., 0] ** 2 + cross[..., 1] ** 2) / torch.where(hit, cross[..., 2], 1.0) ** 2, 1e30)
    s2 = 2.0 * ((xy[..., 0] - px[..., 0]) ** 2 + (xy[..., 1] - py[..., 0]) ** 2)
    alpha = torch.clamp_max(op * torch.exp(-0.5 * torch.minimum(s3, s2)), 0.999)
    alpha = torch.where((alpha >= 1 / 255) & hit, alpha, 0.0)
    keep = torch.cumprod(1 - alpha.detach(), -1) > 1e-4
    alpha = torch.where(keep, alpha, 0.0)
    T = torch.cumprod(torch.cat([torch.ones_like(alpha[..., :1]), 1 - alpha[..., :-1]], -1), -1)
    w = alpha * T  # (C,P,N)
    a = w.sum(-1)
    c = torch.einsum("cpn,cnd->cpd", w, take(colors)) + backgrounds[:, None] * (1 - a[..., None])
    shape = lambda x: x.reshape(len(means2d), height, width, -1)  # noqa: E731
    a = shape(a)
    return shape(c), a, shape(torch.einsum("cpn,cnd->cpd", w, take(normals))), torch.zeros_like(a), torch.zeros_like(a)


def depth_errors(depth, ref, same):
    """Median, 90th and 99th percentile of |depth / the torch backend's - 1| on the pixels ``same``."""
    r = (depth / ref - 1).abs()[same]
    return [float(r.quantile(q)) for q in (0.5, 0.9, 0.99)]


def install() -> None:
    """Put the stand-ins in gsplat's place (gsim imports from gsplat, rasterization_2dgs from its module; gsim's
    rasterize_pixels, its own Function around gsplat's kernels, gets the dense rasterizer too)."""
    for mod in (gsplat, gsplat.rendering):
        mod.fully_fused_projection_2dgs, mod.isect_tiles, mod.spherical_harmonics = projection, intersections, harmonics
        mod.isect_offset_encode, mod.rasterize_to_pixels_2dgs = _isect_offset_encode, rasterizer
    gsplat_backend.rasterize_pixels = lambda *a: rasterizer(*a[:-1], backgrounds=a[-1])[:3]
    zeros_like = torch.zeros_like  # (rasterization_2dgs makes its densification slot on "cuda" by name)
    torch.zeros_like = lambda *a, **k: zeros_like(*a, **({**k, "device": None} if k.get("device") == "cuda" else k))


def function_plumbing() -> None:
    """gsim's `rasterize_pixels` (its own autograd Function, without the `torch.cuda.synchronize()` that ends
    gsplat's backward) hands gsplat's forward and backward kernels what gsplat's `rasterize_to_pixels_2dgs` hands
    them, and gives its callers the same outputs and gradients: both run on fake kernels that record their
    arguments and return seeded tensors (gsplat's kernels cannot run here; the `cuda` test compares the two there)."""
    import gsplat.cuda._wrapper as wrapper
    calls = []

    def fake(name):
        def call(*args):
            calls.append((name, args))
            g = torch.Generator().manual_seed(1 if name.endswith("fwd") else 2)  # (the same in both runs)
            f = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
            if name.endswith("fwd"):
                C, N, ch, width, height = *args[0].shape[:2], args[2].shape[-1], args[7], args[8]
                ids = lambda: torch.randint(0, N, (C, height, width), generator=g, dtype=torch.int32)  # noqa: E731
                return (f(C, height, width, ch), torch.rand(C, height, width, 1, generator=g), f(C, height, width, 3),
                        f(C, height, width, 1), f(C, height, width, 1), ids(), ids())
            return tuple(f(*x.shape) for x in (args[0],) + args[:6])
        return call

    sync, wrapper._make_lazy_cuda_func, torch.cuda.synchronize = torch.cuda.synchronize, fake, lambda: None
    try:
        g = torch.Generator().manual_seed(0)
        C, N = 2, 5
        leaves = [torch.randn(*shape, generator=g).requires_grad_(True)
                  for shape in ((C, N, 2), (C, N, 3, 3), (C, N, 8), (C, N), (C, N, 3), (C, N, 2))]
        rest = (6, 4, 16, torch.zeros((C, 1, 1), dtype=torch.int32), torch.arange(7, dtype=torch.int32))
        bg = torch.rand(C, 8, generator=g)
        runs = []
        for call in (lambda: wrapper.rasterize_to_pixels_2dgs(*leaves, *rest, backgrounds=bg)[:3],
                     lambda: gsplat_backend.rasterize_pixels(*leaves, *rest, bg)):
            n = len(calls)
            outs = call()
            weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(9)) for o in outs]
            grads = torch.autograd.grad(sum((w * o).sum() for w, o in zip(weights, outs)), leaves)
            runs.append((outs, grads, calls[n:]))
    finally:
        wrapper._make_lazy_cuda_func, torch.cuda.synchronize = kernel_maker, sync
    (theirs, their_grads, their_calls), (ours, our_grads, our_calls) = runs
    def same(a, b):
        if torch.is_tensor(a) or torch.is_tensor(b):
            return torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and torch.equal(a, b)
        return a == b
    assert [n for n, _ in their_calls] == [n for n, _ in our_calls] == ["rasterize_to_pixels_2dgs_fwd",
                                                                         "rasterize_to_pixels_2dgs_bwd"], our_calls
    for (name, a), (_, b) in zip(their_calls, our_calls):
        assert len(a) == len(b) and all(same(x, y) for x, y in zip(a, b)), (name, [i for i, (x, y) in
                                                                               enumerate(zip(a, b)) if not same(x, y)])
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours)) and all(torch.equal(a, b)
                                                                       for a, b in zip(their_grads, our_grads))
    print("gsim's rasterize_pixels hands gsplat's kernels what rasterize_to_pixels_2dgs hands them, and routes their "
          "outputs and gradients as it does (fake kernels)")


def main() -> None:
    function_plumbing()
    install()
    camera, opt = gsim.PinholeCamera(48, 32, 40.0, 42.0, 24.5, 15.5), RenderOptions(background=(0.1, 0.2, 0.3))
    moved = np.eye(4)
    moved[:3, 3] = [0.3, -0.2, 0.5]
    tilted = gsim.Surfels(np.array([[0.2, 0.1, 3.0]]), np.array([[np.cos(0.5), np.sin(0.5), 0, 0]]),
                          np.array([[0.5, 0.3]]), np.array([0.99]), np.array([[1.0, 0.2, 0.1]]))
    cases = {"SH degree 1, two poses": (random_scene(300, 3, sh_degree=1), [np.eye(4), moved]),
             "SH degree 0": (random_scene(300, 4, sh_degree=0), [np.eye(4), moved]),
             "one tilted surfel": (tilted, [np.eye(4), moved]),
             "the demo street, driving": (street_surfels(3000), list(drive_trajectory(5)[1:3]))}
    f32 = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.float32)  # noqa: E731
    for name, (surfels, poses) in cases.items():
        s = surfels.torch(device="cpu", dtype=torch.float32)
        leaves = [s.means, s.quats, s.scales, s.opacities, s.colors]
        for x in leaves:
            x.requires_grad_(True)
        viewmats, Ks = f32(invert(np.stack(poses))), f32(np.stack([camera.K] * len(poses)))
        scales3 = torch.cat([s.scales, torch.ones_like(s.scales[:, :1])], 1)
        theirs = gsplat.rendering.rasterization_2dgs(
            s.means, s.quats, scales3, s.opacities, s.colors, viewmats, Ks, camera.width, camera.height,
            near_plane=opt.near, far_plane=opt.far, sh_degree=surfels.sh_degree,
            backgrounds=f32([opt.background] * len(poses)), render_mode="RGB+ED")
        ours = gsplat_backend.rasterize(s, surfels.sh_degree, viewmats, Ks, f32(np.stack([T[:3, 3] for T in poses])),
                                         (camera.width, camera.height), f32(opt.background), opt)
        their_normals = torch.einsum("cij,chwj->chwi", viewmats[:, :3, :3], theirs[2])  # (world -> camera)
        g = torch.Generator().manual_seed(0)
        w1, w2 = torch.randn(ours[0].shape, generator=g), torch.randn(ours[3].shape, generator=g)
        grads = [torch.autograd.grad((c * w1).sum() + (n * w2).sum() + a.sum(), leaves, retain_graph=True)
                 for c, a, n in ((theirs[0][..., :3], theirs[1], their_normals), (ours[0], ours[2], ours[3]))]
        assert all(torch.equal(a.isnan(), b.isnan()) for a, b in zip(*grads)), "NaN gradients differ"
        diff = [float((a - b).abs().max().detach()) for a, b in
                zip((theirs[0][..., :3], theirs[1], their_normals), (ours[0], ours[2], ours[3]))]
        diff.append(max(float((a - b).nan_to_num().abs().max() / (a.nan_to_num().abs().max() + 1e-12))
                        for a, b in zip(*grads)))
        assert float(ours[2].max().detach()) > 0.5 and max(diff) < 1e-4, (name, diff)
        # the depth's gradients: finite wherever the colours' are (gsplat's torch projection has its own NaNs)
        depth_grads = torch.autograd.grad(ours[1].sum(), leaves[:3])
        assert all(bool((x.isfinite() | ~y.isfinite()).all()) for x, y in zip(depth_grads, grads[1])), name
        assert float(depth_grads[0].abs().max()) > 0, name
        # against the torch backend where the stand-in composites the same surfels (its alpha and rgb agree:
        # gsplat's 2D filter is centred on its ellipse's box, not the projected centre, and it has no near test
        # for a hit), the alpha over 0.9
        refs = [gsim.render_camera(surfels, camera, T, backend="torch") for T in poses]
        ref_depth, ref_alpha, ref_rgb = (torch.stack([f32(getattr(f, k)) for f in refs]) for k in ("depth", "alpha",
                                                                                                   "rgb"))
        same = ((ref_alpha > 0.9) & ((ours[2][..., 0].detach() - ref_alpha).abs() < 1e-3)
                & ((ours[0].detach() - ref_rgb).abs().max(-1).values < 1e-2))
        hit = depth_errors(ours[1].detach(), ref_depth, same)
        centre = depth_errors(theirs[0][..., 3].detach(), ref_depth, same)
        print(f"{name}: largest difference in rgb {diff[0]:.2e}, alpha {diff[1]:.2e}, normals {diff[2]:.2e}, "
              f"gradients (relative) {diff[3]:.2e}; depth against the torch backend's on {int(same.sum())} of "
              f"{int((ref_alpha > 0.9).sum())} pixels, relative error median / p90 / p99: gsim's (hit_depth) "
              + " / ".join(f"{x:.1e}" for x in hit) + ", gsplat's (centre depths) "
              + " / ".join(f"{x:.1e}" for x in centre))
        assert all(h < c for h, c in zip(hit, centre)), (name, hit, centre)
        # without the depth channels (the cameras' rgb alone: Renderer.images) the same rgb and alpha
        rgb_only = gsplat_backend.rasterize(s, surfels.sh_degree, viewmats, Ks,
                                            f32(np.stack([T[:3, 3] for T in poses])), (camera.width, camera.height),
                                            f32(opt.background), opt, depth=False)
        assert rgb_only[1] is None and torch.equal(rgb_only[0], ours[0]) and torch.equal(rgb_only[2], ours[2]), name
        assert name != "one tilted surfel" or hit[2] < 1e-5, hit
    print("the composition computes what rasterization_2dgs computes, its depth nearer the torch backend's; "
          "without the depth channels the same rgb and alpha")


if __name__ == "__main__":
    main()
