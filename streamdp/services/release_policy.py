"""THE release schedule: when the release service closes an epoch (pure: no Kafka, no clock).

Whether and when a release happens is output (issue 23, docs/privacy.md §What is public about
timing). So the decision *that an epoch is due*, and the ``created_at`` it publishes, are a
function of public inputs only:

* the service clock ``now``;
* the configured schedule: ``close_time(e)`` (epoch end + ``lateness``; ``stream_start`` for
  the warm-up, epoch 0; ``selection_end`` for the vocabulary-selection window, ``SELECTION``),
  the fixed ``grace`` (:data:`GRACE_SECONDS`) and the ``closing`` mode;
* the operator's explicit commands (:class:`Order`: ``close --through E``, ``flush --through
  E``, and ``flush``, which closes through the last epoch whose close time had passed at the
  flush — derived from the clock, never from what the partitions hold).

An epoch is *due* (:meth:`ClosingPolicy.due_at`) at the earliest of

* its scheduled time ``close_time(e) + grace`` (``closing: schedule``, the default; with
  ``closing: operator`` — a replayed feed — never by the clock alone);
* the time of the first operator order that covers it.

Which documents an epoch covers is fixed by each document's own times and the schedule (the
routing rule, :meth:`Routing.route`: on time iff its record time ``rt < close_time(e)``).
Before merging a due epoch the release service *waits* until every documents partition's
sketcher state covers that cut (:meth:`ClosingPolicy.covered`): its progress (largest record
time consumed, capped by the clock) has reached ``close_time(e)``, or it is caught up (no
record after the state's ``next_offset``). With broker time (``LogAppendTime``) a record
appended after the due time has ``rt > close_time(e)``: it is late by its own time, so the
wait changes *when* the computation runs, never *which* documents count nor the published
``created_at`` (= the due time). The partitions' data never makes an epoch due: one document
in the open epoch, or the first document past a close time, changes nothing here.

Whether a partition is caught up is a question to Kafka: the caller passes it as
``caught_up(partition, next_offset)``, asked only when the answer matters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from streamdp.services.partition_state import SELECTION

#: fixed seconds on the service clock past an epoch's close time at which it is due (a margin
#: for the sketchers' checkpoints; public: part of the schedule)
GRACE_SECONDS = 5.0

#: ``closing`` modes: ``schedule`` — epochs are due on the clock; ``operator`` — only by orders
CLOSING_MODES = ("schedule", "operator")


@dataclass(frozen=True)
class Order:
    """One operator order: closes every epoch ``<= through`` and, for a flush, every epoch
    whose close time is ``<= through_time``; ``at`` is when it was given (public)."""
    at: float
    through: int = -1                    # -1: no explicit epoch
    through_time: float | None = None    # a flush: the clock at the flush

    def covers(self, epoch: int, close_time: Callable[[int], float]) -> bool:
        if epoch == SELECTION:      # before the warm-up: covered by any order through >= 0
            if self.through >= 0:
                return True
        elif epoch <= self.through:
            return True
        return self.through_time is not None and close_time(epoch) <= self.through_time

    def to_list(self) -> list:
        return [self.at, self.through, self.through_time]

    @classmethod
    def from_list(cls, obj) -> "Order":
        at, through, through_time = obj
        return cls(float(at), int(through), None if through_time is None else float(through_time))


@dataclass(frozen=True)
class Commands:
    """The operator's standing orders (control messages ``close`` and ``flush``)."""
    orders: tuple[Order, ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, *, forced_through: int = -1, flush_at: float | None = None,
           at: float = 0.0) -> "Commands":
        """Shorthand for tests: one close order and/or one flush order given at ``at``."""
        orders = []
        if forced_through >= 0:
            orders.append(Order(at, forced_through))
        if flush_at is not None:
            orders.append(Order(flush_at, -1, flush_at))
        return cls(tuple(orders))


def order_from_message(msg: dict, received_at: float) -> Order:
    """The order of a ``close``/``flush`` control message. Its time is the message's ``at``
    capped by the service clock when it was read (an order cannot claim a future time)."""
    at = min(float(msg.get("at") or received_at), received_at)
    through = int(msg.get("through", -1)) if msg.get("through") is not None else -1
    if msg["type"] == "close" or through >= 0:
        return Order(at, through)      # close --through E, flush --through E: explicit epochs
    return Order(at, -1, at)           # flush: through the clock-derived cut


@dataclass(frozen=True)
class ClosingPolicy:
    """``close_time(epoch)``: record time after which the epoch's documents are late;
    ``grace``: fixed seconds on the service clock after it; ``closing``: the mode."""
    close_time: Callable[[int], float]
    lateness: float = 0.0
    grace: float = GRACE_SECONDS
    closing: str = "schedule"

    def __post_init__(self) -> None:
        if self.closing not in CLOSING_MODES:
            raise ValueError(f"closing must be one of {CLOSING_MODES}, got {self.closing!r}")

    @property
    def idle_grace(self) -> float:      # the former name
        return self.grace

    def scheduled_time(self, epoch: int) -> float:
        """When ``epoch`` is due by the clock (``closing: schedule``)."""
        return self.close_time(epoch) + self.grace

    def due_at(self, epoch: int, commands: Commands) -> float:
        """THE schedule: the service-clock time at which ``epoch`` becomes due (``inf``: not
        yet decided by any public input). It is also the snapshot's ``created_at``."""
        t = self.scheduled_time(epoch) if self.closing == "schedule" else math.inf
        for o in commands.orders:
            if o.covers(epoch, self.close_time):
                t = min(t, o.at)
        return t

    def due(self, epoch: int, commands: Commands, now: float) -> bool:
        return now >= self.due_at(epoch, commands)

    def covered(self, epoch: int, states: Mapping[int, Any], partitions: Sequence[int],
                caught_up: Callable[[int, int], bool]) -> bool:
        """Whether every partition's sketcher state covers ``epoch``'s cut (module docstring):
        progress ≥ close time, or caught up. No partitions: never."""
        if not partitions:
            return False
        close_time = self.close_time(epoch)
        for p in partitions:
            rec = states.get(p)
            progress = None if rec is None else rec.meta.get("progress")
            if progress is not None and progress >= close_time:
                continue
            if caught_up(p, 0 if rec is None else rec.meta["next_offset"]):
                continue
            return False
        return True

    def closable(self, epoch: int, states: Mapping[int, Any], partitions: Sequence[int], *,
                 commands: Commands, now: float,
                 caught_up: Callable[[int, int], bool]) -> bool:
        """Whether ``epoch`` may be closed now: it is due (public inputs only) and every
        partition's state covers its cut (a wait, never a decision about which documents)."""
        return self.due(epoch, commands, now) and self.covered(epoch, states, partitions, caught_up)

    def prune(self, commands: Commands, released_through: int) -> Commands:
        """Drop orders that cover no epoch after ``released_through`` (kept small in the state)."""
        def useful(o: Order) -> bool:
            if o.through > released_through:
                return True
            return o.through_time is not None and self.close_time(released_through + 1) <= o.through_time
        return Commands(tuple(o for o in commands.orders if useful(o)))
