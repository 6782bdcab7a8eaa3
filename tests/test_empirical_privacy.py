"""Empirical privacy audit of one noised block sum (Jagielski et al. 2020; Nasr et al. 2021).

The block is real: the whitened second-moment block ``z = Σ scale·e2·Q`` of
:class:`streamdp.moments.sketch.WhitenedSketch`, with a public clip bound C_z.
Neighbouring datasets are D and D + {one adversarial document}; the adversary
knows both block sums exactly (the strongest, worst-case attacker), so the
likelihood-ratio test is a threshold on the projection of a release onto the
difference direction (sufficient for isotropic Gaussian noise).

Each dataset is released many times with the Gaussian mechanism calibrated by
``sigma_for_rho(C_z, ρ)``. Thresholds are picked on held-out calibration
releases; on fresh releases, Clopper–Pearson bounds (Bonferroni over all
thresholds and directions) give a lower bound on ε at the claimed δ:

    ε_lb = log((TPR_lower − δ) / FPR_upper)

which holds with probability ≥ 1 − α for any (ε, δ)-DP mechanism. The audit
asserts ε_lb < the accountant's ε for ρ (CKS conversion), and — to show the
test has teeth — that a mechanism with σ/4 is caught (ε_lb > claimed ε).
"""
import math

import numpy as np
import pytest
import scipy.sparse as sp

from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import WhitenedSketch
from streamdp.privacy.conversions import zcdp_epsilon
from streamdp.privacy.events import sigma_for_rho
from streamdp.privacy.audit import epsilon_lower_bound
from streamdp.privacy.noise import (CSPRNGGaussianSampler, GoogleDPGaussianSampler,
                                    OpenDPGaussianSampler)
from streamdp.whitening.subspace import Subspace

RHO, DELTA = 0.125, 1e-5
ALPHA = 0.05
N_CAL, N_TEST = 10_000, 20_000


@pytest.fixture(scope="module")
def neighbouring_blocks():
    """z block sums of D and D' = D + {adversarial doc}, and the clip bound C_z."""
    rng = np.random.default_rng(2024)
    d, k = 40, 4
    Q = np.linalg.qr(rng.standard_normal((d, k)))[0]
    counts = rng.integers(0, 3, size=(200, d)) * (rng.random((200, d)) < 0.3)
    counts[counts.sum(1) < 3, 0] += 3
    # Only the z bound binds (m1, s3 bounds of 1 never clip), so the
    # adversarial document's z contribution sits exactly at the clip bound.
    clip = ClipBounds(m1=1.0, z=0.01, s3=1.0, warmup=1.0)
    sub = Subspace(Q)
    z0 = WhitenedSketch(sub, clip).update(sp.csr_matrix(counts.astype(float))).sums().z
    adversary = np.zeros(d)
    adversary[[3, 5]] = [30, 2]
    X1 = sp.csr_matrix(np.vstack([counts, adversary]).astype(float))
    z1 = WhitenedSketch(sub, clip).update(X1).sums().z
    return z0, z1, clip.z


def test_block_sensitivity_is_the_clip_bound(neighbouring_blocks):
    z0, z1, C = neighbouring_blocks
    gap = np.linalg.norm(z1 - z0)
    assert gap <= C * (1 + 1e-12)             # the sensitivity claim the accountant relies on
    assert gap >= 0.999 * C                    # and the audit is at the worst case


def audit(z0, z1, sigma, sample, n_cal=N_CAL, n_test=N_TEST):
    """ε lower bound for releases z_b + noise, b ∈ {0, 1}; ``sample(sigma, shape)`` draws noise."""
    u = (z1 - z0) / np.linalg.norm(z1 - z0)

    def scores(z, n):
        releases = z[None] + sample(sigma, (n,) + z.shape)     # n full-block releases
        return np.tensordot(releases - z0, u, axes=z.ndim)     # attacker's statistic

    cal0, cal1 = scores(z0, n_cal), scores(z1, n_cal)
    test0, test1 = scores(z0, n_test), scores(z1, n_test)
    return epsilon_lower_bound(cal0, cal1, test0, test1, DELTA, ALPHA)


def test_gaussian_release_passes_the_audit(neighbouring_blocks):
    z0, z1, C = neighbouring_blocks
    sigma = sigma_for_rho(C, RHO)
    claimed = zcdp_epsilon(RHO, DELTA)
    sampler = CSPRNGGaussianSampler(seed=11)
    eps_lb = audit(z0, z1, sigma, sampler.sample)
    assert 0.0 < eps_lb < claimed, (eps_lb, claimed)


def test_under_noised_release_is_caught(neighbouring_blocks):
    z0, z1, C = neighbouring_blocks
    sigma = sigma_for_rho(C, RHO) / 4           # a calibration bug: 16× the claimed ρ
    claimed = zcdp_epsilon(RHO, DELTA)
    sampler = CSPRNGGaussianSampler(seed=12)
    eps_lb = audit(z0, z1, sigma, sampler.sample)
    assert eps_lb > claimed, (eps_lb, claimed)


def test_opendp_sampler_passes_the_audit(neighbouring_blocks):
    """The vetted sampler, on the 1-D sufficient statistic (OpenDP draws ≈ 2·10⁴/s)."""
    z0, z1, C = neighbouring_blocks
    sigma = sigma_for_rho(C, RHO)
    gap = float(np.linalg.norm(z1 - z0))
    s = OpenDPGaussianSampler()
    n_cal, n_test = 5_000, 10_000
    # released projection ⟨z_b − z0, u⟩ + N(0, σ²): noise added by OpenDP itself
    cal0, test0 = (s.add_noise(np.zeros(n), sigma) for n in (n_cal, n_test))
    cal1, test1 = (s.add_noise(np.full(n, gap), sigma) for n in (n_cal, n_test))
    eps_lb = epsilon_lower_bound(cal0, cal1, test0, test1, DELTA)
    assert eps_lb < zcdp_epsilon(RHO, DELTA)
    # and its noise has the advertised scale
    assert np.std(np.concatenate([cal0, test0])) == pytest.approx(sigma, rel=0.03)


def test_google_sampler_passes_the_audit(neighbouring_blocks):
    """The opt-in Google secure Gaussian: full-block releases, as for the
    reference Gaussian above, each block noised through the mechanism (value + noise), in two
    parallel chunks as a release draws them."""
    z0, z1, C = neighbouring_blocks
    sigma = sigma_for_rho(C, RHO)
    s = GoogleDPGaussianSampler(workers=2, min_parallel=z0.size * 1_000)
    eps_lb = audit(z0, z1, sigma, s.sample, n_cal=5_000, n_test=10_000)
    assert 0.0 < eps_lb < zcdp_epsilon(RHO, DELTA), eps_lb
    under = audit(z0, z1, sigma / 4, s.sample, n_cal=5_000, n_test=10_000)
    assert under > zcdp_epsilon(RHO, DELTA), under      # the audit still catches σ/4


def test_opendp_sampler_shapes_and_moments():
    s = OpenDPGaussianSampler()
    x = s.sample(3.0, (50, 40))
    assert x.shape == (50, 40) and x.dtype == np.float64
    assert abs(x.mean()) < 5 * 3.0 / math.sqrt(x.size)
    assert x.std() == pytest.approx(3.0, rel=0.06)
    v = np.arange(6.0).reshape(2, 3)
    y = s.add_noise(v, 1e-3)
    assert y.shape == v.shape and np.abs(y - v).max() < 0.01
    with pytest.raises(ValueError):
        s.sample(0.0, 3)
