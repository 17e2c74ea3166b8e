"""Optimisation: Adam over named tensors, and densification/pruning of the surfels.

Adam is written out (a few lines) so that its moments are plain tensors by name: the
densifier keeps, copies or zeroes rows of them when surfels are pruned, split or cloned,
and checkpoints save them as they are.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterable

import numpy as np
import torch

from gsim.render.common import to_device

BETAS, EPS = (0.9, 0.999), 1e-15


class Adam:
    """``sparse``: names whose rows without gradient this step keep their values and moments (the
    poses of a track, one of which a view sees: dense Adam would carry a row on its momentum for
    some 30 steps after each visit, a random walk of centimetres)."""

    def __init__(self, lrs: Dict[str, float], sparse: Iterable[str] = ()):
        self.lrs = dict(lrs)
        self.sparse = set(sparse)
        self.m: Dict[str, torch.Tensor] = {}
        self.v: Dict[str, torch.Tensor] = {}
        self.step_count = 0

    @torch.no_grad()
    def step(self, params: Dict[str, torch.Tensor], lr_scale: Dict[str, float] = None) -> None:
        """One Adam step of every parameter with a gradient, through torch's multi-tensor (_foreach) ops, the
        sparse ones batched by row shape, no row looked up on the host: on a GPU a step is a few dozen kernel
        launches and no synchronisation (it was some 600 launches and a host sync per sparse tensor)."""
        self.step_count += 1
        b1, b2 = BETAS
        c1, c2 = 1 - b1 ** self.step_count, 1 - b2 ** self.step_count
        eps = EPS * math.sqrt(c2)
        groups: Dict[object, Dict[str, list]] = {}  # "dense", or a sparse row shape: p, g, m, v, step
        for k, p in params.items():
            if p.grad is None:
                continue
            m, v = self.m.get(k), self.v.get(k)
            if m is None:
                m = self.m[k] = torch.zeros_like(p)
            if v is None:
                v = self.v[k] = torch.zeros_like(p)
            # lr (m / c1) / (sqrt(v / c2) + eps), the corrections folded into scalars: no full-size temporaries
            step = self.lrs[k] * (lr_scale or {}).get(k, 1.0) * math.sqrt(c2) / c1
            key = (tuple(p.shape[1:]), p.dtype, p.device) if k in self.sparse else "dense"
            group = groups.setdefault(key, {"p": [], "g": [], "m": [], "v": [], "step": []})
            for name, x in (("p", p), ("g", p.grad), ("m", m), ("v", v), ("step", step)):
                group[name].append(x)
            p.grad = None
        for key, g in groups.items():
            if key == "dense":
                torch._foreach_mul_(g["m"], b1)
                torch._foreach_add_(g["m"], g["g"], alpha=1 - b1)
                torch._foreach_mul_(g["v"], b2)
                torch._foreach_addcmul_(g["v"], g["g"], g["g"], value=1 - b2)
                den = torch._foreach_sqrt(g["v"])
                torch._foreach_add_(den, eps)
                torch._foreach_addcdiv_(g["p"], g["m"], den, [-x for x in g["step"]])
            else:  # rows without gradient this step keep their values and moments
                sizes = [len(p) for p in g["p"]]
                G, M, V = (torch.cat(g[n]) for n in "gmv")
                seen = G.reshape(len(G), -1).any(1).reshape((-1,) + (1,) * (G.dim() - 1))
                steps = to_device(np.repeat(g["step"], sizes), G.device, G.dtype)
                Mn = M.mul(b1).add_(G, alpha=1 - b1)
                Vn = V.mul(b2).addcmul_(G, G, value=1 - b2)
                U = steps.reshape(seen.shape) * Mn / Vn.sqrt().add_(eps)
                torch._foreach_sub_(g["p"], torch.where(seen, U, 0.0).split(sizes))
                torch._foreach_copy_(g["m"], torch.where(seen, Mn, M).split(sizes))
                torch._foreach_copy_(g["v"], torch.where(seen, Vn, V).split(sizes))

    def remap(self, names, keep: torch.Tensor, source: torch.Tensor) -> None:
        """After densification: rows ``keep`` stay, then one row per ``source`` index is appended
        with zero moments (new surfels start fresh)."""
        for k in names:
            for state in (self.m, self.v):
                if k in state:
                    s = state[k]
                    state[k] = torch.cat([s[keep.to(s.device)],
                                          torch.zeros((len(source),) + s.shape[1:], dtype=s.dtype, device=s.device)])

    def state_dict(self) -> dict:
        """The moments on the CPU (a checkpoint loads anywhere)."""
        cpu = lambda d: {k: v.cpu() for k, v in d.items()}  # noqa: E731
        return {"m": cpu(self.m), "v": cpu(self.v), "step": self.step_count, "lrs": self.lrs}

    def load_state_dict(self, d: dict, device="cpu") -> None:
        to = lambda moments: {k: v.to(device) for k, v in moments.items()}  # noqa: E731
        self.m, self.v, self.step_count = to(d["m"]), to(d["v"]), int(d["step"])


@dataclass(frozen=True)
class DensifyOptions:
    start: int = 300
    stop: int = 1500
    every: int = 100
    grad_threshold: float = 2e-4  # mean |dL/d(image-plane position)| in half-widths, as gsplat
    split_scale: float = 0.01  # x scene scale: larger surfels are split, smaller ones cloned
    prune_opacity: float = 0.005
    prune_scale: float = 0.1  # x scene scale: larger surfels are pruned
    max_surfels: int = 400_000  # a CPU budget: the step time grows with the surfels in view


class Densifier:
    """gsplat's default strategy on world-space means: the image-plane gradient of a surfel is
    its mean's gradient times depth / focal length (the Jacobian of a pinhole projection)."""

    def __init__(self, opt: DensifyOptions, scene_scale: float):
        self.opt, self.scale = opt, scene_scale
        self.grad_sum = torch.zeros(0)
        self.count = torch.zeros(0)

    def accumulate(self, mean_grad: torch.Tensor, depth: torch.Tensor, focal: float, width: int) -> None:
        n = len(mean_grad)
        if len(self.grad_sum) != n:
            self.grad_sum, self.count = (torch.zeros(n, device=mean_grad.device) for _ in range(2))
        g = mean_grad.norm(dim=-1) * depth.clamp_min(1e-3) / focal * (width / 2)
        seen = g > 0
        self.grad_sum += g * seen
        self.count += seen

    @torch.no_grad()
    def step(self, model, adam: Adam, it: int, generator: torch.Generator) -> Dict[str, int]:
        """Split/clone/prune at the scheduled iterations; returns the counts (empty if not scheduled)."""
        o = self.opt
        if not (o.start <= it < o.stop and it % o.every == 0) or len(self.count) != len(model):
            return {}
        p = model.params
        avg = self.grad_sum / self.count.clamp_min(1)
        scale_max = p["log_scales"].exp().max(-1).values
        grow = (avg > o.grad_threshold) & (len(model) < o.max_surfels)
        split = grow & (scale_max > o.split_scale * self.scale)
        clone = grow & ~split
        prune = (torch.sigmoid(p["logit_opacities"]) < o.prune_opacity) | (scale_max > o.prune_scale * self.scale)
        src = torch.cat([torch.nonzero(clone)[:, 0], torch.nonzero(split)[:, 0].repeat(2)])
        new = {k: v.detach()[src].clone() for k, v in p.items()}
        n_split = int(split.sum())
        if n_split:
            # split: two surfels drawn from the parent's Gaussian in its tangent plane, 1.6x smaller
            sel = slice(len(src) - 2 * n_split, None)
            q = torch.nn.functional.normalize(new["quats"][sel], dim=-1)
            w, x, y, z = q.unbind(-1)
            ax = torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y + w * z), 2 * (x * z - w * y)], -1)
            ay = torch.stack([2 * (x * y - w * z), 1 - 2 * (x * x + z * z), 2 * (y * z + w * x)], -1)
            s = new["log_scales"][sel].exp()
            r = torch.randn(len(s), 2, generator=generator).to(s.device)  # the CPU generator: one stream anywhere
            new["means"][sel] += (r[:, :1] * s[:, :1]) * ax + (r[:, 1:] * s[:, 1:]) * ay
            new["log_scales"][sel] -= torch.log(torch.tensor(1.6))
        keep = ~(prune | split)
        model.replace(keep, new, model.owner[src])
        adam.remap(p.keys(), keep, src)
        self.grad_sum, self.count = (torch.zeros(len(model), device=model.device) for _ in range(2))
        return {"cloned": int(clone.sum()), "split": n_split, "pruned": int((prune & ~split).sum())}
