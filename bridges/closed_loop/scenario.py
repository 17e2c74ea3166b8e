"""Closed-loop scenario files: an editing scenario (`gsim.editing.scenario`: scene, log, edits, sensors)
plus a ``closed_loop`` section: the run's length and step, the road SUMO builds, the traffic, what the log's
own actors do, the ego vehicle and its target speed. A closed-loop run is such a scenario plus an agent.

    closed_loop:
      duration_s: 4.0              # default: the log's span from the start
      step_s: 0.1
      target_speed_mps: null       # what route-following agents aim for (default: the logged mean speed)
      road: {lanes: 1, lane_width_m: 3.5, opposite_lanes: 1, ego_lane: 0, speed_limit_mps: 13.9}
      # or a network of your own: road: {net: my.net.xml, T_world_net: [[...4x4...]],
      #                                   forward_route: [edge ids], opposite_route: [edge ids]}
      traffic:
        density_per_km_lane: 0     # SUMO vehicles placed on every lane at the start (seeded)
        vehicles: [{route: forward, lane: 0, pos_m: 60, speed_mps: 8, vclass: passenger}]
      log_actors: {mode: replay}   # or {mode: sumo, handover_s: 1.0}: handed to SUMO then
      vehicle: {wheelbase_m: 2.8}  # VehicleParams overrides
    ego: {dynamics: st, vehicle: 2}  # the ego's model: bicycle (default) or CommonRoad's ks, st, std, mb, with
                                     # CommonRoad's parameter set 1-4 (default 2 for its models; the bicycle takes
                                     # the set's wheelbase and limits when one is given)

Shipped scenarios (`SHIPPED`) live in the repository's ``scenarios/`` folder and run on the demo's street.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Literal, Optional, Tuple

from pydantic import Field, PrivateAttr, model_validator

from gsim.editing.scenario import Ego, Scenario, ScenarioError, _Strict, load_scenario, parse_scenario
from gsim.errors import InputError

from .sumo import VEHICLE_CLASSES
from .vehicle_models import LIMIT_FIELDS, MODELS, VEHICLES

SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "scenarios"
SHIPPED = {"stopped-car": "stopped_car.yaml", "lead-car": "lead_car.yaml", "traffic": "traffic.yaml"}
VCLASSES = tuple(VEHICLE_CLASSES)


class RoadOptions(_Strict):
    lanes: int = Field(1, ge=1, le=8)
    lane_width_m: float = Field(3.5, gt=1.5, le=6.0)
    opposite_lanes: int = Field(1, ge=0, le=8)
    ego_lane: int = Field(0, ge=0)
    speed_limit_mps: float = Field(13.9, gt=0, le=70)
    net: Optional[str] = None  # a SUMO .net.xml of your own instead of one built from the log
    T_world_net: Optional[List[List[float]]] = None  # 4x4, the net's frame in gsim's world frame
    forward_route: Optional[List[str]] = None  # your net's edge ids the ego drives along, in order
    opposite_route: Optional[List[str]] = None  # and the other direction's (for traffic there)

    @model_validator(mode="after")
    def _lane(self):
        if self.ego_lane >= self.lanes:
            raise InputError(f"ego_lane {self.ego_lane} is not one of the {self.lanes} forward lanes (0 = rightmost)")
        return self


class Vehicle(_Strict):
    route: Literal["forward", "opposite"] = "forward"
    lane: int = Field(0, ge=0)
    pos_m: float = Field(description="metres along the route from where the ego starts (forward) or from "
                                     "the opposite route's start")
    speed_mps: float = Field(0.0, ge=0)
    vclass: Literal[VCLASSES] = "passenger"


class Traffic(_Strict):
    density_per_km_lane: float = Field(0.0, ge=0, le=200)
    vclass_mix: Dict[Literal[VCLASSES], float] = {"passenger": 0.8, "truck": 0.1, "bus": 0.1}
    keep_clear_m: Tuple[float, float] = (-15.0, 30.0)  # no spawned vehicle within this route span of the ego
    vehicles: List[Vehicle] = []


class LogActors(_Strict):
    mode: Literal["replay", "sumo"] = "replay"
    handover_s: float = Field(0.0, ge=0)  # sumo: the log's vehicles are handed to SUMO this long into the run


class ClosedLoopSection(_Strict):
    duration_s: Optional[float] = Field(None, gt=0, le=3600)
    step_s: float = Field(0.1, ge=0.01, le=1.0)
    target_speed_mps: Optional[float] = Field(None, gt=0, le=70)
    road: RoadOptions = RoadOptions()
    traffic: Traffic = Traffic()
    log_actors: LogActors = LogActors()
    vehicle: Dict[str, float] = {}


class LoopEgo(Ego):
    dynamics: Literal[("bicycle",) + MODELS] = "bicycle"
    vehicle: Optional[Literal[tuple(VEHICLES)]] = None  # CommonRoad's parameter set


class LoopScenario(Scenario):
    output: Optional[str] = None  # a closed-loop run writes where `gsim closed-loop --out` says
    ego: LoopEgo = LoopEgo()
    closed_loop: ClosedLoopSection = ClosedLoopSection()
    # an OpenSCENARIO file's storyboard, played live in the loop (gsim.bridges.openscenario.load.LiveStoryboard)
    _storyboard: Optional[Callable] = PrivateAttr(None)

    @property
    def storyboard(self) -> Optional[Callable]:
        """A factory of the storyboard that drives the actors it names in a closed loop, or None."""
        return self._storyboard

    def with_storyboard(self, factory: Callable) -> "LoopScenario":
        out = self.model_copy()
        out._storyboard = factory
        return out

    @model_validator(mode="after")
    def _limits_from_one_place(self):
        clash = sorted(set(self.closed_loop.vehicle) & set(LIMIT_FIELDS))
        if clash and (self.ego.dynamics != "bicycle" or self.ego.vehicle is not None):
            raise ValueError(f"closed_loop.vehicle sets {', '.join(clash)}, which CommonRoad's parameter set gives "
                             f"(ego: dynamics {self.ego.dynamics}, vehicle {self.vehicle_id}): choose another vehicle "
                             f"instead")
        return self

    @property
    def vehicle_id(self) -> Optional[int]:
        """CommonRoad's parameter set of the ego: the scenario's, else 2 (BMW 320i) for CommonRoad's models."""
        return self.ego.vehicle if self.ego.vehicle is not None or self.ego.dynamics == "bicycle" else 2

    def with_dynamics(self, dynamics: Optional[str] = None, vehicle: Optional[int] = None) -> "LoopScenario":
        """This scenario with the ego's model and vehicle replaced where given (`gsim closed-loop --dynamics
        --vehicle`), checked as a file's would be."""
        if dynamics is None and vehicle is None:
            return self
        ego = {**self.ego.model_dump(), **{k: v for k, v in (("dynamics", dynamics), ("vehicle", vehicle))
                                           if v is not None}}
        out = parse_scenario({**self.model_dump(), "ego": ego}, f"scenario {self.name}", LoopScenario)
        out._storyboard = self._storyboard  # (a private attribute: not in the dump)
        return out

    def resolve(self, base: Path) -> "LoopScenario":
        out = self.model_copy(update={"output": self.output or "."})
        out = Scenario.resolve(out, base)
        road = self.closed_loop.road
        if road.net is not None and not Path(road.net).is_absolute():
            road = road.model_copy(update={"net": str((base / road.net).resolve())})
        return out.model_copy(update={"closed_loop": self.closed_loop.model_copy(update={"road": road})})


def shipped_path(name: str) -> Path:
    return SCENARIOS_DIR / SHIPPED[name]


def load_loop_scenario(name_or_path) -> LoopScenario:
    """A closed-loop scenario from a YAML file or the name of a shipped one; clear errors (ScenarioError,
    FileNotFoundError) naming the file and the field."""
    p = Path(name_or_path)
    if p.suffix == ".xosc":
        raise InputError(f"{name_or_path}: an OpenSCENARIO file: gsim closed-loop, gsim batch closed-loop and gsim "
                         f"serve play it, gsim scenario import makes a scenario YAML of it (docs/scenarios.md)")
    if not p.suffix and str(name_or_path) in SHIPPED:
        p = shipped_path(str(name_or_path))
    elif not p.is_file():
        raise FileNotFoundError(f"{name_or_path}: no such scenario file, and not a shipped scenario "
                                f"(shipped: {', '.join(SHIPPED)})")
    return load_scenario(p, model=LoopScenario)


def ensure_demo(sc) -> None:
    """A shipped scenario runs on the demo's street: build it on first use (it says how long that takes)."""
    if Path(sc.scene, "scene.json").is_file() and Path(sc.log, "log.json").is_file():
        return
    ensure_demo_street(Path(sc.scene).parents[1], f"scenario {sc.name}")


def ensure_demo_street(demo: Path, who: str) -> None:
    """The demo street ``demo`` (the repository's out/demo) built unless it is there already."""
    if (demo / "recon" / "scene" / "scene.json").is_file() and (demo / "log" / "log.json").is_file():
        return
    print(f"{who} runs on the demo street {demo}, which is not built yet: building it now (synthesize + reconstruct "
          f"on CPU, about 7 minutes on 2 cores; once)", flush=True)
    from gsim.scenes.demo import run_demo
    run_demo(demo)


__all__ = ["LoopScenario", "ScenarioError", "load_loop_scenario", "ensure_demo", "ensure_demo_street", "SHIPPED",
           "shipped_path"]
