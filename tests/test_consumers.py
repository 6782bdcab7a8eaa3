"""Consumers of a real service run: streamdp.snapshots on the snapshot directory, the release
service's HTTP endpoint and the snapshots topic (embedded broker), re-publication after a
release-service restart, ``streamdp topics --json``, and the code of docs/consumers.md.

One private run (ε = 4, refinement on, one sketcher) releases two epochs, produced one epoch at
a time as a live feed; three followers (directory, HTTP, topic) run across the second release
and a release-service restart that re-publishes the last release.
"""
from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer

from streamdp import snapshots
from streamdp.cli import main as cli_main
from streamdp.evaluation.matching import match_topics
from streamdp.kafka.broker import free_port
from streamdp.kafka.topics import client_config
from streamdp.services.produce import produce
from streamdp.services.release import ReleaseService
from streamdp.text.vocabulary import Vocabulary

from service_helpers import (Pipeline, fresh_topics, http_get, make_config, make_corpus,
                             read_topic, send_control, wait_for)

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "consumers.md"

def epoch_rows(corpus, e: int) -> np.ndarray:
    """Rows produced in round e: the warm-up with epoch 1, then each epoch's stream rows."""
    idx = np.arange(len(corpus.texts))
    ep = np.floor((corpus.ts - corpus.stream_start) / corpus.epoch_seconds).astype(int) + 1
    ep = np.where(idx < corpus.n_warm, 1, np.clip(ep, 1, corpus.epochs))
    return np.flatnonzero(ep == e)


def ready(url: str) -> bool:
    """The service's /readyz answers 200 (False while its HTTP server is not up yet)."""
    try:
        return http_get(url + "/readyz")[0] == 200
    except OSError:                      # URLError: connection refused before run() binds
        return False


class Follower:
    """``snapshots.follow(source)`` in a thread, collecting what it yields."""

    def __init__(self, source) -> None:
        self.got: list = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(source,), daemon=True)
        self.thread.start()

    def _run(self, source) -> None:
        try:
            for snap in snapshots.follow(source, poll_seconds=0.2, stop=self.stop):
                self.got.append(snap)
        except BaseException as exc:           # noqa: BLE001 — asserted by the test
            self.error = exc

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)
        assert not self.thread.is_alive()


@pytest.fixture(scope="module")
def run(kafka_broker, tmp_path_factory):
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(3000, 6000, 2, seed=7)
    names = fresh_topics(bootstrap)
    # private, the secure fast sampler (no noise seed); non_production: unsigned control
    # messages from the test and the embedded broker's record times are accepted
    cfg = make_config(tmp_path_factory.mktemp("consumers"), bootstrap, names, corpus, epsilon=4.0,
                      noise_seed=None, non_production=True, refinement=True,
                      refinement_model_lag=1,   # epoch 2 refined against snapshot 1 (non_production:
                      metrics_port=free_port())  # each epoch is produced after the previous release)
    url = f"http://127.0.0.1:{cfg.metrics_port}"
    out = dict(cfg=cfg, names=names, bootstrap=bootstrap, url=url, corpus=corpus)
    recs = corpus.records()
    followers: dict[str, Follower] = {}
    restarted = thread = None
    # the release service on a known port (a restarted one serves the same URL), the sketcher
    # on any free port
    workers = Pipeline(replace(cfg, metrics_port=0), sketchers=1, release=False)
    pipe = Pipeline(cfg, sketchers=0)
    try:
        workers.start()
        pipe.start()
        wait_for(lambda: ready(url), 30, "the release service's HTTP",
                 check=pipe.check)
        # an HTTP source with no release yet
        out["http_latest_before"] = snapshots.latest(url)
        out["http_vocabulary"] = snapshots.vocabulary(url)
        produce(bootstrap, names.documents, [recs[i] for i in epoch_rows(corpus, 1)])
        send_control(bootstrap, names, "flush", through=1)
        pipe.wait_released(1)
        wait_for(lambda: all(w.model_epoch == 1 for w in workers.sketchers), 30,
                 "the sketcher to load the model of epoch 1", check=workers.check)
        followers = {"directory": Follower(cfg.snapshot_dir), "http": Follower(url),
                     "kafka": Follower(snapshots.KafkaSource(bootstrap, names.snapshots))}
        wait_for(lambda: all(f.got for f in followers.values()), 30, "the followers' backlog")
        produce(bootstrap, names.documents, [recs[i] for i in epoch_rows(corpus, 2)])
        send_control(bootstrap, names, "flush", through=2)
        out["last"] = pipe.wait_released(2)
        wait_for(lambda: all(len(f.got) >= 2 for f in followers.values()), 30,
                 "the followers to see the second release")
        pipe.stop()
        workers.stop()
        # a restarted release service re-publishes the last release (topic, file, HTTP)
        restarted = ReleaseService(cfg)
        thread = threading.Thread(target=restarted.run, kwargs={"install_signals": False},
                                  daemon=True)
        thread.start()
        out["records"] = wait_for(lambda: (lambda r: len(r) == 3 and r)(
            read_topic(bootstrap, names.snapshots)), 30, "the re-publication on the topic")
        wait_for(lambda: ready(url), 30, "the restarted HTTP endpoint")
        time.sleep(1.5)                      # several polls of every follower after it
        for f in followers.values():
            f.close()
        out["followed"] = {k: (f.got, f.error) for k, f in followers.items()}
        yield out
    finally:
        for f in followers.values():
            f.stop.set()
        if restarted is not None:
            restarted.stop()
            if thread is not None:
                thread.join(30)
            restarted.close()
        for p in (pipe, workers):
            if any(t.is_alive() for t in p.threads):
                p.stop()


def test_the_run_republished_its_last_release(run):
    """Premise of the deduplication tests: the topic holds a re-publication."""
    keys = [r.key.decode() for r in run["records"]]
    assert len(keys) == 3 and len(set(keys)) == 2 and keys[1] == keys[2] == run["last"].release_id
    assert run["records"][1].value == run["records"][2].value     # the same bytes again


def test_follow_yields_each_release_once_on_every_source(run):
    on_topic = [snapshots.read(r.value) for r in run["records"][:2]]
    assert [s.epoch for s in on_topic] == [1, 2]
    assert [s.stage for s in on_topic] == ["spectral", "refined"]
    # docs/consumers.md: a refined release keeps the first release's topic numbering
    k = on_topic[0].n_topics
    np.testing.assert_array_equal(match_topics(on_topic[0].topic_word, on_topic[1].topic_word),
                                  np.arange(k))
    for name, (got, error) in run["followed"].items():
        assert error is None, (name, error)
        assert [s.release_id for s in got] == [s.release_id for s in on_topic], name
        for a, b in zip(got, on_topic):
            np.testing.assert_array_equal(a.topic_word, b.topic_word)
            np.testing.assert_array_equal(a.alpha, b.alpha)
            assert a.privacy == b.privacy


def test_latest_and_releases_on_every_source(run):
    last = run["last"]
    sources = {"directory": run["cfg"].snapshot_dir, "http": run["url"],
               "kafka": snapshots.KafkaSource(run["bootstrap"], run["names"].snapshots),
               "kafka url": f"kafka://{run['bootstrap']}/{run['names'].snapshots}"}
    for name, src in sources.items():
        snap = snapshots.latest(src)
        assert snap.release_id == last.release_id and snap.epoch == 2, name
        np.testing.assert_array_equal(snap.topic_word, last.topic_word)
        assert snap.privacy["epsilon"] == 4.0 and snap.privacy["epochs_covered"] == [1, 2]
    assert [s.epoch for s in snapshots.releases(sources["directory"])] == [1, 2]
    assert [s.epoch for s in snapshots.releases(sources["kafka"])] == [1, 2]   # 3 records
    assert [s.epoch for s in snapshots.releases(sources["http"])] == [2]       # latest only
    # the vocabulary: from the folder and over HTTP, the one the snapshots refer to
    vocab = run["corpus"].vocabulary
    assert snapshots.vocabulary(run["cfg"].snapshot_dir) == vocab
    assert snapshots.vocabulary(run["url"]) == vocab == run["http_vocabulary"]
    assert vocab.id == last.vocabulary_id
    assert snapshots.vocabulary(sources["kafka"]) is None


def test_an_http_source_with_no_release_yet(run):
    assert run["http_latest_before"] is None


def test_an_empty_topic_and_a_missing_topic(run, kafka_broker):
    empty = fresh_topics(kafka_broker.bootstrap)
    src = snapshots.KafkaSource(kafka_broker.bootstrap, empty.snapshots)
    assert snapshots.latest(src) is None
    assert list(snapshots.releases(src)) == []
    assert list(snapshots.follow(src, poll_seconds=0.1, idle_timeout=0.5)) == []
    with pytest.raises(snapshots.SourceError, match="no topic 'test.none.snapshots'"):
        snapshots.latest(snapshots.KafkaSource(kafka_broker.bootstrap, "test.none.snapshots"))


def test_a_malformed_record_on_the_topic(run, kafka_broker):
    names = fresh_topics(kafka_broker.bootstrap)
    good = snapshots.read(run["records"][0].value)
    p = Producer(client_config(kafka_broker.bootstrap, "producer"))
    p.produce(names.snapshots, key=b"x", value=b"\xc1 not a snapshot")
    p.produce(names.snapshots, key=good.release_id.encode(), value=run["records"][0].value)
    assert p.flush(10) == 0
    with pytest.raises(snapshots.SnapshotError,
                       match=rf"{re.escape(names.snapshots)} partition 0 offset 0: not a readable"):
        snapshots.latest(snapshots.KafkaSource(kafka_broker.bootstrap, names.snapshots))
    skip = snapshots.KafkaSource(kafka_broker.bootstrap, names.snapshots, errors="skip")
    assert [s.release_id for s in snapshots.releases(skip)] == [good.release_id]


def test_topics_json_and_latest_json_of_the_run(run, capsys):
    cfg, last = run["cfg"], run["last"]
    assert cli_main(["topics", "--snapshot-dir", cfg.snapshot_dir, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    vocab = Vocabulary.load(Path(cfg.snapshot_dir) / "vocabulary.txt")
    assert doc["release_id"] == last.release_id and doc["epoch"] == 2
    assert doc["stage"] == "refined" and doc["vocabulary_id"] == vocab.id
    assert doc["alpha"] == last.alpha.tolist() and doc["n_docs"] == last.n_docs
    for row, top in zip(last.topic_word, doc["topics"]):
        idx = np.argsort(-row, kind="stable")[:10]
        assert [(e["id"], e["word"], e["p"]) for e in top] == [
            (int(j), vocab[j], float(row[j])) for j in idx]
    g = doc["guarantee"]
    assert g == {"private": True, "epsilon": 4.0, "delta": 1e-6, "unit": "one document",
                 "neighbouring": "add/remove one document", "epochs_covered": [1, 2],
                 "horizon": 2, "warning": None}
    # latest.json and GET /snapshot/latest are the same summary (top 10 words)
    on_disk = json.loads((Path(cfg.snapshot_dir) / "latest.json").read_text())
    status, body = http_get(run["url"] + "/snapshot/latest")
    assert status == 200
    assert on_disk == doc == json.loads(body)


# ------------------------------------------------------------------ docs/consumers.md
def doc_blocks() -> list[tuple[int, str]]:
    """The ```python blocks of docs/consumers.md with their line numbers."""
    blocks, lines = [], DOC.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, body = i + 1, []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            blocks.append((start + 1, "\n".join(body)))
        i += 1
    return blocks


def test_the_consumer_guide_runs(run, tmp_path, monkeypatch):
    """Every python block of docs/consumers.md, in order, in one namespace (as a reader would
    paste them), with the settings block pointed at this run."""
    settings = {"SNAPSHOT_DIR": repr(run["cfg"].snapshot_dir), "BOOTSTRAP": repr(run["bootstrap"]),
                "TOPIC": repr(run["names"].snapshots), "RELEASE_URL": repr(run["url"]),
                "IDLE_SECONDS": "2.0", "STATE_FILE": repr(str(tmp_path / "consumer-state.json"))}
    blocks = doc_blocks()
    assert len(blocks) >= 5
    replaced = set()
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__consumers_md__"}
    for line, code in blocks:
        def setting(m):
            replaced.add(m.group(1))
            return f"{m.group(1)} = {settings[m.group(1)]}"
        code = re.sub(rf"^({'|'.join(settings)}) = .*$", setting, code, flags=re.M)
        exec(compile(code, f"{DOC}:{line}", "exec"), ns)
    assert replaced == set(settings)
    # what the guide's consumer recorded: both releases once, the resume point
    assert [s.release_id for s in ns["handled"]] == [r.key.decode() for r in run["records"][:2]]
    assert json.loads((tmp_path / "consumer-state.json").read_text())["epoch"] == 2


# ------------------------------------------------------------------ nothing unpersisted is served
def _pending_draw(continual_state: dict):
    """The pending draw in a ContinualRelease state dict, wherever its layout keeps it."""
    if continual_state.get("pending") is not None:
        return continual_state["pending"]
    for v in continual_state.values():
        if isinstance(v, dict) and v.get("pending") is not None:
            return v["pending"]
    return None


def test_http_never_serves_a_release_that_was_not_persisted(kafka_broker, tmp_path):
    """Attack on the spend protocol through every sink: a release whose first state write (the
    pending draw, persisted before post-processing) fails is
    redone with a fresh draw on the same (uncharged) reservation, so its first draw must not
    have left the process. Asked inside the window between the epoch's noise draw and its failed
    persist: GET /snapshot/latest and /snapshot/latest.msgpack answer 404 (no release yet), the
    service's ``latest``/``published``/``latest_json()`` are None, the snapshot directory and
    the snapshots topic are empty, and no ``epochs_closed`` for the epoch was announced. The
    published release is the redone one, on every sink."""
    from streamdp import serialization as ser
    from streamdp.kafka.state_store import WriterReinitialised
    from streamdp.services import control

    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(2000, 1500, 1, seed=8)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=2.0, noise_seed=None,
                      non_production=True, metrics_port=free_port())
    url = f"http://127.0.0.1:{cfg.metrics_port}"
    workers = Pipeline(replace(cfg, metrics_port=0), sketchers=1, release=False)
    pipe = Pipeline(cfg, sketchers=0)
    rel = pipe.release
    seen_in_window: list = []
    real_write = rel.store.write

    def epochs_announced() -> list[int]:
        return [m["through"] for m in map(control.decode, (r.value for r in read_topic(
            bootstrap, names.control))) if m["type"] == "epochs_closed"]

    def failing_write(key, payload, meta=None, **kw):
        # the first state write after the draw carries the pending (noised, not yet
        # post-processed) sums of epoch 1 (issue 23 item 4: persisted before post-processing)
        if key == control.RELEASE_STATE_KEY and not seen_in_window \
                and _pending_draw(ser.loads(payload)["continual"]) is not None:
            seen_in_window.append(dict(
                drawn_epoch=(meta or {}).get("epoch"),
                http_json=http_get(url + "/snapshot/latest"),
                http_msgpack=http_get(url + "/snapshot/latest.msgpack")[0],
                attributes=(rel.latest, rel.published, rel.latest_json()),
                files=sorted(p.name for p in Path(cfg.snapshot_dir).iterdir()
                             if p.name.startswith("epoch-") or p.name == "latest.json"),
                topic=read_topic(bootstrap, names.snapshots),
                announced=epochs_announced()))
            raise WriterReinitialised("injected: the state write of epoch 1 failed")
        return real_write(key, payload, meta=meta, **kw)

    rel.store.write = failing_write
    try:
        workers.start()
        pipe.start()
        wait_for(lambda: ready(url), 30, "the release service's HTTP",
                 check=pipe.check)
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "flush", through=corpus.epochs)
        published = pipe.wait_released(1)          # ``published``: the redone release only
        wait_for(lambda: snapshots.latest(url) is not None, 10, "the release over HTTP")
        served = snapshots.latest(url)
        summary = json.loads(http_get(url + "/snapshot/latest")[1])
        on_disk = snapshots.latest(cfg.snapshot_dir)
        on_topic = read_topic(bootstrap, names.snapshots)
        attributes = (rel.latest.release_id, rel.published[0].release_id,
                      rel.latest_json()["release_id"])
    finally:
        pipe.stop()
        workers.stop()
    assert len(seen_in_window) == 1
    window = seen_in_window[0]
    json_status, json_body = window["http_json"]
    assert window["drawn_epoch"] == 1
    assert (json_status, window["http_msgpack"]) == (404, 404), json_body[:300]
    assert window["attributes"] == (None, None, None)
    assert window["files"] == [] and window["topic"] == []
    assert all(t < 1 for t in window["announced"]), window["announced"]
    assert served.release_id == published.release_id     # only the redone release is served
    assert summary["release_id"] == published.release_id
    assert on_disk.release_id == published.release_id
    assert attributes == (published.release_id,) * 3
    assert [s.release_id for s in snapshots.releases(cfg.snapshot_dir)] == [published.release_id]
    assert [r.key for r in on_topic] == [published.release_id.encode()]
