"""The release service's control announcements to the sketchers.

``vocabulary_ready``, ``subspace_ready`` and ``epochs_closed`` go to the control topic
(:meth:`~streamdp.services.release_sinks.ReleaseSinks.announce`), each sent only after the
record it announces is persisted. A private deployment's ``vocabulary_ready`` and
``epochs_closed`` also mark the documents topic as released (:func:`state_loss.mark_released`:
a later deployment on these documents is refused unless the loss is confirmed).
"""
from __future__ import annotations

import logging
import threading

from streamdp.services import state_loss
from streamdp.services.config import ServiceConfig
from streamdp.services.release_sinks import ReleaseSinks

log = logging.getLogger("streamdp.release")

#: why releases ended (the ``reason`` label of ``streamdp_releases_ended``)
ENDED_BUDGET, ENDED_HORIZON, ENDED_OTHER = "budget", "horizon", "other"


class Announcer:
    """Sends the control announcements through the sinks; marks released documents topics."""

    def __init__(self, cfg: ServiceConfig, sinks: ReleaseSinks) -> None:
        self.cfg = cfg
        self.sinks = sinks
        self._marking: threading.Thread | None = None

    def vocabulary_ready(self, vocabulary_id: str) -> None:
        self.send("vocabulary_ready", vocabulary_id=vocabulary_id)

    def subspace_ready(self, subspace_id: str) -> None:
        self.send("subspace_ready", subspace_id=subspace_id)

    def epochs_closed(self, through: int) -> None:
        self.send("epochs_closed", through=through)

    def send(self, type_: str, **fields) -> None:
        self.sinks.announce(type_, **fields)
        if self.cfg.private and type_ in ("vocabulary_ready", "epochs_closed"):
            # sent only after a spent record is persisted: mark the documents topic as released
            # (state_loss: a later deployment on these documents is refused unless confirmed)
            self.mark_released()

    def mark_released(self, wait: float = 15.0) -> None:
        """state_loss.mark_released, bounded: a synchronous offset commit waits for the group
        coordinator without a timeout of its own, and the release loop must not hang on it
        (best effort: refreshed at every release; one attempt in flight at a time)."""
        pending = self._marking
        docs = self.cfg.topics.documents
        if pending is not None and pending.is_alive():
            log.error("the release marker of documents topic %r is still being committed; "
                      "retried at the next release", docs)
            return
        failed: list[Exception] = []

        def run() -> None:
            try:
                state_loss.mark_released(self.cfg)
            except Exception as e:        # noqa: BLE001 - logged below
                failed.append(e)
        t = threading.Thread(target=run, name="mark-released", daemon=True)
        t.start()
        t.join(wait)
        self._marking = t
        if t.is_alive():
            log.error("could not mark documents topic %r as released within %.0f s (retried at "
                      "the next release)", docs, wait)
        elif failed:
            log.error("could not mark documents topic %r as released (retried at the next "
                      "release): %s", docs, failed[0])
