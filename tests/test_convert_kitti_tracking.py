"""The KITTI tracking converter (gsim.scenes.formats.kitti_tracking) on the real sample in ../shared/data/kitti_tracking
(sequence 0001: frames 0-1 of both colour cameras and the Velodyne, the whole sequence's calibration, oxts and
labels) and on the synthetic street, with a rendered stereo partner for its front camera, written as a KITTI
tracking sequence by a test-only writer (tests/kitti_tracking_writer.py) and read back. The checks: LiDAR points
land where KITTI's own formula (P_i @ R_rect @ Tr_velo_cam @ X) puts them and on image edges, in both cameras;
consecutive sweeps agree on static structure with the oxts poses; each box is KITTI's box (its 8 corners by
KITTI's definition) and its projection matches the label's 2D box."""
import itertools
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest

from format_checks import DATA, OVERLAYS, box_iou_2d, edge_score, project, sweep_agreement, write_overlay
from gsim.boxes import corners, edge_points
from gsim.cameras import PinholeCamera
from gsim.errors import InputError
from gsim.scenes.formats.convert_util import make_pose
from gsim.scenes.log import CameraObs, LogFormatError, LogWriter, load_log, validate_log
from gsim.scenes.overlay import draw_overlay, in_camera
from gsim.transforms import invert
from kitti_tracking_writer import write_kitti_tracking

TRAINING = DATA / "kitti_tracking" / "training"
needs_sample = pytest.mark.skipif(not TRAINING.is_dir(), reason=f"KITTI tracking sample not found at {TRAINING} "
                                  "(see ../shared/data/README.md)")
SYNTH = dict(n_frames=3, width=64, height=48, lidar_beams=8, lidar_azimuth_resolution_deg=2.0)
BASELINE_M = 0.54  # KITTI's stereo baseline: the rendered right camera sits this far right of the front one


def kitti_calib(path):
    """{key: numbers} of a KITTI tracking calib file, read independently of the converter."""
    out = {}
    for line in path.read_text().splitlines():
        key, *values = line.replace(":", " ").split()
        out[key] = np.array(values, float)
    return out


def rect_velo(cal):
    """R_rect @ Tr_velo_cam as a 4x4."""
    R0, Tv = np.eye(4), np.eye(4)
    R0[:3, :3] = cal["R_rect"].reshape(3, 3)
    Tv[:3] = cal["Tr_velo_cam"].reshape(3, 4)
    return R0 @ Tv


def labels(path):
    """The label file's rows other than DontCare: (frame, track_id, truncated, occluded, bbox, h, w, l, x, y, z,
    ry)."""
    out = []
    for line in path.read_text().splitlines():
        f = line.split()
        if f[2] != "DontCare":
            out.append((int(f[0]), int(f[1]), float(f[3]), int(f[4]), np.array(f[6:10], float),
                        *(float(x) for x in f[10:17])))
    return out


def kitti_corners(h, w, l, x, y, z, ry):
    """(8,3) box corners in the rectified camera-0 frame by KITTI's definition: Ry(ry) @ (+-l/2, 0 | -h, +-w/2)
    + the bottom centre."""
    c, s = math.cos(ry), math.sin(ry)
    Ry = np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])
    local = np.array([[sx * l / 2, -h * top, sz * w / 2] for sx in (1, -1) for top in (0, 1) for sz in (1, -1)])
    return local @ Ry.T + [x, y, z]


# --------------------------------------------------------------------------- the real sample

@pytest.fixture(scope="module")
def sample_log(tmp_path_factory):
    if not TRAINING.is_dir():
        pytest.skip(f"KITTI tracking sample not found at {TRAINING}")
    from gsim.scenes.formats.kitti_tracking import convert_kitti_tracking
    return validate_log(convert_kitti_tracking(TRAINING, tmp_path_factory.mktemp("kt") / "log", "0001",
                                               progress=False))


@needs_sample
def test_sample_contents(sample_log):
    log = sample_log
    assert log.name == "kitti_tracking_training_0001" and log.source == "kitti-tracking"
    assert [f.timestamp_us for f in log.frames] == [0, 100_000]
    assert set(log.cameras) == {"image_02", "image_03"} and set(log.lidars) == {"velodyne"}
    for c in log.cameras.values():
        assert isinstance(c.camera, PinholeCamera) and (c.camera.width, c.camera.height) == (1242, 375)
    # every oxts line is an ego pose (the whole sequence's trajectory), every labelled track an actor
    assert len(log.ego_poses) == 447 and list(log.ego_timestamps_us) == [100_000 * k for k in range(447)]
    assert len(log.actors) == 98 and {a.category for a in log.actors} == {"car", "truck", "pedestrian", "other"}
    van = [a for a in log.actors if a.metadata["class"] == "Van"]
    assert van and all(a.category == "car" for a in van)
    assert any("frame index / 10 Hz" in n for n in log.notes)
    assert any("sensor files for 2 of the sequence's 447 frames" in n for n in log.notes)
    assert any("1241 DontCare regions dropped" in n for n in log.notes)
    for k, f in enumerate(log.frames):
        for c in log.cameras:
            assert (log.root / f.cameras[c].image).read_bytes() == (TRAINING / c / "0001" / f"{k:06d}.png").read_bytes()
        raw = np.fromfile(TRAINING / "velodyne/0001" / f"{k:06d}.bin", np.float32).reshape(-1, 4)
        assert np.array_equal(log.sweep(f.lidars["velodyne"]), raw)
    # the left camera ~0.27 m ahead of the Velodyne looking forward, the right one the baseline to its right
    left, right = (log.cameras[c].T_vehicle_camera for c in ("image_02", "image_03"))
    assert 0.2 < left[0, 3] < 0.35 and left[:3, 2] @ [1, 0, 0] > 0.99 and left[:3, 1] @ [0, 0, -1] > 0.99
    assert np.allclose(right[:3, 3] - left[:3, 3], [0, -0.532, 0], atol=0.01) and np.allclose(right[:3, :3],
                                                                                               left[:3, :3])


@needs_sample
@pytest.mark.parametrize("camera", ["image_02", "image_03"])
@pytest.mark.parametrize("k", [0, 1])
def test_sample_lidar_projects_as_kitti_says(sample_log, camera, k, tmp_path):
    log = sample_log
    frame = log.frames[k]
    uv, inside, pc = project(log, frame, camera, "velodyne")
    cal = kitti_calib(TRAINING / "calib/0001.txt")
    pts = log.sweep(frame.lidars["velodyne"])[:, :3].astype(np.float64)
    h = (cal[f"P{camera[-1]}"].reshape(3, 4) @ rect_velo(cal) @ np.c_[pts, np.ones(len(pts))].T).T
    assert inside.sum() > 15_000
    assert np.abs(uv[inside] - 0.5 - h[inside, :2] / h[inside, 2:]).max() < 1e-3  # gsim's pixel centres at +0.5
    # LiDAR silhouettes sit on image edges: shifting the projection by 8 px in any direction loses
    rgb = log.image(frame.cameras[camera])
    aligned = edge_score(rgb, uv, pc)
    for dx, dy in itertools.product((-8, 0, 8), repeat=2):
        if (dx, dy) != (0, 0):
            assert aligned > 1.03 * edge_score(rgb, uv, pc, (dx, dy)), (dx, dy)
    write_overlay(rgb, uv[inside], pc[inside, 2], f"kitti_tracking_{camera}_{k:06d}.png", tmp_path)


@needs_sample
def test_sample_sweeps_agree(sample_log):
    """The car moves 1.17 m between the sweeps: with the oxts poses they agree within 5 cm on static structure,
    better than with the second pose moved 30 cm along x, y or z."""
    import dataclasses
    log = sample_log
    a, b = (f.lidars["velodyne"] for f in log.frames)
    agreement = sweep_agreement(log, a, b)
    print(f"KITTI tracking 0001, sweeps 0-1: median distance {agreement * 100:.1f} cm")
    assert agreement <= 0.05
    for axis in range(3):
        moved = log.ego_poses.copy()
        moved[1, axis, 3] += 0.3
        assert agreement < 0.8 * sweep_agreement(dataclasses.replace(log, ego_poses=moved), a, b), axis


@needs_sample
def test_sample_boxes_are_kittis(sample_log):
    """Each converted box has the 8 corners KITTI's definition gives its label (through the log's own ego pose and
    the calibration read independently), and a heading of -ry - pi/2 in the Velodyne frame."""
    log = sample_log
    T_velo_rect = invert(rect_velo(kitti_calib(TRAINING / "calib/0001.txt")))
    actors = {a.id: a for a in log.actors}
    rows = labels(TRAINING / "label_02/0001.txt")
    assert len(rows) == 3030
    for frame, track, _, _, _, h, w, l, x, y, z, ry in rows[::7]:
        t = frame * 100_000
        T_world_velo = log.T_world_vehicle(t)  # vehicle = Velodyne
        pose = actors[f"track_{track}"].pose_at(t)
        ours = corners(pose, actors[f"track_{track}"].size)
        theirs = kitti_corners(h, w, l, x, y, z, ry) @ (T_world_velo @ T_velo_rect)[:3, :3].T + \
            (T_world_velo @ T_velo_rect)[:3, 3]
        d = np.linalg.norm(ours[:, None] - theirs[None], axis=2)  # the same 8 corners, in any order
        # to a micrometre: the converter makes the file's 7-digit rotations exactly orthonormal
        assert d.min(0).max() < 1e-6 and d.min(1).max() < 1e-6, (frame, track)
        heading = invert(T_world_velo)[:3, :3] @ pose[:3, 0]
        assert abs(math.remainder(math.atan2(heading[1], heading[0]) + ry + math.pi / 2, 2 * math.pi)) < 0.02
        assert heading[2] ** 2 < 1e-3  # the box's length lies within 2 degrees of the Velodyne's xy plane
        assert (invert(T_world_velo)[:3, :3] @ pose[:3, 2])[2] > 0.999  # and its z axis up (a box is symmetric)


def projected_bound(log, actor, t, camera="image_02"):
    """The 2D bound (x1, y1, x2, y2, KITTI's pixel convention) of a box's edges projected through the log into the
    camera at time t, clipped to the image as KITTI's 2D boxes are; None where it is behind the camera."""
    cam = log.cameras[camera].camera
    uv, _, pc = in_camera(log, CameraObs(camera, t, ""), edge_points(actor.pose_at(t), actor.size, 24))
    q = uv[pc[:, 2] > 0.1] - 0.5
    if not len(q):
        return None
    return (max(q[:, 0].min(), 0), max(q[:, 1].min(), 0), min(q[:, 0].max(), cam.width - 1),
            min(q[:, 1].max(), cam.height - 1))


@needs_sample
def test_sample_boxes_match_the_2d_labels(sample_log):
    """Projected through the log, the 3D boxes cover the labels' own 2D boxes in image_02: at the sample's two
    frames, and at every labelled frame of the sequence (the log has every frame's ego pose)."""
    log = sample_log
    actors = {a.id: a for a in log.actors}
    visible, seen = [], []
    for frame, track, truncated, occluded, bbox, *_ in labels(TRAINING / "label_02/0001.txt"):
        b = projected_bound(log, actors[f"track_{track}"], frame * 100_000)
        if b is not None and truncated == 0 and occluded == 0:
            (seen if frame < 2 else visible).append(box_iou_2d(b, bbox))
    print(f"KITTI tracking 0001, 2D label vs projected 3D box IoU: frames 0-1 {np.round(seen, 3)}, all frames median "
          f"{np.median(visible + seen):.3f} over {len(visible + seen)} boxes")
    assert len(seen) == 3 and min(seen) > 0.9
    assert len(visible) > 500 and np.median(visible) > 0.9 and np.percentile(visible, 10) > 0.7


@needs_sample
def test_sample_overlay_picture(sample_log, tmp_path):
    """The wireframes drawn on the frame-0 image, as a 256-colour PNG (docs/convert_kitti_tracking.png is this
    file, copied from /tmp/gsim_overlays/)."""
    from PIL import Image
    img = draw_overlay(sample_log, 0, "image_02")
    assert img.shape == (375, 1242, 3)
    picture = Image.fromarray(img).quantize(256, method=Image.Quantize.MEDIANCUT)
    picture.save(tmp_path / "convert_kitti_tracking.png", optimize=True)
    assert (tmp_path / "convert_kitti_tracking.png").stat().st_size < 400_000
    OVERLAYS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tmp_path / "convert_kitti_tracking.png", OVERLAYS / "convert_kitti_tracking.png")


# --------------------------------------------------------------------------- the synthetic street

@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """(the synthetic street as a stereo log: its front camera and one rendered the baseline to its right, its
    LiDAR, poses and cars; the same written as KITTI tracking sequence 0007 of a training/ folder, the writer's
    answer)."""
    from gsim.scenes.synth import SynthOptions, build_street, render_camera, synthesize
    root = tmp_path_factory.mktemp("kt_synth")
    options = SynthOptions(**SYNTH)
    src = load_log(synthesize(root / "synth", seed=0, options=options, progress=False))
    street, front = build_street(0, options), src.cameras["front"]
    T_right = front.T_vehicle_camera @ make_pose(np.eye(3), [BASELINE_M, 0, 0])
    with LogWriter(root / "stereo", name="synth-stereo", source="test") as w:
        w.add_camera("left", front.camera, front.T_vehicle_camera)
        w.add_camera("right", front.camera, T_right)
        w.add_lidar("top", src.lidars["top"].T_vehicle_lidar, src.lidars["top"].beams)
        for t, T in zip(src.ego_timestamps_us, src.ego_poses):
            w.add_ego_pose(t, T)
        for a in src.actors:
            w.add_actor(a)
        for k, f in enumerate(src.frames):
            t = f.timestamp_us
            rgb, _ = render_camera(street, front.camera, src.T_world_vehicle(t) @ T_right, t, options.supersample)
            w.add_frame(t, {"left": w.image("left", k, t, src=src.root / f.cameras["front"].image),
                            "right": w.image("right", k, t, rgb=rgb)},
                        {"top": w.sweep("top", k, t, src.sweep(f.lidars["top"]))})
    stereo = load_log(root / "stereo")
    written = write_kitti_tracking(stereo, root / "training", "0007", "top", {"image_02": "left", "image_03": "right"})
    return stereo, root / "training", written


def test_round_trip(synth, tmp_path):
    """Read back, the sequence is the stereo log in KITTI's frames: vehicle = the LiDAR, world = east-north-up from
    frame 0's IMU (the log's world moved by ``origin``), one ego pose a frame; points and images exact."""
    from gsim.scenes.formats.kitti_tracking import convert_kitti_tracking
    src, training, written = synth
    log = validate_log(convert_kitti_tracking(training, tmp_path / "log", "7", progress=False))
    assert log.name == "kitti_tracking_training_0007" and set(log.lidars) == {"velodyne"}
    shift = make_pose(np.eye(3), -written["origin"])
    T_vl = src.lidars["top"].T_vehicle_lidar
    n = len(src.frames) + 1  # the synthetic street's poses and tracks run to the end of the last sweep
    assert list(log.ego_timestamps_us) == [100_000 * k for k in range(n)]
    for t, T in zip(log.ego_timestamps_us, log.ego_poses):
        assert np.abs(T - shift @ src.T_world_vehicle(t) @ T_vl).max() < 1e-6
    assert [f.timestamp_us for f in log.frames] == [f.timestamp_us for f in src.frames]
    for kitti, c in (("image_02", "left"), ("image_03", "right")):
        assert log.cameras[kitti].camera == src.cameras[c].camera
    for f, g in zip(log.frames, src.frames):
        for kitti, c in (("image_02", "left"), ("image_03", "right")):
            assert np.abs(log.T_world_camera(f.cameras[kitti]) - shift @ src.T_world_camera(g.cameras[c])).max() < 1e-6
            assert (log.root / f.cameras[kitti].image).read_bytes() == (src.root / g.cameras[c].image).read_bytes()
        assert np.abs(log.T_world_lidar(f.lidars["velodyne"]) - shift @ src.T_world_lidar(g.lidars["top"])).max() < 1e-6
        assert np.array_equal(log.sweep(f.lidars["velodyne"]), src.sweep(g.lidars["top"])[:, :4])
    ids = written["track_ids"]
    assert sorted(a.id for a in log.actors) == sorted(f"track_{i}" for i in ids.values())
    actors = {a.id: a for a in log.actors}
    for b in src.actors:
        a = actors[f"track_{ids[b.id]}"]
        assert a.category == "car" and a.metadata == {"class": "Car", "track_id": ids[b.id]}
        assert np.allclose(a.size, b.size, rtol=0, atol=1e-12) and np.array_equal(a.timestamps_us, b.timestamps_us)
        assert np.abs(a.poses - shift @ b.poses).max() < 1e-6
    assert any(f"{n} DontCare regions dropped" in note for note in log.notes)


def copy(training, dst, leave_out=()):
    """A copy of the written training/ folder without the files and folders (relative paths) in ``leave_out``."""
    shutil.copytree(training, dst)
    for rel in leave_out:
        p = dst / rel
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return dst


def test_partial_sequences(synth, tmp_path):
    from gsim.scenes.formats.kitti_tracking import convert_kitti_tracking
    src, training, _ = synth

    def convert(name, leave_out=()):
        src = copy(training, tmp_path / name / "training", leave_out)
        return validate_log(convert_kitti_tracking(src, tmp_path / name / "log", "0007", progress=False))

    full = convert("full")
    log = convert("testing", ["label_02"])  # the testing split: no labels
    assert not log.actors and any("no label_02/0007.txt (the testing split has none)" in n for n in log.notes)
    log = convert("one_camera", ["image_03"])
    assert set(log.cameras) == {"image_02"} and len(log.frames) == 3
    assert "no image_03/0007 files: the log has no image_03 sensor" in log.notes
    log = convert("cameras_only", ["velodyne/0007"])
    assert log.lidars == {} and all(not f.lidars for f in log.frames) and len(log.frames) == 3
    assert "no velodyne/0007 files: the log has no velodyne sensor" in log.notes
    log = convert("lidar_only", ["image_02", "image_03"])
    assert log.cameras == {} and len(log.frames) == 3 and len(log.actors) == len(full.actors) == len(src.actors)
    # a lost sweep (KITTI raw drive 2011_09_26_drive_0009 has none for frames 177-180): a camera-only frame
    log = convert("lost_sweep", ["velodyne/0007/000001.bin"])
    assert [sorted(f.lidars) for f in log.frames] == [["velodyne"], [], ["velodyne"]]
    assert "velodyne has no file for 1 of the converted frames: 000001" in log.notes
    # a copy with some frames only (as the sample): those frames, the whole sequence's poses and tracks
    log = convert("some_frames", [f"{s}/0007/000002.{e}" for s, e in (("image_02", "png"), ("image_03", "png"),
                                                                        ("velodyne", "bin"))])
    assert len(log.frames) == 2 and len(log.ego_poses) == 4 and all(len(a.timestamps_us) == 4 for a in log.actors)
    assert any("sensor files for 2 of the sequence's 4 frames (oxts lines): 000000-000001" in n for n in log.notes)
    # the object benchmark's calibration key names read the same
    keys = copy(training, tmp_path / "object_keys" / "training")
    calib = keys / "calib/0007.txt"
    calib.write_text(calib.read_text().replace("R_rect ", "R0_rect: ").replace("Tr_velo_cam ", "Tr_velo_to_cam: ")
                     .replace("Tr_imu_velo ", "Tr_imu_to_velo: "))
    other = validate_log(convert_kitti_tracking(keys, tmp_path / "object_keys/log", "0007", progress=False))
    assert np.array_equal(other.ego_poses, full.ego_poses) and np.array_equal(log.ego_poses, full.ego_poses)
    for c in full.cameras:
        assert np.array_equal(other.cameras[c].T_vehicle_camera, full.cameras[c].T_vehicle_camera)


def test_bad_inputs(synth, tmp_path):
    from gsim.scenes.formats.kitti_tracking import convert_kitti_tracking
    _, training, _ = synth

    def check(name, edit, match, error=LogFormatError):
        src = copy(training, tmp_path / name / "training")
        edit(src)
        with pytest.raises(error, match=match):
            convert_kitti_tracking(src, tmp_path / "out", "0007", progress=False)

    def replace_line(path, k, text):
        lines = path.read_text().splitlines()
        lines[k] = text
        path.write_text("\n".join(lines) + "\n")

    check("no_calib", lambda s: (s / "calib/0007.txt").unlink(), r"calib/0007.txt: calibration file missing")
    check("no_P3", lambda s: replace_line(s / "calib/0007.txt", 3, ""), r"calib/0007.txt: P3: missing")
    check("no_oxts", lambda s: (s / "oxts/0007.txt").unlink(),
          r"oxts/0007.txt: oxts file missing: KITTI tracking's ego poses come from it")
    check("short_oxts", lambda s: replace_line(s / "oxts/0007.txt", 1, "49.0 8.4 110.0 0 0 0"),
          r"oxts/0007.txt: line 2: expected 30 numbers")
    check("oxts_gap", lambda s: replace_line(s / "oxts/0007.txt", 2, ""),
          r"oxts/0007.txt: line 3: expected 30 numbers .*, got ''")
    check("label_fields", lambda s: replace_line(s / "label_02/0007.txt", 2, "0 0 Car 0 0"),
          r"label_02/0007.txt: line 3: expected 17 fields")
    check("label_size", lambda s: (s / "label_02/0007.txt").write_text(
        "0 0 Car 0 0 -10 -1 -1 -1 -1 1.5 0 4.0 1 1.6 10 0\n"), r"label_02/0007.txt: line 1: expected finite h w l > 0")
    check("label_frame", lambda s: (s / "label_02/0007.txt").write_text(
        "9 0 Car 0 0 -10 -1 -1 -1 -1 1.5 1.8 4.0 1 1.6 10 0\n"), r"label_02/0007.txt: line 1: frame 9 has no oxts line")
    check("image_frame", lambda s: shutil.copyfile(s / "image_02/0007/000000.png", s / "image_02/0007/000009.png"),
          r"image_02/0007/000009.png: frame 9 has no oxts line \(.*oxts/0007.txt has 4 lines")
    check("image_name", lambda s: shutil.copyfile(s / "image_02/0007/000000.png", s / "image_02/0007/left.png"),
          r"image_02/0007/left.png: expected a file named by its frame index")

    def small_image(s):
        from PIL import Image
        Image.new("RGB", (32, 24)).save(s / "image_03/0007/000001.png")
    check("image_size", small_image, r"image_03/0007/000001.png: image is 32x24, the size of 000000.png")
    check("truncated_sweep", lambda s: (s / "velodyne/0007/000001.bin").write_bytes(b"\0" * 20),
          r"velodyne/0007/000001.bin: 20 bytes is not a whole number")
    check("reflectance", lambda s: np.array([[1, 2, 3, 255]], np.float32).tofile(s / "velodyne/0007/000001.bin"),
          r"velodyne/0007/000001.bin: reflectance outside \[0, 1\]")
    check("no_sensors", lambda s: [shutil.rmtree(s / d) for d in ("image_02", "image_03", "velodyne")],
          r"no files in image_02/0007, image_03/0007 or velodyne/0007")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
    with pytest.raises(InputError, match="not a directory"):
        convert_kitti_tracking(tmp_path / "nowhere", tmp_path / "out", "0007", progress=False)
    with pytest.raises(InputError, match="sequence: expected a sequence number"):
        convert_kitti_tracking(training, tmp_path / "out", "seven", progress=False)
    with pytest.raises(InputError, match=r"training: sequence 0009 not found \(calib/ has 0007\)"):
        convert_kitti_tracking(training, tmp_path / "out", 9, progress=False)


def test_cli(synth, tmp_path):
    _, training, _ = synth
    r = subprocess.run([sys.executable, "-m", "gsim.cli", "convert", "kitti-tracking", str(training),
                        str(tmp_path / "log"), "--sequence", "0007"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(load_log(tmp_path / "log").frames) == SYNTH["n_frames"]
