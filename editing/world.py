"""A scenario applied: the edited scene, the ego trajectory to render along, and the frames to render.

Edits run in the file's order, each a pure ``Scene -> Scene`` (`gsim.editing.edits`). After them, the
boxes of inserted and moved actors are checked against the ego's box along the rendered frames.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from gsim.boxes import footprint, overlap
from gsim.scene import Scene, load_scene
from gsim.transforms import interpolate_pose

from .edits import EditError, Ground, on_plane, insert_actor, move_actor, remove_actor
from .library import AssetLibrary
from .scenario import Ego, Scenario, Track


def _yaw_pose(x: float, y: float, z: float, yaw: float) -> np.ndarray:
    T = np.eye(4)
    c, s = np.cos(yaw), np.sin(yaw)
    T[:3, :3] = [[c, -s, 0], [s, c, 0], [0, 0, 1]]
    T[:3, 3] = (x, y, z)
    return T


def track_poses(track: Track, z: float = 0.0) -> Tuple[np.ndarray, np.ndarray]:
    """(timestamps_us (T,), poses (T,4,4)) of a track: its timed poses, or its path driven at its speed
    profile (speed linear in distance between vertices) sampled every ``step_us``, heading along the path."""
    if track.poses is not None:
        ts = np.array([p.t_us for p in track.poses], np.int64)
        return ts, np.stack([_yaw_pose(*p.xyz, np.radians(p.yaw_deg)) for p in track.poses])
    xy = np.asarray(track.path, float)
    seg = np.linalg.norm(np.diff(xy, axis=0), axis=1)
    if np.any(seg <= 0):
        raise EditError("track.path: consecutive vertices coincide")
    v = np.broadcast_to(np.asarray(track.speed_mps, float), (len(xy),))
    vm = 0.5 * (v[:-1] + v[1:])
    if np.any(vm <= 0):
        raise EditError(f"track.speed_mps: the speed is 0 along segment {int(np.argmin(vm))} of the path "
                        f"(the actor would never arrive)")
    # time along a segment where the speed changes linearly with distance: ds / mean speed (trapezoid)
    t_vert = np.r_[0.0, np.cumsum(seg / vm)] * 1e6
    ts = np.arange(0.0, t_vert[-1] + 1e-6, track.step_us)
    if ts[-1] < t_vert[-1]:
        ts = np.r_[ts, t_vert[-1]]
    s_vert = np.r_[0.0, np.cumsum(seg)]
    s = np.interp(ts, t_vert, s_vert)
    x, y = np.interp(s, s_vert, xy[:, 0]), np.interp(s, s_vert, xy[:, 1])
    k = np.clip(np.searchsorted(s_vert, s, side="right") - 1, 0, len(seg) - 1)
    d = np.diff(xy, axis=0)[k]
    yaw = np.arctan2(d[:, 1], d[:, 0])
    out_ts = (track.start_us + np.round(ts)).astype(np.int64)
    keep = np.r_[True, np.diff(out_ts) > 0]
    return out_ts[keep], np.stack([_yaw_pose(a, b, z, c) for a, b, c in zip(x[keep], y[keep], yaw[keep])])


def _within_log(track: Tuple[np.ndarray, np.ndarray], log, clip: bool) -> Tuple[np.ndarray, np.ndarray]:
    """A track's part within the log's time span (a path's end may run past it: ``clip``); an EditError
    when timed poses leave the span or nothing of the track is in it."""
    ts, poses = track
    t0, t1 = log.frames[0].timestamp_us, log.frames[-1].timestamp_us
    inside = (ts >= t0) & (ts <= t1)
    if not inside.any() or (not clip and not inside.all()):
        raise EditError(f"track: times [{ts[0]}, {ts[-1]}] us leave the log's span [{t0}, {t1}] us")
    # keep one pose past each end so that the track still reaches the span's ends by interpolation
    idx = np.nonzero(inside)[0]
    lo, hi = max(idx[0] - 1, 0), min(idx[-1] + 1, len(ts) - 1)
    return ts[lo:hi + 1], poses[lo:hi + 1]


@dataclass(frozen=True, eq=False)
class World:
    """The edited scene, the log, the ego's (edited) poses and the frames to render."""
    scene: Scene
    log: object  # gsim.scenes.log.DrivingLog
    ego_timestamps_us: np.ndarray
    ego_poses: np.ndarray  # (P,4,4) T_world_vehicle
    frames: List[object]  # the log's frames in the time range
    changed: Tuple[str, ...]  # ids of inserted and moved actors
    inserted: Tuple[str, ...] = ()  # ids of the actors the insert edits added (what harmonization repaints)

    def T_world_vehicle(self, timestamp_us: int) -> np.ndarray:
        return interpolate_pose(self.ego_timestamps_us, self.ego_poses, int(timestamp_us))


def _ego(log, ego: Ego, scene: Scene) -> Tuple[np.ndarray, np.ndarray]:
    ts, poses = log.ego_timestamps_us, log.ego_poses.copy()
    if ego.track is not None:
        ground = Ground(scene.background)
        # keep the vehicle frame's height above the ground it had at the start of the log
        P0 = poses[0]
        c0 = ground.plane(footprint(P0, (5.0, 3.0, 1.0)), "ego at the log's start")
        lift = P0[2, 3] - (c0[0] * P0[0, 3] + c0[1] * P0[1, 3] + c0[2])
        ts, poses = track_poses(ego.track)
        for i, P in enumerate(poses):
            c = ground.plane(footprint(P, (5.0, 3.0, 1.0)), f"ego path at t={int(ts[i])} us")
            poses[i] = on_plane(P, c)
            poses[i, :3, 3] += poses[i, :3, 2] * lift
    if ego.shift_m:
        poses = poses.copy()
        poses[:, :3, 3] += poses[:, :3, 1] * ego.shift_m
    return ts, poses


def _frames(log, time) -> list:
    t0 = time.start_us if time.start_us is not None else log.frames[0].timestamp_us
    t1 = time.end_us if time.end_us is not None else log.frames[-1].timestamp_us
    lo, hi = log.frames[0].timestamp_us, log.frames[-1].timestamp_us
    if t0 > t1 or t1 < lo or t0 > hi:
        raise EditError(f"time: the range [{t0}, {t1}] us lies outside the log's frames [{lo}, {hi}] us")
    frames = [f for f in log.frames if t0 <= f.timestamp_us <= t1][::time.every]
    if not frames:
        raise EditError(f"time: no frame of the log in [{t0}, {t1}] us")
    return frames


def check_ego(world: World, ego: Ego) -> None:
    """EditError when an inserted or moved actor's box overlaps the ego's box at a rendered frame."""
    off = np.eye(4)
    off[:3, 3] = ego.box_offset_m
    for f in world.frames:
        E = world.T_world_vehicle(f.timestamp_us) @ off
        for a in world.scene.actors:
            if a.id not in world.changed or not (a.track_timestamps_us[0] <= f.timestamp_us <= a.track_timestamps_us[-1]):
                continue
            shared, dz = overlap(a.pose_at(f.timestamp_us), a.size, E, ego.size_m)
            if dz > 0 and shared > 0.01:
                raise EditError(f"actor {a.id!r} overlaps the ego vehicle at t={f.timestamp_us} us (frame "
                                f"{f.index}); move it or the ego")


def apply(scenario: Scenario, progress: bool = False, ego_overlaps: bool = False) -> World:
    """Load the scenario's scene, log and library and apply its edits (see the module docstring).
    ``ego_overlaps``: allow inserted or moved actors where the logged ego drives (a closed loop, whose ego
    is driven by an agent, not by the log)."""
    from gsim.scenes.log import load_log
    scene = load_scene(scenario.scene)
    log = load_log(scenario.log)
    lib = AssetLibrary.builtin() if scenario.library == "builtin" else AssetLibrary(scenario.library)
    changed, inserted = [], []
    for i, e in enumerate(scenario.edits):
        try:
            if e.kind == "insert":
                ts, poses = _within_log(track_poses(e.track), log, e.track.path is not None)
                before = {a.id for a in scene.actors}
                scene = insert_actor(scene, lib.get(e.asset), ts, poses, actor_id=e.id, on_ground=e.track.poses is None
                                     or e.on_ground, harmonized=e.harmonize, shadow=e.shadow,
                                     allow_overlap=e.allow_overlap)
                new = [a.id for a in scene.actors if a.id not in before]
                inserted += new
                changed += new
            elif e.kind == "remove":
                scene = remove_actor(scene, e.actor, fill=e.fill)
            else:
                track = None if e.track is None else _within_log(track_poses(e.track), log, e.track.path is not None)
                scene = move_actor(scene, e.actor, e.shift_m, e.speed_scale, track, e.allow_overlap)
                changed.append(e.actor)
        except (EditError, KeyError) as err:
            msg = err.args[0] if isinstance(err, KeyError) else str(err)
            raise EditError(f"edits[{i}] ({e.kind}): {msg}") from None
    ts, poses = _ego(log, scenario.ego, scene)
    world = World(scene, log, ts, poses, _frames(log, scenario.time), tuple(changed), tuple(inserted))
    if not ego_overlaps:
        check_ego(world, scenario.ego)
    return world
