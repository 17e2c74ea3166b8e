"""A ROS 2 stack in the closed loop (gsim.bridges.ros2) over real DDS: a fake stack in its own process
(tests/ros2_stack_fake.py, cyclonedds alone) drives the ego by Ackermann, Twist and Autoware commands in lockstep;
what it receives (types, stamps = the sim clock, sizes, frames); the Autoware preset's topics, gear, engage, turn
indicators, hazard lights and emergency; a stack that never answers, dies, sends NaN or shifts to REVERSE. The IDL types
serialize exactly as rosbags' ROS 2 types do (uint8[] as bytes).

DDS stays on this machine: CYCLONEDDS_URI (here and in the stack's process) names the loopback interface, with
multicast off and 127.0.0.1 as the only peer."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cyclonedds", reason="needs the ros2 extra (cyclonedds)")
pytest.importorskip("rosbags", reason="needs the ros2 extra (rosbags)")
pytest.importorskip("libsumo", reason="needs the sumo extra")

sys.path.insert(0, str(Path(__file__).parent))
from gsim.bridges.closed_loop.dynamics import VehicleParams  # noqa: E402
from gsim.bridges.closed_loop.runner import AgentError, run  # noqa: E402
from gsim.bridges.ros2.agent import PRESETS, Ros2Options, STATUS, VEHICLE_COMMANDS  # noqa: E402
from gsim.errors import InputError  # noqa: E402
from support import scenario  # noqa: E402

# (large UDP messages and fragments: a full-HD image crosses in 100 fragments, not 4600; a socket receive buffer
# that holds a whole image where the kernel allows: no fragment dropped and resent 100 ms later; docs/ros2.md)
LOOPBACK = ("<CycloneDDS><Domain><General><Interfaces><NetworkInterface name=\"lo\"/></Interfaces>"
            "<AllowMulticast>false</AllowMulticast><MaxMessageSize>65500B</MaxMessageSize>"
            "<FragmentSize>62000B</FragmentSize></General><Internal><SocketReceiveBufferSize max=\"8MiB\"/>"
            "</Internal><Discovery><ParticipantIndex>auto</ParticipantIndex>"
            "<Peers><Peer address=\"127.0.0.1\"/></Peers></Discovery></Domain></CycloneDDS>")
DOMAIN = 100 + os.getpid() % 100  # (another session's tests on this machine keep to their own domain)
STACK = Path(__file__).with_name("ros2_stack_fake.py")
DELTA, STEER = (-0.1, -0.2), 0.03  # the fake stack's speed changes (even, odd steps) and steering angle


@pytest.fixture(autouse=True)
def loopback_dds(monkeypatch):
    monkeypatch.setenv("CYCLONEDDS_URI", LOOPBACK)


@pytest.fixture
def stack(tmp_path):
    """Starts the fake stack (``stack(command, preset, mode)``) and returns its log's path; stopped at the end."""
    procs = []

    def start(command="ackermann", preset="gsim", mode="ok"):
        log = tmp_path / f"stack-{len(procs)}.jsonl"
        procs.append(subprocess.Popen([sys.executable, str(STACK), str(log), "--preset", preset, "--command", command,
                                       "--domain", str(DOMAIN), "--mode", mode], env={**os.environ}))
        return log

    yield start
    for p in procs:
        p.kill()
        p.wait()


def steps(out):
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def received(log):
    return [json.loads(line) for line in log.read_text().splitlines()]


def drive(loop_street, tmp_path, name, steps_n=5, **options):
    return run(scenario(loop_street, name), "ros2", tmp_path / name, progress=False, max_steps=steps_n, video=False,
               agent_options={"ros2": Ros2Options(domain_id=DOMAIN, **options)})


def check_followed(rows):
    """Each step's speed changed by the command that answered the step before it (lockstep), at the steering."""
    v = [r["ego"]["speed_mps"] for r in rows]
    for k in range(1, len(rows)):
        assert v[k] - v[k - 1] == pytest.approx(DELTA[(k - 1) % 2], abs=1e-4), k
    assert all(abs(r["ego"]["steer_rad"] - STEER) < 1e-6 for r in rows[1:])


@pytest.mark.parametrize("command", ["ackermann", "twist"])
def test_a_stack_drives_in_lockstep_and_receives_the_step(loop_street, tmp_path, stack, command):
    log = stack(command)
    m = drive(loop_street, tmp_path, command, command=command)
    assert m["completed"] and m["steps"] == 5
    rows = steps(tmp_path / command)
    check_followed(rows)
    got = received(log)
    times = [r["t_us"] * 1000 for r in rows[:-1]]  # (the last step's observation ends the run: it is not sent)
    by_topic = {}
    for g in got:
        by_topic.setdefault(g["topic"], []).append(g)
    assert [g["stamp_ns"] for g in by_topic["/clock"]] == times  # every step's clock, in order
    for topic in ("/gsim/ego/odom", "/gsim/camera/front/image_raw", "/gsim/camera/front/camera_info",
                  "/gsim/lidar/top/points"):
        assert [g["stamp_ns"] for g in by_topic[topic]] == times, topic
    img = by_topic["/gsim/camera/front/image_raw"][0]
    assert (img["width"], img["height"], img["encoding"], img["step"], img["bytes"]) == (96, 60, "rgb8", 288, 17280)
    assert img["frame_id"] == "camera_front_optical_frame"
    cloud = by_topic["/gsim/lidar/top/points"][0]
    assert cloud["width"] > 100 and cloud["bytes"] == 24 * cloud["width"] and cloud["point_step"] == 24
    assert cloud["fields"] == ["x", "y", "z", "intensity", "ring", "time"]
    assert by_topic["/gsim/camera/front/camera_info"][0]["distortion_model"] == "plumb_bob"
    assert sorted(by_topic["/tf_static"][0]["children"]) == ["camera_front_optical_frame", "lidar_top"]
    odom = by_topic["/gsim/ego/odom"]
    assert [o["speed"] for o in odom] == pytest.approx([r["ego"]["speed_mps"] for r in rows[:-1]])


@pytest.mark.parametrize("mode,topics", [("ok", ()), ("silent", (("gear_cmd", ""),)), ("lights", ())])
def test_the_autoware_preset_speaks_awsims_topics_and_autowares_control(loop_street, tmp_path, stack, mode, topics):
    """The stack shifts to DRIVE (and engages) before its first command; or sends no gear, and gear_cmd is off; or
    also sends turn indicators and hazard lights before each command (the stack's SCHEDULES), which the reports echo
    from the next step on as AWSIM's: (turn, hazard) commands (LEFT, ENABLE), (LEFT, NO_COMMAND), (NO_COMMAND,
    DISABLE), (RIGHT, DISABLE) report turn DISABLE (the hazard lights have the lamps), LEFT (back once they are
    off), DISABLE (NO_COMMAND puts them out), RIGHT."""
    names = Ros2Options("autoware").topic_names(["front"], ["top"])
    assert names == {"clock": "/clock", "tf": "/tf", "tf_static": "/tf_static",
                     "odometry": "/localization/kinematic_state", "camera/front": "/sensing/camera/front",
                     "lidar/top": "/sensing/lidar/top/pointcloud_raw_ex",
                     "velocity_status": "/vehicle/status/velocity_status",
                     "steering_status": "/vehicle/status/steering_status",
                     "gear_status": "/vehicle/status/gear_status", "control_mode": "/vehicle/status/control_mode",
                     "turn_indicators_status": "/vehicle/status/turn_indicators_status",
                     "hazard_lights_status": "/vehicle/status/hazard_lights_status",
                     "command": "/control/command/control_cmd", "gear_cmd": "/control/command/gear_cmd",
                     "engage": "/vehicle/engage", "turn_indicators_cmd": "/control/command/turn_indicators_cmd",
                     "hazard_lights_cmd": "/control/command/hazard_lights_cmd",
                     "emergency_cmd": "/control/command/emergency_cmd",
                     "control_mode_request": "/control/control_mode_request"}
    assert STATUS["velocity_status"] == "autoware_vehicle_msgs/msg/VelocityReport"
    log = stack("autoware", "autoware", mode)
    m = drive(loop_street, tmp_path, mode, preset="autoware", topics=topics)
    assert m["completed"] and m["steps"] == 5
    rows = steps(tmp_path / mode)
    check_followed(rows)
    got = received(log)
    types = {g["topic"]: g["type"] for g in got}
    assert types["/sensing/lidar/top/pointcloud_raw_ex"] == "sensor_msgs/msg/PointCloud2"
    assert types["/sensing/camera/front/image_raw"] == "sensor_msgs/msg/Image"
    assert types["/vehicle/status/steering_status"] == "autoware_vehicle_msgs/msg/SteeringReport"
    assert types["/vehicle/status/turn_indicators_status"] == "autoware_vehicle_msgs/msg/TurnIndicatorsReport"
    assert types["/vehicle/status/hazard_lights_status"] == "autoware_vehicle_msgs/msg/HazardLightsReport"
    n = len(rows) - 1  # (the first step's status is from before the stack's first gear: PARK, where it is read)
    assert reports(got) == ([2] * n if topics else [22] + [2] * (n - 1), [1] * n)  # DRIVE; AUTONOMOUS
    lights = ([1, 1, 2, 1, 3], [1, 2, 1, 1, 1]) if mode == "lights" else ([1] * n, [1] * n)  # (the first: DISABLE)
    assert (reported(got, "turn_indicators_status"), reported(got, "hazard_lights_status")) == lights
    stamps = [g["stamp_ns"] for g in got if g["topic"] == "/vehicle/status/velocity_status"]
    assert stamps == [r["t_us"] * 1000 for r in rows[:-1]]


def reported(got, status, field="report"):
    """The ``field`` of each /vehicle/status/``status`` message the stack received, in order."""
    return [g[field] for g in got if g["topic"] == f"/vehicle/status/{status}"]


def reports(got):
    """The gear_status reports and the control_mode modes the stack received, in order."""
    return reported(got, "gear_status"), reported(got, "control_mode", "mode")


@pytest.mark.parametrize("mode,gear,control_mode", [("disengage", 2, 4), ("park", 22, 1), ("silent", 22, 1)])
def test_an_autoware_stack_that_disengages_parks_or_never_shifts_brakes_the_ego_to_a_stop(loop_street, tmp_path,
                                                                                          stack, mode, gear,
                                                                                          control_mode):
    """Engage false (MANUAL), PARK, or no gear at all (PARK, as AWSIM starts): the command does not drive."""
    log = stack("autoware", "autoware", mode=mode)
    m = drive(loop_street, tmp_path, mode, steps_n=12, preset="autoware")
    assert m["completed"] and m["steps"] == 12  # (the stack's commands answer every step: the run goes on)
    rows = steps(tmp_path / mode)
    v = [r["ego"]["speed_mps"] for r in rows]
    brake = VehicleParams().max_decel_mps2 * (rows[1]["t_us"] - rows[0]["t_us"]) / 1e6
    assert v[0] > brake and v[-1] == 0.0  # braked from speed to a standstill at the full deceleration
    assert v[1:] == pytest.approx([max(a - brake, 0.0) for a in v[:-1]], abs=1e-6)
    assert rows[-1]["ego"]["x_m"] == rows[-2]["ego"]["x_m"]  # and holds there
    assert {r["ego"]["steer_rad"] for r in rows} == {rows[0]["ego"]["steer_rad"]}  # the command's steering unused
    n = len(rows) - 1
    assert reports(received(log)) == ([22] + [gear] * (n - 1), [1] + [control_mode] * (n - 1))


def test_an_autoware_stack_in_emergency_brakes_the_ego_as_awsim(loop_street, tmp_path, stack):
    """emergency_cmd true before steps 2 to 4's commands (the stack's SCHEDULES), false before step 5's: the
    commands of steps 2 to 4 are set aside and the ego brakes at AWSIM's 3 m/s^2 (its steering held); from step 5 it
    follows the commands again."""
    stack("autoware", "autoware", "emergency")
    m = drive(loop_street, tmp_path, "emergency", steps_n=8, preset="autoware")
    assert m["completed"] and m["steps"] == 8
    rows = steps(tmp_path / "emergency")
    v = [r["ego"]["speed_mps"] for r in rows]
    brake = 3.0 * (rows[1]["t_us"] - rows[0]["t_us"]) / 1e6
    assert v[2] > 3 * brake  # (the emergency's three steps brake without reaching a standstill)
    for k in range(1, len(rows)):  # (step k's speed: step k - 1's command, or the emergency)
        expected = v[k - 1] - brake if k - 1 in (2, 3, 4) else v[k - 1] + DELTA[(k - 1) % 2]
        assert v[k] == pytest.approx(expected, abs=1e-4), k
    assert all(abs(r["ego"]["steer_rad"] - STEER) < 1e-6 for r in rows[1:])


def test_an_autoware_stack_switches_the_control_mode_through_the_service(loop_street, tmp_path, stack):
    """The stack calls /control/control_mode_request (ControlModeCommand, on rmw_cyclonedds' DDS wire) before steps
    1, 3 and 4's commands, awaiting each reply (the stack's CONTROL_MODE_REQUESTS): MANUAL succeeds (the ego brakes
    at its full deceleration from step 1, MANUAL reported from step 2), AUTONOMOUS succeeds (the commands drive again
    from step 3), AUTONOMOUS_STEER_ONLY is not supported (failure; still AUTONOMOUS)."""
    log = stack("autoware", "autoware", "control_mode")
    m = drive(loop_street, tmp_path, "control_mode", steps_n=7, preset="autoware")
    assert m["completed"] and m["steps"] == 7
    rows = steps(tmp_path / "control_mode")
    v = [r["ego"]["speed_mps"] for r in rows]
    brake = VehicleParams().max_decel_mps2 * (rows[1]["t_us"] - rows[0]["t_us"]) / 1e6
    assert v[1] > 2 * brake
    for k in range(1, len(rows)):  # (step k's speed: step k - 1's command, or the brakes while MANUAL)
        expected = v[k - 1] - brake if k - 1 in (1, 2) else v[k - 1] + DELTA[(k - 1) % 2]
        assert v[k] == pytest.approx(expected, abs=1e-4), k
    got = received(log)
    replies = [(g["mode"], g["success"], g["sequence_number"]) for g in got
               if g["topic"] == "rr/control/control_mode_requestReply"]
    assert replies == [(4, True, 1), (1, True, 2), (2, False, 3)]
    assert reported(got, "control_mode", "mode") == [1, 1, 4, 4, 1, 1, 1]


@pytest.mark.parametrize("mode,match,kept", [
    ("hang", r"step 1: .*/ackermann_cmd \(ackermann_msgs/msg/AckermannDriveStamped\), step 0 \(sim time 0.000 s\): "
             r"no command within 1.5 s", 1),
    ("die:2", r"step 3: .*/ackermann_cmd .*step 2 \(sim time 0.200 s\): the stack's publisher left", 3),
    ("nan:1", r"step 2: .*/ackermann_cmd .*step 1: the command has a non-finite speed = nan", 2),
    ("reverse", r"step 1: .*/control/command/gear_cmd \(autoware_vehicle_msgs/msg/GearCommand\), step 0: REVERSE "
                r"\(20\): gsim's ego does not drive backwards", 1),
])
def test_a_stack_that_hangs_dies_sends_nan_or_reverses_stops_the_run_and_keeps_it(loop_street, tmp_path, stack, mode,
                                                                                   match, kept):
    command, preset = ("autoware", "autoware") if mode == "reverse" else ("ackermann", "gsim")
    stack(command, preset, mode)
    name = mode.replace(":", "")
    with pytest.raises(AgentError, match=match):
        drive(loop_street, tmp_path, name, deadline_s=1.5 if mode == "hang" else 20.0, preset=preset)
    assert json.loads((tmp_path / name / "metrics.json").read_text())["completed"] is False
    assert len(steps(tmp_path / name)) == kept  # the start and every completed step


@pytest.mark.parametrize("command", ["closed-loop", "batch closed-loop"])
def test_a_batch_runs_its_ros2_episodes_one_at_a_time_against_the_one_stack(loop_street, tmp_path, stack, command):
    """`gsim closed-loop SCENARIO --seed 0,1 --agent ros2` (the runs in this process) and `gsim batch closed-loop`
    (Ray, two workers: the ros2 episodes one at a time) with the --ros2-* flags: each run follows the one stack in
    lockstep, and the stack sees the runs one after the other (each one's clock from 0), never two worlds at once."""
    if command.startswith("batch"):
        pytest.importorskip("ray", reason="gsim batch needs Ray (the cluster extra)")
        flags = ["--agents", "ros2", "--seeds", "0,1", "--num-cpus", "2"]
    else:
        flags = ["--agent", "ros2", "--seed", "0,1", "--no-video"]
    from gsim.cli import main
    log = stack()
    out = tmp_path / "batch"
    assert main([*command.split(), scenario(loop_street, "twice"), "--out", str(out), "--steps", "25",
                 "--ros2-domain-id", str(DOMAIN), "--ros2-deadline-s", "20", *flags]) == 0
    runs = [steps(out / "twice" / "ros2" / f"seed{k}") for k in (0, 1)]
    for rows in runs:
        assert len(rows) == 26
        check_followed(rows)
    clock = [g["stamp_ns"] for g in received(log) if g["topic"] == "/clock"]
    assert clock == [r["t_us"] * 1000 for rows in runs for r in rows[:-1]]  # run 0's steps, then run 1's


def test_no_stack_is_named_with_the_topic_and_domain(loop_street, tmp_path):
    with pytest.raises(AgentError, match=rf"step 0: .*no stack publishes /cmd_vel .* domain {DOMAIN} within 0.5 s"):
        drive(loop_street, tmp_path, "none", command="twist", deadline_s=0.5)


def test_the_idl_types_serialize_as_ros2s_cdr():
    """Every type gsim speaks, byte for byte as rosbags serializes the same message (ROS 2's CDR)."""
    from gsim.bridges.ros2.agent import COMMANDS
    from gsim.bridges.ros2.messages import Writer, idl_class, message, typestore
    from gsim.ros2_bag import build
    ts = typestore()
    values = {"sensor_msgs/msg/Image": {"header": {"stamp": {"sec": 3, "nanosec": 7}, "frame_id": "c"}, "height": 1,
                                        "width": 2, "encoding": "rgb8", "step": 6,
                                        "data": np.arange(6, dtype=np.uint8)},
              "sensor_msgs/msg/CameraInfo": {"k": np.arange(9.0), "d": [0.1, 0.2], "distortion_model": "plumb_bob"},
              "nav_msgs/msg/Odometry": {"pose": {"pose": {"position": {"x": 1.5}}}, "child_frame_id": "base_link"},
              "tf2_msgs/msg/TFMessage": {"transforms": [{"child_frame_id": "a"}, {"child_frame_id": "b"}]},
              "sensor_msgs/msg/PointCloud2": {"fields": [{"name": "x", "datatype": 7, "count": 1}],
                                              "data": np.arange(8, dtype=np.uint8), "is_dense": True},
              "rosgraph_msgs/msg/Clock": {"clock": {"sec": 9}}}
    values.update({typ: {} for typ in (*COMMANDS.values(), *STATUS.values(), *VEHICLE_COMMANDS.values())})
    for typ, v in values.items():
        assert idl_class(typ).__idl_typename__ == "{}::msg::dds_::{}_".format(*typ.split("/msg/"))
        assert message(typ, v).serialize() == bytes(ts.serialize_cdr(build(ts, typ, v), typ)), typ
    # uint8[] moves as bytes both ways, and the type (what DDS matches readers and writers on) is still uint8[]
    from cyclonedds.idl import make_idl_struct
    for typ in ("sensor_msgs/msg/Image", "sensor_msgs/msg/PointCloud2"):
        ours = idl_class(typ)
        stock = make_idl_struct(typ.split("/")[-1], ours.__idl_typename__, dict(ours.__annotations__))
        assert ours.__idl__.get_type_id() == stock.__idl__.get_type_id()
        back = ours.deserialize(message(typ, values[typ]).serialize())
        assert back.data == values[typ]["data"].tobytes()
        assert stock.deserialize(message(typ, values[typ]).serialize()).data == list(values[typ]["data"])
    # the agent's Writer serializes into one buffer kept for a topic: the same CDR (padded to 4 bytes, as
    # cyclonedds' DataWriter sends it), whatever it held before (a longer frame_id: the padding after it rewritten)
    kept = Writer(None).buffer
    longer = {**values["sensor_msgs/msg/Image"], "header": {"frame_id": "camera_front_optical_frame"}}
    for typ, v in [("sensor_msgs/msg/Image", longer), *values.items()] * 2:
        cdr = bytes(ts.serialize_cdr(build(ts, typ, v), typ))
        assert bytes(message(typ, v).serialize(buffer=kept)) == cdr + bytes(-len(cdr) % 4), typ
    stamped = message("autoware_control_msgs/msg/Control", {"longitudinal": {"acceleration": -1.25}})
    assert math.isclose(type(stamped).deserialize(stamped.serialize()).longitudinal.acceleration, -1.25)


def test_the_service_samples_are_rmw_cyclonedds_request_header_and_message():
    """A ControlModeCommand request and reply as rmw_cyclonedds' serdata.cpp writes them: the CDR header, the request
    header (the client's writer handle as uint64, the sequence number as int64; little-endian here, as the
    encapsulation says) and then the message's CDR (rosbags', whose alignment the 16 bytes keep); the DDS type names
    ``pkg::srv::dds_::Srv_Request_`` / ``_Response_``; the endpoints' ids as rmw_cyclonedds formats them."""
    import re
    import struct
    from cyclonedds.domain import DomainParticipant
    from gsim.bridges.ros2.agent import VEHICLE_SERVICES
    from gsim.bridges.ros2.messages import endpoint_id, service_class, service_message, typestore
    from gsim.ros2_bag import build
    ts, srv = typestore(), VEHICLE_SERVICES["control_mode_request"]
    assert srv == "autoware_vehicle_msgs/srv/ControlModeCommand"
    guid, seq = 0xFEDCBA9876543210, 42  # (a handle with its top bit set: a uint64)
    for part, v in (("Request", {"stamp": {"sec": 3, "nanosec": 7}, "mode": 4}), ("Response", {"success": True})):
        name = f"ControlModeCommand_{part}"
        assert service_class(srv, part).__idl_typename__ == f"autoware_vehicle_msgs::srv::dds_::{name}_"
        typ = f"autoware_vehicle_msgs/msg/{name}"
        cdr = bytes(ts.serialize_cdr(build(ts, typ, v), typ))
        sample = service_message(srv, part, guid, seq, v)
        assert cdr[:4] == b"\x00\x01\x00\x00"  # (CDR, little-endian)
        assert sample.serialize() == cdr[:4] + struct.pack("<Qq", guid, seq) + cdr[4:]
        back = type(sample).deserialize(sample.serialize())
        assert (back.writer_guid, back.sequence_number) == (guid, seq)
    assert re.fullmatch(r"[0-9a-f]{2}(\.[0-9a-f]{1,2}){15}", endpoint_id(DomainParticipant(DOMAIN), 3))


def test_bad_ros2_options_are_refused_before_anything_starts():
    with pytest.raises(InputError, match="preset"):
        Ros2Options("carla")
    with pytest.raises(InputError, match="command"):
        Ros2Options(command="joy")
    with pytest.raises(InputError, match="unknown key 'velocity_status'"):
        Ros2Options(topics=(("velocity_status", "/v"),))  # the gsim preset has no vehicle status
    with pytest.raises(InputError, match="starts with '/'"):
        Ros2Options(topics=(("command", "cmd"),))
    with pytest.raises(InputError, match="deadline"):
        Ros2Options(deadline_s=0)
    assert set(PRESETS) == {"gsim", "autoware"}
