"""An OpenDRIVE road's lanes as world polylines: where a `LanePosition` lies, which lane a point is on, and the lanes
that carry on from a lane's end (what the storyboard's vehicles follow).

Read: each road's plan view (``line``, ``arc``, ``spiral``, ``poly3``, ``paramPoly3``), its ``laneOffset`` records and
its lane sections' driving lanes with their ``width`` polynomials, sampled every SAMPLE_M metres of the reference line.
Lanes with negative ids run along the road's s, positive ones against it (right-hand traffic, the roads SUMO writes);
vehicles follow the driving lanes (`DRIVING`), a `LanePosition` may name any. Heights are not read: gsim puts everything
on the scene's own ground. A lane given by its ``border`` records, a left-hand-traffic road or a geometry of another
kind is refused with the file and line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from gsim.bridges.closed_loop.road import Polyline
from gsim.errors import InputError

SAMPLE_M = 0.5
JOIN_M = 0.6  # a lane carries on into one that starts this close to its end ...
JOIN_RAD = math.radians(30)  # ... heading this close to its end's heading
MAX_ROAD_M = 10_000.0  # a road longer than this is refused (its samples would not fit)
DRIVING = ("driving", "bidirectional", "entry", "exit", "onRamp", "offRamp", "connectingRamp", "slipLane", "bus",
           "taxi", "HOV")  # the lane types vehicles follow (a LanePosition may name any lane)


@dataclass(frozen=True, eq=False)
class LanePiece:
    """A lane of one lane section: its centre polyline in its direction of travel, its width along it, and the road
    s of its start and end (s_start > s_end for a lane against the road's s)."""
    road: str
    lane: int
    section: int
    centre: Polyline
    widths: np.ndarray  # at the centre polyline's vertices
    road_s: np.ndarray  # the road's s at the centre polyline's vertices (decreasing for a lane against s)
    type: str

    @property
    def s_start(self) -> float:
        return float(self.road_s[0])

    @property
    def s_end(self) -> float:
        return float(self.road_s[-1])

    def width_at(self, u: float) -> float:
        return float(np.interp(u, self.centre.s, self.widths))

    def u_of_s(self, s: float) -> float:
        """Arc length along the centre at the road's s."""
        if self.road_s[-1] >= self.road_s[0]:
            return float(np.interp(s, self.road_s, self.centre.s))
        return float(np.interp(s, self.road_s[::-1], self.centre.s[::-1]))

    def s_of_u(self, u: float) -> float:
        """The road's s at arc length u along the centre."""
        return float(np.interp(u, self.centre.s, self.road_s))


def _float(el, name: str, path: Path, default: Optional[float] = None) -> float:
    v = el.get(name)
    if v is None:
        if default is None:
            raise InputError(f"{path}:{el.sourceline}: <{el.tag}> has no {name}")
        return default
    try:
        x = float(v)
    except ValueError:
        raise InputError(f"{path}:{el.sourceline}: <{el.tag}> {name}={v!r} is not a number") from None
    if not math.isfinite(x):
        raise InputError(f"{path}:{el.sourceline}: <{el.tag}> {name}={v!r} is not finite")
    return x


def _geometry(g, path: Path, ds: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """World x-y (M,2) and heading (M,) at the geometry's own arc lengths ``ds`` (0 .. its length)."""
    x0, y0, h0 = (_float(g, k, path) for k in ("x", "y", "hdg"))
    length = _float(g, "length", path)
    kind = next(iter(g), None)
    if kind is None:
        raise InputError(f"{path}:{g.sourceline}: <geometry> has no shape (line, arc, spiral, poly3, paramPoly3)")
    if kind.tag in ("line", "arc", "spiral"):  # heading from curvature, integrated on a fine grid
        fine = np.linspace(0.0, length, max(int(length / 0.05), 2) + 1)
        if kind.tag == "line":
            k = np.zeros_like(fine)
        elif kind.tag == "arc":
            k = np.full_like(fine, _float(kind, "curvature", path))
        else:
            c0, c1 = _float(kind, "curvStart", path), _float(kind, "curvEnd", path)
            k = c0 + (c1 - c0) * fine / max(length, 1e-9)
        h = h0 + np.r_[0.0, np.cumsum(0.5 * (k[1:] + k[:-1]) * np.diff(fine))]
        x = x0 + np.r_[0.0, np.cumsum(0.5 * (np.cos(h[1:]) + np.cos(h[:-1])) * np.diff(fine))]
        y = y0 + np.r_[0.0, np.cumsum(0.5 * (np.sin(h[1:]) + np.sin(h[:-1])) * np.diff(fine))]
        return np.c_[np.interp(ds, fine, x), np.interp(ds, fine, y)], np.interp(ds, fine, h)
    if kind.tag == "poly3":
        a, b, c, d = (_float(kind, k, path) for k in "abcd")
        p = np.linspace(0.0, length, 400)  # u along the start heading (arc length ~ u for a road)
        u, v = p, a + b * p + c * p ** 2 + d * p ** 3
    elif kind.tag == "paramPoly3":
        cu = [_float(kind, k + "U", path) for k in "abcd"]
        cv = [_float(kind, k + "V", path) for k in "abcd"]
        p = np.linspace(0.0, 1.0 if kind.get("pRange") == "normalized" else length, 400)
        u = cu[0] + cu[1] * p + cu[2] * p ** 2 + cu[3] * p ** 3
        v = cv[0] + cv[1] * p + cv[2] * p ** 2 + cv[3] * p ** 3
    else:
        raise InputError(f"{path}:{kind.sourceline}: <{kind.tag}> geometry is not read (line, arc, spiral, poly3, "
                         f"paramPoly3 are)")
    arc = np.r_[0.0, np.cumsum(np.hypot(np.diff(u), np.diff(v)))]
    arc *= length / max(arc[-1], 1e-9)  # the file's length is the arc length
    c, s = math.cos(h0), math.sin(h0)
    x, y = x0 + c * u - s * v, y0 + s * u + c * v
    h = h0 + np.arctan2(np.gradient(v), np.gradient(u))
    return np.c_[np.interp(ds, arc, x), np.interp(ds, arc, y)], np.interp(ds, arc, np.unwrap(h))


def _poly(records, s: np.ndarray, path: Path, key: str = "s") -> np.ndarray:
    """A piecewise cubic (OpenDRIVE's a + b ds + c ds^2 + d ds^3 records starting at ``key``) at s."""
    out = np.zeros_like(s)
    starts = [_float(r, key, path) for r in records]
    for i, r in enumerate(records):
        a, b, c, d = (_float(r, k, path, 0.0) for k in "abcd")
        hi = starts[i + 1] if i + 1 < len(records) else np.inf
        m = (s >= starts[i]) & (s < hi) if i else (s < hi)
        ds = s[m] - starts[i]
        out[m] = a + b * ds + c * ds ** 2 + d * ds ** 3
    return out


class LaneMap:
    """The lanes of an OpenDRIVE file (see the module docstring)."""

    def __init__(self, pieces: List[LanePiece], path: Path, references: Optional[Dict[str, tuple]] = None):
        self.pieces, self.path = pieces, path
        self.references = references or {}  # road id -> (s (M,), reference line x-y (M,2), heading (M,))
        self.by_key: Dict[Tuple[str, int], List[LanePiece]] = {}
        for p in pieces:
            self.by_key.setdefault((p.road, p.lane), []).append(p)
        ends = np.array([p.centre.xy[-1] for p in pieces]) if pieces else np.zeros((0, 2))
        starts = np.array([p.centre.xy[0] for p in pieces]) if pieces else np.zeros((0, 2))
        self.next: Dict[int, Optional[int]] = {}
        for i, p in enumerate(pieces):
            d = np.linalg.norm(starts - ends[i], axis=1)
            h_end = p.centre.at(p.centre.length)[1][0]
            best = None
            for j in np.argsort(d):
                if d[j] > JOIN_M:
                    break
                h = pieces[j].centre.at(0.0)[1][0]
                if j != i and pieces[j].type in DRIVING and abs(math.remainder(h - h_end, 2 * math.pi)) < JOIN_RAD:
                    best = int(j)
                    break
            self.next[i] = best
        self.prev = {j: i for i, j in self.next.items() if j is not None}  # (against the lanes' direction)

    @staticmethod
    def read(path) -> "LaneMap":
        from lxml import etree
        path = Path(path)
        try:
            tree = etree.parse(str(path), etree.XMLParser(resolve_entities=False, no_network=True))
        except (OSError, etree.XMLSyntaxError) as e:
            raise InputError(f"{path}: not a readable OpenDRIVE file ({e})") from None
        if tree.docinfo.doctype or tree.docinfo.internalDTD is not None:
            raise InputError(f"{path}:1: a DOCTYPE (a DTD, entities) is not read: the file is read as it is written")
        root = tree.getroot()
        if root.tag != "OpenDRIVE":
            raise InputError(f"{path}:{root.sourceline}: expected <OpenDRIVE> at the top, found <{root.tag}>")
        pieces: List[LanePiece] = []
        references: Dict[str, tuple] = {}
        for road in root.iter("road"):
            if road.get("rule", "RHT") != "RHT":
                raise InputError(f"{path}:{road.sourceline}: road {road.get('id')} is left-hand traffic; gsim reads "
                                 f"right-hand traffic roads")
            more, references[road.get("id")] = _road_pieces(road, path)
            pieces += more
        if not pieces:
            raise InputError(f"{path}: no lanes in the file")
        return LaneMap(pieces, path, references)

    def road_point(self, road: str, s: float, t: float, where: str) -> Tuple[float, float, float]:
        """World x, y and the road's heading at its s, ``t`` m to the left of its reference line (a RoadPosition)."""
        if road not in self.references:
            raise InputError(f"{where}: road {road!r} is not in {self.path.name} (roads: "
                             f"{', '.join(sorted(self.references))})")
        ss, xy, hdg = self.references[road]
        if not ss[0] - 1e-6 <= s <= ss[-1] + 1e-6:
            raise InputError(f"{where}: s = {s:g} m is off road {road!r} (0 to {ss[-1]:g} m)")
        h = float(np.interp(s, ss, hdg))
        x, y = float(np.interp(s, ss, xy[:, 0])), float(np.interp(s, ss, xy[:, 1]))
        return x - t * math.sin(h), y + t * math.cos(h), h

    def road_coords(self, road: str, xy) -> Tuple[float, float]:
        """A point's s along road ``road``'s reference line and t to its left."""
        ss, line, _ = self.references[road]
        u, t, _ = Polyline(line, f"road {road}").project(np.asarray(xy, float)[None])
        arc = np.r_[0.0, np.cumsum(np.linalg.norm(np.diff(line, axis=0), axis=1))]
        return float(np.interp(u[0], arc, ss)), float(t[0])

    def find(self, road: str, lane: int, s: float, where: str) -> int:
        """The index of the piece of lane ``lane`` of road ``road`` holding the road's ``s``; InputError (naming
        ``where``) when the road or that lane is not in the file or s is off the road."""
        if not any(r == road for r, _ in self.by_key):
            raise InputError(f"{where}: road {road!r} is not in {self.path.name} (roads: "
                             f"{', '.join(sorted({r for r, _ in self.by_key}))})")
        if (road, lane) not in self.by_key:
            have = sorted(lane_id for r, lane_id in self.by_key if r == road)
            raise InputError(f"{where}: road {road!r} has no lane {lane} (it has {have})")
        for i, p in enumerate(self.pieces):
            lo, hi = sorted((p.s_start, p.s_end))
            if p.road == road and p.lane == lane and lo - 1e-6 <= s <= hi + 1e-6:
                return i
        raise InputError(f"{where}: s = {s:g} m is off lane {lane} of road {road!r}")

    def lane_point(self, road: str, lane: int, s: float, offset: float, where: str) -> Tuple[float, float, float]:
        """World x, y and the lane's heading of travel at road s, ``offset`` m to the left of the lane's centre (in
        its direction of travel; OpenSCENARIO's offset is to the left of the road's s direction: the caller turns
        it)."""
        p = self.pieces[self.find(road, lane, s, where)]
        (xy,), (h,) = p.centre.at(p.u_of_s(s))
        return float(xy[0] - offset * math.sin(h)), float(xy[1] + offset * math.cos(h)), float(h)

    def locate(self, xy, heading: Optional[float] = None) -> Optional[Tuple[int, float, float]]:
        """The driving lane piece a point is on (index, arc length along its centre, lateral offset to the left of its
        centre): the nearest whose corridor holds it, among those heading within 90 degrees of ``heading`` when given;
        None when no driving lane holds it."""
        best = None
        for i, p in enumerate(self.pieces):
            if p.type not in DRIVING:
                continue
            u, t, dist = (v[0] for v in p.centre.project(np.asarray(xy, float)[None]))
            if dist > p.width_at(u) / 2 + 0.05:
                continue
            if heading is not None and abs(math.remainder(p.centre.at(u)[1][0] - heading, 2 * math.pi)) > math.pi / 2:
                continue
            if best is None or dist < best[0]:
                best = (dist, i, float(u), float(t))
        return None if best is None else best[1:]

    def neighbour(self, index: int, steps: int) -> Optional[int]:
        """The piece ``steps`` lanes to the left (negative: right) of piece ``index`` in its direction of travel, in
        the same road and section (lane 0 is no lane: from -1 one step left is +1, the other direction)."""
        p = self.pieces[index]
        lane = p.lane
        delta = 1 if (steps > 0) == (p.lane < 0) else -1  # left of a lane along s is towards higher ids
        for _ in range(abs(steps)):
            lane += delta
            if lane == 0:
                lane += delta
        return next((i for i, q in enumerate(self.pieces) if q.road == p.road and q.section == p.section
                     and q.lane == lane and q.type in DRIVING), None)

    def chain(self, index: int, reverse: bool = False, length_m: float = 100_000.0) -> Polyline:
        """Piece ``index``'s centre and the pieces carrying on from its end, up to ``length_m``, as one polyline;
        ``reverse``: against the lane's direction (a vehicle driving it the other way), through the pieces before it."""
        step, along = (self.prev, lambda xy: xy[::-1]) if reverse else (self.next, lambda xy: xy)
        first = self.pieces[index].centre
        pts, seen, i, total = [along(first.xy)], {index}, step.get(index), first.length
        while i is not None and i not in seen and total < length_m:
            seen.add(i)
            pts.append(along(self.pieces[i].centre.xy)[1:])
            total += self.pieces[i].centre.length
            i = step.get(i)
        return Polyline(np.concatenate(pts), f"lane {self.pieces[index].road}/{self.pieces[index].lane}")


def _lane_id(el, path: Path) -> int:
    try:
        return int(el.get("id"))
    except (TypeError, ValueError):
        raise InputError(f"{path}:{el.sourceline}: <lane> id={el.get('id')!r} is not an integer") from None


def _road_pieces(road, path: Path) -> Tuple[List[LanePiece], tuple]:
    """A road's lane pieces and its reference line (s, x-y, heading)."""
    rid = road.get("id")
    if rid is None:
        raise InputError(f"{path}:{road.sourceline}: <road> has no id")
    length = _float(road, "length", path)
    geoms = road.findall("planView/geometry")
    if not geoms or not 0 < length <= MAX_ROAD_M:
        raise InputError(f"{path}:{road.sourceline}: road {rid}: no plan view, or a length outside (0, {MAX_ROAD_M:g}] "
                         f"m")
    g_s = [_float(g, "s", path) for g in geoms]
    sections = road.findall("lanes/laneSection")
    sec_s = [_float(x, "s", path) for x in sections]
    # (every geometry and section starts at a sample: lanes have no gaps at section starts)
    s = np.unique(np.clip(np.r_[np.arange(0.0, length, SAMPLE_M), length, g_s, sec_s], 0.0, length))
    xy, hdg = np.zeros((len(s), 2)), np.zeros(len(s))
    for i, g in enumerate(geoms):
        hi = g_s[i + 1] if i + 1 < len(geoms) else np.inf
        m = (s >= g_s[i]) & (s < hi) if i + 1 < len(geoms) else s >= g_s[i]
        xy[m], hdg[m] = _geometry(g, path, np.clip(s[m] - g_s[i], 0.0, _float(g, "length", path)))
    normal = np.c_[-np.sin(hdg), np.cos(hdg)]
    offset = _poly(road.findall("lanes/laneOffset"), s, path)
    out = []
    for k, sec in enumerate(sections):
        hi = sec_s[k + 1] if k + 1 < len(sections) else length
        m = (s >= sec_s[k] - 1e-9) & (s <= hi + 1e-9)
        if m.sum() < 2:
            continue
        ss, local = s[m], s[m] - sec_s[k]
        for side, sign in (("right", -1), ("left", 1)):
            lanes = sorted(sec.findall(f"{side}/lane"), key=lambda el: abs(_lane_id(el, path)))
            inner = np.zeros(len(ss))
            for el in lanes:
                if el.find("border") is not None:
                    raise InputError(f"{path}:{el.find('border').sourceline}: lane {el.get('id')} of road {rid} is "
                                     f"given by borders; gsim reads lane widths")
                w = _poly(el.findall("width"), local, path, key="sOffset")
                t = offset[m] + sign * (inner + w / 2)
                inner = inner + w
                lane = _lane_id(el, path)
                order = slice(None) if lane < 0 else slice(None, None, -1)
                c, w, at_s = (xy[m] + t[:, None] * normal[m])[order], w[order], ss[order]
                keep = np.r_[True, np.linalg.norm(np.diff(c, axis=0), axis=1) > 1e-9]  # (as Polyline keeps them)
                if keep.sum() < 2:
                    continue  # a lane of no length (a junction's degenerate connection)
                centre = Polyline(c[keep], f"{path.name} road {rid} lane {lane}")
                out.append(LanePiece(rid, lane, k, centre, w[keep], at_s[keep], el.get("type", "driving")))
    return out, (s, xy, np.unwrap(hdg))
