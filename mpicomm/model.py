"""The α-β-γ cost model's machine: what messages, reductions and copies cost here, fitted by ``python -m mpicomm.tune``.

A :class:`Machine` holds what one message costs on each path (a :class:`Link`:
α seconds of latency, β seconds per byte), what reducing and copying a byte
cost locally (γ, δ), and the fixed Python cost of one mpicomm collective
call (plus what validation adds). This module is arithmetic only: each
algorithm's cost function ``fn(machine, n, p) -> seconds`` is written beside
the algorithm in :mod:`mpicomm.coll` (its docstring states the same formula in
words, the only place it is written so) and registered with
:func:`mpicomm.registry.cost`; :func:`mpicomm.registry.predict` evaluates it
and adds the per-call overhead::

    mpicomm.predict("allreduce", "ring", 1 << 20, 4)   # seconds

*n* is the message size of the collective's size rule in
:mod:`mpicomm.catalogue` (the one definition the selection table, the
benchmarks and the trace use too): the whole vector for
bcast/reduce/allreduce/scan/exscan, the per-rank block for gather/scatter(v),
everything gathered for allgather(v), each rank's whole send for
alltoall(v), the whole input for reduce_scatter(_block). The v-forms and
``reduce_scatter_block`` use their family's functions, plus their own where they
add a term (header messages). Flat algorithms pay ``m.link(p)``:
the intra-node link when all p ranks fit on one node, else the inter-node one.
Conventions for reading the docstrings: ``lg p`` of a tree is ⌈lg p⌉ (its
depth); algorithms that fold a non-power-of-two p run their rounds over p' (the
largest power of two ≤ p), so their ``lg p`` and ``(p−1)/p`` are lg p' and
(p'−1)/p', plus the fold's terms (after ``; p ≠ p':``); N = n·p where the
docstring says so; ``T(collective, n, q, link)`` in a hierarchical algorithm's
formula is the least cost of that collective's flat algorithms over q ranks on
that link (:func:`mpicomm.registry.cheapest`). With p = 1 no message moves: every
algorithm costs 0 (plus the call overhead). Rooted collectives are modelled
with root 0.

Two regimes: a Machine holds per-byte costs for working sets that fit in the
cache (``intra.beta``, ``inter.beta``, ``gamma``, ``copy``) and for those that
do not (``intra_mem.beta``, ``inter_mem.beta``, ``gamma_mem``, ``copy_mem``).
The working set of a call is its message size n (every rank reads n bytes of
input and writes n of output), except for gather/scatter(v), whose n is one
rank's block: there it is all p blocks, n·p (:func:`working_set`). A call whose working set is
≤ ``cache_bytes`` pays the cache values, a larger one the memory values (a
step, no blend): the registry hands each cost function ``machine.at(working set)``.

Fits are saved per host and rank layout as small JSON files in
:func:`cache_dir`; :func:`for_comm` (collective) loads the one for a
communicator, for predictions (:func:`mpicomm.predict`) and explanations
(``python -m mpicomm algorithms --explain``). The model does not choose
algorithms: ``algorithm="auto"`` follows the selection rules
(:mod:`mpicomm.rules`). Without a fit, predictions use :data:`NOMINAL`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from typing import Any

from .catalogue import row

__all__ = [
    "Link", "Machine", "NOMINAL", "FORMAT_VERSION", "CostFunction", "cache_dir", "layout_key", "path_for", "save",
    "load", "for_comm", "fit_line", "fit_memory_slope", "working_set", "now", "ceil_lg", "pof2", "folded",
    "segments", "node_layout", "write_atomic", "direct_exchange", "halving_doubling",
]

log = logging.getLogger("mpicomm")

#: Version of the saved JSON layout; files of another version are ignored (with a warning).
FORMAT_VERSION = 1
_FORMAT = "mpicomm-model"


@dataclass(frozen=True)
class Link:
    """One communication path: ``alpha`` seconds per message, ``beta`` seconds per byte."""

    alpha: float
    beta: float


@dataclass(frozen=True)
class Machine:
    """The fitted (or nominal) costs of one host and rank layout.

    ``intra``/``inter``: the links within a node and between nodes; ``gamma``:
    seconds per byte reduced (``np.add(a, b, out=c)`` on float64, per byte of
    one operand); ``copy`` (δ): seconds per byte of a local copy
    ``dst[...] = src``; ``overhead``: seconds of Python per mpicomm collective
    call with validation off; ``validation``: seconds added per call with it
    on; ``ppn``: the most ranks on any one node; ``nodes``; ``host`` (rank
    0's); ``created``: ISO time of the fit.

    The memory regime (working sets above ``cache_bytes``, see :meth:`at`):
    ``intra_mem``/``inter_mem`` (links; their α is normally the cache
    link's), ``gamma_mem``, ``copy_mem``. Left out (None), each takes its
    cache-regime value, so a machine without them has one regime.
    """

    intra: Link
    inter: Link
    gamma: float
    copy: float
    overhead: float
    validation: float
    ppn: int
    nodes: int
    host: str
    created: str
    cache_bytes: int = 32 << 20
    intra_mem: Link | None = None
    inter_mem: Link | None = None
    gamma_mem: float | None = None
    copy_mem: float | None = None
    #: (collective, algorithm, factor): measured / predicted communication time, from ``tune --collectives``
    corrections: tuple[tuple[str, str, float], ...] = ()

    def __post_init__(self) -> None:
        """Fill the memory-regime values left out with the cache-regime ones."""
        for mem, cached in (("intra_mem", "intra"), ("inter_mem", "inter"), ("gamma_mem", "gamma"),
                            ("copy_mem", "copy")):
            if getattr(self, mem) is None:
                object.__setattr__(self, mem, getattr(self, cached))

    def at(self, working_set: float) -> Machine:
        """The machine a call with *working_set* bytes pays: itself when working_set ≤ ``cache_bytes``, else a
        copy whose ``intra``/``inter``/``gamma``/``copy`` are the memory-regime values."""
        if working_set <= self.cache_bytes:
            return self
        # (never None once made: __post_init__ fills each one left out with its cache-regime value)
        assert self.intra_mem is not None and self.inter_mem is not None
        assert self.gamma_mem is not None and self.copy_mem is not None
        return replace(self, intra=self.intra_mem, inter=self.inter_mem, gamma=self.gamma_mem, copy=self.copy_mem)

    def correction(self, collective: str, algorithm: str) -> float:
        """The factor measurements put on the formula of *collective*'s *algorithm* (1 when none was measured)."""
        if not self.corrections:
            return 1.0
        table = self.__dict__.get("_corrections")
        if table is None:
            table = {(c, a): f for c, a, f in self.corrections}
            self.__dict__["_corrections"] = table  # (frozen: a cache, not a field)
        return table.get((collective, algorithm), 1.0)

    def link(self, p: int) -> Link:
        """The link a flat algorithm over *p* ranks pays: intra when they fit on one node (p ≤ ppn), else inter."""
        return self.intra if p <= self.ppn else self.inter

    def to_json(self) -> str:
        """This machine as a JSON document (see :meth:`from_json`)."""
        body = {"format": _FORMAT, "version": FORMAT_VERSION, **asdict(self)}
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Machine:
        """Read a machine written by :meth:`to_json`; ValueError naming what is wrong otherwise."""
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(body, dict) or body.get("format") != _FORMAT:
            raise ValueError(f"not an mpicomm model file (no \"format\": \"{_FORMAT}\")")
        if body.get("version") != FORMAT_VERSION:
            raise ValueError(f"format version {body.get('version')!r}, this mpicomm reads version {FORMAT_VERSION}")

        def number(value: Any, what: str) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{what} = {value!r} is not a non-negative number")
            return float(value)

        def count(value: Any, what: str) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{what} = {value!r} is not a positive integer")
            return value

        def link(value: Any, what: str) -> Link:
            if not isinstance(value, dict):
                raise ValueError(f"{what} = {value!r} is not an object with alpha and beta")
            return Link(number(value.get("alpha"), f"{what}.alpha"), number(value.get("beta"), f"{what}.beta"))

        def optional_link(key: str) -> Link | None:
            return link(body[key], key) if body.get(key) is not None else None

        def optional_number(key: str) -> float | None:
            return number(body[key], key) if body.get(key) is not None else None

        extra: dict[str, Any] = {}
        if body.get("corrections"):
            rows = body["corrections"]
            if not isinstance(rows, list) or not all(
                    isinstance(r, list) and len(r) == 3 and isinstance(r[0], str) and isinstance(r[1], str)
                    for r in rows):
                raise ValueError(f"corrections = {rows!r} is not a list of [collective, algorithm, factor]")
            extra["corrections"] = tuple((c, a, number(f, f"corrections factor of {c}/{a}")) for c, a, f in rows)
        if body.get("cache_bytes") is not None:
            extra["cache_bytes"] = count(body["cache_bytes"], "cache_bytes")
        text_fields = {}
        for key in ("host", "created"):
            if not isinstance(body.get(key), str):
                raise ValueError(f"{key} = {body.get(key)!r} is not a string")
            text_fields[key] = body[key]
        return cls(
            intra=link(body.get("intra"), "intra"), inter=link(body.get("inter"), "inter"),
            gamma=number(body.get("gamma"), "gamma"), copy=number(body.get("copy"), "copy"),
            overhead=number(body.get("overhead"), "overhead"), validation=number(body.get("validation"), "validation"),
            ppn=count(body.get("ppn"), "ppn"), nodes=count(body.get("nodes"), "nodes"), **text_fields, **extra,
            intra_mem=optional_link("intra_mem"), inter_mem=optional_link("inter_mem"),
            gamma_mem=optional_number("gamma_mem"), copy_mem=optional_number("copy_mem"),
        )


#: Used when nothing was fitted: α 5 µs within a node and 20 µs between nodes, β for 5 GB/s and 1 GB/s,
#: γ for 2 GB/s reduced, δ for 5 GB/s copied, 30 µs per call and 30 µs more with validation; one node of
#: up to 64 ranks (predictions for a communicator replace ppn and nodes by its layout); one regime (the
#: memory-regime values equal the cache ones).
NOMINAL = Machine(
    intra=Link(5e-6, 1 / 5e9), inter=Link(20e-6, 1 / 1e9), gamma=1 / 2e9, copy=1 / 5e9,
    overhead=30e-6, validation=30e-6, ppn=64, nodes=1, host="nominal", created="",
)

#: A cost function: ``fn(machine, n, p) -> seconds`` (see the module docstring).
CostFunction = Callable[[Machine, float, int], float]

# ---------------------------------------------------------------- arithmetic the cost functions share
#
# The cost functions live beside their algorithms in mpicomm/coll/*.py, registered with
# mpicomm.registry.cost; mpicomm.registry.predict evaluates them. What they share is here.


def ceil_lg(p: int) -> int:
    """⌈lg p⌉: rounds of a tree or dissemination over p ranks."""
    return (p - 1).bit_length()


def pof2(p: int) -> int:
    """p': the largest power of two ≤ p (the ranks left after a fold)."""
    return 1 << (p.bit_length() - 1)


def folded(p: int) -> bool:
    """Whether p is not a power of two (recursive algorithms fold it to p')."""
    return p & (p - 1) != 0


def segments(nbytes: float, segment: int) -> int:
    """Messages needed for *nbytes* in pieces of at most *segment* bytes (at least one)."""
    return max(1, math.ceil(nbytes / segment))


def direct_exchange(m: Machine, n: float, p: int) -> float:
    """(p−1)α + n(p−1)/p·β: p − 1 messages that together move all of n but the own 1/p (linear, ring, pairwise)."""
    link = m.link(p)
    return (p - 1) * link.alpha + n * (p - 1) / p * link.beta


def halving_doubling(m: Machine, n: float, p: int) -> float:
    """2lg p'·α + 2n(p'−1)/p'·β + n(p'−1)/p'·γ: recursive halving then doubling over the p' ranks left after a
    fold (Rabenseifner's reduce-scatter + allgather or gather); the fold's terms are the caller's."""
    link, q = m.link(p), pof2(p)
    return 2 * math.log2(q) * link.alpha + (q - 1) / q * n * (2 * link.beta + m.gamma)


def node_layout(m: Machine, p: int) -> tuple[int, int]:
    """(ranks per node, nodes) of *p* ranks laid out as the machine's: ppn = min(p, m.ppn), nodes = ⌈p / ppn⌉."""
    ppn = max(1, min(p, m.ppn))
    return ppn, -(-p // ppn)


def working_set(collective: str, nbytes: float, p: int) -> float:
    """Bytes a call touches, compared with :attr:`Machine.cache_bytes`: *nbytes* (n of the catalogue's size
    rule), times *p* for gather/scatter(v), whose n is one rank's block."""
    return nbytes * p if row(collective).blockwise else nbytes


# ---------------------------------------------------------------- fitting


def fit_line(sizes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Fit ``t = α + β·n`` to measurements; returns ``(alpha, beta)``, both ≥ 0.

    Least squares on the *relative* error, Σ((α + β·nᵢ − tᵢ) / tᵢ)², so an
    8-byte latency counts as much as a 4 MiB transfer. A negative β is
    clamped to 0 (α: the weighted mean), a negative α to 0 (β refitted
    through the origin). Deterministic: plain arithmetic, no randomness.
    """
    n = [float(x) for x in sizes]
    t = [float(x) for x in seconds]
    if len(n) != len(t):
        raise ValueError(f"fit_line: {len(n)} sizes but {len(t)} times; give one time per size")
    if len(set(n)) < 2:
        raise ValueError(f"fit_line: sizes {n} have fewer than two distinct values; measure at least two sizes")
    if any(not math.isfinite(x) or x < 0 for x in n) or any(not math.isfinite(x) or x <= 0 for x in t):
        raise ValueError("fit_line: sizes must be finite and ≥ 0 and times finite and > 0")
    scale = max(n)  # condition the normal equations: sizes in units of the largest
    u = [x / scale for x in n]
    w = [1.0 / (x * x) for x in t]
    sw = sum(w)
    swu = sum(wi * ui for wi, ui in zip(w, u))
    swuu = sum(wi * ui * ui for wi, ui in zip(w, u))
    swt = sum(wi * ti for wi, ti in zip(w, t))
    swut = sum(wi * ui * ti for wi, ui, ti in zip(w, u, t))
    det = sw * swuu - swu * swu
    alpha = (swuu * swt - swu * swut) / det
    slope = (sw * swut - swu * swt) / det
    if slope < 0:
        slope, alpha = 0.0, swt / sw
    elif alpha < 0:
        alpha, slope = 0.0, swut / swuu
    return alpha, slope / scale


def fit_memory_slope(sizes: Sequence[float], seconds: Sequence[float], alpha: float) -> float:
    """Seconds per byte of the memory regime from measurements at sizes past the cache, given the cache fit's
    intercept *alpha*: Σ(tᵢ − α) / Σnᵢ (the line through the cache intercept that fits the total time),
    clamped to ≥ 0. One size is enough."""
    n = [float(x) for x in sizes]
    t = [float(x) for x in seconds]
    if len(n) != len(t) or not n:
        raise ValueError(f"fit_memory_slope: {len(n)} sizes and {len(t)} times; give one time per size, at least one")
    if any(not math.isfinite(x) or x <= 0 for x in n) or any(not math.isfinite(x) or x <= 0 for x in t):
        raise ValueError("fit_memory_slope: sizes and times must be finite and > 0")
    return max(0.0, (sum(t) - alpha * len(t)) / sum(n))


# ---------------------------------------------------------------- storage


def cache_dir() -> str:
    """Where fits are saved: ``$MPICOMM_CACHE_DIR``, else ``$XDG_CACHE_HOME/mpicomm``, else ``~/.cache/mpicomm``."""
    explicit = os.environ.get("MPICOMM_CACHE_DIR", "").strip()
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "mpicomm")


def layout_key(p: int, nodes: int, ppn: int) -> str:
    """The rank layout's part of a fit's name: ``layout_key(4, 2, 2) == "p4-2x2"``."""
    for what, value in (("p", p), ("nodes", nodes), ("ppn", ppn)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"layout_key: {what} = {value!r} is not a positive integer")
    return f"p{p}-{nodes}x{ppn}"


def path_for(host: str, layout: str) -> str:
    """The file of the fit for *host* and *layout* (a :func:`layout_key`) in :func:`cache_dir`."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host) or "host"
    return os.path.join(cache_dir(), f"model-{safe}-{layout}.json")


def save(machine: Machine, path: str | None = None) -> str:
    """Write *machine* as JSON to *path* (default: :func:`path_for` its host and nodes × ppn layout); returns the path.

    Atomic: a temporary file in the same directory, then ``os.replace``, so a
    reader never sees half a file.
    """
    if path is None:
        path = path_for(machine.host, layout_key(machine.nodes * machine.ppn, machine.nodes, machine.ppn))
    return write_atomic(path, machine.to_json(), ".model-")


def write_atomic(path: str, text: str, prefix: str) -> str:
    """Write *text* to *path* through a temporary file (named *prefix*...) in its folder and ``os.replace``,
    so a reader never sees half a file; returns *path*."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def load(host: str, layout: str, quiet: bool = False) -> Machine | None:
    """The fit saved for *host* and *layout*, or None when there is none.

    A file that cannot be read, is not a model file, or has another format
    version gives None with a RuntimeWarning naming it and the fix (unless
    *quiet*).
    """
    path = path_for(host, layout)
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        problem = f"cannot read it ({exc})"
    else:
        try:
            return Machine.from_json(text)
        except ValueError as exc:
            problem = str(exc)
    if not quiet:
        warnings.warn(f"ignoring the saved mpicomm model {path}: {problem}; rerun `python -m mpicomm.tune` "
                      f"under mpiexec to fit it again, or delete the file", RuntimeWarning, stacklevel=2)
    log.debug("model: ignoring %s: %s", path, problem)
    return None


def for_comm(comm: Any, host: str, nodes: int, ppn: int) -> Machine | None:
    """The fit for communicator *comm* (an ``MPI.Intracomm``), the same on every rank. COLLECTIVE over *comm*.

    Rank 0 loads the fit saved for its *host* and the layout
    ``layout_key(comm size, nodes, ppn)`` (*ppn*: the most ranks on any one
    node, as ``python -m mpicomm.tune`` names it; only rank 0's arguments
    count) and broadcasts it (None when there is none or it is unusable; rank 0 warns),
    so ranks never disagree on whether a fit exists.
    """
    from mpi4py import MPI

    plain = MPI.Intracomm(comm)
    text: str | None = None
    if plain.Get_rank() == 0:
        try:
            machine = load(host, layout_key(plain.Get_size(), nodes, ppn))
            text = machine.to_json() if machine is not None else None
        except Exception as exc:  # never leave the other ranks waiting in the broadcast
            warnings.warn(f"mpicomm model: could not load the saved fit ({exc}); predictions use the nominal model",
                          RuntimeWarning, stacklevel=2)
            text = None
    text = plain.bcast(text, root=0)
    return Machine.from_json(text) if text is not None else None


def now() -> str:
    """The current UTC time in ISO format (for :attr:`Machine.created`)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
