"""The sketcher's processing strategy: routing and per-partition sketches.

:class:`SketchStrategy` is what :class:`streamdp.services.processor.StreamProcessor` drives
for one sketcher: the :class:`PartitionState` of every partition of the current assignment,
restored when the partition is assigned and checkpointed before it is revoked. Commits,
checkpoints, restores, holds and dead letters follow the semantics stated once in the module
docstring of :mod:`streamdp.services.processor`. :class:`SketchContext`
(:mod:`streamdp.services.sketch_context`) is what all the partitions share: the vocabulary, the
subspace and clip bounds, the refinement models, the control messages of the release service
and the state store.

What the strategy adds to those semantics
-----------------------------------------
* Stream documents that arrive before the subspace exists hold their partition (seeked
  back to that document) until the release service announces ``subspace_ready``.
* Vocabulary (``vocabulary_mode`` public/private, issue 11): until the deployment's
  vocabulary record exists on the state topic, nothing can be counted. Documents of the
  selection window (private: ``ts < selection_end``, :meth:`Routing.route`) are tokenised
  and their clipped distinct-word sets added to the partition's selection histogram
  (checkpointed like the sketches); the first document routed to the warm-up or the
  stream holds the partition at its offset (same mechanism as above) until
  ``vocabulary_ready``; the sketcher then loads the record (content id checked), drops
  the histogram (the release service consumed it) and goes on as usual.

Time, fencing and control (issue 15; docs/operations.md §Time, §Kafka ACLs)
--------------------------------------------------------------------------
* Routing is :meth:`Routing.route` (one rule): a record or document time beyond
  the service clock + ``max_future_seconds`` is dead-lettered (``future_timestamp``);
  a partition's progress never passes this process's wall clock. Where broker
  time is required (``require_broker_time``, default: unless ``non_production``)
  the documents topic must be LogAppendTime (checked at start-up) and a
  CreateTime record is dead-lettered (``producer_timestamp``).
* Fencing tokens and the commit fence: see the processor module; the strategy restores
  with :func:`select_state` and stamps :func:`fencing_token` (generation, restored token).
* Refinement (DESIGN §8, docs/services.md §Refinement, docs/privacy.md §The refinement
  model rule): with ``refinement`` on, a stream document of epoch e is also folded into
  the model of the snapshot of epoch e − L (:func:`streamdp.refinement.model_epoch_for`,
  L = ``refinement_model_lag``; none while e − L < 1) — never the model that happens to be
  newest when it is read, which depends on poll timing. The models come from the public
  release record (:mod:`streamdp.services.public_release`: the last released epoch and the
  last L snapshots' models, MAC'd) on the state topic, read at start-up, whenever an
  authenticated ``epochs_closed`` arrives and every few seconds while a partition is held;
  it is written after the release state is persisted, and reading it is atomic with the
  confirmation of the released epochs. Sketchers never read a ``release/*`` record (raw
  tree/BLT buffers, ledger head, writer epoch, exact counts): the subspace and the vocabulary
  come from the signed public records ``public/subspace`` and ``public/vocabulary``
  (:mod:`streamdp.services.public_records`). A document whose model is not decided yet (epoch e − L not closed) holds its
  partition at its offset (as for the subspace) until the record says e − L is closed;
  documents of epochs that record already closed are late. The refinement sums are part
  of the PartitionState checkpoint; a document re-read after a crash is folded into the
  same model as in the lost run.
* Control messages from the release service count only with a valid HMAC
  (``control_key_file``), and even then raw sketches are dropped only through
  the epoch the public release record on the state topic confirms as released.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE

from streamdp import messages
from streamdp.documents import MIN_DOC_LENGTH
from streamdp.errors import InvalidRecord, NotReady
from streamdp.privacy import rounding
from streamdp.services.state_auth import StateIntegrityError
from streamdp.services import vocabulary as vocab_mod
from streamdp.services.config import ConfigError
from streamdp.services.partition_state import (PartitionState, check_user, fencing_token,
                                               select_state, state_key)
from streamdp.services.routing import LATE, PRODUCER_TIMESTAMP, SELECTION, RecordTimeRejected
from streamdp.services.sketch_context import SketchContext
from streamdp.whitening.warmup import WarmupSketch

log = logging.getLogger("streamdp.sketcher")

#: how often a sketcher holding partitions re-reads the state topic for the record it waits for
HELD_REFRESH_SECONDS = 5.0


class SketchStrategy:
    """The partitions of this sketcher's current assignment: their :class:`PartitionState`
    (``states``), which have unsaved changes (``dirty``), and the record each held partition
    waits at (``held_for``). Driven by a :class:`StreamProcessor`, updated incrementally at
    each rebalance (the processor module's :class:`ProcessingStrategy`). It never dead-letters
    or holds a partition itself: :meth:`submit` raises what the processor acts on
    (:func:`_outcome`), and the processor's commit fence runs before :meth:`checkpoint`."""

    def __init__(self, ctx: SketchContext, metrics) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.metrics = metrics
        self.topic = ctx.topics.documents
        self.states: dict[int, PartitionState] = {}
        self.dirty: set[int] = set()
        self.held_for: dict[int, tuple[int, float]] = {}   # partition -> (model epoch, record time)
        self.model_holds = 0                # times a partition was held for its refinement model
        self._accepted: dict[int, object] = {}     # newest state record accepted per partition
        self._last_refresh = time.monotonic()
        ctx.strategies.append(self)
        # the compiled message parser and Sum2 step: loaded now, not inside the first batch
        messages.warm_bulk_decoder()
        rounding.warm_compiled()

    # ------------------------------------------------------------ assignment
    def owns(self, p: int) -> bool:
        return p in self.states

    def partitions(self) -> list[int]:
        return list(self.states)

    def restore(self, assigned: dict[int, int | None]) -> dict[int, int]:
        """The newest state of each newly assigned partition that this process may accept
        (:func:`select_state`), stamped with the fencing token of its assignment; returns
        where each partition starts (its ``next_offset``, or the beginning)."""
        ctx = self.ctx
        found = ctx.store.read_all_latest(prefix=f"sketch/{self.topic}/")
        starts = {}
        for p, generation in assigned.items():
            key = state_key(self.topic, p)
            newest = found.get(key)
            if newest is not None and not ctx.state_auth.authentic(key, newest.payload, newest.meta):
                # restoring it would re-sign it at the next checkpoint: fail closed, loudly
                raise StateIntegrityError(
                    f"partition {p}: the newest state record {key!r} has no valid MAC under this "
                    "deployment's control key: it was written without the key (a foreign writer "
                    "on the state topic) or under another key. Check control_key_file against "
                    "the release service's; do not restart the sketchers until the state topic "
                    "is trusted again (docs/privacy.md §Trust boundary)")
            rec, rejected = select_state(self._accepted.get(p), newest)
            if rejected:
                log.warning("%s: partition %d: the newest state record goes backwards (fence/next_offset "
                            "%s/%s < accepted %s/%s): a zombie wrote it; restoring the accepted one",
                            ctx.instance, p, found[key].meta.get("fence"), found[key].meta["next_offset"],
                            rec.meta.get("fence"), rec.meta["next_offset"])
            if rec is not None:
                st = PartitionState.from_bytes(rec.payload, ctx.subspace)
                self._accepted[p] = rec
                starts[p] = st.next_offset
            else:
                st = PartitionState(self.topic, p)
                starts[p] = OFFSET_BEGINNING
            st.fence = fencing_token(generation, st.fence)
            try:        # the configured dedup window, before the close drops ids out of it
                self._counted_ids(st)
            except ValueError as exc:
                raise ConfigError(f"partition {p}: {exc}") from None
            st.forget_closed(ctx.closed_through, ctx.warmup_closed)
            if ctx.user_partitions is not None:       # user mode: the partition's bounders
                try:
                    st.bind_users(self.cfg.user_bounder, warmup_open=not ctx.warmup_closed)
                except ValueError as exc:
                    raise ConfigError(f"partition {p}: {exc}") from None
            if ctx.vocabulary is not None and self.cfg.vocabulary_mode != "file":
                st.forget_selection()         # the published vocabulary consumed it
            self.states[p] = st
        return starts

    def revoke(self, partitions: list[int]) -> None:
        """Checkpoint, then forget (arroyo's close + join for these partitions). A partition
        is given up even if its checkpoint fails: the new owner restores the last one."""
        try:
            for p in partitions:
                if p in self.states:
                    self.checkpoint(p)
                    self.forget(p)
        finally:
            for p in partitions:
                self.forget(p)

    def lost(self, partitions: list[int]) -> None:
        for p in partitions:
            self.forget(p)

    def forget(self, p: int) -> None:
        self.states.pop(p, None)
        self.dirty.discard(p)
        self.held_for.pop(p, None)

    # ------------------------------------------------------------ holds
    def _not_ready(self, p: int, offset: int, need: str) -> NotReady:
        """Partition ``p`` waits at ``offset`` until ``need`` (the vocabulary, the subspace,
        or the refinement model of ``held_for[p]``) is published."""
        what = need if need != "model" else f"model of epoch {self.held_for[p][0]}"
        return NotReady(p, offset, need, what)

    def ready(self, p: int, need: str) -> bool:
        ctx = self.ctx
        return ((need == "vocabulary" and ctx.vocabulary is not None)
                or (need == "subspace" and ctx.subspace is not None)
                or (need == "model" and self._model_decided(p)))

    def resumed(self, partitions: list[int]) -> None:
        for p in partitions:
            self.held_for.pop(p, None)

    def poll(self, holds: dict[int, str]) -> None:
        """Control messages; while partitions are held, look again now and then for the
        release record they wait for, in case its announcement was read before the record
        was visible (or was never seen)."""
        ctx = self.ctx
        ctx.poll_control()
        if holds and time.monotonic() - self._last_refresh >= HELD_REFRESH_SECONDS:
            self._last_refresh = time.monotonic()
            needs = set(holds.values())
            if "vocabulary" in needs and ctx.vocabulary is None:
                ctx.refresh_vocabulary()
            if "subspace" in needs and ctx.subspace is None:
                ctx.refresh_subspace()
            if "model" in needs:
                ctx.refresh_model()
            self._advance_held_progress()

    def _model_decided(self, p: int) -> bool:
        m = self.held_for.get(p, (None,))[0]
        return m is None or m <= self.ctx.models.closed_through

    def _advance_held_progress(self) -> None:
        """A partition held at a record: its progress is that record's time, capped by the
        clock (Routing.advance_progress) — advanced again as the clock passes it, so the
        release service can close the epoch the partition waits for."""
        now = time.time()
        for p, (_, rt) in self.held_for.items():
            st = self.states.get(p)
            if st is not None:
                progress = self.ctx.routing.advance_progress(st.progress, [rt], now)
                if progress != st.progress:
                    st.progress = progress
                    self.dirty.add(p)

    # ------------------------------------------------------------ checkpoints
    def unsaved(self, p: int) -> int | None:
        """The next offset of partition ``p`` if it has unsaved changes (what the processor's
        commit fence commits before :meth:`checkpoint`), else None."""
        st = self.states.get(p)
        return None if st is None or p not in self.dirty else st.next_offset

    def checkpoint(self, p: int) -> None:
        """Write partition ``p``'s state (if changed). The processor calls it after its commit
        fence (dead letters flushed, offset committed); a fenced partition is forgotten
        (:meth:`lost`) instead."""
        st = self.states.get(p)
        if st is None or p not in self.dirty:
            return
        payload = st.to_bytes()
        meta = self.ctx.state_auth.sign(st.key, payload, st.meta())
        self.ctx.store.write(st.key, payload, meta=meta)
        self._accepted[p] = _Accepted(meta, payload)
        self.dirty.discard(p)
        self.metrics.checkpointed(len(payload))

    # ------------------------------------------------------------ the shared context, read here
    # (names as in the process code below: what the deployment shares, not per partition)
    routing = property(lambda self: self.ctx.routing)
    tokenizer = property(lambda self: self.ctx.tokenizer)
    broker_time = property(lambda self: self.ctx.broker_time)
    candidates = property(lambda self: self.ctx.candidates)
    models = property(lambda self: self.ctx.models)
    vocabulary = property(lambda self: self.ctx.vocabulary)
    d = property(lambda self: self.ctx.d)
    k_prime = property(lambda self: self.ctx.k_prime)
    subspace = property(lambda self: self.ctx.subspace)
    clip = property(lambda self: self.ctx.clip)
    user_partitions = property(lambda self: self.ctx.user_partitions)

    # ------------------------------------------------------------ processing
    def submit(self, p: int, batch: list) -> None:
        if self.ctx.vocabulary is None:
            self.process_before_vocabulary(p, batch)
        else:
            self.process(p, batch)

    @staticmethod
    def _producer_time_error() -> RecordTimeRejected:
        return RecordTimeRejected(
            PRODUCER_TIMESTAMP, "record time set by the producer (CreateTime), but this "
            "deployment routes by broker time only: the documents topic must have "
            "message.timestamp.type=LogAppendTime (docs/operations.md §Time)")

    def _decode_record(self, m, kind: int, rt: float | None, now: float):
        """The one check of a record before it is routed: broker time when required, a
        decodable document within the limits, not in the future. Returns (document, record
        time) or raises :class:`messages.InvalidMessage` (dead-lettered by the caller)."""
        if self.broker_time and kind != TIMESTAMP_LOG_APPEND_TIME:
            raise self._producer_time_error()
        value = m.value()
        if value is None:
            raise messages.InvalidMessage(messages.MALFORMED_MSGPACK, "null record value")
        doc = messages.decode_document(value, max_bytes=self.cfg.max_document_bytes,
                                       max_tokens=self.cfg.max_document_tokens)
        t_rec = doc.ts if rt is None else rt
        if self.routing.is_future(doc.ts, t_rec, now):     # == route(...) == FUTURE
            raise self.routing.future_error(doc.ts, t_rec, now)
        return doc, t_rec

    def process(self, p: int, batch: list) -> None:
        """Validate the whole batch, then update the partition's sketches once.

        Decoding and validation run in bulk over the batch (:class:`messages.DocumentBatch`,
        same results as :meth:`_decode_record` per record): the checks in the order of
        :meth:`_decode_record` — broker time, a decodable document, not in the future —
        then the vocabulary checks of the count batch. A bad record gets its own error and
        is dead-lettered; it never changes the other rows."""
        t0 = time.perf_counter()
        st = self.states[p]
        now = time.time()                  # the service clock, read once per batch
        # every message's (timestamp type, ms) read once; record time = ms / 1000 (nan if none),
        # the same float64 division as per record (ms < 2⁵³: exact conversion)
        stamps = np.array([m.timestamp() for m in batch], dtype=np.int64).reshape(len(batch), 2)
        kinds = stamps[:, 0]
        batch_rt = np.where(kinds == TIMESTAMP_NOT_AVAILABLE, math.nan, stamps[:, 1] / 1000.0)
        rejected: dict[int, messages.InvalidMessage] = {}
        if self.broker_time:
            for i in np.flatnonzero(kinds != TIMESTAMP_LOG_APPEND_TIME).tolist():
                rejected[i] = self._producer_time_error()
        values = [m.value() for m in batch]
        if None in values:
            for i, value in enumerate(values):
                if value is None and i not in rejected:
                    rejected[i] = messages.InvalidMessage(messages.MALFORMED_MSGPACK, "null record value")
        db = messages.DocumentBatch(values, self.vocabulary, max_bytes=self.cfg.max_document_bytes,
                                    max_tokens=self.cfg.max_document_tokens, rejected=rejected)
        # record time = broker time, or the document's ts where the record has none
        t_recs = np.where(np.isnan(batch_rt), db.ts, batch_rt)
        valid = db.valid
        if valid.size:
            ts_v, rt_v = db.ts[valid], t_recs[valid]
            # == routing.is_future per record (the same three float64 comparisons)
            mf = self.routing.max_future_seconds
            fut = (ts_v > now + mf) | (rt_v > now + mf) | (ts_v > rt_v + mf)
            for i in valid[fut].tolist():
                db.reject(i, self.routing.future_error(float(db.ts[i]), float(t_recs[i]), now))
        if self.user_partitions is not None:    # user mode: a user id, on its user's partition
            for i in db.valid.tolist():
                exc = check_user(db.user(i), p, self.user_partitions)
                if exc is not None:
                    db.reject(i, exc)
        cb = db.to_counts(self.tokenizer)
        bad = [(batch[i], exc) for i, exc in cb.errors]
        rt_good = t_recs[cb.index]
        routes = self.routing.route(cb.timestamps, rt_good, now) if cb.n_docs else np.zeros(0, np.int64)
        own_routes = routes           # by each document's own times: what user numbering follows
        routes = np.where(routes == SELECTION, LATE, routes)   # the vocabulary exists: window closed
        if self.models is not None:          # epochs the release state confirms closed: late
            routes = np.where((routes > 0) & (routes <= self.models.closed_through), LATE, routes)
        # deduplication by document id (streamdp.services.dedup: the one rule), last of the checks:
        # each document's own epoch (its ts, the public schedule); the counted ones add their ids
        epochs = self.routing.clock.epochs(cb.timestamps) if cb.n_docs else np.zeros(0, np.int64)
        counted = st.final_routes(routes, self.subspace is not None) >= 0
        rows, id_hashes, dups = self._without_duplicates(st, batch, cb, db, epochs, counted)
        if dups:
            cb = _count_rows(cb, rows)
            routes, own_routes, rt_good, counted, epochs = (
                routes[rows], own_routes[rows], rt_good[rows], counted[rows], epochs[rows])
        bad = sorted(bad + dups, key=lambda me: me[0].offset())

        # Stop at the first stream document that cannot be sketched yet: before the subspace,
        # any; with refinement, one whose model (the snapshot of its epoch − L) is not decided.
        blocked, need = np.zeros(routes.shape, bool), "subspace"
        if self.subspace is None:
            blocked = routes > 0
        elif self.models is not None:
            undecided = [e for e in np.unique(routes[routes > st.closed_through])
                         if not self.models.decided(int(e))]
            blocked, need = np.isin(routes, undecided), "model"
        cut_offset = None
        if np.any(blocked):
            first = int(np.flatnonzero(blocked)[0])
            blocker = batch[cb.index[first]]
            cut_offset = blocker.offset()
            keep = np.flatnonzero([batch[j].offset() < cut_offset for j in cb.index])
            X, routes_k = cb.counts[keep], routes[keep]
            bad = [(m, e) for m, e in bad if m.offset() < cut_offset]
            last_offset = cut_offset - 1
            processed = [m for m in batch if m.offset() < cut_offset]
            blocker_rt = rt_good[first]
        else:
            keep = np.arange(cb.n_docs)
            X, routes_k = cb.counts, routes
            last_offset = batch[-1].offset()
            processed = batch
            blocker_rt = None

        # --- everything validated: now the one state update
        def new_warmup():
            return WarmupSketch(self.d, self.k_prime, clip=self.cfg.warmup_clip, seed=self.cfg.seed)

        user_kw = {} if self.user_partitions is None else {
            "users": [db.user(int(i)) for i in cb.index[keep]], "user_routes": own_routes[keep]}
        # user mode: users past the first max_users are not admitted (weight 0, counted on
        # operator metrics); nothing here holds or stops on a user count (issue 23)
        counts = st.add(X, routes_k, self.subspace, self.clip, new_warmup, models=self.models,
                        refine_in_background=self.cfg.refinement_thread, **user_kw)
        remember = keep[counted[keep]]
        st.seen_ids.add(id_hashes[remember], epochs[remember])
        st.counters["dlq"] += len(bad)
        n_dup = sum(exc.error_class == messages.DUPLICATE_ID for _, exc in bad)
        if n_dup:
            st.counters["duplicates"] = st.counters.get("duplicates", 0) + n_dup
            self.metrics.skipped(messages.DUPLICATE_ID, n_dup)
        n_tok = int(cb.n_tokens[keep].sum()) if keep.size else 0
        n_unk = int(cb.n_unknown[keep].sum()) if keep.size else 0
        st.counters["tokens"] += n_tok
        st.counters["unknown_tokens"] += n_unk
        lengths = np.asarray(X.sum(axis=1)).ravel() if X.shape[0] else np.zeros(0)
        n_short = int(np.sum((lengths < MIN_DOC_LENGTH) & (routes_k != LATE)))
        st.counters["empty"] += n_short
        if processed:
            st.next_offset = last_offset + 1
            # processed = a prefix of the batch; progress never passes the service clock
            st.progress = self.routing.advance_progress(st.progress, batch_rt[:len(processed)], now)
        hold = None
        if cut_offset is not None:
            st.progress = self.routing.advance_progress(st.progress, [blocker_rt], now)
            if need == "model":
                self.held_for[p] = (self.models.model_epoch(int(routes[first])), float(blocker_rt))
                self.model_holds += 1
            hold = self._not_ready(p, cut_offset, need)
        st.expire_user_epochs(self.routing)      # user mode: per-epoch counts of passed epochs
        self.dirty.add(p)
        # documents_total counts documents that entered a sketch; too-short and late
        # ones are counted under skipped_total{reason} instead (docs/metrics.md)
        self.metrics.observe_batch(counts["stream"] + counts["warmup"] - counts["short"]
                                   - counts["not_admitted"], n_tok, n_unk,
                                   time.perf_counter() - t0, partition=p)
        if counts["not_admitted"]:
            self.metrics.skipped("user_not_admitted", counts["not_admitted"])
        if self.user_partitions is not None:
            self.metrics.set_tracked_users(p, st.users_tracked())
        self.metrics.set_dedup_ids(p, len(st.seen_ids))
        if counts["short"]:
            self.metrics.skipped("too_short", counts["short"])
        if counts["late"]:
            self.metrics.skipped("late", counts["late"])
        _outcome(p, bad, hold)

    def _dedup_keys(self, ids, users) -> list[str]:
        """What is deduplicated: the document id; under ``privacy_unit: user`` the pair (user,
        id), so one user's records never decide whether another user's document counts."""
        if self.user_partitions is None:
            return list(ids)
        return [f"{u}\x00{i}" for u, i in zip(users, ids)]

    def _counted_ids(self, st: PartitionState):
        """The partition's counted ids under the configured window (a state restored from a
        version-1 checkpoint is migrated; streamdp.services.dedup.CountedIds.bound_to)."""
        st.seen_ids = st.seen_ids.bound_to(self.cfg.dedup_window_epochs)
        return st.seen_ids

    def _duplicate_error(self, m) -> messages.InvalidMessage:
        n = self.cfg.dedup_window_epochs
        within = ("for the life of the deployment" if n is None
                  else f"within {n} epoch(s) of the counted copy, dedup_window_epochs")
        return messages.InvalidMessage.duplicate(
            f"a document with this id was already counted from partition {m.partition()} "
            f"(ids are deduplicated per partition {within}; docs/privacy.md \"The unit is a "
            "document id\")")

    def _without_duplicates(self, st: PartitionState, batch: list, cb: messages.CountBatch, db,
                            epochs: np.ndarray, counted: np.ndarray):
        """(the rows of the batch that are not duplicates, the id hashes of those rows, the
        duplicates as (message, error)). A row is a duplicate when its id's keyed hash was
        counted before within the window of its epoch, or equals an earlier counted row's
        (streamdp.services.dedup; ``counted``: the rows that would be counted)."""
        users = None if self.user_partitions is None else [db.user(int(i)) for i in cb.index]
        h = self.ctx.id_hasher.hashes(self._dedup_keys(cb.doc_ids, users))
        dup = (self._counted_ids(st).duplicates(h, epochs, counted) if h.size
               else np.zeros(0, dtype=bool))
        if not dup.any():
            return np.arange(h.size), h, []
        out = [(batch[int(cb.index[r])], self._duplicate_error(batch[int(cb.index[r])]))
               for r in np.flatnonzero(dup).tolist()]
        keep = np.flatnonzero(~dup)
        return keep, h[keep], out

    def process_before_vocabulary(self, p: int, batch: list) -> None:
        """Before the deployment's vocabulary exists (vocabulary_mode public/private):
        selection-window documents go to the partition's selection histogram, late ones are
        counted, bad ones dead-lettered; the first document that needs the vocabulary
        (warm-up or stream) pauses the partition at its offset. Validated first, then one
        state update, as :meth:`process`."""
        t0 = time.perf_counter()
        st = self.states[p]
        now = time.time()
        token_lists, bad, rts = [], [], []
        new_ids: dict[int, None] = {}           # id hashes of the documents counted here, in order
        n_late = n_tok = 0
        cut = None                              # (offset, record time) of the first blocked doc
        for m in batch:
            kind, rt = _record_time(m)
            try:
                doc, t_rec = self._decode_record(m, kind, rt, now)
                route = int(self.routing.route([doc.ts], [t_rec], now)[0])
                if route >= 0:                  # warm-up or stream: needs the vocabulary
                    cut = (m.offset(), t_rec)
                    break
                h = self.ctx.id_hasher.hashes(self._dedup_keys([doc.id], [doc.user]))
                e = self.routing.clock.epoch_of(doc.ts)
                # the counted ones (selection) all have epoch 0: one of this batch is within any
                # window of a selection document, and of a late one of epoch < N
                near = self.cfg.dedup_window_epochs is None or e < self.cfg.dedup_window_epochs
                if (near and int(h[0]) in new_ids) or self._counted_ids(st).duplicates(h, [e])[0]:
                    raise self._duplicate_error(m)
                toks = None
                if route == SELECTION:          # counted (a late one is checked, never kept)
                    toks = self._selection_tokens(doc)
            except messages.InvalidMessage as exc:
                bad.append((m, exc))
                rts.append(math.nan if rt is None else rt)
                continue
            rts.append(math.nan if rt is None else rt)
            if route == SELECTION:
                new_ids[int(h[0])] = None
                token_lists.append(toks)
                n_tok += len(toks)
            else:
                n_late += 1
        # --- everything validated: now the one state update
        # the selection window's documents: epoch 0 (before stream_start, like the warm-up)
        st.seen_ids.add(list(new_ids), np.zeros(len(new_ids), np.int64))
        if token_lists:
            st.add_selection(token_lists, lambda: vocab_mod.SelectionHistogram.for_config(
                self.cfg, self.candidates), self.candidates)
        st.counters["dlq"] += len(bad)
        n_dup = sum(exc.error_class == messages.DUPLICATE_ID for _, exc in bad)
        if n_dup:
            st.counters["duplicates"] = st.counters.get("duplicates", 0) + n_dup
            self.metrics.skipped(messages.DUPLICATE_ID, n_dup)
        st.counters["late"] += n_late
        st.counters["tokens"] += n_tok
        if rts:
            st.next_offset = batch[len(rts) - 1].offset() + 1
            st.progress = self.routing.advance_progress(st.progress, rts, now)
        hold = None
        if cut is not None:
            st.progress = self.routing.advance_progress(st.progress, [cut[1]], now)
            hold = self._not_ready(p, cut[0], "vocabulary")
        self.dirty.add(p)
        self.metrics.observe_batch(len(token_lists), n_tok, 0, time.perf_counter() - t0, partition=p)
        if n_late:
            self.metrics.skipped("late", n_late)
        _outcome(p, bad, hold)

    def _selection_tokens(self, doc) -> list[str]:
        """The tokens of a selection-window document; a ``counts`` document (ids over a
        vocabulary that does not exist yet) cannot be used and is dead-lettered."""
        if self.candidates is None:         # public mode has no selection window
            raise RuntimeError("a selection-window document without a private selection")
        if doc.kind == "text":
            toks = self.tokenizer.tokenize(doc.payload)
            if len(toks) > self.cfg.max_document_tokens:
                raise messages.InvalidMessage(messages.TOO_LARGE, f"text has {len(toks)} tokens, "
                                              f"the limit is {self.cfg.max_document_tokens}")
            return list(toks)
        if doc.kind == "tokens":
            return list(doc.payload)
        raise messages.InvalidMessage(
            "invalid_value", "a counts document in the vocabulary-selection window (ts < "
            "selection_end): its ids refer to a vocabulary, and the deployment's vocabulary is "
            "selected from these documents; send text or tokens before selection_end")


class _Accepted:
    """A state record this process wrote itself (as the store would return it)."""

    def __init__(self, meta: dict, payload: bytes) -> None:
        self.meta, self.payload = dict(meta), payload


def _outcome(p: int, bad: list, hold: NotReady | None) -> None:
    """The end of a processed batch: its invalid records (to be dead-lettered) and the hold, if
    any, raised together (after the state update) for the processor to act on."""
    raised = [InvalidRecord(m, exc) for m, exc in bad] + ([hold] if hold is not None else [])
    if raised:
        raise ExceptionGroup(f"partition {p}: {len(bad)} invalid record(s)"
                             + (f", {hold}" if hold is not None else ""), raised)


def _record_time(m) -> tuple[int, float | None]:
    kind, ms = m.timestamp()
    return kind, (None if kind == TIMESTAMP_NOT_AVAILABLE else ms / 1000.0)


def _count_rows(cb: messages.CountBatch, rows: np.ndarray) -> messages.CountBatch:
    """The rows ``rows`` of a count batch (its errors kept)."""
    return messages.CountBatch(
        counts=cb.counts[rows], timestamps=cb.timestamps[rows],
        doc_ids=tuple(cb.doc_ids[i] for i in rows.tolist()), index=cb.index[rows],
        n_tokens=cb.n_tokens[rows], n_unknown=cb.n_unknown[rows], errors=cb.errors)
