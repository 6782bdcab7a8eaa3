"""zCDP ↔ (ε, δ)-DP conversions (Canonne, Kamath & Steinke 2020).

The accountant's currency is ρ (zero-concentrated DP, Bun & Steinke 2016). A
ρ-zCDP mechanism is (α, αρ)-Rényi-DP for every α > 1, and Canonne–Kamath–
Steinke (2020, "The Discrete Gaussian for Differential Privacy", Prop. 12 /
Cor. 13; also Asoodeh et al. 2020) turn that into (ε, δ)-DP with

    ε(ρ, δ) = inf_{α>1}  αρ + log(1 − 1/α) − (log δ + log α)/(α − 1)
    δ(ρ, ε) = inf_{α>1}  exp((α−1)(αρ − ε)) / (α − 1) · (1 − 1/α)^α

This is tighter than the classic ε = ρ + 2√(ρ log(1/δ)) (Bun & Steinke 2016,
Prop. 1.3) and is exactly what dp_accounting's ``RdpAccountant`` evaluates for a
``ZCDpEvent`` (``rdp_privacy_accountant.compute_epsilon``, on its grid of α) and
what OpenDP's ``make_zCDP_to_approxDP`` evaluates (``cdp_epsilon``/``cdp_delta``,
exact infimum, floats rounded conservatively).

We do not re-derive it: :func:`zcdp_epsilon` and :func:`zcdp_delta` call
OpenDP (the exact infimum, vetted code), falling back to the smaller of
dp_accounting's grid and Bun–Steinke (valid upper bounds, never below the
infimum) where OpenDP overflows (ρ ≳ 10⁵, budgets nobody should configure). tests/test_privacy_conversions.py checks both
libraries against each other and against published values.

:func:`zcdp_rho` inverts the conversion for planning and is never optimistic:
``zcdp_epsilon(zcdp_rho(ε, δ) · (1 + RHO_RTOL), δ) ≤ ε``. The slack ``RHO_RTOL``
is what the accountant allows when it compares float sums of ρ with the budget,
so that splitting ρ into parts that sum to ρ up to rounding is not refused and
the enforced budget is still never worth more than the configured ε.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

# Relative float slack the accountant allows when comparing a sum of ρ with the
# budget; zcdp_rho leaves this much headroom so the slack is never optimistic.
RHO_RTOL = 1e-9

# Rényi orders for the dp_accounting fallback (dense, 1.001 … 10⁵).
_ORDERS = 1.0 + np.logspace(-3, 5, 4000)

@lru_cache(maxsize=1)
def _opendp_profile_maker():
    """A zCDP→approxDP measurement whose privacy map we use as a calculator.

    A scalar Gaussian with scale 1 and input distance d is exactly
    (d²/2)-zCDP; make_zCDP_to_approxDP turns that into OpenDP's privacy
    profile (CKS conversion). Nothing is ever sampled from it.
    """
    import opendp.prelude as dp

    dp.enable_features("contrib")
    space = dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float)
    gauss = dp.m.make_gaussian(*space, scale=1.0)
    return gauss, dp.c.make_zCDP_to_approxDP(gauss)


def _opendp_profile(rho: float):
    """OpenDP privacy profile of a ρ'-zCDP mechanism with ρ' ≥ ρ (never below)."""
    gauss, approx = _opendp_profile_maker()
    d_in = math.sqrt(2.0 * rho)
    # sqrt then square can lose an ulp; nudge d_in up until OpenDP's own
    # (conservatively rounded) ρ is at least the ρ we were asked about.
    for _ in range(8):
        if gauss.map(d_in) >= rho:
            break
        d_in = math.nextafter(d_in, math.inf)
    return approx.map(d_in)


def _dp_accounting_epsilon(rho: float, delta: float) -> float:
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    eps, _ = rdp.compute_epsilon(_ORDERS, rho * _ORDERS, delta)
    # dp_accounting skips α ≤ 1.01, where the optimum lies for huge ρ; Bun–Steinke
    # is valid too, and the smaller of two valid bounds is valid.
    return min(float(eps), rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta)))


def _dp_accounting_delta(rho: float, epsilon: float) -> float:
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    d, _ = rdp.compute_delta(_ORDERS, rho * _ORDERS, epsilon)
    bun_steinke = math.exp(-((epsilon - rho) ** 2) / (4.0 * rho)) if epsilon >= rho else 1.0
    return min(float(d), bun_steinke)


def _check_rho(rho: float) -> float:
    rho = float(rho)
    if not (math.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho must be a finite number >= 0, got {rho!r}")
    return rho


def zcdp_epsilon(rho: float, delta: float) -> float:
    """Smallest ε such that every ρ-zCDP mechanism is (ε, δ)-DP (CKS 2020).

    Parameters
    ----------
    rho : float, ≥ 0     zCDP parameter (per document, add/remove).
    delta : float in [0, 1]

    Returns
    -------
    float ε ≥ 0 (``inf`` when δ = 0 and ρ > 0).
    """
    rho = _check_rho(rho)
    delta = float(delta)
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    if rho == 0.0 or delta == 1.0:
        return 0.0
    if delta == 0.0:
        return math.inf
    try:
        return float(_opendp_profile(rho).epsilon(delta))
    except Exception:  # OpenDP raises on overflow for huge ρ
        return _dp_accounting_epsilon(rho, delta)


def zcdp_delta(rho: float, epsilon: float) -> float:
    """Smallest δ such that every ρ-zCDP mechanism is (ε, δ)-DP (CKS 2020)."""
    rho = _check_rho(rho)
    epsilon = float(epsilon)
    if not (epsilon >= 0):
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    if rho == 0.0:
        return 0.0
    if math.isinf(epsilon):
        return 0.0
    try:
        return min(1.0, float(_opendp_profile(rho).delta(epsilon)))
    except Exception:
        return min(1.0, _dp_accounting_delta(rho, epsilon))


@lru_cache(maxsize=64)
def zcdp_rho(epsilon: float, delta: float) -> float:
    """Largest ρ (up to 1e-12 relative) whose conversion stays within (ε, δ).

    Bisection on the monotone map ρ ↦ zcdp_epsilon(ρ, δ), keeping only
    feasible points, so the result is never optimistic even with
    ``RHO_RTOL`` of slack: ``zcdp_epsilon(ρ·(1 + RHO_RTOL), δ) ≤ ε``.

    Parameters
    ----------
    epsilon : float > 0
    delta : float in (0, 1)
    """
    epsilon, delta = float(epsilon), float(delta)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")

    def feasible(r: float) -> bool:
        return zcdp_epsilon(r * (1.0 + RHO_RTOL), delta) <= epsilon

    # Bun–Steinke: ε_CKS ≤ ρ + 2√(ρ log(1/δ)); its inverse is a feasible start.
    L = math.log(1.0 / delta)
    lo = (math.sqrt(L + epsilon) - math.sqrt(L)) ** 2
    while not feasible(lo):          # only float edge cases land here
        lo /= 2.0
        if lo < 1e-300:
            raise ValueError(f"no positive rho fits (epsilon={epsilon}, delta={delta})")
    hi = 2.0 * lo
    while feasible(hi):
        lo, hi = hi, 2.0 * hi
    while (hi - lo) > 1e-12 * lo:
        mid = 0.5 * (lo + hi)
        if feasible(mid):
            lo = mid
        else:
            hi = mid
    if not feasible(lo):                      # cannot happen: lo only moves to feasible points
        raise ArithmeticError(f"zcdp_rho({epsilon}, {delta}) bisection lost feasibility")
    return lo
