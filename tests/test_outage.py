"""Issue 15 item 9: a running service that loses the broker stays alive and not ready, logs a
bounded number of lines, and becomes ready again when the broker returns."""
from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest

from streamdp.kafka.broker import EmbeddedBroker, free_port
from tcp_proxy import TcpProxy
from streamdp.kafka.topics import TopicNames, ensure_topics
from streamdp.services.config import ServiceConfig
from streamdp.text.vocabulary import Vocabulary


def wait(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.parametrize("role", ["sketcher", "release"])
def test_service_rides_out_a_broker_outage(tmp_path, role):
    from streamdp.services.release import ReleaseService
    from streamdp.services.sketcher import Sketcher
    port = free_port()
    proxy = None
    if role == "release":
        # The release service's transactional writer must survive the outage, so the
        # broker (and its transactional state) stays up and the network goes down: the
        # broker advertises a forwarder's port, which the test cuts and restores.
        proxy = TcpProxy(free_port(), port).start()
        broker = EmbeddedBroker(port=port, advertised_port=proxy.listen_port).start()
    else:
        broker = EmbeddedBroker(port=port).start()
    names = TopicNames.from_prefix(f"outage.{uuid.uuid4().hex[:8]}")
    ensure_topics(broker.bootstrap, names, partitions=1)
    Vocabulary([f"w{i}" for i in range(30)]).save(tmp_path / "v.txt")
    cfg = ServiceConfig(bootstrap=broker.bootstrap, topic_prefix=names.documents.rsplit(".", 1)[0],
                        vocabulary=str(tmp_path / "v.txt"), vocabulary_public_by_assumption=True,
                        n_topics=2, epsilon=1.0, sampler="fast",
                        ledger=str(tmp_path / "ledger.jsonl"), snapshot_dir=str(tmp_path / "s"),
                        poll_seconds=0.2, liveness_seconds=20.0, non_production=True,
                        confirm_backfill=True)   # stream_start 0: nothing is ever produced
    cap = Capture()
    root = logging.getLogger()
    root.addHandler(cap)
    old_level = root.level
    root.setLevel(logging.INFO)
    svc = ReleaseService(cfg) if role == "release" else Sketcher(cfg)
    svc.store.read_timeout = 3.0           # a state read gives up quickly: the guard takes over
    svc.store.flush_timeout = 3.0
    errors = []

    def run():
        try:
            svc.run(install_signals=False)
        except BaseException as exc:       # noqa: BLE001
            errors.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        wait(lambda: svc.health.is_ready(), 30, f"the {role} to be ready")
        n_before = len(cap.records)
        epoch_before = getattr(svc, "writer_epoch", None)
        if proxy is not None:
            proxy.cut()
        else:
            broker.stop()
        if proxy is not None:
            proxy.close()
        wait(lambda: "Kafka unreachable" in svc.health.readiness()[1]["reason"] or errors, 30,
             "the service to go not ready")
        assert not errors, errors
        assert "Kafka unreachable" in svc.health.readiness()[1]["reason"]
        time.sleep(12)                      # an outage of a while: many reconnect attempts
        assert t.is_alive() and not errors, errors
        assert svc.health.is_live()         # liveness keeps beating during back-off
        assert not svc.health.is_ready()
        during = cap.records[n_before:]
        assert len(during) < 40, [r.getMessage()[:120] for r in during]
        starts = [r for r in during if "Kafka unreachable" in r.getMessage()]
        assert len(starts) == 1, [r.getMessage()[:160] for r in during]
        if proxy is not None:
            proxy.restore()                 # the network comes back; the broker never left
        else:
            # the broker comes back (memory-only: a new cluster, recreate the topics)
            broker = EmbeddedBroker(port=port).start()
            ensure_topics(broker.bootstrap, names, partitions=1)
        wait(lambda: svc.health.is_ready(), 60, "the service to be ready again")
        assert any("reachable again" in r.getMessage() for r in cap.records[n_before:])
        assert t.is_alive() and not errors, errors
        if role == "release":
            # the transactional writer is usable again, under a writer epoch that never
            # went backwards (and no other writer got in)
            svc.store.write("release/outage-probe", b"after the outage", meta={})
            assert svc.fenced is None and svc.writer_epoch >= epoch_before
            rec = svc.store.read_latest("release/writer")
            assert int(rec.meta["writer_epoch"]) == svc.writer_epoch
    finally:
        root.removeHandler(cap)
        root.setLevel(old_level)
        svc.stop()
        t.join(30)
        broker.stop()
        if proxy is not None:
            proxy.close()


@pytest.mark.slow
def test_release_after_an_outage_is_published_without_overspend(tmp_path):
    """The whole pipeline behind a forwarder: the network to the broker goes down after the
    warm-up release and comes back; the release service recovers with its transactional
    writer (same transactional.id, writer epoch unchanged), the stream is released, and
    the ledger holds exactly one committed reservation per release within ε."""
    from service_helpers import Pipeline, make_config, make_corpus, send_control, wait_for
    from streamdp.privacy.accountant import Accountant
    from streamdp.privacy.ledger import FileLedger
    from streamdp.services.produce import produce

    port = free_port()
    proxy = TcpProxy(free_port(), port).start()
    broker = EmbeddedBroker(port=port, advertised_port=proxy.listen_port).start()
    try:
        names = TopicNames.from_prefix(f"outage.{uuid.uuid4().hex[:8]}")
        ensure_topics(broker.bootstrap, names, partitions=1)
        corpus = make_corpus(400, 600, 2, seed=5)
        cfg = make_config(tmp_path, broker.bootstrap, names, corpus, epsilon=1.0)
        pipe = Pipeline(cfg, sketchers=1)
        for store in [pipe.release.store] + [s.store for s in pipe.sketchers]:
            store.read_timeout = store.flush_timeout = 3.0
        pipe.start()
        rel = pipe.release
        try:
            produce(broker.bootstrap, names.documents,
                    [corpus.record(i) for i in range(corpus.n_warm)])
            send_control(broker.bootstrap, names, "close", through=0)
            wait_for(lambda: rel.subspace is not None, 90, "the warm-up release", check=pipe.check)
            epoch_before = rel.writer_epoch

            proxy.cut()
            wait(lambda: not rel.health.is_ready(), 30, "the release service to go not ready")
            time.sleep(8)
            pipe.check()
            proxy.restore()
            wait(lambda: rel.health.is_ready(), 60, "the release service to be ready again")

            produce(broker.bootstrap, names.documents,
                    [corpus.record(i) for i in range(corpus.n_warm, len(corpus.texts))])
            send_control(broker.bootstrap, names, "flush", through=corpus.epochs)     # the last epoch is still open
            snap = pipe.wait_released(2, timeout=120)
            assert snap.epoch == 2 and rel.fenced is None
            assert rel.writer_epoch == epoch_before          # the same writer, never re-registered
            assert int(rel.store.read_latest("release/writer").meta["writer_epoch"]) == epoch_before
        finally:
            pipe.stop()
        rep = Accountant(cfg.epsilon, cfg.delta, cfg.ledger).report()
        keys = sorted({r.key for r in FileLedger(cfg.ledger).read() if r.kind == "reserve"})
        # each release and its noised premise check (issue 23 item 2: warm-up and epochs)
        premise = ["warmup-premise", "tree:premise:epoch=1", "tree:premise:epoch=2"]
        assert keys == sorted(["warmup-clip-histogram", "warmup", "tree:epoch=1", "tree:epoch=2"]
                              + premise) \
            or keys == sorted(["warmup", "tree:epoch=1", "tree:epoch=2"] + premise), keys
        assert rep["uncommitted"] == 0 and rep["refusals"] == 0
        assert rep["epsilon_worst_case"] <= cfg.epsilon * (1 + 1e-9)
    finally:
        proxy.close()
        broker.stop()
