"""gsim.bridges.recording.mcap_log: MCAP recording with Foxglove schemas, read back with the mcap reader."""
from __future__ import annotations

import io
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mcap", reason="MCAP recording needs the sumo extra: pip install -e \".[sumo]\"")
pytest.importorskip("mcap_protobuf", reason="needs mcap-protobuf-support (the sumo extra)")
pytest.importorskip("foxglove_schemas_protobuf", reason="needs foxglove-schemas-protobuf (the sumo extra)")

from mcap.decoder import DecoderFactory  # noqa: E402
from mcap.reader import make_reader  # noqa: E402
from mcap_protobuf.decoder import DecoderFactory as ProtobufDecoderFactory  # noqa: E402
from PIL import Image  # noqa: E402

from gsim.bridges.recording import mcap_log  # noqa: E402
from gsim.bridges.recording.mcap_log import Box, McapRecorder  # noqa: E402
from gsim.transforms import quat_to_rotmat  # noqa: E402

T0_US = 1_700_000_000_000_000  # a realistic epoch time: nanoseconds still fit uint64
DT_US = 100_000


class JsonDecoderFactory(DecoderFactory):
    """Decode MCAP 'json' messages (the mcap package ships no JSON decoder)."""

    def decoder_for(self, message_encoding, schema):
        return json.loads if message_encoding == "json" else None


def pose(yaw: float, t) -> np.ndarray:
    T = np.eye(4)
    c, s = np.cos(yaw), np.sin(yaw)
    T[:2, :2] = [[c, -s], [s, c]]
    T[:3, 3] = t
    return T


def read_all(path: Path):
    """Return (reader summary, header, metadata dict, [(schema, channel, message, decoded)])."""
    with open(path, "rb") as f:
        reader = make_reader(f, decoder_factories=[ProtobufDecoderFactory(), JsonDecoderFactory()])
        msgs = list(reader.iter_decoded_messages())
        meta = {m.name: m.metadata for m in reader.iter_metadata()}
        return reader.get_summary(), reader.get_header(), meta, msgs


def record_step(rec: McapRecorder, k: int, rng: np.random.Generator, actors: int):
    """One closed-loop-like step; returns what was written for checking."""
    ts = T0_US + k * DT_US
    T_world_ego = pose(0.1 * k, [2.0 * k, 0.5, 0.0])
    T_ego_cam = np.array([[0, 0, 1, 1.5], [-1, 0, 0, 0], [0, -1, 0, 1.6], [0, 0, 0, 1]], float)
    T_ego_lidar = pose(np.pi, [0.0, 0.0, 1.8])  # w = 0: the quaternion's hardest case
    rec.frame_transform(ts, "world", "ego", T_world_ego)
    rec.frame_transform(ts, "ego", "camera_front", T_ego_cam)
    rec.frame_transform(ts, "ego", "lidar_top", T_ego_lidar)
    yy, xx = np.mgrid[0:48, 0:64]  # smooth, so JPEG's loss stays small and checkable
    front = np.stack([xx * 4, yy * 5, (xx + yy + 20 * k) % 256], -1).astype(np.uint8)
    left = rng.random((30, 40, 3)).astype(np.float32)
    rec.image(ts, "/camera/front", "camera_front", front)
    rec.image(ts, "/camera/left", "camera_left", left, format="png")
    pts = rng.normal(size=(200, 4)) * [20.0, 20.0, 2.0, 1.0]
    rec.point_cloud(ts, "/lidar/top", "lidar_top", pts)
    boxes = [Box("ego", T_world_ego @ pose(0.0, [0, 0, 0.75]), (4.5, 1.9, 1.5), (0, 1, 0, 0.6))]
    boxes += [{"id": f"car_{j}", "T": pose(0.3 * j, [10.0 + 5 * j, -3.0, 0.8]), "size": (4.0 + j, 1.8, 1.6),
               "color": (1, 0, 0, 0.5), "label": f"car {j}"} for j in range(actors)]
    rec.boxes(ts, "/boxes", "world", boxes)
    rec.json(ts, "/metrics", {"step": np.int64(k), "speed_mps": np.float32(3.5 + k),
                              "collision": np.bool_(False), "ttc_s": float("inf"),
                              "controls": {"steer": np.array([0.1, -0.2])}})
    return dict(ts=ts, tf=[T_world_ego, T_ego_cam, T_ego_lidar], front=front, left=left, pts=pts, boxes=boxes)


def test_round_trip_all_channels(tmp_path):
    path = tmp_path / "out" / "run.mcap"
    rng = np.random.default_rng(0)
    with McapRecorder(path) as rec:
        steps = [record_step(rec, k, rng, actors=2 if k < 2 else 1) for k in range(3)]
        assert not path.exists(), "the final name must appear only at close"
        assert rec.part_path.exists()
    assert path.exists() and not list(path.parent.glob("*.part"))

    summary, header, meta, msgs = read_all(path)
    assert header.profile == "gsim"
    assert meta[mcap_log.METADATA_NAME] == {"complete": "true", "reason": ""}

    schema_of = {ch.topic: summary.schemas[ch.schema_id] for ch in summary.channels.values()}
    assert {t: s.name for t, s in schema_of.items()} == {
        "/tf": "foxglove.FrameTransform", "/camera/front": "foxglove.CompressedImage",
        "/camera/left": "foxglove.CompressedImage", "/lidar/top": "foxglove.PointCloud",
        "/boxes": "foxglove.SceneUpdate", "/metrics": "gsim.metrics"}
    assert schema_of["/metrics"].encoding == "jsonschema"
    metrics_schema = json.loads(schema_of["/metrics"].data)
    assert set(metrics_schema["properties"]) == {"step", "speed_mps", "collision", "ttc_s", "controls"}
    # The two cameras share one registered schema.
    assert schema_of["/camera/front"].id == schema_of["/camera/left"].id

    counts = Counter(ch.topic for _, ch, _, _ in msgs)
    assert counts == {"/tf": 9, "/camera/front": 3, "/camera/left": 3, "/lidar/top": 3, "/boxes": 3, "/metrics": 3}

    by_topic = defaultdict(list)
    for _, ch, msg, decoded in msgs:
        by_topic[ch.topic].append((msg, decoded))
    for topic, items in by_topic.items():
        per_step = 3 if topic == "/tf" else 1
        for n, (msg, decoded) in enumerate(items):
            ts = steps[n // per_step]["ts"]
            assert msg.log_time == msg.publish_time == ts * 1000, topic
            assert msg.sequence == n, topic
            if topic != "/metrics" and topic != "/boxes":
                assert decoded.timestamp.ToNanoseconds() == ts * 1000, topic

    for k, step in enumerate(steps):
        _, front = by_topic["/camera/front"][k]
        assert front.format == "jpeg" and front.frame_id == "camera_front"
        img = Image.open(io.BytesIO(front.data))
        assert img.format == "JPEG" and img.size == (64, 48)
        assert np.abs(np.asarray(img, float) - step["front"]).mean() < 3  # lossy, but the same picture
        _, left = by_topic["/camera/left"][k]
        assert left.format == "png"
        np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(left.data))),
                                      np.round(step["left"] * 255).astype(np.uint8))

        _, cloud = by_topic["/lidar/top"][k]
        assert cloud.frame_id == "lidar_top" and cloud.point_stride == 16
        assert [(f.name, f.offset, f.type) for f in cloud.fields] == [
            ("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("intensity", 12, 7)]  # 7 = FLOAT32
        assert (cloud.pose.orientation.w, cloud.pose.position.x) == (1.0, 0.0)
        back = np.frombuffer(cloud.data, dtype="<f4").reshape(-1, 4)
        np.testing.assert_allclose(back, step["pts"], rtol=1e-6, atol=1e-6)

        names = [("world", "ego"), ("ego", "camera_front"), ("ego", "lidar_top")]
        for j, T in enumerate(step["tf"]):
            _, tf = by_topic["/tf"][3 * k + j]
            assert (tf.parent_frame_id, tf.child_frame_id) == names[j]
            q = np.array([tf.rotation.w, tf.rotation.x, tf.rotation.y, tf.rotation.z])
            R = quat_to_rotmat(q[None])[0]
            t = [tf.translation.x, tf.translation.y, tf.translation.z]
            np.testing.assert_allclose(R, T[:3, :3], atol=1e-12)
            np.testing.assert_allclose(t, T[:3, 3], atol=1e-12)

        _, update = by_topic["/boxes"][k]
        assert len(update.deletions) == 1 and update.deletions[0].type == 1  # ALL earlier entities
        assert update.deletions[0].timestamp.ToNanoseconds() == step["ts"] * 1000
        assert [e.id for e in update.entities] == [b.id if isinstance(b, Box) else b["id"] for b in step["boxes"]]
        for e, b in zip(update.entities, step["boxes"]):
            b = b if isinstance(b, dict) else {"T": b.T, "size": b.size, "label": b.label}
            assert e.frame_id == "world" and e.timestamp.ToNanoseconds() == step["ts"] * 1000
            assert e.lifetime.ToNanoseconds() == 0
            (cube,) = e.cubes
            np.testing.assert_allclose([cube.size.x, cube.size.y, cube.size.z], b["size"])
            o = cube.pose.orientation
            np.testing.assert_allclose(quat_to_rotmat(np.array([[o.w, o.x, o.y, o.z]]))[0], b["T"][:3, :3],
                                       atol=1e-12)
            np.testing.assert_allclose([cube.pose.position.x, cube.pose.position.y, cube.pose.position.z],
                                       b["T"][:3, 3])
            assert [t.text for t in e.texts] == ([b["label"]] if b["label"] else [])
            if b["label"]:
                assert e.texts[0].pose.position.z == pytest.approx(b["T"][2, 3] + b["size"][2] / 2 + 0.5)

        _, metrics = by_topic["/metrics"][k]
        assert metrics == {"step": k, "speed_mps": 3.5 + k, "collision": False, "ttc_s": None,
                           "controls": {"steer": [0.1, -0.2]}}


def test_exception_keeps_completed_steps(tmp_path):
    path = tmp_path / "run.mcap"
    rng = np.random.default_rng(1)
    with pytest.raises(RuntimeError, match="agent crashed"):
        with McapRecorder(path) as rec:
            for k in range(2):
                record_step(rec, k, rng, actors=1)
            rec.frame_transform(T0_US + 2 * DT_US, "world", "ego", np.eye(4))  # step 2, part-written
            raise RuntimeError("agent crashed")
    assert rec.closed and path.exists() and not list(tmp_path.glob("*.part"))
    summary, _, meta, msgs = read_all(path)
    assert meta[mcap_log.METADATA_NAME] == {"complete": "false", "reason": "RuntimeError: agent crashed"}
    counts = Counter(ch.topic for _, ch, _, _ in msgs)
    assert counts["/camera/front"] == counts["/metrics"] == 2 and counts["/tf"] == 7
    assert summary.statistics.message_end_time == (T0_US + 2 * DT_US) * 1000


def test_close_without_context_manager_is_idempotent(tmp_path):
    rec = McapRecorder(tmp_path / "run.mcap", profile="custom")
    rec.json(T0_US, "/ego/state", {"v": 1.0})
    assert rec.close(complete=False, reason="stopped by user") == tmp_path / "run.mcap"
    assert rec.close() == tmp_path / "run.mcap"  # a second close changes nothing
    with pytest.raises(RuntimeError, match="closed"):
        rec.json(T0_US, "/ego/state", {"v": 2.0})
    summary, header, meta, msgs = read_all(tmp_path / "run.mcap")
    assert header.profile == "custom"
    assert meta[mcap_log.METADATA_NAME]["complete"] == "false"
    assert [(s.name, d) for s, _, _, d in msgs] == [("gsim.ego.state", {"v": 1.0})]


BAD_CALLS = {
    "nan tf pose": (lambda r: r.frame_transform(T0_US, "world", "ego", np.full((4, 4), np.nan)), "/tf"),
    "non-rigid tf": (lambda r: r.frame_transform(T0_US, "world", "ego", np.diag([2.0, 1, 1, 1])), "/tf"),
    "tf shape": (lambda r: r.frame_transform(T0_US, "world", "ego", np.eye(3)), "T_parent_child"),
    "image 2d": (lambda r: r.image(T0_US, "/camera/front", "cam", np.zeros((8, 8), np.uint8)), "/camera/front"),
    "image rgba": (lambda r: r.image(T0_US, "/camera/front", "cam", np.zeros((8, 8, 4), np.uint8)), "rgb"),
    "image range": (lambda r: r.image(T0_US, "/camera/front", "cam", np.full((8, 8, 3), 1.5)), "/camera/front"),
    "image format": (lambda r: r.image(T0_US, "/camera/front", "cam", np.zeros((8, 8, 3)), format="bmp"),
                     "format"),
    "points shape": (lambda r: r.point_cloud(T0_US, "/lidar/top", "lidar", np.zeros((5, 2))), "/lidar/top"),
    "points nan": (lambda r: r.point_cloud(T0_US, "/lidar/top", "lidar", np.full((5, 3), np.nan)), "NaN"),
    "box nan pose": (lambda r: r.boxes(T0_US, "/boxes", "world", [Box("a", np.full((4, 4), np.nan), (1, 1, 1))]),
                     "/boxes"),
    "box size": (lambda r: r.boxes(T0_US, "/boxes", "world", [Box("a", np.eye(4), (1, 0, 1))]), "size"),
    "box typo": (lambda r: r.boxes(T0_US, "/boxes", "world", [{"id": "a", "T": np.eye(4), "size": (1, 1, 1),
                                                               "lable": "x"}]), "lable"),
    "box duplicate": (lambda r: r.boxes(T0_US, "/boxes", "world", [Box("a", np.eye(4), (1, 1, 1))] * 2),
                      "duplicate"),
    "float time": (lambda r: r.json(1.5, "/metrics", {}), "timestamp_us"),
    "json object": (lambda r: r.json(T0_US, "/metrics", {"x": object()}), "/metrics"),
    "empty frame": (lambda r: r.point_cloud(T0_US, "/lidar/top", "", np.zeros((1, 3))), "frame_id"),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_input_raises_and_writes_nothing(tmp_path, name):
    call, needle = BAD_CALLS[name]
    with McapRecorder(tmp_path / "run.mcap") as rec:
        with pytest.raises(ValueError, match=needle.replace("/", "\\/")):
            call(rec)
    summary, _, _, msgs = read_all(tmp_path / "run.mcap")
    assert msgs == [] and not summary.channels  # validation happens before registration


def test_topic_keeps_its_type(tmp_path):
    with McapRecorder(tmp_path / "run.mcap") as rec:
        rec.json(T0_US, "/ego", {"v": 1.0})
        with pytest.raises(ValueError, match="/ego"):
            rec.point_cloud(T0_US, "/ego", "ego", np.zeros((3, 3)))


def test_missing_extra_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mcap.writer", None)  # makes `import mcap.writer` fail
    mcap_log._deps.cache_clear()
    try:
        with pytest.raises(ImportError, match=r'pip install -e "\.\[sumo\]"'):
            McapRecorder(tmp_path / "run.mcap")
    finally:
        mcap_log._deps.cache_clear()
    assert not list(tmp_path.iterdir())  # nothing created before the check
