"""Issue 25 item 5: a sketcher whose control key differs from the release service's ignored
every control message with only a WARN line. Each ignored message is now counted
(streamdp_control_rejected_messages_total, alert StreamdpControlRejected), and a sketcher with
another key than the deployment's is refused at start (the signed contract record). Embedded
broker."""
from __future__ import annotations

import threading

import pytest
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


def _key_file(tmp_path, name: str, byte: bytes):
    path = tmp_path / f"{name}.key"
    path.write_bytes(byte * 32)
    return str(path)


def test_a_sketcher_with_another_key_is_refused_at_start(kafka_broker, tmp_path):
    """Issue 25 item 5, detection at start: the deployment's contract record carries a MAC
    under the key of the service that recorded it (here the release service); a sketcher
    holding another key is refused within seconds, before it consumes or writes anything,
    with a message naming control_key_file. The right key starts; so does the release
    service again. The other order (a wrong-key sketcher first) refuses the release service."""
    import time

    from streamdp.kafka.state_store import StateStore
    from streamdp.services.config import ConfigError
    from streamdp.services.contract import CONTRACT_KEY
    from streamdp.services.release import ReleaseService

    corpus = make_corpus(20, 0, 1, seed=5)
    names = fresh_topics(kafka_broker.bootstrap)
    right = make_config(tmp_path, kafka_broker.bootstrap, names, corpus, epsilon=None,
                        control_key_file=_key_file(tmp_path, "right", b"r"))
    from dataclasses import replace
    wrong = replace(right, control_key_file=_key_file(tmp_path, "wrong", b"w"))
    ReleaseService(right).close()                   # the first start records the contract
    with StateStore(None, kafka_broker.bootstrap, names.state) as store:
        n_state = len(store.read_all_latest())
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="control_key_file.*not the key"):
        Sketcher(wrong)
    assert time.monotonic() - t0 < 30
    with StateStore(None, kafka_broker.bootstrap, names.state) as store:
        assert len(store.read_all_latest()) == n_state        # it wrote nothing
        assert store.read_latest(CONTRACT_KEY).meta["recorded_by"] == "release service"
    Sketcher(right).close()
    ReleaseService(right).close()

    # a fresh deployment whose first service is the wrong-key sketcher: the release service
    # (the right key) is refused, naming the same field
    names2 = fresh_topics(kafka_broker.bootstrap)
    right2 = make_config(tmp_path / "2", kafka_broker.bootstrap, names2, corpus, epsilon=None,
                         control_key_file=right.control_key_file)
    Sketcher(replace(right2, control_key_file=wrong.control_key_file)).close()
    with pytest.raises(ConfigError, match="control_key_file.*not the key"):
        ReleaseService(right2)
