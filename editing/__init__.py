"""gsim.editing: the Gaussian asset library and scene edits.

- `AssetLibrary.builtin()` (the starter set made by code) and `AssetLibrary(path)` (a directory);
  `library.get(asset_id)` gives an `Asset` (surfels in its box frame, category, size, reflectance).
- Assets from outside: `asset_from_actor` (a reconstructed scene's actor), `asset_from_mesh`
  (trimesh), `asset_from_ply` (3DGS/2DGS).
- Edits, each ``Scene -> Scene``: `insert_actor`, `remove_actor`, `move_actor`; scenario files
  (`gsim.editing.scenario`) list them, `gsim.editing.world` applies them, `gsim.editing.outputs` renders.

The names load on first use (pydantic, of the editing extra, with them), so `gsim.editing.cli` and
`gsim --help` work without the extra.
"""
import importlib

_FROM = {"EditError": ".edits", "insert_actor": ".edits", "move_actor": ".edits", "remove_actor": ".edits",
         "Asset": ".library", "AssetLibrary": ".library",
         "asset_from_actor": ".sources", "asset_from_mesh": ".sources", "asset_from_ply": ".sources"}
__all__ = list(_FROM)


def __getattr__(name: str):
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_FROM[name], __name__), name)
