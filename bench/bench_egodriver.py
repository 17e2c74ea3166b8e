"""An AlpaSim egodriver policy in gsim's closed loop: carla-driver-interface's route_follower served in its own
process over real gRPC (`--agent egodriver:HOST:PORT`) against the same policy in this process (the same agent
and messages through carla-driver-interface's in-process channel: no socket), on a shipped scenario with its
sensors rendered. Prints, for each, the median step, the agent's part of it (the images encoded, the
observations submitted, the drive call and the policy) and steps per second.

    .venv/bin/python bench/bench_egodriver.py [--scenario stopped-car] [--steps 30] [--out out/bench/egodriver]

Needs the demo street at out/demo (`./quickstart.sh demo`) and the alpasim extra.
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

from gsim.bridges.closed_loop.egodriver import EgodriverAgent
from gsim.bridges.closed_loop.runner import run


class InProcessRouteFollower(EgodriverAgent):
    """The egodriver agent with the policy served in this process (`load_agent("bench_egodriver:...")`)."""

    def __init__(self):
        super().__init__("in-process:route_follower")

    def _connect(self):
        from carla_driver_interface.inprocess import in_process_channel
        from carla_driver_interface.policies.route_follower import RouteFollowerPolicy
        return in_process_channel(RouteFollowerPolicy(), "alpasim")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="stopped-car")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("out/bench/egodriver"))
    a = ap.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cli = Path(sys.executable).with_name("carla-driver-interface")
    server = subprocess.Popen([str(cli), "serve", "--policy", "route_follower", "--mode", "alpasim", "--host",
                               "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = {}
    try:
        for name, agent in (("gRPC (own process)", f"egodriver:127.0.0.1:{port}"),
                            ("in process", "bench_egodriver:InProcessRouteFollower")):
            m = run(a.scenario, agent, a.out / name.split()[0].lower(), progress=False, max_steps=a.steps)
            t = m["timing_ms"]
            results[name] = {"step_ms": t["step"], "agent_ms": t["agent"], "sensors_ms": t.get("sensors"),
                             "steps_per_s": 1e3 / t["step"], "score": m["score"], "steps": m["steps"]}
            r = results[name]
            print(f"{name:20s} step {r['step_ms']:7.1f} ms  agent {r['agent_ms']:6.1f} ms  sensors "
                  f"{r['sensors_ms']} ms  {r['steps_per_s']:.2f} steps/s  score {r['score']:.3f} ({r['steps']} steps)")
    finally:
        server.terminate()
        server.wait(10)
    return results


if __name__ == "__main__":
    main()
