"""The CUDA LiDAR kernel (gsim.lidar.kernel_cuda) against the numba kernel under numba's CUDA simulator.

Run by tests/test_lidar_cuda.py in a process of its own (NUMBA_ENABLE_CUDASIM=1 must be set before numba.cuda
is imported): tiny cases, since the simulator runs every GPU thread as a Python thread. Exits non-zero (an
AssertionError) where the two kernels disagree.
"""
import os

import numpy as np

import gsim
from gsim.lidar import RayTableSpec, render_lidar
from gsim.lidar.groups import surfel_groups
from gsim.lidar.render import sweep_layout, sensor_poses, trace


def pose(x, y=0.0, yaw=0.0):
    T = np.eye(4)
    T[:2, :2] = [[np.cos(yaw), -np.sin(yaw)], [np.sin(yaw), np.cos(yaw)]]
    T[:3, 3] = [x, y, 0.0]
    return T


def cloud(rng, n, spread):
    q = rng.normal(size=(n, 4))
    return gsim.Surfels(np.c_[rng.uniform(-spread, spread, (n, 2)), rng.uniform(-2, 2, n)],
                        q / np.linalg.norm(q, axis=1, keepdims=True), rng.uniform(0.2, 1.0, (n, 2)),
                        rng.uniform(0.3, 0.99, n), rng.uniform(0, 1, (n, 3)), rng.uniform(-1, 1, (n, 4)))


def ring(n_az, elevations_deg):
    """A ray table over the whole circle (its grid wraps around) at the given elevations."""
    az, el = np.meshgrid(np.linspace(-np.pi, np.pi, n_az, endpoint=False), np.radians(elevations_deg))
    return np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], -1).reshape(-1, 3)


def main():
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run with NUMBA_ENABLE_CUDASIM=1"
    rng = np.random.default_rng(1)
    car = gsim.Actor(id="car", category="car", size=(4.0, 2.0, 1.5), surfels=cloud(rng, 40, 2.0),
                     track_timestamps_us=np.array([0, 100_000]),
                     track_poses=np.stack([pose(6.0, 3.0), pose(7.5, 3.0, 0.3)]))
    scene = gsim.Scene(background=cloud(rng, 150, 15.0), actors=(car,))
    trajectory = (np.array([0, 100_000]), np.stack([pose(0.0), pose(1.5, 0.2, 0.2)]))
    # a full circle of rays (the wrapping grid), the sensor driving and turning, the car moving per column
    spec = RayTableSpec.from_directions("ring", ring(800, [-6.0]), 0.1, 100.0)
    a, b = (render_lidar(scene, spec, trajectory, backend=k, timestamp_us=0) for k in ("numba", "cuda"))
    assert (a.range_image > 0).sum() > 300, (a.range_image > 0).sum()
    assert np.array_equal(a.range_image > 0, b.range_image > 0)
    assert np.abs(a.range_image - b.range_image).max() < 1e-4
    assert np.abs(a.alpha_image - b.alpha_image).max() < 1e-5
    assert np.abs(a.normals - b.normals).max() < 1e-4
    # with a LiDAR head: intensity and ray drop decoded on the device as numba's are on the host
    from dataclasses import replace

    from gsim.lidar.heads import FEATURES, HIDDEN, INPUTS, LidarHead
    wide = lambda s: replace(s, features=rng.uniform(-1, 1, (len(s.means), FEATURES)))  # noqa: E731
    head = LidarHead(rng.normal(0, 0.6, (INPUTS, HIDDEN)), rng.normal(0, 0.1, HIDDEN), rng.normal(0, 0.6, (HIDDEN, 2)),
                     np.zeros(2))
    headed = gsim.Scene(background=wide(scene.background), actors=(replace(car, surfels=wide(car.surfels)),),
                        lidar_head=head)
    a, b = (render_lidar(headed, spec, trajectory, backend=k, timestamp_us=0) for k in ("numba", "cuda"))
    drop = a.drop_probability_image
    assert 0.02 < (drop[drop < 1] > 0.5).mean() < 0.98, "the head should drop some rays and keep others"
    assert np.array_equal(a.range_image > 0, b.range_image > 0) and len(a.intensity) > 100
    assert np.abs(a.intensity - b.intensity).max() < 1e-4 and np.abs(drop - b.drop_probability_image).max() < 1e-4
    # several bundles (each binned from its own pose, all composited in one launch): the ring fired column by
    # column over the sweep, as numba traces it, ray for ray
    import gsim.lidar.render as lidar_render
    from gsim.lidar.kernel_cuda import Tracer
    times = np.linspace(0, 100_000, 800).astype(np.int64)
    sensor = sensor_poses(trajectory, 0, times, True)
    dirs = np.einsum("cij,cj->ci", sensor[:, :3, :3], ring(800, [-6.0]))
    lidar_render.MIN_BUNDLE_RAYS = 64  # 800 rays: 12 bundles (the sensor's and the car's paths allow more)
    binned, real_bundle = [], Tracer.bundle
    Tracer.bundle = lambda self, *args: binned.append(1) or real_bundle(self, *args)
    c, d = (trace(surfel_groups(scene), sensor, times, dirs, np.arange(800), 0.5, k, candidates=4)
            for k in ("numba", "cuda"))
    # the same bundles binned in passes of 5, 5 and 2 (PASS_SLOTS: a big scene's binning memory)
    import gsim.lidar.kernel_cuda as kc
    kc.PASS_SLOTS, passes, real_bin = 5 * len(surfel_groups(scene).rec), [], Tracer._bin
    Tracer._bin = lambda self, bundles, grid: passes.append(len(bundles)) or real_bin(self, bundles, grid)
    e = trace(surfel_groups(scene), sensor, times, dirs, np.arange(800), 0.5, "cuda", candidates=4)
    Tracer.bundle, Tracer._bin, lidar_render.MIN_BUNDLE_RAYS, kc.PASS_SLOTS = real_bundle, real_bin, 8192, 8 << 20
    assert len(binned) == 24 and passes == [5, 5, 2] and (c["alpha"] > 0.5).sum() > 300, (binned, passes)
    for key, tol in (("alpha", 1e-5), ("median", 1e-4), ("normal", 1e-5), ("features", 1e-5)):
        assert np.abs(c[key] - d[key]).max() < tol, (key, np.abs(c[key] - d[key]).max())
        assert np.array_equal(d[key], e[key]), key
    assert np.array_equal(c["candidates"], d["candidates"]) and np.array_equal(d["candidates"], e["candidates"])
    # the raw sums and each ray's first contributors (what training recomposites), on a partial grid
    lay = sweep_layout(RayTableSpec.from_directions("fan", ring(48, [-10.0, -4.0, 2.0]), 0.1, 100.0))
    times = lay.column_us
    sensor = sensor_poses(trajectory, 0, times, True)
    dirs = np.einsum("cij,lcj->lci", sensor[:, :3, :3], lay.directions).reshape(-1, 3)
    column = np.arange(len(dirs))
    x, y = (trace(surfel_groups(scene), sensor, times, dirs, column, 0.5, k, candidates=6) for k in ("numba", "cuda"))
    assert (x["alpha"] > 0.5).sum() > 40
    for key, tol in (("alpha", 1e-5), ("median", 1e-4), ("range_sum", 1e-3), ("normal", 1e-5), ("features", 1e-5)):
        assert np.abs(x[key] - y[key]).max() < tol, (key, np.abs(x[key] - y[key]).max())
    assert np.array_equal(x["candidates"], y["candidates"])
    # groups built on the device from tensors (a trainer's parameters) trace as the numpy ones do
    import torch
    from gsim.lidar.kernel_cuda import device_groups
    from gsim.scene import body_surfels
    host = surfel_groups(scene)
    parts = [scene.background] + [body_surfels(a.surfels, a.shadow_surfels) for a in scene.actors]
    cat = lambda k: torch.as_tensor(np.concatenate([getattr(p, k) for p in parts]))  # noqa: E731
    dev = device_groups(cat("means"), cat("quats"), cat("scales"), cat("opacities"), cat("features"),
                        torch.as_tensor(host.group), host.tracks)
    assert np.abs(dev.rec.numpy() - host.rec).max() < 1e-6 and np.allclose(dev.radius, host.radius)
    z = trace(dev, sensor, times, dirs, column, 0.5, "cuda", candidates=6)
    assert all(np.array_equal(y[k], z[k]) for k in ("alpha", "median", "features", "candidates"))
    # a dense wedge of rays (a spinning sweep's: cells of several rays): a block per cell, its threads loading the
    # cell's list together (_composite_cells); then blocks of at most 2 rays loading 2 entries at a time (WARP 2:
    # a cell's rays in several blocks); then, blocks of 3 being too small to share loads, a thread per ray
    # (_composite_rays): the same bits
    az, el = np.meshgrid(np.linspace(-0.2, 0.2, 40), [-0.1, -0.05, 0.0])
    wedge = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], -1).reshape(-1, 3)
    spec = RayTableSpec.from_directions("wedge", wedge, 0.1, 100.0)
    small = gsim.Scene(background=cloud(np.random.default_rng(4), 60, 6.0))
    units, real_units = [], Tracer._units
    Tracer._units = lambda self, *args: units.append(real_units(self, *args)) or units[-1]
    g, h = (render_lidar(small, spec, pose(-8.0), backend=k) for k in ("numba", "cuda"))
    kc.WARP, kc.SHARED_FROM = 2, 1
    w = render_lidar(small, spec, pose(-8.0), backend="cuda")
    kc.WARP, kc.SHARED_FROM = 3, 4  # blocks of 3 rays would share too little: a thread per ray
    x = render_lidar(small, spec, pose(-8.0), backend="cuda")
    Tracer._units, kc.WARP = real_units, 32
    (wide, _, _, _, _), (narrow, blocks, _, _, _), (single, _, _, _, _) = units
    starts = blocks[:, 2].tolist()  # (a unit's first list entry: its cell's for a whole list)
    assert wide > 3 and narrow == 2 and single == 1 and len(starts) > len(set(starts)), (wide, narrow)
    assert (g.range_image > 0).sum() > 30 and np.array_equal(g.range_image > 0, h.range_image > 0)
    assert np.abs(g.range_image - h.range_image).max() < 1e-4 and np.abs(g.alpha_image - h.alpha_image).max() < 1e-5
    assert all(np.array_equal(getattr(h, k), getattr(v, k)) for k in ("range_image", "alpha_image", "normals")
               for v in (w, x))
    # lists in segments (SEGMENT entries, here 3: a block each), each segment's transmittance and candidate count
    # scanned first, then every segment composited from the ray's state before it and the sums added in list
    # order: numba's outputs, the car's surfels and candidates included
    az, el = np.meshgrid(np.linspace(0.12, 0.27, 30), [-0.04, -0.02, 0.0, 0.02])
    fan = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], -1).reshape(-1, 3)
    one = (surfel_groups(scene), pose(-8.0)[None], np.zeros(1, np.int64), fan, np.zeros(len(fan), np.int64), 0.5)
    n = trace(*one, "numba", candidates=4)
    kc.SEGMENT, rows, real_units = 3, [], Tracer._units
    Tracer._units = lambda self, *args: (lambda u: rows.append(u[4]) or u)(real_units(self, *args))
    split = trace(*one, "cuda", candidates=4)
    Tracer._units, kc.SEGMENT = real_units, 1024
    assert rows[0] > len(fan) and (n["alpha"] > 0.5).sum() > 30 and (n["candidates"][:, 3] >= 0).sum() > 10, rows
    for key, tol in (("alpha", 1e-5), ("median", 1e-4), ("range_sum", 1e-3), ("normal", 1e-5), ("features", 1e-5)):
        assert np.abs(n[key] - split[key]).max() < tol, (key, np.abs(n[key] - split[key]).max())
    assert np.array_equal(n["candidates"], split["candidates"])
    # a thread per ray (cells of few rays: _composite_rays) walks its whole list, however long (no segments there)
    kc.SEGMENT, kc.SHARED_FROM = 3, 1 << 20
    single = trace(*one, "cuda", candidates=4)
    kc.SEGMENT, kc.SHARED_FROM = 1024, 4
    for key, tol in (("alpha", 1e-5), ("median", 1e-4), ("range_sum", 1e-3), ("normal", 1e-5), ("features", 1e-5)):
        assert np.abs(n[key] - single[key]).max() < tol, (key, np.abs(n[key] - single[key]).max())
    assert np.array_equal(n["candidates"], single["candidates"])
    print("cuda kernel (simulator) matches numba")


if __name__ == "__main__":
    main()
