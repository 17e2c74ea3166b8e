"""A fake ROS 2 stack for tests/test_ros2_agent.py, in its own process, over DDS with cyclonedds alone: subscribes
/clock (best effort, as rclcpp's ClockQoS), /tf_static (transient local), the odometry, the camera's image and info
and the LiDAR's cloud (ROS 2's default QoS) and, once it has all of a step's (same stamp), publishes the step's
command: the odometry's speed plus DELTA[k % 2] (k: the step, from the stamp) at a steering angle STEER, as
Ackermann (header stamped with the step's clock), Twist, or Autoware's Control (stamped; acceleration = DELTA / dt).
In the autoware preset it first (before its first command, acknowledged) shifts to DRIVE on gear_cmd and engages
on /vehicle/engage (transient local, as Autoware's gate); in modes ``lights`` and ``emergency`` it also sends,
before each step's command (acknowledged), that step's vehicle commands from SCHEDULES (turn indicators and hazard
lights; emergency); in mode ``control_mode`` it calls the control mode service (a client on the DDS wire of
rmw_cyclonedds, `Client`) before steps 1, 3 and 4's commands, each awaited (CONTROL_MODE_REQUESTS), and logs the
replies. Every message it takes goes to LOG as a JSON line (topic, type, stamp and sizes). ``--take clock`` (bench/bench_ros2_agent.py) subscribes to
the same topics but takes (decodes) only /clock and the odometry and answers on them: the sensors still cross DDS
into this process, while the stack's Python decode of them (cyclonedds', about 6 ms for a full-HD image) is left out.

    python ros2_stack_fake.py LOG --preset gsim|autoware --command ackermann|twist|autoware --domain D
                              [--mode ok|hang|die:K|nan:K|disengage|park|reverse|silent|lights|emergency|control_mode]
                              [--take all|clock]

``hang``: answers nothing; ``die:K``: exits at step K (its DDS participant deleted); ``nan:K``: a NaN at step K;
``disengage``: sends engage false; ``park``, ``reverse``: shifts to PARK, REVERSE; ``silent``: sends neither gear
nor engage; ``lights``, ``emergency``: as ``ok``, with their SCHEDULES; ``control_mode``: as ``ok``, with the
CONTROL_MODE_REQUESTS.
"""
import argparse
import gc
import json
import math
import sys
import time

from cyclonedds.core import InstanceState, ReadCondition, SampleState, ViewState, WaitSet
from cyclonedds.domain import DomainParticipant
from cyclonedds.pub import DataWriter
from cyclonedds.qos import Policy, Qos
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

from gsim.bridges.ros2.agent import COMMANDS, VEHICLE_COMMANDS, VEHICLE_SERVICES, Ros2Options
from gsim.bridges.ros2.messages import endpoint_id, idl_class, message, service_class, service_message, user_data_key
from gsim.ros2_bag import ros_time

DELTA, STEER, DT, WHEELBASE = (-0.1, -0.2), 0.03, 0.1, 2.8
GEARS = {"park": 22, "reverse": 20}  # the gear a mode shifts to (else DRIVE, 2)
# a mode's vehicle commands before step k's command: {key: (field, the values at steps 0, 1, ...; then as the last)}
# lights: TurnIndicatorsCommand (NO_COMMAND 0, DISABLE 1, ENABLE_LEFT 2, ENABLE_RIGHT 3), HazardLightsCommand
# (NO_COMMAND 0, DISABLE 1, ENABLE 2); emergency: VehicleEmergencyStamped, true before steps 2 to 4's commands
SCHEDULES = {"lights": {"turn_indicators_cmd": ("command", (2, 2, 0, 3)),
                        "hazard_lights_cmd": ("command", (2, 0, 1, 1))},
             "emergency": {"emergency_cmd": ("emergency", (False, False, True, True, True, False))}}
# mode control_mode: {step: the ControlModeCommand request's mode before its command}: MANUAL (4), AUTONOMOUS (1),
# AUTONOMOUS_STEER_ONLY (2)
CONTROL_MODE_REQUESTS = {1: 4, 3: 1, 4: 2}
DEFAULT = Qos(Policy.Reliability.Reliable(0), Policy.Durability.Volatile, Policy.History.KeepLast(10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--preset", default="gsim")
    ap.add_argument("--command", default="ackermann")
    ap.add_argument("--domain", type=int, required=True)
    ap.add_argument("--mode", default="ok")
    ap.add_argument("--take", choices=["all", "clock"], default="all")
    a = ap.parse_args()
    mode, _, at = a.mode.partition(":")
    topics = Ros2Options(a.preset, a.command).topic_names(["front"], ["top"])
    dp = DomainParticipant(a.domain)
    subscribed = {topics["clock"]: ("rosgraph_msgs/msg/Clock", Qos(Policy.Reliability.BestEffort,
                                                                   Policy.History.KeepLast(1))),
                  topics["tf_static"]: ("tf2_msgs/msg/TFMessage", Qos(Policy.Reliability.Reliable(0),
                                                                      Policy.Durability.TransientLocal,
                                                                      Policy.History.KeepLast(1))),
                  topics["odometry"]: ("nav_msgs/msg/Odometry", DEFAULT),
                  topics["camera/front"] + "/image_raw": ("sensor_msgs/msg/Image", DEFAULT),
                  topics["camera/front"] + "/camera_info": ("sensor_msgs/msg/CameraInfo", DEFAULT),
                  topics["lidar/top"]: ("sensor_msgs/msg/PointCloud2", DEFAULT)}
    if a.preset == "autoware":
        subscribed[topics["velocity_status"]] = ("autoware_vehicle_msgs/msg/VelocityReport", DEFAULT)
        subscribed[topics["steering_status"]] = ("autoware_vehicle_msgs/msg/SteeringReport", DEFAULT)
        subscribed[topics["gear_status"]] = ("autoware_vehicle_msgs/msg/GearReport", DEFAULT)
        subscribed[topics["control_mode"]] = ("autoware_vehicle_msgs/msg/ControlModeReport", DEFAULT)
        subscribed[topics["turn_indicators_status"]] = ("autoware_vehicle_msgs/msg/TurnIndicatorsReport", DEFAULT)
        subscribed[topics["hazard_lights_status"]] = ("autoware_vehicle_msgs/msg/HazardLightsReport", DEFAULT)
    readers = {t: (DataReader(dp, Topic(dp, "rt" + t, idl_class(typ)), qos=qos), typ)
               for t, (typ, qos) in subscribed.items()}
    taken = readers if a.take == "all" else {t: readers[t] for t in (topics["clock"], topics["odometry"])}
    waitset = WaitSet(dp)  # (woken by a sample, not polling: the stack's own latency stays out of gsim's overhead)
    for reader, _ in taken.values():
        waitset.attach(ReadCondition(reader, SampleState.NotRead | ViewState.Any | InstanceState.Any))
    typ = COMMANDS[a.command]
    latched = Qos(Policy.Reliability.Reliable(0), Policy.Durability.TransientLocal, Policy.History.KeepLast(1))
    writer = DataWriter(dp, Topic(dp, "rt" + topics["command"], idl_class(typ)),
                        qos=latched if a.command == "autoware" else DEFAULT)  # (Autoware's control_cmd: latched)
    shift = []  # (writer, message): sent once, before the first command
    if a.preset == "autoware" and mode != "silent":
        sends = {"gear_cmd": {"command": GEARS.get(mode, 2)}, "engage": {"engage": mode != "disengage"}}
        for key, value in sends.items():
            vtyp = VEHICLE_COMMANDS[key]
            shift.append((DataWriter(dp, Topic(dp, "rt" + topics[key], idl_class(vtyp)), qos=latched),
                          message(vtyp, value)))
    scheduled = []  # (writer, type, field, values) of the mode's vehicle commands before each step's
    for key, (field, values) in SCHEDULES.get(mode, {}).items():
        vtyp = VEHICLE_COMMANDS[key]
        scheduled.append((DataWriter(dp, Topic(dp, "rt" + topics[key], idl_class(vtyp)), qos=latched), vtyp, field,
                          values))
    client = (Client(dp, topics["control_mode_request"], VEHICLE_SERVICES["control_mode_request"])
              if mode == "control_mode" else None)
    log = open(a.log, "w")
    seen = {}  # stamp (ns) -> {topic: message}
    t_static = topics["tf_static"]
    speed = {}
    while True:
        waitset.wait(duration(milliseconds=100))
        for t, (reader, rtyp) in taken.items():
            for m in reader.take(N=16):
                if not isinstance(m, idl_class(rtyp)):
                    continue
                stamp = _stamp(m)
                log.write(json.dumps({"topic": t, "type": rtyp, "stamp_ns": stamp, **_sizes(m)}) + "\n")
                log.flush()
                if t == topics["odometry"]:
                    speed[stamp] = m.twist.twist.linear.x
                if stamp is not None and t != t_static:
                    seen.setdefault(stamp, set()).add(t)
        for stamp in sorted(s for s, got in seen.items() if len(got) == len(taken) - (t_static in taken)):
            del seen[stamp]
            k = round(stamp / 1e9 / DT)
            if mode == "die" and k == int(at):
                del writer, readers, taken, waitset, dp
                gc.collect()  # the participant is deleted: the stack leaves the domain
                sys.exit(3)
            sends = shift + [(w, message(vtyp, {field: values[min(k, len(values) - 1)]}))
                             for w, vtyp, field, values in scheduled]
            for w, m in sends:
                w.write(m)
            for w, _ in sends:
                w.wait_for_acks(duration(seconds=5))  # (before the command: gsim reads them once it has that)
            shift = []
            if client is not None and k in CONTROL_MODE_REQUESTS:  # (awaited: gsim answers while it waits)
                request = {"stamp": ros_time(stamp), "mode": CONTROL_MODE_REQUESTS[k]}
                reply = client.call(request)
                log.write(json.dumps({"topic": client.reply_topic, "stamp_ns": stamp, "mode": request["mode"],
                                      "success": reply.success, "sequence_number": reply.sequence_number}) + "\n")
                log.flush()
            if mode != "hang":
                writer.write(message(typ, _command(a.command, stamp, speed[stamp], k,
                                                   math.nan if mode == "nan" and k == int(at) else 0.0)))


class Client:
    """A ROS 2 service client on the DDS wire of rmw_cyclonedds (gsim.bridges.ros2.messages' docstring): a request
    writer and a reply reader with ``clientid=ID;`` in their USER_DATA, ready once a request reader and a reply
    writer of the same ``serviceid`` are matched (rmw_cyclonedds' ``service_server_is_available``); a request
    carries its writer's instance handle and a sequence number, and its reply is the one that carries both back."""

    def __init__(self, dp, name: str, srv: str):
        qos = Qos(*DEFAULT, Policy.Userdata(f"clientid={endpoint_id(dp, 1)};".encode()))
        self.srv, self.reply_topic = srv, f"rr{name}Reply"
        self.writer = DataWriter(dp, Topic(dp, f"rq{name}Request", service_class(srv, "Request")), qos=qos)
        self.reader = DataReader(dp, Topic(dp, self.reply_topic, service_class(srv, "Response")), qos=qos)
        self.guid, self.seq = self.writer.get_instance_handle() % 2 ** 64, 0  # (a uint64; cyclonedds says int64)

    def ready(self) -> bool:
        ids = {user_data_key(self.writer.get_matched_subscription_data(h).qos, "serviceid")
               for h in self.writer.get_matched_subscriptions()} - {None}
        return any(user_data_key(self.reader.get_matched_publication_data(h).qos, "serviceid") in ids
                   for h in self.reader.get_matched_publications())

    def call(self, values: dict, timeout_s: float = 10.0):
        end = time.monotonic() + timeout_s
        while not self.ready():
            if time.monotonic() > end:
                raise TimeoutError(f"{self.srv}: no service")
            time.sleep(0.01)
        self.seq += 1
        self.writer.write(service_message(self.srv, "Request", self.guid, self.seq, values))
        while time.monotonic() < end:
            for m in self.reader.take(N=16):
                if getattr(m, "writer_guid", None) == self.guid and m.sequence_number == self.seq:
                    return m
            time.sleep(0.005)
        raise TimeoutError(f"{self.srv}: no reply to request {self.seq}")


def _stamp(m):
    for path in ("clock", "header.stamp", "stamp"):
        obj = m
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return obj.sec * 1_000_000_000 + obj.nanosec
    return None  # (TFMessage)


def _sizes(m) -> dict:
    name = type(m).__name__
    if name == "Image":
        return {"width": m.width, "height": m.height, "encoding": m.encoding, "step": m.step, "bytes": len(m.data),
                "frame_id": m.header.frame_id}
    if name == "PointCloud2":
        return {"width": m.width, "point_step": m.point_step, "bytes": len(m.data),
                "fields": [f.name for f in m.fields], "frame_id": m.header.frame_id}
    if name == "CameraInfo":
        return {"k": list(m.k), "distortion_model": m.distortion_model, "frame_id": m.header.frame_id}
    if name == "TFMessage":
        return {"children": [t.child_frame_id for t in m.transforms]}
    if name == "Odometry":
        return {"x": m.pose.pose.position.x, "speed": m.twist.twist.linear.x, "frame_id": m.header.frame_id}
    if name in ("GearReport", "TurnIndicatorsReport", "HazardLightsReport"):
        return {"report": m.report}
    if name == "ControlModeReport":
        return {"mode": m.mode}
    return {}


def _command(kind: str, stamp: int, v: float, k: int, nan: float) -> dict:
    target = v + DELTA[k % 2] + nan
    t = ros_time(stamp)
    if kind == "ackermann":
        return {"header": {"stamp": t}, "drive": {"speed": target, "steering_angle": STEER}}
    if kind == "twist":
        return {"linear": {"x": target}, "angular": {"z": target * math.tan(STEER) / WHEELBASE}}
    return {"stamp": t, "lateral": {"stamp": t, "steering_tire_angle": STEER},
            "longitudinal": {"stamp": t, "velocity": target, "acceleration": (target - v) / DT}}


if __name__ == "__main__":
    main()
