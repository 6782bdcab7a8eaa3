"""Tests of the seed-000 baseline (DeCarolis et al. 2020): benchmarks/baselines/seed000.py."""
import itertools
import math
import os
import sys

import numpy as np
import pytest
import scipy.sparse as sp

_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)

from baselines import seed000 as S  # noqa: E402
from streamdp.evaluation import matched_topic_error  # noqa: E402
from streamdp.moments.reference import doc_e2, doc_e3  # noqa: E402
from streamdp.synthetic import make_lda_model, sample_documents  # noqa: E402

ALPHA_SPREAD = np.array([0.15, 0.30, 0.55])   # distinct α_i → distinct λ_i → eigen-gap γ_s > 0


@pytest.fixture(scope="module")
def corpus():
    model = make_lda_model(60, 3, alpha=ALPHA_SPREAD, seed=3)
    return model, sample_documents(model, 20_000, seed=4)


def _on_simplex(tw, k, d):
    assert tw.shape == (k, d)
    assert np.all(tw >= 0)
    np.testing.assert_allclose(tw.sum(axis=1), 1.0, atol=1e-9)


# ---------------------------------------------------------------------- moments (eq. 5-7)
def _bruteforce_moments(C, alpha0):
    """Literal U-statistics of App. C eq. (5)-(7) (as Lemma 22 proves them), by explicit loops."""
    N, d = C.shape
    m1 = [c / c.sum() for c in C]
    e2 = [doc_e2(c) for c in C]
    e3 = [doc_e3(c) for c in C]
    a = alpha0 / (alpha0 + 1)
    b = alpha0 / (alpha0 + 2)
    cc = 2 * alpha0**2 / ((alpha0 + 1) * (alpha0 + 2))
    M2 = sum(e2) / N - a / (N * (N - 1)) * sum(np.outer(m1[n], m1[m])
                                               for n in range(N) for m in range(N) if n != m)
    pair = np.zeros((d, d, d))
    for n in range(N):
        for m in range(N):
            if n != m:
                pair += (np.einsum("ij,k->ijk", e2[n], m1[m]) + np.einsum("ik,j->ijk", e2[n], m1[m])
                         + np.einsum("jk,i->ijk", e2[n], m1[m]))
    trip = np.zeros((d, d, d))
    for n, m, p in itertools.permutations(range(N), 3):
        trip += np.einsum("i,j,k->ijk", m1[n], m1[m], m1[p])
    M3 = (sum(e3) / N - b / (N * (N - 1)) * pair + cc / (N * (N - 1) * (N - 2)) * trip)
    return M2, M3


def test_moments_match_bruteforce_u_statistics():
    rng = np.random.default_rng(0)
    d, N = 5, 9
    C = rng.integers(0, 4, size=(N, d)).astype(float)
    C[C.sum(1) < 3, 0] += 3
    X = sp.csr_matrix(C)
    for alpha0 in (0.5, 2.0):
        M2_ref, M3_ref = _bruteforce_moments(C, alpha0)
        _, M2 = S.second_moment(X, alpha0)
        np.testing.assert_allclose(M2, M2_ref, atol=1e-14)
        M3 = S.whitened_third_moment(X, np.eye(d), alpha0)
        np.testing.assert_allclose(M3, M3_ref, atol=1e-14)
        W = rng.standard_normal((d, 3))          # any W: M̂3(W,W,W) without forming M̂3
        np.testing.assert_allclose(S.whitened_third_moment(X, W, alpha0),
                                   np.einsum("ijk,ia,jb,kc->abc", M3_ref, W, W, W), atol=1e-13)


def test_whitened_m3_noise_has_the_law_of_dense_noise():
    """sym(G)(W,W,W), G iid on d³, vs the k³ sampler: same covariance (Monte Carlo)."""
    rng = np.random.default_rng(1)
    d, k, n = 4, 2, 6000
    W = rng.standard_normal((d, k))
    G = rng.standard_normal((n, d, d, d))
    G = sum(G.transpose(0, *p) for p in itertools.permutations((1, 2, 3))) / 6.0
    dense = np.einsum("nijk,ia,jb,kc->nabc", G, W, W, W, optimize=True).reshape(n, -1)
    fast = np.stack([S.whitened_m3_noise(W, 1.0, rng).ravel() for _ in range(n)])
    cd, cf = np.cov(dense.T), np.cov(fast.T)
    assert np.abs(cd - cf).max() < 0.1 * np.abs(cd).max()
    # and the module's dense sampler is the symmetrised iid tensor
    T = S.dense_m3_noise(3, 1.0, np.random.default_rng(2))
    np.testing.assert_allclose(T, T.transpose(1, 0, 2))
    np.testing.assert_allclose(T, T.transpose(0, 2, 1))


# ------------------------------------------------------------------------- recovery
def test_nonprivate_and_huge_epsilon_recover_planted_topics(corpus):
    model, X = corpus
    k, d = model.topics.shape
    tw, info = S.fit(X, k, epsilon=None, delta=1e-6, seed=0, configuration=1)
    assert info["private"] is False and not info["refused"]
    assert matched_topic_error(model.topics, tw)["l2_mean"] < 0.01
    for c in (1, 2, 3, 4):
        tw, info = S.fit(X, k, epsilon=1e9, delta=1e-6, seed=0, configuration=c)
        _on_simplex(tw, k, d)
        assert info["private"] and not info["refused"], info["procedure1"]
        err = matched_topic_error(model.topics, tw)["l2_mean"]
        assert err < 0.02, (c, err)
        assert info["privacy"]["unit"] == "document" and info["privacy"]["proven"]
        assert math.isclose(sum(info["privacy"]["epsilon_parts"].values()), 1e9)
        assert math.isclose(sum(info["privacy"]["delta_parts"].values()), 1e-6)
        assert info["fit_seconds"] > 0
        np.testing.assert_allclose(np.sort(info["alpha"]), np.sort(ALPHA_SPREAD), atol=0.1)


def test_config1_literal_dense_m3_noise():
    model = make_lda_model(20, 2, alpha=np.array([0.3, 0.7]), seed=5)
    X = sample_documents(model, 5000, seed=6)
    tw, info = S.fit(X, 2, epsilon=1e9, delta=1e-6, seed=0, configuration=1, m3_noise="dense")
    _on_simplex(tw, 2, 20)
    assert matched_topic_error(model.topics, tw)["l2_mean"] < 0.03


# ------------------------------------------------------------------- sensitivities
def test_sensitivity_formulas_known_answer():
    N, a0, k = 100, 1.0, 2
    # Theorem 4 (H.1, H.2), by hand: a = 1/2
    assert S.delta2(N, a0) == pytest.approx(2 / 100 + 4 * 0.5 / 100)            # 0.04
    d3 = 0.02 + (4 / 3) / 100 + (12 / 6) * 99 / (100 * 98)                       # 0.0535374
    assert S.delta3(N, a0) == pytest.approx(d3)
    assert d3 == pytest.approx(0.05353741, rel=1e-6)
    m3 = 1 + 2 * 100 / 99 + 1 * 100**3 / (100 * 99 * 98)                         # eq. (62)
    assert S.m3_l1_bound(N, a0) == pytest.approx(m3)
    # eq. (64) with σ_k = 0.01, σ_{k+1} = 0.006 → ½(σ_k + σ_{k+1}) = 0.008
    sk, snb = 0.01, 0.008
    first = m3 * (2 * k) ** 1.5 * 0.04**3 / (sk * math.sqrt(snb)) ** 3
    second = d3 * k**1.5 / snb**1.5
    dT = first + second
    assert S.delta_T(k, N, a0, sk, snb) == pytest.approx(dT)
    # Lemma 28
    assert S.lemma28_w_diff(k, sk, snb, 0.04) == pytest.approx(math.sqrt(4) * 0.04 / (0.01 * math.sqrt(0.008)))
    # Theorem 6 (H.4): 2√k Δ_T / γ_s
    g = 0.05
    assert S.delta_mubar(k, dT, g) == pytest.approx(2 * math.sqrt(2) * dT / 0.05)
    # Theorem 7 (H.5) with σ1(M̂2) = 0.04, σ1(T̂) = 3: C = 3/(2√2)
    C = 3 / (2 * math.sqrt(2))
    dmb = 2 * math.sqrt(2) * dT / 0.05
    dmu = C * 3 * 0.2 * dmb + C * 3 * 0.2 / 0.01 * 0.04 + C * math.sqrt(0.04 + 0.04) * dmb
    assert S.delta_mu(k, N, a0, sigma_k=sk, sigma_k_neighbour=snb, sigma1_m2=0.04, sigma1_t=3.0,
                      gamma_s=g) == pytest.approx(dmu)
    # ⊥ when a lower bound is 0
    assert S.delta_T(k, N, a0, 0.0, 0.0) == math.inf
    assert S.delta_mubar(k, 1.0, 0.0) == math.inf
    # eigen-gap: sorted descending, σ_{k+1} = 0
    assert S.eigen_gap(np.array([1.0, 3.0, 2.5])) == pytest.approx(0.5 / 4)


def test_gaussian_calibration():
    # classical τ (Prop. 18) and the analytic Gaussian (Balle & Wang 2018): exact δ at the σ found
    assert S.tau_classical(1.0, 1e-5) == pytest.approx(math.sqrt(2 * math.log(1.25e5)))
    for eps, dl in [(0.5, 1e-6), (1.0, 1e-5), (4.0, 1e-6), (50.0, 1e-9)]:
        s = S.analytic_gaussian_sigma(1.0, eps, dl)
        from scipy.stats import norm
        got = norm.cdf(0.5 / s - eps * s) - math.exp(eps) * norm.cdf(-0.5 / s - eps * s)
        assert got <= dl and got == pytest.approx(dl, rel=1e-4)
        if eps <= 1:
            assert s < S.tau_classical(eps, dl)
    assert S.analytic_gaussian_sigma(2.0, 1.0, 1e-5) == pytest.approx(2 * S.analytic_gaussian_sigma(1.0, 1.0, 1e-5))


def test_noise_scales_grow_as_epsilon_shrinks():
    model = make_lda_model(30, 3, alpha=ALPHA_SPREAD, seed=3)
    X = sample_documents(model, 4000, seed=4)
    k = model.topics.shape[0]
    for c in (1, 2, 3, 4):
        for calibration in ("appendix", "section6"):
            scales = []
            for eps in (1e9, 1e7, 1e6):
                _, info = S.fit(X, k, epsilon=eps, delta=1e-6, seed=0, configuration=c,
                                calibration=calibration)
                assert not info["refused"], (c, calibration, eps, info["procedure1"])
                scales.append(info["noise_std"])
                assert info["privacy"]["proven"] == (calibration == "appendix")
            for edge in scales[0]:
                assert scales[0][edge] < scales[1][edge] < scales[2][edge], (c, calibration, edge, scales)


# --------------------------------------------------------------------- Procedure 1
def test_procedure1_refuses_tiny_eigen_gap():
    # uniform α: all tensor eigenvalues equal → γ_s ≈ 0 → γ̃_s = 0 → ⊥ for configs 3 and 4
    model = make_lda_model(60, 3, alpha0=1.0, seed=3)
    X = sample_documents(model, 20_000, seed=4)
    for c in (3, 4):
        tw, info = S.fit(X, 3, epsilon=1e4, delta=1e-6, seed=0, configuration=c)
        assert info["refused"] and info["procedure1"]["result"] == "⊥"
        assert "gamma" in info["procedure1"]["reason"]
        assert info["procedure1"]["gamma_s_tilde"] == 0.0
        assert info["nonprivate_diagnostics"]["gamma_s"] < 0.02
        np.testing.assert_allclose(tw, 1.0 / 60)          # uniform, flagged, nothing estimated
        assert info["fallback"].startswith("uniform") and info["alpha"] is None
    # config 2 only needs σ̃_k and goes through on the same data
    _, info = S.fit(X, 3, epsilon=1e4, delta=1e-6, seed=0, configuration=2)
    assert not info["refused"]


def test_procedure1_refuses_tiny_sigma_k(corpus):
    # asking for one topic more than the data has: σ_k(M̂2) ≈ 0 → σ̃_k ≤ Δ2 → ⊥
    model, X = corpus
    for c in (2, 3, 4):
        tw, info = S.fit(X, 4, epsilon=10.0, delta=1e-6, seed=0, configuration=c)
        assert info["refused"] and "sigma_k" in info["procedure1"]["reason"]
        _on_simplex(tw, 4, 60)
    # config 1 has no Procedure 1: it never refuses
    tw, info = S.fit(X, 4, epsilon=10.0, delta=1e-6, seed=0, configuration=1)
    assert not info["refused"]
    _on_simplex(tw, 4, 60)


def test_argument_checks(corpus):
    _, X = corpus
    with pytest.raises(ValueError):
        S.fit(X, 3, epsilon=1.0, delta=1e-6, seed=0, configuration=5)
    with pytest.raises(ValueError):
        S.fit(X, 3, epsilon=1.0, delta=1e-6, seed=0, configuration=2, split={"e6": 1.0})
    with pytest.raises(TypeError):
        S.fit(X, 3, epsilon=1.0, delta=1e-6, seed=0, configuration=2, bogus=1)
    assert set(S.default_split(4)) == {"p1_sigma_k", "p1_gamma_s", "p1_sigma1_M2", "p1_sigma1_T", "e9"}
    assert sum(S.default_split(3).values()) == pytest.approx(1.0)
