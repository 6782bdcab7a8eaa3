"""Issue 15 items 3, 4, 9: non-private only in so many words, reproducible noise only behind a
loud flag, a wrong bootstrap fails fast. Each test is an attack an operator could make."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from streamdp.privacy.noise import (CSPRNG_NAME, SEEDED_NAME, InsecureNoiseWarning,
                                    make_sampler)
from streamdp.services.config import ConfigError, ServiceConfig, from_file, from_mapping
from streamdp.kafka.broker import free_port  # nothing listens there: a closed port


def run_cli(*args, env=None, timeout=120):
    import os
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "streamdp", *args], capture_output=True,
                          text=True, timeout=timeout, env=e)



# ------------------------------------------------------------------ item 3: non-private
def test_blank_epsilon_env_var_is_refused_not_run_non_private(tmp_path):
    """The attack: STREAMDP_EPSILON="" used to override "epsilon": 1.0 and run non-private."""
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"epsilon": 1.0}))
    with pytest.raises(ConfigError, match="STREAMDP_EPSILON") as e:
        from_file(cfg, env={"STREAMDP_EPSILON": ""})
    assert "blank" in str(e.value) and "non_private" in str(e.value).replace("NON_PRIVATE", "non_private")
    with pytest.raises(ConfigError, match="STREAMDP_EPSILON"):
        from_file(cfg, env={"STREAMDP_EPSILON": "   "})
    with pytest.raises(ConfigError, match="STREAMDP_EPSILON"):
        from_file(cfg, env={"STREAMDP_EPSILON": "one"})
    # null alone is not "non-private in so many words" either
    with pytest.raises(ConfigError, match="'epsilon'.*non_private: true"):
        from_file(cfg, env={"STREAMDP_EPSILON": "null"})
    # the file's value stands when the variable is unset
    assert from_file(cfg, env={}).epsilon == 1.0


def test_blank_epsilon_env_var_fails_the_cli_before_any_ledger(tmp_path):
    cfg = tmp_path / "c.json"
    ledger = tmp_path / "ledger.jsonl"
    cfg.write_text(json.dumps({"epsilon": 1.0, "ledger": str(ledger),
                               "bootstrap": f"127.0.0.1:{free_port()}"}))
    r = run_cli("release", "--config", str(cfg), env={"STREAMDP_EPSILON": ""})
    assert r.returncode == 2, r.stderr
    assert "STREAMDP_EPSILON" in r.stderr and "blank" in r.stderr
    assert not ledger.exists()


@pytest.mark.parametrize("values, field", [
    ({"epsilon": ""}, "'epsilon'"),
    ({"epsilon": "1.0"}, "'epsilon'"),
    ({"epsilon": None}, "'epsilon'"),
    ({"epsilon": True}, "'epsilon'"),
    ({"epsilon": 1.0, "non_private": True}, "'non_private'"),
    ({"non_private": "yes"}, "'non_private'"),
])
def test_blank_unparsable_or_ambiguous_epsilon_in_the_file_is_an_error(values, field):
    with pytest.raises(ConfigError) as e:
        from_mapping(values, env={})
    assert field in str(e.value)


def test_non_private_must_be_asked_for_and_is_marked():
    cfg = from_mapping({"non_private": True}, env={})
    assert not cfg.private and cfg.epsilon is None
    f = cfg.privacy_fields()
    assert f["non_private"] is True and f["private"] is False
    assert "NON-PRIVATE" in f["privacy_mode"] and "NO privacy guarantee" in f["privacy_mode"]
    cfg = from_mapping({}, env={"STREAMDP_NON_PRIVATE": "true", "STREAMDP_EPSILON": "null"})
    assert not cfg.private
    with pytest.raises(ConfigError, match="non_private"):
        from_mapping({"epsilon": 1.0}, env={"STREAMDP_NON_PRIVATE": "true"})
    with pytest.raises(ConfigError, match="STREAMDP_NON_PRIVATE"):
        from_mapping({}, env={"STREAMDP_NON_PRIVATE": "maybe"})
    with pytest.raises(ConfigError, match="'epsilon'"):
        ServiceConfig(epsilon=None)
    p = ServiceConfig().privacy_fields()
    assert p["private"] is True and p["privacy_mode"] == "private"


def test_cli_non_private_flag_conflicts_with_epsilon(tmp_path):
    from streamdp.cli import build_parser
    from streamdp.cli.common import config_from_args as _config
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"epsilon": 1.0}))
    a = build_parser().parse_args(["release", "--config", str(cfg), "--non-private"])
    c = _config(a)
    assert c.non_private and c.epsilon is None
    a = build_parser().parse_args(["release", "--config", str(cfg), "--non-private", "--epsilon", "2"])
    with pytest.raises(ConfigError, match="--non-private"):
        _config(a)


# ------------------------------------------------------------------ item 4: reproducible noise
@pytest.mark.parametrize("extra", [
    {},
    {"insecure_reproducible_noise": True},
    {"non_production": True},
])
def test_private_deployments_with_noise_seed_are_refused(extra):
    """Two deployments with the same noise_seed used to draw bit-identical noise."""
    for seed in (7, 7):
        with pytest.raises(ConfigError, match="noise_seed"):
            from_mapping({"epsilon": 1.0, "sampler": "fast", "noise_seed": seed, **extra}, env={})
    with pytest.raises(ConfigError, match="noise_seed"):
        from_mapping({"epsilon": 1.0}, env={"STREAMDP_NOISE_SEED": "7"})


def test_noise_seed_only_behind_both_loud_flags_and_named_insecure():
    cfg = from_mapping({"epsilon": 1.0, "noise_seed": 7, "insecure_reproducible_noise": True,
                        "non_production": True}, env={})
    f = cfg.privacy_fields()
    assert f["insecure_reproducible_noise"] is True and "INSECURE" in f["privacy_mode"]
    with pytest.raises(ConfigError, match="insecure_reproducible_noise"):
        from_mapping({"epsilon": 1.0, "insecure_reproducible_noise": True}, env={})


def test_sampler_names_differ_and_seeded_noise_warns():
    fast = make_sampler("fast")
    with pytest.warns(InsecureNoiseWarning):
        seeded = make_sampler("fast", seed=3)
    assert fast.name == CSPRNG_NAME
    assert seeded.name == SEEDED_NAME and "INSECURE" in seeded.name and "seeded" in seeded.name
    assert fast.name != seeded.name
    assert not fast.reproducible and seeded.reproducible
    with pytest.warns(InsecureNoiseWarning):
        again = make_sampler("opendp", seed=3)
    assert np.array_equal(seeded.sample(1.0, 5), again.sample(1.0, 5))    # what "INSECURE" means


def test_estimator_noise_seed_still_works_and_its_report_says_insecure():
    from streamdp import StreamingSpectralLDA
    from streamdp.synthetic import make_lda_model, sample_documents
    model = make_lda_model(60, 3, alpha0=1.0, beta=0.1, seed=0)
    X = sample_documents(model, 3000, mean_length=30, seed=1)
    snaps = []
    for _ in range(2):
        with pytest.warns(InsecureNoiseWarning):
            est = StreamingSpectralLDA(3, 1.0, epsilon=4.0, seed=0, noise_seed=5, sampler="fast")
        est.warmup(X[:1000])
        est.partial_fit(X[1000:])
        snaps.append(est.release())
    assert snaps[0].privacy["sampler"] == SEEDED_NAME
    assert np.array_equal(snaps[0].topic_word, snaps[1].topic_word)      # reproducible
    with warnings.catch_warnings():
        warnings.simplefilter("error", InsecureNoiseWarning)
        est = StreamingSpectralLDA(3, 1.0, epsilon=4.0, seed=0, sampler="fast", non_production=True)
    assert est.sampler.name == CSPRNG_NAME


# ------------------------------------------------------------------ item 9: bootstrap
def test_wrong_bootstrap_fails_within_15_s_naming_bootstrap(tmp_path):
    vocab = tmp_path / "v.txt"
    vocab.write_text("\n".join(f"w{i}" for i in range(50)) + "\n")
    ledger = tmp_path / "ledger.jsonl"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"bootstrap": f"127.0.0.1:{free_port()}", "vocabulary": str(vocab),
                               "vocabulary_public_by_assumption": True, "n_topics": 3, "ledger": str(ledger),
                               "snapshot_dir": str(tmp_path / "snaps")}))
    for cmd in (["release"], ["sketcher"], ["control", "flush"]):
        t0 = time.monotonic()
        r = run_cli(*cmd, "--config", str(cfg), timeout=60)
        took = time.monotonic() - t0
        assert r.returncode == 2, (cmd, r.stderr[-2000:])
        assert "bootstrap" in r.stderr and "cannot reach Kafka" in r.stderr, r.stderr[-2000:]
        assert took < 15, (cmd, took)
        assert len(r.stderr.splitlines()) < 20, r.stderr[-3000:]     # no librdkafka flood
        assert "Traceback" not in r.stderr
    assert not ledger.exists()          # nothing was written before connecting


# ------------------------------------------------------------------ switching to non-private
def _vocab(tmp_path):
    from streamdp.text.vocabulary import Vocabulary
    v = Vocabulary([f"w{i}" for i in range(40)])
    v.save(tmp_path / "vocabulary.txt")
    return str(tmp_path / "vocabulary.txt")


def test_private_deployment_cannot_be_switched_to_non_private(kafka_broker, kafka_topics, tmp_path,
                                                               caplog):
    from streamdp.services.release import ReleaseService
    from streamdp.services.sketcher import Sketcher

    base = dict(bootstrap=kafka_broker.bootstrap, topic_prefix=kafka_topics.documents.rsplit(".", 1)[0],
                vocabulary=_vocab(tmp_path), vocabulary_public_by_assumption=True, n_topics=3, sampler="fast",
                ledger=str(tmp_path / "ledger.jsonl"), snapshot_dir=str(tmp_path / "snaps"),
                non_production=True, confirm_backfill=True)
    private = ServiceConfig(**base, epsilon=1.0)
    svc = ReleaseService(private)        # a private deployment: ledger budget + state marker
    svc.close()
    nonpriv = ServiceConfig(**base, epsilon=None, non_private=True)
    # 1. the ledger shows the private budget
    with pytest.raises(ConfigError, match="non_private.*ledger.*private") as e:
        ReleaseService(nonpriv)
    assert "never be switched" in str(e.value)
    # 2. the ledger moved away: the state topic still says private
    (tmp_path / "ledger.jsonl").rename(tmp_path / "moved.jsonl")
    with pytest.raises(ConfigError, match="state topic.*private deployment"):
        ReleaseService(nonpriv)
    assert not (tmp_path / "ledger.jsonl").exists()
    # 3. non-private sketchers are refused too (they would sketch the warm-up unclipped)
    with pytest.raises(ConfigError, match="state topic.*private deployment"):
        Sketcher(nonpriv)


def test_non_private_service_warns_at_start_up(kafka_broker, tmp_path, caplog):
    from streamdp.kafka.topics import TopicNames, ensure_topics
    from streamdp.services.release import ReleaseService
    import uuid
    names = TopicNames.from_prefix(f"test.{uuid.uuid4().hex[:10]}")
    ensure_topics(kafka_broker.bootstrap, names, partitions=1)
    cfg = ServiceConfig(bootstrap=kafka_broker.bootstrap, topic_prefix=names.documents.rsplit(".", 1)[0],
                        vocabulary=_vocab(tmp_path), vocabulary_public_by_assumption=True, n_topics=3, epsilon=None, non_private=True,
                        ledger=str(tmp_path / "ledger.jsonl"), snapshot_dir=str(tmp_path / "s"),
                        non_production=True, confirm_backfill=True)
    with caplog.at_level(logging.WARNING, logger="streamdp"):
        svc = ReleaseService(cfg)
        svc.close()
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "NON-PRIVATE" in r.getMessage()]
    assert len(warned) == 1


def test_every_non_private_snapshot_says_so(kafka_broker, tmp_path):
    """End to end (embedded broker): the snapshots of a non-private deployment are marked."""
    from service_helpers import Pipeline, fresh_topics, make_config, make_corpus, send_control
    from streamdp.services.produce import produce
    corpus = make_corpus(1500, 3000, 2, seed=3)
    names = fresh_topics(kafka_broker.bootstrap)
    cfg = make_config(tmp_path, kafka_broker.bootstrap, names, corpus, epsilon=None, noise_seed=None,
                      non_production=True)
    assert cfg.non_private
    pipe = Pipeline(cfg, sketchers=1)
    try:
        pipe.start()
        produce(kafka_broker.bootstrap, names.documents, corpus.records())
        send_control(kafka_broker.bootstrap, names, "flush", through=corpus.epochs)
        last = pipe.wait_released(corpus.epochs, timeout=90)
    finally:
        pipe.stop()
    assert last.privacy["non_private"] is True and last.privacy["private"] is False
    assert "NON-PRIVATE" in last.privacy["privacy_mode"]
    from streamdp.snapshot import TopicSnapshot
    files = sorted((tmp_path / "snapshots").glob("epoch-*.msgpack"))
    assert len(files) == corpus.epochs
    for f in files:
        assert "NON-PRIVATE" in TopicSnapshot.from_bytes(f.read_bytes()).privacy["privacy_mode"]
