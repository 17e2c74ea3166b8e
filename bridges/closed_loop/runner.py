"""Running closed-loop scenarios with agents: one run into a directory, or a batch (scenarios x agents x seeds)
into one table. `gsim closed-loop` calls these."""
from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from gsim.errors import NAME_RE, GsimError
from gsim.io import child_path, write_bytes, write_json

from .agents import load_agent
from .dynamics import ActionError
from .loop import ClosedLoop, EndRun, LoopError
from .sumo import SumoError
from ..recording.record import RunRecorder
from .scenario import load_loop_scenario


class AgentError(GsimError, RuntimeError):
    """The agent under test raised: the message names the step and the agent's error."""


class Run:
    """One recorded closed-loop run, advanced step by step by whoever acts: `run` with an agent in this
    process, the network API's sessions with a remote one (the same record either way). ``start()`` gives
    the first observation, ``step(action)`` records a step and returns (observation, step metrics, done),
    ``finish(error)`` writes the run's metrics and closes the record (always call it: it keeps every
    completed step after a failure). ``max_steps`` truncates the run; ``video`` False: no video.mp4 (no
    ffmpeg needed); ``ros2_bag``: also record the run as a ROS 2 bag (`gsim.ros2_bag.BagOptions`)."""

    def __init__(self, scenario, out, agent_name: str, seed: int = 0, max_steps: Optional[int] = None,
                 render: bool = True, client: str = "libsumo", video: bool = True, ros2_bag=None):
        self.scenario = sc = load_loop_scenario(scenario) if isinstance(scenario, (str, Path)) else scenario
        self.out, self.agent_name, self.seed = Path(out), agent_name, seed
        self.t_start = time.perf_counter()
        self.loop = loop = ClosedLoop(sc, seed=seed, render=render, client=client, workdir=self.out / "sumo")
        self.n = loop.n_steps if max_steps is None else min(loop.n_steps, max_steps)
        try:
            self.rec = RunRecorder(out, loop, video=video, ros2_bag=ros2_bag)
        except BaseException:
            loop.close()
            raise
        self.done, self.summary, self.ended_by_agent = 0, None, None

    def start(self):
        obs = self.loop.reset()
        self.rec.step(obs, None, None, self.agent_name)
        return obs

    def step(self, action, t_step: Optional[float] = None):
        """One step with ``action``; ``t_step`` (perf_counter) when the step began, for its timing (now)."""
        t_step = time.perf_counter() if t_step is None else t_step
        loop = self.loop
        obs, m, finished = loop.step(action)
        with loop.timer("record"):
            self.rec.step(obs, loop.controls, m, self.agent_name)
        loop.timings.setdefault("step", []).append(time.perf_counter() - t_step)
        self.done += 1
        return obs, m, finished or self.done >= self.n

    def finish(self, error: Optional[BaseException] = None) -> dict:
        """Writes metrics.json (and the rest of the record) and closes the loop; returns the run's metrics."""
        if self.summary is not None:
            return self.summary
        loop = self.loop
        try:
            summary = loop.summary() if loop.metrics.steps else {"collision": False, "score": 0.0,
                                                                 "route_completion": 0.0}
            summary.update({"scenario": self.scenario.name, "agent": self.agent_name, "seed": self.seed,
                            "completed": error is None,
                            "error": None if error is None else f"{type(error).__name__}: {error}",
                            "steps": self.done, "truncated": self.n < loop.n_steps,
                            "ended_by_agent": self.ended_by_agent, "ended_by_scenario": loop.ended_by_scenario,
                            "wall_s": round(time.perf_counter() - self.t_start, 2),
                            "timing_ms": {k: round(1e3 * float(np.median(v)), 2) for k, v in loop.timings.items()}})
            self.rec.finish(summary, failed=error is not None)
        finally:
            loop.close()
        self.summary = summary
        return summary


def run(scenario, agent_name: str, out, seed: int = 0, progress: bool = True, max_steps: Optional[int] = None,
        render: bool = True, client: str = "libsumo", video: bool = True, agent_options: Optional[dict] = None,
        ros2_bag=None) -> dict:
    """Run ``scenario`` (a file, a shipped name or a `LoopScenario`) with the agent ``agent_name`` into
    ``out``; returns the run's metrics (also written to out/metrics.json). A failure (SUMO, an agent's
    error or bad action, Ctrl-C) is raised after the run directory has been closed with every completed step.
    ``max_steps`` truncates the run (metrics.json says ``truncated``; EP still compares with the whole run's
    reference progress). ``agent_options``: `load_agent`'s keywords (an egodriver's deadline and image format). An
    agent that raises `EndRun` ends the run there (metrics.json's ``ended_by_agent`` says why). ``ros2_bag``: see
    `Run`."""
    from tqdm import tqdm
    sc = load_loop_scenario(scenario) if isinstance(scenario, (str, Path)) else scenario
    agent = load_agent(agent_name, **(agent_options or {}))  # an unknown agent fails before anything starts
    r = Run(sc, out, agent_name, seed=seed, max_steps=max_steps, render=render, client=client, video=video,
            ros2_bag=ros2_bag)
    error = None
    try:
        obs = r.start()
        if hasattr(agent, "reset"):
            try:
                agent.reset(r.loop.info)
            except Exception as e:  # the agent under test
                raise AgentError(f"step 0: agent {agent_name!r} could not start: {type(e).__name__}: {e}") from e
        for k in tqdm(range(r.n), desc=f"{sc.name} / {agent_name}", unit="step", disable=not progress):
            t_step = time.perf_counter()
            try:
                with r.loop.timer("agent"):
                    action = agent.act(obs)
            except EndRun as e:
                r.ended_by_agent = str(e)
                break
            except Exception as e:  # the agent under test: any error it raises is its own
                raise AgentError(f"step {k + 1}: agent {agent_name!r} raised {type(e).__name__}: {e}") from e
            obs, _, done = r.step(action, t_step)
            if done:
                break
    except BaseException as e:  # whatever stops the run (Ctrl-C too): close the record first, then raise
        error = e
    finally:
        if hasattr(agent, "close"):
            agent.close()
        summary = r.finish(error)
    if error is not None:
        raise error
    return summary


def agent_folder(agent: str) -> str:
    """The folder name of an agent's runs: its name where that is a valid name (`gsim.errors.NAME_PATTERN`), else
    (``module:attr``, ``exec:COMMAND``) its safe characters and a hash of the whole spec, so a command line never
    becomes a path (``exec:../x``) and two specs never share a folder. metrics.json keeps the spec itself."""
    if NAME_RE.fullmatch(agent):
        return agent
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", agent).strip("._-")[:100] or "agent"
    return f"{slug}-{hashlib.sha1(agent.encode()).hexdigest()[:8]}"


def run_dir(out, scenario_name: str, agent: str, seed: int) -> Path:
    """A batch run's directory: out/<scenario>/<agent folder>/seed<k> (`agent_folder`)."""
    scenario_dir = child_path(Path(out), scenario_name, "scenario name")
    return child_path(scenario_dir, agent_folder(agent), "agent") / f"seed{seed}"


def batch_run(scenario, agent: str, seed: int, out, progress: bool = True, max_steps: Optional[int] = None,
              client: str = "libsumo", video: bool = True, agent_options: Optional[dict] = None) -> dict:
    """One run of a batch into `run_dir`: its metrics, or for a run the loop, SUMO or the agent stopped, what it
    recorded and its "error" (the batch goes on). `run_batch` and the Ray batch (`gsim batch closed-loop`) share it."""
    sc = load_loop_scenario(scenario) if isinstance(scenario, (str, Path)) else scenario
    d = run_dir(out, sc.name, agent, seed)
    try:
        return run(sc, agent, d, seed=seed, progress=progress, max_steps=max_steps, client=client, video=video,
                   agent_options=agent_options)
    except (LoopError, ActionError, AgentError, SumoError) as e:  # the table shows the failed run
        saved = d / "metrics.json"
        return {**(json.loads(saved.read_text()) if saved.is_file() else
                   {"scenario": sc.name, "agent": agent, "seed": seed}), "error": str(e)}


def run_batch(scenarios: Sequence[str], agents: Sequence[str], seeds: Sequence[int], out,
              progress: bool = True, max_steps: Optional[int] = None, client: str = "libsumo",
              video: bool = True, agent_options: Optional[dict] = None) -> List[dict]:
    """Every scenario (files, shipped names or `LoopScenario`s) x agent x seed into `run_dir`, in this process, and
    out/table.md + table.json."""
    for a in agents:
        load_agent(a, **(agent_options or {}))  # unknown agents fail before anything starts
    scs = [load_loop_scenario(s) if isinstance(s, (str, Path)) else s for s in scenarios]
    rows = [batch_run(sc, a, seed, out, progress, max_steps, client, video, agent_options) for sc in scs
            for a in agents for seed in seeds]
    write_batch_tables(out, rows)
    return rows


def write_batch_tables(out, rows: List[dict]) -> None:
    write_json(Path(out) / "table.json", rows)
    write_bytes(Path(out) / "table.md", batch_table(rows).encode())


def batch_table(rows: List[dict]) -> str:
    cols = ("score", "collision", "route_completion", "no_collision", "drivable_area_compliance", "time_to_collision",
            "ego_progress", "comfort", "steps", "truncated", "completed")
    out = ["| scenario | agent | seed | " + " | ".join(cols) + " |", "|---" * (3 + len(cols)) + "|"]
    for r in rows:
        vals = [f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "-")) for c in cols]
        out.append(f"| {r['scenario']} | {r['agent']} | {r['seed']} | " + " | ".join(vals) + " |")
    return "\n".join(out) + "\n"
