"""What the release service reads from Kafka besides its own state: the operator's commands on
the control topic, and the documents partitions (their sketcher states, their list, whether each
is caught up). The closing policy (:mod:`streamdp.services.release_policy`) decides on these.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from streamdp import serialization as ser
from streamdp.kafka.clients import service_client_config
from streamdp.services import control
from streamdp.services.config import ServiceConfig
from streamdp.services.partition_state import PartitionState
from streamdp.services.release_policy import Commands, Order, order_from_message
from streamdp.services.state_view import PartitionView

log = logging.getLogger("streamdp.release")


class ControlCommands:
    """The operator's ``flush`` and ``close`` commands, read from the control topic.

    Read by assignment (no group join delay) from the offset saved with the release state
    (:meth:`restore`), so a command sent while the service was down is still seen, and one
    already acted on is not replayed. With no saved offset (first start, or a crash before the
    first epoch's state write) it reads from the beginning: nothing was durably acted on yet,
    and a flush sent before the service (re)started must not be lost. Unauthenticated commands
    are ignored (accepted with a warning in ``non_production``); ``key`` returns the
    deployment's control key.
    """

    def __init__(self, cfg: ServiceConfig, key: Callable[[], bytes]) -> None:
        self.cfg = cfg
        self._key = key
        self.consumer = Consumer(service_client_config(cfg.bootstrap, cfg.kafka, "consumer", **{
            "group.id": f"{cfg.topic_prefix}-release-control", "enable.auto.commit": False,
            "fetch.wait.max.ms": 100}))
        self.offset: int | None = None     # next control offset to read (saved with the state)
        self.orders: tuple[Order, ...] = ()   # the operator's standing orders (release_policy)
        self.rejected = 0                  # unauthenticated commands seen

    @property
    def current(self) -> Commands:
        return Commands(self.orders)

    @property
    def forced_through(self) -> int:
        """The largest explicit ``--through`` epoch ordered (-1: none)."""
        return max([o.through for o in self.orders] or [-1])

    @property
    def flush_requested(self) -> bool:
        return any(o.through_time is not None for o in self.orders)

    def keep(self, commands: Commands) -> None:
        """Replace the standing orders (pruned by the policy once their epochs are released)."""
        self.orders = tuple(commands.orders)

    def restore(self, obj: dict | None) -> None:
        """Resume from a persisted release state (``None``: nothing persisted yet), and read
        from its saved offset (the beginning without one)."""
        if obj is not None:             # a current record (streamdp.services.release_state)
            self.offset = obj["control_offset"]
            self.orders = tuple(Order.from_list(o) for o in obj["orders"])
        start = OFFSET_BEGINNING if self.offset is None else self.offset
        self.consumer.assign([TopicPartition(self.cfg.topics.control, 0, start)])

    def state(self, commands: Commands | None = None) -> dict:
        """What the release state persists of the commands (``commands``: the standing orders
        to keep, default all)."""
        orders = self.orders if commands is None else commands.orders
        return {"control_offset": self.offset, "orders": [o.to_list() for o in orders]}

    def read(self) -> None:
        """Apply the commands that arrived since the last read."""
        key = self._key()
        for m in self.consumer.consume(num_messages=100, timeout=0):
            if m.error() is not None:
                continue
            self.offset = m.offset() + 1
            try:
                msg = control.decode(m.value())
            except ser.SchemaError as exc:
                log.warning("ignored bad control message: %s", exc)
                continue
            if msg["type"] in control.RELEASE_TYPES:
                continue                      # the release service's own messages to the sketchers
            if not control.authentic(msg, key):
                self.rejected += 1
                if not self.cfg.non_production:
                    log.warning("ignored unauthenticated %s control message at offset %d (no valid "
                                "MAC under this deployment's control key)", msg["type"], m.offset())
                    continue
                log.warning("accepting unauthenticated %s control message at offset %d "
                            "(non_production only)", msg["type"], m.offset())
            if msg["type"] in ("flush", "close"):
                self.orders = self.orders + (order_from_message(msg, time.time()),)

    def close(self) -> None:
        self.consumer.close()


class DocumentsPartitions:
    """The documents partitions as the release service sees them: the newest accepted sketcher
    state of each (read incrementally, zombie records and records without a valid MAC under
    ``auth`` rejected: :class:`PartitionView`), the
    partition list, and whether a partition is caught up (read, not listed)."""

    def __init__(self, cfg: ServiceConfig, auth: Callable[[], object]) -> None:
        self.topic = cfg.topics.documents
        self.auth = auth       # returns the StateAuth: records without a valid MAC are refused
        self.view: PartitionView | None = None
        self.probe = Consumer(service_client_config(cfg.bootstrap, cfg.kafka, "consumer", **{
            "group.id": f"{cfg.topic_prefix}-release-probe", "enable.auto.commit": False,
            "enable.partition.eof": True, "fetch.wait.max.ms": 50}))

    def read(self, store) -> tuple[dict, list[int]]:
        """Partition → newest accepted state record, and every documents partition. A poll's
        cost does not grow with the state topic's history."""
        if self.view is None:
            self.view = PartitionView(store, self.topic, self.auth())
        self.view.store = store          # the store may have been re-created (an outage)
        states = self.view.read()
        md = self.probe.list_topics(self.topic, timeout=10)
        return states, sorted(md.topics[self.topic].partitions)

    @property
    def unauthentic(self) -> int:
        """State records refused so far for their MAC."""
        return 0 if self.view is None else self.view.unauthentic

    def load(self, states: dict, subspace) -> list[PartitionState]:
        """The decoded states in partition order, each decoded once per (partition, generation)."""
        return self.view.load(states, subspace)

    def caught_up(self, p: int, next_offset: int) -> bool:
        """Whether partition p holds no record at or after ``next_offset`` (read, not listed:
        Tansu's ListOffsets under-reports)."""
        self.probe.assign([TopicPartition(self.topic, p, next_offset)])
        try:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                m = self.probe.poll(0.2)
                if m is None:
                    continue
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        return m.offset() <= next_offset
                    continue
                return False
            return False
        finally:
            self.probe.unassign()

    def close(self) -> None:
        self.probe.close()
