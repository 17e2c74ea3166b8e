"""Scenario files: a base scene and log, a list of edits, the sensors to render, the time range, the output.

YAML, read with a safe loader and validated (pydantic); an error names the field path, e.g.
``edits[2].track.speed_mps: Input should be greater than or equal to 0``. Numbers are finite (YAML's
``.nan`` and ``.inf`` are refused). Names that become file or folder names (the scenario's name, asset and
actor ids, sensor names) are one safe path component each (`gsim.errors.check_name`). Paths are relative
to the scenario file. Example::

    schema_version: 1
    name: cut-in
    scene: ../out/demo/recon/scene
    log: ../out/demo/log
    library: builtin              # or a library directory
    edits:
      - kind: insert
        asset: sedan
        id: cut_in
        track: {path: [[10, -3.5], [30, 0]], speed_mps: 6, start_us: 0}
      - kind: remove
        actor: parked_03
      - kind: move
        actor: moving_1
        shift_m: [0, 1.5, 0]       # in the actor's own frame (x forward, y left, z up)
        speed_scale: 0.8
    ego: {shift_m: 0.0}            # lateral, left positive; or path: {...}
    sensors: {cameras: [front], lidars: [top], downscale: 2}
    time: {start_us: 0, end_us: 4000000, every: 1}
    output: ../out/scenarios/cut-in

Tracks: ``poses`` (timed poses: t_us, xyz, yaw_deg) or ``path`` (a world x-y polyline driven at
``speed_mps``, one speed or one per vertex, from ``start_us``, heading along the path).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Literal, Optional, Tuple, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from gsim.errors import InputError, check_name

SCHEMA_VERSION = 1
MAX_US = 2 ** 62  # times in microseconds stay far inside int64 (numpy holds them so)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _name(what: str):
    """A string that becomes a file or folder name: a full match of gsim's name pattern."""
    return Annotated[str, AfterValidator(lambda v: check_name(v, what))]


ScenarioName = _name("scenario name")
ActorId = _name("actor id")
AssetId = _name("asset id")
SensorName = _name("sensor name")
Micros = Annotated[int, Field(ge=0, le=MAX_US)]


class TimedPose(_Strict):
    t_us: Micros
    xyz: Tuple[float, float, float]
    yaw_deg: float = 0.0


class Track(_Strict):
    """Either timed poses or a path with a speed profile."""
    poses: Optional[List[TimedPose]] = Field(None, min_length=1)
    path: Optional[List[Tuple[float, float]]] = Field(None, min_length=2)
    speed_mps: Optional[Union[Annotated[float, Field(ge=0)], List[Annotated[float, Field(ge=0)]]]] = None
    start_us: Micros = 0
    step_us: int = Field(100_000, gt=0, le=MAX_US, description="the path's poses are this far apart")

    @model_validator(mode="after")
    def _one_kind(self):
        if (self.poses is None) == (self.path is None):
            raise InputError("give either poses or path (with speed_mps)")
        if self.poses is not None:
            t = [p.t_us for p in self.poses]
            if any(b <= a for a, b in zip(t, t[1:])):
                raise InputError("poses: t_us must increase strictly")
        else:
            if self.speed_mps is None:
                raise InputError("path: give speed_mps (one speed or one per vertex)")
            if isinstance(self.speed_mps, list) and len(self.speed_mps) != len(self.path):
                raise InputError(f"speed_mps: {len(self.speed_mps)} speeds for {len(self.path)} path vertices")
        return self


class InsertEdit(_Strict):
    kind: Literal["insert"]
    asset: AssetId
    id: Optional[ActorId] = None
    track: Track
    on_ground: bool = True
    shadow: bool = True
    harmonize: bool = True
    allow_overlap: bool = False


class RemoveEdit(_Strict):
    kind: Literal["remove"]
    actor: ActorId
    fill: bool = True


class MoveEdit(_Strict):
    kind: Literal["move"]
    actor: ActorId
    shift_m: Tuple[float, float, float] = (0.0, 0.0, 0.0)
    speed_scale: float = Field(1.0, gt=0)
    track: Optional[Track] = None  # a new track replaces the old one (shift and speed_scale then apply to it)
    allow_overlap: bool = False


Edit = Annotated[Union[InsertEdit, RemoveEdit, MoveEdit], Field(discriminator="kind")]


class Ego(_Strict):
    shift_m: float = 0.0  # sideways, in the vehicle frame, left positive
    track: Optional[Track] = None  # a new path for the ego vehicle (the vehicle frame's origin follows it)
    size_m: Tuple[float, float, float] = (4.6, 1.9, 1.6)  # the ego's box, for the overlap checks
    box_offset_m: Tuple[float, float, float] = (1.2, 0.0, 0.8)  # its centre in the vehicle frame


class Sensors(_Strict):
    cameras: Optional[List[SensorName]] = None  # the log's cameras (None: all)
    lidars: Optional[List[SensorName]] = None  # the log's LiDARs (None: all with a beam model)
    downscale: int = Field(1, ge=1)
    video: bool = True


class TimeRange(_Strict):
    start_us: Optional[Micros] = None
    end_us: Optional[Micros] = None
    every: int = Field(1, ge=1)  # every N-th frame of the log


class Scenario(_Strict):
    schema_version: Literal[1]
    name: ScenarioName
    scene: str
    log: str
    library: str = "builtin"
    edits: List[Edit] = []
    ego: Ego = Ego()
    sensors: Sensors = Sensors()
    time: TimeRange = TimeRange()
    output: str

    def resolve(self, base: Path) -> "Scenario":
        """The scenario with its paths made absolute against ``base`` (the file's folder)."""
        r = lambda p: str((base / p).resolve()) if not Path(p).is_absolute() else p  # noqa: E731
        return self.model_copy(update={"scene": r(self.scene), "log": r(self.log), "output": r(self.output),
                                       "library": self.library if self.library == "builtin" else r(self.library)})


class ScenarioError(InputError):
    """A scenario file that cannot be read or validated; the message names the file and the field path."""


def _where(loc) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif (i > 0 and isinstance(loc[i - 1], int) and part in ("insert", "remove", "move")) or not part.isidentifier():
            continue  # a union's tag (the user wrote kind) or member type ('constrained-float'): not a field
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def parse_scenario(data, where: str = "scenario", model=Scenario) -> Scenario:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        found = {}
        for err in e.errors():  # a union reports each member's error at one field: the first says enough
            found.setdefault(_where(err["loc"]), err["msg"].removeprefix("Value error, "))  # ours says it all
        # ... unless a member reports one inside the field (speed_mps[1], the list member): the input's shape
        lines = [f"{w}: {msg}" for w, msg in found.items() if not any(o.startswith((w + ".", w + "[")) for o in found)]
        raise ScenarioError(f"{where}: " + "; ".join(lines)) from None


def load_scenario(path, model=Scenario) -> Scenario:
    """Read and validate a scenario YAML file (paths resolved against its folder); ``model``: the schema
    (a Scenario subclass such as the closed loop's)."""
    import yaml
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: scenario file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML ({str(e).splitlines()[0]} ...)") from None
    except RecursionError:
        raise ScenarioError(f"{path}: nests too deeply to be a scenario") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: expected a mapping of scenario fields at the top level")
    return parse_scenario(data, str(path), model).resolve(path.parent)


def save_scenario(scenario: Scenario, path) -> None:
    """Write ``scenario`` as YAML (atomically); `load_scenario` reads it back."""
    import yaml
    from gsim.io import write_bytes
    data = scenario.model_dump(mode="json", exclude_none=True)
    write_bytes(path, yaml.safe_dump(data, sort_keys=False).encode())
