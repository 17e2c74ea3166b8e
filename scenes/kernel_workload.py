"""What the child of `gsim.scenes.kernel_cache.prime` runs: a tiny reconstruction, its evaluation and the loop's
sensors on a tiny synthetic street, so that numba writes every kernel they use to its cache; then the stamp."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from . import kernel_cache


def compile_kernels() -> None:
    """The kernels a CPU reconstruction, its evaluation and the closed loop's sensors use, compiled by running them
    on a tiny synthetic street (numba writes each to its cache); then the stamp, written atomically. Runs in the
    child (`prime`), whose environment tells the reconstruction below not to prime again."""
    import numpy as np
    from gsim.lidar import LidarSpec
    from gsim.resident import Renderer
    from .evaluation.evaluate import evaluate
    from .log import load_log
    from .synth import SynthOptions, synthesize
    from .reconstruction.train import preset, reconstruct
    want = kernel_cache.fingerprint()
    with tempfile.TemporaryDirectory(prefix="gsim-kernels-") as tmp:
        tiny = SynthOptions(n_frames=9, width=64, height=40, supersample=1, lidar_beams=8,
                            lidar_azimuth_resolution_deg=2.0)
        log_dir = synthesize(Path(tmp) / "log", seed=0, options=tiny, progress=False)
        cfg = preset("cpu", iterations=9)
        scene = reconstruct(log_dir, Path(tmp) / "recon", cfg, progress=False)
        evaluate(scene, log_dir, Path(tmp) / "eval", progress=False)
        from gsim.scene import load_scene
        log, r = load_log(log_dir), Renderer(load_scene(scene), "numba")
        cam = next(iter(log.cameras.values()))
        t = int(log.ego_timestamps_us[1])
        T = log.T_world_vehicle(t)
        r.cameras([(cam.camera, T @ cam.T_vehicle_camera, cam.name)], t, numpy=True)
        T_vl = next(iter(log.lidars.values())).T_vehicle_lidar
        r.lidar(LidarSpec.preset("velodyne-vlp32c"),
                (np.array([t - 100_000, t]), np.stack([log.T_world_vehicle(t - 100_000) @ T_vl, T @ T_vl])),
                t - 100_000)
    kernel_cache.write_stamp(want)


if __name__ == "__main__":
    if not os.environ.get(kernel_cache.CHILD):
        sys.exit(f"{__file__}: the child of gsim.scenes.kernel_cache.prime (run `gsim compile`)")
    compile_kernels()
