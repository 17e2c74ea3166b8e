"""The bridges layer's commands: ``gsim closed-loop``, ``gsim serve``, ``gsim batch`` and ``gsim view``. SUMO,
gymnasium, gRPC, Ray and viser (the sumo, serve, cluster and viewer extras) load inside the commands."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from gsim.cli_args import add_ros2_bag, camera_backends, finite_float, int_at_least, positive, ros2_bag, seed_list
from gsim.errors import InputError

SERVE_HELP = """Serve scenes over gRPC (the network sensor API: bridges/api/sensor.proto, docs/network_api.md).

Services: gsim.sensor.v1.SensorService (ListScenes, DescribeScene, RenderCamera, RenderLidar, StartSession,
StepSession, EndSession, GetServerInfo), NVIDIA AlpaSim's nre.grpc.protos.sensorsim.SensorsimService (gsim as
AlpaSim's renderer; the alpasim extra; docs/closed_loop.md), grpc.health.v1.Health and server reflection (grpcurl
works without the proto). Python: from gsim.bridges.api.client import SensorClient.

Bound to 127.0.0.1 unless --host says otherwise; then a bearer token is required (--token-file or
GSIM_SERVE_TOKEN) and so is TLS (--tls-cert, --tls-key), since the token would otherwise travel in clear:
--insecure serves plaintext anyway, on a network you trust, with a warning.
"""

CLOSED_LOOP_HELP = """Drive an agent through a scenario in closed loop.

Each step: the agent acts on its observation (rendered cameras and LiDAR, ego state, route; privileged agents
also get the ground-truth boxes) -> the ego's kinematic bicycle model advances one step (0.1 s) -> SUMO steps
with the ego injected, so traffic reacts -> the log's actors (replayed on their tracks) and SUMO's vehicles
(drawn with library assets) are placed -> the sensors render at the new pose -> metrics -> record.

Agents: replay (the logged path and timing), privileged (car following + pure pursuit on ground truth), lidar-aeb
(route following, brakes for LiDAR returns in its path), module:attribute (a class with act(obs)) or
exec:COMMAND (an agent process speaking JSON lines, see gsim.bridges.closed_loop.agents.ProcessAgent),
egodriver:HOST:PORT (an AlpaSim policy) or ros2 (a ROS 2 stack over DDS in lockstep, the --ros2-* flags;
docs/ros2.md).
Shipped scenarios (on the demo street, built on first use): stopped-car (a car stands in the ego's lane),
lead-car (a slower car ahead), traffic (SUMO traffic at a density). OpenSCENARIO files (.xosc): their storyboard
drives their actors, live against the agent's ego, and their StopTrigger ends the run (docs/scenarios.md).

Writes DIR/metrics.json (collision, score = NC x DAC x (5 TTC + 5 EP + 2 C) / 12, route_completion, steps and
each sub-metric), metrics.md, steps.jsonl, video.mp4 (camera | bird's-eye view), log/ (the run as a gsim
driving log) and run.mcap (Foxglove). A failing run keeps every completed step. See docs/closed_loop.md.
"""


def cmd_closed_loop(a) -> int:
    from .closed_loop.agents import load_agent
    from .closed_loop.runner import run, run_batch
    from .closed_loop.scenario import SHIPPED, ensure_demo
    agents = a.agent.split(",") if not a.agent.startswith("exec:") else [a.agent]
    seeds = a.seed
    runs = len(a.scenario) * len(agents) * len(seeds)
    if a.ros2_bag is not None and runs > 1:
        raise InputError(f"--ros2-bag records one run; this is a batch of {runs} (give one scenario, agent and seed)")
    options = {"deadline_s": a.egodriver_deadline_s, "image_format": a.egodriver_image,
               "ros2": _ros2_options(a, agents)}
    for name in agents:
        load_agent(name, **options)  # bad input fails before anything starts
    scenarios = []
    from .openscenario.load import loop_scenario
    for sc in a.scenario:
        _xosc_options_only_for_xosc(a, sc)
        loaded = loop_scenario(sc, _params(a), a.ego, a.scene)  # (an .xosc's storyboard drives its actors, live)
        if sc in SHIPPED:
            ensure_demo(loaded)
        scenarios.append(loaded.with_dynamics(a.dynamics, a.vehicle))
    if len(scenarios) == 1 and len(agents) == 1 and len(seeds) == 1:
        m = run(scenarios[0], agents[0], a.out, seed=seeds[0], max_steps=a.steps, client=a.sumo, video=not a.no_video,
                agent_options=options, ros2_bag=ros2_bag(a))
        print(f"{m['scenario']} / {m['agent']} (seed {m['seed']}): score {m['score']:.3f}, collision {m['collision']}, "
              f"route completion {m['route_completion']:.2f}, {m['steps']} steps in {m['wall_s']:.1f} s -> {a.out}")
        return 0
    rows = run_batch(scenarios, agents, seeds, a.out, max_steps=a.steps, client=a.sumo, video=not a.no_video,
                     agent_options=options)
    print(f"{len(rows)} runs -> {Path(a.out) / 'table.md'}")
    return 0


def _ros2_options(a, agents):
    """--ros2-* (`_ros2_flags`) as the ros2 agent's options (None where none of ``agents`` is ros2)."""
    if "ros2" not in agents:
        return None
    from .ros2.agent import Ros2Options
    topics = []
    for spec in a.ros2_topic:
        key, eq, name = spec.partition("=")
        if not eq:
            raise InputError(f"--ros2-topic {spec}: expected KEY=TOPIC, e.g. command=/my_stack/ackermann_cmd")
        topics.append((key, name))
    return Ros2Options(a.ros2_preset, a.ros2_command, a.ros2_domain_id, a.ros2_deadline_s, tuple(topics))


def _params(a) -> dict:
    from .openscenario.load import parse_params
    return parse_params(a.param)


def _xosc_options_only_for_xosc(a, path: str) -> None:
    if not path.endswith(".xosc") and (a.param or a.ego or a.scene):
        raise InputError(f"{path}: --param, --ego and --scene are for OpenSCENARIO files (.xosc)")


def read_scenario_arg(a):
    """gsim scenario validate/apply/render's reader of FILE: OpenSCENARIO (.xosc, with --param, --ego, --scene) or
    a scenario YAML."""
    if a.file.endswith(".xosc"):
        from .openscenario.load import read_xosc
        return read_xosc(a.file, _params(a), a.ego, a.scene).scenario
    _xosc_options_only_for_xosc(a, a.file)
    from gsim.editing.scenario import load_scenario
    return load_scenario(a.file)


def cmd_scenario_export(a) -> int:
    """gsim scenario export-road FILE OUT.xodr / export FILE OUT_DIR / import FILE.xosc OUT.yaml."""
    if a.target is None:
        what = {"export-road": "the .xodr file", "export": "the folder", "import": "the .yaml file"}[a.action]
        raise InputError(f"gsim scenario {a.action} FILE TARGET: give {what} to write")
    if a.action == "import":
        from .openscenario.load import read_xosc, save_imported
        if not a.file.endswith(".xosc"):
            raise InputError(f"{a.file}: gsim scenario import reads an OpenSCENARIO file (.xosc)")
        imported = read_xosc(a.file, _params(a), a.ego, a.scene)
        save_imported(imported, a.target)
        plan = imported.plan
        print(f"wrote {a.target}: {imported.scenario.name}, {len(plan.entities) - 1 - len(plan.deleted)} actors and "
              f"the ego from {a.file} ({len(plan.deleted)} of the scene's deleted) on {imported.scenario.scene}")
        return 0
    if a.action == "export-road":
        from .closed_loop.opendrive import export_road
        r = export_road(a.file, a.target)
        print(f"wrote {a.target}: the road of {r['source']} as OpenDRIVE ({r['lanes'][0]} lanes forward, "
              f"{r['lanes'][1]} opposite, {r['lane_width_m']:g} m wide; gsim's world frame)")
        return 0
    from .openscenario.export import export_scenario
    path = export_scenario(a.file, a.target)
    print(f"wrote {path} and {path.parent / 'road.xodr'} (OpenSCENARIO 1.3 and OpenDRIVE)")
    return 0


def cmd_batch_closed_loop(a) -> int:
    from .cluster.batch import closed_loop_batch
    from .closed_loop.scenario import SHIPPED, ensure_demo, load_loop_scenario
    for sc in a.scenario:
        if sc in SHIPPED:
            ensure_demo(load_loop_scenario(sc))  # built once here, not by every worker at once
    agents = a.agents.split(",")
    rows = closed_loop_batch(a.scenario, agents, a.seeds, a.out, steps=a.steps, client=a.sumo,
                             address=a.address, num_cpus=a.num_cpus, cpus_per_task=a.cpus_per_task,
                             gpus_per_task=a.gpus_per_task, retries=a.retries,
                             agent_options={"ros2": _ros2_options(a, agents)})
    failed = sum(r["status"] != "done" for r in rows)
    print(f"{len(rows)} runs ({failed} failed) -> {Path(a.out) / 'results.md'}, results.parquet, table.md")
    return 0


def cmd_batch_reconstruct(a) -> int:
    from .cluster.batch import reconstruct_batch
    overrides = {k: v for k, v in (("iterations", a.iterations), ("seed", a.seed), ("downscale", a.downscale))
                 if v is not None}
    rows = reconstruct_batch(a.log, a.out, a.preset, overrides, a.format, address=a.address, num_cpus=a.num_cpus,
                             cpus_per_task=a.cpus_per_task, gpus_per_task=a.gpus_per_task, retries=a.retries)
    failed = sum(r["status"] != "done" for r in rows)
    print(f"{len(rows)} logs ({failed} failed) -> {Path(a.out) / 'results.md'}, results.parquet")
    return 0


def cmd_batch_scenario_render(a) -> int:
    from .cluster.batch import scenario_render_batch
    rows = scenario_render_batch(a.scenario, a.out, a.backend, address=a.address, num_cpus=a.num_cpus,
                                 cpus_per_task=a.cpus_per_task, gpus_per_task=a.gpus_per_task, retries=a.retries)
    failed = sum(r["status"] != "done" for r in rows)
    print(f"{len(rows)} scenarios ({failed} failed) -> {Path(a.out) / 'results.md'}, results.parquet")
    return 0


def _ray_options(p) -> None:
    p.add_argument("--address", default=None, help="a Ray cluster: 'auto' (the one this machine belongs to) or "
                                                   "HOST:PORT (default: a local Ray, started for the batch)")
    p.add_argument("--num-cpus", type=int_at_least(1), default=None, help="a local Ray's CPUs (default: all)")
    p.add_argument("--cpus-per-task", type=positive, default=1.0)
    p.add_argument("--gpus-per-task", type=finite_float(0.0), default=0.0, help="GPUs per task (a fraction shares one)")
    p.add_argument("--retries", type=int_at_least(0), default=1,
                   help="how often a failed task (an error, a dead worker) is retried before it is a failed row")


def _ros2_flags(p) -> None:
    """--agent ros2's flags (`_ros2_options`), on gsim closed-loop and gsim batch closed-loop."""
    p.add_argument("--ros2-preset", choices=("gsim", "autoware"), default="gsim",
                   help="--agent ros2's topics: gsim's (/gsim/..., the command on /ackermann_cmd or /cmd_vel) or "
                        "autoware (AWSIM's: /sensing/..., /vehicle/status/..., /control/command/control_cmd and "
                        "gear_cmd, /vehicle/engage); docs/ros2.md")
    p.add_argument("--ros2-command", choices=("ackermann", "twist", "autoware"), default=None,
                   help="the stack's command: ackermann_msgs/AckermannDriveStamped, geometry_msgs/Twist or "
                        "autoware_control_msgs/Control (default: the preset's: ackermann, autoware)")
    p.add_argument("--ros2-topic", action="append", default=[], metavar="KEY=TOPIC",
                   help="a topic name other than the preset's (repeat; keys: clock, tf, tf_static, odometry, command, "
                        "camera/SENSOR (the prefix of image_raw and camera_info), lidar/SENSOR, velocity_status, "
                        "steering_status, gear_status, control_mode, turn_indicators_status, hazard_lights_status, "
                        "gear_cmd, engage, turn_indicators_cmd, hazard_lights_cmd, emergency_cmd, "
                        "control_mode_request (a service); KEY= publishes or reads nothing "
                        "there; gear_cmd=: the vehicle starts in DRIVE)")
    p.add_argument("--ros2-domain-id", type=int_at_least(0), default=None,
                   help="the DDS domain (default: ROS_DOMAIN_ID, else 0)")
    p.add_argument("--ros2-deadline-s", type=finite_float(0, low_open=True), default=10.0,
                   help="how long gsim waits for the stack's command each step, and for the stack at the start "
                        "(seconds; default 10)")


def _read(option: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise InputError(f"{option} {path}: cannot read it ({e.strerror or e})") from None


def cmd_serve(a) -> int:
    import os
    # the server forks (ffmpeg for run videos, SUMO) while gRPC's threads run: gRPC's fork handlers would
    # skip or hang there, and the children exec at once anyway (read when grpc is first imported)
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    from .closed_loop.scenario import SCENARIOS_DIR, SHIPPED
    from .api.server import Limits, check_exposure, load_served, serve_forever, start
    if bool(a.tls_cert) != bool(a.tls_key):
        raise InputError("--tls-cert and --tls-key: give both (a PEM certificate chain and its private key)")
    token = os.environ.get("GSIM_SERVE_TOKEN") or None
    if a.token_file:
        try:
            token = _read("--token-file", a.token_file).decode().strip()
        except UnicodeDecodeError:
            raise InputError(f"--token-file {a.token_file}: not UTF-8 text") from None
        if not token:
            raise InputError(f"--token-file {a.token_file}: the file is empty")
    tls = (_read("--tls-key", a.tls_key), _read("--tls-cert", a.tls_cert)) if a.tls_cert else None
    check_exposure(a.host, token, tls, a.insecure)  # (start() checks it too; here before the scenes load, minutes)
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
    server = start(served, a.host, a.port, token, tls, limits, a.sessions_dir, backend=a.backend, insecure=a.insecure)
    print(f"gsim serve: listening on {a.host}:{server.port} ({'TLS' if tls else 'plaintext'}, "
          f"{'token required' if token else 'no token'}; {len(served)} scenes; SIGTERM or Ctrl-C stops)", flush=True)
    serve_forever(server)
    return 0


def cmd_view(a) -> int:
    from .browser.viewer import Viewer, open_target, serve_forever
    serve_forever(Viewer(open_target(a.path, a.log), a.host, a.port, a.backend))
    return 0


def _xosc_options(p) -> None:
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="OpenSCENARIO: set a declared parameter (repeatable)")
    p.add_argument("--ego", default=None, help="OpenSCENARIO: the ego entity (default: the one named ego or hero)")
    p.add_argument("--scene", default=None, help="OpenSCENARIO: the gsim scene or reconstruction folder to play it "
                                                  "in (default: its RoadNetwork/SceneGraphFile)")


def register(sub) -> None:
    from .closed_loop.vehicle_models import MODELS, VEHICLES  # (no extra: CommonRoad's package loads in a run)
    scn = sub.choices["scenario"]  # gsim scenario export-road / export: the field's standards (OpenDRIVE, OpenSCENARIO)
    action = next(x for x in scn._actions if x.dest == "action")
    action.choices = [*action.choices, "export-road", "export", "import"]
    next(x for x in scn._actions if x.dest == "file").help = ("the scenario YAML, or an OpenSCENARIO file (.xosc) for "
                                                              "validate, apply, render and import (docs/scenarios.md)")
    scn.add_argument("target", nargs="?", default=None,
                     help="export-road: the OpenDRIVE file to write (FILE: a scenario, a shipped name or a scene "
                          "directory); export: the folder for FILE.xosc and road.xodr; import: the scenario YAML to "
                          "write for FILE.xosc")
    _xosc_options(scn)
    scn.set_defaults(bridged=cmd_scenario_export, load_scenario=read_scenario_arg)
    cl = sub.add_parser("closed-loop", formatter_class=argparse.RawDescriptionHelpFormatter,
                        help="drive an agent through a scenario with SUMO traffic, with metrics, video, log and MCAP",
                        description=CLOSED_LOOP_HELP)
    cl.add_argument("scenario", nargs="+", help="scenario YAML files, OpenSCENARIO files (.xosc; docs/scenarios.md) "
                                                 "or shipped names (stopped-car, lead-car, traffic); several: a batch")
    cl.add_argument("--agent", default="lidar-aeb", help="replay, privileged, lidar-aeb, module:attribute, "
                                                         "egodriver:HOST:PORT (an AlpaSim policy server; "
                                                         "egodriver:unix:///path too) or ros2 (a ROS 2 stack over "
                                                         "DDS, --ros2-*); comma-separated: a batch (default lidar-aeb)")
    cl.add_argument("--out", required=True, help="the run directory (a batch: one per scenario/agent/seed and "
                                                 "table.md)")
    cl.add_argument("--seed", type=seed_list, default=(0,), help="SUMO's and the traffic's seed; comma-separated: a batch")
    cl.add_argument("--steps", type=int_at_least(1), default=None, help="stop after this many steps")
    cl.add_argument("--sumo", choices=("libsumo", "traci", "gui"), default="libsumo",
                    help="how SUMO runs: in this process (libsumo, default), as a process (traci) or with its GUI")
    cl.add_argument("--no-video", action="store_true", help="write no video.mp4 (no ffmpeg needed)")
    cl.add_argument("--egodriver-deadline-s", type=finite_float(0, low_open=True), default=10.0,
                    help="an egodriver policy's deadline for each call (seconds; default 10)")
    cl.add_argument("--egodriver-image", choices=("jpeg", "png"), default="jpeg",
                    help="how camera images go to an egodriver policy (default jpeg)")
    _ros2_flags(cl)
    cl.add_argument("--dynamics", choices=("bicycle",) + MODELS, default=None,
                    help="the ego's vehicle model: gsim's kinematic bicycle, or CommonRoad's kinematic single track "
                         "(ks), single track with tyre slip (st), with drivetrain (std) or multi-body (mb) (the "
                         "dynamics extra); default: the scenario's ego.dynamics, else bicycle")
    cl.add_argument("--vehicle", type=int, choices=tuple(VEHICLES), default=None,
                    help="CommonRoad's parameter set: " + ", ".join(f"{k} {v}" for k, v in VEHICLES.items())
                         + " (default: the scenario's ego.vehicle, else 2 for CommonRoad's models)")
    add_ros2_bag(cl)
    _xosc_options(cl)
    cl.set_defaults(fn=cmd_closed_loop)

    sv = sub.add_parser("serve", formatter_class=argparse.RawDescriptionHelpFormatter,
                        help="the network sensor API: render cameras and LiDAR and run closed-loop sessions over gRPC",
                        description=SERVE_HELP)
    sv.add_argument("scene", nargs="*", help="reconstruction or scene directories (id: the folder's name), scenario "
                                             "files (.yaml, OpenSCENARIO .xosc) or shipped scenario names (default: "
                                             "out/demo and the shipped closed-loop scenarios, built on first use)")
    sv.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=int_at_least(0), default=50051, help="0: any free port (printed)")
    sv.add_argument("--token-file", default=None, help="a file holding the bearer token every call must carry "
                                                       "(or GSIM_SERVE_TOKEN); required unless bound to localhost")
    sv.add_argument("--tls-cert", default=None, help="PEM certificate chain (with --tls-key): serve TLS; required "
                                                     "with a token unless bound to localhost (or --insecure)")
    sv.add_argument("--tls-key", default=None, help="PEM private key")
    sv.add_argument("--insecure", action="store_true", help="bound to another address with a token but without "
                    "TLS: serve plaintext anyway (the token travels in clear; a trusted network only), with a warning")
    sv.add_argument("--workers", type=int_at_least(1), default=1, help="renders at once (>1 with gsplat only)")
    sv.add_argument("--queue", type=int_at_least(0), default=16,
                    help="calls admitted beyond the workers; more get RESOURCE_EXHAUSTED")
    sv.add_argument("--max-sessions", type=int_at_least(1), default=4)
    sv.add_argument("--session-timeout-s", type=positive, default=300.0, help="idle sessions are ended after this")
    sv.add_argument("--sessions-dir", default="out/sessions", help="where closed-loop sessions are recorded")
    sv.add_argument("--backend", default="auto", choices=camera_backends(), help="the camera backend")
    sv.set_defaults(fn=cmd_serve)

    ba = sub.add_parser("batch", help="many logs or episodes as Ray tasks, on this machine or a cluster (the "
                                      "cluster extra): resumable, failures isolated, results.parquet")
    bs = ba.add_subparsers(dest="batch", metavar="JOB", required=True)
    br = bs.add_parser("reconstruct", help="reconstruct and evaluate every log (one task each) into OUT/<log name>/")
    br.add_argument("log", nargs="+", help="gsim logs, or folders `gsim convert FORMAT` takes (with --format)")
    br.add_argument("--out", required=True)
    br.add_argument("--format", default=None, help="convert each input with `gsim convert FORMAT` first")
    br.add_argument("--preset", default="cpu", choices=["cpu", "cuda"])
    br.add_argument("--iterations", type=int_at_least(1), default=None)
    br.add_argument("--seed", type=int_at_least(0), default=None)
    br.add_argument("--downscale", type=int_at_least(1), default=None)
    _ray_options(br)
    br.set_defaults(fn=cmd_batch_reconstruct)
    bc = bs.add_parser("closed-loop", help="every scenario x agent x seed (one task each) into gsim closed-loop's "
                                           "batch folders, with per-agent aggregates")
    bc.add_argument("scenario", nargs="+", help="scenario YAML files or shipped names")
    bc.add_argument("--agents", default="lidar-aeb", help="comma-separated agents (see gsim closed-loop; ros2's "
                                                           "episodes run one at a time, beside the others)")
    bc.add_argument("--seeds", type=seed_list, default=(0,), help="e.g. 0-99 or 0,3,7")
    bc.add_argument("--steps", type=int_at_least(1), default=None, help="stop each run after this many steps")
    bc.add_argument("--out", required=True)
    bc.add_argument("--sumo", choices=("libsumo", "traci"), default="libsumo",
                    help="SUMO in each worker process (libsumo: one per process) or as its own process (traci)")
    _ros2_flags(bc)
    _ray_options(bc)
    bc.set_defaults(fn=cmd_batch_closed_loop)
    bsr = bs.add_parser("scenario-render", help="render every scenario (one task each) into its own output folder, "
                                                "as gsim scenario render: data generation")
    bsr.add_argument("scenario", nargs="+", help="scenario YAML files")
    bsr.add_argument("--out", required=True, help="where results.parquet and results.md go")
    bsr.add_argument("--backend", default="auto", choices=camera_backends())
    _ray_options(bsr)
    bsr.set_defaults(fn=cmd_batch_scenario_render)

    vw = sub.add_parser("view", help="look at a scene in the browser (viser): gsim's own renders at the browser "
                                     "camera, time, actors, log cameras, LiDAR")
    vw.add_argument("path", help="a scene, reconstruction (gsim reconstruct / gsim demo), scenario-output or "
                                 "closed-loop run directory")
    vw.add_argument("--log", default=None, help="the log to show beside it (default: the reconstruction's own)")
    vw.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this machine only)")
    vw.add_argument("--port", type=int_at_least(0), default=8080, help="0: any free port (printed)")
    vw.add_argument("--backend", default="auto", choices=camera_backends(), help="the camera backend")
    vw.set_defaults(fn=cmd_view)
