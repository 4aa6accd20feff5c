"""Ctrl-C ends the whole job within seconds: SIGINT to ``mpiexec`` or to one rank, ranks blocked in MPI waits.

Before, the ranks waiting in ``MPI_Waitall`` for a peer never saw Python's
``KeyboardInterrupt`` (the handler runs only when the C call returns) and the
job hung until a time limit; now :func:`mpicomm.runtime.handle_interrupts`
aborts it, and the aborting ranks unlink their MPICH segments in /dev/shm.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests import mpirun

pytestmark = pytest.mark.launches

#: Rank 0 reports every rank's pid and the MPICH segments it maps (one JSON line: hydra may merge lines
#: written by different ranks), then rank 0 sleeps while the others wait for it in MPI.
PROGRAM = textwrap.dedent('''
    import json, os, sys, time
    import numpy as np
    import mpicomm

    comm = mpicomm.Comm()
    with open("/proc/self/maps") as maps:
        segments = sorted({line.split()[5] for line in maps if "/mpich_" in line and len(line.split()) > 5})
    everyone = comm.gather([os.getpid(), segments], root=0)
    if comm.rank == 0:
        print(json.dumps(everyone), flush=True)
        time.sleep(60)  # the peer the others wait for
    if sys.argv[1] == "allreduce":
        x = np.ones(10)
        comm.Allreduce(x.copy(), x)
    else:
        comm.recv_array(np.empty(10), source=0)
''')


#: Seconds an interrupted job may take to end (it takes about 0.6 s here; before, it never ended).
LIMIT = 10.0


def _interrupt(tmp_path, n: int, target: str, wait: str, runner: list[str]) -> tuple[float, int, str, set[str]]:
    """Start *n* ranks, send SIGINT to *target* ("mpiexec" or a rank number) once all are ready.

    Returns (seconds the job took to end after the signal, exit status, output, the job's segments).
    """
    script = tmp_path / "waits.py"
    script.write_text(PROGRAM)
    env = mpirun.job_env({"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1"}, timeout=60)
    proc = subprocess.Popen(mpirun.command(n, [sys.executable, *runner, str(script), wait]), cwd=mpirun.REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    try:
        while not lines or not lines[-1].startswith("[["):
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, "the job ended before every rank was ready:\n" + "".join(lines)
            lines.append(line)
        ready = json.loads(lines[-1])
        segments = {path for _, paths in ready for path in paths}
        time.sleep(1.0)  # every rank is inside its wait (or rank 0's sleep)
        os.kill(proc.pid if target == "mpiexec" else ready[int(target)][0], signal.SIGINT)
        start = time.monotonic()
        try:
            out, _ = proc.communicate(timeout=LIMIT + 20)
        except subprocess.TimeoutExpired:
            out = "(hung)"
        seconds = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the job this test started
            proc.communicate()
    return seconds, proc.returncode, "".join(lines) + out, segments


def _cleanup() -> str:
    result = subprocess.run([sys.executable, "-m", "mpicomm", "cleanup"], cwd=mpirun.REPO, env=mpirun.clean_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("n, target, wait, runner", [
    (2, "mpiexec", "allreduce", []),
    (3, "mpiexec", "recv", ["-m", "mpi4py"]),
    (2, "1", "allreduce", []),  # a rank blocked in MPI_Waitall
    (3, "2", "recv", ["-m", "mpi4py"]),
    (3, "0", "allreduce", []),  # the sleeping rank
], ids=["2-ranks-mpiexec", "3-ranks-mpiexec-mpi4py", "2-ranks-rank1-in-wait", "3-ranks-rank2-in-recv-mpi4py",
        "3-ranks-rank0-sleeping"])
def test_sigint_ends_the_whole_job_within_seconds(tmp_path, n, target, wait, runner):
    seconds, code, out, segments = _interrupt(tmp_path, n, target, wait, runner)
    assert seconds < LIMIT, f"the job took {seconds:.1f} s to end after SIGINT to {target} (hung):\n{out}"
    assert code != 0, out
    assert "interrupted (SIGINT)" in out and "aborting the job" in out, out
    assert "Segmentation fault" not in out and "signal 11" not in out, out
    if mpirun.flavor() == "hydra":
        assert segments, f"MPICH mapped no /dev/shm segment on one node?\n{out}"
    _cleanup()
    left = sorted(path for path in segments if os.path.exists(path))
    assert not left, f"the interrupted job's shared-memory segments remain after cleanup: {left}"


#: First lines of a single-rank script: Ctrl-C handled as in a program started from a terminal, whatever the test
#: inherited (a suite started in the background by a non-interactive shell has SIGINT ignored, and so would the script).
_INTERACTIVE = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"


def test_a_single_rank_still_gets_keyboard_interrupt(tmp_path):
    """One rank has no job to abort: Ctrl-C raises KeyboardInterrupt as in any Python program."""
    script = tmp_path / "alone.py"
    script.write_text(_INTERACTIVE + "import time, mpicomm\nmpicomm.Comm().Barrier()\n"
                      "try:\n    print('ready', flush=True)\n    time.sleep(60)\n"
                      "except KeyboardInterrupt:\n    print('caught', flush=True)\n")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=mpirun.REPO, env=mpirun.clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and "caught" in out and "aborting" not in out, out


def test_a_single_rank_gets_keyboard_interrupt_when_another_thread_takes_the_signal(tmp_path):
    """The kernel may hand SIGINT to any thread (mpicomm's watcher, the MPI library's): the main thread, asleep in
    a system call nothing interrupted, must still get KeyboardInterrupt (before: it slept on; seen in a loaded CI run)."""
    script = tmp_path / "elsewhere.py"
    script.write_text(_INTERACTIVE + textwrap.dedent("""\
        import signal, threading, time, mpicomm
        mpicomm.Comm().Barrier()
        watcher = next(t for t in threading.enumerate() if t.name == "mpicomm-sigint")
        def poke():
            time.sleep(0.3)  # the main thread is asleep by then
            signal.pthread_kill(watcher.ident, signal.SIGINT)
        threading.Thread(target=poke, daemon=True).start()
        try:
            print('ready', flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print('caught', flush=True)
        """))
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(script)], cwd=mpirun.REPO, env=mpirun.clean_env(),
                            capture_output=True, text=True, timeout=50)
    assert result.returncode == 0 and "caught" in result.stdout, result.stdout + result.stderr
    assert time.monotonic() - started < 30, "the main thread slept on after the signal"


def test_a_program_handler_is_left_alone():
    """A program that set its own SIGINT handler before mpicomm started MPI keeps it."""
    code = ("import signal\nmine = lambda *a: None\nsignal.signal(signal.SIGINT, mine)\n"
            "import mpicomm\nmpicomm.Comm()\nprint(signal.getsignal(signal.SIGINT) is mine)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=mpirun.REPO, env=mpirun.clean_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stdout + out.stderr
