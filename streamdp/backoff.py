"""Exponential back-off: the one schedule of waits between retries.

Used by the outage guard (:class:`streamdp.kafka.connectivity.OutageGuard`: open-ended, capped)
and the bounded retries of refused dead letters and release records
(``DLQ_RETRY_SECONDS``, ``DELIVERY_RETRY_SECONDS``). Waiting itself stays with the caller:
the outage guard must keep beating its liveness and stop early on SIGTERM.
"""
from __future__ import annotations

import itertools
import math
from typing import Iterator


def exponential_delays(initial: float, maximum: float = math.inf, *, factor: float = 2.0,
                       attempts: int | None = None) -> Iterator[float]:
    """``initial``, ``initial·factor``, ``initial·factor²``, … each capped at ``maximum``;
    endless, or ``attempts`` values."""
    if not (initial > 0 and math.isfinite(initial)) or not maximum >= initial or not factor >= 1:
        raise ValueError(f"back-off needs 0 < initial <= maximum and factor >= 1, got "
                         f"initial={initial!r}, maximum={maximum!r}, factor={factor!r}")
    if attempts is not None and attempts < 0:
        raise ValueError(f"attempts must be >= 0, got {attempts!r}")

    def delays() -> Iterator[float]:
        wait = float(initial)
        while True:
            yield wait
            wait = min(float(maximum), wait * factor)

    return itertools.islice(delays(), attempts)
