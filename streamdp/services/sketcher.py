"""The sketcher service: a consumer-group member that sketches its partitions.

Commit and checkpoint semantics (the one place they are stated)
---------------------------------------------------------------
* The truth is the state topic. For each assigned documents partition the
  sketcher keeps a :class:`PartitionState` (sketches + next offset + progress)
  and checkpoints it as one self-sufficient, chunked record every
  ``checkpoint_seconds``, on revoke and on SIGTERM. Kafka consumer-group
  offsets are committed *after* the checkpoint, for monitoring only.
* On assignment the partition's latest complete state is restored and the
  consumer seeks to its ``next_offset``. Documents after the last checkpoint are
  re-read and re-sketched; documents before it are never seen again. A crash at
  any point therefore neither loses nor double-counts a document.
* A batch is validated completely before any sketch changes; a bad document
  goes to the dead-letter topic (flushed before the checkpoint that covers its
  offset, so it is never lost; after a crash it may be dead-lettered twice).
* On ``lost`` partitions (session expired) state is dropped without a
  checkpoint: another member may already own them.
* Stream documents that arrive before the subspace exists pause their
  partition (seeked back to that document) until the release service
  announces ``subspace_ready``.
* Vocabulary (``vocabulary_mode`` public/private, issue 11): until the deployment's
  vocabulary record exists on the state topic, nothing can be counted. Documents of the
  selection window (private: ``ts < selection_end``, :meth:`Routing.route`) are tokenised
  and their clipped distinct-word sets added to the partition's selection histogram
  (checkpointed like the sketches); the first document routed to the warm-up or the
  stream pauses the partition at its offset (same mechanism as above) until
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
* Every checkpoint carries a fencing token (the consumer-group generation of the
  assignment) and its next_offset; on restore :func:`select_state` rejects a
  record that goes backwards against one this process accepted. Before writing,
  the offset commit (which the group coordinator refuses from a member that lost
  its partitions) acts as a fence: a zombie drops its state instead of writing.
* Refinement (DESIGN §8, docs/services.md §Refinement, docs/privacy.md §The refinement
  model rule): with ``refinement`` on, a stream document of epoch e is also folded into
  the model of the snapshot of epoch e − L (:func:`streamdp.refinement.model_epoch_for`,
  L = ``refinement_model_lag``; none while e − L < 1) — never the model that happens to be
  newest when it is read, which depends on poll timing. The models come from the release
  state record (``release/tree``, ``refinement_models``: the last L snapshots' models) on
  the state topic, read at start-up, whenever an authenticated ``epochs_closed`` arrives
  and every few seconds while a partition is held; that record is persisted *before* the
  release is published, and reading it is atomic with the confirmation of the released
  epochs. A document whose model is not decided yet (epoch e − L not closed) holds its
  partition at its offset (as for the subspace) until the record says e − L is closed;
  documents of epochs that record already closed are late. The refinement sums are part
  of the PartitionState checkpoint; a document re-read after a crash is folded into the
  same model as in the lost run.
* Control messages from the release service count only with a valid HMAC
  (``control_key_file``), and even then raw sketches are dropped only through
  the epoch the release state on the state topic confirms as released.
"""
from __future__ import annotations

import logging
import math
import signal
import sys
import threading
import time
import uuid
from collections import defaultdict

import numpy as np
from confluent_kafka import (OFFSET_BEGINNING, TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE, Consumer,
                             KafkaError, KafkaException, Producer, TopicPartition)

from streamdp import messages
from streamdp.documents import MIN_DOC_LENGTH
from streamdp.kafka.state_store import StateStore
from streamdp.moments.clipping import ClipBounds
from streamdp.observability import HealthState, ObservabilityServer, ServiceMetrics
from streamdp.refinement import FoldInModels, RefinementModel
from streamdp import serialization as ser
from streamdp.snapshot import TopicSnapshot
from streamdp.services import control
from streamdp.kafka.connectivity import OutageGuard, check_bootstrap
from streamdp.services.config import ConfigError, ServiceConfig, check_privacy_mode
from streamdp.kafka.topics import TopicConfigError, check_broker_time
from streamdp.services import vocabulary as vocab_mod
from streamdp.services.partition_state import (FUTURE, LATE, PRODUCER_TIMESTAMP, SELECTION,
                                               PartitionState, RecordTimeRejected, fencing_token,
                                               select_state, state_key)
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupSketch

log = logging.getLogger("streamdp.sketcher")

#: how often a sketcher holding partitions re-reads the state topic for the record it waits for
HELD_REFRESH_SECONDS = 5.0


class RateLimitedLog:
    """At most ``per_minute`` log lines per key; the rest are counted and summarised."""

    def __init__(self, per_minute: int = 20) -> None:
        self.per_minute, self._window, self._n, self._suppressed = per_minute, 0.0, 0, 0

    def warning(self, msg: str, *args) -> None:
        now = time.monotonic()
        if now - self._window > 60:
            if self._suppressed:
                log.warning("%d similar messages suppressed in the last minute", self._suppressed)
            self._window, self._n, self._suppressed = now, 0, 0
        if self._n < self.per_minute:
            self._n += 1
            log.warning(msg, *args)
        else:
            self._suppressed += 1


def load_subspace(store: StateStore, vocabulary_id: str | None = None) -> tuple[Subspace, ClipBounds] | None:
    rec = store.read_latest(control.SUBSPACE_KEY)
    if rec is None:
        return None
    found = rec.meta.get("vocabulary_id")
    if vocabulary_id is not None and found is not None and found != vocabulary_id:
        raise ConfigError(f"the deployment's subspace was built for vocabulary {found}, this "
                          f"sketcher's vocabulary file is {vocabulary_id}: every service must use "
                          "the same vocabulary (a new vocabulary needs a new deployment)")
    sub = Subspace.from_bytes(rec.payload)
    return sub, ClipBounds.from_dict(rec.meta["clip"])


class Sketcher:
    """One sketcher process (see the module docstring for its semantics)."""

    def __init__(self, cfg: ServiceConfig, *, instance: str | None = None) -> None:
        self.cfg = cfg
        self.instance = instance or f"sketcher-{uuid.uuid4().hex[:8]}"
        self.tokenizer = cfg.tokenizer_()
        self.vocabulary = self.d = self.k_prime = None
        self.candidates = None                  # private: the public candidate list
        if cfg.vocabulary_mode == "file":
            self._set_vocabulary(cfg.load_vocabulary())
        elif cfg.vocabulary_mode == "private":
            try:
                self.candidates = vocab_mod.candidates(cfg)
            except vocab_mod.VocabularyError as exc:
                raise ConfigError(str(exc)) from None
        check_bootstrap(cfg.client("admin"))     # fail fast, naming 'bootstrap'
        self.routing = cfg.routing
        self.topics = cfg.topics
        self.metrics = ServiceMetrics("sketcher", exact_counts=cfg.metrics_exact_counts)
        self.health = HealthState(liveness_timeout=cfg.liveness_seconds)
        self.metrics.bind_health(self.health)
        self.states: dict[int, PartitionState] = {}
        self.dirty: set[int] = set()
        self.paused: dict[int, str] = {}     # partition -> what it waits for (vocabulary|subspace)
        self.subspace: Subspace | None = None
        self.clip: ClipBounds | None = None
        self.closed_through = 0
        self.warmup_closed = False
        self.refinement = cfg.refinement_config()
        # the public models by snapshot epoch and the epoch the release state confirms closed
        self.models = None if self.refinement is None else FoldInModels(self.refinement.model_lag)
        self.model_epoch: int | None = None            # the newest model loaded (its epoch)
        self.held_for: dict[int, tuple[int, float]] = {}   # partition -> (model epoch, record time)
        self.model_holds = 0                # times a partition was held for its refinement model
        self._stop = threading.Event()
        self._last_checkpoint = time.monotonic()
        self._last_refresh = time.monotonic()
        self._bad_log = RateLimitedLog()
        try:
            self.control_key = control.load_key(cfg)
        except control.ControlKeyError as exc:
            raise ConfigError(str(exc)) from None
        self.control_rejected = 0           # unauthenticated / unconfirmed control messages
        self.fenced_writes = 0              # checkpoints refused because the partition was lost
        self._accepted: dict[int, object] = {}     # newest state record accepted per partition
        self.broker_time = cfg.broker_time_required
        if self.broker_time:
            try:
                check_broker_time(cfg.client("admin"), cfg.topics.documents)
            except TopicConfigError as exc:
                raise ConfigError(str(exc)) from None
        self.store = cfg.state_store()
        check_privacy_mode(cfg, self.store, role="sketcher")   # never private -> non-private
        self.producer = Producer(cfg.client("producer", **{
            "enable.idempotence": True, "acks": "all", "linger.ms": 20}))
        self.consumer = Consumer(cfg.client("consumer", **{
            "group.id": cfg.group_id, "client.id": self.instance,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "statistics.interval.ms": 5000, "stats_cb": self.metrics.set_lag_from_stats,
            # A short session timeout reassigns a dead member's partitions quickly
            # (measured on Tansu: ≈ 9 s after SIGKILL, ≈ 3 s after a clean leave);
            # max.poll.interval.ms bounds a stalled loop (a checkpoint takes < 1 s).
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
            "max.poll.interval.ms": 20000, "fetch.wait.max.ms": 100,
        }))
        self.control_consumer = Consumer(cfg.client("consumer", **{
            "group.id": f"{self.instance}-control", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100}))
        self.control_consumer.assign([TopicPartition(self.topics.control, 0, OFFSET_BEGINNING)])
        self.server: ObservabilityServer | None = None

    # ------------------------------------------------------------ lifecycle
    def stop(self, *_args) -> None:
        self._stop.set()

    def run(self, *, max_seconds: float | None = None, install_signals: bool = True) -> int:
        if install_signals:
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        self.server = ObservabilityServer(self.metrics, self.health, host=self.cfg.metrics_host,
                                          port=self.cfg.metrics_port)
        log.info("%s: metrics on %s", self.instance, self.server.url)
        self._refresh_vocabulary()
        self._refresh_subspace()
        self.consumer.subscribe([self.topics.documents], on_assign=self._on_assign,
                                on_revoke=self._on_revoke, on_lost=self._on_lost)
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        guard = OutageGuard(self.health, self.cfg.client("admin"), self._stop,
                            name=self.instance, logger=log)     # outages: alive, not ready, retry
        try:
            while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
                guard.run(self.step)
            self.checkpoint_all()
        finally:
            self.close()
        return 0

    def close(self) -> None:
        try:
            self.consumer.close()      # leaves the group; on_revoke checkpoints what is left
        finally:
            self.control_consumer.close()
            self.producer.flush(10)
            self.store.close()
            if self.server is not None:
                self.server.close()

    # ------------------------------------------------------------ rebalance
    def _on_assign(self, consumer, partitions) -> None:
        self.health.set_ready(False, "restoring state")
        self.health.beat()
        found = self.store.read_all_latest(prefix=f"sketch/{self.topics.documents}/")
        self.health.beat()
        generation = group_generation(consumer)
        for tp in partitions:
            rec, rejected = select_state(self._accepted.get(tp.partition),
                                         found.get(state_key(tp.topic, tp.partition)))
            if rejected:
                log.warning("%s: partition %d: the newest state record goes backwards (fence/next_offset "
                            "%s/%s < accepted %s/%s): a zombie wrote it; restoring the accepted one",
                            self.instance, tp.partition, found[state_key(tp.topic, tp.partition)]
                            .meta.get("fence"), found[state_key(tp.topic, tp.partition)].meta["next_offset"],
                            rec.meta.get("fence"), rec.meta["next_offset"])
            if rec is not None:
                st = PartitionState.from_bytes(rec.payload, self.subspace)
                self._accepted[tp.partition] = rec
                tp.offset = st.next_offset
            else:
                st = PartitionState(tp.topic, tp.partition)
                tp.offset = OFFSET_BEGINNING
            st.fence = fencing_token(generation, st.fence)
            st.forget_closed(self.closed_through, self.warmup_closed)
            if self.vocabulary is not None and self.cfg.vocabulary_mode != "file":
                st.forget_selection()         # the published vocabulary consumed it
            self.states[tp.partition] = st
        consumer.assign(partitions)
        self.metrics.rebalance("assign", assigned=len(self.states))
        self.health.set_ready(True, f"{len(self.states)} partition(s) assigned and restored")
        log.info("%s: assigned %s", self.instance, sorted(self.states))

    def _on_revoke(self, consumer, partitions) -> None:
        for tp in partitions:
            if tp.partition in self.states:
                self.checkpoint(tp.partition)
                self.states.pop(tp.partition, None)
                self.paused.pop(tp.partition, None)
                self.held_for.pop(tp.partition, None)
        self.metrics.rebalance("revoke", assigned=len(self.states))

    def _on_lost(self, consumer, partitions) -> None:
        for tp in partitions:
            self.states.pop(tp.partition, None)
            self.dirty.discard(tp.partition)
            self.paused.pop(tp.partition, None)
            self.held_for.pop(tp.partition, None)
        self.metrics.rebalance("lost", assigned=len(self.states))

    # ------------------------------------------------------------ the loop
    def step(self) -> None:
        msgs = self.consumer.consume(num_messages=self.cfg.batch_size, timeout=self.cfg.poll_seconds)
        self.health.beat()
        by_partition: dict[int, list] = defaultdict(list)
        for m in msgs:
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error: %s", m.error())
                continue
            by_partition[m.partition()].append(m)
        for p, batch in by_partition.items():
            if p in self.states and p not in self.paused:
                if self.vocabulary is None:
                    self.process_before_vocabulary(p, batch)
                else:
                    self.process(p, batch)
        self._poll_control()
        if self.paused and time.monotonic() - self._last_refresh >= HELD_REFRESH_SECONDS:
            # held partitions wait for a release record: look again now and then, in case its
            # announcement was read before the record was visible (or was never seen)
            self._last_refresh = time.monotonic()
            needs = set(self.paused.values())
            if "vocabulary" in needs and self.vocabulary is None:
                self._refresh_vocabulary()
            if "subspace" in needs and self.subspace is None:
                self._refresh_subspace()
            if "model" in needs:
                self._refresh_model()
            self._advance_held_progress()
        ready = [p for p, need in self.paused.items()
                 if (need == "vocabulary" and self.vocabulary is not None)
                 or (need == "subspace" and self.subspace is not None)
                 or (need == "model" and self._model_decided(p))]
        if ready:
            self.consumer.resume([TopicPartition(self.topics.documents, p) for p in ready])
            for p in ready:
                del self.paused[p]
                self.held_for.pop(p, None)
        if time.monotonic() - self._last_checkpoint >= self.cfg.checkpoint_seconds:
            self.checkpoint_all()

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
        stamps = [m.timestamp() for m in batch]
        # every message's record time (nan if none), read once
        batch_rt = np.fromiter((math.nan if kind == TIMESTAMP_NOT_AVAILABLE else ms / 1000.0
                                for kind, ms in stamps), dtype=np.float64, count=len(batch))
        rejected: dict[int, messages.InvalidMessage] = {}
        if self.broker_time:
            for i, (kind, _) in enumerate(stamps):
                if kind != TIMESTAMP_LOG_APPEND_TIME:
                    rejected[i] = self._producer_time_error()
        values = [m.value() for m in batch]
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
        cb = db.to_counts(self.tokenizer)
        bad = [(batch[i], exc) for i, exc in cb.errors]
        rt_good = t_recs[cb.index]
        routes = self.routing.route(cb.timestamps, rt_good, now) if cb.n_docs else np.zeros(0, np.int64)
        routes = np.where(routes == SELECTION, LATE, routes)   # the vocabulary exists: window closed
        if self.models is not None:          # epochs the release state confirms closed: late
            routes = np.where((routes > 0) & (routes <= self.models.closed_through), LATE, routes)

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

        counts = st.add(X, routes_k, self.subspace, self.clip, new_warmup, models=self.models)
        for m, exc in bad:
            self._dead_letter(m, exc)
        st.counters["dlq"] += len(bad)
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
        if cut_offset is not None:
            st.progress = self.routing.advance_progress(st.progress, [blocker_rt], now)
            if need == "model":
                self.held_for[p] = (self.models.model_epoch(int(routes[first])), float(blocker_rt))
                self.model_holds += 1
            self._pause_at(p, cut_offset, need)
        self.dirty.add(p)
        # documents_total counts documents that entered a sketch; too-short and late
        # ones are counted under skipped_total{reason} instead (docs/metrics.md)
        self.metrics.observe_batch(counts["stream"] + counts["warmup"] - counts["short"], n_tok, n_unk,
                                   time.perf_counter() - t0, partition=p)
        if counts["short"]:
            self.metrics.skipped("too_short", counts["short"])
        if counts["late"]:
            self.metrics.skipped("late", counts["late"])

    def _pause_at(self, p: int, offset: int, need: str) -> None:
        """Hold partition ``p`` at ``offset`` (that record is re-read after resuming) until
        ``need`` (the vocabulary, the subspace, or the refinement model of ``held_for[p]``)
        is published."""
        self.consumer.pause([TopicPartition(self.topics.documents, p)])
        self.consumer.seek(TopicPartition(self.topics.documents, p, offset))
        self.paused[p] = need
        what = need if need != "model" else f"model of epoch {self.held_for[p][0]}"
        log.info("%s: partition %d paused at offset %d until the %s is released",
                 self.instance, p, offset, what)

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
                toks = None
                if route == SELECTION:
                    toks = self._selection_tokens(doc)
            except messages.InvalidMessage as exc:
                bad.append((m, exc))
                rts.append(math.nan if rt is None else rt)
                continue
            rts.append(math.nan if rt is None else rt)
            if route == SELECTION:
                token_lists.append(toks)
                n_tok += len(toks)
            else:
                n_late += 1
        # --- everything validated: now the one state update
        if token_lists:
            st.add_selection(token_lists, lambda: vocab_mod.SelectionHistogram.for_config(
                self.cfg, self.candidates), self.candidates)
        for m, exc in bad:
            self._dead_letter(m, exc)
        st.counters["dlq"] += len(bad)
        st.counters["late"] += n_late
        st.counters["tokens"] += n_tok
        if rts:
            st.next_offset = batch[len(rts) - 1].offset() + 1
            st.progress = self.routing.advance_progress(st.progress, rts, now)
        if cut is not None:
            st.progress = self.routing.advance_progress(st.progress, [cut[1]], now)
            self._pause_at(p, cut[0], "vocabulary")
        self.dirty.add(p)
        self.metrics.observe_batch(len(token_lists), n_tok, 0, time.perf_counter() - t0, partition=p)
        if n_late:
            self.metrics.skipped("late", n_late)

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

    def _set_vocabulary(self, vocab) -> None:
        self.vocabulary = vocab
        self.d = len(vocab)
        self.k_prime = self.cfg.k_prime(self.d)

    def _refresh_vocabulary(self) -> None:
        """public/private: load the deployment's vocabulary record (content id checked)."""
        if self.vocabulary is not None:
            return
        try:
            got = vocab_mod.load_record(self.store)
        except vocab_mod.VocabularyError as exc:
            log.error("%s: %s", self.instance, exc)
            return
        if got is None:
            return
        vocab, meta = got
        self._set_vocabulary(vocab)
        for p, st in self.states.items():
            st.forget_selection()       # the release service consumed it (the record exists)
            self.dirty.add(p)
        log.info("%s: vocabulary %s (%d words, %s) loaded", self.instance, vocab.id, len(vocab),
                 meta.get("mode"))
        self._refresh_subspace()

    def _dead_letter(self, m, exc: messages.InvalidMessage) -> None:
        self.metrics.dlq(exc.error_class)
        self._bad_log.warning("dead-lettered %s[%d]@%d: %s: %s", m.topic(), m.partition(),
                              m.offset(), exc.error_class, exc.message)
        while True:
            try:
                self.producer.produce(self.topics.dlq, value=m.value(), key=m.key(),
                                      headers=messages.dlq_headers(exc, m.topic(), m.partition(),
                                                                   m.offset()))
                return
            except BufferError:
                self.producer.poll(0.1)

    # ------------------------------------------------------------ control
    def _refresh_model(self, rec=None) -> None:
        """Load the fold-in models and the closed epoch from the release state record (public
        models of the last L snapshots; see the module docstring). ``rec``: that record if the
        caller already read it."""
        if self.models is None or self.d is None:
            return
        rec = self.store.read_latest(control.RELEASE_STATE_KEY) if rec is None else rec
        if rec is None:
            return
        closed = int(rec.meta.get("epoch") or 0)
        if closed <= self.models.closed_through and self.model_epoch is not None:
            return                      # nothing new
        obj = ser.loads(rec.payload)
        raw = obj.get("refinement_models")
        if raw is None and obj.get("last_snapshot"):     # a record written before the rule
            raw = [RefinementModel.from_snapshot(TopicSnapshot.from_bytes(obj["last_snapshot"])).to_dict()]
        for m in raw or []:
            model = RefinementModel.from_dict(m, fold_in_iter=self.refinement.fold_in_iter)
            if model.shape != (self.cfg.n_topics, self.d):
                log.error("%s: the released model of epoch %s has shape %s, this sketcher expects "
                          "(%d, %d): not folding documents into it", self.instance, model.epoch,
                          model.shape, self.cfg.n_topics, self.d)
                continue
            if model.epoch is not None and model.epoch <= closed:
                self.models.models.setdefault(model.epoch, model)
        self.models.close_through(closed)
        if self.models.models:
            newest = max(self.models.models)
            if newest != self.model_epoch:
                log.info("%s: release closed through epoch %d; models of epochs %s (lag %d)",
                         self.instance, closed, sorted(self.models.models), self.models.lag)
            self.model_epoch = newest
        lost = [m for m in range(max(1, closed + 1 - self.models.lag), closed + 1)
                if m not in self.models.models]
        if lost:
            log.warning("%s: the release state (epoch %d) holds no model for epoch(s) %s (written "
                        "before the refinement model rule, or of another shape): documents of "
                        "epochs %s get no refinement term", self.instance, closed, lost,
                        [m + self.models.lag for m in lost])

    def _model_decided(self, p: int) -> bool:
        m = self.held_for.get(p, (None,))[0]
        return m is None or m <= self.models.closed_through

    def _advance_held_progress(self) -> None:
        """A partition held at a record: its progress is that record's time, capped by the
        clock (Routing.advance_progress) — advanced again as the clock passes it, so the
        release service can close the epoch the partition waits for."""
        now = time.time()
        for p, (_, rt) in self.held_for.items():
            st = self.states.get(p)
            if st is not None:
                progress = self.routing.advance_progress(st.progress, [rt], now)
                if progress != st.progress:
                    st.progress = progress
                    self.dirty.add(p)

    def _refresh_subspace(self) -> None:
        if self.vocabulary is None:
            return                      # no warm-up before the vocabulary
        self._refresh_model()
        got = load_subspace(self.store, self.vocabulary.id)
        if got is not None:
            self.subspace, self.clip = got
            self.warmup_closed = True
            # The warm-up is closed: drop the warm-up sketches of the partitions held now,
            # as a restart would (_on_assign), so a warm-up document that still arrives is
            # late whether or not this process restarted in between.
            for p, st in self.states.items():
                st.forget_closed(self.closed_through, True)
                self.dirty.add(p)
            log.info("%s: subspace %s (k'=%d) loaded", self.instance, self.subspace.id, self.subspace.dim)

    def _poll_control(self) -> None:
        through = None
        for m in self.control_consumer.consume(num_messages=100, timeout=0):
            if m.error() is not None:
                continue
            try:
                msg = control.decode(m.value())
            except Exception as exc:            # noqa: BLE001 — bad control input is logged, never fatal
                self._reject_control("ignored bad control message at offset %d: %s", m.offset(), exc)
                continue
            if msg["type"] not in control.RELEASE_TYPES:
                continue                        # operator → release messages
            if not control.authentic(msg, self.control_key):
                self._reject_control("ignored unauthenticated %s control message at offset %d "
                                     "(no valid MAC under this deployment's control key)",
                                     msg["type"], m.offset())
                continue
            if msg["type"] == "vocabulary_ready" and self.vocabulary is None:
                self._refresh_vocabulary()
            elif msg["type"] == "subspace_ready" and self.subspace is None:
                self._refresh_subspace()
            elif msg["type"] == "epochs_closed" and (msg["through"] > self.closed_through
                                                     or not self.warmup_closed):
                through = max(msg["through"], -1 if through is None else through)
        if through is not None:
            self._apply_epochs_closed(through)

    def _reject_control(self, fmt: str, *args) -> None:
        self.control_rejected += 1
        self._bad_log.warning(fmt, *args)

    def _apply_epochs_closed(self, through: int) -> None:
        """Drop raw sketches through ``through`` — but only as far as the release state on
        the state topic confirms (the control message is a hint, the release state the truth)."""
        released = self.confirmed_release()
        if released is None:
            self._reject_control("epochs_closed through %d not confirmed: no subspace/release state "
                                 "on the state topic; keeping every raw sketch", through)
            return
        if through > released:
            self._reject_control("epochs_closed through %d, but the release state confirms only %d: "
                                 "dropping raw sketches through %d only", through, released, released)
        through = min(through, released)
        self.closed_through = max(self.closed_through, through)
        self.warmup_closed = True
        for p, st in self.states.items():
            st.forget_closed(self.closed_through, True)
            self.dirty.add(p)

    def confirmed_release(self) -> int | None:
        """The last epoch the release state on the state topic records as released
        (0 = only the warm-up), or None if not even the warm-up is released."""
        if self.store.read_latest(control.SUBSPACE_KEY) is None:
            return None
        rec = self.store.read_latest(control.RELEASE_STATE_KEY)
        if rec is not None:
            self._refresh_model(rec)      # the same record holds the released model
        return 0 if rec is None else int(rec.meta.get("epoch") or 0)

    # ------------------------------------------------------------ checkpoints
    def checkpoint(self, p: int) -> None:
        st = self.states.get(p)
        if st is None or p not in self.dirty:
            return
        # DLQ records for the offsets this checkpoint covers must be durable first.
        if self.producer.flush(30) != 0:
            raise RuntimeError("dead-letter records not acknowledged in 30 s; not checkpointing")
        # Fence: the group coordinator refuses a commit from a member that lost its
        # partitions (UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION; measured on Tansu too). A
        # zombie then drops the partition instead of overwriting the new owner's state;
        # readers reject what slips through this check (select_state).
        try:
            self.consumer.commit(offsets=[TopicPartition(st.topic, p, st.next_offset)],
                                 asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() in _FENCED_COMMIT:
                self.fenced_writes += 1
                log.warning("%s: partition %d is no longer ours (%s): dropping its state without "
                            "a checkpoint", self.instance, p, err)
                self.states.pop(p, None)
                self.dirty.discard(p)
                self.paused.pop(p, None)
                self.held_for.pop(p, None)
                return
            log.debug("offset commit failed (state is the truth): %s", exc)
        except Exception as exc:                # noqa: BLE001 — offsets are informational
            log.debug("offset commit failed (state is the truth): %s", exc)
        payload = st.to_bytes()
        meta = st.meta()
        self.store.write(st.key, payload, meta=meta)
        self._accepted[p] = _Accepted(meta, payload)
        self.dirty.discard(p)
        self.metrics.checkpointed(len(payload))

    def checkpoint_all(self) -> None:
        for p in list(self.states):
            self.checkpoint(p)
        self._last_checkpoint = time.monotonic()


_FENCED_COMMIT = {KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION,
                  KafkaError.FENCED_INSTANCE_ID}


class _Accepted:
    """A state record this process wrote itself (as the store would return it)."""

    def __init__(self, meta: dict, payload: bytes) -> None:
        self.meta, self.payload = dict(meta), payload


def _record_time(m) -> tuple[int, float | None]:
    kind, ms = m.timestamp()
    return kind, (None if kind == TIMESTAMP_NOT_AVAILABLE else ms / 1000.0)


def group_generation(consumer) -> int | None:
    """The consumer-group generation id of ``consumer`` (librdkafka's serialised group
    metadata: ``b"CGMDv2:" + int32 generation + ...``, native byte order), or None."""
    try:
        raw = consumer.consumer_group_metadata()
    except Exception:                           # noqa: BLE001
        return None
    if isinstance(raw, (bytes, bytearray)) and raw[:7] == b"CGMDv2:" and len(raw) >= 11:
        return int.from_bytes(raw[7:11], sys.byteorder, signed=True)
    return None
