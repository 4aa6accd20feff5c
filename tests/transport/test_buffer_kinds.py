"""Every kind of buffer mpi4py accepts, through mpicomm: zero-copy, with mpi4py's meaning, results in the caller's object.

Kinds: NumPy arrays, ``array.array``, ``bytearray``, an object that exports
only DLPack (as PyTorch CPU tensors and JAX arrays do), PyTorch tensors when
PyTorch is installed, and objects exporting ``__cuda_array_interface__``
(refused with the kind and the fix when CuPy is missing). Each kind goes
through every collective, in place and out of place, and through push and
pull; every result is compared with mpi4py's own communicator on NumPy copies.
"""

from __future__ import annotations

import array
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from mpicomm.transport.buffers import adopt

from ..coll.reference import assert_matches, data

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
HAVE_TORCH = importlib.util.find_spec("torch") is not None


class DLPackOnly:
    """An array that speaks only DLPack (no buffer protocol, no __array__), like a tensor of another library."""

    def __init__(self, a: np.ndarray):
        self._a = a

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._a.__dlpack_device__()

    def values(self) -> np.ndarray:
        return self._a


class FakeCUDA:
    """Something that claims to be GPU memory through __cuda_array_interface__."""

    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f8", "data": (0, False), "version": 3}


def _kinds() -> dict[str, tuple[Callable[[np.ndarray], Any], Callable[[Any], np.ndarray]]]:
    """name → (wrap a float64 NumPy array as that kind, read the kind's values back as NumPy)."""
    kinds = {
        "numpy": (lambda a: a, lambda b: b),
        "array.array": (lambda a: array.array("d", a.tolist()), lambda b: np.frombuffer(b, np.float64)),
        "bytearray": (lambda a: bytearray(a.tobytes()), lambda b: np.frombuffer(b, np.float64)),
        "dlpack-only": (lambda a: DLPackOnly(a.copy()), lambda b: b.values()),
    }
    if HAVE_TORCH:
        import torch

        kinds["torch"] = (lambda a: torch.from_numpy(a.copy()), lambda b: b.numpy())
    return kinds


KINDS = _kinds()


def _spec(kind: str, buf: Any) -> Any:
    """A bytearray carries bytes: give mpi4py's spec form with the element type, as a user would."""
    return [buf, MPI.DOUBLE] if kind == "bytearray" else buf


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("collective", ["allreduce", "bcast", "reduce", "allgather", "alltoall",
                                        "reduce_scatter_block", "gather", "scatter", "scan", "exscan"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_every_collective_takes_every_kind(comm, kind, collective, in_place):
    if in_place and collective == "bcast":
        pytest.skip("a broadcast is in place by nature")
    rank, p = comm.Get_rank(), comm.Get_size()
    wrap, read = KINDS[kind]
    n, root = 3, p - 1
    big = n * p
    rooted = collective in ("reduce", "gather", "scatter")
    ip = in_place and (not rooted or rank == root)  # MPI: only the root of a rooted collective is in place
    sizes = {"allgather": (n, big), "alltoall": (big, big), "reduce_scatter_block": (big, big if ip else n),
             "gather": (n, big), "scatter": (big, n)}
    ns, nr = sizes.get(collective, (n, n))
    send_values = data(rank, ns, np.float64)
    initial = np.full(nr, -1.0)
    if ip and collective in ("allgather", "gather"):
        initial[rank * n:(rank + 1) * n] = send_values
    elif ip and collective != "scatter":
        initial = send_values.copy()
    send, recv = wrap(send_values.copy()), wrap(initial.copy())
    ref_send, ref_recv = send_values.copy(), initial.copy()
    ours, native = _calls(comm, collective, root, ip, _spec(kind, send), _spec(kind, recv), ref_send, ref_recv)
    ours()
    native()
    if collective == "bcast":
        assert_matches(read(send), data(root, n, np.float64), f"bcast into {kind}")
        return
    if (collective in ("reduce", "gather") and rank != root) or (collective == "exscan" and rank == 0):
        return  # undefined there in MPI
    if collective == "scatter" and ip:
        assert_matches(read(send), send_values, f"in-place scatter leaves the root's {kind} as it was")
        return
    got, want = read(recv), ref_recv
    if collective == "reduce_scatter_block" and ip:
        got, want = got[:n], want[:n]  # the result is the first block; the rest is undefined
    assert_matches(got, want, f"{collective} {'in place ' if ip else ''}with {kind} buffers")


def _calls(comm: Any, collective: str, root: int, ip: bool, S: Any, R: Any, s: np.ndarray,
           r: np.ndarray) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(mpicomm's call on the kind, mpi4py's call on NumPy copies)."""
    IP, lib = MPI.IN_PLACE, WORLD
    if collective == "bcast":
        return (lambda: comm.Bcast(S, root)), (lambda: None)
    if collective == "scatter":
        if ip:
            return (lambda: comm.Scatter(S, IP, root)), (lambda: lib.Scatter(s, IP, root))
        return (lambda: comm.Scatter(S, R, root)), (lambda: lib.Scatter(s, r, root))
    mine, theirs = (IP, IP) if ip else (S, s)
    table = {
        "allreduce": (lambda: comm.Allreduce(mine, R), lambda: lib.Allreduce(theirs, r)),
        "reduce": (lambda: comm.Reduce(mine, R, MPI.SUM, root), lambda: lib.Reduce(theirs, r, MPI.SUM, root)),
        "allgather": (lambda: comm.Allgather(mine, R), lambda: lib.Allgather(theirs, r)),
        "alltoall": (lambda: comm.Alltoall(mine, R), lambda: lib.Alltoall(theirs, r)),
        "reduce_scatter_block": (lambda: comm.Reduce_scatter_block(mine, R),
                                 lambda: lib.Reduce_scatter_block(theirs, r)),
        "gather": (lambda: comm.Gather(mine, R, root), lambda: lib.Gather(theirs, r, root)),
        "scan": (lambda: comm.Scan(mine, R), lambda: lib.Scan(theirs, r)),
        "exscan": (lambda: comm.Exscan(mine, R), lambda: lib.Exscan(theirs, r)),
    }
    return table[collective]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_push_and_pull_take_every_kind(comm, kind):
    rank, p = comm.Get_rank(), comm.Get_size()
    wrap, read = KINDS[kind]
    x = wrap(data(rank, 5, np.float64))
    into = wrap(np.zeros(5))
    right, left = (rank + 1) % p, (rank - 1) % p
    if kind == "bytearray":  # bytes carry no element type: they arrive as bytes
        got = comm.sendrecv_array(x, right, left, into)
        assert_matches(np.frombuffer(into, np.float64), data(left, 5, np.float64), "sendrecv_array into bytearray")
        return
    comm.sendrecv_array(x, right, left, into)
    assert_matches(read(into), data(left, 5, np.float64), f"sendrecv_array with {kind}")
    exposed = wrap(data(rank, 4, np.float64))
    with comm.expose(exposed) as win:
        win.fence() if hasattr(win, "fence") else None
        out = wrap(np.zeros(4))
        got = win.get(right, out=out)
        assert_matches(read(out), data(right, 4, np.float64), f"window get into {kind}")
        del got
        comm.Barrier()


def test_v_spec_with_one_count_and_one_displacement_means_what_it_means_to_mpi4py(comm):
    rank, p = comm.Get_rank(), comm.Get_size()
    send = data(rank, 3, np.float64)
    ours, ref = np.full(4 * p, -1.0), np.full(4 * p, -1.0)
    comm.Allgatherv(send, [ours, (3, 4), MPI.DOUBLE])  # every block 3 elements, block r at 4·r
    WORLD.Allgatherv(send, [ref, (3, 4), MPI.DOUBLE])
    assert_matches(ours, ref, "allgatherv with (count, displ)")
    assert ours[3] == -1.0  # the gaps are untouched
    ours2 = np.full(3 * p, -1.0)
    comm.Allgatherv(send, [ours2, (3, None), MPI.DOUBLE])
    assert_matches(ours2, ref.reshape(p, 4)[:, :3].reshape(-1), "allgatherv with (count, None)")


def test_adopt_shares_memory_and_names_what_it_cannot_take():
    a = np.arange(6.0)
    for wrapped in (DLPackOnly(a), memoryview(a)):
        view = adopt(wrapped, "buf")
        assert np.shares_memory(view, a)
    if importlib.util.find_spec("cupy") is None:
        with pytest.raises(TypeError, match=r"buf \(.*FakeCUDA\) exports __cuda_array_interface__.*CuPy is not "
                                            r"installed; pip install 'mpicomm\[cuda12\]'"):
            adopt(FakeCUDA(), "buf")
    with pytest.raises(TypeError, match="sendbuf must be an array or a buffer .* got object"):
        adopt(object(), "sendbuf")


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed")
def test_a_torch_tensor_that_requires_grad_is_refused_with_the_fix():
    import torch

    t = torch.zeros(3, requires_grad=True)
    with pytest.raises(TypeError, match="detach"):
        adopt(t, "sendbuf")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_array_functions_take_every_kind(comm, kind):
    import mpicomm

    if kind == "bytearray":
        pytest.skip("bytes carry no element type; the array functions reduce elements")
    wrap, read = KINDS[kind]
    rank, p = comm.Get_rank(), comm.Get_size()
    x = data(rank, 6, np.float64)
    expected = np.empty_like(x)
    WORLD.Allreduce(x, expected)
    assert_matches(mpicomm.allreduce(wrap(x.copy()), comm=comm), expected, f"mpicomm.allreduce of {kind}")
    out = wrap(np.zeros(6))
    mpicomm.allreduce(wrap(x.copy()), comm=comm, out=out)
    assert_matches(read(out), expected, f"mpicomm.allreduce into out= of {kind}")
    gathered = mpicomm.allgather(wrap(x.copy()), comm=comm)
    assert_matches(gathered.reshape(-1), np.concatenate([data(r, 6, np.float64) for r in range(p)]),
                   f"mpicomm.allgather of {kind}")
