"""Barrier algorithms: dissemination, and the MPI library's own.

Signature: ``algorithm(call) -> Steps``. ``comm.Barrier(algorithm=...)`` runs
one to completion; ``comm.Ibarrier(algorithm=...)`` returns it as a request.
"""

from __future__ import annotations

from ..model import Machine, ceil_lg
from ..registry import cost, register
from ..requests import Step, Steps
from .call import Call
from .schedules import dissemination as dissemination_schedule

__all__ = ["dissemination", "native"]


@register("barrier", "dissemination")
def dissemination(call: Call) -> Steps:
    """Dissemination barrier (Hensgen, Finkel & Manber, 1988).

    Steps: in round k = 0 … ⌈lg p⌉−1, rank r sends an empty message to
    (r + 2^k) mod p and receives one from (r − 2^k) mod p. After round k a rank
    has heard, directly or through others, from the 2^(k+1) − 1 ranks before
    it, so after the last round from all of them.
    Restrictions: none (any p, no power-of-two folding needed).
    Cost: ⌈lg p⌉·α
    """
    for to, frm in dissemination_schedule(call.rank, call.p):
        yield call.exchange(sends=[(to, None)], recvs=[(frm, None)])


@register("barrier", "native")
def native(call: Call) -> Steps:
    """The MPI library's own barrier (``MPI_Ibarrier`` on the library duplicate).

    Steps: whatever the library does; MPICH uses a dissemination-style
    algorithm (recursive doubling with the same round count).
    Restrictions: none.
    Cost: ⌈lg p⌉·α (MPICH's algorithm; the library decides)
    """
    yield Step([call.lib.Ibarrier()])


# ---------------------------------------------------------------- cost functions (n: the catalogue's size)


@cost("barrier", "dissemination", "native")
def _barrier(m: Machine, n: float, p: int) -> float:
    """⌈lg p⌉·α"""
    return ceil_lg(p) * m.link(p).alpha
