"""The shared-memory algorithms' schedules: reduce and allreduce, broadcast, allgather(v), reduce_scatter,
alltoall(v) - each rank reads and writes its peers' memory on one node, synchronised by counters.

They work in the communicator's arena (:mod:`mpicomm.shm`): a control window
where each rank publishes, per call, where its arrays live and raises
counters (``IN`` once its data is published, ``RED`` once its slice is
reduced, ``DONE`` at the end of the call), and a scratch window that plain
arrays are copied into (arrays from a :class:`mpicomm.shm.Pool` are used
where they are). A schedule here is rounds of *waits on counters*
(:meth:`~mpicomm.schedule.Builder.sync`) and *named local steps*
(:meth:`~mpicomm.schedule.Builder.local`), so it prints, is traced and runs
through the one executor like any other - blocking, nonblocking (DDP's
buckets) and persistent. Every call begins by reserving its counter values
(the same on every rank: calls on one communicator run in order) and waiting
until every peer has finished the previous call (so nothing a peer may still
read is overwritten: no barrier at the end of a call); a call on pool arrays,
which the caller owns, also waits at its end. The schedules are gated: they
run only once every rank agreed on the call (creating and growing the
windows is collective).

Where every rank of the node can read the others' memory (cross-memory
attach, :mod:`mpicomm.transport.cma`; the arena finds out once) and the call
moves at least :data:`CMA_BYTES`, a rank publishes its ordinary arrays where
they are (``PRIVATE``, with their address) and its peers copy what they need
straight out of them: one copy instead of two, no scratch. Such a call waits
at its end until every peer is done reading its arrays. The schedule is the
same either way; the local steps choose the path, alike on every rank.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..schedule import RECV, SEND, Builder, View
from ..transport.memory import ALIGN, DONE, IN, POOL, PRIVATE, RED, SCRATCH, address, arena, place, round_up, target
from .patterns import block_partition

__all__ = ["CHUNK_BYTES", "reduce", "bcast", "allgather", "reduce_scatter", "alltoall", "slices", "chunking"]

#: Elements of a large reduction are pipelined in chunks of about this many bytes: while one chunk is
#: reduced the next is being copied in, and each chunk is still in the cache when it is reduced and copied out.
CHUNK_BYTES = 4 << 20

#: From this many bytes a call reads its peers' ordinary arrays where they are, with one copy, when the node
#: allows it (cross-memory attach: :mod:`mpicomm.transport.cma`), instead of copying them through the
#: shared scratch (two copies); below it the system call costs more than the copy it saves.
CMA_BYTES = 32 << 10


@functools.lru_cache(maxsize=256)
def slices(count: int, p: int, itemsize: int) -> tuple[list[int], list[int]]:
    """Split *count* elements into *p* slices that start on cache lines: (counts, displs).

    Slices are whole multiples of ``ALIGN`` bytes (but the last), so two ranks
    never write the same cache line (no false sharing), and as even as that allows.
    """
    grain = max(1, ALIGN // itemsize) if ALIGN % itemsize == 0 else 1
    units, starts = block_partition(-(-count // grain), p)
    displs = [min(d * grain, count) for d in starts]
    counts = [min((d + u) * grain, count) - lo for d, u, lo in zip(starts, units, displs)]
    return counts, displs


def chunking(count: int, itemsize: int, chunk_bytes: int | None = None) -> int:
    """Elements per pipelined chunk of a *count*-element vector: about *chunk_bytes* (``CHUNK_BYTES``), whole cache lines."""
    grain = max(1, ALIGN // itemsize) if ALIGN % itemsize == 0 else ALIGN
    size = max(grain, (chunk_bytes or CHUNK_BYTES) // itemsize // grain * grain)
    return max(1, min(size, count))


class _Call:
    """What one run of a shared-memory schedule knows as it goes (one per plan: its runs never overlap)."""

    def __init__(self, s: Builder, ticks: int):
        self.state = s.state
        self.ticks = ticks
        self.rank, self.p = s.rank, s.p
        self.others = tuple(r for r in range(s.p) if r != s.rank)
        self.everyone = tuple(range(s.p))
        self.a: Any = None
        self.data: dict[str, Any] = {}
        self.waits_at_end = False
        self.kept: dict[str, np.ndarray] = {}  # private buffers of the single-copy path, kept for the plan's runs

    def direct(self, nbytes: int) -> bool:
        """Whether this call reads its peers' ordinary arrays where they are (the same answer on every rank)."""
        return bool(self.a.cma) and nbytes >= CMA_BYTES

    def private(self, name: str, count: int, dtype: np.dtype) -> np.ndarray:
        """The private buffer *name* of at least *count* elements (single-copy reads land there; kept for the
        plan's runs)."""
        need = count * dtype.itemsize
        kept = self.kept.get(name)
        if kept is None or kept.nbytes < need:
            kept = self.kept[name] = np.empty(max(need, 64), np.uint8)
        return kept[:need].view(dtype)

    def enter(self, run: Any) -> None:
        """Reserve this call's counter values (the arena is made, collectively, by the first call)."""
        a = self.a = arena(self.state)
        run.base = a.reserve(run, self.ticks)
        self.data = {}
        self.waits_at_end = False

    def end(self, run: Any) -> None:
        self.a.end()

    def guard(self, fn: Callable[[Any], None]) -> Callable[[Any], None]:
        """*fn* marking the arena failed when it raises (the peers waiting on this rank raise instead of hanging)."""

        def guarded(run: Any) -> None:
            try:
                fn(run)
            except BaseException:
                if self.a is not None:
                    self.a.fail()
                raise

        return guarded


def _begin(s: Builder, ticks: int) -> _Call:
    """The first rounds of every shared-memory schedule: reserve counters, wait for the previous call's end."""
    call = _Call(s, ticks)
    s.gate(ticks)
    s.local(call.guard(call.enter), f"reserve {ticks} counter value(s) in the node's shared control window")
    s.sync(DONE, 0, call.others, name="DONE")
    return call


def _end(s: Builder, call: _Call) -> None:
    """The last rounds: raise DONE; wait for every peer's DONE when this call published a pool array."""
    s.local(call.end, "raise DONE")
    s.sync(DONE, call.ticks + 1, call.others, when=lambda run: call.waits_at_end, name="DONE")


def _combiner(s: Builder) -> Callable[[Any, Any, Any], None]:
    """``combine(a, b, out)`` with the call's op (a NumPy ufunc where the op is a built-in one)."""
    op = s.op
    ufunc = getattr(np, op.ufunc, None) if op is not None and op.ufunc else None
    if ufunc is None:
        return op

    def combine(a: Any, b: Any, out: Any) -> None:
        ufunc(a, b, out=out)

    return combine


def reduce(s: Builder, send: View, recv: View | None, root: int | None) -> None:
    """The shared-memory reduction: to every rank (*root* None: allreduce) or to *root* (reduce).

    The vector is cut into chunks of about :data:`CHUNK_BYTES` (whole cache
    lines), each into p slices (:func:`slices`); chunk c is pipelined:

    1. every rank publishes where its input and output live (pool arrays where
       they are) and copies chunk c of a plain input into its scratch - all but
       its own slice, which only it reads - then raises its IN counter to c
       (single-copy: nothing is copied, its input is published where it is);
    2. once every peer's IN has reached c, rank r reduces slice r of chunk c of
       the p inputs in rank order (x_0 ⊕ x_1 ⊕ …: any op) into its scratch
       result, or straight into the pool outputs, and raises its RED counter
       (single-copy: it reads each peer's slice out of the peer's array, and
       reduces into its own output - or a private result, off the root);
    3. once every peer's RED has reached c, a rank whose output is not in a
       pool copies chunk c's p reduced slices out (single-copy: each peer's
       slice straight out of that peer's result).

    Stage 1 of chunk c + 1 runs before stage 2 of chunk c, stage 3 of chunk
    c − 1 after it, so a rank that waits for a slower peer's chunk waits less.
    Descriptor words: input ``[kind, pool, offset or address]``, output
    ``[kind, pool, offset]``, whether the rank wants the result, the address of
    its reduced slices (single-copy).
    """
    rank, p, dtype = s.rank, s.p, s.dtype
    wants = root is None or rank == root
    if p == 1:
        if wants and recv is not None:
            s.copy(recv, send)
        return
    n = send.size
    item = dtype.itemsize
    nbytes = n * item
    region = round_up(nbytes)
    chunk = chunking(n, item)
    nchunks = -(-n // chunk) if n else 0
    combine = _combiner(s)
    call = _begin(s, nchunks)
    d = call.data
    cuts: dict[int, tuple[list[int], list[int]]] = {}

    def bounds(c: int) -> tuple[int, list[int], list[int]]:
        lo = c * chunk
        size = min(chunk, n - lo)
        if size not in cuts:
            cuts[size] = slices(size, p, item)
        return (lo, *cuts[size])

    def setup(run: Any) -> None:
        a, bufs = call.a, run.program.buffers
        x, y = bufs[SEND], (bufs[RECV] if wants else None)
        direct = call.direct(nbytes)
        found = a.locate(x)
        out = target(a, y) if wants and y is not None else [SCRATCH, 0, 0]
        scratch = None if direct else a.scratch(2 * region)  # [input copy | result]
        if found is not None:
            own = [POOL, found[0], found[1]]
        elif direct:
            own = [PRIVATE, 0, address(x)]
        else:
            own = [SCRATCH, 0, 0]
        result = None
        if direct and out[0] != POOL:  # this rank's reduced slices stay in its own memory: its output, or a result
            in_place = y is not None and n and address(x) < address(y) + nbytes and address(y) < address(x) + nbytes
            result = y if wants and not in_place else call.private("result", n, dtype)
        a.publish([*own, *out, int(wants), address(result) if result is not None else 0])
        call.waits_at_end = direct or own[0] == POOL or out[0] == POOL
        d.update(own=own, out=out, flat=x.reshape(-1), y=y, scratch=scratch, direct=direct, result=result,
                 copied=None if scratch is None else scratch[:nbytes].view(dtype), inputs=[], outputs=[],
                 results=[], pooled={})

    def copy_in(c: int, run: Any) -> None:
        if d["own"][0] == SCRATCH:
            lo, counts, displs = bounds(c)
            flat, copied = d["flat"], d["copied"]
            a_, b_ = lo + displs[rank], lo + displs[rank] + counts[rank]
            end = lo + min(chunk, n - lo)
            if a_ > lo:
                copied[lo:a_] = flat[lo:a_]
            if end > b_:
                copied[b_:end] = flat[b_:end]
        call.a.signal(IN, run.base + c + 1)

    def reduce_slice(c: int, run: Any) -> None:
        a = call.a
        inputs, outputs = d["inputs"], d["outputs"]
        if not inputs:  # the peers' descriptors are readable now
            for r in range(p):
                if r == rank:
                    inputs.append(d["flat"])
                elif a.word(r, 0) == PRIVATE:
                    inputs.append(a.word(r, 2))  # an address: read with one copy when needed
                else:
                    inputs.append(a.published(r, nbytes, dtype))
                if a.word(r, 6) and a.word(r, 3) == POOL:
                    outputs.append(a.published(r, nbytes, dtype, at=3))
            if d["result"] is not None:
                outputs.insert(0, d["result"])
            elif not d["direct"] and any(a.word(r, 6) and a.word(r, 3) != POOL for r in range(p)):
                outputs.insert(0, d["scratch"][region : region + nbytes].view(dtype))
            # (single-copy without a result: this rank's output is in a pool, and its slices land there)
        lo, counts, displs = bounds(c)
        count = counts[rank]
        if count:
            i, j = lo + displs[rank], lo + displs[rank] + count
            into = outputs[0][i:j]

            def operand(r: int, which: str) -> Any:
                x = inputs[r]
                if type(x) is int:  # a peer's ordinary array: one copy into a private buffer
                    temp = call.private(which, count, dtype)
                    a.read(r, x + i * item, temp)
                    return temp
                return x[i:j]

            combine(operand(0, "first"), operand(1, "second"), into)  # (into is never this rank's input)
            for r in range(2, p):
                combine(into, operand(r, "first"), into)
            for other in outputs[1:]:
                other[i:j] = into
        a.signal(RED, run.base + c + 1)

    def pooled(r: int) -> Any:
        """Peer r's output in its pool (where it reduced its slices)."""
        if r not in d["pooled"]:
            d["pooled"][r] = call.a.published(r, nbytes, dtype, at=3)
        return d["pooled"][r]

    def copy_out(c: int, run: Any) -> None:
        if d["out"][0] == POOL:
            return
        a = call.a
        lo, counts, displs = bounds(c)
        y = d["y"]
        if d["direct"]:
            for r in range(p):
                if counts[r]:
                    i = lo + displs[r]
                    if r != rank and a.word(r, 3) == POOL:  # the peer reduced into its pool output
                        y[i : i + counts[r]] = pooled(r)[i : i + counts[r]]
                    elif r != rank:
                        a.read(r, a.word(r, 7) + i * item, y[i : i + counts[r]])
                    elif d["result"] is not y:  # (in place: reduced aside, so the input stayed whole until now)
                        y[i : i + counts[r]] = d["result"][i : i + counts[r]]
            return
        results = d["results"]
        if not results:
            results.extend(a.view(r, SCRATCH, 0, region, n, dtype) for r in range(p))
        for r in range(p):
            if counts[r]:
                i, j = lo + displs[r], lo + displs[r] + counts[r]
                y[i:j] = results[r][i:j]

    s.local(call.guard(setup), "publish where the input and the output live")
    copies_out = (lambda run: d["out"][0] != POOL) if wants else None
    for c in range(nchunks + 2):
        if c < nchunks:
            s.local(call.guard(functools.partial(copy_in, c)), f"copy chunk {c} in (all but the own slice); raise IN")
        if 0 < c <= nchunks:
            s.sync(IN, c, call.others, name="IN")
            s.local(call.guard(functools.partial(reduce_slice, c - 1)),
                    f"reduce slice {rank} of chunk {c - 1} over every rank's input; raise RED")
        if wants and c > 1:
            s.sync(RED, c - 1, call.everyone, when=copies_out, name="RED")
            s.local(call.guard(functools.partial(copy_out, c - 2)), f"copy chunk {c - 2}'s reduced slices out")
    _end(s, call)


def bcast(s: Builder, buf: View) -> None:
    """The root publishes its vector chunk by chunk; every other rank copies each chunk as soon as it is there
    (single-copy: the root publishes its array where it is, the others copy out of it)."""
    p, rank, root, dtype = s.p, s.rank, s.root, s.dtype
    if p == 1:
        return
    n = buf.size
    item = dtype.itemsize
    chunk = chunking(n, item)
    nchunks = -(-n // chunk) if n else 0
    call = _begin(s, max(nchunks, 1))
    d = call.data

    def setup(run: Any) -> None:
        a = call.a
        x = run.program.buffers[RECV] if run.program.buffers[RECV] is not None else run.program.buffers[SEND]
        direct = call.direct(n * item)
        d.update(flat=x.reshape(-1), source=None, direct=direct, scratch=None if direct else a.scratch(n * item))
        if rank == root:
            found = a.locate(x)
            if found is not None or direct:
                a.publish([POOL, found[0], found[1]] if found is not None else [PRIVATE, 0, address(x)])
                a.signal(IN, run.base + nchunks)
                call.waits_at_end = True
            else:
                a.publish([SCRATCH, 0, 0])
            d["ready"] = found is not None or direct

    def publish(c: int, run: Any) -> None:
        if not d["ready"]:
            flat, copied = d["flat"], d["scratch"][: n * item].view(dtype)
            copied[c * chunk : (c + 1) * chunk] = flat[c * chunk : (c + 1) * chunk]
            call.a.signal(IN, run.base + c + 1)

    def take(c: int, run: Any) -> None:
        a = call.a
        part = d["flat"][c * chunk : (c + 1) * chunk]
        if a.word(root, 0) == PRIVATE:
            a.read(root, a.word(root, 2) + c * chunk * item, part)
            return
        if d["source"] is None:
            d["source"] = a.published(root, n * item, dtype)
        part[...] = d["source"][c * chunk : (c + 1) * chunk]

    s.local(call.guard(setup), "publish where the root's vector lives")
    for c in range(nchunks):
        if rank == root:
            s.local(call.guard(functools.partial(publish, c)), f"copy chunk {c} into scratch; raise IN")
        else:
            s.sync(IN, c + 1, (root,), name="IN")
            s.local(call.guard(functools.partial(take, c)), f"copy chunk {c} from the root's memory")
    _end(s, call)


def allgather(s: Builder, send: View, recv: View, counts: Sequence[int], displs: Sequence[int]) -> None:
    """Every rank publishes its block, then copies every block straight from the peers' memory."""
    p, rank, dtype = s.p, s.rank, s.dtype
    item = dtype.itemsize
    s.copy(recv.part(displs[rank], displs[rank] + counts[rank]), send)
    if p == 1:
        return
    call = _begin(s, 1)
    biggest = max(counts, default=0) * item

    def setup(run: Any) -> None:
        a = call.a
        x = run.program.buffers[SEND]
        if call.direct(sum(counts) * item) and a.locate(x) is None:
            own = [PRIVATE, 0, address(x)]
        else:
            own = place(a, x, a.scratch(biggest), 0)
        a.publish(own)
        a.signal(IN, run.base + 1)
        call.waits_at_end = own[0] != SCRATCH

    def take(r: int, run: Any) -> None:
        a = call.a
        y = run.program.buffers[RECV][displs[r] : displs[r] + counts[r]]
        if a.word(r, 0) == PRIVATE:
            a.read(r, a.word(r, 2), y)
        else:
            y[...] = a.published(r, counts[r] * item, dtype)

    s.local(call.guard(setup), "publish the block (copied into scratch unless in a pool or read where it is); raise IN")
    for k in range(1, p):
        r = (rank - k) % p
        if counts[r]:
            s.sync(IN, 1, (r,), name="IN")
            s.local(call.guard(functools.partial(take, r)), f"copy rank {r}'s block from its memory")
    _end(s, call)


def reduce_scatter(s: Builder, send: View, recv: View, counts: Sequence[int]) -> None:
    """Each rank reduces its own block straight from the peers' inputs, in rank order."""
    at = [0]
    for c in counts:
        at.append(at[-1] + c)
    item = s.dtype.itemsize
    rank, p, count = s.rank, s.p, counts[s.rank]
    mine = send.part(at[rank], at[rank] + count)
    if p == 1:
        s.copy(recv, mine)
        return
    combine = _combiner(s)
    dtype = s.dtype
    call = _begin(s, 1)
    d = call.data
    total = at[-1] * item

    def setup(run: Any) -> None:
        a = call.a
        x = run.program.buffers[SEND]
        if call.direct(total) and a.locate(x) is None:
            own = [PRIVATE, 0, address(x)]
        else:
            own = place(a, x, a.scratch(total), 0, skip=(at[rank], at[rank + 1]))
        a.publish(own)
        a.signal(IN, run.base + 1)
        call.waits_at_end = own[0] != SCRATCH
        d["x"] = x

    def reduce_block(run: Any) -> None:
        a = call.a
        y = run.program.buffers[RECV]
        x = d["x"].reshape(-1)

        def operand(r: int, which: str) -> Any:
            if r == rank:
                return x[at[rank] : at[rank] + count]
            if a.word(r, 0) == PRIVATE:  # one copy into a private buffer
                temp = call.private(which, count, dtype)
                a.read(r, a.word(r, 2) + at[rank] * item, temp)
                return temp
            return a.published(r, total, dtype)[at[rank] : at[rank] + count]

        if count:  # (y is never the input: registered in_place=False, the plan copies an in-place input aside)
            combine(operand(0, "first"), operand(1, "second"), y)
            for r in range(2, p):
                combine(y, operand(r, "first"), y)

    s.local(call.guard(setup), "publish the input (all but the own block copied into scratch); raise IN")
    s.sync(IN, 1, call.others, name="IN")
    s.local(call.guard(reduce_block), f"reduce block {rank} over every rank's input")
    _end(s, call)


def alltoall(s: Builder, send: View, sendcounts: Sequence[int], senddispls: Sequence[int],
             recv: View, recvcounts: Sequence[int], recvdispls: Sequence[int]) -> None:
    """Every rank publishes its blocks (a header of offsets and counts, then the blocks), then copies its own
    block out of every peer's memory. alltoallv first agrees on the largest scratch any rank needs."""
    p, rank, dtype = s.p, s.rank, s.dtype
    item = dtype.itemsize
    s.copy(recv.part(recvdispls[rank], recvdispls[rank] + recvcounts[rank]),
           send.part(senddispls[rank], senddispls[rank] + sendcounts[rank]))
    if p == 1:
        return
    v = s.collective != "alltoall"
    call = _begin(s, 2)
    d = call.data
    header = round_up(16 * p)
    packed = [0]
    for c in sendcounts:
        packed.append(packed[-1] + c)
    int64 = np.dtype(np.int64)

    def size(run: Any) -> None:
        a = call.a
        found = a.locate(run.program.buffers[SEND])
        direct = found is None and call.direct(packed[-1] * item)  # (alltoall: the same on every rank)
        d["found"], d["direct"] = found, direct
        need = header + (0 if direct else packed[-1] * item)
        if v:  # the scratch must grow alike everywhere: agree on the largest need
            need = header + (0 if found is not None or direct else packed[-1] * item)
            a.publish([0, 0, 0, need])
            a.signal(IN, run.base + 1)
        d["need"] = need

    def setup(run: Any) -> None:
        a = call.a
        need = max(a.word(r, 3) for r in range(p)) if v else d["need"]
        scratch = a.scratch(need)
        table = scratch[: 16 * p].view(np.int64).reshape(p, 2)
        found = d["found"]
        if found is not None or d["direct"]:
            x = run.program.buffers[SEND]
            own = [POOL, found[0], found[1]] if found is not None else [PRIVATE, 0, address(x)]
            table[:, 0] = np.asarray(senddispls[:p], np.int64) * item
        else:
            own = [SCRATCH, 0, header]
            table[:, 0] = np.asarray(packed[:p], np.int64) * item
            data = scratch[header : header + packed[-1] * item].view(dtype)
            flat = run.program.buffers[SEND].reshape(-1)
            j = 0
            while j < p:  # copy runs of blocks that lie one after another in send (not the own block)
                if j == rank or not sendcounts[j]:
                    j += 1
                    continue
                e = j + 1
                while e < p and e != rank and senddispls[e] == senddispls[e - 1] + sendcounts[e - 1]:
                    e += 1
                lo, hi = senddispls[j], senddispls[e - 1] + sendcounts[e - 1]
                data[packed[j] : packed[j] + hi - lo] = flat[lo:hi]
                j = e
        table[:, 1] = sendcounts[:p]
        a.publish(own)
        a.signal(IN, run.base + 2)
        call.waits_at_end = own[0] != SCRATCH
        d["mismatched"] = []

    def take(r: int, run: Any) -> None:
        a = call.a
        theirs = a.view(r, SCRATCH, 0, 0, 2 * p, int64)
        offset, count = int(theirs[2 * rank]), int(theirs[2 * rank + 1])
        if count != recvcounts[r]:
            d["mismatched"].append(f"rank {r} sent {count} elements, recvcounts[{r}] = {recvcounts[r]}")
            return
        if count:
            w = a.words[r]
            y = run.program.buffers[RECV][recvdispls[r] : recvdispls[r] + count]
            if w[0] == PRIVATE:
                a.read(r, w[2] + offset, y)
            else:
                start = w[2] + offset
                y[...] = a.segment(w[0], w[1], r)[start : start + count * item].view(dtype)

    def check(run: Any) -> None:
        if d["mismatched"]:
            raise ValueError(f"{run} on rank {rank}: " + "; ".join(d["mismatched"]) + " - sendcounts and "
                             "recvcounts must match pairwise")

    s.local(call.guard(size), "find the scratch this rank needs" + ("; publish it, raise IN" if v else ""))
    if v:
        s.sync(IN, 1, call.others, name="IN")
    s.local(call.guard(setup), "publish a header (offset and count per destination) and the blocks; raise IN")
    for k in range(1, p):
        r = (rank - k) % p
        s.sync(IN, 2, (r,), name="IN")
        s.local(call.guard(functools.partial(take, r)), f"copy the block for this rank out of rank {r}'s memory")
    _end(s, call)
    s.local(check, "check the senders' counts")
