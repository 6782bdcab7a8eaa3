"""The BLT matrix factorisation: parameters (θ, ω), their error profiles and their optimisation.

C is lower-triangular Toeplitz with c_0 = 1, c_j = Σ_i ω_i θ_i^{j−1} (j ≥ 1), 0 < θ_i < 1, ω_i > 0
(:class:`BLTParams`; the mechanism that uses it: :mod:`streamdp.privacy.blt`). The parameters
(θ, ω) are optimised for a horizon n (max or mean prefix-sum error over epochs 1..n times the
infinite-horizon ‖c‖²) by :func:`optimize_blt`; past n the error keeps growing (linearly in t,
slowly) but the privacy guarantee is unchanged (up to T_max). Compared against the binary tree (:func:`tree_error_profile`) and the full-memory square-root
factorisation (:func:`sqrt_toeplitz_error_profile`). Pure numerics, no noise.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
