"""Helpers for tests/test_services.py: corpora, a threaded pipeline, topic readers, scrapes.

Everything here runs against the real embedded broker (the ``kafka_broker`` fixture).
"""
from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from streamdp import messages
from streamdp.kafka.topics import TopicNames, client_config, ensure_topics
from streamdp.services import control
from streamdp.services.config import ServiceConfig
from streamdp.services.demo_corpus import sample_texts
from streamdp.text.tokenizer import Tokenizer
from streamdp.text.vocabulary import Vocabulary

EPOCH_SECONDS = 3600.0


def default_stream_start() -> float:
    """Two days ago on an hour boundary: a replayed feed (record time = ts, never "future")."""
    return float(int(time.time() // 3600) * 3600 - 2 * 86400)


@dataclass
class Corpus:
    """Warm-up then stream documents as text, in timestamp order, with the true topics."""

    texts: list[str]
    topics: np.ndarray
    words: list[str]
    ts: np.ndarray
    n_warm: int
    n_stream: int
    epochs: int
    stream_start: float
    epoch_seconds: float = EPOCH_SECONDS
    _counts: object = field(default=None, repr=False)

    @property
    def vocabulary(self) -> Vocabulary:
        return Vocabulary(self.words)

    def record(self, i: int) -> dict:
        return {"id": f"doc-{i}", "ts": float(self.ts[i]), "text": self.texts[i]}

    def records(self) -> list[dict]:
        return [self.record(i) for i in range(len(self.texts))]

    def counts(self):
        """The CSR count rows of every document, exactly as a sketcher computes them."""
        if self._counts is None:
            docs = [messages.decode_document(messages.encode_document(f"doc-{i}", float(t), text=x))
                    for i, (t, x) in enumerate(zip(self.ts, self.texts))]
            cb = messages.documents_to_counts(docs, Tokenizer(), self.vocabulary)
            assert not cb.errors and cb.n_docs == len(self.texts)
            self._counts = cb
        return self._counts

    @property
    def warm_slice(self) -> slice:
        return slice(0, self.n_warm)

    @property
    def stream_slice(self) -> slice:
        return slice(self.n_warm, self.n_warm + self.n_stream)

    def epoch_end(self, e: int) -> float:
        return self.stream_start + e * self.epoch_seconds


def make_corpus(n_warm: int, n_stream: int, epochs: int, *, seed: int = 0,
                stream_start: float | None = None) -> Corpus:
    texts, topics, words = sample_texts(n_warm + n_stream, seed=seed)
    start = default_stream_start() if stream_start is None else float(stream_start)
    rng = np.random.default_rng(seed + 100)
    # warm-up strictly before stream_start (even after the ms rounding of record times),
    # stream spread over the epochs, away from the boundaries by construction of random floats
    warm = np.sort(start - 1.0 - 86_000.0 * rng.random(n_warm))
    stream = start + np.sort(rng.random(n_stream)) * epochs * EPOCH_SECONDS
    return Corpus(texts, topics, words, np.concatenate([warm, stream]), n_warm, n_stream, epochs,
                  start)


def fresh_topics(bootstrap: str) -> TopicNames:
    names = TopicNames.from_prefix(f"test.{uuid.uuid4().hex[:10]}")
    ensure_topics(bootstrap, names, partitions=2)
    return names


def make_config(tmp: Path, bootstrap: str, names: TopicNames, corpus: Corpus, **changes) -> ServiceConfig:
    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    vocab_path = tmp / "vocabulary.txt"
    corpus.vocabulary.save(vocab_path)
    values = dict(bootstrap=bootstrap, topic_prefix=names.documents.rsplit(".", 1)[0],
                  group_id=f"{names.documents}-sketchers", vocabulary=str(vocab_path),
                  n_topics=corpus.topics.shape[0], alpha0=1.0, epsilon=None, delta=1e-6,
                  horizon=corpus.epochs, sampler="fast", noise_seed=7, seed=0,
                  stream_start=corpus.stream_start, epoch_seconds=corpus.epoch_seconds,
                  ledger=str(tmp / "ledger.jsonl"), snapshot_dir=str(tmp / "snapshots"),
                  checkpoint_seconds=0.5, poll_seconds=0.2,
                  confirm_backfill=True,     # a replayed feed: stream_start is days ago
                  closing="operator")        # ... its epochs close by the tests' flush/close
    # Refinement off unless a test asks for it: these tests replay every document before the
    # first release, so none could be folded into a model, and they compare against the
    # engine's spectral path (tests/test_service_refinement.py runs the refined path).
    values["refinement"] = False
    # the synthetic corpus's own word list: public by assumption (the tests of
    # vocabulary_mode public/private say so by passing vocabulary_mode)
    values["vocabulary_public_by_assumption"] = True
    values.update(changes)
    if values.get("vocabulary_mode", "file") != "file":
        values.pop("vocabulary")
        values.pop("vocabulary_public_by_assumption")
    # the test harness opts in to non-private runs and reproducible noise in so many words
    values.setdefault("non_private", values.get("epsilon") is None)
    if values.get("noise_seed") is not None:
        values.setdefault("insecure_reproducible_noise", True)
        values.setdefault("non_production", True)
    cfg = ServiceConfig(**values)
    assert cfg.topics == names
    return cfg


# ------------------------------------------------------------------ waiting
def wait_for(pred, timeout: float, what: str, interval: float = 0.1, check=None):
    """Poll ``pred()`` until truthy (returned) or fail after ``timeout`` seconds.

    ``check()`` runs every round and may raise early (e.g. a service thread died).
    """
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# ------------------------------------------------------------------ pipeline
class Pipeline:
    """N sketchers and (optionally) a release service, each ``run`` in a daemon thread.

    Construct the release service before producing: with no saved release state
    its control consumer starts at the end of the control topic.
    """

    def __init__(self, cfg: ServiceConfig, *, sketchers: int = 2, release: bool = True) -> None:
        from streamdp.services.release import ReleaseService
        from streamdp.services.sketcher import Sketcher

        self.cfg = cfg
        self.errors: list[BaseException] = []
        self.release = ReleaseService(cfg) if release else None
        self.sketchers = []
        try:
            self.sketchers = [Sketcher(cfg, instance=f"sketcher-{i}") for i in range(sketchers)]
        except BaseException:
            if self.release is not None:
                self.release.close()
            raise
        self.threads: list[threading.Thread] = []

    def _target(self, fn):
        def run():
            try:
                fn(install_signals=False)
            except BaseException as exc:          # noqa: BLE001 — surfaced by check()
                self.errors.append(exc)
        return run

    def start(self) -> "Pipeline":
        for w in self.sketchers:
            self.threads.append(threading.Thread(target=self._target(w.run), daemon=True,
                                                 name=w.instance))
        if self.release is not None:
            self.threads.append(threading.Thread(target=self._target(self.release.run),
                                                 daemon=True, name="release"))
        for t in self.threads:
            t.start()
        return self

    def check(self) -> None:
        if self.errors:
            raise AssertionError(f"a service thread died: {self.errors[0]!r}") from self.errors[0]

    def stop(self, timeout: float = 30.0) -> None:
        for w in self.sketchers:
            w.stop()
        if self.release is not None:
            self.release.stop()
        for t in self.threads:
            t.join(timeout=timeout)
        alive = [t.name for t in self.threads if t.is_alive()]
        if not self.threads:          # never started: release the lease and the clients
            if self.release is not None:
                self.release.close()
            for w in self.sketchers:
                w.close()
        assert not alive, f"service threads did not stop: {alive}"

    def __enter__(self) -> "Pipeline":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_released(self, epoch: int, timeout: float = 90.0):
        """The snapshot of ``epoch`` (or later) once it is *published* (``release.published``,
        the sinks' record, which ``release.latest``, ``latest_json`` and the HTTP routes read)."""
        rel = self.release

        def published():
            pub = rel.published
            snap = pub[0] if pub is not None else None
            return snap is not None and snap.epoch is not None and snap.epoch >= epoch and snap

        return wait_for(published, timeout,
                        f"the release of epoch {epoch} (exhausted={rel.exhausted!r})",
                        check=self._check_release)

    def _check_release(self) -> None:
        self.check()
        if self.release.exhausted:
            raise AssertionError(f"release service stopped releasing: {self.release.exhausted}")


def send_control(bootstrap: str, names: TopicNames, type_: str, **fields) -> None:
    p = Producer(client_config(bootstrap, "producer"))
    p.produce(names.control, value=control.encode(type_, **fields))
    assert p.flush(10) == 0


# ------------------------------------------------------------------ reading topics
@dataclass
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp_ms: int


def read_topic(bootstrap: str, topic: str, timeout: float = 20.0) -> list[Record]:
    """Every record of ``topic`` from the beginning, ending on PARTITION_EOF of each partition.

    (Tansu's ListOffsets under-reports the end: finish on EOF events, docs/kafka.md.)
    """
    c = Consumer(client_config(bootstrap, "consumer", **{
        "group.id": f"test-reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "enable.partition.eof": True, "fetch.wait.max.ms": 50}))
    try:
        md = c.list_topics(topic, timeout=10)
        parts = sorted(md.topics[topic].partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: list[Record] = []
        eof: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(eof) < len(parts):
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic}: no end of partition(s) "
                                     f"{sorted(set(parts) - eof)} within {timeout:.0f} s")
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    continue
                raise AssertionError(f"reading {topic}: {m.error()}")
            eof.discard(m.partition())
            out.append(Record(m.partition(), m.offset(), m.key(), m.value(),
                              {k: v for k, v in (m.headers() or [])}, m.timestamp()[1]))
        return out
    finally:
        c.close()


# ------------------------------------------------------------------ HTTP
def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def scrape(base_url: str) -> dict[str, list[tuple[dict, float]]]:
    """``{sample name: [(labels, value), ...]}`` from ``<base_url>/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = http_get(base_url.rstrip("/") + "/metrics")
    assert status == 200, f"/metrics answered {status}"
    out: dict[str, list[tuple[dict, float]]] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def scrape_until(base_url: str, pred, timeout: float, what: str) -> dict:
    """Scrape until ``pred(samples)`` holds (metrics are updated just after the state we wait on)."""
    box = {}

    def ok():
        box["s"] = scrape(base_url)
        return pred(box["s"])
    wait_for(ok, timeout, what, interval=0.1)
    return box["s"]


def metric(samples: dict, name: str, **labels) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
    return float(sum(v for lab, v in samples.get(name, [])
                     if all(lab.get(k) == str(x) for k, x in labels.items())))


def metric_by(samples: dict, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for lab, v in samples.get(name, []):
        out[lab.get(label)] = out.get(lab.get(label), 0.0) + v
    return out


# ------------------------------------------------------------------ the in-process engine
def engine_snapshots(corpus: Corpus, *, epsilon: float | None, X=None, ts=None, n_warm=None,
                     noise_seed: int | None = None, sampler: str = "fast", horizon=None,
                     refinement=False):
    """The in-process engine on the same documents and epoch clock: one snapshot per epoch
    (``refinement``: as the engine's keyword; off by default, as ``make_config(refinement=False)``)."""
    from streamdp import EpochClock, StreamingSpectralLDA

    cb = corpus.counts()
    X = cb.counts if X is None else X
    ts = corpus.ts if ts is None else ts
    n_warm = corpus.n_warm if n_warm is None else n_warm
    m = StreamingSpectralLDA(corpus.topics.shape[0], 1.0, epsilon=epsilon, delta=1e-6, seed=0,
                             sampler=sampler, noise_seed=noise_seed,
                             epochs=EpochClock(corpus.stream_start, corpus.epoch_seconds),
                             horizon=horizon or corpus.epochs, refinement=refinement)
    m.warmup(X[:n_warm])
    m.partial_fit(X[n_warm:], np.asarray(ts[n_warm:], dtype=np.float64))
    return m.close_epochs(corpus.epoch_end(corpus.epochs))
