"""Checks shared by the dataset converters' tests (tests/test_convert*.py): a converted log is right when its
LiDAR points land where the dataset's own formula puts them and on image edges, consecutive sweeps agree in the
world on static structure, and its boxes lie on the objects. Overlays go to tmp_path and, for a human, to
/tmp/gsim_overlays/."""
import itertools
import shutil
from pathlib import Path

import numpy as np

from gsim.scenes.overlay import draw_dots, in_camera, range_colours, sweep_in_world

DATA = Path(__file__).parents[1].parent / "shared" / "data"
OVERLAYS = Path("/tmp/gsim_overlays")


def project(log, frame, camera: str, lidar: str):
    """Sweep points projected through the log: (pixels, valid and inside the image, camera-frame points)."""
    return in_camera(log, frame.cameras[camera], sweep_in_world(log, frame.lidars[lidar]))


def write_overlay(rgb, uv, depth, name, tmp_path):
    """Points coloured by depth (red near, blue far) over the image, into tmp_path and /tmp/gsim_overlays/."""
    img = (np.asarray(rgb) * 255).astype(np.uint8)
    draw_dots(img, uv, range_colours(depth, 2.0, 42.0), 2 if img.shape[1] < 1500 else 4)  # dots seen at any size
    save_picture(img, name, tmp_path)


def save_picture(img, name, tmp_path):
    """uint8 (H,W,3) into tmp_path/name and /tmp/gsim_overlays/name."""
    from PIL import Image
    Image.fromarray(img).save(tmp_path / name, compress_level=1)
    OVERLAYS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tmp_path / name, OVERLAYS / name)


def edge_score(rgb, uv, pc, shift=(0.0, 0.0)):
    """Mean image gradient under the projected depth discontinuities (range jumps > 1 m between
    consecutive points of a scan line): large when LiDAR silhouettes sit on image edges."""
    r = np.linalg.norm(pc, axis=1)
    jump = np.r_[False, np.abs(np.diff(r)) > 1.0]
    uv = uv + shift
    h, w = rgb.shape[:2]
    keep = jump & (pc[:, 2] > 1) & (uv[:, 0] >= 0) & (uv[:, 0] < w) & (uv[:, 1] >= 0) & (uv[:, 1] < h)
    gy, gx = np.gradient(rgb.mean(2))
    ij = np.floor(uv[keep]).astype(int)
    return np.hypot(gx, gy)[ij[:, 1], ij[:, 0]].mean()


def voxel_overlap(ref, pts, voxel=0.2):
    """Fraction of ``pts`` within one voxel of a ``ref`` point (both (N,3) world, metres)."""
    def key(q):
        q = q + (1 << 20)
        return (q[:, 0] << 42) | (q[:, 1] << 21) | q[:, 2]
    r = np.floor(ref / voxel).astype(np.int64)
    near = np.unique(np.concatenate([key(r + d) for d in itertools.product((-1, 0, 1), repeat=3)]))
    return np.isin(key(np.floor(pts / voxel).astype(np.int64)), near).mean()


def outside_actors(log, world, timestamp_us, margin=0.5):
    """(N,) bool: world points outside every actor's box (grown by ``margin`` metres) at the time: static
    structure, where two sweeps must agree."""
    keep = np.ones(len(world), bool)
    for a in log.actors:
        if not a.timestamps_us[0] - 200_000 <= timestamp_us <= a.timestamps_us[-1] + 200_000:
            continue
        T = np.linalg.inv(a.pose_at(timestamp_us))
        local = world @ T[:3, :3].T + T[:3, 3]
        keep &= ~np.all(np.abs(local) <= np.asarray(a.size) / 2 + margin, axis=1)
    return keep


def sweep_agreement(log, obs_a, obs_b, max_range=40.0):
    """Median distance (metres) from each static point of sweep b (world frame, within ``max_range`` of the
    sensor, outside the actors' boxes) to its nearest static point of sweep a: a few centimetres when the poses,
    the extrinsics and the per-point times are right."""
    from scipy.spatial import cKDTree
    pts = []
    for obs in (obs_a, obs_b):
        sweep = log.sweep(obs)
        w = sweep_in_world(log, obs, sweep)
        keep = (np.linalg.norm(sweep[:, :3], axis=1) < max_range) & outside_actors(log, w, obs.timestamp_us)
        pts.append(w[keep])
    d, _ = cKDTree(pts[0]).query(pts[1], k=1)
    return float(np.median(d))


def box_iou_2d(a, b):
    """IoU of two (x1, y1, x2, y2) image boxes."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0
