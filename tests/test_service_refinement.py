"""Refinement in the services (issue 10 item 2) on the embedded broker.

Documents are produced one epoch at a time, as a live feed arrives: epoch e+1's
documents reach the sketchers after the release of epoch e, so they are folded into it.
"""
from __future__ import annotations

import numpy as np
import pytest

from streamdp.privacy.ledger import FileLedger
from streamdp.refinement import BLOCK as REFINE_BLOCK
from streamdp.services.produce import produce
from streamdp.services.sketcher import Sketcher

from service_helpers import Pipeline, fresh_topics, make_config, make_corpus, send_control, wait_for


def epoch_rows(corpus, e: int) -> np.ndarray:
    """Rows produced in round e: the warm-up with epoch 1, then each epoch's stream rows."""
    idx = np.arange(len(corpus.texts))
    ep = np.floor((corpus.ts - corpus.stream_start) / corpus.epoch_seconds).astype(int) + 1
    ep = np.where(idx < corpus.n_warm, 1, np.clip(ep, 1, corpus.epochs))
    return np.flatnonzero(ep == e)


def produce_epoch(bootstrap, names, corpus, e: int) -> None:
    recs = corpus.records()
    produce(bootstrap, names.documents, [recs[i] for i in epoch_rows(corpus, e)])
    send_control(bootstrap, names, "flush", through=e)


def wait_folding(pipe: Pipeline, e: int, timeout: float = 90.0):
    """Epoch e released. (No need to wait for the sketchers to load its model: the documents of
    epoch e + L are folded into it by the public rule, held until they have it.)"""
    return pipe.wait_released(e, timeout=timeout)


def run_by_epoch(pipe: Pipeline, bootstrap, names, corpus, on_epoch=None) -> list:
    snaps = []
    for e in range(1, corpus.epochs + 1):
        produce_epoch(bootstrap, names, corpus, e)
        if on_epoch is not None:
            on_epoch(e)
        snaps.append(wait_folding(pipe, e) if e < corpus.epochs else pipe.wait_released(e))
    return snaps


@pytest.mark.slow
def test_private_refinement_end_to_end(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(6000, 24_000, 3, seed=3)
    names = fresh_topics(bootstrap)
    eps = 4.0
    cfg = make_config(tmp_path, bootstrap, names, corpus, epsilon=eps, sampler="fast",
                      noise_seed=5, refinement=True)
    assert cfg.refinement_model_lag == 2          # the default: epoch e into snapshot e - 2
    with Pipeline(cfg, sketchers=2) as pipe:
        snaps = run_by_epoch(pipe, bootstrap, names, corpus)
        latest_json = pipe.release.latest_json()

    # --- stages: releases 1, 2 are spectral (no model: e - 2 < 1), 3 refined (snapshot 1)
    assert [s.epoch for s in snaps] == [1, 2, 3]
    assert [s.stage for s in snaps] == ["spectral", "spectral", "refined"]
    for s in snaps[:2]:
        assert s.noise_to_signal is None and s.fold_in_topics is None
        assert s.privacy["refinement"]["refined"] is False
        assert s.privacy["refinement"]["model_epoch"] is None
    s = snaps[2]
    assert s.noise_to_signal.shape == (corpus.topics.shape[0],)
    assert s.fold_in_topics.shape == s.topic_word.shape
    assert s.privacy["refinement"]["refined"] is True
    assert s.privacy["refinement"]["model_epoch"] == 1 and s.privacy["refinement"]["model_lag"] == 2
    assert latest_json["stage"] == "refined" and "quality_note" in latest_json
    # the continual selection rule ran in the release service (one implementation,
    # ContinualRelease.post_process): its record and the published source agree
    assert [x.topic_source for x in snaps[:2]] == ["spectral", "spectral"]
    assert s.topic_source == s.privacy["topic_selection"]["published"]
    assert s.privacy["topic_selection"]["rule"].startswith("spectral iff")

    # --- topic identity: topic i of the refined release is closest (L1) to topic i of its
    # model (snapshot 1) for most topics
    k = corpus.topics.shape[0]
    for a, b in [(snaps[0], snaps[2])]:
        dist = np.abs(b.topic_word[:, None, :] - a.topic_word[None, :, :]).sum(axis=2)   # (k, k)
        same = int(np.sum(dist.argmin(axis=1) == np.arange(k)))
        assert same >= k - 1, (a.epoch, b.epoch, same, dist.argmin(axis=1))

    # --- the refinement events are in the privacy report (the unit plan of each epoch's noise)
    pr = snaps[-1].privacy
    blocks = [ev["block"] for ev in pr["node_events"]]
    assert REFINE_BLOCK in blocks
    rho_ref = sum(ev["rho"] for ev in pr["node_events"] if ev["block"] == REFINE_BLOCK)
    rho_all = sum(ev["rho"] for ev in pr["node_events"])
    assert rho_all == pytest.approx(pr["rho_node"], rel=1e-9)
    assert rho_ref == pytest.approx(cfg.refinement_share * pr["rho_node"], rel=1e-9)

    # --- no extra spend: the stream atoms carry what the aggregator says a document has cost
    # (BLT, the default: ρ_unit·Σ_{j<3} c_j² ≤ ρ; the warm-up atom spent the whole budget)
    acc = pr["accountant"]
    assert pr["mechanism"] == "blt"
    assert acc["rho_worst_case"] == pytest.approx(acc["rho_budget"], rel=1e-6)
    assert acc["rho_by_atom"]["stream_worst_epoch_rho"] == pytest.approx(
        pr["rho_spent_per_document"], rel=1e-9)
    assert pr["rho_per_document"] == pytest.approx(acc["rho_budget"], rel=1e-9)
    assert acc["uncommitted"] == 0 and acc["refusals"] == 0
    recs = FileLedger(cfg.ledger).read()
    labels = [r.payload.get("label") for r in recs if r.kind == "reserve"]
    assert [x for x in labels if x.startswith("tree:epoch=")] == [f"tree:epoch={e}" for e in (1, 2, 3)]


def _exact_refine(pipe: Pipeline) -> np.ndarray:
    return np.array(pipe.release.continual._exact.refine, copy=True)


@pytest.mark.slow
def test_sketcher_crash_mid_epoch_gives_the_clean_refinement(kafka_broker, tmp_path):
    """Non-private (exact sums): a sketcher killed mid-epoch (state since its last checkpoint
    lost) and replaced releases the same refinement sums as a clean run."""
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(1500, 6000, 3, seed=4)

    def run(tag: str, crash: bool):
        names = fresh_topics(bootstrap)
        # lag 1 (non_production only: each epoch is produced after the release before it):
        # epoch 2, the one crashed in, is refined against snapshot 1
        cfg = make_config(tmp_path / tag, bootstrap, names, corpus, epsilon=None, refinement=True,
                          batch_size=50, checkpoint_seconds=0.3, refinement_model_lag=1)
        pipe = Pipeline(cfg, sketchers=1)
        crashed = {}

        def on_epoch(e):
            if not crash or e != 2:
                return
            w = pipe.sketchers[0]
            n_epoch2 = len(epoch_rows(corpus, 2))
            # a checkpoint holds some of epoch 2's refinement sums, not all of them
            wait_for(lambda: any(2 in st.refine and 0 < st.refine[2].n_docs for st in
                                 list(w.states.values())) and w._accepted, 60,
                     "epoch 2 refinement sums in the sketcher", check=pipe.check)
            done = sum(st.refine[2].n_docs for st in list(w.states.values()) if 2 in st.refine)
            crashed["at"] = done
            # crash: no more checkpoints, the in-memory progress since the last one is lost
            w.checkpoint = lambda p: None
            w.checkpoint_all = lambda: None
            w.stop()
            wait_for(lambda: not pipe.threads[0].is_alive(), 30, "the sketcher thread to stop")
            new = Sketcher(cfg, instance="sketcher-replacement")
            pipe.sketchers[0] = new
            pipe.threads[0] = __import__("threading").Thread(
                target=pipe._target(new.run), daemon=True, name=new.instance)
            pipe.threads[0].start()
            assert done < n_epoch2 or True     # (usually mid-epoch; the sums must match anyway)

        with pipe:
            snaps = run_by_epoch(pipe, bootstrap, names, corpus, on_epoch=on_epoch)
            T = _exact_refine(pipe)
        return snaps, T, crashed

    clean, T_clean, _ = run("clean", False)
    crashed, T_crash, info = run("crash", True)
    assert info.get("at") is not None
    assert [s.stage for s in clean] == ["spectral", "refined", "refined"]
    assert [s.stage for s in crashed] == [s.stage for s in clean]
    assert [s.n_docs for s in crashed] == [s.n_docs for s in clean]
    # Σ_iw T_iw = Σ_d l_d/‖c_d‖₂ over the folded documents: model-free, so a document lost
    # or doubled shows here whatever model it was folded into
    assert T_crash.sum() == pytest.approx(T_clean.sum(), rel=1e-10)
    assert T_clean.sum() > 0
    # the same model (snapshot e - 1) for every document in both runs: the same sums
    np.testing.assert_allclose(T_crash, T_clean, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(crashed[-1].topic_word, clean[-1].topic_word, rtol=0, atol=1e-8)


@pytest.mark.slow
def test_refinement_sums_do_not_depend_on_poll_batches(kafka_broker, tmp_path):
    """Issue 15, the public model rule on the broker: the whole feed is produced at once (a
    replay), so the sketchers read epoch e's documents while releases happen in between and
    hold each partition at its first document whose model (snapshot e − 2) is not released.
    Sketchers reading 1 record per poll or 500 release bit-identical refinement sums — each
    document's model depends on its own epoch, not on batch boundaries or timing — and the
    same sums (to rounding) as the estimator's continual path on the same documents."""
    bootstrap = kafka_broker.bootstrap
    corpus = make_corpus(1500, 3000, 4, seed=6)
    out = {}
    # 500 also with the fold-in on the sketcher's second thread (refinement_thread)
    for batch, thread in ((1, False), (500, False), (500, True)):
        names = fresh_topics(bootstrap)
        cfg = make_config(tmp_path / f"batch{batch}{thread}", bootstrap, names, corpus, epsilon=None,
                          refinement=True, batch_size=batch, checkpoint_seconds=0.3,
                          refinement_thread=thread)
        with Pipeline(cfg, sketchers=1) as pipe:
            produce(bootstrap, names.documents, corpus.records())
            send_control(bootstrap, names, "flush", through=corpus.epochs)
            snaps = [pipe.wait_released(e, timeout=180) for e in range(1, corpus.epochs + 1)]
            out[batch, thread] = (_exact_refine(pipe), pipe.release.latest, pipe.sketchers[0].model_holds)
        assert snaps[-1].epoch == corpus.epochs
    (T1, last1, holds1), (T500, last500, holds500) = out[1, False], out[500, False]
    assert holds1 >= 1 and holds500 >= 1          # the partitions were held for their models
    assert T1.sum() > 0 and last1.stage == "refined" and last1.privacy["refinement"]["model_epoch"] == 2
    np.testing.assert_array_equal(T1, T500)      # bit for bit
    np.testing.assert_array_equal(last1.topic_word, last500.topic_word)
    np.testing.assert_array_equal(T1, out[500, True][0])
    np.testing.assert_array_equal(last1.topic_word, out[500, True][1].topic_word)

    # the estimator (one process, the same rule, documents added before any epoch closes)
    from streamdp import EpochClock, StreamingSpectralLDA
    cb = corpus.counts()
    m = StreamingSpectralLDA(corpus.topics.shape[0], 1.0, epsilon=None, delta=1e-6, seed=0,
                             epochs=EpochClock(corpus.stream_start, corpus.epoch_seconds),
                             horizon=corpus.epochs, refinement=True)
    m.warmup(cb.counts[:corpus.n_warm])
    m.partial_fit(cb.counts[corpus.n_warm:], np.asarray(corpus.ts[corpus.n_warm:], dtype=np.float64))
    esnaps = m.close_epochs(corpus.epoch_end(corpus.epochs))
    assert [s.stage for s in esnaps] == ["spectral", "spectral", "refined", "refined"]
    np.testing.assert_allclose(m.continual_._exact.refine, T1, rtol=1e-9, atol=1e-9)
