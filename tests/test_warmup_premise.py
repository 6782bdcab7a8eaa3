"""The warm-up's noised, charged premise check (issue 23 item 2; docs/privacy.md "The premise
check"): ñ = n + N(0, σ_p²) of the warm-up's documents decides whether the range finder (and the
clip histogram) are drawn from the warm-up's sums or from noise only — never a refusal. Its plan
(one place: plan.warmup_plan), the check on the real sampler (Monte Carlo at a scaled z), the
estimator's path and its kept draw. The service's path: the broker audit pair in
tests/test_release_schedule.py and the ledger labels in tests/test_no_redraw.py."""
from __future__ import annotations

import math

import numpy as np
import pytest

from streamdp import StreamingSpectralLDA
from streamdp.privacy.events import EventLog
from streamdp.privacy.noise import CSPRNGGaussianSampler
from streamdp.privacy.plan import (PREMISE_SHARE, PREMISE_Z, PremiseCheck, gaussian_tail,
                                   warmup_plan)
from streamdp.synthetic import make_lda_model, sample_documents
from streamdp.whitening.warmup import PREMISE_LABEL, WarmupSketch, premise_decision


def test_warmup_plan_carves_the_premise_check_from_the_range_finder_known_answers():
    rho = 0.04
    doc = warmup_plan(rho, clip_budget_share=0.05)
    # document unit, time boundary: the warm-up atom, sensitivity 1, Φ(−12) per check
    assert doc.premise.rho == pytest.approx(rho * 0.95 * PREMISE_SHARE, rel=1e-12)
    assert doc.subspace_rho == pytest.approx(rho * 0.95 * (1 - PREMISE_SHARE), rel=1e-12)
    assert doc.clip_rho + doc.subspace_rho + doc.premise.rho == pytest.approx(rho, rel=1e-12)
    assert doc.premise_partition == "warmup" and doc.premise.sensitivity == 1.0
    assert doc.premise.z == PREMISE_Z and 1.7764e-33 < doc.premise.delta < 1.7765e-33
    assert doc.premise.event(doc.premise_partition).rho == pytest.approx(doc.premise.rho, rel=1e-9)
    # user unit: on the stream partition, sensitivity M; a count boundary: sensitivity 2
    user = warmup_plan(rho, privacy_unit="user", user_max_documents=6)
    assert user.premise_partition == "stream" and user.premise.sensitivity == 6.0
    assert user.premise.delta == gaussian_tail(12.0 - 5.0 / user.premise.sigma)
    count = warmup_plan(rho, warmup_boundary="count", auto_clip=False)
    assert count.premise.sensitivity == 2.0 and count.premise_partition == "stream"
    assert count.subspace_rho + count.premise.rho == pytest.approx(rho * 0.25, rel=1e-12)
    with pytest.raises(ValueError, match="user_max_documents"):
        warmup_plan(rho, privacy_unit="user")
    assert warmup_plan(None).premise is None


def _sketch(n_docs: int) -> WarmupSketch:
    w = WarmupSketch(20, 3, clip=1.0, seed=0)
    w.n_docs = n_docs                 # only the count enters the check
    return w


@pytest.mark.parametrize("z", [1.5, 2.5])
def test_a_warmup_just_over_the_premise_passes_with_probability_at_most_phi_minus_z(z):
    """Adversarial: a warm-up of N_max + 1 documents. With z scaled down so that Φ(−z) is
    measurable, the warm-up's own draw (draw_premise_count, the real sampler) and rule
    (premise_decision) let it through at a rate ≤ Φ(−z) (4 standard errors of slack); at N_max
    the rate is Φ(−z); well inside it passes. A failed check gives an empty warm-up of the same
    public parameters, never a refusal."""
    n_max, sigma, trials = 1000, 7.0, 20_000
    check = PremiseCheck(rho=0.01, sensitivity=1.0, sigma=sigma, z=z, delta=gaussian_tail(z),
                         checks_per_atom=1)
    sampler = CSPRNGGaussianSampler(6)

    def pass_rate(n: int) -> float:
        warm, passed = _sketch(n), 0
        for _ in range(trials):
            noisy = warm.draw_premise_count(check, sampler, EventLog())
            drawn, report = premise_decision(warm, check, noisy, n_max)
            assert (drawn is warm) == report["passed"] == (noisy <= n_max - z * sigma)
            passed += report["passed"]
        return passed / trials

    tail = gaussian_tail(z)
    se = math.sqrt(tail * (1 - tail) / trials)
    assert pass_rate(n_max + 1) <= tail + 4 * se
    assert abs(pass_rate(n_max) - tail) <= 4 * se
    warm = _sketch(int(n_max - (z + 6) * sigma))
    drawn, report = premise_decision(warm, check, warm.draw_premise_count(check, sampler), n_max)
    assert drawn is warm and report["passed"]
    over = _sketch(10 * n_max)
    drawn, report = premise_decision(over, check, over.draw_premise_count(check, sampler), n_max)
    assert not report["passed"] and drawn.n_docs == 0
    assert (drawn.d, drawn.k_prime, drawn.clip, drawn.seed) == (20, 3, 1.0, 0)


@pytest.fixture(scope="module")
def docs():
    model = make_lda_model(60, 3, alpha0=1.0, beta=0.1, seed=21)
    return sample_documents(model, 400, mean_length=30, seed=22)


class CountingSampler(CSPRNGGaussianSampler):
    """Counts the draws of size 1 (the premise check's ñ: every other warm-up draw is larger)."""

    def __init__(self, seed):
        super().__init__(seed)
        self.premise_draws = 0

    def add_noise(self, value, sigma):
        if np.size(value) == 1:
            self.premise_draws += 1
        return super().add_noise(value, sigma)


def test_the_estimator_draws_a_warmup_over_the_premise_from_noise_only(docs):
    """A warm-up of 101 documents with max_documents_per_sum = 100: before, warmup → partial_fit
    raised DocumentCountExceeded; now the noised check decides (N_max = 100 ≪ z·σ_p: noise
    only), the subspace is fixed, and the check is charged (ρ and δ on the warm-up atom)."""
    est = StreamingSpectralLDA(3, epsilon=1.0, delta=1e-6, seed=0, max_documents_per_sum=100,
                               sampler=CountingSampler(1), non_production=True)
    est.warmup(docs[:101]).partial_fit(docs[101:150])
    check = est.subspace_.provenance["premise_check"]
    assert check["max_documents"] == 100 and check["threshold"] < 0 and not check["passed"]
    assert est.sampler.premise_draws == 1
    rep = est.accountant.report()
    assert rep["delta_of_approximate_events_by_atom"]["warmup"] == pytest.approx(check["delta"])
    assert rep["epsilon_worst_case"] <= 1.0 * (1 + 1e-9)
    # within a large N_max the same warm-up passes and is drawn from its sums
    ok = StreamingSpectralLDA(3, epsilon=1.0, delta=1e-6, seed=0, sampler=CountingSampler(1),
                              non_production=True)
    ok.warmup(docs[:101]).partial_fit(docs[101:150])
    assert ok.subspace_.provenance["premise_check"]["passed"]


def test_a_failure_after_the_warmup_premise_draw_reuses_the_kept_draw(docs, monkeypatch):
    """Crash-after-draw, in process: the clip histogram's draw raises after ñ was drawn. The
    retry (the next partial_fit) reuses the kept ñ: no second draw, one ledger reservation."""
    est = StreamingSpectralLDA(3, epsilon=1.0, delta=1e-6, seed=0, sampler=CountingSampler(2),
                               non_production=True)
    est.warmup(docs[:101])
    real = WarmupSketch.draw_histogram
    calls = {"n": 0}

    def failing_once(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected: the histogram draw fails after the premise draw")
        return real(self, *a, **kw)

    monkeypatch.setattr(WarmupSketch, "draw_histogram", failing_once)
    with pytest.raises(RuntimeError, match="injected"):
        est.partial_fit(docs[101:150])
    assert est.sampler.premise_draws == 1 and est.subspace_ is None
    est.partial_fit(docs[101:150])                          # the retry
    assert est.sampler.premise_draws == 1                   # ñ was not drawn again
    assert est.subspace_.provenance["premise_check"]["passed"]
    labels = [r.payload.get("label") for r in est.accountant.ledger.read() if r.kind == "reserve"]
    assert sum(x.endswith(":" + PREMISE_LABEL) for x in labels) == 1
