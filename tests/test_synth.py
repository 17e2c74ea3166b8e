"""scenes/synth.py: the synthetic street's "exact ground truth", checked the way a user relies on it.

One tiny log is synthesized per module. Its depth maps, LiDAR sweeps, ego poses and actor tracks are
read back with the log loader and compared with the analytic street (``build_street(...).raycast``)
and with an independent numpy signed distance to each primitive, so a wrong pose, a wrong camera
model, a wrong time offset or a wrong intersection in the numba kernel shows up as an error in metres.
"""
import contextlib
import dataclasses
import json
import re

import numba
import numpy as np
import pytest

from gsim.cameras import OpenCVCamera, PinholeCamera
from gsim.scenes.log import load_log
from gsim.scenes.synth import (BOX, CAR_BODY, CAR_CABIN, CYLINDER, FRAME_PERIOD_US, GROUND, PLANE, SIDEWALK, SPHERE,
                               SynthOptions, build_street, synthesize)
from gsim.scenes.reconstruction.views import sweep_world

SEED = 0
TINY = SynthOptions(n_frames=3, width=64, height=40, supersample=1, lidar_beams=16,
                    lidar_azimuth_resolution_deg=1.0)


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("synth") / "log", seed=SEED, options=TINY, progress=False)


@pytest.fixture(scope="module")
def log(synth_dir):
    return load_log(synth_dir)


@pytest.fixture(scope="module")
def street():
    return build_street(SEED, TINY)


# --------------------------------------------------------------------------- helpers

def _box_sdf(q, lo, hi):
    """Signed distance of points (N,3) to an axis-aligned box."""
    d = np.abs(q - (lo + hi) / 2) - (hi - lo) / 2
    return np.linalg.norm(np.maximum(d, 0), axis=1) + np.minimum(d.max(1), 0)


def surface_distance(st, prim, p, t_us):
    """|signed distance| of world points p (N,3) to the primitive ids ``prim`` (N,) of the street at the
    times t_us (N,): plain numpy, independent of the numba ray caster."""
    n_static = len(st.kinds)
    t_us = np.broadcast_to(np.asarray(t_us, np.int64), (len(p),))
    out = np.full(len(p), np.inf)
    for k in np.unique(prim[prim >= 0]):  # misses (-1) stay at inf
        sel = prim == k
        q = p[sel]
        if k < n_static:
            kind, par = st.kinds[k], st.params[k]
            if kind == PLANE:
                d = q[:, 2]
            elif kind == BOX:
                d = _box_sdf(q, par[:3], par[3:6])
            elif kind == CYLINDER:
                dr = np.hypot(q[:, 0] - par[0], q[:, 1] - par[1]) - par[2]
                dz = np.abs(q[:, 2] - (par[3] + par[4]) / 2) - (par[4] - par[3]) / 2
                d = np.minimum(np.maximum(dr, dz), 0) + np.hypot(np.maximum(dr, 0), np.maximum(dz, 0))
            else:
                assert kind == SPHERE
                d = np.linalg.norm(q - par[:3], axis=1) - par[3]
        else:
            j = k - n_static
            T = st.car_poses(t_us[sel])[:, j // 2]  # T_world_actor at each point's time
            local = np.einsum("nji,nj->ni", T[:, :3, :3], q - T[:, :3, 3])
            d = _box_sdf(local, st.car_parts[j, :3], st.car_parts[j, 3:])
        out[sel] = np.abs(d)
    return out


def pixel_centres(cam):
    jj, ii = np.meshgrid(np.arange(cam.width), np.arange(cam.height))
    return np.stack([jj.ravel() + 0.5, ii.ravel() + 0.5], 1), ii.ravel(), jj.ravel()


def cast_pixels(st, log, obs):
    """Every pixel centre of a camera observation cast into the analytic street: (hits, world dirs,
    camera-frame rays, T_world_camera)."""
    cam = log.cameras[obs.sensor].camera
    T = log.T_world_camera(obs)
    rays, ok = cam.unproject(pixel_centres(cam)[0])
    assert ok.all()
    dirs = rays @ T[:3, :3].T  # camera z = 1, so the ray parameter t is the depth
    return st.raycast(T[:3, 3], dirs, obs.timestamp_us), dirs, rays, T


@contextlib.contextmanager
def one_numba_thread():
    """Many tiny parallel kernel calls are slow on a loaded machine (thread hand-offs): run them on one."""
    n = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(n)


def recast_sweep(st, origins, world, times):
    """Re-cast every LiDAR point from its sensor origin (at its own time) through the point: hits with
    t in units of the stored range (t = 1: the street has a surface exactly there)."""
    t = np.full(len(world), np.nan)
    prim, mat = np.full(len(world), -1), np.full(len(world), -1)
    with one_numba_thread():
        for tu in np.unique(times):
            sel = np.nonzero(times == tu)[0]
            o = origins[sel[0]]
            assert np.allclose(origins[sel], o)  # one sensor position per column
            h = st.raycast(o, world[sel] - o, int(tu))
            t[sel], prim[sel], mat[sel] = h.t, h.prim, h.material
    return t, prim, mat


@pytest.fixture(scope="module")
def sweeps(street, log):
    """Per frame: (obs, sweep_world's points, origins, intensity, times, and the re-cast t, prim, material)."""
    out = []
    for frame in log.frames:
        obs = frame.lidars["top"]
        world, origins, intensity, times = sweep_world(log, obs)
        out.append((obs, world, origins, intensity, times) + recast_sweep(street, origins, world, times))
    return out


# --------------------------------------------------------------------------- determinism

def test_same_seed_same_bytes(synth_dir, tmp_path):
    """Same seed and options -> byte-identical manifest, images, depth maps and sweeps."""
    again = synthesize(tmp_path / "again", seed=SEED, options=TINY, progress=False)
    files = sorted(p.relative_to(synth_dir) for p in synth_dir.rglob("*") if p.is_file())
    assert len(files) == 1 + 3 * 3 * 2 + 3  # manifest, 3 frames x 3 cameras x (image, depth), 3 sweeps
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for rel in files:
        assert (synth_dir / rel).read_bytes() == (again / rel).read_bytes(), rel


def test_other_seed_other_street(synth_dir, tmp_path):
    """A different seed -> a different street, different images and a different manifest."""
    a, b = build_street(SEED, TINY), build_street(SEED + 1, TINY)
    assert a.ego != b.ego
    assert a.params.shape != b.params.shape or not np.allclose(a.params, b.params)
    other = synthesize(tmp_path / "other", seed=SEED + 1, options=TINY, progress=False)
    for rel in ("log.json", "cameras/front/000001.png", "depth/front_left/000001.npy", "lidars/top/000001.npy"):
        assert (synth_dir / rel).read_bytes() != (other / rel).read_bytes(), rel


def test_options_recorded_in_notes(log):
    """The log's notes carry the options as JSON that round-trips through SynthOptions.from_dict."""
    line = [n for n in log.notes if n.startswith("options: ")]
    assert len(line) == 1
    assert SynthOptions.from_dict(json.loads(line[0][len("options: "):])) == TINY


def test_longer_drive_extends_same_street():
    """build_street with more frames keeps every primitive and car within the shorter street's x range."""
    short, long_ = build_street(SEED, TINY), build_street(SEED, dataclasses.replace(TINY, n_frames=40))
    assert short.ego == long_.ego
    x_end = short.params[short.kinds == BOX, 3].max() - 30.0  # well inside the short street

    def near(st):
        mat = st.materials[:len(st.kinds)]  # the sidewalks run the street's whole length: not compared
        prims = st.params[(st.kinds != PLANE) & (mat != SIDEWALK) & (st.params[:, 0] < x_end)]
        cars = np.sort(st.cars[st.cars["x"] < x_end], order=("y", "x"))
        return prims, cars

    (p_short, c_short), (p_long, c_long) = near(short), near(long_)
    for side in (1, -1):  # each side draws from its own generators
        ps, pl = p_short[np.sign(p_short[:, 1]) == side], p_long[np.sign(p_long[:, 1]) == side]
        cs, cl = c_short[np.sign(c_short["y"]) == side], c_long[np.sign(c_long["y"]) == side]
        assert len(ps) == len(pl) and len(cs) == len(cl), f"side {side}: counts differ"
        np.testing.assert_allclose(ps, pl, err_msg=f"side {side}")
        np.testing.assert_allclose(cs.view(np.float64), cl.view(np.float64), err_msg=f"side {side}")


# --------------------------------------------------------------------------- cameras

def test_depth_maps_match_analytic_raycast(street, log):
    """Every pixel's stored depth (camera z) equals the analytic ray cast through its centre; 0 = sky."""
    n_hit = n_sky = 0
    for frame, obs in log.camera_observations():
        hits, _, _, _ = cast_pixels(street, log, obs)
        depth = log.depth(obs).ravel()
        hit = hits.prim >= 0
        np.testing.assert_array_equal(depth == 0, ~hit, err_msg=f"{obs.image}: sky pixels differ")
        np.testing.assert_allclose(depth[hit], hits.t[hit], rtol=2e-6, err_msg=obs.image)
        n_hit, n_sky = n_hit + hit.sum(), n_sky + (~hit).sum()
    assert n_hit > 1000 and n_sky > 100  # both cases really occur


def test_depth_back_projects_onto_surfaces(street, log):
    """Pixel rays scaled by the stored depth, placed with the log's T_world_camera, lie on the surface of
    the primitive the ray hits (numpy signed distance, not the ray caster); ground pixels have z = 0."""
    materials_seen = set()
    n_ground = 0
    for frame, obs in log.camera_observations():
        hits, _, rays, T = cast_pixels(street, log, obs)
        depth = log.depth(obs).ravel().astype(np.float64)
        hit = hits.prim >= 0
        world = (rays[hit] * depth[hit, None]) @ T[:3, :3].T + T[:3, 3]
        dist = surface_distance(street, hits.prim[hit], world, obs.timestamp_us)
        assert dist.max() < 1e-4 + 1e-6 * depth[hit].max(), obs.image
        ground = hits.material[hit] == GROUND
        assert np.abs(world[ground, 2]).max() < 1e-4, obs.image
        # and the ray-plane intersection done by hand gives the same depth
        o, d = T[:3, 3], rays[hit][ground] @ T[:3, :3].T
        np.testing.assert_allclose(depth[hit][ground], -o[2] / d[:, 2], rtol=1e-6)
        n_ground += ground.sum()
        materials_seen |= set(hits.material[hit].tolist())
    assert n_ground > 500
    assert {GROUND, CAR_BODY}.issubset(materials_seen) and len(materials_seen) >= 4


def test_side_cameras_are_distorted_and_consistent(street, log):
    """Side cameras are OpenCV with k1 != 0: a point hit through a pixel's (distorted) ray projects back
    to that pixel's centre and its camera z is the stored depth there; a pinhole model would miss."""
    frame = log.frames[1]
    assert isinstance(log.cameras["front"].camera, PinholeCamera)
    for name in ("front_left", "front_right"):
        cam = log.cameras[name].camera
        assert isinstance(cam, OpenCVCamera) and cam.k1 != 0
        obs = frame.cameras[name]
        hits, dirs, _, T = cast_pixels(street, log, obs)
        hit = np.nonzero(hits.prim >= 0)[0]
        world = T[:3, 3] + dirs[hit] * hits.t[hit, None]
        Tcw = np.linalg.inv(T)
        pc = world @ Tcw[:3, :3].T + Tcw[:3, 3]
        uv, ok = cam.project(pc)
        centres = pixel_centres(cam)[0]
        assert ok.all()
        assert np.abs(uv - centres[hit]).max() < 0.5
        u, v = uv[:, 0].astype(int), uv[:, 1].astype(int)
        np.testing.assert_allclose(log.depth(obs)[v, u], pc[:, 2], rtol=2e-6)
        # the distortion matters at this size: ignoring it moves corner points by more than a pixel
        uv_pin, _ = PinholeCamera(cam.width, cam.height, cam.fx, cam.fy, cam.cx, cam.cy).project(pc)
        assert np.abs(uv_pin - centres[hit]).max() > 1.0


def test_sky_pixels_are_sky_coloured(log):
    """Where the depth map says sky (0), the image is the blue sky gradient (blue above red)."""
    obs = log.frames[0].cameras["front"]
    rgb, depth = log.image(obs), log.depth(obs)
    sky = depth == 0
    assert sky[0].sum() > 10 and not sky[-1].any()  # sky in the top row between buildings, road at the bottom
    assert (rgb[sky][:, 2] > rgb[sky][:, 0] + 0.05).all()


# --------------------------------------------------------------------------- LiDAR

def test_lidar_points_lie_on_the_street(street, log, sweeps):
    """Every LiDAR point, placed with the ego pose at its own time (sweep_world), lies on an analytic
    surface: a re-cast from the sensor origin at that time hits at the stored range (1e-3 relative),
    on the surface of the primitive it hits; ranges are within the beam model's [min, max]."""
    beams = log.lidars["top"].beams
    n = 0
    for obs, world, origins, intensity, times, t, prim, _ in sweeps:
        rng = np.linalg.norm(log.sweep(obs)[:, :3].astype(np.float64), axis=1)
        assert len(rng) > 1000
        assert rng.min() >= beams.min_range_m - 1e-4 and rng.max() <= beams.max_range_m + 1e-4
        assert ((intensity >= 0) & (intensity <= 1)).all() and intensity.max() > 0.1
        assert (prim >= 0).all()
        np.testing.assert_allclose(t, 1.0, atol=1e-3, err_msg=f"{obs.points}: re-cast range differs")
        dist = surface_distance(street, prim, world, times)
        assert dist.max() < 2e-4, f"{obs.points}: a point is {dist.max():.2e} m off its surface"
        n += len(rng)
    assert n > 5000


def test_lidar_beam_model_and_time_offsets(log):
    """Points lie on the beam table's elevations and at column-centre azimuths; each column's time offset
    is column * period / columns, in [0, 100000) us, increasing counter-clockwise from -180 deg."""
    beams = log.lidars["top"].beams
    assert len(beams.elevations_deg) == TINY.lidar_beams
    np.testing.assert_allclose(beams.elevations_deg, np.linspace(-25, 12, TINY.lidar_beams))
    assert beams.azimuth_resolution_deg == TINY.lidar_azimuth_resolution_deg
    n_az = round(360 / beams.azimuth_resolution_deg)
    table = np.asarray(beams.elevations_deg)
    for frame in log.frames:
        pts = log.sweep(frame.lidars["top"]).astype(np.float64)
        assert pts.shape[1] == 5
        el = np.degrees(np.arcsin(pts[:, 2] / np.linalg.norm(pts[:, :3], axis=1)))
        beam = np.abs(el[:, None] - table).argmin(1)
        assert np.abs(el - table[beam]).max() < 1e-3
        az = np.degrees(np.arctan2(pts[:, 1], pts[:, 0]))
        col = np.floor((az + 180) / beams.azimuth_resolution_deg).astype(int) % n_az
        centre = -180 + (col + 0.5) * beams.azimuth_resolution_deg
        assert np.abs(az - centre).max() < 1e-3
        assert len(np.unique(col * len(table) + beam)) == len(pts)  # one return per beam and column
        offsets = pts[:, 4]
        assert (offsets == np.round(offsets)).all()
        assert offsets.min() >= 0 and offsets.max() < FRAME_PERIOD_US
        np.testing.assert_array_equal(offsets, col * FRAME_PERIOD_US // n_az)
        assert (np.diff(offsets[np.argsort(az, kind="stable")]) >= 0).all()
        assert offsets.max() > 0.9 * FRAME_PERIOD_US  # the sweep really spans the frame period


def test_rolling_sweep_moves_with_the_ego(street, log):
    """Placing a point with its own time instead of the sweep start moves it by about speed x offset
    along x (up to the weave's lateral motion and yaw change): the sweep is really rolling."""
    ego = street.ego
    assert ego.speed_mps > 1
    w = 2 * np.pi / ego.weave_period_s
    lateral_speed, yaw_rate = ego.weave_m * w, ego.weave_m * w ** 2 / ego.speed_mps  # upper bounds
    T_vl = log.lidars["top"].T_vehicle_lidar
    n_tight = 0
    for frame in log.frames:
        obs = frame.lidars["top"]
        pts = log.sweep(obs)[:, :3].astype(np.float64)
        world, _, _, times = sweep_world(log, obs)
        T0 = log.T_world_lidar(obs)
        start = pts @ T0[:3, :3].T + T0[:3, 3]
        dt = (times - obs.timestamp_us) * 1e-6
        lever = np.linalg.norm((pts @ T_vl[:3, :3].T + T_vl[:3, 3])[:, :2], axis=1)  # vehicle-frame xy radius
        bound = lateral_speed * dt + yaw_rate * dt * lever + 1e-3
        err = np.linalg.norm(world - start - np.outer(ego.speed_mps * dt, [1.0, 0.0, 0.0]), axis=1)
        assert (err <= bound).all(), f"frame {frame.index}: worst excess {np.max(err - bound):.3f} m"
        n_tight += np.count_nonzero(bound < 0.5 * ego.speed_mps * dt)  # points a static sweep would fail
    assert n_tight > 100


def test_ego_poses_interpolate_to_the_route(street, log):
    """The log's ego poses, interpolated at off-sample times, are within 0.1 mm of the analytic route."""
    times = np.arange(0, log.ego_timestamps_us[-1], 1234)
    exact = street.ego.poses(times)
    got = np.stack([log.T_world_vehicle(t) for t in times])
    assert np.abs(got[:, :3, 3] - exact[:, :3, 3]).max() < 1e-4
    assert np.abs(got[:, :3, :3] - exact[:, :3, :3]).max() < 1e-5
    assert log.ego_timestamps_us[-1] == TINY.n_frames * FRAME_PERIOD_US  # covers the last sweep


# --------------------------------------------------------------------------- actors

def test_actor_tracks_equal_car_poses(street, log):
    """Each car is a tracked actor whose poses equal street.car_poses at the track times and in between."""
    assert tuple(a.id for a in log.actors) == street.car_ids
    assert sum(a.id.startswith("moving_") for a in log.actors) >= 2
    for k, a in enumerate(log.actors):
        assert a.category == "car"
        c = street.cars[k]
        np.testing.assert_allclose(a.size, (c["length"], c["width"], c["height"]))
        np.testing.assert_array_equal(a.timestamps_us, np.arange(TINY.n_frames + 1) * FRAME_PERIOD_US)
        np.testing.assert_allclose(a.poses, street.car_poses(a.timestamps_us)[:, k], atol=1e-9)
        for t in (12_345, 150_000, 299_999):  # constant velocity: interpolation is exact
            np.testing.assert_allclose(a.pose_at(t), street.car_poses([t])[0, k], atol=1e-9)


def test_lidar_hits_on_cars_lie_in_their_boxes(street, log, sweeps):
    """LiDAR points that hit a car (moving ones included) lie inside its box (size) and on the surface of
    the part hit, in the frame of the log's actor track at the point's own time."""
    n_static = len(street.kinds)
    actors = {a.id: a for a in log.actors}
    n_moving_hits = 0
    for obs, world, origins, _, times, _, prim, mat in sweeps:
        on_car = np.nonzero((mat == CAR_BODY) | (mat == CAR_CABIN))[0]
        assert len(on_car) > 0
        for i in on_car:
            car = (prim[i] - n_static) // 2
            track = actors[street.car_ids[car]]
            local = np.linalg.solve(track.pose_at(times[i]), np.append(world[i], 1.0))[:3]
            half = np.asarray(track.size) / 2
            assert (np.abs(local) <= half + 1e-3).all(), (track.id, local, half)
            # on the surface of the part that was hit
            part = street.car_parts[prim[i] - n_static]
            assert abs(_box_sdf(local[None], part[:3], part[3:])[0]) < 1e-3
            if street.cars[car]["speed"] > 0:
                n_moving_hits += 1
    assert n_moving_hits > 10


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs, field", [
    ({"supersample": 2}, "supersample"),
    ({"width": 0}, "width"),
    ({"height": 8}, "height"),
    ({"n_frames": 0}, "n_frames"),
    ({"lidar_beams": 0}, "lidar_beams"),
    ({"lidar_azimuth_resolution_deg": 0.7}, "lidar_azimuth_resolution_deg"),
    ({"lidar_max_range_m": float("inf")}, "lidar_max_range_m"),
    ({"lidar_max_range_m": 0.5}, "lidar_max_range_m"),
])
def test_bad_options_name_the_field(kwargs, field):
    """Invalid SynthOptions raise ValueError naming the field."""
    with pytest.raises(ValueError, match=re.escape(f"SynthOptions.{field}:")):
        SynthOptions(**{**dataclasses.asdict(TINY), **kwargs})


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0"])
def test_bad_seed(seed):
    """build_street rejects a seed that is not a non-negative integer, naming it."""
    with pytest.raises(ValueError, match="seed"):
        build_street(seed, TINY)


def test_bad_options_object_and_dict(tmp_path):
    """synthesize rejects a non-SynthOptions; from_dict rejects a wrong schema or unknown fields."""
    with pytest.raises(ValueError, match="options"):
        synthesize(tmp_path / "x", 0, {"n_frames": 1}, progress=False)
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="schema_version"):
        SynthOptions.from_dict({**TINY.to_dict(), "schema_version": 99})
    with pytest.raises(ValueError, match="bogus"):
        SynthOptions.from_dict({**TINY.to_dict(), "bogus": 1})
    assert SynthOptions.from_dict(TINY.to_dict()) == TINY


def test_omitted_car_leaves_the_rest_of_the_street_unchanged():
    """SynthOptions.omit: ground truth for scene edits (the street without one car)."""
    full = build_street(SEED, TINY)
    gone = full.car_ids[-1]
    without = build_street(SEED, dataclasses.replace(TINY, omit=(gone,)))
    assert gone not in without.car_ids and len(without.car_ids) == len(full.car_ids) - 1
    assert np.array_equal(without.params, full.params) and np.array_equal(without.cars, full.cars[:-1])
    assert SynthOptions.from_dict(dataclasses.replace(TINY, omit=(gone,)).to_dict()).omit == (gone,)
    assert "omit" not in TINY.to_dict()  # logs written before the option still match their options
    with pytest.raises(ValueError, match=r"SynthOptions.omit: no cars \['nobody'\]"):
        build_street(SEED, dataclasses.replace(TINY, omit=("nobody",)))


def test_reuse_or_synthesize_keeps_the_seeds_log_and_replaces_another(tmp_path):
    from gsim.scenes.synth import SynthOptions, made_by, reuse_or_synthesize
    tiny = SynthOptions(n_frames=2, width=32, height=20, supersample=1, lidar_beams=4, lidar_azimuth_resolution_deg=4.0)
    path, reused = reuse_or_synthesize(tmp_path / "log", 1, tiny, progress=False)
    assert not reused and made_by(load_log(path), 1, tiny)
    assert reuse_or_synthesize(tmp_path / "log", 1, tiny, progress=False) == (path, True)
    path, reused = reuse_or_synthesize(tmp_path / "log", 2, tiny, progress=False)
    assert not reused and made_by(load_log(path), 2, tiny)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "mine.txt").write_text("a user's file")
    with pytest.raises(FileExistsError, match="no log.json"):  # a folder that is not a log is never replaced
        reuse_or_synthesize(tmp_path / "junk", 1, tiny, progress=False)
    assert (tmp_path / "junk" / "mine.txt").read_text() == "a user's file"
