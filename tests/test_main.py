"""``python -m mpicomm``: the version, and the algorithm table with every registered algorithm."""

from __future__ import annotations

import pytest

import mpicomm
from mpicomm import __main__ as cli
from mpicomm import registry


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"mpicomm {mpicomm.__version__}"


def test_algorithms_lists_every_registered_algorithm_with_its_cost(capsys):
    assert cli.main(["algorithms"]) == 0
    out = capsys.readouterr().out
    for collective, algorithms in registry.table().items():
        for name, algorithm in algorithms.items():
            assert any(line.split()[:2] == [collective, name] and algorithm.cost in line for line in out.splitlines()), (
                f"{collective}/{name} is missing from python -m mpicomm algorithms")
