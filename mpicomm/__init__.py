"""mpicomm: MPI message passing for Python you can see, choose and trust.

``import mpicomm`` does not start MPI; the first use of a name that needs MPI
(``mpicomm.Comm``, ``mpicomm.Request``...) imports ``mpi4py.MPI``, which
initializes it. So ``mpicomm.launcher`` and ``mpicomm.device`` can run before
``MPI_Init`` (to pick a GPU from the launcher's local rank, for instance).

Main names:

* :class:`Comm` - an ``mpi4py.MPI.Intracomm`` with topology (``local_rank``,
  ``node``, ``nodes``, ``host``...), typed push (``send_array``/``recv_array``),
  pull (``expose`` → :class:`Window`, ``rendezvous`` → :class:`Rendezvous`) and
  barrier algorithms;
* :class:`Request` - pending operations (``Wait``/``Test``/``Waitall``), and
  :func:`progress` to advance them without blocking; :class:`Prequest` -
  persistent collectives (``comm.Allreduce_init(...)``: plan once, ``Start`` many times);
* collectives - ``Comm.Allreduce`` & co. with mpi4py's signatures plus
  ``algorithm=``, and array-first functions (:func:`allreduce`, :func:`bcast`,
  :func:`allgather`...) that return new arrays; :mod:`mpicomm.ops` for ops;
* :func:`algorithms` - registered algorithm names per collective, and
  :func:`predict` - the cost model's time for one of them
  (:func:`mpicomm.state.predict`; ``comm.machine`` is a communicator's fit);
* :func:`launch_info` - rank layout from the launcher's environment, without MPI;
* :mod:`mpicomm.cli` - the command-line conventions every mpicomm and
  application command follows (sizes, ``--json``, ``--out``, progress lines),
  public for programs built on mpicomm.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Comm": ("mpicomm.comm", "Comm"),
    "Request": ("mpicomm.requests", "Request"),
    "Prequest": ("mpicomm.coll.persistent", "Prequest"),
    "progress": ("mpicomm.requests", "progress"),
    "Window": ("mpicomm.rma", "Window"),
    "Rendezvous": ("mpicomm.rendezvous", "Rendezvous"),
    "RemoteError": ("mpicomm.p2p", "RemoteError"),
    "algorithms": ("mpicomm.registry", "algorithms"),
    "predict": ("mpicomm.state", "predict"),
    "launch_info": ("mpicomm.launcher", "from_environment"),
    "LaunchInfo": ("mpicomm.launcher", "LaunchInfo"),
    "bind_device": ("mpicomm.device", "bind"),
    "ArgumentError": ("mpicomm.coll.dispatch", "ArgumentError"),
    "ops": ("mpicomm.ops", None),
    "cli": ("mpicomm.cli", None),
}
_ARRAY_FUNCTIONS = (
    "world", "barrier", "bcast", "ibcast", "reduce", "allreduce", "iallreduce", "gather", "gatherv", "scatter",
    "scatterv", "allgather", "iallgather", "allgatherv", "alltoall", "ialltoall", "alltoallv", "reduce_scatter",
    "ireduce_scatter", "reduce_scatter_block", "scan", "exscan",
)
_LAZY.update({name: ("mpicomm.collectives", name) for name in _ARRAY_FUNCTIONS})

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'mpicomm' has no attribute {name!r}") from None
    imported = importlib.import_module(module)
    value = imported if attribute is None else getattr(imported, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
