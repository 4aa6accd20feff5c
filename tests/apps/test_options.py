"""apps.options and apps.report: the options every application shares, and its --json document's command."""

from __future__ import annotations

import argparse

import pytest

from apps import options, report

pytestmark = pytest.mark.serial


def _parser(**kw) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prog")
    options.add_checkpoint_options(parser, "myapp", **kw)
    return parser


def test_checkpoint_options_and_their_defaults():
    args = _parser().parse_args([])
    assert (args.checkpoint_every, args.checkpoint_dir, args.keep, args.restart) == (0, "checkpoints/myapp", 2, False)
    args = _parser().parse_args(["--checkpoint-every", "5", "--checkpoint-dir", "ck", "--keep", "3", "--restart"])
    assert (args.checkpoint_every, args.checkpoint_dir, args.keep, args.restart) == (5, "ck", 3, True)
    text = " ".join(_parser(unit="iterations").format_help().split())
    assert "write a checkpoint every K iterations and at the end (default: 0, never)" in text
    assert "(default: checkpoints/myapp)" in text and "the newest (default: 2)" in text
    assert "--keep" not in _parser(keep=False).format_help()
    assert options.checkpoint_dir("stencil") == "checkpoints/stencil" != options.checkpoint_dir("sgd")


@pytest.mark.parametrize("argv,message", [
    (["--checkpoint-every", "-1"], "--checkpoint-every must be >= 0, got -1"),
    (["--keep", "0"], "--keep must be >= 1, got 0"),
    (["--checkpoint-dir", "", "--restart"], "--checkpoint-dir must name a directory, got ''"),
    (["--checkpoint-dir", "ck"], "--checkpoint-dir applies to a run that checkpoints (--checkpoint-every K) or "
                                 "restarts (--restart); add one, or drop --checkpoint-dir"),
    (["--keep", "3"], "--keep applies to a run that checkpoints"),
])
def test_checkpoint_options_are_checked(capsys, argv, message):
    parser = _parser()
    with pytest.raises(SystemExit) as info:
        options.check_checkpoint_options(parser, parser.parse_args(argv))
    assert info.value.code == 2 and f"prog: error: {message}" in capsys.readouterr().err


def test_checkpoint_options_that_apply_are_accepted():
    parser = _parser()
    for argv in ([], ["--checkpoint-every", "2", "--checkpoint-dir", "ck", "--keep", "1"],
                 ["--restart", "--checkpoint-dir", "ck"], ["--checkpoint-dir", "checkpoints/myapp"]):
        options.check_checkpoint_options(parser, parser.parse_args(argv))
    no_keep = _parser(keep=False)
    options.check_checkpoint_options(no_keep, no_keep.parse_args(["--checkpoint-every", "1"]))


def test_hidden_widths_one_form_everywhere():
    assert options.hidden_widths("128") == (128,)
    assert options.hidden_widths("256,64,8") == (256, 64, 8)
    for bad in ("", "64,x", "64,", "0", "64,-1"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"got {bad!r}"):
            options.hidden_widths(bad)
    assert options.hidden_width("96") == 96 and options.hidden_width("96,96") == 96
    with pytest.raises(argparse.ArgumentTypeError, match="must be one width"):
        options.hidden_width("96,48")


def test_parse_or_exit_passes_the_result_and_a_usage_error_exits_with_its_status():
    assert options.parse_or_exit(lambda argv: ("parsed", argv), ["x"]) == ("parsed", ["x"])

    def refuse(argv):
        raise SystemExit(2)

    with pytest.raises(SystemExit) as info:
        options.parse_or_exit(refuse, [])
    assert info.value.code == 2


def test_the_json_report_command_repeats_the_run(monkeypatch):
    assert report.command("python -m apps.x", ["--size", "8K", "a b"], 4) == \
        "mpiexec -n 4 python -m apps.x --size 8K 'a b'"
    assert report.command("python -m apps.x", [], 2, {"OMP_NUM_THREADS": "1", "MPICOMM_TRACE": "t 1.json"}) == \
        "OMP_NUM_THREADS=1 MPICOMM_TRACE='t 1.json' mpiexec -n 2 python -m apps.x"
    monkeypatch.setenv("MPICOMM_ALLREDUCE_ALGORITHM", "ring")
    monkeypatch.setenv("MPICOMM_TEST_SOMETHING", "1")
    monkeypatch.setenv("UNRELATED", "1")
    found = report.environment()
    assert found["MPICOMM_ALLREDUCE_ALGORITHM"] == "ring"
    assert "MPICOMM_TEST_SOMETHING" not in found and "UNRELATED" not in found


def test_write_json_is_a_document_with_the_command_and_ranks(tmp_path):
    import json

    path = tmp_path / "r.json"
    report.write_json(str(path), "python -m apps.x", ["--iters", "3"], 3, {"value": 7}, settings={"OMP_NUM_THREADS": "1"},
                      extra="field")
    doc = json.loads(path.read_text())
    assert doc["command"] == "OMP_NUM_THREADS=1 mpiexec -n 3 python -m apps.x --iters 3"
    assert doc["ranks"] == 3 and doc["extra"] == "field" and doc["results"] == {"value": 7}
