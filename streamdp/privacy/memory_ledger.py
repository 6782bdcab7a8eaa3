"""In-process ledger for the estimator's own accountant (not durable).

The in-process estimator (:class:`streamdp.StreamingSpectralLDA`) enforces its
(ε, δ) with a real :class:`~streamdp.privacy.accountant.Accountant`; its ledger
lives as long as the estimator object. Services use
:class:`~streamdp.privacy.ledger.FileLedger` (or a topic-backed ledger), which
survives restarts.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from streamdp.privacy.ledger import LedgerRecord


class MemoryLedger:
    """Append-only list of records behind a lock (same protocol as FileLedger)."""

    def __init__(self) -> None:
        self._records: list[LedgerRecord] = []
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"MemoryLedger({len(self._records)} records)"

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._lock:
            yield

    def read(self) -> list[LedgerRecord]:
        with self._lock:
            return list(self._records)

    def append(self, record: LedgerRecord) -> None:
        with self._lock:
            self._records.append(record)
