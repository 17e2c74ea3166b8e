"""gsim.lidar: LiDAR sensor models and ray-surfel LiDAR rendering (issue 4)."""
