"""Issue 15 item 9: a running service that loses the broker stays alive and not ready, logs a
bounded number of lines, and becomes ready again when the broker returns."""
from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest

from streamdp.kafka.broker import EmbeddedBroker, free_port
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
    broker = EmbeddedBroker(port=port).start()
    names = TopicNames.from_prefix(f"outage.{uuid.uuid4().hex[:8]}")
    ensure_topics(broker.bootstrap, names, partitions=1)
    Vocabulary([f"w{i}" for i in range(30)]).save(tmp_path / "v.txt")
    cfg = ServiceConfig(bootstrap=broker.bootstrap, topic_prefix=names.documents.rsplit(".", 1)[0],
                        vocabulary=str(tmp_path / "v.txt"), n_topics=2, epsilon=1.0, sampler="fast",
                        ledger=str(tmp_path / "ledger.jsonl"), snapshot_dir=str(tmp_path / "s"),
                        poll_seconds=0.2, liveness_seconds=20.0, non_production=True)
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
        broker.stop()
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
        if role == "release":
            # Recovery of the release service needs its transactional writer to survive the
            # outage; the memory-only embedded broker comes back as a NEW cluster (new
            # ClusterId, no transactional state), which a real Kafka outage does not do.
            return
        # the broker comes back (memory-only: recreate the topics)
        broker = EmbeddedBroker(port=port).start()
        ensure_topics(broker.bootstrap, names, partitions=1)
        wait(lambda: svc.health.is_ready(), 60, "the service to be ready again")
        assert any("reachable again" in r.getMessage() for r in cap.records[n_before:])
        assert t.is_alive() and not errors, errors
    finally:
        root.removeHandler(cap)
        root.setLevel(old_level)
        svc.stop()
        t.join(30)
        broker.stop()
