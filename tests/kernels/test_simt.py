"""kernels/simt.py: launch arithmetic, the array module, and choosing numba's CUDA simulator (too late is an error
naming the fix; without a GPU and without the simulator the kernels say how to run)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kernels import simt

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_blocks_cover_the_items():
    assert [simt.blocks(n, 32) for n in (0, 1, 32, 33, 64, 65)] == [1, 1, 1, 2, 2, 3]


def test_host_arrays_are_numpys():
    assert simt.xp_of(np.zeros(2)) is np


def test_the_simulator_runs_a_kernel(simt):
    """The fixture's choice holds: kernels launch (here in the simulator) and write their output."""
    from kernels import halo

    u = simt.asarray(np.arange(12.0).reshape(3, 4))
    buf = simt.zeros(2)
    halo.pack_simt(u, ((1, 2), (1, 3)), buf, threads=2)
    assert buf.tolist() == [5.0, 6.0]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX environment")
def test_choosing_the_simulator_too_late_or_not_at_all_is_explained():
    code = textwrap.dedent("""
        import os
        os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        from kernels import simt
        print("reason:", simt.reason())
        import numba.cuda
        try:
            simt.use_simulator()
        except RuntimeError as exc:
            print("late:", exc)
        try:
            simt.cuda()
        except RuntimeError as exc:
            print("cuda:", exc)
    """)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert ("reason: no CUDA device is visible and numba's CUDA simulator is off; set NUMBA_ENABLE_CUDASIM=1 "
            "(before numba.cuda is imported) or call kernels.simt.use_simulator()") in out
    assert "late: numba.cuda is already imported without the simulator; set NUMBA_ENABLE_CUDASIM=1 before" in out
    assert "cuda: the SIMT kernels cannot run here: no CUDA device is visible" in out
