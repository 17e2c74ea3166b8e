"""gsim.diffusion: diffusion-based scene expansion and harmonization."""
