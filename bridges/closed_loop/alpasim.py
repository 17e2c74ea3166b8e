"""gsim's poses, trajectories and cameras as NVIDIA AlpaSim's contract messages (`carla_driver_interface.protocol`,
the ``alpasim`` extra: AlpaSim's generated modules unchanged), for the egodriver agent and the sensorsim service.

Frames (AlpaSim's CONTRIBUTING, "Coordinate Systems"): ``local`` is gsim's world frame; the ``rig`` is x forward,
y left, z up at the rear axle's centre on the ground (the loop's ego frame lowered by its height above the ground,
`LoopInfo.rig_height_m`); a camera's ``rig_to_camera`` is its optical frame (x right, y down, z along the optical
axis: gsim's camera frame) in the rig, as contract revision 2 declares it. Poses are active transforms
(``T_local_rig`` maps rig points into local). Time is integer microseconds on both sides. Pixel centres: AlpaSim's
camera parameters are OpenCV's (centres at integer coordinates), gsim's at +0.5.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from gsim.cameras import Camera, FisheyeCamera, OpenCVCamera, PinholeCamera
from gsim.errors import InputError
from gsim.scenes.formats.convert_util import OPENCV_PIXEL_CENTRE_SHIFT


def _contract():
    from carla_driver_interface import geometry, protocol
    return geometry, protocol


def pose_message(T: np.ndarray):
    """A 4x4 rigid transform as ``common.Pose``."""
    from scipy.spatial.transform import Rotation
    geometry, _ = _contract()
    return geometry.Pose.from_rotation(np.asarray(T, np.float64)[:3, 3], Rotation.from_matrix(T[:3, :3])).to_proto()


def pose_matrix(message) -> np.ndarray:
    """A ``common.Pose`` as a 4x4 float64 transform (its quaternion normalised; all zeros: the identity)."""
    geometry, _ = _contract()
    return geometry.Pose.from_proto(message).as_matrix()


def trajectory_message(timestamps_us: Sequence[int], poses: Sequence[np.ndarray]):
    """Timed 4x4 poses as ``common.Trajectory``."""
    _, protocol = _contract()
    return protocol.Trajectory(poses=[protocol.PoseAtTime(pose=pose_message(T), timestamp_us=int(t))
                                      for t, T in zip(timestamps_us, poses)])


def camera_spec(camera: Camera, logical_id: str):
    """gsim's camera model as AlpaSim's ``CameraSpec``: pinhole and OpenCV's radial-tangential model as
    ``opencv_pinhole_param`` (radial k1, k2, k3; tangential p1, p2), the fisheye as ``opencv_fisheye_param`` (k1-k4,
    its largest angle off the axis); a global shutter (gsim's loop renders a camera at one time)."""
    _, protocol = _contract()
    linear = dict(principal_point_x=camera.cx - OPENCV_PIXEL_CENTRE_SHIFT,
                  principal_point_y=camera.cy - OPENCV_PIXEL_CENTRE_SHIFT,
                  focal_length_x=camera.fx, focal_length_y=camera.fy)
    spec = protocol.CameraSpec(logical_id=logical_id, resolution_w=camera.width, resolution_h=camera.height,
                               shutter_type=protocol.ShutterType.GLOBAL)
    if isinstance(camera, FisheyeCamera):
        spec.opencv_fisheye_param.CopyFrom(protocol.sensorsim_pb2.OpenCVFisheyeCameraParam(
            **linear, radial_coeffs=[camera.k1, camera.k2, camera.k3, camera.k4], max_angle=camera.max_theta))
    elif isinstance(camera, OpenCVCamera):
        spec.opencv_pinhole_param.CopyFrom(protocol.OpenCVPinholeCameraParam(
            **linear, radial_coeffs=[camera.k1, camera.k2, camera.k3], tangential_coeffs=[camera.p1, camera.p2]))
    elif isinstance(camera, PinholeCamera):
        spec.opencv_pinhole_param.CopyFrom(protocol.OpenCVPinholeCameraParam(**linear))
    else:
        raise InputError(f"camera {logical_id}: no AlpaSim camera model for a {type(camera).__name__}")
    return spec


def available_camera(camera: Camera, T_rig_camera: np.ndarray, logical_id: str):
    """A rig camera as ``AvailableCamera`` (contract revision 2: ``rig_to_camera`` the optical frame in the rig)."""
    _, protocol = _contract()
    return protocol.AvailableCamera(intrinsics=camera_spec(camera, logical_id),
                                    rig_to_camera=pose_message(T_rig_camera), logical_id=logical_id)


def lift(height_m: float) -> np.ndarray:
    """The 4x4 translation by ``height_m`` along z: ``T_rig_vehicle`` for a vehicle frame that high over the rig."""
    T = np.eye(4)
    T[2, 3] = height_m
    return T
