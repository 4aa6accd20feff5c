"""The torch.distributed process group: PyTorch's collectives on mpicomm's algorithms.

:class:`ProcessGroup` subclasses ``torch.distributed.ProcessGroup`` and maps
each method PyTorch calls (``allreduce``, ``all_gather_single``,
``reduce_scatter_single``, ``all_to_all_single``, ``send``/``recv``...) to one
:class:`mpicomm.Comm` call on the group's communicator: blocking when the
caller waits at once (``opts.asyncOp`` False, as ``dist.all_reduce(t)``
sets, or ``MPICOMM_TORCH_PROGRESS=sync``), nonblocking otherwise (DDP's
buckets: the returned :class:`~.work.Work` completes on the core's progress
thread), always with ``algorithm=None`` so mpicomm's ``auto`` (or
``MPICOMM_<COLLECTIVE>_ALGORITHM``) chooses. Tensors cross as arrays without
copies where they can (:mod:`.tensors`).

The blocking all-reduce of one contiguous CPU tensor - the call a training
loop repeats - is remembered on the communicator by the tensor's address,
element count, dtype and op (``comm._state.fast``, the core's fast path): a
repeated call runs the kept plan, bound to that address, without reading its
arguments again, making no NumPy view and no staging.

Argument errors are raised on every rank of the group alike, as mpicomm's own
collectives raise them: each method first checks and stages everything of its
call (tensor types and devices, dtypes, list lengths, sizes, split sizes, the
root, whether the op is defined on the dtype), and a problem found there on
one rank is not raised on that rank alone: the rank takes part in the
agreement of the mpicomm collective its peers run (the core's
``Args.fail`` and agreement-only plan, :meth:`ProcessGroup._refuse`), so
every rank raises the same :class:`mpicomm.ArgumentError` (a ValueError and a
TypeError) naming the rank and the problem, and the group keeps working for
the next call. Mismatches across ranks (counts, dtypes, ops, roots) are found
by the same agreement. A blocking call raises at the call; an asynchronous
one (``async_op=True``) returns a Work whose ``wait()`` raises, on the peers
and on the rank with the problem alike. Errors of the communication itself
propagate unchanged. Exceptions: with ``MPICOMM_VALIDATE=0`` there is no
agreement and a local problem raises on its rank only, before anything is
sent (the peers then wait); point-to-point calls (``send``/``recv``) have no
agreement, so their errors are always the calling rank's alone; and a
problem PyTorch's own front end finds before it calls the backend (a source
or destination outside a subgroup, for example) is PyTorch's, on that rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import torch
from mpi4py import MPI

from ..comm import Comm
from ..front.dispatch import start as _start
from ..front.readers import read
from ..plan.args import Args, ArgumentError
from ..transport.buffers import byte_range, overlap
from .tensors import Staged, check_tensor, finisher, mpi_op, stage
from .work import Work, done, point_to_point, started, synchronous

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import GroupName

__all__ = ["ProcessGroup", "BACKEND"]

_RED = torch.distributed.ReduceOp  # its SUM... are the RedOpType members (the stubs declare them here)

#: The name the backend is registered under (``dist.init_process_group("mpicomm")``).
BACKEND = "mpicomm"



#: A staged buffer (:attr:`Staged.array <.tensors.Staged.array>`): a CPU tensor's NumPy view, or a device tensor.
_Buffer: TypeAlias = "np.ndarray | torch.Tensor"  # (a string: the docs build reads this module with torch mocked)


def _overlaps(a: _Buffer, b: _Buffer) -> bool:
    """True when *a* and *b* (contiguous) share memory. Device tensors by their addresses: mpicomm's
    :func:`~mpicomm.transport.buffers.overlap` reads NumPy and CuPy arrays, not torch tensors."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return overlap(a, b) is not None
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < a1 and b0 < b1 and a0 < b1 and b0 < a1


def _span(x: _Buffer) -> tuple[int, int]:
    """``(first byte address, one past the last)`` of contiguous *x*."""
    if isinstance(x, torch.Tensor):
        start = x.data_ptr()
        return start, start + x.numel() * x.element_size()
    return byte_range(x)


def _copied(x: _Buffer) -> _Buffer:
    return x.copy() if isinstance(x, np.ndarray) else x.clone()


def _unaliased(send: _Buffer, recv: _Buffer) -> _Buffer:
    """*send*, or a copy where it shares memory with *recv*.

    PyTorch lets a collective's input alias its output; MPI, and mpicomm's
    validation, refuse partly overlapping buffers (the algorithms read the input
    while they write the output). A copy is what gloo's semantics need here.
    """
    return _copied(send) if _overlaps(send, recv) else send


def _gather_source(send: _Buffer, recv: _Buffer, rank: int) -> Any:
    """All-gather's send buffer: ``MPI.IN_PLACE`` when *send* IS this rank's block of *recv*.

    FSDP gathers a shard that already lives at its place in the output
    (``all_gather_into_tensor(out, out.chunk(p)[rank])``): that is MPI's in-place
    all-gather, with nothing to copy. Any other overlap is copied first.
    """
    if not _overlaps(send, recv):
        return send
    n = send.size if isinstance(send, np.ndarray) else send.numel()
    if _span(recv.reshape(-1)[rank * n:(rank + 1) * n]) == _span(send):
        return MPI.IN_PLACE
    return _copied(send)

def _blocking(opts: Any) -> bool:
    """True when the operation completes before its call returns: the caller waits at once (``async_op=False``:
    the blocking mpicomm call is the cheaper one), or ``MPICOMM_TORCH_PROGRESS=sync``."""
    return synchronous() or not getattr(opts, "asyncOp", True)


def _flat(tensors: list[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(sum(t.numel() for t in tensors), dtype=dtype, device=device)


def _same_dtype(tensors: list[torch.Tensor], what: str) -> torch.dtype:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise ValueError(f"mpicomm backend: {what} mixes dtypes {sorted(map(str, dtypes))}; pass tensors of one dtype")
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"mpicomm backend: {what} spans devices {sorted(map(str, devices))}; pass tensors on one device")
    return next(iter(dtypes))


def _concat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors' elements, one after another, in a new flat tensor."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _split_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy consecutive pieces of *flat* into *tensors* (the inverse of :func:`_concat`)."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


def _moved(t: torch.Tensor) -> torch.Tensor:
    """A tensor's data as moved bit for bit (bfloat16 as int16)."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _array(t: torch.Tensor) -> Any:
    t = _moved(t.detach())
    return t.numpy() if t.device.type == "cpu" else t


class ProcessGroup(torch.distributed.ProcessGroup):
    """A torch.distributed process group over an :class:`mpicomm.Comm` (ranks in the group's order)."""

    # PyTorch's stubs describe its C++ binding of ProcessGroup: __init__(store, rank, size), and collectives
    # overloaded with the binding's conveniences (one tensor, op=, root=, timeout=) and its keyword names. A
    # process group written in Python, as PyTorch's own are (testing/_internal/distributed/multi_threaded_pg.py),
    # is made with the binding's (rank, size) overload, which the stubs omit, and torch.distributed calls its
    # collectives with positional (tensors..., opts) only. The type: ignore comments below are for that.

    def __init__(self, comm: Comm, timeout: Any = None):
        super().__init__(comm.Get_rank(), comm.Get_size())  # type: ignore[call-arg]  # (rank, size): see above
        self.comm = comm
        self.timeout = timeout
        self._state = comm._state  # the communicator's mpicomm state: its remembered calls (state.fast)

    def __repr__(self) -> str:
        return f"<mpicomm ProcessGroup rank {self.rank()} of {self.size()}>"

    @property
    def _p(self) -> int:
        return self.size()

    def getBackendName(self) -> str:
        return BACKEND

    # PyTorch keeps a group's name and description on its C++ backends, which a group written in Python
    # has none of: keep them here (DeviceMesh, FSDP and the name registry read them).
    def _set_group_name(self, name: GroupName) -> None:
        self._name = name

    @property
    def group_name(self) -> GroupName:
        name: GroupName | None = getattr(self, "_name", None)
        if name is None:
            raise RuntimeError("mpicomm backend: this process group has no name yet (PyTorch names it when "
                               "init_process_group or new_group returns)")
        return name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_desc", "undefined")

    def _get_backend_name(self) -> str:
        return BACKEND

    def _submit(self, start: Callable[[bool], Any], finish: Callable[[], Any] | None, result: Any, name: str,
                opts: Any) -> Work:
        """Run an operation: ``start(blocking)`` issues its mpicomm calls (blocking ones, or nonblocking ones
        whose requests it returns); *finish* delivers the results once they are complete."""
        if _blocking(opts):
            start(True)
            if finish is not None:
                finish()
            return done(result, name)
        return started(start(False), finish, result, name)

    def _root(self, root: int, what: str) -> int:
        if not isinstance(root, int) or not 0 <= root < self._p:
            raise ValueError(f"mpicomm backend: {what} root {root!r} is not a rank of this group (0..{self._p - 1})")
        return root

    def _refuse(self, collective: str, problem: Exception, opts: Any, calls: int = 1) -> Work:
        """This rank found *problem* in its arguments before anything of the call was sent: take part in the
        agreement of the mpicomm *collective* its peers run, with the problem recorded, so that every rank
        raises the same :class:`~mpicomm.ArgumentError` naming this rank and the problem, and the group keeps
        working (the core's agreement moves the communicator to fresh tags).

        Blocking (as the call would have been): raises here. Asynchronous: returns a :class:`~.work.Work`
        whose ``wait()`` raises, as the peers' do; *calls*: how many mpicomm calls the peers issue for this
        one (one per tensor of a tensor list), so this rank issues as many. With ``MPICOMM_VALIDATE=0`` there
        is no agreement: *problem* itself raises here, on this rank only.
        """
        state = self._state
        if _blocking(opts):
            try:
                _start(state, Args(collective).fail(problem), None, True)
            except ArgumentError as exc:
                raise exc from problem
            raise problem  # (the agreement always raises; kept for a core that would not)
        requests = [_start(state, Args(collective).fail(problem), None, False) for _ in range(max(calls, 1))]
        return started(requests, None, [], collective)

    # ------------------------------------------------------------ reductions
    #
    # Each method checks and stages everything of its call first (inside ``try``), then communicates: a
    # problem found while checking is refused through the agreement (:meth:`_refuse`), so every rank raises
    # it; an error from the communication itself (already every rank's, or MPI's) propagates unchanged.

    def allreduce(self, tensors: list[torch.Tensor],  # type: ignore[override]  # torch passes (tensors, opts) only
                  opts: Any = None) -> Work:
        """All-reduce each tensor in place (``dist.all_reduce``).

        The blocking call on one contiguous CPU tensor (``dist.all_reduce(t)``) is remembered on the
        communicator by the tensor's address, size, dtype and op (a kept plan is bound to the address, so it
        serves any tensor there): a repeated call runs the plan at once, without reading its arguments again.
        """
        if opts is not None and len(tensors) == 1 and (not opts.asyncOp or synchronous()) \
                and not self._state.reproducible:  # (a reproducible sum takes Comm.Allreduce, below)
            t = tensors[0]
            if t.is_cpu and type(t) in _PLAIN and t.is_contiguous():
                code = hash(opts.reduceOp)  # the op's code (SUM 0 … PREMUL_SUM 8)
                key = (_ALLREDUCE, t.data_ptr(), t.numel(), t.dtype, code)
                fast = self._state.fast.get(key)
                if fast is not None and fast.run():
                    if code == _AVG:
                        t.detach().mul_(1.0 / self._p)
                    work = Work()
                    work._result = tensors
                    return work
                if code != _PREMUL and t.dtype in _DIRECT:
                    try:
                        red = mpi_op(opts.reduceOp, t.dtype, self._p)  # (raises for an op the dtype has not)
                        array = t.detach().numpy()
                    except Exception as exc:  # noqa: BLE001 - refused on every rank
                        return self._refuse("allreduce", exc, opts)
                    _start(self._state, read("allreduce", self.comm, MPI.IN_PLACE, array, op=red.op), None, True,
                           (key, ()))  # (remembered by the tensor's address: a repeat needs no arguments)
                    if red.scale is not None:  # AVG
                        t.detach().mul_(1.0 / self._p)
                    return done(tensors, "allreduce")
        opts = opts or torch.distributed.AllreduceOptions()
        try:
            staged = stage(tensors, "all_reduce tensor", reduce=True)
            reductions = [mpi_op(opts.reduceOp, s.tensor.dtype, self._p) for s in staged]
        except Exception as exc:  # noqa: BLE001 - refused on every rank
            return self._refuse("allreduce", exc, opts, len(tensors))
        comm = self.comm

        def start(blocking: bool) -> Any:
            requests = []
            for s, red in zip(staged, reductions):
                if red.premul is not None:
                    s.scale(red.premul)
                if blocking:
                    comm.Allreduce(MPI.IN_PLACE, s.array, red.op)
                else:
                    requests.append(comm.Iallreduce(MPI.IN_PLACE, s.array, red.op))
            return _one(requests)

        def after() -> None:
            for s, red in zip(staged, reductions):
                if red.scale is not None:
                    s.scale(red.scale)

        return self._submit(start, finisher(staged, after), list(tensors), "allreduce", opts)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        """All-reduce several tensors of one dtype as one flat buffer (``dist.all_reduce_coalesced``)."""
        opts = opts or torch.distributed.AllreduceCoalescedOptions()
        try:
            for i, t in enumerate(tensors):
                check_tensor(t, f"all_reduce_coalesced tensor[{i}]")
            if tensors:
                dtype = _same_dtype(tensors, "all_reduce_coalesced")
                flat = _concat(tensors)
                staged = Staged(flat, reduce=True)
                red = mpi_op(opts.reduceOp, dtype, self._p)
        except Exception as exc:  # noqa: BLE001 - refused on every rank
            return self._refuse("allreduce", exc, opts)
        if not tensors:
            return done([], "allreduce_coalesced")
        comm = self.comm

        def start(blocking: bool) -> Any:
            if red.premul is not None:
                staged.scale(red.premul)
            if blocking:
                comm.Allreduce(MPI.IN_PLACE, staged.array, red.op)
                return None
            return comm.Iallreduce(MPI.IN_PLACE, staged.array, red.op)

        def finish() -> None:
            if red.scale is not None:
                staged.scale(red.scale)
            staged.finish()
            _split_into(flat, tensors)

        return self._submit(start, finish, list(tensors), "allreduce_coalesced", opts)

    def reduce(self, tensors: list[torch.Tensor],  # type: ignore[override]  # torch passes (tensors, opts) only
               opts: Any = None) -> Work:
        """Reduce onto ``opts.rootRank`` in place there; other ranks' tensors are unchanged (``dist.reduce``)."""
        opts = opts or torch.distributed.ReduceOptions()
        try:
            root = self._root(opts.rootRank, "reduce")
            is_root = self.rank() == root
            staged = stage(tensors, "reduce tensor", reduce=True, output=is_root)
            reductions = [mpi_op(opts.reduceOp, s.tensor.dtype, self._p) for s in staged]
            sends = [_array(s.work.clone()) if not is_root and red.premul is not None else s.array
                     for s, red in zip(staged, reductions)]
        except Exception as exc:  # noqa: BLE001 - refused on every rank
            return self._refuse("reduce", exc, opts, len(tensors))
        comm = self.comm

        def start(blocking: bool) -> Any:
            requests = []
            for s, send, red in zip(staged, sends, reductions):
                if red.premul is not None:
                    if is_root:
                        s.scale(red.premul)
                    else:
                        send *= red.premul
                args: tuple[Any, Any] = (MPI.IN_PLACE, s.array) if is_root else (send, None)
                if blocking:
                    comm.Reduce(*args, red.op, root)
                else:
                    requests.append(comm.Ireduce(*args, red.op, root))
            return _one(requests)

        def after() -> None:
            if is_root:
                for s, red in zip(staged, reductions):
                    if red.scale is not None:
                        s.scale(red.scale)

        return self._submit(start, finisher(staged, after), list(tensors), "reduce", opts)

    def reduce_scatter(self, outputs: list[torch.Tensor],  # type: ignore[override]  # torch passes lists and opts only
                       inputs: list[list[torch.Tensor]], opts: Any = None) -> Work:
        """``dist.reduce_scatter``: rank i gets the reduction of every rank's ``inputs[0][i]``."""
        opts = opts or torch.distributed.ReduceScatterOptions()
        try:
            if len(outputs) != 1 or len(inputs) != 1:
                raise ValueError(f"mpicomm backend: reduce_scatter takes one output tensor and one input list, "
                                 f"got {len(outputs)} and {len(inputs)}")
            parts = inputs[0]
            if len(parts) != self._p:
                raise ValueError(f"mpicomm backend: reduce_scatter input list has {len(parts)} tensors for a group "
                                 f"of {self._p} ranks")
            out = check_tensor(outputs[0], "reduce_scatter output")
            for i, t in enumerate(parts):
                check_tensor(t, f"reduce_scatter input[{i}]")
            _same_dtype([out, *parts], "reduce_scatter")
            if parts[self.rank()].numel() != out.numel():
                raise ValueError(f"mpicomm backend: reduce_scatter output has {out.numel()} elements but input "
                                 f"[{self.rank()}] has {parts[self.rank()].numel()}")
            red = mpi_op(opts.reduceOp, out.dtype, self._p)
            flat = Staged(_concat(parts), reduce=True, output=False)
            staged = Staged(out, reduce=True)
        except Exception as exc:  # noqa: BLE001 - refused on every rank
            return self._refuse("reduce_scatter" if _uneven(inputs) else "reduce_scatter_block", exc, opts)
        counts = [t.numel() for t in parts]
        even = len(set(counts)) == 1
        comm = self.comm

        def start(blocking: bool) -> Any:
            if red.premul is not None:
                flat.scale(red.premul)
            if even:
                call = comm.Reduce_scatter_block if blocking else comm.Ireduce_scatter_block
                return call(flat.array, staged.array, red.op)
            call_v = comm.Reduce_scatter if blocking else comm.Ireduce_scatter
            return call_v(flat.array, staged.array, counts, red.op)

        def after() -> None:
            if red.scale is not None:
                staged.scale(red.scale)

        return self._submit(start, finisher([staged], after), [out], "reduce_scatter", opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        """``dist.reduce_scatter_tensor``: *input* holds p equal blocks; rank i gets block i reduced."""
        opts = opts or torch.distributed.ReduceScatterOptions()
        try:
            out = check_tensor(output, "reduce_scatter_tensor output")
            inp = check_tensor(input, "reduce_scatter_tensor input")
            _same_dtype([out, inp], "reduce_scatter_tensor")
            if inp.numel() != out.numel() * self._p:
                raise ValueError(f"mpicomm backend: reduce_scatter_tensor input has {inp.numel()} elements; it "
                                 f"must have output's {out.numel()} times the group size {self._p}")
            red = mpi_op(opts.reduceOp, out.dtype, self._p)
            send = Staged(inp if red.premul is None else inp.detach().clone(), reduce=True, output=False)
            staged = Staged(out, reduce=True)
        except Exception as exc:  # noqa: BLE001 - refused on every rank
            return self._refuse("reduce_scatter_block", exc, opts)
        comm = self.comm

        def start(blocking: bool) -> Any:
            if red.premul is not None:
                send.scale(red.premul)
            call = comm.Reduce_scatter_block if blocking else comm.Ireduce_scatter_block
            return call(_unaliased(send.array, staged.array), staged.array, red.op)

        def after() -> None:
            if red.scale is not None:
                staged.scale(red.scale)

        return self._submit(start, finisher([staged], after), [out], "reduce_scatter_tensor", opts)

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]  # passed positionally: see the class

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Work:
        """Several ``reduce_scatter_tensor`` calls, completed together."""
        part = _part(opts, "ReduceScatterOptions")
        if len(outputs) != len(inputs):
            return self._refuse("reduce_scatter_block", _lengths("reduce_scatter_tensor_coalesced", outputs, inputs),
                                part, len(inputs))
        return self._together([self.reduce_scatter_single(o, i, part) for o, i in zip(outputs, inputs)],
                              list(outputs), "reduce_scatter_tensor_coalesced", part)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced  # type: ignore[assignment]  # called positionally

    # ------------------------------------------------------------ data movement

    def broadcast(self, tensors: list[torch.Tensor],  # type: ignore[override]  # torch passes (tensors, opts) only
                  opts: Any = None) -> Work:
        """Broadcast each tensor from ``opts.rootRank`` (``dist.broadcast``)."""
        opts = opts or torch.distributed.BroadcastOptions()
        try:
            root = self._root(opts.rootRank, "broadcast")
            staged = stage(tensors, "broadcast tensor", output=self.rank() != root)
        except Exception as exc:  # noqa: BLE001 - refused on every rank
            return self._refuse("bcast", exc, opts, len(tensors))
        comm = self.comm

        def start(blocking: bool) -> Any:
            if blocking:
                for s in staged:
                    comm.Bcast(s.array, root)
                return None
            return _one([comm.Ibcast(s.array, root) for s in staged])

        return self._submit(start, finisher(staged), list(tensors), "broadcast", opts)

    def allgather(self, outputs: list[list[torch.Tensor]],  # type: ignore[override]  # torch passes lists and opts only
                  inputs: list[torch.Tensor], opts: Any = None) -> Work:
        """``dist.all_gather``: ``outputs[0][i]`` receives rank i's ``inputs[0]`` (sizes may differ per rank)."""
        opts = opts or _options("AllgatherOptions")
        try:
            if len(outputs) != 1 or len(inputs) != 1:
                raise ValueError(f"mpicomm backend: all_gather takes one input tensor and one output list, got "
                                 f"{len(inputs)} and {len(outputs)}")
            send = Staged(check_tensor(inputs[0], "all_gather input"), output=False)
            gathered, finish, result = self._gather_into_list(outputs[0], inputs[0], "all_gather")
        except Exception as exc:  # noqa: BLE001 - refused on every rank
            return self._refuse("allgatherv" if _uneven(outputs) else "allgather", exc, opts)
        comm = self.comm
        counts = [t.numel() for t in outputs[0]]

        def start(blocking: bool) -> Any:
            if len(set(counts)) == 1:
                call = comm.Allgather if blocking else comm.Iallgather
                return call(send.array, gathered)
            call = comm.Allgatherv if blocking else comm.Iallgatherv
            return call(send.array, [gathered, (counts, _displs(counts))])

        return self._submit(start, finish, result, "all_gather", opts)

    def _gather_into_list(self, outs: list[torch.Tensor], inp: torch.Tensor, what: str
                          ) -> tuple[Any, Callable[[], None], list[list[torch.Tensor]]]:
        """A flat receive array for a list of p output tensors, and the finish that copies into them."""
        if len(outs) != self._p:
            raise ValueError(f"mpicomm backend: {what} output list has {len(outs)} tensors for a group of {self._p} "
                             f"ranks")
        for i, t in enumerate(outs):
            check_tensor(t, f"{what} output[{i}]")
        _same_dtype([inp, *outs], what)
        if outs[self.rank()].numel() != inp.numel():
            raise ValueError(f"mpicomm backend: {what} input has {inp.numel()} elements but output[{self.rank()}] "
                             f"has {outs[self.rank()].numel()}")
        flat = _flat(outs, inp.dtype, inp.device)

        return _array(flat), lambda: _split_into(flat, outs), [list(outs)]

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        """``dist.all_gather_into_tensor``: *output* holds p blocks, block i from rank i."""
        opts = opts or _options("AllgatherOptions")
        try:
            out = check_tensor(output, "all_gather_into_tensor output")
            inp = check_tensor(input, "all_gather_into_tensor input")
            _same_dtype([out, inp], "all_gather_into_tensor")
            if out.numel() != inp.numel() * self._p:
                raise ValueError(f"mpicomm backend: all_gather_into_tensor output has {out.numel()} elements; it "
                                 f"must have input's {inp.numel()} times the group size {self._p}")
            send, staged = Staged(inp, output=False), Staged(out)
        except Exception as exc:  # noqa: BLE001 - refused on every rank
            return self._refuse("allgather", exc, opts)
        comm = self.comm

        def start(blocking: bool) -> Any:
            call = comm.Allgather if blocking else comm.Iallgather
            return call(_gather_source(send.array, staged.array, self.rank()), staged.array)

        return self._submit(start, finisher([staged]), [out], "all_gather_into_tensor", opts)

    _allgather_base = all_gather_single

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> Work:
        """Several ``all_gather`` calls (one per input tensor), completed together."""
        part = _part(opts, "AllgatherOptions")
        if len(outputs) != len(inputs):
            return self._refuse("allgather", _lengths("allgather_coalesced", outputs, inputs), part, len(inputs))
        works = [self.allgather([o], [i], part) for o, i in zip(outputs, inputs)]
        return self._together(works, [list(o) for o in outputs], "allgather_coalesced", part)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Work:
        """Several ``all_gather_into_tensor`` calls, completed together."""
        part = _part(opts, "AllgatherOptions")
        if len(outputs) != len(inputs):
            return self._refuse("allgather", _lengths("allgather_into_tensor_coalesced", outputs, inputs), part,
                                len(inputs))
        works = [self.all_gather_single(o, i, part) for o, i in zip(outputs, inputs)]
        return self._together(works, list(outputs), "allgather_into_tensor_coalesced", part)

    all_gather_single_coalesced = allgather_into_tensor_coalesced  # type: ignore[assignment]  # called positionally

    def gather(self, outputs: list[list[torch.Tensor]],  # type: ignore[override]  # torch passes lists and opts only
               inputs: list[torch.Tensor], opts: Any = None) -> Work:
        """``dist.gather``: the root's ``outputs[0][i]`` receives rank i's ``inputs[0]`` (blocks of one size,
        as gloo: only the root knows the list, so a size that differs is the root's error, raised on every
        rank)."""
        opts = opts or torch.distributed.GatherOptions()
        try:
            root = self._root(opts.rootRank, "gather")
            if len(inputs) != 1:
                raise ValueError(f"mpicomm backend: gather takes one input tensor, got {len(inputs)}")
            inp = check_tensor(inputs[0], "gather input")
            send = Staged(inp, output=False)
            if self.rank() == root:
                if len(outputs) != 1:
                    raise ValueError(f"mpicomm backend: gather at the root takes one output list, got "
                                     f"{len(outputs)}")
                gathered, finish, result = self._gather_into_list(outputs[0], inp, "gather")
                for i, t in enumerate(outputs[0]):
                    if t.numel() != inp.numel():
                        raise ValueError(f"mpicomm backend: gather output[{i}] has {t.numel()} elements but the "
                                         f"input has {inp.numel()}; gather takes blocks of one size")
            else:
                if outputs and any(outputs):
                    raise ValueError(f"mpicomm backend: gather output lists are for the root (rank {root}) only")
                gathered, finish, result = None, None, []
        except Exception as exc:  # noqa: BLE001 - refused on every rank
            return self._refuse("gather", exc, opts)
        comm = self.comm

        def start(blocking: bool) -> Any:
            call = comm.Gather if blocking else comm.Igather
            return call(send.array, gathered, root)

        return self._submit(start, finish, result, "gather", opts)

    def scatter(self, outputs: list[torch.Tensor],  # type: ignore[override]  # torch passes lists and opts only
                inputs: list[list[torch.Tensor]], opts: Any = None) -> Work:
        """``dist.scatter``: rank i's ``outputs[0]`` receives the root's ``inputs[0][i]``."""
        opts = opts or torch.distributed.ScatterOptions()
        try:
            root = self._root(opts.rootRank, "scatter")
            if len(outputs) != 1:
                raise ValueError(f"mpicomm backend: scatter takes one output tensor, got {len(outputs)}")
            out = check_tensor(outputs[0], "scatter output")
            staged = Staged(out)
            if self.rank() == root:
                if len(inputs) != 1 or len(inputs[0]) != self._p:
                    raise ValueError(f"mpicomm backend: scatter at the root takes one list of {self._p} tensors, "
                                     f"got {_shape_of(inputs)}")
                parts = [check_tensor(t, f"scatter input[{i}]") for i, t in enumerate(inputs[0])]
                _same_dtype([out, *parts], "scatter")
                counts = [t.numel() for t in parts]
                send = _array(_concat(parts))
            else:
                if inputs and any(inputs):
                    raise ValueError(f"mpicomm backend: scatter input lists are for the root (rank {root}) only")
                counts, send = None, None
        except Exception as exc:  # noqa: BLE001 - refused on every rank
            return self._refuse("scatterv", exc, opts)
        comm = self.comm

        def start(blocking: bool) -> Any:
            call = comm.Scatterv if blocking else comm.Iscatterv
            if counts is None:  # (not the root: no send buffer either)
                return call(None, staged.array, root)
            return call([send, (counts, _displs(counts))], staged.array, root)

        return self._submit(start, finisher([staged]), [out], "scatter", opts)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Work:
        """``dist.all_to_all``: ``outputs[j]`` receives rank j's ``inputs[i]`` (i = this rank); sizes may differ."""
        opts = opts or torch.distributed.AllToAllOptions()
        try:
            if len(outputs) != self._p or len(inputs) != self._p:
                raise ValueError(f"mpicomm backend: all_to_all takes {self._p} output and {self._p} input tensors, "
                                 f"got {len(outputs)} and {len(inputs)}")
            for i, t in enumerate(outputs):
                check_tensor(t, f"all_to_all output[{i}]")
            for i, t in enumerate(inputs):
                check_tensor(t, f"all_to_all input[{i}]")
            dtype = _same_dtype([*outputs, *inputs], "all_to_all")
            send = _array(_concat(inputs))
            flat = _flat(outputs, dtype, outputs[0].device)
            recv = _array(flat)
        except Exception as exc:  # noqa: BLE001 - refused on every rank
            return self._refuse("alltoallv", exc, opts)
        scounts, rcounts = [t.numel() for t in inputs], [t.numel() for t in outputs]
        comm = self.comm

        def start(blocking: bool) -> Any:
            call = comm.Alltoallv if blocking else comm.Ialltoallv
            return call([send, (scounts, _displs(scounts))], [recv, (rcounts, _displs(rcounts))])

        return self._submit(start, lambda: _split_into(flat, outputs), list(outputs), "all_to_all", opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> Work:
        """``dist.all_to_all_single``: blocks along dim 0, equal or by the split sizes (rows)."""
        opts = opts or torch.distributed.AllToAllOptions()
        even = not output_split_sizes and not input_split_sizes
        try:
            out = check_tensor(output, "all_to_all_single output")
            inp = check_tensor(input, "all_to_all_single input")
            _same_dtype([out, inp], "all_to_all_single")
            if even:
                if inp.numel() % self._p or out.numel() != inp.numel():
                    raise ValueError(f"mpicomm backend: all_to_all_single without split sizes needs input and "
                                     f"output of the same size, divisible by the group size {self._p}; got "
                                     f"{inp.numel()} and {out.numel()} elements")
            else:
                scounts = self._split_counts(inp, input_split_sizes, "input")
                rcounts = self._split_counts(out, output_split_sizes, "output")
            send, staged = Staged(inp, output=False), Staged(out)
        except Exception as exc:  # noqa: BLE001 - refused on every rank
            return self._refuse("alltoall" if even else "alltoallv", exc, opts)
        comm = self.comm
        if even:
            def start(blocking: bool) -> Any:
                call = comm.Alltoall if blocking else comm.Ialltoall
                return call(_unaliased(send.array, staged.array), staged.array)
        else:
            def start(blocking: bool) -> Any:
                call = comm.Alltoallv if blocking else comm.Ialltoallv
                return call([_unaliased(send.array, staged.array), (scounts, _displs(scounts))],
                            [staged.array, (rcounts, _displs(rcounts))])

        return self._submit(start, finisher([staged]), [out], "all_to_all_single", opts)

    alltoall_base = all_to_all_single  # type: ignore[assignment]  # the stub's overloads: see the class

    def _split_counts(self, t: torch.Tensor, splits: list[int], what: str) -> list[int]:
        rows = t.shape[0] if t.dim() else 1
        row = t.numel() // rows if rows else 0
        if not splits:
            if rows % self._p:
                raise ValueError(f"mpicomm backend: all_to_all_single {what} has {rows} rows, not divisible by the "
                                 f"group size {self._p}; pass {what}_split_sizes")
            splits = [rows // self._p] * self._p
        if len(splits) != self._p or any(int(s) < 0 for s in splits) or sum(splits) != rows:
            raise ValueError(f"mpicomm backend: all_to_all_single {what}_split_sizes {list(splits)} must be "
                             f"{self._p} non-negative row counts summing to the {what}'s {rows} rows")
        return [int(s) * row for s in splits]

    def barrier(self, opts: Any = None) -> Work:
        """``dist.barrier`` (no argument of its own to check: nothing to refuse)."""
        opts = opts or torch.distributed.BarrierOptions()
        comm = self.comm

        def start(blocking: bool) -> Any:
            return comm.Barrier() if blocking else comm.Ibarrier()

        return self._submit(start, None, [], "barrier", opts)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """``dist.monitored_barrier``: rank 0 names the ranks that did not arrive within *timeout*."""
        seconds = _seconds(timeout if timeout is not None else self.timeout)
        comm, tag = self.comm, 0x6D62
        if self.rank() != 0:
            comm.Send(np.zeros(1, np.int8), 0, tag)
            status = np.zeros(1, np.int8)
            comm.Recv(status, 0, tag + 1)
            if status[0]:
                raise RuntimeError(f"mpicomm backend: monitored_barrier failed on rank 0 (rank {self.rank()} "
                                   f"arrived)")
            return
        pending = {r: comm.Irecv(np.zeros(1, np.int8), r, tag) for r in range(1, self._p)}
        missing = _wait_until(pending, seconds)
        for r in range(1, self._p):
            if r not in missing:
                comm.Send(np.zeros(1, np.int8), r, tag + 1)
        if missing:
            for r in missing:
                pending[r].Cancel()
            names = sorted(missing) if wait_all_ranks else sorted(missing)[:1]
            raise RuntimeError(f"mpicomm backend: monitored_barrier: rank(s) {names} did not arrive within "
                               f"{seconds:g} s")

    # ------------------------------------------------------------ point to point
    #
    # No agreement here: a point-to-point call has no group-wide call to agree on, so a problem with this
    # rank's arguments (a tensor the backend cannot take, a destination or source outside the group) raises
    # on this rank only, before anything is posted; the peer's matching call stays pending, as with gloo.

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Work:
        """``dist.send``/``isend`` (nonblocking; ``batch_isend_irecv`` issues these). A bad tensor or
        destination raises here, on this rank only."""
        staged = stage(tensors, "send tensor", output=False)
        dst = self._root(dst, "send destination")
        return point_to_point([self.comm.Isend(s.array, dst, tag) for s in staged], None, list(tensors), "send")

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Work:
        """``dist.recv``/``irecv`` from one rank (a bad tensor or source raises here, on this rank only)."""
        staged = stage(tensors, "recv tensor")
        src = self._root(src, "recv source")
        return point_to_point([self.comm.Irecv(s.array, src, tag) for s in staged], finisher(staged), list(tensors),
                              "recv")

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Work:
        """``dist.recv`` without a source: ``work._source_rank()`` names the sender."""
        if len(tensors) != 1:
            raise ValueError(f"mpicomm backend: recv from any source takes one tensor, got {len(tensors)}")
        staged = stage(tensors, "recv tensor")
        return point_to_point(self.comm.Irecv(staged[0].array, MPI.ANY_SOURCE, tag), finisher(staged),
                              list(tensors), "recv_anysource", MPI.Status())

    # ------------------------------------------------------------ helpers

    def _together(self, works: list[Work], result: Any, name: str, part: Any) -> Work:
        """One Work that completes when all of *works* (made with options *part*) have."""
        if _blocking(part):  # each part completed in its call
            return done(result, name)
        return started(works, None, result, name)


#: dtypes whose CPU tensors are NumPy arrays as they are (bfloat16 is not: it is staged).
_DIRECT = frozenset({torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
                     torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128})
#: Tensor types the blocking all-reduce's remembered path takes (subclasses with their own dispatch do not).
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})
#: Op codes (``hash(ReduceOp)``, the op's code): AVG (SUM, then 1/p), and PREMUL_SUM, whose factor the code does
#: not carry (never remembered by address).
_AVG: int = _RED.AVG.value
_PREMUL: int = _RED.PREMUL_SUM.value
_ALLREDUCE = "torch-allreduce"


def _one(requests: list[Any]) -> Any:
    """None for no request, the request for one, the list for several."""
    if not requests:
        return None
    return requests[0] if len(requests) == 1 else requests


def _uneven(lists: Any) -> bool:
    """True when the first of *lists* (a call's list of tensors) holds tensors of different sizes: the v-form
    of the collective (a refused call names the collective the peers most likely run; never raises)."""
    try:
        return len({t.numel() for t in lists[0]}) > 1
    except Exception:  # noqa: BLE001 - malformed: the plain form
        return False


def _lengths(what: str, outputs: Any, inputs: Any) -> ValueError:
    return ValueError(f"mpicomm backend: {what} takes as many outputs as inputs, got {len(outputs)} and "
                      f"{len(inputs)}")


def _shape_of(lists: Any) -> str:
    """``[3]`` for one list of three tensors (for messages; never raises)."""
    try:
        return str([len(x) for x in lists])
    except Exception:  # noqa: BLE001
        return repr(type(lists).__name__)


def _displs(counts: list[int]) -> list[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


def _options(name: str) -> Any:
    return getattr(torch._C._distributed_c10d, name)()


def _part(opts: Any, kind: str) -> Any:
    """Options (class *kind*) for each part of a coalesced call: blocking when the whole call is."""
    part = _options(kind)
    for field in ("reduceOp", "timeout"):
        if opts is not None and hasattr(opts, field) and hasattr(part, field):
            setattr(part, field, getattr(opts, field))
    part.asyncOp = not _blocking(opts)
    return part


def _seconds(timeout: Any) -> float:
    if timeout is None:
        return 1800.0
    return timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)


def _wait_until(pending: dict[int, MPI.Request], seconds: float) -> set[int]:
    """Test *pending* receives until all arrive or *seconds* pass; the ranks whose message did not arrive."""
    deadline = time.monotonic() + seconds
    waiting = dict(pending)
    while waiting and time.monotonic() < deadline:
        for r in [r for r, req in waiting.items() if req.Test()]:
            del waiting[r]
        if waiting:
            time.sleep(1e-3)
    return set(waiting)
