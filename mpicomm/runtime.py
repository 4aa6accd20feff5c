"""Ending the whole job when one rank fails, so the others never wait forever.

An uncaught exception on one rank would otherwise leave its peers blocked in
their next receive or collective until a batch system's time limit. Programs
started as ``python -m apps.<name>`` call :func:`main`, which turns an uncaught
exception (or a non-zero ``sys.exit``) into ``MPI_Abort`` on ``COMM_WORLD``
after printing the traceback with the rank that failed. ``python -m mpi4py
script.py`` does the same for scripts.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any, Callable

__all__ = ["main", "abort", "exit_together"]


def abort(code: int, reason: str, detail: str = "") -> None:
    """Print *detail* and *reason* with this rank's identity, then abort every rank of the job with *code*.

    The report goes out in one write, and the launcher gets a moment to forward
    it before ``MPI_Abort`` tears the job (and its output pipes) down.
    """
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    message = f"{detail}mpicomm: rank {rank} of {size} on {MPI.Get_processor_name()}: {reason}; aborting the job\n"
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(2, message.encode("utf-8", "replace"))
    time.sleep(0.5)
    MPI.COMM_WORLD.Abort(code)


def exit_together(code: int, message: str = "", wait: float = 10.0) -> None:
    """Print *message* and exit with *code* once every rank has arrived here too (or after *wait* seconds).

    For errors every rank finds on its own (bad arguments, a grid too small for
    the rank grid): each rank says it, and no rank's exit tears the job down
    before a slower rank has said it too. A rank that never arrives costs at
    most *wait* seconds, never a hang.
    """
    if message:
        sys.stderr.write(message if message.endswith("\n") else message + "\n")
        sys.stderr.flush()
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        request = MPI.COMM_WORLD.Ibarrier()
        deadline = time.monotonic() + wait
        while not (done := request.Test()) and time.monotonic() < deadline:
            time.sleep(0.005)
        if done:
            _agreed.append(code)  # every rank exits the same way: main() need not abort the job
    sys.exit(code)


_agreed: list[int] = []


def main(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)``; if it raises or exits non-zero on any rank, abort the whole job.

    A single-rank run exits normally with the traceback (nothing to abort).
    """
    try:
        return fn(*args, **kwargs)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code and _several_ranks() and code not in _agreed:
            detail = "" if isinstance(exc.code, int) or exc.code is None else f"{exc.code}\n"
            abort(code, f"exit status {code}", detail)
        raise
    except BaseException as exc:  # noqa: BLE001 - reported, then the job ends
        if not _several_ranks():
            raise
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        abort(code, f"uncaught {type(exc).__name__}", traceback.format_exc())


def _several_ranks() -> bool:
    from mpi4py import MPI

    return MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1
