"""Recorded closed-loop runs: everything a run directory holds, written step by step so that a run that
fails keeps every completed step.

    DIR/run.json           what ran: the scenario (resolved, as a scenario file holds it) and the seed, so that
                           the run can be shown again on its scene (`gsim view DIR`)
    DIR/steps.jsonl        one JSON line per step: ego state, controls, the ego model's state and inputs
                           (``dynamics``, docs/closed_loop.md), actors' boxes, the step's metrics
    DIR/metrics.json       the run's metrics (`gsim.bridges.closed_loop.metrics`), with completed / error
    DIR/metrics.md         the same as a table
    DIR/video.mp4          the first camera beside a bird's-eye plot of the road, the ego and the traffic
    DIR/log/               the run as a gsim driving log (rendered cameras and sweeps, ego poses, actors)
    DIR/run.mcap           the same for Foxglove (images, point clouds, frame transforms, boxes, metrics)
    and, where asked, a ROS 2 bag of the run at its own path (`gsim.ros2_bag`)
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
from PIL import Image, ImageDraw

from gsim.io import write_bytes, write_json, write_video
from gsim.ros2_bag import BagOptions, Ros2BagWriter

from ..closed_loop.metrics import Box

RUN_SCHEMA_VERSION = 1
BEV_PX_PER_M = 3.0
BEV_AHEAD_M, BEV_BEHIND_M = 50.0, 15.0
EGO_RGBA, ACTOR_RGBA, SUMO_RGBA = (0.2, 0.5, 1.0, 0.6), (1.0, 0.5, 0.1, 0.5), (0.9, 0.2, 0.6, 0.5)


def bev(loop, obs, size: int) -> np.ndarray:
    """(size, size, 3) uint8 bird's-eye view around the ego, its heading up: lanes grey, the route white,
    the ego blue, the log's actors orange, SUMO's vehicles magenta, a collision red."""
    img = Image.new("RGB", (size, size), (20, 60, 25))
    d = ImageDraw.Draw(img)
    s = obs.ego
    scale = size / (BEV_AHEAD_M + BEV_BEHIND_M)
    c, si = math.cos(s.yaw_rad), math.sin(s.yaw_rad)

    def px(xy):
        xy = np.atleast_2d(xy) - (s.x_m, s.y_m)
        fwd, left = c * xy[:, 0] + si * xy[:, 1], -si * xy[:, 0] + c * xy[:, 1]
        return list(zip(size / 2 - left * scale, size - (fwd + BEV_BEHIND_M) * scale))

    for lane in loop.road.lanes:
        d.line(px(lane.centre.xy), fill=(90, 90, 90), width=max(int(lane.width_m * scale), 1))
    d.line(px(loop.road.route.xy), fill=(230, 230, 230), width=1)
    sumo_ids = {v.id for v in loop.traffic_vehicles}
    hit = set()
    if loop.metrics.steps and obs.step > 0:
        hit = set(loop.metrics.steps[-1]["collision_with"])
    for a in obs.actors:
        col = (230, 30, 30) if a.id in hit else ((220, 60, 150) if a.id in sumo_ids else (240, 130, 30))
        d.polygon(px(a.footprint()), fill=col)
    e = loop.ego_box()
    d.polygon(px(e.footprint()), fill=(230, 30, 30) if hit else (50, 130, 255))
    return np.asarray(img)


def frame_view(loop, obs) -> np.ndarray:
    """The first camera beside the bird's-eye view (the bird's-eye view alone without cameras)."""
    first = next(iter(obs.cameras.values()), None)
    view = bev(loop, obs, first.shape[0] if first is not None else 240)
    return view if first is None else np.concatenate([first, view], 1)


class RunRecorder:
    """Writes a run directory (see the module docstring) step by step. Use as a context manager; `finish`
    writes the metrics, the video and closes the log, the MCAP file and the ROS 2 bag (also after a failure)."""

    def __init__(self, out, loop, video: bool = True, mcap: bool = True, log: bool = True,
                 ros2_bag: Optional[BagOptions] = None):
        self.bag = None  # first: a bag that cannot be written fails before the run directory is touched
        if ros2_bag is not None:
            self.bag = Ros2BagWriter(ros2_bag, dict(loop.cameras), {n: T for n, (_, T) in loop.lidars.items()})
        try:
            self._open(out, loop, video, mcap, log)
        except BaseException:
            if self.bag is not None:
                self.bag.abort()
            raise

    def _open(self, out, loop, video: bool, mcap: bool, log: bool) -> None:
        """The run directory and its files, opened."""
        from gsim.scenes.log import LogWriter
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.loop = loop
        write_json(self.out / "run.json", {"schema_version": RUN_SCHEMA_VERSION, "seed": int(loop.seed),
                                           "scenario": loop.scenario.model_dump(mode="json")})
        self.steps_file = (self.out / "steps.jsonl").open("w")
        self.frames: List[np.ndarray] = [] if video else None
        self.tracks: Dict[str, list] = {}
        self.log_writer = None
        if log:
            self.log_writer = LogWriter(self.out / "log", name=f"closed-loop-{loop.scenario.name}",
                                        source=f"gsim closed-loop {loop.scenario.name}")
            w = self.log_writer.__enter__()
            w.notes.append(f"closed-loop run of scenario {loop.scenario.name} (seed {loop.seed}), rendered by gsim")
            for n, (cam, T_vc) in loop.cameras.items():
                w.add_camera(n, cam, T_vc)
            for n in loop.lidars:
                w.add_lidar(n, loop.log.lidars[n].T_vehicle_lidar, loop.log.lidars[n].beams)
        self.mcap = None
        if mcap:
            from .mcap_log import McapRecorder
            self.mcap = McapRecorder(self.out / "run.mcap")

    def step(self, obs, controls, metrics: Optional[dict], agent_name: str) -> None:
        loop, t = self.loop, obs.timestamp_us
        ego = loop.ego_box()
        rec = {"step": obs.step, "t_us": t, "agent": agent_name, "ego": obs.ego.to_dict(),
               "controls": None if controls is None else {"accel_mps2": controls.accel_mps2,
                                                           "steer_rate_rps": controls.steer_rate_rps},
               "dynamics": loop.dynamics_record(controls),
               "ego_box": _box_dict(ego), "actors": [_box_dict(a) for a in obs.actors], "metrics": metrics}
        self.steps_file.write(json.dumps(rec) + "\n")
        self.steps_file.flush()
        for a in (ego,) + tuple(obs.actors):
            self.tracks.setdefault(a.id, []).append((t, a))
        if self.frames is not None:
            self.frames.append(frame_view(loop, obs))
        if self.log_writer is not None:
            w, k = self.log_writer, obs.step
            cams = {n: w.image(n, k, t, rgb) for n, rgb in obs.cameras.items()}
            # a step's sweep spun over the step before it: stamped at its start, whence its points' offsets count
            lidars = {n: w.sweep(n, k, t - loop.dt_us, pts) for n, pts in obs.lidars.items()}
            w.add_ego_pose(t, obs.T_world_vehicle)
            w.add_frame(t, cams, lidars)
        if self.mcap is not None:
            self._mcap_step(obs, ego, rec)
        if self.bag is not None:
            self._ros2_step(obs)

    def _mcap_step(self, obs, ego: Box, rec: dict) -> None:
        m, t, loop = self.mcap, obs.timestamp_us, self.loop
        m.frame_transform(t, "world", "ego", obs.T_world_vehicle)
        for n, (_, T_vc) in loop.cameras.items():
            m.frame_transform(t, "ego", n, T_vc)
        for n in loop.lidars:
            m.frame_transform(t, "ego", n, loop.lidars[n][1])
        for n, rgb in obs.cameras.items():
            m.image(t, f"/camera/{n}", n, rgb)
        for n, pts in obs.lidars.items():
            m.point_cloud(t, f"/lidar/{n}", n, pts[:, :4])
        sumo = {v.id for v in loop.traffic_vehicles}
        boxes = [{"id": "ego", "T": ego.T, "size": ego.size, "color": EGO_RGBA, "label": "ego"}]
        boxes += [{"id": a.id, "T": a.T, "size": a.size, "color": SUMO_RGBA if a.id in sumo else ACTOR_RGBA,
                   "label": a.id} for a in obs.actors]
        m.boxes(t, "/boxes", "world", boxes)
        m.json(t, "/step", {k: rec[k] for k in ("step", "ego", "controls", "metrics")})

    def _ros2_step(self, obs) -> None:
        b, t, loop, s = self.bag, obs.timestamp_us, self.loop, obs.ego
        b.step(t, obs.T_world_vehicle, ((s.speed_mps, 0.0, 0.0), (0.0, 0.0, loop.model.yaw_rate(s))), obs.actors)
        for n, rgb in obs.cameras.items():
            b.image(n, t, rgb)
        for n, pts in obs.lidars.items():  # a sweep spins over the step that ends now: its times from the stamp
            b.sweep(n, t, pts[:, :3], pts[:, 3], obs.lidar_rings[n], pts[:, 4].astype(np.int64) - loop.dt_us)

    def finish(self, summary: dict, failed: bool = False) -> None:
        """Write the metrics and the video, close the log, the MCAP file and the ROS 2 bag."""
        from gsim.scenes.log import ActorTrack
        self.steps_file.close()
        write_json(self.out / "metrics.json", summary)
        write_bytes(self.out / "metrics.md", metrics_markdown(summary).encode())
        if self.frames:
            write_video(self.out / "video.mp4", self.frames, 1.0 / self.loop.dt)
        if self.log_writer is not None and not self.log_writer.frames:  # nothing rendered: no log to keep
            self.log_writer.__exit__(RuntimeError, RuntimeError("no step recorded"), None)
        elif self.log_writer is not None:
            w = self.log_writer
            for aid, items in self.tracks.items():
                if aid == "ego":
                    continue
                a = items[-1][1]
                w.add_actor(ActorTrack(aid, a.category, a.size, np.array([t for t, _ in items], np.int64),
                                       np.stack([b.T for _, b in items])))
            w.__exit__(None, None, None)
        if self.mcap is not None:
            self.mcap.close(complete=not failed, reason=summary.get("error") or "")
        if self.bag is not None and not self.bag.steps:  # nothing recorded: no bag to keep
            self.bag.abort()
        elif self.bag is not None:
            self.bag.close(complete=not failed, reason=summary.get("error") or "")


def _box_dict(b: Box) -> dict:
    return {"id": b.id, "category": b.category, "xyz": [b.x, b.y, b.z], "yaw": b.yaw,
            "size": [b.length, b.width, b.height], "velocity": [b.vx, b.vy]}


def metrics_markdown(s: dict) -> str:
    rows = ["| metric | value |", "|---|---|"]
    for k in ("score", "collision", "route_completion", "no_collision", "drivable_area_compliance",
              "time_to_collision", "ego_progress", "comfort", "progress_m", "reference_progress_m", "steps",
              "completed"):
        if k in s:
            v = s[k]
            rows.append(f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v} |")
    if s.get("first_collision"):
        rows.append(f"| first collision | t = {s['first_collision']['t_us']} us with "
                    f"{', '.join(s['first_collision']['with'])} |")
    if s.get("error"):
        rows.append(f"| error | {s['error']} |")
    return f"# closed-loop run: {s.get('scenario', '')} / {s.get('agent', '')} (seed {s.get('seed', '')})\n\n" \
           + "\n".join(rows) + "\n"
