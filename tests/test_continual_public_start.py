"""A continual estimator's start (``StreamingSpectralLDA(epochs=..., start=...)``).

Privacy promises tested here, each against an adversary:
- a careless caller who passes a start continual mode has no use for ("cluster", a
  ClusterStartConfig) is refused at construction, not served tensor-start releases silently;
- a public start (the services' ``start: public``) spends nothing on the start: every node is
  charged the tensor-start plan's node ρ (same total per epoch, a different split between the
  spectral blocks and the refinement sums), and every snapshot's report lists the public input;
- a public start fitted on another vocabulary is refused on the first warm-up batch, before any
  draw (nothing in the ledger).
The chain itself is checked against the services' public chain as benchmarks/service_start.py
rebuilds it (epochs 1…L folded into the start, every epoch refined): the same releases.
"""
from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import streamdp
from streamdp import EpochClock, PublicStart, RefinementConfig, StreamingSpectralLDA
from streamdp.privacy.accountant import Accountant
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.refinement import BLOCK as REFINE_BLOCK
from streamdp.refinement import PUBLIC_START_SHARE
from streamdp.synthetic import make_lda_model, sample_documents

K, D, R, EPS = 5, 300, 4, 2.0


@pytest.fixture(scope="module")
def data():
    model = make_lda_model(D, K, alpha0=1.0, beta=0.1, seed=3)
    X = sample_documents(model, 14_000, mean_length=40, seed=4)
    public = sample_documents(model, 2_000, mean_length=40, seed=9)   # "their help pages"
    return model, X[:5_000], X[5_000:], PublicStart.fit(public, K, source="help pages", seed=0)


def _continual(**kw):
    return dict(epsilon=EPS, delta=1e-6, epochs=EpochClock(0.0, 1.0), horizon=R, **kw)


def _run(est, X_warm, X_stream):
    """Warm up, then R epochs of equal length, closed one at a time."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.warmup(X_warm)
        ts = np.arange(X_stream.shape[0]) * R / X_stream.shape[0]
        snaps = []
        for t in range(1, R + 1):
            rows = np.flatnonzero((ts >= t - 1) & (ts < t))
            est.partial_fit(X_stream[rows], ts[rows])
            snaps += est.close_epochs(float(t))
    return snaps


def test_continual_mode_refuses_a_start_it_would_not_use(data):
    _, X_warm, X_stream, ps = data
    kw = _continual(sampler="fast", non_production=True)
    with pytest.raises(ValueError, match="not used in continual mode") as err:
        StreamingSpectralLDA(K, start="cluster", **kw)
    assert "streamdp.fit" in str(err.value)
    with pytest.raises(ValueError, match="cluster_start= is not used in continual mode"):
        StreamingSpectralLDA(K, cluster_start=streamdp.ClusterStartConfig(), **kw)
    # a public start is used only by the refinement, and must have this model's k topics
    with pytest.raises(ValueError, match="refinement=True"):
        StreamingSpectralLDA(K, start=ps, refinement=None, **kw)
    with pytest.raises(ValueError, match="n_topics=4"):
        StreamingSpectralLDA(4, start=ps, **kw)
    # the default ("auto") and "tensor" keep the tensor start: epochs 1, 2 spectral
    for start in ({}, {"start": "tensor"}):
        snaps = _run(StreamingSpectralLDA(K, seed=0, **kw, **start), X_warm, X_stream)
        assert [s.stage for s in snaps] == ["spectral", "spectral", "refined", "refined"]
        assert "public_start" not in snaps[-1].privacy


def test_a_public_start_on_another_vocabulary_is_refused_before_any_draw(data):
    _, X_warm, _, ps = data
    led = MemoryLedger()
    est = StreamingSpectralLDA(K, start=ps, accountant=Accountant(EPS, 1e-6, led),
                               **_continual(sampler="fast", non_production=True))
    with pytest.raises(ValueError, match="vocabulary"):
        est.warmup(X_warm[:, :D - 1])
    assert [r.kind for r in led.read()] == ["budget"]          # the budget record, no draw


def _epoch_charges(ledger) -> dict[int, dict[str, float]]:
    """ρ reserved per tree epoch and block, from the ledger."""
    out: dict[int, dict[str, float]] = {}
    for r in ledger.read():
        if r.kind == "reserve" and ":tree:epoch=" in r.key:
            t = int(r.key.rsplit("=", 1)[1])
            for e in r.payload["events"]:
                out.setdefault(t, {})
                out[t][e["block"]] = out[t].get(e["block"], 0.0) + e["rho"]
    return out


def test_a_public_start_charges_the_tensor_plans_node_rho_split_to_the_refinement(data):
    _, X_warm, X_stream, ps = data
    charges, snaps = {}, {}
    for name, start in (("tensor", "auto"), ("public", ps)):
        led = MemoryLedger()
        est = StreamingSpectralLDA(K, seed=0, noise_seed=1, sampler="fast", start=start,
                                   accountant=Accountant(EPS, 1e-6, led), **_continual())
        snaps[name] = _run(est, X_warm, X_stream)
        charges[name] = _epoch_charges(led)
        if name == "public":
            assert est.refinement.share == PUBLIC_START_SHARE
    assert sorted(charges["tensor"]) == sorted(charges["public"]) == list(range(1, R + 1))
    for t in range(1, R + 1):
        T, P = charges["tensor"][t], charges["public"][t]
        assert set(T) == set(P)                                  # the same blocks, ...
        assert math.isclose(sum(T.values()), sum(P.values()), rel_tol=1e-9)   # same node ρ
        assert math.isclose(T[REFINE_BLOCK] / sum(T.values()), 0.5, rel_tol=1e-9)
        assert math.isclose(P[REFINE_BLOCK] / sum(P.values()), PUBLIC_START_SHARE, rel_tol=1e-9)
    T, P = snaps["tensor"][-1].privacy, snaps["public"][-1].privacy
    assert math.isclose(T["rho_node"], P["rho_node"], rel_tol=1e-9)
    # every epoch refined, from the start; each report lists the public input, no budget
    assert [s.stage for s in snaps["public"]] == ["refined"] * R
    for s in snaps["public"]:
        assert s.privacy["start"]["kind"] == "public" and s.privacy["start"]["rho"] == 0.0
        assert s.privacy["public_start"]["start_id"] == ps.start_id
    # an explicit RefinementConfig keeps its share
    est = StreamingSpectralLDA(K, start=ps, refinement=RefinementConfig(share=0.7),
                               **_continual(sampler="fast", non_production=True))
    assert est.refinement.share == 0.7


def test_the_estimators_public_chain_is_the_services_chain_of_the_benchmark(data):
    """benchmarks/service_start.py rebuilds the services' public chain by hand (the fold-in
    models with the start as model epoch 0, refined iff model_epoch_for(t, L, public)); the
    estimator with start=PublicStart releases the same topics, and they are near the truth."""
    model, X_warm, X_stream, ps = data
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import service_start
    finally:
        sys.path.pop(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, rows = service_start.continual(X_warm, X_stream, R, EPS, 0, K, "public", ps,
                                          lambda B: {"topic_word": B}, set(range(1, R + 1)))
    est = StreamingSpectralLDA(K, 1.0, seed=0, noise_seed=20_000, sampler="fast", start=ps,
                               continual_aggregator="blt", **_continual())
    snaps = _run(est, X_warm, X_stream)
    assert [r["epoch"] for r in rows] == [s.epoch for s in snaps]
    for r, s in zip(rows, snaps):
        np.testing.assert_allclose(s.topic_word, r["topic_word"], rtol=0, atol=1e-12)
    # quality: each true topic is matched by a released one (L1 distance per topic)
    truth = model.topics
    dist = np.abs(truth[:, None, :] - snaps[-1].topic_word[None, :, :]).sum(axis=2)
    assert dist.min(axis=1).max() < 0.25, dist.min(axis=1)     # measured ≈ 0.08-0.11
