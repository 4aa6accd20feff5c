"""mpicomm.torch.tensors: tensors as arrays without copies where possible, and torch's ops as MPI ops (no MPI job)."""

from __future__ import annotations

import pytest
import torch.distributed as dist  # noqa: E402
from mpi4py import MPI

import mpicomm
from mpicomm.torch.tensors import Staged, check_tensor, mpi_op

from .conftest import torch

pytestmark = pytest.mark.serial
R = dist.ReduceOp


def test_contiguous_tensors_are_views():
    t = torch.arange(6, dtype=torch.float32)
    s = Staged(t)
    assert not s.copied and s.array.ctypes.data == t.data_ptr()
    s.array[0] = 42
    assert t[0] == 42


def test_non_contiguous_and_bfloat16_are_staged_and_written_back():
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    t = base.t()
    s = Staged(t)
    assert s.copied and s.array.flags.c_contiguous
    s.array[:] = -1
    s.finish()
    assert (base == -1).all()
    b = torch.arange(4, dtype=torch.bfloat16)
    moved = Staged(b)  # moved bit for bit: an int16 view, no copy
    assert not moved.copied and moved.array.dtype.itemsize == 2
    reduced = Staged(b, reduce=True)  # reduced in float32, rounded back once
    assert reduced.copied and reduced.array.dtype.name == "float32"
    reduced.array *= 2
    reduced.finish()
    assert torch.equal(b, torch.arange(4, dtype=torch.bfloat16) * 2)
    unchanged = Staged(torch.arange(8.0)[::2], output=False)
    assert unchanged.copied
    unchanged.array[:] = 0
    unchanged.finish()  # an input only: nothing written back
    assert unchanged.tensor.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_ops_map_to_mpi_with_their_scaling():
    assert mpi_op(R.SUM, torch.float32, 4).op == MPI.SUM
    avg = mpi_op(R.AVG, torch.float64, 4)
    # AVG and PREMUL_SUM: a sum under an op of its own, so the agreement tells them from SUM across ranks
    assert avg.op.mpi == MPI.SUM and avg.op.ufunc == "add" and avg.scale == 0.25
    assert avg.op.code not in {mpicomm.ops.BUILTIN["sum"].code, mpi_op(dist._make_nccl_premul_sum(2.0),
                                                                        torch.float32, 2).op.code}
    assert mpi_op(R.BAND, torch.int64, 2).op == MPI.BAND
    assert mpi_op(R.SUM, torch.bool, 2).op == MPI.LOR and mpi_op(R.MIN, torch.bool, 2).op == MPI.LAND
    premul = mpi_op(dist._make_nccl_premul_sum(3.0), torch.float32, 2)
    assert premul.op.mpi == MPI.SUM and premul.premul == 3.0


@pytest.mark.parametrize("op,dtype,message", [
    (R.BAND, torch.float32, "BAND needs an integer tensor"),
    (R.AVG, torch.int32, "AVG needs a floating-point tensor"),
    (R.MAX, torch.complex64, "not defined for complex"),
    (R.AVG, torch.bool, "AVG is not defined for bool"),
])
def test_forbidden_op_dtype_pairs_name_both(op, dtype, message):
    with pytest.raises(ValueError, match=message):
        mpi_op(op, dtype, 2)


def test_check_tensor_refuses_what_cannot_be_sent():
    with pytest.raises(TypeError, match="must be a torch.Tensor, got list"):
        check_tensor([1, 2], "all_reduce tensor[0]")
    with pytest.raises(ValueError, match="layout"):
        check_tensor(torch.eye(3).to_sparse(), "x")
    with pytest.raises(ValueError, match="device meta"):
        check_tensor(torch.empty(3, device="meta"), "x")
