"""Expansion across synthetic seeds: for each seed, `gsim synth`, `gsim reconstruct` (cpu preset), `gsim expand
--shifts 1,2,3` with one repair model, and `gsim eval --shifts 1,2,3` on the reconstruction and the expanded
scene; prints the table (held out / 1 / 2 / 3 m, PSNR dB, and what each stage did) and writes OUT/bench.json.

Usage: python bench/bench_expand_seeds.py --model MODEL_DIR [--seeds 0,1,2,7] [--out out/bench/expand-seeds]
       [--iterations 1500]
Steps whose output exists are not redone (a stopped run continues; delete SEED/exp to re-expand with other code).
MODEL_DIR: a repair model (`gsim diffusion train RECON/scene LOG --out MODEL_DIR`, on any one of the seeds)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def gsim(*args) -> None:
    print("+ gsim", *args, flush=True)
    subprocess.run([sys.executable, "-m", "gsim.cli", *map(str, args)], check=True)


def psnrs(eval_dir: Path) -> list:
    m = json.loads((eval_dir / "metrics.json").read_text())
    return [m["psnr"]] + [r["psnr"] for r in m["lane_shift"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--seeds", default="0,1,2,7")
    ap.add_argument("--out", default="out/bench/expand-seeds")
    ap.add_argument("--iterations", type=int, default=1500)
    args = ap.parse_args()
    rows = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        d = Path(args.out) / f"seed{seed}"
        steps = [(d / "log" / "log.json", ("synth", d / "log", "--seed", seed)),
                 (d / "recon" / "scene", ("reconstruct", d / "log", d / "recon", "--preset", "cpu", "--iterations",
                                          args.iterations)),
                 (d / "eval-recon" / "metrics.json", ("eval", d / "recon" / "scene", d / "log", "--out",
                                                      d / "eval-recon", "--shifts", "1,2,3")),
                 (d / "exp" / "expand.json", ("expand", d / "recon", d / "log", "--repair", args.model, "--shifts",
                                              "1,2,3", "--out", d / "exp", "--allow-worse")),
                 (d / "eval-exp" / "metrics.json", ("eval", d / "exp" / "scene", d / "log", "--out", d / "eval-exp",
                                                    "--shifts", "1,2,3"))]
        for done, cmd in steps:
            if not done.exists():
                gsim(*cmd)
        stages = json.loads((d / "exp" / "expand.json").read_text())["stages"]
        rows[seed] = {"reconstruction": psnrs(d / "eval-recon"), "expanded": psnrs(d / "eval-exp"), "stages": stages}
    (Path(args.out) / "bench.json").write_text(json.dumps(rows, indent=1))
    print("| seed | reconstruction: held out / 1 / 2 / 3 m | expanded | stages (first-50 loss, poses blocked) |")
    print("|---|---|---|---|")
    for seed, r in rows.items():
        f = lambda xs: " / ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        st = ", ".join(f"{s['shift_m']:g} m {'kept' if s.get('kept', True) else 'undone'} "
                       f"({s['loss_first_50'] or float('nan'):.3g}, {s.get('poses_blocked', '-')})"
                       for s in r["stages"])
        print(f"| {seed} | {f(r['reconstruction'])} | {f(r['expanded'])} | {st} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
