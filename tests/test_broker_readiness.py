"""Issue 25: readiness reflects the broker. With the embedded broker SIGSTOPped (frozen: no
client error, consumers just see nothing), the release service and a sketcher become not
ready within their bound (readiness_broker_seconds), and ready again once it resumes."""
from __future__ import annotations

import json
import os
import signal
import threading

from service_helpers import fresh_topics, http_get, make_config, make_corpus, wait_for
from streamdp.services.release import ReleaseService
from streamdp.services.sketcher import Sketcher


def _ready(svc) -> tuple[int, str]:
    if svc.server is None:
        return 0, ""
    try:
        status, body = http_get(svc.server.url + "/readyz", timeout=2)
    except OSError:
        return 0, ""
    return status, json.loads(body or b"{}").get("reason", "")


def test_a_frozen_broker_makes_the_services_not_ready_then_ready_again(kafka_broker, tmp_path):
    assert kafka_broker.pid is not None
    corpus = make_corpus(20, 0, 1, seed=4)
    names = fresh_topics(kafka_broker.bootstrap)
    cfg = make_config(tmp_path, kafka_broker.bootstrap, names, corpus, epsilon=None,
                      readiness_broker_seconds=2.0)
    services = [ReleaseService(cfg), Sketcher(cfg)]
    threads = [threading.Thread(target=s.run, kwargs=dict(max_seconds=180, install_signals=False),
                                daemon=True) for s in services]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: all(_ready(s)[0] == 200 for s in services), 60, "both services ready")
        os.kill(kafka_broker.pid, signal.SIGSTOP)
        try:
            # bound 2 s, probed every 1 s: not ready well within 15 s (no tight timing)
            wait_for(lambda: all(_ready(s)[0] == 503 for s in services), 15,
                     "both services not ready while the broker is frozen")
            assert all("broker" in _ready(s)[1] for s in services), [_ready(s) for s in services]
        finally:
            os.kill(kafka_broker.pid, signal.SIGCONT)
        wait_for(lambda: all(_ready(s)[0] == 200 for s in services), 60,
                 "both services ready again after the broker resumed")
    finally:
        for s in services:
            s.stop()
        for t in threads:
            t.join(60)
