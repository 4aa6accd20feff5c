"""PyTorch tensors as mpicomm buffers, and torch's reduce ops as MPI ops.

:class:`Staged` gives mpicomm an array for a tensor without copying when the
tensor is contiguous and of a dtype NumPy (or CuPy) knows: ``t.numpy()`` on
the CPU, the tensor itself on a GPU (mpicomm's buffer layer takes it through
DLPack or the CUDA Array Interface). Otherwise it copies, as PyTorch's own
backends do for what their transports cannot take:

* a non-contiguous tensor is copied to a contiguous one, and results are
  copied back into the caller's tensor when the operation completes;
* ``bfloat16`` moves as its 16-bit pattern (``int16``) and is reduced in
  ``float32`` (rounded back to bfloat16 once, at the end, as gloo does).

:func:`mpi_op` maps a ``torch.distributed.ReduceOp`` to an MPI op, with the
element-wise scaling AVG and PREMUL_SUM need; an op or dtype PyTorch's
contract forbids (BAND on floats, AVG on integers) raises ``ValueError``
naming both, before anything is sent. Like every check here
(:func:`check_tensor`), it raises on the rank that sees the problem; the
process group (:mod:`.group`) turns that into the same
:class:`mpicomm.ArgumentError` on every rank of the call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from mpi4py import MPI

from .. import ops

__all__ = ["Staged", "stage", "finisher", "mpi_op", "Reduction", "check_tensor", "DEVICES"]

#: The device types the backend takes tensors on (CUDA through mpicomm's CuPy paths).
DEVICES = ("cpu", "cuda")

_RED = torch.distributed.ReduceOp  # its SUM... are the RedOpType members (the stubs declare them here)
_BITWISE = {_RED.BAND: MPI.BAND, _RED.BOR: MPI.BOR, _RED.BXOR: MPI.BXOR}
_BOOL = {_RED.SUM: MPI.LOR, _RED.MAX: MPI.LOR, _RED.PRODUCT: MPI.LAND, _RED.MIN: MPI.LAND,
         _RED.BAND: MPI.LAND, _RED.BOR: MPI.LOR, _RED.BXOR: MPI.LXOR}
_PLAIN = {_RED.SUM: MPI.SUM, _RED.AVG: MPI.SUM, _RED.PREMUL_SUM: MPI.SUM, _RED.PRODUCT: MPI.PROD,
          _RED.MIN: MPI.MIN, _RED.MAX: MPI.MAX}
# AVG and PREMUL_SUM run as a sum, scaled on each rank: ops of their own (a sum, under another name and code), so
# the collectives' agreement tells them from SUM and from each other - a rank with AVG among ranks with SUM gets
# the same error everywhere, not a silently different result.
_AVG_SUM = replace(ops.BUILTIN["sum"], name="sum (ReduceOp.AVG)", code=101)
_PREMUL_SUM = replace(ops.BUILTIN["sum"], name="sum (ReduceOp.PREMUL_SUM)", code=102)


def check_tensor(t: Any, what: str) -> torch.Tensor:
    """*t* if it is a tensor on a device the backend takes; else a ``TypeError``/``ValueError`` naming *what*."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"mpicomm backend: {what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type not in DEVICES:
        raise ValueError(f"mpicomm backend: {what} is on device {t.device}; the backend takes CPU and CUDA tensors")
    if t.is_sparse or t.layout != torch.strided:
        raise ValueError(f"mpicomm backend: {what} has layout {t.layout}; only dense (strided) tensors can be sent")
    return t


@dataclass
class Reduction:
    """An MPI op for one dtype, and what to do to the reduced data before it is delivered."""

    op: Any  # an MPI.Op, or an mpicomm op (AVG, PREMUL_SUM)
    scale: float | None = None  # multiply the reduced data by this (AVG: 1/p)
    premul: Any = None  # multiply each rank's input by this before the sum (PREMUL_SUM)


_REDUCTIONS: dict[tuple[int, torch.dtype, int, Any], Reduction] = {}
_PREMUL: int = _RED.PREMUL_SUM.value  # the op's code, as int(op) gives it


def mpi_op(reduce_op: Any, dtype: torch.dtype, size: int) -> Reduction:
    """The MPI op for ``opts.reduceOp`` on tensors of *dtype* in a group of *size* ranks (memoised)."""
    kind = getattr(reduce_op, "op", reduce_op)
    code = int(kind)
    key = (code, dtype, size, getattr(reduce_op, "factor", None) if code == _PREMUL else None)
    try:
        return _REDUCTIONS[key]
    except (KeyError, TypeError):  # TypeError: a factor that is a tensor (not hashable by value)
        pass
    found = _reduction(reduce_op, kind, dtype, size)
    if not isinstance(key[3], torch.Tensor) and len(_REDUCTIONS) < 256:
        _REDUCTIONS[key] = found
    return found


def _reduction(reduce_op: Any, kind: Any, dtype: torch.dtype, size: int) -> Reduction:
    if kind == _RED.PREMUL_SUM:
        factor = getattr(reduce_op, "factor", None)
        if factor is None:
            raise ValueError("mpicomm backend: ReduceOp.PREMUL_SUM without a factor; make it with "
                             "torch.distributed._make_nccl_premul_sum(factor)")
        if not (dtype.is_floating_point or dtype.is_complex):
            raise ValueError(f"mpicomm backend: ReduceOp.PREMUL_SUM needs a floating-point tensor, got {dtype}")
        return Reduction(_PREMUL_SUM, premul=factor)
    if dtype == torch.bool:
        if kind == _RED.AVG:
            raise ValueError("mpicomm backend: ReduceOp.AVG is not defined for bool tensors")
        if kind not in _BOOL:
            raise ValueError(f"mpicomm backend: unsupported reduce op {kind} for bool tensors")
        return Reduction(_BOOL[kind])
    if kind in _BITWISE:
        if dtype.is_floating_point or dtype.is_complex:
            raise ValueError(f"mpicomm backend: ReduceOp.{kind.name} needs an integer tensor, got {dtype}")
        return Reduction(_BITWISE[kind])
    if kind not in _PLAIN:
        raise ValueError(f"mpicomm backend: unsupported reduce op {kind!r}; supported: SUM, AVG, PRODUCT, MIN, MAX, "
                         f"BAND, BOR, BXOR, PREMUL_SUM")
    if dtype.is_complex and kind in (_RED.MIN, _RED.MAX):
        raise ValueError(f"mpicomm backend: ReduceOp.{kind.name} is not defined for complex tensors ({dtype})")
    if kind == _RED.AVG:
        if not (dtype.is_floating_point or dtype.is_complex):
            raise ValueError(f"mpicomm backend: ReduceOp.AVG needs a floating-point tensor, got {dtype} "
                             f"(use SUM and divide, or convert the tensor to float)")
        return Reduction(_AVG_SUM, scale=1.0 / size)
    return Reduction(_PLAIN[kind])


class Staged:
    """An array mpicomm can use for a tensor, and :meth:`finish` to deliver results into the tensor.

    ``Staged(t, reduce=False, output=True)``: *reduce* when the data will be
    combined arithmetically (bfloat16 then goes through float32); *output*
    when the operation writes the tensor (results copied back when staged).
    """

    __slots__ = ("tensor", "work", "array", "output", "_copied")

    def __init__(self, tensor: torch.Tensor, *, reduce: bool = False, output: bool = True):
        self.tensor = tensor
        self.output = output
        work = tensor.detach()
        copied = False
        if work.is_contiguous() and work.dtype != torch.bfloat16:  # the common case: a view, no copy
            self.work, self._copied = work, False
            self.array = work.numpy() if work.device.type == "cpu" else work
            return
        if work.dtype == torch.bfloat16:
            if reduce:
                work, copied = work.float(), True
            else:
                if not work.is_contiguous():
                    work, copied = work.contiguous(), True
                work = work.view(torch.int16)
        elif not work.is_contiguous():
            work, copied = work.contiguous(), True
        self.work = work
        self._copied = copied
        self.array = work.numpy() if work.device.type == "cpu" else work

    @property
    def copied(self) -> bool:
        """True when the array is a copy of the tensor (non-contiguous, or bfloat16 reduced in float32)."""
        return self._copied

    def scale(self, factor: Any) -> None:
        """Multiply the data in place (AVG's 1/p, PREMUL_SUM's factor)."""
        self.work.mul_(factor)

    def finish(self) -> None:
        """Copy the results into the caller's tensor when the array was a copy."""
        if self.output and self._copied:
            with torch.no_grad():
                self.tensor.copy_(self.work.view(self.tensor.dtype) if self.work.dtype == torch.int16
                                  and self.tensor.dtype == torch.bfloat16 else self.work)


def stage(tensors: list[torch.Tensor], what: str, *, reduce: bool = False, output: bool = True) -> list[Staged]:
    """:class:`Staged` for each tensor, after checking each (``what[i]`` in errors)."""
    return [Staged(check_tensor(t, f"{what}[{i}]"), reduce=reduce, output=output) for i, t in enumerate(tensors)]


def finisher(staged: list[Staged], after: Callable[[], None] | None = None) -> Callable[[], None]:
    """One callable that runs *after* (if any), then delivers every staged tensor."""

    def finish() -> None:
        if after is not None:
            after()
        for s in staged:
            s.finish()

    return finish
