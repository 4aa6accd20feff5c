"""mpicomm.bench: sizes, the nccl-tests and OSU conventions as pure functions, the command line, and the
ping-pong and collective benchmarks end to end at small sizes (with --validate, --json, --plot, --out).

The end-to-end tests start their own MPI jobs (marked ``launches``: the serial pass runs them).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys

import numpy as np
import pytest

from mpicomm import bench
from mpicomm.bench import (
    COLLECTIVES,
    bandwidths,
    bus_factor,
    layout,
    markdown_table,
    mismatch,
    model_bytes,
    nccl_bytes,
    parse_sizes,
    rank_values,
)
from tests import mpirun


def test_sizes():
    assert parse_sizes("8:64") == [8, 16, 32, 64]
    assert parse_sizes("1K:4K") == [1024, 2048, 4096]
    assert parse_sizes("8,100,2M") == [8, 100, 2 << 20]
    assert parse_sizes("64kb") == [65536]


@pytest.mark.parametrize("bad", ["0", "x", "8:4", "-3", "4Q"])
def test_bad_sizes_are_named(bad):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(bad.split(":")[-1] if bad != "8:4" else bad)):
        parse_sizes(bad)  # the message names the bad value


# ---------------------------------------------------------------- conventions as pure functions


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7])
def test_busbw_factors_are_nccl_tests(p):
    assert bus_factor("allreduce", p) == pytest.approx(2 * (p - 1) / p)
    for c in ("reduce_scatter", "allgather", "alltoall", "gather", "scatter"):
        assert bus_factor(c, p) == pytest.approx((p - 1) / p), c
    for c in ("bcast", "reduce", "scan"):
        assert bus_factor(c, p) == 1.0, c
    with pytest.raises(ValueError, match="allreduc.*known: allreduce"):
        bus_factor("allreduc", p)


@pytest.mark.parametrize("p", [2, 3, 5])
def test_algbw_counts_what_nccl_tests_counts(p):
    # allreduce, bcast, reduce: S = count·typesize; the others: S = count·typesize·p (count = one rank's block)
    for c in ("allreduce", "bcast", "reduce", "scan"):
        assert nccl_bytes(c, 1000, 8, p) == 8000
    for c in ("reduce_scatter", "allgather", "alltoall", "gather", "scatter"):
        assert nccl_bytes(c, 1000, 8, p) == 8000 * p
    algbw, busbw = bandwidths("allreduce", 1 << 17, 8, p, 1e-3)  # 1 MiB in 1 ms
    assert algbw == pytest.approx((1 << 20) / 1e-3 / 1e9)
    assert busbw == pytest.approx(algbw * 2 * (p - 1) / p)
    algbw, busbw = bandwidths("allgather", 100, 4, p, 2e-6)
    assert algbw == pytest.approx(400 * p / 2e-6 / 1e9) and busbw == pytest.approx(algbw * (p - 1) / p)
    assert bandwidths("barrier", 0, 8, p, 1e-6) is None
    assert nccl_bytes("barrier", 0, 8, p) == 0


@pytest.mark.parametrize("collective", [c for c in COLLECTIVES if c != "barrier" and not COLLECTIVES[c].neighbors])
@pytest.mark.parametrize("p", [2, 3, 4])
def test_model_bytes_are_the_selections_message_bytes(collective, p):
    from mpicomm.plan.args import Args

    spec = COLLECTIVES[collective]
    for unit in (1, 5, 4096):
        args = Args(spec.registry, dtype=np.dtype(np.float64), count=unit)
        assert model_bytes(collective, unit, 8, p) == args.message_bytes(p), (collective, unit)


@pytest.mark.parametrize("collective", [c for c in COLLECTIVES if COLLECTIVES[c].neighbors])
def test_a_neighbourhood_collective_is_sized_by_one_neighbours_block(collective):
    from mpicomm.plan.args import Args

    spec = COLLECTIVES[collective]
    for p in (1, 2, 5):
        unit, send, recv, size = layout(collective, 4096, p)
        assert (unit, size, recv) == (512, 4096, 1024)  # a block from each of the ring's 2 neighbours, whatever p
        assert send == (1024 if collective == "neighbor_alltoall" else 512)
        assert model_bytes(collective, unit, 8, p) == 4096 and nccl_bytes(collective, unit, 8, p) == 8192
        # a rank's blocks may differ from its neighbours': the selection has no size, so no rule can split on one
        assert Args(spec.registry, dtype=np.dtype(np.float64), count=unit).message_bytes(p) is None


def test_layout_rounds_to_float64_elements_and_reports_osu_size():
    # whole-vector collectives: Size = the vector, rounded down to whole elements, at least one
    assert layout("allreduce", 8, 3) == (1, 1, 1, 8)
    assert layout("allreduce", 100, 3) == (12, 12, 12, 96)
    assert layout("bcast", 3, 2) == (1, 1, 1, 8)
    # per-rank block collectives: Size = one block
    assert layout("allgather", 4096, 3) == (512, 512, 1536, 4096)
    assert layout("alltoall", 64, 3) == (8, 24, 24, 64)
    assert layout("gather", 16, 4) == (2, 2, 8, 16)
    assert layout("scatter", 16, 4) == (2, 8, 2, 16)
    # reduce_scatter: Size = the whole input vector, a whole number of elements per rank
    assert layout("reduce_scatter", 4096, 3) == (170, 510, 170, 4080)
    assert layout("reduce_scatter", 8, 2) == (1, 2, 1, 16)
    assert layout("barrier", 4096, 3) == (0, 0, 0, 0)


def test_rank_values_differ_by_rank_and_index_and_sum_exactly():
    p, n = 3, 5000
    parts = [rank_values(n, r, p, salt=2) for r in range(p)]
    every = np.concatenate(parts)
    assert np.unique(every).size == every.size  # no two (rank, index) pairs share a value
    total = np.sum(parts, axis=0)
    exact = np.array([sum(i * p + r + 2 for r in range(p)) for i in (0, 1, n - 1)], np.float64)
    assert np.array_equal(total[[0, 1, n - 1]], exact)


def test_mismatch_finds_the_first_differing_element():
    want = rank_values(10, 1, 2)
    assert mismatch(want.copy(), want) is None
    got = want.copy()
    got[7] += 1
    assert "1 of 10 elements differ (first at index 7" in mismatch(got, want)
    stale = np.full(10, np.nan)  # a result never written
    assert "10 of 10" in mismatch(stale, want)
    assert "shape" in mismatch(want[:5], want)


def test_validation_flags_the_variant_that_differs():
    # local stand-ins for calls (no MPI): native doubles the data, a wrong variant misplaces one element
    spec = COLLECTIVES["allreduce"]
    send, recv = np.zeros(6), np.zeros(6)
    good_recv, bad_recv = np.zeros(6), np.zeros(6)

    def wrong():
        bad_recv[...] = 2 * send
        bad_recv[[2, 3]] = bad_recv[[3, 2]]

    variants = [
        bench._Variant("native", None, send, recv, lambda: recv.__setitem__(..., 2 * send)),
        bench._Variant("good", "good", send, good_recv, lambda: good_recv.__setitem__(..., 2 * send)),
        bench._Variant("wrong", "wrong", send, bad_recv, wrong),
    ]
    verdicts = bench._validate(spec, variants, rank=1, p=2, salt=3)
    assert verdicts["native"] is None and verdicts["good"] is None
    assert "2 of 6 elements differ (first at index 2" in verdicts["wrong"]


def test_markdown_table_lines_up():
    text = markdown_table(["Size", "Avg Latency(us)"], [["8", "1.50"], ["65536", "120.25"]])
    lines = text.splitlines()
    assert lines[0] == "| Size  | Avg Latency(us) |"
    assert lines[1] == "|:------|----------------:|"
    assert lines[3] == "| 65536 |          120.25 |"


# ---------------------------------------------------------------- the command line (no MPI job)


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
def test_unknown_benchmark_lists_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["allreduc"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'allreduc'" in err
    for name in ("pingpong", "allreduce", "bcast", "alltoall", "reduce_scatter", "barrier"):
        assert f"'{name}'" in err


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
def test_unknown_algorithm_lists_the_registered_ones(capsys):
    import mpicomm

    with pytest.raises(SystemExit) as exc:
        bench.main(["bcast", "--algorithms", "binomial,bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown bcast algorithm(s) 'bogus'" in err
    assert all(name in err for name in mpicomm.algorithms("bcast"))


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
def test_collective_help_names_its_algorithms_and_factors(capsys):
    import mpicomm

    with pytest.raises(SystemExit) as exc:
        bench.main(["allgather", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert all(name in out for name in mpicomm.algorithms("allgather"))
    assert "busbw = algbw * (p-1)/p" in out and "--validate" in out and "--plot" in out


# ---------------------------------------------------------------- end to end, under mpiexec


def _bench(n: int, *argv: str, timeout: float = 120) -> mpirun.Result:
    return mpirun.run(n, [sys.executable, "-m", "mpicomm.bench", *argv], timeout=timeout)


@pytest.mark.launches
def test_pingpong_writes_its_table(tmp_path):
    out, data = tmp_path / "pingpong.md", tmp_path / "pingpong.json"
    result = _bench(2, "pingpong", "--sizes", "8,20000,65536", "--iters", "20", "--window", "8", "--out", str(out),
                    "--json", str(data))
    assert result.returncode == 0, result.stderr
    assert "pingpong [3/3] 65536 B: latency native" in result.stderr  # progress by default, as the collectives'
    assert "OSU" not in result.stderr
    document = json.loads(data.read_text())
    assert document["schema"] == "mpicomm-results" and document["benchmark"] == "pingpong"
    table = [line for line in result.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(r.split("|")[1]) for r in table] == [8, 20000, 65536]
    for line, row in zip(table, document["results"]):
        keys = ("native_us", "native_min_us", "native_max_us", "mpicomm_us", "mpicomm_min_us", "mpicomm_max_us",
                "ratio", "native_MBps", "mpicomm_MBps", "bw_ratio")
        assert [float(v) for v in line.split("|")[2:-1]] == [round(row[k], 2) for k in keys] + [20, 20]
        assert 0 < row["native_min_us"] <= row["native_us"] <= row["native_max_us"]
        assert 0 < row["mpicomm_min_us"] <= row["mpicomm_us"] <= row["mpicomm_max_us"]
        assert row["ratio"] == pytest.approx(row["mpicomm_us"] / row["native_us"])
        assert row["native_MBps"] > 0 and row["mpicomm_MBps"] > 0
        assert row["bw_ratio"] == pytest.approx(row["mpicomm_MBps"] / row["native_MBps"])
        assert row["iterations"] == 20 and row["window"] == 8 and row["windows"] == 20 and row["repeat"] == 1
        # OSU's skip counts, never more than the timed calls: 100 and 10 round trips, 10 and 2 windows
        assert row["warmup"] == (20 if row["size"] <= 8192 else 10)
        assert row["warmup_windows"] == (10 if row["size"] <= 8192 else 2)
    text = out.read_text()
    assert "Command: `mpiexec -n 2 python -m mpicomm.bench pingpong --sizes 8,20000,65536" in text
    assert "| 65536 " in text and "native Avg (µs)" in text and "osu_bw" in text


@pytest.mark.launches
@pytest.mark.parametrize("collective", ["neighbor_allgather", "neighbor_alltoall"])
def test_a_neighbourhood_collective_is_measured_and_checked_on_a_ring(tmp_path, collective):
    data = tmp_path / "rows.json"
    result = _bench(3, collective, "--sizes", "8,4K", "--iters", "4", "--repeat", "1", "--warmup", "1", "--persistent",
                    "--validate",
                    "--json", str(data), "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(data.read_text())["results"]
    names = {"native", "direct", "combined", "auto", "persistent"}
    assert {r["name"] for r in rows} == names and len(rows) == 2 * len(names)
    for r in rows:  # every variant's result equals the library's on every rank
        assert r["validation"] == "Pass" and r["wrong"] == 0, r
    assert {r["chose"] for r in rows if r["name"] == "auto"} == {"direct"}
    assert f"{collective}, 3 ranks" in result.stdout or f"# {collective}" in result.stdout


@pytest.mark.launches
def test_pingpong_osu_format_reads_as_osu_latency_and_osu_bw():
    result = _bench(2, "pingpong", "--sizes", "8,1K", "--iters", "4", "--repeat", "1", "--warmup", "1",
                    "--format", "osu", "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pingpong [" not in result.stderr  # --quiet: no progress lines
    tables = _osu_tables(result.stdout)
    assert [t[0][0] for t in tables] == ["# OSU MPI Latency Test (mpicomm.bench)"] * 2 + \
        ["# OSU MPI Bandwidth Test (mpicomm.bench)"] * 2
    for heads, numbers in tables[:2]:
        assert heads[-1].split()[1:4] == ["Size", "Avg", "Latency(us)"]
        assert [row[0] for row in numbers] == [8, 1024] and all(len(row) == 5 and row[4] == 4 for row in numbers)
    for heads, numbers in tables[2:]:
        assert heads[-1] == "# Size      Bandwidth (MB/s)"
        assert [row[0] for row in numbers] == [8, 1024] and all(len(row) == 2 and row[1] > 0 for row in numbers)


@pytest.mark.launches
def test_pingpong_needs_two_ranks():
    result = _bench(1, "pingpong", "--sizes", "8", timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    message = "python -m mpicomm.bench pingpong: error: pingpong needs at least 2 ranks, got 1: " \
              "mpiexec -n 2 python -m mpicomm.bench pingpong --sizes 8"
    assert result.stderr.count(message) == 1, result.stderr


# Every collective runs at 3 ranks (not a power of two), and allreduce at 2 as well (with the pool, Markdown and a
# plot). The other collectives the issue names at 2 ranks are the slower tier (3 s a job; the algorithms that need a
# power of two run at 2 and 4 ranks in tests/coll, against the library, in every pass).
_RUNS = [(c, n) for c in ("allreduce", "bcast", "allgather", "alltoall", "reduce_scatter") for n in (2, 3)]
_RUNS += [(c, 3) for c in ("reduce", "gather", "scatter", "scan", "barrier")]
_SLOWER = {(c, 2) for c in ("bcast", "allgather", "alltoall", "reduce_scatter")}
_HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@pytest.mark.launches
@pytest.mark.parametrize("collective,n", [
    pytest.param(c, n, id=f"{c}-{n}", marks=[pytest.mark.slow] if (c, n) in _SLOWER else []) for c, n in _RUNS])
def test_collective_validates_every_algorithm(tmp_path, collective, n):
    from mpicomm import registry

    spec = COLLECTIVES[collective]
    sizes = [8, 4096, 65536]
    out = tmp_path / "result.json"
    argv = [collective, "--iters", "4", "--validate", "--json", str(out)]
    if collective != "barrier":  # barrier moves no data: it has no --sizes
        argv += ["--sizes", ",".join(map(str, sizes))]
    extra = collective == "allreduce" and n == 2  # one run also draws, writes Markdown and uses the pool
    if extra:
        argv += ["--pool", "--out", str(tmp_path / "result.md")] + (["--plot", str(tmp_path / "result.png")]
                                                                      if _HAS_MATPLOTLIB else [])
    if collective == "barrier" and _HAS_MATPLOTLIB:  # barrier draws bars
        argv += ["--plot", str(tmp_path / "barrier.png")]
    result = _bench(n, *argv)
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(out.read_text())
    assert document["p"] == n and document["benchmark"] == collective and document["validated"]
    assert document["command"].startswith(f"mpiexec -n {n} python -m mpicomm.bench {collective} --iters 4")
    assert document["schema"] == "mpicomm-results" and document["schema_version"] >= 1
    assert document["versions"]["mpi_library"] and document["machine"] and document["date"]
    rows = document["results"]
    assert document["rows"] == rows  # kept at the top too, for readers written before the results layout

    # every registered algorithm was measured or skipped with a reason; native and auto always run
    skipped = {note.split(" algorithm ")[1].split(":")[0] for note in document["notes"] if note.startswith("skipped")}
    registered = set(registry.algorithms(spec.registry))
    measured = {r["algorithm"] for r in rows} - {None}
    assert measured | skipped == registered | {"auto"} and not measured & skipped
    for name in skipped:
        assert registry.lookup(spec.registry, name).power_of_two or getattr(
            registry.lookup(spec.registry, name), "single_node", False)

    expected_sizes = [0] if collective == "barrier" else list(dict.fromkeys(layout(collective, s, n)[3] for s in sizes))
    assert sorted({r["size"] for r in rows}) == expected_sizes
    pool = extra and "shm" in measured and importlib.util.find_spec("mpicomm.shm") is not None
    for size in expected_sizes:
        here = [r for r in rows if r["size"] == size]
        assert here[0]["name"] == "native" and here[0]["vs_native"] == 1.0
        assert len(here) == len(measured) + 1 + bool(pool)
        for r in here:
            assert r["validation"] == "Pass", r
            # OSU's skip count (100, or 10 above 8 KiB), never more than the 4 timed calls; one measurement
            assert r["iterations"] == 4 and r["warmup"] == 4 and r["repeat"] == 1
            assert 0 < r["min_us"] <= r["avg_us"] <= r["max_us"]
            assert r["type"] == ("none" if collective == "barrier" else "double")
            assert r["redop"] == ("sum" if spec.op else "none") and r["root"] == (0 if spec.root else -1)
            assert r["vs_native"] == pytest.approx(r["avg_us"] / here[0]["avg_us"])
            if collective != "barrier":
                algbw, busbw = bandwidths(collective, r["count"], 8, n, r["avg_us"] * 1e-6)
                assert r["algbw_GBps"] == pytest.approx(algbw) and r["busbw_GBps"] == pytest.approx(busbw)
            if r["algorithm"] is not None and document["model"] is not None:
                assert r["model_us"] > 0 and r["meas_over_model"] == pytest.approx(r["avg_us"] / r["model_us"])
        auto = [r for r in here if r["name"] == "auto"][0]
        assert auto["chose"] in registered and auto["source"]
        if pool:
            assert [r["name"] for r in here].count("shm+pool") == 1
    assert document["overhead"]["overhead_us"] == pytest.approx(
        document["overhead"]["auto_us"] - document["overhead"]["native_us"])
    assert "Python overhead of one" in result.stdout
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    header = [h.strip() for h in table[0].split("|")[1:-1]]
    assert header[:6] == ["Size", "count", "type", "redop", "root", "Algorithm"]
    assert "Avg Latency(µs)" in header and "busbw (GB/s)" in header and "#wrong" in header
    assert len(table) == 1 + len(rows)  # the header, then one line per row (the rule starts with "|:")
    for line, r in zip(table[1:], rows):
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert cells[:5] == [str(r["size"]), str(r["count"]), r["type"], r["redop"], str(r["root"])]
    if collective == "barrier" and _HAS_MATPLOTLIB:
        assert (tmp_path / "barrier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if extra:
        text = (tmp_path / "result.md").read_text()
        assert "Command: `mpiexec -n 2 python -m mpicomm.bench allreduce --iters 4 --validate --json " in text
        assert "--sizes 8,4096,65536" in text and "take turns in 4 rounds per size" in text and "a rank's latency is its mean per call" in text
        assert "Machine: " in text and "| 65536 " in text and "Python overhead of one 8-byte call" in text
        if _HAS_MATPLOTLIB:
            assert (tmp_path / "result.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert "![allreduce latency](result.png)" in text


@pytest.mark.launches
def test_bad_algorithm_name_exits_2_on_every_rank():
    result = _bench(2, "alltoall", "--algorithms", "pairwise,spiral", "--sizes", "8", timeout=60)
    assert result.returncode == 2 and not result.timed_out
    assert result.stderr.count("unknown alltoall algorithm(s) 'spiral'") == 1  # once per job, both ranks exit 2
    import mpicomm

    assert "valid: all, auto, " in result.stderr
    assert all(name in result.stderr for name in mpicomm.algorithms("alltoall"))


# ---------------------------------------------------------------- the package's layers, and timing for tune


@pytest.mark.serial
def test_bench_submodules_import_downward_only():
    import ast
    import os

    order = ["metrics", "backend", "measure", "osu", "plot", "report", "cli"]
    folder = os.path.dirname(bench.__file__)
    for index, name in enumerate(order):
        with open(os.path.join(folder, name + ".py")) as f:
            tree = ast.parse(f.read())
        imported = set()
        for node in ast.walk(tree):  # function-level imports count too
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    imported.add((node.module or "").split(".")[0])
                elif node.module and node.module.startswith("mpicomm.bench"):
                    imported.add(node.module.split(".")[2] if node.module.count(".") > 1 else "__init__")
        allowed = set(order[:index])
        assert imported <= allowed, f"bench/{name}.py imports {sorted(imported - allowed)}, above it"


@pytest.mark.serial
def test_the_package_runs_as_a_module():
    import subprocess

    done = subprocess.run([sys.executable, "-m", "mpicomm.bench", "--help"], capture_output=True, text=True,
                          timeout=60, env=mpirun.clean_env())
    assert done.returncode == 0 and "usage: python -m mpicomm.bench" in done.stdout and "pingpong" in done.stdout


@pytest.mark.mpi
def test_time_algorithms_gives_every_rank_the_medians(comm):
    spec = COLLECTIVES["allgather"]
    rows = bench.time_algorithms(comm, spec, ["ring", "linear", "auto"], [8, 1024, 1000], iters=lambda n: 4,
                                 rounds=3)
    p = comm.size
    assert [r["size"] for r in rows] == [8, 1024, 1000]  # sizes that round alike would be measured once
    assert [r["bytes"] for r in rows] == [model_bytes("allgather", r["count"], 8, p) for r in rows]
    for r in rows:
        assert set(r["us"]) == {"ring", "linear", "auto"} and all(t > 0 for t in r["us"].values())
        assert r["auto"]["algorithm"] in ("bruck", "hierarchical", "linear", "recursive_doubling", "ring", "shm")
    assert comm.allgather(rows) == [rows] * p  # the same numbers everywhere
    barrier = bench.time_algorithms(comm, COLLECTIVES["barrier"], ["native", "dissemination"], [8, 64],
                                    iters=lambda n: 2, rounds=2)
    assert len(barrier) == 1 and barrier[0]["bytes"] is None


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
def test_out_never_replaces_an_existing_report_silently(tmp_path, capsys):
    from mpicomm.bench import cli

    report = tmp_path / "report.md"
    report.write_text("earlier results\n")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["allreduce", "--sizes", "8", "--out", str(report)])
    assert exit_info.value.code == 2
    assert "exists; add --append" in capsys.readouterr().err
    assert report.read_text() == "earlier results\n"


def test_wrong_elements_counts_what_differs_from_native():
    from mpicomm.bench.metrics import wrong_elements

    want = np.arange(6.0)
    got = want.copy()
    assert wrong_elements(got, want) == 0
    got[[1, 4]] = -1
    got[5] = np.nan
    assert wrong_elements(got, want) == 3
    assert wrong_elements(got[:3], want) == 6  # a wrong shape: every element is wrong


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "int64", "int32"])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_rank_values_reduce_exactly_in_every_type_and_op(dtype, op):
    p = 7
    parts = [rank_values(50, r, p, 3, dtype, op) for r in range(p)]
    assert all(part.dtype == np.dtype(dtype) for part in parts)
    assert len({part.tobytes() for part in parts}) == p, "every rank's data differs"
    exact = [part.astype(np.int64) for part in parts]
    reduce = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    forward, backward = parts[0].copy(), parts[-1].copy()
    want = exact[0].copy()
    for k in range(1, p):
        forward = reduce(forward, parts[k]).astype(dtype)
        backward = reduce(backward, parts[p - 1 - k]).astype(dtype)
        want = reduce(want, exact[k])
    assert np.array_equal(forward.astype(np.int64), want) and np.array_equal(backward, forward)


@pytest.mark.launches
def test_dtype_and_op_are_measured_and_validated(tmp_path):
    out = tmp_path / "r.json"
    result = _bench(2, "allreduce", "--sizes", "8,4096", "--iters", "4", "--dtype", "float16", "--op", "max",
                    "--algorithms", "ring,recursive_doubling,auto", "--validate", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {r["count"] for r in rows} == {4, 2048}  # float16: 2 bytes an element
    assert all(r["wrong"] == 0 and r["validation"] == "Pass" for r in rows)
    assert "float16 data, op max" in json.loads(out.read_text())["method"]
    bad = _bench(2, "allgather", "--op", "max")
    assert bad.returncode == 2 and "unrecognized arguments: --op" in bad.stderr


# ---------------------------------------------------------------- OSU / nccl-tests conventions: warm-up, in place,
# ---------------------------------------------------------------- --format osu, --backend, --plot


def _osu_tables(text: str) -> list[tuple[list[str], list[list]]]:
    """Read OSU text as an OSU parse script does: '#' lines are comments, every other line is numbers.

    A table starts at each '# OSU MPI' line; numbers are int where they are whole, the Validation column stays text.
    """
    tables: list[tuple[list[str], list[list]]] = []
    for line in text.splitlines():
        if line.startswith("# OSU MPI"):
            tables.append(([line], []))
        elif line.startswith("#"):
            if tables and not tables[-1][1]:
                tables[-1][0].append(line)
        elif line.strip():
            values = []
            for v in line.split():
                try:
                    values.append(int(v))
                except ValueError:
                    values.append(float(v) if v not in ("Pass", "Fail") else v)
            tables[-1][1].append(values)
    return tables


def test_iterations_and_warmup_are_osus_defaults():
    from mpicomm.bench.metrics import (
        bandwidth_iterations,
        bandwidth_warmup,
        iterations,
        latency_iterations,
        warmup_iterations,
    )

    sizes = (8, 8192, 8193, 1 << 20)
    # OSU's collective benchmarks: 1000 timed and 100 skipped up to 8 KiB, 100 and 10 above
    assert [iterations(n, None) for n in sizes] == [1000, 1000, 100, 100]
    assert [warmup_iterations(n, iterations(n, None)) for n in sizes] == [100, 100, 10, 10]
    # osu_latency: 10000 and 1000 timed, 100 and 10 skipped; osu_bw: 100 and 20 windows, 10 and 2 skipped
    assert [latency_iterations(n, None) for n in sizes] == [10000, 10000, 1000, 1000]
    assert [warmup_iterations(n, latency_iterations(n, None)) for n in sizes] == [100, 100, 10, 10]
    assert [bandwidth_iterations(n, None) for n in sizes] == [100, 100, 20, 20]
    assert [bandwidth_warmup(n, bandwidth_iterations(n, None)) for n in sizes] == [10, 10, 2, 2]
    # --iters replaces the timed counts; the warm-up never exceeds them; --warmup replaces it
    assert iterations(8, 7) == latency_iterations(1 << 20, 7) == bandwidth_iterations(8, 7) == 7
    assert warmup_iterations(8, 50) == 50 and warmup_iterations(1 << 20, 50) == 10 and warmup_iterations(8, 4) == 4
    assert bandwidth_warmup(8, 3) == 3 and bandwidth_warmup(1 << 20, 3) == 2
    assert warmup_iterations(8, 1000, requested=0) == 0 and warmup_iterations(1 << 20, 100, requested=7) == 7
    assert bandwidth_warmup(8, 100, requested=0) == 0


def test_a_variants_time_is_the_median_of_its_measurements(monkeypatch):
    """A measurement's time is its mean per call (its rounds alike); --repeat takes the median of the measurements."""
    from mpicomm.bench import measure

    now = [0.0]
    monkeypatch.setattr(measure.time, "perf_counter", lambda: now[0])

    def costs(steady: list[float]) -> dict:  # µs per call, in call order: warm-up first, then timed calls
        return {"native": iter([3.0] * 16), "steady": iter(steady)}

    def variants(cost: dict) -> list:
        def call(name):
            def run():
                now[0] += next(cost[name]) * 1e-6
            return run
        return [bench._Variant(name, None, None, None, call(name)) for name in ("native", "steady")]

    # one measurement of 10 calls in 5 rounds of 2, after 2 warm-up calls: the rounds' means, then their mean
    one = variants(costs([50.0, 50.0] + [1.0, 1.0, 9.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]))
    rounds = measure._rounds(one, iters=10, rounds=5, barrier=lambda: None, warmup=2)
    assert rounds == {"native": pytest.approx([3.0] * 5), "steady": pytest.approx([1.0, 9.0, 1.0, 1.0, 1.0])}
    one = variants(costs([50.0, 50.0] + [1.0, 1.0, 9.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]))
    assert measure._measure(one, 10, 1, lambda: None, 2) == {"native": pytest.approx(3.0),
                                                             "steady": pytest.approx(2.6)}  # OSU's mean
    # three measurements of 5 calls (warm-up once): means 1, 9 and 1.4, median 1.4 (their mean would be 3.8)
    three = variants(costs([50.0] + [1.0] * 5 + [9.0] * 5 + [1.0, 1.0, 1.0, 1.0, 3.0]))
    assert measure._measure(three, 5, 3, lambda: None, 1) == {"native": pytest.approx(3.0),
                                                              "steady": pytest.approx(1.4)}


def test_nccl_tests_columns():
    from mpicomm.bench.metrics import redop_name, root_of, type_name

    assert [type_name("allreduce", t) for t in ("float64", "float32", "float16", "int64", "int32")] == \
        ["double", "float", "half", "int64", "int32"]
    assert type_name("barrier", "float64") == "none"
    assert redop_name("allreduce", "max") == "max" and redop_name("allgather", "sum") == "none"
    assert root_of("bcast") == 0 and root_of("reduce") == 0 and root_of("allreduce") == -1


# In place, p = 3, rank 1 (rank 0 for the rooted ones, where only the root is in place), 2 elements a block:
# (the call's positional buffers, where the input is written, where the result is read) as index ranges of one buffer.
_IN_PLACE = {
    "allreduce": ("(IN_PLACE, buf[2])", slice(0, 2), slice(0, 2)),
    "scan": ("(IN_PLACE, buf[2])", slice(0, 2), slice(0, 2)),
    "reduce": ("(IN_PLACE, buf[2])", slice(0, 2), slice(0, 2)),
    "alltoall": ("(IN_PLACE, buf[6])", slice(0, 6), slice(0, 6)),
    "reduce_scatter": ("(IN_PLACE, buf[6])", slice(0, 6), slice(0, 2)),
    "allgather": ("(IN_PLACE, buf[6])", slice(2, 4), slice(0, 6)),
    "gather": ("(IN_PLACE, buf[6])", slice(0, 2), slice(0, 6)),
    "scatter": ("(buf[6], IN_PLACE)", slice(0, 6), slice(0, 2)),
}


@pytest.mark.parametrize("collective", sorted(_IN_PLACE))
def test_in_place_buffers_are_mpis_in_place_form(collective):
    from mpi4py import MPI

    from mpicomm.bench.measure import _call_buffers

    spec, p, dtype = COLLECTIVES[collective], 3, np.dtype(np.float64)
    rank = 0 if spec.root else 1
    unit, nsend, nrecv, _ = layout(collective, 16 * (p if spec.size_is_all else 1), p)
    assert unit == 2
    call = _call_buffers(spec, np, dtype, unit, nsend, nrecv, rank, p, "sum", in_place=True)
    buf = next(a for a in call.args if a is not MPI.IN_PLACE)
    shape = "(" + ", ".join("IN_PLACE" if a is MPI.IN_PLACE else f"buf[{a.size}]" for a in call.args) + ")"
    want, data, result = _IN_PLACE[collective]
    assert shape == want

    def where(view: np.ndarray) -> slice:  # the elements of buf that *view* is
        assert np.shares_memory(view, buf)
        start = (view.__array_interface__["data"][0] - buf.__array_interface__["data"][0]) // buf.itemsize
        return slice(start, start + view.size)

    assert where(call.input) == data and where(call.result) == result
    # the input is this rank's data, as out of place
    out = _call_buffers(spec, np, dtype, unit, nsend, nrecv, rank, p, "sum", in_place=False)
    assert np.array_equal(call.input, out.input[: call.input.size] if collective != "allgather" else out.input)
    if spec.root:  # elsewhere than the root the call is the out-of-place one
        other = _call_buffers(spec, np, dtype, unit, nsend, nrecv, 1, p, "sum", in_place=True)
        assert all(a is not MPI.IN_PLACE for a in other.args) and len(other.args) == 2
    with pytest.raises(ValueError, match="no MPI.IN_PLACE form"):
        _call_buffers(COLLECTIVES["bcast"], np, dtype, 1, 1, 1, 0, p, "sum", in_place=True)


def test_in_place_validation_compares_with_native_out_of_place():
    # the reference is native MPI's out-of-place result: an in-place layout that reads the wrong block is caught
    spec = COLLECTIVES["allgather"]
    reference = np.arange(6.0)
    good, bad = np.zeros(6), np.zeros(6)
    variants = [
        bench._Variant("native", None, good[2:4], good, lambda: good.__setitem__(..., reference), True),
        bench._Variant("ring", "ring", bad[2:4], bad, lambda: bad.__setitem__(..., reference[::-1]), True),
    ]
    seen: dict = {}
    verdicts = bench._validate(spec, variants, rank=1, p=3, salt=2, reference=reference, results=seen)
    assert verdicts["native"] is None and "6 of 6 elements differ" in verdicts["ring"]
    assert np.array_equal(seen["native"], reference) and variants[0].key == "native (in-place)"


def test_osu_tables_have_osus_layout():
    from mpicomm.bench.osu import collective_tables

    def row(name, size, avg, in_place=None, chose=None):
        return {"name": name, "size": size, "avg_us": avg, "min_us": avg - 1, "max_us": avg + 1, "iterations": 1000,
                "validation": "Pass", "chose": chose, "in_place": in_place}

    inner = {"avg_us": 3.0, "min_us": 2.5, "max_us": 3.5, "validation": "Pass", "chose": "ring"}
    rows = [row("native", 8, 1.5, inner), row("auto", 8, 12.25, inner, "ring"),
            row("native", 1024, 2.0, inner), row("auto", 1024, 13.0, inner, "ring")]
    lines = collective_tables(COLLECTIVES["allreduce"], rows, "MPI_DOUBLE", True, notes=["Avg bus bandwidth: 1"])
    assert lines[:5] == [
        "# OSU MPI Allreduce Latency Test (mpicomm.bench)",
        "# Algorithm: native MPI",
        "# Datatype: MPI_DOUBLE.",
        "# Size       Avg Latency(us)   Min Latency(us)   Max Latency(us)  Iterations        Validation",
        "8                       1.50              0.50              2.50        1000              Pass",
    ]
    assert lines[7:9] == ["# OSU MPI Allreduce Latency Test (mpicomm.bench)", "# Algorithm: mpicomm auto (chose ring)"]
    assert "# Algorithm: native MPI, in-place" in lines and lines[-1] == "# Avg bus bandwidth: 1"
    tables = _osu_tables("\n".join(lines))
    assert len(tables) == 4  # native, auto; then both in place
    assert tables[2][1] == [[8, 3.0, 2.5, 3.5, 1000, "Pass"], [1024, 3.0, 2.5, 3.5, 1000, "Pass"]]
    barrier = collective_tables(COLLECTIVES["barrier"], [row("native", 0, 20.0)], "none", False, "cupy")
    assert barrier[0] == "# OSU MPI-CUDA Barrier Latency Test (mpicomm.bench)"
    assert barrier[2].startswith("# Avg Latency(us)") and [float(v) for v in barrier[3].split()] == [20, 19, 21, 1000]


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
def test_cupy_backend_without_cupy_is_a_usage_error_naming_the_fix(capsys, monkeypatch):
    from mpicomm import device
    from mpicomm.bench import backend

    monkeypatch.setattr(device, "_cupy_probe", [None])  # as on a machine without CuPy, whatever this one has
    for argv in (["allreduce", "--backend", "cupy"], ["pingpong", "--backend", "cupy"]):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        assert exc.value.code == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "--backend cupy needs CuPy" in err and "pip install cupy-cuda12x" in err and "--backend numpy" in err
    with pytest.raises(ValueError, match="needs CuPy"):
        backend.array_module("cupy")
    monkeypatch.setattr(device, "_cupy_probe", [object()])  # CuPy imports, but no GPU is visible
    monkeypatch.setattr(device, "visible_devices", lambda: 0)
    assert "sees no GPU" in backend.problem("cupy") and "--gpus-per-task" in backend.problem("cupy")
    assert backend.problem("numpy") is None and backend.array_module("numpy") is np


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
def test_pool_does_not_go_with_cupy(capsys, monkeypatch):
    from mpicomm.bench import cli

    monkeypatch.setattr(cli, "problem", lambda backend: None)  # as if CuPy and a GPU were here
    with pytest.raises(SystemExit) as exc:
        cli.main(["allreduce", "--backend", "cupy", "--pool"])
    assert exc.value.code == 2 and "--pool" in capsys.readouterr().err


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
@pytest.mark.parametrize("argv,message", [
    (["allreduce", "--warmup", "-1"], "allreduce: error: --warmup must be >= 0, got -1"),
    (["allreduce", "--iters", "0"], "allreduce: error: --iters must be >= 1, got 0"),
    (["pingpong", "--repeat", "0"], "pingpong: error: --repeat must be >= 1, got 0"),
    (["pingpong", "--window", "0"], "pingpong: error: --window must be >= 1, got 0"),
    (["allreduce", "--rounds", "2"], "allreduce: error: --rounds: renamed --repeat N"),
    (["pingpong", "--progress"], "unrecognized arguments: --progress"),
    (["allreduce", "--format", "nccl"], "invalid choice: 'nccl'"),
    (["allreduce", "--append"], "--append needs --out"),
    (["allreduce", "--sizes", "8:1Q"], "1Q"),
    (["barrier", "--sizes", "8:1M"], "barrier: error: --sizes: barrier moves no data: it has no sizes"),
    (["barrier", "--dtype", "int32"], "barrier: error: --dtype: barrier moves no data"),
    (["bcast", "--inplace"], "bcast: error: --inplace: bcast has no MPI.IN_PLACE form (it is in place by nature)"),
    (["gather", "--pool"], "gather: error: --pool: gather has no shm algorithm"),
    (["allreduce", "--pool", "--algorithms", "ring,auto"], "--algorithms ring,auto leaves out"),
])
def test_bad_options_are_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and "python -m mpicomm.bench" in err.splitlines()[-1], err


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
def test_help_states_the_defaults(capsys):
    with pytest.raises(SystemExit):
        bench.main(["allreduce", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "OSU's collective benchmarks', 1000 up to 8 KiB and 100 above" in out
    assert "OSU's, 100 up to 8 KiB and 10 above, never more than --iters" in out
    assert "report the median of the N means (default: 1, one measurement: its mean, OSU's Avg)" in out
    assert "the variants take turns in 5 rounds of iters/5 calls each" in out
    assert "--inplace" in out and "--backend {numpy,cupy}" in out and "--format {markdown,osu}" in out
    assert "--rounds" not in out and "--progress" not in out
    with pytest.raises(SystemExit):
        bench.main(["pingpong", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "osu_latency's 10000 round trips up to 8 KiB and 1000 above; osu_bw's 100 windows and 20" in out
    assert "--quiet" in out and "--progress" not in out


@pytest.mark.serial
@pytest.mark.skipif(not _HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_plot_draws_bands_and_barrier_bars(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mpicomm.bench import plot

    drawn, close = [], plt.close
    monkeypatch.setattr(plt, "close", drawn.append)  # keep the figures to look at them
    inner = {"avg_us": 4.0, "min_us": 3.0, "max_us": 5.0}
    rows = [{"name": name, "size": size, "avg_us": 2.0 * size, "min_us": size, "max_us": 3.0 * size,
             "in_place": inner, "chose": None} for size in (8, 1024) for name in ("native", "ring", "auto")]
    plot.plot_collective(str(tmp_path / "a.png"), COLLECTIVES["allreduce"], rows, 2, "machine")
    barrier = [{"name": n, "size": 0, "avg_us": 10.0, "min_us": 8.0, "max_us": 13.0, "chose": c}
               for n, c in (("native", None), ("dissemination", None), ("auto", "dissemination"))]
    plot.plot_collective(str(tmp_path / "b.png"), COLLECTIVES["barrier"], barrier, 3, "machine")
    for name in ("a.png", "b.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines_fig, bars_fig = drawn
    ax = lines_fig.axes[0]
    assert len(ax.lines) == 6 and len(ax.collections) == 6  # 3 variants × (out of place, in place), each a band
    legend = ax.get_legend()
    assert legend.get_bbox_to_anchor().x0 >= ax.get_window_extent().x1  # right of the axes, off the data
    assert [t.get_text() for t in legend.get_texts()][-1] == "auto (in-place)"
    bar_ax = bars_fig.axes[0]
    assert len(bar_ax.patches) == 3 and bar_ax.get_yscale() == "linear"  # one bar per algorithm
    assert [t.get_text() for t in bar_ax.get_xticklabels()] == ["native MPI", "dissemination",
                                                               "auto -> dissemination"]
    for fig in drawn:
        close(fig)


@pytest.mark.launches
def test_inplace_warmup_and_osu_format_end_to_end(tmp_path):
    data = tmp_path / "r.json"
    result = _bench(2, "allreduce", "--sizes", "8,1K", "--iters", "4", "--repeat", "1", "--warmup", "3",
                    "--algorithms", "ring,recursive_doubling,auto", "--inplace", "--validate", "--format", "osu",
                    "--json", str(data))
    assert result.returncode == 0, result.stdout + result.stderr
    tables = _osu_tables(result.stdout)
    names = [next(h for h in heads if h.startswith("# Algorithm:")) for heads, _ in tables]
    assert names[:4] == ["# Algorithm: native MPI", "# Algorithm: mpicomm ring",
                         "# Algorithm: mpicomm recursive_doubling"] + [names[3]]
    assert names[3].startswith("# Algorithm: mpicomm auto (chose ")
    assert names[4:] == [n + ", in-place" for n in names[:4]]
    for heads, numbers in tables:
        assert heads[2] == "# Datatype: MPI_DOUBLE."
        assert [row[0] for row in numbers] == [8, 1024]
        for _size, avg, low, high, iterations, verdict in numbers:
            assert 0 < low <= avg <= high and iterations == 4 and verdict == "Pass"
    assert "| Size |" not in result.stdout  # no Markdown table in this format
    rows = json.loads(data.read_text())["results"]
    assert len(rows) == 2 * 4
    for r in rows:
        assert r["warmup"] == 3 and r["wrong"] == 0 and r["validation"] == "Pass"
        inner = r["in_place"]
        assert inner["validation"] == "Pass" and inner["wrong"] == 0 and inner["avg_us"] > 0
        assert inner["min_us"] <= inner["avg_us"] <= inner["max_us"]
        assert inner["busbw_GBps"] == pytest.approx(bandwidths("allreduce", r["count"], 8, 2,
                                                               inner["avg_us"] * 1e-6)[1])


@pytest.mark.launches
def test_inplace_rooted_collective_in_markdown(tmp_path):
    out = tmp_path / "gather.md"
    result = _bench(3, "gather", "--sizes", "8,1K", "--iters", "4", "--repeat", "1", "--inplace", "--validate",
                    "--dtype", "int32", "--algorithms", "linear,auto", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    header = [h.strip() for h in table[0].split("|")[1:-1]]
    assert "in-place Avg Latency(µs)" in header and "in-place #wrong" in header and header[-1] == "Validation"
    for line in table[1:]:
        cells = dict(zip(header, (c.strip() for c in line.split("|")[1:-1])))
        assert cells["type"] == "int32" and cells["redop"] == "none" and cells["root"] == "0"
        assert re.fullmatch(r"\d+(\.\d+)?", cells["in-place Avg Latency(µs)"]), line  # a figure (its rounding untested)
        assert cells["#wrong"] == "0" and cells["in-place #wrong"] == "0" and cells["Validation"] == "Pass"
    assert "in-place Avg Latency(µs)" in out.read_text()


class _DeviceArray(np.ndarray):
    """Host memory standing in for a CuPy array: only the two copies the staged native rows make (get, set)."""

    def get(self, out=None):
        np.copyto(out, self)
        return out

    def set(self, arr):
        np.copyto(self, arr)


class _DeviceModule:
    @staticmethod
    def zeros(n, dtype):
        return np.zeros(n, dtype).view(_DeviceArray)


@pytest.mark.mpi
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_staged_native_rows_copy_out_call_mpi_on_host_and_copy_back(in_place):
    """On an MPI that is not CUDA-aware, a collective's native row runs MPI on host copies of the device buffers
    and writes the result back: the same result as the library's call on host buffers (rank- and index-dependent
    data)."""
    from mpi4py import MPI

    from mpicomm.bench import measure

    world = MPI.COMM_WORLD
    p, rank = world.Get_size(), world.Get_rank()
    spec = COLLECTIVES["allreduce"]
    item = np.dtype(np.float64).itemsize
    unit, nsend, nrecv, _ = measure.layout("allreduce", 40 * item, p, item)
    device = measure._call_buffers(spec, _DeviceModule, np.dtype(np.float64), unit, nsend, nrecv, rank, p, "sum",
                                   in_place)
    assert isinstance(device.result, _DeviceArray)
    staged = measure._staged_native(spec, world, device, np.dtype(np.float64), unit, nsend, nrecv, rank, p, "sum",
                                    in_place)
    host = measure._call_buffers(spec, np, np.dtype(np.float64), unit, nsend, nrecv, rank, p, "sum", in_place)
    world.Allreduce(*host.args, op=MPI.SUM)
    staged()
    assert np.array_equal(np.asarray(device.result), host.result)
    assert np.any(host.result != 0)
