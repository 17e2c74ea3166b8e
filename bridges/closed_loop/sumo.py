"""Traffic from SUMO for gsim's closed loop.

A closed-loop run drives an ego vehicle through a reconstructed street while SUMO supplies reactive
traffic in lock step. This module builds a SUMO road network around the ego's driven path
(:func:`build_network`), loads a user's own network (:func:`load_network`) and runs SUMO with the ego
injected (:class:`SumoTraffic`).

Frames and conventions (the only place in gsim that converts them):

* gsim world: right-handed, metres, z up; a vehicle pose is its box centre (x, y) and yaw in radians,
  counter-clockwise from +x.
* SUMO reports a vehicle's FRONT-BUMPER centre and a navigational angle in degrees, clockwise from north
  (+y). Box centre = front - length/2 * (cos yaw, sin yaw); yaw = pi/2 - radians(angle).
* SUMO x-y (the coordinates in a .net.xml) = net-frame x-y + the net's ``netOffset``;
  world x-y = ``T_world_net`` applied to net-frame x-y. Networks from :func:`build_network` have
  ``T_world_net`` = identity and no offset, so SUMO x-y equals world x-y.
* Route distance: metres along a route's lane centre line (lane shapes joined by straight chords across
  junctions), from the route's start.

Why-notes on SUMO behaviour (measured with SUMO 1.28):

* libsumo runs one simulation per process and silently replaces a running one on a second ``start``;
  :class:`SumoTraffic` refuses instead. Use ``client='traci'`` for several simulations or the GUI.
* A vehicle moved with ``moveToXY(keepRoute=1)`` is only mapped onto edges of its route: with a one-edge
  route it sticks at that edge's end, and with ``keepRoute`` 0/2 the route is replaced by the current edge,
  so a step without a move lets it drive off that edge's end and vanish. The ego therefore gets the whole
  forward route and ``keepRoute=1``; if it is gone after a step anyway it is re-added at its last commanded
  pose (:attr:`SumoTraffic.ego_readds` counts this).
* ``setSpeed`` after ``moveToXY`` takes effect from the next step, so the ego is added with
  ``departSpeed`` equal to its speed.
* ``vehicle.add`` refuses a departure speed above the limit times the vType's speed factor (with a random
  speed factor SUMO re-samples it instead, with a warning): gsim's vTypes have no speed deviation, each
  vehicle gets its factor explicitly, and a vehicle departing above the limit gets its own vType.
* A departure that is unsafe for the new vehicle's leader or follower is delayed (and delays the vehicles
  behind it on that edge), so :meth:`SumoTraffic.spawn_density` departs everyone on a route at one speed with
  one headway of spacing, and slower behind the ego where they must be able to stop for it.
* With libsumo, removing a subscribed vehicle makes the next step fail; vehicles here are never removed
  through the API.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gsim.config import Config
from gsim.errors import GsimError, InputError, MissingExtra, NotFound

__all__ = [
    "SumoError", "RoadSpec", "Network", "TrafficVehicle", "SumoTraffic", "build_network", "load_network", "run_netconvert",
    "VEHICLE_CLASSES",
]

EGO_ID = "ego"
_NETCONVERT_TIMEOUT_S = 120.0
# Path points closer than this to the previous kept one are dropped: a stopped ego's jitter and a log's
# centimetre noise at 10 Hz otherwise make metre-scale kinks that no lane a few metres to the side can follow.
# Coarser spacings are tried in turn when the road does not fit; on a curve of radius R a spacing L moves
# the lane centre by at most L^2 / (8 R) from the path (4 mm for L = 2 m, R = 100 m).
_THIN_STEPS_M = (1.0, 2.0, 4.0)
_SIMPLIFY_M = 0.01    # Douglas-Peucker tolerance: the network's lane centre stays within 1 cm of the path
_SNAP_CUT_M = 0.5     # edge cuts this close to a path vertex use the vertex (no sliver segments)
_MIN_GAP_M = 2.5      # SUMO's default minGap, used for every class so spawn spacing is predictable
_HEADWAY_S = 1.0      # SUMO Krauss tau
_DECEL_MPS2 = 4.5     # one comfortable deceleration for all classes: the secure gap is then ~ speed * tau
_EGO_SPEED_FACTOR = 10.0  # gsim drives the ego at any speed: SUMO must never refuse its departure speed
_DEPART_FRACTION = 0.9  # spawned traffic departs at this fraction of the limit (speed factors are >= 0.9)


@dataclasses.dataclass(frozen=True)
class _VehicleClass:
    length_m: float
    width_m: float
    height_m: float
    accel_mps2: float
    max_speed_mps: float


# The sizes of the starter assets that draw these vClasses in the closed loop (gsim.editing's sedan and SUV,
# truck, bus, cyclist), so that SUMO follows the boxes the metrics see; SUMO's accelerations and top speeds;
# decelerations are unified (see _DECEL_MPS2).
VEHICLE_CLASSES: Mapping[str, _VehicleClass] = {
    "passenger": _VehicleClass(4.7, 2.0, 1.6, 2.6, 55.56),
    "truck": _VehicleClass(8.0, 2.5, 3.5, 1.3, 36.11),
    "bus": _VehicleClass(12.1, 2.55, 3.1, 1.2, 27.78),
    "motorcycle": _VehicleClass(1.7, 0.6, 1.85, 6.0, 55.56),
}
_DEFAULT_MIX: Mapping[str, float] = {"passenger": 0.8, "truck": 0.1, "bus": 0.1}


class SumoError(GsimError, RuntimeError):
    """SUMO or netconvert failed: the message names the command or step and what SUMO said."""


def _sumolib() -> Any:
    try:
        import sumolib
    except ImportError as e:  # optional extra
        raise MissingExtra("gsim.bridges.closed_loop.sumo needs sumolib: pip install 'gsim[sumo]'") from e
    return sumolib


# ----------------------------------------------------------------------------------------------------------
# Road specification and network building
# ----------------------------------------------------------------------------------------------------------

def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputError(f"RoadSpec.{name} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise InputError(f"RoadSpec.{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value}")


def _check_float(name: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise InputError(f"RoadSpec.{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
        raise InputError(f"RoadSpec.{name} must be finite and in {'(' if lo_open else '['}{lo}, {hi}], got {value}")


@dataclasses.dataclass(frozen=True)
class RoadSpec(Config):
    """The road built around the ego's driven path.

    lanes: forward lanes; lane_width_m: metres; opposite_lanes: lanes in the other direction, left of the
    forward carriageway (0: one-way road); ego_lane: the forward lane whose centre is the driven path
    (0 = rightmost); speed_limit_mps: m/s; extend_m: straight extension of the centre line at both ends
    (metres), so traffic has room and the ego never reaches an edge's end; edge_length_m: the road is split
    into edges about this long (metres), so routes have several edges.
    """

    lanes: int = 1
    lane_width_m: float = 3.5
    opposite_lanes: int = 1
    ego_lane: int = 0
    speed_limit_mps: float = 13.9
    extend_m: float = 150.0
    edge_length_m: float = 50.0


    def __post_init__(self) -> None:
        _check_int("lanes", self.lanes, 1, 16)
        _check_float("lane_width_m", self.lane_width_m, 1.0, 10.0)
        _check_int("opposite_lanes", self.opposite_lanes, 0, 16)
        _check_int("ego_lane", self.ego_lane, 0, self.lanes - 1)
        _check_float("speed_limit_mps", self.speed_limit_mps, 0.0, 100.0, lo_open=True)
        _check_float("extend_m", self.extend_m, 0.0, 1e5)
        _check_float("edge_length_m", self.edge_length_m, 5.0, 1e5)


def _validate_path(path_xy: Any) -> np.ndarray:
    p = np.asarray(path_xy, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != 2:
        raise InputError(f"path_xy must have shape (N, 2), got {p.shape}")
    if len(p) < 2:
        raise InputError(f"path_xy needs at least 2 points, got {len(p)}")
    if not np.isfinite(p).all():
        raise InputError("path_xy contains NaN or infinite values")
    length = float(np.linalg.norm(np.diff(p, axis=0), axis=1).sum())
    if length <= 1.0:
        raise InputError(f"path_xy must be longer than 1 m, got {length:.3f} m")
    return p


def _thin(p: np.ndarray, min_step: float) -> np.ndarray:
    keep = [0]
    for i in range(1, len(p)):
        if np.linalg.norm(p[i] - p[keep[-1]]) >= min_step:
            keep.append(i)
    if keep[-1] != len(p) - 1:  # keep the true end point, replacing a too-close predecessor
        if len(keep) > 1:
            keep[-1] = len(p) - 1
        else:
            keep.append(len(p) - 1)
    return p[keep]


def _simplify(p: np.ndarray, tol: float) -> np.ndarray:
    """Douglas-Peucker: drop vertices whose removal moves the polyline by less than tol (metres)."""
    keep = np.zeros(len(p), dtype=bool)
    keep[[0, -1]] = True
    stack = [(0, len(p) - 1)]
    while stack:
        i, j = stack.pop()
        if j <= i + 1:
            continue
        a, b = p[i], p[j]
        ab = b - a
        rel = p[i + 1:j] - a
        norm = np.linalg.norm(ab)
        dist = np.abs(ab[0] * rel[:, 1] - ab[1] * rel[:, 0]) / norm if norm > 0 else np.linalg.norm(rel, axis=1)
        k = int(np.argmax(dist))
        if dist[k] > tol:
            m = i + 1 + k
            keep[m] = True
            stack += [(i, m), (m, j)]
    return p[keep]


def _cumlen(p: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(p, axis=0), axis=1))])


def _miter_offset(p: np.ndarray, d: float) -> np.ndarray:
    """Offset a polyline by d metres to its left (negative: right), keeping every segment parallel.

    Interior vertices move to the intersection of the two offset segments (as SUMO's lane spreading does),
    so offsetting by d1 then d2 equals offsetting by d1 + d2.
    """
    seg = np.diff(p, axis=0)
    seg /= np.linalg.norm(seg, axis=1, keepdims=True)
    normals = np.stack([-seg[:, 1], seg[:, 0]], axis=1)
    n = np.concatenate([normals[:1], normals[:-1] + normals[1:], normals[-1:]])
    n_in = np.concatenate([normals[:1], normals[:-1], normals[-1:]])  # normal of the segment into the vertex
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    return p + d * n / np.sum(n * n_in, axis=1, keepdims=True)


def _check_curvature(p: np.ndarray, offsets: Sequence[float]) -> None:
    seg = np.diff(p, axis=0)
    turn = np.sum(seg[:-1] * seg[1:], axis=1)
    if np.any(turn <= 0.0):
        i = int(np.argmax(turn <= 0.0)) + 1
        raise InputError(f"path_xy turns by 90 degrees or more at point {p[i].tolist()}; cannot build a road along it")
    for d in offsets:
        if np.any(np.sum(np.diff(_miter_offset(p, d), axis=0) * seg, axis=1) <= 0.0):
            raise InputError(f"path_xy is curved too tightly for a road edge {d:+.2f} m to its side "
                             "(fewer or narrower lanes, or a smoother path)")


def _end_tangent(p: np.ndarray) -> np.ndarray:
    """Unit direction in which the polyline p leaves its first point, backwards (second-order estimate)."""
    cum = _cumlen(p)
    h = min(2.0, cum[-1] / 4.0)
    q = np.stack([np.interp([0.0, h, 2 * h], cum, p[:, i]) for i in range(2)], axis=1)
    d = 3.0 * q[0] - 4.0 * q[1] + q[2]  # -(derivative along s) from one-sided differences
    return d / np.linalg.norm(d)


def _extend_and_cut(p: np.ndarray, tangent_from: np.ndarray, extend_m: float,
                    edge_length_m: float) -> tuple[np.ndarray, list[int]]:
    """The path extended straight at both ends (along the end tangents of ``tangent_from``, the unsimplified
    path), with vertices at the edge cuts; returns (points, cut indices)."""
    if extend_m > 0:
        d0, d1 = _end_tangent(tangent_from), _end_tangent(tangent_from[::-1])
        p = np.vstack([p[0] + extend_m * d0, p, p[-1] + extend_m * d1])
    cum = _cumlen(p)
    n_edges = max(1, int(round(cum[-1] / edge_length_m)))
    pts = list(p)
    cuts = [0]
    for s in cum[-1] * np.arange(1, n_edges) / n_edges:
        cum = _cumlen(np.asarray(pts))
        j = int(np.argmin(np.abs(cum - s)))
        if abs(cum[j] - s) <= _SNAP_CUT_M and cuts[-1] < j < len(pts) - 1:
            cuts.append(j)
            continue
        k = int(np.searchsorted(cum, s)) - 1
        t = (s - cum[k]) / (cum[k + 1] - cum[k])
        pts.insert(k + 1, pts[k] + t * (pts[k + 1] - pts[k]))
        cuts.append(k + 1)
    cuts.append(len(pts) - 1)
    return np.asarray(pts), cuts


def _fmt_shape(pts: np.ndarray) -> str:
    return " ".join(f"{x:.4f},{y:.4f}" for x, y in pts)


def run_netconvert(inputs: Sequence[str], out: Path, output: str = "--output-file") -> None:
    """Run SUMO's netconvert on ``inputs`` (its input options and files), its ``output`` option writing ``out``
    atomically (gsim's world frame kept: no offset normalization); SumoError on any failure."""
    binary = _sumolib().checkBinary("netconvert")
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.tmp{out.suffix}")
    cmd = [binary, *inputs, output, str(tmp), "--offset.disable-normalization", "true", "--no-turnarounds", "true",
           "--precision", "4", "--xml-validation", "never"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=_NETCONVERT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        tmp.unlink(missing_ok=True)
        raise SumoError(f"netconvert could not run: {' '.join(cmd)}: {e}") from e
    if res.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
        tmp.unlink(missing_ok=True)
        said = (res.stderr.strip() or res.stdout.strip() or "(no message)")[-4000:]
        why = f"exit status {res.returncode}" if res.returncode != 0 else "no output file"
        raise SumoError(f"netconvert failed ({why}): {' '.join(cmd)}\n{said}")
    os.replace(tmp, out)


def build_network(path_xy: Any, spec: RoadSpec, out_dir: str | os.PathLike) -> "Network":
    """Build a straight-ahead road network whose forward lane ``spec.ego_lane`` is centred on the driven path.

    path_xy: (N, 2) world x-y polyline in metres (N >= 2, finite, longer than 1 m); very dense or
    duplicated points are thinned and the polyline simplified within 1 cm. The centre line is extended
    straight by ``spec.extend_m`` at both ends and cut into edges of about ``spec.edge_length_m``.
    Writes ``road.nod.xml``, ``road.edg.xml`` and ``road.net.xml`` (atomically) into out_dir; SUMO x-y equals
    world x-y. Raises ValueError for bad input and SumoError when netconvert fails.
    """
    if not isinstance(spec, RoadSpec):
        raise InputError(f"spec must be a RoadSpec, got {type(spec).__name__}")
    path = _validate_path(path_xy)
    w = spec.lane_width_m
    # Offsets (left of the path) of the forward carriageway's left border and of the road's outer borders.
    border = (spec.lanes - spec.ego_lane - 0.5) * w
    for step in _THIN_STEPS_M:
        thin = _thin(path, step)
        p = _simplify(thin, _SIMPLIFY_M)
        if _cumlen(p)[-1] <= 1.0:
            raise InputError("path_xy goes less than 1 m away from where it starts")
        try:
            _check_curvature(p, [border + spec.opposite_lanes * w, -(spec.ego_lane + 0.5) * w])
            break
        except ValueError:
            if step == _THIN_STEPS_M[-1]:
                raise
    centre, cuts = _extend_and_cut(p, thin, float(spec.extend_m), float(spec.edge_length_m))
    # spreadType "right": the edge shape is the left border of its lanes, so the forward and the reversed
    # opposite edge share one shape (the line between the carriageways) and netconvert offsets every lane
    # centre from it exactly by (i + 0.5) * width; nodes lie on that shape so it is used as given.
    shape = _miter_offset(centre, border)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    nodes = [f'    <node id="gsim_n{k}" x="{shape[i, 0]:.4f}" y="{shape[i, 1]:.4f}"/>' for k, i in enumerate(cuts)]
    edges = []
    common = f'numLanes="{{}}" width="{w:.4f}" speed="{float(spec.speed_limit_mps):.4f}" spreadType="right"'
    for k in range(len(cuts) - 1):
        piece = shape[cuts[k]:cuts[k + 1] + 1]
        edges.append(f'    <edge id="gsim_f{k}" from="gsim_n{k}" to="gsim_n{k + 1}" '
                     f'{common.format(spec.lanes)} shape="{_fmt_shape(piece)}"/>')
        if spec.opposite_lanes:
            edges.append(f'    <edge id="gsim_o{k}" from="gsim_n{k + 1}" to="gsim_n{k}" '
                         f'{common.format(spec.opposite_lanes)} shape="{_fmt_shape(piece[::-1])}"/>')
    nod, edg, net = out / "road.nod.xml", out / "road.edg.xml", out / "road.net.xml"
    nod.write_text("<nodes>\n" + "\n".join(nodes) + "\n</nodes>\n")
    edg.write_text("<edges>\n" + "\n".join(edges) + "\n</edges>\n")
    run_netconvert(["--node-files", str(nod), "--edge-files", str(edg)], net)
    n_edges = len(cuts) - 1
    forward = [f"gsim_f{k}" for k in range(n_edges)]
    opposite = [f"gsim_o{k}" for k in reversed(range(n_edges))] if spec.opposite_lanes else []
    return Network(net, np.eye(4), forward, opposite, spec.ego_lane)


def _validate_T(T: Any) -> np.ndarray:
    T = np.asarray(T, dtype=np.float64)
    if T.shape != (4, 4) or not np.isfinite(T).all():
        raise InputError(f"T_world_net must be a finite 4x4 matrix, got shape {T.shape}")
    R = T[:3, :3]
    ok = (np.allclose(T[3], [0, 0, 0, 1], atol=1e-9) and np.allclose(R[2], [0, 0, 1], atol=1e-6)
          and np.allclose(R[:, 2], [0, 0, 1], atol=1e-6) and np.allclose(R @ R.T, np.eye(3), atol=1e-6)
          and np.linalg.det(R) > 0)
    if not ok:
        raise InputError("T_world_net must be a rotation about z plus a translation (SUMO networks are 2D, "
                         f"right-handed, metres); got\n{T}")
    return T


def load_network(net_xml: str | os.PathLike, T_world_net: Any = None, forward_route: Sequence[str] | None = None,
                 opposite_route: Sequence[str] | None = None, ego_lane: int = 0) -> "Network":
    """Load a user's own SUMO network.

    T_world_net: optional 4x4 transform from the net's frame (SUMO x-y minus the net's ``netOffset``) to
    the gsim world frame; only a rotation about z and a translation are accepted. forward_route /
    opposite_route: connected edge-id lists for the ego's route and the other direction; for networks
    written by :func:`build_network` they are recovered from the edge ids when not given. ego_lane: the
    forward lane index the route distance is measured along (clamped to each edge's lane count).
    Raises FileNotFoundError or ValueError for an unreadable or invalid network.
    """
    net_xml = Path(net_xml)
    if not net_xml.is_file():
        raise FileNotFoundError(f"SUMO network not found: {net_xml}")
    T = np.eye(4) if T_world_net is None else _validate_T(T_world_net)
    return Network(net_xml, T, forward_route, opposite_route, ego_lane)


# ----------------------------------------------------------------------------------------------------------
# Network
# ----------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Chain:
    """One lane followed along a route: per edge its lane, start route distance and lengths (metres)."""

    edges: tuple[str, ...]
    lanes: tuple[int, ...]
    s0: np.ndarray        # route distance where each edge's lane starts
    geo_len: np.ndarray   # geometric length of each lane shape
    sumo_len: np.ndarray  # SUMO's lane length (its positions run over [0, sumo_len])
    line: np.ndarray      # (M, 2) SUMO x-y centre line, edges joined by chords
    cum: np.ndarray       # route distance at each line vertex

    @property
    def length(self) -> float:
        return float(self.cum[-1])

    def point(self, s: np.ndarray) -> np.ndarray:
        """SUMO x-y at route distances s."""
        s = np.atleast_1d(np.asarray(s, dtype=np.float64))
        return np.stack([np.interp(s, self.cum, self.line[:, 0]), np.interp(s, self.cum, self.line[:, 1])], -1)

    def locate(self, s: float) -> tuple[int, float]:
        """(index into edges, SUMO lane position) of route distance s; in a junction gap: the next edge's start."""
        k = max(0, int(np.searchsorted(self.s0, s, side="right")) - 1)
        local = s - self.s0[k]
        if local > self.geo_len[k] and k + 1 < len(self.edges):
            k, local = k + 1, 0.0
        local = min(max(local, 0.0), self.geo_len[k])
        return k, float(local * self.sumo_len[k] / max(self.geo_len[k], 1e-9))

    def project(self, xy: np.ndarray) -> np.ndarray:
        """Route distance of the nearest line point to each SUMO x-y in xy (N, 2)."""
        a, b = self.line[:-1], self.line[1:]
        ab = b - a
        den = np.maximum(np.sum(ab * ab, axis=1), 1e-12)
        t = np.clip(np.einsum("nmk,mk->nm", xy[:, None, :] - a[None], ab) / den, 0.0, 1.0)
        d2 = np.sum((a[None] + t[..., None] * ab[None] - xy[:, None, :]) ** 2, axis=-1)
        j = np.argmin(d2, axis=1)
        rows = np.arange(len(xy))
        return self.cum[j] + t[rows, j] * np.sqrt(den[j])


class Network:
    """A SUMO road network and its relation to the gsim world frame (see the module docstring).

    Use :func:`build_network` or :func:`load_network` to make one.
    """

    def __init__(self, net_xml: Path, T_world_net: np.ndarray, forward_route: Sequence[str] | None,
                 opposite_route: Sequence[str] | None, ego_lane: int) -> None:
        sumolib = _sumolib()
        try:
            self._net = sumolib.net.readNet(str(net_xml), withInternal=True)
        except Exception as e:  # sumolib raises SAX, KeyError, ValueError... for broken files
            raise InputError(f"{net_xml} is not a readable SUMO network: {type(e).__name__}: {e}") from e
        if not self._net.getEdges(withInternal=False):
            raise InputError(f"{net_xml} is not a usable SUMO network: it has no edges")
        if isinstance(ego_lane, bool) or not isinstance(ego_lane, (int, np.integer)) or ego_lane < 0:
            raise InputError(f"ego_lane must be a non-negative integer, got {ego_lane!r}")
        self._path = Path(net_xml)
        self._offset = np.asarray(self._net.getLocationOffset(), dtype=np.float64)[:2]
        self._T = T_world_net
        self._R = T_world_net[:2, :2]
        self._theta = math.atan2(T_world_net[1, 0], T_world_net[0, 0])
        self._ego_lane = int(ego_lane)
        if forward_route is None and opposite_route is None:
            forward_route, opposite_route = self._gsim_routes()
        self._routes = {"forward": self._check_route("forward_route", forward_route or []),
                        "opposite": self._check_route("opposite_route", opposite_route or [])}
        self._chains: dict[tuple[str, int], _Chain] = {}
        self._lanes: list[tuple[str, np.ndarray, float]] | None = None

    def _gsim_routes(self) -> tuple[list[str], list[str]]:
        ids = {e.getID() for e in self._net.getEdges(withInternal=False)}
        n = 0
        while f"gsim_f{n}" in ids:
            n += 1
        forward = [f"gsim_f{k}" for k in range(n)]
        if not n or not all(f"gsim_o{k}" in ids for k in range(n)):
            return forward, []
        return forward, [f"gsim_o{k}" for k in reversed(range(n))]

    def _check_route(self, name: str, route: Sequence[str]) -> list[str]:
        route = [str(e) for e in route]
        for e in route:
            if not self._net.hasEdge(e) or e.startswith(":"):
                raise InputError(f"{name}: edge {e!r} is not a normal edge of {self._path}")
        for a, b in zip(route, route[1:]):
            if self._net.getEdge(b) not in self._net.getEdge(a).getOutgoing():
                raise InputError(f"{name}: edge {a!r} does not connect to {b!r}")
        return route

    # -- frames -------------------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The .net.xml file."""
        return self._path

    @property
    def T_world_net(self) -> np.ndarray:
        """4x4 transform from the net frame (SUMO x-y minus netOffset) to the world frame."""
        return self._T.copy()

    def to_world(self, xy: Any) -> np.ndarray:
        """SUMO x-y (N, 2) -> world x-y (N, 2), metres."""
        xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
        return (xy - self._offset) @ self._R.T + self._T[:2, 3]

    def to_sumo(self, xy: Any) -> np.ndarray:
        """World x-y (N, 2) -> SUMO x-y (N, 2), metres."""
        xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
        return (xy - self._T[:2, 3]) @ self._R + self._offset

    def yaw_to_world(self, yaw_sumo: float) -> float:
        """Yaw (rad, CCW from +x) in SUMO's x-y frame -> world yaw in (-pi, pi]."""
        return _wrap(yaw_sumo + self._theta)

    def yaw_to_sumo(self, yaw: float) -> float:
        """World yaw (rad) -> yaw in SUMO's x-y frame, in (-pi, pi]."""
        return _wrap(yaw - self._theta)

    # -- routes and lanes ---------------------------------------------------------------------------------
    @property
    def forward_route(self) -> list[str]:
        """Edge ids from the start to the end of the forward carriageway (empty if unknown)."""
        return list(self._routes["forward"])

    @property
    def opposite_route(self) -> list[str]:
        """Edge ids of the other direction (empty for a one-way road)."""
        return list(self._routes["opposite"])

    @property
    def ego_lane(self) -> int:
        """Forward lane index the ego drives in and route distance is measured along."""
        return self._ego_lane

    @property
    def length_m(self) -> float:
        """Length of the forward route along the ego lane's centre line, metres."""
        return self._chain("forward", self._ego_lane).length

    def lane_count(self, edge_id: str) -> int:
        """Number of lanes of a normal edge."""
        if not self._net.hasEdge(edge_id):
            raise NotFound(f"no edge {edge_id!r} in {self._path}")
        return self._net.getEdge(edge_id).getLaneNumber()

    def speed_limit(self, edge_id: str) -> float:
        """Speed limit of an edge's first lane, m/s."""
        return float(self._net.getEdge(edge_id).getLane(0).getSpeed())

    def lanes(self) -> list[tuple[str, np.ndarray, float]]:
        """Every lane, junction-internal ones included: (lane id, world centre polyline (M, 2), width m)."""
        if self._lanes is None:
            self._lanes = [(lane.getID(), self.to_world(np.asarray(lane.getShape(), dtype=np.float64)[:, :2]),
                            float(lane.getWidth()))
                           for edge in self._net.getEdges(withInternal=True) for lane in edge.getLanes()]
        return [(i, s.copy(), w) for i, s, w in self._lanes]

    def route_distance(self, xy: Any) -> np.ndarray:
        """Forward route distance (metres along the ego lane's centre line) of the nearest point to world xy (N, 2)."""
        return self._chain("forward", self._ego_lane).project(self.to_sumo(xy))

    def route_lanes(self, route: str) -> int:
        """Lanes present on every edge of a route ('forward' or 'opposite')."""
        edges = self._route(route)
        return min(self.lane_count(e) for e in edges)

    def _route(self, route: str) -> list[str]:
        if route not in self._routes:
            raise InputError(f"route must be 'forward' or 'opposite', got {route!r}")
        if not self._routes[route]:
            raise InputError(f"the network {self._path} has no {route} route")
        return self._routes[route]

    def _chain(self, route: str, lane: int) -> _Chain:
        key = (route, lane)
        if key not in self._chains:
            edges = self._route(route)
            lanes, s0, geo, slen, pts = [], [], [], [], []
            for e in edges:
                obj = self._net.getEdge(e)
                idx = min(lane, obj.getLaneNumber() - 1)
                shape = np.asarray(obj.getLane(idx).getShape(), dtype=np.float64)[:, :2]
                start = 0.0 if not pts else _cumlen(np.vstack(pts))[-1] + np.linalg.norm(shape[0] - pts[-1][-1])
                lanes.append(idx)
                s0.append(start)
                geo.append(_cumlen(shape)[-1])
                slen.append(obj.getLane(idx).getLength())
                pts.append(shape)
            line = np.vstack(pts)
            keep = np.concatenate([[True], np.linalg.norm(np.diff(line, axis=0), axis=1) > 1e-9])
            line = line[keep]
            self._chains[key] = _Chain(tuple(edges), tuple(lanes), np.asarray(s0), np.asarray(geo),
                                       np.asarray(slen), line, _cumlen(line))
        return self._chains[key]


def _wrap(a: float) -> float:
    return float(math.pi - (math.pi - a) % (2.0 * math.pi))


def _nav_deg(yaw_sumo: float) -> float:
    """Yaw (rad, CCW from +x) -> SUMO's navigational angle (degrees, clockwise from north) in [0, 360)."""
    return (90.0 - math.degrees(yaw_sumo)) % 360.0


def _yaw_from_nav(angle_deg: float) -> float:
    return _wrap(math.pi / 2.0 - math.radians(angle_deg))


# ----------------------------------------------------------------------------------------------------------
# Traffic
# ----------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TrafficVehicle:
    """A SUMO vehicle in gsim's world frame: (x, y) is the BOX CENTRE in metres, yaw in radians
    counter-clockwise from +x; speed m/s, accel m/s^2, sizes in metres; vclass is SUMO's vehicle class."""

    id: str
    vclass: str
    x: float
    y: float
    yaw: float
    speed_mps: float
    accel_mps2: float
    length_m: float
    width_m: float
    height_m: float


# TraCI protocol variable ids (traci.constants VAR_POSITION, VAR_ANGLE, VAR_SPEED, VAR_ACCELERATION, VAR_LENGTH,
# VAR_WIDTH, VAR_HEIGHT, VAR_VEHICLECLASS), fixed by the protocol and shared by libsumo and traci
_POS, _ANGLE, _SPEED, _ACCEL, _LENGTH, _WIDTH, _HEIGHT, _VCLASS = 0x42, 0x43, 0x40, 0x72, 0x44, 0x4D, 0xBC, 0x49
_SUBSCRIBED = (_POS, _ANGLE, _SPEED, _ACCEL, _LENGTH, _WIDTH, _HEIGHT, _VCLASS)
_label_counter = itertools.count()


def _check_num(name: str, value: Any, lo: float = -math.inf, hi: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise InputError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < lo or v > hi:
        raise InputError(f"{name} must be finite and in [{lo}, {hi}], got {value!r}")
    return v


def _stop_speed(gap_m: float, leader_speed: float) -> float:
    """Highest speed (m/s) at which a follower gap_m metres behind a leader still has SUMO's secure gap
    (one headway plus its braking distance minus the leader's, both braking at _DECEL_MPS2)."""
    budget = max(gap_m, 0.0) + leader_speed ** 2 / (2.0 * _DECEL_MPS2)
    b, tau = _DECEL_MPS2, _HEADWAY_S
    return max(0.0, b * (-tau + math.sqrt(tau * tau + 2.0 * budget / b)))


def _check_vclass(vclass: str) -> _VehicleClass:
    if vclass not in VEHICLE_CLASSES:
        raise InputError(f"vclass must be one of {sorted(VEHICLE_CLASSES)}, got {vclass!r}")
    return VEHICLE_CLASSES[vclass]


class SumoTraffic:
    """SUMO running in lock step with gsim's closed loop (a context manager; call :meth:`close`).

    network: the road; step_s: simulation step in seconds; seed: SUMO's random seed; begin_s: simulation
    start time in seconds; client: 'libsumo' (in-process, one simulation per process) or 'traci' (a SUMO
    process over a socket: several simulations, or the GUI with gui=True).

    One closed-loop step: :meth:`set_ego` with the ego's new pose, then :meth:`step`, which returns the
    other vehicles. SUMO is run deterministically (fixed seed, no teleports, collisions only warned about:
    gsim measures collisions itself). Any SUMO failure raises :class:`SumoError` naming the step.
    """

    def __init__(self, network: Network, step_s: float = 0.1, seed: int = 0, begin_s: float = 0.0,
                 client: str = "libsumo", gui: bool = False) -> None:
        if not isinstance(network, Network):
            raise InputError(f"network must be a Network, got {type(network).__name__}")
        self._step_s = _check_num("step_s", step_s, 1e-3, 60.0)
        begin = _check_num("begin_s", begin_s, 0.0)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**31:
            raise InputError(f"seed must be an integer in [0, 2**31), got {seed!r}")
        if client not in ("libsumo", "traci"):
            raise InputError(f"client must be 'libsumo' or 'traci', got {client!r}")
        if gui and client != "traci":
            raise InputError("gui=True needs client='traci' (libsumo runs SUMO in-process without a GUI)")
        self.network = network
        self.client = client
        self._api: Any = None
        self._closed = False
        self._steps = 0
        self._time_s = begin
        self._ego: dict[str, Any] | None = None
        self._spawned = 0
        self._routes_added: set[str] = set()
        self.ego_readds = 0
        self._tmp = Path(tempfile.mkdtemp(prefix="gsim-sumo-"))
        self._log = self._tmp / "sumo-messages.log"
        sumolib = _sumolib()
        cmd = [sumolib.checkBinary("sumo-gui" if gui else "sumo"), "--net-file", str(network.path),
               "--step-length", repr(self._step_s), "--begin", repr(begin), "--seed", str(int(seed)),
               "--default.action-step-length", repr(self._step_s), "--collision.action", "none",
               "--time-to-teleport", "-1", "--lateral-resolution=-1", "--no-step-log", "true", "--no-warnings", "true",
               "--error-log", str(self._log), "--xml-validation", "never", "--xml-validation.net", "never"]
        if gui:
            cmd += ["--start", "true", "--quit-on-end", "true"]
        try:
            self._start(cmd)
            self._setup()
        except BaseException:
            self.close()
            raise

    def _start(self, cmd: list[str]) -> None:
        if self.client == "libsumo":
            import libsumo
            if libsumo.simulation.isLoaded():
                raise SumoError("libsumo already runs a simulation in this process (one libsumo simulation per "
                                "process); close it first or use client='traci'")
            self._errors: tuple[type[BaseException], ...] = (libsumo.TraCIException, libsumo.FatalTraCIError)
            try:
                libsumo.start(cmd)
            except self._errors as e:
                raise SumoError(f"SUMO did not start: {' '.join(cmd)}: {e}{self._log_tail()}") from e
            self._api = libsumo
        else:
            import traci
            from traci.exceptions import FatalTraCIError, TraCIException
            self._errors = (TraCIException, FatalTraCIError, OSError, EOFError)
            label = f"gsim-{os.getpid()}-{next(_label_counter)}"
            try:
                # few retries: each one restarts SUMO, and a SUMO that cannot start fails every time
                traci.start(cmd, numRetries=10, label=label, stdout=subprocess.DEVNULL, doSwitch=False)
            except self._errors as e:
                raise SumoError(f"SUMO did not start: {' '.join(cmd)}: {e}{self._log_tail()}") from e
            self._api = traci.getConnection(label)

    def _setup(self) -> None:
        with self._guard("setup"):
            for name, vc in VEHICLE_CLASSES.items():
                self._make_type(f"gsim_{name}", name, vc.length_m, vc.width_m)
            for route in ("forward", "opposite"):
                if getattr(self.network, f"{route}_route"):
                    self._route_id(route, 0)

    def _make_type(self, type_id: str, vclass: str, length_m: float, width_m: float) -> None:
        vt, vc = self._api.vehicletype, VEHICLE_CLASSES[vclass]
        if type_id not in vt.getIDList():
            vt.copy("DEFAULT_VEHTYPE", type_id)
        vt.setVehicleClass(type_id, vclass)  # sets permissions only: sizes and dynamics are set explicitly
        vt.setLength(type_id, length_m)
        vt.setWidth(type_id, width_m)
        vt.setHeight(type_id, vc.height_m)
        vt.setMinGap(type_id, _MIN_GAP_M)
        vt.setAccel(type_id, vc.accel_mps2)
        vt.setDecel(type_id, _DECEL_MPS2)
        vt.setEmergencyDecel(type_id, 2.0 * _DECEL_MPS2)
        vt.setMaxSpeed(type_id, vc.max_speed_mps)
        vt.setSpeedDeviation(type_id, 0.0)  # speed factors are set per vehicle (module docstring)

    def _route_id(self, route: str, first_edge: int) -> str:
        """SUMO route id for the named route starting at its edge index first_edge (added on first use)."""
        rid = f"gsim_{route}" if first_edge == 0 else f"gsim_{route}@{first_edge}"
        if rid not in self._routes_added:
            self._api.route.add(rid, getattr(self.network, f"{route}_route")[first_edge:])
            self._routes_added.add(rid)
        return rid

    # -- failure handling ---------------------------------------------------------------------------------
    def _log_tail(self, n: int = 2000) -> str:
        try:
            text = self._log.read_text(errors="replace").strip()
        except OSError:
            return ""
        return f"\nSUMO's messages (tail):\n{text[-n:]}" if text else ""

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        if self._closed or self._api is None:
            raise SumoError(f"SUMO simulation is closed ({what})")
        try:
            yield
        except self._errors as e:
            fatal = type(e).__name__ == "FatalTraCIError" or isinstance(e, (OSError, EOFError))
            if fatal:  # the SUMO process or connection is gone: nothing more can be asked of it
                self.close()
            raise SumoError(f"SUMO failed during {what} at step {self._steps} (t = {self._time_s:.3f} s): "
                            f"{type(e).__name__}: {e}{self._log_tail()}") from e

    # -- lifecycle ----------------------------------------------------------------------------------------
    def close(self) -> None:
        """End the simulation (idempotent); a libsumo slot is freed for the next SumoTraffic."""
        if self._closed:
            return
        self._closed = True
        api, self._api = self._api, None
        if api is not None:
            with contextlib.suppress(Exception):  # a dead SUMO cannot be closed politely
                api.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> "SumoTraffic":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def time_s(self) -> float:
        """Simulation time in seconds (after the last step)."""
        return self._time_s

    @property
    def step_s(self) -> float:
        """Simulation step length, seconds."""
        return self._step_s

    # -- ego ----------------------------------------------------------------------------------------------
    def _front_sumo(self, x: float, y: float, yaw: float, length_m: float) -> tuple[float, float, float]:
        """World box centre and yaw -> SUMO front-bumper x, y and navigational angle (degrees)."""
        front = np.array([[x + 0.5 * length_m * math.cos(yaw), y + 0.5 * length_m * math.sin(yaw)]])
        fx, fy = self.network.to_sumo(front)[0]
        return float(fx), float(fy), _nav_deg(self.network.yaw_to_sumo(yaw))

    def _move(self, veh_id: str, x: float, y: float, yaw: float, length_m: float) -> None:
        fx, fy, angle = self._front_sumo(x, y, yaw, length_m)
        # keepRoute=1: map onto the closest edge of the vehicle's own route (never replace the route)
        self._api.vehicle.moveToXY(veh_id, "", -1, fx, fy, angle, 1)

    def _add_ego_vehicle(self) -> None:
        ego = self._ego
        self._api.vehicle.add(EGO_ID, self._route_id("forward", 0), "gsim_ego", depart="now",
                              departSpeed=repr(ego["speed"]))
        self._api.vehicle.setSpeedMode(EGO_ID, 0)  # gsim drives the ego: no SUMO safety checks on it
        self._api.vehicle.setLaneChangeMode(EGO_ID, 0)
        self._move(EGO_ID, ego["x"], ego["y"], ego["yaw"], ego["length_m"])
        self._api.vehicle.setSpeed(EGO_ID, ego["speed"])

    def add_ego(self, x: float, y: float, yaw: float, speed: float, length_m: float = 4.8,
                width_m: float = 1.9) -> None:
        """Add vehicle 'ego' (box centre x, y world metres; yaw rad; speed m/s; box length and width metres)
        on the forward route; SUMO inserts it at the next :meth:`step`."""
        if not self.network.forward_route:
            raise InputError("the network has no forward route to put the ego on")
        if self._ego is not None:
            raise InputError("the ego was already added; use set_ego to move it")
        pose = [_check_num(n, v) for n, v in (("x", x), ("y", y), ("yaw", yaw))]
        self._ego = {"x": pose[0], "y": pose[1], "yaw": pose[2], "speed": _check_num("speed", speed, 0.0),
                     "length_m": _check_num("length_m", length_m, 0.1, 50.0),
                     "width_m": _check_num("width_m", width_m, 0.1, 10.0)}
        with self._guard("add_ego"):
            self._make_type("gsim_ego", "passenger", self._ego["length_m"], self._ego["width_m"])
            self._api.vehicletype.setSpeedFactor("gsim_ego", _EGO_SPEED_FACTOR)
            self._add_ego_vehicle()

    def set_ego(self, x: float, y: float, yaw: float, speed: float) -> None:
        """Move the ego to box centre (x, y) world metres with yaw (rad) and speed (m/s); call before step()."""
        if self._ego is None:
            raise InputError("add_ego first")
        pose = [_check_num(n, v) for n, v in (("x", x), ("y", y), ("yaw", yaw))]
        self._ego.update(x=pose[0], y=pose[1], yaw=pose[2], speed=_check_num("speed", speed, 0.0))
        with self._guard("set_ego"):
            self._move(EGO_ID, pose[0], pose[1], pose[2], self._ego["length_m"])
            self._api.vehicle.setSpeed(EGO_ID, self._ego["speed"])  # followers see the ego's speed

    def ego_state(self) -> TrafficVehicle | None:
        """SUMO's view of the ego (box centre, world frame), or None when it is not in the simulation."""
        with self._guard("ego_state"):
            if self._ego is None or EGO_ID not in self._api.vehicle.getIDList():
                return None
            v = self._api.vehicle
            values = {_POS: v.getPosition(EGO_ID), _ANGLE: v.getAngle(EGO_ID), _SPEED: v.getSpeed(EGO_ID),
                      _ACCEL: v.getAcceleration(EGO_ID), _LENGTH: v.getLength(EGO_ID), _WIDTH: v.getWidth(EGO_ID),
                      _HEIGHT: v.getHeight(EGO_ID), _VCLASS: v.getVehicleClass(EGO_ID)}
        return self._to_world(EGO_ID, values)

    # -- other vehicles -----------------------------------------------------------------------------------
    def _check_id(self, veh_id: str) -> str:
        if not isinstance(veh_id, str) or not veh_id or veh_id == EGO_ID:
            raise InputError(f"veh_id must be a non-empty string other than {EGO_ID!r}, got {veh_id!r}")
        return veh_id

    def _add_on_route(self, veh_id: str, route: str, lane: int, centre_s: float, speed: float, vclass: str,
                      speed_factor: float = 1.0) -> None:
        chain = self.network._chain(route, lane)
        k, pos = chain.locate(centre_s + 0.5 * VEHICLE_CLASSES[vclass].length_m)  # SUMO departs by the front
        type_id, factor = self._type_for(veh_id, vclass, speed, self.network.speed_limit(chain.edges[k]), speed_factor)
        self._api.vehicle.add(veh_id, self._route_id(route, k), type_id, depart="now",
                              departLane=str(chain.lanes[k]), departPos=repr(pos), departSpeed=repr(speed))
        self._api.vehicle.setSpeedFactor(veh_id, factor)

    def _type_for(self, veh_id: str, vclass: str, speed: float, limit: float,
                  speed_factor: float) -> tuple[str, float]:
        """(vType id, speed factor) for a vehicle departing at speed (m/s) where the limit is limit (m/s).

        SUMO refuses (at vehicle.add, before a per-vehicle speed factor can be set) a departure above
        limit * the type's speed factor, so a vehicle faster than the limit gets its own type whose factor
        lets it keep its speed."""
        if speed <= limit * speed_factor:
            return f"gsim_{vclass}", speed_factor
        factor = max(speed_factor, speed / limit * (1.0 + 1e-6))  # the margin survives rounding in SUMO
        type_id = f"gsim_{vclass}@{veh_id}"
        self._api.vehicletype.copy(f"gsim_{vclass}", type_id)
        self._api.vehicletype.setSpeedFactor(type_id, factor)
        return type_id, factor

    def add_vehicle(self, veh_id: str, route: str = "forward", lane: int = 0, pos_m: float = 0.0,
                    speed_mps: float = 0.0, vclass: str = "passenger") -> None:
        """Add a vehicle whose box centre is pos_m metres along the named route ('forward' or 'opposite') in
        lane ``lane`` (0 = rightmost), departing at the next step with speed_mps (m/s). SUMO delays the
        insertion while it would be unsafe."""
        self._check_id(veh_id)
        length = _check_vclass(vclass).length_m
        n_lanes = self.network.route_lanes(route)
        if isinstance(lane, bool) or not isinstance(lane, (int, np.integer)) or not 0 <= lane < n_lanes:
            raise InputError(f"lane must be an integer in [0, {n_lanes}) on the {route} route, got {lane!r}")
        total = self.network._chain(route, int(lane)).length
        pos = _check_num("pos_m", pos_m, 0.5 * length, total - 0.5 * length)
        speed = _check_num("speed_mps", speed_mps, 0.0, VEHICLE_CLASSES[vclass].max_speed_mps)
        with self._guard("add_vehicle"):
            self._add_on_route(veh_id, route, int(lane), pos, speed, vclass)

    def add_at(self, veh_id: str, x: float, y: float, yaw: float, speed: float, vclass: str = "passenger",
               length_m: float | None = None, width_m: float | None = None) -> None:
        """Hand a log actor to SUMO: add a vehicle with box centre (x, y) world metres, yaw (rad), speed (m/s)
        and box size (class defaults where None). It goes on the route whose direction matches its yaw and is
        placed there at the next step regardless of insertion safety (it is where the actor is)."""
        self._check_id(veh_id)
        vc = _check_vclass(vclass)
        x, y, yaw = (_check_num(n, v) for n, v in (("x", x), ("y", y), ("yaw", yaw)))
        speed = _check_num("speed", speed, 0.0, vc.max_speed_mps)
        length = vc.length_m if length_m is None else _check_num("length_m", length_m, 0.1, 50.0)
        width = vc.width_m if width_m is None else _check_num("width_m", width_m, 0.1, 10.0)
        route = self._route_by_heading(x, y, yaw)
        with self._guard("add_at"):
            limit = min(self.network.speed_limit(e) for e in getattr(self.network, f"{route}_route"))
            type_id, factor = self._type_for(veh_id, vclass, speed, limit, 1.0)
            self._api.vehicle.add(veh_id, self._route_id(route, 0), type_id, depart="now", departSpeed=repr(speed))
            self._api.vehicle.setSpeedFactor(veh_id, factor)
            self._api.vehicle.setLength(veh_id, length)
            self._api.vehicle.setWidth(veh_id, width)
            self._move(veh_id, x, y, yaw, length)

    def _route_by_heading(self, x: float, y: float, yaw: float) -> str:
        net = self.network
        if not net.forward_route:
            raise InputError("the network has no forward route")
        if not net.opposite_route:
            return "forward"
        chain = net._chain("forward", net.ego_lane)
        s = float(net.route_distance([[x, y]])[0])
        a, b = chain.point([max(s - 1.0, 0.0)])[0], chain.point([min(s + 1.0, chain.length)])[0]
        lane_yaw = net.yaw_to_world(math.atan2(b[1] - a[1], b[0] - a[0]))
        return "forward" if math.cos(yaw - lane_yaw) >= 0.0 else "opposite"

    def _ego_rear(self, lane: int) -> tuple[float, float] | None:
        """(route distance of the ego's rear along forward lane ``lane``, ego speed m/s) when the ego is
        nearest to that lane's centre line; None otherwise or without an ego."""
        if self._ego is None:
            return None
        net = self.network
        xy = net.to_sumo([[self._ego["x"], self._ego["y"]]])

        def off_centre(i: int) -> float:
            chain = net._chain("forward", i)
            return float(np.linalg.norm(chain.point(chain.project(xy))[0] - xy[0]))

        if min(range(net.route_lanes("forward")), key=off_centre) != lane:
            return None
        return float(net._chain("forward", lane).project(xy)[0]) - 0.5 * self._ego["length_m"], self._ego["speed"]

    def spawn_density(self, vehicles_per_km_per_lane: float, rng_seed: int,
                      vclass_mix: Mapping[str, float] | None = None,
                      keep_clear_m: tuple[float, float] | None = (-20.0, 20.0),
                      speed_mps: float | None = None) -> list[str]:
        """Insert traffic at random positions on every lane of both carriageways, departing at the next step.

        vehicles_per_km_per_lane: mean density (capped where vehicles would be closer than one second of
        headway); rng_seed: the same seed and inputs give the same vehicles; vclass_mix: class -> weight
        (default 80% passenger, 10% truck, 10% bus); keep_clear_m: (x_min, x_max) forward route distance
        relative to the ego's box centre (metres; negative is behind) kept free of vehicle boxes on both
        carriageways (ignored without an ego; None: no such zone); speed_mps: departure speed (default: near
        the limit; each vehicle gets a speed factor in [0.9, 1.1]). Returns the new vehicle ids.
        """
        density = _check_num("vehicles_per_km_per_lane", vehicles_per_km_per_lane, 0.0, 1000.0)
        if isinstance(rng_seed, bool) or not isinstance(rng_seed, (int, np.integer)):
            raise InputError(f"rng_seed must be an integer, got {rng_seed!r}")
        mix = dict(_DEFAULT_MIX if vclass_mix is None else vclass_mix)
        for name, w in mix.items():
            _check_vclass(name)
            _check_num(f"vclass_mix[{name!r}]", w, 0.0)
        classes = [c for c in mix if mix[c] > 0]
        if not classes:
            raise InputError("vclass_mix needs at least one class with a positive weight")
        probs = np.array([mix[c] for c in classes]) / sum(mix[c] for c in classes)
        zone = None
        if keep_clear_m is not None:
            lo, hi = (_check_num("keep_clear_m", v) for v in keep_clear_m)
            if lo > hi:
                raise InputError(f"keep_clear_m must be (x_min, x_max) with x_min <= x_max, got {keep_clear_m}")
            if self._ego is not None:
                s_ego = float(self.network.route_distance([[self._ego["x"], self._ego["y"]]])[0])
                zone = (s_ego + lo, s_ego + hi)
        speed = None if speed_mps is None else _check_num("speed_mps", speed_mps, 0.0, 100.0)
        rng = np.random.default_rng(int(rng_seed))
        longest = max(VEHICLE_CLASSES[c].length_m for c in classes)
        added: list[str] = []
        net = self.network
        with self._guard("spawn_density"):
            for route in ("forward", "opposite"):
                edges = getattr(net, f"{route}_route")
                if not edges:
                    continue
                limit = min(net.speed_limit(e) for e in edges)
                # One departure speed per route: with equal speeds SUMO's secure gap is one headway, so slots of
                # box + minGap + headway (+1 m) never delay an insertion.
                v_dep = _DEPART_FRACTION * limit if speed is None else speed
                clearance = _MIN_GAP_M + _HEADWAY_S * v_dep + 1.0
                slot = longest + clearance
                for lane in range(net.route_lanes(route)):
                    chain = net._chain(route, lane)
                    behind_ego = self._ego_rear(lane) if route == "forward" else None
                    n_slots = int(chain.length // slot)
                    expected = density * chain.length / 1000.0
                    count = min(n_slots, int(expected) + int(rng.random() < expected - int(expected)))
                    picks = np.sort(rng.choice(n_slots, size=count, replace=False)) if count else np.zeros(0, int)
                    kinds = rng.choice(len(classes), size=count, p=probs)
                    jitter = rng.random(count)
                    factors = rng.uniform(0.9, 1.1, count)
                    cars = []  # (back route distance, length, class, speed factor, departure speed)
                    for k, kind, u, f in zip(picks, kinds, jitter, factors):
                        vclass = classes[int(kind)]
                        length = VEHICLE_CLASSES[vclass].length_m
                        back = k * slot + u * (slot - length - clearance)
                        if zone is not None:
                            s_lo, s_hi = np.sort(net.route_distance(net.to_world(chain.point([back, back + length]))))
                            if s_hi >= zone[0] and s_lo <= zone[1]:
                                continue
                        cars.append([back, length, vclass, float(f), min(v_dep, VEHICLE_CLASSES[vclass].max_speed_mps)])
                    if behind_ego is not None:
                        # vehicles behind the ego depart slow enough to stop behind it, each behind its leader
                        leader_back, leader_speed = behind_ego
                        for car in sorted((c for c in cars if c[0] + c[1] < behind_ego[0]), key=lambda c: -c[0]):
                            gap = leader_back - (car[0] + car[1]) - _MIN_GAP_M - 1.0
                            car[4] = min(car[4], _stop_speed(gap, leader_speed))
                            leader_back, leader_speed = car[0], car[4]
                    for back, length, vclass, f, v in cars:
                        veh_id = f"veh{self._spawned}"
                        self._spawned += 1
                        self._add_on_route(veh_id, route, lane, back + 0.5 * length, v, vclass, f)
                        added.append(veh_id)
        return added

    # -- stepping -----------------------------------------------------------------------------------------
    def step(self) -> list[TrafficVehicle]:
        """Advance SUMO by one step; returns every vehicle except the ego (sorted by id, world frame)."""
        with self._guard("step"):
            self._api.simulationStep()
            self._steps += 1
            self._time_s = float(self._api.simulation.getTime())
            for veh_id in self._api.simulation.getDepartedIDList():
                if veh_id != EGO_ID:
                    self._api.vehicle.subscribe(veh_id, list(_SUBSCRIBED))
            if self._ego is not None and EGO_ID not in self._api.vehicle.getIDList():
                # the ego left the network (it drove off its route's end while not moved): put it back at
                # its last commanded pose so that traffic keeps reacting to it
                self.ego_readds += 1
                self._add_ego_vehicle()
            results = self._api.vehicle.getAllSubscriptionResults()
        return [self._to_world(veh_id, results[veh_id]) for veh_id in sorted(results) if veh_id != EGO_ID]

    def _to_world(self, veh_id: str, values: Mapping[int, Any]) -> TrafficVehicle:
        """SUMO front bumper + navigational angle -> world box centre + yaw."""
        fx, fy = values[_POS][:2]
        length = float(values[_LENGTH])
        yaw_sumo = _yaw_from_nav(float(values[_ANGLE]))
        centre = np.array([[fx - 0.5 * length * math.cos(yaw_sumo), fy - 0.5 * length * math.sin(yaw_sumo)]])
        x, y = self.network.to_world(centre)[0]
        return TrafficVehicle(id=veh_id, vclass=str(values[_VCLASS]), x=float(x), y=float(y),
                              yaw=self.network.yaw_to_world(yaw_sumo), speed_mps=float(values[_SPEED]),
                              accel_mps2=float(values[_ACCEL]), length_m=length, width_m=float(values[_WIDTH]),
                              height_m=float(values[_HEIGHT]))
