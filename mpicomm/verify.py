"""Check one algorithm against the MPI library's own collective, at several numbers of ranks.

Two halves:

* the **driver**, :func:`verify` (``python -m mpicomm verify COLLECTIVE
  ALGORITHM -p 2..7``): without MPI, checks that the algorithm's schedules
  pair up on every rank (:func:`mpicomm.schedule.check_pairs`) at every count
  and root, then for each p starts ``mpiexec -n p python -m mpicomm.verify
  COLLECTIVE ALGORITHM`` (the mpiexec beside this Python, else the one on
  PATH; a time limit per job, the launcher's whole process group killed past
  it) and prints one line per p, a summary, and exits 1 on any failure;
* the **job**, :func:`main` under mpiexec: runs the forced algorithm and the
  library's collective on the same data and compares them on every rank.

What a job runs (:func:`cases`): counts 0, 1, p − 1, p + 1 and
:data:`LARGE` (not with ``--quick``) - elements of the vector, or of one
rank's block for the block collectives (per-rank counts of the v-forms vary
around it, with zeros, laid out last rank first with gaps that must stay
untouched); data that depends on rank and index (rank·10⁶ + index); int64
sum and float64 sum, plus a non-commutative op - products of 2×2 integer
matrices packed in 4 int64 (:data:`MATMUL`), so a count is of matrices -
for the reducing collectives; roots 0, p // 2 and p − 1 for the rooted
ones; in place (``MPI.IN_PLACE``) where the collective has that form; and
each of blocking, nonblocking (the I-form, waited) and persistent (the
``_init`` form, started twice with different data). The input must come
back unchanged. Cases the algorithm's declared restrictions exclude
(:func:`mpicomm.registry.allowed`: a commutative-only algorithm and the
matrix op, a blocking-only one and the nonblocking forms, a schedule
file's algorithm and the counts it was not made for...) are skipped
with the reason; so are cases its schedule function refuses (a ValueError
while it describes the call, as ``docs/examples/torus_allreduce.py`` raises
for a prime p) - provided the real call then raises that error on every
rank instead of hanging.

User algorithms: ``--module pkg.mod`` (or ``MPICOMM_ALGORITHM_MODULES``)
is imported here and passed to every job through the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from . import cli
from .facts import Facts

__all__ = ["LARGE", "MATMUL", "MODES", "IN_PLACE", "Case", "parse_ranks", "counts_for", "cases", "pair_check",
           "mpiexec_path", "verify", "run_cases", "main", "markdown_report"]

#: The large count every job runs unless ``--quick``.
LARGE = 10**5

#: The non-commutative op's name: products of packed 2×2 int64 matrices (a from the lower ranks).
MATMUL = "matmul2x2"

#: The forms every case runs in.
MODES = ("blocking", "nonblocking", "persistent")

#: Collectives with an ``MPI.IN_PLACE`` form (bcast is in place by nature; barrier moves nothing).
IN_PLACE = frozenset({"reduce", "allreduce", "gather", "gatherv", "scatter", "scatterv", "allgather", "allgatherv",
                      "alltoall", "alltoallv", "reduce_scatter", "reduce_scatter_block", "scan", "exscan"})

#: Seconds one job may run (the launcher's limit and a hard kill a little later).
DEFAULT_TIMEOUT = 300

SENTINEL = -1  # what receive buffers hold before a call: gaps and undefined parts must keep it

_PROG = "python -m mpicomm verify"
_REFUSED = "the algorithm refuses it: "  # the reason of a skip that the schedule function asked for
_CASE_MARK = "verify-case "  # a job's progress line (rank 0, --progress): the driver names the last one on a time-out

# Variables a launcher sets for its ranks; a job started from inside a rank must not inherit them.
_LAUNCHER_VARS = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPI_LOCAL", "OMPI_COMM_WORLD", "OMPI_MCA_", "PRTE_", "MPIEXEC_")


# ---------------------------------------------------------------- what runs


@dataclass(frozen=True)
class Case:
    """One call to compare: *count* (elements, or matrices for :data:`MATMUL`), element type, op (None: the
    collective does not reduce), root (None: not rooted), in place or not, and the form (:data:`MODES`)."""

    count: int
    dtype: str
    op: str | None
    root: int | None
    in_place: bool
    mode: str

    def label(self, collective: str, algorithm: str) -> str:
        parts = [f"{collective}/{algorithm}"]
        if collective != "barrier":
            parts.append(f"count={self.count}{' matrices' if self.op == MATMUL else ''}")
            parts.append(f"dtype={self.dtype}")
        if self.op is not None:
            parts.append(f"op={self.op}")
        if self.root is not None:
            parts.append(f"root={self.root}")
        parts.append(f"mode={self.mode}" + (" in place" if self.in_place else ""))
        return " ".join(parts)

    @property
    def unit(self) -> int:
        """Elements per counted item: 4 for the matrix op (one packed 2×2 matrix), else 1."""
        return 4 if self.op == MATMUL else 1


def parse_ranks(text: str) -> list[int]:
    """``"2..7"`` → 2, 3, 4, 5, 6, 7; ``"2,3,5"`` → those; ``"4"`` → 4; mixed (``"2..4,7"``) too; each ≥ 1."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            if ".." in part:
                low, high = (int(x) for x in part.split("..", 1))
                if low > high:
                    raise ValueError(f"-p {text!r}: the range {part} is empty (write low..high, e.g. 2..7)")
                values = list(range(low, high + 1))
            else:
                values = [int(part)]
        except ValueError as exc:
            if "empty" in str(exc):
                raise
            raise ValueError(f"-p {text!r}: not a number of ranks; write one (4), a list (2,3,5) or a range "
                             f"(2..7)") from None
        for p in values:
            if p < 1:
                raise ValueError(f"-p {text!r}: p = {p} is not a number of ranks; p must be >= 1")
            if p not in out:
                out.append(p)
    return out


def counts_for(p: int, quick: bool = False) -> list[int]:
    """0, 1, p − 1, p + 1 and :data:`LARGE` (not when *quick*), without repeats."""
    found = {0, 1, max(p - 1, 0), p + 1} | (set() if quick else {LARGE})
    return sorted(found)


def per_rank(count: int, r: int) -> int:
    """A v-form's count for rank (or rank pair) *r* around *count*: *count*, then ⌊count/2⌋, in turn (zeros
    where count ≤ 1)."""
    return count if r % 2 == 0 else count // 2


def cases(collective: str, p: int, quick: bool = False) -> list[Case]:
    """Every case a job of *p* ranks runs for *collective*, in the same order on every rank."""
    from .catalogue import row

    spec = row(collective)
    if collective == "barrier":
        return [Case(0, "-", None, None, False, mode) for mode in MODES]
    kinds = ([("int64", "sum"), ("float64", "sum"), ("int64", MATMUL)] if spec.reducing
             else [("int64", None), ("float64", None)])
    roots: Sequence[int | None] = sorted({0, p // 2, p - 1}) if spec.rooted else [None]
    places = (False, True) if collective in IN_PLACE else (False,)
    return [Case(count, dtype, op, root, in_place, mode) for count in counts_for(p, quick) for dtype, op in kinds
            for root in roots for in_place in places for mode in MODES]


def _counts(collective: str, case: Case, p: int) -> list[int] | None:
    """Per-rank element counts of a v-form's case (None for the others)."""
    from .catalogue import row

    if not row(collective).vector:
        return None
    return [per_rank(case.count, r) * case.unit for r in range(p)]


def _refusal(collective: str, algorithm: str, p: int, rank: int, case: Case, nodes: int = 1) -> str | None:
    """The ValueError the algorithm's schedule function raises for this rank's part of *case*, if any."""
    from .plan.preview import Layout, schedule_for

    try:
        schedule_for(collective, algorithm, p, rank, case.count * case.unit, root=case.root or 0,
                     counts=_counts(collective, case, p), dtype=np.float64 if case.dtype == "-" else case.dtype,
                     op=_op_name(case), layout=Layout.even(p, nodes))
    except ValueError as exc:
        return str(exc)
    except Exception:  # noqa: BLE001 - a preview that cannot describe this layout: let the real call tell
        return None
    return None


def _op_name(case: Case) -> Any:
    if case.op == MATMUL:
        return _mpicomm_matmul()
    return case.op


def pair_check(collective: str, algorithm: str, p: int, quick: bool = False, nodes: int = 1
               ) -> tuple[int, list[str], list[str]]:
    """Without MPI: every rank's schedule at every count (and root, and element size) of the job's cases.

    Returns ``(calls checked, problems, refusals)``: a problem is a message
    that does not meet its receive (:func:`mpicomm.schedule.check_pairs`),
    named with its count and root; a refusal is the ValueError the schedule
    function raised for a count (those calls are not checked). Schedules that
    build rounds at run time (sizes known then only) are not checked here, nor
    is a p the algorithm's restrictions exclude (a power-of-two algorithm...).
    """
    from . import registry
    from .plan.preview import Layout, schedules_for
    from .schedule import check_pairs

    seen: set[tuple] = set()
    checked = 0
    problems: list[str] = []
    refusals: list[str] = []
    if registry.allowed(registry.lookup(collective, algorithm), Facts(p=p, nodes=nodes)) is not None:
        return checked, problems, refusals
    for case in cases(collective, p, quick):
        counts = _counts(collective, case, p)
        key = (case.count * case.unit, case.root, tuple(counts or ()))
        if key in seen:
            continue
        seen.add(key)
        try:
            scheds = schedules_for(collective, algorithm, p, case.count * case.unit, root=case.root or 0,
                                   counts=counts, layout=Layout.even(p, nodes))
        except ValueError as exc:
            if str(exc) not in refusals:
                refusals.append(str(exc))
            continue
        if any(s.then is not None for s in scheds):
            continue
        checked += 1
        where = f"count={case.count * case.unit}" + (f" root={case.root}" if case.root is not None else "")
        problems += [f"{collective}/{algorithm} {where}: {problem}" for problem in check_pairs(scheds)]
    return checked, problems, refusals


# ---------------------------------------------------------------- the job: one call, both ways


_OPS: dict[str, Any] = {}


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.reshape(-1, 2, 2) @ b.reshape(-1, 2, 2)).reshape(-1)


def _mpicomm_matmul() -> Any:
    """mpicomm's :data:`MATMUL` op (made once per process, alike on every rank)."""
    if "mpicomm" not in _OPS:
        from . import ops

        _OPS["mpicomm"] = ops.create(_matmul, commutative=False, name=MATMUL)
    return _OPS["mpicomm"]


def _native_matmul() -> Any:
    """The same op for the MPI library (inoutvec = invec · inoutvec, invec from the lower ranks)."""
    if "native" not in _OPS:
        from mpi4py import MPI

        def fn(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
            a = np.frombuffer(inbuf, np.int64)
            b = np.frombuffer(inoutbuf, np.int64)
            b[...] = _matmul(a, b)

        _OPS["native"] = MPI.Op.Create(fn, commute=False)
    return _OPS["native"]


def _values(case: Case, rank: int, n: int, start: int) -> np.ndarray:
    """Rank- and index-dependent input: rank·10⁶ + index (+ 7 per persistent start); small random matrices for
    the matrix op (integer products wrap but stay associative, so results are exact)."""
    if case.op == MATMUL:
        rng = np.random.default_rng([rank, n, start])
        return rng.integers(-3, 4, size=n).astype(np.int64)
    return (rank * 1_000_000 + np.arange(n, dtype=np.int64) + 7 * start).astype(case.dtype)


def _layout(counts: Sequence[int]) -> tuple[list[int], int]:
    """Displacements of a v-form's blocks - last rank first, a gap of 2 before each - and the buffer size."""
    displs, offset = [0] * len(counts), 0
    for r in reversed(range(len(counts))):
        offset += 2
        displs[r] = offset
        offset += counts[r]
    return displs, offset + 2


def _differ(got: np.ndarray, want: np.ndarray) -> str | None:
    """Where *got* and *want* differ (integers exactly, floats within 1e-12 relative), or None."""
    if got.shape != want.shape:
        return f"{got.size} elements, expected {want.size}"
    same = np.isclose(got, want, rtol=1e-12, atol=0) if got.dtype.kind == "f" else got == want
    if bool(np.all(same)):
        return None
    bad = np.flatnonzero(~same)
    show = bad[:5].tolist()
    return (f"differ at {len(bad)} of {got.size} elements, first {show}: got {got[show].tolist()}, expected "
            f"{want[show].tolist()}")


class _Call:
    """One case's buffers on this rank, for mpicomm and for the library, refilled per start."""

    def __init__(self) -> None:
        self.mine: tuple = ()  # mpicomm's positional arguments
        self.theirs: tuple = ()  # the library's
        self.keywords: dict[str, Any] = {}  # both (op and root; the op told apart below)
        self.fills: list[Callable[[int], None]] = []
        self.results: list[tuple[str, np.ndarray, np.ndarray]] = []  # (what, mpicomm's, the library's)
        self.inputs: list[tuple[str, np.ndarray, Callable[[int], np.ndarray]]] = []  # must come back unchanged

    def fill(self, start: int) -> None:
        for fn in self.fills:
            fn(start)

    def check(self, start: int) -> str | None:
        for what, got, want in self.results:
            why = _differ(got, want)
            if why:
                return f"{what}: {why}"
        for what, array, expected in self.inputs:
            why = _differ(array, expected(start))
            if why:
                return f"{what} changed by the call: {why}"
        return None


def _setup(collective: str, case: Case, rank: int, p: int) -> _Call:
    """The buffers and arguments of *case* on *rank* (see the module docstring)."""
    from mpi4py import MPI

    from .catalogue import family, row

    call = _Call()
    fam, v = family(collective), row(collective).vector
    dt = np.dtype(case.dtype) if case.dtype != "-" else np.dtype(np.int64)
    n = case.count * case.unit
    root, in_place = case.root, case.in_place
    IN = MPI.IN_PLACE
    send: np.ndarray | None  # (None where a rank sends nothing, as mine and theirs where it receives nothing)
    mine: np.ndarray | None
    theirs: np.ndarray | None

    def full(size: int) -> np.ndarray:
        return np.full(size, SENTINEL, dt)

    def values(r: int, size: int) -> Callable[[int], np.ndarray]:
        return lambda start: _values(case, r, size, start)

    def filler(array: np.ndarray, make: Callable[[int], np.ndarray], at: slice = slice(None)) -> None:
        def fill(start: int) -> None:
            array[...] = SENTINEL
            array[at] = make(start)
        call.fills.append(fill)

    def reset(array: np.ndarray) -> None:
        call.fills.append(lambda start: array.__setitem__(Ellipsis, SENTINEL))

    if case.op is not None:
        call.keywords["op"] = None  # (replaced per side by _run)
    if fam == "barrier":
        return call
    if fam == "bcast":
        mine, theirs = full(n), full(n)
        if rank == root:
            filler(mine, values(root, n))
            filler(theirs, values(root, n))
        else:
            reset(mine)
            reset(theirs)
        call.mine, call.theirs = (mine,), (theirs,)
        call.keywords["root"] = root
        call.results.append(("buf", mine, theirs))
        return call
    if fam in ("reduce", "allreduce", "scan", "exscan"):
        x = values(rank, n)
        send = full(n)
        filler(send, x)
        defined = (fam != "reduce" or rank == root) and not (fam == "exscan" and rank == 0)
        gets = fam != "reduce" or rank == root
        mine = full(n) if gets else None
        theirs = full(n) if gets else None
        here = in_place and gets
        if mine is not None and theirs is not None:  # (gets)
            filler(mine, x) if here else reset(mine)
            reset(theirs)
        call.mine = (IN if here else send, mine)
        call.theirs = (send, theirs)
        if fam == "reduce":
            call.keywords["root"] = root
        if defined:
            assert mine is not None and theirs is not None  # (defined: gets)
            call.results.append(("recvbuf", mine, theirs))
        call.inputs.append(("sendbuf", send, x))
        return call
    if fam in ("gather", "allgather"):
        counts = _counts(collective, case, p) or [n] * p
        displs, size = _layout(counts) if v else ([r * n for r in range(p)], n * p)
        x = values(rank, counts[rank])
        send = full(counts[rank])
        filler(send, x)
        gets = fam == "allgather" or rank == root
        here = in_place and gets
        mine, theirs = (full(size), full(size)) if gets else (None, None)
        if mine is not None and theirs is not None:  # (gets)
            own = slice(displs[rank], displs[rank] + counts[rank])
            filler(mine, x, own) if here else reset(mine)
            reset(theirs)
        spec = (lambda buf: [buf, (tuple(counts), tuple(displs))]) if v else (lambda buf: buf)
        call.mine = (IN if here else send, spec(mine) if gets else None)
        call.theirs = (send, spec(theirs) if gets else None)
        if fam == "gather":
            call.keywords["root"] = root
        if mine is not None and theirs is not None:  # (gets)
            call.results.append(("recvbuf", mine, theirs))
        call.inputs.append(("sendbuf", send, x))
        return call
    if fam == "scatter":
        assert root is not None  # (a rooted collective's cases have a root)
        counts = _counts(collective, case, p) or [n] * p
        displs, size = _layout(counts) if v else ([r * n for r in range(p)], n * p)
        spec = (lambda buf: [buf, (tuple(counts), tuple(displs))]) if v else (lambda buf: buf)
        has = rank == root
        send = full(size) if has else None
        if send is not None:  # (has)
            filler(send, values(root, size))
        mine, theirs = full(counts[rank]), full(counts[rank])
        reset(mine)
        reset(theirs)
        here = in_place and has
        call.mine = (spec(send) if has else None, IN if here else mine)
        call.theirs = (spec(send) if has else None, theirs)
        call.keywords["root"] = root
        if not here:
            call.results.append(("recvbuf", mine, theirs))
        if send is not None:  # (has)
            call.inputs.append(("sendbuf", send, values(root, size)))
        return call
    if fam == "alltoall":
        if v:  # rank i sends per_rank(count, i + j) to rank j: symmetric, so the receive layout is the send layout
            counts = [per_rank(case.count, rank + j) * case.unit for j in range(p)]
            displs, size = _layout(counts)
        else:
            counts, displs, size = [n] * p, [j * n for j in range(p)], n * p
        blocks = [slice(d, d + c) for c, d in zip(counts, displs)]
        whole = values(rank, size)

        def laid_out(start: int) -> np.ndarray:  # the data in the blocks, the gaps untouched
            out = np.full(size, SENTINEL, dt)
            data = whole(start)
            for b in blocks:
                out[b] = data[b]
            return out

        send = full(size)
        filler(send, laid_out)
        mine, theirs = full(size), full(size)
        filler(mine, laid_out) if in_place else reset(mine)
        reset(theirs)
        spec = (lambda buf: [buf, (tuple(counts), tuple(displs))]) if v else (lambda buf: buf)
        if collective == "alltoallw":  # per block: a count, a displacement in bytes and a datatype
            from mpi4py.util.dtlib import from_numpy_dtype

            kinds = [from_numpy_dtype(dt)] * p
            in_bytes = tuple(d * dt.itemsize for d in displs)
            spec = lambda buf: [buf, (tuple(counts), in_bytes), kinds]  # noqa: E731 - as the two above
        call.mine = (IN if in_place else spec(send), spec(mine))
        call.theirs = (spec(send), spec(theirs))
        call.results.append(("recvbuf", mine, theirs))
        call.inputs.append(("sendbuf", send, laid_out))
        return call
    if fam == "reduce_scatter":
        counts = _counts(collective, case, p) or [n] * p
        total = sum(counts)
        x = values(rank, total)
        send = full(total)
        filler(send, x)
        theirs = full(counts[rank])
        reset(theirs)
        if in_place:
            mine = full(total)
            filler(mine, x)
        else:
            mine = full(counts[rank])
            reset(mine)
        call.mine = (IN if in_place else send, mine)
        call.theirs = (send, theirs)
        if v:
            call.keywords["recvcounts"] = list(counts)
        call.results.append(("recvbuf", mine[: counts[rank]], theirs))
        call.inputs.append(("sendbuf", send, x))
        return call
    raise ValueError(f"verify: no case set-up for collective {collective!r}")


def _run(comm: Any, collective: str, algorithm: str, case: Case, refused: str | None) -> tuple[str, str]:
    """Run *case* (both ways, each start) on this rank: ``("passed", "")``, ``("refused", why)`` when the
    algorithm refused it on every rank as its schedule function declares, or ``("failed", why)``."""
    from mpi4py import MPI

    from .catalogue import row

    spec = row(collective)
    call = _setup(collective, case, comm.Get_rank(), comm.Get_size())
    mine_kw, theirs_kw = dict(call.keywords), dict(call.keywords)
    if "op" in call.keywords:
        mine_kw["op"] = _mpicomm_matmul() if case.op == MATMUL else MPI.SUM
        theirs_kw["op"] = _native_matmul() if case.op == MATMUL else MPI.SUM
    library = _library()
    request = None
    starts = 2 if case.mode == "persistent" else 1
    wrong = ""  # the first wrong result: every start still runs, as on the other ranks (whose results may be right)
    try:
        for start in range(starts):
            call.fill(start)
            try:
                getattr(library, spec.method)(*call.theirs, **theirs_kw)
            except Exception as exc:  # noqa: BLE001 - the reference itself failed: verify's own set-up is wrong
                return "failed", f"the library's own {spec.method} raised {type(exc).__name__}: {exc} (a bug of verify)"
            if case.mode == "blocking":
                getattr(comm, spec.method)(*call.mine, **mine_kw, algorithm=algorithm)
            elif case.mode == "nonblocking":
                getattr(comm, spec.nonblocking)(*call.mine, **mine_kw, algorithm=algorithm).Wait()
            else:
                if request is None:
                    request = getattr(comm, spec.persistent)(*call.mine, **mine_kw, algorithm=algorithm)
                request.Start()
                request.Wait()
            why = call.check(start)
            if why and not wrong:
                wrong = (f"start {start + 1} of 2: " if starts > 1 else "") + why
    except Exception as exc:  # noqa: BLE001 - every failure is a result to report, not a crash
        if refused is not None and refused in str(exc):
            return "refused", refused
        return "failed", f"raised {type(exc).__name__}: {exc}"
    finally:
        if request is not None:
            try:
                request.Free()
            except Exception:  # noqa: BLE001 - freeing is tidying up only
                pass
    if refused is not None:
        return "failed", f"its schedule refuses this call ({refused}), but the call ran without an error"
    return ("failed", wrong) if wrong else ("passed", "")


def _library() -> Any:
    """The communicator the library's own collectives run on: a duplicate of ``MPI.COMM_WORLD``, so that what a
    failed case leaves in flight never meets the job's own messages."""
    if "library" not in _OPS:
        from mpi4py import MPI

        _OPS["library"] = MPI.COMM_WORLD.Dup()
    return _OPS["library"]


def _facts(comm: Any, case: Case, collective: str) -> Facts:
    """What :func:`mpicomm.registry.allowed` looks at for *case* on *comm* (the count as the call's: none for the
    v-forms, whose ranks give their own, nor for the matrix op, counted in matrices)."""
    from .catalogue import CATALOGUE

    commutative = case.op != MATMUL
    count = None if CATALOGUE[collective].vector or case.op == MATMUL else case.count
    return Facts(p=comm.Get_size(), nodes=getattr(comm, "nodes", 1) or 1, commutative=commutative, op=case.op,
                 blocking=case.mode == "blocking", count=count)


def run_cases(comm: Any, collective: str, algorithm: str, quick: bool = False, progress: bool = False) -> dict:
    """Every case of :func:`cases` on *comm* (collective: every rank calls it); the report on rank 0 (None
    elsewhere): ``p``, ``passed`` (count), ``failed`` (one dict per case: the case, ``label``, ``why`` with the
    failing ranks), ``skipped`` (reason → number of cases), ``seconds``."""
    from mpi4py import MPI

    from . import registry

    algo = registry.lookup(collective, algorithm)
    rank, p = comm.Get_rank(), comm.Get_size()
    began = time.perf_counter()
    todo = cases(collective, p, quick)
    outcomes: list[tuple[str, str]] = []
    for i, case in enumerate(todo):
        reason = registry.allowed(algo, _facts(comm, case, collective))
        if reason is not None:
            outcomes.append(("skipped", _skip_label(case, reason)))
            continue
        if progress and rank == 0:
            print(f"{_CASE_MARK}{i + 1}/{len(todo)}: {case.label(collective, algorithm)}", flush=True)
        refused = _refusal(collective, algorithm, p, rank, case, getattr(comm, "nodes", 1) or 1)
        outcomes.append(_run(comm, collective, algorithm, case, refused))
    everyone = MPI.COMM_WORLD.gather(outcomes, root=0)
    if rank != 0:
        return {}
    assert everyone is not None  # (rank 0: the gather's root)
    passed = 0
    failed: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    covered: dict[str, list] = {"counts": [], "types": [], "roots": [], "in_place": [], "modes": []}
    for i, case in enumerate(todo):
        states = [ranks[i] for ranks in everyone]
        kinds = {state for state, _ in states}
        if kinds <= {"passed"}:
            passed += 1
            kind = f"{case.dtype} {case.op}" if case.op else case.dtype
            for key, value in (("counts", case.count), ("types", kind), ("roots", case.root),
                               ("in_place", case.in_place), ("modes", case.mode)):
                if value not in covered[key] and value is not None and value != "-":
                    covered[key].append(value)
        elif kinds <= {"skipped"} or kinds <= {"refused"}:
            reason = states[0][1] if "skipped" in kinds else f"{_REFUSED}{states[0][1]}"
            skipped[reason] = skipped.get(reason, 0) + 1
        else:
            why = "; ".join(f"rank {r}: {text or state}" for r, (state, text) in enumerate(states) if state != "passed")
            failed.append({**asdict(case), "collective": collective, "algorithm": algorithm,
                           "label": case.label(collective, algorithm), "why": why})
    return {"p": p, "passed": passed, "failed": failed, "skipped": skipped, "covered": covered,
            "seconds": round(time.perf_counter() - began, 3)}


def _skip_label(case: Case, reason: str) -> str:
    """A restriction's reason, with what it excludes (the op, or the form)."""
    if "commutative" in reason:
        return f"op {case.op}: {reason}"
    if "blocking" in reason:
        return f"{case.mode} form: {reason}"
    return reason


def unchecked(collective: str) -> str | None:
    """Why verify cannot check *collective* (None: it can): it runs on a communicator without a topology."""
    from .catalogue import NEIGHBORHOOD

    if collective in NEIGHBORHOOD:
        return (f"verify runs on a communicator without a topology, and {collective} needs one (a graph or a "
                f"Cartesian grid); the suite checks it against the library on several topologies: "
                f"python -m tests -- tests/coll/test_neighbor.py")
    return None


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The checked command line: an unknown collective or algorithm (or a module that does not import) is a usage
    error, printed once per job."""
    parser = cli.Parser(
        prog="python -m mpicomm.verify",
        description="One MPI job of python -m mpicomm verify: every case of one algorithm against the MPI "
                    "library's own collective, on the ranks mpiexec started (run it under mpiexec; "
                    "python -m mpicomm verify starts these jobs for each p)")
    parser.add_argument("collective")
    parser.add_argument("algorithm")
    parser.add_argument("--quick", action="store_true", help=f"skip the large count ({LARGE} elements)")
    parser.add_argument("--module", metavar="PKG.MOD[,PKG.MOD2]", default=None,
                        help="import these modules of user algorithms first (as MPICOMM_ALGORITHM_MODULES does)")
    parser.add_argument("--report", metavar="FILE", default=None, help="rank 0 writes the report here as JSON")
    parser.add_argument("--progress", action="store_true", help="rank 0 prints a line before each case")
    args = parser.parse_args(argv)
    from . import registry

    try:
        if args.module:
            registry.import_modules(args.module, "--module")
        registry.lookup(args.collective, args.algorithm)  # an unknown name fails on every rank alike
    except (ImportError, ValueError) as exc:
        parser.error(str(exc))
    why = unchecked(args.collective)
    if why:
        parser.error(why)
    return args


def main(argv: list[str] | None = None) -> int:
    """``mpiexec -n P python -m mpicomm.verify COLLECTIVE ALGORITHM [--quick] [--module M] [--report FILE]``."""
    args = cli.parse_or_exit(_parse, argv)
    import mpicomm

    comm = mpicomm.Comm()
    report = run_cases(comm, args.collective, args.algorithm, args.quick, args.progress)
    for name in ("native", "library"):
        if name in _OPS:
            _OPS.pop(name).Free()
    from mpi4py import MPI

    failed = bool(MPI.COMM_WORLD.bcast(bool(report.get("failed")) if comm.Get_rank() == 0 else None, root=0))
    if comm.Get_rank() == 0:
        if args.report:
            with open(args.report, "w", encoding="utf-8") as f:
                json.dump(report, f)
        print(_line(args.collective, args.algorithm, report, None), flush=True)
        for failure in report["failed"]:
            print(f"  FAILED {failure['label']}: {failure['why']}", flush=True)
    return 1 if failed else 0


# ---------------------------------------------------------------- the driver


def mpiexec_path() -> str:
    """The ``mpiexec`` of this Python's environment (the PyPI MPICH/Open MPI), else the one on PATH."""
    here = os.path.dirname(sys.executable)
    found = shutil.which("mpiexec", path=here + os.pathsep + os.environ.get("PATH", ""))
    if not found:
        raise FileNotFoundError("no mpiexec found next to this Python or on PATH; install an MPI runtime: "
                                "pip install -e '.[mpich]'")
    return found


def _openmpi(mpiexec: str) -> bool:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(mark in out for mark in ("Open MPI", "OpenRTE", "PRRTE", "prterun"))


def _job_env(modules: str | None, timeout: float, openmpi: bool) -> dict[str, str]:
    """This environment without an enclosing launcher's per-rank variables, with the user modules, the working
    directory importable (as ``python -m`` makes it here), and the time limits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
    from .registry import MODULES_VARIABLE

    if modules:
        env[MODULES_VARIABLE] = modules
    env["PYTHONPATH"] = os.getcwd() + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["MPIEXEC_TIMEOUT"] = str(max(1, int(timeout)))  # hydra's limit (Open MPI gets --timeout)
    env.setdefault("MPICOMM_TIMEOUT", str(max(10, min(60, int(timeout) // 2))))  # a hang is named, then aborted
    if openmpi and hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


@dataclass
class _Job:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    report: dict | None


def _launch(p: int, collective: str, algorithm: str, quick: bool, modules: str | None, timeout: float) -> _Job:
    mpiexec = mpiexec_path()
    openmpi = _openmpi(mpiexec)
    fd, report_path = tempfile.mkstemp(prefix="mpicomm-verify-", suffix=".json")
    os.close(fd)
    cmd = [mpiexec] + (["--oversubscribe", "--timeout", str(int(timeout))] if openmpi else [])
    cmd += ["-n", str(p), sys.executable, "-m", "mpicomm.verify", collective, algorithm, "--report", report_path,
            "--progress"] + (["--quick"] if quick else [])
    proc = subprocess.Popen(cmd, env=_job_env(modules, timeout, openmpi), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout + 15)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    report = None
    try:
        with open(report_path, encoding="utf-8") as f:
            text = f.read()
        report = json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        report = None
    finally:
        try:
            os.unlink(report_path)
        except OSError:
            pass
    timed_out = timed_out or (report is None and proc.returncode in (124, 137, -9))
    return _Job(proc.returncode, out or "", err or "", timed_out, report)


def _covered(report: dict) -> str:
    """What the passed cases covered: counts, element types and ops, roots, in place, forms."""
    got = report.get("covered") or {}
    parts = []
    if got.get("counts"):
        parts.append("counts " + ",".join(map(str, sorted(got["counts"]))))
    if got.get("types"):
        parts.append(" and ".join(got["types"]))
    if got.get("roots"):
        parts.append("roots " + ",".join(map(str, sorted(got["roots"]))))
    if True in got.get("in_place", []):
        parts.append("in place too")
    if got.get("modes"):
        parts.append(", ".join(got["modes"]))
    return "; ".join(parts)


def _line(collective: str, algorithm: str, report: dict, pairs: tuple[int, list[str], list[str]] | None,
          seconds: float | None = None) -> str:
    """The one line of a p: what passed (and over what), what failed, the pair check, what was skipped and why."""
    p, failed, passed = report["p"], report["failed"], report["passed"]
    skipped = dict(report["skipped"])
    refusals = [why for why in skipped if why.startswith(_REFUSED)]
    if failed:
        head = f"p={p}: FAILED {len(failed)} of {len(failed) + passed} case(s)"
    elif passed == 0 and refusals:
        head = (f"p={p}: nothing compared - {refusals[0][len(_REFUSED):]} (and the call raises that error on every "
                f"rank, as it should)")
        for why in refusals[:1]:
            skipped.pop(why)
    else:
        head = f"p={p}: passed {passed} case(s)"
    if passed and _covered(report):
        head += f" ({_covered(report)})"
    parts = [head]
    if pairs is not None:
        checked, problems, _ = pairs
        if problems:
            parts.append(f"schedules do NOT pair up ({len(problems)} problem(s))")
        elif checked:
            parts.append(f"schedules pair up ({checked} call(s) checked)")
        else:
            parts.append("schedules not checked without MPI (their sizes are known at run time only)")
    if skipped:
        parts.append("skipped " + "; ".join(f"{n} ({why})" for why, n in skipped.items()))
    took = report["seconds"] if seconds is None else seconds
    return ", ".join(parts) + f" [{took:.1f} s]"


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def verify(collective: str, algorithm: str, ps: Sequence[int], *, quick: bool = False, modules: str | None = None,
           timeout: float = DEFAULT_TIMEOUT, json_path: str | None = None, out: str | None = None,
           append: bool = False, command: str | None = None) -> int:
    """Check *algorithm* of *collective* at each p of *ps* (see the module docstring); 0 when everything
    passed, 1 otherwise. *modules*: user algorithm modules (imported here, and by every job); *json_path*,
    *out*: the results as a JSON document and as a Markdown report."""
    from . import registry
    from .catalogue import row

    if modules:
        registry.import_modules(modules, "--module")
    every = registry.module_names(os.environ.get(registry.MODULES_VARIABLE, "")) + registry.module_names(modules or "")
    job_modules = ",".join(dict.fromkeys(every)) or None  # the variable's and --module's, for every job
    registry.lookup(collective, algorithm)
    row(collective)
    command = command or f"{_PROG} {collective} {algorithm}"
    lines: list[str] = []
    rows: list[dict] = []
    progress = cli.Progress(len(ps), "verify")

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    for p in ps:
        began = time.perf_counter()
        pairs = pair_check(collective, algorithm, p, quick)
        entry: dict[str, Any] = {"p": p, "pairs": {"checked": pairs[0], "problems": pairs[1], "refused": pairs[2]}}
        if pairs[1]:  # messages that meet no receive would hang the job: the schedule problems say enough
            say(f"p={p}: FAILED: its schedules do not pair up ({len(pairs[1])} problem(s)); not run under MPI, "
                f"where they would hang")
            entry.update(returncode=None, timed_out=False, passed=0, failed=[], skipped={},
                         seconds=round(time.perf_counter() - began, 3))
        else:
            job = _launch(p, collective, algorithm, quick, job_modules, timeout)
            entry.update(returncode=job.returncode, timed_out=job.timed_out)
            report = job.report
            if report is None:
                last = [line for line in job.stdout.splitlines() if line.startswith(_CASE_MARK)]
                doing = f"; last case started: {last[-1][len(_CASE_MARK):]}" if last else ""
                what = (f"timed out after {timeout:.0f} s" if job.timed_out
                        else f"the job failed (exit status {job.returncode})")
                say(f"p={p}: FAILED: {what}{doing}")
                if job.stderr.strip() or job.stdout.strip():
                    say(_tail(job.stderr if job.stderr.strip() else job.stdout))
                entry.update(passed=0, failed=[{"label": f"{collective}/{algorithm} p={p}", "why": what + doing}],
                             skipped={}, seconds=round(time.perf_counter() - began, 3))
            else:
                entry.update(report)
                say(_line(collective, algorithm, report, pairs, time.perf_counter() - began))
                for failure in report["failed"]:
                    say(f"  FAILED {failure['label']}: {failure['why']}")
                if job.returncode and not report["failed"]:
                    say(f"  FAILED: the job exited with status {job.returncode} after its cases")
                    say(_tail(job.stderr if job.stderr.strip() else job.stdout))
        for problem in pairs[1][:20]:
            say(f"  FAILED schedules: {problem}")
        if len(pairs[1]) > 20:
            say(f"  ... and {len(pairs[1]) - 20} more schedule problem(s)")
        rows.append(entry)
        progress.step(f"p={p}")
    passed = sum(r.get("passed", 0) for r in rows)
    failed = sum(len(r.get("failed", [])) for r in rows)
    skipped = sum(sum(r.get("skipped", {}).values()) for r in rows)
    pair_problems = sum(len(r["pairs"]["problems"]) for r in rows)
    bad = [r["p"] for r in rows if r.get("failed") or r["pairs"]["problems"] or r.get("returncode")]
    where = ", ".join(map(str, ps))
    if bad:
        say(f"verify {collective}/{algorithm} at p = {where}: FAILED at p = {', '.join(map(str, bad))}: {failed} "
            f"case(s) failed, {pair_problems} schedule problem(s); {passed} passed, {skipped} skipped")
    else:
        say(f"verify {collective}/{algorithm} at p = {where}: all passed ({passed} case(s), no schedule problems; "
            f"{skipped} skipped)")
    summary = {"collective": collective, "algorithm": algorithm, "p": list(ps), "quick": quick,
               "modules": modules, "passed": passed, "failed": failed, "skipped": skipped,
               "schedule_problems": pair_problems, "ok": not bad}
    if json_path:
        cli.write_json(json_path, command, rows, summary=summary)
    if out:
        markdown_report(out, append, f"verify {collective}/{algorithm}", command, lines)
    return 1 if bad else 0


def markdown_report(path: str, append: bool, title: str, command: str, lines: list[str],
                    image: str | None = None) -> None:
    """A report: title, command, machine, the lines printed (and an image), as Markdown."""
    from .config import describe_cpu

    body = [f"## {title}", "", f"Command: `{command}`", "", f"Machine: {describe_cpu()}", "", "```", *lines, "```",
            ""]
    if image:
        rel = os.path.relpath(os.path.abspath(image), os.path.dirname(os.path.abspath(path)))
        body += [f"![{title}]({rel})", ""]
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        f.write("\n".join(body) + ("\n" if append else ""))


if __name__ == "__main__":
    sys.exit(main())
