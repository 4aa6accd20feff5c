"""The two levels hierarchical algorithms run on: the node's ranks, and one leader per node.

``levels(state)`` duplicates the communicator's node-local and node-leader
sub-communicators (``Split_type(COMM_TYPE_SHARED)``, one rank per node) and
takes their :class:`~mpicomm.state.State`, so each level's step runs through the
dispatcher with whatever algorithm suits it (shared memory on the node, any
message-passing algorithm between leaders), and adds where every rank lives.
Built collectively the first time a hierarchical algorithm runs on the
communicator (every rank runs it then), and cached. The two levels are
private duplicates, used by nothing else, and the hierarchical algorithms
are registered for blocking calls only: the levels' calls of one call all
start and finish before the next call's, in the same order on every rank,
so their sequence numbers, hence tags, agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..state import State, as_state

__all__ = ["Levels", "levels"]


@dataclass(frozen=True)
class Levels:
    """A communicator seen as nodes: the two sub-communicators and every rank's place."""

    node: State  #: this rank's node (local rank 0 is the node's leader)
    leaders: State | None  #: the node leaders, node k at rank k (None off the leaders)
    node_of: tuple[int, ...]  #: node index of every rank
    local_of: tuple[int, ...]  #: local rank of every rank
    members: tuple[tuple[int, ...], ...]  #: per node, its ranks in local-rank order

    @property
    def nodes(self) -> int:
        return len(self.members)


def levels(comm: Any) -> Levels:
    """The communicator's :class:`Levels` (collective over it the first time; *comm*: a State or a communicator).

    Kept in the State and freed with it.
    """
    state = as_state(comm)
    found = state.levels
    if found is None:
        node = as_state(state.node_comm.Dup())
        leaders = as_state(state.leader_comm.Dup()) if state.leader_comm is not None else None
        mine = np.array([state.node, state.local_rank], np.int64)
        every = np.empty((state.size, 2), np.int64)
        state.library_comm.Allgather(mine, every)
        node_of = tuple(int(v) for v in every[:, 0])
        local_of = tuple(int(v) for v in every[:, 1])
        members = tuple(
            tuple(sorted((r for r in range(len(node_of)) if node_of[r] == k), key=lambda r: local_of[r]))
            for k in range(state.nodes)
        )
        found = state.levels = Levels(node, leaders, node_of, local_of, members)
    return found
