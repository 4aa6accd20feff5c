"""mpicomm.registry: one table of algorithms, each with a cost; restrictions; the fitted model's predictions (which
algorithm a call runs is mpicomm.selection's: tests/test_selection.py)."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

import mpicomm
from mpicomm import model, registry
from mpicomm.facts import Facts


def all_algorithms():
    return [a for algorithms in registry.table().values() for a in algorithms.values()]


@pytest.mark.parametrize("algorithm", all_algorithms(), ids=lambda a: f"{a.collective}/{a.name}")
def test_every_algorithm_documents_steps_and_cost(algorithm):
    doc = algorithm.steps.__doc__ or ""
    assert algorithm.cost, f"{algorithm.collective}/{algorithm.name} states no cost"
    assert "α" in algorithm.cost or "T(" in algorithm.cost  # α-β-γ, or a composition of other algorithms' costs
    assert "Steps:" in doc and "Restrictions:" in doc
    assert algorithm.summary


def mpicomms_own():
    return [a for a in all_algorithms() if a.steps.__module__.startswith("mpicomm.coll.")]


@pytest.mark.parametrize("algorithm", mpicomms_own(), ids=lambda a: f"{a.collective}/{a.name}")
def test_each_of_mpicomms_algorithms_states_its_cost_once_in_its_cost_functions_docstring(algorithm):
    """The formula in words lives in the docstring of the cost function beside the algorithm, and only there."""
    fn = registry.cost_function(algorithm.collective, algorithm.name)
    assert fn is not None, f"{algorithm.collective}/{algorithm.name} has no cost function (@cost) beside it"
    assert registry.stated(fn), f"{algorithm.collective}/{algorithm.name}: its cost function {fn.__qualname__} " \
                                f"has no docstring stating the formula"
    assert algorithm.cost == registry.stated(fn)
    assert not registry.cost_of(algorithm.steps), (
        f"{algorithm.collective}/{algorithm.name}: its docstring has a Cost: line; the formula is stated by the "
        f"docstring of its cost function {fn.__qualname__} only")


def test_barrier_algorithms_are_listed():
    assert mpicomm.algorithms("barrier") == ["dissemination", "native"]


def test_unknown_collective_lists_known_ones():
    with pytest.raises(ValueError, match="known: .*barrier"):
        mpicomm.algorithms("allreduse")


def test_unknown_algorithm_lists_registered_names():
    with pytest.raises(ValueError, match="registered: dissemination, native"):
        registry.lookup("barrier", "tornado")


@pytest.fixture
def scratch_table(monkeypatch):
    """The barrier algorithms and the cost functions as copies, so that a test's registrations are undone."""
    registry.table()
    monkeypatch.setitem(registry._TABLE, "barrier", dict(registry._TABLE["barrier"]))
    monkeypatch.setattr(registry, "_COSTS", dict(registry._COSTS))


@pytest.mark.serial  # no MPI
def test_the_cost_is_the_cost_functions_docstring_else_a_cost_line_of_its_own(scratch_table):
    def with_a_line(s):
        """A user's algorithm that states its cost in its own docstring.

        Steps: none. Restrictions: none.
        Cost: α + n·β
        """

    def undocumented(s):
        """Does something."""

    registry.register("barrier", "with_a_line")(with_a_line)
    registry.register("barrier", "undocumented")(undocumented)  # registers: its cost function may come after it
    assert registry.lookup("barrier", "with_a_line").cost == "α + n·β"  # no cost function
    assert registry.lookup("barrier", "undocumented").cost == ""
    registry.cost("barrier", "with_a_line")(lambda m, n, p: 0.0)  # a cost function without a docstring
    assert registry.lookup("barrier", "with_a_line").cost == "α + n·β"

    @registry.cost("barrier", "undocumented")
    def _cost(m, n, p):
        """2α + n·β  (a remark that runs
        on a second line)

        Notes for readers of the code, not shown.
        """
        return 0.0

    assert registry.lookup("barrier", "undocumented").cost == "2α + n·β  (a remark that runs on a second line)"
    assert registry.stated(None) == "" and registry.stated(lambda m, n, p: 0.0) == ""


@pytest.mark.serial  # no MPI
def test_an_algorithm_of_mpicomm_without_a_stated_cost_stops_the_table(scratch_table, monkeypatch):
    def fake(s):
        """Fake.

        Cost: α (a line is not enough for mpicomm's own: its cost function's docstring states the formula)
        """

    fake.__module__ = "mpicomm.coll.fake"
    registry.register("barrier", "fake")(fake)
    assert registry._unstated("mpicomm.coll", own=True) == ["barrier/fake"]
    assert registry._unstated("mpicomm.coll") == []  # a user's algorithm may state it in a Cost: line
    monkeypatch.setattr(registry, "_loaded", [])
    with pytest.raises(TypeError, match="formula for barrier/fake: register one beside each algorithm in "
                                        "mpicomm.coll with @cost"):
        registry.table()
    registry.cost("barrier", "fake")(lambda m, n, p: 0.0)  # a cost function, but no docstring
    with pytest.raises(TypeError, match="barrier/fake"):
        registry.table()


@pytest.mark.serial  # no MPI
def test_a_user_module_that_states_no_cost_fails_to_import(scratch_table, monkeypatch, tmp_path):
    (tmp_path / "mpicomm_test_unstated.py").write_text(
        "from mpicomm import register_algorithm\n\n\n"
        "@register_algorithm('barrier', 'unstated')\n"
        "def unstated(s):\n"
        "    \"\"\"Does something.\"\"\"\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_plugins", list(registry._plugins))
    try:
        with pytest.raises(ImportError, match="algorithm module 'mpicomm_test_unstated' states no cost for "
                                              "barrier/unstated: register a cost function"):
            registry.import_modules("mpicomm_test_unstated")
        assert "mpicomm_test_unstated" not in registry.user_modules()

        @registry.cost("barrier", "unstated")
        def _cost(m, n, p):
            """⌈lg p⌉·α"""
            return 0.0

        assert registry.import_modules("mpicomm_test_unstated") == ["mpicomm_test_unstated"]  # tried again: stated
    finally:
        sys.modules.pop("mpicomm_test_unstated", None)


def test_registering_twice_fails():
    with pytest.raises(ValueError, match="twice"):
        registry.register("barrier", "native")(registry.lookup("barrier", "native").steps)


# ---------------------------------------------------------------- restrictions, and the model's predictions


def fake(name="fake", **restrictions):
    """An unregistered algorithm with these restrictions (allowed() only reads the flags)."""
    return registry.Algorithm("allreduce", name, registry.lookup("allreduce", "ring").steps, **restrictions)


def test_allowed_names_the_reason():
    assert registry.allowed(fake(), Facts(p=3, nodes=2, device=True, commutative=False)) is None
    assert "not commutative" in registry.allowed(fake(commutative_only=True), Facts(commutative=False, op="matmul"))
    assert registry.allowed(fake(commutative_only=True), Facts(commutative=True)) is None
    assert "spans 2 nodes" in registry.allowed(fake(single_node=True), Facts(nodes=2))
    assert registry.allowed(fake(single_node=True), Facts(nodes=1)) is None
    assert registry.allowed(fake(single_node=True), Facts()) is None
    assert "host memory only" in registry.allowed(fake(host_only=True), Facts(device=True))
    assert registry.allowed(fake(host_only=True), Facts(device=False)) is None
    assert registry.allowed(fake(host_only=True), Facts()) is None  # host buffers unless said otherwise
    assert "p = 6" in registry.allowed(fake(power_of_two=True), Facts(p=6))
    assert registry.allowed(fake(power_of_two=True), Facts(p=8)) is None


#: Every link alike: α 20 µs, β 0.125 ns/B (8 GB/s), γ 0.03 ns/B, δ 0.02 ns/B; two ranks per node.
MACHINE = model.Machine(intra=model.Link(20e-6, 0.125e-9), inter=model.Link(20e-6, 0.125e-9), gamma=0.03e-9,
                        copy=0.02e-9, overhead=40e-6, validation=20e-6, ppn=2, nodes=2, host="h", created="")


def argmin(collective, facts, machine):
    """The allowed algorithm of least prediction, ties by name."""
    seconds = {name: registry.predict(collective, name, facts.bytes, facts.p, machine)
               for name in registry.table()[collective]
               if registry.allowed(registry.lookup(collective, name), facts) is None}
    least = min(seconds.values())
    return min(name for name, s in seconds.items() if s <= least * (1 + 1e-9))  # equal but for rounding: by name


def test_the_balance_of_alpha_and_beta_flips_the_fastest_prediction():
    facts = Facts(p=4, bytes=1 << 20, count=1 << 17, nodes=2, ppn=2)
    latency = replace(MACHINE, intra=model.Link(1e-3, 1e-15), inter=model.Link(1e-3, 1e-15), gamma=1e-15, copy=1e-15)
    bandwidth = replace(MACHINE, intra=model.Link(1e-9, 1e-6), inter=model.Link(1e-9, 1e-6), gamma=1e-9, copy=1e-6)
    assert argmin("allreduce", facts, latency) == "recursive_doubling"  # lg p messages
    assert argmin("allreduce", facts, bandwidth) in ("ring", "rabenseifner")  # 2n(p−1)/p bytes instead of n·lg p
    assert argmin("bcast", facts, latency) == "binomial"
    assert argmin("bcast", facts, bandwidth) in ("scatter_allgather", "pipeline")
