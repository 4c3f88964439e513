"""Under an engine: role auto, engine defaults, a worker's life under Slurm."""
