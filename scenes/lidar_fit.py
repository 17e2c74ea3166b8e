"""Differentiable LiDAR rays of the trainable scene: the numba kernel finds each ray's contributing surfels,
the torch twin (gsim.lidar.reference) recomposites them with gradients, the LiDAR head decodes intensity
and ray drop. Used by `gsim reconstruct` for its LiDAR losses."""
from __future__ import annotations

import numpy as np
import torch

from gsim.lidar.heads import head_inputs, mlp
from gsim.lidar.reference import composite
from gsim.lidar.render import BEAM_DIVERGENCE_RAD, SurfelGroups, trace
from gsim.surfels import Surfels

from .lidar_rays import SweepRays
from .log import DrivingLog

CANDIDATES = 64  # contributors recomposited per ray (beyond them a ray is not trained: rare)
HIT_ALPHA = 0.5


def render_rays(model, log: DrivingLog, rays: SweepRays) -> dict:
    """Torch outputs per ray (in ``rays`` order): alpha, expected range, and the head's logits (R,2)."""
    order = np.argsort(rays.times_us, kind="stable")
    poses = rays.poses(log)[order]
    dirs = np.einsum("rij,rj->ri", poses[:, :3, :3], rays.dirs[order])
    s = model.activated()
    own = model.owner.numpy()
    perm = np.argsort(own, kind="stable")  # the kernel takes the surfels grouped: background, then each actor
    arrays = [x.detach().numpy()[perm] for x in (s.means, s.quats, s.scales, s.opacities, s.colors)]
    cut = np.searchsorted(own[perm], np.arange(-1, len(model.tracks) + 1))
    parts = [Surfels(*(x[cut[k]:cut[k + 1]] for x in arrays)) for k in range(len(model.tracks) + 1)]
    groups = SurfelGroups.build(parts, [(t.timestamps_us, t.poses) for t in model.tracks])
    out = trace(groups, poses, rays.times_us[order], dirs, np.arange(len(order)), HIT_ALPHA, "numba", CANDIDATES)
    cand = torch.as_tensor(np.where(out["candidates"] >= 0, perm[np.maximum(out["candidates"], 0)], -1))
    f32 = lambda x: torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float32)
    res = composite(f32(poses[:, :3, 3]), f32(dirs), torch.arange(len(order)), s.means, s.quats, s.scales,
                    s.opacities, model.params["features"], model.owner + 1, f32(out["group_from_world"]), cand,
                    BEAM_DIVERGENCE_RAD, HIT_ALPHA)
    h = model.head
    logits = mlp(head_inputs(res, f32(dirs)), h["w1"], h["b1"], h["w2"], h["b2"])
    a = res["alpha"]
    inverse = torch.as_tensor(np.argsort(order))
    return {"alpha": a[inverse], "range": (res["range_sum"] / (a + (a <= 0)))[inverse], "logits": logits[inverse]}
