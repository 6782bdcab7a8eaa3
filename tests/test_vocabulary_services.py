"""The services select their vocabulary (issue 11 part 3): configuration, the selection window,
sketchers that hold documents until the vocabulary exists, the release service's spend
protocol for the selection (crash between reserve and persist), a too-small window, and the
vocabulary in every snapshot's privacy report. Everything on the embedded broker.
"""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from streamdp.privacy.ledger import FileLedger
from streamdp.services import control
from streamdp.services.config import ConfigError, ServiceConfig
from streamdp.services.demo_corpus import TOPICS, sample_texts
from streamdp.services.produce import produce
from streamdp.text.vocabulary import Vocabulary

from service_helpers import (EPOCH_SECONDS, Pipeline, default_stream_start, fresh_topics,
                             make_config, read_topic, send_control, wait_for)

TOPIC_WORDS = sorted({w for ws in TOPICS.values() for w in ws.split()})


# =================================================================== configuration
def base(**kw) -> dict:
    out = dict(n_topics=6, epsilon=1.0, stream_start=100_000.0)
    out.update(kw)
    return out


@pytest.mark.parametrize("values,field,words", [
    (dict(vocabulary_mode="corpus"), "vocabulary_mode", "'public'"),
    (dict(vocabulary_mode="private"), "selection_end", "needs selection_end"),
    (dict(vocabulary_mode="private", selection_end=100_000.0), "selection_end", "before stream_start"),
    (dict(vocabulary_mode="private", selection_end=5.0, vocabulary_size=100,
          vocabulary_candidates=50), "vocabulary_candidates", "below vocabulary_size"),
    (dict(vocabulary_mode="private", selection_end=5.0, epsilon=None, non_private=True),
     "vocabulary_mode", "non-private"),
    (dict(vocabulary_mode="public", vocabulary="v.txt"), "vocabulary", "remove 'vocabulary'"),
    (dict(vocabulary_mode="public", selection_end=5.0), "selection_end", "remove it"),
    (dict(vocabulary="v.txt", selection_end=5.0), "selection_end", "vocabulary_mode: private"),
    (dict(vocabulary_mode="public", vocabulary_public_by_assumption=True),
     "vocabulary_public_by_assumption", "only applies"),
    (dict(vocabulary_mode="public", vocabulary_size=3), "vocabulary_size", "n_topics"),
    (dict(vocabulary_mode="private", selection_end=5.0, vocabulary_max_words_per_document=0),
     "vocabulary_max_words_per_document", ">= 1"),
])
def test_vocabulary_configuration_is_validated_at_start_up(values, field, words):
    with pytest.raises(ConfigError) as err:
        ServiceConfig(**base(**values))
    assert f"'{field}'" in str(err.value) and words in str(err.value), str(err.value)


def test_a_vocabulary_file_must_say_it_is_public(tmp_path):
    """A plain word list (e.g. the corpus's own top words) is refused unless declared public
    in so many words; a sidecar from `streamdp vocab public` for this very file is accepted;
    a stale sidecar (another vocabulary id) is refused."""
    path = tmp_path / "v.txt"
    vocab = Vocabulary([f"w{i}" for i in range(20)])
    vocab.save(path)
    cfg = ServiceConfig(**base(vocabulary=str(path)))
    with pytest.raises(ConfigError, match="vocabulary_public_by_assumption: true"):
        cfg.load_vocabulary()
    got, prov = cfg.replace(vocabulary_public_by_assumption=True).load_vocabulary_file()
    assert got == vocab and prov["public_by_assumption"] is True
    Path(f"{path}.json").write_text(json.dumps({"vocabulary_id": vocab.id, "selection": "public",
                                               "source": "wordfreq"}))
    got, prov = cfg.load_vocabulary_file()
    assert got == vocab and prov["selection"] == "public" and "public_by_assumption" not in prov
    Path(f"{path}.json").write_text(json.dumps({"vocabulary_id": "0" * 16, "selection": "public"}))
    with pytest.raises(ConfigError, match="stale sidecar"):
        cfg.load_vocabulary()


def test_routing_cuts_the_selection_window_out_of_the_warm_up():
    # (refinement off: 100 s epochs are too short for its hold with max_future_seconds = 300)
    cfg = ServiceConfig(**base(vocabulary_mode="private", selection_end=50_000.0,
                               epoch_seconds=100.0, lateness=10.0, refinement=False))
    r = cfg.routing
    ts = np.array([10.0, 49_999.0, 49_999.0, 50_000.0, 99_999.0, 100_050.0])
    rt = np.array([10.0, 49_999.5, 50_000.0, 50_000.0, 99_999.0, 100_050.0])
    # selection, selection, late (record time past selection_end), warm-up, warm-up, epoch 1
    assert r.route(ts, rt, now=200_000.0).tolist() == [-3, -3, -1, 0, 0, 1]
    assert r.close_time(-3) == 50_000.0


# =================================================================== a private deployment end to end
def private_corpus(n_sel: int, n_warm: int, n_stream: int, epochs: int, *, seed: int = 0):
    """Selection window, warm-up, stream: documents as records in timestamp order."""
    texts, topics, _ = sample_texts(n_sel + n_warm + n_stream, seed=seed)
    start = default_stream_start()
    selection_end = start - 43_200.0
    rng = np.random.default_rng(seed + 7)
    ts = np.concatenate([
        np.sort(selection_end - 1.0 - 40_000.0 * rng.random(n_sel)),
        np.sort(start - 1.0 - 40_000.0 * rng.random(n_warm)),
        start + np.sort(rng.random(n_stream)) * epochs * EPOCH_SECONDS])
    records = [{"id": f"doc-{i}", "ts": float(t), "text": x} for i, (t, x) in enumerate(zip(ts, texts))]
    return records, topics, start, selection_end


def private_config(tmp_path, bootstrap, names, start, selection_end, epochs, **kw):
    from service_helpers import Corpus
    dummy = Corpus([], np.zeros((6, 1)), ["x"], np.zeros(0), 0, 0, epochs, start)
    values = dict(vocabulary_mode="private", selection_end=selection_end, vocabulary_size=150,
                  epoch_seconds=EPOCH_SECONDS,
                  vocabulary_candidates=50_000, vocabulary_max_words_per_document=16,
                  epsilon=1.0, noise_seed=None, sampler="fast", non_production=True,
                  horizon=epochs)
    values.update(kw)
    return make_config(tmp_path, bootstrap, names, dummy, **values)


def read_states(bootstrap, names):
    from streamdp.kafka.state_store import StateStore
    from streamdp.services.partition_state import PartitionState
    store = StateStore(None, bootstrap, names.state)
    try:
        found = store.read_all_latest(prefix=f"sketch/{names.documents}/")
        sub = store.read_latest(control.SUBSPACE_KEY)
    finally:
        store.close()
    subspace = None
    if sub is not None:
        from streamdp.whitening.subspace import Subspace
        subspace = Subspace.from_bytes(sub.payload)
    return {int(r.meta["partition"]): PartitionState.from_bytes(r.payload, subspace)
            for r in found.values()}


def read_record(bootstrap, names, key):
    from streamdp.kafka.state_store import StateStore
    store = StateStore(None, bootstrap, names.state)
    try:
        return store.read_latest(key)
    finally:
        store.close()


@pytest.mark.slow
def test_private_vocabulary_selection_then_warm_up_then_stream(kafka_broker, tmp_path, state_reads):
    """vocabulary_mode: private, everything produced at once. Without a release service the
    sketchers count only the selection window and hold every partition at its first warm-up
    document (nothing else counted); then the release service selects the vocabulary (spend
    key 'vocabulary', the whole budget of its own atom), the sketchers load it, the warm-up
    and both epochs close, and the released snapshots carry the published vocabulary's id.
    Every document is counted exactly once, in its window. The sketchers' threads read the
    vocabulary and the subspace from the public records only, never a release/* record."""
    from streamdp.privacy.accountant import Accountant
    from streamdp.snapshot import TopicSnapshot

    bootstrap = kafka_broker.bootstrap
    n_sel, n_warm, n_stream, epochs = 3000, 2000, 2000, 2
    records, topics, start, selection_end = private_corpus(n_sel, n_warm, n_stream, epochs)
    names = fresh_topics(bootstrap)
    cfg = private_config(tmp_path, bootstrap, names, start, selection_end, epochs)

    # --- phase 1: sketchers only; they must hold at the end of the selection window
    sketchers = Pipeline(cfg, sketchers=2, release=False)
    pipe = None
    try:
        sketchers.start()
        produce(bootstrap, names.documents, records)

        def held():
            st = read_states(bootstrap, names)
            return len(st) == 2 and sum(s.counters.get("selection_documents", 0)
                                        for s in st.values()) == n_sel \
                and all(p in w.paused for w in sketchers.sketchers for p in w.states) and st
        wait_for(held, 90, "the sketchers to hold at the selection window's end",
                 check=sketchers.check)
        time.sleep(1.0)            # still held: nothing after the window is consumed
        states = read_states(bootstrap, names)
        assert all(w.vocabulary is None for w in sketchers.sketchers)
        assert sum(s.counters.get("selection_documents", 0) for s in states.values()) == n_sel
        assert all(s.warmup is None and not s.epochs and s.counters["warmup_documents"] == 0
                   and s.counters["documents"] == 0 and s.counters["late"] == 0
                   for s in states.values())
        assert sum(s.selection.n_docs for s in states.values()) == n_sel
        # each partition stops exactly at its first record past the window
        offsets = {p: s.next_offset for p, s in states.items()}
        by_part = {}
        import msgpack
        for r in read_topic(bootstrap, names.documents):
            by_part.setdefault(r.partition, []).append(msgpack.unpackb(r.value)["ts"])
        for p, ts in by_part.items():
            assert offsets[p] == int(np.sum(np.asarray(ts) < selection_end)), (p, offsets[p])

        # --- phase 2: the release service starts; the same sketchers go on
        pipe = Pipeline(cfg, sketchers=0)
        pipe.start()
        send_control(bootstrap, names, "flush", through=epochs)
        last = pipe.wait_released(epochs, timeout=300)
        rel = pipe.release
        assert rel.exhausted is None
        assert all(w.vocabulary == rel.vocabulary for w in sketchers.sketchers)
    finally:
        sketchers.stop()
        if pipe is not None:
            pipe.stop()
    vrec = read_record(bootstrap, names, control.VOCABULARY_KEY)
    vocab = Vocabulary.from_bytes(vrec.payload)
    assert vrec.meta["vocabulary_id"] == vocab.id == rel.vocabulary.id == last.vocabulary_id
    assert vrec.meta["selection_documents"] == n_sel and vrec.meta["mode"] == "private"
    sub = read_record(bootstrap, names, control.SUBSPACE_KEY)
    assert sub.meta["vocabulary_id"] == vocab.id and sub.meta["warmup_documents"] == n_warm
    states = read_states(bootstrap, names)
    assert sum(s.counters.get("selection_documents", 0) for s in states.values()) == n_sel
    assert sum(s.counters["warmup_documents"] for s in states.values()) == n_warm
    assert sum(s.counters["documents"] for s in states.values()) == n_stream
    assert all(s.selection is None and s.counters["late"] == 0 for s in states.values())
    # the words: public candidates only; the topic words are found, above the noise
    cands = set(rel.candidates.words)
    assert set(vocab.words) <= cands and len(vocab) <= cfg.vocabulary_size
    assert np.mean([w in vocab for w in TOPIC_WORDS]) >= 0.8, sorted(set(TOPIC_WORDS) - set(vocab))
    # every snapshot names the published vocabulary and says how it was chosen
    snaps = [TopicSnapshot.from_bytes(r.value) for r in read_topic(bootstrap, names.snapshots)]
    assert sorted({s.epoch for s in snaps}) == [1, 2]
    for s in snaps:
        v = s.privacy["vocabulary"]
        assert s.vocabulary_id == vocab.id and v["vocabulary_id"] == vocab.id
        assert v["mode"] == "private" and "parallel" in v["composition"]
        assert [e["partition"] for e in v["events"]] == ["vocabulary"]
        assert "selection_documents" not in v        # an exact count is not published
    assert Vocabulary.load(Path(cfg.snapshot_dir) / "vocabulary.txt") == vocab   # for readers
    # the ledger: one selection reservation, committed, on its own atom (parallel composition)
    rep = Accountant(cfg.epsilon, cfg.delta, cfg.ledger).report()
    B = rep["rho_budget"]
    assert rep["uncommitted"] == 0 and rep["refusals"] == 0
    assert rep["rho_by_atom"]["vocabulary"] == pytest.approx(B, rel=1e-9)
    assert rep["rho_by_atom"]["warmup"] == pytest.approx(B, rel=1e-9)
    assert rep["epsilon_worst_case"] <= cfg.epsilon * (1 + 1e-9)
    keys = [r.key for r in FileLedger(cfg.ledger).read() if r.kind == "reserve"]
    assert keys.count("vocabulary") == 1
    assert last.privacy["accountant"]["rho_by_atom"]["vocabulary"] == pytest.approx(B, rel=1e-9)
    # the sketchers loaded the vocabulary and the subspace from public/* only (issue 23 item 6)
    from streamdp.services import public_records
    by_sketchers = {k for t, k in state_reads if t.startswith("sketcher-")}
    assert {public_records.VOCABULARY_KEY, public_records.SUBSPACE_KEY} <= by_sketchers
    assert not [k for k in by_sketchers if k.startswith("release/") or "release/".startswith(k)]


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_reserve", "after_persist"])
def test_release_killed_during_the_selection_then_restarted(kafka_broker, tmp_path, point):
    """SIGKILL between reserve and persist (the draw is lost: the restart fulfils the same
    reservation, no second charge) or between persist and commit (the restart commits it):
    one vocabulary, one 'vocabulary' reservation, the atom at exactly ρ_budget."""
    from crash_helpers import ReleaseProcess
    from streamdp.privacy.accountant import Accountant

    bootstrap = kafka_broker.bootstrap
    records, _, start, selection_end = private_corpus(3000, 1000, 500, 1, seed=3)
    names = fresh_topics(bootstrap)
    cfg = private_config(tmp_path, bootstrap, names, start, selection_end, 1)
    sketchers = Pipeline(cfg, sketchers=2, release=False)
    proc = ReleaseProcess(cfg, tmp_path, point, "vocabulary")
    restarted = None
    try:
        wait_for(proc.ready, 60, "the release subprocess")
        assert proc.proc.poll() is None, proc.log()[-3000:]
        sketchers.start()
        produce(bootstrap, names.documents, records)
        send_control(bootstrap, names, "flush", through=1)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"not killed at {point}:\n" + proc.log()[-3000:])
        assert rc == -signal.SIGKILL and proc.killed_at() == point, (rc, proc.log()[-3000:])
        rep = Accountant(cfg.epsilon, cfg.delta, cfg.ledger).report()
        assert rep["uncommitted"] == 1
        persisted = read_record(bootstrap, names, control.VOCABULARY_KEY)
        assert (persisted is not None) == (point == "after_persist")
        restarted = Pipeline(cfg, sketchers=0)
        restarted.start()
        last = restarted.wait_released(1, timeout=120)
        release = restarted.release
    finally:
        proc.ensure_dead()
        sketchers.stop()
        if restarted is not None:
            restarted.stop()
    vrec = read_record(bootstrap, names, control.VOCABULARY_KEY)
    if point == "after_persist":
        assert vrec.meta["vocabulary_id"] == persisted.meta["vocabulary_id"]   # not redrawn
    assert last.vocabulary_id == vrec.meta["vocabulary_id"] == release.vocabulary.id
    rep = Accountant(cfg.epsilon, cfg.delta, cfg.ledger).report()
    B = rep["rho_budget"]
    assert rep["uncommitted"] == 0 and rep["refusals"] == 0
    assert rep["rho_by_atom"]["vocabulary"] == pytest.approx(B, rel=1e-9)
    keys = [r.key for r in FileLedger(cfg.ledger).read() if r.kind == "reserve"]
    assert keys.count("vocabulary") == 1


def test_too_small_selection_window_fails_with_the_numbers_and_the_fix(kafka_broker, tmp_path):
    """Twelve documents cannot lift any word above the noise: the selection is drawn (and
    charged), fails, and the failure is persisted so a restart does not draw again."""
    bootstrap = kafka_broker.bootstrap
    records, _, start, selection_end = private_corpus(12, 50, 20, 1, seed=5)
    names = fresh_topics(bootstrap)
    cfg = private_config(tmp_path, bootstrap, names, start, selection_end, 1)
    pipe = Pipeline(cfg, sketchers=1)
    with pipe:
        produce(bootstrap, names.documents, records)
        send_control(bootstrap, names, "flush", through=1)
        wait_for(lambda: pipe.release.exhausted, 90, "the selection to fail", check=pipe.check)
        msg = pipe.release.exhausted
    assert "selection_end" in msg and "epsilon" in msg and "vocabulary_mode: public" in msg
    assert "min_words" in msg and "σ" in msg
    rec = read_record(bootstrap, names, control.VOCABULARY_KEY)
    assert rec.meta["status"] == "failed" and rec.meta["error"] == msg
    # the sketchers' public record says it failed, never the private text with its exact count
    from streamdp.services.public_records import FAILED_SELECTION_ERROR, VOCABULARY_KEY
    pub = read_record(bootstrap, names, VOCABULARY_KEY)
    assert pub.meta["status"] == "failed" and pub.meta["error"] == FAILED_SELECTION_ERROR
    assert "documents (this count is private" in msg and not any(c.isdigit() for c in pub.meta["error"])
    from streamdp.privacy.accountant import Accountant
    rep = Accountant(cfg.epsilon, cfg.delta, cfg.ledger).report()
    assert rep["uncommitted"] == 0 and rep["reservations"] == 1
    # a restart does not draw again: it stops with the persisted message
    from streamdp.services.release import ReleaseService
    again = ReleaseService(cfg)
    try:
        assert again.exhausted == msg
    finally:
        again.close()
    assert Accountant(cfg.epsilon, cfg.delta, cfg.ledger).report()["reservations"] == 1


def test_service_selection_of_words_outside_the_public_list_stays_within_the_atom():
    """vocabulary_out_of_list: the partition selection (OpenDP threshold, approximate zCDP)
    adds a domain word hundreds of documents use; the selection's events fit the vocabulary
    atom's limit at δ − δ_v, and a word one document uses is not selected."""
    from streamdp.privacy.accountant import Accountant
    from streamdp.privacy.memory_ledger import MemoryLedger
    from streamdp.privacy.noise import make_sampler
    from streamdp.privacy.spend import SpendSession
    from streamdp.services import vocabulary as vocab_mod

    cfg = ServiceConfig(**base(vocabulary_mode="private", selection_end=50_000.0, epsilon=4.0,
                               vocabulary_size=200, vocabulary_candidates=50_000,
                               vocabulary_max_words_per_document=16, vocabulary_out_of_list=True))
    cands = vocab_mod.candidates(cfg)
    assert "zorbulux" not in cands and "qwxvyzzt" not in cands
    tok = cfg.tokenizer_()
    texts, _, _ = sample_texts(3000, seed=2)
    docs = [tok.tokenize(t) for t in texts]
    docs = [["zorbulux"] + d if i < 600 else d for i, d in enumerate(docs)] + [["qwxvyzzt"] * 5]
    parts = [vocab_mod.SelectionHistogram.for_config(cfg, cands) for _ in range(2)]
    for i, d in enumerate(docs):                    # two partitions, merged as the service does
        parts[i % 2].add([d], cands)
    parts = [vocab_mod.SelectionHistogram.from_bytes(p.to_bytes()) for p in parts]   # checkpointed
    merged = vocab_mod.merge_histograms(parts, cands)
    assert merged.n_docs == len(docs)
    acc = Accountant(cfg.epsilon, cfg.delta, MemoryLedger())
    session = SpendSession(acc)
    sel = vocab_mod.select(cfg, merged, accountant=acc, sampler=make_sampler("opendp"),
                           spender=session)
    session.persisted()
    assert "zorbulux" in sel.vocabulary and "qwxvyzzt" not in sel.vocabulary
    assert {e.partition for e in sel.events} == {"vocabulary"} and any(e.delta > 0 for e in sel.events)
    rep = acc.report()
    assert rep["uncommitted"] == 0 and rep["refusals"] == 0
    assert 0 < rep["delta_of_approximate_events_by_atom"]["vocabulary"] < cfg.delta
    assert rep["epsilon_worst_case"] <= cfg.epsilon * (1 + 1e-9)


@pytest.mark.slow
def test_public_vocabulary_is_built_once_and_shared(kafka_broker, tmp_path):
    """vocabulary_mode: public: the release service builds the wordfreq list at its first start
    and persists it (no budget); sketchers hold the warm-up until it is published and count
    over it; a restarted release service uses the record, it does not rebuild."""
    from streamdp.privacy.accountant import Accountant
    from streamdp.services import vocabulary as vocab_mod
    from streamdp.services.release import ReleaseService

    bootstrap = kafka_broker.bootstrap
    records, _, start, _ = private_corpus(0, 1500, 1500, 1, seed=9)
    names = fresh_topics(bootstrap)
    cfg = private_config(tmp_path, bootstrap, names, start, None, 1, vocabulary_mode="public",
                         vocabulary_size=20_000)
    expected, _ = vocab_mod.public_vocabulary(cfg)
    sketchers = Pipeline(cfg, sketchers=2, release=False)
    with sketchers:
        produce(bootstrap, names.documents, records)
        wait_for(lambda: sum(len(w.paused) for w in sketchers.sketchers) == 2, 60,
                 "the sketchers to hold the warm-up", check=sketchers.check)
        states = read_states(bootstrap, names)
        assert all(s.next_offset == 0 for s in states.values())
        pipe = Pipeline(cfg, sketchers=0)
        with pipe:
            assert pipe.release.vocabulary == expected
            send_control(bootstrap, names, "flush", through=1)
            last = pipe.wait_released(1, timeout=120)
    assert last.vocabulary_id == expected.id
    assert last.privacy["vocabulary"]["mode"] == "public"
    assert last.privacy["vocabulary"]["source"] == "wordfreq"
    states = read_states(bootstrap, names)
    assert sum(s.counters["warmup_documents"] for s in states.values()) == 1500
    assert sum(s.counters["documents"] for s in states.values()) == 1500
    rep = Accountant(cfg.epsilon, cfg.delta, cfg.ledger).report()
    assert rep["rho_by_atom"]["vocabulary"] == 0.0
    # a restart reads the record (a different wordfreq would not change the deployment)
    vocab_mod._CANDIDATES.clear()
    again = ReleaseService(cfg.replace(vocabulary_size=19_000))
    try:
        assert again.vocabulary == expected
    finally:
        again.close()


@pytest.mark.slow
def test_selection_histogram_is_exactly_once_across_kill_9(kafka_broker, tmp_path):
    """kill -9 a sketcher (small batches, frequent checkpoints) twice while it counts the
    selection window; the restarted one restores the checkpoint and re-reads the rest. The
    histogram it holds at the window's end equals the brute-force histogram of every
    selection document: nothing lost, nothing counted twice."""
    from crash_helpers import SketcherProcess
    from streamdp.services import vocabulary as vocab_mod
    from streamdp.text.tokenizer import Tokenizer
    from streamdp.text.vocab_selection import CandidateHistogram

    bootstrap = kafka_broker.bootstrap
    n_sel = 4000
    records, _, start, selection_end = private_corpus(n_sel, 300, 100, 1, seed=11)
    names = fresh_topics(bootstrap)
    cfg = private_config(tmp_path, bootstrap, names, start, selection_end, 1,
                         batch_size=16, checkpoint_seconds=0.3)
    produce(bootstrap, names.documents, records)
    for i in range(2):
        p = SketcherProcess(cfg, tmp_path, f"killed-{i}")
        try:
            p.wait_assigned()
            p.wait_processed(600, timeout=60)
        finally:
            p.kill()
        done = sum(s.counters.get("selection_documents", 0) for s in read_states(bootstrap, names).values())
        assert done < n_sel, "killed after the window: the test would not test the restore"
    last = SketcherProcess(cfg, tmp_path, "last")
    try:
        wait_for(lambda: "until the vocabulary is released" in last.log()
                 and last.log().count("paused at offset") >= 2, 120,
                 "the last sketcher to hold both partitions", check=last.check_alive)
        time.sleep(1.0)           # its checkpoint after the pause
    finally:
        assert last.terminate() == 0, last.tail()
    states = read_states(bootstrap, names)
    cands = vocab_mod.candidates(cfg)
    merged = vocab_mod.merge_histograms([s.selection for s in states.values()], cands)
    truth = CandidateHistogram.for_config(cands, vocab_mod.selection_config(cfg))
    tok = Tokenizer()
    truth.add_documents(tok.tokenize(r["text"]) for r in records if r["ts"] < selection_end)
    assert merged.n_docs == truth.n_docs == n_sel
    assert np.array_equal(merged.counts, truth.counts)
    assert sum(s.counters.get("selection_documents", 0) for s in states.values()) == n_sel
    assert all(s.warmup is None and s.counters["warmup_documents"] == 0 for s in states.values())
