"""mpicomm.model: cost functions for every algorithm, predictions, the line fit, storage, and for_comm."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import warnings
from dataclasses import replace

import pytest

import mpicomm
from mpicomm import model, registry
from mpicomm.facts import Facts

#: A fixed machine: intra α 2 µs, β 1 ns/B; inter α 10 µs, β 4 ns/B; γ 0.5 ns/B; δ 0.25 ns/B; 4 ranks per node.
M = model.Machine(
    intra=model.Link(2e-6, 1e-9), inter=model.Link(10e-6, 4e-9), gamma=0.5e-9, copy=0.25e-9,
    overhead=3e-6, validation=7e-6, ppn=4, nodes=2, host="testhost", created="2026-01-01T00:00:00+00:00",
)


def all_algorithms():
    return [(c, name) for c, algorithms in sorted(registry.table().items()) for name in sorted(algorithms)]


@pytest.fixture
def no_validation(monkeypatch):
    monkeypatch.setenv("MPICOMM_VALIDATE", "0")


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A private cache directory for this test (one process only: serial tests)."""
    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path))
    return tmp_path


# ---------------------------------------------------------------- every algorithm is modelled


@pytest.mark.parametrize("collective,algorithm", all_algorithms(), ids=lambda v: v)
def test_every_algorithm_has_a_cost_function_that_states_its_formula(collective, algorithm):
    assert registry.cost_function(collective, algorithm) is not None, f"no cost function for {collective}/{algorithm}"
    assert registry.lookup(collective, algorithm).cost, f"{collective}/{algorithm}: its cost function has no docstring"
    for p in (1, 2, 3, 4, 8):
        for n in (0, 8, 65536, 1 << 22):
            seconds = registry.communication(collective, algorithm, n, p, M)
            assert seconds >= 0 and math.isfinite(seconds)
            if p == 1:
                assert seconds == 0


@pytest.mark.parametrize("collective,algorithm", all_algorithms(), ids=lambda v: v)
def test_cost_grows_with_the_message(collective, algorithm):
    if collective == "barrier":
        pytest.skip("a barrier moves no data")
    for p in (2, 3, 4, 8):
        small, large = (registry.communication(collective, algorithm, n, p, M) for n in (1024, 1 << 20))
        assert large > small


# ---------------------------------------------------------------- predictions against hand-computed values
#
# Each literal is the docstring's formula worked out by hand for machine M (overhead 3 µs, validation off);
# p ≤ 4 pays the intra link (α 2 µs, β 1 ns/B), p > 4 the inter link (α 10 µs, β 4 ns/B).

HAND = [
    # ring: 2(p−1)·α·⌈(n/p)/1 MiB⌉ + 2n(p−1)/p·β + n(p−1)/p·γ = 6·2µs + 1.5·2^20 ns + 0.75·2^20·0.5 ns
    ("allreduce", "ring", 1 << 20, 4, 1.98108e-3),
    # ring, blocks of 4 MiB travel in 4 segments: 2·1·4·α + n·β + n/2·γ
    ("allreduce", "ring", 8 << 20, 2, 10.50476e-3),
    # recursive doubling, p = 6 folds onto 4: 2(α + nβ + nγ) + (2α + 2nβ + nγ), inter link, n = 1000
    ("allreduce", "recursive_doubling", 1000, 6, 60.5e-6),
    # recursive doubling, p = 4: 2(α + nβ + nγ)
    ("allreduce", "recursive_doubling", 1000, 4, 2 * (2e-6 + 1e-6 + 0.5e-6) + 3e-6),
    # shm: 2α + n·7/4·δ + n·3/4·γ
    ("allreduce", "shm", 4096, 4, 10.328e-6),
    # shm alltoall, p = 4: α + 2n·3/4·δ; alltoallv: + α
    ("alltoall", "shm", 4096, 4, 6.536e-6),
    ("alltoallv", "shm", 4096, 4, 8.536e-6),
    # binomial bcast, p = 5 (inter): ⌈lg 5⌉ = 3 rounds of α + nβ
    ("bcast", "binomial", 4096, 5, 82.152e-6),
    # rabenseifner reduce, p = 3 folds onto 2: 2α + n·β + n/2·γ, + fold (α + nβ + nγ), + folded root 0 (α + nβ)
    ("reduce", "rabenseifner", 2000, 3, 18.5e-6),
    # binomial gather of 100-byte blocks from 4 ranks: 2α + 400·3/4·β
    ("gather", "binomial", 100, 4, 7.3e-6),
    # gatherv adds lg p·α of size headers
    ("gatherv", "binomial", 100, 4, 11.3e-6),
    # bruck allgather, p = 3: 2α + n·2/3·β + 2n·δ
    ("allgather", "bruck", 3000, 3, 10.5e-6),
    # bruck alltoallv, p = 4: 2α + (n/2)·2·β, + 2α for the rounds of block sizes, + 2 rounds · 2 sizes · 8 B · β
    ("alltoallv", "bruck", 1024, 4, 12.056e-6),
    # recursive-doubling exscan, p = 3: 2(α + nβ + 2nγ)
    ("exscan", "recursive_doubling", 800, 3, 10.2e-6),
    # recursive halving, p = 6 (inter) folds onto 4: 2α + n·3/4·(β + γ) + (2α + nβ + nγ)
    ("reduce_scatter", "recursive_halving", 6000, 6, 90.25e-6),
    # reduce_scatter_block uses reduce_scatter's function
    ("reduce_scatter_block", "recursive_halving", 6000, 6, 90.25e-6),
    # one rank: no message, only the call overhead
    ("allreduce", "ring", 1 << 20, 1, 3e-6),
]


@pytest.mark.parametrize("collective,algorithm,nbytes,p,seconds", HAND, ids=lambda v: str(v))
def test_prediction_matches_the_hand_computed_value(no_validation, collective, algorithm, nbytes, p, seconds):
    assert registry.predict(collective, algorithm, nbytes, p, machine=M) == pytest.approx(seconds, rel=1e-9)


def test_validation_adds_its_cost(monkeypatch):
    monkeypatch.setenv("MPICOMM_VALIDATE", "1")
    on = registry.predict("bcast", "binomial", 4096, 5, machine=M)
    monkeypatch.setenv("MPICOMM_VALIDATE", "0")
    off = registry.predict("bcast", "binomial", 4096, 5, machine=M)
    assert on - off == pytest.approx(7e-6, rel=1e-9)


def test_link_is_intra_on_one_node_and_inter_beyond():
    assert M.link(1) == M.link(4) == M.intra
    assert M.link(5) == M.link(64) == M.inter


def brute_force_cheapest(collective, n, q, link, spans_nodes):
    level = replace(M, intra=link, inter=link)
    facts = Facts(p=q, nodes=q if spans_nodes else 1)
    best = math.inf
    for name, algorithm in registry.table()[collective].items():
        if name != "hierarchical" and registry.allowed(algorithm, facts) is None:
            best = min(best, registry.communication(collective, name, n, q, level))
    return best


@pytest.mark.parametrize("p", [4, 8, 6])
def test_hierarchical_compositions_use_the_cheapest_algorithm_of_each_level(no_validation, p):
    n = 1 << 16
    ppn, nodes = min(p, M.ppn), -(-p // min(p, M.ppn))
    inter = nodes > 1

    def t(collective, size, q, link, spans):
        return brute_force_cheapest(collective, size, q, link, spans) if q > 1 else 0.0

    expected = {
        "allreduce": t("reduce", n, ppn, M.intra, False) + t("allreduce", n, nodes, M.inter, inter)
        + t("bcast", n, ppn, M.intra, False),
        "bcast": 2 * t("bcast", n, ppn, M.intra, False) + t("bcast", n, nodes, M.inter, inter),
        "allgather": t("gather", n / p, ppn, M.intra, False) + t("allgatherv", n, nodes, M.inter, inter)
        + t("bcast", n, ppn, M.intra, False) + n * M.copy,
    }
    for collective, seconds in expected.items():
        if "hierarchical" not in registry.table()[collective]:
            continue
        assert registry.predict(collective, "hierarchical", n, p, machine=M) == pytest.approx(seconds + 3e-6, rel=1e-12)


def test_a_level_that_spans_nodes_skips_single_node_algorithms():
    n, q = 1 << 16, 4
    flat = {name: registry.communication("allreduce", name, n, q, replace(M, intra=M.inter))
            for name, a in registry.table()["allreduce"].items() if name != "hierarchical"}
    spanning = [v for name, v in flat.items() if not registry.lookup("allreduce", name).single_node]
    assert registry.cheapest(M, "allreduce", n, q, M.inter, True) == min(spanning)
    assert registry.cheapest(M, "allreduce", n, q, M.inter, False) == min(flat.values())
    assert registry.cheapest(M, "allreduce", n, 1, M.inter, True) == 0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="no cost function for allreduce algorithm 'tornado'; modelled: .*ring"):
        registry.predict("allreduce", "tornado", 8, 2, machine=M)
    with pytest.raises(ValueError, match="p = 0"):
        registry.predict("allreduce", "ring", 8, 0, machine=M)
    with pytest.raises(ValueError, match="nbytes = -1"):
        registry.predict("allreduce", "ring", -1, 2, machine=M)
    with pytest.raises(ValueError, match="twice"):
        registry.cost("allreduce", "ring")(lambda m, n, p: 0.0)


def test_predict_without_a_machine_uses_the_world_communicators_fit_or_nominal(comm, no_validation):
    expected = comm.machine if getattr(comm, "machine", None) is not None else replace(
        model.NOMINAL, ppn=getattr(comm, "ppn", comm.local_size), nodes=comm.nodes, host=comm.host)
    for p in (2, 5):
        assert mpicomm.predict("allreduce", "ring", 1 << 20, p) == registry.predict("allreduce", "ring", 1 << 20, p,
                                                                               machine=expected)


# ---------------------------------------------------------------- fit_line


SIZES = [8 << k for k in range(20)]  # 8 B … 4 MiB


def test_fit_recovers_alpha_and_beta_from_exact_data():
    t = [5e-6 + 2e-10 * n for n in SIZES]
    alpha, beta = model.fit_line(SIZES, t)
    assert alpha == pytest.approx(5e-6, rel=1e-9)
    assert beta == pytest.approx(2e-10, rel=1e-9)


def test_fit_recovers_alpha_and_beta_from_noisy_data():
    noise = [1.03, 0.97, 1.01, 0.98, 1.02]  # ±3 %, deterministic
    t = [(20e-6 + 1.25e-10 * n) * noise[i % len(noise)] for i, n in enumerate(SIZES)]
    alpha, beta = model.fit_line(SIZES, t)
    assert alpha == pytest.approx(20e-6, rel=0.03)
    assert beta == pytest.approx(1.25e-10, rel=0.05)
    assert model.fit_line(SIZES, t) == (alpha, beta)  # deterministic


def test_fit_weights_small_sizes_like_large_ones():
    # an unweighted fit would let the 4 MiB point's 10 % excess swamp the 8-byte latency
    t = [10e-6 + 1e-10 * n for n in SIZES]
    t[-1] *= 1.1
    alpha, _ = model.fit_line(SIZES, t)
    assert alpha == pytest.approx(10e-6, rel=0.02)


def test_fit_clamps_to_non_negative():
    alpha, beta = model.fit_line([8, 1024, 65536], [3e-6, 2.9e-6, 2.8e-6])  # falling: β clamped to 0
    assert beta == 0 and alpha == pytest.approx(2.9e-6, rel=0.05)
    alpha, beta = model.fit_line([1000, 2000, 4000], [0.5e-6, 1.5e-6, 3.5e-6])  # would need α < 0
    assert alpha == 0 and beta > 0


@pytest.mark.parametrize("sizes,times,message", [
    ([8], [1e-6], "fewer than two distinct"),
    ([8, 8], [1e-6, 1e-6], "fewer than two distinct"),
    ([8, 16], [1e-6], "2 sizes but 1 times"),
    ([8, 16], [1e-6, 0.0], "times finite and > 0"),
])
def test_fit_refuses_unusable_data(sizes, times, message):
    with pytest.raises(ValueError, match=message):
        model.fit_line(sizes, times)


# ---------------------------------------------------------------- storage


def test_json_round_trip():
    assert model.Machine.from_json(M.to_json()) == M
    body = json.loads(M.to_json())
    assert body["version"] == model.FORMAT_VERSION and body["intra"] == {"alpha": 2e-6, "beta": 1e-9}


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model.cache_dir() == str(tmp_path / "explicit")
    monkeypatch.delenv("MPICOMM_CACHE_DIR")
    assert model.cache_dir() == str(tmp_path / "xdg" / "mpicomm")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert model.cache_dir() == str(tmp_path / "home" / ".cache" / "mpicomm")


def test_layout_key_and_path():
    assert model.layout_key(4, 2, 2) == "p4-2x2"
    assert model.layout_key(3, 1, 3) == "p3-1x3"
    with pytest.raises(ValueError, match="nodes = 0"):
        model.layout_key(4, 0, 2)
    path = model.path_for("node/7:a", "p4-2x2")
    assert os.path.basename(path) == "model-node_7_a-p4-2x2.json"


def test_save_and_load(cache):
    path = model.save(M, model.path_for(M.host, "p8-2x4"))
    assert os.path.dirname(path) == str(cache)
    assert model.load("testhost", "p8-2x4") == M
    assert model.load("testhost", "p4-1x4") is None  # another layout: nothing saved
    assert model.load("otherhost", "p8-2x4") is None
    assert sorted(os.listdir(cache)) == ["model-testhost-p8-2x4.json"]  # no temporary file left
    assert model.save(M) == model.path_for("testhost", "p8-2x4")  # default: nodes × ppn ranks


@pytest.mark.parametrize("text,reason", [
    ("{not json", "not JSON"),
    ('{"format": "something else"}', "not an mpicomm model file"),
    (None, "format version 999"),
    (None, "gamma = -1"),
])
def test_an_unusable_file_gives_none_with_a_warning(cache, text, reason):
    if text is None:
        body = json.loads(M.to_json())
        if "version" in reason:
            body["version"] = 999
        else:
            body["gamma"] = -1
        text = json.dumps(body)
    path = model.path_for("testhost", "p2-1x2")
    with open(path, "w") as f:
        f.write(text)
    with pytest.warns(RuntimeWarning, match=f"ignoring the saved mpicomm model .*model-testhost-p2-1x2.json: {reason}"):
        assert model.load("testhost", "p2-1x2") is None


def test_a_missing_file_gives_none_quietly(cache):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model.load("testhost", "p2-1x2") is None


# ---------------------------------------------------------------- for_comm: every rank makes the same choice


@pytest.mark.mpi
def test_for_comm_agrees_on_every_rank(comm, monkeypatch):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    folder = world.bcast(tempfile.mkdtemp(prefix="mpicomm-model-") if rank == 0 else None, root=0)
    monkeypatch.setenv("MPICOMM_CACHE_DIR", folder)  # one directory for all ranks
    ppn = getattr(comm, "ppn", comm.local_size)
    host0 = world.bcast(comm.host, root=0)
    try:
        assert model.for_comm(world, comm.host, comm.nodes, ppn) is None  # nothing saved yet
        fitted = replace(M, host=host0, nodes=comm.nodes, ppn=ppn, overhead=1e-6 * (p + 1))
        if rank == 0:
            model.save(fitted, model.path_for(host0, model.layout_key(p, comm.nodes, ppn)))
        world.Barrier()
        got = model.for_comm(world, comm.host, comm.nodes, ppn)
        assert got == fitted
        assert len(set(world.allgather(got.to_json()))) == 1

        if rank == 0:
            with open(model.path_for(host0, model.layout_key(p, comm.nodes, ppn)), "w") as f:
                f.write("{corrupt")
        world.Barrier()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = model.for_comm(world, comm.host, comm.nodes, ppn)
        assert got is None  # on every rank, rank 0 having seen the corrupt file
        warned = [w for w in caught if "ignoring the saved mpicomm model" in str(w.message)]
        assert len(warned) == (1 if rank == 0 else 0)
    finally:
        world.Barrier()
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- the memory regime

#: M with a second regime above 1 MiB: intra β 3 ns/B, inter β 8 ns/B, γ 2 ns/B, δ 1 ns/B.
MR = replace(M, cache_bytes=1 << 20, intra_mem=model.Link(2e-6, 3e-9), inter_mem=model.Link(10e-6, 8e-9),
             gamma_mem=2e-9, copy_mem=1e-9)


@pytest.mark.parametrize("collective,algorithm,nbytes,p,seconds", [
    ("bcast", "binomial", 1 << 20, 4, 2101.152e-6),  # working set = cache_bytes: 2(α + nβ), β = 1 ns/B
    ("bcast", "binomial", 2 << 20, 4, 12586.912e-6),  # above: β = 3 ns/B
    ("allreduce", "shm", 1 << 20, 4, 855.968e-6),  # 2α + 1.75n·0.25 ns + 0.75n·0.5 ns
    ("allreduce", "shm", 2 << 20, 4, 6819.744e-6),  # 2α + 1.75n·1 ns + 0.75n·2 ns
    ("bcast", "binomial", 2 << 20, 8, 3 * (10e-6 + (2 << 20) * 8e-9)),  # inter link, memory β
    ("gather", "linear", 256 << 10, 4, 6e-6 + (1 << 20) * 0.75 * 1e-9),  # working set n·p = 1 MiB: cache
    ("gather", "linear", 512 << 10, 4, 6e-6 + (2 << 20) * 0.75 * 3e-9),  # n·p = 2 MiB: memory
])
def test_the_regime_switches_at_cache_bytes(collective, algorithm, nbytes, p, seconds):
    assert registry.communication(collective, algorithm, nbytes, p, MR) == pytest.approx(seconds, rel=1e-12)


def test_at_gives_the_memory_values_above_the_threshold():
    assert MR.at(1 << 20) is MR
    mem = MR.at((1 << 20) + 1)
    assert (mem.intra, mem.inter, mem.gamma, mem.copy) == (MR.intra_mem, MR.inter_mem, 2e-9, 1e-9)
    assert mem.at(10 << 20) == mem  # idempotent
    assert model.working_set("gather", 10, 4) == 40 and model.working_set("allreduce", 10, 4) == 10


def test_a_machine_without_memory_values_has_one_regime():
    assert (M.intra_mem, M.inter_mem, M.gamma_mem, M.copy_mem) == (M.intra, M.inter, M.gamma, M.copy)
    for n in (1 << 10, 1 << 30):
        assert registry.communication("allreduce", "shm", n, 4, M) == pytest.approx(
            2 * 2e-6 + 1.75 * n * 0.25e-9 + 0.75 * n * 0.5e-9, rel=1e-12)


def test_json_round_trip_with_the_memory_regime_and_old_files_load_with_defaults():
    assert model.Machine.from_json(MR.to_json()) == MR
    body = json.loads(MR.to_json())
    assert body["cache_bytes"] == 1 << 20 and body["intra_mem"] == {"alpha": 2e-6, "beta": 3e-9}
    old = json.loads(M.to_json())
    for key in ("cache_bytes", "intra_mem", "inter_mem", "gamma_mem", "copy_mem"):
        del old[key]
    loaded = model.Machine.from_json(json.dumps(old))
    assert loaded == M and loaded.cache_bytes == 32 << 20 and loaded.gamma_mem == M.gamma
    bad = json.loads(MR.to_json())
    bad["gamma_mem"] = -1
    with pytest.raises(ValueError, match="gamma_mem"):
        model.Machine.from_json(json.dumps(bad))


def test_fit_memory_slope():
    assert model.fit_memory_slope([1e6, 2e6], [1e-6 + 3e-3, 1e-6 + 6e-3], 1e-6) == pytest.approx(3e-9, rel=1e-12)
    assert model.fit_memory_slope([1e6], [1e-7], 1e-6) == 0.0  # clamped
    with pytest.raises(ValueError, match="at least one"):
        model.fit_memory_slope([], [], 0.0)


def test_measured_corrections_scale_the_formula_and_survive_the_file():
    corrected = replace(M, corrections=(("allreduce", "ring", 2.5), ("bcast", "binomial", 0.5)))
    n, p = 1 << 20, 4
    assert registry.communication("allreduce", "ring", n, p, corrected) == pytest.approx(
        2.5 * registry.communication("allreduce", "ring", n, p, M), rel=1e-12)
    assert registry.communication("allreduce", "rabenseifner", n, p, corrected) == pytest.approx(
        registry.communication("allreduce", "rabenseifner", n, p, M), rel=1e-12)  # not measured: as fitted
    again = model.Machine.from_json(corrected.to_json())
    assert again == corrected and again.correction("bcast", "binomial") == 0.5
    assert model.Machine.from_json(M.to_json()).corrections == ()  # files without corrections still load
    body = json.loads(corrected.to_json())
    body["corrections"] = [["allreduce", "ring"]]
    with pytest.raises(ValueError, match="corrections = .* is not a list of \\[collective, algorithm, factor\\]"):
        model.Machine.from_json(json.dumps(body))
