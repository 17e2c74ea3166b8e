"""KITTI labels and calibration agree with the images written for distorted cameras: a box-shaped actor's 3D box,
projected through the written calibration (read back as a KITTI user would, with an independent implementation
of the distortion models it names), lands on the actor's pixels in the written mask."""
import json

import numpy as np
import pytest

trimesh = pytest.importorskip("trimesh")
pytest.importorskip("yaml")

import gsim  # noqa: E402
from gsim.cameras import FisheyeCamera, OpenCVCamera  # noqa: E402
from gsim.editing import AssetLibrary  # noqa: E402
from gsim.editing.library import Asset, Source, box_frame  # noqa: E402
from gsim.editing.mesh import mesh_to_surfels  # noqa: E402
from gsim.editing.outputs import render_world  # noqa: E402
from gsim.editing.scenario import parse_scenario  # noqa: E402
from gsim.editing.world import apply  # noqa: E402
from gsim.scenes.log import LogWriter  # noqa: E402

W, H = 320, 240
CAMERAS = {"cv": OpenCVCamera(W, H, 160.0, 160.0, 160.0, 120.0, k1=-0.25, k2=0.05, p1=0.002, p2=-0.001),
           "fish": FisheyeCamera(W, H, 110.0, 110.0, 161.0, 119.0, k1=-0.03, k2=0.002)}
T_VEHICLE_CAMERA = np.array([[0.0, 0, 1, 0], [-1, 0, 0, 0], [0, -1, 0, 2.5], [0, 0, 0, 1]])  # forward, 2.5 m up
TIMES = (0, 100_000)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A 2 x 1.6 x 1.4 m box (an asset of surfels on a box mesh's faces) 6 m ahead and 4.5 m to the left, where
    both lenses bend straight lines most, seen by a strongly distorted OpenCV camera and a fisheye; the
    scenario's output folder."""
    root = tmp_path_factory.mktemp("labels")
    with LogWriter(root / "log", name="lens", source="test") as w:
        for c, cam in CAMERAS.items():
            w.add_camera(c, cam, T_VEHICLE_CAMERA)
        for i, t in enumerate(TIMES):
            w.add_ego_pose(t, np.eye(4))
            w.add_frame(t, {c: w.image(c, i, t, np.zeros((H, W, 3), np.uint8)) for c in CAMERAS}, {})
    mesh = trimesh.creation.box(extents=(2.0, 1.6, 1.4))
    surfels, size = box_frame(mesh_to_surfels(mesh, 0.04))
    AssetLibrary(root / "lib").add(Asset("box", "car", size, surfels, Source(kind="mesh", detail="a box")))
    far = gsim.Surfels(np.array([[-50.0, 0, 5]]), np.array([[1.0, 0, 0, 0]]), np.full((1, 2), 0.1), np.ones(1),
                       np.zeros((1, 1, 3)))  # behind the cameras: a background that never shows
    gsim.Scene(background=far).save(root / "scene")
    pose = {"xyz": [6.0, 4.5, 0.0], "yaw_deg": 20.0}
    sc = parse_scenario({"schema_version": 1, "name": "lens", "scene": str(root / "scene"), "log": str(root / "log"),
                         "library": str(root / "lib"), "output": str(root / "out"),
                         "edits": [{"kind": "insert", "asset": "box", "id": "box", "on_ground": False,
                                    "allow_overlap": True, "track": {"poses": [{"t_us": t, **pose} for t in TIMES]}}],
                         "sensors": {"cameras": list(CAMERAS), "video": False}})
    return render_world(apply(sc), sc, progress=False)


def read_calib(path):
    """A KITTI calib file as {key: text}."""
    return dict(line.split(":", 1) for line in path.read_text().splitlines())


def project(calib, pc):
    """Camera-frame points -> KITTI pixels through the written calibration: P2's K after the distortion the file
    names (the OpenCV and fisheye formulas written out here, independently of gsim's camera code)."""
    K = np.array(calib["P2"].split(), float).reshape(3, 4)[:, :3]
    x, y = pc[:, 0] / pc[:, 2], pc[:, 1] / pc[:, 2]
    model = calib.get("camera_model", "pinhole").strip()
    D = np.array(calib.get("D", "").split(), float)
    if model == "opencv":
        k1, k2, p1, p2, k3 = D
        r2 = x * x + y * y
        radial = 1 + k1 * r2 + k2 * r2 ** 2 + k3 * r2 ** 3
        x, y = x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x), y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y
    elif model == "fisheye":
        r = np.hypot(x, y)
        th = np.arctan(r)
        th_d = th * (1 + D[0] * th ** 2 + D[1] * th ** 4 + D[2] * th ** 6 + D[3] * th ** 8)
        x, y = x * th_d / r, y * th_d / r
    else:
        assert model == "pinhole"
    uvw = np.c_[x, y, np.ones_like(x)] @ K.T
    return uvw[:, :2]


def kitti_box(line):
    """The 3D box of a KITTI label line: (8 corners, 12 x 50 points along its edges) in the camera frame."""
    h, w, l, x, y, z, ry = map(float, line.split()[8:15])
    c = np.array([[sx * l / 2, -h * k, sz * w / 2] for sx in (-1, 1) for k in (0, 1) for sz in (-1, 1)])
    R = np.array([[np.cos(ry), 0, np.sin(ry)], [0, 1, 0], [-np.sin(ry), 0, np.cos(ry)]])
    c = c @ R.T + (x, y, z)
    t = np.linspace(0, 1, 50)[:, None]
    edges = np.concatenate([c[i] + t * (c[i | b] - c[i]) for b in (4, 2, 1) for i in range(8) if not i & b])
    return c, edges


@pytest.mark.parametrize("cam", list(CAMERAS))
def test_the_3d_box_through_the_written_calibration_lands_on_the_actors_pixels(written, cam):
    from PIL import Image
    kd = written / "kitti" / cam
    for i in range(len(TIMES)):
        mask = np.asarray(Image.open(written / "masks" / cam / f"{i:06d}.png")) == 1
        v, u = np.nonzero(mask)
        assert len(u) > 300 and u.min() > 0 and v.min() > 0 and u.max() < W - 1 and v.max() < H - 1
        calib = read_calib(kd / "calib" / f"{i:06d}.txt")
        line = (kd / "label_2" / f"{i:06d}.txt").read_text().strip()
        assert line.split()[0] == "Car" and len(line.splitlines()) == 1
        corners, edges = kitti_box(line)
        # every corner (hidden ones too: the box is convex) lands on the actor's pixels; KITTI's pixel (i, j) is
        # centred at (j, i)
        uv = project(calib, corners)
        gap = np.hypot(uv[:, None, 0] - u[None], uv[:, None, 1] - v[None]).min(axis=1)
        assert gap.max() < 1.5, f"{cam} frame {i}: corners {gap.round(1)} px from the actor's pixels"
        # the written 2D box encloses the actor's pixels tightly, and so does the projected box's bound (its edges
        # curve under distortion, so it is the edges' bound, not the corners')
        x1, y1, x2, y2 = map(float, line.split()[4:8])
        assert (x1, y1, x2, y2) == (u.min() - 0.5, v.min() - 0.5, u.max() + 0.5, v.max() + 0.5)
        pe = project(calib, edges)
        bound = np.array([pe[:, 0].min(), pe[:, 1].min(), pe[:, 0].max(), pe[:, 1].max()])
        # (the surfels' overhang past the box and the renderer's screen-space filter widen the mask by up to 2 px)
        assert np.abs(bound - (x1, y1, x2, y2)).max() < 2.5, f"{cam} frame {i}: {bound.round(1)} vs {x1, y1, x2, y2}"
        # inside the image: not truncated, in the KITTI file as in gsim's labels
        labels = json.loads((written / "labels" / cam / f"{i:06d}.json").read_text())
        assert float(line.split()[1]) == 0.0 and labels["objects"][0]["truncated"] == 0.0


def test_calibration_says_the_image_is_distorted_and_keeps_kittis_lines_first(written):
    lines = (written / "kitti" / "cv" / "calib" / "000000.txt").read_text().splitlines()
    assert [x.split(":")[0] for x in lines[:5]] == ["P0", "P1", "P2", "P3", "R0_rect"]
    calib = read_calib(written / "kitti" / "cv" / "calib" / "000000.txt")
    assert calib["camera_model"].strip() == "opencv" and "distorted" in calib["image"]
    assert np.allclose(np.array(calib["D"].split(), float), [-0.25, 0.05, 0.002, -0.001, 0.0])
    # the pinhole part in KITTI's pixel convention (centres at integers): gsim's principal point less 0.5
    assert np.allclose(np.array(calib["P2"].split(), float).reshape(3, 4)[:2, 2], [159.5, 119.5])
