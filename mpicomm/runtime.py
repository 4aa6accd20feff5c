"""Ending the whole job when one rank fails, so the others never wait forever.

An uncaught exception on one rank would otherwise leave its peers blocked in
their next receive or collective until a batch system's time limit. Programs
started as ``python -m apps.<name>`` call :func:`main`, which turns an uncaught
exception (or a non-zero ``sys.exit``) into ``MPI_Abort`` on ``COMM_WORLD``
after printing the traceback with the rank that failed. ``python -m mpi4py
script.py`` does the same for scripts.

Ctrl-C gets the same treatment (:func:`handle_interrupts`, installed when
mpicomm first imports ``mpi4py.MPI``): SIGINT on any rank - hydra's
``mpiexec`` forwards one Ctrl-C to every rank - prints one line and aborts
the job with status 130, whether or not the script runs under ``python -m
mpi4py``. Python's own handler cannot do that: it only raises
``KeyboardInterrupt`` once the C call in progress returns, and a rank inside
``MPI_Waitall`` for a peer that will never answer never returns, so the job
hung. Here the signal also wakes a watcher thread (``signal.set_wakeup_fd``),
which aborts the job while the main thread is still blocked in MPI.

An aborting rank first unlinks the MPICH shared-memory segments it maps
(:func:`mpicomm.cleanup.remove_own_segments`): ``MPI_Abort`` skips
``MPI_Finalize``, which would have removed them from ``/dev/shm``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["main", "abort", "exit_together", "exit_agreed", "handle_interrupts"]

#: The exit status of a job ended by Ctrl-C (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130


def abort(code: int, reason: str, detail: str = "") -> None:
    """Print *detail* and *reason* with this rank's identity, then abort every rank of the job with *code*.

    The report goes out in one write, and the launcher gets a moment to forward
    it before ``MPI_Abort`` tears the job (and its output pipes) down. The
    MPICH segments this rank maps are unlinked first (``MPI_Abort`` would
    leave them in ``/dev/shm``). One thread of a rank aborts; a second caller
    waits for the end.
    """
    global _aborter
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    message = f"{detail}mpicomm: rank {rank} of {size} on {MPI.Get_processor_name()}: {reason}; aborting the job\n"
    if not _aborting.acquire(blocking=False):
        if _aborter == threading.get_ident():
            return  # a second Ctrl-C while this thread aborts: let the first abort go on
        while True:  # another thread of this rank is aborting (Ctrl-C seen by the handler and the watcher)
            time.sleep(1)
    _aborter = threading.get_ident()
    from .cleanup import remove_own_segments

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe must not stop the abort
            pass
    os.write(2, message.encode("utf-8", "replace"))
    remove_own_segments()
    time.sleep(0.5)
    MPI.COMM_WORLD.Abort(code)


_aborting = threading.Lock()
_aborter: int | None = None  #: the thread that is aborting the job


def handle_interrupts() -> bool:
    """Make SIGINT (Ctrl-C) on this rank abort the whole job, even while it is blocked inside MPI.

    Installed once per process, from the main thread, and only over Python's
    default handler: a program's own SIGINT handler is left alone (and one
    installed later takes over). With a single rank, or before ``MPI_Init``
    and after ``MPI_Finalize``, Ctrl-C raises ``KeyboardInterrupt`` as usual.
    Returns True when this call installed it.
    """
    global _installed
    if _installed is not None or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    _installed = os.getpid()
    signal.signal(signal.SIGINT, _on_sigint)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        previous = None
    if previous is None or previous != -1:  # another user of the wakeup fd (asyncio): give it back
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return True  # the handler alone still ends the job once the main thread runs Python again
    threading.Thread(target=_watch, args=(read_fd,), name="mpicomm-sigint", daemon=True).start()
    # A forked child (multiprocessing) shares the pipe but not the watcher: its own Ctrl-C must not end the job.
    os.register_at_fork(after_in_child=_forget_in_child)
    return True


def _forget_in_child() -> None:
    if signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # forked from another thread than the main one: nothing was set for it
        pass


_installed: int | None = None  #: the process that installed the handler (a forked child must not abort the job)


def _on_sigint(signum: int, frame: Any) -> None:
    """The Python-level SIGINT handler: abort the job (several ranks), else ``KeyboardInterrupt``."""
    _handled.append(signum)
    if os.getpid() != _installed or not _several_ranks():
        raise KeyboardInterrupt
    abort(INTERRUPTED, "interrupted (SIGINT)")


_handled: list[int] = []  #: signals the main thread's handler has run for (the watcher compares)


def _watch(read_fd: int) -> None:
    """Wait for signal numbers on the wakeup pipe; on SIGINT, abort the job if the main thread cannot.

    The main thread's handler runs as soon as it executes Python again (it
    wins if it can); the watcher gives it a moment, then aborts itself: the
    main thread is blocked in MPI and mpi4py has released the GIL.
    """
    while True:
        try:
            data = os.read(read_fd, 512)
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT in data:
            seen = len(_handled)
            time.sleep(0.1)
            if signal.getsignal(signal.SIGINT) is not _on_sigint or os.getpid() != _installed:
                continue
            if _several_ranks():
                abort(INTERRUPTED, "interrupted (SIGINT) while blocked in MPI")
            elif len(_handled) == seen:
                # The kernel gave the signal to another thread (this one, or one of the MPI library's): the main
                # thread sleeps on in a system call that nothing interrupted. Hand it to the main thread itself.
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def exit_together(code: int, message: str = "", wait: float = 10.0, alone: str | None = None) -> None:
    """Print *message* and exit with *code* once every rank has arrived here too (or after *wait* seconds).

    For errors every rank finds on its own (bad arguments, a grid too small for
    the rank grid): no rank's exit tears the job down before a slower rank has
    arrived. With *alone* (an error every rank finds alike, in the same words)
    rank 0 alone prints *message*, once all have arrived; a rank that waited in
    vain prints *alone* (the message naming its rank). A rank that never arrives costs at most
    *wait* seconds, never a hang.
    """
    from mpi4py import MPI

    several = MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1
    once = alone is not None
    if message and not (once and several):
        _say(message)
    if several:
        request = MPI.COMM_WORLD.Ibarrier()
        deadline = time.monotonic() + wait
        while not (done := request.Test()) and time.monotonic() < deadline:
            time.sleep(0.005)
        if message and once:
            if not done:
                _say(alone or message)
            elif MPI.COMM_WORLD.Get_rank() == 0:
                _say(message)
        if done:
            _agreed.append(code)  # every rank exits the same way: main() need not abort the job
    sys.exit(code)


def exit_agreed(code: int) -> None:
    """Exit with *code*, a status every rank has agreed on and exits with (:func:`mpicomm.cli.parse_or_exit`):
    :func:`main` lets the job end by itself instead of aborting it."""
    _agreed.append(code)
    sys.exit(code)


def _say(message: str) -> None:
    sys.stderr.write(message if message.endswith("\n") else message + "\n")
    sys.stderr.flush()


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
        code = INTERRUPTED if isinstance(exc, KeyboardInterrupt) else 1
        abort(code, f"uncaught {type(exc).__name__}", traceback.format_exc())


def _several_ranks() -> bool:
    from mpi4py import MPI

    return MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1
