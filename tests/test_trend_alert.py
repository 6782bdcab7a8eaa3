"""The share-change alert in the services (issue 27 item 2), on the embedded broker.

A feed in which topic 0's share doubles from epoch 11 (extra documents drawn from topic 0 alone
join the stream in epochs 11 and 12): the release service's /metrics (a real HTTP scrape) counts a
significant change of that topic at epoch 11's release and none before, the gauges carry the
share and its interval, and the alert rule StreamdpTopicShareChange (k8s/monitoring) is an
increase of that counter. The test starts once both epochs' models sum 5 refined epochs
(streamdp.trends.MIN_MODEL_EPOCHS; at lag 2 the first test is epoch 10's, 9 → 10).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from streamdp.refinement import topic_order

from service_helpers import (Pipeline, fresh_topics, make_config, make_corpus, metric, scrape,
                             scrape_until, wait_for)
from test_service_refinement import produce_epoch

EPOCHS, CHANGE_AT, PER_EPOCH = 12, 11, 3000
CHANGES = "streamdp_topic_share_changes_total"


def doubled_feed(seed: int = 5):
    """The demo corpus, plus in epochs ≥ CHANGE_AT documents of topic 0 alone, as many as
    make its share double (s → 2s needs s/(1 − 2s) more documents per document of the epoch)."""
    c = make_corpus(6000, EPOCHS * PER_EPOCH, EPOCHS, seed=seed)
    rng = np.random.default_rng(seed + 1)
    s = 1.0 / c.topics.shape[0]
    extra_n = int(round(PER_EPOCH * (EPOCHS - CHANGE_AT + 1) * s / (1 - 2 * s)))
    lengths = rng.poisson(40, size=extra_n) + 3
    words = np.array(c.words)
    extra = [" ".join(words[rng.choice(len(words), size=n, p=c.topics[0])]) for n in lengths]
    start = c.epoch_end(CHANGE_AT - 1)
    ts = start + rng.random(extra_n) * (c.epoch_end(EPOCHS) - start)
    order = np.argsort(np.concatenate([c.ts, ts]), kind="stable")
    texts = list(c.texts) + extra
    return replace(c, texts=[texts[i] for i in order], ts=np.concatenate([c.ts, ts])[order],
                   n_stream=c.n_stream + extra_n)


@pytest.mark.slow
def test_a_doubled_topic_fires_the_share_change_counter_at_its_epoch(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap
    corpus = doubled_feed()
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=4.0, sampler="fast",
                      noise_seed=5, refinement=True)
    assert cfg.refinement_model_lag == 2
    counts = {}
    with Pipeline(cfg, sketchers=2) as pipe:
        wait_for(lambda: pipe.release.server is not None, 10, "the release metrics server")
        url = pipe.release.server.url
        snaps = []
        for e in range(1, EPOCHS + 1):
            produce_epoch(bootstrap, names, corpus, e)
            snaps.append(pipe.wait_released(e, timeout=120))
            samples = scrape_until(url, lambda m: metric(m, "streamdp_tree_epoch") >= e, 30,
                                   f"metrics of epoch {e}")
            counts[e] = {t: metric(samples, CHANGES, topic=t) for t in range(corpus.topics.shape[0])}
        final = scrape(url)
    topic = int(topic_order(snaps[-1].topic_word, corpus.topics)[0])   # true topic 0's index
    fired = {e: [t for t, v in c.items() if v - counts.get(e - 1, {}).get(t, 0.0) > 0]
             for e, c in counts.items()}
    assert all(not fired[e] for e in range(1, CHANGE_AT)), fired       # nothing before e
    assert topic in fired[CHANGE_AT], fired                             # the alert fires at e
    # the gauges: the latest share of each topic inside its interval, the doubled one high
    share = {int(lab["topic"]): v for lab, v in final["streamdp_topic_share"]}
    lower = {int(lab["topic"]): v for lab, v in final["streamdp_topic_share_lower"]}
    upper = {int(lab["topic"]): v for lab, v in final["streamdp_topic_share_upper"]}
    assert sorted(share) == list(range(corpus.topics.shape[0]))        # one series per topic
    assert all(lower[t] <= share[t] <= upper[t] for t in share)
    assert share[topic] > 0.25, share


def test_the_alert_rule_is_an_increase_of_the_counter():
    rules = yaml.safe_load((Path(__file__).resolve().parents[1] / "k8s" / "monitoring"
                            / "prometheus-rules.yaml").read_text())
    found = [r for g in rules["spec"]["groups"] for r in g["rules"]
             if r.get("alert") == "StreamdpTopicShareChange"]
    assert len(found) == 1
    assert f"increase({CHANGES}[" in found[0]["expr"] and found[0]["expr"].rstrip().endswith("> 0")
    assert "topic" in found[0]["expr"]          # one alert per topic
