"""Where the release service's output goes, and THE record of what was published.

A snapshot is published (:meth:`ReleaseSinks.publish`) only after its release state is
persisted (the spend protocol, :mod:`streamdp.privacy.spend`; the order is kept by
:class:`~streamdp.services.release.ReleaseService`), to

* the snapshots topic (key = ``release_id``; consumers deduplicate by it),
* the snapshot directory (``epoch-<e>-<release_id>.msgpack`` and ``latest.json``), and
* the HTTP view (``GET /snapshot/latest``, ``/snapshot/latest.msgpack``), which serves
  :attr:`ReleaseSinks.published` and nothing else.

:attr:`ReleaseSinks.published` is the only "latest snapshot" of the service: a snapshot whose
state write failed was never handed here, and its draw is redone on the same reservation, so
no view may show it (``tests/test_consumers.py::test_http_never_serves_a_release_that_was_not_persisted``).

Control announcements to the sketchers (``vocabulary_ready``, ``subspace_ready``,
``epochs_closed``) go to the control topic, MAC'd under the deployment's control key.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Callable

from confluent_kafka import KafkaException, Producer

from streamdp.backoff import exponential_delays
from streamdp.services import control
from streamdp.snapshot import TopicSnapshot
from streamdp.snapshot_summary import summary as snapshot_summary


log = logging.getLogger("streamdp.release")

#: back-off before each retry of a refused snapshot / control record (then the release stops)
DELIVERY_RETRY_SECONDS = tuple(exponential_delays(0.5, attempts=3))


class DeliveryFailed(RuntimeError):
    """Kafka refused a release record after every retry: the release stops (the release
    state is persisted, so a restart publishes it) rather than claim it was published."""


def produce_confirmed(producer: Producer, topic: str, *, value: bytes, key: bytes | None = None,
                      what: str, flush_seconds: float = 30.0,
                      retries: tuple[float, ...] = DELIVERY_RETRY_SECONDS) -> None:
    """Produce one record and check its delivery report (``flush()`` returns 0 after a
    refused delivery too); retry with back-off, then raise :class:`DeliveryFailed`."""
    errors: list = []
    for attempt, wait in enumerate((0.0, *retries)):
        if wait:
            log.warning("%s refused by Kafka (%s); retry %d in %.1f s", what, errors[-1], attempt, wait)
            time.sleep(wait)
        outcome: list = []
        try:
            producer.produce(topic, key=key, value=value,
                             on_delivery=lambda err, _msg: outcome.append(err))
        except KafkaException as exc:           # refused at once (e.g. unknown topic)
            errors.append(exc.args[0] if exc.args else exc)
            continue
        if producer.flush(flush_seconds) != 0:
            raise RuntimeError(f"{what} not acknowledged by the broker in {flush_seconds:.0f} s")
        if outcome and outcome[0] is None:
            return
        errors.append(outcome[0] if outcome else "no delivery report")
    raise DeliveryFailed(f"{what}: Kafka refused it {len(errors)} times ({errors[-1]}); topic "
                         f"{topic!r}. Nothing was claimed published: fix the topic (exists, "
                         "writable, max.message.bytes large enough) and restart; the release "
                         "state is persisted and is published then (docs/operations.md)")


class ReleaseSinks:
    """Publishing and announcing for one release service.

    ``producer``: an idempotent producer (not the transactional release writer: the outputs
    are derived from persisted state and may be repeated); ``topics``: the deployment's
    :class:`~streamdp.kafka.topics.TopicNames`; ``snapshot_dir``: the snapshot directory;
    ``vocabulary``: returns the deployment's vocabulary (None until chosen);
    ``control_key``: returns the key control messages are MAC'd with.
    """

    def __init__(self, producer: Producer, topics, snapshot_dir: str | os.PathLike,
                 vocabulary: Callable[[], object], control_key: Callable[[], bytes]) -> None:
        self.producer = producer
        self.topics = topics
        self.dir = Path(snapshot_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._vocabulary = vocabulary
        self._control_key = control_key
        #: the last published snapshot and its bytes (None: nothing published by this process)
        self.published: tuple[TopicSnapshot, bytes] | None = None

    # ------------------------------------------------------------ snapshots
    @property
    def latest(self) -> TopicSnapshot | None:
        """The last published snapshot (the only one any view may show)."""
        return None if self.published is None else self.published[0]

    def publish(self, snap: TopicSnapshot) -> None:
        """Snapshots topic (acknowledged), then the HTTP view, then the directory."""
        data = snap.to_bytes()
        produce_confirmed(self.producer, self.topics.snapshots, key=snap.release_id.encode(),
                          value=data, what=f"snapshot {snap.release_id} ({len(data)} bytes)")
        self.published = (snap, data)
        tmp = self.dir / f".{snap.release_id}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.dir / f"epoch-{snap.epoch or 0:06d}-{snap.release_id}.msgpack")
        tmp = self.dir / ".latest.json.tmp"
        tmp.write_text(json.dumps(self.latest_json(), default=float))
        os.replace(tmp, self.dir / "latest.json")

    def latest_json(self) -> dict | None:
        """``latest.json`` and ``GET /snapshot/latest``: ``streamdp.snapshots.summary`` (keys in
        docs/consumers.md), top 10 words per topic, of the last *published* snapshot."""
        if self.published is None:
            return None
        return snapshot_summary(self.published[0], self._vocabulary(), 10)

    def latest_bytes(self) -> bytes | None:
        """``GET /snapshot/latest.msgpack``: the last published snapshot's bytes."""
        return None if self.published is None else self.published[1]

    def add_http_routes(self, server) -> None:
        """The HTTP view on ``server`` (an :class:`~streamdp.observability.ObservabilityServer`)."""
        server.add_json_route("/snapshot/latest", self.latest_json)
        # the full snapshot and its vocabulary, for streamdp.snapshots readers (docs/consumers.md)
        server.add_bytes_route("/snapshot/latest.msgpack", self.latest_bytes, "application/msgpack")
        server.add_bytes_route("/vocabulary.txt", lambda: (
            None if self._vocabulary() is None else self._vocabulary().canonical_bytes()),
            "text/plain; charset=utf-8")

    def write_vocabulary(self, report: dict) -> None:
        """``snapshot_dir/vocabulary.txt`` (+ ``.json``: how it was chosen, ``report``), for
        readers of the snapshots (``streamdp topics --vocabulary``); public once persisted."""
        self._vocabulary().save(self.dir / "vocabulary.txt")
        tmp = self.dir / ".vocabulary.txt.json.tmp"
        tmp.write_text(json.dumps(report, default=float, indent=2))
        os.replace(tmp, self.dir / "vocabulary.txt.json")

    # ------------------------------------------------------------ control announcements
    def announce(self, type_: str, **fields) -> None:
        """A control message to the sketchers (``vocabulary_ready``, ``subspace_ready``,
        ``epochs_closed``)."""
        produce_confirmed(self.producer, self.topics.control, what=f"control message {type_!r}",
                          value=control.encode(type_, key=self._control_key(), **fields),
                          flush_seconds=10)
