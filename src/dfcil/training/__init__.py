"""The training core: the engine's loop (:mod:`~dfcil.training.engine`), the live run it shares with its callbacks
(:mod:`~dfcil.training.loop`), the callbacks around it (logs, timings, checkpoints, shared first tasks, synthetic
grids, inversion diagnostics), the run state and its checkpoints, and the protocol a run trains on."""
