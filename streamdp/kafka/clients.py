"""A service's Kafka clients and state store, built from plain connection data.

The configuration (``streamdp.services.config``) is data: it names the ``bootstrap`` address
and the extra client ``properties`` (its ``kafka`` mapping: SASL/TLS and the like), and the
functions here turn them into librdkafka configurations, a :class:`StateStore`, or a topic's
partition count (issue 26 item 2: the I/O layer builds clients, not the config).
"""
from __future__ import annotations

from typing import Any, Mapping

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from streamdp.kafka.connectivity import client_extras
from streamdp.kafka.state_store import StateStore
from streamdp.kafka.topics import client_config


def service_client_config(bootstrap: str, properties: Mapping[str, Any], role: str, /,
                          **overrides: Any) -> dict[str, Any]:
    """confluent-kafka configuration of a service client in ``role`` (producer, consumer or
    admin): the base limits, the outage logger and error callback, then the deployment's
    ``properties`` (applied to every client), then ``overrides``."""
    return client_config(bootstrap, role, **{**client_extras(bootstrap), **properties, **overrides})


def open_state_store(bootstrap: str, properties: Mapping[str, Any], topic: str) -> StateStore:
    """The deployment's StateStore on ``topic``; its producer and readers carry ``properties``."""
    producer = Producer(service_client_config(bootstrap, properties, "producer", **{
        "enable.idempotence": True, "acks": "all", "linger.ms": 5}))
    return StateStore(producer, bootstrap, topic,
                      consumer_overrides={**client_extras(bootstrap), **properties},
                      owns_producer=True)


def partition_count(bootstrap: str, properties: Mapping[str, Any], topic: str, *,
                    timeout: float = 10.0) -> int | None:
    """How many partitions ``topic`` has, or None if it does not exist (or has none)."""
    admin = AdminClient(service_client_config(bootstrap, properties, "admin"))
    t = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        return None
    return len(t.partitions)
