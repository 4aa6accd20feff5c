"""The torch backend's tests: PyTorch or a skip with the reason; one mpicomm default group and a gloo group.

``MPICOMM_TEST_TORCH_DEVICE=cuda`` (the GPU tier, ``python -m tests --gpu``) runs the same tests with CUDA
tensors: torch's default device becomes the GPU, so every tensor a test makes without naming a device is on
it; without a visible GPU the whole directory is skipped, saying so.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install torch==2.13.0 (the CPU wheel), "
                                            "then pip install -e '.[torch]'")

DEVICE = os.environ.get("MPICOMM_TEST_TORCH_DEVICE", "cpu")


def pytest_collection_modifyitems(config, items):
    if DEVICE == "cpu":
        return
    reason = None
    if DEVICE != "cuda":
        reason = f"MPICOMM_TEST_TORCH_DEVICE={DEVICE!r}: expected cpu or cuda"
    elif not torch.cuda.is_available():
        reason = "MPICOMM_TEST_TORCH_DEVICE=cuda, but torch sees no CUDA device"
    if reason is None:
        return
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.skip(reason=reason))


if DEVICE == "cuda" and torch.cuda.is_available():
    torch.set_default_device("cuda")  # (the current device: the rank's, once the default group bound it)


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
