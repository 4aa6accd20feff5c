"""Parameter-server training (``ps-sync`` and ``ps-async``): workers push gradients, servers own the weights.

The contract (what :mod:`tests.apps.sgd.test_ps` checks):

**Roles.** On a communicator of N ranks the LAST ``servers`` = K ranks are
dedicated servers and the first W = N - K are workers (so rank 0 is always a
worker); ``1 <= K < N``, else ``ValueError``. The model's flat parameter vector
(``model.params``, one buffer) is cut into K contiguous shards with
:func:`apps.blocks.block`; server k owns shard k: its parameters and the
optimizer state of that shard only (``optimizer.init_state(shard_size, ...)``).
Servers never run forward or backward and keep no model gradients, only the
workers' pushed slices until they are applied. A server's initial shard is
taken from its own ``model.params`` (every rank builds the model from the same
seed).

**Clocks.** Every worker runs exactly ``total_steps`` steps (clocks
0 .. total_steps-1). At clock c a worker computes the gradient of its share of
the global batch with ``softmax_cross_entropy(logits, y, denominator=global_count
/ W)`` - so the mean over the workers of their gradients is the single-process
gradient of the whole global batch - and **pushes** to each server its slice of
that gradient (a typed, nonblocking ``isend_array`` of a copy of the slice; the
copy lives until the send completes).

**Updates.** A server applies updates clock by clock, deterministically: once
it holds the gradients of clock c from ALL workers it sums them in worker order
(never arrival order), divides by W and applies one optimizer step to its
shard. The result is parameter *version* c+1 (version 0 = the initial weights).
The sequence of applied updates is therefore the same whatever the timing.

**Pulls, bounded staleness S** (stale synchronous parallel, Ho et al. 2013). A
worker computes clock c with exactly version ``max(0, c - S)`` of every shard:
version 0 is pulled before clock 0, and right after pushing clock c the worker
pulls version ``max(0, c + 1 - S)`` for clock c + 1 (nothing when it already
holds that version). Servers publish versions on the rendezvous
(``comm.rendezvous()``) under the keys ``"v0"``, ``"v1"``, ... - each a copy that
never changes - and a pull of a version not yet applied waits at its server
until it is. S = 0 is the synchronous parameter server (``ps-sync``); any fixed S
gives the same parameters on every run, though different ones from S = 0.
A server publishes only the versions some worker will ask for (0 .. T-1-S and
T, with T = total_steps) and unpublishes a version as soon as all W workers have
been served it, so at most about S + 2 versions are held.

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

There is no progress thread: a server's rendezvous answers pulls while it
waits in :meth:`serve` (or in :meth:`close`), and a worker's pushes progress
while it waits for its pulls.

**Traffic** (:attr:`ParameterServer.stats`). Per step each worker pushes and
pulls one shard per server: 2·Ψ bytes in all over its link (Ψ = the model's
bytes), while a server's link carries 2·W·Ψ/K bytes, O(W) per step, where an
all-reduce moves 2(N-1)/N·Ψ per rank. ``stats["link_bytes"]`` is this rank's total
over its links, so the busiest link per step is ``max over ranks of
link_bytes / clocks``.
"""

from __future__ import annotations

import numbers
import time
from typing import Any

from mpi4py import MPI

import mpicomm
from apps.blocks import block
from apps.nn import correct, softmax_cross_entropy
from apps.nn.xp import array_module
from apps.sgd.ddp import StepResult, _state_bytes

__all__ = ["ParameterServer"]

#: Push tags cycle through the smallest tag range MPI guarantees (messages of one pair stay in order anyway).
_TAGS = 32768


def _check_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int, got {value!r}")
    return int(value)


class ParameterServer:
    """The ``ps-sync`` / ``ps-async`` strategy: workers step, dedicated servers serve (module docstring).

    Same interface as :class:`apps.sgd.ddp.DDP` where it applies: ``step(x, y,
    global_count)`` on a worker returns a :class:`apps.sgd.ddp.StepResult`;
    ``memory()`` reports bytes held; plus ``serve()`` on a server and the
    collective ``close()`` on every rank.
    """

    def __init__(self, comm: Any, model: Any, optimizer: Any, *, servers: int = 1, staleness: int | None = 0,
                 total_steps: int):
        # Every check is local and the same on every rank: all ranks raise before any communication.
        size = comm.Get_size()
        servers = _check_int(servers, "servers")
        if staleness is not None:
            staleness = _check_int(staleness, "staleness")
        total_steps = _check_int(total_steps, "total_steps")
        if not 1 <= servers < size:
            raise ValueError(f"--servers {servers}: need 1 <= K < N ranks (N = {size}); the rest are workers")
        if staleness is not None and staleness < 0:
            raise ValueError(f"--staleness {staleness}: must be >= 0 (0 is synchronous)")
        if total_steps < 0:
            raise ValueError(f"total_steps {total_steps}: must be >= 0")

        self.model = model
        self.optimizer = optimizer
        self.servers = servers
        self.staleness = staleness
        self.total_steps = total_steps
        self.name = "ps-sync" if staleness == 0 else "ps-async"
        self.rank = comm.Get_rank()
        self.world = size
        self.workers = size - servers
        self.is_server = self.rank >= self.workers
        self.is_worker = not self.is_server
        self.worker_index = self.rank if self.is_worker else -1
        self.server_index = self.rank - self.workers if self.is_server else -1
        self.xp = array_module(model.params)
        self.dtype = model.params.dtype
        n = model.num_params
        self.bounds = [block(n, servers, k) for k in range(servers)]  # shard k: [lo, hi) of the flat vector

        # Private communicator for the pushes (collective): nothing else on *comm* can match them.
        self._comm = mpicomm.Comm(MPI.Intracomm.Dup(MPI.Intracomm(comm)))
        self._rdv = self._comm.rendezvous()  # collective
        self._closed = False
        self.clock = 0  # worker: clocks pushed; server: clocks applied (= the newest version)
        self._pushed = [0] * servers
        self._pulled = [0] * servers
        self._received = [0] * self.workers
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
            self._next = [0] * self.workers  # the clock of each worker's next push
            self._publish(0)
        else:
            self.shard = None
            self.state = {}

    # ------------------------------------------------------------ versions

    def version_for(self, clock: int) -> int | str:
        """The version a worker computes *clock* with: ``max(0, clock - S)``, ``"latest"`` when unbounded;
        ``clock == total_steps`` is the final pull, always exactly version total_steps."""
        if clock >= self.total_steps:
            return self.total_steps
        if self.staleness is None:
            return "latest"
        return max(0, clock - self.staleness)

    def _wanted(self, version: int) -> bool:
        """Will workers pull this version by its key (so it must be published)?"""
        if version == self.total_steps:
            return True
        if self.staleness is None:
            return False
        return version == 0 or version <= self.total_steps - 1 - self.staleness

    def _server_rank(self, k: int) -> int:
        return self.workers + k

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
        if self.held is None:  # before clock 0; every later clock's version was pulled by the step before
            self._ensure(self.version_for(self.clock))
        t1 = time.perf_counter()
        model.zero_grad()
        logits = model.forward(x, train=True)
        loss, dlogits = softmax_cross_entropy(logits, y, global_count / self.workers)
        result.loss_sum = loss * len(y)
        result.correct = correct(logits, y)
        model.backward(dlogits)
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
        mpicomm.Request.Waitall(pulls)
        self.held = version

    # ------------------------------------------------------------ server

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
        n = self.shard.size
        return self._comm.irecv_array(self.xp.empty(n, self.dtype), worker, clock % _TAGS)

    def serve(self) -> None:
        """On a dedicated server: receive, apply and publish every clock; returns after version total_steps."""
        if not self.is_server:
            raise RuntimeError(f"rank {self.rank} is a worker; only the last {self.servers} rank(s) serve()")
        if self._closed:
            raise RuntimeError("serve() after close()")
        total, workers = self.total_steps, self.workers
        # One receive posted per worker, for its next clock (workers may be up to S + 1 clocks ahead).
        nxt = self._next
        active = {w: self._post(w, nxt[w]) for w in range(workers) if nxt[w] < total}
        while self.clock < total:
            order = list(active)
            i = mpicomm.Request.Waitany([active[w] for w in order])
            w = order[i]
            grad = active.pop(w).wait()
            c = nxt[w]
            self._received[w] += int(grad.nbytes)
            self._pending.setdefault(c, [None] * workers)[w] = grad
            nxt[w] = c + 1
            if nxt[w] < total:
                active[w] = self._post(w, nxt[w])
            while self.clock in self._pending and all(g is not None for g in self._pending[self.clock]):
                self._apply(self._pending.pop(self.clock))
            self._collect()

    def _apply(self, grads: list[Any]) -> None:
        """One optimizer step from the clock's gradients: summed in worker order, divided by W."""
        acc = self._acc
        acc[...] = grads[0]
        for g in grads[1:]:
            acc += g
        acc /= self.workers
        self.optimizer.step(self.shard, acc, self.state)
        self.clock += 1
        self._publish(self.clock)

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
            mpicomm.Request.Waitall([r for r, _ in self._sends])
            self._sends.clear()
        elif self.clock < self.total_steps:
            self.serve()
        self._closed = True
        self._rdv.close()  # serves the pulls still coming until every rank is done
        if self.is_server:
            self._live.clear()
            self._latest = None
        self._comm.Free()

    # ------------------------------------------------------------ accounting

    def _sent(self) -> int:
        return sum(self._rdv.served.values()) * int(self.shard.nbytes)

    @property
    def stats(self) -> dict[str, Any]:
        """Bytes over this rank's links: per server on a worker, received + sent on a server."""
        if self.is_worker:
            out: dict[str, Any] = {"role": "worker", "clocks": self.clock, "pushed": list(self._pushed),
                                   "pulled": list(self._pulled)}
            out["link_bytes"] = sum(self._pushed) + sum(self._pulled)
            return out
        received, sent = sum(self._received), self._sent()
        return {"role": "server", "clocks": self.clock, "received": received, "sent": sent,
                "received_from": list(self._received), "link_bytes": received + sent}

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds: a worker the whole model and its gradients (and push copies in flight);
        a server its shard plus published versions, pending gradients and its optimizer state."""
        if self.is_worker:
            in_flight = sum(int(b.nbytes) for r, b in self._sends if not r.done)
            return {"params": int(self.model.params.nbytes), "grads": int(self.model.grads.nbytes) + in_flight,
                    "optimizer": 0}
        copies = {id(a): a for a in list(self._live.values()) + [self._latest] if a is not None}
        pending = sum(int(g.nbytes) for gs in self._pending.values() for g in gs if g is not None)
        return {"params": int(self.shard.nbytes) + sum(int(a.nbytes) for a in copies.values()),
                "grads": int(self._acc.nbytes) + pending,
                "optimizer": _state_bytes(self.state)}
