"""Reconstruction (`gsim reconstruct`): a surfel scene trained on a driving log. Data (views), model, losses,
optimisation, LiDAR rays and their fit, moving objects found without labels, checkpoints."""
