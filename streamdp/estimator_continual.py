"""The estimator's continual path (``epochs=EpochClock(...)``): the continual release and the open
epochs' sketches built when the subspace is fixed, and the epoch closes — one draw per epoch
through the continual release, then its snapshot, which becomes the model that the documents
``model_lag`` epochs later are folded into (THE refinement-model rule,
:mod:`streamdp.refinement_rule`, as in the services). With ``start=PublicStart`` the documents of
epochs 1 … L are folded into the public start and every epoch is refined (the services'
``start: public``).

Functions over a :class:`~streamdp.estimator.StreamingSpectralLDA` ``est``, whose methods
delegate here; each snapshot ends in ``est._finish_snapshot`` (the budget context).
"""
from __future__ import annotations

import dataclasses

from streamdp.continual import ContinualRelease, EpochSketches
from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.tree import HorizonExceeded
from streamdp.refinement import RefinementConfig, epoch_refined, public_start_models
from streamdp.snapshot import TopicSnapshot
from streamdp.start import PublicStart


def continual_state(est, subspace, clip: ClipBounds) -> tuple[ContinualRelease, EpochSketches]:
    """The continual release and the open epochs' sketches of the subspace being fixed."""
    continual = ContinualRelease(
        subspace, clip, n_topics=est.n_topics, alpha0=est.alpha0,
        rho=est.stream_rho_, horizon=est.horizon, split=est._spectral_split(),
        sampler=est.sampler, spender=est._spender, power=est.power,
        denoise=est.denoise, refinement=est.refinement,
        aggregator=est.continual_aggregator,
        max_documents=est.max_documents_per_sum, privacy_unit=est.privacy_unit,
        user_max_documents=(est._stream_users.max_docs
                            if est.privacy_unit == "user" else None))
    epoch_sketches = EpochSketches(
        subspace, clip, est.epochs,
        n_topics=est.n_topics if est.refinement is not None else None,
        model_lag=(est.refinement or RefinementConfig()).model_lag)
    start = public_start_of(est)
    if start is not None:
        check_public_start_vocabulary(est, subspace.d)
        # epochs 1 … L are folded into the public start (model epoch 0), as in the services
        epoch_sketches.models = public_start_models(est.refinement, start)
    return continual, epoch_sketches


def check_public_start_vocabulary(est, d: int) -> None:
    """A continual public start must fit the vocabulary: checked on the first warm-up batch,
    before any draw (``warmup``), and again when the chain is built."""
    start = public_start_of(est)
    if start is not None and start.topic_word.shape != (est.n_topics, d):
        raise ValueError(f"the public start has shape {start.topic_word.shape}; this model "
                         f"needs {(est.n_topics, d)} (k topics x the vocabulary size): fit it "
                         "on this vocabulary")


def public_start_of(est) -> PublicStart | None:
    """The public start a continual chain starts from (``start=PublicStart``), else None."""
    return est.start if isinstance(est.start, PublicStart) else None


def close_epochs(est, watermark: float) -> list[TopicSnapshot]:
    """Close every epoch through ``watermark`` (:meth:`StreamingSpectralLDA.close_epochs`)."""
    if est.epochs is None:
        raise ValueError("close_epochs needs continual mode (epochs=EpochClock(...), horizon=T)")
    if est.subspace_ is None:
        est._fix_subspace()
    snaps = []
    if est.continual_.pending is not None:
        # an epoch drawn before its post-processing raised: finish it from the noised
        # values, never draw it again (issue 23 item 4)
        snaps.append(epoch_released(est, est.continual_.post_process()))
    limit = est.continual_.epoch_limit
    target = int(min(est.epochs.closable_through(watermark), limit))
    # the rounding premise (user unit: all stream documents so far) is a noised, charged
    # check inside draw_epoch: an epoch over it is drawn from noise only, never refused
    for epoch in range(est._epoch_sketches.closed_through + 1, target + 1):
        # one epoch at a time: its snapshot is the model of the documents of epoch + L
        ((_, sums),) = est._epoch_sketches.pop_through(epoch)
        # THE public rule (as the services): refined iff the epoch's documents have a model
        refined = est.refinement is not None and epoch_refined(
            epoch, est.refinement.model_lag, public_start=public_start_of(est) is not None)
        est.continual_.draw_epoch(sums, refined=refined)
        snaps.append(epoch_released(est, est.continual_.post_process()))
    if est._stream_users is not None:
        est._stream_users.close_through(target)
    if est.epochs.closable_through(watermark) > limit:
        raise HorizonExceeded(f"watermark {watermark} is past the horizon of T={est.horizon} "
                              f"epochs; {len(snaps)} epoch(s) were closed before it")
    return snaps


def epoch_released(est, snap: TopicSnapshot) -> TopicSnapshot:
    """An epoch's snapshot, finished; with refinement, the model of the epochs it is the lag of."""
    start = public_start_of(est)
    if start is not None:
        # every report lists the public input (no budget), as the services' snapshots do
        snap = dataclasses.replace(snap, privacy={
            **snap.privacy, "start": {"kind": "public", **start.report()},
            "public_start": start.report()})
    snap = est._finish_snapshot(snap)
    if est.refinement is not None:
        est._epoch_sketches.model_released(snap, est.refinement.fold_in_iter)
    return snap
