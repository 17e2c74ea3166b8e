"""Differentiable LiDAR rays of the trainable scene: the ray kernel (numba, or CUDA where the model is on a GPU)
finds each ray's contributing surfels, the torch twin (gsim.lidar.reference) recomposites them with gradients,
the LiDAR head decodes intensity and ray drop. Used by `gsim reconstruct` for its LiDAR losses."""
from __future__ import annotations

import numpy as np
import torch

from gsim.lidar.heads import head_inputs, mlp
from gsim.lidar.reference import composite
from gsim.lidar.render import BEAM_DIVERGENCE_RAD, SurfelGroups, pick_lidar_backend, trace_rays
from gsim.scene import corrected_poses

from .lidar_rays import SweepRays
from .log import DrivingLog

CANDIDATES = 64  # contributors recomposited per ray (beyond them a ray is not trained: rare)
HIT_ALPHA = 0.5


def render_rays(model, log: DrivingLog, rays: SweepRays) -> dict:
    """Torch outputs per ray (in ``rays`` order): alpha, expected range, and the head's logits (R,2)."""
    p, dev = model.params, model.device
    # the ray search: the CUDA kernel where the model is on a GPU that runs it (the surfels stay there), else numba
    backend = "cuda" if torch.device(dev).type == "cuda" and pick_lidar_backend("auto") == "cuda" else "numba"
    with torch.no_grad():
        args = (p["means"], torch.nn.functional.normalize(p["quats"], dim=-1), p["log_scales"].exp(),
                torch.sigmoid(p["logit_opacities"]), None, model.owner + 1, model.track_poses())
        if backend == "cuda":
            from gsim.lidar.kernel_cuda import device_groups
            groups = device_groups(*args)
        else:
            host = lambda t: t.cpu().numpy()  # noqa: E731
            groups = SurfelGroups.build(*(host(x) for x in args[:4]), None, host(args[5]), args[6])
    # the sweeps move with the views' refined poses (not learnt from the rays)
    poses = corrected_poses(model.pose_corrections(), rays.poses(log), rays.times_us)
    out, order, poses, dirs = trace_rays(groups, poses, rays.times_us, rays.dirs, HIT_ALPHA, backend, CANDIDATES)
    # recomposite with gradients, activating only the surfels some ray takes (a street has far more)
    found = out["candidates"] >= 0
    used, local = np.unique(out["candidates"][found], return_inverse=True)
    if not len(used):  # no ray takes a surfel (all nearly transparent): one row, which no ray composites
        used = np.zeros(1, np.int64)
    cand = np.full(found.shape, -1, np.int64)
    cand[found] = local
    idx = torch.as_tensor(used, device=dev)
    p = {k: v.index_select(0, idx) for k, v in p.items() if k != "sh"}
    f32 = lambda x: torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float32, device=dev)  # noqa: E731
    res = composite(f32(poses[:, :3, 3]), f32(dirs), torch.arange(len(order), device=dev), p["means"],
                    torch.nn.functional.normalize(p["quats"], dim=-1), p["log_scales"].exp(),
                    torch.sigmoid(p["logit_opacities"]), p["features"], model.owner[idx] + 1,
                    f32(out["group_from_world"]), torch.as_tensor(cand, device=dev), BEAM_DIVERGENCE_RAD, HIT_ALPHA)
    h = model.head
    logits = mlp(head_inputs(res, f32(dirs)), h["w1"], h["b1"], h["w2"], h["b2"])
    a = res["alpha"]
    inverse = torch.as_tensor(np.argsort(order), device=dev)
    return {"alpha": a[inverse], "range": (res["range_sum"] / (a + (a <= 0)))[inverse], "logits": logits[inverse]}
