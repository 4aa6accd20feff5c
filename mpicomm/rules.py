"""Selection rules: the one data format that says which algorithm ``auto`` picks, per collective.

A rules file is JSON, hand-editable, one rule per line::

    {
      "format": "mpicomm-rules",
      "version": 1,
      "layout": {"p": 2, "nodes": 1, "ppn": 2, "host": "node17"},
      "measured": "2026-11-25T12:00:00+00:00",
      "collectives": {
        "allreduce": [{"max_bytes": 4096, "device": false, "algorithm": "recursive_doubling"},
                      {"max_bytes": 16777216, "device": false, "algorithm": "ring"}],
        "bcast": [{"max_bytes": 12288, "algorithm": "binomial"}, {"algorithm": "scatter_allgather"}]
      },
      "measurements": {"allreduce": [{"bytes": 8, "us": {"ring": 31.2, "recursive_doubling": 20.5}}, ...]}
    }

Per collective, an ordered list of rules; a rule is conditions and an
``algorithm``. The first rule whose conditions all hold **and** whose algorithm
can run the call (:func:`mpicomm.registry.allowed`) wins. Conditions are on a call's
:class:`~mpicomm.facts.Facts`, which every rank knows alike (:data:`CONDITIONS`):

* ``max_bytes`` / ``min_bytes``: the selection size (the whole vector for
  allreduce, the whole gathered result for allgather..., see
  :meth:`mpicomm.catalogue.Collective.nbytes`) is at most / at least this; a call
  without a size (barrier, or a size ranks cannot know alike) fails both;
* ``pof2``: p is (true) or is not (false) a power of two;
* ``min_p`` / ``max_p``: bounds on p;
* ``min_count``: elements ≥ this multiple of p (``min_count: 1`` means count ≥ p);
  about speed only: every algorithm runs with any count;
* ``device``: the buffers are (true) or are not (false) device (GPU) memory.

A rule without conditions matches every call. Two kinds of rules file exist,
in this one format:

* **the default rules**, shipped with mpicomm (``mpicomm/default_rules.json``,
  :func:`default`; no ``layout``): MPICH's defaults, moved where the
  measurements of BENCHMARKS.md showed another algorithm faster;
* **measured rules**, written by ``mpiexec -n N python -m mpicomm.tune --collectives``
  for one host and rank layout (``layout``; ``rules-<host>-<layout>.json`` next
  to the fitted model in :func:`mpicomm.model.cache_dir`, :func:`path_for`): at
  each measured size the fastest algorithm, as ``max_bytes`` ranges
  (:func:`decide`) that end at the largest size measured, each with
  ``device: false`` (they were measured on host arrays). A rules file with a
  layout applies only to communicators of that many ranks.

``measurements`` (the median µs of each algorithm at each measured size) is
optional and only explained (``python -m mpicomm algorithms --explain``), never
used to choose; ``measured``, ``command`` and ``comment`` are free text. Edit
``collectives`` by hand to override a choice.

``auto`` (:func:`mpicomm.selection.choose`) tries the measured rules of the
communicator's layout (when a file exists), then the default rules, then any
algorithm that can run; the choice's source is ``"rules"``, ``"table"`` and
``"table"``. The α-β-γ model never chooses: it predicts
(:func:`mpicomm.registry.predict`) and explains.

Files of the earlier ``mpicomm-decisions`` format (``decisions-<host>-<layout>.json``,
size ranges) are still read: each range becomes a ``max_bytes`` rule with
``device: false``, as ``tune --collectives`` writes now. A file that cannot be
used is refused with :class:`RulesError`, naming the file, the key and the fix.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import model
from .facts import Facts

__all__ = ["FORMAT", "VERSION", "CONDITIONS", "RulesError", "Rules", "holds", "describe", "decide", "default",
           "DEFAULT_PATH", "path_for", "save", "load", "load_for", "for_comm", "saved_layouts", "TUNE"]

FORMAT = "mpicomm-rules"
VERSION = 1
#: The conditions a rule may have (see the module docstring); every other key but ``algorithm`` is refused.
CONDITIONS = ("max_bytes", "min_bytes", "pof2", "min_p", "max_p", "min_count", "device")
_TOP = ("format", "version", "layout", "measured", "command", "comment", "collectives", "measurements")
_LAYOUT = ("p", "nodes", "ppn", "host")
_OLD_FORMAT = "mpicomm-decisions"  # the measured decisions of earlier versions: read, converted
#: The default rules shipped with mpicomm.
DEFAULT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_rules.json")
#: What writes measured rules (the fix named in errors about them).
TUNE = "mpiexec -n N python -m mpicomm.tune --collectives"


class RulesError(ValueError):
    """A rules file that cannot be used; the message names the file, the bad key and the fix."""


def holds(rule: Mapping[str, Any], facts: Facts) -> bool:
    """Whether every condition of *rule* holds for a call with these *facts* (``p``, ``bytes``, ``count``,
    ``device``; see the module docstring). ValueError for a condition that is not one of :data:`CONDITIONS`."""
    p, nbytes, count = facts.p or 1, facts.bytes, facts.count
    for key, value in rule.items():
        if key == "algorithm":
            continue
        if key == "max_bytes":
            if nbytes is None or nbytes > value:
                return False
        elif key == "min_bytes":
            if nbytes is None or nbytes < value:
                return False
        elif key == "pof2":
            if (p & (p - 1) == 0) != value:
                return False
        elif key == "min_p":
            if p < value:
                return False
        elif key == "max_p":
            if p > value:
                return False
        elif key == "min_count":
            if count is None or count < value * p:
                return False
        elif key == "device":
            if bool(facts.device) != value:
                return False
        else:
            raise ValueError(f"selection rule {dict(rule)} has unknown condition {key!r}; known: "
                             f"{', '.join(CONDITIONS)}")
    return True


def describe(rule: Mapping[str, Any]) -> str:
    """A rule as words: ``"up to 4096 B, host buffers → ring"``, ``"otherwise → ring"``."""
    words = []
    for key, value in rule.items():
        if key == "algorithm":
            continue
        words.append({"max_bytes": f"up to {value} B", "min_bytes": f"from {value} B",
                      "pof2": "p a power of two" if value else "p not a power of two", "min_p": f"p >= {value}",
                      "max_p": f"p <= {value}", "min_count": f"count >= {value}·p",
                      "device": "device buffers" if value else "host buffers"}.get(key, f"{key}={value}"))
    return f"{', '.join(words) or 'otherwise'} → {rule.get('algorithm')}"


@dataclass(frozen=True)
class Rules:
    """One rules file: ``collectives`` maps a collective to its rules (plain dicts, in order).

    ``p``/``nodes``/``ppn``/``host``: the layout measured rules were measured
    on (0, 0, 0, "" for rules of any layout, as the default rules are).
    """

    collectives: dict[str, list[dict]]
    p: int = 0
    nodes: int = 0
    ppn: int = 0
    host: str = ""
    measured: str = ""
    command: str = ""
    comment: str = ""
    measurements: dict[str, list[dict]] = field(default_factory=dict)
    path: str = ""  # where it was read from (for messages); not written

    @property
    def layout(self) -> str:
        """The :func:`mpicomm.model.layout_key` of the rules (``p2-1x2``), or "" for rules of any layout."""
        return model.layout_key(self.p, self.nodes, self.ppn) if self.p else ""

    @property
    def name(self) -> str:
        """What to call these rules in messages: their file, or their layout."""
        return self.path or (f"the measured rules of {self.layout}" if self.p else "the rules")

    def applies(self, facts: Facts) -> bool:
        """Whether these rules may choose for a call with *facts*: rules of a layout only for its number of ranks."""
        return not self.p or self.p == (facts.p or 1)

    def first(self, collective: str, facts: Facts,
              accept: Callable[[str], bool] | None = None) -> tuple[int, dict] | None:
        """(index, rule) of the first rule of *collective* that holds for *facts* and whose algorithm *accept*
        takes (default: any); None when there is none, or the rules do not apply (:meth:`applies`)."""
        if not self.applies(facts):
            return None
        for index, rule in enumerate(self.collectives.get(collective) or ()):
            if holds(rule, facts) and (accept is None or accept(rule["algorithm"])):
                return index, rule
        return None

    def algorithm_for(self, collective: str, nbytes: int | None, **facts: Any) -> str | None:
        """The algorithm of the first rule of *collective* that holds at *nbytes* (host buffers, and *facts*:
        ``p``, ``count``...), whether or not it can run there; None when no rule holds."""
        found = self.first(collective, Facts(**{"p": self.p or 1, **facts, "bytes": nbytes}))
        return found[1]["algorithm"] if found is not None else None

    def measured_at(self, collective: str, nbytes: int | None) -> dict | None:
        """The measurement nearest *nbytes* (in ratio) for *collective*: ``{"bytes": ..., "us": {...}}``, or None."""
        points = self.measurements.get(collective) or []
        if not points:
            return None
        if nbytes is None or any(pt.get("bytes") is None for pt in points):
            return points[0]
        return min(points, key=lambda pt: abs(math.log(max(pt["bytes"], 1) / max(nbytes, 1))))

    def to_json(self) -> str:
        """The file's text (see the module docstring); hand-editable, one rule per line."""
        head: dict[str, Any] = {"format": FORMAT, "version": VERSION}
        if self.p:
            layout: dict[str, Any] = {"p": self.p, "nodes": self.nodes, "ppn": self.ppn}
            if self.host:
                layout["host"] = self.host
            head["layout"] = layout
        for key in ("measured", "command", "comment"):
            if getattr(self, key):
                head[key] = getattr(self, key)
        lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()]
        lines += _section("collectives", self.collectives, last=not self.measurements)
        if self.measurements:
            lines += _section("measurements", self.measurements, last=True)
        lines.append("}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<text>", known: Callable[[str], Sequence[str]] | None = None,
                  fix: str = "") -> Rules:
        """Read and check a rules file's *text* (*source* names it in errors).

        *known(collective)* lists the registered algorithms of a collective
        (ValueError for an unknown collective), e.g. ``mpicomm.registry.algorithms``;
        with it, names that are not registered are refused too. *fix*: what
        the errors advise (default: fix or delete the file, or measure again).
        Raises :class:`RulesError` naming *source*, the key and the fix. A file
        of the earlier ``mpicomm-decisions`` format is converted (see the module
        docstring).
        """
        fix = fix or f"fix or delete the file, or write it again with {TUNE}"

        def bad(where: str, problem: str) -> RulesError:
            return RulesError(f"rules file {source}: {where} {problem}; {fix}")

        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise bad("the text", f"is not JSON ({exc})") from None
        if isinstance(body, dict) and body.get("format") == _OLD_FORMAT:
            body = _converted(body, bad)
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise bad('"format"', f'is not "{FORMAT}" (not an mpicomm rules file)')
        if body.get("version") != VERSION:
            raise bad('"version"', f"= {body.get('version')!r}; this mpicomm reads version {VERSION}")
        for key in body:
            if key not in _TOP:
                raise bad(f"key {key!r}", f"is unknown; known keys: {', '.join(_TOP)}")

        def positive(value: Any, where: str) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(where, f"= {value!r} is not a positive integer")
            return value

        p = nodes = ppn = 0
        host = ""
        if "layout" in body:
            layout = body["layout"]
            if not isinstance(layout, dict):
                raise bad('"layout"', f"= {layout!r} is not an object with p, nodes and ppn")
            for key in layout:
                if key not in _LAYOUT:
                    raise bad(f"layout key {key!r}", f"is unknown; known: {', '.join(_LAYOUT)}")
            p, nodes, ppn = (positive(layout.get(k), f"layout.{k}") for k in ("p", "nodes", "ppn"))
            host = layout.get("host", "")
            if not isinstance(host, str):
                raise bad("layout.host", f"= {host!r} is not a string")
        for key in ("measured", "command", "comment"):
            if not isinstance(body.get(key, ""), str):
                raise bad(f'"{key}"', f"= {body[key]!r} is not a string")
        collectives = body.get("collectives")
        if not isinstance(collectives, dict):
            raise bad('"collectives"', f"= {collectives!r} is not an object of collective: [rules]")
        out: dict[str, list[dict]] = {}
        for name, rules in collectives.items():
            registered: Sequence[str] | None = None
            if known is not None:
                try:
                    registered = list(known(name))
                except ValueError as exc:
                    raise bad(f"collective {name!r}", f"is unknown ({exc})") from None
            out[name] = _checked(name, rules, registered, bad)
        measurements = body.get("measurements", {})
        if not isinstance(measurements, dict) or not all(
                isinstance(v, list) and all(isinstance(pt, dict) and isinstance(pt.get("us"), dict) for pt in v)
                for v in measurements.values()):
            raise bad('"measurements"', 'is not an object of collective: [{"bytes": N, "us": {algorithm: us}}]')
        return cls(out, p, nodes, ppn, host, body.get("measured", ""), body.get("command", ""),
                   body.get("comment", ""), measurements, source if source != "<text>" else "")


def _section(key: str, value: dict[str, list[dict]], last: bool) -> list[str]:
    lines = [f"  {json.dumps(key)}: {{"]
    names = list(value)
    for i, name in enumerate(names):
        body = ",\n      ".join(json.dumps(item) for item in value[name])
        lines.append(f"    {json.dumps(name)}: [\n      {body}\n    ]" + ("," if i < len(names) - 1 else ""))
    lines.append("  }" + ("" if last else ","))
    return lines


def _checked(name: str, rules: Any, registered: Sequence[str] | None, bad: Callable[[str, str], RulesError]
             ) -> list[dict]:
    """The rules of collective *name*, each checked: known conditions of the right types, an algorithm."""
    where = f"collectives.{name}"
    if not isinstance(rules, list) or not rules:
        raise bad(where, f'= {rules!r} is not a non-empty list of {{conditions..., "algorithm": NAME}}')
    out = []
    for i, rule in enumerate(rules):
        at = f"{where}[{i}]"
        if not isinstance(rule, dict):
            raise bad(at, f"= {rule!r} is not an object of conditions and an algorithm")
        for key, value in rule.items():
            if key == "algorithm":
                continue
            if key not in CONDITIONS:
                raise bad(f"{at} key {key!r}", f"is unknown; a rule has conditions ({', '.join(CONDITIONS)}) "
                                                f"and an algorithm")
            if key in ("pof2", "device"):
                if not isinstance(value, bool):
                    raise bad(f"{at}.{key}", f"= {value!r} is not true or false")
            elif isinstance(value, bool) or not isinstance(value, int) or value < (1 if key in ("min_p", "max_p")
                                                                                    else 0):
                kind = "a positive integer" if key in ("min_p", "max_p") else "an integer >= 0"
                raise bad(f"{at}.{key}", f"= {value!r} is not {kind}")
        algorithm = rule.get("algorithm")
        if not isinstance(algorithm, str) or not algorithm:
            raise bad(f"{at}.algorithm", f"= {algorithm!r} is not an algorithm name")
        if registered is not None and algorithm not in registered:
            raise bad(f"{at}.algorithm", f"= {algorithm!r} is not a registered {name} algorithm "
                                         f"(registered: {', '.join(registered)})")
        out.append({**{k: v for k, v in rule.items() if k != "algorithm"}, "algorithm": algorithm})
    return out


def _converted(body: dict, bad: Callable[[str, str], RulesError]) -> dict:
    """An ``mpicomm-decisions`` file (version 1: size ranges per collective) as a rules file's body."""
    if body.get("version") != 1:
        raise bad('"version"', f"= {body.get('version')!r} of an {_OLD_FORMAT} file; this mpicomm reads version 1")
    collectives = body.get("collectives")
    if not isinstance(collectives, dict):
        raise bad('"collectives"', f"= {collectives!r} is not an object of collective: [ranges]")
    rules: dict[str, Any] = {}
    for name, ranges in collectives.items():
        if not isinstance(ranges, list):
            rules[name] = ranges  # refused by the check of the rules
            continue
        out: list[Any] = []
        previous = 0
        for i, entry in enumerate(ranges):
            at = f"collectives.{name}[{i}]"
            if not isinstance(entry, dict):
                out.append(entry)
                continue
            for key in entry:
                if key not in ("max_bytes", "algorithm"):
                    raise bad(f"{at} key {key!r}", f"is unknown; a range of an {_OLD_FORMAT} file has max_bytes "
                                                    f"and algorithm")
            limit = entry.get("max_bytes")
            if limit is None and i < len(ranges) - 1:
                raise bad(f"{at}.max_bytes", "is missing; only the last range may leave it out (every larger size)")
            if limit is not None:
                if isinstance(limit, int) and not isinstance(limit, bool) and limit <= previous:
                    raise bad(f"{at}.max_bytes", f"= {limit} is not above the previous range's {previous}; ranges "
                                                 f"go in increasing size")
                previous = limit if isinstance(limit, int) else previous
            rule = ({"max_bytes": limit} if limit is not None else {}) | {"device": False}
            out.append({**rule, "algorithm": entry.get("algorithm")})
        rules[name] = out
    converted = {k: v for k, v in body.items() if k != "collectives"} | {"format": FORMAT, "version": VERSION,
                                                                         "collectives": rules}
    return converted


def decide(points: Sequence[Mapping[str, Any]], stick: float = 0.05, **conditions: Any) -> list[dict]:
    """Rules from measured *points* (``{"bytes": n or None, "us": {algorithm: µs}}``, ``auto`` ignored).

    At each size the fastest algorithm wins (ties: the first name in
    alphabetical order), unless the winner of the size below is within
    *stick* (relative) of it: then that one goes on, so that noise between
    near-equal algorithms does not cut the sizes into many short ranges.
    Neighbouring sizes with the same winner merge into one rule,
    ``{"max_bytes": the largest of them, **conditions, "algorithm": winner}``:
    a first-match list of ``max_bytes`` rules is a list of size ranges. The
    last rule ends at the largest size measured (larger sizes are left to the
    default rules), except that points without a size (barrier) give one rule
    without ``max_bytes``, for every size.
    """
    ranges: list[tuple[int | None, str]] = []
    ordered = sorted(points, key=lambda pt: -1 if pt.get("bytes") is None else pt["bytes"])
    for pt in ordered:
        times = {n: t for n, t in pt["us"].items() if n != "auto" and t is not None and math.isfinite(t)}
        if not times:
            continue
        winner = min(sorted(times), key=times.__getitem__)
        if ranges and ranges[-1][1] in times and times[ranges[-1][1]] <= (1 + stick) * times[winner]:
            winner = ranges[-1][1]
        limit = pt.get("bytes")
        if ranges and ranges[-1][1] == winner:
            ranges[-1] = (limit, winner)
        else:
            ranges.append((limit, winner))
    return [{**({"max_bytes": limit} if limit is not None else {}), **conditions, "algorithm": name}
            for limit, name in ranges]


def default(path: str = DEFAULT_PATH) -> Rules:
    """The default rules shipped with mpicomm (:data:`DEFAULT_PATH`); :class:`RulesError` if the file is broken."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return Rules.from_json(text, path, fix="the default rules of this mpicomm installation are damaged; "
                                           "reinstall mpicomm")


def path_for(host: str, layout: str) -> str:
    """The measured rules of *host* and *layout* (a :func:`mpicomm.model.layout_key`): next to the fitted model,
    ``rules-<host>-<layout>.json`` in :func:`mpicomm.model.cache_dir`."""
    return _named("rules-", host, layout)


def _named(prefix: str, host: str, layout: str) -> str:
    name = os.path.basename(model.path_for(host, layout))
    return os.path.join(model.cache_dir(), prefix + name.removeprefix("model-"))


def save(rules: Rules, path: str | None = None) -> str:
    """Write *rules* to *path* (default :func:`path_for` their host and layout), atomically; returns the path."""
    if path is None and not rules.p:
        raise ValueError("save: these rules have no layout; give the path to write them to")
    return model.write_atomic(path or path_for(rules.host, rules.layout), rules.to_json(), ".rules-")


def load(path: str, known: Callable[[str], Sequence[str]] | None = None) -> Rules:
    """Read the rules file *path*: :class:`RulesError` naming it and what is wrong (OSError if unreadable)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return Rules.from_json(text, path, known)


def load_for(host: str, layout: str, known: Callable[[str], Sequence[str]] | None = None) -> Rules | None:
    """The measured rules saved for *host* and *layout*, or None when there is no file; :class:`RulesError` for a
    file that is not usable, including one whose own layout is another (a file copied under the wrong name).

    Without ``rules-<host>-<layout>.json``, a ``decisions-<host>-<layout>.json`` of an earlier version is read
    (converted, see the module docstring)."""
    for path in (path_for(host, layout), _named("decisions-", host, layout)):
        try:
            rules = load(path, known)
        except FileNotFoundError:
            continue
        if rules.layout != layout:
            raise RulesError(f"rules file {path}: \"layout\" is {rules.layout or 'missing'}, but the file is named "
                             f"for {layout}; measure this layout with {TUNE}, or rename the file")
        return rules
    return None


def for_comm(comm: Any, host: str, nodes: int, ppn: int,
             known: Callable[[str], Sequence[str]] | None = None) -> Rules | None:
    """The measured rules for communicator *comm* (an ``MPI.Intracomm``), the same on every rank. COLLECTIVE.

    Rank 0 reads the file for its *host* and ``layout_key(size, nodes, ppn)``
    and broadcasts it, as :func:`mpicomm.model.for_comm` does for the fit, so
    every rank makes the same choice. A file that cannot be used is ignored
    with a RuntimeWarning on rank 0 naming it, the bad key and the fix
    (never an error here: the other ranks would wait in the broadcast).
    """
    from mpi4py import MPI

    plain = MPI.Intracomm(comm)
    text: str | None = None
    path = ""
    if plain.Get_rank() == 0:
        try:
            found = load_for(host, model.layout_key(plain.Get_size(), nodes, ppn), known)
            if found is not None:
                text, path = found.to_json(), found.path
        except Exception as exc:  # never leave the other ranks waiting in the broadcast
            warnings.warn(f"ignoring the measured rules: {exc}", RuntimeWarning, stacklevel=2)
    text, path = plain.bcast((text, path), root=0)
    return Rules.from_json(text, path) if text is not None else None


def saved_layouts(host: str) -> list[str]:
    """The layouts (``p2-1x2``...) that have measured rules for *host* in the cache directory (or decisions of an
    earlier version), newest first."""
    folder = model.cache_dir()
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found: dict[str, float] = {}
    for prefix, suffix in (os.path.basename(_named(kind, host, "LAYOUT")).split("LAYOUT")
                           for kind in ("rules-", "decisions-")):
        for n in names:
            if n.startswith(prefix) and n.endswith(suffix):
                layout = n[len(prefix):len(n) - len(suffix)]
                try:
                    found.setdefault(layout, os.path.getmtime(os.path.join(folder, n)))
                except OSError:
                    continue
    return sorted(found, key=found.__getitem__, reverse=True)
