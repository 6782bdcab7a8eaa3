"""The sketch path against brute-force dense moments (DESIGN §2-3), to ~1e-12."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from streamdp.moments import reference as ref
from streamdp.moments.sketch import WhitenedSketch, symmetrize3
from streamdp.release import qspace_moments
from streamdp.whitening.subspace import Subspace
from tests.conftest import csr, random_basis, random_documents


def rel_err(a, b):
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)


def direct_s3(c, Q):
    """Literal per-document s3 of DESIGN §3 (no per-word accumulators)."""
    l = c.sum()
    y = Q.T @ c
    T = np.einsum("a,b,c->abc", y, y, y)
    for i in np.flatnonzero(c):
        q = Q[i]
        T -= c[i] * (np.einsum("a,b,c->abc", q, q, y) + np.einsum("a,b,c->abc", q, y, q)
                     + np.einsum("a,b,c->abc", y, q, q))
        T += 2 * c[i] * np.einsum("a,b,c->abc", q, q, q)
    return T / (l * (l - 1) * (l - 2))


@pytest.mark.parametrize("d,kp,alpha0", [(5, 3, 0.5), (8, 4, 1.0), (8, 8, 3.0)])
def test_sketch_matches_dense_moments(rng, d, kp, alpha0):
    C = random_documents(rng, 40, d)
    C[0] = 0; C[0, 1] = 7                     # one word repeated
    C[1] = 0; C[1, :3] = 1                    # length exactly 3
    Q = random_basis(rng, d, kp)
    s = WhitenedSketch(Subspace(Q)).update(csr(C)).sums()
    N = len(C)
    m = ref.empirical_moments(C)
    assert s.count == N
    assert rel_err(s.m1 / N, m["M1"]) < 1e-12
    assert rel_err(s.z / N, m["E2"] @ Q) < 1e-12
    assert rel_err(s.s1 / N, Q.T @ m["M1"]) < 1e-12
    assert rel_err(s.s2 / N, Q.T @ m["E2"] @ Q) < 1e-12
    assert rel_err(s.s3 / N, ref.whiten3(m["E3"], Q)) < 1e-12
    # LDA moments M2, M3 and their whitened forms
    M2, M3 = ref.lda_moments(m["M1"], m["E2"], m["E3"], alpha0)
    K, T3 = qspace_moments(s.s1 / N, s.s2 / N, symmetrize3(s.s3) / N, alpha0)
    assert rel_err(K, Q.T @ M2 @ Q) < 1e-12
    assert rel_err(T3, ref.whiten3(M3, Q)) < 1e-12
    if kp == d:   # Q orthogonal: nothing is lost, the full tensors come back
        assert rel_err(Q @ K @ Q.T, M2) < 1e-12
        assert rel_err(ref.whiten3(T3, Q.T), M3) < 1e-12


def test_dense_e3_matches_counting_definition(rng):
    """e3 counts ordered triples of distinct token positions (independent check)."""
    c = np.array([3.0, 0, 2, 1])
    tokens = np.repeat(np.arange(4), c.astype(int))
    T = np.zeros((4, 4, 4))
    n = len(tokens)
    for p in range(n):
        for q in range(n):
            for r in range(n):
                if len({p, q, r}) == 3:
                    T[tokens[p], tokens[q], tokens[r]] += 1
    assert np.allclose(ref.doc_e3(c), T / (n * (n - 1) * (n - 2)), atol=1e-15)


def test_accumulator_s3_equals_direct_per_document_s3(rng):
    d, kp = 8, 5
    C = random_documents(rng, 25, d, max_count=6)
    Q = random_basis(rng, d, kp)
    s3 = WhitenedSketch(Subspace(Q)).update(csr(C)).sums().s3
    direct = sum(direct_s3(c, Q) for c in C)
    assert rel_err(s3, direct) < 1e-12
    assert rel_err(s3, symmetrize3(s3)) < 1e-12   # symmetric by construction


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(3, 8), n=st.integers(1, 12),
       split=st.integers(0, 12))
def test_merge_of_split_equals_whole(seed, d, n, split):
    rng = np.random.default_rng(seed)
    C = random_documents(rng, n, d)
    Q = random_basis(rng, d, max(1, d // 2))
    S = Subspace(Q)
    whole = WhitenedSketch(S).update(csr(C))
    k = min(split, n)
    parts = WhitenedSketch(S).update(csr(C[:k])).merge(WhitenedSketch(S).update(csr(C[k:])))
    a, b = whole.sums(), parts.sums()
    for name in ("m1", "z", "s1", "s2", "s3"):
        assert np.allclose(getattr(a, name), getattr(b, name), rtol=1e-12, atol=1e-15), name
    assert a.count == b.count and whole.n_docs == parts.n_docs


def test_serialisation_round_trip_is_bit_exact(rng):
    C = random_documents(rng, 30, 8)
    S = Subspace(random_basis(rng, 8, 4))
    from streamdp.moments.clipping import ClipBounds
    sk = WhitenedSketch(S, ClipBounds.for_length(5)).update(csr(C))
    data = sk.to_bytes()
    back = WhitenedSketch.from_bytes(data, Subspace.from_bytes(S.to_bytes()))
    assert back.to_bytes() == data
    for name in ("m1", "zacc", "a2", "b3", "a3", "t3"):
        assert np.array_equal(getattr(back, name), getattr(sk, name))
    assert (back.n_docs, back.n_clipped, back.weight_sum, back.clip) == (
        sk.n_docs, sk.n_clipped, sk.weight_sum, sk.clip)


def test_merge_refuses_incompatible_sketches(rng):
    S1 = Subspace(random_basis(rng, 6, 3))
    S2 = Subspace(random_basis(rng, 6, 3))
    with pytest.raises(ValueError, match="different subspaces"):
        WhitenedSketch(S1).merge(WhitenedSketch(S2))
    from streamdp.moments.clipping import ClipBounds
    with pytest.raises(ValueError, match="clip bounds"):
        WhitenedSketch(S1).merge(WhitenedSketch(S1, ClipBounds.for_length(10)))
    with pytest.raises(Exception, match="subspace"):
        WhitenedSketch.from_bytes(WhitenedSketch(S1).to_bytes(), S2)


def test_short_documents_are_skipped_and_input_is_validated(rng):
    S = Subspace(random_basis(rng, 5, 2))
    sk = WhitenedSketch(S).update(csr([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [3, 0, 0, 0, 0]]))
    assert sk.n_docs == 1
    with pytest.raises(ValueError, match="non-negative"):
        sk.update(csr([[-1, 4, 0, 0, 0]]))
    with pytest.raises(ValueError, match="integers"):
        sk.update(csr([[0.5, 4, 0, 0, 0]]))
    with pytest.raises(ValueError, match="vocabulary"):
        sk.update(csr([[1, 4, 0, 0]]))
