"""The release service's view of the sketchers' checkpoints on the state topic.

Every poll the release service needs the newest *accepted* sketch state of each documents
partition. :class:`PartitionView` reads them through the state store's incremental view (each
poll folds only the records written since the previous one: the cost of a poll does not grow
with the number of closed epochs behind it, issue 13), applies THE fencing rule
(:func:`~streamdp.services.partition_state.select_state`: a record whose fencing token or
``next_offset`` goes backwards was written by a zombie sketcher and is rejected; the newest
accepted one is kept), and decodes each partition's state once per (partition, generation)
instead of at every poll.
"""
from __future__ import annotations

import logging
import time

from streamdp.services.partition_state import (PartitionState, effective_progress,
                                               select_state)

log = logging.getLogger(__name__)


class PartitionView:
    """Newest accepted sketch state per documents partition, and their decoded states.

    ``store``: a :class:`~streamdp.kafka.state_store.StateStore` of the deployment's state
    topic; ``documents_topic``: the input topic whose partitions' states are read.
    """

    def __init__(self, store, documents_topic: str) -> None:
        self.store = store
        self.prefix = f"sketch/{documents_topic}/"
        self.accepted: dict[int, object] = {}           # partition -> newest accepted record
        self.rejected = 0                               # zombie records seen (per poll)
        self._decoded: dict[int, tuple[tuple, PartitionState]] = {}

    def read(self, now: float | None = None) -> dict[int, object]:
        """Partition → its newest accepted state record, ``progress`` capped by ``now``."""
        now = time.time() if now is None else float(now)
        states = {}
        for r in self.store.read_all_latest(prefix=self.prefix).values():
            p = int(r.meta["partition"])
            chosen, rejected = select_state(self.accepted.get(p), r)
            if rejected:       # a zombie sketcher's checkpoint: keep the newest accepted record
                self.rejected += 1
                log.warning("partition %d: ignored a state record that goes backwards (fence %s, "
                            "next_offset %s < accepted %s, %s)", p, r.meta.get("fence"),
                            r.meta["next_offset"], chosen.meta.get("fence"),
                            chosen.meta["next_offset"])
            self.accepted[p] = chosen
            # progress as the release service may use it: never beyond its own clock
            states[p] = chosen._replace(meta={**chosen.meta, "progress": effective_progress(
                chosen.meta.get("progress"), now)})
        return states

    def load(self, states: dict, subspace) -> list[PartitionState]:
        """The decoded states, in partition order, each decoded once per (partition, generation).

        Callers must not modify them (merging into a copy is fine): a cached state is handed out
        again at the next poll while its record is unchanged."""
        out = []
        for p in sorted(states):
            rec = states[p]
            key = (rec.generation, None if subspace is None else subspace.id)
            hit = self._decoded.get(p)
            if hit is None or hit[0] != key:
                hit = self._decoded[p] = (key, PartitionState.from_bytes(rec.payload, subspace))
            out.append(hit[1])
        for p in set(self._decoded) - set(states):
            del self._decoded[p]
        return out
