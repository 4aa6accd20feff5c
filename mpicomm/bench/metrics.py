"""The conventions of the benchmark tables as pure functions: sizes, what each collective moves, nccl-tests'
algbw/busbw factors, OSU's Size column, and the data every rank sends.

No MPI here and nothing timed, so the numbers the tables print can be
checked by hand (tests/test_bench.py does) and reused by whoever measures
collectives the same way (``python -m mpicomm.tune --collectives``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from typing import Any

import numpy as np

__all__ = [
    "parse_sizes", "iterations", "Collective", "COLLECTIVES", "nccl_bytes", "bus_factor", "bandwidths",
    "model_bytes", "layout", "rank_values", "mismatch",
]

# ---------------------------------------------------------------- sizes and iterations

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _bytes(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in "KMG" else ""
    try:
        value = int(text[: len(text) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = -1
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use bytes with an optional K, M or G (e.g. 64K)")
    return value


def parse_sizes(text: str) -> list[int]:
    """``"8:1M"`` → powers of two from 8 B to 1 MiB; ``"8,100,4K"`` → those sizes."""
    if ":" in text:
        low, high = (_bytes(t) for t in text.split(":", 1))
        if low > high:
            raise argparse.ArgumentTypeError(f"--sizes {text}: the first size is larger than the last")
        sizes, size = [], low
        while size <= high:
            sizes.append(size)
            size *= 2
        return sizes
    return [_bytes(t) for t in text.split(",")]


def _iterations(size: int, requested: int | None) -> int:
    return requested if requested else (1000 if size <= 8192 else 100)  # OSU's defaults


#: The public name of the iteration rule (the measuring loops and tune use it).
iterations = _iterations


# ---------------------------------------------------------------- collectives: what each one moves


@dataclass(frozen=True)
class Collective:
    """How one collective is called and measured.

    ``unit`` is the count the sizes are made of: the whole vector (allreduce,
    bcast, reduce, scan) or one rank's block (the others). The send and
    receive buffers hold ``unit`` or ``unit·p`` elements.
    """

    name: str
    method: str  # the mpi4py / mpicomm.Comm method
    registry: str  # the collective's name in mpicomm.registry
    whole: bool  # unit = the whole vector (else one rank's block)
    send_p: bool  # send buffer holds unit·p elements
    recv_p: bool  # receive buffer holds unit·p elements
    op: bool = False
    root: bool = False
    root_only: bool = False  # only the root has a result
    size_is_all: bool = False  # OSU's Size is unit·p (reduce_scatter: the whole vector)

    def describe_size(self) -> str:
        """What the Size column measures, in words."""
        if self.name == "barrier":
            return "no data"
        if self.whole or self.size_is_all:
            return "the whole vector, in bytes"
        if self.name == "alltoall":
            return "the block each rank sends to each peer, in bytes"
        return "one rank's block, in bytes"


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("allreduce", "Allreduce", "allreduce", True, False, False, op=True),
    Collective("bcast", "Bcast", "bcast", True, False, False, root=True),
    Collective("reduce", "Reduce", "reduce", True, False, False, op=True, root=True, root_only=True),
    Collective("allgather", "Allgather", "allgather", False, False, True),
    Collective("alltoall", "Alltoall", "alltoall", False, True, True),
    Collective("reduce_scatter", "Reduce_scatter_block", "reduce_scatter_block", False, True, False, op=True,
               size_is_all=True),
    Collective("gather", "Gather", "gather", False, False, True, root=True, root_only=True),
    Collective("scatter", "Scatter", "scatter", False, True, False, root=True),
    Collective("scan", "Scan", "scan", True, False, False, op=True),
    Collective("barrier", "Barrier", "barrier", True, False, False),
)}

_ALL_FACTOR = ("reduce_scatter", "allgather", "alltoall", "gather", "scatter")  # nccl-tests: S = count·typesize·p


def nccl_bytes(collective: str, count: int, itemsize: int, p: int) -> int:
    """nccl-tests' S: ``count·typesize`` (allreduce, bcast, reduce, scan) or ``count·typesize·p``.

    *count* is nccl-tests' count: the whole vector for allreduce, bcast,
    reduce, scan; one rank's block for reduce_scatter, allgather, alltoall
    (the block for each peer), gather, scatter. Barrier moves no data: 0.
    """
    if collective == "barrier":
        return 0
    return count * itemsize * (p if collective in _ALL_FACTOR else 1)


def bus_factor(collective: str, p: int) -> float:
    """nccl-tests' busbw factor: 2(p−1)/p for allreduce, (p−1)/p for the gathering and scattering ones, else 1.

    scan is not an nccl-tests collective: it gets 1, like reduce.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if collective == "allreduce":
        return 2 * (p - 1) / p
    if collective in _ALL_FACTOR:
        return (p - 1) / p
    return 0.0 if collective == "barrier" else 1.0


def bandwidths(collective: str, count: int, itemsize: int, p: int, seconds: float) -> tuple[float, float] | None:
    """(algbw, busbw) in GB/s (10⁹ B/s) for one call of *seconds*; None for barrier or a zero time."""
    if collective == "barrier" or seconds <= 0:
        return None
    algbw = nccl_bytes(collective, count, itemsize, p) / seconds / 1e9
    return algbw, algbw * bus_factor(collective, p)


def model_bytes(collective: str, count: int, itemsize: int, p: int) -> int:
    """The message size the selection table and the model use (``mpicomm.coll.dispatch.selection_bytes``).

    Whole vector for allreduce, bcast, reduce, scan; the block for gather and
    scatter; everything gathered for allgather; each rank's whole send for
    alltoall; the whole input for reduce_scatter.
    """
    if collective == "barrier":
        return 0
    spec = COLLECTIVES[collective]
    return count * itemsize * (1 if spec.whole or collective in ("gather", "scatter") else p)


def layout(collective: str, size: int, p: int, itemsize: int = 8) -> tuple[int, int, int, int]:
    """(unit, send elements, receive elements, Size in bytes) for a requested *size* in bytes.

    The unit count is the size rounded down to whole elements, at least one
    (reduce_scatter: whole elements per rank).
    """
    spec = COLLECTIVES[collective]
    if collective == "barrier":
        return 0, 0, 0, 0
    unit = max(1, size // (itemsize * (p if spec.size_is_all else 1)))
    send = unit * (p if spec.send_p else 1)
    recv = unit * (p if spec.recv_p else 1)
    return unit, send, recv, unit * itemsize * (p if spec.size_is_all else 1)


def rank_values(count: int, rank: int, p: int, salt: int = 0, dtype: Any = np.float64, op: str = "sum") -> np.ndarray:
    """Data that depends on rank and index, exact under any reduction order.

    float64 sums: ``index·p + rank + salt`` (distinct). Other types, or other
    ops: small integers (``(3·index + 5·rank + salt) mod 16``; for prod 1, or
    2 where ``3·index + 5·rank + salt`` is a multiple of 7), so that p of them
    reduce exactly even in float16.
    """
    dtype = np.dtype(dtype)
    index = np.arange(count, dtype=np.int64)
    if dtype == np.float64 and op == "sum":
        return (index * p + (rank + salt)).astype(np.float64)
    if op == "prod":  # 1, and a 2 at every 7th place, shifted by rank: a product of p stays a small power of two
        return (1 + ((3 * index + 5 * rank + salt) % 7 == 0)).astype(dtype)
    return ((3 * index + 5 * rank + salt) % 16).astype(dtype)


#: ``--dtype`` choices and ``--op`` choices (the reducing collectives).
DTYPES = ("float64", "float32", "float16", "int64", "int32")
OPS = ("sum", "prod", "max", "min")


def wrong_elements(got: np.ndarray, want: np.ndarray) -> int:
    """How many elements of *got* differ from *want* (NaN never equals; a wrong shape: all of *want*)."""
    if got.shape != want.shape:
        return int(want.size)
    return int(np.count_nonzero(~(got == want)))


def mismatch(got: np.ndarray, want: np.ndarray) -> str | None:
    """None if *got* equals *want* element for element (NaN never does); else what differs."""
    if got.shape != want.shape:
        return f"shape {got.shape} instead of {want.shape}"
    bad = np.flatnonzero(~(got == want))
    if bad.size == 0:
        return None
    i = int(bad[0])
    return f"{bad.size} of {want.size} elements differ (first at index {i}: {got[i]!r}, native MPI {want[i]!r})"

