"""`gsim serve` as AlpaSim's renderer: a sensorsim render_rgb call (AlpaSim's messages, the pose from the served
trajectory and camera mount, as AlpaSim's runtime builds it) against gsim's own RenderCamera of the same camera,
pose and size, on one `gsim serve` process; 640x360 and 1920x1080, PNG and JPEG; then a runtime's step in one
render_aggregated call (every log camera at 640x360 JPEG and a PANDAR128 sweep). Prints each call's median and
90th percentile round trip (render, encoding, transfer and decoding included) over --calls calls after one
warm-up call.

    .venv/bin/python bench/bench_sensorsim.py [RECONSTRUCTION] [--calls 10]

RECONSTRUCTION: a reconstruction directory (default out/demo: `./quickstart.sh demo`); the alpasim and serve extras.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np


def timed(fn, calls: int):
    fn()  # warm-up: the scene's upload, kernels, buffers
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times), statistics.quantiles(times, n=10)[-1]


def main(argv=None) -> dict:
    import grpc
    from carla_driver_interface import protocol as P
    from carla_driver_interface.geometry import Pose
    from gsim.bridges.api.client import SensorClient
    from gsim.bridges.api.server import ServerProcess
    from gsim.bridges.closed_loop.alpasim import pose_matrix, pose_message
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recon", nargs="?", default="out/demo")
    ap.add_argument("--calls", type=int, default=10)
    a = ap.parse_args(argv)
    S = P.sensorsim_pb2
    sid = Path(a.recon).name
    results = {}
    with ServerProcess([a.recon]) as server, grpc.insecure_channel(server.address, P.channel_options()) as ch, \
            SensorClient(server.address, timeout_s=300) as client:
        def sensorsim(method, ret):
            return ch.unary_unary("/nre.grpc.protos.sensorsim.SensorsimService/" + method,
                                  request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=ret.FromString)
        cams = sensorsim("get_available_cameras", S.AvailableCamerasReturn)(S.AvailableCamerasRequest(scene_id=sid))
        cam = next(c for c in cams.available_cameras if c.logical_id == "front")
        traj = sensorsim("get_available_trajectories", S.AvailableTrajectoriesReturn)(
            S.AvailableTrajectoriesRequest(scene_id=sid)).available_trajectories[0].trajectory
        at = traj.poses[len(traj.poses) // 2]
        T_wc = pose_matrix(at.pose) @ pose_matrix(cam.rig_to_camera)
        render = sensorsim("render_rgb", S.RGBRenderReturn)
        desc = client.describe_scene(sid)
        model = desc.cameras["front"][0]
        for w, h in ((640, 360), (1920, 1080)):
            own = model
            s = (w / own.width, h / own.height)
            scaled = replace(own, width=w, height=h, fx=own.fx * s[0], fy=own.fy * s[1], cx=own.cx * s[0],
                             cy=own.cy * s[1])
            for fmt, enc in ((S.ImageFormat.PNG, "png"), (S.ImageFormat.JPEG, "jpeg")):
                req = S.RGBRenderRequest(scene_id=sid, resolution_w=w, resolution_h=h, camera_intrinsics=cam.intrinsics,
                                         frame_start_us=at.timestamp_us, frame_end_us=at.timestamp_us,
                                         image_format=fmt, image_quality=95)
                req.sensor_pose.start_pose.CopyFrom(Pose.from_proto(pose_message(T_wc)).to_proto())
                req.sensor_pose.end_pose.CopyFrom(req.sensor_pose.start_pose)
                ss = timed(lambda: render(req, timeout=300), a.calls)
                gs = timed(lambda: client.render_camera(sid, scaled, T_wc, timestamp_us=int(at.timestamp_us),
                                                        encoding=enc, jpeg_quality=95, depth=False,
                                                        alpha=False), a.calls)
                results[f"{w}x{h} {enc}"] = {"sensorsim_ms": ss, "render_camera_ms": gs}
                print(f"{w}x{h} {enc:4s}  sensorsim render_rgb {ss[0]:7.1f} ms (p90 {ss[1]:7.1f})   gsim RenderCamera "
                      f"{gs[0]:7.1f} ms (p90 {gs[1]:7.1f})")
        # a runtime's step: every log camera at 640x360 JPEG and a PANDAR128 sweep over the step, in one call
        rgb = []
        for c in cams.available_cameras:
            req = S.RGBRenderRequest(scene_id=sid, resolution_w=640, resolution_h=360, camera_intrinsics=c.intrinsics,
                                     frame_start_us=at.timestamp_us, frame_end_us=at.timestamp_us,
                                     image_format=S.ImageFormat.JPEG, image_quality=95)
            req.sensor_pose.start_pose.CopyFrom(
                Pose.from_proto(pose_message(pose_matrix(at.pose) @ pose_matrix(c.rig_to_camera))).to_proto())
            req.sensor_pose.end_pose.CopyFrom(req.sensor_pose.start_pose)
            rgb.append(req)
        before = traj.poses[len(traj.poses) // 2 - 1]
        lidar = S.LidarRenderRequest(scene_id=sid, frame_start_us=before.timestamp_us, frame_end_us=at.timestamp_us,
                                     lidar_config=S.LidarSpec(lidar_type=S.LidarDeviceType.PANDAR128))
        lidar.sensor_pose.start_pose.CopyFrom(before.pose)
        lidar.sensor_pose.end_pose.CopyFrom(at.pose)
        agg = timed(lambda: sensorsim("render_aggregated", S.AggregatedRenderReturn)(
            S.AggregatedRenderRequest(rgb_requests=rgb, lidar_requests=[lidar]), timeout=300), a.calls)
        results["aggregated"] = {"cameras": len(rgb), "sensorsim_ms": agg}
        print(f"render_aggregated, {len(rgb)} cameras 640x360 jpeg + a PANDAR128 sweep: {agg[0]:7.1f} ms "
              f"(p90 {agg[1]:7.1f})")
    return results


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
