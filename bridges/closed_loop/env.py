"""`gsim/ClosedLoop-v0`: the closed loop as a Gymnasium environment, registered when this module is imported
(gymnasium imports it for an id that names it; gsim.bridges itself does not import gymnasium):

    env = gymnasium.make("gsim.bridges.closed_loop.env:gsim/ClosedLoop-v0", scenario="stopped-car")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())

Observations (a Dict): ``cameras`` {name: uint8 (H,W,3)}, ``lidar`` {name: float32 range image (lasers,
columns) m, 0 = no return}, ``ego`` float32 [speed m/s, acceleration m/s^2, steer rad, yaw rate rad/s],
``route`` float32 (61,2): the route ahead in the ego's rear-axle frame (x forward, y left), a point a metre.
Actions: ``action="controls"`` (default) a Box [acceleration m/s^2, steering rate rad/s] within the vehicle's
limits; ``action="waypoints"`` a Box (6,2) of ego-frame (x, y) m at 0.5, 1.0, ... 3.0 s, which the built-in
tracking controller follows.
Reward: metres of route progress this step / 10, minus 10 on a collision, minus 1 off the road.
Terminated: a collision, leaving the road or the route completed; truncated: the scenario's step count. ``info`` holds the
step's metrics and, at the end, the run's (`gsim.bridges.closed_loop.metrics`). Seeding: ``reset(seed=k)`` restarts SUMO
with seed k (the same seed gives the same run). ``client="traci"`` runs SUMO as a process, so that several
environments can live in one Python process (libsumo, the default, allows one simulation per process).
"""
from __future__ import annotations

from typing import Optional

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from gsim.errors import InputError

from .dynamics import Controls
from .loop import ROUTE_POINTS, WAYPOINT_TIMES_S, ClosedLoop
from ..recording.record import frame_view
from .scenario import load_loop_scenario


class ClosedLoopEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, scenario="stopped-car", action: str = "controls", render_mode: Optional[str] = None,
                 client: str = "libsumo"):
        if action not in ("controls", "waypoints"):
            raise InputError(f"ClosedLoopEnv: action must be 'controls' or 'waypoints', got {action!r}")
        if render_mode not in (None, "rgb_array"):
            raise InputError(f"ClosedLoopEnv: render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.scenario = load_loop_scenario(scenario) if not hasattr(scenario, "closed_loop") else scenario
        self.action_kind, self.render_mode = action, render_mode
        self.loop = ClosedLoop(self.scenario, seed=0, client=client)  # 'traci': several envs in one process
        p = self.loop.params
        if action == "controls":
            self.action_space = spaces.Box(np.array([-p.max_decel_mps2, -p.max_steer_rate_rps], np.float32),
                                           np.array([p.max_accel_mps2, p.max_steer_rate_rps], np.float32))
        else:
            self.action_space = spaces.Box(-100.0, 100.0, (len(WAYPOINT_TIMES_S), 2), np.float32)
        cams = {n: spaces.Box(0, 255, (c.height, c.width, 3), np.uint8) for n, (c, _) in self.loop.cameras.items()}
        lidars = {n: spaces.Box(0.0, np.inf, spec.ray_directions().shape[:2], np.float32)
                  for n, (spec, _) in self.loop.lidars.items()}
        self.observation_space = spaces.Dict({
            "cameras": spaces.Dict(cams), "lidar": spaces.Dict(lidars),
            "ego": spaces.Box(-np.inf, np.inf, (4,), np.float32),
            "route": spaces.Box(-np.inf, np.inf, (ROUTE_POINTS, 2), np.float32)})
        self._obs = None
        self._last_progress = 0.0

    def _convert(self, obs) -> dict:
        from .dynamics import yaw_rate
        e = obs.ego
        return {"cameras": dict(obs.cameras), "lidar": dict(obs.lidar_ranges),
                "ego": np.array([e.speed_mps, e.accel_mps2, e.steer_rad, yaw_rate(e, self.loop.params)], np.float32),
                "route": obs.route.astype(np.float32)}

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        if seed is not None:
            self.loop.seed = int(seed)
        self._obs = self.loop.reset()
        self._last_progress = 0.0
        return self._convert(self._obs), {"step": 0}

    def step(self, action):
        a = np.asarray(action, np.float64)
        if self.action_kind == "controls":
            act = Controls(float(a[0]), float(a[1]))
        else:
            act = np.c_[WAYPOINT_TIMES_S, a.reshape(len(WAYPOINT_TIMES_S), 2)]
        self._obs, m, done = self.loop.step(act)
        reward = (m["progress_m"] - self._last_progress) / 10.0 - 10.0 * m["collision"] - (not m["on_road"])
        self._last_progress = m["progress_m"]
        completed = m["progress_m"] >= self.loop.road.length_m
        terminated = bool(m["collision"] or not m["on_road"] or completed)
        info = {"metrics": m}
        if terminated or done:
            info["run"] = self.loop.summary()
        return self._convert(self._obs), float(reward), terminated, bool(done and not terminated), info

    def render(self):
        if self.render_mode != "rgb_array" or self._obs is None:
            return None
        return frame_view(self.loop, self._obs)

    def close(self):
        self.loop.close()


ENV_ID = "gsim/ClosedLoop-v0"
if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=ClosedLoopEnv)
