"""The sketcher's stream processor (streamdp/services/processor.py) on the embedded broker:
cooperative rebalancing, restores with the partitions paused, and a crash inside the
checkpoint on revoke. Each run's final state records are compared exactly with a clean
single-process reference (crash_helpers.reference_state), so a document lost or counted
twice fails the test (test_crash_consistency.test_reference_notices_one_document).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from streamdp.services.produce import produce
from streamdp.text.vocabulary import Vocabulary

from crash_helpers import (SketcherProcess, committed_offsets, decode_partition, make_corpus,
                           publish_subspace, random_subspace, read_states, read_topic,
                           reference_state, wait_for)
from test_crash_consistency import CLIP, PacedProducer, assert_dead_lettered, check_states, make_cfg


def _setup(kafka_broker, kafka_topics, tmp_path, *, n_stream: int, seed: int, **cfg_kw):
    bootstrap, names = kafka_broker.bootstrap, kafka_topics
    corpus = make_corpus(300, n_stream, 3, seed=seed)
    vocab = Vocabulary(corpus.vocabulary)
    vocab_path = tmp_path / "vocab.txt"
    vocab.save(vocab_path)
    cfg = make_cfg(bootstrap, names, vocab_path, corpus, group_id=f"{names.documents}-sketchers",
                   **cfg_kw)
    # the subspace exists from the start: warm-up documents are late, stream ones sketched
    sub = random_subspace(len(vocab), cfg.k_prime(len(vocab)), seed=3)
    publish_subspace(bootstrap, names, sub, CLIP, vocab.id, announce=False)
    return bootstrap, names, corpus, vocab, cfg, sub


def _check_against_reference(bootstrap, names, corpus, vocab, cfg, sub, where):
    docs = read_topic(bootstrap, names.documents, expected=len(corpus.records))
    decoded = {q: decode_partition(recs, cfg, vocab, cfg.tokenizer_()) for q, recs in docs.items()}
    refs = {q: reference_state(dec, cfg, warmup_closed_at=0, keep_warmup=False, subspace=sub, clip=CLIP)
            for q, dec in decoded.items()}
    check_states(read_states(bootstrap, names, sub), refs, rtol=0, where=where)
    assert_dead_lettered(bootstrap, names, decoded)
    return refs


def _ends(bootstrap, names, corpus) -> dict[int, int]:
    docs = read_topic(bootstrap, names.documents, expected=len(corpus.records))
    return {q: len(recs) for q, recs in docs.items()}


class InProcess:
    """A Sketcher ``run`` in a daemon thread (exceptions kept for the test)."""

    def __init__(self, cfg, name: str, prepare=None):
        from streamdp.services.sketcher import Sketcher
        self.sk = Sketcher(cfg, instance=name)
        if prepare is not None:
            prepare(self.sk)
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True, name=name)
        self.thread.start()

    def _run(self):
        try:
            self.sk.run(install_signals=False)
        except BaseException as exc:             # noqa: BLE001 — surfaced by check()
            self.errors.append(exc)

    def check(self):
        if self.errors:
            raise AssertionError(f"{self.sk.instance} died: {self.errors[0]!r}") from self.errors[0]

    def owned(self) -> list[int]:
        """Partitions assigned and restored (none still restoring)."""
        p = self.sk.processor
        return [] if p.restoring else sorted(p.strategy.partitions())

    def stop(self):
        self.sk.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), f"{self.sk.instance} did not stop"
        self.check()


@pytest.mark.slow
def test_cooperative_rebalance_keeps_the_partitions_that_stay(kafka_broker, kafka_topics, tmp_path):
    """A processes both partitions; B joins while A is busy. With cooperative-sticky only the
    partition that moves is revoked (and checkpointed) by A: A's log of rebalance callbacks
    has no revoke of the partition it keeps, A writes no checkpoint of it at the rebalance
    (periodic checkpoints are off) and goes on processing it meanwhile. Every document is
    counted exactly once."""
    bootstrap, names, corpus, vocab, cfg, sub = _setup(
        kafka_broker, kafka_topics, tmp_path, n_stream=8000, seed=41, checkpoint_seconds=1e9)
    head, rest = corpus.records[:2000], corpus.records[2000:]
    produce(bootstrap, names.documents, head)
    writes: list[tuple[float, str]] = []
    submits: list[tuple[float, int]] = []

    def record_writes(sk):
        write = sk.store.write
        submit = sk.strategy.submit

        def recorded_submit(p, batch):
            submits.append((time.monotonic(), p))
            return submit(p, batch)
        sk.strategy.submit = recorded_submit

        def recorded(key, payload, meta=None):
            out = write(key, payload, meta=meta)
            if key.startswith("sketch/"):
                writes.append((time.monotonic(), key))
            return out
        sk.store.write = recorded

    feeder = PacedProducer(bootstrap, names.documents, rest, chunk=100, pause=0.3)
    feeder.go_on.set()                          # nothing held back
    a = b = None
    try:
        a = InProcess(cfg, "A", prepare=record_writes)
        wait_for(lambda: a.owned() == [0, 1], 60, "A to own both partitions", check=a.check)
        feeder.start()
        wait_for(lambda: sum(st.counters["documents"] for st in list(a.sk.states.values())) > 0,
                 30, "A to sketch documents", check=a.check)
        t_join = time.monotonic()
        b = InProcess(cfg, "B")
        wait_for(lambda: len(b.owned()) == 1 and len(a.owned()) == 1, 60,
                 "the partitions to be split", check=lambda: (a.check(), b.check()))
        t_split = time.monotonic()
        kept, moved = a.owned()[0], b.owned()[0]
        log = a.sk.processor.rebalance_log
        revoked = [p for kind, ps in log if kind == "revoke" for p in ps]
        assert revoked == [moved], log                          # the kept one never revoked
        assert [p for kind, ps in log if kind == "lost" for p in ps] == [], log
        assert [ps for kind, ps in log if kind == "assign" and ps] == [[0, 1]], log   # not reassigned
        during = [k for t, k in writes if t_join <= t <= t_split]
        assert during == [f"sketch/{names.documents}/{moved}"], during
        # A went on processing the partition it keeps while the group rebalanced
        assert any(t_join < t < t_split and p == kept for t, p in submits), (kept, t_join, t_split)
        feeder.join(60)
        assert not feeder.is_alive() and feeder.error is None, feeder.error
        ends = _ends(bootstrap, names, corpus)
        wait_for(lambda: a.sk.states[kept].next_offset == ends[kept]
                 and b.sk.states[moved].next_offset == ends[moved], 60, "both to reach the end",
                 check=lambda: (a.check(), b.check()))
        a.stop()
        b.stop()
    finally:
        feeder.stop.set()
        for w in (a, b):
            if w is not None and w.thread.is_alive():
                w.sk.stop()
                w.thread.join(30)
    refs = _check_against_reference(bootstrap, names, corpus, vocab, cfg, sub, "after B joined")
    assert sum(r.counters["documents"] for r in refs.values()) > 7000


@pytest.mark.slow
def test_restore_with_the_partitions_paused(kafka_broker, kafka_topics, tmp_path):
    """The assign callback returns at once; the state is read by the poll loop (slowed down
    here). No record of a partition reaches the strategy before its state is loaded, health
    is not ready meanwhile, and each partition starts exactly at the restored next_offset."""
    bootstrap, names, corpus, vocab, cfg, sub = _setup(
        kafka_broker, kafka_topics, tmp_path, n_stream=3000, seed=42)
    head, rest = corpus.records[:1800], corpus.records[1800:]
    produce(bootstrap, names.documents, head)
    first = InProcess(cfg, "first")
    try:
        head_ends = _ends_of(bootstrap, names, len(head))
        wait_for(lambda: first.owned() == [0, 1] and all(
            first.sk.states[q].next_offset == head_ends[q] for q in (0, 1)), 60,
            "the first sketcher to sketch the head", check=first.check)
    finally:
        first.stop()                            # checkpoints on the way out
    restored = {q: st.next_offset for q, st in read_states(bootstrap, names, sub).items()}
    assert restored == head_ends
    produce(bootstrap, names.documents, rest)

    events: list[tuple] = []                    # ("read-start"|"read-end"|"process", ...)
    callbacks_returned: list[float] = []

    def slow_restore(sk):
        read = sk.store.read_all_latest
        submit = sk.strategy.submit
        on_assign = sk.processor.on_assign

        def slow_read(prefix=""):
            events.append(("read-start", time.monotonic(), sk.health.is_ready()))
            time.sleep(3.0)
            out = read(prefix=prefix)
            events.append(("read-end", time.monotonic(), sk.health.is_ready()))
            return out

        def recorded_submit(p, batch):
            events.append(("process", time.monotonic(), p, batch[0].offset(),
                           sk.strategy.owns(p)))
            return submit(p, batch)

        def timed_on_assign(consumer, partitions):
            t0 = time.monotonic()
            on_assign(consumer, partitions)
            callbacks_returned.append(time.monotonic() - t0)
        sk.store.read_all_latest = slow_read
        sk.strategy.submit = recorded_submit
        sk.processor.on_assign = timed_on_assign

    second = InProcess(cfg, "second", prepare=slow_restore)
    try:
        ends = _ends(bootstrap, names, corpus)
        wait_for(lambda: second.owned() == [0, 1] and all(
            second.sk.states[q].next_offset == ends[q] for q in (0, 1)), 60,
            "the second sketcher to reach the end", check=second.check)
    finally:
        second.stop()
    assert callbacks_returned and max(callbacks_returned) < 1.0, callbacks_returned   # not blocked
    reads = [e for e in events if e[0] in ("read-start", "read-end")]
    assert reads[0][0] == "read-start" and reads[0][2] is False          # not ready while restoring
    assert reads[1][0] == "read-end" and reads[1][2] is False
    loaded = reads[1][1]
    processed = [e for e in events if e[0] == "process"]
    assert processed and all(t >= loaded for _, t, *_ in processed), "processed before the restore"
    for q in (0, 1):
        firsts = [off for _, _, p, off, _ in processed if p == q]
        assert firsts and firsts[0] == restored[q], (q, firsts[:3], restored)
    _check_against_reference(bootstrap, names, corpus, vocab, cfg, sub, "after the paused restore")


def _ends_of(bootstrap, names, n_records) -> dict[int, int]:
    docs = read_topic(bootstrap, names.documents, expected=n_records)
    return {q: len(recs) for q, recs in docs.items()}


CRASH_ON_REVOKE = r'''
import os, signal, sys
from pathlib import Path

marker = Path(sys.argv[2])
from streamdp.kafka.state_store import StateStore
from streamdp.services import sketch_strategy

_revoke = sketch_strategy.SketchStrategy.revoke
in_revoke = []

def revoke(self, partitions):
    in_revoke.append(True)
    try:
        return _revoke(self, partitions)
    finally:
        in_revoke.pop()

_write = StateStore.write

def write(self, key, payload, meta=None):
    # armed by the test: die in the state write of the checkpoint on revoke, after its
    # offset commit (the fence) went through: the committed offset is then ahead of the state
    if in_revoke and key.startswith("sketch/") and marker.exists():
        marker.unlink()
        Path(str(marker) + ".crashed").write_text(f"{key} next_offset={(meta or {}).get('next_offset')}")
        print(f"INJECTED: crash in the checkpoint of {key} on revoke", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return _write(self, key, payload, meta)

sketch_strategy.SketchStrategy.revoke = revoke
StateStore.write = write
from streamdp.cli import main
sys.exit(main(["sketcher", "--config", sys.argv[1], "--log-level", "INFO"]))
'''


class CrashOnRevoke(SketcherProcess):
    """A sketcher subprocess that dies (SIGKILL) in the state write of its next checkpoint on
    revoke."""

    def __init__(self, cfg, workdir: Path, name: str):
        marker = Path(workdir) / f"{name}.crash-on-revoke"
        marker.write_text("armed")
        super().__init__(cfg, workdir, name, script=CRASH_ON_REVOKE, marker=marker)
        self.marker = marker

    def crashed(self) -> str | None:
        p = Path(str(self.marker) + ".crashed")
        return p.read_text() if p.exists() else None


@pytest.mark.slow
def test_crash_inside_the_checkpoint_on_revoke(kafka_broker, kafka_topics, tmp_path):
    """A owns both partitions and is busy when B joins; A dies in the state write of its
    checkpoint on revoke, after that checkpoint's offset commit (the fence) went through. B
    restores the partitions from their last state records — none here: from the beginning —
    not from the committed offsets. A is restarted and takes a partition back. Nothing is
    lost or counted twice.

    (The crash is a SIGKILL: a Python exception there ends the process through ``close()``,
    which leaves the group in the middle of the rebalance, and Tansu then never completes
    that rebalance for B — with eager and with cooperative assignment alike, measured.)"""
    from dataclasses import replace
    bootstrap, names, corpus, vocab, cfg, sub = _setup(
        kafka_broker, kafka_topics, tmp_path, n_stream=9000, seed=43, checkpoint_seconds=0.4)
    head, rest = corpus.records[:2000], corpus.records[2000:]
    produce(bootstrap, names.documents, head)
    feeder = PacedProducer(bootstrap, names.documents, rest, hold=2000)
    a = b = a2 = None
    try:
        # A: no periodic checkpoint, so the moved partition is surely unsaved at the revoke
        a = CrashOnRevoke(replace(cfg, checkpoint_seconds=1e9), tmp_path, "A")
        assert a.wait_assigned(1, timeout=60) == [0, 1]
        feeder.start()
        time.sleep(0.5)
        b = SketcherProcess(cfg, tmp_path, "B")
        wait_for(lambda: a.crashed() is not None, 60, "A to crash in its checkpoint on revoke",
                 check=b.check_alive)
        a.proc.wait(30)
        wait_for(lambda: b.assignments() and b.assignments()[-1] == [0, 1], 90,
                 "B to own both partitions", check=b.check_alive)
        feeder.go_on.set()
        a2 = SketcherProcess(cfg, tmp_path, "A2")
        a2_parts = a2.wait_assigned(1, timeout=60)
        wait_for(lambda: len(b.assignments()[-1]) == 1, 60, "B to give a partition to A2",
                 check=b.check_alive)
        assert sorted(a2_parts + b.assignments()[-1]) == [0, 1], (a2_parts, b.assignments())
        feeder.join(60)
        assert not feeder.is_alive() and feeder.error is None, feeder.error
        ends = _ends(bootstrap, names, corpus)
        wait_for(lambda: committed_offsets(bootstrap, cfg.group_id, names.documents, ends) == ends,
                 60, "the group to reach the end of both partitions", interval=0.3,
                 check=lambda: (b.check_alive(), a2.check_alive()))
        assert b.terminate() == 0, b.tail()
        assert a2.terminate() == 0, a2.tail()
    finally:
        feeder.stop.set()
        for p in (a, b, a2):
            if p is not None:
                p.ensure_dead()
    assert "INJECTED: crash in the checkpoint" in a.log(), a.tail(40)
    for p in (b, a2):
        assert "Traceback" not in p.log(), p.tail(60)
    _check_against_reference(bootstrap, names, corpus, vocab, cfg, sub, "after the crash on revoke")
