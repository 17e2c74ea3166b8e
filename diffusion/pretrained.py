"""Stable Diffusion weights from a local directory, never from the network.

gsim's diffusion stage (scene expansion, harmonization) runs a Stable Diffusion *inpainting* or
*img2img* pipeline, optionally guided by a depth ControlNet rendered from the scene. The weights
are whatever the user has on disk (``--pretrained DIR``, a directory in the diffusers layout, e.g.
one written by ``save_pretrained`` or a snapshot of an SD 1.x/2.x repository); gsim never downloads
anything: every diffusers/transformers call passes ``local_files_only=True``.

`load_pretrained` checks the directory itself before diffusers sees it, so a wrong path or a
half-copied snapshot fails with a `PretrainedError` naming the path and what is wrong instead of a
traceback from deep inside diffusers:

- the path is missing or not a directory; ``model_index.json`` is missing or not valid JSON;
- a component the pipeline needs (``vae``, ``text_encoder``, ``tokenizer``, ``unet``, ``scheduler``)
  is not listed, or its sub-folder is missing, has no config file, or (models) has no weights
  (``*.safetensors`` or ``*.bin``);
- the UNet does not fit the kind asked for (inpainting needs ``in_channels`` 9, img2img 4);
  ``kind="auto"`` picks the kind from the UNet (whatever ``_class_name`` says: a saved img2img or
  ControlNet pipeline may carry any SD 1.x/2.x class name);
- the ControlNet directory has no ``config.json`` or weights, or does not fit the UNet
  (``cross_attention_dim``, ``block_out_channels``, latent channels).

Whatever diffusers or transformers still raise while loading comes back as `PretrainedError`
(chained). The safety checker and feature extractor are never loaded (gsim edits camera images
of roads, and they would cost a second CLIP model).

Prompts are optional. gsim calls the pipeline with ``prompt_embeds`` (and
``negative_prompt_embeds``), e.g. the text encoder's embedding of an empty prompt computed once,
so the tokenizer only runs if a caller passes a text prompt (its folder must still be there:
the pipeline classes require one). SDXL directories (``text_encoder_2``) are refused.

`PretrainedRepair` wraps a loaded pipeline with the ``repair_image(rgb, alpha, depth, seed, mask)``
interface of gsim's own `gsim.diffusion.repair.RepairModel`, so callers can use either: an inpainting
model repaints the render's holes (or ``mask``), an img2img model re-renders the whole image at
``strength``; a ControlNet pipeline is guided by the render's inverse depth.
"""
from __future__ import annotations

import glob
import inspect
import json
import math
import os
from typing import Optional

import numpy as np
import torch
from gsim.errors import InputError, MissingExtra

__all__ = ["PretrainedError", "load_pretrained", "KINDS", "PretrainedRepair"]

KINDS = ("auto", "inpaint", "img2img")
UNET_CHANNELS = {"inpaint": 9, "img2img": 4}
# component -> (accepted config files, needs weights)
COMPONENTS = {
    "vae": (("config.json",), True),
    "text_encoder": (("config.json",), True),
    "tokenizer": (("tokenizer_config.json", "tokenizer.json", "vocab.json"), False),
    "unet": (("config.json",), True),
    "scheduler": (("scheduler_config.json",), False),
}
WEIGHTS = ("*.safetensors", "*.bin")
PIPELINES = {("inpaint", False): "StableDiffusionInpaintPipeline",
             ("img2img", False): "StableDiffusionImg2ImgPipeline",
             ("inpaint", True): "StableDiffusionControlNetInpaintPipeline",
             ("img2img", True): "StableDiffusionControlNetImg2ImgPipeline"}


class PretrainedError(InputError):
    """A pretrained directory that cannot be used; the message names the path and the problem."""


def _read_json(file: str, what: str) -> dict:
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PretrainedError(f"{file}: {what} is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise PretrainedError(f"{file}: {what} is not a JSON object")
    return data


def _has_weights(folder: str) -> bool:
    return any(glob.glob(os.path.join(folder, pattern)) for pattern in WEIGHTS)


def _model_config(folder: str, what: str) -> dict:
    """The config of a model folder (``config.json`` plus weights), checked."""
    config = os.path.join(folder, "config.json")
    if not os.path.isfile(config):
        raise PretrainedError(f"{folder}: {what} has no config.json")
    if not _has_weights(folder):
        raise PretrainedError(f"{folder}: {what} has no weights file (*.safetensors or *.bin)")
    return _read_json(config, f"the {what} config")


def _check_pipeline_dir(path: str) -> tuple[dict, dict]:
    """Validate a diffusers pipeline directory; returns (model_index, unet config)."""
    if not os.path.exists(path):
        raise PretrainedError(f"{path}: pretrained directory does not exist")
    if not os.path.isdir(path):
        raise PretrainedError(f"{path}: pretrained path is not a directory")
    index_file = os.path.join(path, "model_index.json")
    if not os.path.isfile(index_file):
        raise PretrainedError(f"{path}: no model_index.json (not a diffusers pipeline directory; "
                              "save one with `save_pretrained` or copy a full snapshot)")
    index = _read_json(index_file, "model_index.json")
    if "text_encoder_2" in index or "XL" in str(index.get("_class_name", "")):
        raise PretrainedError(f"{path}: {index.get('_class_name', 'SDXL')} is not supported "
                              "(needs a Stable Diffusion 1.x/2.x pipeline)")
    for name, (configs, needs_weights) in COMPONENTS.items():
        entry = index.get(name)
        if not isinstance(entry, list) or not entry or entry[0] is None:
            raise PretrainedError(f"{path}: model_index.json does not list the component '{name}'")
        folder = os.path.join(path, name)
        if not os.path.isdir(folder):
            raise PretrainedError(f"{path}: component '{name}' is listed in model_index.json "
                                  f"but its folder {folder} is missing")
        if not any(os.path.isfile(os.path.join(folder, c)) for c in configs):
            raise PretrainedError(f"{folder}: component '{name}' has no config file ({' or '.join(configs)})")
        if needs_weights and not _has_weights(folder):
            raise PretrainedError(f"{folder}: component '{name}' has no weights file (*.safetensors or *.bin)")
    unet = _read_json(os.path.join(path, "unet", "config.json"), "the unet config")
    return index, unet


def _resolve_kind(path: str, kind: str, index: dict, unet: dict) -> str:
    if kind not in KINDS:
        raise PretrainedError(f"{path}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
    channels = unet.get("in_channels")
    found = next((k for k, c in UNET_CHANNELS.items() if c == channels), None)
    if found is None:
        name = index.get("_class_name", "pipeline")
        raise PretrainedError(f"{path}: the UNet of this {name} has in_channels={channels}; "
                              "gsim needs 9 (inpainting) or 4 (img2img)")
    if kind == "auto":
        return found
    if kind != found:
        raise PretrainedError(f"{path}: kind {kind!r} needs a UNet with in_channels={UNET_CHANNELS[kind]}, "
                              f"this one has in_channels={channels} (a {found} model)")
    return kind


def _check_controlnet(controlnet: str, unet: dict) -> None:
    if not os.path.isdir(controlnet):
        raise PretrainedError(f"{controlnet}: ControlNet directory does not exist or is not a directory")
    config = _model_config(controlnet, "ControlNet")
    latent = unet.get("out_channels", 4)
    checks = (("cross_attention_dim", config.get("cross_attention_dim"), unet.get("cross_attention_dim")),
              ("block_out_channels", config.get("block_out_channels"), unet.get("block_out_channels")),
              ("in_channels", config.get("in_channels"), latent))
    for key, got, want in checks:
        if got is not None and want is not None and _as_list(got) != _as_list(want):
            raise PretrainedError(f"{controlnet}: ControlNet {key}={got} does not match the UNet's {want}")


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def load_pretrained(path, kind: str = "auto", controlnet=None, dtype: torch.dtype = torch.float32, device="cpu"):
    """Load a Stable Diffusion inpainting or img2img pipeline from the local directory ``path``.

    ``kind``: "inpaint", "img2img" or "auto" (from the UNet's ``in_channels``: 9 inpainting, 4 img2img).
    ``controlnet``: None or the local directory of a ``ControlNetModel`` (a depth ControlNet); then the
    ControlNet variant of the pipeline is returned. Raises `PretrainedError` for anything unusable.
    """
    path = os.fspath(path)
    index, unet = _check_pipeline_dir(path)
    kind = _resolve_kind(path, kind, index, unet)
    if controlnet is not None:
        controlnet = os.fspath(controlnet)
        _check_controlnet(controlnet, unet)
    try:
        import diffusers
    except ImportError as e:  # pragma: no cover - the extra is missing
        raise MissingExtra("loading pretrained weights needs the diffusion extra: pip install 'gsim[diffusion]'") from e

    # safetensors only: a folder someone sent must not be unpickled (diffusers would torch.load a .bin, whose
    # weights_only guard older torch releases could be talked around)
    common = dict(local_files_only=True, dtype=dtype, use_safetensors=True)
    extra = {}
    if controlnet is not None:
        try:
            extra["controlnet"] = diffusers.ControlNetModel.from_pretrained(controlnet, **common)
        except Exception as e:
            raise PretrainedError(f"{controlnet}: could not load the ControlNet: {type(e).__name__}: {e}") from e
    cls = getattr(diffusers, PIPELINES[kind, controlnet is not None])
    try:
        pipe = cls.from_pretrained(path, safety_checker=None, feature_extractor=None, requires_safety_checker=False,
                                   **extra, **common).to(device)
    except Exception as e:
        raise PretrainedError(f"{path}: could not load the {kind} pipeline: {type(e).__name__}: {e}") from e
    pipe.set_progress_bar_config(disable=True)
    return pipe


class PretrainedRepair:
    """A pipeline from `load_pretrained` behind `RepairModel.repair_image`'s interface.

    ``repair_image(rgb, alpha, depth, seed=0, mask=None)``: rgb (H,W,3) in [0,1], alpha (H,W) render
    opacity, depth (H,W) metres (0 where nothing was hit), mask (H,W) in [0,1] or None; returns (H,W,3)
    float32 in [0,1]. The pipeline runs without a text prompt (the empty prompt's embedding, computed
    once) for ``int(steps * strength)`` denoising steps, seeded by ``seed``.

    - Inpainting pipelines repaint ``mask``, or when it is None the holes the render never filled
      (alpha < 0.5, dilated by 2 px). If that region is empty the render is returned unchanged and
      the pipeline is not run.
    - img2img pipelines re-render the whole image at ``strength``.
    - A region repair (``mask`` given, either kind, or an inpainting pipeline's holes) is defined as
      ``region * repaired + (1 - region) * rgb``: outside the region the render is kept exactly, as
      `RepairModel` does (an all-zero mask returns the render without running the pipeline).
    - ControlNet pipelines get the render's inverse depth as the control image (see `depth_control`).
    """

    def __init__(self, pipe, strength: float = 0.35, steps: int = 20):
        if not 0 < strength <= 1:
            raise InputError(f"PretrainedRepair: strength must be in (0, 1], got {strength}")
        if int(steps) != steps or steps < 1:
            raise InputError(f"PretrainedRepair: steps must be an integer >= 1, got {steps}")
        if int(steps * strength) < 1:  # diffusers runs int(steps * strength) steps and refuses 0
            raise InputError(f"PretrainedRepair: steps * strength must be >= 1 (the pipeline runs "
                             f"int(steps * strength) steps), got steps={steps}, strength={strength}")
        self.pipe, self.strength, self.steps = pipe, float(strength), int(steps)
        self.inpaint = pipe.unet.config.in_channels == UNET_CHANNELS["inpaint"]
        self.controlnet = getattr(pipe, "controlnet", None) is not None
        self._sized = "height" in inspect.signature(pipe.__call__).parameters  # plain img2img takes no size
        with torch.no_grad():
            self.prompt_embeds, _ = pipe.encode_prompt("", pipe._execution_device, 1, False)

    @classmethod
    def from_dir(cls, path, controlnet=None, kind: str = "auto", strength: float = 0.35, steps: int = 20,
                 device="cpu") -> "PretrainedRepair":
        """`load_pretrained` (float32) wrapped; raises `PretrainedError` for unusable directories."""
        return cls(load_pretrained(path, kind=kind, controlnet=controlnet, device=device), strength, steps)

    @staticmethod
    def depth_control(depth: np.ndarray) -> np.ndarray:
        """(H,W,3) in [0,1]: inverse depth over its maximum on hit pixels (near bright, far dark, 0 where
        nothing was hit), the MiDaS/DPT-style maps SD depth ControlNets are trained on."""
        hit = depth > 0
        inv = np.where(hit, 1.0 / np.where(hit, depth, 1.0), 0.0)
        inv = inv / inv.max() if hit.any() else inv
        return np.repeat(inv[..., None], 3, axis=2).astype(np.float32)

    def repair_image(self, rgb: np.ndarray, alpha: np.ndarray, depth: np.ndarray, seed: int = 0,
                     mask: Optional[np.ndarray] = None) -> np.ndarray:
        """(H,W,3) float32 in [0,1]: the render repaired (see the class); ValueError for mismatched shapes."""
        rgb, alpha, depth = (np.asarray(a, np.float32) for a in (rgb, alpha, depth))
        if rgb.ndim != 3 or rgb.shape[2] != 3:
            raise InputError(f"repair_image: rgb must be (H,W,3), got {rgb.shape}")
        H, W = rgb.shape[:2]
        for name, a in (("alpha", alpha), ("depth", depth), ("mask", mask)):
            if a is not None and np.shape(a) != (H, W):
                raise InputError(f"repair_image: {name} must be (H,W)=({H},{W}) like rgb {rgb.shape}, "
                                 f"got {np.shape(a)}")
        mask = None if mask is None else np.asarray(mask, np.float32)
        region = mask
        if self.inpaint and region is None:
            from scipy.ndimage import binary_dilation
            region = binary_dilation(alpha < 0.5, structure=np.ones((5, 5), bool)).astype(np.float32)
        if region is not None and not region.any():
            return np.clip(rgb, 0, 1)  # nothing to repair: the render as it is, without running the pipeline

        # sides must be multiples of the VAE's downsampling (8 for SD); the ControlNet inpaint pipeline
        # checks a hard-coded 8 whatever the VAE
        m = math.lcm(int(self.pipe.vae_scale_factor), 8)
        ph, pw = -H % m, -W % m
        pad = lambda a: np.pad(a, ((0, ph), (0, pw)) + ((0, 0),) * (a.ndim - 2), mode="edge")  # noqa: E731
        args = dict(image=pad(rgb)[None], prompt_embeds=self.prompt_embeds,
                    guidance_scale=1.0,  # no classifier-free guidance: with no prompt it would only double the cost
                    num_inference_steps=self.steps, strength=self.strength, output_type="np",
                    generator=torch.Generator().manual_seed(seed))
        if self._sized:
            args.update(height=H + ph, width=W + pw)
        if self.inpaint:
            args["mask_image"] = pad(region)[None, :, :, None]
        if self.controlnet:
            args["control_image"] = pad(self.depth_control(depth))[None]
        with torch.no_grad():
            out = np.asarray(self.pipe(**args).images[0], np.float32)[:H, :W]
        if region is not None:  # outside the region the VAE's round trip would only blur the render
            out = region[..., None] * out + (1 - region[..., None]) * rgb
        return np.clip(out, 0, 1).astype(np.float32)
