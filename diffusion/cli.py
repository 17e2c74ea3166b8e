"""The diffusion layer's commands (``gsim diffusion train``, ``gsim expand``) and its options on lower layers'
commands: --repair & co on ``render`` and ``eval``, --harmonize on ``scenario`` (those commands call the
opener this module sets, so they never import gsim.diffusion themselves). diffusers loads inside the commands."""
from __future__ import annotations

import sys
from pathlib import Path

from gsim.cli_args import distances, finite_float, int_at_least


def open_repairer(a):
    """The repairer of a command's --repair / --pretrained [--controlnet --strength --sd-steps] (None: neither)."""
    from . import open_repairer as open_
    return open_(a.repair, a.pretrained, a.controlnet, a.strength, a.sd_steps, a.paste_references)


def open_render_repairer(a):
    """``gsim render``'s repairer: with --references-log, a repair model takes its references from that log."""
    from gsim.errors import InputError
    repair = open_repairer(a)
    if a.references_log is None:
        if a.paste_references:
            raise InputError("--paste-references pastes a log's images: give the log with --references-log LOG")
        k = getattr(getattr(repair, "config", None), "references", 0)
        if k:  # (it runs, but it was trained with real images beside the render)
            print(f"gsim render: {a.repair} takes {k} reference(s) from a log's images; without --references-log "
                  f"LOG it repairs from the render alone, its reference slots empty", file=sys.stderr)
        return repair
    from gsim.scenes.log import load_log

    from .references import ReferencePaste
    from .repair import RepairModel
    if not (isinstance(repair, RepairModel) and repair.config.references or isinstance(repair, ReferencePaste)):
        raise InputError("--references-log: the repairer takes no references (give --paste-references, or train a "
                         "model with `gsim diffusion train ... --references K`)")
    return repair.with_log(load_log(a.references_log))


def open_harmonizer(a):
    """The harmonizer of ``gsim scenario render --harmonize / --harmonize-pretrained`` (None: neither)."""
    from . import open_repairer as open_
    repair = open_(a.harmonize, a.harmonize_pretrained)
    if repair is None:
        return None
    from .harmonize import Harmonizer
    return Harmonizer(repair, a.harmonize or a.harmonize_pretrained)


def add_repair_args(p, what: str, *aliases: str) -> None:
    """--repair (and ``aliases``), --pretrained, --controlnet, --strength, --sd-steps on the parser ``p``; ``what``
    says what the command does with the repairer."""
    p.add_argument("--repair", *aliases, dest="repair", default=None, metavar="MODEL_DIR",
                   help=f"a repair model directory (gsim diffusion train): {what}")
    p.add_argument("--pretrained", default=None, metavar="DIR", help="instead of --repair: a local Stable Diffusion "
                   "inpainting or img2img directory (diffusers layout; never downloaded)")
    p.add_argument("--paste-references", action="store_true", help="instead of --repair: no model, the log's real "
                   "training images warped into each view through the log's LiDAR depth, pasted where the 3 nearest "
                   "agree (two at least)")
    p.add_argument("--controlnet", default=None, metavar="DIR", help="with --pretrained: a local depth ControlNet "
                   "directory, guided by the render's depth")
    p.add_argument("--strength", type=finite_float(0.0, 1.0, low_open=True), default=0.35,
                   help="with --pretrained: the img2img/inpaint strength, in (0, 1]")
    p.add_argument("--sd-steps", type=int_at_least(1), default=20, help="with --pretrained: denoising steps")


def cmd_expand(a) -> int:
    from gsim.errors import InputError

    from .expand import ExpandOptions, expand
    repair = open_repairer(a)
    if repair is None:
        raise InputError(f"gsim expand needs a repairer: give --paste-references (the log's own images), train a "
                         f"model with `gsim diffusion train {a.scene} {a.log} --out MODEL_DIR` and give --model "
                         f"MODEL_DIR, or give local Stable Diffusion weights with --pretrained DIR")
    opts = ExpandOptions(shifts=a.shifts, ahead=a.ahead, iterations=a.iterations, every=a.every,
                         pseudo_weight=a.pseudo_weight, seed=a.seed, allow_worse=a.allow_worse, gate=not a.no_gate)
    s = expand(a.scene, a.log, repair, a.out, opts)
    for st in s["stages"]:
        where = f"{st['shift_m']:g} m beside" if st["shift_m"] else f"{st['ahead_m']:g} m ahead"
        after = st["real_view_loss_after"]
        gate = "" if st["gate_pass_fraction"] is None else f" ({100 * st['gate_pass_fraction']:.0f}% past the gate)"
        print(f"{where}: {st['pseudo_views']} repaired views{gate}, {st['surfels_added']} surfels added, real views' "
              f"loss {st['real_view_loss_before']:.4f} -> {'-' if after is None else f'{after:.4f}'}"
              + ("" if st["kept"] else f": undone ({st['stopped']})"))
    if s["held_out_psnr_before"] is not None:
        print(f"held-out views: {s['held_out_psnr_before']:.2f} -> {s['held_out_psnr_after']:.2f} dB")
    dist = lambda d: ",".join(f"{x:g}" for x in d)  # noqa: E731
    print(f"wrote the expanded scene {Path(a.out) / 'scene'} ({s['wall_s']:.0f} s); measure it (synthetic logs) with "
          f"`gsim eval {Path(a.out) / 'scene'} {a.log} --out DIR" + (f" --shifts {dist(opts.shifts)}" if opts.shifts
                                                                      else "")
          + (f" --ahead {dist(opts.ahead)}" if opts.ahead else "") + "`")
    return 0


def cmd_diffusion_train(a) -> int:
    from .repair import RepairConfig, repair_device
    from .train import TrainOptions, train
    opts = TrainOptions(steps=a.steps, seed=a.seed, **({} if a.crop is None else {"crop": a.crop}))
    card = train(a.scene, a.log, a.out, opts, RepairConfig(loss=a.loss, references=a.references,
                                                           reference_depth=a.reference_depth), resume=a.resume,
                 init=a.init, device=repair_device(a.device))
    print(f"wrote the repair model {a.out}: {card['steps']} steps, loss {card['loss_first_100']:.4f} -> "
          f"{card['loss_last_100']:.4f}, {card['wall_s']:.0f} s (pairs: {card['pairs']})")
    return 0


def register(sub) -> None:
    df = sub.add_parser("diffusion", help="the repair model: a conditional diffusion model trained on your log")
    dsub = df.add_subparsers(dest="diffusion_command", required=True, metavar="ACTION")
    dt = dsub.add_parser("train", help="train a repair model on a log's own renders (degraded reconstructions made "
                                       "on the way) -> a diffusers model directory with a card")
    dt.add_argument("scene")
    dt.add_argument("log")
    dt.add_argument("--out", required=True, help="the model directory (its work files go to OUT-work)")
    dt.add_argument("--steps", type=int_at_least(1), default=2000)
    dt.add_argument("--crop", type=int_at_least(8), default=None,
                    help="training crops' side, a multiple of 8 (default: TrainOptions', 64)")
    dt.add_argument("--seed", type=int_at_least(0), default=0)
    dt.add_argument("--resume", action="store_true", help="go on from OUT-work's checkpoint")
    dt.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="where the model trains (auto: CUDA where there is one)")
    dt.add_argument("--init", default=None, metavar="MODEL_DIR", help="start from this repair model's weights "
                    "(fine-tuning a pretrained one); its references and settings must be this training's")
    dt.add_argument("--loss", choices=("l1", "l2"), default="l1", help="the denoising loss")
    dt.add_argument("--references", type=int_at_least(0), default=2, help="real training images warped into each "
                    "view that the model is given beside the render (0: the render alone)")
    dt.add_argument("--reference-depth", choices=("lidar", "render"), default="lidar",
                    help="warp the references through the log's LiDAR (a log without LiDAR: the render's depth) or "
                         "the reconstruction's rendered depth")
    dt.set_defaults(fn=cmd_diffusion_train)

    ex = sub.add_parser("expand", help="expand a reconstruction off the driven path: repaired novel views distilled "
                                       "back into the scene, stage by stage outward")
    ex.add_argument("scene", help="a reconstruction directory (gsim reconstruct --out) or its scene/ folder: its "
                                  "training checkpoint is continued")
    ex.add_argument("log")
    ex.add_argument("--out", required=True, help="the expanded reconstruction: OUT/scene, OUT/checkpoint.safetensors, "
                                                 "OUT/expand.json, OUT/pseudo/ (render | repaired pictures)")
    add_repair_args(ex, "repairs the shifted views", "--model")
    ex.add_argument("--shifts", type=distances, default=(1.0, 2.0, 3.0), help="comma-separated metres, both sides, "
                    "distilled in increasing order (default 1,2,3)")
    ex.add_argument("--ahead", type=distances, default=(), help="comma-separated metres: then the last training "
                    "frame's cameras moved ahead, beyond the driven path")
    ex.add_argument("--iterations", type=int_at_least(1), default=300, help="fine-tuning steps per shift")
    ex.add_argument("--every", type=int_at_least(1), default=3, help="move every N-th training view")
    ex.add_argument("--pseudo-weight", type=finite_float(0.0, 1.0, low_open=True), default=0.5,
                    help="the repaired views' loss weight, in (0, 1] (real: 1)")
    ex.add_argument("--seed", type=int_at_least(0), default=0)
    ex.add_argument("--no-gate", action="store_true", help="distil every pixel a repair changed, not only where "
                    "two real references agree (the confidence gate)")
    ex.add_argument("--allow-worse", action="store_true", help="write the expanded scene even if it is worse than "
                    "the reconstruction on the log's held-out views by more than 0.2 dB (refused otherwise)")
    ex.set_defaults(fn=cmd_expand)

    # the lower layers' commands that take a repairer (registered before this layer: gsim.cli.LAYERS)
    for name, what in (("render", "rgb/ and the video hold every frame repaired, render/ the renders"),
                       ("eval", "also measure every render repaired")):
        add_repair_args(sub.choices[name], what)
        sub.choices[name].set_defaults(open_repairer=open_repairer)
    sub.choices["render"].add_argument("--references-log", default=None, metavar="LOG",
                                       help="with --repair of a model that takes references: the log whose training "
                                            "images they are (the trajectory's poses in its world frame)")
    sub.choices["render"].set_defaults(open_repairer=open_render_repairer)
    scn = sub.choices["scenario"]
    hz = scn.add_mutually_exclusive_group()
    hz.add_argument("--harmonize", default=None, metavar="MODEL_DIR",
                    help="render: repair the region around inserted actors with a repair model (gsim diffusion "
                         "train) so they match the scene; render/ keeps the renders as they were")
    hz.add_argument("--harmonize-pretrained", default=None, metavar="DIR",
                    help="render: the same with a local Stable Diffusion directory (diffusers layout)")
    scn.set_defaults(open_harmonizer=open_harmonizer)
