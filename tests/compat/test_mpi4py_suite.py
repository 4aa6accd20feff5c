"""mpi4py's own test suite through mpicomm.Comm at 2 ranks, and at 1 and 3 in the slower tier (see mpi4py_suite.py).

The suite comes from the installed mpi4py's source release, which
``python -m tests.compat.fetch`` puts in ``.cache/`` (``.ci/run`` does, before the
tests); without it these tests are skipped with that command as the reason.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests import mpirun
from tests.compat import mpi4py_suite

pytestmark = pytest.mark.launches


def _source() -> str:
    where = mpi4py_suite.source_dir()
    if not os.path.isdir(where):
        pytest.skip("mpi4py's test suite is not fetched: python -m tests.compat.fetch")
    return where


#: At 3 ranks (more than these machines' cores) the nonblocking and persistent forms of the buffer and vector
#: collectives - the same schedules as the blocking ones, which run in every pass - and the neighbourhood modules
#: (run at 1 and 2 ranks, and mpicomm's own neighbourhood tests cover 3) are the slower tier.
SLOWER_AT_3 = ("test_cco_nb_buf", "test_cco_pr_buf", "test_cco_nb_vec", "test_cco_pr_vec", "test_cco_ngh_buf",
               "test_cco_pr_ngh_buf")


#: At 2 ranks, the persistent neighbourhood module (the blocking one's schedules, which run in every pass).
SLOWER_AT_2 = ("test_cco_pr_ngh_buf",)


# Every pass runs the suite at 2 ranks: every module but one, each case on COMM_SELF as well as on COMM_WORLD. The
# runs at 1 rank (30 s: COMM_SELF again) and at 3 (80 s: the schedules at 3 ranks run in mpicomm's own 3-rank pass)
# are the slower tier.
@pytest.mark.parametrize("ranks,modules", [
    pytest.param(1, mpi4py_suite.MODULES, marks=pytest.mark.slow),
    (2, tuple(m for m in mpi4py_suite.MODULES if m not in SLOWER_AT_2)),
    pytest.param(3, tuple(m for m in mpi4py_suite.MODULES if m not in SLOWER_AT_3), marks=pytest.mark.slow),
    pytest.param(2, SLOWER_AT_2, marks=pytest.mark.slow),
    pytest.param(3, SLOWER_AT_3, marks=pytest.mark.slow),
], ids=["1", "2", "3", "2-persistent-neighbourhood", "3-nonblocking-persistent"])
@pytest.mark.timeout(960)  # (the run itself is limited to 900 s; the default 300 s would end it early on a busy machine)
def test_mpi4py_suite_passes_through_mpicomm(ranks, modules):
    _source()
    env = {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1"} if ranks > (os.cpu_count() or 1) else {}
    argv = [sys.executable, "-m", "tests.compat.mpi4py_suite"]
    if modules != mpi4py_suite.MODULES:
        argv += list(modules)
    result = mpirun.run(ranks, argv, timeout=900, env=env)
    assert not result.timed_out, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0 and "mpi4py suite: ok" in result.stdout, result.stdout[-6000:] + result.stderr[-3000:]
    for module in modules:  # every module ran, with its tests
        assert f"  {module} " in result.stdout


def test_the_run_fails_on_an_unlisted_failure_and_on_a_listed_test_that_passes(tmp_path):
    """A failure not in the list fails the run, and so does a listed test that passes: the list stays true."""
    where = _source()
    (tmp_path / "test").mkdir()
    for name in ("arrayimpl.py", "mpiunittest.py", "mpitestutil.py", "dlpackimpl.py"):
        (tmp_path / "test" / name).write_text(open(os.path.join(where, name)).read())
    (tmp_path / "test" / "test_comm_topo.py").write_text(
        "import mpiunittest as unittest\nfrom mpi4py import MPI\n\n"
        "class TestTopoWorld(unittest.TestCase):\n    COMM = MPI.COMM_WORLD\n\n"
        "    def testCartcomm(self):\n        self.assertEqual(self.COMM.Get_size(), MPI.COMM_WORLD.Get_size())\n\n"
        "    def testOther(self):\n        self.assertEqual(type(self.COMM).__name__, 'Comm')  # rewired to mpicomm's\n\n"
        "    def testBroken(self):\n        self.assertEqual(1, 2)\n"
    )
    result = mpirun.run(1, [sys.executable, "-m", "tests.compat.mpi4py_suite", "--source", str(tmp_path / "test"),
                            "test_comm_topo"], timeout=120)
    assert result.returncode != 0
    assert "PASSES (listed in DIFFERENCES, remove it): test_comm_topo.*.test*comm*" in result.stdout, result.stdout
    assert "FAILED (not in DIFFERENCES): test_comm_topo.TestTopoWorld.testBroken" in result.stdout
    assert "testOther" not in result.stdout  # it passed: COMM is an mpicomm.Comm
