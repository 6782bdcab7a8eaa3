"""The rule that routes documents: where each document goes, from its own times and the
service clock only.

Routing rule (docs/privacy.md §Continual release, docs/services.md §Epochs, docs/operations.md §Time)
----------------------------------------------------------------------------------------------
:meth:`Routing.route` is the ONE function that decides where a document goes. Each
document's role depends only on its own attributes — its event time ``ts`` and its
Kafka record timestamp ``rt`` — and on the service's own clock ``now``:

* ``ts`` or ``rt`` later than ``now + max_future_seconds``, or ``ts`` later than
  ``rt + max_future_seconds``                            → FUTURE: dead-lettered, never routed;
* with a selection window (``vocabulary_mode: private``): ``ts < selection_end`` and
  ``rt < selection_end``                                  → SELECTION (vocabulary selection only);
  ``ts < selection_end`` and ``rt ≥ selection_end``        → late;
* ``ts < stream_start`` and ``rt < stream_start``          → warm-up;
* ``ts ≥ stream_start`` with epoch e = clock.epoch(ts) and
  ``rt < clock.epoch_end(e) + lateness``                   → stream epoch e;
* otherwise                                                 → late: dropped, counted.

Record timestamps must be non-decreasing per partition (``LogAppendTime`` on the
documents topic in production; ``streamdp produce`` writes in timestamp order).
Then once a partition's progress (largest ``rt`` consumed) passes an epoch's close
time, no on-time document of that epoch can follow on it, and the release service
can close the epoch knowing every on-time document is in the sketches.

Time that one document cannot move (issue 15): a partition's progress is *capped by
the service's own wall clock* (:meth:`Routing.advance_progress`, and again by the
release service's clock in :func:`effective_progress`), so a record stamped in the
future can never make an epoch closable before ``epoch_end + lateness`` has passed on
the service clock; such a record is dead-lettered anyway.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from streamdp import serialization as ser
from streamdp.messages import InvalidMessage
from streamdp.privacy.epochs import WARMUP_EPOCH, EpochClock

LATE = -1          # route code for late documents
FUTURE = -2        # route code for documents dead-lettered for a time in the future
SELECTION = -3     # route code for documents of the vocabulary-selection window

#: Dead-letter error classes of the routing rule (record-level, not document decoding).
FUTURE_TIMESTAMP = "future_timestamp"
PRODUCER_TIMESTAMP = "producer_timestamp"


class RecordTimeRejected(InvalidMessage):
    """A record refused for its time: ``future_timestamp`` or ``producer_timestamp``."""

    def __init__(self, error_class: str, message: str):
        if error_class not in (FUTURE_TIMESTAMP, PRODUCER_TIMESTAMP):
            raise ValueError(f"unknown record-time error class {error_class!r}")
        ser.SchemaError.__init__(self, error_class, message)
        self.error_class = error_class
        self.message = message


@dataclass(frozen=True)
class Routing:
    """The public routing configuration (stream start, epoch length, lateness, future bound)."""

    clock: EpochClock
    lateness: float = 0.0
    max_future_seconds: float = 300.0
    selection_end: float | None = None      # vocabulary selection window: ts < selection_end

    def __post_init__(self) -> None:
        if self.selection_end is not None and not (
                math.isfinite(self.selection_end) and self.selection_end < self.clock.stream_start):
            raise ValueError(f"selection_end must be a finite time before stream_start "
                             f"({self.clock.stream_start!r}), got {self.selection_end!r}")
        if not (math.isfinite(self.lateness) and self.lateness >= 0):
            raise ValueError(f"lateness must be a finite number of seconds >= 0, got {self.lateness!r}")
        if not (math.isfinite(self.max_future_seconds) and self.max_future_seconds > 0):
            raise ValueError(f"max_future_seconds must be a finite number of seconds > 0, "
                             f"got {self.max_future_seconds!r}")

    def close_time(self, epoch: int) -> float:
        """Record time after which no on-time document of ``epoch`` (0 = warm-up,
        SELECTION = the vocabulary-selection window) can arrive."""
        if epoch == SELECTION:
            if self.selection_end is None:
                raise ValueError("this deployment has no selection window (selection_end)")
            return self.selection_end
        if epoch == WARMUP_EPOCH:
            return self.clock.stream_start
        return self.clock.epoch_end(epoch) + self.lateness

    def route(self, ts: np.ndarray, rt: np.ndarray, now: float | None = None) -> np.ndarray:
        """THE routing rule: SELECTION = vocabulary-selection window, 0 = warm-up, e ≥ 1 =
        stream epoch e, LATE = dropped, FUTURE = dead-letter (a time beyond the service clock
        ``now`` + max_future_seconds).

        Per document, from its own ``ts`` and ``rt`` and the service clock only: no other
        document, however it is stamped, changes this document's route.
        """
        now = time.time() if now is None else float(now)
        ts = np.asarray(ts, dtype=np.float64)
        rt = np.asarray(rt, dtype=np.float64)
        future = ((ts > now + self.max_future_seconds) | (rt > now + self.max_future_seconds)
                  | (ts > rt + self.max_future_seconds))
        epochs = self.clock.epochs(np.where(future, self.clock.stream_start, ts))
        close = np.where(epochs == WARMUP_EPOCH, self.clock.stream_start,
                         self.clock.stream_start + epochs * self.clock.epoch_seconds + self.lateness)
        out = np.where(future, FUTURE, np.where(rt < close, epochs, LATE))
        if self.selection_end is not None:
            # the selection window is cut out of the warm-up by the document's own ts
            sel = ~future & (ts < self.selection_end)
            out = np.where(sel, np.where(rt < self.selection_end, SELECTION, LATE), out)
        return out

    def is_future(self, ts: float, rt: float, now: float) -> bool:
        """Scalar twin of :meth:`route`'s FUTURE test (same three comparisons), for the
        per-record check in the sketcher's decode loop: a numpy call per record cost
        ≈ 40 µs, a third of the end-to-end time (benchmarks/pipeline.py)."""
        mf = self.max_future_seconds
        return bool(ts > now + mf or rt > now + mf or ts > rt + mf)

    @staticmethod
    def advance_progress(progress: float, record_times, now: float | None = None) -> float:
        """A partition's new progress after consuming records with ``record_times``:
        the largest record time, but never beyond the service clock ``now`` — one
        record stamped in the future cannot make any epoch closable early."""
        now = time.time() if now is None else float(now)
        rts = np.asarray(record_times, dtype=np.float64)
        rts = rts[np.isfinite(rts)]
        if not rts.size:
            return progress
        return max(progress, min(float(rts.max()), now))

    def future_reason(self, ts: float, rt: float, now: float) -> str:
        """Why :meth:`route` said FUTURE (for the dead-letter message)."""
        if rt > now + self.max_future_seconds:
            return (f"record timestamp {rt:.3f} is more than {self.max_future_seconds:g} s after the "
                    f"service clock {now:.3f}")
        if ts > now + self.max_future_seconds:
            return (f"document ts {ts:.3f} is more than {self.max_future_seconds:g} s after the "
                    f"service clock {now:.3f}")
        return (f"document ts {ts:.3f} is more than {self.max_future_seconds:g} s after its record "
                f"timestamp {rt:.3f}")

    def future_error(self, ts: float, rt: float, now: float) -> InvalidMessage:
        """The dead-letter error for a FUTURE route: ``future_timestamp`` against the service
        clock; ``invalid_value`` (as before) for a ``ts`` ahead of its own record time."""
        why = self.future_reason(ts, rt, now)
        if rt > now + self.max_future_seconds or ts > now + self.max_future_seconds:
            return RecordTimeRejected(FUTURE_TIMESTAMP, why)
        return InvalidMessage("invalid_value", why)


def effective_progress(progress: float | None, now: float | None = None) -> float | None:
    """A partition's progress as the release service may use it: capped by its own clock."""
    if progress is None:
        return None
    now = time.time() if now is None else float(now)
    return min(float(progress), now)
