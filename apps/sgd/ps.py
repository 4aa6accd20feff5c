"""Parameter-server training (``ps-sync`` and ``ps-async``): workers push gradients, servers own the weights.

The contract (what :mod:`tests.apps.sgd.test_ps` checks):

**Roles** (:func:`layout`). On a communicator of N ranks there are two layouts:

* *dedicated servers* (``servers`` = K, ``1 <= K < N``): the LAST K ranks only
  serve and the first W = N - K are workers (so rank 0 is always a worker);
* *co-located* (``servers`` = :data:`COLOCATED`, 0; ``--servers 0`` or
  ``--servers colocated``): every rank is a worker AND the server of one shard,
  so W = K = N (the "sharded parameter server"; it runs from one rank).

Anything else is a ``ValueError``. The model's flat parameter vector
(``model.params``, one buffer) is cut into K contiguous shards with
:func:`apps.blocks.block`; server k owns shard k: its parameters and the
optimizer state of that shard only (``optimizer.init_state(shard_size, ...)``).
A server keeps no model gradients of its own shard, only the workers' pushed
slices until they are applied. A server's initial shard is taken from its own
``model.params`` (every rank builds the model from the same seed, or loads the
same checkpoint).

**Clocks.** Every worker runs the clocks ``start`` .. ``total_steps``-1 (``start``
is 0, or the step a run resumes from). At clock c a worker computes the
gradient of its share of the global batch with ``softmax_cross_entropy(logits,
y, denominator=global_count / W)`` - so the mean over the workers of their
gradients is the single-process gradient of the whole global batch - and
**pushes** to each server its slice of that gradient (a typed, nonblocking
``isend_array`` of a copy of the slice; the copy lives until the send
completes; a co-located rank pushes its own slice to itself the same way).

**Updates.** A server applies updates clock by clock, deterministically: once
it holds the gradients of clock c from ALL workers it sums them in worker order
(never arrival order), divides by W and applies one optimizer step to its
shard. The result is parameter *version* c+1 (version ``start`` = the initial or
restored weights). The sequence of applied updates is therefore the same
whatever the timing or the layout.

**Pulls, bounded staleness S** (stale synchronous parallel, Ho et al. 2013). A
worker computes clock c with exactly version ``max(start, c - S)`` of every
shard: version ``start`` is pulled before the first clock, and right after
pushing clock c the worker pulls version ``max(start, c + 1 - S)`` for clock c + 1
(nothing when it already holds that version). Servers publish versions on the
rendezvous (``comm.rendezvous()``) under the keys ``"v0"``, ``"v1"``, ... - each a
copy that never changes - and a pull of a version not yet applied waits at its
server until it is. S = 0 is the synchronous parameter server (``ps-sync``); any
fixed S gives the same parameters on every run, though different ones from
S = 0. A server publishes only the versions some worker will ask for (``start``
.. T-1-S and T, with T = total_steps) and unpublishes a version as soon as all W
workers have been served it, so at most about S + 2 versions are held.

**Unbounded staleness** (``staleness=None``). Before each clock the worker pulls
the key ``"latest"``, which a server republishes (unpublish the old copy,
publish the new one) at every version: the worker gets whatever is newest when
its request is served. That depends on timing, so results may differ from run
to run; the updates applied are still per clock, in worker order.

**The end.** After its last clock every worker pulls exactly version
total_steps (for every S, including unbounded), so all workers end with
identical parameters equal to the servers' shards. A dedicated server runs
:meth:`ParameterServer.serve` until it has applied and published every clock;
then every rank calls :meth:`ParameterServer.close` (collective: it serves the
pulls still coming, completes the sends and frees the communicators).

**Progress.** There is no progress thread (mpicomm's point-to-point requests
advance inside mpicomm's waits and tests). A dedicated server sleeps in
``Waitany`` over its posted receives in :meth:`serve`, which also answers the
rendezvous' pulls; a worker's pushes progress while it waits for its pulls. A
co-located rank must serve while it computes, or a fast worker would wait for a
slow one's shard: before its forward, after it, after each layer's backward
(the model's backward hook) and in every wait of its own, it takes the pushes
that have arrived, applies every complete clock and publishes the version
(:meth:`ParameterServer.poll`, which never blocks); its waits are ``Waitany``
over its own requests and its posted receives, so it serves while it waits.

**Checkpoints** (:meth:`full_params`, :meth:`full_state`, :meth:`load_full_state`,
the same interface as :class:`apps.sgd.ddp.DDP`). A checkpoint after step s is
taken between steps, collectively: every worker first completes its pushes and
every server serves until it has applied clock s - 1 (a dedicated server by
``serve(until=s)``), so every shard is at version s, exactly; then the shards and
their optimizer state (with its ``step`` counter, the same on every shard) are
gathered to rank 0 as whole vectors - the format of the other modes, so any mode
resumes from them. A run restarted with ``start = s`` publishes version s from
the loaded weights; the workers' data position and dropout keys follow from the
step. ``ps-sync`` then continues bit for bit; ``ps-async`` computes clock c with
version ``max(s, c - S)`` (the versions before s are not kept), a new path from
the same saved state.

**Traffic** (:attr:`ParameterServer.stats`). Per step each worker pushes and
pulls one shard per server: 2·Ψ bytes in all (Ψ = the model's bytes), while a
server's link carries 2·W·Ψ/K bytes, O(W) per step, where an all-reduce moves
2(N-1)/N·Ψ per rank. ``stats["link_bytes"]`` is this rank's total over its
links - a co-located rank's pushes and pulls of its own shard stay on the rank
and are not counted, so there each rank's link carries 2·2(N-1)/N·Ψ per step -
and the busiest link per step is ``max over ranks of link_bytes / clocks``.
"""

from __future__ import annotations

import numbers
import time
from typing import Any

import numpy as np
from mpi4py import MPI

import mpicomm
from apps.agree import verdict
from apps.blocks import block
from apps.nn import correct, softmax_cross_entropy
from apps.nn.xp import array_module, to_host
from apps.sgd.ddp import StepResult, _as, _state_bytes

__all__ = ["COLOCATED", "ParameterServer", "layout"]

#: ``servers`` value of the co-located layout: every rank is a worker and the server of one shard.
COLOCATED = 0

#: Push tags cycle through the smallest tag range MPI guarantees (messages of one pair stay in order anyway).
_TAGS = 32768


def _check_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int, got {value!r}")
    return int(value)


def layout(size: int, servers: int) -> tuple[int, int]:
    """(W workers, K servers) on *size* ranks: *servers* dedicated ones (the last ranks, ``1 <= K < size``), or
    :data:`COLOCATED` (0): every rank a worker and the server of one shard, W = K = size. ``ValueError`` otherwise."""
    if servers == COLOCATED:
        return size, size
    if not 1 <= servers < size:
        raise ValueError(f"--servers {servers}: need 1 <= K < N ranks (N = {size}); the rest are workers "
                         f"(or --servers 0: every rank a worker and the server of one shard)")
    return size - servers, servers


class ParameterServer:
    """The ``ps-sync`` / ``ps-async`` strategy: workers step, servers (dedicated or co-located) serve (module docstring).

    Same interface as :class:`apps.sgd.ddp.DDP` where it applies: ``step(x, y,
    global_count)`` on a worker returns a :class:`apps.sgd.ddp.StepResult`;
    ``memory()`` reports bytes held; ``full_params()``/``full_state()``/
    ``load_full_state()`` for checkpoints; plus ``serve()`` on a dedicated
    server and the collective ``close()`` on every rank.
    """

    def __init__(self, comm: Any, model: Any, optimizer: Any, *, servers: int = 1, staleness: int | None = 0,
                 total_steps: int, start: int = 0):
        # Every check is local and the same on every rank: all ranks raise before any communication.
        size = comm.Get_size()
        servers = _check_int(servers, "servers")
        if staleness is not None:
            staleness = _check_int(staleness, "staleness")
        total_steps = _check_int(total_steps, "total_steps")
        start = _check_int(start, "start")
        workers, shards = layout(size, servers)
        if staleness is not None and staleness < 0:
            raise ValueError(f"--staleness {staleness}: must be >= 0 (0 is synchronous)")
        if total_steps < 0:
            raise ValueError(f"total_steps {total_steps}: must be >= 0")
        if not 0 <= start <= total_steps:
            raise ValueError(f"start {start}: the run resumes at a step in 0 .. total_steps={total_steps}")

        self.model = model
        self.optimizer = optimizer
        self.colocated = servers == COLOCATED
        self.servers = shards
        self.staleness = staleness
        self.total_steps = total_steps
        self.start = start
        self.name = "ps-sync" if staleness == 0 else "ps-async"
        self.rank = comm.Get_rank()
        self.world = size
        self.workers = workers
        self.is_server = self.colocated or self.rank >= workers
        self.is_worker = self.colocated or not self.is_server
        self.worker_index = self.rank if self.is_worker else -1
        self.server_index = (self.rank if self.colocated else self.rank - workers) if self.is_server else -1
        self.xp = array_module(model.params)
        self.dtype = model.params.dtype
        n = model.num_params
        self.bounds = [block(n, shards, k) for k in range(shards)]  # shard k: [lo, hi) of the flat vector

        # Private communicator for the pushes (collective): nothing else on *comm* can match them.
        self._comm = mpicomm.Comm(MPI.Intracomm.Dup(MPI.Intracomm(comm)))
        self._rdv = self._comm.rendezvous()  # collective
        self._closed = False
        self._open = False  # a server publishes its first version and posts its receives on first use
        self.clock = start  # worker: the next clock (clocks pushed so far: clock - start)
        self.version = start  # server: the newest version applied
        self._pushed = [0] * shards
        self._pulled = [0] * shards
        self._received = [0] * workers
        self._sends: list[tuple[Any, Any]] = []  # (request, the copy it sends)
        self.held: int | str | None = None  # worker: version of the parameters in model.params

        if self.is_server:
            lo, hi = self.bounds[self.server_index]
            self.shard = model.params[lo:hi].copy()
            self.state = optimizer.init_state(hi - lo, self.xp, self.dtype)
            self._acc = self.xp.empty(hi - lo, self.dtype)
            self._pending: dict[int, list[Any]] = {}  # clock -> gradients by worker (None until received)
            self._live: dict[str, Any] = {}  # published version keys -> their copies
            self._latest: Any = None
            self._next = [start] * workers  # the clock of each worker's next push
            self._active: dict[int, Any] = {}  # worker -> the receive posted for its next push
        else:
            self.shard = None
            self.state = {}
        # A co-located rank serves between its layers' backward (module docstring, Progress).
        self._hook = (lambda layer: self.poll()) if self.colocated else None

    # ------------------------------------------------------------ versions

    def version_for(self, clock: int) -> int | str:
        """The version a worker computes *clock* with: ``max(start, clock - S)``, ``"latest"`` when unbounded;
        ``clock == total_steps`` is the final pull, always exactly version total_steps."""
        if clock >= self.total_steps:
            return self.total_steps
        if self.staleness is None:
            return "latest"
        return max(self.start, clock - self.staleness)

    def _wanted(self, version: int) -> bool:
        """Will workers pull this version by its key (so it must be published)?"""
        if version == self.total_steps:
            return True
        if self.staleness is None:
            return False
        return version == self.start or version <= self.total_steps - 1 - self.staleness

    def _server_rank(self, k: int) -> int:
        return k if self.colocated else self.workers + k

    # ------------------------------------------------------------ worker

    def step(self, x: Any, y: Any, global_count: int, divisor: int | None = None) -> StepResult:
        """One clock on a worker: pull if needed, forward/backward on this share, push the slices, pull the next."""
        if not self.is_worker:
            raise RuntimeError(f"rank {self.rank} is a parameter server; it calls serve(), not step()")
        if divisor is not None:
            raise ValueError("the parameter-server modes have no uneven inputs (Join); pass no divisor")
        if self._closed:
            raise RuntimeError("step() after close()")
        if self.clock >= self.total_steps:
            raise RuntimeError(f"step {self.clock + 1} of a run of total_steps={self.total_steps}: "
                               f"every worker runs exactly total_steps steps")
        model = self.model
        result = StepResult()
        t0 = time.perf_counter()
        self.poll()
        if self.held is None:  # before the first clock; every later clock's version was pulled by the step before
            self._ensure(self.version_for(self.clock))
        t1 = time.perf_counter()
        model.zero_grad()
        logits = model.forward(x, train=True)
        self.poll()
        loss, dlogits = softmax_cross_entropy(logits, y, global_count / self.workers)
        result.loss_sum = loss * len(y)
        result.correct = correct(logits, y)
        model.backward(dlogits, hook=self._hook)
        t2 = time.perf_counter()
        self._push()
        self.clock += 1
        self._ensure(self.version_for(self.clock))
        t3 = time.perf_counter()
        result.samples = len(y)
        result.compute = t2 - t1
        result.exposed = (t1 - t0) + (t3 - t2)
        result.comm_total = result.exposed
        return result

    def _push(self) -> None:
        """Send each server its slice of this clock's gradient (copies: the gradient buffer is reused)."""
        self._sends = [(r, b) for r, b in self._sends if not r.done]
        tag = self.clock % _TAGS
        for k, (lo, hi) in enumerate(self.bounds):
            piece = self.model.grads[lo:hi].copy()
            self._sends.append((self._comm.isend_array(piece, self._server_rank(k), tag), piece))
            self._pushed[k] += int(piece.nbytes)

    def _ensure(self, version: int | str) -> None:
        """Make model.params hold *version* of every shard (pull from all servers at once unless held)."""
        if version == self.held and version != "latest":
            return
        key = version if version == "latest" else f"v{version}"
        params = self.model.params
        pulls = []
        for k, (lo, hi) in enumerate(self.bounds):
            pulls.append(self._rdv.ipull(key, self._server_rank(k), out=params[lo:hi]))
            self._pulled[k] += (hi - lo) * params.itemsize
        self._wait(pulls)
        self.held = version

    def _wait(self, requests: list[Any]) -> None:
        """Wait for *requests* (mpicomm or plain MPI ones); a server keeps serving meanwhile (pulls, even its own
        rank's, may wait on it)."""
        if not self.is_server:
            mpicomm.Request.Waitall(requests)
            return
        pending = list(requests)
        while True:
            self.poll()
            pending = [r for r in pending if (not r.done if isinstance(r, mpicomm.Request) else r)]
            if not pending:
                break
            mpicomm.Request.Waitany(pending + list(self._active.values()))  # sleeps in MPI; pulls are answered
        mpicomm.Request.Waitall(requests)  # (done: reports their completion, raises a failed one's error)

    # ------------------------------------------------------------ server

    def _begin(self) -> None:
        """On first use: publish version ``start`` of this shard and post one receive per worker."""
        if self._open or not self.is_server:
            return
        self._open = True
        self._publish(self.version)
        for w in range(self.workers):
            if self._next[w] < self.total_steps:
                self._active[w] = self._post(w, self._next[w])

    def _publish(self, version: int) -> None:
        """Offer version *version* of this shard (a copy), and drop versions every worker has pulled."""
        copy = self.shard.copy()
        if self._wanted(version):
            key = f"v{version}"
            self._rdv.publish(key, copy)
            self._live[key] = copy
        if self.staleness is None and version < self.total_steps:
            self._rdv.unpublish("latest")
            self._rdv.publish("latest", copy)
            self._latest = copy
        self._collect()

    def _collect(self) -> None:
        """Unpublish the versions all W workers have been served."""
        for key in [k for k in self._live if self._rdv.served[k] >= self.workers]:
            self._rdv.unpublish(key)
            del self._live[key]

    def _post(self, worker: int, clock: int) -> Any:
        """The receive of *worker*'s push of *clock* (workers are ranks 0 .. W-1 in both layouts)."""
        n = self.shard.size
        return self._comm.irecv_array(self.xp.empty(n, self.dtype), worker, clock % _TAGS)

    def _take(self) -> None:
        """Take every push that has arrived (posting the worker's next receive), then apply the complete clocks."""
        workers, total, nxt = self.workers, self.total_steps, self._next
        moved = True
        while moved:  # a receive posted just now may have completed at once
            moved = False
            for w, request in list(self._active.items()):
                if not request.done:
                    continue
                grad = request.wait()
                del self._active[w]
                c = nxt[w]
                self._received[w] += int(grad.nbytes)
                self._pending.setdefault(c, [None] * workers)[w] = grad
                nxt[w] = c + 1
                if nxt[w] < total:
                    self._active[w] = self._post(w, nxt[w])
                moved = True
        while self.version in self._pending and all(g is not None for g in self._pending[self.version]):
            self._apply(self._pending.pop(self.version))

    def poll(self) -> None:
        """On a server, without blocking: take the pushes that have arrived, apply and publish every complete clock,
        release the versions every worker has been served, answer pulls; nothing on a dedicated worker."""
        if not self.is_server or self._closed:
            return
        self._begin()
        self._rdv.progress()
        self._take()
        self._collect()

    def serve(self, until: int | None = None) -> None:
        """Receive, apply and publish clocks until version *until* (default: total_steps, every clock) is applied.

        A dedicated server's loop (it sleeps in MPI, answering pulls meanwhile);
        ``until`` stops it at a checkpoint's step. A co-located rank serves inside
        :meth:`step`, and here only to catch up to its own clock.
        """
        if not self.is_server:
            raise RuntimeError(f"rank {self.rank} is a worker; only the last {self.servers} rank(s) serve()")
        if self._closed:
            raise RuntimeError("serve() after close()")
        until = self.total_steps if until is None else _check_int(until, "until")
        if not self.version <= until <= self.total_steps:
            raise ValueError(f"serve(until={until}): this server is at version {self.version}; until must be in "
                             f"{self.version} .. total_steps={self.total_steps}")
        while True:
            self.poll()
            if self.version >= until:
                return
            mpicomm.Request.Waitany(list(self._active.values()))

    def _apply(self, grads: list[Any]) -> None:
        """One optimizer step from the clock's gradients: summed in worker order, divided by W."""
        acc = self._acc
        acc[...] = grads[0]
        for g in grads[1:]:
            acc += g
        acc /= self.workers
        self.optimizer.step(self.shard, acc, self.state)
        self.version += 1
        self._publish(self.version)

    # ------------------------------------------------------------ checkpoints

    def _settle(self) -> None:
        """Between steps, before a checkpoint (collective): complete this worker's pushes; a co-located server
        catches up to its clock (a dedicated one was brought there by ``serve(until=step)``); then a nonblocking
        barrier, during which servers answer the pulls still coming. After it no rank waits on another, so the
        blocking collectives that follow cannot hold up a pull."""
        if self._closed:
            raise RuntimeError("checkpoint after close()")
        if self.is_worker:
            self._wait([r for r, _ in self._sends])
            self._sends.clear()
        if self.colocated:
            self.serve(until=self.clock)
        self._wait([MPI.Intracomm.Ibarrier(self._comm)])

    def _gather(self, part: Any) -> list[tuple[int, Any]] | None:
        """Every server's (version, *part*) to rank 0 in shard order (collective); None elsewhere."""
        mine = (self.server_index, self.version, part) if self.is_server else None
        every = self._comm.gather(mine, root=0)
        found = sorted((e for e in every if e is not None), key=lambda e: e[0]) if every is not None else []
        versions = sorted({v for _, v, _ in found})
        problem = None
        if every is not None and versions != [self.clock]:  # rank 0 is a worker: its clock is the step
            problem = (f"parameter-server checkpoint at step {self.clock}: the shards are at versions {versions}; "
                       f"every shard must be at the checkpoint's step (a bug: report it)")
        verdict(self._comm, problem, RuntimeError)
        return None if every is None else [(v, p) for _, v, p in found]

    def full_params(self) -> Any:
        """The whole parameter vector at the newest version, on rank 0 (None elsewhere; collective)."""
        self._settle()
        shards = self._gather(to_host(self.shard) if self.is_server else None)
        return None if shards is None else np.concatenate([p for _, p in shards])

    def full_state(self) -> dict[str, Any]:
        """The servers' optimizer state as whole vectors (``step``: the counter, the same on every shard), on rank 0
        ({} elsewhere; collective)."""
        self._settle()
        mine = {k: to_host(v) for k, v in self.state.items()} if self.is_server else None
        shards = self._gather(mine)
        if shards is None:
            return {}
        states = [s for _, s in shards]
        whole = {k: np.concatenate([s[k] for s in states]) for k in states[0] if k != "step"}
        whole["step"] = states[0]["step"]
        return whole

    def load_full_state(self, state: dict[str, Any]) -> None:
        """Take this server's shard of a whole optimizer state (from a checkpoint), and its parameters from
        ``model.params`` (load those into the model first); before the first step or serve."""
        if self._open:
            raise RuntimeError("load_full_state() after the run started; load a checkpoint before the first step")
        if not self.is_server:
            return
        lo, hi = self.bounds[self.server_index]
        self.shard[...] = self.model.params[lo:hi]
        for key, value in state.items():
            part = value if key == "step" else value[lo:hi]
            self.state[key][...] = _as(self.state[key], part)

    # ------------------------------------------------------------ end

    def close(self) -> None:
        """Collective on every rank: finish (final pull / serving), complete sends, close the rendezvous."""
        if self._closed:
            return
        if self.is_worker:
            if self.clock != self.total_steps:
                raise RuntimeError(f"close() after {self.clock} of total_steps={self.total_steps} steps on worker "
                                   f"{self.worker_index}: every worker must run exactly total_steps steps")
            self._ensure(self.total_steps)  # a no-op after the last step (it pulled the final version)
            self._wait([r for r, _ in self._sends])
            self._sends.clear()
        if self.is_server:
            self.serve()
        self._closed = True
        self._rdv.close()  # serves the pulls still coming until every rank is done
        if self.is_server:
            self._live.clear()
            self._latest = None
        self._comm.Free()

    # ------------------------------------------------------------ accounting

    @property
    def stats(self) -> dict[str, Any]:
        """Bytes over this rank's links: per server on a worker, received + sent on a server; both on a co-located
        rank, whose traffic with its own shard is listed but not counted in ``link_bytes`` (it stays on the rank)."""
        out: dict[str, Any] = {"role": "worker and server" if self.colocated else
                               "worker" if self.is_worker else "server",
                               "clocks": self.clock - self.start if self.is_worker else self.version - self.start}
        link = 0
        own = self.server_index if self.colocated else -1
        if self.is_worker:
            out["pushed"], out["pulled"] = list(self._pushed), list(self._pulled)
            link += sum(b for k, b in enumerate(self._pushed) if k != own)
            link += sum(b for k, b in enumerate(self._pulled) if k != own)
        if self.is_server:
            received = sum(self._received)
            sent = sum(self._rdv.served.values()) * int(self.shard.nbytes)
            out.update(received=received, sent=sent, received_from=list(self._received))
            link += received + sent
            if self.colocated:
                link -= self._received[self.worker_index] + self._pulled[own]
        out["link_bytes"] = link
        return out

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds: a worker the whole model and its gradients (and push copies in flight);
        a server its shard plus published versions, pending gradients and its optimizer state; a co-located
        rank both."""
        out = {"params": 0, "grads": 0, "optimizer": 0}
        if self.is_worker:
            in_flight = sum(int(b.nbytes) for r, b in self._sends if not r.done)
            out["params"] += int(self.model.params.nbytes)
            out["grads"] += int(self.model.grads.nbytes) + in_flight
        if self.is_server:
            copies = {id(a): a for a in list(self._live.values()) + [self._latest] if a is not None}
            pending = sum(int(g.nbytes) for gs in self._pending.values() for g in gs if g is not None)
            out["params"] += int(self.shard.nbytes) + sum(int(a.nbytes) for a in copies.values())
            out["grads"] += int(self._acc.nbytes) + pending
            out["optimizer"] += _state_bytes(self.state)
        return out
