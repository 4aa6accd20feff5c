"""Neighbourhood collective algorithms: each rank exchanges blocks with its topology's neighbours only.

Signature: ``algorithm(s, send, sendcounts, senddispls, recv, recvcounts,
recvdispls, sources, destinations)``: *s* is the
:class:`~mpicomm.schedule.Builder`; *destinations[k]* gets the block
``send[senddispls[k]:]`` (``sendcounts[k]`` elements), and the block from
*sources[k]* lands at ``recv[recvdispls[k]:]`` (``recvcounts[k]``
elements). The lists are the topology's, in MPI's order (a Cartesian
communicator: for each dimension the neighbour below, then the one above; a
graph: ``Get_neighbors``; a distributed graph: ``Get_dist_neighbors``).
One function serves all four collectives: ``neighbor_allgather(v)`` sends
the same block to every destination (every send displacement 0).

Pairing, as MPI's library does it: the k-th block a rank sends to peer q is
the k-th block q receives from that rank (its sources in order). This is what
matters when a peer appears twice - a periodic dimension of size 2, whose
neighbours below and above are the same rank, or a graph with repeated edges.
``MPI.PROC_NULL`` neighbours (the edges of a non-periodic dimension) send and
receive nothing; blocks a rank sends to itself (a periodic dimension of size
1) are copied. n = one neighbour's block, d = the rank's degree (the cost
formulas' p); no op, nothing in place (MPI has no in-place form).
"""

from __future__ import annotations

from collections.abc import Sequence

from mpi4py import MPI

from ..model import Machine
from ..registry import cost, register
from ..schedule import Builder, View
from .alltoall import _joined

__all__ = ["direct", "combined"]

_NEIGHBORHOOD = ("neighbor_allgather", "neighbor_allgatherv", "neighbor_alltoall", "neighbor_alltoallv",
                 "neighbor_alltoallw")
_NULL = MPI.PROC_NULL


def _blocks(buf: View | None, counts: Sequence[int], displs: Sequence[int]) -> list[View]:
    if buf is None:
        return []
    return [buf.part(d, d + c) for c, d in zip(counts, displs)]


def _own(s: Builder, sends: list[tuple[int, View]], recvs: list[tuple[int, View]]
         ) -> tuple[list[tuple[int, View]], list[tuple[int, View]]]:
    """Copy the blocks this rank sends itself (the k-th to the k-th) and drop MPI.PROC_NULL edges; the rest."""
    mine = [v for peer, v in sends if peer == s.rank]
    into = [v for peer, v in recvs if peer == s.rank]
    if len(mine) != len(into):
        raise ValueError(f"rank {s.rank} is {len(mine)} times its own destination but {len(into)} times its own "
                         f"source; a topology's self-edges come in pairs")
    for dst, src in zip(into, mine):
        if dst.size != src.size:
            raise ValueError(f"rank {s.rank} sends itself {src.size} elements into a block of {dst.size}; the counts "
                             f"must match")
        s.copy(dst, src)
    keep = (s.rank, _NULL)
    return [e for e in sends if e[0] not in keep], [e for e in recvs if e[0] not in keep]


def _edges(s: Builder, send: View | None, sendcounts: Sequence[int], senddispls: Sequence[int],
           recv: View | None, recvcounts: Sequence[int], recvdispls: Sequence[int],
           sources: Sequence[int], destinations: Sequence[int]) -> tuple[list[tuple[int, View]], list[tuple[int, View]]]:
    sends = list(zip(destinations, _blocks(send, sendcounts, senddispls)))
    recvs = list(zip(sources, _blocks(recv, recvcounts, recvdispls)))
    return _own(s, sends, recvs)


def direct(s: Builder, send: View | None, sendcounts: Sequence[int], senddispls: Sequence[int],
           recv: View | None, recvcounts: Sequence[int], recvdispls: Sequence[int],
           sources: Sequence[int], destinations: Sequence[int]) -> None:
    """Direct: one round posts a receive from every source and a send to every destination, block by block.

    Steps: copy the blocks a rank sends itself; then one round posts, in the
    topology's order, a receive straight into each source's block of *recv*
    and a send of each destination's block of *send* (a peer that appears k
    times gets k messages, matched in order). What MPICH's own neighbourhood
    collectives do.
    Restrictions: none (any topology, any counts).
    """
    sends, recvs = _edges(s, send, sendcounts, senddispls, recv, recvcounts, recvdispls, sources, destinations)
    if sends or recvs:
        s.exchange(sends=sends, recvs=recvs)


def combined(s: Builder, send: View | None, sendcounts: Sequence[int], senddispls: Sequence[int],
             recv: View | None, recvcounts: Sequence[int], recvdispls: Sequence[int],
             sources: Sequence[int], destinations: Sequence[int]) -> None:
    """Combined: one message per distinct neighbour, however many edges lead to it.

    Steps: copy the blocks a rank sends itself; pack the blocks for each
    distinct destination, in the topology's order, into one message (one
    copy per block into scratch, unless they already lie one after another
    in *send*); one round posts one receive per distinct source - straight
    into *recv* when its blocks lie one after another there, else into
    scratch - and one send per distinct destination; then copy each block of
    a scratch receive to its place (its size is the receiver's own count).
    With u distinct neighbours among d edges it sends u messages instead of
    d: it pays where peers repeat (periodic dimensions of size 2, graphs with
    repeated edges) and latency dominates; elsewhere it is direct.
    Restrictions: none (any topology, any counts).
    """
    sends, recvs = _edges(s, send, sendcounts, senddispls, recv, recvcounts, recvdispls, sources, destinations)
    messages_out, packing = _messages(s, sends)
    for block, part in packing:  # (before the round: round 0's local work)
        s.copy(part, block)
    messages_in, unpacking = _messages(s, recvs)
    if messages_out or messages_in:
        s.exchange(sends=messages_out, recvs=messages_in)
    for block, part in unpacking:
        s.copy(block, part)


def _messages(s: Builder, edges: list[tuple[int, View]]) -> tuple[list[tuple[int, View]], list[tuple[View, View]]]:
    """One message per distinct peer (in order of first appearance) for *edges*' blocks, in edge order: the
    blocks' own view where they lie one after another, else a scratch buffer; and the (block, its part of the
    scratch) pairs to copy in (sends) or out (receives)."""
    groups: dict[int, list[View]] = {}
    for peer, v in edges:
        groups.setdefault(peer, []).append(v)
    messages: list[tuple[int, View]] = []
    staged: list[tuple[View, View]] = []
    for peer, views in groups.items():
        joined = _joined(views)
        if joined is None:
            joined = s.empty(sum(v.size for v in views))
            at = 0
            for v in views:
                staged.append((v, joined.part(at, at + v.size)))
                at += v.size
        messages.append((peer, joined))
    return messages, staged


for _collective in _NEIGHBORHOOD:
    register(_collective, "direct", in_place=False)(direct)
    register(_collective, "combined", in_place=False)(combined)


# ---------------------------------------------------------------- cost functions (n: one block; p: the degree d)


@cost("neighbor", "direct")
def _neighbor_direct(m: Machine, n: float, p: int) -> float:
    """p·α + n·p·β  (p: this rank's degree d - d messages in flight at once, n each)"""
    link = m.link(p)
    return p * link.alpha + n * p * link.beta


@cost("neighbor", "combined")
def _neighbor_combined(m: Machine, n: float, p: int) -> float:
    """p·α + n·p·β + 2n·p·δ  (p: the degree; the worst case, every block packed and unpacked; with u distinct
    peers, u·α)"""
    return _neighbor_direct(m, n, p) + 2 * n * p * m.copy
