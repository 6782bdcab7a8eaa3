"""The sketchers' documents consumer as a client: its librdkafka settings, the consumer-group
generation read from it (the fencing token of a partition's assignment), and a rate-limited
log for warnings that can come once per record. :class:`streamdp.services.processor.StreamProcessor`
is what drives the consumer; this module only configures and reads it.
"""
from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("streamdp.sketcher")

#: the partition assignment strategy of the sketchers' consumer group. Tansu (the embedded
#: broker) accepts it: the assignment is computed by the group leader's client, the
#: coordinator only relays it (measured: a joining member takes half the partitions while
#: the other keeps the rest without a revoke of them).
ASSIGNMENT_STRATEGY = "cooperative-sticky"


def consumer_settings(instance: str, group_id: str, stats_cb=None) -> dict:
    """librdkafka settings of the documents consumer (client, group and timing)."""
    return {
        "group.id": group_id, "client.id": instance,
        "partition.assignment.strategy": ASSIGNMENT_STRATEGY,
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "statistics.interval.ms": 5000, "stats_cb": stats_cb,
        # A short session timeout reassigns a dead member's partitions quickly
        # (measured on Tansu: ≈ 9 s after SIGKILL, ≈ 3 s after a clean leave);
        # max.poll.interval.ms bounds a stalled loop (a checkpoint takes < 1 s).
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
        "max.poll.interval.ms": MAX_POLL_INTERVAL_MS, "fetch.wait.max.ms": 100,
    }


#: librdkafka's bound on the time between two polls: a member that exceeds it leaves the group
#: (its partitions are reassigned, its unsaved work is lost). One loop stays well inside it.
MAX_POLL_INTERVAL_MS = 20000


class RateLimitedLog:
    """At most ``per_minute`` log lines per key; the rest are counted and summarised."""

    def __init__(self, per_minute: int = 20) -> None:
        self.per_minute, self._window, self._n, self._suppressed = per_minute, 0.0, 0, 0

    def warning(self, msg: str, *args) -> None:
        now = time.monotonic()
        if now - self._window > 60:
            if self._suppressed:
                log.warning("%d similar messages suppressed in the last minute", self._suppressed)
            self._window, self._n, self._suppressed = now, 0, 0
        if self._n < self.per_minute:
            self._n += 1
            log.warning(msg, *args)
        else:
            self._suppressed += 1


def group_generation(consumer) -> int | None:
    """The consumer-group generation id of ``consumer`` (librdkafka's serialised group
    metadata: ``b"CGMDv2:" + int32 generation + ...``, native byte order), or None."""
    try:
        raw = consumer.consumer_group_metadata()
    except Exception:                           # noqa: BLE001
        return None
    if isinstance(raw, (bytes, bytearray)) and raw[:7] == b"CGMDv2:" and len(raw) >= 11:
        return int.from_bytes(raw[7:11], sys.byteorder, signed=True)
    return None
