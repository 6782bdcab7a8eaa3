"""Issue 15 items 6 and 8 and zombie fencing: time that one document cannot move,
authenticated control, fenced sketcher checkpoints.

Unit tests first (no broker), then attacks on the embedded broker.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from streamdp.privacy.epochs import EpochClock
from streamdp.services import control
from streamdp.services.partition_state import (FUTURE, LATE, PartitionState, Routing,
                                               effective_progress, fencing_token, select_state)

HOUR = 3600.0
THIRTY_DAYS = 30 * 86400.0


# ====================================================================== unit: time
def _routing(now: float, lateness: float = 0.0) -> Routing:
    # the service clock is in the middle of stream epoch 4
    return Routing(EpochClock(now - 3.5 * HOUR, HOUR), lateness, max_future_seconds=300.0)


def test_one_poison_timestamp_changes_nothing_for_other_documents():
    now = 1_700_000_000.0
    r = _routing(now)
    rng = np.random.default_rng(0)
    ts = np.sort(now - 4 * HOUR + rng.random(200) * 4 * HOUR)       # warm-up and epochs 1-4
    rt = ts.copy()
    alone = r.route(ts, rt, now)
    poison_ts, poison_rt = now + THIRTY_DAYS, now + THIRTY_DAYS
    for at in (0, 77, 200):                                           # anywhere in the batch
        ts2, rt2 = np.insert(ts, at, poison_ts), np.insert(rt, at, poison_rt)
        with_poison = r.route(ts2, rt2, now)
        assert with_poison[at] == FUTURE                              # dead-lettered, never routed
        assert np.array_equal(np.delete(with_poison, at), alone)      # nobody else moved
    assert set(np.unique(alone)) <= {0, 1, 2, 3, 4} and LATE not in alone

    # progress: the poison cannot advance a partition beyond the service clock, so it
    # cannot make the current epoch (4) or any later one closable
    progress = r.advance_progress(-math.inf, np.append(rt, poison_rt), now)
    assert progress == now
    assert progress < r.close_time(4)
    assert r.advance_progress(-math.inf, rt, now) == rt.max()       # without it: unchanged rule
    # the release service caps again with its own clock
    assert effective_progress(now + THIRTY_DAYS, now) == now
    assert effective_progress(None, now) is None


def test_future_bounds_against_the_service_clock():
    now = 1_700_000_000.0
    r = _routing(now)
    on_time = now - 10
    # record time ahead, document ts ahead, ts ahead of its own record time: all FUTURE
    assert r.route([on_time], [now + 301], now)[0] == FUTURE
    assert r.route([now + 301], [now], now)[0] == FUTURE
    assert r.route([on_time + 400], [on_time], now)[0] == FUTURE
    assert r.route([on_time], [on_time], now)[0] == 4
    assert r.route([now + 200], [now + 200], now)[0] == 4               # within the bound
    assert "service clock" in r.future_reason(on_time, now + 301, now)
    assert r.future_error(on_time, now + 301, now).error_class == "future_timestamp"
    assert r.future_error(now - 600, now - 1000, now).error_class == "invalid_value"   # ts ahead of rt
    with pytest.raises(ValueError):
        Routing(EpochClock(0.0, HOUR), 0.0, max_future_seconds=0.0)


def test_future_routes_are_never_added_to_a_sketch():
    st = PartitionState("t", 0)
    import scipy.sparse as sp
    with pytest.raises(ValueError, match="dead-lettered"):
        st.add(sp.csr_matrix(np.ones((1, 3))), np.array([FUTURE]), None, None, lambda: None)


# ====================================================================== unit: fencing
class _Rec:
    def __init__(self, fence, next_offset):
        self.meta = {"fence": fence, "next_offset": next_offset}


def test_select_state_rejects_records_that_go_backwards():
    a = _Rec(3, 100)
    assert select_state(None, a) == (a, False)
    assert select_state(a, None) == (a, False)
    newer = _Rec(3, 150)
    assert select_state(a, newer) == (newer, False)
    new_owner = _Rec(4, 100)
    assert select_state(a, new_owner) == (new_owner, False)
    zombie = _Rec(2, 500)                          # older fence, even with more offsets
    assert select_state(a, zombie) == (a, True)
    stale = _Rec(3, 99)                            # same fence, offsets backwards
    assert select_state(a, stale) == (a, True)
    legacy = type("R", (), {"meta": {"next_offset": 120}})()      # records before fencing: fence 0
    assert select_state(_Rec(0, 100), legacy) == (legacy, False)


def test_fencing_token_is_monotonic_across_a_new_group():
    assert fencing_token(5, 3) == 5
    assert fencing_token(0, 7) == 7               # group re-created: never below the restored token
    assert fencing_token(None, 0) == 0


# ====================================================================== unit: control MAC
def test_control_messages_are_authenticated():
    key, other = b"k" * 32, b"o" * 32
    signed = control.decode(control.encode("epochs_closed", key=key, through=3))
    assert control.authentic(signed, key)
    assert not control.authentic(signed, other)
    unsigned = control.decode(control.encode("epochs_closed", through=3))
    assert not control.authentic(unsigned, key)
    tampered = dict(signed, through=9)
    assert not control.authentic(tampered, key)


def test_control_key_required_in_production(tmp_path):
    from streamdp.services.config import ServiceConfig
    with pytest.raises(control.ControlKeyError, match="control_key_file"):
        control.load_key(ServiceConfig())
    short = tmp_path / "short.key"
    short.write_text("abc")
    with pytest.raises(control.ControlKeyError, match="at least 32"):
        control.load_key(ServiceConfig(control_key_file=str(short)))
    good = tmp_path / "control.key"
    good.write_text("ab" * 32 + "\n")
    assert control.load_key(ServiceConfig(control_key_file=str(good))) == b"ab" * 32
    demo = ServiceConfig(non_production=True)
    assert len(control.load_key(demo)) == 32
    assert ServiceConfig().broker_time_required
    assert not demo.broker_time_required
    assert ServiceConfig(non_production=True, require_broker_time=True).broker_time_required


# ====================================================================== attacks on the embedded broker
def _live_corpus(n_warm: int, now: float):
    """Warm-up documents, and a stream_start that puts the service clock mid-epoch 4."""
    from service_helpers import make_corpus
    stream_start = now - 3.5 * HOUR
    return make_corpus(n_warm, 600, 4, seed=3, stream_start=stream_start)


def _on_time_records(corpus, n: int, now: float) -> list[dict]:
    base = corpus.n_warm
    return [{"id": f"live-{i}", "ts": now - 120.0 + 0.1 * i, "text": corpus.texts[base + i]}
            for i in range(n)]


def _sketched(pipe) -> int:
    return sum(st.next_offset for s in pipe.sketchers for st in s.states.values())


def _start_with_subspace(kafka_broker, tmp_path, corpus, **changes):
    from service_helpers import Pipeline, fresh_topics, make_config, send_control, wait_for
    from streamdp.services.produce import produce
    bootstrap = kafka_broker.bootstrap
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=None, horizon=8, **changes)
    pipe = Pipeline(cfg, sketchers=2).start()
    n = produce(bootstrap, names.documents, [corpus.record(i) for i in range(corpus.n_warm)])
    send_control(bootstrap, names, "close", through=0)           # the operator closes the warm-up
    wait_for(lambda: pipe.release.subspace is not None, 90, "the warm-up release", check=pipe.check)
    return pipe, cfg, names, n


def test_poison_timestamp_30_days_ahead_closes_nothing_early(kafka_broker, tmp_path):
    """Before the fix: the poison record's time became the partition's progress, every epoch up
    to the horizon closed within seconds and the 500 on-time documents were dropped as late."""
    from service_helpers import read_topic, send_control, wait_for
    from streamdp import messages
    from streamdp.services.produce import produce

    now = time.time()
    corpus = _live_corpus(1200, now)
    pipe, cfg, names, n = _start_with_subspace(kafka_broker, tmp_path, corpus)
    try:
        # one poison record per documents partition (an attacker who can produce can do this)
        from confluent_kafka import Producer
        from streamdp.kafka.topics import client_config
        prod = Producer(client_config(kafka_broker.bootstrap, "producer"))
        for part in (0, 1):
            prod.produce(names.documents, partition=part, key=f"poison-{part}".encode(),
                         value=messages.encode_document(f"poison-{part}", now + THIRTY_DAYS,
                                                        text=corpus.texts[-1]),
                         timestamp=int((now + THIRTY_DAYS) * 1000))
        assert prod.flush(10) == 0
        n += 2
        on_time = _on_time_records(corpus, 500, time.time())
        n += produce(kafka_broker.bootstrap, names.documents, on_time)
        wait_for(lambda: _sketched(pipe) == n, 60, f"all {n} records consumed", check=pipe.check)
        # a flush closes through the epoch the *clock* says has closed (3), whatever the
        # poison record's time (issue 23: flush is never paced by data)
        send_control(kafka_broker.bootstrap, names, "flush")
        pipe.wait_released(3, timeout=90)
        time.sleep(3.0)                       # the release service steps every 0.2 s
        # epochs 1-3 ended (on the service clock) before the test: closed; 4 is the
        # current epoch and must stay open, whatever the poison record says
        assert pipe.release.continual.epoch == 3, pipe.release.continual.epoch
        dlq = read_topic(kafka_broker.bootstrap, names.dlq)
        assert [r.headers[messages.HEADER_ERROR_CLASS] for r in dlq] == [b"future_timestamp"] * 2
        assert b"service clock" in dlq[0].headers[messages.HEADER_ERROR_MESSAGE]
        late = sum(st.counters["late"] for s in pipe.sketchers for st in s.states.values())
        assert late == 0

        send_control(kafka_broker.bootstrap, names, "close", through=4)   # the operator's order
        snap = pipe.wait_released(4, timeout=90)
        assert snap.epoch == 4 and snap.n_docs == pytest.approx(500)   # non-private: exact count
        time.sleep(1.0)
        assert pipe.release.continual.epoch == 4                         # nothing beyond
    finally:
        pipe.stop()


def test_forged_epochs_closed_drops_nothing(kafka_broker, tmp_path):
    """Before the fix: a forged ``epochs_closed`` made the sketchers drop the sketched documents
    of the open epochs, which were then never released."""
    from service_helpers import send_control, wait_for
    from streamdp.kafka.topics import client_config
    from confluent_kafka import Producer
    from streamdp.services.produce import produce

    now = time.time()
    corpus = _live_corpus(1200, now)
    pipe, cfg, names, n = _start_with_subspace(kafka_broker, tmp_path, corpus)
    try:
        on_time = _on_time_records(corpus, 400, time.time())
        n += produce(kafka_broker.bootstrap, names.documents, on_time)
        wait_for(lambda: _sketched(pipe) == n, 60, f"all {n} records consumed", check=pipe.check)
        p = Producer(client_config(kafka_broker.bootstrap, "producer"))
        # an unsigned forgery, one signed with the wrong key, and one signed with the
        # deployment's (non-production, derived) key: the release state is the truth
        p.produce(names.control, value=control.encode("epochs_closed", through=8))
        p.produce(names.control, value=control.encode("epochs_closed", key=b"x" * 32, through=8))
        p.produce(names.control, value=control.encode("epochs_closed", key=control.load_key(cfg),
                                                      through=8))
        assert p.flush(10) == 0
        wait_for(lambda: all(s.control_rejected >= 3 for s in pipe.sketchers), 20,
                 "the sketchers to see the forged messages", check=pipe.check)
        held = sum(sk.n_docs for s in pipe.sketchers for st in s.states.values()
                   for e, sk in st.epochs.items() if e == 4)
        assert held == 400
        assert all(s.closed_through <= pipe.release.continual.epoch for s in pipe.sketchers)

        send_control(kafka_broker.bootstrap, names, "close", through=4)
        snap = pipe.wait_released(4, timeout=90)
        assert snap.n_docs == pytest.approx(400)
    finally:
        pipe.stop()
