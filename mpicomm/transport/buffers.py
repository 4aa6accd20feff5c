"""One buffer layer for NumPy and CuPy arrays.

Everything that hands an array to MPI goes through here:

* :func:`check_array` - the argument checks (array type, contiguity, dtype,
  writability) with errors that name the argument, the value and the fix;
* :func:`mpi_datatype` / :func:`numpy_dtype` and :func:`dtype_code` /
  :func:`dtype_from_code` - the dtype mappings (to MPI, and to a small integer
  for message headers);
* :func:`element_view` - views by element offset, never copies;
* :func:`send_buffer` / :func:`recv_buffer` - make an array ready for MPI and
  say what to do once MPI is done with it.

The array's module (:func:`array_module`) selects an :class:`ArrayOps` - the
few operations that differ between host and device memory (synchronize the
stream, copy to and from host, allocate pinned host memory). NumPy's are
no-ops or plain copies; callers never branch on "is this a GPU array".

Device buffers reach MPI one of two ways, chosen in :func:`transfer_path`:

* **direct** - the MPI library is CUDA-aware (see :func:`cuda_aware`): the
  producer's stream is synchronized (:func:`ready`), then MPI gets the
  device pointer;
* **staged** - it is not: data goes through reusable pinned host buffers
  (:class:`HostPool`), copied before a send and after a receive.

``MPICOMM_TRANSFER=staged`` forces the staged path for every array, NumPy
included, so the staging machinery is exercised on machines without a GPU.

**The stream contract** (docs/gpus.md) is implemented here, once:
:func:`producer` names the stream whose queued work writes (or still reads) a
device buffer - CuPy's current stream for CuPy arrays, torch's current stream
for torch tensors, the ``stream`` of a ``__cuda_array_interface__`` (v3), and,
for a DLPack exporter, CuPy's current stream after the handshake (``cupy.
from_dlpack`` passes it as ``__dlpack__(stream=...)``, and the exporter orders
its work before it) - and :func:`ready` waits for it on the host. A host wait,
not an event: MPI reads and writes the memory from the host (or from its own
CUDA-aware copies, on no stream of ours), so nothing short of the work being
done makes the bytes safe. :func:`adopt` calls it for every buffer a public
call is given, on the caller's thread (where "current stream" means the
caller's); the transfers below call it again on the stream mpicomm's own work
used (:func:`mpicomm.device.binding`).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from .. import config
from ..device import cupy_module
from ..validate import check_span

__all__ = [
    "DTYPES",
    "adopt",
    "Producer",
    "producer",
    "ready",
    "array_module",
    "check_array",
    "dtype_code",
    "dtype_from_code",
    "mpi_datatype",
    "numpy_dtype",
    "element_view",
    "byte_range",
    "overlap",
    "cuda_aware",
    "ArrayOps",
    "ops_for",
    "HostPool",
    "Transfer",
    "transfer_path",
    "send_buffer",
    "recv_buffer",
]

#: dtypes mpicomm moves and reduces; a dtype's index here is its header code.
DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(t)
    for t in (
        np.bool_,
        np.int8, np.int16, np.int32, np.int64,
        np.uint8, np.uint16, np.uint32, np.uint64,
        np.float16, np.float32, np.float64, np.longdouble,
        np.complex64, np.complex128, np.clongdouble,
    )
)
_CODES = {dt: code for code, dt in enumerate(DTYPES)}


def array_module(x: Any) -> ModuleType:
    """NumPy or CuPy: the module *x* belongs to (TypeError for anything else)."""
    if isinstance(x, np.ndarray):
        return np
    if type(x).__module__.partition(".")[0] == "cupy":
        cupy = cupy_module()
        if cupy is not None and isinstance(x, cupy.ndarray):
            return cupy
    raise TypeError(
        f"expected a NumPy or CuPy array, got {type(x).__module__}.{type(x).__qualname__}; "
        f"convert it with numpy.asarray(...) (or cupy.asarray(...) for GPU memory)"
    )


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13  # DLPack device types (dlpack.h)


def adopt(x: Any, name: str) -> Any:
    """*x* as a NumPy or CuPy array over the same memory (no copy), as mpi4py takes buffers.

    NumPy and CuPy arrays are returned as they are. Otherwise, in this order:
    an object exporting ``__cuda_array_interface__`` (Numba device arrays,
    PyTorch CUDA tensors) becomes a CuPy array; one exporting DLPack
    (``__dlpack__``/``__dlpack_device__``: PyTorch tensors, JAX arrays, any
    array library speaking the standard) a NumPy array when its memory is on
    the host, a CuPy array when it is on a GPU; anything with the buffer
    protocol (``bytearray``, ``array.array``, ``memoryview``) a NumPy array.
    Writes into the result land in the caller's object. Device memory is
    returned ready: the producer's stream has been waited for (:func:`ready`).
    A DLPack buffer is taken as mpi4py takes it: writable unless the exporter
    flags it read-only (DLPack >= 1.0; a legacy exporter, ``__dlpack__(stream=None)`` without
    ``max_version``, cannot, so its buffer is writable), and the result keeps
    the exporter alive for as long as it (or a view, a plan, a persistent
    request) is used. TypeError, naming the kind and the fix, when none
    applies, the memory is on a GPU and CuPy is not installed, or a tensor
    requires grad; ValueError for an interface that names stream 0.
    """
    if isinstance(x, np.ndarray):
        return x
    module = type(x).__module__
    kind = type(x).__qualname__ if module == "builtins" else f"{module}.{type(x).__qualname__}"
    if type(x).__module__.partition(".")[0] == "cupy":
        cupy = cupy_module()
        if cupy is not None and isinstance(x, cupy.ndarray):
            ready(x)
            return x
    if _cuda_interface(x, name, kind) is not None:
        cupy = _device_array(x, name, kind, "exports __cuda_array_interface__")
        ready(x)  # (CuPy would sync a v3 interface's stream itself; torch's v2 names none: the producer's, here)
        return cupy.asarray(x)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        device_type = int(x.__dlpack_device__()[0])
        try:
            if device_type in (_DL_CPU, _DL_CUDA_HOST):
                return _host_dlpack(x, name, kind)
            if device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
                cupy = _device_array(x, name, kind, "is a DLPack tensor in GPU memory")
                array = _kept_alive(cupy, cupy.from_dlpack(x), x)  # the handshake: x's work before CuPy's stream
                ready(array)
                return array
        except _Refused:
            raise
        except (BufferError, RuntimeError, TypeError) as exc:
            raise TypeError(f"{name} ({kind}) could not be shared through DLPack: {exc}; pass a plain array, or "
                            f"for a tensor that requires grad its .detach()") from None
        raise TypeError(f"{name} ({kind}) lives on DLPack device type {device_type}, which mpicomm cannot reach; "
                        f"copy it to host memory first")
    try:
        view = memoryview(x)
    except TypeError:
        raise TypeError(
            f"{name} must be an array or a buffer (NumPy, CuPy, DLPack, __cuda_array_interface__, bytearray...), "
            f"got {kind}; convert it with numpy.asarray({name})"
        ) from None
    try:
        return np.asarray(view)
    except (TypeError, ValueError):
        return np.frombuffer(view.cast("B") if view.c_contiguous else view, np.uint8)


def _cuda_interface(x: Any, name: str, kind: str) -> dict | None:
    """``x.__cuda_array_interface__``, None when *x* has none; TypeError naming ``.detach()`` for a tensor that
    requires grad (torch raises RuntimeError for those, where a CPU tensor's DLPack export would be refused)."""
    try:
        return getattr(x, "__cuda_array_interface__", None)
    except RuntimeError as exc:
        raise TypeError(f"{name} ({kind}) could not be shared through __cuda_array_interface__: {exc}; pass a plain "
                        f"array, or for a tensor that requires grad its .detach()") from None


# ---------------------------------------------------------------- the stream contract


class Producer(NamedTuple):
    """The stream whose queued work must be done before MPI reads (or writes) a device buffer.

    *kind*: ``"cupy"`` (CuPy's current stream of the calling thread on *device*), ``"torch"`` (torch's current
    stream on *device*) or ``"cuda"`` (the stream *handle* a ``__cuda_array_interface__`` names: 1 the legacy
    default stream, 2 the per-thread default stream, any other value a ``cudaStream_t``).
    """

    kind: str
    device: int
    handle: int | None = None


def producer(x: Any) -> Producer | None:
    """The stream that produced array or exporter *x*; None for host memory, or when *x* says no wait is needed.

    Only attributes are read (no CUDA call), so the choice can be checked without a GPU. CuPy arrays and torch
    CUDA tensors: the library's current stream on the array's device (the stream the caller queued its work on).
    A ``__cuda_array_interface__`` of version 3 with a ``stream``: that stream (0 is refused: the interface
    forbids it as ambiguous); without one (version 2, or ``None``) the exporter declares no synchronisation
    needed. A DLPack exporter in GPU memory: CuPy's current stream on its device, which the exporter is asked to
    order its work before (``__dlpack__(stream=...)``, in ``cupy.from_dlpack``).
    """
    if isinstance(x, np.ndarray):
        return None
    root = type(x).__module__.partition(".")[0]
    if root == "cupy" and hasattr(x, "device") and hasattr(x, "data"):
        return Producer("cupy", int(x.device.id))
    if root == "torch" and hasattr(x, "is_cuda"):
        return Producer("torch", int(x.device.index or 0)) if x.is_cuda else None
    interface = getattr(x, "__cuda_array_interface__", None)
    if interface is not None:
        stream = interface.get("stream") if int(interface.get("version", 0)) >= 3 else None
        if stream is None:
            return None
        if type(stream) is not int or stream == 0:
            raise ValueError(f"__cuda_array_interface__ names stream {stream!r}; the interface takes an integer "
                             f"stream other than 0 (1: legacy default, 2: per-thread default), or None")
        return Producer("cuda", -1, stream)
    if hasattr(x, "__dlpack_device__"):
        device_type, device_id = x.__dlpack_device__()
        if int(device_type) in (_DL_CUDA, _DL_CUDA_MANAGED):
            return Producer("cupy", int(device_id))
    return None


def ready(x: Any) -> None:
    """Wait on the host until the work queued on *x*'s :func:`producer` stream is done (nothing for host memory)."""
    p = producer(x)
    if p is not None:
        _wait(p)


def _wait(p: Producer) -> None:
    if p.kind == "torch":
        import torch  # (only ever reached with a torch tensor in hand)

        torch.cuda.current_stream(p.device).synchronize()
        return
    cupy = cupy_module()
    assert cupy is not None  # (a device buffer reached here only through CuPy)
    if p.kind == "cupy":
        with cupy.cuda.Device(p.device):
            cupy.cuda.get_current_stream().synchronize()
    else:  # (1 and 2 are the runtime's own handles of the legacy and per-thread default streams)
        cupy.cuda.runtime.streamSynchronize(p.handle)


# ---------------------------------------------------------------- DLPack, read the way mpi4py reads it
#
# ``numpy.from_dlpack`` does not fit a message-passing library: it marks an array made from a legacy
# (pre-1.0, unversioned) capsule read-only, so it could never be a receive buffer, and its array keeps only
# the capsule alive, not the exporter - an exporter whose capsule does not own the memory (mpi4py's test
# exporters, some libraries' views) frees it when the caller drops the exporter, under a persistent request
# still holding the array. mpi4py takes such a buffer writable unless the exporter says read-only (the
# DLPack >= 1.0 flag; a legacy capsule cannot say it) and holds the exporter while MPI uses the memory.
# :func:`_host_dlpack` does the same: it reads the capsule's ``DLTensor`` itself (ctypes, layouts from
# dlpack.h) and makes a NumPy array over that memory whose ``base`` (a :class:`_DLPackExport`) holds both
# the exporter and the capsule. The capsule is kept unconsumed (its name unchanged), so its own destructor
# releases the export (calls the producer's deleter) when the last array over it is gone.

_DL_READ_ONLY, _DL_IS_COPIED = 1, 2  # DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_FLAG_BITMASK_IS_COPIED
_DL_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}  # DLDataTypeCode: kDLInt, kDLUInt, kDLFloat, kDLComplex, kDLBool
_DL_CODE_NAMES = {3: "an opaque handle", 4: "bfloat"}


class _Refused(TypeError):
    """A DLPack export read, and refused with a message of its own (raised as it is)."""


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),  # in elements; NULL: compact row-major
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):  # a "dltensor" capsule (DLPack < 1.0)
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):  # a "dltensor_versioned" capsule (DLPack >= 1.0)
    _fields_ = [
        ("version", _DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_CAPSULE_VALID = ctypes.pythonapi.PyCapsule_IsValid
_CAPSULE_VALID.argtypes, _CAPSULE_VALID.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int
_CAPSULE_POINTER = ctypes.pythonapi.PyCapsule_GetPointer
_CAPSULE_POINTER.argtypes, _CAPSULE_POINTER.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p


class _DLPackExport:
    """The ``base`` of a NumPy array made over a DLPack export: holds the exporter and its capsule.

    As long as any array or view over the memory lives (a persistent request's plan, a pending
    nonblocking operation), so do the exporter and the capsule, whatever the caller has dropped.
    """

    __slots__ = ("__array_interface__", "exporter", "capsule")

    def __init__(self, interface: dict, exporter: Any, capsule: Any):
        self.__array_interface__ = interface
        self.exporter = exporter
        self.capsule = capsule


def _export(x: Any) -> Any:
    """``x.__dlpack__()``: a versioned (>= 1.0) capsule when the exporter speaks it, else a legacy one."""
    try:
        return x.__dlpack__(max_version=(1, 0))
    except TypeError:  # a legacy exporter: __dlpack__(self, stream=None), no max_version
        return x.__dlpack__()


def _dl_dtype(dt: _DLDataType, name: str, kind: str) -> np.dtype:
    code, bits, lanes = int(dt.code), int(dt.bits), int(dt.lanes)
    letter = _DL_KINDS.get(code)
    if letter == "f" and lanes == 2:  # a complex number as two float lanes (how mpi4py's tests export long double
        letter, bits, lanes = "c", 2 * bits, 1  # complex, whose 256 bits do not fit DLPack's 8-bit `bits`)
    if letter is None or lanes != 1 or bits % 8 or (letter == "b" and bits != 8):
        what = _DL_CODE_NAMES.get(code, f"type code {code}")
        raise _Refused(f"{name} ({kind}) has DLPack element type {what} of {bits} bits x {lanes} lanes, which "
                       f"NumPy cannot hold; convert it to a standard numeric type first")
    try:
        return np.dtype(f"{letter}{bits // 8}")
    except TypeError:
        raise _Refused(f"{name} ({kind}) has a DLPack element type ({letter}, {bits} bits) NumPy has no dtype "
                       f"for; convert it to a standard numeric type first") from None


def _host_dlpack(x: Any, name: str, kind: str) -> np.ndarray:
    """A NumPy array over the host memory DLPack exporter *x* shares (no copy), writable unless it says not."""
    capsule = _export(x)
    if _CAPSULE_VALID(capsule, b"dltensor_versioned"):
        managed = _DLManagedTensorVersioned.from_address(_CAPSULE_POINTER(capsule, b"dltensor_versioned"))
        if managed.version.major != 1:
            raise BufferError(f"the exporter answered with DLPack {managed.version.major}.{managed.version.minor}, "
                              f"not the 1.x asked for")
        # A copy (IS_COPIED) is taken read-only too: what MPI wrote there would never reach the caller's object.
        readonly = bool(managed.flags & (_DL_READ_ONLY | _DL_IS_COPIED))
        tensor = managed.dl_tensor
    elif _CAPSULE_VALID(capsule, b"dltensor"):
        tensor = _DLManagedTensor.from_address(_CAPSULE_POINTER(capsule, b"dltensor")).dl_tensor
        readonly = False  # a legacy capsule cannot say read-only: writable, as mpi4py takes it
    else:
        raise BufferError("__dlpack__() returned no unused DLPack capsule")
    if tensor.device.device_type not in (_DL_CPU, _DL_CUDA_HOST):
        raise BufferError(f"the capsule's memory is on DLPack device type {tensor.device.device_type}, not the host "
                          f"memory __dlpack_device__() reported")
    dtype = _dl_dtype(tensor.dtype, name, kind)
    ndim = int(tensor.ndim)
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    strides = None if not tensor.strides else tuple(int(tensor.strides[i]) * dtype.itemsize for i in range(ndim))
    address = (tensor.data or 0) + int(tensor.byte_offset)
    if not tensor.data and 0 not in shape:
        raise BufferError("the capsule's data pointer is NULL for a non-empty tensor")
    interface = {"data": (address, readonly), "shape": shape, "strides": strides, "typestr": dtype.str,
                 "version": 3}
    return np.asarray(_DLPackExport(interface, x, capsule))


def _kept_alive(xp: ModuleType, array: Any, exporter: Any) -> Any:
    """Device *array* (from ``cupy.from_dlpack(exporter)``) as an array that also keeps *exporter* alive.

    CuPy's array holds the capsule's export, not the exporter; for an exporter whose export does not own the
    memory the same lifetime rule as on the host applies. A contiguous array is remade over the same memory
    (``UnownedMemory`` with the exporter as owner); any other is refused later as not contiguous anyway.
    """
    if not array.size or not array.flags.c_contiguous:
        return array
    memory = xp.cuda.UnownedMemory(array.data.ptr, array.nbytes, (array, exporter), array.device.id)
    return xp.ndarray(array.shape, array.dtype, xp.cuda.MemoryPointer(memory, 0))


def _device_array(x: Any, name: str, kind: str, what: str) -> ModuleType:
    cupy = cupy_module()
    if cupy is None:
        raise TypeError(f"{name} ({kind}) {what}: GPU memory, which mpicomm moves and reduces with CuPy, and CuPy "
                        f"is not installed; pip install 'mpicomm[cuda12]' (or [cuda13]), or pass host memory")
    return cupy


def check_array(x: Any, name: str, *, writable: bool = False) -> ModuleType:
    """Check that *x* can be handed to MPI; return its array module.

    Raises TypeError (not an array, unsupported or byte-swapped dtype) or
    ValueError (not C-contiguous, read-only where *writable*), naming *name*.
    """
    try:
        xp = array_module(x)
    except TypeError:
        raise TypeError(
            f"{name} must be a NumPy or CuPy array, got {type(x).__qualname__}; "
            f"convert it with numpy.asarray({name}) (or cupy.asarray for GPU memory)"
        ) from None
    if x.dtype not in _CODES:
        if x.dtype.newbyteorder("=") in _CODES:
            raise TypeError(
                f"{name} has non-native byte order ({x.dtype.str}); "
                f"convert it with {name}.astype({name}.dtype.newbyteorder('='))"
            )
        raise TypeError(
            f"{name} has dtype {x.dtype}, which mpicomm does not move; "
            f"supported: {', '.join(str(d) for d in DTYPES)}"
        )
    if not x.flags.c_contiguous:
        raise ValueError(
            f"{name} is not C-contiguous (shape {x.shape}, strides {x.strides}); pass "
            f"{xp.__name__}.ascontiguousarray({name}), or a contiguous slice, and copy back after a receive"
        )
    if writable and not getattr(x.flags, "writeable", True):
        raise ValueError(f"{name} is read-only; a receive needs a writable array (e.g. {name}.copy())")
    return xp


def dtype_code(dtype: Any) -> int:
    """Small integer naming *dtype* in message headers (inverse of :func:`dtype_from_code`)."""
    dt = np.dtype(dtype)
    try:
        return _CODES[dt]
    except KeyError:
        raise TypeError(f"dtype {dt} is not one mpicomm moves; supported: {', '.join(map(str, DTYPES))}") from None


def dtype_from_code(code: int) -> np.dtype:
    """The dtype a header code names (inverse of :func:`dtype_code`)."""
    if not 0 <= code < len(DTYPES):
        raise ValueError(f"dtype code {code} is not in 0..{len(DTYPES) - 1}; the message is not an mpicomm header")
    return DTYPES[code]


def mpi_datatype(dtype: Any) -> MPI.Datatype:
    """The MPI datatype of a NumPy dtype (inverse of :func:`numpy_dtype`)."""
    return _mpi_datatype(np.dtype(dtype))


@functools.cache
def _mpi_datatype(dt: np.dtype) -> MPI.Datatype:
    try:
        return dtlib.from_numpy_dtype(dt)
    except Exception:
        raise TypeError(f"dtype {dt} has no MPI datatype; supported: {', '.join(map(str, DTYPES))}") from None


def numpy_dtype(datatype: MPI.Datatype) -> np.dtype:
    """The NumPy dtype of an MPI datatype (inverse of :func:`mpi_datatype`)."""
    return np.dtype(dtlib.to_numpy_dtype(datatype))


def element_view(x: Any, offset: int, count: int, name: str = "buf"):
    """A flat view of *count* elements of *x* starting at element *offset* (no copy)."""
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous, so a flat view of it would be a copy; pass a contiguous array")
    check_span(offset, count, x.size, name)
    return x.reshape(-1)[offset : offset + count]


def byte_range(x: Any) -> tuple[int, int]:
    """``(first byte address, one past the last)`` of contiguous array *x* (host or device memory)."""
    if isinstance(x, np.ndarray):
        start = x.__array_interface__["data"][0]
    else:
        data = x.data
        start = data.ptr if hasattr(data, "ptr") else x.__array_interface__["data"][0]
    return start, start + x.nbytes


def overlap(a: Any, b: Any) -> str | None:
    """How contiguous arrays *a* and *b* share memory: ``"same"`` bytes, ``"partial"``, or None (disjoint).

    MPI forbids a send and a receive buffer that overlap (in place is what
    ``MPI.IN_PLACE`` is for); mpicomm's algorithms read the input while they
    write the output, so a partial overlap gives wrong results. Byte ranges
    are compared, so it works for device memory too, and costs two address
    reads.
    """
    if a is b:
        return "same" if a is not None and a.size else None
    if a is None or b is None or a.size == 0 or b.size == 0:
        return None
    if type(a) is np.ndarray and type(b) is np.ndarray:  # the common case, cheaply
        ra, rb = a.base, b.base
        ra, rb = a if ra is None else ra, b if rb is None else rb  # (NumPy keeps a view's base the owner)
        if ra is not rb and type(ra) is np.ndarray and type(rb) is np.ndarray and ra.base is None \
                and rb.base is None:
            return None  # two arrays that own their memory: disjoint
        if not np.may_share_memory(a, b):  # bounds only: a yes is checked below
            return None
    a0, a1 = byte_range(a)
    b0, b1 = byte_range(b)
    if a1 <= b0 or b1 <= a0:
        return None
    return "same" if (a0, a1) == (b0, b1) else "partial"


# ---------------------------------------------------------------- CUDA-awareness


def _loaded_libmpi() -> ctypes.CDLL:
    """The MPI library this process has loaded (mpi4py loads it at import)."""
    if sys.platform.startswith("linux"):
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                path = fields[5].strip() if len(fields) == 6 else ""
                base = path.rsplit("/", 1)[-1]
                if base.startswith(("libmpi.so", "libmpi_", "libmpich.so")):
                    return ctypes.CDLL(path)
    return ctypes.CDLL(None)


@functools.cache
def library_cuda_support() -> bool:
    """Ask the MPI library whether it accepts device pointers (``MPIX_Query_cuda_support``).

    MPICH >= 4 and Open MPI >= 4 export that query; a library without it is
    taken to be not CUDA-aware.
    """
    try:
        query = _loaded_libmpi().MPIX_Query_cuda_support
    except (AttributeError, OSError):
        return False
    query.restype = ctypes.c_int
    return bool(query())


def cuda_aware() -> bool:
    """Whether device buffers go to MPI directly: ``MPICOMM_CUDA_AWARE``, else the library's answer."""
    forced = config.cuda_aware_setting()
    return library_cuda_support() if forced is None else forced


# ---------------------------------------------------------------- array operations


class ArrayOps:
    """What differs between host (NumPy) and device (CuPy) memory - and nothing else.

    The NumPy instance is the "do-nothing stream": synchronize is a no-op and
    host copies are plain copies, so code written against ArrayOps runs the
    same on both. Device operations run on the array's own device (its current
    stream there), whatever device is current.
    """

    def __init__(self, xp: ModuleType, on_device: bool, alloc_host: Callable[[int], np.ndarray]):
        self.xp = xp
        self.on_device = on_device
        self.alloc_host = alloc_host  # pinned memory for CuPy: fast copies, and MPI may read it
        self.pool = HostPool(alloc_host)

    def synchronize(self, x: Any) -> None:
        """Wait for the work queued on *x*'s stream (kernels writing a buffer MPI will read or overwrite)."""
        if self.on_device:
            ready(x)

    def to_host(self, src: Any, dst: np.ndarray) -> None:
        """Copy array *src* into host array *dst* (same shape and dtype); returns when done."""
        if self.on_device:
            with src.device:
                src.get(out=dst)  # blocking
        else:
            np.copyto(dst, src)

    def from_host(self, src: np.ndarray, dst: Any) -> None:
        """Copy host array *src* into array *dst*; returns when done (so *src* may be reused)."""
        if self.on_device:
            with dst.device:
                dst.set(src)
                self.xp.cuda.get_current_stream().synchronize()  # from pinned memory the copy is asynchronous
        else:
            np.copyto(dst, src)

    def bytes_of(self, x: Any) -> Any:
        """A flat uint8 view of contiguous array *x* (no copy)."""
        return x.reshape(-1).view(self.xp.uint8)


def _pinned(nbytes: int) -> np.ndarray:
    cupy = cupy_module()
    memory = cupy.cuda.alloc_pinned_memory(nbytes)  # type: ignore[union-attr]
    return np.frombuffer(memory, np.uint8, nbytes)  # the array keeps the pinned memory alive


_OPS: dict[str, ArrayOps] = {}


def ops_for(xp: ModuleType) -> ArrayOps:
    """The :class:`ArrayOps` of array module *xp* (one per module, with its staging pool)."""
    ops = _OPS.get(xp.__name__)
    if ops is None:
        if xp is np:
            ops = ArrayOps(np, False, lambda n: np.empty(n, np.uint8))
        else:
            ops = ArrayOps(xp, True, _pinned)
        _OPS[xp.__name__] = ops
    return ops


class HostPool:
    """Reusable host buffers for staging, in size classes.

    Classes are powers of two from 4 KiB to 64 MiB, then multiples of 64 MiB
    (so a large array pins at most 64 MiB more than it needs). ``acquire``
    hands out a free buffer of the class, allocating only when none is free;
    ``release`` returns it; ``clear`` drops the free ones. Steady-state traffic
    therefore allocates nothing (pinned allocation is slow: it maps pages for
    the GPU).
    """

    MIN_BYTES = 4096
    LARGE_STEP = 64 << 20

    def __init__(self, alloc: Callable[[int], np.ndarray]):
        self._alloc = alloc
        self._free: dict[int, list[np.ndarray]] = {}
        self.allocated = 0  # buffers ever allocated (tests watch reuse)

    @classmethod
    def size_class(cls, nbytes: int) -> int:
        if nbytes > cls.LARGE_STEP:
            return -(-nbytes // cls.LARGE_STEP) * cls.LARGE_STEP
        return max(cls.MIN_BYTES, 1 << max(0, nbytes - 1).bit_length())

    def acquire(self, nbytes: int) -> np.ndarray:
        """A host byte buffer of at least *nbytes*."""
        cls = self.size_class(nbytes)
        free = self._free.get(cls)
        if free:
            return free.pop()
        self.allocated += 1
        return self._alloc(cls)

    def release(self, buf: np.ndarray) -> None:
        """Give *buf* back for reuse."""
        self._free.setdefault(buf.nbytes, []).append(buf)

    def clear(self) -> None:
        """Drop every free buffer."""
        self._free.clear()


# ---------------------------------------------------------------- transfers


def _nothing() -> None:
    return None


class Transfer:
    """An array made ready for MPI.

    ``buf`` is the buffer specification to hand MPI (``[obj, nbytes, MPI.BYTE]``).
    Once MPI has completed the operation, ``finish()`` must run (it copies a
    staged receive back to the device and returns host buffers to the pool);
    if the operation is abandoned instead, ``abandon()`` (no copy-back).
    """

    __slots__ = ("buf", "finish", "abandon")

    def __init__(self, buf: list, finish: Callable[[], None] = _nothing, abandon: Callable[[], None] | None = None):
        self.buf = buf
        self.finish = finish
        self.abandon = finish if abandon is None else abandon


def _bytes_spec(obj: Any, nbytes: int) -> list:
    return [obj, nbytes, MPI.BYTE]


def transfer_path(x: Any) -> str:
    """``"direct"`` or ``"staged"``: how array *x* reaches MPI (the one place this is decided)."""
    ops = ops_for(array_module(x))
    if config.transfer_mode() == "staged" or (ops.on_device and not cuda_aware()):
        return "staged"
    return "direct"


def _host_view(ops: ArrayOps, x: Any) -> tuple[np.ndarray, np.ndarray]:
    """A pooled host byte buffer and a view of it shaped like *x*."""
    raw = ops.pool.acquire(x.nbytes)
    return raw, raw[: x.nbytes].view(x.dtype).reshape(x.shape)


def send_buffer(x: Any) -> Transfer:
    """Make contiguous array *x* ready to be read by MPI (a send, a put)."""
    ops = ops_for(array_module(x))
    if transfer_path(x) == "direct":
        ops.synchronize(x)
        return Transfer(_bytes_spec(x, x.nbytes))
    raw, host = _host_view(ops, x)
    ops.to_host(x, host)  # (on the current stream, so after the work queued there: a blocking copy)
    return Transfer(_bytes_spec(raw, x.nbytes), functools.partial(ops.pool.release, raw))


def recv_buffer(x: Any) -> Transfer:
    """Make contiguous array *x* ready to be written by MPI (a receive, a get)."""
    ops = ops_for(array_module(x))
    if transfer_path(x) == "direct":
        ops.synchronize(x)  # kernels still using x must finish before MPI writes it
        return Transfer(_bytes_spec(x, x.nbytes))
    raw, host = _host_view(ops, x)

    def finish() -> None:
        ops.from_host(host, x)
        ops.pool.release(raw)

    return Transfer(_bytes_spec(raw, x.nbytes), finish, functools.partial(ops.pool.release, raw))
