"""streamdp.snapshots, the consumers' reader API, on snapshot files (no Kafka here).

Snapshots are real releases of the engine (continual mode, private, three epochs); the
topic, HTTP and documentation tests on a real service run are in tests/test_consumers.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import msgpack
import numpy as np
import pytest

from streamdp import EpochClock, StreamingSpectralLDA, snapshots
from streamdp.cli import main as cli_main
from streamdp.snapshot import TopicSnapshot
from streamdp.synthetic import make_lda_model, sample_documents
from streamdp.text.vocabulary import Vocabulary

D, K = 80, 3
START, EPOCH = 1_000_000.0, 100.0


@pytest.fixture(scope="module")
def released():
    """Three private continual releases of the engine and the vocabulary they refer to."""
    model = make_lda_model(D, K, alpha0=1.0, beta=0.05, seed=3)
    X = sample_documents(model, 9000, mean_length=40, seed=4)
    vocab = Vocabulary([f"word{j:02d}" for j in range(D)])
    est = StreamingSpectralLDA(K, 1.0, epsilon=4.0, seed=0, sampler="fast", non_production=True,
                               epochs=EpochClock(START, EPOCH), horizon=3)
    est.warmup(X[:3000])
    ts = START + np.sort(np.random.default_rng(5).random(6000)) * 3 * EPOCH
    est.partial_fit(X[3000:], ts)
    snaps = est.close_epochs(START + 3 * EPOCH)
    assert [s.epoch for s in snaps] == [1, 2, 3]
    # the services stamp the vocabulary id; the engine leaves it to its caller
    return [replace(s, vocabulary_id=vocab.id) for s in snaps], vocab


def write_dir(path: Path, snaps, vocab=None) -> Path:
    """A snapshot directory as the release service writes it (same names, same bytes)."""
    path.mkdir(parents=True, exist_ok=True)
    for s in snaps:                          # complete files renamed into place, as it does
        tmp = path / f".{s.release_id}.tmp"
        tmp.write_bytes(s.to_bytes())
        os.replace(tmp, path / f"epoch-{s.epoch or 0:06d}-{s.release_id}.msgpack")
    if vocab is not None:
        vocab.save(path / "vocabulary.txt")
    return path


def same(a: TopicSnapshot, b: TopicSnapshot) -> None:
    assert a.release_id == b.release_id and a.epoch == b.epoch
    np.testing.assert_array_equal(a.topic_word, b.topic_word)
    np.testing.assert_array_equal(a.alpha, b.alpha)
    np.testing.assert_array_equal(a.noise_to_signal, b.noise_to_signal)
    assert a.privacy == json.loads(json.dumps(b.privacy)) or a.privacy == b.privacy


# ------------------------------------------------------------------ read
def test_read_bytes_and_file_give_the_released_snapshot(released, tmp_path):
    snaps, vocab = released
    s = snaps[-1]
    p = tmp_path / "one.msgpack"
    p.write_bytes(s.to_bytes())
    for got in (snapshots.read(s.to_bytes()), snapshots.read(p), snapshots.read(str(p))):
        assert isinstance(got, snapshots.Snapshot) and snapshots.Snapshot is TopicSnapshot
        same(got, s)
        assert got.schema_version == 1 and got.stage == "refined"
        assert got.noise_to_signal.shape == (K,)
        assert got.privacy["epsilon"] == 4.0 and got.privacy["epochs_covered"] == [1, 3]
        top = got.top_words(vocab, 5)
        assert len(top) == K and all(len(t) == 5 for t in top)
        # the top words are the largest entries of each topic, in order
        for row, t in zip(got.topic_word, top):
            assert [w for w, _ in t] == [vocab[j] for j in np.argsort(-row, kind="stable")[:5]]


def test_top_words_refuses_another_vocabulary(released):
    snaps, vocab = released
    other = Vocabulary([f"other{j:02d}" for j in range(D)])
    with pytest.raises(ValueError, match="vocabulary"):
        snaps[0].top_words(other, 3)
    with pytest.raises(ValueError, match="80 words per topic"):
        snaps[0].top_words([f"w{j}" for j in range(D - 1)], 3)


def malformed_cases(good: bytes) -> dict[str, tuple[bytes, str]]:
    obj = msgpack.unpackb(good, raw=False)
    no_alpha = dict(obj)
    del no_alpha["alpha"]
    bad_shape = dict(obj, alpha={"dtype": "<f8", "shape": [K + 1], "data": b"\0" * 8 * (K + 1)})
    return {
        "garbage": (b"\xc1not msgpack", "not a valid msgpack record"),
        "truncated": (good[: len(good) // 2], "not a valid msgpack record"),
        "other kind": (msgpack.packb({"kind": "subspace", "v": 1}), "expected a 'topic_snapshot'"),
        "future version": (msgpack.packb(dict(obj, v=2), use_bin_type=True),
                           "unsupported schema version 2"),
        "missing field": (msgpack.packb(no_alpha, use_bin_type=True), "missing field 'alpha'"),
        "inconsistent shapes": (msgpack.packb(bad_shape, use_bin_type=True), "do not describe k topics"),
        "privacy not a map": (msgpack.packb(dict(obj, privacy=[1]), use_bin_type=True),
                              "privacy a map"),
        "no release id": (msgpack.packb(dict(obj, release_id=""), use_bin_type=True),
                          "release_id must be"),
        "empty": (b"", "not a valid msgpack record"),
    }


def test_a_malformed_snapshot_is_a_clear_error_naming_the_file(released, tmp_path):
    snaps, _ = released
    for name, (raw, says) in malformed_cases(snaps[0].to_bytes()).items():
        p = tmp_path / f"epoch-000009-{name.replace(' ', '_')}.msgpack"
        p.write_bytes(raw)
        with pytest.raises(snapshots.SnapshotError, match=says) as exc:
            snapshots.read(p)
        assert str(p) in str(exc.value), name
        assert isinstance(exc.value, ValueError)
        p.unlink()
    with pytest.raises(snapshots.SnapshotError, match="cannot read snapshot file"):
        snapshots.read(tmp_path / "absent.msgpack")
    with pytest.raises(snapshots.SnapshotError, match="is a folder"):
        snapshots.read(tmp_path)


def test_a_malformed_file_in_a_directory(released, tmp_path):
    snaps, _ = released
    d = write_dir(tmp_path / "snaps", snaps[:2])
    bad = d / "epoch-000003-broken.msgpack"
    bad.write_bytes(b"\x92\x01")
    with pytest.raises(snapshots.SnapshotError, match="epoch-000003-broken.msgpack"):
        snapshots.latest(d)
    with pytest.raises(snapshots.SnapshotError, match="epoch-000003-broken.msgpack"):
        list(snapshots.releases(d))
    # errors="skip": the good releases, the bad file logged
    src = snapshots.DirectorySource(d, errors="skip")
    assert [s.release_id for s in snapshots.releases(src)] == [s.release_id for s in snaps[:2]]
    assert snapshots.latest(src) is None        # the newest epoch's only file is unreadable


# ------------------------------------------------------------------ directory source
def test_empty_and_missing_directories(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "latest.json").write_text("{}")
    (empty / ".abc.tmp").write_bytes(b"partial")          # a write in progress is not a snapshot
    assert snapshots.latest(empty) is None
    assert list(snapshots.releases(empty)) == []
    t0 = time.monotonic()
    assert list(snapshots.follow(empty, poll_seconds=0.05, idle_timeout=0.3)) == []
    assert time.monotonic() - t0 < 5
    assert snapshots.vocabulary(empty) is None
    with pytest.raises(snapshots.SourceError, match="no snapshot directory"):
        snapshots.latest(tmp_path / "absent")


def test_directory_latest_releases_and_vocabulary(released, tmp_path):
    snaps, vocab = released
    d = write_dir(tmp_path / "snaps", reversed(snaps), vocab)
    same(snapshots.latest(d), snaps[-1])
    assert [s.release_id for s in snapshots.releases(d)] == [s.release_id for s in snaps]
    assert snapshots.vocabulary(d) == vocab
    # one file is a source too
    f = next(d.glob("epoch-000002-*"))
    same(snapshots.latest(f), snaps[1])


def test_follow_a_directory_yields_each_release_once(released, tmp_path):
    """Releases written while following are yielded; a re-publication (the release service
    rewrites the same file after a restart) and an identical copy are not yielded again."""
    snaps, _ = released
    d = write_dir(tmp_path / "snaps", snaps[:1])
    got: list[TopicSnapshot] = []
    stop = threading.Event()

    def consume():
        for s in snapshots.follow(d, poll_seconds=0.05, stop=stop):
            got.append(s)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    write_dir(d, snaps[1:2])
    time.sleep(0.3)
    write_dir(d, snaps[:2])                               # re-publication: same names, same bytes
    os.utime(next(d.glob("epoch-000001-*")))               # ... written again, newer mtime
    time.sleep(0.3)
    write_dir(d, snaps[2:])
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    stop.set()
    t.join(5)
    assert not t.is_alive()
    assert [s.release_id for s in got] == [s.release_id for s in snaps]
    for a, b in zip(got, snaps):
        same(a, b)



def test_follow_waits_for_a_file_still_being_written(released, tmp_path):
    """A snapshot copied in by a non-atomic writer is seen half-written: following, it is read
    again on the next poll (yielded once complete) instead of ending the follower; a truncated
    file older than the grace period is an error, as when reading."""
    snaps, _ = released
    d = write_dir(tmp_path / "snaps", snaps[:1])
    cur = snapshots.DirectorySource(d).cursor()
    assert [s.release_id for s in cur.backlog()] == [snaps[0].release_id]
    data = snaps[1].to_bytes()
    target = d / f"epoch-{snaps[1].epoch or 0:06d}-{snaps[1].release_id}.msgpack"
    target.write_bytes(data[: len(data) // 2])             # half copied
    assert cur.poll(0) == []
    assert cur.poll(0) == []                               # still waiting, no error
    target.write_bytes(data)                               # copy finished
    assert [s.release_id for s in cur.poll(0)] == [snaps[1].release_id]
    assert cur.poll(0) == []                               # once
    stale = d / f"epoch-{snaps[2].epoch or 0:06d}-{snaps[2].release_id}.msgpack"
    stale.write_bytes(snaps[2].to_bytes()[:100])
    old = time.time() - 2 * snapshots.PARTIAL_FILE_GRACE_SECONDS
    os.utime(stale, (old, old))
    with pytest.raises(snapshots.SnapshotError, match="not a readable"):
        cur.poll(0)

def test_follow_start_latest_and_after_epoch(released, tmp_path):
    snaps, _ = released
    d = write_dir(tmp_path / "snaps", snaps)
    ids = [s.release_id for s in snaps]
    assert [s.release_id for s in snapshots.follow(d, start="latest", poll_seconds=0.05,
                                                   idle_timeout=0.2)] == ids[2:]
    assert [s.release_id for s in snapshots.follow(d, after_epoch=1, poll_seconds=0.05,
                                                   idle_timeout=0.2)] == ids[1:]
    assert list(snapshots.follow(d, after_epoch=3, poll_seconds=0.05, idle_timeout=0.2)) == []
    with pytest.raises(ValueError, match="start"):
        next(snapshots.follow(d, start="end"))


def test_open_source_forms():
    assert isinstance(snapshots.open_source("snaps"), snapshots.DirectorySource)
    h = snapshots.open_source("http://127.0.0.1:9400/")
    assert isinstance(h, snapshots.HttpSource) and h.url == "http://127.0.0.1:9400"
    k = snapshots.open_source("kafka://k1:9092,k2:9092/streamdp.snapshots")
    assert isinstance(k, snapshots.KafkaSource)
    assert (k.bootstrap, k.topic) == ("k1:9092,k2:9092", "streamdp.snapshots")
    assert k.group_id.startswith("streamdp-snapshot-readers")
    with pytest.raises(ValueError, match="kafka://BOOTSTRAP/TOPIC"):
        snapshots.open_source("kafka://k1:9092")
    with pytest.raises(TypeError):
        snapshots.open_source(42)


def test_kafka_source_from_a_deployment_config(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"bootstrap": "k1:9092", "topic_prefix": "prod",
                               "kafka": {"security.protocol": "SASL_SSL"}}))
    src = snapshots.KafkaSource.from_config(cfg)
    assert (src.bootstrap, src.topic, src.config) == ("k1:9092", "prod.snapshots",
                                                      {"security.protocol": "SASL_SSL"})


def test_the_pure_part_never_imports_kafka():
    code = ("import sys, streamdp.snapshots as s; s.latest; "
            "assert 'confluent_kafka' not in sys.modules, 'kafka imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr


def test_an_unreachable_kafka_is_a_clear_error():
    from streamdp.kafka.broker import free_port
    src = snapshots.KafkaSource(f"127.0.0.1:{free_port()}", "x.snapshots", timeout=2)
    with pytest.raises(snapshots.SourceError, match="cannot reach Kafka at bootstrap '127.0.0.1:"):
        snapshots.latest(src)


def test_http_source_errors_are_clear():
    from streamdp.kafka.broker import free_port
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(snapshots.SourceError, match="cannot reach the release service"):
        snapshots.latest(url)


# ------------------------------------------------------------------ summary and topics --json
def check_summary(doc: dict, snap: TopicSnapshot, vocab, n: int) -> None:
    assert doc["kind"] == "topic_summary" and doc["v"] == 1 and doc["schema_version"] == 1
    for key in ("release_id", "epoch", "created_at", "stage", "topic_source", "mechanism",
                "subspace_id", "vocabulary_id", "n_topics"):
        assert doc[key] == getattr(snap, key), key
    assert doc["n_docs"] == snap.n_docs
    assert doc["alpha"] == snap.alpha.tolist()
    assert doc["noise_to_signal"] == [x if np.isfinite(x) else None
                                      for x in snap.noise_to_signal.tolist()]
    assert doc["quality_note"] == snap.quality_note
    assert len(doc["topics"]) == snap.n_topics
    for row, top in zip(snap.topic_word, doc["topics"]):
        idx = np.argsort(-row, kind="stable")[:n]
        assert [e["id"] for e in top] == idx.tolist()
        assert [e["word"] for e in top] == [vocab[j] for j in idx]
        assert [e["p"] for e in top] == row[idx].tolist()
    g = doc["guarantee"]
    assert g["private"] is True and g["epsilon"] == snap.privacy["epsilon"]
    assert g["delta"] == snap.privacy["delta"] and g["warning"] is None
    assert g["epochs_covered"] == snap.privacy["epochs_covered"]
    assert doc["privacy"]["epsilon"] == snap.privacy["epsilon"]


def test_topics_json_is_the_latest_snapshot(released, tmp_path, capsys):
    snaps, vocab = released
    d = write_dir(tmp_path / "snaps", snaps, vocab)
    assert cli_main(["topics", "--snapshot-dir", str(d), "--json", "-n", "4"]) == 0
    doc = json.loads(capsys.readouterr().out)
    check_summary(doc, snaps[-1], vocab, 4)
    # the text form says the same
    assert cli_main(["topics", "--snapshot-dir", str(d), "-n", "4"]) == 0
    text = capsys.readouterr().out
    assert f"release {snaps[-1].release_id}  epoch 3" in text
    assert all(e["word"] in text for top in doc["topics"] for e in top)


def test_topics_json_errors(released, tmp_path, capsys):
    snaps, vocab = released
    d = write_dir(tmp_path / "snaps", snaps)               # no vocabulary.txt
    assert cli_main(["topics", "--snapshot-dir", str(d), "--json"]) == 2
    assert "no vocabulary file" in capsys.readouterr().err
    (d / "epoch-000004-broken.msgpack").write_bytes(b"junk")
    vocab.save(d / "vocabulary.txt")
    assert cli_main(["topics", "--snapshot-dir", str(d), "--json"]) == 2
    err = capsys.readouterr().err
    assert "epoch-000004-broken.msgpack" in err and "not a readable" in err


def test_summary_of_a_non_private_snapshot_says_so(released):
    snaps, vocab = released
    s = replace(snaps[0], privacy={"mechanism": "none", "epsilon": None, "non_private": True},
                noise_to_signal=np.array([np.inf, 0.5, 2.0]))
    doc = snapshots.summary(s, vocab, 3)
    assert doc["guarantee"]["private"] is False and "NON-PRIVATE" in doc["guarantee"]["warning"]
    assert doc["noise_to_signal"] == [None, 0.5, 2.0]
    json.dumps(doc, allow_nan=False)                      # plain JSON: no NaN/Infinity
    s = replace(snaps[0], privacy={**snaps[0].privacy,
                                   "sampler": "numpy-pcg64-seeded-INSECURE-reproducible"})
    assert "INSECURE" in snapshots.summary(s, vocab)["guarantee"]["warning"]
    # without a vocabulary: column ids, no words
    doc = snapshots.summary(snaps[0], None, 2)
    assert all(e["word"] is None and isinstance(e["id"], int) for t in doc["topics"] for e in t)


# ------------------------------------------------------------------ HTTP, on the service's server class
@pytest.fixture
def http_server():
    from streamdp.observability import HealthState, ObservabilityServer, ServiceMetrics
    server = ObservabilityServer(ServiceMetrics("release"), HealthState(liveness_timeout=60))
    yield server
    server.close()


def test_http_source_on_a_server_without_the_routes(http_server):
    with pytest.raises(snapshots.SourceError, match="does not serve /snapshot/latest.msgpack"):
        snapshots.latest(http_server.url)


def test_follow_over_http_yields_each_release_once(released, http_server):
    """The release service's routes, served as it serves them (gzip included): the latest
    release changes twice, stays for several polls, and is re-published (decoded and encoded
    again, as at a restart); the follower sees each release once."""
    snaps, vocab = released
    box = {"snap": None}
    http_server.add_bytes_route("/snapshot/latest.msgpack",
                                lambda: box["snap"] and box["snap"].to_bytes(), "application/msgpack")
    http_server.add_json_route("/snapshot/latest",
                               lambda: box["snap"] and snapshots.summary(box["snap"], vocab))
    http_server.add_bytes_route("/vocabulary.txt", vocab.canonical_bytes, "text/plain")
    url = http_server.url
    assert snapshots.latest(url) is None                  # nothing released yet
    assert snapshots.vocabulary(url) == vocab
    got: list[TopicSnapshot] = []
    stop = threading.Event()
    t = threading.Thread(target=lambda: [got.append(s) for s in
                                         snapshots.follow(url, poll_seconds=0.05, stop=stop)],
                         daemon=True)
    t.start()
    for s in (snaps[0], snaps[1], snaps[1], snaps[2]):
        box["snap"] = s
        time.sleep(0.4)
    box["snap"] = snapshots.read(snaps[2].to_bytes())     # re-published after a restart
    time.sleep(0.4)
    stop.set()
    t.join(5)
    assert not t.is_alive()
    assert [s.release_id for s in got] == [s.release_id for s in snaps]
    same(got[-1], snaps[2])
    same(snapshots.latest(url), snaps[2])
