"""A lost state topic never leads to a second spend (issue 25, state-topic loss; docs/operations.md
"The state topic is lost"). Embedded broker, real services, ε = 1.

A deployment releases its warm-up and epoch 1; then its state topic is deleted and re-created
(what a lost volume, a retention accident or a new cluster does). Before: the release service
started from empty sums — the sketchers re-read the documents, the warm-up closed again and the
accountant refused it with "reservation 'warmup-clip-histogram' was already committed" (the
symptom, not the loss), and a fresh ledger, the obvious fix, re-spent the budget on the same
documents. Now every start is refused before any side effect, with a message that says the state
topic was lost and what to do; a start that confirms the loss (``confirm_state_loss``) is accepted
only on a new ledger and is recorded on the state topic.

A lost ledger volume with the state topic kept is refused by the ledger binding
(tests/test_services.py::test_second_release_service_and_lost_ledger_are_refused, part (c));
not repeated here.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from streamdp.kafka.state_store import StateStore
from streamdp.kafka.topics import ensure_topics
from streamdp.services import control
from streamdp.services.config import ConfigError
from streamdp.services.produce import produce
from streamdp.services.release import ReleaseService
from streamdp.services.state_auth import StateAuth
from streamdp.services.state_loss import LOSS_KEY

from service_helpers import Pipeline, fresh_topics, make_config, make_corpus, send_control, wait_for


def _lose_state_topic(bootstrap: str, names) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_topics([names.state], operation_timeout=15).values():
        fut.result(30)
    wait_for(lambda: names.state not in admin.list_topics(timeout=10).topics, 30,
             "the state topic to be deleted")
    ensure_topics(bootstrap, names, partitions=2)


def _files_next_to(ledger: str) -> list[str]:
    """The side effects a refused start could leave on disk: the files in the ledger's folder
    (a ledger, its ``.lease``, anything else)."""
    folder = Path(ledger).parent
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _state_records(bootstrap: str, names) -> dict:
    with StateStore(None, bootstrap, names.state) as store:
        return store.read_all_latest()



def _released_epoch_1(bootstrap, tmp_path, seed):
    """A fresh ε = 1 deployment that released its warm-up and epoch 1: (topic names, config)."""
    corpus = make_corpus(300, 600, 2, seed=seed)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=1.0)
    with Pipeline(cfg, sketchers=1) as pipe:
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "close", through=1)
        pipe.wait_released(1, timeout=120)
    return names, cfg

def test_a_lost_state_topic_is_refused_and_a_confirmed_restart_is_recorded(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap
    names, cfg = _released_epoch_1(bootstrap, tmp_path, seed=11)
    _lose_state_topic(bootstrap, names)
    assert _state_records(bootstrap, names) == {}
    ledger = Path(cfg.ledger)
    before = ledger.read_bytes()
    files = _files_next_to(cfg.ledger)

    # the ledger kept: refused, naming the loss and the recovery, before any side effect
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        ReleaseService(cfg)
    assert time.monotonic() - t0 < 30
    msg = str(info.value)
    assert "state topic was lost" in msg and names.state in msg, msg
    assert "committed draw(s)" in msg and "warmup" in msg, msg          # the ledger's evidence
    assert names.snapshots in msg and "restore the state topic" in msg, msg
    assert "confirm_state_loss" in msg, msg
    assert ledger.read_bytes() == before
    assert _files_next_to(cfg.ledger) == files
    assert _state_records(bootstrap, names) == {}

    # the obvious fix, a fresh ledger: refused too (the snapshots topic proves the releases)
    fresh = replace(cfg, ledger=str(tmp_path / "fresh-ledger.jsonl"))
    with pytest.raises(ConfigError, match="state topic was lost") as info:
        ReleaseService(fresh)
    assert "committed draw(s)" not in str(info.value) and names.snapshots in str(info.value)
    assert not Path(fresh.ledger).exists()
    # no file next to the ledger either: no new ledger, no .lease (the lease was taken before
    # the state-loss check until this test was written)
    assert _files_next_to(fresh.ledger) == files, "a refused start left a file next to the ledger"
    assert _state_records(bootstrap, names) == {}

    # confirmed on the old ledger: refused (its reservations are spent)
    with pytest.raises(ConfigError, match="cannot reuse this ledger"):
        ReleaseService(replace(cfg, confirm_state_loss=True))
    assert ledger.read_bytes() == before

    # confirmed on a new ledger: accepted and recorded (signed, with the evidence); a plain
    # restart then needs no second confirmation
    ReleaseService(replace(fresh, confirm_state_loss=True)).close()
    with StateStore(None, bootstrap, names.state) as store:
        rec = store.read_latest(LOSS_KEY)
    assert rec is not None and any(names.snapshots in e for e in rec.meta["evidence"])
    assert StateAuth(control.load_key(cfg), cfg.topic_prefix).authentic(LOSS_KEY, rec.payload, rec.meta)
    ReleaseService(fresh).close()


def test_a_deployment_that_released_only_its_warm_up_and_lost_the_ledger_too_is_refused(
        kafka_broker, tmp_path):
    """Only the warm-up released (no snapshot yet), then the state topic *and* the ledger are
    lost: the ledger and the snapshots topic prove nothing, but the control topic still holds the
    release service's signed subspace_ready / epochs_closed: a fresh start would draw the warm-up
    again on the same warm-up documents. Refused, naming the control topic."""
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(300, 600, 2, seed=12)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=1.0)
    with Pipeline(cfg, sketchers=1) as pipe:
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "close", through=0)          # the warm-up only
        wait_for(lambda: pipe.release.subspace is not None, 120, "the warm-up release",
                 check=pipe.check)
    _lose_state_topic(bootstrap, names)
    lost_ledger = replace(cfg, ledger=str(tmp_path / "after-the-volume-was-lost.jsonl"))
    files = _files_next_to(lost_ledger.ledger)
    with pytest.raises(ConfigError, match="state topic was lost") as info:
        ReleaseService(lost_ledger)
    msg = str(info.value)
    assert names.control in msg and "subspace_ready" in msg, msg
    assert "committed draw(s)" not in msg and "snapshots topic" not in msg, msg
    assert not Path(lost_ledger.ledger).exists()
    assert _files_next_to(lost_ledger.ledger) == files     # no .lease, nothing else
    assert _state_records(bootstrap, names) == {}


def test_a_new_deployment_on_documents_an_earlier_deployment_released_is_refused(
        kafka_broker, tmp_path):
    """A deployment releases its warm-up and epoch 1; then everything but the documents topic is
    replaced (state, snapshots and control topics deleted and re-created, a new ledger): a "new
    deployment" on the same documents. Before: nothing left proved the spend and the new
    deployment started, re-releasing the same documents on a fresh budget. Now the release
    service's marker (offsets committed by the group ``streamdp-released.<documents topic>``
    after each spent record, kept by the broker with the documents topic) refuses it before any
    side effect, unless the operator confirms (confirm_state_loss, recorded and signed)."""
    bootstrap = kafka_broker.bootstrap
    names, cfg = _released_epoch_1(bootstrap, tmp_path, seed=13)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    gone = [names.state, names.snapshots, names.control]
    for fut in admin.delete_topics(gone, operation_timeout=15).values():
        fut.result(30)
    wait_for(lambda: not set(gone) & set(admin.list_topics(timeout=10).topics), 30,
             "the deployment's topics to be deleted")
    ensure_topics(bootstrap, names, partitions=2)
    new = replace(cfg, ledger=str(tmp_path / "new-deployment-ledger.jsonl"))
    files = _files_next_to(new.ledger)
    with pytest.raises(ConfigError, match="state topic was lost") as info:
        ReleaseService(new)
    msg = str(info.value)
    assert names.documents in msg and "streamdp-released" in msg, msg
    assert not Path(new.ledger).exists()
    assert _files_next_to(new.ledger) == files             # no .lease, nothing else
    assert _state_records(bootstrap, names) == {}
    # confirmed: accepted and recorded with the marker as evidence
    ReleaseService(replace(new, confirm_state_loss=True)).close()
    with StateStore(None, bootstrap, names.state) as store:
        rec = store.read_latest(LOSS_KEY)
    assert rec is not None and any(names.documents in e for e in rec.meta["evidence"])


def test_a_ledger_of_another_budget_is_refused_before_the_lease(kafka_broker, tmp_path):
    """An existing ledger written with another ε (another deployment's, or the operator changed
    ε on a deployment whose contract is not recorded yet) and no ``.lease`` next to it yet: the
    start is refused naming the budget, and leaves nothing behind — no ``<ledger>.lease``, the
    ledger unchanged, no record on the state topic. Before: the lease was taken before the
    accountant read the ledger's budget, so the refusal left ``<ledger>.lease``."""
    from streamdp.privacy.accountant import Accountant

    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(300, 600, 2, seed=14)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path / "deployment", bootstrap, names, corpus, epsilon=1.0)
    Accountant(2.0, cfg.delta, cfg.ledger)          # a ledger that enforces another budget
    ledger = Path(cfg.ledger)
    before = ledger.read_bytes()
    files = _files_next_to(cfg.ledger)
    assert files == ["ledger.jsonl", "vocabulary.txt"], files
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="cannot change") as info:
        ReleaseService(cfg)
    assert time.monotonic() - t0 < 30
    msg = str(info.value)
    assert "ε=2.0" in msg and "ε=1.0" in msg and str(ledger) in msg, msg
    assert _files_next_to(cfg.ledger) == files, "a refused start left a file next to the ledger"
    assert ledger.read_bytes() == before
    assert _state_records(bootstrap, names) == {}
    # the same ledger with its own budget: starts (and takes the lease)
    ReleaseService(replace(cfg, epsilon=2.0)).close()
    assert (ledger.parent / "ledger.jsonl.lease").exists()
