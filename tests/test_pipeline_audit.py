"""Pipeline privacy audit (issue 15): neighbouring datasets through warm-up, sketching and release.

test_empirical_privacy.py audits one Gaussian block. This audit runs the *engine*:
``StreamingSpectralLDA(epsilon=..., sampler=fast)`` with ``warmup`` → ``partial_fit`` →
``release``, on D and on D' = D + one canary document built for maximal influence (a
3-token document on two words: every block it touches is at its clip bound).

What is measured. A recording sampler (the engine's fast sampler, wrapped) sees every
``add_noise(value, sigma)`` call the engine makes: the noise-free values and the σ the
engine chose, for the warm-up range-finder sum Y = Σ clip(e2·Ω) and for every block of
the release. Everything after these calls is post-processing. The audit keeps the blocks
whose values do not depend on the (noised) subspace Q — Y, m1 (d word coordinates) and
the count — so D and D' can be compared release by release, and then draws many fresh
releases value + N(0, σ²) with the engine's own sampler, scores them with the optimal
likelihood-ratio statistic of the attacker who knows D and D' (the worst case), and
turns the score counts into an ε lower bound (streamdp.privacy.audit; Clopper–Pearson,
Bonferroni over thresholds, α = 0.05). Using fewer released values than exist can only
lower the bound, so it stays a valid lower bound.

The claim. The deployment's ε = EPS_CFG at δ = 1e-6 is ρ-zCDP with ρ = zcdp_rho(EPS_CFG,
1e-6); a ρ-zCDP mechanism is (ε(δ), δ)-DP at *every* δ, so it is audited at δ = 0.01,
where ≈ 20,000 releases per side have the power to see the broken variants. The budget
split (public configuration) puts most of the stream's ρ on m1 and the count, which the
statistic sees.

Broken variants that must be caught (ε_lb > claimed ε):
* clipping off — documents sketched unclipped while σ is calibrated to the clip bounds;
* σ/2 — every noise scale halved (4× the ρ);
* a count-based warm-up/stream boundary — D' = [canary] + D split at a fixed count moves
  D's last warm-up document into the stream: the canary then costs the warm-up's ρ *and*
  the shifted document's stream ρ (sequential, not parallel composition).
"""
from __future__ import annotations

import numpy as np
import pytest

from streamdp import StreamingSpectralLDA
from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.audit import epsilon_lower_bound, gaussian_lr_scores
from streamdp.privacy.conversions import zcdp_epsilon, zcdp_rho
from streamdp.privacy.noise import CSPRNGGaussianSampler
from streamdp.privacy.plan import BudgetSplit

EPS_CFG, DELTA_CFG = 4.4, 1e-6          # the deployment's configured guarantee
AUDIT_DELTA = 1e-2                      # where the same ρ is audited
RHO = zcdp_rho(EPS_CFG, DELTA_CFG)
CLAIMED = zcdp_epsilon(RHO, AUDIT_DELTA)
N_CAL, N_TEST = 10_000, 20_000
D_VOCAB, K = 30, 2
CLIP = ClipBounds.for_length(6)          # public clip bounds (no private quantile step)
SPLIT = BudgetSplit(z=0.01, s3=0.01, m1=0.95, count=0.03)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class RecordingSampler:
    """The engine's fast sampler, recording each (value, sigma, phase) it noises."""

    name = "audit-recording(numpy-pcg64-csprng)"

    def __init__(self, seed: int) -> None:
        self._inner = CSPRNGGaussianSampler(seed)
        self.calls: list[tuple[str, np.ndarray, float]] = []
        self.phase = "warmup"

    def sample(self, sigma, shape):
        return self._inner.sample(sigma, shape)

    def add_noise(self, value, sigma):
        x = np.array(value, dtype=np.float64)
        self.calls.append((self.phase, x.copy(), float(sigma)))
        return self._inner.add_noise(x, sigma)


def corpus():
    """Public-by-construction D: warm-up and stream documents of 8 distinct words from 12..29.

    Documents of L distinct words have block norms exactly at ``ClipBounds.for_length(L)``;
    with L = 8 > 6 nothing in D is ever clipped, so the m1 and count sums do not depend on
    the subspace. The canary (words 0..5) and the last warm-up document, "the shifter"
    (words 6..11), have 6 distinct words: at the clip bound of every block, orthogonal to
    each other and to everything else.
    """
    rng = np.random.default_rng(7)

    def docs(n):
        X = np.zeros((n, D_VOCAB))
        for i in range(n):
            X[i, rng.choice(np.arange(12, D_VOCAB), size=8, replace=False)] = 1.0
        return X
    warm, stream = docs(40), docs(40)
    shifter = np.zeros(D_VOCAB)
    shifter[6:12] = 1.0
    warm[-1] = shifter
    canary = np.zeros(D_VOCAB)
    canary[0:6] = 1.0
    return warm, stream, canary


def engine_run(warm, stream, *, clip=CLIP, seed=1):
    """One run of the engine; the recorded Q-independent blocks and their σ, by name."""
    sampler = RecordingSampler(seed)
    est = StreamingSpectralLDA(K, 1.0, epsilon=EPS_CFG, delta=DELTA_CFG, clip=clip,
                               budget_split=SPLIT, seed=0, sampler=sampler,
                               non_production=True)   # a recording sampler: not vetted
    est.warmup(warm)
    est.partial_fit(stream)            # fixes the subspace: the warm-up's noised Y
    sampler.phase = "release"
    snap = est.release()
    assert snap.privacy["epsilon"] == EPS_CFG
    blocks = {}
    for phase, value, sigma in sampler.calls:
        if phase == "warmup" and value.shape == (D_VOCAB, est.subspace_dim_):
            blocks["Y"] = (value, sigma)
        elif phase == "release" and value.shape == (D_VOCAB,):
            blocks["m1"] = (value, sigma)
        elif phase == "release" and value.size == 1:
            blocks["count"] = (value.reshape(1), sigma)
    assert set(blocks) == {"Y", "m1", "count"}, [(p, v.shape) for p, v, _ in sampler.calls]
    return blocks


def audit(run0, run1, *, sigma_factor=1.0, sigmas_from=None, seed=0):
    """ε lower bound from N_CAL + N_TEST fresh releases per dataset."""
    names = sorted(run0)
    sig_src = sigmas_from or run0
    sigmas = [sig_src[b][1] * sigma_factor for b in names]
    claimed_sigmas = [sig_src[b][1] for b in names]
    for b in names:                            # the engine noised the same blocks the same way
        assert run0[b][1] == run1[b][1] and run0[b][0].shape == run1[b][0].shape
    m0 = [run0[b][0] for b in names]
    m1 = [run1[b][0] for b in names]
    noise = CSPRNGGaussianSampler(seed)

    def scores(means, n):
        rel = [m[None] + noise.sample(s, (n,) + m.shape) for m, s in zip(means, sigmas)]
        return gaussian_lr_scores(rel, m0, m1, claimed_sigmas)

    cal0, cal1 = scores(m0, N_CAL), scores(m1, N_CAL)
    test0, test1 = scores(m0, N_TEST), scores(m1, N_TEST)
    return epsilon_lower_bound(cal0, cal1, test0, test1, AUDIT_DELTA)


@pytest.fixture(scope="module")
def data():
    return corpus()


RESULTS: dict[str, float] = {}


def report(name, eps_lb):
    RESULTS[name] = eps_lb
    print(f"\npipeline audit [{name}]: empirical ε lower bound {eps_lb:.3f} vs claimed ε "
          f"{CLAIMED:.3f} at δ={AUDIT_DELTA:g} (deployment ε={EPS_CFG} at δ={DELTA_CFG:g}, ρ={RHO:.4f})")


def test_honest_pipeline_stream_canary_stays_below_the_claim(data):
    warm, stream, canary = data
    r0 = engine_run(warm, stream)
    r1 = engine_run(warm, np.vstack([stream, canary]))
    assert np.array_equal(r0["Y"][0], r1["Y"][0])          # a stream document never touches Y
    eps_lb = audit(r0, r1, seed=11)
    report("honest, stream canary", eps_lb)
    assert 0.5 < eps_lb < CLAIMED                           # the test sees the canary, within the claim


def test_honest_pipeline_warmup_canary_stays_below_the_claim(data):
    """The canary at the front, timestamped in the warm-up: only the warm-up changes."""
    warm, stream, canary = data
    r0 = engine_run(warm, stream)
    r1 = engine_run(np.vstack([canary, warm]), stream)
    assert np.array_equal(r0["m1"][0], r1["m1"][0]) and np.array_equal(r0["count"][0], r1["count"][0])
    eps_lb = audit(r0, r1, seed=12)
    report("honest, warm-up canary (time boundary)", eps_lb)
    assert 0.5 < eps_lb < CLAIMED


def test_clipping_off_is_caught(data):
    warm, stream, canary = data
    big = np.zeros(D_VOCAB)
    big[0] = 3.0                      # one word three times: ‖c/l‖ = 1, 2.4× the m1 clip bound
    honest0 = engine_run(warm, stream)
    r0 = engine_run(warm, stream, clip=ClipBounds.unclipped())
    r1 = engine_run(warm, np.vstack([stream, big]), clip=ClipBounds.unclipped())
    eps_lb = audit(r0, r1, sigmas_from=honest0, seed=13)   # σ calibrated to the claimed clip
    report("BROKEN: clipping off", eps_lb)
    assert eps_lb > CLAIMED


def test_half_sigma_is_caught(data):
    warm, stream, canary = data
    r0 = engine_run(warm, stream)
    r1 = engine_run(warm, np.vstack([stream, canary]))
    eps_lb = audit(r0, r1, sigma_factor=0.5, seed=14)
    report("BROKEN: sigma/2", eps_lb)
    assert eps_lb > CLAIMED


def test_count_based_boundary_is_caught(data):
    """D' = [canary] + D split at the same count: the shifter moves into the stream."""
    warm, stream, canary = data
    n_warm = len(warm)
    X0 = np.vstack([warm, stream])
    X1 = np.vstack([canary, warm, stream])
    r0 = engine_run(X0[:n_warm], X0[n_warm:])
    r1 = engine_run(X1[:n_warm], X1[n_warm:])
    eps_lb = audit(r0, r1, seed=15)
    report("BROKEN: count-based warm-up/stream boundary", eps_lb)
    assert eps_lb > CLAIMED
