"""The dead-letter delivery of one sketcher: a record the strategy refused is produced to the
dead-letter topic with headers saying why, and every letter produced so far is confirmed
(acknowledged, or retried with bounded back-off) before a checkpoint covers its offset; a
letter Kafka still refuses stops the sketcher (:class:`DeadLetterUndelivered`) rather than
being lost. A letter decided but not yet produced (the producer's queue stayed full for
``DLQ_QUEUE_FULL_SECONDS`` in an outage, or its produce raised) stays *owed*: it is produced
again at the next step, and the processor's commit rule refuses a checkpoint past it. *Which* records are dead-lettered is decided by
:meth:`streamdp.services.processor.StreamProcessor.submit`, *when* they must be durable by its
commit fence (:meth:`StreamProcessor.commit`); this module only delivers them.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from confluent_kafka import KafkaException

from streamdp import messages
from streamdp.backoff import exponential_delays
from streamdp.services.consumer_client import RateLimitedLog

log = logging.getLogger("streamdp.sketcher")

#: back-off before each retry of refused dead letters (bounded: ~3.5 s, then the sketcher stops)
DLQ_RETRY_SECONDS = tuple(exponential_delays(0.5, attempts=3))
#: the longest one dead letter waits for room in the producer's queue (full while the broker
#: is down), beating liveness, before the step fails as an outage (BufferError: the guard rides
#: it out, the letter stays owed). Inside max.poll.interval.ms (20 s) and liveness (30 s).
DLQ_QUEUE_FULL_SECONDS = 10.0


class DeadLetterUndelivered(RuntimeError):
    """Kafka refused a dead-letter record after every retry: stop rather than lose it."""


@dataclass
class _DeadLetter:
    value: bytes | None
    key: bytes | None
    headers: list
    partition: int
    offset: int
    error_class: str
    error: str = ""


class DeadLetters:
    """The dead letters of one sketcher: ``producer`` writes them to ``dlq_topic``; ``topic``
    (the documents topic), ``metrics``, ``health`` and ``instance`` are the processor's.
    ``dlq_lost`` is set once a letter could not be delivered: no checkpoint after it."""

    def __init__(self, producer, dlq_topic: str, *, topic: str, metrics, health,
                 instance: str) -> None:
        self.producer, self.dlq_topic, self.topic = producer, dlq_topic, topic
        self.metrics, self.health, self.instance = metrics, health, instance
        self.bad_log = RateLimitedLog()
        self._dlq_failed: list[_DeadLetter] = []  # delivery reports that came back refused
        self.dlq_lost: str | None = None        # set once: no checkpoint after a lost letter
        #: (partition, offset) -> (record, why): decided, not produced yet (no checkpoint past it)
        self.owed: dict[tuple[int, int], tuple] = {}

    def owe(self, records) -> None:
        """``records`` ((record, InvalidMessage) pairs) must be dead-lettered: owed until
        produced (:meth:`dead_letter`), whatever fails in between."""
        for m, exc in records:
            self.owed[(m.partition(), m.offset())] = (m, exc)

    def owed_records(self) -> list[tuple]:
        """The owed letters, in (partition, offset) order."""
        return [self.owed[k] for k in sorted(self.owed)]

    def owed_below(self, partition: int, next_offset: int) -> list[int]:
        """Offsets of ``partition`` below ``next_offset`` whose letters are still owed."""
        return sorted(o for p, o in self.owed if p == partition and o < next_offset)

    def forget(self, partitions) -> None:
        """Drop the owed letters of lost partitions (their state is dropped unwritten and the
        new owner re-reads them). Not on revoke: a revoke whose fence refused keeps them, so
        no later checkpoint of the state it kept covers them."""
        gone = set(partitions)
        for key in [k for k in self.owed if k[0] in gone]:
            del self.owed[key]

    def dead_letter(self, m, exc: messages.InvalidMessage) -> None:
        """Produce ``m`` to the dead-letter topic with headers saying why (made durable by
        :meth:`confirm` before a checkpoint covers its offset); no longer owed once produced."""
        letter = _DeadLetter(m.value(), m.key(),
                             messages.dlq_headers(exc, m.topic(), m.partition(), m.offset()),
                             m.partition(), m.offset(), exc.error_class)
        self._send_dead_letter(letter)
        self.owed.pop((m.partition(), m.offset()), None)
        self.metrics.dlq(exc.error_class)       # counted once produced (an owed one is retried)
        self.bad_log.warning("dead-lettered %s[%d]@%d: %s: %s", m.topic(), m.partition(),
                             m.offset(), exc.error_class, exc.message)

    def _send_dead_letter(self, letter: "_DeadLetter") -> None:
        """Produce one dead letter; its delivery report lands in ``_dlq_failed`` if refused
        (``flush()`` returns 0 after a failed delivery too: only the report tells). A full queue
        is polled (liveness beaten) for at most DLQ_QUEUE_FULL_SECONDS, then BufferError."""
        def report(err, _msg, letter=letter):
            if err is not None:
                letter.error = str(err)
                self._dlq_failed.append(letter)
        deadline = time.monotonic() + DLQ_QUEUE_FULL_SECONDS
        while True:
            try:
                self.producer.produce(self.dlq_topic, value=letter.value, key=letter.key,
                                      headers=letter.headers, on_delivery=report)
                return
            except BufferError as exc:
                if time.monotonic() >= deadline:   # an outage: the guard rides it out
                    raise BufferError(
                        f"dead letter for {self.topic}[{letter.partition}]@{letter.offset} not "
                        f"produced: the producer's queue stayed full for {DLQ_QUEUE_FULL_SECONDS:.0f} s "
                        "(Kafka unreachable?); it stays owed, no checkpoint covers it") from exc
                self.health.beat()
                self.producer.poll(0.1)
            except KafkaException as exc:   # refused at once (e.g. a topic known to be unknown)
                report(exc.args[0] if exc.args else exc, None)
                return

    def confirm(self) -> None:
        """Every dead letter produced so far is acknowledged, or retried with bounded back-off
        (DLQ_RETRY_SECONDS); a letter refused after the last retry stops the sketcher: no
        checkpoint ever covers its offset (it is re-read and dead-lettered again after the
        restart), and it counts in ``streamdp_dlq_dropped_total`` (alert StreamdpDlqDropped)."""
        if self.dlq_lost is not None:
            raise DeadLetterUndelivered(self.dlq_lost)
        if self.producer.flush(30) != 0:
            raise RuntimeError("dead-letter records not acknowledged in 30 s; not checkpointing")
        for wait in DLQ_RETRY_SECONDS:
            if not self._dlq_failed:
                return
            failed, self._dlq_failed = self._dlq_failed, []
            log.warning("%s: %d dead-letter record(s) refused by Kafka (%s); retrying in %.1f s",
                        self.instance, len(failed), failed[0].error, wait)
            time.sleep(wait)
            for i, letter in enumerate(failed):
                try:
                    self._send_dead_letter(letter)
                except BaseException:           # e.g. the queue full: still to be confirmed
                    self._dlq_failed[:0] = failed[i:]
                    raise
            if self.producer.flush(30) != 0:
                raise RuntimeError("dead-letter records not acknowledged in 30 s; not checkpointing")
        if self._dlq_failed:
            lost, self._dlq_failed = self._dlq_failed, []
            self.metrics.dlq_undelivered(len(lost))
            first = lost[0]
            self.dlq_lost = (f"{len(lost)} dead-letter record(s) could not be written to "
                             f"{self.dlq_topic!r} after {len(DLQ_RETRY_SECONDS)} retries ({first.error}); "
                             f"first: {self.topic}[{first.partition}]@{first.offset} "
                             f"({first.error_class}). The sketcher stops without checkpointing "
                             "past them (nothing is lost: they are re-read after the restart). "
                             "Fix: create the DLQ topic / grant the sketcher write access to it "
                             "(docs/operations.md \"DLQ triage\")")
            log.error("%s: %s", self.instance, self.dlq_lost)
            self.health.set_ready(False, "dead letters undelivered")
            raise DeadLetterUndelivered(self.dlq_lost)
