"""The map-reduce engine with your own functions: count the letters of some files, longest words per letter.

Run: mpiexec -n 2 python docs/examples/mapreduce.py
"""

import os
import shutil
import tempfile
from collections import Counter

import mpicomm
from apps.mapreduce import MapReduce

comm = mpicomm.Comm()
rank = comm.rank
folder = comm.bcast(tempfile.mkdtemp() if rank == 0 else None)   # the files: every rank reads its byte range
lines = [f"line {i} of file {k}: the quick brown fox jumps over the lazy dog\n" for k in range(3) for i in range(50)]
if rank == 0:
    for k in range(3):
        with open(os.path.join(folder, f"part-{k}.txt"), "w", encoding="utf-8") as f:
            f.writelines(lines[50 * k : 50 * (k + 1)])
comm.Barrier()
paths = [os.path.join(folder, f"part-{k}.txt") for k in range(3)]


def mapper(data, kv, block):          # data: this block's text; kv collects (key, value) pairs
    kv.add_keys(c for c in data if c.isalpha())


mr = MapReduce(comm, key="str", value="int", combine="sum", memory_limit="64M")
try:
    mr.map_files(paths, mapper)       # each rank maps its own line-aligned byte ranges, combining as it goes
    mr.collate()                      # every key to its owner rank (stable hash), values grouped
    mr.reduce()                       # the combined count per key (or reduce(fn): fn(key, value) -> value)
    by_count = lambda pair: (-pair[1], pair[0])                  # noqa: E731  (a sort key on (key, value))
    best = mr.top(3, by_count)                                  # on rank 0
    out = os.path.join(folder, "letters.tsv")
    mr.write_sorted(out, by_count, lambda key, value: f"{key}\t{value}")   # rank 0 merges the ranks' sorted runs
finally:
    mr.close()

if rank == 0:
    expected = Counter(c for line in lines for c in line if c.isalpha())
    assert best == sorted(expected.items(), key=by_count)[:3], best
    with open(out, encoding="utf-8") as f:
        assert [line.split("\t")[0] for line in f] == [k for k, _ in sorted(expected.items(), key=by_count)]
    print(f"mapreduce: ok (top letters {best})")
    shutil.rmtree(folder)
