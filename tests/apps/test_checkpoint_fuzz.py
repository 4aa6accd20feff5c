"""apps.checkpoint under a seeded fuzz: damage, edits, forged manifests, planted links, hostile names.

Why: the promises are "a bad checkpoint is refused with the reason" and "nothing
outside the checkpoint directory, and nothing the series did not write, is ever
touched". Each case copies a template directory holding two good checkpoints of
series ``t``, spoils the newest one in one random way, then runs what
applications run: :func:`newest_valid` (with an application check, as the
stencil and sgd do), :func:`read_arrays`, :func:`sweep`, :func:`remove` and
:func:`prune`. Every case must refuse the spoiled checkpoint (a
:class:`CheckpointError` message naming the manifest or the file), fall back to
the older one with its exact arrays, and leave the files outside the directory
(content and mtime) and the directory's foreign files as they were.

The generator is ``random.Random`` with fixed seeds: the same cases every run.
"""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import pytest

from apps import checkpoint as ck
from tests.apps.forge import forge

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it

CASES = 250  # per kind; 7 kinds, and CASES // 4 write cases
SEED = 20261125
ARRAYS = {1: {"a": np.arange(12.0).reshape(3, 4), "b": np.arange(5, dtype=np.int32)},
          2: {"a": np.arange(12.0).reshape(3, 4) * 2, "b": np.arange(5, dtype=np.int32) - 2}}
FOREIGN = ["notes.txt", "other-00000002.bin", "t-x-00000002.bin", "t-00000002.bin.keep"]
NASTY_NAMES = ["{outside}/victim.bin", "../outside/victim.bin", "..", ".", "", "/", "sub/t-00000002.bin",
               "t-00000002.bin/../../outside/victim.bin", "t-00000001.bin", "u-00000002.bin", "t-00000002.bin\0",
               "t-00000002.bin\n", " t-00000002.bin", "t-00000002.../bin", "t-00000002.a/b.bin", "T-00000002.bin",
               "t-00000002.bin.tmp", "t-00000002.json", "\\t-00000002.bin", "t-00000002.\u00e9.bin"]


def _expected(name: str) -> tuple[str, list[int]]:
    a = ARRAYS[1][name]
    return a.dtype.str, list(a.shape)


def app_check(body: dict) -> None:
    """What an application checks on top (stencil, sgd): one file, the arrays it expects, their dtypes and shapes."""
    if len(body["files"]) != 1:
        raise ck.CheckpointError(f"{body['path']}: one data file expected")
    entries = ck.check_entries(body.get("arrays"), body["files"][0]["bytes"], body["path"])
    got = {e["name"]: (e["dtype"], e["shape"]) for e in entries}
    if got != {n: _expected(n) for n in ARRAYS[1]}:
        raise ck.CheckpointError(f"{body['path']}: arrays {got} are not this application's")


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-template")
    d = root / "ckpt"
    d.mkdir()
    for step, arrays in ARRAYS.items():
        record, entries = ck.write_arrays(ck.data_path(str(d), "t", step), arrays)
        ck.save_manifest(ck.manifest_path(str(d), "t", step), step, [record], arrays=entries, note="fuzz")
    for name in FOREIGN:
        (d / name).write_bytes(b"not the series' " + name.encode())
    return root


class Case:
    """One fresh copy of the template, with files outside the checkpoint directory to watch."""

    def __init__(self, template, root) -> None:
        self.root = root
        self.dir = os.path.join(root, "ckpt")
        shutil.copytree(os.path.join(template, "ckpt"), self.dir)
        self.outside = os.path.join(root, "outside")
        os.mkdir(self.outside)
        for name in ("sentinel", "victim.bin", "t-00000002.bin", "t-00000002.json"):
            src = os.path.join(self.dir, name)
            data = open(src, "rb").read() if os.path.exists(src) else b"do not touch " + name.encode()
            with open(os.path.join(self.outside, name), "wb") as f:
                f.write(data)
            os.utime(os.path.join(self.outside, name), ns=(10**18, 10**18))  # any write would move it
        self.before = self._snapshot()
        self.manifest = ck.manifest_path(self.dir, "t", 2)
        self.data = ck.data_path(self.dir, "t", 2)

    def _snapshot(self) -> dict[str, tuple[bytes, int]]:
        seen = {}
        for top, _dirs, files in os.walk(self.root):
            if os.path.abspath(top).startswith(os.path.abspath(self.dir)):
                continue
            for name in files:
                path = os.path.join(top, name)
                seen[path] = (open(path, "rb").read(), os.lstat(path).st_mtime_ns)
        return seen

    def body(self) -> dict:
        return json.load(open(self.manifest))

    def forge(self, body: dict) -> None:
        """A manifest with a right checksum of its own: the edit is only caught by the field checks."""
        forge(self.manifest, body)

    def check(self, what: str) -> None:
        """The spoiled newest checkpoint is refused with a reason; the older loads exactly; nothing else moves."""
        body, refused = ck.newest_valid(self.dir, "t", check=app_check)
        assert body is not None and body["step"] == 1, what
        assert len(refused) == 1 and ("t-00000002" in refused[0] or self.dir in refused[0]), (what, refused)
        got = ck.read_arrays(os.path.join(self.dir, body["files"][0]["file"]), body["arrays"])
        assert all(np.array_equal(got[n], ARRAYS[1][n]) and got[n].dtype == ARRAYS[1][n].dtype for n in ARRAYS[1])
        ck.sweep(self.dir, "t")
        ck.remove(self.dir, "t", 2)
        ck.prune(self.dir, "t", keep=0)
        after = self._snapshot()
        assert after == self.before, f"{what}: files outside the checkpoint directory changed"
        left = sorted(os.listdir(self.dir))
        assert left == sorted(FOREIGN), f"{what}: the directory holds {left}"


def _flip(path: str, rng: random.Random) -> str:
    data = bytearray(open(path, "rb").read())
    i = rng.randrange(len(data))
    bit = 1 << rng.randrange(8)
    data[i] ^= bit
    open(path, "wb").write(bytes(data))
    return f"bit {bit:#x} of byte {i} of {os.path.basename(path)}"


def _truncate(path: str, rng: random.Random) -> str:
    n = rng.randrange(os.path.getsize(path))
    os.truncate(path, n)
    return f"{os.path.basename(path)} cut to {n} bytes"


def _value(rng: random.Random, case: Case):
    return rng.choice([-1, -(2**63), 2**64, 10**30, 0.5, True, False, None, "7", "", [], {}, [1], {"a": 1},
                       rng.randrange(-10**6, 10**6), rng.randrange(1, 200), "x" * rng.randrange(80)])


def _edit(case: Case, rng: random.Random) -> str:
    """One harmful edit of a field of the newest manifest."""
    body = case.body()
    rec, arrays = body["files"][0], body["arrays"]
    entry = rng.choice(arrays)
    kind = rng.randrange(12)
    if kind == 0:
        rec["file"] = rng.choice(NASTY_NAMES).format(outside=case.outside)
    elif kind == 1:
        rec["bytes"] = rng.choice([_value(rng, case), rec["bytes"] + rng.choice([-1, 1, 8, -8])])
    elif kind == 2:
        rec["sha256"] = rng.choice([_value(rng, case), rec["sha256"].upper(), rec["sha256"][:-1], "0" * 64])
    elif kind == 3:
        body["step"] = rng.choice([_value(rng, case), 1, 3, 20000002])
    elif kind == 4:
        entry["dtype"] = rng.choice(["|O", "O", "<f4", "float64", "|V8", "|V0", "<U2", "<i8", ">f8", "<f8", "<i4",
                                     "(2,)<f8", "[('x', '<f8')]", "M8", "<c16", "a", 8, None])
        if entry["dtype"] == _expected(entry["name"])[0]:
            entry["name"] = "c"  # the same dtype: spoil the name instead
    elif kind == 5:
        entry["offset"] = rng.choice([_value(rng, case), entry["offset"] + rng.choice([-8, -1, 1, 4, 8, 96])])
    elif kind == 6:
        entry["shape"] = rng.choice([[4, 3], [12], [3, 4, 1], [-3, -4], [3.0, 4], "3x4", [5, 1], [2**62, 4], [1],
                                     [2, 2, 2, 2, 2, 2, 2]])
        if entry["shape"] == _expected(entry["name"])[1]:
            entry["shape"] = [0]
    elif kind == 7:
        entry["bytes"] = rng.choice([_value(rng, case), entry["bytes"] + 1])
    elif kind == 8:
        entry[rng.choice(["name", "dtype", "shape", "offset", "bytes"])] = _value(rng, case)
        if entry.get("name") == "a" or entry.get("name") == "b":
            entry.pop(rng.choice(["dtype", "shape", "offset", "bytes"]))
    elif kind == 9:
        entry.pop(rng.choice(["name", "dtype", "shape", "offset", "bytes"]))
    elif kind == 10:
        body.pop(rng.choice(["step", "files", "arrays", "format"]))
    else:
        body["files"] = rng.choice([[], [rec, rec], [rec, {**rec, "file": "t-00000002.x.bin"}], rec, "x", None])
    case.forge(body)
    return f"edit {kind}: {json.dumps(body)[:300]}"


def _plant_link(case: Case, rng: random.Random) -> str:
    """The newest manifest or data file replaced by a link (to the same bytes outside, or to the sentinel)."""
    which = rng.choice([case.manifest, case.data])
    target = rng.choice([os.path.join(case.outside, os.path.basename(which)), os.path.join(case.outside, "sentinel"),
                         os.path.join(case.outside, "missing")])
    os.remove(which)
    os.symlink(target, which)
    return f"{os.path.basename(which)} -> {target}"


def _garbage(case: Case, rng: random.Random) -> str:
    text = rng.choice([b"", b"[]", b"null", b"1e999999", b"{" * 10000 + b"}" * 10000, b'{"format": 1}',
                       bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))),
                       json.dumps({**json.load(open(case.manifest)), "step": 2}).encode()[:-rng.randrange(1, 40)]])
    open(case.manifest, "wb").write(text)
    return f"manifest replaced by {text[:40]!r}"


KINDS = {
    "manifest-bit-flip": lambda case, rng: _flip(case.manifest, rng),
    "data-bit-flip": lambda case, rng: _flip(case.data, rng),
    "truncation": lambda case, rng: _truncate(rng.choice([case.manifest, case.data]), rng),
    "forged-field-edit": _edit,
    "forged-field-edit-2": _edit,
    "planted-link": _plant_link,
    "garbage-manifest": _garbage,
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fuzz_refuses_and_touches_nothing_outside(template, tmp_path, kind):
    rng = random.Random(f"{SEED}-{kind}")
    for i in range(CASES):
        case = Case(str(template), str(tmp_path / f"case{i}"))
        what = KINDS[kind](case, rng)
        case.check(f"case {i} ({kind}): {what}")
        shutil.rmtree(case.root)


def test_fuzz_planted_links_are_never_written_through(template, tmp_path):
    """Links planted under every name a new checkpoint could use (old predictable tmp names too): the write
    replaces them or goes around them; the targets outside are unchanged and the new checkpoint is sound."""
    rng = random.Random(f"{SEED}-write")
    for i in range(CASES // 4):
        case = Case(str(template), str(tmp_path / f"case{i}"))
        step = 3 + rng.randrange(3)
        names = [os.path.basename(f(case.dir, "t", step)) for f in (ck.data_path, ck.manifest_path)]
        names = [n + suffix for n in names for suffix in ("", ".tmp", f".tmp{os.getpid()}")]
        for name in rng.sample(names, rng.randrange(1, len(names) + 1)):
            os.symlink(os.path.join(case.outside, rng.choice(["sentinel", "victim.bin"])), os.path.join(case.dir, name))
        record, entries = ck.write_arrays(ck.data_path(case.dir, "t", step), ARRAYS[1])
        ck.save_manifest(ck.manifest_path(case.dir, "t", step), step, [record], arrays=entries)
        body, refused = ck.newest_valid(case.dir, "t", check=app_check)
        assert body["step"] == step and refused == []
        ck.sweep(case.dir, "t")
        ck.prune(case.dir, "t", keep=0)
        assert case._snapshot() == case.before, f"case {i}: a file outside changed"
        assert sorted(os.listdir(case.dir)) == sorted(FOREIGN)
        shutil.rmtree(case.root)
