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
from streamdp.services.release_policy import ClosingPolicy, Commands
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


def closable(epoch, states, partitions=(0, 1, 2), *, now=0.0, commands=Commands(), ends=None,
             policy=POLICY):
    probe = Probe(ends if ends is not None else {p: 10 for p in partitions})
    return policy.closable(epoch, states, list(partitions), commands=commands, now=now,
                           caught_up=probe), probe


def test_an_epoch_is_due_at_its_close_time_plus_the_grace_on_the_clock():
    ct = close_time(1)
    assert ct == START + EPOCH + LATENESS
    assert POLICY.due_at(1, Commands()) == ct + POLICY.grace
    passed = {p: rec(ct + p) for p in range(3)}                 # every one at or past ct
    # progress past the close time does not make the epoch due: only the clock does
    assert closable(1, passed, now=ct + POLICY.grace - 0.1)[0] is False
    ok, probe = closable(1, passed, now=ct + POLICY.grace)
    assert ok and probe.asked == []                             # progress alone covers the cut
    # due, but one partition neither past the cut nor caught up: the release waits
    for lagging in range(3):
        states = {**passed, lagging: rec(ct - 1e-6, next_offset=4)}
        ok, probe = closable(1, states, now=ct + 3600, ends={0: 10, 1: 10, 2: 10, lagging: 9})
        assert not ok and probe.asked == [(lagging, 4)]
    # no partitions at all: never closable, even ordered
    assert closable(1, {}, partitions=(), now=1e12, commands=Commands.of(forced_through=5))[0] is False
    # closing: operator — never due by the clock alone
    replay = ClosingPolicy(close_time, LATENESS, closing="operator")
    assert replay.due_at(1, Commands()) == math.inf
    assert closable(1, passed, now=1e12, policy=replay)[0] is False
    with pytest.raises(ValueError, match="closing"):
        ClosingPolicy(close_time, LATENESS, closing="arrivals")


def test_orders_make_epochs_due_at_the_order_time():
    ct = close_time(3)
    behind = {0: rec(ct - 200, next_offset=7), 1: rec(ct - 200, next_offset=5)}
    ends = {0: 7, 1: 5, 2: 0}                                     # all caught up (2 is empty)
    # close --through 3 at time 50 (before the schedule): due at 50, for epochs <= 3 only
    close3 = Commands.of(forced_through=3, at=50.0)
    assert POLICY.due_at(3, close3) == 50.0 and POLICY.due_at(4, close3) == close_time(4) + POLICY.grace
    assert closable(3, behind, ends=ends, commands=close3, now=50.0)[0]
    assert closable(3, behind, ends=ends, commands=Commands.of(forced_through=2), now=50.0)[0] is False
    # a partition with records past its state is not caught up: ordered or not, it holds
    ok, probe = closable(3, behind, ends={**ends, 1: 6}, commands=close3, now=60.0)
    assert not ok and (1, 5) in probe.asked
    # a flush at time t closes through the last epoch whose close time is <= t (the clock)
    t = close_time(3) + 1.0
    flush = Commands.of(flush_at=t)
    assert POLICY.due_at(3, flush) == t                  # before its schedule (ct + grace)
    assert POLICY.due_at(2, flush) == close_time(2) + POLICY.grace   # the schedule came first
    assert POLICY.due_at(4, flush) == close_time(4) + POLICY.grace
    # the earliest public input wins: the schedule if it came first
    late_flush = Commands.of(flush_at=close_time(2) + 3600)
    assert POLICY.due_at(2, late_flush) == close_time(2) + POLICY.grace


def test_the_selection_window_and_warm_up():
    before = {0: rec(START - 60), 1: rec(START - 60)}
    replay = ClosingPolicy(close_time, LATENESS, closing="operator")
    # the selection window closes at START - 50: ordered by any flush after it or close command
    assert closable(SELECTION, before, partitions=(0, 1), policy=replay, now=START)[0] is False
    assert closable(SELECTION, before, partitions=(0, 1), policy=replay, now=START,
                    commands=Commands.of(forced_through=0))[0]
    assert closable(SELECTION, before, partitions=(0, 1), policy=replay, now=START,
                    commands=Commands.of(flush_at=START - 50))[0]
    assert closable(SELECTION, before, partitions=(0, 1), policy=replay, now=START,
                    commands=Commands.of(flush_at=START - 51))[0] is False
    # the warm-up (epoch 0) closes at stream_start + grace, or by close through 0
    assert POLICY.due_at(0, Commands()) == START + POLICY.grace
    assert closable(0, before, partitions=(0, 1), policy=replay, now=START,
                    commands=Commands.of(forced_through=0))[0]


def test_orders_are_pruned_once_their_epochs_are_released():
    cmds = Commands.of(forced_through=3, flush_at=close_time(5))
    assert len(POLICY.prune(cmds, 2).orders) == 2
    assert len(POLICY.prune(cmds, 3).orders) == 1          # the close order is spent
    assert POLICY.prune(cmds, 5).orders == ()


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
        self._reports = []

    def produce(self, topic, value=None, key=None, on_delivery=None):
        self.sent.append((topic, key, value))
        if on_delivery is not None:
            self._reports.append(on_delivery)

    def flush(self, timeout=None):
        if not self.unacknowledged:       # delivered: the delivery reports say so
            reports, self._reports = self._reports, []
            for report in reports:
                report(None, None)
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
