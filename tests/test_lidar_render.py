"""Ray-surfel LiDAR rendering: analytic walls, ground rings, compositing, backend parity, bad input."""
import numpy as np
import pytest

import gsim
from gsim.lidar import LidarSpec
from gsim.lidar.render import render_lidar

VLP16 = LidarSpec.preset("velodyne-vlp16")
FACING_MINUS_X = [np.cos(np.pi / 4), 0.0, np.sin(np.pi / 4), 0.0]  # local z (the normal) along world x


def wall(x: float, half_width: float, spacing: float, opacity: float) -> gsim.Surfels:
    """Overlapping surfels tiling the plane x = const over |y| <= half_width, |z| <= 5 m."""
    ys, zs = np.meshgrid(np.arange(-half_width, half_width + 1e-9, spacing), np.arange(-5, 5 + 1e-9, spacing))
    n = ys.size
    return gsim.Surfels(np.stack([np.full(n, x), ys.ravel(), zs.ravel()], 1), np.tile(FACING_MINUS_X, (n, 1)),
                        np.full((n, 2), 1.2 * spacing), np.full(n, opacity), np.full((n, 3), 0.5))


def azimuth_elevation(points):
    return (np.degrees(np.arctan2(points[:, 1], points[:, 0])),
            np.degrees(np.arctan2(points[:, 2], np.hypot(points[:, 0], points[:, 1]))))


@pytest.fixture(scope="module")
def wall_frames():
    s = wall(10.0, 20.0, 0.25, 0.99)
    return {b: render_lidar(s, VLP16, np.eye(4), backend=b) for b in ("numba", "torch")}


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_opaque_wall_returns_exact_ranges(wall_frames, backend):
    f = wall_frames[backend]
    az, el = azimuth_elevation(f.points)
    front = np.abs(az) < 30
    assert front.sum() > 16 * 250  # every laser, most columns of the front 60 degrees
    analytic = 10.0 / (np.cos(np.radians(el)) * np.cos(np.radians(az)))
    assert np.abs(f.ranges[front] - analytic[front]).max() < 1e-4  # sub-millimetre
    assert np.allclose(el, np.asarray(VLP16.elevations_deg)[f.ring], atol=1e-4)  # the beam table
    # nothing behind the sensor; the range image agrees with the points
    assert np.all(f.points[:, 0] > 0)
    assert np.array_equal(f.range_image[f.ring, f.column], f.ranges)
    assert np.count_nonzero(f.range_image) == len(f.ranges)
    assert np.array_equal(f.time_offset_us, VLP16.time_offsets_us()[f.ring, f.column])
    assert f.range_image.shape == (16, VLP16.columns) and f.intensity is None
    assert np.allclose(f.normals[front], [-1, 0, 0], atol=1e-5)  # facing the sensor


def test_flat_ground_gives_rings_at_the_preset_elevations():
    """A 80 m x 80 m ground 1.8 m below the sensor: full rings at exactly the downward lasers' elevations
    that meet it (-3 deg at 34 m and below); the -1 deg laser would meet it at 103 m and returns nothing."""
    xs, ys = np.meshgrid(np.arange(-40, 40.01, 0.5), np.arange(-40, 40.01, 0.5))
    n = xs.size
    g = gsim.Surfels(np.stack([xs.ravel(), ys.ravel(), np.full(n, -1.8)], 1), np.tile([1.0, 0, 0, 0], (n, 1)),
                     np.full((n, 2), 0.6), np.full(n, 0.99), np.full((n, 3), 0.3))
    f = render_lidar(g, VLP16, np.eye(4), backend="numba")
    _, el = azimuth_elevation(f.points)
    table = np.asarray(VLP16.elevations_deg)
    assert np.abs(el - table[f.ring]).max() < 1e-3
    assert set(np.round(table[np.unique(f.ring)]).astype(int)) == set(range(-15, -2, 2))
    for ring in np.unique(f.ring):  # each ring is a circle of radius 1.8 / tan(-elevation), all the way round
        r = np.hypot(*f.points[f.ring == ring, :2].T)
        assert (f.ring == ring).sum() == VLP16.columns
        # exact from 5 deg incidence on; at 3 deg (34 m) the beam's 10 cm cone covers 2 m of ground, the
        # 2DGS object-space filter wins for surfels whose centres lie almost on the ray, and the first return
        # comes from the near end: up to 6% short (known limit)
        rtol = 1e-5 if table[ring] <= -5 else 0.06
        assert np.allclose(r, 1.8 / np.tan(np.radians(-table[ring])), rtol=rtol)


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_semi_transparent_surfel_splits_the_expected_range(backend):
    """A 50% surfel at x = 5 before an opaque one at x = 10: range = (w1 z1 + w2 z2) / (w1 + w2) along the
    ray (times its length per unit z), with w1 = a1, w2 = (1 - a1) a2 and a = opacity * Gaussian."""
    sigma = 40.0
    s = gsim.Surfels(np.array([[5.0, 0, 0], [10.0, 0, 0]]), np.array([FACING_MINUS_X] * 2),
                     np.full((2, 2), sigma), np.array([0.5, 0.99]), np.full((2, 3), 0.5))
    f = render_lidar(s, VLP16, np.eye(4), backend=backend)
    az, el = azimuth_elevation(f.points)
    sel = np.abs(az) < 20
    assert sel.sum() > 16 * 150
    d = VLP16.ray_directions()[f.ring[sel], f.column[sel]]
    a = []
    for x, op in ((5.0, 0.5), (10.0, 0.99)):
        hit = d * (x / d[:, :1])  # where the ray meets the plane x
        a.append(op * np.exp(-0.5 * (hit[:, 1] ** 2 + hit[:, 2] ** 2) / sigma ** 2))
    w1, w2 = a[0], (1 - a[0]) * a[1]
    expected = (w1 * 5.0 + w2 * 10.0) / (w1 + w2) / d[:, 0]
    assert np.allclose(f.expected_range_image[f.ring[sel], f.column[sel]], expected, rtol=1e-4)
    assert np.allclose(f.alpha_image[f.ring[sel], f.column[sel]], w1 + w2, atol=1e-4)
    assert expected.min() > 6.5 and expected.max() < 8.5  # really in between the two surfaces


def test_numba_matches_the_torch_reference_on_random_surfels():
    rng = np.random.default_rng(0)
    n = 400
    q = rng.normal(size=(n, 4))
    s = gsim.Surfels(np.c_[rng.uniform(-15, 15, (n, 2)), rng.uniform(-2, 2, n)] + [0, 0, 0],
                     q / np.linalg.norm(q, axis=1, keepdims=True), rng.uniform(0.3, 1.5, (n, 2)),
                     rng.uniform(0.3, 0.99, n), rng.uniform(0, 1, (n, 3)))
    a, b = (render_lidar(s, VLP16, np.eye(4), backend=k) for k in ("numba", "torch"))
    both = (a.range_image > 0) & (b.range_image > 0)
    assert both.sum() > 1000
    assert np.mean((a.range_image > 0) != (b.range_image > 0)) < 0.005
    assert np.mean(np.abs(a.range_image[both] - b.range_image[both]) > 1e-3) < 0.005
    # float32 (numba) against float64 (torch): a ray whose surfel sits on the 1/255 cut may differ
    assert np.mean(np.abs(a.alpha_image - b.alpha_image) > 1e-3) < 1e-3


def test_scene_at_a_time_and_bad_input():
    s = wall(10.0, 5.0, 0.5, 0.99)
    scene = gsim.Scene(background=s)
    f = render_lidar(scene, VLP16, np.eye(4), timestamp_us=0)
    assert len(f.points) > 0
    with pytest.raises(ValueError, match="LidarSpec"):
        render_lidar(s, "velodyne-vlp16", np.eye(4))
    with pytest.raises(ValueError, match="hit_alpha"):
        render_lidar(s, VLP16, np.eye(4), hit_alpha=1.0)
    with pytest.raises(ValueError, match="backend"):
        render_lidar(s, VLP16, np.eye(4), backend="gsplat")
    with pytest.raises(ValueError, match="T_world_lidar"):
        render_lidar(s, VLP16, np.full((4, 4), np.nan))
    with pytest.raises(TypeError, match="Scene or Surfels"):
        render_lidar(np.zeros((3, 3)), VLP16, np.eye(4))


def translation(x: float, y: float = 0.0, yaw: float = 0.0) -> np.ndarray:
    T = np.eye(4)
    T[:2, :2] = [[np.cos(yaw), -np.sin(yaw)], [np.sin(yaw), np.cos(yaw)]]
    T[:2, 3] = x, y
    return T


def front_ranges(f, x_at):
    """(measured, analytic) ranges of the front rays (|azimuth| < 30 deg) against a wall facing the sensor
    whose distance at time t (s from the sweep start) is x_at(t)."""
    az, el = azimuth_elevation(f.points)
    front = np.abs(az) < 30
    t = VLP16.time_offsets_us()[0, f.column[front]] / 1e6  # the column's firing time (its first laser)
    analytic = x_at(t) / (np.cos(np.radians(el[front])) * np.cos(np.radians(az[front])))
    return f.ranges[front], analytic


def test_rolling_sweep_at_20_m_s_matches_the_analytic_skew():
    """Driving at 20 m/s towards a wall 20 m ahead: a column fired t s into the sweep sees it 20 - 20 t m
    ahead, in its own sensor frame; the 100 ms sweep closes 2 m. rolling=False holds the start pose."""
    s = wall(20.0, 40.0, 0.25, 0.99)
    trajectory = (np.array([0, 100_000]), np.stack([translation(0.0), translation(2.0)]))
    rolled = render_lidar(s, VLP16, trajectory, timestamp_us=0)
    measured, analytic = front_ranges(rolled, lambda t: 20.0 - 20.0 * t)
    assert len(measured) > 16 * 250
    assert np.abs(measured - analytic).max() < 1e-3
    assert analytic.max() - analytic.min() > 0.3  # the front 60 degrees alone span 17 ms: 0.33 m of skew
    held = render_lidar(s, VLP16, trajectory, timestamp_us=0, rolling=False)
    measured, analytic = front_ranges(held, lambda t: 20.0 + 0 * t)
    assert np.abs(measured - analytic).max() < 1e-3
    with pytest.raises(ValueError, match="timestamp_us"):
        render_lidar(s, VLP16, trajectory)


def test_rolling_sweep_moves_actors_per_column():
    """A wall actor driving away at 10 m/s from 10 m ahead, the sensor still: 10 + 10 t m, per column."""
    wall_box = wall(0.0, 20.0, 0.25, 0.99)
    actor = gsim.Actor(id="wall", category="wall", size=(0.1, 40.0, 10.0), surfels=wall_box,
                       track_timestamps_us=np.array([0, 200_000]),
                       track_poses=np.stack([translation(10.0), translation(12.0)]))
    scene = gsim.Scene(background=wall(60.0, 1.0, 0.5, 0.99), actors=(actor,))
    measured, analytic = front_ranges(render_lidar(scene, VLP16, np.eye(4), timestamp_us=0),
                                      lambda t: 10.0 + 10.0 * t)
    assert len(measured) > 16 * 250 and np.abs(measured - analytic).max() < 1e-3
    measured, analytic = front_ranges(render_lidar(scene, VLP16, np.eye(4), timestamp_us=50_000, rolling=False),
                                      lambda t: 10.5 + 0 * t)
    assert np.abs(measured - analytic).max() < 1e-3
    # the same surfels on a new track (a closed loop moves its actors every step): the new track is used,
    # and the surfels' geometry is not rebuilt
    from dataclasses import replace
    from gsim.lidar.groups import surfel_groups
    moved = replace(scene, actors=(replace(actor, track_timestamps_us=np.array([0]),
                                           track_poses=translation(15.0)[None]),))
    measured, analytic = front_ranges(render_lidar(moved, VLP16, np.eye(4), timestamp_us=0), lambda t: 15.0 + 0 * t)
    assert np.abs(measured - analytic).max() < 1e-3
    assert surfel_groups(moved).rec is surfel_groups(scene).rec


def test_numba_matches_torch_with_actors_and_a_turning_moving_sensor():
    rng = np.random.default_rng(1)

    def cloud(n, spread):
        q = rng.normal(size=(n, 4))
        return gsim.Surfels(np.c_[rng.uniform(-spread, spread, (n, 2)), rng.uniform(-2, 2, n)],
                            q / np.linalg.norm(q, axis=1, keepdims=True), rng.uniform(0.2, 1.0, (n, 2)),
                            rng.uniform(0.3, 0.99, n), rng.uniform(0, 1, (n, 3)))

    actor = gsim.Actor(id="car", category="car", size=(4.0, 2.0, 1.5), surfels=cloud(60, 2.0),
                       track_timestamps_us=np.array([0, 100_000]),
                       track_poses=np.stack([translation(6.0, 3.0, 0.0), translation(7.5, 3.0, 0.3)]))
    scene = gsim.Scene(background=cloud(300, 15.0), actors=(actor,))
    trajectory = (np.array([0, 100_000]), np.stack([translation(0.0), translation(1.5, 0.2, 0.2)]))
    a, b = (render_lidar(scene, VLP16, trajectory, backend=k, timestamp_us=0) for k in ("numba", "torch"))
    both = (a.range_image > 0) & (b.range_image > 0)
    assert both.sum() > 1000
    assert np.mean((a.range_image > 0) != (b.range_image > 0)) < 0.005
    assert np.mean(np.abs(a.range_image[both] - b.range_image[both]) > 1e-3) < 0.005
    assert np.mean(np.abs(a.alpha_image - b.alpha_image) > 1e-3) < 1e-3
    # the actor is really seen (rays that hit only because the car is there)
    bg_only = render_lidar(gsim.Scene(background=scene.background), VLP16, trajectory, timestamp_us=0)
    assert np.sum((a.range_image > 0) & (np.abs(a.range_image - bg_only.range_image) > 0.1)) > 100


@pytest.mark.parametrize("still", [True, False])
def test_sweep_kernel_matches_the_ray_kernel(still):
    """lidar.sweep (a spinning sweep as strips of columns) against lidar.kernel (any rays) on the same rays and
    surfels (with features, a parked actor): a preset with per-laser azimuth offsets and unsorted elevations
    held still; a counter-clockwise sensor starting at 37 deg, turning and driving."""
    from dataclasses import replace

    from gsim.lidar import render as R
    rng = np.random.default_rng(2)

    def cloud(n, spread):
        q = rng.normal(size=(n, 4))
        return gsim.Surfels(np.c_[rng.uniform(-spread, spread, (n, 2)), rng.uniform(-3, 3, n)],
                            q / np.linalg.norm(q, axis=1, keepdims=True), rng.uniform(0.05, 0.8, (n, 2)),
                            rng.uniform(0.3, 0.99, n), rng.uniform(0, 1, (n, 3)), rng.uniform(-1, 1, (n, 4)))

    actor = gsim.Actor(id="car", category="car", size=(4.0, 2.0, 1.5), surfels=cloud(300, 2.0),
                       track_timestamps_us=np.array([0]), track_poses=translation(6.0, 3.0, 0.4)[None])
    scene = gsim.Scene(background=cloud(3000, 20.0), actors=(actor,))
    if still:
        spec, pose = replace(LidarSpec.preset("velodyne-hdl64e"), azimuth_resolution_deg=0.5), translation(1.0, 0.5)
    else:
        spec = replace(VLP16, spin="ccw", start_azimuth_deg=37.0)
        pose = (np.array([0, 100_000]), np.stack([translation(0.0), translation(1.5, 0.2, 0.2)]))
    lay = R.sweep_layout(spec)
    t = lay.column_us
    sensor = R.sensor_poses(pose, 0, t, True)
    dirs = np.einsum("cij,lcj->lci", sensor[:, :3, :3], lay.directions).reshape(-1, 3)
    groups = R.surfel_groups(scene)
    a = R.trace_sweep(groups, lay, sensor, t, 0.5)
    b = R.trace(groups, sensor, t, dirs, np.tile(np.arange(len(t)), lay.directions.shape[0]), 0.5)
    assert np.mean(a["alpha"] > 0.5) > 0.3
    differ = lambda k, tol: np.mean(np.abs(a[k] - b[k]) > tol)
    if still:  # the same surfels in the same order: float32 sums in another order at most
        assert all(differ(k, 1e-4) == 0 for k in ("alpha", "median", "features", "normal"))
        assert differ("range_sum", 1e-3) == 0
    else:  # strips and bundles sort from different references: surfels whose distances nearly tie may swap
        assert differ("alpha", 1e-3) < 1e-3
        assert all(differ(k, 1e-2) < 0.01 for k in ("median", "range_sum", "features", "normal"))

def test_strip_order_is_a_stable_sort_by_distance():
    """The strips' radix sort: the order of a stable sort by distance, ties (frequent in float32) in the
    given order, over the whole float range a sweep meets."""
    from gsim.lidar.sweep import _front_to_back
    rng = np.random.default_rng(3)
    dist = np.r_[rng.uniform(0, 200, 5000), np.repeat(rng.uniform(0, 80, 50), 40),
                 0.0, -0.0, 1e-30, 1e-40, 3e38].astype(np.float32)
    idx = rng.permutation(len(dist)).astype(np.int64)
    got = _front_to_back(dist, idx)
    assert np.array_equal(got, idx[np.argsort(dist, kind="stable")])


def test_a_ray_table_renders_as_one_row():
    from gsim.lidar import RayTableSpec
    az, el = np.meshgrid(np.radians(np.linspace(-40, 40, 81)), np.radians(np.linspace(-10, 10, 21)))
    dirs = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], -1).reshape(-1, 3)
    spec = RayTableSpec.from_directions("flash", dirs, 0.1, 100.0)
    f = render_lidar(wall(10.0, 20.0, 0.25, 0.99), spec, np.eye(4))
    assert f.range_image.shape == (1, len(dirs)) and len(f.points) == len(dirs)
    assert np.allclose(f.points[:, 0], 10.0, atol=1e-4)


@pytest.mark.cuda
def test_torch_reference_on_cuda_matches_numba():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU with CUDA (the torch reference then runs on it)")
    s = wall(10.0, 20.0, 0.5, 0.99)
    a, b = (render_lidar(s, VLP16, np.eye(4), backend=k) for k in ("numba", "torch"))
    assert np.mean((a.range_image > 0) != (b.range_image > 0)) < 0.005
    both = (a.range_image > 0) & (b.range_image > 0)
    assert np.abs(a.range_image[both] - b.range_image[both]).max() < 1e-3
