"""DLPack exporters taken the way mpi4py takes them: writable unless flagged read-only, and kept alive.

Two legacy exporters (``__dlpack__(self, stream=None)``, no ``max_version``: mpi4py's own test
exporters and many libraries still look like this):

* :class:`LegacyWrap` hands out a NumPy array's own legacy capsule;
* :class:`LegacyOwned` owns its memory and hands out a capsule that does not (no manager, no
  deleter), as mpi4py's test exporters do - once the exporter is gone the memory is gone, so
  whoever uses the memory must keep the exporter alive.

A legacy capsule cannot say "read-only", so both are writable receive buffers. A DLPack >= 1.0
exporter of a read-only NumPy array (:class:`Versioned`) sets ``DLPACK_FLAG_BITMASK_READ_ONLY``:
fine to send from, refused as a receive buffer with the reason.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import weakref
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from mpicomm.transport.buffers import adopt

from ..coll.reference import assert_matches, data, expect_everywhere

WORLD = MPI.COMM_WORLD


class LegacyWrap:
    """A legacy exporter over a NumPy array: only ``__dlpack__(stream=None)`` and ``__dlpack_device__``."""

    def __init__(self, a: np.ndarray):
        self._a = a

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._a.__dlpack__()  # a legacy ("dltensor") capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._a.__dlpack_device__()

    def values(self) -> np.ndarray:
        return self._a


# dlpack.h's structures (DLPack < 1.0), for an exporter written against the C ABI directly.
class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_NEW_CAPSULE = ctypes.pythonapi.PyCapsule_New
_NEW_CAPSULE.argtypes, _NEW_CAPSULE.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p], ctypes.py_object
_CAPSULE_NAME = ctypes.create_string_buffer(b"dltensor")  # lives as long as the module (capsules keep the pointer)
_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


class LegacyOwned:
    """A legacy exporter that owns its memory; its capsule owns nothing (no deleter, no destructor).

    The memory (and the ``DLManagedTensor`` the capsule points at) is freed with this object: an array
    made from the capsule is valid only while the exporter lives.
    """

    def __init__(self, a: np.ndarray):
        self._a = np.array(a)  # its own copy: nobody else holds this memory
        self._shape = (ctypes.c_int64 * max(1, a.ndim))(*a.shape)
        dtype = _DataType(_DL_CODES[a.dtype.kind], a.dtype.itemsize * 8, 1)
        tensor = _Tensor(self._a.ctypes.data, _Device(1, 0), a.ndim, dtype, self._shape, None, 0)
        self._managed = _Managed(tensor, None, None)

    def __dlpack__(self, stream: Any = None) -> Any:
        return _NEW_CAPSULE(ctypes.addressof(self._managed), ctypes.addressof(_CAPSULE_NAME), None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def values(self) -> np.ndarray:
        return self._a


class Versioned:
    """A DLPack >= 1.0 exporter over a NumPy array (NumPy flags a read-only array's export read-only)."""

    def __init__(self, a: np.ndarray):
        self._a = a

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, **kwargs: Any) -> Any:
        return self._a.__dlpack__(stream=stream, max_version=max_version, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._a.__dlpack_device__()


def read_only(values: np.ndarray) -> np.ndarray:
    out = np.array(values)
    out.flags.writeable = False
    return out


LEGACY = {"wrap": LegacyWrap, "owned": LegacyOwned}


# ---------------------------------------------------------------- adopt (no communication)


@pytest.mark.parametrize("kind", sorted(LEGACY))
def test_a_legacy_export_is_writable_shares_memory_and_keeps_its_exporter(kind):
    exporter = LEGACY[kind](np.arange(6.0).reshape(2, 3))
    got = adopt(exporter, "recvbuf")
    assert got.flags.writeable and got.shape == (2, 3) and got.dtype == np.float64
    assert np.shares_memory(got, exporter.values())
    got[1, 2] = -7.0
    assert exporter.values()[1, 2] == -7.0  # writes land in the exporter's memory
    alive = weakref.ref(exporter)
    del exporter
    gc.collect()
    assert alive() is not None  # the array holds the exporter ...
    flat = got.reshape(-1)[2:]
    del got
    gc.collect()
    assert alive() is not None and flat.tolist() == [2.0, 3.0, 4.0, -7.0]  # ... and so does a view of it
    del flat
    gc.collect()
    assert alive() is None  # and lets it go with the last view


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float16, np.float32,
                                   np.complex64, np.complex128])
def test_a_legacy_export_keeps_its_element_type_shape_and_strides(dtype):
    values = np.arange(12).reshape(3, 4).astype(dtype)
    assert adopt(LegacyOwned(values), "buf").tolist() == values.tolist()
    strided = np.arange(12.0).reshape(3, 4)[:, ::2]
    got = adopt(LegacyWrap(strided), "buf")
    assert got.strides == strided.strides and np.shares_memory(got, strided)
    assert adopt(LegacyWrap(np.zeros((0, 3))), "buf").shape == (0, 3)
    assert adopt(LegacyWrap(np.array(5.0)), "buf").tolist() == 5.0


def test_the_read_only_flag_of_a_versioned_export_is_honoured():
    assert not adopt(Versioned(read_only(np.arange(3.0))), "buf").flags.writeable
    assert adopt(Versioned(np.arange(3.0)), "buf").flags.writeable


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_an_element_type_numpy_cannot_hold_is_named():
    import torch

    with pytest.raises(TypeError, match=r"^buf \(torch.Tensor\) has DLPack element type bfloat of 16 bits") as info:
        adopt(torch.zeros(3, dtype=torch.bfloat16), "buf")
    assert "could not be shared" not in str(info.value)


# ---------------------------------------------------------------- collectives and point-to-point


@pytest.mark.mpi
@pytest.mark.parametrize("kind", sorted(LEGACY))
def test_a_legacy_exporter_is_a_receive_buffer_of_allreduce_and_bcast(comm, kind):
    rank, p = comm.Get_rank(), comm.Get_size()
    make = LEGACY[kind]
    send = data(rank, 5, np.float64)
    recv = make(np.zeros(5))
    comm.Allreduce(send, recv)
    expected = np.empty(5)
    WORLD.Allreduce(send, expected)
    assert_matches(recv.values(), expected, f"allreduce into a legacy ({kind}) exporter")
    comm.Allreduce(make(send.copy()), recv)  # as a send buffer too
    assert_matches(recv.values(), expected, f"allreduce from and into legacy ({kind}) exporters")
    root = p - 1
    buf = make(data(rank, 4, np.int64))
    comm.Bcast(buf, root)
    assert_matches(buf.values(), data(root, 4, np.int64), f"bcast into a legacy ({kind}) exporter")
    ibuf = make(np.zeros(3, np.int32))
    memory = ibuf.values()
    if rank == root:
        memory[:] = [7, 8, 9]
    request = comm.Ibcast(ibuf, root)
    del ibuf  # the pending broadcast keeps the exporter alive
    gc.collect()
    request.wait()
    assert memory.tolist() == [7, 8, 9]


@pytest.mark.mpi
@pytest.mark.parametrize("kind", sorted(LEGACY))
def test_a_legacy_exporter_is_a_receive_buffer_of_recv_and_recv_array(comm, kind):
    rank, p = comm.Get_rank(), comm.Get_size()
    make = LEGACY[kind]
    right, left = (rank + 1) % p, (rank - 1) % p
    into = make(np.zeros(6))
    comm.Sendrecv(data(rank, 6, np.float64), right, recvbuf=into, source=left)
    assert_matches(into.values(), data(left, 6, np.float64), f"Sendrecv into a legacy ({kind}) exporter")
    into = make(np.zeros(6))
    request = comm.Irecv(into, source=left, tag=3)
    comm.Send(data(rank, 6, np.float64), right, tag=3)
    request.Wait()
    assert_matches(into.values(), data(left, 6, np.float64), f"Recv into a legacy ({kind}) exporter")
    into = make(np.zeros(6))
    receive = comm.irecv_array(into, left, tag=4)
    comm.send_array(make(data(rank, 6, np.float64)), right, tag=4)
    receive.wait()
    assert_matches(into.values(), data(left, 6, np.float64), f"send_array/recv_array with legacy ({kind}) exporters")
    into = make(np.zeros(6))
    comm.sendrecv_array(make(data(rank, 6, np.float64)), right, left, into)
    assert_matches(into.values(), data(left, 6, np.float64), f"sendrecv_array into a legacy ({kind}) exporter")


@pytest.mark.mpi
@pytest.mark.parametrize("kind", sorted(LEGACY))
def test_a_persistent_allreduce_outlives_the_callers_reference_to_a_legacy_exporter(comm, kind):
    rank = comm.Get_rank()
    make = LEGACY[kind]
    send_values = data(rank, 7, np.float64)
    send, recv = make(send_values.copy()), make(np.zeros(7))
    request = comm.Allreduce_init(send, recv)
    send_alive, recv_alive = weakref.ref(send), weakref.ref(recv)
    del send, recv  # the caller lets go of both exporters
    gc.collect()
    assert send_alive() is not None and recv_alive() is not None, "the request must keep its exporters alive"
    for round_ in range(4):
        send_alive().values()[:] = send_values * (round_ + 1)
        request.Start()
        request.Wait()
        expected = np.empty(7)
        WORLD.Allreduce(send_values * (round_ + 1), expected)
        assert_matches(recv_alive().values(), expected, f"persistent allreduce round {round_} ({kind})")
    # (one collection after the rounds, not one a round: late in the suite each takes seconds on a large heap)
    gc.collect()
    assert send_alive() is not None and recv_alive() is not None, "the rounds must not let go of the exporters"
    request.Free()


@pytest.mark.mpi
def test_a_read_only_versioned_exporter_is_refused_as_a_receive_buffer(comm):
    rank, p = comm.Get_rank(), comm.Get_size()
    send = data(rank, 4, np.float64)
    frozen = Versioned(read_only(np.zeros(4)))
    expect_everywhere(comm, lambda: comm.Allreduce(send, frozen), "recvbuf is read-only")
    if p > 1:  # (the root's buffer is only read: read-only is fine there)
        expect_everywhere(comm, lambda: comm.Bcast(Versioned(read_only(np.zeros(4))), 0) if rank else
                          comm.Bcast(np.zeros(4), 0), "buf is read-only")
    with pytest.raises(ValueError, match="buf is read-only"):
        comm.recv_array(frozen, (rank - 1) % p, tag=5)  # refused before anything is posted
    out = np.empty(4)
    comm.Allreduce(Versioned(read_only(send)), out)  # a read-only buffer is fine to send from
    expected = np.empty(4)
    WORLD.Allreduce(send, expected)
    assert_matches(out, expected, "allreduce from a read-only versioned exporter")
