"""mpicomm.cleanup and ``python -m mpicomm cleanup``: stale MPICH segments go, segments a live process uses stay.

Most tests work on a directory of their own holding files named like MPICH's
segments, mapped or held open by processes the test starts; two run real MPI
jobs and check their segments in /dev/shm.
"""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import textwrap

import pytest

from mpicomm import cleanup
from tests import mpirun

pytestmark = pytest.mark.serial

SIZE = 2 << 20


def _segment(directory, name: str, size: int = SIZE) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def _holder(path: str, how: str) -> subprocess.Popen:
    """A live process that maps *path* (how="map", then closes the file) or only holds it open (how="open")."""
    code = textwrap.dedent(f"""
        import mmap, os, sys, time
        fd = os.open({path!r}, os.O_RDWR)
        if {how!r} == "map":
            m = mmap.mmap(fd, 0)
            os.close(fd)
        print("holding", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"  # type: ignore[union-attr]
    return proc


def _release(proc: subprocess.Popen) -> None:
    proc.communicate("", timeout=30)


@pytest.fixture
def shm_dir(tmp_path):
    """A directory with: a stale segment, one a live process maps, one it only holds open, and other files."""
    d = tmp_path / "shm"
    d.mkdir()
    paths = {
        "stale": _segment(d, "mpich_shm_1a2b3c4d_0"),
        "stale_vci": _segment(d, "mpich_vci_1a2b3c4d_1", 4096),
        "mapped": _segment(d, "mpich_shm_5e6f7a8b_0"),
        "open": _segment(d, "mpich_shm_99aa_0"),
        "other": _segment(d, "ucx_shm_posix_1234"),  # not MPICH's: never touched
    }
    holders = [_holder(paths["mapped"], "map"), _holder(paths["open"], "open")]
    yield str(d), paths
    for proc in holders:
        _release(proc)


def test_only_segments_no_live_process_uses_are_stale(shm_dir):
    directory, paths = shm_dir
    assert [s.path for s in cleanup.segments(directory)] == sorted(
        paths[k] for k in ("stale", "stale_vci", "mapped", "open"))
    stale = cleanup.stale(directory)
    assert sorted(s.path for s in stale) == sorted([paths["stale"], paths["stale_vci"]])
    assert {s.path: s.bytes for s in stale} == {paths["stale"]: SIZE, paths["stale_vci"]: 4096}
    assert [s.path for s in cleanup.remove(stale)] == [s.path for s in stale]
    assert not os.path.exists(paths["stale"]) and not os.path.exists(paths["stale_vci"])
    for kept in ("mapped", "open", "other"):
        assert os.path.exists(paths[kept]), f"{kept} was removed"


def test_a_segment_mapped_by_this_very_process_is_in_use(tmp_path):
    path = _segment(tmp_path, "mpich_shm_abcdef01_0", 4096)
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
    try:
        assert cleanup.stale(str(tmp_path)) == []
    finally:
        m.close()
    assert [s.path for s in cleanup.stale(str(tmp_path))] == [path]


def test_a_segment_replaced_since_it_was_found_is_not_removed(tmp_path):
    path = _segment(tmp_path, "mpich_shm_0badf00d_0", 4096)
    (found,) = cleanup.stale(str(tmp_path))
    os.rename(path, path + ".old")  # (kept: a freed inode number would be handed out again at once)
    _segment(tmp_path, "mpich_shm_0badf00d_0", 4096)  # a new job's file of the same name
    assert cleanup.remove([found]) == [] and os.path.exists(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a file another user owns")
def test_other_users_segments_are_never_touched(tmp_path):
    path = _segment(tmp_path, "mpich_shm_12345678_0", 4096)
    os.chown(path, 54321, 54321)
    assert cleanup.segments(str(tmp_path)) == [] and cleanup.stale(str(tmp_path)) == []
    assert [s.path for s in cleanup.segments(str(tmp_path), uid=54321)] == [path]


def test_remove_own_segments_unlinks_what_this_process_maps(tmp_path):
    """What an aborting rank does: its own segments go, others' stay; the mapping itself stays usable."""
    code = textwrap.dedent(f"""
        import mmap, os
        from mpicomm.cleanup import remove_own_segments
        paths = [os.path.join({str(tmp_path)!r}, n) for n in ("mpich_shm_00c0ffee_0", "mpich_shm_0000beef_0")]
        for p in paths:
            with open(p, "wb") as f:
                f.truncate(4096)
        with open(paths[0], "r+b") as f:
            m = mmap.mmap(f.fileno(), 0)
        print(remove_own_segments({str(tmp_path)!r}), [os.path.exists(p) for p in paths])
        m[:5] = b"still"
        print(bytes(m[:5]).decode())
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=mpirun.REPO, env=mpirun.clean_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["1 [False, True]", "still"]


# ---------------------------------------------------------------- the command


def _command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpicomm", "cleanup", *args], cwd=mpirun.REPO,
                          env=mpirun.clean_env(), capture_output=True, text=True, timeout=120)


def test_command_dry_run_lists_sizes_and_removes_nothing(shm_dir, tmp_path):
    directory, paths = shm_dir
    out = _command("--dir", directory, "--dry-run")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("would remove") and paths["stale"] in lines[0] and "2.0 MiB" in lines[0]
    assert paths["stale_vci"] in lines[1] and "0.0 MiB" in lines[1]
    assert lines[-1] == (f"would remove 2 stale MPICH segment(s), 2.0 MiB, in {directory}; "
                         f"kept 2 in use by live processes")
    assert all(os.path.exists(p) for p in paths.values())


def test_command_removes_and_writes_json(shm_dir, tmp_path):
    directory, paths = shm_dir
    report = tmp_path / "cleanup.json"
    out = _command("--dir", directory, "--json", str(report))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("removed 2 stale MPICH segment(s), 2.0 MiB")
    assert not os.path.exists(paths["stale"]) and os.path.exists(paths["mapped"]) and os.path.exists(paths["open"])
    doc = json.loads(report.read_text())
    assert doc["schema"] == "mpicomm-results" and doc["command"].startswith("python -m mpicomm cleanup --dir")
    assert sorted(r["path"] for r in doc["results"]) == sorted([paths["stale"], paths["stale_vci"]])
    assert all(r["removed"] and r["bytes"] in (SIZE, 4096) for r in doc["results"])
    assert doc["summary"] == {"directory": directory, "dry_run": False, "stale": 2, "removed": 2,
                              "bytes": SIZE + 4096, "kept_in_use": 2}
    again = _command("--dir", directory)
    assert again.stdout.strip() == f"removed 0 stale MPICH segment(s), 0.0 MiB, in {directory}; kept 2 in use " \
                                   f"by live processes"


def test_command_help_says_what_it_removes():
    out = subprocess.run([sys.executable, "-m", "mpicomm", "--help"], cwd=mpirun.REPO, env=mpirun.clean_env(),
                         capture_output=True, text=True, timeout=60)
    text = " ".join(out.stdout.split())
    assert "cleanup: remove this user's MPICH shared-memory segments" in text
    assert "no live process maps or holds open" in text and "--dry-run" in text


def test_every_job_script_cleans_up_at_exit_without_failing_the_job():
    import glob

    scripts = sorted(glob.glob(os.path.join(mpirun.REPO, "jobs", "*.sbatch")))
    assert scripts
    for path in scripts:
        with open(path) as f:
            text = f.read()
        assert "trap cleanup_shm EXIT" in text, f"{path}: no clean-up at exit"
        assert text.count('-m mpicomm cleanup >&2 || true') == 2, f"{path}: the clean-up may fail the job"


# ---------------------------------------------------------------- real MPICH jobs


@pytest.mark.launches
def test_a_killed_job_leaves_segments_that_cleanup_removes_and_a_live_job_keeps_its_own(tmp_path):
    """A job whose rank 1 dies of SIGKILL leaves its MPICH segment; cleanup removes it, while the segment of a
    job still running beside it stays."""
    report = textwrap.dedent("""
        import json, os, signal, sys, time
        import mpicomm
        comm = mpicomm.Comm()
        with open("/proc/self/maps") as maps:
            mine = sorted({l.split()[5] for l in maps if "/mpich_" in l and len(l.split()) > 5})
        if comm.rank == 0:
            print(json.dumps(mine), flush=True)
        comm.Barrier()
        if sys.argv[1] == "die":
            if comm.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            comm.recv_array(source=1)
        else:
            sys.stdin.read() if comm.rank == 0 else None
            comm.Barrier()
    """)
    script = tmp_path / "segments.py"
    script.write_text(report)
    live = subprocess.Popen(mpirun.command(2, [sys.executable, str(script), "live"]), cwd=mpirun.REPO,
                            env=mpirun.job_env(timeout=120), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        live_segments = json.loads(live.stdout.readline())  # type: ignore[union-attr]
        killed = mpirun.run(2, [sys.executable, str(script), "die"], timeout=60)
        assert killed.returncode != 0 and not killed.timed_out
        dead_segments = json.loads(killed.stdout.splitlines()[0])
        if mpirun.flavor() != "hydra":
            pytest.skip("checks MPICH's segments")
        assert dead_segments and all(os.path.exists(p) for p in dead_segments), "MPICH removed them itself?"
        out = _command()
        assert out.returncode == 0, out.stderr
        assert not any(os.path.exists(p) for p in dead_segments), out.stdout
        assert live_segments and all(os.path.exists(p) for p in live_segments), "a running job's segment was removed"
        live.communicate("", timeout=60)
        assert live.returncode == 0
    finally:
        if live.poll() is None:
            os.killpg(live.pid, 9)  # the job this test started
            live.communicate()
