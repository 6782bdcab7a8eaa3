"""The packed symmetric s3 kernel (streamdp/moments/symmetric3.py) against brute force.

The sketch stores only the k'(k'+1)(k'+2)/6 distinct entries of Σ w3·y⊗y⊗y; these tests
check the packed kernel, expanded to the full tensor, against dense einsum references
(to ~1e-12 relative), the layout bookkeeping exactly, and that states written with the earlier
pair layout load to the same sums.
"""
import numpy as np
import pytest

from streamdp import ClipBounds, WhitenedSketch
from streamdp.moments import reference as ref
from streamdp.moments import symmetric3
from streamdp.whitening.subspace import Subspace
from tests.conftest import csr, random_basis, random_documents


def rel_err(a, b):
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)


@pytest.mark.parametrize("k,n", [(1, 5), (2, 1), (3, 7), (7, 1023), (8, 1024), (9, 1025),
                                 (40, 3000), (13, 4096)])
def test_cube_sums_expanded_equal_the_dense_sum(k, n):
    rng = np.random.default_rng(1000 * k + n)
    Y = rng.standard_normal((n, k))
    w = rng.random(n) * 10.0 ** rng.integers(-6, 1, size=n)     # weights over 6 decades
    got = symmetric3.cube_sums(np.ascontiguousarray(Y.T), np.ascontiguousarray((Y * w[:, None]).T))
    assert got.shape == (k * (k + 1) * (k + 2) // 6,)
    dense = np.einsum("n,na,nb,nc->abc", w, Y, Y, Y)
    assert rel_err(symmetric3.expand(got, k), dense) < 1e-12
    # the magnitude-relative bound holds entrywise too (sums of |terms|, not of the result)
    absolute = np.einsum("n,na,nb,nc->abc", w, np.abs(Y), np.abs(Y), np.abs(Y))
    assert np.all(np.abs(symmetric3.expand(got, k) - dense) <= 1e-13 * absolute + 1e-300)


def test_empty_block_gives_zeros():
    out = np.full(symmetric3.packed_size(4), 7.0)
    assert np.array_equal(symmetric3.cube_sums(np.zeros((4, 0)), np.zeros((4, 0)), out),
                          np.zeros(20))


def test_layout_is_a_bijection_onto_sorted_triples():
    for k in (1, 2, 5, 12):
        a, b, c = symmetric3.triples(k)
        assert len(a) == symmetric3.packed_size(k)
        assert np.all((a <= b) & (b <= c))
        assert len(set(zip(a.tolist(), b.tolist(), c.tolist()))) == len(a)   # all distinct
        T = np.random.default_rng(k).standard_normal((k, k, k))
        S = sum(T.transpose(p) for p in
                [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])
        full = symmetric3.expand(symmetric3.pack(S), k)
        assert np.array_equal(full, S[tuple(np.sort(np.indices((k, k, k)), axis=0))])
        for p in [(0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]:
            assert np.array_equal(full, full.transpose(p))         # exactly symmetric
        assert np.array_equal(symmetric3.pack(full), symmetric3.pack(S))


def test_pair_layout_converts_to_the_same_entries():
    rng = np.random.default_rng(7)
    k, n = 6, 50
    Y = rng.standard_normal((n, k))
    WY = Y * rng.random(n)[:, None]
    j, kk = np.triu_indices(k)
    old = WY.T @ (Y[:, j] * Y[:, kk])                  # the layout of schema v1
    packed = symmetric3.from_pair_layout(old, k)
    a, b, c = symmetric3.triples(k)
    col = {(int(x), int(y)): i for i, (x, y) in enumerate(zip(j, kk))}
    assert np.array_equal(packed, [old[x, col[(int(y), int(z))]] for x, y, z in zip(a, b, c)])
    new = symmetric3.cube_sums(np.ascontiguousarray(Y.T), np.ascontiguousarray(WY.T))
    assert rel_err(packed, new) < 1e-12
    with pytest.raises(ValueError, match="pair-layout"):
        symmetric3.from_pair_layout(old[:, :-1], k)


def test_sketch_s3_matches_dense_moments_over_blocked_chunks(rng):
    """More documents in one chunk than symmetric3.ROWS_PER_BLOCK, clipped: the released s3 is
    Σ scale·e3(Q,Q,Q) (brute force, DESIGN §2) to 1e-12."""
    d, kp, n = 9, 4, 2600
    assert n > 2 * symmetric3.ROWS_PER_BLOCK
    C = random_documents(rng, n, d, max_count=3)
    Q = random_basis(rng, d, kp)
    clip = ClipBounds.for_length(6)
    sk = WhitenedSketch(Subspace(Q), clip).update(csr(C))
    s = sk.sums()
    X = csr(C)
    lengths = C.sum(1)
    scale = sk.document_scale(X, lengths, X @ Q)
    assert np.any(scale < 1)                         # the clipping path runs
    E3 = sum(w * ref.doc_e3(c) for c, w in zip(C, scale))
    assert rel_err(s.s3, ref.whiten3(E3, Q)) < 1e-12
    for p in [(0, 2, 1), (1, 0, 2), (2, 1, 0)]:
        assert rel_err(s.s3, s.s3.transpose(p)) < 1e-12


def test_state_holds_only_distinct_entries_and_v1_states_load(rng):
    C = random_documents(rng, 60, 10)
    sub = Subspace(random_basis(rng, 10, 5))
    sk = WhitenedSketch(sub, ClipBounds.for_length(8)).update(csr(C)).update(csr(C))
    assert sk.t3.shape == sk.comp["t3"].shape == (35,)        # 5·6·7/6, not 5·15
    # the same state written by the pair-layout build (schema v1): t3 and its compensation over
    # (a, pair b ≤ c), entries a > b carrying their symmetric value
    obj = sk.to_dict()
    j, kk = np.triu_indices(5)
    from streamdp import serialization as ser
    v1 = dict(obj, v=1, acc=dict(obj["acc"]), comp=dict(obj["comp"]))
    v1["acc"]["t3"] = ser.pack_array(symmetric3.expand(sk.t3, 5)[:, j, kk])
    v1["comp"]["t3"] = ser.pack_array(symmetric3.expand(sk.comp["t3"], 5)[:, j, kk])
    back = WhitenedSketch.from_dict(v1, sub)
    assert np.array_equal(back.t3, sk.t3) and np.array_equal(back.comp["t3"], sk.comp["t3"])
    a, b = back.sums(), sk.sums()
    assert np.array_equal(a.s3, b.s3) and np.array_equal(a.z, b.z)
    assert WhitenedSketch.from_dict(obj, sub).to_dict()["v"] == 2
    bad = dict(v1, acc=dict(v1["acc"], t3=ser.pack_array(np.zeros((5, 14)))))
    with pytest.raises(ser.SchemaError, match="t3"):
        WhitenedSketch.from_dict(bad, sub)
    with pytest.raises(ser.SchemaError, match="t3"):
        WhitenedSketch.from_dict(dict(obj, acc=dict(obj["acc"], t3=ser.pack_array(np.zeros(34)))),
                                 sub)
