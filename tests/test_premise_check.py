"""The continual release's noised, charged premise check (issue 23 item 2; docs/privacy.md
"The premise check"): ñ = n + N(0, σ_p²) decides whether an epoch is drawn from its sums or
from noise only. The check itself (Monte Carlo on a scaled z), its plan, and the kept draw."""
from __future__ import annotations

import math

import numpy as np
import pytest

from streamdp import ClipBounds, WhitenedSketch
from streamdp.continual import ContinualRelease
from streamdp.privacy.accountant import Accountant
from streamdp.privacy.events import sigma_for_rho
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.noise import CSPRNGGaussianSampler
from streamdp.privacy.plan import (PREMISE_BLOCK, PREMISE_SHARE, PREMISE_Z, PremiseCheck,
                                   gaussian_tail, premise_split)
from streamdp.privacy.spend import SpendSession
from streamdp.synthetic import make_lda_model, sample_documents
from streamdp.whitening.subspace import Subspace

from conftest import random_basis


def test_premise_split_known_answers():
    rho = 0.02
    release, check = premise_split(rho, checks_per_atom=4, sensitivity=6.0)
    assert release == pytest.approx(rho * (1 - PREMISE_SHARE), rel=1e-15)
    assert check.rho == pytest.approx(rho * PREMISE_SHARE / 4, rel=1e-15)
    assert check.sigma == sigma_for_rho(6.0, check.rho)
    assert check.event("stream").rho == pytest.approx(check.rho, rel=1e-9)
    # release + every check an atom can enter = ρ_stream
    assert release + 4 * check.event("stream").rho == pytest.approx(rho, rel=1e-9)
    assert check.z == PREMISE_Z == 12.0
    # Φ(−12) = 1.7764e-33 (tables), rounded up, for documents; a user's count (s = 6) shifts
    # the tail by (s − 1)/σ (a neighbour of a count over N_max is ≥ N_max − s + 1)
    _, doc_check = premise_split(rho, checks_per_atom=1)
    assert 1.7764e-33 < doc_check.delta < 1.7765e-33
    assert check.delta == gaussian_tail(12.0 - 5.0 / check.sigma) > doc_check.delta
    assert gaussian_tail(0.0) >= 0.5
    ev = check.event("stream:epochs=3-3")
    assert (ev.block, ev.delta, ev.partition, ev.sensitivity) == (PREMISE_BLOCK, check.delta,
                                                                  "stream:epochs=3-3", 6.0)
    assert check.threshold(10**9) == 10**9 - 12.0 * check.sigma
    with pytest.raises(ValueError):
        premise_split(rho, checks_per_atom=0)


@pytest.mark.parametrize("z", [1.5, 2.5])
def test_a_sum_just_over_the_premise_passes_with_probability_at_most_phi_minus_z(z):
    """Adversarial: n = N_max + 1 (just over). With z scaled down so that Φ(−z) is measurable,
    the pass rate of the real sampler's ñ is ≤ Φ(−z) (4 standard errors of slack); at
    n = N_max it is Φ(−z) itself, and well inside the premise it passes."""
    n_max, sigma, trials = 1000, 7.0, 200_000
    check = PremiseCheck(rho=0.01, sensitivity=1.0, sigma=sigma, z=z, delta=gaussian_tail(z),
                         checks_per_atom=1)
    sampler = CSPRNGGaussianSampler(5)

    def pass_rate(n: int) -> float:
        noisy = np.asarray(sampler.add_noise(np.full(trials, float(n)), sigma))
        return float(np.mean([check.passes(v, n_max) for v in noisy[:trials]]))

    tail = gaussian_tail(z)
    se = math.sqrt(tail * (1 - tail) / trials)
    assert pass_rate(n_max + 1) <= tail + 4 * se
    assert abs(pass_rate(n_max) - tail) <= 4 * se
    assert pass_rate(int(n_max - (z + 5) * sigma)) > 0.999


# ------------------------------------------------------------------ the kept draw
@pytest.fixture(scope="module")
def epoch_sums():
    model = make_lda_model(60, 3, alpha0=1.0, beta=0.1, seed=11)
    X = sample_documents(model, 900, mean_length=30, seed=12)
    sub = Subspace(random_basis(np.random.default_rng(0), X.shape[1], 5))
    clip = ClipBounds(m1=0.2, z=0.05, s3=0.02, warmup=1e-6)
    sums = [WhitenedSketch(sub, clip).update(X[i * 300:(i + 1) * 300]).sums() for i in range(3)]
    return sub, clip, sums


class CountingSampler(CSPRNGGaussianSampler):
    """Counts the draws of the premise check (one entry at the check's σ, set once known)."""

    def __init__(self, seed):
        super().__init__(seed)
        self.premise_draws = 0
        self.premise_sigma = None

    def add_noise(self, value, sigma):
        if np.size(value) == 1 and sigma == self.premise_sigma:
            self.premise_draws += 1
        return super().add_noise(value, sigma)


@pytest.mark.parametrize("aggregator", ["blt", "tree"])
def test_a_failure_after_the_premise_draw_reuses_the_kept_draw(epoch_sums, aggregator):
    """Crash-after-draw: the epoch's own draw raises after ñ was drawn (here: an injected
    exception in the aggregator). The retry reuses the kept ñ — no new draw, no new charge —
    and the reservation is committed with the epoch's (the service's SpendSession)."""
    sub, clip, sums = epoch_sums
    acct = Accountant(1.0, 1e-6, MemoryLedger())
    session = SpendSession(acct)
    sampler = CountingSampler(3)
    cr = ContinualRelease(sub, clip, n_topics=3, alpha0=1.0, rho=0.5 * acct.rho_budget, horizon=4,
                          sampler=sampler, spender=session, aggregator=aggregator)
    sampler.premise_sigma = cr.premise.sigma
    cr.close_epoch(sums[0])
    session.persisted()
    assert sampler.premise_draws == 1 and cr.last_premise["passed"]

    real_add = cr.tree.add_epoch
    calls = {"n": 0}

    def failing_once(value):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected: the process dies after the premise draw")
        return real_add(value)

    cr.tree.add_epoch = failing_once
    with pytest.raises(RuntimeError, match="injected"):
        cr.draw_epoch(sums[1])
    session.discard()                   # as the service does when the epoch is not persisted
    kept = dict(cr.premise_kept)
    assert kept["epoch"] == 2 and sampler.premise_draws == 2
    ledger_before = acct.report()
    cr.draw_epoch(sums[1])              # the retry
    assert sampler.premise_draws == 2   # no new draw of ñ
    assert cr.last_premise["noisy_count"] == kept["noisy_count"] and cr.premise_kept is None
    session.persisted()
    rep = acct.report()
    assert rep["uncommitted"] == 0      # the premise reservation is committed with the epoch's
    # no new charge for ñ: only the epoch's own draw was added
    premise_keys = [k for k in acct._state().keys if "premise" in k]
    assert sorted(premise_keys) == ["tree:premise:epoch=1", "tree:premise:epoch=2"]
    assert rep["reservations"] == ledger_before["reservations"] + 1


def test_the_kept_draw_survives_a_checkpoint(epoch_sums):
    """A state written between the premise draw and the epoch's draw carries ñ: a restored
    release uses it (a restart never draws the check of the same epoch again)."""
    sub, clip, sums = epoch_sums
    sampler = CountingSampler(4)

    def fresh():
        return ContinualRelease(sub, clip, n_topics=3, alpha0=1.0, rho=0.01, horizon=4,
                                sampler=sampler, aggregator="blt")
    cr = fresh()
    sampler.premise_sigma = cr.premise.sigma
    cr.tree.add_epoch = lambda value: (_ for _ in ()).throw(RuntimeError("injected"))
    with pytest.raises(RuntimeError):
        cr.draw_epoch(sums[0])
    state = cr.state_dict()
    assert state["premise_kept"]["epoch"] == 1 and sampler.premise_draws == 1
    restored = fresh().load_state(state)
    restored.draw_epoch(sums[0])
    assert sampler.premise_draws == 1
    assert restored.last_premise["noisy_count"] == state["premise_kept"]["noisy_count"]
