import numpy as np
import pytest

from streamdp.privacy.noise import CSPRNGGaussianSampler
from streamdp.tensor.power_method import ExactOracle, PowerMethodConfig, robust_power_method
from streamdp.tensor.private import NoisyQueryOracle, QueryBudgetExceeded


def orthogonal_tensor(rng, k, m):
    V = np.linalg.qr(rng.standard_normal((m, k)))[0]
    lam = np.sort(rng.uniform(1, 5, size=k))[::-1]
    return np.einsum("t,it,jt,kt->ijk", lam, V, V, V), lam, V


def test_recovers_orthogonal_decomposition(rng):
    T, lam, V = orthogonal_tensor(rng, 4, 6)
    got_lam, got_V = robust_power_method(ExactOracle(T), 4, PowerMethodConfig(seed=1))
    order = np.argsort(-got_lam)
    assert np.allclose(got_lam[order], lam, rtol=1e-8)
    assert np.allclose(np.abs(got_V[:, order].T @ V), np.eye(4), atol=1e-6)
    assert np.all(got_lam > 0)


def test_odd_order_sign_is_normalised(rng):
    T, lam, V = orthogonal_tensor(rng, 3, 3)
    got_lam, got_V = robust_power_method(ExactOracle(-T), 3, PowerMethodConfig(seed=2))
    # -Σλ v⊗3 = Σλ (−v)⊗3: eigenvalues stay positive, vectors flip
    assert np.all(got_lam > 0)
    assert np.allclose(np.sort(got_lam), np.sort(lam), rtol=1e-8)


def test_noisy_query_oracle_counts_queries_and_refuses_extra(rng):
    T, lam, V = orthogonal_tensor(rng, 3, 3)
    cfg = PowerMethodConfig(n_restarts=4, n_iter=5, seed=0)
    K = cfg.n_queries(3)
    W = np.eye(3)
    oracle = NoisyQueryOracle(T, np.zeros_like(T), 1.0, 1e-9, W, 1.0, K, CSPRNGGaussianSampler(0))
    got_lam, got_V = robust_power_method(oracle, 3, cfg)
    assert oracle.n_queries == K == 3 * 4 * 6
    with pytest.raises(QueryBudgetExceeded):
        oracle.iuu(np.ones((3, 1)) / np.sqrt(3))
    # negligible noise (sensitivity 1e-9): the answer is the exact decomposition
    assert np.allclose(np.sort(got_lam), np.sort(lam), rtol=1e-3)


def test_noisy_query_noise_scales_with_sensitivity(rng):
    m = 4
    S = np.zeros((m, m, m))
    W = np.diag([1.0, 2.0, 3.0, 4.0])
    oracle = NoisyQueryOracle(S, np.zeros_like(S), 1.0, 0.5, W, 2.0, 10**6, CSPRNGGaussianSampler(1))
    u = np.zeros((m, 1)); u[3] = 1.0
    draws = np.hstack([oracle.iuu(np.repeat(u, 500, axis=1))])
    # σ = ν · C3 · ‖W‖₂ · ‖Wu‖² = 2 · 0.5 · 4 · 16
    assert np.std(draws) == pytest.approx(64.0, rel=0.05)
