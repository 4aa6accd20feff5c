"""Four ranks as two hosts with their own host names and network, launched by hydra without Slurm.

The simulated-node passes (``python -m tests --ranks 2x2``: hydra's ``-launcher
fork -hosts nodeA:2,nodeB:2``) make MPI report two nodes, but every rank still
has the same host name and reaches every other through one kernel's loopback
and shared memory. Here each host is a pair of namespaces this test creates
and removes: a UTS namespace (its own host name) and a network namespace joined
to the others by a veth pair on a bridge, with private addresses that exist
only inside those namespaces. hydra starts its proxies through the ssh
launcher with ``-launcher-exec`` set to a wrapper that enters the host's
namespaces instead of logging in somewhere, and listens on the bridge
(``-localhost``). ``MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp`` makes the PyPI
MPICH send between the hosts over TCP on the veth links (its UCX netmod would
find shared memory, one kernel; and with ``UCX_TLS=tcp,self`` it lost wildcard
receives about one run in three: the rendezvous demo hung), which the test
checks on the links' byte counters.

Across the two hosts it runs: a probe of the topology and of the hierarchical
allreduce, the collectives' correctness suite (tests/coll), and applications.
Needs root, iproute2, nsenter/unshare and MPICH's hydra mpiexec; skipped with
the reason otherwise. Starts its own jobs, so it runs in the serial pass only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import pytest

from tests import mpirun

pytestmark = pytest.mark.launches

REPO = mpirun.REPO
PROBE = os.path.join(REPO, "tests", "jobs", "nodes_probe.py")
SUBNET = "10.199.8"  # .1 the bridge (where mpiexec listens), .2 nodeA, .3 nodeB: only inside the namespaces
HOSTS = ("nodeA", "nodeB")
PREFIX = "mcmn"  # namespace names: mcmn<test pid>-hub, -nodeA, -nodeB

WRAPPER = """#!/bin/sh
# hydra's ssh launcher runs: THIS [-x] HOST COMMAND...; run COMMAND on HOST, i.e. inside HOST's
# network namespace and a new UTS namespace named HOST. COMMAND comes as shell words: sh -c.
[ "$1" = "-x" ] && shift
host=$1
shift
case $host in nodeA|nodeB) ;; *) echo "unknown test host '$host'" >&2; exit 2 ;; esac
exec nsenter --net=/run/netns/{prefix}-$host unshare --uts sh -c "hostname $host && $*"
"""


def _unavailable() -> str | None:
    """Why two namespace hosts cannot be made here (the skip reason), or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "two simulated hosts need root (network and UTS namespaces)"
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    missing = [c for c in ("ip", "nsenter", "unshare") if shutil.which(c, path=path) is None]
    if missing:
        return f"{', '.join(missing)} missing; install: apt-get install iproute2 util-linux"
    if mpirun.flavor() != "hydra":
        return "the launcher wrapper speaks to MPICH's hydra mpiexec (-launcher ssh -launcher-exec); this is Open MPI"
    probe = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"network/UTS namespaces are not available here: {probe.stderr.strip()}"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out


def _remove(namespaces: list[str]) -> None:
    """Remove *namespaces* (made by this test) and whatever still runs in them."""
    for ns in namespaces:
        if not os.path.exists(f"/run/netns/{ns}"):
            continue
        for pid in _ip("netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)  # a proxy or rank this test started
            except (ProcessLookupError, ValueError):
                pass
        for line in _ip("-n", ns, "-o", "link", "show", check=False).stdout.splitlines():
            link = line.split(":")[1].strip().split("@")[0]
            if link != "lo":  # deleting the links lets the namespace go even if something holds it
                _ip("-n", ns, "link", "del", link, check=False)
        _ip("netns", "del", ns, check=False)


def _remove_stale() -> None:
    """Namespaces an earlier run of this test left (it was killed): their test process is gone."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        found = re.fullmatch(rf"{PREFIX}(\d+)-(hub|nodeA|nodeB)", name)
        if found and not os.path.exists(f"/proc/{found[1]}"):
            _remove([name])


@dataclass
class Hosts:
    """Two namespace hosts and how hydra reaches them."""

    hub: str  #: the namespace with the bridge, where mpiexec runs
    namespaces: dict[str, str]  #: host name -> its network namespace
    wrapper: str  #: the -launcher-exec script

    def link_bytes(self, host: str) -> int:
        """Bytes received plus sent on *host*'s network link so far."""
        out = _ip("-n", self.namespaces[host], "-s", "-j", "link", "show", "eth0").stdout
        stats = json.loads(out)[0]["stats64"]
        return int(stats["rx"]["bytes"]) + int(stats["tx"]["bytes"])

    def run(self, argv: list[str], *, timeout: float, env: dict[str, str] | None = None) -> mpirun.Result:
        """4 ranks of *argv*, 2 on each host, launched from the hub; never longer than *timeout* (+15 s)."""
        extra = {**mpirun.NETWORK, "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1", **(env or {})}
        return mpirun.run(4, argv, hosts=",".join(f"{h}:2" for h in HOSTS), launcher="ssh", timeout=timeout,
                          env=extra, launcher_args=["-launcher-exec", self.wrapper, "-localhost", f"{SUBNET}.1"],
                          prefix=["nsenter", f"--net=/run/netns/{self.hub}"])


@pytest.fixture(scope="module")
def hosts():
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    _remove_stale()
    prefix = f"{PREFIX}{os.getpid()}"
    hub = f"{prefix}-hub"
    namespaces = {h: f"{prefix}-{h}" for h in HOSTS}
    made = [hub]
    folder = tempfile.mkdtemp(prefix="mpicomm-hosts-")
    try:
        _ip("netns", "add", hub)
        _ip("-n", hub, "link", "set", "lo", "up")
        _ip("-n", hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", hub, "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
        _ip("-n", hub, "link", "set", "br0", "up")
        for k, (host, ns) in enumerate(namespaces.items(), start=2):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            # Both ends are made inside the namespaces: this machine's own network never sees them.
            _ip("-n", hub, "link", "add", f"v{host}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", hub, "link", "set", f"v{host}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{SUBNET}.{k}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        wrapper = os.path.join(folder, "enter-host.sh")
        with open(wrapper, "w") as f:
            f.write(WRAPPER.replace("{prefix}", prefix))
        os.chmod(wrapper, stat.S_IRWXU)
        yield Hosts(hub, namespaces, wrapper)
    finally:
        _remove(made)
        shutil.rmtree(folder, ignore_errors=True)
        left = [ns for ns in made if os.path.exists(f"/run/netns/{ns}")]
        assert not left, f"namespaces left behind: {left}"


def test_the_skip_reason_names_what_is_missing(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(shutil, "which", lambda command, path=None: None)
    reason = _unavailable()
    assert ("ip, nsenter, unshare missing" in reason) if os.geteuid() == 0 else ("need root" in reason), reason


def _explain(result: mpirun.Result) -> str:
    return f"exit {result.returncode}{' (timed out)' if result.timed_out else ''}\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"


def test_two_hosts_by_name_and_network(hosts):
    before = hosts.link_bytes("nodeA")
    result = hosts.run([sys.executable, PROBE, "--count", "100000"], timeout=120)
    assert result.returncode == 0, _explain(result)
    ranks = json.loads(result.stdout.strip().splitlines()[-1])["ranks"]
    assert [r["host"] for r in ranks] == ["nodeA", "nodeA", "nodeB", "nodeB"]
    assert [r["nodes"] for r in ranks] == [2, 2, 2, 2] and [r["node"] for r in ranks] == [0, 0, 1, 1]
    assert [r["leaders_size"] for r in ranks] == [2, None, 2, None]
    assert all(r["hierarchical_ok"] for r in ranks)
    # The leaders' step of the hierarchical allreduce moved 100000 float64 between the hosts.
    moved = hosts.link_bytes("nodeA") - before
    assert moved >= 800_000, f"only {moved} bytes crossed nodeA's link: traffic did not take the network"


@pytest.mark.slow  # (the 2x2 pass runs every test on simulated nodes over TCP; the Slurm tests cross these hosts)
def test_collective_suite_across_two_hosts(hosts, tmp_path):
    logs = tmp_path / "rank-logs"
    logs.mkdir()
    argv = [sys.executable, "-m", "mpi4py", "-m", "pytest", "--with-mpi", "-p", "no:randomly", "-x", "-q",
            os.path.join(REPO, "tests", "coll")]
    result = hosts.run(argv, timeout=600, env={"MPICOMM_TEST_LOG_DIR": str(logs)})
    if result.returncode != 0:
        tails = [f"---- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
                 for p in sorted(logs.glob("rank*.log"))]
        raise AssertionError(_explain(result) + "\n" + "\n".join(tails))
    assert re.search(r"\d+ passed", result.stdout) and " failed" not in result.stdout, result.stdout[-3000:]


def test_stencil_across_two_hosts(hosts):
    result = hosts.run([sys.executable, "-m", "apps.stencil", "--size", "256", "--iters", "50"], timeout=180)
    assert result.returncode == 0, _explain(result)
    assert re.search(r"verification\s+PASS", result.stdout), result.stdout


@pytest.fixture(scope="module")
def demo(hosts) -> mpirun.Result:
    """apps.demo across the two hosts, run once for the tests below."""
    return hosts.run([sys.executable, "-m", "apps.demo", "--count", "10000", "--iters", "10"], timeout=180)


def test_demo_reports_both_hosts(demo):
    assert "mpicomm demo: 4 ranks on 2 node(s)" in demo.stdout, _explain(demo)
    table = re.findall(r"^ +(\d) +(\d)/2 +(\d) +(node[AB]) ", demo.stdout, re.M)
    assert table == [("0", "0", "0", "nodeA"), ("1", "1", "0", "nodeA"), ("2", "0", "1", "nodeB"),
                     ("3", "1", "1", "nodeB")], demo.stdout


def test_demo_passes_across_two_hosts(demo):
    assert demo.returncode == 0 and "all checks passed" in demo.stdout, _explain(demo)
