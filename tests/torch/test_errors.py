"""Argument errors that one rank alone can see raise the same error on every rank, and the group keeps working.

A problem only one rank's arguments show (a list of the wrong length, an op
its dtype has not, a tensor on a device the backend does not take, a root
outside the group, the root's gather or scatter list, split sizes that do not
add up) must not raise on that rank alone while its peers wait in the
collective - or pair their call with its next one. Each test makes one rank
(the *victim*, the last) wrong, runs the call on every rank, gathers every
rank's outcome with a plain mpi4py all-gather (so every rank decides alike)
and checks that:

* every rank raised an :class:`mpicomm.ArgumentError`;
* its message is the same on every rank, names the victim (``rank v:``) and
  the problem;
* a collective on the same group afterwards gives the right result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch.distributed as dist  # noqa: E402
from mpi4py import MPI

from mpicomm import ArgumentError  # noqa: E402

from .conftest import torch, values

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(60)]
R = dist.ReduceOp
WORLD = MPI.COMM_WORLD


def _victim() -> int:
    return dist.get_world_size() - 1


def _outcome(call: Callable[[], Any]) -> tuple[str, bool, str] | None:
    try:
        work = call()
        if work is not None and hasattr(work, "wait"):
            work.wait()
    except Exception as exc:  # noqa: BLE001 - gathered below, so every rank decides alike
        return type(exc).__name__, isinstance(exc, ArgumentError), str(exc)
    return None


def _group_works() -> None:
    """A collective on the group after the error: the right result on every rank."""
    r, p = dist.get_rank(), dist.get_world_size()
    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), p * (p + 1) / 2)), t
    outs = [torch.empty(2, dtype=torch.int64) for _ in range(p)]
    dist.all_gather(outs, torch.tensor([r, 7 * r]), async_op=True).wait()
    assert [o.tolist() for o in outs] == [[k, 7 * k] for k in range(p)], outs


def _raises_alike(call: Callable[[], Any], *fragments: str, victim: int | None = None) -> str:
    """Run *call* on every rank: every rank must raise the same ArgumentError naming the victim and
    *fragments*; then the group must still work. Returns the message."""
    victim = _victim() if victim is None else victim
    errors = WORLD.allgather(_outcome(call))
    assert all(e is not None for e in errors), f"an error on some ranks only: {errors}"
    assert all(e[1] for e in errors), f"not ArgumentErrors: {errors}"
    messages = {e[2] for e in errors}
    assert len(messages) == 1, f"different messages: {errors}"
    message = messages.pop()
    assert f"rank {victim}: " in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    _group_works()
    return message


# ------------------------------------------------------------ the cases


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_all_gather_list_of_the_wrong_length_on_one_rank(groups, async_op):
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    outs = [torch.empty(3) for _ in range(p + (r == v))]
    _raises_alike(lambda: dist.all_gather(outs, torch.ones(3), async_op=async_op),
                  f"all_gather output list has {p + 1} tensors")


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_band_on_float32_on_one_rank_int64_on_the_others(groups, async_op):
    r, v = dist.get_rank(), _victim()
    t = torch.ones(4, dtype=torch.float32 if r == v else torch.int64)
    _raises_alike(lambda: dist.all_reduce(t, op=R.BAND, async_op=async_op), "BAND needs an integer tensor")


def test_band_on_float32_on_one_rank_while_the_others_repeat_a_remembered_call(groups):
    """The peers' call is the remembered blocking all-reduce (the core's fast path, run by address); the
    victim's op check fails on its own fast path: still the same error everywhere."""
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    t = torch.ones(6, dtype=torch.int64)
    f = torch.ones(6, dtype=torch.float32)
    for _ in range(2):
        dist.all_reduce(t, op=R.BAND)
    _raises_alike(lambda: dist.all_reduce(f if r == v else t, op=R.BAND), "BAND needs an integer tensor")
    t.fill_(r + 1)
    dist.all_reduce(t)
    assert t.tolist() == [p * (p + 1) // 2] * 6


def test_avg_on_integers_on_one_rank(groups):
    r, v = dist.get_rank(), _victim()
    t = torch.ones(3, dtype=torch.int32 if r == v else torch.float32)
    _raises_alike(lambda: dist.all_reduce(t, op=R.AVG), "AVG needs a floating-point tensor")


META = [  # (name, call(t, p) with t(n) the rank's tensor of n elements, what the error names)
    ("all_reduce", lambda t, p: dist.all_reduce(t(3)), "all_reduce tensor[0]"),
    ("broadcast", lambda t, p: dist.broadcast(t(3), 0), "broadcast tensor[0]"),
    ("reduce", lambda t, p: dist.reduce(t(3), 0), "reduce tensor[0]"),
    ("all_gather_into_tensor", lambda t, p: dist.all_gather_into_tensor(torch.empty(3 * p), t(3)),
     "all_gather_into_tensor input"),
    ("reduce_scatter_tensor", lambda t, p: dist.reduce_scatter_tensor(torch.empty(3), t(3 * p)),
     "reduce_scatter_tensor input"),
    ("all_to_all_single", lambda t, p: dist.all_to_all_single(torch.empty(3 * p), t(3 * p)),
     "all_to_all_single input"),
    ("all_gather", lambda t, p: dist.all_gather([torch.empty(3) for _ in range(p)], t(3)), "all_gather input"),
]


@pytest.mark.parametrize("name,call,what", META, ids=[m[0] for m in META])
def test_tensor_on_an_unsupported_device_on_one_rank(groups, name, call, what):
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    _raises_alike(lambda: call(lambda n: torch.empty(n, device="meta") if r == v else torch.ones(n), p),
                  f"{what} is on device meta")


def test_tensor_on_an_unsupported_device_async(groups):
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    t = torch.empty(3, device="meta") if r == v else torch.ones(3)
    _raises_alike(lambda: dist.all_reduce(t, async_op=True), "is on device meta")
    _raises_alike(lambda: dist.all_gather_into_tensor(torch.empty(3 * p), t, async_op=True), "is on device meta")


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_a_tensor_numpy_cannot_view_on_one_rank(groups, async_op):
    """Not only the backend's own checks: a conjugate view (NumPy refuses it) on one rank, on the blocking
    all-reduce's fast path and on the general path. (Called on the group: ``dist.all_reduce`` itself refuses a
    conjugate view on that rank, before the backend is called.)"""
    r, v = dist.get_rank(), _victim()
    t = torch.ones(3, dtype=torch.complex64)
    _raises_alike(lambda: _pg().allreduce([t.conj() if r == v else t], _opts("AllreduceOptions", async_op)),
                  "conjugate bit")


ROOTS = [
    ("broadcast", lambda root, r, p: dist.broadcast(torch.ones(3), root)),
    ("reduce", lambda root, r, p: dist.reduce(torch.ones(3), root)),
    ("gather", lambda root, r, p: dist.gather(torch.ones(3), [torch.empty(3) for _ in range(p)] if r == root
                                              else None, dst=root)),
    ("scatter", lambda root, r, p: dist.scatter(torch.empty(3), [torch.ones(3) for _ in range(p)] if r == root
                                                else None, src=root)),
]


@pytest.mark.parametrize("name,call", ROOTS, ids=[c[0] for c in ROOTS])
def test_root_outside_the_group_on_one_rank(groups, name, call):
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    root = p + 3 if r == v else 0
    _raises_alike(lambda: call(root, r, p), f"{name} root {p + 3} is not a rank of this group")


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_gather_list_wrong_at_the_root_only(groups, async_op):
    """(PyTorch itself checks the dtypes of the root's list, on the root alone, before the backend is called.)"""
    r, p = dist.get_rank(), dist.get_world_size()
    root = 0
    x = values(r, 4, torch.float32)
    for outs, fragment in (([torch.empty(4) for _ in range(p + 1)], f"gather output list has {p + 1} tensors"),
                           ([torch.empty(4) for _ in range(p - 1)] + [torch.empty(4, device="meta")],
                            f"gather output[{p - 1}] is on device meta"),
                           ([torch.empty(4) for _ in range(p - 1)] + [torch.empty(5)],
                            f"gather output[{p - 1}] has 5 elements")):
        if p == 1 and "elements" in fragment:
            continue  # (one rank: its own block must match its input, a different check)
        _raises_alike(lambda outs=outs: dist.gather(x, outs if r == root else None, dst=root, async_op=async_op),
                      fragment, victim=root)
    outs = [torch.empty(4) for _ in range(p)] if r == root else None
    dist.gather(x, outs, dst=root)
    if r == root:
        assert all(torch.equal(o, values(k, 4, torch.float32)) for k, o in enumerate(outs))


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_scatter_list_wrong_at_the_root_only(groups, async_op):
    r, p = dist.get_rank(), dist.get_world_size()
    root = p - 1
    for parts, fragment in (([torch.ones(4) for _ in range(p + 1)], f"one list of {p} tensors"),
                            ([torch.ones(4).to_sparse() for _ in range(p)], "scatter input[0] has layout"),
                            ([torch.ones(4) for _ in range(p - 1)] + [torch.empty(4, device="meta")],
                             f"scatter input[{p - 1}] is on device meta")):
        _raises_alike(lambda parts=parts: dist.scatter(torch.empty(4), parts if r == root else None, src=root,
                                                       async_op=async_op), fragment, victim=root)
    out = torch.empty(4)
    dist.scatter(out, [values(k, 4, torch.float32) for k in range(p)] if r == root else None, src=root)
    assert torch.equal(out, values(r, 4, torch.float32))


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_all_to_all_single_split_sizes_wrong_on_one_rank(groups, async_op):
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    splits = [1] * p
    bad = [2] + [1] * (p - 1) if r == v else splits  # sums to p + 1: not the input's p rows
    x = values(r, 2 * p, torch.float32).reshape(p, 2)
    _raises_alike(lambda: dist.all_to_all_single(torch.empty(p, 2), x, splits, bad, async_op=async_op),
                  "input_split_sizes", f"summing to the input's {p} rows")
    out = torch.empty(p, 2)
    dist.all_to_all_single(out, x, splits, splits)
    assert torch.equal(out, torch.stack([values(k, 2 * p, torch.float32).reshape(p, 2)[r] for k in range(p)]))


def test_all_to_all_single_even_size_wrong_on_one_rank(groups):
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    if p == 1:
        pytest.skip("every size divides by one rank")
    n = 2 * p + (r == v)
    _raises_alike(lambda: dist.all_to_all_single(torch.empty(n), torch.ones(n)),
                  f"divisible by the group size {p}")


def test_reduce_scatter_list_wrong_on_one_rank(groups):
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    parts = [torch.ones(3) for _ in range(p + (r == v))]
    _raises_alike(lambda: dist.reduce_scatter(torch.empty(3), parts), f"has {p + 1} tensors")


def test_all_to_all_list_wrong_on_one_rank(groups):
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    ins = [torch.empty(2, device="meta") if r == v and k == 0 else torch.ones(2) for k in range(p)]
    _raises_alike(lambda: dist.all_to_all([torch.empty(2) for _ in range(p)], ins),
                  "all_to_all input[0] is on device meta")


# ------------------------------------------------------------ the process group's methods, called directly

def _async_param() -> Any:
    """Both forms; the asynchronous one queues the peers' later calls behind the refused one (each must still
    run on the communicator's fresh tags)."""
    return pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])


def _pg():
    return dist.group.WORLD


def _opts(name: str, async_op: bool, **fields: Any) -> Any:
    opts = getattr(torch._C._distributed_c10d, name)()
    opts.asyncOp = async_op
    for k, val in fields.items():
        setattr(opts, k, val)
    return opts


@_async_param()
def test_a_tensor_list_with_a_bad_tensor_on_one_rank(groups, async_op):
    """Two tensors in one call (two mpicomm calls on the peers): the victim refuses both when asynchronous."""
    r, v = dist.get_rank(), _victim()
    tensors = [torch.ones(3), torch.empty(3, device="meta") if r == v else torch.ones(3)]
    _raises_alike(lambda: _pg().allreduce(tensors, _opts("AllreduceOptions", async_op)),
                  "all_reduce tensor[1] is on device meta")


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_coalesced_gathers_with_one_bad_part_on_one_rank(groups, async_op):
    """The last part is bad on one rank; then the first (the good parts queued behind the refused one)."""
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    ins = [torch.ones(2), torch.ones(2), torch.empty(2, device="meta") if r == v else torch.ones(2)]
    outs = [torch.empty(2 * p) for _ in ins]
    _raises_alike(lambda: _pg().allgather_into_tensor_coalesced(outs, ins, _opts("AllgatherOptions", async_op)),
                  "all_gather_into_tensor input is on device meta")
    assert all(torch.equal(o, torch.ones(2 * p)) for o in outs[:2]), outs  # the good parts completed
    ins = [torch.empty(2, device="meta") if r == v else torch.ones(2), torch.ones(2)]
    _raises_alike(lambda: _pg().allgather_into_tensor_coalesced(outs[:2], ins, _opts("AllgatherOptions", async_op)),
                  "all_gather_into_tensor input is on device meta")


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_coalesced_all_gathers_of_lists_with_one_bad_part_on_one_rank(groups, async_op):
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    ins = [torch.ones(2), torch.ones(3 + (r == v))]  # the last part: another size on one rank's own list
    outs = [[torch.empty(2) for _ in range(p)], [torch.empty(3) for _ in range(p)]]
    _raises_alike(lambda: _pg().allgather_coalesced(outs, ins, _opts("AllgatherOptions", async_op)),
                  f"all_gather input has 4 elements but output[{v}] has 3")
    assert all(torch.equal(o, torch.ones(2)) for o in outs[0]), outs[0]


@_async_param()
def test_coalesced_lists_of_different_lengths_on_one_rank(groups, async_op):
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    outs = [torch.empty(2 * p) for _ in range(3)]
    short = outs[:2] if r == v else outs
    _raises_alike(lambda: _pg().allgather_into_tensor_coalesced(short, [torch.ones(2)] * 3,
                                                                _opts("AllgatherOptions", async_op)),
                  "takes as many outputs as inputs, got 2 and 3")


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_coalesced_reduce_scatters_with_one_bad_part_on_one_rank(groups, async_op):
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    ins = [torch.ones(2 * p + (r == v)), torch.ones(2 * p)]  # the bad part first: the good one queued behind it
    outs = [torch.empty(2), torch.empty(2)]
    _raises_alike(lambda: _pg().reduce_scatter_tensor_coalesced(outs, ins, _opts("ReduceScatterOptions", async_op)),
                  "reduce_scatter_tensor input has")


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_all_reduce_coalesced_with_mixed_dtypes_on_one_rank(groups, async_op):
    r, v = dist.get_rank(), _victim()
    tensors = [torch.ones(2), torch.ones(3, dtype=torch.float64 if r == v else torch.float32)]
    _raises_alike(lambda: _pg().allreduce_coalesced(tensors, _opts("AllreduceCoalescedOptions", async_op)),
                  "all_reduce_coalesced mixes dtypes")


# ------------------------------------------------------------ what stays local


def test_without_validation_a_local_problem_raises_on_its_rank(groups, monkeypatch):
    """MPICOMM_VALIDATE=0: no agreement, the problem itself raises at once (every rank has it here, so nobody
    waits)."""
    p = dist.get_world_size()
    monkeypatch.setenv("MPICOMM_VALIDATE", "0")
    with pytest.raises(ValueError, match="output list has") as info:
        dist.all_gather([torch.empty(3) for _ in range(p + 1)], torch.ones(3))
    assert not isinstance(info.value, ArgumentError)
    with pytest.raises(ValueError, match="on device meta") as info:
        dist.all_reduce(torch.empty(3, device="meta"), async_op=True)
    assert not isinstance(info.value, ArgumentError)
    monkeypatch.delenv("MPICOMM_VALIDATE")
    _group_works()


def test_point_to_point_errors_are_the_callers_own(groups):
    """send/recv have no agreement: a bad destination raises on the calling rank, before anything is posted."""
    p = dist.get_world_size()
    with pytest.raises(ValueError, match="send destination root") as info:
        _pg().send([torch.ones(2)], p + 2, 0)
    assert not isinstance(info.value, ArgumentError)
    with pytest.raises(ValueError, match="is on device meta"):
        _pg().recv([torch.empty(2, device="meta")], 0, 0)
    _group_works()


def test_the_same_problem_on_every_rank_names_them_all(groups):
    p = dist.get_world_size()
    message = _raises_alike(lambda: dist.all_reduce(torch.ones(3), op=R.BAND), "BAND needs an integer tensor",
                            victim=0)
    if p > 1:
        assert "the same on rank(s)" in message, message


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
@pytest.mark.parametrize("mine", ["AVG", "PREMUL_SUM"])
def test_avg_or_premul_sum_among_sums_raises_on_every_rank(groups, async_op, mine):
    """AVG and PREMUL_SUM are sums in the core, scaled on each rank: one rank asking for it while the others sum
    must be the same error everywhere, not a result that differs silently."""
    r, p, v = dist.get_rank(), dist.get_world_size(), _victim()
    if p == 1:
        pytest.skip("needs 2 ranks to disagree")
    ops = {"AVG": R.AVG, "PREMUL_SUM": dist._make_nccl_premul_sum(2.0)}
    op = ops[mine] if r == v else R.SUM
    t = torch.ones(5, dtype=torch.float64)
    errors = WORLD.allgather(_outcome(lambda: _pg().allreduce([t], _opts("AllreduceOptions", async_op, reduceOp=op))))
    assert all(e is not None and e[1] for e in errors), errors
    assert len({e[2] for e in errors}) == 1, errors
    assert "ranks disagree on the op" in errors[0][2] and f"ReduceOp.{mine}) on rank(s) {v}" in errors[0][2], errors
    t = torch.ones(5, dtype=torch.float64)
    dist.all_reduce(t, op=R.AVG)  # alike on every rank: fine
    assert torch.equal(t, torch.ones(5, dtype=torch.float64))
