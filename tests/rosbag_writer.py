"""Writes ROS bags for the rosbag converter's tests with `rosbags` (rosbag1, rosbag2 sqlite3, rosbag2 MCAP), as a car's
recorder lays them out. Messages are given as nested dicts of field names (`gsim.ros2_bag.build`: fields left out are
zero, so ROS 1's ``Header.seq`` needs no mention; `gsim.ros2_bag`'s helpers make headers, transforms, poses and
clouds)."""
from pathlib import Path
from typing import Iterable, Tuple

from gsim.ros2_bag import build

STORAGES = ("rosbag1", "sqlite3", "mcap")
# ROS 1's store (noetic) lacks tf2_msgs; its definition as a recorder embeds it
TF_MESSAGE_ROS1 = "geometry_msgs/TransformStamped[] transforms"


def typestore(storage: str):
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore
    if storage != "rosbag1":
        return get_typestore(Stores.LATEST)
    ts = get_typestore(Stores.ROS1_NOETIC)
    ts.register(get_types_from_msg(TF_MESSAGE_ROS1, "tf2_msgs/msg/TFMessage"))
    return ts


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
