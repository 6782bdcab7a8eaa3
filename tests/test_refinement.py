"""Private refinement (streamdp.refinement, estimator.refine / fit, continual refinement).

Privacy promises tested here, each against an adversary:
- a document built to have maximal influence changes the released sums by at most the
  declared sensitivity, under every public model (including models that give its words
  probability zero) — the bound is by construction, not by a data-dependent clip;
- fit() with a row-count warm-up boundary charges the shift (sequential composition), and
  the accountant never lets any document's loss pass the budget;
- continual refinement spends exactly the planned node budget, no more.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

import streamdp
from streamdp import refinement as R
from streamdp import refinement_topics as RT
from streamdp.continual import EpochSums
from streamdp.empirical_bayes import npmle_posterior_mean
from streamdp.evaluation import topic_recovery_metrics
from streamdp.privacy.accountant import Accountant, BudgetExhausted
from streamdp.privacy.conversions import zcdp_rho
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.synthetic import make_lda_model, sample_documents
from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.sensitivity import block_sensitivities


@pytest.fixture(scope="module")
def lda():
    model = make_lda_model(60, 4, alpha0=1.0, beta=0.1, seed=3)
    X = sample_documents(model, 12_000, mean_length=40, seed=4)
    return model, X


def _random_model(rng, k, d, zeros=0.0):
    phi = rng.dirichlet(np.full(d, 0.3), size=k)
    if zeros:
        phi[rng.random(phi.shape) < zeros] = 0.0
        phi[:, 0] = 0.0                     # a word no topic can emit
        phi /= phi.sum(axis=1, keepdims=True)
    return R.RefinementModel(phi, rng.uniform(0.05, 2.0, size=k))


# ------------------------------------------------------------------ fold-in, brute force
def test_one_pass_from_the_true_topics_stays_at_the_truth():
    """Issue 22 item 4: on data that really is LDA, the refinement's E-step must not move the
    true topics (the exact posterior's expected counts have the true counts as expectation).
    The point estimate of θ that counted each token in its own prior (before CVB0) sharpened
    every topic: 0.0053 from the truth here, CVB0 0.0027 (the kernel's exactness against the
    written-out sweeps is tests/test_fold_in_kernel.py)."""
    model = make_lda_model(100, 5, alpha0=1.0, beta=0.05, seed=0)
    X = sample_documents(model, 100_000, mean_length=50, seed=10)
    T, n = R.RefinementModel(model.topics, model.alpha).contributions(X)
    assert n == X.shape[0]
    err = topic_recovery_metrics(model.topics, T / T.sum(axis=1, keepdims=True))["l2_mean"]
    assert err < 0.0040


def test_contributions_are_the_sum_of_per_document_contributions(rng):
    model = _random_model(rng, 4, 30)
    X = sp.csr_matrix(rng.poisson(0.5, size=(40, 30)).astype(float))
    T, n = model.contributions(X)
    ref = sum(model.contributions(X[i])[0] for i in range(X.shape[0]))
    np.testing.assert_allclose(T, ref, rtol=1e-10, atol=1e-12)
    assert n == int((np.asarray(X.sum(axis=1)).ravel() > 0).sum())
    # each document's expected counts are its own words only, with total mass l/‖c‖
    c = X[0].toarray().ravel()
    T0, _ = model.contributions(X[0])
    np.testing.assert_allclose(T0.sum(axis=0), c / np.linalg.norm(c), rtol=1e-10, atol=1e-14)


# ---------------------------------------------------------------- sensitivity (attacks)
@pytest.mark.parametrize("doc", ["one_word_many_times", "all_distinct", "long_mixed", "unemittable"])
def test_adversarial_document_moves_the_sums_by_at_most_the_sensitivity(rng, doc):
    k, d = 5, 40
    base = sp.csr_matrix(rng.poisson(0.4, size=(50, d)).astype(float))
    c = np.zeros(d)
    if doc == "one_word_many_times":
        c[3] = 10_000
    elif doc == "all_distinct":
        c[:] = 1
    elif doc == "long_mixed":
        c[:] = rng.integers(0, 500, size=d)
    else:
        c[0] = 7                             # word 0: probability 0 under every topic
    for zeros in (0.0, 0.6):
        for _ in range(5):
            model = _random_model(rng, k, d, zeros)
            with_doc = sp.vstack([base, sp.csr_matrix(c)]).tocsr()
            T1, _ = model.contributions(base)
            T2, _ = model.contributions(with_doc)
            change = np.linalg.norm(T2 - T1)
            assert change <= R.SENSITIVITY
    if doc == "one_word_many_times":
        # a one-word document concentrated on a single topic reaches the bound
        phi = np.full((k, d), 1.0 / d)
        phi[0, 3], phi[1:, 3] = 0.9, 1e-12
        phi /= phi.sum(axis=1, keepdims=True)
        T, _ = R.RefinementModel(phi, np.ones(k)).contributions(sp.csr_matrix(c))
        assert np.linalg.norm(T) == pytest.approx(1.0, rel=1e-6)


def test_planned_event_costs_exactly_its_share():
    e = R.plan_refinement(0.02)
    assert e.block == R.BLOCK and e.sensitivity == R.SENSITIVITY
    assert math.isclose(e.rho, 0.02, rel_tol=1e-12)
    with pytest.raises(ValueError):
        R.plan_refinement(0.0)


# -------------------------------------------------------------------------- denoising
def test_denoising_keeps_every_word_possible_and_the_strong_rows(rng):
    k, d = 4, 200
    truth = rng.dirichlet(np.full(d, 0.05), size=k)
    T = 5_000 * truth + rng.normal(0, 1.0, size=(k, d))
    B, nts = R.denoise_topic_word(T, 1.0)
    assert np.all(B > 0) and np.allclose(B.sum(axis=1), 1.0)
    assert np.abs(B - truth).sum(axis=1).max() < 0.05          # strong signal kept
    assert np.all(nts < 0.2)
    # a row that is pure noise falls back to the background and says so
    T[2] = rng.normal(0, 1.0, size=d)
    B, nts = R.denoise_topic_word(T, 1.0)
    bg = RT.eb_background(T, 1.0)
    assert np.abs(B[2] - bg).sum() < 0.05 and not nts[2] < 1
    snap = streamdp.TopicSnapshot(topic_word=B, alpha=np.ones(k), eigenvalues=np.ones(k), n_docs=1.0,
                                  privacy={}, mechanism="tensor", subspace_id="x",
                                  noise_to_signal=nts, stage="refined")
    assert "1 of 4 topics" in snap.quality_note


def _plain_james_stein(T, sd, floor=RT.FLOOR):
    """The published rule before js_eb, written out: b = cut column sums, rows T shrunk."""
    k, d = T.shape
    col = np.maximum(T.sum(axis=0) - 2.0 * sd * math.sqrt(k), 0.0)
    b = (1.0 - floor) * col / col.sum() + floor / d
    m = np.maximum(T.sum(axis=1), 0.0)
    D = T - m[:, None] * b[None, :]
    w = np.clip(1.0 - d * sd ** 2 / np.einsum("ij,ij->i", D, D), 0.0, 1.0) if sd > 0 else np.ones(k)
    S = np.maximum(m[:, None] * b[None, :] + w[:, None] * D, 0.0)
    S = (1.0 - floor) * S / S.sum(axis=1, keepdims=True) + floor * b[None, :]
    return S / S.sum(axis=1, keepdims=True)


def test_published_topics_shrink_empirical_bayes_rows_toward_the_eb_background(rng):
    """Issue 22 item 2 (js_eb): topic_i ∝ (1 − w_i)·m_i·b + w_i·EB(T_i), b the EB column sums.
    On sparse topics under noise it lands nearer the truth than the plain James–Stein shrink
    (whose rows keep the noise of every empty word); every word stays possible."""
    k, d, sd = 4, 1000, 9.0
    truth = rng.dirichlet(np.full(d, 0.05), size=k)
    T = 20_000 * truth + rng.normal(0, sd, size=(k, d))
    B, nts = R.denoise_topic_word(T, sd)
    assert np.all(B > 0) and np.allclose(B.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    js = _plain_james_stein(T, sd)
    err, err_js = np.abs(B - truth).sum(axis=1), np.abs(js - truth).sum(axis=1)
    assert np.all(err < 0.6 * err_js)                          # measured ≈ 0.13 vs 0.28
    # the formula, from its parts: JS weights against the EB background, EB rows, the floor
    b = RT.eb_background(T, sd)
    m, _, _, w = RT.james_stein_weights(T, sd, b)
    rows = np.array([npmle_posterior_mean(row, sd) for row in T])
    S = (1.0 - w)[:, None] * m[:, None] * b[None, :] + w[:, None] * rows
    S = (1.0 - RT.FLOOR) * S / S.sum(axis=1, keepdims=True) + RT.FLOOR * b[None, :]
    np.testing.assert_allclose(B, S / S.sum(axis=1, keepdims=True), rtol=1e-12, atol=1e-15)
    # noise_to_signal keeps its meaning: the JS weight is 1 / (1 + nts²)
    np.testing.assert_allclose(w, 1.0 / (1.0 + nts ** 2), rtol=1e-9)


def test_without_noise_the_published_topics_are_as_before(rng):
    """σ = 0 (non-private): the positive part of T, the cut background's floor: bit for bit."""
    T = 3_000 * rng.dirichlet(np.full(50, 0.1), size=3) + rng.normal(0, 0.5, size=(3, 50))
    B, nts = R.denoise_topic_word(T, 0.0)
    np.testing.assert_array_equal(
        B, RT.shrink_topic_word(T, 0.0, R.background_distribution(T, 0.0), T)[0])
    np.testing.assert_allclose(B, _plain_james_stein(T, 0.0), rtol=1e-12, atol=1e-15)
    assert np.all(nts == 0.0)


def test_published_topics_read_only_the_sums_and_sd(rng, monkeypatch):
    """Post-processing (docs/privacy.md): deterministic in (T, σ), no draws, no budget."""
    T = 500 * rng.dirichlet(np.full(300, 0.1), size=5) + rng.normal(0, 2.0, size=(5, 300))
    first = R.refined_topics(T, 2.0, 1.0)

    def no_draws(*a, **k):
        raise AssertionError("published topics must not draw random numbers")

    monkeypatch.setattr(np.random, "default_rng", no_draws)
    monkeypatch.setattr(np.random, "normal", no_draws)
    again = R.refined_topics(T.copy(), 2.0, 1.0)
    for x, y in zip(first, again):
        np.testing.assert_array_equal(x, y)


def test_sparse_topic_rule_picks_rows_whose_mass_stands_above_the_noise(rng):
    """Issue 22 item 4: a sparse topic (most of its mass in words far above the noise) is
    published hard-thresholded, closer to the truth than the shrink toward the background; a
    row of real-text shape (mass spread below the noise) and a row of little mass keep the
    James–Stein estimate; without noise both estimates are the same."""
    k, d, sd = 3, 1000, 9.0
    truth = rng.dirichlet(np.full(d, 0.05), size=k)            # synthetic LDA's topics
    truth[1] = rng.dirichlet(np.full(d, 1.0))                  # flat, like real text at ε ≤ 4
    T = 120_000 * truth + rng.normal(0, sd, size=(k, d))
    T[1] = 12_000 * truth[1] + rng.normal(0, sd, size=d)       # its words ≈ 12 each, σ = 9
    T[2] = 600 * truth[2] + rng.normal(0, sd, size=d)          # little mass: noise-dominated
    tw, _, _, fold_in = R.refined_topics(T, sd, 1.0)
    js, _ = R.denoise_topic_word(T, sd)
    _, sparse = R.sparse_topic_word(T, sd)
    assert sparse.tolist() == [True, False, False]
    assert np.all(tw > 0) and np.allclose(tw.sum(axis=1), 1.0)
    assert np.linalg.norm(tw[0] - truth[0]) < 0.75 * np.linalg.norm(js[0] - truth[0])   # 0.61×
    assert np.array_equal(tw[1:], js[1:]) and np.array_equal(fold_in[0], tw[0])
    # σ = 0: the rule's estimate is the James–Stein one (both: T's positive part + the floor)
    exact = 120_000 * truth
    np.testing.assert_allclose(R.refined_topics(exact, 0.0, 1.0)[0],
                               R.denoise_topic_word(exact, 0.0)[0], rtol=1e-12, atol=1e-15)


def test_refinement_sketch_merges_and_round_trips(rng):
    model = _random_model(rng, 3, 20)
    X = sp.csr_matrix(rng.poisson(0.6, size=(30, 20)).astype(float))
    a = R.RefinementSketch(3, 20).update(X[:10], model)
    b = R.RefinementSketch(3, 20).update(X[10:], model)
    whole = R.RefinementSketch(3, 20).update(X, model)
    merged = a.merge(b)
    np.testing.assert_allclose(merged.sums, whole.sums, rtol=1e-12)
    assert merged.n_docs == whole.n_docs
    back = R.RefinementSketch.from_dict(merged.to_dict())
    np.testing.assert_array_equal(back.sums, merged.sums)


# -------------------------------------------------------------------------- estimator
def _fit(X, eps, **kw):
    n = X.shape[0]
    ts = np.r_[np.zeros(n // 3), np.ones(n - n // 3)]
    return streamdp.fit(X, 4, epsilon=eps, delta=1e-6, seed=0, noise_seed=5, sampler="fast",
                        timestamps=ts, stream_start=0.5, **kw)


def test_fit_refines_and_spends_exactly_the_stream_budget(lda):
    model, X = lda
    acc = Accountant(2.0, 1e-6, MemoryLedger())
    snap = _fit(X, 2.0, accountant=acc)
    assert snap.stage == "refined" and snap.noise_to_signal.shape == (4,)
    assert np.all(snap.topic_word > 0) and np.allclose(snap.topic_word.sum(axis=1), 1)
    rho = zcdp_rho(2.0, 1e-6)
    rep = acc.report()
    # warm-up and stream are disjoint partitions (timestamp boundary): each at most ρ
    assert math.isclose(snap.privacy["rho_stream_spent"], rho, rel_tol=1e-9)
    assert rep["rho_worst_case"] <= rho * (1 + 1e-9)
    assert math.isclose(rep["rho_by_atom"]["stream_every_epoch"], rho, rel_tol=1e-9)
    assert math.isclose(rep["rho_by_atom"]["warmup"], rho, rel_tol=1e-9)
    blocks = [e["block"] for e in snap.privacy["stream_events"]]
    assert blocks.count(R.BLOCK) == streamdp.RefinementConfig().passes
    assert "z" not in blocks           # the spectral start buys k'-space blocks only
    with pytest.raises(BudgetExhausted):
        _ = acc.reserve([R.plan_refinement(rho * 0.01)], label="more")


def test_refined_topics_keep_their_identity_and_recover_the_truth(lda):
    model, X = lda
    n = X.shape[0]
    est = streamdp.StreamingSpectralLDA(4, 1.0, epsilon=None, seed=0)
    est.warmup(X[: n // 3])
    est.partial_fit(X[n // 3:])
    start = est.release(split=None)
    refined = est.refine(X[n // 3:])
    # topic i of the refinement continues topic i of the model it started from
    D = np.abs(refined.topic_word[:, None, :] - start.topic_word[None, :, :]).sum(axis=2)
    assert np.all(D.argmin(axis=1) == np.arange(4))
    err = topic_recovery_metrics(model.topics, refined.topic_word)["l2_mean"]
    assert err < 0.03


def test_refine_needs_a_release_and_budget(lda):
    _, X = lda
    est = streamdp.StreamingSpectralLDA(4, 1.0, epsilon=1.0, seed=0, noise_seed=1, sampler="fast")
    est.warmup(X[:4000])
    est.partial_fit(X[4000:])
    with pytest.raises(ValueError, match="release"):
        est.refine(X[4000:])
    est.release()                                   # the whole stream budget
    with pytest.raises(BudgetExhausted):
        est.refine(X[4000:])


def test_count_boundary_is_charged_to_the_stream(lda):
    """An added row shifts another across a row-count boundary: the warm-up is paid by
    stream documents too, at replace sensitivity, and the total stays within ρ."""
    _, X = lda
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    snap = streamdp.fit(X, 4, epsilon=1.0, delta=1e-6, warmup_docs=4000, seed=0, noise_seed=2,
                        sampler="fast", non_production=True, accountant=acc)
    rho = zcdp_rho(1.0, 1e-6)
    rep = acc.report()
    assert set(rep["rho_spent_by_partition"]) == {"stream"}
    assert rep["rho_by_atom"]["warmup"] == 0.0
    assert math.isclose(rep["rho_worst_case"], rho, rel_tol=1e-9)
    assert snap.privacy["warmup_boundary"] == "count"
    warm = [e for e in snap.privacy["warmup"] if e["block"] == "warmup"][0]
    assert warm["partition"] == "stream"
    # replace sensitivity: twice the add/remove clip of the range finder
    clip = ClipBounds.from_dict(snap.privacy["clip_bounds"])
    assert math.isclose(warm["sensitivity"], 2 * block_sensitivities(clip)["warmup"], rel_tol=1e-9)
    with pytest.raises(ValueError, match="either warmup_docs"):
        streamdp.fit(X, 4, warmup_docs=10, timestamps=np.zeros(X.shape[0]), stream_start=1.0)


# -------------------------------------------------------------------------- continual
def test_continual_refinement_is_refined_after_the_model_lag_and_within_budget(lda):
    model, X = lda
    n = X.shape[0]
    acc = Accountant(4.0, 1e-6, MemoryLedger())
    clock = streamdp.EpochClock(0.0, 10.0)
    est = streamdp.StreamingSpectralLDA(4, 1.0, epsilon=4.0, seed=0, noise_seed=3, sampler="fast",
                                        epochs=clock, horizon=4, accountant=acc)
    est.warmup(X[:3000])
    per = (n - 3000) // 4
    snaps = []
    for t in range(4):
        rows = slice(3000 + t * per, 3000 + (t + 1) * per)
        est.partial_fit(X[rows], np.full(per, 10.0 * t + 5.0))
        snaps += est.close_epochs(10.0 * (t + 1))
    # lag L = 2: epochs 1, 2 have no model; epoch 3 is folded into snapshot 1, epoch 4 into 2
    assert [s.stage for s in snaps] == ["spectral", "spectral", "refined", "refined"]
    assert est.refinement.model_lag == 2
    for a, b in [(snaps[0], snaps[2]), (snaps[2], snaps[3])]:
        D = np.abs(b.topic_word[:, None, :] - a.topic_word[None, :, :]).sum(axis=2)
        assert np.mean(D.argmin(axis=1) == np.arange(4)) >= 0.75
    rep = acc.report()
    assert rep["rho_worst_case"] <= zcdp_rho(4.0, 1e-6) * (1 + 1e-9)
    # every node charged the refinement block too
    assert any(e["block"] == R.BLOCK for e in snaps[-1].privacy["node_events"])
    # state round trip keeps the refinement sums and the public refined-epoch count
    state = est.continual_.state_dict()
    assert state["refined_epochs"] == 2
    again = streamdp.ContinualRelease(est.subspace_, est.clip, n_topics=4, alpha0=1.0,
                                      rho=est.stream_rho_, horizon=4,
                                      split=streamdp.BudgetSplit.spectral_start(),
                                      sampler=est.sampler, refinement=est.refinement)
    again.load_state(state)
    assert again.refined_epochs == 2 and again.epoch == 4


def test_epoch_sums_add_and_round_trip(rng):
    from streamdp.continual import zero_sums
    from streamdp.whitening.subspace import Subspace
    Q, _ = np.linalg.qr(rng.normal(size=(10, 3)))
    sub = Subspace(Q)
    a = EpochSums(zero_sums(sub), rng.normal(size=(2, 10)))
    b = EpochSums(zero_sums(sub), rng.normal(size=(2, 10)))
    c = a + b
    np.testing.assert_allclose(c.refine, a.refine + b.refine)
    back = EpochSums.from_dict(c.to_dict())
    np.testing.assert_array_equal(back.refine, c.refine)
    with pytest.raises(ValueError):
        _ = a + EpochSums(zero_sums(sub))
