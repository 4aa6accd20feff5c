"""The catalogue of collectives: one row per collective, the facts every other module reads.

A row says what a collective *is*, independent of any algorithm: its family
(the v-forms and ``reduce_scatter_block`` run their family's algorithms), the
mpi4py methods that name it (blocking, nonblocking, persistent), whether it
has a root, whether it reduces, whether it takes per-rank counts, what *n*
means for it (the one definition of the message size that the selection
table, the cost formulas, the benchmarks and the trace all use), and the
signature of its algorithms.

This module imports nothing of mpicomm: it is the floor everything stands on.

The size rules (``Collective.size``):

* ``"vector"`` - the whole vector every rank holds: bcast, reduce, allreduce,
  scan, exscan;
* ``"block"`` - one rank's block: gather(v), scatter(v) (a call touches p
  blocks: the working set is n·p);
* ``"gathered"`` - everything gathered (all p blocks): allgather(v);
* ``"send"`` - each rank's whole send buffer: alltoall(v);
* ``"input"`` - the whole input of one rank: reduce_scatter(_block);
* ``"edge"`` - one neighbour's block: the neighbourhood collectives, whose
  ranks talk to their topology's neighbours only (a call touches d blocks,
  d the rank's degree; their cost formulas read p as d);
* ``"none"`` - barrier moves no data.

The neighbourhood collectives (``neighbor=True``) are methods of mpi4py's
topology communicators (``MPI.Topocomm``), not of every intracommunicator.
The w-forms (``alltoallw``, ``neighbor_alltoallw``: a datatype per block,
displacements in bytes) run their family's algorithms on bytes: their
element type is ``uint8`` and their counts are byte counts.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Collective", "CATALOGUE", "COLLECTIVES", "ROOTED", "REDUCING", "VECTORED", "NEIGHBORHOOD", "row", "family",
           "SIGNATURES", "SIZE_RULES"]


#: One signature per family: what every algorithm of it is called with (arrays flat; counts in elements).
SIGNATURES = {
    "barrier": "(call)",
    "bcast": "(call, buf)",
    "reduce": "(call, send, recv)",
    "allreduce": "(call, send, recv)",
    "scan": "(call, send, recv)",
    "exscan": "(call, send, recv)",
    "gather": "(call, send, recv, counts, displs)",
    "scatter": "(call, send, recv, counts, displs)",
    "allgather": "(call, send, recv, counts, displs)",
    "alltoall": "(call, send, sendcounts, senddispls, recv, recvcounts, recvdispls)",
    "reduce_scatter": "(call, send, recv, counts)",
    "neighbor": "(call, send, sendcounts, senddispls, recv, recvcounts, recvdispls, sources, destinations)",
}

#: What n means, per size rule (see the module docstring).
SIZE_RULES = {
    "vector": "the whole vector",
    "block": "one rank's block",
    "gathered": "everything gathered (all p blocks)",
    "send": "each rank's whole send buffer",
    "input": "each rank's whole input",
    "edge": "one neighbour's block (p in the cost: the rank's degree)",
    "none": "no data",
}


@dataclass(frozen=True)
class Collective:
    """One collective: its names, its shape and its size rule."""

    name: str  #: mpicomm's name (lower case, as in ``MPICOMM_<NAME>_ALGORITHM``)
    family: str  #: the collective whose algorithms run it
    method: str  #: mpi4py's blocking method (``Allreduce``)
    rooted: bool = False
    reducing: bool = False
    vector: bool = False  #: takes per-rank counts (gatherv, scatterv, allgatherv, alltoallv, reduce_scatter)
    size: str = "vector"  #: the size rule, a key of :data:`SIZE_RULES`
    equal_blocks: bool = True  #: every rank gives the same count (the count is part of the agreement)
    neighbor: bool = False  #: a neighbourhood collective (a topology communicator's neighbours, not all ranks)

    @property
    def nonblocking(self) -> str:
        """mpi4py's nonblocking method (``Iallreduce``)."""
        return "I" + self.method[0].lower() + self.method[1:]

    @property
    def persistent(self) -> str:
        """The MPI-4 persistent form's name (``Allreduce_init``)."""
        return self.method + "_init"

    @property
    def signature(self) -> str:
        return SIGNATURES[self.family]

    def nbytes(self, count: int, itemsize: int, p: int, recvcounts: tuple[int, ...] | None = None) -> int | None:
        """n for a call of *count* elements of *itemsize* bytes on *p* ranks, by the size rule (None where the
        ranks cannot know it alike: the per-rank counts of gatherv, scatterv, alltoallv(w), the neighbourhood
        collectives; or no count, a buffer spec only the MPI library runs). *recvcounts*: allgatherv's and
        reduce_scatter's, which every rank gives alike."""
        if self.equal_blocks and self.size in ("vector", "block") and self.name != "barrier":
            return count * itemsize if count >= 0 else None
        if self.equal_blocks and self.size in ("gathered", "send", "input"):
            return count * itemsize * p if count >= 0 else None
        if self.name in ("allgatherv", "reduce_scatter") and recvcounts is not None:
            return sum(recvcounts) * itemsize
        return None

    @property
    def blockwise(self) -> bool:
        """n is one rank's (or one neighbour's) block, so a call's working set is n·p (n·d)."""
        return self.size in ("block", "edge")


def _rows() -> tuple[Collective, ...]:
    C = Collective
    return (
        C("barrier", "barrier", "Barrier", size="none"),
        C("bcast", "bcast", "Bcast", rooted=True),
        C("reduce", "reduce", "Reduce", rooted=True, reducing=True),
        C("allreduce", "allreduce", "Allreduce", reducing=True),
        C("gather", "gather", "Gather", rooted=True, size="block"),
        C("gatherv", "gather", "Gatherv", rooted=True, vector=True, size="block", equal_blocks=False),
        C("scatter", "scatter", "Scatter", rooted=True, size="block"),
        C("scatterv", "scatter", "Scatterv", rooted=True, vector=True, size="block", equal_blocks=False),
        C("allgather", "allgather", "Allgather", size="gathered"),
        C("allgatherv", "allgather", "Allgatherv", vector=True, size="gathered", equal_blocks=False),
        C("alltoall", "alltoall", "Alltoall", size="send"),
        C("alltoallv", "alltoall", "Alltoallv", vector=True, size="send", equal_blocks=False),
        C("alltoallw", "alltoall", "Alltoallw", vector=True, size="send", equal_blocks=False),
        C("reduce_scatter", "reduce_scatter", "Reduce_scatter", reducing=True, vector=True, size="input",
          equal_blocks=False),
        C("reduce_scatter_block", "reduce_scatter", "Reduce_scatter_block", reducing=True, size="input"),
        C("scan", "scan", "Scan", reducing=True),
        C("exscan", "exscan", "Exscan", reducing=True),
        C("neighbor_allgather", "neighbor", "Neighbor_allgather", size="edge", equal_blocks=False, neighbor=True),
        C("neighbor_allgatherv", "neighbor", "Neighbor_allgatherv", vector=True, size="edge", equal_blocks=False,
          neighbor=True),
        C("neighbor_alltoall", "neighbor", "Neighbor_alltoall", size="edge", equal_blocks=False, neighbor=True),
        C("neighbor_alltoallv", "neighbor", "Neighbor_alltoallv", vector=True, size="edge", equal_blocks=False,
          neighbor=True),
        C("neighbor_alltoallw", "neighbor", "Neighbor_alltoallw", vector=True, size="edge", equal_blocks=False,
          neighbor=True),
    )


CATALOGUE: dict[str, Collective] = {c.name: c for c in _rows()}
COLLECTIVES: tuple[str, ...] = tuple(CATALOGUE)
ROOTED = frozenset(c.name for c in CATALOGUE.values() if c.rooted)
REDUCING = frozenset(c.name for c in CATALOGUE.values() if c.reducing)
VECTORED = frozenset(c.name for c in CATALOGUE.values() if c.vector)
NEIGHBORHOOD = frozenset(c.name for c in CATALOGUE.values() if c.neighbor)


def row(collective: str) -> Collective:
    """The catalogue row of *collective*; ValueError naming the known ones otherwise."""
    try:
        return CATALOGUE[collective]
    except (KeyError, TypeError):
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}") from None


def family(collective: str) -> str:
    """The collective whose algorithms run *collective* (itself, or the family of a v-form)."""
    return row(collective).family
