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

The parameters (θ, ω) and their optimisation are in :mod:`streamdp.privacy.blt_factorization`;
the float rounding bound of the strategy step and what it charges in
:mod:`streamdp.privacy.blt_rounding`.

State (schema v2): the noised prefix (a DP output), ``nbuf`` public buffers and ``nbuf`` raw
buffers in double-double — *secret* (exponentially weighted raw epoch sums): protect
checkpoints like raw data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Generic, Protocol, Sequence, TypeVar

import numpy as np

from streamdp import serialization as ser
from streamdp.privacy import rounding
from streamdp.privacy.blt_factorization import BLTParams
from streamdp.privacy.blt_rounding import (DEFAULT_MAX_EPOCHS, charged_total, charged_weight,
                                           rounding_ratio)
from streamdp.privacy.events import STREAM, BudgetSpender, EventLog, GaussianEvent
from streamdp.privacy.spend import Codec, spend
from streamdp.privacy.tree import HorizonExceeded

# Tests and benchmarks import the factorisation and the rounding bound from here too
# (re-exports only; the code imports them from their modules)
from streamdp.privacy.blt_factorization import (  # noqa: F401
    default_params, optimize_blt, sqrt_toeplitz_coefs, sqrt_toeplitz_error_profile,
    tree_error_profile)
from streamdp.privacy.blt_rounding import calibrate_unit_rho, strategy_rounding_bound  # noqa: F401

# the public names: this module's own, then the ones imported above that other modules and
# tests import from here (re-exports)
__all__ = ["SCHEMA_VERSION", "two_prod", "NoiseMechanism", "GaussianArrayMechanism",
           "scaled_events", "BLTAggregator", "BLTParams", "DEFAULT_MAX_EPOCHS",
           "calibrate_unit_rho", "charged_total", "charged_weight", "default_params",
           "optimize_blt", "sqrt_toeplitz_coefs", "sqrt_toeplitz_error_profile",
           "strategy_rounding_bound", "tree_error_profile"]

V = TypeVar("V")

SCHEMA_VERSION = 2     # v2: raw + public buffers (v1: secret noise buffers)


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
