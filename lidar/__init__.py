"""gsim.lidar: LiDAR sensor models and ray-surfel LiDAR rendering (issue 4).

Importing this package needs numpy only.
"""
from gsim.lidar.estimate import BeamEstimate, estimate_beams
from gsim.lidar.render import LidarFrame, render_lidar
from gsim.lidar.spec import PRESETS, SCHEMA_VERSION, LidarSpec, RayTableSpec, preset_names, spec_from_dict

__all__ = ["BeamEstimate", "LidarFrame", "LidarSpec", "PRESETS", "RayTableSpec", "SCHEMA_VERSION", "estimate_beams",
           "preset_names", "render_lidar", "spec_from_dict"]
