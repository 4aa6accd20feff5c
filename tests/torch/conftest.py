"""The torch backend's tests: PyTorch or a skip with the reason; one mpicomm default group and a gloo group."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install torch==2.13.0 (the CPU wheel), "
                                            "then pip install -e '.[torch]'")


@pytest.fixture(scope="session")
def groups():
    """(mpicomm default group, gloo group over the same ranks): every rank makes them, in the same order."""
    import torch.distributed as dist

    import mpicomm.torch  # noqa: F401 - registers the backend

    if not dist.is_initialized():
        dist.init_process_group("mpicomm")
    assert dist.get_backend() == "mpicomm"
    gloo = dist.new_group(backend="gloo")
    return dist.group.WORLD, gloo


def values(rank: int, n: int, dtype, kind: str = "sum"):
    """Rank- and index-dependent data whose reductions are exact in any order, for *kind* of op.

    sum/min/max/avg: rank·1000 + index mod 997 (small: exact in float16/bfloat16 too for few elements);
    product: 1..3; bits: integers that differ per rank and index; bool: a pattern per rank.
    """
    i = torch.arange(n, dtype=torch.int64)
    if dtype == torch.bool:
        return (i + rank) % 3 == 0
    if kind == "product":
        v = (i + rank) % 3 + 1
    elif kind == "bits":
        v = (rank * 37 + i * 11) % 251
    elif dtype in (torch.float16, torch.bfloat16, torch.int8, torch.uint8):
        v = rank * 5 + i % 7
    else:
        v = rank * 1000 + i % 997
    out = v.to(dtype)
    if dtype.is_complex:
        out = out + 1j * (i % 5).to(dtype)
    return out
