"""The compiled executor's lane: a program's data steps as records, run in C with the GIL released.

A compiled plan (:mod:`mpicomm.plan.compile`) whose steps are only prepared
persistent requests, copies and reductions with MPI's built-in ops on the
common element types gets a :class:`Lane` beside its steps: the same steps as
plain records (per step: the request handles to start, the copies to make
when it is posted, the agreement words to check once its messages arrived,
the ops to run after that). The executor (:mod:`.executor`) hands such a
run's data steps to the lane, which starts, tests and waits for the requests
and runs the records in C with the GIL released, and takes them back for
anything else: a message longer than posted, an MPI error, or agreement words
that differ from this rank's (the disagreement path, rare, stays Python's).
Programs with other steps (device arrays, user-defined ops, node-shared
counters, nested levels, the agreement's own rounds beside large messages)
run in the executor's Python loop as before.

A record is ``(kind, op, dtype, a, b, out, count)`` of integers:

============  ==============================================================
``COPY``      ``count`` bytes from address ``a`` to ``out``
``COMBINE``   ``out[i] = a[i] op b[i]`` for ``count`` elements of ``dtype``
              (:data:`DTYPES`; ``op``: :data:`mpicomm.ops.BUILTIN` codes)
``CHECK``     the 32 agreement words at ``a`` (received) equal those at ``b``
              (this rank's) and carry a cross sum of 0; else hand back
``CHECK_TAKE``  the words at ``a`` equal those at ``b``; else hand back
============  ==============================================================

MPI is reached through the library mpi4py loaded (:func:`bind`: the addresses
of ``MPI_Startall``, ``MPI_Testall``, ``MPI_Waitall`` and ``MPI_Error_class``
and the size of its request handles and statuses), so one build serves
MPICH, Open MPI and the MPI-5 standard ABI, and the build needs no ``mpi.h``.
``MPICOMM_LANE=0`` runs every program in the Python loop (for comparison).
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import config

__all__ = ["Lane", "nap", "available", "why_not", "of", "with_record", "copy", "combine", "check", "dtype_code",
           "COPY", "COMBINE", "CHECK", "CHECK_TAKE", "DONE", "BAIL", "TRUNCATED", "ERROR"]

COPY, COMBINE, CHECK, CHECK_TAKE = 1, 3, 4, 5
#: What :meth:`Lane.advance` hands back (see its decoding in :func:`event`).
DONE, BAIL, TRUNCATED, ERROR = -1, 1, 2, 3

#: The element types the lane reduces, by (kind, itemsize): the codes of ``_lane.c``.
DTYPES = {("f", 4): 1, ("f", 8): 2, ("i", 1): 3, ("i", 2): 4, ("i", 4): 5, ("i", 8): 6, ("u", 1): 7, ("u", 2): 8,
          ("u", 4): 9, ("u", 8): 10, ("b", 1): 11, ("c", 8): 12, ("c", 16): 13}

Lane: Any = None
nap: Any = None  #: nap(runs, seconds, gap): the progress thread's wait in several runs' lanes (see _lane.c)
_native: Any = None
why_not = ""  #: why there is no lane here ("" when there is one)


def _library() -> ctypes.CDLL:
    """The MPI library mpi4py loaded (found among this process's mapped files)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libmpi" in line and "/" in line}
    for path in sorted(paths, key=lambda p: ("abi" in os.path.basename(p), p)):
        try:
            lib = ctypes.CDLL(path)
            lib.MPI_Startall  # noqa: B018 - the lookup is the check
            return lib
        except (OSError, AttributeError):
            continue
    raise OSError(f"no MPI library with MPI_Startall among this process's mapped files ({sorted(paths)})")


def _address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0


def _bind() -> None:
    global Lane, nap, _native, why_not
    try:
        on = config.lane()
    except ValueError:  # (refused with the other settings when a Comm is made)
        on = True
    if not on:
        why_not = "MPICOMM_LANE=0"
        return
    if not sys.platform.startswith("linux"):
        why_not = "the lane finds the MPI library through /proc (Linux)"
        return
    try:
        from . import _lane  # type: ignore[attr-defined]
    except ImportError as exc:
        why_not = f"the compiled lane is not built ({exc}): pip install -e . builds it"
        return
    try:
        lib = _library()
        _lane.bind(_address(lib, "MPI_Startall"), _address(lib, "MPI_Testall"), _address(lib, "MPI_Waitall"),
                   _address(lib, "MPI_Error_class"), MPI._sizeof(MPI.Status), MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS)
    except (OSError, ValueError) as exc:
        why_not = f"the MPI library's functions were not found: {exc}"
        return
    _native, Lane, nap = _lane, _lane.Lane, _lane.nap


_bind()
_HANDLE = MPI._sizeof(MPI.Request)
_MASK = (1 << (8 * _HANDLE)) - 1


def available() -> bool:
    """Whether programs run their data steps in the compiled lane here."""
    return Lane is not None


def dtype_code(dtype: Any) -> int | None:
    """The lane's code of a NumPy element type (None: the lane does not reduce it)."""
    dt = np.dtype(dtype)
    if not dt.isnative:
        return None
    return DTYPES.get((dt.kind, dt.itemsize))


def _addr(x: np.ndarray) -> int:
    return x.__array_interface__["data"][0] if x.size else 0


def copy(dst: Any, src: Any) -> tuple | None:
    """The record of ``np.copyto(dst, src)`` between host arrays of one element type (None otherwise)."""
    if type(dst) is not np.ndarray or type(src) is not np.ndarray or dst.dtype != src.dtype or dst.size != src.size:
        return None
    if not (dst.flags.c_contiguous and src.flags.c_contiguous):
        return None
    return (COPY, 0, 0, _addr(src), 0, _addr(dst), dst.nbytes)


def combine(code: int, a: Any, b: Any, out: Any) -> tuple | None:
    """The record of a built-in op (*code*: :data:`mpicomm.ops.BUILTIN`'s) on host arrays (None when the lane
    does not compute it: the executor's Python loop runs that program)."""
    arrays = (a, b, out)
    if any(type(x) is not np.ndarray or not x.flags.c_contiguous for x in arrays):
        return None
    if not (a.dtype == b.dtype == out.dtype and a.size == b.size == out.size):
        return None
    dt = dtype_code(out.dtype)
    if dt is None or _native is None or not _native.supported(code, dt):
        return None
    return (COMBINE, code, dt, _addr(a), _addr(b), _addr(out), out.size)


def check(got: np.ndarray, words: np.ndarray, kind: str) -> tuple:
    """The record that checks received agreement words against this rank's (*kind*: the butterfly's)."""
    return (CHECK_TAKE if kind == "recv" else CHECK, 0, 0, _addr(got), _addr(words), 0, 0)


def of(program: Any) -> Any:
    """The lane of *program* (a :class:`~mpicomm.engine.executor.Program`), or None when one of its steps is
    not records only (see the module docstring)."""
    if Lane is None or program.gated or program.base is not None:
        return None
    agree = []
    for round_ in program.agree or ():
        rec = getattr(round_.combine, "record", None)
        if rec is None:
            return None
        agree.append((_handles(round_.reqs), len(round_.reqs), [rec] if rec else []))
    steps = []
    for step in program.steps:
        if step.post is not None or step.syncs or step.nested:
            return None
        records = []
        for fns in (step.pre, step.words, step.ops):
            recs = []
            for fn in fns:
                rec = getattr(fn, "record", None)
                if rec is None:
                    return None
                if type(rec) is list:
                    recs.extend(rec)
                elif rec:
                    recs.append(rec)
            records.append(recs)
        reqs = step.reqs or []
        steps.append((_handles(reqs), len(reqs), records[0], records[1], records[2], step.early))
    return Lane(steps, agree, program.buffers)


def _handles(reqs: list[Any]) -> bytes:
    """The MPI handles of *reqs* (mpi4py requests), as the library lays out an array of them."""
    return b"".join((MPI._handleof(r) & _MASK).to_bytes(_HANDLE, sys.byteorder) for r in reqs)


def with_record(fn: Any, record: tuple | list[tuple] | None) -> Any:
    """*fn* (a step's callable) marked with the record(s) that do the same in the lane (None: it has none)."""
    if record is not None:
        fn.record = record
    return fn
