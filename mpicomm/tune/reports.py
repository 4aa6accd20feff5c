"""Reports of a fitted machine: its values as text (what was not measured marked), a fit's residuals, and JSON.

:func:`describe` is what ``python -m mpicomm.tune --show`` prints; :func:`report`
what a fit prints (the values and, per size, measured against fitted);
:func:`fit_json` the ``results`` of ``--json``.
"""

from __future__ import annotations

import json
from typing import Any

from .. import cli, model
from .fit import Fit

__all__ = ["NOT_MEASURED", "unmeasured", "describe", "report", "fit_json", "machine_json"]


#: The mark :func:`describe` puts after a value tune did not measure.
NOT_MEASURED = "[not measured:"


def unmeasured(machine: model.Machine) -> dict[str, str]:
    """The values of *machine* that were not measured, and what they were taken from: ``{row: reason}``.

    Rows are :func:`describe`'s names (``"inter-node"``, ``"intra mem"``...).
    Read from the machine alone, so a saved fit says it too: on one node the
    inter-node link is a copy of the intra-node link (nothing to measure it
    on); with one rank per node the intra-node link is a copy of the inter-node
    one; a memory-regime value equal to its cache-regime value was not fitted
    separately (no measured size reached 2 × ``cache_bytes``, or too few sizes
    lay below it).
    """
    found: dict[str, str] = {}
    if machine.nodes == 1:
        found["inter-node"] = "one node; the intra-node values"
        found["inter mem"] = "one node; the intra mem values"
    elif machine.ppn == 1:
        found["intra-node"] = "one rank per node; the inter-node values"
        found["intra mem"] = "one rank per node; the inter mem values"
    same = "no size >= 2 x cache; the cache-regime value"
    for row, mem, cached in (("intra mem", machine.intra_mem, machine.intra),
                             ("inter mem", machine.inter_mem, machine.inter),
                             ("gamma mem", machine.gamma_mem, machine.gamma),
                             ("copy mem", machine.copy_mem, machine.copy)):
        if row not in found and (mem is None or mem == cached):
            found[row] = same
    return found


def describe(machine: model.Machine) -> list[str]:
    """The fitted values of *machine* as lines of text; a value tune did not measure ends with
    ``[not measured: what it was taken from]`` (see :func:`unmeasured`)."""
    missing = unmeasured(machine)

    def mark(name: str) -> str:
        return f"  {NOT_MEASURED} {missing[name]}]" if name in missing else ""

    def link(name: str, value: model.Link) -> str:
        bandwidth = f"{1 / value.beta / 1e9:8.2f} GB/s" if value.beta > 0 else "       - GB/s"
        return (f"  {name:<11} alpha {value.alpha * 1e6:8.2f} {cli.US}   beta {value.beta * 1e9:8.4f} ns/B  "
                f"({bandwidth}){mark(name)}")

    def rate(value: float) -> str:
        return f"{1 / value / 1e9:.2f} GB/s" if value > 0 else "-"

    gamma_mem = machine.gamma if machine.gamma_mem is None else machine.gamma_mem
    copy_mem = machine.copy if machine.copy_mem is None else machine.copy_mem
    return [
        link("intra-node", machine.intra),
        link("inter-node", machine.inter),
        f"  gamma       {machine.gamma * 1e9:8.4f} ns/B reduced ({rate(machine.gamma)})",
        f"  copy        {machine.copy * 1e9:8.4f} ns/B copied ({rate(machine.copy)})",
        f"  cache       {machine.cache_bytes} B: messages above it pay the memory regime:",
        link("intra mem", machine.intra_mem or machine.intra),
        link("inter mem", machine.inter_mem or machine.inter),
        f"  gamma mem   {gamma_mem * 1e9:8.4f} ns/B reduced ({rate(gamma_mem)}){mark('gamma mem')}",
        f"  copy mem    {copy_mem * 1e9:8.4f} ns/B copied ({rate(copy_mem)}){mark('copy mem')}",
        f"  overhead    {machine.overhead * 1e6:8.2f} {cli.US} per collective call (validation off)",
        f"  validation  {machine.validation * 1e6:8.2f} {cli.US} more per call with validation on",
        f"  layout      {machine.nodes} node(s), up to {machine.ppn} ranks per node; host {machine.host}; "
        f"fitted {machine.created or '-'}",
    ]


def report(fit: Fit) -> str:
    """The fit and its residuals (measured vs fitted per size) as text."""
    m = fit.machine
    if m is None:
        raise ValueError("report: this Fit has no machine yet; run measure() first")
    lines = [f"mpicomm.tune: {fit.p} ranks on {m.nodes} node(s), up to {m.ppn} per node (layout {fit.layout}), "
             f"host {m.host}"]
    if fit.inter is None:
        lines.append("one node: the inter-node link is taken to be the intra-node link (no second node to measure)")
    lines += ["", "fit:"] + describe(m)
    if fit.cache_source:
        lines.append(f"  (cache threshold from the {fit.cache_source})")

    def line(name: str, size: int) -> tuple[float, float]:
        """The fitted line of *name* that a message of *size* bytes pays (the model's regime switch)."""
        if size > m.cache_bytes and name + "_mem" in fit.lines:
            return fit.lines[name + "_mem"]
        return fit.lines[name]

    def residual(measured: float, fitted: float) -> str:
        return f"{measured * 1e6:12.2f} {fitted * 1e6:12.2f} {100 * (fitted - measured) / measured:+7.1f}%"

    paths = [("intra", fit.intra)] + ([("inter", fit.inter)] if fit.inter is not None else [])
    header = f"{'size (B)':>10}" + "".join(f" {name + f' meas ({cli.US})':>12} {f'fit ({cli.US})':>12} {'error':>8}"
                                           for name, _ in paths)
    lines += ["", "ping-pong, one way (fit: alpha + beta * size, beta of the size's regime):", header]
    for i, size in enumerate(fit.sizes):
        row = f"{size:>10}"
        for name, times in paths:
            alpha, beta = line(name, size)
            row += " " + residual(times[i], alpha + beta * size)
        lines.append(row)
    lines += ["", "local work per call (fit: intercept + slope * bytes; the slopes are gamma and copy):",
              f"{'bytes':>10} {f'add meas ({cli.US})':>12} {f'fit ({cli.US})':>12} {'error':>8} {'copy meas':>12} "
              f"{f'fit ({cli.US})':>12} {'error':>8}"]
    for i, nbytes in enumerate(fit.add_bytes):
        ga, gb = line("gamma", nbytes)
        ca, cb = line("copy", nbytes)
        lines.append(f"{nbytes:>10} {residual(fit.add[i], ga + gb * nbytes)} {residual(fit.copy[i], ca + cb * nbytes)}")
    us = cli.US
    lines += ["", f"call overhead: 8-byte Allreduce on COMM_SELF {fit.call_seconds * 1e6:.2f} {us} - 8-byte copy "
                  f"{fit.small_copy * 1e6:.2f} {us}; on all ranks {fit.validated * 1e6:.2f} {us} validated, "
                  f"{fit.unvalidated * 1e6:.2f} {us} not"]
    return "\n".join(lines)


def machine_json(machine: model.Machine) -> dict[str, Any]:
    """*machine* as the model file holds it, and what was not measured (``not_measured``: row → reason)."""
    body = json.loads(machine.to_json())
    return {"machine": body, "not_measured": unmeasured(machine)}


def fit_json(fit: Fit) -> dict[str, Any]:
    """What a fit measured and fitted, as plain JSON: the ``results`` of ``--json`` (seconds and bytes)."""
    if fit.machine is None:
        raise ValueError("fit_json: this Fit has no machine yet; run measure() first")
    return {
        "layout": fit.layout, "p": fit.p, **machine_json(fit.machine),
        "lines": {name: {"alpha_s": a, "beta_s_per_byte": b} for name, (a, b) in fit.lines.items()},
        "cache_bytes": fit.cache_bytes, "cache_source": fit.cache_source,
        "pingpong": {"bytes": list(fit.sizes), "intra_s": list(fit.intra),
                     "inter_s": None if fit.inter is None else list(fit.inter)},
        "local": {"bytes": list(fit.add_bytes), "add_s": list(fit.add), "copy_s": list(fit.copy)},
        "call": {"self_allreduce_s": fit.call_seconds, "copy_8_bytes_s": fit.small_copy,
                 "validated_s": fit.validated, "unvalidated_s": fit.unvalidated},
    }
