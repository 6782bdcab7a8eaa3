"""The release writer's transactional producer after errors (issue 15, outages).

librdkafka's transactional producer reports three kinds of failure; each is handled so
that fencing stays intact and nothing half-written becomes visible:

* abortable (or an outage): the transaction is aborted and the next write starts
  clean — the failed payload is never visible to read_committed readers;
* fatal but not fencing: the producer is re-created with the same transactional.id
  (``init_transactions`` bumps the producer epoch, so the old instance is a zombie
  Kafka refuses), and the caller re-validates before writing again;
* fenced: the writer stops for good, and never re-initialises over the newer writer.
"""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from streamdp.kafka.state_store import StateStore, StateWriteError, WriterFenced, WriterReinitialised
from streamdp.kafka.topics import TopicNames, client_config, ensure_topics


class FailingOnce:
    """A transactional producer whose next ``commit_transaction`` raises ``error`` once, or
    whose next ``produce`` reports ``delivery_error`` to its delivery callback."""

    def __init__(self, producer: Producer) -> None:
        self._p = producer
        self.error: KafkaError | None = None
        self.delivery_error: KafkaError | None = None

    def produce(self, *a, on_delivery=None, **kw):
        if self.delivery_error is not None:
            err, self.delivery_error = self.delivery_error, None
            on_delivery(err, None)
            return None
        return self._p.produce(*a, on_delivery=on_delivery, **kw)

    def commit_transaction(self, *a):
        if self.error is not None:
            err, self.error = self.error, None
            raise KafkaException(err)
        return self._p.commit_transaction(*a)

    def __getattr__(self, name):
        return getattr(self._p, name)


@pytest.fixture
def writer(kafka_broker):
    names = TopicNames.from_prefix(f"wr.{uuid.uuid4().hex[:8]}")
    ensure_topics(kafka_broker.bootstrap, names, partitions=1)
    tid = f"{names.state}-writer"
    made = []

    def factory():
        p = Producer(client_config(kafka_broker.bootstrap, "producer", **{
            "transactional.id": tid, "enable.idempotence": True, "acks": "all"}))
        p.init_transactions(30)
        made.append(p)
        return FailingOnce(p)

    store = StateStore(factory(), kafka_broker.bootstrap, names.state, transactional=True,
                       producer_factory=factory, flush_timeout=10.0, read_timeout=20.0)
    yield store, made
    store.close()


def test_an_abortable_error_aborts_and_the_next_write_goes_through(writer):
    store, made = writer
    store.write("release/x", b"one")
    store.producer.error = KafkaError(KafkaError._TIMED_OUT, "injected", retriable=True,
                                      txn_requires_abort=True)
    with pytest.raises(StateWriteError) as info:
        store.write("release/x", b"lost")
    assert not isinstance(info.value, (WriterFenced, WriterReinitialised))
    # (an aborted transaction is invisible to read_committed readers on Kafka; the embedded
    # Tansu broker shows aborted records -- streamdp/kafka/broker.py -- so not asserted here)
    store.write("release/x", b"two")
    assert store.read_latest("release/x").payload == b"two"
    assert len(made) == 1 and store.fenced is None


def test_a_fatal_error_recreates_the_producer_and_fences_the_old_one(writer):
    store, made = writer
    store.write("release/x", b"one")
    store.producer.error = KafkaError(KafkaError._FATAL, "injected fatal", fatal=True)
    with pytest.raises(WriterReinitialised):
        store.write("release/x", b"lost")
    assert len(made) == 2 and store.reinitialisations == 1 and store.fenced is None
    store.write("release/x", b"two")                   # the new producer writes
    assert store.read_latest("release/x").payload == b"two"
    # the old instance is a zombie: its epoch is older, Kafka refuses its transaction
    old = made[0]
    with pytest.raises(KafkaException):
        old.begin_transaction()
        old.produce(store.topic, key=b"zombie", value=b"zombie", partition=0)
        old.commit_transaction(10)
    assert store.read_latest("release/x").payload == b"two"


def test_a_fatal_delivery_error_is_not_mistaken_for_fencing(writer):
    store, made = writer
    store.write("release/x", b"one")
    store.producer.delivery_error = KafkaError(KafkaError._FATAL, "injected fatal delivery",
                                               fatal=True)
    with pytest.raises(WriterReinitialised):
        store.write("release/x", b"lost")
    assert len(made) == 2 and store.fenced is None
    store.write("release/x", b"two")
    assert store.read_latest("release/x").payload == b"two"


def test_a_fenced_writer_stops_and_never_reinitialises(writer):
    store, made = writer
    store.write("release/x", b"one")
    store.producer.error = KafkaError(KafkaError.PRODUCER_FENCED, "injected fence", fatal=True)
    with pytest.raises(WriterFenced):
        store.write("release/x", b"lost")
    assert len(made) == 1 and store.fenced
    with pytest.raises(WriterFenced):
        store.write("release/x", b"again")


def test_a_fatal_error_after_a_takeover_does_not_fence_the_new_writer(writer):
    store, made = writer
    store.write("release/x", b"one")

    def taken_over():
        raise WriterFenced("a newer writer epoch is registered")
    store.producer_factory = taken_over
    store.producer.error = KafkaError(KafkaError._FATAL, "injected fatal", fatal=True)
    with pytest.raises(WriterFenced):
        store.write("release/x", b"lost")
    assert store.fenced and len(made) == 1


@pytest.mark.slow
def test_release_service_recreates_its_writer_after_a_fatal_error(kafka_broker, tmp_path):
    """A fatal (not fencing) error while persisting epoch 1: the service re-creates its
    producer (same transactional.id), re-validates and reloads, re-closes epoch 1 fulfilling
    its reservation, and goes on; the ledger shows one committed reservation per release."""
    from service_helpers import (Pipeline, fresh_topics, make_config, make_corpus, send_control,
                                 wait_for)
    from streamdp.privacy.accountant import Accountant
    from streamdp.privacy.ledger import FileLedger
    from streamdp.services.produce import produce

    names = fresh_topics(kafka_broker.bootstrap)
    corpus = make_corpus(400, 600, 2, seed=6)
    cfg = make_config(tmp_path, kafka_broker.bootstrap, names, corpus, epsilon=1.0)
    with Pipeline(cfg, sketchers=1) as pipe:
        rel = pipe.release
        produce(kafka_broker.bootstrap, names.documents,
                [corpus.record(i) for i in range(corpus.n_warm)])
        send_control(kafka_broker.bootstrap, names, "close", through=0)
        wait_for(lambda: rel.subspace is not None, 90, "the warm-up release", check=pipe.check)
        epoch_before = rel.writer_epoch
        failing = FailingOnce(rel.store.producer)
        failing.error = KafkaError(KafkaError._FATAL, "injected fatal", fatal=True)
        rel.store.producer = failing
        produce(kafka_broker.bootstrap, names.documents,
                [corpus.record(i) for i in range(corpus.n_warm, len(corpus.texts))])
        send_control(kafka_broker.bootstrap, names, "flush", through=corpus.epochs)
        snap = pipe.wait_released(2, timeout=120)
        assert snap.epoch == 2 and rel.fenced is None
        assert rel.store.reinitialisations == 1 and rel.store.producer is not failing
        assert rel.writer_epoch == epoch_before
    rep = Accountant(cfg.epsilon, cfg.delta, cfg.ledger).report()
    reserved = [r.key for r in FileLedger(cfg.ledger).read() if r.kind == "reserve"]
    assert reserved.count("tree:epoch=1") == 1 and reserved.count("tree:epoch=2") == 1
    assert rep["uncommitted"] == 0 and rep["epsilon_worst_case"] <= cfg.epsilon * (1 + 1e-9)
