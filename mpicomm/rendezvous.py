"""Pull, receiver-initiated: ask an owner for a named array, the owner answers with the data.

This is the rendezvous of TensorFlow's distributed runtime: a producer
*publishes* a value under a key whenever it is ready; a consumer *pulls* the
key from the producer's rank whenever it needs it. Either may come first - a
request for a key not yet published waits at the owner until it is.

Protocol (all on private duplicates of the communicator):

1. the puller sends a small request - key, element offset and count, request id -
   to the owner on ``control``, and posts the receive of the answer;
2. the owner's server - one receive always posted on ``control`` for each rank, itself
   included - takes the request and answers with the slice as a typed message
   (:mod:`mpicomm.p2p`) tagged with the request id - or, for a key it never published,
   with an error.

The server posts a receive per source rather than one wildcard (``MPI.ANY_SOURCE``)
receive: across nodes, MPICH's UCX network module lost wildcard receives here (a
plain mpi4py program of 4 ranks on 2 nodes, each serving one wildcard request,
hangs in about one run of three), and a receive that names its source is matched
by every MPI and network module alike. Its cost is one small buffer per rank
(``MAX_KEY_BYTES`` + 32 bytes).

There is no progress thread: the server runs whenever this rank waits or
tests on any mpicomm request (``pull`` does, so two ranks pulling from each
other serve each other), and in :meth:`Rendezvous.progress`. :meth:`close` is
collective: each rank keeps serving until every rank has finished pulling;
requests for keys an owner never published are answered with an error then,
so nobody waits forever.
"""

from __future__ import annotations

from collections import Counter
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from . import p2p, trace
from .engine.requests import Request, Steps, barrier, progress
from .transport.buffers import adopt, array_module, check_array, element_view
from .validate import check_int, check_peer

if TYPE_CHECKING:
    from .comm import Comm

__all__ = ["Rendezvous"]

_PULL = 1  # tag of requests on the control communicator
_FIELDS = 4  # request id, offset, count (-1: to the end), key length


class Rendezvous:
    """Named arrays that other ranks pull (create with ``comm.rendezvous()``; collective)."""

    MAX_KEY_BYTES = 1024

    def __init__(self, comm: Comm):
        self.comm = comm
        barrier(comm.library_comm)  # peers' pending transfers to this rank keep moving meanwhile
        self._control = p2p.private_dup(comm)
        self._channel = p2p.Channel(comm)
        self.served: Counter[str] = Counter()  # answers sent (or being sent), per key
        self._published: dict[str, Any] = {}
        self._deferred: dict[str, list[tuple[int, int, int, int]]] = {}
        self._answers: list[tuple[str, Request]] = []  # (key, the send of an answer)
        self._asks: list[Request] = []  # sends of this rank's pull requests
        self._pulls: list[Request] = []
        self._next_id = 0
        self._closing = False
        self._serving = True
        self._servers: dict[int, Request] = {}
        for source in range(comm.Get_size()):
            self._listen(source)

    # ------------------------------------------------------------ owner

    def publish(self, key: str, array: Any) -> None:
        """Make *array* pullable as *key* (do not modify it until :meth:`close` or :meth:`unpublish`)."""
        self._key_bytes(key)
        array = adopt(array, "array")
        check_array(array, "array")
        if self._closing:
            raise RuntimeError(f"publish({key!r}) after close(); publish before closing the rendezvous")
        self._published[key] = array
        for waiter in self._deferred.pop(key, []):
            self._answer(key, *waiter)

    def unpublish(self, key: str) -> None:
        """Stop offering *key*; returns once answers already being sent from it have left, so the
        array may then be modified. Requests arriving later wait for a new publish (or get an
        error at close)."""
        self._published.pop(key, None)
        Request.Waitall([answer for k, answer in self._answers if k == key])

    @property
    def keys(self) -> list[str]:
        """Keys this rank currently offers."""
        return sorted(self._published)

    def _listen(self, source: int) -> None:
        """Post the receive of *source*'s next pull request (one request object per pull served)."""
        self._servers[source] = Request(self._serve_one(source), "rendezvous server")

    def _serve_one(self, source: int) -> Steps:
        message = np.empty(_FIELDS * 8 + self.MAX_KEY_BYTES, np.uint8)
        yield [self._control.Irecv(message, source, _PULL)]
        if self._serving:
            self._listen(source)
        puller = source
        request_id, offset, count, length = message[: _FIELDS * 8].view(np.int64).tolist()
        tag = request_id % (self._channel.tag_ub + 1)
        try:  # whatever goes wrong with one request, answer it and keep serving the others
            key = message[_FIELDS * 8 : _FIELDS * 8 + length].tobytes().decode("utf-8")
            self._answer(key, puller, tag, offset, count)
        except Exception as exc:  # noqa: BLE001 - reported to the puller
            self._send_error(puller, tag, f"rank {self.comm.Get_rank()} could not answer: {exc}")

    def _stop_listening(self) -> None:
        """Cancel the posted request receives; a request that already arrived is still answered."""
        self._serving = False
        for server in self._servers.values():
            server.Cancel()

    def _answer(self, key: str, puller: int, tag: int, offset: int, count: int) -> None:
        """Answer one pull of elements [offset, offset+count) of *key* (count -1: to the end)."""
        array = self._published.get(key)
        if array is None:
            if not self._closing:
                self._deferred.setdefault(key, []).append((puller, tag, offset, count))
                return
            offered = ", ".join(repr(k) for k in self.keys) or "none"
            self._send_error(puller, tag, f"rank {self.comm.Get_rank()} never published {key!r} (it offers: {offered})")
            return
        size = array.size
        whole = offset == 0 and count == -1
        if count == -1:
            count = size - offset
        if offset < 0 or count < 0 or offset + count > size:
            end = "the end" if count < 0 else offset + count
            self._send_error(
                puller, tag, f"{key!r} on rank {self.comm.Get_rank()} has {size} elements; asked for [{offset}, {end})"
            )
            return
        piece = array if whole else element_view(array, offset, count, key)  # whole: keeps its shape
        self.served[key] += 1
        note = {"key": key, "offset": offset, "count": count} if trace.ON else None
        self._send(key, p2p.send_steps(self._channel, piece, puller, tag, event="answer", note=note), f"answer {key!r}")

    def _send(self, key: str, steps: Steps, label: str) -> None:
        self._answers = [(k, a) for k, a in self._answers if not a.done]
        self._answers.append((key, Request(steps, label)))

    def _send_error(self, puller: int, tag: int, text: str) -> None:
        raw = text.encode("utf-8")[: p2p.INLINE_BYTES]  # error answers always travel inline
        payload = np.frombuffer(raw, np.uint8).copy()
        note = {"refusal": text} if trace.ON else None
        self._send("", p2p.send_steps(self._channel, payload, puller, tag, p2p.ERROR, "answer", note), "error answer")

    def progress(self) -> int:
        """Serve pending pull requests now (also happens inside any mpicomm wait); return steps made."""
        return progress()

    # ------------------------------------------------------------ puller

    def _key_bytes(self, key: str) -> bytes:
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, got {type(key).__qualname__}")
        raw = key.encode("utf-8")
        if len(raw) > self.MAX_KEY_BYTES:
            raise ValueError(f"key {key[:40]!r}... is {len(raw)} bytes in UTF-8; keys are at most {self.MAX_KEY_BYTES}")
        return raw

    def ipull(
        self,
        key: str,
        owner: int,
        offset: int = 0,
        count: int | None = None,
        *,
        out: Any = None,
        xp: ModuleType = np,
    ) -> Request:
        """Start pulling elements [offset, offset+count) of *owner*'s *key*; ``request.wait()`` returns them."""
        raw = self._check_pull(key, owner, offset, count, out)
        if count is None:
            count = -1  # to the end, on the wire
        if out is not None:
            xp = array_module(out)
        request_id = self._next_id
        self._next_id += 1
        message = np.zeros(_FIELDS * 8 + len(raw), np.uint8)
        message[: _FIELDS * 8].view(np.int64)[:] = (request_id, offset, count, len(raw))
        message[_FIELDS * 8 :] = np.frombuffer(raw, np.uint8)
        tag = request_id % (self._channel.tag_ub + 1)
        if trace.ON:  # one event per pull: from the request to the answer's arrival
            note = {"peer": owner, "key": key, "offset": offset, "count": None if count == -1 else count,
                    "request": request_id}
            steps = trace.steps(self._pull_steps(message, owner, tag, out, xp, note), "pull", "p2p", note)
        else:
            steps = self._pull_steps(message, owner, tag, out, xp, None)
        request = Request(steps, f"pull {key!r} from {owner}")
        self._pulls = [p for p in self._pulls if not p.delivered]  # finished and reported: drop (and its array)
        self._pulls.append(request)
        return request

    def _check_pull(self, key: str, owner: int, offset: int, count: int | None, out: Any) -> bytes:
        """Every local check of a pull, before anything is sent; returns the key's bytes."""
        raw = self._key_bytes(key)
        owner = check_peer(owner, "owner", self.comm.Get_size())
        if owner == MPI.PROC_NULL:
            raise ValueError("owner=MPI.PROC_NULL: a pull needs a real rank to answer it")
        offset = check_int(offset, "offset")
        if count is not None:
            count = check_int(count, "count")
        if offset < 0 or (count is not None and count < 0):
            raise ValueError(f"offset={offset}, count={count}: both must be >= 0 (count=None: to the end)")
        if out is not None:
            out = adopt(out, "out")
            check_array(out, "out", writable=True)
        if self._closing:
            raise RuntimeError("pull after close(); pull before closing the rendezvous")
        return raw

    def _pull_steps(
        self, message: np.ndarray, owner: int, tag: int, out: Any, xp: ModuleType, note: dict | None
    ) -> Steps:
        # The request goes out as a request object of its own, so the pull's first step is the
        # receive of the answer: a pull can be cancelled until the answer arrives.
        self._asks = [a for a in self._asks if not a.done]
        self._asks.append(Request(_send_step(self._control, message, owner), "pull request"))
        return (yield from p2p.recv_steps(self._channel, out, owner, tag, xp, "pull", None, note))

    def pull(self, key: str, owner: int, offset: int = 0, count: int | None = None, *, out: Any = None, xp: ModuleType = np) -> Any:
        """Pull elements [offset, offset+count) of *owner*'s *key* (all of it by default); return them.

        Serves requests to this rank while it waits. Raises
        :class:`mpicomm.RemoteError` if the owner never publishes the key
        (reported when it closes) or the range is outside the array.
        """
        self._check_pull(key, owner, offset, count, out)
        if owner == self.comm.Get_rank() and key not in self._published:
            raise KeyError(f"rank {owner} pulls {key!r} from itself but has not published it; it would wait forever")
        return self.ipull(key, owner, offset, count, out=out, xp=xp).wait()

    # ------------------------------------------------------------ end

    def close(self) -> None:
        """Collective: finish this rank's pulls, serve others until all ranks are done, then free."""
        if self._closing:
            return
        self._closing = True  # from here on, pulls of keys this rank never published are refused...
        for key, waiters in list(self._deferred.items()):
            for waiter in waiters:
                self._answer(key, *waiter)  # ...including those already waiting
        self._deferred.clear()
        errors = []
        for pull in self._pulls:  # serving while waiting; a failed pull must not keep us from the barrier
            unseen = not pull.delivered
            try:
                pull.Wait()
            except Exception as exc:  # noqa: BLE001 - re-raised below (unless the caller saw it already)
                if unseen:
                    errors.append(exc)
        self._pulls.clear()
        Request.Waitall(self._asks)
        barrier(self._control)  # every rank has finished pulling; this rank served meanwhile
        self._stop_listening()
        Request.Waitall([answer for _, answer in self._answers])
        self._control.Free()
        self._channel.free()
        if errors:
            raise errors[0]

    def __enter__(self) -> Rendezvous:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:  # close() is collective: not while this rank alone is unwinding an error
            self.close()
        else:
            self._stop_listening()


def _send_step(comm: MPI.Intracomm, message: np.ndarray, dest: int) -> Steps:
    yield [comm.Isend(message, dest, _PULL)]
