"""The repair model: a small conditional diffusion model, built from diffusers' components, that turns a
render of a view (rgb, alpha, depth) into the image the camera would have taken.

Difix-style: the model predicts the clean image from a noised image and the render; training draws the noise
level at random (a denoising diffusion objective), repair starts from the render itself noised to a fixed
level ``repair_t`` and takes one network pass, so a repair costs one UNet evaluation. Images are in [-1, 1]
(pixel space: the renders are small and the model must run on 2 CPU cores); the condition is the render's
rgb, its alpha and its inverse depth (``depth_scale_m / depth``, 0 where nothing was hit), and with
``references`` > 0 that many real training images warped into the view (`gsim.diffusion.references`), each with
where it is valid, so the model can copy real texture where a reference saw the surface.

A model directory is diffusers' format: ``unet/`` (UNet2DModel), ``scheduler/`` (DDPMScheduler) and
``gsim_repair.json`` (this module's settings), plus ``README.md`` (the model card, `gsim.diffusion.train`)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from gsim.config import Config
from gsim.errors import InputError, Unavailable
from gsim.io import atomic_directory, read_manifest

CONDITION_CHANNELS = 5  # rgb, alpha, inverse depth
REFERENCE_CHANNELS = 4  # per reference: its rgb (0 where not valid) and its valid mask
SETTINGS = "gsim_repair.json"


def repair_device(name: str = "auto") -> torch.device:
    """Where a repair model runs: "cpu", "cuda" (refused where torch finds no CUDA) or "auto" (CUDA where there is
    one, else the CPU)."""
    if name not in ("auto", "cpu", "cuda"):
        raise InputError(f"device: expected 'auto', 'cpu' or 'cuda', got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise Unavailable("device 'cuda': CUDA is not available here (torch.cuda.is_available() is False); use "
                          "'cpu' or 'auto'")
    return torch.device("cuda" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu")


@dataclass(frozen=True)
class RepairConfig(Config):
    """channels: the UNet's widths per level (each level halves the resolution: image sides must divide by
    2^(levels-1)); train_timesteps: the noise schedule's length; repair_t: the noise level repair starts from
    (of train_timesteps); depth_scale_m: the condition's inverse-depth scale; residual: see the field;
    references: the reference slots the UNet takes (0: the render alone; model directories written before the
    field load as 0); reference_depth: what the references are warped through (see the field); train_input: what
    the UNet is trained to denoise (see the field)."""

    channels: Tuple[int, ...] = (32, 64, 64, 128)
    layers_per_block: int = 1
    train_timesteps: int = 1000
    repair_t: int = 200
    depth_scale_m: float = 5.0
    residual: bool = True  # the UNet predicts the correction to the render (a fresh model leaves renders as they are)
    loss: str = "l1"  # "l1" or "l2" (the mean correction: L1's gradients cancel where corrections disagree in sign)
    references: int = 0
    # "render": the reconstruction's rendered depth (models written before the field), which carries its errors off
    # the path into the warps; "lidar": the log's LiDAR (`LidarDepth` of its training frames; a log without LiDAR:
    # the render's depth), measured the same from every pose
    reference_depth: str = "render"
    # "render": the render noised to repair_t, exactly what `repair` gives it (a one-step restoration, as Difix3D's):
    # the correction must come from the render and the condition. "real": the real image noised to a random level
    # (DDPM's objective; models written before the field): at repair_t that input shows the real image through
    # the noise, so the UNet learns to copy it and, given a render at repair time, returns the render.
    train_input: str = "render"

    def __post_init__(self):
        object.__setattr__(self, "channels", tuple(int(c) for c in self.channels))
        if not self.channels or any(c < 8 or c % 8 for c in self.channels):
            raise InputError(f"RepairConfig.channels: expected widths that are multiples of 8, got {self.channels}")
        if not (isinstance(self.depth_scale_m, (int, float)) and math.isfinite(self.depth_scale_m)
                and self.depth_scale_m > 0):
            raise InputError(f"RepairConfig.depth_scale_m: expected a finite number > 0, got {self.depth_scale_m!r}")
        if not isinstance(self.references, int) or isinstance(self.references, bool) or self.references < 0:
            raise InputError(f"RepairConfig.references: expected an integer >= 0, got {self.references!r}")
        if self.reference_depth not in ("render", "lidar"):
            raise InputError(f"RepairConfig.reference_depth: expected 'render' or 'lidar', got "
                             f"{self.reference_depth!r}")
        if self.train_input not in ("render", "real"):
            raise InputError(f"RepairConfig.train_input: expected 'render' or 'real', got {self.train_input!r}")
        if self.loss not in ("l1", "l2"):
            raise InputError(f"RepairConfig.loss: expected 'l1' or 'l2', got {self.loss!r}")
        if not 0 < self.repair_t < self.train_timesteps:
            raise InputError(f"RepairConfig.repair_t: expected 0 < repair_t < train_timesteps "
                             f"({self.train_timesteps}), got {self.repair_t}")

    @property
    def multiple(self) -> int:
        """Image sides must be multiples of this."""
        return 2 ** (len(self.channels) - 1)


class RepairModel:
    """``loss(real, rgb, alpha, depth)`` for training; ``repair(rgb, alpha, depth)`` in one pass. Arrays:
    rgb (B,3,H,W) in [0,1], alpha (B,1,H,W), depth (B,1,H,W) metres (torch, float32); ``references``
    (B,K,4,H,W): K warped real images, rgb in [0,1] and valid in {0,1} (`gsim.diffusion.references`), nearest
    first. A model with ``config.references`` slots given fewer references (or None) runs with the rest invalid."""

    def __init__(self, unet, scheduler, config: RepairConfig):
        self.unet, self.scheduler, self.config = unet, scheduler, config

    @property
    def device(self) -> torch.device:
        return self.unet.conv_out.weight.device

    def to(self, device) -> "RepairModel":
        """The model on ``device`` (e.g. "cuda"); `loss` and `repair` then take their tensors there, `repair_image`
        and `repair_view` move numpy in and out. The noise is drawn on the CPU: a seed gives the same noise anywhere.
        The weights go channels-last (a 640x360 repair on 2 CPU cores: 23% faster, BENCHMARKS.md)."""
        self.unet.to(device=device, memory_format=torch.channels_last)
        return self

    @classmethod
    def new(cls, config: RepairConfig = RepairConfig(), seed: int = 0) -> "RepairModel":
        from diffusers import DDPMScheduler, UNet2DModel
        torch.manual_seed(seed)
        n = len(config.channels)
        in_channels = 3 + CONDITION_CHANNELS + REFERENCE_CHANNELS * config.references
        unet = UNet2DModel(sample_size=None, in_channels=in_channels, out_channels=3,
                           block_out_channels=config.channels, down_block_types=("DownBlock2D",) * n,
                           up_block_types=("UpBlock2D",) * n, layers_per_block=config.layers_per_block,
                           norm_num_groups=8)
        scheduler = DDPMScheduler(num_train_timesteps=config.train_timesteps, prediction_type="sample",
                                  clip_sample=False)
        if config.residual:  # a zero correction to begin with (as ControlNet's zero convolutions)
            torch.nn.init.zeros_(unet.conv_out.weight)
            torch.nn.init.zeros_(unet.conv_out.bias)
        return cls(unet, scheduler, config)

    def condition(self, rgb, alpha, depth, references=None) -> torch.Tensor:
        inv = torch.where(depth > 0, self.config.depth_scale_m / depth.clamp_min(1e-3), torch.zeros_like(depth))
        return torch.cat([rgb * 2 - 1, alpha * 2 - 1, inv.clamp(0, 4) - 1, self._references(rgb, references)], 1)

    def _references(self, rgb, references) -> torch.Tensor:
        """(B, 4 x config.references, H, W): each slot's rgb in [-1,1] (0 where not valid, so an invalid pixel
        says nothing about colour) and its valid mask in {-1,1}; slots beyond the given references invalid."""
        B, _, H, W = rgb.shape
        k = self.config.references
        if references is None:
            references = rgb.new_zeros((B, 0, REFERENCE_CHANNELS, H, W))
        elif not k:
            raise InputError("references: this repair model takes none (RepairConfig.references = 0); train one with "
                             "`gsim diffusion train ... --references K` to repair with references")
        if references.ndim != 5 or references.shape[0] != B or references.shape[2] != REFERENCE_CHANNELS \
                or references.shape[3:] != (H, W) or references.shape[1] > k:
            raise InputError(f"references: expected (B,K,4,H,W) = ({B},<={k},4,{H},{W}) like rgb, got "
                             f"{tuple(references.shape)}")
        valid = references[:, :, 3:]
        slots = torch.cat([(references[:, :, :3] * 2 - 1) * valid, valid * 2 - 1], 2)
        missing = torch.cat([rgb.new_zeros((B, k - slots.shape[1], 3, H, W)),
                             rgb.new_full((B, k - slots.shape[1], 1, H, W), -1.0)], 2)
        return torch.cat([slots, missing], 1).reshape(B, REFERENCE_CHANNELS * k, H, W)

    def _check(self, rgb) -> None:
        m = self.config.multiple
        if rgb.ndim != 4 or rgb.shape[1] != 3 or rgb.shape[2] % m or rgb.shape[3] % m:
            raise InputError(f"repair model: expected rgb (B,3,H,W) with H and W multiples of {m}, got "
                             f"{tuple(rgb.shape)} (pad or crop the image)")

    def loss(self, real, rgb, alpha, depth, weight=None, generator=None, references=None) -> torch.Tensor:
        """The loss of predicting the real image, given the render (and ``references``), from the render noised to
        repair_t (train_input "render") or from the real image noised to a random level ("real").
        ``weight`` (B,1,H,W): per-pixel weights (None: all 1)."""
        self._check(rgb)
        x0 = real * 2 - 1
        noise = torch.randn(x0.shape, generator=generator).to(x0.device)
        if self.config.train_input == "render":
            t = torch.full((len(x0),), self.config.repair_t, dtype=torch.long, device=x0.device)
            xt = self.scheduler.add_noise(rgb * 2 - 1, noise, t)
        else:
            t = torch.randint(0, self.config.train_timesteps, (len(x0),), generator=generator).to(x0.device)
            xt = self.scheduler.add_noise(x0, noise, t)
        err = (self._predict(xt, t, rgb, alpha, depth, references) - x0).abs()
        err = err if self.config.loss == "l1" else err * err
        return err.mean() if weight is None else (err * weight).sum() / (weight.sum() * 3).clamp_min(1e-6)

    @torch.no_grad()
    def repair(self, rgb, alpha, depth, seed: int = 0, mask=None, references=None) -> torch.Tensor:
        """(B,3,H,W) in [0,1]: the render noised to ``repair_t`` and denoised in one pass, given the render (and
        ``references``).
        ``mask`` (B,1,H,W) in [0,1]: repair only there (harmonization): the noise goes only inside the mask
        (partial noising) and outside it the render is kept as it is; None: everywhere."""
        self._check(rgb)
        g = torch.Generator().manual_seed(seed)
        t = torch.full((len(rgb),), self.config.repair_t, dtype=torch.long, device=rgb.device)
        x = rgb * 2 - 1
        xt = self.scheduler.add_noise(x, torch.randn(rgb.shape, generator=g).to(rgb.device), t)
        if mask is not None:
            xt = mask * xt + (1 - mask) * x
        out = self._predict(xt, t, rgb, alpha, depth, references).clamp(-1, 1)
        if mask is not None:
            out = mask * out + (1 - mask) * x
        return ((out + 1) / 2).float()

    def _predict(self, xt, t, rgb, alpha, depth, references=None) -> torch.Tensor:
        """The clean image in [-1, 1] the UNet predicts from the noised one and the render."""
        out = self.unet(torch.cat([xt, self.condition(rgb, alpha, depth, references)], 1), t).sample
        return rgb * 2 - 1 + out if self.config.residual else out

    def repair_image(self, rgb: np.ndarray, alpha: np.ndarray, depth: np.ndarray, seed: int = 0,
                     mask: Optional[np.ndarray] = None, references: Optional[Sequence] = None) -> np.ndarray:
        """One (H,W,3) numpy render repaired (edge-padded to the UNet's multiple, then cropped back); ``mask``
        (H,W) in [0,1] as in `repair`; ``references``: [(warped (H,W,3) in [0,1], valid (H,W))] as
        `gsim.diffusion.references.references` returns them."""
        m = self.config.multiple
        H, W = rgb.shape[:2]
        ph, pw = -H % m, -W % m
        pad = lambda a: np.pad(a, ((0, ph), (0, pw)) + ((0, 0),) * (a.ndim - 2), mode="edge")  # noqa: E731
        t = lambda a: torch.from_numpy(np.ascontiguousarray(pad(a), np.float32)).reshape(1, H + ph, W + pw, -1) \
            .permute(0, 3, 1, 2).to(self.device)  # noqa: E731
        refs = None
        if references is not None:
            for i, (warped, valid) in enumerate(references):
                if np.shape(warped) != (H, W, 3) or np.shape(valid) != (H, W):
                    raise InputError(f"references[{i}]: expected (warped ({H},{W},3), valid ({H},{W})) like rgb, got "
                                     f"({np.shape(warped)}, {np.shape(valid)})")
            refs = torch.stack([t(np.concatenate([w, np.asarray(v, np.float32)[..., None]], -1))
                                for w, v in references], 1) if len(references) else None
        out = self.repair(t(rgb), t(alpha), t(depth), seed, None if mask is None else t(mask), refs)
        return out[0].permute(1, 2, 0).cpu().numpy()[:H, :W]

    def repair_view(self, scene, log, camera, T_world_target: np.ndarray, timestamp_us: int, rgb: np.ndarray,
                    alpha: np.ndarray, depth: np.ndarray, sensor: Optional[str] = None, seed: int = 0,
                    holdout_every: int = 8, downscale: Optional[int] = None, exclude: Sequence[int] = ()) -> np.ndarray:
        """`repair_image` of ``scene``'s render of a view of ``log`` (``camera`` at the log pose ``T_world_target``,
        ``timestamp_us``, ``sensor``) given its references: the ``config.references`` nearest training views' real
        images warped into it through the render's depth or the log's LiDAR (``config.reference_depth``;
        `gsim.diffusion.references.model_references`, with ``holdout_every``, ``downscale`` and the frame indices to
        ``exclude``); a model without reference slots, or no ``log``, repairs the render alone."""
        refs = None
        if self.config.references and log is not None:
            from .references import model_references
            refs = model_references(self.config, scene, log, camera, T_world_target, timestamp_us, alpha, depth,
                                    sensor=sensor, holdout_every=holdout_every, downscale=downscale, exclude=exclude)
        return self.repair_image(rgb, alpha, depth, seed, references=refs)

    def with_log(self, log) -> "LogReferences":
        """This model taking its references from ``log`` wherever a caller has no log of its own (gsim render)."""
        return LogReferences(self, log)

    def save(self, path, card: str = "", card_data: Optional[dict] = None) -> None:
        """Writes the model directory atomically (a crash leaves the previous one): the weights, the settings,
        the model card (README.md) and its numbers (card.json)."""
        with atomic_directory(path, SETTINGS) as tmp:
            self.unet.save_pretrained(tmp / "unet")
            self.scheduler.save_pretrained(tmp / "scheduler")
            (tmp / "README.md").write_text(card)
            if card_data is not None:
                (tmp / "card.json").write_text(json.dumps(card_data, indent=1))
            (tmp / SETTINGS).write_text(json.dumps(self.config.to_dict(), indent=1))

    @classmethod
    def load(cls, path, device: str = "cpu") -> "RepairModel":
        """A model directory `save` wrote, on ``device`` (`repair_device`'s names); clear errors for a missing or
        incomplete one."""
        where = repair_device(device)
        from diffusers import DDPMScheduler, UNet2DModel
        p = Path(path)
        if not (p / SETTINGS).exists():
            raise FileNotFoundError(f"{p}: no repair model here (no {SETTINGS}); train one with `gsim diffusion "
                                    f"train SCENE LOG --out {p}`")
        for sub in ("unet", "scheduler"):
            if not (p / sub).is_dir():
                raise FileNotFoundError(f"{p}: incomplete repair model: no {sub}/ folder")
        settings = read_manifest(p / SETTINGS, "repair model configuration", (RepairConfig.SCHEMA_VERSION,))
        from diffusers.utils import logging
        level = logging.get_verbosity()
        logging.set_verbosity_error()  # (diffusers advises installing accelerate on every load: not needed here)
        try:
            config = RepairConfig.from_dict({"train_input": "real", **settings})  # (older models: see the field)
            unet = UNet2DModel.from_pretrained(p / "unet", local_files_only=True, use_safetensors=True)  # (no pickle)
            scheduler = DDPMScheduler.from_pretrained(p / "scheduler", local_files_only=True)
        except (OSError, ValueError) as e:
            raise InputError(f"{p}: unreadable repair model ({type(e).__name__}: {e})") from None
        finally:
            logging.set_verbosity(level)
        expected = 3 + CONDITION_CHANNELS + REFERENCE_CHANNELS * config.references
        if unet.config.in_channels != expected:
            raise InputError(f"{p}: unreadable repair model: its UNet takes {unet.config.in_channels} channels, its "
                             f"{SETTINGS} ({config.references} references) {expected}")
        unet.eval()
        return cls(unet, scheduler, config).to(where)


class LogReferences:
    """A `RepairModel` whose `repair_view` takes its references from ``log`` when the caller gives none."""

    def __init__(self, model: RepairModel, log):
        self.model, self.log = model, log

    def repair_image(self, *args, **kwargs) -> np.ndarray:
        return self.model.repair_image(*args, **kwargs)

    def repair_view(self, scene, log, *args, **kwargs) -> np.ndarray:
        return self.model.repair_view(scene, self.log if log is None else log, *args, **kwargs)
