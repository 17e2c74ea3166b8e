"""Assets from the three outside sources: a reconstructed scene's actor, a mesh file, a 3DGS/2DGS PLY."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from gsim.errors import InputError, NotFound, check_name
from gsim.scene import load_scene
from gsim.surfels import Surfels

from .library import CATEGORIES, Asset, Source, box_frame
from .mesh import is_closed, load_mesh, mesh_to_surfels

# a file's up axis -> the rotation that makes it z (glTF and many OBJ exports are y-up)
_UP = {"z": np.eye(3), "y": np.array([[1.0, 0, 0], [0, 0, -1], [0, 1, 0]]),
       "-y": np.array([[1.0, 0, 0], [0, 0, 1], [0, -1, 0]])}


def _category(category: str, where: str) -> str:
    if category not in CATEGORIES:
        raise InputError(f"{where}: category {category!r} is not one of {list(CATEGORIES)}")
    return category


def _orient(up: str, where: str) -> np.ndarray:
    if up not in _UP:
        raise InputError(f"{where}: up axis {up!r} is not one of {list(_UP)}")
    T = np.eye(4)
    T[:3, :3] = _UP[up]
    return T


def asset_from_mesh(path, asset_id: str, category: str, spacing_m: float = 0.03, up: str = "z", scale: float = 1.0,
                    license: str = "unknown") -> Asset:
    """A mesh file (OBJ/GLB/PLY/..., with texture, vertex or face colours) as surfels ``spacing_m`` apart,
    turned so that ``up`` is z and scaled by ``scale`` (to metres), in its box frame. It has no LiDAR
    reflectance (insertion uses a default)."""
    check_name(asset_id, "asset id")
    _category(category, str(path))
    if not scale > 0:
        raise InputError(f"{path}: scale must be > 0, got {scale}")
    mesh = load_mesh(path)
    T = _orient(up, str(path))
    T[:3, :3] *= scale
    mesh.apply_transform(T)
    surfels, size = box_frame(mesh_to_surfels(mesh, spacing_m))
    return Asset(asset_id, category, size, surfels, Source(kind="mesh", detail=str(Path(path).resolve())), license,
                 closed=is_closed(mesh))


def asset_from_ply(path, asset_id: str, category: str, up: str = "z", license: str = "unknown") -> Asset:
    """A 3DGS/2DGS PLY object (gsim.ply reads both layouts) in its box frame."""
    from gsim.ply import load_ply
    check_name(asset_id, "asset id")
    _category(category, str(path))
    s = load_ply(path)
    if len(s) == 0:
        raise InputError(f"{path}: the PLY holds no Gaussians")
    s = s.transformed(_orient(up, str(path)))
    surfels, size = box_frame(s)
    return Asset(asset_id, category, size, surfels, Source(kind="ply", detail=str(Path(path).resolve())), license)


def nominal_intensity(head, features: np.ndarray) -> np.ndarray:
    """(N,) intensity a LiDAR head decodes from surfel features at a nominal 15 m and 35 degrees incidence."""
    from gsim.lidar.heads import RANGE_SCALE_M, mlp
    f = np.asarray(features, np.float32)
    x = np.c_[f, np.full(len(f), np.cos(np.radians(35.0))), np.full(len(f), 15.0 / RANGE_SCALE_M)]
    z = mlp(x.astype(np.float32), head.w1, head.b1, head.w2, head.b2)
    return (1.0 / (1.0 + np.exp(-z[:, 0]))).astype(np.float32)


def asset_from_actor(scene_path, actor_id: str, asset_id: Optional[str] = None, license: str = "unknown") -> Asset:
    """A reconstructed scene's actor as an asset: its surfels moved from the box centre to the bottom face,
    its box size, its category ('other' when the library has no such class), and the reflectance its
    LiDAR features decode to in that scene."""
    asset_id = check_name(actor_id if asset_id is None else asset_id, "asset id")
    scene = load_scene(scene_path)
    ids = [a.id for a in scene.actors]
    if actor_id not in ids:
        raise NotFound(f"{scene_path}: no actor {actor_id!r}; the scene has {ids}")
    a = scene.actors[ids.index(actor_id)]
    lift = np.eye(4)
    lift[2, 3] = a.size[2] / 2
    s = a.body.numpy().transformed(lift)  # without an inserted contact shadow
    refl = None if s.features is None or scene.lidar_head is None else nominal_intensity(scene.lidar_head, s.features)
    s = Surfels.derived(s.means, s.quats, s.scales, s.opacities, s.colors)  # features belong to that scene's head
    category = a.category if a.category in CATEGORIES else "other"
    return Asset(asset_id, category, tuple(a.size), s,
                 Source(kind="actor", detail=f"{Path(scene_path).resolve()}:{actor_id}"), license, refl, a.closed)
