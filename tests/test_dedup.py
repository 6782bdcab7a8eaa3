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
from streamdp.services.dedup import CountedIds, IdHasher, SeenIds
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


def test_checkpoints_of_format_1_migrate_to_lifetime_ids_and_unknown_versions_are_refused(
        tmp_path, monkeypatch):
    """Format 1 (one flat set under "seen_ids", before the window) is migrated: its ids stay
    duplicates for any later epoch under a window; no set at all (before deduplication): no ids;
    a newer format version is refused with a message saying so."""
    from streamdp import serialization as ser
    from streamdp.services.partition_state import PartitionState
    world = _world(tmp_path, [(raw, ts) for _, raw, ts in _docs(10)])
    sk = make_sketcher(world, monkeypatch)
    _run(sk, world)
    obj = ser.loads(checkpoint_payload(sk))
    assert obj["dedup"]["v"] == 2 and obj["dedup"]["window"] is None
    ids = IdHasher(b"k" * 32).hashes([f"id-{i}" for i in range(10)])
    v1 = {k: v for k, v in obj.items() if k != "dedup"}
    v1["v"] = 1                 # partition_state v1: the one that held these (issue 26 item 4)
    st = PartitionState.from_bytes(ser.dumps(v1), world.subspace)     # before deduplication
    assert len(st.seen_ids) == 0 and len(sk.states[0].seen_ids) == 10
    v1["seen_ids"] = SeenIds(ids).to_bytes()
    st = PartitionState.from_bytes(ser.dumps(v1), world.subspace)
    migrated = st.seen_ids.bound_to(2)
    assert migrated.window == 2 and len(migrated) == 10
    assert migrated.duplicates(ids[:3], [1, 50, 900]).all()           # lifetime ids
    migrated.expire(10**6)
    assert len(migrated) == 10
    with pytest.raises(ValueError, match="cannot change"):
        CountedIds(3).bound_to(2)
    newer = dict(obj, dedup=dict(obj["dedup"], v=3))
    with pytest.raises(ser.SchemaError, match="version 3.*a newer streamdp"):
        PartitionState.from_bytes(ser.dumps(newer), world.subspace)


def test_the_window_rule_expiry_and_round_trip():
    """N = 2: a copy is a duplicate iff a counted copy has |e - e'| < 2; inside a batch only a
    counted (not duplicate) earlier copy makes one; an epoch's ids go once closed_through
    reaches e' + N - 1."""
    h = IdHasher(b"k" * 32).hashes(["a", "b", "c", "d"])
    ids = CountedIds(2)
    ids.add(h[:2], [1, 3])                       # a at epoch 1, b at epoch 3
    a, b, c = h[0], h[1], h[2]
    got = ids.duplicates(np.array([a, a, a, b, b, b]), np.array([0, 2, 3, 1, 2, 5]))
    assert got.tolist() == [True, True, False, False, True, False]
    # in one batch: c at 1 counts, c at 2 is its copy, c at 3 counts (2 from the counted c at 1),
    # c at 4 is a copy of c at 3; the same without a window: every later c is a copy
    batch, eps = np.array([c, c, c, c]), np.array([1, 2, 3, 4])
    assert ids.duplicates(batch, eps).tolist() == [False, True, False, True]
    assert CountedIds(None).duplicates(batch, eps).tolist() == [False, True, True, True]
    back = CountedIds.from_obj(ids.to_obj())
    assert back.window == 2 and sorted(back.by_epoch) == [1, 3] and len(back) == 2
    assert (back.duplicates(np.array([a, b]), np.array([2, 4])) == [True, True]).all()
    assert ids.expire(1) == 0 and len(ids) == 2        # e' = 1 is kept until closed_through 2
    assert ids.expire(2) == 1 and sorted(ids.by_epoch) == [3]
    assert not ids.duplicates(np.array([a]), np.array([3]))[0]


WINDOW = 2


def _windowed(tmp_path, records, window=WINDOW):
    sub = Subspace(np.linalg.qr(np.random.default_rng(0).standard_normal((len(WORDS), 3)))[0])
    cfg = make_config(tmp_path, WORDS, 2, refinement=False, batch_size=7,
                      dedup_window_epochs=window)
    world = World(cfg, sub)
    world.add_documents(records)
    return world


def _doc(i: int, e: int, k: int = 0):
    """Document ``doc-i`` stamped in epoch ``e`` (its ``k``-th send), as (value, record time)."""
    t = epoch_start(e) + 10.0 + i + 0.25 * k
    toks = np.random.default_rng(i).choice(WORDS, size=6).tolist()
    return messages.encode_document(f"doc-{i}", t, tokens=toks), t + 1.0


def _spread_copies():
    """30 documents per epoch 1..4; each epoch also re-sends ids of earlier epochs: the ids of
    the epoch before (within N = 2: duplicates) and of two epochs before (N apart: counted)."""
    recs, dup_offsets = [], []
    for e in range(1, 5):
        for i in range(30):
            recs.append(_doc(100 * e + i, e))
        if e >= 2:
            for i in range(5):              # |e - e'| = 1 < 2: a duplicate
                dup_offsets.append(len(recs))
                recs.append(_doc(100 * (e - 1) + i, e, k=1))
            recs.append(_doc(100 * e + 1, e, k=2))   # the same epoch: a duplicate
            dup_offsets.append(len(recs) - 1)
        if e >= 3:
            for i in range(10, 14):         # |e - e'| = 2: counted again
                recs.append(_doc(100 * (e - 2) + i, e, k=1))
    recs.sort(key=lambda r: r[1])
    return recs


def test_a_resend_within_the_window_is_a_duplicate_and_one_n_epochs_apart_is_counted(
        tmp_path, monkeypatch):
    records = _spread_copies()
    letters = _letters(monkeypatch)
    world = _windowed(tmp_path / "w", records)
    sk = make_sketcher(world, monkeypatch)
    _run(sk, world)
    st = sk.states[0]
    # by id: each document's (epoch, offset); the copies the rule makes duplicates, by offset
    counted: dict[str, list[int]] = {}
    want = []
    for m in world.messages:
        doc = messages.decode_document(m.value())
        e = int(np.floor((doc.ts - epoch_start(1)) / (epoch_start(2) - epoch_start(1)))) + 1
        if any(abs(e - e0) < WINDOW for e0 in counted.get(doc.id, [])):
            want.append(m.offset())
        else:
            counted.setdefault(doc.id, []).append(e)
    assert sorted(o for o, _ in letters) == want and len(want) == 3 * 6
    assert {c for _, c in letters} == {messages.DUPLICATE_ID}
    assert st.counters["duplicates"] == len(want)
    assert sk.metrics.registry.get_sample_value(
        "streamdp_documents_skipped_total", {"reason": "duplicate_id"}) == len(want)
    # 120 documents and 2 x 4 ids re-sent two epochs later: counted twice
    assert st.counters["documents"] == 120 + 8 == len(world.messages) - len(want)

    # without a window the same records count every id once
    letters.clear()
    once = _windowed(tmp_path / "life", records, window=None)
    sk1 = make_sketcher(once, monkeypatch)
    _run(sk1, once)
    assert sk1.states[0].counters["documents"] == 120 and len(letters) == len(records) - 120


def test_closed_epochs_free_the_ids_out_of_the_window(tmp_path, monkeypatch):
    records = _spread_copies()
    world = _windowed(tmp_path, records)
    sk = make_sketcher(world, monkeypatch)
    _run(sk, world)
    st = sk.states[0]
    held = {e: len(g) for e, g in st.seen_ids.by_epoch.items()}
    assert held == {1: 30, 2: 30, 3: 34, 4: 34}
    gauge = lambda: sk.metrics.registry.get_sample_value("streamdp_dedup_ids", {"partition": "0"})  # noqa: E731
    assert gauge() == len(st.seen_ids) == 128
    k = len(WORDS)
    for e in (1, 2):                            # closed through 2: epoch 1's ids can go
        world.release(e, np.full((2, k), 1.0 / k), np.ones(2))
    sk.step()
    assert st.closed_through == 2
    assert sorted(st.seen_ids.by_epoch) == [2, 3, 4] and gauge() == len(st.seen_ids) == 98
    # a re-send of an epoch-1 id is now late (its epoch is closed): dropped, not remembered
    world.add_documents([_doc(100, 1, k=5)])
    _run(sk, world)
    assert len(st.seen_ids) == 98 and st.counters["duplicates"] == 18


def test_crash_and_reread_with_the_window_counts_what_a_clean_run_counts(tmp_path, monkeypatch):
    """Epochs 1 and 2 close after the sketcher's checkpoint covers them; a crash later, a
    restart from that checkpoint re-reads the rest: the same state as a clean run (sketches,
    counters, counted ids by epoch)."""
    records = _spread_copies()
    cut = next(i for i, (_, t) in enumerate(records) if t >= epoch_start(3) + 200.0)
    k = len(WORDS)

    def close_1_and_2(world):
        for e in (1, 2):
            world.release(e, np.full((2, k), 1.0 / k), np.ones(2))

    world = _windowed(tmp_path / "clean", records)
    clean = make_sketcher(world, monkeypatch)
    _run(clean, world, until=cut)
    close_1_and_2(world)
    _run(clean, world)
    want = checkpoint_payload(clean)
    assert sorted(clean.states[0].seen_ids.by_epoch) == [2, 3, 4]

    world2 = _windowed(tmp_path / "crash", records)
    sk = make_sketcher(world2, monkeypatch)
    _run(sk, world2, until=cut)
    saved = checkpoint_payload(sk)              # covers epochs 1 and 2: they may close
    close_1_and_2(world2)
    _run(sk, world2, until=len(records) - 10)   # work lost in the crash
    restarted = make_sketcher(world2, monkeypatch, restore=saved)
    assert restarted.consumer.pos == cut or restarted.consumer.pos < len(records) - 10
    _run(restarted, world2)
    assert checkpoint_payload(restarted) == want


# ------------------------------------------------------------------ on the broker: the attack
@pytest.mark.parametrize("window", [None, 1])
def test_the_same_file_produced_twice_is_released_as_once(kafka_broker, tmp_path, window):
    """Attack (careless operator): `streamdp produce` re-run on the same file. Before: the
    released snapshot covered every document twice (500 as 1,000). Now: the released count is
    a single send's, each copy is in the DLQ once with class duplicate_id, and counted — also
    with the narrowest window (dedup_window_epochs 1: the copies are in their own epoch)."""
    from streamdp.services.produce import Rejections, encoded_records, produce
    from service_helpers import (Pipeline, fresh_topics, make_config as svc_config, make_corpus,
                                 metric, read_topic, scrape, send_control, wait_for)
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(600, 500, 1, seed=5)
    names = fresh_topics(bootstrap)
    cfg = svc_config(tmp_path, bootstrap, names, corpus, epsilon=None, dedup_window_epochs=window)
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
    assert {r.headers["streamdp.error.class"] for r in dlq} == {b"duplicate_id"}
    n_dup = sum(metric(s, "streamdp_documents_skipped_total", reason="duplicate_id")
                for s in samples)
    assert n_dup == len(dlq)
    assert sum(metric(s, "streamdp_documents_total") for s in samples) == 1100
    ids_held = sum(max(metric(s, "streamdp_dedup_ids", partition=p) for s in samples)
                   for p in (0, 1))
    if window is None:
        assert len(dlq) == 1100
        assert sorted(r.key for r in dlq) == sorted(f"doc-{i}".encode() for i in range(1100))
        # each partition's id set (a partition that moved keeps its last value on its old owner)
        assert ids_held == 1100
    else:
        # every stream copy (epoch 1, open) is a duplicate; a warm-up copy that arrives after
        # the warm-up closed is late: with N = 1 its epoch-0 id was dropped at that close, so it
        # is dropped as late instead (counted nowhere either way)
        keys = {r.key for r in dlq}
        assert {f"doc-{i}".encode() for i in range(600, 1100)} <= keys
        late = sum(metric(s, "streamdp_documents_skipped_total", reason="late") for s in samples)
        assert len(dlq) + late == 1100
        assert ids_held <= 1100


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


@pytest.mark.parametrize("window", [None, 1])
def test_selection_window_documents_are_deduplicated(tmp_path, monkeypatch, window):
    """vocabulary_mode private: a document of the selection window counts once in the
    partition's selection histogram (the private vocabulary selection) too; with a window, the
    selection window is epoch 0 (before stream_start), so its copies are within any window."""
    from sketcher_harness import stream_start
    sel_end = stream_start() - 3600.0
    cfg = make_config(tmp_path, WORDS, 2, refinement=False, batch_size=3, vocabulary="",
                      vocabulary_public_by_assumption=False, vocabulary_mode="private",
                      selection_end=sel_end, vocabulary_candidates=2000, vocabulary_size=100, epsilon=1.0,
                      non_private=False, dedup_window_epochs=window)
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
    assert len(st.seen_ids) == 3
    assert (window is None) == (not st.seen_ids.by_epoch)       # lifetime ids, or epoch 0's
    if window is not None:
        assert list(st.seen_ids.by_epoch) == [0]



def _checkpointed_under_window_2(bootstrap, tmp_path):
    """A deployment whose one sketcher counted the warm-up's ids within N = 2 epochs and
    stopped (checkpoints on the state topic, offsets committed): (config, what it wrote)."""
    from crash_helpers import committed_offsets
    from service_helpers import (Pipeline, fresh_topics, make_config as svc_config, make_corpus,
                                 read_topic, wait_for)
    from streamdp.services.produce import produce

    corpus = make_corpus(200, 200, 2, seed=8)
    names = fresh_topics(bootstrap)
    cfg = svc_config(tmp_path, bootstrap, names, corpus, epsilon=None, dedup_window_epochs=2)
    pipe = Pipeline(cfg, sketchers=1, release=False)
    try:
        pipe.start()
        produce(bootstrap, names.documents, corpus.records())
        sk = pipe.sketchers[0]
        # no release service: the warm-up documents are counted, the stream waits for the
        # subspace (held, not committed)
        wait_for(lambda: sum(len(st.seen_ids) for st in list(sk.states.values())) == 200, 60,
                 "every warm-up document's id counted", check=pipe.check)
    finally:
        pipe.stop()                              # checkpoints every partition and commits

    def written():
        return ([(r.key, r.value) for r in read_topic(bootstrap, names.state, timeout=5.0)],
                committed_offsets(bootstrap, cfg.group_id, names.documents, (0, 1)),
                len(read_topic(bootstrap, names.dlq, timeout=5.0)))
    before = written()
    state, committed, _ = before
    assert sum(committed.values()) >= 200, committed
    assert any(k and k.startswith(f"sketch/{names.documents}/".encode()) for k, _ in state), \
        "no partition checkpoint on the state topic"
    return cfg, before, written


def test_a_sketcher_restarted_with_another_window_is_refused_before_any_write(kafka_broker,
                                                                              tmp_path):
    """Careless operator: a sketcher whose partitions' checkpoints count ids within N = 2
    epochs is restarted with dedup_window_epochs = 3 (it would count again, or drop, ids the
    checkpoints decided under N = 2). Real sketcher, real checkpoints on the state topic: the
    restart is refused at start (the deployment contract), in seconds, naming the field, before
    it writes anything — the state topic, the group's committed offsets and the DLQ unchanged.
    The same restart with N = 2 starts (the refusal is about the window, nothing else)."""
    import time
    from dataclasses import replace

    from streamdp.services.config import ConfigError
    from streamdp.services.sketcher import Sketcher

    cfg, before, written = _checkpointed_under_window_2(kafka_broker.bootstrap, tmp_path)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        Sketcher(replace(cfg, dedup_window_epochs=3), instance="sketcher-wider")
    assert time.monotonic() - t0 < 20
    msg = str(info.value)
    assert "'dedup_window_epochs'" in msg and "recorded 2" in msg, msg
    assert written() == before
    Sketcher(cfg, instance="sketcher-same").close()     # the recorded window: starts


def test_the_restore_refuses_a_checkpoint_of_another_window_by_itself(kafka_broker, tmp_path,
                                                                      monkeypatch):
    """The restore's own refusal (streamdp.services.sketch_strategy, CountedIds.bound_to),
    behind the contract: with the field taken out of the contract's list (as for a contract
    recorded before the field existed), a sketcher with N = 3 starts, and its first assignment
    restores the N = 2 checkpoints and is refused naming dedup_window_epochs — nothing
    written, no offset committed, nothing dead-lettered."""
    from dataclasses import replace

    from streamdp.services.config import ConfigError
    from streamdp.services.contract import CONTRACT_FIELDS
    from streamdp.services.sketcher import Sketcher

    monkeypatch.delitem(CONTRACT_FIELDS, "dedup_window_epochs")
    cfg, before, written = _checkpointed_under_window_2(kafka_broker.bootstrap, tmp_path)
    wider = Sketcher(replace(cfg, dedup_window_epochs=3), instance="sketcher-wider")
    with pytest.raises(ConfigError) as info:
        wider.run(max_seconds=60, install_signals=False)
    msg = str(info.value)
    assert "partition" in msg and "within 2 epoch(s)" in msg, msg
    assert "dedup_window_epochs = 3" in msg, msg
    assert written() == before
