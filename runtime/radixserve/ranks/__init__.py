"""The processes a scheduler runs in, below the scheduling policy: the scheduler process itself
(signals, its liveness heartbeat, the parent watch), and a tensor-parallel group's ranks (spawned,
watched, joined into torch.distributed, torn down) with the channel over which rank 0 publishes
the typed messages every rank applies. Nothing here decides about a request; `scheduler/`
hands in what to run."""
