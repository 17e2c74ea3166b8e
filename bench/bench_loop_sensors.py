"""The closed loop's sensor step without SUMO: three cameras and a rolling LiDAR along a log's ego path, the log's
actors replayed on their tracks, through the resident renderer (what `gsim closed-loop` renders each step).

Usage: python bench/bench_loop_sensors.py SCENE LOG [--steps 40] [--hz 10] [--spec velodyne-hdl64e]
       [--backend auto] [--out FILE.json] [--profile FILE.txt]
The cameras: the log's first camera at its mounting and turned 50 degrees either side (a rig of three); the
LiDAR: the preset at the log's first LiDAR mounting (above the vehicle's origin without one), each sweep
rolling from the previous step's pose to this one. Per step, as bridges.closed_loop.loop does it: the cameras in one call
(uint8 out) and the sweep in a worker thread beside them where the renderer allows it
(`Renderer.lidar_beside_cameras`: on a GPU, or numba's omp/tbb layer), else one after the other. Prints the
median step time and steps/s (and the cameras' and the LiDAR's medians); SUMO, the agent, the dynamics, the
metrics and the recording are left out (a few ms of a CPU step): on a
GPU machine SUMO's libraries are larger than what a device call carries, so this is the loop's rate there.
--profile: ten more steps under cProfile (the host's Python, by cumulative time) and torch.profiler (the
operations by their own CPU time and, on a GPU, the kernels by theirs), written to FILE.txt.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gsim.lidar import LidarSpec  # noqa: E402
from gsim.resident import Renderer  # noqa: E402
from gsim.scene import load_scene  # noqa: E402
from gsim.scenes.log import load_log  # noqa: E402


def turned(T_vehicle_camera: np.ndarray, yaw_deg: float) -> np.ndarray:
    """The camera turned about its own y axis (down in OpenCV): positive to the right."""
    a = np.radians(yaw_deg)
    Y = np.eye(4)
    Y[[0, 0, 2, 2], [0, 2, 0, 2]] = np.cos(a), np.sin(a), -np.sin(a), np.cos(a)
    return T_vehicle_camera @ Y


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scene")
    ap.add_argument("log")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--spec", default="velodyne-hdl64e")
    ap.add_argument("--backend", default="auto", help="camera backend of the resident renderer")
    ap.add_argument("--out")
    ap.add_argument("--profile", default=None, metavar="FILE.txt")
    a = ap.parse_args(argv)
    scene, log = load_scene(a.scene), load_log(a.log)
    cam = next(iter(log.cameras.values()))
    rig = [(cam.camera, turned(cam.T_vehicle_camera, yaw), name) for yaw, name in
           ((0.0, cam.name), (-50.0, None), (50.0, None))]
    T_vl = next(iter(log.lidars.values())).T_vehicle_lidar if log.lidars else np.diag([1.0, 1, 1, 1])
    if not log.lidars:
        T_vl[2, 3] = 1.8
    spec = LidarSpec.preset(a.spec)
    r = Renderer(scene, a.backend)
    dt = int(round(1e6 / a.hz))
    t0 = int(log.ego_timestamps_us[0])
    times = t0 + dt * np.arange(1, a.steps + 2)
    times = times[times <= log.ego_timestamps_us[-1]]

    worker = ThreadPoolExecutor(1)
    beside = []  # per step: whether the sweep rendered beside the cameras (known once numba's layer is chosen)

    def sweep_at(t, T_prev, T):
        s = time.perf_counter()
        return r.lidar(spec, (np.array([t - dt, t]), np.stack([T_prev @ T_vl, T @ T_vl])), int(t) - dt), \
            time.perf_counter() - s

    def step(t):
        """(the step's, the cameras' and the sweep's wall times, the images, the sweep)"""
        T_prev, T = log.T_world_vehicle(int(t) - dt), log.T_world_vehicle(int(t))
        s0 = time.perf_counter()
        r.update(scene)  # (the loop hands the renderer each step's scene: here the same one)
        beside.append(r.lidar_beside_cameras)  # (asked each step, as the loop asks it)
        job = worker.submit(sweep_at, t, T_prev, T) if beside[-1] else None
        images = r.images([(c, T @ T_vc, n) for c, T_vc, n in rig], int(t))  # (on a GPU: rgb alone, 8 bits back)
        cam_s = time.perf_counter() - s0
        sweep, lidar_s = job.result() if job else sweep_at(t, T_prev, T)
        return time.perf_counter() - s0, cam_s, lidar_s, images, sweep

    steps, cams, sweeps = [], [], []
    for k, t in enumerate(times):
        step_s, cam_s, lidar_s, images, sweep = step(t)
        if k:  # the first step: JIT, uploads
            steps.append(step_s)
            cams.append(cam_s)
            sweeps.append(lidar_s)
    med, overlapped = statistics.median(steps), all(beside[1:])
    result = {"scene": a.scene, "backend": r.backend, "lidar_backend": r.lidar_backend, "steps": len(steps),
              "lidar_beside_cameras": overlapped,
              "cameras": [f"{c.width}x{c.height}" for c, _, _ in rig], "lidar": a.spec,
              "median_step_ms": 1e3 * med, "steps_per_s": 1 / med, "median_cameras_ms": 1e3 * statistics.median(cams),
              "median_lidar_ms": 1e3 * statistics.median(sweeps), "last_sweep_points": int(len(sweep.points)),
              "image_mean": float(np.mean(images[0]))}
    print(f"{r.backend} + {r.lidar_backend} LiDAR{' (beside)' if overlapped else ''}: median step "
          f"{result['median_step_ms']:.1f} ms "
          f"({result['steps_per_s']:.2f} steps/s; cameras {result['median_cameras_ms']:.1f} ms, LiDAR "
          f"{result['median_lidar_ms']:.1f} ms) over {len(steps)} steps")
    print(json.dumps(result))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    if a.profile:
        Path(a.profile).write_text(profile(step, times[1:11]))
    return result


def profile(step, times) -> str:
    """cProfile's and torch.profiler's tables of the steps at ``times``."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    gpu = torch.cuda.is_available()
    prof, text = cProfile.Profile(), io.StringIO()
    prof.enable()
    for t in times:
        step(t)
    prof.disable()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
    with torch_profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * gpu) as tp:
        for t in times:
            step(t)
    by = "self_cuda_time_total" if gpu else "self_cpu_time_total"
    return (f"cProfile, {len(times)} steps\n{text.getvalue()}\ntorch.profiler, {len(times)} steps, by {by}\n"
            + tp.key_averages().table(sort_by=by, row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
