"""Writes ROS bags for the rosbag converter's tests with `rosbags` (rosbag1, rosbag2 sqlite3, rosbag2 MCAP), as a car's
recorder lays them out. Messages are given as nested dicts of field names (case-insensitive: ROS 1's CameraInfo says
``K`` where ROS 2 says ``k``; fields left out are zero, so ROS 1's ``Header.seq`` needs no mention)."""
from pathlib import Path
from typing import Iterable, Tuple

import numpy as np

STORAGES = ("rosbag1", "sqlite3", "mcap")
# ROS 1's store (noetic) lacks tf2_msgs; its definition as a recorder embeds it
TF_MESSAGE_ROS1 = "geometry_msgs/TransformStamped[] transforms"
PRIMITIVES = {"bool": bool, "byte": np.uint8, "char": np.uint8, "int8": np.int8, "uint8": np.uint8,
              "int16": np.int16, "uint16": np.uint16, "int32": np.int32, "uint32": np.uint32, "int64": np.int64,
              "uint64": np.uint64, "float32": np.float32, "float64": np.float64}


def typestore(storage: str):
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore
    if storage != "rosbag1":
        return get_typestore(Stores.LATEST)
    ts = get_typestore(Stores.ROS1_NOETIC)
    ts.register(get_types_from_msg(TF_MESSAGE_ROS1, "tf2_msgs/msg/TFMessage"))
    return ts


def build(ts, typ: str, values: dict):
    """A message of type ``typ`` from the store ``ts``."""
    from rosbags.typesys.base import Nodetype
    given = {k.lower(): v for k, v in (values or {}).items()}
    kw = {}
    for name, (node, desc) in ts.fielddefs[typ][1]:
        v = given.get(name.lower())
        if node == Nodetype.NAME:
            kw[name] = build(ts, desc, v)
        elif node == Nodetype.BASE:
            kw[name] = v if v is not None else ("" if desc[0] == "string" else PRIMITIVES[desc[0]](0))
        else:
            (enode, edesc), size = desc
            if enode == Nodetype.NAME:
                kw[name] = [build(ts, edesc, x) for x in (v or [])]
            elif edesc[0] == "string":
                kw[name] = list(v or [])
            else:
                kw[name] = np.asarray(v if v is not None else np.zeros(size), PRIMITIVES[edesc[0]])
    return ts.types[typ](**kw)


def header(stamp_ns: int, frame_id: str) -> dict:
    return {"stamp": {"sec": stamp_ns // 1_000_000_000, "nanosec": stamp_ns % 1_000_000_000}, "frame_id": frame_id}


def write_bag(path: Path, storage: str, messages: Iterable[Tuple[str, str, int, dict]], zstd: bool = False) -> Path:
    """Write (topic, message type, record time ns, fields) messages into a bag at ``path`` (a .bag file for
    rosbag1, else a rosbag2 folder; ``zstd``: its messages compressed, as ``ros2 bag record --compression-mode
    message``); returns the path."""
    from rosbags.rosbag1 import Writer as Writer1
    from rosbags.rosbag2 import StoragePlugin, Writer as Writer2
    from rosbags.rosbag2.enums import CompressionFormat, CompressionMode
    ts = typestore(storage)
    if storage == "rosbag1":
        writer, serialize = Writer1(path), ts.serialize_ros1
    else:
        plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
        writer, serialize = Writer2(path, version=9, storage_plugin=plugin), ts.serialize_cdr
        if zstd:
            writer.set_compression(CompressionMode.MESSAGE, CompressionFormat.ZSTD)
    connections = {}
    with writer:
        for topic, typ, t, values in messages:
            if topic not in connections:
                connections[topic] = writer.add_connection(topic, typ, typestore=ts)
            writer.write(connections[topic], t, bytes(serialize(build(ts, typ, values), typ)))
    return path


def transform(parent: str, child: str, stamp_ns: int, T: np.ndarray) -> dict:
    """A geometry_msgs/TransformStamped of T_parent_child."""
    from gsim.transforms import rotmat_to_quat
    w, x, y, z = rotmat_to_quat(np.asarray(T)[:3, :3])
    return {"header": header(stamp_ns, parent), "child_frame_id": child,
            "transform": {"translation": dict(zip("xyz", T[:3, 3])), "rotation": {"x": x, "y": y, "z": z, "w": w}}}


def pose(T: np.ndarray) -> dict:
    """A geometry_msgs/Pose of T."""
    from gsim.transforms import rotmat_to_quat
    w, x, y, z = rotmat_to_quat(np.asarray(T)[:3, :3])
    return {"position": dict(zip("xyz", T[:3, 3])), "orientation": {"x": x, "y": y, "z": z, "w": w}}


POINT_FIELD_TYPES = {"i1": 1, "u1": 2, "i2": 3, "u2": 4, "i4": 5, "u4": 6, "f4": 7, "f8": 8}


def cloud(stamp_ns: int, frame_id: str, points: np.ndarray, big_endian: bool = False) -> dict:
    """A sensor_msgs/PointCloud2 (one row) of a numpy structured array; its fields' names, types and offsets."""
    dt = points.dtype
    fields = [{"name": n, "offset": dt.fields[n][1], "datatype": POINT_FIELD_TYPES[dt.fields[n][0].str[1:]],
               "count": 1} for n in dt.names]
    data = points.astype(dt.newbyteorder(">" if big_endian else "<")).tobytes()
    return {"header": header(stamp_ns, frame_id), "height": 1, "width": len(points), "fields": fields,
            "is_bigendian": big_endian, "point_step": dt.itemsize, "row_step": dt.itemsize * len(points),
            "data": np.frombuffer(data, np.uint8), "is_dense": True}
