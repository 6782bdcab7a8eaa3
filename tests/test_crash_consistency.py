"""Crash consistency of the sketcher service: kill -9 at random points and rebalances.

The sketcher's promise (module docstring of ``streamdp/services/processor.py``): a crash at
any point neither loses nor double-counts a document, because each partition's state
record holds the sketches *and* the next input offset they cover. These tests run real
``python -m streamdp sketcher`` processes against the embedded broker, SIGKILL them at
seeded random moments (during the join, the restore, batches and checkpoint writes), let
others join and leave the consumer group, and then compare the final state records with a
clean reference computed in this process (``tests/crash_helpers.py``: the documents read
back from the topic with their partitions, routed by the documented rule, sketched with
``WarmupSketch`` / ``WhitenedSketch`` directly).

What is compared, per documents partition:

* exactly: ``next_offset`` (= the end of the partition), ``progress``, every counter
  (documents, warm-up documents, tokens, unknown tokens, late, too short, dead-lettered),
  the sketches' document and clip counts, the warm-up norm histogram, the set of epochs;
* the floating-point sums (warm-up ``yacc``/``a2``, per epoch ``m1, zacc, a2, b3, a3, t3``
  and the weight sum, each after processing the sketch's pending rows as its final chunk)
  bit for bit. The sketches count their chunks in their own document sequence (pending
  rows are checkpointed with them; docs/privacy.md, "Floating point"), so the sums do not
  depend on the service's batch boundaries, on where checkpoints fell or on which process
  sketched which stretch: a crash-recovered state equals the one-batch reference exactly.
  ``test_reference_notices_one_document`` checks that a one-document-at-a-time reference
  equals the one-batch reference bit for bit, measures that every document's contribution
  is ≥ 1e6 × 1e-12 of its sums (so even a normwise tolerance would notice one), and asserts
  that dropping one breaks the equality of every sum.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from streamdp import messages
from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import WhitenedSketch
from streamdp.services.config import ServiceConfig
from streamdp.services.produce import produce
from streamdp.text.vocabulary import Vocabulary
from streamdp.whitening.warmup import WarmupSketch

from crash_helpers import (Rec, SketcherProcess, committed_offsets, compare, decode_partition,
                           flushed, kill_during_checkpoint, make_corpus, publish_subspace, random_subspace,
                           read_states, read_topic, reference_state, state_topic_debris,
                           sums_differ_everywhere, wait_for)

RTOL = 1e-12
CLIP = ClipBounds.for_length(20)          # stream clip bounds: some documents are clipped
N_TOPICS = 5                              # k' = 10


def make_cfg(bootstrap, names, vocab_path, corpus, **kw) -> ServiceConfig:
    base = dict(bootstrap=bootstrap, topic_prefix=names.documents.rsplit(".", 1)[0],
                vocabulary=str(vocab_path), vocabulary_public_by_assumption=True,
                n_topics=N_TOPICS, epsilon=1.0,
                stream_start=corpus.stream_start, epoch_seconds=corpus.epoch_seconds,
                checkpoint_seconds=0.4, batch_size=16, poll_seconds=0.2,
                non_production=True,      # embedded broker (CreateTime records)
                confirm_backfill=True,    # a replayed feed: stream_start is in the past
                # sketchers only, no release service: with refinement, documents of epoch 3 would
                # wait (held) for the model of epoch 1, which nothing releases here
                refinement=False)
    base.update(kw)
    return ServiceConfig(**base)


def assert_dead_lettered(bootstrap, names, decoded) -> int:
    """Every bad record reached the DLQ at least once (a crash may repeat one, never lose one)."""
    seen = set()
    for recs in read_topic(bootstrap, names.dlq).values():
        for r in recs:
            h = {k: v.decode() for k, v in r.headers}
            assert h[messages.HEADER_SOURCE_TOPIC] == names.documents
            seen.add((int(h[messages.HEADER_SOURCE_PARTITION]), int(h[messages.HEADER_SOURCE_OFFSET])))
    expected = {(p, o) for p, dec in decoded.items() for o in dec.bad_offsets}
    assert seen == expected
    return sum(map(len, read_topic(bootstrap, names.dlq).values()))


def check_states(states, refs, *, rtol, where):
    assert sorted(states) == sorted(refs), f"{where}: states of partitions {sorted(states)}"
    problems = {p: compare(states[p], refs[p], rtol=rtol) for p in refs}
    if any(problems.values()):
        pytest.fail(f"{where}: the sketcher states differ from the clean reference:\n" + "\n".join(
            f"  partition {p}: {msg}" for p, msgs in problems.items() for msg in msgs), pytrace=False)


# ------------------------------------------------------------------ the comparison itself
def test_reference_notices_one_document():
    """The sanity check behind the tolerance: one lost (or doubled) document is far outside it.

    A document lost or counted twice changes each sum of its sketch by exactly its own
    contribution, so the comparison ‖got − ref‖ ≤ RTOL·‖ref‖ notices it iff that
    contribution exceeds RTOL·‖ref‖. Here every sketched document's contribution to every
    sum is measured (≥ 4e-4 relative with ~700 documents per sketch; the tests below have
    ≤ 4,000 per sketch), i.e. > 1e6 × RTOL. Documents that add nothing to the sums (too
    short, late, invalid) are caught by the exact counters instead.
    """
    corpus = make_corpus(1000, 2000, 3, seed=11)
    vocab = Vocabulary(corpus.vocabulary)
    cfg = ServiceConfig(vocabulary="unused", n_topics=N_TOPICS, epsilon=1.0,
                        stream_start=corpus.stream_start, epoch_seconds=corpus.epoch_seconds)
    recs = [Rec(0, i, ts, raw) for i, (_, ts, raw) in enumerate(corpus.records)]
    dec = decode_partition(recs, cfg, vocab, cfg.tokenizer_())
    sub = random_subspace(len(vocab), cfg.k_prime(len(vocab)), seed=1)
    kw = dict(warmup_closed_at=None, keep_warmup=True, subspace=sub, clip=CLIP)
    full = reference_state(dec, cfg, **kw)
    # a different batching (one document at a time) agrees bit for bit (chunks are counted
    # in each sketch's own sequence: tests/test_batch_invariance.py) ...
    per_doc = reference_state(dec, cfg, per_document=True, **kw)
    assert compare(_as_state(per_doc), full, rtol=0) == []

    # ... every document's own contribution is far above it ...
    d, k_prime = len(vocab), cfg.k_prime(len(vocab))
    one_w = WarmupSketch(d, k_prime, clip=cfg.warmup_clip, seed=cfg.seed)
    lengths = np.asarray(dec.X.sum(axis=1)).ravel()
    full_w, full_e = flushed(full.warmup), {e: flushed(s) for e, s in full.epochs.items()}
    smallest = {}
    for off, _, r, row in dec.good:
        if r < 0 or lengths[row] < 3:
            continue
        if r == 0:
            one = flushed(one_w.copy().update(dec.X[row:row + 1]))   # one_w stays empty
            total, names = full_w, ("yacc", "a2")
        else:
            one = flushed(WhitenedSketch(sub, CLIP).update(dec.X[row:row + 1]))
            total = full_e[r]
            names = ("m1", "zacc", "a2", "b3", "a3", "t3")
        for n in names:
            ratio = np.linalg.norm(getattr(one, n)) / np.linalg.norm(getattr(total, n))
            smallest[(r == 0, n)] = min(smallest.get((r == 0, n), np.inf), ratio)
    assert len(smallest) == 8 and min(smallest.values()) > 1e6 * RTOL, smallest
    print(f"\nsmallest relative contribution of one document to a sum: {min(smallest.values()):.2g}")

    # ... so the comparison fails with any one document less, in every sum of its sketch
    rows = [g for g in dec.good if g[2] >= 0 and lengths[g[3]] >= 3]
    picks = {rows[0][0], rows[-1][0], rows[len(rows) // 2][0],
             rows[int(np.argmin([lengths[g[3]] for g in rows]))][0],
             rows[int(np.argmax([lengths[g[3]] for g in rows]))][0]}
    for off in picks:
        fewer = reference_state(dec, cfg, drop_offsets={off}, **kw)
        route = next(r for o, _, r, _ in dec.good if o == off)
        touched = sums_differ_everywhere(fewer, full, RTOL)
        assert len(touched) == (2 if route == 0 else 6), (off, route, touched)
        assert compare(_as_state(fewer), full, rtol=RTOL) != []


def _as_state(ref):
    """A Reference seen as a PartitionState (for compare())."""
    from streamdp.services.partition_state import PartitionState
    return PartitionState("t", 0, next_offset=ref.next_offset, progress=ref.progress,
                          warmup=ref.warmup, epochs=ref.epochs, counters=dict(ref.counters))


# ------------------------------------------------------------------ 1. kill -9, many times
@pytest.mark.slow
def test_kill9_at_random_points_neither_loses_nor_double_counts(kafka_broker, kafka_topics, tmp_path):
    """12 SIGKILLs at seeded random moments over a warm-up phase and a stream phase.

    Warm-up phase (no subspace yet): every incarnation has ``batch_size=1``, so the
    warm-up states must equal a one-document-at-a-time reference *bit for bit*; each
    partition pauses at its first stream document. Then the subspace is published
    (``release/subspace`` + ``subspace_ready``, as the release service does) and the
    stream phase runs incarnations with random batch sizes. Each incarnation joins a
    fresh consumer group: a restart into the *same* group after SIGKILL waits for the
    dead member's session to expire (~11 s on Tansu; that path is covered by the
    rebalance test below); the state topic, not the group, is what a restart restores.
    """
    rng = np.random.default_rng(20261121)
    bootstrap, names = kafka_broker.bootstrap, kafka_topics
    corpus = make_corpus(8000, 18000, 3, seed=21)
    vocab = Vocabulary(corpus.vocabulary)
    vocab_path = tmp_path / "vocab.txt"
    vocab.save(vocab_path)
    assert produce(bootstrap, names.documents, corpus.records) == len(corpus.records)
    docs = read_topic(bootstrap, names.documents, expected=len(corpus.records))
    base = make_cfg(bootstrap, names, vocab_path, corpus)
    decoded = {q: decode_partition(recs, base, vocab, base.tokenizer_()) for q, recs in docs.items()}
    cut = {q: dec.first_stream_offset() for q, dec in decoded.items()}
    ends = {q: dec.end for q, dec in decoded.items()}
    assert sorted(docs) == [0, 1] and all(0 < cut[q] < ends[q] for q in cut), (cut, ends)
    assert all(any(r == 0 and off > cut[q] for off, _, r, _ in decoded[q].good) for q in cut), \
        "every partition needs a stale warm-up document after its first stream document"

    procs: list[SketcherProcess] = []
    kills: list[str] = []

    def start(phase: str, batch_size: int):
        cfg = base.replace(group_id=f"{names.documents}-crash-{len(procs)}", batch_size=batch_size)
        p = SketcherProcess(cfg, tmp_path, f"sk{len(procs):02d}-{phase}-b{batch_size}")
        procs.append(p)
        return p, cfg

    def kill_at_random_point(p: SketcherProcess, how: str):
        """how: "run" (after the process sketched a random number of documents: mid-batch,
        mid-checkpoint, between them), "checkpoint" (after a random number of documents, as
        the first chunk of the next checkpoint lands), "start" (a random moment after the
        start: join, restore, first batches). Counting documents rather than seconds keeps
        the kills inside the input on a faster machine too."""
        if how == "start":
            delay = rng.uniform(0.3, 3.0)
            time.sleep(delay)
            p.check_alive()                    # it must not have died on its own
            p.kill()
            kills.append(f"{p.name}: SIGKILL {delay:.2f} s after the start")
            return
        p.wait_assigned()
        n = int(rng.integers(100, 1200) if how == "run" else rng.integers(50, 600))
        got = p.wait_processed(n)
        if how == "checkpoint":
            what = kill_during_checkpoint(p, bootstrap, names.state)
        else:
            time.sleep(rng.uniform(0.0, 0.1))
            p.check_alive()
            p.kill()
            what = "SIGKILL"
        kills.append(f"{p.name}: {what} after >= {got:.0f} documents (target {n})")

    t0 = time.monotonic()
    try:
        # ---------------- warm-up phase: 4 kills, then one incarnation reaches the pause
        for how in ("run", "checkpoint", "start", "run"):
            kill_at_random_point(start("warmup", 1)[0], how)
        before = read_states(bootstrap, names, None)
        assert any(before.get(q) is None or before[q].next_offset < cut[q] for q in cut), \
            "the warm-up was done before the kills: make the kills earlier or the input longer"
        p, cfg = start("warmup", 1)
        p.wait_assigned()
        blocker_rt = {q: decoded[q].recs[cut[q]].rt for q in cut}

        def paused_states():
            if committed_offsets(bootstrap, cfg.group_id, names.documents, cut) != cut:
                return None
            st = read_states(bootstrap, names, None)
            ok = all(q in st and st[q].next_offset == cut[q] and st[q].progress == blocker_rt[q]
                     for q in cut)
            return st if ok else None

        states = wait_for(paused_states, 90, "both partitions paused at their first stream document",
                          interval=0.3, check=p.check_alive)
        t_warm = time.monotonic() - t0
        refs = {q: reference_state(dec, cfg, upto=cut[q], warmup_closed_at=None, keep_warmup=True,
                                   per_document=True, progress=blocker_rt[q])
                for q, dec in decoded.items()}
        assert all(r.warmup is not None and r.warmup.n_docs > 3000 for r in refs.values())
        check_states(states, refs, rtol=0, where="warm-up phase, bit for bit")

        # ---------------- stream phase: publish the subspace, 8 more kills
        sub = random_subspace(len(vocab), cfg.k_prime(len(vocab)), seed=2)
        publish_subspace(bootstrap, names, sub, CLIP, vocab.id, announce=True)
        # the live incarnation resumes on subspace_ready, sketches the first stream documents
        # and counts the stale warm-up documents among them as late; it checkpoints that
        time.sleep(rng.uniform(1.0, 1.6))
        p.check_alive()
        p.kill()
        kills.append(f"{p.name}: SIGKILL after subspace_ready")
        for how in ("checkpoint", "run", "start", "run", "checkpoint", "run", "checkpoint"):
            kill_at_random_point(start("stream", int(rng.choice([1, 2, 3, 5, 8])))[0], how)
        before = read_states(bootstrap, names, sub)
        assert any(before[q].next_offset < ends[q] for q in ends), \
            "the input was done before the kills: make the kills earlier or the input longer"
        p, cfg = start("final", int(rng.choice([4, 16, 64])))
        p.wait_assigned()
        wait_for(lambda: committed_offsets(bootstrap, cfg.group_id, names.documents, ends) == ends,
                 90, "the last incarnation to reach the end of both partitions",
                 interval=0.3, check=p.check_alive)
        assert p.terminate() == 0, p.tail()
        t_all = time.monotonic() - t0
    finally:
        for q in procs:
            q.ensure_dead()

    for q in procs:
        assert "Traceback" not in q.log(), q.tail(60)
    states = read_states(bootstrap, names, sub)
    refs = {q: reference_state(dec, cfg, warmup_closed_at=cut[q], keep_warmup=False, subspace=sub,
                               clip=CLIP)
            for q, dec in decoded.items()}
    check_states(states, refs, rtol=0, where="after 12 kills, bit for bit")
    # the reference is not trivially satisfied: every kind of record is in it
    total = {k: sum(r.counters[k] for r in refs.values()) for k in refs[0].counters}
    assert total["warmup_documents"] > 7000 and total["documents"] > 16000, total
    assert min(total["late"], total["empty"], total["dlq"], total["unknown_tokens"]) > 0, total
    assert all(len(r.epochs) == 3 for r in refs.values())
    n_dlq = assert_dead_lettered(bootstrap, names, decoded)
    debris = state_topic_debris(bootstrap, names.state)
    print(f"\nkill test: {len(kills)} kills, warm-up phase {t_warm:.1f} s, total {t_all:.1f} s; "
          f"DLQ records {n_dlq} for {total['dlq']} bad documents; state topic {debris}")
    print("\n".join(kills))
    assert len(kills) == 12


# ------------------------------------------------------------------ 2. rebalance
class PacedProducer(threading.Thread):
    """Produces the records in chunks while the group rebalances (a live stream); the last
    ``hold`` records only once ``go_on`` is set (so some surely arrive after a member went)."""

    def __init__(self, bootstrap, topic, records, *, hold=0, chunk=200, pause=0.2):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.records = bootstrap, topic, records
        self.hold, self.chunk, self.pause = hold, chunk, pause
        self.stop, self.go_on = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.sent = 0

    def run(self):
        from confluent_kafka import Producer
        from streamdp.kafka.topics import client_config
        producer = Producer(client_config(self.bootstrap, "producer", **{
            "enable.idempotence": True, "acks": "all", "linger.ms": 5}))
        split = len(self.records) - self.hold
        try:
            for i, part in enumerate((self.records[:split], self.records[split:])):
                if i == 1:
                    while not self.go_on.wait(0.1):
                        if self.stop.is_set():
                            return
                for s in range(0, len(part), self.chunk):
                    if self.stop.is_set():
                        return
                    self.sent += produce(self.bootstrap, self.topic, part[s:s + self.chunk],
                                         producer=producer)
                    time.sleep(self.pause)
        except BaseException as exc:          # noqa: BLE001 — reported by the test
            self.error = exc
        finally:
            producer.flush(30)


@pytest.mark.slow
@pytest.mark.parametrize("second_member", ["leaves", "is_killed"])
def test_rebalance_second_member_joins_and_goes(kafka_broker, kafka_topics, tmp_path, second_member):
    """A runs; B joins (the partitions are split), later B leaves with SIGTERM — or is
    SIGKILLed, and its partition comes back to A after the session timeout. Documents keep
    arriving throughout; the final states equal the clean reference."""
    rng = np.random.default_rng(7 if second_member == "leaves" else 8)
    bootstrap, names = kafka_broker.bootstrap, kafka_topics
    corpus = make_corpus(300, 14000, 3, seed=31)
    vocab = Vocabulary(corpus.vocabulary)
    vocab_path = tmp_path / "vocab.txt"
    vocab.save(vocab_path)
    cfg = make_cfg(bootstrap, names, vocab_path, corpus, group_id=f"{names.documents}-sketchers",
                   batch_size=16)
    # the subspace exists from the start: warm-up documents are late, stream ones sketched
    sub = random_subspace(len(vocab), cfg.k_prime(len(vocab)), seed=3)
    publish_subspace(bootstrap, names, sub, CLIP, vocab.id, announce=False)
    head, rest = corpus.records[:2000], corpus.records[2000:]
    produce(bootstrap, names.documents, head)

    a = b = None
    feeder = PacedProducer(bootstrap, names.documents, rest, hold=3000)
    t0 = time.monotonic()
    try:
        a = SketcherProcess(cfg, tmp_path, "A")
        assert a.wait_assigned(1) == [0, 1]
        feeder.start()
        time.sleep(0.5)
        b = SketcherProcess(cfg, tmp_path, "B")
        b_parts = b.wait_assigned(1)
        wait_for(lambda: len(a.assignments()) >= 2, 30, "A's share after B joined", check=a.check_alive)
        a_parts = a.assignments()[-1]
        assert b_parts and a_parts and sorted(a_parts + b_parts) == [0, 1], (a_parts, b_parts)
        t_join = time.monotonic() - t0
        time.sleep(rng.uniform(1.0, 2.0))
        b.check_alive()
        n_b = b.documents_processed()
        assert n_b and n_b > 0, "B sketched nothing before it went: nothing was tested"
        if second_member == "leaves":
            assert b.terminate() == 0, b.tail()
        else:
            b.kill()
        t_gone = time.monotonic()
        feeder.go_on.set()                     # the last 3,000 documents arrive after B went
        wait_for(lambda: len(a.assignments()) >= 3 and a.assignments()[-1] == [0, 1], 45,
                 "A to get both partitions back", interval=0.05, check=a.check_alive)
        t_back = time.monotonic() - t_gone
        feeder.join(60)
        assert not feeder.is_alive() and feeder.error is None, feeder.error
        docs = read_topic(bootstrap, names.documents, expected=len(corpus.records))
        ends = {q: len(recs) for q, recs in docs.items()}
        wait_for(lambda: committed_offsets(bootstrap, cfg.group_id, names.documents, ends) == ends,
                 60, "A to reach the end of both partitions", interval=0.3, check=a.check_alive)
        assert a.terminate() == 0, a.tail()
    finally:
        feeder.stop.set()
        for p in (a, b):
            if p is not None:
                p.ensure_dead()

    for p in (a, b):
        assert "Traceback" not in p.log(), p.tail(60)
    decoded = {q: decode_partition(recs, cfg, vocab, cfg.tokenizer_()) for q, recs in docs.items()}
    refs = {q: reference_state(dec, cfg, warmup_closed_at=0, keep_warmup=False, subspace=sub, clip=CLIP)
            for q, dec in decoded.items()}
    check_states(read_states(bootstrap, names, sub), refs, rtol=0,
                 where=f"after B {second_member.replace('_', ' ')}")
    total = {k: sum(r.counters[k] for r in refs.values()) for k in refs[0].counters}
    assert total["late"] >= 300 and total["documents"] > 13000, total
    assert_dead_lettered(bootstrap, names, decoded)
    print(f"\nrebalance ({second_member}): B joined {t_join:.1f} s after start, sketched "
          f">= {n_b:.0f} documents, A got its "
          f"partition back {t_back:.1f} s after B went; assignments A {a.assignments()}, "
          f"B {b.assignments()}; total {time.monotonic() - t0:.1f} s")
