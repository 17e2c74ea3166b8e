"""gsim.bridges: traffic-simulator and autonomy couplings, the closed loop.

- `gsim.bridges.loop.ClosedLoop`: one run of a closed-loop scenario (`gsim.bridges.scenario`) with an agent
  (`gsim.bridges.agents`), SUMO traffic (`gsim.bridges.sumo`), ego dynamics (`gsim.bridges.dynamics`) and
  metrics (`gsim.bridges.metrics`); `gsim.bridges.runner.run` records it (`gsim.bridges.record`).
- ``gymnasium.make("gsim.bridges.env:gsim/ClosedLoop-v0", scenario=...)``: the same as a Gymnasium environment
  (the ``sumo`` extra), registered by `gsim.bridges.env`. This package imports neither gymnasium nor SUMO, so
  that the network client (`gsim.bridges.client`, the ``serve`` extra) needs neither.
"""
