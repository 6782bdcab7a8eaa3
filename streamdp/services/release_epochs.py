"""The release service's epoch flow: one epoch close in its one order.

merge the partitions' sums → reserve → draw (:meth:`ContinualRelease.draw_epoch`) → persist
the draw in the release state (which commits the reservation) → post-process → persist the
snapshot → publish → the public release record → ``epochs_closed`` (the order and its
crash-safety argument: :mod:`streamdp.services.release`, docs/services.md). A draw persisted
but not post-processed (a failure, a restart) is finished from its noised values before
anything else, never drawn again (:meth:`EpochFlow.release_pending`).

The flow is the code of this phase; the state it reads and sets (``continual``,
``fold_models``, ``exhausted``, the state snapshot) stays on the
:class:`~streamdp.services.release.ReleaseService` it is given, whose steps (persist, publish,
announce, end of releases) it calls in this order.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace

from streamdp.continual import ContinualRelease, EpochSums
from streamdp.privacy.accountant import BudgetExhausted
from streamdp.privacy.plan import BudgetSplit
from streamdp.privacy.rounding import DocumentCountExceeded
from streamdp.privacy.tree import HorizonExceeded
from streamdp.refinement import model_epoch_for
from streamdp.release import DenoiseConfig
from streamdp.services import control, release_restore, release_state, snapshot_privacy
from streamdp.services.partition_state import PartitionState
from streamdp.services.release_announce import ENDED_HORIZON
from streamdp.services.release_merge import check_refine_sums, merge_epoch_sums, merge_refine_sums
from streamdp.snapshot import TopicSnapshot
from streamdp.tensor.power_method import PowerMethodConfig

log = logging.getLogger("streamdp.release")


class EpochFlow:
    """Epoch closes, the persisted draw's post-processing and the release state write, over
    the release service ``svc``."""

    def __init__(self, svc) -> None:
        self.svc = svc

    def new_continual(self) -> None:
        svc = self.svc
        # with refinement, the spectral start spends nothing on z and m1 (as the engine)
        split = BudgetSplit.spectral_start() if svc.refinement is not None else BudgetSplit()
        svc.continual = ContinualRelease(
            svc.subspace, svc.clip, n_topics=svc.cfg.n_topics, alpha0=svc.cfg.alpha0,
            rho=svc.plan.stream_rho, horizon=svc.cfg.horizon, split=split, sampler=svc.sampler,
            spender=svc.spend, power=PowerMethodConfig(seed=svc.cfg.seed),
            denoise=DenoiseConfig(), refinement=svc.refinement,
            aggregator=svc.cfg.continual_aggregator,
            max_documents=svc.cfg.max_documents_per_sum, privacy_unit=svc.cfg.privacy_unit,
            user_max_documents=(svc.cfg.user_bounds[1] if svc.cfg.privacy_unit == "user"
                                else None))
        premise = svc.continual.premise
        if premise is not None and premise.threshold(svc.cfg.max_documents_per_sum) <= 0:
            log.warning("max_documents_per_sum=%d is below the premise check's margin 12·σ_p = "
                        "%.3g: every epoch will be released from noise only; raise it (docs/"
                        "privacy.md 'The premise check')", svc.cfg.max_documents_per_sum,
                        premise.z * premise.sigma)

    def step(self, states: dict, partitions: list[int]) -> None:
        """Finish a persisted, not post-processed draw; then close every closable epoch in
        order (this step's view ``states`` / ``partitions``); say once when the horizon ends
        releases."""
        svc = self.svc
        if svc.continual.pending is not None:
            # an epoch drawn and persisted, not yet post-processed (a failure, a restart):
            # finish it from its noised values before anything else; never draw it again
            if not svc._check_writer() or not self.release_pending():
                return
        loaded = None      # partition states decoded once per step, however many epochs close
        while (not svc._stop.is_set() and svc.continual.epoch < svc.continual.epoch_limit
               and svc._closable(svc.continual.epoch + 1, states, partitions)):
            # stop between epochs, never inside one: a kill mid-release wastes budget
            svc.health.beat()
            # decoded once per (partition, generation): unchanged partitions are not decoded again
            loaded = loaded if loaded is not None else svc.partitions.load(states, svc.subspace)
            if not svc._check_writer():        # a newer writer took over: spend nothing
                return
            if not self.close(svc.continual.epoch + 1, loaded):
                return
        if svc.continual.epoch >= svc.continual.epoch_limit:
            svc._releases_ended(ENDED_HORIZON, f"the tree horizon is reached: epoch "
                                f"{svc.continual.epoch} of {svc.continual.epoch_limit} released")

    def close(self, epoch: int, parts: list[PartitionState]) -> bool:
        """Merge, then the spend protocol in its one order: reserve → draw (``close_epoch``) →
        persist the release state (``write_state``, which commits) → publish (the sinks)."""
        svc = self.svc
        t0 = time.perf_counter()
        # implausible partitions are left out (loudly) and the epoch releases on schedule
        refused: dict[int, str] = {}
        if svc.refinement is not None:
            check_refine_sums(parts, epoch, svc.cfg.max_documents_per_sum, refused)
        total, n_parts = merge_epoch_sums(parts, epoch, svc.subspace, svc.clip, refused=refused,
                                          max_documents=svc.cfg.max_documents_per_sum)
        refine = None
        if svc.refinement is not None:
            refine = merge_refine_sums(parts, epoch, (svc.cfg.n_topics, svc.d), skip=refused)
        svc._refused_states(refused, f"epoch {epoch}")
        sums = None if total is None else EpochSums(total, refine)
        # THE public rule (streamdp.refinement.model_epoch_for, as StreamingSpectralLDA.close_epochs):
        # refined iff the epoch's documents have a model, the snapshot of epoch − L
        model_epoch = None if svc.refinement is None else model_epoch_for(
            epoch, svc.refinement.model_lag, svc.public_start_chosen)
        refined = model_epoch is not None
        try:
            svc.continual.draw_epoch(sums, refined=refined)   # reserve → draw
        except (BudgetExhausted, DocumentCountExceeded) as exc:
            # DocumentCountExceeded: the rounding premise max_documents_per_sum (nothing reserved)
            svc._refused(exc)
            return False
        except HorizonExceeded as exc:
            svc.exhausted = str(exc)
            svc.metrics.release_outcome("refused_budget")
            log.error("%s", exc)
            svc._releases_ended(ENDED_HORIZON, str(exc))
            return False
        # The draw is persisted (and its reservation committed) before any post-processing
        # (issue 23 item 4): if eigh, the power method, the projection or the denoising raise,
        # or the process dies, the next step or start post-processes these noised values
        # again; it never draws the epoch again (that would be rejection sampling).
        if not self.write_state():                      # → persist the draw → commit
            return False
        return self.release_pending(t0, n_parts)

    def release_pending(self, t0: float | None = None, n_parts: int | None = None) -> bool:
        """Post-process the persisted draw of the last closed epoch, persist its snapshot,
        publish. A function of noised values only: safe to repeat after a failure."""
        svc = self.svc
        t0 = time.perf_counter() if t0 is None else t0
        epoch = svc.continual.epoch
        model_epoch = None if svc.refinement is None else model_epoch_for(
            epoch, svc.refinement.model_lag, svc.public_start_chosen)
        snap = svc.continual.post_process()
        privacy = snapshot_privacy.snapshot_privacy(
            snap.privacy, svc.cfg, rho=svc.rho, subspace=svc.subspace,
            accountant=svc.accountant,
            own_pending=0 if svc.accountant is None else len(svc.spend.pending),
            vocabulary=svc.vocabulary, vocabulary_meta=svc.vocabulary_meta,
            refinement=svc.refinement, model_epoch=model_epoch, start_choice=svc.start_choice,
            public_start=svc.public_start)
        # keep stage, noise_to_signal, fold_in_topics, subspace_topics (replace, not rebuild)
        # created_at is the epoch's due time (THE schedule, release_policy): public inputs only,
        # never the moment the computation ended (that depends on data volume and load)
        drawn = replace(snap, privacy=privacy, vocabulary_id=svc.vocabulary.id,
                        created_at=svc.policy.due_at(epoch, svc.commands.current))
        if svc.refinement is not None:       # keep the last L models (all a sketcher may need)
            svc.fold_models.add_snapshot(drawn)
        if not self.write_state(drawn):                 # → persist the snapshot
            return False                                 # (drawn never leaves the process)
        svc._publish(drawn)                             # only after persist
        self.observe_trend(drawn)
        svc._write_public()                             # the sketchers' models, after persist
        svc.announcer.epochs_closed(epoch)
        seconds = time.perf_counter() - t0
        svc.metrics.release_outcome("published", seconds)
        svc.metrics.set_last_release_timestamp(drawn.created_at)
        svc.metrics.epoch_closed(epoch)
        svc.metrics.set_tree(epoch, svc.cfg.horizon)
        if svc.accountant is not None:
            svc.metrics.set_budget_from_report(privacy["accountant"])
        log.info("epoch %d closed from %s partition sketch(es): release %s in %.2f s", epoch,
                 "the persisted draw of" if n_parts is None else n_parts, drawn.release_id, seconds)
        return True

    def write_state(self, snapshot: TopicSnapshot | None = None) -> bool:
        """Durably record the tree, the last snapshot (``snapshot``, a new draw, or else the
        one already in the state) and the control position; then commit the reservations
        drawn for it (spend protocol steps 3-4)."""
        svc = self.svc
        snap = svc._state_snapshot if snapshot is None else snapshot
        # orders that cover no unreleased epoch are dropped once this state is durable (they
        # decide nothing more); those of the newest epoch stay: its created_at (due_at) may be
        # computed again after a restart
        orders = svc.policy.prune(svc.commands.current, svc.continual.epoch - 1)
        meta = {"epoch": svc.continual.epoch, "writer_epoch": svc.writer_epoch,
                "release_id": None if snap is None else snap.release_id}
        if svc.accountant is not None:
            meta["ledger"] = svc.accountant.head()
        ok = svc._persist(control.RELEASE_STATE_KEY, release_state.encode(
            continual=svc.continual.state_dict(),
            last_snapshot=None if snap is None else snap.to_bytes(),
            **svc.commands.state(orders), writer_epoch=svc.writer_epoch,
            refinement_models=svc._fold_model_dicts(),
            refinement=release_restore.refinement_dict(svc.refinement)), meta)
        if ok:
            svc._state_snapshot = snap
            svc.commands.keep(orders)
        return ok

    def observe_trend(self, snap: TopicSnapshot) -> None:
        """Topic shares on /metrics and the significant-change counter (streamdp.trends):
        post-processing of the published release and the one before; never stops a release."""
        svc = self.svc
        try:
            seen = svc.trends.observe(snap)
        except Exception:                     # noqa: BLE001 - monitoring only
            log.exception("topic trends of release %s", snap.release_id)
            return
        if seen is not None:
            point, changes = seen
            svc.metrics.set_topic_trend(point, changes)
            for c in changes:
                if c.significant:
                    log.warning("topic %d share changed significantly at epoch %s: %.1f%% -> "
                                "%.1f%% (z = %.1f)", c.topic, c.epoch, 100 * c.before,
                                100 * c.after, c.z)
