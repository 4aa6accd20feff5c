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
4. ``auto``, with measured decisions for the communicator's layout
   (``facts["decisions"]``, :mod:`mpicomm.decisions`, written by
   ``python -m mpicomm.tune --collectives``) that cover the message size: the
   algorithm measured fastest there, when it is allowed;
5. ``auto``, with a fitted model of the machine (``facts["machine"]``, a
   :class:`mpicomm.model.Machine`) and a known message size: the allowed
   algorithm with the least :func:`predict` (ties, within a
   relative 1e-9: the first name in alphabetical order);
6. otherwise :data:`SELECTION`, the static table: per collective, rules tried
   in order; the first whose conditions hold (and whose algorithm is allowed)
   wins. Conditions are facts every rank knows alike: ``max_bytes``/``min_bytes``
   (the message size, see :func:`mpicomm.coll.args.selection_bytes`),
   ``pof2`` (p is a power of two), ``min_p``/``max_p``, and ``min_count``
   (elements ≥ a multiple of p: ``min_count: 1`` means count ≥ p).

An algorithm's restrictions (:class:`Algorithm`) say when it cannot run:
:func:`allowed` checks them against the call's facts. A named algorithm that
is not allowed raises ValueError; ``auto`` skips it. ``min_count`` in the table
is about speed only - every algorithm runs with any count, count < p included -
so the model ignores it.

:func:`choose` returns the algorithm and where the choice came from
(``"call"``, ``"communicator"``, ``"environment"``, ``"decisions"``, ``"model"``, ``"table"``);
both are logged at debug level on the ``mpicomm`` logger.

Facts (every key optional): ``p`` ranks, ``bytes`` (selection size or None),
``count``, ``commutative`` and ``op`` (its name), ``nodes`` and ``ppn`` (the
communicator's layout), ``device`` (true, or a device object, when the
buffers are not host memory; None/False on the host), ``machine``, ``decisions``.
"""

from __future__ import annotations

import importlib
import logging
import math
import pkgutil
from dataclasses import dataclass, replace
from typing import Any, Callable

from . import config
from .catalogue import CATALOGUE, family
from .model import NOMINAL, CostFunction, Link, Machine, working_set

__all__ = ["Algorithm", "register", "algorithms", "lookup", "allowed", "choose", "select", "auto", "SELECTION",
           "table", "cost", "costs", "cost_function", "communication", "predict", "cheapest"]

log = logging.getLogger("mpicomm")


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm and its declared restrictions.

    ``commutative_only``: reorders operands (needs a commutative op);
    ``power_of_two``: needs p a power of two; ``in_place``: may read what it
    writes (else the dispatcher copies an in-place input first);
    ``single_node``: needs every rank on one node (shared memory);
    ``host_only``: host-memory buffers only; ``blocking_only``: not for the
    nonblocking forms (``Iallreduce``...): the algorithm's calls on one
    communicator share state (the shared-memory scratch, the hierarchy's
    levels) and must not overlap; ``composite``: runs other collectives on
    sub-communicators (hierarchical), so it is never chosen for one of those
    inner calls (facts ``nested``): on a one-node communicator the node level
    is the communicator itself, and it would call itself for ever.
    """

    collective: str
    name: str
    steps: Callable
    commutative_only: bool = False
    power_of_two: bool = False
    in_place: bool = True
    single_node: bool = False
    host_only: bool = False
    blocking_only: bool = False
    composite: bool = False

    @property
    def cost(self) -> str:
        """The ``Cost:`` line of the docstring (the α-β-γ formula)."""
        return cost_of(self.steps)

    @property
    def time(self) -> CostFunction | None:
        """The cost function registered beside the algorithm (:func:`cost`): ``fn(machine, n, p) -> seconds``."""
        return cost_function(self.collective, self.name)

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

#: Static selection when nothing else names an algorithm and no measured decision or fitted model applies:
#: collective → rules, first match wins (a rule whose algorithm cannot run the call - shm for a nonblocking
#: call or across nodes - is skipped). Sizes start from MPICH's defaults and were moved where measurements on
#: one node at p = 2 and p = 4 (BENCHMARKS.md) showed another algorithm faster.
SELECTION: dict[str, list[dict]] = {
    "barrier": [{"algorithm": "dissemination"}],
    "bcast": [{"max_bytes": 12288, "algorithm": "binomial"},
              {"min_bytes": 65536, "max_p": 8, "algorithm": "linear"},
              {"max_p": 7, "algorithm": "binomial"},
              {"algorithm": "scatter_allgather"}],
    "reduce": [{"min_bytes": 65536, "min_count": 1, "algorithm": "rabenseifner"}, {"algorithm": "binomial"}],
    "allreduce": [{"max_bytes": 2048, "algorithm": "recursive_doubling"},
                  {"min_bytes": 131072, "algorithm": "shm"},
                  {"min_bytes": 2 << 20, "min_count": 1, "algorithm": "rabenseifner"},
                  {"algorithm": "recursive_doubling"}],
    "gather": [{"algorithm": "binomial"}],
    "gatherv": [{"algorithm": "linear"}],
    "scatter": [{"algorithm": "binomial"}],
    "scatterv": [{"algorithm": "linear"}],
    "allgather": [{"max_p": 2, "min_bytes": 16384, "algorithm": "linear"},
                  {"pof2": True, "max_bytes": 524288, "algorithm": "recursive_doubling"},
                  {"max_bytes": 81920, "algorithm": "bruck"}, {"algorithm": "ring"}],
    "allgatherv": [{"max_p": 2, "min_bytes": 16384, "algorithm": "linear"},
                   {"pof2": True, "max_bytes": 524288, "algorithm": "recursive_doubling"},
                   {"max_bytes": 81920, "algorithm": "bruck"}, {"algorithm": "ring"}],
    "alltoall": [{"max_bytes": 256, "algorithm": "bruck"}, {"algorithm": "linear"}],
    "alltoallv": [{"algorithm": "linear"}],
    "reduce_scatter": [{"max_bytes": 524288, "algorithm": "recursive_halving"},
                       {"max_p": 2, "min_bytes": 1 << 20, "algorithm": "ring"}, {"algorithm": "pairwise"}],
    "reduce_scatter_block": [{"max_bytes": 524288, "algorithm": "recursive_halving"},
                             {"max_p": 2, "min_bytes": 1 << 20, "algorithm": "ring"}, {"algorithm": "pairwise"}],
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


def allowed(algorithm: Algorithm, facts: dict) -> str | None:
    """Why *algorithm* cannot run a call with these *facts* (see the module docstring), or None if it can."""
    if algorithm.commutative_only and not facts.get("commutative", True):
        return (f"reorders operands and needs a commutative op, but op {facts.get('op', '?')} "
                f"is not commutative")
    nodes = facts.get("nodes") or 1
    if algorithm.single_node and nodes > 1:
        return f"needs every rank on one node (shared memory), but the communicator spans {nodes} nodes"
    device = facts.get("device")
    if algorithm.host_only and device is not None and device is not False:
        return "works on host memory only, but the buffers are device (GPU) arrays"
    if algorithm.composite and facts.get("nested"):
        return "runs collectives on sub-communicators, and this call is already a step of such a composition"
    if algorithm.blocking_only and facts.get("blocking") is False:
        return "runs blocking calls only (its calls share the communicator's scratch), but this call is nonblocking"
    p = facts.get("p") or 1
    if algorithm.power_of_two and p & (p - 1):
        return f"needs a power-of-two number of ranks, but p = {p}"
    return None


def auto(collective: str, facts: dict) -> "Algorithm":
    """The static table's choice for a call with these *facts*, skipping algorithms that are not :func:`allowed`."""
    for rule in SELECTION.get(collective, ()):
        if _holds(rule, facts):
            algorithm = lookup(collective, rule["algorithm"])
            if allowed(algorithm, facts) is None:
                return algorithm
    for name in algorithms(collective):  # nothing in the table fits: any algorithm that can run
        algorithm = lookup(collective, name)
        if allowed(algorithm, facts) is None:
            return algorithm
    raise ValueError(f"no {collective} algorithm accepts these arguments ({_show(facts)})")


def _show(facts: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in facts.items() if k != "machine")


#: Model choices already made: (collective, bytes, p, commutative, nodes, on device, blocking, id(machine))
#: → (algorithm, why, machine).
_choices: dict[tuple, tuple[Algorithm, str, Any]] = {}
_CHOICES_KEPT = 4096
_TIE = 1e-9  # relative difference below which two predictions are equal


def _by_model(collective: str, facts: dict, machine: Any) -> tuple[Algorithm, str] | None:
    """The allowed algorithm the model predicts fastest, with a note for the log; None if none is modelled."""
    nbytes, p = facts["bytes"], facts.get("p") or 1
    device = facts.get("device")
    key = (collective, nbytes, p, bool(facts.get("commutative", True)), facts.get("nodes") or 1,
           device is not None and device is not False, facts.get("blocking") is not False, bool(facts.get("nested")),
           id(machine))
    hit = _choices.get(key)
    if hit is not None and hit[2] is machine:  # the same machine object, not one that took a freed one's id
        return hit[0], hit[1]
    scored = []
    for name in algorithms(collective):
        algorithm = _TABLE[collective][name]
        if allowed(algorithm, facts) is None and cost_function(collective, name) is not None:
            scored.append((communication(collective, name, nbytes, p, machine), name, algorithm))
    if not scored:
        return None
    least = min(row[0] for row in scored)
    tie = least * (1 + _TIE) + 1e-15  # formulas that agree but for rounding are a tie: the first name wins
    scored.sort(key=lambda row: (row[0] > tie, row[1] if row[0] <= tie else "", row[0]))
    seconds, _, best = scored[0]
    why = f"{seconds * 1e6:.1f} us predicted" + (
        f"; next {scored[1][1]} {scored[1][0] * 1e6:.1f} us" if len(scored) > 1 else "")
    if len(_choices) >= _CHOICES_KEPT:
        _choices.clear()
    _choices[key] = (best, why, machine)
    return best, why


def _by_decisions(collective: str, facts: dict) -> tuple[Algorithm, str] | None:
    """The measured decision (``facts["decisions"]``, a :class:`mpicomm.decisions.Decisions`) for this size, if one
    covers it and its algorithm can run here; None leaves the choice to the model or the table. Decisions are
    measured on host arrays at one p, so device buffers and other sizes of communicator skip them."""
    decisions = facts.get("decisions")
    if decisions is None or facts.get("device") or decisions.p != (facts.get("p") or 1):
        return None
    name = decisions.algorithm_for(collective, facts.get("bytes"))
    _load()
    algorithm = _TABLE.get(collective, {}).get(name) if name is not None else None
    if algorithm is None or allowed(algorithm, facts) is not None:
        return None
    return algorithm, f"measured fastest at this size ({decisions.layout})"


def register(collective: str, name: str, **restrictions: bool) -> Callable[[Callable], Callable]:
    """Decorator: register a step-generator function as *collective*'s algorithm *name*."""

    def decorate(fn: Callable) -> Callable:
        if not cost_of(fn):
            raise TypeError(f"algorithm {collective}/{name} ({fn.__qualname__}) has no 'Cost:' line in its docstring")
        algorithms_of = _TABLE.setdefault(collective, {})
        if name in algorithms_of:
            raise ValueError(f"algorithm {collective}/{name} is registered twice")
        algorithms_of[name] = Algorithm(collective, name, fn, **restrictions)
        _choices.clear()
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
    _load()
    try:
        return _TABLE[collective][name]
    except (KeyError, TypeError):
        names = algorithms(collective)  # an unknown collective raises here, naming the known ones
        raise ValueError(
            f"unknown {collective} algorithm {name!r}; registered: {', '.join(names)} (or 'auto')"
        ) from None


def choose(collective: str, requested: str | None, comm_default: str | None = None,
           facts: dict | None = None) -> tuple[Algorithm, str]:
    """Resolve the algorithm for one call and say where the choice came from (see the module docstring).

    Returns ``(algorithm, source)``, source one of ``"call"``,
    ``"communicator"``, ``"environment"``, ``"decisions"``, ``"model"``, ``"table"``. A named
    algorithm that is not :func:`allowed` with these *facts* (a non-commutative
    op for a commutative-only one, several nodes for a single-node one...)
    raises ValueError with the reason and the algorithms that can run.
    """
    facts = facts or {}
    note = ""
    for source, name in (
        ("call", requested),
        ("communicator", comm_default),
        ("environment", config.algorithm_setting(collective)),
    ):
        if name is not None and name != "auto":
            algorithm = lookup(collective, name)
            if algorithm.composite and facts.get("nested"):
                if source != "call":
                    continue  # a composition's inner call: the setting is for the outer calls; choose as auto
                reason = allowed(algorithm, {**facts, "nested": False})  # named by the composition itself
            else:
                reason = allowed(algorithm, facts)
            if reason is not None:
                can = [n for n in algorithms(collective) if allowed(_TABLE[collective][n], facts) is None]
                fix = ("keeps rank order" if algorithm.commutative_only and not facts.get("commutative", True)
                       else "can run here")
                raise ValueError(f"{collective} algorithm {name!r} (from the {source}) {reason}; use one that "
                                 f"{fix}: {', '.join(can)} (or 'auto')")
            break
    else:
        machine = facts.get("machine")
        picked, source = _by_decisions(collective, facts), "decisions"
        if picked is None and machine is not None and facts.get("bytes") is not None and (facts.get("p") or 1) > 1:
            picked, source = _by_model(collective, facts, machine), "model"
        if picked is not None:
            algorithm, note = picked
        else:
            source = "table"
            algorithm = auto(collective, facts)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: algorithm %s (from the %s%s)", collective, algorithm.name, source, f": {note}" if note else "")
    return algorithm, source


def select(collective: str, requested: str | None, comm_default: str | None = None,
           facts: dict | None = None) -> Algorithm:
    """The algorithm :func:`choose` picks, without its source."""
    return choose(collective, requested, comm_default, facts)[0]


_loaded: list[bool] = []


def _load() -> None:
    """Import the modules that register algorithms, every module of :mod:`mpicomm.coll` (once)."""
    if not _loaded:
        package = importlib.import_module(f"{__package__}.coll")
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")
        _loaded.append(True)


# ---------------------------------------------------------------- cost functions
#
# Each algorithm's cost, fn(machine, n, p) -> seconds, is written beside it in mpicomm/coll/*.py and
# registered with @cost; n is the catalogue's message size of the collective (mpicomm.catalogue).

_COSTS: dict[tuple[str, str], CostFunction] = {}


def cost(collective: str, *names: str) -> Callable[[CostFunction], CostFunction]:
    """Decorator: register ``fn(machine, n, p) -> seconds`` as the cost of *collective*'s algorithms *names*."""
    if not names:
        raise TypeError(f"cost({collective!r}) names no algorithm; give one or more: cost({collective!r}, 'ring')")

    def decorate(fn: CostFunction) -> CostFunction:
        for name in names:
            if (collective, name) in _COSTS:
                raise ValueError(f"cost of {collective}/{name} is registered twice")
            _COSTS[(collective, name)] = fn
        _choices.clear()
        return fn

    return decorate


def costs() -> dict[tuple[str, str], CostFunction]:
    """Every registered cost function, by (collective, algorithm) (a copy; v-forms fall back to their family)."""
    _load()
    return dict(_COSTS)


def cost_function(collective: str, algorithm: str) -> CostFunction | None:
    """The cost function of *collective*'s *algorithm* (its own, else its family's), or None."""
    _load()
    fn = _COSTS.get((collective, algorithm))
    if fn is None and collective in CATALOGUE:
        fn = _COSTS.get((family(collective), algorithm))
    return fn


def communication(collective: str, algorithm: str, nbytes: float, p: int, machine: Machine) -> float:
    """Seconds the algorithm's formula predicts, without the per-call overhead (0 when p ≤ 1).

    Times the machine's measured correction for the algorithm when it has one
    (:meth:`mpicomm.model.Machine.correction`, written by ``tune --collectives``).
    """
    fn = cost_function(collective, algorithm)
    if fn is None:
        known = sorted(a for c, a in _COSTS if c in (collective, family(collective) if collective in CATALOGUE
                                                     else None))
        raise ValueError(f"no cost function for {collective} algorithm {algorithm!r}; "
                         f"modelled: {', '.join(known) or 'none'}")
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p = {p!r} is not a positive number of ranks")
    if nbytes < 0:
        raise ValueError(f"nbytes = {nbytes!r} is negative; give the message size in bytes")
    if p == 1:
        return 0.0
    seconds = fn(machine.at(working_set(collective, nbytes, p)), nbytes, p)
    if machine.corrections:  # measured / predicted, from python -m mpicomm.tune --collectives
        factor = machine.correction(collective, algorithm)
        if factor == 1.0 and collective in CATALOGUE:
            factor = machine.correction(family(collective), algorithm)
        seconds *= factor
    return seconds


def predict(collective: str, algorithm: str, nbytes: float, p: int, machine: Machine | None = None) -> float:
    """Predicted seconds for one call of *collective* with *algorithm*, *nbytes* (n of the catalogue), *p* ranks.

    The formula plus ``machine.overhead``, plus ``machine.validation`` when
    validation is on (``MPICOMM_VALIDATE``, read now). *machine* None:
    :data:`~mpicomm.model.NOMINAL` (``mpicomm.predict``, :func:`mpicomm.state.predict`,
    takes the world communicator's fit instead).
    """
    m = machine if machine is not None else NOMINAL
    seconds = communication(collective, algorithm, nbytes, p, m) + m.overhead
    if config.validate():
        seconds += m.validation
    return seconds


def cheapest(m: Machine, collective: str, n: float, q: int, link: Link, spans_nodes: bool) -> float:
    """T(collective, n, q, link): the least cost of a registered non-hierarchical algorithm over *q* ranks.

    For the cost of compositions (hierarchical algorithms). Every level pays
    *link*; *spans_nodes* excludes single-node (shared memory) algorithms.
    q = 1 costs 0.
    """
    if q <= 1:
        return 0.0
    level = replace(m, intra=link, inter=link)
    facts = {"p": q, "nodes": q if spans_nodes else 1, "commutative": True}
    best = math.inf
    _load()
    for name, algorithm in _TABLE.get(collective, {}).items():
        fn = cost_function(collective, name)
        if name == "hierarchical" or fn is None or allowed(algorithm, facts) is not None:
            continue
        best = min(best, fn(level, n, q))
    if best == math.inf:
        raise ValueError(f"no modelled {collective} algorithm runs on {q} ranks for a hierarchical composition")
    return best
