"""Incremental state reads (issue 13): the release service's partition view, read incrementally,
equals a full re-read after every step of a history with zombie records, a torn write, garbage
collection and a restart; decoded states are cached by (partition, generation)."""
from __future__ import annotations

import os
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from streamdp.kafka.state_store import (CHUNK_KIND, StateStore, chunk_key, latest_from_records,
                                        partition_for)
from streamdp.kafka.topics import client_config
from streamdp.serialization import dumps
from streamdp.services import state_view
from streamdp.services.partition_state import state_key
from streamdp.services.state_view import PartitionView

DOCS = "documents"
NOW = 2_000_000_000.0


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"test.state.{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(name, partitions, 1,
                                             config={"cleanup.policy": "compact"})]).values():
        fut.result(10)
    return name


def _raw(bootstrap: str, topic: str, partitions: int) -> list[tuple[bytes, bytes | None]]:
    """Every record of the topic, partition by partition (a reader from the beginning)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
    out = []
    for p in range(partitions):
        c = Consumer(client_config(bootstrap, "consumer", **{
            "group.id": uuid.uuid4().hex, "enable.auto.commit": False,
            "enable.partition.eof": True, "isolation.level": "read_committed"}))
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING)])
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        while hi > lo:
            m = c.poll(5)
            assert m is not None, "state topic read timed out"
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    break
                continue
            out.append((m.key(), m.value()))
        c.close()
    return out


def _meta(p: int, next_offset: int, fence: int, epochs=(1,)) -> dict:
    return {"partition": p, "next_offset": next_offset, "fence": fence, "progress": NOW - 10.0,
            "epochs": list(epochs)}


@pytest.fixture
def env(kafka_broker):
    bs = kafka_broker.bootstrap
    topic = _topic(bs, 3)
    prod = Producer(client_config(bs, "producer", **{"enable.idempotence": True, "linger.ms": 1}))
    yield bs, topic, prod
    prod.close()


def test_incremental_partition_view_equals_full_reread(env):
    bs, topic, prod = env
    sketcher = StateStore(prod, bs, topic, chunk_bytes=700)     # several chunks per state
    zombie = StateStore(prod, bs, topic, chunk_bytes=700)       # a sketcher that lost its partition

    def views():
        return (PartitionView(StateStore(prod, bs, topic), DOCS),
                PartitionView(StateStore(prod, bs, topic, incremental=False), DOCS))

    inc, full = views()
    keys = [state_key(DOCS, p) for p in range(4)]
    assert len({partition_for(k, 3) for k in keys}) == 2        # spread over partitions

    def check(expect_next: dict[int, int]):
        a, b = inc.read(now=NOW), full.read(now=NOW)
        assert a == b
        assert {p: r.meta["next_offset"] for p, r in a.items()} == expect_next
        assert inc.rejected == full.rejected
        # and the store's fold equals the pure fold over every record on the log
        raw = latest_from_records(_raw(bs, topic, 3), lambda k: k.startswith(f"sketch/{DOCS}/"))
        assert inc.store.read_all_latest(f"sketch/{DOCS}/") == raw
        return a

    check({})                                                   # nothing written yet
    for p in range(4):
        sketcher.write(keys[p], os.urandom(1500 + 100 * p), _meta(p, 10 + p, fence=1))
    check({0: 10, 1: 11, 2: 12, 3: 13})
    sketcher.write(keys[0], os.urandom(2000), _meta(0, 40, fence=1))
    check({0: 40, 1: 11, 2: 12, 3: 13})
    # a zombie checkpoint: newer generation, next_offset backwards -> rejected by both
    zombie.write(keys[0], os.urandom(900), _meta(0, 25, fence=1))
    assert check({0: 40, 1: 11, 2: 12, 3: 13})[0].meta["fence"] == 1
    assert inc.rejected == 1
    # an older fencing token with offsets forward: rejected as well
    zombie.write(keys[1], os.urandom(900), _meta(1, 99, fence=0))
    check({0: 40, 1: 11, 2: 12, 3: 13})
    # the partition's new owner (fence 2) moves on: accepted
    sketcher.write(keys[1], os.urandom(1200), _meta(1, 60, fence=2))
    check({0: 40, 1: 60, 2: 12, 3: 13})
    # a torn write: chunks of a newer generation, no manifest -> the old state stays
    torn_gen = 10**19
    prod.produce(topic, key=chunk_key(keys[2], torn_gen, 0).encode(),
                 partition=partition_for(keys[2], 3),
                 value=dumps({"kind": CHUNK_KIND, "v": 1, "key": keys[2], "generation": torn_gen,
                              "index": 0, "n_chunks": 2, "data": b"x" * 10}))
    prod.flush(10)
    check({0: 40, 1: 60, 2: 12, 3: 13})
    sketcher.write(keys[2], os.urandom(3000), _meta(2, 77, fence=1))   # newer than the debris
    check({0: 40, 1: 60, 2: 77, 3: 13})

    # restart: both services start from nothing; the restarted view reads the whole topic once
    inc, full = views()
    check({0: 25, 1: 60, 2: 77, 3: 13})     # a fresh process takes the newest records (as before)
    sketcher.write(keys[3], os.urandom(500), _meta(3, 80, fence=3))
    sketcher.write(keys[0], os.urandom(500), _meta(0, 30, fence=1))
    check({0: 30, 1: 60, 2: 77, 3: 80})
    zombie.write(keys[0], os.urandom(500), _meta(0, 29, fence=1))
    check({0: 30, 1: 60, 2: 77, 3: 80})
    assert inc.rejected == full.rejected == 1


def test_decoded_states_cached_by_partition_and_generation(monkeypatch):
    decoded = []

    class FakeState:
        @staticmethod
        def from_bytes(payload, subspace):
            decoded.append(payload)
            return ("state", payload, subspace.id)

    class Sub:
        def __init__(self, id_):
            self.id = id_

    from streamdp.kafka.state_store import StateRecord
    monkeypatch.setattr(state_view, "PartitionState", FakeState)
    view = PartitionView(store=None, documents_topic=DOCS)
    s1, s2 = Sub("q1"), Sub("q2")
    states = {0: StateRecord(b"p0", {}, 5), 1: StateRecord(b"p1", {}, 7)}
    first = view.load(states, s1)
    assert first == [("state", b"p0", "q1"), ("state", b"p1", "q1")] and len(decoded) == 2
    assert view.load(states, s1) == first and len(decoded) == 2          # nothing decoded again
    states[1] = StateRecord(b"p1'", {}, 8)                                # a new generation
    assert view.load(states, s1)[1] == ("state", b"p1'", "q1") and len(decoded) == 3
    view.load(states, s2)                                                 # another subspace
    assert len(decoded) == 5
    assert view.load({0: states[0]}, s2) == [("state", b"p0", "q2")] and set(view._decoded) == {0}
