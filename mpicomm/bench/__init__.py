"""Benchmarks, run under mpiexec: ``python -m mpicomm.bench <benchmark> [options]``.

    mpiexec -n 2 python -m mpicomm.bench pingpong --sizes 8:1M --out BENCHMARKS-pingpong.md
    mpiexec -n 2 python -m mpicomm.bench allreduce --sizes 8:64M --validate --json allreduce.json --plot allreduce.png
    mpiexec -n 4 python -m mpicomm.bench allreduce --inplace --format osu > osu_allreduce.txt

Every benchmark measures mpi4py's native call and mpicomm's **in the same
run, interleaved**: a measurement of a size times ``--iters`` calls of every
variant, the variants taking turns in 5 rounds (native, then each mpicomm
variant, ``iters / 5`` calls each), so all of them see the same machine
noise; a rank's time is its mean per call, OSU's Avg (``--repeat N`` runs the
measurement N times and reports the median). The counts are OSU
micro-benchmarks' defaults (:mod:`~mpicomm.bench.metrics`): the collectives
time 1,000 calls per variant up to 8 KiB and 100 above, after 100 and 10
untimed warm-up calls (``--warmup N``; never more than ``--iters``); the
ping-pong times osu_latency's 10,000 and 1,000 round trips after 100 and 10,
and osu_bw's 100 and 20 windows after 10 and 2.

``pingpong``: ranks 0 and 1, as ``osu_latency`` (one-way latency; Min and Max
of single round trips) and ``osu_bw`` (windows of ``--window`` non-blocking
sends, 64 by default, then an acknowledgement; MB/s), each for
``Send``/``Recv`` against ``send_array``/``recv_array``.

A collective (allreduce, bcast, reduce, allgather, alltoall, reduce_scatter,
gather, scatter, scan, barrier): every registered algorithm of it, ``auto``
and the native call on ``MPI.COMM_WORLD``, with

* OSU's columns: ``Size``, ``Avg/Min/Max Latency`` over ranks,
  ``Iterations`` (each iteration times one call, then an untimed barrier);
* nccl-tests' ``count``, ``type``, ``redop``, ``root``, ``algbw`` = S / t and
  ``busbw`` = algbw × factor (GB/s, 10⁹ B), ``#wrong``; with ``--inplace`` its
  in-place pass (every variant again with ``MPI.IN_PLACE``, same rounds);
* the performance model's prediction (``mpicomm.model``), ``meas/model`` and
  ``vs native`` (Avg / native Avg); for ``auto`` the algorithm it chose;
* with ``--validate``, every algorithm's result compared with the native one.

``--format osu`` prints OSU's text layout instead of the Markdown table (one
table per variant, :mod:`~mpicomm.bench.osu`); ``--backend cupy`` puts the
buffers in GPU memory (:mod:`~mpicomm.bench.backend`).

Data are values that depend on rank and index (integers, so every reduction
is exact, :func:`~mpicomm.bench.metrics.rank_values`). Sizes are rounded down
to whole elements, at least one; for reduce_scatter (``Reduce_scatter_block``)
to whole elements per rank. The Size column shows the bytes actually used: the
whole vector for allreduce, bcast, reduce, scan and reduce_scatter, one rank's
block for allgather, alltoall (the block sent to each peer), gather and
scatter.

The package, by concept, each module importing only the ones before it:
:mod:`~mpicomm.bench.metrics` (sizes, iteration counts and the
nccl-tests/OSU conventions, no MPI), :mod:`~mpicomm.bench.backend` (NumPy or
CuPy buffers), :mod:`~mpicomm.bench.measure` (the interleaved timing loops),
:mod:`~mpicomm.bench.osu` (OSU's text), :mod:`~mpicomm.bench.plot`
(``--plot``), :mod:`~mpicomm.bench.report` (tables, Markdown, JSON) and
:mod:`~mpicomm.bench.cli` (the command line, :func:`main`);
:mod:`~mpicomm.bench.summary` reads the JSON files back.
"""

from __future__ import annotations

from .cli import BENCHMARKS, Benchmark, benchmark, main
from .measure import _validate as _validate  # (the tests check the verdicts through the package)
from .measure import _Variant as _Variant
from .measure import auto_choice, time_algorithms
from .metrics import (
                      COLLECTIVES,
                      MeasuredCollective,
                      bandwidths,
                      bus_factor,
                      latency_iterations,
                      layout,
                      mismatch,
                      model_bytes,
                      nccl_bytes,
                      parse_sizes,
                      rank_values,
                      warmup_iterations,
)
from .report import Report, markdown_table

__all__ = [
    "BENCHMARKS", "Benchmark", "benchmark", "parse_sizes", "COLLECTIVES", "MeasuredCollective", "nccl_bytes",
    "bus_factor", "bandwidths", "model_bytes", "layout", "rank_values", "mismatch", "markdown_table", "main", "Report",
    "time_algorithms", "warmup_iterations", "latency_iterations", "auto_choice",
]
