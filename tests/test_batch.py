"""gsim batch on a local Ray (2 CPUs, started once for the module): a closed-loop campaign (2 scenarios x 2 agents x
3 seeds, 10-step episodes) equals the in-process batch run for run, resumes, and isolates a failing and a crashing
run; a reconstruction batch of three small synthetic logs equals three separate runs, reports a corrupt log as one
failed row, and a rerun skips what finished."""
import json
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="gsim batch needs Ray (the cluster extra)")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("sumolib")
pytest.importorskip("libsumo")
pytest.importorskip("yaml")

from gsim.bridges.cluster import batch  # noqa: E402
from gsim.errors import InputError  # noqa: E402
from support import ACROSS, scenario  # noqa: E402

TESTS = Path(__file__).parent
VARYING = ("wall_s", "timing_ms")  # what differs between two runs of the same episode


@pytest.fixture(scope="module")
def local_ray():
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()


@contextmanager
def one_thread():
    """numba and torch on one thread, as in a Ray task given one CPU (`batch.use_assigned_cpus`)."""
    import numba
    import torch
    before = numba.get_num_threads(), torch.get_num_threads()
    numba.set_num_threads(1)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before[0])
        torch.set_num_threads(before[1])


def same_metrics(a: dict, b: dict) -> bool:
    strip = lambda m: {k: v for k, v in m.items() if k not in VARYING + ("status",)}  # noqa: E731
    return strip(a) == strip(b)


def test_a_closed_loop_campaign_equals_the_in_process_batch_and_resumes(loop_street, local_ray, tmp_path):
    from gsim.bridges.closed_loop.runner import run_batch
    scenarios = [scenario(loop_street, "free"), scenario(loop_street, "across", ACROSS)]
    agents, seeds = ["replay", "lidar-aeb"], [0, 1, 2]
    alone = run_batch(scenarios, agents, seeds, tmp_path / "alone", progress=False, max_steps=10)
    rows = batch.closed_loop_batch(scenarios, agents, seeds, tmp_path / "ray", steps=10, progress=False)
    assert len(rows) == 12 and all(r["status"] == "done" for r in rows)
    for a, r in zip(alone, rows):
        assert (a["scenario"], a["agent"], a["seed"]) == (r["scenario"], r["agent"], r["seed"])
        assert same_metrics(a, r), (a, r)
    for k in (0, 5, 11):  # the recorded steps too, not only the summary
        d = ("free" if k < 6 else "across", agents[k // 3 % 2], k % 3)
        steps = [(tmp_path / w / d[0] / d[1] / f"seed{d[2]}" / "steps.jsonl").read_text() for w in ("alone", "ray")]
        records = [[{k: v for k, v in json.loads(line).items() if k != "timing_ms"} for line in t.splitlines()]
                   for t in steps]
        assert records[0] == records[1]
    def ego(agent):
        return [json.loads(line)["ego"] for line in
                (tmp_path / "ray" / "free" / agent / "seed0" / "steps.jsonl").read_text().splitlines()]
    assert ego("replay") != ego("lidar-aeb")  # (the agents drive differently: a comparison that can fail)
    table = pq.read_table(tmp_path / "ray" / "results.parquet").to_pylist()
    assert [(t["scenario"], t["agent"], t["seed"], t["score"]) for t in table] == \
        [(r["scenario"], r["agent"], r["seed"], r["score"]) for r in rows]
    agg = json.loads((tmp_path / "ray" / "aggregates.json").read_text())
    replay = [r for r in rows if r["agent"] == "replay"]
    assert agg["replay"]["runs"] == 6
    assert agg["replay"]["mean_score"] == pytest.approx(np.mean([r["score"] for r in replay]))
    lo, hi = agg["replay"]["collision_ci95"]
    assert 0 <= lo <= agg["replay"]["collision_rate"] <= hi <= 1
    assert "Per agent" in (tmp_path / "ray" / "results.md").read_text()
    # a rerun skips the finished runs (their files untouched) and runs the one whose metrics are gone
    first = tmp_path / "ray" / "free" / "replay" / "seed0"
    (first / "metrics.json").unlink()
    kept = (tmp_path / "ray" / "across" / "replay" / "seed0" / "steps.jsonl").stat().st_mtime_ns
    again = batch.closed_loop_batch(scenarios, agents, seeds, tmp_path / "ray", steps=10, progress=False)
    assert (tmp_path / "ray" / "across" / "replay" / "seed0" / "steps.jsonl").stat().st_mtime_ns == kept
    assert (first / "metrics.json").is_file() and same_metrics(again[0], rows[0])


def test_a_raising_and_a_crashing_agent_are_failed_rows_and_the_rest_go_on(loop_street, local_ray, tmp_path):
    free = scenario(loop_street, "free")
    rows = batch.closed_loop_batch([free], ["replay", "test_bridges_loop:RaisingAgent", "batch_agents:DyingAgent"],
                                   [0], tmp_path, steps=5, retries=1, progress=False)
    status = {r["agent"]: (r["status"], r.get("error") or "") for r in rows}
    assert status["replay"] == ("done", "")
    assert status["test_bridges_loop:RaisingAgent"][0] == "failed" and "raised" in status[
        "test_bridges_loop:RaisingAgent"][1]
    assert status["batch_agents:DyingAgent"][0] == "failed"  # its worker died, twice (one retry): reported, no hang
    assert "Worker" in status["batch_agents:DyingAgent"][1] or "died" in status["batch_agents:DyingAgent"][1]


@pytest.fixture(scope="module")
def three_logs(tmp_path_factory):
    from gsim.scenes.synth import SynthOptions, synthesize
    root = tmp_path_factory.mktemp("logs")
    tiny = SynthOptions(n_frames=9, width=64, height=40, supersample=1, lidar_beams=8, lidar_azimuth_resolution_deg=2.0)
    return [synthesize(root / f"street{s}", seed=s, options=tiny, progress=False) for s in range(3)]


def test_a_reconstruction_batch_equals_separate_runs_isolates_a_bad_log_and_resumes(three_logs, local_ray, tmp_path):
    from gsim.scenes.evaluation.evaluate import evaluate
    from gsim.scenes.reconstruction.train import preset, reconstruct
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "log.json").write_text("{not json")
    out = tmp_path / "batch"
    with pytest.raises(InputError, match="s3:// is not one: mount it"):
        batch.reconstruct_batch(["s3://bucket/logs/street0"], out, progress=False)
    inputs = [three_logs[0].as_uri(), *map(str, three_logs[1:]), str(bad)]  # a file:// URL is a path
    rows = batch.reconstruct_batch(inputs, out.as_uri(), "cpu", {"iterations": 12}, progress=False)
    assert [r["log"] for r in rows] == ["street0", "street1", "street2", "broken"]
    assert [r["status"] for r in rows] == ["done"] * 3 + ["failed"]
    assert "log.json" in rows[3]["error"]
    alone = tmp_path / "alone"
    with one_thread():  # as a task with one CPU runs (training's parallel sums round by the thread count)
        scene = reconstruct(three_logs[1], alone, preset("cpu", iterations=12), progress=False)
        m = evaluate(scene, three_logs[1], alone / "eval", progress=False)
    # bit for bit: the worker and this process run the kernels numba's cache holds (gsim.scenes.kernel_cache)
    assert rows[1]["psnr"] == m["psnr"] and rows[1]["ssim"] == m["ssim"]
    assert (out / "street1" / "scene" / "scene.json").is_file()
    assert (out / "street1" / "eval" / "metrics.json").is_file()
    table = pq.read_table(out / "results.parquet").to_pylist()
    assert [t["status"] for t in table] == [r["status"] for r in rows] and table[0]["iterations"] == 12
    # a rerun skips what finished: only the (still) broken log is tried again
    kept = (out / "street0" / "scene" / "scene.json").stat().st_mtime_ns
    again = batch.reconstruct_batch([*map(str, three_logs), str(bad)], out, "cpu", {"iterations": 12}, progress=False)
    assert (out / "street0" / "scene" / "scene.json").stat().st_mtime_ns == kept
    assert [r["status"] for r in again] == ["done"] * 3 + ["failed"] and again[1]["psnr"] == rows[1]["psnr"]


def test_an_interrupted_reconstruction_resumes_from_its_checkpoint(three_logs, local_ray, tmp_path):
    """A reconstruction killed mid-run (after its first checkpoint) is resumed by the batch: the step counter
    continues and the scene equals an uninterrupted run's."""
    import signal
    import subprocess
    import sys
    import time
    cfg = {"iterations": 30, "checkpoint_every": 10}
    out = tmp_path / "batch"
    code = (f"from gsim.scenes.reconstruction.train import preset, reconstruct; "
            f"reconstruct({str(three_logs[0])!r}, {str(out / 'street0')!r}, preset('cpu', **{cfg!r}), progress=False)")
    p = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "NUMBA_NUM_THREADS": "1",
                                                           "OMP_NUM_THREADS": "1"})  # as the batch's 1-CPU tasks
    ckpt = out / "street0" / "checkpoint.safetensors"
    end = time.time() + 300
    while not ckpt.is_file() and p.poll() is None and time.time() < end:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert ckpt.is_file() and not (out / "street0" / "scene").exists()  # killed between checkpoints
    (row,) = batch.reconstruct_batch([str(three_logs[0])], out, "cpu", cfg, progress=False)
    assert row["status"] == "done" and 10 <= row["resumed_at_step"] < 30 and row["iterations"] == 30
    (whole,) = batch.reconstruct_batch([str(three_logs[0])], tmp_path / "whole", "cpu", cfg, progress=False)
    assert whole["resumed_at_step"] == 0 and whole["psnr"] == row["psnr"]


def test_a_scenario_render_batch_writes_what_scenario_render_writes(edit_street, local_ray, tmp_path):
    import yaml
    from gsim.editing.outputs import render_world
    from gsim.editing.scenario import load_scenario
    from gsim.editing.world import apply
    from support import scenario_dict
    root, _ = edit_street
    files = []
    for name, edits in (("ahead", None), ("empty", [])):
        d = scenario_dict(root, name=name, output=str(tmp_path / "outputs" / name))
        if edits is not None:
            d["edits"] = edits
        files.append(tmp_path / f"{name}.yaml")
        files[-1].write_text(yaml.safe_dump(d))
    rows = batch.scenario_render_batch(list(map(str, files)), tmp_path / "batch", backend="numba", progress=False)
    assert [r["status"] for r in rows] == ["done", "done"] and rows[0]["frames"] == 5
    sc = load_scenario(files[0])
    alone = render_world(apply(sc), sc.model_copy(update={"output": str(tmp_path / "alone")}), backend="numba",
                         progress=False)
    for rel in ("log/log.json", "labels/front/000002.json"):
        assert (tmp_path / "outputs" / "ahead" / rel).read_bytes().replace(b"outputs/ahead", b"alone") == \
            (alone / rel).read_bytes(), rel
    img = sorted((alone / "log" / "cameras" / "front").iterdir())[2].name
    assert (tmp_path / "outputs/ahead/log/cameras/front" / img).read_bytes() == \
        (alone / "log/cameras/front" / img).read_bytes()
    kept = (tmp_path / "outputs" / "ahead" / "scenario.json").stat().st_mtime_ns
    again = batch.scenario_render_batch(list(map(str, files)), tmp_path / "batch", progress=False)
    assert [r["status"] for r in again] == ["done", "done"]
    assert (tmp_path / "outputs" / "ahead" / "scenario.json").stat().st_mtime_ns == kept  # skipped: finished


def test_a_killed_driver_reruns_only_what_did_not_finish(loop_street, tmp_path):
    """`gsim batch closed-loop` killed (with its local Ray) after its first run finished: the rerun skips the
    finished runs (their files untouched) and completes the rest."""
    import signal
    import subprocess
    import sys
    import time
    free = scenario(loop_street, "free")
    out = tmp_path / "runs"
    argv = [sys.executable, "-m", "gsim.cli", "batch", "closed-loop", free, "--agents", "replay", "--seeds", "0-3",
            "--steps", "10", "--out", str(out), "--num-cpus", "1"]
    p = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + 300
    while not list(out.glob("free/replay/seed*/metrics.json")) and p.poll() is None and time.time() < end:
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGKILL)  # the driver and the Ray it started
    p.wait()
    finished = {d.parent.name: d.stat().st_mtime_ns for d in out.glob("free/replay/seed*/metrics.json")}
    assert 1 <= len(finished) < 4 and not (out / "results.parquet").exists()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert {d: (out / "free" / "replay" / d / "metrics.json").stat().st_mtime_ns for d in finished} == finished
    rows = pq.read_table(out / "results.parquet").to_pylist()
    assert [(row["seed"], row["status"]) for row in rows] == [(k, "done") for k in range(4)]


def test_an_openscenario_file_is_an_episode_of_a_batch(loop_street, local_ray, tmp_path):
    """`gsim batch closed-loop FILE.xosc`: the worker reads the file and plays its storyboard (the car brakes at 4 m/s^2
    from 1.1 s: 2.4 m/s at 2 s)."""
    pytest.importorskip("scenariogeneration")
    from gsim.bridges.closed_loop.opendrive import export_road
    from test_openscenario import braking
    export_road(str(loop_street), tmp_path / "road.xodr")
    rows = batch.closed_loop_batch([braking(tmp_path, loop_street)], ["privileged"], [0], tmp_path / "out", steps=20,
                                   progress=False)
    assert rows[0]["status"] == "done" and rows[0]["scenario"] == "braking"
    steps = tmp_path / "out" / "braking" / "privileged" / "seed0" / "steps.jsonl"
    last = json.loads(steps.read_text().splitlines()[-1])
    car = next(a for a in last["actors"] if a["id"] == "braker")
    assert np.hypot(*car["velocity"]) == pytest.approx(6.0 - 4.0 * (2.0 - 1.1), abs=0.05)



@pytest.mark.parametrize("message", batch.RAY_START_TIMEOUTS)
def test_a_local_ray_that_misses_its_start_up_wait_is_started_once_more(monkeypatch, capsys, message):
    """Ray's fixed start-up waits (the raylet's, the GCS server's) can run out on a loaded 2-core machine: the
    local Ray is started once more, and the reason goes to stderr; a second miss, or another error, is raised."""
    calls = []

    def fake_init(*errors):  # ray.init raising errors[i] on its i-th call (None: starts)
        def init(**kwargs):
            calls.append(kwargs)
            if errors[len(calls) - 1] is not None:
                raise RuntimeError(errors[len(calls) - 1])
        return init
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    for errors, raised in (((message, None), None), ((message, message), message),
                           (("another failure",), "another failure")):
        calls.clear()
        monkeypatch.setattr(ray, "init", fake_init(*errors))
        if raised is None:
            with batch.ray_session(num_cpus=1):
                pass
            assert "starting it once more" in capsys.readouterr().err
        else:
            with pytest.raises(RuntimeError, match=raised):
                with batch.ray_session(num_cpus=1):
                    pass
        assert len(calls) == len(errors)
