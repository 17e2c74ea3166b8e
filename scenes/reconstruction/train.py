"""`gsim reconstruct`: train a surfel scene on a driving log.

Data (scenes.reconstruction.views), model (scenes.reconstruction.model), losses (scenes.reconstruction.losses), optimisation and
densification (scenes.reconstruction.optim) live in their own modules; this one holds the configuration,
the loop, and checkpoints. A checkpoint (OUT/checkpoint.safetensors, `gsim.scenes.reconstruction.checkpoint`: tensors and a
JSON header, nothing that runs when read) is written atomically every ``checkpoint_every`` iterations and at the
end, with the model, the optimiser moments, the densification statistics and every random state, so
``--resume`` continues exactly where the run stopped: a resumed run ends with the same scene as an
uninterrupted one.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from gsim.appearance import IDENTITY_AFFINE, Sky, compose
from gsim.errors import Diverged, InputError, Unavailable
from gsim.io import write_json
from gsim.lidar.heads import FEATURES, WEIGHTS, LidarHead
from gsim.render import BACKENDS, RenderOptions, render_camera
from gsim.render.common import to_device

from . import checkpoint, losses, multiview
from .. import kernel_cache
from .init import InitOptions, initial_surfels
from .lidar_fit import render_rays
from .lidar_rays import SweepRays, sweep_rays
from ..log import load_log
from .model import SKY_SHAPE, SceneModel
from .movers import detect_movers, write_pictures
from .ground import GroundField, GroundOptions, road_loss
from .sky_fill import SkyFill
from .sky_mask import SkyPixels, empty_directions, sky_masks
from .optim import Adam, DensifyOptions, Densifier
from .views import Ignored, View, lidar_reach, make_views, split_frames

CHECKPOINT = checkpoint.NAME
KIND = "reconstruction"  # the checkpoint's kind (`gsim.scenes.reconstruction.checkpoint`)
CONFIG_SCHEMA = 1
ROAD_EVERY = 4  # steps between the road term's turns (`ground.road_loss`)


@dataclass(frozen=True)
class TrainConfig:
    preset: str = "cpu"
    backend: str = "torch"
    iterations: int = 3000  # the synthetic street stays within 15 min on 2 cores (BENCHMARKS.md)
    seed: int = 0
    holdout_every: int = 8
    train_span: Optional[Tuple[float, float]] = None  # train on this share of the training frames only (e.g.
    # (0, 0.5): the first half; `gsim.diffusion.train`'s extrapolating reconstructions); None: all of them
    downscale: int = 1  # train on images box-averaged by this factor (evaluate with the same)
    ssim_weight: float = 0.2
    lidar_weight: float = 0.1  # LiDAR points projected into the camera view: depth L1 + (1 - alpha)
    lidar_rays: int = 2048  # LiDAR rays rendered per step (0: no LiDAR ray losses, no intensity/ray-drop head)
    lidar_every: int = 8  # steps between LiDAR ray batches (each bins every surfel: costly on a CPU)
    lidar_range_weight: float = 0.1  # ray range L1 (m) + (1 - alpha) on returns
    lidar_intensity_weight: float = 0.5  # MSE of the head's intensity on returns
    lidar_drop_weight: float = 0.05  # BCE of the head's ray drop where the scene has a surface
    lidar_free_weight: float = 1.0  # alpha within range on the empty rays at or above the horizon (0: off)
    lidar_rays_per_sweep: int = 20000  # rays kept per training sweep (a random subset, fixed at load)
    normal_weight: float = 0.05
    normal_from: int = 500  # iteration where the normal and distortion losses start (2DGS waits for geometry)
    distortion_weight: float = 100.0  # 2DGS's depth distortion (its weight for unbounded scenes)
    surface_eps: float = 0.0  # > 0: surfels composite as surfaces (`RenderOptions.surface_eps`), also in the scene
    lr_means: float = 1.6e-4  # x scene scale, decays x0.01 over the run
    lr_quats: float = 1e-3
    lr_scales: float = 5e-3
    lr_opacities: float = 5e-2
    lr_sh: float = 2.5e-3
    lr_sky: float = 1e-2
    lr_affine: float = 1e-3
    lr_features: float = 1e-2
    lr_head: float = 1e-3
    lr_actor_pose: float = 2e-3  # the tracks' pose offsets (m and rad per step, decays as the means'; 0: boxes as given)
    lr_view_rot: float = 2e-4  # the views' pose corrections (rad per step, decays as the means'; both 0: off)
    lr_view_trans: float = 2e-3  # (m per step)
    checkpoint_every: int = 500
    max_train_s: Optional[float] = None  # a wall-time budget for this session's training loop: the learning rates
    # decay over whichever of the iterations and the budget runs out first, and the run stops (checkpoint and
    # scene written) when the budget is spent
    movers: bool = True  # a log without actor tracks: find its moving objects in the LiDAR (scenes.reconstruction.movers)
    robust_k: float = 5.0  # with found movers: pixels whose local residual exceeds k x the median ... (0: off)
    robust_floor: float = 0.1  # ... and this (mean absolute RGB) are turned down in the photometric loss (transients)
    robust_from: int = 500  # iteration where the robust mask starts (the residuals mean something by then)
    sky_weight: float = 0.1  # the rendered alpha on the views' sky pixels (`sky_mask`; 0: no masks, sky seeded too)
    sky_fill: bool = False  # the sky map's texels no sky-mask pixel looks along follow the others (`sky_fill`)
    road_weight: float = 1.0  # the lying surfels near the LiDAR's ground held at its height (`ground`; 0: off)
    multiview_weight: float = 0.0  # NCC of the neighbouring views' images warped through the depth (`multiview`)
    opacity_weight: float = 0.0  # the opacities' binary entropy (`losses.opacity_entropy`), from normal_from on
    init: InitOptions = field(default_factory=InitOptions)
    densify: DensifyOptions = field(default_factory=DensifyOptions)

    def __post_init__(self):
        if self.train_span is not None:
            object.__setattr__(self, "train_span", tuple(float(x) for x in self.train_span))
            if len(self.train_span) != 2 or not 0 <= self.train_span[0] < self.train_span[1] <= 1:
                raise InputError(f"TrainConfig.train_span: expected (first, last) shares with 0 <= first < last <= 1, "
                                 f"got {self.train_span}")
        if self.lidar_every < 1 or self.lidar_rays < 0 or self.lidar_rays_per_sweep < 1:
            raise InputError(f"TrainConfig: need lidar_every >= 1, lidar_rays >= 0 and lidar_rays_per_sweep >= 1, got "
                             f"{self.lidar_every}, {self.lidar_rays}, {self.lidar_rays_per_sweep}")
        if self.max_train_s is not None and not self.max_train_s > 0:
            raise InputError(f"TrainConfig.max_train_s: expected seconds > 0 or None, got {self.max_train_s}")
        if self.checkpoint_every < 1 or self.downscale < 1:
            raise InputError(f"TrainConfig: need checkpoint_every >= 1 and downscale >= 1, got "
                             f"{self.checkpoint_every}, {self.downscale}")

    def with_overrides(self, fields: dict) -> "TrainConfig":
        """This configuration with ``fields`` replaced; a nested options field (init, densify) takes a dict of its
        own fields. A TypeError or AttributeError names a field that is not one."""
        return dataclasses.replace(self, **{k: dataclasses.replace(getattr(self, k), **v) if isinstance(v, dict) else v
                                            for k, v in fields.items()})

    @property
    def refines_views(self) -> bool:
        return bool(self.lr_view_rot or self.lr_view_trans)

    @property
    def device(self) -> str:
        """Where the model, the optimiser and the losses live: the GPU with gsplat, else the CPU."""
        return "cuda" if self.backend == "gsplat" else "cpu"

    def to_dict(self) -> dict:
        return {"schema_version": CONFIG_SCHEMA, **dataclasses.asdict(self)}

    @staticmethod
    def from_dict(d: dict) -> "TrainConfig":
        d = dict(d)
        if d.pop("schema_version", None) != CONFIG_SCHEMA:
            raise InputError(f"train config: schema_version must be {CONFIG_SCHEMA}")
        d.setdefault("movers", False)  # a checkpoint from before movers were found trained without them
        d.setdefault("lr_actor_pose", 0.0)  # nor refined their poses
        d.setdefault("lr_view_rot", 0.0)  # nor the views'
        d.setdefault("lr_view_trans", 0.0)
        d.setdefault("sky_weight", 0.0)  # nor kept surfels out of the sky
        d.setdefault("sky_fill", False)  # nor filled the sky's unseen directions
        d.setdefault("road_weight", 0.0)  # nor held the road's surfels on its surface
        d.setdefault("lidar_free_weight", 0.0)  # nor cleared the empty LiDAR rays
        d.setdefault("multiview_weight", 0.0)  # nor asked the neighbouring views
        d.setdefault("opacity_weight", 0.0)  # nor pushed opacities to 0 or 1
        init = {"far_range": 0.0, **d["init"]}  # nor seeded beyond the LiDAR's reach
        return TrainConfig(**{**d, "init": InitOptions(**init), "densify": DensifyOptions(**d["densify"])})


PRESETS = {
    # CPU: 2 cores; the numba backend with its backward when it is differentiable, else the torch reference
    "cpu": TrainConfig(),
    # CUDA: gsplat, the CPU preset's start (its 3000 steps on 400k surfels reach 23 dB on KITTI, where the 3DGS
    # schedule's 1.9M under-fitted: 20.6 dB) with more steps, surfels and view dependence for a GPU's step rate
    # (gsplat's render_distort is another definition than 2DGS's distortion: off there)
    "cuda": TrainConfig(preset="cuda", backend="gsplat", iterations=8000, checkpoint_every=2000, distortion_weight=0.0,
                        init=InitOptions(sh_degree=1, max_surfels=500_000, max_actor_surfels=40_000),
                        densify=DensifyOptions(start=500, stop=4000, max_surfels=1_000_000)),
}


def preset(name: str, **overrides) -> TrainConfig:
    if name not in PRESETS:
        raise InputError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    cfg = PRESETS[name]
    if name == "cpu" and BACKENDS["numba"].differentiable:
        cfg = dataclasses.replace(cfg, backend="numba")
    return dataclasses.replace(cfg, **overrides)


def scene_scale(views, points: np.ndarray) -> float:
    """The length that scales the means' learning rate and the split/prune sizes: gsplat's
    1.1 x the largest camera distance from the cameras' centroid, but at least the median
    distance from that centroid to ``points`` (the initial background): a log whose ego barely
    moves (stop-and-go traffic) still sees a street tens of metres deep. At least 1 m."""
    c = np.stack([v.T_world_camera[:3, 3] for v in views])
    centre = c.mean(0)
    spread = 1.1 * float(np.linalg.norm(c - centre, axis=1).max())
    depth = float(np.median(np.linalg.norm(points - centre, axis=1))) if len(points) else 0.0
    return max(spread, depth, 1.0)


class _Run:
    """The state of one training run (everything a checkpoint holds)."""

    def __init__(self, cfg: TrainConfig, model: SceneModel, scale: float):
        self.cfg, self.model, self.scale = cfg, model.to(cfg.device), scale
        lrs = {"means": cfg.lr_means * scale, "quats": cfg.lr_quats, "log_scales": cfg.lr_scales,
               "logit_opacities": cfg.lr_opacities, "sh": cfg.lr_sh, "sky": cfg.lr_sky,
               **{f"affine/{c}": cfg.lr_affine for c in model.affine}, "features": cfg.lr_features,
               **{f"head/{k}": cfg.lr_head for k in model.head},
               **{f"pose/{i}": cfg.lr_actor_pose for i in model.pose_offsets},
               "view/rot": cfg.lr_view_rot, "view/trans": cfg.lr_view_trans}
        self.adam = Adam(lrs, sparse=[f"pose/{i}" for i in model.pose_offsets] + ["view/rot", "view/trans"])
        self.densifier = Densifier(cfg.densify, scale)
        self.rng = np.random.default_rng(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.step = 0
        self.time_share = 0.0  # of cfg.max_train_s spent (the training loop sets it)
        self.ground: Optional[GroundField] = None  # the road's height field (`start` fits it when cfg.road_weight)
        self.sky_fill: Optional[SkyFill] = None  # (`start`, with cfg.sky_fill and sky masks)
        self.reach: Optional[float] = None  # the LiDAR's range (`start` sets it): sky pixels hold nothing nearer
        self.neighbours: Dict[int, List[View]] = {}  # id(view) -> its neighbours (`start`, with cfg.multiview_weight)
        self._tensors: Dict[int, tuple] = {}  # id(view) -> (view, its arrays on the model's device)

    def tensors(self, view: View) -> Dict[str, torch.Tensor]:
        """The view's image, mask, ray directions and tables, LiDAR pixels and depths on the model's device,
        made once per view: a GPU step uploads nothing (the view is kept with them, so its id stays its own)."""
        got = self._tensors.get(id(view))
        if got is None:
            if len(self._tensors) >= 4096:  # a fine-tuning's pseudo views come and go: the oldest go first
                self._tensors.pop(next(iter(self._tensors)))
            on = lambda a: None if a is None else to_device(a, self.model.device)  # noqa: E731
            got = self._tensors[id(view)] = (view, {
                "image": on(view.image), "mask": on(view.mask), "dirs": on(view.dirs_world),
                "lidar_pix": on(view.lidar_pix), "lidar_depth": on(view.lidar_depth),
                "covered": on(view.lidar_covered()), "rays": on(view.camera.ray_table().astype(np.float32)),
                "ray_len": on(np.sqrt(1 + np.nan_to_num(view.camera.ray_table() ** 2).sum(-1)).astype(np.float32)),
                "sky": on(view.sky)})
        return got[1]

    def state(self) -> dict:
        return {"config": self.cfg.to_dict(), "scale": self.scale, "step": self.step, "model": self.model.state_dict(),
                "adam": self.adam.state_dict(), "densify": (self.densifier.grad_sum.cpu(), self.densifier.count.cpu()),
                "rng": self.rng.bit_generator.state, "gen": self.gen.get_state()}

    def restore(self, st: dict) -> None:
        self.adam.load_state_dict(st["adam"], self.cfg.device)
        self.densifier.grad_sum, self.densifier.count = (t.to(self.cfg.device) for t in st["densify"])
        self.rng.bit_generator.state = st["rng"]
        self.gen.set_state(st["gen"])
        self.step = int(st["step"])

    def save(self, out: Path) -> None:
        checkpoint.write(out / CHECKPOINT, KIND, *_flatten(self.state()))


def _flatten(st: dict) -> Tuple[Dict[str, torch.Tensor], dict]:
    """A `_Run.state` as named tensors and a JSON object (`load_state` reads them back). A trainable tensor is
    named as the optimiser names it, after "model/": its moments are "adam/m/" and "adam/v/" + that name."""
    m, adam = st["model"], st["adam"]
    tensors = {**{f"model/{k}": v for k, v in m["params"].items()}, "model/owner": m["owner"], "model/sky": m["sky"],
               **{f"model/affine/{c}": a for c, a in m["affine"].items()},
               **{f"model/head/{k}": v for k, v in m["head"].items()},
               **{f"model/pose/{i}": v for i, v in m["pose_offsets"].items()},
               **{f"model/pose_knots/{i}": torch.from_numpy(k) for i, k in m["pose_knots"].items()},
               "model/view_knots": torch.from_numpy(m["view_knots"][0]),
               "model/view_centres": torch.from_numpy(m["view_knots"][1]),
               **{f"model/view/{k}": v for k, v in m["view_offsets"].items()},
               **{f"adam/{s}/{k}": v for s in "mv" for k, v in adam[s].items()},
               "densify/grad_sum": st["densify"][0], "densify/count": st["densify"][1], "rng/torch": st["gen"]}
    meta = {"config": st["config"], "scale": st["scale"], "step": st["step"], "track_ids": m["track_ids"],
            "cameras": list(m["affine"]), "rng": st["rng"],
            "adam": {"step": adam["step"], "lrs": adam["lrs"], "moments": list(adam["m"])}}
    return tensors, meta


def _spec(v):
    """The form (`gsim.scenes.reconstruction.checkpoint.Checkpoint.field`) of a JSON value like ``v``."""
    return {k: _spec(x) for k, x in v.items()} if isinstance(v, dict) else type(v)


_CONFIG_SPEC = {**_spec(TrainConfig().to_dict()), "train_span": (None, [float]), "max_train_s": (None, float)}
_PARAM_SHAPES = {"means": (3,), "quats": (4,), "log_scales": (2,), "logit_opacities": (), "sh": (None, 3),
                 "features": (FEATURES,)}
LEGACY_ADVICE = ("If you trust where it came from, convert it once with "
                 "gsim.scenes.reconstruction.train.convert_legacy_checkpoint({path}, trust_pickle=True), which writes checkpoint.safetensors beside it; else train again without "
                 "--resume.")


def load_state(path) -> dict:
    """A reconstruction checkpoint (`_Run.save`), checked against the layout `_flatten` writes (names, dtypes,
    shapes, finite values, JSON fields), as `_Run.state` gives it; else an `InputError` naming the file and field."""
    ck = checkpoint.read(path, KIND, LEGACY_ADVICE)
    f32 = torch.float32
    if isinstance(ck.meta.get("config"), dict):  # a checkpoint from before the time budget had none
        ck.meta["config"].setdefault("max_train_s", None)
        ck.meta["config"].setdefault("sky_weight", 0.0)  # nor the sky masks
        ck.meta["config"].setdefault("road_weight", 0.0)  # nor the road's surface
        ck.meta["config"].setdefault("lidar_free_weight", 0.0)  # nor the empty LiDAR rays
        ck.meta["config"].setdefault("multiview_weight", 0.0)  # nor the neighbouring views
        ck.meta["config"].setdefault("opacity_weight", 0.0)  # nor the opacities' entropy
        if isinstance(ck.meta["config"].get("init"), dict):  # nor the seeds beyond the LiDAR's reach
            ck.meta["config"]["init"].setdefault("far_range", 0.0)
            ck.meta["config"]["init"].setdefault("far_voxel_m", InitOptions.far_voxel_m)
    config = ck.field("config", _CONFIG_SPEC)
    try:
        TrainConfig.from_dict(config)
    except InputError as e:
        raise ck.error("config", str(e)) from None
    track_ids, cameras = ck.field("track_ids", [str]), ck.field("cameras", [str])
    for name, ids in (("track_ids", track_ids), ("cameras", cameras)):
        if len(set(ids)) != len(ids):
            raise ck.error(name, f"expected distinct names, got {ids}")
    n = len(ck.tensor("model/means", f32, (None, 3)))
    params = {k: ck.tensor(f"model/{k}", f32, (n,) + shape) for k, shape in _PARAM_SHAPES.items()}
    if params["sh"].shape[1] not in (1, 4, 9, 16):
        raise ck.error("model/sh", f"expected 1, 4, 9 or 16 coefficients (degree 0-3), got {params['sh'].shape[1]}")
    owner = ck.tensor("model/owner", torch.int64, (n,))
    if n and not (int(owner.min()) >= -1 and int(owner.max()) < len(track_ids)):
        raise ck.error("model/owner", f"expected -1 (background) or an index of track_ids (< {len(track_ids)})")
    head = LidarHead.initial()
    trainable = {**params, "sky": ck.tensor("model/sky", f32, SKY_SHAPE + (3,)),
                 **{f"affine/{c}": ck.tensor(f"model/affine/{c}", f32, IDENTITY_AFFINE.shape) for c in cameras},
                 **{f"head/{k}": ck.tensor(f"model/head/{k}", f32, getattr(head, k).shape) for k in WEIGHTS},
                 **{f"pose/{i}": ck.tensor(f"model/pose/{i}", f32, (None, 4)) for i in track_ids}}
    knots = {i: ck.tensor(f"model/pose_knots/{i}", torch.int64, (len(trainable[f"pose/{i}"]),)).numpy()
             for i in track_ids}
    times = ck.tensor("model/view_knots", torch.int64, (None,))
    centres = ck.tensor("model/view_centres", torch.float64, (len(times), 3))
    trainable.update({f"view/{k}": ck.tensor(f"model/view/{k}", f32, (len(times), 3)) for k in ("rot", "trans")})
    adam = ck.field("adam", {"step": int, "lrs": {str: float}, "moments": [str]})
    unknown = [k for k in adam["moments"] if k not in trainable]
    if unknown:
        raise ck.error("adam.moments", f"{unknown[:3]} are not trainable tensors of this model")
    moments = {s: {k: ck.tensor(f"adam/{s}/{k}", f32, tuple(trainable[k].shape)) for k in adam["moments"]}
               for s in "mv"}
    grad_sum = ck.tensor("densify/grad_sum", f32, (None,))
    state = {"config": config, "scale": ck.field("scale", float), "step": ck.field("step", int),
             "model": {"params": params, "owner": owner, "track_ids": track_ids, "sky": trainable["sky"],
                       "affine": {c: trainable[f"affine/{c}"] for c in cameras},
                       "head": {k: trainable[f"head/{k}"] for k in WEIGHTS},
                       "pose_offsets": {i: trainable[f"pose/{i}"] for i in track_ids}, "pose_knots": knots,
                       "view_knots": (times.numpy(), centres.numpy()),
                       "view_offsets": {k: trainable[f"view/{k}"] for k in ("rot", "trans")}},
             "adam": {**moments, "step": adam["step"], "lrs": adam["lrs"]},
             "densify": (grad_sum, ck.tensor("densify/count", f32, tuple(grad_sum.shape))),
             "rng": ck.numpy_rng("rng"), "gen": ck.torch_rng("rng/torch")}
    ck.done()
    return state


def convert_legacy_checkpoint(path, trust_pickle: bool = False) -> Path:
    """Rewrite a reconstruction checkpoint of the old format (``checkpoint.pt``, a torch pickle) as
    ``checkpoint.safetensors`` beside it, which ``gsim reconstruct --resume`` and ``gsim expand`` read; returns its
    path. An explicit opt-in, for a file whose source you trust (see `gsim.scenes.reconstruction.checkpoint.load_legacy`)."""
    path = Path(path)
    out = path.with_name(CHECKPOINT)
    if out.exists():
        raise InputError(f"{out}: exists already; refusing to replace it with a conversion of {path.name}")
    st = checkpoint.load_legacy(path, trust_pickle)
    try:  # the configuration with the defaults of fields added since (TrainConfig.from_dict)
        tensors, meta = _flatten({**st, "config": TrainConfig.from_dict(st["config"]).to_dict()})
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise InputError(f"{path}: not a reconstruction checkpoint this gsim can convert ({type(e).__name__}: "
                         f"{e})") from None
    checkpoint.write(out, KIND, tensors, meta)
    try:
        load_state(out)
    except InputError:
        out.unlink()
        raise
    return out


def _render(run: _Run, view: View, options: RenderOptions):
    """(frame, rgb): the view as the run's model renders it (its pose correction applied, the sky composed)."""
    model = run.model
    surfels = model.surfels_at(view.timestamp_us)
    if run.cfg.refines_views and not view.pose_corrected:
        surfels = model.corrected(surfels, view.timestamp_us)
    frame = render_camera(surfels, view.camera, view.T_world_camera, backend=run.cfg.backend, options=options)
    return frame, compose(frame.rgb, frame.alpha, Sky.derived(model.sky), run.tensors(view)["dirs"], model.affine[view.sensor])


def _multiview(run: _Run, view: View, frame) -> torch.Tensor:
    """`multiview.consistency` of the view's rendered depth with its neighbours' images, on the pixels it renders
    opaque that are neither sky nor transient."""
    vt = run.tensors(view)
    rays = vt["rays"]
    valid = (frame.alpha.detach() > 0.5) & torch.isfinite(rays).all(-1)
    if vt["sky"] is not None:
        valid &= vt["sky"] < 0.5
    if vt["mask"] is not None:
        valid &= vt["mask"] > 0.5
    others = [(run.tensors(n)["image"].mean(-1), n.camera, n.T_world_camera) for n in run.neighbours[id(view)]]
    return multiview.consistency(frame.depth, valid, torch.nan_to_num(rays), vt["image"], view.T_world_camera,
                                 others)


def view_loss(run: _Run, view: View) -> float:
    """The view's photometric loss as the run renders it now (no gradients, no LiDAR): what a fine-tuning's
    guard watches on real views (`gsim.diffusion.expand`)."""
    with torch.no_grad():
        _, rgb = _render(run, view, RenderOptions(surface_eps=run.cfg.surface_eps))
        vt = run.tensors(view)
        return float(losses.photometric(rgb, vt["image"], run.cfg.ssim_weight, vt["mask"]))


def train_step(run: _Run, view: View, sweeps: Dict[int, List[SweepRays]], log, robust: bool = False,
               weight: float = 1.0, sync: bool = True):
    """One iteration on one view (and LiDAR rays of its frame's sweeps); returns (loss, psnr). ``robust``:
    outlier residuals leave the photometric loss (a log whose transients are not all known); ``weight``: of
    the view's camera losses (below 1 for views whose target is not a real image: `gsim.diffusion.expand`).
    ``sync`` False: no host synchronisation (a GPU runs ahead): (loss, MSE) come back as device tensors, and the
    caller checks the loss (`_settled`)."""
    cfg, model = run.cfg, run.model
    on = lambda a: to_device(a, model.device)  # noqa: E731
    vt = run.tensors(view)
    params = {**model.params, **model.extra_params()}
    geometry = run.step >= cfg.normal_from
    frame, rgb = _render(run, view, RenderOptions(distortion=bool(cfg.distortion_weight and geometry),
                                                  surface_eps=cfg.surface_eps))
    target, mask = vt["image"], vt["mask"]
    if robust and cfg.robust_k and run.step >= cfg.robust_from:
        # only where a sweep saw: above the LiDAR the residual is the seeds' guess being refined (dropping it
        # there kept crowns and a truck's top from ever being fitted: -1.4 dB on KITTI at downscale 4)
        keep = losses.robust_mask(rgb, target, cfg.robust_k, cfg.robust_floor,
                                  region=vt["covered"])
        mask = keep if mask is None else mask * keep
    loss = losses.photometric(rgb, target, cfg.ssim_weight, mask)
    if cfg.lidar_weight:
        loss = loss + cfg.lidar_weight * losses.lidar_depth(frame.depth, frame.alpha, vt["lidar_pix"],
                                                            vt["lidar_depth"])
    if cfg.sky_weight and vt["sky"] is not None:
        loss = loss + cfg.sky_weight * losses.sky_opacity(frame.alpha, vt["sky"], frame.depth * vt["ray_len"],
                                                          run.reach)
    if cfg.road_weight and run.ground is not None and run.step % ROAD_EVERY == 0:
        # every ROAD_EVERY-th step, weighted up: the term runs over every surfel (on a CPU a quarter of a step)
        p = model.params
        loss = loss + ROAD_EVERY * cfg.road_weight * road_loss(run.ground, p["means"], p["quats"], model.owner < 0,
                                                               GroundOptions.band_m)
    if cfg.normal_weight and geometry:
        loss = loss + cfg.normal_weight * losses.normal_consistency(frame.normal, frame.depth, frame.alpha, vt["rays"])
    if cfg.opacity_weight and geometry:
        loss = loss + cfg.opacity_weight * losses.opacity_entropy(model.params["logit_opacities"])
    if cfg.multiview_weight and geometry and run.neighbours.get(id(view)):
        loss = loss + cfg.multiview_weight * _multiview(run, view, frame)
    if frame.distortion is not None:
        loss = loss + cfg.distortion_weight * frame.distortion.mean()
    loss = weight * loss
    lidar_step = bool(sweeps.get(view.frame)) and run.step % cfg.lidar_every == 0
    if lidar_step:
        frame_sweeps = sweeps[view.frame]
        rays = frame_sweeps[int(run.rng.integers(len(frame_sweeps)))]
        rays = rays.subset(run.rng.choice(len(rays.range), min(cfg.lidar_rays, len(rays.range)), replace=False))
        out = render_rays(model, log, rays)
        rng_l, int_l, drop_l = losses.lidar_rays(out, on(rays.range), on(rays.intensity))
        loss = (loss + cfg.lidar_range_weight * rng_l + cfg.lidar_intensity_weight * int_l
                + cfg.lidar_drop_weight * drop_l)
        if cfg.lidar_free_weight:
            loss = loss + cfg.lidar_free_weight * losses.free_space(out["near_alpha"], on(rays.free()))
    if sync and not torch.isfinite(loss):
        # the model's surfels skip Surfels' value checks (a tenth of a step): this one catches a diverged run
        raise _diverged(float(loss.detach()), run.step, view)
    loss.backward()
    with torch.no_grad():
        grad = model.params["means"].grad
        # densification reads the camera's screen-space gradient: a step with LiDAR rays mixes in theirs
        if grad is not None and not lidar_step:
            cam = to_device(view.T_world_camera[:3, 3], model.device, torch.float32)
            depth = (model.params["means"] - cam).norm(dim=-1)
            run.densifier.accumulate(grad, depth, float(view.camera.fx), view.camera.width)
    # past the schedule's end (fine-tuning a finished run: `gsim.diffusion.expand`) the rates stay where it ended
    decay = 0.01 ** min(max(run.step / max(cfg.iterations, 1), run.time_share), 1.0)
    run.adam.step(params, {"means": decay, "view/rot": decay, "view/trans": decay,
                           **{f"pose/{i}": decay for i in model.pose_offsets}})
    if run.sky_fill is not None:
        run.sky_fill.apply(model.sky)
    if not sync:
        return loss.detach(), ((rgb.detach().clamp(0, 1) - target) ** 2).mean()
    return float(loss.detach()), losses.psnr(rgb.detach().clamp(0, 1), target)


def _diverged(loss: float, step: int, view: View) -> Diverged:
    return Diverged(f"reconstruct: the loss is {loss} at step {step} (view of frame {view.frame}, {view.sensor}): "
                    f"training diverged; the checkpoint written before is the last good one (lower a learning rate "
                    f"and --resume)")


SYNC_EVERY = 16  # a GPU run reads its losses back (and checks them) every this many steps and before a checkpoint


def _settled(pending: list) -> List[float]:
    """The PSNRs of unsynchronised steps [(step, view, loss, mse)] (one copy to the host), after checking their
    losses: `Diverged` names the first non-finite one (its checkpoint is not written)."""
    values = torch.stack([torch.stack([loss, mse]) for _, _, loss, mse in pending]).tolist()
    for (step, view, _, _), (loss, _) in zip(pending, values):
        if not math.isfinite(loss):
            raise _diverged(loss, step, view)
    pending.clear()
    return [10 * math.log10(1.0 / max(mse, 1e-12)) for _, mse in values]


def snapshot(run: _Run) -> dict:
    """A copy of the run's state that later steps leave alone (`resumed` continues from it)."""
    return copy.deepcopy(run.state())


def resumed(cfg: TrainConfig, state: dict, log) -> _Run:
    """The run that ``state`` (a checkpoint's or a `snapshot`) holds, on ``log`` (its actor tracks and cameras)."""
    run = _Run(cfg, SceneModel.from_state(state["model"], log.actors, list(log.cameras)), state["scale"])
    run.restore(state)
    return run


def lidar_sweeps(log, frames, cfg: TrainConfig, ignored: Ignored = {}) -> Dict[int, List[SweepRays]]:
    """Per training frame, its sweeps as rays (a fixed random subset of each; none for ``ignored`` points):
    empty without LiDAR or with cfg.lidar_rays = 0."""
    if not cfg.lidar_rays:
        return {}
    rng = np.random.default_rng(cfg.seed + 1)
    out = {}
    for f in frames:
        for obs in f.lidars.values():
            r = sweep_rays(log, obs, ignored.get(obs.points))
            keep = np.sort(rng.choice(len(r.range), min(cfg.lidar_rays_per_sweep, len(r.range)), replace=False))
            out.setdefault(f.index, []).append(r.subset(keep))
    return out


@dataclass(frozen=True, eq=False)
class Training:
    """What a run trains on: the log (with the movers found as its actors), its training frames,
    their views and LiDAR rays, and the run; ``robust``: the log had no tracks and movers were looked for."""

    log: object
    frames: list
    views: List[View]
    sweeps: Dict[int, List[SweepRays]]
    run: _Run
    robust: bool


def start(log_path, cfg: TrainConfig, state: Optional[dict] = None, progress: bool = False,
          out: Optional[Path] = None) -> Training:
    """Load the log, find its movers (written to OUT/movers.json and OUT/movers/ when ``out`` is given),
    make the views and rays, and start a run (from ``state``, a checkpoint, when given)."""
    if cfg.surface_eps:
        RenderOptions(surface_eps=cfg.surface_eps)  # (a bad value is named)
        if cfg.backend == "gsplat":
            raise InputError("TrainConfig.surface_eps: gsplat composites surfels by their centres' depth only; "
                             "train with the cpu preset (numba) to composite surfaces")
    if cfg.backend != "torch":  # (a resumed checkpoint's, too: one trained with gsplat on a CPU machine)
        reason = BACKENDS[cfg.backend].probe() if cfg.backend in BACKENDS else f"unknown backend {cfg.backend!r}"
        if reason is not None:
            raise Unavailable(f"preset {cfg.preset!r} needs the {cfg.backend} backend, which is not available "
                              f"here: {reason}")
    log = load_log(log_path)
    train_frames, _ = split_frames(log, cfg.holdout_every)
    if cfg.train_span is not None:
        n = len(train_frames)
        train_frames = train_frames[int(round(cfg.train_span[0] * n)):max(int(round(cfg.train_span[1] * n)), 1)]
    if not any(f.cameras for f in train_frames):  # a LiDAR-only log (e.g. Argoverse 2's public samples)
        raise InputError(f"{log_path}: no camera images to train on (the log has "
                         f"{'no cameras' if not log.cameras else 'none in its training frames'}): reconstruction "
                         f"fits the scene to camera images, the LiDAR adds depth to them")
    ignored, found = {}, cfg.movers and not log.actors and any(f.lidars for f in train_frames)
    if found:
        # the same frames give the same movers, so a resumed run finds the tracks its checkpoint names
        movers = detect_movers(log, train_frames, progress=progress)
        if out is not None:
            write_json(out / "movers.json", movers.summary())
            write_pictures(log, train_frames, movers, out / "movers")
        log, ignored = dataclasses.replace(log, actors=movers.tracks), movers.ignored
    views = make_views(log, train_frames, cfg.downscale, progress=progress, ignored=ignored)
    if cfg.sky_weight:
        views = [dataclasses.replace(v, sky=m) for v, m in
                 zip(views, sky_masks(views, empty_directions(log, train_frames)))]
    sweeps = lidar_sweeps(log, train_frames, cfg, ignored)
    if state is None:
        sky = {(v.frame, v.sensor): v.sky for v in views if v.sky is not None}
        bg, actors = initial_surfels(log, train_frames, cfg.init, progress=progress, ignored=ignored,
                                     sky=SkyPixels(sky, cfg.downscale))
        centres = np.stack([v.T_world_camera[:3, 3] for v in views]) if cfg.refines_views else None
        run = _Run(cfg, SceneModel.from_surfels(bg, actors, log.actors, sorted(log.cameras),
                                                [v.timestamp_us for v in views], view_centres=centres),
                   scene_scale(views, bg.means))
    else:
        run = resumed(cfg, state, log)
    if cfg.road_weight:
        run.ground = GroundField.fit(log, train_frames, ignored=ignored)
    run.reach = lidar_reach(log)
    if cfg.sky_fill:
        run.sky_fill = SkyFill.of(views, tuple(run.model.sky.shape[:2]), run.model.device)
    if cfg.multiview_weight:
        run.neighbours = {id(views[i]): [views[j] for j in nb] for i, nb in multiview.neighbours(views).items()}
    return Training(log, train_frames, views, sweeps, run, bool(found))


def reconstruct(log_path, out, config: Optional[TrainConfig] = None, resume: bool = False,
                progress: bool = True) -> Path:
    """Train on the log's training frames and write the scene to OUT/scene (and OUT/train.json)."""
    cfg = config or preset("cpu")
    out = Path(out)
    state = None
    if resume:
        found = checkpoint.find(out)
        if found is None:
            raise InputError(f"{out / CHECKPOINT}: no checkpoint to resume from")
        state = load_state(found)
        cfg = TrainConfig.from_dict(state["config"])  # a resumed run keeps its own configuration
    if cfg.backend == "numba":  # the cache's kernels, not this process's own compile: the same bits every run
        kernel_cache.prime(progress)
    torch.manual_seed(cfg.seed)
    out.mkdir(parents=True, exist_ok=True)
    t = start(log_path, cfg, state, progress, out)
    run = t.run
    from tqdm import tqdm
    first_step = run.step  # > 0: resumed from a checkpoint
    bar = tqdm(total=cfg.iterations, initial=run.step, desc="reconstruct", unit="it", disable=not progress)
    t0, psnrs, budget = time.perf_counter(), [], cfg.max_train_s
    sync, pending = run.model.device.type == "cpu", []  # (a CPU's step waits for its maths anyway)
    while run.step < cfg.iterations:
        if budget is not None:
            run.time_share = (time.perf_counter() - t0) / budget
            if run.time_share >= 1:
                psnrs += _settled(pending) if pending else []
                run.save(out)
                break
        view = t.views[int(run.rng.integers(len(t.views)))]
        loss, p = train_step(run, view, t.sweeps, t.log, robust=t.robust, sync=sync)
        if sync:
            psnrs.append(p)
        else:
            pending.append((run.step, view, loss, p))
        run.step += 1
        run.densifier.step(run.model, run.adam, run.step, run.gen)
        save = run.step % cfg.checkpoint_every == 0 or run.step == cfg.iterations
        if pending and (save or len(pending) >= SYNC_EVERY):
            psnrs += _settled(pending)
        if save:
            run.save(out)
        bar.update(1)
        if sync or not pending:
            psnrs = psnrs[-50:]
            bar.set_postfix(psnr=f"{np.mean(psnrs):.2f}", surfels=len(run.model))
    bar.close()
    dataclasses.replace(run.model.to_scene(bool(t.sweeps), cfg.surface_eps), train_downscale=cfg.downscale).save(
        out / "scene")
    write_json(out / "train.json", {"log": str(Path(log_path).resolve()), "config": cfg.to_dict(),
                                    "iterations": cfg.iterations, "resumed_at_step": first_step, "steps": run.step,
                                    "stopped_by_time_budget": run.step < cfg.iterations,
                                    "surfels": len(run.model),
                                    "wall_s_this_session": round(time.perf_counter() - t0, 2),
                                    "train_frames": [f.index for f in t.frames],
                                    "movers_detected": t.robust})
    return out / "scene"
