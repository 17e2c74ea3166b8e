"""Repair models by their references (issue 36's ablation): for each K, a model trained with K references warped
through --depth, then evaluated held out and shifted 1-3 m to both sides against the synthetic street's truth.

Usage: python bench/bench_repair_references.py RECON LOG --out DIR [--k 0,1,2] [--depth lidar] [--steps 600]
RECON: a reconstruction directory (its scene/); LOG: its (synthetic) log. The protocol: the log's every-2 degraded
reconstruction's pairs and the scene's (DIR/work keeps the degraded reconstruction: a rerun reuses it), L2, lr 2e-3;
each model goes to DIR/model-kK, its evaluation to DIR/eval-kK. Prints a row per K (the render's PSNR, then the
repaired one's at 0 / 1 / 2 / 3 m, and the training loss) and writes DIR/bench.json."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from gsim.diffusion.repair import RepairConfig, RepairModel
from gsim.diffusion.train import TrainOptions, train
from gsim.scenes.evaluation.evaluate import evaluate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recon", type=Path)
    ap.add_argument("log", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--k", default="0,1,2")
    ap.add_argument("--depth", choices=("lidar", "render"), default="lidar")
    ap.add_argument("--steps", type=int, default=600)
    a = ap.parse_args(argv)
    opts = TrainOptions(steps=a.steps, lr=2e-3, degraded=((2, 500),), extrapolated=())
    rows = []
    for k in (int(x) for x in a.k.split(",")):
        t0 = time.perf_counter()
        card = train(a.recon / "scene", a.log, a.out / f"model-k{k}", opts,
                     RepairConfig(loss="l2", references=k, reference_depth=a.depth), work=a.out / "work")
        t1 = time.perf_counter()
        m = evaluate(a.recon / "scene", a.log, a.out / f"eval-k{k}", shifts=(1.0, 2.0, 3.0),
                     repair=RepairModel.load(a.out / f"model-k{k}"))
        at = lambda key: [round(m[key], 2)] + [round(r[key], 2) for r in m["lane_shift"]]  # noqa: E731
        rows.append({"k": k, "depth": a.depth, "render_psnr": at("psnr"), "repaired_psnr": at("repaired_psnr"),
                     "repaired_ssim": at("repaired_ssim"), "loss": [card["loss_first_100"], card["loss_last_100"]],
                     "train_s": round(t1 - t0, 1), "eval_s": round(time.perf_counter() - t1, 1)})
        r = rows[-1]
        print(f"| K = {k} ({a.depth}) | render {r['render_psnr']} | repaired {r['repaired_psnr']} | loss "
              f"{r['loss'][0]:.4f} -> {r['loss'][1]:.4f} | train {r['train_s']} s, eval {r['eval_s']} s |", flush=True)
    (a.out / "bench.json").write_text(json.dumps({"recon": str(a.recon), "log": str(a.log), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
