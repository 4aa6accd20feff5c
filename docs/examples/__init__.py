"""Worked examples, importable as ``docs.examples.<name>`` from the repository root.

* :mod:`docs.examples.torus_allreduce` - a user algorithm (allreduce on a 2-D
  torus) registered with ``mpicomm.register_algorithm`` and
  ``mpicomm.register_cost``, loaded by ``MPICOMM_ALGORITHM_MODULES`` or
  ``--module``, verified with ``python -m mpicomm verify``.
* the programs the guide shows (``quickstart.py``, ``dropin.py``, ``push.py``...):
  each runs under ``mpiexec -n 2 python docs/examples/<name>.py``, checks its
  own results and prints ``<name>: ok``; ``tests/docs/test_examples.py`` runs
  every one.
"""
