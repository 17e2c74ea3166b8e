"""Writes the OpenSCENARIO examples of this folder with scenariogeneration (the scenarios extra), as a scenario author
outside gsim would: `python scenarios/openscenario/make_examples.py`. Each plays on the demo street
(`./quickstart.sh demo`; SceneGraphFile ../../out/demo, gsim's own road) and is the shipped YAML scenario of the same
name written in the standard, except braking_car (the issue's: a car put into the ego's lane brakes at a time) and
cut_in, whose SUV pulls out when the ego comes near (not at the start):

    gsim closed-loop scenarios/openscenario/braking_car.xosc --agent privileged --out out/closed_loop/braking-car
    gsim scenario render scenarios/openscenario/crossing.xosc
    gsim scenario import scenarios/openscenario/cut_in.xosc out/cut_in.yaml

What the YAML scenarios do that these do not: traffic asks SUMO for a traffic density (no TrafficSwarmAction in
gsim's subset); roadworks slows the street's own car ahead by re-timing its logged track, which here is a constant
speed along the lane from its logged start (it drove at a steady 8.07 m/s).
"""
import datetime
from pathlib import Path

from scenariogeneration import xosc

HERE = Path(__file__).resolve().parent
DATE = datetime.datetime(2026, 11, 28)  # (fixed: the files change only when the scenarios do)
CAR, SUV, TRUCK, MOVING_0 = (4.7, 1.9, 1.5), (4.8, 2.0, 1.75), (8.0, 2.5, 3.5), (4.05, 1.84, 1.44)  # l, w, h (m)


def vehicle(kind=xosc.VehicleCategory.car, size=CAR):
    """A vehicle whose reference point is its rear axle, 0.85 m ahead of the back of its box."""
    length, width, height = size
    box = xosc.BoundingBox(width, length, height, length / 2 - 0.85, 0.0, height / 2)
    return xosc.Vehicle("vehicle", kind, box, xosc.Axle(0.5, 0.65, width * 0.85, length - 1.7, 0.33),
                        xosc.Axle(0.0, 0.65, width * 0.85, 0.0, 0.33), 50.0, 8.0, 9.0)


def misc(kind, size):
    length, width, height = size
    return xosc.MiscObject("object", 20.0, kind, xosc.BoundingBox(width, length, height, 0.0, 0.0, height / 2))


def walker():
    return xosc.Pedestrian("walker", 75.0, xosc.PedestrianCategory.pedestrian, xosc.BoundingBox(0.6, 0.5, 1.8, 0, 0,
                                                                                                 0.9))


def speed(value, shape=xosc.DynamicsShapes.step, dimension=xosc.DynamicsDimension.time, over=0.0):
    return xosc.AbsoluteSpeedAction(value, xosc.TransitionDynamics(shape, dimension, over))


def put(x, y, h=0.0):
    return xosc.TeleportAction(xosc.WorldPosition(x, y, 0.0, h))


def at_time(name, t, point="start"):
    return xosc.ValueTrigger(name, 0, xosc.ConditionEdge.rising, xosc.SimulationTimeCondition(t, xosc.Rule.greaterThan),
                             point)


def at_start(name):
    """A trigger true from the first evaluation (time 0) on."""
    return xosc.ValueTrigger(name, 0, xosc.ConditionEdge.none, xosc.SimulationTimeCondition(0.0,
                                                                                            xosc.Rule.greaterOrEqual))


def back(size):
    """How far a vehicle()'s reference point (its rear axle) is behind its box centre."""
    return size[0] / 2 - 0.85


def path(points, name):
    t = xosc.Trajectory(name, False)
    t.add_shape(xosc.Polyline([], [xosc.WorldPosition(x, y) for x, y in points]))
    return xosc.FollowTrajectoryAction(t, xosc.FollowingMode.position)


def along(who, points):
    """An event at the start: ``who`` drives along the polyline ``points`` at its speed."""
    return (f"{who}_drives", who, [(f"{who}_path", path(points, f"{who}_path"))], at_start(f"{who}_starts"))


def write(path, entities, init, events=(), deleted=(), stop_s=4.0, params=(), scene="../../out/demo", road=None,
          minor=3):
    """An .xosc of ``entities`` {name: entity}, ``init`` [(name, action)], ``events`` [(event name, actor, [(action
    name, action)], start trigger)], the entities ``deleted`` in Init, a stop at ``stop_s`` and ``params``
    (`xosc.Parameter`s), on ``scene`` and ``road`` (relative to the file), in OpenSCENARIO 1.``minor``; its
    description (gsim's name of it) is the file's name with hyphens."""
    ents = xosc.Entities()
    for n, e in entities.items():
        ents.add_scenario_object(n, e)
    ini = xosc.Init()
    for n, a in init:
        ini.add_init_action(n, a)
    for n in deleted:
        ini.add_global_action(xosc.DeleteEntityAction(n))
    board = xosc.StoryBoard(ini, at_time("end", stop_s, "stop") if stop_s else None)
    if events:
        act = xosc.Act("act")
        for ev_name, actor, actions, trigger in events:
            ev = xosc.Event(ev_name, xosc.Priority.override if minor >= 2 else xosc.Priority.overwrite)  # (renamed)
            for a_name, a in actions:
                ev.add_action(a_name, a)
            ev.add_trigger(trigger)
            m = xosc.Maneuver(f"{ev_name}_maneuver")
            m.add_event(ev)
            g = xosc.ManeuverGroup(f"{ev_name}_group")
            g.add_actor(actor)
            g.add_maneuver(m)
            act.add_maneuver_group(g)
        story = xosc.Story("story")
        story.add_act(act)
        board.add_story(story)
    decl = xosc.ParameterDeclarations()
    for p in params:
        decl.add_parameter(p)
    path = Path(path)
    sc = xosc.Scenario(path.stem.replace("_", "-"), "gsim examples", decl, ents, board,
                       xosc.RoadNetwork(roadfile=road, scenegraph=scene), xosc.Catalog(), osc_minor_version=minor,
                       creation_date=DATE)
    sc.write_xml(str(path))


def main(out=HERE):
    """Writes the examples into ``out`` (this folder)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ego = {"ego": vehicle()}
    # (the cars drive along the street's lane, y = -1.75: gsim's own road, built along the log's 30 m of ego path,
    # leaves the reconstructed lane markings by some decimetres past them)
    write(out / "braking_car.xosc", {**ego, "braker": vehicle(), "moving_0": vehicle()},
          [("braker", put(14.0, -1.75)), ("braker", speed(7.0))],
          [along("braker", [(14.0, -1.75), (80.0, -1.75)]),
           ("brake", "braker", [("brake", speed(0.0, xosc.DynamicsShapes.linear, xosc.DynamicsDimension.rate, 5.0))],
            at_time("brake_time", "$brake_at_s"))],
          deleted=["moving_0"], stop_s=8.0,
          params=[xosc.Parameter("brake_at_s", xosc.ParameterType.double, "1.5")])
    write(out / "stopped_car.xosc", {**ego, "stopped_car": vehicle(), "moving_0": vehicle()},
          [("stopped_car", put(22.0 - back(CAR), -1.75))], deleted=["moving_0"], stop_s=6.0)
    write(out / "lead_car.xosc", {**ego, "lead_car": vehicle(size=SUV), "moving_0": vehicle()},
          [("lead_car", put(16.0 - back(SUV), -1.75)), ("lead_car", speed(4.0))],
          [along("lead_car", [(16.0 - back(SUV), -1.75), (60.0, -1.75)])], deleted=["moving_0"], stop_s=6.0)
    # the SUV pulls out of the right parking lane when the ego is 8 m (free space) behind it, speeding up to 9 m/s
    near = xosc.EntityTrigger("ego_near", 0, xosc.ConditionEdge.none, xosc.RelativeDistanceCondition(
        8.0, xosc.Rule.lessThan, xosc.RelativeDistanceType.longitudinal, "ego", freespace=True), "cut_in_suv")
    write(out / "cut_in.xosc", {**ego, "cut_in_suv": vehicle(size=SUV)},
          [("cut_in_suv", put(16.0, -4.5))],
          [("pull_out", "cut_in_suv", [("path", path([(16.0, -4.5), (20.0, -4.1), (26.0, -2.2), (32.0, -1.75),
                                                      (60.0, -1.75)], "cut_in")),
                                       ("speed_up", speed(9.0, xosc.DynamicsShapes.sinusoidal,
                                                          xosc.DynamicsDimension.time, 3.0))], near)])
    write(out / "crossing.xosc", {**ego, "walker": walker(), "cyclist": vehicle(xosc.VehicleCategory.bicycle,
                                                                                   (1.7, 0.6, 1.8)),
                                   "parked_17": vehicle()},
          [("walker", put(30.0, -4.5)), ("walker", speed(1.4)), ("cyclist", put(40.0, 3.4, 3.14159265)),
           ("cyclist", speed(5.0))],
          [("cross", "walker", [("cross", path([(30.0, -4.5), (32.0, -3.0), (38.0, 3.5)], "crossing"))],
            at_start("start")), along("cyclist", [(40.0, 3.4), (5.0, 3.4)])], deleted=["parked_17"])
    # roadworks: cones and a barrier close the lane's edge ahead, a truck parks on the right, the street's own car
    # ahead drives at 0.8 of its logged 8.07 m/s from its logged start (box centre 19.23 m) and the ego drives 0.5 m
    # further left
    cone = misc(xosc.MiscObjectCategory.obstacle, (0.4, 0.4, 0.7))
    write(out / "roadworks.xosc", {**ego, "barrier": misc(xosc.MiscObjectCategory.barrier, (2.0, 0.6, 0.8)),
                                   "cone_0": cone, "cone_1": cone, "cone_2": cone,
                                   "parked_truck": vehicle(xosc.VehicleCategory.truck, TRUCK),
                                   "moving_0": vehicle(size=MOVING_0), "parked_18": vehicle()},
          [("ego", put(0.0, -1.1)), ("barrier", put(41.0, -0.4)), ("cone_0", put(34.0, -0.6)),
           ("cone_1", put(36.5, -0.6)), ("cone_2", put(39.0, -0.6)), ("parked_truck", put(36.0 - back(TRUCK), -4.6)),
           ("moving_0", put(19.23 - back(MOVING_0), -1.75)), ("moving_0", speed(0.8 * 8.07))],
          [along("moving_0", [(19.23 - back(MOVING_0), -1.75), (80.0, -1.75)])], deleted=["parked_18"])


if __name__ == "__main__":  # (tests/test_openscenario.py checks that this writes the files of this folder)
    main()
