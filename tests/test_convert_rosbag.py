"""gsim convert rosbag: bags written here with rosbags as a car's recorder lays them out. From the KITTI raw sample
(../shared/data): a compressed camera with its CameraInfo, the Velodyne as a PointCloud2 with per-point time and ring,
tf_static calibration and an Odometry or tf pose, in each storage, converted to the KITTI converter's own log of the
same frames. Synthetic: Autoware's topic layout, raw image encodings and camera models, and each bad bag's error."""
import io
import re

import numpy as np
import pytest

from gsim.errors import InputError
from gsim.ros2_bag import cloud, header, pose, transform
from gsim.scenes.log import validate_log
from gsim.transforms import invert

from format_checks import DATA
from kitti_bag import EPOCH_NS, T_BASE_VELO, jpeg, kitti_messages, raw_sweep, rigid, rot_z, velodyne_fields
from rosbag_writer import STORAGES, write_bag

pytest.importorskip("rosbags", reason="rosbags (the ros2 extra) reads and writes the bags")

KITTI = DATA / "kitti_raw" / "2011_09_26"
needs_kitti = pytest.mark.skipif(not KITTI.is_dir(), reason=f"KITTI raw sample not found at {KITTI} "
                                 "(see ../shared/data/README.md)")
FRAMES = 6
PERIOD_NS = 100_000_000


def bag_path(tmp_path, storage, name="drive"):
    return tmp_path / (f"{name}.bag" if storage == "rosbag1" else name)


def storage_file(path, storage):
    """The file holding a bag's messages (a rosbag2 folder's storage file)."""
    return path if storage == "rosbag1" else next(path.glob("*.mcap" if storage == "mcap" else "*.db3"))


# --------------------------------------------------------------------------- KITTI

@pytest.fixture(scope="module")
def kitti_ref(tmp_path_factory):
    """The KITTI converter's log of the sample's first frames."""
    pytest.importorskip("kiss_icp", reason="kiss-icp (the lidar extra) estimates the sample's poses")
    if not KITTI.is_dir():
        pytest.skip(f"KITTI raw sample not found at {KITTI}")
    from gsim.scenes.formats.kitti_raw import convert_kitti_raw
    return validate_log(convert_kitti_raw(KITTI, tmp_path_factory.mktemp("kitti") / "log", max_frames=FRAMES,
                                          progress=False))


def without_origin(T, T0):
    """A pose with the translation of a log's first pose taken off (the converter puts its first ego pose at the
    world origin, the KITTI converter its first sweep)."""
    T = T.copy()
    T[:3, 3] -= T0[:3, 3]
    return T


@needs_kitti
@pytest.mark.parametrize("storage,pose_source", [("rosbag1", "tf"), ("sqlite3", "odometry"), ("mcap", "odometry")])
def test_kitti_bag_converts_to_the_kitti_log(kitti_ref, tmp_path, storage, pose_source):
    from gsim.scenes.formats.kitti_raw import HDL64E
    from gsim.scenes.formats.rosbag import convert_rosbag
    from gsim.scenes.reconstruction.views import sweep_world
    ref = kitti_ref
    bag = write_bag(bag_path(tmp_path, storage), storage, kitti_messages(ref, pose_source))
    log = validate_log(convert_rosbag(bag, tmp_path / "log", progress=False))
    assert sorted(log.cameras) == ["camera_color_left"] and sorted(log.lidars) == ["velo"]
    assert [f.timestamp_us for f in log.frames] == [EPOCH_NS // 1000 + f.timestamp_us for f in ref.frames]
    assert log.cameras["camera_color_left"].camera.to_dict() == pytest.approx(ref.cameras["image_02"].camera.to_dict())
    # the ring field's beams: the nominal table the rings were made from (ring 0 also takes every point above it,
    # near ones up to 6 degrees: its far returns say where it points)
    beams = log.lidars["velo"].beams
    rings = np.unique(velodyne_fields(*raw_sweep(ref, 0))["ring"])
    assert rings[0] == 0 and len(beams.elevations_deg) == len(rings)
    assert np.abs(np.array(beams.elevations_deg) - np.array(HDL64E.elevations_deg)[rings]).max() < 0.5
    assert beams.azimuth_resolution_deg == pytest.approx(HDL64E.azimuth_resolution_deg, abs=0.01)
    lid0, cam0 = log.T_world_lidar(log.frames[0].lidars["velo"]), ref.T_world_lidar(ref.frames[0].lidars["velodyne"])
    for k, (f, g) in enumerate(zip(log.frames, ref.frames)):
        a, b = f.lidars["velo"], g.lidars["velodyne"]
        np.testing.assert_allclose(without_origin(log.T_world_lidar(a), lid0),
                                   without_origin(ref.T_world_lidar(b), cam0), atol=1e-9)
        np.testing.assert_allclose(without_origin(log.T_world_camera(f.cameras["camera_color_left"]), lid0),
                                   without_origin(ref.T_world_camera(g.cameras["image_02"]), cam0), atol=1e-9)
        raw, seconds = raw_sweep(ref, k)
        points = log.sweep(a)
        np.testing.assert_array_equal(points[:, :4], raw.astype(np.float32))  # x, y, z, reflectance as recorded
        assert np.array_equal(points[:, 4], np.floor(seconds.astype(np.float64) * 1e6 + 0.5))
        # de-skewed with those times, each point lands where the KITTI log (compensated by the dataset) puts it
        world, _, _, _ = sweep_world(log, a)
        kitti, _, _, _ = sweep_world(ref, b)
        np.testing.assert_allclose(world - lid0[:3, 3], kitti - cam0[:3, 3], atol=1e-4)
        image, png = f.cameras["camera_color_left"], g.cameras["image_02"]
        assert image.timestamp_us == f.timestamp_us
        assert (log.root / image.image).read_bytes() == jpeg(ref.root / png.image)  # the recorded JPEG, as it is
        assert np.abs(log.image(image) - ref.image(png)).mean() < 0.02  # JPEG's error at quality 95
    assert any(n.startswith(f"ego poses: {'tf from' if pose_source == 'tf' else '/kitti/oxts/odom'}")
               for n in log.notes)


@needs_kitti
def test_kitti_bag_without_poses_takes_lidar_odometry(kitti_ref, tmp_path):
    """As the KITTI converter without oxts: kiss-icp on the sweeps (world: the first sweep), smoothed alike. The
    bag's sweeps are as the head saw them and kiss-icp registers them so (no de-skew), KITTI's compensated ones:
    the two estimates part by centimetres over the six sweeps (3 to 46 mm; kiss-icp's own jitter on this drive is
    3-5 cm, `convert_util.smooth_positions`)."""
    from gsim.scenes.formats.rosbag import convert_rosbag
    bag = write_bag(bag_path(tmp_path, "mcap"), "mcap", kitti_messages(kitti_ref, pose_source=None))
    log = validate_log(convert_rosbag(bag, tmp_path / "log", progress=False))
    assert any("kiss-icp LiDAR odometry" in n for n in log.notes)
    for f, g in zip(log.frames, kitti_ref.frames):
        np.testing.assert_allclose(invert(T_BASE_VELO) @ log.T_world_lidar(f.lidars["velo"]),
                                   kitti_ref.T_world_lidar(g.lidars["velodyne"]), atol=0.08)


# --------------------------------------------------------------------------- synthetic: Autoware's layout

W, H, N = 32, 24, 4
MAP_ORIGIN = np.array([512_000.0, 5_400_000.0, 30.0])  # a UTM map frame
SPEED = 5.0  # m/s along the map's x
K0 = [30.0, 0, 15.5, 0, 31.0, 11.5, 0, 0, 1]
# the cameras: (name, image stream, encoding, CameraInfo distortion model, D)
CAMERAS = [("camera0", "image_raw", "rgb8", "plumb_bob", [-0.1, 0.01, 0.001, -0.002, 0.0005]),
           ("camera1", "image_raw", "bgr8", "equidistant", [0.05, -0.01, 0.002, -0.001]),
           ("camera2", "image_raw", "mono8", "rational_polynomial", [-0.1, 0.01, 0, 0, 0, 0, 0, 0]),
           ("camera3", "image_rect_color", "bayer_rggb8", "plumb_bob", [-0.3, 0.1, 0, 0, 0])]
P3 = [28.0, 0, 16.0, -14.0, 0, 28.0, 12.0, 0, 0, 0, 1, 0]  # camera3's rectified projection (a stereo pair's right)
R3 = rot_z(2.0)  # and its rectifying rotation
RINGS_DEG = np.array([-15.0, -5.0, 0.0, 5.0])


def optical(yaw_deg):
    """T_base_optical of a camera looking along the base's yaw: optical x right, y down, z forward."""
    look = np.array([[0, 0, 1], [-1, 0, 0], [0, -1, 0.0]])  # columns: optical x, y, z in a forward camera's base
    return rigid(rot_z(yaw_deg) @ look, [1.5, 0.0, 1.4])


T_BASE_TOP_KIT = rigid(rot_z(0.5), [0.9, 0.0, 1.8])  # base_link -> sensor_kit_base_link -> velodyne_top
T_KIT_TOP = rigid(rot_z(-1.5), [0.0, 0.0, 0.2])
T_BASE_LEFT = rigid(rot_z(90.0), [0.5, 0.9, 1.5])


def truth_rgb(k):
    """A smooth colour image (so that debayering is near exact), different each frame."""
    y, x = np.mgrid[0:H, 0:W]
    return np.stack([40 + 5 * x + k, 30 + 6 * y, 220 - 3 * x - 2 * y], -1).astype(np.uint8)


def raw_image(stamp, frame_id, rgb, encoding, pad=0):
    """A sensor_msgs/Image of ``rgb`` in ``encoding``, rows padded by ``pad`` bytes."""
    if encoding.startswith("bayer"):  # RGGB mosaic
        a = rgb[..., 1].copy()
        a[0::2, 0::2], a[1::2, 1::2] = rgb[0::2, 0::2, 0], rgb[1::2, 1::2, 2]
        a = a[..., None]
    else:
        a = {"rgb8": rgb, "bgr8": rgb[..., ::-1], "mono8": rgb[..., 1:2]}[encoding]
    rows = np.concatenate([a.reshape(H, -1), np.zeros((H, pad), np.uint8)], 1)
    return {"header": header(stamp, frame_id), "height": H, "width": W, "encoding": encoding,
            "step": rows.shape[1], "data": rows.ravel()}


def sweep_points(k, stamp):
    """A LiDAR's sweep: 4 rings of 90 points on a 10 m cylinder, then a NaN point and a no-return at the origin."""
    az = np.radians(np.arange(90) * 4.0 + k)
    el = np.radians(np.repeat(RINGS_DEG, len(az)))
    az = np.tile(az, len(RINGS_DEG))
    xyz = np.stack([10 * np.cos(az), 10 * np.sin(az), 10 * np.tan(el)], 1)
    xyz = np.concatenate([xyz, [[np.nan, 1, 1], [0, 0, 0]]])
    ring = np.r_[np.repeat(np.arange(len(RINGS_DEG)), 90), 0, 0]
    return xyz, ring, np.arange(len(xyz)) % 256, (np.arange(len(xyz)) * 250_000) % 100_000_000


def top_cloud(k, stamp):
    """Autoware's pointcloud_raw_ex: intensity uint8, ring, time_stamp uint32 ns from the stamp, 3 bytes of padding."""
    xyz, ring, intensity, ns = sweep_points(k, stamp)
    pts = np.zeros(len(xyz), np.dtype({"names": ["x", "y", "z", "intensity", "ring", "time_stamp"],
                                       "formats": ["<f4", "<f4", "<f4", "u1", "<u2", "<u4"],
                                       "offsets": [0, 4, 8, 12, 14, 16], "itemsize": 23}))
    pts["x"], pts["y"], pts["z"], pts["intensity"], pts["ring"], pts["time_stamp"] = (*xyz.T, intensity, ring, ns)
    return cloud(stamp, "velodyne_top", pts)


def processed_cloud(k, stamp):
    """A processed cloud: x, y, z and float32 intensity 0-255, no per-point time."""
    xyz, _, intensity, _ = sweep_points(k, stamp)
    pts = np.zeros(len(xyz), [("x", "f4"), ("y", "f4"), ("z", "f4"), ("intensity", "f4")])
    pts["x"], pts["y"], pts["z"], pts["intensity"] = (*xyz.T, intensity)
    return cloud(stamp, "velodyne_top", pts)


def left_cloud(k, stamp):
    """Another LiDAR, big-endian: reflectivity uint16 and absolute float64 seconds."""
    xyz, _, intensity, ns = sweep_points(k, stamp)
    pts = np.zeros(len(xyz), [("x", "f4"), ("y", "f4"), ("z", "f4"), ("reflectivity", "u2"), ("timestamp", "f8")])
    pts["x"], pts["y"], pts["z"], pts["reflectivity"] = (*xyz.T, intensity * 200)
    pts["timestamp"] = (stamp + ns) / 1e9
    return cloud(stamp, "velodyne_left", pts, big_endian=True)


def camera_info(stamp, frame_id, model, d, rectified=False):
    return {"header": header(stamp, frame_id), "height": H, "width": W, "distortion_model": model, "d": d, "k": K0,
            "r": R3.ravel() if rectified else np.eye(3).ravel(), "p": P3 if rectified else [*K0[:3], 0, *K0[3:6], 0,
                                                                                            *K0[6:], 0]}


def base_pose(t_ns):
    return rigid(rot_z(0.0), MAP_ORIGIN + [SPEED * (t_ns - EPOCH_NS) / 1e9, 0, 0])


def autoware_messages(n=N, encodings=None):
    """An Autoware vehicle's recording: 4 cameras (+ a compressed twin of camera0's stream, a debug image without
    CameraInfo), a top LiDAR (raw_ex and a processed cloud), a left LiDAR, a concatenated cloud, tf_static, the
    localization's kinematic_state (at 20 Hz, over more than the sensors) and an unrelated Odometry."""
    msgs = [("/tf_static", "tf2_msgs/msg/TFMessage", EPOCH_NS - 10 ** 8, {"transforms": [
        transform("base_link", "sensor_kit_base_link", 0, T_BASE_TOP_KIT),
        transform("sensor_kit_base_link", "velodyne_top", 0, T_KIT_TOP),
        transform("base_link", "velodyne_left", 0, T_BASE_LEFT),
        *[transform("base_link", f"{name}/camera_optical_link", 0, optical(90 * i))
          for i, (name, *_) in enumerate(CAMERAS)]]})]
    for j in range(-2, 2 * n + 2):
        t = EPOCH_NS + j * PERIOD_NS // 2
        odom = {"header": header(t, "map"), "child_frame_id": "base_link", "pose": {"pose": pose(base_pose(t))}}
        msgs.append(("/localization/kinematic_state", "nav_msgs/msg/Odometry", t, odom))
        msgs.append(("/a/odom", "nav_msgs/msg/Odometry", t, {**odom, "pose": {"pose": pose(np.eye(4))}}))
    for k in range(n):
        t = EPOCH_NS + k * PERIOD_NS
        rgb = truth_rgb(k)
        for i, (name, stream, enc, model, d) in enumerate(CAMERAS):
            ns, tc = f"/sensing/camera/{name}", t + 3_000_000
            image = raw_image(tc, f"{name}/camera_optical_link", rgb, enc, pad=4 * (i == 0))
            image["encoding"] = (encodings or {}).get(name, enc)
            msgs += [(f"{ns}/{stream}", "sensor_msgs/msg/Image", tc, image),
                     (f"{ns}/camera_info", "sensor_msgs/msg/CameraInfo", tc,
                      camera_info(tc, f"{name}/camera_optical_link", model, d, rectified=stream != "image_raw"))]
        buf = io.BytesIO()
        from PIL import Image
        Image.fromarray(rgb).save(buf, format="PNG")
        msgs += [("/sensing/camera/camera0/image_raw/compressed", "sensor_msgs/msg/CompressedImage", t + 3_000_000,
                  {"header": header(t + 3_000_000, "camera0/camera_optical_link"), "format": "png",
                   "data": np.frombuffer(buf.getvalue(), np.uint8)}),
                 ("/perception/debug/image", "sensor_msgs/msg/Image", t, raw_image(t, "base_link", rgb, "rgb8")),
                 ("/sensing/lidar/top/pointcloud_raw_ex", "sensor_msgs/msg/PointCloud2", t, top_cloud(k, t)),
                 ("/sensing/lidar/top/pointcloud", "sensor_msgs/msg/PointCloud2", t, processed_cloud(k, t)),
                 ("/sensing/lidar/left/pointcloud_raw_ex", "sensor_msgs/msg/PointCloud2", t - 10_000_000,
                  left_cloud(k, t - 10_000_000)),
                 ("/sensing/lidar/concatenated/pointcloud", "sensor_msgs/msg/PointCloud2", t, top_cloud(k, t))]
    return sorted(msgs, key=lambda m: m[2])


def convert(tmp_path, msgs, storage="mcap", **options):
    from gsim.scenes.formats.rosbag import convert_rosbag
    bag = write_bag(bag_path(tmp_path, storage), storage, msgs)
    return validate_log(convert_rosbag(bag, tmp_path / "log", progress=False, **options))


@pytest.fixture(scope="module")
def autoware_log(tmp_path_factory):
    return convert(tmp_path_factory.mktemp("autoware"), autoware_messages())


def test_autoware_layout_found_without_flags(autoware_log):
    from gsim.cameras import FisheyeCamera, OpenCVCamera, PinholeCamera
    log = autoware_log
    assert sorted(log.cameras) == ["camera0", "camera1", "camera2", "camera3"]
    assert sorted(log.lidars) == ["left", "top"]  # the raw_ex clouds; not the processed or concatenated ones
    assert any("/perception/debug/image" in n and "no CameraInfo" in n for n in log.notes)
    # frames: one per sweep of the first LiDAR (left), the others' messages nearest in stamp
    assert [f.timestamp_us for f in log.frames] == [(EPOCH_NS + k * PERIOD_NS) // 1000 - 10_000 for k in range(N)]
    for f in log.frames:
        assert f.lidars["top"].timestamp_us == f.timestamp_us + 10_000
        assert {o.timestamp_us for o in f.cameras.values()} == {f.timestamp_us + 13_000}
    # poses: /localization/kinematic_state (not /a/odom), the first at the origin
    t = log.ego_timestamps_us
    np.testing.assert_allclose(log.ego_poses[:, :3, 3], np.c_[SPEED * (t - t[0]) / 1e6, 0 * t, 0 * t], atol=1e-6)
    origin = base_pose(int(t[0]) * 1000)[:3, 3]
    assert any(n.startswith("ego poses: /localization/kinematic_state") and f"moved by {(-origin).round(3).tolist()}"
               in n for n in log.notes)
    # camera models (principal points + 0.5 px) and extrinsics straight from tf (optical frames are gsim's)
    c = {n: s.camera for n, s in log.cameras.items()}
    fx, fy, cx, cy = 30.0, 31.0, 16.0, 12.0
    assert c["camera0"] == OpenCVCamera(W, H, fx, fy, cx, cy, -0.1, 0.01, 0.001, -0.002, 0.0005)
    assert c["camera1"] == FisheyeCamera(W, H, fx, fy, cx, cy, 0.05, -0.01, 0.002, -0.001)
    assert c["camera2"] == OpenCVCamera(W, H, fx, fy, cx, cy, -0.1, 0.01)
    assert c["camera3"] == PinholeCamera(W, H, 28.0, 28.0, 16.5, 12.5)
    for i, name in enumerate(["camera0", "camera1", "camera2"]):
        np.testing.assert_allclose(log.cameras[name].T_vehicle_camera, optical(90 * i), atol=1e-12)
    # camera3 is rectified: P = K' [I | t] applied to R X_optical, so its camera sits at R^T (-t) in the optical frame
    t3 = np.array([-14.0 / 28.0, 0, 0])
    np.testing.assert_allclose(log.cameras["camera3"].T_vehicle_camera,
                               optical(270) @ invert(rigid(np.eye(3), t3) @ rigid(R3, [0, 0, 0])), atol=1e-12)
    np.testing.assert_allclose(log.lidars["top"].T_vehicle_lidar, T_BASE_TOP_KIT @ T_KIT_TOP, atol=1e-12)
    np.testing.assert_allclose(log.lidars["left"].T_vehicle_lidar, T_BASE_LEFT, atol=1e-12)


def test_raw_images_decoded(autoware_log):
    """rgb8 with padded rows, bgr8, mono8 and bayer_rggb8 (OpenCV): the images as the camera saw them."""
    log = autoware_log
    for k, f in enumerate(log.frames):
        rgb = truth_rgb(k).astype(np.float32) / 255
        np.testing.assert_array_equal(log.image(f.cameras["camera0"]), rgb)
        np.testing.assert_array_equal(log.image(f.cameras["camera1"]), rgb)
        np.testing.assert_array_equal(log.image(f.cameras["camera2"]), np.repeat(rgb[..., 1:2], 3, 2))
        bayer = log.image(f.cameras["camera3"])
        assert np.abs(bayer[2:-2, 2:-2] - rgb[2:-2, 2:-2]).max() < 2 / 255  # (edges are interpolated one-sided)


def test_point_cloud_layouts(autoware_log):
    """Padded points, intensity uint8 and reflectivity uint16 to [0, 1], relative ns and absolute s per-point times
    to us from the stamp, big-endian; NaN and no-return points dropped; beams from the ring field."""
    log = autoware_log
    for k, f in enumerate(log.frames):
        xyz, _, intensity, ns = sweep_points(k, 0)
        for name, scale in (("top", 255.0), ("left", 65535.0 / 200)):
            s = log.sweep(f.lidars[name])
            assert s.shape == (len(xyz) - 2, 5)
            np.testing.assert_allclose(s[:, :3], xyz[:-2], atol=1e-5)
            np.testing.assert_allclose(s[:, 3], intensity[:-2] / scale, atol=1e-7)
            np.testing.assert_allclose(s[:, 4], np.round(ns[:-2] / 1000), atol=1 if name == "left" else 0)
    beams = log.lidars["top"].beams
    np.testing.assert_allclose(beams.elevations_deg, RINGS_DEG, atol=1e-4)
    assert beams.azimuth_resolution_deg == pytest.approx(4.0, abs=1e-3) and log.lidars["left"].beams is None


def test_flags_choose_topics_rate_and_window(tmp_path):
    from PIL import Image
    log = convert(tmp_path, autoware_messages(n=8), "sqlite3",
                  camera=["/sensing/camera/camera0/image_raw/compressed:/sensing/camera/camera0/camera_info"],
                  lidar=["/sensing/lidar/top/pointcloud"], pose="/localization/kinematic_state", rate=5.0,
                  start=0.25, end=0.75)
    assert list(log.cameras) == ["camera0"] and list(log.lidars) == ["top"]
    # the bag starts at tf_static (0.1 s before the first sweep): sweeps 2..6 are in the window, every other one kept
    assert [f.timestamp_us for f in log.frames] == [(EPOCH_NS + k * PERIOD_NS) // 1000 for k in (2, 4, 6)]
    for k, f in zip((2, 4, 6), log.frames):
        with Image.open(log.root / f.cameras["camera0"].image) as im:
            assert im.format == "PNG" and np.array_equal(np.asarray(im), truth_rgb(k))
        points = log.sweep(f.lidars["top"])  # the processed cloud: no per-point time, float intensity 0-255
        assert points.shape[1] == 4 and np.allclose(points[:, 3], sweep_points(k, 0)[2][:-2] / 255)


def test_split_and_compressed_bags(tmp_path, autoware_log):
    """A folder of split rosbag1 files and a zstd-compressed rosbag2 give the log of one plain bag."""
    msgs = autoware_messages()
    split = tmp_path / "split"
    split.mkdir()
    write_bag(split / "drive_0.bag", "rosbag1", msgs[:len(msgs) // 2])
    write_bag(split / "drive_1.bag", "rosbag1", msgs[len(msgs) // 2:])
    zstd = write_bag(tmp_path / "zstd", "sqlite3", msgs, zstd=True)
    from gsim.scenes.formats.rosbag import convert_rosbag
    for bag in (split, zstd):
        log = validate_log(convert_rosbag(bag, tmp_path / f"log_{bag.name}", progress=False))
        assert [f.timestamp_us for f in log.frames] == [f.timestamp_us for f in autoware_log.frames]
        for f, g in zip(log.frames, autoware_log.frames):
            assert np.array_equal(log.sweep(f.lidars["top"]), autoware_log.sweep(g.lidars["top"]))
            assert np.array_equal(log.image(f.cameras["camera3"]), autoware_log.image(g.cameras["camera3"]))
        np.testing.assert_array_equal(log.ego_poses, autoware_log.ego_poses)


def test_per_point_time_fields():
    """Per-point times as drivers write them, to us from the stamp; a field gsim would misread is refused."""
    from gsim.scenes.formats.rosbag import _offsets_us
    stamp = EPOCH_NS + 123_456_789
    rel_ns = np.array([0, 200, 800, 99_999_999])  # (absolute float seconds resolve 0.24 us in 2011)
    want = np.array([0, 0, 1, 100_000])
    for values in (rel_ns.astype(np.uint32),  # Ouster t, Livox offset_time, Autoware time_stamp
                   (rel_ns / 1e9).astype(np.float64),  # Velodyne time (float32 in the driver: below)
                   (stamp + rel_ns).astype(np.uint64),  # absolute ns
                   (stamp + rel_ns) / 1e9,  # Hesai, Robosense timestamp: absolute s
                   (stamp + rel_ns).astype(np.float64)):  # Livox timestamp: absolute ns in a float64
        np.testing.assert_array_equal(_offsets_us(values, stamp, "x"), want)
    np.testing.assert_array_equal(_offsets_us(np.float32([-0.05, 0.0123455]), stamp, "x"), [-50_000, 12_346])
    with pytest.raises(InputError, match=r"bag: /lidar: field time: per-point times up to [0-9.e+]+ s from the "
                                         r"message's stamp; gsim reads float times as seconds"):
        _offsets_us(np.float64([0, 5e7]), stamp, "bag: /lidar: field time")  # float nanoseconds: gsim misreads them


def test_list_prints_topics_and_choices(tmp_path, capsys):
    from gsim.cli import main
    bag = write_bag(bag_path(tmp_path, "rosbag1"), "rosbag1", autoware_messages())
    assert main(["convert", "rosbag", str(bag), "--list"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  /")}
    assert rows["/sensing/lidar/top/pointcloud_raw_ex"][:2] == ["sensor_msgs/msg/PointCloud2", str(N)]
    assert rows["/sensing/lidar/top/pointcloud_raw_ex"][-1] == "velodyne_top"
    assert rows["/localization/kinematic_state"][:2] == ["nav_msgs/msg/Odometry", str(2 * N + 4)]
    assert rows["/sensing/camera/camera1/camera_info"][-1] == "camera1/camera_optical_link"
    assert float(rows["/sensing/camera/camera0/image_raw"][2]) > 0
    assert len(rows) == 17 and not list(tmp_path.glob("log*"))
    assert "  camera camera0: /sensing/camera/camera0/image_raw with /sensing/camera/camera0/camera_info" in out
    assert "  camera camera3: /sensing/camera/camera3/image_rect_color with /sensing/camera/camera3/camera_info " \
           "(rectified: P)" in out
    assert ("  lidar left: /sensing/lidar/left/pointcloud_raw_ex\n"
            "  lidar top: /sensing/lidar/top/pointcloud_raw_ex") in out
    assert "  poses: /localization/kinematic_state; vehicle frame 'base_link'" in out


# --------------------------------------------------------------------------- bad bags

def drop(msgs, *prefixes):
    return [m for m in msgs if not m[0].startswith(prefixes)]


def bad(tmp_path, name, msgs, pattern, storage="mcap", **options):
    """The bag's conversion fails with one line matching ``pattern`` and leaves nothing behind."""
    from gsim.scenes.formats.rosbag import convert_rosbag
    bag = write_bag(bag_path(tmp_path, storage, name), storage, msgs)
    with pytest.raises(InputError, match=pattern) as e:
        convert_rosbag(bag, tmp_path / "out", progress=False, **options)
    assert "\n" not in str(e.value) and str(bag) in str(e.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_bad_bags(tmp_path):
    from gsim.scenes.formats.rosbag import describe_bag
    msgs = autoware_messages(n=2)
    bad(tmp_path, "yuv", autoware_messages(n=2, encodings={"camera1": "yuv422"}),
        r"/sensing/camera/camera1/image_raw: image encoding 'yuv422' not supported \(rgb8, ")
    no_info = r"/sensing/camera/camera0/image_raw: a camera without a sensor_msgs/CameraInfo \(no " \
              r"/sensing/camera/camera0/camera_info\); name its topic with --camera"
    bad(tmp_path, "no_info", drop(msgs, "/sensing/camera/camera0/camera_info", "/sensing/camera/camera1",
                                  "/sensing/camera/camera2", "/sensing/camera/camera3", "/perception"), no_info)
    listed = describe_bag(bag_path(tmp_path, "mcap", "no_info")).splitlines()  # --list says why, too
    assert re.match("gsim cannot convert it as it is: .*" + no_info, listed[-1])
    bad(tmp_path, "tf", [m if m[0] != "/tf_static" else (*m[:3], {"transforms": m[3]["transforms"][:2]})
                         for m in msgs],
        r"tf: no chain from frame 'velodyne_left' to 'base_link' .*\('velodyne_left' reaches 'velodyne_left', "
        r"'base_link' reaches 'base_link'\)")
    bad(tmp_path, "odometry", drop(autoware_messages(n=1), "/localization", "/a/odom"),
        r"no pose source \(no Odometry, .*\) and 1 sweep\(s\) of /sensing/lidar/left/pointcloud_raw_ex: LiDAR odometry "
        r"needs at least 2")
    bad(tmp_path, "empty", [], r"no sensor_msgs Image, CompressedImage or PointCloud2 topic with messages \(the bag "
                               r"is empty\)")
    rational = [(*m[:3], {**m[3], "d": [-0.1, 0.01, 0, 0, 0, 0.002, 0, 0]}) if m[0].endswith("camera2/camera_info")
                else m for m in msgs]
    bad(tmp_path, "rational", rational, r"/sensing/camera/camera2/camera_info: distortion_model rational_polynomial "
                                        r"with k4..k6 = \[0.002, 0.0, 0.0\]: gsim has no rational model")
    late = [(*m[:2], m[2], {**m[3], "header": header(m[2] + 80_000_000, m[3]["header"]["frame_id"])})
            if m[0] == "/sensing/camera/camera2/image_raw" else m for m in msgs]
    bad(tmp_path, "late", late, r"/sensing/camera/camera2/image_raw: 1 of the 2 frames have no message of "
                                r"/sensing/camera/camera2/image_raw within 50 ms \(the largest gap 93.0 ms")


@pytest.mark.parametrize("storage", STORAGES)
def test_truncated_bag(tmp_path, storage):
    from gsim.scenes.formats.rosbag import convert_rosbag
    bag = write_bag(bag_path(tmp_path, storage), storage, autoware_messages(n=2))
    f = storage_file(bag, storage)
    f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])
    with pytest.raises(InputError, match=r"not a readable ROS bag .*: truncated or damaged\?"):
        convert_rosbag(bag, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
