"""The ``gsim`` command line. Subcommands import their modules lazily, so --help stays fast."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _render_sequence(scene, trajectory, out: Path, backend: str, fps: float, depth: bool, video: bool) -> dict:
    """Render every frame of ``trajectory``: rgb/NNNNNN.png, optional depth/NNNNNN.png, video.mp4."""
    import numpy as np
    from tqdm import tqdm

    from . import render_camera
    from .io import to_uint8, write_depth_png, write_png, write_video

    frames, times = [], []
    for i, (t_us, T) in enumerate(tqdm(list(zip(trajectory.timestamps_us, trajectory.poses)),
                                       desc=f"render ({backend})", unit="frame")):
        t0 = time.perf_counter()
        f = render_camera(scene, trajectory.camera, T, backend=backend, timestamp_us=int(t_us))
        times.append(time.perf_counter() - t0)
        rgb = to_uint8(f.rgb)
        write_png(out / "rgb" / f"{i:06d}.png", rgb)
        if depth:
            write_depth_png(out / "depth" / f"{i:06d}.png", f.depth)
        if video:
            frames.append(rgb)
    if video:
        write_video(out / "video.mp4", frames, fps)
    return {"frames": len(times), "median_frame_ms": round(float(np.median(times)) * 1e3, 1)}


def cmd_render(a) -> int:
    from . import load_scene
    from .trajectory import load_trajectory
    scene = load_scene(a.scene)
    traj = load_trajectory(a.trajectory)
    stats = _render_sequence(scene, traj, Path(a.out), a.backend, a.fps, a.depth, not a.no_video)
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


def cmd_demo(a) -> int:
    import numpy as np

    from . import Scene
    from .demo import demo_camera, drive_trajectory, street_surfels
    from .trajectory import Trajectory
    out = Path(a.out)
    t0 = time.perf_counter()
    scene = Scene(background=street_surfels(a.surfels, seed=a.seed))
    scene.save(out / "scene")
    poses = drive_trajectory(a.frames)
    traj = Trajectory(demo_camera(a.width, a.height), np.arange(a.frames, dtype=np.int64) * 100_000, poses)
    traj.save(out / "trajectory.json")
    print(f"demo street: {len(scene.background)} surfels -> {out / 'scene'} ({time.perf_counter() - t0:.1f} s)")
    stats = _render_sequence(scene, traj, out / "render", a.backend, a.fps, True, True)
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
    save_ply(load_scene(a.scene).at(a.timestamp_us), a.out, layout=a.layout)
    print(f"wrote {a.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gsim", description="Autonomous-driving sensor simulation with 2D Gaussian splatting.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    backends = ["auto", "torch", "numba", "gsplat"]

    r = sub.add_parser("render", help="render camera images and a video along a trajectory")
    r.add_argument("scene", help="gsim scene directory or .ply")
    r.add_argument("--trajectory", required=True, help="trajectory JSON (camera + timed T_world_camera)")
    r.add_argument("--out", required=True, help="output directory")
    r.add_argument("--backend", default="auto", choices=backends)
    r.add_argument("--fps", type=float, default=10.0)
    r.add_argument("--depth", action="store_true", help="also write 16-bit depth PNGs (metres * 256)")
    r.add_argument("--no-video", action="store_true")
    r.set_defaults(fn=cmd_render)

    i = sub.add_parser("info", help="summarize a scene and the available backends")
    i.add_argument("scene")
    i.set_defaults(fn=cmd_info)

    d = sub.add_parser("demo", help="build the built-in demo street and render a drive through it")
    d.add_argument("--out", default="out/demo")
    d.add_argument("--frames", type=int, default=48)
    d.add_argument("--surfels", type=int, default=100_000)
    d.add_argument("--width", type=int, default=640)
    d.add_argument("--height", type=int, default=360)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--fps", type=float, default=10.0)
    d.add_argument("--backend", default="auto", choices=backends)
    d.set_defaults(fn=cmd_demo)

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
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, FileExistsError, RuntimeError, NotImplementedError) as e:
        # bad input and unavailable backends: one clear line, no traceback
        print(f"gsim {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
