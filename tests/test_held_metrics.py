"""Metrics of the ends of releases, on the embedded broker, scraped over HTTP.

* ``streamdp_partitions_paused{reason}`` / ``streamdp_partition_held_seconds``: a sketcher's
  partitions held for the subspace, then for the refinement model of their epoch, then resumed
  when that model is released (the alert StreamdpReleasesEndedPartitionsHeld reads them).
* ``streamdp_releases_ended{reason="budget"}``: a release service whose budget runs out before
  the tree horizon says so (metric, log line) and publishes nothing more.
"""
from __future__ import annotations

import logging
import threading
import time


from streamdp.observability import PAUSE_REASONS
from streamdp.privacy.accountant import Accountant
from streamdp.privacy.events import GaussianEvent
from streamdp.services.produce import produce
from streamdp.snapshot import TopicSnapshot

from service_helpers import (Pipeline, fresh_topics, make_config, make_corpus, metric, metric_by,
                             read_topic, scrape, scrape_until, send_control, wait_for)

PAUSED, HELD = "streamdp_partitions_paused", "streamdp_partition_held_seconds"


def _paused(samples) -> dict[str, float]:
    return metric_by(samples, PAUSED, "reason")


def _step_until(release, pred, timeout: float, what: str) -> None:
    """Drive the release service by hand (no thread) until ``pred()``."""
    def stepped():
        release.step()
        return pred()
    wait_for(stepped, timeout, what, interval=0.2)


def test_a_partition_held_for_its_model_is_in_the_metrics_until_the_release(kafka_broker, tmp_path):
    """Refinement with L = 2: the documents of epoch 3 need the snapshot of epoch 1. Everything
    is produced at once; the release service is stepped by hand, so each hold lasts until the
    test lets the release happen: before the warm-up release both partitions are held for the
    subspace, after it for the model (epochs 1, 2 sketched, the first epoch-3 record reached),
    and the release of epoch 1 resumes them (the gauge drops to 0, the hold age too)."""
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(1500, 3000, 3, seed=21)
    names = fresh_topics(bootstrap)            # 2 partitions
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=4.0, sampler="fast",
                      noise_seed=5, refinement=True)
    assert cfg.refinement_model_lag == 2
    pipe = Pipeline(cfg, sketchers=1)          # the release service exists before producing
    sk, release = pipe.sketchers[0], pipe.release
    thread = threading.Thread(target=pipe._target(sk.run), daemon=True, name=sk.instance)
    pipe.threads.append(thread)
    thread.start()
    try:
        wait_for(lambda: sk.server is not None, 10, "the sketcher's metrics server", check=pipe.check)
        url = sk.server.url
        s = scrape(url)
        assert set(_paused(s)) == set(PAUSE_REASONS)
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "flush", through=corpus.epochs)

        # --- no subspace yet: both partitions held at their first stream document
        s = scrape_until(url, lambda s: _paused(s)["subspace"] == 2, 60, "held for the subspace")
        assert _paused(s) == {"vocabulary": 0, "subspace": 2, "model": 0,
                              "restoring": 0}
        assert sk.paused == {0: "subspace", 1: "subspace"}

        # --- the warm-up release only: the sketcher reads the subspace, sketches epochs 1, 2
        # and holds each partition at its first epoch-3 document (its model: snapshot 1)
        before_warmup = time.time()
        _step_until(release, lambda: release.subspace is not None, 60, "the warm-up release")
        assert release.continual.epoch == 0
        s = scrape_until(url, lambda s: _paused(s)["model"] == 2, 60, "held for the model")
        assert _paused(s) == {"vocabulary": 0, "subspace": 0, "model": 2,
                              "restoring": 0}
        assert sk.paused == {0: "model", 1: "model"}
        assert {m for m, _ in sk.strategy.held_for.values()} == {1}
        time.sleep(1.2)
        s = scrape(url)
        assert _paused(s)["model"] == 2                 # still held: nothing was released
        # the age of the model hold, not of the earlier subspace hold of the same partitions
        assert 1.0 <= metric(s, HELD) <= time.time() - before_warmup

        # --- release epoch 1: both partitions resume, the gauge and the hold age drop to 0
        _step_until(release, lambda: release.continual.epoch >= 1, 90, "the release of epoch 1")
        s = scrape_until(url, lambda s: _paused(s)["model"] == 0, 60, "resumed after the release")
        assert _paused(s) == {"vocabulary": 0, "subspace": 0, "model": 0,
                              "restoring": 0}
        assert metric(s, HELD) == 0 and not sk.paused
    finally:
        try:
            pipe.stop()
        finally:
            release.close()


def test_budget_running_out_before_the_horizon_ends_releases_with_reason_budget(
        kafka_broker, tmp_path, caplog):
    """A tree of horizon 2 (each epoch's documents: two nodes at ρ/2) on a ledger that already
    spent 0.6 ρ on the documents of epoch 2: epoch 1 is published, epoch 2 is refused
    (BudgetExhausted), before the horizon. streamdp_releases_ended{reason="budget"} is 1 (the
    others 0), the log says 'releases have ended (budget)' once, and nothing more is published
    after a further flush."""
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(2000, 2000, 2, seed=4)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=1.0, horizon=2,
                      continual_aggregator="tree", sampler="fast", noise_seed=None,
                      non_production=True)
    acc = Accountant(cfg.epsilon, cfg.delta, cfg.ledger)   # a fresh deployment's ledger ...
    B = acc.rho_budget
    sigma = (1.0 / (2 * 0.6 * B)) ** 0.5                   # rho = 1 / (2 sigma^2) = 0.6 B
    spent = acc.reserve([GaussianEvent("earlier", 1.0, sigma, partition="stream:epochs=2-2")],
                        label="spent before this deployment's releases")
    acc.commit(spent)                                      # ... that already spent 0.6 ρ on epoch 2
    caplog.set_level(logging.INFO, logger="streamdp.release")
    with Pipeline(cfg, sketchers=2) as pipe:
        release = pipe.release
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "flush", through=corpus.epochs)
        pipe.wait_released(1)
        wait_for(lambda: release.releases_ended is not None, 90, "the end of releases",
                 check=pipe.check)
        wait_for(lambda: release.server is not None, 10, "the release metrics server")
        s = scrape(release.server.url)
        assert metric_by(s, "streamdp_releases_ended", "reason") == {
            "budget": 1, "horizon": 0, "other": 0}
        assert metric(s, "streamdp_releases_total", outcome="refused_budget") == 1
        assert metric(s, "streamdp_releases_total", outcome="published") == 1
        assert metric(s, "streamdp_tree_epoch") == 1            # before the horizon (2)
        send_control(bootstrap, names, "flush", through=corpus.epochs)                 # asked again: nothing more
        time.sleep(3 * cfg.poll_seconds + 1)
        assert release.continual.epoch == 1 and release.releases_ended == "budget"
        assert release.exhausted                                # the accountant's refusal
    ended = [r.getMessage() for r in caplog.records if "releases have ended" in r.getMessage()]
    assert len(ended) == 1 and ended[0].startswith("releases have ended (budget): "), ended
    published = [TopicSnapshot.from_bytes(r.value) for r in read_topic(bootstrap, names.snapshots)]
    assert sorted({p.epoch for p in published if p.epoch}) == [1]   # epoch 2 never published
    rep = Accountant(cfg.epsilon, cfg.delta, cfg.ledger).report()
    assert rep["refusals"] == 1 and rep["rho_worst_case"] <= B * (1 + 1e-9)
