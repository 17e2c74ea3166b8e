"""Scene expansion (``gsim expand``): repaired novel views distilled back into the scene (Difix3D+'s recipe).

Stage by stage, outward (each of ``shifts`` in increasing order, then each of ``ahead``): every ``every``-th
training view is moved sideways by the stage's distance to both sides of the vehicle (or the last training
frame's cameras are moved forward beyond the driven path), rendered by the current scene and repaired
(a `RepairModel` or a `PretrainedRepair`); where the render is nearly empty (alpha < ``fill_alpha``) new
surfels are added at a depth taken from the render's surroundings, or on the ground where the pixel's ray
meets it, unless a training view saw through that point (its surface or the sky behind it); then the scene
is fine-tuned on the real training views and these pseudo views, the pseudo views' photometric loss weighted
by ``pseudo_weight`` (the real views stay the reference: the distillation must not cost them quality). The
fine-tuning continues the reconstruction's own run (its checkpoint: optimiser state, the learning rates where its
schedule ended), so the reconstruction directory must hold the checkpoint `gsim reconstruct` wrote. Every stage
is guarded and the result is checked on the log's held-out views (`expand`).

Output: OUT/scene (the expanded scene), OUT/checkpoint.safetensors (so a later expansion can continue),
OUT/expand.json (stages, surfels added, losses, the guards' measurements, held-out PSNR before and after, wall
time) and OUT/pseudo/ (each stage's render | repaired view pictures)."""
from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

import numpy as np
import torch

from gsim.config import Config
from gsim.errors import Diverged, GsimError, GsimWarning, InputError

from .references import agreed_references, training_lidar


PROBE_VIEWS = 12  # training views whose loss the guard compares before, during and after each stage
PROBE_EVERY = 50  # distillation steps between the guard's looks
GATE_REFERENCES = 3  # the nearest training images a pseudo view's confidence is judged by (as the paste's)
SEEN_SOLID, SEEN_CLEAR = 0.9, 0.1  # a training view's render alpha above which it saw a surface, below it the sky


@dataclass(frozen=True)
class ExpandOptions(Config):
    """shifts: sideways distances in metres (both sides), in the order they are distilled (outward); ahead:
    distances the last training frame's cameras are moved forward, beyond the driven path (after the shifts);
    iterations: fine-tuning steps per stage; real_fraction: the share of those steps on real views;
    every: the training views moved (every n-th); fill_alpha: below it a pixel gets a new surfel;
    min_change: a pseudo view's loss counts only where the repair changed the render by more (`corrected`);
    fill_stride: one new surfel per stride x stride pixels; fill_range_m: the farthest ground filled;
    carve_margin: a fill point nearer than (1 - carve_margin) x the depth a training view saw there is dropped
    (`seen_through`); clearance_m, max_near: a moved camera is skipped where the log saw no free space or when
    more than max_near of its render is nearer than clearance_m (`clear_pose`); the guards
    (`expand`): abort: a stage stops when its real views' loss exceeds this multiple of where it started,
    jump: a stage is undone when it leaves the real views' loss more than this share above where it started,
    max_worse_db: the held-out PSNR an expanded scene may lose, unless allow_worse; gate: a pseudo view teaches
    only where it is confident: where at least two of the GATE_REFERENCES nearest real training images, warped into
    it (through the log's LiDAR where it has one: a hole in the render has no depth of its own), agree
    (`gsim.diffusion.references.agreement`); the rest of a repair is not distilled."""

    shifts: Tuple[float, ...] = (1.0, 2.0, 3.0)
    ahead: Tuple[float, ...] = ()
    iterations: int = 300
    real_fraction: float = 0.5
    pseudo_weight: float = 0.5
    every: int = 3
    fill_alpha: float = 0.5
    fill_stride: int = 2
    fill_range_m: float = 60.0
    carve_margin: float = 0.1
    clearance_m: float = 1.5
    max_near: float = 0.1
    min_change: float = 0.03
    seed: int = 0
    abort: float = 2.0
    jump: float = 0.25
    max_worse_db: float = 0.2
    allow_worse: bool = False
    gate: bool = True

    def __post_init__(self):
        for name, most in (("shifts", 10), ("ahead", 50)):
            d = tuple(sorted(float(x) for x in getattr(self, name)))
            object.__setattr__(self, name, d)
            if d and not (d[0] > 0 and d[-1] <= most):
                raise InputError(f"ExpandOptions.{name}: expected distances in (0, {most}] m, got {d}")
        if not self.shifts and not self.ahead:
            raise InputError("ExpandOptions: give shifts or ahead distances")
        if not (self.abort > 1 and self.jump >= 0 and self.max_worse_db >= 0):
            raise InputError(f"ExpandOptions: expected abort > 1, jump >= 0 and max_worse_db >= 0, got {self.abort}, "
                             f"{self.jump}, {self.max_worse_db}")
        for name in ("iterations", "every", "fill_stride"):
            if getattr(self, name) < 1:
                raise InputError(f"ExpandOptions.{name}: expected >= 1, got {getattr(self, name)}")
        if not (0 <= self.carve_margin < 1 and self.clearance_m >= 0 and 0 <= self.max_near <= 1):
            raise InputError(f"ExpandOptions: expected 0 <= carve_margin < 1, clearance_m >= 0 and 0 <= max_near <= 1, "
                             f"got {self.carve_margin}, {self.clearance_m}, {self.max_near}")
        if not 0 <= self.real_fraction <= 1 or not 0 < self.pseudo_weight <= 1:
            raise InputError(f"ExpandOptions: expected 0 <= real_fraction <= 1 and 0 < pseudo_weight <= 1, got "
                             f"{self.real_fraction}, {self.pseudo_weight}")


def checkpoint_of(scene_path) -> Path:
    """The training checkpoint beside a reconstruction's scene (RECON/scene -> RECON/checkpoint.safetensors); RECON
    itself is accepted too. (A legacy checkpoint.pt is found too, for its loader to refuse saying why.)"""
    from gsim.scenes.reconstruction import checkpoint
    p = Path(scene_path)
    for d in (p, p.parent):
        found = checkpoint.find(d)
        if found is not None:
            return found
    raise InputError(f"{p}: no training checkpoint ({checkpoint.NAME}) here or in its parent: expansion fine-tunes "
                     f"the reconstruction's own run; give the directory `gsim reconstruct --out` wrote (or its "
                     f"scene/ folder)")


def pseudo_view(view, T_world_camera: np.ndarray, image: np.ndarray, mask: np.ndarray):
    """A training view moved to ``T_world_camera`` (where the scene puts the camera: the training view's pose
    correction is applied, and none is learnt from it) with ``image`` (a repaired render) as its target where
    ``mask`` (H,W) is 1; no LiDAR."""
    from gsim.appearance import camera_ray_directions
    from gsim.scenes.reconstruction.views import View
    return View(-1, view.sensor, view.timestamp_us, view.camera, T_world_camera, image.astype(np.float32),
                camera_ray_directions(view.camera, T_world_camera), np.zeros(0, np.int64), np.zeros(0, np.float32),
                mask.astype(np.float32), pose_corrected=True)


def corrected(render: np.ndarray, repaired: np.ndarray, filled: np.ndarray, opt: "ExpandOptions") -> np.ndarray:
    """(H,W) bool: where a pseudo view teaches the scene something: the repair changed the render by more than
    ``opt.min_change`` (mean absolute RGB, dilated by 2 px), or a hole was ``filled``. Elsewhere the repaired
    view only repeats the render, softened by the repair's noise, and fitting it blurs the scene (measured:
    -1.4 dB on the held-out frames of the demo street)."""
    from scipy.ndimage import binary_dilation
    changed = np.abs(repaired - render).mean(-1) > opt.min_change
    return binary_dilation(changed, structure=np.ones((5, 5), bool)) | filled


def sights(scene, views) -> list:
    """[(camera, T_world_camera, depth (H,W) m)] for ``views`` (training views): where the scene puts each camera
    and how far it saw through each pixel, as the scene renders it: the depth of a solid surface (alpha >=
    `SEEN_SOLID`), inf where the sky shows (alpha < `SEEN_CLEAR`), 0 (nothing known) between. See `seen_through`."""
    from gsim.images import render_image
    out = []
    for v in views:
        T = scene.log_pose(v.T_world_camera, v.timestamp_us)
        _, alpha, depth = render_image(scene, v.camera, T, v.timestamp_us, v.sensor)
        far = np.where(alpha < SEEN_CLEAR, np.inf, np.where((alpha >= SEEN_SOLID) & (depth > 0), depth, 0.0))
        out.append((v.camera, T, far))
    return out


def seen_through(points: np.ndarray, seen: list, margin: float) -> np.ndarray:
    """(N,) bool: the points some view of ``seen`` (`sights`) looked through: they project in front of what it
    saw there (a surface, nearer than (1 - margin) of its depth, or the sky). A surfel there would stand in the
    way of what the log's camera and LiDAR observed."""
    from gsim.scenes.reconstruction.views import in_image
    out = np.zeros(len(points), bool)
    for camera, T, depth in seen:
        uv, ok, pc = in_image(camera, T, points)
        i = np.flatnonzero(ok)
        u, v = np.floor(uv[i]).astype(np.int64).T
        out[i[pc[i, 2] < (1 - margin) * depth[v, u]]] = True
    return out


def clear_pose(T_world_camera: np.ndarray, alpha: np.ndarray, depth: np.ndarray, seen: list,
               opt: ExpandOptions) -> bool:
    """Whether a moved camera may teach the scene: it stands where a training view of ``seen`` (`sights`) saw
    free space, and no more than ``opt.max_near`` of its render (``alpha``, ``depth``) is a surface nearer than
    ``opt.clearance_m``. Moved sideways, a camera can land inside a parked car or against its flank: its render
    is a close-up (fog from inside), and fitting the repair of it tore the nearby surfels apart (seed 7's 3 m
    stage, 8 of its 70 poses inside, 4 more against a car)."""
    near = float(((depth < opt.clearance_m) & (alpha >= SEEN_SOLID)).mean())
    return near <= opt.max_near and bool(seen_through(T_world_camera[None, :3, 3], seen, opt.carve_margin)[0])


def fill_points(camera, T_world_camera: np.ndarray, image: np.ndarray, alpha: np.ndarray, depth: np.ndarray,
                opt: ExpandOptions, seen: list = ()) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                             np.ndarray]:
    """Where the render is nearly empty: (points (N,3), colours (N,3), normals (N,3), footprints (N,) m,
    filled (H,W) bool: the hole pixels the points cover, before the stride).
    A hole enclosed by rendered surfaces (not reaching the image's top edge, where the sky is) takes the
    depth of its nearest surface pixel (a gap in a facade or the road); a hole pixel whose ray meets the
    ground (the median height of the render's bottom rows) within ``fill_range_m`` lies on it, whichever
    of the two is nearer; the rest is sky and gets nothing. A point a training view of ``seen`` (`sights`)
    looked through is dropped: a hole enclosed by surfaces is often sky (between a crown and a facade, under a
    floater at the top edge) or space a foreground surface (a car, a pole) disoccludes, and a surfel at the
    enclosing depth would float where the log saw nothing (on synthetic seed 7 such walls in the sky diverged
    the 3 m stage)."""
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
    if len(seen):
        filled[filled] = ~seen_through(o + d_world[filled] * t[filled][:, None], seen, opt.carve_margin)
    pick = filled & grid
    z, on_ground = t[pick], (t == t_ground)[pick]
    d = d_world[pick]
    normals = np.where(on_ground[:, None], [[0.0, 0.0, 1.0]], -d / np.linalg.norm(d, axis=-1, keepdims=True))
    footprint = opt.fill_stride * z / float(camera.fx) * np.where(on_ground, 2.0, 1.0)  # the ground is seen slanted
    return o + d * z[:, None], image[pick], normals, footprint, filled


def add_surfels(run, points: np.ndarray, colours: np.ndarray, normals: np.ndarray, footprint: np.ndarray,
                opacity: float = 0.5) -> int:
    """Append background surfels (fresh optimiser moments); returns how many."""
    from gsim.scenes.reconstruction.init import frame_from_normal
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
    new = {"means": f(points), "quats": f(rotmat_to_quat(frame_from_normal(normals))),
           "log_scales": f(np.log(np.repeat(footprint[:, None] / 2, 2, 1))),
           "logit_opacities": torch.full((n,), float(np.log(opacity / (1 - opacity)))), "sh": f(sh),
           "features": torch.zeros((n,) + p["features"].shape[1:])}
    model.replace(torch.ones(len(model), dtype=torch.bool), {k: new[k] for k in p}, torch.full((n,), -1))
    run.adam.remap(p.keys(), torch.ones(len(model) - n, dtype=torch.bool), torch.zeros(n, dtype=torch.long))
    return n


def _picture(path: Path, render: np.ndarray, repaired: np.ndarray) -> None:
    from gsim.io import to_uint8, write_png
    write_png(path, to_uint8(np.concatenate([render, repaired], 1)))


class ExpansionRefused(GsimError):
    """No stage of an expansion could be kept, or the expanded scene is worse on the log's held-out views than
    the reconstruction (beyond `ExpandOptions.max_worse_db`): OUT/expand.json says why, no scene is written."""


def held_out_views(log_path, cfg) -> list:
    """The log's held-out views (the frames the reconstruction never saw) at its training downscale."""
    from gsim.scenes.log import load_log
    from gsim.scenes.reconstruction.views import make_views, split_frames
    log = load_log(log_path)
    return make_views(log, split_frames(log, cfg.holdout_every)[1], cfg.downscale)


def held_out_psnr(scene, views) -> float:
    """The mean PSNR (dB) of ``scene`` on ``views``, rendered where the scene puts the log's poses."""
    from gsim.images import image_metrics, render_image
    return float(np.mean([image_metrics(render_image(scene, v.camera, scene.log_pose(v.T_world_camera, v.timestamp_us),
                                                     v.timestamp_us, v.sensor)[0], v.image)["psnr"] for v in views]))


def expand(scene_path, log_path, repairer, out, options: ExpandOptions = ExpandOptions(), progress: bool = True) -> dict:
    """Expands the reconstruction at ``scene_path`` (see the module docstring) into ``out``; returns the
    summary written to out/expand.json. ``repairer``: any object with `repair_image(rgb, alpha, depth, seed)`
    (`gsim.images.repaired`: a `RepairModel` with reference slots is given each view's references from the log's
    training views).

    Each stage is guarded: it starts from a snapshot of the run, and is undone (the expansion stops there, keeping
    the stages before it) if a training loss is not finite, if the real views' loss jumps (a fixed set of training
    views, photometric loss, looked at every `PROBE_EVERY` steps: beyond `ExpandOptions.abort` x where the stage
    started), or if the stage leaves it more than `ExpandOptions.jump` (a share) above where it started. Then the
    held-out views' PSNR before and after decides: a scene worse by more than `max_worse_db` is not written unless
    `allow_worse`. `ExpansionRefused` when nothing may be written."""
    from tqdm import tqdm

    from gsim.images import render_image, repaired
    from gsim.io import write_json
    from gsim.scenes.evaluation.render_path import offset_pose
    from gsim.scenes.reconstruction.train import (TrainConfig, load_state, resumed, snapshot, start, train_step,
                                                  view_loss)
    t0 = time.perf_counter()
    out = Path(out)
    state = load_state(checkpoint_of(scene_path))
    # the run continues where its schedule ended (train_step keeps the final learning rates past it): a longer
    # schedule here would restart the rates (x5.6 for 1500 + 3 x 300 steps) and unsettle the finished scene
    cfg = TrainConfig.from_dict(state["config"])
    first = int(state["step"])
    stages = [(s, 0.0) for s in options.shifts] + [(0.0, d) for d in options.ahead]  # (left, ahead) m
    torch.manual_seed(options.seed)
    t = start(log_path, cfg, state, progress=progress)
    run, rng, lidar = t.run, np.random.default_rng(options.seed), bool(t.sweeps)
    held = held_out_views(log_path, cfg)
    probe = t.views[::max(len(t.views) // PROBE_VIEWS, 1)][:PROBE_VIEWS]
    probe_loss = lambda: float(np.mean([view_loss(run, v) for v in probe]))  # noqa: E731  (of the current run)
    recon = run.model.to_scene(lidar, cfg.surface_eps)
    seen = sights(recon, t.views)  # what the log saw, as the reconstruction renders it: fills stay out
    summary = {"scene": str(Path(scene_path).resolve()), "log": str(Path(log_path).resolve()),
               "options": options.to_dict(), "first_step": first, "stages": [],
               "held_out_psnr_before": held_out_psnr(recon, held) if held else None}
    (out / "pseudo").mkdir(parents=True, exist_ok=True)
    last = max(v.frame for v in t.views)
    # references only from frames the reconstruction trained on (a train_span run leaves later frames unseen)
    trained = {v.frame for v in t.views}
    unseen = tuple(f.index for f in t.log.frames if f.index not in trained)
    gate_lidar = training_lidar(t.log, cfg.holdout_every, unseen) if options.gate else None
    for shift, ahead in stages:
        good = snapshot(run)
        start_loss = probe_loss()
        scene = run.model.to_scene(lidar, cfg.surface_eps)
        pseudo: List = []
        added, changed, blocked, gated = 0, 0.0, 0, np.zeros(2)  # gated: pixels the repairs proposed, kept
        where = f"{shift:g} m beside" if shift else f"{ahead:g} m ahead"
        moved = [(v, side * shift, 0.0) for v in t.views[::options.every] for side in (1, -1)] if shift else \
            [(v, 0.0, ahead) for v in t.views if v.frame == last]
        for i, (v, left, fwd) in enumerate(tqdm(moved, desc=f"repair views {where}", unit="view",
                                                disable=not progress)):
            T = offset_pose(t.log, v.sensor, v.timestamp_us, ahead_m=fwd, left_m=left)
            Tc = scene.log_pose(T, v.timestamp_us)  # where the scene puts the log's pose
            rgb, alpha, depth = render_image(scene, v.camera, Tc, v.timestamp_us, v.sensor)
            if not clear_pose(Tc, alpha, depth, seen, options):
                blocked += 1
                continue
            fixed = repaired(repairer, scene, t.log, v.camera, T, v.timestamp_us, rgb, alpha, depth, options.seed + i,
                             sensor=v.sensor, holdout_every=cfg.holdout_every, downscale=cfg.downscale,
                             exclude=unseen)
            if i % 8 == 0:
                _picture(out / "pseudo" / f"left{left:+.1f}_ahead{fwd:+.1f}_{i:03d}_{v.sensor}.png", rgb, fixed)
            *fill, filled = fill_points(v.camera, Tc, fixed, alpha, depth, options, seen)
            added += add_surfels(run, *fill)
            taught = corrected(rgb, fixed, filled, options)
            if options.gate and taught.any():
                proposed = float(taught.sum())
                taught &= agreed_references(scene, t.log, v.camera, T, v.timestamp_us, GATE_REFERENCES, alpha, depth,
                                            gate_lidar, sensor=v.sensor, holdout_every=cfg.holdout_every,
                                            downscale=cfg.downscale, exclude=unseen)[1]
                gated += (proposed, float(taught.sum()))
            if taught.any():
                pseudo.append(pseudo_view(v, Tc, fixed, taught))
                changed += float(taught.mean())
        losses, stopped = [], None
        for k in tqdm(range(options.iterations), desc=f"distill {where}", unit="it", disable=not progress):
            real = rng.random() < options.real_fraction or not pseudo
            pool = t.views if real else pseudo
            view = pool[int(rng.integers(len(pool)))]
            # a pseudo view's loss is its masked residual averaged over the whole image: the pixels it does not
            # teach count as agreeing (a mask-weighted mean would give 2% of a view a whole view's pull)
            try:
                loss, _ = train_step(run, view, t.sweeps, t.log, robust=t.robust,
                                     weight=1.0 if real else options.pseudo_weight * float(view.mask.mean()))
            except Diverged as e:  # a non-finite loss
                stopped = str(e)
                break
            run.step += 1
            losses.append(loss)
            if (k + 1) % PROBE_EVERY == 0 and k + 1 < options.iterations:
                now = probe_loss()
                if not now <= options.abort * start_loss:  # (a NaN too)
                    stopped = f"the real views' loss jumped from {start_loss:.4g} to {now:.4g} by step {k + 1}"
                    break
        end_loss = probe_loss() if stopped is None else None
        if stopped is None and not end_loss <= start_loss * (1 + options.jump):
            stopped = f"the real views' loss rose from {start_loss:.4g} to {end_loss:.4g}"
            end_loss = end_loss if np.isfinite(end_loss) else None  # (expand.json stays strict JSON)
        record = {"shift_m": shift, "ahead_m": ahead, "poses_blocked": blocked, "pseudo_views": len(pseudo),
                  "taught_fraction": changed / max(len(moved), 1), "surfels_added": added,
                  "gate_pass_fraction": float(gated[1] / gated[0]) if options.gate and gated[0] else None,
                  "loss_first_50": float(np.mean(losses[:50])) if losses else None,
                  "loss_last_50": float(np.mean(losses[-50:])) if losses else None,
                  "real_view_loss_before": start_loss, "real_view_loss_after": end_loss, "kept": stopped is None}
        if stopped is not None:
            run = resumed(cfg, good, t.log)  # back to the last good scene; the outer stages build on this one
            summary["stages"].append({**record, "stopped": stopped, "surfels": len(run.model)})
            warnings.warn(f"expand: the {where} stage was undone ({stopped}); the expansion stops with the stages "
                          f"before it", GsimWarning, stacklevel=2)
            break
        summary["stages"].append({**record, "surfels": len(run.model)})
    kept = sum(s["kept"] for s in summary["stages"])
    final = run.model.to_scene(lidar, cfg.surface_eps)
    summary["held_out_psnr_after"] = held_out_psnr(final, held) if held else None
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    worse = (summary["held_out_psnr_before"] - summary["held_out_psnr_after"]) if held else 0.0
    refused = ("no stage could be kept" if not kept else
               f"the expanded scene is {worse:.2f} dB worse than the reconstruction on the log's held-out views "
               f"(more than {options.max_worse_db:g} dB; allow_worse / --allow-worse writes it anyway)"
               if worse > options.max_worse_db and not options.allow_worse else None)
    if refused is not None:
        write_json(out / "expand.json", {**summary, "refused": refused})
        raise ExpansionRefused(f"{out}: {refused}; the scene and its checkpoint were not written (expand.json says "
                               f"what each stage measured)")
    run.save(out)
    dataclasses.replace(final, train_downscale=cfg.downscale).save(out / "scene")
    write_json(out / "expand.json", summary)
    return summary
