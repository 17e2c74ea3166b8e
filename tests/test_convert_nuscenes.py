"""The nuScenes converter (gsim.scenes.formats.nuscenes) on the real samples in ../shared/data and on table sets made here.

The nuScenes sample has the sensor files of one scene-0061 keyframe but not its sample_data, ego_pose and
sample_annotation tables; that keyframe's ego pose, calibration and 69 boxes are in an mmdet3d info pickle, read
here with a restricted unpickler. The tests build a small complete table set for the keyframe from the real tables
and the pickle's values (sample_data pointing at the real files by symlink) and check the log against mmdet3d's own
matrices. The Lyft sample is a complete table set without its sensor files."""
import codecs
import dataclasses
import json
import pickle
import shutil

import numpy as np
import pytest
from PIL import Image

from gsim.errors import InputError
from gsim.scenes.log import ActorTrack, LogFormatError, validate_log
from gsim.scenes.overlay import draw_overlay, in_camera, sweep_in_world
from gsim.transforms import invert, quat_to_rotmat

from format_checks import DATA, OVERLAYS, project, save_picture, sweep_agreement, write_overlay
from nuscenes_writer import pose_record, token, write_nuscenes

NUS = DATA / "nuscenes"
LYFT = DATA / "lyft_tables"
INFO = NUS / "mmdet3d_infos" / "n015-2018-07-24-11-22-45+0800.pkl"
CAMERAS = ("CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_BACK_RIGHT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_FRONT_LEFT")
needs_nus = pytest.mark.skipif(not INFO.is_file(), reason=f"nuScenes sample not found at {NUS} "
                               "(see ../shared/data/README.md)")
needs_lyft = pytest.mark.skipif(not LYFT.is_dir(), reason=f"Lyft table sample not found at {LYFT} "
                                "(see ../shared/data/README.md)")
# mmdet3d's 10 classes -> a nuScenes class of each; its label -1 (classes it ignores: animals, debris, bicycle
# racks, ...) becomes one of them, which gsim maps to "other"
MMDET3D_CLASSES = {"car": "vehicle.car", "truck": "vehicle.truck", "trailer": "vehicle.trailer",
                   "bus": "vehicle.bus.rigid", "construction_vehicle": "vehicle.construction",
                   "bicycle": "vehicle.bicycle", "motorcycle": "vehicle.motorcycle",
                   "pedestrian": "human.pedestrian.adult", "traffic_cone": "movable_object.trafficcone",
                   "barrier": "movable_object.barrier", None: "movable_object.pushable_pullable"}


def convert(*args, **kw):
    from gsim.scenes.formats.nuscenes import convert_nuscenes
    return convert_nuscenes(*args, progress=False, **kw)


def nothing_in(folder):
    """No log, not even a temporary folder, was left in ``folder`` (the parent of the scenes' logs)."""
    return not folder.exists() or not any(folder.iterdir())


class _NumpyOnly(pickle.Unpickler):
    """Unpickles plain containers and numpy scalars, dtypes and arrays; any other global is refused."""

    ALLOWED = {("numpy", "dtype"): np.dtype, ("numpy", "ndarray"): np.ndarray, ("_codecs", "encode"): codecs.encode,
               # numpy's scalar and array reconstructors, under their numpy 1 and numpy 2 module names
               **{(m, "scalar"): np.float64(0).__reduce__()[0] for m in ("numpy.core.multiarray",
                                                                          "numpy._core.multiarray")},
               **{(m, "_reconstruct"): np.zeros(1).__reduce__()[0] for m in ("numpy.core.multiarray",
                                                                              "numpy._core.multiarray")}}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed here")
        return self.ALLOWED[(module, name)]


def read_info() -> dict:
    """mmdet3d's info (v1.1) of the scene-0061 keyframe: its class names, and in data_list[0] ego2global,
    lidar2ego, per camera cam2img, cam2ego and lidar2cam, and 69 boxes (x, y, z centre, l, w, h, yaw in the LiDAR
    frame) with their num_lidar_pts."""
    with open(INFO, "rb") as f:
        return _NumpyOnly(f).load()


def file_time(name: str) -> int:
    """nuScenes file names end in __<timestamp us>.<ext>."""
    return int(name.rsplit("__", 1)[1].split(".")[0])


def yaw_pose(x, y, z, yaw):
    T = np.eye(4)
    T[:3, :3] = [[np.cos(yaw), -np.sin(yaw), 0], [np.sin(yaw), np.cos(yaw), 0], [0, 0, 1]]
    T[:3, 3] = x, y, z
    return T


def real_tables(*names):
    return {n: json.loads((NUS / "v1.0-mini" / f"{n}.json").read_text()) for n in names}


def keyframe_root(root, info):
    """A complete nuScenes table set (v1.0-mini's own scene, sample, sensor, calibrated_sensor and category
    records; sample_data, ego_pose, instance and sample_annotation made from the pickle) for the scene-0061
    keyframe at ``root``, samples/ a symlink to the sample's. Returns {channel: T_world_vehicle at its time}."""
    real = real_tables("scene", "sample", "sensor", "calibrated_sensor", "category")
    (x,) = info["data_list"]
    (sample,) = [s for s in real["sample"] if s["token"] == x["token"]]
    (scene,) = [s for s in real["scene"] if s["token"] == sample["scene_token"]]
    sensor_of = {s["token"]: s for s in real["sensor"]}
    e2g, l2e = np.array(x["ego2global"]), np.array(x["lidar_points"]["lidar2ego"])
    # channel -> (sensor to ego, world from ego at the datum's time, file): mmdet3d's lidar2cam is the whole chain
    # lidar -> ego -> global -> ego at the camera's time -> camera, so it gives the camera's ego pose
    chans = {"LIDAR_TOP": (l2e, e2g, f"samples/LIDAR_TOP/{x['lidar_points']['lidar_path']}")}
    for c, im in x["images"].items():
        c2e = np.array(im["cam2ego"])
        E = e2g @ l2e @ np.linalg.inv(np.array(im["lidar2cam"], np.float64)) @ invert(c2e)
        U, _, Vt = np.linalg.svd(E[:3, :3])  # lidar2cam is stored in float32
        E[:3, :3] = U @ Vt
        chans[c] = (c2e, E, f"samples/{c}/{im['img_path']}")
    t = {"scene": [scene], "sample": [{**sample, "prev": "", "next": ""}], "sensor": [], "calibrated_sensor": [],
         "sample_data": [], "ego_pose": [], "instance": [], "sample_annotation": [], "category": real["category"]}
    for c, (S, E, rel) in chans.items():
        # the real calibration record of this channel that mmdet3d's matrix came from
        (cal,) = [r for r in real["calibrated_sensor"] if sensor_of[r["sensor_token"]]["channel"] == c
                  and np.abs(np.array(r["translation"]) - S[:3, 3]).max() < 1e-6][:1]
        assert np.abs(quat_to_rotmat(np.array(cal["rotation"])) - S[:3, :3]).max() < 1e-6  # (w, x, y, z)
        t["calibrated_sensor"].append(cal)
        t["sensor"].append(sensor_of[cal["sensor_token"]])
        ts = file_time(rel)
        t["ego_pose"].append(pose_record(E, token=token("ego", c), timestamp=ts))
        size = (1600, 900) if c.startswith("CAM") else (0, 0)
        t["sample_data"].append({"token": token("sd", c), "sample_token": sample["token"],
                                 "ego_pose_token": token("ego", c), "calibrated_sensor_token": cal["token"],
                                 "timestamp": ts, "fileformat": "jpg" if size[0] else "pcd", "is_key_frame": True,
                                 "height": size[1], "width": size[0], "filename": rel, "prev": "", "next": ""})
    cat_token = {c["name"]: c["token"] for c in real["category"]}
    label_name = {v: k for k, v in info["metainfo"]["categories"].items()}
    for j, box in enumerate(x["instances"]):
        cx, cy, cz, length, width, height, yaw = box["bbox_3d"]
        name = MMDET3D_CLASSES[label_name.get(box["bbox_label_3d"])]
        t["instance"].append({"token": token("instance", j), "category_token": cat_token[name],
                              "nbr_annotations": 1, "first_annotation_token": token("ann", j),
                              "last_annotation_token": token("ann", j)})
        t["sample_annotation"].append(pose_record(
            e2g @ l2e @ yaw_pose(cx, cy, cz, yaw), token=token("ann", j), sample_token=sample["token"],
            instance_token=token("instance", j), size=[width, length, height], visibility_token="4",
            attribute_tokens=[], num_lidar_pts=int(box["num_lidar_pts"]), num_radar_pts=0, prev="", next=""))
    (root / "v1.0-mini").mkdir(parents=True)
    for name, rows in t.items():
        (root / "v1.0-mini" / f"{name}.json").write_text(json.dumps(rows))
    (root / "samples").symlink_to(NUS / "samples")
    return {c: E for c, (_, E, _) in chans.items()}


@pytest.fixture(scope="module")
def keyframe(tmp_path_factory):
    if not INFO.is_file():
        pytest.skip(f"nuScenes sample not found at {NUS}")
    info = read_info()
    root = tmp_path_factory.mktemp("nus") / "nuscenes"
    ego = keyframe_root(root, info)
    (out,) = convert(root, root.parent / "logs")
    return validate_log(out), info["data_list"][0], ego, root


# --------------------------------------------------------------------------- the real nuScenes keyframe

@needs_nus
def test_nuscenes_sample_tables_are_refused_naming_the_missing_ones(tmp_path):
    with pytest.raises(LogFormatError, match=r"v1\.0-mini: tables missing: sample_data\.json, ego_pose\.json, "
                                             r"sample_annotation\.json"):
        convert(NUS, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@needs_nus
def test_nuscenes_keyframe_log_contents(keyframe):
    log, x, ego, root = keyframe
    assert log.name == "scene-0061" and log.source == "nuscenes" and log.root.name == "scene-0061"
    assert set(log.cameras) == set(CAMERAS) and set(log.lidars) == {"LIDAR_TOP"} and len(log.frames) == 1
    (f,) = log.frames
    assert f.timestamp_us == 1532402927647951 == f.lidars["LIDAR_TOP"].timestamp_us
    assert len(log.ego_timestamps_us) == 7  # one pose per sample_data
    for c in CAMERAS:
        obs = f.cameras[c]
        assert obs.timestamp_us == file_time(x["images"][c]["img_path"])
        assert (log.root / obs.image).read_bytes() == (NUS / "samples" / c / x["images"][c]["img_path"]).read_bytes()
        assert np.abs(log.T_world_vehicle(obs.timestamp_us) - ego[c]).max() < 1e-9
        cam = log.cameras[c].camera
        K = np.array(x["images"][c]["cam2img"])
        assert (cam.width, cam.height) == (1600, 900) and cam.model == "pinhole"
        assert (cam.fx, cam.fy, cam.cx, cam.cy) == (K[0, 0], K[1, 1], K[0, 2] + 0.5, K[1, 2] + 0.5)
        assert np.abs(log.cameras[c].T_vehicle_camera - np.array(x["images"][c]["cam2ego"])).max() < 1e-6
    raw = np.fromfile(NUS / "samples/LIDAR_TOP" / x["lidar_points"]["lidar_path"], np.float32).reshape(-1, 5)
    sweep = log.sweep(f.lidars["LIDAR_TOP"])
    assert sweep.shape == (34688, 4) and np.array_equal(sweep[:, :3], raw[:, :3])
    assert np.array_equal(sweep[:, 3], raw[:, 3] / np.float32(255)) and sweep[:, 3].max() == 1.0
    assert any("keyframe" in n for n in log.notes) and any("scaled by 1/255" in n for n in log.notes)


@needs_nus
@pytest.mark.parametrize("camera", CAMERAS)
def test_nuscenes_lidar_projects_as_nuscenes_says(keyframe, camera, tmp_path):
    """mmdet3d's lidar2cam (nuScenes' chain lidar -> ego -> global -> ego at the camera's time -> camera) and
    cam2img give the same pixels as the converted log, to 0.01 px, for every point ahead of the camera.

    (tests/format_checks.edge_score cannot tell this keyframe's true projection from shifted ones: a 32-beam sweep
    puts its silhouette points 7 px apart along a ring and 29 px between rings, and in these foliage-rich images a
    projection shifted by 8 to 64 px scores as high or higher, by up to 30 %; the overlays in /tmp/gsim_overlays
    show the points on the kerb stripes, poles, cars and pedestrians.)"""
    log, x, _, _ = keyframe
    (f,) = log.frames
    uv, inside, pc = project(log, f, camera, "LIDAR_TOP")
    pts = log.sweep(f.lidars["LIDAR_TOP"])[:, :3].astype(np.float64)
    T = np.array(x["images"][camera]["lidar2cam"], np.float64)
    h = (np.array(x["images"][camera]["cam2img"]) @ (pts @ T[:3, :3].T + T[:3, 3]).T).T
    uv_nus = h[:, :2] / h[:, 2:]
    ahead = inside & (pc[:, 2] > 1.0)
    assert ahead.sum() > 3000, ahead.sum()
    err = np.abs(uv[ahead] - 0.5 - uv_nus[ahead]).max()
    assert err < 0.01, err
    write_overlay(log.image(f.cameras[camera]), uv[inside], pc[inside, 2], f"nuscenes_{camera}.png", tmp_path)


@needs_nus
def test_nuscenes_box_centres_project_as_mmdet3d_says(keyframe):
    """mmdet3d projected each annotation's centre into the cameras from the global box, the camera's own ego pose
    and its calibration (center_2d, depth): the converted log's boxes and cameras give the same, for all 84."""
    log, x, _, _ = keyframe
    (f,) = log.frames
    n = 0
    for c in CAMERAS:
        obs = f.cameras[c]
        centres = np.array([a.pose_at(obs.timestamp_us)[:3, 3] for a in log.actors])
        uv, _, pc = in_camera(log, obs, centres)
        for inst in x["cam_instances"][c]:
            d = np.hypot(*(uv - 0.5 - inst["center_2d"]).T)
            j = np.argmin(d)
            assert d[j] < 0.01 and abs(pc[j, 2] - inst["depth"]) < 1e-4, (c, d[j], pc[j, 2], inst["depth"])
            n += 1
    assert n == 84


def points_in_boxes(log, frame):
    """(actor, number of the frame's LIDAR_TOP points inside its box at the sweep's time) for every actor."""
    lo = frame.lidars["LIDAR_TOP"]
    world = log.T_world_lidar(lo)
    pts = log.sweep(lo)[:, :3].astype(np.float64)
    out = []
    for a in log.actors:
        T = invert(a.pose_at(lo.timestamp_us)) @ world
        q = pts @ T[:3, :3].T + T[:3, 3]
        out.append((a, int(np.all(np.abs(q) <= np.array(a.size) / 2, axis=1).sum())))
    return out


def count_agreement(log, theirs):
    """(fraction of boxes holding exactly the annotation's num_lidar_pts points, how many differ by more than
    max(2, 10 %): boundary points aside)."""
    ours = np.array([n for _, n in points_in_boxes(log, log.frames[0])])
    return np.mean(ours == theirs), int(np.sum(np.abs(ours - theirs) > np.maximum(2, 0.1 * theirs)))


@needs_nus
def test_nuscenes_boxes_lie_on_the_objects(keyframe, tmp_path):
    """The LiDAR points inside each converted box are the annotation's own num_lidar_pts (nuScenes counts the
    keyframe sweep's points in the box): exact for most, within the boundary's few points for the rest. With width
    and length swapped (the size order read wrong) the same check fails."""
    log, x, _, root = keyframe
    assert len(log.actors) == 69
    anns = {a["instance_token"]: a for a in json.loads((root / "v1.0-mini/sample_annotation.json").read_text())}
    theirs = np.array([anns[a.id]["num_lidar_pts"] for a in log.actors])
    for a in log.actors:
        w, length, h = anns[a.id]["size"]
        assert a.size == (length, w, h) and list(a.timestamps_us) == [log.frames[0].timestamp_us]
    exact, beyond = count_agreement(log, theirs)
    print(f"nuScenes keyframe: {exact:.1%} of 69 boxes hold exactly num_lidar_pts points, {beyond} beyond 2 / 10 %")
    assert exact > 0.85 and beyond == 0
    swapped = tuple(ActorTrack(a.id, a.category, (a.size[1], a.size[0], a.size[2]), a.timestamps_us, a.poses)
                    for a in log.actors)
    exact, beyond = count_agreement(dataclasses.replace(log, actors=swapped), theirs)
    assert exact < 0.8 and beyond > 10, (exact, beyond)
    cats = {a.metadata["class"]: a.category for a in log.actors}
    assert cats["vehicle.car"] == "car" and cats["human.pedestrian.adult"] == "pedestrian"
    assert cats["movable_object.trafficcone"] == "cone" and cats["movable_object.pushable_pullable"] == "other"
    # each box is annotated at the LiDAR's time and the cameras fire up to 45 ms before it: within draw_overlay's
    # margin, so the boxes are drawn (yellow)
    front, back = draw_overlay(log, 0, "CAM_FRONT"), draw_overlay(log, 0, "CAM_BACK")
    assert (front == [255, 230, 0]).all(2).sum() > 2000 and (back == [255, 230, 0]).all(2).sum() > 500
    picture = np.asarray(Image.fromarray(np.vstack([front, back])).resize((800, 900), Image.LANCZOS))
    save_picture(picture, "nuscenes_boxes.png", tmp_path)
    assert (OVERLAYS / "nuscenes_boxes.png").is_file()


@needs_nus
def test_nuscenes_camera_only_keyframes(tmp_path):
    """scene-0103's two keyframes in samples/ have camera images only: the log has what there is."""
    real = real_tables("scene", "sample", "sensor", "calibrated_sensor", "category")
    (scene,) = [s for s in real["scene"] if s["name"] == "scene-0103"]
    samples = sorted((s for s in real["sample"] if s["scene_token"] == scene["token"]),
                     key=lambda s: s["timestamp"])[:2]
    sensor_of = {s["token"]: s for s in real["sensor"]}
    cal = {}
    for r in real["calibrated_sensor"]:  # any calibration of each camera: nothing here checks its values
        cal.setdefault(sensor_of[r["sensor_token"]]["channel"], r)
    t = {"scene": [scene], "sample": samples, "sensor": [sensor_of[cal[c]["sensor_token"]] for c in CAMERAS],
         "calibrated_sensor": [cal[c] for c in CAMERAS], "sample_data": [], "ego_pose": [], "instance": [],
         "sample_annotation": [], "category": real["category"]}
    files = {}
    for c in CAMERAS:
        for p in sorted((NUS / "samples" / c).glob("n008-*")):
            ts = file_time(p.name)
            (s,) = [s for s in samples if abs(s["timestamp"] - ts) < 50_000]
            files[(s["token"], c)] = p
            t["ego_pose"].append(pose_record(yaw_pose(ts * 1e-6 - 1533151603, 0, 0, 0.1), token=token("ego", ts, c),
                                             timestamp=ts))
            t["sample_data"].append({"token": token("sd", ts, c), "sample_token": s["token"], "timestamp": ts,
                                     "ego_pose_token": token("ego", ts, c), "calibrated_sensor_token": cal[c]["token"],
                                     "is_key_frame": True, "fileformat": "jpg", "width": 1600, "height": 900,
                                     "filename": f"samples/{c}/{p.name}", "prev": "", "next": ""})
    assert len(files) == 12
    (tmp_path / "nus/v1.0-mini").mkdir(parents=True)
    for name, rows in t.items():
        (tmp_path / "nus/v1.0-mini" / f"{name}.json").write_text(json.dumps(rows))
    (tmp_path / "nus/samples").symlink_to(NUS / "samples")
    (out,) = convert(tmp_path / "nus", tmp_path / "log", scene="scene-0103")
    log = validate_log(out)
    assert out == tmp_path / "log" and not log.lidars and set(log.cameras) == set(CAMERAS) and not log.actors
    assert [f.timestamp_us for f in log.frames] == [s["timestamp"] for s in samples]
    for s, f in zip(samples, log.frames):
        for c in CAMERAS:
            assert (log.root / f.cameras[c].image).read_bytes() == files[(s["token"], c)].read_bytes()
    assert "no LiDAR sample_data in this scene: a camera-only log" in log.notes


# --------------------------------------------------------------------------- Lyft Level 5 tables

@needs_lyft
def test_lyft_tables_name_the_first_missing_sensor_file(tmp_path):
    with pytest.raises(LogFormatError) as e:
        convert(LYFT, tmp_path / "out")
    msg = str(e.value)
    assert msg.startswith(f"{LYFT}/images/host-a101_cam3_1240710385800000006.jpeg: sensor file missing (")
    assert "sample_data.json[4], CAM_BACK at 1556675185800000 us); 10 of the scene's 10 files" in msg


def lyft_root(root, edit=None):
    """The Lyft tables (symlinked) with stand-in sensor files: flat grey JPEGs and random 5-float32 sweeps.
    ``edit(path, records)`` may change a LiDAR file's records before they are written."""
    root.mkdir()
    (root / "v1.01-train").symlink_to(LYFT / "v1.01-train")
    rng = np.random.default_rng(0)
    for sd in json.loads((LYFT / "v1.01-train/sample_data.json").read_text()):
        p = root / sd["filename"]
        p.parent.mkdir(exist_ok=True)
        if sd["fileformat"] == "jpeg":
            Image.new("RGB", (sd["width"], sd["height"]), (90, 90, 90)).save(p, quality=50)
        else:
            pts = np.column_stack([rng.uniform(-40, 40, (500, 3)), rng.integers(0, 256, 500), rng.integers(0, 40, 500)])
            pts = pts.astype("<f4")
            (edit(p, pts) if edit else pts).tofile(p)
    return root


@needs_lyft
def test_lyft_tables_convert(tmp_path):
    """The Lyft table set read in full: seven cameras (one zoomed), three LiDARs, ego poses at the sample_data's
    own times (Lyft stamps them with the sample's), calibration, and four car boxes with the size order."""
    root = lyft_root(tmp_path / "lyft")
    tables = {n: json.loads((LYFT / f"v1.01-train/{n}.json").read_text())
              for n in ("sample_data", "ego_pose", "calibrated_sensor", "sensor", "sample_annotation")}
    (out,) = convert(root, tmp_path / "logs")
    log = validate_log(out)
    assert log.name == "host-a101-lidar0-1240710366399037786-1240710391298976894"
    assert set(log.cameras) == {"CAM_FRONT", "CAM_FRONT_ZOOMED", "CAM_FRONT_LEFT", "CAM_FRONT_RIGHT", "CAM_BACK",
                                "CAM_BACK_LEFT", "CAM_BACK_RIGHT"}
    assert set(log.lidars) == {"LIDAR_TOP", "LIDAR_FRONT_LEFT", "LIDAR_FRONT_RIGHT"}
    (f,) = log.frames
    assert f.timestamp_us == 1556675185903083 and len(f.cameras) == 7 and len(f.lidars) == 3
    assert list(log.ego_timestamps_us) == [1556675185800000, 1556675185816660, 1556675185833330, 1556675185850000,
                                           1556675185866660, 1556675185883330, 1556675185903083]
    ego = {e["token"]: e for e in tables["ego_pose"]}
    cal = {c["token"]: c for c in tables["calibrated_sensor"]}
    channel = {s["token"]: s["channel"] for s in tables["sensor"]}

    def pose(r):
        T = np.eye(4)
        T[:3, :3], T[:3, 3] = quat_to_rotmat(np.array(r["rotation"])), r["translation"]
        return T
    for sd in tables["sample_data"]:
        c = cal[sd["calibrated_sensor_token"]]
        name = channel[c["sensor_token"]]
        obs = f.cameras.get(name) or f.lidars[name]
        assert obs.timestamp_us == round(sd["timestamp"])
        expected = pose(ego[sd["ego_pose_token"]]) @ pose(c)
        ours = log.T_world_camera(obs) if name in f.cameras else log.T_world_lidar(obs)
        assert np.abs(ours - expected).max() < 1e-9, name
        if name in f.cameras:
            cam, K = log.cameras[name].camera, c["camera_intrinsic"]
            assert (cam.width, cam.height, cam.fx, cam.cx, cam.cy) == (1920, 1080, K[0][0], K[0][2] + 0.5,
                                                                        K[1][2] + 0.5)
        else:
            raw = np.fromfile(root / sd["filename"], "<f4").reshape(-1, 5)
            assert np.array_equal(log.sweep(obs), np.column_stack([raw[:, :3], raw[:, 3] / np.float32(255)]))
    assert any("up to 103.083 ms" in n for n in log.notes)
    assert len(log.actors) == 4 and {a.category for a in log.actors} == {"car"}
    for a in tables["sample_annotation"]:
        (actor,) = [x for x in log.actors if x.id == a["instance_token"]]
        assert actor.size == (a["size"][1], a["size"][0], a["size"][2]) and actor.metadata["class"] == "car"
        assert np.abs(actor.poses[0] - pose(a)).max() < 1e-12 and list(actor.timestamps_us) == [f.timestamp_us]


@needs_lyft
@pytest.mark.parametrize("edit, message", [
    (lambda p, pts: pts.ravel()[:-2] if "lidar1" in p.name else pts,
     r"host-a101_lidar1_1240710385903083166\.bin: 9992 bytes is not a whole number of 5-float32 records"),
    (lambda p, pts: np.where(np.arange(5) == 3, 300, pts).astype("<f4") if "lidar2" in p.name else pts,
     r"host-a101_lidar2_1240710385903083166\.bin: intensity \(4th value\) must be in \[0, 255\], got \[300, 300\]")])
def test_lyft_bad_lidar_files(tmp_path, edit, message):
    root = lyft_root(tmp_path / "lyft", edit)
    with pytest.raises(LogFormatError, match=message):
        convert(root, tmp_path / "out")
    assert nothing_in(tmp_path / "out")


# --------------------------------------------------------------------------- the synthetic street, round trip

@pytest.fixture(scope="module")
def street(tmp_path_factory):
    from gsim.scenes.synth import SynthOptions, synthesize
    root = tmp_path_factory.mktemp("street")
    options = SynthOptions(n_frames=4, width=64, height=48, lidar_beams=16, lidar_azimuth_resolution_deg=2.0)
    log = validate_log(synthesize(root / "synth", seed=0, options=options, progress=False))
    records = write_nuscenes(log, root / "nus")
    return log, root / "nus", records


def test_round_trip_of_the_synthetic_street(street, tmp_path):
    """Written as nuScenes (frames 0 and 2 keyframes, 1 and 3 sweeps) and read back: the same frames, poses
    (1e-6), image bytes, sweeps (the written float32 values exactly) and boxes. nuScenes has no distortion model
    (the distorted side cameras are not written), no per-point times (the writer compensates each sweep to its
    timestamp, as nuScenes does) and boxes at keyframes only."""
    log, root, records = street
    (out,) = convert(root, tmp_path / "logs")
    back = validate_log(out)
    assert out == tmp_path / "logs" / log.name and back.name == log.name
    assert set(back.cameras) == {"front"} and set(back.lidars) == {"top"}
    assert back.cameras["front"].camera == log.cameras["front"].camera
    assert np.abs(back.cameras["front"].T_vehicle_camera - log.cameras["front"].T_vehicle_camera).max() < 1e-12
    assert np.abs(back.lidars["top"].T_vehicle_lidar - log.lidars["top"].T_vehicle_lidar).max() < 1e-12
    assert [f.timestamp_us for f in back.frames] == [f.timestamp_us for f in log.frames]
    for k, (a, b) in enumerate(zip(log.frames, back.frames)):
        assert set(b.cameras) == {"front"} and set(b.lidars) == {"top"}
        ca, cb = a.cameras["front"], b.cameras["front"]
        assert cb.timestamp_us == ca.timestamp_us
        assert (back.root / cb.image).read_bytes() == (log.root / ca.image).read_bytes()
        assert np.abs(back.T_world_camera(cb) - log.T_world_camera(ca)).max() < 1e-6
        la, lb = a.lidars["top"], b.lidars["top"]
        assert np.abs(back.T_world_lidar(lb) - log.T_world_lidar(la)).max() < 1e-6
        written = np.fromfile(root / records[(k, "top")]["filename"], "<f4").reshape(-1, 5)
        sweep = back.sweep(lb)
        assert np.array_equal(sweep[:, :3], written[:, :3])
        assert np.abs(sweep[:, 3] - log.sweep(la)[:, 3]).max() < 1e-7  # 0-255 and back: float32 rounding
        assert np.abs(sweep_in_world(back, lb) - sweep_in_world(log, la)).max() < 1e-4  # float32 of 40 m
    # consecutive sweeps agree on static structure as much as in the original log (a 16-beam 2-degree LiDAR's
    # spacing dominates the median nearest-point distance), where the boxes that mask the moving cars cover both
    # sweeps' times (the keyframes' boxes end at 200 ms)
    for k in range(2):
        a = sweep_agreement(log, log.frames[k].lidars["top"], log.frames[k + 1].lidars["top"])
        b = sweep_agreement(back, back.frames[k].lidars["top"], back.frames[k + 1].lidars["top"])
        assert abs(a - b) < 1e-3, (k, a, b)
    keyframes = [log.frames[0].timestamp_us, log.frames[2].timestamp_us]
    assert {a.id for a in back.actors} == {a.id for a in log.actors} and len(log.actors) > 5
    for a in log.actors:
        (b,) = [x for x in back.actors if x.id == a.id]
        assert b.category == "car" and b.metadata == {"class": "vehicle.car"}
        assert np.allclose(b.size, a.size, rtol=0, atol=1e-12) and list(b.timestamps_us) == keyframes
        for t in keyframes:
            assert np.abs(b.pose_at(t) - a.pose_at(t)).max() < 1e-6
    assert any("the 2 keyframe samples and 2 top sweeps" in n for n in back.notes)


def test_keyframes_only_when_no_sweep_files(street, tmp_path):
    log, root, _ = street
    copy = tmp_path / "nus"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("sweeps"))
    (out,) = convert(copy, tmp_path / "logs")
    back = validate_log(out)
    assert [f.timestamp_us for f in back.frames] == [log.frames[0].timestamp_us, log.frames[2].timestamp_us]
    assert any("keyframes only: none of the scene's 4 sweep files" in n for n in back.notes)
    # one sweep file missing among others present: refused, naming it
    shutil.copytree(root, tmp_path / "one", ignore=shutil.ignore_patterns(f"{token('sd', 3, 'top')}.pcd.bin"))
    with pytest.raises(LogFormatError, match=rf"sweeps/top/{token('sd', 3, 'top')}\.pcd\.bin: sensor file missing "
                                             r"\(.*sample_data\.json\[\d+\], top at 300000 us\); 1 of the scene's 8"):
        convert(tmp_path / "one", tmp_path / "logs2")


def test_lidar_only_tables(street, tmp_path):
    """Tables without camera sample_data (a LiDAR-only download): the log has the LiDAR, sweeps included."""
    log, root, _ = street
    copy = edited(root, tmp_path, "sample_data", lambda rows: rows.__setitem__(
        slice(None), [r for r in rows if r["filename"].split("/")[1] == "top"]))
    (out,) = convert(copy, tmp_path / "logs")
    back = validate_log(out)
    assert not back.cameras and set(back.lidars) == {"top"} and len(back.frames) == 4
    assert "no camera sample_data in this scene: a LiDAR-only log" in back.notes
    assert np.array_equal(back.ego_timestamps_us, [f.timestamp_us for f in log.frames])


def edited(root, tmp_path, table, edit):
    """A copy of the table set at ``root`` (sensor folders symlinked) with ``edit(rows)`` applied to a table."""
    copy = tmp_path / "edited"
    copy.mkdir()
    for p in root.iterdir():
        if p.name != "v1.0-synth":
            (copy / p.name).symlink_to(p)
    shutil.copytree(root / "v1.0-synth", copy / "v1.0-synth")
    path = copy / "v1.0-synth" / f"{table}.json"
    rows = json.loads(path.read_text())
    edit(rows)
    path.write_text(json.dumps(rows))
    return copy


def test_bad_tables(street, tmp_path):
    log, root, _ = street
    (tmp_path / "a").mkdir()
    copy = edited(root, tmp_path / "a", "ego_pose", lambda rows: rows[2].update(rotation=[1.0, 0.2, 0.0, 0.0]))
    with pytest.raises(LogFormatError, match=r"ego_pose\.json\[2\]\.rotation: not a unit quaternion \(w, x, y, z\)"):
        convert(copy, tmp_path / "out")
    (tmp_path / "b").mkdir()
    copy = edited(root, tmp_path / "b", "sample_data", lambda rows: rows[1].update(ego_pose_token="nope"))
    with pytest.raises(LogFormatError, match=r"sample_data\.json\[1\]\.ego_pose_token: 'nope' is not a token of "
                                             r"ego_pose\.json"):
        convert(copy, tmp_path / "out")
    (tmp_path / "c").mkdir()
    copy = edited(root, tmp_path / "c", "calibrated_sensor",
                  lambda rows: rows[0]["camera_intrinsic"][0].__setitem__(1, 0.3))
    with pytest.raises(LogFormatError, match=r"calibrated_sensor\.json\[0\]\.camera_intrinsic: expected "
                                             r"\[\[fx, 0, cx\], \[0, fy, cy\], \[0, 0, 1\]\]"):
        convert(copy, tmp_path / "out")
    (tmp_path / "d").mkdir()
    copy = edited(root, tmp_path / "d", "sample_annotation", lambda rows: rows[0].pop("size"))
    with pytest.raises(LogFormatError, match=r"sample_annotation\.json\[0\]\.size: missing"):
        convert(copy, tmp_path / "out")
    (copy / "v1.0-synth/instance.json").unlink()
    with pytest.raises(LogFormatError, match=r"v1\.0-synth: table missing: instance\.json \(a conversion reads"):
        convert(copy, tmp_path / "out")
    assert nothing_in(tmp_path / "out")


def test_scene_and_version_choice(street, tmp_path):
    log, root, _ = street
    with pytest.raises(InputError, match=r"scene\.json: no scene named 'scene-9999' \(it has 1: synth-street-seed0\)"):
        convert(root, tmp_path / "out", scene="scene-9999")
    (out,) = convert(root, tmp_path / "one", scene=log.name, version="v1.0-synth")
    assert out == tmp_path / "one" and validate_log(out).name == log.name
    with pytest.raises(InputError, match=r"no such table folder \(version 'v1\.0-mini'\)"):
        convert(root, tmp_path / "out", version="v1.0-mini")
    two = tmp_path / "two"
    two.mkdir()
    for p in root.iterdir():
        (two / p.name).symlink_to(p)
    (two / "v1.0-other").symlink_to(root / "v1.0-synth")
    with pytest.raises(InputError, match=r"expected one table folder .* found \['v1\.0-other', 'v1\.0-synth'\]; "
                                         r"name it with --version"):
        convert(two, tmp_path / "out")
    assert convert(two, tmp_path / "v", version="v1.0-other") == [tmp_path / "v" / log.name]


# --------------------------------------------------------------------------- frame grouping

def test_frames_group_sweeps_as_the_keyframes_do():
    """nuScenes' timing: LIDAR_TOP at 20 Hz stamps the end of its spin, each camera at 12 Hz fires when the spin
    passes it (CAM_FRONT 35 ms, CAM_BACK 10 ms before the LiDAR's time), keyframes at 2 Hz. A sweep image joins
    the spin it was taken in; an image far from any spin (a LiDAR gap) makes a frame of its own."""
    from gsim.scenes.formats.nuscenes import _Datum, group_frames

    def datum(channel, t, key, sample="s0"):
        return _Datum(f"{channel}{t}", channel, "lidar" if channel.startswith("LIDAR") else "camera", t, key,
                      sample, None, f"{channel}@{t}")
    lidar = [500_000 + 50_000 * k for k in range(11)]  # keyframes at 500 and 1000 ms
    offsets = {"CAM_FRONT": -35_000, "CAM_BACK": -10_000}
    data = [datum("LIDAR_TOP", t, t in (500_000, 1_000_000), f"s{t}") for t in lidar if t != 850_000]  # a gap
    for c, off in offsets.items():
        for k in (0, 2, 4, 5, 7, 9, 10):  # about 12 Hz: every 5/3 spins
            t = lidar[k] + off
            data.append(datum(c, t, k in (0, 10), f"s{lidar[k]}"))
    frames, notes = group_frames(data, {"s500000": 500_000, "s1000000": 1_000_000})
    by_time = dict(frames)
    assert [t for t, _ in frames][:2] == [500_000, 550_000] and len(frames) == 12
    assert by_time[500_000]["CAM_FRONT"].timestamp_us == 465_000 and set(by_time[550_000]) == {"LIDAR_TOP"}
    assert by_time[600_000]["CAM_FRONT"].timestamp_us == 565_000
    assert by_time[600_000]["CAM_BACK"].timestamp_us == 590_000
    assert set(by_time[815_000]) == {"CAM_FRONT"} and set(by_time[840_000]) == {"CAM_BACK"}  # the spin ending at 850
    assert "the 2 keyframe samples and 8 LIDAR_TOP sweeps" in notes[0] and "CAM_FRONT -35.0 ms" in notes[0]
    assert "2 sweeps with no such frame make frames of their own" in notes[0]


def test_nuscenes_cli(street, tmp_path):
    import subprocess
    import sys
    log, root, _ = street
    r = subprocess.run([sys.executable, "-m", "gsim.cli", "convert", "nuscenes", str(root), str(tmp_path / "log"),
                        "--scene", log.name], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(validate_log(tmp_path / "log").frames) == len(log.frames)
