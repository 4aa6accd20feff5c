"""Fixtures the applications' tests share."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from mpi4py import MPI


@pytest.fixture
def shared_dir():
    """A fresh directory every rank of the pass uses (rank 0 makes it and removes it after the test; the fixture is
    collective)."""
    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp(prefix="apps-test-") if comm.Get_rank() == 0 else None, root=0)
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def blocked():
    """A checkpoint directory no rank can create: its parent is a regular file (for root too). Every rank gets
    the same path (rank 0 makes it), so the fixture is collective."""
    comm = MPI.COMM_WORLD
    root = comm.bcast(tempfile.mkdtemp(prefix="apps-blocked-") if comm.Get_rank() == 0 else None, root=0)
    if comm.Get_rank() == 0:
        open(os.path.join(root, "a-file"), "w").close()
    comm.Barrier()
    yield os.path.join(root, "a-file", "ckpt")
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)


def write_docs(comm, directory: str, texts: list[str]) -> list[str]:
    """Rank 0 writes *texts* as doc0.txt, doc1.txt, ... in *directory*; every rank gets their paths (collective)."""
    paths = [os.path.join(directory, f"doc{i}.txt") for i in range(len(texts))]
    if comm.rank == 0:
        for path, text in zip(paths, texts):
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    comm.Barrier()
    return paths
