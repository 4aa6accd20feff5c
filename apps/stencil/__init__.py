"""Structured-grid stencil solver: Cartesian decomposition, halo exchange overlapped with compute, verified, checkpointed.

    mpiexec -n 4 python -m apps.stencil --dims 2 --size 4096 --iters 1000 --halo overlap

Importable: ``solve(comm, Config(...))`` runs a problem on any communicator and
returns a :class:`Result` (rates, verification, a decomposition-free digest).
Modules: ``grid`` (decomposition), ``halo`` (the exchange plan), ``problem``
(heat and the PRK star, with their closed forms), ``solver`` (the loop),
``fieldio`` (MPI-IO checkpoints, digest, plot); kernels live in ``kernels/``.
"""

from .grid import Grid, Layout
from .halo import MODES, HaloExchange
from .problem import PROBLEMS, make
from .solver import Config, Result, solve

__all__ = ["Config", "Result", "solve", "Grid", "Layout", "HaloExchange", "MODES", "PROBLEMS", "make"]
