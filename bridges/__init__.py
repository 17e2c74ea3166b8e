"""gsim.bridges: traffic-simulator and autonomy couplings, the closed loop.

- `gsim.bridges.loop.ClosedLoop`: one run of a closed-loop scenario (`gsim.bridges.scenario`) with an agent
  (`gsim.bridges.agents`), SUMO traffic (`gsim.bridges.sumo`), ego dynamics (`gsim.bridges.dynamics`) and
  metrics (`gsim.bridges.metrics`); `gsim.bridges.runner.run` records it (`gsim.bridges.record`).
- ``gymnasium.make("gsim/ClosedLoop-v0", scenario=...)``: the same as a Gymnasium environment, registered
  here when gymnasium is installed (the ``sumo`` extra).
"""
try:
    import gymnasium
except ImportError:  # the sumo extra is not installed: no environment to register
    gymnasium = None

if gymnasium is not None and "gsim/ClosedLoop-v0" not in gymnasium.registry:
    gymnasium.register("gsim/ClosedLoop-v0", entry_point="gsim.bridges.env:ClosedLoopEnv")
