"""Batches on Ray (`gsim batch`): many logs reconstructed and evaluated, many closed-loop episodes (scenarios x
agents x seeds), many scenarios rendered into data (images, LiDAR, labels, masks, KITTI), one Ray task each, on a
local Ray (the default: started for the batch, stopped after it) or an existing cluster (``address``: "auto" or
HOST:PORT; every node needs gsim installed and sees the inputs and the output folder at the same path, see
docs/cluster.md).

Each task writes what the single command writes (`gsim reconstruct` + `gsim eval`, `gsim closed-loop`, `gsim
scenario render`) with the same functions, and runs numba and torch on as many threads as it has CPUs, so a batch's
runs equal runs made one by one with the same CPUs, bit for bit, whatever the number of workers and the order they
finish in (reconstructions load numba's kernels from its cache: gsim.scenes.kernel_cache). A batch is resumable: a
rerun skips what finished (its results are read back) and resumes an interrupted reconstruction from its checkpoint.
Failures are isolated: a task whose worker dies (a crash, a node lost) is retried ``retries`` times; one that
raises (bad input does not go away) or dies every time becomes one failed row with its error, and the rest go on.
Results: DIR/results.parquet and results.md (one row per task), and for closed loop also the in-process batch's
table.md / table.json and per-agent aggregates (aggregates.json, in results.md): mean score with a bootstrap 95%
interval over the runs, collision rate with a Wilson 95% interval.
"""
from __future__ import annotations

import json
import math
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Collection, Dict, List, Optional, Sequence

import numpy as np

from gsim.errors import InputError, check_name
from gsim.io import write_bytes, write_json

RESULTS = "results.parquet"
RESULTS_MD = "results.md"
AGGREGATES = "aggregates.json"
BOOTSTRAP_SAMPLES = 2000
RAY_START_TIMEOUTS = ("timed out during startup", "Timed out waiting for file")  # a local Ray's start-up waits


@contextmanager
def ray_session(address: Optional[str] = None, num_cpus: Optional[int] = None):
    """Ray for a batch: a local one (``num_cpus``, default all) started here and stopped after, or the cluster at
    ``address`` ("auto": the one this machine belongs to), or the one this process already runs."""
    import ray  # (the cluster extra; the command line names it when it is missing)
    if ray.is_initialized():
        yield ray
        return
    for attempt in (1, 2):
        try:
            ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
            break
        except ConnectionError as e:
            raise InputError(f"--address {address}: no Ray cluster there ({e})") from None
        except Exception as e:  # Ray waits a fixed time for a local node's processes, which a loaded 2-core machine
            # can miss (the raylet: "timed out during startup"; the GCS server: "Timed out waiting for file")
            if address or attempt == 2 or not any(m in str(e) for m in RAY_START_TIMEOUTS):
                raise
            ray.shutdown()
            print(f"gsim batch: the local Ray did not start ({e}); starting it once more", file=sys.stderr)
    try:
        yield ray
    finally:
        ray.shutdown()


def local_path(arg) -> Path:
    """A batch input or output as a path every node sees: a path, or a ``file://`` URL. Other URLs (s3://, gs://)
    are refused: mount the bucket (s3fs, mountpoint-s3, gcsfuse) and give its path (docs/cluster.md)."""
    from urllib.parse import unquote, urlparse
    text = str(arg)
    if "://" not in text:
        return Path(text)
    u = urlparse(text)
    if u.scheme != "file" or u.netloc not in ("", "localhost"):
        raise InputError(f"{text}: gsim batch reads and writes paths that every node sees (a shared filesystem); "
                         f"{u.scheme}:// is not one: mount it (s3fs, mountpoint-s3, gcsfuse) and give that path")
    return Path(unquote(u.path))


def run_tasks(ray, tasks: Dict[str, tuple], fn: Callable, cpus: float = 1.0, gpus: float = 0.0, retries: int = 1,
              progress: bool = True, what: str = "task", one_at_a_time: Collection = ()) -> Dict[str, dict]:
    """Run ``fn(*args)`` for each {key: args} as a Ray task (``cpus``/``gpus`` each; a task whose worker dies is
    retried ``retries`` times) and return {key: its row}; a task that raises or still dies is the row
    {"status": "failed", "error": ...}. Rows come back as tasks finish, in any order. The tasks whose keys are in
    ``one_at_a_time`` run one after another (each starts once the one before it ended), beside the others."""
    from tqdm import tqdm
    remote = ray.remote(fn).options(num_cpus=cpus, num_gpus=gpus, max_retries=retries, retry_exceptions=False)
    pending = {remote.remote(*args): key for key, args in tasks.items() if key not in one_at_a_time}
    queue = [key for key in tasks if key in one_at_a_time]

    def next_in_queue():
        if queue:
            key = queue.pop(0)
            pending[remote.remote(*tasks[key])] = key

    next_in_queue()
    rows = {}
    with tqdm(total=len(tasks), desc=f"batch ({what}s)", unit=what, disable=not progress) as bar:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            key = pending.pop(done[0])
            try:
                rows[key] = ray.get(done[0])
            except (ray.exceptions.RayTaskError, ray.exceptions.WorkerCrashedError,
                    ray.exceptions.RayActorError) as e:
                cause = getattr(e, "cause", None) or e
                rows[key] = {"status": "failed", "error": f"{type(cause).__name__}: {str(cause).splitlines()[0]}"}
            if key in one_at_a_time:
                next_in_queue()
            bar.update(1)
    return rows


def write_results(out: Path, rows: List[dict], columns: Sequence[str], title: str, extra_md: str = "") -> None:
    """DIR/results.parquet (the columns, in order; missing values null) and DIR/results.md."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.Table.from_pylist([{c: _cell(r.get(c)) for c in columns} for r in rows])
    tmp = out / f".{RESULTS}.tmp"
    pq.write_table(table, tmp)
    tmp.replace(out / RESULTS)
    def fmt(v):
        return "-" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v).replace("|", "/"))
    md = [f"# {title}", "", "| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    md += ["| " + " | ".join(fmt(_cell(r.get(c))) for c in columns) + " |" for r in rows]
    write_bytes(out / RESULTS_MD, ("\n".join(md) + "\n" + extra_md).encode())


def _cell(v):
    """A value as one parquet cell: numbers, strings, booleans; anything else as JSON text."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        return v.item()
    return json.dumps(v)


# --------------------------------------------------------------------------- closed loop

LOOP_COLUMNS = ("scenario", "agent", "seed", "status", "error", "score", "collision", "route_completion",
                "no_collision", "drivable_area_compliance", "time_to_collision", "ego_progress", "comfort", "steps",
                "truncated", "completed", "wall_s")


def use_assigned_cpus() -> None:
    """In a Ray task: numba's and torch's threads to the CPUs Ray gave the task, not the node's (the node's other
    CPUs run other tasks)."""
    import numba
    import ray
    import torch
    n = max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(n)


def _episode(scenario: str, agent: str, seed: int, out: str, steps: Optional[int], client: str,
             agent_options: Optional[dict] = None) -> dict:
    """One closed-loop episode in a Ray worker: `gsim.bridges.closed_loop.runner.batch_run`, its row with a status."""
    from ..closed_loop.runner import batch_run
    from ..openscenario.load import loop_scenario
    use_assigned_cpus()
    row = batch_run(loop_scenario(scenario), agent, seed, out, progress=False, max_steps=steps, client=client,
                    agent_options=agent_options)
    return {**row, "status": "failed" if row.get("error") else "done"}


def finished_run(d: Path) -> Optional[dict]:
    """The metrics of a run directory whose run completed (a rerun skips it), else None."""
    try:
        m = json.loads((d / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("completed") and not m.get("error") else None


def closed_loop_batch(scenarios: Sequence[str], agents: Sequence[str], seeds: Sequence[int], out,
                      steps: Optional[int] = None, client: str = "libsumo", address: Optional[str] = None,
                      num_cpus: Optional[int] = None, cpus_per_task: float = 1.0, gpus_per_task: float = 0.0,
                      retries: int = 1, progress: bool = True, agent_options: Optional[dict] = None) -> List[dict]:
    """Every scenario x agent x seed as a Ray task into the in-process batch's run directories
    (`gsim.bridges.closed_loop.runner.run_dir`); returns the rows in scenario, agent, seed order. ``agent_options``:
    `load_agent`'s keywords (the ros2 agent's `Ros2Options`). The ros2 agent's episodes run one at a time, beside
    the others: they share the one stack, its DDS domain and its topics (two at once would cross-talk)."""
    from ..closed_loop.agents import load_agent
    from ..closed_loop.runner import run_dir, write_batch_tables
    from ..closed_loop.scenario import SHIPPED
    from ..openscenario.load import loop_scenario
    for a in agents:
        load_agent(a, **(agent_options or {}))  # unknown agents (and bad options) fail before anything starts
    out = local_path(out)
    scenarios = [s if s in SHIPPED else str(local_path(s)) for s in scenarios]
    names = {s: loop_scenario(s).name for s in scenarios}  # (an OpenSCENARIO file is read in each worker again)
    out.mkdir(parents=True, exist_ok=True)
    keys = [(s, a, seed) for s in scenarios for a in agents for seed in seeds]
    rows, tasks = {}, {}
    for s, a, seed in keys:
        done = finished_run(run_dir(out, names[s], a, seed))
        if done is not None:
            rows[(s, a, seed)] = {**done, "status": "done"}
        else:
            tasks[(s, a, seed)] = (str(s), a, int(seed), str(out), steps, client, agent_options)
    if tasks:
        with ray_session(address, num_cpus) as ray:
            rows.update(run_tasks(ray, tasks, _episode, cpus_per_task, gpus_per_task, retries, progress, "episode",
                                  one_at_a_time={k for k in tasks if k[1] == "ros2"}))
    ordered = []
    for s, a, seed in keys:
        r = rows[(s, a, seed)]
        ordered.append({"scenario": names[s], "agent": a, "seed": int(seed), **r})
    write_batch_tables(out, ordered)
    agg = aggregates(ordered)
    write_json(out / AGGREGATES, agg)
    write_results(out, ordered, LOOP_COLUMNS, "Closed-loop batch", aggregates_md(agg))
    return ordered


def bootstrap_interval(values: Sequence[float], seed: int = 0) -> tuple:
    """The mean's 95% percentile-bootstrap interval (BOOTSTRAP_SAMPLES resamples, fixed seed)."""
    v = np.asarray(values, np.float64)
    if len(v) < 2:
        return (float(v.mean()), float(v.mean())) if len(v) else (math.nan, math.nan)
    means = v[np.random.default_rng(seed).integers(0, len(v), (BOOTSTRAP_SAMPLES, len(v)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def wilson_interval(k: int, n: int, z: float = 1.959964) -> tuple:
    """The Wilson score 95% interval of a rate k / n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def aggregates(rows: List[dict]) -> Dict[str, dict]:
    """Per agent, over its completed runs: mean score with a bootstrap 95% interval, collision rate with a Wilson
    95% interval, and how many runs failed."""
    out = {}
    for agent in dict.fromkeys(r["agent"] for r in rows):
        mine = [r for r in rows if r["agent"] == agent]
        ok = [r for r in mine if r.get("status") == "done" and isinstance(r.get("score"), (int, float))]
        scores = [float(r["score"]) for r in ok]
        hits = sum(bool(r.get("collision")) for r in ok)
        out[agent] = {"runs": len(mine), "failed": len(mine) - len(ok),
                      "mean_score": float(np.mean(scores)) if scores else None,
                      "score_ci95": list(bootstrap_interval(scores)) if scores else None,
                      "collision_rate": hits / len(ok) if ok else None,
                      "collision_ci95": list(wilson_interval(hits, len(ok))) if ok else None}
    return out


def aggregates_md(agg: Dict[str, dict]) -> str:
    md = ["", "## Per agent (completed runs; score: mean, bootstrap 95% interval; collisions: Wilson 95% interval)",
          "", "| agent | runs | failed | mean score | 95% interval | collision rate | 95% interval |",
          "|---|---|---|---|---|---|---|"]
    for agent, a in agg.items():
        iv = lambda x: "-" if x is None else f"{x[0]:.3f} - {x[1]:.3f}"  # noqa: E731
        num = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        md.append(f"| {agent} | {a['runs']} | {a['failed']} | {num(a['mean_score'])} | {iv(a['score_ci95'])} | "
                  f"{num(a['collision_rate'])} | {iv(a['collision_ci95'])} |")
    return "\n".join(md) + "\n"


# --------------------------------------------------------------------------- reconstruction

RECON_COLUMNS = ("log", "status", "iterations", "resumed_at_step", "wall_s", "psnr", "ssim", "lidar_depth_median_abs_m",
                 "error")


def _reconstruct(log: str, out: str, preset: str, overrides: dict, fmt: Optional[str]) -> dict:
    """One log in a Ray worker: (converted with ``fmt`` into OUT/log first, when given) reconstructed into OUT as
    `gsim reconstruct LOG OUT` (resumed from OUT's checkpoint when one is there) and evaluated into OUT/eval as
    `gsim eval OUT/scene LOG --out OUT/eval`."""
    from gsim.scenes.reconstruction import checkpoint
    from gsim.scenes.evaluation.evaluate import evaluate
    from gsim.scenes.reconstruction.train import preset as make_preset, reconstruct
    use_assigned_cpus()
    t0, out_dir = time.perf_counter(), Path(out)
    log_dir = Path(log)
    if not log_dir.exists():
        import socket
        raise InputError(f"{log_dir}: not visible on worker {socket.gethostname()} (batch inputs and outputs must be "
                         f"on a filesystem every node sees at the same path: docs/cluster.md)")
    if fmt is not None:
        log_dir = convert_log(fmt, log_dir, out_dir / "log")
    cfg = make_preset(preset, **overrides)
    scene = reconstruct(log_dir, out_dir, cfg, resume=checkpoint.find(out_dir) is not None, progress=False)
    m = evaluate(scene, log_dir, out_dir / "eval", progress=False)
    record = json.loads((out_dir / "train.json").read_text())
    return {"status": "done", "iterations": record["iterations"], "resumed_at_step": record["resumed_at_step"],
            "wall_s": round(time.perf_counter() - t0, 2), **m}


def convert_log(fmt: str, src: Path, out: Path) -> Path:
    """``src`` converted by `gsim convert FMT` into ``out`` (kept: a rerun reuses it)."""
    from gsim.scenes.log import MANIFEST
    if (out / MANIFEST).is_file():
        return out
    from gsim.scenes.formats import converter
    made = converter(fmt)(src, out)
    if isinstance(made, list) and len(made) != 1:  # (a dataset file with several scenes)
        raise InputError(f"{src}: converts into {len(made)} logs ({out}/*): give them to the batch one by one")
    return made[0] if isinstance(made, list) else made


def finished_reconstruction(out_dir: Path) -> Optional[dict]:
    try:
        m = json.loads((out_dir / "eval" / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and (out_dir / "scene" / "scene.json").is_file() else None


def reconstruct_batch(logs: Sequence[str], out, preset: str = "cpu", overrides: Optional[dict] = None,
                      fmt: Optional[str] = None, address: Optional[str] = None, num_cpus: Optional[int] = None,
                      cpus_per_task: float = 1.0, gpus_per_task: float = 0.0, retries: int = 1,
                      progress: bool = True) -> List[dict]:
    """Every log reconstructed and evaluated as a Ray task into out/<log's folder name>/; returns the rows in the
    logs' order (also out/results.parquet and results.md)."""
    out, logs = local_path(out), [local_path(p) for p in logs]
    for p in logs:
        if not p.exists():
            raise InputError(f"{p}: no such log (batch inputs must be paths this machine and every worker see)")
        if fmt is None and not p.is_dir():
            raise InputError(f"{p}: not a directory (a gsim log; another format's input takes --format)")
    names = [check_name(p.name, f"{p}: the log folder's name (its output folder)") for p in logs]
    if len(set(names)) != len(names):
        raise InputError(f"logs: two share a folder name (their outputs would collide): {sorted(names)}")
    out.mkdir(parents=True, exist_ok=True)
    rows, tasks = {}, {}
    for log, name in zip(logs, names):
        done = finished_reconstruction(out / name)
        if done is not None:
            rows[name] = {"status": "done", **done}
        else:
            tasks[name] = (str(Path(log).resolve()), str((out / name).resolve()), preset, dict(overrides or {}), fmt)
    if tasks:
        with ray_session(address, num_cpus) as ray:
            rows.update(run_tasks(ray, tasks, _reconstruct, cpus_per_task, gpus_per_task, retries, progress, "log"))
    ordered = [{**rows[name], "log": name} for name in names]  # (the evaluation's own "log" is the path)
    write_results(out, ordered, RECON_COLUMNS, "Reconstruction batch")
    return ordered


# --------------------------------------------------------------------------- scenario renders (data generation)

RENDER_COLUMNS = ("scenario", "status", "output", "frames", "wall_s", "error")


def _render_scenario(path: str, backend: str) -> dict:
    """One scenario in a Ray worker, as `gsim scenario render FILE`: its outputs into the scenario's own folder."""
    from gsim.editing.outputs import render_world
    from gsim.editing.scenario import load_scenario
    from gsim.editing.world import apply
    use_assigned_cpus()
    t0 = time.perf_counter()
    sc = load_scenario(path)
    world = apply(sc)
    out = render_world(world, sc, backend=backend, progress=False)
    return {"status": "done", "output": str(out), "frames": len(world.frames),
            "wall_s": round(time.perf_counter() - t0, 2)}


def scenario_render_batch(scenarios: Sequence[str], out, backend: str = "auto", address: Optional[str] = None,
                          num_cpus: Optional[int] = None, cpus_per_task: float = 1.0, gpus_per_task: float = 0.0,
                          retries: int = 1, progress: bool = True) -> List[dict]:
    """Every scenario file rendered as a Ray task into its own output folder (its ``output``); a scenario whose
    output is complete (scenario.json written last, atomically) is skipped. out/results.parquet and results.md
    list them."""
    from gsim.editing.scenario import load_scenario
    out = local_path(out)
    # (bad files fail here, before anything starts)
    outputs = {str(local_path(s)): Path(load_scenario(local_path(s)).output) for s in scenarios}
    if len(set(outputs.values())) != len(outputs):
        raise InputError("scenarios: two write the same output folder: " + ", ".join(sorted(map(str, outputs))))
    out.mkdir(parents=True, exist_ok=True)
    rows, tasks = {}, {}
    for s, o in outputs.items():
        if (o / "scenario.json").is_file():
            rows[s] = {"status": "done", "output": str(o)}
        else:
            tasks[s] = (str(Path(s).resolve()), backend)
    if tasks:
        with ray_session(address, num_cpus) as ray:
            rows.update(run_tasks(ray, tasks, _render_scenario, cpus_per_task, gpus_per_task, retries, progress,
                                  "scenario"))
    ordered = [{**rows[s], "scenario": s} for s in outputs]
    write_results(out, ordered, RENDER_COLUMNS, "Scenario render batch")
    return ordered
