"""mpicomm.selection: which algorithm runs a call - by call, communicator, environment, measured rules or default
rules, skipping what cannot run (the fitted model predicts, never chooses)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import replace

import pytest

from mpicomm import registry, rules, selection
from mpicomm.facts import Facts


def test_selection_precedence(monkeypatch):
    monkeypatch.delenv("MPICOMM_BARRIER_ALGORITHM", raising=False)
    assert selection.select("barrier", None).name == selection.SELECTION["barrier"][0]["algorithm"]
    monkeypatch.setenv("MPICOMM_BARRIER_ALGORITHM", "dissemination")
    assert selection.select("barrier", None).name == "dissemination"
    assert selection.select("barrier", "auto").name == "dissemination"
    assert selection.select("barrier", None, comm_default="native").name == "native"
    assert selection.select("barrier", "dissemination", comm_default="native").name == "dissemination"
    monkeypatch.setenv("MPICOMM_BARRIER_ALGORITHM", "nope")
    with pytest.raises(ValueError, match="'nope'"):
        selection.select("barrier", None)


# ---------------------------------------------------------------- sources, restrictions, and the rules' choice


def test_choose_says_where_the_choice_came_from(monkeypatch):
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    facts = Facts(p=4, bytes=8, count=1)
    assert selection.choose("allreduce", "ring", "tree", facts) == (registry.lookup("allreduce", "ring"), "call")
    assert selection.choose("allreduce", "auto", "tree", facts) == (registry.lookup("allreduce", "tree"),
                                                                     "communicator")
    monkeypatch.setenv("MPICOMM_ALLREDUCE_ALGORITHM", "naive")
    assert selection.choose("allreduce", None, None, facts) == (registry.lookup("allreduce", "naive"), "environment")
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM")
    assert selection.choose("allreduce", None, None, facts) == (selection.auto("allreduce", facts), "table")
    measured = rules.Rules({"allreduce": [{"max_bytes": 64, "algorithm": "naive"}]}, 4, 1, 4)
    assert selection.choose("allreduce", None, None, replace(facts, rules=measured)) == (
        registry.lookup("allreduce", "naive"), "rules")
    assert selection.select("allreduce", None, None, replace(facts, rules=measured)) is \
        selection.choose("allreduce", None, None, replace(facts, rules=measured))[0]


def single_node_allreduce():
    names = [a.name for a in registry.table()["allreduce"].values() if a.single_node]
    if not names:
        pytest.skip("no single-node allreduce algorithm is registered")
    return names[0]


def test_a_named_algorithm_that_cannot_run_raises_with_the_reason():
    name = single_node_allreduce()
    with pytest.raises(ValueError, match=f"allreduce algorithm '{name}' \\(from the call\\) needs every rank on one "
                                         f"node .* spans 2 nodes; use one that can run here: .*ring"):
        selection.choose("allreduce", name, None, Facts(p=4, nodes=2))
    with pytest.raises(ValueError, match="host memory only") as info:
        selection.choose("allreduce", None, name, Facts(p=4, nodes=1, device=True))
    assert "(from the communicator)" in str(info.value) and f" {name}," not in str(info.value)
    assert selection.choose("allreduce", name, None, Facts(p=4, nodes=1))[0].name == name


@pytest.mark.parametrize("collective", ["allreduce", "bcast", "reduce", "allgather", "alltoall", "reduce_scatter",
                                        "scan", "gather"])
@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("nbytes", [8, 4096, 1 << 16, 1 << 22])
def test_a_fitted_machine_does_not_change_the_choice(collective, p, nbytes):
    """The model predicts and explains; auto follows the rules whatever the machine (it was the model's choice
    once: a fitted machine made auto pick the least predicted algorithm). The facts hold no machine, so none can
    reach the choice: auto's choice is the default rules', and it can run."""
    assert "machine" not in {f.name for f in dataclasses.fields(Facts)}
    for facts in (Facts(p=p, bytes=nbytes, count=nbytes // 8, nodes=-(-p // 2)),
                  Facts(p=p, bytes=nbytes, commutative=False, nodes=1),
                  Facts(p=p, bytes=nbytes, nodes=1, device=True)):
        chosen, source = selection.choose(collective, None, None, facts)
        assert (chosen, source) == (selection.auto(collective, facts), "table")
        assert registry.allowed(chosen, facts) is None


def test_measured_rules_skip_an_algorithm_that_cannot_run():
    name = single_node_allreduce()
    measured = rules.Rules({"allreduce": [{"algorithm": name}, {"max_bytes": 1 << 20, "algorithm": "ring"}]}, 2, 1, 2)
    facts = Facts(p=2, bytes=1 << 20, nodes=1, rules=measured)
    assert selection.choose("allreduce", None, None, facts) == (registry.lookup("allreduce", name), "rules")
    for restricted in ({"nodes": 2}, {"device": True}):
        assert selection.choose("allreduce", None, None, replace(facts, **restricted)) == (
            registry.lookup("allreduce", "ring"), "rules")
    chosen, source = selection.choose("allreduce", None, None, replace(facts, commutative=False, nodes=2))
    assert source == "table" and not chosen.commutative_only and not chosen.single_node  # ring reorders: the table


def test_without_measured_rules_the_default_rules_decide():
    facts = Facts(p=4, bytes=4 << 20, count=1 << 19, nodes=1)
    table = selection.auto("allreduce", facts)
    assert table.name == "shm"  # one node, on the host
    assert selection.auto("allreduce", replace(facts, bytes=1 << 20, count=1 << 17)).name == "recursive_doubling"
    assert selection.auto("allreduce", replace(facts, device=True)).name == "rabenseifner"  # shm: host only
    assert selection.auto("allreduce", replace(facts, nodes=2, bytes=4 << 20)).name == "rabenseifner"
    assert selection.choose("allreduce", None, None, facts) == (table, "table")
    assert selection.choose("allreduce", None, None, replace(facts, rules=None)) == (table, "table")
    assert selection.choose("gatherv", None, None, Facts(p=4, bytes=None))[1] == "table"
    assert selection.choose("allreduce", None, None, Facts(p=1, bytes=8))[1] == "table"


def test_the_table_skips_algorithms_that_cannot_run():
    facts = Facts(p=4, bytes=1 << 20, count=1 << 17, commutative=False)
    assert not selection.auto("allreduce", facts).commutative_only
    name = single_node_allreduce()
    saved = selection.SELECTION["allreduce"]
    selection.SELECTION["allreduce"] = [{"algorithm": name}] + saved
    try:
        assert selection.auto("allreduce", Facts(p=4, nodes=1)).name == name
        assert selection.auto("allreduce", Facts(p=4, nodes=2)).name != name
        assert selection.auto("allreduce", Facts(p=4, nodes=1, device=True)).name != name
    finally:
        selection.SELECTION["allreduce"] = saved


def test_the_choice_its_source_and_its_rule_are_logged(caplog):
    measured = rules.Rules({"allreduce": [{"max_bytes": 1 << 20, "algorithm": "ring"}]}, 4, 1, 4)
    with caplog.at_level(logging.DEBUG, logger="mpicomm"):
        selection.choose("allreduce", None, None, Facts(p=4, bytes=1 << 20, rules=measured))
        selection.choose("allreduce", None, None, Facts(p=4, bytes=4 << 20))
    text = caplog.text
    assert ("allreduce: algorithm ring (from the rules), rule 1 of the measured rules of p4-1x4: up to 1048576 B "
            "→ ring") in text
    assert "(from the table), rule 2 of the default rules: from 4194304 B → shm" in text


def test_the_default_rules_are_the_shipped_rules_file():
    assert selection.SELECTION is selection.DEFAULT.collectives
    assert selection.DEFAULT.path == rules.DEFAULT_PATH and rules.DEFAULT_PATH.endswith("default_rules.json")
    assert rules.default().collectives == selection.SELECTION  # (as read from the file: no test left it patched)
    checked = rules.load(rules.DEFAULT_PATH, registry.algorithms)  # every algorithm named is registered
    assert set(checked.collectives) <= set(registry.table()) and not checked.p  # rules of any layout


def test_a_new_rule_list_makes_new_choices(monkeypatch):
    facts = Facts(p=4, bytes=8, count=1)
    assert selection.auto("allreduce", facts).name == "recursive_doubling"
    monkeypatch.setitem(selection.SELECTION, "allreduce", [{"max_bytes": 64, "algorithm": "naive"}])
    assert selection.choose("allreduce", None, None, facts) == (registry.lookup("allreduce", "naive"), "table")
    assert selection.auto_rule("allreduce", replace(facts, bytes=128)) == (
        registry.lookup("allreduce", "hierarchical"), "table", "no rule fits: the first algorithm by name that can run")
