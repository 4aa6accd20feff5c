"""mpicomm.launcher: rank layout from launcher environments, before MPI starts."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from mpicomm.launcher import from_environment, slurm_tasks_per_node


def test_import_does_not_start_mpi():
    code = "import mpicomm, mpicomm.launcher, mpicomm.device, sys; mpicomm.launch_info(); print('mpi4py.MPI' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_no_launcher_is_a_singleton():
    info = from_environment({})
    assert (info.launcher, info.rank, info.size, info.local_rank, info.local_size, info.node, info.nodes) == (
        "none", 0, 1, 0, 1, 0, 1,
    )


@pytest.mark.parametrize(
    "spec, expected",
    [("4", [4]), ("2(x3)", [2, 2, 2]), ("2(x3),1", [2, 2, 2, 1]), ("3,1(x2),5", [3, 1, 1, 5])],
)
def test_slurm_tasks_per_node(spec, expected):
    assert slurm_tasks_per_node(spec) == expected


def test_slurm_task():
    env = {
        "SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        "SLURM_JOB_NUM_NODES": "3", "SLURM_TASKS_PER_NODE": "3(x2),1", "SLURMD_NODENAME": "cn02",
    }
    info = from_environment(env)
    assert (info.launcher, info.rank, info.size, info.local_rank, info.local_size, info.node, info.nodes, info.host) == (
        "slurm", 5, 7, 1, 3, 1, 3, "cn02",
    )


def test_slurm_step_values_win_over_job_values():
    env = {
        "SLURM_PROCID": "1", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1",
        "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NUM_NODES": "1",
    }
    info = from_environment(env)
    assert (info.size, info.local_size, info.nodes) == (2, 2, 1)


def test_openmpi():
    env = {
        "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    info = from_environment(env)
    assert (info.launcher, info.rank, info.size, info.local_rank, info.local_size, info.node) == (
        "openmpi", 3, 4, 1, 2, None,
    )


def test_hydra_inside_slurm_uses_hydra_ranks():
    # hydra starts its proxies with srun: SLURM_PROCID is the proxy (node) index, not the rank.
    env = {
        "PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
        "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
    }
    info = from_environment(env)
    assert (info.launcher, info.rank, info.size, info.local_rank, info.local_size) == ("hydra", 3, 4, 1, 2)
    assert info.node is None  # Slurm's answer belongs to another numbering: not merged


def test_srun_pmi2_merges_slurm_locals():
    env = {
        "PMI_RANK": "2", "PMI_SIZE": "4", "SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
    }
    info = from_environment(env)
    assert (info.launcher, info.rank, info.local_rank, info.local_size, info.node, info.nodes) == (
        "hydra", 2, 0, 2, 1, 2,
    )


def test_torchrun():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}
    info = from_environment(env)
    assert (info.launcher, info.rank, info.size, info.local_rank, info.local_size, info.node, info.nodes) == (
        "torchrun", 5, 8, 1, 4, 1, 2,
    )


def test_a_lone_RANK_variable_is_not_torchrun():
    assert from_environment({"RANK": "3"}).launcher == "none"


@pytest.mark.parametrize("env, name", [({"PMI_RANK": "x", "PMI_SIZE": "2"}, "PMI_RANK"),
                                       ({"SLURM_PROCID": "0", "SLURM_NTASKS": "two"}, "SLURM_NTASKS")])
def test_bad_values_are_named(env, name):
    with pytest.raises(ValueError, match=name):
        from_environment(env)


def test_rank_without_size_is_an_error():
    with pytest.raises(ValueError, match="no world size"):
        from_environment({"PMI_RANK": "0"})


@pytest.mark.mpi
def test_environment_agrees_with_mpi(comm):
    info = from_environment()
    assert info.rank == comm.rank
    assert info.size == comm.size
    if info.local_rank is not None:
        assert info.local_rank == comm.local_rank
    if info.local_size is not None:
        assert info.local_size == comm.local_size
    if info.node is not None:
        assert info.node == comm.node
    if info.nodes is not None:
        assert info.nodes == comm.nodes


# ---------------------------------------------------------------- corrupt or hostile values: errors, never huge lists


@pytest.mark.parametrize("spec", ["1(x2000000000)", "4(x99999999999999999999)", "2(x3)," * 2 + "1(x1048576)"])
def test_huge_slurm_repetition_is_a_value_error_not_a_memory_error(spec):
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "0", "SLURM_NNODES": "2",
           "SLURM_TASKS_PER_NODE": spec}
    with pytest.raises(ValueError, match=r"SLURM_TASKS_PER_NODE='.*' describes \d+ or more nodes.*at most 2 node"):
        from_environment(env)
    with pytest.raises(ValueError, match="at most 1048576 node"):
        slurm_tasks_per_node("1(x2000000000)")


def test_slurm_task_list_is_bounded_by_the_job_node_count_not_expanded():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "3",
           "SLURM_TASKS_PER_NODE": "1,3(x2)"}
    assert from_environment(env).local_size == 3
    env["SLURM_TASKS_PER_NODE"] = "1(x4)"
    with pytest.raises(ValueError, match=r"SLURM_TASKS_PER_NODE='1\(x4\)' describes 4 or more nodes"):
        from_environment(env)


@pytest.mark.parametrize("spec", ["2(x0)", "2(x)", "x2", "2(x3", "-1", "2(x-3)", "1(x2)x"])
def test_malformed_slurm_task_lists_name_the_variable_and_the_form(spec):
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": spec}
    with pytest.raises(ValueError, match=r"SLURM_STEP_TASKS_PER_NODE=.*such as '2\(x3\),1'"):
        from_environment(env)


@pytest.mark.parametrize("name, value", [
    ("SLURM_NODEID", "-1"), ("SLURM_PROCID", "-2"), ("SLURM_LOCALID", "-1"), ("SLURM_NTASKS", "0"),
    ("SLURM_NNODES", "0"), ("SLURM_NTASKS", "+4"), ("SLURM_NODEID", "1_0"), ("SLURM_NTASKS", str(2**31)),
])
def test_negative_zero_or_odd_slurm_numbers_are_named_with_what_is_expected(name, value):
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
           "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)"}
    env[name] = value
    with pytest.raises(ValueError, match=rf"{name}='{re.escape(value)}'.*expected a whole number from [01] to 2147483647"):
        from_environment(env)


def test_a_negative_node_id_no_longer_counts_from_the_end():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_NODEID": "-1", "SLURM_NNODES": "2",
           "SLURM_TASKS_PER_NODE": "1,2"}
    with pytest.raises(ValueError, match="SLURM_NODEID='-1'"):
        from_environment(env)


@pytest.mark.parametrize("env, message", [
    ({"PMI_RANK": "4", "PMI_SIZE": "4"}, r"rank 4 \(PMI_RANK='4'\) is not below size 4 \(PMI_SIZE='4'\)"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, r"local_rank 2 \(OMPI_COMM_WORLD_LOCAL_RANK='2'\) is not below local_size 2"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "3", "SLURM_NODEID": "0",
      "SLURM_TASKS_PER_NODE": "2(x2)"}, r"local_rank 3 \(SLURM_LOCALID='3'\) is not below local_size 2 "
                                        r"\(SLURM_TASKS_PER_NODE='2\(x2\)'\)"),
])
def test_a_rank_outside_its_size_is_named(env, message):
    with pytest.raises(ValueError, match=message):
        from_environment(env)


def test_a_lone_non_numeric_RANK_is_not_torchrun_and_not_an_error():
    assert from_environment({"RANK": "worker-3"}).launcher == "none"
