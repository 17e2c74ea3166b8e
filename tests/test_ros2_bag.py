"""ROS 2 bags out (gsim.ros2_bag): `gsim render`, `render-lidar`, `scenario render` and `closed-loop` write one; it is
read back with rosbags and with a second decoder (mcap-ros2-support), compared with what gsim rendered, and
converted back with `gsim convert rosbag` into a log with the same calibration, poses, images and points."""
import io
import json
from collections import defaultdict

import numpy as np
import pytest
from PIL import Image

import gsim
from gsim.cli import main
from gsim.errors import InputError
from gsim.io import to_uint8
from gsim.ros2_bag import POINT_TYPES, T_BASE_OPTICAL, BagOptions, Ros2BagWriter, build, camera_info, topic_token
from gsim.transforms import quat_to_rotmat

from support import ACROSS, CAMERAS, pose, scenario, scenario_dict

pytest.importorskip("rosbags", reason="rosbags (the ros2 extra) writes the bags")
pytest.importorskip("mcap_ros2", reason="mcap-ros2-support (the ros2 extra) is the second decoder")

STEP_US = 100_000
COMMON = {"/clock", "/tf", "/tf_static", "/gsim/ego/odom", "/gsim/actors/markers"}
JPEG_MEAN_ERROR = 3.0  # quality 90 on these smooth renders: ~1 grey level on average


# --------------------------------------------------------------------------- reading a bag

def _stamp_ns(m) -> int:
    s = m.clock if hasattr(m, "clock") else (m.transforms[0].header.stamp if hasattr(m, "transforms") else
                                             m.markers[0].header.stamp if hasattr(m, "markers") else m.header.stamp)
    return s.sec * 1_000_000_000 + s.nanosec


def read_bag(path) -> dict:
    """{topic: [message]} read with rosbags, after checking that mcap-ros2-support decodes every message the same
    (stamps, frames, payload bytes), that each message's record time is its stamp and that a topic's increase."""
    from mcap.reader import make_reader
    from mcap_ros2.decoder import DecoderFactory
    from rosbags.highlevel import AnyReader
    ours, counts = defaultdict(list), {}
    with AnyReader([path]) as r:
        for c, t, raw in r.messages():
            ours[c.topic].append((t, r.deserialize(raw, c.msgtype)))
        counts = {c.topic: c.msgcount for c in r.connections}
        types = {c.topic: c.msgtype for c in r.connections}
    second = defaultdict(list)
    with open(next(path.glob("*.mcap")), "rb") as f:
        for schema, channel, message, decoded in make_reader(f, decoder_factories=[DecoderFactory()]) \
                .iter_decoded_messages():
            assert schema.name == types[channel.topic] and channel.message_encoding == "cdr"
            second[channel.topic].append((message.log_time, decoded))
    assert {t: len(v) for t, v in ours.items()} == {t: len(v) for t, v in second.items()} == counts
    for topic, items in ours.items():
        stamps = [_stamp_ns(m) for _, m in items]
        assert [t for t, _ in items] == stamps == [t for t, _ in second[topic]] == [_stamp_ns(m) for _, m in
                                                                                      second[topic]]
        assert all(b > a for a, b in zip(stamps, stamps[1:])), topic
        for (_, a), (_, b) in zip(items, second[topic]):
            if hasattr(a, "data"):
                assert bytes(a.data) == bytes(b.data)
            if hasattr(a, "header"):
                assert a.header.frame_id == b.header.frame_id
    return {t: [m for _, m in items] for t, items in ours.items()}


def matrix(p, q) -> np.ndarray:
    """4x4 of a geometry_msgs position / translation and orientation / rotation."""
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = quat_to_rotmat(np.array([q.w, q.x, q.y, q.z])), [p.x, p.y, p.z]
    return T


def mounts(msgs) -> dict:
    """{child frame: T_base_child} of the bag's one /tf_static message."""
    (static,) = msgs["/tf_static"]
    assert {t.header.frame_id for t in static.transforms} == {"base_link"}
    return {t.child_frame_id: matrix(t.transform.translation, t.transform.rotation) for t in static.transforms}


def base_poses(msgs) -> np.ndarray:
    """(steps,4,4) T_map_base of /tf, checked against the odometry."""
    tf = [m.transforms[0] for m in msgs["/tf"]]
    assert {(t.header.frame_id, t.child_frame_id) for t in tf} == {("map", "base_link")}
    poses = np.stack([matrix(t.transform.translation, t.transform.rotation) for t in tf])
    odom = np.stack([matrix(m.pose.pose.position, m.pose.pose.orientation) for m in msgs["/gsim/ego/odom"]])
    assert np.allclose(odom, poses, atol=1e-12)
    return poses


def rgb(msg) -> np.ndarray:
    if hasattr(msg, "format"):
        assert "jpeg" in msg.format
        return np.asarray(Image.open(io.BytesIO(bytes(msg.data))).convert("RGB"))
    assert msg.encoding == "rgb8" and msg.step == 3 * msg.width
    return np.frombuffer(bytes(msg.data), np.uint8).reshape(msg.height, msg.width, 3)


def points(msg) -> np.ndarray:
    """A PointCloud2's points as a structured array read through its own field table."""
    f = {x.name: x for x in msg.fields}
    assert [(x.name, POINT_TYPES[x.datatype]) for x in msg.fields] == [
        ("x", "f4"), ("y", "f4"), ("z", "f4"), ("intensity", "f4"), ("ring", "u2"), ("time", "f4")]
    dt = np.dtype({"names": list(f), "formats": ["<" + POINT_TYPES[x.datatype] for x in f.values()],
                   "offsets": [x.offset for x in f.values()], "itemsize": msg.point_step})
    assert not msg.is_bigendian and msg.height == 1 and msg.row_step == msg.point_step * msg.width
    return np.frombuffer(bytes(msg.data), np.uint8).view(dt)


def same_images(a: np.ndarray, b: np.ndarray, jpeg: bool) -> bool:
    if not jpeg:
        return a.shape == b.shape and np.array_equal(a, b)
    return a.shape == b.shape and np.abs(a.astype(int) - b).mean() < JPEG_MEAN_ERROR


def relative(poses: np.ndarray) -> np.ndarray:
    """Poses from the first one's frame: a converted log's world is the bag's map moved to its first pose."""
    return np.linalg.solve(poses[0], poses)


def convert(bag, out):
    from gsim.scenes.formats.rosbag import convert_rosbag
    from gsim.scenes.log import validate_log
    return validate_log(convert_rosbag(bag, out, progress=False))


# --------------------------------------------------------------------------- the four commands

@pytest.mark.parametrize("jpeg", [False, True])
def test_render_bag_holds_the_renders_and_converts_back(edit_street, tmp_path, jpeg):
    """gsim render's frames (an OpenCV camera along the lane past the parked sedan) as a bag."""
    from gsim.render.sequence import ROS2_CAMERA, render_sequence
    from gsim.trajectory import Trajectory
    root, _ = edit_street
    scene = gsim.load_scene(root / "scene")
    camera = CAMERAS[1]
    times = np.arange(3, dtype=np.int64) * STEP_US
    base = np.stack([pose(2.0 * k, -1.75, 0.02 * k, z=1.5) for k in range(3)])
    bag = tmp_path / "bag"
    render_sequence(scene, Trajectory(camera, times, base @ T_BASE_OPTICAL), tmp_path / "out", "numba", video=False,
                    ros2_bag=BagOptions(bag, jpeg=jpeg))
    msgs = read_bag(bag)
    image_topic = "/gsim/camera/main/image_raw" + ("/compressed" if jpeg else "")
    assert set(msgs) == COMMON | {image_topic, "/gsim/camera/main/camera_info"}
    assert [_stamp_ns(m) // 1000 for m in msgs["/clock"]] == times.tolist()
    frame = "camera_main_optical_frame"
    assert np.allclose(mounts(msgs)[frame], T_BASE_OPTICAL, atol=1e-12)
    assert np.allclose(base_poses(msgs), base, atol=1e-9)
    assert all(m.header.frame_id == frame for m in msgs[image_topic])
    for i, m in enumerate(msgs[image_topic]):
        assert same_images(rgb(m), np.asarray(Image.open(tmp_path / "out" / "rgb" / f"{i:06d}.png")), jpeg)
    info = msgs["/gsim/camera/main/camera_info"][0]
    assert info.distortion_model == "plumb_bob" and np.allclose(info.d, [camera.k1, camera.k2, camera.p1, camera.p2,
                                                                         camera.k3])
    assert np.allclose(info.k, [camera.fx, 0, camera.cx - 0.5, 0, camera.fy, camera.cy - 0.5, 0, 0, 1])
    odom = msgs["/gsim/ego/odom"][0]
    assert odom.child_frame_id == "base_link" and odom.twist.covariance[0] == -1  # render knows no speed
    for t, m in zip(times, msgs["/gsim/actors/markers"]):
        clear, cube = m.markers
        assert clear.action == 3 and cube.type == 1 and cube.text == "parked_a" and cube.header.frame_id == "map"
        actor = scene.actors[0]
        assert np.allclose(matrix(cube.pose.position, cube.pose.orientation), actor.pose_at(int(t)), atol=1e-9)
        assert np.allclose([cube.scale.x, cube.scale.y, cube.scale.z], actor.size)
    log = convert(bag, tmp_path / "log")
    assert log.cameras[ROS2_CAMERA].camera == camera
    assert np.allclose(log.cameras[ROS2_CAMERA].T_vehicle_camera, T_BASE_OPTICAL, atol=1e-12)
    assert np.allclose(relative(log.ego_poses), relative(base), atol=1e-9)
    for i, (_, obs) in enumerate(log.camera_observations()):
        assert obs.timestamp_us == times[i]
        assert same_images(to_uint8(log.image(obs)), rgb(msgs[image_topic][i]), jpeg=False)  # stored as received


def test_render_lidar_bag_holds_the_sweeps_and_converts_back(edit_street, tmp_path):
    """gsim render-lidar's two rolling VLP-16 sweeps (the CLI, in process) as a bag."""
    from gsim.lidar.spec import lidar_preset
    root, _ = edit_street
    poses = np.stack([pose(0.0, -1.75, z=1.8), pose(1.0, -1.75, 0.05, z=1.8)])
    traj = tmp_path / "lidar.json"
    traj.write_text(json.dumps({"schema_version": 1, "frames": [
        {"timestamp_us": k * STEP_US, "T_world_lidar": T.tolist()} for k, T in enumerate(poses)]}))
    out, bag = tmp_path / "sweeps", tmp_path / "bag"
    assert main(["render-lidar", str(root / "scene"), "--spec", "velodyne-vlp16", "--trajectory", str(traj),
                 "--out", str(out), "--ros2-bag", str(bag)]) == 0
    msgs = read_bag(bag)
    topic = "/gsim/lidar/velodyne_vlp16/points"
    assert set(msgs) == COMMON | {topic}
    assert np.allclose(mounts(msgs)["lidar_velodyne_vlp16"], np.eye(4)) and np.allclose(base_poses(msgs), poses)
    for i, m in enumerate(msgs[topic]):
        assert m.header.frame_id == "lidar_velodyne_vlp16"
        p, table = points(m), np.load(out / "points" / f"{i:06d}.npy")  # x, y, z, range, ring, time offset us
        assert len(p) == len(table) > 1000
        assert np.array_equal(np.c_[p["x"], p["y"], p["z"]], table[:, :3]) and np.array_equal(p["ring"], table[:, 4])
        assert np.array_equal(np.round(p["time"].astype(np.float64) * 1e6), table[:, 5]) and p["time"].max() > 0.05
        assert not p["intensity"].any()  # the scene has no LiDAR head
    log = convert(bag, tmp_path / "log")
    (name,) = log.lidars
    assert name == "velodyne_vlp16" and np.allclose(log.lidars[name].T_vehicle_lidar, np.eye(4))
    spec, rings = lidar_preset("velodyne-vlp16"), np.unique(points(msgs[topic][0])["ring"])
    assert len(rings) > 4 and np.allclose(log.lidars[name].beams.elevations_deg,  # the rings that hit the ground
                                          [spec.elevations_deg[r] for r in rings], atol=1e-4)
    assert np.allclose(relative(log.ego_poses), relative(poses), atol=1e-9)
    for frame, m in zip(log.frames, msgs[topic]):
        sweep, p = log.sweep(frame.lidars[name]), points(m)
        assert np.array_equal(sweep[:, :3], np.c_[p["x"], p["y"], p["z"]])
        assert np.array_equal(sweep[:, 4], np.round(p["time"].astype(np.float64) * 1e6))


def test_scenario_render_bag_matches_its_log(edit_street, tmp_path):
    """gsim scenario render (the CLI, in process; JPEG images): the bag holds what the scenario's log holds."""
    from gsim.scenes.log import load_log
    root, _ = edit_street
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario_dict(root, output=str(tmp_path / "o"))))
    bag = tmp_path / "bag"
    assert main(["scenario", "render", str(path), "--ros2-bag", str(bag), "--ros2-jpeg"]) == 0
    ref = load_log(tmp_path / "o" / "log")
    msgs = read_bag(bag)
    images, clouds = "/gsim/camera/front/image_raw/compressed", "/gsim/lidar/top/points"
    assert set(msgs) == COMMON | {images, "/gsim/camera/front/camera_info", clouds}
    frames = mounts(msgs)
    assert np.allclose(frames["camera_front_optical_frame"], ref.cameras["front"].T_vehicle_camera, atol=1e-9)
    assert np.allclose(frames["lidar_top"], ref.lidars["top"].T_vehicle_lidar, atol=1e-9)
    assert np.allclose(base_poses(msgs), [ref.T_world_vehicle(f.timestamp_us) for f in ref.frames], atol=1e-6)
    assert len(msgs[images]) == len(msgs[clouds]) == len(ref.frames)
    for f, im, pc in zip(ref.frames, msgs[images], msgs[clouds]):
        assert same_images(rgb(im), to_uint8(ref.image(f.cameras["front"])), jpeg=True)
        sweep, p = ref.sweep(f.lidars["top"]), points(pc)
        assert np.array_equal(np.c_[p["x"], p["y"], p["z"], p["intensity"]], sweep[:, :4])
        assert np.array_equal(np.round(p["time"].astype(np.float64) * 1e6), sweep[:, 4])
    ids = {c.text for m in msgs["/gsim/actors/markers"] for c in m.markers[1:]}
    assert ids == {a.id for a in ref.actors} and "ahead" in ids
    log = convert(bag, tmp_path / "log")
    assert log.cameras["front"].camera == ref.cameras["front"].camera
    assert np.allclose(log.cameras["front"].T_vehicle_camera, ref.cameras["front"].T_vehicle_camera, atol=1e-9)
    assert np.allclose(log.lidars["top"].T_vehicle_lidar, ref.lidars["top"].T_vehicle_lidar, atol=1e-9)
    assert np.allclose(relative(np.stack([log.T_world_vehicle(f.timestamp_us) for f in log.frames])),
                       relative(np.stack([ref.T_world_vehicle(f.timestamp_us) for f in ref.frames])), atol=1e-9)


def test_closed_loop_bag_matches_the_run(loop_street, tmp_path):
    """A closed-loop run of three steps: the bag's sensors, ego and actors are the run's (its log and steps)."""
    pytest.importorskip("libsumo")
    from gsim.bridges.closed_loop.runner import run
    from gsim.scenes.log import load_log
    bag, out = tmp_path / "bag", tmp_path / "run"
    run(scenario(loop_street, "bagged", ACROSS), "replay", out, progress=False, max_steps=2, video=False,
        ros2_bag=BagOptions(bag))
    ref = load_log(out / "log")
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    msgs = read_bag(bag)
    images, clouds = "/gsim/camera/front/image_raw", "/gsim/lidar/top/points"
    assert set(msgs) == COMMON | {images, "/gsim/camera/front/camera_info", clouds}
    assert [_stamp_ns(m) // 1000 for m in msgs["/clock"]] == [s["t_us"] for s in steps] == [f.timestamp_us for f
                                                                                            in ref.frames]
    assert np.allclose(base_poses(msgs), [ref.T_world_vehicle(f.timestamp_us) for f in ref.frames], atol=1e-9)
    speeds = [m.twist.twist.linear.x for m in msgs["/gsim/ego/odom"]]
    assert np.allclose(speeds, [s["ego"]["speed_mps"] for s in steps]) and min(speeds) > 1
    for f, im, pc in zip(ref.frames, msgs[images], msgs[clouds]):
        assert same_images(rgb(im), to_uint8(ref.image(f.cameras["front"])), jpeg=False)
        sweep, p = ref.sweep(f.lidars["top"]), points(pc)
        assert np.array_equal(np.c_[p["x"], p["y"], p["z"], p["intensity"]], sweep[:, :4])
        # the sweep spun over the step that ends at the stamp: its points' times are within the step before it
        assert np.array_equal(np.round(p["time"].astype(np.float64) * 1e6), sweep[:, 4] - STEP_US)
        assert set(np.unique(p["ring"])) <= set(range(16)) and len(np.unique(p["ring"])) > 4
    for m, s in zip(msgs["/gsim/actors/markers"], steps):
        assert {c.text for c in m.markers[1:]} == {a["id"] for a in s["actors"]} >= {"across"}
    log = convert(bag, tmp_path / "log")
    assert np.allclose(relative(log.ego_poses), relative(ref.ego_poses), atol=1e-9)
    assert log.cameras["front"].camera == ref.cameras["front"].camera


# --------------------------------------------------------------------------- mapping and bad input

def test_camera_info_reads_back_as_every_camera_model():
    """pinhole, OpenCV and fisheye through CameraInfo and the rosbag converter's reading: the same camera."""
    from rosbags.typesys import Stores, get_typestore
    from gsim.scenes.formats.rosbag import _camera_model
    ts = get_typestore(Stores.LATEST)
    models = []
    for cam in CAMERAS:
        info = build(ts, "sensor_msgs/msg/CameraInfo", camera_info(cam, 0, "f"))
        back, T = _camera_model(info, False, "test")
        assert back == cam and np.array_equal(T, np.eye(4))
        models.append(info.distortion_model)
    assert models == ["plumb_bob", "plumb_bob", "equidistant"]


def test_bad_output_folders_are_refused_and_nothing_is_left(tmp_path):
    rig = ({"front": (CAMERAS[0], T_BASE_OPTICAL)}, {})
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="exists already"):
        Ros2BagWriter(BagOptions(taken), *rig)
    assert [p.name for p in tmp_path.iterdir()] == ["taken"] and (taken / "keep.txt").read_text() == "mine"
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError) as e:
        Ros2BagWriter(BagOptions(blocker / "bag"), *rig)
    assert str(blocker / "bag") in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "taken"]
    with pytest.raises(InputError, match="quality"):
        Ros2BagWriter(BagOptions(tmp_path / "q", jpeg=True, jpeg_quality=0), *rig)
    with pytest.raises(InputError, match="share the topic name"):
        Ros2BagWriter(BagOptions(tmp_path / "clash"), {"a-b": rig[0]["front"], "a_b": rig[0]["front"]}, {})
    assert topic_token("2nd.cam") == "_2nd_cam"


def test_an_error_while_writing_removes_the_bag(tmp_path):
    """Stamps that do not increase (a trajectory with a repeated time) stop the bag; nothing is left."""
    bag = tmp_path / "bag"
    with pytest.raises(InputError, match="must increase"):
        with Ros2BagWriter(BagOptions(bag), {"front": (CAMERAS[0], T_BASE_OPTICAL)}, {}) as w:
            w.step(0, np.eye(4))
            w.image("front", 0, np.zeros((32, 48, 3), np.uint8))
            w.step(0, np.eye(4))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InputError, match="shape"):
        with Ros2BagWriter(BagOptions(bag), {"front": (CAMERAS[0], T_BASE_OPTICAL)}, {}) as w:
            w.step(0, np.eye(4))
            w.image("front", 0, np.zeros((10, 10, 3), np.uint8))
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_takes_the_flag_where_it_means_something(edit_street, tmp_path, capsys):
    root, _ = edit_street
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario_dict(root)))
    assert main(["scenario", "validate", str(path), "--ros2-bag", str(tmp_path / "b")]) == 2
    assert "--ros2-bag is for gsim scenario render" in capsys.readouterr().err
    assert main(["closed-loop", "lead-car", "--agent", "replay,privileged", "--out", str(tmp_path / "o"),
                 "--ros2-bag", str(tmp_path / "b")]) == 2
    assert "records one run" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "o").exists()
    traj = tmp_path / "lidar.json"
    traj.write_text(json.dumps({"schema_version": 1, "frames": [{"timestamp_us": 0, "T_world_lidar": np.eye(4).tolist()}]}))
    (tmp_path / "taken").mkdir()
    assert main(["render-lidar", str(root / "scene"), "--spec", "velodyne-vlp16", "--trajectory", str(traj),
                 "--out", str(tmp_path / "x"), "--ros2-bag", str(tmp_path / "taken")]) == 2
    assert "exists already" in capsys.readouterr().err and not (tmp_path / "x").exists()
