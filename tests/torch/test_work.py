"""mpicomm.torch.work and the assumptions the backend's remembered path makes about torch (no MPI job)."""

from __future__ import annotations

import pytest
import torch.distributed as dist  # noqa: E402

from mpicomm import config
from mpicomm.torch.work import Work, done

from .conftest import torch

pytestmark = pytest.mark.serial
R = dist.ReduceOp


@pytest.mark.parametrize("value,expected", [(None, "async"), ("async", "async"), ("auto", "async"),
                                            ("thread", "async"), (" SYNC ", "sync")])
def test_progress_setting(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("MPICOMM_TORCH_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("MPICOMM_TORCH_PROGRESS", value)
    assert config.torch_progress() == expected


def test_progress_setting_names_a_bad_value(monkeypatch):
    monkeypatch.setenv("MPICOMM_TORCH_PROGRESS", "spin")
    with pytest.raises(ValueError, match="MPICOMM_TORCH_PROGRESS='spin'.*async, sync"):
        config.torch_progress()


def test_reduce_op_hash_is_its_code():
    """The blocking all-reduce keys its remembered calls by ``hash(opts.reduceOp)``: the op's code, distinct
    per op (PREMUL_SUM's factor is not in it: that op is never remembered)."""
    codes = {}
    for op in (R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR):
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        codes[op] = hash(opts.reduceOp)
        assert codes[op] == int(op)
    assert len(set(codes.values())) == len(codes)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist._make_nccl_premul_sum(2.0)
    assert hash(opts.reduceOp) == int(R.PREMUL_SUM)


def test_a_completed_work():
    t = torch.ones(3)
    work = done([t], "allreduce")
    assert isinstance(work, Work) and isinstance(work, dist.Work)
    assert work.wait() and work.is_completed() and work.is_success() and work.exception() is None
    assert work.result() == [t]
    fut = work.get_future()
    assert fut.done() and fut.value() == [t] and work.get_future() is fut
    assert "completed" in repr(work)
