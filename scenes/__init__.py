"""gsim.scenes: driving logs (`log`, `overlay`, the synthetic street `synth`), dataset converters (`formats`),
reconstruction (`reconstruction`), evaluation (`evaluation`) and the whole demo (`demo`)."""
from gsim.moved import alias

alias(__name__, {m: f"formats.{m}" for m in ("kitti_raw", "kitti_tracking", "dgp", "nerfstudio", "waymo", "nuscenes",
                                             "av2")}, warn=False)  # the converters' modules: public paths
alias(__name__, {**{m: f"formats.{m}" for m in ("convert_util",)},
                 **{m: f"reconstruction.{m}" for m in ("train", "model", "init", "optim", "losses", "lidar_fit",
                                                       "lidar_rays", "lidar_depth", "views", "movers", "checkpoint")},
                 **{m: f"evaluation.{m}" for m in ("evaluate", "lane_shift", "render_path")}}, warn=True)
