"""mpicomm.registry: one table of algorithms, each with a cost; restrictions; selection by call, communicator,
environment, measured rules or default rules (the fitted model predicts, never chooses)."""

from __future__ import annotations

import logging
import sys
from dataclasses import replace

import pytest

import mpicomm
from mpicomm import model, registry, rules


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


# ---------------------------------------------------------------- restrictions, sources, and the rules' choice


def fake(name="fake", **restrictions):
    """An unregistered algorithm with these restrictions (allowed() only reads the flags)."""
    return registry.Algorithm("allreduce", name, registry.lookup("allreduce", "ring").steps, **restrictions)


def test_allowed_names_the_reason():
    assert registry.allowed(fake(), {"p": 3, "nodes": 2, "device": True, "commutative": False}) is None
    assert "not commutative" in registry.allowed(fake(commutative_only=True), {"commutative": False, "op": "matmul"})
    assert registry.allowed(fake(commutative_only=True), {"commutative": True}) is None
    assert "spans 2 nodes" in registry.allowed(fake(single_node=True), {"nodes": 2})
    assert registry.allowed(fake(single_node=True), {"nodes": 1}) is None
    assert registry.allowed(fake(single_node=True), {}) is None
    assert "host memory only" in registry.allowed(fake(host_only=True), {"device": True})
    assert registry.allowed(fake(host_only=True), {"device": False}) is None
    assert registry.allowed(fake(host_only=True), {"device": None}) is None
    assert "p = 6" in registry.allowed(fake(power_of_two=True), {"p": 6})
    assert registry.allowed(fake(power_of_two=True), {"p": 8}) is None


def test_choose_says_where_the_choice_came_from(monkeypatch):
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    facts = {"p": 4, "bytes": 8, "count": 1}
    assert registry.choose("allreduce", "ring", "tree", facts) == (registry.lookup("allreduce", "ring"), "call")
    assert registry.choose("allreduce", "auto", "tree", facts) == (registry.lookup("allreduce", "tree"), "communicator")
    monkeypatch.setenv("MPICOMM_ALLREDUCE_ALGORITHM", "naive")
    assert registry.choose("allreduce", None, None, facts) == (registry.lookup("allreduce", "naive"), "environment")
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM")
    assert registry.choose("allreduce", None, None, facts) == (registry.auto("allreduce", facts), "table")
    measured = rules.Rules({"allreduce": [{"max_bytes": 64, "algorithm": "naive"}]}, 4, 1, 4)
    assert registry.choose("allreduce", None, None, {**facts, "rules": measured}) == (
        registry.lookup("allreduce", "naive"), "rules")
    assert registry.select("allreduce", None, None, {**facts, "rules": measured}) is \
        registry.choose("allreduce", None, None, {**facts, "rules": measured})[0]


def single_node_allreduce():
    names = [a.name for a in registry.table()["allreduce"].values() if a.single_node]
    if not names:
        pytest.skip("no single-node allreduce algorithm is registered")
    return names[0]


def test_a_named_algorithm_that_cannot_run_raises_with_the_reason():
    name = single_node_allreduce()
    with pytest.raises(ValueError, match=f"allreduce algorithm '{name}' \\(from the call\\) needs every rank on one "
                                         f"node .* spans 2 nodes; use one that can run here: .*ring"):
        registry.choose("allreduce", name, None, {"p": 4, "nodes": 2})
    with pytest.raises(ValueError, match="host memory only") as info:
        registry.choose("allreduce", None, name, {"p": 4, "nodes": 1, "device": True})
    assert "(from the communicator)" in str(info.value) and f" {name}," not in str(info.value)
    assert registry.choose("allreduce", name, None, {"p": 4, "nodes": 1})[0].name == name


#: Every link alike: α 20 µs, β 0.125 ns/B (8 GB/s), γ 0.03 ns/B, δ 0.02 ns/B; two ranks per node.
MACHINE = model.Machine(intra=model.Link(20e-6, 0.125e-9), inter=model.Link(20e-6, 0.125e-9), gamma=0.03e-9,
                        copy=0.02e-9, overhead=40e-6, validation=20e-6, ppn=2, nodes=2, host="h", created="")


def argmin(collective, facts, machine):
    """The allowed algorithm of least prediction, ties by name."""
    seconds = {name: registry.predict(collective, name, facts["bytes"], facts["p"], machine)
               for name in registry.table()[collective]
               if registry.allowed(registry.lookup(collective, name), facts) is None}
    least = min(seconds.values())
    return min(name for name, s in seconds.items() if s <= least * (1 + 1e-9))  # equal but for rounding: by name


@pytest.mark.parametrize("collective", ["allreduce", "bcast", "reduce", "allgather", "alltoall", "reduce_scatter",
                                        "scan", "gather"])
@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("nbytes", [8, 4096, 1 << 16, 1 << 22])
def test_a_fitted_machine_does_not_change_the_choice(collective, p, nbytes):
    """The model predicts and explains; auto follows the rules whatever the machine (it was the model's choice
    once: a fitted machine made auto pick the least predicted algorithm)."""
    for facts in ({"p": p, "bytes": nbytes, "count": nbytes // 8, "nodes": -(-p // 2)},
                  {"p": p, "bytes": nbytes, "commutative": False, "nodes": 1},
                  {"p": p, "bytes": nbytes, "nodes": 1, "device": True}):
        chosen, source = registry.choose(collective, None, None, {**facts, "machine": MACHINE})
        assert (chosen, source) == (registry.auto(collective, facts), "table")
        assert registry.allowed(chosen, facts) is None


def test_the_balance_of_alpha_and_beta_flips_the_fastest_prediction():
    facts = {"p": 4, "bytes": 1 << 20, "count": 1 << 17, "nodes": 2, "ppn": 2}
    latency = replace(MACHINE, intra=model.Link(1e-3, 1e-15), inter=model.Link(1e-3, 1e-15), gamma=1e-15, copy=1e-15)
    bandwidth = replace(MACHINE, intra=model.Link(1e-9, 1e-6), inter=model.Link(1e-9, 1e-6), gamma=1e-9, copy=1e-6)
    assert argmin("allreduce", facts, latency) == "recursive_doubling"  # lg p messages
    assert argmin("allreduce", facts, bandwidth) in ("ring", "rabenseifner")  # 2n(p−1)/p bytes instead of n·lg p
    assert argmin("bcast", facts, latency) == "binomial"
    assert argmin("bcast", facts, bandwidth) in ("scatter_allgather", "pipeline")


def test_measured_rules_skip_an_algorithm_that_cannot_run():
    name = single_node_allreduce()
    measured = rules.Rules({"allreduce": [{"algorithm": name}, {"max_bytes": 1 << 20, "algorithm": "ring"}]}, 2, 1, 2)
    facts = {"p": 2, "bytes": 1 << 20, "nodes": 1, "rules": measured}
    assert registry.choose("allreduce", None, None, facts) == (registry.lookup("allreduce", name), "rules")
    for restricted in ({"nodes": 2}, {"device": True}):
        assert registry.choose("allreduce", None, None, {**facts, **restricted}) == (
            registry.lookup("allreduce", "ring"), "rules")
    chosen, source = registry.choose("allreduce", None, None, {**facts, "commutative": False, "nodes": 2})
    assert source == "table" and not chosen.commutative_only and not chosen.single_node  # ring reorders: the table


def test_without_measured_rules_the_default_rules_decide():
    facts = {"p": 4, "bytes": 4 << 20, "count": 1 << 19, "nodes": 1}
    table = registry.auto("allreduce", facts)
    assert table.name == "shm"  # one node, on the host
    assert registry.auto("allreduce", {**facts, "bytes": 1 << 20, "count": 1 << 17}).name == "recursive_doubling"
    assert registry.auto("allreduce", {**facts, "device": True}).name == "rabenseifner"  # shm: host only
    assert registry.auto("allreduce", {**facts, "nodes": 2, "bytes": 4 << 20}).name == "rabenseifner"
    assert registry.choose("allreduce", None, None, facts) == (table, "table")
    assert registry.choose("allreduce", None, None, {**facts, "rules": None}) == (table, "table")
    assert registry.choose("gatherv", None, None, {"p": 4, "bytes": None, "machine": MACHINE})[1] == "table"
    assert registry.choose("allreduce", None, None, {"p": 1, "bytes": 8, "machine": MACHINE})[1] == "table"


def test_the_table_skips_algorithms_that_cannot_run():
    facts = {"p": 4, "bytes": 1 << 20, "count": 1 << 17, "commutative": False}
    assert not registry.auto("allreduce", facts).commutative_only
    name = single_node_allreduce()
    saved = registry.SELECTION["allreduce"]
    registry.SELECTION["allreduce"] = [{"algorithm": name}] + saved
    try:
        assert registry.auto("allreduce", {"p": 4, "nodes": 1}).name == name
        assert registry.auto("allreduce", {"p": 4, "nodes": 2}).name != name
        assert registry.auto("allreduce", {"p": 4, "nodes": 1, "device": True}).name != name
    finally:
        registry.SELECTION["allreduce"] = saved


def test_the_choice_its_source_and_its_rule_are_logged(caplog):
    measured = rules.Rules({"allreduce": [{"max_bytes": 1 << 20, "algorithm": "ring"}]}, 4, 1, 4)
    with caplog.at_level(logging.DEBUG, logger="mpicomm"):
        registry.choose("allreduce", None, None, {"p": 4, "bytes": 1 << 20, "rules": measured})
        registry.choose("allreduce", None, None, {"p": 4, "bytes": 4 << 20})
    text = caplog.text
    assert ("allreduce: algorithm ring (from the rules), rule 1 of the measured rules of p4-1x4: up to 1048576 B "
            "→ ring") in text
    assert "(from the table), rule 2 of the default rules: from 4194304 B → shm" in text


def test_the_default_rules_are_the_shipped_rules_file():
    assert registry.SELECTION is registry.DEFAULT.collectives
    assert registry.DEFAULT.path == rules.DEFAULT_PATH and rules.DEFAULT_PATH.endswith("default_rules.json")
    assert rules.default().collectives == registry.SELECTION  # (as read from the file: no test left it patched)
    checked = rules.load(rules.DEFAULT_PATH, registry.algorithms)  # every algorithm named is registered
    assert set(checked.collectives) <= set(registry.table()) and not checked.p  # rules of any layout


def test_a_new_rule_list_makes_new_choices(monkeypatch):
    facts = {"p": 4, "bytes": 8, "count": 1}
    assert registry.auto("allreduce", facts).name == "recursive_doubling"
    monkeypatch.setitem(registry.SELECTION, "allreduce", [{"max_bytes": 64, "algorithm": "naive"}])
    assert registry.choose("allreduce", None, None, facts) == (registry.lookup("allreduce", "naive"), "table")
    assert registry.auto_rule("allreduce", {**facts, "bytes": 128}) == (
        registry.lookup("allreduce", "hierarchical"), "table", "no rule fits: the first algorithm by name that can run")
