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
* :func:`register_algorithm` and :func:`register_cost` - bring your own
  algorithm: a schedule function and its cost, registered like the built-in
  ones (``MPICOMM_ALGORITHM_MODULES=pkg.mod`` makes every process of a job
  import the module; see :mod:`mpicomm.registry` and
  ``docs/examples/torus_allreduce.py``); :func:`register_schedule_file` - an
  algorithm given as a file of schedules for one call (:mod:`mpicomm.schedule_file`);
* :func:`launch_info` - rank layout from the launcher's environment, without MPI;
* :mod:`mpicomm.cli` - the command-line conventions every mpicomm and
  application command follows (sizes, ``--json``, ``--out``, progress lines),
  public for programs built on mpicomm.

The package, layer by layer (a module imports only its own layer and those
below; ``tests/test_imports.py`` checks it). A collective call walks down once:

* **front** - what programs use: :mod:`.comm`, :mod:`.collectives`, push and
  pull (:mod:`.p2p`, :mod:`.rma`, :mod:`.rendezvous`), :mod:`.shm` pools,
  each communicator's :mod:`.state`; :mod:`.front` reads a call's arguments
  (:mod:`.front.readers`), asks the selection, gets the plan and runs it
  (:mod:`.front.dispatch`, :mod:`.front.persistent`);
* **selection** - :mod:`.selection` (which algorithm runs a call: the
  precedence, ``auto``, the choices kept per communicator), :mod:`.rules`
  (the default and the measured rules, one format), over a call's
  :mod:`.facts`;
* **plan** - :mod:`.plan.compile` binds an algorithm's schedule to a call's
  buffers once (prepared requests, scratch, reductions), with the validation
  inside its messages (:mod:`.plan.agreement`);
* **algorithms** - :mod:`.coll`: each algorithm describes a schedule
  (:mod:`.schedule`), with its cost;
* **table** - :mod:`.registry` (the algorithms, their restrictions and
  costs), :mod:`.model` (α-β-γ predictions);
* **engine** - :mod:`.engine`: one executor runs every plan, blocking,
  nonblocking and persistent alike; per communicator a queue, and a
  progress thread; requests; the hang watchdog;
* **transport** - :mod:`.transport`: how arrays reach MPI (device staging),
  buffer specs, node-shared memory;
* **floor** - facts and settings: :mod:`.catalogue`, :mod:`.config`,
  :mod:`.ops`, :mod:`.schedule` (and :mod:`.schedule_file`: schedules as files), :mod:`.launcher`,
  :mod:`.device`...

Tools stand on top: ``python -m mpicomm`` (:mod:`.__main__`, :mod:`.verify`),
:mod:`.bench`, :mod:`.tune`, and the PyTorch backend :mod:`.torch`.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The version, in this one place: setup.cfg reads it (version = attr:), CHANGES.md names it (its release rule).
__version__ = "0.1.0"

_LAZY = {
    "Comm": ("mpicomm.comm", "Comm"),
    "CartComm": ("mpicomm.comm", "CartComm"),
    "GraphComm": ("mpicomm.comm", "GraphComm"),
    "DistGraphComm": ("mpicomm.comm", "DistGraphComm"),
    "DupRequest": ("mpicomm.comm", "DupRequest"),
    "Request": ("mpicomm.engine.requests", "Request"),
    "Prequest": ("mpicomm.front.persistent", "Prequest"),
    "progress": ("mpicomm.engine.requests", "progress"),
    "Window": ("mpicomm.rma", "Window"),
    "Rendezvous": ("mpicomm.rendezvous", "Rendezvous"),
    "RemoteError": ("mpicomm.p2p", "RemoteError"),
    "algorithms": ("mpicomm.registry", "algorithms"),
    "register_algorithm": ("mpicomm.registry", "register"),
    "register_cost": ("mpicomm.registry", "cost"),
    "register_schedule_file": ("mpicomm.registry", "register_schedule_file"),
    "predict": ("mpicomm.state", "predict"),
    "launch_info": ("mpicomm.launcher", "from_environment"),
    "LaunchInfo": ("mpicomm.launcher", "LaunchInfo"),
    "bind_device": ("mpicomm.device", "bind"),
    "ArgumentError": ("mpicomm.plan.args", "ArgumentError"),
    "FreedError": ("mpicomm.state", "FreedError"),
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
