"""Evaluation of a reconstruction (`gsim eval`): held-out views, paths shifted off the driven one against the
synthetic street's exact images, and the render trajectories along a log's cameras."""
