"""The vetted samplers: OpenDP's exact Gaussian (the default) and Google's secure Gaussian (python-dp,
opt-in), drawn in one process or in parallel chunks across worker processes.

What must hold for the privacy argument (docs/privacy.md "Noise"):
* the noise is N(0, σ²) per coordinate, and chunks drawn by different processes are independent
  (a forked worker sharing its parent's generator state would repeat noise: attack test below);
* the released floats are on the sampler's lattice gℤ — an exact lattice sum rounded once — which is
  what rules out Mironov-style float leaks (the naive numpy sampler fails this check);
* the inputs pass through the mechanism (value + noise), bad input is refused before any draw;
* the default everywhere is the exact OpenDP sampler, and the snapshot's report names it.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from streamdp.privacy import noise
from streamdp.privacy.noise import (DEFAULT_SAMPLER, GOOGLE_NAME, OPENDP_NAME, SAMPLER_KINDS,
                                    CSPRNGGaussianSampler, GoogleDPGaussianSampler,
                                    OpenDPGaussianSampler, google_granularity, make_sampler)

P_MIN = 1e-6          # a correct sampler fails a check with probability below this


def _is_normal(z: np.ndarray, sigma: float) -> bool:
    return stats.kstest(z / sigma, "norm").pvalue > P_MIN


def test_default_sampler_is_the_exact_opendp_one_everywhere():
    """google's per-draw failure probability (≈ 2⁻⁴⁵) is not charged to δ, so it is opt-in
    (docs/privacy.md, "Noise"); the default everywhere is OpenDP's exact Gaussian."""
    assert DEFAULT_SAMPLER == "opendp" and set(SAMPLER_KINDS) == {"google", "opendp", "fast"}
    assert make_sampler().name == OPENDP_NAME
    from streamdp.services.config import ServiceConfig
    from streamdp import StreamingSpectralLDA
    assert ServiceConfig.__dataclass_fields__["sampler"].default == "opendp"
    assert StreamingSpectralLDA(2, 1.0, epsilon=1.0).sampler.name == OPENDP_NAME
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
    assert snap.privacy["sampler"] == OPENDP_NAME
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
