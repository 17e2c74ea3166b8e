"""gsim.editing: the starter library, assets from meshes/PLY/actors, insertion and removal with their
ground truth (masks, depth, occlusion, LiDAR), ground placement, and bad input."""
import json

import numpy as np
import pytest

trimesh = pytest.importorskip("trimesh")
pytest.importorskip("pydantic")

import gsim  # noqa: E402
from gsim.cameras import PinholeCamera  # noqa: E402
from gsim.editing import (AssetLibrary, EditError, asset_from_actor, asset_from_mesh, asset_from_ply,  # noqa: E402
                          insert_actor, remove_actor)
from gsim.editing.library import load_asset  # noqa: E402
from gsim.errors import InputError  # noqa: E402
from gsim.lidar import LidarSpec  # noqa: E402
from gsim.lidar.render import render_lidar  # noqa: E402
from gsim.surfels import rgb_to_sh  # noqa: E402
from gsim.transforms import look_at, rotmat_to_quat  # noqa: E402
from support import plane, pose  # noqa: E402

T0 = 1_000_000
CAM = PinholeCamera(width=160, height=120, fx=120.0, fy=120.0, cx=80.0, cy=60.0)


def wall(x: float) -> gsim.Surfels:
    ys, zs = np.meshgrid(np.arange(-6, 6, 0.1), np.arange(0, 4, 0.1))
    m = ys.size
    q = rotmat_to_quat(np.array([[0.0, 0, 1], [0, 1, 0], [-1, 0, 0]]))  # normal along x
    return gsim.Surfels(np.c_[np.full(m, x), ys.ravel(), zs.ravel()], np.tile(q, (m, 1)), np.full((m, 2), 0.08),
                        np.full(m, 0.99), rgb_to_sh(np.full((m, 1, 3), 0.8)))


CAM_POSE = look_at((0.0, 0.0, 1.6), (10.0, 0.0, 0.8))


@pytest.fixture(scope="module")
def sedan():
    return AssetLibrary.builtin().get("sedan")


def box_corners(T_centre, size):
    l, w, h = size
    c = np.array([[sx * l / 2, sy * w / 2, sz * h / 2] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
    return c @ T_centre[:3, :3].T + T_centre[:3, 3]


def box_mask(T_centre, size) -> np.ndarray:
    """Pixels inside the convex hull of the projected box corners."""
    from scipy.spatial import Delaunay
    pc = (box_corners(T_centre, size) - CAM_POSE[:3, 3]) @ CAM_POSE[:3, :3]
    uv = np.c_[CAM.fx * pc[:, 0] / pc[:, 2] + CAM.cx, CAM.fy * pc[:, 1] / pc[:, 2] + CAM.cy]
    u, v = np.meshgrid(np.arange(CAM.width) + 0.5, np.arange(CAM.height) + 0.5)
    return Delaunay(uv).find_simplex(np.c_[u.ravel(), v.ravel()]).reshape(CAM.height, CAM.width) >= 0


def render(scene):
    return gsim.render_camera(scene, CAM, CAM_POSE, backend="numba", timestamp_us=T0)


def test_starter_library_has_every_class_inside_its_box():
    lib = AssetLibrary.builtin()
    assert {"sedan", "suv", "truck", "bus", "pedestrian", "cyclist", "cone", "barrier"} <= set(lib.ids())
    for i in lib.ids():
        a = lib.get(i)
        l, w, h = a.size
        m = a.surfels.means
        assert np.all(np.abs(m[:, 0]) <= l / 2 + 1e-4) and np.all(np.abs(m[:, 1]) <= w / 2 + 1e-4)
        assert m[:, 2].min() == pytest.approx(0.0, abs=1e-4) and m[:, 2].max() <= h + 1e-4
        assert a.reflectance is not None and len(a.reflectance) == len(a.surfels)
    assert lib.get("bus").size[0] > 10 > lib.get("sedan").size[0] > 3.5 > lib.get("cone").size[0]


def test_inserted_asset_mask_depth_and_occlusion(sedan):
    base = gsim.Scene(background=plane())
    T = pose(10.0, 0.0, yaw=0.4)
    edited = insert_actor(base, sedan, [0, 2 * T0], [T, T], shadow=False)
    assert len(base.actors) == 0 and len(edited.actors) == 1  # the input is untouched
    a = edited.actors[0]
    centre = a.pose_at(T0)
    assert centre[2, 3] == pytest.approx(sedan.size[2] / 2, abs=0.02)  # on the ground, box-centre pose
    f0, f1 = render(base), render(edited)
    changed = np.abs(f1.depth - f0.depth) > 0.05
    boxm = box_mask(centre, a.size)
    iou = (changed & boxm).sum() / (changed | boxm).sum()
    assert iou > 0.7, iou
    grown = box_mask(centre, np.asarray(a.size) + 0.3)  # surfels at the box's faces overhang them a little
    assert (changed & ~grown).sum() < 0.01 * changed.sum()  # nothing outside the box
    # depth within the box's near and far faces
    d_cam = np.linalg.norm(box_corners(centre, a.size) - CAM_POSE[:3, 3], axis=1)
    z = f1.depth[changed]
    assert np.percentile(z, 5) > d_cam.min() * 0.9 - 0.3 and np.percentile(z, 95) < d_cam.max() + 0.1
    # a wall between the camera and the car hides it
    walled = gsim.Scene(background=gsim.Surfels.concatenate([plane(), wall(6.0)]))
    hidden = insert_actor(walled, sedan, [0, 2 * T0], [T, T], shadow=False)
    assert np.abs(render(hidden).rgb - render(walled).rgb).max() < 0.01  # (the wall lets 1% through)


def test_shadow_darkens_the_ground_around_the_asset(sedan):
    base = gsim.Scene(background=plane())
    T = pose(10.0, 0.0)
    with_shadow = render(insert_actor(base, sedan, [0, 2 * T0], [T, T]))
    without = render(insert_actor(base, sedan, [0, 2 * T0], [T, T], shadow=False))
    darker = with_shadow.rgb.mean(-1) < without.rgb.mean(-1) - 0.02
    assert darker.sum() > 30


def test_lidar_sees_the_inserted_asset_inside_its_box(sedan):
    spec = LidarSpec.preset("velodyne-vlp32c")
    base = gsim.Scene(background=plane())
    T = pose(8.0, 2.0, yaw=-0.3)
    edited = insert_actor(base, sedan, [0, 2 * T0], [T, T], shadow=False)
    centre, size = edited.actors[0].pose_at(T0), edited.actors[0].size
    L = pose(0.0, 0.0, z=1.8)
    f = render_lidar(edited, spec, L, timestamp_us=T0, rolling=False)
    pts = f.points @ L[:3, :3].T + L[:3, 3]
    local = (pts - centre[:3, 3]) @ centre[:3, :3]
    above = (pts[:, 2] > 0.1) & (np.hypot(pts[:, 0], pts[:, 1]) < 20)  # off the ground, off the plane's far rim
    inside = np.all(np.abs(local) <= np.asarray(size) / 2 + 0.1, axis=1)
    assert inside.sum() > 100
    assert np.all(inside[above])  # every return above the ground is the car's
    # removed: no return inside the box above the ground, and the camera sees the bare ground again
    removed = remove_actor(edited, edited.actors[0].id)
    g = render_lidar(removed, spec, L, timestamp_us=T0, rolling=False)
    pts = g.points @ L[:3, :3].T + L[:3, 3]
    local = (pts - centre[:3, 3]) @ centre[:3, :3]
    assert not np.any(np.all(np.abs(local) <= np.asarray(size) / 2, axis=1) & (pts[:, 2] > 0.1))
    assert len(g.points) > 0.9 * len(render_lidar(base, spec, L, timestamp_us=T0, rolling=False).points)
    assert np.abs(render(removed).rgb - render(base).rgb).max() < 1e-3


def test_on_ground_follows_a_sloped_ground(sedan):
    slope = 0.1
    base = gsim.Scene(background=plane(slope))
    T = pose(12.0, -1.0, yaw=0.0, z=5.0)  # given 5 m up: on_ground puts it down
    a = insert_actor(base, sedan, [0], [T]).actors[0]
    P = a.track_poses[0]
    n = np.array([-slope, 0, 1]) / np.hypot(slope, 1)
    assert P[:3, 2] @ n == pytest.approx(1.0, abs=1e-3)  # tilted with the ground
    bottom = P[:3, 3] - P[:3, 2] * sedan.size[2] / 2
    assert bottom[2] == pytest.approx(slope * bottom[0], abs=0.03)
    assert P[0, 3] == pytest.approx(12.0, abs=0.2) and P[1, 3] == pytest.approx(-1.0, abs=1e-6)
    with pytest.raises(EditError, match="floats"):
        insert_actor(base, sedan, [0], [T], on_ground=False)


def test_removal_fills_the_never_seen_ground_under_a_parked_actor(sedan):
    hole = (8.0, 12.0, -1.0, 1.0)
    base = gsim.Scene(background=plane(hole=hole))
    parked = insert_actor(gsim.Scene(background=plane()), sedan, [0, 2 * T0], [pose(10.0, 0.0)] * 2, shadow=False)
    scene = gsim.Scene(background=base.background, actors=parked.actors)
    removed = remove_actor(scene, parked.actors[0].id)
    m = removed.background.means
    inside = (m[:, 0] > hole[0] + 0.2) & (m[:, 0] < hole[1] - 0.2) & (np.abs(m[:, 1]) < 0.8)
    assert inside.sum() > 50 and np.abs(m[inside, 2]).max() < 0.02  # the ground continues
    f = render(removed)
    assert (f.alpha > 0.9).mean() > (render(base).alpha > 0.9).mean()  # fewer holes than before


def test_overlapping_placements_and_bad_input_are_refused(sedan, tmp_path):
    base = gsim.Scene(background=plane())
    one = insert_actor(base, sedan, [0, T0], [pose(10, 0)] * 2, actor_id="car_a")
    with pytest.raises(EditError, match=r"'car_b' overlaps actor 'car_a' at t=0 us"):
        insert_actor(one, sedan, [0, T0], [pose(11, 0.5)] * 2, actor_id="car_b")
    insert_actor(one, sedan, [0, T0], [pose(11, 0.5)] * 2, actor_id="car_b", allow_overlap=True)
    insert_actor(one, sedan, [2 * T0, 3 * T0], [pose(11, 0.5)] * 2, actor_id="car_c")  # at other times: fine
    with pytest.raises(EditError, match="already has an actor 'car_a'"):
        insert_actor(one, sedan, [0], [pose(20, 0)], actor_id="car_a")
    with pytest.raises(EditError, match=r"poses \(T,4,4\)"):
        insert_actor(base, sedan, [0, 1], [pose(10, 0)])
    with pytest.raises(EditError, match="no ground"):
        insert_actor(base, sedan, [0], [pose(100, 0)])
    with pytest.raises(EditError, match="no actor 'ghost'"):
        remove_actor(one, "ghost")
    with pytest.raises(KeyError, match="unknown asset 'spaceship'"):
        AssetLibrary.builtin().get("spaceship")
    broken = tmp_path / "broken.obj"
    broken.write_text("v 0 0 0\nv 1 0\nf 1 2 9\n")
    with pytest.raises(ValueError, match="broken.obj"):
        asset_from_mesh(broken, "broken", "car")
    with pytest.raises(FileNotFoundError, match="missing.glb"):
        asset_from_mesh(tmp_path / "missing.glb", "m", "car")


def test_mesh_asset_depth_matches_a_ray_cast_of_the_mesh(tmp_path):
    mesh = trimesh.creation.icosphere(subdivisions=3, radius=0.8)
    mesh = trimesh.util.concatenate([mesh, trimesh.creation.box(extents=(2.0, 1.0, 0.6),
                                                               transform=np.array([[1, 0, 0, 0.5], [0, 1, 0, 0],
                                                                                   [0, 0, 1, -0.5], [0, 0, 0, 1.0]]))])
    mesh.visual.vertex_colors = np.tile([200, 40, 40, 255], (len(mesh.vertices), 1))
    path = tmp_path / "thing.ply"
    mesh.export(path)
    asset = asset_from_mesh(path, "thing", "other", spacing_m=0.03)
    assert np.allclose(asset.size, mesh.extents, atol=0.05)
    rgb = gsim.surfels.sh_to_rgb(asset.surfels.colors[:, 0])
    assert np.allclose(np.median(rgb, 0), np.array([200, 40, 40]) / 255, atol=0.02)
    # the asset in its box frame vs the mesh moved the same way
    lo, hi = mesh.bounds
    mesh.apply_translation((-(lo[0] + hi[0]) / 2, -(lo[1] + hi[1]) / 2, -lo[2]))
    cam = look_at((3.0, 2.0, 1.5), (0.0, 0.0, 0.4))
    # surfels wider than a pixel: smaller ones take their centre's depth (2DGS's low-pass filter wins)
    K = PinholeCamera(width=320, height=240, fx=400.0, fy=400.0, cx=160.0, cy=120.0)
    f = gsim.render_camera(asset.surfels, K, cam, backend="numba")
    u, v = np.meshgrid(np.arange(0, K.width, 2) + 0.5, np.arange(0, K.height, 2) + 0.5)  # every 4th pixel: fast
    d_cam = np.stack([(u.ravel() - K.cx) / K.fx, (v.ravel() - K.cy) / K.fy, np.ones(u.size)], 1)
    dirs = d_cam @ cam[:3, :3].T
    locs, ray_idx, _ = mesh.ray.intersects_location(np.tile(cam[:3, 3], (len(dirs), 1)), dirs, multiple_hits=True)
    truth = np.full(len(dirs), np.inf)
    np.minimum.at(truth, ray_idx, (locs - cam[:3, 3]) @ cam[:3, 2])  # the nearest hit's camera z
    truth[~np.isfinite(truth)] = 0
    hit = truth > 0
    solid = f.alpha[::2, ::2].ravel() > 0.5
    both = hit & solid
    assert both.sum() > 0.95 * hit.sum()
    assert both.sum() / (hit | solid).sum() > 0.85  # the same silhouette, up to the surfels' overhang at edges
    err = np.abs(f.depth[::2, ::2].ravel()[both] - truth[both])
    assert np.median(err) < 0.003 and np.percentile(err, 75) < 0.01  # (the rest: edges, where surfels overhang)


def test_closed_assets_skip_the_surfels_that_face_away(tmp_path):
    """A watertight mesh gives a closed asset: its inserted actor draws only the surfels facing the camera
    (about half fewer tile entries), with the same silhouette and depth; an open mesh gives no culling."""
    from gsim.render.common import resolve_options
    from gsim.render.numba_raster import bin_surfels
    closed = trimesh.creation.icosphere(subdivisions=3, radius=0.8)
    closed.export(tmp_path / "ball.ply")
    opened = trimesh.Trimesh(closed.vertices, closed.faces[closed.face_normals[:, 2] < 0.5])  # a bowl
    opened.export(tmp_path / "bowl.ply")
    ball = asset_from_mesh(tmp_path / "ball.ply", "ball", "other", spacing_m=0.05)
    assert ball.closed and not asset_from_mesh(tmp_path / "bowl.ply", "bowl", "other", spacing_m=0.05).closed
    assert AssetLibrary.builtin().get("cone").closed
    scene = insert_actor(gsim.Scene(background=plane()), ball, [0, 2 * T0], [pose(6.0, 0.0)] * 2)
    assert scene.actors[0].closed
    culled, every = render(scene), gsim.render_camera(scene.at(T0), CAM, CAM_POSE, backend="numba")
    a, b = culled.alpha > 0.5, every.alpha > 0.5
    assert (a & b).sum() / (a | b).sum() > 0.98
    assert np.median(np.abs(culled.depth - every.depth)[a & b]) < 0.005
    entries = lambda parts: len(bin_surfels(parts, CAM, CAM_POSE, resolve_options(None))[2])
    placed = scene.placed(T0)
    n_bg = entries(placed[:1])
    assert entries(placed) - n_bg < 0.65 * (entries([placed[0], placed[1]._replace(closed=False)]) - n_bg)
    scene.save(tmp_path / "s")
    assert gsim.load_scene(tmp_path / "s").actors[0].closed


def test_library_directory_round_trip_and_manifest_errors(tmp_path, sedan):
    lib = AssetLibrary(tmp_path / "lib")
    assert lib.ids() == []
    folder = lib.add(sedan)
    assert (folder / "thumbnail.png").is_file() and lib.ids() == ["sedan"]
    back = lib.get("sedan")
    assert back.category == "car" and np.allclose(back.size, sedan.size)
    assert np.array_equal(back.surfels.means, sedan.surfels.means)
    assert np.array_equal(back.reflectance, sedan.reflectance)
    with pytest.raises(FileExistsError):
        lib.add(sedan)
    m = json.loads((folder / "asset.json").read_text())
    m["category"] = "spaceship"
    (folder / "asset.json").write_text(json.dumps(m))
    with pytest.raises(gsim.SceneFormatError, match=r"asset.json: category: Input should be"):
        load_asset(folder)
    m["category"] = "car"
    for size in ("[4.6, Infinity, 1.4]", "[4.6, NaN, 1.4]", "[4.6, -Infinity, 1.4]", "[4.6, 1e999, 1.4]"):
        (folder / "asset.json").write_text(json.dumps({**m, "size": "@"}).replace('"@"', size))
        with pytest.raises(gsim.SceneFormatError, match=r"asset.json: size.1: Input should be a finite number"):
            load_asset(folder)
    from dataclasses import replace
    with pytest.raises(InputError, match=r"asset 'sedan': size.2: Input should be a finite number"):
        replace(sedan, size=(4.6, 1.8, float("inf")))
    with pytest.raises(PermissionError):
        AssetLibrary.builtin().add(sedan)


def test_assets_from_a_ply_and_from_a_scene_actor(tmp_path, sedan):
    from gsim.ply import save_ply
    save_ply(sedan.surfels, tmp_path / "car.ply")
    a = asset_from_ply(tmp_path / "car.ply", "car_from_ply", "car")
    assert np.allclose(a.size, sedan.size, atol=1e-3) and len(a.surfels) == len(sedan.surfels)
    scene = insert_actor(gsim.Scene(background=plane()), sedan, [0, T0], [pose(5, 0, 0.3)] * 2, actor_id="red",
                         shadow=False, harmonized=False)
    scene.save(tmp_path / "scene")
    b = asset_from_actor(tmp_path / "scene", "red", "red_car")
    assert b.id == "red_car" and b.category == "car" and b.source.kind == "actor"
    srt = lambda m: m[np.lexsort(np.round(m, 3).T)]  # insertion shuffles the surfels (a level of detail)
    assert np.allclose(srt(b.surfels.means), srt(sedan.surfels.means), atol=1e-3)  # back in the asset's frame
    with pytest.raises(KeyError, match="no actor 'blue'"):
        asset_from_actor(tmp_path / "scene", "blue")


def test_library_cli(tmp_path, capsys):
    from gsim.cli import main
    assert main(["library", "list"]) == 0
    out = capsys.readouterr().out
    assert "built-in library: 8 assets" in out and "pedestrian" in out
    assert main(["library", "show", "cone"]) == 0
    assert json.loads(capsys.readouterr().out)["category"] == "cone"
    assert main(["library", "render", "cone", str(tmp_path / "cone.png"), "--frames", "1"]) == 0
    from PIL import Image
    im = np.asarray(Image.open(tmp_path / "cone.png"))
    assert im.shape == (240, 320, 3) and (im[..., 0].astype(int) - im[..., 2] > 100).sum() > 500  # orange
    mesh = trimesh.creation.box(extents=(0.5, 0.5, 1.0))
    mesh.export(tmp_path / "post.obj")
    lib = tmp_path / "lib"
    assert main(["library", "add-mesh", str(tmp_path / "post.obj"), str(lib), "--id", "post",
                 "--category", "sign", "--spacing-m", "0.05"]) == 0
    assert (lib / "post" / "asset.json").is_file() and (lib / "post" / "thumbnail.png").is_file()
    assert main(["library", "list", str(lib)]) == 0 and "post" in capsys.readouterr().out
    (tmp_path / "bad.obj").write_text("this is not a mesh\n")
    assert main(["library", "add-mesh", str(tmp_path / "bad.obj"), str(lib), "--id", "bad", "--category", "sign"]) == 2
    err = capsys.readouterr().err
    assert "bad.obj" in err and not (lib / "bad").exists()
    assert main(["library", "show", "nothing"]) == 2
    assert "unknown asset 'nothing'" in capsys.readouterr().err


def test_contact_shadow_is_rendered_by_cameras_only_and_saved(tmp_path, sedan):
    base = gsim.Scene(background=plane())
    scene = insert_actor(base, sedan, [0, 2 * T0], [pose(8.0, 2.0)] * 2)
    a = scene.actors[0]
    assert 0 < a.shadow_surfels < len(a.surfels) and len(a.body) == len(a.surfels) - a.shadow_surfels
    scene.save(tmp_path / "s")
    assert gsim.load_scene(tmp_path / "s").actors[0].shadow_surfels == a.shadow_surfels
    # the LiDAR sees the same with and without the shadow
    no_shadow = insert_actor(base, sedan, [0, 2 * T0], [pose(8.0, 2.0)] * 2, shadow=False)
    spec = LidarSpec.preset("velodyne-vlp16")
    L = pose(0.0, 0.0, z=1.8)
    f1 = render_lidar(scene, spec, L, timestamp_us=T0, rolling=False)
    f2 = render_lidar(no_shadow, spec, L, timestamp_us=T0, rolling=False)
    assert np.array_equal(f1.range_image, f2.range_image)


def test_inserted_asset_gets_lidar_features_that_decode_to_its_reflectance(sedan):
    from gsim.lidar.heads import FEATURES, HIDDEN, INPUTS, LidarHead
    # a head whose intensity is sigmoid(feature 0 - 2), whatever the incidence and range; no ray drop
    w1 = np.zeros((INPUTS, HIDDEN))
    w1[0, 0] = 1.0
    w2 = np.zeros((HIDDEN, 2))
    w2[0, 0] = 1.0
    head = LidarHead(w1, np.zeros(HIDDEN), w2, np.array([-2.0, -10.0]))
    ground = plane()
    f = np.zeros((len(ground), FEATURES), np.float32)
    f[:, 0] = np.random.default_rng(0).uniform(0, 4, len(ground))  # intensities 0.12 .. 0.88
    base = gsim.Scene(background=gsim.Surfels(ground.means, ground.quats, ground.scales, ground.opacities,
                                              ground.colors, f), lidar_head=head)
    edited = insert_actor(base, sedan, [0, 2 * T0], [pose(8.0, 0.0)] * 2, shadow=False)
    a = edited.actors[0]
    assert a.surfels.features is not None
    decoded = 1 / (1 + np.exp(-(a.surfels.features[:, 0] - 2)))
    # each surfel decodes to its reflectance, as far as the scene's own surfels reach (0.12 .. 0.88)
    # (insertion shuffles the surfels: compare the sorted values)
    assert np.abs(np.sort(decoded) - np.sort(np.clip(sedan.reflectance, 0.12, 0.88))).max() < 0.02
    L = pose(0.0, 0.0, z=1.8)
    sweep = render_lidar(edited, LidarSpec.preset("velodyne-vlp32c"), L, timestamp_us=T0, rolling=False)
    pts = sweep.points @ L[:3, :3].T + L[:3, 3]
    on_car = (pts[:, 2] > 0.2) & (np.linalg.norm(pts[:, :2] - (8.0, 0.0), axis=1) < 3)
    assert on_car.sum() > 50
    assert 0.1 < np.median(sweep.intensity[on_car]) < 0.35  # paint 0.25, glass and tyres lower


def test_move_actor_shifts_retimes_and_reroutes(sedan):
    from gsim.editing import move_actor
    base = gsim.Scene(background=plane(0.05))
    ts = np.array([0, T0, 2 * T0])
    scene = insert_actor(base, sedan, ts, [pose(5.0 * k, 0.0) for k in range(3)], actor_id="car")
    a = scene.actors[0]
    before = a.track_poses.copy()
    moved = move_actor(scene, "car", shift_m=(0.0, 1.5, 0.0), speed_scale=2.0).actors[0]
    assert np.array_equal(moved.track_timestamps_us, ts // 2)  # twice as fast
    assert np.allclose(moved.track_poses[:, :3, 3] - a.track_poses[:, :3, 3], a.track_poses[:, :3, 1] * 1.5)
    assert np.array_equal(scene.actors[0].track_poses, before)  # the input is untouched
    path = move_actor(scene, "car", track=(ts, [pose(-10.0 + 5 * k, -3.0, yaw=0.0, z=9.0) for k in range(3)]))
    P = path.actors[0].track_poses[1]
    bottom = P[:3, 3] - P[:3, 2] * sedan.size[2] / 2
    assert bottom[2] == pytest.approx(0.05 * bottom[0], abs=0.03) and P[1, 3] == pytest.approx(-3.0)
    two = insert_actor(scene, sedan, ts, [pose(5.0 * k, 4.0) for k in range(3)], actor_id="other")
    with pytest.raises(EditError, match="'car' overlaps actor 'other'"):
        move_actor(two, "car", shift_m=(0.0, 3.5, 0.0))
    with pytest.raises(EditError, match="no actor 'bus'"):
        move_actor(two, "bus")


def test_far_inserted_actors_draw_fewer_surfels_and_stay_as_faithful(sedan, tmp_path):
    """Level of detail: a far inserted car draws a uniform subsample of its surfels, grown to cover the same
    surface; against a 4x4-supersampled render of every surfel (what the pixels should show) it is no worse
    than drawing all of them (sub-pixel surfels are what the screen-space filter blurs)."""
    base = gsim.Scene(background=plane(extent=80.0, spacing=0.5))
    big = PinholeCamera(width=CAM.width * 4, height=CAM.height * 4, fx=CAM.fx * 4, fy=CAM.fy * 4, cx=CAM.cx * 4,
                        cy=CAM.cy * 4)
    for x in (25.0, 40.0):
        scene = insert_actor(base, sedan, [0, 2 * T0], [pose(x, 0.0)] * 2)
        a = scene.actors[0]
        assert a.lod_spacing_m == pytest.approx(0.05, rel=0.2)  # the starter sedan's sampling
        assert len(a.detail(a.pose_at(T0), CAM_POSE[:3, 3], CAM.fx)) < 0.2 * len(a.surfels)
        assert a.detail(a.pose_at(T0), CAM_POSE[:3, 3], CAM.fx) is a.detail(a.pose_at(T0), CAM_POSE[:3, 3] + 0.01,
                                                                            CAM.fx)  # a cached level
        ref = gsim.render_camera(scene.at(T0), big, CAM_POSE, backend="numba").rgb
        ref = ref.reshape(CAM.height, 4, CAM.width, 4, 3).mean((1, 3))
        lod = render(scene).rgb  # render_camera passes the camera: the level of detail
        full = gsim.render_camera(scene.at(T0), CAM, CAM_POSE, backend="numba").rgb  # every surfel
        box = box_mask(a.pose_at(T0), np.asarray(a.size) + 0.3)
        err = lambda im: ((im - ref)[box] ** 2).mean()
        assert err(lod) <= 1.1 * err(full)
    near = a.detail(a.pose_at(T0), a.pose_at(T0)[:3, 3] - (6.0, 0, 0), CAM.fx)
    assert len(near) == len(a.surfels)  # close up: every surfel
    scene.save(tmp_path / "s")
    assert gsim.load_scene(tmp_path / "s").actors[0].lod_spacing_m == pytest.approx(a.lod_spacing_m)
