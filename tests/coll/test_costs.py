"""Each cost function's docstring states the formula its body computes (the one place it is written in words).

The docstring's formula (:attr:`mpicomm.registry.Algorithm.cost`) is read as
arithmetic (α β γ δ, n, p, ``lg p``, ``lg p'``, ``⌈lg p⌉``, N = n·p, implicit
products as written: ``2n(p−1)/p·β``) and evaluated at powers of two (so the
terms it gives for folding a non-power-of-two p, after ``;``, do not apply),
against the function on the same machine. Formulas that name quantities of the
implementation rather than of the call - compositions (``T(bcast, …)``),
segment and chunk counts (``S``, ``c``) - are left out, and named.
"""

from __future__ import annotations

import math
import re

import pytest

from mpicomm import model, registry
from mpicomm.catalogue import COLLECTIVES, family

MACHINE = model.Machine(intra=model.Link(2e-6, 1e-9), inter=model.Link(2e-6, 1e-9), gamma=0.5e-9, copy=0.25e-9,
                        overhead=0.0, validation=0.0, ppn=64, nodes=1, host="test", created="")
_SYMBOLS = (("⌈lg p⌉", "L"), ("lg p'", "L"), ("lg p", "L"), ("p'", "p"), ("−", "-"), ("·", "*"), ("×", "*"),
            ("α", "a"), ("β", "b"), ("γ", "g"), ("δ", "d"), ("N", "(n*p)"))
_NOT_ARITHMETIC = ("T_", "T(", "S", "c", "min")  # compositions, segments, chunks: quantities of the implementation


def formula(stated: str) -> str:
    """The stated formula for a power-of-two p: before its remark (two spaces), fold terms (``;``), extras."""
    return re.split(r"  \(|; |, \+|, plus", stated)[0].strip()


def as_python(text: str) -> str:
    """The formula as a Python expression of a, b, g, d (α β γ δ), n, p and L (lg p)."""
    for symbol, name in _SYMBOLS:
        text = text.replace(symbol, name)
    out = ""
    for ch in text.replace(" ", ""):
        if out and (ch.isalpha() or ch == "(") and (out[-1].isalnum() or out[-1] == ")"):
            out += "*"  # an implicit product: 2n, (p-1)a, nb
        out += ch
    return out


def _cases() -> list[tuple[str, str]]:
    cases = []
    families = set()
    for collective in COLLECTIVES:
        if family(collective) in families or (family(collective) != collective and family(collective) in COLLECTIVES):
            continue  # the v-forms share the family's function, or add a term after ", +" (own family: its first)
        families.add(family(collective))
        for name in registry.algorithms(collective):
            cases.append((collective, name))
    return cases


def test_the_translation_reads_the_notation():
    assert as_python("2(p−1)·α + 2n(p−1)/p·β + n(p−1)/p·γ") == "2*(p-1)*a+2*n*(p-1)/p*b+n*(p-1)/p*g"
    assert as_python("⌈lg p⌉(α + nβ + nγ)") == "L*(a+n*b+n*g)"
    assert formula("lg p·α + N(p−1)/p·β  (N = n·p)") == "lg p·α + N(p−1)/p·β"


@pytest.mark.parametrize("collective,name", _cases())
def test_the_docstring_and_the_cost_function_agree(collective, name):
    algorithm = registry.lookup(collective, name)
    text = formula(algorithm.cost)
    if name == "native" or any(token in text for token in _NOT_ARITHMETIC):
        pytest.skip(f"{collective}/{name}: the formula names quantities of the implementation ({text})")
    expression = as_python(text)
    for p in (2, 4, 8):
        for n in (1024.0, float(1 << 20)):
            values = dict(a=MACHINE.intra.alpha, b=MACHINE.intra.beta, g=MACHINE.gamma, d=MACHINE.copy, n=n, p=p,
                          L=math.log2(p))
            stated = eval(expression, {"__builtins__": {}}, values)  # noqa: S307 - our own docstrings
            coded = registry.communication(collective, name, n, p, MACHINE)
            assert coded == pytest.approx(stated, rel=1e-9), (
                f"{collective}/{name} at p={p}, n={n:g}: the docstring says {text} = {stated:.4g} s, "
                f"the cost function {coded:.4g} s")
