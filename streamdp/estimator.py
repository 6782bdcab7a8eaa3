"""scikit-learn-style estimator and the one-call ``fit`` convenience function."""
from __future__ import annotations

import math
import numbers

import numpy as np
import scipy.sparse as sp

from streamdp.continual import ContinualRelease, EpochSketches
from streamdp.documents import as_count_batch
from streamdp.moments.clipping import WARMUP_NORMALISING_CLIP, ClipBounds
from streamdp.moments.sketch import WhitenedSketch
from streamdp.privacy.conversions import zcdp_rho
from streamdp.privacy.events import STREAM, WARMUP, BudgetSpender
from streamdp.privacy.epochs import EpochClock
from streamdp.privacy.noise import GaussianSampler, make_sampler
from streamdp.release import (MECHANISMS, BudgetSplit, DenoiseConfig, release_topics)
from streamdp.snapshot import TopicSnapshot
from streamdp.tensor.power_method import PowerMethodConfig
from streamdp.whitening.warmup import WarmupSketch

DEFAULT_CLIP_QUANTILE = 0.97
DEFAULT_CLIP_BUDGET_SHARE = 0.05


def _check_positive_int(name: str, v, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _check_positive_float(name: str, v, allow_none: bool = False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0{' or None' if allow_none else ''}, got {v!r}")
    return float(v)


class StreamingSpectralLDA:
    """Differentially private streaming spectral LDA.

    Documents are sparse count rows (n_docs, d) over a fixed public vocabulary.
    ``warmup(X)`` feeds the private whitening warm-up (repeatable); the first
    ``partial_fit(X)`` releases the subspace Q (spending the warm-up budget) and
    fixes it; later ``partial_fit`` calls add stream documents to the whitened
    sketch; ``release()`` spends the stream budget and returns a
    :class:`~streamdp.snapshot.TopicSnapshot`.

    Privacy: (ε, δ)-DP for every document under add/remove neighbours. Warm-up
    and stream documents are disjoint, so each document is charged once, on its
    own partition (docs/privacy.md).

    Parameters
    ----------
    n_topics : int                 k
    alpha0 : float                 Σα of the LDA prior (public modelling choice)
    oversampling : int, optional   k' − k; default k (k' = 2k, capped at d)
    epsilon : float or None        total ε per document; None = non-private
    delta : float                  δ (with ε)
    mechanism : {"tensor", "iterative"}
    budget_split : BudgetSplit     shares of the stream ρ per block
    clip : ClipBounds, optional    explicit public clip bounds
    clip_length : float, optional  public reference document length: bounds from
                                   :meth:`ClipBounds.for_length` (ignored if clip given)
    clip_quantile : float          with neither ``clip`` nor ``clip_length`` (the default
                                   when private): stream bounds at this quantile of
                                   the warm-up documents' norms, released privately
                                   with ``clip_budget_share`` of the warm-up ρ
    n_restarts, n_iter : int       power method L and R
    threshold : float              τ of the denoising threshold (private only)
    seed : int or None             public randomness (Ω, power-method starts)
    noise_seed : int or None       reproducible noise — tests/benchmarks ONLY
    sampler : {"opendp", "fast"} or GaussianSampler
                                   "opendp" (default): OpenDP's vetted Gaussian
                                   (≈ 2·10⁴ draws/s); "fast": CSPRNG-seeded numpy
    accountant : BudgetSpender     shared accountant; default a private one with
                                   this estimator's (ε, δ) budget
    epochs : EpochClock, optional  continual release: stream documents are routed
                                   to epochs by timestamp (``partial_fit(X, timestamps)``)
                                   and :meth:`close_epochs` releases with the binary
                                   tree mechanism (requires ``horizon``)
    horizon : int, optional        T, the most epochs the stream budget must cover

    Attributes
    ----------
    subspace_dim_ : int            k'
    subspace_ : Subspace           Q, after the first partial_fit
    sketch_ : WhitenedSketch
    components_ : (k, d) ndarray   topic-word matrix of the last release
    alpha_ : (k,) ndarray
    snapshot_ : TopicSnapshot
    continual_ : ContinualRelease  the tree (continual mode, after the first partial_fit)
    """

    def __init__(self, n_topics: int, alpha0: float = 1.0, *, oversampling: int | None = None,
                 epsilon: float | None = None, delta: float = 1e-6, mechanism: str = "tensor",
                 budget_split: BudgetSplit | None = None, clip: ClipBounds | None = None,
                 clip_length: float | None = None, clip_quantile: float = DEFAULT_CLIP_QUANTILE,
                 clip_budget_share: float = DEFAULT_CLIP_BUDGET_SHARE, n_restarts: int = 15, n_iter: int = 30,
                 threshold: float = 2.0, seed: int | None = None, noise_seed: int | None = None,
                 sampler: GaussianSampler | str = "opendp", accountant: BudgetSpender | None = None,
                 epochs: EpochClock | None = None, horizon: int | None = None):
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        self.n_topics = _check_positive_int("n_topics", n_topics)
        self.alpha0 = _check_positive_float("alpha0", alpha0)
        self.oversampling = (self.n_topics if oversampling is None
                             else _check_positive_int("oversampling", oversampling, 0))
        self.epsilon = _check_positive_float("epsilon", epsilon, allow_none=True)
        self.delta = _check_positive_float("delta", delta)
        if self.epsilon is not None and not self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
        self.mechanism = mechanism
        self.budget_split = budget_split if budget_split is not None else BudgetSplit()
        if clip is not None and not isinstance(clip, ClipBounds):
            raise ValueError("clip must be a streamdp.ClipBounds (or None to use clip_length)")
        if not 0 < clip_quantile <= 1:
            raise ValueError(f"clip_quantile must be in (0, 1], got {clip_quantile!r}")
        if not 0 < clip_budget_share < 1:
            raise ValueError(f"clip_budget_share must be in (0, 1), got {clip_budget_share!r}")
        self.clip_quantile, self.clip_budget_share = float(clip_quantile), float(clip_budget_share)
        self._auto_clip = False
        if clip is None and self.epsilon is None:
            clip = ClipBounds.unclipped()   # non-private: the exact, unweighted estimator
        elif clip is None and clip_length is not None:
            clip = ClipBounds.for_length(clip_length)
        elif clip is None:
            # placeholder stream bounds until the warm-up releases its norm quantiles
            self._auto_clip = True
            clip = ClipBounds(m1=1.0, z=1.0, s3=1.0, warmup=WARMUP_NORMALISING_CLIP)
        self.clip = clip
        self.power = PowerMethodConfig(_check_positive_int("n_restarts", n_restarts),
                                       _check_positive_int("n_iter", n_iter),
                                       seed=0 if seed is None else int(seed))
        self.denoise = DenoiseConfig(threshold=threshold)
        self.seed = seed
        self.sampler = (make_sampler(sampler, noise_seed) if isinstance(sampler, str) or sampler is None
                        else sampler)
        if (epochs is None) != (horizon is None):
            raise ValueError("continual release needs both epochs=EpochClock(...) and horizon=T "
                             "(or neither, for one-shot releases)")
        if epochs is not None and not isinstance(epochs, EpochClock):
            raise ValueError(f"epochs must be a streamdp EpochClock, got {type(epochs).__name__}")
        if epochs is not None and mechanism != "tensor":
            raise ValueError("continual release noises tree nodes once: use mechanism='tensor'")
        self.epochs = epochs
        self.horizon = None if horizon is None else _check_positive_int("horizon", horizon)
        self.continual_ = None
        self._epoch_sketches = None
        self.rho_ = zcdp_rho(self.epsilon, self.delta) if self.epsilon is not None else None
        if accountant is None and self.epsilon is not None:
            from streamdp.privacy.accountant import Accountant
            from streamdp.privacy.memory_ledger import MemoryLedger
            accountant = Accountant(self.epsilon, self.delta, MemoryLedger())
        self.accountant = accountant
        self._warmup: WarmupSketch | None = None
        self.subspace_ = None
        self.sketch_: WhitenedSketch | None = None
        self.snapshot_: TopicSnapshot | None = None

    # ---------------------------------------------------------------- warm-up
    def _k_prime(self, d: int) -> int:
        k_prime = min(self.n_topics + self.oversampling, d)
        if k_prime < self.n_topics:
            raise ValueError(f"n_topics={self.n_topics} exceeds the vocabulary size d={d}")
        return k_prime

    @property
    def subspace_dim_(self) -> int:
        if self.subspace_ is not None:
            return self.subspace_.dim
        if self._warmup is not None:
            return self._warmup.k_prime
        raise AttributeError("subspace_dim_ is known once warmup() has seen the vocabulary size")

    def warmup(self, X) -> "StreamingSpectralLDA":
        """Add warm-up documents (used only to find the subspace Q)."""
        if self.subspace_ is not None:
            raise ValueError("the subspace is fixed (partial_fit was called); warm-up documents "
                             "can no longer be added — start a new estimator to re-whiten")
        X = as_count_batch(X)
        if self._warmup is None:
            d = X.shape[1]
            self._warmup = WarmupSketch(d, self._k_prime(d), clip=self.clip.warmup,
                                        seed=0 if self.seed is None else int(self.seed))
        self._warmup.update(X)
        return self

    def _fix_subspace(self) -> None:
        if self._warmup is None or self._warmup.n_docs == 0:
            raise ValueError("call warmup(X) with documents of length >= 3 before partial_fit(X): "
                             "the stream is sketched in the subspace the warm-up finds")
        rho = self.rho_
        if self._auto_clip:
            hist_rho = rho * self.clip_budget_share
            rho = rho - hist_rho
            self.clip, _ = self._warmup.clip_bounds(self.clip_quantile, hist_rho,
                                                    self.sampler, self.accountant)
        self.subspace_ = self._warmup.subspace(rho, self.sampler, self.accountant)
        self.sketch_ = WhitenedSketch(self.subspace_, self.clip)
        if self.epochs is not None:
            self.continual_ = ContinualRelease(
                self.subspace_, self.clip, n_topics=self.n_topics, alpha0=self.alpha0,
                rho=self.rho_, horizon=self.horizon, split=self.budget_split,
                sampler=self.sampler, spender=self.accountant, power=self.power,
                denoise=self.denoise)
            self._epoch_sketches = EpochSketches(self.subspace_, self.clip, self.epochs)
        self._warmup = None   # the warm-up's raw sums are no longer needed

    # ----------------------------------------------------------------- stream
    def partial_fit(self, X, timestamps=None) -> "StreamingSpectralLDA":
        """Add stream documents (the first call fixes the subspace).

        In continual mode ``timestamps`` (n_docs,) are required: each document
        goes to the epoch its timestamp says; documents of closed epochs are
        dropped and counted in ``late_documents_``.
        """
        if (timestamps is None) != (self.epochs is None):
            raise ValueError("timestamps are required with epochs=EpochClock(...) and only then"
                             if self.epochs is not None else
                             "timestamps given but the estimator has no epochs=EpochClock(...)")
        if self.subspace_ is None:
            self._fix_subspace()
        if self.epochs is not None:
            self._epoch_sketches.add(X, timestamps)
        else:
            self.sketch_.update(X)
        return self

    @property
    def late_documents_(self) -> int:
        return 0 if self._epoch_sketches is None else self._epoch_sketches.late_documents

    def close_epochs(self, watermark: float) -> list[TopicSnapshot]:
        """Close every epoch that ends at or before ``watermark`` and release after each.

        Returns one snapshot per closed epoch (empty epochs included: the tree
        needs every leaf). Raises HorizonExceeded past the horizon.
        """
        if self.epochs is None:
            raise ValueError("close_epochs needs continual mode (epochs=EpochClock(...), horizon=T)")
        if self.subspace_ is None:
            self._fix_subspace()
        snaps = []
        target = min(self.epochs.closable_through(watermark), self.horizon)
        for epoch, sums in self._epoch_sketches.pop_through(target):
            snap = self.continual_.close_epoch(sums)
            self._finish_snapshot(snap)
            snaps.append(snap)
        if self.epochs.closable_through(watermark) > self.horizon:
            from streamdp.privacy.tree import HorizonExceeded
            raise HorizonExceeded(f"watermark {watermark} is past the horizon of T={self.horizon} "
                                  f"epochs; {len(snaps)} epoch(s) were closed before it")
        return snaps

    def release(self, budget_fraction: float = 1.0) -> TopicSnapshot:
        """Release topics, spending ``budget_fraction`` of the stream's ρ budget.

        Raises BudgetExhausted (from the accountant) if the budget does not allow it.
        """
        if self.sketch_ is None:
            raise ValueError("nothing to release: call warmup(X) and partial_fit(X) first")
        if self.epochs is not None:
            raise ValueError("in continual mode releases happen at epoch closes: call "
                             "close_epochs(watermark)")
        if not 0 < budget_fraction <= 1:
            raise ValueError(f"budget_fraction must be in (0, 1], got {budget_fraction!r}")
        if self.sketch_.n_docs == 0:
            raise ValueError("the stream sketch is empty: partial_fit(X) with documents first")
        rho = None if self.rho_ is None else self.rho_ * budget_fraction
        snap = release_topics(self.sketch_.sums(), self.subspace_, n_topics=self.n_topics,
                              alpha0=self.alpha0, rho=rho, clip=self.clip,
                              mechanism=self.mechanism, split=self.budget_split,
                              sampler=self.sampler, spender=self.accountant,
                              power=self.power, denoise=self.denoise, partition=STREAM)
        return self._finish_snapshot(snap)

    def _finish_snapshot(self, snap: TopicSnapshot) -> TopicSnapshot:
        snap.privacy.update({"epsilon": self.epsilon, "delta": self.delta,
                             "rho_budget": self.rho_,
                             "warmup": self.subspace_.provenance.get("events", []),
                             "partitions": {WARMUP: "warm-up documents (subspace only)",
                                            STREAM: "stream documents (sketches only)"}})
        if hasattr(self.accountant, "report"):
            snap.privacy["accountant"] = self.accountant.report()
        self.snapshot_ = snap
        self.components_ = snap.topic_word
        self.alpha_ = snap.alpha
        return snap


def fit(counts, n_topics: int, *, alpha0: float = 1.0, epsilon: float | None = None,
        delta: float = 1e-6, warmup_docs: int, seed: int | None = None,
        batch_size: int = 4096, **kwargs) -> TopicSnapshot:
    """Fit on a count matrix: rows [:warmup_docs] warm up, the rest is the stream.

    Returns the released :class:`TopicSnapshot` (``.topic_word`` (k, d), ``.alpha`` (k,)).
    Extra keyword arguments go to :class:`StreamingSpectralLDA`.
    """
    X = as_count_batch(counts)
    n = X.shape[0]
    warmup_docs = _check_positive_int("warmup_docs", warmup_docs)
    if warmup_docs >= n:
        raise ValueError(f"warmup_docs={warmup_docs} leaves no stream documents out of {n} rows")
    batch_size = _check_positive_int("batch_size", batch_size)
    model = StreamingSpectralLDA(n_topics, alpha0, epsilon=epsilon, delta=delta, seed=seed, **kwargs)
    for s in range(0, warmup_docs, batch_size):
        model.warmup(X[s:min(s + batch_size, warmup_docs)])
    for s in range(warmup_docs, n, batch_size):
        model.partial_fit(X[s:s + batch_size])
    return model.release()
