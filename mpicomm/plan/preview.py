"""Schedules without MPI: what an algorithm would do on every rank of a call, for printing, drawing and checking.

:func:`schedule_for` describes one rank's part of a call with equal counts
(or per-rank counts for a v-form) of one element type, on a :class:`Layout` of
ranks over nodes - no communicator, no buffers. ``python -m mpicomm algorithms
--schedule``, the space-time diagram, ``python -m mpicomm verify``'s pair
check and the tests use it. Shared-memory schedules come out with their
counter waits and named steps; hierarchical ones with their nested calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import registry
from ..catalogue import family
from ..ops import BUILTIN, resolve
from ..schedule import Builder, Schedule, plain_arguments
from .args import Args, sending_order

__all__ = ["Layout", "schedule_for", "schedules_for"]


@dataclass(frozen=True)
class Layout:
    """Ranks over nodes, as a communicator's state describes them (what algorithms may read of it)."""

    size: int
    nodes: int = 1
    rank: int = 0
    node_of: tuple[int, ...] = field(default=())
    local_of: tuple[int, ...] = field(default=())

    @classmethod
    def even(cls, p: int, nodes: int = 1) -> Layout:
        """*p* ranks spread block-wise over *nodes* nodes (ranks 0 … ⌈p/nodes⌉−1 on node 0…)."""
        per = -(-p // max(1, nodes))
        node_of = tuple(r // per for r in range(p))
        local_of = tuple(r % per for r in range(p))
        return cls(p, max(node_of) + 1 if p else 1, 0, node_of, local_of)

    def at(self, rank: int) -> Layout:
        return Layout(self.size, self.nodes, rank, self.node_of, self.local_of)

    @property
    def local_rank(self) -> int:
        return self.local_of[self.rank] if self.local_of else self.rank

    @property
    def local_size(self) -> int:
        node = self.node_of[self.rank] if self.node_of else 0
        return sum(1 for n in self.node_of if n == node) if self.node_of else self.size

    @property
    def ppn(self) -> int:
        return max((sum(1 for n in self.node_of if n == k) for k in range(self.nodes)), default=self.size)

    levels = None  # (the levels' communicators exist only under MPI)


def schedule_for(collective: str, algorithm: str, p: int, rank: int, count: int = 8, *, root: int = 0,
                 counts: Sequence[int] | None = None, dtype: Any = np.float64, op: Any = "sum",
                 layout: Layout | None = None) -> Schedule:
    """Rank *rank*'s schedule of *algorithm* for *collective* on *p* ranks.

    *count*: elements per rank (per block for gather/scatter/allgather/alltoall
    and reduce_scatter_block; the whole vector otherwise); *counts*: per-rank
    counts of a v-form (default: *count* for every rank; alltoallv: every rank
    sends ``counts[s]`` elements to rank s; the neighbourhood collectives run on a periodic ring, rank r
    sending ``counts[r]`` elements to each neighbour).
    """
    steps = registry.lookup(collective, algorithm).steps
    handed: list[tuple] = []

    def fn(b: Builder, *args: Any) -> None:  # the algorithm, its arguments recorded (Schedule.arguments)
        handed.append(plain_arguments(args))
        steps(b, *args)

    fam = family(collective)
    state = (layout or Layout.even(p)).at(rank)
    red = resolve(op) if op is not None else BUILTIN["sum"]
    blocks = list(counts) if counts is not None else [count] * p
    if len(blocks) != p:
        raise ValueError(f"counts has {len(blocks)} entries for {p} ranks; give one per rank")
    displs = [sum(blocks[:r]) for r in range(p)]
    total = sum(blocks)
    v = counts is not None
    if fam in ("allreduce", "reduce", "scan", "exscan", "bcast"):
        b = Builder(collective, algorithm, rank, p, dtype, root=root, op=red, count=count, state=state,
                    send_count=count, recv_count=count)
        if fam == "bcast":
            fn(b, b.output)
        else:
            fn(b, b.input, b.output if fam != "reduce" or rank == root else None)
    elif fam in ("gather", "allgather"):
        gets = fam == "allgather" or rank == root
        b = Builder(collective, algorithm, rank, p, dtype, root=root, count=-1 if v else count, state=state,
                    send_count=blocks[rank], recv_count=total if gets else 0)
        fn(b, b.input, b.output if gets else None, blocks if gets or not v else None, displs if gets or not v else None)
    elif fam == "scatter":
        has = rank == root
        b = Builder(collective, algorithm, rank, p, dtype, root=root, count=-1 if v else count, state=state,
                    send_count=total if has else 0, recv_count=blocks[rank])
        fn(b, b.input if has else None, b.output, blocks if has or not v else None, displs if has or not v else None)
    elif fam == "alltoall":  # every rank sends counts[s] to rank s, so rank s receives counts[s] from each
        incoming = [blocks[rank]] * p
        b = Builder(collective, algorithm, rank, p, dtype, count=-1 if v else count, state=state,
                    send_count=total, recv_count=sum(incoming))
        fn(b, b.input, blocks, displs, b.output, incoming, [blocks[rank] * r for r in range(p)])
    elif fam == "reduce_scatter":
        b = Builder(collective, algorithm, rank, p, dtype, op=red, count=-1 if v else count, state=state,
                    send_count=total, recv_count=blocks[rank])
        fn(b, b.input, b.output, blocks)
    elif fam == "neighbor":  # on a periodic ring (a 1-D periodic Cartesian topology): rank r sends counts[r]
        below, above = (rank - 1) % p, (rank + 1) % p
        arriving = (blocks[below], blocks[above])
        gather = not collective.startswith("neighbor_alltoall")
        call = Args(collective, sources=(below, above), destinations=(below, above), cartesian=True,
                    sendcounts=(blocks[rank],) * 2, senddispls=(0, 0) if gather else (0, blocks[rank]))
        destinations, sendcounts, senddispls = sending_order(call)
        b = Builder(collective, algorithm, rank, p, dtype, state=state,
                    send_count=blocks[rank] * (1 if gather else 2), recv_count=sum(arriving))
        fn(b, b.input, sendcounts, senddispls, b.output, arriving, (0, arriving[0]), (below, above), destinations)
    else:
        b = Builder(collective, algorithm, rank, p, dtype, state=state)
        fn(b)
    s = b.schedule()
    s.arguments = handed[0]
    return s


def schedules_for(collective: str, algorithm: str, p: int, count: int = 8, **kwargs: Any) -> list[Schedule]:
    """Every rank's schedule (see :func:`schedule_for`)."""
    return [schedule_for(collective, algorithm, p, r, count, **kwargs) for r in range(p)]
