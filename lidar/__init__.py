"""gsim.lidar: LiDAR sensor models and ray-surfel LiDAR rendering (issue 4).

Importing this package needs numpy only.
"""
from gsim.lidar.estimate import BeamEstimate, estimate_beams
from gsim.lidar.spec import PRESETS, SCHEMA_VERSION, LidarSpec, RayTableSpec, preset_names, spec_from_dict

__all__ = ["BeamEstimate", "LidarSpec", "PRESETS", "RayTableSpec", "SCHEMA_VERSION", "estimate_beams",
           "preset_names", "spec_from_dict"]
