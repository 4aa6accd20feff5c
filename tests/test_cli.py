"""mpicomm.cli: the command-line conventions every command shares (sizes, times, progress lines, --json, --out).

Pure functions and files: no MPI job (the tests are marked ``serial``, so a
multi-rank run does not repeat them on every rank).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import io
import json
import os
import re
import subprocess
import sys

import pytest

from mpicomm import cli
from tests import mpirun

pytestmark = pytest.mark.serial

# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize("text,expected", [
    ("4096", 4096),
    ("64K", 64 << 10),
    ("64KiB", 64 << 10),
    ("64kb", 64 << 10),
    ("64 KiB", 64 << 10),
    ("64k", 64 << 10),
    ("1M", 1 << 20),
    ("1MiB", 1 << 20),
    ("1.5G", 3 << 29),
    ("2T", 2 << 40),
    ("0.5K", 512),
    ("1e6", 1_000_000),
    ("1E3", 1000),
    ("2.5e3", 2500),
    ("1e+2", 100),
    ("8B", 8),
    (" 16 ", 16),
    (4096, 4096),
])
def test_parse_size_accepts_every_documented_form(text, expected):
    value = cli.parse_size(text)
    assert value == expected and type(value) is int


W_ = "must be a whole number with an optional unit"


@pytest.mark.parametrize("bad,message", [
    ("1.5", "must be a whole number, got '1.5', which is 1.5"),  # 1.5 bytes
    ("0.1K", "must be a whole number, got '0.1K', which is 102.4"),
    ("0", "must be >= 1, got 0"),
    ("-1M", "must be >= 1, got -1M"),  # a negative size meets the same rule
    ("-1", "must be >= 1, got -1"),
    ("x", W_),
    ("", W_),
    ("64Q", W_),
    ("1e6K", W_),  # exponent and unit together: ambiguous (decimal or binary?)
    ("1e-3", W_),
    ("8,16", W_),
    ("8:16", W_),
    (True, W_),
    (False, W_),
    (1.5, W_),
    (None, W_),
    (0, "must be >= 1, got 0"),
    (-4, "must be >= 1, got -4"),
])
def test_parse_size_refuses_stating_the_rule_and_the_value(bad, message):
    with pytest.raises(ValueError) as info:
        cli.parse_size(bad)
    text = str(info.value)
    assert text.startswith("size ")  # names what it parsed
    assert message in text
    assert text.endswith((f"got {bad!r}", f"got {bad}")) or f"got {bad!r}," in text, \
        "the message ends with the offending value (a number as the user wrote it, other text quoted)"
    assert "not a size" not in text  # the rule, not a verdict


def test_parse_size_names_what_and_honours_the_minimum():
    with pytest.raises(ValueError, match=r"^--block must be a whole number with an optional unit .*, got 'x'$"):
        cli.parse_size("x", what="--block")
    assert cli.parse_size("0", minimum=0) == 0
    with pytest.raises(ValueError, match="^size must be >= 8, got 4$"):
        cli.parse_size("4", minimum=8)
    # the accepted forms are listed, so the message says how to fix it
    with pytest.raises(ValueError, match="4096, 64K, 64KiB, 1M, 1.5G, 1e6"):
        cli.parse_size("lots")


@pytest.mark.parametrize("huge", ["1e400", "9" * 400])
def test_parse_size_refuses_numbers_too_large_for_a_float(huge):
    with pytest.raises(ValueError):
        cli.parse_size(huge)


def test_size_arg_is_an_argparse_type_whose_message_is_the_usage_error(capsys):
    parser = argparse.ArgumentParser(prog="prog")
    parser.add_argument("--size", type=cli.size_arg)
    parser.add_argument("--sizes", type=cli.sizes_arg)
    args = parser.parse_args(["--size", "64KiB", "--sizes", "8:32"])
    assert args.size == 65536 and args.sizes == [8, 16, 32]
    with pytest.raises(argparse.ArgumentTypeError, match="^must be a whole number, got '1.5'"):
        cli.size_arg("1.5")
    with pytest.raises(argparse.ArgumentTypeError, match="from the smaller size to the larger"):
        cli.sizes_arg("64:8")
    with pytest.raises(SystemExit):
        parser.parse_args(["--size", "1e6K"])
    err = capsys.readouterr().err
    assert "prog: error: argument --size: must be a whole number with an optional unit" in err and err.rstrip().endswith("'1e6K'")


@pytest.mark.parametrize("text,expected", [
    ("8:64", [8, 16, 32, 64]),
    ("1K:4K", [1024, 2048, 4096]),
    ("8:8", [8]),
    ("8:100", [8, 16, 32, 64]),  # up to the last power of two not above it
    ("1:1M", [1 << i for i in range(21)]),
    ("8,100,4K", [8, 100, 4096]),
    ("4K,8", [4096, 8]),  # a list keeps its order
    ("1e3,64KiB,1.5M", [1000, 65536, 3 << 19]),
    ("64kb", [65536]),
])
def test_parse_sizes_ranges_and_lists(text, expected):
    assert cli.parse_sizes(text) == expected


@pytest.mark.parametrize("bad,message", [
    ("64:8", "sizes must go from the smaller size to the larger (LOW:HIGH), got '64:8'"),
    ("8:x", "sizes must be a whole number with an optional unit"),
    ("8,,16", "sizes must be a whole number with an optional unit"),
    ("8:16:32", "sizes must be a whole number with an optional unit"),
    ("0:8", "sizes must be >= 1, got 0"),
    ("1.5,8", "sizes must be a whole number, got '1.5'"),
])
def test_parse_sizes_refuses(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cli.parse_sizes(bad)


def test_parse_sizes_from_zero_with_minimum_zero():
    assert cli.parse_sizes("0:4", minimum=0) == [0, 1, 2, 4]


# ---------------------------------------------------------------- times and sizes as text


@pytest.mark.parametrize("seconds,text", [
    (1.23e-5, "12.3 µs"),
    (0.0041, "4.10 ms"),
    (2, "2.00 s"),
    (2.0, "2.00 s"),
    (123.4, "123 s"),
    (1e-6, "1.00 µs"),
    (999e-6, "999 µs"),
    (5e-7, "500 ns"),
    (1.5e-9, "1.50 ns"),
    (-0.0041, "-4.10 ms"),
    (float("nan"), "-"),
    (float("inf"), "-"),
])
def test_format_time_three_significant_digits(seconds, text):
    assert cli.format_time(seconds) == text


def test_format_time_writes_microseconds_as_us():
    assert cli.US == "µs"
    assert cli.format_time(3e-6).endswith(" " + cli.US)


@pytest.mark.parametrize("seconds,text", [(0.0009996, "1.00 ms"), (9.9996e-6, "10.0 µs"), (0.99996, "1.00 s")])
def test_format_time_at_a_unit_boundary(seconds, text):
    assert cli.format_time(seconds) == text


@pytest.mark.parametrize("n,text", [
    (0, "0 B"), (1000, "1000 B"), (1024, "1 KiB"), (65536, "64 KiB"), (1536, "1536 B"),
    (1 << 20, "1 MiB"), (3 << 30, "3 GiB"), ((1 << 30) + 1024, "1048577 KiB"),
])
def test_format_size_binary_units_only_when_exact(n, text):
    assert cli.format_size(n) == text


def test_format_size_reads_back_with_parse_size():
    for n in (8, 1000, 4096, 65536, 3 << 20, 5 << 30):
        assert cli.parse_size(cli.format_size(n).replace(" ", "")) == n


# ---------------------------------------------------------------- progress lines

_LINE = re.compile(r"^(?P<label>.+?) \[(?P<i>\d+)/(?P<n>\d+)\](?: (?P<text>.*?))?  elapsed (?P<elapsed>\d+:\d\d)"
                   r"(?:  ETA (?P<eta>\d+:\d\d))?$")


class FakeClock:
    """``time.perf_counter`` under the test's control."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(cli.time, "perf_counter", fake)
    return fake


def test_progress_lines_count_steps_with_elapsed_and_eta(clock):
    out = io.StringIO()
    progress = cli.Progress(4, "allreduce", stream=out)
    clock.now += 10
    progress.step("8 B")
    clock.now += 10
    progress.step("16 B")
    clock.now += 50
    progress.step("32 B", steps=2)
    lines = out.getvalue().splitlines()
    assert lines == [
        "allreduce [1/4] 8 B  elapsed 0:10  ETA 0:30",  # 10 s per step so far, 3 steps left
        "allreduce [2/4] 16 B  elapsed 0:20  ETA 0:20",
        "allreduce [4/4] 32 B  elapsed 1:10",  # done: no ETA
    ]
    for line in lines:
        assert _LINE.match(line), line


def test_progress_clock_shows_hours_and_a_line_without_text(clock):
    out = io.StringIO()
    progress = cli.Progress(2, "tune", stream=out)
    clock.now += 3725  # 1 h 2 min 5 s
    progress.step()
    assert out.getvalue() == "tune [1/2]  elapsed 1:02:05  ETA 1:02:05\n"


def test_progress_note_and_stderr_by_default(clock, capsys):
    progress = cli.Progress(3, "bench")
    progress.note("warming up")
    progress.step("first")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == ["bench: warming up", "bench [1/3] first  elapsed 0:00  ETA 0:00"]


def test_progress_is_silent_when_show_is_false(clock, capsys):
    out = io.StringIO()
    progress = cli.Progress(3, "bench", show=False, stream=out)
    progress.note("nothing")
    progress.step("a")
    progress.step("b")
    assert progress.done == 2  # it still counts
    assert out.getvalue() == ""
    assert capsys.readouterr() == ("", "")


def test_progress_lines_are_flushed_one_by_one(clock):
    class Recorder(io.StringIO):
        flushes = 0

        def flush(self) -> None:
            Recorder.flushes += 1
            super().flush()

    out = Recorder()
    progress = cli.Progress(2, "x", stream=out)
    progress.step()
    progress.step()
    assert Recorder.flushes >= 2


# ---------------------------------------------------------------- --json documents


def test_add_json_adds_the_option():
    parser = argparse.ArgumentParser()
    cli.add_json(parser, "the table")
    assert parser.parse_args([]).json is None
    assert parser.parse_args(["--json", "out.json"]).json == "out.json"
    assert "the table" in parser.format_help()


def test_document_fields_never_replace_the_fixed_keys_and_may_be_named_path(tmp_path):
    with pytest.raises(ValueError, match="schema"):
        cli.document("cmd", [], schema="other")
    with pytest.raises(ValueError, match="results"):
        cli.write_json(str(tmp_path / "x.json"), "cmd", [], results=1)
    cli.write_json(str(tmp_path / "y.json"), "cmd", [], path="saved.json", command_was="x")
    doc = json.loads((tmp_path / "y.json").read_text())
    assert doc["path"] == "saved.json" and doc["command"] == "cmd"


def test_document_carries_schema_command_machine_versions_date_and_results():
    doc = cli.document("python -m mpicomm algorithms --json a.json", [{"a": 1}], benchmark="allreduce", p=2)
    assert doc["schema"] == cli.SCHEMA == "mpicomm-results"
    assert doc["schema_version"] == cli.SCHEMA_VERSION and isinstance(doc["schema_version"], int)
    assert doc["command"] == "python -m mpicomm algorithms --json a.json"
    assert isinstance(doc["machine"], str) and doc["machine"]
    assert isinstance(doc["host"], str)
    versions = doc["versions"]
    import numpy

    import mpicomm

    assert versions["mpicomm"] == mpicomm.__version__ and versions["numpy"] == numpy.__version__
    assert versions["python"].count(".") == 2 and "mpi4py" in versions
    date = datetime.datetime.fromisoformat(doc["date"])
    assert date.utcoffset() == datetime.timedelta(0)
    assert abs((datetime.datetime.now(datetime.timezone.utc) - date).total_seconds()) < 120
    assert doc["benchmark"] == "allreduce" and doc["p"] == 2
    assert doc["results"] == [{"a": 1}]
    assert list(doc)[-1] == "results"  # the fields first, the (long) results last
    json.dumps(doc)  # plain JSON


def test_command_line_quotes_arguments():
    assert cli.command_line("python -m mpicomm.tune", ["--sizes", "8:1M", "--out", "a b.md"]) == (
        "python -m mpicomm.tune --sizes 8:1M --out 'a b.md'")
    assert cli.command_line("prog", []) == "prog"


def test_write_json_writes_a_readable_document_atomically(tmp_path):
    import numpy as np

    path = tmp_path / "out.json"
    results = {"sizes": np.array([8, 16]), "t": np.float64(1.5), "n": np.int64(3), "set": {3, 1, 2},
               "tuple": (1, 2), "path": tmp_path / "x"}
    cli.write_json(str(path), "cmd", results, p=2)
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["schema"] == "mpicomm-results" and doc["command"] == "cmd" and doc["p"] == 2
    assert doc["results"] == {"sizes": [8, 16], "t": 1.5, "n": 3, "set": [1, 2, 3], "tuple": [1, 2],
                              "path": str(tmp_path / "x")}
    assert sorted(os.listdir(tmp_path)) == ["out.json"]  # no temporary left behind

    cli.write_json(str(path), "again", [1])  # replaced whole
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["results"] == [1]
    assert sorted(os.listdir(tmp_path)) == ["out.json"]


def test_write_json_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "out.json"
    cli.write_json(str(path), "first", [1])

    class Unwritable:
        def tolist(self):
            raise RuntimeError("cannot serialize on purpose")

    with pytest.raises(RuntimeError, match="on purpose"):
        cli.write_json(str(path), "second", [Unwritable()])
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["command"] == "first"
    assert sorted(os.listdir(tmp_path)) == ["out.json"]
    with pytest.raises(OSError):
        cli.write_json(str(tmp_path / "missing" / "out.json"), "cmd", [])
    assert sorted(os.listdir(tmp_path)) == ["out.json"]


def test_versions_names_the_mpi_library_once_mpi_has_started():
    from mpi4py import MPI  # the harness has started MPI in this process

    assert MPI.Is_initialized()
    found = cli.versions()
    assert found["mpi_library"] and "\n" not in found["mpi_library"]


def test_versions_does_not_start_mpi():
    program = ("import sys; from mpicomm import cli; v = cli.versions(); m = sys.modules.get('mpi4py.MPI'); "
               "print(bool(m and m.Is_initialized()), 'mpi_library' in v)")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                            env=mpirun.clean_env(), cwd=mpirun.REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


# ---------------------------------------------------------------- --out reports


def out_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prog")
    cli.add_out(parser, "the table")
    return parser


def check(argv: list[str]) -> argparse.Namespace:
    parser = out_parser()
    args = parser.parse_args(argv)
    cli.check_out(parser, args)
    return args


def test_check_out_accepts_a_new_file_and_an_existing_one_with_append_or_force(tmp_path):
    new = tmp_path / "new.md"
    assert check(["--out", str(new)]).out == str(new)
    assert check([]).out is None
    old = tmp_path / "old.md"
    old.write_text("# before\n")
    assert check(["--out", str(old), "--append"]).append
    assert check(["--out", str(old), "--force"]).force
    assert old.read_text() == "# before\n"  # checking writes nothing


@pytest.mark.parametrize("argv,message", [
    (["--out", "{old}"], "exists; add --append to add this report to it, or --force to replace it"),
    (["--append"], "prog: error: --append needs --out FILE.md"),
    (["--force"], "prog: error: --force needs --out FILE.md (the file to replace)"),
    (["--out", "{old}", "--append", "--force"], "choose one"),
    (["--out", "{new}", "--append", "--force"], "choose one"),
])
def test_check_out_refuses(tmp_path, capsys, argv, message):
    old = tmp_path / "old.md"
    old.write_text("# before\n")
    argv = [a.format(old=old, new=tmp_path / "new.md") for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        check(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert old.read_text() == "# before\n"


def test_add_out_help_names_the_rule():
    text = out_parser().format_help()
    assert "--out" in text and "--append" in text and "--force" in text and "the table" in text


def test_check_out_with_a_default_report_follows_the_same_rule(tmp_path, capsys):
    parser = out_parser()
    default = tmp_path / "scaling.md"
    cli.check_out(parser, parser.parse_args(["--force"]), default=str(default))  # --force acts on the default
    default.write_text("# before\n")
    with pytest.raises(SystemExit):
        cli.check_out(parser, parser.parse_args([]), default=str(default))
    assert f"--out {default} exists; add --append" in capsys.readouterr().err
    cli.check_out(parser, parser.parse_args(["--append"]), default=str(default))


def output_parser(out: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prog")
    cli.add_output(parser, "the counts")
    if out:
        cli.add_out(parser)
    return parser


def test_output_is_a_data_file_that_is_replaced_only_with_force(tmp_path, capsys):
    parser = output_parser()
    assert [a.dest for a in parser._actions].count("force") == 1
    new, old = tmp_path / "new.tsv", tmp_path / "old.tsv"
    old.write_text("a\t1\n")
    cli.check_out(parser, parser.parse_args(["--output", str(new)]))
    cli.check_out(parser, parser.parse_args(["--output", str(old), "--force"]))
    for argv, message in ((["--output", str(old)], f"--output {old} exists; add --force to replace it"),
                          (["--force"], "--force needs --output FILE (the file to replace)")):
        with pytest.raises(SystemExit) as info:
            cli.check_out(parser, parser.parse_args(argv))
        assert info.value.code == 2 and f"prog: error: {message}" in capsys.readouterr().err
    assert old.read_text() == "a\t1\n"
    both = output_parser(out=True)  # one --force for both files
    assert [a.dest for a in both._actions].count("force") == 1
    with pytest.raises(SystemExit):
        cli.check_out(both, both.parse_args(["--force"]))
    assert "--force needs --out FILE.md or --output FILE" in capsys.readouterr().err


def test_write_out_writes_or_appends_after_a_blank_line(tmp_path):
    path = tmp_path / "r.md"
    cli.write_out(str(path), "# one")
    assert path.read_text() == "# one\n"
    cli.write_out(str(path), "# two\n", append=True)
    assert path.read_text() == "# one\n\n# two\n"
    cli.write_out(str(path), "# three")
    assert path.read_text() == "# three\n"
    fresh = tmp_path / "fresh.md"
    cli.write_out(str(fresh), "# first", append=True)  # appending to nothing: no leading blank line
    assert fresh.read_text() == "# first\n"


def test_markdown_table_pads_columns_first_left_rest_right():
    text = cli.markdown_table(["Size", "Avg (µs)"], [["8", "1.50"], ["65536", "120.25"]])
    assert text.splitlines() == ["| Size  | Avg (µs) |", "|:------|---------:|", "| 8     |     1.50 |",
                                 "| 65536 |   120.25 |"]
    assert cli.markdown_table(["a", "bb"], []).splitlines() == ["| a | bb |", "|:--|---:|"]


def test_a_renamed_option_is_a_usage_error_naming_the_new_one(capsys):
    parser = argparse.ArgumentParser(prog="prog")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--restart", action="store_true")
    parser.add_argument("--output")
    cli.renamed(parser, "--checkpoint", "--checkpoint-dir")
    cli.renamed(parser, "--resume", "--restart")
    cli.renamed(parser, "--out", "--output", "--out is for Markdown reports")
    assert parser.parse_args(["--output", "x"]).output == "x"
    assert "--resume" not in parser.format_help()  # hidden from --help
    for argv, message in ((["--checkpoint", "ck"], "--checkpoint: renamed --checkpoint-dir"),
                          (["--resume"], "--resume: renamed --restart"),
                          (["--restart", "--resume", "--output", "x"], "--resume: renamed --restart"),
                          (["--out", "x.tsv"], "--out: renamed --output (--out is for Markdown reports)"),
                          (["--out=x.tsv"], "--out: renamed --output")):
        with pytest.raises(SystemExit) as info:
            parser.parse_args(argv)
        assert info.value.code == 2
        assert f"prog: error: {message}" in capsys.readouterr().err


def test_at_least_states_the_rule_and_the_value(capsys):
    parser = argparse.ArgumentParser(prog="prog")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tol", type=float, default=0.5)
    parser.add_argument("--log-every", type=int, default=None)
    cli.at_least(parser, parser.parse_args([]), 1, "--repeat", "--log-every")  # None: not given, not checked
    for argv, option, message in ((["--repeat", "0"], "--repeat", "--repeat must be >= 1, got 0"),
                                  (["--log-every", "-2"], "--log-every", "--log-every must be >= 1, got -2"),
                                  (["--tol", "-0.25"], "--tol", "--tol must be >= 0, got -0.25")):
        with pytest.raises(SystemExit):
            cli.at_least(parser, parser.parse_args(argv), 0 if option == "--tol" else 1, option)
        assert capsys.readouterr().err.rstrip().endswith(f"prog: error: {message}")


def test_add_repeat_says_the_median_is_reported():
    parser = argparse.ArgumentParser(prog="prog")
    cli.add_repeat(parser, 5, "each size's measurement", when="with --collectives")
    action = next(a for a in parser._actions if a.dest == "repeat")
    assert action.default == 5 and action.metavar == "N"
    assert action.help == "with --collectives: run each size's measurement N times and report the median (default: 5)"


def test_subparser_finds_a_sub_command_and_error_line_names_ranks_only_when_several():
    parser = argparse.ArgumentParser(prog="prog")
    sub = parser.add_subparsers(dest="command")
    train = sub.add_parser("train")
    assert cli.subparser(parser, "train") is train and train.prog == "prog train"
    with pytest.raises(KeyError):
        cli.subparser(train, "x")
    assert cli.error_line("prog train", "--batch 3: too small") == "prog train: error: --batch 3: too small"
    assert cli.error_line("prog", "x", 0, 1) == "prog: error: x"  # one process: no "rank 0 of 1"
    assert cli.error_line("prog", "x", 2, 4) == "prog: error: rank 2 of 4: x"


# ---------------------------------------------------------------- a document jobs/collect.py reads


def _collect():
    spec = importlib.util.spec_from_file_location("jobs_collect_cli", os.path.join(mpirun.REPO, "jobs", "collect.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _rows(p: int) -> list[dict]:
    return [{"size": size, "name": name, "algorithm": name if name != "native" else None, "chose": None,
             "avg_us": float(p * size + i)} for size in (8, 1024) for i, name in enumerate(("native", "ring"))]


def test_jobs_collect_reads_documents_with_rows_under_results_or_at_the_top(tmp_path):
    """The bench's ``--json`` may move its rows under ``results`` (a :func:`cli.document`); collect.py reads
    both shapes, and refuses a document of a later schema version."""
    collect = _collect()
    cli.write_json(str(tmp_path / "p2.json"), "mpiexec -n 2 python -m mpicomm.bench allreduce", _rows(2),
                   benchmark="allreduce", p=2, nodes=1)
    with open(tmp_path / "p3.json", "w") as f:  # the older shape: rows at the top, no schema
        json.dump({"benchmark": "allreduce", "p": 3, "nodes": 1, "command": "c3", "machine": "m",
                   "rows": _rows(3)}, f)
    cli.write_json(str(tmp_path / "p4.json"), "c4", {"benchmark": "allreduce", "p": 4, "rows": _rows(4)})
    with open(tmp_path / "trace.json", "w") as f:
        json.dump({"traceEvents": []}, f)
    runs = collect.load([str(tmp_path)])
    assert [r.p for r in runs] == [2, 3, 4]
    assert runs[0].command == "mpiexec -n 2 python -m mpicomm.bench allreduce"
    assert all(r.benchmark == "allreduce" for r in runs)
    for r in runs:
        assert collect.cell(r.rows[1024], "native") == (float(r.p * 1024), "")
        assert collect.cell(r.rows[8], "best") == (float(r.p * 8 + 1), "ring")

    other = cli.document("c5", _rows(5), benchmark="allreduce", p=5)
    other["schema_version"] = cli.SCHEMA_VERSION + 1
    with open(tmp_path / "p5.json", "w") as f:
        json.dump(other, f)
    with pytest.raises(ValueError, match="schema_version"):
        collect.load([str(tmp_path)])


@pytest.mark.serial
def test_run_main_runs_a_command_in_this_process_and_keeps_its_exit(tmp_path):
    argv = sys.argv[:]
    code, out, err = cli.run_main("mpicomm.bench.summary", ["--help"])
    assert code == 0 and "RESULTS.json" in out and sys.argv == argv
    code, out, err = cli.run_main("mpicomm.bench.summary", ["--no-such-option"])
    assert code == 2 and "error:" in err
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('before')\nraise RuntimeError('on purpose ' + sys.argv[1])\n")
    code, out, err = cli.run_main(str(script), ["x"])
    assert (code, out) == (1, "before\n") and "RuntimeError: on purpose x" in err and sys.argv == argv


# ---------------------------------------------------------------- one parser, one error path


def _error_of(parser: argparse.ArgumentParser, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        parser.parse_args(argv)
    assert info.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_parser_states_a_type_rule_as_every_rule_and_takes_negative_sizes_as_values(capsys):
    parser = cli.Parser(prog="prog")
    parser.add_argument("-s", "--size", type=cli.size_arg)
    parser.add_argument("--name")
    assert _error_of(parser, ["--size", "0"], capsys) == "prog: error: --size must be >= 1, got 0"
    assert _error_of(parser, ["--size", "-1M"], capsys) == "prog: error: --size must be >= 1, got -1M"
    assert _error_of(parser, ["--size", "-64KiB"], capsys) == "prog: error: --size must be >= 1, got -64KiB"
    assert _error_of(parser, ["--size", "x"], capsys).startswith("prog: error: --size must be a whole number")
    # argparse's own messages stay as argparse writes them
    assert _error_of(parser, ["--name"], capsys) == "prog: error: argument --name: expected one argument"
    assert parser.parse_args(["--size", "1e3"]).size == 1000


def test_parser_has_version_and_plain_help_and_its_subcommands_are_parsers_too(capsys):
    import mpicomm

    parser = cli.Parser(prog="prog", description="``python -m prog``: see :func:`mpicomm.cli.parse_size`")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run")
    run.add_argument("--size", type=cli.size_arg)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"mpicomm {mpicomm.__version__}"
    text = parser.format_help()
    assert "python -m prog: see mpicomm.cli.parse_size" in text and "``" not in text and ":func:" not in text
    assert isinstance(run, cli.Parser) and "--version" not in run.format_help()
    assert _error_of(parser, ["run", "--size", "-2"], capsys) == "prog run: error: --size must be >= 1, got -2"


def test_refuse_unless_names_the_option_its_value_and_the_mode_it_belongs_to(capsys):
    parser = cli.Parser(prog="prog")
    parser.add_argument("--mode", choices=("a", "b"), default="a")
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--no-overlap", dest="overlap", action="store_false")
    for argv in (["--mode", "b", "--depth", "2"], ["--mode", "a", "--depth", "3"], ["--depth", "3"]):
        args = parser.parse_args(argv)
        cli.refuse_unless(parser, args, args.mode == "a", "--mode a", "--depth")  # its default, or its own mode
    args = parser.parse_args(["--mode", "b", "--depth", "3"])
    with pytest.raises(SystemExit):
        cli.refuse_unless(parser, args, args.mode == "a", "--mode a", "--depth")
    assert capsys.readouterr().err.splitlines()[-1] == \
        "prog: error: --depth 3 applies to --mode a only; drop it or use --mode a"
    args = parser.parse_args(["--mode", "b", "--no-overlap"])
    with pytest.raises(SystemExit):
        cli.refuse_unless(parser, args, args.mode == "a", "--mode a", "--depth", "--no-overlap")
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: --no-overlap applies to --mode a only; drop it "
                                                            "or use --mode a")


def test_a_missing_optional_dependency_names_the_extra_before_any_work(capsys):
    parser = cli.Parser(prog="prog")
    cli.require(parser, "--plot", "json")  # installed: nothing to say
    with pytest.raises(SystemExit) as info:
        cli.require(parser, "--data digits", "sklearn_that_is_not_there", "digits")
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("prog: error: --data digits needs sklearn_that_is_not_there, "
                                                       "which is not installed: pip install -e '.[digits]'")
    if importlib.util.find_spec("matplotlib") is None:  # --plot FILE.png is checked by every Parser
        parser.add_argument("--plot", metavar="FILE.png")
        assert "--plot needs matplotlib, which is not installed: pip install -e '.[plot]'" in \
            _error_of(parser, ["--plot", "x.png"], capsys)


def test_a_misspelt_setting_is_a_usage_error_with_the_hint(monkeypatch, capsys):
    parser = cli.Parser(prog="prog")
    monkeypatch.setenv("MPICOMM_ALLREDUCE_ALGORITHM", "rign")
    assert "MPICOMM_ALLREDUCE_ALGORITHM='rign' is not an algorithm of allreduce (did you mean 'ring'?)" in \
        _error_of(parser, [], capsys)
    monkeypatch.setenv("MPICOMM_ALLREDUCE_ALGORITHM", "ring")
    parser.parse_args([])
    assert cli.did_you_mean("rign", ["ring", "tree"]) == " (did you mean 'ring'?)"
    assert cli.did_you_mean("tornado", ["ring", "tree"]) == ""


def test_launched_ranks_reads_only_a_launchers_own_variables():
    assert cli.launched_ranks({}) == (0, 1)
    assert cli.launched_ranks({"PMI_RANK": "3", "PMI_SIZE": "4"}) == (3, 4)
    assert cli.launched_ranks({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == (1, 2)
    assert cli.launched_ranks({"SLURM_NTASKS": "8", "SLURM_PROCID": "0"}) == (0, 1)  # an allocation, not this process
    assert cli.launched_ranks({"SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "3", "SLURM_PROCID": "2"}) == (2, 3)  # srun's
    # hydra inside an allocation starts its proxies with srun: SLURM_PROCID is a proxy's number, PMI_RANK the rank
    assert cli.launched_ranks({"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"}) \
        == (3, 4)


def test_parse_or_exit_holds_back_what_parsing_printed_until_it_is_decided(capsys, monkeypatch):
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def parse(argv):
        parser = cli.Parser(prog="prog")
        parser.add_argument("--iters", type=int, default=1)
        args = parser.parse_args(argv)
        cli.at_least(parser, args, 0, "--iters")
        return args

    assert cli.parse_or_exit(parse, ["--iters", "3"]).iters == 3
    assert capsys.readouterr() == ("", "")
    with pytest.raises(SystemExit) as info:
        cli.parse_or_exit(parse, ["--iters", "-1"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("prog: error: --iters must be >= 0, got -1") == 1
    with pytest.raises(SystemExit) as info:
        cli.parse_or_exit(parse, ["--help"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("usage: prog")
