"""Barrier algorithms: dissemination, and the MPI library's own.

Signature: ``algorithm(s)``: *s* is the :class:`~mpicomm.schedule.Builder` the
algorithm describes its rounds to (a barrier moves no data).
``comm.Barrier(algorithm=...)`` runs the schedule to completion;
``comm.Ibarrier(algorithm=...)`` returns it as a request.
"""

from __future__ import annotations

from typing import Any

from ..model import Machine, ceil_lg
from ..registry import cost, register
from ..schedule import Builder
from .patterns import dissemination as dissemination_schedule

__all__ = ["dissemination", "native"]


@register("barrier", "dissemination")
def dissemination(s: Builder) -> None:
    """Dissemination barrier (Hensgen, Finkel & Manber, 1988).

    Steps: in round k = 0 … ⌈lg p⌉−1, rank r sends an empty message to
    (r + 2^k) mod p and receives one from (r − 2^k) mod p
    (:func:`~mpicomm.coll.patterns.dissemination`). After round k a rank
    has heard, directly or through others, from the 2^(k+1) − 1 ranks before
    it, so after the last round from all of them.
    Restrictions: none (any p, no power-of-two folding needed).
    """
    nothing = s.empty(0)
    for to, frm in dissemination_schedule(s.rank, s.p):
        s.exchange(sends=[(to, nothing)], recvs=[(frm, nothing)])


def _ibarrier(comm: Any) -> Any:
    return comm.Ibarrier()


@register("barrier", "native")
def native(s: Builder) -> None:
    """The MPI library's own barrier (``MPI_Ibarrier`` on the library duplicate).

    Steps: one round that waits for the library's nonblocking barrier,
    started on the communicator's private duplicate. MPICH uses a
    dissemination-style algorithm (recursive doubling with the same round
    count).
    Restrictions: none.
    """
    s.library(_ibarrier, "MPI_Ibarrier on the communicator's private duplicate")


# ---------------------------------------------------------------- cost functions (n: the catalogue's size)


@cost("barrier", "dissemination", "native")
def _barrier(m: Machine, n: float, p: int) -> float:
    """⌈lg p⌉·α  (native: MPICH's algorithm; the library decides)"""
    return ceil_lg(p) * m.link(p).alpha
