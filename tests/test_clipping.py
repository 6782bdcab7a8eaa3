"""Sensitivity: one adversarial document moves each block sum by at most its clip bound."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from streamdp.moments import reference as ref
from streamdp.moments.clipping import ClipBounds, e2_norm, e3_norm, projected_e2_norm
from streamdp.moments.sketch import WhitenedSketch
from streamdp.privacy.sensitivity import block_sensitivities
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupSketch
from tests.conftest import csr, random_basis, random_documents

D = 60


def adversarial_documents():
    docs = {}
    c = np.zeros(D); c[7] = 3; docs["one word, length 3"] = c
    c = np.zeros(D); c[7] = 10_000; docs["one word repeated 10^4 times"] = c
    c = np.zeros(D); c[:3] = 1; docs["three distinct words"] = c
    c = np.ones(D); docs["every word once (many rare words)"] = c
    c = np.zeros(D); c[0] = 10**6; c[1:] = 1; docs["huge length, one dominant word"] = c
    c = np.zeros(D); c[[3, 4]] = [2, 1]; docs["length 3, one repeat"] = c
    c = np.full(D, 500.0); docs["huge length, flat"] = c
    return docs


def block_norm_changes(base: WhitenedSketch, doc: np.ndarray) -> dict[str, float]:
    with_doc = base.copy().update(csr(doc[None, :]))
    a, b = base.sums(), with_doc.sums()
    return {name: float(np.linalg.norm(np.ravel(getattr(b, name) - getattr(a, name))))
            for name in ("count", "m1", "z", "s1", "s2", "s3")}


@pytest.mark.parametrize("reference_length", [5, 20, 200])
@pytest.mark.parametrize("name,doc", list(adversarial_documents().items()))
def test_adversarial_document_changes_each_block_by_at_most_its_bound(name, doc, reference_length):
    rng = np.random.default_rng(0)
    # Q concentrated on the adversary's words maximises the whitened norms
    Q = random_basis(rng, D, 6)
    Q[:, 0] = 0; Q[7, 0] = 1.0
    Q = np.linalg.qr(Q)[0]
    clip = ClipBounds.for_length(reference_length)
    base = WhitenedSketch(Subspace(Q), clip).update(csr(random_documents(rng, 50, D)))
    bounds = block_sensitivities(clip)
    for block, change in block_norm_changes(base, doc).items():
        assert change <= bounds[block] * (1 + 1e-9), (name, block, change, bounds[block])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), L=st.floats(3, 400))
def test_random_documents_respect_bounds(seed, L):
    rng = np.random.default_rng(seed)
    d = 12
    Q = random_basis(rng, d, 4)
    clip = ClipBounds.for_length(L)
    base = WhitenedSketch(Subspace(Q), clip)
    doc = random_documents(rng, 1, d, max_count=int(rng.integers(1, 50)))[0]
    bounds = block_sensitivities(clip)
    for block, change in block_norm_changes(base, doc).items():
        assert change <= bounds[block] * (1 + 1e-9)


def test_unclipped_blocks_never_exceed_one_and_are_never_scaled(rng):
    docs = np.array(list(adversarial_documents().values()))
    sub = Subspace(random_basis(rng, D, 5))
    sk = WhitenedSketch(sub, ClipBounds.unclipped())
    for doc in docs:
        ch = block_norm_changes(sk, doc)
        assert max(ch.values()) <= 1 + 1e-12
    sk.update(csr(docs))
    # the documents wait as pending rows (a partial chunk): merging processes them
    done = WhitenedSketch(sub, ClipBounds.unclipped()).merge(sk)
    assert done.n_clipped == 0 and done.weight_sum == len(docs) == sk.sums().count


def test_norm_formulas_match_dense_definitions(rng):
    C = np.vstack([random_documents(rng, 20, 9, max_count=7), np.array(list(
        adversarial_documents().values()))[:, :9] + 0])
    C = C[C.sum(1) >= 3]
    X = csr(C)
    l = C.sum(1)
    Q = random_basis(rng, 9, 4)
    Y = X @ Q
    ex2 = [np.linalg.norm(ref.doc_e2(c)) for c in C]
    ex3 = [np.linalg.norm(ref.doc_e3(c)) for c in C]
    exz = [np.linalg.norm(ref.doc_e2(c) @ Q) for c in C]
    assert np.allclose(e2_norm(X, l), ex2, rtol=1e-10)
    assert np.allclose(e3_norm(X, l), ex3, rtol=1e-10)
    assert np.allclose(projected_e2_norm(X, l, Y, Q, np.sum(Q**2, 1)), exz, rtol=1e-10)


def test_warmup_contribution_is_clipped(rng):
    d = 30
    wu = WarmupSketch(d, 4, clip=1e-3, seed=1)
    before = wu.range_sum().copy()
    doc = np.zeros(d); doc[2] = 50
    wu.update(csr(doc[None, :]))
    assert np.linalg.norm(wu.range_sum() - before) <= 1e-3 * (1 + 1e-9)


def test_clip_bounds_validation():
    with pytest.raises(ValueError, match="reference length"):
        ClipBounds.for_length(2)
    with pytest.raises(ValueError, match="must be a finite number > 0"):
        ClipBounds(m1=1, z=0, s3=1, warmup=1)
