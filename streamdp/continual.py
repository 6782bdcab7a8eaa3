"""Continual release of topics over timestamp epochs: BLT matrix factorization (default) or
the binary tree mechanism.

``aggregator="blt"`` (default): each closed epoch's sums enter y_t = (Cx)_t + z_t of a
:class:`~streamdp.privacy.blt.BLTAggregator` (one Gaussian mechanism on a data value); the
release is the prefix of x̃ = C⁻¹y (post-processing). σ is set for ρ_stream/W, W ≥
Σ_{j<T_max}(c_j + ε)² (‖c‖² of the strategy matrix plus its float rounding term ε over the
public T_max = 10⁶ epochs), so a document costs at most ρ_stream through T_max epochs, the
accountant is charged, epoch by epoch, the worst document's loss so far, and epoch
T_max + 1 is refused (docs/privacy.md §BLT, §Floating point).
State: the noised prefix, ``nbuf`` (4) public buffers and ``nbuf`` SECRET raw buffers
(double-double: exponentially weighted raw epoch sums — protect like raw data), each the
size of one epoch's noised sums.

``aggregator="tree"``: each closed epoch's sketch sums are a leaf of a :class:`~streamdp.privacy.tree.TreeAggregator`;
a dyadic node of epochs is noised once, when complete, with the per-block Gaussian
plan of :func:`~streamdp.privacy.plan.plan_release` at ρ_node = ρ_stream / depth; the
release at epoch t decomposes the sum of the ≤ ⌊log2 t⌋ + 1 noised nodes covering
[1, t] — post-processing, so it costs nothing beyond the nodes. A document (one
epoch) is in at most depth = ⌊log2 T⌋ + 1 nodes and costs depth·ρ_node = ρ_stream
over all T releases together (docs/privacy.md §Continual release).

Raw state: an epoch's raw sums live until the epoch is closed; afterwards only
the raw partial sums of *incomplete* higher nodes (≤ depth − 1 of them) and the
noised nodes are kept. Those partials are sensitive: checkpoints of this object
must be protected like raw data.

What an epoch releases is :mod:`streamdp.epoch_sums`; the open epochs' sketches,
:mod:`streamdp.epoch_sketches`; the noise of one node or BLT step,
:mod:`streamdp.continual_mechanism`; the BLT and tree kinds, :mod:`streamdp.aggregator_kinds`.
This module re-exports the names tests and services import from here.
"""
from __future__ import annotations

import math

import numpy as np

from streamdp import serialization as ser
from streamdp.aggregator_kinds import AGGREGATORS, KINDS
from streamdp.continual_mechanism import SketchNodeMechanism
from streamdp.epoch_sketches import EpochSketches  # noqa: F401 (re-exported)
from streamdp.epoch_sums import EPOCH_SUMS_VERSION, EpochSums, zero_sums  # noqa: F401 (re-exported)
from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import SketchSums
from streamdp.privacy.events import STREAM, BudgetSpender
from streamdp.privacy.noise import GaussianSampler
from streamdp.privacy.blt import DEFAULT_MAX_EPOCHS, BLTParams
from streamdp.privacy.plan import BudgetSplit, PremiseCheck, premise_split
from streamdp.privacy.premise import draw_noisy_count
from streamdp.privacy.report import release_report
from streamdp.privacy.spend import recommit_kept
from streamdp.privacy.tree import HorizonExceeded
from streamdp.privacy.rounding import DEFAULT_MAX_DOCUMENTS_PER_SUM, require_within_premise
from streamdp.refinement import BLOCK as REFINE_BLOCK
from streamdp.refinement import RefinementConfig, refined_topics, topic_order
from streamdp.release import (DenoiseConfig, decompose_sums, noise_scales, noise_sums,
                             tensor_snr)
from streamdp.snapshot import TopicSnapshot
from streamdp.start import choose_continual_topics
from streamdp.tensor.power_method import PowerMethodConfig
from streamdp.whitening.subspace import Subspace

# the public names: this module's own, then the ones imported above that other modules and
# tests import from here (re-exports)
__all__ = ["PendingRelease", "ContinualRelease", "AGGREGATORS", "EPOCH_SUMS_VERSION",
           "EpochSketches", "EpochSums", "SketchNodeMechanism", "decompose_sums", "zero_sums"]


class PendingRelease(RuntimeError):
    """A drawn epoch is waiting for its post-processing (or none is, when one was asked for)."""


class ContinualRelease:
    """Topic snapshots at every epoch close, under one ρ budget for the whole horizon.

    Parameters
    ----------
    subspace : Subspace         the public whitening basis Q (d × k')
    clip : ClipBounds           stream clip bounds (sensitivities)
    n_topics, alpha0            as in the estimator
    rho : float or None         ρ for all stream epochs together; None = exact
                                (non-private) cumulative sums
    horizon : int               tree: T, the most epochs it may close; blt: the number of
                                epochs its error is optimised for (it may close more, at the
                                same privacy, with slowly growing error)
    split, sampler, spender, power, denoise
                                as in :func:`streamdp.release.release_topics`
    aggregator : "blt" or "tree"
    blt_params : BLTParams      optional; default :func:`~streamdp.privacy.blt.default_params`
                                (horizon)

    Attributes
    ----------
    epoch : int                 epochs closed so far
    depth : int or None         tree: ⌊log2 T⌋ + 1
    rho_node : float            tree: ρ of one node = rho / depth; blt: ρ of the unit plan
                                (sensitivity Δ_b) = rho / ‖c‖²
    epoch_limit : float         the last epoch that may be closed (inf for blt)
    """

    def __init__(self, subspace: Subspace, clip: ClipBounds, *, n_topics: int, alpha0: float,
                 rho: float | None, horizon: int, split: BudgetSplit = BudgetSplit(),
                 sampler: GaussianSampler | None = None, spender: BudgetSpender | None = None,
                 power: PowerMethodConfig = PowerMethodConfig(),
                 denoise: DenoiseConfig = DenoiseConfig(), label: str = "tree",
                 refinement: RefinementConfig | None = None, aggregator: str = "blt",
                 blt_params: BLTParams | None = None,
                 max_documents: int = DEFAULT_MAX_DOCUMENTS_PER_SUM,
                 privacy_unit: str = "document",
                 user_max_documents: int | None = None) -> None:
        if aggregator not in AGGREGATORS:
            raise ValueError(f"aggregator must be one of {AGGREGATORS}, got {aggregator!r}")
        self.aggregator = aggregator
        self._kind = KINDS[aggregator]
        self.subspace, self.clip = subspace, clip
        self.n_topics, self.alpha0 = int(n_topics), float(alpha0)
        self.horizon = int(horizon)
        self.depth = self._kind.depth(horizon)
        self.label = label
        self.blt_params = blt_params
        self.split, self.power, self.denoise = split, power, denoise
        self.refinement = refinement
        self.max_documents = max_documents     # the rounding premise N_max (docs/privacy.md)
        if privacy_unit not in ("document", "user"):
            raise ValueError(f"privacy_unit must be 'document' or 'user', got {privacy_unit!r}")
        # user unit: N_max also bounds every stream document released so far (a user's
        # documents can sit in every epoch; docs/privacy.md "The user-level unit")
        self.privacy_unit = privacy_unit
        # M: a user's most documents of weight > 0 (user unit: the premise check's sensitivity)
        self.user_max_documents = user_max_documents
        if privacy_unit == "user" and rho is not None and user_max_documents is None:
            raise ValueError("a private user-level continual release needs user_max_documents "
                             "(M, the premise check's sensitivity)")
        self.documents_released = 0
        # the noised premise check (docs/privacy.md "The premise check"): the draw of the epoch
        # being closed, kept until that epoch is drawn (a retry never draws it again), and the
        # last epoch's check (public: reported with its snapshot)
        self.premise: PremiseCheck | None = None
        self.release_rho: float | None = None
        self.premise_kept: dict | None = None
        self.last_premise: dict | None = None
        self.rho = rho
        self.sampler = sampler
        # epochs whose documents were refined under an earlier snapshot (public: it only
        # depends on whether a snapshot existed when the epoch was open)
        self.refined_epochs = 0
        # (noised EpochSums, noise sd) of the last draw until its snapshot is made
        self.pending: tuple[EpochSums, dict | None] | None = None
        # topic identity: the topics last published, so the next spectral snapshot numbers its
        # topics alike (refined ones continue the rows of the refinement sums)
        self.published_topics: np.ndarray | None = None
        # the continual selection rule's inputs (public: indices of released sums): each recent
        # release's tensor index, and the smallest index of a model refined epochs were folded into
        self.release_snr: dict[int, float] = {}
        self.fold_model_snr = math.inf
        if rho is not None:
            if not (rho > 0 and math.isfinite(rho)):
                raise ValueError(f"rho must be a finite number > 0 or None, got {rho!r}")
            if sampler is None:
                raise ValueError("a private continual release needs a noise sampler")
            if self.blt_params is None:
                self.blt_params = self._kind.default_params(self.horizon)
            self._build(spender)
        else:
            self.rho_node, self.mechanism, self.tree = None, None, None
            self._exact: EpochSums | None = None
            self._exact_epoch = 0

    def _build(self, spender) -> None:
        """The node/noise mechanism and the aggregator (again after loading other BLT params)."""
        share = None if self.refinement is None else self.refinement.share
        # the premise checks' ρ is carved from the stream's ρ here (plan.premise_split, the one
        # place); the releases get the rest. A user's count (all stream documents so far) enters
        # every check through the last epoch, a document's 1 (BLT) or depth (tree) checks
        if self.privacy_unit == "user":
            checks = self.horizon if self.depth is not None else DEFAULT_MAX_EPOCHS
            sens = float(self.user_max_documents)
        else:
            checks, sens = self._kind.premise_checks(self), 1.0
        self.release_rho, self.premise = premise_split(self.rho, checks_per_atom=checks,
                                                       sensitivity=sens)
        self.rho_node = self._kind.unit_rho(self, share)
        self.mechanism = SketchNodeMechanism(self.subspace, self.clip, self.split, self.rho_node,
                                             self.sampler, share, max_documents=self.max_documents)
        self.mechanism.premise_checked = True
        self.tree = self._kind.make(self, spender)

    @property
    def epoch_limit(self) -> float:
        return self._kind.epoch_limit(self)

    def noise_multiplier(self) -> float:
        """sd of the current release's noise / σ of one draw (tree: √nodes summed)."""
        return self._kind.noise_multiplier(self)

    @property
    def epoch(self) -> int:
        return self.tree.epoch if self.tree is not None else self._exact_epoch

    def _as_epoch_sums(self, sums) -> EpochSums:
        if sums is None:
            sums = zero_sums(self.subspace)
        if isinstance(sums, SketchSums):
            sums = EpochSums(sums)
        if self.refinement is None:
            return EpochSums(sums.sketch)
        if sums.refine is None:
            return EpochSums(sums.sketch, np.zeros((self.n_topics, self.subspace.d)))
        if sums.refine.shape != (self.n_topics, self.subspace.d):
            raise ValueError(f"refinement sums have shape {sums.refine.shape}, expected "
                             f"{(self.n_topics, self.subspace.d)}")
        return sums

    def close_epoch(self, sums: EpochSums | SketchSums | None, *, refined: bool = False) -> TopicSnapshot:
        """Close the next epoch with its raw sums (None = no documents) and release:
        :meth:`draw_epoch` then :meth:`post_process`.

        ``refined``: the epoch's documents were folded into an earlier snapshot (its
        refinement sums are meaningful). From the first such epoch on, snapshots are refined:
        topics from the released refinement prefix, topic i continuing topic i.

        Raises HorizonExceeded past the horizon and BudgetExhausted if the
        accountant refuses the epoch's nodes; in both cases nothing changes. If the
        post-processing raises, the draw stays :attr:`pending`: call :meth:`post_process`
        again (never a new draw: that would be rejection sampling on the noise).
        """
        self.draw_epoch(sums, refined=refined)
        return self.post_process()

    def draw_epoch(self, sums: EpochSums | SketchSums | None, *, refined: bool = False) -> None:
        """Reserve and draw the next epoch's release; its noised sums become :attr:`pending`
        (part of :meth:`state_dict`: persist it before post-processing, issue 23 item 4)."""
        if self.pending is not None:
            raise PendingRelease(f"epoch {self.epoch}'s draw is not post-processed yet: call "
                                 "post_process() (a new draw would be rejection sampling)")
        sums = self._as_epoch_sums(sums)
        if self.tree is None:
            if self._exact_epoch >= self.epoch_limit:
                raise HorizonExceeded(f"epoch {self._exact_epoch + 1} is past the horizon "
                                      f"T={self.horizon}")
            self._exact = sums if self._exact is None else self._exact + sums
            self._exact_epoch += 1
            released = EpochSums(noise_sums(self._exact.sketch, [], None, self.subspace.Q),
                                 self._exact.refine)
            sd = None
        else:
            # the rounding premise: a noised, charged check decides, from the released ñ only,
            # whether the epoch is drawn from its sums or from noise only — never a refusal
            t = self.epoch + 1
            if t > self.epoch_limit:
                self.tree.add_epoch(sums)           # raises HorizonExceeded (nothing drawn)
            noisy, partition = self._premise_draw(t, sums)
            passed = self.premise.passes(noisy, self.max_documents)
            if not passed:
                sums = self._as_epoch_sums(None)
                self._kind.empty_completing(self, t)
            released = self.tree.add_epoch(sums)
            self.premise_kept = None
            self.last_premise = {"epoch": t, "noisy_count": noisy, "passed": passed,
                                 "partition": partition,
                                 "threshold": self.premise.threshold(self.max_documents)}
            if passed:
                self.documents_released += int(sums.sketch.n_docs)
            mult = self.noise_multiplier()
            sd = noise_scales(self.mechanism.plan(STREAM), mult)
            if self.refinement is not None:
                e = next(e for e in self.mechanism.plan(STREAM) if e.block == REFINE_BLOCK)
                sd[REFINE_BLOCK] = e.sigma * mult
        if refined and self.refinement is not None:
            self.refined_epochs += 1
            # this epoch's rows were folded into the snapshot of epoch t − L (the refinement
            # model rule), or into a public start's model before any snapshot (index ∞)
            m = self.epoch - self.refinement.model_lag
            self.fold_model_snr = min(self.fold_model_snr,
                                      self.release_snr.get(m, 0.0) if m >= 1 else math.inf)
        self.pending = (released, sd)          # noised (public) from here on

    def post_process(self) -> TopicSnapshot:
        """The snapshot of the :attr:`pending` draw (eigh, power method, denoising, refined
        topics): a function of the noised values only, so it may run again after a failure or
        a restart; the draw is kept until it succeeds."""
        if self.pending is None:
            raise PendingRelease("no drawn epoch to post-process")
        released, sd = self.pending
        snap = self._snapshot(released, sd)
        self.pending = None
        return snap

    # ------------------------------------------------------------ the premise check
    def _premise_count(self, sums: EpochSums) -> int:
        """The exact count the check noises: the largest raw sum the epoch would noise
        (document unit), or every stream document released so far plus this epoch's (user)."""
        if self.privacy_unit == "user":
            return self.documents_released + int(sums.sketch.n_docs)
        return self._largest_raw_sum(sums)

    def _premise_draw(self, t: int, sums: EpochSums) -> tuple[float, str]:
        """ñ of epoch t through the spend protocol, kept until epoch t is drawn: a retry
        (after a refusal or an exception before the epoch's draw) reuses it, never draws again."""
        partition = STREAM if self.privacy_unit == "user" else self._kind.premise_partition(self, t)
        event = self.premise.event(partition)
        label = f"{self.label}:premise:epoch={t}"
        kept = self.premise_kept
        if kept is not None and kept["epoch"] == t:
            recommit_kept(self.tree.spender, [event], label=label)
            return float(kept["noisy_count"]), partition
        noisy = draw_noisy_count(self.premise, self._premise_count(sums), self.mechanism.sampler,
                                 self.tree.spender, partition=partition, label=label)
        self.premise_kept = {"epoch": t, "noisy_count": float(noisy)}
        return float(noisy), partition

    def require_user_premise(self, more_documents: int) -> None:
        """User unit, private: refuse (before anything is reserved) a release that would bring
        the stream documents released so far above N_max (the rounding of every epoch sum a
        user touches adds up; docs/privacy.md "The user-level unit"). Document unit: nothing."""
        if self.privacy_unit == "user" and self.tree is not None:
            require_within_premise(self.documents_released + int(more_documents),
                                   self.max_documents,
                                   "user-level continual release (all stream documents so far)")

    def _largest_raw_sum(self, sums: EpochSums) -> int:
        """Documents in the largest raw sum closing this epoch would noise: the epoch's own sum
        (BLT), or the largest tree node completing now (its raw partial plus this epoch)."""
        return self._kind.largest_raw_sum(self, sums)

    def _snapshot(self, released: EpochSums, sd: dict | None) -> TopicSnapshot:
        t = self.epoch
        spectral_sd = None if sd is None else {k: v for k, v in sd.items() if k != REFINE_BLOCK}
        topic_word, alpha, lambdas, U = decompose_sums(
            released.sketch, self.subspace, n_topics=self.n_topics, alpha0=self.alpha0,
            noise_sd=spectral_sd, power=self.power, denoise=self.denoise,
            return_subspace_topics=True)
        private = self.tree is not None
        stage, nts, fold_in, selection = "spectral", None, None, None
        snr = None if spectral_sd is None else tensor_snr(
            released.sketch, n_topics=self.n_topics, alpha0=self.alpha0, noise_sd=spectral_sd)
        if snr is not None:     # kept for the releases later epochs may be folded into
            lag = 0 if self.refinement is None else self.refinement.model_lag
            self.release_snr = {e: v for e, v in self.release_snr.items() if e > t - lag - 1}
            self.release_snr[t] = float(snr)
        if self.refined_epochs > 0:
            stage = "refined"
            r_topics, r_alpha, r_nts, r_fold_in = refined_topics(
                released.refine, sd[REFINE_BLOCK] if sd else 0.0, self.alpha0)
            # THE continual selection rule (streamdp.start, post-processing of released
            # values): the refined topics, or the spectral decomposition of the same sums
            selection = choose_continual_topics(snr, self.fold_model_snr)
            if selection["published"] == "spectral":
                # numbered as the snapshot published before (the one identity rule), whose
                # topics are the model the newest refinement rows were folded into: topic i
                # continues topic i and later epochs' models keep the rows' order; the model
                # later epochs fold into is what this snapshot published
                perm = topic_order(topic_word, r_topics if self.published_topics is None
                                   else self.published_topics)
                topic_word, alpha = topic_word[perm], np.asarray(alpha)[perm]
                lambdas = np.asarray(lambdas)[perm]
                U = None if U is None else np.asarray(U)[:, perm]
                fold_in = topic_word
            else:
                topic_word, alpha, fold_in = r_topics, r_alpha, r_fold_in
                U = None
                if t in self.release_snr:
                    # the index of what this release published, for the epochs folded into
                    # it: refined topics are as informative as the models their rows were
                    # folded into (∞ for a public start), not as its own spectral half
                    self.release_snr[t] = float(self.fold_model_snr)
            # each row's noise-to-signal in the released refinement sums (row i: topic i,
            # whichever estimate is published): the budget's signal per topic
            nts = r_nts
        elif self.published_topics is not None:
            # a spectral decomposition numbers its topics afresh: align them to the snapshot
            # published before (the one rule, refinement.topic_order; post-processing)
            perm = topic_order(topic_word, self.published_topics)
            topic_word, alpha = topic_word[perm], np.asarray(alpha)[perm]
            lambdas = np.asarray(lambdas)[perm]
            U = None if U is None else np.asarray(U)[:, perm]
        # mass each topic moved since the same index of the last published release (public)
        change = (None if self.published_topics is None
                  or self.published_topics.shape != np.shape(topic_word) else
                  0.5 * np.abs(np.asarray(topic_word) - self.published_topics).sum(axis=1))
        aggregator_fields = (self._kind.report_fields(self, t) if private else
                             {"tree_depth": self.depth, "nodes_summed": [],
                              "rho_per_document": 0.0, "node_events": []})
        privacy = release_report(
            mechanism=self.aggregator, events=(), noise_sd=sd, clip=self.clip,
            split=self.split if private else None, sampler=self.sampler if private else None,
            power=self.power, denoise_threshold=self.denoise.threshold if private else 0.0,
            max_documents=self.max_documents, epochs_covered=[1, t], horizon=self.horizon,
            rho_node=self.rho_node,
            **aggregator_fields,
            refinement=None if self.refinement is None else {
                **self.refinement.to_dict(), "refined_epochs": self.refined_epochs})
        if selection is not None:
            privacy["topic_selection"] = selection
        if not private:
            privacy["mechanism"] = "none"
        else:
            # the rounding premise's noised check (public: ñ is a released value; whether this
            # epoch was drawn from its sums or from noise only is decided from it alone)
            privacy["premise_check"] = {**self.premise.to_dict(),
                                        "max_documents": self.max_documents,
                                        "epoch": self.last_premise}
        snap = TopicSnapshot(topic_word=topic_word, alpha=alpha, eigenvalues=lambdas,
                             n_docs=float(released.sketch.count), privacy=privacy,
                             mechanism=self.aggregator if private else "none",
                             subspace_id=self.subspace.id, epoch=t, subspace_topics=U,
                             noise_to_signal=nts, fold_in_topics=fold_in, stage=stage,
                             topic_source=("spectral" if selection is None
                                           else selection["published"]),
                             topic_change=change,
                             # each topic's noised mass (row sums of the released refinement
                             # prefix): post-processing, what topic trends are computed from
                             topic_mass=(None if released.refine is None
                                         else np.asarray(released.refine).sum(axis=1)))
        # last: a post-processing that raised leaves the alignment state as it was (a retry
        # of the pending draw aligns to the same published topics, issue 23 item 4)
        self.published_topics = np.asarray(topic_word, dtype=np.float64)
        return snap

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """msgpack-friendly state. Contains raw partial sums: protect like raw data. A
        :attr:`pending` draw is part of it (post-processed again after a restart)."""
        pending = None if self.pending is None else {
            "sums": self.pending[0].to_dict(),
            "sd": None if self.pending[1] is None else {k: float(v) for k, v in self.pending[1].items()}}
        published = (None if self.published_topics is None
                     else ser.pack_array(self.published_topics))     # public values
        if self.tree is None:
            return {"kind": "continual_exact", "v": 1, "epoch": self._exact_epoch,
                    "refined_epochs": self.refined_epochs, "pending": pending,
                    "published_topics": published,
                    "sums": None if self._exact is None else self._exact.to_dict()}
        state = self.tree.state_dict(lambda s: s.to_dict())
        return {"horizon": self.horizon, **state, "refined_epochs": self.refined_epochs,
                "documents_released": self.documents_released, "pending": pending,
                "published_topics": published, "premise_kept": self.premise_kept,
                "last_premise": self.last_premise,
                "release_snr": [[e, None if math.isinf(v) else v]          # None: ∞
                                for e, v in sorted(self.release_snr.items())],
                "fold_model_snr": (None if math.isinf(self.fold_model_snr)
                                   else self.fold_model_snr)}

    def load_state(self, state: dict) -> "ContinualRelease":
        self.refined_epochs = int(state.get("refined_epochs", 0))
        published = state.get("published_topics")     # absent in states before topic identity
        self.published_topics = (None if published is None else np.asarray(
            ser.unpack_array(published, name="published_topics"), dtype=np.float64))
        self.documents_released = int(state.get("documents_released", 0))
        self.premise_kept = state.get("premise_kept")
        self.last_premise = state.get("last_premise")
        # absent in states before the fold-model condition: no index known, so the rows
        # already folded count as folded into noise (the rule as it was before)
        self.release_snr = {int(e): math.inf if v is None else float(v)
                            for e, v in state.get("release_snr", [])}
        fold = state.get("fold_model_snr", 0.0 if self.refined_epochs else None)
        self.fold_model_snr = math.inf if fold is None else float(fold)
        pending = state.get("pending")
        self.pending = None if pending is None else (EpochSums.from_dict(pending["sums"]),
                                                     pending["sd"])
        if self.tree is None:
            if state.get("kind") != "continual_exact":
                raise ValueError("state is not from a non-private continual release")
            self._exact_epoch = int(state["epoch"])
            self._exact = None if state["sums"] is None else EpochSums.from_dict(state["sums"])
            return self
        kind = state.get("kind")
        expected = self._kind.state_kind
        if kind != expected:
            raise ValueError(f"the persisted continual state is a {kind!r}, but the configured "
                             f"aggregator is {self.aggregator!r} ({expected!r}): an aggregator "
                             "cannot change mid-stream; configure the one the stream started with")
        if int(state.get("horizon", -1)) != self.horizon:
            raise ValueError(f"{self.aggregator} state has horizon {state.get('horizon')}, "
                             f"configured {self.horizon}: the accounting of a continual release "
                             "cannot change mid-way")
        self.tree = self._kind.restore(self, state)
        return self
