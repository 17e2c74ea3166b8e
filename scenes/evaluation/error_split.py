"""Where a view's error comes from, against a synthetic street's exact geometry: which pixels are far field
or sky, road or near structure; which ones the reconstruction put at the wrong depth, and which ones no training
camera ever saw.

Pixels by what the street puts there (`REGIONS`): ``sky``, ``far`` (a surface beyond `FAR_M`), ``road`` (the
ground and the sidewalks nearer than that), ``near`` (everything else); the far field is the sky and ``far``. By the rendered geometry (`GEOMETRY`):
``unseen`` (a surface that no training view saw: outside every training image, or hidden there behind a nearer
surface), ``wrong`` (a seen surface rendered transparent or more than `DEPTH_TOL` off its depth; the sky covered
by an opaque render), ``right`` (the rest). Details that cut across them (`DETAIL`): ``marking`` (the lane
markings and the pixels next to them, where a marking drawn a few centimetres off shows) and ``edge`` (a surface
pixel whose 3x3 neighbourhood holds another surface, or the sky, more than `EDGE_RATIO` times nearer or farther:
an object's silhouette) and ``coarse`` (a seen surface that even the sharpest training view saw at more than
`COARSE` times the view's own pixel footprint: detail the images from the path hold only blurred).
A `Split` sums pixel counts and squared errors per class over views, so that a table gives each class's share of
the pixels, its share of the error and its own PSNR.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence

import numpy as np

from .. import synth
from ..reconstruction.views import in_image

FAR_M = 40.0  # beyond this (or the sky) a pixel is far field: what parallax moves least, and a shell moves most
DEPTH_TOL = 0.05  # relative depth error beyond which a surface is "at the wrong depth"
SEEN_TOL = 0.05  # a point hidden by more than this (relative) behind a training view's depth is unseen there
OPAQUE = 0.5  # rendered alpha from which a pixel counts as covered by surfels
REGIONS = ("sky", "far", "road", "near")
GEOMETRY = ("right", "wrong", "unseen")
DETAIL = ("marking", "edge", "coarse")
EDGE_RATIO = 1.3
COARSE = 2.0  # a seen surface is "coarse" where its sharpest training view's pixel covers this many times the side
# of the view's own pixel there


@dataclass(frozen=True, eq=False)
class Coverage:
    """The training views of a synthetic log: for each, its camera, pose, time and exact depth map (grown to
    the largest depth of its 3x3 neighbourhood, so that a surface seen at a grazing angle is not lost between
    two pixel centres)."""

    street: object
    views: list  # [(camera, T_world_camera (4,4), timestamp_us, depth (H,W) max-pooled, 0 -> inf)]

    @staticmethod
    def of(log, street, frames) -> "Coverage":
        from scipy.ndimage import maximum_filter
        views = []
        for f in frames:
            for obs in f.cameras.values():
                d = log.depth(obs)
                if d is None:
                    continue
                d = np.where(d > 0, d, np.inf)
                views.append((log.cameras[obs.sensor].camera, log.T_world_camera(obs), obs.timestamp_us,
                              maximum_filter(d, 3, mode="nearest")))
        return Coverage(street, views)

    def coarseness(self, hits: "synth.Hits", camera, T_world_camera: np.ndarray, timestamp_us: int) -> np.ndarray:
        """(N,) for each of a view's hits (`synth.camera_hits` of ``camera`` at ``T_world_camera`` and
        ``timestamp_us``): the side of the pixel footprint on its surface in the sharpest training view that saw it,
        over the view's own (`footprint`); inf where no training view saw it, and for the sky. A car's point moves
        with the car (cars drive straight: its normal is the same at every time)."""
        st = self.street
        surface = hits.prim >= 0
        car = np.where(hits.prim >= len(st.kinds), (hits.prim - len(st.kinds)) // 2, -1)
        static = np.nonzero(surface & (car < 0))[0]
        moving = np.nonzero(car >= 0)[0]
        idx = np.concatenate([static, moving])
        normal, fixed, local = hits.normal[idx], hits.local[static], hits.local[moving]

        def placed(t):  # the points at time t, in idx's order
            if not len(moving):
                return fixed
            Twc = st.car_poses([t])[0][car[moving]]  # (M,4,4) each point's car at that time
            return np.concatenate([fixed, np.einsum("mij,mj->mi", Twc[:, :3, :3], local) + Twc[:, :3, 3]])
        sharpest = np.full(len(idx), np.inf)
        for cam, T, t, depth in self.views:
            pw = placed(t)
            uv, ok, pc = in_image(cam, T, pw)
            u, v = uv[ok, 0].astype(np.int64), uv[ok, 1].astype(np.int64)
            sees = np.zeros(len(idx), bool)
            sees[ok] = pc[ok, 2] <= depth[v, u] * (1 + SEEN_TOL)
            sharpest[sees] = np.minimum(sharpest[sees], footprint(cam, T, pw[sees], normal[sees]))
        out = np.full(len(hits.prim), np.inf)
        out[idx] = sharpest / footprint(camera, T_world_camera, placed(timestamp_us), normal)
        return out


def footprint(camera, T_world_camera: np.ndarray, world: np.ndarray, normal: np.ndarray) -> np.ndarray:
    """(N,) the side (m) of one pixel's footprint on the surface at each world point (unit normals): range over
    focal length, stretched by 1 / sqrt(cos) of the incidence (a pixel's area on a surface seen at a grazing angle
    grows as 1 / cos)."""
    ray = world - T_world_camera[:3, 3]
    r = np.linalg.norm(ray, axis=1)
    cos = np.abs(np.einsum("ij,ij->i", ray, normal)) / np.maximum(r, 1e-9)
    return r / (np.sqrt(camera.fx * camera.fy) * np.sqrt(np.maximum(cos, 1e-3)))


@dataclass
class Split:
    """Pixel counts and squared errors (mean over RGB, images in [0,1]) per region and geometry class, summed
    over the views `add` was given; depth errors over the views' surface pixels."""

    pixels: Dict[str, int] = field(default_factory=lambda: {k: 0 for k in REGIONS + GEOMETRY + DETAIL})
    sse: Dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in REGIONS + GEOMETRY + DETAIL})
    absrel: list = field(default_factory=list)
    within: list = field(default_factory=list)

    def add(self, rgb: np.ndarray, alpha: np.ndarray, depth: np.ndarray, truth: np.ndarray, hits: "synth.Hits",
            coarseness: np.ndarray) -> None:
        """One view: the render (rgb (H,W,3), alpha, depth (H,W) camera z), the exact image and the street's
        pixel-centre hits there (`synth.camera_hits`), and how sharply a training view saw them
        (`Coverage.coarseness`; inf: none did)."""
        err = ((rgb.astype(np.float64) - truth) ** 2).mean(-1).reshape(-1)
        a, d = alpha.reshape(-1), depth.reshape(-1).astype(np.float64)
        sky = hits.prim < 0
        z = np.where(sky, 1.0, hits.t)  # (the sky's depth is never read)
        road = (hits.material == synth.GROUND) | (hits.material == synth.SIDEWALK)
        far = sky | (z > FAR_M)
        region = {"sky": sky, "far": far & ~sky, "road": road & ~far, "near": ~road & ~far}
        rel = np.where(sky, 0.0, np.abs(d - z) / z)
        off = np.where(sky, a >= OPAQUE, (a < OPAQUE) | (rel > DEPTH_TOL))
        seen = np.isfinite(coarseness)
        unseen = ~sky & ~seen
        geometry = {"right": ~off & ~unseen, "wrong": off & ~unseen, "unseen": unseen}
        details = {**_details(hits, truth.shape[:2]), "coarse": seen & (coarseness > COARSE)}
        for k, m in {**region, **geometry, **details}.items():
            self.pixels[k] += int(m.sum())
            self.sse[k] += float(err[m].sum())
        if (~sky).any():
            self.absrel.append(float(rel[~sky].mean()))
            self.within.append(float((rel[~sky] <= DEPTH_TOL).mean()))

    def summary(self) -> dict:
        """{class: {pixel_share, error_share, psnr}} and the depth's mean AbsRel and share within `DEPTH_TOL`."""
        n, e = sum(self.pixels[k] for k in REGIONS), sum(self.sse[k] for k in REGIONS)
        out = {"depth_absrel": _mean(self.absrel), "depth_within_5pct": _mean(self.within)}
        for group, keys in (("regions", REGIONS), ("geometry", GEOMETRY), ("detail", DETAIL)):
            out[group] = {k: {"pixel_share": self.pixels[k] / max(n, 1), "error_share": self.sse[k] / max(e, 1e-30),
                              "psnr": _psnr(self.sse[k], self.pixels[k])} for k in keys}
        return out


def _details(hits: "synth.Hits", shape) -> Dict[str, np.ndarray]:
    """{marking, edge}: (H*W,) masks of a view's pixel-centre ``hits`` (`DETAIL`)."""
    from scipy.ndimage import maximum_filter, minimum_filter
    painted = (hits.material == synth.GROUND) & synth.lane_marking(hits.local[:, 0], hits.local[:, 1])
    road = (hits.material == synth.GROUND) | (hits.material == synth.SIDEWALK)
    near_paint = maximum_filter(painted.reshape(shape), 3).reshape(-1) & road
    z = np.where(hits.prim >= 0, hits.t, 1e6).reshape(shape)  # the sky as a far surface: a roofline is an edge
    prim = hits.prim.reshape(shape)
    edge = ((maximum_filter(prim, 3) != minimum_filter(prim, 3))  # (the road at a grazing angle is no edge)
            & (maximum_filter(z, 3) > EDGE_RATIO * minimum_filter(z, 3))).reshape(-1) & (hits.prim >= 0)
    return {"marking": near_paint, "edge": edge}


def _mean(x: Sequence[float]) -> float:
    return float(np.mean(x)) if len(x) else float("nan")


def _psnr(sse: float, n: int) -> Optional[float]:
    """None for a class without pixels (JSON has no NaN that equals itself); inf for an exact one."""
    return None if not n else float(10 * np.log10(n / sse)) if sse > 0 else float("inf")
