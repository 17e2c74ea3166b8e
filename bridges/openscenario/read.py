"""An OpenSCENARIO 1.0-1.3 file read into gsim's plan of it (`Plan`): checked against the standard's schema (the
XSDs scenariogeneration ships, with xmlschema), then against gsim's subset (`SUBSET`, element by element: anything
else is refused with its line), its parameters and expressions resolved (``--param NAME=VALUE`` overrides a
declaration), then parsed with scenariogeneration (`xosc.ParseOpenScenario`; entities from catalogs with its
`CatalogReader`, the catalog's entry checked the same way) into the entities, the Init actions, the acts, events,
actions and triggers the storyboard plays (`gsim.bridges.openscenario.storyboard`). Errors are `InputError`s of one
line naming the file, the line and the element; nothing runs before the whole file is read.
"""
from __future__ import annotations

import contextlib
import io
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from gsim.errors import InputError

# gsim's subset: the elements a file may hold (docs/scenarios.md says what each does in gsim)
SUBSET = frozenset("""
OpenSCENARIO FileHeader License ParameterDeclarations ParameterDeclaration CatalogLocations VehicleCatalog
PedestrianCatalog MiscObjectCatalog ControllerCatalog TrajectoryCatalog ManeuverCatalog EnvironmentCatalog RouteCatalog
Directory Catalog CatalogReference ParameterAssignments ParameterAssignment File RoadNetwork LogicFile
SceneGraphFile Entities ScenarioObject Vehicle Pedestrian MiscObject BoundingBox Center Dimensions Performance Axles
FrontAxle RearAxle AdditionalAxle TrailerHitch TrailerCoupler Trailer TrailerRef Properties Property ObjectController
Controller
Storyboard Init Actions GlobalAction EntityAction DeleteEntityAction Private PrivateAction TeleportAction Position
WorldPosition LanePosition RelativeLanePosition RoadPosition RelativeRoadPosition
RelativeObjectPosition Orientation LongitudinalAction SpeedAction SpeedActionDynamics SpeedActionTarget
AbsoluteTargetSpeed RelativeTargetSpeed LongitudinalDistanceAction DynamicConstraints ControllerAction
ActivateControllerAction LateralAction LaneChangeAction
LaneChangeActionDynamics LaneChangeTarget RelativeTargetLane
AbsoluteTargetLane LaneOffsetAction LaneOffsetActionDynamics LaneOffsetTarget AbsoluteTargetLaneOffset RoutingAction
FollowTrajectoryAction TrajectoryRef Trajectory Shape Polyline Vertex Clothoid TimeReference Timing None
TrajectoryFollowingMode Story Act ManeuverGroup Actors EntityRef Maneuver Event Action StartTrigger StopTrigger
ConditionGroup Condition ByValueCondition ByEntityCondition TriggeringEntities EntityCondition SimulationTimeCondition
StoryboardElementStateCondition ReachPositionCondition RelativeDistanceCondition TraveledDistanceCondition
DistanceCondition TimeHeadwayCondition TimeToCollisionCondition TimeToCollisionConditionTarget SpeedCondition
RelativeSpeedCondition StandStillCondition AccelerationCondition
""".split())
VEHICLE_CATEGORIES = {"car": "car", "van": "car", "truck": "truck", "trailer": "truck", "semitrailer": "truck",
                      "bus": "bus", "motorbike": "motorcycle", "bicycle": "cyclist"}
MISC_CATEGORIES = {"obstacle": "cone", "barrier": "barrier", "guardRail": "barrier"}
SHAPES = ("step", "linear", "cubic", "sinusoidal")
MAX_LENGTH_M = 10_000.0  # a trajectory or road longer than this is refused (its samples would not fit)
EDGES = ("none", "rising", "falling", "risingOrFalling")
RULES = ("greaterThan", "lessThan", "equalTo", "greaterOrEqual", "lessOrEqual", "notEqualTo")
PRIORITIES = ("override", "overwrite", "skip", "parallel")
ELEMENTS = ("story", "act", "maneuverGroup", "maneuver", "event", "action")
STATES = ("startTransition", "endTransition", "stopTransition", "runningState", "completeState", "standbyState")
DISTANCES = ("longitudinal", "lateral", "cartesianDistance", "euclidianDistance")


@dataclass(frozen=True)
class Entity:
    name: str
    kind: str  # vehicle, pedestrian, misc
    category: str  # gsim's (gsim.scenes.log.ACTOR_CATEGORIES)
    size: Tuple[float, float, float]  # length, width, height
    centre: Tuple[float, float, float]  # the box centre from the entity's reference point, in its frame
    line: int


@dataclass(frozen=True)
class Position:
    kind: str  # world, lane, relative_lane, relative_object
    v: Dict[str, object]
    line: int


@dataclass(frozen=True)
class Action:
    kind: str  # teleport, speed, lane_change, lane_offset, trajectory
    name: str
    v: Dict[str, object]
    line: int


@dataclass(frozen=True)
class Condition:
    kind: str  # time, state, reach, distance, traveled
    name: str
    edge: str
    delay: float
    v: Dict[str, object]
    entities: Tuple[str, ...] = ()  # the triggering entities (entity conditions)
    rule: str = "any"
    line: int = 0


Trigger = Tuple[Tuple[Condition, ...], ...]  # any group all of whose conditions hold; () : none given


@dataclass(frozen=True)
class Event:
    name: str
    maneuver: str
    group: str
    actors: Tuple[str, ...]
    priority: str
    actions: Tuple[Action, ...]
    trigger: Trigger
    line: int


@dataclass(frozen=True)
class Act:
    name: str
    start: Trigger
    stop: Trigger
    events: Tuple[Event, ...]
    story: str = ""


@dataclass
class Plan:
    path: Path
    name: str
    scene: Optional[Path]  # SceneGraphFile resolved against the file's folder
    road: Optional[Path]  # LogicFile resolved so
    entities: Dict[str, Entity]
    ego: str
    init: List[Tuple[str, Action]]
    acts: List[Act]
    stop: Trigger
    parameters: Dict[str, str] = field(default_factory=dict)
    deleted: Tuple[str, ...] = ()  # entities Init deletes (a scene's own actors the scenario takes out)
    ego_path: Optional[Action] = None  # the ego's FollowTrajectoryAction from the start, if any

    @property
    def driven(self) -> List[str]:
        """The entities the storyboard drives: all but the ego and those Init deletes."""
        return [n for n in self.entities if n != self.ego and n not in self.deleted]


def _finite_or_text(v: str) -> bool:
    """False for a number that is not finite (NaN, INF), True for finite numbers and other text."""
    try:
        return math.isfinite(float(v))
    except ValueError:
        return True


class _Reader:
    """A file's checks (``catalog``: a catalog file of entity entries) and its parameters."""

    def __init__(self, path: Path, overrides: Dict[str, str], catalog: bool = False):
        from lxml import etree
        self.path = path
        try:
            self.tree = etree.parse(str(path), etree.XMLParser(resolve_entities=False, no_network=True))
        except OSError as e:
            raise InputError(f"{path}: cannot read it ({e})") from None
        except etree.XMLSyntaxError as e:
            raise InputError(f"{path}:{e.lineno}: not well-formed XML ({e.msg})") from None
        self.root, self.catalog = self.tree.getroot(), catalog
        if self.tree.docinfo.doctype or self.tree.docinfo.internalDTD is not None:
            self.fail(1, "a DOCTYPE (a DTD, entities) is outside gsim's subset: the file is read as it is written")
        self._check_version_and_schema()
        if not catalog:  # (a catalog: the entry a scenario takes, `check_entry`)
            self.check_subset(self.root)
            self.params = self._parameters(overrides, self.root)

    # ------------------------------------------------------------------ checks before parsing
    def fail(self, line, msg: str):
        raise InputError(f"{self.path}:{line}: {msg}")

    def _check_version_and_schema(self) -> None:
        import scenariogeneration
        import xmlschema
        if self.root.tag != "OpenSCENARIO":
            self.fail(self.root.sourceline, f"expected <OpenSCENARIO> at the top, found <{self.root.tag}>")
        head = self.root.find("FileHeader")
        if head is None:
            self.fail(self.root.sourceline, "<OpenSCENARIO> has no <FileHeader>")
        major, minor = head.get("revMajor"), head.get("revMinor")
        if major != "1" or minor not in ("0", "1", "2", "3"):
            self.fail(head.sourceline, f"<FileHeader> says OpenSCENARIO {major}.{minor}; gsim reads 1.0 to 1.3")
        if self.catalog and self.root.find("Catalog") is None:
            self.fail(self.root.sourceline, "no <Catalog>: not a catalog file")
        if not self.catalog and self.root.find("Storyboard") is None:
            self.fail(self.root.sourceline, "no <Storyboard>: a catalog or a parameter distribution is not a scenario")
        xsd = Path(scenariogeneration.__file__).parent.parent / "schemas" / \
            f"OpenSCENARIO_1_{'3_1' if minor == '3' else minor}.xsd"
        for err in xmlschema.XMLSchema(str(xsd)).iter_errors(self.root):
            where = err.path.rsplit("/", 1)[-1] if err.path else "?"
            self.fail(getattr(err, "sourceline", None) or "?",
                      f"<{where.split('[')[0]}> breaks the OpenSCENARIO 1.{minor} schema: {err.reason}")

    def check_entry(self, entry, overrides: Dict[str, str]) -> None:
        """A catalog entry (an element of this file) checked as a scenario is; its parameters from its declarations
        with ``overrides`` (the reference's assignments)."""
        self.check_subset(entry)
        self.params = self._parameters(overrides, entry)

    def check_subset(self, top) -> None:
        for el in top.iter():
            if not isinstance(el.tag, str):
                continue  # comments, processing instructions
            if el.tag not in SUBSET:
                self.fail(el.sourceline, f"<{el.tag}> is outside gsim's OpenSCENARIO subset (docs/scenarios.md lists "
                                         f"what gsim plays)")
            for k, v in el.attrib.items():
                if not _finite_or_text(v):
                    self.fail(el.sourceline, f"<{el.tag}> {k}={v!r} is not a finite number")

    def _parameters(self, overrides: Dict[str, str], top) -> Dict[str, str]:
        declarations = list(top.iter("ParameterDeclaration"))
        names = {p.get("name") for p in declarations}
        for k, v in overrides.items():
            if k not in names:
                raise InputError(f"--param {k}={v}: {self.path} declares no parameter {k!r} (it declares "
                                 f"{', '.join(sorted(names)) or 'none'})")
        params: Dict[str, str] = {}
        for p in declarations:  # in order: a value may use the parameters declared before it
            name = p.get("name")
            raw = overrides.get(name, p.get("value"))
            params[name] = self._resolve(raw, params, p.sourceline, f"<ParameterDeclaration name={name!r}> value")
        for el in top.iter():
            for k, v in (el.attrib.items() if isinstance(el.tag, str) else ()):
                if v.startswith("$") and el.tag != "ParameterDeclaration" and k not in ("name", "parameterRef"):
                    value = self._resolve(v, params, el.sourceline, f"<{el.tag}> {k}")
                    if not _finite_or_text(value):
                        self.fail(el.sourceline, f"<{el.tag}> {k}={v!r} = {value!r} is not a finite number")
        for el in top.iter("Trailer"):  # (catalogs declare one that is empty unless a parameter names an entity)
            refs = [self._resolve(x.get("entityRef", ""), params, x.sourceline, "<TrailerRef> entityRef")
                    for x in el if isinstance(x.tag, str)]
            if len(el) and refs != [""]:
                self.fail(el.sourceline, "a vehicle with a trailer is outside gsim's subset")
        return params

    def _resolve(self, raw: str, params: Dict[str, str], line: int, what: str) -> str:
        """An attribute's text with its parameter reference or expression resolved."""
        from .expressions import as_text, evaluate
        if raw.startswith("${"):
            try:
                return as_text(evaluate(raw, params))
            except (ValueError, OverflowError) as e:
                self.fail(line, f"{what}={raw!r}: {e}")
        if raw.startswith("$"):
            if raw[1:] not in params:
                self.fail(line, f"{what}={raw!r}: no such parameter is declared")
            return params[raw[1:]]
        return raw

    # ------------------------------------------------------------------ values of the parsed objects
    def line(self, tag: str, after: int = 0, **attrs) -> int:
        """The line of the first <tag> with these attributes at or after line ``after`` (else ``after``)."""
        for el in self.root.iter(tag):
            if el.sourceline >= after and all(el.get(k) == v for k, v in attrs.items()):
                return el.sourceline
        return after or self.root.sourceline

    def value(self, v):
        """A parsed attribute (scenariogeneration's enumerations by name) with its parameter reference resolved."""
        v = getattr(v, "name", v)
        if isinstance(v, str) and v.startswith("$"):
            return self._resolve(v, self.params, self.root.sourceline, "a value")
        return v

    def enum(self, v, line: int, what: str, allowed) -> str:
        """An enumeration's value, refused (with the line) unless it is one of ``allowed``."""
        v = self.value(v)
        if v not in allowed:
            self.fail(line, f"{what}={v!r}: gsim reads {', '.join(allowed)}")
        return v

    def num(self, v, line: int, what: str, default: Optional[float] = None) -> float:
        v = self.value(v)
        if v is None:
            if default is None:
                self.fail(line, f"{what}: no value given")
            return default
        try:
            x = float(v)
        except (TypeError, ValueError):
            self.fail(line, f"{what}={v!r} is not a number")
        if not math.isfinite(x):
            self.fail(line, f"{what}={v!r} is not finite")
        return x


def read_plan(path, params: Optional[Dict[str, str]] = None, ego: Optional[str] = None) -> Plan:
    """The plan of the OpenSCENARIO file ``path`` (see the module docstring); ``params`` override its parameters,
    ``ego`` names the ego entity (default: the one named ego or hero)."""
    from scenariogeneration import xosc
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such OpenSCENARIO file")
    r = _Reader(path, dict(params or {}))
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the schema is checked above, with lines)
        try:
            sc = xosc.ParseOpenScenario(str(path))
        except Exception as e:  # scenariogeneration's own errors on a file the schema allows
            raise InputError(f"{path}: scenariogeneration could not parse it ({type(e).__name__}: {e})") from None
    entities = {o.name: _scenario_object(r, o, getattr(sc.catalog, "catalogs", {}) or {}) for o in
                sc.entities.scenario_objects}
    names = sorted(entities)
    if ego is None:
        found = [n for n in names if n.lower() in ("ego", "hero")]
        if len(found) != 1:
            raise InputError(f"{path}: {'no' if not found else 'two'} entities named ego or hero: name the ego with "
                             f"--ego (entities: {', '.join(names)})")
        ego = found[0]
    elif ego not in entities:
        raise InputError(f"--ego {ego}: {path} has no such entity (entities: {', '.join(names)})")
    for o in sc.entities.scenario_objects:
        if o.controller and o.name != ego:
            r.fail(r.line("ScenarioObject", name=o.name), f"<ObjectController> of {o.name!r}: only the ego takes a "
                                                          f"controller (the agent); the storyboard drives the others")
    rn = sc.roadnetwork
    base = path.parent
    scene = (base / r.value(rn.scene)).resolve() if getattr(rn, "scene", None) else None
    road = (base / r.value(rn.road_file)).resolve() if getattr(rn, "road_file", None) else None
    init = []
    for who, actions in sc.storyboard.init.initactions.items():
        who = r.value(who)
        line = r.line("Private", entityRef=who)
        if who not in entities:
            r.fail(line, f"<Private entityRef={who!r}>: no such entity ({', '.join(names)})")
        init += [(who, _action(r, a, f"init_{who}_{k}", line, entities)) for k, a in enumerate(actions)]
    for who, a in init:
        if a.kind == "controller" and who != ego:
            r.fail(a.line, f"<ActivateControllerAction> of {who!r}: only the ego takes a controller (the agent); the "
                           f"storyboard drives the others")
    deleted = []
    for g in sc.storyboard.init.global_actions:
        who = r.value(getattr(g, "entityref", None))
        line = r.line("EntityAction", entityRef=who) if who else r.line("GlobalAction")
        if not isinstance(g, xosc.DeleteEntityAction):
            r.fail(line, f"a {type(g).__name__} in <Init> is outside gsim's subset (DeleteEntityAction is in it)")
        if who not in entities:
            r.fail(line, f"<EntityAction entityRef={who!r}>: no such entity ({', '.join(names)})")
        if who == ego:
            r.fail(line, f"<DeleteEntityAction> of the ego {ego!r}")
        deleted.append(who)
    if sc.storyboard.init.user_defined_actions:
        r.fail(r.line("Init"), "<Init> user-defined actions are outside gsim's subset")
    init = [(who, a) for who, a in init if who not in deleted]
    acts, ego_path = [], None
    for story in sc.storyboard.stories:
        for act in story.acts:
            events = []
            start = _trigger(r, act.starttrigger, entities)
            for mg in act.maneuvergroup:
                actors = tuple(r.value(e.entity) for e in mg.actors.actors)
                for a in actors:
                    if a not in entities:
                        r.fail(r.line("ManeuverGroup", name=mg.name), f"<EntityRef entityRef={a!r}> in maneuver group "
                                                                      f"{mg.name!r}: no such entity")
                if int(r.num(mg.maxexecution, r.line("ManeuverGroup", name=mg.name), "maximumExecutionCount",
                             1.0)) != 1:
                    r.fail(r.line("ManeuverGroup", name=mg.name), "maximumExecutionCount other than 1 is outside "
                                                                  "gsim's subset")
                for m in mg.maneuvers:
                    if isinstance(m, xosc.CatalogReference):
                        r.fail(r.line("ManeuverGroup", name=mg.name), "a Maneuver from a catalog is outside gsim's "
                                                                      "subset (entities may come from catalogs)")
                    for ev in m.events:
                        line = r.line("Event", name=ev.name)
                        if int(r.num(ev.maxexecution, line, "maximumExecutionCount", 1.0)) != 1:
                            r.fail(line, "maximumExecutionCount other than 1 is outside gsim's subset")
                        acts_ = tuple(_action(r, a.action, a.name, r.line("Action", name=a.name), entities)
                                      for a in ev.action)
                        trigger = _trigger(r, ev.trigger, entities)
                        if any(x.kind == "controller" for x in acts_):
                            r.fail(line, f"<Event name={ev.name!r}>: an ActivateControllerAction outside Init is "
                                         f"outside gsim's subset (the ego's, in Init, is the agent)")
                        if ego in actors:  # the agent drives the ego: a path from the start is all it takes
                            if actors != (ego,) or len(acts_) != 1 or acts_[0].kind != "trajectory" or \
                                    not _at_start(trigger) or not _at_start(start) or ego_path is not None:
                                r.fail(line, f"<Event name={ev.name!r}> acts on the ego {ego!r}, which the agent "
                                             f"drives (the ego takes one FollowTrajectoryAction from the start: its "
                                             f"path)")
                            ego_path = acts_[0]
                            continue
                        events.append(Event(ev.name, m.name, mg.name, actors,
                                            r.enum(ev.priority, line, "priority", PRIORITIES), acts_, trigger, line))
            acts.append(Act(act.name, start, _trigger(r, act.stoptrigger, entities), tuple(events), story.name))
    stop = _trigger(r, sc.storyboard.stoptrigger, entities)
    _check_names(r, acts)
    _check_references(r, acts, stop)
    _check_not_deleted(r, acts, init, stop, deleted)
    return Plan(path, r.value(sc.header.description) if hasattr(sc, "header") else path.stem, scene, road, entities,
                ego, init, acts, stop, r.params, tuple(deleted), ego_path)


ENTITY_CATALOGS = ("VehicleCatalog", "PedestrianCatalog", "MiscObjectCatalog")


def _scenario_object(r: _Reader, o, locations: Dict[str, str]) -> Entity:
    """An entity of the file, its object inline or from a catalog (CatalogLocations' vehicle, pedestrian and misc
    object directories, relative to the file; the entry's parameters from its declarations and the reference's
    assignments)."""
    from scenariogeneration import xosc
    line = r.line("ScenarioObject", name=o.name)
    ref = o.entityobject
    if not isinstance(ref, xosc.CatalogReference):
        return _entity(r, o.name, ref, line)
    name, entry = r.value(ref.catalogname), r.value(ref.entryname)
    line = r.line("CatalogReference", line, entryName=ref.entryname)
    dirs = [(r.path.parent / r.value(p)).resolve() for k, p in locations.items() if k in ENTITY_CATALOGS]
    files = [d / f"{name}.xosc" for d in dirs if (d / f"{name}.xosc").is_file()]
    if not files:
        r.fail(line, f"<CatalogReference catalogName={name!r}>: no {name}.xosc in the file's entity catalog "
                     f"directories ({', '.join(str(d) for d in dirs) or 'none: give CatalogLocations'})")
    cat = _Reader(files[0], {}, catalog=True)
    element = next((el for el in cat.root.find("Catalog") if el.get("name") == entry), None)
    if element is None:
        r.fail(line, f"catalog {name!r} ({files[0]}) has no entry {entry!r}")
    declared = {p.get("name") for p in element.iter("ParameterDeclaration")}
    assigned = {}
    for pa in ref.parameterassignments:
        ref_name = str(pa.parameterref).lstrip("$")  # (OpenSCENARIO 1.0 files write the reference with its $)
        if ref_name not in declared:
            r.fail(line, f"<ParameterAssignment parameterRef={pa.parameterref!r}>: entry {entry!r} of catalog "
                         f"{name!r} declares no such parameter ({', '.join(sorted(declared)) or 'none'})")
        assigned[ref_name] = r.value(pa.value)
    cat.check_entry(element, assigned)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            obj = xosc.CatalogReader(xosc.CatalogReference(name, entry), str(files[0].parent))
        except Exception as e:
            raise InputError(f"{files[0]}: scenariogeneration could not read entry {entry!r} ({type(e).__name__}: "
                             f"{e})") from None
    if obj is None:
        r.fail(line, f"entry {entry!r} of catalog {name!r} is not a Vehicle, Pedestrian or MiscObject")
    return _entity(cat, o.name, obj, cat.line(type(obj).__name__, name=entry))


def _entity(r: _Reader, name: str, e, line: int) -> Entity:
    """An entity ``name`` of the object ``e`` (at ``line`` of ``r``'s file)."""
    from scenariogeneration import xosc
    if isinstance(e, xosc.Vehicle):
        kind, cat = "vehicle", VEHICLE_CATEGORIES.get(r.value(e.vehicle_type))
    elif isinstance(e, xosc.Pedestrian):
        kind, cat = "pedestrian", "pedestrian" if r.value(e.category) == "pedestrian" else None
    elif isinstance(e, xosc.MiscObject):
        kind, cat = "misc", MISC_CATEGORIES.get(r.value(e.category))
    else:
        r.fail(line, f"entity {name!r}: a {type(e).__name__} is outside gsim's subset (Vehicle, Pedestrian, "
                     f"MiscObject, inline or from a catalog)")
    if cat is None:
        r.fail(line, f"entity {name!r}: no gsim asset category for its category")
    bb = e.boundingbox
    size = tuple(r.num(getattr(bb.boundingbox, k), line, f"BoundingBox {k}") for k in ("length", "width", "height"))
    if min(size) <= 0:
        r.fail(line, f"entity {name!r}: its BoundingBox has a size of {size}; each must be > 0")
    centre = tuple(r.num(getattr(bb.center, k), line, f"BoundingBox Center {k}") for k in "xyz")
    return Entity(name, kind, cat, size, centre, line)


def _position(r: _Reader, p, line: int, entities) -> Position:
    from scenariogeneration import xosc
    line = r.line(type(p).__name__, line)  # (the element itself, at or after its action's line)
    orient = getattr(p, "orient", None)
    h = r.value(orient.h) if orient is not None else None
    rel = r.enum(orient.ref, line, "Orientation type", ("relative", "absolute")) \
        if orient is not None and orient.ref is not None else None
    ori = {"h": None if h is None else r.num(h, line, "Orientation h"), "ref": rel or "relative"}
    if isinstance(p, xosc.WorldPosition):
        h = None if p.h is None else r.num(p.h, line, "WorldPosition h")  # (none: a trajectory's heading, else 0)
        return Position("world", {"x": r.num(p.x, line, "WorldPosition x"), "y": r.num(p.y, line, "WorldPosition y"),
                                  "h": h}, line)
    if isinstance(p, xosc.LanePosition):
        return Position("lane", {"road": str(r.value(p.road_id)), "lane": int(r.num(p.lane_id, line, "laneId")),
                                 "s": r.num(p.s, line, "LanePosition s"),
                                 "offset": r.num(p.offset, line, "LanePosition offset", 0.0), **ori}, line)
    if isinstance(p, xosc.RoadPosition):
        return Position("road", {"road": str(r.value(p.id)), "s": r.num(p.s, line, "RoadPosition s"),
                                 "t": r.num(p.t, line, "RoadPosition t"), **ori}, line)
    if isinstance(p, xosc.RelativeRoadPosition):
        return Position("relative_road", {"entity": _ref(r, p.target, line, entities),
                                          "ds": r.num(p.ds, line, "ds"), "dt": r.num(p.dt, line, "dt"), **ori}, line)
    if isinstance(p, (xosc.RelativeLanePosition, xosc.RelativeObjectPosition)):
        ent = r.value(getattr(p, "entity", None) or getattr(p, "target", None))
        if ent not in entities:
            r.fail(line, f"a {type(p).__name__} relative to {ent!r}: no such entity")
        if isinstance(p, xosc.RelativeObjectPosition):
            return Position("relative_object", {"entity": ent, "dx": r.num(p.dx, line, "dx"),
                                                "dy": r.num(p.dy, line, "dy"), **ori}, line)
        ds = p.ds if p.ds is not None else p.dsLane
        return Position("relative_lane", {"entity": ent, "dlane": int(r.num(p.lane_id, line, "dLane")),
                                          "ds": r.num(ds, line, "ds", 0.0),
                                          "offset": r.num(p.offset, line, "offset", 0.0), **ori}, line)
    r.fail(line, f"a {type(p).__name__} is outside gsim's subset (WorldPosition, LanePosition, RelativeLanePosition, "
                 f"RoadPosition, RelativeRoadPosition, RelativeObjectPosition)")


def _dynamics(r: _Reader, td, line: int, what: str) -> Dict[str, object]:
    shape = r.enum(td.shape, line, f"{what} dynamicsShape", SHAPES)
    dim = r.enum(td.dimension, line, f"{what} dynamicsDimension", ("time", "rate", "distance"))
    value = r.num(td.value, line, f"{what} dynamics value")
    if dim == "rate":  # (a rate's sign is the target's side: files write decelerations negative too)
        value = abs(value)
    if value < 0 or (value == 0 and shape != "step" and dim == "rate"):
        r.fail(line, f"{what}: dynamics value {value:g} must be > 0 (>= 0 for time and distance)")
    return {"shape": shape, "dimension": dim, "value": value}


def _action(r: _Reader, a, name: str, line: int, entities) -> Action:
    from scenariogeneration import xosc
    if isinstance(a, xosc.TeleportAction):
        return Action("teleport", name, {"position": _position(r, a.position, line, entities)}, line)
    if isinstance(a, xosc.AbsoluteSpeedAction):
        speed = r.num(a.speed, line, "AbsoluteTargetSpeed value")
        if speed < 0:
            r.fail(line, f"AbsoluteTargetSpeed {speed:g}: a speed is >= 0")
        return Action("speed", name, {"speed": speed, **_dynamics(r, a.transition_dynamics, line, "SpeedAction")},
                      line)
    if isinstance(a, xosc.RelativeSpeedAction):  # a target from an entity's speed (and kept with continuous)
        return Action("speed", name, {"speed": r.num(a.speed, line, "RelativeTargetSpeed value"),
                                      "relative_to": _ref(r, a.entity, line, entities),
                                      "value_type": r.enum(a.valuetype, line, "speedTargetValueType",
                                                           ("delta", "factor")),
                                      "continuous": str(r.value(a.continuous)).lower() in ("true", "1"),
                                      **_dynamics(r, a.transition_dynamics, line, "SpeedAction")}, line)
    if isinstance(a, xosc.LongitudinalDistanceAction):  # keep a distance or a time gap to an entity
        dc = a.dynamic_constraint
        limit = lambda x, what: None if dc is None or getattr(dc, x, None) is None else r.num(  # noqa: E731
            getattr(dc, x), line, what)
        v = {"entity": _ref(r, a.target, line, entities),
             "distance": None if a.distance is None else r.num(a.distance, line, "distance"),
             "time_gap": None if a.timeGap is None else r.num(a.timeGap, line, "timeGap"),
             "freespace": str(r.value(a.freespace)).lower() in ("true", "1"),
             "continuous": str(r.value(a.continuous)).lower() in ("true", "1"),
             "displacement": r.enum(a.displacement, line, "displacement",
                                    ("trailingReferencedEntity", "leadingReferencedEntity", "any")),
             "system": r.enum(a.coordinate_system, line, "coordinateSystem", ("entity", "lane", "road")),
             "max_acc": limit("max_acceleration", "maxAcceleration"), "max_dec": limit("max_deceleration",
                                                                                      "maxDeceleration"),
             "max_speed": limit("max_speed", "maxSpeed")}
        if (v["distance"] is None) == (v["time_gap"] is None) or min(x for x in (v["distance"], v["time_gap"])
                                                                      if x is not None) < 0:
            r.fail(line, "LongitudinalDistanceAction: give one of distance and timeGap, >= 0")
        return Action("keep_distance", name, v, line)
    if isinstance(a, xosc.ActivateControllerAction) or isinstance(a, xosc.ControllerAction) and \
            a.activateControllerAction is not None and a.assignControllerAction is None and \
            a.overrideControllerValueAction is None:
        return Action("controller", name, {}, line)  # (only activation: the ego's, whose controller is the agent)
    if isinstance(a, (xosc.AbsoluteLaneChangeAction, xosc.RelativeLaneChangeAction)):
        v = {"lane": int(r.num(a.lane, line, "target lane")),
             "offset": r.num(a.target_lane_offset, line, "targetLaneOffset", 0.0),
             **_dynamics(r, a.transition_dynamics, line, "LaneChangeAction")}
        if isinstance(a, xosc.RelativeLaneChangeAction):
            v["entity"] = r.value(a.target)
            if v["entity"] not in entities:
                r.fail(line, f"RelativeTargetLane entityRef={v['entity']!r}: no such entity")
        return Action("lane_change", name, v, line)
    if isinstance(a, xosc.AbsoluteLaneOffsetAction):
        shape = r.enum(a.dynshape, line, "LaneOffsetAction dynamicsShape", SHAPES)
        return Action("lane_offset", name, {"offset": r.num(a.value, line, "AbsoluteTargetLaneOffset value"),
                                            "shape": shape,
                                            "max_lat_acc": r.num(a.maxlatacc, line, "maxLateralAcc", 0.5)}, line)
    if isinstance(a, xosc.FollowTrajectoryAction):
        traj = a.trajectory
        if not isinstance(traj, xosc.Trajectory):
            r.fail(line, "FollowTrajectoryAction: a CatalogReference is outside gsim's subset (give the Trajectory)")
        shapes = traj.shapes if isinstance(traj.shapes, list) else [traj.shapes]
        if len(shapes) != 1:
            r.fail(line, f"FollowTrajectoryAction: a trajectory of {len(shapes)} shapes (gsim reads one)")
        shape, v = shapes[0], {}
        if isinstance(shape, xosc.Polyline):
            times = [None if t is None else r.num(t, line, "Vertex time") for t in shape.time] \
                if shape.time else [None] * len(shape.positions)
            v = {"shape": "polyline", "times": times,
                 "positions": [_position(r, p, line, entities) for p in shape.positions]}
            if len(v["positions"]) < 2:
                r.fail(line, "FollowTrajectoryAction: a Polyline needs two vertices or more")
        elif isinstance(shape, xosc.Clothoid):
            v = {"shape": "clothoid", "curvature": r.num(shape.curvature, line, "curvature"),
                 "curvature_dot": r.num(shape.curvature_change, line, "curvaturePrime"),
                 "length": r.num(shape.length, line, "length"),
                 "start_time": None if shape.starttime is None else r.num(shape.starttime, line, "startTime"),
                 "stop_time": None if shape.stoptime is None else r.num(shape.stoptime, line, "stopTime"),
                 "start": _position(r, shape.startposition, line, entities)}
            if not 0 < v["length"] <= MAX_LENGTH_M:
                r.fail(line, f"Clothoid length {v['length']:g} m: gsim reads 0 < length <= {MAX_LENGTH_M:g} m")
            if v["start_time"] is not None and v["stop_time"] is not None and v["stop_time"] <= v["start_time"]:
                r.fail(line, "Clothoid stopTime must be after its startTime")
        else:
            r.fail(line, f"FollowTrajectoryAction: a {type(shape).__name__} shape is outside gsim's subset "
                         f"(Polyline, Clothoid)")
        if a.initialDistanceOffset not in (None, 0, 0.0, "0"):
            r.fail(line, "FollowTrajectoryAction: initialDistanceOffset is outside gsim's subset (a trajectory is "
                         "followed from its start)")
        tr = a.timeref
        timed = tr is not None and not getattr(tr, "_only_nones", True)
        v["timing"] = None if not timed else {"domain": r.enum(tr.reference_domain, line, "domainAbsoluteRelative",
                                                               ("absolute", "relative")),
                                              "scale": r.num(tr.scale, line, "Timing scale", 1.0),
                                              "offset": r.num(tr.offset, line, "Timing offset", 0.0)}
        if timed and v["timing"]["scale"] <= 0:
            r.fail(line, "Timing scale must be > 0")
        if v["shape"] == "polyline" and timed and (None in v["times"] or any(
                b <= a for a, b in zip(v["times"], v["times"][1:]))):
            r.fail(line, "FollowTrajectoryAction: with a Timing, every Vertex needs a time, increasing")
        return Action("trajectory", name, v, line)
    r.fail(line, f"a {type(a).__name__} is outside gsim's subset (TeleportAction, SpeedAction with "
                 f"AbsoluteTargetSpeed, LaneChangeAction, LaneOffsetAction with AbsoluteTargetLaneOffset, "
                 f"FollowTrajectoryAction)")


def _trigger(r: _Reader, t, entities) -> Trigger:
    from scenariogeneration import xosc
    if t is None:
        return ()
    groups = []
    for g in getattr(t, "conditiongroups", None) or []:
        conds = []
        for c in g.conditions:
            line = r.line("Condition", name=c.name)
            edge = r.enum(c.conditionedge, line, "conditionEdge", EDGES)
            delay = r.num(c.delay, line, "delay", 0.0)
            if delay < 0:
                r.fail(line, f"condition {c.name!r}: delay {delay:g} < 0")
            if isinstance(c, xosc.ValueTrigger):
                vc = c.valuecondition
                if isinstance(vc, xosc.SimulationTimeCondition):
                    conds.append(Condition("time", c.name, edge, delay, {"value": r.num(vc.value, line, "value"),
                                                                         "rule": r.enum(vc.rule, line, "rule", RULES)},
                                           line=line))
                elif isinstance(vc, xosc.StoryboardElementStateCondition):
                    element = r.enum(vc.element, line, "storyboardElementType", ELEMENTS)
                    conds.append(Condition("state", c.name, edge, delay, {
                        "element": element, "ref": r.value(vc.reference),
                        "state": r.enum(vc.state, line, "state", STATES)}, line=line))
                else:
                    r.fail(line, f"a {type(vc).__name__} is outside gsim's subset")
                continue
            ec = c.entitycondition
            who = tuple(r.value(e.entity) for e in c.triggerentity.entity)
            for w in who:
                if w not in entities:
                    r.fail(line, f"condition {c.name!r}: triggering entity {w!r} does not exist")
            rule = r.enum(c.triggerentity.triggeringrule, line, "triggeringEntitiesRule", ("any", "all"))
            if isinstance(ec, xosc.ReachPositionCondition):
                v = {"position": _position(r, ec.position, line, entities),
                     "tolerance": r.num(ec.tolerance, line, "tolerance")}
                kind = "reach"
            elif isinstance(ec, xosc.RelativeDistanceCondition):
                v, kind = {"entity": _ref(r, ec.entity, line, entities), **_measure(r, ec, line, ec.dist_type)}, \
                    "distance"
            elif isinstance(ec, xosc.TraveledDistanceCondition):
                v, kind = {"value": r.num(ec.value, line, "value")}, "traveled"
            elif isinstance(ec, xosc.DistanceCondition):
                v, kind = {"position": _position(r, ec.position, line, entities),
                           **_measure(r, ec, line, ec.relative_distance_type)}, "distance"
            elif isinstance(ec, xosc.TimeHeadwayCondition):
                v, kind = {"entity": _ref(r, ec.entity, line, entities),
                           **_measure(r, ec, line, ec.relative_distance_type)}, "headway"
            elif isinstance(ec, xosc.TimeToCollisionCondition):
                target = ({"entity": _ref(r, ec.entity.entity, line, entities)} if ec.use_entity else
                          {"position": _position(r, ec.position, line, entities)})
                v, kind = {**target, **_measure(r, ec, line, ec.relative_distance_type)}, "ttc"
            elif isinstance(ec, (xosc.SpeedCondition, xosc.RelativeSpeedCondition)):
                if ec.directional_dimension is not None and r.value(ec.directional_dimension) != "longitudinal":
                    r.fail(line, f"{type(ec).__name__} directionalDimension {r.value(ec.directional_dimension)!r}: "
                                 f"gsim reads the speed along the heading")
                v = {"value": r.num(ec.value, line, "value"), "rule": r.enum(ec.rule, line, "rule", RULES)}
                kind = "speed"
                if isinstance(ec, xosc.RelativeSpeedCondition):
                    v["entity"], kind = _ref(r, ec.entity, line, entities), "relative_speed"
            elif isinstance(ec, xosc.AccelerationCondition):
                if ec.direction is not None and r.value(ec.direction) != "longitudinal":
                    r.fail(line, f"AccelerationCondition direction {r.value(ec.direction)!r}: gsim reads the "
                                 f"acceleration along the heading")
                v, kind = {"value": r.num(ec.value, line, "value"), "rule": r.enum(ec.rule, line, "rule", RULES)}, \
                    "acceleration"
            elif isinstance(ec, xosc.StandStillCondition):
                v, kind = {"value": r.num(ec.duration, line, "duration")}, "standstill"
            else:
                r.fail(line, f"a {type(ec).__name__} is outside gsim's subset")
            conds.append(Condition(kind, c.name, edge, delay, v, who, rule, line))
        groups.append(tuple(conds))
    return tuple(groups)


def _at_start(trigger: Trigger) -> bool:
    """Whether a trigger fires at the start: none, or a group of time conditions true from time 0 (or its first step:
    time > 0) on, without delay."""
    return not trigger or any(all(c.kind == "time" and c.delay == 0 and c.edge == "none" and c.v["value"] <= 1e-6
                                  and c.v["rule"] in ("greaterOrEqual", "greaterThan") for c in g) for g in trigger)


def _check_names(r: _Reader, acts: List[Act]) -> None:
    """Storyboard elements are told apart by their names: two of a kind with one name are refused."""
    seen: Dict[Tuple[str, str], bool] = {}
    kinds = [("act", a.name, r.line("Act", name=a.name)) for a in acts]
    kinds += [("event", e.name, e.line) for a in acts for e in a.events]
    kinds += [("action", x.name, x.line) for a in acts for e in a.events for x in e.actions]
    for kind, name, line in kinds:
        if (kind, name) in seen:
            r.fail(line, f"a second {kind} named {name!r}: gsim tells storyboard elements apart by their names")
        seen[(kind, name)] = True
    for kind, attr in (("maneuver", "maneuver"), ("maneuverGroup", "group")):
        owner: Dict[str, Tuple[str, str]] = {}
        for a in acts:
            for e in a.events:
                name, parent = getattr(e, attr), (a.name, e.group)
                if owner.setdefault(name, parent) != parent:
                    r.fail(r.line("Maneuver" if kind == "maneuver" else "ManeuverGroup", name=name),
                           f"a second {kind} named {name!r}: gsim tells storyboard elements apart by their names")


def all_triggers(acts: List[Act], stop: Trigger) -> List[Trigger]:
    """Every trigger of a storyboard: its stop trigger, the acts' start and stop triggers, the events'."""
    return [stop] + [a.start for a in acts] + [a.stop for a in acts] + [e.trigger for a in acts for e in a.events]


def _ref(r: _Reader, name, line: int, entities) -> str:
    name = r.value(name)
    if name not in entities:
        r.fail(line, f"entityRef={name!r}: no such entity")
    return name


def _measure(r: _Reader, ec, line: int, kind) -> Dict[str, object]:
    """A distance condition's value, rule, distance type, freespace and coordinate system."""
    return {"value": r.num(ec.value, line, "value"), "rule": r.enum(ec.rule, line, "rule", RULES),
            "type": r.enum(kind, line, "relativeDistanceType", DISTANCES),
            "freespace": str(r.value(ec.freespace)).lower() in ("true", "1"),
            "system": r.enum(ec.coordinate_system, line, "coordinateSystem", ("entity", "lane", "road"))}


def _check_references(r: _Reader, acts: List[Act], stop: Trigger) -> None:
    """Every StoryboardElementStateCondition names an element of the file."""
    names = {"act": {a.name for a in acts}, "event": {e.name for a in acts for e in a.events},
             "action": {x.name for a in acts for e in a.events for x in e.actions},
             "maneuver": {e.maneuver for a in acts for e in a.events},
             "maneuverGroup": {e.group for a in acts for e in a.events}, "story": {a.story for a in acts}}
    for t in all_triggers(acts, stop):
        for g in t:
            for c in g:
                if c.kind == "state" and c.v["ref"] not in names[c.v["element"]]:
                    r.fail(c.line, f"condition {c.name!r}: no {c.v['element']} named {c.v['ref']!r} (the ego's path "
                                   f"event is not one: the agent drives the ego)")


def _positions(v):
    """The positions an action's or a condition's values hold."""
    if isinstance(v.get("position"), Position):
        yield v["position"]
    if isinstance(v.get("start"), Position):
        yield v["start"]
    yield from v.get("positions", ())


def _check_not_deleted(r: _Reader, acts: List[Act], init, stop: Trigger, deleted) -> None:
    """No element of the storyboard names an entity Init deletes."""
    if not deleted:
        return
    uses = [(e.line, f"<Event name={e.name!r}> acts on", a) for act in acts for e in act.events for a in e.actors]
    actions = [x for _, x in init] + [x for act in acts for e in act.events for x in e.actions]
    conds = [c for t in all_triggers(acts, stop) for g in t for c in g]
    for item in actions + conds:
        refs = [item.v.get("entity"), item.v.get("relative_to")] + [p.v.get("entity") for p in _positions(item.v)] \
            + list(getattr(item, "entities", ()))
        uses += [(item.line, f"{item.name!r} refers to", x) for x in refs if x]
    for line, what, who in uses:
        if who in deleted:
            r.fail(line, f"{what} {who!r}, which Init deletes")


__all__ = ["Plan", "read_plan", "SUBSET", "Entity", "Position", "Action", "Condition", "Event", "Act", "all_triggers"]
