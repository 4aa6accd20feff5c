"""Barrier algorithms: dissemination, and the MPI library's own.

Every barrier algorithm is a step generator ``algorithm(comm) -> Steps`` over
the communicator's private library duplicate (``comm.library_comm``), so its
messages never match the user's. ``comm.Barrier(algorithm=...)`` runs one to
completion; ``comm.Ibarrier(algorithm=...)`` returns it as a request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from mpi4py import MPI

from .registry import register
from .requests import Steps

if TYPE_CHECKING:
    from .comm import Comm

__all__ = ["dissemination_schedule", "dissemination", "native"]

_EMPTY = [None, 0, MPI.BYTE]  # a zero-byte message: the signal is its arrival


def dissemination_schedule(rank: int, p: int) -> Iterator[tuple[int, int]]:
    """``(send_to, receive_from)`` for each of the ⌈lg p⌉ rounds of rank *rank*.

    Round k pairs rank r with r + 2^k (to) and r − 2^k (from), modulo p.
    """
    distance = 1
    while distance < p:
        yield (rank + distance) % p, (rank - distance) % p
        distance *= 2


@register("barrier", "dissemination")
def dissemination(comm: "Comm") -> Steps:
    """Dissemination barrier (Hensgen, Finkel & Manber, 1988).

    Steps: in round k = 0 … ⌈lg p⌉−1, rank r sends an empty message to
    (r + 2^k) mod p and receives one from (r − 2^k) mod p. After round k a rank
    has heard, directly or through others, from the 2^(k+1) − 1 ranks before
    it, so after the last round from all of them.
    Restrictions: none (any p, no power-of-two folding needed).
    Cost: ⌈lg p⌉·α
    """
    lib = comm.library_comm
    tag = comm.collective_tag()
    for to, frm in dissemination_schedule(lib.Get_rank(), lib.Get_size()):
        yield [lib.Irecv(_EMPTY, frm, tag), lib.Isend(_EMPTY, to, tag)]


@register("barrier", "native")
def native(comm: "Comm") -> Steps:
    """The MPI library's own barrier (``MPI_Ibarrier`` on the library duplicate).

    Steps: whatever the library does; MPICH uses a dissemination-style
    algorithm (recursive doubling with the same round count).
    Restrictions: none.
    Cost: ⌈lg p⌉·α (MPICH's algorithm; the library decides)
    """
    yield [comm.library_comm.Ibarrier()]
