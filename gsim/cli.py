"""The ``gsim`` command line: the core commands, the layers' commands, and one error policy for all of them.

Each layer registers its own commands (``register(subparsers)`` in gsim/{lidar,scenes,editing,diffusion,bridges}/
cli.py); a command belongs to the highest layer it uses. A layer may add options to a lower layer's command
without that command importing the layer: `gsim.diffusion.cli` adds --repair & co to ``render`` and ``eval`` (and
--harmonize to ``scenario``) and sets the opener they call. Command modules load lazily, so --help stays fast and
optional extras stay optional.

Exit codes: 0 done; 2 the input, the machine or an option is wrong (a `gsim.errors.GsimError`, an OSError
naming its path, a missing optional extra naming it; argparse's own errors too); 3 an internal error, a bug in
gsim (`--debug` or GSIM_DEBUG=1 prints the traceback of any error); 130 interrupted (Ctrl-C).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

from .cli_args import add_ros2_bag, camera_backends, int_at_least, positive, ros2_bag
from .errors import GsimError, GsimWarning, InputError

LAYERS = ("gsim.lidar.cli", "gsim.scenes.cli", "gsim.editing.cli", "gsim.diffusion.cli", "gsim.bridges.cli")

# optional dependencies (top-level module) -> the extra that installs them (pyproject.toml)
EXTRAS = {"gsplat": "cuda", "kiss_icp": "lidar", "diffusers": "diffusion", "transformers": "diffusion",
          "sumolib": "sumo", "libsumo": "sumo", "traci": "sumo", "gymnasium": "sumo", "mcap": "sumo",
          "mcap_protobuf": "sumo", "foxglove_schemas_protobuf": "sumo", "grpc": "serve", "grpc_reflection": "serve",
          "grpc_health": "serve", "vehiclemodels": "dynamics", "omegaconf": "dynamics",
          "carla_driver_interface": "alpasim", "scenariogeneration": "scenarios", "trimesh": "editing",
          "pydantic": "editing", "yaml": "editing", "viser": "viewer",
          "pyarrow": "formats", "google": "formats", "ray": "cluster", "rosbags": "ros2",
          "cv2": "ros2"}  # google: protobuf (serve has it too)


def cmd_render(a) -> int:
    from . import load_scene
    from .render.sequence import render_sequence
    from .trajectory import load_trajectory
    scene = load_scene(a.scene)
    traj = load_trajectory(a.trajectory)
    repair = a.open_repairer(a) if a.open_repairer else None  # set with --repair by gsim.diffusion.cli
    stats = render_sequence(scene, traj, Path(a.out), a.backend, a.fps, a.depth, not a.no_video, repair,
                            ros2_bag(a))
    print(f"wrote {stats['frames']} frames to {a.out} (median {stats['median_frame_ms']} ms/frame)")
    return 0


def cmd_info(a) -> int:
    import numpy as np

    from . import backend_report, load_scene
    scene = load_scene(a.scene)
    s = scene.background.numpy()
    print(f"scene: {a.scene}")
    print(f"background surfels: {len(s)}  SH degree: {s.sh_degree}  features: "
          f"{'none' if s.features is None else s.features.shape[1]}")
    if len(s):
        lo, hi = s.means.min(0).astype(float), s.means.max(0).astype(float)
        print(f"bounds (m): min {np.round(lo, 2).tolist()}  max {np.round(hi, 2).tolist()}")
        print(f"scales (m): median {float(np.median(s.scales)):.4g}  opacity: median {float(np.median(s.opacities)):.3g}")
    print(f"actors: {len(scene.actors)}")
    for act in scene.actors:
        print(f"  {act.id} ({act.category}): {len(act.surfels)} surfels, track of {len(act.track_timestamps_us)} poses")
    print("backends:")
    for name, status in backend_report().items():
        print(f"  {name}: {status}")
    return 0


def cmd_street(a) -> int:
    import numpy as np

    from . import Scene
    from .render.sequence import render_sequence
    from .street import demo_camera, drive_trajectory, street_surfels
    from .trajectory import Trajectory
    out = Path(a.out)
    t0 = time.perf_counter()
    scene = Scene(background=street_surfels(a.surfels, seed=a.seed))
    scene.save(out / "scene")
    poses = drive_trajectory(a.frames)
    traj = Trajectory(demo_camera(a.width, a.height), np.arange(a.frames, dtype=np.int64) * 100_000, poses)
    traj.save(out / "trajectory.json")
    print(f"demo street: {len(scene.background)} surfels -> {out / 'scene'} ({time.perf_counter() - t0:.1f} s)")
    stats = render_sequence(scene, traj, out / "render", a.backend, a.fps, depth=True, video=True)
    print(f"rendered {stats['frames']} frames {a.width}x{a.height}, median {stats['median_frame_ms']} ms/frame "
          f"-> {out / 'render'} (rgb/, depth/, video.mp4)")
    return 0


def cmd_import_ply(a) -> int:
    from . import Scene
    from .ply import load_ply
    Scene(background=load_ply(a.ply)).save(a.out)
    print(f"wrote scene {a.out}")
    return 0


def cmd_export_ply(a) -> int:
    from . import load_scene
    from .ply import save_ply
    scene = load_scene(a.scene)
    if scene.actors and a.timestamp_us is None:  # checked here so that the error names the option
        raise InputError(f"{a.scene}: the scene has {len(scene.actors)} actors; give --timestamp-us "
                         f"(integer microseconds) to place them")
    save_ply(scene.at(a.timestamp_us), a.out, layout=a.layout)
    print(f"wrote {a.out}")
    return 0


def register(sub) -> None:
    """The core commands: rendering a scene, its summary, the procedural street, PLY in and out."""
    backends = camera_backends()
    r = sub.add_parser("render", help="render camera images and a video along a trajectory")
    r.add_argument("scene", help="gsim scene directory or .ply")
    r.add_argument("--trajectory", required=True, help="trajectory JSON (camera + timed T_world_camera)")
    r.add_argument("--out", required=True, help="output directory")
    r.add_argument("--backend", default="auto", choices=backends)
    r.add_argument("--fps", type=positive, default=10.0)
    r.add_argument("--depth", action="store_true", help="also write 16-bit depth PNGs (metres * 256)")
    r.add_argument("--no-video", action="store_true")
    add_ros2_bag(r)
    r.set_defaults(fn=cmd_render, open_repairer=None)

    i = sub.add_parser("info", help="summarize a scene and the available backends")
    i.add_argument("scene")
    i.set_defaults(fn=cmd_info)

    d = sub.add_parser("street", help="build the procedural surfel street and render a drive through it")
    d.add_argument("--out", default="out/street")
    d.add_argument("--frames", type=int_at_least(2), default=48)
    d.add_argument("--surfels", type=int_at_least(100), default=100_000)
    d.add_argument("--width", type=int_at_least(1), default=640)
    d.add_argument("--height", type=int_at_least(1), default=360)
    d.add_argument("--seed", type=int_at_least(0), default=0)
    d.add_argument("--fps", type=positive, default=10.0)
    d.add_argument("--backend", default="auto", choices=backends)
    d.set_defaults(fn=cmd_street)

    ip = sub.add_parser("import-ply", help="convert a 3DGS/2DGS .ply into a gsim scene directory")
    ip.add_argument("ply")
    ip.add_argument("out")
    ip.set_defaults(fn=cmd_import_ply)

    ep = sub.add_parser("export-ply", help="write a scene as a .ply that splat viewers open")
    ep.add_argument("scene")
    ep.add_argument("out")
    ep.add_argument("--layout", default="3dgs", choices=["3dgs", "2dgs"])
    ep.add_argument("--timestamp-us", type=int, default=None, help="time at which to place actors")
    ep.set_defaults(fn=cmd_export_ply)


DEBUG_HELP = "on any error, print the full traceback (for a bug report); also GSIM_DEBUG=1"


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the core commands, then each layer's (`LAYERS`), lowest first."""
    p = argparse.ArgumentParser(prog="gsim", description="Autonomous-driving sensor simulation with 2D Gaussian "
                                "splatting.", epilog="Exit status: 0 done, 2 bad input or a missing file, program or "
                                "extra, 3 an internal error (a bug in gsim), 130 interrupted.")
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register(sub)
    for layer in LAYERS:
        importlib.import_module(layer).register(sub)
    for leaf in commands(p).values():  # `gsim CMD ... --debug` works too (SUPPRESS: never resets the global one)
        leaf.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return p


def commands(parser: argparse.ArgumentParser, prefix: tuple = ()) -> dict:
    """Every command of ``parser`` that runs something: {("library", "list"): its parser, ...}."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, p in action.choices.items():
                found.update(commands(p, prefix + (name,)) or {prefix + (name,): p})
    return found


def _os_reason(e: OSError) -> str:
    """An OSError as the path(s) it names and the system's reason."""
    reason = e.strerror or str(e)  # OSError("text") has no strerror
    if e.filename is None:
        return reason
    return f"{e.filename}{'' if e.filename2 is None else f' -> {e.filename2}'}: {reason}"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("GSIM_DEBUG", "") not in ("", "0")
    show = warnings.showwarning

    def one_line(message, category, *rest, **kw):
        if issubclass(category, GsimWarning):  # gsim's own warnings: one line, like its errors
            print(f"gsim {args.command}: warning: {message}", file=sys.stderr)
        else:
            show(message, category, *rest, **kw)

    def fail(text: str, code: int) -> int:
        if debug:
            traceback.print_exc()
        print(f"gsim {args.command}: {text}", file=sys.stderr)
        return code

    def bug(e: BaseException) -> int:
        return fail(f"internal error (a bug in gsim; rerun with --debug and report the traceback): "
                    f"{type(e).__name__}: {e}", 3)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = one_line
            return args.fn(args)
    except BrokenPipeError:  # `gsim library list | head`: the reader left early, which is no error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own recipe: no flush error at exit
        return 0
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except GsimError as e:  # deliberate: bad input, a missing thing, backend, program or extra (MissingExtra)
        return fail(f"error: {e}", 2)
    except OSError as e:  # the machine: a missing path, a directory for a file, no permission, a full disk
        return fail(f"error: {_os_reason(e)}", 2)
    except ImportError as e:  # an optional dependency that is not installed, else a bug
        extra = EXTRAS.get((e.name or "").split(".")[0])
        return bug(e) if extra is None else fail(f"error: this needs the optional extra '{extra}' ({e}): "
                                                 f"pip install 'gsim[{extra}]'", 2)
    except Exception as e:  # anything else is a bug in gsim, never the user's input
        return bug(e)


if __name__ == "__main__":
    sys.exit(main())
