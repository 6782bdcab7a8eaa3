"""Buffered linear Toeplitz (BLT) matrix-factorization mechanism for continual release
(Dvijotham, McMahan, Pillutla, Steinke, Thakurta 2024; McMahan, Xu, Zhang 2024).

Prefix sums A·x (A lower-triangular ones) are released as B·(C·x + z) with A = B·C,
B = A·C⁻¹, z_t i.i.d. N(0, σ²) per coordinate. C is lower-triangular Toeplitz with
coefficients c_0 = 1, c_j = Σ_i ω_i θ_i^{j−1} (j ≥ 1), 0 < θ_i < 1, ω_i > 0. Hence

* the mechanism is y = Cx + z, one Gaussian mechanism per epoch on the data value (Cx)_t =
  x_t + Σ_i ω_i R_{i,t}, R_{i,t+1} = θ_i R_{i,t} + x_t (raw buffers: secret data arithmetic,
  double-double, rounding bound :func:`strategy_rounding_bound`); the release is
  post-processing of y only: x̃_t = y_t − Σ_i ω_i P_{i,t}, P_{i,t+1} = θ_i P_{i,t} + x̃_t
  (public buffers; C x̃ = y), release_t = Σ_{s≤t} x̃_s = Σ_{s≤t} x_s + Σ_{s≤t} (C⁻¹z)_s
  (:meth:`BLTAggregator.add_epoch`);
* the release noise at t has variance σ²·Σ_{m<t} P_m² per coordinate, P_m = Σ_{i≤m} ĉ_i
  (ĉ the coefficients of C⁻¹) — :meth:`BLTParams.noise_variance`;
* ‖c‖² = Σ_j c_j² = 1 + Σ_{i,k} ω_i ω_k / (1 − θ_i θ_k) is finite over an infinite horizon.

Accounting (proof in docs/privacy.md §BLT and §Floating point)
---------------------------------------------------------------
y_t = (C x)_t + z_t is an adaptive sequence of Gaussian mechanisms with independent noise
(Denisov et al. 2022: adaptivity is free for lower-triangular C with Gaussian noise); the
release is post-processing of y. A document of epoch s changes the *computed* y_t (t ≥ s) by
at most Δ·(c_{t−s} + ε): c_{t−s}·Δ from its epoch sum (Δ includes that sum's rounding) plus
2F for the strategy step's own rounding, ε = 2F/Δ (:func:`rounding_ratio`). At epoch t the
aggregator reserves, for each block of the unit plan, one event of sensitivity
Δ_b·(c_{t−1} + ε) on the whole-stream partition: the accountant's load after t epochs is the
worst document's loss bound. The rounding term does not decay, so the stream has a public
horizon T_max (``max_epochs``, default 10⁶): σ is set for ρ/W, W ≥ Σ_{j<T_max}(c_j + ε)²
(:func:`charged_weight`), and epoch T_max + 1 is refused before reserving.

The parameters (θ, ω) are optimised for a horizon n (max or mean prefix-sum error over
epochs 1..n times the infinite-horizon ‖c‖²) by :func:`optimize_blt`; past n the error
keeps growing (linearly in t, slowly) but the privacy guarantee is unchanged (up to T_max).

State (schema v2): the noised prefix (a DP output), ``nbuf`` public buffers and ``nbuf`` raw
buffers in double-double — *secret* (exponentially weighted raw epoch sums): protect
checkpoints like raw data.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, Protocol, Sequence, TypeVar

import numpy as np

from streamdp import serialization as ser
from streamdp.privacy import rounding
from streamdp.privacy.events import ROUNDING_SLACK, STREAM, BudgetSpender, EventLog, GaussianEvent
from streamdp.privacy.spend import Codec, spend
from streamdp.privacy.tree import HorizonExceeded

V = TypeVar("V")

SCHEMA_VERSION = 2     # v2: raw + public buffers (v1: secret noise buffers)
_PARAMS_FILE = Path(__file__).with_name("blt_params.json")


# ---------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class BLTParams:
    """θ (buffer decays, 0 < θ < 1) and ω (output scales, > 0) of the strategy matrix C."""

    theta: tuple[float, ...]
    omega: tuple[float, ...]

    def __post_init__(self) -> None:
        th, om = np.asarray(self.theta, float), np.asarray(self.omega, float)
        if th.ndim != 1 or th.shape != om.shape or th.size < 1:
            raise ValueError(f"BLT needs equal-length non-empty θ, ω; got {self.theta}, {self.omega}")
        if not (np.all(th > 0) and np.all(th < 1) and np.all(om > 0) and np.all(np.isfinite(om))):
            raise ValueError(f"BLT needs 0 < θ < 1 and ω > 0 (finite column norm); got θ={self.theta}, "
                             f"ω={self.omega}")

    @property
    def nbuf(self) -> int:
        return len(self.theta)

    def to_dict(self) -> dict:
        return {"theta": [float(x) for x in self.theta], "omega": [float(x) for x in self.omega]}

    @classmethod
    def from_dict(cls, obj: dict) -> "BLTParams":
        return cls(tuple(float(x) for x in obj["theta"]), tuple(float(x) for x in obj["omega"]))

    # --------------------------------------------------------- strategy C
    def coefs(self, n: int) -> np.ndarray:
        """c_0 … c_{n−1} of C."""
        th, om = np.asarray(self.theta), np.asarray(self.omega)
        out = np.empty(n)
        out[0] = 1.0
        if n > 1:
            out[1:] = (th[None, :] ** np.arange(n - 1)[:, None]) @ om
        return out

    def coefs_l1(self) -> float:
        """‖c‖₁ = Σ_j c_j = 1 + Σ_i ω_i/(1 − θ_i) (every c_j > 0)."""
        th, om = np.asarray(self.theta), np.asarray(self.omega)
        return float(1.0 + np.sum(om / (1.0 - th)))

    def sensitivity_squared(self, n: int | None = None) -> float:
        """Σ_{j<n} c_j² (n=None: the infinite sum, 1 + Σ ω_iω_k/(1 − θ_iθ_k))."""
        if n is not None:
            return float(np.sum(self.coefs(n) ** 2))
        th, om = np.asarray(self.theta), np.asarray(self.omega)
        return float(1.0 + om @ (1.0 / (1.0 - np.outer(th, th))) @ om)

    # --------------------------------------------------------- noising C⁻¹
    def inverse_matrix(self) -> np.ndarray:
        """A = Θ − 1ωᵀ: the buffer update of C⁻¹ (see :meth:`BLTAggregator.add_epoch`)."""
        th, om = np.asarray(self.theta), np.asarray(self.omega)
        return np.diag(th) - np.outer(np.ones_like(th), om)

    def inverse_coefs(self, n: int) -> np.ndarray:
        """ĉ_0 … ĉ_{n−1} of C⁻¹: ĉ_0 = 1, ĉ_j = −ωᵀ A^{j−1} 1 (A = Θ − 1ωᵀ)."""
        A, om = self.inverse_matrix(), np.asarray(self.omega)
        lam, V = np.linalg.eig(A)
        left = om @ V                                    # ωᵀV
        right = np.linalg.solve(V, np.ones(self.nbuf))   # V⁻¹1
        out = np.empty(n)
        out[0] = 1.0
        if n > 1:
            pw = lam[None, :] ** np.arange(n - 1)[:, None]
            out[1:] = -np.real(pw @ (left * right))
        return out

    def noise_variance(self, n: int) -> np.ndarray:
        """Per-coordinate variance of the release noise at epochs 1 … n, in units of σ²."""
        P = np.cumsum(self.inverse_coefs(n))
        return np.cumsum(P * P)

    def error_profile(self, n: int) -> np.ndarray:
        """Release variance at epochs 1 … n in units of Δ²/(2ρ): ‖c‖²_∞ · noise_variance."""
        return self.sensitivity_squared() * self.noise_variance(n)


# ---------------------------------------------------------------------------- references
def tree_error_profile(n: int) -> np.ndarray:
    """The binary tree's release variance at epochs 1 … n in units of Δ²/(2ρ): depth·popcount(t)."""
    depth = int(n).bit_length()
    return depth * np.array([bin(t).count("1") for t in range(1, n + 1)], dtype=float)


def sqrt_toeplitz_coefs(n: int) -> np.ndarray:
    """Coefficients of (1 − x)^{−1/2} (the square-root factorization C = A^{1/2})."""
    j = np.arange(1, n)
    return np.concatenate([[1.0], np.cumprod((2 * j - 1) / (2 * j))])


def sqrt_toeplitz_error_profile(n: int) -> np.ndarray:
    """Square-root factorization (full memory, horizon n): ‖c‖²_n · Σ_{m<t} P_m², C⁻¹ = A^{1/2}."""
    c = sqrt_toeplitz_coefs(n)
    P = c.copy()           # partial sums of (1−x)^{1/2} are the coefficients of (1−x)^{−1/2}
    return float(np.sum(c * c)) * np.cumsum(P * P)


# ---------------------------------------------------------------------------- optimisation
def _unpack(x: np.ndarray, nbuf: int) -> tuple[np.ndarray, np.ndarray]:
    th = 1.0 / (1.0 + np.exp(-x[:nbuf]))
    om = np.exp(x[nbuf:])
    return th, om


def _loss(x: np.ndarray, nbuf: int, n: int, objective: str) -> float:
    th, om = _unpack(x, nbuf)
    if np.any(th >= 1.0 - 1e-15) or np.any(th <= 0.0) or np.any(om <= 0.0):
        return 1e6
    pillutla = float(np.sum(om / th))      # < 1 keeps C⁻¹ well behaved (jax_privacy's penalty)
    second = float(np.sum(om))              # c_1 < 1: decreasing coefficients
    if pillutla >= 1.0 or second >= 1.0:
        return 1e6
    try:
        p = BLTParams(tuple(th), tuple(om))
        var = p.noise_variance(n)
        sens = p.sensitivity_squared()
    except (ValueError, np.linalg.LinAlgError):
        return 1e6
    err = var[-1] if objective == "max" else float(np.mean(var))
    if not np.isfinite(err) or err <= 0:
        return 1e6
    barrier = -1e-8 * (math.log(1.0 - pillutla) + math.log(1.0 - second)
                       + float(np.sum(np.log(1.0 - th))))
    return math.log(sens * err) + barrier


def optimize_blt(n: int, nbuf: int = 4, objective: str = "max") -> BLTParams:
    """Deterministic numerical optimisation of (θ, ω) for horizon n.

    Minimises ‖c‖²_∞ · max_{t≤n} Var_t (``objective="max"``, the variance at t = n, which
    is the largest) or ‖c‖²_∞ · mean_{t≤n} Var_t, with scipy's L-BFGS-B from a few fixed
    starting points (time scales spread geometrically up to n).
    """
    from scipy.optimize import minimize

    if objective not in ("max", "mean"):
        raise ValueError(f"objective must be 'max' or 'mean', got {objective!r}")
    if not (isinstance(n, (int, np.integer)) and n >= 1) or nbuf < 1:
        raise ValueError(f"need n >= 1 and nbuf >= 1, got n={n!r}, nbuf={nbuf!r}")
    best = None
    for spread in (1.0, 0.75, 1.25):
        scales = np.geomspace(2.0, max(4.0, float(n) ** spread), nbuf)   # 1/(1−θ) time scales
        th0 = 1.0 - 1.0 / scales
        om0 = np.full(nbuf, 0.4 / nbuf) * th0
        x0 = np.concatenate([np.log(th0 / (1.0 - th0)), np.log(om0)])
        res = minimize(_loss, x0, args=(nbuf, int(n), objective), method="L-BFGS-B",
                       options={"maxiter": 2000, "ftol": 1e-12, "gtol": 1e-9})
        if best is None or res.fun < best.fun:
            best = res
    th, om = _unpack(best.x, nbuf)
    order = np.argsort(-th)
    return BLTParams(tuple(float(v) for v in th[order]), tuple(float(v) for v in om[order]))


@functools.lru_cache(maxsize=None)
def _shipped() -> dict:
    try:
        return json.loads(_PARAMS_FILE.read_text())
    except FileNotFoundError:
        return {"params": {}}


def default_params(n: int, nbuf: int = 4, objective: str = "max") -> BLTParams:
    """Parameters for horizon n: the shipped table (benchmarks/blt_params.py writes it, a
    test re-derives it) or, for other n, :func:`optimize_blt` (deterministic, cached)."""
    key = f"n={int(n)},nbuf={int(nbuf)},objective={objective}"
    table = _shipped()["params"]
    if key in table:
        return BLTParams.from_dict(table[key])
    return _optimize_cached(int(n), int(nbuf), objective)


@functools.lru_cache(maxsize=64)
def _optimize_cached(n: int, nbuf: int, objective: str) -> BLTParams:
    return optimize_blt(n, nbuf, objective)


# ---------------------------------------------------------------------------- rounding
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
    value and v̂_t what :meth:`BLTAggregator.add_epoch` computes (raw buffers in
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


def calibrate_unit_rho(rho: float, aggregator_for: Callable[[float], "BLTAggregator"]) -> float:
    """The largest ρ_unit found (≤ ρ/W) whose T_max epochs are charged at most ρ in total.

    ``aggregator_for(ρ_unit)`` builds the aggregator whose unit plan is calibrated at ρ_unit.
    Starting from ρ/W (W ≥ Σ(c_j + ε)², right when the charge scales with c̃²), ρ_unit shrinks by
    ρ/charged until :meth:`BLTAggregator.charged_rho_bound` ≤ ρ: the samplers' rounding term is
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


def _split(a):
    """Dekker's split: a = hi + lo with hi, lo of ≤ 26 significant bits (|a| < 2⁹⁹⁶)."""
    c = 134217729.0 * a          # 2²⁷ + 1
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b):
    """Dekker's TwoProduct: p = fl(a·b) and e with a·b = p + e exactly (no under/overflow)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def _renorm(s, t):
    return rounding.two_sum(s, t)


# ---------------------------------------------------------------------------- mechanism
class NoiseMechanism(Protocol[V]):
    """How a value's noised blocks are laid out, noised and reassembled.

    ``plan(partition)``: the unit plan (events at sensitivity Δ_b, σ_b: what one
    independently noised value would cost). ``layout(value, events)``: the public
    [(block, shape)] of the noised blocks, in event order. ``flatten(value, events)``: their
    raw values, one flat float64 vector (secret). ``noise(value, flat, events)``: refuse a
    value outside the premise (before any draw), then pass each block of ``flat`` through the
    sampler with its σ_b and return the flat outputs. ``assemble(flat, layout, events)``: the
    released value from a flat vector of noised blocks (derived blocks from it, withheld
    blocks zero: post-processing). ``magnitudes(events)``: per event, X_b ≥ ‖computed epoch
    sum of that block‖_F.
    """

    def plan(self, partition: str) -> Sequence[GaussianEvent]: ...

    def layout(self, value: V, events: Sequence[GaussianEvent]) -> list: ...

    def flatten(self, value: V, events: Sequence[GaussianEvent]) -> np.ndarray: ...

    def noise(self, value: V, flat: np.ndarray, events: Sequence[GaussianEvent]) -> np.ndarray: ...

    def assemble(self, flat: np.ndarray, layout: list, events: Sequence[GaussianEvent]) -> V: ...

    def magnitudes(self, events: Sequence[GaussianEvent]) -> list[float]: ...


@dataclass(frozen=True)
class GaussianArrayMechanism:
    """N(0, σ²) noise on every coordinate of an array value; ``magnitude`` bounds the
    Frobenius norm of any one epoch's value (default: 10⁹ contributions of norm ≤ sensitivity)."""

    sensitivity: float
    sigma: float
    sampler: Any
    block: str = "blt"
    mechanism: str = "tensor"
    magnitude: float | None = None

    def plan(self, partition: str) -> tuple[GaussianEvent, ...]:
        return (GaussianEvent(self.block, self.sensitivity, self.sigma, partition=partition,
                              mechanism=self.mechanism),)

    def layout(self, value, events):
        return [(self.block, list(np.shape(value)))]

    def flatten(self, value, events):
        return np.asarray(value, dtype=np.float64).ravel().copy()

    def noise(self, value, flat, events):
        (e,) = events
        return np.asarray(self.sampler.add_noise(flat, e.sigma), dtype=np.float64).ravel()

    def assemble(self, flat, layout, events):
        ((_, shape),) = layout
        return np.asarray(flat, dtype=np.float64).reshape(shape)

    def magnitudes(self, events):
        m = (self.sensitivity * rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM if self.magnitude is None
             else self.magnitude)
        return [float(m) for _ in events]


def scaled_events(unit: Sequence[GaussianEvent], c: float) -> list[GaussianEvent]:
    """The unit plan with every sensitivity multiplied by c (ρ by c²), on the whole stream."""
    return [GaussianEvent(e.block, e.sensitivity * c, e.sigma, count=e.count, partition=STREAM,
                          mechanism=e.mechanism) for e in unit]


class BLTAggregator(Generic[V]):
    """Continual release of prefix sums Σ_{s≤t} x_s with a BLT factorization.

    Same interface as :class:`~streamdp.privacy.tree.TreeAggregator`: ``add_epoch``,
    ``prefix``, ``release(t)`` (past t with ``keep_history``), ``state_dict``/``from_state``,
    ``planned_events(n)``, ``rho_per_document()``.

    Epoch t: v_t = (C x̂)_t = x̂_t + Σ_i ω_i R_{i,t} from RAW buffers R_{i,t+1} = θ_i R_{i,t} +
    x̂_t (R_{i,1} = 0; double-double, pure data arithmetic with a proven rounding bound), y_t =
    v_t + z_t through the sampler (one Gaussian mechanism on a data value), then — post-
    processing of public outputs only — x̃_t = y_t − Σ_i ω_i P_{i,t} with PUBLIC buffers
    P_{i,t+1} = θ_i P_{i,t} + x̃_t (so C x̃ = y, x̃ = x̂ + C⁻¹z) and release_t = release_{t−1}
    + x̃_t. The noise never enters a secret computation.

    Parameters
    ----------
    params : BLTParams
    mechanism : NoiseMechanism  the unit plan (sensitivity Δ_b, σ_b per block) and the noise
    spender : BudgetSpender     where each epoch's events are reserved before any draw
    label : str                 reservation labels are ``f"{label}:epoch={t}"``
    keep_history : bool         keep every release (O(T) values)
    max_epochs : int            T_max, public: σ must be calibrated for ρ/:meth:`charge_weight`;
                                epoch T_max + 1 is refused (HorizonExceeded) before reserving
    codec : Codec, optional     encodes an epoch's draw — y_t, the sampler's flat output, a
                                public DP output — for a spend session's output store
                                (default: arrays)
    """

    kind = "blt_aggregator"

    def __init__(self, params: BLTParams, mechanism: NoiseMechanism[V],
                 spender: BudgetSpender | None = None, *, label: str = "blt",
                 keep_history: bool = False, max_epochs: int = DEFAULT_MAX_EPOCHS,
                 codec: Codec | None = None) -> None:
        if isinstance(max_epochs, bool) or not isinstance(max_epochs, (int, np.integer)) or max_epochs < 1:
            raise ValueError(f"max_epochs must be an integer >= 1, got {max_epochs!r}")
        self.params = params
        self.codec = codec      # how a spend session's output store persists y_t (public)
        self.mechanism = mechanism
        self.spender: BudgetSpender = spender if spender is not None else EventLog()
        self.label = label
        self.keep_history = bool(keep_history)
        self.max_epochs = int(max_epochs)
        self.epoch = 0
        self._theta = np.asarray(params.theta)
        self._omega = np.asarray(params.omega)
        self._raw_hi: np.ndarray | None = None      # nbuf × size: R (double-double) — SECRET
        self._raw_lo: np.ndarray | None = None
        self._public: np.ndarray | None = None      # nbuf × size: P (public, post-processing)
        self._prefix_flat: np.ndarray | None = None  # the current release, flat (DP output)
        self._layout: list | None = None
        self._prefix: V | None = None
        self._history: dict[int, np.ndarray] = {}

    # ------------------------------------------------------------- planning
    def unit_events(self) -> tuple[GaussianEvent, ...]:
        events = tuple(self.mechanism.plan(STREAM))
        if not events:
            raise ValueError("mechanism.plan() returned no events: noise must cost something")
        for e in events:
            if not isinstance(e, GaussianEvent) or e.partition != STREAM:
                raise ValueError(f"mechanism.plan({STREAM!r}) returned {e!r}")
        return events

    def rounding_ratio(self) -> float:
        """ε: the per-step rounding term of every block's sensitivity, relative to Δ_b."""
        unit = self.unit_events()
        return rounding_ratio(self.params, unit, self.mechanism.magnitudes(unit))

    def charge_weight(self) -> float:
        """W ≥ Σ_{j<T_max}(c_j + ε)²: the unit plan must be calibrated at ρ_stream/W."""
        return charged_weight(self.params, self.rounding_ratio(), self.max_epochs)

    def step_factor(self, t: int) -> float:
        """c_{t−1} + ε: epoch t's sensitivity relative to the unit plan's Δ_b."""
        if t < 1:
            raise ValueError(f"epochs are 1-based, got {t}")
        c = 1.0 if t == 1 else float(self._omega @ self._theta ** (t - 2))   # c_{t−1}, O(nbuf)
        return c + self.rounding_ratio()

    def epoch_events(self, t: int) -> list[GaussianEvent]:
        """Events reserved when closing epoch t: the unit plan at sensitivity Δ_b·(c_{t−1} + ε)
        ≥ c_{t−1}Δ_b + 2F_b (data change of a document of epoch 1, the worst, plus rounding)."""
        return scaled_events(self.unit_events(), self.step_factor(t))

    def planned_events(self, n: int) -> list[GaussianEvent]:
        """Every event of epochs 1 … n (the stream is unbounded: n must be given)."""
        unit, eps = self.unit_events(), self.rounding_ratio()
        return [e for c in self.params.coefs(int(n)) for e in scaled_events(unit, float(c) + eps)]

    def rho_per_document(self, n: int | None = None) -> float:
        """What one document (of epoch 1, the worst) is charged through epoch n, each event as
        the accountant charges it (:func:`charged_total`); None: through T_max, the bound
        :meth:`charged_rho_bound` (≤ ρ_stream when calibrated by :func:`calibrate_unit_rho`)."""
        if n is None:
            return self.charged_rho_bound()
        c = self.params.coefs(int(n)) + self.rounding_ratio()
        return charged_total(self.unit_events(), float(np.sum(c)), float(np.sum(c * c)), int(n))

    def charged_rho_bound(self) -> float:
        """≥ what epochs 1 … T_max charge in total: :func:`charged_total` with Σc̃² ≤ W
        (:meth:`charge_weight`) and Σc̃ ≤ ‖c‖₁ + T_max·ε."""
        T, eps = self.max_epochs, self.rounding_ratio()
        return charged_total(self.unit_events(), self.params.coefs_l1() + T * eps,
                             self.charge_weight(), T)

    def noise_multiplier(self, t: int | None = None) -> float:
        """√(Var_t/σ²): the sd of the release noise at t relative to one draw's σ."""
        t = self.epoch if t is None else t
        return math.sqrt(float(self.params.noise_variance(t)[t - 1]))

    # ------------------------------------------------------------- updating
    @property
    def raw_partials(self) -> int:
        """Raw (un-noised) data held: the nbuf raw buffers R_i (secret, like the tree's partials)."""
        return 0 if self._raw_hi is None else self.params.nbuf

    def add_epoch(self, value: V) -> V:
        """Close epoch t = self.epoch + 1 with its raw sum; return the release for [1, t].

        Order: refuse past T_max → v_t = x̂_t + Σω_i R_{i,t} (data only; double-double,
        rounded once) → reserve (the spender may raise: nothing changes) → y_t = sampler(v_t)
        (the mechanism refuses a value outside the premise before any draw) → persist → commit
        (reserve, draw, persist, commit: :func:`streamdp.privacy.spend.spend`; a re-run reuses
        a persisted y_t, a public output) → x̃_t = y_t − Σω_i P_{i,t}, R_{t+1} = ΘR_t + x̂_t,
        P_{t+1} = ΘP_t + x̃_t, release_t = release_{t−1} + x̃_t.
        """
        t = self.epoch + 1
        if t > self.max_epochs:
            raise HorizonExceeded(f"{self.label}: epoch {t} is past max_epochs={self.max_epochs}, "
                                  "the public horizon the BLT's σ is calibrated for (its "
                                  "rounding term does not decay); nothing was spent")
        events = self.epoch_events(t)
        unit = self.unit_events()
        layout = [(str(b), [int(s) for s in shape]) for b, shape in self.mechanism.layout(value, unit)]
        if self._layout is not None and layout != self._layout:
            raise ValueError(f"{self.label}: value layout changed from {self._layout} to {layout}")
        x = np.asarray(self.mechanism.flatten(value, unit), dtype=np.float64).ravel()
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{self.label}: epoch sums must be finite")
        nb = self.params.nbuf
        zeros = np.zeros((nb, x.size))
        hi = zeros if self._raw_hi is None else self._raw_hi
        lo = zeros if self._raw_lo is None else self._raw_lo
        pub = zeros if self._public is None else self._public
        if hi.shape[1] != x.size:
            raise ValueError(f"{self.label}: value size changed from {hi.shape[1]} to {x.size}")
        v = self._strategy_value(x, hi, lo)                    # (C x̂)_t: secret data only
        # reserve → draw → persist → commit: the one spend protocol (streamdp.privacy.spend)
        y = spend(self.spender, events, label=f"{self.label}:epoch={t}",
                  draw=lambda: np.asarray(self.mechanism.noise(value, v, unit), dtype=np.float64),
                  codec=self.codec)
        y = np.asarray(y, dtype=np.float64).ravel()
        if y.shape != x.shape:
            raise ValueError(f"mechanism returned {y.size} noised values for {x.size}")
        # ---- public from here: y, P, the prefix
        step = y - self._omega @ pub                          # x̃_t = y_t − Σ ω_i P_{i,t}
        new_pub = self._theta[:, None] * pub + step[None, :]
        new_hi, new_lo = self._raw_update(x, hi, lo)
        prefix = step if self._prefix_flat is None else self._prefix_flat + step
        released = self.mechanism.assemble(prefix, layout, unit)
        (self._raw_hi, self._raw_lo, self._public, self._prefix_flat, self._layout,
         self._prefix, self.epoch) = new_hi, new_lo, new_pub, prefix, layout, released, t
        if self.keep_history:
            self._history[t] = prefix
        return released

    def _strategy_value(self, x: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """x̂_t + Σ_i ω_i (hi_i + lo_i) in double-double, rounded once (error: see
        :func:`strategy_rounding_bound`)."""
        s, acc = x.copy(), np.zeros_like(x)
        for i, w in enumerate(self._omega):
            p, e = two_prod(w, hi[i])
            s, e2 = rounding.two_sum(s, p)
            acc = acc + (e2 + (e + w * lo[i]))
        return s + acc

    def _raw_update(self, x: np.ndarray, hi: np.ndarray, lo: np.ndarray):
        """R ← ΘR + 1·x̂ in double-double, renormalised (|lo| ≤ u|hi + lo|)."""
        th = self._theta[:, None]
        p, e1 = two_prod(th, hi)
        s, e2 = rounding.two_sum(p, x[None, :])
        t = (e1 + th * lo) + e2
        return _renorm(s, t)

    # ------------------------------------------------------------- releasing
    def prefix(self) -> V:
        if self.epoch == 0:
            raise ValueError(f"{self.label}: no epoch closed yet")
        return self._prefix

    def release(self, t: int) -> V:
        if not 1 <= t <= self.epoch:
            raise ValueError(f"{self.label}: epoch {t} not released yet (current {self.epoch})")
        if t == self.epoch:
            return self.prefix()
        if not self.keep_history:
            raise ValueError(f"{self.label}: past releases need keep_history=True")
        return self.mechanism.assemble(self._history[t], self._layout, self.unit_events())

    # ------------------------------------------------------------- checkpoint
    def state_dict(self, encode: Callable[[V], Any] | None = None) -> dict:
        """msgpack-friendly checkpoint (``encode`` is unused: values are kept as flat vectors).
        The raw buffers are SECRET (exponentially weighted raw sums): protect checkpoints like
        raw data."""

        def pack(a):
            return None if a is None else ser.pack_array(a)

        return {
            "kind": self.kind, "v": SCHEMA_VERSION, "params": self.params.to_dict(),
            "epoch": self.epoch, "label": self.label, "keep_history": self.keep_history,
            "max_epochs": self.max_epochs, "layout": self._layout,
            "raw_hi": pack(self._raw_hi), "raw_lo": pack(self._raw_lo),
            "public": pack(self._public), "prefix": pack(self._prefix_flat),
            "history": [[t, ser.pack_array(v)] for t, v in sorted(self._history.items())],
        }

    @classmethod
    def from_state(cls, state: dict, decode: Callable[[Any], V] | None, mechanism: NoiseMechanism[V],
                   spender: BudgetSpender | None = None, *,
                   codec: Codec | None = None) -> "BLTAggregator[V]":
        """Restore a checkpoint (``decode`` is unused, kept for the tree's signature)."""
        if state.get("kind") != cls.kind:
            raise ValueError(f"not a {cls.kind} state: {state.get('kind')!r}")
        if state.get("v") != SCHEMA_VERSION:
            raise ValueError(
                f"{cls.kind} state has schema v{state.get('v')!r}; this version reads "
                f"v{SCHEMA_VERSION} only. v1 states kept secret noise buffers from which the "
                "raw buffers of v2 cannot be rebuilt: finish that stream with the version "
                "that started it, or start a new stream (new ledger label)")
        out = cls(BLTParams.from_dict(state["params"]), mechanism, spender,
                  label=str(state["label"]), keep_history=bool(state["keep_history"]),
                  max_epochs=int(state["max_epochs"]), codec=codec)
        out.epoch = int(state["epoch"])
        if out.epoch < 0:
            raise ValueError(f"blt state: negative epoch {out.epoch}")
        names = ("raw_hi", "raw_lo", "public", "prefix", "layout")
        if any((state[k] is None) != (out.epoch == 0) for k in names):
            raise ValueError("blt state: buffers/prefix missing for a started stream")
        if out.epoch:
            arrays = {k: ser.unpack_array(state[k], name=f"blt {k}") for k in names[:4]}
            size = arrays["prefix"].size
            for k in names[:3]:
                if arrays[k].shape != (out.params.nbuf, size):
                    raise ValueError(f"blt state: {k} of shape {arrays[k].shape}, expected "
                                     f"({out.params.nbuf}, {size})")
            out._raw_hi, out._raw_lo, out._public = arrays["raw_hi"], arrays["raw_lo"], arrays["public"]
            out._prefix_flat = arrays["prefix"].ravel()
            out._layout = [(str(b), [int(s) for s in shape]) for b, shape in state["layout"]]
            out._prefix = mechanism.assemble(out._prefix_flat, out._layout, out.unit_events())
        out._history = {int(t): ser.unpack_array(v, name="blt history").ravel()
                        for t, v in state["history"]}
        return out
