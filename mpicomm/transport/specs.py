"""mpi4py buffer specifications, read into flat arrays that mpicomm's algorithms move.

mpi4py lets a buffer argument be written several ways; these are the ones
mpicomm runs itself (anything else - ``MPI.BOTTOM``, derived datatypes,
per-rank datatypes - is handed to the MPI library unchanged, see
:class:`Unsupported`):

=================================================  =====================================
spec                                               meaning
=================================================  =====================================
``buf``                                            the whole buffer, its own element type
``[buf, count]``                                   its first *count* elements
``[buf, datatype]``                                the whole buffer as *datatype* elements
``[buf, count, datatype]``                         *count* elements of *datatype*
``[buf, counts]`` (v)                              per-rank counts (None: equal split,
                                                   int: that many each), packed in rank order
``[buf, (counts, displs)]``, ``[buf, counts,       per-rank counts and displacements
displs, datatype]``, ... (v)                       (in elements; None: packed)
``MPI.IN_PLACE`` or ``None``                       in place, where the collective allows it
``[None, datatype]``, ``[None, 0, datatype]``      an empty buffer (zero elements; mpi4py's
                                                   meaning of None as a buffer)
=================================================  =====================================

``buf`` is a NumPy or CuPy array (any shape, C-contiguous), an object with
``__cuda_array_interface__`` (taken with ``cupy.asarray``, no copy), a DLPack
exporter (PyTorch tensors, JAX arrays: NumPy on the host, CuPy on a GPU, no
copy), or anything with the buffer protocol (``bytearray``, ``array.array``...).
In a v-spec, ``(count, displ)`` of two integers means what it means to mpi4py:
every rank's block has *count* elements and rank i's starts at i·displ.
``datatype`` is an ``MPI.Datatype`` or a NumPy type code (``"d"``, ``"i"``).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from mpi4py import MPI

from ..ops import is_pair_dtype
from .buffers import DTYPES, adopt, array_module

__all__ = ["Unsupported", "Buffer", "VBuffer", "is_in_place", "plain", "simple", "vector", "wvector", "block", "block_counts", "displacements", "writable", "check_disjoint"]


class Unsupported(Exception):
    """A spec mpicomm does not run itself (the call goes to the MPI library); the message says why."""


@dataclass
class Buffer:
    """A buffer spec read: a flat (1-D, contiguous) view of its elements, and its module."""

    array: Any
    xp: ModuleType

    @property
    def count(self) -> int:
        return int(self.array.size)

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype


@dataclass
class VBuffer(Buffer):
    """A vector spec read: the flat buffer plus per-rank counts and displacements (in elements)."""

    counts: tuple[int, ...] = ()
    displs: tuple[int, ...] = ()


def is_in_place(spec: Any) -> bool:
    """``MPI.IN_PLACE`` or None."""
    return spec is None or spec is MPI.IN_PLACE


def _datatype_dtype(datatype: Any) -> np.dtype:
    if isinstance(datatype, str):
        try:
            if "\0" in datatype:  # NumPy reads "\0" as bool
                raise TypeError
            return np.dtype(datatype)
        except TypeError:
            raise TypeError(f"datatype {datatype!r} is not a NumPy type code; use e.g. 'd' or MPI.DOUBLE") from None
    if not isinstance(datatype, MPI.Datatype):
        raise TypeError(f"expected an MPI.Datatype or a type code, got {datatype!r}")
    if datatype == MPI.DATATYPE_NULL:
        raise TypeError("datatype is MPI.DATATYPE_NULL; pass the element type, e.g. MPI.DOUBLE")
    try:
        dt = np.dtype(_to_numpy(datatype))
    except Exception:
        raise Unsupported(f"datatype {datatype.Get_name() or datatype} has no NumPy equivalent") from None
    lb, extent = datatype.Get_extent()
    if lb != 0 or extent != dt.itemsize or datatype.Get_size() != dt.itemsize:
        raise Unsupported(f"datatype {datatype.Get_name() or datatype} is not contiguous")
    return dt


def _to_numpy(datatype: MPI.Datatype) -> Any:
    from mpi4py.util import dtlib

    return dtlib.to_numpy_dtype(datatype)


def _supported(dt: np.dtype) -> None:
    if dt.subdtype is not None or (dt.names and not is_pair_dtype(dt)) or (not dt.names and dt.newbyteorder("=") not in DTYPES):
        raise Unsupported(f"element type {dt} is not one mpicomm moves")
    if not dt.isnative and not dt.names:
        raise TypeError(f"element type {dt} has non-native byte order; convert with .astype(dtype.newbyteorder('='))")


def _as_array(buf: Any, name: str) -> tuple[Any, ModuleType]:
    """The object as a flat array of its own elements (no copy) and its module (see :func:`buffers.adopt`)."""
    if buf is MPI.BOTTOM:
        raise Unsupported(f"{name} is MPI.BOTTOM (absolute addresses)")
    buf = adopt(buf, name)
    xp = array_module(buf)
    if not buf.flags.c_contiguous:
        raise ValueError(
            f"{name} is not C-contiguous (shape {buf.shape}, strides {buf.strides}); "
            f"pass {xp.__name__}.ascontiguousarray({name}) and copy the result back"
        )
    return buf.reshape(-1), xp


def _retype(flat: Any, dt: np.dtype, name: str) -> Any:
    if flat.dtype == dt:
        return flat
    if flat.nbytes % dt.itemsize:
        raise ValueError(f"{name} has {flat.nbytes} bytes, not a whole number of {dt} elements ({dt.itemsize} bytes)")
    return flat.view(np.uint8).view(dt)


def _typed(buf: Any, datatype: Any, name: str) -> tuple[Any, ModuleType]:
    """*buf* as a flat array of *datatype* elements (its own type when None), and its module.

    A *buf* of None in a spec is mpi4py's empty buffer: zero elements of *datatype* (which it then needs;
    a bare None is no spec of a buffer - it is in place where a collective allows that, else refused here).
    """
    if buf is None and datatype is not None:
        dt = _datatype_dtype(datatype)
        _supported(dt)
        return np.empty(0, dt), np
    flat, xp = _as_array(buf, name)
    dt = flat.dtype if datatype is None else _datatype_dtype(datatype)
    try:
        _supported(dt)
    except Unsupported:
        if datatype is None:
            _library_can_map(flat, name)
        raise
    return _retype(flat, dt, name), xp


_FORMAT_PREFIX = "@=<>!"


def _library_can_map(flat: Any, name: str) -> None:
    """TypeError unless mpi4py can map *flat*'s own element type to an MPI datatype.

    A spec mpicomm does not run goes to the MPI library, which every rank must
    then enter; mpi4py maps a bare buffer's element type from its buffer
    format and raises ``KeyError`` for one it does not know (object arrays,
    structured dtypes, subarrays). Found here, on the rank that has it, it is
    an argument problem the agreement raises on every rank, instead of one
    rank failing while the others wait in the library.
    """
    try:
        fmt = memoryview(flat).format if isinstance(flat, np.ndarray) else flat.dtype.char  # type: ignore[arg-type]  # ndarray is a buffer (numpy's stub: Python 3.12+)
    except (TypeError, ValueError, BufferError):
        fmt = "?unknown"
    known = getattr(MPI, "_typedict", None)
    key = fmt.lstrip(_FORMAT_PREFIX)
    if known is None or key in known:  # (an mpi4py without the table: the library reports it)
        return
    raise TypeError(
        f"{name} has element type {flat.dtype}, which neither mpicomm nor the MPI library moves without a datatype; "
        f"convert it with .astype() to a numeric type, or give the MPI datatype: [{name}, MPI.Datatype]"
    )


def _none_needs_a_datatype(name: str) -> TypeError:
    return TypeError(f"{name} is None with no datatype; None is an empty buffer only with its MPI datatype, "
                     f"e.g. [None, MPI.INT] or [None, 0, MPI.INT]")


def _none_holds_nothing(buf: Any, count: int, name: str) -> None:
    """ValueError when *buf* is None (an empty buffer) but *count* elements are asked of it."""
    if buf is None and count:
        raise ValueError(f"{name} is None, an empty buffer, but its count is {count}; None holds 0 elements - "
                         f"pass a buffer of {count} elements, or count 0")


def _count(value: Any, name: str) -> int:
    value = _scalar(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} count must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} count is {value}; counts are >= 0")
    return int(value)


#: Element types a plain C-contiguous NumPy array may have to be taken as it is (native byte order).
_PLAIN = frozenset(dt for dt in DTYPES if dt.isnative)


def plain(spec: Any) -> Any:
    """*spec* as a flat array when it is a plain NumPy array :func:`simple` takes as it is, else None.

    The common case, checked first by the readers: a C-contiguous
    ``numpy.ndarray`` (not a subclass) of a supported element type in native
    byte order. Its flat view is what ``simple(spec, name).array`` would be.
    """
    if type(spec) is np.ndarray and spec.dtype in _PLAIN and spec.flags.c_contiguous:
        return spec.reshape(-1)
    return None


def simple(spec: Any, name: str) -> Buffer:
    """Read a simple spec (``buf``, ``[buf, count]``, ``[buf, datatype]``, ``[buf, count, datatype]``)."""
    flat = plain(spec)
    if flat is not None:
        return Buffer(flat, np)
    count = datatype = None
    if isinstance(spec, (list, tuple)):
        if len(spec) == 2:
            buf, second = spec
            if isinstance(second, (MPI.Datatype, str)):
                datatype = second
            else:
                count = second
        elif len(spec) == 3:
            buf, count, datatype = spec
            if isinstance(count, (list, tuple)):
                raise Unsupported(f"{name} gives (count, displacement)")
        else:
            raise TypeError(f"{name} spec must be buf, [buf, count], [buf, datatype] or [buf, count, datatype]; "
                            f"got a sequence of {len(spec)}")
        if buf is None and datatype is None:
            raise _none_needs_a_datatype(name)
    else:
        buf = spec
    flat, xp = _typed(buf, datatype, name)
    if count is not None:
        n = _count(count, name)
        _none_holds_nothing(buf, n, name)
        if n > flat.size:
            raise ValueError(f"{name} count {n} is more than the buffer's {flat.size} elements of {flat.dtype}")
        flat = flat[:n]
    return Buffer(flat, xp)


def block_counts(total: int, p: int, name: str) -> tuple[int, ...]:
    """Equal per-rank counts of a buffer of *total* elements (ValueError when p does not divide it)."""
    if p and total % p:
        raise ValueError(f"{name} has {total} elements, not divisible among {p} ranks; give counts explicitly")
    return (total // p if p else 0,) * p


def displacements(counts: Sequence[int]) -> tuple[int, ...]:
    """Where each block starts when blocks of *counts* elements lie back to back (MPI's default for the v forms)."""
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += int(c)
    return tuple(out)


def _is_sequence(x: Any) -> bool:
    return isinstance(x, (Sequence, np.ndarray)) and not isinstance(x, (str, bytes)) \
        and not (isinstance(x, np.ndarray) and x.ndim == 0)


def _scalar(x: Any) -> Any:
    """A 0-d NumPy array as its element (a count or displacement given as ``np.array(3)``, as mpi4py takes it)."""
    return x[()] if isinstance(x, np.ndarray) and x.ndim == 0 else x


def vector(spec: Any, name: str, p: int) -> VBuffer:
    """Read a vector spec (per-rank counts and displacements) for *p* ranks."""
    counts: Any = None
    displs: Any = None
    datatype = None
    if isinstance(spec, (list, tuple)):
        items = list(spec)
        buf, rest = items[0], items[1:]
        if rest and _is_sequence(rest[-1]) and any(isinstance(d, MPI.Datatype) for d in rest[-1]):
            raise Unsupported(f"{name} has one datatype per rank (an Alltoallw spec)")
        # mpi4py's forms: [buf, datatype], [buf, counts], [buf, counts, datatype], [buf, counts, displs, datatype]
        # (counts may be a (counts, displs) pair; a datatype None is inferred from buf); and ours,
        # [buf, counts, displs] where displs is not a datatype
        last_is_type = bool(rest) and isinstance(rest[-1], (MPI.Datatype, str))
        if len(rest) == 3 or last_is_type or (len(rest) == 2 and rest[-1] is None):
            datatype = rest.pop()
        if len(rest) == 1:
            counts = rest[0]
            if isinstance(counts, tuple) and len(counts) == 2:  # mpi4py: a pair is always (counts, displs)
                counts, displs = counts
        elif len(rest) == 2:
            counts, displs = rest
        elif len(rest) > 2:
            raise TypeError(f"{name} spec has {len(spec)} items; use [buf, counts, displs, datatype] at most")
        if buf is None and datatype is None:
            raise _none_needs_a_datatype(name)
    else:
        buf = spec
    flat, xp = _typed(buf, datatype, name)
    if counts is None:
        counts_t = block_counts(flat.size, p, name)
    elif not _is_sequence(counts):
        counts_t = (_count(counts, name),) * p
    else:
        counts_t = tuple(_count(c, name) for c in counts)
    if len(counts_t) != p:
        raise ValueError(f"{name} has {len(counts_t)} counts for {p} ranks; give one per rank")
    _none_holds_nothing(buf, sum(counts_t), name)
    if displs is None:
        displs_t = displacements(counts_t)
    elif not _is_sequence(displs):
        step = _count(displs, name + " displacement")
        displs_t = tuple(r * step for r in range(p))  # mpi4py: rank i's block starts at i·displ
    else:
        displs_t = tuple(_count(d, name + " displacement") for d in displs)
        if len(displs_t) != p:
            raise ValueError(f"{name} has {len(displs_t)} displacements for {p} ranks; give one per rank")
    for r, (c, d) in enumerate(zip(counts_t, displs_t)):
        if d + c > flat.size:
            raise ValueError(
                f"{name} block of rank {r} (elements [{d}, {d + c})) lies outside the buffer's {flat.size} elements"
            )
    return VBuffer(flat, xp, counts_t, displs_t)


def _contiguous_bytes(datatype: Any, name: str, r: int) -> int:
    """The bytes one element of *datatype* (a w-spec's type for block *r*) occupies, when they lie together."""
    if not isinstance(datatype, MPI.Datatype) or datatype == MPI.DATATYPE_NULL:
        raise TypeError(f"{name} datatype of block {r} is {datatype!r}; give an MPI.Datatype per block")
    lb, extent = datatype.Get_extent()
    true_lb, true_extent = datatype.Get_true_extent()
    size = datatype.Get_size()
    if lb != 0 or true_lb != 0 or extent != size or true_extent != size:
        raise Unsupported(f"{name} datatype of block {r} ({datatype.Get_name() or datatype}) is not contiguous")
    return int(size)


def wvector(spec: Any, name: str, p: int) -> VBuffer:
    """Read an Alltoallw spec - ``[buf, (counts, displs), datatypes]`` or ``[buf, counts, displs, datatypes]``,
    one datatype per block, displacements in bytes (counts and displacements both None, or ``[buf, datatypes]``:
    one element of each at displacement 0, as mpi4py reads them) - as bytes: a flat ``uint8`` view of *buf*
    with per-block byte counts and byte displacements. Each block's datatype is honoured by moving its bytes, so a block's
    datatype must be contiguous (a derived type with gaps is the MPI library's: :class:`Unsupported`)."""
    if not isinstance(spec, (list, tuple)) or len(spec) not in (2, 3, 4):
        raise TypeError(f"{name} of an Alltoallw is [buf, (counts, displs), datatypes], "
                        f"[buf, counts, displs, datatypes] or [buf, datatypes]; got {type(spec).__name__}")
    counts: Any
    displs: Any
    if len(spec) == 2:  # mpi4py: one element of each block's datatype, at displacement 0
        buf, types = spec
        counts = displs = None
    elif len(spec) == 3:
        buf, pair, types = spec
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise TypeError(f"{name}: the second item of [buf, (counts, displs), datatypes] must be a "
                            f"(counts, displs) pair")
        counts, displs = pair
    else:
        buf, counts, displs, types = spec
    if buf is MPI.BOTTOM:
        raise Unsupported(f"{name} is MPI.BOTTOM (absolute addresses)")
    if counts is None and displs is None:  # (mpi4py's default: both or neither)
        counts, displs = [1] * p, [0] * p
    if not all(_is_sequence(x) for x in (counts, displs, types)):
        raise TypeError(f"{name}: an Alltoallw spec takes sequences of counts, displacements and datatypes")
    counts_t = tuple(_count(c, name) for c in counts)
    displs_t = tuple(_count(d, name + " displacement") for d in displs)
    types_t = list(types)
    for what, values in (("counts", counts_t), ("displacements", displs_t), ("datatypes", types_t)):
        if len(values) != p:
            raise ValueError(f"{name} has {len(values)} {what} for {p} blocks; give one per block")
    sizes = tuple(c * _contiguous_bytes(t, name, r) if c else 0 for r, (c, t) in enumerate(zip(counts_t, types_t)))
    if buf is None:
        _none_holds_nothing(None, sum(sizes), name)
        return VBuffer(np.empty(0, np.uint8), np, sizes, displs_t)
    flat, xp = _as_array(buf, name)
    raw = flat.view(np.uint8)
    for r, (n, d) in enumerate(zip(sizes, displs_t)):
        if n and d + n > raw.size:
            raise ValueError(f"{name} block {r} (bytes [{d}, {d + n})) lies outside the buffer's {raw.size} bytes")
    return VBuffer(raw, xp, sizes, displs_t)


def block(spec: Any, name: str, p: int) -> tuple[Buffer, int]:
    """Read a block spec (Gather's receive buffer...): ``[buf, count, datatype]`` means *count* per rank.

    Returns the buffer cut to p·count elements, and count. Without a count the
    buffer is split equally (ValueError when p does not divide it).
    """
    count = None
    is_list = isinstance(spec, (list, tuple))
    buf = spec[0] if is_list and spec else spec
    if is_list and len(spec) in (2, 3):
        if len(spec) == 3:
            count = spec[1]
            spec = [buf, spec[2]]
        elif not isinstance(spec[1], (MPI.Datatype, str)):
            if buf is None:
                raise _none_needs_a_datatype(name)
            count = spec[1]
            spec = buf
    whole = simple(spec, name)
    if count is None:
        (per_rank, *_) = block_counts(whole.count, p, name) or (0,)
    else:
        per_rank = _count(count, name)
        _none_holds_nothing(buf, per_rank * p, name)
        if per_rank * p > whole.count:
            raise ValueError(f"{name} holds {whole.count} elements, fewer than {p} ranks × {per_rank}")
    return Buffer(whole.array[: per_rank * p], whole.xp), per_rank


def writable(buffer: Buffer, name: str) -> Buffer:
    """*buffer*, if MPI may write it (ValueError for a read-only one)."""
    if not getattr(buffer.array.flags, "writeable", True):
        raise ValueError(f"{name} is read-only; a receive buffer must be writable (pass a copy)")
    return buffer


def check_disjoint(counts: Sequence[int], displs: Sequence[int], name: str) -> None:
    """ValueError if two ranks' non-empty blocks of receive spec *name* overlap.

    MPI calls overlapping receive blocks erroneous: which rank's data a
    shared element ends with depends on the order messages land, so
    algorithms (and ranks) would disagree on the result.
    """
    blocks = sorted((d, d + c, r) for r, (c, d) in enumerate(zip(counts, displs)) if c)
    for (_, end, r), (start, _, s) in zip(blocks, blocks[1:]):
        if start < end:
            a, b = sorted((r, s))
            raise ValueError(
                f"{name}: the blocks of rank {a} (elements [{displs[a]}, {displs[a] + counts[a]})) and rank {b} "
                f"(elements [{displs[b]}, {displs[b] + counts[b]})) overlap; MPI forbids overlapping receive "
                f"blocks - give displacements that keep them apart"
            )
