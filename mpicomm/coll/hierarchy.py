"""The two levels hierarchical algorithms run on: the node's ranks, and one leader per node.

Where every rank lives is known from the communicator's creation
(``state.node_of``, ``state.local_of``), so a hierarchical algorithm describes
its schedule without any communication. The levels' communicators themselves
(private duplicates of the node-local and node-leader sub-communicators, each
with its own state) are made collectively the first time a hierarchical
algorithm runs on the communicator - by a step at the start of its schedule,
which runs only once every rank agreed on the call - and kept in its state.
The nested calls refer to them through :class:`Level` handles, resolved when
the run reaches them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..schedule import Builder

if TYPE_CHECKING:
    from ..state import State

__all__ = ["Level", "Levels", "levels"]


@dataclass(frozen=True)
class Level:
    """One level's communicator state, made on first use: ``resolve()`` returns it."""

    owner: Any  #: the communicator's state
    which: str  #: "node" or "leaders"

    def resolve(self) -> Any:
        made = self.owner.levels
        if made is None:
            raise RuntimeError("a hierarchical level was used before its set-up step ran")
        return made[0] if self.which == "node" else made[1]

    @property
    def size(self) -> int:
        state = self.owner
        return state.local_size if self.which == "node" else state.nodes


@dataclass(frozen=True)
class Levels:
    """A communicator seen as nodes: the two levels and every rank's place."""

    node: Level  #: this rank's node (local rank 0 is the node's leader)
    leaders: Level | None  #: the node leaders, node k at rank k (None off the leaders)
    leader: bool  #: whether this rank leads its node
    node_of: tuple[int, ...]  #: node index of every rank
    local_of: tuple[int, ...]  #: local rank of every rank

    @property
    def nodes(self) -> int:
        return max(self.node_of) + 1 if self.node_of else 1


def _set_up(state: State) -> None:
    """Make the levels' communicators and states (collective over the communicator, once)."""
    if state.levels is None:
        node = state.sub_state(state.node_comm.Dup())
        leaders = state.sub_state(state.leader_comm.Dup()) if state.leader_comm is not None else None
        state.levels = (node, leaders)


def levels(s: Builder) -> Levels:
    """The levels of the communicator *s* describes a call on; adds the set-up step (and gates the schedule:
    the set-up is collective, so it runs only once every rank agreed on the call)."""
    state = s.state
    s.gate()
    s.local(lambda run: _set_up(state), "make the node and leader communicators (the first time only)")
    leader = state.local_rank == 0
    return Levels(Level(state, "node"), Level(state, "leaders") if leader else None, leader, tuple(state.node_of),
                  tuple(state.local_of))
