"""Collectives: every algorithm of every collective, one module per collective.

``mpicomm/coll/allreduce.py`` holds the allreduce algorithms (``ring``,
``recursive_doubling``...), ``bcast.py`` the broadcasts, and so on; each
algorithm is a step generator registered in :mod:`mpicomm.registry` with its
steps, restrictions and α-β-γ cost in its docstring. :mod:`.call` is what an
algorithm sees of its call, :mod:`.schedules` the pure communication
schedules, :mod:`.dispatch` the path from arguments to a running algorithm.

The registry imports (and so registers) every module here the first time an
algorithm is looked up (:func:`mpicomm.registry.table`); importing one module
of the package, such as :mod:`.schedules`, imports nothing else.
"""
