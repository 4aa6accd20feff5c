"""The conventions of the benchmark tables as pure functions: sizes, what each collective moves, nccl-tests'
algbw/busbw factors, OSU's Size column, and the data every rank sends.

No MPI here and nothing timed, so the numbers the tables print can be
checked by hand (tests/test_bench.py does) and reused by whoever measures
collectives the same way (``python -m mpicomm.tune --collectives``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cli import sizes_arg

__all__ = [
    "parse_sizes", "iterations", "latency_iterations", "warmup_iterations", "bandwidth_iterations",
    "bandwidth_warmup", "OSU_COLLECTIVE", "OSU_LATENCY", "OSU_SKIP", "OSU_BANDWIDTH", "OSU_BANDWIDTH_SKIP", "WINDOW",
    "MeasuredCollective", "COLLECTIVES", "WORLD", "nccl_bytes", "bus_factor", "bandwidths", "model_bytes", "layout",
    "rank_values", "mismatch", "DTYPES", "OPS", "type_name", "redop_name", "root_of", "mpi_type_name",
]

# ---------------------------------------------------------------- sizes and iterations


def parse_sizes(text: str) -> list[int]:
    """``"8:1M"`` → powers of two from 8 B to 1 MiB; ``"8,100,4K"`` → those sizes (:func:`mpicomm.cli.sizes_arg`).

    Kept for the callers that import it from here (``python -m mpicomm.tune``,
    ``python -m mpicomm algorithms --explain``); a bad size raises
    ``argparse.ArgumentTypeError`` naming the value and the accepted forms.
    """
    return sizes_arg(text)


#: OSU's boundary between small and large messages: its iteration and warm-up counts change above it.
LARGE = 8192

#: OSU micro-benchmarks' default loop counts, ``(up to LARGE, above it)``: timed iterations and skipped
#: (untimed) ones. Collectives (osu_allreduce, osu_bcast, ...): 1,000 and 100 timed, 100 and 10 skipped;
#: osu_latency: 10,000 and 1,000 timed, 100 and 10 skipped; osu_bw: 100 and 20 windows, 10 and 2 skipped.
OSU_COLLECTIVE = (1000, 100)
OSU_LATENCY = (10_000, 1000)
OSU_SKIP = (100, 10)
OSU_BANDWIDTH = (100, 20)
OSU_BANDWIDTH_SKIP = (10, 2)


def _osu(size: int, counts: tuple[int, int]) -> int:
    return counts[0] if size <= LARGE else counts[1]


def _iterations(size: int, requested: int | None) -> int:
    return requested if requested else _osu(size, OSU_COLLECTIVE)


#: The public name of the iteration rule (the measuring loops and tune use it): *requested* (``--iters``), else
#: OSU's collective benchmarks' 1,000 up to 8 KiB and 100 above.
iterations = _iterations


def latency_iterations(size: int, requested: int | None) -> int:
    """Round trips per size of the ping-pong latency test: *requested*, else osu_latency's (10,000 up to 8 KiB,
    1,000 above)."""
    return requested if requested else _osu(size, OSU_LATENCY)


def warmup_iterations(size: int, iters: int, requested: int | None = None) -> int:
    """Untimed calls before a size's timed ones: *requested* (``--warmup``), else OSU's skip count.

    OSU skips 100 iterations up to 8 KiB and 10 above, in its collective
    benchmarks and in osu_latency alike; the default is that, but never more
    than the *iters* timed ones (a short run with ``--iters 4`` warms up 4
    times, not 100).
    """
    if requested is not None:
        return requested
    return min(_osu(size, OSU_SKIP), iters)


def bandwidth_iterations(size: int, requested: int | None) -> int:
    """Windows per size of the ping-pong bandwidth test: *requested*, else osu_bw's (100 up to 8 KiB, 20 above)."""
    return requested if requested else _osu(size, OSU_BANDWIDTH)


def bandwidth_warmup(size: int, windows: int, requested: int | None = None) -> int:
    """Untimed windows before the bandwidth test's timed ones: *requested*, else osu_bw's skip (10 up to 8 KiB,
    2 above), never more than *windows*."""
    if requested is not None:
        return requested
    return min(_osu(size, OSU_BANDWIDTH_SKIP), windows)


#: osu_bw's window: non-blocking sends in flight before the receiver's acknowledgement.
WINDOW = 64


# ---------------------------------------------------------------- collectives: what each one moves


@dataclass(frozen=True)
class MeasuredCollective:
    """How one collective is called and measured.

    ``unit`` is the count the sizes are made of: the whole vector (allreduce,
    bcast, reduce, scan) or one rank's block (the others). The send and
    receive buffers hold ``unit`` or ``unit·p`` elements. ``in_place``: the
    collective has an ``MPI.IN_PLACE`` form (see :mod:`mpicomm.bench.measure`
    for where the data lies then).
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
    in_place: bool = True  # has an MPI.IN_PLACE form (bcast is in place by nature; barrier moves nothing)
    neighbors: int = 0  # a neighbourhood collective, measured on a periodic ring: each rank's neighbours (2)

    def degree(self, p: int) -> int:
        """The blocks a rank's buffers hold ``unit·degree`` of: p, or a neighbourhood collective's neighbours."""
        return self.neighbors or p

    def describe_size(self) -> str:
        """What the Size column measures, in words."""
        if self.name == "barrier":
            return "no data"
        if self.whole or self.size_is_all:
            return "the whole vector, in bytes"
        if self.name == "alltoall":
            return "the block each rank sends to each peer, in bytes"
        if self.neighbors:
            return (f"the block each rank sends to each of its {self.neighbors} neighbours on a periodic ring (a 1-D "
                    f"periodic Cartesian communicator), in bytes")
        return "one rank's block, in bytes"


COLLECTIVES: dict[str, MeasuredCollective] = {c.name: c for c in (
    MeasuredCollective("allreduce", "Allreduce", "allreduce", True, False, False, op=True),
    MeasuredCollective("bcast", "Bcast", "bcast", True, False, False, root=True, in_place=False),
    MeasuredCollective("reduce", "Reduce", "reduce", True, False, False, op=True, root=True, root_only=True),
    MeasuredCollective("allgather", "Allgather", "allgather", False, False, True),
    MeasuredCollective("alltoall", "Alltoall", "alltoall", False, True, True),
    MeasuredCollective("reduce_scatter", "Reduce_scatter_block", "reduce_scatter_block", False, True, False, op=True,
                       size_is_all=True),
    MeasuredCollective("gather", "Gather", "gather", False, False, True, root=True, root_only=True),
    MeasuredCollective("scatter", "Scatter", "scatter", False, True, False, root=True),
    MeasuredCollective("scan", "Scan", "scan", True, False, False, op=True),
    MeasuredCollective("barrier", "Barrier", "barrier", True, False, False, in_place=False),
    MeasuredCollective("neighbor_allgather", "Neighbor_allgather", "neighbor_allgather", False, False, True,
                       in_place=False, neighbors=2),
    MeasuredCollective("neighbor_alltoall", "Neighbor_alltoall", "neighbor_alltoall", False, True, True,
                       in_place=False, neighbors=2),
)}

#: The collectives the world communicator runs (``python -m mpicomm.tune`` decides rules for these): all but the
#: neighbourhood ones, which need a topology.
WORLD = tuple(name for name, spec in COLLECTIVES.items() if not spec.neighbors)

_ALL_FACTOR = ("reduce_scatter", "allgather", "alltoall", "gather", "scatter")  # nccl-tests: S = count·typesize·p


def nccl_bytes(collective: str, count: int, itemsize: int, p: int) -> int:
    """nccl-tests' S: ``count·typesize`` (allreduce, bcast, reduce, scan) or ``count·typesize·p``.

    *count* is nccl-tests' count: the whole vector for allreduce, bcast,
    reduce, scan; one rank's block for reduce_scatter, allgather, alltoall
    (the block for each peer), gather, scatter. Barrier moves no data: 0.
    """
    if collective == "barrier":
        return 0
    neighbors = COLLECTIVES[collective].neighbors if collective in COLLECTIVES else 0
    if neighbors:  # what a rank receives: a block from each neighbour
        return count * itemsize * neighbors
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
    """The message size the selection table and the model use (:meth:`mpicomm.plan.args.Args.message_bytes`).

    Whole vector for allreduce, bcast, reduce, scan; the block for gather and
    scatter; everything gathered for allgather; each rank's whole send for
    alltoall; the whole input for reduce_scatter; one neighbour's block for the neighbourhood collectives (their
    selection has no size: a rank's blocks may differ from its neighbours').
    """
    if collective == "barrier":
        return 0
    spec = COLLECTIVES[collective]
    return count * itemsize * (1 if spec.whole or spec.neighbors or collective in ("gather", "scatter") else p)


def layout(collective: str, size: int, p: int, itemsize: int = 8) -> tuple[int, int, int, int]:
    """(unit, send elements, receive elements, Size in bytes) for a requested *size* in bytes.

    The unit count is the size rounded down to whole elements, at least one
    (reduce_scatter: whole elements per rank).
    """
    spec = COLLECTIVES[collective]
    if collective == "barrier":
        return 0, 0, 0, 0
    unit = max(1, size // (itemsize * (p if spec.size_is_all else 1)))
    send = unit * (spec.degree(p) if spec.send_p else 1)
    recv = unit * (spec.degree(p) if spec.recv_p else 1)
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

_NCCL_TYPES = {"float64": "double", "float32": "float", "float16": "half", "int64": "int64", "int32": "int32"}
_MPI_TYPES = {"float64": "MPI_DOUBLE", "float32": "MPI_FLOAT", "float16": "MPIX_C_FLOAT16", "int64": "MPI_INT64_T",
              "int32": "MPI_INT32_T"}


def type_name(collective: str, dtype: Any) -> str:
    """nccl-tests' ``type`` column: ``double``, ``float``, ``half``, ``int64``, ``int32`` (``none`` for barrier)."""
    name = np.dtype(dtype).name
    return "none" if collective == "barrier" else _NCCL_TYPES.get(name, name)


def mpi_type_name(dtype: Any) -> str:
    """The MPI datatype OSU's ``# Datatype:`` line names (``MPI_DOUBLE`` for float64)."""
    name = np.dtype(dtype).name
    return _MPI_TYPES.get(name, name)


def redop_name(collective: str, op: str) -> str:
    """nccl-tests' ``redop`` column: the op of a reducing collective, ``none`` for the others."""
    return op if COLLECTIVES[collective].op else "none"


def root_of(collective: str) -> int:
    """nccl-tests' ``root`` column: 0 (the benchmark's root) for rooted collectives, -1 for the others."""
    return 0 if COLLECTIVES[collective].root else -1


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

