"""Dataset formats -> gsim driving logs: one module per format, each with its converter and its `gsim convert`
subcommand (``HELP``, ``SRC``, optionally ``OUT``, ``OUT_NARGS`` and ``add_options``); `FORMATS` is the registry
`gsim convert` and `gsim batch` read.
A new format is a module here and a line in `FORMATS`. Converter helpers shared by the formats: `convert_util`."""
from __future__ import annotations

import importlib

from gsim.errors import InputError

# gsim convert's formats, in its help's order: subcommand -> (module here, its converter(src, out, **options) -> log
# path or paths); a module loads when its format is used, or listed by `gsim convert --help`
FORMATS = {"kitti-raw": ("kitti_raw", "convert_kitti_raw"), "dgp": ("dgp", "convert_dgp"),
           "nerfstudio": ("nerfstudio", "import_nerfstudio"), "av2": ("av2", "convert_av2"),
           "kitti-tracking": ("kitti_tracking", "convert_kitti_tracking"),
           "nuscenes": ("nuscenes", "convert_nuscenes"), "waymo": ("waymo", "convert_waymo"),
           "rosbag": ("rosbag", "convert_rosbag")}


def format_module(fmt: str):
    """The module of a `gsim convert` format, imported now (its optional dependencies load only when it converts)."""
    if fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}; gsim convert takes {sorted(FORMATS)}")
    return importlib.import_module(f"{__name__}.{FORMATS[fmt][0]}")


def converter(fmt: str):
    """The converter function of a `gsim convert` format."""
    return getattr(format_module(fmt), FORMATS[fmt][1])
