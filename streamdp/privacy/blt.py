"""Buffered linear Toeplitz (BLT) matrix-factorization mechanism for continual release
(Dvijotham, McMahan, Pillutla, Steinke, Thakurta 2024; McMahan, Xu, Zhang 2024).

Prefix sums A·x (A lower-triangular ones) are released as B·(C·x + z) with A = B·C,
B = A·C⁻¹, z_t i.i.d. N(0, σ²) per coordinate. C is lower-triangular Toeplitz with
coefficients c_0 = 1, c_j = Σ_i ω_i θ_i^{j−1} (j ≥ 1), 0 < θ_i < 1, ω_i > 0. Hence

* the release at epoch t is Σ_{s≤t} x_s + Σ_{s≤t} w_s with w = C⁻¹z; C⁻¹ is again a
  (buffered) Toeplitz matrix, computed online with ``nbuf`` noise buffers
  (w_t = z_t − ωᵀS_t, S_{t+1} = Θ·S_t + 1·w_t: :meth:`BLTAggregator.add_epoch`);
* the release noise at t has variance σ²·Σ_{m<t} P_m² per coordinate, P_m = Σ_{i≤m} ĉ_i
  (ĉ the coefficients of C⁻¹) — :meth:`BLTParams.noise_variance`;
* ‖c‖² = Σ_j c_j² = 1 + Σ_{i,k} ω_i ω_k / (1 − θ_i θ_k) is finite over an infinite
  horizon, so the privacy guarantee holds for an unbounded number of epochs.

Accounting (proof in docs/privacy.md §BLT)
------------------------------------------
y_t = (C x)_t + z_t is an adaptive sequence of Gaussian mechanisms with independent noise
(Denisov et al. 2022: adaptivity is free for lower-triangular C with Gaussian noise); the
release is post-processing of y. A document of epoch s changes y_t (t ≥ s) by at most
c_{t−s}·Δ, so through epoch t it costs κ·Σ_{j=0}^{t−s} c_j² (κ = Δ²/2σ²), at most
κ·Σ_{j=0}^{t−1} c_j² (s = 1). At epoch t the aggregator therefore reserves, for each block
of the unit plan, one event of sensitivity c_{t−1}·Δ_b on the whole-stream partition: the
accountant's load after t epochs is exactly the worst document's loss, and it tends to
κ‖c‖² = the stream's ρ as t → ∞ (σ is set from ‖c‖² over the infinite horizon).

The parameters (θ, ω) are optimised for a horizon n (max or mean prefix-sum error over
epochs 1..n times the infinite-horizon ‖c‖²) by :func:`optimize_blt`; past n the error
keeps growing (linearly in t, slowly) but the privacy guarantee is unchanged.

State: the running noised prefix (a DP output) and ``nbuf`` noise buffers — *secret*:
with the releases they reveal the raw prefix sums; protect checkpoints like raw data. No
raw epoch sum is kept once its epoch is closed.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, Protocol, Sequence, TypeVar

import numpy as np

from streamdp.privacy.events import STREAM, BudgetSpender, EventLog, GaussianEvent
from streamdp.privacy.spend import Codec, spend

V = TypeVar("V")

SCHEMA_VERSION = 1
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


# ---------------------------------------------------------------------------- mechanism
class NoiseMechanism(Protocol[V]):
    """How a value is released with externally correlated Gaussian noise.

    ``plan(partition)`` is the unit plan (events at sensitivity Δ_b, σ_b: what one
    independently noised value would cost). ``privatize_shifted(value, shift, events)``
    returns (value + shift + z, the noise part shift + z as one flat vector of the noised
    coordinates, block by block in event order), z fresh i.i.d. N(0, σ_b²) drawn through the
    sampler *on the shifted true values* (so the released floats come out of the vetted
    mechanism); ``shift=None`` means zero.
    """

    def plan(self, partition: str) -> Sequence[GaussianEvent]: ...

    def privatize_shifted(self, value: V, shift: np.ndarray | None,
                          events: Sequence[GaussianEvent]) -> tuple[V, np.ndarray]: ...


@dataclass(frozen=True)
class GaussianArrayMechanism:
    """N(0, σ²) noise on every coordinate of an array value."""

    sensitivity: float
    sigma: float
    sampler: Any
    block: str = "blt"
    mechanism: str = "tensor"

    def plan(self, partition: str) -> tuple[GaussianEvent, ...]:
        return (GaussianEvent(self.block, self.sensitivity, self.sigma, partition=partition,
                              mechanism=self.mechanism),)

    def privatize_shifted(self, value, shift, events):
        (e,) = events
        x = np.asarray(value, dtype=np.float64)
        shifted = x if shift is None else x + shift.reshape(x.shape)
        out = np.asarray(self.sampler.add_noise(shifted, e.sigma), dtype=np.float64)
        return out, (out - x).ravel()


def scaled_events(unit: Sequence[GaussianEvent], c: float) -> list[GaussianEvent]:
    """The unit plan with every sensitivity multiplied by c (ρ by c²), on the whole stream."""
    return [GaussianEvent(e.block, e.sensitivity * c, e.sigma, count=e.count, partition=STREAM,
                          mechanism=e.mechanism) for e in unit]


class BLTAggregator(Generic[V]):
    """Continual release of prefix sums Σ_{s≤t} x_s with a BLT factorization.

    Same interface as :class:`~streamdp.privacy.tree.TreeAggregator`: ``add_epoch``,
    ``prefix``, ``release(t)`` (past t with ``keep_history``), ``state_dict``/``from_state``,
    ``planned_events(n)``, ``rho_per_document()``.

    Parameters
    ----------
    params : BLTParams
    mechanism : NoiseMechanism  the unit plan (sensitivity Δ_b, σ_b per block) and the noise
    spender : BudgetSpender     where each epoch's events are reserved before any draw
    label : str                 reservation labels are ``f"{label}:epoch={t}"``
    keep_history : bool         keep every release (O(T) values)
    codec : Codec, optional     encodes an epoch's draw (step, w) for a spend session's
                                output store; w is secret noise, so is that store
    """

    kind = "blt_aggregator"

    def __init__(self, params: BLTParams, mechanism: NoiseMechanism[V],
                 spender: BudgetSpender | None = None, *, label: str = "blt",
                 keep_history: bool = False, codec: Codec | None = None) -> None:
        self.params = params
        self.codec = codec      # how a spend session's output store persists (step, w)
        self.mechanism = mechanism
        self.spender: BudgetSpender = spender if spender is not None else EventLog()
        self.label = label
        self.keep_history = bool(keep_history)
        self.epoch = 0
        self._theta = np.asarray(params.theta)
        self._omega = np.asarray(params.omega)
        self._buffers: np.ndarray | None = None     # nbuf × noise size: SECRET
        self._prefix: V | None = None               # the current release (DP output)
        self._history: dict[int, V] = {}

    # ------------------------------------------------------------- planning
    def unit_events(self) -> tuple[GaussianEvent, ...]:
        events = tuple(self.mechanism.plan(STREAM))
        if not events:
            raise ValueError("mechanism.plan() returned no events: noise must cost something")
        for e in events:
            if not isinstance(e, GaussianEvent) or e.partition != STREAM:
                raise ValueError(f"mechanism.plan({STREAM!r}) returned {e!r}")
        return events

    def epoch_events(self, t: int) -> list[GaussianEvent]:
        """Events reserved when closing epoch t: the unit plan at sensitivity c_{t−1}·Δ_b."""
        if t < 1:
            raise ValueError(f"epochs are 1-based, got {t}")
        c = float(self.params.coefs(t)[t - 1])
        return scaled_events(self.unit_events(), c)

    def planned_events(self, n: int) -> list[GaussianEvent]:
        """Every event of epochs 1 … n (the stream is unbounded: n must be given)."""
        unit = self.unit_events()
        return [e for c in self.params.coefs(int(n)) for e in scaled_events(unit, float(c))]

    def rho_per_document(self, n: int | None = None) -> float:
        """What one document can cost through epoch n (None: ever), ρ_unit·Σ_{j<n} c_j²."""
        return sum(e.rho for e in self.unit_events()) * self.params.sensitivity_squared(n)

    def noise_multiplier(self, t: int | None = None) -> float:
        """√(Var_t/σ²): the sd of the release noise at t relative to one draw's σ."""
        t = self.epoch if t is None else t
        return math.sqrt(float(self.params.noise_variance(t)[t - 1]))

    # ------------------------------------------------------------- updating
    @property
    def raw_partials(self) -> int:
        """Raw (un-noised) sums held: none (each epoch's sum is added to the noised prefix)."""
        return 0

    def add_epoch(self, value: V) -> V:
        """Close epoch t = self.epoch + 1 with its raw sum; return the release for [1, t].

        Order: reserve (the spender may raise: nothing changes) → x_t − ωᵀS_t through the
        sampler (adds z_t) = x_t + w_t with w_t = (C⁻¹z)_t → S_{t+1} = Θ S_t + 1·w_t (S the
        buffers, S_1 = 0) → release_t = release_{t−1} + x_t + w_t; reserve, draw and commit
        are :func:`streamdp.privacy.spend.spend`.
        """
        t = self.epoch + 1
        events = self.epoch_events(t)
        unit = self.unit_events()
        shift = None if self._buffers is None else -(self._omega @ self._buffers)   # −ωᵀS_t
        # step = x_t + w_t, w_t = (C⁻¹z)_t = z_t − ωᵀS_t (true values through the sampler);
        # reserve → draw → persist → commit: the one spend protocol (streamdp.privacy.spend)
        step, w = spend(self.spender, events, label=f"{self.label}:epoch={t}",
                        draw=lambda: self.mechanism.privatize_shifted(value, shift, unit),
                        codec=self.codec)
        w = np.asarray(w, dtype=np.float64).ravel()
        if self._buffers is not None and self._buffers.shape[1] != w.size:
            raise ValueError(f"noise size changed from {self._buffers.shape[1]} to {w.size}")
        buffers = self._buffers if self._buffers is not None else np.zeros((self.params.nbuf, w.size))
        new_buffers = self._theta[:, None] * buffers + w[None, :]   # S_{t+1} = Θ S_t + 1 w_t
        prefix = step if self._prefix is None else self._prefix + step
        self._buffers, self._prefix, self.epoch = new_buffers, prefix, t
        if self.keep_history:
            self._history[t] = prefix
        return prefix

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
        return self._history[t]

    # ------------------------------------------------------------- checkpoint
    def state_dict(self, encode: Callable[[V], Any]) -> dict:
        """msgpack-friendly checkpoint. The noise buffers are SECRET (with the releases they
        reveal raw prefix sums): protect checkpoints like raw data."""
        from streamdp import serialization as ser
        return {
            "kind": self.kind, "v": SCHEMA_VERSION, "params": self.params.to_dict(),
            "epoch": self.epoch, "label": self.label, "keep_history": self.keep_history,
            "buffers": None if self._buffers is None else ser.pack_array(self._buffers),
            "prefix": None if self._prefix is None else encode(self._prefix),
            "history": [[t, encode(v)] for t, v in sorted(self._history.items())],
        }

    @classmethod
    def from_state(cls, state: dict, decode: Callable[[Any], V], mechanism: NoiseMechanism[V],
                   spender: BudgetSpender | None = None, *,
                   codec: Codec | None = None) -> "BLTAggregator[V]":
        from streamdp import serialization as ser
        if state.get("kind") != cls.kind or state.get("v") != SCHEMA_VERSION:
            raise ValueError(f"not a v{SCHEMA_VERSION} {cls.kind} state: "
                             f"{state.get('kind')!r} v{state.get('v')!r}")
        out = cls(BLTParams.from_dict(state["params"]), mechanism, spender,
                  label=str(state["label"]), keep_history=bool(state["keep_history"]), codec=codec)
        out.epoch = int(state["epoch"])
        if out.epoch < 0:
            raise ValueError(f"blt state: negative epoch {out.epoch}")
        if (state["buffers"] is None) != (out.epoch == 0) or (state["prefix"] is None) != (out.epoch == 0):
            raise ValueError("blt state: buffers/prefix missing for a started stream")
        if out.epoch:
            out._buffers = ser.unpack_array(state["buffers"], name="blt buffers")
            if out._buffers.ndim != 2 or out._buffers.shape[0] != out.params.nbuf:
                raise ValueError(f"blt state: buffers of shape {out._buffers.shape}, "
                                 f"expected ({out.params.nbuf}, ·)")
            out._prefix = decode(state["prefix"])
        out._history = {int(t): decode(v) for t, v in state["history"]}
        return out
