"""Pipeline training: stages on ranks, micro-batches to shrink the bubble, schedules as data.

Modules, from the bottom up (each imports only those above it in this list):

* :mod:`~apps.pipeline.schedules` - pure generators of each rank's actions for
  naive, GPipe, 1F1B, interleaved 1F1B, looped BFS, ZB-H1, ZB-H2, ZB-V and
  DualPipeV (the last two on two chunks per rank placed in a V), printed as ``"2F0"``;
* :mod:`~apps.pipeline.timeline` - the validator (static rules and a simulated
  run that must not deadlock), planned timetables, the bubble and memory formulas;
* :mod:`~apps.pipeline.tensor` - Megatron's column- and row-parallel Linear, and
  the scatter-gather of activations between stages;
* :mod:`~apps.pipeline.model` - the MLP of blocks, its balanced split, its initial values;
* :mod:`~apps.pipeline.stage` - a stage's layers and the activations of
  micro-batches in flight (store, recompute, offload), with the rank's memory meter;
* :mod:`~apps.pipeline.offload` - activations parked in another rank's RMA window
  or node-shared window, and fetched back ahead of their backward;
* :mod:`~apps.pipeline.config` - the options, checked once, and the T x S x D layout;
* :mod:`~apps.pipeline.data` - the data each rank makes, micro-batches, the
  single-process reference;
* :mod:`~apps.pipeline.engine` - the executor: a rank's row of the schedule
  with nonblocking point-to-point, sleeping waits, measured events;
* :mod:`~apps.pipeline.measure` - busy, bubble and memory per rank and per run;
* :mod:`~apps.pipeline.checkpoints` - per-stage checkpoints, agreed across ranks;
* :mod:`~apps.pipeline.train` - sub-communicators, stages and the training loop;
* :mod:`~apps.pipeline.plots`, :mod:`~apps.pipeline.bench`,
  :mod:`~apps.pipeline.cli` - charts, the benchmark table, the command line.

The layers are :mod:`apps.nn`'s (which knows no MPI); communication is
mpicomm's public API, except one thing it does not offer yet, done with mpi4py in
:mod:`~apps.pipeline.train`: a node-shared window whose peer pieces a rank maps
(``MPI_Win_allocate_shared``).
"""
