"""kernels/simt.py: launch arithmetic, the array module, and choosing numba's CUDA simulator (too late is an error
naming the fix; without a GPU and without the simulator the kernels say how to run)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from kernels import simt

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


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


def test_choosing_the_simulator_too_late_or_not_at_all_is_explained(monkeypatch):
    from mpicomm import device

    monkeypatch.delenv(simt.SIMULATOR_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "numba.cuda", raising=False)
    monkeypatch.setattr(device, "visible_devices", lambda: 0)  # as on a machine without a GPU
    assert simt.reason() == ("no CUDA device is visible and numba's CUDA simulator is off; set NUMBA_ENABLE_CUDASIM=1 "
                             "(before numba.cuda is imported) or call kernels.simt.use_simulator() to run the kernels "
                             "on the CPU")
    with pytest.raises(RuntimeError, match="the SIMT kernels cannot run here: no CUDA device is visible"):
        simt.cuda()
    # numba.cuda imported for real GPUs (its jit from numba.cuda.decorators): too late to choose the simulator
    real = types.ModuleType("numba.cuda")
    real.jit = types.SimpleNamespace(__module__="numba.cuda.decorators")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "numba.cuda", real)
    assert not simt.simulated()
    with pytest.raises(RuntimeError, match="numba.cuda is already imported without the simulator; set "
                                           "NUMBA_ENABLE_CUDASIM=1 before the first import of numba.cuda"):
        simt.use_simulator()
