"""The release service's warm-up flow: the subspace, the clip bounds and the start.

Once the warm-up is closable (the closing policy, epoch 0): merge the partitions' warm-up
sketches, then the spend protocol — the premise count ñ is drawn and persisted first (kept:
a retry reuses it, never draws again), then the clip histogram and the range are drawn and
the draw persisted (:data:`~streamdp.services.control.WARMUP_DRAW_KEY`) before any
post-processing (issue 23 item 4). The post-processing (quantiles, orthonormal basis) is a
function of the persisted noised values, repeated after a failure; the start is chosen once
(:func:`~streamdp.services.release_start.choose_start`) and persisted with the subspace, then
the public release record, ``subspace_ready`` and ``epochs_closed through=0`` follow.

The flow is the code of this phase; the state it reads and sets (``warmup_draw``,
``warmup_premise_kept``, ``subspace``, ``clip``, ``start_choice``, ``fold_models``,
``exhausted``) stays on the :class:`~streamdp.services.release.ReleaseService` it is given.
"""
from __future__ import annotations

import logging
import time

from streamdp import serialization as ser
from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.accountant import BudgetExhausted
from streamdp.privacy.rounding import DocumentCountExceeded
from streamdp.privacy.spend import recommit_kept
from streamdp.services import control, release_start
from streamdp.services.partition_state import PartitionState
from streamdp.services.release_announce import ENDED_OTHER
from streamdp.services.release_merge import merge_warmups
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import PREMISE_LABEL, WarmupDraw, WarmupSketch, premise_decision

log = logging.getLogger("streamdp.release")


class WarmupFlow:
    """The warm-up close, its persisted draw's post-processing and the subspace's publication,
    over the release service ``svc``."""

    def __init__(self, svc) -> None:
        self.svc = svc

    def release(self, parts: list[PartitionState]) -> None:
        svc = self.svc
        refused: dict[int, str] = {}
        merged = merge_warmups(parts, refused=refused, warmup_clip=svc.cfg.warmup_clip,
                               max_documents=svc.cfg.max_documents_per_sum)
        svc._refused_states(refused, "the warm-up")
        if merged is None and svc.cfg.private:
            # an empty warm-up is released on schedule from noise, like any warm-up: whether
            # releases go on must not reveal that the exact count is 0 (issue 23 item 2)
            log.warning("the warm-up closed with no usable documents (length >= 3): its subspace "
                        "and clip bounds are noise only; produce warm-up documents with ts < "
                        "stream_start")
            merged = WarmupSketch(svc.d, svc.k_prime, clip=svc.cfg.warmup_clip, seed=svc.cfg.seed)
        if merged is None:          # non-private (no guarantee to keep): cannot whiten nothing
            log.error("the warm-up closed with no usable documents (length >= 3): cannot whiten; "
                      "produce warm-up documents with ts < stream_start")
            svc.exhausted = "no warm-up documents"
            svc._releases_ended(ENDED_OTHER, svc.exhausted)
            return
        t0 = time.perf_counter()
        if not svc.cfg.private:    # no noise: nothing to keep between draw and post-processing
            self.publish_subspace(ClipBounds.unclipped(), merged.subspace(None), merged.n_docs, t0)
            return
        try:                        # spend protocol: reserve (keyed) → draw, here ...
            plan = svc.plan
            # the rounding premise N_max: a noised, charged count decides, from ñ alone, whether
            # the warm-up is drawn from its sums or from noise only — never a refusal
            noisy = svc.warmup_premise_kept
            if noisy is None:
                noisy = merged.draw_premise_count(plan.premise, svc.sampler, svc.spend,
                                                  partition=plan.premise_partition)
                svc.warmup_premise_kept = noisy
                # persisted (and committed) before it decides anything: a crash or an
                # exception after this point never draws ñ again (kept_draws rule)
                meta = {"vocabulary_id": svc.vocabulary.id, "writer_epoch": svc.writer_epoch}
                if svc.accountant is not None:
                    meta["ledger"] = svc.accountant.head()
                if not svc._persist(control.WARMUP_PREMISE_KEY,
                                    ser.dumps({"noisy_count": float(noisy)}), meta):
                    return
            else:
                recommit_kept(svc.spend, [plan.premise.event(plan.premise_partition)],
                              label=PREMISE_LABEL)
            drawn, premise = premise_decision(merged, plan.premise, noisy,
                                              svc.cfg.max_documents_per_sum)
            if not premise["passed"]:
                log.warning("the warm-up's premise check failed (ñ = %.6g > N_max − z·σ_p = %.6g): "
                            "its subspace and clip bounds are noise only; raise "
                            "max_documents_per_sum (docs/privacy.md 'The premise check')",
                            noisy, premise["threshold"])
            hist, hist_events = drawn.draw_histogram(plan.clip_rho, svc.sampler, svc.spend,
                                                     **plan.where)
            Y, events = drawn.draw_range(plan.subspace_rho, svc.sampler, svc.spend,
                                         max_documents=svc.cfg.max_documents_per_sum,
                                         premise_checked=True, **plan.where)
        except (BudgetExhausted, DocumentCountExceeded) as exc:
            svc._refused(exc)
            return
        draw = WarmupDraw(hist, hist_events, Y, events, omega_seed=merged.seed, clip=merged.clip,
                          n_docs=merged.n_docs, premise_check=premise)
        # ... → persist the noised values → commit, before any post-processing (issue 23
        # item 4): a failure or a crash in the orthonormalisation or later post-processes
        # this persisted draw again (release_draw, at the next step or start)
        meta = {"vocabulary_id": svc.vocabulary.id, "writer_epoch": svc.writer_epoch}
        if svc.accountant is not None:
            meta["ledger"] = svc.accountant.head()
        if not svc._persist(control.WARMUP_DRAW_KEY, draw.to_bytes(), meta):
            return
        svc.warmup_premise_kept = None
        svc.warmup_draw = draw
        self.release_draw(t0)

    def release_draw(self, t0: float | None = None) -> None:
        """Post-process the persisted warm-up draw (quantiles, orthonormal basis) and publish
        the subspace. A function of noised values only: safe to repeat after a failure."""
        svc = self.svc
        draw = svc.warmup_draw
        clip, sub = draw.post_process(svc.cfg.clip_quantile)
        if self.publish_subspace(clip, sub, draw.n_docs, t0, warmup_draw=draw):
            svc.warmup_draw = None

    def publish_subspace(self, clip: ClipBounds, sub: Subspace, n_docs: int,
                         t0: float | None, warmup_draw=None) -> bool:
        svc = self.svc
        t0 = time.perf_counter() if t0 is None else t0
        # the start is chosen once, here, and persisted in the same write as the subspace
        choice = release_start.choose_start(
            svc.cfg, svc.public_start, svc.refinement,
            None if warmup_draw is None else warmup_draw.hist, svc.plan.stream_rho, svc.k_prime,
            *(() if warmup_draw is None or not warmup_draw.events
              else (warmup_draw.Y, warmup_draw.events[0].sigma)))
        meta = {"clip": clip.to_dict(), "subspace_id": sub.id, "vocabulary_id": svc.vocabulary.id,
                "warmup_documents": int(n_docs), "writer_epoch": svc.writer_epoch,
                **release_start.subspace_meta(choice)}
        if svc.accountant is not None:
            meta["ledger"] = svc.accountant.head()
        if not svc._persist(control.SUBSPACE_KEY, sub.to_bytes(), meta):   # ... → persist → commit
            return False
        svc.start_choice = choice
        svc.refinement = release_start.node_refinement(svc.cfg, choice)
        svc.subspace, svc.clip = sub, clip
        svc.epoch_flow.new_continual()
        if svc.refinement is not None:
            svc.fold_models = release_start.fold_in_models(
                svc.refinement, svc.public_start, svc.public_start_chosen)
        log.info("start: %s (%s)", choice["start"], choice.get("rule"))
        svc._write_public()                 # epoch 0: the warm-up is released (and the start)
        svc.announcer.subspace_ready(sub.id)
        svc.announcer.epochs_closed(0)
        log.info("warm-up closed: %d documents, subspace %s (k'=%d) in %.1f s", n_docs,
                 sub.id, sub.dim, time.perf_counter() - t0)
        if svc.accountant is not None:
            svc.metrics.set_budget_from_report(svc.accountant.report())
        return True
