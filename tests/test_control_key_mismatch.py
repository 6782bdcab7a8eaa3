"""Issue 25 item 5: a sketcher whose control key differs from the release service's ignored
every control message with only a WARN line. Each ignored message is now counted
(streamdp_control_rejected_messages_total, alert StreamdpControlRejected). Embedded broker."""
from __future__ import annotations

import threading

from confluent_kafka import Producer
from prometheus_client import generate_latest

from service_helpers import fresh_topics, make_config, make_corpus, wait_for
from streamdp.kafka.topics import client_config
from streamdp.services import control
from streamdp.services.sketcher import Sketcher


def _rejected(sk) -> float:
    for line in generate_latest(sk.metrics.registry).decode().splitlines():
        if line.startswith("streamdp_control_rejected_messages_total "):
            return float(line.split()[1])
    return 0.0


def test_control_messages_under_another_key_are_counted(kafka_broker, tmp_path):
    corpus = make_corpus(20, 0, 1, seed=5)
    names = fresh_topics(kafka_broker.bootstrap)
    cfg = make_config(tmp_path, kafka_broker.bootstrap, names, corpus, epsilon=None)
    sk = Sketcher(cfg)
    t = threading.Thread(target=sk.run, kwargs=dict(max_seconds=60, install_signals=False), daemon=True)
    t.start()
    try:
        p = Producer(client_config(kafka_broker.bootstrap, "producer"))
        for _ in range(3):      # a release service holding another key
            p.produce(names.control, value=control.encode("epochs_closed", key=b"another key " * 4,
                                                          through=0))
        assert p.flush(10) == 0
        wait_for(lambda: _rejected(sk) >= 3, 30, "the sketcher to count 3 rejected control messages")
    finally:
        sk.stop()
        t.join(60)
