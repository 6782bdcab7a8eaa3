"""Issue 26 item 5: a processing strategy raises what it could not process, and the stream
processor alone decides what that becomes — a dead letter (InvalidRecord) or a hold
(NotReady) — in one place (StreamProcessor.submit), as arroyo's InvalidMessage and
MessageRejected. The real Sketcher over fake Kafka clients (tests/sketcher_harness.py)."""
from __future__ import annotations

import numpy as np
import pytest

from streamdp import messages
from streamdp.errors import InvalidRecord, NotReady
from streamdp.whitening.subspace import Subspace

from sketcher_harness import World, epoch_start, make_config, make_sketcher

WORDS = [f"w{i}" for i in range(12)]
GARBAGE = b"\xc1 not msgpack"


def _world(tmp_path, records):
    sub = Subspace(np.linalg.qr(np.random.default_rng(0).standard_normal((len(WORDS), 3)))[0])
    world = World(make_config(tmp_path, WORDS, 2, refinement=False, batch_size=20), sub)
    world.add_documents(records)
    return world


def _docs(n: int):
    ts = epoch_start(1) + 10.0 + np.arange(n)
    return [(messages.encode_document(f"doc-{i}", float(ts[i]), tokens=WORDS[i:i + 5]), float(ts[i]))
            for i in range(n)]


def _raised(sk, batch) -> list[Exception]:
    with pytest.raises(ExceptionGroup) as info:
        sk.strategy.submit(0, batch)
    return list(info.value.exceptions)


def test_bad_records_are_raised_by_the_strategy_and_dead_lettered_by_the_processor(tmp_path, monkeypatch):
    docs = _docs(6)
    records = docs + [docs[1], (GARBAGE, docs[-1][1])]       # a copy, then garbage
    sk = make_sketcher(_world(tmp_path / "a", records), monkeypatch)
    assert not hasattr(sk.strategy, "attach") and not hasattr(sk.strategy, "io")
    batch = sk.consumer.consume(num_messages=20)
    raised = _raised(sk, batch)
    assert all(isinstance(e, InvalidRecord) for e in raised)
    assert [(e.record.offset(), e.error.error_class) for e in raised] == [
        (6, messages.DUPLICATE_ID), (7, messages.MALFORMED_MSGPACK)]
    # the good records were processed before the raise; the strategy produced nothing
    st = sk.states[0]
    assert st.next_offset == 8 and st.counters["documents"] == 6 and st.counters["dlq"] == 2
    assert sk.producer.produced == []

    # the same records through the processor: dead-lettered there, in offset order
    sk2 = make_sketcher(_world(tmp_path / "b", records), monkeypatch)
    sk2.step()
    assert [(t, v) for t, v in sk2.producer.produced] == [
        (sk2.processor.dlq_topic, records[6][0]), (sk2.processor.dlq_topic, GARBAGE)]
    assert sk2.states[0].next_offset == 8 and not sk2.paused


def test_a_record_that_must_wait_is_raised_and_the_processor_holds_its_partition(tmp_path, monkeypatch):
    records = [(GARBAGE, epoch_start(1))] + _docs(3)
    sk = make_sketcher(_world(tmp_path / "a", records), monkeypatch)
    sk.context.subspace = None                   # the stream's documents wait for the subspace
    raised = _raised(sk, sk.consumer.consume(num_messages=20))
    assert [type(e) for e in raised] == [InvalidRecord, NotReady]
    assert raised[0].record.offset() == 0
    assert (raised[1].partition, raised[1].offset, raised[1].need) == (0, 1, "subspace")
    assert sk.states[0].next_offset == 1 and not sk.paused and sk.producer.produced == []

    sk2 = make_sketcher(_world(tmp_path / "b", records), monkeypatch)
    sk2.context.subspace = None
    sk2.step()
    assert sk2.paused == {0: "subspace"} and sk2.consumer.pos == 1     # seeked back to it
    assert [v for _, v in sk2.producer.produced] == [GARBAGE]
    assert sk2.states[0].next_offset == 1


# ------------------------------------------------------------------ outages while acting on them
class _NoWait:
    """The guard's stop flag: never set, and its back-off waits return at once."""

    def is_set(self):
        return False

    def wait(self, timeout=None):
        return False


def _guard(kafka_broker):
    from streamdp.kafka.connectivity import OutageGuard
    from streamdp.observability import HealthState
    # the real guard; its recovery probe asks the embedded broker
    return OutageGuard(HealthState(), {"bootstrap.servers": kafka_broker.bootstrap}, _NoWait(),
                       initial_backoff=0.01, max_backoff=0.01)


def _broker_down():
    from confluent_kafka import KafkaError, KafkaException
    return KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))


def test_an_outage_raised_by_a_dead_letter_and_a_hold_together_is_ridden_out(
        tmp_path, monkeypatch, kafka_broker):
    """A batch with a bad record and a record that must wait, while the broker goes down: the
    DLQ producer's queue is full and its poll raises a KafkaException, and the hold's pause
    raises one too. StreamProcessor.submit's two except* handlers then raise one
    ExceptionGroup of two KafkaExceptions. Before: OutageGuard caught only a bare
    KafkaException, so the group crashed the sketcher instead of being ridden out (alive, not
    ready, retried). A group holding anything but outage errors still fails loudly."""
    records = [(GARBAGE, epoch_start(1))] + _docs(3)
    sk = make_sketcher(_world(tmp_path, records), monkeypatch)
    sk.context.subspace = None                   # the stream's documents wait for the subspace

    def queue_full(*a, **k):
        raise BufferError("Local: Queue full")

    def down(*a, **k):
        raise _broker_down()
    sk.producer.produce, sk.producer.poll, sk.consumer.pause = queue_full, down, down
    with pytest.raises(ExceptionGroup) as info:        # what the guard is handed
        sk.process(0, sk.consumer.consume(num_messages=20))
    assert [type(e).__name__ for e in info.value.exceptions] == ["KafkaException"] * 2

    guard = _guard(kafka_broker)
    sk2 = make_sketcher(_world(tmp_path / "b", records), monkeypatch)
    sk2.context.subspace = None
    sk2.producer.produce, sk2.producer.poll, sk2.consumer.pause = queue_full, down, down
    assert guard.run(sk2.step) is False                # ridden out, not raised
    assert guard.in_outage and not guard.health.ready_flag()[0]

    def outage_and_bug():
        raise ExceptionGroup("mixed", [_broker_down(), ValueError("a bug, not an outage")])
    with pytest.raises(ExceptionGroup):
        guard.run(outage_and_bug)


@pytest.mark.parametrize("failing", ["pause", "seek"])
def test_records_a_failed_hold_left_behind_are_re_read_after_the_outage(tmp_path, monkeypatch,
                                                                       kafka_broker, failing):
    """The hold's pause or seek raises in an outage (librdkafka: "Local: Erroneous state"),
    so its partition is not held at its record: the consumer is past the records that must
    wait. The guard rides the outage out; then those records are re-read from the strategy's
    next offset, the partition held until the subspace is there. Before: with the pause
    failed, the next batch moved the partition's next offset past them — three documents
    never counted, with no error; with the seek failed, the partition stayed paused with no
    hold to resume it — nothing counted again."""
    from confluent_kafka import KafkaError, KafkaException
    world = _world(tmp_path, [(GARBAGE, epoch_start(1))] + _docs(3))
    sk = make_sketcher(world, monkeypatch)
    sk.context.subspace = None                   # the stream's documents wait for the subspace

    def fails(*a):
        raise KafkaException(KafkaError(KafkaError._STATE, "Local: Erroneous state"))
    setattr(sk.consumer, failing, fails)
    guard = _guard(kafka_broker)
    assert guard.run(sk.step) is False and guard.in_outage
    assert sk.states[0].next_offset == 1 and sk.consumer.pos == 4      # past the held records
    delattr(sk.consumer, failing)                                      # Kafka is back
    ts = epoch_start(1) + 100.0
    world.add_documents([(messages.encode_document("doc-late", ts, tokens=WORDS[:5]), ts)])
    assert guard.run(sk.step) and sk.paused == {0: "subspace"}         # held again
    sk.context.subspace = world.subspace                               # the subspace is released
    for _ in range(3):
        assert guard.run(sk.step)
    st = sk.states[0]
    assert (st.next_offset, st.counters["documents"]) == (5, 4), (st.next_offset, st.counters)
    assert [v for _, v in sk.producer.produced] == [GARBAGE]          # dead-lettered once
    assert not guard.in_outage and not sk.paused


# ------------------------------------------------------------------ dead letters that fail
def _checkpointed(world, sk):
    """The next offset of partition 0's checkpoint in the state store (None: never written)."""
    from streamdp.services.partition_state import PartitionState
    rec = world.store.read_latest(sk.states[0].key)
    return None if rec is None else PartitionState.from_bytes(rec.payload, world.subspace).next_offset


def test_a_dead_letter_whose_queue_stays_full_fails_the_step_as_an_outage_and_is_sent_after_it(
        tmp_path, monkeypatch, kafka_broker):
    """The broker is down and the DLQ producer's queue full: produce raises BufferError at every
    try. Before: DeadLetters._send_dead_letter polled and retried forever, the loop stopped
    beating liveness and sat until the pod was killed. Now it beats liveness while it waits at
    most DLQ_QUEUE_FULL_SECONDS, then fails the step with a BufferError the real guard rides out;
    the letter stays owed (no checkpoint covers its offset) and is produced at the first step
    after the outage."""
    import threading

    from streamdp.services import dead_letters
    from streamdp.services.processor import DeadLetterUndelivered
    monkeypatch.setattr(dead_letters, "DLQ_QUEUE_FULL_SECONDS", 0.5, raising=False)
    world = _world(tmp_path, [(GARBAGE, epoch_start(1))] + _docs(3))
    sk = make_sketcher(world, monkeypatch)
    beats = []
    health_beat = sk.processor.dead_letters.health.beat
    sk.processor.dead_letters.health.beat = lambda: (beats.append(1), health_beat())

    def queue_full(*a, **k):
        raise BufferError("Local: Queue full")
    sk.producer.produce = queue_full
    guard = _guard(kafka_broker)
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(guard.run(sk.step)), daemon=True)
    runner.start()
    runner.join(timeout=30)
    assert not runner.is_alive(), "the dead letter waits for the producer's queue forever"
    assert outcome == [False] and guard.in_outage                 # ridden out as an outage
    assert len(beats) >= 3                                        # alive while it waited
    st = sk.states[0]
    assert st.next_offset == 4 and st.counters["documents"] == 3  # the good records counted
    with pytest.raises(DeadLetterUndelivered, match=r"partition 0: 1 bad record.*offset 0"):
        sk.checkpoint(0)                                          # no checkpoint past the owed one
    assert _checkpointed(world, sk) is None
    del sk.producer.produce                                       # Kafka is back
    assert guard.run(sk.step) and not guard.in_outage
    assert [v for _, v in sk.producer.produced] == [GARBAGE]      # produced once, after the outage
    sk.checkpoint(0)
    assert _checkpointed(world, sk) == 4


def test_a_dead_letter_that_raises_mid_batch_leaves_no_checkpoint_over_the_rest(tmp_path, monkeypatch):
    """Three bad records in one batch; the DLQ producer's produce raises a ValueError (not an
    outage) for the second. The step fails loudly; the shutdown checkpoints (SIGTERM's
    checkpoint_all, the revoke when the consumer leaves the group) must not cover the two bad
    records not dead-lettered. Before: they did (next offset 6, one letter in the DLQ: two bad
    records lost without a trace). After a restart every bad record is re-read and
    dead-lettered."""
    from confluent_kafka import TopicPartition

    from streamdp.services.processor import DeadLetterUndelivered
    docs = _docs(3)
    bad = [GARBAGE, b"\xc1 garbage 2", b"\xc1 garbage 3"]
    ts = docs[-1][1]
    world = _world(tmp_path, [docs[0], (bad[0], ts), docs[1], (bad[1], ts), (bad[2], ts), docs[2]])
    sk = make_sketcher(world, monkeypatch)
    produce, calls = sk.producer.produce, []

    def produce_fails_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("a bug in the dead-letter path")
        return produce(*a, **k)
    sk.producer.produce = produce_fails_second
    with pytest.raises((ValueError, ExceptionGroup)):
        sk.step()
    assert sk.states[0].next_offset == 6                  # the strategy processed the batch
    with pytest.raises(DeadLetterUndelivered, match=r"partition 0: 2 bad record.*offset 3"):
        sk.checkpoint_all()                               # the SIGTERM checkpoint
    sk.consumer.incremental_unassign = lambda tps: None
    with pytest.raises(DeadLetterUndelivered):
        sk.processor.on_revoke(sk.consumer, [TopicPartition(sk.processor.topic, 0)])
    assert _checkpointed(world, sk) is None               # nothing covers the two owed records
    assert [v for _, v in sk.producer.produced] == [bad[0]]
    assert sk.processor.dead_letters.owed_below(0, 6) == [3, 4]    # still owed after the revoke
    sk.processor.on_lost(sk.consumer, [TopicPartition(sk.processor.topic, 0)])
    assert sk.processor.dead_letters.owed == {}           # lost: dropped unwritten, re-read by its owner

    restarted = make_sketcher(world, monkeypatch)         # re-reads from the last checkpoint
    restarted.step()
    assert [v for _, v in restarted.producer.produced] == bad
    restarted.checkpoint_all()
    assert _checkpointed(world, restarted) == 6
