"""The algorithms: every collective's named algorithms, one module per collective, and nothing else.

``mpicomm/coll/allreduce.py`` holds the allreduce algorithms (``ring``,
``recursive_doubling``...), ``bcast.py`` the broadcasts, and so on. Each
algorithm is a short function that *describes* one rank's part of a call as a
schedule (:mod:`mpicomm.schedule`): rounds of messages, then reductions and
copies. It is registered in :mod:`mpicomm.registry` with its restrictions, and
its docstring gives its steps and restrictions. Its α-β-γ cost is the function
beside it registered with :func:`mpicomm.registry.cost`: the body computes
it, the docstring states the formula - the one place it is written in words
(``python -m mpicomm algorithms`` shows it). :mod:`.patterns` holds the pure
communication patterns (rings, binomial trees, the fold onto a power of two)
the algorithms share, tested against literal tables; :mod:`.node_memory` the
shared-memory algorithms' schedules; :mod:`.hierarchy` the levels
hierarchical algorithms nest their calls on.

The registry imports (and so registers) every module here the first time an
algorithm is looked up (:func:`mpicomm.registry.table`); importing one module
of the package, such as :mod:`.patterns`, imports nothing else.
"""
