"""Gaussian noise samplers.

All noise in streamdp is added through a :class:`GaussianSampler`'s
``add_noise(value, sigma)``; the release code never calls numpy's random
functions for noise directly. The default everywhere is OpenDP's vetted
sampler (:class:`OpenDPGaussianSampler`); the fast CSPRNG-seeded sampler is an
explicit opt-in (``sampler="fast"``), chosen by :func:`make_sampler`.

:class:`CSPRNGGaussianSampler` is a numpy ``Generator`` (PCG64) whose 128-bit
seed comes from the operating system's CSPRNG (:mod:`secrets`). It is fast
(≈ 3.6·10⁷ draws/s measured here) but is a floating-point sampler: like every naive float Gaussian
it is exposed in principle to Mironov-style (2012) attacks on the low-order bits.
Passing an explicit ``seed`` makes noise reproducible and is for tests and
benchmarks only: anyone who knows the seed can subtract the noise. Such a
sampler says so in its name (:data:`SEEDED_NAME`, copied into every snapshot's
privacy report) and :func:`make_sampler` emits an :class:`InsecureNoiseWarning`.

Sampler names, as they appear in privacy reports:

* ``"opendp-gaussian"`` — OpenDP's vetted sampler (the default);
* ``"numpy-pcg64-csprng"`` — the fast sampler, seeded from the OS CSPRNG;
* ``"numpy-pcg64-seeded-INSECURE-reproducible"`` — the fast sampler with a
  known seed: NOT private, tests and benchmarks only.
"""
from __future__ import annotations

import secrets
import warnings
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class GaussianSampler(Protocol):
    name: str

    def sample(self, sigma: float, shape: tuple[int, ...] | int) -> np.ndarray:
        """i.i.d. N(0, sigma²) draws of the given shape (float64)."""
        ...

    def add_noise(self, value, sigma: float) -> np.ndarray:
        """``value`` + i.i.d. N(0, sigma²) noise (same shape, float64)."""
        ...


CSPRNG_NAME = "numpy-pcg64-csprng"
SEEDED_NAME = "numpy-pcg64-seeded-INSECURE-reproducible"


class InsecureNoiseWarning(UserWarning):
    """Noise from a known seed: reproducible, hence no privacy guarantee."""


class CSPRNGGaussianSampler:
    """PCG64 seeded with 128 bits from the OS CSPRNG (or an explicit test seed).

    ``name`` is :data:`CSPRNG_NAME`, or :data:`SEEDED_NAME` when a seed was given.
    """

    name = CSPRNG_NAME

    def __init__(self, seed: int | None = None) -> None:
        self.reproducible = seed is not None
        self.name = SEEDED_NAME if self.reproducible else CSPRNG_NAME
        if seed is None:
            seed = secrets.randbits(128)
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def sample(self, sigma: float, shape: tuple[int, ...] | int) -> np.ndarray:
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        return self._rng.normal(0.0, sigma, size=shape)

    def add_noise(self, value, sigma: float) -> np.ndarray:
        x = np.asarray(value, dtype=np.float64)
        return x + self.sample(sigma, x.shape)


def make_sampler(kind: str = "opendp", seed: int | None = None) -> GaussianSampler:
    """The sampler named by configuration.

    ``"opendp"`` (the default everywhere): OpenDP's vetted Gaussian, exact and
    slow (≈ 2·10⁴ draws/s). ``"fast"``: the CSPRNG-seeded numpy sampler, an
    explicit opt-in for large d·k' or frequent releases (docs/privacy_accounting.md).
    A ``seed`` makes noise reproducible — tests and benchmarks only — and
    implies the fast sampler, since OpenDP's sampler cannot be seeded.
    """
    if seed is not None:
        warnings.warn(f"noise_seed={seed}: reproducible noise ({SEEDED_NAME}) - anyone who knows "
                      "the seed can subtract the noise; tests and benchmarks only, never production",
                      InsecureNoiseWarning, stacklevel=2)
        return CSPRNGGaussianSampler(seed)
    if kind == "opendp":
        return OpenDPGaussianSampler()
    if kind == "fast":
        return CSPRNGGaussianSampler()
    raise ValueError(f"noise sampler must be 'opendp' (vetted, default) or 'fast' "
                     f"(CSPRNG-seeded numpy), got {kind!r}")


class OpenDPGaussianSampler:
    """OpenDP's vetted Gaussian mechanism (``make_gaussian``, opendp ≥ 0.16).

    What OpenDP does with floats: with the default granularity (k = −1074, the
    smallest float step) the input is on the lattice 2^k·ℤ exactly, noise is an
    *exact* discrete Gaussian on that lattice — sampled with arbitrary-precision
    rational arithmetic (Canonne–Kamath–Steinke 2020) from the OS entropy
    source — and the exact sum is rounded once to the nearest float. Rounding is
    post-processing, so none of the floating-point leaks of naive samplers
    (Mironov 2012: gaps and non-uniform spacing in sampled floats) apply, and
    OpenDP's privacy map for this measurement is exactly Δ²/(2σ²).

    Two ways to use it:

    * :meth:`add_noise` (preferred) passes the true values through OpenDP, so
      the released float is ``round(x + Z)`` as analysed by OpenDP's proof.
    * :meth:`sample` (the :class:`GaussianSampler` protocol) returns noise for a
      zero vector. The caller's ``x + noise`` in float64 is a second rounding
      that depends on x; the noise itself is exact, but the sum is outside
      OpenDP's proof (much weaker exposure than a naive sampler, not zero).

    Speed, measured on the development machine (one core, opendp 0.16.0,
    vectors of 10^3–10^5 entries): ≈ 21,000 samples/s for both methods, i.e.
    ≈ 14 s for a 300k-entry block (DESIGN §4 quotes ≈ 25,000/s). The fast
    :class:`CSPRNGGaussianSampler` drew ≈ 3.6·10^7 samples/s on the same
    machine, ~1,700 times faster.
    """

    name = "opendp-gaussian"

    def __init__(self) -> None:
        import opendp.prelude as dp

        dp.enable_features("contrib")
        self._dp = dp
        self.reproducible = False

    def _measurement(self, sigma: float, n: int):
        dp = self._dp
        space = (dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n),
                 dp.l2_distance(T=float))
        return dp.m.make_gaussian(*space, scale=float(sigma))

    def add_noise(self, value, sigma: float) -> np.ndarray:
        """``value`` + i.i.d. N(0, σ²) noise, computed by OpenDP (same shape, float64)."""
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        x = np.asarray(value, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ValueError("OpenDP Gaussian: values must be finite")
        if x.size == 0:
            return x.copy()
        out = self._measurement(sigma, x.size)(x.ravel().tolist())
        return np.asarray(out, dtype=np.float64).reshape(x.shape)

    def sample(self, sigma: float, shape: tuple[int, ...] | int) -> np.ndarray:
        """i.i.d. N(0, σ²) draws of the given shape: OpenDP noise on a zero vector."""
        return self.add_noise(np.zeros(shape), sigma)
