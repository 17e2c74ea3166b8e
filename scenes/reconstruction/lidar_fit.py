"""Differentiable LiDAR rays of the trainable scene: the ray kernel (numba, or CUDA where the model is on a GPU)
finds each ray's contributing surfels, the torch twin (gsim.lidar.reference) recomposites them with gradients,
the LiDAR head decodes intensity and ray drop. Used by `gsim reconstruct` for its LiDAR losses."""
from __future__ import annotations

import numpy as np
import torch

from gsim.lidar.heads import head_inputs, mlp
from gsim.lidar.reference import composite
from gsim.lidar.groups import SurfelGroups
from gsim.lidar.render import BEAM_DIVERGENCE_RAD, lidar_backend_on, trace_rays
from gsim.render.common import to_device
from gsim.scene import corrected_poses

from .lidar_rays import SweepRays
from ..log import DrivingLog

CANDIDATES = 64  # contributors recomposited per ray (beyond them a ray is not trained: rare)
HIT_ALPHA = 0.5


def render_rays(model, log: DrivingLog, rays: SweepRays) -> dict:
    """Torch outputs per ray (in ``rays`` order): alpha, expected range, the head's logits (R,2), and
    ``near_alpha``: the alpha of what lies within the sensor's maximum range (all of it without a beam model)."""
    p, dev = model.params, model.device
    backend = lidar_backend_on(dev)  # (the CUDA kernel's surfels stay on the GPU)
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
    out, order, poses, dirs = trace_rays(groups, poses, rays.times_us, rays.dirs, HIT_ALPHA, backend, CANDIDATES,
                                         device=backend == "cuda")
    # recomposite with gradients: the parameters of each ray's candidates gathered as rows of their own, activated
    # there (a street has far more surfels than rays take); the candidates stay where the trace left them (no
    # host round trip, no data-dependent size: a GPU step does not wait)
    cand = to_device(out["candidates"], dev, torch.int64)
    rows = cand.clamp_min(0).reshape(-1)
    q = {k: p[k].index_select(0, rows) for k in ("means", "quats", "log_scales", "logit_opacities", "features")}
    local = torch.where(cand >= 0, torch.arange(len(rows), device=dev).view(cand.shape), -1)
    f32 = lambda x: to_device(x, dev, torch.float32)  # noqa: E731
    res = composite(f32(poses[:, :3, 3]), f32(dirs), torch.arange(len(order), device=dev), q["means"],
                    torch.nn.functional.normalize(q["quats"], dim=-1), q["log_scales"].exp(),
                    torch.sigmoid(q["logit_opacities"]), q["features"], model.owner.index_select(0, rows) + 1,
                    f32(out["group_from_world"]), local, BEAM_DIVERGENCE_RAD, HIT_ALPHA)
    h = model.head
    logits = mlp(head_inputs(res, f32(dirs)), h["w1"], h["b1"], h["w2"], h["b2"])
    a = res["alpha"]
    beams = log.lidars[rays.sensor].beams
    near = a if beams is None else (res["weights"] * (res["ranges"] <= beams.max_range_m)).sum(-1)
    inverse = to_device(np.argsort(order), dev)
    return {"alpha": a[inverse], "range": (res["range_sum"] / (a + (a <= 0)))[inverse], "logits": logits[inverse],
            "near_alpha": near[inverse]}
