"""The release service's records on the state topic (issue 23 item 6; docs/privacy.md §Trust
boundary), on the embedded broker with real services.

* Sketchers never decode the release service's private state: every state-store read a
  sketcher makes (at start-up, restore, refresh, confirmation) is of a ``public/*``,
  ``sketch/*`` or ``deployment/*`` record, never ``release/*`` (whose metadata holds the ledger
  head, the writer epoch and exact document counts).
* ``release/*`` records carry a MAC under the deployment's control key: a record written
  without the key, under another key or for another deployment is refused at the release
  service's start with a message; a deployment whose records predate the MAC is refused with
  the message naming the one-time migration (``sign_unsigned_state``), which signs them.
"""
from __future__ import annotations

import threading

import pytest
from confluent_kafka import Producer

from streamdp.kafka.state_store import StateStore
from streamdp.services import control, public_records, public_release
from streamdp.services.config import ConfigError
from streamdp.services.produce import produce
from streamdp.services.release import ReleaseService
from streamdp.services.release_writer import WRITER_KEY
from streamdp.services.sketcher import Sketcher
from streamdp.services.state_auth import MAC_FIELD, StateAuth

from service_helpers import Pipeline, fresh_topics, make_config, make_corpus, send_control, wait_for


def _private_reads(reads, thread_prefix: str) -> list[str]:
    """Keys or prefixes a thread read that are, or cover, release service records."""
    return sorted({k for t, k in reads if t.startswith(thread_prefix)
                   and (k.startswith("release/") or "release/".startswith(k))})


def _released_deployment(tmp_path, bootstrap, **changes):
    """A deployment whose warm-up and epoch 1 are released (the services stopped)."""
    corpus = make_corpus(300, 600, 2, seed=9)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=None, **changes)
    with Pipeline(cfg, sketchers=1) as pipe:
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "close", through=1)
        pipe.wait_released(1, timeout=120)
    return cfg, names, corpus


def test_a_sketcher_reads_only_public_and_its_own_records(kafka_broker, tmp_path, state_reads):
    """A sketcher started (and restarted) on a running deployment: built and run on threads
    named ``sketcher-*``, so that every read it makes is attributed to it."""
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(300, 600, 2, seed=9)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=None)
    with Pipeline(cfg, sketchers=0) as pipe:
        produce(bootstrap, names.documents, corpus.records())

        for run in range(2):        # the first start, then a restart with released epochs
            box, errors = [], []

            def life():
                try:
                    sk = Sketcher(cfg, instance=f"sketcher-{run}")
                    box.append(sk)
                    sk.run(max_seconds=300, install_signals=False)
                except BaseException as exc:   # noqa: BLE001 - surfaced below
                    errors.append(exc)

            t = threading.Thread(target=life, name=f"sketcher-{run}", daemon=True)
            t.start()
            wait_for(lambda: box or errors, 60, "the sketcher to start")
            assert not errors, errors
            sk = box[0]
            if run == 0:
                send_control(bootstrap, names, "close", through=1)
                pipe.wait_released(1, timeout=120)
            # the sketcher restored its partitions, loaded the subspace and confirmed epoch 1
            wait_for(lambda: sk.subspace is not None and len(sk.states) == 2
                     and sk.closed_through >= 1, 90, "the sketcher to confirm epoch 1",
                     check=lambda: errors and pytest.fail(repr(errors[0])))
            sk.stop()
            t.join(60)
            assert not t.is_alive() and not errors, errors
    read_by_sketchers = {k for th, k in state_reads if th.startswith("sketcher-")}
    assert public_records.SUBSPACE_KEY in read_by_sketchers
    assert public_release.KEY in read_by_sketchers
    assert _private_reads(state_reads, "sketcher-") == []


@pytest.mark.parametrize("key", [control.SUBSPACE_KEY, control.RELEASE_STATE_KEY, WRITER_KEY])
def test_forged_release_records_are_refused_at_start(kafka_broker, tmp_path, key):
    """A release record written without the key, under another key, or copied from another
    deployment (another topic prefix, same key): the release service refuses to start on it,
    naming the record, before it writes anything."""
    bootstrap = kafka_broker.bootstrap
    cfg, names, _ = _released_deployment(tmp_path, bootstrap)
    store = StateStore(Producer({"bootstrap.servers": bootstrap}), bootstrap, names.state,
                       owns_producer=True)
    try:
        honest = store.read_latest(key)
        assert honest is not None and StateAuth(control.load_key(cfg), cfg.topic_prefix).authentic(
            key, honest.payload, honest.meta)
        bare = {k: v for k, v in honest.meta.items() if k != MAC_FIELD}
        attacks = {
            "forged": {**bare, MAC_FIELD: "0" * 64},
            "edited": {**honest.meta, "writer_epoch": 10 ** 6},
            "another key": StateAuth(b"k" * 32, cfg.topic_prefix).sign(key, honest.payload, bare),
            "another deployment": StateAuth(control.load_key(cfg), "other.deployment").sign(
                key, honest.payload, bare),
        }
        for what, meta in attacks.items():
            store.write(key, honest.payload, meta=meta)
            with pytest.raises(ConfigError, match=f"state record '{key}'.*MAC") as err:
                ReleaseService(cfg)
            assert "control_key_file" in str(err.value), what
        # the honest record back: the deployment starts again
        store.write(key, honest.payload, meta=honest.meta)
    finally:
        store.close()
    ReleaseService(cfg).close()


def test_unsigned_release_records_are_refused_until_the_operator_signs_them(kafka_broker, tmp_path):
    """A deployment older than signed release records (simulated: every release record
    re-written without its MAC): refused with a message naming sign_unsigned_state; started
    once with it, the records are signed and the next plain start succeeds. The sketchers'
    public records are (re)written from the release records at that start too."""
    bootstrap = kafka_broker.bootstrap
    cfg, names, _ = _released_deployment(tmp_path, bootstrap)
    store = StateStore(Producer({"bootstrap.servers": bootstrap}), bootstrap, names.state,
                       owns_producer=True)
    try:
        for key, rec in store.read_all_latest(prefix="release/").items():
            store.write(key, rec.payload, meta={k: v for k, v in rec.meta.items() if k != MAC_FIELD})
        with pytest.raises(ConfigError, match="sign_unsigned_state"):
            ReleaseService(cfg)
        from dataclasses import replace
        ReleaseService(replace(cfg, sign_unsigned_state=True)).close()
        auth = StateAuth(control.load_key(cfg), cfg.topic_prefix)
        recs = store.read_all_latest(prefix="release/")
        assert control.RELEASE_STATE_KEY in recs
        assert all(auth.authentic(k, r.payload, r.meta) for k, r in recs.items()), sorted(recs)
        pub = store.read_latest(public_records.SUBSPACE_KEY)
        assert pub is not None and auth.authentic(public_records.SUBSPACE_KEY, pub.payload, pub.meta)
        # released fields only: no ledger head, writer epoch or exact warm-up count
        assert set(pub.meta) == {"clip", "subspace_id", "vocabulary_id", MAC_FIELD}
        assert pub.payload == recs[control.SUBSPACE_KEY].payload
    finally:
        store.close()
    ReleaseService(cfg).close()


def test_a_failed_selection_s_public_record_never_quotes_the_private_count():
    """The private record's error quotes the exact number of selection documents ("this count is
    private"); public/vocabulary, which sketchers and anyone reading public/* get, carries a
    fixed text instead (found in review: it copied the private text)."""
    from streamdp.services.public_records import (FAILED_SELECTION_ERROR, VOCABULARY_KEY,
                                                  public_meta)
    private = {"vocabulary_id": None, "mode": "private", "status": "failed",
               "error": "private vocabulary selection kept 3 words (< min_words=50): ... the "
                        "selection slice has 1234 documents (this count is private: do not "
                        "publish it)", "selection_documents": 1234}
    pub = public_meta(VOCABULARY_KEY, private)
    assert pub["status"] == "failed" and pub["error"] == FAILED_SELECTION_ERROR
    assert "1234" not in repr(pub)
