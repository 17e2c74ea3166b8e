"""Off the driven path, across synthetic seeds: reconstruct each street (the demo's `cpu` preset and steps), then
`gsim eval --shifts` against its exact images; a table of held-out and shifted PSNR, the far field / road / near
split and the depth-wrong share of the error, for BENCHMARKS.md.

Usage: python bench/bench_offpath.py OUT [--seeds 0,1,2,3,7] [--iterations 1500] [--shifts 1,2,3]
       [--set JSON] [--synth JSON] [--logs DIR] [--evaluate-only]
OUT/seedN/recon and OUT/seedN/eval per seed; OUT/offpath.json and OUT/offpath.md the table (PSNR held out and at each
shift; at 3 m the PSNR of the sky, far (beyond 40 m), road and near pixels, of the lane markings, the objects' edges
and what the training views saw only coarser (`error_split.DETAIL`) and their shares of the error, the depth-wrong
pixels' share of the error and the share of surface pixels within 5% of their depth, the LiDAR's Chamfer distance
against the exact sweep; the views left out; training seconds). --logs: where the synthetic logs are kept (default
OUT/logs; made when missing, reused when they are the seed's). --set overrides TrainConfig fields (nested ones as
dicts), e.g. '{"sky_weight": 0}'; --synth the streets' SynthOptions fields, e.g. '{"lidar_beams": 128}' (a log of
other options is made anew where one of the seed is kept). --evaluate-only: evaluate the reconstructions
already in OUT.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from gsim.errors import InputError
from gsim.io import write_bytes, write_json
from gsim.scenes.demo import DEMO_ITERATIONS
from gsim.scenes.evaluation.error_split import DETAIL
from gsim.scenes.evaluation.evaluate import evaluate
from gsim.scenes.reconstruction.train import preset, reconstruct
from gsim.scenes.synth import SynthOptions, reuse_or_synthesize


def _row(seed, m: dict, train_s) -> dict:
    at = {r["shift_m"]: r for r in m["lane_shift"]}
    at3 = at.get(3.0, {})
    return {"seed": seed, "held_out": m["psnr"], **{f"{d:g}m": r["psnr"] for d, r in at.items()},
            "left_out": sum(r["views_left_out"] for r in at.values()),
            **{f"3m_{k}": at3["regions"][k]["psnr"] for k in ("sky", "far", "road", "near") if "regions" in at3},
            **{f"3m_{k}": at3["detail"][k]["psnr"] for k in DETAIL if "detail" in at3},
            **{f"3m_{k}_err": at3["detail"][k]["error_share"] for k in DETAIL if "detail" in at3},
            "3m_wrong_err": at3.get("geometry", {}).get("wrong", {}).get("error_share"),
            "3m_within_5pct": at3.get("depth_within_5pct"),
            "3m_lidar_chamfer": at3.get("lidar", {}).get("chamfer_m"), "train_s": train_s}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--seeds", default="0,1,2,3,7")
    ap.add_argument("--iterations", type=int, default=DEMO_ITERATIONS)
    ap.add_argument("--shifts", default="1,2,3")
    ap.add_argument("--set", type=json.loads, default={}, metavar="JSON", help="TrainConfig fields to override")
    ap.add_argument("--synth", type=json.loads, default={}, metavar="JSON", help="SynthOptions fields to override")
    ap.add_argument("--logs", help="where the synthetic logs are kept (default OUT/logs)")
    ap.add_argument("--evaluate-only", action="store_true")
    args = ap.parse_args(argv)
    out, shifts = Path(args.out), [float(s) for s in args.shifts.split(",")]
    logs = Path(args.logs) if args.logs else out / "logs"
    try:
        options = SynthOptions(**args.synth)
    except (TypeError, InputError) as e:  # a field SynthOptions does not have, or a bad value
        ap.error(f"--synth: {e}")
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        log, here = reuse_or_synthesize(logs / f"seed{seed}", seed, options)[0], out / f"seed{seed}"
        train_s = None
        if not args.evaluate_only:
            cfg = preset("cpu", seed=seed, iterations=args.iterations).with_overrides(args.set)
            t0 = time.perf_counter()
            reconstruct(log, here / "recon", cfg)
            train_s = round(time.perf_counter() - t0, 1)
            write_json(here / "train_time.json", {"train_s": train_s})
        elif (here / "train_time.json").exists():
            train_s = json.loads((here / "train_time.json").read_text())["train_s"]
        m = evaluate(here / "recon" / "scene", log, here / "eval", shifts=shifts)
        rows.append(_row(seed, m, train_s))
        print(json.dumps(rows[-1]), flush=True)
    keys = [k for k in rows[0] if k != "seed"]
    mean = {"seed": "mean", **{k: float(np.mean([r[k] for r in rows if r.get(k) is not None]))
                               if any(r.get(k) is not None for r in rows) else None for k in keys}}
    fmt = lambda x: "-" if x is None else f"{x:.2f}" if isinstance(x, float) else str(x)  # noqa: E731
    table = ["| seed | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 1)]
    table += ["| " + " | ".join(fmt(r.get(k)) for k in ["seed"] + keys) + " |" for r in rows + [mean]]
    write_json(out / "offpath.json", {"set": args.set, "synth": args.synth, "iterations": args.iterations,
                                      "rows": rows, "mean": mean})
    write_bytes(out / "offpath.md", ("\n".join(table) + "\n").encode())
    print("\n".join(table))
    return mean


if __name__ == "__main__":
    main()
