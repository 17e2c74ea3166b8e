"""A ROS 2 stack as a closed-loop agent (``--agent ros2``) over plain DDS with cyclonedds (the ros2 extra; no ROS
installation): each step gsim publishes the step's /clock, sensors, odometry and tf on ROS 2 topics, then waits for
the stack's command for that step, in lockstep like CARLA's synchronous mode: the world never runs ahead of the
stack.

A step at sim time t: publish /clock (t), /tf (map -> base_link), the odometry, each camera's image_raw (rgb8) and
camera_info, each LiDAR's PointCloud2 (`gsim.ros2_bag`'s messages and frames; /tf_static of the sensors once, at the
start, transient local) and, in the ``autoware`` preset, the vehicle status Autoware's vehicle interface reads; then
take the command that answers t: a stamped type (AckermannDriveStamped, Autoware's Control) by its stamp (older
ones are skipped), a Twist (no stamp) as the first one after publishing. The command becomes the ego's dynamics
inputs (`controls`): Ackermann's steering angle and speed (its acceleration and steering angle velocity as limits
where not 0), a Twist's linear.x as the speed and angular.z as the bicycle's steering angle at that speed, Autoware's
steering tire angle and acceleration (as AWSIM drives with it). A run starts once the stack's command publisher
(and its /clock subscription) are discovered.

The ``autoware`` preset's vehicle is AWSIM's: it also reads /control/command/gear_cmd (GearCommand) and
/vehicle/engage (Engage), the last of each sent up to a step's command acting from that step on, and reports them
on gear_status (the last commanded gear) and control_mode (AUTONOMOUS while engaged, MANUAL once disengaged). It
starts as AWSIM's: in PARK, engaged (AWSIM reports AUTONOMOUS from its start and takes engage true only; gsim
also takes engage false, as a vehicle interface that can disengage). The command drives the ego only when engaged
and in a forward gear (DRIVE, DRIVE_2..18, LOW); in NEUTRAL it only brakes (no drive force, as AWSIM's vehicle);
disengaged, or in PARK (or NONE), the ego brakes to a stop at its full deceleration and holds there, its steering
held (AWSIM freezes a parked vehicle at once). A stack that never shifts out of PARK leaves the ego standing and
the run completes; with gear_cmd switched off (``--ros2-topic gear_cmd=``) the vehicle starts in DRIVE, for a
stack that sends no gear (as the gsim preset's vehicle is). REVERSE is a `Ros2Error`: gsim's ego dynamics stop at 0 m/s.
It also reads /control/command/turn_indicators_cmd and hazard_lights_cmd and reports them on turn_indicators_status
and hazard_lights_status, as AWSIM does: the last of each sent up to a step's command, reported from the next step
on; ENABLE_LEFT / ENABLE_RIGHT and ENABLE light them, any other command (DISABLE, NO_COMMAND) puts them out; the
hazard lights take the indicators' lamps, so while they are on the indicators report DISABLE (and the last
indicator command shows again once they are off). Both start DISABLE. They change nothing in the ego's motion.
It reads /control/command/emergency_cmd (tier4_vehicle_msgs VehicleEmergencyStamped) as AWSIM 1.x does: while the
last one sent up to a step's command is true, the command is set aside and the ego brakes at AWSIM's emergency
deceleration (`EMERGENCY_DECEL_MPS2`) to a stop, its steering held; false, the command drives again. The gear and
mode still act on top (NEUTRAL brakes the same; PARK or disengaged, at the full deceleration).
It serves /control/control_mode_request (autoware_vehicle_msgs ControlModeCommand, on rmw_cyclonedds' DDS wire:
`messages.ServiceServer`) as a vehicle interface does: AUTONOMOUS engages and MANUAL disengages (as engage true and
false: control_mode reports them, MANUAL brakes the ego to a stop), each replying success; other modes change
nothing and reply failure (AWSIM replies success to every mode). The last request answered up to a step's command
acts from that step on; requests are answered while gsim waits for the command too (a stack may await the reply
before it commands).

A stack that never starts, never answers, leaves (its command publisher gone) or commands a non-finite number is a
`Ros2Error` naming the topic and the step; the runner keeps every completed step (as for egodriver).

QoS: gsim offers reliable, volatile, keep last 10 on every topic (a best-effort subscriber, e.g. AWSIM's sensor
and clock QoS or rclcpp's ClockQoS, takes it too); /tf_static transient local, keep last 1. It reads the command,
gear, engage, turn indicators, hazard lights and emergency reliable and volatile (a transient-local publisher, as
Autoware's control_cmd and gear_cmd are, matches too; what a stack sent before the run started is not seen). DDS
settings are the user's own (CYCLONEDDS_URI); the domain is ``domain_id`` (ROS_DOMAIN_ID by default).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from gsim.errors import InputError
from gsim.ros2_bag import (BASE, MAP, camera_info, cloud, header, image, lidar_points, odometry, ros_time,
                           topic_token, transform)

from ..closed_loop.dynamics import Controls, yaw_rate
from .messages import (CONTROL_MODE_AUTONOMOUS, CONTROL_MODE_MANUAL, DRIVE_GEARS, GEAR_DRIVE, GEAR_NEUTRAL, GEAR_PARK,
                       HAZARD_DISABLE, HAZARD_ENABLE, REVERSE_GEARS, TURN_DISABLE, TURN_LEFT, TURN_RIGHT, message)

COMMANDS = {"ackermann": "ackermann_msgs/msg/AckermannDriveStamped", "twist": "geometry_msgs/msg/Twist",
            "autoware": "autoware_control_msgs/msg/Control"}
PRESETS = {  # topic keys -> names; camera/NAME and lidar/NAME are per sensor (TOKEN: `topic_token` of NAME)
    "gsim": {"clock": "/clock", "tf": "/tf", "tf_static": "/tf_static", "odometry": "/gsim/ego/odom",
             "camera": "/gsim/camera/{}", "lidar": "/gsim/lidar/{}/points",
             "command": {"ackermann": "/ackermann_cmd", "twist": "/cmd_vel",
                         "autoware": "/control/command/control_cmd"}},
    # AWSIM's topics (its ROS 2 topic list), with the ground-truth pose as Autoware's localization output
    "autoware": {"clock": "/clock", "tf": "/tf", "tf_static": "/tf_static", "odometry": "/localization/kinematic_state",
                 "camera": "/sensing/camera/{}", "lidar": "/sensing/lidar/{}/pointcloud_raw_ex",
                 "velocity_status": "/vehicle/status/velocity_status",
                 "steering_status": "/vehicle/status/steering_status", "gear_status": "/vehicle/status/gear_status",
                 "control_mode": "/vehicle/status/control_mode",
                 "turn_indicators_status": "/vehicle/status/turn_indicators_status",
                 "hazard_lights_status": "/vehicle/status/hazard_lights_status",
                 "command": "/control/command/control_cmd", "gear_cmd": "/control/command/gear_cmd",
                 "engage": "/vehicle/engage", "turn_indicators_cmd": "/control/command/turn_indicators_cmd",
                 "hazard_lights_cmd": "/control/command/hazard_lights_cmd",
                 "emergency_cmd": "/control/command/emergency_cmd",
                 "control_mode_request": "/control/control_mode_request"},
}
DEFAULT_COMMAND = {"gsim": "ackermann", "autoware": "autoware"}
STATUS = {"velocity_status": "autoware_vehicle_msgs/msg/VelocityReport",
          "steering_status": "autoware_vehicle_msgs/msg/SteeringReport",
          "gear_status": "autoware_vehicle_msgs/msg/GearReport",
          "control_mode": "autoware_vehicle_msgs/msg/ControlModeReport",
          "turn_indicators_status": "autoware_vehicle_msgs/msg/TurnIndicatorsReport",
          "hazard_lights_status": "autoware_vehicle_msgs/msg/HazardLightsReport"}
VEHICLE_COMMANDS = {"gear_cmd": "autoware_vehicle_msgs/msg/GearCommand", "engage": "autoware_vehicle_msgs/msg/Engage",
                    "turn_indicators_cmd": "autoware_vehicle_msgs/msg/TurnIndicatorsCommand",
                    "hazard_lights_cmd": "autoware_vehicle_msgs/msg/HazardLightsCommand",
                    "emergency_cmd": "tier4_vehicle_msgs/msg/VehicleEmergencyStamped"}
VEHICLE_SERVICES = {"control_mode_request": "autoware_vehicle_msgs/srv/ControlModeCommand"}  # (served)
EMERGENCY_DECEL_MPS2 = 3.0  # AWSIM's vehicle in an emergency (VehicleRos2Input's emergencyDeceleration)
STANDSTILL_MPS = 0.1  # a Twist's yaw rate gives no steering angle below this speed
SETTLE_S = 0.3  # the stack's subscriptions unchanged this long: all of them discovered


class Ros2Error(InputError):
    """The ROS 2 stack failed the loop: names the topic and the step."""


@dataclass(frozen=True)
class Ros2Options:
    """``--agent ros2``'s settings: the topic ``preset`` (gsim or autoware), the ``command`` type (ackermann,
    twist, autoware; None: the preset's), the DDS ``domain_id`` (None: ROS_DOMAIN_ID, else 0), each step's
    ``deadline_s`` for the command (and the start's for the stack to appear) and ``topics``: (KEY, NAME) overrides
    of the preset's names (keys: clock, tf, tf_static, odometry, command, camera/SENSOR, lidar/SENSOR and the
    autoware preset's status topics, vehicle commands and services, `STATUS`, `VEHICLE_COMMANDS` and
    `VEHICLE_SERVICES`; an empty NAME publishes, reads or serves nothing there)."""

    preset: str = "gsim"
    command: Optional[str] = None
    domain_id: Optional[int] = None
    deadline_s: float = 10.0
    topics: Tuple[Tuple[str, str], ...] = ()

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise InputError(f"ROS 2 preset: expected one of {', '.join(PRESETS)}, got {self.preset!r}")
        if self.command is not None and self.command not in COMMANDS:
            raise InputError(f"ROS 2 command: expected one of {', '.join(COMMANDS)}, got {self.command!r}")
        if self.domain_id is not None and not 0 <= self.domain_id <= 232:
            raise InputError(f"ROS 2 domain id: expected 0-232, got {self.domain_id}")
        if not (isinstance(self.deadline_s, (int, float)) and math.isfinite(self.deadline_s) and self.deadline_s > 0):
            raise InputError(f"ROS 2 deadline: expected a time > 0 s, got {self.deadline_s!r}")
        known = set(PRESETS[self.preset]) - {"camera", "lidar"}
        for key, name in self.topics:
            if key not in known and not key.startswith(("camera/", "lidar/")):
                raise InputError(f"--ros2-topic {key}={name}: unknown key {key!r}; the {self.preset} preset's: "
                                 f"{', '.join(sorted(known))}, camera/SENSOR, lidar/SENSOR")
            if name and not name.startswith("/"):
                raise InputError(f"--ros2-topic {key}={name}: a topic name starts with '/'")

    @property
    def command_type(self) -> str:
        return self.command or DEFAULT_COMMAND[self.preset]

    def topic_names(self, cameras, lidars) -> Dict[str, str]:
        """{key: topic} for the rig's ``cameras`` and ``lidars`` (names): the preset's, then the overrides; a
        camera's is the prefix of its image_raw and camera_info."""
        p = PRESETS[self.preset]
        names = {k: v for k, v in p.items() if k not in ("camera", "lidar", "command")}
        names["command"] = p["command"][self.command_type] if isinstance(p["command"], dict) else p["command"]
        names.update({f"camera/{n}": p["camera"].format(topic_token(n)) for n in cameras})
        names.update({f"lidar/{n}": p["lidar"].format(topic_token(n)) for n in lidars})
        names.update(dict(self.topics))
        if not names["command"]:
            raise InputError("--ros2-topic command=: the stack's command topic cannot be switched off")
        return names


def controls(state, params, dt: float, steer_rad: float, speed_mps: Optional[float] = None,
             accel_mps2: Optional[float] = None, max_accel_mps2: float = 0.0, max_steer_rate_rps: float = 0.0
             ) -> Controls:
    """The ego's inputs for a step of ``dt`` s towards a commanded steering angle (rad, left positive) and speed
    (m/s) or acceleration (m/s^2), within the vehicle's limits, as a vehicle interface would: the steering moves
    to the angle, the speed to the target within the step where the limits allow. ``max_accel_mps2`` and
    ``max_steer_rate_rps`` > 0 (AckermannDrive's acceleration and steering_angle_velocity) limit them further."""
    a = accel_mps2 if accel_mps2 is not None else (speed_mps - state.speed_mps) / dt
    if max_accel_mps2 > 0:
        a = min(max(a, -max_accel_mps2), max_accel_mps2)
    a = min(max(a, -params.max_decel_mps2), params.max_accel_mps2)
    limit = min(max_steer_rate_rps, params.max_steer_rate_rps) if max_steer_rate_rps > 0 else params.max_steer_rate_rps
    steer = min(max(steer_rad, -params.max_steer_rad), params.max_steer_rad)
    rate = min(max((steer - state.steer_rad) / dt, -limit), limit)
    return Controls(float(a), float(rate))


class Ros2Agent:
    """The closed-loop agent speaking ROS 2 over DDS (see the module's docstring)."""

    name = "ros2"

    def __init__(self, options: Ros2Options = Ros2Options()):
        self.options = options
        self.participant = None

    # ------------------------------------------------------------------ the session
    def reset(self, info) -> None:
        from cyclonedds.core import ReadCondition, SampleState, ViewState, InstanceState, WaitSet
        from cyclonedds.domain import DomainParticipant
        from cyclonedds.pub import DataWriter
        from cyclonedds.qos import Policy, Qos
        from cyclonedds.sub import DataReader
        from cyclonedds.topic import Topic
        from .messages import ServiceServer, Writer, idl_class
        o = self.options
        self.info, self.dt_us = info, int(round(info.step_s * 1e6))
        self.domain = o.domain_id if o.domain_id is not None else int(os.environ.get("ROS_DOMAIN_ID", "0") or 0)
        self.topics = o.topic_names(info.cameras, info.T_vehicle_lidar)
        self.participant = dp = DomainParticipant(self.domain)
        default = Qos(Policy.Reliability.Reliable(0), Policy.Durability.Volatile, Policy.History.KeepLast(10))
        latched = Qos(Policy.Reliability.Reliable(0), Policy.Durability.TransientLocal, Policy.History.KeepLast(1))
        self.writers = {}

        def writer(topic: str, typ: str, qos=default):
            if topic and topic not in self.writers:
                self.writers[topic] = (Writer(DataWriter(dp, Topic(dp, "rt" + topic, idl_class(typ)), qos=qos)), typ)

        t = self.topics
        writer(t["clock"], "rosgraph_msgs/msg/Clock")
        writer(t["tf"], "tf2_msgs/msg/TFMessage")
        writer(t["tf_static"], "tf2_msgs/msg/TFMessage", latched)
        writer(t["odometry"], "nav_msgs/msg/Odometry")
        self.cameras = {n: (cam, T_vc, t[f"camera/{n}"], f"camera_{topic_token(n)}_optical_frame")
                        for n, (cam, T_vc) in info.cameras.items()}
        for _, _, prefix, _ in self.cameras.values():
            if prefix:
                writer(prefix + "/image_raw", "sensor_msgs/msg/Image")
                writer(prefix + "/camera_info", "sensor_msgs/msg/CameraInfo")
        self.lidars = {n: (T_vl, t[f"lidar/{n}"], f"lidar_{topic_token(n)}")
                       for n, T_vl in info.T_vehicle_lidar.items()}
        for _, topic, _ in self.lidars.values():
            writer(topic, "sensor_msgs/msg/PointCloud2")
        for key, typ in STATUS.items():
            writer(t.get(key, ""), typ)
        self.command_type = COMMANDS[o.command_type]
        self.command_topic = t["command"]
        self.command_class = idl_class(self.command_type)
        self.reader = DataReader(dp, Topic(dp, "rt" + self.command_topic, self.command_class), qos=default)
        self.vehicle_readers = {key: (DataReader(dp, Topic(dp, "rt" + t[key], idl_class(typ)), qos=default),
                                      idl_class(typ)) for key, typ in VEHICLE_COMMANDS.items() if t.get(key)}
        self.engaged, self.gear = True, GEAR_PARK if t.get("gear_cmd") else GEAR_DRIVE
        self.turn, self.hazard, self.emergency = TURN_DISABLE, HAZARD_DISABLE, False
        self.services = {key: ServiceServer(dp, t[key], srv, default, number=i + 1)
                         for i, (key, srv) in enumerate(VEHICLE_SERVICES.items()) if t.get(key)}
        self.waitset = WaitSet(dp)
        for reader in (self.reader, *(s.reader for s in self.services.values())):  # (a request wakes it too)
            self.waitset.attach(ReadCondition(reader, SampleState.NotRead | ViewState.Any | InstanceState.Any))
        self._wait_for_stack()
        if t["tf_static"]:
            mounts = [transform(BASE, frame, 0, T_vc) for _, T_vc, _, frame in self.cameras.values()]
            mounts += [transform(BASE, frame, 0, T_vl) for T_vl, _, frame in self.lidars.values()]
            self._write(t["tf_static"], {"transforms": mounts})

    def _wait_for_stack(self) -> None:
        """Until the stack's command publisher (and a /clock subscriber, where /clock is published) are discovered,
        and then the subscriptions on every topic gsim publishes (and the publishers of the vehicle commands it
        reads, and the clients of its services) have stayed as they are for `SETTLE_S`: a stack's endpoints are
        discovered one by one, and a step published before its image subscription matched is lost to it (volatile),
        which a lockstep stack would wait for forever (at most until the deadline)."""
        clock = self.writers.get(self.topics["clock"])
        end = time.monotonic() + self.options.deadline_s
        seen, since = None, 0.0
        while True:
            now = time.monotonic()
            matched = (tuple(w.writer.get_publication_matched_status().current_count
                             for w, _ in self.writers.values())
                       + tuple(r.get_subscription_matched_status().current_count
                               for r in (*(r for r, _ in self.vehicle_readers.values()),
                                         *(s.reader for s in self.services.values())))
                       + tuple(s.writer.get_publication_matched_status().current_count
                               for s in self.services.values()))
            if matched != seen:
                seen, since = matched, now
            if (self.reader.get_subscription_matched_status().current_count > 0
                    and (clock is None or clock[0].writer.get_publication_matched_status().current_count > 0)):
                if now - since >= SETTLE_S or now > end:
                    return
            elif now > end:
                raise Ros2Error(f"ros2: no stack publishes {self.command_topic} ({self.command_type}) and subscribes "
                                f"{self.topics['clock']} in DDS domain {self.domain} within "
                                f"{self.options.deadline_s:g} s (is it running, on ROS_DOMAIN_ID={self.domain}, and "
                                f"does DDS reach it: CYCLONEDDS_URI, the network interface?)")
            time.sleep(0.01)

    def close(self) -> None:
        """Leave the DDS domain (cyclonedds deletes the entities with their last reference)."""
        self.participant = self.writers = self.reader = self.vehicle_readers = self.services = self.waitset = None

    # ------------------------------------------------------------------ a step
    def act(self, obs) -> Controls:
        k, ns = obs.step, obs.timestamp_us * 1000
        self._take(self.reader, self.command_class)  # what came before this step's /clock answers no step of it
        self._publish(obs, ns)
        m = self._command(k, ns)
        self._take_vehicle(k)
        return self._vehicle(self._controls(m, obs, k), obs.ego)

    def _write(self, topic: str, values: dict) -> None:
        if topic:
            w, typ = self.writers[topic]
            w.write(message(typ, values))

    def _publish(self, obs, ns: int) -> None:
        t, s, p = self.topics, obs.ego, self.info.params
        w = yaw_rate(s, p)
        self._write(t["clock"], {"clock": ros_time(ns)})
        self._write(t["tf"], {"transforms": [transform(MAP, BASE, ns, obs.T_world_vehicle)]})
        self._write(t["odometry"], odometry(ns, obs.T_world_vehicle, ((s.speed_mps, 0.0, 0.0), (0.0, 0.0, w))))
        for n, rgb in obs.cameras.items():
            cam, _, prefix, frame = self.cameras[n]
            if prefix:
                self._write(prefix + "/image_raw", image(ns, frame, rgb))
                self._write(prefix + "/camera_info", camera_info(cam, ns, frame))
        for n, pts in obs.lidars.items():  # (the sweep spun over the step that ends now, as the ROS 2 bag has it)
            _, topic, frame = self.lidars[n]
            rec = lidar_points(pts[:, :3], pts[:, 3], obs.lidar_rings[n], pts[:, 4].astype(np.int64) - self.dt_us)
            self._write(topic, cloud(ns, frame, rec))
        stamp = ros_time(ns)
        self._write(t.get("velocity_status", ""), {"header": header(ns, BASE), "longitudinal_velocity": s.speed_mps,
                                                    "heading_rate": w})
        reports = {"steering_status": {"steering_tire_angle": s.steer_rad}, "gear_status": {"report": self.gear},
                   "control_mode": {"mode": CONTROL_MODE_AUTONOMOUS if self.engaged else CONTROL_MODE_MANUAL},
                   # (one set of lamps, as AWSIM's vehicle: the hazard lights take them from the indicators)
                   "turn_indicators_status": {"report": TURN_DISABLE if self.hazard == HAZARD_ENABLE else self.turn},
                   "hazard_lights_status": {"report": self.hazard}}
        for key, values in reports.items():
            self._write(t.get(key, ""), {"stamp": stamp, **values})

    @staticmethod
    def _take(reader, cls) -> list:
        return [m for m in reader.take(N=64) if isinstance(m, cls)]

    def _take_vehicle(self, k: int) -> None:
        """The gear, engage, turn indicators, hazard lights and emergency the stack sent up to step ``k``'s command
        (the last of each counts; an indicator or hazard command other than an ENABLE, NO_COMMAND too, switches it
        off, as AWSIM takes them), and the control mode requests (`_serve`)."""
        self._serve()
        for key, (reader, cls) in self.vehicle_readers.items():
            for m in self._take(reader, cls):
                if key == "engage":
                    self.engaged = bool(m.engage)
                elif key == "emergency_cmd":
                    self.emergency = bool(m.emergency)
                elif key == "turn_indicators_cmd":
                    self.turn = m.command if m.command in (TURN_LEFT, TURN_RIGHT) else TURN_DISABLE
                elif key == "hazard_lights_cmd":
                    self.hazard = HAZARD_ENABLE if m.command == HAZARD_ENABLE else HAZARD_DISABLE
                elif m.command in REVERSE_GEARS:
                    raise Ros2Error(f"ros2: {self.topics[key]} ({VEHICLE_COMMANDS[key]}), step {k}: REVERSE "
                                    f"({m.command}): gsim's ego does not drive backwards (its dynamics stop at 0 m/s)")
                else:
                    self.gear = m.command

    def _command(self, k: int, ns: int):
        """The stack's command answering sim time ``ns`` (step ``k``'s /clock), within the deadline."""
        from cyclonedds.util import duration
        where = f"ros2: {self.command_topic} ({self.command_type}), step {k} (sim time {ns / 1e9:.3f} s)"
        end = time.monotonic() + self.options.deadline_s
        while True:
            self._serve()  # (a stack may wait for its request's reply before it commands)
            for m in self._take(self.reader, self.command_class):
                if self.command_type == COMMANDS["twist"]:
                    return m
                stamp = m.header.stamp if hasattr(m, "header") else m.stamp
                got = stamp.sec * 1_000_000_000 + stamp.nanosec
                if got == ns:
                    return m
                if got > ns:
                    raise Ros2Error(f"{where}: a command stamped {got / 1e9:.3f} s answers a time gsim has not "
                                    f"published (a stamped command answers the /clock it was computed for)")
            if self.reader.get_subscription_matched_status().current_count == 0:
                raise Ros2Error(f"{where}: the stack's publisher left (did the stack exit?)")
            left = end - time.monotonic()
            if left <= 0:
                raise Ros2Error(f"{where}: no command within {self.options.deadline_s:g} s")
            self.waitset.wait(duration(seconds=min(left, 0.05)))

    def _serve(self) -> None:
        """Answers the requests waiting at the services gsim serves (`VEHICLE_SERVICES`)."""
        handlers = {"control_mode_request": self._control_mode}
        for key, service in self.services.items():
            service.serve(handlers[key])

    def _control_mode(self, request) -> dict:
        """A control mode request (ControlModeCommand) as a vehicle interface takes it: AUTONOMOUS engages and
        MANUAL disengages (as /vehicle/engage true and false), each replying success; other modes change nothing and
        reply failure (AWSIM replies success to them too)."""
        if request.mode not in (CONTROL_MODE_AUTONOMOUS, CONTROL_MODE_MANUAL):
            return {"success": False}
        self.engaged = request.mode == CONTROL_MODE_AUTONOMOUS
        return {"success": True}

    def _controls(self, m, obs, k: int) -> Controls:
        """The command as the ego's inputs (`controls`)."""
        if self.command_type == COMMANDS["ackermann"]:
            d = m.drive
            values = {"steering_angle": d.steering_angle, "speed": d.speed, "acceleration": d.acceleration,
                      "steering_angle_velocity": d.steering_angle_velocity}
        elif self.command_type == COMMANDS["twist"]:
            values = {"linear.x": m.linear.x, "angular.z": m.angular.z}
        else:
            lon = m.longitudinal
            values = {"lateral.steering_tire_angle": m.lateral.steering_tire_angle,
                      "longitudinal.velocity": lon.velocity, "longitudinal.acceleration": lon.acceleration}
        bad = [f"{f} = {v}" for f, v in values.items() if not math.isfinite(v)]
        if bad:
            raise Ros2Error(f"ros2: {self.command_topic} ({self.command_type}), step {k}: the command has a "
                            f"non-finite {', '.join(bad)}")
        s, p, dt = obs.ego, self.info.params, self.info.step_s
        if self.command_type == COMMANDS["ackermann"]:  # acceleration and steering_angle_velocity: 0 = no limit
            return controls(s, p, dt, values["steering_angle"], speed_mps=values["speed"],
                            max_accel_mps2=abs(values["acceleration"]),
                            max_steer_rate_rps=abs(values["steering_angle_velocity"]))
        if self.command_type == COMMANDS["twist"]:  # the bicycle's steering angle for the yaw rate at that speed
            v, w = values["linear.x"], values["angular.z"]
            steer = math.atan(p.wheelbase_m * w / v) if abs(v) > STANDSTILL_MPS else s.steer_rad
            return controls(s, p, dt, steer, speed_mps=v)
        # Autoware's: the acceleration drives, as AWSIM's vehicle and Autoware's vehicle interfaces take it
        return controls(s, p, dt, values["lateral.steering_tire_angle"],
                        accel_mps2=values["longitudinal.acceleration"])

    def _vehicle(self, c: Controls, s) -> Controls:
        """The command's inputs ``c`` as the vehicle applies them in its gear and mode, the ego in state ``s`` (see
        the module's docstring)."""
        if self.emergency:  # (AWSIM sets the command aside and brakes, the steering held where it is)
            c = controls(s, self.info.params, self.info.step_s, s.steer_rad, accel_mps2=-EMERGENCY_DECEL_MPS2)
        if self.engaged and self.gear in DRIVE_GEARS:
            return c
        if self.engaged and self.gear == GEAR_NEUTRAL:
            return Controls(min(c.accel_mps2, 0.0), c.steer_rate_rps)
        return controls(s, self.info.params, self.info.step_s, s.steer_rad, speed_mps=0.0)
