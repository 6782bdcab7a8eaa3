"""Gaussian noise samplers.

All noise in streamdp is added through a :class:`GaussianSampler`'s
``add_noise(value, sigma)``; the release code never calls numpy's random
functions for noise directly. Two vetted samplers: Google's secure-noise Gaussian
through python-dp (:class:`GoogleDPGaussianSampler`, the default everywhere since
issue 13: ≈ 20× OpenDP per core, and parallel over the machine's cores) and OpenDP's
(:class:`OpenDPGaussianSampler`); the fast CSPRNG-seeded numpy sampler is an explicit
opt-in (``sampler="fast"``). :func:`make_sampler` chooses (:data:`DEFAULT_SAMPLER`).
Measurements: ``benchmarks/samplers.py``, docs/privacy_accounting.md "Noise samplers".

:class:`CSPRNGGaussianSampler` is a numpy ``Generator`` (PCG64) whose 128-bit
seed comes from the operating system's CSPRNG (:mod:`secrets`). It is fast
(≈ 3.6·10⁷ draws/s measured here) but is a floating-point sampler: like every naive float Gaussian
it is exposed in principle to Mironov-style (2012) attacks on the low-order bits.
Passing an explicit ``seed`` makes noise reproducible and is for tests and
benchmarks only: anyone who knows the seed can subtract the noise. Such a
sampler says so in its name (:data:`SEEDED_NAME`, copied into every snapshot's
privacy report) and :func:`make_sampler` emits an :class:`InsecureNoiseWarning`.

Sampler names, as they appear in privacy reports:

* ``"google-dp-secure-gaussian"`` — Google's secure-noise Gaussian (python-dp), the default;
* ``"opendp-gaussian"`` — OpenDP's vetted sampler;
* ``"numpy-pcg64-csprng"`` — the fast sampler, seeded from the OS CSPRNG;
* ``"numpy-pcg64-seeded-INSECURE-reproducible"`` — the fast sampler with a
  known seed: NOT private, tests and benchmarks only.
"""
from __future__ import annotations

import atexit
import math
import os
import secrets
import struct
import subprocess
import sys
import threading
import warnings
from functools import lru_cache
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
GOOGLE_NAME = "google-dp-secure-gaussian"
OPENDP_NAME = "opendp-gaussian"
#: the kinds :func:`make_sampler` accepts, and the default everywhere (estimator, CLI, services)
SAMPLER_KINDS = ("google", "opendp", "fast")
DEFAULT_SAMPLER = "opendp"   # exact, fully accounted; "google" is opt-in (docs/privacy.md "Noise")
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


def make_sampler(kind: str = DEFAULT_SAMPLER, seed: int | None = None, *,
                 workers: int | None = None) -> GaussianSampler:
    """The sampler named by configuration.

    ``"google"`` (the default everywhere): Google's secure-noise Gaussian through python-dp,
    vetted, ≈ 4·10⁵ draws/s per core, large vectors drawn in parallel on ``workers`` processes
    (default: the CPUs this process may use). ``"opendp"``: OpenDP's vetted Gaussian, exact and
    slow (≈ 2–3·10⁴ draws/s per core). ``"fast"``: the CSPRNG-seeded numpy sampler, an explicit
    opt-in (docs/privacy_accounting.md). A ``seed`` makes noise reproducible — tests and
    benchmarks only — and implies the fast sampler, since the vetted samplers cannot be seeded.
    """
    if seed is not None:
        warnings.warn(f"noise_seed={seed}: reproducible noise ({SEEDED_NAME}) - anyone who knows "
                      "the seed can subtract the noise; tests and benchmarks only, never production",
                      InsecureNoiseWarning, stacklevel=2)
        return CSPRNGGaussianSampler(seed)
    if kind == "google":
        return GoogleDPGaussianSampler(workers=workers)
    if kind == "opendp":
        return OpenDPGaussianSampler(workers=workers)
    if kind == "fast":
        return CSPRNGGaussianSampler()
    raise ValueError(f"noise sampler must be one of {SAMPLER_KINDS} ('google': Google's secure "
                     f"Gaussian, vetted, default; 'opendp': OpenDP's, vetted, slow; 'fast': "
                     f"CSPRNG-seeded numpy), got {kind!r}")


def default_workers() -> int:
    """The CPUs this process may use (the parallel draw's default number of processes): the
    CPUs it may run on, capped by a cgroup v2 CPU quota (a container's CPU limit)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):        # not on Linux
        n = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, n)


# --- parallel draws: chunks of one vector, each drawn by an independent vetted mechanism ---
#
# Why this keeps the guarantee: the Gaussian mechanism on a vector adds i.i.d. noise to each
# coordinate; drawing disjoint chunks with separate calls of the same mechanism gives the same
# joint distribution, and the chunks' privacy losses compose to exactly the whole vector's
# (Σ_i Δ_i²/(2σ²) ≤ Δ²/(2σ²) since the chunks' L2 sensitivities satisfy Σ_i Δ_i² ≤ Δ²). The
# accountant is charged once per release (the spend protocol around the whole draw), not per
# chunk. Workers are fresh interpreters (``python -m streamdp.privacy.noise_worker``), never
# forks: a forked child would inherit the parent's random-generator state (python-dp buffers
# its CSPRNG output) and two chunks could repeat the same noise — tests/test_noise_samplers.py
# checks that they do not.

class _Worker:
    """One persistent noise-worker process, fed over its stdin/stdout."""

    def __init__(self) -> None:
        import streamdp

        root = os.path.dirname(os.path.dirname(os.path.abspath(streamdp.__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, "1")
        self.proc = subprocess.Popen([sys.executable, "-m", "streamdp.privacy.noise_worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def send(self, kind: str, values: np.ndarray, sigma: float) -> None:
        from streamdp.privacy.noise_worker import HEADER
        code = {"google": b"g", "opendp": b"o"}[kind]
        self.proc.stdin.write(HEADER.pack(code, sigma, values.size))
        self.proc.stdin.write(np.ascontiguousarray(values, dtype="<f8").tobytes())
        self.proc.stdin.flush()

    def receive(self, n: int) -> np.ndarray:
        out = self.proc.stdout
        status = out.read(1)
        if status == b"+":
            data = out.read(8 * n)
            if len(data) == 8 * n:
                return np.frombuffer(data, dtype="<f8").astype(np.float64)
        elif status == b"-":
            (length,) = struct.unpack("<Q", out.read(8))
            raise RuntimeError(f"noise worker: {out.read(length).decode(errors='replace')}")
        raise RuntimeError(f"noise worker (pid {self.proc.pid}) died "
                           f"(exit code {self.proc.poll()})")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except Exception:
            self.proc.kill()


_WORKERS: list[_Worker] = []
_WORKERS_LOCK = threading.Lock()     # one draw at a time talks to the workers
# python-dp draws from a buffer of CSPRNG output kept in the process: a fork copies it, and
# parent and child then draw the SAME noise (tests/test_noise_samplers.py shows it). A forked
# process therefore never draws Google noise itself: every chunk goes to a fresh worker.
_FORKED = False


def _after_fork_in_child() -> None:
    global _FORKED, _WORKERS_LOCK
    _FORKED = True
    _WORKERS.clear()          # the parent's workers: their pipes are the parent's to use
    _WORKERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _workers(n: int) -> list[_Worker]:
    while len(_WORKERS) < n:
        _WORKERS.append(_Worker())
    return _WORKERS[:n]


@atexit.register
def _close_workers() -> None:
    while _WORKERS:
        _WORKERS.pop().close()


def _draw_chunk(kind: str, values: np.ndarray, sigma: float) -> np.ndarray:
    """``values`` + noise by the vetted mechanism ``kind`` (in a worker or in this process)."""
    if kind == "google":
        add = _google_mechanism(sigma).add_noise
        return np.fromiter(map(add, values.tolist()), dtype=np.float64, count=values.size)
    if kind == "opendp":
        return np.asarray(_opendp_measurement(sigma, values.size)(values.tolist()), dtype=np.float64)
    raise ValueError(f"unknown vetted sampler {kind!r}")


def _parallel_add_noise(kind: str, x: np.ndarray, sigma: float, workers: int,
                        min_parallel: int) -> np.ndarray:
    flat = np.ascontiguousarray(x, dtype=np.float64).ravel()
    n_chunks = min(workers, max(1, flat.size // max(1, min_parallel)))
    here = not (_FORKED and kind == "google")      # may this process draw a chunk itself?
    if n_chunks <= 1 and here:
        return _draw_chunk(kind, flat, sigma).reshape(x.shape)
    with _WORKERS_LOCK:
        return _draw_with_workers(kind, flat, sigma, n_chunks, here).reshape(x.shape)


def _draw_with_workers(kind: str, flat: np.ndarray, sigma: float, n_chunks: int,
                       here: bool) -> np.ndarray:
    chunks = np.array_split(flat, n_chunks)
    remote = chunks[1:] if here else chunks
    pool = _workers(len(remote))
    try:
        # chunks in worker processes; this process draws the first one meanwhile
        for w, c in zip(pool, remote):
            w.send(kind, c, sigma)
        first = [_draw_chunk(kind, chunks[0], sigma)] if here else []
        rest = [w.receive(c.size) for w, c in zip(pool, remote)]
    except BaseException:
        for w in pool:                  # a worker in an unknown state is never reused
            if w in _WORKERS:
                _WORKERS.remove(w)
            w.close()
        raise
    return np.concatenate([*first, *rest])


def _check_vetted_input(x: np.ndarray, sigma: float, who: str) -> None:
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be a finite number > 0, got {sigma}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{who}: values must be finite")


@lru_cache(maxsize=64)
def _google_mechanism(sigma: float):
    from pydp.algorithms.numerical_mechanisms import GaussianMechanism

    return GaussianMechanism.create_from_standard_deviation(float(sigma))


@lru_cache(maxsize=64)
def _opendp_measurement(sigma: float, n: int):
    import opendp.prelude as dp

    dp.enable_features("contrib")
    space = (dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n), dp.l2_distance(T=float))
    return dp.m.make_gaussian(*space, scale=float(sigma))


def google_granularity(sigma: float) -> float:
    """The lattice step g of Google's secure Gaussian at σ: the next power of two ≥ 2σ/2⁵⁷."""
    return 2.0 ** math.ceil(math.log2(2.0 * sigma / 2.0**57))


def _parallel_settings(workers: int | None, min_parallel: int) -> tuple[int, int]:
    """(workers, min_parallel) of a vetted sampler's parallel draws; ``None``: one per usable CPU."""
    n = default_workers() if workers is None else int(workers)
    if n < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return n, int(min_parallel)


class GoogleDPGaussianSampler:
    """Google's secure-noise Gaussian (python-dp ≥ 1.1.5, the C++ library of google/differential-privacy).

    What it does with floats (``GaussianMechanism::AddDoubleNoise``): the input is rounded to
    the lattice gℤ, g = the next power of two ≥ 2σ/2⁵⁷ (so σ/g ∈ (2⁵⁵, 2⁵⁶]); the noise is
    g·(B − n/2) for a binomial B of n = (2σ/g)² fair coins, drawn by rejection sampling from
    a CSPRNG (BoringSSL), which approximates N(0, σ²) on the lattice ("Secure Noise
    Generation", Google 2020: the binomial's privacy loss matches the Gaussian's up to a
    failure probability ≈ 2⁻⁴⁵); the lattice sum is exact and rounded once to a float. So, as
    with OpenDP, the output is a function of an exact lattice sum and no Mironov-style float
    leak applies. streamdp accounts each draw as the Gaussian of the same σ (as Google's own
    libraries do).

    Rounding the input to gℤ moves each coordinate by ≤ g/2, so the L2 sensitivity of the
    rounded vector is ≤ Δ + g√n. :meth:`add_noise` refuses vectors of more than
    :attr:`max_entries` = 10⁹ entries, which keeps g√n ≤ 9·10⁻¹³·σ; the extra zCDP is then
    ((Δ + g√n)² − Δ²)/(2σ²) ≤ 10⁻¹²·√(2ρ) + 10⁻²⁴ for an event of ρ = Δ²/(2σ²): below every
    other rounding in the accounting (docs/privacy.md, "Noise").

    Speed: python-dp noises one scalar per call (≈ 4.6·10⁵ calls/s per core here); vectors of
    at least ``min_parallel`` entries per process are split across ``workers`` processes
    (fresh interpreters, persistent), this process drawing one chunk itself.
    """

    name = GOOGLE_NAME
    max_entries = 10**9

    def __init__(self, workers: int | None = None, min_parallel: int = 100_000) -> None:
        _google_mechanism(1.0)             # fail at start-up, not at the first release
        self.workers, self.min_parallel = _parallel_settings(workers, min_parallel)
        self.reproducible = False

    def add_noise(self, value, sigma: float) -> np.ndarray:
        """``value`` + i.i.d. secure N(0, σ²) noise (same shape, float64)."""
        x = np.asarray(value, dtype=np.float64)
        _check_vetted_input(x, sigma, "Google DP Gaussian")
        if x.size > self.max_entries:
            raise ValueError(f"Google DP Gaussian: {x.size} entries in one draw, more than "
                             f"{self.max_entries} (the lattice-rounding bound, docs/privacy.md)")
        if x.size == 0:
            return x.copy()
        return _parallel_add_noise("google", x, float(sigma), self.workers, self.min_parallel)

    def sample(self, sigma: float, shape: tuple[int, ...] | int) -> np.ndarray:
        """i.i.d. N(0, σ²) draws of the given shape: the mechanism on a zero vector."""
        return self.add_noise(np.zeros(shape), sigma)


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

    name = OPENDP_NAME

    def __init__(self, workers: int | None = 1, min_parallel: int = 20_000) -> None:
        import opendp.prelude as dp

        dp.enable_features("contrib")
        self.workers, self.min_parallel = _parallel_settings(workers, min_parallel)
        self.reproducible = False

    def add_noise(self, value, sigma: float) -> np.ndarray:
        """``value`` + i.i.d. N(0, σ²) noise, computed by OpenDP (same shape, float64)."""
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        x = np.asarray(value, dtype=np.float64)
        _check_vetted_input(x, sigma, "OpenDP Gaussian")
        if x.size == 0:
            return x.copy()
        return _parallel_add_noise("opendp", x, float(sigma), self.workers, self.min_parallel)

    def sample(self, sigma: float, shape: tuple[int, ...] | int) -> np.ndarray:
        """i.i.d. N(0, σ²) draws of the given shape: OpenDP noise on a zero vector."""
        return self.add_noise(np.zeros(shape), sigma)
