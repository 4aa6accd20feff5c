"""mpicomm as a ``torch.distributed`` backend: ``import mpicomm.torch``, then ``init_process_group("mpicomm")``.

::

    import mpicomm.torch                  # registers the backend "mpicomm"
    import torch.distributed as dist
    dist.init_process_group("mpicomm")    # under mpiexec / srun: rank and world size from MPI
    model = torch.nn.parallel.DistributedDataParallel(model)

Importing this module starts MPI and fills PyTorch's ``env://`` variables
that are missing (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``; :mod:`.launch`), collectively over
``MPI.COMM_WORLD``. An explicit ``init_method``, ``rank`` and ``world_size``
work too: the world group is ``MPI.COMM_WORLD`` reordered to PyTorch's ranks
(its size must be the job's). ``dist.new_group(ranks)`` makes an MPI
sub-communicator of those ranks.

Collectives (:mod:`.group`): all_reduce (SUM, AVG, PRODUCT, MIN, MAX, BAND,
BOR, BXOR, PREMUL_SUM) and its coalesced form, broadcast, reduce, all_gather
(even or uneven sizes), all_gather_into_tensor, gather, scatter,
reduce_scatter, reduce_scatter_tensor, all_to_all, all_to_all_single with split
sizes, barrier, monitored_barrier, send/recv/irecv (any source too),
batch_isend_irecv, and the object collectives built on them. Each is an
mpicomm collective with ``auto`` selection (``MPICOMM_<COLLECTIVE>_ALGORITHM``
forces one) and mpicomm's validation; asynchronous calls return a
:class:`~.work.Work` whose future the core's progress thread completes when
the operation does, so DDP's bucket all-reduces overlap backward
(:mod:`.work`; ``MPICOMM_TORCH_PROGRESS=sync`` completes every operation in
its call instead).

**Which GPU.** Making the default group binds the rank's device once, through
the communicator (:meth:`mpicomm.Comm.bind_device`: node-local rank modulo the
visible GPUs, ``MPICOMM_DEVICE`` overrides) and makes it torch's current device
too (:func:`bind_device`), so ``torch.device("cuda")`` means the rank's own GPU.
CUDA tensors are shared with mpicomm through ``__cuda_array_interface__``
(:func:`mpicomm.transport.buffers.adopt`), after torch's current stream is
waited for (the stream contract of docs/gpus.md).

**Reproducible sums.** With ``MPICOMM_REPRODUCIBLE=1``, or
``pg_options={"reproducible": True}`` for one group, all_reduce (SUM, AVG,
PREMUL_SUM), reduce, reduce_scatter and reduce_scatter_tensor on float32/64 and
complex tensors - DDP's bucket all-reduces included - give the same bits for
every algorithm and order (:mod:`mpicomm.reproducible`); other float dtypes
(float16, bfloat16) are then refused on every rank.

Nothing of torch is imported by the rest of mpicomm.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
import torch.distributed as dist
from mpi4py import MPI

from ..comm import Comm
from .group import BACKEND, ProcessGroup
from .launch import set_environment
from .tensors import DEVICES
from .work import Work

__all__ = ["BACKEND", "ProcessGroup", "Work", "bind_device", "create", "set_environment", "world_comm"]

_WORLD: dict[str, Comm] = {}


def world_comm() -> Comm:
    """The communicator of the default process group (``MPI.COMM_WORLD`` in PyTorch's rank order)."""
    if "world" not in _WORLD:
        raise RuntimeError("mpicomm backend: no default process group yet; call "
                           "torch.distributed.init_process_group('mpicomm') first")
    return _WORLD["world"]


def bind_device(comm: Comm) -> int | None:
    """Bind this rank's GPU through *comm* (CuPy's current device) and make it torch's current device too;
    the ordinal, or None without a GPU."""
    ordinal = comm.bind_device()
    if ordinal is not None and torch.cuda.is_available() and ordinal < torch.cuda.device_count():
        torch.cuda.set_device(ordinal)
    return ordinal


def create(options: Any, backend_options: Any = None) -> ProcessGroup:
    """The backend's creator (PyTorch calls it for the default group and for each ``new_group``)."""
    rank, size = options.group_rank, options.group_size
    members = list(options.global_ranks_in_group or [])
    if not members:  # the default group: the whole job, in PyTorch's rank order
        mpi_size = MPI.COMM_WORLD.Get_size()
        if size != mpi_size:
            raise ValueError(f"mpicomm backend: world_size={size} but this MPI job has {mpi_size} ranks; launch "
                             f"with mpiexec -n {size} (or pass world_size={mpi_size})")
        # Split returns a communicator of its receiver's class (an Intracomm here); mpi4py's stub says Comm
        comm = Comm(cast(MPI.Intracomm, MPI.COMM_WORLD.Split(0, rank)))
        _WORLD["world"] = comm  # a later init (after destroy_process_group) replaces it
        bind_device(comm)
    else:
        world = world_comm()
        group = world.Get_group().Incl(members)
        try:
            comm = Comm(world.Create_group(group, tag=0x6D63))
        finally:
            group.Free()
    if comm.Get_rank() != rank or comm.Get_size() != size:
        raise RuntimeError(f"mpicomm backend: PyTorch's rank {rank} of {size} is MPI rank {comm.Get_rank()} of "
                           f"{comm.Get_size()} in the new communicator")
    comm.reproducible = _reproducible(backend_options, comm.reproducible)
    return ProcessGroup(comm, getattr(options, "timeout", None))


#: What ``pg_options`` may say (``init_process_group("mpicomm", pg_options={...})``, ``new_group``).
OPTIONS = ("reproducible",)


def _reproducible(backend_options: Any, default: bool) -> bool:
    """The group's reproducible-sum setting from ``pg_options`` (a mapping of :data:`OPTIONS`), else *default*
    (``MPICOMM_REPRODUCIBLE``)."""
    if backend_options is None:
        return default
    if not isinstance(backend_options, Mapping):
        raise TypeError(f"mpicomm backend: pg_options takes a dict of {', '.join(OPTIONS)}, got "
                        f"{type(backend_options).__qualname__}; pass pg_options={{'reproducible': True}}")
    unknown = sorted(set(backend_options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"mpicomm backend: unknown pg_options {unknown}; known: {', '.join(OPTIONS)}")
    on = backend_options.get("reproducible", default)
    if not isinstance(on, bool):
        raise TypeError(f"mpicomm backend: pg_options['reproducible'] takes True or False, got {on!r}")
    return on


def _register() -> None:
    if BACKEND.upper() not in getattr(dist.Backend, "_plugins", {}):
        dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=list(DEVICES))


set_environment()
_register()
