"""The largest record a deployment writes to each topic, and the check of the topics' limits
(issue 25 item 2; docs/operations.md "Topic message limits").

A Kafka topic refuses a record larger than its ``max.message.bytes`` (real Kafka's default is
1,048,588 bytes). A refined snapshot at d = 10,000 words and k = 20 topics is 2.40 MB, so on a
topic with the default limit every release would be refused by the broker. Confirmed delivery
(``release_sinks.produce_confirmed``) then stops the release loudly; this module makes the
mismatch a start-up refusal instead, naming the topic, its limit, the size needed and the
command that fixes it, and gives ``streamdp produce --create-topics`` the limits to set.

Bounds, per topic (each an upper bound on one record batch of one record, key and headers
included):

* snapshots: a snapshot with every optional array at its full shape — ``topic_word`` (k × d
  float64), ``fold_in_topics`` (k × d float32, refined releases), ``subspace_topics`` (k' × k),
  the k-vectors — measured by serialising one, plus :data:`REPORT_ALLOWANCE` for the privacy
  report, ids, notes and flags;
* dlq: a dead letter carries the source record's value unchanged, so the documents topic's
  own limit (or ``max_document_bytes`` where the broker does not report one) plus
  :data:`RECORD_OVERHEAD` for the error headers (≤ 1 KiB message) and the key;
* state: every state record is chunked under ``DEFAULT_CHUNK_BYTES`` (512 KiB;
  streamdp.kafka.state_store) plus :data:`RECORD_OVERHEAD` for the manifest metadata;
* control: control messages are a few hundred bytes: :data:`RECORD_OVERHEAD`.
"""
from __future__ import annotations

import numpy as np
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from streamdp.errors import ConfigError
from streamdp.kafka.clients import service_client_config
from streamdp.kafka.state_records import DEFAULT_CHUNK_BYTES
from streamdp.kafka.topics import MESSAGE_MAX_BYTES, TopicNames, describe_topic_config
from streamdp.snapshot import TopicSnapshot

MAX_MESSAGE_BYTES = "max.message.bytes"
#: key, headers, record-batch framing and small metadata of one record
RECORD_OVERHEAD = 64 * 1024
#: privacy report, release/subspace/vocabulary ids, quality note and topic flags of a snapshot
REPORT_ALLOWANCE = 256 * 1024
#: real Kafka's broker default for max.message.bytes (message.max.bytes of the broker)
KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


def largest_snapshot_bytes(n_topics: int, d: int, k_prime: int) -> int:
    """Bytes of the largest snapshot of k = ``n_topics`` topics over ``d`` words (every optional
    array present: the refined stage), plus :data:`REPORT_ALLOWANCE`."""
    k = int(n_topics)
    snap = TopicSnapshot(topic_word=np.zeros((k, int(d))), alpha=np.zeros(k), eigenvalues=np.zeros(k),
                         n_docs=0.0, privacy={}, mechanism="tensor", subspace_id="x" * 64,
                         epoch=0, vocabulary_id="x" * 64, stage="refined",
                         subspace_topics=np.zeros((int(k_prime), k)), noise_to_signal=np.zeros(k),
                         fold_in_topics=np.zeros((k, int(d))), topic_change=np.zeros(k))
    return len(snap.to_bytes()) + REPORT_ALLOWANCE


def vocabulary_size(cfg, vocabulary=None) -> int:
    """d of the deployment: the vocabulary file's, else the configured ``vocabulary_size``."""
    if vocabulary is not None:
        return len(vocabulary)
    if cfg.vocabulary_mode == "file":
        return len(cfg.load_vocabulary_file()[0])
    return int(cfg.vocabulary_size)


def needed_limits(cfg, d: int, documents_limit: int | None = None) -> dict[str, int]:
    """``{topic: the smallest max.message.bytes that holds its largest record}``.
    ``documents_limit``: the documents topic's max.message.bytes if known (the DLQ copies its
    records), else ``max_document_bytes`` + overhead is assumed for it."""
    names: TopicNames = cfg.topics
    docs = (int(documents_limit) if documents_limit is not None
            else int(cfg.max_document_bytes) + RECORD_OVERHEAD)
    return {
        names.documents: int(cfg.max_document_bytes) + RECORD_OVERHEAD,
        names.snapshots: largest_snapshot_bytes(cfg.n_topics, d, cfg.k_prime(d)),
        names.dlq: docs + RECORD_OVERHEAD,
        names.state: DEFAULT_CHUNK_BYTES + RECORD_OVERHEAD,
        names.control: RECORD_OVERHEAD,
    }


def creation_configs(cfg, d: int | None) -> dict[str, dict[str, str]]:
    """``max.message.bytes`` for ``streamdp produce --create-topics``: each topic's need, never
    below real Kafka's default. ``d`` None (the vocabulary is not known where the topics are
    created): the snapshots topic gets the clients' own limit (``MESSAGE_MAX_BYTES``), which
    holds every snapshot the clients can send."""
    need = needed_limits(cfg, cfg.n_topics if d is None else d)
    if d is None:
        need[cfg.topics.snapshots] = MESSAGE_MAX_BYTES
    check_creatable(cfg, need)
    return {t: {MAX_MESSAGE_BYTES: str(max(n, KAFKA_DEFAULT_MAX_MESSAGE_BYTES))} for t, n in need.items()}


class TopicLimitError(ValueError):
    """A topic's max.message.bytes is below the largest record the deployment writes to it."""


def check_creatable(cfg, need: dict[str, int]) -> None:
    """Refuse a configuration whose largest record exceeds the clients' own limit."""
    for topic, n in need.items():
        if n > MESSAGE_MAX_BYTES:
            raise TopicLimitError(
                f"the largest record on {topic!r} would be {n:,} bytes (n_topics={cfg.n_topics}, "
                f"max_document_bytes={cfg.max_document_bytes}), above the clients' "
                f"message.max.bytes {MESSAGE_MAX_BYTES:,}: use fewer topics, a smaller "
                "vocabulary or smaller documents")


def check_topic_limits(admin, cfg, d: int, topics: list[str] | None = None, *,
                       timeout: float = 15.0) -> dict[str, int | None]:
    """Refuse (TopicLimitError) when a topic this service writes reports a max.message.bytes
    below its largest record. ``admin``: an AdminClient (or its bootstrap string). Returns
    ``{topic: reported limit or None}``.

    A topic that reports no ``max.message.bytes`` passes: real Kafka reports every config
    (defaults included), the embedded broker (Tansu) only those set at creation, and it has
    no per-topic limit of its own (it takes what the clients send; DESIGN §7)."""
    names: TopicNames = cfg.topics
    reported: dict[str, int | None] = {}
    for t in names.all():
        try:
            v = describe_topic_config(admin, t, timeout=timeout).get(MAX_MESSAGE_BYTES)
        except KafkaException:          # no such topic (yet): not a limit; others refuse it
            v = None
        reported[t] = None if v in (None, "") else int(v)
    need = needed_limits(cfg, d, documents_limit=reported.get(names.documents))
    bad = []
    for t in topics if topics is not None else list(need):
        have = reported.get(t)
        if have is not None and have < need[t]:
            bad.append(f"topic {t!r} has max.message.bytes={have:,}, its largest record needs "
                       f"{need[t]:,} bytes (n_topics={cfg.n_topics}, d={d}, max_document_bytes="
                       f"{cfg.max_document_bytes}). Fix: kafka-configs --bootstrap-server "
                       f"<bootstrap> --alter --entity-type topics --entity-name {t} --add-config "
                       f"max.message.bytes={need[t]} (Strimzi: spec.config of its KafkaTopic, "
                       "k8s/base/topics.yaml)")
    if bad:
        raise TopicLimitError("; ".join(bad) + " — otherwise Kafka refuses those records "
                              "(docs/operations.md \"Topic message limits\")")
    return reported


def check_limits(cfg, d: int, topics: list[str]) -> None:
    """A service's start-up check (before any side effect): :func:`check_topic_limits` on the
    topics it writes, as a ConfigError."""
    try:
        admin = AdminClient(service_client_config(cfg.bootstrap, cfg.kafka, "admin"))
        check_topic_limits(admin, cfg, d, topics)
    except TopicLimitError as exc:
        raise ConfigError(str(exc)) from None
