"""The start in the services (issue 22 item 3) on the embedded broker: ``start: public`` with a
public start file, the ``auto`` rule at the warm-up close, and restarts that keep the choice.

The public start is fitted without privacy on documents drawn from the corpus's topics
(standing in for documents the operator declares public, e.g. its help pages); it is not
any of the stream's documents.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from streamdp.privacy.ledger import FileLedger
from streamdp.services.config import ConfigError
from streamdp.services.contract import CONTRACT_KEY
from streamdp.services.produce import produce
from streamdp.services.release import ReleaseService
from streamdp.services.sketcher import Sketcher
from streamdp import PublicStart
from streamdp.refinement import BLOCK as REFINE_BLOCK
from streamdp.services import release_start
from streamdp.start import (WARMUP_MAX_NTS, choose_service_start, load_public_start,
                            save_public_start, warmup_noised_count, warmup_subspace_nts)

from service_helpers import (Pipeline, fresh_topics, make_config, make_corpus, read_topic,
                             send_control, wait_for)
from test_service_refinement import run_by_epoch


def public_documents(topics: np.ndarray, n: int, seed: int) -> sp.csr_matrix:
    """LDA documents from ``topics`` (k × d) as count rows: the operator's public documents."""
    rng = np.random.default_rng(seed)
    k, d = topics.shape
    theta = rng.dirichlet(np.full(k, 1.0 / k), size=n)
    lengths = rng.poisson(40, size=n) + 3
    rows = [rng.multinomial(l, th @ topics) for l, th in zip(lengths, theta)]
    return sp.csr_matrix(np.asarray(rows, dtype=np.float64))


def public_start_file(tmp_path, corpus, *, seed: int = 11, name: str = "public-start.json"):
    start = PublicStart.fit(public_documents(corpus.topics, 3000, seed), corpus.topics.shape[0],
                            source="test: help pages declared public", seed=0)
    path = tmp_path / name
    save_public_start(start, path, corpus.vocabulary)
    # the start as every service reads it (the file round trip renormalises the rows)
    return load_public_start(path, vocabulary_id=corpus.vocabulary.id,
                             n_topics=corpus.topics.shape[0]), str(path)


def matched_l1(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(k, k) L1 distances between the rows of a and b."""
    return np.abs(a[:, None, :] - b[None, :, :]).sum(axis=2)


def _reserve_labels(cfg) -> list[str]:
    return [r.payload.get("label") for r in FileLedger(cfg.ledger).read() if r.kind == "reserve"]


def _assert_node_split(cfg, share: float, epochs) -> None:
    """The ledger's ``tree:epoch=<e>`` reservations, one per epoch, each charging ``share`` of
    its rho to the refinement block: which node plan drew them."""
    reserved = {r.payload["label"]: r.payload["events"] for r in FileLedger(cfg.ledger).read()
                if r.kind == "reserve" and r.payload["label"].startswith("tree:epoch=")}
    assert sorted(reserved) == [f"tree:epoch={e}" for e in epochs]
    for label, events in reserved.items():
        rho = {}
        for ev in events:
            rho[ev["block"]] = rho.get(ev["block"], 0.0) + ev["rho"]
        # each epoch's charge (the BLT's atoms differ by epoch; the ledger's events carry the
        # rounding headroom in their sensitivities, ~1e-5) is split share / 1 - share
        assert rho[REFINE_BLOCK] == pytest.approx(share * sum(rho.values()), rel=1e-4), (label, rho)


@pytest.mark.slow
def test_public_start_end_to_end_and_restarts_keep_it(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(3000, 12_000, 3, seed=3)
    start, path = public_start_file(tmp_path, corpus)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path / "dep", bootstrap, names, corpus, epsilon=4.0, sampler="fast",
                      noise_seed=5, refinement=True, start="public", public_start_file=path)
    k = corpus.topics.shape[0]
    with Pipeline(cfg, sketchers=2) as pipe:
        assert pipe.release.start_choice is None          # chosen at the warm-up close
        snaps = run_by_epoch(pipe, bootstrap, names, corpus)
        choice = dict(pipe.release.start_choice)
    assert choice["start"] == "public" and choice["start_id"] == start.start_id

    # every epoch is refined: epochs 1, 2 (<= L = 2) against the public start (model epoch 0)
    assert [s.stage for s in snaps] == ["refined"] * 3
    assert [s.privacy["refinement"]["model_epoch"] for s in snaps] == [0, 0, 1]

    # the topics are the public fit's, topic i continuing public topic i, within the noise
    # of the refinement (the true topics are as close: the public fit is good)
    d_pub = matched_l1(snaps[0].topic_word, start.topic_word)
    assert np.all(d_pub.argmin(axis=1) == np.arange(k)), d_pub.argmin(axis=1)
    assert np.diag(d_pub).max() < 0.35, np.diag(d_pub)
    for s in snaps[1:]:
        assert np.all(matched_l1(s.topic_word, start.topic_word).argmin(axis=1) == np.arange(k))

    # the report lists the public input; the start spent nothing: the only reservations are
    # the warm-up's and the tree's (one per epoch), and the refinement sums get their share
    for s in snaps:
        pr = s.privacy
        assert pr["start"]["kind"] == "public" and pr["start"]["public_input"] is True
        assert pr["public_start"] == start.report()
        assert pr["public_start"]["rho"] == 0.0
        assert pr["public_start"]["source"] == "test: help pages declared public"
        assert pr["start"]["choice"]["rule"] == "configured (start: public)"
    labels = _reserve_labels(cfg)
    # each epoch: its noised premise check, then its draw (issue 23 item 2)
    assert [x for x in labels if not x.startswith("warmup")] == [
        k for e in (1, 2, 3) for k in (f"tree:premise:epoch={e}", f"tree:epoch={e}")]
    acc = snaps[-1].privacy["accountant"]
    assert acc["rho_worst_case"] == pytest.approx(acc["rho_budget"], rel=1e-6)

    # the public start's node plan (docs/privacy.md "The public start's node plan"): persisted
    # with the choice, refinement_share_public (0.9) of each node's rho on the refinement sums.
    # The ledger charges each node exactly its rho: the split changes sigma per block only
    assert choice["refinement_share"] == cfg.refinement_share_public == 0.9
    for s in snaps:
        assert s.privacy["refinement"]["share"] == 0.9
    rho_node = snaps[-1].privacy["rho_node"]
    _assert_node_split(cfg, 0.9, epochs=(1, 2, 3))
    assert sum(ev["rho"] for ev in snaps[-1].privacy["node_events"]) == pytest.approx(rho_node)
    # the continual selection rule: every release's refinement rows were folded into the public
    # start or into a release refined from it, an informative model (index inf), so the refined
    # topics are published, never the spectral half (bought with 10% of the node)
    for s in snaps:
        sel = s.privacy["topic_selection"]
        assert sel["published"] == "refinement" and sel["fold_model_snr"] is None, sel

    # --- a restart keeps the choice (read from the subspace record, not decided again) ...
    again = ReleaseService(cfg)
    try:
        assert again.start_choice == choice and again.public_start_chosen
        assert again.latest.release_id == snaps[-1].release_id
    finally:
        again.close()
    # ... and a configuration that changes it is refused before anything is written
    before = len(read_topic(bootstrap, names.state, timeout=5.0))
    _, other = public_start_file(tmp_path, corpus, seed=12, name="other-start.json")
    changes = {"tensor": dict(start="tensor", public_start_file=""),
               "auto": dict(start="auto"),
               "other file": dict(public_start_file=other),
               "public share": dict(refinement_share_public=0.5)}
    for what, change in changes.items():
        changed = dataclasses.replace(cfg, **change, ledger=str(tmp_path / f"{what}.jsonl"))
        for service in (ReleaseService, Sketcher):
            with pytest.raises(ConfigError, match="start") as err:
                service(changed)
            assert CONTRACT_KEY in str(err.value), (what, str(err.value))
    assert len(read_topic(bootstrap, names.state, timeout=5.0)) == before


def _auto_choice(bootstrap, tmp_path, corpus, path, *, drop_one: bool, tag: str):
    """A deployment with ``start: auto`` and a public start, closed through the warm-up only:
    (its persisted choice, the warm-up's noised count from the persisted draw)."""
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path / tag, bootstrap, names, corpus, epsilon=4.0, sampler="fast",
                      noise_seed=5, refinement=True, start="auto", public_start_file=path)
    recs = corpus.records()[:corpus.n_warm]
    if drop_one:                      # the neighbour: one warm-up document fewer
        recs = recs[1:]
    with Pipeline(cfg, sketchers=1) as pipe:
        produce(bootstrap, names.documents, recs)
        send_control(bootstrap, names, "close", through=0)
        wait_for(lambda: pipe.release.subspace is not None, 90, "the warm-up close",
                 check=pipe.check)
        choice = dict(pipe.release.start_choice)
        # the sketchers learn the choice from the public release record
        wait_for(lambda: pipe.sketchers[0].context.models.public_start is not None, 30,
                 "the sketcher reading the start", check=pipe.check)
        assert pipe.sketchers[0].context.models.public_start == (choice["start"] == "public")
    draw_payload = None
    from streamdp.services import control
    st = cfg.state_store()
    try:
        draw_payload = st.read_latest(control.WARMUP_DRAW_KEY)
        sub = st.read_latest(control.SUBSPACE_KEY)
    finally:
        st.close()
    assert sub.meta["start"] == choice                 # persisted with the subspace
    assert sub.meta["v"] == release_start.SUBSPACE_META_VERSION
    from streamdp.whitening.warmup import WarmupDraw
    draw = WarmupDraw.from_bytes(draw_payload.payload)
    released = (warmup_noised_count(draw.hist),
                warmup_subspace_nts(draw.Y, draw.events[0].sigma, corpus.topics.shape[0]))
    # a restart reads the choice back; it does not decide again
    again = ReleaseService(cfg)
    try:
        assert again.start_choice == choice
    finally:
        again.close()
    return choice, released


@pytest.mark.slow
def test_auto_start_reads_released_values_only_and_a_neighbour_gets_the_same(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(1500, 10, 1, seed=4)
    _, path = public_start_file(tmp_path, corpus)
    a, n_a = _auto_choice(bootstrap, tmp_path, corpus, path, drop_one=False, tag="a")
    b, n_b = _auto_choice(bootstrap, tmp_path, corpus, path, drop_one=True, tag="b")
    # the rule's inputs are the released (noised) warm-up count and the noise-to-signal of the
    # released (noised) warm-up range sum, nothing else of the data
    assert a["n_docs_noised"] == pytest.approx(n_a[0]) and b["n_docs_noised"] == pytest.approx(n_b[0])
    assert a["warmup_nts"] == pytest.approx(n_a[1]) and b["warmup_nts"] == pytest.approx(n_b[1])
    assert abs(a["n_docs_noised"] - corpus.n_warm) > 1e-6          # noised, not the raw count
    # the public start's node plan is persisted with the choice
    assert a["refinement_share"] == b["refinement_share"] == 0.9
    # a few thousand documents at eps = 4 with k = 6: the tensor index is below 15, so the
    # public start; the neighbouring deployment chooses the same
    assert a["start"] == b["start"] == "public", (a, b)
    assert a["rule_choice"] == "cluster" and a["index"] < 15


def _warmup_range(d: int, k: int, k_prime: int, sigma: float, seed: int = 0) -> np.ndarray:
    """A noised warm-up range sum: a rank-k signal with singular values 40…20 (independent of
    d, as a sum of clipped e2·Ω is) plus N(0, sigma²) in each of the d × k′ entries."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((d, k)))
    V, _ = np.linalg.qr(rng.standard_normal((k_prime, k)))
    return U @ np.diag(np.linspace(40.0, 20.0, k)) @ V.T + sigma * rng.standard_normal((d, k_prime))


def test_the_start_rule_sees_the_vocabulary_size_through_the_warmup_spectrum():
    """docs/services.md's demo table: with 20,000 words the tensor start was noise, yet the rule
    on the warm-up count alone chose it (index 17.7 >= 15). The warm-up's released range sum
    sees d: the same signal under the same noise sd is lost in a 20,000-word noise matrix."""
    k, kp, sigma, n, rho = 6, 12, 0.05, 20_000.0, 0.0244
    small = warmup_subspace_nts(_warmup_range(137, k, kp, sigma), sigma, k)
    large = warmup_subspace_nts(_warmup_range(20_000, k, kp, sigma), sigma, k)
    assert small < WARMUP_MAX_NTS < large
    # Wedin: the estimate is the sine of the subspace's angle to the k-th direction, roughly
    for d, nts in ((137, small), (20_000, large)):
        Y = _warmup_range(d, k, kp, sigma)
        Q = np.linalg.svd(Y, full_matrices=False)[0]
        U, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((d, k)))
        sin_k = np.sqrt(max(0.0, 1 - np.linalg.norm(Q.T @ U[:, -1]) ** 2))
        assert sin_k <= nts <= 4 * sin_k + 0.05, (d, sin_k, nts)
    for d, nts, want in ((137, small, "tensor"), (20_000, large, "public")):
        got = choose_service_start(n, rho, k, kp, public_available=True, warmup_nts=nts)
        assert got["index"] >= 15 and got["start"] == want, (d, got)
    # without noise nothing is lost; a k-th direction within the noise: infinite (null)
    assert warmup_subspace_nts(_warmup_range(137, k, kp, 0.0), None, k) == 0.0
    assert warmup_subspace_nts(_warmup_range(20_000, k, kp, 1.0), 1.0, k) == float("inf")
    lost = choose_service_start(n, rho, k, kp, public_available=True, warmup_nts=float("inf"))
    assert lost["start"] == "public" and lost["warmup_nts"] is None


def test_the_node_plan_follows_the_start_and_a_restart_keeps_it(tmp_path):
    """refinement_share_public applies only where the start is public; the share is persisted
    with the choice and a restart with another one is refused (docs/privacy.md "The public
    start's node plan")."""
    corpus = make_corpus(300, 10, 1, seed=4)
    public, path = public_start_file(tmp_path, corpus)
    cfg = _cfg(tmp_path, corpus, refinement_share=0.4, refinement_share_public=0.8,
               public_start_file=path)
    hist = np.full((1, 4), 5.0)
    Y = _warmup_range(len(corpus.vocabulary), corpus.topics.shape[0], 12, 0.01)
    for configured, want, share in (("public", "public", 0.8), ("tensor", "tensor", 0.4)):
        c = dataclasses.replace(cfg, start=configured,
                                public_start_file=path if configured == "public" else "")
        got = release_start.choose_start(c, public, c.refinement_config(), hist, 0.1, 12, Y, 0.01)
        assert got["start"] == want and got["refinement_share"] == share, got
        assert release_start.node_refinement(c, got).share == share
        assert "warmup_nts" in got["auto_rule"]          # what auto would have chosen, reported
        restored = release_start.restored_start(got, c, public)
        assert release_start.node_refinement(c, restored).share == share
        field = "refinement_share_public" if want == "public" else "refinement_share"
        with pytest.raises(ConfigError, match=field):
            release_start.restored_start(got, dataclasses.replace(c, **{field: 0.7}), public)
    # a choice persisted before the share was (no refinement_share): the plan it began with
    old = {"start": "public", "rule": "configured (start: public)", "start_id": public.start_id}
    c = dataclasses.replace(cfg, start="public")
    assert release_start.node_refinement(c, release_start.restored_start(old, c, public)).share == 0.4


def test_a_restart_reads_the_start_by_the_subspace_records_version(kafka_broker, tmp_path):
    """The start persisted in release/subspace's meta is read by the meta's version (``v``):
    a record written before it was versioned is read as today (no start: a deployment begun
    before issue 22, the tensor start; a start: that start), the current v1 as written, and a
    version this build does not know is refused at the restore with what to do - not read as
    if its ``start`` meant what v1's does. Fails before the version: v2 was read as v1."""
    from streamdp.moments.clipping import ClipBounds
    from streamdp.services import control
    from streamdp.services.release_restore import read_restored
    from streamdp.whitening.subspace import Subspace
    corpus = make_corpus(30, 30, 1, seed=2)
    cfg = make_config(tmp_path, kafka_broker.bootstrap, fresh_topics(kafka_broker.bootstrap),
                      corpus, epsilon=4.0, sampler="fast", noise_seed=5, refinement=True)
    d = len(corpus.vocabulary)
    sub = Subspace(np.linalg.qr(np.random.default_rng(0).standard_normal((d, 6)))[0])
    base = {"clip": ClipBounds.unclipped().to_dict(), "subspace_id": sub.id,
            "vocabulary_id": corpus.vocabulary.id, "warmup_documents": 30, "writer_epoch": 1}
    tensor = {"start": "tensor", "rule": "configured (start: tensor)", "refinement_share": 0.5}
    store = cfg.state_store()
    try:
        def restored(meta):
            store.write(control.SUBSPACE_KEY, sub.to_bytes(), meta={**base, **meta})
            return read_restored(store, cfg, corpus.vocabulary, None)
        old = restored({})                                  # before issue 22
        assert old.start_choice == {"start": "tensor", "rule": "before the start choice"}
        assert old.subspace.id == sub.id and old.refinement.share == cfg.refinement_share
        assert restored({"start": tensor}).start_choice == tensor      # unversioned, issue 22
        assert restored({"v": 1, "start": tensor}).start_choice == tensor
        with pytest.raises(ConfigError, match=r"release/subspace.*version 2.*newer streamdp"):
            restored({"v": 2, "start": tensor})
        with pytest.raises(ConfigError, match=r"release/subspace.*without the start choice"):
            restored({"v": 1})
    finally:
        store.close()


# ------------------------------------------------------------------ start-up refusals (no broker)
def _cfg(tmp_path, corpus, **changes):
    from streamdp.kafka.topics import TopicNames as Names
    names = Names.from_prefix("test.start-config")
    return make_config(tmp_path, "127.0.0.1:1", names, corpus,
                       **{"epsilon": 4.0, "sampler": "fast", "noise_seed": 5, "refinement": True,
                          **changes})


def test_start_configuration_is_validated_with_a_message_that_says_what_to_fix(tmp_path):
    from streamdp.services.contract import contract_of
    from streamdp.text.vocabulary import Vocabulary
    corpus = make_corpus(30, 30, 1, seed=1)
    with pytest.raises(ConfigError, match="'start'.*one of"):
        _cfg(tmp_path, corpus, start="spectral")
    with pytest.raises(ConfigError, match="'cluster'.*StreamingSpectralLDA only"):
        _cfg(tmp_path, corpus, start="cluster")
    with pytest.raises(ConfigError, match="public_start_file.*streamdp public-start"):
        _cfg(tmp_path, corpus, start="public")
    with pytest.raises(ConfigError, match="public_start_file.*no file at"):
        _cfg(tmp_path, corpus, start="public", public_start_file=str(tmp_path / "missing.json"))
    start, path = public_start_file(tmp_path, corpus)
    with pytest.raises(ConfigError, match="start is 'tensor'"):
        _cfg(tmp_path, corpus, start="tensor", public_start_file=path)
    with pytest.raises(ConfigError, match="needs refinement"):
        _cfg(tmp_path, corpus, start="public", public_start_file=path, refinement=False)
    ok = _cfg(tmp_path, corpus, start="public", public_start_file=path)
    assert contract_of(ok)["public_start_file"] == start.start_id
    assert contract_of(ok)["start"] == "public"
    # auto without a public start acts as the tensor start: the contract says so
    assert contract_of(_cfg(tmp_path, corpus, start="auto"))["start"] == "tensor"
    # wrong number of topics, wrong vocabulary: refused when the contract is computed, which
    # every service does at start-up before writing anything
    wrong_k = tmp_path / "k.json"
    save_public_start(PublicStart(start.topic_word[:-1], start.alpha[:-1], "x"), wrong_k,
                      corpus.vocabulary)
    with pytest.raises(ConfigError, match=r"5 topics.*n_topics is 6.*--topics 6"):
        contract_of(_cfg(tmp_path, corpus, start="public", public_start_file=str(wrong_k)))
    other_words = Vocabulary([f"w{i}" for i in range(len(corpus.vocabulary))])
    wrong_v = tmp_path / "v.json"
    save_public_start(start, wrong_v, other_words)
    with pytest.raises(ConfigError, match="fitted on vocabulary .* the deployment's vocabulary is"):
        contract_of(_cfg(tmp_path, corpus, start="public", public_start_file=str(wrong_v)))
    not_json = tmp_path / "bad.json"
    not_json.write_text("topics")
    with pytest.raises(ConfigError, match="cannot read .* as a public start file"):
        contract_of(_cfg(tmp_path, corpus, start="public", public_start_file=str(not_json)))


def test_cli_public_start_writes_a_file_the_services_accept(tmp_path):
    """`streamdp public-start` fits on public documents (JSONL) and writes the file that
    'public_start_file' reads, for the deployment's vocabulary and n_topics."""
    import json
    import subprocess
    import sys
    corpus = make_corpus(30, 30, 1, seed=2)
    vocab = tmp_path / "vocabulary.txt"
    corpus.vocabulary.save(vocab)
    from streamdp.services.demo_corpus import sample_texts
    texts, _, _ = sample_texts(600, seed=2)       # the same topics, other documents
    src = tmp_path / "public.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "start.json"
    run = subprocess.run([sys.executable, "-m", "streamdp", "public-start", "--in", str(src),
                          "--vocabulary", str(vocab), "--topics", "6", "--source", "help pages",
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "privacy cost: none" in run.stdout
    start = load_public_start(out, vocabulary_id=corpus.vocabulary.id, n_topics=6)
    assert start.source == "help pages" and start.n_public_docs == 600
    # each fitted topic is one of the corpus's topics (a good public fit, in some order)
    d = matched_l1(start.topic_word, corpus.topics)
    assert sorted(d.argmin(axis=1).tolist()) == list(range(6)), d.round(2)
    cfg = _cfg(tmp_path, corpus, start="public", public_start_file=str(out))
    assert cfg.load_public_start(corpus.vocabulary.id).start_id == start.start_id


def test_the_model_rule_with_a_public_start_holds_until_the_start_is_known_and_loaded():
    """The one rule (refinement.model_epoch_for / FoldInModels) with a public start: epochs
    1..L fold into model epoch 0, and only once it is loaded; with start auto not yet chosen
    (public_start None) they are not decided at all."""
    from streamdp.refinement import (FoldInModels, ModelNotDecided, RefinementModel,
                                     epoch_refined, model_epoch_for)
    assert [model_epoch_for(e, 2) for e in (1, 2, 3)] == [None, None, 1]
    assert [model_epoch_for(e, 2, public_start=True) for e in (1, 2, 3)] == [0, 0, 1]
    assert epoch_refined(1, 2, True) and not epoch_refined(1, 2)
    m0 = RefinementModel(np.full((3, 5), 0.2), np.ones(3), "public", 5, 0)
    unknown = FoldInModels(2, public_start=None)
    assert not unknown.decided(1) and not unknown.decided(2) and not unknown.decided(3)
    with pytest.raises(ModelNotDecided, match="not chosen yet"):
        unknown.model_for(1)
    public = FoldInModels(2, public_start=True)
    assert not public.decided(1)                  # the start's model is not loaded yet
    with pytest.raises(ModelNotDecided, match="not loaded yet"):
        public.model_for(2)
    public.models[0] = m0
    assert public.decided(1) and public.model_for(2) is m0
    assert not public.decided(3)                  # epoch 1 not closed yet
    for e in (1, 2):                              # epochs 1, 2 released: model 0 no longer needed
        public.released(RefinementModel(np.full((3, 5), 0.2), np.ones(3), f"r{e}", 5, e))
    assert 0 not in public.models and public.model_for(3).model_id == "r1"
    tensor = FoldInModels(2)
    assert tensor.decided(1) and tensor.model_for(1) is None


def test_demo_refuses_a_public_start_without_a_vocabulary_known_beforehand():
    from streamdp.services.demo import run_demo
    with pytest.raises(ValueError, match="--start public needs a vocabulary"):
        run_demo(start="public", vocabulary="private", out=lambda *_: None)
    with pytest.raises(ValueError, match="start must be"):
        run_demo(start="cluster", out=lambda *_: None)


@pytest.mark.slow
def test_a_restart_between_the_warmup_close_and_epoch_1_keeps_the_public_start(kafka_broker, tmp_path):
    """Every service stopped right after the warm-up closed with start: auto choosing the public
    start (no release state yet, only the subspace record and the public release record); the
    restarted ones read the choice back: epochs 1 and 2 are refined against the public start."""
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(1500, 6000, 3, seed=6)
    start, path = public_start_file(tmp_path, corpus)
    names = fresh_topics(bootstrap)
    cfg = make_config(tmp_path / "dep", bootstrap, names, corpus, epsilon=4.0, sampler="fast",
                      noise_seed=5, refinement=True, start="auto", public_start_file=path)
    recs = corpus.records()
    with Pipeline(cfg, sketchers=2) as pipe:
        produce(bootstrap, names.documents, recs[:corpus.n_warm])
        send_control(bootstrap, names, "close", through=0)
        wait_for(lambda: pipe.release.start_choice is not None, 90, "the warm-up close",
                 check=pipe.check)
        choice = dict(pipe.release.start_choice)
    assert choice["start"] == "public" and choice["rule_choice"] == "cluster"
    k = corpus.topics.shape[0]
    # new sketchers in a new consumer group (an operational field): they restore from the
    # sketch state records, like replaced pods (re-joining the old group can wait out the
    # embedded broker's rebalance, which is not what this test is about)
    with Pipeline(dataclasses.replace(cfg, group_id=cfg.group_id + "-after"), sketchers=2) as pipe:
        assert pipe.release.start_choice == choice
        snaps = []
        for e in range(1, corpus.epochs + 1):
            rows = [i for i in range(corpus.n_warm, len(recs))
                    if corpus.epoch_end(e - 1) <= corpus.ts[i] < corpus.epoch_end(e)]
            produce(bootstrap, names.documents, [recs[i] for i in rows])
            send_control(bootstrap, names, "flush", through=e)
            # generous: the new sketchers first wait out the consumer-group rebalance
            snaps.append(pipe.wait_released(e, timeout=120.0))
    assert [s.stage for s in snaps] == ["refined"] * 3
    assert [s.privacy["refinement"]["model_epoch"] for s in snaps] == [0, 0, 1]
    assert snaps[0].privacy["public_start"]["start_id"] == start.start_id
    d_pub = matched_l1(snaps[0].topic_word, start.topic_word)
    assert np.all(d_pub.argmin(axis=1) == np.arange(k)), d_pub.round(2)
    # the restarted service noises every node with the node plan persisted with the choice
    # (refinement_share_public of each node's rho on the refinement sums), never with the
    # configuration's refinement_share: what the ledger charged per block says which plan drew
    assert choice["refinement_share"] == cfg.refinement_share_public == 0.9 != cfg.refinement_share
    _assert_node_split(cfg, 0.9, epochs=(1, 2, 3))
    for s in snaps:
        assert s.privacy["refinement"]["share"] == 0.9
