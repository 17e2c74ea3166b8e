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
`gsim.diffusion.repair.RepairModel` or `gsim.diffusion.pretrained.PretrainedRepair`. A repair model with
reference slots (`RepairConfig.references`) given the view (`Harmonizer`'s ``view``) also sees the log's real
images warped into it, as it does in evaluation: the real ground and light around the insertion. They are marked
invalid on the inserted objects' silhouettes, where the log saw what the insertion now hides.
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
              seed: int = 0, references=None, **region_kw) -> Tuple[np.ndarray, np.ndarray]:
    """(image (H,W,3) float32 in [0,1], region (H,W) float32): the render (rgb (H,W,3) in [0,1], alpha (H,W),
    depth (H,W) metres) repaired by ``repairer`` inside `region` (``object_mask``, ``region_kw``) with the
    region as its mask, given ``references`` where there are some (a repair model's: [(warped, valid)]); the
    render's own pixels outside it. An empty object mask returns the render itself (no model call)."""
    w = region(object_mask, **region_kw)
    if not w.any():
        return rgb, w
    more = {} if references is None else {"references": references}
    fixed = repairer.repair_image(rgb, alpha, depth, seed=seed, mask=w, **more)
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

    def __call__(self, rgb: np.ndarray, alpha: np.ndarray, depth: np.ndarray, object_mask: np.ndarray,
                 view=None) -> Tuple[np.ndarray, np.ndarray]:
        """``view``: (scene, log, camera, T_world_camera, timestamp_us, sensor) of the render, for a repair model
        with reference slots (`references`); other repairers ignore it."""
        return harmonize(rgb, alpha, depth, object_mask, self.repairer, self.seed,
                         self.references(view, alpha, depth, object_mask), dilate_px=self.dilate_px,
                         contact_px=self.contact_px, feather_px=self.feather_px)

    def references(self, view, alpha: np.ndarray, depth: np.ndarray, object_mask: np.ndarray):
        """The repair model's references for ``view`` (`gsim.diffusion.references.model_references`, the log's
        images at the render's scale), invalid on ``object_mask``; None for a repairer without reference slots
        or without a view."""
        config = getattr(self.repairer, "config", None)
        if view is None or not getattr(config, "references", 0):
            return None
        from .references import model_references
        scene, log, camera, T, t, sensor = view
        downscale = max(1, round(log.cameras[sensor].camera.width / camera.width))
        hidden = np.asarray(object_mask) > 0.5
        return [(warped, valid & ~hidden) for warped, valid in
                model_references(config, scene, log, camera, T, t, alpha, depth, sensor=sensor, downscale=downscale)]
