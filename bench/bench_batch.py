"""A closed-loop campaign's episodes per hour: in this process (`gsim closed-loop`'s batch) against Ray with 1 and 2
workers (`gsim batch closed-loop`), Ray's overhead per task, and a projection for N nodes.

    .venv/bin/python bench/bench_batch.py [--scenarios stopped-car lead-car] [--agents lidar-aeb,privileged]
                                          [--seeds 0,1] [--steps 30] [--out out/bench/batch]

Needs the demo street at out/demo (the shipped scenarios build it on first use). Each mode runs the same episodes
into its own folder; wall times include everything the command does (Ray's start for the Ray modes). Overhead:
the median round trip of an empty task on warm workers, and a worker's first task that imports the closed loop.
Projections for N nodes of C cores: "ideal" = N * C * 3600 / (episode seconds with one CPU + overhead) (cores
that do not slow each other down); "measured" = N * C * (this machine's 2-worker episodes/hour / 2) (the per-core
rate it actually reached, with the driver, SUMO and video encoding sharing its cores). Both assume nodes as fast as
this machine per core and a shared filesystem that keeps up. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gsim.bridges.cluster.batch import closed_loop_batch  # noqa: E402
from gsim.bridges.closed_loop.runner import run_batch  # noqa: E402
from gsim.bridges.closed_loop.scenario import SHIPPED, ensure_demo, load_loop_scenario  # noqa: E402
from gsim.cli_args import seed_list  # noqa: E402


def _noop():
    return 0


def _warm_import():
    t = time.perf_counter()
    import gsim.bridges.closed_loop.runner  # noqa: F401
    return time.perf_counter() - t


def overhead(ray) -> dict:
    """Seconds: an empty task's median round trip on warm workers; a fresh worker's import of the closed loop."""
    f = ray.remote(_noop)
    ray.get([f.remote() for _ in range(8)])  # warm
    rtt = []
    for _ in range(50):
        t = time.perf_counter()
        ray.get(f.remote())
        rtt.append(time.perf_counter() - t)
    imp = ray.get(ray.remote(max_calls=1)(_warm_import).remote())  # (a fresh worker process)
    return {"task_round_trip_ms": round(1e3 * statistics.median(rtt), 2), "worker_import_s": round(imp, 2)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", nargs="+", default=["stopped-car", "lead-car"])
    ap.add_argument("--agents", default="lidar-aeb,privileged")
    ap.add_argument("--seeds", type=seed_list, default=(0, 1))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default="out/bench/batch")
    a = ap.parse_args(argv)
    for s in a.scenarios:
        if s in SHIPPED:
            ensure_demo(load_loop_scenario(s))
    agents, out = a.agents.split(","), Path(a.out)
    n = len(a.scenarios) * len(agents) * len(a.seeds)
    shutil.rmtree(out, ignore_errors=True)
    result = {"episodes": n, "steps": a.steps}
    t = time.perf_counter()
    rows = run_batch(a.scenarios, agents, a.seeds, out / "in_process", progress=False, max_steps=a.steps)
    result["in_process_s"] = round(time.perf_counter() - t, 1)
    assert all(not r.get("error") for r in rows), rows
    for workers in (1, 2):
        t = time.perf_counter()
        ray_rows = closed_loop_batch(a.scenarios, agents, a.seeds, out / f"ray{workers}", steps=a.steps,
                                     num_cpus=workers, progress=False)
        result[f"ray_{workers}_workers_s"] = round(time.perf_counter() - t, 1)
        assert all(r["status"] == "done" for r in ray_rows), ray_rows
        if workers == 1:  # an episode's cost with one CPU (a task's threads are its CPUs)
            per_episode = statistics.median(r["wall_s"] for r in ray_rows)
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        result.update(overhead(ray))
    finally:
        ray.shutdown()
    for k in ("in_process", "ray_1_workers", "ray_2_workers"):
        result[f"{k}_episodes_per_h"] = round(3600 * n / result[f"{k}_s"], 1)
    result["episode_median_s"] = round(per_episode, 2)
    per_task = per_episode + result["task_round_trip_ms"] / 1e3
    per_core = result["ray_2_workers_episodes_per_h"] / 2
    result["projection_episodes_per_h"] = {f"{nodes}x{cores}": {"ideal": round(nodes * cores * 3600 / per_task),
                                                                "measured": round(nodes * cores * per_core)}
                                           for nodes, cores in ((1, 2), (4, 32), (16, 32))}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
