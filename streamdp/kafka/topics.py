"""Topic names, idempotent topic creation and base client configurations.

Topics (DESIGN §5), all named ``<prefix>.<role>``:

========== ============================================== ==================
role       content                                         cleanup.policy
========== ============================================== ==================
documents  input documents (one per message)               delete (default),
                                                           message.timestamp.type=LogAppendTime
state      chunked sketch + input offsets per sketcher     **compact**
snapshots  released (noised) topic models                  delete (default)
dlq        malformed input with error headers              delete (default)
control    control messages (release requests, fencing)    delete (default)
========== ============================================== ==================

The documents topic is created with ``message.timestamp.type=LogAppendTime``: the
broker, not the producer, stamps each record, so no producer can move the time
that closes epochs (issue 15; docs/operations.md §Time). The embedded Tansu broker
accepts and reports that setting but ignores it (measured: records keep the
producer's CreateTime), so on it the sketchers' other protections carry the load.

:func:`client_config` raises the client-side message size limits: Tansu accepts
messages of tens of megabytes once the clients allow them, real Kafka's broker
default is about 1 MB (hence the chunked state records in
:mod:`streamdp.kafka.state_store`).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from streamdp.kafka.connectivity import librdkafka_logger

DEFAULT_PREFIX = "streamdp"

#: Largest message a producer may send (librdkafka default: 1,000,000 bytes).
MESSAGE_MAX_BYTES = 16 * 1024 * 1024
#: Most a consumer fetches in one response (librdkafka default: 50 MiB).
FETCH_MAX_BYTES = 64 * 1024 * 1024
#: Largest protocol response a client accepts; librdkafka requires
#: ``receive.message.max.bytes >= fetch.max.bytes + 512``.
RECEIVE_MESSAGE_MAX_BYTES = FETCH_MAX_BYTES + 1024 * 1024

#: Properties that only a consumer understands (librdkafka warns "CONFWARN ...
#: is a consumer property and will be ignored by this producer instance").
_CONSUMER_ONLY = ("fetch.max.bytes",)

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class TopicConfigError(RuntimeError):
    """A topic exists with a configuration that breaks streamdp's assumptions."""


def _check_topic_name(name: str) -> str:
    if not isinstance(name, str) or not _TOPIC_NAME.match(name) or name in (".", "..") or len(name) > 249:
        raise ValueError(f"invalid Kafka topic name {name!r} (use [A-Za-z0-9._-], at most 249 chars)")
    return name


@dataclass(frozen=True)
class TopicNames:
    """The five topics of one streamdp deployment."""

    documents: str = f"{DEFAULT_PREFIX}.documents"
    state: str = f"{DEFAULT_PREFIX}.state"
    snapshots: str = f"{DEFAULT_PREFIX}.snapshots"
    dlq: str = f"{DEFAULT_PREFIX}.dlq"
    control: str = f"{DEFAULT_PREFIX}.control"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check_topic_name(getattr(self, f.name))
        if len(set(self.all())) != len(self.all()):
            raise ValueError(f"topic names must be distinct: {self.all()}")

    @classmethod
    def from_prefix(cls, prefix: str = DEFAULT_PREFIX) -> "TopicNames":
        """``<prefix>.documents``, ``<prefix>.state``, ... ."""
        prefix = prefix.rstrip(".")
        return cls(**{f.name: f"{prefix}.{f.name}" for f in dataclasses.fields(cls)})

    def all(self) -> tuple[str, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


#: Topic config that makes the broker stamp record times (LogAppendTime).
TIMESTAMP_TYPE = "message.timestamp.type"
LOG_APPEND_TIME = "LogAppendTime"


def topic_configs(names: TopicNames) -> dict[str, dict[str, str]]:
    """The topic-level configuration streamdp requires, by topic name."""
    return {names.state: {"cleanup.policy": "compact"},
            names.documents: {TIMESTAMP_TYPE: LOG_APPEND_TIME}}


def check_broker_time(bootstrap_or_admin: str | AdminClient, topic: str, *, timeout: float = 15.0) -> None:
    """Raise :class:`TopicConfigError` unless ``topic`` has ``message.timestamp.type=LogAppendTime``.

    A CreateTime documents topic lets every producer choose the time that closes
    epochs; a production deployment refuses to start on one.
    """
    got = describe_topic_config(bootstrap_or_admin, topic, timeout=timeout).get(TIMESTAMP_TYPE)
    if got != LOG_APPEND_TIME:
        raise TopicConfigError(
            f"documents topic {topic!r} has {TIMESTAMP_TYPE}={got or 'CreateTime (broker default)'}: "
            "producers choose its record times, and one record stamped in the future could close "
            "epochs early. Fix: kafka-configs --bootstrap-server <b> --alter --entity-type topics "
            f"--entity-name {topic} --add-config {TIMESTAMP_TYPE}={LOG_APPEND_TIME} (Strimzi: set it "
            "in the KafkaTopic's config, k8s/base/topics.yaml); or, for a non-production run on the "
            "embedded broker, set non_production: true (or require_broker_time: false)")


# --------------------------------------------------------------------- clients
def client_config(bootstrap: str, role: str | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Base confluent-kafka configuration with raised message size limits.

    ``role`` is ``"producer"``, ``"consumer"``, ``"admin"`` or None (all keys;
    librdkafka then warns about the properties a given client type ignores).
    Overrides use librdkafka's dotted names, e.g.
    ``client_config(bs, "consumer", **{"group.id": "sketcher"})``.
    """
    if role not in (None, "producer", "consumer", "admin"):
        raise ValueError(f"role must be producer, consumer, admin or None, got {role!r}")
    cfg: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "message.max.bytes": MESSAGE_MAX_BYTES,
        "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES,
        "fetch.max.bytes": FETCH_MAX_BYTES,
    }
    if role in ("producer", "admin"):
        for key in _CONSUMER_ONLY:
            cfg.pop(key)
    # librdkafka's own log lines go through Python logging (one line per connection-failure
    # episode, streamdp.kafka.connectivity.LOG_GATE), not straight to stderr: a wrong
    # address or a broker going away must not flood a terminal with thousands of lines
    cfg["logger"] = librdkafka_logger()
    cfg.update(overrides)
    return cfg


def _admin(bootstrap_or_admin: str | Mapping | AdminClient) -> AdminClient:
    if isinstance(bootstrap_or_admin, AdminClient) or hasattr(bootstrap_or_admin, "describe_configs"):
        return bootstrap_or_admin           # an admin client (or one that answers as one)
    if isinstance(bootstrap_or_admin, Mapping):
        # a full client configuration (ServiceConfig.client("admin")): used as it is; taken as
        # a bootstrap string it named no broker and every request timed out (issue 27)
        return AdminClient(dict(bootstrap_or_admin))
    return AdminClient(client_config(bootstrap_or_admin, "admin"))


def _partition_counts(names: TopicNames, partitions: int | Mapping[str, int]) -> dict[str, int]:
    roles = [f.name for f in dataclasses.fields(TopicNames)]
    if isinstance(partitions, Mapping):
        unknown = set(partitions) - set(roles)
        if unknown:
            raise ValueError(f"unknown topic roles {sorted(unknown)}; expected some of {roles}")
        counts = {role: int(partitions.get(role, 1)) for role in roles}
    else:
        counts = {role: 1 for role in roles}
        counts["documents"] = int(partitions)
    if any(c < 1 for c in counts.values()):
        raise ValueError(f"partition counts must be >= 1: {counts}")
    return {getattr(names, role): c for role, c in counts.items()}


def ensure_topics(bootstrap_or_admin: str | AdminClient, names: TopicNames | None = None, *,
                  partitions: int | Mapping[str, int] = 1, replication_factor: int = 1,
                  extra_config: Mapping[str, Mapping[str, str]] | None = None,
                  check_state_config: bool = True, timeout: float = 15.0) -> dict[str, bool]:
    """Create the streamdp topics that do not exist yet; idempotent.

    ``partitions`` is the partition count of the documents topic (every other
    topic gets 1), or a mapping from role (``"documents"``, ``"state"``, ...) to
    count with 1 for roles left out. The state topic is created with
    ``cleanup.policy=compact``; ``extra_config`` adds topic-level configs by topic
    name. Existing topics are left alone (their partition counts are not
    changed), but with ``check_state_config`` an existing state topic that is not
    compacted raises :class:`TopicConfigError` — under ``delete`` retention the
    sketchers' state would silently expire.

    Returns ``{topic: created}``.
    """
    names = names or TopicNames()
    admin = _admin(bootstrap_or_admin)
    counts = _partition_counts(names, partitions)
    configs = topic_configs(names)
    for topic, extra in (extra_config or {}).items():
        configs.setdefault(_check_topic_name(topic), {}).update(extra)
    new = [NewTopic(t, num_partitions=counts[t], replication_factor=replication_factor,
                    config=dict(configs.get(t, {})))
           for t in names.all()]
    result: dict[str, bool] = {}
    errors = []
    for topic, fut in admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout).items():
        try:
            fut.result(timeout)
            result[topic] = True
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                result[topic] = False
            else:
                errors.append(f"{topic}: {exc}")
    if errors:
        raise KafkaException(KafkaError(KafkaError._FAIL, "could not create topics: " + "; ".join(errors)))
    if check_state_config:
        policy = describe_topic_config(admin, names.state, timeout=timeout).get("cleanup.policy", "")
        if "compact" not in policy.split(","):
            raise TopicConfigError(
                f"state topic {names.state!r} exists with cleanup.policy={policy or '(broker default)'!s}; "
                "it must be compacted (kafka-configs --alter --add-config cleanup.policy=compact)")
    return result


def describe_topic_config(bootstrap_or_admin: str | AdminClient, topic: str, *,
                          timeout: float = 15.0) -> dict[str, str]:
    """The topic's configuration as ``{name: value}`` (Tansu reports only the
    configs set at creation; real Kafka reports every config)."""
    admin = _admin(bootstrap_or_admin)
    fut = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)],
                                 request_timeout=timeout)
    entries = next(iter(fut.values())).result(timeout)
    return {name: entry.value for name, entry in entries.items()}
