"""gsim.lidar: LiDAR sensor models, ray-surfel LiDAR rendering, the intensity / ray-drop head, metrics.

Importing this package needs numpy only (the kernels load numba, the twin torch, on first use).
"""
from gsim.lidar.estimate import BeamEstimate, estimate_beams
from gsim.lidar.heads import LidarHead
from gsim.lidar.render import LidarFrame, render_lidar, render_rays
from gsim.lidar.spec import PRESETS, SCHEMA_VERSION, LidarSpec, RayTableSpec, preset_names, spec_from_dict

__all__ = ["BeamEstimate", "LidarFrame", "LidarHead", "LidarSpec", "PRESETS", "RayTableSpec", "SCHEMA_VERSION",
           "estimate_beams", "preset_names", "render_lidar", "render_rays", "spec_from_dict"]
