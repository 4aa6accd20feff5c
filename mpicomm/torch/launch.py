"""Rank, world size and a rendezvous address for ``torch.distributed``, taken from MPI.

``dist.init_process_group("mpicomm")`` with no ``init_method`` reads
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (PyTorch's
``env://``, which starts a TCP key-value store on the master). Under
``mpiexec`` or ``srun`` nobody has set them; :func:`set_environment` sets the
missing ones from MPI: the rank and size of ``MPI.COMM_WORLD``, ``LOCAL_RANK``
and ``LOCAL_WORLD_SIZE`` from the node's ranks, the master's address
(``127.0.0.1`` when the job is on one node, else rank 0's host name) and a
port rank 0 found free, broadcast to the others. Values already in the
environment are kept (a user's explicit ``MASTER_PORT`` wins), except those
this module set in a parent process (named in ``MPICOMM_TORCH_SET``): a job
started from a program that imported :mod:`mpicomm.torch` gets its own. It is
collective over ``MPI.COMM_WORLD``: every rank imports :mod:`mpicomm.torch`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

from mpi4py import MPI

__all__ = ["set_environment", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port no process listens on now (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]  # (host, port) for AF_INET
        return port


def set_environment(env: MutableMapping[str, str] | None = None, comm: MPI.Intracomm | None = None) -> dict[str, str]:
    """Fill PyTorch's ``env://`` variables from MPI where they are missing; return the values in effect."""
    env = os.environ if env is None else env
    comm = MPI.COMM_WORLD if comm is None else comm
    for name in env.get(_MARK, "").split(","):  # set by mpicomm in a parent process: not the user's
        if name in _NAMES:
            env.pop(name, None)
    before = set(env)
    rank, size = comm.Get_rank(), comm.Get_size()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        local_rank, local_size = node.Get_rank(), node.Get_size()
    finally:
        node.Free()
    one_node = comm.allreduce(local_size, op=MPI.MIN) == size
    need = "MASTER_ADDR" not in env or "MASTER_PORT" not in env
    if comm.allreduce(need, op=MPI.LOR):
        address = "127.0.0.1" if one_node else socket.gethostname()
        port = free_port("127.0.0.1" if one_node else "") if rank == 0 else 0
        address, port = comm.bcast((address, port), root=0)
        env.setdefault("MASTER_ADDR", address)
        env.setdefault("MASTER_PORT", str(port))
    env.setdefault("RANK", str(rank))
    env.setdefault("WORLD_SIZE", str(size))
    env.setdefault("LOCAL_RANK", str(local_rank))
    env.setdefault("LOCAL_WORLD_SIZE", str(local_size))
    env[_MARK] = ",".join(name for name in _NAMES if name not in before)
    return {k: env[k] for k in _NAMES}


_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_MARK = "MPICOMM_TORCH_SET"
