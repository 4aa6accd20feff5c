"""docs/torch.md's capability matrix is what the backend does: every call its mpicomm CPU column marks ✓, on every
dtype its dtype paragraph lists, gives the right result (rank- and index-dependent data, a root that is not 0);
a float8 tensor, which the page says is not taken, is refused with a ValueError on every rank."""

from __future__ import annotations

import os
import re

import pytest
import torch.distributed as dist  # noqa: E402

from tests import mpirun

from .conftest import torch, values

pytestmark = pytest.mark.mpi
PAGE = os.path.join(mpirun.REPO, "docs", "torch.md")
N = 5  # elements per rank's block: not a multiple of p


def _page() -> str:
    with open(PAGE, encoding="utf-8") as f:
        return f.read().split("## Capability matrix", 1)[1].split("\n## ", 1)[0]


def _calls() -> list[str]:
    """The calls whose mpicomm CPU cell is ✓."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in _page().splitlines() if line.startswith("| `")]
    return [row[0] for row in rows if row[1] == "✓"]


def _dtypes() -> list[torch.dtype]:
    """The dtypes the page says every call takes (its "mpicomm, every call:" sentence)."""
    text = " ".join(_page().split())
    listed = re.search(r"mpicomm, every call: ([a-z0-9, ]+) \(", text)
    assert listed, "docs/torch.md: no 'mpicomm, every call: ...' dtype list under the capability matrix"
    return [getattr(torch, name.strip()) for name in listed.group(1).split(",")]


def _ref(blocks: list) -> torch.Tensor:
    """The sum of *blocks* (or for bool, their OR), computed wide and cast back."""
    if blocks[0].dtype == torch.bool:
        return torch.stack(blocks).any(0)
    wide = torch.complex128 if blocks[0].dtype.is_complex else torch.float64
    return torch.stack([b.to(wide) for b in blocks]).sum(0).to(blocks[0].dtype)


def _run(call: str, dt: torch.dtype, me: int, p: int) -> tuple[list, list]:
    """(got, expected) tensors of *call* on *dt* at this rank."""
    root = p - 1
    mine, every = values(me, N, dt), [values(r, N, dt) for r in range(p)]
    wide = [values(r, N * p, dt) for r in range(p)]  # rank r's p blocks: block j goes to rank j
    block = slice(me * N, (me + 1) * N)
    if call == "`all_reduce`":
        t = mine.clone()
        dist.all_reduce(t)
        return [t], [_ref(every)]
    if call == "`broadcast`":
        t = mine.clone()
        dist.broadcast(t, root)
        return [t], [every[root]]
    if call == "`reduce`":
        t = mine.clone()
        dist.reduce(t, root)
        return ([t], [_ref(every)]) if me == root else ([], [])
    if call == "`all_gather`":
        out = [torch.empty(N, dtype=dt) for _ in range(p)]
        dist.all_gather(out, mine)
        return out, every
    if call == "`all_gather`, uneven":
        out = [torch.empty(N + r, dtype=dt) for r in range(p)]
        dist.all_gather(out, values(me, N + me, dt))
        return out, [values(r, N + r, dt) for r in range(p)]
    if call == "`all_gather_into_tensor`":
        out = torch.empty(N * p, dtype=dt)
        dist.all_gather_into_tensor(out, mine)
        return [out], [torch.cat(every)]
    if call == "`gather`":
        out = [torch.empty(N, dtype=dt) for _ in range(p)] if me == root else None
        dist.gather(mine, out, root)
        return (out, every) if me == root else ([], [])
    if call == "`scatter`":
        t = torch.empty(N, dtype=dt)
        dist.scatter(t, list(wide[root].split(N)) if me == root else None, root)
        return [t], [wide[root][block]]
    if call == "`reduce_scatter`":
        t = torch.empty(N, dtype=dt)
        dist.reduce_scatter(t, list(wide[me].split(N)))
        return [t], [_ref([w[block] for w in wide])]
    if call == "`reduce_scatter_tensor`":
        t = torch.empty(N, dtype=dt)
        dist.reduce_scatter_tensor(t, wide[me])
        return [t], [_ref([w[block] for w in wide])]
    if call == "`all_to_all`":
        out = [torch.empty(N, dtype=dt) for _ in range(p)]
        dist.all_to_all(out, list(wide[me].split(N)))
        return out, [w[block] for w in wide]
    if call == "`all_to_all_single`":
        out = torch.empty(N * p, dtype=dt)
        dist.all_to_all_single(out, wide[me])
        return [out], [torch.cat([w[block] for w in wide])]
    if call == "`send` / `recv`":  # a ring: to the right, from the left
        if p == 1:
            return [], []
        t = torch.empty(N, dtype=dt)
        works = [dist.isend(mine, (me + 1) % p), dist.irecv(t, (me - 1) % p)]
        for w in works:
            w.wait()
        return [t], [every[(me - 1) % p]]
    if call == "`barrier`":
        dist.barrier()
        return [], []
    raise AssertionError(f"docs/torch.md's capability matrix names {call}, which this test does not know")


def test_the_page_lists_the_calls_and_dtypes():
    assert len(_calls()) == 14 and len(_dtypes()) == 15


@pytest.mark.parametrize("call", _calls())
def test_every_call_of_the_matrix_on_every_dtype(groups, call):
    me, p = dist.get_rank(), dist.get_world_size()
    for dt in _dtypes():
        got, expected = _run(call, dt, me, p)
        assert len(got) == len(expected), (call, dt)
        for i, (g, e) in enumerate(zip(got, expected)):
            assert g.dtype == dt and torch.equal(g, e), f"{call} {dt} [{i}] on rank {me}: {g} != {e}"


def test_float8_is_refused_on_every_rank(groups):
    t = torch.zeros(4, dtype=torch.float8_e4m3fn)
    with pytest.raises((ValueError, TypeError)):
        dist.all_reduce(t)
    t = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(t)  # the group still works
    assert t.tolist() == [dist.get_world_size() * (dist.get_world_size() + 1) / 2] * 3
