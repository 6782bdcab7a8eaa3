"""Liveness and readiness of one service.

Liveness = the poll loop called :meth:`HealthState.beat` within ``liveness_timeout`` seconds
(every poll, empty polls included); readiness = a flag the service sets (partitions assigned
and state restored) with a human-readable reason, and gates checked at every query.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable


class HealthState:
    """Liveness (poll-loop heartbeat) and readiness (service-set flag).

    ``beat()`` must be called on every poll, empty polls included; the loop is
    live while the last beat is at most ``liveness_timeout`` seconds old
    (construction counts as a beat, a start-up grace period: beat during long
    state restores too, or give the pod a startupProbe). Readiness starts
    false with reason ``"starting"``.
    """

    def __init__(self, liveness_timeout: float = 30.0, *,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        if not liveness_timeout > 0:
            raise ValueError("liveness_timeout must be > 0")
        self.liveness_timeout = float(liveness_timeout)
        self._clock = clock
        self._wall_clock = wall_clock
        self._last = (clock(), wall_clock())  # (monotonic, wall), replaced atomically
        self._lock = threading.Lock()
        self._ready = False
        self._reason = "starting"
        # conditions checked at every /readyz on top of the flag (e.g. the release service's
        # confirmed writer epoch): each returns (ok, reason)
        self._gates: list[Callable[[], tuple[bool, str]]] = []

    def beat(self) -> None:
        """The poll loop went round once (hot path: two clock reads, one store)."""
        self._last = (self._clock(), self._wall_clock())

    @property
    def last_beat_wall(self) -> float:
        """Unix time of the last beat."""
        return self._last[1]

    def last_progress_age(self) -> float:
        return max(0.0, self._clock() - self._last[0])

    def is_live(self) -> bool:
        return self.last_progress_age() <= self.liveness_timeout

    def set_ready(self, ready: bool, reason: str = "") -> None:
        """E.g. ``set_ready(True, "3 partitions assigned, state restored")`` or
        ``set_ready(False, "revoked; restoring")`` / ``(False, "shutting down")``."""
        with self._lock:
            self._ready = bool(ready)
            self._reason = reason or ("ready" if ready else "not ready")

    def add_ready_gate(self, gate: Callable[[], tuple[bool, str]]) -> None:
        """Ready only while ``gate()`` says ok too (checked at every readiness query)."""
        self._gates.append(gate)

    def is_ready(self) -> bool:
        return self.readiness()[0]

    def ready_flag(self) -> tuple[bool, str]:
        """The flag the service set, without the gates (what an outage saves and restores)."""
        with self._lock:
            return self._ready, self._reason

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        age = self.last_progress_age()
        live = age <= self.liveness_timeout
        return live, {"status": "ok" if live else "stalled",
                      "last_progress_age_seconds": round(age, 3),
                      "liveness_timeout_seconds": self.liveness_timeout}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            ready, reason = self._ready, self._reason
        for gate in self._gates if ready else ():
            ok, why = gate()
            if not ok:
                ready, reason = False, why
                break
        return ready, {"status": "ready" if ready else "not_ready", "reason": reason}
