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

from streamdp.services.partition_state import PartitionState, select_state
from streamdp.services.routing import effective_progress

log = logging.getLogger(__name__)


class PartitionView:
    """Newest accepted sketch state per documents partition, and their decoded states.

    ``store``: a :class:`~streamdp.kafka.state_store.StateStore` of the deployment's state
    topic; ``documents_topic``: the input topic whose partitions' states are read; ``auth``: the
    deployment's :class:`~streamdp.services.state_auth.StateAuth` — a record without a valid
    MAC is refused (logged, counted in ``unauthentic``) and the partition keeps its last
    accepted record. The release service always passes it; ``None`` (view tests, benchmarks)
    reads without checking.
    """

    def __init__(self, store, documents_topic: str, auth=None) -> None:
        self.store = store
        self.prefix = f"sketch/{documents_topic}/"
        self.auth = auth
        self.accepted: dict[int, object] = {}           # partition -> newest accepted record
        self.rejected = 0                               # zombie records seen (per poll)
        self.unauthentic = 0                            # records refused for their MAC
        self._verified: dict[str, tuple[int, bool]] = {}  # key -> (generation, MAC valid)
        self._decoded: dict[int, tuple[tuple, PartitionState]] = {}

    def read(self, now: float | None = None) -> dict[int, object]:
        """Partition → its newest accepted state record, ``progress`` capped by ``now``."""
        now = time.time() if now is None else float(now)
        states = {}
        for key, r in self.store.read_all_latest(prefix=self.prefix).items():
            ok, new = (True, False) if self.auth is None else self._authentic(key, r)
            if not ok:
                if new:                                   # logged and counted once per record
                    self.unauthentic += 1
                    log.error("refused the state record %r (generation %s): no valid MAC under "
                              "this deployment's key (a forged record, or one copied from another "
                              "partition or deployment); the partition keeps its last accepted "
                              "record", key, r.generation)
                r = None
            p = _partition(key)
            chosen, rejected = select_state(self.accepted.get(p), r)
            if chosen is None:
                continue
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

    def _authentic(self, key: str, r) -> tuple[bool, bool]:
        """(MAC valid, first time seen), checked once per (key, generation): hashing every
        payload at every poll would make a poll's cost grow with the state's size."""
        seen = self._verified.get(key)
        if seen is not None and seen[0] == r.generation:
            return seen[1], False
        ok = self.auth.authentic(key, r.payload, r.meta)
        self._verified[key] = (r.generation, ok)
        return ok, True

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


def _partition(key: str) -> int:
    """The documents partition of a sketch state key (``sketch/<topic>/<partition>``): from the
    key, which the MAC covers (its meta's ``partition`` is covered too, but only a key ties a
    record to a slot)."""
    return int(key.rsplit("/", 1)[1])
