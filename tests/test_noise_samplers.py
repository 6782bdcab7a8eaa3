"""The vetted samplers: OpenDP's Gaussian on a σ-relative lattice (the default), OpenDP's exact
Gaussian and Google's secure Gaussian (python-dp, opt-in), drawn in one process or in parallel
chunks across worker processes.

What must hold for the privacy argument (docs/privacy.md "Noise"):
* the noise is N(0, σ²) per coordinate, and chunks drawn by different processes are independent
  (a forked worker sharing its parent's generator state would repeat noise: attack test below);
* the released floats are on the sampler's lattice gℤ — an exact lattice sum rounded once — which is
  what rules out Mironov-style float leaks (the naive numpy sampler fails this check);
* the inputs pass through the mechanism (value + noise), bad input is refused before any draw;
* the default everywhere is the OpenDP lattice sampler, and the snapshot's report names it;
* the lattice's input rounding is charged: every event's ρ is (Δ + ROUNDING_SLACK·σ)²/(2σ²), and
  the sampler's rounding term (OpenDP's own privacy map) never exceeds ROUNDING_SLACK·σ — known
  answers and an attack with inputs at lattice midpoints below.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from streamdp.privacy import noise
from streamdp.privacy.events import ROUNDING_SLACK, GaussianEvent, sigma_for_rho
from streamdp.privacy.noise import (DEFAULT_SAMPLER, OPENDP_LATTICE_NAME, OPENDP_NAME,
                                    SAMPLER_KINDS, CSPRNGGaussianSampler, GoogleDPGaussianSampler,
                                    OpenDPGaussianSampler, OpenDPLatticeGaussianSampler,
                                    google_granularity, lattice_exponent, make_sampler,
                                    opendp_sensitivity_slack)

P_MIN = 1e-6          # a correct sampler fails a check with probability below this


def _is_normal(z: np.ndarray, sigma: float) -> bool:
    return stats.kstest(z / sigma, "norm").pvalue > P_MIN


def test_default_sampler_is_the_opendp_lattice_one_everywhere():
    """google's per-draw failure probability (≈ 2⁻⁴⁵) is not charged to δ, so it is opt-in
    (docs/privacy.md, "Noise"); the default everywhere is OpenDP's Gaussian on a σ-relative
    lattice (rounding charged), the exact one stays available as "opendp"."""
    assert DEFAULT_SAMPLER == "opendp-lattice"
    assert set(SAMPLER_KINDS) == {"opendp-lattice", "opendp", "google", "fast"}
    assert make_sampler().name == OPENDP_LATTICE_NAME
    assert make_sampler("opendp").name == OPENDP_NAME
    from streamdp.services.config import ServiceConfig
    from streamdp import StreamingSpectralLDA
    assert ServiceConfig.__dataclass_fields__["sampler"].default == "opendp-lattice"
    assert StreamingSpectralLDA(2, 1.0, epsilon=1.0).sampler.name == OPENDP_LATTICE_NAME
    with pytest.raises(ValueError, match="google"):
        make_sampler("gauss")


@pytest.mark.parametrize("sigma", [0.37, 3.0, 1234.5])
def test_google_noise_is_gaussian_on_its_lattice(sigma):
    s = GoogleDPGaussianSampler(workers=1)
    x = np.random.default_rng(1).normal(0, 0.1 * sigma, size=40_000)
    y = s.add_noise(x, sigma)
    assert _is_normal(y - x, sigma)
    g = google_granularity(sigma)
    assert 2.0**55 < sigma / g <= 2.0**56
    # every output is an exact multiple of g: the lattice sum rounded once, no float artefacts.
    # (Only outputs below σ/8 in magnitude carry information: larger floats have ulp ≥ g.)
    small = np.abs(y) < sigma / 16
    assert small.sum() > 100
    assert np.array_equal(y / g, np.round(y / g))


def test_naive_float_sampler_is_not_on_a_lattice():
    """The check above has teeth: numpy's float Gaussian leaves the lattice everywhere."""
    sigma = 3.0
    y = CSPRNGGaussianSampler().add_noise(np.zeros(40_000), sigma)
    g = google_granularity(sigma)
    small = y[np.abs(y) < sigma / 16]
    assert small.size > 100
    assert np.mean(small / g == np.round(small / g)) < 0.5


def test_parallel_chunks_are_independent_gaussians():
    """Two processes draw two halves: each half N(0, σ²), no repetition, no correlation.

    A worker forked from this process after python-dp had buffered CSPRNG output would return
    the parent's noise again; fresh interpreters (noise_worker) must not."""
    sigma, n = 2.0, 40_000
    s = GoogleDPGaussianSampler(workers=2, min_parallel=1_000)
    s.sample(sigma, 2_000)                     # this process has drawn before the workers start
    z = s.sample(sigma, n)
    a, b = z[: n // 2], z[n // 2:]
    assert _is_normal(a, sigma) and _is_normal(b, sigma)
    assert len(np.intersect1d(a, b)) < 5       # lattice 2^-55 σ: equal values only by repetition
    assert abs(np.corrcoef(a, b)[0, 1]) < 6 / np.sqrt(n // 2)
    # and against what this process draws next (its own generator state)
    c = s.sample(sigma, n // 2)
    assert len(np.intersect1d(b, c)) < 5


def test_parallel_draw_keeps_values_and_shape():
    sigma = 0.5
    s = GoogleDPGaussianSampler(workers=2, min_parallel=500)
    x = np.arange(6_000, dtype=np.float64).reshape(60, 100) * 1e3
    y = s.add_noise(x, sigma)
    assert y.shape == x.shape
    d = (y - x).ravel()
    assert _is_normal(d, sigma)
    # row order is kept: the noise is small next to the spacing of the values
    assert np.all(np.abs(y - x) < 8 * sigma)


def test_opendp_parallel_chunks():
    sigma = 1.5
    s = OpenDPGaussianSampler(workers=2, min_parallel=1_000)
    x = np.linspace(-5, 5, 4_000)
    d = s.add_noise(x, sigma) - x
    assert _is_normal(d, sigma)
    assert abs(np.corrcoef(d[:2000], d[2000:])[0, 1]) < 6 / np.sqrt(2000)


@pytest.mark.parametrize("workers", [1, 2])
def test_bad_input_refused_before_any_draw(workers):
    s = GoogleDPGaussianSampler(workers=workers, min_parallel=10)
    for bad in (np.array([1.0, np.nan] * 50), np.array([np.inf] * 100)):
        with pytest.raises(ValueError, match="finite"):
            s.add_noise(bad, 1.0)
    for sigma in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="sigma"):
            s.add_noise(np.zeros(100), sigma)
    assert s.add_noise(np.zeros((0, 3)), 1.0).shape == (0, 3)


def test_lattice_rounding_bound_is_enforced(monkeypatch):
    """More entries than max_entries would let rounding to gℤ add more than 10⁻¹²σ to Δ."""
    s = GoogleDPGaussianSampler(workers=1)
    g = google_granularity(1.0)
    assert g * np.sqrt(GoogleDPGaussianSampler.max_entries) <= 1e-12
    monkeypatch.setattr(GoogleDPGaussianSampler, "max_entries", 99)
    with pytest.raises(ValueError, match="entries"):
        s.add_noise(np.zeros(100), 1.0)


def test_dead_worker_is_reported_and_replaced():
    s = GoogleDPGaussianSampler(workers=2, min_parallel=100)
    s.sample(1.0, 1_000)
    w = noise._WORKERS[0]
    w.proc.kill()
    w.proc.wait()
    with pytest.raises((RuntimeError, BrokenPipeError)):
        s.sample(1.0, 1_000)
    assert w not in noise._WORKERS
    assert _is_normal(s.sample(1.0, 4_000), 1.0)      # a fresh worker serves the next draw


def test_release_report_names_the_default_sampler():
    from streamdp.synthetic import make_lda_model, sample_documents
    from streamdp import StreamingSpectralLDA
    X = sample_documents(make_lda_model(60, 3, seed=0), 1_500, mean_length=30, seed=0)
    est = StreamingSpectralLDA(3, 1.0, epsilon=4.0, seed=0, clip_length=30)
    est.warmup(X[:500]).partial_fit(X[500:])
    snap = est.release()
    assert snap.privacy["sampler"] == OPENDP_LATTICE_NAME
    assert snap.privacy["sampler_rounding_slack_sigmas"] == ROUNDING_SLACK
    for e in snap.privacy["events"]:            # every recorded ρ includes the rounding charge
        assert e["rho"] == pytest.approx((e["sensitivity"] / e["sigma"] + 2.0**-40) ** 2
                                         * e["count"] / 2, rel=1e-12)
    assert snap.topic_word.shape == (3, 60)


def test_forked_process_does_not_repeat_the_parents_noise():
    """python-dp keeps a buffer of CSPRNG output in the process: after a fork, parent and child
    draw identical noise from it (checked below on the raw library). The sampler must not."""
    import os
    from pydp.algorithms.numerical_mechanisms import GaussianMechanism

    def in_child(draw) -> np.ndarray:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                                    # child: draw, send, exit at once
            try:
                os.write(w, np.asarray(draw(), dtype=np.float64).tobytes())
            finally:
                os._exit(0)
        os.close(w)
        data = b""
        while chunk := os.read(r, 1 << 16):
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        return np.frombuffer(data, dtype=np.float64)

    raw = GaussianMechanism.create_from_standard_deviation(1.0)
    raw.add_noise(0.0)
    # the hazard is real: the child repeats the parent's next draws (as far as the copied
    # buffer reaches; a fork right before a refill shares nothing, so try a few forks)
    for _ in range(5):
        child = in_child(lambda: [raw.add_noise(0.0) for _ in range(20)])
        parent = np.array([raw.add_noise(0.0) for _ in range(20)])
        if child[0] == parent[0]:
            break
    assert child[0] == parent[0] and len(np.intersect1d(child, parent)) >= 1

    s = GoogleDPGaussianSampler(workers=1)
    s.sample(1.0, 100)
    child = in_child(lambda: s.sample(1.0, 2_000))
    parent = s.sample(1.0, 2_000)
    assert child.size == 2_000 and len(np.intersect1d(child, parent)) < 5
    assert _is_normal(child, 1.0)


# --- the lattice sampler: its rounding, charged ---------------------------------------------

def test_charged_rho_known_answer():
    """Δ = 1, σ = 3, n = 10⁶ by hand: the lattice is the largest 2^k with 2^k·10³ ≤ 2⁻⁴¹·3, i.e.
    2⁻⁵⁰ (2⁻⁴⁹·10³ = 1.78·10⁻¹² > 1.36·10⁻¹² ≥ 2⁻⁵⁰·10³ = 8.88·10⁻¹³); OpenDP's map states the
    rounding term (2⁻⁵⁰ − 2⁻¹⁰⁷⁴)·10³; every event is charged (Δ + 2⁻⁴⁰σ)²/(2σ²) ≥ OpenDP's ρ."""
    sigma, n, delta = 3.0, 10**6, 1.0
    assert ROUNDING_SLACK == 2.0**-40
    assert lattice_exponent(sigma, n) == -50
    slack = opendp_sensitivity_slack(sigma, n, -50)
    assert slack == pytest.approx(2.0**-50 * 1e3, rel=1e-12)
    assert OpenDPLatticeGaussianSampler().sensitivity_slack(sigma, n) == slack
    charged = GaussianEvent("z", delta, sigma).rho
    by_hand = (1.0 + 2.0**-40 * 3.0) ** 2 / (2 * 9.0)
    assert charged == pytest.approx(by_hand, rel=1e-15)
    assert charged > 1.0 / 18.0                            # the rounding is charged, not dropped
    opendp_rho = float(noise._opendp_measurement(sigma, n, -50).map(delta))
    assert opendp_rho == pytest.approx((1.0 + 2.0**-50 * 1e3) ** 2 / 18.0, rel=1e-14)
    assert opendp_rho <= charged
    # count draws and the calibration: sigma_for_rho inverts the charge exactly
    e = GaussianEvent("s3_query", 0.25, sigma_for_rho(0.25, 1e-3, 40), count=40)
    assert e.rho == pytest.approx(1e-3, rel=1e-12)
    assert e.sigma == pytest.approx(0.25 / (math.sqrt(2e-3 / 40) - 2.0**-40), rel=1e-14)
    # the exact sampler's map has no rounding term
    assert OpenDPGaussianSampler().sensitivity_slack(sigma, n) == 0.0


@pytest.mark.parametrize("sigma", [1e-6, 0.37, 3.0, 1234.5, 1e9])
def test_lattice_slack_within_the_charge_for_any_size(sigma):
    """An adversary may pick the vector size: the lattice shrinks with √n so that OpenDP's own
    rounding term stays ≤ ROUNDING_SLACK·σ (checked with OpenDP's map, no draw)."""
    for n in (1, 2, 3, 999, 10**6, 5 * 10**6 + 17, 10**9, 2**31 - 1):   # OpenDP sizes are i32
        k = lattice_exponent(sigma, n)
        assert Fraction(2) ** (2 * k) * n <= (Fraction(ROUNDING_SLACK / 2) * Fraction(sigma)) ** 2
        assert Fraction(2) ** (2 * k + 2) * n > (Fraction(ROUNDING_SLACK / 2) * Fraction(sigma)) ** 2
        assert opendp_sensitivity_slack(sigma, n, k) <= ROUNDING_SLACK * sigma


def test_midpoint_attack_is_covered_by_the_charge():
    """Neighbours x, x' (‖x − x'‖ ≤ Δ) placed just above / just below lattice midpoints, so that
    rounding pushes them apart by almost a full step per coordinate. The rounded mechanism's
    true ρ = ‖round(x) − round(x')‖²/(2σ²) exceeds the naive Δ²/(2σ²) — the attack is real —
    and stays below what the accountant charges and below OpenDP's map. Δ ≪ σ makes the rounding
    term large next to Δ (the adversary's best case)."""
    sigma, n, m = 0.7, 1024, 40                            # √n = 32 exactly
    s = OpenDPLatticeGaussianSampler(workers=1)
    k = s.lattice(sigma, n)
    step = Fraction(2) ** k
    eta = step / 2**20
    # per coordinate x − x' = m·2^k + 2η, so Δ = 32·(m·2^k + 2η) ≈ 2⁻³⁶·σ
    delta = float(32 * (m * step + 2 * eta))
    assert Fraction(delta) == 32 * (m * step + 2 * eta)
    x = np.full(n, float((m + Fraction(1, 2)) * step + eta))      # rounds up to (m+1)·2^k
    x2 = np.full(n, float(step / 2 - eta))                        # rounds down to 0
    assert Fraction(float(x[0])) == (m + Fraction(1, 2)) * step + eta    # exact floats
    dist2 = (Fraction(float(x[0])) - Fraction(float(x2[0]))) ** 2 * n
    assert dist2 <= Fraction(delta) ** 2                       # they are neighbours

    def rnd(v):                                                # nearest multiple of 2^k
        q = Fraction(float(v)) / step
        return math.floor(q + Fraction(1, 2)) * step
    v2 = (rnd(x[0]) - rnd(x2[0])) ** 2 * n
    true_rho = float(v2 / (2 * Fraction(sigma) ** 2))
    naive = delta**2 / (2 * sigma**2)
    charged = GaussianEvent("z", delta, sigma).rho
    opendp_rho = float(noise._opendp_measurement(sigma, n, k).map(delta))
    assert true_rho > naive * 1.04                              # rounding does add privacy loss
    assert true_rho <= opendp_rho <= charged
    # and the sampler takes these inputs through the mechanism (values + σ-noise)
    for v in (x, x2):
        assert _is_normal(s.add_noise(v, sigma) - v, sigma)


def test_lattice_sampler_through_worker_chunks():
    """Parallel chunks use the whole vector's lattice: every output is an exact multiple of 2^k
    (an exact lattice sum, |y| ≪ 2^(k+53)); a chunk drawn on 2⁻¹⁰⁷⁴ would not be."""
    sigma, n = 1.5, 6_000
    s = OpenDPLatticeGaussianSampler(workers=2, min_parallel=1_000)
    x = np.random.default_rng(3).normal(0, 1, n)
    y = s.add_noise(x, sigma)
    k = lattice_exponent(sigma, n)
    q = y / 2.0**k
    assert np.array_equal(q, np.round(q))
    d = y - x
    assert _is_normal(d, sigma)
    assert abs(np.corrcoef(d[:3000], d[3000:])[0, 1]) < 6 / np.sqrt(3000)
    # the exact sampler leaves this lattice (its outputs carry the input's low bits)
    e = OpenDPGaussianSampler(workers=1).add_noise(x, sigma) / 2.0**k
    assert not np.array_equal(e, np.round(e))


def test_lattice_draw_refused_when_rounding_exceeds_the_charge(monkeypatch):
    """A lattice coarser than the charge allows is refused before any draw."""
    monkeypatch.setattr(noise, "LATTICE_FRACTION", 2.0**-30)
    s = OpenDPLatticeGaussianSampler(workers=1)
    with pytest.raises(RuntimeError, match="exceeds the charged"):
        s.add_noise(np.zeros(100), 1.0)
