"""Topic message limits (issue 25 item 2; streamdp.services.record_limits, docs/operations.md
"Topic message limits").

Before: ``streamdp produce --create-topics`` created the snapshots and DLQ topics without
``max.message.bytes``, a refined snapshot at d = 10k, k = 20 is 2.40 MB, and on a real Kafka with
the default limit (1 MB) every release was refused while the files, HTTP and the log said it
was published. Now the topics are created with limits computed from the configuration, and
the services refuse to start on a topic whose limit is below its largest record.

The embedded broker (Tansu) stores and reports a topic's ``max.message.bytes`` through
DescribeConfigs (measured) but does not enforce it; the refusal is tested on it, the
enforcement is real Kafka's. Real Kafka also reports every default: :class:`KafkaLikeAdmin`
models that.
"""
from __future__ import annotations

import json
import uuid
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from streamdp.kafka.topics import TopicNames, describe_topic_config, ensure_topics
from streamdp.services.config import ConfigError
from streamdp.services.record_limits import (KAFKA_DEFAULT_MAX_MESSAGE_BYTES, REPORT_ALLOWANCE,
                                             TopicLimitError, check_topic_limits, creation_configs,
                                             largest_snapshot_bytes, needed_limits)
from streamdp.snapshot import TopicSnapshot
from streamdp.text.vocabulary import Vocabulary

from service_helpers import make_config, make_corpus
from test_first_run import run_cli


def test_the_refined_snapshot_bound_holds_a_real_refined_snapshot():
    k, d, kp = 20, 10_000, 40
    bound = largest_snapshot_bytes(k, d, kp)
    assert 2_400_000 < bound - REPORT_ALLOWANCE < 2_420_000      # the 2.40 MB
    rng = np.random.default_rng(0)
    report = {"unit": "document", "epsilon": 1.0, "delta": 1e-6,
              "events": [{"name": f"release-{i}", "rho": 0.001 * i, "partition": "stream"}
                         for i in range(300)]}
    snap = TopicSnapshot(topic_word=rng.dirichlet(np.ones(d), size=k), alpha=np.ones(k),
                         eigenvalues=np.ones(k), n_docs=1e6, privacy=report, mechanism="tensor",
                         subspace_id="s" * 16, epoch=1000, vocabulary_id="v" * 16, stage="refined",
                         subspace_topics=rng.random((kp, k)), noise_to_signal=rng.random(k),
                         fold_in_topics=rng.random((k, d)), topic_change=rng.random(k))
    assert len(snap.to_bytes()) <= bound


class KafkaLikeAdmin:
    """DescribeConfigs as real Kafka answers it: every topic reports max.message.bytes (its
    own or the broker default)."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = limits

    def describe_configs(self, resources, request_timeout=None):
        class Entry:
            def __init__(self, v):
                self.value = v
        out = {}
        for r in resources:
            f = Future()
            f.set_result({"max.message.bytes": Entry(str(self.limits.get(
                r.name, KAFKA_DEFAULT_MAX_MESSAGE_BYTES))), "cleanup.policy": Entry("delete")})
            out[r] = f
        return out


def _cfg(tmp_path, **kw):
    names = TopicNames.from_prefix("lim")
    corpus = make_corpus(10, 10, 1)
    return make_config(tmp_path, "127.0.0.1:1", names, corpus, **kw), names


def test_defaults_of_a_real_kafka_are_refused_and_the_created_limits_pass(tmp_path):
    cfg, names = _cfg(tmp_path, n_topics=20)
    d = 10_000
    with pytest.raises(TopicLimitError) as err:
        check_topic_limits(KafkaLikeAdmin({}), cfg, d, [names.snapshots, names.dlq, names.state])
    msg = str(err.value)
    need = needed_limits(cfg, d, documents_limit=KAFKA_DEFAULT_MAX_MESSAGE_BYTES)
    assert f"topic {names.snapshots!r} has max.message.bytes=1,048,588" in msg
    assert f"needs {need[names.snapshots]:,} bytes" in msg
    assert f"--entity-name {names.snapshots} --add-config max.message.bytes={need[names.snapshots]}" in msg
    assert f"topic {names.dlq!r}" in msg          # a 1 MB documents record + headers
    assert names.state not in msg                  # 512 KiB chunks fit the default
    created = {t: int(c["max.message.bytes"]) for t, c in creation_configs(cfg, d).items()}
    assert check_topic_limits(KafkaLikeAdmin(created), cfg, d)[names.snapshots] == created[names.snapshots]


def test_produce_create_topics_sets_every_limit(kafka_broker, tmp_path):
    prefix = f"lim{uuid.uuid4().hex[:8]}"
    names = TopicNames.from_prefix(prefix)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "ts": 1.0, "text": "apples and pears"}) + "\n")
    vocab = tmp_path / "vocabulary.txt"
    Vocabulary([f"w{i}" for i in range(10_000)]).save(vocab)
    conf = tmp_path / "streamdp.json"
    conf.write_text(json.dumps({"bootstrap": kafka_broker.bootstrap, "topic_prefix": prefix,
                                "vocabulary": str(vocab), "vocabulary_public_by_assumption": True,
                                "n_topics": 20, "non_production": True}))
    r = run_cli("produce", "--config", str(conf), "--create-topics", str(corpus))
    assert r.returncode == 0, r.stderr[-2000:]
    got = {t: describe_topic_config(kafka_broker.bootstrap, t).get("max.message.bytes")
           for t in names.all()}
    snap = int(got[names.snapshots])
    assert 2_400_000 + REPORT_ALLOWANCE < snap < 2_420_000 + REPORT_ALLOWANCE
    assert int(got[names.dlq]) >= int(got[names.documents]) + 64 * 1024
    assert int(got[names.documents]) > 1 << 20 and int(got[names.state]) >= 512 * 1024
    # without a vocabulary where the topics are created: the clients' own limit for snapshots
    prefix2 = f"lim{uuid.uuid4().hex[:8]}"
    r = run_cli("produce", "--bootstrap", kafka_broker.bootstrap, "--topic-prefix", prefix2,
                "--create-topics", str(corpus))
    assert r.returncode == 0, r.stderr[-2000:]
    assert describe_topic_config(kafka_broker.bootstrap, f"{prefix2}.snapshots")[
        "max.message.bytes"] == str(16 * 1024 * 1024)


@pytest.mark.parametrize("role", ["release", "sketcher"])
def test_a_service_refuses_a_topic_below_its_largest_record_before_any_side_effect(
        kafka_broker, tmp_path, role):
    """The snapshots (release service) or DLQ (sketcher) topic created with a limit below its
    largest record: the start is refused, naming the topic, its limit, the size needed and the fix, and
    nothing is written (no ledger file, no record on the state topic). Fails before: both
    services started."""
    from service_helpers import read_topic
    names = TopicNames.from_prefix(f"test.{uuid.uuid4().hex[:10]}")
    # the test corpus's snapshots are small (d = 137): a limit under the report allowance; the
    # DLQ at Kafka's default under a 2 MiB documents topic
    small = names.snapshots if role == "release" else names.dlq
    limit = 200_000 if role == "release" else KAFKA_DEFAULT_MAX_MESSAGE_BYTES
    ensure_topics(kafka_broker.bootstrap, names, partitions=2,
                  extra_config={small: {"max.message.bytes": str(limit)},
                                names.documents: {"max.message.bytes": str(2 << 20)}})
    corpus = make_corpus(10, 10, 1)
    cfg = make_config(tmp_path, kafka_broker.bootstrap, names, corpus)
    if role == "release":
        from streamdp.services.release import ReleaseService as Service
    else:
        from streamdp.services.sketcher import Sketcher as Service
    with pytest.raises(ConfigError) as err:
        Service(cfg)
    msg = str(err.value)
    assert f"topic {small!r} has max.message.bytes={limit:,}" in msg, msg
    assert "kafka-configs" in msg and f"--entity-name {small}" in msg
    assert not Path(cfg.ledger).exists()
    assert read_topic(kafka_broker.bootstrap, names.state, timeout=5) == []
