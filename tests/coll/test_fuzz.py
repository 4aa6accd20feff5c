"""Property-based fuzz of collective arguments: the MPI library's result, or the same error on every rank.

Each example is one collective call - blocking, or (three in ten) a
persistent request made with the same arguments (``Allreduce_init``...),
started twice. Hypothesis draws one integer seed; every
rank derives the whole example from it with NumPy's generator - the
collective, algorithm, element type, op, root, counts and displacements,
and possibly one *mutation* that makes the call wrong on one rank (the
victim) or on all: another count, element type, root, op or algorithm, an
out-of-range root, an unknown op, partly overlapping send and receive
buffers, a strided or read-only buffer, an object array, overlapping receive
displacements, a receive buffer too small. So the ranks draw the same
examples (``derandomize=True``, the same settings everywhere, no shrinking:
shrinking replays inputs that depend on one rank's failure) and differ only
where the example says they do.

The property, decided from every rank's outcome (gathered, so every rank
passes or fails the example alike, and Hypothesis stops everywhere at once):

* a correct call returns on every rank with the MPI library's own result
  (mpi4py's collective on the same arguments);
* a wrong call raises an :class:`mpicomm.ArgumentError` with the same message
  on every rank;
* never a hang (the test's time limit), never a result that differs from the
  library's, never an error on some ranks only.

The last test prints the tally (cases, errors, wrong results) the README's
reliability section quotes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import registry
from mpicomm.facts import Facts

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = [pytest.mark.mpi]

WORLD = MPI.COMM_WORLD
EXAMPLES = 400  # per pass: a few seconds at 2-3 ranks

COLLECTIVES = ["bcast", "reduce", "allreduce", "scan", "exscan", "gather", "gatherv", "scatter", "scatterv",
               "allgather", "allgatherv", "alltoall", "alltoallv", "reduce_scatter_block", "reduce_scatter"]
ROOTED = {"bcast", "reduce", "gather", "gatherv", "scatter", "scatterv"}
REDUCING = {"reduce", "allreduce", "scan", "exscan", "reduce_scatter_block", "reduce_scatter"}
TWO_BUFFERS = {"allreduce", "scan", "exscan", "allgather", "alltoall", "reduce_scatter_block"}
DTYPES = [np.int64, np.int32, np.float64, np.float32, np.complex128, np.uint8]
OPS = {"i": ["sum", "prod", "min", "max", "band", "bor", "bxor"], "u": ["sum", "max", "bor"],
       "f": ["sum", "prod", "min", "max"], "c": ["sum", "prod"]}
MUTATIONS = ["count", "dtype", "root", "root_range", "op", "bad_op", "algorithm", "overlap", "strided", "readonly",
             "object", "displs", "recv_small"]

TALLY = {"cases": 0, "persistent": 0, "correct_calls": 0, "matched": 0, "bad_calls": 0, "same_error_everywhere": 0,
         "wrong_results": 0, "divergent": 0, "accepted_bad": 0}


def values(rank: int, n: int, dtype: Any) -> np.ndarray:
    """Small rank- and index-dependent values (products of p of them stay exact and finite)."""
    v = (rank + 1) + (np.arange(n) % 3)
    return v.astype(dtype)


def algorithms(collective: str, p: int, nodes: int) -> list[str]:
    """The algorithms that may run here (the registry's own rule)."""
    facts = Facts(p=p, nodes=nodes, device=False, blocking=True)
    return [name for name in registry.algorithms(collective)
            if registry.allowed(registry.lookup(collective, name), facts) is None]


class Example:
    """One drawn call: what every rank passes, and the mutation (if any)."""

    def __init__(self, seed: int, p: int, nodes: int):
        rng = np.random.default_rng(seed)
        self.p = p
        self.collective = str(rng.choice(COLLECTIVES))
        self.dtype = np.dtype(DTYPES[rng.integers(len(DTYPES))])
        self.op = str(rng.choice(OPS[self.dtype.kind])) if self.collective in REDUCING else None
        self.root = int(rng.integers(p))
        self.n = int(rng.integers(0, 7))
        self.counts = [int(c) for c in rng.integers(0, 5, p)]  # v-forms: per-rank counts
        self.matrix = rng.integers(0, 4, (p, p)).tolist()  # alltoallv: matrix[i][j] from i to j
        names = algorithms(self.collective, p, nodes)
        self.algorithm = None if rng.random() < 0.3 or not names else str(rng.choice(names))
        self.names = names
        self.victim = int(rng.integers(p))
        self.everyone = rng.random() < 0.2  # the mutation on every rank, not one
        self.mutation = str(rng.choice(MUTATIONS)) if rng.random() < 0.55 else None
        self.form = "persistent" if rng.random() < 0.3 else "blocking"  # creation arguments differ, for *_init
        self.rng = rng
        self._fit()

    def _fit(self) -> None:
        """Drop a mutation that would not make this call wrong (so every mutated call must fail)."""
        c, m, p = self.collective, self.mutation, self.p
        fits = {
            "count": True,
            "dtype": True,
            "root": c in ROOTED and p >= 2,
            "root_range": c in ROOTED,
            "op": c in REDUCING and p >= 2,
            "bad_op": c in REDUCING,
            "algorithm": len(self.names) >= 2 and p >= 2,
            "overlap": c in TWO_BUFFERS,
            "strided": c not in ROOTED or c == "bcast",
            "readonly": c not in ROOTED or c == "bcast",
            "object": c not in ROOTED or c == "bcast",
            "displs": c == "allgatherv" and p >= 2,
            "recv_small": c in TWO_BUFFERS and c not in ("exscan",),
        }
        if m is not None and not fits[m]:
            self.mutation = None
        if self.mutation in ("count", "dtype", "root", "op", "algorithm", "displs"):
            self.everyone = False  # (on every rank alike these would be correct calls)
        if self.mutation == "readonly" and c == "bcast":
            self.victim = (self.root + 1) % p if p >= 2 else self.victim  # only off the root must bcast write
            if p < 2:
                self.mutation = None
        if self.mutation in ("dtype", "count", "op", "root", "algorithm") and not self.everyone and p < 2:
            self.mutation = None
        if self.mutation == "algorithm" and self.algorithm is None:
            self.algorithm = self.names[0]  # named on every rank, so the victim's other name differs from it
        if self.mutation == "readonly" and c in ("gatherv", "allgatherv", "alltoallv", "scatterv"):
            self.mutation = None  # (these build their receive buffers themselves)

    def hit(self, rank: int) -> str | None:
        """The mutation this rank applies (None: its arguments are correct)."""
        if self.mutation is None or not (self.everyone or rank == self.victim):
            return None
        return self.mutation


def build(ex: Example, comm: Any, rank: int) -> tuple[Callable[[], Any], Callable[[], Any] | None, Callable[[], Any]]:
    """(mpicomm's call, the library's call on copies or None, what to compare) for *rank*."""
    p, c, n = ex.p, ex.collective, ex.n
    m = ex.hit(rank)
    dtype = ex.dtype
    if m == "dtype":
        dtype = np.dtype(np.float32 if dtype != np.float32 else np.int16)
    if m == "count":
        n += 1
    op: Any = ex.op
    if m == "op":
        op = "max" if op != "max" else "min"
    if m == "bad_op":
        op = "summ"
    root = ex.root
    if m == "root":
        root = (root + 1) % p
    if m == "root_range":
        root = p + 2 if ex.rng.random() < 0.5 else -1
    algorithm = ex.algorithm
    if m == "algorithm":
        others = [a for a in ex.names if a != ex.algorithm]
        algorithm = others[0] if others else "tornado"
    kw = {} if algorithm is None else {"algorithm": algorithm}
    native = WORLD

    def invoke(method: str, *args: Any, **kwargs: Any) -> None:
        """The call, blocking or (``ex.form == "persistent"``) as a persistent request started twice."""
        if ex.form != "persistent":
            getattr(comm, method)(*args, **kwargs)
            return
        request = getattr(comm, method + "_init")(*args, **kwargs)
        for _ in range(2):  # the second start reuses the plan: it must give the same result
            request.Start()
            request.Wait()
        request.Free()
    mop = None if op is None or op == "summ" else mpicomm.ops.BUILTIN[op].mpi

    def send_of(count: int) -> np.ndarray:
        x = values(rank, count, dtype)
        if m == "strided":  # (at least two elements: a one-element view is contiguous)
            x = np.repeat(values(rank, max(count, 2), dtype), 2)[::2]
        if m == "object":
            x = x.astype(object) if count else np.array([1], dtype=object)
        return x

    def recv_of(count: int) -> np.ndarray:
        r = np.full(count, 99, dtype)
        if m == "recv_small":  # one element short (one too many when there is none)
            r = np.full(count - 1 if count else 1, 99, dtype)
        if m == "readonly":
            r = np.full(max(count, 1), 99, dtype)[:count] if count else np.full(1, 99, dtype)
            r.flags.writeable = False
        return r

    if m == "overlap":  # send and receive in one array, shifted by one element
        n = max(n, 2)  # both at least two elements: shifted by one, they share memory
        send_n, recv_n = {"allreduce": (n, n), "scan": (n, n), "exscan": (n, n), "allgather": (n, n * p),
                          "alltoall": (n * p, n * p), "reduce_scatter_block": (n * p, n)}[c]
        whole = np.arange(send_n + recv_n + 1).astype(dtype)
        send, recv = whole[:send_n], whole[1 : 1 + recv_n]
        method = {"allreduce": "Allreduce", "scan": "Scan", "exscan": "Exscan", "allgather": "Allgather",
                  "alltoall": "Alltoall", "reduce_scatter_block": "Reduce_scatter_block"}[c]
        extra = {"op": op} if c in REDUCING else {}
        return (lambda: invoke(method, send, recv, **extra, **kw)), None, lambda: recv

    if c == "bcast":
        buf = send_of(n) if rank == root else np.zeros(n, dtype)
        if m in ("readonly", "strided", "object"):
            buf = send_of(n) if m != "readonly" else recv_of(n)
        ref = values(root if 0 <= root < p else 0, n, dtype)
        return (lambda: invoke("Bcast", buf, root, **kw)), (lambda: native.Bcast(ref, ex.root)), lambda: (buf, ref)
    if c in ("allreduce", "scan", "exscan", "reduce"):
        send, recv = send_of(n), recv_of(n)
        ref = np.full(n, 99, ex.dtype)
        method = {"allreduce": "Allreduce", "scan": "Scan", "exscan": "Exscan", "reduce": "Reduce"}[c]
        extra = {"root": root} if c == "reduce" else {}
        compare = (c != "exscan" or rank > 0) and (c != "reduce" or rank == ex.root)
        return ((lambda: invoke(method, send, recv, op, **extra, **kw)),
                (lambda: getattr(native, method)(values(rank, ex.n, ex.dtype), ref, mop,
                                                 **({"root": ex.root} if c == "reduce" else {}))),
                (lambda: (recv, ref)) if compare else (lambda: None))
    if c in ("gather", "allgather"):
        send = send_of(n)
        recv = recv_of(ex.n * p)
        ref = np.full(ex.n * p, 99, ex.dtype)
        if c == "gather":
            return ((lambda: invoke("Gather", send, recv, root, **kw)),
                    (lambda: native.Gather(values(rank, ex.n, ex.dtype), ref, ex.root)),
                    (lambda: (recv, ref)) if rank == ex.root else (lambda: None))
        return ((lambda: invoke("Allgather", send, recv, **kw)),
                (lambda: native.Allgather(values(rank, ex.n, ex.dtype), ref)), lambda: (recv, ref))
    if c in ("gatherv", "allgatherv"):
        counts = list(ex.counts)
        send = send_of(counts[rank] + (m == "count"))
        total = sum(counts)
        displs = [sum(counts[:r]) for r in range(p)]
        if m == "displs":
            counts = [max(k, 2) for k in counts]
            displs = [2 * r - (r > 0) for r in range(p)]  # rank r's block starts inside rank r-1's
            total = max(d + k for d, k in zip(displs, counts))
            send = send_of(counts[rank])
        recv = np.full(total, 99, dtype)
        ref = np.full(sum(ex.counts), 99, ex.dtype)
        spec = [recv, counts, displs]
        mine = values(rank, ex.counts[rank], ex.dtype)
        if c == "gatherv":
            return ((lambda: invoke("Gatherv", send, spec if rank == root else None, root, **kw)),
                    (lambda: native.Gatherv(mine, [ref, ex.counts] if rank == ex.root else None, ex.root)),
                    (lambda: (recv, ref)) if rank == ex.root else (lambda: None))
        return ((lambda: invoke("Allgatherv", send, spec, **kw)),
                (lambda: native.Allgatherv(mine, [ref, ex.counts])), lambda: (recv, ref))
    if c == "scatter":
        send = values(rank, ex.n * p, dtype)
        recv = np.full(n, 99, dtype)
        ref = np.full(ex.n, 99, ex.dtype)
        return ((lambda: invoke("Scatter", send, recv, root, **kw)),
                (lambda: native.Scatter(values(rank, ex.n * p, ex.dtype), ref, ex.root)), lambda: (recv, ref))
    if c == "scatterv":
        counts = list(ex.counts)
        send = [values(rank, sum(counts), dtype), counts]
        recv = np.full(counts[rank] + (m == "count"), 99, dtype)
        ref = np.full(ex.counts[rank], 99, ex.dtype)
        return ((lambda: invoke("Scatterv", send if rank == root else None, recv, root, **kw)),
                (lambda: native.Scatterv([values(rank, sum(ex.counts), ex.dtype), ex.counts]
                                         if rank == ex.root else None, ref, ex.root)), lambda: (recv, ref))
    if c == "alltoall":
        send, recv = send_of(n * p), recv_of(n * p)
        ref = np.full(ex.n * p, 99, ex.dtype)
        return ((lambda: invoke("Alltoall", send, recv, **kw)),
                (lambda: native.Alltoall(values(rank, ex.n * p, ex.dtype), ref)), lambda: (recv, ref))
    if c == "alltoallv":
        sendcounts = list(ex.matrix[rank])
        recvcounts = [ex.matrix[s][rank] for s in range(p)]
        if m == "count":
            sendcounts[0] += 1
        send = send_of(sum(sendcounts))
        recv = np.full(sum(recvcounts), 99, dtype)
        ref = np.full(sum(recvcounts), 99, ex.dtype)
        return ((lambda: invoke("Alltoallv", [send, sendcounts], [recv, recvcounts], **kw)),
                (lambda: native.Alltoallv([values(rank, sum(ex.matrix[rank]), ex.dtype), ex.matrix[rank]],
                                          [ref, recvcounts])), lambda: (recv, ref))
    if c == "reduce_scatter_block":
        send, recv = send_of(n * p), recv_of(n)
        ref = np.full(ex.n, 99, ex.dtype)
        return ((lambda: invoke("Reduce_scatter_block", send, recv, op, **kw)),
                (lambda: native.Reduce_scatter_block(values(rank, ex.n * p, ex.dtype), ref, mop)),
                lambda: (recv, ref))
    if c == "reduce_scatter":
        counts = list(ex.counts)
        if m == "count":
            counts[0] += 1
        send, recv = send_of(sum(counts)), recv_of(counts[rank])
        ref = np.full(ex.counts[rank], 99, ex.dtype)
        return ((lambda: invoke("Reduce_scatter", send, recv, counts, op, **kw)),
                (lambda: native.Reduce_scatter(values(rank, sum(ex.counts), ex.dtype), ref, ex.counts, mop)),
                lambda: (recv, ref))
    raise AssertionError(c)


def matches(got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if got.dtype.kind in "fc":
        tol = 1e-4 if got.dtype.itemsize <= 8 and got.dtype.kind == "f" and got.dtype.itemsize == 4 else 1e-10
        return bool(np.allclose(got, want, rtol=tol, atol=tol))
    return bool(np.array_equal(got, want))


def run_example(comm: Any, seed: int) -> None:
    rank, p = comm.Get_rank(), comm.Get_size()
    ex = Example(seed, p, comm.nodes)
    bad = ex.mutation is not None
    call, reference, compare = build(ex, comm, rank)
    error: tuple[str, bool, str] | None = None
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - gathered below, so every rank decides alike
        error = (type(exc).__name__, isinstance(exc, mpicomm.ArgumentError), str(exc).partition(": ")[2])
    errors = WORLD.allgather(error)
    verdict = None
    if all(e is None for e in errors) and not bad:
        reference()  # every rank: the library's collective on the correct arguments
        pair = compare()
        ok = pair is None or matches(*pair)
        oks = WORLD.allgather(ok)
        if not all(oks):
            verdict = f"wrong result on rank(s) {[r for r, o in enumerate(oks) if not o]}"
    elif all(e is None for e in errors):
        verdict = "a wrong call was accepted on every rank"
    elif any(e is None for e in errors):
        verdict = f"an error on some ranks only: {errors}"
    elif not all(e[1] for e in errors) or len({e[2] for e in errors}) != 1:
        verdict = f"different errors, or not ArgumentErrors: {errors}"
    elif not bad:
        verdict = f"a correct call raised: {errors[0]}"
    TALLY["cases"] += 1
    TALLY["persistent"] += ex.form == "persistent"
    TALLY["bad_calls" if bad else "correct_calls"] += 1
    if verdict is None:
        TALLY["same_error_everywhere" if bad else "matched"] += 1
    elif verdict.startswith("wrong result"):
        TALLY["wrong_results"] += 1
    elif verdict.startswith("a wrong call"):
        TALLY["accepted_bad"] += 1
    else:
        TALLY["divergent"] += 1
    description = (f"seed {seed}: {ex.collective} {ex.dtype} n={ex.n} op={ex.op} root={ex.root} "
                   f"algorithm={ex.algorithm} form={ex.form} mutation={ex.mutation} victim={'all' if ex.everyone else ex.victim}")
    assert verdict is None, f"{description}: {verdict}"


@pytest.mark.timeout(300)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_every_call_matches_the_library_or_fails_alike_everywhere(comm, seed):
    run_example(comm, seed)


def test_fixed_seeds_cover_every_mutation(comm):
    """A deterministic sweep beside Hypothesis's draws: seeds until each mutation has been tried."""
    seen: set[str] = set()
    seed = 0
    while len(seen) < len(MUTATIONS) and seed < 4000:
        ex = Example(seed, comm.Get_size(), comm.nodes)
        if ex.mutation is not None and ex.mutation not in seen:
            seen.add(ex.mutation)
            run_example(comm, seed)
        seed += 1
    one_rank = {"count", "dtype", "root", "op", "algorithm", "displs"}  # need a second rank to differ from
    assert seen == set(MUTATIONS) - (one_rank if comm.Get_size() < 2 else set()), sorted(seen)


def test_tally(comm, capsys):
    """The figures for the README (printed by rank 0); every case was right."""
    if comm.Get_rank() == 0:
        with capsys.disabled():
            print(f"\nfuzz tally at {comm.Get_size()} ranks: {TALLY}")
    assert TALLY["wrong_results"] == TALLY["divergent"] == TALLY["accepted_bad"] == 0, TALLY
