"""Scenario render speed on a reconstructed log, per camera backend (`gsim scenario render`'s work).

    .venv/bin/python bench/bench_scenario.py SCENE LOG [--backends numba,gsplat] [--every 1] [--out OUT]

A scenario made for the log: a starter sedan leading the ego 12 m ahead along the ego's own path at the ego's
mean speed, and a starter SUV parked 4 m to the right of the ego's start (both placed on the scene's ground,
overlaps with the log's actors allowed: only the time is measured). It is applied once and rendered with each
backend by `gsim.editing.outputs.render_world`: every camera and LiDAR of the log, instance masks, 2D boxes,
KITTI labels, the new log and the videos. Writes OUT/scenario.yaml and OUT/<backend>/, and prints and writes
OUT/scenario_bench.json: per backend the wall time, the frames and the seconds per frame. The LiDAR sweeps
take the `auto` backend whatever the camera backend (as `gsim scenario render` does).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gsim.editing.outputs import render_world  # noqa: E402
from gsim.editing.scenario import load_scenario  # noqa: E402
from gsim.editing.world import apply  # noqa: E402
from gsim.scenes.log import load_log  # noqa: E402

LEAD_M = 12.0


def scenario_for(scene: Path, log_dir: Path, out: Path, every: int) -> dict:
    """The benchmark's scenario (see the module docstring) as a scenario file's content."""
    log = load_log(log_dir)
    xy = log.ego_poses[:, :2, 3]
    keep = np.r_[True, np.linalg.norm(np.diff(xy, axis=0), axis=1) > 0.05]  # no repeated vertices (a stop)
    xy = xy[keep]
    heading = log.ego_poses[-1, :2, 0] / np.linalg.norm(log.ego_poses[-1, :2, 0])
    path = np.r_[xy, xy[-1:] + 60.0 * heading]  # run on past the log's end along its last heading
    s = np.r_[0.0, np.cumsum(np.linalg.norm(np.diff(path, axis=0), axis=1))]
    ahead = s > LEAD_M
    start = [np.interp(LEAD_M, s, path[:, 0]), np.interp(LEAD_M, s, path[:, 1])]
    lead = np.r_[[start], path[ahead]]
    duration_s = (log.ego_timestamps_us[-1] - log.ego_timestamps_us[0]) * 1e-6
    speed = max(float(s[len(xy) - 1]) / max(duration_s, 1e-3), 0.5)  # (a path needs a speed > 0)
    P0 = log.ego_poses[0]
    parked = P0[:2, 3] + 8.0 * P0[:2, 0] - 4.0 * P0[:2, 1]
    yaw = round(float(np.degrees(np.arctan2(P0[1, 0], P0[0, 0]))), 3)
    t0 = int(log.frames[0].timestamp_us)
    return {"schema_version": 1, "name": "bench", "scene": str(scene.resolve()), "log": str(log_dir.resolve()),
            "edits": [{"kind": "insert", "asset": "sedan", "id": "lead_sedan", "allow_overlap": True,
                       "track": {"path": lead.round(3).tolist(), "speed_mps": round(float(speed), 3), "start_us": t0}},
                      {"kind": "insert", "asset": "suv", "id": "parked_suv", "allow_overlap": True,
                       "track": {"poses": [{"t_us": t0, "xyz": [*parked.round(3).tolist(), float(P0[2, 3])],
                                            "yaw_deg": yaw},
                                           {"t_us": int(log.frames[-1].timestamp_us),
                                            "xyz": [*parked.round(3).tolist(), float(P0[2, 3])], "yaw_deg": yaw}]}}],
            "time": {"every": every}, "output": str(out.resolve())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scene")
    ap.add_argument("log")
    ap.add_argument("--backends", default="numba", help="camera backends, comma separated (auto, numba, gsplat)")
    ap.add_argument("--every", type=int, default=1, help="render every N-th frame of the log")
    ap.add_argument("--out", default="out/bench/scenario")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = scenario_for(Path(a.scene), Path(a.log), out / "render", a.every)
    (out / "scenario.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    sc = load_scenario(out / "scenario.yaml")
    world = apply(sc)
    res = {"scene": a.scene, "log": a.log, "frames": len(world.frames), "backends": {}}
    for backend in a.backends.split(","):
        one = sc.model_copy(update={"output": str((out / backend).resolve())})
        t0 = time.perf_counter()
        render_world(world, one, backend=backend)
        wall = time.perf_counter() - t0
        res["backends"][backend] = {"wall_s": round(wall, 2), "s_per_frame": round(wall / len(world.frames), 3)}
        print(backend, res["backends"][backend])
    (out / "scenario_bench.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
