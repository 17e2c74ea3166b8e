"""Dataset converters (KITTI raw, DGP, nerfstudio) on the real samples in ../shared/data and on small
hand-made inputs. Conventions are checked the way a user would: LiDAR points projected into the
camera land where the dataset's own formula puts them, and on image edges. Overlays (points coloured
by depth) go to tmp_path and, for a human, to /tmp/gsim_overlays/."""
import itertools
import json
import math
import re
import sys
import time

import numpy as np
import pytest

from gsim.cameras import FisheyeCamera, OpenCVCamera, PinholeCamera
from gsim.scenes.log import LogFormatError, LogWriter, load_log, validate_log
from gsim.transforms import invert, look_at, quat_to_rotmat

from format_checks import DATA, edge_score, project, voxel_overlap, write_overlay

KITTI = DATA / "kitti_raw" / "2011_09_26"
DDAD = DATA / "ddad_dgp"
CALIBS = ("calib_cam_to_cam.txt", "calib_velo_to_cam.txt", "calib_imu_to_velo.txt")
needs_kitti = pytest.mark.skipif(not KITTI.is_dir(), reason=f"KITTI raw sample not found at {KITTI} "
                                 "(see ../shared/data/README.md)")
needs_ddad = pytest.mark.skipif(not DDAD.is_dir(), reason=f"DDAD/DGP sample not found at {DDAD} "
                                "(see ../shared/data/README.md)")


def read_kitti_calib(path):
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        try:
            out[key] = np.array(value.split(), float)
        except ValueError:  # calib_time
            pass
    return out


def kitti_tree(root, drive=None, image_03=False):
    """A KITTI date folder under ``root`` made of per-file symlinks to the shared sample (never modified):
    flattened, or with the sensor folders in ``drive``; ``image_03`` adds a right camera folder (image_02's
    files stand in: the sample has none). Returns (date folder, sensor folder parent)."""
    date = root / KITTI.name
    date.mkdir(parents=True)
    for c in CALIBS:
        (date / c).symlink_to(KITTI / c)
    d = date / drive if drive else date
    folders = {"image_02": "image_02", "velodyne_points": "velodyne_points"}
    if image_03:
        folders["image_03"] = "image_02"
    for sensor, source in folders.items():
        (d / sensor / "data").mkdir(parents=True)
        for f in sorted((KITTI / source / "data").iterdir()):
            (d / sensor / "data" / f.name).symlink_to(f)
    return date, d


# --------------------------------------------------------------------------- KITTI raw

@pytest.fixture(scope="module")
def kitti_log(tmp_path_factory):
    pytest.importorskip("kiss_icp", reason="kiss-icp (the lidar extra) estimates the sample's poses")
    if not KITTI.is_dir():
        pytest.skip(f"KITTI raw sample not found at {KITTI}")
    from gsim.scenes.formats.kitti_raw import convert_kitti_raw
    t = time.perf_counter()
    out = convert_kitti_raw(KITTI, tmp_path_factory.mktemp("kitti") / "log", progress=False)
    print(f"KITTI raw, 40 frames: converted in {time.perf_counter() - t:.1f} s")
    return validate_log(out)


@needs_kitti
def test_kitti_log_contents(kitti_log):
    log = kitti_log
    assert len(log.frames) == 40 and set(log.cameras) == {"image_02"} and set(log.lidars) == {"velodyne"}
    assert [f.timestamp_us for f in log.frames] == [100_000 * k for k in range(40)]
    assert any("LiDAR odometry" in n for n in log.notes) and any("10 Hz" in n for n in log.notes)
    cam = log.cameras["image_02"].camera
    assert isinstance(cam, PinholeCamera) and (cam.width, cam.height) == (1242, 375)
    beams = log.lidars["velodyne"].beams
    el = beams.elevations_deg
    assert len(el) == 64 and max(el) == 2.0 and -25 < min(el) < -24
    f = log.frames[7]
    image = (log.root / f.cameras["image_02"].image).read_bytes()
    assert image == (KITTI / "image_02/data/0000000007.png").read_bytes()
    raw = np.fromfile(KITTI / "velodyne_points/data/0000000007.bin", np.float32).reshape(-1, 4)
    assert np.array_equal(log.sweep(f.lidars["velodyne"]), raw)
    # the camera sits ~0.27 m ahead of the Velodyne, looking forward (vehicle x) with image y down (vehicle -z)
    T = log.cameras["image_02"].T_vehicle_camera
    assert 0.2 < T[0, 3] < 0.35 and T[:3, 2] @ [1, 0, 0] > 0.99 and T[:3, 1] @ [0, 0, -1] > 0.99


@needs_kitti
@pytest.mark.parametrize("k", [0, 39])
def test_kitti_lidar_projects_onto_the_image(kitti_log, k, tmp_path):
    log = kitti_log
    frame = log.frames[k]
    uv, inside, pc = project(log, frame, "image_02", "velodyne")
    # KITTI's own formula on the raw calibration files; gsim's pixel centres are at +0.5
    cc, vc = read_kitti_calib(KITTI / CALIBS[0]), read_kitti_calib(KITTI / CALIBS[1])
    R0, Tv = np.eye(4), np.eye(4)
    R0[:3, :3] = cc["R_rect_00"].reshape(3, 3)
    Tv[:3, :3], Tv[:3, 3] = vc["R"].reshape(3, 3), vc["T"]
    pts = log.sweep(frame.lidars["velodyne"])[:, :3].astype(np.float64)
    h = (cc["P_rect_02"].reshape(3, 4) @ R0 @ Tv @ np.c_[pts, np.ones(len(pts))].T).T
    uv_kitti = h[:, :2] / h[:, 2:]
    assert inside.sum() > 10_000
    assert np.abs(uv[inside] - 0.5 - uv_kitti[inside]).max() < 0.01
    # every point ahead of the car within +-30 deg and above -8 deg elevation lands in the image
    x, y, z = pts.T
    ahead = (x > 5) & (np.abs(y) < 0.58 * x) & (z > -0.14 * np.hypot(x, y))
    assert ahead.sum() > 5000 and inside[ahead].mean() > 0.99
    # LiDAR silhouettes sit on image edges: shifting the projection by 8 px in any direction loses
    rgb = log.image(frame.cameras["image_02"])
    aligned = edge_score(rgb, uv, pc)
    for dx, dy in itertools.product((-8, 0, 8), repeat=2):
        if (dx, dy) != (0, 0):
            assert aligned > 1.05 * edge_score(rgb, uv, pc, (dx, dy)), (dx, dy)
    write_overlay(rgb, uv[inside], pc[inside, 2], f"kitti_image_02_{k:06d}.png", tmp_path)


@needs_kitti
def test_kitti_odometry_poses(kitti_log):
    log = kitti_log
    P = log.ego_poses
    # world = the first sweep's frame; the smoothed first position stays within centimetres of it
    assert np.allclose(P[0][:3, :3], np.eye(3), atol=1e-9) and np.linalg.norm(P[0][:3, 3]) < 0.1
    assert any("odometry positions smoothed" in n for n in log.notes)
    rel = np.stack([invert(a) @ b for a, b in zip(P[:-1], P[1:])])
    step = rel[:, :3, 3]
    # stop-and-go creep: < 0.5 m per 0.1 s, forward (vehicle +x), little sideways or vertical motion
    assert np.all(np.linalg.norm(step, axis=1) < 0.5) and np.all(step[:, 0] > 0)
    assert np.all(np.abs(step[:, 1:]) < 0.1)
    angles = np.degrees(np.arccos(np.clip((np.trace(rel[:, :3, :3], axis1=1, axis2=2) - 1) / 2, -1, 1)))
    assert angles.max() < 2
    # a car's speed: no jumps of 1.5 m/s between sweeps (kiss-icp's raw estimates have them: 4.8 m/s^2 rms)
    accel = np.diff(np.linalg.norm(step, axis=1) / 0.1) / 0.1
    assert np.sqrt(np.mean(accel ** 2)) < 2.0
    length = np.linalg.norm(step, axis=1).sum()
    print(f"kiss-icp trajectory over 40 sweeps: {length:.2f} m")
    assert 3 < length < 15

    # aligned sweeps overlap sweep 0 better than unaligned ones and than the aligned ones moved by 3 m
    def world(k, shift=0.0):
        o = log.frames[k].lidars["velodyne"]
        p = log.sweep(o)[:, :3].astype(np.float64)
        r = np.linalg.norm(p, axis=1)
        p = p[(p[:, 2] > -1.3) & (r > 3) & (r < 50)]  # above the road, where structure is
        T = log.T_world_lidar(o)
        return p @ T[:3, :3].T + T[:3, 3] + [shift, 0, 0], p
    ref = world(0)[0]
    for k in (10, 20, 39):
        aligned, raw = world(k)
        score = voxel_overlap(ref, aligned)
        assert score > 1.1 * voxel_overlap(ref, raw), k
        assert score > 1.1 * max(voxel_overlap(ref, world(k, s)[0]) for s in (-3.0, 3.0)), k


def test_odometry_smoothing_keeps_steady_motion_and_removes_jitter():
    from gsim.scenes.formats.convert_util import smooth_positions
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.uniform(90_000, 110_000, 60)).astype(np.int64)  # uneven sweep times
    s = (t - t[0]) / 1e6
    poses = np.tile(np.eye(4), (60, 1, 1))
    poses[:, :3, 3] = np.stack([2.0 + 1.5 * s, 0.3 * s, np.zeros_like(s)], 1)  # constant velocity: unchanged
    np.testing.assert_allclose(smooth_positions(t, poses), poses, atol=1e-9)
    poses[:, 0, 3] += 0.5 * 0.8 * s ** 2  # braking gently, estimated with 3 cm of noise
    noisy = poses.copy()
    noisy[:, :3, 3] += rng.normal(0, 0.03, (60, 3))
    out = smooth_positions(t, noisy)
    err = lambda p: np.sqrt(np.mean((p[:, :3, 3] - poses[:, :3, 3]) ** 2))  # noqa: E731
    assert err(out) < 0.5 * err(noisy)
    assert np.array_equal(out[:, :3, :3], noisy[:, :3, :3])


@needs_kitti
def test_kitti_drive_layout_and_drive_choice(kitti_log, tmp_path):
    pytest.importorskip("kiss_icp")
    from gsim.scenes.formats.kitti_raw import convert_kitti_raw
    date, _ = kitti_tree(tmp_path / "a", drive="2011_09_26_drive_0001_sync", image_03=True)
    log = validate_log(convert_kitti_raw(date, tmp_path / "out", max_frames=3, progress=False))
    assert len(log.frames) == 3 and log.name == "2011_09_26_drive_0001_sync"
    # the same odometry; the smoothing of 3 positions differs from that of 40 by centimetres
    assert np.allclose(log.ego_poses[:, :3, :3], kitti_log.ego_poses[:3, :3, :3], atol=1e-6)
    assert np.allclose(log.ego_poses[:, :3, 3], kitti_log.ego_poses[:3, :3, 3], atol=0.1)
    # the right camera (P_rect_03) sits the stereo baseline (0.54 m) to the right of the left one (-y)
    left, right = (log.cameras[c].T_vehicle_camera for c in ("image_02", "image_03"))
    assert np.allclose(right[:3, 3] - left[:3, 3], [0, -0.533, 0], atol=0.01)
    assert np.allclose(right[:3, :3], left[:3, :3])  # rectified: parallel optical axes
    for k in range(3):
        a, b = log.frames[k].lidars["velodyne"], kitti_log.frames[k].lidars["velodyne"]
        assert np.array_equal(log.sweep(a), kitti_log.sweep(b))
    (date / "2011_09_26_drive_0002_sync").mkdir()
    with pytest.raises(ValueError, match="several drives.*drive="):
        convert_kitti_raw(date, tmp_path / "out2", progress=False)
    with pytest.raises(ValueError, match="drive '0005' not found"):
        convert_kitti_raw(date, tmp_path / "out2", drive="0005", progress=False)
    chosen = convert_kitti_raw(date, tmp_path / "out2", drive="0001", max_frames=2, progress=False)
    assert len(load_log(chosen).frames) == 2
    assert not list(tmp_path.glob(".out*"))  # no temporary folders left behind by the failed calls


OXTS_YAW = 0.3


def kitti_oxts(d, n=40):
    """timestamps.txt for image_02, velodyne_points and oxts in sensor folder parent ``d``, and oxts records of a
    drive north-east along heading OXTS_YAW at 1 m per frame, written as lat/lon (inverse Mercator)."""
    from gsim.scenes.formats.kitti_raw import EARTH_RADIUS_M
    stamps = [f"2011-09-26 13:02:{25 + k // 10:02d}.{(k % 10) * 100_000 + 123:06d}417" for k in range(n)]
    for sensor in ("image_02", "velodyne_points", "oxts"):
        (d / sensor / "data").mkdir(parents=True, exist_ok=True)
        (d / sensor / "timestamps.txt").write_text("\n".join(stamps) + "\n")
    lat0, lon0 = 49.0, 8.4
    s = math.cos(math.radians(lat0))
    e0 = s * EARTH_RADIUS_M * math.radians(lon0)
    n0 = s * EARTH_RADIUS_M * math.log(math.tan(math.radians(90 + lat0) / 2))
    for k in range(n):
        e, nn = e0 + k * math.cos(OXTS_YAW), n0 + k * math.sin(OXTS_YAW)
        lat = math.degrees(2 * math.atan(math.exp(nn / (s * EARTH_RADIUS_M)))) - 90
        lon = math.degrees(e / (s * EARTH_RADIUS_M))
        (d / "oxts" / "data" / f"{k:010d}.txt").write_text(
            f"{lat:.12f} {lon:.12f} 110.0 0.0 0.0 {OXTS_YAW} " + "0 " * 24)


@needs_kitti
def test_kitti_timestamps_and_oxts_poses(tmp_path):
    """Drives with timestamps.txt and oxts: times from the files, poses from GPS/IMU (no kiss-icp)."""
    from gsim.scenes.formats.kitti_raw import convert_kitti_raw
    date, d = kitti_tree(tmp_path, drive="2011_09_26_drive_0001_sync")
    kitti_oxts(d)
    yaw = OXTS_YAW
    log = validate_log(convert_kitti_raw(date, tmp_path / "out", max_frames=4, progress=False))
    assert log.frames[1].timestamp_us == 1317042145_100123  # 2011-09-26 13:02:25.100123 UTC, in microseconds
    assert log.frames[3].cameras["image_02"].timestamp_us == 1317042145_300123
    assert any("oxts" in note for note in log.notes) and not any("odometry" in note for note in log.notes)
    P = log.ego_poses
    steps = np.diff(P[:, :3, 3], axis=0)
    assert np.allclose(steps, [math.cos(yaw), math.sin(yaw), 0], atol=1e-6)
    # the Velodyne looks along the heading (its calibration to the IMU is a ~1 deg rotation)
    assert P[0, :3, 0] @ [math.cos(yaw), math.sin(yaw), 0] > 0.999 and P[0, 2, 2] > 0.999


@needs_kitti
def test_kitti_bad_inputs(tmp_path, monkeypatch):
    from gsim.scenes.formats.kitti_raw import convert_kitti_raw

    def tree(name):
        return kitti_tree(tmp_path / name)[0]

    date = tree("key")
    (date / CALIBS[0]).unlink()
    (date / CALIBS[0]).write_text("\n".join(l for l in (KITTI / CALIBS[0]).read_text().splitlines()
                                             if not l.startswith("P_rect_02")))
    with pytest.raises(LogFormatError, match=r"calib_cam_to_cam.txt: P_rect_02: missing"):
        convert_kitti_raw(date, tmp_path / "out", progress=False)

    date = tree("file")
    (date / CALIBS[1]).unlink()
    with pytest.raises(LogFormatError, match=r"calib_velo_to_cam.txt: calibration file missing"):
        convert_kitti_raw(date, tmp_path / "out", progress=False)

    date = tree("truncated")
    bad = date / "velodyne_points/data/0000000002.bin"
    bad.unlink()
    bad.write_bytes((KITTI / "velodyne_points/data/0000000002.bin").read_bytes()[:-6])
    with pytest.raises(LogFormatError, match=r"0000000002.bin: .* not a whole number .* 16 bytes"):
        convert_kitti_raw(date, tmp_path / "out", progress=False)

    date = tree("counts")  # 5 of 40 sweeps gone: more than KITTI's sporadic losses (test_kitti_sporadic_frame_losses)
    for k in range(35, 40):
        (date / f"velodyne_points/data/00000000{k}.bin").unlink()
    with pytest.raises(LogFormatError, match=r"velodyne_points/data/0000000035.bin: missing, as are 4 more of the "
                                             r"drive's 40 frames \(more than 10%"):
        convert_kitti_raw(date, tmp_path / "out", progress=False)

    with pytest.raises(ValueError, match="not a directory"):
        convert_kitti_raw(tmp_path / "nowhere", tmp_path / "out", progress=False)

    date = tree("no_kiss")
    for m in ("kiss_icp", "kiss_icp.config", "kiss_icp.kiss_icp"):
        monkeypatch.setitem(sys.modules, m, None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[lidar\]"'):
        convert_kitti_raw(date, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


@needs_kitti
def test_kitti_sporadic_frame_losses(tmp_path):
    """As in 2011_09_26_drive_0009_sync (no sweeps for frames 177-180, empty lines in velodyne_points/timestamps.txt):
    frames a sensor lacks are left out and noted, the others keep their own files and times."""
    from gsim.scenes.formats.kitti_raw import convert_kitti_raw
    date, d = kitti_tree(tmp_path, drive="2011_09_26_drive_0009_sync")
    kitti_oxts(d)
    (d / "velodyne_points/data/0000000002.bin").unlink()
    (d / "image_02/data/0000000004.png").unlink()
    stamps = (d / "velodyne_points/timestamps.txt").read_text().splitlines()
    (d / "velodyne_points/timestamps.txt").write_text("\n".join(stamps[:2] + [""] + stamps[3:]) + "\n")
    log = validate_log(convert_kitti_raw(date, tmp_path / "out", max_frames=4, progress=False))
    kept = [0, 1, 3, 5]
    assert [f.timestamp_us for f in log.frames] == [1317042145_000123 + 100_000 * k for k in kept]
    for f, k in zip(log.frames, kept):
        assert (log.root / f.cameras["image_02"].image).read_bytes() == \
            (KITTI / f"image_02/data/{k:010d}.png").read_bytes()
        raw = np.fromfile(KITTI / f"velodyne_points/data/{k:010d}.bin", np.float32).reshape(-1, 4)
        assert np.array_equal(log.sweep(f.lidars["velodyne"]), raw)
    assert "frames left out, velodyne_points has no file for them: 0000000002" in log.notes
    assert "frames left out, image_02 has no file for them: 0000000004" in log.notes


def tracklet_xml(objects):
    """A tracklet_labels.xml in KITTI's boost serialisation layout; objects: (type, h, w, l, first_frame,
    [(tx, ty, tz, rz), ...])."""
    def pose(tx, ty, tz, rz):
        extra = "".join(f"<{k}>{v}</{k}>" for k, v in (("state", 1), ("occlusion", 0), ("occlusion_kf", 0),
                                                       ("truncation", 0), ("amt_occlusion", -1)))
        return (f'<item class_id="3" tracking_level="0" version="2"><tx>{tx}</tx><ty>{ty}</ty><tz>{tz}</tz>'
                f"<rx>0</rx><ry>0</ry><rz>{rz}</rz>{extra}</item>")
    items = "".join(
        f'<item class_id="1" tracking_level="0" version="1"><objectType>{kind}</objectType><h>{h}</h><w>{w}</w>'
        f"<l>{l}</l><first_frame>{first}</first_frame>"
        f'<poses class_id="2" tracking_level="0" version="0"><count>{len(poses)}</count><item_version>2</item_version>'
        f"{''.join(pose(*p) for p in poses)}</poses><finished>1</finished></item>"
        for kind, h, w, l, first, poses in objects)
    return ('<?xml version="1.0" encoding="UTF-8" standalone="yes" ?>\n<!DOCTYPE boost_serialization>\n'
            '<boost_serialization signature="serialization::archive" version="9">\n'
            f'<tracklets class_id="0" tracking_level="0" version="0"><count>{len(objects)}</count>'
            f"<item_version>1</item_version>{items}</tracklets>\n</boost_serialization>\n")


CAR_POSES = [(10.0 + j, -2.0 + 0.1 * j, -1.7, 0.1 * j) for j in range(6)]  # frames 1..6 of the tracklet below


@needs_kitti
@pytest.mark.parametrize("drive", [None, "2011_09_26_drive_0001_sync"])
def test_kitti_tracklets(tmp_path, drive):
    """tracklet_labels.xml beside the data (flattened layout) or in the drive folder (KITTI's): each tracklet is
    an actor whose box centre is the tracklet's bottom centre lifted by h/2, through the log's own sweep pose."""
    from gsim.scenes.formats.kitti_raw import convert_kitti_raw
    date, d = kitti_tree(tmp_path, drive=drive)
    kitti_oxts(d)
    (d / "tracklet_labels.xml").write_text(tracklet_xml([("Car", 1.5, 1.7, 4.2, 1, CAR_POSES),
                                                         ("Pedestrian", 1.8, 0.6, 0.8, 30, [(5, 3, -1.7, 0)])]))
    log = validate_log(convert_kitti_raw(date, tmp_path / "out", max_frames=4, progress=False))
    (car,) = log.actors  # the pedestrian appears after the converted frames
    assert (car.id, car.category, car.size) == ("tracklet_0", "car", (4.2, 1.7, 1.5))
    assert list(car.timestamps_us) == [f.timestamp_us for f in log.frames[1:4]]
    assert any("1 of the 2 tracklets" in n for n in log.notes)
    for j, f in enumerate(log.frames[1:4]):
        tx, ty, tz, rz = CAR_POSES[j]
        T_world_velo = log.T_world_vehicle(f.timestamp_us) @ log.lidars["velodyne"].T_vehicle_lidar
        assert np.allclose(T_world_velo, log.T_world_lidar(f.lidars["velodyne"]), atol=1e-12)
        T = car.pose_at(f.timestamp_us)
        assert np.allclose(T[:3, 3], (T_world_velo @ [tx, ty, tz + 1.5 / 2, 1])[:3], atol=1e-9)
        box_x = T_world_velo[:3, :3].T @ T[:3, 0]  # heading in the Velodyne frame
        assert np.allclose(box_x, [math.cos(rz), math.sin(rz), 0], atol=1e-12)
        assert np.allclose(T[:3, 2], T_world_velo[:3, 2], atol=1e-12)
        # the world heading adds the ego's (oxts) yaw
        assert math.isclose(math.atan2(T[1, 0], T[0, 0]), OXTS_YAW + rz, abs_tol=0.03)


@needs_kitti
def test_kitti_bad_tracklets(tmp_path):
    from gsim.scenes.formats.kitti_raw import convert_kitti_raw, read_tracklets
    good = tracklet_xml([("Car", 1.5, 1.7, 4.2, 0, CAR_POSES[:2])])
    path = tmp_path / "tracklet_labels.xml"

    def check(text, fragment):
        path.write_text(text)
        with pytest.raises(LogFormatError) as e:
            read_tracklets(path)
        assert str(path) in str(e.value) and fragment in str(e.value), str(e.value)

    check(good[:-60], "not a readable XML file")
    check(good.replace("<tz>-1.7</tz>", "", 1), "tracklets/item[0]/poses/item[0]/tz: missing")
    check(good.replace("<h>1.5</h>", "<h>tall</h>"), "tracklets/item[0]/h: expected a number, got 'tall'")
    check(good.replace("<first_frame>0</first_frame>", "<first_frame>0.5</first_frame>"),
          "item[0]/first_frame: expected an integer")
    check(good.replace("<count>2</count>", "<count>3</count>"), "tracklets/item[0]/poses/count: says '3', found 2")
    check(good.replace("<w>1.7</w>", "<w>0</w>"), "tracklets/item[0]: l, w, h must be > 0")
    check("<tracks/>", "no <tracklets> element")
    # the converter reads the file before anything else (no kiss-icp run, no log left behind)
    date, d = kitti_tree(tmp_path / "drive")
    (d / "tracklet_labels.xml").write_text(good.replace("<objectType>Car</objectType>", ""))
    with pytest.raises(LogFormatError, match=r"drive/2011_09_26/tracklet_labels.xml: tracklets/item\[0\]/objectType"):
        convert_kitti_raw(date, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- DGP (DDAD)

def dgp_pose(p):
    r, t = p["rotation"], p["translation"]
    T = np.eye(4)
    T[:3, :3] = quat_to_rotmat(np.array([r["qw"], r["qx"], r["qy"], r["qz"]]))
    T[:3, 3] = [t["x"], t["y"], t["z"]]
    return T


@pytest.fixture(scope="module")
def dgp_logs(tmp_path_factory):
    if not DDAD.is_dir():
        pytest.skip(f"DDAD/DGP sample not found at {DDAD}")
    from gsim.scenes.formats.dgp import convert_dgp
    out = tmp_path_factory.mktemp("dgp")
    t = time.perf_counter()
    from_dataset = convert_dgp(DDAD / "scene_dataset_v1.0.json", out / "dataset", progress=False)
    print(f"DGP scene (3 samples, 3 cameras, LiDAR, boxes): converted in {time.perf_counter() - t:.1f} s")
    return from_dataset, convert_dgp(DDAD / "scene_01", out / "scene", progress=False)


@pytest.fixture(scope="module")
def dgp_log(dgp_logs):
    return validate_log(dgp_logs[1][0])


@needs_ddad
def test_dgp_dataset_and_scene_inputs(dgp_logs, tmp_path):
    from_dataset, from_scene = dgp_logs
    assert [p.name for p in from_dataset] == ["scene_01"] and from_dataset[0].parent.name == "dataset"
    a, b = validate_log(from_dataset[0]), validate_log(from_scene[0])
    assert a.name == b.name == "scene_01"
    assert np.array_equal(a.ego_poses, b.ego_poses) and len(a.actors) == len(b.actors)
    from gsim.scenes.formats.dgp import convert_dgp
    assert convert_dgp(DDAD, tmp_path / "x", progress=False) == [tmp_path / "x/scene_01"]  # the dataset's folder
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="expected one scene.json or scene_"):
        convert_dgp(tmp_path / "empty", tmp_path / "y", progress=False)


@needs_ddad
def test_dgp_log_contents(dgp_log):
    log = dgp_log
    assert set(log.cameras) == {"CAMERA_01", "CAMERA_05", "CAMERA_06"} and set(log.lidars) == {"LIDAR"}
    assert len(log.frames) == 3 and len(log.ego_timestamps_us) == 6  # LiDAR and camera times
    assert [f.timestamp_us for f in log.frames] == [15569195938203752, 15569195939203480, 15569195940203574]
    f = log.frames[2]
    assert f.cameras["CAMERA_05"].timestamp_us == 15569195940415242
    assert (log.root / f.cameras["CAMERA_05"].image).read_bytes() == \
        (DDAD / "scene_01/rgb/CAMERA_05/15569195940415242.jpg").read_bytes()
    with np.load(DDAD / "scene_01/point_cloud/LIDAR/15569195940203574.npz") as z:
        assert np.array_equal(log.sweep(f.lidars["LIDAR"]), z["data"].astype(np.float32))
    cam = log.cameras["CAMERA_01"].camera
    assert isinstance(cam, PinholeCamera) and (cam.width, cam.height) == (1936, 1216)
    # the sample's cameras fire 212 ms after its LiDAR, so CAMERA_01 is the reference at their times; the
    # sample's sensors agree to a micrometre
    for name in ("CAMERA_05", "CAMERA_06"):
        assert any(n.startswith(f"{name}: 3 datums at the times of reference datums (CAMERA_01)") for n in log.notes)
        med_m, med_deg, max_m, max_deg, _, _ = note_numbers(log.notes, name)
        assert max_m < 1e-6 and max_deg < 1e-4


@needs_ddad
def test_dgp_lidar_projects_as_dgp_says(dgp_log, tmp_path):
    """DGP's convention computed from the raw JSON (inv(T_world_camera) @ T_world_lidar, then K) agrees
    with the converted log to sub-pixel, for every sample and camera."""
    log = dgp_log
    root = DDAD / "scene_01"
    scene = json.loads(next(root.glob("scene_*.json")).read_text())
    data = {d["key"]: d for d in scene["data"]}
    for k, sample in enumerate(scene["samples"]):
        calib = json.loads((root / "calibration" / f"{sample['calibration_key']}.json").read_text())
        datums = [data[key] for key in sample["datum_keys"]]
        (lidar,) = [d for d in datums if "point_cloud" in d["datum"]]
        T_world_lidar = dgp_pose(lidar["datum"]["point_cloud"]["pose"])
        for d in datums:
            if "image" not in d["datum"]:
                continue
            name = d["id"]["name"]
            intr = calib["intrinsics"][calib["names"].index(name)]
            K = np.array([[intr["fx"], 0, intr["cx"]], [0, intr["fy"], intr["cy"]], [0, 0, 1]])
            T = invert(dgp_pose(d["datum"]["image"]["pose"])) @ T_world_lidar
            uv, inside, pc = project(log, log.frames[k], name, "LIDAR")
            pts = log.sweep(log.frames[k].lidars["LIDAR"])[:, :3].astype(np.float64)
            h = (K @ (pts @ T[:3, :3].T + T[:3, 3]).T).T
            uv_dgp = h[:, :2] / h[:, 2:]
            assert inside.sum() > 2000, name
            assert np.abs(uv[inside] - 0.5 - uv_dgp[inside]).max() < 0.01, name
            if k == 0:
                write_overlay(log.image(log.frames[k].cameras[name]), uv[inside], pc[inside, 2],
                              f"ddad_{name}_{k:06d}.png", tmp_path)


@needs_ddad
def test_dgp_actor_tracks(dgp_log):
    log = dgp_log
    raw = {}  # (instance id, timestamp) -> annotation
    for f in sorted((DDAD / "scene_01/bounding_box_3d/LIDAR").glob("*.json")):
        for a in json.loads(f.read_text())["annotations"]:
            raw[(str(a["instance_id"]), int(f.stem))] = a
    actors = {a.id: a for a in log.actors}
    assert set(actors) == {i for i, _ in raw}
    lidar_times = [f.timestamp_us for f in log.frames]
    in_all = {i for i, _ in raw if all((i, t) in raw for t in lidar_times)}
    assert len(in_all) > 50
    for i in in_all:  # instance ids are kept across the 3 samples
        assert list(actors[i].timestamps_us) == lidar_times
    a = raw[next(iter(raw))]
    assert actors[str(a["instance_id"])].category in {"Car", "Truck", "Person", "Bus/RV/Caravan"}
    # LiDAR points inside each box (actor frame, within size/2) track the annotation's own point count
    ours, theirs, near = [], [], []
    for f in log.frames:
        lo = f.lidars["LIDAR"]
        T_world_lidar = log.T_world_lidar(lo)
        pts = log.sweep(lo)[:, :3].astype(np.float64)
        for (i, t), ann in raw.items():
            if t != lo.timestamp_us:
                continue
            T = invert(actors[i].pose_at(t)) @ T_world_lidar
            q = pts @ T[:3, :3].T + T[:3, 3]
            ours.append(np.all(np.abs(q) <= np.array(actors[i].size) / 2, axis=1).sum())
            theirs.append(ann["num_points"])
            near.append(np.linalg.norm(T_world_lidar[:3, :3].T @ (actors[i].pose_at(t)[:3, 3] - T_world_lidar[:3, 3]))
                        < 30)
    ours, theirs, near = map(np.array, (ours, theirs, near))
    assert near.sum() > 30 and np.mean(ours[near] > 0) > 0.9
    assert np.corrcoef(ours, theirs)[0, 1] > 0.95  # the sample's clouds are subsampled, so counts differ by a factor


def dgp_tree(root, edit_scene=None, edit_calib=None):
    """A copy of the DGP sample scene at ``root``: the scene JSON and calibration written (after the edits),
    everything else symlinked (never modified)."""
    scene_json = next((DDAD / "scene_01").glob("scene_*.json"))
    root.mkdir()
    for p in (DDAD / "scene_01").iterdir():
        if p.name != scene_json.name and p.name != "calibration":
            (root / p.name).symlink_to(p)
    scene = json.loads(scene_json.read_text())
    if edit_scene:
        edit_scene(scene)
    (root / scene_json.name).write_text(json.dumps(scene))
    (root / "calibration").mkdir()
    for c in (DDAD / "scene_01/calibration").iterdir():
        calib = json.loads(c.read_text())
        if edit_calib:
            edit_calib(calib)
        (root / "calibration" / c.name).write_text(json.dumps(calib))
    return root


@needs_ddad
def test_dgp_bad_inputs(tmp_path):
    from gsim.scenes.formats.dgp import convert_dgp

    def tree(name, edit_scene=None, edit_calib=None):
        return dgp_tree(tmp_path / name, edit_scene, edit_calib)

    root = tree("pose", edit_scene=lambda s: s["data"][1]["datum"]["image"].pop("pose"))
    with pytest.raises(LogFormatError, match=r"datum 78aa67ac70[0-9a-f]+\.datum\.image\.pose: missing"):
        convert_dgp(root, tmp_path / "out", progress=False)
    root = tree("fisheye", edit_calib=lambda c: c["intrinsics"][2].update(fisheye=1))
    with pytest.raises(LogFormatError, match=r"intrinsics of CAMERA_05: \['fisheye'\] not supported"):
        convert_dgp(root, tmp_path / "out", progress=False)
    root = tree("distorted", edit_calib=lambda c: c["intrinsics"][1].update(k1=-0.2, p2=0.001))
    log = validate_log(convert_dgp(root, tmp_path / "out", progress=False)[0])
    assert log.cameras["CAMERA_01"].camera.k1 == -0.2 and isinstance(log.cameras["CAMERA_01"].camera, OpenCVCamera)
    assert not list(tmp_path.glob(".out*"))


def small_motion(metres, degrees, direction=(0.6, 0.8, 0.0), axis=(1.0, 2.0, 3.0)):
    """A rigid transform: ``metres`` along ``direction``, ``degrees`` about ``axis``."""
    x, y, z = np.array(axis) / np.linalg.norm(axis)
    half = math.radians(degrees) / 2
    T = np.eye(4)
    T[:3, :3] = quat_to_rotmat(np.array([math.cos(half), *(math.sin(half) * np.array([x, y, z]))]))
    T[:3, 3] = metres * np.array(direction) / np.linalg.norm(direction)
    return T


def co_timed_cameras(perturb):
    """A scene edit: each camera datum stamped with its sample's LiDAR time (as DDAD's own scenes are) and posed
    so that the ego pose it implies is the LiDAR's @ perturb(camera name, sample index)."""
    from gsim.transforms import rotmat_to_quat
    calib = json.loads(next((DDAD / "scene_01/calibration").iterdir()).read_text())
    ext = {n: dgp_pose(e) for n, e in zip(calib["names"], calib["extrinsics"])}

    def edit(scene):
        data = {d["key"]: d for d in scene["data"]}
        for k, sample in enumerate(scene["samples"]):
            datums = [data[key] for key in sample["datum_keys"]]
            (lidar,) = [d for d in datums if "point_cloud" in d["datum"]]
            ego = dgp_pose(lidar["datum"]["point_cloud"]["pose"]) @ invert(ext["LIDAR"])
            for d in datums:
                if "image" in d["datum"]:
                    name = d["id"]["name"]
                    T = ego @ perturb(name, k) @ ext[name]
                    q = rotmat_to_quat(T[:3, :3])
                    d["id"]["timestamp"] = lidar["id"]["timestamp"]
                    d["datum"]["image"]["pose"] = {"rotation": dict(zip(("qw", "qx", "qy", "qz"), q.tolist())),
                                                   "translation": dict(zip("xyz", T[:3, 3].tolist()))}
    return edit


def note_numbers(notes, sensor):
    """(median m, median deg, max m, max deg, residual m, residual deg) from a DGP log's note on ``sensor``."""
    (note,) = [n for n in notes if n.startswith(f"{sensor}: ")]
    num = r"([0-9.e+-]+)"
    m = re.search(rf"median {num} m / {num} deg, max {num} m / {num} deg.* within {num} m / {num} deg", note)
    return tuple(float(x) for x in m.groups())


@needs_ddad
def test_dgp_sensors_disagreeing_by_a_centimetre(tmp_path):
    """Real calibrations disagree by millimetres: the scene converts, the notes report the disagreement, the
    LiDAR (the reference) keeps its recorded pose and each camera its own (the extrinsic absorbs a constant offset)."""
    from gsim.scenes.formats.dgp import convert_dgp

    def perturb(name, k):  # 1 cm / 0.02 deg; CAMERA_05's translation varies 8, 10, 12 mm over the samples
        return small_motion(0.008 + 0.002 * k if name == "CAMERA_05" else 0.01, 0.02)

    root = dgp_tree(tmp_path / "scene", co_timed_cameras(perturb))
    edited = json.loads(next(root.glob("scene_*.json")).read_text())
    log = validate_log(convert_dgp(root, tmp_path / "out", progress=False)[0])
    assert len(log.ego_timestamps_us) == 3  # one ego pose per sample now that the datums share its time
    for name in ("CAMERA_01", "CAMERA_06"):
        med_m, med_deg, max_m, max_deg, res_m, res_deg = note_numbers(log.notes, name)
        assert math.isclose(med_m, 0.01, rel_tol=1e-3) and math.isclose(max_m, 0.01, rel_tol=1e-3)
        assert math.isclose(med_deg, 0.02, rel_tol=1e-3) and math.isclose(max_deg, 0.02, rel_tol=1e-3)
        assert res_m < 1e-9 and res_deg < 1e-6
    med_m, _, max_m, _, res_m, _ = note_numbers(log.notes, "CAMERA_05")
    assert math.isclose(med_m, 0.010, rel_tol=1e-3) and math.isclose(max_m, 0.012, rel_tol=1e-3)
    assert math.isclose(res_m, 0.002, rel_tol=1e-2)
    assert any("(LIDAR)" in n for n in log.notes) and any("['LIDAR', 'CAMERA_01'" in n for n in log.notes)

    data = {d["key"]: d for d in edited["data"]}
    for k, sample in enumerate(edited["samples"]):
        for key in sample["datum_keys"]:
            d = data[key]
            name, field = d["id"]["name"], next(iter(d["datum"]))
            recorded = dgp_pose(d["datum"][field]["pose"])
            if field == "point_cloud":
                assert np.abs(log.T_world_lidar(log.frames[k].lidars[name]) - recorded).max() < 1e-9
            else:
                ours = log.T_world_camera(log.frames[k].cameras[name])
                assert np.abs(ours - recorded).max() < (3e-3 if name == "CAMERA_05" else 1e-9), name
    # the extrinsic moved by the injected offset, from the calibration's
    calib = json.loads(next((DDAD / "scene_01/calibration").iterdir()).read_text())
    T = dgp_pose(calib["extrinsics"][calib["names"].index("CAMERA_01")])
    assert np.allclose(log.cameras["CAMERA_01"].T_vehicle_camera, small_motion(0.01, 0.02) @ T, atol=1e-9)
    assert not np.allclose(T, small_motion(0.01, 0.02) @ T, atol=1e-3)


@needs_ddad
@pytest.mark.parametrize("metres, degrees, numbers", [(3.0, 0.0, "3.000 m / 0.000 deg"),
                                                      (0.0, 5.0, "0.000 m / 5.000 deg")])
def test_dgp_sensors_disagreeing_by_metres_are_refused(tmp_path, metres, degrees, numbers):
    from gsim.scenes.formats.dgp import convert_dgp
    root = dgp_tree(tmp_path / "scene", co_timed_cameras(lambda name, k: small_motion(metres, degrees)))
    with pytest.raises(LogFormatError) as e:
        convert_dgp(root, tmp_path / "out", progress=False)
    msg = str(e.value)
    for fragment in ("datum 78aa67ac70", ".datum.image.pose", "sensor 'CAMERA_01' at 15569195938203752 us", numbers,
                     "'LIDAR''s datum", "datum cfdd9f92", "the bound is 0.5 m / 2.0 deg"):
        assert fragment in msg, msg
    assert not (tmp_path / "out").exists()


def test_reference_ego_synthetic():
    """Reference choice, extrinsic correction, camera-only times and notes on hand-made datums."""
    from gsim.scenes.formats.dgp import _Datum, reference_ego

    def ego(t):
        return small_motion(2.0 * t, 10.0 * t, axis=(0, 0, 1)) @ small_motion(0.1, 0.0, direction=(0, 0, 1))

    ext = {"LIDAR": small_motion(1.5, 0.0, (0, 0, 1)), "CAM_A": look_at([1.6, 0.3, 1.4], [10, 0, 1]),
           "CAM_B": look_at([1.6, -0.3, 1.4], [10, -5, 1])}
    P_A = small_motion(0.01, 0.02)  # CAM_A: a constant offset; CAM_B: a varying one
    P_B = {0: small_motion(0.004, 0.01, axis=(0, 1, 0)), 1: small_motion(0.006, 0.01, axis=(0, 1, 0))}
    datums = [_Datum("CAM_B", "camera", 0, {}, "b0", ego(0) @ P_B[0] @ ext["CAM_B"]),
              _Datum("CAM_A", "camera", 0, {}, "a0", ego(0) @ P_A @ ext["CAM_A"]),
              _Datum("LIDAR", "lidar", 0, {}, "l0", ego(0) @ ext["LIDAR"]),
              _Datum("LIDAR", "lidar", 2, {}, "l2", ego(2) @ ext["LIDAR"]),
              _Datum("CAM_A", "camera", 2, {}, "a2", ego(2) @ P_A @ ext["CAM_A"]),
              _Datum("CAM_A", "camera", 1, {}, "a1", ego(1) @ P_A @ ext["CAM_A"]),  # a time without LiDAR
              _Datum("CAM_B", "camera", 1, {}, "b1", ego(1) @ P_B[1] @ ext["CAM_B"])]
    poses, used, notes = reference_ego(datums, ext)
    assert sorted(poses) == [0, 1, 2]
    for t in (0, 1, 2):  # CAM_A's corrected extrinsic gives the camera-only time the true ego pose too
        assert np.allclose(poses[t], ego(t), atol=1e-9)
    assert np.allclose(used["LIDAR"], ext["LIDAR"]) and np.allclose(used["CAM_A"], P_A @ ext["CAM_A"], atol=1e-12)
    assert "['LIDAR', 'CAM_A', 'CAM_B']" in notes[0] and len(notes) == 3
    assert notes[1].startswith("CAM_A: 2 datums at the times of reference datums (LIDAR)")
    assert notes[2].startswith("CAM_B: 2 datums at the times of reference datums (CAM_A, LIDAR)")
    assert "median 0.005 m / 0.01 deg, max 0.006 m / 0.01 deg" in notes[2]
    # no LiDAR: the first camera by name is the reference
    poses, used, notes = reference_ego([d for d in datums if d.sensor != "LIDAR"], ext)
    assert np.allclose(poses[1], ego(1) @ P_A, atol=1e-9) and np.array_equal(used["CAM_A"], ext["CAM_A"])
    assert "['CAM_A', 'CAM_B']" in notes[0]
    far = [datums[2], _Datum("CAM_A", "camera", 0, {}, "a0", ego(0) @ small_motion(0.7, 0.0) @ ext["CAM_A"])]
    with pytest.raises(LogFormatError, match=r"a0\.pose: sensor 'CAM_A' at 0 us implies an ego pose 0\.700 m / 0\.000 "
                                             r"deg from the one of 'LIDAR''s datum at that time \(l0\); the bound"):
        reference_ego(far, ext)


# --------------------------------------------------------------------------- nerfstudio

def turning_ego(k):
    c, s = math.cos(0.2 * k), math.sin(0.2 * k)
    T = np.eye(4)
    T[:3, :3] = [[c, -s, 0], [s, c, 0], [0, 0, 1]]
    T[:3, 3] = [3.0 * k, 0.5 * k * k, 0.1 * k]
    return T


def camera_log(path, cameras, n=3):
    """A camera-only log: each camera {name: (camera, T_vehicle_camera)} sees n frames of a turning ego,
    the cameras a few microseconds apart (so sensor poses come from interpolated ego poses)."""
    rng = np.random.default_rng(1)
    with LogWriter(path, name="cams", source="test") as w:
        for name, (cam, T) in cameras.items():
            w.add_camera(name, cam, T)
        for k in range(n):
            t = 100_000 * k
            w.add_ego_pose(t, turning_ego(k))
            images = {name: rng.integers(0, 256, (cam.height, cam.width, 3), dtype=np.uint8)
                      for name, (cam, _) in cameras.items()}
            obs = {name: w.image(name, k, t + 7 * i, rgb=rgb) for i, (name, rgb) in enumerate(images.items())}
            w.add_frame(t, cameras=obs, lidars={})
    return load_log(path)


def assert_round_trip(log, tmp_path):
    from gsim.scenes.formats.nerfstudio import export_nerfstudio, import_nerfstudio
    back = validate_log(import_nerfstudio(export_nerfstudio(log, tmp_path / "ns", progress=False), tmp_path / "back",
                                          progress=False))
    a = [o for _, o in log.camera_observations()]
    b = [o for _, o in back.camera_observations()]
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert back.cameras[y.sensor].camera == log.cameras[x.sensor].camera  # exact intrinsics and model
        assert np.abs(back.T_world_camera(y) - log.T_world_camera(x)).max() < 1e-12
        assert (back.root / y.image).read_bytes() == (log.root / x.image).read_bytes()
    return back


def test_nerfstudio_round_trip_perspective(tmp_path):
    cams = {"front": (OpenCVCamera(40, 30, 35.0, 36.0, 20.3, 14.8, k1=-0.12, k2=0.03, p1=1e-3, p2=-2e-3, k3=0.001),
                      look_at([1.5, 0, 1.6], [10, 0, 1.6])),
            "left": (PinholeCamera(32, 24, 30.0, 30.0, 16.0, 12.0), look_at([1.0, 0.8, 1.6], [1.0, 10, 1.0]))}
    back = assert_round_trip(camera_log(tmp_path / "log", cams), tmp_path)
    assert len(back.cameras) == 2
    assert json.loads((tmp_path / "ns/transforms.json").read_text())["camera_model"] == "OPENCV"


def test_nerfstudio_round_trip_fisheye_and_mixed_models(tmp_path):
    fish = FisheyeCamera(48, 40, 20.0, 20.5, 24.2, 19.9, k1=0.05, k2=-0.01, k3=0.002, k4=-0.0003)
    assert_round_trip(camera_log(tmp_path / "log", {"fish": (fish, look_at([0, 0, 2], [0, -5, 1]))}), tmp_path)
    assert json.loads((tmp_path / "ns/transforms.json").read_text())["camera_model"] == "OPENCV_FISHEYE"
    from gsim.scenes.formats.nerfstudio import export_nerfstudio
    mixed = camera_log(tmp_path / "mixed", {"fish": (fish, np.eye(4)),
                                            "pin": (PinholeCamera(8, 6, 5, 5, 4, 3), np.eye(4))})
    with pytest.raises(ValueError, match="mixes fisheye and perspective"):
        export_nerfstudio(mixed, tmp_path / "ns2", progress=False)


@needs_ddad
def test_nerfstudio_round_trip_of_a_real_log(dgp_log, tmp_path):
    back = assert_round_trip(dgp_log, tmp_path)
    assert json.loads((tmp_path / "ns/transforms.json").read_text())["camera_model"] == "PINHOLE"
    assert len(back.frames) == 9 and len(back.cameras) == 3


def test_nerfstudio_opengl_opencv_flip(tmp_path):
    from PIL import Image

    from gsim.scenes.formats.nerfstudio import export_nerfstudio, import_nerfstudio
    # export: an OpenCV camera looking along world +x has its OpenGL -z along +x and its OpenGL y up
    log = camera_log(tmp_path / "log", {"c": (PinholeCamera(8, 6, 5, 5, 4, 3), look_at([0, 0, 0], [1, 0, 0]))}, n=1)
    T_world_camera = log.T_world_camera(log.frames[0].cameras["c"])
    assert np.allclose(T_world_camera[:3, 2], [1, 0, 0])
    (frame,) = json.loads(export_nerfstudio(log, tmp_path / "ns", progress=False).read_text())["frames"]
    M = np.array(frame["transform_matrix"])
    assert np.allclose(-M[:3, 2], [1, 0, 0]) and np.allclose(M[:3, 1], [0, 0, 1]) and np.allclose(M[:3, 0], [0, -1, 0])
    assert np.allclose(M[:3, 3], T_world_camera[:3, 3])

    # import of a hand-written file: OpenGL camera at (2, 3, 1.5) with -z along world +y, y up
    (tmp_path / "hand/img").mkdir(parents=True)
    Image.new("RGB", (8, 6), (200, 10, 10)).save(tmp_path / "hand/img/a.bmp")  # not PNG/JPEG: stored as PNG
    M = [[1, 0, 0, 2], [0, 0, -1, 3], [0, 1, 0, 1.5], [0, 0, 0, 1]]
    (tmp_path / "hand/transforms.json").write_text(json.dumps(
        {"fl_x": 5, "fl_y": 5, "cx": 4, "cy": 3, "w": 8, "h": 6,
         "frames": [{"file_path": "img/a.bmp", "transform_matrix": M}]}))
    log = validate_log(import_nerfstudio(tmp_path / "hand", tmp_path / "imported", progress=False))
    obs = log.frames[0].cameras["cam0"]
    T = log.T_world_camera(obs)
    assert np.allclose(T[:3, 2], [0, 1, 0]) and np.allclose(T[:3, 1], [0, 0, -1]) and np.allclose(T[:3, 3], [2, 3, 1.5])
    V = log.T_world_vehicle(obs.timestamp_us)  # the vehicle frame: x forward (camera z), z up
    assert np.allclose(V[:3, 0], [0, 1, 0]) and np.allclose(V[:3, 2], [0, 0, 1])
    assert obs.image.endswith(".png") and np.allclose(log.image(obs)[0, 0], np.array([200, 10, 10]) / 255)
    assert isinstance(log.cameras["cam0"].camera, PinholeCamera)


def test_nerfstudio_bad_inputs(tmp_path):
    from PIL import Image

    from gsim.scenes.formats.nerfstudio import import_nerfstudio
    Image.new("RGB", (8, 6)).save(tmp_path / "a.png")
    good = {"fl_x": 5, "fl_y": 5, "cx": 4, "cy": 3, "w": 8, "h": 6, "camera_model": "OPENCV",
            "frames": [{"file_path": "a.png", "transform_matrix": np.eye(4).tolist()}]}

    def check(edit, *fragments):
        meta = json.loads(json.dumps(good))
        edit(meta)
        (tmp_path / "transforms.json").write_text(json.dumps(meta))
        with pytest.raises(LogFormatError) as e:
            import_nerfstudio(tmp_path / "transforms.json", tmp_path / "out", progress=False)
        for f in fragments:
            assert f in str(e.value), str(e.value)

    check(lambda m: m.update(camera_model="EQUIRECTANGULAR"), "transforms.json: frames[0].camera_model",
          "EQUIRECTANGULAR")
    check(lambda m: m.pop("fl_x"), "frames[0].fl_x: missing")
    check(lambda m: m["frames"][0].update(transform_matrix=(2 * np.eye(4)).tolist()), "frames[0].transform_matrix",
          "not a rigid")
    check(lambda m: m["frames"][0].update(file_path="b.png"), "b.png: image missing", "frames[0]")
    check(lambda m: m.update(w=9), "a.png: image is 8x6", "frames[0] w/h says 9x6")
    check(lambda m: m.update(k4=0.1), "frames[0]: k4 is not part of the radial-tangential model")
    check(lambda m: m.update(frames=[]), "frames: expected a non-empty list")
    assert not (tmp_path / "out").exists()
