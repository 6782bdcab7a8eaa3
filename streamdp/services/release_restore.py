"""What a (re)started release service reads back from its persisted records.

:func:`read_restored` reads the release records of the state topic — the warm-up premise
count ñ and the warm-up draw (persisted before post-processing), the subspace with its clip
bounds and the start chosen at the warm-up close, the release state (tree, last snapshot,
refinement models, control position) — and refuses, with a :class:`ConfigError` saying what
to fix, a configuration those records cannot belong to (another vocabulary, another start,
another refinement plan). :func:`is_persisted` is the spend protocol's crash-recovery test:
whether the output reserved under a key is in the persisted state (then the reservation is
committed, otherwise fulfilled by the next draw; :meth:`SpendSession.recover`).
:class:`RecoveryFlow` is the (re)start's recovery over the release service: apply what was
read, republish the persisted snapshot, repair the public records a crash left behind, recover
the spend protocol's reservations, and announce again what sketchers may have missed.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from streamdp import serialization as ser
from streamdp.moments.clipping import ClipBounds
from streamdp.refinement import PUBLIC_START_EPOCH, FoldInModels, RefinementConfig, RefinementModel
from streamdp.services import control, release_start, release_state
from streamdp.services import vocabulary as vocab_mod
from streamdp.services.config import ConfigError, ServiceConfig
from streamdp.snapshot import TopicSnapshot
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupDraw

log = logging.getLogger("streamdp.release")


@dataclass(frozen=True)
class RestoredState:
    """The persisted release records, decoded and checked against the configuration."""
    subspace: Subspace | None = None          # None: the warm-up is not released yet
    clip: ClipBounds | None = None
    start_choice: dict | None = None          # the start chosen with the subspace
    refinement: RefinementConfig | None = None  # the node plan's refinement under that start
    warmup_draw: WarmupDraw | None = None     # drawn and persisted, not post-processed
    warmup_premise_kept: float | None = None  # ñ persisted before a crash: never drawn again
    persisted: dict | None = None             # the release state record's content, if any
    last_snapshot: TopicSnapshot | None = None


def read_restored(store, cfg: ServiceConfig, vocabulary, public_start) -> RestoredState:
    """The release records of ``store``, checked against ``cfg``, ``vocabulary`` (None: not
    known yet) and ``public_start``; the release state against the refinement plan the
    persisted start implies (:func:`release_start.node_refinement`)."""
    rec = store.read_latest(control.SUBSPACE_KEY)
    if rec is None:
        kept = draw = None
        premise = store.read_latest(control.WARMUP_PREMISE_KEY)
        if premise is not None:       # ñ persisted before a crash: never drawn again
            kept = float(ser.loads(premise.payload)["noisy_count"])
        drawn = store.read_latest(control.WARMUP_DRAW_KEY)
        if drawn is not None:
            if vocabulary is None or drawn.meta.get("vocabulary_id") != vocabulary.id:
                raise ConfigError(f"the deployment's warm-up draw was made for vocabulary "
                                  f"{drawn.meta.get('vocabulary_id')}, this service has "
                                  f"{None if vocabulary is None else vocabulary.id}"
                                  ": use the same vocabulary file")
            # drawn and persisted before a crash: post-processed at the first step
            draw = WarmupDraw.from_bytes(drawn.payload)
        return RestoredState(warmup_draw=draw, warmup_premise_kept=kept)
    subspace = Subspace.from_bytes(rec.payload)
    clip = ClipBounds.from_dict(rec.meta["clip"])
    if vocabulary is None:
        raise ConfigError(f"the state topic {cfg.topics.state!r} holds a warm-up subspace "
                          f"(vocabulary {rec.meta.get('vocabulary_id')}) but no usable "
                          f"vocabulary record for vocabulary_mode "
                          f"{cfg.vocabulary_mode!r}: this deployment was started with "
                          "another vocabulary_mode; restore that configuration")
    if rec.meta.get("vocabulary_id") != vocabulary.id:
        raise ConfigError(f"the deployment's subspace was built for vocabulary "
                          f"{rec.meta.get('vocabulary_id')}, this service has "
                          f"{vocabulary.id}: use the same vocabulary file")
    start_choice = release_start.restored_start(release_start.recorded_start(rec.meta), cfg,
                                                public_start)
    refinement = release_start.node_refinement(cfg, start_choice)
    persisted = last = None
    state = store.read_latest(control.RELEASE_STATE_KEY)
    if state is not None:
        persisted = release_state.decode(state.payload, refinement=refinement, now=time.time())
        check_refinement_unchanged(persisted, refinement)
        if persisted["last_snapshot"]:
            last = TopicSnapshot.from_bytes(persisted["last_snapshot"])
    return RestoredState(subspace=subspace, clip=clip, start_choice=start_choice,
                         refinement=refinement, persisted=persisted, last_snapshot=last)


def refinement_dict(refinement: RefinementConfig | None) -> dict | None:
    return None if refinement is None else refinement.to_dict()


def check_refinement_unchanged(obj: dict, refinement: RefinementConfig | None) -> None:
    """The tree's per-node plan includes the refinement block: it cannot change mid-way."""
    had = obj["refinement"]
    if int(obj["continual"].get("epoch") or 0) == 0:
        return                          # nothing released yet: any setting is fine
    if had != refinement_dict(refinement):
        raise ConfigError(
            f"configuration fields 'refinement'/'refinement_share'/'refinement_model_lag': "
            f"this deployment's tree was "
            f"started with refinement {had!r}, the configuration says "
            f"{refinement_dict(refinement)!r}. Every tree node is noised with the plan it "
            "started with (the refinement block and its share of rho), so it cannot change "
            "mid-deployment: restore the original setting, or start a new deployment")


def restore_fold_models(fold_models: FoldInModels, models: list[dict], through: int) -> None:
    """The persisted refinement models back into ``fold_models``; epochs up to ``through``
    (the last one with a snapshot) closed."""
    for m in models:
        model = RefinementModel.from_dict(m)
        if model.epoch == PUBLIC_START_EPOCH:
            fold_models.models[PUBLIC_START_EPOCH] = model
        else:
            fold_models.released(model)
    fold_models.close_through(through)


def is_persisted(key: str, store, *, warmup_released: bool, epoch: int | None) -> bool:
    """Whether the output reserved under ``key`` is in the restored, persisted state:
    ``warmup_released`` (the subspace or the warm-up draw is persisted), ``epoch`` the
    restored tree's last drawn epoch (None: no tree yet)."""
    if key.startswith(vocab_mod.SPEND_KEY):
        return store.read_latest(control.VOCABULARY_KEY) is not None
    if key.startswith("warmup"):
        return warmup_released
    # an epoch's draw and the premise check it used ("tree:premise:epoch=<t>")
    if key.startswith(("tree:premise:epoch=", "tree:epoch=")):
        try:
            t = int(key.split("=", 1)[1])
        except ValueError:
            return False
        return epoch is not None and t <= epoch
    return False


class RecoveryFlow:
    """A start's or a resync's recovery (:meth:`restore`), over the release service ``svc``:
    the state it sets (``vocabulary``, ``public_start``, ``subspace``, ``clip``, ``continual``,
    ``start_choice``, ``fold_models``, the warm-up draw) stays on the service."""

    def __init__(self, svc) -> None:
        self.svc = svc

    def restore(self) -> None:
        svc = self.svc
        svc.vocabulary_flow.restore()
        if svc.cfg.public_start_file and svc.vocabulary is not None and svc.public_start is None:
            # wrong vocabulary or k: refused here, at start-up (ConfigError says what to fix)
            svc.public_start = svc.cfg.load_public_start(svc.vocabulary.id)
        svc._state_snapshot = None
        got = read_restored(svc.store, svc.cfg, svc.vocabulary, svc.public_start)
        persisted = got.persisted                # the release state record's content, if any
        svc.warmup_draw, svc.warmup_premise_kept = got.warmup_draw, got.warmup_premise_kept
        if got.subspace is not None:
            svc.subspace, svc.clip = got.subspace, got.clip
            # the tree is built with the node plan the persisted start implies, as at the warm-up
            # close (WarmupFlow.publish_subspace), never with the configuration's share alone
            svc.refinement = got.refinement
            svc.epoch_flow.new_continual()
            svc.start_choice = got.start_choice
            if svc.refinement is not None:
                svc.fold_models = release_start.fold_in_models(
                    svc.refinement, svc.public_start, svc.public_start_chosen)
            if persisted is not None:
                svc.continual.load_state(persisted["continual"])
                if svc.refinement is not None:
                    # a pending draw's epoch gets its model when it is post-processed
                    restore_fold_models(
                        svc.fold_models, persisted["refinement_models"],
                        svc.continual.epoch - (svc.continual.pending is not None))
                if got.last_snapshot is not None:
                    snap = svc._state_snapshot = got.last_snapshot
                    svc.trends.seed(snap)          # the next release gets a point, no test
                    svc.sinks.publish(snap)        # persisted: safe to publish again
                    svc.metrics.set_last_release_timestamp(snap.created_at)
                svc.metrics.set_tree(svc.continual.epoch, svc.cfg.horizon)
        if svc._public_behind():                # a crash between state persist and public record
            svc._write_public()
        svc.records.sync_mirrors()    # the same for the public subspace/vocabulary (or a migration)
        svc.commands.restore(persisted)         # read control from the saved offset
        if svc.spend is not None:
            # Crash recovery of the spend protocol: a reservation whose noised output is in
            # the persisted state is committed now; any other is fulfilled by the next draw.
            left = svc.spend.recover(self._persisted)
            if left:
                log.warning("reservations to fulfil (output lost in a crash, not re-charged): %s",
                            ", ".join(left))
        if svc.vocabulary is not None and svc.cfg.vocabulary_mode != "file":
            svc.announcer.vocabulary_ready(svc.vocabulary.id)
        if svc.subspace is not None:
            # a crash may have cut these short; sketchers handle repeats
            svc.announcer.subspace_ready(svc.subspace.id)
            svc.announcer.epochs_closed(svc.continual.epoch if svc.continual else 0)
        if svc.accountant is not None:
            svc.metrics.set_budget_from_report(svc.accountant.report())

    def _persisted(self, key: str) -> bool:
        """Whether the output reserved under ``key`` is in the restored, persisted state."""
        svc = self.svc
        return is_persisted(
            key, svc.store, warmup_released=svc.subspace is not None or svc.warmup_draw is not None,
            epoch=None if svc.continual is None else svc.continual.epoch)
