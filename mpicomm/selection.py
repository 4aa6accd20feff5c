"""The selection: which algorithm runs a call, from the call's facts - data, in this order of precedence:

1. the call's ``algorithm=`` argument (``"auto"`` or None passes);
2. the communicator's default (``comm.set_algorithm(collective, name)``);
3. the environment, ``MPICOMM_<COLLECTIVE>_ALGORITHM=name``;
4. ``auto``: the measured rules of the communicator's layout
   (:attr:`Facts.rules <mpicomm.facts.Facts.rules>`, a :class:`mpicomm.rules.Rules` written by
   ``python -m mpicomm.tune --collectives``), when a file exists;
5. ``auto``: the default rules (:data:`SELECTION`, read from the rules file
   shipped with mpicomm, :data:`DEFAULT`);
6. ``auto``: any algorithm that can run (the first by name).

Both kinds of rules are one format (:mod:`mpicomm.rules`): per collective, rules
tried in order; the first whose conditions hold and whose algorithm is
allowed wins. Conditions are on a call's :class:`~mpicomm.facts.Facts`, which
every rank knows alike: ``max_bytes``/``min_bytes`` (the message size, see
:meth:`mpicomm.catalogue.Collective.nbytes`), ``pof2`` (p is a power of two),
``min_p``/``max_p``, ``min_count`` (elements ≥ a multiple of p:
``min_count: 1`` means count ≥ p) and ``device`` (device buffers or host
ones). The fitted α-β-γ model (:mod:`mpicomm.model`) does not choose: it
predicts (:func:`mpicomm.registry.predict`) and explains (``python -m mpicomm algorithms --explain``).

An algorithm's restrictions (:class:`~mpicomm.registry.Algorithm`) say when it
cannot run: :func:`mpicomm.registry.allowed` checks them against the facts. A
named algorithm that is not allowed raises ValueError; ``auto`` skips it.
``min_count`` in the rules is about speed only - every algorithm runs with any
count, count < p included.

:func:`choose` returns the algorithm and where the choice came from
(``"call"``, ``"communicator"``, ``"environment"``, ``"rules"`` - the measured
rules -, ``"table"`` - the default rules, or any algorithm that can run);
both are logged at debug level on the ``mpicomm`` logger, with the rule that
chose. :func:`choose_for` is what a call asks: the facts of its arguments on
its communicator (:func:`facts_of`), the choice kept per communicator for
facts seen before.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from . import config, registry
from .facts import Facts
from .registry import Algorithm, allowed, lookup
from .rules import Rules
from .rules import default as _default_rules
from .rules import describe as describe_rule
from .rules import holds as _holds

if TYPE_CHECKING:
    from .plan.args import Args
    from .state import State

__all__ = ["DEFAULT", "SELECTION", "choose", "select", "auto", "auto_rule", "facts_of", "choose_for"]

log = logging.getLogger("mpicomm")

#: The default rules (:mod:`mpicomm.rules`), read from the rules file shipped with mpicomm
#: (``mpicomm/default_rules.json``): what ``auto`` follows after the measured rules of the communicator's layout.
DEFAULT: Rules = _default_rules()

#: The default rules' lists, by collective (``DEFAULT.collectives``, the same dict): rules tried in order, the first
#: whose conditions hold and whose algorithm can run the call wins. Replace a collective's list to change them
#: (:func:`choose_for` keeps its choices by the list's identity, so a new list makes new choices).
SELECTION: dict[str, list[dict]] = DEFAULT.collectives

_CHOICES_KEPT = 512  #: choices a communicator keeps (all are dropped when it has more)


def auto(collective: str, facts: Facts) -> Algorithm:
    """The default rules' choice (:data:`SELECTION`) for a call with these *facts*, skipping algorithms that are not
    allowed; when no rule fits, the first algorithm by name that can run (measured rules not consulted)."""
    return auto_rule(collective, _without_rules(facts))[0]


def _without_rules(facts: Facts) -> Facts:
    return facts if facts.rules is None else replace(facts, rules=None)


def auto_rule(collective: str, facts: Facts) -> tuple[Algorithm, str, str]:
    """What ``auto`` picks for a call with these *facts*, where from, and which rule: ``(algorithm, source, rule)``.

    *source* is ``"rules"`` (the measured rules ``facts.rules``) or ``"table"`` (the default rules, or
    no rule fitted and *algorithm* is the first by name that can run); *rule* says which rule chose, in words
    (``"rule 2 of the default rules: up to 2048 B → recursive_doubling"``). ValueError when nothing can run.
    """
    measured = facts.rules
    if measured is not None:
        found = _first(measured.collectives.get(collective) or (), collective, facts, measured.applies(facts),
                       strict=False)
        if found is not None:
            index, rule, algorithm = found
            return algorithm, "rules", f"rule {index + 1} of {measured.name}: {describe_rule(rule)}"
    found = _first(SELECTION.get(collective) or (), collective, facts)
    if found is not None:
        index, rule, algorithm = found
        return algorithm, "table", f"rule {index + 1} of the default rules: {describe_rule(rule)}"
    for name in registry.algorithms(collective):  # no rule fits: any algorithm that can run
        algorithm = lookup(collective, name)
        if allowed(algorithm, facts) is None:
            return algorithm, "table", "no rule fits: the first algorithm by name that can run"
    raise ValueError(f"no {collective} algorithm accepts these arguments ({facts.shown()})")


def _first(rules: Any, collective: str, facts: Facts, applies: bool = True,
           strict: bool = True) -> tuple[int, dict, Algorithm] | None:
    """(index, rule, algorithm) of the first of *rules* that holds and whose algorithm is allowed. *strict*: an
    algorithm that is not registered raises ValueError (the default rules); else the rule is skipped (measured
    rules, read from a file that another installation may have written)."""
    if not applies:
        return None
    for index, rule in enumerate(rules):
        if _holds(rule, facts):
            algorithm: Algorithm | None
            if strict:
                algorithm = lookup(collective, rule["algorithm"])
            else:
                if rule["algorithm"] not in registry.algorithms(collective):
                    continue
                algorithm = lookup(collective, rule["algorithm"])
            if allowed(algorithm, facts) is None:
                return index, rule, algorithm
    return None


def choose(collective: str, requested: str | None, comm_default: str | None = None,
           facts: Facts | None = None) -> tuple[Algorithm, str]:
    """Resolve the algorithm for one call and say where the choice came from (see the module docstring).

    Returns ``(algorithm, source)``, source one of ``"call"``,
    ``"communicator"``, ``"environment"``, ``"rules"`` (measured), ``"table"`` (default rules). A named
    algorithm that is not allowed with these *facts* (a non-commutative
    op for a commutative-only one, several nodes for a single-node one...)
    raises ValueError with the reason and the algorithms that can run.
    """
    facts = facts or Facts()
    note = ""
    for source, name in (
        ("call", requested),
        ("communicator", comm_default),
        ("environment", config.algorithm_setting(collective)),
    ):
        if name is not None and name != "auto":
            algorithm = lookup(collective, name)
            if algorithm.composite and facts.nested:
                if source != "call":
                    continue  # a composition's inner call: the setting is for the outer calls; choose as auto
                reason = allowed(algorithm, replace(facts, nested=False))  # named by the composition itself
            else:
                reason = allowed(algorithm, facts)
            if reason is not None:
                can = [n for n in registry.algorithms(collective) if allowed(lookup(collective, n), facts) is None]
                fix = "keeps rank order" if algorithm.commutative_only and not facts.commutative else "can run here"
                raise ValueError(f"{collective} algorithm {name!r} (from the {source}) {reason}; use one that "
                                 f"{fix}: {', '.join(can)} (or 'auto')")
            break
    else:
        algorithm, source, note = auto_rule(collective, facts)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: algorithm %s (from the %s)%s", collective, algorithm.name, source, f", {note}" if note else "")
    return algorithm, source


def select(collective: str, requested: str | None, comm_default: str | None = None,
           facts: Facts | None = None) -> Algorithm:
    """The algorithm :func:`choose` picks, without its source."""
    return choose(collective, requested, comm_default, facts)[0]


# ---------------------------------------------------------------- a call's choice, kept per communicator


def facts_of(state: State, args: Args, nbytes: int | None, blocking: bool = True, nested: bool = False) -> Facts:
    """The facts of this rank's call *args* on *state*'s communicator (*nbytes*: :meth:`Args.message_bytes
    <mpicomm.plan.args.Args.message_bytes>`)."""
    op = args.op
    return Facts(p=state.size, bytes=nbytes, count=args.count if args.count >= 0 else None,
                 commutative=op is None or op.commutative, op=None if op is None else op.name, nodes=state.nodes,
                 ppn=state.ppn, device=args.xp is not None and args.xp is not np, rules=state.rules,
                 blocking=blocking, nested=nested)


def choose_for(state: State, args: Args, algorithm: str | None, blocking: bool = True,
               nested: bool = False) -> tuple[Algorithm, str]:
    """The algorithm for this rank's call *args* and where the choice came from (:func:`choose`, with the
    communicator's default and the facts of the call); kept per communicator for the facts seen before and the
    rule lists they were chosen by (a new list, ``SELECTION[c] = [...]`` or in the measured rules, makes new
    choices). *state*: a communicator's state (:class:`mpicomm.state.State`)."""
    collective = args.collective
    default = state.defaults.get(collective)
    setting = config.algorithm_setting(collective)
    nbytes = args.message_bytes(state.size)
    op = args.op
    cacheable = algorithm is None or type(algorithm) is str
    if cacheable:
        key = (collective, algorithm, default, setting, nbytes, args.count, op is None or op.commutative,
               None if op is None else op.name, args.xp is not None and args.xp is not np, blocking, nested,
               id(SELECTION.get(collective)),
               None if state.rules is None else id(state.rules.collectives.get(collective)))
        known = state.choices.get(key)
        if known is not None:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s: algorithm %s (from the %s)", collective, known[0].name, known[1])
            return known
    chosen = choose(collective, algorithm, default, facts_of(state, args, nbytes, blocking, nested))
    if cacheable:
        if len(state.choices) >= _CHOICES_KEPT:
            state.choices.clear()
        state.choices[key] = chosen
    return chosen
