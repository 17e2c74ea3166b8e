"""An AlpaSim egodriver policy as a closed-loop agent (``--agent egodriver:HOST:PORT`` or
``egodriver:unix:///path``): gsim plays AlpaSim's runtime over real gRPC, so a policy written for AlpaSim drives in
gsim unchanged (the ``alpasim`` extra: `carla-driver-interface`, AlpaSim's generated modules and its contract
revisions).

A run: ``get_version`` (the policy's contract revision, `carla_driver_interface.contract.negotiate`), then
``start_session`` with the rig's cameras (`alpasim.available_camera`, in the revision the policy speaks, the run's
seed as ``random_seed``); each step ``submit_image_observation`` per camera (JPEG, or PNG; ``frame_start_us`` =
``frame_end_us``: the loop renders a camera at the step's time), ``submit_egomotion_observation`` (the last second
of the rig's poses in the local frame with their dynamic states), ``submit_route`` (the route ahead in the rig
frame), ``submit_recording_ground_truth`` (the logged rig path ahead), then ``drive`` for the next step: its
trajectory (local frame) becomes timed waypoints that the loop's tracker follows. ``terminate_session`` ends the run
(`loop.EndRun`); ``close_session`` is sent at the end and after any failure.

Every call has a deadline (``deadline_s``). A policy that does not answer, answers an error or never starts is an
`AgentError` naming the call and the step (the run keeps every completed step). A trajectory that cannot be followed
(no pose after now, a non-finite number, times that do not increase) makes the ego brake to a stop along its route
for that step instead (`FALLBACK`), with a warning naming the step and why.
"""
from __future__ import annotations

import math
import uuid
import warnings
from typing import List, Optional

import numpy as np

from gsim.errors import GsimWarning, InputError
from gsim.io import image_bytes

from . import alpasim
from .dynamics import path_waypoints, yaw_rate
from .loop import EndRun

HISTORY_STEPS = 10  # egomotion: the rig's poses of the last second at 10 Hz
GROUND_TRUTH_S = 5.0  # the logged path ahead that submit_recording_ground_truth carries
FALLBACK = "brake to a stop along the route"


class EgodriverError(InputError):
    """The policy server failed a call: names the call, the step and gRPC's status."""


class EgodriverAgent:
    """A closed-loop agent that asks an egodriver policy server (``target``: ``HOST:PORT`` or ``unix:///path``) to
    drive. ``deadline_s``: each call's deadline; ``image_format``: ``jpeg`` or ``png``."""

    def __init__(self, target: str, deadline_s: float = 10.0, image_format: str = "jpeg"):
        if not target or target.startswith(":") or (":" not in target and not target.startswith("unix:")):
            raise InputError(f"agent egodriver:{target}: expected egodriver:HOST:PORT or egodriver:unix:///path")
        if image_format not in ("jpeg", "png"):
            raise InputError(f"egodriver image format: expected jpeg or png, got {image_format!r}")
        if not (isinstance(deadline_s, (int, float)) and math.isfinite(deadline_s) and deadline_s > 0):
            raise InputError(f"egodriver deadline: expected a time > 0 s, got {deadline_s!r}")
        self.target, self.deadline_s, self.image_format = target, float(deadline_s), image_format
        self.channel = self.stub = self.session = None
        self.fallbacks: List[str] = []

    # ------------------------------------------------------------------ the session
    def reset(self, info) -> None:
        from carla_driver_interface import contract, protocol
        self.info = info
        self.T_vehicle_rig = alpasim.lift(-info.rig_height_m)
        self.history: List[tuple] = []
        self.channel = self._connect()
        self.stub = protocol.EgodriverServiceStub(self.channel)
        _, revision = self._call("get_version", lambda: contract.negotiate(self.stub, timeout=self.deadline_s))
        cameras = [alpasim.available_camera(cam, alpasim.lift(info.rig_height_m) @ T_vc, name)
                   for name, (cam, T_vc) in info.cameras.items()]
        request = protocol.DriveSessionRequest(session_uuid=str(uuid.uuid4()), random_seed=info.seed)
        request.debug_info.scene_id = info.scenario
        request.rollout_spec.vehicle.available_cameras.extend(
            contract.cameras_to_revision(cameras, contract.CONTRACT_REVISION, revision))
        self._call("start_session", lambda: self.stub.start_session(
            request, timeout=self.deadline_s, metadata=contract.contract_metadata(revision)))
        self.session = request.session_uuid

    def _connect(self):
        """The channel to the policy server, once it answers."""
        import grpc
        from carla_driver_interface import protocol
        channel = grpc.insecure_channel(self.target, options=protocol.channel_options())
        try:
            grpc.channel_ready_future(channel).result(timeout=self.deadline_s)
        except grpc.FutureTimeoutError:
            channel.close()
            raise EgodriverError(f"egodriver {self.target}: no policy server answers within {self.deadline_s:g} s "
                                 f"(is it running? e.g. carla-driver-interface serve --policy route_follower "
                                 f"--mode alpasim --host 127.0.0.1 --port PORT)") from None
        return channel

    def close(self) -> None:
        """close_session (when a session started), then the channel; a failure here is no run's failure."""
        import grpc
        from carla_driver_interface import protocol
        if self.session is not None:
            try:
                self.stub.close_session(protocol.DriveSessionCloseRequest(session_uuid=self.session),
                                        timeout=self.deadline_s)
            except grpc.RpcError as e:
                warnings.warn(f"egodriver {self.target}: close_session failed ({e.code().name}: {e.details()})",
                              GsimWarning, stacklevel=2)
            self.session = None
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    # ------------------------------------------------------------------ a step
    def act(self, obs):
        from carla_driver_interface import protocol
        t, s = obs.timestamp_us, obs.ego
        T_rig = obs.T_world_vehicle @ self.T_vehicle_rig
        self.history = (self.history + [(t, T_rig, s)])[-HISTORY_STEPS:]
        sid, k = self.session, obs.step
        for name, rgb in obs.cameras.items():
            image = protocol.RolloutCameraImage(session_uuid=sid)
            image.camera_image.logical_id = name
            image.camera_image.frame_start_us = image.camera_image.frame_end_us = t
            image.camera_image.image_bytes = image_bytes(rgb, self.image_format, 90)
            self._call("submit_image_observation", lambda: self.stub.submit_image_observation(
                image, timeout=self.deadline_s), k)
        ego = protocol.RolloutEgoTrajectory(session_uuid=sid)
        ego.trajectory.CopyFrom(alpasim.trajectory_message([h[0] for h in self.history], [h[1] for h in self.history]))
        ego.dynamic_states.extend(self._dynamic_state(h[2]) for h in self.history)
        self._call("submit_egomotion_observation", lambda: self.stub.submit_egomotion_observation(
            ego, timeout=self.deadline_s), k)
        route = protocol.RouteRequest(session_uuid=sid, route=protocol.Route(
            timestamp_us=t, waypoints=[protocol.Vec3(x=float(x), y=float(y), z=0.0) for x, y in obs.route]))
        self._call("submit_route", lambda: self.stub.submit_route(route, timeout=self.deadline_s), k)
        truth = self._ground_truth(t)
        if truth is not None:
            self._call("submit_recording_ground_truth", lambda: self.stub.submit_recording_ground_truth(
                protocol.GroundTruthRequest(session_uuid=sid, ground_truth=protocol.GroundTruth(
                    timestamp_us=t, trajectory=truth)), timeout=self.deadline_s), k)
        dt_us = int(round(self.info.step_s * 1e6))
        response = self._call("drive", lambda: self.stub.drive(protocol.DriveRequest(
            session_uuid=sid, time_now_us=t, time_query_us=t + dt_us), timeout=self.deadline_s), k)
        if response.terminate_session:
            raise EndRun(f"the egodriver policy ended the session at step {k} (terminate_session)")
        waypoints, why = self._waypoints(response.trajectory, t, obs.T_world_vehicle)
        if waypoints is not None:
            return waypoints
        self.fallbacks.append(f"step {k}: {why}")
        warnings.warn(f"step {k + 1}: the egodriver policy's trajectory cannot be followed ({why}): {FALLBACK}",
                      GsimWarning, stacklevel=2)
        route_world = (obs.T_world_vehicle[:2, :2] @ obs.route.T).T + obs.T_world_vehicle[:2, 3]
        return path_waypoints(route_world, s, 0.0)  # (ego-frame waypoints) planned speed 0: brake to a standstill

    # ------------------------------------------------------------------ helpers
    def _call(self, name: str, fn, step: Optional[int] = None):
        import grpc
        from carla_driver_interface.contract import ContractError
        try:
            return fn()
        except grpc.RpcError as e:
            where = "" if step is None else f" (before step {step + 1})"
            raise EgodriverError(f"egodriver {self.target}: {name}{where} failed: {e.code().name}: "
                                 f"{e.details()}") from None
        except ContractError as e:
            raise EgodriverError(f"egodriver {self.target}: {name}: {e}") from None

    def _dynamic_state(self, s):
        """The rig's velocity, yaw rate and acceleration in the rig frame (the bicycle's kinematics)."""
        from carla_driver_interface import protocol
        w = yaw_rate(s, self.info.params)
        return protocol.DynamicState(linear_velocity=protocol.Vec3(x=s.speed_mps),
                                     angular_velocity=protocol.Vec3(z=w),
                                     linear_acceleration=protocol.Vec3(x=s.accel_mps2, y=s.speed_mps * w))

    def _ground_truth(self, t: int):
        """The logged rig path from now for GROUND_TRUTH_S, a pose a step (None past the log's end)."""
        dt_us = int(round(self.info.step_s * 1e6))
        ts = list(range(t, min(t + int(GROUND_TRUTH_S * 1e6), self.info.logged_until_us) + 1, dt_us))
        if not ts:
            return None
        return alpasim.trajectory_message(ts, [self.info.logged_pose(u) @ self.T_vehicle_rig for u in ts])

    def _waypoints(self, trajectory, t: int, T_world_vehicle: np.ndarray):
        """The policy's plan (local frame) after ``t`` as ego-frame waypoints (K,3) (t_s, x_m, y_m) for the tracker,
        or (None, why)."""
        times = np.array([p.timestamp_us for p in trajectory.poses], np.int64)
        xyz = np.array([[p.pose.vec.x, p.pose.vec.y, p.pose.vec.z] for p in trajectory.poses], np.float64)
        if len(times) == 0:
            return None, "an empty trajectory"
        if not np.isfinite(xyz).all():
            return None, "a non-finite position"
        if np.any(np.diff(times) <= 0):
            return None, "its times do not increase"
        ahead = times > t
        if not ahead.any():
            return None, f"no pose after now ({t} us; its last is {int(times[-1])} us)"
        T_vehicle_world = np.linalg.inv(T_world_vehicle)
        ego = (T_vehicle_world[:3, :3] @ xyz[ahead].T).T + T_vehicle_world[:3, 3]
        return np.column_stack([(times[ahead] - t) * 1e-6, ego[:, :2]]), None
