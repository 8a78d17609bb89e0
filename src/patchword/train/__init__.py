"""Training: the run config, checks before a run writes anything, the trainer and its step, checkpoints, and
the orchestration of a run directory (train, resume, evaluate)."""
