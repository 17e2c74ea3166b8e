"""One off-path view as a figure: (a) the reconstruction, (b) its render repaired, (c) the expanded scene and the
truth, side by side and labelled, from the side-by-side images `gsim eval --shifts` writes (OUT/offsets/).

Usage: python bench/offpath_figure.py EVAL_B EVAL_C VIEW OUT.png
EVAL_B: `gsim eval` of the reconstruction with --repair (its images: render | repaired | truth | error); EVAL_C:
`gsim eval` of the expanded scene (render | truth | error); VIEW: the image name in both offsets/ folders, e.g.
lane_shift_+0.0_+3.0_000016_front.png (3 m to the left of held-out frame 16's front camera). Each panel is titled
with its PSNR against the truth."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from gsim.images import image_metrics


def panels(path: Path, n: int) -> list:
    img = np.asarray(Image.open(path).convert("RGB"))
    w = img.shape[1] // n
    return [img[:, k * w:(k + 1) * w] for k in range(n)]


def main(argv) -> int:
    if len(argv) != 4:
        print(__doc__)
        return 2
    eval_b, eval_c, view, out = Path(argv[0]), Path(argv[1]), argv[2], Path(argv[3])
    a, b, truth, _ = panels(eval_b / "offsets" / view, 4)
    c, truth_c, _ = panels(eval_c / "offsets" / view, 3)
    if not np.array_equal(truth, truth_c):
        raise SystemExit(f"{view}: the two evaluations' truths differ: not the same view")
    gt = truth / 255.0
    shown = []
    for name, x in (("(a) reconstruction", a), ("(b) repaired", b), ("(c) expanded", c), ("truth", truth)):
        title = name if x is truth else f"{name} {image_metrics(x / 255.0, gt)['psnr']:.2f} dB"
        band = Image.new("RGB", (x.shape[1], 16), "white")
        ImageDraw.Draw(band).text((3, 2), title, fill="black")
        shown.append(np.concatenate([np.asarray(band), x], 0))
    Image.fromarray(np.concatenate(shown, 1)).save(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
