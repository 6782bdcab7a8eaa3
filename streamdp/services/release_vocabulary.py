"""The release service's vocabulary flow (issue 11; docs/services.md §Vocabulary).

``public``: the wordfreq list, built at the first start and persisted as the vocabulary record
(no budget; :meth:`VocabularyFlow.restore`). ``private``: once the selection window closes
(``ts < selection_end``, the closing policy), merge the partitions' selection histograms and
select through the spend protocol — reserve → draw → persist the vocabulary record → commit —
then announce ``vocabulary_ready`` (:meth:`VocabularyFlow.release`). A failed selection is the
release of its draw: persisted and committed like a vocabulary, so no restart draws again.

The flow is the code of this phase; the state it reads and sets (``vocabulary``,
``vocabulary_meta``, ``exhausted``) stays on the :class:`~streamdp.services.release.ReleaseService`
it is given, whose steps (persist, announce, end of releases) it calls in this order.
"""
from __future__ import annotations

import logging
import time

from streamdp.privacy.accountant import BudgetExhausted
from streamdp.services import control
from streamdp.services import vocabulary as vocab_mod
from streamdp.services.config import ConfigError
from streamdp.services.partition_state import PartitionState
from streamdp.services.release_announce import ENDED_OTHER

log = logging.getLogger("streamdp.release")


class VocabularyFlow:
    """The vocabulary's restore and its private selection, over the release service ``svc``."""

    def __init__(self, svc) -> None:
        self.svc = svc

    def restore(self) -> None:
        """public/private: the deployment's vocabulary record (public: built and persisted
        at the first start). A failed selection stops the service with its message."""
        svc = self.svc
        if svc.cfg.vocabulary_mode == "file" or svc.vocabulary is not None:
            return
        try:
            got = vocab_mod.load_record(svc.store)
        except vocab_mod.SelectionTooSmall as exc:
            svc.exhausted = str(exc)
            log.error("%s", exc)
            svc._releases_ended(ENDED_OTHER, svc.exhausted)
            return
        except vocab_mod.VocabularyError as exc:
            raise ConfigError(str(exc)) from None
        if got is None and svc.cfg.vocabulary_mode == "public":
            try:
                vocab, meta = vocab_mod.public_vocabulary(svc.cfg)
            except vocab_mod.VocabularyError as exc:
                raise ConfigError(str(exc)) from None
            meta = {**meta, "writer_epoch": svc.writer_epoch}
            if not svc._persist(control.VOCABULARY_KEY, vocab.canonical_bytes(), meta):
                return
            log.info("public vocabulary %s: %d wordfreq words (%s %s), no budget", vocab.id,
                     len(vocab), meta.get("source"), meta.get("source_version"))
            got = vocab, meta
        if got is not None:
            svc._set_vocabulary(got[0])
            svc.vocabulary_meta = {k: v for k, v in got[1].items()
                                   if k not in ("ledger", "writer_epoch")}
            svc._write_vocabulary_file()

    def release(self, parts: list[PartitionState]) -> None:
        """Close the selection window: merge the partitions' histograms, select (spend
        protocol: reserve → draw → persist the vocabulary record → commit), announce."""
        svc = self.svc
        try:
            merged = vocab_mod.merge_histograms((p.selection for p in parts), svc.candidates)
        except vocab_mod.VocabularyError as exc:
            svc.exhausted = str(exc)
            log.error("vocabulary selection refused: %s", exc)
            svc._releases_ended(ENDED_OTHER, svc.exhausted)
            return
        n_docs = 0 if merged is None else merged.n_docs
        if n_docs == 0 and svc.cfg.private:
            # an empty window is selected on schedule from noise, like any window (issue 23
            # item 2): whether releases go on is then decided by the noised, charged selection
            # (SelectionTooSmall below), never by the exact count 0
            log.warning("the vocabulary-selection window closed with no usable documents (ts < "
                        "selection_end=%r): selecting from noise only", svc.cfg.selection_end)
            merged = vocab_mod.SelectionHistogram.for_config(svc.cfg, svc.candidates).histogram(
                svc.candidates)
        elif n_docs == 0:           # non-private (no guarantee to keep)
            svc.exhausted = (
                f"the vocabulary-selection window closed with no usable documents (0 documents "
                f"with ts < selection_end={svc.cfg.selection_end!r} across {len(parts)} "
                "partition state(s)): nothing to select from. Fix: produce text/tokens documents "
                "with ts < selection_end (and record time before it), move selection_end later, "
                "or use vocabulary_mode: public. Nothing was spent.")
            log.error("%s", svc.exhausted)
            svc._releases_ended(ENDED_OTHER, svc.exhausted)
            return
        t0 = time.perf_counter()
        failure = None
        try:        # its own atom, with its whole budget (parallel composition)
            sel = vocab_mod.select(svc.cfg, merged, accountant=svc.accountant,
                                   sampler=svc.sampler, spender=svc.spend)   # reserve → draw
        except BudgetExhausted as exc:
            svc._refused(exc)
            return
        except vocab_mod.SelectionTooSmall as exc:
            sel, failure = None, str(exc)
        meta = {"mode": "private", "selection_end": svc.cfg.selection_end,
                "selection_documents": int(n_docs), "writer_epoch": svc.writer_epoch}
        if svc.accountant is not None:
            meta["ledger"] = svc.accountant.head()
        if failure is not None:
            # the failure is the release of this draw: persisted and committed like a
            # vocabulary, so no restart draws again on the same documents for free
            meta.update(status=vocab_mod.FAILED, error=failure)
            if svc._persist(control.VOCABULARY_KEY, b"", meta):
                svc.exhausted = failure
                log.error("%s", failure)
                svc._releases_ended(ENDED_OTHER, failure)
            return
        meta.update({k: v for k, v in sel.meta.items() if k != "events"},
                    events=sel.meta.get("events", []))
        if not svc._persist(control.VOCABULARY_KEY, sel.vocabulary.canonical_bytes(), meta):
            return                                                 # ... → persist → commit
        svc._set_vocabulary(sel.vocabulary)
        svc.vocabulary_meta = {k: v for k, v in meta.items() if k not in ("ledger", "writer_epoch")}
        svc._write_vocabulary_file()
        svc.announcer.vocabulary_ready(sel.vocabulary.id)
        log.info("vocabulary selected: %d words (id %s), %s of them above the noise, from the "
                 "selection window in %.1f s", len(sel.vocabulary), sel.vocabulary.id,
                 sel.meta.get("n_candidates_above_cut"), time.perf_counter() - t0)
        if svc.accountant is not None:
            svc.metrics.set_budget_from_report(svc.accountant.report())
