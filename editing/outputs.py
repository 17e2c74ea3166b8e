"""A scenario rendered: camera images and videos, LiDAR sweeps, a new gsim driving log with the tracks of
every actor (inserted ones included), per-frame 2D boxes and instance masks, and a KITTI-object export.

Layout of the output folder::

    log/                          a gsim log (gsim validate reads it): rendered images and sweeps, ego poses,
                                  every actor's track
    scene/                        the edited scene
    labels/<camera>/<n>.json      per frame: each visible actor's id, category, modal box (visible pixels),
                                  amodal box (all its pixels), visible fraction
    masks/<camera>/<n>.png        16-bit instance masks: 0 = none, k = the k-th actor of labels' "instances"
    video/<camera>.mp4
    kitti/<camera>/label_2/<n>.txt, calib/<n>.txt   KITTI object labels (camera frame) and calibration
    render/<camera>/<n>.png       with a harmonizer (`gsim.diffusion.harmonize`): the render as it was, for each
                                  image where an inserted actor is visible (log/ and video/ hold it harmonized)

An instance owns a pixel where its body (no contact shadow) renders opaque (alpha > 0.5) and no nearer
surface covers it (its depth within 3% + 0.1 m of the full render's).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from gsim.errors import InputError
from gsim.io import atomic_directory, to_uint8, write_png, write_video
from gsim.render import render_camera

KITTI_TYPE = {"car": "Car", "truck": "Truck", "pedestrian": "Pedestrian", "cyclist": "Cyclist"}  # others: Misc
VISIBLE_ALPHA = 0.5


def lidar_spec(log, name: str):
    """The `LidarSpec` of a log's LiDAR from its beam model (None when the log has none)."""
    from gsim.lidar import LidarSpec
    b = log.lidars[name].beams
    if b is None:
        return None
    res = 360.0 / round(360.0 / b.azimuth_resolution_deg)  # a step that divides the turn
    return LidarSpec(f"{log.name}:{name}", tuple(b.elevations_deg), res, 10.0, b.min_range_m, b.max_range_m)


def _corners(T_world_box: np.ndarray, size) -> np.ndarray:
    l, w, h = size
    c = np.array([[sx * l / 2, sy * w / 2, sz * h / 2] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
    return c @ T_world_box[:3, :3].T + T_world_box[:3, 3]


def instances(scene, camera, T_world_camera, timestamp_us: int, depth: np.ndarray, backend: str = "auto"):
    """(mask (H,W) uint16: 0 or 1 + actor index, per-actor full alpha masks {index: (H,W) bool}) at a time."""
    H, W = depth.shape
    best = np.full((H, W), np.inf)
    mask = np.zeros((H, W), np.uint16)
    full: Dict[int, np.ndarray] = {}
    R, t = T_world_camera[:3, :3], T_world_camera[:3, 3]
    for k, a in enumerate(scene.actors):
        P = a.pose_at(timestamp_us)
        pc = (_corners(P, a.size) - t) @ R
        if pc[:, 2].max() <= 0.1:
            continue  # behind the camera
        f = render_camera(a.body.numpy().transformed(P), camera, T_world_camera, backend=backend)
        own = f.alpha > VISIBLE_ALPHA
        if not own.any():
            continue
        full[k] = own
        vis = own & (f.depth <= depth * 1.03 + 0.1) & (f.depth < best)
        mask[vis] = k + 1
        best[vis] = f.depth[vis]
    return mask, full


def _box(m: np.ndarray) -> Optional[List[int]]:
    if not m.any():
        return None
    v, u = np.nonzero(m)
    return [int(u.min()), int(v.min()), int(u.max()) + 1, int(v.max()) + 1]


def _kitti_line(a, P_world: np.ndarray, T_world_camera: np.ndarray, box2d, visible: float,
                truncated: float) -> str:
    """One KITTI object label: type truncated occluded alpha x1 y1 x2 y2 h w l x y z rotation_y, the 3D box
    in the camera frame (location: the bottom face's centre; rotation_y about the camera's y axis)."""
    T = np.linalg.inv(T_world_camera) @ P_world
    l, w, h = a.size
    bottom = T[:3, 3] - T[:3, 2] * (h / 2)  # the box's own z is its up
    fwd = T[:3, 0]
    ry = float(np.arctan2(-fwd[2], fwd[0]))  # KITTI: 0 = facing the camera's x axis, about y (down)
    alpha = ry - float(np.arctan2(bottom[0], bottom[2]))
    alpha = (alpha + np.pi) % (2 * np.pi) - np.pi
    occluded = 0 if visible > 0.8 else (1 if visible > 0.4 else 2)
    x1, y1, x2, y2 = box2d
    return (f"{KITTI_TYPE.get(a.category, 'Misc')} {truncated:.2f} {occluded} {alpha:.2f} {x1:.2f} {y1:.2f} "
            f"{x2:.2f} {y2:.2f} {h:.2f} {w:.2f} {l:.2f} {bottom[0]:.2f} {bottom[1]:.2f} {bottom[2]:.2f} {ry:.2f}")


def _calib(camera, T_camera_lidar: Optional[np.ndarray]) -> str:
    P = np.array([[camera.fx, 0, camera.cx, 0], [0, camera.fy, camera.cy, 0], [0, 0, 1, 0]])
    rows = [f"P{i}: " + " ".join(f"{x:.6e}" for x in P.ravel()) for i in range(4)]
    rows.append("R0_rect: " + " ".join(f"{x:.6e}" for x in np.eye(3).ravel()))
    if T_camera_lidar is not None:
        rows.append("Tr_velo_to_cam: " + " ".join(f"{x:.6e}" for x in T_camera_lidar[:3].ravel()))
    return "\n".join(rows) + "\n"


def sensor_rig(log, sens) -> Tuple[Dict[str, object], Dict[str, object]]:
    """The cameras ({name: camera model, downscaled as ``sens`` says}) and LiDARs ({name: LidarSpec}) of the
    log that a scenario's sensors section names (None: every camera; every LiDAR with a beam model); a
    ValueError naming the field for a sensor the log lacks."""
    cams = sens.cameras if sens.cameras is not None else sorted(log.cameras)
    lidars = sens.lidars if sens.lidars is not None else sorted(n for n in log.lidars if log.lidars[n].beams)
    for c in cams:
        if c not in log.cameras:
            raise InputError(f"sensors.cameras: the log has no camera {c!r}; it has {sorted(log.cameras)}")
    specs = {}
    for n in lidars:
        if n not in log.lidars:
            raise InputError(f"sensors.lidars: the log has no LiDAR {n!r}; it has {sorted(log.lidars)}")
        specs[n] = lidar_spec(log, n)
        if specs[n] is None:
            raise InputError(f"sensors.lidars: LiDAR {n!r} has no beam model in the log; leave it out")
    cameras = {c: log.cameras[c].camera.downscaled(sens.downscale) if sens.downscale > 1 else log.cameras[c].camera
               for c in cams}
    return cameras, specs


def mounted_rig(log, sens) -> Tuple[Dict[str, tuple], Dict[str, tuple]]:
    """`sensor_rig` with each sensor's mounting: ({name: (camera, T_vehicle_camera)}, {name: (LidarSpec,
    T_vehicle_lidar)})."""
    cameras, specs = sensor_rig(log, sens)
    return ({n: (c, log.cameras[n].T_vehicle_camera) for n, c in cameras.items()},
            {n: (spec, log.lidars[n].T_vehicle_lidar) for n, spec in specs.items()})


def render_world(world, scenario, backend: str = "auto", progress: bool = True, harmonizer=None) -> Path:
    """Render ``world`` (`gsim.editing.world.apply`) as the scenario's sensors say, into scenario.output
    (written in a temporary folder and renamed into place). ``harmonizer``: a `gsim.diffusion.harmonize.
    Harmonizer` (called as ``harmonizer(rgb, alpha, depth, object_mask) -> (image, region)``, with a
    ``source`` for the log's notes) that repaints the region of the inserted actors visible in an image."""
    from tqdm import tqdm

    from gsim.lidar import render_lidar
    from gsim.scenes.evaluate import render_image
    from gsim.scenes.log import ActorTrack, LogWriter
    log, scene, sens = world.log, world.scene, scenario.sensors
    cameras, specs = sensor_rig(log, sens)
    cams, lidars = list(cameras), list(specs)
    out = Path(scenario.output)
    inserted = [k for k, a in enumerate(scene.actors) if a.id in world.inserted]
    with atomic_directory(out, "scenario.json") as tmp:
        scene.save(tmp / "scene")
        videos: Dict[str, list] = {c: [] for c in cams}
        with LogWriter(tmp / "log", name=f"{log.name}-{scenario.name}", source=f"gsim scenario {scenario.name}") as w:
            w.notes.append(f"rendered by gsim from scene {scenario.scene} with {len(scenario.edits)} edits")
            if harmonizer is not None:
                w.notes.append(f"inserted actors harmonized with {harmonizer.source} (renders in render/)")
            for c in cams:
                w.add_camera(c, cameras[c], log.cameras[c].T_vehicle_camera)
            for n in lidars:
                w.add_lidar(n, log.lidars[n].T_vehicle_lidar, log.lidars[n].beams)
            for t, P in zip(world.ego_timestamps_us, world.ego_poses):
                w.add_ego_pose(int(t), P)
            for a in scene.actors:
                w.add_actor(ActorTrack(a.id, a.category, tuple(a.size), a.track_timestamps_us, a.track_poses))
            paths = {n: world.ego_poses @ log.lidars[n].T_vehicle_lidar for n in lidars}  # the sensors' rolling poses
            calibs = {c: _calib(cameras[c], None if not lidars else np.linalg.inv(log.cameras[c].T_vehicle_camera)
                                @ log.lidars[lidars[0]].T_vehicle_lidar) for c in cams}
            it = tqdm(world.frames, desc=f"scenario {scenario.name}", unit="frame") if progress else world.frames
            for i, f in enumerate(it):
                cam_entries, lidar_entries = {}, {}
                for c in cams:
                    obs = f.cameras.get(c)
                    t = obs.timestamp_us if obs is not None else f.timestamp_us
                    T = world.T_world_vehicle(t) @ log.cameras[c].T_vehicle_camera
                    rgb, alpha, depth = render_image(scene, cameras[c], T, t, c, backend)
                    mask, full = instances(scene, cameras[c], T, t, depth, backend)
                    shown = [full[k] for k in inserted if k in full and (mask == k + 1).any()]
                    if harmonizer is not None and shown:
                        write_png(tmp / "render" / c / f"{i:06d}.png", to_uint8(rgb))
                        rgb = harmonizer(rgb, alpha, depth, np.logical_or.reduce(shown))[0]
                    img = to_uint8(rgb)
                    cam_entries[c] = w.image(c, i, t, img)
                    videos[c].append(img)
                    _labels(tmp, c, i, t, scene, cameras[c], T, mask, full, calibs[c])
                for n in lidars:
                    obs = f.lidars.get(n)
                    t = obs.timestamp_us if obs is not None else f.timestamp_us
                    sweep = render_lidar(scene, specs[n], (world.ego_timestamps_us, paths[n]), backend="auto", timestamp_us=t,
                                         rolling=len(world.ego_timestamps_us) > 1)
                    inten = sweep.intensity if sweep.intensity is not None else np.zeros(len(sweep.ranges), np.float32)
                    lidar_entries[n] = w.sweep(n, i, t, np.c_[sweep.points, inten, sweep.time_offset_us])
                w.add_frame(f.timestamp_us, cam_entries, lidar_entries)
        if sens.video:
            for c, frames in videos.items():
                write_video(tmp / "video" / f"{c}.mp4", frames, 10.0)
        (tmp / "scenario.json").write_text(scenario.model_dump_json(indent=2))
    return out


def _labels(root: Path, cam: str, i: int, t: int, scene, camera, T, mask, full, calib: str) -> None:
    """Writes a frame's masks, labels and KITTI files from `instances`' (mask, full)."""
    objs, lines = [], []
    H, W = mask.shape
    for k, own in full.items():
        a = scene.actors[k]
        vis = mask == k + 1
        modal = _box(vis)
        if modal is None:
            continue
        visible = float(vis.sum() / own.sum())
        P = a.pose_at(t)
        # truncation: the share of the projected box outside the image
        pc = (_corners(P, a.size) - T[:3, 3]) @ T[:3, :3]
        pc = pc[pc[:, 2] > 0.1]
        u = camera.fx * pc[:, 0] / pc[:, 2] + camera.cx
        v = camera.fy * pc[:, 1] / pc[:, 2] + camera.cy
        area = max((u.max() - u.min()) * (v.max() - v.min()), 1e-6)
        inside = max(0.0, min(u.max(), W) - max(u.min(), 0)) * max(0.0, min(v.max(), H) - max(v.min(), 0))
        trunc = float(np.clip(1 - inside / area, 0, 1))
        objs.append({"instance": k + 1, "id": a.id, "category": a.category, "box2d": modal,
                     "box2d_amodal": _box(own), "visible_fraction": round(visible, 4), "truncated": round(trunc, 4)})
        lines.append(_kitti_line(a, P, T, modal, visible, trunc))
    write_png(root / "masks" / cam / f"{i:06d}.png", mask)
    lab = root / "labels" / cam / f"{i:06d}.json"
    lab.parent.mkdir(parents=True, exist_ok=True)
    lab.write_text(json.dumps({"timestamp_us": int(t), "instances": [a.id for a in scene.actors], "objects": objs},
                              indent=1))
    kd = root / "kitti" / cam
    (kd / "label_2").mkdir(parents=True, exist_ok=True)
    (kd / "calib").mkdir(parents=True, exist_ok=True)
    (kd / "label_2" / f"{i:06d}.txt").write_text("".join(x + "\n" for x in lines))
    (kd / "calib" / f"{i:06d}.txt").write_text(calib)
