"""The ``gsim`` command line. Subcommands import their modules lazily, so --help stays fast."""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

from .errors import GsimWarning, InputError


def _render_sequence(scene, trajectory, out: Path, backend: str, fps: float, depth: bool, video: bool,
                     repair=None) -> dict:
    """Render every frame of ``trajectory``: rgb/NNNNNN.png, optional depth/NNNNNN.png, video.mp4. ``repair``: a
    repairer (`gsim.diffusion.open_repairer`); rgb/ and the video then hold the repaired frames, render/ the renders
    as they were."""
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
        if repair is not None:
            write_png(out / "render" / f"{i:06d}.png", rgb)
            rgb = to_uint8(repair.repair_image(f.rgb, f.alpha, f.depth))
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
    stats = _render_sequence(scene, traj, Path(a.out), a.backend, a.fps, a.depth, not a.no_video, _repairer(a))
    print(f"wrote {stats['frames']} frames to {a.out} (median {stats['median_frame_ms']} ms/frame)")
    return 0


def cmd_render_lidar(a) -> int:
    import numpy as np
    from tqdm import tqdm

    from . import load_scene
    from .lidar import LidarSpec, render_lidar
    from .lidar.io import load_lidar_trajectory, write_sweep
    spec = LidarSpec.preset(a.spec)
    scene = load_scene(a.scene)
    times, poses = load_lidar_trajectory(a.trajectory)
    # each sweep starts at a frame of the trajectory; the sensor moves along it while the sweep spins
    rolling = not a.no_rolling and len(times) > 1 and bool(np.all(np.diff(times) > 0))
    for i, (t, T) in enumerate(tqdm(list(zip(times, poses)), desc="render-lidar", unit="sweep")):
        f = render_lidar(scene, spec, (times, poses) if rolling else T, backend=a.backend, timestamp_us=int(t),
                         rolling=rolling)
        write_sweep(f, a.out, i)
    kitti = "|bin" if scene.lidar_head is not None else ""
    print(f"wrote {len(times)} sweeps of {spec.name} to {a.out} (points/*.npy|ply|pcd{kitti}, range/*.png)"
          f"{'' if rolling else ', sensor held still over each sweep'}")
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
    stats = _render_sequence(scene, traj, out / "render", a.backend, a.fps, True, True)
    print(f"rendered {stats['frames']} frames {a.width}x{a.height}, median {stats['median_frame_ms']} ms/frame "
          f"-> {out / 'render'} (rgb/, depth/, video.mp4)")
    return 0


def cmd_demo(a) -> int:
    from .scenes.demo import run_demo
    run_demo(Path(a.out), seed=a.seed, shift_m=a.shift_m, **({"iterations": a.iterations} if a.iterations else {}))
    return 0


def cmd_synth(a) -> int:
    from .scenes.synth import SynthOptions, synthesize
    print(f"wrote log {synthesize(a.out, seed=a.seed, options=SynthOptions(tracks=not a.no_tracks, omit=tuple(a.omit)))}")
    return 0


def cmd_convert(a) -> int:
    if a.format == "kitti-raw":
        from .scenes.kitti_raw import convert_kitti_raw
        outs = [convert_kitti_raw(a.src, a.out)]
    elif a.format == "dgp":
        from .scenes.dgp import convert_dgp
        outs = convert_dgp(a.src, a.out)
    else:
        from .scenes.nerfstudio import import_nerfstudio
        outs = [import_nerfstudio(a.src, a.out)]
    for o in outs:
        print(f"wrote log {o}")
    return 0


def cmd_export_nerfstudio(a) -> int:
    from .scenes.log import load_log
    from .scenes.nerfstudio import export_nerfstudio
    print(f"wrote {export_nerfstudio(load_log(a.log), a.out)}")
    return 0


def cmd_validate(a) -> int:
    from .scenes.log import validate_log
    log = validate_log(a.log, progress=True)
    print(f"{a.log}: valid gsim log '{log.name}' ({log.source}): {len(log.frames)} frames, cameras "
          f"{sorted(log.cameras)}, lidars {sorted(log.lidars)}, {len(log.actors)} actors")
    for n in log.notes:
        print(f"  note: {n}")
    return 0


def cmd_reconstruct(a) -> int:
    from .scenes.train import preset, reconstruct
    overrides = {k: v for k, v in (("iterations", a.iterations), ("seed", a.seed), ("downscale", a.downscale))
                 if v is not None}
    if a.no_movers:
        overrides["movers"] = False
    scene = reconstruct(a.log, a.out, preset(a.preset, **overrides), resume=a.resume)
    print(f"wrote scene {scene}")
    return 0


def _repairer(a):
    """The repairer of a command's --repair / --pretrained [--controlnet --strength --sd-steps] (None: neither)."""
    from .diffusion import open_repairer
    return open_repairer(a.repair, a.pretrained, a.controlnet, a.strength, a.sd_steps)


def _add_repair_args(p, what: str, *aliases: str) -> None:
    p.add_argument("--repair", *aliases, dest="repair", default=None, metavar="MODEL_DIR",
                   help=f"a repair model directory (gsim diffusion train): {what}")
    p.add_argument("--pretrained", default=None, metavar="DIR", help="instead of --repair: a local Stable Diffusion "
                   "inpainting or img2img directory (diffusers layout; never downloaded)")
    p.add_argument("--controlnet", default=None, metavar="DIR", help="with --pretrained: a local depth ControlNet "
                   "directory, guided by the render's depth")
    p.add_argument("--strength", type=float, default=0.35, help="with --pretrained: the img2img/inpaint strength")
    p.add_argument("--sd-steps", type=_int_at_least(1), default=20, help="with --pretrained: denoising steps")


def cmd_eval(a) -> int:
    from .scenes.evaluate import evaluate
    repair = _repairer(a)
    m = evaluate(a.scene, a.log, a.out, holdout_every=a.holdout_every, downscale=a.downscale, backend=a.backend,
                 shifts=a.shifts, ahead=a.ahead, repair=repair)
    lidar = (f", LiDAR depth |err| median {m['lidar_depth_median_abs_m']:.3f} m mean {m['lidar_depth_mean_abs_m']:.3f} m"
             if "lidar_depth_median_abs_m" in m else "")
    print(f"held-out views: {len(m['views'])} at downscale {m['downscale']}; PSNR {m['psnr']:.2f} dB, "
          f"SSIM {m['ssim']:.4f}{lidar} -> {a.out}/metrics.json")
    rows = [("held-out views", m)] + [(f"shifted {r['shift_m']:g} m (both sides)", r) for r in m.get("lane_shift", [])] \
        + [(f"{r['ahead_m']:g} m ahead", r) for r in m.get("ahead", [])]
    for where, r in rows[1:] if repair is None else rows:
        fixed = f"; repaired: PSNR {r['repaired_psnr']:.2f} dB, SSIM {r['repaired_ssim']:.4f}" if repair else ""
        alpha = f", alpha < 0.5 on {r['low_alpha_fraction']:.1%} ({r['views']} views)" if "low_alpha_fraction" in r else ""
        print(f"{where}: PSNR {r['psnr']:.2f} dB, SSIM {r['ssim']:.4f}{alpha}{fixed}")
    return 0


def cmd_expand(a) -> int:
    from .diffusion.expand import ExpandOptions, expand
    repair = _repairer(a)
    if repair is None:
        raise InputError(f"gsim expand needs a repairer: train one with `gsim diffusion train {a.scene} {a.log} --out "
                         f"MODEL_DIR` and give --model MODEL_DIR, or give local Stable Diffusion weights with "
                         f"--pretrained DIR")
    opts = ExpandOptions(shifts=a.shifts, ahead=a.ahead, iterations=a.iterations, every=a.every,
                         pseudo_weight=a.pseudo_weight, seed=a.seed)
    s = expand(a.scene, a.log, repair, a.out, opts)
    for st in s["stages"]:
        where = f"{st['shift_m']:g} m beside" if st["shift_m"] else f"{st['ahead_m']:g} m ahead"
        print(f"{where}: {st['pseudo_views']} repaired views, {st['surfels_added']} surfels added, "
              f"loss {st['loss_first_50']:.4f} -> {st['loss_last_50']:.4f}")
    dist = lambda d: ",".join(f"{x:g}" for x in d)  # noqa: E731
    print(f"wrote the expanded scene {Path(a.out) / 'scene'} ({s['wall_s']:.0f} s); measure it (synthetic logs) with "
          f"`gsim eval {Path(a.out) / 'scene'} {a.log} --out DIR" + (f" --shifts {dist(opts.shifts)}" if opts.shifts
                                                                      else "")
          + (f" --ahead {dist(opts.ahead)}" if opts.ahead else "") + "`")
    return 0


def cmd_diffusion_train(a) -> int:
    from .diffusion.repair import RepairConfig
    from .diffusion.train import TrainOptions, train
    opts = TrainOptions(steps=a.steps, seed=a.seed, **({} if a.crop is None else {"crop": a.crop}))
    card = train(a.scene, a.log, a.out, opts, RepairConfig(loss=a.loss), resume=a.resume)
    print(f"wrote the repair model {a.out}: {card['steps']} steps, loss {card['loss_first_100']:.4f} -> "
          f"{card['loss_last_100']:.4f}, {card['wall_s']:.0f} s (pairs: {card['pairs']})")
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


def cmd_trajectory(a) -> int:
    from .scenes.log import load_log
    from .scenes.render_path import camera_path, path_camera
    log = load_log(a.log)
    sensor = path_camera(log, a.camera)
    scene = None
    if a.scene is not None:
        from .scene import load_scene
        scene = load_scene(a.scene)
    traj = camera_path(log, sensor, a.shift_m, a.frames, a.every, a.holdout_every, a.downscale, scene)
    traj.save(a.out)
    cam = traj.camera
    where = "" if scene is None or scene.pose_corrections is None else f", where {a.scene} puts the log's poses"
    print(f"wrote {a.out}: {len(traj.poses)} poses of camera {sensor} ({cam.model} {cam.width}x{cam.height}), "
          f"shifted {a.shift_m:g} m left{where}")
    return 0


def cmd_truth(a) -> int:
    from .scenes.lane_shift import render_truth
    from .scenes.log import load_log
    from .trajectory import load_trajectory
    n = render_truth(load_log(a.log), load_trajectory(a.trajectory), a.out)
    print(f"wrote {n} exact frames of the synthetic street to {a.out}/rgb and {a.out}/depth")
    return 0


def _library(a):
    from .editing import AssetLibrary
    return AssetLibrary.builtin() if a.library == "builtin" else AssetLibrary(a.library)


def cmd_library_list(a) -> int:
    lib = _library(a)
    ids = lib.ids()
    print(f"{'built-in library' if lib.is_builtin else lib.path}: {len(ids)} assets")
    for i in ids:
        m = lib.manifest(i)
        print(f"  {i:16s} {m.category:10s} {' x '.join(f'{x:.2f}' for x in m.size)} m  {m.surfels} surfels  "
              f"{m.source.kind}{'  lidar' if m.lidar else ''}")
    return 0


def cmd_library_show(a) -> int:
    print(_library(a).manifest(a.asset).model_dump_json(indent=2))
    return 0


def cmd_library_render(a) -> int:
    from .editing.render import turntable, view
    from .io import to_uint8, write_png, write_video
    asset = _library(a).get(a.asset)
    out = Path(a.out)
    if a.frames == 1:
        write_png(out, to_uint8(view(asset, 35.0, a.width, a.height)))
    else:
        write_video(out, [to_uint8(f) for f in turntable(asset, a.frames, a.width, a.height)], a.fps)
    print(f"wrote {out}")
    return 0


def _add(a, asset) -> int:
    from .editing import AssetLibrary
    folder = AssetLibrary(a.library).add(asset, overwrite=a.overwrite)
    print(f"added {asset.id} ({asset.category}, {' x '.join(f'{x:.2f}' for x in asset.size)} m, "
          f"{len(asset.surfels)} surfels) -> {folder}")
    return 0


def cmd_library_add_actor(a) -> int:
    from .editing import asset_from_actor
    return _add(a, asset_from_actor(a.scene, a.actor, a.id, a.license))


def cmd_library_add_mesh(a) -> int:
    from .editing import asset_from_mesh
    return _add(a, asset_from_mesh(a.mesh, a.id, a.category, a.spacing_m, a.up, a.scale, a.license))


def cmd_library_add_ply(a) -> int:
    from .editing import asset_from_ply
    return _add(a, asset_from_ply(a.ply, a.id, a.category, a.up, a.license))


def cmd_scenario(a) -> int:
    from .editing.scenario import load_scenario
    from .editing.world import apply
    sc = load_scenario(a.file)
    if a.action == "validate":
        print(f"{a.file}: valid scenario '{sc.name}': {len(sc.edits)} edits on {sc.scene}")
        if not a.check:
            return 0
    world = apply(sc)
    if a.action == "validate":
        print(f"  applied: {len(world.scene.actors)} actors, {len(world.frames)} frames to render, no overlaps")
    elif a.action == "apply":
        out = Path(a.out) if a.out else Path(sc.output) / "scene"
        world.scene.save(out)
        print(f"wrote the edited scene {out} ({len(world.scene.actors)} actors)")
    else:
        from .diffusion import open_repairer
        from .editing.outputs import render_world
        repair, harmonizer = open_repairer(a.harmonize, a.harmonize_pretrained), None
        if repair is not None:
            from .diffusion.harmonize import Harmonizer
            harmonizer = Harmonizer(repair, a.harmonize or a.harmonize_pretrained)
        out = render_world(world, sc, backend=a.backend, harmonizer=harmonizer)
        extra = ", render/ (before harmonization)" if harmonizer else ""
        print(f"wrote {out}: log/, scene/, labels/, masks/, kitti/, video/{extra} ({len(world.frames)} frames)")
    return 0


def cmd_closed_loop(a) -> int:
    from .bridges.agents import load_agent
    from .bridges.runner import run, run_batch
    from .bridges.scenario import SHIPPED, ensure_demo, load_loop_scenario
    agents = a.agent.split(",") if not a.agent.startswith("exec:") else [a.agent]
    try:
        seeds = [int(x) for x in a.seed.split(",")]
    except ValueError:
        raise InputError(f"--seed: expected integers separated by commas, got {a.seed!r}") from None
    for name in agents:
        load_agent(name)  # bad input fails before anything starts
    for sc in a.scenario:
        loaded = load_loop_scenario(sc)
        if sc in SHIPPED:
            ensure_demo(loaded)
    if len(a.scenario) == 1 and len(agents) == 1 and len(seeds) == 1:
        m = run(a.scenario[0], agents[0], a.out, seed=seeds[0], max_steps=a.steps, client=a.sumo)
        print(f"{m['scenario']} / {m['agent']} (seed {m['seed']}): score {m['score']:.3f}, collision {m['collision']}, "
              f"route completion {m['route_completion']:.2f}, {m['steps']} steps in {m['wall_s']:.1f} s -> {a.out}")
        return 0
    rows = run_batch(a.scenario, agents, seeds, a.out, max_steps=a.steps, client=a.sumo)
    print(f"{len(rows)} runs -> {Path(a.out) / 'table.md'}")
    return 0


def cmd_serve(a) -> int:
    import os
    # the server forks (ffmpeg for run videos, SUMO) while gRPC's threads run: gRPC's fork handlers would
    # skip or hang there, and the children exec at once anyway (read when grpc is first imported)
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    from .bridges.scenario import SCENARIOS_DIR, SHIPPED
    from .bridges.server import Limits, load_served, serve_forever, start
    if bool(a.tls_cert) != bool(a.tls_key):
        raise InputError("--tls-cert and --tls-key: give both (a PEM certificate chain and its private key)")
    token = os.environ.get("GSIM_SERVE_TOKEN") or None
    if a.token_file:
        token = Path(a.token_file).read_text().strip()
        if not token:
            raise InputError(f"--token-file {a.token_file}: the file is empty")
    tls = (Path(a.tls_key).read_bytes(), Path(a.tls_cert).read_bytes()) if a.tls_cert else None
    if not (a.session_timeout_s > 0):
        raise InputError(f"--session-timeout-s: expected a number of seconds > 0, got {a.session_timeout_s}")
    served = {}
    for arg in a.scene or [*SHIPPED, str(SCENARIOS_DIR.parent / "out" / "demo")]:  # (the scenarios build it)
        t0 = time.perf_counter()
        s = load_served(arg, progress=True)
        if s.id in served:
            raise InputError(f"{arg}: a second scene with the id {s.id!r} (ids are folder or scenario names)")
        served[s.id] = s
        print(f"gsim serve: {s.kind} {s.id!r} ({len(s.scene.actors)} actors, cameras {sorted(s.cameras)}, LiDARs "
              f"{sorted(s.lidars)}) loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    limits = Limits(workers=a.workers, queue=a.queue, max_sessions=a.max_sessions, session_idle_s=a.session_timeout_s)
    server = start(served, a.host, a.port, token, tls, limits, a.sessions_dir, a.backend)
    print(f"gsim serve: listening on {a.host}:{server.port} ({'TLS' if tls else 'plaintext'}, "
          f"{'token required' if token else 'no token'}; {len(served)} scenes; SIGTERM or Ctrl-C stops)", flush=True)
    serve_forever(server)
    return 0


def _distances(text: str) -> tuple:
    """An argparse type: comma-separated metres (their range is `evaluate`'s to check)."""
    try:
        return tuple(float(x) for x in text.split(",")) if text.strip() else ()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected metres separated by commas (e.g. 1,2,3), got {text!r}") from None


def _int_at_least(low: int):
    """An argparse type: an integer >= ``low`` (argparse's error names the option)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {v}")
        return v
    return parse


SERVE_HELP = """Serve scenes over gRPC (the network sensor API: bridges/sensor.proto, docs/network_api.md).

Services: gsim.sensor.v1.SensorService (ListScenes, DescribeScene, RenderCamera, RenderLidar, StartSession,
StepSession, EndSession, GetServerInfo), grpc.health.v1.Health and server reflection (grpcurl works without
the proto). Python: from gsim.bridges.client import SensorClient.

Bound to 127.0.0.1 unless --host says otherwise; then a bearer token is required (--token-file or
GSIM_SERVE_TOKEN) and TLS (--tls-cert, --tls-key) is advised.
"""


CLOSED_LOOP_HELP = """Drive an agent through a scenario in closed loop.

Each step: the agent acts on its observation (rendered cameras and LiDAR, ego state, route; privileged agents
also get the ground-truth boxes) -> the ego's kinematic bicycle model advances one step (0.1 s) -> SUMO steps
with the ego injected, so traffic reacts -> the log's actors (replayed on their tracks) and SUMO's vehicles
(drawn with library assets) are placed -> the sensors render at the new pose -> metrics -> record.

Agents: replay (the logged path and timing), privileged (car following + pure pursuit on ground truth), lidar-aeb
(route following, brakes for LiDAR returns in its path), module:attribute (a class with act(obs)) or
exec:COMMAND (an agent process speaking JSON lines, see gsim.bridges.agents.ProcessAgent).
Shipped scenarios (on the demo street, built on first use): stopped-car (a car stands in the ego's lane),
lead-car (a slower car ahead), traffic (SUMO traffic at a density).

Writes DIR/metrics.json (collision, score = NC x DAC x (5 TTC + 5 EP + 2 C) / 12, route_completion, steps and
each sub-metric), metrics.md, steps.jsonl, video.mp4 (camera | bird's-eye view), log/ (the run as a gsim
driving log) and run.mcap (Foxglove). A failing run keeps every completed step. See docs/closed_loop.md.
"""


def build_parser() -> argparse.ArgumentParser:
    from .lidar.spec import preset_names  # numpy only
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
    _add_repair_args(r, "rgb/ and the video hold every frame repaired, render/ the renders")
    r.set_defaults(fn=cmd_render)

    i = sub.add_parser("info", help="summarize a scene and the available backends")
    i.add_argument("scene")
    i.set_defaults(fn=cmd_info)

    dm = sub.add_parser("demo", help="the main job: synthesize the default street log, reconstruct it on CPU, "
                                     "evaluate held-out views, render a video along a shifted path")
    dm.add_argument("--out", default="out/demo")
    dm.add_argument("--seed", type=int, default=0)
    dm.add_argument("--iterations", type=_int_at_least(1), default=None,
                    help="training iterations (default 1500; the cpu preset has 2000)")
    dm.add_argument("--shift-m", type=float, default=1.0, help="lateral shift of the novel-view path (metres, left)")
    dm.set_defaults(fn=cmd_demo)

    sy = sub.add_parser("synth", help="write the synthetic street log (multi-camera + LiDAR, exact ground truth)")
    sy.add_argument("out")
    sy.add_argument("--seed", type=int, default=0)
    sy.add_argument("--no-tracks", action="store_true",
                    help="withhold the cars' actor tracks (an unannotated drive; the images and sweeps are the same)")
    sy.add_argument("--omit", nargs="+", default=[], metavar="CAR",
                    help="leave these cars out (ids as in the log's tracks, e.g. parked_03): ground truth for edits")
    sy.set_defaults(fn=cmd_synth)

    cv = sub.add_parser("convert", help="convert a dataset into a gsim driving log")
    cv.add_argument("format", choices=["kitti-raw", "dgp", "nerfstudio"])
    cv.add_argument("src", help="kitti-raw: the date folder with calib_*.txt; dgp: a scene folder or dataset JSON; "
                                "nerfstudio: transforms.json")
    cv.add_argument("out")
    cv.set_defaults(fn=cmd_convert)

    en = sub.add_parser("export-nerfstudio", help="write a log's cameras as a nerfstudio transforms.json")
    en.add_argument("log")
    en.add_argument("out")
    en.set_defaults(fn=cmd_export_nerfstudio)

    va = sub.add_parser("validate", help="check a driving log and every file it names")
    va.add_argument("log")
    va.set_defaults(fn=cmd_validate)

    rc = sub.add_parser("reconstruct", help="train a surfel scene on a driving log")
    rc.add_argument("log")
    rc.add_argument("out")
    rc.add_argument("--preset", default="cpu", choices=["cpu", "cuda"])
    rc.add_argument("--iterations", type=_int_at_least(1), default=None)
    rc.add_argument("--seed", type=int, default=None)
    rc.add_argument("--downscale", type=_int_at_least(1), default=None,
                    help="train on images box-averaged by this integer factor (recorded in the scene)")
    rc.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    rc.add_argument("--no-movers", action="store_true",
                    help="a log without actor tracks: do not detect its moving objects (they stay in the background)")
    rc.set_defaults(fn=cmd_reconstruct)

    ev = sub.add_parser("eval", help="held-out metrics (PSNR, SSIM, LiDAR depth) and side-by-side images")
    ev.add_argument("scene")
    ev.add_argument("log")
    ev.add_argument("--out", required=True)
    ev.add_argument("--holdout-every", type=_int_at_least(2), default=8)
    ev.add_argument("--downscale", type=_int_at_least(1), default=None,
                    help="box-average the images by this factor (default: the training downscale recorded in the "
                         "scene, else 1; another one is allowed, with a warning)")
    ev.add_argument("--backend", default="auto", choices=backends)
    ev.add_argument("--shifts", type=_distances, default=(), help="comma-separated metres, e.g. 1,2,3: also the "
                    "held-out views shifted sideways (both sides) against the synthetic street's exact images")
    ev.add_argument("--ahead", type=_distances, default=(), help="comma-separated metres: the last held-out frame "
                    "moved ahead beyond the driven path (synthetic logs)")
    _add_repair_args(ev, "also measure every render repaired")
    ev.set_defaults(fn=cmd_eval)
    df = sub.add_parser("diffusion", help="the repair model: a conditional diffusion model trained on your log")
    dsub = df.add_subparsers(dest="diffusion_command", required=True, metavar="ACTION")
    dt = dsub.add_parser("train", help="train a repair model on a log's own renders (degraded reconstructions made "
                                       "on the way) -> a diffusers model directory with a card")
    dt.add_argument("scene")
    dt.add_argument("log")
    dt.add_argument("--out", required=True, help="the model directory (its work files go to OUT-work)")
    dt.add_argument("--steps", type=_int_at_least(1), default=2000)
    dt.add_argument("--crop", type=_int_at_least(8), default=None,
                    help="training crops' side, a multiple of 8 (default: TrainOptions', 64)")
    dt.add_argument("--seed", type=int, default=0)
    dt.add_argument("--resume", action="store_true", help="go on from OUT-work's checkpoint")
    dt.add_argument("--loss", choices=("l1", "l2"), default="l1", help="the denoising loss")
    dt.set_defaults(fn=cmd_diffusion_train)

    ex = sub.add_parser("expand", help="expand a reconstruction off the driven path: repaired novel views distilled "
                                       "back into the scene, stage by stage outward")
    ex.add_argument("scene", help="a reconstruction directory (gsim reconstruct --out) or its scene/ folder: its "
                                  "training checkpoint is continued")
    ex.add_argument("log")
    ex.add_argument("--out", required=True, help="the expanded reconstruction: OUT/scene, OUT/checkpoint.pt, "
                                                 "OUT/expand.json, OUT/pseudo/ (render | repaired pictures)")
    _add_repair_args(ex, "repairs the shifted views", "--model")
    ex.add_argument("--shifts", type=_distances, default=(1.0, 2.0, 3.0), help="comma-separated metres, both sides, "
                    "distilled in increasing order (default 1,2,3)")
    ex.add_argument("--ahead", type=_distances, default=(), help="comma-separated metres: then the last training "
                    "frame's cameras moved ahead, beyond the driven path")
    ex.add_argument("--iterations", type=_int_at_least(1), default=300, help="fine-tuning steps per shift")
    ex.add_argument("--every", type=_int_at_least(1), default=3, help="move every N-th training view")
    ex.add_argument("--pseudo-weight", type=float, default=0.5, help="the repaired views' loss weight (real: 1)")
    ex.add_argument("--seed", type=int, default=0)
    ex.set_defaults(fn=cmd_expand)

    gt = sub.add_parser("truth", help="a synthetic log's exact images along any trajectory (e.g. `gsim trajectory "
                                      "--shift-m 2`): ground truth off the driven path")
    gt.add_argument("log", help="a log written by gsim synth (its street is re-created from the log)")
    gt.add_argument("--trajectory", required=True)
    gt.add_argument("--out", required=True)
    gt.set_defaults(fn=cmd_truth)

    d = sub.add_parser("street", help="build the procedural surfel street and render a drive through it")
    d.add_argument("--out", default="out/street")
    d.add_argument("--frames", type=_int_at_least(2), default=48)
    d.add_argument("--surfels", type=_int_at_least(100), default=100_000)
    d.add_argument("--width", type=_int_at_least(1), default=640)
    d.add_argument("--height", type=_int_at_least(1), default=360)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--fps", type=float, default=10.0)
    d.add_argument("--backend", default="auto", choices=backends)
    d.set_defaults(fn=cmd_street)

    rl = sub.add_parser("render-lidar", help="render LiDAR sweeps of a scene along a LiDAR trajectory")
    rl.add_argument("scene")
    rl.add_argument("--spec", required=True, choices=preset_names(), metavar="PRESET",
                    help=f"a LiDAR preset: {', '.join(preset_names())}")
    rl.add_argument("--trajectory", required=True,
                    help='JSON {"schema_version": 1, "frames": [{"timestamp_us": ..., "T_world_lidar": 4x4}]}')
    rl.add_argument("--out", required=True)
    rl.add_argument("--backend", default="auto", choices=["auto", "numba", "torch"])
    rl.add_argument("--no-rolling", action="store_true",
                    help="hold the sensor (and the actors) still over each sweep instead of moving them per column")
    rl.set_defaults(fn=cmd_render_lidar)

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

    tj = sub.add_parser("trajectory", help="write a render trajectory (for gsim render) along a log camera's path, "
                                           "optionally shifted sideways")
    tj.add_argument("log")
    tj.add_argument("out", help="the trajectory JSON to write")
    tj.add_argument("--camera", default=None, help="the log's camera (default: front, else the first by name)")
    tj.add_argument("--shift-m", type=float, default=0.0,
                    help="sideways shift in the vehicle frame at each pose (metres, positive = left)")
    tj.add_argument("--frames", default="all", choices=["all", "train", "holdout"],
                    help="the log's frames, or its training or held-out ones (see --holdout-every)")
    tj.add_argument("--holdout-every", type=_int_at_least(2), default=8, help="held-out frames: index %% N == 0")
    tj.add_argument("--every", type=_int_at_least(1), default=1, help="keep every N-th of those frames")
    tj.add_argument("--downscale", type=_int_at_least(1), default=1,
                    help="divide the camera's resolution (and intrinsics) by this factor")
    tj.add_argument("--scene", default=None,
                    help="a reconstruction of the log: follow the log's poses as its training refined them")
    tj.set_defaults(fn=cmd_trajectory)
    scn = sub.add_parser("scenario", help="scenario files: validate, apply (the edited scene), render (images, "
                                          "LiDAR, a new log, labels)")
    scn.add_argument("action", choices=["validate", "apply", "render"])
    scn.add_argument("file", help="the scenario YAML")
    scn.add_argument("--check", action="store_true", help="validate: also load the scene and apply the edits")
    scn.add_argument("--out", default=None, help="apply: the scene directory to write (default OUTPUT/scene)")
    scn.add_argument("--backend", default="auto", choices=backends)
    hz = scn.add_mutually_exclusive_group()
    hz.add_argument("--harmonize", default=None, metavar="MODEL_DIR",
                    help="render: repair the region around inserted actors with a repair model (gsim diffusion "
                         "train) so they match the scene; render/ keeps the renders as they were")
    hz.add_argument("--harmonize-pretrained", default=None, metavar="DIR",
                    help="render: the same with a local Stable Diffusion directory (diffusers layout)")
    scn.set_defaults(fn=cmd_scenario)
    cl = sub.add_parser("closed-loop", formatter_class=argparse.RawDescriptionHelpFormatter,
                        help="drive an agent through a scenario with SUMO traffic, with metrics, video, log and MCAP",
                        description=CLOSED_LOOP_HELP)
    cl.add_argument("scenario", nargs="+", help="scenario YAML files or shipped names (stopped-car, lead-car, "
                                                 "traffic); several: a batch")
    cl.add_argument("--agent", default="lidar-aeb", help="replay, privileged, lidar-aeb or module:attribute; "
                                                         "comma-separated: a batch (default lidar-aeb)")
    cl.add_argument("--out", required=True, help="the run directory (a batch: one per scenario/agent/seed and "
                                                 "table.md)")
    cl.add_argument("--seed", default="0", help="SUMO's and the traffic's seed; comma-separated: a batch")
    cl.add_argument("--steps", type=_int_at_least(1), default=None, help="stop after this many steps")
    cl.add_argument("--sumo", choices=("libsumo", "traci", "gui"), default="libsumo",
                    help="how SUMO runs: in this process (libsumo, default), as a process (traci) or with its GUI")
    cl.set_defaults(fn=cmd_closed_loop)
    sv = sub.add_parser("serve", formatter_class=argparse.RawDescriptionHelpFormatter,
                        help="the network sensor API: render cameras and LiDAR and run closed-loop sessions over gRPC",
                        description=SERVE_HELP)
    sv.add_argument("scene", nargs="*", help="reconstruction or scene directories (id: the folder's name), scenario "
                                             "files or shipped scenario names (default: out/demo and the shipped "
                                             "closed-loop scenarios, built on first use)")
    sv.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=_int_at_least(0), default=50051, help="0: any free port (printed)")
    sv.add_argument("--token-file", default=None, help="a file holding the bearer token every call must carry "
                                                       "(or GSIM_SERVE_TOKEN); required unless bound to localhost")
    sv.add_argument("--tls-cert", default=None, help="PEM certificate chain (with --tls-key): serve TLS")
    sv.add_argument("--tls-key", default=None, help="PEM private key")
    sv.add_argument("--workers", type=_int_at_least(1), default=1, help="renders at once (>1 with gsplat only)")
    sv.add_argument("--queue", type=_int_at_least(0), default=16,
                    help="calls admitted beyond the workers; more get RESOURCE_EXHAUSTED")
    sv.add_argument("--max-sessions", type=_int_at_least(1), default=4)
    sv.add_argument("--session-timeout-s", type=float, default=300.0, help="idle sessions are ended after this")
    sv.add_argument("--sessions-dir", default="out/sessions", help="where closed-loop sessions are recorded")
    sv.add_argument("--backend", default="auto", help="camera backend: auto, numba, torch, gsplat")
    sv.set_defaults(fn=cmd_serve)
    lb = sub.add_parser("library", help="the Gaussian asset library: list, show, render, add assets")
    lsub = lb.add_subparsers(dest="library_command", required=True, metavar="ACTION")
    categories = ["car", "truck", "bus", "pedestrian", "cyclist", "motorcycle", "cone", "barrier", "sign", "other"]
    ll = lsub.add_parser("list", help="the assets of a library")
    ll.add_argument("library", nargs="?", default="builtin", help="a library directory, or 'builtin' (default)")
    ll.set_defaults(fn=cmd_library_list)
    ls = lsub.add_parser("show", help="an asset's manifest")
    ls.add_argument("asset")
    ls.add_argument("library", nargs="?", default="builtin")
    ls.set_defaults(fn=cmd_library_show)
    lr = lsub.add_parser("render", help="a picture (.png, --frames 1) or a turntable video (.mp4) of an asset")
    lr.add_argument("asset")
    lr.add_argument("out")
    lr.add_argument("--library", default="builtin")
    lr.add_argument("--frames", type=_int_at_least(1), default=36)
    lr.add_argument("--fps", type=float, default=12.0)
    lr.add_argument("--width", type=_int_at_least(16), default=320)
    lr.add_argument("--height", type=_int_at_least(16), default=240)
    lr.set_defaults(fn=cmd_library_render)
    for name, fn, what in (("add-actor", cmd_library_add_actor, "a reconstructed scene's actor"),
                           ("add-mesh", cmd_library_add_mesh, "a mesh file (OBJ/GLB/PLY/STL) through trimesh"),
                           ("add-ply", cmd_library_add_ply, "a 3DGS/2DGS .ply object")):
        la = lsub.add_parser(name, help=f"add {what} to a library directory")
        if name == "add-actor":
            la.add_argument("scene")
            la.add_argument("actor")
        else:
            la.add_argument(name.split("-")[1])
        la.add_argument("library", help="the library directory (created if missing)")
        la.add_argument("--id", default=None, required=name != "add-actor",
                        help="the asset's id" + (" (default: the actor's)" if name == "add-actor" else ""))
        if name != "add-actor":
            la.add_argument("--category", required=True, choices=categories)
            la.add_argument("--up", default="z", choices=["z", "y", "-y"], help="the file's up axis (glTF: y)")
        if name == "add-mesh":
            la.add_argument("--spacing-m", type=float, default=0.03, help="surfel spacing on the surface")
            la.add_argument("--scale", type=float, default=1.0, help="multiply coordinates by this to get metres")
        la.add_argument("--license", default="unknown")
        la.add_argument("--overwrite", action="store_true")
        la.set_defaults(fn=fn)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    show = warnings.showwarning

    def one_line(message, category, *rest, **kw):
        if issubclass(category, GsimWarning):  # gsim's own warnings: one line, like its errors
            print(f"gsim {args.command}: warning: {message}", file=sys.stderr)
        else:
            show(message, category, *rest, **kw)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = one_line
            return args.fn(args)
    except BrokenPipeError:  # `gsim library list | head`: the reader left early, which is no error of ours
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own recipe: no flush error at exit
        return 0
    except (ValueError, KeyError, FileExistsError, FileNotFoundError, PermissionError, RuntimeError,
            NotImplementedError) as e:
        # bad input and unavailable backends: one clear line, no traceback (a KeyError's text is its argument)
        print(f"gsim {args.command}: error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
