"""Recording closed-loop runs: the run directory written step by step (images, sweeps, steps.jsonl, metrics,
video) and MCAP files with Foxglove schemas."""
