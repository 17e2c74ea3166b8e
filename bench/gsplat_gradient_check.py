"""Does gsplat's rasterization densify more than gsim's reference backends? On a machine without a GPU: the
densification statistic (each surfel's mean-gradient norm x its distance / focal x width/2, `scenes.reconstruction.optim.Densifier`)
of an L1 image loss through gsplat's 2DGS model (the stand-ins of `gsplat_composition_check.py`: gsplat's torch
projection and a dense model of its rasterization kernel, differentiated by autograd) against the torch reference
backend's, on the demo street, same surfels and target. The `cuda` preset's H200 runs grew more surfels than the
numba runs of the same schedule (983k against 851k at 1750 steps); what this measures is gsplat's forward model's
exact gradient, not its CUDA backward.

    PYTHONPATH=/tmp/gsplat python bench/gsplat_gradient_check.py [--width 96 --height 60 --surfels 6000]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

import gsplat_composition_check as stand_in
import gsim
from gsim.render import gsplat_backend, torch_backend
from gsim.render.common import RenderOptions
from gsim.street import drive_trajectory, street_surfels
from gsim.transforms import invert


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=96)
    ap.add_argument("--height", type=int, default=60)
    ap.add_argument("--surfels", type=int, default=6000)
    a = ap.parse_args(argv)
    stand_in.install()
    W, H = a.width, a.height
    camera, opt = gsim.PinholeCamera(W, H, W / 2, W / 2, W / 2, H / 2), RenderOptions(background=(0.1, 0.2, 0.3))
    surfels = street_surfels(a.surfels)
    rng = np.random.default_rng(0)  # the target: the street with its surfels moved 5 cm and recoloured a little
    jitter = lambda x, sd: (x + rng.normal(0, sd, x.shape)).astype(x.dtype)  # noqa: E731
    target_scene = gsim.Surfels(jitter(surfels.means, 0.05), surfels.quats, surfels.scales, surfels.opacities,
                                jitter(surfels.colors, 0.1))
    f32 = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.float32)  # noqa: E731
    for k, T in enumerate(drive_trajectory(5)[1:3]):
        target = f32(gsim.render_camera(target_scene, camera, T, backend="torch").rgb)
        ref = surfels.torch(device="cpu", dtype=torch.float64)
        ref.means.requires_grad_(True)
        loss_ref = (torch_backend.render(ref, camera, T, opt).rgb.float() - target).abs().mean()
        theirs = surfels.torch(device="cpu", dtype=torch.float32)
        theirs.means.requires_grad_(True)
        rgb = gsplat_backend.rasterize(theirs, surfels.sh_degree, f32(invert(T[None])), f32(camera.K[None]),
                                       f32(T[None, :3, 3]), (W, H), f32(opt.background), opt)[0][0]
        loss = (rgb - target).abs().mean()
        scale = np.linalg.norm(surfels.means - T[:3, 3], axis=1) / camera.fx * W / 2
        g_ref, g = (torch.autograd.grad(x, s.means)[0].norm(dim=1).detach().numpy() * scale
                    for x, s in ((loss_ref, ref), (loss, theirs)))
        both = (g_ref > 0) & (g > 0)
        r = g[both] / g_ref[both]
        above = np.quantile(g_ref[g_ref > 0], [0.5, 0.9, 0.99])
        print(f"pose {k}: loss {float(loss.detach()):.4f} (torch backend {float(loss_ref.detach()):.4f}); "
              f"{int(both.sum())} surfels with a gradient in both; gsplat's model over the torch backend's, per "
              f"surfel median {np.median(r):.3f} "
              f"(p10 {np.quantile(r, 0.1):.3f}, p90 {np.quantile(r, 0.9):.3f}), sums {g.sum() / g_ref.sum():.3f}; "
              "surfels above the torch backend's quantiles q50 / q90 / q99: "
              + " / ".join(f"{int((g_ref > t).sum())} -> {int((g > t).sum())}" for t in above))


if __name__ == "__main__":
    main()
