"""gsim.bridges: traffic-simulator and autonomy couplings (SUMO, CARLA), closed loop."""
