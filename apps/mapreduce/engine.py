"""The map-reduce engine: map over input splits, combine, shuffle by hash, group, reduce, collect.

In Sandia MR-MPI's vocabulary: **map** makes key/value pairs on each rank (here
from byte-range splits of files, :mod:`.inputs`), combined as they arrive
(**compress**, :mod:`.combine`); **aggregate** moves each key to its owner rank
by a stable hash (an irregular all-to-all, :mod:`.shuffle`); **convert** groups
the values of each key on its owner; **collate** is both; **reduce** calls the
user's function once per key; the result is then **gathered**, sorted, to one
file on rank 0, or written per rank. Pages that do not fit the memory limit
spill to local disk (:mod:`.spill`).

    mr = MapReduce(comm, key="str", value="int", combine="sum", memory_limit="512M")
    mr.map_files(paths, mapper)          # mapper(data, kv, block): kv.add(k, v), kv.add_keys(keys, v)
    mr.collate()                         # aggregate + convert
    mr.reduce()                          # or mr.reduce(fn): fn(key, value) -> value or None (drop)
    top = mr.top(20, order=lambda kv: (-kv[1], kv[0]))   # on rank 0; None elsewhere
    mr.write_sorted("out.tsv", order, fmt=lambda k, v: f"{k}\\t{v}")
    mr.close()

Memory. ``memory_limit`` (per rank) is divided among the phases, which do not
overlap: map blocks (``block``, 1/64 of the limit but at most 256 KiB: a block's
tokens take about ten times its bytes, and blocks that stay in the CPU's caches
count faster), the map-side store (``store``, 30 %: estimated from sampled
``sys.getsizeof`` of entries), shuffle rounds (``round``, 1/64 sent and about as
much received per round: unpacked, pairs take about 8 times their packed bytes)
and the reduce-side store (``group``, 30 %); pages of results read back or sent
to rank 0 hold a bounded number of pairs (:meth:`Budget.items`). What is
accounted is the engine's own estimate of its buffers and stores, not the
process's RSS; the tests check the RSS high-water mark against the limit.

Checkpoint. With ``checkpoint_dir``, the map output (the packed runs of every
rank) is written after map+combine in the format of :mod:`apps.checkpoint` (one
data file per run and rank, then a manifest by rank 0, last); with ``restart``
a valid checkpoint of the same job (same inputs, sizes, modification times,
options) replaces the map phase, even at another rank count. Rank 0 checks the
manifest's own checksum and every field of it (ranks, runs, their files,
column names, dtypes, shapes and offsets) before any rank reads a byte: a
damaged or edited checkpoint is refused with the reason, on every rank, and
the map runs again; it is never loaded as wrong pairs.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
from mpi4py import MPI

from apps import checkpoint
from apps.agree import agree, describe, gather
from mpicomm import cli

from .combine import Combiner, resolve
from .inputs import ERRORS, Block, InputError, check_inputs, decode, format_size, parse_size, plan_splits, read_blocks
from .shuffle import Spec, buckets, exchange, item_bytes, pack, pack_partitioned, take, unpack
from .spill import Run, SegmentFile, SpillDir, read_segments

__all__ = ["MapReduce", "KeyValue", "Budget", "JobError", "memory_usage", "DEFAULT_MEMORY", "MIN_MEMORY"]

DEFAULT_MEMORY = 512 << 20
#: The phases a job's progress counts, each ending in one ``[i/3]`` line.
PHASES = ("map", "shuffle", "reduce")
#: Below this the interpreter's own heap growth and MPI's buffers (a few MiB) dominate any share.
MIN_MEMORY = 32 << 20
#: Python bytes per packed byte when pairs are unpacked into a store (measured: str keys, int values).
EXPANSION = 8
#: Python bytes one unpacked pair takes in a list (key and value objects, a tuple, list slots).
ITEM_BYTES = 160
_PAGE_TAG = 7


class JobError(RuntimeError):
    """A job that cannot go on (raised on every rank, with every rank's reason)."""


def memory_usage(reset: bool = False) -> dict[str, int] | None:
    """This process's ``{"rss", "peak", "reset"}`` (bytes; reset 1 if it worked) from /proc, or None.

    ``reset=True`` first resets the kernel's high-water mark to the current RSS
    (``/proc/self/clear_refs``), so ``peak`` then measures from now on.
    """
    done = 0
    if reset:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            done = 1
        except OSError:
            pass
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return {"rss": int(fields["VmRSS"].split()[0]) * 1024, "peak": int(fields["VmHWM"].split()[0]) * 1024,
                "reset": done}
    except (OSError, KeyError, ValueError):
        return None


@dataclass(frozen=True)
class Budget:
    """How the per-rank memory limit is shared among the phases (bytes)."""

    limit: int
    block: int
    store: int
    round: int
    group: int

    @classmethod
    def of(cls, limit: int) -> Budget:
        """The shares of *limit*: see the module docstring."""
        return cls(limit, block=min(max(limit // 64, 64 << 10), 256 << 10), store=int(limit * 0.3),
                   round=min(max(limit // 64, 64 << 10), 64 << 20), group=int(limit * 0.3))

    def items(self, share: int, ways: int = 1) -> int:
        """How many unpacked pairs fit in *share* bytes split *ways* ways (at least 64)."""
        return max(64, share // (max(ways, 1) * ITEM_BYTES))


class KeyValue:
    """What a mapper adds pairs to (MR-MPI's KeyValue); pairs are combined as they arrive."""

    def __init__(self, combiner: Combiner):
        self.combiner = combiner
        self.store = combiner.new_store()
        self.added = 0

    def add(self, key: Any, value: Any = 1) -> None:
        """Add one pair."""
        self.combiner.add(self.store, key, value)
        self.added += 1

    def add_keys(self, keys: Iterable, value: Any = 1) -> None:
        """Add ``(k, value)`` for every k in *keys* (with ``combine="sum"`` and value 1, a C-speed count)."""
        if not isinstance(keys, (list, tuple, set, frozenset)):
            keys = list(keys)
        self.combiner.add_keys(self.store, keys, value)
        self.added += len(keys)

    def add_pairs(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        """Add every ``(key, value)`` of *pairs*."""
        add, store = self.combiner.add, self.store
        n = 0
        for key, value in pairs:
            add(store, key, value)
            n += 1
        self.added += n

    def __len__(self) -> int:
        return len(self.store)


class _Estimate:
    """Bytes a store holds: entries × a per-entry size sampled with ``sys.getsizeof`` now and then.

    The sample is the first entries in insertion order (O(1) to reach; in a
    Zipf-shaped input those are the frequent keys, whose values are the largest:
    the estimate errs high).
    """

    SAMPLE = 64

    def __init__(self, combiner: Combiner):
        self.combiner = combiner
        self.per_entry = 0.0
        self.sampled_at = 0
        self.calls = 0

    def __call__(self, store: dict) -> int:
        n = len(store)
        self.calls += 1
        if n and (n >= 2 * self.sampled_at or self.calls % 16 == 0 or not self.per_entry):
            sizes = [self.combiner.entry_bytes(k, v) for k, v in itertools.islice(store.items(), self.SAMPLE)]
            self.per_entry = sum(sizes) / len(sizes)
            self.sampled_at = n
        return int(n * self.per_entry)


def _wrap(comm: Any) -> Any:
    import mpicomm

    if comm is None:
        return mpicomm.Comm()
    if isinstance(comm, mpicomm.Comm):
        return comm
    if isinstance(comm, MPI.Intracomm):
        return mpicomm.Comm(comm)
    raise TypeError(f"comm {comm!r}: expected an mpicomm.Comm, an mpi4py Intracomm or None (COMM_WORLD)")


class MapReduce:
    """One map-reduce job on a communicator (collective: every rank makes the same calls in the same order).

    *key* and *value* are the packed kinds (:data:`.shuffle.KINDS`); *combine*
    a name (``sum min max union collect``), a :class:`.combine.Combiner`, a
    callable ``fn(a, b)`` or None (collect every value). *progress*: a text
    stream rank 0 reports to (None: quiet), in :class:`mpicomm.cli.Progress`
    lines: ``NAME [i/3] …  elapsed  ETA`` at the end of map, shuffle and reduce,
    ``NAME: …`` between them. *budget* overrides the shares of
    the memory limit (for tuning, and for tests that force spills on small data).
    """

    def __init__(self, comm: Any = None, *, key: str = "str", value: str = "int",
                 combine: str | Combiner | Callable[[Any, Any], Any] | None = "sum",
                 memory_limit: int | str = DEFAULT_MEMORY, spill_dir: str | None = None,
                 progress: TextIO | None = None, name: str = "mapreduce", budget: Budget | None = None):
        self.spec = Spec(key, value)
        self.combiner = resolve(combine)
        if value not in self.combiner.value_kinds:
            raise ValueError(f"combine {self.combiner.name!r} works on values of kind "
                             f"{', '.join(self.combiner.value_kinds)}, not {value!r}; change value= or combine=")
        limit = parse_size(memory_limit, "memory_limit")
        if limit < MIN_MEMORY:
            raise ValueError(f"memory_limit {memory_limit!r} ({format_size(limit)}) is below the minimum of "
                             f"{format_size(MIN_MEMORY)}: below that the interpreter's and MPI's own growth "
                             f"(a few MiB) leaves no room for the engine's shares")
        if not isinstance(name, str) or not name or os.sep in name:
            raise ValueError(f"name {name!r}: expected a short job name without path separators")
        self.comm = _wrap(comm)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        if budget is not None and not isinstance(budget, Budget):
            raise TypeError(f"budget {budget!r}: expected a Budget (or None: shares of memory_limit)")
        self.budget = budget or Budget.of(limit)
        self.spill = SpillDir(spill_dir)
        self.progress = progress if self.rank == 0 else None
        self.name = name
        self._progress = cli.Progress(len(PHASES), name, show=self.progress is not None, stream=self.progress)
        self.timings: dict[str, float] = {}
        self.counters: dict[str, int] = {"bytes_mapped": 0, "pairs_added": 0, "map_spills": 0, "runs": 0,
                                         "items_sent": 0, "items_received": 0, "bytes_sent": 0, "rounds": 0,
                                         "buckets": 1, "keys": 0, "results_spilled": 0}
        self.restored_from: str | None = None
        self._runs: list[Run] = []
        self._group: dict | None = None
        self._buckets: list[SegmentFile] = []
        self._results: list[tuple[list, list] | str] = []
        self._result_spec: Spec | None = None
        self._last_say = 0.0

    # ------------------------------------------------------------------------------------------ internals

    def _say(self, text: str, throttle: bool = False) -> None:
        """A progress line on rank 0 between phases (*throttle*: at most one a second)."""
        if self.progress is None:
            return
        now = time.monotonic()
        if throttle and now - self._last_say < 1.0:
            return
        self._last_say = now
        self._progress.note(text)

    def _done(self, text: str) -> None:
        """The progress line of a phase (:data:`PHASES`) that has ended."""
        self._last_say = time.monotonic()
        self._progress.step(text)

    def _finished(self, store: dict) -> list:
        """The store's values in packed form (``Combiner.finish`` applied where a combiner defines one)."""
        if type(self.combiner).finish is Combiner.finish:
            return list(store.values())
        return list(map(self.combiner.finish, store.values()))

    def _agree(self, error: str | None) -> None:
        """Raise the same :class:`InputError` on every rank if any rank has an *error*."""
        agree(self.comm, error, InputError)

    # ------------------------------------------------------------------------------------------ map

    def map_files(self, paths: Sequence[str], mapper: Callable[[Any, KeyValue, Block], None], *,
                  text: bool = True, errors: str = "strict", canonicalize: Callable[[dict], None] | None = None,
                  checkpoint_dir: str | None = None, restart: bool = False, fingerprint: Any = None) -> None:
        """Map every line-aligned block of this rank's byte range of *paths*, combining as pairs arrive.

        ``mapper(data, kv, block)``: *data* is the block's text (``text=True``,
        decoded with *errors*) or its bytes; *block* says which file
        (``block.index``, ``block.path``) and where (``block.offset``).
        ``canonicalize(store)`` (optional) runs on the combined store (a dict,
        key → value) each time before it is packed, and rewrites keys in place:
        keys the mapper made cheaply (raw bytes) get their final form once per
        distinct key, not once per pair. Keys of kind ``str`` may be ``bytes``
        holding UTF-8 (they are packed as they are).
        *fingerprint* (JSON-able) names the options that change the result, so a
        checkpoint is reused only by the same job.
        """
        if not callable(mapper):
            raise TypeError(f"mapper {mapper!r}: expected a callable mapper(data, kv, block)")
        if canonicalize is not None and not callable(canonicalize):
            raise TypeError(f"canonicalize {canonicalize!r}: expected a callable canonicalize(store), or None")
        if errors not in ERRORS:
            raise ValueError(f"errors {errors!r}: use one of {', '.join(ERRORS)}")
        if restart and not checkpoint_dir:
            raise ValueError("restart=True needs checkpoint_dir: the directory the earlier run checkpointed to")
        if self._runs or self._group is not None or self._results:
            raise RuntimeError("map_files: this MapReduce already holds data; make a new one per job")
        start = time.perf_counter()
        sizes = check_inputs(self.comm, list(paths))
        job = self._fingerprint(paths, sizes, text, errors, fingerprint)
        if checkpoint_dir:
            self._check_directory(checkpoint_dir)
        if restart and self._restore(checkpoint_dir, job):
            self.timings["map"] = time.perf_counter() - start
            self._done(f"restart: map output restored from {self.restored_from}; map skipped")
            return
        total = sum(sizes)
        mine = plan_splits(list(paths), sizes, self.size)[self.rank]
        my_bytes = sum(s.stop - s.start for s in mine)
        self._say(f"map: {len(paths)} file(s), {format_size(total)} on {self.size} rank(s); "
                  f"rank 0 maps about {format_size(my_bytes)}")
        kv = KeyValue(self.combiner)
        estimate = _Estimate(self.combiner)
        failure = None
        mapped = 0
        try:
            for split in mine:
                for block in read_blocks(split, self.budget.block, sizes[split.index]):
                    data = decode(block.data, errors, block.path, block.offset) if text else block.data
                    mapper(data, kv, block)
                    mapped += len(block.data)
                    del data
                    if estimate(kv.store) > self.budget.store:
                        self._spill_store(kv, canonicalize)
                    if self.progress is not None and time.monotonic() - self._last_say >= 1.0:
                        self._say(f"map: rank 0 read {format_size(mapped)} of {format_size(my_bytes)}, "
                                  f"{len(kv.store)} keys in memory, {self.counters['map_spills']} spill(s)")
        except InputError as exc:
            failure = str(exc)
        except OSError as exc:
            failure = f"reading {exc.filename!r} failed: {exc.strerror}"
        self._agree(failure)
        self.counters["bytes_mapped"] = mapped
        self.counters["pairs_added"] = kv.added
        final = self._pack_store(kv, canonicalize)
        if final.count:
            self._runs.append(final)
        self.counters["runs"] = len(self._runs)
        self.timings["map"] = time.perf_counter() - start
        totals = self.comm.allreduce(np.array([mapped, sum(r.count for r in self._runs), self.counters["map_spills"]]))
        self._done(f"map: {format_size(int(totals[0]))} mapped in {cli.format_time(self.timings['map'])}; "
                   f"{int(totals[1])} combined pairs, {int(totals[2])} spill(s)")
        if checkpoint_dir:
            start = time.perf_counter()
            self._save(checkpoint_dir, job)
            self.timings["checkpoint"] = time.perf_counter() - start

    def _pack_store(self, kv: KeyValue, canonicalize: Callable[[dict], None] | None) -> Run:
        """Pack (after *canonicalize*) the store into a run partitioned by owner; the store is emptied."""
        store = kv.store
        if canonicalize is not None:
            canonicalize(store)
        keys, values = list(store.keys()), self._finished(store)
        store.clear()
        kv.store = self.combiner.new_store()
        batch, dest = pack_partitioned(keys, values, self.spec, self.size)
        del keys, values
        return self._run(batch, dest)

    def _run(self, batch: dict[str, np.ndarray], dest: np.ndarray) -> Run:
        """A run of a partitioned batch, with its wire bytes per destination."""
        cum = np.concatenate([[0], np.cumsum(item_bytes(batch, self.spec))])
        return Run(count=len(batch["hash"]), nbytes=sum(a.nbytes for a in batch.values()), batch=batch, dest=dest,
                   dest_bytes=cum[dest[1:]] - cum[dest[:-1]])

    def _spill_store(self, kv: KeyValue, canonicalize: Callable[[dict], None] | None) -> None:
        run = self._pack_store(kv, canonicalize)
        run.spill(self.spill)
        self._runs.append(run)
        self.counters["map_spills"] += 1

    # ------------------------------------------------------------------------------------------ checkpoint

    def _fingerprint(self, paths: Sequence[str], sizes: list[int], text: bool, errors: str, extra: Any) -> str:
        stamp = None
        if self.rank == 0:
            stamp = []
            for path, size in zip(paths, sizes):
                st = os.stat(path)
                stamp.append([os.path.abspath(path), size, st.st_mtime_ns])
        body = {"name": self.name, "spec": [self.spec.key, self.spec.value], "combine": repr(self.combiner),
                "inputs": self.comm.bcast(stamp, root=0), "text": text, "errors": errors, "extra": extra}
        try:
            blob = json.dumps(body, sort_keys=True, default=repr)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"fingerprint {extra!r}: must be JSON-able ({exc})") from None
        return hashlib.sha256(blob.encode()).hexdigest()

    def _check_directory(self, directory: str) -> None:
        """Every rank writes its own checkpoint files: every rank must be able to (collective; InputError everywhere)."""
        try:
            checkpoint.prepare_directory(self.comm, directory)
        except checkpoint.CheckpointError as exc:
            raise InputError(str(exc)) from None

    @property
    def _prefix(self) -> str:
        return f"{self.name}-map"

    def _save(self, directory: str, job: str) -> None:
        manifest = checkpoint.manifest_path(directory, self._prefix, 1)
        if self.rank == 0 and os.path.exists(manifest):
            os.remove(manifest)  # never pair an old manifest with new data files
        self.comm.Barrier()
        records = []
        for i, run in enumerate(self._runs):
            batch, dest = run.load()
            path = checkpoint.data_path(directory, self._prefix, 1, f"rank{self.rank}-run{i}")
            record, entries = checkpoint.write_arrays(path, {**batch, "dest": dest})
            records.append({"record": record, "entries": entries, "count": run.count, "nbytes": run.nbytes,
                            "dest_bytes": run.dest_bytes.tolist()})
            del batch, dest
        everyone = self.comm.gather(records, root=0)
        if self.rank == 0:
            files = [r["record"] for rank_runs in everyone for r in rank_runs]
            checkpoint.save_manifest(manifest, 1, files, job=job, ranks=self.size, runs=everyone,
                                     spec=[self.spec.key, self.spec.value])
            checkpoint.sweep(directory, self._prefix)  # data files of an older run with more ranks or runs
        self.comm.Barrier()
        self._say(f"checkpoint: map output of {self.size} rank(s) saved in {directory}")

    def _check_manifest(self, manifest: str, body: dict[str, Any]) -> None:
        """The map-reduce fields of a manifest whose checksum verified: types, ranges, and every run's file.

        Runs on rank 0 before the manifest is shared, so a forged or damaged field
        is refused with its name (:class:`apps.checkpoint.CheckpointError`) instead
        of failing later with a bare error or loading wrong pairs.
        """
        def bad(what: str) -> checkpoint.CheckpointError:
            return checkpoint.CheckpointError(f"{manifest}: {what}; refused")

        ranks, runs, spec = body.get("ranks"), body.get("runs"), body.get("spec")
        if spec != [self.spec.key, self.spec.value]:
            raise bad(f"spec {spec!r}, this job's is {[self.spec.key, self.spec.value]!r}")
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise bad(f"ranks {ranks!r} is not an integer >= 1")
        if not isinstance(runs, list) or len(runs) != ranks or not all(isinstance(r, list) for r in runs):
            raise bad(f"'runs' must be a list of {ranks} lists (one per rank)")
        files = {rec["file"]: rec for rec in body["files"]}
        used = set()
        columns = {name: dtype.str for name, dtype in self.spec.columns} | {"dest": np.dtype(np.int64).str}
        for q, rank_runs in enumerate(runs):
            for i, run in enumerate(rank_runs):
                where = f"run {i} of rank {q}"
                if not isinstance(run, dict) or not all(k in run for k in ("record", "entries", "count", "nbytes",
                                                                           "dest_bytes")):
                    raise bad(f"{where} is not an object with record, entries, count, nbytes and dest_bytes")
                record = run["record"]
                name = record.get("file") if isinstance(record, dict) else None
                if name not in files or files[name] != record or name in used:
                    raise bad(f"{where}: its record {record!r} is not one of the manifest's files, or is used twice")
                used.add(name)
                entries = checkpoint.check_entries(run["entries"], record["bytes"], f"{manifest}: {where}")
                kinds = {e["name"]: e["dtype"] for e in entries}
                if kinds != columns:
                    raise bad(f"{where}: columns {kinds}, this job's are {columns}")
                shapes = {e["name"]: e["shape"] for e in entries}
                count, nbytes, dest_bytes = run["count"], run["nbytes"], run["dest_bytes"]
                if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (count, nbytes)):
                    raise bad(f"{where}: count {count!r} and nbytes {nbytes!r} must be integers >= 0")
                if shapes["hash"] != [count] or shapes["dest"] != [ranks + 1]:
                    raise bad(f"{where}: {shapes['hash']} hashes and {shapes['dest']} offsets, for {count} pairs "
                              f"over {ranks} ranks")
                if (not isinstance(dest_bytes, list) or len(dest_bytes) != ranks
                        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in dest_bytes)):
                    raise bad(f"{where}: dest_bytes must be {ranks} integers >= 0")
        if used != set(files):
            raise bad(f"files {sorted(set(files) - used)} belong to no run")

    def _restore(self, directory: str, job: str) -> bool:
        """Load the map output from a valid checkpoint of this job; False (and say why) if there is none."""
        manifest = checkpoint.manifest_path(directory, self._prefix, 1)
        body, why = None, None
        if self.rank == 0:
            if not os.path.exists(manifest):
                why = f"no checkpoint in {directory}"
            else:
                try:
                    body = checkpoint.load_manifest(manifest)
                    if body.get("job") != job:
                        body, why = None, f"the checkpoint in {directory} is of another job (inputs or options differ)"
                    else:
                        self._check_manifest(manifest, body)
                except checkpoint.CheckpointError as exc:
                    body, why = None, str(exc)
        body, why = self.comm.bcast((body, why), root=0)
        if body is not None:
            old = body["ranks"]
            mine = [run for q in range(self.rank, old, self.size) for run in body["runs"][q]]
            problem = None
            try:
                checkpoint.verify(manifest, body, files=[r["record"]["file"] for r in mine])
            except checkpoint.CheckpointError as exc:
                problem = str(exc)
            problems = gather(self.comm, problem)
            if problems:
                body, why = None, describe(problems, self.size)
        if body is None:
            self._say(f"restart: {why}; mapping from the start")
            return False
        for r in mine:
            run = Run(count=r["count"], nbytes=r["nbytes"], path=os.path.join(directory, r["record"]["file"]),
                      entries=r["entries"], owned=False, dest_bytes=np.array(r["dest_bytes"], np.int64))
            if old != self.size:  # partitioned for another rank count: re-partition
                batch, _ = run.load()
                keys, values = unpack(batch, self.spec)
                run = self._run(*pack_partitioned(keys, values, self.spec, self.size))
                run.spill(self.spill)  # several may arrive: keep none of them in memory
            self._runs.append(run)
        self.counters["runs"] = len(self._runs)
        self.restored_from = manifest
        return True

    # ------------------------------------------------------------------------------------------ shuffle

    def _iter_runs(self) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
        while self._runs:
            run = self._runs.pop(0)
            batch, dest = run.load()
            run.drop()
            yield batch, dest
            del batch, dest

    def collate(self) -> None:
        """Aggregate (every pair to its key's owner rank) and convert (group values by key): collective."""
        if self._group is not None or self._buckets:
            raise RuntimeError("collate: already done for this job")
        start = time.perf_counter()
        out = np.zeros(self.size, np.int64)
        for run in self._runs:
            out += run.dest_bytes
        incoming = np.zeros(self.size, np.int64)
        self.comm.Alltoall(out, incoming)
        nb = max(1, math.ceil(int(incoming.sum()) * EXPANSION / self.budget.group))
        self.counters["buckets"] = nb
        total = int(self.comm.allreduce(int(out.sum())))
        self._say(f"shuffle: {format_size(total)} of packed pairs to move; "
                  f"{'grouping in memory' if nb == 1 else f'{nb} spill buckets on rank 0'}")
        self._group = self.combiner.new_store() if nb == 1 else None
        if nb > 1:
            self._buckets = [SegmentFile(self.spill.new_file("bucket"), self.spec) for _ in range(nb)]

        def deliver(part: dict[str, np.ndarray], source: int) -> None:
            keys, values = unpack(part, self.spec)
            if nb == 1:
                self.combiner.merge(self._group, keys, values)
                return
            which = buckets(part["hash"], nb)
            order = np.argsort(which, kind="stable")
            edges = np.searchsorted(which[order], np.arange(nb + 1))
            for b in range(nb):
                if edges[b + 1] > edges[b]:
                    idx = order[edges[b]:edges[b + 1]]
                    self._buckets[b].append(pack(take(keys, idx), take(values, idx), self.spec))

        def on_round(stats: Any) -> None:
            self._say(f"shuffle: round {stats.rounds}, rank 0 sent {stats.items_sent} keys "
                      f"({format_size(stats.bytes_sent)})", throttle=True)

        stats = exchange(self.comm, self._iter_runs(), self.spec, self.budget.round, deliver, on_round)
        for f in self._buckets:
            f.close()
        self.counters.update(items_sent=stats.items_sent, items_received=stats.items_received,
                             bytes_sent=stats.bytes_sent, rounds=stats.rounds)
        self.timings["shuffle"] = time.perf_counter() - start
        keys = int(self.comm.allreduce(stats.items_sent))
        self._done(f"shuffle: {keys} keys moved in {stats.rounds} round(s), {cli.format_time(self.timings['shuffle'])}")

    # ------------------------------------------------------------------------------------------ reduce

    def _groups(self) -> Iterator[dict]:
        """Each group store in turn: the in-memory one, or one per spill bucket."""
        if not self._buckets:
            store, self._group = self._group, None
            yield store if store is not None else self.combiner.new_store()
            return
        for f in self._buckets:
            store = self.combiner.new_store()
            for part in read_segments(f.path, self.spec):
                keys, values = unpack(part, self.spec)
                self.combiner.merge(store, keys, values)
                del keys, values
            os.remove(f.path)
            yield store
            store.clear()
        self._buckets = []

    def reduce(self, reducer: Callable[[Any, Any], Any] | None = None, *, value: str | None = None) -> None:
        """Call ``reducer(key, value) -> value`` (None: drop the key) once per key on its owner; collective.

        *value* is the kind of the reducer's results when it differs from the
        job's (e.g. a count from a set). Without a reducer the combined value is
        the result (for ``union``: a sorted list).
        """
        if reducer is not None and not callable(reducer):
            raise TypeError(f"reducer {reducer!r}: expected a callable reducer(key, value) -> value, or None")
        if self._group is None and not self._buckets:
            raise RuntimeError("reduce: call collate() first")
        start = time.perf_counter()
        self._result_spec = Spec(self.spec.key, value or self.spec.value)
        spilled = bool(self._buckets)
        count = 0
        for store in self._groups():
            if reducer is None:
                keys, values = list(store.keys()), self._finished(store)
            else:
                keys, values = [], []
                for key, val in store.items():
                    out = reducer(key, val)
                    if out is not None:
                        keys.append(key)
                        values.append(out)
            store.clear()
            count += len(keys)
            if spilled:
                path = self.spill.new_file("result")
                f = SegmentFile(path, self._result_spec)
                step = self.budget.items(self.budget.round)
                for a in range(0, len(keys), step):
                    f.append(pack(keys[a:a + step], values[a:a + step], self._result_spec))
                f.close()
                self._results.append(path)
                self.counters["results_spilled"] += 1
            else:
                self._results.append((keys, values))
        self.counters["keys"] = count
        self.timings["reduce"] = time.perf_counter() - start
        self._done(f"reduce: {int(self.comm.allreduce(count))} keys in {cli.format_time(self.timings['reduce'])}")

    # ------------------------------------------------------------------------------------------ results

    def items(self) -> Iterator[tuple[Any, Any]]:
        """This rank's result pairs (keys it owns), in no particular order."""
        for part in self._results:
            if isinstance(part, tuple):
                yield from zip(*part)
            else:
                for seg in read_segments(part, self._result_spec):
                    keys, values = unpack(seg, self._result_spec)
                    yield from zip(keys, values)

    def _sorted_parts(self, order: Callable[[tuple[Any, Any]], Any]) -> Iterator[tuple[Any, Any]]:
        """This rank's results in *order*: in memory one sort; spilled, sorted runs merged from disk.

        Spilled results are sorted in chunks that fit half the group share (a
        sort holds a key per pair besides the pairs) and written in segments of
        1/64 chunk, so merging up to 64 runs stays in the share.
        """
        chunk = self.budget.items(self.budget.group, 2)
        segment = max(64, chunk // 64)
        runs: list[Iterable[tuple[Any, Any]]] = []
        for part in self._results:
            if isinstance(part, tuple):
                runs.append(sorted(zip(*part), key=order))
                continue
            pending = self._read_pairs(part)
            while pairs := sorted(itertools.islice(pending, chunk), key=order):
                path = self.spill.new_file("sorted")
                f = SegmentFile(path, self._result_spec)
                for a in range(0, len(pairs), segment):
                    piece = pairs[a:a + segment]
                    f.append(pack([k for k, _ in piece], [v for _, v in piece], self._result_spec))
                f.close()
                del pairs
                runs.append(self._read_pairs(path))
        return heapq.merge(*runs, key=order) if len(runs) != 1 else iter(runs[0])

    def _read_pairs(self, path: str) -> Iterator[tuple[Any, Any]]:
        for seg in read_segments(path, self._result_spec):
            keys, values = unpack(seg, self._result_spec)
            yield from zip(keys, values)

    def top(self, k: int, order: Callable[[tuple[Any, Any]], Any], root: int = 0) -> list | None:
        """The first *k* result pairs in *order* (a sort key on ``(key, value)``), on *root*; collective."""
        if not isinstance(k, int) or k < 0:
            raise ValueError(f"k {k!r}: expected an int >= 0")
        start = time.perf_counter()
        local = heapq.nsmallest(k, self.items(), key=order)
        everyone = self.comm.gather(local, root=root)
        self.timings["output"] = self.timings.get("output", 0.0) + time.perf_counter() - start
        if self.rank != root:
            return None
        return heapq.nsmallest(k, itertools.chain.from_iterable(everyone), key=order)

    def gather(self, root: int = 0) -> dict | None:
        """Every result pair in one dict on *root* (for small results); collective."""
        everyone = self.comm.gather(list(self.items()), root=root)
        return dict(itertools.chain.from_iterable(everyone)) if self.rank == root else None

    def write_sorted(self, path: str, order: Callable[[tuple[Any, Any]], Any],
                     fmt: Callable[[Any, Any], str], root: int = 0) -> int | None:
        """Write every result pair, in *order*, one ``fmt(key, value)`` line each, to *path* on *root*.

        Each rank sorts its own keys; *root* merges the ranks' sorted streams,
        pulling pages from each as it needs them, so no rank holds all results.
        Returns the number of lines on *root*, None elsewhere; collective.
        """
        start = time.perf_counter()
        comm = self.comm.Dup()
        try:
            stream = self._sorted_parts(order)
            page = self.budget.items(self.budget.round, self.size)
            if self.rank != root:
                self._serve_pages(comm, stream, page, root)
                lines = None
            else:
                streams = [stream if r == root else self._pull_pages(comm, r) for r in range(self.size)]
                lines = 0
                with open(path, "w", encoding="utf-8", newline="\n") as f:
                    buf = []
                    for key, value in heapq.merge(*streams, key=order):
                        buf.append(fmt(key, value))
                        if len(buf) >= 8192:
                            f.write("\n".join(buf) + "\n")
                            lines += len(buf)
                            buf = []
                    if buf:
                        f.write("\n".join(buf) + "\n")
                        lines += len(buf)
        finally:
            comm.Free()
        self.timings["output"] = self.timings.get("output", 0.0) + time.perf_counter() - start
        return lines

    def write_parts(self, pattern: str, order: Callable[[tuple[Any, Any]], Any], fmt: Callable[[Any, Any], str]) -> str:
        """Each rank writes its own results, in *order*, to ``pattern.format(rank=r, size=p)``; returns the name."""
        path = pattern.format(rank=self.rank, size=self.size)
        if path == pattern.format(rank=self.rank + 1, size=self.size):
            raise ValueError(f"pattern {pattern!r}: must contain {{rank}} so ranks write different files")
        start = time.perf_counter()
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for key, value in self._sorted_parts(order):
                f.write(fmt(key, value) + "\n")
        self.comm.Barrier()
        self.timings["output"] = self.timings.get("output", 0.0) + time.perf_counter() - start
        return path

    def _serve_pages(self, comm: Any, stream: Iterator, page: int, root: int) -> None:
        spec = self._result_spec
        while True:
            comm.recv_array(np.empty(1, np.int64), source=root, tag=_PAGE_TAG)
            chunk = list(itertools.islice(stream, page))
            keys, values = [k for k, _ in chunk], [v for _, v in chunk]
            batch = pack(keys, values, spec) if chunk else None
            flat = np.concatenate([batch[n].view(np.uint8).reshape(-1) for n, _ in spec.columns]) if chunk else np.empty(0, np.uint8)
            sizes = np.array([batch[n].nbytes for n, _ in spec.columns] if chunk else [0] * len(spec.columns), np.int64)
            comm.send_array(sizes, root, tag=_PAGE_TAG)
            comm.send_array(flat, root, tag=_PAGE_TAG)
            if not chunk:
                return

    def _pull_pages(self, comm: Any, source: int) -> Iterator[tuple[Any, Any]]:
        spec = self._result_spec
        while True:
            comm.send_array(np.ones(1, np.int64), source, tag=_PAGE_TAG)
            sizes = comm.recv_array(source=source, tag=_PAGE_TAG)
            flat = comm.recv_array(source=source, tag=_PAGE_TAG)
            if flat.size == 0:
                return
            batch, pos = {}, 0
            for (name, dtype), nbytes in zip(spec.columns, sizes.tolist()):
                batch[name] = flat[pos:pos + nbytes].view(dtype)
                pos += nbytes
            keys, values = unpack(batch, spec)
            yield from zip(keys, values)

    # ------------------------------------------------------------------------------------------ report

    def summary(self) -> list[dict[str, Any]]:
        """Every rank's timings and counters (collective; the same list on every rank)."""
        mine = {"rank": self.rank, "timings": dict(self.timings), "counters": dict(self.counters),
                "spill_files": self.spill.files, "spill_bytes": self.spill.bytes_written}
        return self.comm.allgather(mine)

    def close(self) -> None:
        """Remove this job's spill files (results are gone afterwards)."""
        for run in self._runs:
            run.drop()
        self._runs, self._results, self._group, self._buckets = [], [], None, []
        self.spill.close()

    def __enter__(self) -> MapReduce:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

