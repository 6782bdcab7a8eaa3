"""The release service's pure parts, without Kafka: the closing policy on fake partition views
(streamdp.services.release_policy), the merge of partition states against brute force
(streamdp.services.release_merge), and the publishing sinks on a fake producer
(streamdp.services.release_sinks: nothing is visible before the broker acknowledged it)."""
from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import WhitenedSketch
from streamdp.refinement import RefinementModel, RefinementSketch
from streamdp.services.partition_state import SELECTION, PartitionState
from streamdp.services.release_merge import (SketchMismatch, merge_epoch_sums, merge_refine_sums,
                                             merge_warmups)
from streamdp.services.release_policy import ClosingPolicy, Commands, newest_epoch
from streamdp.services.release_sinks import ReleaseSinks
from streamdp.snapshot import TopicSnapshot
from streamdp.text.vocabulary import Vocabulary
from streamdp.whitening.warmup import WarmupSketch

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------ closing policy
EPOCH, LATENESS, START = 100.0, 10.0, 1000.0


def close_time(epoch: int) -> float:
    """Epoch e ≥ 1 ends at START + e·EPOCH; its documents are late after + LATENESS.
    The warm-up (0) closes at START; the selection window at START − 50."""
    if epoch == SELECTION:
        return START - 50.0
    return START if epoch == 0 else START + epoch * EPOCH + LATENESS


POLICY = ClosingPolicy(close_time, LATENESS)


def rec(progress: float | None, next_offset: int = 10, epochs=(1,)):
    """A fake accepted state record of one partition (what PartitionView.read returns)."""
    meta = {"next_offset": next_offset, "epochs": list(epochs)}
    if progress is not None:
        meta["progress"] = progress
    return SimpleNamespace(meta=meta)


class Probe:
    """``caught_up(partition, next_offset)``: partition → its end offset; records the asks."""

    def __init__(self, ends: dict[int, int]):
        self.ends, self.asked = ends, []

    def __call__(self, p: int, next_offset: int) -> bool:
        self.asked.append((p, next_offset))
        return self.ends[p] <= next_offset


def closable(epoch, states, partitions=(0, 1, 2), *, now=0.0, commands=Commands(), ends=None):
    probe = Probe(ends if ends is not None else {p: 10 for p in partitions})
    return POLICY.closable(epoch, states, list(partitions), commands=commands, now=now,
                           caught_up=probe), probe


def test_an_epoch_closes_only_when_every_partition_passed_its_end_plus_lateness():
    ct = close_time(1)
    assert ct == START + EPOCH + LATENESS
    passed = {p: rec(ct + p) for p in range(3)}                 # every one at or past ct
    ok, probe = closable(1, passed)
    assert ok and probe.asked == []                             # progress alone decides
    for lagging in range(3):
        # one partition just before epoch end + lateness: not closable (past the epoch's end
        # is not enough, lateness must pass too)
        states = {**passed, lagging: rec(ct - 1e-6)}
        assert closable(1, states)[0] is False
        states = {**passed, lagging: rec(START + EPOCH)}        # epoch end, lateness not past
        assert closable(1, states)[0] is False
    # a partition with no state and one with no progress yet
    assert closable(1, {0: passed[0], 1: passed[1]})[0] is False
    assert closable(1, {**passed, 2: rec(None)})[0] is False
    # epoch 2 is not closable from the same view
    assert closable(2, passed)[0] is False


def test_a_partition_held_or_from_the_future_counts_by_its_progress_only():
    ct = close_time(1)
    # a sketcher held for its refinement model reports the held record's time as progress
    # (capped by the service clock): before the close time it holds the epoch, whatever else
    held = {0: rec(ct + 500), 1: rec(ct - 30, next_offset=4), 2: rec(ct + 1)}
    ok, probe = closable(1, held, ends={0: 10, 1: 9, 2: 10}, now=ct + 3600)
    assert not ok and probe.asked == [(1, 4)]        # live past the close time: asked, not caught up
    # a state "from the future" (progress far ahead) counts as past: it cannot hold an epoch
    future = {0: rec(1e12), 1: rec(ct), 2: rec(math.inf)}
    assert closable(1, future)[0]
    # no partitions at all: never closable, even forced
    assert closable(1, {}, partitions=(), commands=Commands(forced_through=5))[0] is False


def test_forced_or_live_epochs_close_on_caught_up_partitions_only():
    ct = close_time(3)
    behind = {0: rec(ct - 200, next_offset=7), 1: rec(ct - 200, next_offset=5), 2: None}
    states = {p: r for p, r in behind.items() if r is not None}   # partition 2: no state
    ends = {0: 7, 1: 5, 2: 0}                                     # all caught up (2 is empty)
    assert closable(3, states, ends=ends)[0] is False             # not forced, not live past
    # an operator's close through 3 (or later) forces it; through 2 does not
    assert closable(3, states, ends=ends, commands=Commands(forced_through=3))[0]
    assert closable(3, states, ends=ends, commands=Commands(forced_through=2))[0] is False
    # live: idle_grace seconds past the close time (lateness > 0)
    assert closable(3, states, ends=ends, now=ct + POLICY.idle_grace)[0]
    assert closable(3, states, ends=ends, now=ct + POLICY.idle_grace - 0.1)[0] is False
    # ... but not with lateness 0 (no live closing without lateness)
    strict = ClosingPolicy(close_time, 0.0)
    assert strict.closable(3, states, [0, 1, 2], commands=Commands(), now=ct + 3600,
                           caught_up=Probe(ends)) is False
    # a partition with records past its state is not caught up: forced or not, it holds
    ok, probe = closable(3, states, ends={**ends, 1: 6}, commands=Commands(forced_through=9))
    assert not ok and (1, 5) in probe.asked
    # a flush forces every epoch some partition holds sums of, not later ones
    flushed = {p: rec(ct - 200, next_offset=ends[p], epochs=(2, 3)) for p in (0, 1)}
    assert newest_epoch(flushed) == 3
    assert closable(3, flushed, ends=ends, commands=Commands(flush_requested=True))[0]
    assert closable(4, flushed, ends=ends, commands=Commands(flush_requested=True))[0] is False


def test_the_selection_window_and_warm_up():
    before = {0: rec(START - 60), 1: rec(START - 60)}
    # the selection window closes at START - 50: forced by any flush or close command
    assert closable(SELECTION, before, partitions=(0, 1))[0] is False
    assert closable(SELECTION, before, partitions=(0, 1), commands=Commands(forced_through=0))[0]
    assert closable(SELECTION, before, partitions=(0, 1),
                    commands=Commands(flush_requested=True))[0]
    # the warm-up (epoch 0) closes at stream_start, forced by close through 0
    assert closable(0, before, partitions=(0, 1))[0] is False
    assert closable(0, before, partitions=(0, 1), commands=Commands(forced_through=0))[0]
    assert closable(0, {0: rec(START), 1: rec(START)}, partitions=(0, 1))[0]


def test_flush_complete():
    states = {0: rec(0, next_offset=4, epochs=(2,)), 1: rec(0, next_offset=9, epochs=())}
    ends = {0: 4, 1: 9, 2: 0}
    assert ClosingPolicy.flush_complete(2, states, [0, 1, 2], Probe(ends))
    assert not ClosingPolicy.flush_complete(1, states, [0, 1, 2], Probe(ends))   # epoch 2 open
    assert not ClosingPolicy.flush_complete(2, states, [0, 1, 2], Probe({**ends, 2: 1}))


def test_the_policy_and_the_merge_are_pure():
    """No Kafka client and no clock in the pure modules: the service passes both in."""
    for name in ("release_policy", "release_merge"):
        tree = ast.parse((ROOT / "streamdp" / "services" / f"{name}.py").read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any("kafka" in m or m == "time" for m in imported), (name, imported)


# ------------------------------------------------------------------ merge
def _subspace(d: int, k: int, seed: int):
    from streamdp.whitening.subspace import Subspace
    rng = np.random.default_rng(seed)
    Q, R = np.linalg.qr(rng.standard_normal((d, k)))
    return Subspace(Q * np.sign(np.diag(R)))


def _docs(rng, n: int, d: int) -> np.ndarray:
    X = rng.integers(0, 3, size=(n, d)).astype(float)
    X[:, 0] += 3                                  # every document has length >= 3
    return X


def test_merge_epoch_sums_is_the_sum_over_partitions():
    rng = np.random.default_rng(11)
    d, k = 25, 4
    sub, clip = _subspace(d, k, 1), ClipBounds.for_length(30)
    rows = {0: _docs(rng, 13, d), 1: _docs(rng, 7, d), 3: _docs(rng, 21, d)}
    parts = []
    for p in range(4):
        st = PartitionState(topic="t", partition=p)
        if p in rows:                              # partition 2 has no document of epoch 5
            st.epochs[5] = WhitenedSketch(sub, clip).update(rows[p])
            st.epochs[6] = WhitenedSketch(sub, clip).update(rows[p][:2])   # another epoch
        parts.append(st)
    total, n = merge_epoch_sums(parts, 5, sub, clip)
    assert n == 3
    # brute force: each partition's own sums added field by field, and one sketch of all rows
    own = [parts[p].epochs[5].sums() for p in sorted(rows)]
    everything = WhitenedSketch(sub, clip).update(np.vstack([rows[p] for p in sorted(rows)])).sums()
    for f in ("count", "m1", "z", "s1", "s2", "s3"):
        got = np.asarray(getattr(total, f))
        np.testing.assert_allclose(got, sum(np.asarray(getattr(s, f)) for s in own),
                                   rtol=1e-12, atol=1e-12, err_msg=f)
        np.testing.assert_allclose(got, np.asarray(getattr(everything, f)),
                                   rtol=1e-9, atol=1e-9, err_msg=f)
    assert merge_epoch_sums(parts, 7, sub, clip) == (None, 0)      # no partition has epoch 7
    # the partitions must agree with the release's calibration
    bad = PartitionState(topic="t", partition=9)
    bad.epochs[5] = WhitenedSketch(sub, ClipBounds.for_length(5)).update(rows[0])
    with pytest.raises(SketchMismatch, match="partition 9 epoch 5: sketch clipped with"):
        merge_epoch_sums(parts + [bad], 5, sub, clip)


def test_merge_refine_sums_is_the_sum_over_partitions():
    rng = np.random.default_rng(12)
    d, k = 25, 3
    model = RefinementModel(rng.dirichlet(np.ones(d), size=k), rng.uniform(0.2, 1.0, size=k), "m")
    rows = {0: _docs(rng, 9, d), 2: _docs(rng, 30, d)}
    parts = []
    for p in range(3):
        st = PartitionState(topic="t", partition=p)
        if p in rows:
            st.refine[4] = RefinementSketch(k, d).update(rows[p], model)
        parts.append(st)
    before = [st.refine[4].sums.copy() for st in parts if 4 in st.refine]
    got = merge_refine_sums(parts, 4, (k, d))
    np.testing.assert_allclose(got, sum(before), rtol=1e-12, atol=1e-12)
    one = RefinementSketch(k, d).update(np.vstack([rows[0], rows[2]]), model)
    np.testing.assert_allclose(got, one.sums, rtol=1e-9, atol=1e-12)
    for st, b in zip([s for s in parts if 4 in s.refine], before):
        np.testing.assert_array_equal(st.refine[4].sums, b)        # the partitions' states unchanged
    assert merge_refine_sums(parts, 5, (k, d)) is None
    with pytest.raises(SketchMismatch, match="refinement sums of shape"):
        merge_refine_sums(parts, 4, (k + 1, d))


def test_merge_warmups():
    rng = np.random.default_rng(13)
    d = 20
    empty = [PartitionState(topic="t", partition=p) for p in range(2)]
    assert merge_warmups(empty) is None
    no_docs = [PartitionState(topic="t", partition=0, warmup=WarmupSketch(d, 4, seed=0))]
    assert merge_warmups(no_docs) is None                      # a sketch of 0 documents: none
    parts = []
    for p, n in enumerate((5, 0, 8)):
        w = WarmupSketch(d, 4, seed=0)
        if n:
            w.update(_docs(rng, n, d))
        parts.append(PartitionState(topic="t", partition=p, warmup=w))
    assert merge_warmups(parts).n_docs == 13


# ------------------------------------------------------------------ sinks
class FakeProducer:
    """Records produce() calls; ``flush`` answers how many messages are NOT acknowledged."""

    def __init__(self, unacknowledged: int = 0):
        self.sent, self.unacknowledged = [], unacknowledged

    def produce(self, topic, value=None, key=None):
        self.sent.append((topic, key, value))

    def flush(self, timeout=None):
        return self.unacknowledged


def _snapshot(vocab: Vocabulary, epoch: int) -> TopicSnapshot:
    tw = np.random.default_rng(epoch).dirichlet(np.ones(len(vocab)), size=3)
    return TopicSnapshot(tw, np.ones(3), np.ones(3), 100.0, {}, "none", "S", epoch=epoch,
                         vocabulary_id=vocab.id)


def test_sinks_show_only_what_the_broker_acknowledged(tmp_path):
    vocab = Vocabulary([f"w{j:02d}" for j in range(12)])
    topics = SimpleNamespace(snapshots="snaps", control="ctl")
    producer = FakeProducer(unacknowledged=1)
    sinks = ReleaseSinks(producer, topics, tmp_path / "out", vocabulary=lambda: vocab,
                         control_key=lambda: b"k" * 32)
    snap = _snapshot(vocab, 1)
    assert (sinks.latest, sinks.published, sinks.latest_json(), sinks.latest_bytes()) == (None,) * 4
    with pytest.raises(RuntimeError, match="not acknowledged"):
        sinks.publish(snap)
    # not acknowledged: no view shows it (the next attempt republishes from the state)
    assert (sinks.latest, sinks.published, sinks.latest_json(), sinks.latest_bytes()) == (None,) * 4
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []
    producer.unacknowledged = 0
    sinks.publish(snap)
    assert sinks.latest is snap and sinks.latest_bytes() == snap.to_bytes()
    assert producer.sent[-1] == ("snaps", snap.release_id.encode(), snap.to_bytes())
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == [f"epoch-000001-{snap.release_id}.msgpack", "latest.json"]
    on_disk = json.loads((tmp_path / "out" / "latest.json").read_text())
    assert on_disk == json.loads(json.dumps(sinks.latest_json(), default=float))
    assert on_disk["release_id"] == snap.release_id
    later = _snapshot(vocab, 2)
    sinks.publish(later)
    assert sinks.latest is later and sinks.latest_json()["epoch"] == 2
    # announcements go to the control topic, MAC'd
    from streamdp.services import control
    sinks.announce("epochs_closed", through=2)
    topic, _, raw = producer.sent[-1]
    msg = control.decode(raw)
    assert topic == "ctl" and msg["type"] == "epochs_closed" and msg["through"] == 2
    assert control.authentic(msg, b"k" * 32)
