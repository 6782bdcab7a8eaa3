"""Attack tests of the trust boundary between sketchers and the release service (issue 23 item 6;
docs/privacy.md §Trust boundary), on the embedded broker with real services.

* A sketcher patched to scale a block of its checkpointed sums ×100 (it holds the key, so its
  records verify): the release service refuses that partition's sums as implausible before any
  noise, counts it on /metrics, and every epoch still releases on schedule, from the other
  partition's documents exactly.
* Records written to the state topic without the key (forged), under another deployment's key
  or prefix, or copied from another partition's key: each is refused for its MAC, the partition
  keeps its last accepted record, and the releases are exactly a clean run's (the engine's).

Non-private runs: the released values are then exact, so "unaffected" and "left out" are
equalities, not statistics. The checks run before the noise in either mode (no draw depends on
a refused record: the refusals happen in the merge and the view, upstream of ``close_epoch``).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from confluent_kafka import Producer

from streamdp import serialization as ser
from streamdp.kafka.state_store import StateStore
from streamdp.privacy.ledger import FileLedger
from streamdp.services import control
from streamdp.services.partition_state import PartitionState, state_key
from streamdp.services.produce import produce
from streamdp.services.state_auth import StateAuth

from service_helpers import (Pipeline, engine_snapshots, fresh_topics, make_config, make_corpus,
                             metric, read_topic, scrape_until, send_control, wait_for)
from test_services import assert_one_snapshot_per_epoch, snapshots_by_epoch, wait_http_ready


def _start(cfg, sketchers=1) -> tuple[Pipeline, str]:
    pipe = Pipeline(cfg, sketchers=sketchers)
    pipe.start()
    wait_for(lambda: pipe.release.server is not None, 20, "the release metrics server",
             check=pipe.check)
    url = pipe.release.server.url.rstrip("/")
    wait_http_ready([url], check=pipe.check)
    return pipe, url


def _stream_epoch(ts: float, corpus) -> int:
    return int(math.floor((ts - corpus.stream_start) / corpus.epoch_seconds)) + 1


def _docs_per_partition_epoch(bootstrap, topic, corpus) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    for r in read_topic(bootstrap, topic):
        ts = float(ser.loads(r.value)["ts"])
        if ts >= corpus.stream_start:
            k = (r.partition, _stream_epoch(ts, corpus))
            out[k] = out.get(k, 0) + 1
    return out


SCALED_PARTITION = 1


@pytest.fixture
def scaling_sketcher(monkeypatch):
    """Patch the sketchers' checkpoints: partition 1's epoch sketches are written with their
    m1 accumulator ×100 (what a buggy strategy would write; signed like any record)."""
    original = PartitionState.to_bytes

    def to_bytes(self):
        if self.partition != SCALED_PARTITION or not self.epochs:
            return original(self)
        sub = next(iter(self.epochs.values())).subspace
        copy = PartitionState.from_bytes(original(self), sub)
        for sk in copy.epochs.values():
            sk._flush_pending()
            sk.m1 *= 100.0
            sk.comp["m1"] *= 100.0
        return original(copy)

    monkeypatch.setattr(PartitionState, "to_bytes", to_bytes)


@pytest.mark.slow
@pytest.mark.parametrize("private", [False, True], ids=["non_private", "private"])
def test_a_sketcher_writing_unclipped_sums_is_left_out_and_releases_continue(
        kafka_broker, tmp_path, scaling_sketcher, private):
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(600, 1600, 2, seed=3)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=4.0 if private else None,
                      **({"sampler": "fast", "noise_seed": 5} if private else {}))
    pipe, url = _start(cfg)
    try:
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "flush", through=corpus.epochs)
        pipe.wait_released(corpus.epochs, timeout=120)
        samples = scrape_until(url, lambda m: metric(m, "streamdp_releases_total",
                                                     outcome="published") >= corpus.epochs,
                               15, "the release metrics of the last epoch")
    finally:
        pipe.stop()
    # refused loudly: one partition's sums for each epoch, none for their MAC
    assert metric(samples, "streamdp_state_records_refused_total",
                  reason="implausible") == corpus.epochs
    assert metric(samples, "streamdp_state_records_refused_total", reason="mac") == 0
    assert metric(samples, "streamdp_releases_ended", reason="other") == 0
    # the schedule is not changed: one snapshot per epoch, each from partition 0's documents only
    by_epoch = snapshots_by_epoch(bootstrap, names.snapshots)
    assert sorted(by_epoch) == list(range(1, corpus.epochs + 1))
    assert_one_snapshot_per_epoch(by_epoch)
    counts = _docs_per_partition_epoch(bootstrap, names.documents, corpus)
    assert counts.get((SCALED_PARTITION, 1), 0) > 0          # the attack had something to hit
    if private:
        # no draw for the refused sums: exactly one reservation per epoch, each committed
        recs = FileLedger(cfg.ledger).read()
        labels = [r.payload.get("label") for r in recs if r.kind == "reserve"]
        assert [x for x in labels if x.startswith("tree:epoch=")] == [
            f"tree:epoch={e}" for e in range(1, corpus.epochs + 1)]
        assert {r.key for r in recs if r.kind == "reserve"} == {r.key for r in recs if r.kind == "commit"}
        return                                 # n_docs is noised: the exact check is non-private
    for t in range(1, corpus.epochs + 1):
        kept = sum(n for (p, e), n in counts.items() if p != SCALED_PARTITION and e <= t)
        assert by_epoch[t][0].n_docs == kept, (t, by_epoch[t][0].n_docs, kept)


def _bad_records(cfg, honest: dict[int, object], other_prefix: str) -> list[tuple[str, bytes, dict, str]]:
    """(what, payload, meta, key) of each attack on partition 1's state key, built from the
    honest records: a huge next_offset and m1 ×100, so an accepted one would show."""
    key1 = state_key(cfg.topics.documents, 1)
    rec1 = honest[1]
    payload = rec1.payload
    meta = {**{k: v for k, v in rec1.meta.items() if k != "mac"}, "next_offset": 10**9}
    deployment_key = control.load_key(cfg)
    return [
        ("forged: no MAC", payload, meta, key1),
        ("forged: another key", payload,
         StateAuth(b"k" * 32, cfg.topic_prefix).sign(key1, payload, meta), key1),
        ("replayed from another deployment (same key file, other prefix)", payload,
         StateAuth(deployment_key, other_prefix).sign(key1, payload, meta), key1),
        ("replayed from partition 0", honest[0].payload, dict(honest[0].meta), key1),
    ]


@pytest.mark.slow
def test_forged_and_replayed_state_records_are_refused_and_a_clean_run_is_unaffected(
        kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(600, 1600, 2, seed=4)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=None)
    pipe, url = _start(cfg)
    total = len(corpus.texts)
    try:
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "close", through=1)     # the warm-up and epoch 1 only
        rel = pipe.release

        strategy = pipe.sketchers[0].strategy

        def quiet():
            """Epoch 1 released (the operator closed it), epoch 2 waiting for the flush, and
            the sketcher idle: every document and the epochs_closed notice
            checkpointed and accepted by the release service — no honest write can race the
            attacks below."""
            view = rel.partitions.view
            acc = {} if view is None else dict(view.accepted)
            epoch = -1 if rel.continual is None else rel.continual.epoch
            return (epoch >= 1 and sorted(acc) == [0, 1] and not strategy.dirty
                    and sum(int(r.meta["next_offset"]) for r in acc.values()) == total
                    and all(int(r.meta["closed_through"]) >= epoch for r in acc.values()) and acc)
        honest = wait_for(quiet, 90, "epoch 1 released and the sketcher idle", check=pipe.check)
        assert rel.continual.epoch < corpus.epochs        # the flush below releases the rest
        # the attacks: each becomes the newest record of partition 1 in turn
        store = StateStore(Producer({"bootstrap.servers": bootstrap}), bootstrap, names.state,
                           owns_producer=True)
        for n, (what, payload, meta, key) in enumerate(_bad_records(cfg, honest, "other.deployment"), 1):
            store.write(key, payload, meta=meta)
            wait_for(lambda: rel.partitions.unauthentic >= n, 30, f"refusal of {what}",
                     check=pipe.check)
            assert rel.partitions.view.accepted[1] is honest[1], what
        store.close()
        send_control(bootstrap, names, "flush", through=corpus.epochs)
        pipe.wait_released(corpus.epochs, timeout=120)
        samples = scrape_until(url, lambda m: metric(m, "streamdp_releases_total",
                                                     outcome="published") >= corpus.epochs,
                               15, "the release metrics of the last epoch")
    finally:
        pipe.stop()
    assert metric(samples, "streamdp_state_records_refused_total", reason="mac") == 4
    assert metric(samples, "streamdp_state_records_refused_total", reason="implausible") == 0
    # exactly the clean run: the engine on every document
    by_epoch = snapshots_by_epoch(bootstrap, names.snapshots)
    assert_one_snapshot_per_epoch(by_epoch)
    for eng in engine_snapshots(corpus, epsilon=None):
        svc = by_epoch[eng.epoch][0]
        assert svc.n_docs == eng.n_docs
        np.testing.assert_allclose(svc.topic_word, eng.topic_word, rtol=0, atol=1e-8)


@pytest.mark.slow
def test_sketchers_take_the_released_models_from_the_public_record_only(
        kafka_broker, tmp_path, state_reads):
    """The whole feed at once, refinement on (lag 2): the sketchers fold epochs 3 and 4 into
    the models of snapshots 1 and 2, read from the public release record — never from the
    release service's private state (its tree buffers and ledger head) — and the refinement
    sums are the estimator's (the same models, bit for bit up to the merge's rounding)."""
    from streamdp import EpochClock, StreamingSpectralLDA
    from streamdp.services import public_release
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(1500, 3000, 4, seed=6)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=None, refinement=True,
                      checkpoint_seconds=0.3)
    with Pipeline(cfg, sketchers=1) as pipe:
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "flush")
        snaps = [pipe.wait_released(e, timeout=180) for e in range(1, corpus.epochs + 1)]
        T = np.array(pipe.release.continual._exact.refine, copy=True)
        holds = pipe.sketchers[0].model_holds
    assert [s.stage for s in snaps] == ["spectral", "spectral", "refined", "refined"]
    assert holds >= 1                               # the sketcher waited for a public model
    sketcher_reads = {k for t, k in state_reads if t.startswith("sketcher-")}
    assert public_release.KEY in sketcher_reads
    private = control.RELEASE_STATE_KEY
    assert not [k for k in sketcher_reads if private.startswith(k)], sketcher_reads

    cb = corpus.counts()
    m = StreamingSpectralLDA(corpus.topics.shape[0], 1.0, epsilon=None, delta=1e-6, seed=0,
                             epochs=EpochClock(corpus.stream_start, corpus.epoch_seconds),
                             horizon=corpus.epochs, refinement=True)
    m.warmup(cb.counts[:corpus.n_warm])
    m.partial_fit(cb.counts[corpus.n_warm:], np.asarray(corpus.ts[corpus.n_warm:], dtype=np.float64))
    m.close_epochs(corpus.epoch_end(corpus.epochs))
    assert T.sum() > 0
    np.testing.assert_allclose(m.continual_._exact.refine, T, rtol=1e-9, atol=1e-9)


def test_a_sketcher_refuses_to_restore_an_unsigned_state_record(tmp_path, monkeypatch):
    """A restored record is signed again at the sketcher's next checkpoint, so restoring a
    forged one would launder it: the sketcher restores only records with a valid MAC and
    stops loudly on the newest one without (the real Sketcher over fake clients)."""
    from sketcher_harness import TOPIC, World
    from sketcher_harness import make_config as harness_config
    from sketcher_harness import make_sketcher
    from streamdp.services.state_auth import StateIntegrityError
    from streamdp.whitening.subspace import Subspace

    words = [f"w{i}" for i in range(20)]
    cfg = harness_config(tmp_path, words, 2)
    world = World(cfg, Subspace(np.linalg.qr(np.random.default_rng(0).standard_normal((20, 3)))[0]))
    sk = make_sketcher(world, monkeypatch)
    st = PartitionState(TOPIC, 0, next_offset=7)
    key = state_key(TOPIC, 0)
    auth = StateAuth(control.load_key(cfg), cfg.topic_prefix)
    world.store.write(key, st.to_bytes(), auth.sign(key, st.to_bytes(), st.meta()))
    assert sk.strategy.restore({0: 1}) == {0: 7}            # a signed record restores
    for what, meta in (("unsigned", st.meta()),
                       ("another key", StateAuth(b"x" * 32, cfg.topic_prefix).sign(
                           key, st.to_bytes(), st.meta())),
                       ("another deployment", StateAuth(control.load_key(cfg), "other").sign(
                           key, st.to_bytes(), st.meta()))):
        world.store.write(key, st.to_bytes(), meta)
        with pytest.raises(StateIntegrityError, match="no valid MAC"):
            sk.strategy.restore({0: 2})
