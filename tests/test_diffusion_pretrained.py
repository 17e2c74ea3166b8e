"""gsim.diffusion.pretrained: SD inpainting/img2img (+ depth ControlNet) from a local directory.

Tiny random pipelines are built from configs and saved with `save_pretrained`; the tokenizer is made
here from a six-word vocabulary. Nothing may touch the network: HF_HUB_OFFLINE is set before diffusers
is imported and sockets are blocked while each test runs.
"""
import json
import os
import re
import shutil
import socket

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

from gsim.diffusion.pretrained import PretrainedError, PretrainedRepair, load_pretrained  # noqa: E402

SIZE = 32  # image side; the tiny VAE downsamples by 2, so latents are 16x16 (the UNet's sample_size)
CROSS = 16  # cross_attention_dim = text hidden size
MAX_LEN = 77


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def refuse(*args, **kwargs):
        raise RuntimeError("network access attempted in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def _unet(in_channels, cross=CROSS):
    return diffusers.UNet2DConditionModel(
        sample_size=16, in_channels=in_channels, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=cross, norm_num_groups=4, attention_head_dim=2)


def _write_tokenizer_files(folder):
    """vocab.json + merges.txt (the layout of SD snapshots), made here: no download."""
    os.makedirs(folder, exist_ok=True)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, "a</w>": 2, "c": 3, "a": 4, "r</w>": 5, "car</w>": 6,
             "ca": 7}
    with open(os.path.join(folder, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(folder, "merges.txt"), "w") as f:
        f.write("#version: 0.2\nc a\nca r</w>\n")
    return len(vocab)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrained")
    torch.manual_seed(0)
    vocab_size = _write_tokenizer_files(str(root / "tok"))
    tokenizer = transformers.CLIPTokenizer(vocab=str(root / "tok" / "vocab.json"),
                                           merges=str(root / "tok" / "merges.txt"), model_max_length=MAX_LEN)
    text_encoder = transformers.CLIPTextModel(transformers.CLIPTextConfig(
        vocab_size=vocab_size, hidden_size=CROSS, intermediate_size=32, num_attention_heads=2, num_hidden_layers=1,
        max_position_embeddings=MAX_LEN, projection_dim=CROSS, bos_token_id=0, eos_token_id=1, pad_token_id=1))
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=4, sample_size=SIZE)
    scheduler = diffusers.DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                        clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    out = {}
    for kind, cls, channels in (("inpaint", diffusers.StableDiffusionInpaintPipeline, 9),
                                ("img2img", diffusers.StableDiffusionImg2ImgPipeline, 4)):
        unet = _unet(channels)
        pipe = cls(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet, scheduler=scheduler,
                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        pipe.save_pretrained(root / kind)
        out[kind] = root / kind
        if channels == 4:  # a ControlNet works on 4-channel latents, for both pipelines
            controlnet = diffusers.ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(8, 16))
            controlnet.save_pretrained(root / "controlnet")
            out["controlnet"] = root / "controlnet"
    # the inpainting snapshot keeps the classic tokenizer layout of SD repositories (vocab.json + merges.txt)
    tok = root / "inpaint" / "tokenizer"
    (tok / "tokenizer.json").unlink()
    _write_tokenizer_files(str(tok))
    return out


def _embeds(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, MAX_LEN, CROSS, generator=g)


def _inputs(kind):
    rng = np.random.default_rng(0)
    image = rng.random((1, SIZE, SIZE, 3)).astype(np.float32)  # numpy images carry a batch axis
    args = dict(image=image, prompt_embeds=_embeds(0), negative_prompt_embeds=_embeds(1), guidance_scale=2.0,
                num_inference_steps=2, strength=1.0, output_type="np", generator=torch.Generator().manual_seed(0))
    if kind == "inpaint":
        mask = np.zeros((1, SIZE, SIZE, 1), np.float32)
        mask[:, 8:24, 8:24] = 1.0
        args["mask_image"] = mask
    return args


def _check_output(result):
    images = result.images
    assert images.shape == (1, SIZE, SIZE, 3)
    assert np.isfinite(images).all() and images.min() >= 0.0 and images.max() <= 1.0


CLASSES = {("inpaint", False): "StableDiffusionInpaintPipeline", ("img2img", False): "StableDiffusionImg2ImgPipeline",
           ("inpaint", True): "StableDiffusionControlNetInpaintPipeline",
           ("img2img", True): "StableDiffusionControlNetImg2ImgPipeline"}


@pytest.mark.parametrize("asked", ["explicit", "auto"])
@pytest.mark.parametrize("kind", ["inpaint", "img2img"])
def test_load_and_run(dirs, kind, asked):
    pipe = load_pretrained(dirs[kind], kind=kind if asked == "explicit" else "auto")
    assert type(pipe).__name__ == CLASSES[(kind, False)]
    assert pipe.safety_checker is None and pipe.unet.dtype == torch.float32
    _check_output(pipe(**_inputs(kind)))


@pytest.mark.parametrize("kind", ["inpaint", "img2img"])
def test_controlnet_depth(dirs, kind):
    pipe = load_pretrained(dirs[kind], controlnet=dirs["controlnet"])
    assert type(pipe).__name__ == CLASSES[(kind, True)]
    depth = np.linspace(0.0, 1.0, SIZE, dtype=np.float32)[:, None].repeat(SIZE, 1)
    control = np.repeat(depth[None, :, :, None], 3, axis=3)  # a depth map as a 3-channel control image, batched
    _check_output(pipe(control_image=control, controlnet_conditioning_scale=1.0, **_inputs(kind)))


def test_text_prompt_uses_local_tokenizer(dirs):
    """A text prompt goes through the tokenizer saved in the directory (the classic vocab/merges layout)."""
    pipe = load_pretrained(dirs["inpaint"])
    assert pipe.tokenizer("a car").input_ids == [0, 2, 6, 1]
    args = _inputs("inpaint")
    del args["prompt_embeds"], args["negative_prompt_embeds"]
    _check_output(pipe(prompt="a car", negative_prompt="", **args))


def test_snapshot_without_safety_checker(dirs, tmp_path):
    """SD snapshots list a safety checker and feature extractor; gsim loads neither, so their folders may be gone."""
    d = tmp_path / "inpaint"
    shutil.copytree(dirs["inpaint"], d)
    _edit_json(d / "model_index.json", safety_checker=["stable_diffusion", "StableDiffusionSafetyChecker"],
               feature_extractor=["transformers", "CLIPImageProcessor"])
    pipe = load_pretrained(d, dtype=torch.bfloat16)
    assert pipe.safety_checker is None and pipe.feature_extractor is None
    assert pipe.unet.dtype == pipe.vae.dtype == pipe.text_encoder.dtype == torch.bfloat16


def _copy(dirs, tmp_path, kind="img2img"):
    dst = tmp_path / kind
    shutil.copytree(dirs[kind], dst)
    return dst


def _edit_json(file, **changes):
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps(data))


def test_missing_or_not_a_directory(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(PretrainedError, match=re.escape(f"{missing}: pretrained directory does not exist")):
        load_pretrained(missing)
    file = tmp_path / "file.bin"
    file.write_bytes(b"x")
    with pytest.raises(PretrainedError, match=re.escape(f"{file}: pretrained path is not a directory")):
        load_pretrained(file)


def test_no_model_index(tmp_path):
    with pytest.raises(PretrainedError, match=re.escape(f"{tmp_path}: no model_index.json")):
        load_pretrained(tmp_path)


def test_broken_model_index(dirs, tmp_path):
    d = _copy(dirs, tmp_path)
    (d / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline",')
    message = f"{d / 'model_index.json'}: model_index.json is not valid JSON"
    with pytest.raises(PretrainedError, match=re.escape(message)):
        load_pretrained(d)


@pytest.mark.parametrize("component", ["unet", "vae", "text_encoder", "tokenizer", "scheduler"])
def test_missing_component_folder(dirs, tmp_path, component):
    d = _copy(dirs, tmp_path)
    shutil.rmtree(d / component)
    with pytest.raises(PretrainedError, match=re.escape(f"{d}: component '{component}' is listed in model_index.json "
                                              f"but its folder {d / component} is missing")):
        load_pretrained(d)


def test_component_not_listed(dirs, tmp_path):
    d = _copy(dirs, tmp_path)
    index = json.loads((d / "model_index.json").read_text())
    del index["vae"]
    (d / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(PretrainedError, match=re.escape(f"{d}: model_index.json does not list the component 'vae'")):
        load_pretrained(d)


@pytest.mark.parametrize("component,config", [("unet", "config.json"), ("scheduler", "scheduler_config.json")])
def test_missing_config(dirs, tmp_path, component, config):
    d = _copy(dirs, tmp_path)
    (d / component / config).unlink()
    message = f"{d / component}: component '{component}' has no config file"
    with pytest.raises(PretrainedError, match=re.escape(message)):
        load_pretrained(d)


@pytest.mark.parametrize("component", ["unet", "vae", "text_encoder"])
def test_missing_weights(dirs, tmp_path, component):
    d = _copy(dirs, tmp_path)
    for weights in (d / component).glob("*.safetensors"):
        weights.unlink()
    message = f"{d / component}: component '{component}' has no weights file"
    with pytest.raises(PretrainedError, match=re.escape(message)):
        load_pretrained(d)


def test_kind_mismatch(dirs):
    message = "{}: kind '{}' needs a UNet with in_channels={}, this one has in_channels={}"
    with pytest.raises(PretrainedError, match=re.escape(message.format(dirs["img2img"], "inpaint", 9, 4))):
        load_pretrained(dirs["img2img"], kind="inpaint")
    with pytest.raises(PretrainedError, match=re.escape(message.format(dirs["inpaint"], "img2img", 4, 9))):
        load_pretrained(dirs["inpaint"], kind="img2img")
    with pytest.raises(PretrainedError, match="unknown kind 'txt2img'"):
        load_pretrained(dirs["inpaint"], kind="txt2img")


def test_unsupported_unet(dirs, tmp_path):
    d = _copy(dirs, tmp_path)
    _edit_json(d / "unet" / "config.json", in_channels=8)  # e.g. InstructPix2Pix
    with pytest.raises(PretrainedError, match=re.escape(f"{d}: the UNet") + ".* has in_channels=8; gsim needs 9"):
        load_pretrained(d)


def test_corrupt_weights_are_wrapped(dirs, tmp_path):
    d = _copy(dirs, tmp_path)
    (d / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(PretrainedError, match=re.escape(f"{d}: could not load the img2img pipeline")) as info:
        load_pretrained(d)
    assert info.value.__cause__ is not None


def test_controlnet_errors(dirs, tmp_path):
    cn = tmp_path / "controlnet"
    shutil.copytree(dirs["controlnet"], cn)
    _edit_json(cn / "config.json", cross_attention_dim=2 * CROSS)
    with pytest.raises(PretrainedError, match=re.escape(f"{cn}: ControlNet cross_attention_dim={2 * CROSS} "
                                              f"does not match the UNet's {CROSS}")):
        load_pretrained(dirs["inpaint"], controlnet=cn)
    for weights in cn.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(PretrainedError, match=re.escape(f"{cn}: ControlNet has no weights file")):
        load_pretrained(dirs["img2img"], controlnet=cn)
    (cn / "config.json").unlink()
    with pytest.raises(PretrainedError, match=re.escape(f"{cn}: ControlNet has no config.json")):
        load_pretrained(dirs["img2img"], controlnet=cn)
    with pytest.raises(PretrainedError, match=re.escape(f"{tmp_path / 'none'}: ControlNet directory does not exist")):
        load_pretrained(dirs["img2img"], controlnet=tmp_path / "none")


# --- PretrainedRepair: the RepairModel.repair_image interface over a pipeline --------------------------------

H, W = 20, 13  # not multiples of 8: exercises the edge padding and the crop


@pytest.fixture(scope="module")
def repairers(dirs):
    """One wrapper per (kind, ControlNet), 2 steps at strength 0.5 (a single denoising step: fast)."""
    return {(kind, cn): PretrainedRepair.from_dir(dirs[kind], controlnet=dirs["controlnet"] if cn else None,
                                                  strength=0.5, steps=2)
            for kind in ("inpaint", "img2img") for cn in (False, True)}


def _render(holes=True):
    rng = np.random.default_rng(1)
    rgb = rng.random((H, W, 3)).astype(np.float32)
    alpha = np.ones((H, W), np.float32)
    if holes:
        alpha[5:9, 4:8] = 0.0  # a hole the render never filled
    depth = np.linspace(1.0, 30.0, H * W, dtype=np.float32).reshape(H, W) * (alpha > 0)
    return rgb, alpha, depth


@pytest.mark.parametrize("controlnet", [False, True])
@pytest.mark.parametrize("kind", ["inpaint", "img2img"])
def test_repair_image(repairers, kind, controlnet):
    r = repairers[kind, controlnet]
    assert r.inpaint == (kind == "inpaint") and r.controlnet == controlnet
    rgb, alpha, depth = _render()
    out = r.repair_image(rgb, alpha, depth, seed=3)
    assert out.shape == (H, W, 3) and out.dtype == np.float32
    assert np.isfinite(out).all() and out.min() >= 0.0 and out.max() <= 1.0
    assert np.abs(out - rgb)[5:9, 4:8].mean() > 1e-3  # the hole (repaired by both kinds) changed
    np.testing.assert_array_equal(out, r.repair_image(rgb, alpha, depth, seed=3))  # deterministic per seed
    assert not np.array_equal(out, r.repair_image(rgb, alpha, depth, seed=4))

    mask = np.zeros((H, W), np.float32)
    mask[2:12, 3:10] = 1.0
    mask[12, 3:10] = 0.5  # a soft edge
    region = r.repair_image(rgb, alpha, depth, seed=3, mask=mask)
    assert region.shape == (H, W, 3) and region.dtype == np.float32
    np.testing.assert_allclose(region[mask == 0], rgb[mask == 0], atol=1e-6)  # outside: the render, exactly
    assert np.abs(region - rgb)[mask == 1].mean() > 1e-3


def test_inpaint_without_holes_keeps_the_render(repairers):
    rgb, alpha, depth = _render(holes=False)
    for cn in (False, True):
        np.testing.assert_array_equal(repairers["inpaint", cn].repair_image(rgb, alpha, depth), rgb)
    mask = np.zeros((H, W), np.float32)  # an empty region: the render too, for either kind
    np.testing.assert_array_equal(repairers["img2img", False].repair_image(rgb, alpha, depth, mask=mask), rgb)


def test_depth_control():
    depth = np.array([[1.0, 2.0], [4.0, 0.0]], np.float32)
    control = PretrainedRepair.depth_control(depth)
    assert control.shape == (2, 2, 3) and control.dtype == np.float32
    np.testing.assert_allclose(control[..., 0], [[1.0, 0.5], [0.25, 0.0]])  # near bright, far dark, miss 0
    assert not PretrainedRepair.depth_control(np.zeros((2, 2), np.float32)).any()


def test_repair_image_bad_shapes(repairers):
    r = repairers["img2img", False]
    rgb, alpha, depth = _render()
    with pytest.raises(ValueError, match=re.escape("rgb must be (H,W,3), got (20, 13)")):
        r.repair_image(rgb[..., 0], alpha, depth)
    with pytest.raises(ValueError, match=re.escape("alpha must be (H,W)=(20,13)") + ".*got \\(20, 12\\)"):
        r.repair_image(rgb, alpha[:, :12], depth)
    with pytest.raises(ValueError, match=re.escape("depth must be (H,W)=(20,13)")):
        r.repair_image(rgb, alpha, depth[..., None])
    with pytest.raises(ValueError, match=re.escape("mask must be (H,W)=(20,13)")):
        r.repair_image(rgb, alpha, depth, mask=np.ones((W, H), np.float32))


def test_repair_bad_settings(repairers):
    pipe = repairers["img2img", False].pipe
    for strength in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="strength must be in"):
            PretrainedRepair(pipe, strength=strength)
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        PretrainedRepair(pipe, steps=0)
    with pytest.raises(ValueError, match=re.escape("steps * strength must be >= 1")):
        PretrainedRepair(pipe, strength=0.3, steps=2)
    with pytest.raises(PretrainedError, match="does not exist"):
        PretrainedRepair.from_dir("/nonexistent/sd")


def test_gsim_render_with_local_pretrained_weights(dirs, tmp_path):
    """`gsim render --pretrained DIR [--controlnet DIR]`: the frames repaired by a local pipeline, the
    renders beside them; conflicting or dangling options are clear errors (exit 2)."""
    import gsim
    from gsim.cli import main
    from gsim.diffusion import open_repairer
    from gsim.street import street_surfels
    from gsim.trajectory import Trajectory
    gsim.Scene(background=street_surfels(2000)).save(tmp_path / "scene")
    T = np.eye(4)
    T[:3, :3] = [[0, 0, 1], [-1, 0, 0], [0, -1, 0]]
    T[:3, 3] = [0.0, -1.5, 1.5]
    Trajectory(gsim.PinholeCamera(30, 20, 20.0, 20.0, 15.0, 10.0), np.array([0]), T[None]).save(tmp_path / "t.json")
    base = ["render", str(tmp_path / "scene"), "--trajectory", str(tmp_path / "t.json"), "--no-video"]
    assert main(base + ["--out", str(tmp_path / "r"), "--pretrained", str(dirs["img2img"]), "--controlnet",
                        str(dirs["controlnet"]), "--sd-steps", "2", "--strength", "0.5"]) == 0
    from PIL import Image
    a, b = (np.asarray(Image.open(tmp_path / "r" / d / "000000.png"), np.float32) for d in ("render", "rgb"))
    assert a.shape == b.shape == (20, 30, 3) and np.abs(a - b).mean() > 1
    assert main(base + ["--out", str(tmp_path / "r2"), "--pretrained", str(tmp_path / "nowhere")]) == 2
    assert main(base + ["--out", str(tmp_path / "r3"), "--controlnet", str(dirs["controlnet"])]) == 2
    with pytest.raises(ValueError, match="give one repairer"):
        open_repairer(model=tmp_path / "m", pretrained=dirs["img2img"])
    assert open_repairer() is None
