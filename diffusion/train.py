"""Training the repair model (`gsim.diffusion.repair`) on a user's own log: ``gsim diffusion train``.

Training pairs come from the log itself (as FreeSim and ReconDreamer make theirs): renders of the training
views by deliberately degraded reconstructions (trained briefly on a subset of the frames, so that most views
are ones they never saw: the artefacts of novel views) and by the scene itself (good renders the model must
leave alone), each against the real image. Held-out frames are never used. For a model with reference slots
(`RepairConfig.references`) each pair also gets that many real training images warped into its view through the
rendering scene's depth or the log's LiDAR (`RepairConfig.reference_depth`, `gsim.diffusion.references`), never
one of the pair's own frame (its real image is the target). Random crops, AdamW, a cosine schedule; a
checkpoint every ``checkpoint_every`` steps in the work directory (checkpoint.safetensors, `gsim.scenes.reconstruction.checkpoint`:
nothing in it runs when read) makes it resumable."""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from gsim.config import Config
from gsim.errors import Diverged, InputError
from gsim.io import atomic_path
from gsim.scenes.reconstruction import checkpoint

from .repair import RepairConfig, RepairModel


@dataclass(frozen=True)
class TrainOptions(Config):
    """degraded: (holdout_every, iterations) of each degraded reconstruction trained on the frames whose
    index is not a multiple of holdout_every (interpolation: its novel views lie between seen ones);
    extrapolated: (first, last, iterations) of each one trained on that share of the training frames only
    (its renders of the others look ahead of or behind what it saw, as a lane shift looks beside it);
    crop: training crops' side (a multiple of the UNet's; 64 trains 2.3x faster than 96 on a CPU for the same
    repairs on the demo street, BENCHMARKS.md)."""

    steps: int = 2000
    batch: int = 4
    crop: int = 64
    lr: float = 5e-4
    seed: int = 0
    checkpoint_every: int = 250
    degraded: Tuple[Tuple[int, int], ...] = ((2, 500), (4, 250))
    extrapolated: Tuple[Tuple[float, float, int], ...] = ((0.0, 0.5, 500), (0.5, 1.0, 500))

    def __post_init__(self):
        object.__setattr__(self, "degraded", tuple(tuple(int(x) for x in d) for d in self.degraded))
        object.__setattr__(self, "extrapolated", tuple((float(a), float(b), int(n)) for a, b, n in self.extrapolated))
        if any(not 0 <= a < b <= 1 or n < 1 for a, b, n in self.extrapolated):
            raise InputError(f"TrainOptions.extrapolated: expected (first, last, iterations) with 0 <= first < last "
                             f"<= 1 and iterations >= 1, got {self.extrapolated}")
        for name in ("steps", "batch", "crop", "checkpoint_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InputError(f"TrainOptions.{name}: expected a positive integer, got {getattr(self, name)!r}")
        if any(len(d) != 2 or d[0] < 2 or d[1] < 1 for d in self.degraded):
            raise InputError(f"TrainOptions.degraded: expected (holdout_every >= 2, iterations >= 1) pairs, got "
                             f"{self.degraded}")


@dataclass
class Pairs:
    """Renders and real images of training views: rgb (N,H,W,3) uint8, alpha (N,H,W) uint8, depth (N,H,W)
    float16 m, real (N,H,W,3) uint8, source (N,) the scene each render came from; warped (N,K,H,W,3) uint8 and
    valid (N,K,H,W) bool: each pair's K references (K = 0: none)."""

    rgb: np.ndarray
    alpha: np.ndarray
    depth: np.ndarray
    real: np.ndarray
    source: List[str]
    warped: np.ndarray
    valid: np.ndarray

    @classmethod
    def stacked(cls, items) -> "Pairs":
        """The pairs of ``items``: (rgb, alpha, depth, real, source, warped, valid) tuples, one per pair."""
        return cls(*(np.stack([it[i] for it in items]) for i in range(4)), [it[4] for it in items],
                   *(np.stack([it[i] for it in items]) for i in (5, 6)))

    @classmethod
    def read(cls, z) -> "Pairs":
        """The pairs of an npz `save` wrote (``z``, opened without pickle); one written before references has none."""
        if "warped" in z:
            return cls(z["rgb"], z["alpha"], z["depth"], z["real"], [str(s) for s in z["source"]], z["warped"],
                       z["valid"])
        n, H, W = z["rgb"].shape[:3]
        return cls(z["rgb"], z["alpha"], z["depth"], z["real"], [str(s) for s in z["source"]],
                   np.zeros((n, 0, H, W, 3), np.uint8), np.zeros((n, 0, H, W), bool))

    def save(self, path: Path, **extra) -> None:
        """The pairs (and ``extra`` arrays) as an npz at ``path``, written atomically."""
        with atomic_path(path, ".npz") as tmp:
            np.savez(tmp, rgb=self.rgb, alpha=self.alpha, depth=self.depth, real=self.real,
                     source=np.array(self.source), warped=self.warped, valid=self.valid, **extra)


def _render_pairs(scene, views, name: str, log, config: RepairConfig, holdout_every: int, downscale: int,
                  unseen: Tuple[int, ...]):
    from gsim.io import to_uint8
    from gsim.images import render_image

    from .references import model_references
    out, k = [], config.references
    for v in views:
        rgb, alpha, depth = render_image(scene, v.camera, scene.log_pose(v.T_world_camera, v.timestamp_us),
                                         v.timestamp_us, v.sensor)
        warped, valid = np.zeros((k,) + rgb.shape, np.uint8), np.zeros((k,) + alpha.shape, bool)
        if k:  # (a log with fewer training views leaves the last slots invalid)
            refs = model_references(config, scene, log, v.camera, v.T_world_camera, v.timestamp_us, alpha, depth,
                                    sensor=v.sensor, holdout_every=holdout_every, downscale=downscale,
                                    exclude=[v.frame, *unseen], lidar_exclude=unseen)
            for i, (w, m) in enumerate(refs):
                warped[i], valid[i] = to_uint8(w), m
        out.append((to_uint8(rgb), to_uint8(alpha), depth.astype(np.float16), to_uint8(v.image), name, warped, valid))
    return out


def degraded_runs(options: TrainOptions) -> Dict[str, dict]:
    """Name -> the `preset` overrides of each degraded reconstruction the options ask for."""
    runs = {f"every{e}-{n}": dict(holdout_every=e, iterations=n) for e, n in options.degraded}
    runs.update({f"span{a:g}-{b:g}-{n}": dict(train_span=(a, b), iterations=n) for a, b, n in options.extrapolated})
    return runs


def trained_frames(scene_path) -> Tuple[int, Optional[List[int]]]:
    """(holdout_every, the log frame indices) the reconstruction whose scene folder is ``scene_path`` trained on,
    from its training record (`gsim reconstruct`'s train.json beside the folder); (8, None: all the training
    frames) for a scene without one."""
    record = Path(scene_path).parent / "train.json"
    if not record.is_file():
        return 8, None
    try:
        d = json.loads(record.read_text())
        frames = d.get("train_frames")
        return int(d["config"]["holdout_every"]), None if frames is None else [int(i) for i in frames]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{record}: expected a training record (JSON) with config.holdout_every and train_frames "
                         f"({type(e).__name__}: {e})") from None


def _within(split: list, seen: List[int], share: Tuple[float, float]) -> Tuple[float, float]:
    """The `TrainConfig.train_span` over ``split`` (a list of frames) that selects the ``share`` part of those of
    its frames that lie between the first and the last of ``seen`` (frame indices): a degraded reconstruction of a
    reconstruction that saw part of the drive sees no more of it."""
    inside = [i for i, f in enumerate(split) if min(seen) <= f.index <= max(seen)]
    if not inside:
        raise InputError(f"the reconstruction's training frames {min(seen)}-{max(seen)} leave no frame to train a "
                         f"degraded reconstruction on")
    n = len(inside)
    first, last = inside[0] + int(round(share[0] * n)), inside[0] + max(int(round(share[1] * n)), 1)
    return first / len(split), last / len(split)


def make_pairs(scene_path, log_path, work: Path, options: TrainOptions, progress: bool = True,
               config: RepairConfig = RepairConfig()) -> Pairs:
    """The training pairs with ``config.references`` references each, warped through ``config.reference_depth``
    (cached in work/pairs.npz for the same degraded reconstructions, reference count, depth and frames): each
    degraded reconstruction is trained into work/degraded-<name>/ (kept, so a rerun reuses it). Only the frames the
    reconstruction trained on (`trained_frames`) take part: a reconstruction of the first part of a drive (`gsim
    reconstruct --train-span`) gets a model that has seen nothing of the rest, neither image nor LiDAR, so that
    the rest still measures extrapolation."""
    from gsim.scene import load_scene
    from gsim.scenes.log import load_log
    from gsim.scenes.reconstruction.train import preset, reconstruct
    from gsim.scenes.reconstruction.views import make_views, split_frames
    cache = work / "pairs.npz"
    runs = degraded_runs(options)
    log = load_log(log_path)
    holdout_every, seen = trained_frames(scene_path)
    train_frames, _ = split_frames(log, holdout_every)
    unseen = () if seen is None else tuple(f.index for f in train_frames if f.index not in set(seen))
    train_frames = [f for f in train_frames if f.index not in unseen]
    if cache.is_file():
        z = np.load(cache, allow_pickle=False)
        k = z["warped"].shape[1] if "warped" in z else 0  # (caches written before references: none)
        through = str(z["reference_depth"]) if "reference_depth" in z else "render"  # (before the field: render)
        frames = [int(i) for i in z["frames"]] if "frames" in z else None  # (before the field: all)
        if sorted(set(str(s) for s in z["source"])) == sorted(["scene", *runs]) and k == config.references \
                and (not k or through == config.reference_depth) and frames == (seen if unseen else None):
            return Pairs.read(z)
    scene = load_scene(scene_path)
    downscale = scene.train_downscale or 1
    views = make_views(log, train_frames, downscale)
    items = _render_pairs(scene, views, "scene", log, config, holdout_every, downscale, unseen)
    for k, (name, overrides) in enumerate(runs.items()):
        d = work / f"degraded-{name}"
        overrides = {"holdout_every": holdout_every, **overrides}
        if unseen:
            overrides["train_span"] = _within(split_frames(log, overrides["holdout_every"])[0], seen,
                                              overrides.get("train_span", (0.0, 1.0)))
        if not (d / "scene" / "scene.json").is_file():
            print(f"degraded reconstruction {k + 1}/{len(runs)} ({name}): {overrides}", flush=True)
            reconstruct(log_path, d, preset("cpu", downscale=downscale, seed=options.seed + k, **overrides),
                        progress=progress)
        items += _render_pairs(load_scene(d / "scene"), views, name, log, config, holdout_every, downscale, unseen)
    pairs = Pairs.stacked(items)
    pairs.save(cache, reference_depth=np.array(config.reference_depth),
               **({"frames": np.array(seen, np.int64)} if unseen else {}))
    return pairs


def _batch(pairs: Pairs, options: TrainOptions, rng: np.random.Generator):
    n, H, W = pairs.rgb.shape[:3]
    c = options.crop
    if c > H or c > W:
        raise InputError(f"TrainOptions.crop: {c} is larger than the images ({W}x{H})")
    idx = rng.integers(0, n, options.batch)
    ys, xs = rng.integers(0, H - c + 1, options.batch), rng.integers(0, W - c + 1, options.batch)
    crop = lambda a: np.stack([a[i, y:y + c, x:x + c] for i, y, x in zip(idx, ys, xs)])  # noqa: E731
    t = lambda a, s: torch.from_numpy(crop(a).astype(np.float32) * s).reshape(options.batch, c, c, -1) \
        .permute(0, 3, 1, 2).contiguous()  # noqa: E731
    k = pairs.warped.shape[1]
    crop_k = lambda a: np.stack([a[i, :, y:y + c, x:x + c] for i, y, x in zip(idx, ys, xs)])  # noqa: E731
    refs = torch.from_numpy(np.concatenate([crop_k(pairs.warped).astype(np.float32) / 255,
                                            crop_k(pairs.valid)[..., None].astype(np.float32)], -1)) \
        .permute(0, 1, 4, 2, 3).contiguous() if k else None  # (B,K,4,c,c)
    return t(pairs.real, 1 / 255), t(pairs.rgb, 1 / 255), t(pairs.alpha, 1 / 255), t(pairs.depth, 1.0), refs


KIND = "repair-training"  # the checkpoint's kind
LEGACY_ADVICE = ("Run it without --resume: the repair model's steps start over, the pairs and degraded "
                 "reconstructions in that folder are reused.")


def _save(path: Path, model: RepairModel, opt, rng: np.random.Generator, gen: torch.Generator, step: int,
          losses: List[float]) -> None:
    """The weights, AdamW's state per parameter (by its name: "adamw/<name>/<key>"), the random states, the step
    and the losses so far. (The learning rate is a function of the step: nothing to keep.)"""
    names = [n for n, _ in model.unet.named_parameters()]
    state = opt.state_dict()["state"]
    tensors = {**{f"unet/{k}": v for k, v in model.unet.state_dict().items()},
               **{f"adamw/{names[i]}/{k}": v for i, st in state.items() for k, v in st.items()},
               "rng/torch": gen.get_state()}
    checkpoint.write(path, KIND, tensors, {"step": step, "losses": losses, "rng": rng.bit_generator.state,
                                           "adamw": [names[i] for i in state]})


def _resume(path: Path, model: RepairModel, opt, rng: np.random.Generator, gen: torch.Generator) \
        -> Tuple[int, List[float]]:
    """Restore what `_save` wrote, checked against this model (names, dtypes, shapes); returns (step, losses)."""
    ck = checkpoint.read(path, KIND, LEGACY_ADVICE)
    weights = {k: ck.tensor(f"unet/{k}", v.dtype, tuple(v.shape)) for k, v in model.unet.state_dict().items()}
    params = dict(model.unet.named_parameters())
    index = {n: i for i, n in enumerate(params)}  # the optimiser's numbering: the order of unet.parameters()
    moments = ck.field("adamw", [str])
    unknown = [n for n in moments if n not in index]
    if unknown:
        raise ck.error("adamw", f"{unknown[:3]} are not parameters of this model")
    state = opt.state_dict()
    state["state"] = {index[n]: {"step": ck.tensor(f"adamw/{n}/step", torch.float32, ()),
                                 **{k: ck.tensor(f"adamw/{n}/{k}", params[n].dtype, tuple(params[n].shape))
                                    for k in ("exp_avg", "exp_avg_sq")}} for n in moments}
    step, losses = ck.field("step", int), ck.field("losses", [float])
    rng_state, gen_state = ck.numpy_rng("rng"), ck.torch_rng("rng/torch")
    ck.done()
    model.unet.load_state_dict(weights)
    opt.load_state_dict(state)
    rng.bit_generator.state = rng_state
    gen.set_state(gen_state)
    return step, losses


def _pretrained(path, config: RepairConfig) -> RepairModel:
    """The repair model at ``path``, to be trained further with ``config`` (its loss may differ, nothing else)."""
    model = RepairModel.load(path)
    theirs = model.config.to_dict()
    for name, value in config.to_dict().items():
        if name != "loss" and theirs[name] != value:
            raise InputError(f"{path}: cannot start from this repair model: its {name} is {theirs[name]!r} "
                             f"({Path(path) / 'gsim_repair.json'}), this training's {value!r}")
    return RepairModel(model.unet, model.scheduler, config)


def train(scene_path, log_path, out, options: TrainOptions = TrainOptions(), config: RepairConfig = RepairConfig(),
          work: Optional[Path] = None, resume: bool = False, progress: bool = True,
          pairs: Optional[Pairs] = None, init=None, device="cpu") -> dict:
    """Trains a repair model on ``log_path`` with the reconstruction ``scene_path`` and writes it to ``out``
    (diffusers' directory format with a model card); returns the card's numbers. ``work`` (default
    out + "-work") holds the pairs, the degraded reconstructions and the resumable checkpoint. ``pairs``: train on
    these instead of the log's own (bench/bench_offpath_pairs.py: synthetic streets off the path). ``init``: a
    repair model directory to start from instead of a fresh model (fine-tuning a pretrained one); every
    `RepairConfig` field but the loss must be ``config``'s. ``device``: where the model trains (e.g. "cuda"; the
    pairs, their crops and the noise are drawn on the CPU as anywhere)."""
    from tqdm import tqdm
    out = Path(out)
    work = Path(work) if work is not None else out.parent / f"{out.name}-work"
    work.mkdir(parents=True, exist_ok=True)
    if options.crop % config.multiple:
        raise InputError(f"TrainOptions.crop: {options.crop} must be a multiple of {config.multiple} (the UNet's)")
    t0 = time.perf_counter()
    model = RepairModel.new(config, seed=options.seed) if init is None else _pretrained(init, config)
    model.to(device)
    opt = torch.optim.AdamW(model.unet.parameters(), lr=options.lr, weight_decay=1e-4)
    rng, gen = np.random.default_rng(options.seed), torch.Generator().manual_seed(options.seed)
    step, losses = 0, []
    found = checkpoint.find(work) if resume else None
    if found is not None:  # read before the pairs are made: a bad checkpoint fails now, not minutes later
        step, losses = _resume(found, model, opt, rng, gen)
    if pairs is None:
        pairs = make_pairs(scene_path, log_path, work, options, progress=progress, config=config)
    model.unet.train()
    bar = tqdm(range(step, options.steps), desc="train repair model", unit="step", disable=not progress,
               initial=step, total=options.steps)
    for step in bar:
        for group in opt.param_groups:  # the cosine schedule
            group["lr"] = options.lr * (0.5 * (1 + math.cos(math.pi * min(step / options.steps, 1))))
        real, rgb, alpha, depth, refs = (None if x is None else x.to(device) for x in _batch(pairs, options, rng))
        loss = model.loss(real, rgb, alpha, depth, generator=gen, references=refs)
        if not torch.isfinite(loss):
            raise Diverged(f"diffusion train: the loss is {loss.item()} at step {step}: training diverged; "
                                     f"the checkpoint written before is the last good one")
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
        if (step + 1) % options.checkpoint_every == 0 or step + 1 == options.steps:
            _save(work / checkpoint.NAME, model, opt, rng, gen, step + 1, losses)
    model.unet.eval()
    H, W = pairs.rgb.shape[1:3]
    card = {"scene": str(Path(scene_path).resolve()), "log": str(Path(log_path).resolve()),
            "pairs": {s: pairs.source.count(s) for s in dict.fromkeys(pairs.source)}, "image_size": [W, H],
            "options": options.to_dict(), "config": config.to_dict(), "steps": options.steps,
            "init": None if init is None else str(Path(init).resolve()),
            "loss_first_100": float(np.mean(losses[:100])), "loss_last_100": float(np.mean(losses[-100:])),
            "device": str(model.device), "wall_s": round(time.perf_counter() - t0, 1)}
    model.save(out, _card(card), card)
    return card


def _card(c: dict) -> str:
    init = f", starting from the model `{c['init']}` (its card says what it learnt from)" if c.get("init") else ""
    return (f"# gsim repair model\n\nA conditional diffusion model (diffusers UNet2DModel + DDPMScheduler, pixel space) "
            f"that repairs renders of a reconstruction; one network pass from the render noised to step "
            f"{c['config']['repair_t']} of {c['config']['train_timesteps']}.\n\n"
            f"- Data: log `{c['log']}`, scene `{c['scene']}`; pairs (render, real image) of the training views "
            f"(held-out frames never used): {c['pairs']}\n"
            f"- Training: {c['steps']} steps of {c['options']['batch']} random {c['options']['crop']}-pixel crops of "
            f"{c['image_size'][0]}x{c['image_size'][1]} images{init}; "
            f"{c['config']['loss'].upper()} denoising loss {c['loss_first_100']:.4f} (first 100 "
            f"steps) -> {c['loss_last_100']:.4f} (last 100); {c['wall_s']:.0f} s in all on "
            f"{c.get('device', 'cpu')}\n"
            f"- Made by `gsim diffusion train`; settings in card.json and gsim_repair.json\n")
