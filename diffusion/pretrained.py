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
"""
from __future__ import annotations

import glob
import json
import os

import torch

__all__ = ["PretrainedError", "load_pretrained", "KINDS"]

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


class PretrainedError(ValueError):
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
        raise ImportError("loading pretrained weights needs the diffusion extra: pip install 'gsim[diffusion]'") from e

    common = dict(local_files_only=True, dtype=dtype)
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
