"""The private clustering start and the public start (issue 22; streamdp.cluster_start,
streamdp.start).

Privacy promises tested here, each against an adversary:
- a document built for maximal influence (one word repeated, a word on Q's largest row, a
  long document, a document the rounding pushes past norm 1) adds at most the declared
  sensitivity to the cluster sums, the counts and the mapping sum, and never changes another
  document's cluster (assignments read only that document and released values);
- every draw of the start goes through the accountant, and a fit spends exactly the stream ρ;
- a public start spends nothing on the start and says so in the report;
- the start rule reads only a noised count, ρ and the public shape.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

import streamdp
from streamdp import cluster_start as C
from streamdp import refinement as R
from streamdp.privacy.accountant import Accountant
from streamdp.privacy.conversions import zcdp_rho
from streamdp.privacy.plan import PREMISE_BLOCK
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.sensitivity import block_sensitivities
from streamdp.moments.clipping import ClipBounds
from streamdp import PublicStart
from streamdp.start import TENSOR_MIN_INDEX, choose_start, tensor_index
from streamdp.synthetic import make_lda_model, sample_documents


@pytest.fixture(scope="module")
def lda():
    model = make_lda_model(60, 4, alpha0=1.0, beta=0.1, seed=3)
    X = sample_documents(model, 6_000, mean_length=40, seed=4)
    return model, X


def _basis(rng, d=60, kp=8):
    Q, _ = np.linalg.qr(rng.standard_normal((d, kp)))
    return Q


def _adversarial_documents(Q):
    d = Q.shape[0]
    top = int(np.argmax(np.einsum("ij,ij->i", Q, Q)))       # the word Q weights most
    docs = [np.eye(d)[top] * 10 ** 6,                       # one word, repeated a million times
            np.ones(d) * 1e9,                               # every word, huge counts
            np.eye(d)[top] * 2 ** 52 + np.ones(d),          # counts at float64's integer limit
            np.r_[np.full(d // 2, 3.0), np.zeros(d - d // 2)]]
    return sp.csr_matrix(np.vstack(docs))


def test_sensitivities_are_the_clip_plus_rounding_headroom():
    s = block_sensitivities(ClipBounds.unclipped())
    for block in (C.SUMS_BLOCK, C.COUNTS_BLOCK, C.MOMENT_BLOCK):
        # clip 1, no magnitude factor (the summands are the clipped vectors themselves, or y yᵀ)
        assert s[block] == s["topic_word"] and 1.0 < s[block] < 1.02
    ev = C.plan_iteration(0.01, 0.2)
    assert [e.block for e in ev] == [C.SUMS_BLOCK, C.COUNTS_BLOCK]
    assert math.isclose(sum(e.rho for e in ev), 0.01, rel_tol=1e-12)
    ev = C.plan_centre(0.01, 0.2)
    assert [e.block for e in ev] == [C.SUMS_BLOCK, C.COUNTS_BLOCK, C.MOMENT_BLOCK]
    assert math.isclose(sum(e.rho for e in ev), 0.01, rel_tol=1e-12)


def test_a_maximal_document_moves_each_released_sum_by_at_most_its_sensitivity(rng):
    Q = _basis(rng)
    model = make_lda_model(60, 4, alpha0=1.0, beta=0.1, seed=1)
    base = sample_documents(model, 500, mean_length=30, seed=2)
    adv = _adversarial_documents(Q)
    sens = C.cluster_sensitivities()
    Y, _ = C.project(adv, Q)
    assert np.all(np.linalg.norm(Y, axis=1) <= 1.0)
    # the centre draw: Σy, the count and Σ y yᵀ each move by at most their sensitivity
    Sy0, c0, M0, _ = C.centre_sums([base], Q)
    for i in range(adv.shape[0]):
        D1 = sp.vstack([base[:250], adv[i], base[250:]], format="csr")
        Sy1, c1, M1, _ = C.centre_sums([D1], Q)
        assert np.linalg.norm(Sy1 - Sy0) <= sens[C.SUMS_BLOCK]
        assert np.linalg.norm(c1 - c0) <= sens[C.COUNTS_BLOCK]
        assert np.linalg.norm(M1 - M0) <= sens[C.MOMENT_BLOCK]
    # a centred, whitened rule from (noised) released values, or any public frame: u(y) has
    # norm <= 1, the adversary's own point included (the centre itself maps to 0)
    centre, frame, radius = C.centred_frame(Sy0 + 0.5, c0 + 3, M0 + rng.standard_normal(M0.shape),
                                            1.0, 4, with_radius=True)
    assert radius > 0
    for f in (frame, 1e6 * rng.standard_normal(frame.shape)):
        for r in (0.0, radius, 1e-12, 1e12):        # the released radius, or any other
            U = C.Assignment.random(4, Q.shape[1], 0, centre, f, r).summand(
                np.vstack([Y, centre[None, :]]))
            assert np.all(np.linalg.norm(U, axis=1) <= 1.0) and not U[-1].any()
    whitened = C.Assignment.random(4, Q.shape[1], 0, centre, frame, radius)
    for rule in (C.Assignment.random(4, Q.shape[1], 0), whitened,
                 C.Assignment(np.linalg.qr(rng.standard_normal((8, 4)))[0].T, 0.1 * np.ones(8))):
        S0, n0, _ = C.cluster_sums([base], Q, rule)
        lab0 = rule.labels(C.project(base, Q)[0])
        for i in range(adv.shape[0]):
            D1 = sp.vstack([base[:250], adv[i], base[250:]], format="csr")
            S1, n1, _ = C.cluster_sums([D1], Q, rule)
            lab1 = rule.labels(C.project(D1, Q)[0])
            assert np.array_equal(np.delete(lab1, 250), lab0)     # nobody else moves
            assert np.linalg.norm(S1 - S0) <= sens[C.SUMS_BLOCK]
            assert np.linalg.norm(n1 - n0) <= sens[C.COUNTS_BLOCK]
            # the mapping pass: one-hot refinement terms of norm <= 1
            vals, _ = C.ClusterMappingModel(Q, rule).document_terms(adv[i:i + 1])
            assert np.linalg.norm(vals) <= 1.0 + 1e-12
            assert np.count_nonzero(np.abs(vals).sum(axis=0)) == 1


def _fit(X, eps, **kw):
    n = X.shape[0]
    ts = np.r_[np.zeros(n // 3), np.ones(n - n // 3)]
    kw.setdefault("seed", 0)
    return streamdp.fit(X, 4, epsilon=eps, delta=1e-6, noise_seed=5, sampler="fast",
                        non_production=True, timestamps=ts, stream_start=0.5, **kw)


def test_the_cluster_start_charges_every_draw_and_spends_exactly_the_stream_budget(lda):
    model, X = lda
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    cfg = streamdp.ClusterStartConfig(iterations=3)
    snap = _fit(X, 1.0, accountant=acc, start="cluster", cluster_start=cfg)
    rho = zcdp_rho(1.0, 1e-6)
    blocks = [e["block"] for e in snap.privacy["stream_events"]]
    # the centre draw (Σy, n, Σ y yᵀ) and 3 Lloyd iterations (S, n)
    assert blocks.count(C.SUMS_BLOCK) == blocks.count(C.COUNTS_BLOCK) == 1 + 3
    assert blocks.count(C.MOMENT_BLOCK) == 1
    # the mapping pass and the refinement passes are topic_word sums
    assert blocks.count(R.BLOCK) == 1 + streamdp.RefinementConfig().passes
    assert "s3" not in blocks                       # no tensor was released
    assert math.isclose(snap.privacy["rho_stream_spent"], rho, rel_tol=1e-9)
    assert math.isclose(acc.report()["rho_by_atom"]["stream_every_epoch"], rho, rel_tol=1e-9)
    assert snap.privacy["start"]["kind"] == "cluster"
    assert np.all(snap.topic_word > 0) and np.allclose(snap.topic_word.sum(axis=1), 1)


def test_the_cluster_start_is_deterministic_given_its_seeds_and_finds_the_topics(lda):
    model, X = lda
    a = _fit(X, 4.0, start="cluster")
    b = _fit(X, 4.0, start="cluster")
    assert np.array_equal(a.topic_word, b.topic_word)
    c = _fit(X, 4.0, start="cluster", seed=1)
    assert not np.array_equal(a.topic_word, c.topic_word)
    from streamdp.evaluation import topic_recovery_metrics
    err = topic_recovery_metrics(model.topics, a.topic_word)
    assert err["l1_mean"] < 0.3                      # the 4 topics are found, not background


def test_a_public_start_spends_nothing_and_is_reported_as_public_input(lda):
    model, X = lda
    public = sample_documents(model, 2_000, mean_length=40, seed=9)     # "their help pages"
    ps = PublicStart.fit(public, 4, source="help pages", seed=0)
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    snap = _fit(X, 1.0, accountant=acc, start=ps)
    rho = zcdp_rho(1.0, 1e-6)
    blocks = [e["block"] for e in snap.privacy["stream_events"]]
    # only the passes draw (each after its premise check, PREMISE_SHARE of the pass's ρ)
    assert blocks == [PREMISE_BLOCK, R.BLOCK] * streamdp.RefinementConfig().passes
    assert math.isclose(snap.privacy["rho_stream_spent"], rho, rel_tol=1e-9)
    rep = snap.privacy["public_start"]
    assert rep["public_input"] and rep["rho"] == 0.0 and rep["source"] == "help pages"
    assert rep["n_public_docs"] == 2_000
    with pytest.raises(ValueError, match="source"):
        PublicStart(ps.topic_word, ps.alpha, source=" ")
    with pytest.raises(ValueError, match="shape"):
        _fit(X, 1.0, start=PublicStart(ps.topic_word[:3], ps.alpha[:3], source="x"))


def test_the_start_rule_reads_a_noised_count_and_the_public_shape(lda):
    assert choose_start(200_000, zcdp_rho(1, 1e-6), 10, 20)["start"] == "tensor"
    assert choose_start(38_700, zcdp_rho(4, 1e-6), 20, 40)["start"] == "cluster"
    assert choose_start(10, None, 20, 40)["start"] == "tensor"       # non-private: exact
    assert tensor_index(-5, 1.0, 2, 2) == 0.0
    # the threshold in documents at ε = 1, k = 20, k' = 40
    n = TENSOR_MIN_INDEX * 20 * 40 ** 1.5 / math.sqrt(2 * zcdp_rho(1, 1e-6))
    assert choose_start(n * 1.01, zcdp_rho(1, 1e-6), 20, 40)["start"] == "tensor"
    assert choose_start(n * 0.99, zcdp_rho(1, 1e-6), 20, 40)["start"] == "cluster"
    model, X = lda
    acc = Accountant(1.0, 1e-6, MemoryLedger())
    snap = _fit(X[:1500], 1.0, accountant=acc)                   # auto, a small stream
    assert snap.privacy["start"]["choice"]["start"] == "cluster"
    assert "count" in [e["block"] for e in snap.privacy["stream_events"]]
    assert math.isclose(snap.privacy["rho_stream_spent"], zcdp_rho(1, 1e-6), rel_tol=1e-9)
    big = _fit(X, 8.0)                                            # auto, the whole stream: tensor
    assert big.privacy["start"]["kind"] == "tensor"
    assert big.privacy["start"]["choice"]["index"] >= TENSOR_MIN_INDEX


def test_bad_start_arguments_fail_with_a_message():
    with pytest.raises(ValueError, match="start must be"):
        streamdp.StreamingSpectralLDA(4, start="kmeans", non_private=True)
    with pytest.raises(ValueError, match="iterations"):
        streamdp.ClusterStartConfig(iterations=0)
    for bad in (1.0, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match="centre_share"):
            streamdp.ClusterStartConfig(centre_share=bad)


def test_without_the_centre_draw_the_start_spends_nothing_on_it(lda):
    """centre_share=0: no centre draw (no Σ y yᵀ released), the Lloyd rounds get the budget."""
    model, X = lda
    snap = _fit(X, 1.0, start="cluster", cluster_start=streamdp.ClusterStartConfig(centre_share=0.0))
    blocks = [e["block"] for e in snap.privacy["stream_events"]]
    iterations = streamdp.ClusterStartConfig().iterations
    assert C.MOMENT_BLOCK not in blocks and blocks.count(C.SUMS_BLOCK) == iterations
    assert math.isclose(snap.privacy["rho_stream_spent"], zcdp_rho(1, 1e-6), rel_tol=1e-9)


def _topics_found(X, Q, model, rule, rng, sd, k, n_shared):
    """Four noised Lloyd iterations from ``rule``; how many topics have a cluster whose
    documents' words (the shared words left out) are mostly that topic's."""
    for _ in range(4):
        S_j, n_j, _ = C.cluster_sums([X], Q, rule)
        rule = C.Assignment.from_released(S_j + rng.normal(0, sd, S_j.shape),
                                          n_j + rng.normal(0, sd, n_j.shape), rule)
    labels = rule.labels(C.project(X, Q)[0])
    D = X.toarray()
    T = np.zeros((k, X.shape[1]))
    np.add.at(T, labels, D / np.linalg.norm(D, axis=1, keepdims=True))
    T[:, :n_shared] = 0                                 # the shared words tell no topic apart
    match = (T / np.maximum(T.sum(axis=1, keepdims=True), 1e-300)) @ model.topics.T
    return len(set(np.argmax(match, axis=1)))


def test_documents_sharing_a_dominant_direction_are_spread_over_the_clusters():
    """Issue 22 (movie reviews, 2.3/20 distinct at ε = 4): every document shares the corpus's
    frequent words, so y = Qᵀc/‖c‖ points mostly along one shared direction; the first
    assignment by random directions put the documents in one or two clusters, whose noised
    centres then decide little (here: all of them in two). The centre draw removes the shared
    direction and the Lloyd sums add unit vectors: the clusters start balanced."""
    d, k, sd = 120, 8, 8.0                              # sd: the released values' noise
    model = make_lda_model(d, k, alpha0=1.0, beta=0.05, seed=11)
    found = []
    for seed in range(4):
        rng = np.random.default_rng(seed)
        X = sample_documents(model, 4_000, mean_length=12, seed=12).toarray()
        background = np.zeros(d)
        background[:6] = [6, 5, 4, 3, 2, 2]              # every document's frequent words, ×3
        X = sp.csr_matrix(X + rng.poisson(3 * background, size=X.shape))
        Q, _ = np.linalg.qr(np.c_[model.topics.T, background, rng.standard_normal((d, 3))])
        uncentred = C.Assignment.random(k, Q.shape[1], 0)          # the rule before the fix
        _, counts, _ = C.cluster_sums([X], Q, uncentred)
        assert np.sort(counts)[-2:].sum() > 0.9 * X.shape[0]       # the collapse (measured: 100%)
        S, n, M, _ = C.centre_sums([X], Q)
        centre, frame = C.centred_frame(S + rng.normal(0, sd, S.shape), n + rng.normal(0, sd),
                                        M + rng.normal(0, sd, M.shape), sd, k)
        rule = C.Assignment.random(k, Q.shape[1], 0, centre, frame)
        _, counts, _ = C.cluster_sums([X], Q, rule)
        # balanced from the first assignment (measured: largest cluster 19% of the documents)
        assert counts.max() < 0.3 * X.shape[0] and counts.min() > 0.02 * X.shape[0]
        found.append(_topics_found(X, Q, model, rule, rng, sd, k, 6))
    # and the noised Lloyd iterations from there give (nearly) every topic a cluster
    # (measured: 7, 8, 7, 8 of 8)
    assert min(found) >= k - 1


def test_summand_radius_weighs_documents_near_the_centre_less():
    """With the released radius, a document near the centre (only the corpus background) adds a
    vector shorter than one far out; without it (radius 0) both add unit vectors. The radius is
    RADIUS_RMS_LOW_NOISE (no noise here) times the root-mean-square norm the released
    covariance implies."""
    rng = np.random.default_rng(3)
    kp, n = 6, 4000
    Y = 0.3 + 0.05 * rng.standard_normal((n, kp)) * np.arange(1, kp + 1)
    centre, frame, radius = C.centred_frame(Y.sum(axis=0, keepdims=True), np.array([float(n)]),
                                            Y.T @ Y, 0.0, 8, with_radius=True)
    V = (Y - centre) @ frame
    rms = np.sqrt(np.mean(np.einsum("ij,ij->i", V, V)))
    assert radius == pytest.approx(C.RADIUS_RMS_LOW_NOISE * rms, rel=1e-6)
    near, far = centre + 0.01 * (Y[0] - centre), centre + 10 * (Y[0] - centre)
    weighted = C.Assignment.random(8, kp, 0, centre, frame, radius).summand(np.vstack([near, far]))
    unit = C.Assignment.random(8, kp, 0, centre, frame).summand(np.vstack([near, far]))
    assert np.allclose(np.linalg.norm(unit, axis=1), 1.0)
    assert np.linalg.norm(weighted[0]) < 0.05 and np.linalg.norm(weighted[1]) == pytest.approx(1.0)
    # the same direction: only the weight changes
    assert np.allclose(weighted / np.linalg.norm(weighted, axis=1, keepdims=True), unit)


def test_summand_radius_is_larger_when_the_released_noise_is_small():
    """The radius multiplier is a rule of the centre draw's released noise-to-signal (the
    noise's spectral norm σ_M√(2k′)/n over the covariance's largest eigenvalue): at most
    NOISE_TO_SIGNAL_SMALL gives RADIUS_RMS_LOW_NOISE, above it RADIUS_RMS. The spectrum has no
    eigenvalue between 0.2 and 0.4 of the largest, so the two noise levels just either side of
    the threshold read the same spiked spectrum and only the multiplier changes."""
    rng = np.random.default_rng(5)
    kp, n = 8, 20000
    scales = np.array([1.0, 0.9, 0.8, 0.7, 0.15, 0.1, 0.08, 0.05])   # variances ∝ scales
    Y = 0.3 + rng.standard_normal((n, kp)) * 0.05 * np.sqrt(scales)
    S, c, M = Y.sum(axis=0, keepdims=True), np.array([float(n)]), Y.T @ Y
    top = float(np.linalg.eigvalsh(M / n - np.outer(S / n, S / n)).max())

    def sd_for(noise_to_signal):                 # the moment sd giving that noise-to-signal
        return noise_to_signal * top * n / math.sqrt(2.0 * kp)

    t = C.NOISE_TO_SIGNAL_SMALL
    _, _, r_small = C.centred_frame(S, c, M, sd_for(0.97 * t), 8, with_radius=True)
    _, _, r_large = C.centred_frame(S, c, M, sd_for(1.03 * t), 8, with_radius=True)
    assert r_small / r_large == pytest.approx(C.RADIUS_RMS_LOW_NOISE / C.RADIUS_RMS, rel=1e-9)
    assert C.radius_rms(0.0) == C.RADIUS_RMS_LOW_NOISE > C.RADIUS_RMS == C.radius_rms(1.0)


# ------------------------------------------------------------------ a budget that cannot hold it
def _stream_model(acc=None, **kw):
    """An ε = 1 estimator after its warm-up and stream (3 topics, 60 words), on ``acc``."""
    model = make_lda_model(60, 3, alpha0=1.0, beta=0.1, seed=31)
    docs = sample_documents(model, 800, mean_length=30, seed=32)
    acc = acc if acc is not None else Accountant(1.0, 1e-6, MemoryLedger())
    est = streamdp.StreamingSpectralLDA(3, epsilon=1.0, delta=1e-6, seed=0, sampler="fast",
                                        non_production=True, accountant=acc, refinement=None, **kw)
    est.warmup(docs[:300]).partial_fit(docs[300:])
    return est, docs[300:]


def _spend_on_the_stream(acc, rho):
    from streamdp.privacy.events import STREAM, GaussianEvent
    acc.commit(acc.reserve([GaussianEvent("other", 1.0, 1.0 / math.sqrt(2 * rho),
                                          partition=STREAM, mechanism="test")], label="other"))


def _raising_at(real, nth: int, exc: BaseException):
    """``real``, except that its ``nth`` call raises ``exc``."""
    calls = []

    def wrapped(*a, **kw):
        calls.append(1)
        if len(calls) == nth:
            raise exc
        return real(*a, **kw)
    return wrapped


def _start_labels(acc):
    return [r.payload["label"] for r in acc.ledger.read()
            if r.kind in ("reserve", "commit") and "cluster" in r.payload["label"]]


# eaten share of the stream's ρ -> the draw that was refused before the fix: 0.8 leaves the
# premise check, the centre draw and one Lloyd iteration (refused in the 2nd), 0.45 every
# iteration (refused at the mapping pass)
@pytest.mark.parametrize("eaten", [0.8, 0.45], ids=["2nd-lloyd-iteration", "mapping-pass"])
def test_a_budget_that_cannot_hold_the_whole_start_refuses_it_before_any_draw(eaten):
    """A draw made is charged; a refusal before any draw charges nothing. Before: the start drew
    and charged its premise check, centre draw and the first iterations, was refused in a later
    one, and its operation stayed pending: every later call raised PendingDraw, and calling the
    start again replayed the kept draws into the same refusal."""
    from streamdp.privacy.accountant import BudgetExhausted
    est, stream = _stream_model()
    acc = est.accountant
    _spend_on_the_stream(acc, est.stream_rho_ * eaten)
    loads = acc.loads()
    with pytest.raises(BudgetExhausted, match="cluster-start"):
        est.cluster_start(stream, 1.0)
    assert _start_labels(acc) == [], "the refused start drew"
    assert acc.loads() == loads                       # nothing charged
    # nothing pending: another call draws at once, and so does a start the budget holds
    est.release(0.01)
    snap = est.cluster_start(stream, (1.0 - eaten) / 2)
    assert snap.privacy["start"]["kind"] == "cluster"


def test_a_retry_of_a_start_whose_post_processing_failed_admits_only_its_remaining_draws(
        monkeypatch):
    """The whole stream ρ on the start; its mapping's post-processing fails after every draw.
    The retry replays the kept draws (no reservation, no draw): the admission counts none of
    them again, so the retry is not refused for the budget it already spent."""
    import streamdp.estimator as estimator_mod
    est, stream = _stream_model()
    monkeypatch.setattr(estimator_mod, "refined_topics",
                        _raising_at(estimator_mod.refined_topics, 1, FloatingPointError("injected")))
    with pytest.raises(FloatingPointError):
        est.cluster_start(stream, 1.0)
    drawn = _start_labels(est.accountant)
    snap = est.cluster_start(stream, 1.0)
    assert _start_labels(est.accountant) == drawn and snap.privacy["start"]["kind"] == "cluster"
    assert math.isclose(snap.privacy["rho_stream_spent"], est.stream_rho_, rel_tol=1e-9)


def test_a_rerun_after_a_crash_mid_start_admits_only_the_draws_not_on_the_ledger(tmp_path,
                                                                                monkeypatch):
    """Durable ledger + run_id: the process dies in the 3rd Lloyd iteration (the premise
    check, the centre draw and two iterations committed and persisted). The re-run returns
    their persisted outputs (no new charge) and draws the rest: the admission counts only the
    draws whose keys are not on the ledger, so the whole stream ρ still holds the start."""
    import streamdp.estimator_one_shot as one_shot
    from streamdp.privacy.ledger import FileLedger
    ledger = tmp_path / "ledger.jsonl"

    def run():
        return _stream_model(Accountant(1.0, 1e-6, FileLedger(ledger)), run_id="run-1")
    est, stream = run()
    real = one_shot.cluster_sums
    monkeypatch.setattr(one_shot, "cluster_sums", _raising_at(real, 3, SystemExit("killed")))
    with pytest.raises(SystemExit):
        est.cluster_start(stream, 1.0)
    monkeypatch.setattr(one_shot, "cluster_sums", real)
    committed = _start_labels(est.accountant)
    assert len(committed) == 2 * 4                    # premise, centre, 2 iterations
    est2, stream = run()
    snap = est2.cluster_start(stream, 1.0)
    assert snap.privacy["start"]["kind"] == "cluster"
    assert math.isclose(est2.accountant.report()["rho_by_atom"]["stream_every_epoch"],
                        est2.stream_rho_, rel_tol=1e-9)


def test_a_refusal_after_the_admission_charges_the_draws_made_and_leaves_nothing_pending(
        monkeypatch):
    """Another spender on the same ledger takes the budget between the start's admission and
    its 2nd Lloyd iteration: that draw is refused. The draws made (premise check, centre draw,
    1st iteration) stay charged, and nothing is pending: the next call draws (before: every
    later call raised PendingDraw, and the start's retry replayed them into the same refusal)."""
    import streamdp.estimator_one_shot as one_shot
    from streamdp.privacy.accountant import BudgetExhausted
    est, stream = _stream_model()
    acc = est.accountant
    real = one_shot.cluster_sums
    calls = []

    def concurrent_spend(*a, **kw):
        calls.append(1)
        if len(calls) == 2:                         # after the 1st iteration's draw
            _spend_on_the_stream(acc, est.stream_rho_ * 0.8)
        return real(*a, **kw)
    monkeypatch.setattr(one_shot, "cluster_sums", concurrent_spend)
    with pytest.raises(BudgetExhausted, match="cluster#3"):
        est.cluster_start(stream, 1.0)
    labels = _start_labels(acc)
    assert [x.split(":", 1)[1] for x in labels[::2]] == ["cluster-premise#1", "cluster#1",
                                                          "cluster#2"]
    assert labels[::2] == labels[1::2]              # each reserved and committed: charged
    est.release(0.01)                               # nothing pending
