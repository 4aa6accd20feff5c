"""mpicomm.torch.launch: PyTorch's env:// variables from MPI, keeping what the user set."""

from __future__ import annotations

import socket

import pytest
from mpi4py import MPI

from mpicomm.torch.launch import free_port, set_environment

from .conftest import torch  # noqa: F401 - skips the module without PyTorch

pytestmark = pytest.mark.mpi


def test_fills_rank_world_and_a_common_master():
    env: dict[str, str] = {}
    got = set_environment(env)
    world = MPI.COMM_WORLD
    assert got["RANK"] == str(world.Get_rank()) and got["WORLD_SIZE"] == str(world.Get_size())
    assert int(got["LOCAL_RANK"]) < int(got["LOCAL_WORLD_SIZE"]) <= world.Get_size()
    masters = world.allgather((got["MASTER_ADDR"], got["MASTER_PORT"]))
    assert len(set(masters)) == 1  # every rank meets at the same place
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    one_node = world.allreduce(node.Get_size(), op=MPI.MIN) == world.Get_size()
    node.Free()
    # one node: loopback; several (simulated ones too): rank 0's host name
    assert got["MASTER_ADDR"] == ("127.0.0.1" if one_node else world.bcast(socket.gethostname(), root=0))
    assert 0 < int(got["MASTER_PORT"]) < 65536


def test_keeps_what_is_set():
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "RANK": "0", "WORLD_SIZE": "1"}
    got = set_environment(env)
    assert got["MASTER_PORT"] == "29999" and got["RANK"] == "0" and got["WORLD_SIZE"] == "1"


def test_free_port_is_free():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nobody holds it
