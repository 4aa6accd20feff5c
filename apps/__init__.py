"""Programs built on mpicomm, each run as ``mpiexec -n N python -m apps.<name>``.

* ``apps.demo`` - a checked tour of topology, push, pull and barriers.
* ``apps.stencil`` - structured-grid solver: halo exchange overlapped with compute, verified, checkpointed.
* ``apps.mapreduce`` - a map-reduce engine (word count, inverted index), shuffle by alltoallv.
* ``apps.checkpoint`` - the checkpoint format they share: atomic files, checksums, manifest last, no pickle;
  and the check at start that every rank can write the checkpoint directory.
* ``apps.memory`` - the check before allocating that a run fits the memory available, the same on every rank.
"""
