"""gsim.bridges: traffic-simulator and autonomy couplings: the closed loop and the doors into it.

- `closed_loop`: `closed_loop.loop.ClosedLoop` runs a closed-loop scenario (`closed_loop.scenario`) with an agent
  (`closed_loop.agents`), SUMO traffic (`closed_loop.sumo`), ego dynamics (`closed_loop.dynamics`) and metrics
  (`closed_loop.metrics`); `closed_loop.runner.run` records it (`recording`). As a Gymnasium environment (the
  ``sumo`` extra): ``gymnasium.make("gsim.bridges.closed_loop.env:gsim/ClosedLoop-v0", scenario=...)``.
- `api`: the network sensor API (`gsim serve`) and its Python client (`api.client`, the ``serve`` extra).
- `openscenario`: ASAM OpenSCENARIO files in (`openscenario.load.read_xosc`: a closed-loop scenario whose storyboard
  drives its actors) and out (`openscenario.export.export_scenario`).
- `browser`: `gsim view`; `cluster`: `gsim batch` on Ray; `recording`: run directories and MCAP files.
This package imports neither gymnasium nor SUMO, so that the network client needs neither.
"""
from gsim.moved import alias

alias(__name__, {"client": "api.client", "env": "closed_loop.env"}, warn=False)  # public paths (and the Gym id's)
alias(__name__, {**{m: f"closed_loop.{m}" for m in ("loop", "sumo", "dynamics", "road", "agents", "metrics",
                                                     "scenario", "runner")},
                 **{m: f"api.{m}" for m in ("server", "wire", "protogen", "sensor_pb2", "sensor_pb2_grpc")},
                 "viewer": "browser.viewer", "batch": "cluster.batch", "record": "recording.record",
                 "mcap_log": "recording.mcap_log", "closed_loop.openscenario": "openscenario.export"}, warn=True)
