"""The LiDAR sensor head: intensity and ray drop decoded from per-surfel features rendered along a ray.

Each surfel carries FEATURES learned features (`Surfels.features`); a ray composites them like its
range (alpha-weighted, divided by alpha). A small MLP maps [features, |cos incidence|, expected range /
RANGE_SCALE_M] to two logits: intensity (sigmoid: reflectance in [0,1], KITTI's convention) and ray
drop (sigmoid: the probability that the sensor reports nothing although a surface is there: dark,
specular or far surfaces). The same weights run in numpy (rendering) and torch (training).
Saved as JSON (``to_dict``/``from_dict`` with a schema_version) beside the scene.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gsim.errors import InputError
from gsim.io import check_schema_version, read_manifest, write_json
from gsim.render.common import to_device

SCHEMA_VERSION = 1
FEATURES = 8
HIDDEN = 32
RANGE_SCALE_M = 50.0
INPUTS = FEATURES + 2
WEIGHTS = ("w1", "b1", "w2", "b2")  # the fields of LidarHead, in order


def head_inputs(acc: dict, dirs):
    """(R, INPUTS) head inputs from a ray trace's accumulators (lidar.kernel's, or the torch twin's: alpha,
    range_sum, normal, features) and the rays' unit directions (R,3): the alpha-normalised features,
    |cos incidence| and expected range / RANGE_SCALE_M. numpy or torch alike."""
    a = acc["alpha"]
    safe = a + (a <= 0)  # 1 where nothing was hit: features and range stay 0
    n = acc["normal"]
    cos = abs((n * dirs).sum(-1)) / ((n * n).sum(-1) + 1e-24) ** 0.5  # (+ inside: a finite gradient at n = 0)
    parts = [acc["features"] / safe[:, None], cos[:, None], (acc["range_sum"] / safe / RANGE_SCALE_M)[:, None]]
    if isinstance(a, np.ndarray):
        return np.concatenate(parts, 1).astype(np.float32)
    import torch
    return torch.cat(parts, 1)


def mlp(x, w1, b1, w2, b2):
    """(R,2) logits [intensity, ray drop]; numpy or torch alike."""
    h = x @ w1 + b1
    h = h * (h > 0)  # ReLU that works for both
    return h @ w2 + b2


@dataclass(frozen=True, eq=False)
class LidarHead:
    """Weights of the head (numpy float32): w1 (INPUTS, HIDDEN), b1 (HIDDEN,), w2 (HIDDEN, 2), b2 (2,)."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray

    def __post_init__(self):
        shapes = {"w1": (INPUTS, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, 2), "b2": (2,)}
        for k, shape in shapes.items():
            v = np.asarray(getattr(self, k), np.float32)
            if v.shape != shape or not np.all(np.isfinite(v)):
                raise InputError(f"LidarHead.{k}: expected finite values of shape {shape}, got {v.shape}")
            object.__setattr__(self, k, v)

    @staticmethod
    def initial(seed: int = 0) -> "LidarHead":
        """Small random first layer, zero last layer: intensity 0.5 and drop probability 0.5 everywhere."""
        rng = np.random.default_rng(seed)
        return LidarHead(rng.normal(0, 1 / np.sqrt(INPUTS), (INPUTS, HIDDEN)), np.zeros(HIDDEN),
                         np.zeros((HIDDEN, 2)), np.zeros(2))

    def __call__(self, acc: dict, dirs):
        """(intensity (R,), drop probability (R,)) in [0,1] of traced rays (see `head_inputs`): numpy, or torch
        tensors on their device (a trace left on the GPU)."""
        x = head_inputs(acc, dirs)
        if isinstance(x, np.ndarray):
            p = 1.0 / (1.0 + np.exp(-mlp(x, self.w1, self.b1, self.w2, self.b2)))
        else:
            import torch
            p = torch.sigmoid(mlp(x.float(), *(to_device(getattr(self, k), x.device) for k in WEIGHTS)))
        return p[:, 0], p[:, 1]

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "features": FEATURES, "hidden": HIDDEN,
                **{k: getattr(self, k).tolist() for k in WEIGHTS}}

    @staticmethod
    def from_dict(d: dict, where: str = "LidarHead") -> "LidarHead":
        if not isinstance(d, dict):
            raise InputError(f"{where}: expected an object, got {type(d).__name__}")
        check_schema_version(d, (SCHEMA_VERSION,), where)
        if d.get("features") != FEATURES or d.get("hidden") != HIDDEN:
            raise InputError(f"{where}: this gsim reads heads with features={FEATURES}, hidden={HIDDEN}; got "
                             f"features={d.get('features')}, hidden={d.get('hidden')}")
        try:
            return LidarHead(*(np.asarray(d[k], np.float32) for k in WEIGHTS))
        except KeyError as e:
            raise InputError(f"{where}: missing field {e}") from None
        except (TypeError, ValueError) as e:
            raise InputError(f"{where}: {e}") from None

    def save(self, path) -> None:
        write_json(path, self.to_dict())

    @staticmethod
    def load(path) -> "LidarHead":
        return LidarHead.from_dict(read_manifest(path, "LiDAR head", (SCHEMA_VERSION,)), str(path))
