"""The ROS 2 messages gsim speaks over DDS, as cyclonedds IDL classes with ROS 2's DDS type names
(``<package>::msg::dds_::<Name>_``, what rmw_cyclonedds and rmw_fastrtps register), made from the message
definitions: rosbags' ROS 2 type store for the common packages, the ``.msg`` text below for ackermann_msgs and
Autoware's autoware_control_msgs / autoware_vehicle_msgs / tier4_vehicle_msgs (not in that store). `message` builds
one from nested dicts of field names, as `gsim.ros2_bag.build` does for bags.

A ROS 2 service crosses DDS as two topics, as rmw_cyclonedds puts it (its serdata.cpp and rmw_node.cpp): requests
on ``rq<service>Request`` of type ``<package>::srv::dds_::<Srv>_Request_``, replies on ``rr<service>Reply`` of type
``..._Response_``, each sample the request header (``cdds_request_header_t``: the client's request writer's 64-bit
instance handle and a sequence number, native-endian, copied from the request into its reply) then the message's
fields (`service_class`, `service_message`); `ServiceServer` answers them as rmw_cyclonedds' service does. Written
from rmw_cyclonedds' source; not yet checked against a real ROS 2 node.

cyclonedds packs a ``uint8[]`` (image and cloud data) one Python int a byte (about 0.2 s for a 6 MB image); gsim's
classes move such fields as bytes (`_as_bytes`): the same CDR on the wire, the type still ``sequence<uint8>``.
`Writer` writes them with fewer copies than cyclonedds' ``DataWriter.write`` (the same CDR, from its serializer).
"""
from __future__ import annotations

import time
from functools import lru_cache

import numpy as np

from gsim.ros2_bag import build

EXTRA_MSG = {
    "ackermann_msgs/msg/AckermannDrive": "float32 steering_angle\nfloat32 steering_angle_velocity\nfloat32 speed\n"
                                         "float32 acceleration\nfloat32 jerk\n",
    "ackermann_msgs/msg/AckermannDriveStamped": "std_msgs/Header header\nackermann_msgs/AckermannDrive drive\n",
    "autoware_control_msgs/msg/Lateral": "builtin_interfaces/Time stamp\nfloat32 steering_tire_angle\n"
                                         "float32 steering_tire_rotation_rate\n"
                                         "bool is_defined_steering_tire_rotation_rate\n",
    "autoware_control_msgs/msg/Longitudinal": "builtin_interfaces/Time stamp\nfloat32 velocity\nfloat32 acceleration\n"
                                              "float32 jerk\nbool is_defined_acceleration\nbool is_defined_jerk\n",
    "autoware_control_msgs/msg/Control": "builtin_interfaces/Time stamp\nautoware_control_msgs/Lateral lateral\n"
                                         "autoware_control_msgs/Longitudinal longitudinal\n",
    "autoware_vehicle_msgs/msg/VelocityReport": "std_msgs/Header header\nfloat32 longitudinal_velocity\n"
                                                "float32 lateral_velocity\nfloat32 heading_rate\n",
    "autoware_vehicle_msgs/msg/SteeringReport": "builtin_interfaces/Time stamp\nfloat32 steering_tire_angle\n",
    "autoware_vehicle_msgs/msg/GearReport": "builtin_interfaces/Time stamp\nuint8 report\n",
    "autoware_vehicle_msgs/msg/ControlModeReport": "builtin_interfaces/Time stamp\nuint8 mode\n",
    "autoware_vehicle_msgs/msg/GearCommand": "builtin_interfaces/Time stamp\nuint8 command\n",
    "autoware_vehicle_msgs/msg/Engage": "builtin_interfaces/Time stamp\nbool engage\n",
    "autoware_vehicle_msgs/msg/TurnIndicatorsCommand": "builtin_interfaces/Time stamp\nuint8 command\n",
    "autoware_vehicle_msgs/msg/TurnIndicatorsReport": "builtin_interfaces/Time stamp\nuint8 report\n",
    "autoware_vehicle_msgs/msg/HazardLightsCommand": "builtin_interfaces/Time stamp\nuint8 command\n",
    "autoware_vehicle_msgs/msg/HazardLightsReport": "builtin_interfaces/Time stamp\nuint8 report\n",
    "tier4_vehicle_msgs/msg/VehicleEmergencyStamped": "builtin_interfaces/Time stamp\nbool emergency\n",
}
EXTRA_SRV = {  # services: (request, response) definitions (in the type store as pkg/msg/<Srv>_Request, _Response)
    "autoware_vehicle_msgs/srv/ControlModeCommand": ("builtin_interfaces/Time stamp\nuint8 mode\n", "bool success\n"),
}
# autoware_vehicle_msgs' constants: GearCommand's (GearReport's are the same), ControlModeReport's,
# TurnIndicatorsCommand's and HazardLightsCommand's (their reports' are the same, less NO_COMMAND)
GEAR_NEUTRAL, GEAR_DRIVE, GEAR_PARK = 1, 2, 22
DRIVE_GEARS = frozenset([*range(2, 20), 23, 24])  # DRIVE, DRIVE_2 .. DRIVE_18, LOW, LOW_2
REVERSE_GEARS = frozenset([20, 21])  # REVERSE, REVERSE_2
CONTROL_MODE_AUTONOMOUS, CONTROL_MODE_MANUAL = 1, 4  # (ControlModeCommand's request: the same)
NO_COMMAND, TURN_DISABLE, TURN_LEFT, TURN_RIGHT = 0, 1, 2, 3
HAZARD_DISABLE, HAZARD_ENABLE = 1, 2


@lru_cache(maxsize=1)
def typestore():
    """rosbags' ROS 2 type store with `EXTRA_MSG` and the parts of `EXTRA_SRV` registered."""
    from rosbags.typesys import Stores, get_typestore, get_types_from_msg
    ts = get_typestore(Stores.LATEST)
    texts = dict(EXTRA_MSG)
    for srv, parts in EXTRA_SRV.items():
        texts.update({_part(srv, part): text for part, text in zip(("Request", "Response"), parts)})
    for name, text in texts.items():
        ts.register(get_types_from_msg(text, name))
    return ts


def _part(srv: str, part: str) -> str:
    """The type store's name of a service's (``pkg/srv/Srv``) ``part`` (Request or Response)."""
    pkg, _, name = srv.split("/")
    return f"{pkg}/msg/{name}_{part}"


@lru_cache(maxsize=None)
def idl_class(typ: str):
    """The cyclonedds IDL class of a ROS 2 message type (``pkg/msg/Name``), with its nested types."""
    pkg, _, name = typ.split("/")
    return _idl_struct(typ, name, f"{pkg}::msg::dds_::{name}_", {})


@lru_cache(maxsize=None)
def service_class(srv: str, part: str):
    """The IDL class of a ROS 2 service's (``pkg/srv/Srv``) ``part`` (Request or Response) as rmw_cyclonedds puts it
    on the wire: ``writer_guid`` (uint64) and ``sequence_number`` (int64), its request header, then the message's
    fields; named ``pkg::srv::dds_::Srv_Request_`` (``_Response_``). rmw_cyclonedds registers no type information
    for it, so DDS matches it by that name."""
    from cyclonedds.idl import types as t
    pkg, _, name = srv.split("/")
    return _idl_struct(_part(srv, part), f"{name}_{part}", f"{pkg}::srv::dds_::{name}_{part}_",
                       {"writer_guid": t.uint64, "sequence_number": t.int64})


def _idl_struct(typ: str, struct: str, typename: str, fields: dict):
    """An IDL struct ``typename`` (the class ``struct``): ``fields`` (IDL types), then those of ``typ`` in the type
    store."""
    from cyclonedds.idl import make_idl_struct
    from cyclonedds.idl import types as t
    from rosbags.typesys.base import Nodetype
    base = {"bool": bool, "byte": t.byte, "char": t.uint8, "int8": t.int8, "uint8": t.uint8, "int16": t.int16,
            "uint16": t.uint16, "int32": t.int32, "uint32": t.uint32, "int64": t.int64, "uint64": t.uint64,
            "float32": t.float32, "float64": t.float64, "string": str}
    fields = dict(fields)
    for name, (node, desc) in typestore().fielddefs[typ][1]:
        if node == Nodetype.NAME:
            fields[name] = idl_class(desc)
        elif node == Nodetype.BASE:
            fields[name] = base[desc[0]]
        else:
            (enode, edesc), size = desc
            element = idl_class(edesc) if enode == Nodetype.NAME else base[edesc[0]]
            fields[name] = t.array[element, size] if node == Nodetype.ARRAY else t.sequence[element]
    cls = make_idl_struct(struct, typename, fields)
    _as_bytes(cls, [k for k, v in fields.items() if v == t.sequence[t.uint8]])
    return cls


def _as_bytes(cls, names):
    """Serialize ``cls``'s uint8[] fields ``names`` from bytes and read them back as bytes, with cyclonedds' own
    machine for IDL ``bytes`` (a uint32 length, then the octets: what it writes for ``sequence<uint8>`` one int at a
    time). The type object, built from the field types, is unchanged, so ROS 2 nodes match it as before."""
    if not names:
        return
    from cyclonedds.idl._machinery import BytesMachine
    cls.__idl__.populate()
    for machine in (cls.__idl__.v1_machine, cls.__idl__.v2_machine):
        for name in names:
            machine.members_machines[name] = BytesMachine()


def _make(typ: str, fields: dict):
    """`build`'s constructor for IDL classes: numpy arrays as cyclonedds takes them, uint8 ones (uint8[] and
    uint8[N]) as a view of their bytes (serialized without a copy of their own), others as lists."""
    for k, v in fields.items():
        if isinstance(v, np.ndarray):
            fields[k] = memoryview(np.ascontiguousarray(v)) if v.dtype == np.uint8 else v.tolist()
    return idl_class(typ)(**fields)


class Writer:
    """``DataWriter.write`` with fewer copies of a large sample (a full-HD image and a 74k-point cloud: about 3 ms
    less a step): cyclonedds' own serializer (`message`'s class) into one buffer kept for the writer, neither
    regrown from 512 B by doubling nor reallocated zeroed for each sample, and the CDR handed to the C writer as a
    view (``DataWriter.write`` makes bytes of it, two copies, and pads them to 4 bytes, another)."""

    def __init__(self, writer):
        from cyclonedds.idl._support import Buffer

        class Kept(Buffer):
            def zero_out(self):  # (each sample overwrites it; `align` and `asbytes` zero the bytes they skip)
                pass

            def align(self, alignment: int):
                start = self._pos
                super().align(alignment)
                end = min(self._pos, self._size)  # (beyond: `ensure_size` grows it zeroed)
                if end > start:
                    self._bytes[start:end] = bytes(end - start)
                return self

            def asbytes(self):
                n = (self._pos + 3) & ~3  # the padding to 4 bytes, zero as cyclonedds' is
                self.ensure_size(n - self._pos)
                self._bytes[self._pos:n] = bytes(n - self._pos)
                return memoryview(self._bytes)[:n]

        self.writer, self.buffer = writer, Kept()

    def write(self, sample) -> None:
        from cyclonedds._clayer import ddspy_write
        from cyclonedds.core import DDSException
        w = self.writer
        ret = ddspy_write(w._ref, sample.serialize(buffer=self.buffer, use_version_2=w._use_version_2))
        if ret < 0:
            raise DDSException(ret, f"Occurred while writing sample in {w!r}")


def message(typ: str, values: dict):
    """A message of ROS 2 type ``typ`` (``pkg/msg/Name``) from nested dicts of field names (fields left out: zero)."""
    return build(typestore(), typ, values, _make)


def service_message(srv: str, part: str, writer_guid: int, sequence_number: int, values: dict):
    """A service's (``pkg/srv/Srv``) request or reply (``part``) with its header, from nested dicts of the message's
    field names (as `message`)."""
    typ = _part(srv, part)
    m = message(typ, values)
    fields = {name: getattr(m, name) for name, _ in typestore().fielddefs[typ][1]}
    return service_class(srv, part)(writer_guid=writer_guid, sequence_number=sequence_number, **fields)


def endpoint_id(participant, n: int) -> str:
    """An id for a client's or service's pair of endpoints as rmw_cyclonedds makes it (``clientid=`` and
    ``serviceid=`` in their USER_DATA): ``participant``'s GUID prefix and the number ``n``, bytes in hex joined by
    dots."""
    data = participant.guid.bytes[:12] + n.to_bytes(4, "big")
    return f"{data[0]:02x}" + "".join(f".{b:x}" for b in data[1:])


def user_data_key(qos, key: str):
    """The value of ``key`` in an endpoint's USER_DATA (rmw_cyclonedds' ``key=value;`` pairs), or None."""
    from cyclonedds.qos import Policy
    data = qos[Policy.Userdata] if qos is not None else None
    for pair in (data.data.decode(errors="replace").split(";") if data is not None else ()):
        k, eq, v = pair.partition("=")
        if eq and k == key:
            return v
    return None


class ServiceServer:
    """A ROS 2 service (``pkg/srv/Srv`` at ``name``) served over DDS as rmw_cyclonedds serves one (the module's
    docstring): its request reader and reply writer (``qos`` and ``serviceid=ID;`` in their USER_DATA, which an rmw
    client's ``service_is_ready`` looks for), `serve` answering each request, a reply only once the client's reply
    reader (the one with its request writer's ``clientid``) is matched, for at most ``reply_wait_s`` (rmw_cyclonedds
    waits 100 ms, then drops the reply), and none to a client that has left."""

    def __init__(self, participant, name: str, srv: str, qos, number: int = 1, reply_wait_s: float = 1.0):
        from cyclonedds.pub import DataWriter
        from cyclonedds.qos import Policy, Qos
        from cyclonedds.sub import DataReader
        from cyclonedds.topic import Topic
        qos = Qos(*qos, Policy.Userdata(f"serviceid={endpoint_id(participant, number)};".encode()))
        self.srv, self.reply_wait_s = srv, reply_wait_s
        self.request_class = service_class(srv, "Request")
        self.reader = DataReader(participant, Topic(participant, f"rq{name}Request", self.request_class), qos=qos)
        self.writer = DataWriter(participant, Topic(participant, f"rr{name}Reply", service_class(srv, "Response")),
                                 qos=qos)

    def serve(self, handler) -> None:
        """Answers every request waiting with ``handler(request)``: the reply's fields, as nested dicts."""
        for request in self.reader.take(N=64):
            if isinstance(request, self.request_class):
                values = handler(request)
                if self._client_ready(request.sample_info.publication_handle):
                    self.writer.write(service_message(self.srv, "Response", request.writer_guid,
                                                      request.sequence_number, values))

    def _client_ready(self, request_writer: int) -> bool:
        end = time.monotonic() + self.reply_wait_s
        while True:
            writer = self.reader.get_matched_publication_data(request_writer)
            if writer is None:
                return False  # (the client left)
            client = user_data_key(writer.qos, "clientid")
            if client is None:
                return True  # (a client without an id: rmw_cyclonedds assumes its reader is there)
            for h in self.writer.get_matched_subscriptions():
                reader = self.writer.get_matched_subscription_data(h)
                if reader is not None and user_data_key(reader.qos, "clientid") == client:
                    return True
            if time.monotonic() > end:
                return False
            time.sleep(0.01)
