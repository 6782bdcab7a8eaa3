"""The BLT strategy step's float rounding bound and what the stream is charged for it.

A document of epoch s changes the *computed* y_t (t ≥ s) by at most Δ·(c_{t−s} + ε): c_{t−s}·Δ
from its epoch sum plus 2F for the strategy step's own rounding (:func:`strategy_rounding_bound`),
ε = 2F/Δ (:func:`rounding_ratio`). The rounding term does not decay, so the stream has a public
horizon T_max (:data:`DEFAULT_MAX_EPOCHS`): σ is set for ρ/W, W ≥ Σ_{j<T_max}(c_j + ε)²
(:func:`charged_weight`, :func:`charged_total`, :func:`calibrate_unit_rho`). Proof:
docs/privacy.md §BLT and §Floating point.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from streamdp.privacy import rounding
from streamdp.privacy.blt_factorization import BLTParams
from streamdp.privacy.events import ROUNDING_SLACK, GaussianEvent

#: the largest number of epochs a BLT stream may close (public; σ is calibrated for it, the
#: aggregator refuses epoch T_max + 1 before reserving): the per-step rounding term of the
#: sensitivity does not decay, so Σ_t (per-step sensitivity)² grows without bound
DEFAULT_MAX_EPOCHS = 10 ** 6
#: absolute underflow allowance (Frobenius) of one computed (Cx)_t: every float operation has
#: absolute error ≤ 2⁻¹⁰⁷⁴ on top of its relative one; ≤ 16 such per entry per step, amplified
#: by ≤ ‖c‖₁, over ≤ 2⁶⁴ entries: ≤ 2⁻¹⁰⁰⁶·‖c‖₁ < this·‖c‖₁
_UNDERFLOW = 2.0 ** -1000


def strategy_rounding_bound(params: BLTParams, magnitude: float) -> float:
    """F: bound on ‖v̂_t − (C·x̂)_t‖_F, the float error of the BLT's own arithmetic.

    x̂_1, x̂_2, … are the computed epoch sums (float64) with ‖x̂_s‖_F ≤ ``magnitude`` =: X
    (X = N_max·M_b + R_b for a block, :mod:`streamdp.privacy.rounding`), (C·x̂)_t the exact
    value and v̂_t what :meth:`~streamdp.privacy.blt.BLTAggregator.add_epoch` computes (raw buffers in
    double-double, one final rounding). Proof: docs/privacy.md §"Floating point", step BLT:

    * buffer i: R̂_{t+1} = θR̂_t + x̂_t + δ with |δ| ≤ 7u²(θ|R̂_t| + |x̂_t|) entrywise
      (TwoProd/TwoSum exact, 3 roundings of second-order terms); the errors decay with θ, so
      ‖R̂_{i,t} − R_{i,t}‖_F ≤ D_i = 14u²X/(1 − θ_i)² (valid while 7u²θ/(1 − θ) ≤ ½, always);
    * output: x̂_t + Σ ω_i R̂_i in double-double (error ≤ K·u²·T_abs, K = 1.01(3n(n+2)+3),
      n = nbuf) then rounded once (≤ u·(1 + K u²)·T_abs), T_abs ≤ X + (1+2u)Σω_i(X/(1−θ_i) + D_i)
      = ‖c‖₁X + O(u²);

    F = (u + 2Ku²)·T_abs + Σ ω_i D_i + 2⁻¹⁰⁰⁰‖c‖₁ (underflow). Dominant term: u·‖c‖₁·X.
    """
    u = rounding.UNIT_ROUNDOFF
    th, om = np.asarray(params.theta, float), np.asarray(params.omega, float)
    X = float(magnitude)
    if not (X >= 0 and math.isfinite(X)):
        raise ValueError(f"magnitude bound must be finite and >= 0, got {magnitude!r}")
    if np.any(7 * u * u * th / (1 - th) > 0.5):
        raise ValueError("BLT θ too close to 1 for the rounding analysis")
    D = 14 * u * u * X / (1 - th) ** 2
    n = params.nbuf
    K = 1.01 * (3 * n * (n + 2) + 3)
    t_abs = X + (1 + 2 * u) * float(np.sum(om * (X / (1 - th) + D)))
    return (u + 2 * K * u * u) * t_abs + float(np.sum(om * D)) + _UNDERFLOW * params.coefs_l1()


def rounding_ratio(params: BLTParams, unit: Sequence[GaussianEvent],
                   magnitudes: Sequence[float]) -> float:
    """ε = max_b 2F_b/Δ_b: epoch t charges every block at sensitivity Δ_b·(c_{t−1} + ε) ≥
    c_{t−1}·Δ_b + 2F_b (one ε for all blocks: the unit plan's ρ split stays as planned)."""
    eps = 0.0
    for e, X in zip(unit, magnitudes, strict=True):
        eps = max(eps, 2.0 * strategy_rounding_bound(params, X) / float(e.sensitivity))
    return eps


def charged_weight(params: BLTParams, eps: float, max_epochs: int) -> float:
    """W ≥ Σ_{j<T_max} (c_j + ε)²: ‖c‖²_∞ + 2ε‖c‖₁ + T_max·ε² (c_j > 0). σ of the unit plan
    is set for ρ_unit = ρ/W, so T_max epochs cost ≤ ρ."""
    return params.sensitivity_squared() + 2.0 * eps * params.coefs_l1() + int(max_epochs) * eps * eps


def charged_total(unit: Sequence[GaussianEvent], sum_c: float, sum_c2: float, n: int) -> float:
    """What n epochs whose steps are scaled by c̃_1 … c̃_n (Σc̃ = ``sum_c``, Σc̃² = ``sum_c2``) are
    charged, each event as :attr:`GaussianEvent.rho` charges it — count·(c̃Δ/σ + s)²/2 with s =
    ROUNDING_SLACK, the samplers' input rounding, which does *not* scale with c̃:
    Σ_e count_e/2 · (a_e²·Σc̃² + 2a_e·s·Σc̃ + n·s²), a_e = Δ_e/σ_e. Monotone in both sums, so
    upper bounds on them give an upper bound on the charge."""
    s = ROUNDING_SLACK
    total = 0.0
    for e in unit:
        a = float(e.sensitivity) / float(e.sigma)
        total += e.count * (a * a * sum_c2 + 2.0 * a * s * sum_c + n * s * s) / 2.0
    return total


def calibrate_unit_rho(rho: float, aggregator_for: Callable[[float], Any]) -> float:
    """The largest ρ_unit found (≤ ρ/W) whose T_max epochs are charged at most ρ in total.

    ``aggregator_for(ρ_unit)`` builds the aggregator (a :class:`~streamdp.privacy.blt.BLTAggregator`)
    whose unit plan is calibrated at ρ_unit.
    Starting from ρ/W (W ≥ Σ(c_j + ε)², right when the charge scales with c̃²), ρ_unit shrinks by
    ρ/charged until :meth:`~streamdp.privacy.blt.BLTAggregator.charged_rho_bound` ≤ ρ: the samplers' rounding term is
    charged per event, not per unit of c̃, so ρ/W alone overshoots by ≈ 2s·σ/Δ·‖c‖₁/W
    (≈ 2·10⁻⁹ at the default parameters)."""
    if not (rho > 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    unit_rho = rho / aggregator_for(rho).charge_weight()
    for _ in range(20):
        bound = aggregator_for(unit_rho).charged_rho_bound()
        if bound <= rho:
            return unit_rho
        unit_rho *= (rho / bound) * (1.0 - 1e-12)
    raise ValueError(f"could not calibrate the BLT's unit plan within rho={rho} (the samplers' "
                     "rounding term dominates: rho per epoch is too small)")
