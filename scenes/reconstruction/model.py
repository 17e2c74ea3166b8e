"""The trainable scene: raw surfel parameters, actor ownership, sky and per-camera affines.

All surfels live in one set of raw tensors (means, quats, log-scales, logit-opacities,
SH colours, LiDAR features) with an ``owner`` per surfel: -1 for the background (world frame), k for
actor k (its box frame, placed by its track at render time). One set keeps densification
and the optimiser state in one place. `surfels_at(t)` gives differentiable world surfels.

Each track's poses are refined (as Street Gaussians do): a learnt offset in the box frame (dx, dy, dz
metres, yaw radians) at knot times, interpolated linearly between them. Boxes fitted to LiDAR (or
annotated) are off by centimetres, which at 10 m blurs an actor over several pixels. The knots are the
training views' times, so a held-out time between two training frames takes their offsets' blend (a
knot per track pose would leave the held-out poses at zero while their neighbours moved).

The log's own poses are refined the same way (nerfstudio's and gsplat's camera optimisation): at each
training view's time a small rigid correction of the world about the camera (rotation vector and
translation, world axes), learnt with the surfels. Odometry and calibration are off by a tenth of a
degree (KITTI's kiss-icp poses: a fixed scene renders 0.3-0.9 dB better after such a nudge), which
blurs everything the views disagree on. The scene keeps the corrections (`Scene.pose_corrections`);
a held-out view takes the blend of its neighbours', as the tracks' offsets do.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from gsim.appearance import IDENTITY_AFFINE, Sky
from gsim.errors import InputError
from gsim.lidar.heads import FEATURES, WEIGHTS, LidarHead
from gsim.render.common import to_device
from gsim.render.torch_backend import quat_to_rotmat
from gsim.scene import Actor, Scene
from gsim.surfels import Surfels, move_rows
from gsim.transforms import bracket, quat_multiply, rotmat_to_quat

from ..log import ActorTrack

PARAMS = ("means", "quats", "log_scales", "logit_opacities", "sh", "features")
SKY_SHAPE = (32, 64)


def _yaw(a: torch.Tensor) -> torch.Tensor:
    """(..., 3, 3) rotations about z by ``a`` radians."""
    c, s, o, z = torch.cos(a), torch.sin(a), torch.ones_like(a), torch.zeros_like(a)
    return torch.stack([torch.stack([c, -s, z], -1), torch.stack([s, c, z], -1), torch.stack([z, z, o], -1)], -2)


def _view_knots(times_us: Sequence[int], centres: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Unique knot times and the first camera centre given at each."""
    times, first = np.unique(np.asarray(times_us, np.int64), return_index=True)
    return times, np.asarray(centres, np.float64)[first]


class SceneModel:
    """Raw parameters (``params``: name -> leaf tensor) plus the fixed actor tracks and owners."""

    def __init__(self, params: Dict[str, torch.Tensor], owner: torch.Tensor, tracks: Sequence[ActorTrack],
                 sky: torch.Tensor, affine: Dict[str, torch.Tensor], head: Dict[str, torch.Tensor],
                 pose_offsets: Optional[Dict[str, torch.Tensor]] = None,
                 pose_knots: Optional[Dict[str, np.ndarray]] = None,
                 view_knots: Optional[Tuple[np.ndarray, np.ndarray]] = None,
                 view_offsets: Optional[Dict[str, torch.Tensor]] = None):
        self.params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        # per track: knot times (default: its own pose times) and an offset (dx, dy, dz, dyaw) at each
        self.pose_knots = {t.id: np.asarray((pose_knots or {}).get(t.id, t.timestamps_us), np.int64) for t in tracks}
        offsets = pose_offsets or {}
        self.pose_offsets = {t.id: (offsets[t.id] if t.id in offsets else torch.zeros(len(self.pose_knots[t.id]), 4))
                             .detach().clone().requires_grad_(True) for t in tracks}
        self.head = {k: v.detach().clone().requires_grad_(True) for k, v in head.items()}
        self.owner = owner.clone()
        # (owner, its actor rows, their owners): looked up once per densification, not with a host sync every step
        # (owner is replaced, never written to, so its identity says whether they are current)
        self._actor_rows = (None, None, None)
        self.tracks: List[ActorTrack] = list(tracks)
        self._track_poses = {}  # (time, device, dtype) -> the tracks' logged poses there (`_logged_poses`)
        self.sky = sky.detach().clone().requires_grad_(True)
        self.affine = {c: a.detach().clone().requires_grad_(True) for c, a in affine.items()}
        # the views' pose corrections: knot times (K,), the camera centres they turn about (K,3), and
        # offsets "rot" (K,3) rotation vectors (rad) and "trans" (K,3) translations (m), world axes
        times, centres = view_knots if view_knots is not None else (np.zeros(0, np.int64), np.zeros((0, 3)))
        self.view_knots = (np.asarray(times, np.int64), np.asarray(centres, np.float64))
        self.view_offsets = {k: (view_offsets[k] if view_offsets else torch.zeros(len(times), 3))
                             .detach().clone().requires_grad_(True) for k in ("rot", "trans")}

    @staticmethod
    def from_surfels(background: Surfels, actors: Dict[str, Surfels], tracks: Sequence[ActorTrack],
                     cameras: Sequence[str], knots_us: Optional[Sequence[int]] = None,
                     sky_rgb=(0.6, 0.7, 0.85), view_centres: Optional[np.ndarray] = None) -> "SceneModel":
        """Background (world) and actor (box frame) surfels; actors without surfels are dropped.
        ``knots_us``: the times the pose offsets are learnt at (the training views'; default: each
        track's pose times), clamped to each track's span. ``view_centres``: (len(knots_us),3) camera
        centres at those times: the views' pose corrections are learnt there (None: no corrections)."""
        tracks = [t for t in tracks if len(actors.get(t.id, ())) > 0]
        knots = None if knots_us is None else {
            t.id: np.unique(np.clip(np.asarray(knots_us, np.int64), t.timestamps_us[0], t.timestamps_us[-1]))
            for t in tracks}
        parts = [background] + [actors[t.id] for t in tracks]
        owner = np.concatenate([np.full(len(p), k - 1) for k, p in enumerate(parts)])
        s = Surfels.concatenate([p.numpy() for p in parts])
        op = np.clip(s.opacities.astype(np.float64), 1e-4, 1 - 1e-4)
        raw = {"means": s.means, "quats": s.quats, "log_scales": np.log(s.scales),
               "logit_opacities": np.log(op / (1 - op)), "sh": s.colors,
               "features": np.zeros((len(s.means), FEATURES), np.float32)}
        sky = np.broadcast_to(np.asarray(sky_rgb, np.float32), SKY_SHAPE + (3,)).copy()
        return SceneModel({k: torch.tensor(np.asarray(v), dtype=torch.float32) for k, v in raw.items()},
                          torch.as_tensor(owner, dtype=torch.int64), tracks, torch.from_numpy(sky),
                          {c: torch.tensor(IDENTITY_AFFINE, dtype=torch.float32) for c in cameras},
                          {k: torch.from_numpy(getattr(LidarHead.initial(), k)) for k in WEIGHTS}, pose_knots=knots,
                          view_knots=None if view_centres is None else _view_knots(knots_us, view_centres))

    @staticmethod
    def from_state(state: dict, tracks: Sequence[ActorTrack], cameras: Sequence[str]) -> "SceneModel":
        """The inverse of `state_dict`, given the log's tracks (matched by the saved actor ids) and cameras (each
        camera of the checkpoint must be one of them: its appearance is learnt per camera)."""
        unknown = sorted(set(state["affine"]) - set(cameras))
        if unknown:
            raise InputError(f"checkpoint: cameras {unknown} are not in this log (it has {sorted(cameras)}): a "
                             f"checkpoint continues on the log it was trained on")
        by_id = {t.id: t for t in tracks}
        missing = [i for i in state["track_ids"] if i not in by_id]
        if missing:
            raise InputError(f"checkpoint: actors {missing} are not tracked in this log")
        return SceneModel(state["params"], state["owner"], [by_id[i] for i in state["track_ids"]], state["sky"],
                          state["affine"], state["head"], state.get("pose_offsets"), state.get("pose_knots"),
                          state.get("view_knots"), state.get("view_offsets"))

    def __len__(self) -> int:
        return len(self.owner)

    @property
    def device(self) -> torch.device:
        return self.owner.device

    def to(self, device) -> "SceneModel":
        """Every tensor moved to ``device`` (in place; leaves stay leaves): the cuda preset trains on the GPU."""
        leaf = lambda t: t.detach().to(device).requires_grad_(True)  # noqa: E731
        self.params = {k: leaf(v) for k, v in self.params.items()}
        self.pose_offsets = {i: leaf(v) for i, v in self.pose_offsets.items()}
        self.head = {k: leaf(v) for k, v in self.head.items()}
        self.affine = {c: leaf(a) for c, a in self.affine.items()}
        self.sky = leaf(self.sky)
        self.view_offsets = {k: leaf(v) for k, v in self.view_offsets.items()}
        self.owner = self.owner.to(device)
        return self

    def extra_params(self) -> Dict[str, torch.Tensor]:
        return {"sky": self.sky, **{f"affine/{c}": a for c, a in self.affine.items()},
                **{f"head/{k}": v for k, v in self.head.items()},
                **{f"pose/{i}": v for i, v in self.pose_offsets.items()},
                **{f"view/{k}": v for k, v in self.view_offsets.items()}}

    def activated(self) -> Surfels:
        p = self.params
        return Surfels.derived(p["means"], torch.nn.functional.normalize(p["quats"], dim=-1),
                               torch.exp(p["log_scales"]), torch.sigmoid(p["logit_opacities"]), p["sh"], p["features"])

    def surfels_at(self, timestamp_us: int) -> Surfels:
        """World-frame surfels at ``timestamp_us``, differentiable in every raw parameter.

        Only actor surfels are gathered and moved (one batched rotation by owner), so the cost
        grows with the actors' surfels, not with the background."""
        s = self.activated()
        if self._actor_rows[0] is not self.owner:
            act = torch.nonzero(self.owner >= 0)[:, 0]
            self._actor_rows = (self.owner, act, self.owner[act])
        _, act, owner = self._actor_rows
        if len(act) == 0:
            return s
        R, t, q = self._poses_at(timestamp_us, s.means.dtype)
        return move_rows(s, act, owner, R, t, q)

    def corrected(self, s: Surfels, timestamp_us: int) -> Surfels:
        """``s`` moved by the correction of the training view at ``timestamp_us`` (differentiable in it): rendering
        these from the log's camera pose is rendering ``s`` from the corrected one. (A view-dependent colour is
        not turned: the corrections are tenths of a degree.) Unchanged without corrections."""
        if not len(self.view_knots[0]):
            return s
        k = int(np.searchsorted(self.view_knots[0], timestamp_us))
        if k == len(self.view_knots[0]) or self.view_knots[0][k] != timestamp_us:
            raise ValueError(f"no view pose correction is learnt at {timestamp_us} us (not a training view's time)")
        R, q, t = self._view_transforms(k)
        return Surfels.derived(s.means @ R.T + t, quat_multiply(q.expand_as(s.quats), s.quats), s.scales,
                               s.opacities, s.colors, s.features)

    def _view_transforms(self, k):
        """(R (...,3,3), q (...,4), t (...,3)): the world's correction x -> R x + t at knot k (an index, or a
        slice: the knots at once; other times blend the corrected poses: `Scene.log_pose`)."""
        rot, trans = self.view_offsets["rot"][k], self.view_offsets["trans"][k]
        c = to_device(self.view_knots[1][k], rot.device, rot.dtype)
        # a rotation vector as the quaternion (1, w/2) normalised: exact rotations, first-order in the angle
        q = torch.nn.functional.normalize(torch.cat([torch.ones_like(rot[..., :1]), rot / 2], -1), dim=-1)
        R = quat_to_rotmat(q.reshape(-1, 4)).reshape(q.shape[:-1] + (3, 3))
        return R, q, c + trans - (R @ c[..., None])[..., 0]

    def pose_corrections(self) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """(times (K,), (K,4,4) C) with the corrected camera pose C @ T_world_camera at each knot; None without
        knots."""
        times = self.view_knots[0]
        if not len(times):
            return None
        C = np.tile(np.eye(4), (len(times), 1, 1))
        with torch.no_grad():  # every knot in one batch: one copy to the host, not three per knot
            R, _, tr = (x.double().cpu().numpy() for x in self._view_transforms(slice(None)))
        C[:, :3, :3], C[:, :3, 3] = R.transpose(0, 2, 1), -np.einsum("kji,kj->ki", R, tr)  # the inverse correction
        return times, C

    def _poses_at(self, timestamp_us: int, dtype) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tracks' refined poses at a time (differentiable in the offsets): (K,3,3) rotations,
        (K,3) translations, (K,4) wxyz quaternions. All tracks in one batch (a street has dozens: a loop of
        small tensor operations per track took a tenth of a CPU training step)."""
        R, t, q, rows = self._logged_poses(int(timestamp_us), dtype)
        d = self._offsets_at(None, rows)
        h = d[:, 3] / 2
        zero = torch.zeros_like(h)
        q_yaw = torch.stack([torch.cos(h), zero, zero, torch.sin(h)], -1)
        return R @ _yaw(d[:, 3]), t + (R @ d[:, :3, None])[..., 0], quat_multiply(q, q_yaw)

    def _logged_poses(self, timestamp_us: int, dtype):
        """The tracks' logged poses at a time as rotations, translations and quaternions on the offsets' device,
        with the time's `_knot_rows`, kept for the time's next step (a training run steps through its views' times
        again and again: interpolating and uploading dozens of tracks' poses each step was host time a GPU waited
        for)."""
        offsets = next(iter(self.pose_offsets.values()))
        device = offsets.device
        key = (timestamp_us, device, dtype)
        if key not in self._track_poses:
            if len(self._track_poses) >= 4096:  # (expansion's pseudo views bring new times)
                self._track_poses.clear()
            P = np.stack([tr.pose_at(timestamp_us) for tr in self.tracks])
            self._track_poses[key] = tuple(to_device(x, device, dtype) for x in (
                P[:, :3, :3], P[:, :3, 3], rotmat_to_quat(P[:, :3, :3]))) + (
                self._knot_rows([[timestamp_us]] * len(self.tracks), device, offsets.dtype),)
        return self._track_poses[key]

    def _offsets_at(self, times_us: Sequence, rows=None) -> torch.Tensor:
        """The tracks' (dx, dy, dz, dyaw) at their times (times_us[k]: track k's), linear between their knots and
        constant beyond them: the rows of all tracks one after the other, in one gather (a street has dozens of
        tracks: one small gather and upload each made a GPU step wait as often). ``rows``: `_knot_rows` of the
        times, when known."""
        D = torch.cat([self.pose_offsets[tr.id] for tr in self.tracks])
        lo, hi, w = rows if rows is not None else self._knot_rows(times_us, D.device, D.dtype)
        return (1 - w) * D.index_select(0, lo) + w * D.index_select(0, hi)

    def _knot_rows(self, times_us: Sequence, device, dtype):
        """Each time's bracketing knots as rows of all tracks' offsets one after the other, and its weight of the
        later one: (lo, hi, w (n,1)) on ``device``."""
        lo, hi, frac, base = [], [], [], 0
        for tr, t in zip(self.tracks, times_us):
            knots = self.pose_knots[tr.id]
            i, a = bracket(knots, t)
            lo.append(base + (i - 1) % len(knots))  # (a single knot: i = 0 and a = 1, both rows 0)
            hi.append(base + i)
            frac.append(a)
            base += len(knots)
        on = lambda x, dt=torch.int64: to_device(np.concatenate(x), device, dt)  # noqa: E731
        return on(lo), on(hi), on(frac, dtype)[:, None]

    def track_poses(self) -> List[Tuple[np.ndarray, np.ndarray]]:
        """Each track's (timestamps, refined poses (T,4,4)), numpy (one copy to the host for all tracks)."""
        if not self.tracks:
            return []
        with torch.no_grad():
            d = self._offsets_at([tr.timestamps_us for tr in self.tracks]).double().cpu()
        D = torch.eye(4, dtype=torch.float64).repeat(len(d), 1, 1)
        D[:, :3, :3] = _yaw(d[:, 3])
        D[:, :3, 3] = d[:, :3]
        D = D.numpy()
        ends = np.cumsum([len(tr.timestamps_us) for tr in self.tracks])
        return [(tr.timestamps_us, tr.poses @ part) for tr, part in zip(self.tracks, np.split(D, ends[:-1]))]

    def to_scene(self, lidar: bool = False, surface_eps: float = 0.0) -> Scene:
        """The trained scene (numpy): background, actors in their box frames, sky, affines; with ``lidar``
        (the LiDAR losses trained them) the surfels' features and the LiDAR head; composited as it was trained
        (``surface_eps``, `TrainConfig.surface_eps`)."""
        with torch.no_grad():
            s = self.activated().numpy()
        own = self.owner.cpu().numpy()
        pick = lambda m: Surfels(s.means[m], s.quats[m], s.scales[m], s.opacities[m], s.colors[m],
                                 s.features[m] if lidar else None)
        actors = tuple(Actor(id=t.id, category=t.category, size=t.size, surfels=pick(own == k),
                             track_timestamps_us=ts, track_poses=poses)
                       for k, (t, (ts, poses)) in enumerate(zip(self.tracks, self.track_poses())))
        host = lambda t: t.detach().cpu().numpy()  # noqa: E731
        return Scene(background=pick(own == -1), actors=actors, sky=Sky(host(self.sky.clamp(0, 1)).copy()),
                     appearance={c: host(a).astype(np.float64) for c, a in self.affine.items()},
                     lidar_head=LidarHead(*(host(self.head[k]) for k in WEIGHTS)) if lidar else None,
                     pose_corrections=self.pose_corrections(), surface_eps=surface_eps)

    def state_dict(self) -> dict:
        """On the CPU, whatever the device: a checkpoint loads anywhere."""
        c = lambda t: t.detach().cpu().clone()  # noqa: E731
        return {"params": {k: c(v) for k, v in self.params.items()}, "owner": c(self.owner),
                "track_ids": [t.id for t in self.tracks], "sky": c(self.sky),
                "affine": {k: c(a) for k, a in self.affine.items()},
                "head": {k: c(v) for k, v in self.head.items()},
                "pose_offsets": {i: c(v) for i, v in self.pose_offsets.items()},
                "pose_knots": {i: k.copy() for i, k in self.pose_knots.items()},
                "view_knots": tuple(x.copy() for x in self.view_knots),
                "view_offsets": {k: c(v) for k, v in self.view_offsets.items()}}

    def replace(self, keep: torch.Tensor, new: Dict[str, torch.Tensor], new_owner: torch.Tensor) -> None:
        """Keep surfels ``keep`` (bool mask) and append ``new`` raw parameters (densification)."""
        dev = self.device
        keep = keep.to(dev)
        self.params = {k: torch.cat([v.detach()[keep], new[k].to(dev)]).requires_grad_(True)
                       for k, v in self.params.items()}
        self.owner = torch.cat([self.owner[keep], new_owner.to(dev)])
