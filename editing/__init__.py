"""gsim.editing: the Gaussian asset library and scene edits.

- `AssetLibrary.builtin()` (the starter set made by code) and `AssetLibrary(path)` (a directory);
  `library.get(asset_id)` gives an `Asset` (surfels in its box frame, category, size, reflectance).
- Assets from outside: `asset_from_actor` (a reconstructed scene's actor), `asset_from_mesh`
  (trimesh), `asset_from_ply` (3DGS/2DGS).
- Edits, each ``Scene -> Scene``: `insert_actor`, `remove_actor`, `move_actor`; scenario files
  (`gsim.editing.scenario`) list them, `gsim.editing.world` applies them, `gsim.editing.outputs` renders.
"""
from .edits import EditError, insert_actor, move_actor, remove_actor
from .library import Asset, AssetLibrary
from .sources import asset_from_actor, asset_from_mesh, asset_from_ply

__all__ = ["Asset", "AssetLibrary", "EditError", "insert_actor", "move_actor", "remove_actor", "asset_from_actor",
           "asset_from_mesh", "asset_from_ply"]
