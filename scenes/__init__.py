"""gsim.scenes: driving logs, converters, the synthetic street, reconstruction and evaluation."""
