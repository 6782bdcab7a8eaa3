"""Baselines of issue 5: DP-SVI (seed 002) and TopicDP (seed 004), benchmarks/baselines/."""
from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from baselines import dpsvi, topicdp  # noqa: E402

from streamdp.synthetic import make_lda_model, sample_documents  # noqa: E402

try:
    from streamdp.evaluation import matched_topic_error
except ImportError:  # pragma: no cover - evaluation package being reorganised
    from scipy.optimize import linear_sum_assignment

    def matched_topic_error(true, est):
        cost = np.linalg.norm(true[:, None, :] - est[None, :, :], axis=2)
        r, c = linear_sum_assignment(cost)
        return {"l2_mean": float(cost[r, c].mean())}

logging.getLogger("absl").setLevel(logging.ERROR)    # dp_accounting's order warnings

K, V = 4, 100


@pytest.fixture(scope="module")
def corpus():
    model = make_lda_model(V, K, beta=0.1, seed=1)
    X = sample_documents(model, 10_000, seed=11)
    return model, X


def _on_simplex(W, k, d):
    assert W.shape == (k, d)
    assert np.all(np.isfinite(W)) and W.min() >= 0
    np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-9)


def _accounted(z, q, J, delta):
    """ε by dp_accounting, built here independently of the module."""
    import dp_accounting
    from dp_accounting import rdp
    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), J)
    return acc.get_epsilon(delta)


# ----------------------------------------------------------------------------- DP-SVI

def test_dpsvi_large_epsilon_recovers_topics(corpus):
    model, X = corpus
    W, info = dpsvi.fit(X, K, epsilon=1e3, delta=1e-6, seed=0, batch_fraction=0.1, iterations=40)
    _on_simplex(W, K, V)
    assert info["private"] and 0 < info["noise_multiplier"] < 0.5
    assert info["epsilon_accounted"] <= 1e3
    err = matched_topic_error(model.topics, W)["l2_mean"]
    assert err < 0.05, err                      # topics have L2 norm ≈ 0.33


def test_dpsvi_calibration_meets_target_and_noise_grows(corpus):
    _, X = corpus
    q, J, delta = 0.05, 20, 1e-6
    zs = {}
    for eps in (1.0, 4.0):
        W, info = dpsvi.fit(X[:2000], K, epsilon=eps, delta=delta, seed=0, batch_fraction=q,
                            iterations=J, local_iterations=2)
        _on_simplex(W, K, V)
        z = info["noise_multiplier"]
        e = _accounted(z, q, J, delta)
        assert e <= eps and e >= 0.97 * eps, (eps, e)
        assert info["epsilon_accounted"] == pytest.approx(e, rel=0.02)
        assert info["sigma_sum"] == pytest.approx(z * info["max_doc_length"])
        assert info["q"] == q and info["iterations"] == J
        zs[eps] = z
    assert zs[1.0] > zs[4.0]


def test_dpsvi_clip_lambda_ablation_stays_on_simplex(corpus):
    _, X = corpus
    W, info = dpsvi.fit(X[:2000], K, epsilon=0.5, delta=1e-6, seed=0, iterations=5,
                        local_iterations=2, clip="lambda")
    _on_simplex(W, K, V)
    assert info["clip"] == "lambda"


def test_dpsvi_truncation_is_a_uniform_subset():
    rng = np.random.default_rng(0)
    X = sp.csr_matrix(np.array([[30, 10, 60, 0], [1, 2, 0, 0], [0, 0, 0, 7]] * 4000, float))
    T = dpsvi.truncate_documents(X, 10, rng)
    lengths = np.asarray(T.sum(axis=1)).ravel()
    np.testing.assert_array_equal(lengths, np.minimum(np.asarray(X.sum(axis=1)).ravel(), 10))
    assert (X - T).toarray().min() >= 0
    first = T.toarray()[0::3]
    np.testing.assert_allclose(first.mean(axis=0)[:3], [3, 1, 6], atol=0.08)   # hypergeometric


def test_dpsvi_local_step_matches_per_document_reference(corpus):
    from scipy.special import digamma
    _, X = corpus
    Xb = X[:50]
    beta = np.random.default_rng(3).dirichlet(np.ones(V), size=K)
    eb = np.exp(np.log(beta))
    gamma, S = dpsvi.local_step(Xb, eb, 0.25, 15)
    S_ref = np.zeros((K, V))
    for r in range(Xb.shape[0]):
        idx, c = Xb[r].indices, Xb[r].data
        g = np.ones(K)
        for it in range(16):
            et = np.exp(digamma(g) - digamma(g.sum()))
            phi = et[:, None] * eb[:, idx]
            phi /= phi.sum(axis=0)
            if it == 15:
                break
            g = 0.25 + phi @ c
        np.testing.assert_allclose(gamma[r], g, rtol=1e-3)
        S_ref[:, idx] += phi * c
    np.testing.assert_allclose(S, S_ref, rtol=1e-3, atol=1e-5)
    assert S.sum() == pytest.approx(Xb.sum(), rel=1e-5)      # Σ_k φ = 1 per token


@pytest.mark.parametrize("kw", [
    {"epsilon": 0.0}, {"epsilon": -1.0}, {"epsilon": float("nan")}, {"delta": 0.0},
    {"delta": 1.0}, {"batch_fraction": 0.0}, {"batch_fraction": 1.5}, {"iterations": 0},
    {"max_doc_length": 0}, {"kappa": 0.3}, {"alpha": -1.0}, {"local_iterations": 0},
    {"noise_multiplier": -2.0}, {"clip": "none"},
])
def test_dpsvi_bad_parameters(corpus, kw):
    _, X = corpus
    args = {"epsilon": 1.0, "delta": 1e-6, "seed": 0, "iterations": 2, **kw}
    with pytest.raises(ValueError):
        dpsvi.fit(X[:100], K, **args)


def test_dpsvi_bad_inputs():
    with pytest.raises(ValueError):
        dpsvi.fit(sp.csr_matrix(np.array([[1.0, -1.0]])), 2, epsilon=1.0, delta=1e-6, seed=0)
    with pytest.raises(ValueError):
        dpsvi.fit(sp.csr_matrix(np.ones((3, 4))), 0, epsilon=1.0, delta=1e-6, seed=0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        dpsvi.fit(sp.csr_matrix(np.ones((3, 4))), 2, epsilon=1.0, delta=1e-6, seed=0,
                  noise_multiplier=0.01)      # too little noise for ε = 1
    with pytest.raises(TypeError):
        dpsvi.fit(sp.csr_matrix(np.ones((3, 4))), 2, epsilon=1.0, delta=1e-6, seed=0, bogus=1)


# ----------------------------------------------------------------------------- TopicDP

def test_topicdp_large_epsilon_recovers_topics_with_sampled_sensitivity(corpus):
    model, X = corpus
    W, info = topicdp.fit(X, K, epsilon=1e3, delta=1e-6, seed=0, n_sensitivity_samples=2,
                          gamma=None, sensitivity_n_docs=2000,
                          base_kwargs={"batch_size": 500, "passes": 2})
    _on_simplex(W, K, V)
    assert "random DP" in info["guarantee"] and "weaker" in info["guarantee"]
    assert info["unit"].startswith("one document")
    assert info["h"] == 2 and len(info["sensitivity_samples"]) == 2
    assert info["sensitivity"] == max(info["sensitivity_samples"]) > 0
    assert 0 < info["gamma"] < 1
    err = matched_topic_error(model.topics, W)["l2_mean"]
    assert err < 0.05, err


def test_topicdp_noise_scale_follows_paper_formula():
    # ε = 3, δ = 1e-4, α = 2 (the paper's order), Δ_s = 0.01: Proposition 2 then Theorem 2.
    eps, delta, a, ds = 3.0, 1e-4, 2.0, 0.01
    zeta = (1 / a) * (1 - 1 / a) ** (a - 1)
    first = eps - math.log(zeta / delta) / (a - 1)
    second = eps + math.log((math.exp(eps) - a * delta)
                            * ((delta - 1) / (delta - math.exp(eps))) ** a + a * delta) / (a - 1)
    eps_r = max(first, second)
    assert first < 0 < second and eps_r == pytest.approx(0.0038098, rel=1e-4)
    sigma, er = topicdp.noise_scale(ds, eps, delta, a)
    assert er == pytest.approx(eps_r, rel=1e-9)
    assert sigma == pytest.approx(math.sqrt(a * ds ** 2 / (2 * eps_r)), rel=1e-9)
    assert sigma == pytest.approx(0.16201, rel=1e-3)
    # the order-optimised calibration is close to (and never tighter than) the exact Gaussian
    import dp_accounting
    s_opt, _ = topicdp.noise_scale(1.0, 1.0, 1e-6, topicdp.optimal_order(1.0, 1e-6))
    s_exact = dp_accounting.get_sigma_gaussian(1.0, 1e-6)
    assert s_exact <= s_opt <= 1.15 * s_exact
    # Algorithm 1 sizes: the paper's γ = 0.1 needs h = 285 pairs; the default γ = 0.3 needs 24
    p = topicdp.sampler_parameters(0.1)
    assert (p["h"], p["k"]) == (285, 285)
    assert topicdp.sampler_parameters(0.3)["h"] == 24
    assert topicdp.sampler_parameters(None, 24)["gamma"] <= 0.3


def test_topicdp_given_sensitivity_noise_and_simplex(corpus):
    _, X = corpus
    kw = dict(delta=1e-4, seed=0, sensitivity=0.01, base_kwargs={"batch_size": 1000})
    W, info = topicdp.fit(X[:3000], K, epsilon=3.0, **kw)
    _on_simplex(W, K, V)
    assert info["sigma"] == pytest.approx(0.16201, rel=1e-3)
    assert info["expected_noise_amplitude"] == pytest.approx(2 * info["sigma"] / math.sqrt(2 * math.pi))
    assert info["epsilon_gaussian_exact"] < 3.0            # the paper's α = 2 is conservative
    W2, info2 = topicdp.fit(X[:3000], K, epsilon=3.0, calibration="optimal_order", **kw)
    _on_simplex(W2, K, V)
    assert info2["sigma"] < info["sigma"]
    assert info2["epsilon_gaussian_exact"] <= 3.0 + 1e-9
    # noise grows as ε shrinks
    _, info3 = topicdp.fit(X[:3000], K, epsilon=1.0, **kw)
    assert info3["sigma"] > info["sigma"]


@pytest.mark.parametrize("kw", [
    {"epsilon": 0.0}, {"delta": 0.0}, {"delta": 1.5}, {"gamma": 0.0}, {"gamma": 1.2},
    {"gamma": None, "n_sensitivity_samples": 1}, {"gamma": 0.05, "n_sensitivity_samples": 10},
    {"gamma": None}, {"calibration": "laplace"}, {"base": "hdp"}, {"renyi_order": 1.0},
    {"renyi_order": 2.0e6}, {"sensitivity": -1.0},
])
def test_topicdp_bad_parameters(corpus, kw):
    _, X = corpus
    args = {"epsilon": 1.0, "delta": 1e-6, "seed": 0, "sensitivity": 0.01, **kw}
    with pytest.raises(ValueError):
        topicdp.fit(X[:200], K, **args)
