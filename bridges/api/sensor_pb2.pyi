from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ImageEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RAW: _ClassVar[ImageEncoding]
    PNG: _ClassVar[ImageEncoding]
    JPEG: _ClassVar[ImageEncoding]
RAW: ImageEncoding
PNG: ImageEncoding
JPEG: ImageEncoding

class Transform(_message.Message):
    __slots__ = ("m",)
    M_FIELD_NUMBER: _ClassVar[int]
    m: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, m: _Optional[_Iterable[float]] = ...) -> None: ...

class Array(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("timestamps_us", "poses")
    TIMESTAMPS_US_FIELD_NUMBER: _ClassVar[int]
    POSES_FIELD_NUMBER: _ClassVar[int]
    timestamps_us: Array
    poses: Array
    def __init__(self, timestamps_us: _Optional[_Union[Array, _Mapping]] = ..., poses: _Optional[_Union[Array, _Mapping]] = ...) -> None: ...

class ListScenesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SceneSummary(_message.Message):
    __slots__ = ("id", "kind", "start_us", "end_us", "actors", "closed_loop")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    START_US_FIELD_NUMBER: _ClassVar[int]
    END_US_FIELD_NUMBER: _ClassVar[int]
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    CLOSED_LOOP_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    start_us: int
    end_us: int
    actors: int
    closed_loop: bool
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., start_us: _Optional[int] = ..., end_us: _Optional[int] = ..., actors: _Optional[int] = ..., closed_loop: _Optional[bool] = ...) -> None: ...

class ListScenesResponse(_message.Message):
    __slots__ = ("scenes",)
    SCENES_FIELD_NUMBER: _ClassVar[int]
    scenes: _containers.RepeatedCompositeFieldContainer[SceneSummary]
    def __init__(self, scenes: _Optional[_Iterable[_Union[SceneSummary, _Mapping]]] = ...) -> None: ...

class DescribeSceneRequest(_message.Message):
    __slots__ = ("scene_id",)
    SCENE_ID_FIELD_NUMBER: _ClassVar[int]
    scene_id: str
    def __init__(self, scene_id: _Optional[str] = ...) -> None: ...

class CameraModel(_message.Message):
    __slots__ = ("model", "width", "height", "fx", "fy", "cx", "cy", "k1", "k2", "k3", "k4", "p1", "p2")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FX_FIELD_NUMBER: _ClassVar[int]
    FY_FIELD_NUMBER: _ClassVar[int]
    CX_FIELD_NUMBER: _ClassVar[int]
    CY_FIELD_NUMBER: _ClassVar[int]
    K1_FIELD_NUMBER: _ClassVar[int]
    K2_FIELD_NUMBER: _ClassVar[int]
    K3_FIELD_NUMBER: _ClassVar[int]
    K4_FIELD_NUMBER: _ClassVar[int]
    P1_FIELD_NUMBER: _ClassVar[int]
    P2_FIELD_NUMBER: _ClassVar[int]
    model: str
    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float
    k1: float
    k2: float
    k3: float
    k4: float
    p1: float
    p2: float
    def __init__(self, model: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., fx: _Optional[float] = ..., fy: _Optional[float] = ..., cx: _Optional[float] = ..., cy: _Optional[float] = ..., k1: _Optional[float] = ..., k2: _Optional[float] = ..., k3: _Optional[float] = ..., k4: _Optional[float] = ..., p1: _Optional[float] = ..., p2: _Optional[float] = ...) -> None: ...

class NamedCamera(_message.Message):
    __slots__ = ("name", "model", "T_vehicle_camera")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    T_VEHICLE_CAMERA_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: CameraModel
    T_vehicle_camera: Transform
    def __init__(self, name: _Optional[str] = ..., model: _Optional[_Union[CameraModel, _Mapping]] = ..., T_vehicle_camera: _Optional[_Union[Transform, _Mapping]] = ...) -> None: ...

class LidarSpec(_message.Message):
    __slots__ = ("name", "elevations_deg", "azimuth_resolution_deg", "spin_hz", "min_range_m", "max_range_m", "spin", "azimuth_offsets_deg", "firing_offsets_us", "start_azimuth_deg")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ELEVATIONS_DEG_FIELD_NUMBER: _ClassVar[int]
    AZIMUTH_RESOLUTION_DEG_FIELD_NUMBER: _ClassVar[int]
    SPIN_HZ_FIELD_NUMBER: _ClassVar[int]
    MIN_RANGE_M_FIELD_NUMBER: _ClassVar[int]
    MAX_RANGE_M_FIELD_NUMBER: _ClassVar[int]
    SPIN_FIELD_NUMBER: _ClassVar[int]
    AZIMUTH_OFFSETS_DEG_FIELD_NUMBER: _ClassVar[int]
    FIRING_OFFSETS_US_FIELD_NUMBER: _ClassVar[int]
    START_AZIMUTH_DEG_FIELD_NUMBER: _ClassVar[int]
    name: str
    elevations_deg: _containers.RepeatedScalarFieldContainer[float]
    azimuth_resolution_deg: float
    spin_hz: float
    min_range_m: float
    max_range_m: float
    spin: str
    azimuth_offsets_deg: _containers.RepeatedScalarFieldContainer[float]
    firing_offsets_us: _containers.RepeatedScalarFieldContainer[float]
    start_azimuth_deg: float
    def __init__(self, name: _Optional[str] = ..., elevations_deg: _Optional[_Iterable[float]] = ..., azimuth_resolution_deg: _Optional[float] = ..., spin_hz: _Optional[float] = ..., min_range_m: _Optional[float] = ..., max_range_m: _Optional[float] = ..., spin: _Optional[str] = ..., azimuth_offsets_deg: _Optional[_Iterable[float]] = ..., firing_offsets_us: _Optional[_Iterable[float]] = ..., start_azimuth_deg: _Optional[float] = ...) -> None: ...

class NamedLidar(_message.Message):
    __slots__ = ("name", "spec", "T_vehicle_lidar")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    T_VEHICLE_LIDAR_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec: LidarSpec
    T_vehicle_lidar: Transform
    def __init__(self, name: _Optional[str] = ..., spec: _Optional[_Union[LidarSpec, _Mapping]] = ..., T_vehicle_lidar: _Optional[_Union[Transform, _Mapping]] = ...) -> None: ...

class ActorInfo(_message.Message):
    __slots__ = ("id", "category", "size_m", "track")
    ID_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    SIZE_M_FIELD_NUMBER: _ClassVar[int]
    TRACK_FIELD_NUMBER: _ClassVar[int]
    id: str
    category: str
    size_m: _containers.RepeatedScalarFieldContainer[float]
    track: Trajectory
    def __init__(self, id: _Optional[str] = ..., category: _Optional[str] = ..., size_m: _Optional[_Iterable[float]] = ..., track: _Optional[_Union[Trajectory, _Mapping]] = ...) -> None: ...

class SceneDescription(_message.Message):
    __slots__ = ("id", "kind", "start_us", "end_us", "cameras", "lidars", "actors", "ego", "closed_loop")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    START_US_FIELD_NUMBER: _ClassVar[int]
    END_US_FIELD_NUMBER: _ClassVar[int]
    CAMERAS_FIELD_NUMBER: _ClassVar[int]
    LIDARS_FIELD_NUMBER: _ClassVar[int]
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    EGO_FIELD_NUMBER: _ClassVar[int]
    CLOSED_LOOP_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    start_us: int
    end_us: int
    cameras: _containers.RepeatedCompositeFieldContainer[NamedCamera]
    lidars: _containers.RepeatedCompositeFieldContainer[NamedLidar]
    actors: _containers.RepeatedCompositeFieldContainer[ActorInfo]
    ego: Trajectory
    closed_loop: bool
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., start_us: _Optional[int] = ..., end_us: _Optional[int] = ..., cameras: _Optional[_Iterable[_Union[NamedCamera, _Mapping]]] = ..., lidars: _Optional[_Iterable[_Union[NamedLidar, _Mapping]]] = ..., actors: _Optional[_Iterable[_Union[ActorInfo, _Mapping]]] = ..., ego: _Optional[_Union[Trajectory, _Mapping]] = ..., closed_loop: _Optional[bool] = ...) -> None: ...

class ActorPose(_message.Message):
    __slots__ = ("actor_id", "T_world_actor")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    T_WORLD_ACTOR_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    T_world_actor: Transform
    def __init__(self, actor_id: _Optional[str] = ..., T_world_actor: _Optional[_Union[Transform, _Mapping]] = ...) -> None: ...

class RenderCameraRequest(_message.Message):
    __slots__ = ("scene_id", "camera_name", "camera_model", "T_world_camera", "T_world_vehicle", "timestamp_us", "actor_poses", "depth", "alpha", "encoding", "jpeg_quality", "backend", "readout_us", "T_world_camera_end", "T_world_vehicle_end", "end_timestamp_us")
    SCENE_ID_FIELD_NUMBER: _ClassVar[int]
    CAMERA_NAME_FIELD_NUMBER: _ClassVar[int]
    CAMERA_MODEL_FIELD_NUMBER: _ClassVar[int]
    T_WORLD_CAMERA_FIELD_NUMBER: _ClassVar[int]
    T_WORLD_VEHICLE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_US_FIELD_NUMBER: _ClassVar[int]
    ACTOR_POSES_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    JPEG_QUALITY_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    READOUT_US_FIELD_NUMBER: _ClassVar[int]
    T_WORLD_CAMERA_END_FIELD_NUMBER: _ClassVar[int]
    T_WORLD_VEHICLE_END_FIELD_NUMBER: _ClassVar[int]
    END_TIMESTAMP_US_FIELD_NUMBER: _ClassVar[int]
    scene_id: str
    camera_name: str
    camera_model: CameraModel
    T_world_camera: Transform
    T_world_vehicle: Transform
    timestamp_us: int
    actor_poses: _containers.RepeatedCompositeFieldContainer[ActorPose]
    depth: bool
    alpha: bool
    encoding: ImageEncoding
    jpeg_quality: int
    backend: str
    readout_us: int
    T_world_camera_end: Transform
    T_world_vehicle_end: Transform
    end_timestamp_us: int
    def __init__(self, scene_id: _Optional[str] = ..., camera_name: _Optional[str] = ..., camera_model: _Optional[_Union[CameraModel, _Mapping]] = ..., T_world_camera: _Optional[_Union[Transform, _Mapping]] = ..., T_world_vehicle: _Optional[_Union[Transform, _Mapping]] = ..., timestamp_us: _Optional[int] = ..., actor_poses: _Optional[_Iterable[_Union[ActorPose, _Mapping]]] = ..., depth: _Optional[bool] = ..., alpha: _Optional[bool] = ..., encoding: _Optional[_Union[ImageEncoding, str]] = ..., jpeg_quality: _Optional[int] = ..., backend: _Optional[str] = ..., readout_us: _Optional[int] = ..., T_world_camera_end: _Optional[_Union[Transform, _Mapping]] = ..., T_world_vehicle_end: _Optional[_Union[Transform, _Mapping]] = ..., end_timestamp_us: _Optional[int] = ...) -> None: ...

class EncodedImage(_message.Message):
    __slots__ = ("encoding", "raw", "data")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    encoding: ImageEncoding
    raw: Array
    data: bytes
    def __init__(self, encoding: _Optional[_Union[ImageEncoding, str]] = ..., raw: _Optional[_Union[Array, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class RenderCameraResponse(_message.Message):
    __slots__ = ("rgb", "depth", "alpha", "render_ms")
    RGB_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    RENDER_MS_FIELD_NUMBER: _ClassVar[int]
    rgb: EncodedImage
    depth: Array
    alpha: Array
    render_ms: float
    def __init__(self, rgb: _Optional[_Union[EncodedImage, _Mapping]] = ..., depth: _Optional[_Union[Array, _Mapping]] = ..., alpha: _Optional[_Union[Array, _Mapping]] = ..., render_ms: _Optional[float] = ...) -> None: ...

class RenderLidarRequest(_message.Message):
    __slots__ = ("scene_id", "preset", "lidar_name", "spec", "T_world_lidar", "T_world_vehicle", "timestamp_us", "T_world_lidar_end", "T_world_vehicle_end", "end_timestamp_us", "freeze_time", "actor_poses", "hit_alpha", "backend")
    SCENE_ID_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    LIDAR_NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    T_WORLD_LIDAR_FIELD_NUMBER: _ClassVar[int]
    T_WORLD_VEHICLE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_US_FIELD_NUMBER: _ClassVar[int]
    T_WORLD_LIDAR_END_FIELD_NUMBER: _ClassVar[int]
    T_WORLD_VEHICLE_END_FIELD_NUMBER: _ClassVar[int]
    END_TIMESTAMP_US_FIELD_NUMBER: _ClassVar[int]
    FREEZE_TIME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_POSES_FIELD_NUMBER: _ClassVar[int]
    HIT_ALPHA_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    scene_id: str
    preset: str
    lidar_name: str
    spec: LidarSpec
    T_world_lidar: Transform
    T_world_vehicle: Transform
    timestamp_us: int
    T_world_lidar_end: Transform
    T_world_vehicle_end: Transform
    end_timestamp_us: int
    freeze_time: bool
    actor_poses: _containers.RepeatedCompositeFieldContainer[ActorPose]
    hit_alpha: float
    backend: str
    def __init__(self, scene_id: _Optional[str] = ..., preset: _Optional[str] = ..., lidar_name: _Optional[str] = ..., spec: _Optional[_Union[LidarSpec, _Mapping]] = ..., T_world_lidar: _Optional[_Union[Transform, _Mapping]] = ..., T_world_vehicle: _Optional[_Union[Transform, _Mapping]] = ..., timestamp_us: _Optional[int] = ..., T_world_lidar_end: _Optional[_Union[Transform, _Mapping]] = ..., T_world_vehicle_end: _Optional[_Union[Transform, _Mapping]] = ..., end_timestamp_us: _Optional[int] = ..., freeze_time: _Optional[bool] = ..., actor_poses: _Optional[_Iterable[_Union[ActorPose, _Mapping]]] = ..., hit_alpha: _Optional[float] = ..., backend: _Optional[str] = ...) -> None: ...

class RenderLidarResponse(_message.Message):
    __slots__ = ("points", "ranges", "ring", "column", "time_offset_us", "normals", "intensity", "range_image", "expected_range_image", "alpha_image", "drop_probability_image", "render_ms")
    POINTS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    TIME_OFFSET_US_FIELD_NUMBER: _ClassVar[int]
    NORMALS_FIELD_NUMBER: _ClassVar[int]
    INTENSITY_FIELD_NUMBER: _ClassVar[int]
    RANGE_IMAGE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_RANGE_IMAGE_FIELD_NUMBER: _ClassVar[int]
    ALPHA_IMAGE_FIELD_NUMBER: _ClassVar[int]
    DROP_PROBABILITY_IMAGE_FIELD_NUMBER: _ClassVar[int]
    RENDER_MS_FIELD_NUMBER: _ClassVar[int]
    points: Array
    ranges: Array
    ring: Array
    column: Array
    time_offset_us: Array
    normals: Array
    intensity: Array
    range_image: Array
    expected_range_image: Array
    alpha_image: Array
    drop_probability_image: Array
    render_ms: float
    def __init__(self, points: _Optional[_Union[Array, _Mapping]] = ..., ranges: _Optional[_Union[Array, _Mapping]] = ..., ring: _Optional[_Union[Array, _Mapping]] = ..., column: _Optional[_Union[Array, _Mapping]] = ..., time_offset_us: _Optional[_Union[Array, _Mapping]] = ..., normals: _Optional[_Union[Array, _Mapping]] = ..., intensity: _Optional[_Union[Array, _Mapping]] = ..., range_image: _Optional[_Union[Array, _Mapping]] = ..., expected_range_image: _Optional[_Union[Array, _Mapping]] = ..., alpha_image: _Optional[_Union[Array, _Mapping]] = ..., drop_probability_image: _Optional[_Union[Array, _Mapping]] = ..., render_ms: _Optional[float] = ...) -> None: ...

class StartSessionRequest(_message.Message):
    __slots__ = ("scenario", "seed", "agent_name", "max_steps", "camera_encoding", "jpeg_quality")
    SCENARIO_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    CAMERA_ENCODING_FIELD_NUMBER: _ClassVar[int]
    JPEG_QUALITY_FIELD_NUMBER: _ClassVar[int]
    scenario: str
    seed: int
    agent_name: str
    max_steps: int
    camera_encoding: ImageEncoding
    jpeg_quality: int
    def __init__(self, scenario: _Optional[str] = ..., seed: _Optional[int] = ..., agent_name: _Optional[str] = ..., max_steps: _Optional[int] = ..., camera_encoding: _Optional[_Union[ImageEncoding, str]] = ..., jpeg_quality: _Optional[int] = ...) -> None: ...

class VehicleParams(_message.Message):
    __slots__ = ("wheelbase_m", "length_m", "width_m", "height_m", "rear_axle_to_centre_m", "max_accel_mps2", "max_decel_mps2", "max_steer_rad", "max_steer_rate_rps", "max_speed_mps")
    WHEELBASE_M_FIELD_NUMBER: _ClassVar[int]
    LENGTH_M_FIELD_NUMBER: _ClassVar[int]
    WIDTH_M_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_M_FIELD_NUMBER: _ClassVar[int]
    REAR_AXLE_TO_CENTRE_M_FIELD_NUMBER: _ClassVar[int]
    MAX_ACCEL_MPS2_FIELD_NUMBER: _ClassVar[int]
    MAX_DECEL_MPS2_FIELD_NUMBER: _ClassVar[int]
    MAX_STEER_RAD_FIELD_NUMBER: _ClassVar[int]
    MAX_STEER_RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    MAX_SPEED_MPS_FIELD_NUMBER: _ClassVar[int]
    wheelbase_m: float
    length_m: float
    width_m: float
    height_m: float
    rear_axle_to_centre_m: float
    max_accel_mps2: float
    max_decel_mps2: float
    max_steer_rad: float
    max_steer_rate_rps: float
    max_speed_mps: float
    def __init__(self, wheelbase_m: _Optional[float] = ..., length_m: _Optional[float] = ..., width_m: _Optional[float] = ..., height_m: _Optional[float] = ..., rear_axle_to_centre_m: _Optional[float] = ..., max_accel_mps2: _Optional[float] = ..., max_decel_mps2: _Optional[float] = ..., max_steer_rad: _Optional[float] = ..., max_steer_rate_rps: _Optional[float] = ..., max_speed_mps: _Optional[float] = ...) -> None: ...

class NamedTransform(_message.Message):
    __slots__ = ("name", "transform")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_FIELD_NUMBER: _ClassVar[int]
    name: str
    transform: Transform
    def __init__(self, name: _Optional[str] = ..., transform: _Optional[_Union[Transform, _Mapping]] = ...) -> None: ...

class LoopInfo(_message.Message):
    __slots__ = ("route_xy", "params", "step_s", "target_speed_mps", "scenario", "logged", "logged_until_us", "T_vehicle_lidar")
    ROUTE_XY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    STEP_S_FIELD_NUMBER: _ClassVar[int]
    TARGET_SPEED_MPS_FIELD_NUMBER: _ClassVar[int]
    SCENARIO_FIELD_NUMBER: _ClassVar[int]
    LOGGED_FIELD_NUMBER: _ClassVar[int]
    LOGGED_UNTIL_US_FIELD_NUMBER: _ClassVar[int]
    T_VEHICLE_LIDAR_FIELD_NUMBER: _ClassVar[int]
    route_xy: Array
    params: VehicleParams
    step_s: float
    target_speed_mps: float
    scenario: str
    logged: Trajectory
    logged_until_us: int
    T_vehicle_lidar: _containers.RepeatedCompositeFieldContainer[NamedTransform]
    def __init__(self, route_xy: _Optional[_Union[Array, _Mapping]] = ..., params: _Optional[_Union[VehicleParams, _Mapping]] = ..., step_s: _Optional[float] = ..., target_speed_mps: _Optional[float] = ..., scenario: _Optional[str] = ..., logged: _Optional[_Union[Trajectory, _Mapping]] = ..., logged_until_us: _Optional[int] = ..., T_vehicle_lidar: _Optional[_Iterable[_Union[NamedTransform, _Mapping]]] = ...) -> None: ...

class EgoState(_message.Message):
    __slots__ = ("x_m", "y_m", "yaw_rad", "speed_mps", "steer_rad", "accel_mps2", "timestamp_us")
    X_M_FIELD_NUMBER: _ClassVar[int]
    Y_M_FIELD_NUMBER: _ClassVar[int]
    YAW_RAD_FIELD_NUMBER: _ClassVar[int]
    SPEED_MPS_FIELD_NUMBER: _ClassVar[int]
    STEER_RAD_FIELD_NUMBER: _ClassVar[int]
    ACCEL_MPS2_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_US_FIELD_NUMBER: _ClassVar[int]
    x_m: float
    y_m: float
    yaw_rad: float
    speed_mps: float
    steer_rad: float
    accel_mps2: float
    timestamp_us: int
    def __init__(self, x_m: _Optional[float] = ..., y_m: _Optional[float] = ..., yaw_rad: _Optional[float] = ..., speed_mps: _Optional[float] = ..., steer_rad: _Optional[float] = ..., accel_mps2: _Optional[float] = ..., timestamp_us: _Optional[int] = ...) -> None: ...

class Box(_message.Message):
    __slots__ = ("id", "category", "x", "y", "z", "yaw", "length", "width", "height", "vx", "vy")
    ID_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    Z_FIELD_NUMBER: _ClassVar[int]
    YAW_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    VX_FIELD_NUMBER: _ClassVar[int]
    VY_FIELD_NUMBER: _ClassVar[int]
    id: str
    category: str
    x: float
    y: float
    z: float
    yaw: float
    length: float
    width: float
    height: float
    vx: float
    vy: float
    def __init__(self, id: _Optional[str] = ..., category: _Optional[str] = ..., x: _Optional[float] = ..., y: _Optional[float] = ..., z: _Optional[float] = ..., yaw: _Optional[float] = ..., length: _Optional[float] = ..., width: _Optional[float] = ..., height: _Optional[float] = ..., vx: _Optional[float] = ..., vy: _Optional[float] = ...) -> None: ...

class NamedImage(_message.Message):
    __slots__ = ("name", "image")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    image: EncodedImage
    def __init__(self, name: _Optional[str] = ..., image: _Optional[_Union[EncodedImage, _Mapping]] = ...) -> None: ...

class NamedArray(_message.Message):
    __slots__ = ("name", "array")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    name: str
    array: Array
    def __init__(self, name: _Optional[str] = ..., array: _Optional[_Union[Array, _Mapping]] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("step", "timestamp_us", "ego", "T_world_vehicle", "route", "cameras", "lidars", "lidar_ranges", "actors")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_US_FIELD_NUMBER: _ClassVar[int]
    EGO_FIELD_NUMBER: _ClassVar[int]
    T_WORLD_VEHICLE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    CAMERAS_FIELD_NUMBER: _ClassVar[int]
    LIDARS_FIELD_NUMBER: _ClassVar[int]
    LIDAR_RANGES_FIELD_NUMBER: _ClassVar[int]
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    step: int
    timestamp_us: int
    ego: EgoState
    T_world_vehicle: Transform
    route: Array
    cameras: _containers.RepeatedCompositeFieldContainer[NamedImage]
    lidars: _containers.RepeatedCompositeFieldContainer[NamedArray]
    lidar_ranges: _containers.RepeatedCompositeFieldContainer[NamedArray]
    actors: _containers.RepeatedCompositeFieldContainer[Box]
    def __init__(self, step: _Optional[int] = ..., timestamp_us: _Optional[int] = ..., ego: _Optional[_Union[EgoState, _Mapping]] = ..., T_world_vehicle: _Optional[_Union[Transform, _Mapping]] = ..., route: _Optional[_Union[Array, _Mapping]] = ..., cameras: _Optional[_Iterable[_Union[NamedImage, _Mapping]]] = ..., lidars: _Optional[_Iterable[_Union[NamedArray, _Mapping]]] = ..., lidar_ranges: _Optional[_Iterable[_Union[NamedArray, _Mapping]]] = ..., actors: _Optional[_Iterable[_Union[Box, _Mapping]]] = ...) -> None: ...

class StartSessionResponse(_message.Message):
    __slots__ = ("session_id", "info", "observation", "steps", "idle_timeout_s")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    info: LoopInfo
    observation: Observation
    steps: int
    idle_timeout_s: float
    def __init__(self, session_id: _Optional[str] = ..., info: _Optional[_Union[LoopInfo, _Mapping]] = ..., observation: _Optional[_Union[Observation, _Mapping]] = ..., steps: _Optional[int] = ..., idle_timeout_s: _Optional[float] = ...) -> None: ...

class Controls(_message.Message):
    __slots__ = ("accel_mps2", "steer_rate_rps")
    ACCEL_MPS2_FIELD_NUMBER: _ClassVar[int]
    STEER_RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    accel_mps2: float
    steer_rate_rps: float
    def __init__(self, accel_mps2: _Optional[float] = ..., steer_rate_rps: _Optional[float] = ...) -> None: ...

class StepSessionRequest(_message.Message):
    __slots__ = ("session_id", "controls", "waypoints")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLS_FIELD_NUMBER: _ClassVar[int]
    WAYPOINTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    controls: Controls
    waypoints: Array
    def __init__(self, session_id: _Optional[str] = ..., controls: _Optional[_Union[Controls, _Mapping]] = ..., waypoints: _Optional[_Union[Array, _Mapping]] = ...) -> None: ...

class StepSessionResponse(_message.Message):
    __slots__ = ("observation", "metrics", "done")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    observation: Observation
    metrics: _struct_pb2.Struct
    done: bool
    def __init__(self, observation: _Optional[_Union[Observation, _Mapping]] = ..., metrics: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., done: _Optional[bool] = ...) -> None: ...

class EndSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class EndSessionResponse(_message.Message):
    __slots__ = ("metrics", "record_dir")
    METRICS_FIELD_NUMBER: _ClassVar[int]
    RECORD_DIR_FIELD_NUMBER: _ClassVar[int]
    metrics: _struct_pb2.Struct
    record_dir: str
    def __init__(self, metrics: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., record_dir: _Optional[str] = ...) -> None: ...

class ServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("version", "backends", "lidar_presets", "workers", "queue", "max_pixels", "max_rays", "max_sessions")
    class BackendsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    LIDAR_PRESETS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_PIXELS_FIELD_NUMBER: _ClassVar[int]
    MAX_RAYS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    version: str
    backends: _containers.ScalarMap[str, str]
    lidar_presets: _containers.RepeatedScalarFieldContainer[str]
    workers: int
    queue: int
    max_pixels: int
    max_rays: int
    max_sessions: int
    def __init__(self, version: _Optional[str] = ..., backends: _Optional[_Mapping[str, str]] = ..., lidar_presets: _Optional[_Iterable[str]] = ..., workers: _Optional[int] = ..., queue: _Optional[int] = ..., max_pixels: _Optional[int] = ..., max_rays: _Optional[int] = ..., max_sessions: _Optional[int] = ...) -> None: ...
