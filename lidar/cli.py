"""The LiDAR layer's commands: ``gsim render-lidar``."""
from __future__ import annotations


def cmd_render_lidar(a) -> int:
    import numpy as np
    from tqdm import tqdm

    from gsim.cli_args import ros2_bag
    from gsim.lidar import render_lidar
    from gsim.lidar.io import load_lidar_trajectory, write_sweep
    from gsim.lidar.spec import lidar_preset
    from gsim.ros2_bag import open_bag, scene_boxes
    from gsim.scene import load_scene
    spec = lidar_preset(a.spec)
    scene = load_scene(a.scene)
    times, poses = load_lidar_trajectory(a.trajectory)
    # each sweep starts at a frame of the trajectory; the sensor moves along it while the sweep spins
    rolling = not a.no_rolling and len(times) > 1 and bool(np.all(np.diff(times) > 0))
    # in a ROS 2 bag the LiDAR is the vehicle (base_link): its trajectory has no other
    with open_bag(ros2_bag(a), {}, {spec.name: np.eye(4)}) as bag:
        for i, (t, T) in enumerate(tqdm(list(zip(times, poses)), desc="render-lidar", unit="sweep")):
            f = render_lidar(scene, spec, (times, poses) if rolling else T, backend=a.backend, timestamp_us=int(t),
                             rolling=rolling)
            write_sweep(f, a.out, i)
            if bag is not None:
                bag.step(int(t), T, actors=scene_boxes(scene, int(t)))
                bag.sweep(spec.name, int(t), f.points, f.intensity, f.ring, f.time_offset_us)
    kitti = "|bin" if scene.lidar_head is not None else ""
    print(f"wrote {len(times)} sweeps of {spec.name} to {a.out} (points/*.npy|ply|pcd{kitti}, range/*.png)"
          f"{'' if rolling else ', sensor held still over each sweep'}")
    return 0


def register(sub) -> None:
    from gsim.cli_args import add_ros2_bag
    from gsim.lidar.spec import preset_names, ray_table_preset_names  # numpy only
    names = preset_names() + ray_table_preset_names()
    rl = sub.add_parser("render-lidar", help="render LiDAR sweeps of a scene along a LiDAR trajectory")
    rl.add_argument("scene")
    rl.add_argument("--spec", required=True, choices=names, metavar="PRESET",
                    help=f"a LiDAR preset: {', '.join(names)}")
    rl.add_argument("--trajectory", required=True,
                    help='JSON {"schema_version": 1, "frames": [{"timestamp_us": ..., "T_world_lidar": 4x4}]}')
    rl.add_argument("--out", required=True)
    rl.add_argument("--backend", default="auto", choices=["auto", "numba", "cuda", "torch"],
                    help="auto: the CUDA kernel where an NVIDIA GPU is, else numba")
    rl.add_argument("--no-rolling", action="store_true",
                    help="hold the sensor (and the actors) still over each sweep instead of moving them per column")
    add_ros2_bag(rl, cameras=False)
    rl.set_defaults(fn=cmd_render_lidar)
