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
"""
from __future__ import annotations

import logging
import math
import signal
import threading
import time
import uuid
from collections import defaultdict

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, Producer, TopicPartition

from streamdp import messages
from streamdp.documents import MIN_DOC_LENGTH
from streamdp.kafka.state_store import StateStore
from streamdp.moments.clipping import ClipBounds
from streamdp.observability import HealthState, ObservabilityServer, ServiceMetrics
from streamdp.services import control
from streamdp.kafka.connectivity import OutageGuard, check_bootstrap
from streamdp.services.config import ConfigError, ServiceConfig, check_privacy_mode
from streamdp.services.partition_state import LATE, PartitionState, state_key
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupSketch

log = logging.getLogger("streamdp.sketcher")


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
        self.vocabulary = cfg.load_vocabulary()
        self.tokenizer = cfg.tokenizer_()
        self.d = len(self.vocabulary)
        self.k_prime = cfg.k_prime(self.d)
        check_bootstrap(cfg.client("admin"))     # fail fast, naming 'bootstrap'
        self.routing = cfg.routing
        self.topics = cfg.topics
        self.metrics = ServiceMetrics("sketcher")
        self.health = HealthState(liveness_timeout=cfg.liveness_seconds)
        self.metrics.bind_health(self.health)
        self.states: dict[int, PartitionState] = {}
        self.dirty: set[int] = set()
        self.paused: set[int] = set()
        self.subspace: Subspace | None = None
        self.clip: ClipBounds | None = None
        self.closed_through = 0
        self.warmup_closed = False
        self._stop = threading.Event()
        self._last_checkpoint = time.monotonic()
        self._bad_log = RateLimitedLog()
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
        for tp in partitions:
            rec = found.get(state_key(tp.topic, tp.partition))
            if rec is not None:
                st = PartitionState.from_bytes(rec.payload, self.subspace)
                tp.offset = st.next_offset
            else:
                st = PartitionState(tp.topic, tp.partition)
                tp.offset = OFFSET_BEGINNING
            st.forget_closed(self.closed_through, self.warmup_closed)
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
                self.paused.discard(tp.partition)
        self.metrics.rebalance("revoke", assigned=len(self.states))

    def _on_lost(self, consumer, partitions) -> None:
        for tp in partitions:
            self.states.pop(tp.partition, None)
            self.dirty.discard(tp.partition)
            self.paused.discard(tp.partition)
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
                self.process(p, batch)
        self._poll_control()
        if self.paused and self.subspace is not None:
            self.consumer.resume([TopicPartition(self.topics.documents, p) for p in self.paused])
            self.paused.clear()
        if time.monotonic() - self._last_checkpoint >= self.cfg.checkpoint_seconds:
            self.checkpoint_all()

    def process(self, p: int, batch: list) -> None:
        """Validate the whole batch, then update the partition's sketches once."""
        t0 = time.perf_counter()
        st = self.states[p]
        docs, msg_of_doc, rts = [], [], []
        batch_rt = []        # every message's record time (nan if none), read once
        bad: list[tuple[object, messages.InvalidMessage]] = []
        for m in batch:
            rt = _record_time(m)
            batch_rt.append(math.nan if rt is None else rt)
            try:
                value = m.value()
                if value is None:
                    raise messages.InvalidMessage(messages.MALFORMED_MSGPACK, "null record value")
                doc = messages.decode_document(value, max_bytes=self.cfg.max_document_bytes,
                                               max_tokens=self.cfg.max_document_tokens)
                if rt is not None and doc.ts > rt + self.cfg.max_future_seconds:
                    raise messages.InvalidMessage(
                        messages.INVALID_VALUE, f"document ts {doc.ts} is more than "
                        f"{self.cfg.max_future_seconds:g} s after its record timestamp {rt}")
            except messages.InvalidMessage as exc:
                bad.append((m, exc))
                continue
            docs.append(doc)
            msg_of_doc.append(m)
            rts.append(doc.ts if rt is None else rt)
        cb = messages.documents_to_counts(docs, self.tokenizer, self.vocabulary,
                                          max_tokens=self.cfg.max_document_tokens)
        for i, exc in cb.errors:
            bad.append((msg_of_doc[i], exc))
        rt_good = np.asarray(rts, dtype=np.float64)[cb.index] if cb.n_docs else np.zeros(0)
        routes = self.routing.route(cb.timestamps, rt_good) if cb.n_docs else np.zeros(0, np.int64)

        # Without a subspace, stream documents cannot be sketched: stop at the first one.
        cut_offset = None
        if self.subspace is None and np.any(routes > 0):
            first = int(np.flatnonzero(routes > 0)[0])
            blocker = msg_of_doc[cb.index[first]]
            cut_offset = blocker.offset()
            keep = np.flatnonzero([msg_of_doc[j].offset() < cut_offset for j in cb.index])
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

        counts = st.add(X, routes_k, self.subspace, self.clip, new_warmup)
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
            seen = np.asarray(batch_rt[:len(processed)])      # processed = a prefix of the batch
            seen = seen[~np.isnan(seen)]
            if seen.size:
                st.progress = max(st.progress, float(seen.max()))
        if cut_offset is not None:
            st.progress = max(st.progress, float(blocker_rt))
            tp = TopicPartition(self.topics.documents, p, cut_offset)
            self.consumer.pause([TopicPartition(self.topics.documents, p)])
            self.consumer.seek(tp)
            self.paused.add(p)
            log.info("%s: partition %d paused at offset %d until the subspace is released",
                     self.instance, p, cut_offset)
        self.dirty.add(p)
        # documents_total counts documents that entered a sketch; too-short and late
        # ones are counted under skipped_total{reason} instead (docs/metrics.md)
        self.metrics.observe_batch(counts["stream"] + counts["warmup"] - counts["short"], n_tok, n_unk,
                                   time.perf_counter() - t0, partition=p)
        if counts["short"]:
            self.metrics.skipped("too_short", counts["short"])
        if counts["late"]:
            self.metrics.skipped("late", counts["late"])

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
    def _refresh_subspace(self) -> None:
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
        for m in self.control_consumer.consume(num_messages=100, timeout=0):
            if m.error() is not None:
                continue
            try:
                msg = control.decode(m.value())
            except Exception as exc:            # noqa: BLE001 — bad control input is logged, never fatal
                self._bad_log.warning("ignored bad control message: %s", exc)
                continue
            if msg["type"] == "subspace_ready" and self.subspace is None:
                self._refresh_subspace()
            elif msg["type"] == "epochs_closed":
                self.closed_through = max(self.closed_through, msg["through"])
                self.warmup_closed = True
                for p, st in self.states.items():
                    st.forget_closed(self.closed_through, True)
                    self.dirty.add(p)

    # ------------------------------------------------------------ checkpoints
    def checkpoint(self, p: int) -> None:
        st = self.states.get(p)
        if st is None or p not in self.dirty:
            return
        # DLQ records for the offsets this checkpoint covers must be durable first.
        if self.producer.flush(30) != 0:
            raise RuntimeError("dead-letter records not acknowledged in 30 s; not checkpointing")
        payload = st.to_bytes()
        self.store.write(st.key, payload, meta=st.meta())
        self.dirty.discard(p)
        self.metrics.checkpointed(len(payload))
        try:
            self.consumer.commit(offsets=[TopicPartition(st.topic, p, st.next_offset)],
                                 asynchronous=False)
        except Exception as exc:                # noqa: BLE001 — offsets are informational
            log.debug("offset commit failed (state is the truth): %s", exc)

    def checkpoint_all(self) -> None:
        for p in list(self.states):
            self.checkpoint(p)
        self._last_checkpoint = time.monotonic()


def _record_time(m) -> float | None:
    kind, ms = m.timestamp()
    return None if kind == TIMESTAMP_NOT_AVAILABLE else ms / 1000.0
