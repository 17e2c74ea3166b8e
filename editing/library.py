"""The Gaussian asset library: surfel objects in their own box frames, each with a manifest.

An asset's box frame has x forward, y left, z up and its origin at the centre of the box's bottom
face (where it touches the ground). On disk a library is a directory with one folder per asset::

    <id>/asset.json        the manifest (schema_version, id, category, size, source, license, ...)
    <id>/surfels/*.npy     the surfels (gsim.scene's layout)
    <id>/reflectance.npy   (optional) per-surfel LiDAR reflectance in [0, 1]
    <id>/thumbnail.png

LiDAR: a scene's surfel features are latent codes of that scene's LiDAR head, meaningless in another
scene, so an asset keeps a physical per-surfel reflectance instead; `gsim.editing.insert_actor`
translates it into the target scene's features.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, List, Literal, Optional, Tuple

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from gsim.errors import InputError, NotFound, SceneFormatError, check_name
from gsim.io import atomic_directory, child_path
from gsim.scene import load_array, load_surfels, save_surfels
from gsim.scenes.log import ACTOR_CATEGORIES
from gsim.surfels import Surfels

SCHEMA_VERSION = 1
CATEGORIES = ACTOR_CATEGORIES  # the log's vocabulary
MANIFEST = "asset.json"
THUMBNAIL = "thumbnail.png"


class Source(BaseModel):
    """Where an asset came from: a starter builder, a reconstructed actor, a mesh or a PLY file."""
    model_config = ConfigDict(extra="forbid")
    kind: Literal["builtin", "actor", "mesh", "ply"]
    detail: str = Field(description="builder name; scene path and actor id; or the source file")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    schema_version: Literal[1] = SCHEMA_VERSION
    id: Annotated[str, AfterValidator(lambda v: check_name(v, "asset id"))]  # the asset's folder name
    category: Literal[CATEGORIES]
    size: Tuple[float, float, float] = Field(description="box length, width, height in metres")
    source: Source
    license: str = "unknown"
    lidar: bool = Field(False, description="has a per-surfel reflectance for LiDAR")
    surfels: int = Field(ge=1)
    closed: bool = Field(False, description="the surfels cover closed surfaces with outward normals, so a "
                                            "renderer may skip the ones that face away from the camera")
    thumbnail: Optional[str] = None


def _error_text(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg'].removeprefix('Value error, ')}"
                     for err in e.errors())


@dataclass(frozen=True, eq=False)
class Asset:
    """Surfels in the asset's box frame with what the manifest says about them."""

    id: str
    category: str
    size: Tuple[float, float, float]  # (l, w, h) m
    surfels: Surfels
    source: Source
    license: str = "unknown"
    reflectance: Optional[np.ndarray] = None  # (N,) LiDAR reflectance in [0, 1]
    closed: bool = False  # closed surfaces, normals outward (see Manifest.closed)

    def __post_init__(self):
        check_name(self.id, "asset id")
        try:
            m = self.manifest()
        except ValidationError as e:
            raise InputError(f"asset {self.id!r}: {_error_text(e)}") from None
        if any(not (x > 0) for x in m.size):
            raise InputError(f"asset {self.id!r}: size must be three lengths > 0 m, got {self.size}")
        object.__setattr__(self, "size", tuple(float(x) for x in m.size))
        if self.reflectance is not None:
            r = np.asarray(self.reflectance, np.float32)
            if r.shape != (len(self.surfels),) or not np.all((r >= 0) & (r <= 1)):
                raise InputError(f"asset {self.id!r}: reflectance must be ({len(self.surfels)},) values in [0, 1]")
            object.__setattr__(self, "reflectance", r)

    def manifest(self, thumbnail: Optional[str] = None) -> Manifest:
        return Manifest(id=self.id, category=self.category, size=tuple(self.size), source=self.source,
                        license=self.license, lidar=self.reflectance is not None, surfels=len(self.surfels),
                        closed=self.closed, thumbnail=thumbnail)


def box_frame(surfels: Surfels) -> Tuple[Surfels, Tuple[float, float, float]]:
    """Surfels moved into their box frame (x-y centre of their bounds at the origin, lowest point at z = 0)
    and the box size (l, w, h): the extent of the surfel centres."""
    s = surfels.numpy()
    lo, hi = s.means.min(0).astype(float), s.means.max(0).astype(float)
    T = np.eye(4)
    T[:3, 3] = (-(lo[0] + hi[0]) / 2, -(lo[1] + hi[1]) / 2, -lo[2])
    return s.transformed(T), tuple(float(x) for x in hi - lo)


def save_asset(asset: Asset, folder, thumbnail: Optional[np.ndarray] = None) -> None:
    """Write an asset folder atomically (replacing an asset folder already there)."""
    from gsim.io import to_uint8, write_png
    with atomic_directory(folder, MANIFEST) as tmp:
        save_surfels(asset.surfels, tmp / "surfels")
        if asset.reflectance is not None:
            np.save(tmp / "reflectance.npy", asset.reflectance)
        if thumbnail is not None:
            write_png(tmp / THUMBNAIL, to_uint8(thumbnail))
        m = asset.manifest(THUMBNAIL if thumbnail is not None else None)
        (tmp / MANIFEST).write_text(m.model_dump_json(indent=2))


def _read_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST
    if not path.is_file():
        raise SceneFormatError(f"{folder}: not an asset folder (no {MANIFEST})")
    try:
        m = Manifest.model_validate_json(path.read_text())
    except ValidationError as e:
        raise SceneFormatError(f"{path}: {_error_text(e)}") from None
    if m.id != folder.name:
        raise SceneFormatError(f"{path}: field 'id' is {m.id!r} but the folder is {folder.name!r}")
    return m


def load_asset(folder) -> Asset:
    folder = Path(folder)
    m = _read_manifest(folder)
    path = folder / MANIFEST
    surfels = load_surfels(folder / "surfels")
    refl = None
    if m.lidar:
        refl = load_array(folder / "reflectance.npy")
    try:
        return Asset(m.id, m.category, m.size, surfels, m.source, m.license, refl, m.closed)
    except ValueError as e:
        raise SceneFormatError(f"{path}: {e}") from None


class AssetLibrary:
    """A directory of assets (``AssetLibrary(path)``) or the built-in starter set
    (``AssetLibrary.builtin()``, made by code on first use, read-only)."""

    def __init__(self, path=None):
        self.path = None if path is None else Path(path)
        if self.path is not None and self.path.exists() and not self.path.is_dir():
            raise NotADirectoryError(f"{self.path}: an asset library is a directory")

    @staticmethod
    def builtin() -> "AssetLibrary":
        return AssetLibrary(None)

    @property
    def is_builtin(self) -> bool:
        return self.path is None

    def ids(self) -> List[str]:
        if self.is_builtin:
            from .starter import STARTER
            return list(STARTER)
        if not self.path.is_dir():
            return []
        return sorted(p.name for p in self.path.iterdir() if (p / MANIFEST).is_file())

    def __contains__(self, asset_id: str) -> bool:
        return asset_id in self.ids()

    def get(self, asset_id: str) -> Asset:
        if asset_id not in self.ids():
            where = "the built-in library" if self.is_builtin else str(self.path)
            raise NotFound(f"unknown asset {asset_id!r} in {where}; it has {self.ids()}")
        if self.is_builtin:
            return _builtin_asset(asset_id)
        return load_asset(child_path(self.path, asset_id, "asset id"))

    def manifest(self, asset_id: str) -> Manifest:
        """An asset's manifest (a directory library's is read without its surfels)."""
        if self.is_builtin or asset_id not in self.ids():
            return self.get(asset_id).manifest()
        return _read_manifest(child_path(self.path, asset_id, "asset id"))

    def add(self, asset: Asset, overwrite: bool = False) -> Path:
        """Write ``asset`` (with a rendered thumbnail) into this library; returns its folder."""
        if self.is_builtin:
            raise PermissionError("the built-in library is read-only; give a library directory")
        folder = child_path(self.path, asset.id, "asset id")
        if folder.exists() and not overwrite:
            raise FileExistsError(f"{folder}: asset {asset.id!r} exists (overwrite to replace it)")
        from .render import thumbnail
        save_asset(asset, folder, thumbnail(asset))
        return folder


@functools.lru_cache(maxsize=None)
def _builtin_asset(asset_id: str) -> Asset:
    from .starter import build
    category, surfels, _, refl = build(asset_id)
    surfels, size = box_frame(surfels)
    return Asset(asset_id, category, size, surfels, Source(kind="builtin", detail=f"gsim.editing.starter:{asset_id}"),
                 "Apache-2.0 (made by gsim's code)", refl, closed=True)  # unions of closed convex parts
