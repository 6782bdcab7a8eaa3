"""Empirical audit of the user-level unit (issue 16): a heavy user through the engine.

The method of tests/test_pipeline_audit.py (recorded noise-free values and σ of the warm-up's
range sum Y, m1 and the count; fresh releases with the engine's σ; the attacker's optimal
likelihood-ratio statistic; Clopper–Pearson ε lower bound at δ = 0.01), with D′ = D plus one
user who wrote 100 maximal-influence documents, 50 in the warm-up and 50 in the stream (each
side's weights then sum to exactly 1: the user is at the bound on both sides).

* user mode: the user's weights sum to ≤ 1 per side and the warm-up is charged to the stream
  partition (sequential composition), so ε_lb stays below the claimed ε;
* document mode on the same data (no bounding, warm-up and stream in parallel): the heavy user
  is 100 documents, far beyond one document's guarantee — caught (ε_lb > claimed ε).
"""
from __future__ import annotations

import numpy as np
import pytest
from test_pipeline_audit import (CLAIMED, CLIP, D_VOCAB, DELTA_CFG, EPS_CFG, K, SPLIT,
                                 RecordingSampler, audit, corpus, report)

from streamdp import StreamingSpectralLDA

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
N_WARM, N_STREAM = 50, 50


def engine_run(warm, warm_users, stream, stream_users, *, unit, seed=1):
    sampler = RecordingSampler(seed)
    kw = dict(privacy_unit="user", max_docs_per_user_epoch=50,
              max_docs_per_user=50) if unit == "user" else {}
    est = StreamingSpectralLDA(K, 1.0, epsilon=EPS_CFG, delta=DELTA_CFG, clip=CLIP,
                               budget_split=SPLIT, seed=0, sampler=sampler,
                               non_production=True, **kw)   # a recording sampler: not vetted
    users = (lambda u: {"users": u}) if unit == "user" else (lambda u: {})
    est.warmup(warm, **users(warm_users))
    est.partial_fit(stream, **users(stream_users))
    sampler.phase = "release"
    snap = est.release()
    assert snap.privacy["privacy_unit"] == unit
    blocks = {}
    for phase, value, sigma in sampler.calls:
        if phase == "warmup" and value.shape == (D_VOCAB, est.subspace_dim_):
            blocks["Y"] = (value, sigma)
        elif phase == "release" and value.shape == (D_VOCAB,):
            blocks["m1"] = (value, sigma)
        elif phase == "release" and value.size == 1:
            blocks["count"] = (value.reshape(1), sigma)
    assert set(blocks) == {"Y", "m1", "count"}
    return blocks


@pytest.fixture(scope="module")
def neighbours():
    warm, stream, canary = corpus()
    wu = [f"w{i}" for i in range(len(warm))]
    su = [f"s{i}" for i in range(len(stream))]
    heavy_w, heavy_s = np.tile(canary, (N_WARM, 1)), np.tile(canary, (N_STREAM, 1))
    # the heavy user's documents interleaved with everyone else's
    w1 = np.vstack([heavy_w[:5], warm[:20], heavy_w[5:], warm[20:]])
    w1u = ["heavy"] * 5 + wu[:20] + ["heavy"] * (N_WARM - 5) + wu[20:]
    s1 = np.vstack([stream[:10], heavy_s[:20], stream[10:], heavy_s[20:]])
    s1u = su[:10] + ["heavy"] * 20 + su[10:] + ["heavy"] * (N_STREAM - 20)
    return (warm, wu, stream, su), (w1, w1u, s1, s1u)


def test_user_mode_heavy_user_stays_below_the_claim(neighbours):
    d0, d1 = neighbours
    r0, r1 = engine_run(*d0, unit="user"), engine_run(*d1, unit="user")
    # the user moved both sides, by exactly one user's bound (weights 1/50 each, Σ = 1 per side)
    assert not np.array_equal(r0["Y"][0], r1["Y"][0])
    assert abs(float(r1["count"][0][0] - r0["count"][0][0]) - 1.0) < 1e-9
    eps_lb = audit(r0, r1, seed=21)
    report("user mode, heavy user in warm-up and stream", eps_lb)
    assert 0.5 < eps_lb < CLAIMED


def test_document_mode_heavy_user_is_caught(neighbours):
    d0, d1 = neighbours
    r0, r1 = engine_run(*d0, unit="document"), engine_run(*d1, unit="document")
    eps_lb = audit(r0, r1, seed=22)
    report("document mode (no user bounding), heavy user", eps_lb)
    assert eps_lb > CLAIMED


def test_user_weights_with_parallel_warmup_accounting_are_caught(neighbours):
    """Bounded users but the warm-up accounted in parallel with the stream (full ρ on each side,
    the document-level σ): a user on both sides then loses about 2ρ — caught. This is why the
    user mode charges the warm-up to the stream partition."""
    d0, d1 = neighbours
    r0, r1 = engine_run(*d0, unit="user"), engine_run(*d1, unit="user")
    parallel = engine_run(*d0, unit="document")      # σ of each side at its full ρ
    assert parallel["Y"][1] < r0["Y"][1] and parallel["m1"][1] < r0["m1"][1]
    eps_lb = audit(r0, r1, sigmas_from=parallel, seed=23)
    report("BROKEN: user weights, warm-up in parallel", eps_lb)
    assert eps_lb > CLAIMED
