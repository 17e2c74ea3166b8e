"""The KITTI raw sample as a car's recorder lays it out in a ROS bag, for `tests/test_convert_rosbag.py` and
`bench/bench_rosbag.py`: a JPEG CompressedImage with its CameraInfo, the Velodyne as a PointCloud2 with ring and
per-point time, tf_static for the calibration, nav_msgs/Odometry or tf for the pose.

KITTI's synced sweeps are motion-compensated by the dataset (its devkit: "compensating for the egomotion"), a
recorder's are not: each point is put back where the spinning head saw it at its own time (`raw_sweep`), so that a
converter that de-skews with the per-point times places it where the KITTI log does."""
import io
import math

import numpy as np

from gsim.ros2_bag import cloud, header, pose, transform
from gsim.transforms import interpolate_poses, invert, transform_each

EPOCH_NS = 1_317_042_145 * 10 ** 9  # the sample's drive day: stamps as a recorder writes them
SPIN_S = 0.1  # the HDL-64E's turn at 10 Hz


def rot_z(deg):
    c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1.0]])


def rigid(R, t):
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = R, t
    return T


# the Velodyne on the roof, 1.7 m above base_link and turned by a degree (so that composing with it shows)
T_BASE_VELO = rigid(rot_z(1.0), [0.8, 0.3, 1.73])


def point_times_us(points):
    """Each point's time from the stamp (us, as the converter rounds the float32 seconds): the head turns clockwise
    and faces forward at the stamp, as KITTI triggers its cameras."""
    t = (-np.arctan2(points[:, 1], points[:, 0]) / (2 * np.pi) * SPIN_S).astype(np.float32)
    return t, np.floor(t.astype(np.float64) * 1e6 + 0.5).astype(np.int64)


def base_track(ref):
    """The poses the bag publishes for base_link: (times us, (T,4,4)), one per sweep."""
    obs = [f.lidars["velodyne"] for f in ref.frames]
    return (np.array([o.timestamp_us for o in obs]),
            np.stack([ref.T_world_lidar(o) @ invert(T_BASE_VELO) for o in obs]))


def raw_sweep(ref, k):
    """Frame k's KITTI (N,4) sweep as the head saw it, with each point's time (float32 s from the stamp): the
    inverse of de-skewing along the track the bag publishes."""
    points = ref.sweep(ref.frames[k].lidars["velodyne"])
    times, poses = base_track(ref)
    seconds, us = point_times_us(points)
    T_at = interpolate_poses(times, poses, times[k] + us) @ T_BASE_VELO  # the head at each point's time
    T_stamp = poses[k] @ T_BASE_VELO
    raw = points.copy()
    raw[:, :3] = transform_each(invert(T_at) @ T_stamp, points[:, :3].astype(np.float64))
    return raw, seconds


def velodyne_fields(raw, seconds):
    """A raw (N,4) x, y, z, reflectance sweep as a Velodyne driver's cloud: + ring (the nearest nominal HDL-64E
    beam) and time (float32 s from the stamp)."""
    from gsim.scenes.formats.kitti_raw import HDL64E
    el = np.degrees(np.arctan2(raw[:, 2], np.hypot(raw[:, 0], raw[:, 1])))
    table = np.array(HDL64E.elevations_deg)
    out = np.zeros(len(raw), [("x", "f4"), ("y", "f4"), ("z", "f4"), ("intensity", "f4"), ("ring", "u2"),
                              ("time", "f4")])
    for i, n in enumerate("xyz"):
        out[n] = raw[:, i]
    out["intensity"] = raw[:, 3]
    out["ring"] = np.argmin(np.abs(el[:, None] - table[None]), 1)
    out["time"] = seconds
    return out


def jpeg(path) -> bytes:
    """An image file as a camera driver's JPEG (quality 95)."""
    from PIL import Image
    out = io.BytesIO()
    with Image.open(path) as im:
        im.save(out, format="JPEG", quality=95)
    return out.getvalue()


def kitti_messages(ref, pose_source="odometry", image_format="jpeg"):
    """The KITTI log's frames as a recorder's messages: (topic, type, record time ns, fields); ``image_format``
    jpeg (a camera driver's, quality 95) or png (the sample's own files: lossless)."""
    cam = ref.cameras["image_02"]
    c = cam.camera
    K = [c.fx, 0, c.cx - 0.5, 0, c.fy, c.cy - 0.5, 0, 0, 1]  # ROS's pixel centres are integers
    info = {"height": c.height, "width": c.width, "distortion_model": "plumb_bob", "d": [0.0] * 5, "k": K,
            "r": np.eye(3).ravel(), "p": [K[0], 0, K[2], 0, 0, K[4], K[5], 0, 0, 0, 1, 0]}
    t0 = EPOCH_NS + ref.frames[0].timestamp_us * 1000
    msgs = [("/tf_static", "tf2_msgs/msg/TFMessage", t0, {"transforms": [
        transform("base_link", "velo_link", t0, T_BASE_VELO),
        transform("velo_link", "camera_color_left", t0, cam.T_vehicle_camera)]})]
    _, base = base_track(ref)
    for k, f in enumerate(ref.frames):
        t = EPOCH_NS + f.timestamp_us * 1000
        image = f.cameras["image_02"]
        msgs += [("/kitti/camera_color_left/image_raw/compressed", "sensor_msgs/msg/CompressedImage", t + 2_000_000,
                  {"header": header(t, "camera_color_left"), "format": f"rgb8; {image_format} compressed bgr8",
                   "data": np.frombuffer(jpeg(ref.root / image.image) if image_format == "jpeg"
                                         else (ref.root / image.image).read_bytes(), np.uint8)}),
                 ("/kitti/camera_color_left/camera_info", "sensor_msgs/msg/CameraInfo", t + 2_000_000,
                  {"header": header(t, "camera_color_left"), **info}),
                 ("/kitti/velo/pointcloud", "sensor_msgs/msg/PointCloud2", t + 5_000_000,
                  cloud(t, "velo_link", velodyne_fields(*raw_sweep(ref, k))))]
        if pose_source == "odometry":
            msgs.append(("/kitti/oxts/odom", "nav_msgs/msg/Odometry", t + 1_000_000,
                         {"header": header(t, "map"), "child_frame_id": "base_link", "pose": {"pose": pose(base[k])}}))
        elif pose_source == "tf":
            msgs.append(("/tf", "tf2_msgs/msg/TFMessage", t + 1_000_000,
                         {"transforms": [transform("map", "base_link", t, base[k])]}))
    return sorted(msgs, key=lambda m: m[2])
