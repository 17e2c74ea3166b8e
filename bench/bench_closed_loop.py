"""Closed-loop benchmark: every shipped scenario with every built-in agent on the demo street, the metrics
table, the steps per second and each stage's share of a step.

    .venv/bin/python bench/bench_closed_loop.py [--out out/bench/closed_loop] [--seed 0]

Needs the demo street at out/demo (`./quickstart.sh demo`, or `gsim closed-loop stopped-car ...` builds it).
Writes OUT/table.md, OUT/table.json (the runs' metrics, each with timing_ms: median ms per step of each
stage; "sensors" is the cameras and the LiDARs together) and OUT/<scenario>/<agent>/seed<k>/ (each run's
directory).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gsim.bridges.closed_loop.agents import BUILTIN  # noqa: E402
from gsim.bridges.closed_loop.runner import run_batch  # noqa: E402
from gsim.bridges.closed_loop.scenario import SHIPPED  # noqa: E402

# "sensors" is the cameras and the LiDARs together: where numba's threading layer allows it they render at once
# (bridges.closed_loop.loop), and then their own times overlap
STAGES = ("agent", "dynamics", "sumo", "actors", "sensors", "cameras", "lidars", "metrics", "record")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/bench/closed_loop")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rows = run_batch(list(SHIPPED), list(BUILTIN), [a.seed], a.out, progress=False)
    print((Path(a.out) / "table.md").read_text())
    print("| scenario | agent | steps/s | " + " | ".join(f"{s} ms" for s in STAGES) + " |")
    for r in rows:
        t = r["timing_ms"]
        print(f"| {r['scenario']} | {r['agent']} | {1e3 / t['step']:.2f} | "
              + " | ".join(f"{t.get(s, 0.0):.1f}" for s in STAGES) + " |")
    step = np.median([r["timing_ms"]["step"] for r in rows])
    print(f"median step {step:.1f} ms: {1e3 / step:.2f} steps/s; shares: "
          + ", ".join(f"{s} {np.median([r['timing_ms'].get(s, 0.0) for r in rows]) / step:.0%}" for s in STAGES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
