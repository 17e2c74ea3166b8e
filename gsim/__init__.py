"""gsim: autonomous-driving sensor simulation with 2D Gaussian splatting."""
from .cameras import FisheyeCamera, OpenCVCamera, PinholeCamera, camera_from_dict
from .render import available_backends, backend_report, render_camera
from .render.common import CameraFrame, RenderOptions
from .scene import Actor, Scene, SceneFormatError, load_scene, save_scene
from .surfels import Surfels
from .lidar import LidarFrame, LidarSpec, render_lidar  # numpy-only at import: renderers load on first use

__all__ = ["Surfels", "Actor", "Scene", "SceneFormatError", "load_scene", "save_scene",
           "PinholeCamera", "OpenCVCamera", "FisheyeCamera", "camera_from_dict",
           "render_camera", "available_backends", "backend_report", "CameraFrame", "RenderOptions",
           "render_lidar", "LidarSpec", "LidarFrame"]
