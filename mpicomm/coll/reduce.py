"""Reduce algorithms: the root ends with the elementwise reduction of all ranks' vectors.

Signature: ``algorithm(s, send, recv)``: *s* is the :class:`~mpicomm.schedule.Builder`
the algorithm describes its rounds to; *send* and *recv* are views of the
input and output; *recv* is None off the root, and on the root it may be the
same memory as *send* (in place: nothing of *send* is read once *recv* has
been written). n = bytes of the vector, p = ranks.
"""

from __future__ import annotations

from ..model import Machine, ceil_lg, folded, halving_doubling
from ..registry import cost, register
from ..schedule import Builder, View
from .patterns import binomial as binomial_tree
from .patterns import block_partition, fold, unfold

__all__ = ["linear", "binomial", "rabenseifner", "shm"]


@register("reduce", "linear")
def linear(s: Builder, send: View, recv: View | None) -> None:
    """Linear: every rank sends its vector to the root, which combines them in rank order.

    Steps: ranks other than the root send their vector to it; the root
    receives x_0, x_1 … x_{p−1} one at a time into one vector of scratch
    (its own from *send*) and combines acc = acc ⊕ x_r. The accumulator is
    *recv* from the root's own turn on; before it (root ≠ 0) it is a second
    scratch vector (then free to receive into), so the root's input is read
    before *recv* is written.
    Restrictions: none - operands are combined in rank order, so
    non-commutative ops are fine; works in place.
    """
    rank, root, p = s.rank, s.root, s.p
    if rank != root:
        s.send(root, send)
        return
    assert recv is not None
    n = send.size
    if root == 0:
        s.copy(recv, send)
        acc = recv
        tmp = s.empty(n) if p > 1 else None
    else:  # x_0 … x_{root−1} accumulate in scratch until x_root joins them
        acc = s.empty(n)
        s.recv(0, acc)
        tmp = s.empty(n) if root > 1 else None
    for r in range(1, p):
        if r == root:
            s.combine(acc, send, recv)
            tmp = tmp if tmp is not None else acc  # the lower ranks' scratch is free now
            acc = recv
        else:
            assert tmp is not None  # None only if p = 1, or root = 1 (whose turn comes first and frees acc)
            s.recv(r, tmp)
            s.combine(acc, tmp, acc)


@register("reduce", "binomial")
def binomial(s: Builder, send: View, recv: View | None) -> None:
    """Binomial tree: partial results flow up a binomial tree, halving the active ranks each round.

    Steps: with a commutative op the tree is over relative ranks
    (rank − root) mod p, rooted at the root; with a non-commutative one it is
    over the real ranks, rooted at rank 0, so each subtree is a contiguous
    range of ranks. Each rank receives its children's partial results,
    nearest child first, and combines acc = acc ⊕ child (the child at distance
    2^k brings the ranks just above the 2^k that acc covers), then sends acc
    to its parent. In the non-commutative case with root ≠ 0, rank 0 finally
    sends the result to the root.
    Restrictions: none - rank order is kept for non-commutative ops; works in
    place; any p.
    """
    rank, root, p = s.rank, s.root, s.p
    base = root if s.commutative else 0  # the real rank at the top of the tree
    vrank = (rank - base) % p
    node = binomial_tree(vrank, p)
    if vrank == 0 and rank == root:
        assert recv is not None
        acc = recv
        s.copy(acc, send)
    elif node.children:
        acc = s.empty(send.size)
        s.copy(acc, send)
    else:
        acc = send  # a leaf sends its vector as it is
    if node.children:
        tmp = s.empty(send.size)
        for child, _ in reversed(node.children):
            s.recv((child + base) % p, tmp)
            s.combine(acc, tmp, acc)
    if node.parent is not None:
        s.send((node.parent + base) % p, acc)
    elif rank != root:  # rank 0 of the non-commutative tree: hand the result over
        s.send(root, acc)
    if rank == root and vrank != 0:
        assert recv is not None
        s.recv(base, recv)


@register("reduce", "rabenseifner", commutative_only=True)
def rabenseifner(s: Builder, send: View, recv: View | None) -> None:
    """Rabenseifner: reduce-scatter by recursive halving, then a binomial gather of the blocks to the root.

    Steps: fold a non-power-of-two p onto the largest power of two p' (each
    even rank below 2·(p − p') sends its vector to the odd rank above, which
    combines the two and takes part as newrank r // 2). The vector is split
    into p' blocks (:func:`~.patterns.block_partition`); with
    w = newrank XOR newroot, in the round of distance d = p'/2, p'/4 … 1 each
    rank halves the range of blocks it is responsible for, keeping the half on
    w's side of bit d, sends the other half to newrank XOR d and combines the
    half it receives: afterwards the rank with w holds block w reduced over
    all ranks. The gather reverses it: for d = 1, 2 … p'/2, the rank with bit
    d of w set sends its blocks w … w+d−1 to the rank d below in w (and is
    done), so the rank with w = 0 ends with the whole vector. If the root was
    folded away, its odd partner (newroot) sends it the result.
    Restrictions: commutative ops only (blocks are reduced in the order the
    exchanges happen); any p and count (count < p leaves some blocks empty);
    works in place.
    """
    rank, root, p = s.rank, s.root, s.p
    count = send.size
    f = fold(rank, p)
    rf = fold(root, p)
    if rf.newrank is None:  # the root is folded away: its odd partner stands for it
        assert rf.partner is not None
        rf = fold(rf.partner, p)
    newroot = rf.newrank
    assert newroot is not None  # the root's newrank, or its partner's
    if f.newrank is None:  # folded away: hand the vector up (the root then waits for the result)
        assert f.partner is not None  # a folded-away rank always has its proxy
        s.send(f.partner, send)
        if rank == root:
            assert recv is not None
            s.recv(f.partner, recv)
        return
    if rank == root:
        assert recv is not None
        acc = recv
    else:
        acc = s.empty(count)
    s.copy(acc, send)
    edges = block_partition(count, f.pof2)[1] + [count]  # blocks lo … hi−1 are elements edges[lo]:edges[hi]
    # scratch for the fold's whole vector, else for the largest half received (the first round's lower half)
    tmp = s.empty(count if f.partner is not None else edges[f.pof2 // 2])
    if f.partner is not None:  # the even rank below folded onto this one
        s.recv(f.partner, tmp)
        s.combine(tmp, acc, acc)
    w = f.newrank ^ newroot
    lo, hi = 0, f.pof2
    distance = f.pof2 // 2
    while distance >= 1:  # reduce-scatter: halve the block range each round
        partner = unfold(f.newrank ^ distance, f.rem)
        mid = lo + distance
        if w & distance:
            keep, give = (mid, hi), (lo, mid)
        else:
            keep, give = (lo, mid), (mid, hi)
        mine = acc.part(edges[keep[0]], edges[keep[1]])
        theirs = tmp.part(0, mine.size)
        s.sendrecv(partner, acc.part(edges[give[0]], edges[give[1]]), partner, theirs)
        if partner < rank:
            s.combine(theirs, mine, mine)
        else:
            s.combine(mine, theirs, mine)
        lo, hi = keep
        distance //= 2
    distance = 1
    while distance < f.pof2:  # binomial gather of the reduced blocks towards w = 0
        partner = unfold(f.newrank ^ distance, f.rem)
        if w & distance:
            s.send(partner, acc.part(edges[w], edges[w + distance]))
            return
        s.recv(partner, acc.part(edges[w + distance], edges[w + 2 * distance]))
        distance *= 2
    if rank != root:  # this rank is the root's odd partner: the root was folded away
        s.send(root, acc)


@register("reduce", "shm", single_node=True, host_only=True)
def shm(s: Builder, send: View, recv: View | None) -> None:
    """Shared memory: each rank reduces its slice straight from the peers' memory into the root's result.

    Steps: (see :func:`mpicomm.coll.node_memory.reduce`) publish inputs (pool
    arrays in place, others copied into scratch but for the own slice) and the
    root's output; rank r reduces slice r of all p inputs in rank order, into
    the root's output when it is a pool array, else into its scratch, which the
    root copies out. Pipelined in chunks of
    :data:`mpicomm.coll.node_memory.CHUNK_BYTES`; counters in shared memory, no
    MPI barrier.
    Restrictions: every rank on one node; host buffers; any op (rank order kept).
    """
    from .node_memory import reduce as shm_reduce

    shm_reduce(s, send, recv, s.root)


# ---------------------------------------------------------------- cost functions (n: the catalogue's size)


@cost("reduce", "linear")
@cost("scan", "linear")
@cost("exscan", "linear")
def _reduce_linear(m: Machine, n: float, p: int) -> float:
    """(p−1)α + (p−1)nβ + (p−1)nγ  (reduce: all of it at the root; scan and exscan: the chain's length, rank p−1
    finishes last)"""
    a, b = m.link(p).alpha, m.link(p).beta
    return (p - 1) * (a + n * b + n * m.gamma)


@cost("reduce", "binomial")
@cost("scan", "recursive_doubling")
def _reduce_binomial(m: Machine, n: float, p: int) -> float:
    """⌈lg p⌉(α + nβ + nγ)  (reduce: root 0, no hand-over to the root - a non-commutative op and root ≠ 0 add
    α + nβ; scan: the same rounds)"""
    a, b = m.link(p).alpha, m.link(p).beta
    return ceil_lg(p) * (a + n * b + n * m.gamma)


@cost("reduce", "rabenseifner")
def _reduce_rabenseifner(m: Machine, n: float, p: int) -> float:
    """2lg p'·α + 2n(p'−1)/p'·β + n(p'−1)/p'·γ; p ≠ p': + α + nβ + nγ to fold, + α + nβ for the folded root 0"""
    t = halving_doubling(m, n, p)
    if folded(p):
        a, b = m.link(p).alpha, m.link(p).beta
        t += (a + n * b + n * m.gamma) + (a + n * b)
    return t


@cost("reduce", "shm")
def _reduce_shm(m: Machine, n: float, p: int) -> float:
    """2α + n(2p−1)/p·δ + n(p−1)/p·γ  (α of the intra-node link)"""
    return 2 * m.intra.alpha + n * (2 * p - 1) / p * m.copy + n * (p - 1) / p * m.gamma
