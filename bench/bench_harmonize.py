"""Harmonization on the shipped scenarios (issue 36, item 4): how an inserted actor's image relates to its
surroundings before and after harmonization, beside the reconstructed actors of the same frames (the log's own
cars, learnt from its real images: what an actor in this scene looks like against its surroundings).

Usage: python bench/bench_harmonize.py --model MODEL [--scenarios cut_in,crossing,roadworks] [--every 2] --out DIR
Each scenario (scenarios/NAME.yaml, on the demo street) is rendered with its cameras only, every --every-th frame,
harmonized by the repair model MODEL (a model with reference slots sees the log's images around the insertion).
Per visible actor and frame (at least 100 pixels of the instance masks), on the images as written:
- exposure: log2 of the mean luma (0.299 R + 0.587 G + 0.114 B) over the actor's pixels over that of its ring
  (the pixels 3 to 15 px from it that no actor owns), in stops;
- colour: the distance between the actor's and its ring's mean chromaticity, (r, g) / (r + g + b);
- contact: log2 of the mean luma of the band under the actor (up to 6 px below its lowest pixel in each column,
  owned by no actor) over its ring's: a car's contact shadow is darker than the ground around it.
Prints the medians over the inserted actors before (render/) and after (log/cameras/) harmonization and over the
reconstructed ones (which harmonization leaves alone), and writes DIR/bench.json with every value."""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image
from scipy.ndimage import distance_transform_edt

from gsim.diffusion.harmonize import Harmonizer
from gsim.diffusion.repair import RepairModel
from gsim.editing.outputs import render_world
from gsim.editing.scenario import load_scenario
from gsim.editing.world import apply

ROOT = Path(__file__).resolve().parents[1]
LUMA = np.array([0.299, 0.587, 0.114])


def stats(img: np.ndarray, mask: np.ndarray, k: int):
    """(exposure, colour, contact) of instance k in ``img`` (H,W,3) in [0,1]; None where it has under 100 pixels."""
    obj = mask == k
    if obj.sum() < 100:
        return None
    dist = distance_transform_edt(~obj)
    ring = (dist >= 3) & (dist <= 15) & (mask == 0)
    band = np.zeros_like(obj)
    for col in np.nonzero(obj.any(0))[0]:
        low = np.nonzero(obj[:, col])[0].max()
        band[low + 1:low + 7, col] = True
    band &= mask == 0
    if ring.sum() < 50 or band.sum() < 10:
        return None
    luma = img @ LUMA
    chroma = img[..., :2] / np.maximum(img.sum(-1, keepdims=True), 1e-6)
    eps = 1e-4
    return (float(np.log2((luma[obj].mean() + eps) / (luma[ring].mean() + eps))),
            float(np.linalg.norm(chroma[obj].mean(0) - chroma[ring].mean(0))),
            float(np.log2((luma[band].mean() + eps) / (luma[ring].mean() + eps))))


def read(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), np.float32) / 255


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--scenarios", default="cut_in,crossing,roadworks")
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    h = Harmonizer(RepairModel.load(a.model), a.model)
    rows = {"inserted_before": [], "inserted_after": [], "reconstructed": []}
    walls = {}
    for name in a.scenarios.split(","):
        sc = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
        sc = sc.model_copy(update={"sensors": sc.sensors.model_copy(update={"lidars": [], "video": False}),
                                   "time": sc.time.model_copy(update={"every": a.every}),
                                   "output": str(a.out / name)})
        t0 = time.perf_counter()
        world = apply(sc)
        out = render_world(world, sc, harmonizer=h)
        walls[name] = round(time.perf_counter() - t0, 1)
        inserted = {k + 1 for k, actor in enumerate(world.scene.actors) if actor.id in world.inserted}
        for before in sorted((out / "render").glob("*/*.png")):
            cam_frame = before.relative_to(out / "render")
            mask = np.asarray(Image.open(out / "masks" / cam_frame)).astype(np.int64)
            after = read(out / "log" / "cameras" / cam_frame)
            for k in (int(x) for x in np.unique(mask) if x):
                if k in inserted:
                    for key, img in (("inserted_before", read(before)), ("inserted_after", after)):
                        s = stats(img, mask, k)
                        if s is not None:
                            rows[key].append(s)
                else:
                    s = stats(after, mask, k)
                    if s is not None:
                        rows["reconstructed"].append(s)
    med = {key: [round(statistics.median(r[i] for r in v), 4) if v else None for i in range(3)]
           for key, v in rows.items()}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "bench.json").write_text(json.dumps({"model": a.model, "wall_s": walls, "medians": med,
                                                  "rows": rows}, indent=1))
    print("| actors | count | exposure vs ring (stops) | colour distance | contact band vs ring (stops) |")
    print("|---|---|---|---|---|")
    for key, v in rows.items():
        print(f"| {key} | {len(v)} | " + " | ".join(str(x) for x in med[key]) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
