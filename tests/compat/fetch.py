"""Fetch mpi4py's own test suite - the ``test/`` folder of the source release of the installed mpi4py.

    python -m tests.compat.fetch            # into .cache/mpi4py-<version>/test (what .ci/run does)
    python -m tests.compat.fetch --dest D   # elsewhere

The release is taken from PyPI (its simple index, in its JSON form, names the
file and its SHA-256, which is checked), so the tests are exactly those of the version installed.
Only ``test/`` is extracted. Run at install time, never by a test: the tests
themselves cross no network.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_dest(version: str) -> str:
    """Where the suite of mpi4py *version* lives in this checkout."""
    return os.path.join(REPO, ".cache", f"mpi4py-{version}")


def installed_version() -> str:
    from importlib.metadata import version

    return version("mpi4py")


def fetch(version: str, dest: str, index: str = "https://pypi.org/simple") -> str:
    """Download the sdist of mpi4py *version*, check its SHA-256, extract its ``test/`` into *dest*/test."""
    ask = urllib.request.Request(f"{index}/mpi4py/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(ask, timeout=60) as answer:
        files = json.load(answer)["files"]
    sdists = [f for f in files if f["filename"] == f"mpi4py-{version}.tar.gz"]
    if not sdists:
        raise SystemExit(f"mpi4py {version}: {index} lists no source release mpi4py-{version}.tar.gz")
    sdist = sdists[0]
    with urllib.request.urlopen(sdist["url"], timeout=300) as answer:
        data = answer.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sdist["hashes"]["sha256"]:
        raise SystemExit(f"{sdist['filename']}: SHA-256 {digest} is not the index's {sdist['hashes']['sha256']}")
    tmp = tempfile.mkdtemp(prefix=".mpi4py-", dir=os.path.dirname(os.path.abspath(dest)) or ".")
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            top = f"mpi4py-{version}/test/"
            members = [m for m in tar.getmembers() if m.name.startswith(top) and (m.isfile() or m.isdir())]
            for m in members:
                m.name = os.path.join("test", m.name[len(top):])
            tar.extractall(tmp, members=members, filter="data")
        with open(os.path.join(tmp, "SOURCE"), "w") as f:
            f.write(f"{sdist['filename']} sha256={digest}\n")
        if os.path.exists(dest):
            shutil.rmtree(dest)
        os.replace(tmp, dest)  # whole or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return os.path.join(dest, "test")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat.fetch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=None, help="mpi4py version (default: the installed one)")
    parser.add_argument("--dest", default=None, help="folder (default: .cache/mpi4py-<version>)")
    args = parser.parse_args(argv)
    version = args.version or installed_version()
    dest = args.dest or default_dest(version)
    if os.path.exists(os.path.join(dest, "SOURCE")) and os.path.isdir(os.path.join(dest, "test")):
        print(f"mpi4py {version}'s tests: already in {os.path.relpath(dest)}")
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    where = fetch(version, dest)
    print(f"mpi4py {version}'s tests: {len(os.listdir(where))} files in {os.path.relpath(where)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
