"""mpicomm.device: GPU binding (local_rank % visible GPUs, overridable)."""

from __future__ import annotations

import threading

import pytest

from mpicomm.device import binding, device_for, visible_devices

from .conftest import cupy_or_skip


@pytest.mark.parametrize(
    "local_rank, ndevices, expected",
    [(0, 4, 0), (3, 4, 3), (5, 4, 1), (7, 2, 1), (2, 1, 0), (0, 0, None), (3, 0, None)],
)
def test_local_rank_modulo_visible_devices(local_rank, ndevices, expected, monkeypatch):
    monkeypatch.delenv("MPICOMM_DEVICE", raising=False)
    assert device_for(local_rank, ndevices) == expected


def test_override_argument_and_environment(monkeypatch):
    monkeypatch.delenv("MPICOMM_DEVICE", raising=False)
    assert device_for(3, 4, override=1) == 1
    monkeypatch.setenv("MPICOMM_DEVICE", "2")
    assert device_for(3, 4) == 2
    assert device_for(3, 4, override=0) == 0  # the argument wins


@pytest.mark.parametrize("value", ["-1", "gpu0", "1.5"])
def test_bad_environment_override_is_named(value, monkeypatch):
    monkeypatch.setenv("MPICOMM_DEVICE", value)
    with pytest.raises(ValueError, match="MPICOMM_DEVICE"):
        device_for(0, 2)


def test_override_must_be_visible(monkeypatch):
    monkeypatch.delenv("MPICOMM_DEVICE", raising=False)
    with pytest.raises(ValueError, match="sees 2"):
        device_for(0, 2, override=5)


def test_negative_local_rank():
    with pytest.raises(ValueError, match="local_rank=-1"):
        device_for(-1, 2)


def test_visible_devices_counts_cupy_devices():
    from mpicomm.device import cupy_module

    cupy = cupy_module()
    if cupy is None:
        assert visible_devices() == 0
    else:
        try:
            expected = cupy.cuda.runtime.getDeviceCount()
        except Exception:  # noqa: BLE001 - CuPy without a driver
            expected = 0
        assert visible_devices() == expected


@pytest.mark.mpi
def test_comm_device_follows_local_rank(comm, monkeypatch):
    monkeypatch.delenv("MPICOMM_DEVICE", raising=False)
    n = visible_devices()
    assert comm.device == (None if n == 0 else comm.local_rank % n)


@pytest.mark.mpi
def test_bind_makes_the_device_current(comm, monkeypatch):
    cupy = cupy_or_skip()
    monkeypatch.delenv("MPICOMM_DEVICE", raising=False)
    ordinal = comm.bind_device()
    assert ordinal == comm.device
    assert cupy.cuda.Device().id == ordinal


@pytest.mark.serial
def test_one_binding_per_device():
    """A binding is made once per device (its stream with it, on first use); host memory has none."""
    assert binding(None) is None
    assert binding(1) is binding(1)
    assert binding(1).ordinal == 1
    assert binding(0) is not binding(1)


@pytest.mark.mpi
@pytest.mark.gpu
def test_a_binding_makes_its_device_and_stream_current_on_any_thread(comm):
    cupy = cupy_or_skip()
    bound = binding(comm.bind_device())
    seen = []

    def elsewhere():
        with bound:
            seen.append((cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr))
            with bound:  # re-entrant
                seen.append((cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr))
        seen.append(cupy.cuda.get_current_stream(bound.ordinal).ptr)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen[0] == seen[1] == (bound.ordinal, bound.stream.ptr)
    assert seen[2] != bound.stream.ptr  # restored on leaving
    assert bound.stream.is_non_blocking
