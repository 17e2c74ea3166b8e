"""Rendering a camera trajectory to files: the frames as PNGs, optionally depth and a video (`gsim render`)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import numpy as np

from ..io import to_uint8, write_depth_png, write_png, write_video
from ..ros2_bag import T_BASE_OPTICAL, BagOptions, open_bag, scene_boxes
from ..scene import Scene
from ..trajectory import Trajectory
from ..transforms import invert
from . import render_camera

ROS2_CAMERA = "main"  # the trajectory's camera in a ROS 2 bag (its vehicle: the camera looking along x)


def render_sequence(scene: Scene, trajectory: Trajectory, out, backend: str = "auto", fps: float = 10.0,
                    depth: bool = False, video: bool = True, repair: Optional[object] = None,
                    ros2_bag: Optional[BagOptions] = None) -> dict:
    """Render every frame of ``trajectory`` into ``out``: rgb/NNNNNN.png, with ``depth`` depth/NNNNNN.png (metres
    * 256, 16 bit), with ``video`` video.mp4 at ``fps``. ``repair``: a repairer (`gsim.diffusion.open_repairer`);
    rgb/ and the video then hold the repaired frames, render/ the renders as they were; one with ``repair_view`` (a
    repair model) is given each frame's pose, for references from its log (the trajectory's poses taken as the
    log's). ``ros2_bag``: the frames (as in rgb/) also in a ROS 2 bag, as camera `ROS2_CAMERA`. Returns
    {"frames": n, "median_frame_ms": the median render time per frame}."""
    from tqdm import tqdm

    from ..images import repaired  # (gsim.images imports this package)
    out = Path(out)
    frames, times = [], []
    with open_bag(ros2_bag, {ROS2_CAMERA: (trajectory.camera, T_BASE_OPTICAL)}, {}) as bag:
        for i, (t_us, T) in enumerate(tqdm(list(zip(trajectory.timestamps_us, trajectory.poses)),
                                           desc=f"render ({backend})", unit="frame")):
            t0 = time.perf_counter()
            f = render_camera(scene, trajectory.camera, T, backend=backend, timestamp_us=int(t_us))
            times.append(time.perf_counter() - t0)
            rgb = to_uint8(f.rgb)
            if repair is not None:
                write_png(out / "render" / f"{i:06d}.png", rgb)
                rgb = to_uint8(repaired(repair, scene, None, trajectory.camera, T, int(t_us), f.rgb, f.alpha,
                                        f.depth))
            write_png(out / "rgb" / f"{i:06d}.png", rgb)
            if depth:
                write_depth_png(out / "depth" / f"{i:06d}.png", f.depth)
            if video:
                frames.append(rgb)
            if bag is not None:
                bag.step(int(t_us), T @ invert(T_BASE_OPTICAL), actors=scene_boxes(scene, int(t_us)))
                bag.image(ROS2_CAMERA, int(t_us), rgb)
    if video:
        write_video(out / "video.mp4", frames, fps)
    return {"frames": len(times), "median_frame_ms": round(float(np.median(times)) * 1e3, 1)}
