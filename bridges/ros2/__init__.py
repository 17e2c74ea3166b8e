"""ROS 2 over plain DDS (cyclonedds, the ros2 extra): the message types (`messages`) and a ROS 2 stack as a
closed-loop agent (`agent`, ``--agent ros2``)."""
