"""The closed loop's road as ASAM OpenDRIVE (`gsim scenario export-road SCENARIO_OR_SCENE OUT.xodr`): the SUMO network
a closed-loop run of it drives on, written by SUMO's own ``netconvert --opendrive-output``, so that the lanes a file
names and the lanes the loop drives are the same.

What is exported: for a scenario file (or a shipped name), the road of its ``closed_loop.road`` section along its
(edited) ego path, or its own ``road.net``; for a scene or reconstruction directory, gsim's default road (one lane
each way, 3.5 m) along its log's ego path. Frame: gsim's world frame, as the network's (netconvert keeps it: no
offset normalization; the header's offsets are 0) for the roads gsim builds; a scenario's own net keeps its net
frame (its ``T_world_net`` places it in gsim's world). Lane ids: OpenDRIVE's signed ids (negative: the forward
carriageway, right-hand traffic; -1 nearest the centre line), each as wide as the loop's lanes.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from gsim.errors import InputError


def road_network(target: str, workdir: Path):
    """(the SUMO `Network` a closed-loop run of ``target`` drives on, what it is) for a scenario file or shipped name,
    or a scene or reconstruction directory."""
    from .loop import network
    from .scenario import SHIPPED, RoadOptions, ensure_demo, load_loop_scenario
    p = Path(target)
    if str(target) in SHIPPED or p.suffix in (".yaml", ".yml"):
        sc = load_loop_scenario(target)
        if str(target) in SHIPPED:
            ensure_demo(sc)
        from gsim.editing.world import apply
        world = apply(sc, ego_overlaps=True)
        return network(sc.closed_loop.road, world.ego_poses[:, :2, 3], workdir), f"scenario {sc.name}"
    if not p.is_dir():
        raise InputError(f"{target}: not a scenario file (.yaml), a shipped scenario ({', '.join(SHIPPED)}) or a "
                         f"scene or reconstruction directory")
    from gsim.scenes.log import load_log, scene_and_log_dirs
    _, log_dir = scene_and_log_dirs(p)
    if not (log_dir / "log.json").is_file():
        raise InputError(f"{target}: no driving log beside the scene ({log_dir}): the road follows its ego path")
    return network(RoadOptions(), load_log(log_dir).ego_poses[:, :2, 3], workdir), f"the log {log_dir}"


def export_road(target: str, out) -> dict:
    """Writes ``out`` (.xodr, atomically): the road of ``target`` (see the module docstring). Returns what was written:
    {"source", "lanes": forward and opposite lane counts, "lane_width_m"}."""
    from .sumo import run_netconvert
    out = Path(out)
    if out.suffix != ".xodr":
        raise InputError(f"{out}: the OpenDRIVE file to write must end in .xodr")
    with tempfile.TemporaryDirectory(prefix="gsim-road-") as tmp:
        net, what = road_network(target, Path(tmp))
        out.parent.mkdir(parents=True, exist_ok=True)
        run_netconvert(["--sumo-net-file", str(net.path)], out, output="--opendrive-output")
        forward, opposite = net.route_lanes("forward"), (net.route_lanes("opposite") if net.opposite_route else 0)
        width = net.lanes()[0][2]
    return {"source": what, "lanes": (forward, opposite), "lane_width_m": width}
