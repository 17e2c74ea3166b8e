"""The editing layer's commands: ``gsim library`` (the Gaussian asset library) and ``gsim scenario``.

pydantic, yaml and trimesh (the editing extra) load inside the commands, so --help works without them.
"""
from __future__ import annotations

from pathlib import Path

from gsim.cli_args import add_ros2_bag, camera_backends, int_at_least, positive, ros2_bag
from gsim.errors import InputError, NotFound
from gsim.scenes.log import ACTOR_CATEGORIES as CATEGORIES


def _library(a):
    """The library that list, show and render read (the add actions make theirs)."""
    from .library import AssetLibrary
    if a.library == "builtin":
        return AssetLibrary.builtin()
    if not Path(a.library).exists():
        raise NotFound(f"{a.library}: no such asset library (a directory, or 'builtin' for the built-in one)")
    return AssetLibrary(a.library)


def cmd_library_list(a) -> int:
    lib = _library(a)
    ids = lib.ids()
    print(f"{'built-in library' if lib.is_builtin else lib.path}: {len(ids)} assets")
    for i in ids:
        m = lib.manifest(i)
        print(f"  {i:16s} {m.category:10s} {' x '.join(f'{x:.2f}' for x in m.size)} m  {m.surfels} surfels  "
              f"{m.source.kind}{'  lidar' if m.lidar else ''}")
    return 0


def cmd_library_show(a) -> int:
    print(_library(a).manifest(a.asset).model_dump_json(indent=2))
    return 0


def cmd_library_render(a) -> int:
    from gsim.io import to_uint8, write_png, write_video

    from .render import turntable, view
    asset = _library(a).get(a.asset)
    out = Path(a.out)
    if a.frames == 1:
        write_png(out, to_uint8(view(asset, 35.0, a.width, a.height)))
    else:
        write_video(out, [to_uint8(f) for f in turntable(asset, a.frames, a.width, a.height)], a.fps)
    print(f"wrote {out}")
    return 0


def _add(a, asset) -> int:
    from .library import AssetLibrary
    folder = AssetLibrary(a.library).add(asset, overwrite=a.overwrite)
    print(f"added {asset.id} ({asset.category}, {' x '.join(f'{x:.2f}' for x in asset.size)} m, "
          f"{len(asset.surfels)} surfels) -> {folder}")
    return 0


def cmd_library_add_actor(a) -> int:
    from .sources import asset_from_actor
    return _add(a, asset_from_actor(a.scene, a.actor, a.id, a.license))


def cmd_library_add_mesh(a) -> int:
    from .sources import asset_from_mesh
    return _add(a, asset_from_mesh(a.mesh, a.id, a.category, a.spacing_m, a.up, a.scale, a.license))


def cmd_library_add_ply(a) -> int:
    from .sources import asset_from_ply
    return _add(a, asset_from_ply(a.ply, a.id, a.category, a.up, a.license))


SCENARIO_ACTIONS = ("validate", "apply", "render")  # gsim.bridges.cli adds export-road and export


def cmd_scenario(a) -> int:
    from .scenario import load_scenario
    from .world import apply
    if a.ros2_bag is not None and a.action != "render":
        raise InputError(f"--ros2-bag is for gsim scenario render, not {a.action}")
    if a.action not in SCENARIO_ACTIONS:  # export-road, export: added by gsim.bridges.cli
        return a.bridged(a)
    if getattr(a, "target", None) is not None:
        raise InputError(f"{a.target}: a second argument is only for export-road, export and import (what to write)")
    sc = a.load_scenario(a) if a.load_scenario else load_scenario(a.file)  # (gsim.bridges.cli's reads .xosc too)
    if a.action == "validate":
        print(f"{a.file}: valid scenario '{sc.name}': {len(sc.edits)} edits on {sc.scene}")
        if not a.check:
            return 0
    world = apply(sc)
    if a.action == "validate":
        print(f"  applied: {len(world.scene.actors)} actors, {len(world.frames)} frames to render, no overlaps")
    elif a.action == "apply":
        out = Path(a.out) if a.out else Path(sc.output) / "scene"
        world.scene.save(out)
        print(f"wrote the edited scene {out} ({len(world.scene.actors)} actors)")
    else:
        from .outputs import render_world
        harmonizer = a.open_harmonizer(a) if a.open_harmonizer else None  # set by gsim.diffusion.cli
        if a.out:
            sc = sc.model_copy(update={"output": str(Path(a.out).resolve())})
        out = render_world(world, sc, backend=a.backend, harmonizer=harmonizer, ros2_bag=ros2_bag(a))
        extra = ", render/ (before harmonization)" if harmonizer else ""
        print(f"wrote {out}: log/, scene/, labels/, masks/, kitti/, video/{extra} ({len(world.frames)} frames)")
    return 0


def register(sub) -> None:
    scn = sub.add_parser("scenario", help="scenario files: validate, apply (the edited scene), render (images, "
                                          "LiDAR, a new log, labels)")
    scn.add_argument("action", choices=list(SCENARIO_ACTIONS))
    scn.add_argument("file", help="the scenario YAML")
    scn.add_argument("--check", action="store_true", help="validate: also load the scene and apply the edits")
    scn.add_argument("--out", default=None, help="apply: the scene directory to write (default OUTPUT/scene); render: "
                                                  "the folder to render into (default the scenario's output)")
    scn.add_argument("--backend", default="auto", choices=camera_backends())
    add_ros2_bag(scn)  # render
    scn.set_defaults(fn=cmd_scenario, open_harmonizer=None, load_scenario=None)

    lb = sub.add_parser("library", help="the Gaussian asset library: list, show, render, add assets")
    lsub = lb.add_subparsers(dest="library_command", required=True, metavar="ACTION")
    ll = lsub.add_parser("list", help="the assets of a library")
    ll.add_argument("library", nargs="?", default="builtin", help="a library directory, or 'builtin' (default)")
    ll.set_defaults(fn=cmd_library_list)
    ls = lsub.add_parser("show", help="an asset's manifest")
    ls.add_argument("asset")
    ls.add_argument("library", nargs="?", default="builtin")
    ls.set_defaults(fn=cmd_library_show)
    lr = lsub.add_parser("render", help="a picture (.png, --frames 1) or a turntable video (.mp4) of an asset")
    lr.add_argument("asset")
    lr.add_argument("out")
    lr.add_argument("--library", default="builtin")
    lr.add_argument("--frames", type=int_at_least(1), default=36)
    lr.add_argument("--fps", type=positive, default=12.0)
    lr.add_argument("--width", type=int_at_least(16), default=320)
    lr.add_argument("--height", type=int_at_least(16), default=240)
    lr.set_defaults(fn=cmd_library_render)
    for name, fn, what in (("add-actor", cmd_library_add_actor, "a reconstructed scene's actor"),
                           ("add-mesh", cmd_library_add_mesh, "a mesh file (OBJ/GLB/PLY/STL) through trimesh"),
                           ("add-ply", cmd_library_add_ply, "a 3DGS/2DGS .ply object")):
        la = lsub.add_parser(name, help=f"add {what} to a library directory")
        if name == "add-actor":
            la.add_argument("scene")
            la.add_argument("actor")
        else:
            la.add_argument(name.split("-")[1])
        la.add_argument("library", help="the library directory (created if missing)")
        la.add_argument("--id", default=None, required=name != "add-actor",
                        help="the asset's id" + (" (default: the actor's)" if name == "add-actor" else ""))
        if name != "add-actor":
            la.add_argument("--category", required=True, choices=CATEGORIES)
            la.add_argument("--up", default="z", choices=["z", "y", "-y"], help="the file's up axis (glTF: y)")
        if name == "add-mesh":
            la.add_argument("--spacing-m", type=positive, default=0.03, help="surfel spacing on the surface")
            la.add_argument("--scale", type=positive, default=1.0,
                            help="multiply coordinates by this to get metres")
        la.add_argument("--license", default="unknown")
        la.add_argument("--overwrite", action="store_true")
        la.set_defaults(fn=fn)
