"""The scenes layer's commands: driving logs (synth, convert, validate, export), reconstruction, evaluation,
trajectories along a log and the synthetic street's ground truth, and the whole demo."""
from __future__ import annotations

from pathlib import Path

from gsim.cli_args import camera_backends, distances, finite_float, frame_range, int_at_least, share_span
from gsim.errors import InputError


def cmd_demo(a) -> int:
    from .demo import run_demo
    run_demo(Path(a.out), seed=a.seed, shift_m=a.shift_m, **({"iterations": a.iterations} if a.iterations else {}))
    return 0


def cmd_synth(a) -> int:
    from .synth import SynthOptions, synthesize
    print(f"wrote log {synthesize(a.out, seed=a.seed, options=SynthOptions(tracks=not a.no_tracks, omit=tuple(a.omit)))}")
    return 0


def cmd_convert(a) -> int:
    outs = a.convert(a)
    for o in outs if isinstance(outs, list) else [outs]:
        print(f"wrote log {o}")
    return 0


def cmd_overlay(a) -> int:
    from .log import load_log
    from .overlay import write_overlay
    log = load_log(a.log)
    camera = a.camera or min(log.cameras, default=None)
    if camera is None:
        raise InputError(f"{a.log}: the log has no cameras to draw on")
    out = write_overlay(log, a.frame, camera, Path(a.out), lidars=a.lidar, boxes=not a.no_boxes)
    print(f"wrote {out}: frame {a.frame} of camera {camera} with {'its' if a.lidar is None else 'the'} LiDAR points"
          f"{'' if a.no_boxes else ' and actor boxes'}")
    return 0


def cmd_export_nerfstudio(a) -> int:
    from .log import load_log
    from .formats.nerfstudio import export_nerfstudio
    print(f"wrote {export_nerfstudio(load_log(a.log), a.out)}")
    return 0


def cmd_validate(a) -> int:
    from .log import validate_log
    log = validate_log(a.log, progress=True)
    print(f"{a.log}: valid gsim log '{log.name}' ({log.source}): {len(log.frames)} frames, cameras "
          f"{sorted(log.cameras)}, lidars {sorted(log.lidars)}, {len(log.actors)} actors")
    for n in log.notes:
        print(f"  note: {n}")
    return 0


def cmd_compile(a) -> int:
    from .kernel_cache import prime, stamp_path
    ran = prime()
    print(f"gsim's kernels {'compiled into' if ran else 'were already in'} numba's cache (stamp {stamp_path()})")
    return 0


def cmd_reconstruct(a) -> int:
    from .reconstruction.train import preset, reconstruct
    overrides = {k: v for k, v in (("iterations", a.iterations), ("seed", a.seed), ("downscale", a.downscale),
                                   ("road_weight", a.road_weight), ("surface_eps", a.surface_eps))
                 if v is not None}
    if a.no_movers:
        overrides["movers"] = False
    if a.sky_fill:
        overrides["sky_fill"] = True
    if a.train_span is not None:
        overrides["train_span"] = a.train_span
    if a.max_minutes is not None:
        overrides["max_train_s"] = 60.0 * a.max_minutes
    scene = reconstruct(a.log, a.out, preset(a.preset, **overrides), resume=a.resume)
    print(f"wrote scene {scene}")
    return 0


def cmd_eval(a) -> int:
    from .evaluation.evaluate import evaluate
    from .evaluation.lane_shift import offpath_table
    repair = a.open_repairer(a) if a.open_repairer else None  # set with --repair by gsim.diffusion.cli
    m = evaluate(a.scene, a.log, a.out, holdout_every=a.holdout_every, downscale=a.downscale, backend=a.backend,
                 shifts=a.shifts, ahead=a.ahead, repair=repair, frames=a.frames)
    lidar = (f", LiDAR depth |err| median {m['lidar_depth_median_abs_m']:.3f} m mean {m['lidar_depth_mean_abs_m']:.3f} m"
             if "lidar_depth_median_abs_m" in m else "")
    seen = m["held_out_frames"]
    what = "held-out views" if a.frames is None else f"views of frames {seen[0]}-{seen[-1]}"
    print(f"{what}: {len(m['views'])} at downscale {m['downscale']}; PSNR {m['psnr']:.2f} dB, "
          f"SSIM {m['ssim']:.4f}{lidar} -> {a.out}/metrics.json")
    rows = [(what, m)] + [(f"shifted {r['shift_m']:g} m (both sides)", r) for r in m.get("lane_shift", [])] \
        + [(f"{r['ahead_m']:g} m ahead", r) for r in m.get("ahead", [])]
    for where, r in rows[1:] if repair is None else rows:
        fixed = f"; repaired: PSNR {r['repaired_psnr']:.2f} dB, SSIM {r['repaired_ssim']:.4f}" if repair else ""
        alpha = (f", alpha < 0.5 on {r['low_alpha_fraction']:.1%} ({r['views']} views, {r['views_left_out']} left "
                 f"out: no vehicle fits there)" if "low_alpha_fraction" in r else "")
        print(f"{where}: PSNR {r['psnr']:.2f} dB, SSIM {r['ssim']:.4f}{alpha}{fixed}")
    if a.shifts or a.ahead:
        print(f"off the driven path (also in {a.out}/metrics.md):\n{offpath_table(m)}", end="")
    return 0


def cmd_trajectory(a) -> int:
    from gsim.scene import load_scene

    from .log import load_log
    from .evaluation.render_path import camera_path, path_camera
    log = load_log(a.log)
    sensor = path_camera(log, a.camera)
    scene = None if a.scene is None else load_scene(a.scene)
    traj = camera_path(log, sensor, a.shift_m, a.frames, a.every, a.holdout_every, a.downscale, scene)
    traj.save(a.out)
    cam = traj.camera
    where = "" if scene is None or scene.pose_corrections is None else f", where {a.scene} puts the log's poses"
    print(f"wrote {a.out}: {len(traj.poses)} poses of camera {sensor} ({cam.model} {cam.width}x{cam.height}), "
          f"shifted {a.shift_m:g} m left{where}")
    return 0


def cmd_truth(a) -> int:
    from gsim.trajectory import load_trajectory

    from .evaluation.lane_shift import render_truth
    from .log import load_log
    n = render_truth(load_log(a.log), load_trajectory(a.trajectory), a.out)
    print(f"wrote {n} exact frames of the synthetic street to {a.out}/rgb and {a.out}/depth")
    return 0


def _register_formats(formats) -> None:
    """One subcommand per dataset format (gsim.scenes.formats.FORMATS): src, out (optional where the module's
    OUT_NARGS says "?") and the format module's options, which the converter takes by name."""
    from .formats import FORMATS, converter, format_module
    for fmt in FORMATS:
        module = format_module(fmt)
        p = formats.add_parser(fmt, help=module.HELP)
        p.add_argument("src", help=module.SRC)
        p.add_argument("out", nargs=getattr(module, "OUT_NARGS", None), help=getattr(module, "OUT", None))
        if hasattr(module, "add_options"):
            module.add_options(p)
        options = tuple(a.dest for a in p._actions if a.option_strings and a.dest != "help")
        p.set_defaults(fn=cmd_convert, convert=lambda a, fmt=fmt, options=options: converter(fmt)(
            a.src, a.out, **{k: getattr(a, k) for k in options}))


def register(sub) -> None:
    backends = camera_backends()
    dm = sub.add_parser("demo", help="the main job: synthesize the default street log, reconstruct it on CPU, "
                                     "evaluate held-out views, render a video along a shifted path")
    dm.add_argument("--out", default="out/demo")
    dm.add_argument("--seed", type=int_at_least(0), default=0)
    dm.add_argument("--iterations", type=int_at_least(1), default=None,
                    help="training iterations (default 1500; the cpu preset has 2000)")
    dm.add_argument("--shift-m", type=finite_float(), default=1.0,
                    help="lateral shift of the novel-view path (metres, left)")
    dm.set_defaults(fn=cmd_demo)

    sy = sub.add_parser("synth", help="write the synthetic street log (multi-camera + LiDAR, exact ground truth)")
    sy.add_argument("out")
    sy.add_argument("--seed", type=int_at_least(0), default=0)
    sy.add_argument("--no-tracks", action="store_true",
                    help="withhold the cars' actor tracks (an unannotated drive; the images and sweeps are the same)")
    sy.add_argument("--omit", nargs="+", default=[], metavar="CAR",
                    help="leave these cars out (ids as in the log's tracks, e.g. parked_03): ground truth for edits")
    sy.set_defaults(fn=cmd_synth)

    cv = sub.add_parser("convert", help="convert a dataset into a gsim driving log (one subcommand per format)")
    formats = cv.add_subparsers(dest="format", metavar="FORMAT", required=True)
    _register_formats(formats)

    ov = sub.add_parser("overlay", help="draw a log's LiDAR points and actor boxes on one of its images (PNG): "
                                        "the check that a converted log's calibration, poses and tracks are right")
    ov.add_argument("log")
    ov.add_argument("out", help="the PNG to write")
    ov.add_argument("--frame", type=int_at_least(0), default=0)
    ov.add_argument("--camera", default=None, help="the log's camera (default: the first by name)")
    ov.add_argument("--lidar", nargs="+", default=None, help="the LiDARs whose points to draw (default: all)")
    ov.add_argument("--no-boxes", action="store_true")
    ov.set_defaults(fn=cmd_overlay)

    en = sub.add_parser("export-nerfstudio", help="write a log's cameras as a nerfstudio transforms.json")
    en.add_argument("log")
    en.add_argument("out")
    en.set_defaults(fn=cmd_export_nerfstudio)

    va = sub.add_parser("validate", help="check a driving log and every file it names")
    va.add_argument("log")
    va.set_defaults(fn=cmd_validate)

    kc = sub.add_parser("compile", help="compile gsim's numba kernels into numba's cache now (gsim reconstruct "
                        "does it when gsim changed; run it on each node of a cluster after installing)")
    kc.set_defaults(fn=cmd_compile)

    rc = sub.add_parser("reconstruct", help="train a surfel scene on a driving log")
    rc.add_argument("log")
    rc.add_argument("out")
    rc.add_argument("--preset", default="cpu", choices=["cpu", "cuda"])
    rc.add_argument("--iterations", type=int_at_least(1), default=None)
    rc.add_argument("--seed", type=int_at_least(0), default=None)
    rc.add_argument("--downscale", type=int_at_least(1), default=None,
                    help="train on images box-averaged by this integer factor (recorded in the scene)")
    rc.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.safetensors")
    rc.add_argument("--train-span", type=share_span, default=None, metavar="FIRST,LAST",
                    help="train on this share of the training frames only, e.g. 0,0.75: the first three quarters "
                         "(the rest: an extrapolation check with gsim eval --frames)")
    rc.add_argument("--no-movers", action="store_true",
                    help="a log without actor tracks: do not detect its moving objects (they stay in the background)")
    rc.add_argument("--max-minutes", type=finite_float(0, low_open=True), default=None, metavar="M",
                    help="a wall-time budget for the training loop: the learning rates decay over whichever of the "
                         "iterations and M minutes runs out first, and training stops when M minutes are spent")
    rc.add_argument("--road-weight", type=finite_float(0), default=None, metavar="W",
                    help="hold the road's lying surfels at the height fitted to the LiDAR's ground (default 1: the road "
                         "3 m off the driven lane +1.5 dB, the held-out views -0.04 dB on the synthetic streets; "
                         "0 turns it off)")
    rc.add_argument("--sky-fill", action="store_true",
                    help="the sky map learns only the directions the sky masks saw, the others follow a smooth fill "
                         "of those (the sky 3 m off the driven lane +1.2 dB, the whole view not better on the "
                         "synthetic streets: off by default)")
    rc.add_argument("--surface-eps", type=finite_float(0), default=None, metavar="EPS",
                    help="composite surfels whose ray-plane hits lie within this fraction of each other as one "
                         "surface (e.g. 0.01; a road seen at a grazing angle then renders at its depth, not from its "
                         "near side; the cpu preset only, about twice the training time; default 0: off)")
    rc.set_defaults(fn=cmd_reconstruct)

    ev = sub.add_parser("eval", help="held-out metrics (PSNR, SSIM, LiDAR depth) and side-by-side images")
    ev.add_argument("scene")
    ev.add_argument("log")
    ev.add_argument("--out", required=True)
    ev.add_argument("--holdout-every", type=int_at_least(2), default=8)
    ev.add_argument("--downscale", type=int_at_least(1), default=None,
                    help="box-average the images by this factor (default: the training downscale recorded in the "
                         "scene, else 1; another one is allowed, with a warning)")
    ev.add_argument("--backend", default="auto", choices=backends)
    ev.add_argument("--shifts", type=distances, default=(), help="comma-separated metres, e.g. 1,2,3: also the "
                    "held-out views shifted sideways (both sides) against the synthetic street's exact images")
    ev.add_argument("--ahead", type=distances, default=(), help="comma-separated metres: the last held-out frame "
                    "moved ahead beyond the driven path (synthetic logs)")
    ev.add_argument("--frames", type=frame_range, default=None, metavar="FIRST:LAST",
                    help="evaluate these log frames (indices, last excluded; FIRST: to the end) instead of the "
                         "held-out ones, e.g. the frames after a --train-span reconstruction's last (ahead of what it "
                         "saw); a repairer takes no references from them")
    ev.set_defaults(fn=cmd_eval, open_repairer=None)

    tj = sub.add_parser("trajectory", help="write a render trajectory (for gsim render) along a log camera's path, "
                                           "optionally shifted sideways")
    tj.add_argument("log")
    tj.add_argument("out", help="the trajectory JSON to write")
    tj.add_argument("--camera", default=None, help="the log's camera (default: front, else the first by name)")
    tj.add_argument("--shift-m", type=finite_float(), default=0.0,
                    help="sideways shift in the vehicle frame at each pose (metres, positive = left)")
    tj.add_argument("--frames", default="all", choices=["all", "train", "holdout"],
                    help="the log's frames, or its training or held-out ones (see --holdout-every)")
    tj.add_argument("--holdout-every", type=int_at_least(2), default=8, help="held-out frames: index %% N == 0")
    tj.add_argument("--every", type=int_at_least(1), default=1, help="keep every N-th of those frames")
    tj.add_argument("--downscale", type=int_at_least(1), default=1,
                    help="divide the camera's resolution (and intrinsics) by this factor")
    tj.add_argument("--scene", default=None,
                    help="a reconstruction of the log: follow the log's poses as its training refined them")
    tj.set_defaults(fn=cmd_trajectory)

    gt = sub.add_parser("truth", help="a synthetic log's exact images along any trajectory (e.g. `gsim trajectory "
                                      "--shift-m 2`): ground truth off the driven path")
    gt.add_argument("log", help="a log written by gsim synth (its street is re-created from the log)")
    gt.add_argument("--trajectory", required=True)
    gt.add_argument("--out", required=True)
    gt.set_defaults(fn=cmd_truth)
