"""Test-only: a gsim log written in the Argoverse 2 Sensor Dataset layout (feather tables with LZ4, as the real
files), for the converter's round trip. It applies AV2's conventions the other way: times us -> ns (x 1000),
points from the sensor frame at their own time into the egovehicle frame at the sweep's timestamp (AV2's motion
compensation) as float16, intensity [0,1] -> uint8, principal points -0.5 px, boxes into the egovehicle frame at
their times. One gsim LiDAR becomes ``up_lidar`` (laser_number = its nearest beam, < 32)."""
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather

from gsim.cameras import OpenCVCamera
from gsim.transforms import interpolate_poses, invert, rotmat_to_quat, transform_each


def write_table(path: Path, columns: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    feather.write_feather(pa.table(columns), path, compression="lz4")


def _pose_columns(T: np.ndarray) -> dict:
    q = rotmat_to_quat(T[:, :3, :3])
    return {**{k: q[:, i] for i, k in enumerate(("qw", "qx", "qy", "qz"))},
            **{k: T[:, i, 3] for i, k in enumerate(("tx_m", "ty_m", "tz_m"))}}


def write_av2(log, out: Path, lidar: str, quality: int = 95) -> Path:
    """Write ``log`` (cameras, the LiDAR ``lidar``, ego poses, actors) as an AV2 log folder ``out``."""
    from PIL import Image
    out = Path(out)
    ns = lambda us: np.asarray(us, np.int64) * 1000  # noqa: E731
    write_table(out / "city_SE3_egovehicle.feather", {"timestamp_ns": ns(log.ego_timestamps_us),
                                                      **_pose_columns(log.ego_poses)})
    names = list(log.cameras) + ["up_lidar"]
    T = np.stack([log.cameras[c].T_vehicle_camera for c in log.cameras] + [log.lidars[lidar].T_vehicle_lidar])
    write_table(out / "calibration/egovehicle_SE3_sensor.feather", {"sensor_name": names, **_pose_columns(T)})
    cams = [log.cameras[c].camera for c in log.cameras]
    dist = [(c.k1, c.k2, c.k3) if isinstance(c, OpenCVCamera) else (0.0, 0.0, 0.0) for c in cams]
    write_table(out / "calibration/intrinsics.feather", {
        "sensor_name": list(log.cameras), "fx_px": [c.fx for c in cams], "fy_px": [c.fy for c in cams],
        "cx_px": [c.cx - 0.5 for c in cams], "cy_px": [c.cy - 0.5 for c in cams],
        **{k: [d[i] for d in dist] for i, k in enumerate(("k1", "k2", "k3"))},
        "height_px": pa.array([c.height for c in cams], pa.uint16()),
        "width_px": pa.array([c.width for c in cams], pa.uint16())})
    elevations = np.radians(log.lidars[lidar].beams.elevations_deg)
    T_vl = log.lidars[lidar].T_vehicle_lidar
    for f in log.frames:
        for c, obs in f.cameras.items():
            path = out / "sensors/cameras" / c / f"{ns(obs.timestamp_us)}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray((log.image(obs) * 255 + 0.5).astype(np.uint8)).save(path, quality=quality)
        obs = f.lidars[lidar]
        p = log.sweep(obs)
        t = obs.timestamp_us
        T_ego_lidar = invert(interpolate_poses(log.ego_timestamps_us, log.ego_poses, [t])[0]) @ \
            interpolate_poses(log.ego_timestamps_us, log.ego_poses, t + p[:, 4].astype(np.int64)) @ T_vl
        ego = transform_each(T_ego_lidar, p[:, :3].astype(np.float64)).astype(np.float16)
        el = np.arctan2(p[:, 2], np.hypot(p[:, 0], p[:, 1]))
        write_table(out / "sensors/lidar" / f"{ns(t)}.feather", {
            "x": ego[:, 0], "y": ego[:, 1], "z": ego[:, 2],
            "intensity": np.round(p[:, 3] * 255).astype(np.uint8),
            "laser_number": np.abs(el[:, None] - elevations[None]).argmin(1).astype(np.uint8),
            "offset_ns": (p[:, 4].astype(np.int64) * 1000).astype(np.int32)})
    rows = {k: [] for k in ("timestamp_ns", "track_uuid", "category", "length_m", "width_m", "height_m")}
    boxes = []
    for a in log.actors:
        for t, T_world_actor in zip(a.timestamps_us, a.poses):
            rows["timestamp_ns"].append(int(ns(t)))
            rows["track_uuid"].append(a.id)
            rows["category"].append("REGULAR_VEHICLE")
            for k, s in zip(("length_m", "width_m", "height_m"), a.size):
                rows[k].append(s)
            boxes.append(invert(log.T_world_vehicle(int(t))) @ T_world_actor)
    write_table(out / "annotations.feather", {**rows, **_pose_columns(np.stack(boxes)),
                                              "num_interior_pts": np.zeros(len(boxes), np.int64)})
    return out
