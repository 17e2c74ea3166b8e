"""The closed loop: an agent drives the ego through an edited, reconstructed scene with SUMO traffic.

One step (docs/architecture.md): the agent acts on the last observation -> the ego's dynamics advance one step ->
SUMO steps with the ego injected -> actors are placed in the scene (the log's own on their tracks, SUMO's
as library assets chosen by vehicle class) -> the sensors render at the ego's new pose and time -> the
metrics -> the record. Fixed step (the scenario's, 0.1 s by default), deterministic for a seed.

Frames: the ego state is the rear axle on the ground plane (gsim.bridges.closed_loop.dynamics); the log's vehicle frame
is taken to have its origin there, lifted by the height it had above the scene's ground at the run's start.
Heights and tilts of every box come from the scene's own ground (`GroundGrid`). SUMO's frame is converted in
`gsim.bridges.closed_loop.sumo` only.
"""
from __future__ import annotations

import contextlib
import math
import tempfile
import time
from concurrent import futures
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from gsim.errors import GsimError, InputError
from gsim.scene import Actor

from .dynamics import ActionError, BicycleModel, Controls, EgoState, TrajectoryTracker, VehicleParams
from .metrics import Box, EgoKinematics, MetricsTracker
from .road import Road
from .scenario import LoopScenario
from .vehicle_models import CommonRoadModel, vehicle_limits


GROUND_CELL_M = 2.0
ROUTE_AHEAD_M = 60.0  # an observation's route: this far ahead, a point a metre
ROUTE_POINTS = int(ROUTE_AHEAD_M) + 1
WAYPOINT_TIMES_S = np.arange(0.5, 3.01, 0.5)  # the times of waypoint actions (replay, the Gymnasium env)
ASSETS_OF_VCLASS = {"passenger": ("sedan", "suv"), "truck": ("truck",), "bus": ("bus",), "motorcycle": ("cyclist",)}
SUMO_CLASSES = ("car", "truck", "bus")  # the log's actors SUMO can take over (mode: sumo)
VCLASS_OF = {"car": "passenger", "truck": "truck", "bus": "bus"}


class LoopError(GsimError, RuntimeError):
    """A closed-loop run that cannot go on (a SUMO fault, an agent's bad action): names the step."""


class EndRun(Exception):
    """Raised by an agent's ``act`` to end the run before its last step (an egodriver policy's terminate_session):
    the run stops there as completed, its metrics saying why (``ended_by_agent``)."""


@dataclass(frozen=True)
class Observation:
    """What an agent sees at a step. Sensors: cameras {name: uint8 (H,W,3)}, lidars {name: (N,5) float32
    x, y, z, intensity, time offset us from the sweep's start a step ago, in the sensor's frame (of each return's
    own firing time)}, their range images {name: (lasers, columns) m, 0 = no return} and each return's laser
    index {name: (N,)} (for recordings; not sent over the network API); ``route`` (ROUTE_POINTS,2) the route
    ahead in the ego (rear-axle) frame, 1 m apart; ``actors`` ground-truth boxes (privileged agents only)."""

    step: int
    timestamp_us: int
    ego: EgoState
    T_world_vehicle: np.ndarray
    route: np.ndarray
    cameras: Dict[str, np.ndarray]
    lidars: Dict[str, np.ndarray]
    lidar_ranges: Dict[str, np.ndarray]
    actors: Tuple[Box, ...]
    lidar_rings: Dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class LoopInfo:
    """What an agent may know before the run: the route (world x-y polyline), the vehicle, the step, the
    target speed, the scenario's name and the logged ego path (`T_world_vehicle(t_us)` within
    ``logged_until_us``, for replay), the sensors' mounts, the cameras {name: (camera model, T_vehicle_camera)},
    the ego frame's height over the rear axle's point on the ground (m) and the run's seed."""

    route_xy: np.ndarray
    params: VehicleParams
    step_s: float
    target_speed_mps: float
    scenario: str
    logged_pose: Callable[[int], np.ndarray]
    logged_until_us: int
    T_vehicle_lidar: Dict[str, np.ndarray]
    cameras: Dict[str, tuple] = field(default_factory=dict)
    rig_height_m: float = 0.0
    seed: int = 0


class GroundGrid:
    """The scene's ground (planes z = a x + b y + c fitted to its ground surfels, `gsim.editing`'s `Ground`)
    in GROUND_CELL_M cells along every lane, fitted once; a query takes the nearest fitted cell's plane."""

    def __init__(self, background, road: Road):
        from scipy.spatial import cKDTree

        from gsim.boxes import footprint
        from gsim.editing.edits import EditError, Ground
        ground = Ground(background)
        if len(ground.xyz) == 0:
            raise LoopError("the scene has no ground surfels (upward-facing background surfels) to drive on")
        lo, hi = ground.xyz[:, :2].min(0) - GROUND_CELL_M, ground.xyz[:, :2].max(0) + GROUND_CELL_M
        centres, planes = [], []
        for lane in road.lanes:
            pts, yaw = lane.centre.at(np.arange(0.0, lane.centre.length, GROUND_CELL_M))
            for p, h in zip(pts, yaw):
                if np.any(p < lo) or np.any(p > hi):
                    continue
                T = np.eye(4)
                T[:2, :2] = [[math.cos(h), -math.sin(h)], [math.sin(h), math.cos(h)]]
                T[:2, 3] = p
                try:
                    planes.append(ground.plane(footprint(T, (GROUND_CELL_M + 1, lane.width_m, 1.0)), "ground"))
                except EditError:
                    continue
                centres.append(p)
        if not centres:
            raise LoopError("the road lies nowhere over the scene's ground: is the road built from this log?")
        self.centres, self.planes = np.array(centres), np.array(planes)
        self.tree = cKDTree(self.centres)

    def plane(self, x: float, y: float) -> np.ndarray:
        return self.planes[self.tree.query((x, y))[1]]

    def pose(self, x: float, y: float, yaw: float, lift: float = 0.0) -> np.ndarray:
        """T_world on the ground at (x, y) heading ``yaw`` (tilted with the ground), raised ``lift`` m along
        its own z."""
        return self.poses([x], [y], [yaw], [lift])[0]

    def poses(self, x, y, yaw, lift) -> np.ndarray:
        """(N,4,4) `pose` at N places at once (one tree query: a step places dozens of vehicles, twice each)."""
        x, y, yaw, lift = (np.asarray(v, np.float64) for v in (x, y, yaw, lift))
        a, b, c = self.planes[self.tree.query(np.stack([x, y], 1))[1]].T
        n = np.stack([-a, -b, np.ones_like(a)], 1) / np.sqrt(a * a + b * b + 1)[:, None]
        fwd = np.stack([np.cos(yaw), np.sin(yaw), np.zeros_like(yaw)], 1)
        fwd -= n * (fwd * n).sum(1, keepdims=True)
        fwd /= np.linalg.norm(fwd, axis=1, keepdims=True)
        T = np.tile(np.eye(4), (len(x), 1, 1))
        T[:, :3, 0], T[:, :3, 1], T[:, :3, 2] = fwd, np.cross(n, fwd), n
        T[:, :3, 3] = np.stack([x, y, a * x + b * y + c], 1) + lift[:, None] * n
        return T


def _speed_at(ts: np.ndarray, poses: np.ndarray, t_us: int, half_us: int = 50_000) -> float:
    """The logged speed (m/s) at ``t_us``: a central difference, one-sided at the track's ends."""
    from gsim.transforms import interpolate_poses
    t0, t1 = max(t_us - half_us, int(ts[0])), min(t_us + half_us, int(ts[-1]))
    if t1 <= t0:
        return 0.0
    a, b = interpolate_poses(ts, poses, [t0, t1])
    return float(np.linalg.norm(b[:2, 3] - a[:2, 3]) / ((t1 - t0) * 1e-6))


class ClosedLoop:
    """One closed-loop run of a scenario (see the module docstring). ``reset()`` gives the first
    observation, ``step(action)`` advances one step and returns (observation, step metrics, done);
    ``summary()`` the run's metrics. ``action``: `Controls` or timed ego-frame waypoints (K,3) (t_s, x, y),
    which the built-in `TrajectoryTracker` turns into controls. ``client``: how SUMO runs: 'libsumo' (in
    this process, the fastest, one simulation per process), 'traci' (a SUMO process) or 'gui' (sumo-gui)."""

    def __init__(self, scenario: LoopScenario, seed: int = 0, render: bool = True, client: str = "libsumo",
                 workdir: Optional[Path] = None, progress: bool = False):
        from gsim.editing.world import apply
        from gsim.editing.outputs import mounted_rig
        self.scenario, self.seed, self.render_sensors, self.client = scenario, int(seed), render, client
        cl = scenario.closed_loop
        self.world = world = apply(scenario, progress=progress, ego_overlaps=True)
        log = self.log = world.log
        ego = scenario.ego
        self.vehicle = scenario.vehicle_id  # CommonRoad's parameter set, or None: gsim's own VehicleParams
        limits = {} if self.vehicle is None else vehicle_limits(self.vehicle)
        self.params = VehicleParams.from_dict({**VehicleParams().to_dict(), "length_m": ego.size_m[0],
                                               "width_m": ego.size_m[1], "height_m": ego.size_m[2],
                                               "rear_axle_to_centre_m": ego.box_offset_m[0], **limits,
                                               **cl.vehicle})
        self.dt = cl.step_s
        self.dt_us = int(round(cl.step_s * 1e6))
        self.t0 = int(world.frames[0].timestamp_us)
        span = (world.frames[-1].timestamp_us - self.t0) * 1e-6
        duration = cl.duration_s if cl.duration_s is not None else max(span, self.dt)
        self.n_steps = max(1, int(round(duration / self.dt)))
        # the route: the (edited) ego path; the run's part is where the logged ego is over the run's time
        ts, poses = world.ego_timestamps_us, world.ego_poses
        path = poses[:, :2, 3]
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="gsim-loop-"))
        self.network = network(cl.road, path, self.workdir)
        # progress is measured at the ego box's centre, as the metrics do
        centre = lambda P: P[:2, 3] + self.params.rear_axle_to_centre_m * P[:2, 0]  # noqa: E731
        end = centre(world.T_world_vehicle(self.t0 + self.n_steps * self.dt_us))
        start = centre(world.T_world_vehicle(self.t0))
        route = _extended(path, 200.0)
        self.road = Road.build(self.network.lanes(), route, start, end)
        self.ground = GroundGrid(world.scene.background, self.road)
        P0 = world.T_world_vehicle(self.t0)
        a, b, c = self.ground.plane(P0[0, 3], P0[1, 3])
        self.lift = float(P0[2, 3] - (a * P0[0, 3] + b * P0[1, 3] + c))
        target = cl.target_speed_mps or max(self.road.length_m / duration, 1.0)
        self.cameras, self.lidars = mounted_rig(log, scenario.sensors)
        self.info = LoopInfo(route, self.params, self.dt, float(target), scenario.name, world.T_world_vehicle,
                             int(ts[-1]), {n: log.lidars[n].T_vehicle_lidar for n in log.lidars}, dict(self.cameras),
                             self.lift, self.seed)
        self.model = (BicycleModel(self.params) if ego.dynamics == "bicycle"
                      else CommonRoadModel(ego.dynamics, self.vehicle, self.params))
        self.tracker = TrajectoryTracker(self.params)
        self.traffic = None
        self._pool = None  # the LiDARs' render thread, started with the first step that renders
        self._renderer = None  # the scene resident where it renders (gsim.resident), made by the first such step
        self._templates: Dict[str, Actor] = {}
        self._handed = set()
        self.script = scenario.storyboard() if scenario.storyboard is not None else None  # an OpenSCENARIO storyboard
        self.ended_by_scenario: Optional[str] = None

    # ------------------------------------------------------------------ the run
    def reset(self) -> Observation:
        """The run's first observation (the ego where the log has it, at its logged speed)."""
        world = self.world
        P = world.T_world_vehicle(self.t0)
        yaw = math.atan2(P[1, 0], P[0, 0])
        speed = _speed_at(world.ego_timestamps_us, world.ego_poses, self.t0)
        self.state = EgoState(float(P[0, 3]), float(P[1, 3]), yaw, speed, 0.0, 0.0, self.t0)
        self.step_index = 0
        self.timings: Dict[str, List[float]] = {}
        self.tracker.reset()
        self._close_traffic()
        self.traffic_vehicles = []
        self._handed, self._handover_done = set(), False
        from .sumo import SumoError
        try:
            self._start_traffic()
        except (SumoError, InputError) as e:
            raise LoopError(f"step 0: SUMO could not start the scenario's traffic: {e}") from None
        self.prev_T = self.ground.pose(*self._along(-self.dt), self.state.yaw_rad, self.lift)
        self.controls = Controls(0.0, 0.0)
        self.ended_by_scenario = None
        if self.script is not None:
            self.script.start(self.t0, self._ego_reference())
            self._scripted = self._scripted_now()
        kin = EgoKinematics(speed, 0.0, 0.0)
        self.metrics = MetricsTracker(self.road, self.dt, self.road.length_m, kin)  # EP's reference: the log's
        return self._observe()

    def step(self, action) -> Tuple[Observation, dict, bool]:
        """Advance one step with the agent's ``action`` (see the class docstring)."""
        k = self.step_index + 1
        if isinstance(action, Controls):
            controls = action
        else:
            try:
                controls = self.tracker.controls(self.state, np.asarray(action, np.float64), self.dt)
            except (TypeError, ValueError) as e:
                raise ActionError(f"step {k}: the agent's waypoints are not usable ({e})") from None
        controls.check(k)
        p = self.params
        inside = (-p.max_decel_mps2 - 1e-9 <= controls.accel_mps2 <= p.max_accel_mps2 + 1e-9
                  and abs(controls.steer_rate_rps) <= p.max_steer_rate_rps + 1e-9)
        if isinstance(action, Controls) and not inside:  # (the tracker's own output is clipped by the model)
            raise ActionError(f"step {k}: the agent's controls (acceleration {controls.accel_mps2:.3g} m/s^2, "
                              f"steering rate {controls.steer_rate_rps:.3g} rad/s) leave the vehicle's limits "
                              f"[-{p.max_decel_mps2}, {p.max_accel_mps2}] m/s^2 and +-{p.max_steer_rate_rps} rad/s")
        self.controls = controls
        self.prev_T = self.T_world_vehicle()
        with self.timer("dynamics"):
            self.state = self.model.step(self.state, controls, self.dt)
        self.step_index = k
        with self.timer("sumo"):
            self._step_traffic()
        if self.script is not None:
            with self.timer("storyboard"):
                self._step_script()
        obs = self._observe()
        with self.timer("metrics"):
            kin = EgoKinematics(self.state.speed_mps, self.state.accel_mps2, self.model.yaw_rate(self.state))
            m = self.metrics.step(self.state.timestamp_us, self.ego_box(), kin, obs.actors)
        return obs, m, k >= self.n_steps or self.ended_by_scenario is not None

    def summary(self) -> dict:
        return self.metrics.summary()

    def dynamics_record(self, controls: Optional[Controls]) -> dict:
        """The ego model's record of the step that ended now under ``controls`` (None: the start), for steps.jsonl:
        model, vehicle, x (its state), u (the inputs it applied over the step), dt, substeps, integrator."""
        r = self.model.record(self.state, controls, self.dt)
        return {"model": r.pop("model"), "vehicle": self.vehicle, **r}

    def close(self) -> None:
        self._close_traffic()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._own_workdir:
            import shutil
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "ClosedLoop":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ the world at the current step
    def T_world_vehicle(self) -> np.ndarray:
        s = self.state
        return self.ground.pose(s.x_m, s.y_m, s.yaw_rad, self.lift)

    def ego_box(self) -> Box:
        s, p = self.state, self.params
        cx, cy = s.box_centre_xy(p)
        T = self.ground.pose(cx, cy, s.yaw_rad, p.height_m / 2)
        return Box("ego", "car", cx, cy, float(T[2, 3]), s.yaw_rad, p.length_m, p.width_m, p.height_m,
                   s.speed_mps * math.cos(s.yaw_rad), s.speed_mps * math.sin(s.yaw_rad))

    def scene_at(self):
        """The scene at the current step: the log's (edited) actors on their tracks, SUMO's vehicles (a log
        actor handed to SUMO keeps its own surfels, the others are library assets) and a storyboard's actors, each
        with a track over the last step (back along its velocity, and now: a rolling LiDAR sweep sees it move) and a
        step ahead (its velocity)."""
        t = self.state.timestamp_us
        own = {a.id: a for a in self.world.scene.actors}
        actors = [a for a in self.world.scene.actors if a.id not in self._handed]
        if self.script is not None:  # the storyboard's actors where it has them now, and a step ago
            actors = [self._scripted_actor(a, t) if a.id in self._scripted[1] else a for a in actors]
        vs = self.traffic_vehicles
        bases = [own[v.id] if v.id in self._handed else self._template(v) for v in vs]
        if vs:  # every vehicle's poses in one batch: a step back along its velocity, now, and a step ahead (its
            # boxes' velocity, `actor_boxes`)
            x, y, yaw, speed = (np.array([getattr(v, k) for v in vs]) for k in ("x", "y", "yaw", "speed_mps"))
            step = speed * self.dt
            h = np.array([b.size[2] / 2 for b in bases])
            P = self.ground.poses(np.r_[x - step * np.cos(yaw), x, x + step * np.cos(yaw)],
                                  np.r_[y - step * np.sin(yaw), y, y + step * np.sin(yaw)],
                                  np.r_[yaw, yaw, yaw], np.r_[h, h, h]).reshape(3, len(vs), 4, 4)
            times = np.array([t - self.dt_us, t, t + self.dt_us])
            actors += [replace(b, id=v.id, track_timestamps_us=times, track_poses=P[:, k])
                       for k, (v, b) in enumerate(zip(vs, bases))]
        return replace(self.world.scene, actors=tuple(actors))

    # ------------------------------------------------------------------ an OpenSCENARIO storyboard
    def _ego_reference(self) -> Tuple[float, float, float, float]:
        s = self.state
        return s.x_m, s.y_m, s.yaw_rad, s.speed_mps

    def _scripted_now(self) -> tuple:
        """(the storyboard's actors a step ago, now): {id: (box centre x, y, heading, speed)} each."""
        now = self.script.actors()
        back = {n: (x - v * self.dt * math.cos(h), y - v * self.dt * math.sin(h), h, v)
                for n, (x, y, h, v) in now.items()}
        return back, now

    def _step_script(self) -> None:
        t = self.state.timestamp_us
        try:
            self.script.step(t, self._ego_reference())
        except InputError as e:  # (a lane change to a lane the road lacks, found when it happens)
            raise LoopError(f"step {self.step_index}: the scenario's storyboard: {e}") from None
        self._scripted = (self._scripted[1], self.script.actors())
        if self.script.stopped and self.ended_by_scenario is None:
            self.ended_by_scenario = f"the scenario's StopTrigger at t = {(t - self.t0) * 1e-6:.2f} s"

    def _scripted_actor(self, a: Actor, t: int) -> Actor:
        """A storyboard actor's track: a step ago, now, and a step ahead at its speed (its boxes' velocity)."""
        (x0, y0, h0, _), (x1, y1, h1, v) = self._scripted[0][a.id], self._scripted[1][a.id]
        ahead = v * self.dt
        x2, y2 = x1 + ahead * math.cos(h1), y1 + ahead * math.sin(h1)
        P = self.ground.poses([x0, x1, x2], [y0, y1, y2], [h0, h1, h1], [a.size[2] / 2] * 3)
        return replace(a, track_timestamps_us=np.array([t - self.dt_us, t, t + self.dt_us]), track_poses=P)

    def actor_boxes(self, scene) -> Tuple[Box, ...]:
        t = self.state.timestamp_us
        boxes = []
        for a in scene.actors:
            P, Q = a.pose_at(t), a.pose_at(t + self.dt_us)
            v = (Q[:2, 3] - P[:2, 3]) / self.dt
            boxes.append(Box(a.id, a.category, float(P[0, 3]), float(P[1, 3]), float(P[2, 3]),
                             math.atan2(P[1, 0], P[0, 0]), *map(float, a.size), float(v[0]), float(v[1])))
        return tuple(boxes)

    @contextlib.contextmanager
    def timer(self, stage: str):
        """Adds the block's wall time to ``timings[stage]`` (seconds, one entry per step)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.timings.setdefault(stage, []).append(time.perf_counter() - t)

    def _observe(self) -> Observation:
        with self.timer("actors"):
            scene = self.scene_at()
            boxes = self.actor_boxes(scene)
        T = self.T_world_vehicle()
        t = self.state.timestamp_us
        cams, lidars, ranges, rings = {}, {}, {}, {}
        if self.render_sensors:
            from gsim.resident import Renderer
            if self._renderer is None:
                self._renderer = Renderer(scene)
            else:  # the same surfel sets on new tracks stay where they are
                self._renderer.update(scene)
            with self.timer("sensors"):
                # the LiDARs in a worker thread while the cameras render here: on a CPU each renderer leaves a core
                # idle in its serial parts (two threads make either 1.3x faster, not 2x), which the other one fills;
                # on a GPU the host's Python of one overlaps the GPU work of the other
                import numba
                args = (scene, self.prev_T, T, t, numba.get_num_threads())
                beside = self.lidars and self._renderer.lidar_beside_cameras
                sweeps = self._worker().submit(self._sweeps, *args) if beside else None
                try:
                    with self.timer("cameras"):  # every camera of the step in one call (gsplat: one batch)
                        views = [(cam, T @ T_vc, n) for n, (cam, T_vc) in self.cameras.items()]
                        cams = dict(zip(self.cameras, self._renderer.images(views, t)))  # (GPU: rgb alone, 8 bits)
                finally:  # a camera's error waits for the sweeps too: nothing renders on past the step
                    if sweeps is not None:
                        futures.wait([sweeps])
                lidars, ranges, rings, took = sweeps.result() if sweeps is not None else self._sweeps(*args)
                self.timings.setdefault("lidars", []).append(took)
        s = self.state
        return Observation(self.step_index, t, s, T, self.road.ahead((s.x_m, s.y_m), s.yaw_rad, ROUTE_AHEAD_M), cams,
                           lidars, ranges, boxes, rings)

    def _worker(self):
        if self._pool is None:
            self._pool = futures.ThreadPoolExecutor(1, thread_name_prefix="gsim-lidar")
        return self._pool

    def _sweeps(self, scene, prev_T: np.ndarray, T: np.ndarray, t: int, threads: int):
        """Every LiDAR's sweep over the last step (from the vehicle's previous pose to this one) with ``threads``
        numba threads (a per-thread setting): points (N,5), range images and rings by name, and the wall time (s)."""
        import numba
        from gsim.lidar import render_lidar
        start = time.perf_counter()
        numba.set_num_threads(threads)
        lidars, ranges, rings = {}, {}, {}
        for n, (spec, T_vl) in self.lidars.items():
            f = render_lidar(scene, spec, (np.array([t - self.dt_us, t]), np.stack([prev_T @ T_vl, T @ T_vl])),
                             backend=self._renderer.lidar_backend, timestamp_us=t - self.dt_us)
            inten = f.intensity if f.intensity is not None else np.zeros(len(f.ranges), np.float32)
            lidars[n] = np.c_[f.points, inten, f.time_offset_us].astype(np.float32)
            ranges[n] = f.range_image.astype(np.float32)
            rings[n] = f.ring
        return lidars, ranges, rings, time.perf_counter() - start

    def _along(self, dt_s: float) -> Tuple[float, float]:
        """The rear axle ``dt_s`` from now at the current speed and heading (x, y)."""
        s = self.state
        return (s.x_m + s.speed_mps * dt_s * math.cos(s.yaw_rad), s.y_m + s.speed_mps * dt_s * math.sin(s.yaw_rad))

    # ------------------------------------------------------------------ traffic
    def _template(self, v) -> Actor:
        """The library actor drawn for a SUMO vehicle (one per asset: vehicles share its surfels)."""
        from gsim.editing import AssetLibrary
        from gsim.editing.edits import asset_actor
        choices = ASSETS_OF_VCLASS.get(v.vclass, ("sedan",))
        asset_id = choices[sum(map(ord, v.id)) % len(choices)]  # stable per vehicle, varied across them
        if asset_id not in self._templates:
            lib = AssetLibrary.builtin() if self.scenario.library == "builtin" else AssetLibrary(self.scenario.library)
            self._templates[asset_id] = asset_actor(self.world.scene, lib.get(asset_id), asset_id, [0], [np.eye(4)])
        return self._templates[asset_id]

    def _needs_traffic(self) -> bool:
        tr = self.scenario.closed_loop.traffic
        return tr.density_per_km_lane > 0 or bool(tr.vehicles) or self.scenario.closed_loop.log_actors.mode == "sumo"

    def _start_traffic(self) -> None:
        if not self._needs_traffic():
            return
        from .sumo import SumoTraffic
        cl = self.scenario.closed_loop
        self.traffic = SumoTraffic(self.network, step_s=self.dt, seed=self.seed, begin_s=self.t0 * 1e-6,
                                   client="traci" if self.client == "gui" else self.client, gui=self.client == "gui")
        cx, cy = self.state.box_centre_xy(self.params)
        self.traffic.add_ego(cx, cy, self.state.yaw_rad, self.state.speed_mps, self.params.length_m,
                             self.params.width_m)
        s_ego = float(self.network.route_distance(np.array([[cx, cy]]))[0])  # along SUMO's forward route
        for i, v in enumerate(cl.traffic.vehicles):
            pos = v.pos_m + (s_ego if v.route == "forward" else 0.0)
            self.traffic.add_vehicle(f"vehicle_{i}", v.route, v.lane, pos, v.speed_mps, v.vclass)
        if cl.traffic.density_per_km_lane > 0:
            self.traffic.spawn_density(cl.traffic.density_per_km_lane, self.seed, dict(cl.traffic.vclass_mix),
                                       keep_clear_m=tuple(cl.traffic.keep_clear_m))

    def _step_traffic(self) -> None:
        if self.traffic is None:
            return
        from .sumo import SumoError
        la = self.scenario.closed_loop.log_actors
        t = self.state.timestamp_us
        try:
            if la.mode == "sumo" and not self._handover_done and t >= self.t0 + la.handover_s * 1e6:
                self._handover_done = True
                for a in self.world.scene.actors:
                    if a.category in SUMO_CLASSES and self.road.on_road(a.pose_at(t)[:2, 3][None])[0]:
                        P, Q = a.pose_at(t), a.pose_at(t + self.dt_us)
                        speed = float(np.linalg.norm(Q[:2, 3] - P[:2, 3]) / self.dt)
                        self.traffic.add_at(a.id, P[0, 3], P[1, 3], math.atan2(P[1, 0], P[0, 0]), speed,
                                            VCLASS_OF[a.category], a.size[0], a.size[1])
                        self._handed.add(a.id)
            cx, cy = self.state.box_centre_xy(self.params)
            self.traffic.set_ego(cx, cy, self.state.yaw_rad, self.state.speed_mps)
            self.traffic_vehicles = self.traffic.step()
        except SumoError as e:
            raise LoopError(f"step {self.step_index}: SUMO failed: {e}") from None

    def _close_traffic(self) -> None:
        if self.traffic is not None:
            self.traffic.close()
            self.traffic = None


def _extended(path: np.ndarray, extra_m: float, base_m: float = 2.0) -> np.ndarray:
    """The path with straight extensions of ``extra_m`` at both ends, along the direction over its first and
    last ``base_m`` (a standing or jittering ego's poses give no direction of their own)."""
    dist0 = np.linalg.norm(path - path[0], axis=1)
    dist1 = np.linalg.norm(path - path[-1], axis=1)
    if dist0.max() < base_m:
        raise LoopError(f"the logged ego moves {dist0.max():.2f} m in all: a route needs at least {base_m} m")
    d0 = path[np.argmax(dist0 >= base_m)] - path[0]
    d1 = path[-1] - path[len(path) - 1 - np.argmax(dist1[::-1] >= base_m)]
    d0, d1 = d0 / np.linalg.norm(d0), d1 / np.linalg.norm(d1)
    return np.vstack([path[0] - extra_m * d0, path, path[-1] + extra_m * d1])


def network(road, path: np.ndarray, workdir: Path):
    """The SUMO network of the run: the user's (road.net) or one built from the driven path."""
    from .sumo import RoadSpec, build_network, load_network
    if road.net is not None:
        return load_network(road.net, None if road.T_world_net is None else np.asarray(road.T_world_net, float),
                            road.forward_route, road.opposite_route, road.ego_lane)
    spec = RoadSpec(lanes=road.lanes, lane_width_m=road.lane_width_m, opposite_lanes=road.opposite_lanes,
                    ego_lane=road.ego_lane, speed_limit_mps=road.speed_limit_mps)
    return build_network(path, spec, workdir / "net")
