"""A test-only writer of a gsim log as a nuScenes table set and sensor files, written from the format's description
(the schema's fields and conventions) to read back with gsim.scenes.formats.nuscenes: the round trip's other half.

What nuScenes cannot hold is left out or approximated, as the dataset itself does: only pinhole cameras (nuScenes
images are undistorted; a distorted camera is skipped), per-point LiDAR times (each sweep is motion-compensated to
its timestamp, as nuScenes' are), beam tables (the ring is the nearest beam's index), and boxes only at keyframes."""
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from gsim.cameras import PinholeCamera
from gsim.scenes.overlay import sweep_in_world
from gsim.transforms import invert, rotmat_to_quat

# gsim category -> a nuScenes class name (the inverse of the converter's map where it has one)
CLASSES = {"car": "vehicle.car", "truck": "vehicle.truck", "bus": "vehicle.bus.rigid",
           "pedestrian": "human.pedestrian.adult", "cyclist": "vehicle.bicycle", "motorcycle": "vehicle.motorcycle",
           "cone": "movable_object.trafficcone", "barrier": "movable_object.barrier", "other": "movable_object.debris"}


def token(*parts) -> str:
    """A 32-hex-digit token like nuScenes', stable for the same parts."""
    return hashlib.md5("/".join(map(str, parts)).encode()).hexdigest()


def pose_record(T, **fields) -> dict:
    q = rotmat_to_quat(np.asarray(T)[None, :3, :3])[0]
    return {**fields, "rotation": q.tolist(), "translation": np.asarray(T)[:3, 3].tolist()}


def write_nuscenes(log, root, version="v1.0-synth", keyframe_every=2) -> dict:
    """Write ``log`` under ``root`` (tables in root/version, files in samples/ and sweeps/); frame k is a keyframe
    when k % keyframe_every == 0. Returns {(frame index, sensor): sample_data record}."""
    root = Path(root)
    (root / version).mkdir(parents=True)
    t = {name: [] for name in ("scene", "sample", "sample_data", "ego_pose", "calibrated_sensor", "sensor",
                               "sample_annotation", "instance", "category", "log")}
    cal = {}
    for name, c in log.cameras.items():
        if type(c.camera) is not PinholeCamera:
            continue  # nuScenes has no distortion model
        cam = c.camera
        K = [[cam.fx, 0.0, cam.cx - 0.5], [0.0, cam.fy, cam.cy - 0.5], [0.0, 0.0, 1.0]]
        t["sensor"].append({"token": token("sensor", name), "channel": name, "modality": "camera"})
        cal[name] = pose_record(c.T_vehicle_camera, token=token("cal", name), sensor_token=token("sensor", name),
                                camera_intrinsic=K)
    for name, s in log.lidars.items():
        t["sensor"].append({"token": token("sensor", name), "channel": name, "modality": "lidar"})
        cal[name] = pose_record(s.T_vehicle_lidar, token=token("cal", name), sensor_token=token("sensor", name),
                                camera_intrinsic=[])
    t["calibrated_sensor"] = list(cal.values())
    scene_token, log_token = token("scene", log.name), token("log", log.name)
    t["log"].append({"token": log_token, "logfile": log.name, "vehicle": "synth", "date_captured": "2024-01-01",
                     "location": "synth"})
    keyframes = [k for k in range(len(log.frames)) if k % keyframe_every == 0]
    samples = [token("sample", k) for k in keyframes]
    for j, k in enumerate(keyframes):
        t["sample"].append({"token": samples[j], "timestamp": log.frames[k].timestamp_us, "scene_token": scene_token,
                            "prev": samples[j - 1] if j else "",
                            "next": samples[j + 1] if j + 1 < len(samples) else ""})
    records = {}
    for k, f in enumerate(log.frames):
        key = k % keyframe_every == 0
        sample = samples[k // keyframe_every]  # a sweep belongs to the keyframe before it
        for name, obs in [*f.cameras.items(), *f.lidars.items()]:
            if name not in cal:
                continue
            sd = token("sd", k, name)
            folder = root / ("samples" if key else "sweeps") / name
            folder.mkdir(parents=True, exist_ok=True)
            if name in log.cameras:
                src = log.root / obs.image
                path = folder / f"{sd}{src.suffix}"
                shutil.copyfile(src, path)
                extra = {"width": log.cameras[name].camera.width, "height": log.cameras[name].camera.height,
                         "fileformat": src.suffix[1:]}
            else:
                path = folder / f"{sd}.pcd.bin"
                lidar_records(log, obs).tofile(path)
                extra = {"width": 0, "height": 0, "fileformat": "pcd"}
            t["ego_pose"].append(pose_record(log.T_world_vehicle(obs.timestamp_us), token=token("ego", k, name),
                                             timestamp=obs.timestamp_us))
            records[(k, name)] = {"token": sd, "sample_token": sample, "ego_pose_token": token("ego", k, name),
                                  "calibrated_sensor_token": cal[name]["token"], "timestamp": obs.timestamp_us,
                                  "is_key_frame": key, "filename": str(path.relative_to(root)), "prev": "",
                                  "next": "", **extra}
    t["sample_data"] = list(records.values())
    categories = {}
    for a in log.actors:
        name = CLASSES[a.category]
        categories.setdefault(name, token("category", name))
        anns = [(s, k) for s, k in zip(samples, keyframes)
                if a.timestamps_us[0] <= log.frames[k].timestamp_us <= a.timestamps_us[-1]]
        t["instance"].append({"token": a.id, "category_token": categories[name],
                              "nbr_annotations": len(anns), "first_annotation_token": token("ann", a.id, 0),
                              "last_annotation_token": token("ann", a.id, len(anns) - 1)})
        length, width, height = a.size
        for j, (s, k) in enumerate(anns):
            t["sample_annotation"].append(pose_record(
                a.pose_at(log.frames[k].timestamp_us), token=token("ann", a.id, j), sample_token=s,
                instance_token=a.id, size=[width, length, height], attribute_tokens=[],
                visibility_token="4", num_lidar_pts=-1, num_radar_pts=0, prev="", next=""))
    t["category"] = [{"token": tok, "name": n, "description": ""} for n, tok in categories.items()]
    t["scene"].append({"token": scene_token, "log_token": log_token, "name": log.name, "description": "synthetic",
                       "nbr_samples": len(samples), "first_sample_token": samples[0], "last_sample_token": samples[-1]})
    for name, rows in t.items():
        (root / version / f"{name}.json").write_text(json.dumps(rows, indent=0))
    return records


def lidar_records(log, obs) -> np.ndarray:
    """(N,5) float32 x, y, z, intensity 0-255, ring: the sweep in the sensor frame at its timestamp."""
    sweep = log.sweep(obs)
    T = invert(log.T_world_lidar(obs))
    xyz = sweep_in_world(log, obs, sweep) @ T[:3, :3].T + T[:3, 3]  # each point from its own time to the sweep's
    beams = log.lidars[obs.sensor].beams
    ring = np.zeros(len(sweep))
    if beams is not None:
        el = np.degrees(np.arcsin(sweep[:, 2] / np.linalg.norm(sweep[:, :3], axis=1)))
        ring = np.abs(el[:, None] - np.asarray(beams.elevations_deg)[None]).argmin(1)
    return np.column_stack([xyz, sweep[:, 3].astype(np.float64) * 255.0, ring]).astype("<f4")
