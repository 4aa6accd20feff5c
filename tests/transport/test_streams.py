"""The stream contract (mpicomm.transport.buffers.producer/ready, docs/gpus.md).

Without a GPU: which stream mpicomm would wait for, read from exporters made here (a
``__cuda_array_interface__`` with and without its v3 ``stream``, a DLPack exporter on a GPU, a torch-like
tensor), and the errors for a tensor that requires grad. With a GPU (the GPU tier, ``python -m tests
--gpu``): a long kernel writes the send buffer on a non-default stream just before each kind of call -
blocking, nonblocking, persistent, point to point, RMA, torch, a DLPack exporter - and the result must be
the kernel's data; without the wait MPI reads the buffer before the kernel has written it.
"""

from __future__ import annotations

import numpy as np
import pytest

from mpicomm.transport.buffers import Producer, adopt, producer

from ..conftest import cupy_or_skip

# ---------------------------------------------------------------- which stream (no GPU needed)


class _Interface:
    """An exporter of ``__cuda_array_interface__`` (as Numba's device arrays and PyTorch's CUDA tensors are)."""

    def __init__(self, **fields):
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<f8", "data": (0x1000, False), **fields}


class _DLPack:
    """A DLPack exporter that says where its memory is (and records the stream it is asked to sync to)."""

    def __init__(self, device_type, device_id):
        self.device = (device_type, device_id)

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None):  # pragma: no cover - never exported here
        raise AssertionError("producer() must not export")


class _TorchLike:
    """What producer() reads of a torch tensor: its module, is_cuda and device.index."""

    __module__ = "torch"

    class _Device:
        def __init__(self, index):
            self.index = index

    def __init__(self, is_cuda, index):
        self.is_cuda = is_cuda
        self.device = self._Device(index)


@pytest.mark.serial
def test_host_memory_has_no_producer():
    assert producer(np.zeros(3)) is None
    assert producer(_DLPack(1, 0)) is None  # kDLCPU
    assert producer(_TorchLike(False, None)) is None


@pytest.mark.serial
@pytest.mark.parametrize("stream", [1, 2, 0x7F3A_0000_1230])
def test_a_v3_interface_names_its_stream(stream):
    assert producer(_Interface(version=3, stream=stream)) == Producer("cuda", -1, stream)


@pytest.mark.serial
@pytest.mark.parametrize("fields", [dict(version=3, stream=None), dict(version=3), dict(version=2),
                                    dict(version=2, stream=5)])
def test_an_interface_without_a_v3_stream_needs_no_wait(fields):
    """None or absent (v3), or any v2 interface (which has no stream field, as PyTorch's): nothing to wait for."""
    assert producer(_Interface(**fields)) is None


@pytest.mark.serial
@pytest.mark.parametrize("stream", [0, "1", 1.0])
def test_a_bad_interface_stream_is_named(stream):
    with pytest.raises(ValueError, match=f"names stream {stream!r}.*other than 0"):
        producer(_Interface(version=3, stream=stream))


@pytest.mark.serial
@pytest.mark.parametrize("device_type, device_id", [(2, 0), (2, 3), (13, 1)])  # kDLCUDA, kDLCUDAManaged
def test_a_dlpack_exporter_on_a_gpu_syncs_to_cupys_stream_on_its_device(device_type, device_id):
    assert producer(_DLPack(device_type, device_id)) == Producer("cupy", device_id)


@pytest.mark.serial
@pytest.mark.parametrize("index, expected", [(0, 0), (2, 2), (None, 0)])
def test_a_torch_cuda_tensor_waits_for_torchs_current_stream(index, expected):
    assert producer(_TorchLike(True, index)) == Producer("torch", expected)


@pytest.mark.serial
def test_a_cpu_torch_tensor_has_no_producer():
    torch = pytest.importorskip("torch")
    assert producer(torch.ones(3)) is None


@pytest.mark.serial
def test_a_tensor_that_requires_grad_is_a_type_error_naming_detach():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"x \(torch.Tensor\).*\.detach\(\)"):
        adopt(torch.ones(3, requires_grad=True), "x")


class _GradInterface:
    """As a torch CUDA tensor that requires grad: its ``__cuda_array_interface__`` raises RuntimeError."""

    @property
    def __cuda_array_interface__(self):
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad.")


@pytest.mark.serial
def test_an_interface_refused_with_runtime_error_is_a_type_error_naming_detach():
    with pytest.raises(TypeError, match=r"buf \(.*_GradInterface\).*requires grad.*\.detach\(\)"):
        adopt(_GradInterface(), "buf")


@pytest.mark.serial
def test_torch_futures_know_the_cuda_devices_of_their_result():
    torch = pytest.importorskip("torch")
    from mpicomm.torch.work import cuda_devices

    assert cuda_devices([torch.ones(2), [torch.zeros(1)], (torch.ones(1),)]) == []
    assert cuda_devices(None) == []


# ---------------------------------------------------------------- the contract on a GPU (the GPU tier)

#: Spins for *cycles* clock ticks, then writes rank- and index-dependent values: queued on a stream just before
#: a call, it writes the buffer long after the call would have read it without the wait.
_LATE_FILL = r"""
extern "C" __global__ void late_fill(double* x, long long n, double rank, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = rank * 1000.0 + (double)(i % 997);
}
"""
_CYCLES = 200_000_000  # ~0.1 s at 2 GHz
_N = 1 << 16


def _late(cupy, x, rank, stream):
    """Queue on *stream*: spin, then fill *x* with rank·1000 + index mod 997."""
    kernel = cupy.RawKernel(_LATE_FILL, "late_fill")
    with stream:
        kernel((64,), (256,), (x, np.int64(x.size), np.float64(rank), np.int64(_CYCLES)))


def _expected(p, n):
    i = np.arange(n) % 997
    return sum(r * 1000.0 + i for r in range(p))


def _gpu(comm):
    cupy = cupy_or_skip()
    comm.bind_device()
    return cupy, cupy.cuda.Stream(non_blocking=True)


@pytest.mark.mpi
@pytest.mark.gpu
@pytest.mark.parametrize("form", ["blocking", "nonblocking", "persistent"])
def test_collectives_wait_for_the_producer_stream(comm, form):
    cupy, stream = _gpu(comm)
    rank, p = comm.Get_rank(), comm.Get_size()
    with stream:
        x = cupy.zeros(_N)
        out = cupy.zeros(_N)
        if form == "persistent":
            request = comm.Allreduce_init(x, out)
            for _ in range(2):  # every Start waits again
                out.fill(-1)
                _late(cupy, x, rank, stream)
                request.Start()
                request.Wait()
                np.testing.assert_array_equal(cupy.asnumpy(out * 1), _expected(p, _N))  # (on the stream, blocking)
                x.fill(0)
            request.Free()
            return
        _late(cupy, x, rank, stream)
        if form == "blocking":
            comm.Allreduce(x, out)
        else:
            comm.Iallreduce(x, out).Wait()
        seen = cupy.asnumpy(out * 1)  # queued on the caller's stream after completion: sees the result
    np.testing.assert_array_equal(seen, _expected(p, _N))


@pytest.mark.mpi
@pytest.mark.gpu
def test_point_to_point_waits_for_the_producer_stream(comm):
    cupy, stream = _gpu(comm)
    rank, p = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    with stream:
        x = cupy.zeros(_N)
        got = cupy.zeros(_N)
        _late(cupy, x, rank, stream)
        request = comm.isend_array(x, right, tag=7)
        comm.recv_array(got, left, tag=7)
        request.Wait()
        seen = cupy.asnumpy(got * 1)
    np.testing.assert_array_equal(seen, left * 1000.0 + np.arange(_N) % 997)


@pytest.mark.mpi
@pytest.mark.gpu
def test_rma_put_waits_for_the_producer_stream(comm):
    cupy, stream = _gpu(comm)
    rank, p = comm.Get_rank(), comm.Get_size()
    with stream:
        window = comm.expose(cupy.zeros(_N))
        x = cupy.zeros(_N)
        _late(cupy, x, rank, stream)
        window.put(x, (rank + 1) % p)  # (the put has landed when it returns)
        comm.Barrier()
        window.collect()
        seen = cupy.asnumpy(window.local * 1)
    left = (rank - 1) % p
    np.testing.assert_array_equal(seen, left * 1000.0 + np.arange(_N) % 997)
    comm.Barrier()
    window.Free()


@pytest.mark.mpi
@pytest.mark.gpu
@pytest.mark.parametrize("async_op", [False, True])
def test_torch_waits_for_its_current_stream(async_op):
    cupy_or_skip()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    import torch.distributed as dist

    import mpicomm.torch  # noqa: F401 - registers the backend

    if not dist.is_initialized():
        dist.init_process_group("mpicomm")
    rank, p = dist.get_rank(), dist.get_world_size()
    side = torch.cuda.Stream()
    expected = torch.tensor(_expected(p, _N), device="cuda")
    with torch.cuda.stream(side):
        t = torch.zeros(_N, dtype=torch.float64, device="cuda")
        torch.cuda._sleep(_CYCLES)  # spins on the side stream, then:
        t.copy_(torch.arange(_N, dtype=torch.float64, device="cuda") % 997 + rank * 1000.0)
        work = dist.all_reduce(t, async_op=async_op)
        if async_op:
            work.wait()
        seen = t.clone()  # queued on the side stream after completion: sees the result
    side.synchronize()
    torch.testing.assert_close(seen.cpu(), expected.cpu(), rtol=0, atol=0)


class _OnlyDLPack:
    """A torch CUDA tensor seen through DLPack alone (no ``__cuda_array_interface__``): the handshake path."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, **kwargs):
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


@pytest.mark.mpi
@pytest.mark.gpu
def test_a_dlpack_exporter_orders_its_stream_before_the_call(comm):
    """torch's ``__dlpack__(stream=S)`` makes S (CuPy's current stream, passed by ``cupy.from_dlpack``) wait for
    torch's current stream; mpicomm then waits for S."""
    cupy, _ = _gpu(comm)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    rank, p = comm.Get_rank(), comm.Get_size()
    side = torch.cuda.Stream()
    out = cupy.zeros(_N)
    with torch.cuda.stream(side):
        t = torch.zeros(_N, dtype=torch.float64, device="cuda")
        torch.cuda._sleep(_CYCLES)
        t.copy_(torch.arange(_N, dtype=torch.float64, device="cuda") % 997 + rank * 1000.0)
        comm.Allreduce(_OnlyDLPack(t), out)
    np.testing.assert_array_equal(cupy.asnumpy(out), _expected(p, _N))
