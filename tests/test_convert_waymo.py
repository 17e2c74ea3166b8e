"""The Waymo Open Dataset v1 converter (gsim.scenes.formats.waymo): the TFRecord framing and its CRCs, gsim's minimal schema
against Waymo's own .proto files and the real record, the real one-frame sample (cameras, per-image poses,
calibration, 3D labels checked against Waymo's own projections and the 2D camera labels), and a round trip of the
synthetic street written as a Waymo segment (tests/waymo_writer.py: range images with per-pixel poses, second
returns, a virtual side LiDAR) read back. The sample's LiDAR returns are empty, so range images are checked on the
round trip only."""
import dataclasses
import importlib
import math
import re
import shutil
import sys
import zlib

import numpy as np
import pytest

pytest.importorskip("google.protobuf", reason="the Waymo converter needs protobuf (the formats extra)")

from gsim.boxes import corners, edge_points  # noqa: E402
from gsim.cameras import OpenCVCamera  # noqa: E402
from gsim.errors import InputError  # noqa: E402
from gsim.scenes.formats import waymo  # noqa: E402
from gsim.scenes.log import LogFormatError, validate_log  # noqa: E402
from gsim.scenes.overlay import draw_overlay, in_camera, sweep_in_world  # noqa: E402
from gsim.scenes.formats.waymo import convert_waymo, read_records, schema  # noqa: E402

from format_checks import DATA, OVERLAYS, box_iou_2d, sweep_agreement  # noqa: E402
from waymo_writer import BASE_US, SIDE, write_records, write_waymo  # noqa: E402

WAYMO = DATA / "waymo"
SAMPLE = WAYMO / "data" / "pvps_data_one_frame.tfrecord"
PROTOS = WAYMO / "proto"
SAMPLE_BYTES = 2_168_774
needs_sample = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"Waymo sample not found at {SAMPLE} "
                                  "(see ../shared/data/README.md)")
MATCH_IOU = 0.1  # a 3D box's projection and a 2D label that overlap less are not the same object
CAMERA_ENUM = {"front": 1, "front_left": 2, "front_right": 3, "side_left": 4, "side_right": 5}


def box_2d(b):
    return (b.center_x - b.length / 2, b.center_y - b.width / 2, b.center_x + b.length / 2, b.center_y + b.width / 2)


# --------------------------------------------------------------------------- framing and schema

def _crc32c_bitwise(data: bytes) -> int:
    """CRC-32C one bit at a time, straight from the polynomial (independent of the converter's tables)."""
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def test_crc32c_known_values_and_the_vectorised_path():
    # RFC 3720 B.4 vectors and the usual check value
    assert waymo.crc32c(b"123456789") == 0xE3069283
    assert waymo.crc32c(bytes(32)) == 0x8A9136AA
    assert waymo.crc32c(bytes([0xFF] * 32)) == 0x62A8AB43
    assert waymo.crc32c(bytes(range(32))) == 0x46DD794E
    rng = np.random.default_rng(0)
    for n in (4096, 4097, 9000, 70_001):  # the lane-parallel path, lengths not a multiple of its lanes
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert waymo.crc32c(data) == _crc32c_bitwise(data), n


@needs_sample
def test_real_record_crcs_are_checked(tmp_path):
    records = list(read_records(SAMPLE))
    assert [(k, off, len(d)) for k, off, d in records] == [(0, 0, SAMPLE_BYTES - 16)]
    raw = SAMPLE.read_bytes()
    two = tmp_path / "two.tfrecord"
    bad = bytearray(raw)
    bad[1000] ^= 0x01
    two.write_bytes(raw + bytes(bad))
    with pytest.raises(LogFormatError, match=rf"record 1 at byte {SAMPLE_BYTES}: data CRC mismatch"):
        list(read_records(two))
    head = bytearray(raw)
    head[3] ^= 0x10
    (tmp_path / "head.tfrecord").write_bytes(bytes(head))
    with pytest.raises(LogFormatError, match="record 0 at byte 0: length CRC mismatch"):
        list(read_records(tmp_path / "head.tfrecord"))
    (tmp_path / "cut.tfrecord").write_bytes(raw[:-100])
    with pytest.raises(LogFormatError, match="record 0 at byte 0: truncated"):
        convert_waymo(tmp_path / "cut.tfrecord", tmp_path / "log", progress=False)
    assert not (tmp_path / "log").exists()


@pytest.fixture(scope="module")
def reference_pb(tmp_path_factory):
    """Waymo's own dataset.proto and label.proto compiled (grpcio-tools, the test extra): the reference to check
    gsim's minimal schema against, and to read what gsim does not convert (camera labels)."""
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (the test extra) compiles Waymo's protos")
    if not PROTOS.is_dir():
        pytest.skip(f"Waymo's .proto files not found at {PROTOS}")
    out = tmp_path_factory.mktemp("waymo_pb")
    files = [f"waymo_open_dataset/{f}.proto" for f in ("dataset", "label", "protos/map", "protos/vector",
                                                       "protos/keypoint")]  # dataset.proto and its imports
    assert protoc.main(["protoc", f"-I{PROTOS}", f"--python_out={out}", *files]) == 0
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("waymo_open_dataset.dataset_pb2")
    finally:
        sys.path.remove(str(out))


def test_schema_has_waymos_field_numbers_and_types(reference_pb):
    from google.protobuf import descriptor_pool
    from google.protobuf.descriptor import FieldDescriptor as F
    pool = descriptor_pool.Default()
    mine = schema()
    for name in waymo._SCHEMA:
        ref = pool.FindMessageTypeByName("waymo.open_dataset." + ("Label.Box" if name == "Box" else name))
        for f in getattr(mine, name).DESCRIPTOR.fields:
            r = ref.fields_by_number[f.number]
            where = f"{name}.{f.name}"
            assert r.name == f.name and r.is_repeated == f.is_repeated and r.is_packed == f.is_packed, where
            if f.type == F.TYPE_MESSAGE:
                assert r.message_type.full_name.rsplit(".", 1)[1] == f.message_type.name, where
            else:
                assert r.type == f.type or (r.type == F.TYPE_ENUM and f.type == F.TYPE_INT32), where


@needs_sample
def test_schema_decodes_the_real_record(reference_pb):
    data = next(read_records(SAMPLE))[2]
    ref = reference_pb.Frame.FromString(data)
    f = schema().Frame.FromString(data)
    assert f.timestamp_micros == ref.timestamp_micros == 1553735853462203
    assert f.context.name == ref.context.name and list(f.pose.transform) == list(ref.pose.transform)
    for a, b in zip(f.context.camera_calibrations, ref.context.camera_calibrations, strict=True):
        assert (a.name, a.width, a.height, a.rolling_shutter_direction) == (b.name, b.width, b.height,
                                                                            b.rolling_shutter_direction)
        assert list(a.intrinsic) == list(b.intrinsic) and list(a.extrinsic.transform) == list(b.extrinsic.transform)
    for a, b in zip(f.context.laser_calibrations, ref.context.laser_calibrations, strict=True):
        assert list(a.beam_inclinations) == list(b.beam_inclinations) and a.name == b.name
        assert (a.beam_inclination_min, a.beam_inclination_max) == (b.beam_inclination_min, b.beam_inclination_max)
    for a, b in zip(f.images, ref.images, strict=True):
        assert a.image == b.image and list(a.pose.transform) == list(b.pose.transform)
        assert (a.pose_timestamp, a.shutter, a.camera_trigger_time, a.camera_readout_done_time) == \
            (b.pose_timestamp, b.shutter, b.camera_trigger_time, b.camera_readout_done_time)
    assert len(f.laser_labels) == 75
    for a, b in zip(f.laser_labels, ref.laser_labels, strict=True):
        assert (a.id, a.type) == (b.id, b.type)
        assert [getattr(a.box, k) for k in "center_x center_y center_z length width height heading".split()] == \
            [getattr(b.box, k) for k in "center_x center_y center_z length width height heading".split()]


# --------------------------------------------------------------------------- the real sample

@pytest.fixture(scope="module")
def real(tmp_path_factory):
    if not SAMPLE.is_file():
        pytest.skip(f"Waymo sample not found at {SAMPLE}")
    return validate_log(convert_waymo(SAMPLE, tmp_path_factory.mktemp("waymo") / "log", progress=False))


@needs_sample
def test_real_sample_contents(real):
    log = real
    assert log.name == "1024360143612057520_3580_000_3600_000" and log.source == "waymo-open-dataset-v1"
    assert set(log.cameras) == set(CAMERA_ENUM) and not log.lidars and len(log.frames) == 1
    for name, c in log.cameras.items():
        assert isinstance(c.camera, OpenCVCamera) and c.readout_us == 0
        assert (c.camera.width, c.camera.height) == ((1920, 886) if name.startswith("side") else (1920, 1280))
    assert log.cameras["front"].camera.cx == pytest.approx(949.5746451352071, abs=1e-12)  # not shifted
    # the front camera looks along the vehicle's x, image x to its right (-y), image y down (-z)
    T = log.cameras["front"].T_vehicle_camera
    assert T[:3, 2] @ [1, 0, 0] > 0.99 and T[:3, 0] @ [0, -1, 0] > 0.99 and T[:3, 1] @ [0, 0, -1] > 0.99
    assert T[:3, 3] == pytest.approx([1.5386, -0.0244, 2.1151], abs=1e-3)
    f = schema().Frame.FromString(next(read_records(SAMPLE))[2])
    for im in f.images:
        name = {v: k for k, v in CAMERA_ENUM.items()}[im.name]
        obs = log.frames[0].cameras[name]
        assert (log.root / obs.image).read_bytes() == im.image  # the JPEG as it is
        assert obs.timestamp_us == round((im.camera_trigger_time + im.camera_readout_done_time) / 2 * 1e6)
        # the ego pose at the image's pose_timestamp is the image's own pose
        assert np.allclose(log.T_world_vehicle(round(im.pose_timestamp * 1e6)), np.reshape(im.pose.transform, (4, 4)),
                           atol=1e-9)
    assert len(log.actors) == 75 and {a.category for a in log.actors} == {"car", "pedestrian", "sign", "cyclist"}
    dashed = [a for a in log.actors if a.metadata.get("source_id", "").startswith("-")]
    assert dashed and all(not a.id.startswith("-") and a.metadata["class"].startswith("TYPE_") for a in dashed)
    notes = " ".join(log.notes)
    assert "cameras front, front_left, front_right, side_left, side_right: rolling shutter LEFT_TO_RIGHT" in notes
    assert "lasers calibrated but never recorded in the segment, left out: front, rear, side_left, side_right, " \
        "top" in notes


def test_column_times_and_azimuth_times_agree():
    """A range-image column's firing time is the sweep time of its vehicle azimuth (labels and columns share the
    model the real cameras are checked against below)."""
    w = 2650
    az = math.pi - 2 * math.pi * (np.arange(w) + 0.5) / w
    got = [waymo.azimuth_offset_us(math.cos(a), math.sin(a)) for a in az]
    assert np.abs(np.asarray(got) - waymo.column_offsets_us(w)).max() <= 1
    assert waymo.column_offsets_us(w)[0] == 19 and waymo.column_offsets_us(w)[-1] == 99_981  # from behind, clockwise
    assert waymo.azimuth_offset_us(0.0, 1.0) == 25_000 and waymo.azimuth_offset_us(0.0, -1.0) == 75_000


@needs_sample
def test_real_camera_timing_follows_the_top_sweep(real):
    """The column-time model of the TOP (clockwise from +180 deg over 100 ms from the frame time) against the real
    cameras, which are triggered so that their middle column is exposed when the TOP sweeps their azimuth."""
    f = real.frames[0]
    for name, obs in f.cameras.items():
        axis = real.cameras[name].T_vehicle_camera[:3, 2]
        predicted = f.timestamp_us + waymo.azimuth_offset_us(axis[0], axis[1])
        print(f"Waymo sample, camera {name}: middle column exposed {obs.timestamp_us - predicted} us after the "
              f"TOP swept its axis")
        assert abs(obs.timestamp_us - predicted) < 500, name


def _projected_bounds(log, obs, actor):
    uv, inside, pc = in_camera(log, obs, edge_points(actor.pose_at(obs.timestamp_us), actor.size, 16))
    if not inside.all():
        return None
    return (*uv.min(0), *uv.max(0))


@needs_sample
def test_real_projection_equals_waymos_projected_labels(real, reference_pb):
    """Waymo's own projection of its 3D labels (projected_lidar_labels, the 2D bound of the box corners through
    its camera model) against gsim's projection of the converted boxes through the converted calibration."""
    ref = reference_pb.Frame.FromString(next(read_records(SAMPLE))[2])
    actors = {a.metadata.get("source_id", a.id): a for a in real.actors}
    names = {v: k for k, v in CAMERA_ENUM.items()}
    err, shifted = [], []
    for proj in ref.projected_lidar_labels:
        obs = real.frames[0].cameras[names[proj.name]]
        cam = real.cameras[obs.sensor].camera
        for lab in proj.labels:
            a = actors[lab.id.rsplit("_" + names[proj.name].upper(), 1)[0]]
            uv, inside, _ = in_camera(real, obs, corners(a.pose_at(obs.timestamp_us), a.size))
            b = box_2d(lab.box)
            if inside.all() and b[0] > 0 and b[1] > 0 and b[2] < cam.width and b[3] < cam.height:
                err.append(np.r_[uv.min(0), uv.max(0)] - b)
                shifted.append(err[-1] + 0.5)
    err = np.abs(err)
    print(f"Waymo sample: {len(err)} boxes, gsim's projection vs projected_lidar_labels: median {np.median(err):.3f} "
          f"px, max {err.max():.3f} px")
    assert len(err) >= 40
    assert np.median(err) < 0.05 and err.max() < 0.3, (np.median(err), err.max())
    assert np.median(np.abs(shifted)) > 0.45  # the +0.5 px shift of OpenCV-convention datasets would be wrong here


def _matched_ious(log, frame, labels_by_camera, yaw_deg=0.0):
    """IoUs of the converted boxes' projections (fully in view) matched to 2D labels of the same class
    (Hungarian on IoU, pairs above MATCH_IOU); ``yaw_deg`` turns every camera about the vehicle's z (a wrong
    calibration)."""
    from scipy.optimize import linear_sum_assignment
    types = {"TYPE_VEHICLE": 1, "TYPE_PEDESTRIAN": 2, "TYPE_SIGN": 3, "TYPE_CYCLIST": 4}
    if yaw_deg:
        c, s = math.cos(math.radians(yaw_deg)), math.sin(math.radians(yaw_deg))
        Rz = np.array([[c, -s, 0, 0], [s, c, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
        log = dataclasses.replace(log, cameras={n: dataclasses.replace(v, T_vehicle_camera=Rz @ v.T_vehicle_camera)
                                               for n, v in log.cameras.items()})
    ious = []
    for name, labels in labels_by_camera.items():
        obs = frame.cameras[name]
        proj = [(types[a.metadata["class"]], b) for a in log.actors
                if (b := _projected_bounds(log, obs, a)) is not None]
        gt = [(lab.type, box_2d(lab.box)) for lab in labels]
        M = np.array([[box_iou_2d(p, g) if tp == tg else 0.0 for tg, g in gt] for tp, p in proj])
        r, c = linear_sum_assignment(-M)
        ious += [v for v in M[r, c] if v > MATCH_IOU]
    return np.asarray(ious)


@needs_sample
def test_real_boxes_match_the_camera_labels(real, reference_pb):
    """Converted 3D labels projected through the converted calibration vs the frame's own 2D camera labels. The
    2D labels bound what is visible, the projected 3D box bounds the whole box, and many 2D labels are of cars
    beyond the 3D labels' range, so the IoUs are modest: the bar is what Waymo's own projections of the same
    boxes reach (their projected_lidar_labels against the same 2D labels), and cameras turned by 3 deg lose."""
    from scipy.optimize import linear_sum_assignment
    ref = reference_pb.Frame.FromString(next(read_records(SAMPLE))[2])
    names = {v: k for k, v in CAMERA_ENUM.items()}
    labels = {names[c.name]: c.labels for c in ref.camera_labels}
    ious = _matched_ious(real, real.frames[0], labels)
    median, n = np.median(ious), len(ious)
    waymos = []
    for proj in ref.projected_lidar_labels:
        cam = real.cameras[names[proj.name]].camera
        p = [(lab.type, b) for lab in proj.labels if (b := box_2d(lab.box))[0] > 0.5 and b[1] > 0.5
             and b[2] < cam.width - 0.5 and b[3] < cam.height - 0.5]
        g = [(lab.type, box_2d(lab.box)) for lab in labels[names[proj.name]]]
        M = np.array([[box_iou_2d(a, b) if ta == tb else 0.0 for tb, b in g] for ta, a in p])
        r, c = linear_sum_assignment(-M)
        waymos += [v for v in M[r, c] if v > MATCH_IOU]
    print(f"Waymo sample: median IoU {median:.3f} over {n} matches; Waymo's own projections "
          f"{np.median(waymos):.3f} over {len(waymos)}")
    assert n >= 18 and median >= 0.4 and abs(median - np.median(waymos)) < 0.02
    for yaw in (-3.0, 3.0):  # the matched overlap (count and IoU together) of a wrong calibration falls
        assert _matched_ious(real, real.frames[0], labels, yaw_deg=yaw).sum() < 0.6 * ious.sum(), yaw


@needs_sample
def test_real_boxes_drawn_on_the_front_camera(real, tmp_path):
    """The wireframes on the front image, halved and as a 256-colour PNG (docs/convert_waymo.png is this file,
    copied from /tmp/gsim_overlays/). Boxes are timed within the sweep, the images within it too: inside
    draw_overlay's margin, so every box in view is drawn. The numbers are the IoU test's."""
    from PIL import Image
    img = draw_overlay(real, 0, "front")
    assert img.shape == (1280, 1920, 3) and (img == [255, 230, 0]).all(2).sum() > 5000
    picture = Image.fromarray(img).resize((960, 640), Image.LANCZOS).quantize(256, method=Image.Quantize.MEDIANCUT,
                                                                             dither=Image.Dither.NONE)
    picture.save(tmp_path / "convert_waymo.png", optimize=True)
    assert (tmp_path / "convert_waymo.png").stat().st_size < 400_000
    OVERLAYS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tmp_path / "convert_waymo.png", OVERLAYS / "convert_waymo.png")


# --------------------------------------------------------------------------- round trip

@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """The synthetic street (3 frames), its Waymo segment and the writer's reference."""
    from gsim.scenes.log import load_log
    from gsim.scenes.synth import SynthOptions, build_street, synthesize
    root = tmp_path_factory.mktemp("waymo_synth")
    options = SynthOptions(n_frames=3, width=64, height=48, lidar_beams=16, lidar_azimuth_resolution_deg=2.0)
    log = load_log(synthesize(root / "synth", seed=0, options=options, progress=False))
    street = build_street(0, options)
    ref = write_waymo(log, street, root / "segment.tfrecord")
    return log, street, ref, root


@pytest.fixture(scope="module")
def back(synth):
    log, _, _, root = synth
    return validate_log(convert_waymo(root / "segment.tfrecord", root / "back", progress=False))


def test_round_trip_cameras(synth, back):
    log, _, ref, _ = synth
    assert back.name == log.name and set(back.cameras) == set(log.cameras)
    for name, c in log.cameras.items():
        b = back.cameras[name]
        assert b.camera == c.camera and b.readout_us == 0
        assert np.allclose(b.T_vehicle_camera, c.T_vehicle_camera, atol=1e-12)
    for k, (f, g) in enumerate(zip(log.frames, back.frames, strict=True)):
        assert g.timestamp_us == f.timestamp_us + BASE_US
        for name, obs in f.cameras.items():
            o = g.cameras[name]
            assert o.timestamp_us == obs.timestamp_us + BASE_US
            assert (back.root / o.image).read_bytes() == ref["jpeg"][name, k]  # JPEG bytes copied
            assert np.abs(back.image(o) - log.image(obs)).mean() < 0.02  # JPEG's loss only
            assert np.allclose(back.T_world_camera(o), log.T_world_camera(obs), atol=1e-6)
    assert any("cameras front_left: rolling shutter LEFT_TO_RIGHT" in n for n in back.notes)


def test_round_trip_top_sweeps(synth, back):
    """Range images with per-pixel poses: laser-frame points to float32 precision, both returns, the column times,
    and every point placed in the world by the log's ego poses where its own pixel pose puts it."""
    log, _, ref, _ = synth
    beams = back.lidars["top"].beams
    assert np.allclose(beams.elevations_deg, log.lidars["top"].beams.elevations_deg, atol=1e-12)
    assert beams.azimuth_resolution_deg == pytest.approx(2.0)
    assert np.array_equal(back.lidars["top"].T_vehicle_lidar, ref["T_top"])  # turned 148 deg about z
    for g, (first, second, world) in zip(back.frames, ref["top"], strict=True):
        obs = g.lidars["top"]
        assert obs.timestamp_us == g.timestamp_us
        sweep, sec = back.sweep(obs), back.second_returns(obs)
        assert sweep.shape == first.shape and sweep.shape[1] == 5 and len(sec) > 1000
        assert np.abs(sweep[:, :3] - first[:, :3]).max() < 1e-4  # float32 ranges
        assert np.abs(sweep[:, 3] - first[:, 3]).max() < 1e-6 and sweep[:, 3].max() < 1.0
        assert np.array_equal(sweep[:, 4], first[:, 4])
        assert sec.shape == second.shape and np.abs(sec - second).max() < 1e-4
        assert np.abs(sweep_in_world(back, obs) - world).max() < 1e-4
    (note,) = [n for n in back.notes if n.startswith("TOP sweeps")]
    assert float(re.search(r"within (\S+) mm", note).group(1)) < 0.1  # the writer's poses are one smooth motion


def test_round_trip_virtual_side_lidar(synth, back):
    """A range image without per-pixel poses (points in the frame pose's vehicle frame) lands where it was cast."""
    _, _, ref, _ = synth
    assert np.array_equal(back.lidars["front"].T_vehicle_lidar, SIDE["T"])
    el = back.lidars["front"].beams.elevations_deg
    assert len(el) == SIDE["rows"] and el[0] == pytest.approx(-30 + 40 / 12) and el[-1] == pytest.approx(10 - 40 / 12)
    for g, (sweep, world) in zip(back.frames, ref["front"], strict=True):
        obs = g.lidars["front"]
        got = back.sweep(obs)
        assert got.shape == sweep.shape and got.shape[1] == 4
        assert abs(obs.timestamp_us - g.timestamp_us - 50_000) <= 5_000  # the ego pose time nearest the middle
        assert np.abs(sweep_in_world(back, obs) - world).max() < 1e-4


def test_round_trip_ego_poses_and_sweep_agreement(synth, back):
    """Ego poses: the images' (exact) and the TOP's column poses (float32 in the format). Consecutive sweeps agree
    on static structure as well as the synthetic log's own do: on this sparse LiDAR (16 beams, 2 deg) the median
    nearest-point distance is set by the sampling (~19 cm for both), so the exact per-point check is
    test_round_trip_top_sweeps'."""
    log, street, _, _ = synth
    t = back.ego_timestamps_us
    assert t[0] == BASE_US and t[-1] < BASE_US + 300_000 and len(t) > 60
    truth = street.ego.poses(t - BASE_US)
    assert np.abs(back.ego_poses[:, :3, 3] - truth[:, :3, 3]).max() < 1e-5
    assert np.abs(back.ego_poses[:, :3, :3] - truth[:, :3, :3]).max() < 1e-6
    d = [sweep_agreement(back, a.lidars["top"], b.lidars["top"]) for a, b in zip(back.frames, back.frames[1:])]
    d_synth = [sweep_agreement(log, a.lidars["top"], b.lidars["top"]) for a, b in zip(log.frames, log.frames[1:])]
    print(f"round trip: consecutive TOP sweeps agree to {np.round(d, 4)} m (the synthetic log's own: "
          f"{np.round(d_synth, 4)} m)")
    assert max(d) < max(d_synth) + 0.01


def test_round_trip_tracks(synth, back):
    log, _, ref, _ = synth
    assert {a.id for a in back.actors} == {a.id for a in log.actors}
    src = {a.id: a for a in log.actors}
    for a in back.actors:
        s = src[a.id]
        assert a.category == "car" and a.metadata == {"class": "TYPE_VEHICLE"}
        assert np.allclose(a.size, s.size, atol=1e-12)
        times = [ref["labels"][a.id, k] for k in range(len(log.frames))]
        assert np.array_equal(a.timestamps_us, np.asarray(times) + BASE_US)
        for t, T in zip(times, a.poses):
            assert np.allclose(T, s.pose_at(t), atol=1e-6)


# --------------------------------------------------------------------------- partial and bad input

def test_partial_segments(synth, tmp_path):
    log, street, _, _ = synth
    lidar_only = write_waymo(log, street, tmp_path / "lidar.tfrecord", cameras=False)
    got = validate_log(convert_waymo(tmp_path / "lidar.tfrecord", tmp_path / "a", progress=False))
    assert not got.cameras and set(got.lidars) == {"top", "front"} and len(got.actors) == len(log.actors)
    assert len(lidar_only["top"]) == 3
    write_waymo(log, street, tmp_path / "cams.tfrecord", lidars=(), labels=False)
    got = validate_log(convert_waymo(tmp_path / "cams.tfrecord", tmp_path / "b", progress=False))
    assert set(got.cameras) == set(log.cameras) and not got.lidars and not got.actors
    # only a virtual LiDAR and no images: the frame pose is the ego pose, at the frame's middle
    write_waymo(log, street, tmp_path / "side.tfrecord", cameras=False, lidars=("front",), labels=False)
    got = validate_log(convert_waymo(tmp_path / "side.tfrecord", tmp_path / "c", progress=False))
    assert list(got.ego_timestamps_us) == [f.timestamp_us + 50_000 for f in got.frames]
    assert any("Frame.pose is the ego pose" in n for n in got.notes)
    write_waymo(log, street, tmp_path / "nopose.tfrecord", lidars=("top",), frame_pose=False)
    with pytest.raises(LogFormatError, match=r"record 0 \(byte 0\): pose missing \(the vehicle frame of laser_lab"):
        convert_waymo(tmp_path / "nopose.tfrecord", tmp_path / "d", progress=False)


def _frames(path):
    return [schema().Frame.FromString(d) for _, _, d in read_records(path)]


def test_bad_segments(synth, tmp_path):
    log, street, _, root = synth
    frames = _frames(root / "segment.tfrecord")

    def fails(edit, match):
        fs = [schema().Frame.FromString(f.SerializeToString()) for f in frames]
        edit(fs)
        write_records(tmp_path / "bad.tfrecord", [f.SerializeToString() for f in fs])
        with pytest.raises(LogFormatError, match=match):
            convert_waymo(tmp_path / "bad.tfrecord", tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()

    def fewer_beams(fs):
        del fs[1].context.laser_calibrations[0].beam_inclinations[0]
    fails(fewer_beams, r"record 1 .*context calibrations differ from the first frame's")

    def all_fewer_beams(fs):
        for f in fs:
            del f.context.laser_calibrations[0].beam_inclinations[0]
    fails(all_fewer_beams, r"laser_calibrations\[0\].beam_inclinations: 15 beams, the range image has 16 rows")

    def swap(fs):
        fs[0], fs[1] = fs[1], fs[0]
    fails(swap, r"record 1 .*timestamp_micros \d+ is not after the previous frame's")

    def other_segment(fs):
        fs[2].context.name = "another"
    fails(other_segment, r"record 2 .*'another' is another segment")

    def small_image(fs):
        fs[0].context.camera_calibrations[0].width = 65
        for f in fs[1:]:
            f.context.camera_calibrations[0].width = 65
    fails(small_image, r"images\[0\] \(front\).image: 64x48, its calibration says 65x48")

    def corrupt_range(fs):
        fs[0].lasers[0].ri_return1.range_image_compressed = b"not zlib"
    fails(corrupt_range, r"lasers\[0\].ri_return1.range_image_compressed: not zlib-compressed data")

    def bad_shape(fs):
        m = schema().MatrixFloat(data=[1.0] * 6)
        m.shape.dims.extend([1, 6])
        fs[0].lasers[0].ri_return1.range_image_pose_compressed = zlib.compress(m.SerializeToString())
    fails(bad_shape, r"range_image_pose_compressed: expected a \[H, W, >=6\] matrix, got shape \[1, 6\]")

    def unknown_laser(fs):
        fs[0].lasers[1].name = 5
    fails(unknown_laser, r"lasers\[1\].name: laser 5 has no calibration")

    def jumping_poses(fs):  # a per-pixel pose 2 m off: not one smooth motion
        m = schema().MatrixFloat.FromString(zlib.decompress(fs[0].lasers[0].ri_return1.range_image_pose_compressed))
        a = np.asarray(m.data, np.float32).reshape(tuple(m.shape.dims))
        a[:, 100, 3] += 2.0
        del m.data[:]
        m.data.extend(a.ravel().tolist())
        fs[0].lasers[0].ri_return1.range_image_pose_compressed = zlib.compress(m.SerializeToString())
    fails(jumping_poses, r"lies \d\.\d+ m from where its own pixel pose puts it")

    write_records(tmp_path / "bad.tfrecord", [b"\xff\xff\xff"])
    with pytest.raises(LogFormatError, match=r"record 0 \(byte 0\): not a Waymo Frame protobuf"):
        convert_waymo(tmp_path / "bad.tfrecord", tmp_path / "out", progress=False)


def test_uncompressed_range_image_field(synth, back, tmp_path):
    """The deprecated uncompressed RangeImage.range_image reads as the compressed one."""
    frames = _frames(synth[3] / "segment.tfrecord")
    ri = frames[1].lasers[0].ri_return1
    ri.range_image.CopyFrom(schema().MatrixFloat.FromString(zlib.decompress(ri.range_image_compressed)))
    ri.ClearField("range_image_compressed")
    write_records(tmp_path / "old.tfrecord", [f.SerializeToString() for f in frames])
    got = validate_log(convert_waymo(tmp_path / "old.tfrecord", tmp_path / "log", progress=False))
    for f, g in zip(back.frames, got.frames, strict=True):
        assert np.array_equal(back.sweep(f.lidars["top"]), got.sweep(g.lidars["top"]))


def test_refused_inputs(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        convert_waymo(tmp_path / "missing.tfrecord", tmp_path / "out", progress=False)
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    with pytest.raises(LogFormatError, match="no records"):
        convert_waymo(tmp_path / "empty.tfrecord", tmp_path / "out", progress=False)
    (tmp_path / "folder").mkdir()
    with pytest.raises(InputError, match="expected one segment's .tfrecord file .* got a folder$"):
        convert_waymo(tmp_path / "folder", tmp_path / "out", progress=False)
    (tmp_path / "folder" / "segment-1.tfrecord").write_bytes(b"")
    with pytest.raises(InputError, match=r"got a folder \(1 .tfrecord files in it, e.g. segment-1.tfrecord: conv"):
        convert_waymo(tmp_path / "folder", tmp_path / "out", progress=False)
    v2 = WAYMO / "data" / "v2"
    if not v2.is_dir():
        v2 = tmp_path / "v2"
        (v2 / "vehicle_pose").mkdir(parents=True)
        (v2 / "vehicle_pose" / "x.parquet").write_bytes(b"")
    with pytest.raises(InputError, match=r"v2 layout \(parquet components\) is not supported.*camera_image, "
                                         r"camera_calibration, lidar, lidar_calibration, lidar_pose, vehicle_pose"):
        convert_waymo(v2, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_camera_timing():
    t, d, s = 100.0, 100.046, 0.002
    assert waymo.camera_timing(1, t, d, s, 0.0, "x") == (100_001_000, 44_000, "rows")  # TOP_TO_BOTTOM
    assert waymo.camera_timing(5, t, d, s, 0.0, "x") == (100_001_000, 0, "global")
    assert waymo.camera_timing(2, t, d, s, 0.0, "x") == (100_023_000, 0, "middle")  # LEFT_TO_RIGHT
    assert waymo.camera_timing(2, 0.0, 0.0, s, 100.5, "x") == (100_500_000, 0, "pose")
    with pytest.raises(LogFormatError, match="x: no camera_trigger_time"):
        waymo.camera_timing(2, 0.0, 0.0, s, 0.0, "x")
    with pytest.raises(LogFormatError, match="x: shutter 0.05 s is negative or longer"):
        waymo.camera_timing(1, t, d, 0.05, 0.0, "x")


def test_cli_converts_a_segment(synth, tmp_path):
    from gsim.cli import main
    assert main(["convert", "waymo", str(synth[3] / "segment.tfrecord"), str(tmp_path / "log")]) == 0
    assert validate_log(tmp_path / "log").name == synth[0].name
