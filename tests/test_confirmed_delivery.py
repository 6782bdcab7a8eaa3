"""Issue 25: confirmed delivery of dead letters, on the embedded broker.

``producer.flush()`` returns 0 after a refused delivery too. With the DLQ topic gone, a
malformed document used to be logged and counted as dead-lettered, stored nowhere, and its
offset checkpointed past. Now every delivery report is checked: refused letters are
retried with bounded back-off, then the sketcher stops without checkpointing past them
(they are re-read after a restart) and ``streamdp_dlq_dropped_total`` counts them.
"""
from __future__ import annotations

import threading

from prometheus_client import generate_latest

from crash_helpers import read_states
from service_helpers import fresh_topics, make_config, make_corpus, read_topic, wait_for
from streamdp.services.processor import DeadLetterUndelivered
from streamdp.services.produce import produce
from streamdp.services.sketcher import Sketcher


def _metric(sk, name: str) -> float:
    for line in generate_latest(sk.metrics.registry).decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_dead_letter_kafka_refuses_stops_the_sketcher_before_its_checkpoint(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(300, 0, 1, seed=3)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=None)
    records = [corpus.record(i) for i in range(150)]
    records.append(("bad-1", float(corpus.ts[150]), b"\xc1 not msgpack"))
    records += [corpus.record(i) for i in range(150, 300)]
    produce(bootstrap, names.documents, records)

    sk = Sketcher(cfg)
    # a DLQ topic Kafka refuses (a deleted topic would do on a real Kafka without
    # auto-creation, or a missing write ACL; Tansu re-creates a deleted topic on produce)
    sk.processor.dlq_topic = "no such topic!"
    outcome: dict = {}

    def run():
        try:
            sk.run(max_seconds=20, install_signals=False)
        except BaseException as exc:     # noqa: BLE001 — the test inspects it
            outcome["exc"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_for(lambda: not t.is_alive(), 120, "the sketcher to stop")
    exc = outcome.get("exc")
    assert exc is not None, "the sketcher ran on after Kafka refused a dead letter"
    while exc is not None and not isinstance(exc, DeadLetterUndelivered):
        exc = exc.__context__ or exc.__cause__
    assert isinstance(exc, DeadLetterUndelivered), outcome["exc"]
    assert "no such topic!" in str(exc) and "re-read" in str(exc)
    assert sk.processor.dlq_lost is not None
    assert _metric(sk, "streamdp_dlq_dropped_total") >= 1
    assert _metric(sk, "streamdp_dlq_messages_total") >= 1
    # no checkpoint covers the refused letter's offset: a restart re-reads it
    docs = {r.key.decode(): r for r in read_topic(bootstrap, names.documents)}
    bad = docs["bad-1"]
    states = read_states(bootstrap, names, None)
    st = states.get(bad.partition)
    assert st is None or st.next_offset <= bad.offset, (st.next_offset, bad.offset)
