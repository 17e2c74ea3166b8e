"""The closed loop (`gsim closed-loop`): scenarios, agents, ego dynamics, SUMO traffic, the road, metrics, the
runner that records runs, and the Gymnasium environment (`gsim/ClosedLoop-v0`)."""
