"""What a sketcher keeps for one input partition, and the rule that routes documents.

One :class:`PartitionState` per documents-topic partition. It is checkpointed as
one self-sufficient record (``streamdp.kafka.state_store``): the sketches *and*
the next input offset they cover, so restoring it and seeking there neither loses
nor double-counts a document.

Routing rule (docs/privacy.md §Continual release, docs/services.md §Epochs)
--------------------------------------------------------------------------
Each document's role depends only on its own attributes: its event time ``ts``
and its Kafka record timestamp ``rt`` (when it entered the log):

* ``ts < stream_start`` and ``rt < stream_start``          → warm-up;
* ``ts ≥ stream_start`` with epoch e = clock.epoch(ts) and
  ``rt < clock.epoch_end(e) + lateness``                   → stream epoch e;
* otherwise                                                 → late: dropped, counted.

Record timestamps must be non-decreasing per partition (``LogAppendTime`` on the
documents topic in production; ``streamdp produce`` writes in timestamp order).
Then once a partition's progress (largest ``rt`` consumed) passes an epoch's close
time, no on-time document of that epoch can follow on it, and the release service
can close the epoch knowing every on-time document is in the sketches.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from streamdp import serialization as ser
from streamdp.documents import MIN_DOC_LENGTH
from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import WhitenedSketch
from streamdp.privacy.epochs import WARMUP_EPOCH, EpochClock
from streamdp.whitening.subspace import Subspace
from streamdp.whitening.warmup import WarmupSketch

KIND = "partition_state"
VERSION = 1
LATE = -1          # route code for late documents


@dataclass(frozen=True)
class Routing:
    """The public routing configuration (stream start, epoch length, lateness)."""

    clock: EpochClock
    lateness: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lateness) and self.lateness >= 0):
            raise ValueError(f"lateness must be a finite number of seconds >= 0, got {self.lateness!r}")

    def close_time(self, epoch: int) -> float:
        """Record time after which no on-time document of ``epoch`` (0 = warm-up) can arrive."""
        if epoch == WARMUP_EPOCH:
            return self.clock.stream_start
        return self.clock.epoch_end(epoch) + self.lateness

    def route(self, ts: np.ndarray, rt: np.ndarray) -> np.ndarray:
        """0 = warm-up, e ≥ 1 = stream epoch e, LATE = dropped (per document, own attributes)."""
        ts = np.asarray(ts, dtype=np.float64)
        rt = np.asarray(rt, dtype=np.float64)
        epochs = self.clock.epochs(ts)
        close = np.where(epochs == WARMUP_EPOCH, self.clock.stream_start,
                         self.clock.stream_start + epochs * self.clock.epoch_seconds + self.lateness)
        return np.where(rt < close, epochs, LATE)


@dataclass
class PartitionState:
    """Sketches and progress of one documents partition.

    Attributes
    ----------
    topic, partition      the input partition
    next_offset : int     first input offset NOT yet in the sketches
    progress : float      largest record timestamp consumed (seconds); -inf before any
    warmup : WarmupSketch | None       warm-up sums (None once the subspace is out)
    epochs : dict[int, WhitenedSketch] open stream epochs not yet released
    closed_through : int  epochs the release service has closed (their sketches dropped)
    counters : dict       documents, tokens, unknown_tokens, late, empty, dlq
    """

    topic: str
    partition: int
    next_offset: int = 0
    progress: float = -math.inf
    warmup: WarmupSketch | None = None
    epochs: dict[int, WhitenedSketch] = field(default_factory=dict)
    closed_through: int = 0
    counters: dict[str, int] = field(default_factory=lambda: {
        "documents": 0, "warmup_documents": 0, "tokens": 0, "unknown_tokens": 0, "late": 0,
        "empty": 0, "dlq": 0})

    @property
    def key(self) -> str:
        return state_key(self.topic, self.partition)

    # ------------------------------------------------------------ updating
    def add(self, X: sp.csr_matrix, routes: np.ndarray, subspace: Subspace | None,
            clip: ClipBounds | None, warmup_factory) -> dict[str, int]:
        """Add a validated batch routed by :meth:`Routing.route`; returns per-role counts.

        Stream documents need the subspace; the caller must not pass any before it
        exists (it pauses the partition instead). Documents routed to an epoch
        the release service already closed are late.
        """
        routes = np.where((routes > 0) & (routes <= self.closed_through), LATE, routes)
        out = {"warmup": 0, "stream": 0, "late": int(np.sum(routes == LATE)), "short": 0}
        short = (np.asarray(X.sum(axis=1)).ravel() < MIN_DOC_LENGTH) if X.shape[0] else np.zeros(0, bool)
        for r in np.unique(routes):
            rows = np.flatnonzero(routes == r)
            if r == LATE:
                continue
            if r == WARMUP_EPOCH:
                if self.warmup is None:
                    if subspace is not None:      # warm-up closed: these are late
                        out["late"] += rows.size
                        continue
                    self.warmup = warmup_factory()
                self.warmup.update(X[rows])
                out["warmup"] += rows.size
                out["short"] += int(short[rows].sum())
                continue
            if subspace is None:
                raise RuntimeError("stream documents before the subspace exists (pause instead)")
            sk = self.epochs.get(int(r))
            if sk is None:
                sk = self.epochs[int(r)] = WhitenedSketch(subspace, clip)
            sk.update(X[rows])
            out["stream"] += rows.size
            out["short"] += int(short[rows].sum())
        self.counters["late"] += out["late"]
        self.counters["warmup_documents"] += out["warmup"]
        self.counters["documents"] += out["stream"]
        return out

    def forget_closed(self, closed_through: int, warmup_closed: bool) -> None:
        """Drop sketches the release service has consumed (raw state lives no longer)."""
        self.closed_through = max(self.closed_through, int(closed_through))
        for e in [e for e in self.epochs if e <= self.closed_through]:
            del self.epochs[e]
        if warmup_closed:
            self.warmup = None

    # ------------------------------------------------------------ checkpoint
    def to_bytes(self) -> bytes:
        return ser.dumps({
            "kind": KIND, "v": VERSION, "topic": self.topic, "partition": self.partition,
            "next_offset": self.next_offset,
            "progress": None if self.progress == -math.inf else self.progress,
            "warmup": None if self.warmup is None else self.warmup.to_bytes(),
            "epochs": [[e, sk.to_bytes()] for e, sk in sorted(self.epochs.items())],
            "closed_through": self.closed_through, "counters": self.counters,
        })

    @classmethod
    def from_bytes(cls, data: bytes, subspace: Subspace | None) -> "PartitionState":
        obj = ser.loads(data)
        ser.check_header(obj, KIND, VERSION)
        if obj["epochs"] and subspace is None:
            raise ser.SchemaError("partition state holds stream sketches but no subspace is known")
        return cls(topic=obj["topic"], partition=int(obj["partition"]),
                   next_offset=int(obj["next_offset"]),
                   progress=-math.inf if obj["progress"] is None else float(obj["progress"]),
                   warmup=None if obj["warmup"] is None else WarmupSketch.from_bytes(obj["warmup"]),
                   epochs={int(e): WhitenedSketch.from_bytes(b, subspace) for e, b in obj["epochs"]},
                   closed_through=int(obj["closed_through"]), counters=dict(obj["counters"]))

    def meta(self) -> dict:
        """Small manifest metadata: lets the release service check progress cheaply."""
        return {"topic": self.topic, "partition": self.partition, "next_offset": self.next_offset,
                "progress": None if self.progress == -math.inf else self.progress,
                "epochs": sorted(self.epochs), "warmup": self.warmup is not None,
                "closed_through": self.closed_through}


def state_key(topic: str, partition: int) -> str:
    return f"sketch/{topic}/{int(partition)}"
