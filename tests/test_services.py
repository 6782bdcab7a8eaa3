"""End-to-end tests of the services (sketchers + release service) on the real embedded broker.

Each pipeline runs two sketchers and the release service in threads of this
process (as ``streamdp.services.demo.run_demo`` does); the crash test runs the
release service in a subprocess and kills it with SIGKILL.
"""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import msgpack
import numpy as np

from streamdp.privacy.plan import PREMISE_SHARE
import pytest

from streamdp.evaluation import matched_topic_error
from streamdp.privacy.ledger import FileLedger
from streamdp.services.produce import produce
from streamdp.snapshot import TopicSnapshot

from service_helpers import (Pipeline, engine_snapshots, fresh_topics, http_get, make_config,
                             make_corpus, metric, metric_by, read_topic, scrape, scrape_until,
                             send_control, wait_for)


def snapshots_by_epoch(bootstrap: str, topic: str) -> dict[int, list[TopicSnapshot]]:
    out: dict[int, list[TopicSnapshot]] = {}
    for r in read_topic(bootstrap, topic):
        snap = TopicSnapshot.from_bytes(r.value)
        assert r.key == snap.release_id.encode()
        out.setdefault(snap.epoch, []).append(snap)
    return out


def assert_one_snapshot_per_epoch(by_epoch: dict[int, list[TopicSnapshot]]) -> None:
    """Republishing the same release is allowed; two *different* releases of one epoch are not."""
    for epoch, snaps in by_epoch.items():
        ids = {s.release_id for s in snaps}
        assert len(ids) == 1, f"epoch {epoch} was published as {len(ids)} different releases: {ids}"


def wait_http_ready(urls, timeout=45.0, check=None):
    def ready():
        return all(http_get(u + "/readyz")[0] == 200 for u in urls)
    wait_for(ready, timeout, "every service's /readyz to answer 200", interval=0.2, check=check)


# =================================================================== non-private run (tests 1, 4)
@pytest.fixture(scope="module")
def nonprivate_run(kafka_broker, tmp_path_factory):
    """3,000 warm-up + 6,000 stream documents over 3 epochs, non-private, 2 sketchers."""
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(3000, 6000, 3, seed=0)
    names = fresh_topics(bootstrap)
    # refinement off: all documents arrive before the first release, so none could be folded
    # into a model (the refinement path has its own test, tests/test_service_refinement.py)
    cfg = make_config(tmp_path_factory.mktemp("nonprivate"), bootstrap, names, corpus, epsilon=None,
                      refinement=False)
    t0 = time.monotonic()
    pipe = Pipeline(cfg, sketchers=2)
    try:
        pipe.start()
        wait_for(lambda: all(s.server is not None for s in pipe.sketchers) and pipe.release.server,
                 20, "the metrics servers", check=pipe.check)
        urls = [s.server.url.rstrip("/") for s in pipe.sketchers]
        release_url = pipe.release.server.url.rstrip("/")
        wait_http_ready(urls + [release_url], check=pipe.check)
        health = {u: http_get(u + "/healthz")[0] for u in urls + [release_url]}
        n = produce(bootstrap, names.documents, corpus.records())
        assert n == len(corpus.texts)
        send_control(bootstrap, names, "flush", through=corpus.epochs)
        last = pipe.wait_released(corpus.epochs, timeout=90)
        # every metric below is final once the last epoch is out: scrape while running
        sk_samples = [scrape(u) for u in urls]
        rel_samples = scrape_until(
            release_url, lambda m: metric(m, "streamdp_releases_total", outcome="published")
            >= corpus.epochs, 10, "the release metrics of the last epoch")
        latest_http = json.loads(http_get(release_url + "/snapshot/latest")[1])
        states = {p: st for s in pipe.sketchers for p, st in list(s.states.items())}

        def raw_sums_dropped():          # after `epochs_closed through=3` reaches the sketchers
            try:
                return all(not st.epochs and st.warmup is None for st in states.values())
            except RuntimeError:         # dict changed size during iteration: look again
                return False
        wait_for(raw_sums_dropped, 15, "the sketchers to drop the released raw sketches",
                 check=pipe.check)
    finally:
        pipe.stop()
    return dict(corpus=corpus, names=names, cfg=cfg, bootstrap=bootstrap, last=last,
                sketcher_metrics=sk_samples, release_metrics=rel_samples, health=health,
                latest_http=latest_http, states=states, seconds=time.monotonic() - t0)


def test_end_to_end_non_private_equals_the_engine(nonprivate_run):
    run = nonprivate_run
    corpus, cfg = run["corpus"], run["cfg"]
    engine = engine_snapshots(corpus, epsilon=None)
    assert [s.epoch for s in engine] == [1, 2, 3]

    # --- the snapshots topic: one release per epoch, each equal to the engine's
    by_epoch = snapshots_by_epoch(run["bootstrap"], run["names"].snapshots)
    assert sorted(by_epoch) == [1, 2, 3]
    assert_one_snapshot_per_epoch(by_epoch)
    for eng in engine:
        svc = by_epoch[eng.epoch][0]
        assert svc.n_docs == eng.n_docs, (eng.epoch, svc.n_docs, eng.n_docs)
        np.testing.assert_allclose(svc.topic_word, eng.topic_word, rtol=0, atol=1e-8,
                                   err_msg=f"epoch {eng.epoch}")
        np.testing.assert_allclose(svc.alpha, eng.alpha, rtol=1e-7, atol=1e-9)
        assert svc.privacy["mechanism"] == "none"
        assert svc.vocabulary_id == corpus.vocabulary.id
    # epoch t covers the stream documents of epochs 1..t (cumulative release)
    per_epoch = np.bincount(np.floor((corpus.ts[corpus.stream_slice] - corpus.stream_start)
                                     / corpus.epoch_seconds).astype(int) + 1, minlength=4)
    assert [by_epoch[e][0].n_docs for e in (1, 2, 3)] == list(np.cumsum(per_epoch[1:4]).astype(float))
    assert by_epoch[3][0].n_docs == corpus.n_stream

    # --- release.latest, the snapshot file and latest.json / HTTP agree with the topic
    last = run["last"]
    assert last.release_id == by_epoch[3][0].release_id
    files = sorted(Path(cfg.snapshot_dir).glob("epoch-*.msgpack"))
    assert [f.name for f in files] == [f"epoch-{e:06d}-{by_epoch[e][0].release_id}.msgpack"
                                       for e in (1, 2, 3)]
    on_disk = TopicSnapshot.from_bytes(files[-1].read_bytes())
    assert on_disk.release_id == last.release_id
    np.testing.assert_array_equal(on_disk.topic_word, last.topic_word)
    latest = json.loads((Path(cfg.snapshot_dir) / "latest.json").read_text())
    assert latest["release_id"] == last.release_id and latest["epoch"] == 3
    assert run["latest_http"]["release_id"] == last.release_id
    assert len(latest["topics"]) == corpus.topics.shape[0]
    # and the topics are the true ones (non-private: close to the truth)
    assert matched_topic_error(corpus.topics, last.topic_word)["l2_mean"] < 0.03

    # --- the sketchers dropped the raw sums of released epochs (raw state lives one epoch)
    assert sorted(run["states"]) == [0, 1]
    for st in run["states"].values():
        assert all(e > 3 for e in st.epochs) and st.warmup is None


def test_metrics_over_http(nonprivate_run):
    run = nonprivate_run
    corpus = run["corpus"]
    assert set(run["health"].values()) == {200}
    sk = run["sketcher_metrics"]
    docs_by_partition: dict[str, float] = {}
    for s in sk:
        for p, v in metric_by(s, "streamdp_documents_total", "partition").items():
            docs_by_partition[p] = docs_by_partition.get(p, 0.0) + v
    assert set(docs_by_partition) == {"0", "1"}
    # streamdp_documents_total counts every document added to a sketch: the warm-up
    # sketch (warm-up documents) and the epoch sketches (stream documents)
    assert sum(docs_by_partition.values()) == corpus.n_warm + corpus.n_stream
    states = run["states"]
    assert sum(st.counters["documents"] for st in states.values()) == corpus.n_stream
    assert sum(st.counters["warmup_documents"] for st in states.values()) == corpus.n_warm
    for p, st in states.items():
        assert docs_by_partition[str(p)] == st.counters["documents"] + st.counters["warmup_documents"]
    cb = corpus.counts()
    assert sum(metric(s, "streamdp_tokens_total") for s in sk) == int(cb.n_tokens.sum())
    assert sum(metric(s, "streamdp_unknown_tokens_total") for s in sk) == int(cb.n_unknown.sum())
    assert sum(metric(s, "streamdp_dlq_messages_total") for s in sk) == 0
    assert sum(metric(s, "streamdp_documents_skipped_total") for s in sk) == 0
    assert sum(metric(s, "streamdp_assigned_partitions") for s in sk) == 2
    assert all(metric(s, "streamdp_checkpoints_total") >= 1 for s in sk)
    assert all(metric(s, "streamdp_last_progress_timestamp_seconds") > 0 for s in sk)

    rel = run["release_metrics"]
    assert metric(rel, "streamdp_releases_total", outcome="published") == corpus.epochs
    assert metric(rel, "streamdp_releases_total", outcome="refused_budget") == 0
    assert metric(rel, "streamdp_releases_total", outcome="failed") == 0
    assert metric(rel, "streamdp_epochs_closed_total") == corpus.epochs
    assert metric(rel, "streamdp_tree_epoch") == corpus.epochs
    assert metric(rel, "streamdp_tree_horizon") == corpus.epochs
    assert metric(rel, "streamdp_last_release_timestamp_seconds") == pytest.approx(
        run["last"].created_at)
    # non-private: nothing spent (the budget gauges stay at 0 / are not set)
    assert metric(rel, "streamdp_privacy_epsilon_spent") == 0
    assert metric(rel, "streamdp_release_duration_seconds_count") == corpus.epochs


# =================================================================== private (test 2)
@pytest.mark.slow
def test_end_to_end_private(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(10_000, 20_000, 3, seed=1)
    names = fresh_topics(bootstrap)
    eps = 2.0
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=eps, sampler="fast",
                      noise_seed=11)
    pipe = Pipeline(cfg, sketchers=2)
    try:
        pipe.start()
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "flush", through=corpus.epochs)
        last = pipe.wait_released(corpus.epochs, timeout=90)
        wait_for(lambda: pipe.release.server is not None, 10, "the release metrics server")
        rel = scrape_until(pipe.release.server.url, lambda m: metric(
            m, "streamdp_releases_total", outcome="published") >= 3, 10, "the release metrics")
    finally:
        pipe.stop()

    by_epoch = snapshots_by_epoch(bootstrap, names.snapshots)
    assert sorted(by_epoch) == [1, 2, 3]
    assert_one_snapshot_per_epoch(by_epoch)
    assert by_epoch[3][0].release_id == last.release_id

    engine = engine_snapshots(corpus, epsilon=eps, noise_seed=12)
    err_svc = matched_topic_error(corpus.topics, last.topic_word)["l2_mean"]
    err_eng = matched_topic_error(corpus.topics, engine[-1].topic_word)["l2_mean"]
    # measured: both ≈ 0.011–0.013 (non-private ≈ 0.004); topics have L2 norm ≈ 0.25
    assert err_svc < 0.04 and err_eng < 0.04, (err_svc, err_eng)
    assert err_svc < 2 * err_eng and err_eng < 2 * err_svc, (err_svc, err_eng)
    assert abs(last.n_docs - corpus.n_stream) < 0.05 * corpus.n_stream   # noised count

    pr = last.privacy
    assert pr["mechanism"] == "blt" and last.mechanism == "blt"      # the default aggregator
    assert pr["epochs_covered"] == [1, 3] and pr["horizon"] == 3 and pr["blt"]["nbuf"] == 4
    assert pr["epsilon"] == eps and pr["delta"] == 1e-6 and pr["sampler"]
    acc = pr["accountant"]
    assert acc["rho_budget"] == pytest.approx(pr["rho_budget"])
    assert acc["rho_worst_case"] <= acc["rho_budget"] * (1 + 1e-9)
    assert acc["epsilon_worst_case"] <= eps * (1 + 1e-9)
    assert acc["uncommitted"] == 0 and acc["refusals"] == 0
    # warm-up (clip quantiles + subspace) spent its full share; the stream (BLT) at most that
    assert acc["rho_by_atom"]["warmup"] == pytest.approx(acc["rho_budget"], rel=1e-6)
    assert acc["rho_worst_case"] == pytest.approx(acc["rho_budget"], rel=1e-6)

    # --- the ledger file shows the spend: every tree epoch reserved once and committed
    recs = FileLedger(cfg.ledger).read()
    assert recs[0].kind == "budget" and recs[0].payload["epsilon"] == eps
    labels = [r.payload.get("label") for r in recs if r.kind == "reserve"]
    assert [x for x in labels if x.startswith("tree:epoch=")] == [f"tree:epoch={e}" for e in (1, 2, 3)]
    assert [x for x in labels if x.startswith("tree:premise:")] == [
        f"tree:premise:epoch={e}" for e in (1, 2, 3)]
    reserved = {r.key for r in recs if r.kind == "reserve"}
    committed = {r.key for r in recs if r.kind == "commit"}
    assert reserved == committed and len(reserved) == acc["reservations"]
    assert not [r for r in recs if r.kind == "refuse"]

    # --- the release service's budget metrics
    assert metric(rel, "streamdp_releases_total", outcome="published") == 3
    assert metric(rel, "streamdp_privacy_epsilon_budget") == eps
    assert 0 < metric(rel, "streamdp_privacy_epsilon_spent") <= eps * (1 + 1e-9)
    assert metric(rel, "streamdp_privacy_rho_spent") == pytest.approx(acc["rho_worst_case"])


# =================================================================== dead-letter (test 3)
def _packb(obj, **kw) -> bytes:
    return msgpack.packb(obj, use_bin_type=kw.pop("use_bin_type", True), **kw)


def bad_messages(ts: float, max_bytes: int, max_tokens: int, vocab_id: str) -> list[tuple[str, str, bytes | None]]:
    """(key, expected error class, raw value) — one per input error class (and a few more)."""
    good = {"v": 1, "id": "x", "ts": ts}
    return [
        ("bad-msgpack", "malformed_msgpack", b"\xc1"),
        ("bad-truncated", "malformed_msgpack", _packb({**good, "text": "goal match"})[:-3]),
        ("bad-null", "malformed_msgpack", None),
        ("bad-version", "unsupported_version", _packb({**good, "v": 2, "text": "goal match team"})),
        ("bad-missing-id", "missing_field", _packb({"v": 1, "ts": ts, "text": "goal match team"})),
        ("bad-ts-string", "wrong_type", _packb({**good, "ts": "2024-01-01", "text": "goal match"})),
        ("bad-not-a-map", "wrong_type", _packb([1, 2, 3])),
        # text as msgpack *bin* and as a msgpack *str* holding invalid UTF-8
        ("bad-utf8-bin", "invalid_utf8", _packb({**good, "text": b"caf\xe9 goal"})),
        ("bad-utf8-str", "invalid_utf8", _packb({**good, "text": b"caf\xe9 goal"}, use_bin_type=False)),
        ("bad-empty", "empty_document", _packb({**good, "text": "   "})),
        ("bad-huge", "too_large", _packb({**good, "text": "goal " * (max_bytes // 5 + 10)})),
        ("bad-too-many-tokens", "too_large", _packb({**good, "text": "goal " * (max_tokens + 1)})),
        ("bad-negative-count", "invalid_value",
         _packb({**good, "counts": {"ids": [0, 1], "counts": [2, -1]}})),
        ("bad-out-of-range-id", "invalid_value",
         _packb({**good, "counts": {"ids": [0, 10_000_000], "counts": [1, 2]}})),
        ("bad-other-vocabulary", "invalid_value",
         _packb({**good, "counts": {"ids": [0, 1], "counts": [1, 2], "vocab": "0" * 16}})),
        ("bad-future-ts", "invalid_value", _packb({**good, "ts": ts + 86_400.0, "text": "goal match"})),
    ]


def test_dead_letter(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(1500, 3000, 2, seed=2)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=None,
                      max_document_bytes=64_000, max_document_tokens=5_000)
    vocab_id = corpus.vocabulary.id
    # bad messages interleaved with the good ones, in the warm-up and in both epochs,
    # each at the record time of the good document it follows
    inject_at = {200: "w", corpus.n_warm + 100: "e1", corpus.n_warm + 2500: "e2"}
    records, expected = [], {}
    for i in range(len(corpus.texts)):
        records.append(corpus.record(i))
        if i in inject_at:
            ts = float(corpus.ts[i])
            for key, cls, raw in bad_messages(ts, cfg.max_document_bytes, cfg.max_document_tokens,
                                              vocab_id):
                key = f"{key}-{inject_at[i]}"
                records.append((key, ts, raw))
                expected[key] = (cls, raw)
    # a well-formed 'counts' document refers to the vocabulary by id: accepted (not dead-lettered)
    pipe = Pipeline(cfg, sketchers=2)
    try:
        pipe.start()
        produce(bootstrap, names.documents, records)
        send_control(bootstrap, names, "flush", through=corpus.epochs)
        last = pipe.wait_released(corpus.epochs, timeout=90)
        wait_for(lambda: all(s.server is not None for s in pipe.sketchers), 10, "metrics servers")
        sk = [scrape(s.server.url) for s in pipe.sketchers]
    finally:
        pipe.stop()

    # --- every bad message is in the DLQ exactly once, value unchanged, with context headers
    docs = {r.key.decode(): r for r in read_topic(bootstrap, names.documents)}
    dlq = read_topic(bootstrap, names.dlq)
    got = {}
    for r in dlq:
        key = r.key.decode()
        assert key not in got, f"{key} dead-lettered twice"
        got[key] = r
    assert sorted(got) == sorted(expected)
    for key, (cls, raw) in expected.items():
        r, src = got[key], docs[key]
        h = {k: v.decode("utf-8") for k, v in r.headers.items()}
        assert h["streamdp.error.class"] == cls, (key, h)
        assert h["streamdp.error.message"] and len(r.headers["streamdp.error.message"]) <= 1024
        assert h["streamdp.source.topic"] == names.documents
        assert int(h["streamdp.source.partition"]) == src.partition
        assert int(h["streamdp.source.offset"]) == src.offset
        assert r.value == raw, key
        # error messages never quote the document's words
        assert "caf" not in h["streamdp.error.message"]

    # --- the counters match, by class
    counts: dict[str, float] = {}
    for s in sk:
        for cls, v in metric_by(s, "streamdp_dlq_messages_total", "error_class").items():
            counts[cls] = counts.get(cls, 0.0) + v
    want: dict[str, float] = {}
    for cls, _ in expected.values():
        want[cls] = want.get(cls, 0.0) + 1
    assert {c: v for c, v in counts.items() if v} == want
    assert sum(metric(s, "streamdp_dlq_dropped_total") for s in sk) == 0
    assert sum(metric(s, "streamdp_documents_total") for s in sk) == corpus.n_warm + corpus.n_stream

    # --- the sketch is the sketch of the good documents alone: the released non-private
    # snapshot equals the in-process engine's on the good documents
    engine = engine_snapshots(corpus, epsilon=None)
    assert last.epoch == corpus.epochs and last.n_docs == engine[-1].n_docs == corpus.n_stream
    np.testing.assert_allclose(last.topic_word, engine[-1].topic_word, rtol=0, atol=1e-8)


# =================================================================== single writer (test 5)
def test_single_release_writer(kafka_broker, tmp_path):
    from streamdp.services.release import LeaseHeld, ReleaseService

    corpus = make_corpus(10, 10, 1, seed=3)
    names = fresh_topics(kafka_broker.bootstrap)
    cfg = make_config(tmp_path, kafka_broker.bootstrap, names, corpus, epsilon=1.0)
    first = ReleaseService(cfg)
    try:
        with pytest.raises(LeaseHeld) as info:
            ReleaseService(cfg)
        msg = str(info.value)
        assert f"{cfg.ledger}.lease" in msg
        assert "only one release writer" in msg and "stop it first" in msg
        # another config object (e.g. another process's) on the same ledger path: same answer
        with pytest.raises(LeaseHeld):
            ReleaseService(cfg.replace(snapshot_dir=str(tmp_path / "other")))
    finally:
        first.close()
    # the lease dies with its holder: a successor can start
    second = ReleaseService(cfg)
    second.close()


# =================================================================== kill -9 at each step of a release (test 6)
KILL_CASES = [(None, "none", "tree")] + [(p, "tree:epoch=1", "tree") for p in
                                         ("after_reserve", "after_noise", "after_persist",
                                          "after_commit", "after_publish")] + [
    ("after_reserve", "warmup", "tree"), ("after_persist", "warmup", "tree"),
    ("before_post_process", "warmup", "tree")] + [
    (p, "tree:epoch=1", "blt") for p in ("after_reserve", "after_noise", "after_persist",
                                         "before_post_process")]


@pytest.mark.parametrize("point,what,aggregator", KILL_CASES,
                         ids=[f"{p}-{w}-{a}" for p, w, a in KILL_CASES])
def test_release_killed_at_each_step_then_restarted(kafka_broker, tmp_path, point, what,
                                                    aggregator):
    """SIGKILL the release service at one step of a release, restart it on the same ledger.

    Horizon T = 2 (depth 2, ρ_node = ρ/2). Before the spend protocol, a kill between
    reserve and the state write wasted the node's ρ and epoch 2 was refused forever
    (1 of 2 epochs released). Now: every epoch is released exactly once, every
    reservation is committed, and the accountant reports what a clean run reports —
    ρ_budget on the warm-up and on every stream epoch, no more.
    """
    from crash_helpers import ReleaseProcess
    from streamdp.privacy.accountant import Accountant

    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(2000, 2000, 2, seed=4)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=1.0, horizon=2,
                      sampler="fast", noise_seed=None, non_production=True,
                      continual_aggregator=aggregator)
    sketchers = Pipeline(cfg, sketchers=2, release=False)
    proc, restarted = None, None
    try:
        if point is not None:
            proc = ReleaseProcess(cfg, tmp_path, point, what)
            wait_for(proc.ready, 60, "the release subprocess")
            assert proc.proc.poll() is None, proc.log()[-3000:]
        sketchers.start()
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "flush", through=corpus.epochs)
        if proc is not None:
            try:
                rc = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"not killed at {point} of {what}:\n" + proc.log()[-3000:])
            assert rc == -signal.SIGKILL and proc.killed_at() == point, (rc, proc.log()[-3000:])
            rep = Accountant(cfg.epsilon, cfg.delta, cfg.ledger).report()
            assert rep["rho_worst_case"] <= rep["rho_budget"] * (1 + 1e-9)
        # --- restart on the same ledger and state topic
        restarted = Pipeline(cfg, sketchers=0)
        restarted.start()
        release = restarted.release
        last = restarted.wait_released(2, timeout=120)
        wait_for(lambda: release.server is not None, 10, "the release metrics server")
    finally:
        if proc is not None:
            proc.ensure_dead()
        sketchers.stop()
        if restarted is not None:
            restarted.stop()

    assert release.exhausted is None and release.continual.epoch == 2
    # a tree of horizon 2 ends after epoch 2, said once (log, streamdp_releases_ended); BLT goes on
    ended = "horizon" if aggregator == "tree" else None
    assert release.releases_ended == ended
    assert [r for r in ("budget", "horizon", "other") if release.metrics.registry.get_sample_value(
        "streamdp_releases_ended", {"reason": r})] == ([ended] if ended else [])
    by_epoch = snapshots_by_epoch(bootstrap, names.snapshots)
    assert sorted(by_epoch) == [1, 2]                   # every epoch released ...
    assert_one_snapshot_per_epoch(by_epoch)             # ... once
    assert by_epoch[2][0].release_id == last.release_id
    if point == "before_post_process" and what == "warmup":
        # killed in the orthonormalisation of the persisted warm-up draw: the restart
        # post-processed that draw (same subspace), it did not draw the warm-up again
        np.testing.assert_allclose(release.subspace.Q, np.load(str(proc.marker) + ".Q.npy"),
                                   rtol=0, atol=1e-9)
    elif point == "before_post_process":
        # killed after the draw was persisted: the restart post-processed that draw (its
        # noised count is the snapshot's), it did not draw epoch 1 again (issue 23 item 4)
        drawn = float(Path(str(proc.marker) + ".count").read_text())
        assert by_epoch[1][0].n_docs == drawn

    acc = Accountant(cfg.epsilon, cfg.delta, cfg.ledger)
    rep = acc.report()
    B = rep["rho_budget"]
    # the clean run's report: warm-up and each stream epoch at exactly ρ_budget
    assert rep["uncommitted"] == 0 and rep["refusals"] == 0
    # warm-up (its premise check and 2 draws), each epoch's draw and its premise check (issue 23
    # item 2)
    assert rep["reservations"] == 7
    assert rep["rho_worst_case"] == pytest.approx(B, rel=1e-9)
    assert rep["rho_by_atom"]["warmup"] == pytest.approx(B, rel=1e-9)
    assert rep["epsilon_worst_case"] <= cfg.epsilon * (1 + 1e-9)
    parts = rep["rho_spent_by_partition"]
    if aggregator == "tree":
        assert rep["rho_by_atom"]["stream_worst_epoch_rho"] == pytest.approx(B, rel=1e-9)
        assert sorted(parts) == ["stream:epochs=1-1", "stream:epochs=1-2", "stream:epochs=2-2",
                                 "warmup"]
        # nodes at ρ_node = (1 − share)·B/2; the premise checks (share·B/2 each) of t = 1 on
        # [1, 1] and of t = 2 on the largest completing node [1, 2]
        for p in ("stream:epochs=1-1", "stream:epochs=1-2"):
            assert parts[p] == pytest.approx(B / 2, rel=1e-9)
        assert parts["stream:epochs=2-2"] == pytest.approx(B * (1 - PREMISE_SHARE) / 2, rel=1e-9)
    else:
        # BLT: epochs 1 and 2 charged at (c_0 + ε) and (c_1 + ε) times the unit plan (ε: the
        # rounding term), once each, the samplers' rounding included (charged_total); the
        # unit plan is calibrated so that T_max epochs are charged ≤ ρ
        from streamdp.privacy.blt import DEFAULT_MAX_EPOCHS, charged_total
        blt, agg = release.continual.blt_params, release.continual.tree
        eps = agg.rounding_ratio()
        c = blt.coefs(2) + eps
        expected = charged_total(agg.unit_events(), float(c.sum()), float((c * c).sum()), 2)
        assert agg.charged_rho_bound() <= B
        assert expected == pytest.approx(B * (1 - PREMISE_SHARE) * float(np.sum(c * c))
                                         / agg.charge_weight(), rel=1e-6)
        # each epoch's premise check is charged to every atom (share·B / T_max each)
        premise = 2 * B * PREMISE_SHARE / DEFAULT_MAX_EPOCHS
        assert sorted(parts) == ["stream", "warmup"]
        assert parts["stream"] == pytest.approx(expected + premise, rel=1e-9)
        assert rep["rho_by_atom"]["stream_worst_epoch_rho"] == pytest.approx(
            expected + premise, rel=1e-9)
    keys = [r.key for r in FileLedger(cfg.ledger).read() if r.kind == "reserve"]
    assert sorted(keys) == ["tree:epoch=1", "tree:epoch=2", "tree:premise:epoch=1",
                            "tree:premise:epoch=2", "warmup", "warmup-clip-histogram",
                            "warmup-premise"]
    assert by_epoch[2][0].privacy["accountant"]["uncommitted"] == 0


# =================================================================== one release writer (issue 15, items 1-2)
def ledgers_epsilon(paths, delta: float) -> float:
    """ε reached by the worst-off document over every reservation in ``paths`` together
    (two release services with two ledgers both spend the same documents' privacy)."""
    from streamdp.privacy.accountant import _event_from_dict, events_loads
    from streamdp.privacy.conversions import zcdp_epsilon
    events = []
    for p in paths:
        if Path(p).exists():
            seen = set()
            for r in FileLedger(p).read():
                if r.kind in ("reserve", "commit") and r.key not in seen:
                    seen.add(r.key)
                    events += [_event_from_dict(d) for d in r.payload["events"]]
    return zcdp_epsilon(events_loads(events).worst, delta) if events else 0.0


def release_manifests(bootstrap: str, state_topic: str, key: str) -> list[dict]:
    """Every manifest ever written for ``key`` (the raw log, before any compaction)."""
    from streamdp.kafka.state_store import manifest_key
    from streamdp.serialization import loads
    return [loads(r.value) for r in read_topic(bootstrap, state_topic)
            if r.key == manifest_key(key).encode() and r.value is not None]


def test_zombie_writer_is_fenced_at_kafka(kafka_broker, kafka_topics):
    """Measured on the embedded broker: init_transactions() by a newer producer with the same
    transactional.id fences the older one; its next write fails and reaches no reader."""
    from confluent_kafka import Producer
    from streamdp.kafka.state_store import StateStore, WriterFenced
    from streamdp.kafka.topics import client_config

    bootstrap, topic = kafka_broker.bootstrap, kafka_topics.state
    tid = f"{kafka_topics.documents}-release-writer"

    def writer():
        p = Producer(client_config(bootstrap, "producer", **{
            "transactional.id": tid, "enable.idempotence": True, "acks": "all"}))
        p.init_transactions(30)
        return StateStore(p, bootstrap, topic, owns_producer=True, transactional=True)

    old = writer()
    old.write("release/test", b"old-1", meta={"writer_epoch": 1})
    new = writer()                                    # fences `old`
    with pytest.raises(WriterFenced):
        old.write("release/test", b"zombie", meta={"writer_epoch": 1})
    with pytest.raises(WriterFenced):                 # and stays fenced
        old.write("release/other", b"zombie", meta={"writer_epoch": 1})
    new.write("release/test", b"new-1", meta={"writer_epoch": 2})
    assert new.read_latest("release/test").payload == b"new-1"
    assert new.read_latest("release/other") is None
    raw = [r.value for r in read_topic(bootstrap, topic)]
    assert not any(v is not None and b"zombie" in v for v in raw), "a fenced write reached the log"
    for s in (old, new):
        try:
            s.close()
        except Exception:       # noqa: BLE001 - the fenced producer may refuse to flush
            pass


def test_second_release_service_and_lost_ledger_are_refused(kafka_broker, tmp_path):
    """(a) a second `streamdp release` with another --ledger, started after the first has
    spent, refuses to start without fencing the first; (c) a lost ledger is refused at start,
    with the same ε and with ε raised to 8, naming the ledger and what Kafka says.
    Before the fix (issue 15): (a) both published epochs, ε 1.24 against a budget of 1;
    (c) ε = 1 under-counted, ε = 8 brought released documents to ε 4.4-6.4."""
    from streamdp.services.config import ConfigError
    from streamdp.services.release import ReleaseService

    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(2000, 2000, 2, seed=6)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path / "first", bootstrap, names, corpus, epsilon=1.0, horizon=2,
                      noise_seed=None, non_production=True)
    other = tmp_path / "second"
    cfg2 = cfg.replace(ledger=str(other / "ledger.jsonl"), snapshot_dir=str(other / "snapshots"))
    pipe = Pipeline(cfg, sketchers=2)
    try:
        pipe.start()
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "flush", through=corpus.epochs)
        pipe.wait_released(1, timeout=90)
        # ---- (a) a second release service, another ledger, while the first runs
        with pytest.raises(ConfigError) as info:
            ReleaseService(cfg2)
        msg = str(info.value)
        assert str(other / "ledger.jsonl") in msg and names.state in msg and "has spent" in msg
        assert "Fix:" in msg
        assert not (other / "ledger.jsonl").exists()       # no ledger silently created
        pipe.wait_released(2, timeout=90)                   # the first was not fenced ...
        assert pipe.release.fenced is None
    finally:
        pipe.stop()
    eps_a = ledgers_epsilon([cfg.ledger, cfg2.ledger], cfg.delta)
    by_epoch = snapshots_by_epoch(bootstrap, names.snapshots)
    assert sorted(by_epoch) == [1, 2]
    assert_one_snapshot_per_epoch(by_epoch)                 # ... and the only publisher
    assert eps_a <= cfg.epsilon * (1 + 1e-9), eps_a

    # ---- (c) the ledger is moved away: refused, with the same ε and with ε = 8
    ledger = Path(cfg.ledger)
    moved = ledger.with_name("moved-away.jsonl")
    ledger.rename(moved)
    with pytest.raises(ConfigError) as info:
        ReleaseService(cfg)
    msg = str(info.value)
    assert str(ledger) in msg and "missing or empty" in msg, msg
    assert names.state in msg and "release/tree" in msg and "Fix:" in msg
    assert not ledger.exists(), "a ledger was re-created for a deployment that has spent"
    # ε raised: the deployment contract refuses it first (issue 25), naming the recorded ε
    with pytest.raises(ConfigError, match="'epsilon': the deployment recorded 1.0"):
        ReleaseService(cfg.replace(epsilon=8.0))
    assert not ledger.exists(), "a ledger was re-created for a deployment that has spent"
    # an empty file in its place, or another deployment's ledger: refused too
    ledger.write_bytes(b"")
    with pytest.raises(ConfigError, match="missing or empty"):
        ReleaseService(cfg)
    ledger.unlink()
    from streamdp.privacy.accountant import Accountant
    Accountant(cfg.epsilon, cfg.delta, ledger)             # a fresh ledger with the same budget
    with pytest.raises(ConfigError, match="not the ledger of this deployment") as info:
        ReleaseService(cfg)
    assert "ledger head" in str(info.value)
    # the real ledger back, ε raised: refused (the budget of a deployment cannot change)
    moved.replace(ledger)
    with pytest.raises(ConfigError, match="cannot change"):
        ReleaseService(cfg.replace(epsilon=8.0))
    ReleaseService(cfg).close()                            # the deployment's own ledger: starts
    eps_c = ledgers_epsilon([cfg.ledger], cfg.delta)
    assert eps_c <= cfg.epsilon * (1 + 1e-9)
    print(f"\nε reached: (a) second service {eps_a:.4f}, (c) lost ledger {eps_c:.4f} (budget 1)")


def test_two_release_services_started_together(kafka_broker, tmp_path):
    """(b) two release services (two ledgers) started at the same time, before the warm-up
    closes: the later init_transactions fences the earlier; exactly one closes the warm-up,
    `release/subspace` is written once, and the sketches use that subspace.
    Before the fix (issue 15): both closed the warm-up (ε 1.45) and the second overwrote
    `release/subspace` with a subspace no sketch uses."""
    import threading

    from streamdp.services.config import ConfigError
    from streamdp.services.release import ReleaseService
    from streamdp.services import control

    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(2000, 2000, 2, seed=7)
    names = fresh_topics(bootstrap)
    cfgs = [make_config(tmp_path / n, bootstrap, names, corpus, epsilon=1.0, horizon=2,
                        noise_seed=None, non_production=True) for n in ("a", "b")]
    services, refused = [None, None], []
    barrier = threading.Barrier(2)

    def start(i):
        barrier.wait()
        try:
            services[i] = ReleaseService(cfgs[i])
        except ConfigError as exc:
            refused.append(exc)

    ts = [threading.Thread(target=start, args=(i,)) for i in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    live = [s for s in services if s is not None]
    assert live, refused
    sketchers = Pipeline(cfgs[0], sketchers=2, release=False)
    errors = []

    def run(svc):
        try:
            svc.run(install_signals=False, max_seconds=120, until_epoch=2)
        except BaseException as exc:     # noqa: BLE001
            errors.append(exc)
    runners = [threading.Thread(target=run, args=(s,), daemon=True) for s in live]
    try:
        for t in runners:
            t.start()
        sketchers.start()
        produce(bootstrap, names.documents, corpus.records())
        send_control(bootstrap, names, "flush", through=corpus.epochs)
        for t in runners:
            t.join(150)
    finally:
        for s in live:
            s.stop()
        sketchers.stop()
    assert not errors, errors
    writers = [s for s in live if s.fenced is None]
    assert len(writers) == 1, [(s.writer_epoch, s.fenced) for s in live]
    w = writers[0]
    assert w.writer_epoch == max(s.writer_epoch for s in live)
    assert w.continual is not None and w.continual.epoch == 2
    manifests = release_manifests(bootstrap, names.state, control.SUBSPACE_KEY)
    assert len({m["meta"]["subspace_id"] for m in manifests}) == 1, manifests
    assert manifests[0]["meta"]["writer_epoch"] == w.writer_epoch
    by_epoch = snapshots_by_epoch(bootstrap, names.snapshots)
    assert sorted(by_epoch) == [1, 2]
    assert_one_snapshot_per_epoch(by_epoch)
    assert {s.subspace_id for v in by_epoch.values() for s in v} == {manifests[0]["meta"]["subspace_id"]}
    eps_b = ledgers_epsilon([c.ledger for c in cfgs], cfgs[0].delta)
    assert eps_b <= 1.0 * (1 + 1e-9), eps_b
    print(f"\nε reached: (b) two services started together {eps_b:.4f} (budget 1); "
          f"refused at start: {len(refused)}, fenced while running: {len(live) - 1}")


def test_merge_refuses_sketches_with_other_clip_bounds_or_subspace(rng):
    from crash_helpers import random_subspace
    from streamdp.moments.clipping import ClipBounds
    from streamdp.moments.sketch import WhitenedSketch
    from streamdp.services.partition_state import PartitionState
    from streamdp.services.release import SketchMismatch, merge_epoch_sums

    sub = random_subspace(30, 4, seed=1)
    clip = ClipBounds.for_length(20)
    X = rng.integers(0, 3, size=(20, 30)).astype(float)
    X[:, 0] += 3

    def part(p, sk):
        st = PartitionState(topic="t", partition=p)
        st.epochs[1] = sk
        return st

    sk_a = WhitenedSketch(sub, clip)
    sk_a.update(X[:10])
    sk_b = WhitenedSketch(sub, clip)
    sk_b.update(X[10:])
    total, n = merge_epoch_sums([part(0, sk_a), part(1, sk_b)], 1, sub, clip)
    assert n == 2 and total.count == pytest.approx(sk_a.sums().count + sk_b.sums().count)
    wide = ClipBounds.for_length(5)
    assert wide != clip
    sk_c = WhitenedSketch(sub, wide)
    sk_c.update(X[10:])
    with pytest.raises(SketchMismatch, match="partition 1 epoch 1: sketch clipped with"):
        merge_epoch_sums([part(0, sk_a), part(1, sk_c)], 1, sub, clip)
    other = random_subspace(30, 4, seed=2)
    sk_d = WhitenedSketch(other, clip)
    sk_d.update(X[10:])
    with pytest.raises(SketchMismatch, match="subspace"):
        merge_epoch_sums([part(0, sk_a), part(1, sk_d)], 1, sub, clip)
