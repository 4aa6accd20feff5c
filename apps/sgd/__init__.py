"""Distributed SGD: data parallelism, parameter servers and ZeRO on mpicomm's collectives.

``mpiexec -n N python -m apps.sgd train --mode ddp|ps-sync|ps-async|zero1|zero2`` trains a
model of :mod:`apps.nn` on scikit-learn's bundled digits (or a synthetic teacher network), and
``python -m apps.sgd bench`` measures the modes side by side. Modules, top-down:

* :mod:`apps.sgd.cli` - the command line (``train``, ``bench``, ``plot``);
* :mod:`apps.sgd.train` - the training loop: data, steps, evaluation, progress, metrics, checkpoints;
* :mod:`apps.sgd.ddp`, :mod:`apps.sgd.zero`, :mod:`apps.sgd.ps` - one strategy each;
* :mod:`apps.sgd.buckets` - gradient buckets (pure); :mod:`apps.sgd.data` - data sets and the sampler.
"""
