"""Collectives: every algorithm of every collective, one module per collective.

``mpicomm/coll/allreduce.py`` holds the allreduce algorithms (``ring``,
``recursive_doubling``...), ``bcast.py`` the broadcasts, and so on; each
algorithm is a step generator registered in :mod:`mpicomm.registry` with its
steps, restrictions and α-β-γ cost in its docstring. :mod:`.call` is what an
algorithm sees of its call, :mod:`.schedules` the pure communication
schedules, :mod:`.dispatch` the path from arguments to a running algorithm.

Importing this package imports (and so registers) every module in it.
"""

from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
