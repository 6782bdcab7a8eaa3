"""An in-process sketcher: the real :class:`Sketcher` (its ``step``/``process`` path, control
handling and checkpoints) over fake Kafka clients, so poll batches, releases and crashes can be
placed exactly. Used by tests/test_refinement_rule.py.

The fake documents consumer serves one partition in offset order, at most ``batch_size``
records per ``consume`` (max poll records), honouring ``pause``/``seek``/``resume``. The fake
state store holds the subspace record, the release state record (what the release service
persists: ``last_snapshot``, ``refinement_models``), the public release record sketchers read
(``public/release``) and the sketcher's own checkpoints.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from confluent_kafka import TIMESTAMP_CREATE_TIME

from streamdp import serialization as ser
from streamdp.kafka.state_store import StateRecord
from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.epochs import EpochClock
from streamdp.refinement import FoldInModels
from streamdp.services import control, public_records, public_release, state_auth
from streamdp.services.config import ServiceConfig
from streamdp.snapshot import TopicSnapshot
from streamdp.text.vocabulary import Vocabulary
from streamdp.whitening.subspace import Subspace

TOPIC = "rr.documents"
EPOCH = 3600.0


START = float(int(time.time() // 3600) * 3600 - 2 * 86400)      # a replayed feed, two days ago


def stream_start() -> float:
    return START


class FakeMsg:
    def __init__(self, partition: int, offset: int, value: bytes, ts: float, topic: str = TOPIC):
        self._p, self._o, self._v, self._ms, self._t = partition, offset, value, int(round(ts * 1000)), topic

    def value(self):
        return self._v

    def key(self):
        return None

    def offset(self):
        return self._o

    def partition(self):
        return self._p

    def topic(self):
        return self._t

    def error(self):
        return None

    def timestamp(self):
        return TIMESTAMP_CREATE_TIME, self._ms

    def headers(self):
        return None


class FakeDocumentsConsumer:
    def __init__(self, world: "World") -> None:
        self.world = world
        self.pos = 0
        self.paused = False
        self.polls = 0

    def consume(self, num_messages: int = 1, timeout: float = 0.0):
        self.polls += 1
        if self.paused:
            return []
        out = self.world.messages[self.pos:self.pos + num_messages]
        self.pos += len(out)
        return out

    def pause(self, tps):
        self.paused = True

    def resume(self, tps):
        self.paused = False

    def seek(self, tp):
        self.pos = tp.offset

    def commit(self, *a, **k):
        return None

    def close(self):
        return None


class FakeControlConsumer:
    def __init__(self, world: "World") -> None:
        self.world = world
        self.read = 0

    def assign(self, tps):
        return None

    def consume(self, num_messages: int = 100, timeout: float = 0.0):
        out = self.world.control[self.read:self.read + num_messages]
        self.read += len(out)
        return out

    def close(self):
        return None


class FakeProducer:
    def __init__(self, *a, **k):
        self.produced = []

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
        self.produced.append((topic, value))
        if on_delivery is not None:     # delivered (the processor checks every report)
            on_delivery(None, None)

    def poll(self, t=0):
        return 0

    def flush(self, t=0):
        return 0


class FakeStore:
    def __init__(self) -> None:
        self.records: dict[str, StateRecord] = {}

    def read_latest(self, key: str):
        return self.records.get(key)

    def read_all_latest(self, prefix: str = ""):
        return {k: v for k, v in self.records.items() if k.startswith(prefix)}

    def write(self, key: str, payload: bytes, meta: dict | None = None):
        self.records[key] = StateRecord(payload, dict(meta or {}), 0)

    def close(self):
        return None


class World:
    """The documents (one partition), the control topic and the state topic of one run."""

    def __init__(self, cfg: ServiceConfig, subspace: Subspace) -> None:
        self.cfg, self.subspace = cfg, subspace
        self.messages: list[FakeMsg] = []
        self.control: list[FakeMsg] = []
        self.store = FakeStore()
        # what sketchers read: the public subspace record, signed (streamdp.services.public_records)
        public_records.write(self.store, state_auth.for_config(cfg), public_records.SUBSPACE_KEY,
                             subspace.to_bytes(), {"clip": ClipBounds.unclipped().to_dict(),
                                                   "subspace_id": subspace.id})
        self.folds = FoldInModels(cfg.refinement_model_lag)     # what the release service keeps
        self.snapshots: list[TopicSnapshot] = []

    def add_documents(self, values_ts) -> None:
        for value, ts in values_ts:
            self.messages.append(FakeMsg(0, len(self.messages), value, ts))

    def release(self, epoch: int, topic_word: np.ndarray, alpha: np.ndarray,
                stage: str = "spectral") -> TopicSnapshot:
        """What the release service does at the close of ``epoch``: persist the release state
        (last snapshot + the last L models), write the public release record, then announce
        ``epochs_closed``."""
        snap = TopicSnapshot(topic_word=np.asarray(topic_word, float), alpha=np.asarray(alpha, float),
                             eigenvalues=np.ones(len(alpha)), n_docs=0.0, privacy={},
                             mechanism="none", subspace_id=self.subspace.id, epoch=epoch,
                             release_id=f"release-{epoch}", stage=stage)
        self.snapshots.append(snap)
        self.folds.add_snapshot(snap)
        payload = ser.dumps({"last_snapshot": snap.to_bytes(), "refinement_models": [
            self.folds.models[e].to_dict() for e in sorted(self.folds.models)]})
        self.store.write(control.RELEASE_STATE_KEY, payload,
                         {"epoch": epoch, "release_id": snap.release_id})
        # ... and the public record sketchers read (streamdp.services.public_release), signed
        models = [self.folds.models[e].to_dict() for e in sorted(self.folds.models)]
        public = public_release.encode(epoch, models)
        self.store.write(public_release.KEY, public, state_auth.for_config(self.cfg).sign(
            public_release.KEY, public, {"epoch": epoch}))
        self.control.append(FakeMsg(0, len(self.control), control.encode(
            "epochs_closed", key=control.load_key(self.cfg), through=epoch), time.time(),
            topic="rr.control"))
        return snap


def make_config(tmp: Path, words: list[str], n_topics: int, **changes) -> ServiceConfig:
    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    Vocabulary(words).save(tmp / "vocabulary.txt")
    values = dict(bootstrap="127.0.0.1:1", topic_prefix="rr", vocabulary=str(tmp / "vocabulary.txt"),
                  vocabulary_public_by_assumption=True, n_topics=n_topics, epsilon=None,
                  non_private=True, non_production=True, stream_start=stream_start(),
                  epoch_seconds=EPOCH, refinement=True, batch_size=5, poll_seconds=0.01,
                  checkpoint_seconds=1e9, ledger=str(tmp / "ledger.jsonl"),
                  snapshot_dir=str(tmp / "snapshots"), confirm_backfill=True)
    values.update(changes)
    return ServiceConfig(**values)


def make_sketcher(world: World, monkeypatch, restore: bytes | None = None):
    """A Sketcher on ``world``'s fake clients, assigned partition 0 (restored from ``restore``,
    a checkpoint payload, and positioned at its next offset), with the subspace loaded and the
    release state read as at start-up."""
    from streamdp.services import sketcher as mod
    from streamdp.services.partition_state import PartitionState

    consumers = []

    def consumer(conf):
        c = FakeControlConsumer(world) if conf["group.id"].endswith("-control") else FakeDocumentsConsumer(world)
        consumers.append(c)
        return c

    monkeypatch.setattr(mod, "check_bootstrap", lambda *a, **k: None)
    monkeypatch.setattr(mod, "check_limits", lambda *a, **k: None)     # no broker to describe
    monkeypatch.setattr(mod, "check_privacy_mode", lambda *a, **k: None)
    monkeypatch.setattr(mod, "Producer", FakeProducer)
    monkeypatch.setattr(mod, "Consumer", consumer)
    monkeypatch.setattr(mod, "open_state_store", lambda *a, **k: world.store)
    sk = mod.Sketcher(world.cfg, instance="harness")
    sk.subspace, sk.clip, sk.warmup_closed = world.subspace, ClipBounds.unclipped(), True
    if restore is not None:
        st = PartitionState.from_bytes(restore, world.subspace)
        sk.consumer.pos = st.next_offset
    else:
        st = PartitionState(TOPIC, 0)
    sk.states[0] = st
    sk._refresh_model()
    return sk


def checkpoint_payload(sk) -> bytes:
    return sk.states[0].to_bytes()


def epoch_start(e: int) -> float:
    return stream_start() + (e - 1) * EPOCH


def clock() -> EpochClock:
    return EpochClock(stream_start(), EPOCH)
