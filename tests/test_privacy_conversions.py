"""zCDP ↔ (ε, δ) conversions: known answers, both libraries, safety of the inverse."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.stats import norm

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from streamdp.privacy.conversions import RHO_RTOL, zcdp_delta, zcdp_epsilon, zcdp_rho
from streamdp.privacy.events import ROUNDING_SLACK, GaussianEvent, sigma_for_rho

DENSE_ORDERS = 1.0 + np.logspace(-3, 4, 20000)


def dp_accounting_epsilon(rho, delta, orders=None):
    acc = rdp.RdpAccountant(orders=orders)        # default: add/remove neighbours
    acc.compose(dp_accounting.ZCDpEvent(rho))
    return acc.get_epsilon(delta)


def gaussian_delta(mu, eps):
    """Exact privacy profile of the Gaussian mechanism, μ = Δ/σ (Balle & Wang 2018)."""
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


# --------------------------------------------------------------- published values
def test_published_opendp_value():
    # opendp rust/src/combinators/measure_cast/zCDP_to_approxDP/test.rs:
    # Gaussian scale 4, d_in 1 → ρ = 1/32; ε(δ=1e-3) = 0.6880024554878085,
    # δ(ε=0) = 0.1508457845622862.
    rho = (1.0 / 4.0) ** 2 / 2.0
    assert zcdp_epsilon(rho, 1e-3) == pytest.approx(0.6880024554878085, abs=1e-15)
    assert zcdp_delta(rho, 0.0) == pytest.approx(0.1508457845622862, abs=1e-15)
    assert zcdp_delta(rho, 0.6880024554878085) == pytest.approx(1e-3, rel=1e-12)


def test_published_dp_accounting_value():
    # dp_accounting rdp_privacy_accountant_test.test_compute_epsilon_delta_gaussian:
    # noise multiplier 4.530877117 "is chosen to obtain exactly (1, 1e-6)-DP".
    rho = 1.0 / (2.0 * 4.530877117**2)
    assert zcdp_epsilon(rho, 1e-6) == pytest.approx(1.0, abs=1e-7)
    assert zcdp_delta(rho, 1.0) == pytest.approx(1e-6, rel=1e-6)
    assert zcdp_rho(1.0, 1e-6) == pytest.approx(rho, rel=1e-7)


# ------------------------------------------------------------- both libraries
GRID = [(r, d) for r in (1e-5, 1e-3, 0.03, 0.5, 2.0, 30.0) for d in (1e-12, 1e-8, 1e-5, 1e-2)]


@pytest.mark.parametrize("rho,delta", GRID)
def test_matches_dp_accounting(rho, delta):
    ours = zcdp_epsilon(rho, delta)
    dense = dp_accounting_epsilon(rho, delta, DENSE_ORDERS)
    default = dp_accounting_epsilon(rho, delta)
    # Same formula: ours is the exact infimum over α, theirs the min on a grid.
    assert ours == pytest.approx(dense, rel=1e-6, abs=1e-9)
    assert ours <= dense + 1e-12
    assert ours <= default + 1e-12
    # Never worse than Bun–Steinke's ρ + 2√(ρ log 1/δ), never better than the
    # exact Gaussian profile (a Gaussian with μ = √(2ρ) is ρ-zCDP).
    assert ours <= rho + 2 * math.sqrt(rho * math.log(1 / delta)) + 1e-12
    assert zcdp_delta(rho, ours) >= gaussian_delta(math.sqrt(2 * rho), ours) - 1e-15


@pytest.mark.parametrize("rho,eps", [(0.01, 0.5), (0.5, 3.0), (2.0, 10.0), (0.1, 0.0)])
def test_delta_matches_dp_accounting(rho, eps):
    acc = rdp.RdpAccountant(orders=DENSE_ORDERS)
    acc.compose(dp_accounting.ZCDpEvent(rho))
    assert zcdp_delta(rho, eps) == pytest.approx(acc.get_delta(eps), rel=1e-5)
    assert zcdp_delta(rho, eps) <= acc.get_delta(eps) * (1 + 1e-12)


def test_matches_opendp_gaussian_measurement():
    import opendp.prelude as dp

    dp.enable_features("contrib")
    sens, sigma = 0.37, 1.9
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l2_distance(T=float)
    meas = dp.c.make_zCDP_to_approxDP(dp.m.make_gaussian(*space, scale=sigma))
    ev = GaussianEvent("z", sens, sigma)
    # the event is charged as OpenDP's Gaussian at Δ + ROUNDING_SLACK·σ (the samplers' rounding)
    charged = sens + ROUNDING_SLACK * sigma
    assert zcdp_epsilon(ev.rho, 1e-7) == pytest.approx(meas.map(charged).epsilon(1e-7), rel=1e-12)
    assert zcdp_epsilon(ev.rho, 1e-7) >= meas.map(sens).epsilon(1e-7)


def test_event_convention_matches_dp_accounting_gaussian():
    # dp_accounting issue 378: its GaussianDpEvent is add/remove with
    # noise_multiplier = σ/Δ; our GaussianEvent.rho must be the same mechanism (at the charged
    # sensitivity Δ + ROUNDING_SLACK·σ).
    ev = GaussianEvent("z", sensitivity=0.3, sigma=1.7, count=3)
    assert ev.noise_multiplier == pytest.approx(1.7 / (0.3 + ROUNDING_SLACK * 1.7), rel=1e-15)
    a = rdp.RdpAccountant(orders=DENSE_ORDERS)
    a.compose(dp_accounting.GaussianDpEvent(ev.noise_multiplier), count=ev.count)
    b = rdp.RdpAccountant(orders=DENSE_ORDERS)
    b.compose(dp_accounting.ZCDpEvent(ev.rho))
    np.testing.assert_allclose(a._rdp, b._rdp, rtol=1e-12)
    assert zcdp_epsilon(ev.rho, 1e-6) == pytest.approx(a.get_epsilon(1e-6), rel=1e-6)


# ------------------------------------------------------------------- inverse
@settings(max_examples=25, deadline=None)
@given(eps=st.floats(0.01, 30.0), log10_delta=st.floats(-14.0, -2.0))
def test_rho_is_never_optimistic_and_tight(eps, log10_delta):
    delta = 10.0**log10_delta
    rho = zcdp_rho(eps, delta)
    assert zcdp_epsilon(rho * (1 + RHO_RTOL), delta) <= eps
    assert zcdp_epsilon(rho * (1 + 1e-6), delta) > eps      # within 1e-6 of optimal


def test_rho_round_trip_through_sigma():
    # The planning path: ε,δ → ρ → σ for sensitivity Δ → event ρ → ε.
    rho = zcdp_rho(2.0, 1e-7)
    ev = GaussianEvent("z", 0.05, sigma_for_rho(0.05, rho))
    assert ev.rho <= rho * (1 + RHO_RTOL)
    assert zcdp_epsilon(ev.rho, 1e-7) <= 2.0


# ---------------------------------------------------------------- properties
def test_monotone():
    rhos = [1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0]
    eps = [zcdp_epsilon(r, 1e-6) for r in rhos]
    assert all(a < b for a, b in zip(eps, eps[1:]))
    deltas = [1e-12, 1e-9, 1e-6, 1e-3]
    eps = [zcdp_epsilon(0.1, d) for d in deltas]
    assert all(a > b for a, b in zip(eps, eps[1:]))


def test_edge_cases():
    assert zcdp_epsilon(0.0, 1e-6) == 0.0
    assert zcdp_epsilon(0.5, 1.0) == 0.0
    assert zcdp_epsilon(0.5, 0.0) == math.inf
    assert zcdp_delta(0.0, 1.0) == 0.0
    assert zcdp_delta(0.5, math.inf) == 0.0
    # Beyond OpenDP's range: falls back to dp_accounting, still an upper bound.
    huge = zcdp_epsilon(1e6, 1e-6)
    assert 1e6 < huge <= 1e6 + 2 * math.sqrt(1e6 * math.log(1e6)) + 1e-6
    for bad in [(-1.0, 1e-6), (math.nan, 1e-6), (0.1, 1.5), (0.1, -1e-9)]:
        with pytest.raises(ValueError):
            zcdp_epsilon(*bad)
    for bad in [(0.0, 1e-6), (-1.0, 1e-6), (1.0, 0.0), (1.0, 1.0), (math.inf, 1e-6)]:
        with pytest.raises(ValueError):
            zcdp_rho(*bad)
