"""mpicomm.bench.first_call: calls on arrays not seen before, four ways per collective (the table's shape, and that
its ways run the paths they name - not their timings)."""

from __future__ import annotations

import pytest

from mpicomm.bench import first_call
from mpicomm.front import dispatch


@pytest.mark.serial  # under mpiexec only rank 0 prints and writes the report: one process checks it
def test_the_report_has_a_row_per_collective_and_size(tmp_path, capsys, monkeypatch):
    builds = []
    monkeypatch.setattr(dispatch, "build", lambda *a, _f=dispatch.build, **k: builds.append(1) or _f(*a, **k))
    out = tmp_path / "first.md"
    assert first_call.main(["--collectives", "allreduce,bcast", "--sizes", "8,1K", "--calls", "6",
                            "--out", str(out)]) == 0
    text = out.read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    rows = [line for line in text.splitlines() if line.startswith("| allreduce") or line.startswith("| bcast")]
    assert len(rows) == 4 and all(row.count("×)") == 3 for row in rows)
    # per collective and size, 5 rounds: new arrays compile once (their staged plan), compiled each call 6 times,
    # same arrays once or twice (staged, then their own)
    assert 4 * 5 * (1 + 6 + 1) <= len(builds) <= 4 * 5 * (1 + 6 + 2)
    assert dispatch.STAGE_MOST == 64 * 1024, "the benchmark puts the staging limit back"


def test_an_unknown_collective_is_named():
    with pytest.raises(SystemExit) as exc:
        first_call.main(["--collectives", "allreduce,nope"])
    assert exc.value.code == 2
