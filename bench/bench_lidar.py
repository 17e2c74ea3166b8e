"""LiDAR rendering benchmark: sweeps of the demo street (`gsim.street.street_surfels`) along its drive.

Usage: python bench/bench_lidar.py [--surfels 200000] [--lasers 64] [--columns 2048] [--sweeps 10]
       [--backends numba,open3d] [--speed M_S]
The sensor: `lasers` beams evenly from +22.5 to -22.5 deg (an OS1-like pattern), `columns` per
revolution, 1.9 m above the street. --speed: a rolling sweep, the sensor driving forward at that speed
while it spins (gsim backends only; 0: the sensor still). Prints, per backend, the median wall time per sweep after one
warm-up sweep (JIT, tile tables; Embree's BVH commit), and a JSON summary line.

"open3d" is the reference point for speed, not the same physics: Open3D's Embree ray caster
(`RaycastingScene.cast_rays`) on the same surfels turned into quads (each surfel of opacity >= 0.5
as the box of its alpha >= 0.5 region), a single hit per ray: no alpha compositing, no beam
divergence, no rolling sweep. Its timed work per sweep is `cast_rays` and turning `t_hit` into a
range image; building the mesh is reported apart (build_s). The agreement figures compare its range
images with the first gsim backend's on the same sweeps: the fraction of rays where both return and
the median |range difference| over those rays. Needs `pip install -e ".[bench]"` (and, on
Debian/Ubuntu, `apt-get install -y libusb-1.0-0`); skipped with a message without it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from functools import partial
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from gsim.street import drive_trajectory, street_surfels
from gsim.lidar import LidarSpec, render_lidar
from gsim.surfels import Surfels
from gsim.transforms import quat_to_rotmat

OPEN3D_INSTALL = 'pip install -e ".[bench]" (on Debian/Ubuntu also: apt-get install -y libusb-1.0-0)'


def time_sweeps(sweep: Callable, inputs: Sequence) -> Tuple[float, List[float], List[np.ndarray]]:
    """``sweep(x)`` -> (lasers, columns) range image (0 = no return): once on inputs[0] untimed in the
    median (warm-up), then on each other input. Returns warm-up seconds, sweep seconds, range images."""
    t0 = time.perf_counter()
    sweep(inputs[0])
    warmup = time.perf_counter() - t0
    times, images = [], []
    for x in inputs[1:]:
        t0 = time.perf_counter()
        images.append(sweep(x))
        times.append(time.perf_counter() - t0)
    return warmup, times, images


def gsim_sweep(surfels: Surfels, spec: LidarSpec, backend: str, speed: float, T: np.ndarray) -> np.ndarray:
    if not speed:
        return render_lidar(surfels, spec, T, backend=backend).range_image
    T_end = T.copy()  # rolling: the sensor drives forward (its x axis) at ``speed`` m/s during the sweep
    T_end[:3, 3] += T[:3, 0] * speed / spec.spin_hz
    trajectory = (np.array([0, round(1e6 / spec.spin_hz)]), np.stack([T, T_end]))
    return render_lidar(surfels, spec, trajectory, backend=backend, timestamp_us=0).range_image


def surfel_quads(surfels: Surfels) -> Tuple[np.ndarray, np.ndarray]:
    """Each surfel of opacity >= 0.5 as a quad centred at its mean along its tangent axes, half-sizes the
    extent of its alpha >= 0.5 region; fainter ones never give a first return alone. Returns vertices
    (4Q,3) float32, triangles (2Q,3) uint32."""
    keep = surfels.opacities >= 0.5
    op = surfels.opacities[keep].astype(np.float64)
    R = quat_to_rotmat(surfels.quats[keep])  # columns: tangent u, tangent v, normal
    half = surfels.scales[keep] * np.sqrt(2 * np.log(2 * op))[:, None]  # o exp(-r^2/2) >= 0.5 <=> r^2 <= 2 ln 2o
    u, v = R[:, :, 0] * half[:, :1], R[:, :, 1] * half[:, 1:]
    c = surfels.means[keep]
    verts = np.stack([c - u - v, c + u - v, c + u + v, c - u + v], axis=1).reshape(-1, 3)
    first = 4 * np.arange(len(c))[:, None]
    tris = np.concatenate([first + [0, 1, 2], first + [0, 2, 3]], axis=1).reshape(-1, 3)
    return verts.astype(np.float32), tris.astype(np.uint32)


def sensor_rays(T: np.ndarray, dirs: np.ndarray) -> np.ndarray:
    """(lasers, columns, 6) float32 world rays [origin, direction] of a sweep held at pose T (sensor -> world)."""
    return np.concatenate([np.broadcast_to(T[:3, 3], dirs.shape), dirs @ T[:3, :3].T], axis=-1).astype(np.float32)


def open3d_sweep(scene, spec: LidarSpec, rays) -> np.ndarray:
    t = scene.cast_rays(rays)["t_hit"].numpy()  # unit directions: t is the range; inf (no hit) fails the window
    return np.where((t >= spec.min_range_m) & (t <= spec.max_range_m), t, 0.0).astype(np.float32)


def agreement(a: List[np.ndarray], b: List[np.ndarray]) -> dict:
    """Range images of the same sweeps: the fraction of rays where both return, and the median |range
    difference| (m) over those rays (None when there are none)."""
    a, b = np.stack(a), np.stack(b)
    both = (a > 0) & (b > 0)
    diff = np.abs(a[both] - b[both])
    return {"both_return_frac": round(float(both.mean()), 4),
            "median_abs_range_diff_m": round(float(np.median(diff)), 4) if diff.size else None}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--surfels", type=int, default=200_000)
    ap.add_argument("--lasers", type=int, default=64)
    ap.add_argument("--columns", type=int, default=2048)
    ap.add_argument("--sweeps", type=int, default=10)
    ap.add_argument("--backends", default="numba,open3d", help="gsim backends (numba, torch) and/or open3d")
    ap.add_argument("--speed", type=float, default=0.0, help="m/s: a rolling sweep (gsim backends)")
    args = ap.parse_args(argv)
    surfels = street_surfels(args.surfels)
    spec = LidarSpec(name=f"bench-{args.lasers}x{args.columns}",
                     elevations_deg=tuple(np.linspace(22.5, -22.5, args.lasers).tolist()),
                     azimuth_resolution_deg=360.0 / args.columns, spin_hz=10.0, min_range_m=0.5, max_range_m=120.0)
    poses = []
    for T_cam in drive_trajectory(args.sweeps + 1):  # the drive's camera poses, turned to a LiDAR's axes
        T = np.eye(4)
        T[:3, 3] = T_cam[:3, 3] + [0.0, 0.0, 0.3]
        poses.append(T)
    out = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", "speed_m_s": args.speed,
           "surfels": len(surfels), "rays": args.lasers * args.columns}
    images = {}
    for backend in args.backends.split(","):
        if backend == "open3d":
            try:
                import open3d as o3d
            except ImportError as e:
                out[backend] = {"unavailable": str(e)}
                print(f"open3d: skipped, cannot import open3d ({e}); install it with {OPEN3D_INSTALL}")
                continue
            t0 = time.perf_counter()
            verts, tris = surfel_quads(surfels)
            scene = o3d.t.geometry.RaycastingScene()
            scene.add_triangles(o3d.core.Tensor(verts), o3d.core.Tensor(tris))
            entry = {"mesh_triangles": len(tris), "build_s": round(time.perf_counter() - t0, 2)}
            dirs = spec.ray_directions()
            sweep, inputs = partial(open3d_sweep, scene, spec), [o3d.core.Tensor(sensor_rays(T, dirs)) for T in poses]
        else:
            entry, sweep, inputs = {}, partial(gsim_sweep, surfels, spec, backend, args.speed), poses
        warmup, times, images[backend] = time_sweeps(sweep, inputs)
        out[backend] = {"median_ms": round(1000 * statistics.median(times), 1), "sweeps": len(times),
                        "median_returns": int(statistics.median([np.count_nonzero(im) for im in images[backend]])),
                        "warmup_s": round(warmup, 2), **entry}
        print(f"{backend}: {args.lasers}x{args.columns} rays, {len(surfels)} surfels: median "
              f"{out[backend]['median_ms']} ms/sweep ({1000 / out[backend]['median_ms']:.1f} sweeps/s), "
              f"{out[backend]['median_returns']} returns"
              + (f"; {entry['mesh_triangles']} triangles built in {entry['build_s']} s" if entry else ""))
    ref: Optional[str] = next((b for b in images if b != "open3d"), None)
    if "open3d" in images and ref is not None:
        agree = agreement(images["open3d"], images[ref])
        out["open3d"].update(compared_with=ref, **agree)
        print(f"open3d vs {ref} on the same {len(images[ref])} sweeps: both return on "
              f"{100 * agree['both_return_frac']:.1f}% of rays, median |range difference| "
              f"{agree['median_abs_range_diff_m']} m there")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
