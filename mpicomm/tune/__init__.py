"""``mpiexec -n N python -m mpicomm.tune``: measure this machine - fit the α-β-γ model, or time the collectives into rules.

One concept per module:

* :mod:`mpicomm.tune.fit` - measuring messages, reductions, copies and call
  costs, and fitting the :class:`~mpicomm.model.Machine` (``tune``);
* :mod:`mpicomm.tune.reports` - a fitted machine and a fit's residuals as text
  (what was not measured marked) and as JSON (``tune``, ``tune --show``);
* :mod:`mpicomm.tune.collectives` - timing every algorithm of each collective
  and writing the fastest per size as selection rules (:mod:`mpicomm.rules`),
  and correcting the model from those times (``tune --collectives``);
* :mod:`mpicomm.tune.command` - the command line (``python -m mpicomm.tune``,
  its options, saving, advice that never asks for fewer than :data:`MIN_RANKS`
  ranks).

The names below are the package's interface; each lives in one of those modules.
"""

from __future__ import annotations

from .collectives import auto_closeness, collective_iterations, measure_collectives, model_corrections
from .command import MIN_RANKS, PROG, main, tune_command
from .fit import Fit, cache_threshold, fit_knee, fit_regimes, last_level_cache, machine_from, measure
from .reports import NOT_MEASURED, describe, fit_json, machine_json, report, unmeasured

__all__ = ["main", "measure", "Fit", "fit_regimes", "fit_knee", "last_level_cache", "cache_threshold", "machine_from",
           "measure_collectives", "collective_iterations", "auto_closeness", "model_corrections", "describe",
           "unmeasured", "report", "fit_json", "machine_json", "NOT_MEASURED", "tune_command", "MIN_RANKS", "PROG"]
