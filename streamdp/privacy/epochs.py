"""Which role and epoch a document belongs to — decided by its own timestamp alone.

The parallel-composition argument (DESIGN §4, docs/privacy.md) needs each
document's atom (the warm-up, or one stream epoch) to depend on that document
only. A count-based boundary ("the first 100k documents warm up") would let one
added document push another across the boundary, so roles and epochs are cut
by *timestamp* against a public clock:

    ts <  stream_start                        → warm-up
    stream_start + (t−1)·L ≤ ts < stream_start + t·L  → stream epoch t (1-based)

``stream_start`` and the epoch length L are public configuration. A document
whose epoch has already been closed (it arrived after the public watermark
passed its epoch) is *late*: it is dropped and counted, never moved to another
epoch, so its atom stays the one its timestamp says.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

WARMUP_EPOCH = 0   # epoch number used for warm-up documents in arrays


@dataclass(frozen=True)
class EpochClock:
    """Public cut of time into the warm-up and stream epochs 1, 2, ….

    Attributes
    ----------
    stream_start : float    seconds since the Unix epoch; earlier documents warm up
    epoch_seconds : float   L, the length of one stream epoch
    """

    stream_start: float
    epoch_seconds: float

    def __post_init__(self) -> None:
        if not (isinstance(self.stream_start, (int, float)) and math.isfinite(self.stream_start)):
            raise ValueError(f"stream_start must be a finite timestamp in seconds, got "
                             f"{self.stream_start!r}")
        if not (isinstance(self.epoch_seconds, (int, float)) and math.isfinite(self.epoch_seconds)
                and self.epoch_seconds > 0):
            raise ValueError(f"epoch_seconds must be a finite number > 0, got {self.epoch_seconds!r}")

    def epochs(self, ts) -> np.ndarray:
        """Epoch of each timestamp: 0 for the warm-up, t ≥ 1 for stream epoch t.

        Raises ValueError on non-finite timestamps (a document without a usable
        timestamp has no atom; the caller dead-letters it).
        """
        ts = np.asarray(ts, dtype=np.float64)
        if not np.all(np.isfinite(ts)):
            raise ValueError("document timestamps must be finite")
        t = np.floor((ts - self.stream_start) / self.epoch_seconds).astype(np.int64) + 1
        return np.where(ts < self.stream_start, WARMUP_EPOCH, np.maximum(t, 1))

    def epoch_of(self, ts: float) -> int:
        return int(self.epochs([ts])[0])

    def epoch_end(self, epoch: int) -> float:
        """First timestamp after epoch ``epoch`` (its watermark: once wall-clock
        time passes it plus the allowed lateness, the epoch can be closed)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        return self.stream_start + epoch * self.epoch_seconds

    def closable_through(self, watermark: float) -> int:
        """The last epoch whose end is ≤ ``watermark`` (0 if none)."""
        return max(0, int(math.floor((watermark - self.stream_start) / self.epoch_seconds)))
