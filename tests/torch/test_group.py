"""Each torch.distributed collective through the mpicomm backend against gloo's result on the same inputs.

Data depends on rank and index (tests/torch/conftest.py ``values``); counts 0,
1, p−1, p+1 and large; uneven split sizes; non-contiguous tensors; the
reductions gloo lacks (PREMUL_SUM, uneven all_gather) against a reference
computed from every rank's inputs.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist  # noqa: E402

from .conftest import torch, values

pytestmark = pytest.mark.mpi
R = dist.ReduceOp


def _counts(p: int) -> list[int]:
    return sorted({0, 1, max(p - 1, 0), p + 1, 10007})


def _same(ours, theirs, what):
    assert ours.dtype == theirs.dtype, what
    if ours.dtype.is_floating_point or ours.dtype.is_complex:
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0, msg=what)
    else:
        assert torch.equal(ours, theirs), f"{what}: {ours} != {theirs}"


OPS = [
    (R.SUM, "sum", [torch.float32, torch.float64, torch.int64, torch.int32, torch.complex64, torch.bool,
                    torch.float16, torch.bfloat16]),
    (R.AVG, "sum", [torch.float32, torch.float64]),
    (R.PRODUCT, "product", [torch.float32, torch.int64]),
    (R.MIN, "sum", [torch.float64, torch.int32]),
    (R.MAX, "sum", [torch.float32, torch.int64, torch.bool]),
    (R.BAND, "bits", [torch.int64, torch.uint8]),
    (R.BOR, "bits", [torch.int32]),
    (R.BXOR, "bits", [torch.int64]),
]


@pytest.mark.parametrize("op,kind,dtypes", OPS, ids=[o[0].name if hasattr(o[0], "name") else str(o[0]) for o in OPS])
def test_all_reduce_matches_gloo(groups, op, kind, dtypes):
    ours, gloo = groups
    r, p = dist.get_rank(), dist.get_world_size()
    for dtype in dtypes:
        for n in _counts(p):
            a = values(r, n, dtype, kind)
            b = a.clone()
            dist.all_reduce(a, op=op)
            dist.all_reduce(b, op=op, group=gloo)
            _same(a, b, f"all_reduce {op} {dtype} n={n}")


def test_sync_progress_completes_every_call_before_it_returns(groups, monkeypatch):
    """MPICOMM_TORCH_PROGRESS=sync: every call completes before it returns (nothing left in flight)."""
    from mpicomm.torch import work as work_module

    r = dist.get_rank()
    monkeypatch.setattr(work_module, "SYNC", True)
    t = values(r, 100, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    assert work.is_completed() and work._requests == ()
    (value,) = work.get_future().wait()
    ref = values(r, 100, torch.float32)
    dist.all_reduce(ref, group=groups[1])
    _same(value, ref, "sync progress")
    out = torch.empty(10 * dist.get_world_size())
    gathered = dist.all_gather_into_tensor(out, values(r, 10, torch.float32), async_op=True)
    assert gathered.is_completed() and gathered._requests == ()
    received = dist.broadcast(values(r, 7, torch.int64), 0, async_op=True)
    assert received.is_completed()


def test_the_backend_has_no_thread_of_its_own(groups):
    """Asynchronous work is completed by the core's progress thread: the backend starts none."""
    import threading

    r = dist.get_rank()
    works = [dist.all_reduce(values(r, 1000, torch.float64), async_op=True) for _ in range(3)]
    for w in works:
        w.wait()
    names = {t.name for t in threading.enumerate()}
    assert not any(name.startswith("mpicomm-torch") for name in names), names


def test_blocking_all_reduce_is_remembered_by_address(groups):
    """dist.all_reduce(t) repeated runs its kept plan by the tensor's address, size, dtype and op; another
    tensor at that address, another dtype or op of the same bytes, a strided view: each still correct."""
    ours, gloo = groups
    r, p = dist.get_rank(), dist.get_world_size()
    fast = ours._state.fast
    t = values(r, 64, torch.float32)
    for _ in range(3):
        t.copy_(values(r, 64, torch.float32))
        dist.all_reduce(t)
        _same(t, sum(values(k, 64, torch.float32) for k in range(p)), "repeated all_reduce")
    # (an earlier test's tensor may have had this address too: its entry may be there as well)
    remembered = [k for k in fast if k[0] == "torch-allreduce"]
    assert ("torch-allreduce", t.data_ptr(), 64, torch.float32, 0) in remembered, remembered
    t.copy_(values(r, 64, torch.float32))
    dist.all_reduce(t, op=R.MAX)  # the same address, another op
    _same(t, values(p - 1, 64, torch.float32), "MAX at a remembered address")
    as_int = t.view(torch.int32)  # the same bytes as another dtype
    as_int.copy_(values(r, 64, torch.int32))
    dist.all_reduce(as_int)
    _same(as_int, sum(values(k, 64, torch.int32) for k in range(p)), "int32 view at a remembered address")
    base = values(r, 128, torch.float32)
    dist.all_reduce(base[:64])  # contiguous: remembered
    strided = base[::2]  # the same address and size, not contiguous: never the remembered plan
    strided.copy_(values(r, 64, torch.float32))
    expected = base.clone()
    expected[::2] = sum(values(k, 64, torch.float32) for k in range(p))
    dist.all_reduce(strided)
    _same(base, expected, "strided view at a remembered address")
    for _ in range(3):  # a new tensor each time, likely at a freed one's address
        u = values(r, 33, torch.float64)
        dist.all_reduce(u)
        _same(u, sum(values(k, 33, torch.float64) for k in range(p)), "fresh tensor")
    avg = values(r, 8, torch.float64)  # AVG and PREMUL_SUM take the general path, repeated too
    for _ in range(2):
        avg.copy_(values(r, 8, torch.float64))
        dist.all_reduce(avg, op=R.AVG)
        _same(avg, sum(values(k, 8, torch.float64) for k in range(p)) / p, "AVG")


def test_all_reduce_async_and_noncontiguous(groups):
    ours, gloo = groups
    r = dist.get_rank()
    base = values(r, 60, torch.float64).reshape(6, 10)
    a, b = base.clone().t(), base.clone().t()  # non-contiguous views: results land in the caller's tensor
    c = base.clone()[:, ::3]
    works = [dist.all_reduce(a, async_op=True), dist.all_reduce(c, op=R.MAX, async_op=True)]
    for w in works:
        w.wait()
        assert w.is_completed() and w.is_success()
    dist.all_reduce(b, group=gloo)
    _same(a, b, "async non-contiguous all_reduce")
    # gloo (torch 2.13) returns a partly unreduced result for this strided view: compare with the reference
    p = dist.get_world_size()
    expected = torch.stack([values(k, 60, torch.float64).reshape(6, 10)[:, ::3] for k in range(p)]).amax(0)
    _same(c, expected, "async non-contiguous all_reduce (MAX, strided)")
    fut = dist.all_reduce(values(r, 5, torch.float32), async_op=True).get_future()
    (result,) = fut.wait()
    ref = values(r, 5, torch.float32)
    dist.all_reduce(ref, group=gloo)
    _same(result, ref, "future's value")


def test_premul_sum_against_reference(groups):
    r, p = dist.get_rank(), dist.get_world_size()
    a = values(r, 17, torch.float64)
    dist.all_reduce(a, op=dist._make_nccl_premul_sum(0.5))
    expected = sum(values(k, 17, torch.float64) for k in range(p)) * 0.5
    _same(a, expected, "PREMUL_SUM")


def test_all_reduce_coalesced(groups):
    ours, gloo = groups
    r = dist.get_rank()
    ts = [values(r, n, torch.float32) for n in (3, 0, 1000)]
    ref = [t.clone() for t in ts]
    dist.all_reduce_coalesced(ts)
    dist.all_reduce_coalesced(ref, group=gloo)
    for t, u in zip(ts, ref):
        _same(t, u, "all_reduce_coalesced")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16, torch.bool])
def test_broadcast_and_reduce(groups, dtype):
    ours, gloo = groups
    r, p = dist.get_rank(), dist.get_world_size()
    for root in range(p):
        for n in _counts(p):
            a = values(r, n, dtype)
            b = a.clone()
            dist.broadcast(a, root)
            dist.broadcast(b, root, group=gloo)
            _same(a, b, f"broadcast root {root} n={n}")
            if dtype != torch.bool:
                a, b = values(r, n, dtype), values(r, n, dtype)
                dist.reduce(a, root)
                dist.reduce(b, root, group=gloo)
                if r == root:
                    _same(a, b, f"reduce root {root} n={n}")
                else:  # the other ranks' tensors: unchanged, as the contract promises nothing more
                    _same(a, values(r, n, dtype), f"reduce leaves rank {r} alone")


def test_all_gather_forms(groups):
    ours, gloo = groups
    r, p = dist.get_rank(), dist.get_world_size()
    for n in _counts(p):
        x = values(r, n, torch.float32)
        outs = [torch.empty(n) for _ in range(p)]
        refs = [torch.empty(n) for _ in range(p)]
        dist.all_gather(outs, x)
        dist.all_gather(refs, x, group=gloo)
        for o, f in zip(outs, refs):
            _same(o, f, f"all_gather n={n}")
        big, ref = torch.empty(p * n), torch.empty(p * n)
        dist.all_gather_into_tensor(big, x)
        dist.all_gather_into_tensor(ref, x, group=gloo)
        _same(big, ref, f"all_gather_into_tensor n={n}")
    # uneven sizes (gloo refuses them): rank k contributes k+1 rows of 3
    outs = [torch.empty(k + 1, 3, dtype=torch.int64) for k in range(p)]
    dist.all_gather(outs, values(r, 3 * (r + 1), torch.int64).reshape(r + 1, 3))
    for k in range(p):
        _same(outs[k], values(k, 3 * (k + 1), torch.int64).reshape(k + 1, 3), f"uneven all_gather from {k}")


def test_all_gather_object_and_broadcast_object_list(groups):
    r, p = dist.get_rank(), dist.get_world_size()
    got = [None] * p
    dist.all_gather_object(got, {"rank": r, "payload": "x" * (r * 1000)})
    assert got == [{"rank": k, "payload": "x" * (k * 1000)} for k in range(p)]
    objs = [("root", p - 1), list(range(r + 3))] if r == p - 1 else [None, None]
    dist.broadcast_object_list(objs, src=p - 1)
    assert objs == [("root", p - 1), list(range(p - 1 + 3))]


def test_gather_and_scatter(groups):
    ours, gloo = groups
    r, p = dist.get_rank(), dist.get_world_size()
    for root in range(p):
        for n in (0, 1, p + 1, 5000):
            x = values(r, n, torch.float64)
            outs = [torch.empty(n, dtype=torch.float64) for _ in range(p)] if r == root else None
            refs = [torch.empty(n, dtype=torch.float64) for _ in range(p)] if r == root else None
            dist.gather(x, outs, dst=root)
            dist.gather(x, refs, dst=root, group=gloo)
            if r == root:
                for o, f in zip(outs, refs):
                    _same(o, f, f"gather root {root} n={n}")
            parts = [values(k + 10 * r, n, torch.float64) for k in range(p)] if r == root else None
            a, b = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
            dist.scatter(a, parts, src=root)
            dist.scatter(b, parts, src=root, group=gloo)
            _same(a, b, f"scatter root {root} n={n}")


@pytest.mark.parametrize("op", [R.SUM, R.MAX, R.AVG])
def test_reduce_scatter_forms(groups, op):
    ours, gloo = groups
    r, p = dist.get_rank(), dist.get_world_size()
    for n in _counts(p):
        parts = [values(r + 7 * k, n, torch.float32) for k in range(p)]
        a, b = torch.empty(n), torch.empty(n)
        dist.reduce_scatter(a, parts, op=op)
        dist.reduce_scatter(b, [t.clone() for t in parts], op=op, group=gloo)
        _same(a, b, f"reduce_scatter {op} n={n}")
        flat = torch.cat(parts)
        a, b = torch.empty(n), torch.empty(n)
        dist.reduce_scatter_tensor(a, flat, op=op)
        dist.reduce_scatter_tensor(b, flat.clone(), op=op, group=gloo)
        _same(a, b, f"reduce_scatter_tensor {op} n={n}")


def test_inputs_that_alias_their_outputs_as_fsdp_passes_them(groups):
    """FSDP gathers a shard that lives at its place in the output, and torch allows any aliasing: the result
    must be gloo's (in-place all-gather; a copy of the input elsewhere), not a refusal of overlapping buffers."""
    ours, gloo = groups
    r, p = dist.get_rank(), dist.get_world_size()
    for n in _counts(p):
        if n == 0:
            continue
        big, ref = torch.empty(p * n), torch.empty(p * n)
        big.view(p, n)[r] = values(r, n, torch.float32)
        ref.view(p, n)[r] = values(r, n, torch.float32)
        dist.all_gather_into_tensor(big, big.view(p, n)[r])  # the shard is the output's own block
        dist.all_gather_into_tensor(ref, ref.view(p, n)[r].clone(), group=gloo)
        _same(big, ref, f"in-place all_gather_into_tensor n={n}")
        flat = torch.cat([values(r + 7 * k, n, torch.float32) for k in range(p)])
        expected = torch.empty(n)
        dist.reduce_scatter_tensor(expected, flat.clone(), group=gloo)
        dist.reduce_scatter_tensor(flat[:n], flat)  # the output is the input's first block
        _same(flat[:n], expected, f"aliased reduce_scatter_tensor n={n}")
        x = values(r, p * n, torch.float32)
        want = torch.empty(p * n)
        dist.all_to_all_single(want, x.clone(), group=gloo)
        dist.all_to_all_single(x, x)  # the same tensor in and out
        _same(x, want, f"aliased all_to_all_single n={n}")


def test_all_to_all_forms(groups):
    ours, gloo = groups
    r, p = dist.get_rank(), dist.get_world_size()
    for n in (0, 1, p + 1, 3000):
        x = values(r, n * p, torch.int64)
        a, b = torch.empty(n * p, dtype=torch.int64), torch.empty(n * p, dtype=torch.int64)
        dist.all_to_all_single(a, x)
        dist.all_to_all_single(b, x, group=gloo)
        _same(a, b, f"all_to_all_single n={n}")
    # uneven: rank r sends (r + k) % 3 rows of 4 to rank k
    send_rows = [(r + k) % 3 for k in range(p)]
    recv_rows = [(k + r) % 3 for k in range(p)]
    x = values(r, 4 * sum(send_rows), torch.float32).reshape(-1, 4)
    a, b = torch.empty(sum(recv_rows), 4), torch.empty(sum(recv_rows), 4)
    dist.all_to_all_single(a, x, recv_rows, send_rows)
    dist.all_to_all_single(b, x, recv_rows, send_rows, group=gloo)
    _same(a, b, "all_to_all_single uneven")
    ins = [values(r * p + k, 5, torch.float32) for k in range(p)]
    outs, refs = [torch.empty(5) for _ in range(p)], [torch.empty(5) for _ in range(p)]
    dist.all_to_all(outs, ins)
    dist.all_to_all(refs, ins, group=gloo)
    for o, f in zip(outs, refs):
        _same(o, f, "all_to_all list")
    # uneven tensors (gloo refuses them): rank r sends k+1 elements to rank k
    ins = [values(r * p + k, k + 1, torch.float32) for k in range(p)]
    outs = [torch.empty(r + 1) for _ in range(p)]
    dist.all_to_all(outs, ins)
    for j, o in enumerate(outs):
        _same(o, values(j * p + r, r + 1, torch.float32), f"uneven all_to_all from {j}")


def test_point_to_point(groups):
    r, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        pytest.skip("point-to-point needs 2 ranks")
    right, left = (r + 1) % p, (r - 1) % p
    got = torch.empty(1000, dtype=torch.float64)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, values(r, 1000, torch.float64), right, tag=3),
                                   dist.P2POp(dist.irecv, got, left, tag=3)])
    for q in reqs:
        q.wait()
    _same(got, values(left, 1000, torch.float64), "batch_isend_irecv ring")
    if r == 0:
        for _ in range(1, p):
            t = torch.empty(2, dtype=torch.int64)
            sender = dist.recv(t)  # any source
            _same(t, torch.tensor([sender, sender * 2]), f"recv from any source ({sender})")
    else:
        dist.send(torch.tensor([r, r * 2]), 0)
    if r == 0:
        w = dist.isend(torch.arange(7.0), p - 1)
        w.wait()
    elif r == p - 1:
        t = torch.empty(7)
        dist.irecv(t, 0).wait()
        _same(t, torch.arange(7.0), "isend/irecv")


def test_barrier_and_monitored_barrier(groups):
    dist.barrier()
    dist.barrier(async_op=True).wait()
    # torch.distributed.monitored_barrier is reserved for gloo by PyTorch; the group's own method works
    import datetime

    groups[0].monitored_barrier(datetime.timedelta(seconds=120), True)


def test_new_group_subcommunicator(groups):
    r, p = dist.get_rank(), dist.get_world_size()
    evens = list(range(0, p, 2))
    g = dist.new_group(evens)
    if r in evens:
        t = values(r, 9, torch.float64)
        dist.all_reduce(t, group=g)
        _same(t, sum(values(k, 9, torch.float64) for k in evens), "all_reduce on new_group")
        assert dist.get_world_size(g) == len(evens) and dist.get_rank(g) == evens.index(r)
    dist.destroy_process_group(g)


def test_errors_name_the_problem(groups):
    p = dist.get_world_size()
    with pytest.raises(ValueError, match="BAND needs an integer"):
        dist.all_reduce(torch.ones(3), op=R.BAND)
    with pytest.raises(ValueError, match="AVG needs a floating-point"):
        dist.all_reduce(torch.ones(3, dtype=torch.int64), op=R.AVG)
    with pytest.raises(ValueError, match="times the group size"):
        dist.all_gather_into_tensor(torch.empty(p * 2 + 1), torch.ones(2))
    with pytest.raises(ValueError, match="split_sizes"):
        dist.all_to_all_single(torch.empty(p), torch.ones(p), [1] * p, [p + 5] * p)
    with pytest.raises((ValueError, RuntimeError), match="root|rank|group"):
        dist.broadcast(torch.ones(1), p + 3)
    dist.barrier()


def test_mismatched_counts_raise_on_every_rank(groups):
    """A count that differs across ranks is mpicomm's validation error on every rank, not a hang."""
    r, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        pytest.skip("needs 2 ranks to disagree")
    from mpicomm import ArgumentError

    with pytest.raises(ArgumentError):
        dist.all_reduce(torch.ones(3 + (r == 1)))
    with pytest.raises(ArgumentError):
        dist.all_reduce(torch.ones(3, dtype=torch.float64 if r == 0 else torch.float32))
    dist.barrier()


def _late_last_rank(seconds: float = 0.5) -> None:
    """The last rank arrives *seconds* late: the others' asynchronous calls must not wait for it."""
    import time

    if dist.get_rank() == dist.get_world_size() - 1:
        time.sleep(seconds)


def _needs_progress_thread(p: int) -> None:
    from mpi4py import MPI

    if p == 1:
        pytest.skip("needs a peer that arrives late")
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("the MPI library gives less than MPI_THREAD_MULTIPLE: the core starts no progress thread")


def test_async_work_returns_at_once_and_its_future_completes_without_a_wait(groups):
    """The call returns before a late peer arrives; the future completes on the progress thread (as DDP needs)."""
    from mpi4py import MPI

    r, p = dist.get_rank(), dist.get_world_size()
    _needs_progress_thread(p)
    t = values(r, 1000, torch.float64)
    _late_last_rank(1.0)
    work = dist.all_reduce(t, async_op=True)
    pending = not work.is_completed()
    fut = work.get_future()
    (value,) = fut.wait()  # blocks in C++: only the progress thread can complete it
    if r != p - 1:
        assert pending, "the all-reduce completed before the last rank had called it"
    _same(value, sum(values(k, 1000, torch.float64) for k in range(p)), "future's value")
    assert work.is_completed() and work.is_success()
    MPI.COMM_WORLD.Barrier()


def test_async_future_completes_while_the_caller_sleeps(groups):
    """Nobody waits, tests or calls into the backend: the core's progress thread completes the collective and
    the Work's callback delivers the result (AVG's scaling, a non-contiguous tensor's copy back) and the future."""
    import time

    from mpi4py import MPI

    r, p = dist.get_rank(), dist.get_world_size()
    _needs_progress_thread(p)
    base = values(r, 200, torch.float64).reshape(10, 20)
    t = base.t()  # non-contiguous: staged, copied back by the completion
    _late_last_rank()
    work = dist.all_reduce(t, op=R.AVG, async_op=True)
    fut = work.get_future()
    seen = []
    fut.add_done_callback(lambda f: seen.append(True))
    deadline = time.monotonic() + 60
    while not fut.done() and time.monotonic() < deadline:
        time.sleep(0.01)  # only sleeps: no wait(), no is_completed(), no MPI call
    assert fut.done() and seen, "the future did not complete while the caller slept"
    expected = sum(values(k, 200, torch.float64) for k in range(p)).reshape(10, 20) / p
    (value,) = fut.value()
    _same(base, expected, "AVG all_reduce delivered by the completion")
    _same(value, expected.t(), "future's value")
    assert work.is_completed() and work.is_success()
    MPI.COMM_WORLD.Barrier()


def test_a_collective_chained_from_a_future_callback_runs(groups):
    """A future's callback that starts an asynchronous collective (as DDP's PowerSGD hook does) runs where the
    collective completed - often the progress thread - and queues the new one behind what the group issued."""
    import time

    from mpi4py import MPI

    r, p = dist.get_rank(), dist.get_world_size()
    _needs_progress_thread(p)
    _late_last_rank()
    fut = dist.all_reduce(values(r, 10, torch.float64), async_op=True).get_future()
    ones = torch.ones(3)
    chained = fut.then(lambda f: dist.all_reduce(ones, async_op=True).get_future()).wait()
    deadline = time.monotonic() + 60
    while not chained.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    chained.wait()
    _same(ones, torch.full((3,), float(p)), "the chained all_reduce")
    t = torch.ones(3)
    dist.all_reduce(t)
    _same(t, torch.full((3,), float(p)), "all_reduce after the chained one")
    MPI.COMM_WORLD.Barrier()


def test_point_to_point_future_completes_without_a_wait(groups):
    """A receive whose future is asked for is handed to the core's progress thread."""
    import time

    from mpi4py import MPI

    r, p = dist.get_rank(), dist.get_world_size()
    _needs_progress_thread(p)
    if r == 0:
        got = torch.empty(50, dtype=torch.int64)
        work = dist.irecv(got, p - 1, tag=9)
        fut = work.get_future()
        deadline = time.monotonic() + 60
        while not fut.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fut.done()
        _same(got, torch.arange(50) * 3, "irecv's future")
        work.wait()
    elif r == p - 1:
        time.sleep(0.3)
        dist.send(torch.arange(50) * 3, 0, tag=9)
    MPI.COMM_WORLD.Barrier()


def test_coalesced_async_work_completes_when_every_part_has(groups):
    ours, gloo = groups
    r, p = dist.get_rank(), dist.get_world_size()
    ins = [values(r, n, torch.float32) for n in (4, 100)]
    outs = [torch.empty(p * n) for n in (4, 100)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for o, i in zip(outs, ins):
        ref = torch.empty_like(o)
        dist.all_gather_into_tensor(ref, i, group=gloo)
        _same(o, ref, "coalesced all_gather_into_tensor")


@pytest.mark.mpi
@pytest.mark.gpu
def test_the_default_group_binds_the_ranks_gpu(groups):
    """Making the default group bound this rank's GPU (local rank % visible GPUs) for CuPy and torch alike."""
    from mpicomm.torch import world_comm
    from tests.conftest import cupy_or_skip

    cupy = cupy_or_skip()
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    comm = world_comm()
    assert torch.cuda.current_device() == comm.device == cupy.cuda.Device().id


# ---------------------------------------------------------------- reproducible sums


def _wide(rank: int, n: int):
    """Rank- and index-dependent float64 values over 2**±40, both signs: their sum depends on its order."""
    import numpy as np

    g = np.random.default_rng(rank + 5)
    return g.standard_normal(n) * np.exp2(g.integers(-40, 40, n))


def test_a_reproducible_group_sums_to_the_serial_sums_bits(groups):
    """``pg_options={"reproducible": True}``: all_reduce (blocking and async, SUM and AVG) and
    reduce_scatter_tensor give the bits of mpicomm.reproducible.sum_of of every rank's tensor; float16, which
    has no reproducible sum, is refused on every rank."""
    import numpy as np

    import mpicomm
    from mpicomm import reproducible

    r, p = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="mpicomm", pg_options={"reproducible": True})
    for n in _counts(p):
        want = reproducible.sum_of([_wide(k, n) for k in range(p)]) if n else np.zeros(0)
        t = torch.tensor(_wide(r, n))
        dist.all_reduce(t, group=group)
        assert t.cpu().numpy().tobytes() == want.tobytes(), n
        t = torch.tensor(_wide(r, n))
        dist.all_reduce(t, group=group, async_op=True).wait()
        assert t.cpu().numpy().tobytes() == want.tobytes(), n
        t = torch.tensor(_wide(r, n))
        dist.all_reduce(t, op=R.AVG, group=group)
        assert t.cpu().numpy().tobytes() == (torch.tensor(want) * (1.0 / p)).cpu().numpy().tobytes(), n
        out = torch.empty(n, dtype=torch.float64)
        dist.reduce_scatter_tensor(out, torch.tensor(np.concatenate([_wide(r, n)] * p)), group=group)
        assert out.cpu().numpy().tobytes() == want.tobytes(), n
    with pytest.raises(mpicomm.ArgumentError, match="op SUM on float32, float64"):
        dist.all_reduce(torch.ones(4, dtype=torch.float16), group=group)
    t = torch.ones(3, dtype=torch.int64)
    dist.all_reduce(t, group=group)  # (integers: exact already, the ordinary sum)
    assert t.tolist() == [p] * 3


def test_pg_options_name_what_they_take():
    from mpicomm.torch import _reproducible

    assert _reproducible(None, True) is True
    assert _reproducible({"reproducible": True}, False) is True
    with pytest.raises(ValueError, match=r"unknown pg_options \['fast'\]; known: reproducible"):
        _reproducible({"fast": True}, False)
    with pytest.raises(TypeError, match="True or False"):
        _reproducible({"reproducible": "yes"}, False)
    with pytest.raises(TypeError, match="pass pg_options="):
        _reproducible(["reproducible"], False)
