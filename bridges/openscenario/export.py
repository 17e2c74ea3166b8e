"""A gsim scenario as ASAM OpenSCENARIO 1.3 (`gsim scenario export SCENARIO OUT_DIR`): ``OUT_DIR/<name>.xosc`` and
``OUT_DIR/road.xodr`` (`opendrive.export_road`), written with scenariogeneration (the ``scenarios`` extra), so that the
scenario's traffic plays in esmini or CARLA's ScenarioRunner on the road the closed loop drives.

What the file holds: the scenario's edited world as it renders (`gsim.editing.world.apply`): ``RoadNetwork`` with
``LogicFile`` road.xodr and ``SceneGraphFile`` the gsim scene (relative to the file); an entity per actor (its category
as an OpenSCENARIO vehicle class, a pedestrian or a misc object; its box) and the ego, named ``ego``; in ``Init`` each
placed at its first pose (``TeleportAction``, ``WorldPosition``: gsim's world frame, heading from +x counter-clockwise);
in the storyboard one event at time 0 per entity, a ``FollowTrajectoryAction`` along its track (a polyline of timed
world positions, absolute time from the scenario's first frame), and a stop trigger at the last frame. The parameter
``gsim_log_actors`` = ``listed`` says that the scene holds these entities only (the log's actors a scenario removed stay
removed when gsim imports the file). Reference points: an actor's is the centre of its box's bottom face (gsim's actor
frame), so its bounding box centre sits half its height above; the ego's is the loop's ego frame (the rear axle), its
box where the scenario puts it (``ego.box_offset_m``).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from gsim.errors import InputError
from gsim.io import atomic_path
from gsim.transforms import interpolate_poses

VEHICLES = {"car": "car", "truck": "truck", "bus": "bus", "cyclist": "bicycle", "motorcycle": "motorbike"}
MISC = {"cone": "obstacle", "barrier": "barrier", "sign": "obstacle", "other": "obstacle"}


def _entity(xosc, name: str, category: str, size, centre, axles):
    """An entity of ``category`` with its box (``size`` length, width, height; ``centre`` from its reference point)
    and, for a vehicle, its axles' positions along x (rear, front; OpenSCENARIO asks for them)."""
    bb = xosc.BoundingBox(float(size[1]), float(size[0]), float(size[2]), *map(float, centre))
    if category in VEHICLES:
        rear, front = (xosc.Axle(0.5, 0.6, float(size[1]) * 0.85, float(x), 0.3) for x in axles)
        return xosc.Vehicle(name, getattr(xosc.VehicleCategory, VEHICLES[category]), bb, front, rear, 70.0, 10.0,
                            10.0)
    if category == "pedestrian":
        return xosc.Pedestrian(name, 80.0, xosc.PedestrianCategory.pedestrian, bb)
    return xosc.MiscObject(name, 10.0, getattr(xosc.MiscObjectCategory, MISC[category]), bb)


def _position(xosc, T: np.ndarray):
    return xosc.WorldPosition(float(T[0, 3]), float(T[1, 3]), float(T[2, 3]), math.atan2(T[1, 0], T[0, 0]))


def export_scenario(target: str, out_dir) -> Path:
    """Writes OUT_DIR/<scenario name>.xosc and OUT_DIR/road.xodr for a scenario file or a shipped name; returns the
    .xosc's path."""
    from scenariogeneration import xosc
    from gsim.editing.world import apply
    from .load import LOG_ACTORS_PARAMETER
    from gsim.bridges.closed_loop.opendrive import export_road
    from gsim.bridges.closed_loop.scenario import SHIPPED, ensure_demo, load_loop_scenario
    if not (str(target) in SHIPPED or Path(target).suffix in (".yaml", ".yml")):
        raise InputError(f"{target}: expected a scenario file (.yaml) or a shipped scenario ({', '.join(SHIPPED)})")
    sc = load_loop_scenario(target)
    if str(target) in SHIPPED:
        ensure_demo(sc)
    world = apply(sc, ego_overlaps=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    export_road(target, out / "road.xodr")
    t0, t1 = int(world.frames[0].timestamp_us), int(world.frames[-1].timestamp_us)
    wheelbase = float(sc.closed_loop.vehicle.get("wheelbase_m", 2.8))  # (the loop's VehicleParams default)
    tracks = [("ego", "car", sc.ego.size_m, sc.ego.box_offset_m, (0.0, wheelbase), world.ego_timestamps_us,
               world.ego_poses)]
    for a in world.scene.actors:
        if a.id == "ego":
            raise InputError(f"{target}: an actor is named 'ego', the name the file gives the ego vehicle")
        # (a reconstructed or library actor's axles are not known: 30% of its length behind and ahead of its centre)
        bottom = a.track_poses.copy()  # its reference point: the centre of its box's bottom face
        bottom[:, :3, 3] -= bottom[:, :3, 2] * float(a.size[2]) / 2
        tracks.append((a.id, a.category, a.size, (0.0, 0.0, float(a.size[2]) / 2),
                       (-0.3 * float(a.size[0]), 0.3 * float(a.size[0])), a.track_timestamps_us, bottom))
    entities, init, story = xosc.Entities(), xosc.Init(), xosc.Story("gsim")
    act = xosc.Act("tracks", xosc.ValueTrigger("start", 0, xosc.ConditionEdge.none,
                                              xosc.SimulationTimeCondition(0, xosc.Rule.greaterOrEqual)))
    for name, category, size, centre, axles, ts, poses in tracks:
        entities.add_scenario_object(name, _entity(xosc, name, category, size, centre, axles))
        if len(ts) > 1:  # its track within the scenario's span (ends interpolated), standing from its end on
            start, end = min(max(int(ts[0]), t0), t1), max(min(int(ts[-1]), t1), t0)
            new = np.unique(np.r_[start, ts[(ts > start) & (ts < end)], end, t1]).astype(np.int64)
            ts, poses = new, interpolate_poses(ts, poses, new)
        init.add_init_action(name, xosc.TeleportAction(_position(xosc, poses[0])))
        if len(ts) < 2:
            continue
        trajectory = xosc.Trajectory(f"{name}_track", False)
        trajectory.add_shape(xosc.Polyline([max(0.0, (int(t) - t0) * 1e-6) for t in ts],
                                           [_position(xosc, T) for T in poses]))
        follow = xosc.FollowTrajectoryAction(trajectory, xosc.FollowingMode.position, xosc.ReferenceContext.absolute,
                                             1, 0)
        event = xosc.Event(f"{name}_follows", xosc.Priority.override)
        event.add_action(f"{name}_track", follow)
        event.add_trigger(xosc.ValueTrigger(f"{name}_at_start", 0, xosc.ConditionEdge.none,
                                            xosc.SimulationTimeCondition(0, xosc.Rule.greaterOrEqual)))
        maneuver = xosc.Maneuver(f"{name}_maneuver")
        maneuver.add_event(event)
        group = xosc.ManeuverGroup(f"{name}_group")
        group.add_actor(name)
        group.add_maneuver(maneuver)
        act.add_maneuver_group(group)
    story.add_act(act)
    stop = xosc.ValueTrigger("end", 0, xosc.ConditionEdge.rising,
                             xosc.SimulationTimeCondition((t1 - t0) * 1e-6, xosc.Rule.greaterThan), "stop")
    board = xosc.StoryBoard(init, stop)
    board.add_story(story)
    scene = os.path.relpath(sc.scene, out)
    road = xosc.RoadNetwork(roadfile="road.xodr", scenegraph=scene)
    params = xosc.ParameterDeclarations()  # only the file's entities are in the scene (gsim's import reads it)
    params.add_parameter(xosc.Parameter(LOG_ACTORS_PARAMETER, xosc.ParameterType.string, "listed"))
    scenario = xosc.Scenario(sc.name, "gsim", params, entities, board, road, xosc.Catalog())
    path = out / f"{sc.name}.xosc"
    with atomic_path(path, suffix=".xosc") as tmp:
        scenario.write_xml(str(tmp))
    return path
