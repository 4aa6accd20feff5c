"""Benchmarks, run under mpiexec: ``python -m mpicomm.bench <benchmark> [options]``.

    mpiexec -n 2 python -m mpicomm.bench pingpong --sizes 8:1M --out BENCHMARKS-pingpong.md
    mpiexec -n 2 python -m mpicomm.bench allreduce --sizes 8:64M --validate --json allreduce.json --plot allreduce.png

Every benchmark measures mpi4py's native call and mpicomm's **in the same
run, interleaved**: each size runs in rounds, and every round runs the native
call and then each mpicomm variant, so all of them see the same machine noise.

``pingpong``: ranks 0 and 1 bounce a message (``Send``/``Recv`` against
``send_array``/``recv_array``); one-way latency and the ratio.

A collective (allreduce, bcast, reduce, allgather, alltoall, reduce_scatter,
gather, scatter, scan, barrier): every registered algorithm of it, ``auto``
and the native call on ``MPI.COMM_WORLD``, with

* OSU's columns: ``Size``, ``Avg/Min/Max Latency(us)`` over ranks,
  ``Iterations`` (each iteration times one call, then an untimed barrier;
  1000 iterations up to 8 KiB, 100 above, one tenth more as warm-up);
* nccl-tests' ``algbw`` = S / t and ``busbw`` = algbw × factor (GB/s, 10⁹ B);
* the performance model's prediction (``mpicomm.model``), ``meas/model`` and
  ``vs native`` (Avg / native Avg); for ``auto`` the algorithm it chose;
* with ``--validate``, every algorithm's result compared with the native one.

Data are float64 values that depend on rank and index (integers, so every sum
is exact). Sizes are rounded down to whole float64 elements, at least one; for
reduce_scatter (``Reduce_scatter_block``) to whole elements per rank. The Size
column shows the bytes actually used: the whole vector for allreduce, bcast,
reduce, scan and reduce_scatter, one rank's block for allgather, alltoall
(the block sent to each peer), gather and scatter.

The package, by concept, each module importing only the ones before it:
:mod:`~mpicomm.bench.metrics` (sizes and the nccl-tests/OSU conventions, no
MPI), :mod:`~mpicomm.bench.measure` (the interleaved timing loops),
:mod:`~mpicomm.bench.report` (tables, Markdown, JSON, plots) and
:mod:`~mpicomm.bench.cli` (the command line, :func:`main`).
"""

from __future__ import annotations

from .cli import BENCHMARKS, Benchmark, benchmark, main
from .measure import _measure, _Variant, _validate, time_algorithms
from .metrics import (COLLECTIVES, Collective, bandwidths, bus_factor, layout, mismatch, model_bytes, nccl_bytes,
                      parse_sizes, rank_values)
from .report import Report, markdown_table

__all__ = [
    "BENCHMARKS", "Benchmark", "benchmark", "parse_sizes", "COLLECTIVES", "Collective", "nccl_bytes", "bus_factor",
    "bandwidths", "model_bytes", "layout", "rank_values", "mismatch", "markdown_table", "main", "Report",
    "time_algorithms",
]
