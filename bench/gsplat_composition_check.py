"""Check on a machine without a GPU that the gsplat backend's `rasterize` (gsplat's 2DGS building blocks composed
by gsim, without the host waits of gsplat's own `rasterization_2dgs`) computes what `rasterization_2dgs` computes
with render_mode "RGB+ED": rgb and expected depth, alpha, normals (gsim's in the camera frame, gsplat's in the
world), and the gradients of all three to the surfels. gsplat's CUDA kernels cannot run here: both compositions run
on stand-ins, gsplat's pure-torch projection, tile intersection and spherical harmonics and a dense stand-in for the
rasterizer (its torch reference needs CUDA), so what this checks is the composition (arguments, shapes, the SH
offset, the depth channel and its background, the normals' frame), not the kernels: the `cuda` tests compare those
with the torch backend on a GPU.

    pip install --no-deps --target /tmp/gsplat gsplat==1.5.3   (gsplat's Python code; nothing is compiled)
    PYTHONPATH=/tmp/gsplat python bench/gsplat_composition_check.py

Prints the largest differences per case; fails where they exceed float32 rounding.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import gsplat  # noqa: E402
import gsplat.rendering  # noqa: E402
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
    """A dense stand-in: a deterministic, differentiable function of every input the composition passes."""
    ys, xs = torch.meshgrid(torch.arange(height) + 0.5, torch.arange(width) + 0.5, indexing="ij")
    pix = torch.stack([xs, ys], -1).reshape(-1, 2)
    w = opacities[:, None] * torch.exp(-((pix[None, :, None] - means2d[:, None]) ** 2).sum(-1) / 20.0)
    w = w * (1 + 0.1 * ray_transforms.sum((-1, -2))[:, None].sin())
    a = w.sum(-1).clamp(max=1.0)
    c = torch.einsum("cpn,cnd->cpd", w, colors) + backgrounds[:, None] * (1 - a[..., None])
    shape = lambda x: x.reshape(len(means2d), height, width, -1)  # noqa: E731
    a = shape(a)
    return shape(c), a, shape(torch.einsum("cpn,cnd->cpd", w, normals)), torch.zeros_like(a), torch.zeros_like(a)


def main() -> None:
    for mod in (gsplat, gsplat.rendering):  # (gsim imports from gsplat, rasterization_2dgs from its module)
        mod.fully_fused_projection_2dgs, mod.isect_tiles, mod.spherical_harmonics = projection, intersections, harmonics
        mod.isect_offset_encode, mod.rasterize_to_pixels_2dgs = _isect_offset_encode, rasterizer
    zeros_like = torch.zeros_like  # (rasterization_2dgs makes its densification slot on "cuda" by name)
    torch.zeros_like = lambda *a, **k: zeros_like(*a, **({**k, "device": None} if k.get("device") == "cuda" else k))
    camera, opt = gsim.PinholeCamera(48, 32, 40.0, 42.0, 24.5, 15.5), RenderOptions(background=(0.1, 0.2, 0.3))
    moved = np.eye(4)
    moved[:3, 3] = [0.3, -0.2, 0.5]
    cases = {"SH degree 1, two poses": (random_scene(300, 3, sh_degree=1), [np.eye(4), moved]),
             "SH degree 0": (random_scene(300, 4, sh_degree=0), [np.eye(4), moved]),
             "the demo street, driving": (street_surfels(3000), [np.eye(4), drive_trajectory(5)[2]])}
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
                                         (camera.width, camera.height), f32(list(opt.background) + [0.0]), opt)
        their_normals = torch.einsum("cij,chwj->chwi", viewmats[:, :3, :3], theirs[2])  # (world -> camera)
        g = torch.Generator().manual_seed(0)
        w1, w2 = torch.randn(ours[0].shape, generator=g), torch.randn(ours[2].shape, generator=g)
        grads = [torch.autograd.grad((c * w1).sum() + (n * w2).sum() + a.sum(), leaves)
                 for c, a, n in ((theirs[0], theirs[1], their_normals), ours)]
        assert all(torch.equal(a.isnan(), b.isnan()) for a, b in zip(*grads)), "NaN gradients differ"
        diff = [float((a - b).abs().max().detach()) for a, b in zip(theirs[:2] + (their_normals,), ours)]
        diff.append(max(float((a - b).nan_to_num().abs().max() / (a.nan_to_num().abs().max() + 1e-12))
                        for a, b in zip(*grads)))
        print(f"{name}: largest difference in rgb+depth {diff[0]:.2e}, alpha {diff[1]:.2e}, normals {diff[2]:.2e}, "
              f"gradients (relative) {diff[3]:.2e}")
        assert float(ours[1].max().detach()) > 0.5 and max(diff) < 1e-4, (name, diff)
    print("the composition computes what rasterization_2dgs computes")


if __name__ == "__main__":
    main()
