"""Off-path error split against the synthetic street's exact geometry: which points are inside solids, which
shifted views a vehicle could have, which surfaces a training camera saw, and the per-class error table."""
import dataclasses

import numpy as np
import pytest

from gsim.scenes import synth
from gsim.scenes.evaluation.error_split import Coverage, Split
from gsim.scenes.evaluation.lane_shift import drivable
from gsim.scenes.evaluation.render_path import offset_pose
from gsim.scenes.log import load_log
from gsim.scenes.reconstruction.views import split_frames
from gsim.scenes.synth import SynthOptions, synthesize

SMALL = SynthOptions(n_frames=9, width=48, height=32, supersample=1, lidar_beams=8, lidar_azimuth_resolution_deg=2.0)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("split") / "log", seed=3, options=SMALL, progress=False)


def test_occupied_knows_buildings_cars_and_free_road():
    st = synth.build_street(3)
    b = st.buildings[0]
    inside_building = [(b["x0"] + b["x1"]) / 2, (b["y0"] + b["y1"]) / 2, 1.0]
    car = st.car_poses([0])[0, 5, :3, 3]  # a parked car's box centre
    lane = [10.0, -synth.LANE_WIDTH / 2, 1.0]
    above = [10.0, -synth.LANE_WIDTH / 2, 200.0]
    got = st.occupied(np.array([inside_building, car, lane, above]), 0)
    assert got.tolist() == [True, True, False, False]
    moving = st.car_poses([0, 1_000_000])[:, 0, :3, 3]  # the lead car moves: free where it was a second later
    assert st.occupied(moving[:1], 0)[0] and not st.occupied(moving[:1], 1_000_000)[0]


def test_drivable_refuses_an_ego_inside_a_parked_car(log_dir):
    log = load_log(log_dir)
    st = synth.build_street(3, SMALL)
    cam = log.cameras["front"].camera
    t = log.frames[0].timestamp_us
    T_v = log.T_world_vehicle(t)
    hits = synth.camera_hits(st, cam, offset_pose(log, "front", t), t)
    assert drivable(st, T_v, t, hits)
    # put the ego onto the nearest parked car on its right: its box overlaps the car's
    right = [i for i, c in enumerate(st.cars) if c["speed"] == 0 and c["y"] < 0]
    a = min(right, key=lambda i: abs(st.cars[i]["x"] - T_v[0, 3] - 1.3))
    moved = T_v.copy()
    moved[:2, 3] = st.cars[a]["x"] - 1.3, st.cars[a]["y"]
    assert not drivable(st, moved, t, hits)


def test_coverage_sees_training_views_and_not_what_lies_behind_the_start(log_dir):
    log = load_log(log_dir)
    st = synth.build_street(3, SMALL)
    train, held = split_frames(log, 8)
    cov = Coverage.of(log, st, train)
    cam = log.cameras["front"].camera
    obs = train[2].cameras["front"]
    own = synth.camera_hits(st, cam, log.T_world_camera(obs), obs.timestamp_us)
    surface = own.prim >= 0
    ratio = cov.coarseness(own, cam, log.T_world_camera(obs), obs.timestamp_us)
    assert np.isfinite(ratio[surface]).mean() > 0.99 and not np.isfinite(ratio[~surface]).any()
    # a training view itself: no coarser than its own pixels (a later, nearer frame sees much of it sharper)
    assert np.quantile(ratio[surface], 0.99) <= 1.0 + 1e-6 and np.median(ratio[surface]) < 1.0
    back = log.T_world_camera(log.frames[0].cameras["front"]).copy()
    back[:3, :3] = back[:3, :3] @ np.diag([-1.0, 1.0, -1.0])  # turned around at the start: the street behind
    t0 = log.frames[0].timestamp_us
    behind = synth.camera_hits(st, cam, back, t0)
    assert np.isfinite(cov.coarseness(behind, cam, back, t0)[behind.prim >= 0]).mean() < 0.2
    # the same points seen with twice the focal length: its pixels half the side, the training views' twice as
    # coarse
    near = dataclasses.replace(cam, fx=2 * cam.fx, fy=2 * cam.fy)
    r2 = cov.coarseness(own, near, log.T_world_camera(obs), obs.timestamp_us)
    np.testing.assert_allclose(r2[surface], 2 * ratio[surface])


@pytest.fixture(scope="module")
def view(log_dir):
    """(truth image, exact hits, sky mask, exact depth, alpha, coarseness) of frame 1's front camera, as an exact
    render."""
    log = load_log(log_dir)
    st = synth.build_street(3, SMALL)
    cam = log.cameras["front"].camera
    obs = log.frames[1].cameras["front"]
    hits = synth.camera_hits(st, cam, log.T_world_camera(obs), obs.timestamp_us)
    truth = log.image(obs).astype(np.float64)
    sky = (hits.prim < 0).reshape(cam.height, cam.width)
    depth = np.where(sky, 0.0, hits.t.reshape(sky.shape))
    return truth, hits, sky, depth, (~sky).astype(np.float32), np.ones(len(hits.prim))


def test_split_puts_each_error_in_its_class(view):
    truth, hits, sky, depth, alpha, seen = view
    exact = Split()
    exact.add(truth, alpha, depth, truth, hits, seen)
    s = exact.summary()
    assert s["depth_absrel"] < 1e-6 and s["depth_within_5pct"] == 1.0
    assert s["geometry"]["right"]["pixel_share"] == 1.0
    shares = [s["regions"][k]["pixel_share"] for k in ("sky", "far", "road", "near")]
    assert abs(sum(shares) - 1) < 1e-9 and min(shares) > 0  # the street has all four
    assert s["regions"]["sky"]["pixel_share"] == pytest.approx(sky.mean())
    # the road rendered 10% too deep and grey: its error is "wrong depth" and "road", nothing else's
    road = ((hits.material == synth.GROUND) & (hits.t < 40)).reshape(sky.shape)
    bad = Split()
    rgb = np.where(road[..., None], 0.5, truth)
    bad.add(rgb, alpha, np.where(road, depth * 1.1, depth), truth, hits, seen)
    b = bad.summary()
    assert b["regions"]["road"]["error_share"] == pytest.approx(1.0)
    assert b["geometry"]["wrong"]["error_share"] == pytest.approx(1.0)
    assert b["geometry"]["wrong"]["pixel_share"] == pytest.approx(road.mean())
    assert b["depth_within_5pct"] == pytest.approx(1 - road.sum() / (~sky).sum())
    # the sky covered by an opaque surfel is wrong geometry; the same pixels unseen are "unseen"
    cover = Split()
    cover.add(truth, np.ones_like(alpha), depth, truth, hits, seen)
    assert cover.summary()["geometry"]["wrong"]["pixel_share"] == pytest.approx(sky.mean())
    blind = Split()
    blind.add(truth, alpha, depth, truth, hits, np.full_like(seen, np.inf))
    assert blind.summary()["geometry"]["unseen"]["pixel_share"] == pytest.approx(1 - sky.mean())
    # what the training views saw only at 3x the view's footprint is "coarse", and nothing else
    blur = Split()
    blur.add(truth, alpha, depth, truth, hits, np.where(road.reshape(-1), 3.0, 1.0))
    assert blur.summary()["detail"]["coarse"]["pixel_share"] == pytest.approx(road.mean())


def test_details_find_the_lane_markings_and_the_edges(view):
    truth, hits, sky, depth, alpha, seen = view
    painted = (hits.material == synth.GROUND) & synth.lane_marking(hits.local[:, 0], hits.local[:, 1])
    assert painted.any() and np.allclose(truth.reshape(-1, 3)[painted].mean(0), [0.86, 0.86, 0.82], atol=0.15)
    def error_shares(changed):
        rgb = truth.copy().reshape(-1, 3)
        rgb[changed.reshape(-1)] = 0.26
        split = Split()
        split.add(rgb.reshape(truth.shape), alpha, depth, truth, hits, seen)
        return split.summary()["detail"]

    from scipy.ndimage import maximum_filter, minimum_filter
    # the markings painted over with asphalt: all the error is the markings' (they and their neighbours)
    d = error_shares(painted)
    assert d["marking"]["error_share"] == pytest.approx(1.0) and d["marking"]["pixel_share"] > painted.mean()
    # a surface against the sky (a roofline, a crown) is an edge; the open road (all its neighbours the ground) is not
    rooftops = ~sky & maximum_filter(sky, 3)
    prim = hits.prim.reshape(sky.shape)
    open_road = (maximum_filter(prim, 3) == 0) & (minimum_filter(prim, 3) == 0)
    assert rooftops.any() and open_road.any()
    assert error_shares(rooftops)["edge"]["error_share"] == pytest.approx(1.0)
    assert error_shares(open_road)["edge"]["error_share"] == 0.0
