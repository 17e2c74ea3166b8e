"""Off the driven path: (a) the reconstruction, (b) every render repaired, (c) the expanded scene, against the
synthetic street's exact images at the held-out frames (0 m) and shifted 1, 2 and 3 m to both sides.

Usage: python bench/bench_expand.py --recon out/demo/recon --log out/demo/log --model MODEL_DIR
       [--out out/bench/expand] [--shifts 1,2,3] [--iterations 300] [--every 3] [--pseudo-weight 0.5]
       [--fill-alpha 0.5]
The expansion (`gsim expand`) is timed; the repair time is the median of one 320x200-class render repaired
10 times. Writes OUT/bench.json and prints the table for BENCHMARKS.md."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from gsim.diffusion.expand import ExpandOptions, expand
from gsim.diffusion.repair import RepairModel
from gsim.images import render_image
from gsim.scenes.evaluation.evaluate import evaluate


def rows(m: dict, repaired: bool) -> dict:
    key = ("repaired_psnr", "repaired_ssim") if repaired else ("psnr", "ssim")
    out = {"0": (m[key[0]], m[key[1]])}
    out.update({f"{r['shift_m']:g}": (r[key[0]], r[key[1]]) for r in m["lane_shift"]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recon", required=True, help="a reconstruction directory (scene/ and checkpoint.safetensors)")
    ap.add_argument("--log", required=True)
    ap.add_argument("--model", required=True, help="a repair model directory (gsim diffusion train)")
    ap.add_argument("--out", default="out/bench/expand")
    ap.add_argument("--shifts", default="1,2,3")
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--pseudo-weight", type=float, default=0.5)
    ap.add_argument("--fill-alpha", type=float, default=0.5, help="holes below this alpha get new surfels (0: none)")
    args = ap.parse_args()
    out, shifts = Path(args.out), tuple(float(x) for x in args.shifts.split(","))
    model = RepairModel.load(args.model)
    base = evaluate(Path(args.recon) / "scene", args.log, out / "eval-a", shifts=shifts, repair=model)
    t0 = time.perf_counter()
    summary = expand(args.recon, args.log, model, out / "expanded",
                     ExpandOptions(shifts=shifts, iterations=args.iterations, every=args.every,
                                   pseudo_weight=args.pseudo_weight, fill_alpha=args.fill_alpha))
    wall = time.perf_counter() - t0
    exp = evaluate(out / "expanded" / "scene", args.log, out / "eval-c", shifts=shifts)
    v = base["views"][0]
    from gsim import load_scene
    from gsim.scenes.log import load_log
    log, scene = load_log(args.log), load_scene(Path(args.recon) / "scene")
    cam = log.cameras[v["sensor"]]
    T = log.T_world_vehicle(v["timestamp_us"]) @ cam.T_vehicle_camera
    rgb, alpha, depth = render_image(scene, cam.camera, T, v["timestamp_us"], v["sensor"])
    times = []
    for _ in range(10):
        t = time.perf_counter()
        model.repair_image(rgb, alpha, depth)
        times.append(time.perf_counter() - t)
    table = {"a": rows(base, False), "b": rows(base, True), "c": rows(exp, False)}
    result = {"recon": args.recon, "model": args.model, "shifts": shifts, "table": table,
              "expand_wall_s": round(wall, 1), "expand": summary,
              "repair_ms_median": round(1e3 * float(np.median(times)), 1), "image": [cam.camera.width, cam.camera.height]}
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    print("| where | (a) reconstruction PSNR / SSIM | (b) + render-time repair | (c) expanded scene |")
    print("|---|---|---|---|")
    for k in table["a"]:
        where = "0 m (held-out)" if k == "0" else f"{k} m"
        print(f"| {where} | " + " | ".join(f"{table[c][k][0]:.2f} / {table[c][k][1]:.3f}" for c in "abc") + " |")
    print(f"expansion {wall / 60:.1f} min; repair {result['repair_ms_median']} ms per "
          f"{cam.camera.width}x{cam.camera.height} image")
    return 0


if __name__ == "__main__":
    sys.exit(main())
