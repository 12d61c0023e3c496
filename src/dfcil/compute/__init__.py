"""How a run computes, below everything that trains: the device and the engine's switches (:mod:`~dfcil.compute.
runtime`), several processes (:mod:`~dfcil.compute.distributed`), CUDA graphs (:mod:`~dfcil.compute.graphs`),
optimisers (:mod:`~dfcil.compute.optim`) and precision (:mod:`~dfcil.compute.precision`). The synthesizers, the
methods and the engine all use them."""
