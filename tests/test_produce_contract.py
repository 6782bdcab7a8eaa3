"""``streamdp produce`` checks the deployment contract before sending anything (issue 25 item 3
of the operations task; streamdp.services.contract.check_producer_arguments).

Before: a producer whose configuration said another stream_start, epoch length or tokenizer than
the deployment's sent its documents anyway (the services then dropped or routed them by their own
contract, silently for the producer). Now every contract field the producer was given is compared
with the recorded contract and a difference refuses the run, naming the field and both values,
with nothing on the documents topic. A producer given only bootstrap and topic_prefix is not
compared.
"""
from __future__ import annotations

import json

import pytest

from streamdp.services.contract import contract_of, record_contract

from service_helpers import fresh_topics, make_config, make_corpus, read_topic
from test_first_run import run_cli


@pytest.fixture
def deployment(kafka_broker, tmp_path):
    """Topics and a recorded contract (as the first service of a deployment records it)."""
    bootstrap = kafka_broker.bootstrap
    names = fresh_topics(bootstrap)
    corpus = make_corpus(5, 5, 1)
    cfg = make_config(tmp_path / "svc", bootstrap, names, corpus)
    store = cfg.state_store()
    try:
        record_contract(cfg, store, contract_of(cfg), role="release service")
    finally:
        store.close()
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in corpus.records()))
    return bootstrap, names, cfg, path


def _config_file(tmp_path, cfg, **changes) -> str:
    values = {"bootstrap": cfg.bootstrap, "topic_prefix": cfg.topic_prefix,
              "stream_start": cfg.stream_start, "epoch_seconds": cfg.epoch_seconds,
              "vocabulary": cfg.vocabulary, "vocabulary_public_by_assumption": True,
              "n_topics": cfg.n_topics, "non_production": True, **changes}
    p = tmp_path / f"produce-{len(changes)}-{sorted(changes)}.json".replace(" ", "")
    p.write_text(json.dumps(values))
    return str(p)


@pytest.mark.parametrize("field, value, shown", [
    ("stream_start", "+3600", None),
    ("epoch_seconds", 1800.0, "1800"),
    ("tokenizer", {"lowercase": False}, "lowercase"),
    ("max_document_bytes", 4096, "4096"),
])
def test_produce_refuses_a_configuration_that_disagrees_with_the_contract(
        deployment, tmp_path, field, value, shown):
    bootstrap, names, cfg, path = deployment
    if value == "+3600":
        value = cfg.stream_start + 3600
        shown = repr(value)[:8]
    r = run_cli("produce", "--config", _config_file(tmp_path, cfg, **{field: value}), str(path))
    assert r.returncode == 2, (r.stdout[-1000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"configuration field {field!r}: the deployment recorded" in r.stderr, r.stderr
    assert shown in r.stderr and "Nothing was sent" in r.stderr
    assert read_topic(bootstrap, names.documents, timeout=5) == []


def test_produce_with_the_deployments_configuration_or_only_its_address_sends(deployment, tmp_path):
    bootstrap, names, cfg, path = deployment
    r = run_cli("produce", "--config", _config_file(tmp_path, cfg), str(path))
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("produce", "--bootstrap", bootstrap, "--topic-prefix", cfg.topic_prefix, str(path))
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(read_topic(bootstrap, names.documents)) == 20
