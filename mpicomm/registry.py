"""The one table of algorithms: (collective, name) → step generator, restrictions, cost.

Every algorithm of a collective has the same signature, so any of them can
stand in for another. Each is registered with :func:`register`, whose
docstring must state its steps and a ``Cost:`` line in α (latency per message),
β (seconds per byte on the wire) and γ (seconds per byte reduced); import fails
loudly otherwise.

Choosing an algorithm is data, in this order of precedence:

1. the call's ``algorithm=`` argument (``"auto"`` or None passes);
2. the communicator's default (``comm.set_algorithm(collective, name)``);
3. the environment, ``MPICOMM_<COLLECTIVE>_ALGORITHM=name``;
4. :data:`SELECTION`, the static table: per collective, rules tried in order;
   the first whose conditions hold (and whose algorithm accepts the op) wins.
   Conditions are facts every rank knows alike: ``max_bytes``/``min_bytes``
   (the message size, see :func:`mpicomm.coll.dispatch.selection_bytes`),
   ``pof2`` (p is a power of two), ``min_p``/``max_p``, and ``min_count``
   (elements ≥ a multiple of p: ``min_count: 1`` means count ≥ p).

The choice and where it came from are logged at debug level on the
``mpicomm`` logger.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from . import config

__all__ = ["Algorithm", "register", "algorithms", "lookup", "select", "auto", "SELECTION", "table"]

log = logging.getLogger("mpicomm")


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm and its declared restrictions."""

    collective: str
    name: str
    steps: Callable
    commutative_only: bool = False
    power_of_two: bool = False
    in_place: bool = True

    @property
    def cost(self) -> str:
        """The ``Cost:`` line of the docstring (the α-β-γ formula)."""
        return cost_of(self.steps)

    @property
    def summary(self) -> str:
        """The docstring's first line."""
        return (self.steps.__doc__ or "").strip().splitlines()[0]


def cost_of(fn: Callable) -> str:
    for line in (fn.__doc__ or "").splitlines():
        line = line.strip()
        if line.startswith("Cost:"):
            return line[len("Cost:") :].strip()
    return ""


_TABLE: dict[str, dict[str, Algorithm]] = {}

#: Static selection when nothing else names an algorithm: collective → rules, first match wins.
#: Sizes follow MPICH's defaults (see ``algorithms.md`` in the shared references); the
#: performance work replaces this table with a model fitted on the machine.
SELECTION: dict[str, list[dict]] = {
    "barrier": [{"algorithm": "dissemination"}],
    "bcast": [{"max_bytes": 12288, "algorithm": "binomial"}, {"max_p": 7, "algorithm": "binomial"},
              {"algorithm": "scatter_allgather"}],
    "reduce": [{"min_bytes": 65536, "min_count": 1, "algorithm": "rabenseifner"}, {"algorithm": "binomial"}],
    "allreduce": [{"max_bytes": 2048, "algorithm": "recursive_doubling"},
                  {"min_bytes": 1 << 20, "min_count": 1, "algorithm": "ring"},
                  {"min_count": 1, "algorithm": "rabenseifner"},
                  {"algorithm": "recursive_doubling"}],
    "gather": [{"algorithm": "binomial"}],
    "gatherv": [{"algorithm": "linear"}],
    "scatter": [{"algorithm": "binomial"}],
    "scatterv": [{"algorithm": "linear"}],
    "allgather": [{"pof2": True, "max_bytes": 524288, "algorithm": "recursive_doubling"},
                  {"max_bytes": 81920, "algorithm": "bruck"}, {"algorithm": "ring"}],
    "allgatherv": [{"pof2": True, "max_bytes": 524288, "algorithm": "recursive_doubling"},
                   {"max_bytes": 81920, "algorithm": "bruck"}, {"algorithm": "ring"}],
    "alltoall": [{"max_bytes": 256, "algorithm": "bruck"}, {"max_bytes": 32768, "algorithm": "linear"},
                 {"algorithm": "pairwise"}],
    "alltoallv": [{"algorithm": "linear"}],
    "reduce_scatter": [{"max_bytes": 524288, "algorithm": "recursive_halving"}, {"algorithm": "pairwise"}],
    "reduce_scatter_block": [{"max_bytes": 524288, "algorithm": "recursive_halving"}, {"algorithm": "pairwise"}],
    "scan": [{"algorithm": "recursive_doubling"}],
    "exscan": [{"algorithm": "recursive_doubling"}],
}

_CONDITIONS = ("max_bytes", "min_bytes", "pof2", "min_p", "max_p", "min_count")


def _holds(rule: dict, facts: dict) -> bool:
    p, nbytes, count = facts.get("p", 1), facts.get("bytes"), facts.get("count")
    for key, value in rule.items():
        if key == "algorithm":
            continue
        if key == "max_bytes" and (nbytes is None or nbytes > value):
            return False
        if key == "min_bytes" and (nbytes is None or nbytes < value):
            return False
        if key == "pof2" and (p & (p - 1) == 0) != value:
            return False
        if key == "min_p" and p < value:
            return False
        if key == "max_p" and p > value:
            return False
        if key == "min_count" and (count is None or count < value * p):
            return False
        if key not in _CONDITIONS:
            raise ValueError(f"selection rule {rule} has unknown condition {key!r}; known: {', '.join(_CONDITIONS)}")
    return True


def auto(collective: str, facts: dict) -> "Algorithm":
    """The table's choice for a call with these *facts* (``p``, ``bytes``, ``count``, ``commutative``)."""
    commutative = facts.get("commutative", True)
    for rule in SELECTION.get(collective, ()):
        if _holds(rule, facts):
            algorithm = lookup(collective, rule["algorithm"])
            if commutative or not algorithm.commutative_only:
                return algorithm
    for name in algorithms(collective):  # nothing in the table fits: any algorithm that keeps rank order
        algorithm = lookup(collective, name)
        if commutative or not algorithm.commutative_only:
            return algorithm
    raise ValueError(f"no {collective} algorithm accepts these arguments ({facts})")


def register(collective: str, name: str, **restrictions: bool) -> Callable[[Callable], Callable]:
    """Decorator: register a step-generator function as *collective*'s algorithm *name*."""

    def decorate(fn: Callable) -> Callable:
        if not cost_of(fn):
            raise TypeError(f"algorithm {collective}/{name} ({fn.__qualname__}) has no 'Cost:' line in its docstring")
        algorithms_of = _TABLE.setdefault(collective, {})
        if name in algorithms_of:
            raise ValueError(f"algorithm {collective}/{name} is registered twice")
        algorithms_of[name] = Algorithm(collective, name, fn, **restrictions)
        return fn

    return decorate


def table() -> dict[str, dict[str, Algorithm]]:
    """Every registered algorithm, by collective then name (a copy)."""
    _load()
    return {c: dict(a) for c, a in _TABLE.items()}


def algorithms(collective: str) -> list[str]:
    """Names of the algorithms registered for *collective*."""
    _load()
    if collective not in _TABLE:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(sorted(_TABLE))}")
    return sorted(_TABLE[collective])


def lookup(collective: str, name: str) -> Algorithm:
    """The algorithm *name* of *collective*; ValueError listing the registered names otherwise."""
    names = algorithms(collective)
    try:
        return _TABLE[collective][name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown {collective} algorithm {name!r}; registered: {', '.join(names)} (or 'auto')"
        ) from None


def select(collective: str, requested: str | None, comm_default: str | None = None,
           facts: dict | None = None) -> Algorithm:
    """Resolve the algorithm for one call (see the module docstring for the precedence).

    A named algorithm that needs a commutative op, given a non-commutative
    one (``facts["commutative"]`` False), raises ValueError naming the
    algorithms that keep rank order.
    """
    facts = facts or {}
    for source, name in (
        ("call", requested),
        ("communicator", comm_default),
        ("environment", config.algorithm_setting(collective)),
    ):
        if name is not None and name != "auto":
            algorithm = lookup(collective, name)
            if algorithm.commutative_only and not facts.get("commutative", True):
                keep = [n for n in algorithms(collective) if not lookup(collective, n).commutative_only]
                raise ValueError(
                    f"{collective} algorithm {name!r} (from the {source}) reorders operands and needs a commutative "
                    f"op, but op {facts.get('op', '?')} is not commutative; use one that keeps rank order: "
                    f"{', '.join(keep)} (or 'auto')"
                )
            break
    else:
        source = "table"
        algorithm = auto(collective, facts)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: algorithm %s (from the %s)", collective, algorithm.name, source)
    return algorithm


def _load() -> None:
    """Import the modules that register algorithms (once)."""
    from . import coll  # noqa: F401
