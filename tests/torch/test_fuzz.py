"""Property-based fuzz of the torch backend's collectives: the right result, or the same error on every rank.

The torch counterpart of ``tests/coll/test_fuzz.py``. Each example is one call
of a :class:`mpicomm.torch.ProcessGroup` method (all_reduce, reduce,
broadcast, all_gather, all_gather_into_tensor, reduce_scatter_tensor,
all_to_all_single, gather, scatter), made on the group directly - the
backend itself, without ``torch.distributed``'s front end, whose own checks
raise on one rank before the backend is called. Hypothesis draws one integer
seed; every rank derives the whole example from it with NumPy's generator -
the collective, dtype, op, root, sizes, split sizes, blocking or
``async_op`` - and possibly one *mutation* on one rank (the victim) or on
all: another count, dtype, op or root; an op the dtype has not; a root
outside the group; a meta or sparse tensor; a list of the wrong length; split
sizes that do not add up or do not fit the peers'. Two mutations are benign
and must still work: non-contiguous tensors, and one rank asynchronous while
the others block. Every rank draws the same examples (``derandomize=True``,
no shrinking) and differs only where the example says so.

The property, decided from every rank's outcome (gathered with plain mpi4py,
so every rank passes or fails the example alike):

* a correct call returns on every rank with the right result: the value every
  rank computes on its own from every rank's inputs (they are a function of
  the rank and the example), for the ops as PyTorch defines them (AVG: the
  sum times 1/p; bfloat16 reduced in float32, as gloo does);
* a wrong call raises an :class:`mpicomm.ArgumentError` with the same message
  on every rank, after which the group still works (the next example runs on
  it);
* never a hang (the test's time limit), never an error on some ranks only.

The last test prints the tally (cases, errors, wrong results).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist  # noqa: E402
from mpi4py import MPI

from mpicomm import ArgumentError  # noqa: E402

from .conftest import torch, values

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = [pytest.mark.mpi]

WORLD = MPI.COMM_WORLD
EXAMPLES = 160  # per pass (with the sweep's ~90): a few seconds at 2-3 ranks
R = dist.ReduceOp
C10D = torch._C._distributed_c10d

COLLECTIVES = ["all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
               "all_to_all_single", "gather", "scatter"]
REDUCING = {"all_reduce", "reduce", "reduce_scatter_tensor"}
ROOTED = {"reduce", "broadcast", "gather", "scatter"}
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.float16, torch.bfloat16]
FLOAT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
INT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
#: Another dtype for the "dtype" mutation (never int16 for bfloat16: bfloat16 moves as its int16 bits).
OTHER_DTYPE = {torch.float32: torch.int32, torch.float64: torch.int64, torch.int32: torch.float32,
               torch.int64: torch.float64, torch.uint8: torch.int32, torch.float16: torch.bfloat16,
               torch.bfloat16: torch.float16}
#: Another op for the "op" mutation (AVG and SUM on floating-point tensors: a sum either way in the core, which must
#: still tell them apart).
OTHER_OP = {"SUM": "MAX", "AVG": "SUM", "PRODUCT": "SUM", "MIN": "MAX", "MAX": "MIN", "BAND": "BOR", "BOR": "BXOR",
            "BXOR": "BAND"}
MUTATIONS = ["count", "dtype", "op", "bad_op", "root", "root_range", "meta", "sparse", "list_len", "splits_sum",
             "splits_shift", "noncontig", "mixed_async"]
BENIGN = {"noncontig", "mixed_async"}  # mutations that leave the call correct
ONE_RANK = {"count", "dtype", "op", "root", "splits_shift", "mixed_async"}  # wrong only where ranks differ

TALLY = {"cases": 0, "correct_calls": 0, "matched": 0, "bad_calls": 0, "same_error_everywhere": 0,
         "wrong_results": 0, "divergent": 0, "accepted_bad": 0}


def _floating(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


class Example:
    """One drawn call: what every rank passes, and the mutation (if any)."""

    def __init__(self, seed: int, p: int):
        rng = np.random.default_rng(seed)
        self.p = p
        self.collective = str(rng.choice(COLLECTIVES))
        self.dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        ops = FLOAT_OPS if _floating(self.dtype) else INT_OPS
        self.op = str(rng.choice(ops)) if self.collective in REDUCING else None
        self.root = int(rng.integers(p))
        self.n = int(rng.integers(0, 6))
        self.width = int(rng.integers(1, 4))  # all_to_all_single: elements per row
        self.matrix = rng.integers(0, 3, (p, p)).tolist() if rng.random() < 0.5 else None  # rows from i to j
        self.async_op = bool(rng.random() < 0.4)
        self.victim = int(rng.integers(p))
        self.everyone = bool(rng.random() < 0.2)
        self.longer = bool(rng.random() < 0.5)  # list_len: one more tensor (else one fewer)
        self.far_root = p + 2 if rng.random() < 0.5 else -1  # root_range
        self.mutation = str(rng.choice(MUTATIONS)) if rng.random() < 0.6 else None
        self._fit()

    def _fit(self) -> None:
        """Drop a mutation that would not make this call wrong (or, benign, that cannot apply)."""
        c, p = self.collective, self.p
        if self.mutation == "count" and c == "all_to_all_single" and self.matrix is not None:
            self.mutation = "splits_shift"
        fits = {
            "count": p >= 2,
            "dtype": p >= 2,
            "op": c in REDUCING and p >= 2,
            "bad_op": c in REDUCING,
            "root": c in ROOTED and p >= 2,
            "root_range": c in ROOTED,
            "meta": True,
            "sparse": True,
            "list_len": c in ("all_gather", "gather", "scatter"),
            "splits_sum": c == "all_to_all_single" and self.matrix is not None,
            "splits_shift": c == "all_to_all_single" and self.matrix is not None and p >= 2,
            "noncontig": True,
            "mixed_async": p >= 2,
        }
        if self.mutation is not None and not fits[self.mutation]:
            self.mutation = None
        if self.mutation in ONE_RANK:
            self.everyone = False  # (on every rank alike these would be correct calls)
        if self.mutation == "list_len" and c in ("gather", "scatter"):
            self.victim, self.everyone = self.root, False  # only the root has lists
        if self.mutation == "root" and c in ("gather", "scatter"):
            self.victim = (self.root + 1) % p  # the victim takes itself for the root: it passes lists

    @property
    def bad(self) -> bool:
        return self.mutation is not None and self.mutation not in BENIGN

    def hit(self, rank: int) -> str | None:
        """The mutation this rank applies (None: its arguments are the example's)."""
        if self.mutation is None or not (self.everyone or rank == self.victim):
            return None
        return self.mutation


# ------------------------------------------------------------ tensors


def _kind(op: str | None) -> str:
    return {"PRODUCT": "product", "BAND": "bits", "BOR": "bits", "BXOR": "bits"}.get(op or "", "sum")


def _data(seed_rank: int, n: int, dtype: torch.dtype, op: str | None) -> torch.Tensor:
    return values(seed_rank, n, dtype, _kind(op))


def _placed(data: torch.Tensor, mutation: str | None) -> torch.Tensor:
    """*data* as the rank passes it: a copy, non-contiguous, on the meta device or sparse."""
    if mutation == "meta":
        return torch.empty(data.shape, dtype=data.dtype, device="meta")
    if mutation == "sparse":
        return data.reshape(-1).to_sparse() if data.dim() <= 1 else data.to_sparse()
    if mutation == "noncontig" and data.numel() >= 2:
        wide = torch.zeros(*data.shape, 2, dtype=data.dtype)
        wide[..., 1] = data
        return wide[..., 1]
    return data.clone()


def _empty(shape: Any, dtype: torch.dtype, mutation: str | None) -> torch.Tensor:
    """An output tensor (placed as the inputs are: a rank with no input, scatter's, has its mutation here)."""
    return _placed(torch.full(shape if isinstance(shape, tuple) else (shape,), 7, dtype=dtype),
                   mutation if mutation in ("meta", "sparse", "noncontig") else None)


def _reduced(ex: Example, inputs: list[torch.Tensor]) -> torch.Tensor:
    """Every rank's *inputs* reduced with the example's op, as PyTorch defines it (exact for these values)."""
    op, dtype, p = ex.op, ex.dtype, ex.p
    if op in ("BAND", "BOR", "BXOR"):
        acc = inputs[0].to(torch.int64)
        for t in inputs[1:]:
            acc = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op](acc, t.to(torch.int64))
        return acc.to(dtype)
    wide = torch.stack([t.to(torch.float64) for t in inputs])
    if op in ("SUM", "AVG"):
        acc = wide.sum(0)
    elif op == "PRODUCT":
        acc = wide.prod(0)
    elif op == "MIN":
        acc = wide.min(0).values
    else:
        acc = wide.max(0).values
    if op == "AVG":  # the sum in the dtype it is reduced in (bfloat16: float32), times 1/p there
        work = torch.float32 if dtype == torch.bfloat16 else dtype
        return acc.to(work).mul_(1.0 / p).to(dtype)
    return acc.to(dtype)


# ------------------------------------------------------------ one call


def build(ex: Example, pg: Any, rank: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(the call on this rank, what it must give: a pair (got, want) or None) - the call returns a Work."""
    p, c, m = ex.p, ex.collective, ex.hit(rank)
    n = ex.n + (m == "count")
    dtype = OTHER_DTYPE[ex.dtype] if m == "dtype" else ex.dtype
    op = ex.op
    if m == "op":
        op = "AVG" if op == "SUM" and _floating(dtype) else OTHER_OP[op]
    if m == "bad_op":
        op = "BAND" if _floating(dtype) else "AVG"
    root = ex.root
    if m == "root":
        root = (root + 1) % p if c not in ("gather", "scatter") else rank
    if m == "root_range":
        root = ex.far_root
    async_op = ex.async_op != (m == "mixed_async")
    shape_m = m if m in ("meta", "sparse", "noncontig") else None
    ins = _data(rank, n, dtype, op)

    def opts(name: str, **fields: Any) -> Any:
        o = getattr(C10D, name)()
        o.asyncOp = async_op
        for k, v in fields.items():
            setattr(o, k, v)
        return o

    def reduce_op() -> Any:
        return getattr(R, op)

    everyone = [_data(k, ex.n, ex.dtype, ex.op) for k in range(p)]  # every rank's input in the example
    if c == "all_reduce":
        t = _placed(ins, shape_m)
        return (lambda: pg.allreduce([t], opts("AllreduceOptions", reduceOp=reduce_op())),
                lambda: (t, _reduced(ex, everyone)))
    if c == "reduce":
        t = _placed(ins, shape_m)
        want = _reduced(ex, everyone) if rank == ex.root else ins
        return (lambda: pg.reduce([t], opts("ReduceOptions", reduceOp=reduce_op(), rootRank=root)),
                lambda: (t, want) if rank == ex.root else None)
    if c == "broadcast":
        t = _placed(ins if rank == root else torch.zeros(n, dtype=dtype), shape_m)
        return (lambda: pg.broadcast([t], opts("BroadcastOptions", rootRank=root)),
                lambda: (t, everyone[ex.root]))
    if c == "all_gather":
        t = _placed(ins, shape_m)
        count = p + (1 if ex.longer else -1) if m == "list_len" else p
        outs = [_empty(n, dtype, m) for _ in range(count)]
        return (lambda: pg.allgather([outs], [t], opts("AllgatherOptions")),
                lambda: (torch.cat([o.reshape(-1) for o in outs]), torch.cat(everyone)))
    if c == "all_gather_into_tensor":
        t = _placed(ins, shape_m)
        out = _empty(n * p, dtype, m)
        return (lambda: pg._allgather_base(out, t, opts("AllgatherOptions")), lambda: (out, torch.cat(everyone)))
    if c == "reduce_scatter_tensor":
        t = _placed(_data(rank, n * p, dtype, op), shape_m)
        out = _empty(n, dtype, m)
        whole = _reduced(ex, [_data(k, ex.n * p, ex.dtype, ex.op) for k in range(p)])
        return (lambda: pg._reduce_scatter_base(out, t, opts("ReduceScatterOptions", reduceOp=reduce_op())),
                lambda: (out, whole[rank * ex.n:(rank + 1) * ex.n]))
    if c == "all_to_all_single":
        w = ex.width
        if ex.matrix is None:  # equal blocks of n rows
            rows_in, rows_out, in_splits, out_splits = n * p, n * p, [], []
            sends = [[ex.n] * p for _ in range(p)]
        else:
            sends = [list(row) for row in ex.matrix]
            in_splits = list(sends[rank])
            out_splits = [sends[k][rank] for k in range(p)]
            if m == "splits_shift":  # one more row to rank 0 than rank 0 expects (locally consistent)
                in_splits[0] += 1
            rows_in, rows_out = sum(in_splits), sum(out_splits)
            if m == "splits_sum":  # split sizes that do not add up to the input's rows
                in_splits[-1] += 1
        t = _placed(_data(rank, rows_in * w, dtype, None).reshape(rows_in, w), shape_m)
        out = _empty((rows_out, w), dtype, m)

        def want() -> Any:
            pieces = []
            for k in range(p):
                mine = _data(k, sum(sends[k]) * w, ex.dtype, None).reshape(-1, w)
                start = sum(sends[k][:rank])
                pieces.append(mine[start:start + sends[k][rank]])
            return out, torch.cat(pieces)

        return (lambda: pg.alltoall_base(out, t, out_splits, in_splits, opts("AllToAllOptions")), want)
    if c == "gather":
        t = _placed(ins, shape_m)
        at_root = rank == root
        count = p + (1 if ex.longer else -1) if m == "list_len" else p
        outs = [_empty(n, dtype, m) for _ in range(count)] if at_root else []
        return (lambda: pg.gather([outs] if at_root else [], [t], opts("GatherOptions", rootRank=root)),
                lambda: (torch.cat([o.reshape(-1) for o in outs]), torch.cat(everyone)) if rank == ex.root else None)
    if c == "scatter":
        at_root = rank == root
        count = p + (1 if ex.longer else -1) if m == "list_len" else p
        parts = [_placed(_data(10 + k, n, dtype, None), shape_m) for k in range(count)] if at_root else []
        out = _empty(n, dtype, m)
        return (lambda: pg.scatter([out], [parts] if at_root else [], opts("ScatterOptions", rootRank=root)),
                lambda: (out, _data(10 + rank, ex.n, ex.dtype, None)))
    raise AssertionError(c)


def matches(got: torch.Tensor, want: torch.Tensor) -> bool:
    got = got.detach()
    if got.dtype != want.dtype or got.numel() != want.numel():
        return False
    got, want = got.reshape(-1), want.reshape(-1)
    if _floating(got.dtype):
        return bool(torch.allclose(got.to(torch.float64), want.to(torch.float64), rtol=1e-2 if got.element_size()
                                   == 2 else 1e-6, atol=0))
    return bool(torch.equal(got, want))


def run_example(pg: Any, seed: int) -> None:
    rank, p = pg.rank(), pg.size()
    ex = Example(seed, p)
    call, compare = build(ex, pg, rank)
    error: tuple[str, bool, str] | None = None
    try:
        work = call()
        work.wait()
    except Exception as exc:  # noqa: BLE001 - gathered below, so every rank decides alike
        error = (type(exc).__name__, isinstance(exc, ArgumentError), str(exc))
    errors = WORLD.allgather(error)
    verdict = None
    if all(e is None for e in errors) and not ex.bad:
        pair = compare()
        oks = WORLD.allgather(pair is None or matches(*pair))
        if not all(oks):
            verdict = f"wrong result on rank(s) {[r for r, o in enumerate(oks) if not o]}"
    elif all(e is None for e in errors):
        verdict = "a wrong call was accepted on every rank"
    elif any(e is None for e in errors):
        verdict = f"an error on some ranks only: {errors}"
    elif not all(e[1] for e in errors) or len({e[2] for e in errors}) != 1:
        verdict = f"different errors, or not ArgumentErrors: {errors}"
    elif not ex.bad:
        verdict = f"a correct call raised: {errors[0]}"
    TALLY["cases"] += 1
    TALLY["bad_calls" if ex.bad else "correct_calls"] += 1
    if verdict is None:
        TALLY["same_error_everywhere" if ex.bad else "matched"] += 1
    elif verdict.startswith("wrong result"):
        TALLY["wrong_results"] += 1
    elif verdict.startswith("a wrong call"):
        TALLY["accepted_bad"] += 1
    else:
        TALLY["divergent"] += 1
    description = (f"seed {seed}: {ex.collective} {ex.dtype} n={ex.n} op={ex.op} root={ex.root} "
                   f"splits={ex.matrix} async={ex.async_op} mutation={ex.mutation} "
                   f"victim={'all' if ex.everyone else ex.victim}")
    assert verdict is None, f"{description}: {verdict}"


@pytest.fixture(scope="module")
def pg(groups):
    return groups[0]


@pytest.mark.timeout(300)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_every_call_gives_the_right_result_or_fails_alike_everywhere(pg, seed):
    run_example(pg, seed)


@pytest.mark.timeout(300)
def test_fixed_seeds_cover_every_mutation_and_collective(pg):
    """A deterministic sweep beside Hypothesis's draws: the first seed of each (collective, mutation) that can
    apply, and of each mutation asynchronous and blocking."""
    p = pg.size()
    seen: set[tuple[str, str | None]] = set()
    modes: set[tuple[str | None, bool]] = set()
    for seed in range(20000):
        ex = Example(seed, p)
        fresh = (ex.collective, ex.mutation) not in seen or (ex.mutation, ex.async_op) not in modes
        if fresh:
            seen.add((ex.collective, ex.mutation))
            modes.add((ex.mutation, ex.async_op))
            run_example(pg, seed)
    mutations = {m for _, m in seen if m is not None}
    assert mutations == set(MUTATIONS) - (ONE_RANK if p < 2 else set()), sorted(mutations)
    assert {c for c, _ in seen} == set(COLLECTIVES)
    assert {(m, a) for m in mutations for a in (False, True)} <= modes


def test_tally(pg, capsys):
    """The figures (printed by rank 0); every case was right."""
    if pg.rank() == 0:
        with capsys.disabled():
            print(f"\nfuzz tally (torch) at {pg.size()} ranks: {TALLY}")
    assert TALLY["wrong_results"] == TALLY["divergent"] == TALLY["accepted_bad"] == 0, TALLY
