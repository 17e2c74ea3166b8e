"""Harmonization of inserted objects: the image region around each object the editing pipeline inserted is
repaired by a diffusion model (partial noising inside a mask, conditioned on the render), the rest of the
render is kept.

Why: an inserted asset is lit and exposed as its source was, not as the scene (`gsim.editing.edits`
only matches global colour statistics), and its contact with the ground (the shadow under it, the
occlusion where tyres meet the road) is a crude translucent patch. The repair model has learnt what this
scene's camera images look like from their renders, so noising the object and a band of ground below it
and denoising conditioned on the render brings exposure, colour and contact towards the scene's own.

The region (`region`) is the objects' silhouettes dilated, plus a band below each silhouette's lower
edge (where the object meets the ground: shadow and contact), with feathered edges. The repairer noises
and blends with the region as weight; outside the region the render is kept by definition: `harmonize`
puts its pixels back there whatever the repairer did (a latent-space model cannot keep pixels exactly).

A repairer is anything with ``repair_image(rgb, alpha, depth, seed=0, mask=None) -> rgb``:
`gsim.diffusion.repair.RepairModel` or `gsim.diffusion.pretrained.PretrainedRepair`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Tuple

import numpy as np
from gsim.errors import InputError


def region(object_mask: np.ndarray, dilate_px: int = 6, contact_px: int = 8, feather_px: int = 3) -> np.ndarray:
    """(H,W) float32 in [0,1]: the objects' pixels (``object_mask`` (H,W), bool or > 0.5) dilated by
    ``dilate_px`` (a disc), plus the ``contact_px`` rows below each object pixel (the band under a lower
    edge), then feathered inwards: the weight is k / feather_px at the k-th pixel from the region's edge,
    up to 1 (so the objects themselves stay at 1 when dilate_px >= feather_px). An empty mask gives
    zeros."""
    from scipy.ndimage import distance_transform_edt
    m = np.asarray(object_mask)
    if m.ndim != 2:
        raise InputError(f"region: expected an (H,W) object mask, got shape {m.shape}")
    if min(dilate_px, contact_px, feather_px) < 0:
        raise InputError(f"region: pixel widths must be >= 0, got dilate_px={dilate_px}, contact_px={contact_px}, "
                         f"feather_px={feather_px}")
    m = m > 0.5 if m.dtype != bool else m
    if not m.any():
        return np.zeros(m.shape, np.float32)
    hard = distance_transform_edt(~m) <= dilate_px
    for k in range(1, contact_px + 1):  # image rows go down: the ground is below the object
        hard[k:] |= m[:-k]
    # distance to the nearest pixel outside the region (the image border is not an edge: no fade there)
    return np.minimum(distance_transform_edt(hard) / max(feather_px, 1), 1.0).astype(np.float32)


def harmonize(rgb: np.ndarray, alpha: np.ndarray, depth: np.ndarray, object_mask: np.ndarray, repairer,
              seed: int = 0, **region_kw) -> Tuple[np.ndarray, np.ndarray]:
    """(image (H,W,3) float32 in [0,1], region (H,W) float32): the render (rgb (H,W,3) in [0,1], alpha (H,W),
    depth (H,W) metres) repaired by ``repairer`` inside `region` (``object_mask``, ``region_kw``) with the
    region as its mask; the render's own pixels outside it. An empty object mask returns the render itself
    (no model call)."""
    w = region(object_mask, **region_kw)
    if not w.any():
        return rgb, w
    fixed = repairer.repair_image(rgb, alpha, depth, seed=seed, mask=w)
    return np.where(w[..., None] > 0, fixed, rgb).astype(np.float32), w


@dataclass(frozen=True)
class Harmonizer:
    """What `gsim.editing.outputs.render_world` takes: a repairer, where it came from (a model directory,
    written in the output's notes), the seed and the region's widths (px)."""
    repairer: Any
    source: str
    seed: int = 0
    dilate_px: int = 6
    contact_px: int = 8
    feather_px: int = 3

    def __call__(self, rgb: np.ndarray, alpha: np.ndarray, depth: np.ndarray,
                 object_mask: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        return harmonize(rgb, alpha, depth, object_mask, self.repairer, self.seed, dilate_px=self.dilate_px,
                         contact_px=self.contact_px, feather_px=self.feather_px)
