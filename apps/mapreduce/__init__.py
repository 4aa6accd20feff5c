"""A map-reduce engine on mpicomm (in the spirit of Sandia's MR-MPI), with word count and an inverted index.

    mpiexec -n 4 python -m apps.mapreduce wordcount [FILE...] [--top 20] [--output counts.tsv] [--lowercase] [--check]
    mpiexec -n 4 python -m apps.mapreduce invindex [FILE...] [--output index.tsv]
    python -m apps.mapreduce corpus DIR --size 200M
    mpiexec -n 2 python -m apps.mapreduce bench --size 200M

The engine is importable: :class:`MapReduce` (map over byte-range splits of
files, combine, shuffle by hash with all-to-all-v in rounds, group, reduce,
collect), with user functions as plain Python callables.
"""

from .combine import Collect, Combiner, Custom, Max, Min, Sum, Union
from .engine import DEFAULT_MEMORY, MIN_MEMORY, Budget, JobError, KeyValue, MapReduce, memory_usage
from .inputs import Block, InputError, Split, check_inputs, parse_size, plan_splits, read_blocks
from .shuffle import KINDS, Spec

__all__ = [
    "MapReduce",
    "KeyValue",
    "Budget",
    "JobError",
    "InputError",
    "Block",
    "Split",
    "Spec",
    "KINDS",
    "Combiner",
    "Sum",
    "Min",
    "Max",
    "Union",
    "Collect",
    "Custom",
    "check_inputs",
    "plan_splits",
    "read_blocks",
    "parse_size",
    "memory_usage",
    "DEFAULT_MEMORY",
    "MIN_MEMORY",
]
