"""Deduplication by document id (issue 25 item 3; streamdp.services.dedup, docs/privacy.md "The
unit is a document id").

Before: ``streamdp produce`` run twice on one file released its 500 documents as 1,000 (ε ≈ 2.11
for them). Now a sketcher counts each id once per partition, dead-letters the copies with class
``duplicate_id``, and keeps the accepted ids in the partition's checkpoint, so a crash and a
re-read deduplicate exactly as a clean run.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from streamdp import messages
from streamdp.services.dedup import IdHasher, SeenIds
from streamdp.services.processor import StreamProcessor
from streamdp.whitening.subspace import Subspace

from sketcher_harness import World, checkpoint_payload, epoch_start, make_config, make_sketcher

WORDS = [f"w{i}" for i in range(12)]


# ------------------------------------------------------------------ the id set
def test_seen_ids_flags_earlier_and_within_batch_copies_and_round_trips():
    h = IdHasher(b"k" * 32)
    a = h.hashes([f"id-{i}" for i in range(10_000)])
    assert a.dtype == np.int64 and len(set(a.tolist())) == 10_000
    seen = SeenIds()
    first = a[:6000]
    assert not seen.duplicates(first).any()
    seen.add(first)                             # > 4096 new: merged into the sorted array
    seen.add(a[6000:6100])                      # kept as recent
    assert len(seen) == 6100
    # 10 merged, 10 recent, 10 new, then one new id twice
    batch = np.concatenate([a[5990:6000], a[6090:6100], a[6100:6110], a[7000:7001], a[7000:7001]])
    dup = seen.duplicates(batch)
    assert dup.tolist() == [True] * 20 + [False] * 10 + [False, True]
    back = SeenIds.from_bytes(seen.to_bytes())
    assert len(back) == 6100
    assert (back.duplicates(batch) == dup).all()
    # another key gives other hashes: the set says nothing about ids without the key
    assert not np.isin(IdHasher(b"x" * 32).hashes(["id-1"]), a).any()


# ------------------------------------------------------------------ the sketcher (fake Kafka)
def _docs(n: int, start: int = 0) -> list[tuple[str, bytes, float]]:
    rng = np.random.default_rng(start)
    ts = np.sort(epoch_start(1) + 1.0 + rng.random(n) * 3000.0)
    return [(f"doc-{start + i}", messages.encode_document(
        f"doc-{start + i}", float(ts[i]), tokens=rng.choice(WORDS, size=6).tolist()), float(ts[i]))
        for i in range(n)]


def _with_copies(docs):
    """The documents with copies: re-sent in the same poll batch, in the next batches and at
    the end (a second ``produce`` of the first 40), each copy at a later record time."""
    out, last = [], 0.0
    for i, (did, raw, ts) in enumerate(docs):
        out.append((raw, ts))
        last = ts
        if i % 7 == 3:
            out.append((raw, ts + 0.5))         # the same poll batch or the next
        if i % 11 == 5 and i > 20:
            out.append((docs[i - 20][1], ts + 0.5))   # a copy of an older one
    out += [(raw, last + 1.0) for _, raw, _ in docs[:40]]
    return out


def _world(tmp_path, records):
    sub = Subspace(np.linalg.qr(np.random.default_rng(0).standard_normal((len(WORDS), 3)))[0])
    cfg = make_config(tmp_path, WORDS, 2, refinement=False, batch_size=7)
    world = World(cfg, sub)
    world.add_documents(records)
    return world


def _run(sk, world, *, until: int | None = None):
    while sk.consumer.pos < (len(world.messages) if until is None else until):
        sk.step()
    sk.step()


def _letters(monkeypatch):
    got = []
    orig = StreamProcessor.dead_letter

    def dead_letter(self, m, exc):
        got.append((m.offset(), exc.error_class))
        return orig(self, m, exc)
    monkeypatch.setattr(StreamProcessor, "dead_letter", dead_letter)
    return got


def test_copies_are_dead_lettered_and_the_sketch_is_the_unique_documents(tmp_path, monkeypatch):
    docs = _docs(120)
    letters = _letters(monkeypatch)
    world = _world(tmp_path / "dup", _with_copies(docs))
    sk = make_sketcher(world, monkeypatch)
    _run(sk, world)
    st = sk.states[0]
    n_copies = len(world.messages) - len(docs)
    assert n_copies > 50
    assert st.counters["documents"] == len(docs)
    assert st.counters["duplicates"] == n_copies == len(letters)
    assert {c for _, c in letters} == {messages.DUPLICATE_ID}
    # the dead-lettered records are exactly the later copies, by offset
    first_seen, copies = set(), []
    for m in world.messages:
        did = messages.decode_document(m.value()).id
        (copies.append(m.offset()) if did in first_seen else first_seen.add(did))
    assert sorted(o for o, _ in letters) == copies

    # the same sums as a run of the unique documents alone
    once = _world(tmp_path / "once", [(raw, ts) for _, raw, ts in docs])
    sk1 = make_sketcher(once, monkeypatch)
    _run(sk1, once)
    a, b = st.epochs[1], sk1.states[0].epochs[1]
    assert a.to_bytes() == b.to_bytes()


def test_crash_and_reread_deduplicates_as_a_clean_run(tmp_path, monkeypatch):
    """A checkpoint mid-stream, more work lost in a crash, a restart from the checkpoint that
    re-reads the lost records: the final state (sketches, counters, id set) is the clean run's."""
    records = _with_copies(_docs(150))
    world = _world(tmp_path / "clean", records)
    clean = make_sketcher(world, monkeypatch)
    _run(clean, world)
    want = checkpoint_payload(clean)

    world2 = _world(tmp_path / "crash", records)
    sk = make_sketcher(world2, monkeypatch)
    _run(sk, world2, until=len(records) // 2)
    saved = checkpoint_payload(sk)              # the last checkpoint before the crash
    _run(sk, world2, until=len(records) * 3 // 4)   # work lost in the crash
    restarted = make_sketcher(world2, monkeypatch, restore=saved)
    assert restarted.consumer.pos < len(records) * 3 // 4
    _run(restarted, world2)
    assert checkpoint_payload(restarted) == want


def test_state_written_before_deduplication_restores_with_no_ids(tmp_path, monkeypatch):
    from streamdp import serialization as ser
    from streamdp.services.partition_state import PartitionState
    world = _world(tmp_path, [(raw, ts) for _, raw, ts in _docs(10)])
    sk = make_sketcher(world, monkeypatch)
    _run(sk, world)
    obj = ser.loads(checkpoint_payload(sk))
    del obj["seen_ids"]
    st = PartitionState.from_bytes(ser.dumps(obj), world.subspace)
    assert len(st.seen_ids) == 0 and len(sk.states[0].seen_ids) == 10


# ------------------------------------------------------------------ on the broker: the attack
def test_the_same_file_produced_twice_is_released_as_once(kafka_broker, tmp_path):
    """Attack (careless operator): `streamdp produce` re-run on the same file. Before: the
    released snapshot covered every document twice (500 as 1,000). Now: the released count is
    a single send's, each copy is in the DLQ once with class duplicate_id, and counted."""
    from streamdp.services.produce import Rejections, encoded_records, produce
    from service_helpers import (Pipeline, fresh_topics, make_config as svc_config, make_corpus,
                                 metric, read_topic, scrape, send_control, wait_for)
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(600, 500, 1, seed=5)
    names = fresh_topics(bootstrap)
    cfg = svc_config(tmp_path, bootstrap, names, corpus, epsilon=None)
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in corpus.records()))
    pipe = Pipeline(cfg, sketchers=2)
    try:
        pipe.start()
        for _ in range(2):                      # the same file, twice
            rej = Rejections()
            assert produce(bootstrap, names.documents, encoded_records(path, rej)) == 1100
            assert rej.count == 0
        send_control(bootstrap, names, "flush", through=1)
        last = pipe.wait_released(1, timeout=120)
        wait_for(lambda: all(s.server is not None for s in pipe.sketchers), 10, "metrics servers")
        samples = [scrape(s.server.url) for s in pipe.sketchers]
    finally:
        pipe.stop()
    assert last.n_docs == corpus.n_stream == 500
    dlq = read_topic(bootstrap, names.dlq)
    assert len(dlq) == 1100
    assert {r.headers["streamdp.error.class"] for r in dlq} == {b"duplicate_id"}
    assert sorted(r.key for r in dlq) == sorted(f"doc-{i}".encode() for i in range(1100))
    assert sum(metric(s, "streamdp_documents_skipped_total", reason="duplicate_id")
               for s in samples) == 1100
    assert sum(metric(s, "streamdp_documents_total") for s in samples) == 1100
    # each partition's id set (a partition that moved keeps its last value on its old owner)
    assert sum(max(metric(s, "streamdp_dedup_ids", partition=p) for s in samples)
               for p in (0, 1)) == 1100


def test_produce_warns_of_repeats_and_skips_ids_in_its_dedup_state(kafka_broker, kafka_topics,
                                                                   tmp_path):
    """`streamdp produce --dedup-state FILE` run twice on one file: the first run sends every
    line and warns of the repeat inside the file; the second sends nothing and says why."""
    from service_helpers import read_topic
    from test_first_run import run_cli
    prefix = kafka_topics.documents.rsplit(".", 1)[0]
    lines = [{"id": f"d{i}", "ts": 1000.0 + i, "text": "apples and pears"} for i in range(12)]
    lines.append({"id": "d3", "ts": 1100.0, "text": "apples again"})
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(x) + "\n" for x in lines))
    state = tmp_path / "sent.ids"
    args = ("produce", "--bootstrap", kafka_broker.bootstrap, "--topic-prefix", prefix,
            "--dedup-state", str(state), str(corpus))
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "delivered 13 of 13" in r.stdout
    assert "1 document(s) repeat an id sent earlier in this run" in r.stderr
    assert state.stat().st_size == 12 * 8
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "delivered 0 of 0" in r.stdout
    assert "13 document(s) were not sent: their ids were sent before" in r.stderr
    assert len(read_topic(kafka_broker.bootstrap, kafka_topics.documents)) == 13


def test_user_mode_deduplicates_per_user_and_id(tmp_path, monkeypatch):
    """privacy_unit: user: the key is (user, id). Two users' documents with the same id are two
    documents (one user's records never decide whether another's counts); the same user's id
    again is a duplicate."""
    from test_user_services import OTHERS, _config, _drive, _sketcher, _world
    a, b = OTHERS[0], OTHERS[1]
    t = epoch_start(3) + 10.0
    docs = [messages.encode_document("doc-1", t, tokens=["w1", "w2", "w3"], user=a),
            messages.encode_document("doc-1", t + 1, tokens=["w4", "w5", "w6"], user=b),
            messages.encode_document("doc-1", t + 2, tokens=["w1", "w2", "w3"], user=a),
            messages.encode_document("doc-2", t + 3, tokens=["w7", "w8", "w9"], user=a)]
    world = _world(_config(tmp_path))
    world.add_documents([(v, t + i) for i, v in enumerate(docs)])
    sk = _sketcher(world, monkeypatch)
    _drive(sk, world)
    assert sk.dead_lettered == [(2, messages.DUPLICATE_ID)]
    st = sk.states[0]
    assert st.counters["documents"] == 3 and st.counters["duplicates"] == 1
    assert len(st.seen_ids) == 3


def test_selection_window_documents_are_deduplicated(tmp_path, monkeypatch):
    """vocabulary_mode private: a document of the selection window counts once in the
    partition's selection histogram (the private vocabulary selection) too."""
    from sketcher_harness import stream_start
    sel_end = stream_start() - 3600.0
    cfg = make_config(tmp_path, WORDS, 2, refinement=False, batch_size=3, vocabulary="",
                      vocabulary_public_by_assumption=False, vocabulary_mode="private",
                      selection_end=sel_end, vocabulary_candidates=2000, vocabulary_size=100, epsilon=1.0,
                      non_private=False)
    world = World(cfg, Subspace(np.linalg.qr(np.random.default_rng(0).standard_normal(
        (len(WORDS), 3)))[0]))
    t = sel_end - 1000.0
    texts = ["the house by the river", "a river and a house", "the time of the year"]
    docs = [(messages.encode_document(f"s{i}", t + i, text=x), t + i) for i, x in enumerate(texts)]
    world.add_documents(docs + [(docs[0][0], t + 10), (docs[2][0], t + 11)])
    letters = _letters(monkeypatch)
    sk = make_sketcher(world, monkeypatch)
    assert sk.context.vocabulary is None
    _run(sk, world)
    st = sk.states[0]
    assert sorted(letters) == [(3, messages.DUPLICATE_ID), (4, messages.DUPLICATE_ID)]
    assert st.counters["selection_documents"] == 3 and st.counters["duplicates"] == 2
