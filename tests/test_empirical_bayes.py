"""Empirical Bayes posterior means (streamdp.empirical_bayes), the denoiser of published topics.

Checked against known priors: a point mass (pure noise → ≈ 0; a constant → that constant), a
two-point prior (against the brute-force posterior mean under the true prior), and the
properties the published topics rely on: non-negative, monotone in x, deterministic.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from streamdp.empirical_bayes import npmle_posterior_mean


def _normal_pdf(x, mu, sd):
    return np.exp(-0.5 * ((x - mu) / sd) ** 2) / (sd * math.sqrt(2.0 * math.pi))


def test_point_mass_priors_are_recovered():
    rng = np.random.default_rng(1)
    sd = 2.0
    x = rng.normal(0.0, sd, 4000)                                   # μ = 0 everywhere
    noise = npmle_posterior_mean(x, sd)
    # the fitted prior keeps a little mass near the largest draws (measured: x = 3.75σ → 0.63σ)
    assert noise.min() >= 0.0 and np.quantile(noise, 0.99) < 0.1 * sd      # measured 0.048σ
    assert np.all(noise[x > 0.5 * sd] < x[x > 0.5 * sd])             # every draw shrunk
    shifted = npmle_posterior_mean(30.0 + rng.normal(0.0, sd, 4000), sd)
    assert np.quantile(np.abs(shifted - 30.0), 0.99) < 0.5 * sd     # grid spacing ≈ 5%: ±1.5


def test_two_point_prior_matches_the_brute_force_posterior_mean():
    rng = np.random.default_rng(7)
    sd, top = 2.0, 20.0
    mu = np.where(rng.random(4000) < 0.5, 0.0, top)
    x = mu + rng.normal(0.0, sd, mu.size)
    got = npmle_posterior_mean(x, sd)
    l0, l1 = _normal_pdf(x, 0.0, sd), _normal_pdf(x, top, sd)
    brute = l1 * top / (l0 + l1)                                    # E[μ | x], true prior ½/½
    # the bulk matches; the fitted prior's small extra atoms move a few outliers (x = 27.5 → 22.7)
    assert np.quantile(np.abs(got - brute), 0.99) < 0.05 * top
    assert np.abs(got - mu).mean() < 0.1 * sd                       # the raw x: ≈ 0.8σ
    assert np.abs(got - mu).mean() < 0.2 * np.abs(x - mu).mean()


def test_posterior_mean_is_non_negative_monotone_and_below_the_grid_top():
    rng = np.random.default_rng(3)
    sd = 5.0
    x = np.abs(rng.standard_cauchy(3000)) * 10.0 + rng.normal(0.0, sd, 3000)
    x[:5] = [-40.0, -3.0, 0.0, 1e-9, 2.0]                           # negative and tiny sums
    got = npmle_posterior_mean(x, sd)
    assert np.all(got >= 0.0) and np.all(got <= max(x.max(), sd) * (1 + 1e-12))
    order = np.argsort(x, kind="stable")
    assert np.all(np.diff(got[order]) >= -1e-9 * got.max())         # Var(μ | x) ≥ 0 (Tweedie)


def test_a_value_far_from_every_grid_point_keeps_its_size():
    """Geometric grid points are ≈ 5% apart: a sum of 10⁵σ sits ≈ 2,500σ from the nearest one,
    whose Gaussian likelihood underflows to 0. The posterior mean must stay near the value
    (on the unscaled likelihoods it was 0: the largest word zeroed)."""
    rng = np.random.default_rng(11)
    sd = 1.0
    x = np.concatenate([rng.normal(0.0, sd, 2000), [3.1e4, 5.2e4, 9.7e4, 1.0e5]])
    got = npmle_posterior_mean(x, sd)
    np.testing.assert_allclose(got[-4:], x[-4:], rtol=0.05)


def test_posterior_mean_reads_only_x_and_sd(monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.normal(3.0, 1.0, 500)
    first = npmle_posterior_mean(x, 1.0)

    def no_draws(*a, **k):
        raise AssertionError("the posterior mean must not draw random numbers")

    monkeypatch.setattr(np.random, "default_rng", no_draws)
    monkeypatch.setattr(np.random, "normal", no_draws)
    state = np.random.get_state()[1].copy()
    again = npmle_posterior_mean(x.copy(), 1.0)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(np.random.get_state()[1], state)


@pytest.mark.parametrize("sd", [0.0, -1.0, float("nan")])
def test_a_noise_sd_that_is_not_positive_is_refused(sd):
    with pytest.raises(ValueError, match="sd must be > 0"):
        npmle_posterior_mean(np.ones(3), sd)


def test_posterior_means_do_not_depend_on_the_chunk_size(monkeypatch):
    """The posterior is computed a chunk of values at a time (bounded memory): the same values,
    up to the last bit (BLAS may sum a small block in another order)."""
    import streamdp.empirical_bayes as eb
    rng = np.random.default_rng(2)
    x = np.abs(rng.standard_cauchy(1000)) * 3.0 + rng.normal(0.0, 1.0, 1000)
    whole = npmle_posterior_mean(x, 1.0)
    monkeypatch.setattr(eb, "CHUNK", 7)
    np.testing.assert_allclose(npmle_posterior_mean(x, 1.0), whole, rtol=1e-13, atol=1e-300)
