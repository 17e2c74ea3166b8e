"""`gsim serve` as AlpaSim's renderer: NVIDIA AlpaSim's ``nre.grpc.protos.sensorsim.SensorsimService`` (the neural
renderer's contract, NuRec's place) on the same port as gsim's own API, with the same token, TLS, limits, health and
reflection. Its messages are AlpaSim's generated modules unchanged (`carla_driver_interface.protocol`, the
``alpasim`` extra); the package ships no service stub for it, so it is served through a generic handler under the
service's full name.

Conventions as AlpaSim's runtime uses them (`gsim.bridges.closed_loop.alpasim` for the frames):
- scenes: gsim's served ids; cameras: a served scene's log cameras, ``rig_to_camera`` the camera's optical frame in
  the rig; trajectories: the logged (or, for a scenario, edited) ego path, ``T_local_rig`` at each logged time. The
  rig is the log's vehicle frame: for gsim's synthetic street and the closed loop the rear axle's centre on the
  ground, for a converted log its dataset's vehicle frame (docs/formats.md). What holds whatever the log:
  ``T_local_rig(t) @ rig_to_camera`` is the logged camera's pose.
- ``render_rgb``: ``sensor_pose`` the camera's optical frame in local at ``frame_start_us`` and ``frame_end_us``
  (a rolling shutter's first and last row, top to bottom, where the two differ; one exposure where they are equal or
  the shutter is global); ``camera_intrinsics`` at its own resolution, scaled to the request's
  ``resolution_w`` x ``resolution_h``; ``dynamic_objects`` place the scene's actors by track id (the box centre,
  ``local -> aabb``, at the frame's start and end; actors not named stay on their own tracks); PNG or JPEG
  (``image_quality`` 1-100, 0: 95).
- ``render_lidar``: ``PANDAR128`` (gsim's ``hesai-pandar128``) or ``AT128`` (``hesai-at128``); ``sensor_pose`` the
  LiDAR in local at the spin's start and end; points in the end-of-spin LiDAR frame, intensities in [0, 1] (0 where the
  scene has no LiDAR head), in both the repeated fields and the buffers (little-endian float32: x, y, z per point).
- ``batch_render_rgb`` and ``render_aggregated`` render their requests in order (on a GPU, a batch's cameras of one
  scene and time in one resident call); ``get_available_ego_masks``: none (gsim's scenes have no ego masks).
Errors: an unknown scene is NOT_FOUND; an unknown track id, a windshield model, a bad field INVALID_ARGUMENT; an
image format other than PNG and JPEG, or an f-theta camera, UNIMPLEMENTED.
"""
from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass, replace
from typing import Optional

import grpc
import numpy as np

from gsim.cameras import FisheyeCamera, OpenCVCamera, PinholeCamera
from gsim.errors import InputError
from gsim.io import image_bytes, to_uint8
from gsim.scenes.formats.convert_util import OPENCV_PIXEL_CENTRE_SHIFT

from ..closed_loop import alpasim
from .status import Unimplemented, request_parser, rpc

SERVICE = "nre.grpc.protos.sensorsim.SensorsimService"
LIDARS = {"PANDAR128": "hesai-pandar128", "AT128": "hesai-at128"}  # AlpaSim's LidarDeviceType -> gsim's preset


@dataclass
class _Job:
    """One camera render of a sensorsim request: the served scene and the scene with the request's actors placed,
    the camera, the log camera whose appearance it takes, the encoding, the exposure (start and end times and poses,
    and the one pose of a global shutter) and its batch key (None: a rolling shutter, rendered alone)."""

    served: object
    scene: object
    camera: object
    sensor: Optional[str]
    fmt: str
    quality: int
    t0: int
    t1: int
    T0: np.ndarray
    T1: np.ndarray
    T: np.ndarray
    batch: Optional[tuple]


@dataclass
class _Sweep:
    """One LiDAR sweep of a sensorsim request: the preset, the scene with the request's actors placed, and the
    spin's start and end times and poses."""

    spec: object
    scene: object
    t0: int
    t1: int
    T0: np.ndarray
    T1: np.ndarray


def _name(enum, value: int) -> str:
    """An enum value's name, or the number an unknown value is."""
    return enum.Name(value) if value in enum.values() else f"unknown value {value}"


def _protocol():
    from carla_driver_interface import protocol
    return protocol


class SensorsimServicer:
    """The sensorsim service over a `server.SensorServicer` (``core``): its served scenes, render slots, resident
    renderers and limits."""

    def __init__(self, core):
        self.core = core
        # render_aggregated's sweeps beside its cameras (the pool starts its threads on first use)
        self._lidar_threads = futures.ThreadPoolExecutor(thread_name_prefix="gsim-sensorsim-lidar")

    # ---------------------------------------------------------------------------------------- catalogue
    @rpc
    def get_version(self, request, context):
        from importlib.metadata import version
        P = _protocol()
        return P.VersionId(version_id=f"gsim {version('gsim')}", grpc_api_version=P.ALPASIM_API_VERSION)

    @rpc
    def get_available_scenes(self, request, context):
        return _protocol().common_pb2.AvailableScenesReturn(scene_ids=sorted(self.core.served))

    @rpc
    def get_loaded_scenes(self, request, context):
        P = _protocol()
        n = len(self.core.served)
        return P.sensorsim_pb2.LoadedScenesReturn(
            scenes=[P.sensorsim_pb2.LoadedSceneEntry(scene_id=s, loaded_instance_count=1, reusable_instance_count=1)
                    for s in sorted(self.core.served)], loaded_instance_capacity=n)

    @rpc
    def get_available_cameras(self, request, context):
        s = self.core.served_scene(request.scene_id)
        return _protocol().AvailableCamerasReturn(available_cameras=[
            alpasim.available_camera(cam, T_vc, name) for name, (cam, T_vc) in s.cameras.items()])

    @rpc
    def get_available_trajectories(self, request, context):
        P = _protocol()
        s = self.core.served_scene(request.scene_id)
        out = P.sensorsim_pb2.AvailableTrajectoriesReturn()
        if s.ego is not None:
            out.available_trajectories.add().trajectory.CopyFrom(alpasim.trajectory_message(*s.ego))
        return out

    @rpc
    def get_available_ego_masks(self, request, context):
        return _protocol().sensorsim_pb2.AvailableEgoMasksReturn()

    # ---------------------------------------------------------------------------------------- rendering
    @rpc
    def render_rgb(self, request, context):
        return self._render([self._prepare(request)], context)[0]

    @rpc
    def batch_render_rgb(self, request, context):
        """Each item's render, or its error (``success`` False); the items that can render go as one batch."""
        P = _protocol()
        jobs, errors = [], {}
        for k, item in enumerate(request.items):
            try:
                jobs.append((k, self._prepare(item.request)))
            except (InputError, Unimplemented) as e:  # (a server's own failure fails the call)
                errors[k] = str(e)
        rendered = dict(zip((k for k, _ in jobs), self._render([j for _, j in jobs], context)))
        out = P.sensorsim_pb2.BatchRGBRenderReturn()
        for k, item in enumerate(request.items):
            if k in rendered:
                out.items.add(camera_name=item.camera_name, result=rendered[k], success=True)
            else:
                out.items.add(camera_name=item.camera_name, success=False, error_message=errors[k])
        return out

    @rpc
    def render_aggregated(self, request, context):
        """The cameras and the LiDARs of one call in one render slot, every request checked before any renders; the
        sweeps in a thread beside the cameras where the renderer allows it (`Renderer.lidar_beside_cameras`: on a
        GPU, or numba's omp/tbb layer), as the closed loop renders them."""
        P = _protocol()
        jobs, sweeps = [self._prepare(r) for r in request.rgb_requests], [self._prepare_lidar(r)
                                                                           for r in request.lidar_requests]
        with self.core.slot(context):
            beside, first = None, next((j for j in jobs if j.batch is not None), None)  # (a resident call's)
            if sweeps and first is not None and \
                    self.core.renderer(first.served, first.scene, self.core.checked_backend("")).lidar_beside_cameras:
                beside = self._lidar_threads.submit(lambda: [self._sweep(w) for w in sweeps])
            try:
                rgb = self._images(jobs)
            finally:  # a camera's error waits for the sweeps too: nothing renders on past the call's slot
                if beside is not None:
                    futures.wait([beside])
            frames = beside.result() if beside is not None else [self._sweep(w) for w in sweeps]
        return P.sensorsim_pb2.AggregatedRenderReturn(rgb_returns=self._encoded(rgb, jobs),
                                                      lidar_returns=[self._lidar_return(w, f)
                                                                     for w, f in zip(sweeps, frames)])

    @rpc
    def render_lidar(self, request, context):
        sweep = self._prepare_lidar(request)
        with self.core.slot(context):
            frame = self._sweep(sweep)
        return self._lidar_return(sweep, frame)

    def _prepare(self, request) -> "_Job":
        """A render_rgb request checked and turned into gsim's terms (nothing rendered yet)."""
        P = _protocol()
        s = self.core.served_scene(request.scene_id)
        if request.image_format not in (P.ImageFormat.PNG, P.ImageFormat.JPEG):
            raise Unimplemented(f"image_format: {_name(P.ImageFormat, request.image_format)} is not served; PNG or "
                                f"JPEG")
        if not 0 <= request.image_quality <= 100:
            raise InputError(f"image_quality: expected 0-100 (0: 95), got {request.image_quality:g}")
        if request.insert_ego_mask:
            raise InputError("insert_ego_mask: this server has no ego masks (get_available_ego_masks is empty)")
        camera = self._camera(request.camera_intrinsics, request.resolution_w, request.resolution_h)
        t0, t1 = self._times(request)
        T0, T1 = (self._pose(request.sensor_pose, f) for f in ("start_pose", "end_pose"))
        scene = self._placed(s.scene, request.dynamic_objects, t0, t1)
        shutter = request.camera_intrinsics.shutter_type
        if t1 > t0 and shutter not in (P.ShutterType.ROLLING_TOP_TO_BOTTOM, P.ShutterType.GLOBAL,
                                       P.ShutterType.UNKNOWN):
            raise Unimplemented(f"camera_intrinsics.shutter_type: {_name(P.ShutterType, shutter)} is not served; a "
                                f"rolling shutter reads top to bottom here (ROLLING_TOP_TO_BOTTOM), or GLOBAL")
        sensor = request.camera_intrinsics.logical_id if request.camera_intrinsics.logical_id in s.cameras else None
        fmt = "png" if request.image_format == P.ImageFormat.PNG else "jpeg"
        rolling = shutter == P.ShutterType.ROLLING_TOP_TO_BOTTOM and t1 > t0
        # a global shutter: one exposure at the middle; renders of one scene, placement and time batch together
        tm = (t0 + t1) // 2
        T = T0 if t1 == t0 else self._between(T0, T1, 0.5)
        placement = b"".join(o.SerializeToString(deterministic=True) for o in request.dynamic_objects)
        return _Job(s, scene, camera, sensor, fmt, int(round(request.image_quality)) or 95, t0, t1, T0, T1, T,
                    None if rolling else (s.id, tm, placement))

    def _render(self, jobs, context) -> list:
        """``RGBRenderReturn`` of each job, rendered in one render slot (`_images`)."""
        with self.core.slot(context):
            rgb = self._images(jobs)
        return self._encoded(rgb, jobs)

    def _images(self, jobs) -> list:
        """Each job's 8-bit image: a rolling shutter alone, the still ones of one scene, placement and time in one
        resident call (on a GPU one gsplat batch)."""
        from gsim.render import render_camera
        backend = self.core.checked_backend("")
        rgb = [None] * len(jobs)
        batches = {}
        for k, j in enumerate(jobs):
            if j.batch is None:  # a rolling shutter, top to bottom over the exposure
                rgb[k] = to_uint8(render_camera(j.scene, j.camera, (np.array([j.t0, j.t1]), np.stack([j.T0, j.T1])),
                                                backend=backend, timestamp_us=j.t0, sensor=j.sensor,
                                                readout_us=int(j.t1 - j.t0)).rgb)
            else:
                batches.setdefault(j.batch, []).append(k)
        for (_, tm, _), ks in batches.items():
            first = jobs[ks[0]]
            views = [(jobs[k].camera, jobs[k].T, jobs[k].sensor) for k in ks]
            for k, x in zip(ks, self.core.renderer(first.served, first.scene, backend).images(views, tm)):
                rgb[k] = x
        return rgb

    @staticmethod
    def _encoded(rgb, jobs) -> list:
        P = _protocol()
        return [P.sensorsim_pb2.RGBRenderReturn(image_bytes=image_bytes(x, j.fmt, j.quality))
                for x, j in zip(rgb, jobs)]

    def _prepare_lidar(self, request) -> _Sweep:
        """A render_lidar request checked and turned into gsim's terms (nothing rendered yet)."""
        from gsim.lidar.spec import lidar_preset
        P = _protocol()
        s = self.core.served_scene(request.scene_id)
        kinds = P.sensorsim_pb2.LidarDeviceType
        if request.lidar_config.lidar_type not in kinds.values():
            raise InputError(f"lidar_config.lidar_type: unknown value {request.lidar_config.lidar_type}; "
                             f"{', '.join(kinds.keys())}")
        t0, t1 = self._times(request)
        T0, T1 = (self._pose(request.sensor_pose, f) for f in ("start_pose", "end_pose"))
        return _Sweep(lidar_preset(LIDARS[kinds.Name(request.lidar_config.lidar_type)]),
                      self._placed(s.scene, request.dynamic_objects, t0, t1), t0, t1, T0, T1)

    @staticmethod
    def _sweep(w: _Sweep):
        from gsim.lidar import render_lidar
        pose = (np.array([w.t0, w.t1]), np.stack([w.T0, w.T1])) if w.t1 > w.t0 else w.T0
        return render_lidar(w.scene, w.spec, pose, timestamp_us=w.t0, rolling=w.t1 > w.t0)

    @staticmethod
    def _lidar_return(w: _Sweep, f):
        """The sweep's points in the end-of-spin frame, each from its own column's frame (its firing time)."""
        pts = np.asarray(f.points, np.float64)
        if w.t1 > w.t0:
            from gsim.transforms import interpolate_poses
            Ts = interpolate_poses(np.array([w.t0, w.t1]), np.stack([w.T0, w.T1]),
                                   w.t0 + np.asarray(f.time_offset_us, np.int64))
            world = np.einsum("nij,nj->ni", Ts[:, :3, :3], pts) + Ts[:, :3, 3]
        else:
            world = pts @ w.T0[:3, :3].T + w.T0[:3, 3]
        T_end_world = np.linalg.inv(w.T1)
        xyz = (world @ T_end_world[:3, :3].T + T_end_world[:3, 3]).astype("<f4")
        inten = (np.zeros(len(xyz), "<f4") if f.intensity is None
                 else np.clip(np.asarray(f.intensity, np.float64), 0, 1).astype("<f4"))
        # the packed fields alone, as NVIDIA's NRE server and AlpaSim's own renderer answer (AlpaSim's runtime reads
        # them first): the repeated float fields too took 15-20 ms a 120k-point sweep and doubled the message
        return _protocol().sensorsim_pb2.LidarRenderReturn(num_points=len(xyz), point_xyzs_buffer=xyz.tobytes(),
                                                           point_intensities_buffer=inten.tobytes())

    # ---------------------------------------------------------------------------------------- request fields
    @staticmethod
    def _times(request):
        t0, t1 = int(request.frame_start_us), int(request.frame_end_us)
        if t1 < t0:
            raise InputError(f"frame_end_us: before frame_start_us ({t1} < {t0})")
        if t1 - t0 > 10_000_000:
            raise InputError(f"frame_end_us: at most 10 s after frame_start_us, got {t1 - t0} us")
        return t0, t1

    @staticmethod
    def _pose(pair, field: str) -> np.ndarray:
        m = getattr(pair, field)
        q = np.array([m.quat.w, m.quat.x, m.quat.y, m.quat.z])
        v = np.array([m.vec.x, m.vec.y, m.vec.z])
        if not (np.isfinite(q).all() and np.isfinite(v).all()):
            raise InputError(f"sensor_pose.{field}: expected finite numbers")
        if not 0.5 < np.linalg.norm(q) < 1.5:
            raise InputError(f"sensor_pose.{field}.quat: expected a unit quaternion, got |q| = {np.linalg.norm(q):.3g}")
        return alpasim.pose_matrix(m)

    @staticmethod
    def _between(T0: np.ndarray, T1: np.ndarray, a: float) -> np.ndarray:
        from gsim.transforms import interpolate_poses
        return interpolate_poses(np.array([0, 1_000_000]), np.stack([T0, T1]), np.array([int(a * 1e6)]))[0]

    def _camera(self, spec, width: int, height: int):
        """gsim's camera for AlpaSim's ``CameraSpec``, scaled from its own resolution to the request's."""
        which = spec.WhichOneof("camera_param")
        if spec.WhichOneof("external_distortion") is not None:
            raise InputError("camera_intrinsics.bivariate_windshield_model_param: gsim renders no windshield model")
        if which is None or which == "ftheta_param":
            raise Unimplemented(f"camera_intrinsics: {which or 'no camera model'} is not served; opencv_pinhole_param "
                                f"or opencv_fisheye_param")
        w0, h0 = spec.resolution_w or width, spec.resolution_h or height
        if not (0 < width <= 16384 and 0 < height <= 16384 and 0 < w0 and 0 < h0):
            raise InputError(f"resolution_w, resolution_h: expected 1-16384 pixels, got {width} x {height}")
        if width * height > self.core.limits.max_pixels:
            raise InputError(f"resolution: {width} x {height} is more than max_pixels ({self.core.limits.max_pixels})")
        p = getattr(spec, which)
        sx, sy = width / w0, height / h0
        linear = dict(width=int(width), height=int(height), fx=p.focal_length_x * sx, fy=p.focal_length_y * sy,
                      cx=(p.principal_point_x + OPENCV_PIXEL_CENTRE_SHIFT) * sx,
                      cy=(p.principal_point_y + OPENCV_PIXEL_CENTRE_SHIFT) * sy)
        k = list(p.radial_coeffs)
        if which == "opencv_fisheye_param":
            return FisheyeCamera(**linear, **dict(zip(("k1", "k2", "k3", "k4"), k + [0.0] * (4 - len(k)))))
        if len(k) > 3 or len(p.tangential_coeffs) not in (0, 2) or any(p.thin_prism_coeffs):
            raise InputError("camera_intrinsics.opencv_pinhole_param: gsim takes radial k1-k3, tangential p1 p2 and "
                             "no thin prism")
        if not any(k) and not any(p.tangential_coeffs):
            return PinholeCamera(**linear)
        k = k + [0.0] * (3 - len(k))
        t = list(p.tangential_coeffs) or [0.0, 0.0]
        return OpenCVCamera(**linear, k1=k[0], k2=k[1], k3=k[2], p1=t[0], p2=t[1])

    @staticmethod
    def _placed(scene, objects, t0: int, t1: int):
        """The scene with the named actors on the request's poses (box centre at the frame's start and end)."""
        if not objects:
            return scene
        actors = {a.id: a for a in scene.actors}
        for i, o in enumerate(objects):
            if o.track_id not in actors:
                raise InputError(f"dynamic_objects[{i}].track_id: the scene has no actor {o.track_id!r}; it has "
                                 f"{', '.join(sorted(actors)) or 'none'}")
            a = actors[o.track_id]
            T_aabb_actor = alpasim.lift(-float(a.size[2]) / 2)  # gsim's actor frame: the box's bottom centre
            poses = np.stack([SensorsimServicer._pose(o.pose_pair, f) @ T_aabb_actor
                              for f in ("start_pose", "end_pose")])
            ts = np.array([t0, t1 if t1 > t0 else t0 + 1], np.int64)
            actors[o.track_id] = replace(a, track_timestamps_us=ts, track_poses=poses)
        return replace(scene, actors=tuple(actors[a.id] for a in scene.actors))


def add_sensorsim(core, server) -> None:
    """Serves AlpaSim's sensorsim service over ``core`` (a `server.SensorServicer`) on ``server``."""
    P = _protocol()
    servicer = SensorsimServicer(core)
    handlers = {}
    for m in P.sensorsim_pb2.DESCRIPTOR.services_by_name["SensorsimService"].methods:
        request = P.common_pb2 if m.input_type.file.name.endswith("common.proto") else P.sensorsim_pb2
        response = P.common_pb2 if m.output_type.file.name.endswith("common.proto") else P.sensorsim_pb2
        request_class = getattr(request, m.input_type.name)
        response_class = getattr(response, m.output_type.name)
        handlers[m.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, m.name), request_deserializer=request_parser(request_class),
            response_serializer=response_class.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
