"""PyTorch DistributedDataParallel on the mpicomm backend: the program a PyTorch user runs.

``mpiexec -n N python -m apps.torchddp train`` trains an MLP or a small
``TransformerEncoder`` classifier with ``torch.nn.parallel.DistributedDataParallel``
on ``dist.init_process_group("mpicomm")`` (``--dist-backend gloo`` for PyTorch's
own), on synthetic data labelled by a fixed random teacher; ``--check`` compares
the result with one process on the whole batch, ``--checkpoint-every``/``--restart``
continue a run bit for bit. ``python -m apps.torchddp bench`` times DDP's step
on mpicomm and gloo in the same run. Modules, top-down:

* :mod:`apps.torchddp.cli` - the command line (``train``, ``bench``);
* :mod:`apps.torchddp.train` - the training loop, metrics, the single-process check, checkpoint verdicts;
* :mod:`apps.torchddp.bench` - mpicomm against gloo, interleaved, with the parameter check;
* :mod:`apps.torchddp.checkpoint` - atomic, checksummed checkpoint files, the newest ``--keep`` kept;
* :mod:`apps.torchddp.models` - the MLP and the Transformer classifier;
* :mod:`apps.torchddp.data` - the teacher's batches (:mod:`apps.blocks` splits a global batch over ranks).

Only this package's command line needs MPI; the models, data and checkpoint
modules need PyTorch alone.
"""
