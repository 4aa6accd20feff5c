"""mpicomm.bench.lane: the route table and the lane's effect, at one rank (the tables' shape, not their timings)."""

from __future__ import annotations

import pytest

from mpicomm.bench import lane as bench_lane
from mpicomm.engine import lane


@pytest.mark.serial  # (rank 0 alone measures it)
@pytest.mark.skipif(not lane.available(), reason=f"no compiled lane here: {lane.why_not}")
def test_the_route_table_times_three_ways():
    rows = bench_lane.route(20)
    assert [row[0].split(" ")[0] for row in rows] == ["mpi4py", "ctypes", "the"]
    assert all(float(row[1]) > 0 for row in rows)


@pytest.mark.serial  # under mpiexec only rank 0 prints and writes the report: one process checks it
def test_the_report_has_both_tables(tmp_path, capsys):
    out = tmp_path / "lane.md"
    assert bench_lane.main(["--sizes", "8,1K", "--calls", "10", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    assert "| route" in text and "| bytes | native |" in text.replace("  ", " ").replace("  ", " ")
    assert text.count("×)") == 2 * 4  # two sizes, four variants against native
