"""Measured algorithm decisions: which algorithm was fastest, per collective and message size, on this machine.

``mpiexec -n N python -m mpicomm.tune --collectives`` times every registered
algorithm of each collective and writes what won as data, one JSON file per
host and rank layout, next to the fitted model in the cache directory
(:func:`mpicomm.model.cache_dir`)::

    {
      "format": "mpicomm-decisions",
      "version": 1,
      "layout": {"p": 2, "nodes": 1, "ppn": 2, "host": "node17"},
      "measured": "2026-11-25T12:00:00+00:00",
      "collectives": {
        "allreduce": [{"max_bytes": 4096, "algorithm": "recursive_doubling"},
                      {"max_bytes": 16777216, "algorithm": "ring"}]
      },
      "measurements": {"allreduce": [{"bytes": 8, "us": {"ring": 31.2, "recursive_doubling": 20.5}}, ...]}
    }

Like MPICH's JSON tuning files, the decisions are ranges: an entry covers the
sizes above the previous entry's ``max_bytes`` up to its own (the first from
0); the last entry may leave ``max_bytes`` out to cover every larger size. A
size above the last ``max_bytes`` is not covered, and the fitted model or the
static table decides it. Sizes are the selection size the dispatcher compares
(:func:`mpicomm.coll.dispatch.selection_bytes`: the whole vector for
allreduce, the whole gathered result for allgather...). ``measurements`` (the
median µs of each algorithm at each measured size) is optional and only
explained (``python -m mpicomm algorithms --explain``), never used to choose;
edit ``collectives`` by hand to override a decision.

Why a file of decisions and not only the model: the α-β-γ model predicts from
a few fitted constants and misses effects it does not model (Python overhead
per step, cache and scheduler behaviour); a measurement of the real calls
does not. The precedence (:func:`mpicomm.registry.choose`) is: call,
communicator default, environment, **these decisions** (when a file for the
communicator's layout exists and covers the size), fitted model, static table.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from . import model

__all__ = ["FORMAT", "VERSION", "DecisionsError", "Range", "Decisions", "lookup", "decide", "path_for", "save",
           "load", "load_for", "for_comm", "saved_layouts"]

FORMAT = "mpicomm-decisions"
VERSION = 1
_TOP = ("format", "version", "layout", "measured", "command", "comment", "collectives", "measurements")
_ENTRY = ("max_bytes", "algorithm")
_LAYOUT = ("p", "nodes", "ppn", "host")


class DecisionsError(ValueError):
    """A decisions file that cannot be used; the message names the file, the bad key and the fix."""


@dataclass(frozen=True)
class Range:
    """One decision: *algorithm* for sizes up to ``max_bytes`` (None: every larger size)."""

    max_bytes: int | None
    algorithm: str


@dataclass(frozen=True)
class Decisions:
    """The decisions of one layout: ``collectives`` maps a collective to its ranges, in increasing size."""

    p: int
    nodes: int
    ppn: int
    collectives: dict[str, tuple[Range, ...]]
    host: str = ""
    measured: str = ""
    command: str = ""
    measurements: dict[str, list[dict]] = field(default_factory=dict)
    path: str = ""  # where it was read from (for messages); not written

    @property
    def layout(self) -> str:
        """The :func:`mpicomm.model.layout_key` of these decisions (``p2-1x2``)."""
        return model.layout_key(self.p, self.nodes, self.ppn)

    def algorithm_for(self, collective: str, nbytes: int | None) -> str | None:
        """The decided algorithm for *collective* at *nbytes*, or None when no range covers it (see :func:`lookup`)."""
        ranges = self.collectives.get(collective)
        if not ranges:
            return None
        if nbytes is None:  # no size (barrier, or one ranks cannot know alike): only a range for every size
            return ranges[0].algorithm if len(ranges) == 1 and ranges[0].max_bytes is None else None
        for entry in ranges:
            if entry.max_bytes is None or nbytes <= entry.max_bytes:
                return entry.algorithm
        return None

    def measured_at(self, collective: str, nbytes: int | None) -> dict | None:
        """The measurement nearest *nbytes* (in ratio) for *collective*: ``{"bytes": ..., "us": {...}}``, or None."""
        points = self.measurements.get(collective) or []
        if not points:
            return None
        if nbytes is None or any(pt.get("bytes") is None for pt in points):
            return points[0]
        return min(points, key=lambda pt: abs(math.log(max(pt["bytes"], 1) / max(nbytes, 1))))

    def to_json(self) -> str:
        """The file's text (see the module docstring); hand-editable, one range per line."""
        layout: dict[str, Any] = {"p": self.p, "nodes": self.nodes, "ppn": self.ppn}
        if self.host:
            layout["host"] = self.host
        head = {"format": FORMAT, "version": VERSION, "layout": layout, "measured": self.measured}
        if self.command:
            head["command"] = self.command
        lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
        lines.append('  "collectives": {')
        names = list(self.collectives)
        for i, name in enumerate(names):
            entries = [json.dumps({"max_bytes": r.max_bytes, "algorithm": r.algorithm} if r.max_bytes is not None
                                  else {"algorithm": r.algorithm}) for r in self.collectives[name]]
            body = ",\n      ".join(entries)
            lines.append(f"    {json.dumps(name)}: [\n      {body}\n    ]" + ("," if i < len(names) - 1 else ""))
        lines.append("  }" + ("," if self.measurements else ""))
        if self.measurements:
            lines.append('  "measurements": {')
            names = list(self.measurements)
            for i, name in enumerate(names):
                points = ",\n      ".join(json.dumps(pt) for pt in self.measurements[name])
                lines.append(f"    {json.dumps(name)}: [\n      {points}\n    ]" + ("," if i < len(names) - 1 else ""))
            lines.append("  }")
        lines.append("}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<text>",
                  known: Callable[[str], Sequence[str]] | None = None) -> "Decisions":
        """Read and check a decisions file's *text* (*source* names it in errors).

        *known(collective)* lists the registered algorithms of a collective
        (ValueError for an unknown collective), e.g. ``mpicomm.registry.algorithms``;
        with it, names that are not registered are refused too. Raises
        :class:`DecisionsError` naming *source*, the key and the fix.
        """
        fix = "fix or delete the file, or write it again with mpiexec -n N python -m mpicomm.tune --collectives"

        def bad(where: str, problem: str) -> DecisionsError:
            return DecisionsError(f"decisions file {source}: {where} {problem}; {fix}")

        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise bad("the text", f"is not JSON ({exc})") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise bad('"format"', f'is not "{FORMAT}" (not an mpicomm decisions file)')
        if body.get("version") != VERSION:
            raise bad('"version"', f"= {body.get('version')!r}; this mpicomm reads version {VERSION}")
        for key in body:
            if key not in _TOP:
                raise bad(f"key {key!r}", f"is unknown; known keys: {', '.join(_TOP)}")

        def positive(value: Any, where: str) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(where, f"= {value!r} is not a positive integer")
            return value

        layout = body.get("layout")
        if not isinstance(layout, dict):
            raise bad('"layout"', f"= {layout!r} is not an object with p, nodes and ppn")
        for key in layout:
            if key not in _LAYOUT:
                raise bad(f"layout key {key!r}", f"is unknown; known: {', '.join(_LAYOUT)}")
        p, nodes, ppn = (positive(layout.get(k), f"layout.{k}") for k in ("p", "nodes", "ppn"))
        host = layout.get("host", "")
        for key, value in (("layout.host", host), ("measured", body.get("measured", "")),
                           ("command", body.get("command", ""))):
            if not isinstance(value, str):
                raise bad(key, f"= {value!r} is not a string")
        collectives = body.get("collectives")
        if not isinstance(collectives, dict):
            raise bad('"collectives"', f"= {collectives!r} is not an object of collective: [ranges]")
        ranges: dict[str, tuple[Range, ...]] = {}
        for name, entries in collectives.items():
            where = f"collectives.{name}"
            registered: Sequence[str] | None = None
            if known is not None:
                try:
                    registered = list(known(name))
                except ValueError as exc:
                    raise bad(f"collective {name!r}", f"is unknown ({exc})") from None
            if not isinstance(entries, list) or not entries:
                raise bad(where, f"= {entries!r} is not a non-empty list of {{\"max_bytes\": N, \"algorithm\": NAME}}")
            out: list[Range] = []
            for i, entry in enumerate(entries):
                at = f"{where}[{i}]"
                if not isinstance(entry, dict):
                    raise bad(at, f"= {entry!r} is not an object with max_bytes and algorithm")
                for key in entry:
                    if key not in _ENTRY:
                        raise bad(f"{at} key {key!r}", f"is unknown; an entry has {' and '.join(_ENTRY)}")
                algorithm = entry.get("algorithm")
                if not isinstance(algorithm, str) or not algorithm:
                    raise bad(f"{at}.algorithm", f"= {algorithm!r} is not an algorithm name")
                if registered is not None and algorithm not in registered:
                    raise bad(f"{at}.algorithm", f"= {algorithm!r} is not a registered {name} algorithm "
                                                 f"(registered: {', '.join(registered)})")
                limit = entry.get("max_bytes")
                if limit is None and i < len(entries) - 1:
                    raise bad(f"{at}.max_bytes", "is missing; only the last entry may leave it out (every larger size)")
                if limit is not None:
                    positive(limit, f"{at}.max_bytes")
                    if out and limit <= (out[-1].max_bytes or 0):
                        raise bad(f"{at}.max_bytes", f"= {limit} is not above the previous entry's "
                                                     f"{out[-1].max_bytes}; ranges go in increasing size")
                out.append(Range(limit, algorithm))
            ranges[name] = tuple(out)
        measurements = body.get("measurements", {})
        if not isinstance(measurements, dict) or not all(
                isinstance(v, list) and all(isinstance(pt, dict) and isinstance(pt.get("us"), dict) for pt in v)
                for v in measurements.values()):
            raise bad('"measurements"', 'is not an object of collective: [{"bytes": N, "us": {algorithm: us}}]')
        return cls(p, nodes, ppn, ranges, host, body.get("measured", ""), body.get("command", ""),
                   measurements, source if source != "<text>" else "")


def lookup(decisions: Decisions | None, collective: str, nbytes: int | None) -> str | None:
    """The algorithm *decisions* give *collective* at *nbytes* (selection bytes), or None when there are none for it.

    A range covers sizes above the previous range's ``max_bytes`` up to its own,
    edges included (``max_bytes`` 4096 covers 4096, not 4097); the first range
    starts at 0; a last range without ``max_bytes`` covers every larger size.
    """
    return decisions.algorithm_for(collective, nbytes) if decisions is not None else None


def decide(points: Sequence[Mapping[str, Any]], stick: float = 0.05) -> tuple[Range, ...]:
    """Ranges from measured *points* (``{"bytes": n or None, "us": {algorithm: µs}}``, ``auto`` ignored).

    At each size the fastest algorithm wins (ties: the first name in
    alphabetical order), unless the winner of the size below is within
    *stick* (relative) of it: then that one goes on, so that noise between
    near-equal algorithms does not cut the sizes into many short ranges.
    Neighbouring sizes with the same winner merge into one range, which ends
    at the largest of them. The last range ends at the largest size measured
    (larger sizes are left to the model), except that points without a size
    (barrier) give one range for every size.
    """
    ranges: list[Range] = []
    ordered = sorted(points, key=lambda pt: -1 if pt.get("bytes") is None else pt["bytes"])
    for pt in ordered:
        times = {n: t for n, t in pt["us"].items() if n != "auto" and t is not None and math.isfinite(t)}
        if not times:
            continue
        winner = min(sorted(times), key=times.__getitem__)
        if ranges and ranges[-1].algorithm in times and times[ranges[-1].algorithm] <= (1 + stick) * times[winner]:
            winner = ranges[-1].algorithm
        limit = pt.get("bytes")
        if ranges and ranges[-1].algorithm == winner:
            ranges[-1] = Range(limit, winner)
        else:
            ranges.append(Range(limit, winner))
    return tuple(ranges)


def path_for(host: str, layout: str) -> str:
    """The decisions file of *host* and *layout* (a :func:`mpicomm.model.layout_key`): next to the fitted model,
    ``decisions-<host>-<layout>.json`` in :func:`mpicomm.model.cache_dir`."""
    name = os.path.basename(model.path_for(host, layout))
    return os.path.join(model.cache_dir(), "decisions-" + name.removeprefix("model-"))


def save(decisions: Decisions, path: str | None = None) -> str:
    """Write *decisions* to *path* (default :func:`path_for` its host and layout), atomically; returns the path."""
    return model.write_atomic(path or path_for(decisions.host, decisions.layout), decisions.to_json(), ".decisions-")


def load(path: str, known: Callable[[str], Sequence[str]] | None = None) -> Decisions:
    """Read the decisions file *path*: :class:`DecisionsError` naming it and what is wrong (OSError if unreadable)."""
    with open(path) as f:
        text = f.read()
    return Decisions.from_json(text, path, known)


def load_for(host: str, layout: str, known: Callable[[str], Sequence[str]] | None = None) -> Decisions | None:
    """The decisions saved for *host* and *layout*, or None when there is no file; :class:`DecisionsError` for a
    file that is not usable, including one whose own layout is another (a file copied under the wrong name)."""
    path = path_for(host, layout)
    try:
        decisions = load(path, known)
    except FileNotFoundError:
        return None
    if decisions.layout != layout:
        raise DecisionsError(f"decisions file {path}: \"layout\" is {decisions.layout}, but the file is named for "
                             f"{layout}; measure this layout with mpiexec -n N python -m mpicomm.tune --collectives, "
                             f"or rename the file")
    return decisions


def for_comm(comm: Any, host: str, nodes: int, ppn: int,
             known: Callable[[str], Sequence[str]] | None = None) -> Decisions | None:
    """The decisions for communicator *comm* (an ``MPI.Intracomm``), the same on every rank. COLLECTIVE over *comm*.

    Rank 0 reads the file for its *host* and ``layout_key(size, nodes, ppn)``
    and broadcasts it, as :func:`mpicomm.model.for_comm` does for the fit, so
    every rank makes the same choice. A file that cannot be used is ignored
    with a RuntimeWarning on rank 0 naming it, the bad key and the fix
    (never an error here: the other ranks would wait in the broadcast).
    """
    from mpi4py import MPI

    plain = MPI.Intracomm(comm)
    text: str | None = None
    if plain.Get_rank() == 0:
        try:
            found = load_for(host, model.layout_key(plain.Get_size(), nodes, ppn), known)
            text = found.to_json() if found is not None else None
        except Exception as exc:  # never leave the other ranks waiting in the broadcast
            warnings.warn(f"ignoring the measured decisions: {exc}", RuntimeWarning, stacklevel=2)
    text = plain.bcast(text, root=0)
    return Decisions.from_json(text) if text is not None else None


def saved_layouts(host: str) -> list[str]:
    """The layouts (``p2-1x2``...) that have a decisions file for *host* in the cache directory, newest first."""
    folder = model.cache_dir()
    prefix, suffix = os.path.basename(path_for(host, "LAYOUT")).split("LAYOUT")
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(suffix)]
    except OSError:
        return []
    names.sort(key=lambda n: os.path.getmtime(os.path.join(folder, n)), reverse=True)
    return [n[len(prefix):len(n) - len(suffix)] for n in names]
