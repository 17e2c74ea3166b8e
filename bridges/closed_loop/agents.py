"""Agents that come with gsim, and the interface a user's own agent implements.

An agent is any object with ``act(observation) -> action`` (and optionally ``reset(info)``, called once
before a run with the `LoopInfo`): the action is `Controls` (acceleration m/s^2, steering rate rad/s) or
timed waypoints (K,3) (t_s from now, x, y in the ego's rear-axle frame), which the loop's tracking
controller follows. `load_agent(name)` gives the built-in ones:

- ``replay``: follows the logged ego path on the logged timing (waypoints from the log), whatever is there;
- ``privileged``: car following (an adaptive-cruise law) behind the nearest ground-truth actor in its path
  (`Observation.actors`) and pure pursuit on the route: a sanity baseline that should score near the top;
- ``lidar-aeb``: sees only its LiDAR sweeps and the route: follows the route at the target speed and brakes
  for returns in its path (automatic emergency braking).

``ros2`` puts a ROS 2 stack in the loop over DDS (`gsim.bridges.ros2.agent`). Or ``module:attribute`` names a
user's agent class (or factory) importable from Python, or ``exec:COMMAND``
runs the agent as its own process (any language) over JSON lines on its stdin/stdout (`ProcessAgent`).
"""
from __future__ import annotations

import importlib
import json
import math
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

from gsim.errors import InputError

from .dynamics import Controls, TrajectoryTracker, path_waypoints
from .loop import WAYPOINT_TIMES_S, LoopInfo, Observation
from .road import Polyline


class ReplayAgent:
    """Drives the logged ego path on its timing (the open-loop log, re-driven through the dynamics); past
    the log's end, on at the last logged velocity."""

    name = "replay"

    def reset(self, info: LoopInfo) -> None:
        self.info = info
        end = info.logged_until_us
        self.end = info.logged_pose(end)[:3, 3]
        self.velocity = (self.end - info.logged_pose(end - 100_000)[:3, 3]) / 0.1

    def _logged(self, t_us: int) -> np.ndarray:
        late = (t_us - self.info.logged_until_us) * 1e-6
        return self.end + self.velocity * late if late > 0 else self.info.logged_pose(t_us)[:3, 3]

    def act(self, obs: Observation) -> np.ndarray:
        T_ve = np.linalg.inv(obs.T_world_vehicle)
        wp = []
        for t in WAYPOINT_TIMES_S:
            p = self._logged(obs.timestamp_us + int(round(t * 1e6)))
            q = T_ve[:3, :3] @ p + T_ve[:3, 3]
            wp.append((t, q[0], q[1]))
        return np.array(wp)


def _offset(route: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each ego-frame point's signed offset (left positive) from the ego-frame route polyline (K,2)."""
    if len(route) < 2 or np.ptp(route, axis=0).max() < 1e-6:
        return np.asarray(y, np.float64)
    return Polyline(route).project(np.c_[x, y])[1]


class _RouteFollower:
    """Pure pursuit on the route at the target speed, with a tracker of its own for the longitudinal part."""

    def reset(self, info: LoopInfo) -> None:
        self.info = info
        self.tracker = TrajectoryTracker(info.params)

    def follow(self, obs: Observation) -> Controls:
        wp = path_waypoints(self.info.route_xy, obs.ego, self.info.target_speed_mps)
        return self.tracker.controls(obs.ego, wp, self.info.step_s)


class PrivilegedAgent(_RouteFollower):
    """Car following on ground truth behind the nearest actor in the ego's path: an adaptive-cruise law
    (0.25 /s^2 x the gap error to MIN_GAP_M + HEADWAY_S x the lead's speed, 0.8 /s x the speed error), never
    less braking than it takes to come down to the lead's speed at MIN_GAP_M (with a smooth onset); the
    acceleration changes by at most JERK_MPS3 (comfort) unless that takes more than EMERGENCY of the vehicle's
    braking."""

    name = "privileged"
    MIN_GAP_M, HEADWAY_S, JERK_MPS3, EMERGENCY = 2.0, 1.2, 3.5, 0.6

    def reset(self, info: LoopInfo) -> None:
        super().reset(info)
        self.accel = 0.0

    def act(self, obs: Observation) -> Controls:
        base = self.follow(obs)
        p = self.info.params
        v = obs.ego.speed_mps
        gap, lead_v = self.lead(obs)
        want = base.accel_mps2
        emergency = False
        if gap < math.inf:
            lead_v = max(lead_v, 0.0)
            want = min(want, 0.25 * (gap - self.MIN_GAP_M - self.HEADWAY_S * lead_v) + 0.8 * (lead_v - v))
            if v > lead_v:
                need = (v * v - lead_v * lead_v) / (2 * max(gap - self.MIN_GAP_M, 0.1))
                # the smooth onset (need / JERK_MPS3 seconds) covers about v t / 2 at little braking: plan with less room
                room = gap - self.MIN_GAP_M - v * need / self.JERK_MPS3 / 2
                need = (v * v - lead_v * lead_v) / (2 * max(room, 0.1))
                want = min(want, -need)
                emergency = need > self.EMERGENCY * p.max_decel_mps2
        want = max(want, -p.max_decel_mps2)
        if not emergency:  # a smooth change
            step = self.JERK_MPS3 * self.info.step_s
            want = float(np.clip(want, self.accel - step, self.accel + step))
        self.accel = want
        return Controls(want, base.steer_rate_rps)

    def lead(self, obs: Observation):
        """(bumper-to-bumper gap m, speed along the ego's heading m/s) of the nearest actor whose footprint
        reaches into the ego's path ahead (within half its width + 0.3 m of the route); (inf, 0) when none."""
        p = self.info.params
        T_ve = np.linalg.inv(obs.T_world_vehicle)
        c, s = math.cos(obs.ego.yaw_rad), math.sin(obs.ego.yaw_rad)
        front = p.rear_axle_to_centre_m + p.length_m / 2
        gap, lead_v = math.inf, 0.0
        for a in obs.actors:
            xy = a.footprint() @ T_ve[:2, :2].T + T_ve[:2, 3]  # corners in the ego frame
            off = _offset(obs.route, xy[:, 0], xy[:, 1])
            in_path = (off.min() < p.width_m / 2 + 0.3) and (off.max() > -p.width_m / 2 - 0.3)
            ahead = float(xy[:, 0].min()) - front
            if in_path and xy[:, 0].max() > front and ahead < gap:
                gap, lead_v = max(ahead, 0.0), c * a.vx + s * a.vy
        return gap, lead_v


class LidarAebAgent(_RouteFollower):
    """Route following with automatic emergency braking on LiDAR returns in the ego's path."""

    name = "lidar-aeb"
    MARGIN_M, REACTION_S, BRAKE_MPS2, LOOKAHEAD_M = 0.3, 0.3, 6.0, 60.0
    MIN_HEIGHT_M, MAX_HEIGHT_M = 0.3, 2.5  # above the ground: kerbs and the road are not obstacles

    def act(self, obs: Observation) -> Controls:
        base = self.follow(obs)
        dist = self.obstacle_distance(obs)
        v = obs.ego.speed_mps
        stop = v * self.REACTION_S + v * v / (2 * self.BRAKE_MPS2) + 2.0  # what it needs, with 2 m to spare
        if dist is None or dist > stop:
            return base
        room = max(dist - 1.5, 0.05)  # brake to stand 1.5 m short of the obstacle
        decel = min(max(v * v / (2 * room), 1.0), self.info.params.max_decel_mps2)  # (1: hold it when stopped)
        return Controls(-decel, base.steer_rate_rps)

    def obstacle_distance(self, obs: Observation) -> Optional[float]:
        """Metres from the front bumper to the nearest return inside the ego's path ahead (None: clear)."""
        p = self.info.params
        front = p.rear_axle_to_centre_m + p.length_m / 2
        best = None
        for name, pts in obs.lidars.items():
            if len(pts) == 0:
                continue
            T = self.info.T_vehicle_lidar[name]
            q = pts[:, :3].astype(np.float64) @ T[:3, :3].T + T[:3, 3]  # the rear-axle frame
            near = (q[:, 0] > front) & (q[:, 0] < front + self.LOOKAHEAD_M)
            q = q[near]
            if len(q) == 0:
                continue
            ground = float(np.percentile(q[:, 2], 5))  # the road's height under the returns ahead
            h = q[:, 2] - ground
            reach = p.width_m / 2 + self.MARGIN_M
            lo, hi = obs.route.min(0) - reach, obs.route.max(0) + reach  # cheap tests first: few points are left
            q = q[(h > self.MIN_HEIGHT_M) & (h < self.MAX_HEIGHT_M) & np.all((q[:, :2] >= lo) & (q[:, :2] <= hi), 1)]
            hit = np.abs(_offset(obs.route, q[:, 0], q[:, 1])) < reach
            if hit.any():
                d = float(q[hit, 0].min() - front)
                best = d if best is None else min(best, d)
        return best


class ProcessAgent:
    """An agent in its own process, over JSON lines (one object per line each way).

    gsim writes ``{"type": "reset", "scenario", "step_s", "target_speed_mps", "vehicle": {...VehicleParams},
    "route_xy": [[x, y], ...] (world)}`` once, then each step ``{"type": "observation", "step", "timestamp_us",
    "ego": {...EgoState}, "T_world_vehicle": 4x4, "route": [[x, y], ...] (ego frame), "cameras": {name: path},
    "lidars": {name: path}}`` where each path is a .npy file (uint8 (H,W,3) image; float32 (N,5) x, y, z,
    intensity, time offset us in the sensor frame) valid until the next line; the agent answers each
    observation with ``{"accel_mps2": a, "steer_rate_rps": r}`` or ``{"waypoints": [[t_s, x, y], ...]}``
    (ego frame). Its stderr passes through; it is stopped when the run ends."""

    name = "exec"

    def __init__(self, command: str, timeout_s: float = 30.0):
        self.command, self.timeout_s = command, timeout_s
        self.proc = None

    def reset(self, info: LoopInfo) -> None:
        self.close()
        self.dir = Path(tempfile.mkdtemp(prefix="gsim-agent-"))
        try:
            self.proc = subprocess.Popen(shlex.split(self.command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, bufsize=1)
            self.buffer = b""  # its stdout is read raw (see _receive): the text wrapper is never used for reading
        except OSError as e:
            raise RuntimeError(f"agent process {self.command!r} could not start: {e}") from None
        p = info.params
        self._send({"type": "reset", "scenario": info.scenario, "step_s": info.step_s,
                    "target_speed_mps": info.target_speed_mps, "vehicle": p.to_dict(),
                    "route_xy": np.asarray(info.route_xy).tolist()})

    def act(self, obs: Observation):
        files = {}
        for kind, arrays in (("cameras", obs.cameras), ("lidars", obs.lidars)):
            files[kind] = {}
            for n, a in arrays.items():
                path = self.dir / f"{kind}_{n}.npy"
                np.save(path, a)
                files[kind][n] = str(path)
        self._send({"type": "observation", "step": obs.step, "timestamp_us": obs.timestamp_us,
                    "ego": obs.ego.to_dict(), "T_world_vehicle": obs.T_world_vehicle.tolist(),
                    "route": obs.route.tolist(), **files})
        reply = self._receive()
        if "waypoints" in reply:
            return np.asarray(reply["waypoints"], np.float64)
        try:
            return Controls(float(reply["accel_mps2"]), float(reply["steer_rate_rps"]))
        except (KeyError, TypeError, ValueError):
            raise InputError(f"expected {{'accel_mps2', 'steer_rate_rps'}} or {{'waypoints'}}, got {reply}") from None

    def _send(self, obj: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise RuntimeError(f"agent process {self.command!r} exited (code {self.proc.poll()})") from None

    def _receive(self) -> dict:
        """The agent's next line, read from its raw stdout against the deadline (a partial line never blocks)."""
        import os
        import select
        import time
        deadline = time.monotonic() + self.timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"agent process {self.command!r} gave no answer in {self.timeout_s} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"agent process {self.command!r} exited (code {self.proc.wait()})")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise InputError(f"agent process {self.command!r} wrote a line that is not JSON: {line[:200]!r}") from None

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            import shutil
            shutil.rmtree(self.dir, ignore_errors=True)


BUILTIN = {"replay": ReplayAgent, "privileged": PrivilegedAgent, "lidar-aeb": LidarAebAgent}


def load_agent(name: str, deadline_s: float = 10.0, image_format: str = "jpeg", ros2=None):
    """A built-in agent by name, ``egodriver:HOST:PORT`` or ``egodriver:unix:///path`` (an AlpaSim policy server,
    `egodriver.EgodriverAgent`, with each call's ``deadline_s`` and its images' ``image_format``), ``ros2`` (a ROS 2
    stack over DDS, `gsim.bridges.ros2.agent.Ros2Agent`, with ``ros2`` its `Ros2Options`; None: the defaults),
    ``exec:COMMAND`` (`ProcessAgent`) or ``module:attribute`` (a class or factory called without arguments)."""
    if name in BUILTIN:
        return BUILTIN[name]()
    if name == "ros2":
        from ..ros2.agent import Ros2Agent, Ros2Options
        return Ros2Agent(ros2 or Ros2Options())
    if name.startswith("egodriver:"):
        from .egodriver import EgodriverAgent
        return EgodriverAgent(name[len("egodriver:"):], deadline_s, image_format)
    if name.startswith("exec:"):
        if not name[5:].strip():
            raise InputError("agent 'exec:': give the command, e.g. exec:'python my_agent.py'")
        return ProcessAgent(name[5:])
    if ":" in name:
        mod, attr = name.split(":", 1)
        try:
            factory = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise InputError(f"agent {name!r}: cannot import it ({e})") from None
        agent = factory()
        if not callable(getattr(agent, "act", None)):
            raise InputError(f"agent {name!r}: the object has no act(observation) method")
        return agent
    raise InputError(f"unknown agent {name!r}; built-in: {', '.join(BUILTIN)}, or module:attribute, or exec:COMMAND, "
                     f"or egodriver:HOST:PORT, or ros2")
