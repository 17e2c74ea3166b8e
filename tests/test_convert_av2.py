"""The Argoverse 2 Sensor Dataset converter (gsim.scenes.formats.av2) on the real sample in ../shared/data/av2 (two LiDAR
sweeps, calibration, poses, annotations; no images: AV2's public samples carry none) and on the synthetic street
written in AV2's layout by a test-only writer (tests/av2_writer.py) and read back. The checks: the converted
sweeps put every point where AV2's own formula (city_SE3_egovehicle @ point) does, each LiDAR's half of the
merged sweep shows the VLP-32C beam table in that LiDAR's own frame, consecutive sweeps agree on static
structure, and the annotation boxes hold the LiDAR points AV2 counted in them (num_interior_pts)."""
import shutil
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow", reason="reading Argoverse 2 feather files needs pyarrow (the formats extra)")
import pyarrow.feather as feather  # noqa: E402

from av2_writer import write_av2, write_table  # noqa: E402
from format_checks import DATA, save_picture, sweep_agreement  # noqa: E402
from gsim.errors import InputError  # noqa: E402
from gsim.scenes.log import LogFormatError, load_log, validate_log  # noqa: E402
from gsim.scenes.overlay import sweep_in_world  # noqa: E402
from gsim.transforms import invert, quat_to_rotmat  # noqa: E402

AV2 = DATA / "av2" / "sensor" / "val" / "7fab2350-7eaf-3b7e-a39d-6937a4c1bede"
SWEEPS_NS = (315966265259836000, 315966265360032000)
needs_av2 = pytest.mark.skipif(not AV2.is_dir(), reason=f"Argoverse 2 sample not found at {AV2} "
                               "(see ../shared/data/README.md)")
SYNTH = dict(n_frames=3, width=64, height=48, lidar_beams=8, lidar_azimuth_resolution_deg=2.0)


def raw(name):
    """A feather table of the sample as {column: numpy array or list}."""
    t = feather.read_table(AV2 / name)
    return {c: t[c].to_numpy() if not pa.types.is_string(t[c].type) else t[c].to_pylist() for c in t.column_names}


def rigid(row):
    T = np.eye(4)
    T[:3, :3] = quat_to_rotmat(np.array([row[k] for k in ("qw", "qx", "qy", "qz")], float))
    T[:3, 3] = [row[k] for k in ("tx_m", "ty_m", "tz_m")]
    return T


def raw_pose(t_ns):
    """AV2's city_SE3_egovehicle at a sweep time (the table has a row there)."""
    p = raw("city_SE3_egovehicle.feather")
    i = int(np.nonzero(p["timestamp_ns"] == t_ns)[0][0])
    return rigid({k: p[k][i] for k in ("qw", "qx", "qy", "qz", "tx_m", "ty_m", "tz_m")})


def calibration(name):
    c = raw("calibration/egovehicle_SE3_sensor.feather")
    i = c["sensor_name"].index(name)
    return rigid({k: c[k][i] for k in ("qw", "qx", "qy", "qz", "tx_m", "ty_m", "tz_m")})


def tree(src, dst, leave_out=()):
    """A copy of an AV2 log folder made of per-file symlinks (the shared sample is never modified), without the
    files and folders (relative paths) in ``leave_out``."""
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src)
        if p.is_file() and not any(rel == Path(x) or Path(x) in rel.parents for x in leave_out):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            (dst / rel).symlink_to(p)
    return dst


@pytest.fixture(scope="module")
def sample_log(tmp_path_factory):
    if not AV2.is_dir():
        pytest.skip(f"Argoverse 2 sample not found at {AV2}")
    from gsim.scenes.formats.av2 import convert_av2
    return validate_log(convert_av2(AV2, tmp_path_factory.mktemp("av2") / "log", progress=False))


# --------------------------------------------------------------------------- the real sample

@needs_av2
def test_av2_sample_contents(sample_log):
    from gsim.scenes.formats.av2 import VLP32C
    log = sample_log
    assert log.name == AV2.name and log.source == "argoverse2"
    assert log.cameras == {} and any("no camera images" in n for n in log.notes)
    assert set(log.lidars) == {"up_lidar", "down_lidar"}
    assert [f.timestamp_us for f in log.frames] == [t // 1000 for t in SWEEPS_NS]
    for name in log.lidars:
        assert np.allclose(log.lidars[name].T_vehicle_lidar, calibration(name), atol=1e-12)
        assert log.lidars[name].beams == VLP32C
    up = log.lidars["up_lidar"].T_vehicle_lidar
    assert np.allclose(up[:3, 3], [1.35018, 0, 1.64042]) and up[:3, 2] @ [0, 0, 1] > 0.999  # upright, on the roof
    assert log.lidars["down_lidar"].T_vehicle_lidar[:3, 2] @ [0, 0, -1] > 0.99  # mounted upside down
    # the cameras' calibration (used when a log has images) maps OpenCV axes: y down, z out (within 3.5 deg of level)
    from gsim.scenes.formats.av2 import read_extrinsics
    ext = read_extrinsics(AV2 / "calibration/egovehicle_SE3_sensor.feather")
    cams = [n for n in ext if n.startswith(("ring_", "stereo_"))]
    assert len(cams) == 9 and all(ext[n][:3, 1] @ [0, 0, -1] > 0.99 and abs(ext[n][2, 2]) < 0.06 for n in cams)
    assert ext["ring_front_center"][:3, 2] @ [1, 0, 0] > 0.999 and ext["ring_front_center"][:3, 0] @ [0, -1, 0] > 0.999
    assert ext["ring_rear_left"][:3, 2] @ [-1, 0, 0] > 0.8 and ext["ring_side_left"][:3, 2] @ [0, 1, 0] > 0.9
    for f, t_ns in zip(log.frames, SWEEPS_NS):
        assert np.allclose(log.T_world_vehicle(f.timestamp_us), raw_pose(t_ns), atol=1e-9)
        s = raw(f"sensors/lidar/{t_ns}.feather")
        up, down = (log.sweep(f.lidars[n]) for n in ("up_lidar", "down_lidar"))
        assert up.shape[1] == down.shape[1] == 5 and len(up) + len(down) == len(s["x"])
        for pts, m in ((up, s["laser_number"] < 32), (down, s["laser_number"] >= 32)):
            assert np.array_equal(pts[:, 3], (s["intensity"][m] / 255).astype(np.float32))
            assert np.array_equal(pts[:, 4], (s["offset_ns"][m] + 500) // 1000)
    # cuboids and poses cropped to the two sweeps' span +- 0.2 s (the annotations cover the whole 15.9 s log)
    assert len(log.actors) == 83 and all(np.all(np.diff(a.timestamps_us) > 0) for a in log.actors)
    span = log.frames[0].timestamp_us - 200_000, log.frames[-1].timestamp_us + 110_000 + 200_000
    assert all(span[0] <= a.timestamps_us[0] and a.timestamps_us[-1] <= span[1] for a in log.actors)
    assert log.ego_timestamps_us[0] < span[0] + 20_000 and log.ego_timestamps_us[-1] > span[1] - 20_000
    truck = [a for a in log.actors if a.metadata["class"] == "BOX_TRUCK"]
    assert truck and truck[0].category == "truck" and len(truck[0].id) == 36  # the track_uuid


@needs_av2
def test_av2_world_points_are_av2s(sample_log):
    """Each point, placed with the ego pose at its own time (sweep_in_world), is AV2's compensated point in the city
    frame: city_SE3_egovehicle(sweep time) @ (x, y, z). Without the per-point times it is not."""
    log = sample_log
    for f, t_ns in zip(log.frames, SWEEPS_NS):
        s = raw(f"sensors/lidar/{t_ns}.feather")
        xyz = np.stack([s[c].astype(np.float64) for c in "xyz"], 1)
        T = raw_pose(t_ns)
        for name, m in (("up_lidar", s["laser_number"] < 32), ("down_lidar", s["laser_number"] >= 32)):
            obs = f.lidars[name]
            expected = xyz[m] @ T[:3, :3].T + T[:3, 3]
            err = np.linalg.norm(sweep_in_world(log, obs) - expected, axis=1)
            pts = log.sweep(obs)
            frozen = np.linalg.norm(sweep_in_world(log, obs, pts[:, :4]) - expected, axis=1)  # offsets dropped
            print(f"{name} {t_ns}: |world - AV2's| max {err.max() * 1e3:.3f} mm; without the offsets max "
                  f"{frozen.max() * 100:.1f} cm")
            assert err.max() < 1e-3 and frozen.max() > 0.03


@needs_av2
def test_av2_lidar_split_matches_vlp32c(sample_log):
    """laser_number 0-31 is up_lidar, 32-63 down_lidar: in its own LiDAR's frame each half lies on the VLP-32C's
    32 beam elevations; put into the other LiDAR's frame it does not."""
    from gsim.scenes.formats.av2 import VLP32C
    log = sample_log
    table = np.asarray(VLP32C.elevations_deg)

    def on_beams(p):
        p = p[np.linalg.norm(p, axis=1) > 3]
        el = np.degrees(np.arctan2(p[:, 2], np.hypot(p[:, 0], p[:, 1])))
        return (np.abs(el[:, None] - table[None]).min(1) < 0.1).mean()

    for f in log.frames:
        for name, other in (("up_lidar", "down_lidar"), ("down_lidar", "up_lidar")):
            p = log.sweep(f.lidars[name])[:, :3].astype(np.float64)
            T = invert(log.lidars[other].T_vehicle_lidar) @ log.lidars[name].T_vehicle_lidar
            own, crossed = on_beams(p), on_beams(p @ T[:3, :3].T + T[:3, 3])
            print(f"{name}: {own:.1%} of points within 0.1 deg of a VLP-32C beam in its own frame, {crossed:.1%} "
                  f"in {other}'s")
            assert own > 0.95 and crossed < 0.6


@needs_av2
def test_av2_sweeps_agree(sample_log):
    log = sample_log
    a, b = log.frames
    for name in ("up_lidar", "down_lidar"):
        d = sweep_agreement(log, a.lidars[name], b.lidars[name])
        print(f"{name}: consecutive sweeps agree on static structure to {d * 100:.2f} cm (median)")
        assert d <= 0.05


def bev_picture(log, frames, half_m=45.0, px_per_m=9.0):
    """uint8 (H,W,3): the frames' sweeps in the world from above (first cyan, second magenta, overlap white-ish)
    around the first ego position, x to the right, y up, with the actors' box footprints at the first sweep's time
    in yellow and the ego vehicle's origin as a white circle."""
    from PIL import Image, ImageDraw
    c = log.T_world_vehicle(frames[0].timestamp_us)[:3, 3]
    n = int(2 * half_m * px_per_m)
    img = np.zeros((n, n, 3), np.uint8)

    def pix(xy):
        return np.stack([(xy[:, 0] - c[0] + half_m) * px_per_m, (half_m - (xy[:, 1] - c[1])) * px_per_m], 1)

    for f, colour in zip(frames, ([0, 200, 255], [255, 60, 200])):
        w = np.concatenate([sweep_in_world(log, o) for o in f.lidars.values()])
        w = w[w[:, 2] > c[2] + 0.3]  # above the road: structure, cars, people (the ground fills the picture)
        ij = np.floor(pix(w[:, :2])).astype(int)
        ok = (ij >= 0).all(1) & (ij < n).all(1)
        img[ij[ok, 1], ij[ok, 0]] |= np.asarray(colour, np.uint8)
    pil = Image.fromarray(img)
    draw = ImageDraw.Draw(pil)
    t = frames[0].timestamp_us
    for a in log.actors:
        if t in a.timestamps_us:
            T, (length, width, _) = a.pose_at(t), a.size
            foot = np.array([[length, width], [length, -width], [-length, -width], [-length, width]]) / 2
            draw.polygon([tuple(p) for p in pix(foot @ T[:2, :2].T + T[:2, 3])], outline=(255, 230, 0))
    (u, v), r = pix(c[None, :2])[0], 0.8 * px_per_m
    draw.ellipse([u - r, v - r, u + r, v + r], outline=(255, 255, 255), width=2)
    return np.asarray(pil)


@needs_av2
def test_av2_boxes_hold_their_points(sample_log, tmp_path):
    """At each sweep time every converted box holds the LiDAR points AV2 counted in its cuboid (num_interior_pts),
    counted in the world with the converted poses, tracks and sweeps."""
    log = sample_log
    ann = raw("annotations.feather")
    actors = {a.id: a for a in log.actors}
    for f, t_ns in zip(log.frames, SWEEPS_NS):
        w = np.concatenate([sweep_in_world(log, o) for o in f.lidars.values()])
        rows = np.nonzero(ann["timestamp_ns"] == t_ns)[0]
        diffs = []
        for i in rows:
            a = actors[ann["track_uuid"][i]]
            assert f.timestamp_us in a.timestamps_us
            local = (w - a.pose_at(f.timestamp_us)[:3, 3]) @ a.pose_at(f.timestamp_us)[:3, :3]
            n = int(np.all(np.abs(local) <= np.asarray(a.size) / 2, axis=1).sum())
            diffs.append(n - int(ann["num_interior_pts"][i]))
        diffs = np.abs(diffs)
        print(f"{t_ns}: {len(rows)} boxes; point counts equal to AV2's in {np.mean(diffs == 0):.1%}, "
              f"largest difference {diffs.max()} (of {int(ann['num_interior_pts'][rows].sum())} points in boxes)")
        assert len(rows) == 81 and np.mean(diffs == 0) > 0.95 and diffs.max() <= 2
    img = bev_picture(log, log.frames)
    assert img.shape == (810, 810, 3) and (img == [255, 230, 0]).all(2).sum() > 1000  # the footprints are drawn
    save_picture(img, "av2_bev.png", tmp_path)


@needs_av2
def test_av2_reconstruct_refuses_a_lidar_only_log(sample_log, tmp_path):
    from gsim.scenes.reconstruction.train import preset, reconstruct
    with pytest.raises(InputError, match=f"{sample_log.root}: no camera images to train on .*no cameras"):
        reconstruct(sample_log.root, tmp_path / "recon", preset("cpu", iterations=1), progress=False)


@needs_av2
def test_av2_partial_sample(tmp_path):
    from gsim.scenes.formats.av2 import convert_av2
    for missing in ("city_SE3_egovehicle.feather", "calibration/egovehicle_SE3_sensor.feather"):
        src = tree(AV2, tmp_path / missing.replace("/", "_"), leave_out=[missing])
        with pytest.raises(LogFormatError, match=f"{missing}: file missing"):
            convert_av2(src, tmp_path / "out", progress=False)
    # the AV2 LiDAR Dataset's layout: no intrinsics (no cameras), no annotations -> a LiDAR log without actors
    src = tree(AV2, tmp_path / "lidar_dataset", leave_out=["calibration/intrinsics.feather", "annotations.feather"])
    log = validate_log(convert_av2(src, tmp_path / "out", progress=False))
    assert log.actors == () and any("no annotations.feather" in n for n in log.notes) and len(log.frames) == 2
    src = tree(AV2, tmp_path / "no_sensors", leave_out=["sensors"])
    with pytest.raises(LogFormatError, match="no sensor data"):
        convert_av2(src, tmp_path / "out2", progress=False)
    assert not (tmp_path / "out2").exists()
    with pytest.raises(InputError, match="not a directory"):
        convert_av2(tmp_path / "nowhere", tmp_path / "out2", progress=False)


# --------------------------------------------------------------------------- the synthetic street, round trip

@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    from gsim.scenes.synth import SynthOptions, synthesize
    root = tmp_path_factory.mktemp("av2_synth")
    log = load_log(synthesize(root / "log", seed=0, options=SynthOptions(**SYNTH), progress=False))
    return log, write_av2(log, root / "av2" / "synth-log", lidar="top")


def test_av2_round_trip(synth, tmp_path):
    from PIL import Image
    from gsim.cameras import PinholeCamera
    from gsim.scenes.formats.av2 import VLP32C, convert_av2
    src, av2 = synth
    log = validate_log(convert_av2(av2, tmp_path / "log", progress=False))
    assert log.name == "synth-log" and set(log.lidars) == {"up_lidar"} and set(log.cameras) == set(src.cameras)
    assert np.array_equal(log.ego_timestamps_us, src.ego_timestamps_us)
    assert np.abs(log.ego_poses - src.ego_poses).max() < 1e-6
    for c, s in src.cameras.items():
        cam = log.cameras[c]
        assert np.abs(cam.T_vehicle_camera - s.T_vehicle_camera).max() < 1e-9 and cam.readout_us == 0
        # AV2 images are undistorted: the file's k1..k3 are not applied, so a camera comes back as its pinhole
        k = s.camera
        assert cam.camera == PinholeCamera(k.width, k.height, k.fx, k.fy, k.cx, k.cy)
    assert np.abs(log.lidars["up_lidar"].T_vehicle_lidar - src.lidars["top"].T_vehicle_lidar).max() < 1e-9
    assert log.lidars["up_lidar"].beams == VLP32C  # AV2 has no beam table; its LiDARs are VLP-32Cs
    assert [f.timestamp_us for f in log.frames] == [f.timestamp_us for f in src.frames]
    for f, g in zip(log.frames, src.frames):
        for c, obs in g.cameras.items():
            out = log.root / f.cameras[c].image
            assert out.read_bytes() == (av2 / "sensors/cameras" / c / f"{obs.timestamp_us * 1000}.jpg").read_bytes()
            assert np.abs(np.asarray(Image.open(out), float) / 255 - src.image(obs)).mean() < 0.02  # JPEG q95
        a, b = log.sweep(f.lidars["up_lidar"]), src.sweep(g.lidars["top"])
        assert a.shape == b.shape and np.array_equal(a[:, 4], b[:, 4])
        assert np.abs(a[:, 3] - b[:, 3]).max() <= 0.5 / 255 + 1e-7  # uint8 intensity
        # float16 in the egovehicle frame: each coordinate within 2^-11 of its size, so a point within 2^-11 of
        # its distance from the vehicle origin (rigid transforms keep lengths); float32 adds ~1e-5 m
        ego = np.linalg.norm(sweep_in_world(src, g.lidars["top"]) - src.T_world_vehicle(g.timestamp_us)[:3, 3], axis=1)
        err = np.linalg.norm(sweep_in_world(log, f.lidars["up_lidar"]) - sweep_in_world(src, g.lidars["top"]), axis=1)
        assert np.all(err <= 2.0 ** -11 * ego + 2e-5), (err / ego).max()
        assert np.all(np.linalg.norm(a[:, :3] - b[:, :3], axis=1) <= 2.0 ** -11 * ego + 2e-5)
    assert [a.id for a in log.actors] == [a.id for a in src.actors]
    for a, b in zip(log.actors, src.actors):
        assert a.category == "car" and a.metadata["class"] == "REGULAR_VEHICLE"
        assert np.allclose(a.size, b.size, atol=1e-12) and np.array_equal(a.timestamps_us, b.timestamps_us)
        assert np.abs(a.poses - b.poses).max() < 1e-6


def test_av2_frames_group_20hz_images_with_10hz_sweeps():
    """AV2's cameras run at 20 Hz, its LiDARs at 10 Hz: a sweep opens a frame with the images after it, and a
    camera's second image before the next sweep opens a camera-only frame."""
    from gsim.scenes.formats.av2 import group_frames
    ms = 1000
    ev = sorted([(0, 0, "lidar", None), (100 * ms, 0, "lidar", None)] +
                [(t * ms + d, 1, c, None) for t in (5, 55, 105) for c, d in (("front", 0), ("rear", 30 * ms))])
    frames = group_frames(ev)
    assert [[(o[0] // ms, o[2]) for o in f] for f in frames] == [
        [(0, "lidar"), (5, "front"), (35, "rear")], [(55, "front"), (85, "rear")], [(100, "lidar"), (105, "front"),
                                                                                   (135, "rear")]]


def copy(av2, dst):
    shutil.copytree(av2, dst)
    return dst


def test_av2_partial_and_bad_inputs(synth, tmp_path):
    from gsim.scenes.formats.av2 import convert_av2
    _, av2 = synth
    # cameras without LiDAR: a camera-only log
    src = copy(av2, tmp_path / "cameras_only")
    shutil.rmtree(src / "sensors/lidar")
    log = validate_log(convert_av2(src, tmp_path / "o1", progress=False))
    assert log.lidars == {} and len(log.cameras) == 3 and any("no LiDAR sweeps" in n for n in log.notes)
    # images need intrinsics; a camera with images needs its rows
    src = copy(av2, tmp_path / "no_intrinsics")
    (src / "calibration/intrinsics.feather").unlink()
    with pytest.raises(LogFormatError, match="intrinsics.feather: file missing"):
        convert_av2(src, tmp_path / "o2", progress=False)
    src = copy(av2, tmp_path / "extra_camera")
    shutil.copytree(src / "sensors/cameras/front", src / "sensors/cameras/ring_rear_left")
    with pytest.raises(LogFormatError, match="intrinsics.feather: camera 'ring_rear_left' has images but no row"):
        convert_av2(src, tmp_path / "o2", progress=False)
    # an image of the wrong size
    src = copy(av2, tmp_path / "small_image")
    from PIL import Image
    first = sorted((src / "sensors/cameras/front").glob("*.jpg"))[0]
    Image.new("RGB", (32, 24)).save(first)
    with pytest.raises(LogFormatError, match=f"{first.name}: image is 32x24, .*intrinsics.feather.* says 64x48"):
        convert_av2(src, tmp_path / "o2", progress=False)
    # bad sweep tables: a laser beyond 63, a column missing, a file named otherwise
    sweep = sorted((av2 / "sensors/lidar").glob("*.feather"))[0]
    t = feather.read_table(sweep)
    for name, table, match in (
            ("laser64", t.set_column(4, "laser_number", pa.array(np.full(len(t), 64, np.uint8))),
             "column 'laser_number': 64 at row 0, expected 0..63"),
            ("no_offsets", t.drop_columns(["offset_ns"]), "column 'offset_ns' missing")):
        src = copy(av2, tmp_path / name)
        feather.write_feather(table, src / "sensors/lidar" / sweep.name, compression="lz4")
        with pytest.raises(LogFormatError, match=f"{sweep.name}: {match}"):
            convert_av2(src, tmp_path / "o2", progress=False)
    src = copy(av2, tmp_path / "badname")
    shutil.copyfile(sweep, src / "sensors/lidar/sweep.feather")
    with pytest.raises(LogFormatError, match="sweep.feather: expected a file named by its timestamp"):
        convert_av2(src, tmp_path / "o2", progress=False)
    # sensor data beyond the pose table: refused (gsim would hold the last pose)
    src = copy(av2, tmp_path / "short_poses")
    p = feather.read_table(src / "city_SE3_egovehicle.feather")
    feather.write_feather(p.slice(0, 12), src / "city_SE3_egovehicle.feather", compression="lz4")
    with pytest.raises(LogFormatError, match="city_SE3_egovehicle.feather: poses span .* times outside have no ego"):
        convert_av2(src, tmp_path / "o2", progress=False)
    # a broken rotation
    src = copy(av2, tmp_path / "bad_quat")
    write_table(src / "calibration/egovehicle_SE3_sensor.feather",
                {**feather.read_table(av2 / "calibration/egovehicle_SE3_sensor.feather").to_pydict(),
                 "qw": [2.0] * 4})
    with pytest.raises(LogFormatError, match="egovehicle_SE3_sensor.feather: row 0: .* not a unit quaternion"):
        convert_av2(src, tmp_path / "o2", progress=False)
    assert not (tmp_path / "o2").exists()


def test_av2_cli(synth, tmp_path):
    import subprocess
    import sys
    _, av2 = synth
    r = subprocess.run([sys.executable, "-m", "gsim.cli", "convert", "av2", str(av2), str(tmp_path / "log")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(load_log(tmp_path / "log").frames) == SYNTH["n_frames"]
