"""ASAM OpenSCENARIO (with OpenDRIVE roads) in and out of gsim (docs/scenarios.md).

- `read`: a file checked (schema, gsim's subset, references; lines in every error) and parsed with scenariogeneration
  into a `read.Plan`; `expressions` evaluates its ``${...}`` expressions.
- `lanes`: an OpenDRIVE file's lanes as polylines. `storyboard`: the plan played step by step.
- `load`: a file as a closed-loop scenario (`load.read_xosc`, `load.loop_scenario`) and as a scenario YAML.
- `export`: a gsim scenario written as OpenSCENARIO and OpenDRIVE.
"""
