"""Helpers for ``tests/test_crash_consistency.py``: sketcher subprocesses, a corpus with
every kind of record, reading topics back, and the clean in-process reference.

The reference is deliberately computed without the service's own state machinery
(:class:`PartitionState`, ``Routing``, checkpoints): documents are decoded with the
public input pipeline (``messages.decode_document`` / ``documents_to_counts``), routed
by the rule as documented in ``docs/services.md`` (re-implemented here) and sketched
with :class:`WarmupSketch` / :class:`WhitenedSketch` directly.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from streamdp import messages
from streamdp.kafka.state_store import StateStore, parse_kafka_key
from streamdp.kafka.topics import client_config
from streamdp.moments.sketch import WhitenedSketch
from streamdp.serialization import loads
from streamdp.services import control, public_records
from streamdp.services.state_auth import for_config
from streamdp.services.config import ServiceConfig
from streamdp.services.demo_corpus import sample_texts
from streamdp.services.partition_state import PartitionState, state_key
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupSketch

LATE = -1
WHITENED_ACCUMULATORS = ("m1", "zacc", "a2", "b3", "a3", "t3")
WARMUP_ACCUMULATORS = ("yacc", "a2")


def wait_for(pred, timeout: float, what: str, *, interval: float = 0.1, check=None):
    """Poll ``pred`` until truthy (returned) or fail after ``timeout`` s; ``check()`` may raise."""
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# ------------------------------------------------------------------ sketcher processes
class SketcherProcess:
    """``python -m streamdp sketcher --config <json>`` with its log in a file."""

    def __init__(self, cfg: ServiceConfig, workdir: Path, name: str, *, script: str | None = None,
                 marker: Path | None = None):
        """``script``: instead of the CLI, run this Python source (saved in ``workdir``) as
        ``python <script> <config json> <marker>``, with this checkout on ``PYTHONPATH`` — for
        sketchers that patch a step to crash or stop at it."""
        self.name = name
        self.cfg_path = Path(workdir) / f"{name}.json"
        self.log_path = Path(workdir) / f"{name}.log"
        self.cfg_path.write_text(json.dumps(cfg_to_json(cfg)))
        self._log = open(self.log_path, "w")
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMDP_")}
        if script is None:
            argv = [sys.executable, "-m", "streamdp", "sketcher", "--config", str(self.cfg_path),
                    "--log-level", "INFO"]
        else:
            path = Path(workdir) / f"{name}_script.py"
            path.write_text(script)
            env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                 env.get("PYTHONPATH", "")])
            argv = [sys.executable, str(path), str(self.cfg_path), str(marker)]
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, n: int = 25) -> str:
        return f"--- {self.name} (pid {self.pid}, rc {self.proc.poll()}) log tail:\n" + \
            "\n".join(self.log().splitlines()[-n:])

    def assignments(self) -> list[list[int]]:
        """Every ``assigned [...]`` the process logged, in order."""
        return [json.loads(m) for m in re.findall(r": assigned (\[[0-9, ]*\])", self.log())]

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"sketcher {self.name} exited unexpectedly\n{self.tail()}")

    def wait_assigned(self, count: int = 1, timeout: float = 45.0) -> list[int]:
        wait_for(lambda: len(self.assignments()) >= count, timeout,
                 f"{self.name} to log assignment #{count}", interval=0.05, check=self.check_alive)
        return self.assignments()[count - 1]

    def documents_processed(self) -> float | None:
        """Documents this process added to its sketches (its /metrics), None if unreachable."""
        import urllib.request
        m = re.search(r"metrics on (http://[0-9.:]+)", self.log())
        if m is None:
            return None
        try:
            with urllib.request.urlopen(m.group(1) + "/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return None
        return sum(float(v) for v in re.findall(r"^streamdp_documents_total\{[^}]*\} (\S+)$", text, re.M))

    def wait_processed(self, n: int, timeout: float = 20.0) -> float:
        """Wait until the process has sketched ``n`` documents (or ``timeout``: input exhausted)."""
        deadline = time.monotonic() + timeout
        got = 0.0
        while time.monotonic() < deadline:
            self.check_alive()
            got = self.documents_processed() or 0.0
            if got >= n:
                break
            time.sleep(0.02)
        return got

    def kill(self) -> None:
        """SIGKILL: no checkpoint, no group leave, nothing flushed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM: checkpoint, leave the group, exit; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        finally:
            self._log.close()
        return rc

    def ensure_dead(self) -> None:
        """For ``finally``: kill this process (by its own pid) if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        if not self._log.closed:
            self._log.close()


def cfg_to_json(cfg: ServiceConfig) -> dict:
    import dataclasses
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


# ------------------------------------------------------------------ corpus
@dataclass
class Corpus:
    records: list            # (id, record ts, raw value) in record-timestamp order
    vocabulary: list[str]
    stream_start: float
    epoch_seconds: float
    n_epochs: int
    kinds: dict = field(default_factory=dict)   # how many of each special kind


def make_corpus(n_warmup: int, n_stream: int, n_epochs: int, *, seed: int, n_stale: int = 12,
                stream_start: float = 1_700_000_000.0, epoch_seconds: float = 600.0) -> Corpus:
    """Warm-up then stream documents in record-time order, every kind of record a sketcher
    sees: text / tokens / counts documents, unknown words, too-short documents, late
    documents (event time in an epoch that ended before their record time), bad records
    that go to the dead-letter topic (garbage bytes, counts outside the vocabulary), and
    ``n_stale`` out-of-order warm-up documents (event *and* record time before
    ``stream_start``) among the first stream documents: warm-up by the routing rule, but
    late once the warm-up is closed (the subspace released).

    Times are multiples of 1/8 s, so the record timestamp (ms) is exactly the event time.
    """
    rng = np.random.default_rng(seed)
    n = n_warmup + n_stream
    texts, _, vocab = sample_texts(n, seed=seed, mean_length=25)
    index = {w: i for i, w in enumerate(vocab)}
    d = len(vocab)
    warm_ts = stream_start - (n_warmup - np.arange(n_warmup)) * 0.125
    stream_ts = stream_start + np.sort(rng.integers(0, int(n_epochs * epoch_seconds * 8), n_stream)) / 8.0
    ts_all = np.concatenate([warm_ts, stream_ts])
    kinds = {"garbage": 0, "bad_counts": 0, "short": 0, "unknown": 0, "late": 0}
    records = []
    for i, (text, ts) in enumerate(zip(texts, ts_all)):
        ts = float(ts)
        doc_id = f"doc-{seed}-{i}"
        u = rng.random()
        doc_ts = ts
        if i >= n_warmup + 50 and u < 0.01:          # late: event time one epoch earlier
            e = math.floor((ts - stream_start) / epoch_seconds) + 1
            if e >= 2:
                doc_ts = ts - epoch_seconds
                kinds["late"] += 1
        if u > 0.995:
            raw = b"\xc1 not msgpack " + doc_id.encode()
            kinds["garbage"] += 1
        elif u > 0.99:
            raw = messages.encode_document(doc_id, doc_ts, counts={d + 3: 2, 0: 1})
            kinds["bad_counts"] += 1
        elif u > 0.98:
            raw = messages.encode_document(doc_id, doc_ts, text=" ".join(text.split()[:2]))
            kinds["short"] += 1
        elif u > 0.96:
            raw = messages.encode_document(doc_id, doc_ts, text=text + " zyzzyva quux frobnicate")
            kinds["unknown"] += 1
        elif i % 3 == 0:
            raw = messages.encode_document(doc_id, doc_ts, text=text)
        elif i % 3 == 1:
            raw = messages.encode_document(doc_id, doc_ts, tokens=text.split())
        else:
            ids, cnt = np.unique([index[w] for w in text.split()], return_counts=True)
            raw = messages.encode_document(doc_id, doc_ts, counts=(ids.tolist(), cnt.tolist()))
        records.append((doc_id, ts, raw))
    kinds["stale_warmup"] = n_stale
    for j in range(n_stale):
        i = n_warmup + 20 + 15 * j
        doc_id, ts = f"stale-{seed}-{j}", stream_start - 1000.0 + j
        records.insert(i, (doc_id, ts, messages.encode_document(doc_id, ts, text=texts[j])))
    return Corpus(records, vocab, stream_start, epoch_seconds, n_epochs, kinds)


def random_subspace(d: int, k: int, seed: int) -> Subspace:
    rng = np.random.default_rng(seed)
    Q, R = np.linalg.qr(rng.standard_normal((d, k)))
    return Subspace(Q * np.sign(np.diag(R)), provenance={"test": "crash-consistency"})


def publish_subspace(bootstrap: str, names, sub: Subspace, clip, vocabulary_id: str,
                     *, announce: bool) -> None:
    """What the release service does when it closes the warm-up (record, then announcement)."""
    store = StateStore(None, bootstrap, names.state)
    try:
        # what sketchers read: the public subspace record, signed with the non-production key
        auth = for_config(SimpleNamespace(control_key_file="", non_production=True,
                                          topic_prefix=names.documents.rsplit(".", 1)[0]))
        public_records.write(store, auth, public_records.SUBSPACE_KEY, sub.to_bytes(),
                             {"clip": clip.to_dict(), "subspace_id": sub.id,
                              "vocabulary_id": vocabulary_id})
    finally:
        store.close()
    if announce:
        p = Producer(client_config(bootstrap, "producer"))
        p.produce(names.control, value=control.encode("subspace_ready", subspace_id=sub.id), partition=0)
        assert p.flush(30) == 0


# ------------------------------------------------------------------ reading topics back
@dataclass(frozen=True)
class Rec:
    partition: int
    offset: int
    rt: float                 # record timestamp, seconds
    value: bytes | None
    key: bytes | None = None
    headers: tuple = ()


def read_topic(bootstrap: str, topic: str, expected: int | None = None, timeout: float = 60.0
               ) -> dict[int, list[Rec]]:
    """Every record of ``topic`` by partition, in offset order (to PARTITION_EOF on every
    partition: Tansu's ListOffsets under-reports, fetch responses do not)."""
    c = Consumer(client_config(bootstrap, "consumer", **{
        "group.id": f"crash-test-reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "enable.partition.eof": True, "auto.offset.reset": "earliest"}))
    try:
        md = c.list_topics(topic, timeout=20)
        parts = sorted(md.topics[topic].partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: dict[int, list[Rec]] = {p: [] for p in parts}
        at_eof: set[int] = set()
        deadline = time.monotonic() + timeout
        while True:
            n = sum(map(len, out.values()))
            if at_eof == set(parts) and (expected is None or n >= expected):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic}: {n} records (expected {expected}) "
                                     f"after {timeout:.0f} s; at EOF: {sorted(at_eof)}")
            for m in c.consume(10_000, 0.5):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        at_eof.add(m.partition())
                        continue
                    raise AssertionError(f"reading {topic}: {m.error()}")
                at_eof.discard(m.partition())
                out[m.partition()].append(Rec(m.partition(), m.offset(), m.timestamp()[1] / 1000.0,
                                              m.value(), m.key(), tuple(m.headers() or ())))
    finally:
        c.close()
    for p, recs in out.items():
        assert [r.offset for r in recs] == list(range(len(recs))), f"offsets of partition {p} have gaps"
    return out


def committed_offsets(bootstrap: str, group: str, topic: str, partitions) -> dict[int, int]:
    """The group's committed offsets (the sketcher commits its checkpoint's next_offset)."""
    c = Consumer(client_config(bootstrap, "consumer", **{"group.id": group, "enable.auto.commit": False}))
    try:
        tps = c.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def read_states(bootstrap: str, names, subspace: Subspace | None) -> dict[int, PartitionState]:
    store = StateStore(None, bootstrap, names.state)
    try:
        found = store.read_all_latest(prefix=f"sketch/{names.documents}/")
    finally:
        store.close()
    out = {}
    for key, rec in found.items():
        st = PartitionState.from_bytes(rec.payload, subspace)
        assert key == state_key(names.documents, st.partition)
        out[st.partition] = st
    return out


def state_topic_debris(bootstrap: str, state_topic: str) -> dict[str, int]:
    """Count, on the (uncompacted, on Tansu) state topic, state writes of the sketchers and
    the generations whose chunks are there without a manifest (writes a SIGKILL tore).
    Only for the report: a torn write must never become a torn *read*."""
    chunk_gens: set[tuple[str, int]] = set()
    manifest_gens: set[tuple[str, int]] = set()
    for recs in read_topic(bootstrap, state_topic).values():
        for r in recs:
            parsed = parse_kafka_key(r.key.decode()) if r.key else None
            if parsed is None or r.value is None or not parsed[0].startswith("sketch/"):
                continue
            key, kind, gen, _ = parsed
            if kind == "chunk":
                chunk_gens.add((key, gen))
            else:
                manifest_gens.add((key, loads(r.value)["generation"]))
    return {"state_writes": len(manifest_gens), "torn_writes": len(chunk_gens - manifest_gens)}


# ------------------------------------------------------------------ the clean reference
def route(ts: float, rt: float, cfg: ServiceConfig) -> int:
    """The routing rule of docs/services.md, re-implemented (0 warm-up, e >= 1 epoch, -1 late)."""
    ss, L = float(cfg.stream_start), float(cfg.epoch_seconds)
    if ts < ss:
        return 0 if rt < ss else LATE
    e = math.floor((ts - ss) / L) + 1
    return e if rt < ss + e * L + cfg.lateness else LATE


@dataclass
class Decoded:
    """One partition's records, decoded once by the public input pipeline."""

    recs: list                 # Rec, offset order
    good: list                 # (offset, rt, route, row) per valid document, offset order
    bad_offsets: list          # offsets of records that must be dead-lettered
    X: object                  # csr (n_good, d): counts of the valid documents
    n_tokens: np.ndarray
    n_unknown: np.ndarray

    @property
    def end(self) -> int:
        return len(self.recs)

    def first_stream_offset(self) -> int:
        """Where a sketcher without the subspace pauses: the first valid on-time stream document."""
        return next(off for off, _, r, _ in self.good if r > 0)


def decode_partition(recs: list, cfg: ServiceConfig, vocabulary, tokenizer) -> Decoded:
    good_docs, good_recs, bad = [], [], []
    for r in recs:
        try:
            if r.value is None:
                raise messages.InvalidMessage(messages.MALFORMED_MSGPACK, "null")
            doc = messages.decode_document(r.value, max_bytes=cfg.max_document_bytes,
                                           max_tokens=cfg.max_document_tokens)
            if doc.ts > r.rt + cfg.max_future_seconds:
                raise messages.InvalidMessage(messages.INVALID_VALUE, "future")
        except messages.InvalidMessage:
            bad.append(r.offset)
            continue
        good_docs.append(doc)
        good_recs.append(r)
    cb = messages.documents_to_counts(good_docs, tokenizer, vocabulary,
                                      max_tokens=cfg.max_document_tokens)
    bad += [good_recs[i].offset for i, _ in cb.errors]
    good = []
    for row, i in enumerate(cb.index):
        r = good_recs[i]
        good.append((r.offset, r.rt, route(float(cb.timestamps[row]), r.rt, cfg), row))
    return Decoded(recs, good, sorted(bad), cb.counts, cb.n_tokens, cb.n_unknown)


@dataclass
class Reference:
    next_offset: int
    progress: float
    counters: dict
    warmup: WarmupSketch | None
    epochs: dict


def reference_state(dec: Decoded, cfg: ServiceConfig, *, upto: int | None = None,
                    warmup_closed_at: int | None, keep_warmup: bool, subspace: Subspace | None = None,
                    clip=None, per_document: bool = False, drop_offsets=(),
                    progress: float | None = None) -> Reference:
    """The state a clean run must reach after the records with offset < ``upto``.

    ``warmup_closed_at``: the offset from which the subspace is out, so warm-up documents
    are late (None: never; 0: from the start); before it they go into the warm-up sketch.
    ``keep_warmup``: whether the state still holds the warm-up sketch.
    ``per_document``: update the sketches one document at a time (the summation order of
    a sketcher with ``batch_size=1``), else in one batch. ``drop_offsets``: pretend these
    documents were lost (the sanity check that the comparison notices one document).
    """
    upto = dec.end if upto is None else upto
    d = dec.X.shape[1]
    counters = {"documents": 0, "warmup_documents": 0, "tokens": 0, "unknown_tokens": 0,
                "late": 0, "empty": 0, "dlq": sum(1 for o in dec.bad_offsets if o < upto)}
    rows_by_route: dict[int, list[int]] = {}
    lengths = np.asarray(dec.X.sum(axis=1)).ravel()
    for off, rt, r, row in dec.good:
        if off >= upto or off in drop_offsets:
            continue
        counters["tokens"] += int(dec.n_tokens[row])
        counters["unknown_tokens"] += int(dec.n_unknown[row])
        if r != LATE and lengths[row] < 3:
            counters["empty"] += 1
        if r == LATE or (r == 0 and warmup_closed_at is not None and off >= warmup_closed_at):
            counters["late"] += 1
            continue
        counters["warmup_documents" if r == 0 else "documents"] += 1
        rows_by_route.setdefault(r, []).append(row)

    def sketch(sk, rows):
        if per_document:
            for row in rows:
                sk.update(dec.X[row:row + 1])
        elif rows:
            sk.update(dec.X[rows])
        return sk

    warmup = None
    if keep_warmup and 0 in rows_by_route:
        warmup = sketch(WarmupSketch(d, cfg.k_prime(d), clip=cfg.warmup_clip, seed=cfg.seed),
                        rows_by_route[0])
    epochs = {e: sketch(WhitenedSketch(subspace, clip), rows)
              for e, rows in sorted(rows_by_route.items()) if e > 0}
    if progress is None:
        progress = max((r.rt for r in dec.recs[:upto]), default=-math.inf)
    return Reference(upto, progress, counters, warmup, epochs)


# ------------------------------------------------------------------ comparison
def _close(a: np.ndarray, b: np.ndarray, rtol: float) -> bool:
    """Normwise relative: ‖a − b‖_F ≤ rtol · ‖b‖_F (exactly equal when rtol == 0)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    if rtol == 0:
        return a.tobytes() == b.tobytes()          # bit for bit
    return float(np.linalg.norm(a - b)) <= rtol * float(np.linalg.norm(b))


def rel_diff(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    nb = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / nb if nb else float(np.linalg.norm(a))


def flushed(sk):
    """A copy of a sketch with its pending rows processed (its final chunk): the accumulators
    then hold every document, as the sums read from it do (``None`` stays ``None``)."""
    if sk is None:
        return None
    out = sk.copy()
    out._flush_pending()
    return out


def compare(got: PartitionState, ref: Reference, *, rtol: float) -> list[str]:
    """Every difference between a sketcher's state and the reference (empty = equal).

    Offsets, progress, counters, document counts, clip counts and the norm histogram are
    compared exactly; floating-point sums within ``rtol`` (normwise), bit for bit if 0.
    """
    bad = []
    if got.next_offset != ref.next_offset:
        bad.append(f"next_offset {got.next_offset} != {ref.next_offset}")
    if got.progress != ref.progress:
        bad.append(f"progress {got.progress!r} != {ref.progress!r}")
    if dict(got.counters) != ref.counters:
        bad.append(f"counters {dict(got.counters)} != {ref.counters}")
    if (got.warmup is None) != (ref.warmup is None):
        bad.append(f"warm-up sketch present: {got.warmup is not None}, expected {ref.warmup is not None}")
    elif got.warmup is not None:
        g, r = flushed(got.warmup), flushed(ref.warmup)
        for name in ("n_docs", "n_clipped"):
            if getattr(g, name) != getattr(r, name):
                bad.append(f"warm-up {name} {getattr(g, name)} != {getattr(r, name)}")
        if not np.array_equal(g.norm_hist, r.norm_hist):
            bad.append("warm-up norm histogram differs")
        for name in WARMUP_ACCUMULATORS:
            if not _close(getattr(g, name), getattr(r, name), rtol):
                bad.append(f"warm-up {name}: relative difference {rel_diff(getattr(g, name), getattr(r, name)):.3g}")
    if sorted(got.epochs) != sorted(ref.epochs):
        bad.append(f"epochs {sorted(got.epochs)} != {sorted(ref.epochs)}")
    for e in sorted(set(got.epochs) & set(ref.epochs)):
        g, r = flushed(got.epochs[e]), flushed(ref.epochs[e])
        for name in ("n_docs", "n_clipped"):
            if getattr(g, name) != getattr(r, name):
                bad.append(f"epoch {e} {name} {getattr(g, name)} != {getattr(r, name)}")
        if not _close(np.array([g.weight_sum]), np.array([r.weight_sum]), rtol):
            bad.append(f"epoch {e} weight_sum {g.weight_sum!r} != {r.weight_sum!r}")
        for name in WHITENED_ACCUMULATORS:
            if not _close(getattr(g, name), getattr(r, name), rtol):
                bad.append(f"epoch {e} {name}: relative difference {rel_diff(getattr(g, name), getattr(r, name)):.3g}")
    return bad


def sums_differ_everywhere(a: Reference, b: Reference, rtol: float) -> list[str]:
    """Which float sums of ``a`` are NOT within ``rtol`` of ``b`` (for the sanity check that
    one document more or less is visible in the sums themselves, not only in the counts)."""
    out = []
    if a.warmup is not None and b.warmup is not None:
        wa, wb = flushed(a.warmup), flushed(b.warmup)
        out += [f"warm-up {n}" for n in WARMUP_ACCUMULATORS
                if not _close(getattr(wa, n), getattr(wb, n), rtol)]
    for e in set(a.epochs) & set(b.epochs):
        ea, eb = flushed(a.epochs[e]), flushed(b.epochs[e])
        out += [f"epoch {e} {n}" for n in WHITENED_ACCUMULATORS
                if not _close(getattr(ea, n), getattr(eb, n), rtol)]
    return out


def kill_during_checkpoint(p: SketcherProcess, bootstrap: str, state_topic: str,
                           timeout: float = 10.0) -> str:
    """SIGKILL ``p`` the moment the first chunk of one of its checkpoints reaches the state
    topic: before, during or just after the rest of that state write (chunks, manifest,
    tombstones), whichever the race gives. A process with nothing left to checkpoint is
    killed after ``timeout`` anyway (and the returned description says so)."""
    from confluent_kafka import OFFSET_END
    c = Consumer(client_config(bootstrap, "consumer", **{
        "group.id": f"crash-test-watch-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "fetch.wait.max.ms": 2, "fetch.error.backoff.ms": 5}))
    try:
        parts = sorted(c.list_topics(state_topic, timeout=10).topics[state_topic].partitions)
        since_ms = time.time() * 1000.0 - 5.0
        c.assign([TopicPartition(state_topic, q, OFFSET_END) for q in parts])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            p.check_alive()
            m = c.poll(0.002)
            if m is None or m.error() is not None or m.value() is None or m.key() is None:
                continue
            parsed = parse_kafka_key(m.key().decode())
            # older records can show up first: Tansu's ListOffsets(latest) under-reports
            if parsed and parsed[1] == "chunk" and parsed[0].startswith("sketch/") \
                    and m.timestamp()[1] >= since_ms:
                p.kill()
                return f"SIGKILL on seeing chunk {m.key().decode()!r}"
        p.kill()
        return f"SIGKILL after {timeout:.0f} s without a checkpoint (nothing left to do?)"
    finally:
        c.close()


# ------------------------------------------------------------------ release service kill points
#: Named points of one release (spend protocol, streamdp/privacy/spend.py) at which
#: :class:`ReleaseProcess` SIGKILLs itself, for the release of ``what`` ("tree:epoch=<t>" or
#: "warmup"):
#:   after_reserve  - the reservation is durable on the ledger, no noise drawn yet
#:   after_noise    - noise drawn and the snapshot decomposed, nothing persisted (tree only)
#:   after_persist  - the release state / subspace is on Kafka, the ledger not yet committed
#:   after_commit   - committed on the ledger, nothing published yet
#:   before_post_process - the draw is persisted, its post-processing not started (tree: the
#:                    decomposition; warm-up: the orthonormalisation)
#:   after_publish  - the snapshot is published, ``epochs_closed`` not yet sent (tree only)
KILL_POINTS = ("after_reserve", "after_noise", "after_persist", "after_commit",
               "before_post_process", "after_publish")

RELEASE_KILLER = r'''
import json, os, signal, sys
from pathlib import Path

cfg_values, point, what, marker = (json.loads(Path(sys.argv[1]).read_text()), sys.argv[2],
                                   sys.argv[3], Path(sys.argv[4]))
epoch = int(what.split("=")[1]) if what.startswith("tree:epoch=") else 0

def die(where):
    marker.write_text(where)
    os.kill(os.getpid(), signal.SIGKILL)

from streamdp.continual import ContinualRelease
from streamdp.kafka.state_store import StateStore
from streamdp.privacy.accountant import Accountant
from streamdp.privacy.spend import SpendSession
from streamdp.services import control
from streamdp.services import release as rel

def wrap(cls, name, after):
    original = getattr(cls, name)
    def method(self, *a, **kw):
        out = original(self, *a, **kw)
        after(self, out, *a, **kw)
        return out
    setattr(cls, name, method)

if point == "after_reserve":
    wrap(Accountant, "reserve", lambda self, tok, *a, **kw: tok.id == what and die(point))
elif point == "after_noise":
    wrap(ContinualRelease, "draw_epoch", lambda self, out, *a, **kw: self.epoch == epoch and die(point))
elif point == "before_post_process" and what == "warmup":
    # the warm-up's noised values are persisted (issue 23 item 4); die in the orthonormalisation
    # leaving the subspace this draw gives, for the test to compare with the restart's
    import numpy as np
    import streamdp.whitening.warmup as warmup_mod
    original_basis = warmup_mod.orthonormal_basis
    def orthonormal_basis(Y):
        np.save(str(marker) + ".Q.npy", original_basis(Y))
        die(point)
    warmup_mod.orthonormal_basis = orthonormal_basis
elif point == "before_post_process":
    # the draw is persisted (issue 23 item 4); die before any post-processing, leaving the
    # noised count of the draw for the test to find in the restarted service's snapshot
    original_post = ContinualRelease.post_process
    def post_process(self):
        if self.epoch == epoch:
            Path(str(marker) + ".count").write_text(repr(float(self.pending[0].sketch.count)))
            die(point)
        return original_post(self)
    ContinualRelease.post_process = post_process
elif point in ("after_persist", "after_commit"):
    key = {"warmup": control.SUBSPACE_KEY, "vocabulary": control.VOCABULARY_KEY}.get(
        what, control.RELEASE_STATE_KEY)
    hit = []
    def persisted(self, out, k, payload, meta=None):
        if k == key and (meta or {}).get("epoch", 0) == epoch:
            if point == "after_persist":
                die(point)
            hit.append(k)
    wrap(StateStore, "write", persisted)
    wrap(SpendSession, "persisted", lambda self, out: hit and die(point))
elif point == "after_publish":
    # _publish is a new release's (a restart republishes the persisted one through the sinks)
    wrap(rel.ReleaseService, "_publish", lambda self, out, snap: snap.epoch == epoch and die(point))
else:
    raise SystemExit(f"unknown kill point {point}")

from streamdp.services.config import ServiceConfig
_svc = rel.ReleaseService(ServiceConfig(**cfg_values))
Path(str(marker) + ".ready").write_text("ready")
_svc.run(max_seconds=150, install_signals=True)
sys.exit(3)                                            # not killed: the test fails
'''


class ReleaseProcess:
    """A release service subprocess that SIGKILLs itself at ``point`` of the release of
    ``what`` (see :data:`KILL_POINTS`); ``killed_at()`` reads which point it reached."""

    def __init__(self, cfg: ServiceConfig, workdir: Path, point: str, what: str, name: str = "release"):
        workdir = Path(workdir)
        self.cfg_path = workdir / f"{name}.json"
        self.cfg_path.write_text(json.dumps(cfg_to_json(cfg)))
        self.script = workdir / f"{name}_killer.py"
        self.script.write_text(RELEASE_KILLER)
        self.marker = workdir / f"{name}.killed"
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "w")
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMDP_")}
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                             env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen([sys.executable, str(self.script), str(self.cfg_path), point,
                                      what, str(self.marker)],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        return Path(str(self.marker) + ".ready").exists() or self.proc.poll() is not None

    def killed_at(self) -> str | None:
        return self.marker.read_text() if self.marker.exists() else None

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is not None and not self._log.closed:
                self._log.close()

    def ensure_dead(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        if not self._log.closed:
            self._log.close()
