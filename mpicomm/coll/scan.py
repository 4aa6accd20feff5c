"""Scan and exscan algorithms: prefix reductions over ranks.

Signature: ``algorithm(s, send, recv)``: *s* is the :class:`~mpicomm.schedule.Builder`
the algorithm describes its rounds to; *send* and *recv* are views of the
input and output, which may be the same memory (in place: nothing of *send*
is read once *recv* has been written or received into). Scan leaves
x_0 ⊕ … ⊕ x_r in rank r's *recv*; exscan leaves x_0 ⊕ … ⊕ x_{r−1} there for
r ≥ 1 and does not touch rank 0's *recv* (MPI leaves it undefined).
n = bytes of the vector, p = ranks.

Each algorithm serves both collectives through one private function
(``inclusive`` says which); the registered functions differ in what they
leave in *recv*, so each has its own docstring; exscan's recursive doubling,
which combines twice a round, has a cost function of its own.
"""

from __future__ import annotations

from ..model import Machine, ceil_lg
from ..registry import cost, register
from ..schedule import Builder, View

__all__ = ["scan_linear", "exscan_linear", "scan_recursive_doubling", "exscan_recursive_doubling"]


@register("scan", "linear")
def scan_linear(s: Builder, send: View, recv: View) -> None:
    """Linear chain: rank r receives the prefix of ranks 0 … r−1 from r−1, adds its own, passes it on.

    Steps: rank 0 sends x_0 to rank 1; rank r ≥ 1 receives
    x_0 ⊕ … ⊕ x_{r−1} from r−1 into scratch, combines it with x_r on the
    right into *recv* and sends that to r+1 (the last rank sends nothing).
    Restrictions: none - operands are combined in rank order, so
    non-commutative ops are fine; works in place; any p.
    """
    _chain(s, send, recv, inclusive=True)


@register("exscan", "linear")
def exscan_linear(s: Builder, send: View, recv: View) -> None:
    """Linear chain: rank r receives the prefix of ranks 0 … r−1 from r−1, keeps it, passes on prefix ⊕ x_r.

    Steps: rank 0 sends x_0 to rank 1 (its *recv* is not touched); rank r ≥ 1
    receives x_0 ⊕ … ⊕ x_{r−1} from r−1 - its result - and sends that ⊕ x_r
    to r+1 (the last rank, which sends nothing, receives straight into *recv*).
    Restrictions: none - operands are combined in rank order, so
    non-commutative ops are fine; works in place; any p.
    """
    _chain(s, send, recv, inclusive=False)


@register("scan", "recursive_doubling")
def scan_recursive_doubling(s: Builder, send: View, recv: View) -> None:
    """Recursive doubling (Hillis-Steele): in round k every rank sends its partial prefix 2^k ranks up.

    Steps: rank r's partial result, kept in *recv*, starts as x_r and always
    reduces a contiguous range of ranks ending at r. In round k = 0 … ⌈lg p⌉−1
    rank r sends it to r + 2^k (if that rank exists) and receives the partial
    of r − 2^k (if it exists), which covers the ranks just below its own range,
    and combines received ⊕ partial. After round k the range is
    max(0, r − 2^(k+1) + 1) … r, so after the last round it starts at rank 0.
    Restrictions: none - lower ranks' data is always on the left, so
    non-commutative ops are fine; works in place; any p (no fold: partners
    that would fall outside 0 … p−1 are skipped).
    """
    _doubling(s, send, recv, inclusive=True)


@register("exscan", "recursive_doubling")
def exscan_recursive_doubling(s: Builder, send: View, recv: View) -> None:
    """Recursive doubling (Hillis-Steele): as the scan, collecting only what arrives from lower ranks.

    Steps: as :func:`scan_recursive_doubling`, the partial (in scratch
    space; rank 0's is its input) starts as x_r and in round k goes to
    r + 2^k, while the partial of r − 2^k arrives. What arrives covers,
    round after round, the ranks
    r−1, r−3 … r−2, r−7 … r−4 …, so *recv* = received ⊕ *recv* (the first
    one straight into *recv*) builds x_0 ⊕ … ⊕ x_{r−1}; the partial
    = received ⊕ partial, needed only while a later round sends it. Rank 0
    receives nothing and its *recv* is not touched.
    Restrictions: none - lower ranks' data is always on the left, so
    non-commutative ops are fine; works in place; any p (no fold).
    """
    _doubling(s, send, recv, inclusive=False)


def _chain(s: Builder, send: View, recv: View, inclusive: bool) -> None:
    """The linear chain; *inclusive*: scan, else exscan."""
    rank, p = s.rank, s.p
    if rank == 0:
        if inclusive:
            s.copy(recv, send)
        if p > 1:
            s.send(1, send)
        return
    last = rank == p - 1
    if not inclusive and last:  # the prefix is the result, and x_r is not needed
        s.recv(rank - 1, recv)
        return
    prefix = s.empty(send.size)  # not recv: in place, recv still holds x_r
    s.recv(rank - 1, prefix)  # x_0 ⊕ … ⊕ x_{r−1}
    if inclusive:
        s.combine(prefix, send, recv)
        if not last:
            s.send(rank + 1, recv)
        return
    onward = s.empty(send.size)
    s.combine(prefix, send, onward)
    s.copy(recv, prefix)  # after x_r was read
    s.send(rank + 1, onward)


def _doubling(s: Builder, send: View, recv: View, inclusive: bool) -> None:
    """Hillis-Steele recursive doubling; *inclusive*: scan, else exscan."""
    rank, p = s.rank, s.p
    partial: View | None = None  # the last rank's exscan never sends a partial
    if inclusive:
        partial = recv
        s.copy(partial, send)
    elif rank == 0:  # receives nothing: its input is sent as it is
        partial = send
    elif rank + 1 < p:  # sent in the first round: copied before recv (maybe send itself) receives anything
        partial = s.empty(send.size)
        s.copy(partial, send)
    tmp = s.empty(send.size) if rank > (0 if inclusive else 1) else None  # exscan: round 0 lands in recv
    distance = 1
    while distance < p:
        dest, source = rank + distance, rank - distance
        sends: list[tuple[int, View]] = []
        if dest < p:
            assert partial is not None  # None only on an exscan's last rank, which sends nothing
            sends.append((dest, partial))
        got = None  # where the partial of rank − distance lands, if one comes
        if source >= 0:
            got = recv if not inclusive and distance == 1 else tmp
            assert got is not None  # tmp is None only on ranks that receive nothing after round 0
        recvs = [(source, got)] if got is not None else []
        if sends or recvs:
            s.exchange(sends, recvs)
        if got is not None:  # got: the ranks just below this rank's range
            if inclusive:
                assert partial is not None  # a scan's partial is recv
                s.combine(got, partial, partial)
            else:
                if got is not recv:
                    s.combine(got, recv, recv)
                if dest + distance < p:  # a later round still sends the partial
                    assert partial is not None
                    s.combine(got, partial, partial)
        distance *= 2


# ---------------------------------------------------------------- cost functions (n: the catalogue's size)


@cost("exscan", "recursive_doubling")
def _exscan_recursive_doubling(m: Machine, n: float, p: int) -> float:
    """⌈lg p⌉(α + nβ + 2nγ)  (two combines a round: one into the result, one into the partial)"""
    a, b = m.link(p).alpha, m.link(p).beta
    return ceil_lg(p) * (a + n * b + 2 * n * m.gamma)
