"""The facts of one call that the selection may look at: what every rank of the communicator knows alike.

The selection rules' conditions (:mod:`mpicomm.rules`) and the algorithms'
restrictions (:func:`mpicomm.registry.allowed`) read them; the selection
(:func:`mpicomm.selection.facts_of`) makes them from a call's arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .rules import Rules

__all__ = ["Facts"]


@dataclass(frozen=True)
class Facts:
    """What the selection may look at for one call: facts every rank of the communicator knows alike.

    The rules' conditions read ``p``, ``bytes``, ``count`` and ``device``; an
    algorithm's restrictions (:func:`mpicomm.registry.allowed`) read the rest.
    """

    p: int = 1  #: ranks of the communicator
    bytes: int | None = None  #: the message size n (:meth:`mpicomm.catalogue.Collective.nbytes`); None: no size
    count: int | None = None  #: the count every rank gives alike; None: none (the v-forms)
    commutative: bool = True  #: the op is commutative (or there is none)
    op: str | None = None  #: the op's name, for messages
    nodes: int = 1  #: nodes the communicator spans
    ppn: int = 0  #: most ranks on one node (0: not known)
    device: bool = False  #: device (GPU) buffers
    blocking: bool | None = None  #: a blocking call (None: not known, either)
    nested: bool = False  #: a step of a composition (a hierarchical algorithm's level)
    rules: Rules | None = None  #: the measured rules of the communicator's layout, if any

    def shown(self) -> str:
        """The facts in words, for messages (without the rules)."""
        return ", ".join(f"{k}={getattr(self, k)}" for k in self.__dataclass_fields__ if k != "rules")
