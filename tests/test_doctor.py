"""mpicomm.doctor, what ``python -m mpicomm info`` reports beyond MPI: optional packages found without importing
them, the MPICOMM_* variables set, stale MPICH segments (``info`` itself: tests/test_main.py)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from mpicomm import cleanup, doctor

pytestmark = pytest.mark.serial


def test_every_optional_package_is_found_as_importlib_finds_it():
    found = dict((package.name, version) for package, version in doctor.packages())
    assert list(found) == ["torch", "numba", "cupy", "matplotlib", "scikit-learn"]
    for package in doctor.OPTIONAL:
        assert (found[package.name] is not None) == (importlib.util.find_spec(package.module) is not None), package


def test_a_package_that_is_not_there_is_missing_with_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)  # not importable, and no distribution of this name
    absent = doctor.Optional("numba", ("no-such-distribution-mpicomm-test",), "compiled", "the compiled CPU kernels")
    assert doctor._version(absent) is None
    line = doctor.report([(absent, None)], {}, [])[1]
    assert line.split()[:2] == ["no-such-distribution-mpicomm-test", "-"]
    assert line.endswith("the compiled CPU kernels - missing: pip install -e '.[compiled]'")


def test_settings_are_the_mpicomm_variables_set():
    env = {"MPICOMM_TIMEOUT": "60", "PATH": "/bin", "MPICOMM_TRACE": "t.json", "MPICOMM": "x"}
    assert doctor.settings(env) == {"MPICOMM_TIMEOUT": "60", "MPICOMM_TRACE": "t.json"}
    assert doctor.report([], doctor.settings(env), [])[1] == "settings       MPICOMM_TIMEOUT=60, MPICOMM_TRACE=t.json"
    assert doctor.report([], {}, [])[1] == "settings       no MPICOMM_* variable set (the defaults)"


def test_stale_segments_are_counted_with_the_fix(tmp_path):
    for i, size in enumerate((3 << 20, 1 << 20)):
        (tmp_path / f"mpich_shm_test{i}").write_bytes(b"\0" * size)
    (tmp_path / "other").write_bytes(b"kept")
    stale = doctor.stale_segments(str(tmp_path))
    assert [os.path.basename(s.path) for s in stale] == ["mpich_shm_test0", "mpich_shm_test1"]
    assert [s.path for s in stale] == [s.path for s in cleanup.stale(str(tmp_path))]
    line = doctor.report([], {}, stale, str(tmp_path))[-1]
    assert line == (f"shared memory  2 stale MPICH segment(s) in {tmp_path}, 4.0 MiB, left by jobs that did not end "
                    f"cleanly: python -m mpicomm cleanup")
    assert doctor.report([], {}, [], str(tmp_path))[-1] == f"shared memory  no stale MPICH segments in {tmp_path}"
    assert "cannot tell" in doctor.report([], {}, None)[-1]
