"""nerfstudio ``transforms.json`` <-> gsim driving log (cameras only).

nerfstudio stores, per image, a camera-to-world ``transform_matrix`` in the OpenGL camera
convention (x right, y up, z back) and intrinsics fl_x, fl_y, cx, cy, w, h with distortion
k1..k4, p1, p2 (top level, or per frame) for ``camera_model`` OPENCV (default), PINHOLE,
SIMPLE_PINHOLE or OPENCV_FISHEYE. Its world is z up like gsim's, and its principal point uses
pixel centres at +0.5 like gsim's, so only the camera axes change here:
``T_world_camera(OpenCV) = transform_matrix @ diag(1, -1, -1, 1)``.

Import keeps the file's world frame (an ``applied_transform`` only records how its producer built
it): each image becomes one frame with one camera observation; images with equal intrinsics
share a camera (cam0, cam1, ... in order of appearance). transforms.json has no times, so frame
k is at k / 10 Hz. The vehicle frame sits at the camera with vehicle axes (x = camera forward,
y = camera left, z = camera up): ``T_vehicle_camera = T_VEHICLE_CAMERA`` for every camera.
Export writes every camera observation of a log with per-frame intrinsics and copies the
images, so ``import_nerfstudio(export_nerfstudio(log))`` gives back each image's pose and camera.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Dict, Union

import numpy as np

from gsim.cameras import Camera
from gsim.errors import InputError
from gsim.io import atomic_directory, write_json
from gsim.scenes.formats.convert_util import camera_from_params, check_image
from gsim.scenes.log import IMAGE_SUFFIXES, DrivingLog, LogFormatError, LogWriter, load_log
from gsim.transforms import check_pose, invert

TRANSFORMS = "transforms.json"
FRAME_PERIOD_US = 100_000
OPENGL_FROM_OPENCV = np.diag([1.0, -1.0, -1.0, 1.0])  # flips camera y and z; its own inverse
T_VEHICLE_CAMERA = np.array([[0.0, 0.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
FISHEYE = {"PINHOLE": False, "SIMPLE_PINHOLE": False, "OPENCV": False, "OPENCV_FISHEYE": True}
DISTORTION = {"opencv": ("k1", "k2", "k3", "p1", "p2"), "fisheye": ("k1", "k2", "k3", "k4"), "pinhole": ()}


def _frame_camera(meta: dict, frame: dict, where: str) -> Camera:
    """A frame's camera: its own fields, else the file's (nerfstudio's per-frame / shared intrinsics)."""
    def get(key, default=None):
        v = frame.get(key, meta.get(key, default))
        if v is None:
            raise LogFormatError(f"{where}.{key}: missing (neither in the frame nor at the top level)")
        return v
    model = get("camera_model", "OPENCV")
    if model not in FISHEYE:
        raise LogFormatError(f"{where}.camera_model: {model!r} not supported (one of {sorted(FISHEYE)})")
    try:
        w, h = get("w"), get("h")
        if w != int(w) or h != int(h):
            raise InputError(f"w, h must be whole pixels, got {w}, {h}")
        dist = {k: float(get(k, 0.0)) for k in ("k1", "k2", "k3", "k4", "p1", "p2")}
        return camera_from_params(where, int(w), int(h), float(get("fl_x")), float(get("fl_y")), float(get("cx")),
                                  float(get("cy")), fisheye=FISHEYE[model], **dist)
    except LogFormatError:
        raise
    except (TypeError, ValueError) as e:  # non-numbers in the file
        raise LogFormatError(f"{where}: {e}") from None


def _transform(frame: dict, where: str) -> np.ndarray:
    """transform_matrix (4x4 or 3x4, camera-to-world, OpenGL axes) -> T_world_camera (OpenCV axes)."""
    if "transform_matrix" not in frame:
        raise LogFormatError(f"{where}.transform_matrix: missing")
    try:
        M = np.asarray(frame["transform_matrix"], np.float64)
        if M.shape == (3, 4):
            M = np.vstack([M, [0.0, 0.0, 0.0, 1.0]])
        return check_pose(M @ OPENGL_FROM_OPENCV, f"{where}.transform_matrix")
    except (TypeError, ValueError) as e:
        raise LogFormatError(str(e) if where in str(e) else f"{where}.transform_matrix: {e}") from None


def import_nerfstudio(transforms_json, out, progress: bool = True) -> Path:
    """Convert a nerfstudio ``transforms.json`` (or the folder holding it) to a camera-only gsim log at ``out``."""
    from PIL import Image
    from tqdm import tqdm
    path = Path(transforms_json)
    path = path / TRANSFORMS if path.is_dir() else path
    if not path.is_file():
        raise InputError(f"{path}: no such file (expected a nerfstudio {TRANSFORMS})")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LogFormatError(f"{path}: invalid JSON ({e})") from None
    frames = meta.get("frames") if isinstance(meta, dict) else None
    if not isinstance(frames, list) or not frames:
        raise LogFormatError(f"{path}: frames: expected a non-empty list")

    names: Dict[Camera, str] = {}
    items = []  # (camera name, T_world_camera, image path)
    for i, f in enumerate(frames):
        where = f"{path}: frames[{i}]"
        if not isinstance(f, dict) or not isinstance(f.get("file_path"), str):
            raise LogFormatError(f"{where}.file_path: missing")
        cam = _frame_camera(meta, f, where)
        name = names.setdefault(cam, f"cam{len(names)}")
        image = path.parent / f["file_path"]
        check_image(image, cam.width, cam.height, f"{where} w/h")
        items.append((name, _transform(f, where), image))

    with LogWriter(out, name=path.parent.name, source="nerfstudio") as w:
        for cam, name in names.items():
            w.add_camera(name, cam, T_VEHICLE_CAMERA)
        for k, (name, T_world_camera, image) in enumerate(tqdm(items, desc="nerfstudio", unit="image",
                                                              disable=not progress)):
            t = k * FRAME_PERIOD_US
            w.add_ego_pose(t, T_world_camera @ invert(T_VEHICLE_CAMERA))
            if image.suffix.lower() in IMAGE_SUFFIXES:
                entry = w.image(name, k, t, src=image)
            else:
                with Image.open(image) as im:
                    entry = w.image(name, k, t, rgb=np.asarray(im.convert("RGB")))
            w.add_frame(t, cameras={name: entry}, lidars={})
        w.notes.extend(["imported from nerfstudio: frame k at k / 10 Hz (transforms.json has no times)",
                        "vehicle frame at the camera: x = camera forward, y = camera left, z = camera up"])
    return Path(out)


def _intrinsics(cam: Camera) -> dict:
    d = {"fl_x": cam.fx, "fl_y": cam.fy, "cx": cam.cx, "cy": cam.cy, "w": cam.width, "h": cam.height}
    return {**d, **{k: getattr(cam, k) for k in DISTORTION[cam.model]}}


def export_nerfstudio(log: Union[DrivingLog, str, Path], out_dir, progress: bool = True) -> Path:
    """Write every camera observation of a log as ``out_dir/transforms.json`` (per-frame intrinsics,
    OpenGL camera-to-world poses) with the images copied to ``out_dir/images/<camera>/``; returns the
    JSON's path. An existing ``out_dir`` is replaced only if it holds a transforms.json."""
    from tqdm import tqdm
    log = log if isinstance(log, DrivingLog) else load_log(log)
    obs = [o for _, o in log.camera_observations()]
    if not obs:
        raise InputError(f"{log.root}: the log has no camera images to export")
    models = {log.cameras[o.sensor].camera.model for o in obs}
    if "fisheye" in models and len(models) > 1:
        raise InputError(f"{log.root}: mixes fisheye and perspective cameras; a transforms.json has one camera_model")
    camera_model = "OPENCV_FISHEYE" if models == {"fisheye"} else "PINHOLE" if models == {"pinhole"} else "OPENCV"
    out_dir = Path(out_dir)
    with atomic_directory(out_dir, TRANSFORMS) as tmp:
        frames = []
        for k, o in enumerate(tqdm(obs, desc="export-nerfstudio", unit="image", disable=not progress)):
            rel = f"images/{o.sensor}/{k:06d}{Path(o.image).suffix}"
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log.root / o.image, tmp / rel)
            frames.append({"file_path": rel, "transform_matrix": (log.T_world_camera(o) @ OPENGL_FROM_OPENCV).tolist(),
                           **_intrinsics(log.cameras[o.sensor].camera)})
        write_json(tmp / TRANSFORMS, {"camera_model": camera_model, "frames": frames})
    return out_dir / TRANSFORMS


# gsim convert's subcommand for this format: its help line, what SRC (and OUT) is, options the converter takes
HELP = "a nerfstudio capture (transforms.json): cameras only"
SRC = "transforms.json"
