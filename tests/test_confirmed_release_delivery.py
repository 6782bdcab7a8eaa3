"""Issue 25: a snapshot Kafka refuses is not claimed published (embedded broker).

Before, ``publish`` checked only that ``flush()`` left nothing queued, which is also true
after a refused delivery: the HTTP view and the folder then showed a snapshot the
snapshots topic never got."""
from __future__ import annotations

import types

import numpy as np
import pytest
from confluent_kafka import Producer

from service_helpers import fresh_topics, read_topic
from streamdp.services.release_sinks import ReleaseSinks
from streamdp.snapshot import TopicSnapshot


def _snap() -> TopicSnapshot:
    return TopicSnapshot(topic_word=np.full((2, 3), 1 / 3), alpha=np.ones(2), eigenvalues=np.ones(2),
                         n_docs=0.0, privacy={}, mechanism="none", subspace_id="s", epoch=1,
                         release_id="release-1", stage="spectral")


def test_a_refused_snapshot_stops_the_release_and_is_not_shown(kafka_broker, tmp_path):
    names = fresh_topics(kafka_broker.bootstrap)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True,
                         "acks": "all"})
    # a snapshots topic Kafka refuses (Tansu re-creates a deleted topic on produce)
    bad = types.SimpleNamespace(snapshots="no such topic!", control=names.control)
    sinks = ReleaseSinks(producer, bad, tmp_path / "snaps", vocabulary=lambda: None,
                         control_key=lambda: b"k" * 32)
    with pytest.raises(RuntimeError, match="refused"):
        sinks.publish(_snap())
    assert sinks.published is None and sinks.latest is None
    assert not list((tmp_path / "snaps").glob("*.msgpack"))
    # the same sinks on the real topic publish, and the record is there
    good = ReleaseSinks(producer, names, tmp_path / "snaps", vocabulary=lambda: None,
                        control_key=lambda: b"k" * 32)
    good.publish(_snap())
    assert good.latest is not None
    assert [r.key for r in read_topic(kafka_broker.bootstrap, names.snapshots)] == [b"release-1"]
