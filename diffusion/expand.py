"""Scene expansion (``gsim expand``): repaired novel views distilled back into the scene (Difix3D+'s recipe).

Stage by stage, outward (each of ``shifts`` in increasing order, then each of ``ahead``): every ``every``-th
training view is moved sideways by the stage's distance to both sides of the vehicle (or the last training
frame's cameras are moved forward beyond the driven path), rendered by the current scene and repaired
(a `RepairModel` or a `PretrainedRepair`); where the render is nearly empty (alpha < ``fill_alpha``) new
surfels are added at a depth taken from the render's surroundings, or on the ground where the pixel's ray
meets it; then the scene is fine-tuned on the real training views and these pseudo views, the pseudo views'
photometric loss weighted by ``pseudo_weight`` (the real views stay the reference: the distillation must not
cost them quality). The fine-tuning continues the reconstruction's own run (its checkpoint: optimiser state,
learning-rate schedule), so the reconstruction directory must hold the checkpoint `gsim reconstruct` wrote.

Output: OUT/scene (the expanded scene), OUT/checkpoint.pt (so a later expansion can continue), OUT/expand.json
(stages, surfels added, losses, wall time) and OUT/pseudo/ (each stage's render | repaired view pictures)."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

import numpy as np
import torch

from gsim.config import Config
from gsim.errors import InputError


@dataclass(frozen=True)
class ExpandOptions(Config):
    """shifts: sideways distances in metres (both sides), in the order they are distilled (outward); ahead:
    distances the last training frame's cameras are moved forward, beyond the driven path (after the shifts);
    iterations: fine-tuning steps per stage; real_fraction: the share of those steps on real views;
    every: the training views moved (every n-th); fill_alpha: below it a pixel gets a new surfel;
    min_change: a pseudo view's loss counts only where the repair changed the render by more (`corrected`);
    fill_stride: one new surfel per stride x stride pixels; fill_range_m: the farthest ground filled."""

    shifts: Tuple[float, ...] = (1.0, 2.0, 3.0)
    ahead: Tuple[float, ...] = ()
    iterations: int = 300
    real_fraction: float = 0.5
    pseudo_weight: float = 0.5
    every: int = 3
    fill_alpha: float = 0.5
    fill_stride: int = 2
    fill_range_m: float = 60.0
    min_change: float = 0.03
    seed: int = 0

    def __post_init__(self):
        for name, most in (("shifts", 10), ("ahead", 50)):
            d = tuple(sorted(float(x) for x in getattr(self, name)))
            object.__setattr__(self, name, d)
            if d and not (d[0] > 0 and d[-1] <= most):
                raise InputError(f"ExpandOptions.{name}: expected distances in (0, {most}] m, got {d}")
        if not self.shifts and not self.ahead:
            raise InputError("ExpandOptions: give shifts or ahead distances")
        for name in ("iterations", "every", "fill_stride"):
            if getattr(self, name) < 1:
                raise InputError(f"ExpandOptions.{name}: expected >= 1, got {getattr(self, name)}")
        if not 0 <= self.real_fraction <= 1 or not 0 < self.pseudo_weight <= 1:
            raise InputError(f"ExpandOptions: expected 0 <= real_fraction <= 1 and 0 < pseudo_weight <= 1, got "
                             f"{self.real_fraction}, {self.pseudo_weight}")


def checkpoint_of(scene_path) -> Path:
    """The training checkpoint beside a reconstruction's scene (RECON/scene -> RECON/checkpoint.pt); RECON
    itself is accepted too."""
    from gsim.scenes.train import CHECKPOINT
    p = Path(scene_path)
    for d in (p, p.parent):
        if (d / CHECKPOINT).is_file():
            return d / CHECKPOINT
    raise FileNotFoundError(f"{p}: no training checkpoint ({CHECKPOINT}) here or in its parent: expansion fine-tunes "
                            f"the reconstruction's own run; give the directory `gsim reconstruct --out` wrote (or its "
                            f"scene/ folder)")


def pseudo_view(view, T_world_camera: np.ndarray, image: np.ndarray, mask: np.ndarray):
    """A training view moved to ``T_world_camera`` with ``image`` (a repaired render) as its target where
    ``mask`` (H,W) is 1; no LiDAR."""
    from gsim.appearance import camera_ray_directions
    from gsim.scenes.views import View
    return View(-1, view.sensor, view.timestamp_us, view.camera, T_world_camera, image.astype(np.float32),
                camera_ray_directions(view.camera, T_world_camera), np.zeros(0, np.int64), np.zeros(0, np.float32),
                mask.astype(np.float32))


def corrected(render: np.ndarray, repaired: np.ndarray, filled: np.ndarray, opt: "ExpandOptions") -> np.ndarray:
    """(H,W) bool: where a pseudo view teaches the scene something: the repair changed the render by more than
    ``opt.min_change`` (mean absolute RGB, dilated by 2 px), or a hole was ``filled``. Elsewhere the repaired
    view only repeats the render, softened by the repair's noise, and fitting it blurs the scene (measured:
    -1.4 dB on the held-out frames of the demo street)."""
    from scipy.ndimage import binary_dilation
    changed = np.abs(repaired - render).mean(-1) > opt.min_change
    return binary_dilation(changed, structure=np.ones((5, 5), bool)) | filled


def fill_points(camera, T_world_camera: np.ndarray, image: np.ndarray, alpha: np.ndarray, depth: np.ndarray,
                opt: ExpandOptions) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where the render is nearly empty: (points (N,3), colours (N,3), normals (N,3), footprints (N,) m,
    filled (H,W) bool: the hole pixels the points cover, before the stride).
    A hole enclosed by rendered surfaces (not reaching the image's top edge, where the sky is) takes the
    depth of its nearest surface pixel (a gap in a facade or the road); a hole pixel whose ray meets the
    ground (the median height of the render's bottom rows) within ``fill_range_m`` lies on it, whichever
    of the two is nearer; the rest is sky and gets nothing."""
    from scipy import ndimage
    H, W = alpha.shape
    hole = alpha < opt.fill_alpha
    solid = ~hole & (depth > 0)
    if not hole.any() or not solid.any():
        return np.zeros((0, 3)), np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0), np.zeros((H, W), bool)
    d_cam = np.concatenate([camera.ray_table(), np.ones((H, W, 1))], -1)  # camera z = 1
    R, o = T_world_camera[:3, :3], T_world_camera[:3, 3]
    d_world = d_cam @ R.T
    labels, _ = ndimage.label(hole)
    open_sky = np.isin(labels, np.unique(labels[0][hole[0]]))
    _, (iy, ix) = ndimage.distance_transform_edt(~solid, return_indices=True)
    near = np.where(hole & ~open_sky, depth[iy, ix], np.inf)
    rows = slice(H - max(H // 8, 1), H)
    bottom = solid[rows]
    ground_z = float(np.median((o + d_world[rows][bottom] * depth[rows][bottom][:, None])[:, 2])) if bottom.any() \
        else o[2] - 1.5
    with np.errstate(divide="ignore", invalid="ignore"):
        t_ground = (ground_z - o[2]) / d_world[..., 2]  # camera z where the ray meets the ground
    t_ground = np.where((t_ground > 0) & (t_ground * np.linalg.norm(d_cam, axis=-1) < opt.fill_range_m),
                        t_ground, np.inf)
    t = np.minimum(near, t_ground)
    grid = np.zeros((H, W), bool)
    grid[opt.fill_stride // 2::opt.fill_stride, opt.fill_stride // 2::opt.fill_stride] = True
    filled = hole & np.isfinite(t)
    pick = filled & grid
    z, on_ground = t[pick], (t == t_ground)[pick]
    d = d_world[pick]
    normals = np.where(on_ground[:, None], [[0.0, 0.0, 1.0]], -d / np.linalg.norm(d, axis=-1, keepdims=True))
    footprint = opt.fill_stride * z / float(camera.fx) * np.where(on_ground, 2.0, 1.0)  # the ground is seen slanted
    return o + d * z[:, None], image[pick], normals, footprint, filled


def add_surfels(run, points: np.ndarray, colours: np.ndarray, normals: np.ndarray, footprint: np.ndarray,
                opacity: float = 0.5) -> int:
    """Append background surfels (fresh optimiser moments); returns how many."""
    from gsim.scenes.init import _frame_from_normal
    from gsim.surfels import rgb_to_sh
    from gsim.transforms import rotmat_to_quat
    n = len(points)
    if n == 0:
        return 0
    model = run.model
    p = model.params
    k = p["sh"].shape[1]
    sh = np.zeros((n, k, 3), np.float32)
    sh[:, 0] = rgb_to_sh(np.clip(colours, 0, 1))
    f = lambda a: torch.as_tensor(np.asarray(a, np.float32))  # noqa: E731
    new = {"means": f(points), "quats": f(rotmat_to_quat(_frame_from_normal(normals))),
           "log_scales": f(np.log(np.repeat(footprint[:, None] / 2, 2, 1))),
           "logit_opacities": torch.full((n,), float(np.log(opacity / (1 - opacity)))), "sh": f(sh),
           "features": torch.zeros((n,) + p["features"].shape[1:])}
    model.replace(torch.ones(len(model), dtype=torch.bool), {k: new[k] for k in p}, torch.full((n,), -1))
    run.adam.remap(p.keys(), torch.ones(len(model) - n, dtype=torch.bool), torch.zeros(n, dtype=torch.long))
    return n


def _picture(path: Path, render: np.ndarray, repaired: np.ndarray) -> None:
    from gsim.io import to_uint8, write_png
    write_png(path, to_uint8(np.concatenate([render, repaired], 1)))


def expand(scene_path, log_path, repairer, out, options: ExpandOptions = ExpandOptions(), progress: bool = True) -> dict:
    """Expands the reconstruction at ``scene_path`` (see the module docstring) into ``out``; returns the
    summary written to out/expand.json. ``repairer``: any object with `repair_image(rgb, alpha, depth, seed)`."""
    from tqdm import tqdm

    from gsim.io import write_json
    from gsim.scenes.evaluate import render_image
    from gsim.scenes.render_path import offset_pose
    from gsim.scenes.train import TrainConfig, start, train_step
    t0 = time.perf_counter()
    out = Path(out)
    state = torch.load(checkpoint_of(scene_path), weights_only=False)
    cfg = TrainConfig.from_dict(state["config"])
    first = int(state["step"])
    stages = [(s, 0.0) for s in options.shifts] + [(0.0, d) for d in options.ahead]  # (left, ahead) m
    cfg = dataclasses.replace(cfg, iterations=first + options.iterations * len(stages))
    torch.manual_seed(options.seed)
    t = start(log_path, cfg, state, progress=progress)
    run, rng = t.run, np.random.default_rng(options.seed)
    summary = {"scene": str(Path(scene_path).resolve()), "log": str(Path(log_path).resolve()),
               "options": options.to_dict(), "first_step": first, "stages": []}
    (out / "pseudo").mkdir(parents=True, exist_ok=True)
    last = max(v.frame for v in t.views)
    for shift, ahead in stages:
        scene = run.model.to_scene(lidar=bool(t.sweeps))
        pseudo: List = []
        added, changed = 0, 0.0
        where = f"{shift:g} m beside" if shift else f"{ahead:g} m ahead"
        moved = [(v, side * shift, 0.0) for v in t.views[::options.every] for side in (1, -1)] if shift else \
            [(v, 0.0, ahead) for v in t.views if v.frame == last]
        for i, (v, left, fwd) in enumerate(tqdm(moved, desc=f"repair views {where}", unit="view",
                                                disable=not progress)):
            T = offset_pose(t.log, v.sensor, v.timestamp_us, ahead_m=fwd, left_m=left)
            Tc = scene.log_pose(T, v.timestamp_us)  # where the scene puts the log's pose (train_step corrects T so)
            rgb, alpha, depth = render_image(scene, v.camera, Tc, v.timestamp_us, v.sensor)
            fixed = repairer.repair_image(rgb, alpha, depth, seed=options.seed + i)
            if i % 8 == 0:
                _picture(out / "pseudo" / f"left{left:+.1f}_ahead{fwd:+.1f}_{i:03d}_{v.sensor}.png", rgb, fixed)
            *fill, filled = fill_points(v.camera, Tc, fixed, alpha, depth, options)
            added += add_surfels(run, *fill)
            taught = corrected(rgb, fixed, filled, options)
            if taught.any():
                pseudo.append(pseudo_view(v, T, fixed, taught))
                changed += float(taught.mean())
        losses = []
        for _ in tqdm(range(options.iterations), desc=f"distill {where}", unit="it", disable=not progress):
            real = rng.random() < options.real_fraction or not pseudo
            pool = t.views if real else pseudo
            view = pool[int(rng.integers(len(pool)))]
            # a pseudo view's loss is its masked residual averaged over the whole image: the pixels it does not
            # teach count as agreeing (a mask-weighted mean would give 2% of a view a whole view's pull)
            loss, _ = train_step(run, view, t.sweeps, t.log, robust=t.robust,
                                 weight=1.0 if real else options.pseudo_weight * float(view.mask.mean()))
            run.step += 1
            losses.append(loss)
        summary["stages"].append({"shift_m": shift, "ahead_m": ahead, "pseudo_views": len(pseudo),
                                  "taught_fraction": changed / max(len(moved), 1), "surfels_added": added,
                                  "loss_first_50": float(np.mean(losses[:50])),
                                  "loss_last_50": float(np.mean(losses[-50:])), "surfels": len(run.model)})
    run.save(out)
    dataclasses.replace(run.model.to_scene(lidar=bool(t.sweeps)), train_downscale=cfg.downscale).save(out / "scene")
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    write_json(out / "expand.json", summary)
    return summary
