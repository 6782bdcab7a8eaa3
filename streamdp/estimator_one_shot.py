"""The estimator's one-shot calls: the spectral release, the starts (the start rule's noised
count, the clustering start's draws, a public start) and the refinement passes' draws, each
after the premise check of its documents (:func:`premise_check`) and inside one kept operation
(:func:`operation`: a retry after a post-processing failure reuses the kept draws).

Functions over a :class:`~streamdp.estimator.StreamingSpectralLDA` ``est``, whose methods
delegate here: they read its configuration and draw through its sampler and spender
(``est._spender``, ``est._draw_label``), and end with ``est._finish_snapshot``. The refinement
pass and the clustering start stop at their noised sums: the estimator turns them into
topics and a report (tests/test_no_redraw injects failures into those steps through the
estimator module's names).
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import scipy.sparse as sp

from streamdp.cluster_start import (Assignment, ClusterMappingModel, centre_sums, centred_frame,
                                    cluster_sums, plan_start)
from streamdp.documents import as_count_batch
from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import WhitenedSketch
from streamdp.privacy.accountant import BudgetExhausted
from streamdp.privacy.events import STREAM, EventLog, GaussianEvent, sigma_for_rho
from streamdp.privacy.kept_draws import KeptDraws
from streamdp.privacy.plan import BudgetSplit, premise_split
from streamdp.privacy.premise import check_report, draw_noisy_count
from streamdp.privacy.report import release_report
from streamdp.privacy.sensitivity import block_sensitivities
from streamdp.privacy.spend import admit, spend
from streamdp.privacy.user_bounding import UserBounder
from streamdp.refinement import (RefinementConfig, RefinementModel, RefinementSketch,
                                 plan_refinement)
from streamdp.release import release_topics
from streamdp.snapshot import TopicSnapshot
from streamdp.start import AUTO_COUNT_SHARE, PublicStart, choose_start


@contextmanager
def operation(est, operation) -> Iterator[KeptDraws]:
    """``est._kept.operation_of(operation)`` for a one-shot call that starts with its premise
    check. A budget refusal of the call's first draw after the check forgets the check's ñ
    (the only kept value then): the accountant refuses from ρ's alone, independent of ñ, and
    nothing derived from ñ left the process, so a later call may draw (a retry draws and
    pays a new ñ: not rejection sampling). Likewise a refusal in the first attempt of a call
    with several draws (the clustering start, when another spender on the ledger took budget
    after its admission): every value was drawn in this attempt, the refusal reads none of
    them, they stay charged and are forgotten. Any other failure keeps the draws, and so does
    a refusal in a retry of one (its kept values were post-processed by a failure)."""
    with est._kept.operation_of(operation) as kept:
        first_attempt = not kept.values
        try:
            yield kept
        except BudgetExhausted:
            if est.rho_ is not None and (first_attempt or len(kept.values) == 1):
                kept.forget()
            raise


def premise_check(est, rho: float | None, n: int, kept: KeptDraws,
                  what: str) -> tuple[float | None, dict | None]:
    """The rounding premise N_max of a one-shot step (docs/privacy.md "The premise check"):
    its check's ρ is carved out of the step's ``rho`` (plan.premise_split, as the
    warm-up's), and ñ = n + N(0, σ_p²) of the step's ``n`` documents is drawn through the
    accountant (δ_p on the stream atom), kept with the step's draws. Returns (ρ left for
    the step's draws, the check's report); the caller draws from its sums iff
    ``report["passed"]``, else from noise only — never a refusal. Non-private: (None, None)."""
    if rho is None:
        return None, None
    rho, check = _premise_split(est, rho)
    noisy = kept.draw(lambda: draw_noisy_count(
        check, n, est.sampler, est._spender, partition=STREAM,
        label=est._draw_label(f"{what}-premise")))
    return rho, {**check_report(check, noisy, est.max_documents_per_sum),
                 "partition": STREAM}


def _premise_split(est, rho: float):
    """(ρ left for a one-shot step's draws, its premise check): the step's carve-out."""
    sens = 1.0 if est.privacy_unit == "document" else float(est._stream_users.max_docs)
    return premise_split(rho, checks_per_atom=1, sensitivity=sens)


def spectral_release(est, budget_fraction: float, split: BudgetSplit) -> TopicSnapshot:
    """A spectral release of the stream sketch with ``budget_fraction`` of the stream ρ, after
    its premise check (:meth:`StreamingSpectralLDA.release`, the tensor start)."""
    rho = None if est.rho_ is None else est.stream_rho_ * budget_fraction
    # a retry after a post-processing failure decomposes the kept noised sums again
    with operation(est, ("release", budget_fraction, split)) as kept:
        sums = est.sketch_.sums()
        rho, premise = premise_check(est, rho, sums.n_docs, kept, "release")
        if premise is not None and not premise["passed"]:
            sums = WhitenedSketch(est.subspace_, est.clip).sums()     # noise only
        snap = release_topics(sums, est.subspace_, n_topics=est.n_topics,
                              alpha0=est.alpha0, rho=rho, clip=est.clip,
                              mechanism=est.mechanism, split=split,
                              sampler=est.sampler, spender=est._spender,
                              power=est.power, denoise=est.denoise, partition=STREAM,
                              max_documents=est.max_documents_per_sum,
                              label=lambda: est._draw_label("release"), kept=kept,
                              premise_checked=premise is not None)
        return est._finish_snapshot(snap, premise=premise)


def release_start(est, stream, fraction: float, *, users=None) -> float:
    """Release the start of a one-shot refinement with ``fraction`` of the stream ρ, by
    :attr:`start` (the "auto" rule included; the start is then :attr:`snapshot_`); returns
    the share of the stream ρ left for the refinement passes (what :func:`fit` does)."""
    start = est.start
    if isinstance(start, PublicStart):
        est.public_start(start)
        return 1.0              # the start spent nothing: the passes get everything
    auto_count = start == "auto" and est.rho_ is not None and est.privacy_unit == "document"
    if start == "auto":
        if not auto_count:
            # no noise: the tensor start is exact; user unit: the clustering start's
            # sensitivity is per document, so the rule has one candidate
            start = "tensor"
        else:
            start = est.choose_start(AUTO_COUNT_SHARE)["start"]
            fraction -= AUTO_COUNT_SHARE
    if start == "cluster":
        if est.privacy_unit == "user":
            raise ValueError("the clustering start is per document: with privacy_unit='user' "
                             "use start='tensor' or a PublicStart")
        est.cluster_start(stream, fraction)
    else:
        snap = spectral_release(est, fraction, est._spectral_split())
        # the start and the rule's choice travel with every refined report, as for "cluster"
        est.snapshot_ = dataclasses.replace(snap, privacy={
            **snap.privacy, "start": {"kind": "tensor", "choice": est.start_choice_}})
    return 1.0 - fraction - (AUTO_COUNT_SHARE if auto_count else 0.0)


def choose_start_on_count(est, budget_fraction: float = AUTO_COUNT_SHARE) -> dict:
    """THE start rule (:func:`streamdp.start.choose_start`) on the stream's document count,
    noised with ``budget_fraction`` of the stream ρ (sensitivity of the count block).
    The choice is recorded in ``start_choice_`` and in the next snapshot's report."""
    if est.sketch_ is None:
        raise ValueError("choose_start() reads the stream's count: partial_fit(X) first")
    if est.privacy_unit == "user" and est.rho_ is not None:
        # a public decision (the configured unit): the count moves by up to M per user
        raise ValueError("choose_start() noises a document count (sensitivity 1): with "
                         "privacy_unit='user' use start='tensor' or a PublicStart")
    # an exact integer, no rounding: float(n) is exact up to 2⁵³ and min() with a constant
    # moves by ≤ 1 when n does, so the count's sensitivity is 1 without the N_max premise
    # (docs/privacy.md "The premise check": no check needed, no refusal)
    n = float(min(int(est.sketch_.n_docs), 2 ** 53))
    if est.rho_ is None:
        n_noised = n
        events = []
    else:
        sens = block_sensitivities(ClipBounds.unclipped(),
                                   max_documents=est.max_documents_per_sum)["count"]
        event = GaussianEvent("count", sens, sigma_for_rho(sens, est.stream_rho_ * budget_fraction),
                              partition=STREAM, mechanism="start-rule")
        events = [event]
        n_noised = float(spend(est._spender if est._spender is not None else EventLog(),
                               events, label=est._draw_label("start-count"),
                               draw=lambda: est.sampler.add_noise(np.array([n]), event.sigma))[0])
    rho = None if est.rho_ is None else est.stream_rho_
    est.start_choice_ = choose_start(n_noised, rho, est.n_topics, est.subspace_.dim)
    est._stream_events = est._stream_events + events
    return est.start_choice_


def cluster_start_sums(est, X, budget_fraction: float, kept: KeptDraws):
    """The clustering start's draws: (mapped sums T, their noise sd, every event, the noise sd
    per block, the released document count, the premise check's report)."""
    cfg = est.cluster_start_config
    batches = [X] if (sp.issparse(X) or isinstance(X, np.ndarray)) else list(X)
    Q = est.subspace_.Q
    k = est.n_topics
    seed = 0 if est.seed is None else int(est.seed)
    # one premise check covers every draw of the start: each of its sums (centre, Lloyd
    # iterations, mapping) is over non-empty rows of X, so X's row count bounds them all
    rows = sum(int(as_count_batch(b, Q.shape[0]).shape[0]) for b in batches)
    total = None if est.rho_ is None else est.stream_rho_ * budget_fraction
    if total is not None:       # every draw admitted before the first: a refusal charges nothing
        admit_cluster_start(est, total, kept)
    rho, premise = premise_check(est, total, rows, kept, "cluster")
    noise_only = premise is not None and not premise["passed"]
    plan = None if rho is None else plan_start(rho, cfg, max_documents=est.max_documents_per_sum)
    events_all = []
    noise = {}

    def draw(values, events):
        """Noise ``values`` by ``events`` (kept for a retry, charged); zeros instead of the
        values when the premise check failed (noise only)."""
        if noise_only:
            values = tuple(np.zeros_like(v) for v in values)
        out = kept.draw(lambda: spend(
            est._spender if est._spender is not None else EventLog(), events,
            label=est._draw_label("cluster"),
            draw=lambda: tuple(est.sampler.add_noise(v, e.sigma)
                               for v, e in zip(values, events))))
        events_all.extend(events)
        noise.update({e.block: e.sigma for e in events})
        return out

    centre = frame = None
    if cfg.centre_share > 0:
        # the centre draw (Σy, n, Σ y yᵀ over every document): documents then enter the
        # Lloyd sums centred, whitened and of unit norm (Assignment.summand)
        S, counts, M, _ = centre_sums(batches, Q)
        moment_sd = 0.0
        if plan is not None:
            ev = plan.centre
            S, counts, M = draw((S, counts, M), list(ev))
            moment_sd = ev[2].sigma
        centre, frame, radius = centred_frame(S, counts, M, moment_sd, k, with_radius=True)
    else:
        radius = 0.0
    rule = Assignment.random(k, Q.shape[1], seed, centre, frame, radius)
    for i in range(cfg.iterations):
        S, counts, _ = cluster_sums(batches, Q, rule)
        if plan is not None:
            S, counts = draw((S, counts), list(plan.iterations[i]))
        rule = Assignment.from_released(S, counts, rule)
    model = ClusterMappingModel(Q, rule)
    sketch = RefinementSketch(*model.shape)
    for b in batches:
        sketch.update(b, model)
    if sketch.n_docs == 0 and est.rho_ is None:      # private: noise only, never refused
        raise ValueError("cluster_start() got no non-empty documents")
    if est.rho_ is None:
        T, sd, map_events = sketch.sums, 0.0, []
    else:
        event = plan.mapping
        map_events = [event]
        raw = np.zeros_like(sketch.sums) if noise_only else sketch.sums
        T = kept.draw(lambda: spend(
            est._spender if est._spender is not None else EventLog(), map_events,
            label=est._draw_label("cluster-map"),
            draw=lambda: est.sampler.add_noise(raw, event.sigma)))
        sd = event.sigma
    events = events_all + map_events
    n_docs = float(sketch.n_docs) if est.rho_ is None else float(counts.sum())
    return T, sd, events, noise, n_docs, premise


def admit_cluster_start(est, rho: float, kept: KeptDraws) -> None:
    """The accountant admits every draw of the clustering start at total ``rho`` — its premise
    check, centre draw, Lloyd iterations and mapping pass, under the labels they will be drawn
    with — before the first (:func:`streamdp.privacy.spend.admit`): a budget that does not hold
    the whole start refuses it before any draw, charging nothing, instead of in a later
    iteration with the earlier draws made, charged and pending (their operation blocking every
    other call). A retry replays its kept draws: only the rest is counted."""
    rest, check = _premise_split(est, rho)
    plan = plan_start(rest, est.cluster_start_config, max_documents=est.max_documents_per_sum)
    drawn = dict(est._draws)

    def label(what: str) -> str:            # est._draw_label's next label, without taking it
        drawn[what] = drawn.get(what, 0) + 1
        return f"{what}#{drawn[what]}"
    planned = [(label("cluster-premise"), (check.event(STREAM),))] + [
        (label(what), events) for what, events in plan.draws()]
    admit(est._spender, planned[len(kept.values):], label="cluster-start")


def public_start_snapshot(est, start: PublicStart) -> TopicSnapshot:
    """Start the refinement from topics fitted on public documents: spends nothing; the
    report records the public input (:meth:`PublicStart.report`)."""
    if not isinstance(start, PublicStart):
        raise ValueError(f"public_start needs a streamdp.PublicStart, got {type(start).__name__}")
    if est.subspace_ is None:
        raise ValueError("public_start(): partial_fit(X) first")
    if start.topic_word.shape != (est.n_topics, est.subspace_.d):
        raise ValueError(f"the public start has shape {start.topic_word.shape}; this model "
                         f"needs {(est.n_topics, est.subspace_.d)} (k topics × the vocabulary)")
    privacy = release_report(mechanism="public-start", events=[], noise_sd={}, clip=est.clip,
                             split=None, sampler=est.sampler, power=est.power,
                             denoise_threshold=0.0, max_documents=est.max_documents_per_sum,
                             start={"kind": "public", **start.report()},
                             public_start=start.report())
    snap = TopicSnapshot(topic_word=start.topic_word, alpha=start.alpha,
                         eigenvalues=np.zeros(est.n_topics), n_docs=0.0, privacy=privacy,
                         mechanism="public-start", subspace_id=est.subspace_.id,
                         stage="public")
    return est._finish_snapshot(snap, [])


def refine_sums(est, X, budget_fraction: float, users, cfg: RefinementConfig,
                kept: KeptDraws):
    """One refinement pass's draw: (noised sums T, their noise sd, its events, the premise
    check's report)."""
    model = RefinementModel.from_snapshot(est.snapshot_,
                                          fold_in_iter=cfg.fold_in_iter)
    sketch = RefinementSketch(*model.shape)
    single = sp.issparse(X) or isinstance(X, np.ndarray)
    batches = [X] if single else list(X)
    if est.privacy_unit == "user":
        if users is None:
            raise ValueError("privacy_unit='user': pass users= to refine()")
        user_batches = [list(users)] if single else list(users)
        if len(user_batches) != len(batches):
            raise ValueError(f"{len(batches)} batches but {len(user_batches)} user lists")
        su = est._stream_users
        bounder = UserBounder(max_docs_per_epoch=su.max_docs_per_epoch,
                              max_docs=su.max_docs, schedule=su.schedule,
                              max_users=su.max_users)
    elif users is not None:
        raise ValueError("users= is for privacy_unit='user'")
    for i, batch in enumerate(batches):
        if est.privacy_unit == "user":
            batch = as_count_batch(batch)
            w, _ = est._user_weights(bounder, batch, user_batches[i])
            sketch.update(batch, model, weights=w)
        else:
            sketch.update(batch, model)
    if sketch.n_docs == 0 and est.rho_ is None:      # private: noise only, never refused
        raise ValueError("refine() got no non-empty documents")
    events = []
    premise = None
    if est.rho_ is None:
        T, sd = sketch.sums, 0.0
    else:
        rho, premise = premise_check(est, est.stream_rho_ * budget_fraction,
                                     sketch.n_docs, kept, "refine")
        event = plan_refinement(rho, partition=STREAM, max_documents=est.max_documents_per_sum)
        events = [event]
        # the pass's sums, or noise only when its premise check failed
        raw = sketch.sums if premise["passed"] else np.zeros_like(sketch.sums)
        T = kept.draw(lambda: spend(
            est._spender if est._spender is not None else EventLog(), events,
            label=est._draw_label("refine"),
            draw=lambda: est.sampler.add_noise(raw, event.sigma)))
        sd = event.sigma
    return T, sd, events, premise
