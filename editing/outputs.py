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

and, where asked, a ROS 2 bag of the images and sweeps as log/ holds them, at its own path (`gsim.ros2_bag`).

An instance owns a pixel where its body (no contact shadow) renders opaque (alpha > 0.5) and no nearer
surface covers it (its depth within 3% + 0.1 m of the full render's).

The labels describe the images as written, through the camera's own model (pinhole, OpenCV radial-tangential
or fisheye; the images of a distorted camera are distorted, never rectified): the 2D boxes are the instance's
pixels, and the truncation is the share of the 3D box's projected 2D bound outside the image, its edges
sampled densely (under distortion a straight edge is a curve) and projected through the model. The KITTI
calibration's P0-P3 hold the camera's pinhole part K; for a distorted camera the file adds ``camera_model``
(``opencv``: D = k1 k2 p1 p2 k3 as cv2.projectPoints; ``fisheye``: D = k1 k2 k3 k4 as cv2.fisheye) and ``D``:
a camera-frame point (x, y, z) lands at K (x_d, y_d, 1), (x_d, y_d) being (x/z, y/z) distorted by the model.
Pixel coordinates: gsim's files (labels/) have pixel (i, j) cover [j, j+1) x [i, i+1); the KITTI files
(kitti/) use KITTI's, pixel centres at integers (0.5 less; gsim's KITTI-raw converter adds it back).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from gsim.boxes import corners, edge_points
from gsim.errors import InputError, check_name
from gsim.io import atomic_directory, child_path, to_uint8, write_png, write_video
from gsim.render import render_camera
from gsim.ros2_bag import BagOptions, open_bag, scene_boxes

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


def _truncation(camera, points_camera: np.ndarray) -> float:
    """KITTI's truncation of a box whose edge samples are ``points_camera`` (`gsim.boxes.edge_points`, camera
    frame): the share of their projected 2D bound (through the camera's own model) outside the image. Samples the
    model cannot project (behind the camera, past a fisheye's field or a distortion's fold) count as outside."""
    uv, ok = camera.project(points_camera)
    if not ok.any():
        return 1.0
    u, v = uv[ok, 0], uv[ok, 1]
    area = max(float(np.ptp(u) * np.ptp(v)), 1e-6)
    inside = (max(0.0, min(u.max(), camera.width) - max(u.min(), 0.0))
              * max(0.0, min(v.max(), camera.height) - max(v.min(), 0.0)))
    return float(np.clip(1 - inside / area * ok.mean(), 0, 1))


def instances(scene, camera, T_world_camera, timestamp_us: int, depth: np.ndarray, backend: str = "auto"):
    """(mask (H,W) uint16: 0 or 1 + actor index, per-actor full alpha masks {index: (H,W) bool}) at a time."""
    H, W = depth.shape
    best = np.full((H, W), np.inf)
    mask = np.zeros((H, W), np.uint16)
    full: Dict[int, np.ndarray] = {}
    R, t = T_world_camera[:3, :3], T_world_camera[:3, 3]
    for k, a in enumerate(scene.actors):
        P = a.pose_at(timestamp_us)
        pc = (corners(P, a.size) - t) @ R
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
    in the camera frame (location: the bottom face's centre; rotation_y about the camera's y axis); ``box2d``
    in gsim's pixel coordinates, written in KITTI's (0.5 less)."""
    T = np.linalg.inv(T_world_camera) @ P_world
    l, w, h = a.size
    bottom = T[:3, 3] - T[:3, 2] * (h / 2)  # the box's own z is its up
    fwd = T[:3, 0]
    ry = float(np.arctan2(-fwd[2], fwd[0]))  # KITTI: 0 = facing the camera's x axis, about y (down)
    alpha = ry - float(np.arctan2(bottom[0], bottom[2]))
    alpha = (alpha + np.pi) % (2 * np.pi) - np.pi
    occluded = 0 if visible > 0.8 else (1 if visible > 0.4 else 2)
    x1, y1, x2, y2 = (x - 0.5 for x in box2d)
    return (f"{KITTI_TYPE.get(a.category, 'Misc')} {truncated:.2f} {occluded} {alpha:.2f} {x1:.2f} {y1:.2f} "
            f"{x2:.2f} {y2:.2f} {h:.2f} {w:.2f} {l:.2f} {bottom[0]:.2f} {bottom[1]:.2f} {bottom[2]:.2f} {ry:.2f}")


def _calib(camera, T_camera_lidar: Optional[np.ndarray]) -> str:
    """A KITTI calib file: P0-P3 the pinhole part in KITTI's pixel convention, then a distorted camera's model
    and coefficients (see the module docstring): KITTI's readers take the lines they know, by name or order."""
    P = np.array([[camera.fx, 0, camera.cx - 0.5, 0], [0, camera.fy, camera.cy - 0.5, 0], [0, 0, 1, 0]])
    floats = lambda a: " ".join(f"{x:.6e}" for x in np.ravel(a))  # noqa: E731
    rows = [f"P{i}: {floats(P)}" for i in range(4)]
    rows.append(f"R0_rect: {floats(np.eye(3))}")
    if T_camera_lidar is not None:
        rows.append(f"Tr_velo_to_cam: {floats(T_camera_lidar[:3])}")
    if camera.model != "pinhole":
        d = camera.to_dict()
        coeffs = [k for k in d if k not in ("model", "width", "height", "fx", "fy", "cx", "cy")]
        rows += [f"camera_model: {camera.model}", f"D: {floats([d[k] for k in coeffs])}",
                 f"image: distorted, not rectified: pixel = K (x_d, y_d, 1) with K the left 3x3 of P2 and (x_d, y_d) "
                 f"= (x/z, y/z) distorted by camera_model with D = {' '.join(coeffs)}"]
    return "\n".join(rows) + "\n"


def sensor_rig(log, sens) -> Tuple[Dict[str, object], Dict[str, object]]:
    """The cameras ({name: camera model, downscaled as ``sens`` says}) and LiDARs ({name: LidarSpec}) of the
    log that a scenario's sensors section names (None: every camera; every LiDAR with a beam model); a
    ValueError naming the field for a sensor the log lacks."""
    cams = sens.cameras if sens.cameras is not None else sorted(log.cameras)
    lidars = sens.lidars if sens.lidars is not None else sorted(n for n in log.lidars if log.lidars[n].beams)
    for n in (*cams, *lidars):  # folder names in the outputs
        check_name(n, "sensors: the log's sensor name")
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


def render_world(world, scenario, backend: str = "auto", progress: bool = True, harmonizer=None,
                 ros2_bag: Optional[BagOptions] = None) -> Path:
    """Render ``world`` (`gsim.editing.world.apply`) as the scenario's sensors say, into scenario.output
    (written in a temporary folder and renamed into place). ``harmonizer``: a `gsim.diffusion.harmonize.
    Harmonizer` (called as ``harmonizer(rgb, alpha, depth, object_mask, view=(scene, log, camera,
    T_world_camera, timestamp_us, sensor)) -> (image, region)``, with a ``source`` for the log's notes) that
    repaints the region of the inserted actors visible in an image. ``ros2_bag``: also a ROS 2 bag (closed before
    the output folder is renamed into place: an error while rendering leaves neither)."""
    from tqdm import tqdm

    from gsim.lidar import render_lidar
    from gsim.images import render_image
    from gsim.scenes.log import ActorTrack, LogWriter
    log, scene, sens = world.log, world.scene, scenario.sensors
    cameras, specs = sensor_rig(log, sens)
    cams, lidars = list(cameras), list(specs)
    out = Path(scenario.output)
    inserted = [k for k, a in enumerate(scene.actors) if a.id in world.inserted]
    rig = ({c: (cameras[c], log.cameras[c].T_vehicle_camera) for c in cams},
           {n: log.lidars[n].T_vehicle_lidar for n in lidars})
    with atomic_directory(out, "scenario.json") as tmp, open_bag(ros2_bag, *rig) as bag:
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
                if bag is not None:
                    bag.step(f.timestamp_us, world.T_world_vehicle(f.timestamp_us),
                             actors=scene_boxes(scene, f.timestamp_us))
                for c in cams:
                    obs = f.cameras.get(c)
                    t = obs.timestamp_us if obs is not None else f.timestamp_us
                    T = world.T_world_vehicle(t) @ log.cameras[c].T_vehicle_camera
                    rgb, alpha, depth = render_image(scene, cameras[c], T, t, c, backend)
                    mask, full = instances(scene, cameras[c], T, t, depth, backend)
                    shown = [full[k] for k in inserted if k in full and (mask == k + 1).any()]
                    if harmonizer is not None and shown:
                        write_png(child_path(tmp / "render", c, "camera") / f"{i:06d}.png", to_uint8(rgb))
                        rgb = harmonizer(rgb, alpha, depth, np.logical_or.reduce(shown),
                                         view=(scene, log, cameras[c], T, t, c))[0]
                    img = to_uint8(rgb)
                    cam_entries[c] = w.image(c, i, t, img)
                    if bag is not None:
                        bag.image(c, t, img)
                    videos[c].append(img)
                    _labels(tmp, c, i, t, scene, cameras[c], T, mask, full, calibs[c])
                for n in lidars:
                    obs = f.lidars.get(n)
                    t = obs.timestamp_us if obs is not None else f.timestamp_us
                    sweep = render_lidar(scene, specs[n], (world.ego_timestamps_us, paths[n]), backend="auto", timestamp_us=t,
                                         rolling=len(world.ego_timestamps_us) > 1)
                    inten = sweep.intensity if sweep.intensity is not None else np.zeros(len(sweep.ranges), np.float32)
                    lidar_entries[n] = w.sweep(n, i, t, np.c_[sweep.points, inten, sweep.time_offset_us])
                    if bag is not None:
                        bag.sweep(n, t, sweep.points, sweep.intensity, sweep.ring, sweep.time_offset_us)
                w.add_frame(f.timestamp_us, cam_entries, lidar_entries)
        if sens.video:
            for c, frames in videos.items():
                write_video(child_path(tmp / "video", f"{c}.mp4", "camera"), frames, 10.0)
        (tmp / "scenario.json").write_text(scenario.model_dump_json(indent=2))
    return out


def _labels(root: Path, cam: str, i: int, t: int, scene, camera, T, mask, full, calib: str) -> None:
    """Writes a frame's masks, labels and KITTI files from `instances`' (mask, full)."""
    objs, lines = [], []
    for k, own in full.items():
        a = scene.actors[k]
        vis = mask == k + 1
        modal = _box(vis)
        if modal is None:
            continue
        visible = float(vis.sum() / own.sum())
        P = a.pose_at(t)
        trunc = _truncation(camera, (edge_points(P, a.size) - T[:3, 3]) @ T[:3, :3])
        objs.append({"instance": k + 1, "id": a.id, "category": a.category, "box2d": modal,
                     "box2d_amodal": _box(own), "visible_fraction": round(visible, 4), "truncated": round(trunc, 4)})
        lines.append(_kitti_line(a, P, T, modal, visible, trunc))
    write_png(child_path(root / "masks", cam, "camera") / f"{i:06d}.png", mask)
    lab = child_path(root / "labels", cam, "camera") / f"{i:06d}.json"
    lab.parent.mkdir(parents=True, exist_ok=True)
    lab.write_text(json.dumps({"timestamp_us": int(t), "instances": [a.id for a in scene.actors], "objects": objs},
                              indent=1))
    kd = child_path(root / "kitti", cam, "camera")
    (kd / "label_2").mkdir(parents=True, exist_ok=True)
    (kd / "calib").mkdir(parents=True, exist_ok=True)
    (kd / "label_2" / f"{i:06d}.txt").write_text("".join(x + "\n" for x in lines))
    (kd / "calib" / f"{i:06d}.txt").write_text(calib)
