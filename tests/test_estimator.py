"""The public estimator API: validation, budget use, snapshots."""
import numpy as np
import pytest

import streamdp
from streamdp import ClipBounds, StreamingSpectralLDA, TopicSnapshot
from streamdp.privacy.accountant import BudgetExhausted
from streamdp.privacy.conversions import zcdp_rho
from streamdp.synthetic import make_lda_model, sample_documents
from streamdp.whitening.warmup import WarmupSketch


@pytest.fixture(scope="module")
def small():
    model = make_lda_model(120, 4, alpha0=1.0, beta=0.1, seed=3)
    return model, sample_documents(model, 12_000, mean_length=40, seed=4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(n_topics=0), "n_topics"),
    (dict(n_topics=3, alpha0=-1), "alpha0"),
    (dict(n_topics=3, epsilon=0), "epsilon"),
    (dict(n_topics=3, epsilon=1, delta=1.5), "delta"),
    (dict(n_topics=3, mechanism="magic"), "mechanism"),
    (dict(n_topics=3, epsilon=1, clip_quantile=0), "clip_quantile"),
    (dict(n_topics=3, n_restarts=0), "n_restarts"),
    (dict(n_topics=3, threshold=-1), "threshold"),
    (dict(n_topics=3, seed="x"), "seed"),
])
def test_invalid_parameters_say_what_to_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StreamingSpectralLDA(**kwargs)


def test_fit_argument_errors(small):
    _, X = small
    with pytest.raises(ValueError, match="warmup_docs"):
        streamdp.fit(X, 4, warmup_docs=0)
    with pytest.raises(ValueError, match="no stream documents"):
        streamdp.fit(X, 4, warmup_docs=X.shape[0])
    with pytest.raises(ValueError, match="exceeds the vocabulary size"):
        streamdp.fit(X, 200, warmup_docs=100, oversampling=0)


def test_order_of_calls_is_enforced(small):
    _, X = small
    est = StreamingSpectralLDA(4)
    with pytest.raises(ValueError, match="warmup"):
        est.partial_fit(X[:10])
    with pytest.raises(ValueError, match="nothing to release"):
        est.release()
    est.warmup(X[:1000]).warmup(X[1000:2000])       # repeatable
    assert est.subspace_dim_ == 8
    est.partial_fit(X[2000:3000])
    with pytest.raises(ValueError, match="fixed"):
        est.warmup(X[:10])


def test_fit_returns_simplex_rows_and_alpha(small):
    model, X = small
    snap = streamdp.fit(X, 4, alpha0=1.0, epsilon=1.0, delta=1e-6, warmup_docs=4000, seed=1)
    assert isinstance(snap, TopicSnapshot)
    assert snap.topic_word.shape == (4, 120) and snap.alpha.shape == (4,)
    assert np.all(snap.topic_word >= 0)
    assert np.allclose(snap.topic_word.sum(axis=1), 1.0)
    assert np.all(snap.alpha > 0)


def test_private_release_spends_exactly_the_budget_per_partition(small):
    _, X = small
    est = StreamingSpectralLDA(4, epsilon=2.0, delta=1e-6, seed=0, noise_seed=1)
    est.warmup(X[:4000]).partial_fit(X[4000:])
    snap = est.release()
    rho = zcdp_rho(2.0, 1e-6)
    # the release's draw and its premise check (PREMISE_SHARE of the release's ρ) share the stream
    released = snap.privacy["rho_by_partition"]["stream"] + snap.privacy["premise_check"]["rho"]
    assert set(snap.privacy["rho_by_partition"]) == {"stream"}
    assert released == pytest.approx(rho, rel=1e-9)
    warm = sum(e["rho"] for e in snap.privacy["warmup"])
    # the range finder and its premise check (PREMISE_SHARE of its ρ) share the non-clip part
    warm += snap.privacy["warmup_premise_check"]["rho"]
    assert warm == pytest.approx(rho * (1 - est.clip_budget_share), rel=1e-9)
    # the clip histogram took the rest of the warm-up share
    report = est.accountant.report()
    assert report is not None
    # a second full release would exceed the stream budget: refused, nothing drawn
    with pytest.raises(BudgetExhausted):
        est.release()


def test_partial_releases_share_the_budget(small):
    _, X = small
    est = StreamingSpectralLDA(4, epsilon=2.0, seed=0, noise_seed=1)
    est.warmup(X[:4000]).partial_fit(X[4000:])
    est.release(budget_fraction=0.5)
    est.release(budget_fraction=0.5)
    with pytest.raises(BudgetExhausted):
        est.release(budget_fraction=0.01)


def test_auto_clip_bounds_come_from_the_warmup(small):
    _, X = small
    est = StreamingSpectralLDA(4, epsilon=4.0, seed=0, noise_seed=2)
    est.warmup(X[:4000]).partial_fit(X[4000:])
    assert est.clip.m1 < 1 and est.clip.z < 1 and est.clip.s3 < 1
    assert est.sketch_.n_clipped / est.sketch_.n_docs < 0.2
    explicit = StreamingSpectralLDA(4, epsilon=4.0, clip=ClipBounds.for_length(10))
    assert explicit.clip == ClipBounds.for_length(10)


def test_non_private_warmup_recovers_exact_low_rank_range():
    model = make_lda_model(50, 3, alpha0=1.0, beta=0.2, seed=0)
    X = sample_documents(model, 200_000, mean_length=30, seed=1)
    wu = WarmupSketch(50, 6, clip=1.0, seed=0).update(X)
    Q = wu.subspace(None).Q
    cap = np.linalg.norm(Q.T @ model.topics.T, axis=0) / np.linalg.norm(model.topics, axis=1)
    assert cap.min() > 0.99


def test_snapshot_round_trip(small):
    _, X = small
    snap = streamdp.fit(X, 4, epsilon=None, warmup_docs=3000, seed=0)
    back = TopicSnapshot.from_bytes(snap.to_bytes())
    assert np.array_equal(back.topic_word, snap.topic_word)
    assert np.array_equal(back.alpha, snap.alpha)
    assert back.privacy == snap.privacy and back.release_id == snap.release_id
    words = [f"w{i}" for i in range(120)]
    top = back.top_words(words, 5)
    assert len(top) == 4 and len(top[0]) == 5 and top[0][0][1] >= top[0][1][1]


def test_warmup_sketch_merge_and_serialisation(small):
    _, X = small
    a = WarmupSketch(120, 8, clip=1e-3, seed=5).update(X[:3000])
    b = WarmupSketch(120, 8, clip=1e-3, seed=5).update(X[3000:6000])
    whole = WarmupSketch(120, 8, clip=1e-3, seed=5).update(X[:6000])
    a.merge(b)
    assert np.allclose(a.range_sum(), whole.range_sum(), rtol=1e-12, atol=1e-18)
    assert np.array_equal(a.norm_hist, whole.norm_hist)
    back = WarmupSketch.from_bytes(a.to_bytes())
    assert back.to_bytes() == a.to_bytes()
