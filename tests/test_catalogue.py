"""The catalogue: one row per collective, read by the dispatcher, the readers, the model and the benchmarks."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from mpicomm import catalogue, registry


def test_every_collective_has_a_row_and_mpi4py_has_its_methods():
    for name, row in catalogue.CATALOGUE.items():
        assert row.name == name
        where = MPI.Topocomm if row.neighbor else MPI.Intracomm
        assert hasattr(where, row.method), row.method
        assert hasattr(where, row.nonblocking), row.nonblocking
        assert hasattr(where, row.persistent), row.persistent
        assert row.size in catalogue.SIZE_RULES
        assert row.family in catalogue.SIGNATURES
    assert catalogue.row("allreduce").persistent == "Allreduce_init"
    assert catalogue.row("reduce_scatter_block").nonblocking == "Ireduce_scatter_block"


def test_rows_say_the_facts_mpi_defines():
    assert {"bcast", "reduce", "gather", "gatherv", "scatter", "scatterv"} == catalogue.ROOTED
    assert {"reduce", "allreduce", "reduce_scatter", "reduce_scatter_block", "scan", "exscan"} == catalogue.REDUCING
    assert {"gatherv", "scatterv", "allgatherv", "alltoallv", "alltoallw", "reduce_scatter", "neighbor_allgatherv",
            "neighbor_alltoallv", "neighbor_alltoallw"} == catalogue.VECTORED
    neighborhood = {"neighbor_allgather", "neighbor_allgatherv", "neighbor_alltoall", "neighbor_alltoallv",
                    "neighbor_alltoallw"}
    assert neighborhood == catalogue.NEIGHBORHOOD
    assert {c for c in catalogue.COLLECTIVES if catalogue.family(c) != c} == {
        "gatherv", "scatterv", "allgatherv", "alltoallv", "alltoallw", "reduce_scatter_block"} | neighborhood
    assert {catalogue.family(c) for c in neighborhood} == {"neighbor"}
    assert all(catalogue.row(c).size == "edge" and catalogue.row(c).blockwise for c in neighborhood)


def test_every_family_has_registered_algorithms_and_every_algorithm_a_cost():
    table = registry.table()
    for name in catalogue.COLLECTIVES:
        assert table.get(name), f"no algorithm registered for {name}"
        for algorithm in table[name].values():
            assert algorithm.time is not None, f"{name}/{algorithm.name} has no cost function beside it"
            assert algorithm.cost, f"{name}/{algorithm.name}: its cost function's docstring states no formula"


def test_an_unknown_collective_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown collective 'allreduse'.*allreduce"):
        catalogue.row("allreduse")
