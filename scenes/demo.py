"""The main job (`gsim demo`): synthesize the default street log, reconstruct it on CPU,
evaluate held-out views, and render a video along a path shifted sideways from the driven one.

    OUT/log/       the synthetic log (kept and reused when it is already there and valid)
    OUT/recon/     checkpoint.safetensors, train.json, scene/
    OUT/eval/      metrics.json, metrics.md, views/*.png
    OUT/novel/     rgb/*.png and video.mp4 along the shifted path
"""
from __future__ import annotations

import time
from pathlib import Path

from gsim.images import render_image
from gsim.io import to_uint8, write_png, write_video
from gsim.scene import load_scene

from .evaluation.evaluate import evaluate
from .log import load_log
from .evaluation.render_path import camera_path, path_camera
from .synth import SynthOptions, reuse_or_synthesize
from .reconstruction.train import preset, reconstruct


def render_shifted_path(scene_path, log_path, out, shift_m: float, fps: float = 10.0) -> Path:
    """Frames of the log's front camera (or its first) moved ``shift_m`` to the vehicle's left."""
    from tqdm import tqdm
    scene, log = load_scene(scene_path), load_log(log_path)
    sensor = path_camera(log)
    traj = camera_path(log, sensor, shift_m, scene=scene)
    out = Path(out)
    frames = []
    for i, (t, T) in enumerate(tqdm(list(zip(traj.timestamps_us, traj.poses)), desc="novel path", unit="frame")):
        rgb = to_uint8(render_image(scene, traj.camera, T, int(t), sensor)[0])
        write_png(out / "rgb" / f"{i:06d}.png", rgb)
        frames.append(rgb)
    write_video(out / "video.mp4", frames, fps)
    return out / "video.mp4"


DEMO_ITERATIONS = 1500  # half the cpu preset's: the whole job in about ten minutes on 2 cores


def run_demo(out: Path, seed: int = 0, iterations: int = DEMO_ITERATIONS, shift_m: float = 1.0,
             synth_options: SynthOptions = SynthOptions()) -> dict:
    """The main job; returns the held-out metrics. The street already at OUT/log is reused when it is
    this seed's and options'."""
    out = Path(out)
    t0 = time.perf_counter()
    if reuse_or_synthesize(out / "log", seed, synth_options)[1]:
        print(f"using the existing log {out / 'log'}")
    t1 = time.perf_counter()
    cfg = preset("cpu", seed=seed, iterations=iterations)
    scene = reconstruct(out / "log", out / "recon", cfg)
    t2 = time.perf_counter()
    m = evaluate(scene, out / "log", out / "eval")  # at the training downscale, recorded in the scene
    video = render_shifted_path(scene, out / "log", out / "novel", shift_m)
    t3 = time.perf_counter()
    lidar = f", LiDAR depth median |err| {m['lidar_depth_median_abs_m']:.3f} m" if "lidar_depth_median_abs_m" in m else ""
    print(f"demo: synth {t1 - t0:.0f} s, reconstruct ({cfg.backend}, {cfg.iterations} it) {t2 - t1:.0f} s, "
          f"eval + video {t3 - t2:.0f} s")
    print(f"held-out PSNR {m['psnr']:.2f} dB, SSIM {m['ssim']:.4f}{lidar} -> {out / 'eval'}; video {video}")
    if "lidar_range_median_abs_m" in m:
        print(f"held-out sweeps: range median |err| {m['lidar_range_median_abs_m']:.3f} m, Chamfer "
              f"{m['lidar_chamfer_m']:.3f} m, ray-drop accuracy {m['lidar_ray_drop_accuracy']:.3f}"
              + (f", intensity RMSE {m['lidar_intensity_rmse']:.3f}" if "lidar_intensity_rmse" in m else "")
              + f"; bird's-eye views {out / 'eval' / 'lidar'}")
    return m
