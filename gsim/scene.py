"""`Scene` and the gsim scene directory.

A scene directory holds ``scene.json`` (the manifest, with ``schema_version``) and
one folder of ``.npy`` arrays per surfel set::

    scene.json
    background/{means,quats,scales,opacities,colors[,features]}.npy
    actors/<id>/{...same...}.npy, actors/<id>/track_{timestamps_us,poses}.npy
    sky.npy                      (optional) lat-long sky map, see gsim.appearance
    lidar_head.json              (optional) LiDAR intensity / ray-drop head, see gsim.lidar.heads
    pose_corrections/{timestamps_us,matrices}.npy  (optional) the log's refined poses, see Scene

The manifest's ``appearance`` maps camera sensor names to (3,4) colour affines; ``train``
(null or absent unless reconstructed) holds ``{"downscale": D}``, the training images' factor;
``surface_eps`` (absent: 0) how its surfels composite (`Scene.surface_eps`).
The directory is written next to its destination and renamed into place, so a
reader never sees a half-written scene. Schema 1 (no sky, no appearance) is still read.
"""
from __future__ import annotations

import json
import re
import functools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, NamedTuple, Optional

import numpy as np

from .appearance import Sky
from .errors import InputError, SceneFormatError, check_name
from .io import atomic_directory, read_manifest
from .ply import load_ply
from .surfels import Surfels
from .transforms import check_poses, interpolate_pose, interpolate_poses, rotmat_to_quat

SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
FORMAT = "gsim-scene"
SURFEL_FIELDS = ("means", "quats", "scales", "opacities", "colors")
# 1.5 px apart, their scales grown to cover, the inserted actors' pixels come within 49.3-49.6 dB of drawing every
# surfel, and 20 of them ahead of the ego cost half the time they cost at 0.75 px (BENCHMARKS.md, scene editing)
LOD_PIXELS = 1.5  # an actor with a level of detail keeps its surfels about this far apart on screen ...
LOD_MIN = 1000  # ... and at least this many of its body


@functools.lru_cache(maxsize=1024)
def _detail_level(surfels: Surfels, shadow_surfels: int, level: int) -> tuple:
    """(surfels, bounding radius m) of an actor's detail ``level``: all of them at 0, else a prefix of the
    body and of the shadow (each in random order) of 2^(-level/2) of them (at least LOD_MIN of the body),
    tangent scales grown by sqrt(N / n). Cached by the surfels' identity (Surfels hash by identity), so
    actors that share surfels (an actor with a new track) share their levels."""
    s = surfels.numpy()
    if level > 0:
        frac = 2.0 ** (-level / 2)
        nb = len(s) - shadow_surfels
        kb, ks = max(int(np.ceil(nb * frac)), min(nb, LOD_MIN)), int(np.ceil(shadow_surfels * frac))
        out = s.subset(np.r_[0:kb, nb:nb + ks])
        scales = out.scales.copy()
        scales[:kb] *= np.sqrt(nb / kb)
        scales[kb:] *= np.sqrt(shadow_surfels / max(ks, 1))
        s = Surfels.derived(out.means, out.quats, scales, out.opacities, out.colors, out.features)
    return s, float(np.linalg.norm(s.means, axis=1).max() + 3.4 * s.scales.max())


def body_surfels(surfels: Surfels, shadow_surfels: int) -> Surfels:
    """An actor's surfels without its contact shadow (the last ``shadow_surfels``)."""
    if not shadow_surfels:
        return surfels
    return surfels.numpy().subset(slice(0, len(surfels) - shadow_surfels))


class Part(NamedTuple):
    """A piece of a scene at one time (`Scene.placed`): surfels in their own frame, where that frame is."""
    surfels: Surfels
    T_world_part: Optional[np.ndarray]  # 4x4; None: the surfels are in the world frame
    closed: bool = False  # see Actor.closed
    radius: Optional[float] = None  # m: every surfel's 3.4-sigma disc lies this close to the part frame's origin


@dataclass(frozen=True, eq=False)
class Actor:
    """A rigid actor: surfels in its box frame moved by a timed track of T_world_actor."""

    id: str
    category: str
    size: tuple  # (length, width, height) m of its box
    surfels: Surfels
    track_timestamps_us: np.ndarray  # (T,) int64, strictly increasing
    track_poses: np.ndarray  # (T,4,4) float64 T_world_actor
    shadow_surfels: int = 0  # the last this many surfels are a contact shadow on the ground, not the body
    lod_spacing_m: Optional[float] = None  # body and shadow each in random order, surfels about this far apart:
    # a far view may draw a prefix of each (a level of detail, see `detail`); None: always all of them
    closed: bool = False  # the body is closed surfaces with outward normals: a renderer may skip the surfels
    # that face away from the camera (always hidden behind the ones that face it)
    _track_quats: np.ndarray = field(init=False, repr=False)  # the track's rotations, for interpolation

    def __post_init__(self):
        if self.lod_spacing_m is not None and not (isinstance(self.lod_spacing_m, (int, float, np.floating))
                                                   and self.lod_spacing_m > 0):
            raise InputError(f"actor {self.id}: lod_spacing_m must be None or > 0, got {self.lod_spacing_m!r}")
        if not (isinstance(self.shadow_surfels, (int, np.integer)) and 0 <= self.shadow_surfels < len(self.surfels)):
            raise InputError(f"actor {self.id}: shadow_surfels must be an integer in [0, {len(self.surfels)}), "
                             f"got {self.shadow_surfels!r}")
        check_name(self.id, "actor id")
        ts = np.asarray(self.track_timestamps_us)
        poses = np.asarray(self.track_poses, dtype=np.float64)
        if ts.ndim != 1 or len(ts) == 0 or ts.dtype.kind not in "iu":
            raise InputError(f"actor {self.id}: track_timestamps_us must be a non-empty 1D integer array")
        if np.any(np.diff(ts) <= 0):
            raise InputError(f"actor {self.id}: track_timestamps_us must be strictly increasing")
        if poses.shape != (len(ts), 4, 4):
            raise InputError(f"actor {self.id}: track_poses must be ({len(ts)},4,4), got {poses.shape}")
        check_poses(poses, f"actor {self.id}: track_poses")
        object.__setattr__(self, "track_timestamps_us", ts.astype(np.int64))
        object.__setattr__(self, "track_poses", poses)
        object.__setattr__(self, "_track_quats", rotmat_to_quat(poses[:, :3, :3]))

    def pose_at(self, timestamp_us: int) -> np.ndarray:
        return interpolate_pose(self.track_timestamps_us, self.track_poses, timestamp_us, self._track_quats)

    def detail(self, T_world_actor: np.ndarray, eye: Optional[np.ndarray], focal_px: float) -> Surfels:
        """The actor's surfels (its frame) as a camera at ``eye`` with focal length ``focal_px`` needs them:
        where its surfels would be closer than LOD_PIXELS on screen, a prefix of its body and of its shadow
        (uniform subsamples: each is in random order) whose tangent scales grow by sqrt(N / n), so the
        surface stays covered. All of them without ``lod_spacing_m`` or ``eye``. The fraction kept is the
        next half octave above the need (2^(-k/2)), so a moving view reuses a few cached subsets."""
        return self._level(T_world_actor, eye, focal_px)[0]

    def part(self, T_world_actor: np.ndarray, eye: Optional[np.ndarray] = None, focal_px: float = 0.0) -> Part:
        """This actor placed at ``T_world_actor`` as a `Part` (surfels as `detail` gives them)."""
        s, radius = self._level(T_world_actor, eye, focal_px)
        return Part(s, T_world_actor, self.closed, radius)

    def _level(self, T_world_actor, eye, focal_px) -> tuple:
        """(surfels, bounding radius m) of the detail level a view needs."""
        level = 0
        if self.lod_spacing_m is not None and eye is not None:
            dist = max(float(np.linalg.norm(T_world_actor[:3, 3] - eye)) - 0.5 * float(np.linalg.norm(self.size)),
                       1e-3)
            px = max(focal_px * self.lod_spacing_m / dist, 1e-30)  # (a far eye: the coarsest level, no log of 0)
            if px < LOD_PIXELS:
                level = max(math.floor(-4 * math.log2(px / LOD_PIXELS)), 0)  # (px/LOD_PIXELS)^2 <= 2^(-level/2)
        return _detail_level(self.surfels, self.shadow_surfels, level)

    @property
    def body(self) -> Surfels:
        """The actor's own surfels (without its contact shadow): what a LiDAR hits and an instance mask covers."""
        return body_surfels(self.surfels, self.shadow_surfels)


@dataclass(frozen=True, eq=False)
class Scene:
    """Background surfels (world frame) plus rigid actors, an optional sky and per-camera
    appearance affines ({sensor name: (3,4)}, see gsim.appearance).

    ``train_downscale`` is the integer factor the training images were box-averaged by, for a
    scene reconstructed from a log (evaluation renders at it by default); None when unknown.

    ``pose_corrections``: (times (K,) int64 us, (K,4,4) rigid C) for a scene reconstructed from a log whose
    poses training refined: the log's sensor pose T at time t is ``C(t) @ T`` in this scene (`log_pose`; C
    blended between the times, held at the ends); None: the log's poses as they are.

    ``surface_eps`` > 0: the surfels were fitted composited as surfaces (`RenderOptions.surface_eps`), and
    `render_camera` draws them so."""

    background: Surfels
    actors: tuple = field(default_factory=tuple)
    sky: Optional[Sky] = None
    appearance: Dict[str, np.ndarray] = field(default_factory=dict)
    lidar_head: Optional[object] = None  # gsim.lidar.heads.LidarHead: decodes the surfels' features
    train_downscale: Optional[int] = None
    pose_corrections: Optional[tuple] = None
    surface_eps: float = 0.0

    def __post_init__(self):
        e = self.surface_eps
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 <= e < 1:
            raise InputError(f"Scene.surface_eps: expected a fraction in [0, 1), got {e!r}")
        if self.pose_corrections is not None:
            times, C = (np.asarray(x) for x in self.pose_corrections)
            if (times.ndim != 1 or not np.issubdtype(times.dtype, np.integer) or len(times) == 0
                    or np.any(np.diff(times) <= 0) or C.shape != (len(times), 4, 4)):
                raise InputError(f"Scene.pose_corrections: expected increasing integer times (K,) and (K,4,4) "
                                 f"matrices, got {times.dtype} {times.shape} and {C.shape}")
            check_poses(C, "Scene.pose_corrections")
            object.__setattr__(self, "pose_corrections", (times.astype(np.int64), C.astype(np.float64)))
        d = self.train_downscale
        if d is not None and (not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 1):
            raise InputError(f"Scene.train_downscale: expected None or an integer >= 1, got {d!r}")
        app = {}
        for name, A in dict(self.appearance).items():
            A = np.asarray(A, dtype=np.float64)
            if A.shape != (3, 4) or not np.all(np.isfinite(A)):
                raise InputError(f"Scene.appearance[{name!r}]: expected a finite (3,4) affine, got shape {A.shape}")
            app[str(name)] = A
        object.__setattr__(self, "appearance", app)

    def thinned(self, fraction: float, seed: int = 0) -> "Scene":
        """A preview of the scene: `Surfels.thinned` of the background and of each actor's body and shadow (at
        least LOD_MIN of a body, so that small actors stay whole); the rest as it is. A view of it costs about
        ``fraction`` of the surfel work; `gsim view` draws it while the camera moves."""
        actors = []
        for a in self.actors:
            s, ns = a.surfels.numpy(), a.shadow_surfels
            body = s.subset(slice(0, len(s) - ns)).thinned(fraction, seed, at_least=LOD_MIN)
            shadow = s.subset(slice(len(s) - ns, len(s))).thinned(fraction, seed) if ns else None
            actors.append(replace(a, surfels=body if shadow is None else Surfels.concatenate([body, shadow]),
                                  shadow_surfels=0 if shadow is None else len(shadow)))
        return replace(self, background=self.background.thinned(fraction, seed), actors=tuple(actors))

    def log_pose(self, T_world_sensor: np.ndarray, timestamp_us) -> np.ndarray:
        """A pose (4,4) or poses (M,4,4) of the log's sensors at ``timestamp_us`` (scalar or (M,)) as this
        scene places them (``pose_corrections`` applied; unchanged without them)."""
        return corrected_poses(self.pose_corrections, T_world_sensor, timestamp_us)

    def placed(self, timestamp_us: Optional[int] = None, eye: Optional[np.ndarray] = None,
               focal_px: float = 0.0) -> list:
        """The scene at ``timestamp_us`` as `Part`s: the background (world frame) and each actor's surfels
        in its box frame with its tracked pose. With a camera position
        ``eye`` (world, m) and focal length ``focal_px``, actors that have a level of detail give as many
        surfels as that view needs (`Actor.detail`). Renderers that take parts draw an actor in its own frame
        (nothing is copied); `at` moves them into one world-frame set."""
        if not self.actors:
            return [Part(self.background, None)]
        if timestamp_us is None:
            raise InputError("Scene.at: this scene has actors; give timestamp_us (integer microseconds)")
        parts = [Part(self.background.numpy(), None)]
        for a in self.actors:
            parts.append(a.part(a.pose_at(int(timestamp_us)), eye, focal_px))
        return parts

    def at(self, timestamp_us: Optional[int] = None, eye: Optional[np.ndarray] = None,
           focal_px: float = 0.0) -> Surfels:
        """World-space surfels at ``timestamp_us`` (actors placed at their tracked poses; see `placed`)."""
        return world_surfels(self.placed(timestamp_us, eye, focal_px))

    def save(self, path) -> None:
        save_scene(self, path)


def corrected_poses(corrections: Optional[tuple], T_world_sensor: np.ndarray, timestamp_us) -> np.ndarray:
    """Poses of a log's sensors as refined pose corrections (times (K,), (K,4,4) C; see `Scene.pose_corrections`)
    place them: ``C(t) @ T`` with C blended at ``timestamp_us`` (scalar, for a (4,4) pose, or (M,)); unchanged
    for None."""
    if corrections is None:
        return T_world_sensor
    C = interpolate_poses(*corrections, timestamp_us)
    return C[0] @ T_world_sensor if np.ndim(timestamp_us) == 0 else C @ T_world_sensor


def world_surfels(parts: list) -> Surfels:
    """One world-frame surfel set from `Scene.placed` parts."""
    if len(parts) == 1 and parts[0].T_world_part is None:
        return parts[0].surfels
    return Surfels.concatenate([p.surfels if p.T_world_part is None else p.surfels.transformed(p.T_world_part)
                                for p in parts])


def save_surfels(s: Surfels, folder: Path) -> None:
    folder.mkdir(parents=True)
    for k, v in s.numpy().arrays().items():
        np.save(folder / f"{k}.npy", np.ascontiguousarray(v))


def load_array(path: Path) -> np.ndarray:
    if not path.is_file():
        raise SceneFormatError(f"{path}: file missing")
    try:
        return np.load(path, allow_pickle=False)
    except Exception as e:  # numpy raises several types for corrupt headers/payloads
        raise SceneFormatError(f"{path}: not a readable .npy array ({e})") from None


def load_surfels(folder: Path) -> Surfels:
    names = SURFEL_FIELDS + (("features",) if (folder / "features.npy").exists() else ())
    arrays = {k: load_array(folder / f"{k}.npy") for k in names}
    try:
        return Surfels(**arrays)
    except (ValueError, TypeError) as e:
        m = re.match(r"Surfels\.(\w+)", str(e))
        where = folder / f"{m.group(1)}.npy" if m and m.group(1) in names else folder
        raise SceneFormatError(f"{where}: {e}") from None


def _inside(root: Path, rel, field: str) -> Path:
    """``root / rel`` for a relative manifest path that stays inside ``root``."""
    if not isinstance(rel, str) or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise SceneFormatError(f"{root / 'scene.json'}: field {field!r} must be a relative path inside "
                               f"the scene directory, got {rel!r}")
    return root / rel


def save_scene(scene: Scene, path) -> None:
    """Write ``scene`` as a directory at ``path`` atomically (replacing an existing scene)."""
    with atomic_directory(path, "scene.json") as tmp:
        save_surfels(scene.background, tmp / "background")
        actors = []
        for a in scene.actors:
            d = tmp / "actors" / a.id
            save_surfels(a.surfels, d)
            np.save(d / "track_timestamps_us.npy", a.track_timestamps_us)
            np.save(d / "track_poses.npy", a.track_poses)
            actors.append({"id": a.id, "category": a.category, "size": [float(x) for x in a.size],
                           "surfels": f"actors/{a.id}", "shadow_surfels": int(a.shadow_surfels),
                           "lod_spacing_m": a.lod_spacing_m, "closed": bool(a.closed)})
        sky = None
        if scene.sky is not None:
            env = scene.sky.envmap
            np.save(tmp / "sky.npy", np.ascontiguousarray(env.detach().cpu().numpy() if hasattr(env, "detach") else env))
            sky = {"type": "latlong", "file": "sky.npy"}
        head = None
        if scene.lidar_head is not None:
            head = "lidar_head.json"
            (tmp / head).write_text(json.dumps(scene.lidar_head.to_dict()))
        corrections = None
        if scene.pose_corrections is not None:
            (tmp / "pose_corrections").mkdir()
            for name, a in zip(("timestamps_us", "matrices"), scene.pose_corrections):
                np.save(tmp / "pose_corrections" / f"{name}.npy", a)
            corrections = {k: f"pose_corrections/{k}.npy" for k in ("timestamps_us", "matrices")}
        manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION,
                    "background": {"surfels": "background", "count": len(scene.background)},
                    "actors": actors, "sky": sky, "lidar_head": head,
                    "appearance": {k: A.tolist() for k, A in scene.appearance.items()},
                    "train": None if scene.train_downscale is None else {"downscale": int(scene.train_downscale)},
                    "pose_corrections": corrections, "surface_eps": float(scene.surface_eps)}
        (tmp / "scene.json").write_text(json.dumps(manifest, indent=2))


def load_scene(path) -> Scene:
    """Open a gsim scene directory, or a 3DGS/2DGS ``.ply`` file as a background-only scene."""
    path = Path(path)
    if path.suffix.lower() == ".ply":
        return Scene(background=load_ply(path))
    mpath = path / "scene.json"
    if not mpath.exists():
        raise SceneFormatError(f"{path}: not a gsim scene directory (no scene.json) nor a .ply file")
    m = read_manifest(mpath, "scene manifest", READABLE_SCHEMAS, SceneFormatError)
    if m.get("format") != FORMAT:
        raise SceneFormatError(f"{mpath}: field 'format' must be {FORMAT!r}")
    if m["schema_version"] == 1 and (m.get("sky") is not None or m.get("appearance")):
        raise SceneFormatError(f"{mpath}: fields 'sky'/'appearance' are not supported in schema_version 1")
    try:
        bg = load_surfels(_inside(path, m["background"]["surfels"], "background.surfels"))
        actors = []
        for i, a in enumerate(m.get("actors", [])):
            d = _inside(path, a["surfels"], f"actors[{i}].surfels")
            try:
                actors.append(Actor(id=str(a["id"]), category=str(a["category"]), size=tuple(a["size"]),
                                    surfels=load_surfels(d),
                                    track_timestamps_us=load_array(d / "track_timestamps_us.npy"),
                                    track_poses=load_array(d / "track_poses.npy"),
                                    shadow_surfels=a.get("shadow_surfels", 0),
                                    lod_spacing_m=a.get("lod_spacing_m"), closed=bool(a.get("closed", False))))
            except ValueError as e:
                raise SceneFormatError(f"{mpath}: actors[{i}]: {e}") from None
        sky = None
        if m.get("sky") is not None:
            if m["sky"].get("type") != "latlong":
                raise SceneFormatError(f"{mpath}: field 'sky.type' must be 'latlong'")
            spath = _inside(path, m["sky"]["file"], "sky.file")
            env = load_array(spath)
            try:
                sky = Sky(env)
            except ValueError as e:
                raise SceneFormatError(f"{spath}: {e}") from None
        head = None
        if m.get("lidar_head") is not None:
            from gsim.lidar.heads import LidarHead
            head = LidarHead.load(_inside(path, m["lidar_head"], "lidar_head"))
        train = m.get("train")  # absent in scenes written before the training downscale was recorded
        if train is not None and (not isinstance(train, dict) or type(train.get("downscale")) is not int
                                  or train["downscale"] < 1):
            raise SceneFormatError(f"{mpath}: field 'train' must be null or {{\"downscale\": integer >= 1}}, "
                                   f"got {train!r}")
        corrections = m.get("pose_corrections")  # absent in scenes written before poses were refined
        if corrections is not None:
            corrections = tuple(load_array(_inside(path, corrections[k], f"pose_corrections.{k}"))
                                for k in ("timestamps_us", "matrices"))
        try:
            appearance = {k: np.asarray(v, dtype=np.float64) for k, v in m.get("appearance", {}).items()}
            return Scene(background=bg, actors=tuple(actors), sky=sky, appearance=appearance, lidar_head=head,
                         train_downscale=None if train is None else train["downscale"], pose_corrections=corrections,
                         surface_eps=m.get("surface_eps", 0.0))  # absent in scenes written before it
        except ValueError as e:
            raise SceneFormatError(f"{mpath}: {e}") from None
    except (KeyError, TypeError, AttributeError) as e:
        raise SceneFormatError(f"{mpath}: missing or malformed field {e}") from None
