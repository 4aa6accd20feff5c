"""pytest hooks that make multi-rank test runs safe and readable.

Imported by ``tests/conftest.py`` (and by the harness's own self-test).

* **Fence after every test.** Ranks exchange pass/fail, and which test they
  ran, after each test's teardown (ranks on different tests - a collection
  that differs by rank - abort the job with both names). A rank whose test
  failed waits at most ``MPICOMM_TEST_FENCE_TIMEOUT`` seconds (default 60) for the others; if they
  do not arrive (they are stuck in a collective the failed rank left), it
  prints why and calls ``MPI_Abort`` - no hang. If they arrive, a test that
  failed anywhere is reported failed everywhere, with every failing rank's
  traceback in rank 0's report.
* **One voice.** Under ``mpiexec -n N`` (N > 1) only rank 0 prints the pytest
  report; ranks > 0 write theirs (timeout stack dumps included) to
  ``$MPICOMM_TEST_LOG_DIR/rank<r>.log`` (default: ``<tmp>/mpicomm-test-logs``),
  which ``python -m tests`` prints when a run fails. ``MPICOMM_TEST_ALL_RANKS=1``
  keeps every rank on the terminal.
* **A record for the summary.** Every rank writes the test it is running to
  ``$MPICOMM_TEST_LOG_DIR/running-rank<r>`` and appends each failed test's id to
  ``failed-rank<r>``; ``python -m tests`` names them in its closing summary, so
  the last lines of a run say which tests failed, or where an aborted or timed-out
  job stood, however long the output before them.
* **Launching tests run once.** Tests marked ``launches`` start their own MPI
  job; they are deselected inside a multi-rank run (the serial pass runs them;
  where a run selects nothing else, they are skipped with that reason). So are
  tests marked ``serial``: pure computations (no MPI) whose result cannot
  depend on the rank count, which every rank would only repeat.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import pytest

__all__ = ["pytest_configure", "pytest_collection_modifyitems", "pytest_runtest_logstart",
           "pytest_runtest_makereport", "log_dir", "record_path"]

_FAILED = pytest.StashKey[list]()
#: The longest sleep between two polls of the fence (seconds): some 2000 cheap wake-ups a second while waiting.
_FENCE_POLL = 5e-4


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _several() -> bool:
    return _world().Get_size() > 1


class _Fence:
    def __init__(self) -> None:
        from mpi4py import MPI

        self.comm = MPI.COMM_WORLD.Dup()
        self.failed_timeout = float(os.environ.get("MPICOMM_TEST_FENCE_TIMEOUT", "60"))

    def exchange(self, nodeid: str, failure: str | None) -> list[str | None]:
        """Every rank's failure text (None where it passed) for test *nodeid*."""
        import zlib

        import numpy as np

        mine = np.array([failure is not None, zlib.crc32(nodeid.encode())], np.int64)
        everyone = np.zeros((self.comm.Get_size(), 2), np.int64)
        request = self.comm.Iallgather(mine, everyone)
        deadline = time.monotonic() + self.failed_timeout if failure is not None else None
        # Polled with short sleeps, not Wait (a busy wait would take the core from a rank still in the test when
        # ranks outnumber cores) and not sleeps growing to 10 ms: the fence runs after every test (and every
        # skipped one), so a late wake-up there cost 20-30 ms a test, a third of a 3-rank pass on 2 cores.
        pause = 1e-4
        while not request.Test():
            if deadline is not None and time.monotonic() > deadline:
                rank = self.comm.Get_rank()
                _abort(
                    f"\nmpicomm test harness: {nodeid} failed on rank {rank}, and the other ranks did not finish "
                    f"it within {self.failed_timeout:.0f} s (they are probably waiting for this rank inside the "
                    f"test); aborting the job.\n--- failure on rank {rank} ---\n{failure}\n"
                )
            time.sleep(pause)
            pause = min(pause * 2, _FENCE_POLL)
        if len(set(everyone[:, 1].tolist())) > 1:
            names = self.comm.allgather(nodeid)
            listing = "\n".join(f"  rank {r}: {n}" for r, n in enumerate(names))
            _abort(
                f"\nmpicomm test harness: ranks ran different tests (collection differs by rank; "
                f"is a plugin reordering tests per process?):\n{listing}\naborting the job.\n"
                if self.comm.Get_rank() == 0 else ""
            )
        if not everyone[:, 0].any():
            return [None] * len(everyone)
        return self.comm.allgather(failure)


def _abort(message: str) -> None:
    """Write *message* in one piece, give the launcher a moment to forward it, and abort the job."""
    from mpi4py import MPI

    sys.stdout.flush()
    sys.stderr.flush()
    if message:
        os.write(2, message.encode("utf-8", "replace"))
    time.sleep(0.5)
    MPI.COMM_WORLD.Abort(1)


_fence: list[_Fence] = []


def log_dir() -> str:
    """Where ranks > 0 write their pytest reports."""
    return os.environ.get("MPICOMM_TEST_LOG_DIR") or os.path.join(tempfile.gettempdir(), "mpicomm-test-logs")


def _rank() -> int:
    """This process's rank without starting MPI where pytest-mpi has not (the serial pass): 0 there."""
    return _world().Get_rank() if "mpi4py.MPI" in sys.modules else 0


def record_path(kind: str, rank: int) -> str:
    """The summary record *kind* (``running`` or ``failed``) of *rank*."""
    return os.path.join(log_dir(), f"{kind}-rank{rank}")


def _record(kind: str, nodeid: str, mode: str) -> None:
    if not os.environ.get("MPICOMM_TEST_LOG_DIR"):
        return  # only under python -m tests, which reads and clears them
    try:
        with open(record_path(kind, _rank()), mode) as f:
            f.write(nodeid + "\n")
    except OSError:
        pass


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _record("running", nodeid, "w")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "launches: starts its own MPI job; runs only outside multi-rank runs")
    config.addinivalue_line("markers", "serial: no MPI, the same at any rank count; runs only outside multi-rank runs")
    if not (config.getoption("--with-mpi", False) or config.getoption("--only-mpi", False)):
        return
    if not _several():
        return
    _fence.append(_Fence())
    rank = _world().Get_rank()
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or os.environ.get("MPICOMM_TEST_ALL_RANKS") == "1":
        return
    if rank == 0:
        reporter.write_line(f"mpicomm: ranks 1..{_world().Get_size() - 1} report to {log_dir()}/rank<r>.log")
        return
    os.makedirs(log_dir(), exist_ok=True)
    log = open(os.path.join(log_dir(), f"rank{rank}.log"), "w", buffering=1)  # noqa: SIM115 - lives with the session
    config.pluginmanager.unregister(reporter)
    config.pluginmanager.register(pytest.TerminalReporter(config, log), "terminalreporter")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("MPICOMM_SLOW_TESTS") != "1":
        slow = pytest.mark.skip(reason="slower tier: run with MPICOMM_SLOW_TESTS=1 (python -m tests --slow)")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(slow)
    if not _fence:
        return
    elsewhere = {item.nodeid for item in items if "launches" in item.keywords or "serial" in item.keywords}
    if elsewhere and len(elsewhere) < len(items):
        # Deselected rather than skipped: a skipped test still takes its turn through the fence (some 5 ms at 3
        # ranks on 2 cores), and half the suite runs in the serial pass only. (Where nothing else is selected they
        # are skipped, saying why, below: a pass that selected no test would fail.)
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in elsewhere])
        items[:] = [item for item in items if item.nodeid not in elsewhere]
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"mpicomm: {len(elsewhere)} tests deselected: they run in the serial pass (marked "
                                f"launches: they start their own MPI job; or serial: no MPI in them)")
        return
    skip = pytest.mark.skip(reason="starts its own MPI job: runs in the serial pass, not inside an N-rank run")
    alone = pytest.mark.skip(reason="no MPI in it: runs in the serial pass, not repeated by every rank")
    for item in items:
        if "launches" in item.keywords:
            item.add_marker(skip)
        elif "serial" in item.keywords:
            item.add_marker(alone)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not _fence:
        if report.failed:
            _record("failed", item.nodeid, "a")
        return
    failures = item.stash.setdefault(_FAILED, [])
    if report.failed:
        failures.append(f"[{report.when}] {report.longreprtext}")
    if call.when != "teardown":
        return
    if failures:
        _record("failed", item.nodeid, "a")  # before the fence, which may abort the job
    texts = _fence[0].exchange(item.nodeid, "\n".join(failures) if failures else None)
    rank = _world().Get_rank()
    others = [(r, t) for r, t in enumerate(texts) if t is not None and r != rank]
    if not others:
        return
    if not failures:
        _record("failed", item.nodeid, "a")
    names = ", ".join(str(r) for r, _ in others)
    if rank == 0:
        detail = "\n".join(f"--- rank {r} ---\n{t}" for r, t in others)
        text = f"failed on rank(s) {names}:\n{detail}"
    else:
        text = f"failed on rank(s) {names} (see rank 0's report)"
    report.outcome = "failed"
    report.longrepr = text
