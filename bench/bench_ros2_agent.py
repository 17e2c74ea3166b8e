"""The ROS 2 agent's overhead per step: `gsim closed-loop --agent ros2` against a stack in its own process over DDS
(tests/ros2_stack_fake.py, cyclonedds alone: it takes /clock, the image, the cloud and the odometry, then answers
with Ackermann) and the same controller in this process (no DDS). A synthetic street (a plane with a parked sedan,
one camera at --width x --height, a LiDAR of --beams rings), --steps steps. Prints, for each, the median step, the
agent's part of it and the sensors'; the difference of the agent's parts is the overhead: gsim's messages built and
written, DDS on the loopback, the stack's Python decode and its answer. A second stack (``--take clock``) answers
on /clock and the odometry alone, the sensors reaching its process over DDS undecoded: its overhead is what gsim
and DDS add, without the fake stack's Python decode (cyclonedds', not gsim's).

    .venv/bin/python bench/bench_ros2_agent.py [--width 1920 --height 1080 --beams 64 --steps 30 --out DIR]

DDS stays on the loopback interface (CYCLONEDDS_URI as the tests set it) unless CYCLONEDDS_URI is already set.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

from gsim.bridges.closed_loop.runner import run  # noqa: E402
from gsim.bridges.ros2.agent import Ros2Options, controls  # noqa: E402

from ros2_stack_fake import DELTA, STEER  # noqa: E402
from support import loop_street, scenario  # noqa: E402
from test_ros2_agent import LOOPBACK  # noqa: E402


class InProcessStack:
    """The fake stack's controller as an in-process agent: the speed plus DELTA[k % 2] at the steering STEER."""

    def reset(self, info):
        self.info = info

    def act(self, obs):
        return controls(obs.ego, self.info.params, self.info.step_s, STEER,
                        speed_mps=obs.ego.speed_mps + DELTA[obs.step % 2])


def street(root: Path, width: int, height: int, beams: int) -> Path:
    from gsim.scenes.synth import SynthOptions
    return loop_street(root, SynthOptions(n_frames=40, width=width, height=height, supersample=1, lidar_beams=beams,
                                          lidar_azimuth_resolution_deg=0.2))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--beams", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--domain", type=int, default=42)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    os.environ.setdefault("CYCLONEDDS_URI", LOOPBACK)
    root = a.out or Path(tempfile.mkdtemp(prefix="bench_ros2_"))
    root.mkdir(parents=True, exist_ok=True)
    path = scenario(street(root, a.width, a.height, a.beams), "bench")
    results = {}
    runs = (("ros2 (stack decodes all)", "all"), ("ros2 (stack takes the clock)", "clock"), ("in process", None))
    for name, take in runs:
        stack = take and subprocess.Popen([sys.executable, str(TESTS / "ros2_stack_fake.py"),
                                           str(root / f"stack-{take}.jsonl"), "--domain", str(a.domain), "--take",
                                           take], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            agent, options = (("ros2", {"ros2": Ros2Options(domain_id=a.domain)}) if take
                              else ("bench_ros2_agent:InProcessStack", {}))
            m = run(path, agent, root / (take or "local"), progress=False, max_steps=a.steps, video=False,
                    agent_options=options)
        finally:
            if stack:
                stack.kill()
                stack.wait()
        t = m["timing_ms"]
        results[name] = {"step_ms": t["step"], "agent_ms": t["agent"], "sensors_ms": t.get("sensors"),
                         "steps": m["steps"]}
        print(f"{name:30s} step {t['step']:7.1f} ms  agent {t['agent']:6.2f} ms  sensors {t.get('sensors')} ms "
              f"({m['steps']} steps)")
    local = results["in process"]["agent_ms"]
    results["overhead_ms"] = round(results["ros2 (stack decodes all)"]["agent_ms"] - local, 2)
    results["overhead_clock_ms"] = round(results["ros2 (stack takes the clock)"]["agent_ms"] - local, 2)
    results["camera"] = f"{a.width}x{a.height}"
    got = [json.loads(line) for line in (root / "stack-all.jsonl").read_text().splitlines()]
    results["points"] = statistics.median(m["width"] for m in got if m["type"] == "sensor_msgs/msg/PointCloud2")
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
