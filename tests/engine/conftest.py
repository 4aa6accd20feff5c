"""Fixtures of the engine's request tests (both test_requests and test_any_some use them)."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from mpicomm.engine.requests import outstanding


@pytest.fixture(autouse=True)
def no_leaked_requests():
    """Every test leaves behind no outstanding request of its own."""
    before = outstanding()
    yield
    leaked = [r for r in outstanding() if r not in before]
    assert not leaked, f"requests left outstanding: {leaked}"


@pytest.fixture
def private():
    """A private duplicate of COMM_WORLD for plain mpi4py traffic (collective: every rank makes it)."""
    d = MPI.COMM_WORLD.Dup()
    yield d
    d.Free()


@pytest.fixture
def fresh(comm):
    """A duplicate of ``comm`` with its own message channel and collective queue, so no stray message of
    another test can match."""
    dup = comm.Dup()
    yield dup
    dup.Free()
