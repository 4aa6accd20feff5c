"""mpicomm.tune.reports: the report of a fit (deterministic), values not measured are marked, and the fit as JSON."""

from __future__ import annotations

import json
import re

import pytest

from mpicomm import model
from mpicomm.tune import fit as fitting
from mpicomm.tune import reports as reporting
from tests.tune.test_fit import TWO_SIZES, TWO_TIMES


def synthetic_fit() -> fitting.Fit:
    """A Fit whose measurements lie exactly on known lines, but for the 8-byte intra-node sample (+10 %)."""
    fit = fitting.Fit()
    fit.p, fit.layout = 4, "p4-2x2"
    fit.sizes = [8, 1024, 65536]
    fit.intra = [5e-6 + 1e-10 * n for n in fit.sizes]
    fit.intra[0] *= 1.1
    fit.inter = [20e-6 + 1e-9 * n for n in fit.sizes]
    fit.add_bytes = [8, 1024, 65536]
    fit.add = [1e-6 + 0.5e-10 * n for n in fit.add_bytes]
    fit.copy = [0.5e-6 + 0.25e-10 * n for n in fit.add_bytes]
    fit.lines = {"intra": (5e-6, 1e-10), "inter": (20e-6, 1e-9), "gamma": (1e-6, 0.5e-10), "copy": (0.5e-6, 0.25e-10)}
    fit.call_seconds, fit.small_copy, fit.validated, fit.unvalidated = 31e-6, 1e-6, 80e-6, 50e-6
    fit.machine = model.Machine(intra=model.Link(5e-6, 1e-10), inter=model.Link(20e-6, 1e-9), gamma=0.5e-10,
                                copy=0.25e-10, overhead=30e-6, validation=30e-6, ppn=2, nodes=2, host="h1",
                                created="2026-01-01T00:00:00+00:00")
    return fit


def test_report_shows_the_fit_and_the_residuals():
    text = reporting.report(synthetic_fit())
    assert "4 ranks on 2 node(s), up to 2 per node (layout p4-2x2), host h1" in text
    assert re.search(r"intra-node\s+alpha\s+5\.00 µs\s+beta\s+0\.1000 ns/B\s+\(\s+10\.00 GB/s\)$", text, re.M)
    assert re.search(r"inter-node\s+alpha\s+20\.00 µs\s+beta\s+1\.0000 ns/B\s+\(\s+1\.00 GB/s\)$", text, re.M)
    assert re.search(r"gamma\s+0\.0500 ns/B reduced \(20\.00 GB/s\)", text)
    assert re.search(r"overhead\s+30\.00 µs", text) and re.search(r"validation\s+30\.00 µs", text)
    assert "meas (µs)" in text and "(us)" not in text and " us " not in text
    ping, local = [line.split() for line in text.splitlines() if re.match(r"\s+8\s", line)]  # the 8-byte rows
    assert ping[1:4] == ["5.50", "5.00", "-9.1%"]  # measured 10 % above the line
    assert ping[4:7] == ["20.01", "20.01", "+0.0%"]  # 20 µs + 8 ns
    assert local[1:7] == ["1.00", "1.00", "+0.0%", "0.50", "0.50", "+0.0%"]  # add and copy on their lines
    assert "one node" not in text


def test_report_says_when_inter_is_taken_from_intra():
    fit = synthetic_fit()
    fit.inter = None
    del fit.lines["inter"]
    text = reporting.report(fit)
    assert "one node: the inter-node link is taken to be the intra-node link" in text
    assert "inter meas" not in text


def test_machine_from_fits_both_regimes_and_the_report_shows_them():
    fit = fitting.Fit()
    fit.p, fit.layout, fit.cache_bytes, fit.cache_source = 2, "p2-1x2", 1 << 20, "test"
    fit.sizes, fit.intra = TWO_SIZES, TWO_TIMES
    fit.add_bytes, fit.add = TWO_SIZES, [2 * t for t in TWO_TIMES]
    fit.copy = TWO_TIMES
    m = fitting.machine_from(fit, 2, 1, "h1")
    assert m.cache_bytes == 1 << 20 and m.inter == m.intra
    assert m.intra.beta == pytest.approx(1e-10, rel=1e-9) and m.intra_mem.beta == pytest.approx(4e-10, rel=1e-9)
    assert m.gamma == pytest.approx(2e-10, rel=1e-9) and m.gamma_mem == pytest.approx(8e-10, rel=1e-9)
    assert m.copy_mem == pytest.approx(4e-10, rel=1e-9)
    fit.machine = m
    text = reporting.report(fit)
    assert re.search(r"intra mem\s+alpha\s+5\.00 µs\s+beta\s+0\.4000 ns/B", text)
    assert re.search(r"gamma mem\s+0\.8000 ns/B", text) and "cache       1048576 B" in text
    row = [line.split() for line in text.splitlines() if re.match(r"\s+33554432\s", line)][0]
    assert row[3] in ("+0.0%", "-0.0%")  # the 32 MiB sample lies on the memory line


def one_node_machine(**changes) -> model.Machine:
    base = dict(intra=model.Link(5e-6, 1e-10), inter=model.Link(5e-6, 1e-10), gamma=0.5e-10, copy=0.25e-10,
                overhead=30e-6, validation=30e-6, ppn=2, nodes=1, host="h1", created="2026-01-01T00:00:00+00:00",
                cache_bytes=1 << 20, intra_mem=model.Link(5e-6, 4e-10), inter_mem=model.Link(5e-6, 4e-10),
                gamma_mem=1e-10, copy_mem=0.5e-10)
    base.update(changes)
    return model.Machine(**base)


def marks(lines: list[str]) -> dict[str, str]:
    """Row name → the reason of its ``[not measured: ...]`` mark, from describe's lines."""
    found = {}
    for line in lines:
        m = re.match(r"\s+(\S+(?: mem)?)\s.*\[not measured: ([^\]]+)\]$", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def test_one_node_marks_the_inter_node_link_as_not_measured(tmp_path):
    machine = one_node_machine()
    assert set(reporting.unmeasured(machine)) == {"inter-node", "inter mem"}
    shown = marks(reporting.describe(machine))
    assert set(shown) == {"inter-node", "inter mem"} and "one node" in shown["inter-node"]
    # the saved file says nothing about it: read back, the marks are the same
    path = model.save(machine, str(tmp_path / "model.json"))
    with open(path) as f:
        loaded = model.Machine.from_json(f.read())
    assert marks(reporting.describe(loaded)) == shown


def test_one_rank_per_node_marks_the_intra_node_link():
    machine = one_node_machine(nodes=2, ppn=1, inter=model.Link(20e-6, 1e-9), inter_mem=model.Link(20e-6, 2e-9))
    assert set(marks(reporting.describe(machine))) == {"intra-node", "intra mem"}
    assert "one rank per node" in reporting.unmeasured(machine)["intra-node"]


def test_a_memory_regime_not_fitted_is_marked():
    machine = one_node_machine(nodes=2, inter=model.Link(20e-6, 1e-9), intra_mem=None, inter_mem=None,
                               gamma_mem=None, copy_mem=None)
    shown = marks(reporting.describe(machine))
    assert set(shown) == {"intra mem", "inter mem", "gamma mem", "copy mem"}
    assert all("cache-regime value" in reason for reason in shown.values())
    measured = one_node_machine(nodes=2, inter=model.Link(20e-6, 1e-9), inter_mem=model.Link(20e-6, 3e-9))
    assert reporting.unmeasured(measured) == {} and marks(reporting.describe(measured)) == {}


def test_report_marks_what_one_node_did_not_measure():
    fit = fitting.Fit()
    fit.p, fit.layout, fit.cache_bytes, fit.cache_source = 2, "p2-1x2", 1 << 20, "test"
    fit.sizes, fit.intra = TWO_SIZES, TWO_TIMES
    fit.add_bytes, fit.add, fit.copy = TWO_SIZES, [2 * t for t in TWO_TIMES], TWO_TIMES
    fit.machine = fitting.machine_from(fit, 2, 1, "h1")
    shown = marks(reporting.report(fit).splitlines())
    assert set(shown) == {"inter-node", "inter mem"}


def test_fit_json_holds_the_machine_the_samples_and_what_was_not_measured():
    fit = synthetic_fit()
    body = reporting.fit_json(fit)
    json.dumps(body)  # plain JSON
    assert body["layout"] == "p4-2x2" and body["p"] == 4
    assert model.Machine.from_json(json.dumps(body["machine"])) == fit.machine
    assert body["not_measured"] == reporting.unmeasured(fit.machine)
    assert body["pingpong"] == {"bytes": fit.sizes, "intra_s": fit.intra, "inter_s": fit.inter}
    assert body["local"] == {"bytes": fit.add_bytes, "add_s": fit.add, "copy_s": fit.copy}
    assert body["lines"]["inter"] == {"alpha_s": 20e-6, "beta_s_per_byte": 1e-9}
    assert body["call"]["validated_s"] == 80e-6
    with pytest.raises(ValueError, match="no machine"):
        reporting.fit_json(fitting.Fit())
