"""Skip, on every rank alike, a forced algorithm that cannot run where this pass runs.

The collective test modules parametrize over every registered algorithm. On
a pass of simulated nodes (``python -m tests --ranks 2x2``) the shared-memory
algorithms need one node, and with CuPy buffers they need host memory; the
tests that keep nonblocking calls in flight (named ``…in_flight``) cannot
force an algorithm registered for blocking calls only (tests/test_shm.py
checks that this is refused on every rank). The registry says why
(:func:`mpicomm.registry.allowed`), and the test is skipped with that reason.
Every rank sees the same topology, so every rank skips.
"""

from __future__ import annotations

import pytest

from mpicomm import registry
from mpicomm.facts import Facts

#: Test module → the collectives its ``algorithm`` parameter names (the v-forms share the algorithms).
_COLLECTIVE = {
    "test_allreduce": "allreduce", "test_reduce": "reduce", "test_bcast": "bcast", "test_allgather": "allgather",
    "test_alltoall": "alltoall", "test_reduce_scatter": "reduce_scatter", "test_gather": "gather",
    "test_scatter": "scatter", "test_scan": "scan",
}


@pytest.fixture(autouse=True)
def _skip_what_cannot_run(request: pytest.FixtureRequest) -> None:
    callspec = getattr(request.node, "callspec", None)
    name = callspec.params.get("algorithm") if callspec is not None else None
    collective = _COLLECTIVE.get(request.module.__name__.rsplit(".", 1)[-1])
    case = callspec.params.get("case") if callspec is not None else None
    if isinstance(case, tuple) and len(case) == 2:  # (collective, algorithm), as in test_reduce_scatter
        collective, name = case
    if not isinstance(name, str) or collective is None or name not in registry.algorithms(collective):
        return
    comm = request.getfixturevalue("comm")
    facts = Facts(p=comm.Get_size(), nodes=comm.nodes, device=callspec.params.get("xp") == "cupy",
                  blocking=not request.node.originalname.endswith("in_flight"))
    why = registry.allowed(registry.lookup(collective, name), facts)
    if why is not None:
        pytest.skip(f"{collective} algorithm {name!r} {why}")
