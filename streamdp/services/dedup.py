"""Deduplication by document id (issue 25 item 3; docs/privacy.md "The unit is a document id").

A document re-sent with the same id (``streamdp produce`` run twice on one file, a producer
retrying without idempotence, a replayed backfill) must count once: the privacy analysis is
per document, and a document counted twice costs about twice its ε.

The rule (one place): a sketcher remembers, per documents partition, a keyed 64-bit hash of the
id of every document it *counted* (added to the warm-up, to a stream epoch's sketch or to the
vocabulary-selection histogram; not late, not dead-lettered), with that document's epoch e′ —
its own epoch from its timestamp and the public schedule (0 for the warm-up and the selection
window). With ``dedup_window_epochs`` = N, a later document of the partition that would be
counted, with epoch e, is a duplicate iff an earlier counted document with the same id hash has
|e − e′| < N; with N = null (the default) iff any earlier counted document has that id (the
deployment's life). A duplicate is dead-lettered with class ``duplicate_id`` and counted on
``streamdp_documents_skipped_total{reason="duplicate_id"}``, never sketched. A late document is
never remembered (it is not counted); it is checked against the ids still held, so a copy of a
counted document is dead-lettered as a duplicate rather than dropped as late while its
counted copy's epoch is held (either way it is not counted). The hashes are part of the
partition's checkpoint (the same self-sufficient record as its sketches and next offset), so a
crash, a restart or a rebalance re-reads the records after the checkpoint with exactly the set
the lost run had: the outcome equals a clean run's.

Memory (the window): ids are held grouped by e′; a group is dropped once the partition's
closed-through epoch c (the release service's, confirmed; −1 while the warm-up is open)
reaches e′ + N − 1. No document counted later can then be within N of it: a counted document
has e > c ≥ e′ + N − 1 (documents of closed epochs are late). So the set holds the ids of about
N + (open epochs) epochs, whatever the deployment's age.

What it guarantees
------------------
* Per partition. ``streamdp produce`` keys a document by its user, else by its id, so the same
  line sent again reaches the same partition while the partition count is unchanged; a
  producer that keys the same id differently can put copies on two partitions, and those are
  two documents (docs/privacy.md).
* Whether a record is counted depends on its own id and epoch, on the earlier counted records
  with the same id, and on public values (the schedule, N, the closed-through epoch) only —
  except for a hash collision: with n remembered ids in its partition, a document X is wrongly
  taken for an earlier, different id with probability ≤ n / 2⁶⁴ over the secret key
  (≈ 5·10⁻¹¹ at n = 10⁹), and only then does another document's presence change whether X is
  counted. The key is derived from the deployment's control key (secret), so nobody outside
  the trust boundary can construct colliding ids. docs/privacy.md adds this to δ.
* The unit: with a window N, the same id re-sent N or more epochs after its counted copy counts
  again — it is a second document (docs/privacy.md "The unit is a document id": group privacy,
  ε per copy).
* Memory: 8 bytes per remembered id (plus a set of the ids seen since the last merge), in the
  sketcher and in each checkpoint of its partition, exported as ``streamdp_dedup_ids``. Without
  a window it is bounded only by the documents a partition receives over the deployment's
  horizon; with one, by those of N + (open epochs) epochs. There is deliberately no cap that
  halts or drops: either would be a decision on a raw count that one document can change
  (issue 23: everything an observer sees is output).

Checkpoint format: version 2 (:meth:`CountedIds.to_obj`: the window, the ids by epoch). A
version-1 checkpoint (one flat set, written before the window, in partition_state v1) is
migrated by partition_state's one migration: its ids become
*lifetime* ids — a duplicate for any later document with the same id, never dropped — which is
what they were when written (strictly more duplicates than the window rule, never fewer).
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import numpy as np

from streamdp import serialization as ser

DUPLICATE_ID = "duplicate_id"        # the dead-letter error class (messages.DUPLICATE_ID)


class IdHasher:
    """Keyed 64-bit hashes of document ids (BLAKE2b, key derived from the control key)."""

    def __init__(self, control_key: bytes) -> None:
        # a separate key per purpose: the MAC key is never used as a hash key directly
        self._key = hashlib.sha256(b"streamdp document-id dedup/" + bytes(control_key)).digest()

    def hashes(self, ids: Iterable[str]) -> np.ndarray:
        key, b2 = self._key, hashlib.blake2b
        raw = b"".join(b2(i.encode("utf-8", "surrogatepass"), digest_size=8, key=key).digest()
                       for i in ids)
        # int64 (the same 8 bytes, signed): numpy converts to and from Python ints in that
        # range at C speed, where uint64 values ≥ 2⁶³ take a slow path (measured 30x)
        return np.frombuffer(raw, dtype="<i8").astype(np.int64)


class SeenIds:
    """The id hashes one partition has accepted: a sorted array plus the ones added since the
    last merge (a set for lookups and their arrays; merged into the sorted array, by insertion,
    when they reach 1/8 of it: amortised O(log n) per id)."""

    def __init__(self, hashes: np.ndarray | None = None) -> None:
        self._sorted = (np.zeros(0, np.int64) if hashes is None
                        else _sorted_unique(np.asarray(hashes, dtype=np.int64)))
        self._recent: set[int] = set()
        self._recent_arrays: list[np.ndarray] = []

    def __len__(self) -> int:
        return int(self._sorted.size) + len(self._recent)

    def contains(self, h: np.ndarray) -> np.ndarray:
        """Which of ``h`` are remembered."""
        h = np.asarray(h, dtype=np.int64)
        out = np.zeros(h.size, dtype=bool)
        if not h.size:
            return out
        if self._sorted.size:
            i = np.searchsorted(self._sorted, h)
            i[i == self._sorted.size] = 0
            out |= self._sorted[i] == h
        if self._recent:
            recent = self._recent
            out |= np.fromiter((x in recent for x in h.tolist()), dtype=bool, count=h.size)
        return out

    def duplicates(self, h: np.ndarray) -> np.ndarray:
        """Which of ``h`` (in log order) are duplicates: remembered already, or equal to an
        earlier element of ``h``. Changes nothing (:meth:`add` does)."""
        h = np.asarray(h, dtype=np.int64)
        out = self.contains(h)
        if not h.size:
            return out
        # an earlier element of the batch: after a stable sort, equal values keep their log
        # order, so every one but the first of a run is a later copy
        order = np.argsort(h, kind="stable")
        sh = h[order]
        copy = np.zeros(h.size, dtype=bool)
        copy[1:] = sh[1:] == sh[:-1]
        later = np.empty(h.size, dtype=bool)
        later[order] = copy
        return out | later

    def add(self, h: Sequence[int] | np.ndarray) -> None:
        h = np.asarray(h, dtype=np.int64)
        if not h.size:
            return
        self._recent.update(h.tolist())
        self._recent_arrays.append(h)
        if len(self._recent) > max(4096, self._sorted.size // 8):
            self._merge()

    def _merge(self) -> None:
        if self._recent_arrays:
            # merge two sorted arrays: O(n + r log r), not a sort of the whole set
            new = _sorted_unique(np.concatenate(self._recent_arrays))
            at = np.searchsorted(self._sorted, new)
            if self._sorted.size:
                known = self._sorted[np.minimum(at, self._sorted.size - 1)] == new
                new, at = new[~known], at[~known]
            self._sorted = np.insert(self._sorted, at, new)
            self._recent, self._recent_arrays = set(), []

    def to_bytes(self) -> bytes:
        self._merge()
        return self._sorted.astype("<i8").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> "SeenIds":
        if len(data) % 8:
            raise ValueError(f"document-id hashes: {len(data)} bytes is not a multiple of 8")
        return cls(np.frombuffer(data, dtype="<i8").astype(np.int64))


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """The distinct values of ``a``, sorted (np.unique is a hash table for integers in recent
    numpy: measured 17x slower than this sort on 10⁶ values)."""
    if a.size > 1 and bool(np.all(a[1:] > a[:-1])):
        return a                        # a checkpoint's set: sorted and distinct already
    a = np.sort(a)
    if a.size > 1:
        a = a[np.concatenate([[True], a[1:] != a[:-1]])]
    return a


DEDUP_VERSION = 2       # the checkpoint format of CountedIds (1: a flat SeenIds, no window)
DEDUP_KIND = "counted_ids"


class CountedIds:
    """The ids one partition counted, under the deployment's window ``dedup_window_epochs``
    (None: the deployment's life): THE duplicate rule of the module docstring.

    ``lifetime``: ids never dropped (every id without a window; with one, the ids of a version-1
    checkpoint); ``by_epoch``: e′ -> the ids counted with epoch e′ (with a window)."""

    def __init__(self, window: int | None = None, *, lifetime: SeenIds | None = None,
                 by_epoch: dict[int, SeenIds] | None = None) -> None:
        if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                                   or window < 1):
            raise ValueError(f"dedup window must be None or an integer >= 1, got {window!r}")
        if window is None and by_epoch:
            raise ValueError("ids grouped by epoch need a window")
        self.window = window
        self.lifetime = lifetime if lifetime is not None else SeenIds()
        self.by_epoch: dict[int, SeenIds] = dict(by_epoch or {})

    def __len__(self) -> int:
        return len(self.lifetime) + sum(len(g) for g in self.by_epoch.values())

    def _near(self, epoch: np.ndarray, e: int) -> np.ndarray:
        return np.abs(epoch - e) < self.window

    def duplicates(self, h: np.ndarray, epochs: np.ndarray,
                   counted: np.ndarray | None = None) -> np.ndarray:
        """Which of the documents (id hashes ``h``, own epochs ``epochs``, in log order) are
        duplicates: an id counted before within the window, or the same id as an earlier
        document of the batch that is counted (``counted``: which would be, default all; a
        duplicate is not) within the window. Changes nothing (:meth:`add` does)."""
        h = np.asarray(h, dtype=np.int64)
        epochs = np.asarray(epochs, dtype=np.int64)
        counted = (np.ones(h.size, dtype=bool) if counted is None
                   else np.asarray(counted, dtype=bool))
        out = self.lifetime.contains(h)
        for e, group in self.by_epoch.items():
            near = self._near(epochs, e) & ~out
            if near.any():
                out[near] |= group.contains(h[near])
        # copies inside the batch (rare): each run of equal hashes in log order (stable sort)
        order = np.argsort(h, kind="stable")
        sh = h[order]
        same = np.zeros(h.size, dtype=bool)
        same[1:] = sh[1:] == sh[:-1]
        if same.any():
            start = 0
            for i in range(1, h.size + 1):
                if i == h.size or not same[i]:
                    if i - start > 1:
                        before: list[int] = []      # epochs of the run's counted copies
                        for r in order[start:i].tolist():
                            if out[r]:
                                continue
                            if any(self.window is None or abs(int(epochs[r]) - c) < self.window
                                   for c in before):
                                out[r] = True
                            elif counted[r]:
                                before.append(int(epochs[r]))
                    start = i
        return out

    def add(self, h, epochs) -> None:
        """Remember counted documents (id hashes ``h`` with their own epochs)."""
        h = np.asarray(h, dtype=np.int64)
        if not h.size:
            return
        if self.window is None:
            self.lifetime.add(h)
            return
        epochs = np.asarray(epochs, dtype=np.int64)
        for e in np.unique(epochs).tolist():
            self.by_epoch.setdefault(int(e), SeenIds()).add(h[epochs == e])

    def expire(self, closed_through: int) -> int:
        """Drop the epochs no later counted document can be within the window of: e′ with
        e′ + N − 1 ≤ ``closed_through`` (the partition's closed-through epoch; −1 while the
        warm-up, epoch 0, is open). Returns how many ids were dropped."""
        if self.window is None:
            return 0
        gone = [e for e in self.by_epoch if e + self.window - 1 <= closed_through]
        return sum(len(self.by_epoch.pop(e)) for e in gone)

    def bound_to(self, window: int | None) -> "CountedIds":
        """These ids under the configured window: themselves when it is theirs; a version-1 set
        (lifetime ids only, window unknown) is migrated; anything else is refused (ValueError:
        the deployment contract refuses a changed window before this)."""
        if window == self.window:
            return self
        if not self.by_epoch and self.window is None:
            return CountedIds(window, lifetime=self.lifetime)   # lifetime ids stay lifetime ids
        raise ValueError(f"the partition's checkpoint deduplicates ids within "
                         f"{self.window} epoch(s), the configuration says dedup_window_epochs = "
                         f"{window}: the window cannot change in a running deployment")

    def to_obj(self) -> dict:
        return {"v": DEDUP_VERSION, "window": self.window, "lifetime": self.lifetime.to_bytes(),
                "by_epoch": [[e, g.to_bytes()] for e, g in sorted(self.by_epoch.items())]}

    @classmethod
    def from_obj(cls, obj) -> "CountedIds":
        """A version-2 record (:meth:`to_obj`); another version is refused saying what to do.
        Version 1, one flat set, existed only inside partition_state v1, whose one migration
        converts it (streamdp.services.partition_state._state_v1_to_v2). The record is nested
        in the partition state, which names its kind: it carries only ``v``."""
        obj = ser.upgrade({"kind": DEDUP_KIND, **obj} if isinstance(obj, dict) else obj,
                          DEDUP_KIND, DEDUP_VERSION)
        ser.require(obj, DEDUP_KIND, "window", "lifetime", "by_epoch")
        window = obj["window"]
        return cls(None if window is None else int(window),
                   lifetime=SeenIds.from_bytes(obj["lifetime"]),
                   by_epoch={int(e): SeenIds.from_bytes(b) for e, b in obj["by_epoch"]})
