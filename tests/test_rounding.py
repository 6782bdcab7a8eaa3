"""The float64 rounding of noised sums against the proven bound (streamdp/privacy/rounding.py,
docs/privacy.md "Floating point").

* the compensated accumulation meets its tight bound where plain ``+=`` does not;
* adversarial sketches (cancelling z = Zacc − a2·Q, extreme magnitudes, many batches) stay
  within R_b of an exact rational reference;
* neighbouring datasets: the computed sums differ by at most the declared Δ_b;
* per-document pre-cancellation magnitudes stay within M_b (the magnitude clip);
* the premise max_documents_per_sum refuses before anything is spent.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

import streamdp
from streamdp.continual import EpochSums
from streamdp.documents import keep_long_documents
from streamdp.moments import sketch as sketch_mod
from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import SketchSums, WhitenedSketch
from streamdp.privacy import rounding
from streamdp.privacy.accountant import Accountant
from streamdp.privacy.epochs import EpochClock
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.rounding import (gamma, per_document_magnitude,
                                       rounding_bound)
from streamdp.refinement import RefinementSketch, refinement_sensitivity
from streamdp.privacy.plan import BudgetSplit, plan_release
from streamdp.privacy.sensitivity import block_sensitivities
from streamdp.synthetic import make_lda_model, sample_documents
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupSketch

U = rounding.UNIT_ROUNDOFF


# ----------------------------------------------------------------- compensated summation
def _tight_bound(values: np.ndarray, exact: float) -> float:
    """u·|S| + 3γ_n²·Σ|x|: what the compensated accumulation promises (plus its collapse)."""
    n = len(values)
    return U * abs(exact) + 3 * gamma(n) ** 2 * float(np.abs(values).sum()) + 2 * U * U * abs(exact)


def test_compensated_accumulation_meets_its_bound_where_plain_summation_fails():
    """n identical awkward batches: plain += drifts by ~n²u, compensated stays within u|S|."""
    n = 200_000
    x = np.array([0.1, 1.0 / 3.0, -2.0 / 3.0 + 1e-9, math.pi * 1e-8])
    hi, lo = np.zeros(4), np.zeros(4)
    plain = np.zeros(4)
    for _ in range(n):
        rounding.accumulate(hi, lo, x)
        plain += x
    got = rounding.collapse(hi, lo)
    for j in range(4):
        exact = Fraction(x[j]) * n                       # the exact sum of n copies
        err = abs(Fraction(got[j]) - exact)
        bound = _tight_bound(np.full(n, x[j]), float(exact))
        assert err <= Fraction(bound)
    # the test can fail: plain summation breaks the same bound on these inputs
    plain_errs = [abs(Fraction(plain[j]) - Fraction(x[j]) * n) for j in range(4)]
    assert any(e > Fraction(_tight_bound(np.full(n, x[j]), float(Fraction(x[j]) * n)))
               for j, e in enumerate(plain_errs))


def test_compensated_merges_of_extreme_cancellation():
    """Huge values cancelling, merged in a tree: the exact sum survives (fsum reference)."""
    rng = np.random.default_rng(0)
    parts = []
    for _ in range(64):
        big = rng.choice([1e16, -1e16, 3e15, -3e15], size=50)
        small = rng.standard_normal(50)
        parts.append(np.concatenate([big, small, -big]))   # Σ = Σ small, magnitudes ≫ it
    states = []
    for p in parts:
        hi, lo = np.zeros(1), np.zeros(1)
        for v in p:
            rounding.accumulate(hi, lo, np.array([v]))
        states.append((hi, lo))
    while len(states) > 1:                                # pairwise merges, like partitions
        nxt = []
        for a, b in zip(states[0::2], states[1::2]):
            rounding.merge_into(a[0], a[1], b[0], b[1])
            nxt.append(a)
        states = nxt
    allv = np.concatenate(parts)
    exact = math.fsum(allv)
    got = float(rounding.collapse(*states[0])[0])
    assert abs(got - exact) <= _tight_bound(allv, exact)
    # the test can fail: plain summation breaks the bound here (it loses every small value)
    assert abs(sum(allv.tolist()) - exact) > 100 * _tight_bound(allv, exact)


def test_double_double_sums_are_rounded_once():
    """SketchSums / EpochSums ``+`` keeps hi = fl(exact) over many additions."""
    k = 3
    leaves = [SketchSums(1.0, np.full(2, v), np.full((2, k), v), np.zeros(k), np.zeros((k, k)),
                         np.zeros((k, k, k)), n_docs=1)
              for v in [1e16, 1.0, -1e16, 1e-3] * 50]
    total = leaves[0]
    for s in leaves[1:]:
        total = total + s
    exact = math.fsum([1e16, 1.0, -1e16, 1e-3] * 50)
    assert total.m1[0] == exact and total.z[1, 2] == exact and total.n_docs == 200
    back = SketchSums.from_dict(total.to_dict())
    assert (back + leaves[1]).m1[0] == math.fsum([exact, 1.0])
    r = [EpochSums(leaves[0], np.full((1, 2), v)) for v in [1e16, 1.0, -1e16, 1e-3] * 50]
    tot = r[0]
    for e in r[1:]:
        tot = tot + e
    assert tot.refine[0, 0] == exact
    assert EpochSums.from_dict(tot.to_dict()).refine_lo is not None


# ------------------------------------------------------------------ exact references
def _cancelling_subspace(rng, half: int, k: int) -> Subspace:
    """Orthonormal Q whose second half of rows is the exact negative of the first half."""
    A, _ = np.linalg.qr(rng.standard_normal((half, k)))
    B = A / math.sqrt(2.0)
    return Subspace(np.vstack([B, -B]))


def _adversarial_documents(rng, n: int, half: int) -> sp.csr_matrix:
    """Documents {w, u, u + half}: y = q_w + q_u − q_u, so row w of z cancels to ≈ 0 while
    Zacc and a2·Q stay large; plus heavy repeated words and long documents (extreme weights)."""
    rows = []
    d = 2 * half
    for i in range(n):
        c = np.zeros(d)
        kind = i % 4
        w, u = rng.integers(half), rng.integers(half)
        if kind == 0:
            c[w] += 1; c[u] += 1; c[u + half] += 1
        elif kind == 1:
            c[w] += 3                                   # length 3, one word: largest weights
        elif kind == 2:
            c[w] += 1; c[u] += 50; c[u + half] += 50    # long, nearly cancelling
        else:
            c[rng.integers(d, size=8)] += 1
        rows.append(c)
    return sp.csr_matrix(np.array(rows))


def _exact_sums(sk: WhitenedSketch, X: sp.csr_matrix) -> dict[str, np.ndarray]:
    """Σ of the defined per-document contributions (weights ŝ, the computed ŷ), in rationals."""
    X, lengths = keep_long_documents(X)
    Q = sk.subspace.Q
    Y = X @ Q
    scale = sk.document_scale(X, lengths, Y)
    d, k = Q.shape
    F = Fraction
    Qf = [[F(Q[i, a]) for a in range(k)] for i in range(d)]
    tot = {"count": F(0), "m1": [F(0)] * d, "z": [[F(0)] * k for _ in range(d)],
           "s3": [[[F(0)] * k for _ in range(k)] for _ in range(k)]}
    for r in range(X.shape[0]):
        idx = X.indices[X.indptr[r]:X.indptr[r + 1]]
        cnt = X.data[X.indptr[r]:X.indptr[r + 1]]
        s, l = F(scale[r]), F(lengths[r])
        y = [F(v) for v in Y[r]]
        w2 = s / (l * (l - 1))
        w3 = w2 / (l - 2)
        tot["count"] += s
        for i, c in zip(idx, cnt):
            c = F(c)
            tot["m1"][i] += s * c / l
            for a in range(k):
                tot["z"][i][a] += w2 * c * (y[a] - Qf[i][a])
        for a in range(k):
            for b in range(k):
                for cc in range(k):
                    v = y[a] * y[b] * y[cc]
                    for i, c in zip(idx, cnt):
                        q = Qf[i]
                        v -= F(c) * (q[a] * q[b] * y[cc] + q[a] * y[b] * q[cc] + y[a] * q[b] * q[cc])
                        v += 2 * F(c) * q[a] * q[b] * q[cc]
                    tot["s3"][a][b][cc] += w3 * v
    m1 = np.array([float(v) for v in tot["m1"]])
    z = np.array([[float(v) for v in row] for row in tot["z"]])
    # s1 = Qᵀ m1 and s2 = Qᵀ z exactly
    s1 = np.array([float(sum(Qf[i][a] * tot["m1"][i] for i in range(d))) for a in range(k)])
    s2 = np.array([[float(sum(Qf[i][a] * tot["z"][i][b] for i in range(d))) for b in range(k)]
                   for a in range(k)])
    s3 = np.array([[[float(v) for v in r2] for r2 in r1] for r1 in tot["s3"]])
    return {"count": float(tot["count"]), "m1": m1, "z": z, "s1": s1, "s2": 0.5 * (s2 + s2.T),
            "s3": s3}


BLOCK_CLIP = {"count": lambda c: 1.0, "m1": lambda c: c.m1, "s1": lambda c: c.m1,
              "z": lambda c: c.z, "s2": lambda c: c.z, "s3": lambda c: c.s3}


@pytest.mark.parametrize("clip", [ClipBounds.for_length(30), ClipBounds.unclipped()],
                         ids=["clipped", "unclipped"])
def test_adversarial_sketch_within_rounding_bound(clip, monkeypatch):
    """Cancelling z rows, extreme weights, many small batches and merges: every computed block
    is within R_b (at N_max = the actual count) of the exact sum of the contributions."""
    rng = np.random.default_rng(1)
    half, k = 6, 3
    sub = _cancelling_subspace(rng, half, k)
    X = _adversarial_documents(rng, 600, half)
    monkeypatch.setattr(sketch_mod, "BATCH_ROWS_MAX", 7)    # many chunks per batch
    parts = [WhitenedSketch(sub, clip) for _ in range(3)]
    for b, a in enumerate(range(0, X.shape[0], 23)):        # uneven batches, 3 partitions
        parts[b % 3].update(X[a:a + 23])
    sk = parts[0].copy().merge(parts[1]).merge(parts[2])
    got = sk.sums()
    ref = _exact_sums(sk, X)
    n = X.shape[0]
    for b, f in BLOCK_CLIP.items():
        err = float(np.sqrt(np.sum((np.asarray(getattr(got, b)) - ref[b]) ** 2)))
        assert err <= rounding_bound(b, f(clip), n), (b, err)
    # the construction does cancel: z = Zacc − a2·Q is far smaller than its two terms
    ratio = np.abs(sk.value("zacc")) / np.maximum(np.abs(ref["z"]), 1e-300)
    assert ratio.max() > 10
    assert got.n_docs == n


def test_chunking_caps_rows_per_product():
    """BATCH_ROWS_MAX is a code fact: a 10 000-row batch is processed in chunks of exactly 4096
    long documents; the rest (< 4096) waits as pending rows, counted in n_docs."""
    rng = np.random.default_rng(2)
    sub = Subspace(np.linalg.qr(rng.standard_normal((50, 4)))[0])
    X = sp.csr_matrix(rng.poisson(0.2, size=(10_000, 50)).astype(float))
    n_long = keep_long_documents(X)[0].shape[0]
    seen = []
    sk = WhitenedSketch(sub, ClipBounds.for_length(10))
    orig = sk._update_chunk
    sk._update_chunk = lambda Xc, *w: (seen.append(Xc.shape[0]), orig(Xc, *w))
    sk.update(X)
    assert seen and set(seen) == {rounding.BATCH_ROWS_MAX}
    assert sum(seen) + sk.pending.n == n_long and 0 < sk.pending.n < rounding.BATCH_ROWS_MAX
    assert sk.n_docs == n_long and sk.sums().n_docs == 10_000
    w = WarmupSketch(50, 4, clip=1e-6)
    wseen = []
    worig = w._update_chunk
    w._update_chunk = lambda Xc, *wt: (wseen.append(Xc.shape[0]), worig(Xc, *wt))
    w.update(X)
    assert set(wseen) == {rounding.BATCH_ROWS_MAX} and sum(wseen) + w.pending.n == n_long
    assert w.n_docs == n_long


def test_compensation_is_at_least_as_exact_as_plain_accumulation(monkeypatch):
    """Many identical chunks: compensated accumulators are closer to the exact n·v than +=."""
    # one 5-document batch per chunk (chunks are counted in the sketch's own sequence)
    monkeypatch.setattr(sketch_mod, "BATCH_ROWS_MAX", 5)
    rng = np.random.default_rng(3)
    sub = Subspace(np.linalg.qr(rng.standard_normal((30, 3)))[0])
    X = sp.csr_matrix(rng.poisson(0.4, size=(5, 30)).astype(float) + np.eye(5, 30) * 3)
    one = WhitenedSketch(sub, ClipBounds.for_length(10)).update(X)
    sk = WhitenedSketch(sub, ClipBounds.for_length(10))
    plain = {n: np.zeros_like(getattr(one, n)) for n in sketch_mod._ACCUMULATORS}
    reps = 3000
    for _ in range(reps):
        sk.update(X)
        for n in plain:
            plain[n] += getattr(one, n)
    worse = 0
    for n in sketch_mod._ACCUMULATORS:
        v = getattr(one, n)            # a single batch: comp is 0, the value is exact float
        exact = np.vectorize(lambda a: Fraction(float(a)) * reps, otypes=[object])(v)
        err_c = np.vectorize(lambda g, e: float(abs(Fraction(float(g)) - e)))(sk.value(n), exact)
        err_p = np.vectorize(lambda g, e: float(abs(Fraction(float(g)) - e)))(plain[n], exact)
        assert np.all(err_c <= err_p)
        assert np.all(err_c <= U * np.abs(v) * reps * (1 + 1e-6) + 3 * gamma(reps) ** 2 * np.abs(v) * reps)
        worse += int(np.any(err_p > err_c))
    assert worse > 0               # plain accumulation really is worse somewhere


# ------------------------------------------------------------------ neighbouring datasets
def test_neighbouring_sums_differ_by_at_most_the_declared_sensitivity():
    """D vs D + canary (first, so every later addition rounds differently): each computed block
    moves by ≤ Δ_b; the canary is a maximal document (it reaches its clip bound)."""
    rng = np.random.default_rng(4)
    half, k = 6, 3
    sub = _cancelling_subspace(rng, half, k)
    clip = ClipBounds.for_length(30)
    X = _adversarial_documents(rng, 3000, half)
    canary = np.ones((1, 2 * half))                      # distinct words: clipped to C_m1
    Xp = sp.vstack([sp.csr_matrix(canary), X]).tocsr()
    a = WhitenedSketch(sub, clip).update(X).sums()
    b = WhitenedSketch(sub, clip).update(Xp).sums()
    sens = block_sensitivities(clip, max_documents=Xp.shape[0])
    reached = 0
    for blk in BLOCK_CLIP:
        diff = float(np.sqrt(np.sum((np.asarray(getattr(b, blk)) - np.asarray(getattr(a, blk))) ** 2)))
        assert diff <= sens[blk], (blk, diff, sens[blk])
        reached += diff > 0.5 * BLOCK_CLIP[blk](clip)
    assert reached >= 2                                  # the canary is not a weak document


def test_per_document_magnitudes_within_M_b():
    """ŝ × the Frobenius norm of a document's absolute accumulator terms ≤ M_b, per block."""
    rng = np.random.default_rng(5)
    half, k = 6, 3
    sub = _cancelling_subspace(rng, half, k)
    for clip in (ClipBounds.for_length(30), ClipBounds.for_length(4), ClipBounds.unclipped()):
        sk = WhitenedSketch(sub, clip)
        X, lengths = keep_long_documents(_adversarial_documents(rng, 400, half))
        Y = X @ sub.Q
        scale = sk.document_scale(X, lengths, Y)
        aQ = np.abs(sub.Q)
        clipped = 0
        for r in range(X.shape[0]):
            c = X[r].toarray().ravel()
            y, l, s = Y[r], lengths[r], scale[r]
            ay = np.abs(y)
            w2, w3 = s / (l * (l - 1)), s / (l * (l - 1) * (l - 2))
            mag = {"m1": np.linalg.norm(s * c / l),
                   "s1": np.linalg.norm(aQ.T @ (s * c / l)),
                   "z": np.linalg.norm(w2 * (np.outer(c, ay) + c[:, None] * aQ)),
                   "s2": np.linalg.norm(aQ.T @ (w2 * (np.outer(c, ay) + c[:, None] * aQ)))}
            T = np.einsum("a,b,c->abc", ay, ay, ay)
            for i in np.flatnonzero(c):
                q = aQ[i]
                T = T + c[i] * (np.einsum("a,b,c->abc", q, q, ay) + np.einsum("a,b,c->abc", q, ay, q)
                                + np.einsum("a,b,c->abc", ay, q, q) + 2 * np.einsum("a,b,c->abc", q, q, q))
            mag["s3"] = np.linalg.norm(w3 * T)
            for blk, m in mag.items():
                assert m <= per_document_magnitude(blk, BLOCK_CLIP[blk](clip)) * (1 + 1e-12), (blk, r)
            clipped += s < 1
        if clip.s3 < 1:
            assert clipped > 0


# -------------------------------------------------------------------- sensitivities
def test_sensitivity_formula_and_report():
    clip = ClipBounds.for_length(50)
    for n_max in (10**7, 10**8, 10**9):
        sens = block_sensitivities(clip, max_documents=n_max)
        for blk, f in BLOCK_CLIP.items():
            R = rounding_bound(blk, f(clip), n_max)
            assert sens[blk] == pytest.approx(f(clip) * (1 + 1e-9) + 2 * R, rel=1e-15)
            assert R > 0
    default = block_sensitivities(clip)
    assert default == block_sensitivities(clip, max_documents=rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM)
    # cancelling blocks cost ≈ 2·10·γ_DEPTH·N_max relative: < 2% at 10⁹, < 0.2% at 10⁸
    infl = {b: default[b] / f(clip) - 1 for b, f in BLOCK_CLIP.items()}
    assert max(infl.values()) < 0.02 and infl["s3"] > 0.015
    assert refinement_sensitivity(10**8) < refinement_sensitivity(10**9) < 1.003
    ev = {e.block: e for e in plan_release(0.1, clip, BudgetSplit(), "tensor", max_documents=10**8)}
    assert ev["z"].sensitivity == block_sensitivities(clip, max_documents=10**8)["z"]
    for bad in (0, -1, 1.5, True, 10**13, "1e9"):
        with pytest.raises(ValueError, match="max_documents"):
            block_sensitivities(clip, max_documents=bad)


# ---------------------------------------------------------------- the premise refuses
@pytest.fixture(scope="module")
def small_corpus():
    model = make_lda_model(60, 3, seed=0)
    return sample_documents(model, 700, mean_length=30, seed=1)


def test_premise_check_draws_a_one_shot_release_over_the_premise_from_noise_only(small_corpus):
    """A one-shot release never refuses on the premise (issue 23): before, 500 stream documents
    with max_documents_per_sum = 300 raised DocumentCountExceeded. Now a noised, charged check of
    the stream's count decides (ε = 10⁹: σ_p tiny, the check is sharp): 500 > 300 is drawn from
    noise only, 500 ≤ 600 − 12σ_p from its sums; each release reports the check and its premise."""
    X = small_corpus
    out = {}
    for n_max in (300, 600):
        acc = Accountant(1e9, 1e-6, MemoryLedger())
        est = streamdp.StreamingSpectralLDA(3, epsilon=1e9, clip_length=20, sampler="fast",
                                            non_production=True, accountant=acc,
                                            max_documents_per_sum=n_max, refinement=None)
        est.warmup(X[:200])
        est.partial_fit(X[200:])             # 500 stream documents
        snap = est.release()
        assert snap.privacy["rounding"]["max_documents_per_sum"] == n_max
        assert set(snap.privacy["rounding"]["sensitivity_inflation"]) >= {"z", "s3", "m1", "count"}
        out[n_max] = snap
    assert not out[300].privacy["premise_check"]["passed"] and abs(out[300].n_docs) < 1
    assert out[600].privacy["premise_check"]["passed"] and out[600].n_docs > 50


def test_premise_check_draws_a_warmup_over_the_premise_from_noise_only(small_corpus):
    """The warm-up never refuses on the premise (issue 23 item 2): a noised, charged check of
    its document count decides. ε = 10⁹ makes σ_p small, so the check is sharp here: 200 warm-up
    documents pass N_max = 250 and are drawn from their sums, and fail N_max = 100 (before: a
    DocumentCountExceeded refusal) and are drawn from noise only."""
    X = small_corpus
    subspaces = {}
    for n_max in (100, 250):
        est = streamdp.StreamingSpectralLDA(3, epsilon=1e9, clip_length=20, sampler="fast",
                                            non_production=True, max_documents_per_sum=n_max)
        est.warmup(X[:200])
        est.partial_fit(X[200:250])
        check = est.subspace_.provenance["premise_check"]
        assert 12 * check["sigma"] < 10 and check["passed"] == (n_max == 250), check
        subspaces[n_max] = est.subspace_.Q
    # noise only at σ_w ≈ 0 is a range of zeros: not the warm-up's range
    assert not np.allclose(np.abs(subspaces[100].T @ subspaces[250]), np.eye(subspaces[100].shape[1]),
                           atol=1e-3)


def test_premise_check_draws_a_refinement_pass_over_the_premise_from_noise_only(small_corpus):
    """A refinement pass over 500 documents with max_documents_per_sum = 300 (before: refused,
    DocumentCountExceeded) is drawn from noise only after its noised check fails: a release."""
    X = small_corpus
    est2 = streamdp.StreamingSpectralLDA(3, epsilon=1e9, clip_length=20, sampler="fast",
                                         non_production=True, max_documents_per_sum=300)
    est2.warmup(X[:200])
    est2.partial_fit(X[200:450])
    assert est2.release(0.5).privacy["premise_check"]["passed"]       # 250 documents
    snap = est2.refine(X[200:700])          # 500 refinement documents > 300
    assert not snap.privacy["premise_check"]["passed"] and snap.stage == "refined"
    assert abs(snap.topic_mass.sum()) < 1.0          # noise only at ε = 10⁹


@pytest.mark.parametrize("aggregator", ["tree", "blt"])
def test_premise_check_draws_an_epoch_over_the_premise_from_noise_only(small_corpus, aggregator):
    """The continual release never refuses on the premise (issue 23 item 2): a noised, charged
    check ñ = n + N(0, σ_p²) of the largest raw sum decides, and an epoch with ñ > N_max − zσ_p
    is drawn from noise only, on schedule. tree: node [1, 2] is one raw sum of both epochs (300
    > 250); blt: each epoch's sum is noised alone (epoch 3: 300 > 250). ε = 3000 (tree) and
    10⁹ (blt: every check is charged to every atom, 10⁶ of them) make σ_p < 3, so the check is
    sharp here (zσ_p < 36 documents: 200 passes, 300 does not)."""
    X = small_corpus
    clock = EpochClock(0.0, 10.0)
    eps = {"tree": 3000.0, "blt": 1e9}[aggregator]
    est = streamdp.StreamingSpectralLDA(3, epsilon=eps, clip_length=20, sampler="fast",
                                        non_production=True, epochs=clock, horizon=4,
                                        max_documents_per_sum=250, refinement=None,
                                        continual_aggregator=aggregator)
    est.warmup(X[:200])
    est.partial_fit(X[200:400], timestamps=np.full(200, 5.0))     # epoch 1: 200 documents
    est.partial_fit(X[400:500], timestamps=np.full(100, 15.0))    # epoch 2: 100 documents
    est.partial_fit(X[400:700], timestamps=np.full(300, 25.0))    # epoch 3: 300 documents
    snaps = est.close_epochs(30.0)                               # never refused
    assert [s.epoch for s in snaps] == [1, 2, 3]
    checks = [s.privacy["premise_check"] for s in snaps]
    sigma = checks[0]["sigma"]
    assert 0.1 < sigma < 3 and checks[0]["z"] == 12.0 and checks[0]["max_documents"] == 250
    # tree: node [1, 2] (300) and leaf [3, 3] (300) are over; blt: epoch 3 (300)
    passed = {"tree": [True, False, False], "blt": [True, True, False]}[aggregator]
    assert [c["epoch"]["passed"] for c in checks] == passed
    for c in checks:                    # the decision reads the released ñ only
        assert c["epoch"]["passed"] == (c["epoch"]["noisy_count"] <= 250 - 12.0 * sigma)
    # noise only: blt's epoch 3 adds no document to the released count; the tree's epoch-2
    # release is node [1, 2] drawn from zero sums (epoch 1's documents leave it too)
    count_sd = max(s.privacy["noise_sd"]["count"] for s in snaps)
    assert count_sd < 10
    # (n_docs is the released count block: Σ of the documents' clip factors)
    if aggregator == "blt":
        assert abs(snaps[2].n_docs - snaps[1].n_docs) < 8 * count_sd
        assert snaps[1].n_docs - snaps[0].n_docs > 40 * count_sd
    else:
        assert snaps[0].n_docs > 40 * count_sd
        assert abs(snaps[1].n_docs) < 8 * count_sd
    # the checks are charged: ρ and δ = Φ(−12) per check on the stream atoms
    rep = est.accountant.report()
    assert 0 < rep["delta_of_approximate_events_by_atom"]["stream_worst"] < 1e-30
    assert rep["rho_worst_case"] <= est.accountant.rho_budget * (1 + 1e-9)


def test_service_config_key():
    from streamdp.services.config import ConfigError, from_mapping
    cfg = from_mapping({"max_documents_per_sum": 10**8}, env={})
    assert cfg.max_documents_per_sum == 10**8
    assert from_mapping({}, env={}).max_documents_per_sum == rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM
    for bad in (0, 10**13, 1.5, "x"):
        with pytest.raises(ConfigError, match="max_documents_per_sum"):
            from_mapping({"max_documents_per_sum": bad}, env={})
    assert from_mapping({}, env={"STREAMDP_MAX_DOCUMENTS_PER_SUM": "5000"}).max_documents_per_sum == 5000


def test_states_without_compensation_still_load():
    """Checkpoints written before compensation existed load (comp = 0) and keep working."""
    rng = np.random.default_rng(6)
    sub = Subspace(np.linalg.qr(rng.standard_normal((20, 3)))[0])
    X = sp.csr_matrix(rng.poisson(0.5, size=(50, 20)).astype(float))
    sk = WhitenedSketch(sub, ClipBounds.for_length(10)).update(X).update(X)
    obj = sk.to_dict()
    back = WhitenedSketch.from_dict(obj, sub)
    assert all(np.array_equal(back.comp[n], sk.comp[n]) for n in sketch_mod._ACCUMULATORS)
    # as written then: schema v1 (t3 over (a, pair b ≤ c)), no compensation (issue 26: the
    # version says what a state lacks; one migration per kind fills it)
    from streamdp import serialization as ser
    from streamdp.moments import symmetric3
    j, kk = np.triu_indices(3)
    old = {k: v for k, v in obj.items() if k not in ("comp", "weight_sum_lo", "n_rows")}
    old = dict(old, v=1, acc=dict(obj["acc"], t3=ser.pack_array(symmetric3.expand(sk.t3, 3)[:, j, kk])))
    legacy = WhitenedSketch.from_dict(old, sub)
    assert legacy.n_rows == sk.n_docs and np.allclose(legacy.sums().z, sk.sums().z, rtol=1e-12)
    with pytest.raises(ser.SchemaError, match="missing field.*comp"):    # v2 lacking it: damaged
        WhitenedSketch.from_dict(dict(old, v=2, acc=obj["acc"]), sub)
    rs = RefinementSketch(2, 5)
    d = rs.to_dict()
    d.pop("sums_lo")
    d["v"] = 1
    assert RefinementSketch.from_dict(d).sums_lo.shape == (2, 5)


def test_the_iterative_mechanism_says_its_rounding_is_not_covered():
    import warnings
    from streamdp import StreamingSpectralLDA
    from streamdp.privacy.rounding import RoundingNotCoveredWarning
    with pytest.warns(RoundingNotCoveredWarning, match="iterative"):
        StreamingSpectralLDA(5, epsilon=1.0, mechanism="iterative")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RoundingNotCoveredWarning)
        StreamingSpectralLDA(5, epsilon=1.0)                      # tensor: covered, silent
        StreamingSpectralLDA(5, mechanism="iterative")           # non-private: nothing to cover
