"""One off-path view as a figure: chosen panels of `gsim eval --shifts` runs' side-by-side images (OUT/offsets/)
and the truth, side by side, each titled with its label and its PSNR against the truth.

Usage: python bench/offpath_figure.py VIEW OUT.png LABEL=EVAL[:K] [LABEL=EVAL[:K] ...]
VIEW: the image name in the offsets/ folders, e.g. lane_shift_+0.0_+3.0_000016_front.png (3 m to the left of
held-out frame 16's front camera); each LABEL=EVAL[:K] shows the K-th panel of EVAL/offsets/VIEW (default 0, the
render; in an evaluation with --repair, 1 is the repaired render). Every evaluation must show the same truth.
README's figure: VIEW OUT "(a) reconstruction=EVAL_B" "(b) repaired=EVAL_B:1" "(c) expanded=EVAL_C"."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from gsim.images import image_metrics


def panels(folder: Path, view: str) -> list:
    """The panels of an evaluation's side-by-side image: render, (repaired,) truth, error."""
    repaired = "repaired_psnr" in json.loads((folder / "metrics.json").read_text())
    img = np.asarray(Image.open(folder / "offsets" / view).convert("RGB"))
    return np.split(img, 4 if repaired else 3, axis=1)


def main(argv) -> int:
    if len(argv) < 3:
        print(__doc__)
        return 2
    view, out, chosen, truth = argv[0], Path(argv[1]), [], None
    for arg in argv[2:]:
        label, _, where = arg.rpartition("=")
        folder, _, k = where.partition(":")
        parts = panels(Path(folder), view)
        if truth is not None and not np.array_equal(truth, parts[-2]):
            raise SystemExit(f"{view}: {folder}'s truth differs from the first evaluation's: not the same view")
        truth = parts[-2]
        chosen.append((f"{label} {image_metrics(parts[int(k or 0)] / 255.0, truth / 255.0)['psnr']:.2f} dB",
                       parts[int(k or 0)]))
    shown = []
    for title, x in chosen + [("truth", truth)]:
        band = Image.new("RGB", (x.shape[1], 16), "white")
        ImageDraw.Draw(band).text((3, 2), title, fill="black")
        shown.append(np.concatenate([np.asarray(band), x], 0))
    Image.fromarray(np.concatenate(shown, 1)).save(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
