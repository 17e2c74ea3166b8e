"""Meshes to surfels: a triangle mesh's surface sampled into flat Gaussians (trimesh reads the files).

Each surfel lies on the face it was sampled from (its normal is the face normal), is round with a
standard deviation of ``scale_factor`` x the sampling spacing (neighbours overlap, so the surface
renders closed), and takes the mesh's colour at its point: texture (through the UVs), vertex colours
(interpolated) or face colours. A rendered surfel's depth is the face's depth where it covers the
face, so an asset's depth map matches a ray cast of its mesh up to the overhang at its edges.
"""
from __future__ import annotations

from pathlib import Path
from typing import Tuple

import numpy as np

from gsim.errors import InputError
from gsim.surfels import Surfels, rgb_to_sh
from gsim.transforms import rotmat_to_quat

DEFAULT_RGB = 0.6  # an uncoloured mesh is light grey


def load_mesh(path) -> "trimesh.Trimesh":
    """One triangle mesh from an OBJ/GLB/GLTF/PLY/STL/OFF file (a scene's meshes are merged, with
    their transforms); a clear error for a file that is missing, unreadable or has no triangles."""
    import trimesh
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: mesh file not found")
    try:
        mesh = trimesh.load(path, force="mesh", process=False)
    except Exception as e:  # trimesh raises many types for malformed files
        raise InputError(f"{path}: not a readable mesh ({type(e).__name__}: {e})") from None
    if not isinstance(mesh, trimesh.Trimesh) or len(mesh.faces) == 0:
        raise InputError(f"{path}: no triangles in the file (expected a surface mesh)")
    if not np.all(np.isfinite(mesh.vertices)):
        raise InputError(f"{path}: vertices hold NaN or infinite coordinates")
    area = float(mesh.area)
    if not area > 0:
        raise InputError(f"{path}: the faces have no area (degenerate mesh)")
    return mesh


def _colours(mesh, faces: np.ndarray, bary: np.ndarray) -> np.ndarray:
    """(N,3) RGB in [0,1] at the samples (face index, barycentric weights) from the mesh's visual."""
    import trimesh
    vis = mesh.visual
    if isinstance(vis, trimesh.visual.TextureVisuals):
        img = getattr(vis.material, "image", None) if vis.material is not None else None
        if vis.uv is not None and img is not None:
            uv = np.einsum("nk,nkd->nd", bary, vis.uv[mesh.faces[faces]])
            return trimesh.visual.color.uv_to_color(uv, img)[:, :3] / 255.0
        main = getattr(vis.material, "main_color", None) if vis.material is not None else None
        if main is not None:
            return np.broadcast_to(np.asarray(main[:3], float) / 255.0, (len(faces), 3)).copy()
    elif isinstance(vis, trimesh.visual.ColorVisuals) and vis.defined:
        if vis.kind == "vertex":
            c = vis.vertex_colors[:, :3].astype(float) / 255.0
            return np.einsum("nk,nkd->nd", bary, c[mesh.faces[faces]])
        return vis.face_colors[faces, :3].astype(float) / 255.0
    return np.full((len(faces), 3), DEFAULT_RGB)


def sample_mesh(mesh, spacing_m: float, seed: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Points on the surface about ``spacing_m`` apart (area-weighted, jittered on a per-face grid of
    samples), with their face normals and colours: (N,3) points, (N,3) unit normals, (N,3) RGB."""
    import trimesh
    if not spacing_m > 0:
        raise InputError(f"sample_mesh: spacing_m must be > 0, got {spacing_m}")
    count = int(np.ceil(float(mesh.area) / spacing_m ** 2))
    if count > 5_000_000:
        raise InputError(f"sample_mesh: {count} surfels at a {spacing_m} m spacing over {mesh.area:.1f} m^2; "
                         f"choose a larger spacing")
    points, faces, bary = trimesh.sample.sample_surface(mesh, max(count, 1), return_barycentric=True, seed=seed)
    normals = mesh.face_normals[faces]
    return np.asarray(points, float), np.asarray(normals, float), _colours(mesh, faces, np.asarray(bary, float))


def surfels_from_samples(points: np.ndarray, normals: np.ndarray, rgb: np.ndarray, spacing_m: float,
                         opacity: float = 0.95, scale_factor: float = 0.9, seed: int = 0) -> Surfels:
    """Round surfels at ``points`` facing ``normals`` (a random in-plane orientation, so no pattern
    shows), sigma = scale_factor x spacing, the given RGB (SH degree 0)."""
    rng = np.random.default_rng(seed)
    n = normals / np.linalg.norm(normals, axis=1, keepdims=True)
    # any tangent: cross with the axis the normal is least aligned with, then a random turn about n
    helper = np.eye(3)[np.argmin(np.abs(n), axis=1)]
    t = np.cross(n, helper)
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    b = np.cross(n, t)
    th = rng.uniform(0, np.pi, len(n))[:, None]
    x = np.cos(th) * t + np.sin(th) * b
    R = np.stack([x, np.cross(n, x), n], axis=2)
    m = len(points)
    return Surfels(means=points.astype(np.float32), quats=rotmat_to_quat(R).astype(np.float32),
                   scales=np.full((m, 2), scale_factor * spacing_m, np.float32),
                   opacities=np.full(m, opacity, np.float32),
                   colors=rgb_to_sh(np.clip(rgb, 0, 1)).astype(np.float32)[:, None, :])


def is_closed(mesh) -> bool:
    """Whether the mesh bounds volumes with outward faces (watertight, consistent winding, positive volume):
    its surfels' normals then point out, and a renderer may skip those facing away from the camera."""
    m = mesh.copy()
    m.merge_vertices()  # files often repeat a vertex per face; closedness is about shared edges
    return bool(m.is_watertight and m.is_winding_consistent and m.volume > 0)


def mesh_to_surfels(mesh, spacing_m: float = 0.03, seed: int = 0) -> Surfels:
    """The mesh's surface as surfels (see the module docstring)."""
    p, n, c = sample_mesh(mesh, spacing_m, seed)
    return surfels_from_samples(p, n, c, spacing_m, seed=seed)
