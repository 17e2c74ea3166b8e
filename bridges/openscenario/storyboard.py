"""The storyboard of an OpenSCENARIO `Plan` played step by step: the entities' motion, the actions that change it and
the triggers that start acts and events and end the run.

Each step (``step(t_us, ego)``): the entities move over the step (a running FollowTrajectoryAction places them on its
trajectory; otherwise a vehicle on a lane follows the lane's centre line, through the lanes that carry on from its end,
at its lateral offset, and an entity on no lane goes straight on at its heading), the ego is where the caller says (the
agent drives it), then every condition is evaluated on the entities as they are now, and the acts and events whose
triggers fire start (their actions from this time on; a teleport at once); the StopTrigger ends the run (``stopped``).

What the actions do (docs/scenarios.md): SpeedAction: the speed goes from its value at the start to the target with the
shape (step, linear, cubic, sinusoidal) over a time (dimension time), at a mean rate (rate: m/s^2) or over a distance
(distance: 2 d / (v0 + v1) seconds); a relative target follows its entity's speed. LongitudinalDistanceAction: the speed
that keeps a distance or time gap to an entity (`_keep_distance`). LaneChangeAction: the target lane (absolute id on the
entity's road, or relative to an entity's lane, + left) is reached with the shape over a time, a distance travelled, or
at a lateral rate (m/s); the entity then follows that lane, at the target lane offset. LaneOffsetAction: the offset from
the lane's centre (+ left of travel) with the shape, in the time at which the shape's peak lateral acceleration is
maxLateralAcc (linear: a bang-bang profile's). FollowTrajectoryAction: with a Timing the entity is where the trajectory
is at each time (absolute: simulation time, relative: since the action started; times scaled and offset), without one it
travels the trajectory at its speed; heading along the trajectory (a Polyline's vertex headings where every vertex has
one); when it ends (or is replaced) a vehicle on a lane follows that lane, anything else goes straight on. A new action
on an entity replaces its running one of the same kind (longitudinal, lateral; a trajectory is lateral, and longitudinal
too with a Timing). Event priorities: override (and 1.0's overwrite) ends the maneuver's other running events, skip does
not start an event while another of its maneuver runs, parallel runs alongside. Conditions: edges (rising, falling,
risingOrFalling, none) against the previous step, delays (the value that many seconds ago), triggering entities any or
all; distances (RelativeDistance, Distance, TimeHeadway, TimeToCollision) between box centres, or between the boxes'
extents along the measured axis (freespace), along the entity's heading (entity coordinates) or its lane's (lane, road);
a headway is that distance over the triggering entity's speed, a time to collision the distance over the speed at which
the two close along the line between them (infinite when they do not); speeds are along the heading.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, Optional, Tuple

import numpy as np

from gsim.bridges.closed_loop.road import Polyline
from gsim.errors import InputError

from .lanes import LaneMap
from .read import Action, Condition, Plan, Position, all_triggers

RULES = {"greaterThan": lambda a, b: a > b, "lessThan": lambda a, b: a < b, "equalTo": lambda a, b: abs(a - b) < 1e-6,
         "greaterOrEqual": lambda a, b: a >= b, "lessOrEqual": lambda a, b: a <= b,
         "notEqualTo": lambda a, b: abs(a - b) >= 1e-6}


def shape_fraction(shape: str, x: float) -> float:
    """How far (0..1) a transition of ``shape`` is at the fraction ``x`` of its span."""
    x = min(max(x, 0.0), 1.0)
    if shape == "step":
        return 1.0
    if shape == "linear":
        return x
    if shape == "cubic":
        return x * x * (3 - 2 * x)
    return 0.5 * (1 - math.cos(math.pi * x))  # sinusoidal


@dataclass
class _Running:
    action: Action
    event: Optional[str]
    start: float  # simulation time s
    span: float = 0.0  # s (or m for a distance-driven lane change)
    v0: float = 0.0  # from and to: the speed (longitudinal), the lateral offset (lateral)
    v1: float = 0.0
    by_distance: bool = False
    u0: float = 0.0
    path: Optional[Polyline] = None  # a trajectory's
    times: Optional[np.ndarray] = None  # a timed trajectory's vertex times (simulation s)
    headings: Optional[np.ndarray] = None
    xy: Optional[np.ndarray] = None  # a timed trajectory's vertices


@dataclass
class EntityState:
    x: float = 0.0
    y: float = 0.0
    h: float = 0.0
    speed: float = 0.0
    placed: bool = False
    odometer: float = 0.0
    path: Optional[Polyline] = None  # the lane chain it follows
    u: float = 0.0
    t: float = 0.0
    long: Optional[_Running] = None
    lat: Optional[_Running] = None
    traj: Optional[_Running] = None
    still_since: Optional[float] = None  # when it came to a stand (StandStillCondition)
    reverse: bool = False  # it follows its lane against the lane's direction
    accel: float = 0.0  # over the last step (AccelerationCondition)


@dataclass
class _Cond:
    prev: Optional[bool] = None
    history: Deque[Tuple[float, bool]] = field(default_factory=deque)  # (time, value): a delayed condition's


class Storyboard:
    """``plan`` played on ``lanes`` (None: no lane positions or lane following); ``start(t_us, ego)`` applies Init,
    ``step(t_us, ego)`` advances (``ego``: (x, y, heading rad, speed m/s) of its reference point)."""

    def __init__(self, plan: Plan, lanes: Optional[LaneMap]):
        self.plan, self.lanes = plan, lanes
        self.states: Dict[str, EntityState] = {n: EntityState() for n in plan.entities if n not in plan.deleted}
        self.conds: Dict[int, _Cond] = {}
        self.started: Dict[Tuple[str, str], float] = {}  # (element kind, name) -> when it started
        self.ended: Dict[Tuple[str, str], float] = {}
        # the condition pass after which each transition happened (a transition condition holds in the next pass)
        self._passes: Dict[Tuple[str, str, str], int] = {}
        self._pass = 0
        self.stopped = False
        self.stop_time: Optional[float] = None
        self.tau = 0.0
        self._dt = 0.0
        self.t0_us = 0

    # ------------------------------------------------------------------ the run
    def start(self, t_us: int, ego) -> None:
        self.t0_us, self.tau = int(t_us), 0.0
        self._set_ego(ego)
        for who, a in self.plan.init:
            if who != self.plan.ego:  # (the ego is where the caller says: gsim.bridges.openscenario.load)
                self._begin(who, a, None)
        for who, st in self.states.items():
            if not st.placed:
                raise InputError(f"{self.plan.path}:{self.plan.entities[who].line}: entity {who!r} is never placed: "
                                 f"give it a TeleportAction in Init")
            self._still(st)
        self._evaluate()

    def step(self, t_us: int, ego) -> None:
        tau = (int(t_us) - self.t0_us) * 1e-6
        dt = self._dt = tau - self.tau
        self.tau = tau
        for who, st in self.states.items():
            if who != self.plan.ego:
                self._move(who, st, dt)
        self._set_ego(ego)
        self._evaluate()

    def pose(self, name: str) -> Tuple[float, float, float, float]:
        """(x, y, heading, speed) of the entity's reference point."""
        st = self.states[name]
        return st.x, st.y, st.h, st.speed

    def box_centre(self, name: str) -> Tuple[float, float]:
        """The world x-y of the entity's box centre."""
        st, e = self.states[name], self.plan.entities[name]
        c, s = math.cos(st.h), math.sin(st.h)
        return st.x + c * e.centre[0] - s * e.centre[1], st.y + s * e.centre[0] + c * e.centre[1]

    # ------------------------------------------------------------------ positions
    def fail(self, line: int, msg: str):
        raise InputError(f"{self.plan.path}:{line}: {msg}")

    def _on_lane(self, x: float, y: float, h: float):
        return None if self.lanes is None else self.lanes.locate((x, y), h)

    def _road_s(self, piece: int, u: float) -> float:
        return self.lanes.pieces[piece].s_of_u(u)

    def position(self, p: Position) -> Tuple[float, float, float]:
        """World (x, y, heading) of a position (relative ones from the entities as they are now)."""
        v = p.v
        if p.kind == "world":
            return v["x"], v["y"], v["h"] or 0.0
        if p.kind == "relative_object":
            ref = self.states[v["entity"]]
            if not ref.placed:
                self.fail(p.line, f"a position relative to {v['entity']!r}, which is not placed yet")
            c, s = math.cos(ref.h), math.sin(ref.h)
            return ref.x + c * v["dx"] - s * v["dy"], ref.y + s * v["dx"] + c * v["dy"], self._turn(ref.h, v)
        if self.lanes is None:
            self.fail(p.line, "a lane position, but the scenario has no road (RoadNetwork LogicFile)")
        where = f"{self.plan.path}:{p.line}"
        if p.kind == "road":
            x, y, h = self.lanes.road_point(v["road"], v["s"], v["t"], where)
            return x, y, self._turn(h, v)
        if p.kind == "relative_road":  # ds, dt from the entity's place on the road of the lane it drives
            ref = self.states[v["entity"]]
            at = self._lane_of(ref) if ref.placed else None
            if at is None:
                self.fail(p.line, f"a RelativeRoadPosition from {v['entity']!r}, which is on no lane of the road")
            road = self.lanes.pieces[at[0]].road
            s, t = self.lanes.road_coords(road, (ref.x, ref.y))
            x, y, h = self.lanes.road_point(road, s + v["ds"], t + v["dt"], where)
            return x, y, self._turn(h, v)
        if p.kind == "lane":
            road, lane, s, off = v["road"], v["lane"], v["s"], v["offset"]
            x, y, h = self.lanes.lane_point(road, lane, s, off if lane < 0 else -off, where)
            return x, y, self._turn(h, v)
        ref = self.states[v["entity"]]
        at = self._lane_of(ref) if ref.placed else None
        if at is None:
            self.fail(p.line, f"a RelativeLanePosition from {v['entity']!r}, which is on no lane of the road")
        piece = self.lanes.pieces[at[0]]
        lane = piece.lane + v["dlane"]
        if piece.lane * lane <= 0:  # lane 0 is the centre line, not a lane
            lane += 1 if v["dlane"] > 0 else -1
        s = self._road_s(at[0], at[1])
        target = self.lanes.find(piece.road, lane, s, where)
        chain = self.lanes.chain(target)  # ds along the road's s, through the lanes that carry on
        u = self.lanes.pieces[target].u_of_s(s) + (v["ds"] if lane < 0 else -v["ds"])
        if u < 0:
            self.fail(p.line, f"a RelativeLanePosition {v['ds']:g} m from {v['entity']!r} is behind the start of "
                              f"lane {lane} of road {piece.road!r}")
        (xy,), (h,) = chain.at(u)
        off = v["offset"] if lane < 0 else -v["offset"]
        return float(xy[0] - off * math.sin(h)), float(xy[1] + off * math.cos(h)), self._turn(float(h), v)

    @staticmethod
    def _turn(h: float, v) -> float:
        if v.get("h") is None:
            return h
        return v["h"] if v.get("ref") == "absolute" else h + v["h"]

    def _place(self, who: str, x: float, y: float, h: float) -> None:
        st = self.states[who]
        st.x, st.y, st.h, st.placed = x, y, h, True
        self._bind(who)

    def _bind(self, who: str) -> None:
        """A vehicle follows the lane it is on from where it is now, in the direction it faces (a lane's direction or
        against it); anything else (or off the lanes) goes straight."""
        st = self.states[who]
        st.path = None
        if self.plan.entities[who].kind == "vehicle" and self.lanes is not None:
            at = self._lane_of(st)
            if at is not None:
                self._follow_lane(st, at[0], at[3])

    def _follow_lane(self, st: EntityState, piece: int, reverse: bool) -> None:
        st.path, st.reverse = self.lanes.chain(piece, reverse), reverse
        u, t, _ = st.path.project((st.x, st.y))
        st.u, st.t = float(u[0]), float(t[0])

    def _drop_trajectory(self, who: str) -> None:
        """The entity's running trajectory ends; it goes on from where it is."""
        st = self.states[who]
        if st.traj is not None:
            self._end_action(st.traj.action.name)
            st.traj = None
            self._bind(who)

    def _mark(self, table: Dict[Tuple[str, str], float], key: Tuple[str, str]) -> None:
        """A storyboard element started (table ``started``) or ended (``ended``) now, unless it did before."""
        if key in table:
            return
        table[key] = self.tau
        self._passes[("start" if table is self.started else "end",) + key] = self._pass

    def _set_ego(self, ego) -> None:
        st = self.states[self.plan.ego]
        x, y, h, v = map(float, ego)
        if st.placed:
            st.odometer += math.hypot(x - st.x, y - st.y)
            st.accel = (v - st.speed) / self._dt if self._dt > 0 else 0.0
        st.x, st.y, st.h, st.speed, st.placed = x, y, h, v, True
        self._still(st)

    # ------------------------------------------------------------------ actions
    def _begin(self, who: str, a: Action, event: Optional[str]) -> None:
        st, tau, v = self.states[who], self.tau, a.v
        self._mark(self.started, ("action", a.name))
        if a.kind == "teleport":
            self._place(who, *self.position(v["position"]))
            self._end_action(a.name)
            return
        if a.kind == "keep_distance":  # (a longitudinal action: it replaces the running one and a timed trajectory)
            if st.long is not None:
                self._end_action(st.long.action.name)
            if st.traj is not None and st.traj.times is not None:
                self._drop_trajectory(who)
            st.long = _Running(a, event, tau)
            return
        if a.kind == "speed":  # (it replaces a running speed change, and a timed trajectory, which sets the speed)
            if st.long is not None:
                self._end_action(st.long.action.name)
            if st.traj is not None and st.traj.times is not None:
                self._drop_trajectory(who)
            v0, v1 = st.speed, self._target_speed(v)
            dim, val = v["dimension"], v["value"]
            span = 0.0 if v["shape"] == "step" else (val if dim == "time" else abs(v1 - v0) / val if dim == "rate"
                                                     else 2 * val / max(v0 + v1, 1e-6))
            st.long = _Running(a, event, tau, span, v0, v1)
            if span <= 0:
                st.speed = v1
                if not v.get("continuous"):
                    st.long = None
                    self._end_action(a.name)
            return
        if a.kind in ("lane_change", "lane_offset"):  # (they replace a running lateral action or trajectory)
            self._drop_trajectory(who)
            if st.path is None:
                self.fail(a.line, f"{a.name}: {who!r} is on no lane of the road at t = {tau:.2f} s")
            if st.lat is not None:
                self._end_action(st.lat.action.name)
            if a.kind == "lane_change":
                self._retarget(who, st, a)
            t1 = v["offset"]
            d = abs(t1 - st.t)
            if a.kind == "lane_change":
                dim, val = v["dimension"], v["value"]
                span = 0.0 if v["shape"] == "step" else (d / val if dim == "rate" else val)
                by_distance = dim == "distance"
            else:
                acc = max(v["max_lat_acc"], 1e-6)
                k = {"step": 0.0, "linear": 4.0, "cubic": 6.0, "sinusoidal": math.pi ** 2 / 2}[v["shape"]]
                span, by_distance = math.sqrt(k * d / acc), False
            st.lat = _Running(a, event, tau, span, st.t, t1, by_distance, st.u)
            if span <= 0:
                st.t, st.lat = t1, None
                self._end_action(a.name)
            return
        # a trajectory: the path (a running lateral action ends), and with a Timing the speed too
        run = self.trajectory(a, event)
        if not st.placed:  # (an entity Init sets on a trajectory starts at its start)
            x0, y0 = (run.xy[0] if run.times is not None else run.path.xy[0])
            h0 = run.headings[0] if run.headings is not None else math.atan2(
                *(np.diff(run.xy[:2] if run.times is not None else run.path.xy[:2], axis=0)[0][::-1]))
            st.x, st.y, st.h, st.placed = float(x0), float(y0), float(h0), True
        for r in (st.lat, st.traj, st.long if run.times is not None else None):
            if r is not None:
                self._end_action(r.action.name)
        st.lat, st.traj = None, run
        if run.times is not None:  # timed: where it is at this time, from now on
            st.long = None
            self._follow(who, st, 0.0, st.speed)

    def _keep_distance(self, who: str, st: EntityState, dt: float) -> None:
        """LongitudinalDistanceAction over the step: the speed that makes the gap to the entity (signed along the
        heading: ahead positive) the one asked for at the step's end, within the action's DynamicConstraints (none:
        exactly; with constraints, closing the error in about a second and, with a maxDeceleration, no faster than that
        braking can still stop at the gap; a time gap is the reference's speed times it); a
        continuous action keeps at it, another ends where it holds (within 0.1 m and 0.1 m/s)."""
        r, v = st.long, st.long.action.v
        ref = self.states[v["entity"]]
        u = np.array([math.cos(st.h), math.sin(st.h)])
        gap = float((np.array(self.box_centre(v["entity"])) - np.array(self.box_centre(who))) @ u)
        if v["freespace"]:
            gap -= math.copysign(0.5 * (self.plan.entities[who].size[0] + self.plan.entities[v["entity"]].size[0]),
                                 gap)
        ref_along = ref.speed * math.cos(ref.h - st.h)
        want = v["distance"] if v["distance"] is not None else v["time_gap"] * max(ref_along, 0.0)
        side = {"trailingReferencedEntity": 1.0, "leadingReferencedEntity": -1.0}.get(v["displacement"],
                                                                                   1.0 if gap >= 0 else -1.0)
        error = gap - side * want
        constrained = any(v[k] is not None for k in ("max_acc", "max_dec", "max_speed"))
        # unconstrained: the speed that closes the error in this step; constrained: in a second, and no faster than
        # its braking can still stop the error at the gap
        close = abs(error) / (max(1.0, dt) if constrained else max(dt, 1e-6))
        if v["max_dec"] is not None:
            close = min(close, math.sqrt(2.0 * v["max_dec"] * abs(error)))
        speed = ref_along + math.copysign(close, error) if dt > 0 else st.speed
        if v["max_acc"] is not None:
            speed = min(speed, st.speed + v["max_acc"] * dt)
        if v["max_dec"] is not None:
            speed = max(speed, st.speed - v["max_dec"] * dt)
        if v["max_speed"] is not None:
            speed = min(speed, v["max_speed"])
        st.speed = max(speed, 0.0)
        if not v["continuous"] and abs(gap - side * want) < 0.1 and abs(st.speed - ref_along) < 0.1:
            st.long = None
            self._end_action(r.action.name)

    def _target_speed(self, v) -> float:
        """A speed action's target now: absolute, or from its entity's speed (plus a delta, times a factor)."""
        if "relative_to" not in v:
            return v["speed"]
        ref = self.states[v["relative_to"]].speed
        return max(0.0, ref + v["speed"] if v["value_type"] == "delta" else ref * v["speed"])

    def _lane_of(self, st: EntityState):
        """(piece, arc length, lateral offset, against the lane's direction) of the lane an entity drives, or None."""
        at = self._on_lane(st.x, st.y, st.h)
        if at is not None:
            return (*at, False)
        at = self._on_lane(st.x, st.y, st.h + math.pi)
        return None if at is None else (*at, True)

    def _retarget(self, who: str, st: EntityState, a: Action) -> None:
        """A lane change's target lane chain (left and right as the entity drives); the entity's u and t re-expressed
        on it."""
        here = self._lane_of(st)
        if here is None:
            self.fail(a.line, f"{a.name}: {who!r} is on no lane of the road at t = {self.tau:.2f} s")
        piece = self.lanes.pieces[here[0]]
        if "entity" in a.v:
            ref = self._lane_of(self.states[a.v["entity"]])
            if ref is None:
                self.fail(a.line, f"{a.name}: {a.v['entity']!r} is on no lane of the road")
            target = self.lanes.neighbour(ref[0], -a.v["lane"] if ref[3] else a.v["lane"])
            lane = None if target is None else self.lanes.pieces[target].lane
        else:
            lane = a.v["lane"]
        s = self._road_s(here[0], here[1])
        found = None if lane is None else next(
            (i for i, p in enumerate(self.lanes.pieces) if p.road == piece.road and p.lane == lane
             and min(p.s_start, p.s_end) - 1e-6 <= s <= max(p.s_start, p.s_end) + 1e-6), None)
        if found is None:
            self.fail(a.line, f"{a.name}: road {piece.road!r} has no target lane "
                              f"{lane if lane is not None else ''} beside {who!r} at t = {self.tau:.2f} s")
        p = self.lanes.pieces[found]
        lane_h = float(p.centre.at(p.u_of_s(s))[1][0])
        self._follow_lane(st, found, abs(math.remainder(st.h - lane_h, 2 * math.pi)) > math.pi / 2)

    def trajectory(self, a: Action, event: Optional[str] = None) -> _Running:
        """A FollowTrajectoryAction's trajectory from now: ``times`` (simulation s), ``xy`` and ``headings`` at its
        vertices when it is timed, else a ``path`` to travel (and ``headings`` along it where given)."""
        v = a.v
        if v["shape"] == "polyline":
            pts = [self.position(p) for p in v["positions"]]
            xy = np.array([p[:2] for p in pts])
            given = all(p.v.get("h") is not None for p in v["positions"])
            headings = np.unwrap([p[2] for p in pts]) if given else None
            times = v["times"]
        else:
            x0, y0, h0 = self.position(v["start"])
            s = np.linspace(0.0, v["length"], max(int(v["length"] / 0.1), 2) + 1)
            h = h0 + v["curvature"] * s + 0.5 * v["curvature_dot"] * s * s
            ds = np.diff(s)
            xy = np.c_[x0 + np.r_[0, np.cumsum(ds * np.cos(0.5 * (h[1:] + h[:-1])))],
                       y0 + np.r_[0, np.cumsum(ds * np.sin(0.5 * (h[1:] + h[:-1])))]]
            headings = h
            t0, t1 = v["start_time"], v["stop_time"]
            times = None if t0 is None or t1 is None else list(np.linspace(t0, t1, len(s)))
        keep = np.r_[True, np.linalg.norm(np.diff(xy, axis=0), axis=1) > 1e-9]
        timing = v["timing"]
        run = _Running(a, event, self.tau)
        if timing is not None and times is not None:
            t = np.asarray(times, float) * timing["scale"] + timing["offset"]
            run.times = t + (self.tau if timing["domain"] == "relative" else 0.0)
            run.headings, run.xy = headings, xy
        else:
            if keep.sum() < 2:
                self.fail(a.line, f"{a.name}: the trajectory has no length")
            run.path = Polyline(xy[keep])
            run.headings = None if headings is None else np.asarray(headings)[keep]
        return run

    def _end_action(self, name: str) -> None:
        self._mark(self.ended, ("action", name))

    # ------------------------------------------------------------------ motion
    def _move(self, who: str, st: EntityState, dt: float) -> None:
        if not st.placed:
            return
        x0, y0, speed0 = st.x, st.y, st.speed
        tau = self.tau
        v_before = st.speed
        if st.long is not None and st.long.action.kind == "keep_distance":
            self._keep_distance(who, st, dt)
            v_before = st.speed  # (its speed over the whole step: the gap it asked for at the step's end)
        elif st.long is not None:
            r = st.long
            x = (tau - r.start) / r.span if r.span > 0 else 1.0
            target = self._target_speed(r.action.v)  # (a relative target moves with its entity)
            st.speed = r.v0 + (target - r.v0) * shape_fraction(r.action.v["shape"], x)
            if x >= 1.0 - 1e-9:
                st.speed = target
                if not r.action.v.get("continuous"):  # (a continuous one keeps the target until replaced)
                    st.long = None
                    self._end_action(r.action.name)
        if st.traj is not None:
            self._follow(who, st, dt, v_before)
        elif st.path is not None:
            du = 0.5 * (v_before + st.speed) * dt
            st.u += du
            t_before = st.t
            if st.lat is not None:
                r = st.lat
                x = ((st.u - r.u0) / r.span if r.by_distance else (tau - r.start) / r.span) if r.span > 0 else 1.0
                st.t = r.v0 + (r.v1 - r.v0) * shape_fraction(r.action.v["shape"], x)
                if x >= 1.0 - 1e-9:
                    st.t, st.lat = r.v1, None
                    self._end_action(r.action.name)
            if du > 1e-9 or st.t != t_before:  # (a car standing on its lane keeps the heading it was put at)
                (p,), (h,) = st.path.at(st.u)
                over = max(st.u - st.path.length, 0.0)  # past the end of its lanes: straight on
                st.x = float(p[0] - st.t * math.sin(h) + over * math.cos(h))
                st.y = float(p[1] + st.t * math.cos(h) + over * math.sin(h))
                st.h = float(h + (math.atan2(st.t - t_before, du) if du > 1e-6 else 0.0))
                if over > 0:
                    st.path = None
        else:
            d = 0.5 * (v_before + st.speed) * dt
            st.x += d * math.cos(st.h)
            st.y += d * math.sin(st.h)
        st.odometer += math.hypot(st.x - x0, st.y - y0)
        st.accel = (st.speed - speed0) / dt if dt > 0 else 0.0
        self._still(st)

    def _still(self, st: EntityState) -> None:
        st.still_since = (st.still_since if st.still_since is not None else self.tau) if st.speed < 1e-3 else None

    def _follow(self, who: str, st: EntityState, dt: float, v_before: float) -> None:
        r = st.traj
        if r.times is not None:
            xy = r.xy
            t = min(max(self.tau, r.times[0]), r.times[-1])
            x, y = np.interp(t, r.times, xy[:, 0]), np.interp(t, r.times, xy[:, 1])
            moved = math.hypot(x - st.x, y - st.y)
            if r.headings is not None:
                h = float(np.interp(t, r.times, r.headings))
            else:
                k = int(np.clip(np.searchsorted(r.times, t, side="right") - 1, 0, len(xy) - 2))
                d = xy[k + 1] - xy[k]
                h = math.atan2(d[1], d[0]) if np.linalg.norm(d) > 1e-9 else st.h
            st.speed = moved / dt if dt > 0 else st.speed
            st.x, st.y, st.h = float(x), float(y), h
            done = self.tau >= r.times[-1] - 1e-9
        else:
            r.u0 += 0.5 * (v_before + st.speed) * dt
            (p,), (h,) = r.path.at(r.u0)
            if r.headings is not None:
                h = float(np.interp(r.u0, r.path.s, r.headings))
            st.x, st.y, st.h = float(p[0]), float(p[1]), float(h)
            done = r.u0 >= r.path.length - 1e-9
        if done:  # it goes on from the trajectory's end
            self._drop_trajectory(who)

    # ------------------------------------------------------------------ triggers
    def _evaluate(self) -> None:
        plan, tau = self.plan, self.tau
        values = {}
        for trig in all_triggers(self.plan.acts, self.plan.stop):
            for g in trig:
                for c in g:
                    if id(c) not in values:
                        values[id(c)] = self._condition(c)
        fires = lambda trig: bool(trig) and any(all(values[id(c)] for c in g) for g in trig)  # noqa: E731
        self._pass += 1  # (what happens from here on is seen by the next pass)
        if fires(plan.stop) and not self.stopped:
            self.stopped, self.stop_time = True, tau
        for act in plan.acts:
            key = ("act", act.name)
            if key not in self.started and (not act.start or fires(act.start)):
                self._mark(self.started, key)
            if key not in self.started or key in self.ended:
                continue
            if fires(act.stop):
                for ev in act.events:
                    self._stop_event(ev)
                self._close(act)
                self._mark(self.ended, key)
                continue
            for ev in act.events:
                ek = ("event", ev.name)
                if ek in self.started or not (not ev.trigger or fires(ev.trigger)):
                    continue
                rivals = [o for o in act.events if o.maneuver == ev.maneuver and o is not ev
                          and ("event", o.name) in self.started and ("event", o.name) not in self.ended]
                if ev.priority == "skip" and rivals:
                    continue
                if ev.priority in ("override", "overwrite"):
                    for o in rivals:
                        self._stop_event(o)
                self._mark(self.started, ek)
                for name in ("maneuver", "maneuverGroup"):
                    self._mark(self.started, (name, ev.maneuver if name == "maneuver" else ev.group))
                for who in ev.actors:
                    for a in ev.actions:
                        self._begin(who, a, ev.name)
            self._close(act)
        for story in {a.story for a in plan.acts}:  # a story runs from its first act's start to its last act's end
            acts = [("act", a.name) for a in plan.acts if a.story == story]
            if any(k in self.started for k in acts):
                self._mark(self.started, ("story", story))
            if all(k in self.ended for k in acts):
                self._mark(self.ended, ("story", story))

    def _stop_event(self, ev) -> None:
        if ("event", ev.name) in self.ended:
            return
        for who, st in self.states.items():
            for kind in ("long", "lat", "traj"):
                r = getattr(st, kind)
                if r is not None and r.event == ev.name:
                    if kind == "traj":
                        self._drop_trajectory(who)
                    setattr(st, kind, None)
        for a in ev.actions:
            self._end_action(a.name)
        self._mark(self.ended, ("event", ev.name))

    def _close(self, act) -> None:
        """Events whose actions have all ended end; maneuvers, groups and the act when all of theirs have."""
        for ev in act.events:
            if ("event", ev.name) in self.started and all(("action", a.name) in self.ended for a in ev.actions):
                self._mark(self.ended, ("event", ev.name))
        for kind, key in (("maneuver", lambda e: e.maneuver), ("maneuverGroup", lambda e: e.group)):
            for name in {key(e) for e in act.events}:
                if all(("event", e.name) in self.ended for e in act.events if key(e) == name):
                    self._mark(self.ended, (kind, name))
        if all(("event", e.name) in self.ended for e in act.events):  # (an act of no events ends as it starts)
            self._mark(self.ended, ("act", act.name))

    def _condition(self, c: Condition) -> bool:
        raw = self._raw(c)
        mem = self.conds.setdefault(id(c), _Cond())
        prev, mem.prev = mem.prev, raw
        edge = c.edge
        if edge == "none":
            value = raw
        elif prev is None:
            value = False
        else:
            value = {"rising": raw and not prev, "falling": prev and not raw,
                     "risingOrFalling": raw != prev}.get(edge, raw)
        if c.delay <= 0:
            return value
        mem.history.append((self.tau, value))  # (kept back to the latest value at or before `delay` ago)
        then = self.tau - c.delay + 1e-9
        while len(mem.history) > 1 and mem.history[1][0] <= then:
            mem.history.popleft()
        return mem.history[0][0] <= then and mem.history[0][1]

    def _raw(self, c: Condition) -> bool:
        v, tau = c.v, self.tau
        if c.kind == "time":
            return RULES[v["rule"]](tau, v["value"])
        if c.kind == "state":
            key = (v["element"], v["ref"])
            started, ended = key in self.started, key in self.ended
            state = v["state"]
            if state == "startTransition":
                return self._passes.get(("start",) + key) == self._pass
            if state in ("endTransition", "stopTransition"):
                return self._passes.get(("end",) + key) == self._pass
            if state == "runningState":
                return started and not ended
            if state == "completeState":
                return ended
            return not started  # standbyState
        results = [self._entity_condition(c, who) for who in c.entities]
        return all(results) if c.rule == "all" else any(results)

    def _entity_condition(self, c: Condition, who: str) -> bool:
        v, st = c.v, self.states[who]
        if c.kind == "reach":
            x, y, _ = self.position(v["position"])
            return math.hypot(st.x - x, st.y - y) <= v["tolerance"]
        if c.kind == "traveled":
            return st.odometer >= v["value"]
        if c.kind == "standstill":
            return st.still_since is not None and self.tau - st.still_since >= v["value"] - 1e-9
        if c.kind == "acceleration":
            return RULES[v["rule"]](st.accel, v["value"])
        if c.kind in ("speed", "relative_speed"):
            value = st.speed - (self.states[v["entity"]].speed if c.kind == "relative_speed" else 0.0)
            return RULES[v["rule"]](value, v["value"])
        target = self._target(v)
        d = self._distance_to(who, *target, v["type"], v["freespace"], v["system"])
        if c.kind == "headway":  # the time the triggering entity takes to cover the distance at its speed
            value = d / st.speed if st.speed > 1e-9 else math.inf
        elif c.kind == "ttc":  # the distance over the speed at which it closes (infinite when it does not)
            ref = self.states[v["entity"]] if "entity" in v else None
            u = np.array(target[0]) - np.array(self.box_centre(who))
            u = u / max(float(np.linalg.norm(u)), 1e-9)
            mine = st.speed * np.array([math.cos(st.h), math.sin(st.h)])
            theirs = ref.speed * np.array([math.cos(ref.h), math.sin(ref.h)]) if ref is not None else np.zeros(2)
            closing = float((mine - theirs) @ u)
            value = d / closing if closing > 1e-9 else math.inf
        else:
            value = d
        return RULES[v["rule"]](value, v["value"])

    def _target(self, v) -> tuple:
        """What a distance is measured to: (its centre, (entity, heading) for its box or None for a position)."""
        if "entity" in v:
            return self.box_centre(v["entity"]), (self.plan.entities[v["entity"]], self.states[v["entity"]].h)
        return self.position(v["position"])[:2], None

    def _distance_to(self, a: str, cb, other, kind: str, freespace: bool, system: str) -> float:
        """The distance from entity ``a`` to a box centred at ``cb`` (``other``: (entity, heading)) or a point."""
        sa = self.states[a]
        h = sa.h
        if system in ("lane", "road"):
            at = self._lane_of(sa)
            if at is not None:
                h = float(self.lanes.pieces[at[0]].centre.at(at[1])[1][0])
        ca = np.array(self.box_centre(a))
        u, n = np.array([math.cos(h), math.sin(h)]), np.array([-math.sin(h), math.cos(h)])
        d = np.asarray(cb, float) - ca
        lon, lat = abs(float(d @ u)), abs(float(d @ n))
        if freespace:
            def extent(e, heading, axis):
                rel = heading - math.atan2(axis[1], axis[0])
                return 0.5 * e.size[0] * abs(math.cos(rel)) + 0.5 * e.size[1] * abs(math.sin(rel))
            ea = self.plan.entities[a]
            theirs = (lambda axis: extent(*other, axis)) if other is not None else (lambda axis: 0.0)  # noqa: E731
            lon = max(0.0, lon - extent(ea, sa.h, u) - theirs(u))
            lat = max(0.0, lat - extent(ea, sa.h, n) - theirs(n))
        if kind == "longitudinal":
            return lon
        if kind == "lateral":
            return lat
        return math.hypot(lon, lat)
