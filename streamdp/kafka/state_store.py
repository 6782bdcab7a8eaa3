"""Self-sufficient, chunked state records on the compacted state topic (DESIGN §5).

A sketcher's state (its sketch plus the next offset of every input partition it
covers) is one opaque ``payload`` of up to many megabytes, stored under a logical
``key`` (e.g. ``"sketcher/streamdp.documents/3"``). Restoring the latest complete
record and seeking to its offsets makes a crash anywhere neither lose nor
double-count a document; this module provides the durable, never-torn record.

The record format, its key scheme and the pure reader that verifies records are in
:mod:`streamdp.kafka.state_records`; the errors in :mod:`streamdp.kafka.state_errors`.

Crash safety
------------
*Generation in the chunk key.* Chunks of a new generation never share a Kafka
key with chunks of an older one, so compaction (which keeps the newest value per
key) can never replace a chunk that a committed manifest points at. Had the keys
been ``f"{key}/chunk/{i}"``, a crash after rewriting chunk 0 of g+1 would leave
g's manifest pointing at a compacted-away chunk: a torn or lost state.

*Manifest last, after confirmed delivery.* The writer produces all chunks, flushes
and checks every delivery report; only then does it produce the manifest (and
flush and check again). A manifest therefore exists only if all its chunks were
acknowledged before it, in the same partition.

*Incremental reads.* A store keeps, per key or prefix it has read, the fold so far
and the next offset of every partition, and a later read folds only the records
past them (to the end, as below): the result equals a read from the beginning,
since a key's records all lie in one partition and are folded in log order, and a
read's cost no longer grows with the topic's history. A view whose positions no
longer fit the log is rebuilt from the beginning (``incremental=False``: always).

*Readers verify.* A reader reads every partition from the beginning to its end
— at least the end offsets listed when it starts, and up to the high watermark
of a fetch response, since Tansu under-reports ListOffsets (docs/kafka.md) — with
no consumer group and nothing committed; it raises rather than return a partial
view. It accepts a manifest only if all ``n_chunks`` chunks of the same
generation are present and the concatenation has the manifest's ``size`` and
``sha256``. The newest
(highest generation) accepted manifest wins; an incomplete or corrupt newer
manifest falls back to the newest older complete one. A crash after k chunks of
g+1 (any k, including "all chunks, no manifest") thus leaves g readable, because
g's chunks are untouched and g+1 has no manifest; a crash after the manifest
makes g+1 the state. No interleaving yields a mixture: the hash would not match.

*Garbage collection by tombstones.* After the manifest of g+1 is acknowledged,
the writer produces tombstones (null values) for every other generation's chunk
keys it knows of — the previous state and the debris of crashed writes, learned
from a scan of the topic on the first write for a key in this process. Compaction
then removes them. Before the manifest they are never touched, so a crash during
garbage collection only leaves garbage for the next write. (Older manifests need
no tombstone: the manifest key is shared, so compaction keeps only the newest.)
Compaction keeps the relative order of the surviving records and never drops
the newest manifest or its chunks, so a reader of the compacted log reaches the
same result as a reader of the full log (tested by replaying a compacted copy).

*Generation numbers.* ``generation = max(newest generation seen for the key + 1,
time.time_ns())``. A plain counter (previous + 1) is reused after a crash between
chunks and manifest: the restarted writer reads g as the newest and writes g+1
again over the debris. That would still be safe (the hash check rejects
mixtures), but it makes debris and the new write indistinguishable. Wall-clock
nanoseconds alone are not monotonic across machines — a sketcher moved to a pod
whose clock is behind would write a generation below the one it restored from,
and readers would keep restoring the old state. The maximum of the two is
strictly increasing in log order (every writer scans before its first write, and
the scan sees debris too) and unique across restarts.

*Fenced writers (``transactional=True``).* The release service writes its
records with a transactional producer whose ``transactional.id`` is fixed per
deployment; ``init_transactions()`` by a newer instance fences the older one.
Each :meth:`StateStore.write` is then one transaction (chunks, manifest, commit;
tombstones in a second one), and a fenced zombie's produce fails with
``_FENCED`` before any of its records reaches the log (measured on the embedded
Tansu broker, tests/test_services.py) — :class:`WriterFenced` is raised. The
design never relies on an *abort* hiding records (Tansu shows aborted
transactional messages to read_committed readers): a record either was written
by the current writer, or carries an older writer epoch (the caller's fencing
token in ``meta``).

Limits: two non-transactional writers for the same key at the same time (a
zombie after a rebalance) are not fenced here — the newest generation wins and
each may tombstone the other's debris; fencing belongs to the caller (one
sketcher per input partition; the release writer uses ``transactional=True``).
The class is not thread-safe.
"""
from __future__ import annotations

import hashlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)

from streamdp.errors import StateStoreError
from streamdp.kafka.state_errors import (StateReadError, StateTopicMissing, StateWriteError,
                                         WriterFenced, WriterReinitialised, FENCED_CODES,
                                         kafka_error)
from streamdp.kafka.state_records import (CHUNK_KIND, DEFAULT_CHUNK_BYTES, MANIFEST_KIND,
                                          MAX_MANIFEST_BYTES, MAX_RECORD_BYTES, StateRecord,
                                          StateScan, VERSION, check_key, chunk_key, manifest_key,
                                          partition_for)
from streamdp.kafka.topics import client_config
from streamdp.serialization import SchemaError, dumps, loads

# Tests import the record format and the errors from the store's module too (re-exports only)
from streamdp.kafka.state_records import latest_from_records, parse_kafka_key  # noqa: F401

# the public names: this module's own, then the ones imported above that other modules and
# tests import from here (re-exports)
__all__ = ["StateStore", "CHUNK_KIND", "DEFAULT_CHUNK_BYTES", "MANIFEST_KIND", "StateRecord",
           "StateWriteError", "WriterFenced", "WriterReinitialised", "chunk_key",
           "latest_from_records", "manifest_key", "parse_kafka_key", "partition_for"]

log = logging.getLogger(__name__)

_CREATE_TOPICS = ("create the deployment's topics first: `streamdp produce --config FILE "
                  "--create-topics CORPUS` creates them (streamdp.kafka.topics.ensure_topics from "
                  "Python; on Kubernetes the KafkaTopic resources of k8s/), and check "
                  "'topic_prefix'")


# ------------------------------------------------------------------ the store
class _Deliveries:
    """Delivery reports of one batch of produce calls."""

    def __init__(self) -> None:
        self.expected = 0
        self.ok = 0
        self.errors: list[str] = []
        self.fenced = False
        self.fatal: KafkaError | None = None     # fatal, but not a fencing error

    def callback(self, err, msg) -> None:
        if err is not None:
            if err.code() in FENCED_CODES:
                self.fenced = True
            elif err.fatal():
                self.fatal = err
            key = msg.key() if msg is not None else None
            self.errors.append(f"{key!r}: {err}")
        else:
            self.ok += 1

    @property
    def pending(self) -> int:
        return self.expected - self.ok - len(self.errors)


class _ViewInvalid(StateStoreError):
    """An incremental view's positions no longer fit the log: it must be rebuilt."""


@dataclass
class _View:
    """An incremental read: the fold so far and the next offset to read per partition."""

    scan: StateScan
    next: dict[int, int] = field(default_factory=dict)


@dataclass
class _Known:
    """What this process knows about a key's records on the topic."""
    max_generation: int = 0
    live_chunks: set[tuple[int, int]] = field(default_factory=set)


class StateStore:
    """Chunked, crash-safe state records on ``topic`` (see the module docstring).

    ``producer``: a non-transactional confluent-kafka Producer (idempotent
    recommended), or None to create one from ``source`` (a bootstrap string) —
    owned and closed by :meth:`close`. ``source``: a bootstrap string, or a
    factory returning a fresh Consumer for each read (it is assigned partitions
    directly, never subscribes or commits; ``enable.partition.eof=True`` makes
    reads end sooner). ``incremental`` (default): each key or prefix read keeps its
    fold and positions and later reads only fold the new records (same result as a
    read from the beginning, cost independent of the topic's history); False reads
    the whole topic every time.
    """

    def __init__(self, producer: Producer | None, source: str | Callable[[], Consumer], topic: str, *,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, flush_timeout: float = 30.0,
                 read_timeout: float = 60.0, consumer_overrides: dict[str, Any] | None = None,
                 clock: Callable[[], int] = time.time_ns, owns_producer: bool | None = None,
                 transactional: bool = False,
                 producer_factory: Callable[[], Producer] | None = None,
                 incremental: bool = True):
        if not (1 <= int(chunk_bytes) <= MAX_RECORD_BYTES // 2):
            raise ValueError(f"chunk_bytes must be in 1..{MAX_RECORD_BYTES // 2}, got {chunk_bytes}")
        self.topic = topic
        self.chunk_bytes = int(chunk_bytes)
        self.flush_timeout = float(flush_timeout)
        self.read_timeout = float(read_timeout)
        self._clock = clock
        self._consumer_overrides = dict(consumer_overrides or {})
        if isinstance(source, str):
            self._bootstrap: str | None = source
            self._consumer_factory = self._default_consumer
        elif callable(source):
            self._bootstrap = None
            self._consumer_factory = source
        else:
            raise TypeError("source must be a bootstrap string or a consumer factory")
        # a producer passed in is the caller's to close, unless it hands it over
        self._owns_producer = producer is None if owns_producer is None else bool(owns_producer)
        if producer is None:
            if self._bootstrap is None:
                raise ValueError("pass a producer, or a bootstrap string to create one")
            producer = Producer(client_config(self._bootstrap, "producer", **{
                "enable.idempotence": True, "acks": "all", "linger.ms": 5}))
        self.producer = producer
        # transactional: the producer has a transactional.id and init_transactions() was
        # called; every write is a transaction and a fenced writer gets WriterFenced
        self.transactional = bool(transactional)
        self.fenced: str | None = None
        # transactional: re-creates the producer after a fatal, non-fencing error (it must
        # call init_transactions with the same transactional.id, and may raise WriterFenced
        # when a newer writer registered meanwhile: then this one must not fence it)
        self.producer_factory = producer_factory
        self.reinitialisations = 0
        self._abort_pending = False          # a failed transaction whose abort did not get through
        self._known: dict[str, _Known] = {}
        self._n_partitions: int | None = None
        # incremental reads: one view (fold + per-partition positions) per key or prefix read
        self.incremental = bool(incremental)
        self._views: dict[tuple[str, str], _View] = {}

    # ------------------------------------------------------------- plumbing
    def _default_consumer(self) -> Consumer:
        cfg = client_config(self._bootstrap, "consumer", **{
            "group.id": f"streamdp-state-reader-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100,
        })
        cfg.update(self._consumer_overrides)
        return Consumer(cfg)

    def _partitions(self) -> int:
        if self._n_partitions is None:
            md = self.producer.list_topics(timeout=self.flush_timeout)
            t = md.topics.get(self.topic)
            if t is None or t.error is not None or not t.partitions:
                raise StateTopicMissing(f"state topic {self.topic!r} does not exist "
                                        f"({t.error if t is not None else 'not in metadata'}): "
                                        + _CREATE_TOPICS)
            self._n_partitions = len(t.partitions)
        return self._n_partitions

    def _produce(self, deliveries: _Deliveries, kafka_key: str, value: bytes | None, partition: int) -> None:
        deadline = time.monotonic() + self.flush_timeout
        while True:
            try:
                self.producer.produce(self.topic, key=kafka_key.encode("utf-8"), value=value,
                                      partition=partition, on_delivery=deliveries.callback)
                deliveries.expected += 1
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise StateWriteError(f"producer queue stayed full for {self.flush_timeout:.0f} s")
                self.producer.poll(0.1)

    def _confirm(self, deliveries: _Deliveries, what: str) -> None:
        try:
            remaining = self.producer.flush(self.flush_timeout)
        except Exception as exc:     # a fatal (e.g. fenced) producer error surfaces here
            err = kafka_error(exc)
            # a transactional writer tells fencing from other fatal errors (write() re-creates
            # the producer for the latter); a plain idempotent producer is dead either way
            if err is not None and (err.code() in FENCED_CODES
                                    or (err.fatal() and not self.transactional)):
                raise WriterFenced(f"{what}: {err}") from exc
            raise
        if deliveries.errors or deliveries.pending:
            fenced = deliveries.fenced or (deliveries.fatal is not None and not self.transactional)
            error = (WriterFenced if fenced else StateWriteError)(
                f"{what}: {deliveries.ok}/{deliveries.expected} delivered, "
                f"{len(deliveries.errors)} failed, {deliveries.pending} unconfirmed "
                f"({remaining} messages still queued after {self.flush_timeout:.0f} s)"
                + (f"; first error {deliveries.errors[0]}" if deliveries.errors else ""))
            if deliveries.fatal is not None and not fenced:
                raise error from KafkaException(deliveries.fatal)    # write() sees it is fatal
            raise error

    # ---------------------------------------------------------------- write
    def write(self, key: str, payload: bytes, meta: dict | None = None) -> int:
        """Durably write ``payload`` as the newest state of ``key``; its generation.

        Raises :class:`StateWriteError` if any chunk or the manifest is not
        acknowledged; the previous complete state then remains the latest.
        With ``transactional=True`` the write is one committed transaction, and
        a fenced writer gets :class:`WriterFenced` (then and for every later write).
        """
        if not self.transactional:
            return self._write(key, payload, meta)
        if self.fenced:
            raise WriterFenced(self.fenced)
        if self._abort_pending:              # an outage interrupted the last abort: finish it
            self._abort(key, None)
        try:
            self.producer.begin_transaction()
            generation = self._write(key, payload, meta, gc=False)
            self.producer.commit_transaction(self.flush_timeout)
        except Exception as exc:
            err = kafka_error(exc)
            fenced = isinstance(exc, WriterFenced) or (err is not None and err.code() in FENCED_CODES)
            fatal = not fenced and err is not None and err.fatal()
            if not fenced and not fatal:
                # abortable (or an outage): abort, so the next write starts a clean transaction
                fenced, fatal, err = self._abort(key, err)
            if fatal and self.producer_factory is not None:
                try:
                    self._reinitialise(key, err if err is not None else exc)
                except WriterFenced as fexc:        # a newer writer registered: do not fence it
                    self.fenced = str(fexc)
                    raise
            if fenced or fatal:
                self.fenced = (f"state {key!r}: this writer was fenced by a newer one with the same "
                               f"transactional.id ({err if err is not None else exc}); nothing of "
                               "this write is committed")
                raise WriterFenced(self.fenced) from exc
            if isinstance(exc, StateStoreError):
                raise
            raise StateWriteError(f"state {key!r}: transaction failed: {exc}") from exc
        try:
            self.producer.begin_transaction()
            self._collect_garbage(key, generation, partition_for(key, self._partitions()))
            self.producer.commit_transaction(self.flush_timeout)
        except Exception as exc:     # noqa: BLE001 - the state is committed; retry next write
            log.warning("state %r: garbage collection transaction failed: %s", key, exc)
            try:
                self.producer.abort_transaction(self.flush_timeout)
            except Exception:       # noqa: BLE001
                pass
        return generation

    def _abort(self, key: str, err: KafkaError | None) -> tuple[bool, bool, KafkaError | None]:
        """Abort the open transaction: (fenced, fatal, error). An abort that cannot reach the
        broker is retried before the next write (``_abort_pending``)."""
        try:
            self.producer.abort_transaction(self.flush_timeout)
        except Exception as abort_exc:       # noqa: BLE001
            aerr = kafka_error(abort_exc)
            fenced = (aerr is not None and aerr.code() in FENCED_CODES) \
                or "fenced" in str(abort_exc).lower()
            fatal = not fenced and aerr is not None and aerr.fatal()
            if fenced or fatal:
                self._abort_pending = False
                return fenced, fatal, aerr
            self._abort_pending = True
            raise StateWriteError(f"state {key!r}: the failed transaction could not be aborted "
                                  f"yet ({abort_exc}); retried before the next write") from abort_exc
        self._abort_pending = False
        return False, False, err

    def _reinitialise(self, key: str, why) -> None:
        """Fatal, not fenced: a new producer with the same transactional.id (epoch bumped)."""
        log.warning("state %r: the transactional producer hit a fatal error (%s); re-creating it "
                    "with the same transactional.id", key, why)
        old = self.producer
        self.producer = self.producer_factory()      # may raise WriterFenced: stays fenced
        self.reinitialisations += 1
        self._abort_pending = False
        self._n_partitions = None
        try:
            old.flush(0)
        except Exception:                            # noqa: BLE001 - the old one is dead anyway
            pass
        raise WriterReinitialised(
            f"state {key!r}: transactional producer re-created after a fatal error ({why}); "
            "nothing of this write is committed; re-validate before writing again")

    def _write(self, key: str, payload: bytes, meta: dict | None = None, gc: bool = True) -> int:
        check_key(key)
        payload = bytes(payload) if not isinstance(payload, bytes) else payload
        meta = {} if meta is None else meta
        if key not in self._known:     # learn its generations and debris on the topic first
            self._learn(key)
        known = self._known.setdefault(key, _Known())
        partition = partition_for(key, self._partitions())
        generation = max(known.max_generation + 1, int(self._clock()))
        n_chunks = (len(payload) + self.chunk_bytes - 1) // self.chunk_bytes
        manifest = dumps({
            "kind": MANIFEST_KIND, "v": VERSION, "key": key, "generation": generation,
            "n_chunks": n_chunks, "sha256": hashlib.sha256(payload).hexdigest(),
            "size": len(payload), "meta": meta, "created_at": time.time(),
        })
        if len(manifest) > MAX_MANIFEST_BYTES:
            raise ValueError(f"state manifest of {len(manifest)} bytes exceeds {MAX_MANIFEST_BYTES}; "
                             "keep meta small and put data in the payload")
        try:  # readers decode with strict_map_key: reject meta they could not read
            loads(manifest, max_bytes=MAX_MANIFEST_BYTES)
        except SchemaError as exc:
            raise ValueError(f"meta is not readable back ({exc}); use str map keys") from exc
        known.max_generation = generation

        chunks = _Deliveries()
        view = memoryview(payload)
        for i in range(n_chunks):
            known.live_chunks.add((generation, i))  # tombstoned later even if this write fails
            data = view[i * self.chunk_bytes:(i + 1) * self.chunk_bytes]
            self._produce(chunks, chunk_key(key, generation, i), dumps({
                "kind": CHUNK_KIND, "v": VERSION, "key": key, "generation": generation,
                "index": i, "n_chunks": n_chunks, "data": data}), partition)
        self._confirm(chunks, f"state {key!r} generation {generation}: chunks (no manifest written)")

        man = _Deliveries()
        self._produce(man, manifest_key(key), manifest, partition)
        self._confirm(man, f"state {key!r} generation {generation}: manifest "
                           "(may or may not have been written)")

        if gc:
            self._collect_garbage(key, generation, partition)
        return generation

    def _learn(self, key: str) -> None:
        """Learn ``key``'s generations and debris once, before its first write (as for every
        key: later writes do not read again). A prefix read that covers the key (a sketcher's
        restore reads ``sketch/<topic>/`` before its first checkpoint) was that learning: a
        key it did not find had no record then. Otherwise a read of the key. Issue 24: with
        24 fresh partitions each first checkpoint read from the beginning of the state topic
        every state written before it (quadratic in the partitions: gigabytes at 37 MB each)."""
        if any(kind == "prefix" and key.startswith(prefix) for kind, prefix in self._views):
            self._known.setdefault(key, _Known())
        else:
            self.read_latest(key)

    def _collect_garbage(self, key: str, generation: int, partition: int) -> None:
        known = self._known[key]
        stale = sorted(c for c in known.live_chunks if c[0] != generation)
        if not stale:
            return
        tomb = _Deliveries()
        try:
            for gen, idx in stale:
                self._produce(tomb, chunk_key(key, gen, idx), None, partition)
            self._confirm(tomb, f"state {key!r}: tombstones for {len(stale)} stale chunks")
        except StateStoreError as exc:  # the state is committed; retry next write
            log.warning("%s", exc)
            return
        known.live_chunks.difference_update(stale)

    def delete(self, key: str) -> None:
        """Tombstone every record of ``key`` (chunks first, manifest last)."""
        check_key(key)
        self.read_latest(key)
        known = self._known.setdefault(key, _Known())
        partition = partition_for(key, self._partitions())
        tomb = _Deliveries()
        for gen, idx in sorted(known.live_chunks):
            self._produce(tomb, chunk_key(key, gen, idx), None, partition)
        self._produce(tomb, manifest_key(key), None, partition)
        self._confirm(tomb, f"state {key!r}: delete")
        known.live_chunks.clear()

    # ----------------------------------------------------------------- read
    def read_latest(self, key: str) -> StateRecord | None:
        """``(payload, meta, generation)`` of the newest complete state of ``key``, or None."""
        check_key(key)
        return self._scan(("key", key)).get(key)

    def read_all_latest(self, prefix: str = "") -> dict[str, StateRecord]:
        """Newest complete state of every key starting with ``prefix``."""
        return self._scan(("prefix", prefix))

    def _scan(self, spec: tuple[str, str]) -> dict[str, StateRecord]:
        """The fold of the whole topic for the keys ``spec`` selects, read to the end.

        Incremental (the default): one :class:`_View` per spec is kept, and each read folds
        only the records past the view's positions — the same fold, in the same per-partition
        order, as a read from the beginning (keys never span partitions), so the result is
        the same while the cost of a read no longer grows with the topic's history (issue 13).
        A view whose positions no longer fit the log (its start moved past them: the topic was
        truncated) is dropped and rebuilt from the beginning; records delivered again (offsets
        below the position, after a client re-fetch) are skipped, being folded already. A
        state topic deleted and re-created under a running service is not detected here (its
        offsets restart); the release service's ledger check refuses it at the next start.
        """
        kind, arg = spec
        want = (lambda k: k == arg) if kind == "key" else (lambda k: k.startswith(arg))
        if not self.incremental:
            view = _View(StateScan(want))
            self._catch_up(view)
        else:
            view = self._views.get(spec)
            if view is None:
                view = self._views[spec] = _View(StateScan(want))
            try:
                self._catch_up(view)
            except _ViewInvalid as exc:
                log.warning("state topic %r: %s; reading it again from the beginning", self.topic, exc)
                view = self._views[spec] = _View(StateScan(want))
                self._catch_up(view)
        for key, ks in view.scan.keys.items():
            known = self._known.setdefault(key, _Known())
            known.max_generation = max(known.max_generation, ks.max_generation)
            known.live_chunks |= ks.live_chunks
        return view.scan.result()

    def _catch_up(self, view: "_View") -> None:
        """Fold every record past ``view``'s positions up to the end of every partition."""
        scan, nxt = view.scan, view.next
        deadline = time.monotonic() + self.read_timeout
        consumer = self._consumer_factory()
        try:
            md = consumer.list_topics(timeout=self.read_timeout)
            t = md.topics.get(self.topic)
            if t is None or t.error is not None:
                raise StateTopicMissing(f"state topic {self.topic!r} does not exist "
                                        f"({t.error if t is not None else 'not in metadata'}): "
                                        + _CREATE_TOPICS)
            # Lower bounds of the end offsets. Tansu answers ListOffsets(latest)
            # with "base offset of the last batch + 1", short of the true end
            # when that batch holds several records, so the end is established
            # from fetch responses instead: a partition is finished when the
            # consumer has reached the high watermark (or, read_committed, the
            # last stable offset) of a fetch response — the PARTITION_EOF event,
            # or position >= the cached fetch watermark for factories without
            # enable.partition.eof — and is past the lower bound. A partition whose
            # reported end is not past the view's position has no new batch (a new
            # batch's base offset is at least the position) and is not read.
            ends: dict[int, int] = {}
            for p in sorted(t.partitions):
                lo, hi = consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                        timeout=max(0.1, deadline - time.monotonic()))
                if p in nxt and lo > nxt[p]:
                    raise _ViewInvalid(f"partition {p} now starts at offset {lo}, past the "
                                       f"position {nxt[p]} read so far")
                if hi > nxt.get(p, lo):
                    ends[p] = hi
            active = set(ends)
            if active:
                consumer.assign([TopicPartition(self.topic, p, nxt.get(p, OFFSET_BEGINNING))
                                 for p in active])
            while active:
                if time.monotonic() > deadline:
                    raise StateReadError(
                        f"could not read state topic {self.topic!r} to its end offsets within "
                        f"{self.read_timeout:.0f} s (partitions {sorted(active)} unfinished)")
                msg = consumer.poll(0.2)
                if msg is not None:
                    p = msg.partition()
                    err = msg.error()
                    if err is None:
                        if msg.offset() < nxt.get(p, 0):
                            # delivered again (the client re-fetched after a fetch error):
                            # already folded, and a fold is not idempotent (tombstones)
                            log.debug("state topic %r partition %d: offset %d again (read up to "
                                      "%d)", self.topic, p, msg.offset(), nxt[p])
                            continue
                        scan.add(msg.key(), msg.value())
                        nxt[p] = msg.offset() + 1        # folded exactly once, even if we stop
                    elif err.code() == KafkaError._PARTITION_EOF:
                        if p in active and msg.offset() >= ends[p]:
                            self._done(consumer, active, p)
                    elif err.fatal():
                        raise StateReadError(f"reading {self.topic!r}: {err}")
                    else:
                        log.debug("reading %r: %s", self.topic, err)
                for tp in consumer.position([TopicPartition(self.topic, q) for q in active]):
                    if tp.offset >= ends[tp.partition]:
                        _, fetched_hi = consumer.get_watermark_offsets(tp, cached=True)
                        if 0 <= fetched_hi <= tp.offset:
                            self._done(consumer, active, tp.partition)
        finally:
            consumer.close()

    def _done(self, consumer: Consumer, active: set[int], partition: int) -> None:
        if partition in active:
            active.discard(partition)
            consumer.pause([TopicPartition(self.topic, partition)])

    def close(self) -> None:
        """Flush (and, if owned, release) the producer."""
        self.producer.flush(self.flush_timeout)
        if self._owns_producer:
            self._owns_producer = False
            close = getattr(self.producer, "close", None)  # confluent-kafka >= 2.x
            if close is not None:
                close()

    def __enter__(self) -> "StateStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
