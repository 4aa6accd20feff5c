"""Programs built on mpicomm, each run as ``mpiexec -n N python -m apps.<name>``.

* ``apps.demo`` - a checked tour of topology, push, pull and barriers.
* ``apps.stencil`` - structured-grid solver: halo exchange overlapped with compute, verified, checkpointed.
* ``apps.mapreduce`` - a map-reduce engine (word count, inverted index), shuffle by alltoallv.
* ``apps.sgd`` - distributed SGD: DDP with overlapped buckets, ZeRO 1-2, parameter servers.
* ``apps.torchddp`` - PyTorch DistributedDataParallel on the mpicomm torch backend.
* ``apps.pipeline`` - pipeline training: GPipe, 1F1B, interleaved, zero-bubble and DualPipeV schedules, T x S x D ranks.
* ``apps.checkpoint`` - the checkpoint format they share: atomic files, checksums, manifest last, no pickle;
  and the check at start that every rank can write the checkpoint directory.
* ``apps.memory`` - the check before allocating that a run fits the memory available, the same on every rank.

What the applications share is written once, one concept per module:

* ``apps.options`` - the command-line options they all take (``--checkpoint-dir``, ``--restart``, ``--keep``,
  ``--checkpoint-every``, ``--hidden``, ``--backend``) and how their errors are said and end the job;
* ``apps.blocks`` - the block split of n items over p ranks (batches, grids, shards, micro-batches);
* ``apps.agree`` - a problem one rank finds raised as the same error on every rank;
* ``apps.report`` - the ``--json`` document of a run (its command as ``mpiexec -n N …``).
"""
