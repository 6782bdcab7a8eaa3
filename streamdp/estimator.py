"""scikit-learn-style estimator (the one-call ``fit`` built on it is :mod:`streamdp.fitting`)."""
from __future__ import annotations

import dataclasses
import numbers

import numpy as np

from streamdp.cluster_start import ClusterStartConfig
from streamdp.documents import as_count_batch
from streamdp.estimator_continual import (check_public_start_vocabulary, close_epochs,
                                          continual_state)
from streamdp.estimator_one_shot import (choose_start_on_count, cluster_start_sums, operation,
                                         public_start_snapshot, refine_sums, release_start,
                                         spectral_release)
from streamdp.estimator_params import (COUNT_BOUNDARY_WARMUP_SHARE, DEFAULT_CLIP_BUDGET_SHARE,
                                       DEFAULT_CLIP_QUANTILE, NonPrivateWarning,  # noqa: F401 (re-exported)
                                       check_clip, check_cluster_start, check_continual,
                                       check_continual_start,
                                       check_non_private, check_positive_float,
                                       check_positive_int, check_refinement,
                                       check_warmup_boundary, default_accountant, spend_session,
                                       user_bounders)
from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import WhitenedSketch
from streamdp.privacy.conversions import zcdp_rho
from streamdp.privacy.epochs import EpochClock
from streamdp.privacy.events import STREAM, WARMUP, BudgetSpender, GaussianEvent
from streamdp.privacy.kept_draws import KeptDraws
from streamdp.privacy.noise import (DEFAULT_SAMPLER, GaussianSampler, make_sampler,
                                   require_production_sampler)
from streamdp.privacy.plan import MECHANISMS, BudgetSplit, PremiseCheck, warmup_plan
from streamdp.privacy.report import add_budget_context, release_report
from streamdp.privacy.rounding import (DEFAULT_MAX_DOCUMENTS_PER_SUM, check_max_documents,
                                       warn_not_covered)
from streamdp.privacy.user_bounding import DEFAULT_MAX_USERS
from streamdp.refinement import RefinementConfig, refined_topics
from streamdp.refinement import BLOCK as REFINE_BLOCK
from streamdp.release import DenoiseConfig
from streamdp.snapshot import TopicSnapshot
from streamdp.start import AUTO_COUNT_SHARE, PublicStart, check_start
from streamdp.tensor.power_method import PowerMethodConfig
from streamdp.whitening.warmup import (WarmupSketch, clip_bounds_from_histogram,
                                       premise_decision, subspace_from_draw)

# the public names: this module's own, then the ones imported above that other modules and
# tests import from here (re-exports)
__all__ = ["StreamingSpectralLDA", "NonPrivateWarning", "refined_topics"]


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
    epsilon : float or None        total ε per document; None = non-private (warns
                                   NonPrivateWarning unless ``non_private=True``; the
                                   snapshot's report then says NON-PRIVATE)
    non_private : bool             say that a model without ε is meant to be non-private
    non_production : bool          allow a non-vetted ``sampler`` ("fast", "google", a custom
                                   object): tests and benchmarks only; refused otherwise
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
    sampler : {"opendp-lattice", "opendp", "google", "fast"} or GaussianSampler
                                   "opendp-lattice" (default): OpenDP's vetted Gaussian on a
                                   σ-relative lattice 2^k·√n ≤ 2⁻⁴¹σ, its rounding charged
                                   (≈ 8·10⁴ draws/s per core, parallel over cores);
                                   "opendp": OpenDP's exact Gaussian (≈ 2·10⁴ draws/s per core);
                                   "google": Google's secure Gaussian (python-dp, ≈ 4·10⁵
                                   draws/s per core; opt-in: its per-draw failure
                                   probability ≈ 2⁻⁴⁵ is not charged to δ);
                                   "fast": CSPRNG-seeded numpy (not vetted). "google" and
                                   "fast" need ``non_production=True``; the snapshot's
                                   ``sampler_status`` says vetted / non-production
    accountant : BudgetSpender     shared accountant; default a private one with
                                   this estimator's (ε, δ) budget
    epochs : EpochClock, optional  continual release: stream documents are routed
                                   to epochs by timestamp (``partial_fit(X, timestamps)``)
                                   and :meth:`close_epochs` releases with the
                                   ``continual_aggregator`` (requires ``horizon``)
    horizon : int, optional        blt: the number of epochs its error is optimised for (more
                                   may be closed, same privacy); tree: T, the most epochs the
                                   stream budget must cover
    continual_aggregator : str     "blt" (default: BLT matrix factorization, unbounded
                                   horizon) or "tree" (binary tree); docs/privacy.md
    refinement : RefinementConfig, True or None
                                   private refinement after the spectral start (DESIGN §8,
                                   docs/estimator.md): used by :func:`fit`, :meth:`refine`
                                   and, in continual mode, at every epoch close.
                                   None/False: spectral releases only
    warmup_boundary : {"document", "count"}
                                   "document" (default): the caller routes each document
                                   to the warm-up or the stream by a rule of that document
                                   alone (its timestamp), so the two are disjoint partitions
                                   (parallel composition). "count": the split may move
                                   documents (a row count); the warm-up is then charged on
                                   the stream partition at replace sensitivity, with
                                   ``warmup_share`` of ρ (sequential composition)
    warmup_share : float           ρ share of the warm-up under ``warmup_boundary="count"``
    max_documents_per_sum : int    public premise N_max: the most documents in any one noised
                                   sum (warm-up, stream, tree node, refinement). Sensitivities
                                   include the float64 rounding headroom for sums of that size
                                   (+1.9% σ at the default 10⁹). Never a refusal: before each
                                   private draw (warm-up, continual epoch, one-shot release,
                                   refinement pass, clustering start) a noised, charged check
                                   of its document count draws a sum over it from noise only
                                   (docs/privacy.md, "Floating point", "The premise check")
    privacy_unit : {"document", "user"}
                                   "document" (default): add/remove one document. "user":
                                   add/remove every document of one user — pass ``users=`` (one
                                   id per row) to warmup/partial_fit/refine; each user's documents
                                   get weights summing to ≤ 1 (streamdp.privacy.user_bounding),
                                   and the warm-up is charged to the stream partition
                                   (``warmup_share``; a user may have documents on both sides).
                                   docs/privacy.md, "The user-level unit"
    max_docs_per_user_epoch : int  m: a user's documents kept per epoch (user mode; default 5;
                                   one-shot streams are one epoch)
    max_docs_per_user : int        M: a user's documents kept over the whole stream (default m)
    user_weights : {"uniform", "decaying"}
                                   weight of a user's j-th kept document: 1/M, or ∝ 1/j²
    max_users : int or None        None (default): every user is admitted (≈ 400 bytes of
                                   state per user); K: first-K admission, users past the first
                                   K get weight 0 and every weight is halved (docs/privacy.md)
    run_id : str, optional         names this run in the accountant's ledger: every draw is
                                   reserved under the key ``"<run_id>:<draw>"`` (spend protocol,
                                   :mod:`streamdp.privacy.spend`). Required with an accountant on a
                                   file ledger: its noised outputs are persisted next to the ledger
                                   (``<ledger>.outputs/``), so re-running the same run after a crash
                                   returns them and fulfils an unfinished draw, never spending twice.
                                   Default (in-memory ledger): a fresh random id

    start : {"auto", "tensor", "cluster"} or PublicStart
                                   how the one-shot refinement path (:func:`fit`) starts:
                                   "tensor" the private spectral release; "cluster" the private
                                   clustering start in the warm-up subspace
                                   (:mod:`streamdp.cluster_start`); a :class:`PublicStart`:
                                   topics the operator fitted on public documents (no budget,
                                   recorded as public input); "auto" (default): the start rule
                                   (:func:`streamdp.start.choose_start`, docs/privacy.md) on a
                                   noised document count. Continual mode (``epochs=``):
                                   "auto" and "tensor" start from each epoch's private tensor
                                   release; a PublicStart starts the chain as the services'
                                   ``start: public`` (epochs 1…L folded into it, every epoch
                                   refined, node ρ split ``refinement.PUBLIC_START_SHARE`` 0.9
                                   to the refinement sums unless ``refinement`` is an explicit
                                   RefinementConfig; refinement required); "cluster" raises
    cluster_start : ClusterStartConfig, optional
                                   iterations and budget shares of the clustering start
                                   (one-shot only: refused with ``epochs=``)

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
                 sampler: GaussianSampler | str = DEFAULT_SAMPLER, accountant: BudgetSpender | None = None,
                 epochs: EpochClock | None = None, horizon: int | None = None,
                 refinement: RefinementConfig | bool | None = True,
                 warmup_boundary: str = "document",
                 warmup_share: float = COUNT_BOUNDARY_WARMUP_SHARE,
                 continual_aggregator: str = "blt",
                 max_documents_per_sum: int = DEFAULT_MAX_DOCUMENTS_PER_SUM,
                 run_id: str | None = None, privacy_unit: str = "document",
                 max_docs_per_user_epoch: int | None = None,
                 max_docs_per_user: int | None = None, user_weights: str = "uniform",
                 max_users: int | None = DEFAULT_MAX_USERS, non_private: bool = False,
                 non_production: bool = False, start="auto",
                 cluster_start: ClusterStartConfig | None = None):
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        self.n_topics = check_positive_int("n_topics", n_topics)
        self.alpha0 = check_positive_float("alpha0", alpha0)
        self.oversampling = (self.n_topics if oversampling is None
                             else check_positive_int("oversampling", oversampling, 0))
        self.epsilon = check_positive_float("epsilon", epsilon, allow_none=True)
        self.non_private = check_non_private(self.epsilon, non_private)
        self.non_production = bool(non_production)
        self.delta = check_positive_float("delta", delta)
        if self.epsilon is not None and not self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
        self.mechanism = mechanism
        if mechanism == "iterative" and self.epsilon is not None:
            warn_not_covered("mechanism='iterative' (noisy power-method queries)")
        self._user_split = budget_split
        self.budget_split = budget_split if budget_split is not None else BudgetSplit()
        self.clip, self.clip_quantile, self.clip_budget_share, self._auto_clip = check_clip(
            clip, clip_length, clip_quantile, clip_budget_share, self.epsilon)
        self.power = PowerMethodConfig(check_positive_int("n_restarts", n_restarts),
                                       check_positive_int("n_iter", n_iter),
                                       seed=0 if seed is None else int(seed))
        self.denoise = DenoiseConfig(threshold=threshold)
        self.seed = seed
        if self.epsilon is not None and noise_seed is None:
            # a seeded sampler is its own, louder opt-in (InsecureNoiseWarning, report INSECURE)
            require_production_sampler(DEFAULT_SAMPLER if sampler is None else sampler,
                                       self.non_production)
        self.sampler = (make_sampler(sampler, noise_seed) if isinstance(sampler, str) or sampler is None
                        else sampler)
        self.horizon = check_continual(epochs, horizon, mechanism, continual_aggregator)
        self.continual_aggregator = continual_aggregator
        self.epochs = epochs
        self.refinement = check_refinement(refinement)
        self.start = check_start(start)
        self.cluster_start_config = check_cluster_start(cluster_start)
        self.refinement = check_continual_start(epochs, self.start, cluster_start,
                                                self.refinement, refinement, self.n_topics)
        self.start_choice_: dict | None = None
        self.warmup_share = check_warmup_boundary(warmup_boundary, warmup_share)
        self.warmup_boundary = warmup_boundary
        self.max_documents_per_sum = check_max_documents(max_documents_per_sum)
        self.privacy_unit = privacy_unit
        self._warmup_users, self._stream_users, self.user_bounding = user_bounders(
            privacy_unit, max_docs_per_user_epoch, max_docs_per_user, user_weights, max_users,
            warmup_boundary)
        self._stream_events: list = []      # every event charged to stream documents so far
        self.continual_ = None
        self._epoch_sketches = None
        accountant = default_accountant(accountant, self.epsilon, self.delta, self.privacy_unit)
        self.accountant = accountant
        self._spender = spend_session(accountant, run_id, unit=self.privacy_unit)
        self._draws: dict[str, int] = {}
        # noised values drawn by an operation whose post-processing has not succeeded yet
        # (issue 23 item 4): a retry post-processes them again, never draws again
        self._kept = KeptDraws()
        # ρ is derived once, by the accountant (a plain EventLog spender has none)
        self.rho_ = None if self.epsilon is None else getattr(
            accountant, "rho_budget", None) or zcdp_rho(self.epsilon, self.delta)
        self._warmup: WarmupSketch | None = None
        self.subspace_ = None
        self.sketch_: WhitenedSketch | None = None
        self.snapshot_: TopicSnapshot | None = None

    def _user_weights(self, bounder, X, users, epochs=None):
        """Weights (and ranks) of the rows of X in user mode; None in document mode."""
        if self.privacy_unit == "document":
            if users is not None:
                raise ValueError("users= is for privacy_unit='user'")
            return None, None
        if users is None:
            raise ValueError("privacy_unit='user': pass users= (one user id per row)")
        users = list(users)
        if len(users) != X.shape[0]:
            raise ValueError(f"{X.shape[0]} documents but {len(users)} user ids")
        return bounder.assign(users, epochs)

    def _draw_label(self, what: str) -> str:
        """``release#1``, ``refine#2``, …: the n-th draw of a kind in this run (its key)."""
        self._draws[what] = self._draws.get(what, 0) + 1
        return f"{what}#{self._draws[what]}"

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

    def warmup(self, X, *, users=None) -> "StreamingSpectralLDA":
        """Add warm-up documents (used only to find the subspace Q). User mode: ``users``,
        one user id per row."""
        if self.subspace_ is not None:
            raise ValueError("the subspace is fixed (partial_fit was called); warm-up documents "
                             "can no longer be added — start a new estimator to re-whiten")
        X = as_count_batch(X)
        w, ranks = self._user_weights(self._warmup_users, X, users)
        if self._warmup is None:
            d = X.shape[1]
            check_public_start_vocabulary(self, d)
            self._warmup = WarmupSketch(d, self._k_prime(d), clip=self.clip.warmup,
                                        seed=0 if self.seed is None else int(self.seed))
        if w is None:
            self._warmup.update(X)
        else:
            self._warmup.update(X, weights=w,
                                in_histogram=(ranks == 1) * self._warmup_users.share)
        return self

    def _fix_subspace(self) -> None:
        # whether warmup() was called is public (the caller's order of calls); how many of its
        # documents are usable is not: a private warm-up without any is drawn from noise only,
        # like the services' (issue 23, docs/privacy.md "What is public about timing")
        if self._warmup is None or (self._warmup.n_docs == 0 and self.rho_ is None):
            raise ValueError("call warmup(X) with documents of length >= 3 before partial_fit(X): "
                             "the stream is sketched in the subspace the warm-up finds")
        plan = self._warmup_plan()
        rho, where = plan.subspace_rho, plan.where
        warm = self._warmup
        # the noised histogram and Y are kept from their draw until the subspace is fixed: a
        # failure after a draw (the orthonormalisation, a later step) is retried from them
        with self._kept.operation_of(("warmup",)) as kept:
            clip = self.clip
            premise = None
            if plan.premise is not None:
                # the rounding premise N_max: a noised, charged count decides, from ñ alone,
                # whether the warm-up is drawn from its sums or from noise only (never refused)
                noisy = kept.draw(lambda: warm.draw_premise_count(
                    plan.premise, self.sampler, self._spender, partition=plan.premise_partition))
                warm, premise = premise_decision(warm, plan.premise, noisy,
                                                 self.max_documents_per_sum)
            if self._auto_clip:
                hist, _ = kept.draw(lambda: warm.draw_histogram(plan.clip_rho, self.sampler,
                                                                self._spender, **where))
                clip = clip_bounds_from_histogram(hist, self.clip_quantile, warm.clip)
            Y, events = kept.draw(lambda: warm.draw_range(
                rho, self.sampler, self._spender, max_documents=self.max_documents_per_sum,
                premise_checked=premise is not None, **where))
            self._finish_subspace(subspace_from_draw(Y, events, omega_seed=warm.seed,
                                                     clip=warm.clip, premise_check=premise), clip)
        self._warmup = None   # the warm-up's raw sums are no longer needed

    def _finish_subspace(self, subspace, clip: ClipBounds) -> None:
        """Build what the stream needs, then fix the subspace (last: a failure leaves none)."""
        sketch = WhitenedSketch(subspace, clip)
        continual = epoch_sketches = None
        if self.epochs is not None:
            continual, epoch_sketches = continual_state(self, subspace, clip)
        self.sketch_, self.clip = sketch, clip
        if continual is not None:
            self.continual_, self._epoch_sketches = continual, epoch_sketches
        self.subspace_ = subspace

    # ----------------------------------------------------------------- stream
    def partial_fit(self, X, timestamps=None, *, users=None) -> "StreamingSpectralLDA":
        """Add stream documents (the first call fixes the subspace).

        In continual mode ``timestamps`` (n_docs,) are required: each document
        goes to the epoch its timestamp says; documents of closed epochs are
        dropped and counted in ``late_documents_``. User mode: ``users``, one user id per
        row (each user's rows weighted in arrival order, docs/privacy.md).
        """
        if (timestamps is None) != (self.epochs is None):
            raise ValueError("timestamps are required with epochs=EpochClock(...) and only then"
                             if self.epochs is not None else
                             "timestamps given but the estimator has no epochs=EpochClock(...)")
        if self.privacy_unit == "user":
            X = as_count_batch(X)
            epochs = (None if self.epochs is None
                      else self.epochs.epochs(np.asarray(timestamps, dtype=np.float64).ravel()))
            w, _ = self._user_weights(self._stream_users, X, users, epochs)
        else:
            w, _ = self._user_weights(None, X, users)
        if self.subspace_ is None:
            self._fix_subspace()
        if self.epochs is not None:
            # with refinement, each document is folded into the snapshot of its epoch − L
            # (streamdp.refinement.model_epoch_for), held here until that epoch is closed
            self._epoch_sketches.add(X, timestamps, weights=w)
        else:
            self.sketch_.update(X, weights=w)
        return self

    def _warmup_plan(self):
        """The ρ shares of the warm-up and the stream (streamdp.privacy.plan.warmup_plan: the one
        rule, shared with the release service)."""
        return warmup_plan(self.rho_, privacy_unit=self.privacy_unit,
                           warmup_boundary=self.warmup_boundary, warmup_share=self.warmup_share,
                           auto_clip=self._auto_clip, clip_budget_share=self.clip_budget_share,
                           user_max_documents=(self._warmup_users.max_docs
                                               if self.privacy_unit == "user" else None))

    @property
    def stream_rho_(self) -> float | None:
        """ρ available to stream documents (all of it unless a count boundary or the user unit
        shares it with the warm-up)."""
        return self._warmup_plan().stream_rho

    def _spectral_split(self) -> BudgetSplit:
        """The user's split, or with refinement the spectral-start split (nothing on z, m1)."""
        if self._user_split is not None or self.refinement is None:
            return self.budget_split
        return BudgetSplit.spectral_start()

    @property
    def late_documents_(self) -> int:
        return 0 if self._epoch_sketches is None else self._epoch_sketches.late_documents

    def close_epochs(self, watermark: float) -> list[TopicSnapshot]:
        """Close every epoch that ends at or before ``watermark`` and release after each.

        Returns one snapshot per closed epoch (empty epochs included: the tree
        needs every leaf). Raises HorizonExceeded past a tree's horizon.
        """
        return close_epochs(self, watermark)

    def release(self, budget_fraction: float = 1.0, *, split: BudgetSplit | None = None) -> TopicSnapshot:
        """Release topics, spending ``budget_fraction`` of the stream's ρ budget.

        ``split`` overrides the per-block shares for this release, e.g.
        :meth:`BudgetSplit.spectral_start` before :meth:`refine` passes.

        Raises BudgetExhausted (from the accountant) if the budget does not allow it.
        """
        if self.sketch_ is None:
            raise ValueError("nothing to release: call warmup(X) and partial_fit(X) first")
        if self.epochs is not None:
            raise ValueError("in continual mode releases happen at epoch closes: call "
                             "close_epochs(watermark)")
        if not 0 < budget_fraction <= 1:
            raise ValueError(f"budget_fraction must be in (0, 1], got {budget_fraction!r}")
        if self.sketch_.n_docs == 0 and self.rho_ is None:
            # non-private only: a private release of an empty stream is noise, not a refusal
            # (its emptiness is an exact count; docs/privacy.md "What is public about timing")
            raise ValueError("the stream sketch is empty: partial_fit(X) with documents first")
        return spectral_release(self, budget_fraction,
                                split if split is not None else self.budget_split)

    # ------------------------------------------------------------------ starts
    def release_start(self, stream, fraction: float, *, users=None) -> float:
        """Release the start of a one-shot refinement with ``fraction`` of the stream ρ, by
        :attr:`start` (the "auto" rule included; the start is then :attr:`snapshot_`); returns
        the share of the stream ρ left for the refinement passes (what :func:`fit` does)."""
        return release_start(self, stream, fraction, users=users)

    def choose_start(self, budget_fraction: float = AUTO_COUNT_SHARE) -> dict:
        """THE start rule (:func:`streamdp.start.choose_start`) on the stream's document count,
        noised with ``budget_fraction`` of the stream ρ (sensitivity of the count block).
        The choice is recorded in ``start_choice_`` and in the next snapshot's report."""
        return choose_start_on_count(self, budget_fraction)

    def cluster_start(self, X, budget_fraction: float) -> TopicSnapshot:
        """The private clustering start (:mod:`streamdp.cluster_start`) over stream documents
        ``X`` (a count matrix or the batches of the stream): Lloyd iterations in the warm-up
        subspace, then one mapping pass to word space, with ``budget_fraction`` of the stream ρ
        (``lloyd_share`` of it on the iterations). Returns the mapped snapshot (refine next)."""
        if self.subspace_ is None:
            raise ValueError("cluster_start() works in the warm-up subspace: partial_fit(X) first")
        # every draw (each Lloyd iteration's, the mapping's) is kept until the start is
        # released: a retry after a failure replays the same noised values in the same order
        with operation(self, ("cluster", budget_fraction)) as kept:
            return self._cluster_snapshot(*cluster_start_sums(self, X, budget_fraction, kept))

    def _cluster_snapshot(self, T, sd: float, events: list, noise: dict, n_docs: float,
                          premise: dict | None) -> TopicSnapshot:
        """The clustering start's snapshot from its noised sums (post-processing). Kept in
        this module with _refine_snapshot: tests/test_no_redraw patches refined_topics and
        release_report here to fail a step after the draws."""
        topic_word, alpha, nts, fold_in_topics = refined_topics(T, sd, self.alpha0)
        privacy = release_report(
            mechanism="cluster", events=events,
            noise_sd={**noise, REFINE_BLOCK: sd} if events else {}, clip=self.clip, split=None,
            sampler=self.sampler, power=self.power, denoise_threshold=0.0,
            max_documents=self.max_documents_per_sum,
            start={"kind": "cluster", **self.cluster_start_config.to_dict(),
                   "choice": self.start_choice_})
        snap = TopicSnapshot(topic_word=topic_word, alpha=alpha,
                             eigenvalues=np.zeros(self.n_topics), n_docs=n_docs,
                             privacy=privacy, mechanism="cluster", subspace_id=self.subspace_.id,
                             stage="refined", noise_to_signal=nts, fold_in_topics=fold_in_topics,
                             topic_mass=T.sum(axis=1))
        return self._finish_snapshot(snap, events, premise)

    def public_start(self, start: PublicStart) -> TopicSnapshot:
        """Start the refinement from topics fitted on public documents: spends nothing; the
        report records the public input (:meth:`PublicStart.report`)."""
        return public_start_snapshot(self, start)

    def refine(self, X, budget_fraction: float | None = None, *, users=None) -> TopicSnapshot:
        """One private refinement pass over stream documents under the last released model.

        Each document of ``X`` (a count matrix, or an iterable of count batches: the stream
        read again) is folded into the model of :attr:`snapshot_` — public, it was released —
        and its expected topic-word counts, normalised to Frobenius norm ≤ 1, are summed;
        the sum is released once with Gaussian noise (``budget_fraction`` of the stream ρ,
        default ``share / passes`` of :attr:`refinement`) and denoised. Topic i of the result
        is the refinement of topic i of the model. Pass the same stream documents as to
        :meth:`partial_fit`: they pay the spectral release and each pass (sequential
        composition, docs/privacy.md). Raises BudgetExhausted when the budget is spent.

        User mode: ``users`` — one id per row of ``X`` (for an iterable of batches, an
        iterable of per-batch id lists); each pass weights the users' rows afresh (a new weight
        sequence per pass, Σ ≤ 1 per user: the pass's sum moves by ≤ 1 per user).

        Returns the refined :class:`TopicSnapshot` (``stage="refined"``).
        """
        if self.epochs is not None:
            raise ValueError("in continual mode refinement happens at epoch closes: "
                             "call close_epochs(watermark)")
        if self.snapshot_ is None:
            raise ValueError("refine() folds documents into a released model: call release() first")
        cfg = self.refinement if self.refinement is not None else RefinementConfig()
        if budget_fraction is None:
            budget_fraction = cfg.share / cfg.passes
        if not 0 < budget_fraction <= 1:
            raise ValueError(f"budget_fraction must be in (0, 1], got {budget_fraction!r}")
        # a retry after a post-processing failure denoises the kept noised sums again
        with operation(self, ("refine", budget_fraction, self.snapshot_.release_id)) as kept:
            return self._refine_snapshot(*refine_sums(self, X, budget_fraction, users, cfg, kept),
                                         cfg)

    def _refine_snapshot(self, T, sd: float, events: list, premise: dict | None,
                         cfg: RefinementConfig) -> TopicSnapshot:
        """A refinement pass's snapshot from its noised sums (post-processing; see
        _cluster_snapshot for why it is here)."""
        topic_word, alpha, nts, fold_in_topics = refined_topics(T, sd, self.alpha0)
        prev = self.snapshot_
        base = str(prev.privacy.get("mechanism", "none")).removesuffix("+refine")
        privacy = release_report(
            mechanism=base + "+refine", events=events, noise_sd={REFINE_BLOCK: sd} if events else {},
            clip=self.clip, split=None, sampler=self.sampler, power=self.power,
            denoise_threshold=0.0, max_documents=self.max_documents_per_sum,
            refinement={**cfg.to_dict(), "model": prev.release_id, "noise_sd": sd,
                        "passes_done": (prev.privacy.get("refinement") or {}).get("passes_done", 0) + 1},
            **{key: prev.privacy[key] for key in ("start", "public_start") if key in prev.privacy})
        snap = TopicSnapshot(topic_word=topic_word, alpha=alpha, eigenvalues=prev.eigenvalues,
                             n_docs=prev.n_docs, privacy=privacy, mechanism=prev.mechanism,
                             subspace_id=prev.subspace_id, epoch=prev.epoch, stage="refined",
                             noise_to_signal=nts, fold_in_topics=fold_in_topics,
                             topic_mass=T.sum(axis=1))
        return self._finish_snapshot(snap, events, premise)

    def _finish_snapshot(self, snap: TopicSnapshot, new_events=None,
                         premise: dict | None = None) -> TopicSnapshot:
        if new_events is None:      # a spectral release: its events are in its report
            new_events = [GaussianEvent(**{k: v for k, v in e.items() if k != "rho"})
                          for e in snap.privacy.get("events", [])]
        if premise is not None:
            # the step's premise check (estimator_one_shot.premise_check): charged to the
            # stream, and reported
            check = PremiseCheck(**{f.name: premise[f.name] for f in dataclasses.fields(PremiseCheck)})
            new_events = [check.event(premise["partition"]), *new_events]    # drawn first
            snap = dataclasses.replace(snap, privacy={**snap.privacy, "premise_check": premise})
        self._stream_events = self._stream_events + list(new_events)
        privacy = add_budget_context(
            snap.privacy, epsilon=self.epsilon, delta=self.delta, rho_budget=self.rho_,
            warmup_events=self.subspace_.provenance.get("events", []), accountant=self.accountant,
            warmup_premise_check=self.subspace_.provenance.get("premise_check"),
            stream_events=[e.to_dict() for e in self._stream_events],
            rho_stream_spent=float(sum(e.rho for e in self._stream_events)),
            warmup_boundary=self.warmup_boundary,
            privacy_unit=self.privacy_unit, user_bounding=self.user_bounding,
            partitions={WARMUP: "warm-up documents (subspace only)",
                        STREAM: "stream documents (sketches only)"})
        snap = dataclasses.replace(snap, privacy=privacy)
        self.snapshot_ = snap
        self.components_ = snap.topic_word
        self.alpha_ = snap.alpha
        return snap
