"""An OpenSCENARIO file as a gsim scenario: `gsim closed-loop FILE.xosc`, `gsim scenario render FILE.xosc` and
`gsim scenario import FILE.xosc OUT.yaml` (docs/scenarios.md).

The scene is the file's ``RoadNetwork/SceneGraphFile`` (a gsim scene or reconstruction folder, relative to the
file; ``--scene`` overrides), the log beside it; the road its ``LogicFile`` (an ``.xodr``, e.g. from `gsim scenario
export-road`), else gsim's own road along the log. The ego entity is the log's vehicle: its Init teleport may put it
beside its logged start (a sideways shift of its path, ``ego.shift_m``) but not elsewhere, and its Init speed is the
speed route-following agents aim for. Every other entity becomes an actor: a scene actor of the same name (its own
surfels) or a library asset of its category nearest its bounding box, on the track the storyboard gives it.

The storyboard is played (`Storyboard`) along the logged ego path at the scenario's step: that gives each actor a
track (what ``import`` writes and ``render`` renders). In a closed loop it is played again, live, against the ego the
agent drives (`LiveStoryboard`): conditions on the ego see where it really is, and the StopTrigger ends the run.
Scene actors the file does not name keep their logged tracks, unless the file declares the parameter
``gsim_log_actors`` as ``listed`` (gsim's export does): then only the entities of the file are in the scene.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from gsim.errors import NAME_RE, InputError

from .lanes import DRIVING, LaneMap
from .read import Plan, read_plan
from .storyboard import Storyboard

EGO_START_TOLERANCE_M = 1.0  # along the logged path: the ego's teleport must be beside its logged start
EGO_HEADING_TOLERANCE_RAD = math.radians(15)
ROAD_TOLERANCE_M = 0.5  # a LogicFile's lanes this close to the loop's own along the logged path are its road
EGO_PATH_TOLERANCE_M = 0.1  # an ego trajectory this close to the logged path is the logged path
LOG_ACTORS_PARAMETER = "gsim_log_actors"
STOP_HORIZON_S = 600.0  # a StopTrigger that fires within this of the start sets a closed loop's length


@dataclass
class Imported:
    """A read OpenSCENARIO file: its plan, the lanes it plays on, the gsim scenario it makes (tracks and all) and the
    actors' box geometry for the live storyboard."""
    plan: Plan
    lanes: LaneMap
    scenario: object  # gsim.bridges.closed_loop.scenario.LoopScenario
    stop_time_s: Optional[float]

    def live(self) -> "LiveStoryboard":
        return LiveStoryboard(self)


def loop_scenario(target, params=None, ego: Optional[str] = None, scene: Optional[str] = None):
    """A closed-loop scenario from an OpenSCENARIO file (its storyboard attached, `LoopScenario.with_storyboard`) or
    from what `load_loop_scenario` reads (a scenario YAML, a shipped name)."""
    if str(target).endswith(".xosc"):
        imported = read_xosc(target, params, ego, scene)
        return imported.scenario.with_storyboard(imported.live)
    from gsim.bridges.closed_loop.scenario import load_loop_scenario
    return load_loop_scenario(target)


def parse_params(items) -> Dict[str, str]:
    """``--param NAME=VALUE`` options as a dict."""
    out = {}
    for it in items or ():
        name, eq, value = it.partition("=")
        if not eq or not name:
            raise InputError(f"--param {it}: expected NAME=VALUE")
        out[name] = value
    return out


def scene_dirs(plan: Plan, scene: Optional[str]) -> Tuple[Path, Path]:
    """The scene and log folders of the file (``scene`` overrides its SceneGraphFile)."""
    from gsim.scenes.log import scene_and_log_dirs
    if scene is None and plan.scene is None:
        raise InputError(f"{plan.path}: no RoadNetwork/SceneGraphFile names the gsim scene to play it in: give one "
                         f"or --scene")
    from gsim.bridges.closed_loop.scenario import SCENARIOS_DIR, ensure_demo_street
    where = "--scene" if scene is not None else f"{plan.path}: SceneGraphFile"
    p = Path(scene) if scene is not None else plan.scene
    if p.resolve() == (SCENARIOS_DIR.parent / "out" / "demo").resolve():  # the shipped examples' street
        ensure_demo_street(p.resolve(), plan.path.name)
    if not p.is_dir():
        raise InputError(f"{where} {p}: no such folder (a gsim scene or reconstruction folder)")
    try:
        scene_dir, log_dir = scene_and_log_dirs(p)
    except InputError as e:
        raise InputError(f"{where} {p} is not a gsim scene: {e}") from None
    if not (log_dir / "log.json").is_file():
        raise InputError(f"{where} {p}: no driving log beside the scene ({log_dir}): gsim plays a file along a log")
    return scene_dir, log_dir


def lane_map(plan: Plan, scene_dir: Path) -> LaneMap:
    """The file's road (LogicFile), else gsim's own road along the scene's log (`gsim scenario export-road`)."""
    if plan.road is not None:
        if not plan.road.is_file():
            raise InputError(f"{plan.path}: RoadNetwork/LogicFile {plan.road}: no such file")
        return LaneMap.read(plan.road)
    from gsim.bridges.closed_loop.opendrive import export_road
    with tempfile.TemporaryDirectory(prefix="gsim-xosc-") as tmp:
        export_road(str(scene_dir), Path(tmp) / "road.xodr")
        return LaneMap.read(Path(tmp) / "road.xodr")


def _asset(lib, entity) -> str:
    """The library asset of the entity's category (a motorcycle: a cyclist where the library has none) nearest its
    box (log-size distance)."""
    ids = lib.ids()
    cats = [entity.category] + (["cyclist"] if entity.category == "motorcycle" else []) + \
        (["barrier"] if entity.category == "cone" else [])
    pool = [i for i in ids if lib.manifest(i).category in cats]
    if not pool:
        raise InputError(f"entity {entity.name!r}: the asset library has no {entity.category} asset")
    want = np.log(entity.size)
    return min(pool, key=lambda i: float(np.abs(np.log(lib.manifest(i).size) - want).sum()))


def _yaw_deg(h: float) -> float:
    return math.degrees(math.remainder(h, 2 * math.pi))


def read_xosc(path, params=None, ego: Optional[str] = None, scene: Optional[str] = None,
              step_s: float = 0.1) -> Imported:
    """An OpenSCENARIO file as a gsim closed-loop scenario (see the module docstring)."""
    from gsim.bridges.closed_loop.scenario import LoopScenario
    from gsim.editing import AssetLibrary
    from gsim.editing.scenario import parse_scenario
    from gsim.scene import load_scene
    from gsim.scenes.log import load_log
    from gsim.transforms import interpolate_pose
    plan = read_plan(path, params, ego)
    scene_dir, log_dir = scene_dirs(plan, scene)
    lanes = lane_map(plan, scene_dir)
    log = load_log(log_dir)
    actors = {a.id: a for a in load_scene(scene_dir).actors}
    lib = AssetLibrary.builtin()
    ts, poses = log.ego_timestamps_us, log.ego_poses
    t0, t1 = int(log.frames[0].timestamp_us), int(log.frames[-1].timestamp_us)
    sb = Storyboard(plan, lanes)
    # the ego: beside its logged start, or refused
    P0 = interpolate_pose(ts, poses, t0)
    teleport = next((a for who, a in plan.init if who == plan.ego and a.kind == "teleport"), None)
    shift, ego_track = 0.0, None
    if teleport is not None:
        shift = _ego_shift(plan, teleport, sb.position(teleport.v["position"]), P0)
    if plan.ego_path is not None:
        ego_track = _ego_track(plan, sb, ts, poses, t0, shift)
        if ego_track is not None:
            shift = 0.0  # (the path is where the ego drives)
    ego_speed = next((a.v["speed"] for who, a in plan.init if who == plan.ego and a.kind == "speed"), None)

    if ego_track is not None:  # the ego's path as the offline play drives it: the file's, or the log's shifted
        from gsim.editing.scenario import Track
        from gsim.editing.world import track_poses
        ets, eposes = track_poses(Track.model_validate(ego_track))
    else:
        ets, eposes = ts, poses.copy()
        eposes[:, :3, 3] += shift * eposes[:, :3, 1]

    def ego_at(t_us: int):
        lo, hi = max(t_us - 50_000, int(ets[0])), min(t_us + 50_000, int(ets[-1]))
        P, Q, R = (interpolate_pose(ets, eposes, t) for t in (t_us, hi, lo))
        speed = float(np.linalg.norm(Q[:2, 3] - R[:2, 3]) / max((hi - lo) * 1e-6, 1e-6))
        return float(P[0, 3]), float(P[1, 3]), math.atan2(P[1, 0], P[0, 0]), speed

    step_us = int(round(step_s * 1e6))
    others = plan.driven
    tracks: Dict[str, List[Tuple[int, float, float, float]]] = {n: [] for n in others}
    # played along the log (the tracks), and on past its end while a StopTrigger may still end the run
    horizon = t0 + int(STOP_HORIZON_S * 1e6) if plan.stop else t1
    t = t0
    sb.start(t, ego_at(t))
    while True:
        if t <= t1:
            for n in others:
                cx, cy = sb.box_centre(n)
                tracks[n].append((t, cx, cy, sb.states[n].h))
        t += step_us
        if sb.stopped or t > max(horizon, t1):
            break
        sb.step(t, ego_at(min(t, t1)))
    listed = plan.parameters.get(LOG_ACTORS_PARAMETER, "replay")
    if listed not in ("replay", "listed"):
        raise InputError(f"{plan.path}: parameter {LOG_ACTORS_PARAMETER} is {listed!r}; expected replay (the scene's "
                         f"actors the file does not name keep their logged tracks) or listed (they are removed)")
    edits = [{"kind": "remove", "actor": a} for a in actors
             if a in plan.deleted or (listed == "listed" and a not in plan.entities)]
    for n in others:
        if n in actors and _unchanged(actors[n], tracks[n]):
            continue  # a scene actor the file leaves on its logged track keeps it (and its heights)
        track = {"poses": [{"t_us": int(t), "xyz": [float(x), float(y), 0.0], "yaw_deg": _yaw_deg(h)}
                           for t, x, y, h in tracks[n]]}
        if n in actors:
            edits.append({"kind": "move", "actor": n, "track": track, "allow_overlap": True})
        else:
            if not NAME_RE.fullmatch(n):
                raise InputError(f"{plan.path}:{plan.entities[n].line}: entity name {n!r} cannot name a gsim actor "
                                 f"(letters, digits, '_', '-', '.')")
            edits.append({"kind": "insert", "asset": _asset(lib, plan.entities[n]), "id": n, "track": track,
                          "allow_overlap": True})
    name = plan.name if NAME_RE.fullmatch(plan.name or "") else plan.path.stem
    stop_us = None if sb.stop_time is None else t0 + int(round(sb.stop_time * 1e6))
    road = _road_options(plan, lanes, P0, shift)
    if plan.road is not None:
        _check_same_road(plan, lanes, road, eposes[:, :2, 3])
    data = {"schema_version": 1, "name": name, "scene": str(scene_dir), "log": str(log_dir), "edits": edits,
            "ego": {"shift_m": shift, **({"track": ego_track} if ego_track else {})},
            "time": {"end_us": min(stop_us or t1, t1)}, "output": name,
            "closed_loop": {"step_s": step_s, "road": road,
                            **({"target_speed_mps": ego_speed} if ego_speed else {}),
                            **({"duration_s": max(sb.stop_time, step_s)} if stop_us else {})}}
    sc = parse_scenario(data, str(plan.path), LoopScenario).resolve(plan.path.parent)
    return Imported(plan, lanes, sc, sb.stop_time)


def _ego_shift(plan: Plan, teleport, where, P0: np.ndarray) -> float:
    """The sideways shift of the ego's logged path that its Init teleport asks for; InputError where it is put
    elsewhere than beside its logged start."""
    x, y, h = where
    d = np.array([x, y]) - P0[:2, 3]
    fwd = P0[:2, 0] / np.linalg.norm(P0[:2, 0])
    lon, lat = float(d @ fwd), float(fwd[0] * d[1] - fwd[1] * d[0])
    turn = abs(math.remainder(h - math.atan2(fwd[1], fwd[0]), 2 * math.pi))
    if abs(lon) > EGO_START_TOLERANCE_M or turn > EGO_HEADING_TOLERANCE_RAD:
        raise InputError(f"{plan.path}:{teleport.line}: the ego {plan.ego!r} is put {lon:+.2f} m along and "
                         f"{math.degrees(turn):.0f} degrees off its logged start ({P0[0, 3]:.2f}, {P0[1, 3]:.2f}); "
                         f"gsim's ego starts where its log does (a sideways shift is allowed)")
    return lat if abs(lat) > 1e-3 else 0.0


def _ego_track(plan: Plan, sb: Storyboard, ts, poses, t0: int, shift: float) -> Optional[dict]:
    """The ego's path (``ego.track`` timed poses) from its FollowTrajectoryAction, or None where that is its logged
    path (with the shift) within EGO_PATH_TOLERANCE_M."""
    from gsim.transforms import interpolate_poses
    a = plan.ego_path
    run = sb.trajectory(a)
    if run.times is None:
        raise InputError(f"{plan.path}:{a.line}: the ego's FollowTrajectoryAction needs a Timing (gsim's ego path is "
                         f"timed)")
    t_us = t0 + np.round(np.asarray(run.times) * 1e6).astype(np.int64)
    inside = (t_us >= ts[0]) & (t_us <= ts[-1])
    logged = interpolate_poses(ts, poses, t_us[inside])
    there = logged[:, :2, 3] + shift * logged[:, :2, 1]
    if inside.any() and np.linalg.norm(there - run.xy[inside], axis=1).max() <= EGO_PATH_TOLERANCE_M:
        return None
    headings = run.headings if run.headings is not None else np.r_[
        np.arctan2(*np.diff(run.xy, axis=0)[:, ::-1].T), 0.0]
    if run.headings is None:
        headings[-1] = headings[-2] if len(headings) > 1 else 0.0
    return {"poses": [{"t_us": int(t), "xyz": [float(x), float(y), 0.0], "yaw_deg": _yaw_deg(h)}
                      for t, (x, y), h in zip(t_us, run.xy, headings)]}


def _check_same_road(plan: Plan, lanes: LaneMap, road: dict, path_xy: np.ndarray) -> None:
    """With a LogicFile: the forward lanes the closed loop drives (gsim's road along the ego's path, with the file's
    lane count and width where the ego starts) lie on the file's driving lanes along that path, within
    ROAD_TOLERANCE_M; else InputError (the loop would drive another road than the file's)."""
    from gsim.bridges.closed_loop.loop import network
    from gsim.bridges.closed_loop.road import Polyline
    from gsim.bridges.closed_loop.scenario import RoadOptions
    with tempfile.TemporaryDirectory(prefix="gsim-xosc-road-") as tmp:
        net = network(RoadOptions(**road), path_xy, Path(tmp))
        ours = [shape for lid, shape, _ in net.lanes() if lid.startswith("gsim_f")]
    path = Polyline(path_xy, "the ego's path")
    theirs = [p.centre for p in lanes.pieces if p.type in DRIVING]
    worst = 0.0
    for shape in ours:
        line = Polyline(shape, "a lane")
        pts = line.at(np.arange(0.0, line.length, 1.0))[0]
        s, _, _ = path.project(pts)
        pts = pts[(s > 0) & (s < path.length)]  # along the logged path, not the road's extensions past it
        if len(pts):
            worst = max(worst, float(np.min([c.project(pts)[2] for c in theirs], axis=0).max()))
    if worst > ROAD_TOLERANCE_M:
        raise InputError(f"{plan.path}: RoadNetwork/LogicFile {plan.road.name}: the closed loop drives gsim's road "
                         f"along the log (forward lanes: {road['lanes']}, {road['lane_width_m']:g} m wide), whose "
                         f"lanes lie up to {worst:.2f} m off this file's along the logged path (tolerance "
                         f"{ROAD_TOLERANCE_M} m): give the road `gsim scenario export-road` writes for this scene, or "
                         f"no LogicFile")


def _unchanged(actor, track, tolerance_m: float = 0.01) -> bool:
    """Whether the storyboard's box centres (t, x, y, heading) are the actor's logged ones."""
    return all(np.hypot(*(actor.pose_at(t)[:2, 3] - (x, y))) <= tolerance_m
               and abs(math.remainder(h - math.atan2(actor.pose_at(t)[1, 0], actor.pose_at(t)[0, 0]), 2 * math.pi))
               < 0.01 for t, x, y, h in track)


def save_imported(imported: Imported, path) -> None:
    """Write the scenario of an imported file as YAML (`gsim.editing.scenario.save_scenario`), its paths relative to
    the YAML's folder."""
    import os
    from gsim.editing.scenario import save_scenario
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        raise InputError(f"{path}: the scenario file to write must end in .yaml")
    base = path.resolve().parent
    sc = imported.scenario
    rel = {k: os.path.relpath(getattr(sc, k), base) for k in ("scene", "log", "output")}
    save_scenario(sc.model_copy(update=rel), path)


def _road_options(plan: Plan, lanes: LaneMap, P0: np.ndarray, shift: float) -> dict:
    """The closed loop's road (`RoadOptions`) as the file's road is where the ego starts: its lanes each way, their
    width and the ego's lane."""
    x, y = P0[:2, 3] + shift * P0[:2, 1]
    h = math.atan2(P0[1, 0], P0[0, 0])
    at = lanes.locate((x, y), h)
    if at is None:
        raise InputError(f"{plan.path}: the road {lanes.path.name} has no lane where the ego starts ({x:.2f}, "
                         f"{y:.2f}): is it the road of this scene's log (gsim scenario export-road)?")
    piece = lanes.pieces[at[0]]
    width = piece.width_at(at[1])
    forward = sorted({p.lane for p in lanes.pieces if p.road == piece.road and p.section == piece.section
                      and (p.lane < 0) == (piece.lane < 0) and p.type in DRIVING}, key=abs)
    ego_lane = len(forward) - 1 - forward.index(piece.lane)  # (0: the rightmost)
    # the opposite lanes: probes a lane width apart, left of the innermost forward lane, heading the other way
    left = np.array([-math.sin(h), math.cos(h)])
    inner = np.array([x, y]) + left * (at[2] * -1 + (len(forward) - 1 - ego_lane) * width)
    opposite = 0
    while opposite < 8 and lanes.locate(inner + left * width * (opposite + 1), h + math.pi) is not None:
        opposite += 1
    return {"lanes": len(forward), "lane_width_m": round(width, 3), "opposite_lanes": opposite, "ego_lane": ego_lane}


class LiveStoryboard:
    """The storyboard played in a closed loop against the ego the agent drives: ``start`` / ``step`` with the ego's
    reference point (x, y, heading, speed), then each actor's box-centre x-y, heading and speed (``actors``);
    ``stopped`` once the StopTrigger fired."""

    def __init__(self, imported: Imported):
        self.plan, self.lanes = imported.plan, imported.lanes
        self.names = imported.plan.driven
        self.sb: Optional[Storyboard] = None

    def start(self, t_us: int, ego) -> None:
        self.sb = Storyboard(self.plan, self.lanes)  # (a fresh play for every run)
        self.sb.start(t_us, ego)

    def step(self, t_us: int, ego) -> None:
        self.sb.step(t_us, ego)

    @property
    def stopped(self) -> bool:
        return self.sb.stopped

    def actors(self) -> Dict[str, Tuple[float, float, float, float]]:
        return {n: (*self.sb.box_centre(n), self.sb.states[n].h, self.sb.states[n].speed) for n in self.names}
