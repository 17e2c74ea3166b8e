"""Test-only: a gsim log written as one KITTI tracking sequence (training/ layout), for the converter's round trip.
It applies KITTI tracking's conventions the other way: the vehicle frame becomes the Velodyne frame (the log's
LiDAR), times must be frame index x 100 ms, the first camera defines the rectified camera-0 frame (every camera
must be a pinhole with its rotation: KITTI's P_i = K_i [I | t_i]), principal points -0.5 px, ego poses as oxts
lat/lon/alt/roll/pitch/yaw (inverse Mercator), boxes as bottom centre, h w l and rotation_y in the rectified
camera-0 frame. Numbers are written with repr (every digit of a float64), images as PNG (copied where they are
PNG files), sweeps as float32 (x, y, z, intensity) without the per-point times KITTI has no place for."""
import math
import shutil
from pathlib import Path
from typing import Dict

import numpy as np

from gsim.cameras import PinholeCamera
from gsim.scenes.formats.convert_util import make_pose
from gsim.scenes.formats.kitti_raw import EARTH_RADIUS_M, rotation
from gsim.transforms import invert

FRAME_US = 100_000
LAT0, LON0, ALT0 = 49.0, 8.4, 110.0  # the geodetic position of frame 0's IMU (Karlsruhe)
R_RECT = make_pose(rotation(0.004, -0.007, 0.0098), np.zeros(3))  # a KITTI-sized rectifying rotation
T_VELO_IMU = make_pose(rotation(0.0148, -0.002, -0.0008), [-0.81, 0.32, -0.80])  # the IMU behind, below the LiDAR
T_2 = np.array([0.06, -0.0003, 0.0027])  # camera 2 in the rectified camera-0 frame, as KITTI's P2 has it
M_KITTI_BOX = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
TYPES = {"car": "Car", "truck": "Truck", "pedestrian": "Pedestrian", "cyclist": "Cyclist"}


def _numbers(values) -> str:
    return " ".join(repr(float(v)) for v in np.ravel(values))


def _frame(t_us: int) -> int:
    if t_us % FRAME_US:
        raise ValueError(f"{t_us} us is not a 10 Hz frame time")
    return int(t_us) // FRAME_US


def write_kitti_tracking(log, training: Path, sequence: str, lidar: str, cameras: Dict[str, str]) -> dict:
    """Write ``log`` as sequence ``sequence`` of the folder ``training``: ``cameras`` maps image_02 (first) and
    image_03 to the log's cameras. Returns {"origin": the world position the converter's world starts at (frame 0's
    IMU), "track_ids": {actor id: KITTI track_id}}."""
    training = Path(training)
    T_vehicle_velo = log.lidars[lidar].T_vehicle_lidar
    n = _frame(int(log.ego_timestamps_us[-1])) + 1  # an oxts line (an ego pose) for every frame the log spans
    T_world_velo = [log.T_world_vehicle(k * FRAME_US) @ T_vehicle_velo for k in range(n)]

    # calibration: the first camera is camera 2, T_2 from the rectified camera-0 frame
    sensors = [log.cameras[c] for c in cameras.values()]
    T_rect_velo = invert(make_pose(np.eye(3), T_2)) @ invert(invert(T_vehicle_velo) @ sensors[0].T_vehicle_camera)
    P = {}
    for kitti, s in zip(cameras, sensors):
        cam = s.camera
        if type(cam) is not PinholeCamera:
            raise ValueError(f"{kitti}: KITTI's rectified cameras are pinholes, got {type(cam).__name__}")
        T = invert(invert(T_vehicle_velo) @ s.T_vehicle_camera) @ invert(T_rect_velo)  # T_cami_rect
        if np.abs(T[:3, :3] - np.eye(3)).max() > 1e-9:
            raise ValueError(f"{kitti}: not parallel to the first camera (rectified cameras share a rotation)")
        K = np.array([[cam.fx, 0, cam.cx - 0.5], [0, cam.fy, cam.cy - 0.5], [0, 0, 1]])
        P[f"P{kitti[-1]}"] = np.c_[K, K @ T[:3, 3]]
    K = P["P2"][:, :3]  # the greyscale cameras 0 and 1 (not converted): the rectified frame and 0.54 m right of it
    P = {"P0": np.c_[K, np.zeros(3)], "P1": np.c_[K, K @ [-0.54, 0, 0]], **P}
    lines = [f"{k}: {_numbers(v)}" for k, v in sorted(P.items())]
    lines += [f"R_rect {_numbers(R_RECT[:3, :3])}", f"Tr_velo_cam {_numbers((invert(R_RECT) @ T_rect_velo)[:3])}",
              f"Tr_imu_velo {_numbers(T_VELO_IMU[:3])}"]
    (training / "calib").mkdir(parents=True, exist_ok=True)
    (training / "calib" / f"{sequence}.txt").write_text("\n".join(lines) + "\n")

    # oxts: the IMU's pose, east-north-up offsets from frame 0 added to (LAT0, LON0, ALT0) by inverse Mercator
    scale = math.cos(math.radians(LAT0))
    e0 = scale * EARTH_RADIUS_M * math.radians(LON0)
    n0 = scale * EARTH_RADIUS_M * math.log(math.tan(math.radians(90.0 + LAT0) / 2))
    imu = [T @ T_VELO_IMU for T in T_world_velo]
    origin = imu[0][:3, 3].copy()
    records = []
    for T in imu:
        east, north, up = T[:3, 3] - origin
        lat = math.degrees(2 * math.atan(math.exp((n0 + north) / (scale * EARTH_RADIUS_M)))) - 90.0
        lon = math.degrees((e0 + east) / (scale * EARTH_RADIUS_M))
        R = T[:3, :3]
        roll, pitch, yaw = math.atan2(R[2, 1], R[2, 2]), math.asin(-R[2, 0]), math.atan2(R[1, 0], R[0, 0])
        records.append(_numbers([lat, lon, ALT0 + up, roll, pitch, yaw]) + " 0" * 24)
    (training / "oxts").mkdir(exist_ok=True)
    (training / "oxts" / f"{sequence}.txt").write_text("\n".join(records) + "\n")

    # sensor files, named by frame index
    from PIL import Image
    for f in log.frames:
        k = _frame(f.timestamp_us)
        for kitti, c in cameras.items():
            dst = training / kitti / sequence / f"{k:06d}.png"
            dst.parent.mkdir(parents=True, exist_ok=True)
            src = log.root / f.cameras[c].image
            if src.suffix == ".png":
                shutil.copyfile(src, dst)
            else:
                Image.fromarray((log.image(f.cameras[c]) * 255 + 0.5).astype(np.uint8)).save(dst)
        dst = training / "velodyne" / sequence / f"{k:06d}.bin"
        dst.parent.mkdir(parents=True, exist_ok=True)
        np.ascontiguousarray(log.sweep(f.lidars[lidar])[:, :4], np.float32).tofile(dst)

    # labels: bottom centre, h w l, rotation_y in the rectified camera-0 frame; one DontCare region a frame
    track_ids = {a.id: i for i, a in enumerate(log.actors)}
    rows = [(k, -1, f"{k} -1 DontCare -1 -1 -10 10 20 30 40 -1000 -1000 -1000 -1000 -1000 -1000 -10")
            for k in range(n)]
    for a in log.actors:
        l, w, h = a.size
        for t, T_world_actor in zip(a.timestamps_us, a.poses):
            k = _frame(int(t))
            T = T_rect_velo @ invert(T_world_velo[k]) @ T_world_actor
            R_y = T[:3, :3] @ M_KITTI_BOX.T
            ry = math.atan2(R_y[0, 2], R_y[0, 0])
            if np.abs(R_y - rotation(0.0, ry, 0.0)).max() > 1e-9:
                raise ValueError(f"{a.id} at {t} us: KITTI boxes turn about the camera's y axis only")
            x, y, z = T[:3, 3] + [0.0, h / 2, 0.0]
            rows.append((k, track_ids[a.id], f"{k} {track_ids[a.id]} {TYPES.get(a.category, 'Misc')} 0 0 -10 -1 -1 -1 "
                                            f"-1 {_numbers([h, w, l, x, y, z, ry])}"))
    (training / "label_02").mkdir(exist_ok=True)
    (training / "label_02" / f"{sequence}.txt").write_text("\n".join(r[2] for r in sorted(rows)) + "\n")
    return {"origin": origin, "track_ids": track_ids}
