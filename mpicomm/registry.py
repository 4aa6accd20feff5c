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
4. :data:`SELECTION`, the static table.

The choice and where it came from are logged at debug level on the
``mpicomm`` logger.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from . import config

__all__ = ["Algorithm", "register", "algorithms", "lookup", "select", "SELECTION", "table"]

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

#: Static selection when nothing else names an algorithm: collective → name.
SELECTION: dict[str, str] = {
    "barrier": "native",
}


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


def select(collective: str, requested: str | None, comm_default: str | None = None) -> Algorithm:
    """Resolve the algorithm for one call (see the module docstring for the precedence)."""
    for source, name in (
        ("call", requested),
        ("communicator", comm_default),
        ("environment", config.algorithm_setting(collective)),
        ("table", SELECTION.get(collective)),
    ):
        if name is not None and name != "auto":
            algorithm = lookup(collective, name)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s: algorithm %s (from the %s)", collective, name, source)
            return algorithm
    raise ValueError(f"no algorithm selected for {collective}; registered: {', '.join(algorithms(collective))}")


def _load() -> None:
    """Import the modules that register algorithms (once)."""
    from . import barrier  # noqa: F401
