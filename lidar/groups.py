"""The surfels a LiDAR kernel traces, each in its group's frame (the world, or an actor's box frame with its track):
`SurfelGroups`, built once per surfel set and cached, on the host or (lidar.kernel_cuda) on a GPU."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Tuple

import numpy as np

from gsim.errors import InputError


@dataclass(frozen=True, eq=False)
class SurfelGroups:
    """Surfels each in its group's frame, ready for the kernel: group 0 the world, group g >= 1 an actor
    (box frame) with its track. rec (N, kernel.N_REC) float32, quats (N,4), scales (N,2), features (N,F) float32,
    group (N,) int64, radius (G,) m: how far the group's surfels reach from its origin. numpy arrays (`build`),
    or tensors on a GPU for the cuda backend alone (lidar.kernel_cuda.device_groups: no quats)."""

    rec: np.ndarray
    quats: np.ndarray
    scales: np.ndarray
    features: np.ndarray
    group: np.ndarray
    tracks: Tuple[Tuple[np.ndarray, np.ndarray], ...]  # per actor: (timestamps_us, T_world_actor)
    radius: np.ndarray
    cache: dict = field(default_factory=dict, repr=False)  # derived arrays; `replace` shares it (same surfels)

    @staticmethod
    def build(means, quats, scales, opacities, features, group, tracks) -> "SurfelGroups":
        """From numpy arrays (activated values; features (N,F) or None) with each surfel's group (N,) (0: the
        world, g: the frame of actor g - 1) and the actors' tracks."""
        from .kernel import N_REC, surfel_records
        c = lambda x, dt=np.float64: np.ascontiguousarray(x, dt)
        n = len(means)
        rec = np.empty((n, N_REC), np.float32)
        surfel_records(c(means), c(quats), c(scales), c(opacities), rec)
        group = c(group, np.int64)
        radius = np.zeros(1 + len(tracks))  # the world's is not needed: its frame does not move
        act = np.nonzero(group > 0)[0]
        np.maximum.at(radius, group[act], np.linalg.norm(means[act], axis=1) + 3.5 * scales[act].max(1))
        feats = c(features, np.float32) if features is not None else np.zeros((n, 0), np.float32)
        return SurfelGroups(rec, c(quats), c(scales, np.float32), feats, group, tuple(tracks), radius)

    @property
    def disk(self) -> np.ndarray:
        """(N, sweep.N_DISK) float32: each surfel's cutoff disc, for lidar.sweep (computed once per surfel set)."""
        if "disk" not in self.cache:
            from .sweep import N_DISK, surfel_disks
            disk = np.empty((len(self.rec), N_DISK), np.float32)
            surfel_disks(self.rec, self.scales, disk)
            self.cache["disk"] = disk
        return self.cache["disk"]


def surfel_groups(scene_or_surfels) -> SurfelGroups:
    """The surfel groups of a Scene (the actors' current tracks) or of world-frame Surfels."""
    from gsim.scene import Scene
    from gsim.surfels import Surfels
    if isinstance(scene_or_surfels, Surfels):
        return _geometry(((scene_or_surfels, 0),))
    if not isinstance(scene_or_surfels, Scene):
        raise TypeError(f"render_lidar: expected a Scene or Surfels, got {type(scene_or_surfels).__name__}")
    s = scene_or_surfels
    geometry = _geometry(((s.background, 0),) + tuple((a.surfels, a.shadow_surfels) for a in s.actors))
    return replace(geometry, tracks=tuple((a.track_timestamps_us, a.track_poses) for a in s.actors))


@functools.lru_cache(maxsize=4)
def _geometry(parts) -> SurfelGroups:
    """Per surfel sets ((surfels, shadow count) per group: Surfels hash by identity): a simulator renders many
    sweeps of one scene, whose actors move (a scene with new tracks for the same surfels hits this cache)."""
    from gsim.scene import body_surfels
    bodies = [body_surfels(p, k).numpy() for p, k in parts]  # shadows are no geometry
    if len({None if p.features is None else p.features.shape[1] for p in bodies}) > 1:
        raise InputError("render_lidar: the background and actors must all have features of one width, or none")
    cat = lambda k: np.concatenate([getattr(p, k) for p in bodies])
    return SurfelGroups.build(cat("means"), cat("quats"), cat("scales"), cat("opacities"),
                              None if bodies[0].features is None else cat("features"),
                              np.concatenate([np.full(len(p), g) for g, p in enumerate(bodies)]),
                              [None] * (len(bodies) - 1))
