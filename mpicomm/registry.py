"""The one table of algorithms: (collective, name) → schedule function, restrictions, cost.

Every algorithm of a collective has the same signature, so any of them can
stand in for another. Each is registered with :func:`register`, its docstring
stating its steps and restrictions, and its cost with :func:`cost`: a function
``fn(machine, n, p) -> seconds`` whose docstring states the formula in α
(latency per message), β (seconds per byte on the wire), γ (seconds per byte
reduced) and δ (seconds per byte copied) - the one place the formula is
written in words (:attr:`Algorithm.cost`, which ``python -m mpicomm
algorithms`` shows). Loading the table fails loudly when one of mpicomm's own
algorithms has no such docstring.

An algorithm's restrictions (:class:`Algorithm`) say when it cannot run:
:func:`allowed` checks them against a call's :class:`~mpicomm.facts.Facts`.
Which algorithm a call runs is the selection's (:mod:`mpicomm.selection`).

User algorithms: a module of the program's own registers them exactly as
``mpicomm/coll/*.py`` does (``mpicomm.register_algorithm`` is :func:`register`,
``mpicomm.register_cost`` is :func:`cost`). One without a cost function (no
predictions) may state its formula in a ``Cost:`` line of its own docstring
instead; a user module whose algorithm states its cost nowhere fails to
import. So that every process of a job -
the program, ``python -m mpicomm verify``, the benchmarks, ``tune`` - knows
them, name the module in ``MPICOMM_ALGORITHM_MODULES=pkg.mod[,pkg.mod2]``
(:data:`MODULES_VARIABLE`): the table imports those modules when it first
loads, after mpicomm's own (:func:`import_modules`; a name that cannot be
imported raises ImportError naming the variable and the module). A worked
example: ``docs/examples/torus_allreduce.py``. An algorithm may also come as a
file of schedules for one call (:mod:`mpicomm.schedule_file`):
:func:`register_schedule_file` checks it and registers it for that call's p
and count.
"""

from __future__ import annotations

import importlib
import math
import os
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from . import config, schedule_file
from .catalogue import CATALOGUE, family
from .facts import Facts
from .model import NOMINAL, CostFunction, Link, Machine, working_set
from .schedule import Combine

__all__ = ["Algorithm", "register", "algorithms", "lookup", "allowed", "table", "cost", "costs", "cost_function",
           "communication", "predict", "cheapest", "MODULES_VARIABLE", "import_modules", "module_names",
           "user_modules", "register_schedule_file"]


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
    is the communicator itself, and it would call itself for ever;
    ``butterfly``: its first rounds are, on every rank and for every p, the
    validation's butterfly (:func:`mpicomm.plan.agreement.butterfly`), so the
    ranks' digests can travel in its own small messages; ``fixed_p``,
    ``fixed_count``: made for that p and that count only (a schedule file,
    :func:`register_schedule_file`; None: any).
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
    butterfly: bool = False
    fixed_p: int | None = None
    fixed_count: int | None = None

    @property
    def cost(self) -> str:
        """The α-β-γ formula in words, as one line: what the docstring of its cost function states (:func:`stated`);
        for an algorithm whose cost function is missing or has no docstring (a user's), the ``Cost:`` line of its
        own docstring (:func:`cost_of`); else ""."""
        return stated(cost_function(self.collective, self.name)) or cost_of(self.steps)

    @property
    def time(self) -> CostFunction | None:
        """The cost function registered beside the algorithm (:func:`cost`): ``fn(machine, n, p) -> seconds``."""
        return cost_function(self.collective, self.name)

    def tunables(self) -> tuple:
        """The current values of its module's upper-case numeric settings (``SEGMENT_BYTES``...), which shape
        its schedules: part of the key a compiled plan is kept under, so changing one makes new plans."""
        module = sys.modules.get(getattr(self.steps, "__module__", ""), None)
        if module is None:
            return ()
        found = vars(module)
        names = _TUNABLE_NAMES.get(module.__name__)
        if names is None:  # (which names are settings is looked up once per module; their values on every call)
            names = _TUNABLE_NAMES[module.__name__] = tuple(
                k for k, v in found.items() if k.isupper() and type(v) in (int, float))
        return tuple((k, found[k]) for k in names)

    @property
    def summary(self) -> str:
        """The docstring's first line."""
        return (self.steps.__doc__ or "").strip().splitlines()[0]


_TUNABLE_NAMES: dict[str, tuple[str, ...]] = {}


def stated(fn: Callable | None) -> str:
    """The formula the docstring of cost function *fn* states, as one line: its first paragraph, the lines joined
    ("" for None or a function without a docstring). Later paragraphs are notes for readers of the code."""
    lines = []
    for line in (getattr(fn, "__doc__", None) or "").strip().splitlines():
        if not line.strip():
            break
        lines.append(line.strip())
    return " ".join(lines)


def cost_of(fn: Callable) -> str:
    """The ``Cost:`` line of *fn*'s docstring without its label ("" when there is none): where an algorithm
    without a cost function (a user's) may state its formula instead."""
    for line in (fn.__doc__ or "").splitlines():
        line = line.strip()
        if line.startswith("Cost:"):
            return line[len("Cost:") :].strip()
    return ""


_TABLE: dict[str, dict[str, Algorithm]] = {}

def allowed(algorithm: Algorithm, facts: Facts) -> str | None:
    """Why *algorithm* cannot run a call with these *facts* (see the module docstring), or None if it can."""
    if algorithm.commutative_only and not facts.commutative:
        return (f"reorders operands and needs a commutative op, but op {facts.op or '?'} "
                f"is not commutative")
    nodes = facts.nodes or 1
    if algorithm.single_node and nodes > 1:
        return f"needs every rank on one node (shared memory), but the communicator spans {nodes} nodes"
    if algorithm.host_only and facts.device:
        return "works on host memory only, but the buffers are device (GPU) arrays"
    if algorithm.composite and facts.nested:
        return "runs collectives on sub-communicators, and this call is already a step of such a composition"
    if algorithm.blocking_only and facts.blocking is False:
        return "runs blocking calls only (its calls share the communicator's scratch), but this call is nonblocking"
    p = facts.p or 1
    if algorithm.power_of_two and p & (p - 1):
        return f"needs a power-of-two number of ranks, but p = {p}"
    if algorithm.fixed_p is not None and p != algorithm.fixed_p:
        return f"is a schedule file made for p = {algorithm.fixed_p} only, but p = {p}"
    count = facts.count
    if algorithm.fixed_count is not None and count is not None and count != algorithm.fixed_count:
        return f"is a schedule file made for count {algorithm.fixed_count} only, but the count is {count}"
    return None


def register(collective: str, name: str, **restrictions: Any) -> Callable[[Callable], Callable]:
    """Decorator: register a step-generator function as *collective*'s algorithm *name*.

    Its docstring states its steps and restrictions; its α-β-γ cost is the cost function registered for it
    with :func:`cost`, whose docstring states the formula (:attr:`Algorithm.cost`).
    """

    def decorate(fn: Callable) -> Callable:
        algorithms_of = _TABLE.setdefault(collective, {})
        if name in algorithms_of:
            raise ValueError(f"algorithm {collective}/{name} is registered twice")
        algorithms_of[name] = Algorithm(collective, name, fn, **restrictions)
        return fn

    return decorate


def register_schedule_file(path: str | os.PathLike[str], name: str | None = None) -> Algorithm:
    """Register the schedules of a schedule file (:mod:`mpicomm.schedule_file`) as an algorithm of its collective.

    *name*: the algorithm's name (default: the file's ``algorithm``; a name
    already registered raises ValueError). The file is checked first
    (:func:`mpicomm.schedule_file.check`): every view within its buffer,
    every message meeting a receive of the same size on its peer, the rounds
    run together without a deadlock, and the result on rank- and
    index-dependent data equal to the collective's (ValueError listing the
    problems otherwise). The algorithm runs calls with the file's p, root and
    count only (elsewhere :func:`allowed` and the schedule function refuse with
    the reason); it needs a commutative op (the file was made with a sum) and
    is never run in place (the dispatcher copies an in-place input first).
    Every process of a job must register it, as with :func:`register`.
    Returns the registry entry.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read schedule file {path}: {exc.strerror or exc}") from None
    schedules = schedule_file.from_json(text, f"schedule file {path}")
    first = schedules[0]
    problems = schedule_file.check(schedules)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ValueError(f"schedule file {path} ({first.collective}/{first.algorithm}, p = {first.p}): "
                         f"{len(problems)} problem(s): {shown}")
    name = first.algorithm if name is None else name
    _load()  # (so that a name of mpicomm's own, or of a user module, is known as taken)
    if name in _TABLE.get(first.collective, {}):
        raise ValueError(f"{first.collective} algorithm {name!r} is registered already; give the file's algorithm "
                         f"another name: register_schedule_file({os.fspath(path)!r}, name={name + '_file'!r})")
    steps = schedule_file.replayer(schedules, name)
    what = f"p = {first.p}" + (f", count {first.count}" if first.count >= 0 else ", per-rank counts")
    steps.__doc__ = (
        f"{first.collective} {name}: the schedules of a file, made for {what} x {first.dtype}.\n\n"
        f"Steps: each rank's rounds as the file lists them (written by {first.algorithm}, or by hand).\n\n"
        f"Restrictions: the file's p, root and count only; a commutative op; not in place.\n")
    steps.__qualname__ = steps.__name__ = f"schedule_file_{name}"
    combines = any(type(op) is Combine for s in schedules for r in s.rounds for op in r.ops)
    register(first.collective, name, commutative_only=combines, in_place=False, fixed_p=first.p,
             fixed_count=first.count if first.count >= 0 else None)(steps)
    cost(first.collective, name)(schedule_file.cost_of(schedules))
    return _TABLE[first.collective][name]


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
        import difflib

        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""  # the hint of MPICOMM_<COLLECTIVE>_ALGORITHM's
        raise ValueError(
            f"unknown {collective} algorithm {name!r}{hint}; registered: {', '.join(names)} (or 'auto')"
        ) from None


_loaded: list[bool] = []

#: The environment variable naming the modules of user algorithms (comma-separated import paths) that the
#: table imports when it first loads, in every process of a job alike (see :func:`import_modules`).
MODULES_VARIABLE = "MPICOMM_ALGORITHM_MODULES"

_plugins: list[str] = []  # user modules imported so far, in order


def _load() -> None:
    """Import the modules that register algorithms: every module of :mod:`mpicomm.coll`, then the user modules
    that :data:`MODULES_VARIABLE` names (once; a user module that failed to import is tried again next time).
    TypeError when an algorithm of :mod:`mpicomm.coll` has no cost function whose docstring states its formula."""
    if not _loaded:
        package = importlib.import_module(f"{__package__}.coll")
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")
        unstated = _unstated(package.__name__, own=True)
        if unstated:
            raise TypeError(f"no cost function whose docstring states the α-β-γ formula for {', '.join(unstated)}: "
                            f"register one beside each algorithm in {package.__name__} with @cost")
        import_modules(config.raw(MODULES_VARIABLE) or "")
        _loaded.append(True)


def _unstated(module: str, own: bool = False) -> list[str]:
    """``collective/name`` of each registered algorithm whose schedule function is defined in *module* (or a module
    of that package) and whose cost is stated nowhere: no docstring of a cost function states it nor, unless *own*
    (mpicomm's algorithms, stated by their cost functions only), a ``Cost:`` line of its own docstring."""
    missing = []
    for collective, algorithms_of in _TABLE.items():
        for name, algorithm in algorithms_of.items():
            where = getattr(algorithm.steps, "__module__", None) or ""
            if where != module and not where.startswith(module + "."):
                continue
            if not stated(_cost_function(collective, name)) and (own or not cost_of(algorithm.steps)):
                missing.append(f"{collective}/{name}")
    return sorted(missing)


def module_names(text: str) -> list[str]:
    """The module paths of a comma-separated list (``"pkg.mod, pkg.mod2"``), blanks dropped."""
    return [name.strip() for name in text.split(",") if name.strip()]


def import_modules(modules: str | list[str] | tuple[str, ...], source: str = MODULES_VARIABLE) -> list[str]:
    """Import user modules that register algorithms (and their costs) with :func:`register` and :func:`cost`.

    *modules*: import paths, a list or one comma-separated string (what
    :data:`MODULES_VARIABLE` holds). A module already imported is not imported
    again. A name that cannot be imported, a module that fails while it
    registers, or one that registers an algorithm whose cost is stated nowhere
    (see :attr:`Algorithm.cost`) raises ImportError naming *source* (the
    variable, or the command-line option that gave it) and the module. Returns
    the modules imported by this call.
    """
    names = module_names(modules) if isinstance(modules, str) else [str(m).strip() for m in modules]
    done = []
    for name in names:
        if name in _plugins:
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            missing = exc.name or name
            if name == missing or name.startswith(missing + "."):
                raise ImportError(
                    f"{source}: cannot import algorithm module {name!r}: no module named {missing!r}; give the "
                    f"import path of a module on sys.path (run from the directory that holds its package, or add "
                    f"that directory to PYTHONPATH), several separated by commas",
                    name=name) from None
            raise ImportError(f"{source}: algorithm module {name!r} failed to import: {exc}", name=name) from exc
        except Exception as exc:  # noqa: BLE001 - whatever the module raised, say which module and where it came from
            raise ImportError(f"{source}: algorithm module {name!r} failed to import: {type(exc).__name__}: {exc}",
                              name=name) from exc
        unstated = _unstated(name)
        if unstated:
            raise ImportError(f"{source}: algorithm module {name!r} states no cost for {', '.join(unstated)}: "
                              f"register a cost function whose docstring states the α-β-γ formula "
                              f"(mpicomm.register_cost), or give the algorithm's docstring a 'Cost:' line", name=name)
        if name not in _plugins:  # (a module that loads the table while it imports is listed already)
            _plugins.append(name)
            done.append(name)
    return done


def user_modules() -> list[str]:
    """The user modules imported so far (:func:`import_modules`), in order."""
    return list(_plugins)


# ---------------------------------------------------------------- cost functions
#
# Each algorithm's cost, fn(machine, n, p) -> seconds, is written beside it in mpicomm/coll/*.py and
# registered with @cost; n is the catalogue's message size of the collective (mpicomm.catalogue).

_COSTS: dict[tuple[str, str], CostFunction] = {}


def cost(collective: str, *names: str) -> Callable[[CostFunction], CostFunction]:
    """Decorator: register ``fn(machine, n, p) -> seconds`` as the cost of *collective*'s algorithms *names*.

    Its body is the formula the model evaluates; its docstring states the same formula in words, the one place
    it is written so (:func:`stated` reads its first paragraph, which ``python -m mpicomm algorithms`` shows as
    one line). The formula comes first, in α, β, γ, δ, n and p (``lg p``, ``p'``, ``T(…)``: the conventions of
    :mod:`mpicomm.model`); then ``; p ≠ p': + …`` for the terms a fold onto a power of two adds, or ``, + …``
    for terms of the implementation (segments, headers); then, after two spaces, remarks in parentheses.
    """
    if not names:
        raise TypeError(f"cost({collective!r}) names no algorithm; give one or more: cost({collective!r}, 'ring')")

    def decorate(fn: CostFunction) -> CostFunction:
        for name in names:
            if (collective, name) in _COSTS:
                raise ValueError(f"cost of {collective}/{name} is registered twice")
            _COSTS[(collective, name)] = fn
        return fn

    return decorate


def costs() -> dict[tuple[str, str], CostFunction]:
    """Every registered cost function, by (collective, algorithm) (a copy; v-forms fall back to their family)."""
    _load()
    return dict(_COSTS)


def cost_function(collective: str, algorithm: str) -> CostFunction | None:
    """The cost function of *collective*'s *algorithm* (its own, else its family's), or None."""
    _load()
    return _cost_function(collective, algorithm)


def _cost_function(collective: str, algorithm: str) -> CostFunction | None:
    """:func:`cost_function` without loading the table (what is registered so far)."""
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
    facts = Facts(p=q, nodes=q if spans_nodes else 1)
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
