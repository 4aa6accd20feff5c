"""mpicomm.registry: one table of algorithms, each with a cost; selection as data."""

from __future__ import annotations

import pytest

import mpicomm
from mpicomm import registry


def all_algorithms():
    return [a for algorithms in registry.table().values() for a in algorithms.values()]


@pytest.mark.parametrize("algorithm", all_algorithms(), ids=lambda a: f"{a.collective}/{a.name}")
def test_every_algorithm_documents_steps_and_cost(algorithm):
    doc = algorithm.steps.__doc__ or ""
    assert algorithm.cost, f"{algorithm.collective}/{algorithm.name} has no Cost: line"
    assert "α" in algorithm.cost
    assert "Steps:" in doc and "Restrictions:" in doc
    assert algorithm.summary


def test_barrier_algorithms_are_listed():
    assert mpicomm.algorithms("barrier") == ["dissemination", "native"]


def test_unknown_collective_lists_known_ones():
    with pytest.raises(ValueError, match="known: .*barrier"):
        mpicomm.algorithms("allreduse")


def test_unknown_algorithm_lists_registered_names():
    with pytest.raises(ValueError, match="registered: dissemination, native"):
        registry.lookup("barrier", "tornado")


def test_registering_without_cost_fails():
    def undocumented(comm):
        """Does something."""
        yield []

    with pytest.raises(TypeError, match="Cost:"):
        registry.register("barrier", "undocumented")(undocumented)


def test_registering_twice_fails():
    with pytest.raises(ValueError, match="twice"):
        registry.register("barrier", "native")(registry.lookup("barrier", "native").steps)


def test_selection_precedence(monkeypatch):
    monkeypatch.delenv("MPICOMM_BARRIER_ALGORITHM", raising=False)
    assert registry.select("barrier", None).name == registry.SELECTION["barrier"][0]["algorithm"]
    monkeypatch.setenv("MPICOMM_BARRIER_ALGORITHM", "dissemination")
    assert registry.select("barrier", None).name == "dissemination"
    assert registry.select("barrier", "auto").name == "dissemination"
    assert registry.select("barrier", None, comm_default="native").name == "native"
    assert registry.select("barrier", "dissemination", comm_default="native").name == "dissemination"
    monkeypatch.setenv("MPICOMM_BARRIER_ALGORITHM", "nope")
    with pytest.raises(ValueError, match="'nope'"):
        registry.select("barrier", None)
