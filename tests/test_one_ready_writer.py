"""Never two ready release writers (issue 23 item 9).

A second release service with its own ledger, started on a running deployment, takes over the
Kafka fence. Before the fix both answered ready on /readyz for ~10 s. Now the fenced one stops
answering ready at once and exits, and the new one is ready only after the old one's readiness
has lapsed (streamdp.services.release_writer.WriterWatch). Both /readyz are scraped over HTTP.
"""
from __future__ import annotations

import threading
import time

from service_helpers import fresh_topics, http_get, make_config, make_corpus, wait_for
from streamdp.services.release_writer import WRITER_TAKEOVER_SECONDS


def _ready(svc) -> bool | None:
    """/readyz over HTTP: True (200), False (503), None (no server: the service has exited)."""
    if svc.server is None:
        return None
    try:
        status, _ = http_get(svc.server.url.rstrip("/") + "/readyz", timeout=2.0)
    except OSError:
        return None
    return status == 200


def test_a_second_release_service_never_leaves_two_ready_writers(kafka_broker, tmp_path):
    from streamdp.services.release import ReleaseService

    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(10, 10, 1, seed=5)
    names = fresh_topics(bootstrap)
    cfgs = [make_config(tmp_path / n, bootstrap, names, corpus, epsilon=1.0, noise_seed=None,
                        non_production=True, metrics_port=0) for n in ("a", "b")]
    first = ReleaseService(cfgs[0])
    threads, second = [], None

    def run(svc):
        t = threading.Thread(target=lambda: svc.run(install_signals=False, max_seconds=120),
                             daemon=True)
        t.start()
        threads.append(t)
        return t

    try:
        t_first = run(first)
        wait_for(lambda: _ready(first), 60, "the first release service to be ready")
        second = ReleaseService(cfgs[1])          # its own ledger: takes over the fence
        taken_over = time.monotonic()
        run(second)
        samples = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            a, b = _ready(first), _ready(second)
            samples.append((round(time.monotonic() - taken_over, 2), a, b))
            if b and not t_first.is_alive() and len([s for s in samples if s[2]]) >= 10:
                break
            time.sleep(0.05)
        assert not [s for s in samples if s[1] and s[2]], f"two ready writers: {samples}"
        assert any(s[2] for s in samples), f"the new writer never became ready: {samples[-5:]}"
        # the fenced service stopped answering ready at once and exited
        first_ready = [s[0] for s in samples if s[1]]
        assert not first_ready or max(first_ready) < WRITER_TAKEOVER_SECONDS, samples
        t_first.join(30)
        assert not t_first.is_alive(), "the fenced release service did not exit"
        assert first.fenced and "took over" in first.fenced
        assert second.fenced is None and _ready(second)
    finally:
        first.stop()
        if second is not None:
            second.stop()
        for t in threads:
            t.join(30)
