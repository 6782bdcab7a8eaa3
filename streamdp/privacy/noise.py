"""Gaussian noise samplers.

All noise in streamdp is added through a :class:`GaussianSampler`'s
``add_noise(value, sigma)``; the release code never calls numpy's random
functions for noise directly. Two vetted samplers: Google's secure-noise Gaussian
through python-dp (:class:`GoogleDPGaussianSampler`, opt-in: its per-draw failure
probability is not charged to δ) and OpenDP's ``make_gaussian``, either on a σ-relative lattice
(:class:`OpenDPLatticeGaussianSampler`, the default: ≈ 4× the exact one per core, its rounding
charged by the accountant) or exact on the float lattice 2⁻¹⁰⁷⁴ (:class:`OpenDPGaussianSampler`);
all three are parallel over the machine's cores. The fast CSPRNG-seeded numpy sampler is an
explicit opt-in (``sampler="fast"``). :func:`make_sampler` chooses (:data:`DEFAULT_SAMPLER`).
Measurements: ``benchmarks/samplers.py``, docs/benchmarks.md, docs/privacy.md "Noise".

Every sampler reports ``sensitivity_slack(σ, n)``: how far its input rounding can move two
neighbouring n-entry inputs apart (L2). The accountant charges every draw for
Δ + ROUNDING_SLACK·σ (streamdp.privacy.events), and the vetted samplers refuse a draw whose
slack would exceed that.

:class:`CSPRNGGaussianSampler` is a numpy ``Generator`` (PCG64) whose 128-bit
seed comes from the operating system's CSPRNG (:mod:`secrets`). It is fast
(≈ 3.6·10⁷ draws/s measured here) but is a floating-point sampler: like every naive float Gaussian
it is exposed in principle to Mironov-style (2012) attacks on the low-order bits.
Passing an explicit ``seed`` makes noise reproducible and is for tests and
benchmarks only: anyone who knows the seed can subtract the noise. Such a
sampler says so in its name (:data:`SEEDED_NAME`, copied into every snapshot's
privacy report) and :func:`make_sampler` emits an :class:`InsecureNoiseWarning`.

Sampler names, as they appear in privacy reports:

* ``"opendp-gaussian-lattice:2^k<=2^-41*sigma/sqrt(n)"`` — OpenDP's Gaussian on the lattice
  2^k·ℤ, k chosen per draw from σ and the entry count n (:data:`OPENDP_LATTICE_NAME`), the default;
* ``"opendp-gaussian"`` — OpenDP's exact Gaussian (k = −1074);
* ``"google-dp-secure-gaussian"`` — Google's secure-noise Gaussian (python-dp), opt-in;
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

from streamdp.privacy.events import ROUNDING_SLACK


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
#: the lattice step is the largest power of two 2^k with 2^k·√n ≤ LATTICE_FRACTION·σ: half the
#: ROUNDING_SLACK the accountant charges, so OpenDP's own (upward-rounded) map stays below it
LATTICE_FRACTION = ROUNDING_SLACK / 2
OPENDP_LATTICE_NAME = "opendp-gaussian-lattice:2^k<=2^-41*sigma/sqrt(n)"
#: the kinds :func:`make_sampler` accepts, and the default everywhere (estimator, CLI, services)
SAMPLER_KINDS = ("opendp-lattice", "opendp", "google", "fast")
#: vetted, fully accounted (rounding charged via ROUNDING_SLACK), ≈ 4× "opendp" (exact);
#: "google" is opt-in (docs/privacy.md "Noise")
DEFAULT_SAMPLER = "opendp-lattice"
SEEDED_NAME = "numpy-pcg64-seeded-INSECURE-reproducible"


#: a sampler's status, named in every snapshot (issue 23 item 5). Vetted: OpenDP's Gaussians,
#: every failure mode accounted (lattice rounding charged). Anything else — "fast" (numpy
#: floats: the float Gaussian's known attacks), "google" (its ≈2^-45 per-draw failure
#: probability is not charged to δ), a seeded or a caller's own sampler — is non-production:
#: refused unless the caller sets non_production (services: config; estimator: keyword).
VETTED = "vetted"
NON_PRODUCTION = "non-production"
VETTED_KINDS = ("opendp-lattice", "opendp")


def sampler_status(sampler) -> str:
    """``VETTED`` or ``NON_PRODUCTION`` for a sampler kind (config word) or a sampler object."""
    if isinstance(sampler, str):
        return VETTED if sampler in VETTED_KINDS else NON_PRODUCTION
    return VETTED if getattr(sampler, "name", None) in (OPENDP_NAME, OPENDP_LATTICE_NAME) \
        else NON_PRODUCTION


def require_production_sampler(sampler, non_production: bool, *, field: str = "sampler") -> None:
    """The one rule: a non-vetted sampler only with an explicit ``non_production``."""
    if non_production or sampler_status(sampler) == VETTED:
        return
    name = sampler if isinstance(sampler, str) else getattr(sampler, "name", type(sampler).__name__)
    raise ValueError(
        f"{field} {name!r} is not a vetted sampler ('fast': numpy floats, not vetted; 'google': "
        "its ~2^-45 per-draw failure probability is not charged to delta). Use 'opendp-lattice' "
        "(the default) or 'opendp' in production; for tests and benchmarks set non_production "
        "(config: non_production: true; estimator/fit: non_production=True)")


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

    def sensitivity_slack(self, sigma: float, n: int) -> float:
        """No input rounding (the sum x + noise is a float sum: not vetted anyway)."""
        return 0.0


def make_sampler(kind: str = DEFAULT_SAMPLER, seed: int | None = None, *,
                 workers: int | None = None) -> GaussianSampler:
    """The sampler named by configuration.

    ``"opendp-lattice"`` (the default everywhere): OpenDP's vetted Gaussian on a σ-relative
    lattice (≈ 8·10⁴ draws/s per core), its rounding charged by the accountant. ``"opendp"``:
    OpenDP's exact Gaussian on 2⁻¹⁰⁷⁴ (≈ 2·10⁴ draws/s per core). ``"google"``: Google's
    secure-noise Gaussian through python-dp, ≈ 4·10⁵ draws/s per core, opt-in (its ≈ 2⁻⁴⁵
    per-draw failure probability is not charged to δ). Large vectors are drawn in parallel on
    ``workers`` processes (default: the CPUs this process may use). ``"fast"``: the
    CSPRNG-seeded numpy sampler, an explicit opt-in (docs/privacy_accounting.md). A ``seed`` makes noise reproducible — tests and
    benchmarks only — and implies the fast sampler, since the vetted samplers cannot be seeded.
    """
    if seed is not None:
        warnings.warn(f"noise_seed={seed}: reproducible noise ({SEEDED_NAME}) - anyone who knows "
                      "the seed can subtract the noise; tests and benchmarks only, never production",
                      InsecureNoiseWarning, stacklevel=2)
        return CSPRNGGaussianSampler(seed)
    if kind == "google":
        return GoogleDPGaussianSampler(workers=workers)
    if kind == "opendp-lattice":
        return OpenDPLatticeGaussianSampler(workers=workers)
    if kind == "opendp":
        return OpenDPGaussianSampler(workers=workers)
    if kind == "fast":
        return CSPRNGGaussianSampler()
    raise ValueError(f"noise sampler must be one of {SAMPLER_KINDS} ('opendp-lattice': OpenDP's "
                     f"Gaussian on a σ-relative lattice, vetted, default; 'opendp': OpenDP's exact "
                     f"Gaussian, vetted, slow; 'google': Google's secure Gaussian, vetted, its "
                     f"failure probability not charged; 'fast': CSPRNG-seeded numpy), got {kind!r}")


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
        # the directory holding the streamdp package (this file is streamdp/privacy/noise.py)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, "1")
        self.proc = subprocess.Popen([sys.executable, "-m", "streamdp.privacy.noise_worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def send(self, kind: str, values: np.ndarray, sigma: float, k: int) -> None:
        code = {"google": b"g", "opendp": b"o"}[kind]
        self.proc.stdin.write(WORKER_HEADER.pack(code, sigma, values.size, k))
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


#: OpenDP's finest granularity for float64 (the subnormal step): exact, no rounding
EXACT_K = -1074

#: one request to a worker (:mod:`streamdp.privacy.noise_worker` documents the protocol): kind,
#: σ, n, lattice exponent k. Defined here, not in the worker, so this module never imports it
WORKER_HEADER = struct.Struct("<cdQi")
WORKER_KINDS = {b"g": "google", b"o": "opendp"}

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


def _draw_chunk(kind: str, values: np.ndarray, sigma: float, k: int = EXACT_K) -> np.ndarray:
    """``values`` + noise by the vetted mechanism ``kind`` (in a worker or in this process);
    OpenDP rounds ``values`` to the lattice 2^k·ℤ (k = −1074: exact, every float is on it)."""
    if kind == "google":
        add = _google_mechanism(sigma).add_noise
        return np.fromiter(map(add, values.tolist()), dtype=np.float64, count=values.size)
    if kind == "opendp":
        return np.asarray(_opendp_measurement(sigma, values.size, k)(values.tolist()),
                          dtype=np.float64)
    raise ValueError(f"unknown vetted sampler {kind!r}")


def _parallel_add_noise(kind: str, x: np.ndarray, sigma: float, workers: int,
                        min_parallel: int, k: int = EXACT_K) -> np.ndarray:
    """Chunks of one draw, all on the same lattice 2^k (chosen by the caller for the whole
    vector, so the whole draw's rounding distance is 2^k·√n whatever the chunking)."""
    flat = np.ascontiguousarray(x, dtype=np.float64).ravel()
    n_chunks = min(workers, max(1, flat.size // max(1, min_parallel)))
    here = not (_FORKED and kind == "google")      # may this process draw a chunk itself?
    if n_chunks <= 1 and here:
        return _draw_chunk(kind, flat, sigma, k).reshape(x.shape)
    with _WORKERS_LOCK:
        return _draw_with_workers(kind, flat, sigma, n_chunks, here, k).reshape(x.shape)


def _draw_with_workers(kind: str, flat: np.ndarray, sigma: float, n_chunks: int,
                       here: bool, k: int = EXACT_K) -> np.ndarray:
    chunks = np.array_split(flat, n_chunks)
    remote = chunks[1:] if here else chunks
    pool = _workers(len(remote))
    try:
        # chunks in worker processes; this process draws the first one meanwhile
        for w, c in zip(pool, remote):
            w.send(kind, c, sigma, k)
        first = [_draw_chunk(kind, chunks[0], sigma, k)] if here else []
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
def _opendp_measurement(sigma: float, n: int, k: int = EXACT_K):
    import opendp.prelude as dp

    dp.enable_features("contrib")
    space = (dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n), dp.l2_distance(T=float))
    if k == EXACT_K:
        return dp.m.make_gaussian(*space, scale=float(sigma))
    return dp.m.make_gaussian(*space, scale=float(sigma), k=int(k))


def lattice_exponent(sigma: float, n: int) -> int:
    """The lattice 2^k of the default OpenDP sampler for a draw of n entries at σ: the largest
    k with 2^k·√n ≤ LATTICE_FRACTION·σ (exact rational comparison, 4^k·n ≤ (fσ)²), never below
    OpenDP's finest −1074. σ is public, n the public shape: the choice reveals nothing."""
    from fractions import Fraction

    if not (sigma > 0 and math.isfinite(sigma)) or n < 1:
        raise ValueError(f"lattice_exponent needs sigma > 0 finite and n >= 1, got {sigma}, {n}")
    bound = (Fraction(LATTICE_FRACTION) * Fraction(sigma)) ** 2 / n     # 4^k ≤ bound
    k = math.floor(math.log2(LATTICE_FRACTION * sigma / math.sqrt(n))) + 1
    while Fraction(4) ** k > bound:          # the float guess may be one off: fix it exactly
        k -= 1
    while Fraction(4) ** (k + 1) <= bound:
        k += 1
    return max(EXACT_K, k)


def opendp_sensitivity_slack(sigma: float, n: int, k: int) -> float:
    """The rounding term of OpenDP's own privacy map for ``make_gaussian`` on n floats with
    granularity 2^k: its map is ρ(Δ) = (Δ + s)²/(2σ²) with s = (2^k − 2^−1074)·√n (OpenDP
    ``get_rounding_distance``; rounded up), so s = σ·√(2·ρ(0)). 0 for k = −1074."""
    return float(sigma) * math.sqrt(2.0 * float(_opendp_measurement(float(sigma), int(n), k).map(0.0)))


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

    def sensitivity_slack(self, sigma: float, n: int) -> float:
        """g·√n (rounding to gℤ moves each entry by ≤ g/2): < 2⁻⁴⁰·σ for n ≤ 10⁹, inside the
        ROUNDING_SLACK·σ every event is charged for."""
        return google_granularity(sigma) * math.sqrt(n)


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

    def lattice(self, sigma: float, n: int) -> int:
        """The granularity exponent k of a draw (−1074 here: exact)."""
        return EXACT_K

    def sensitivity_slack(self, sigma: float, n: int) -> float:
        """The rounding term of OpenDP's privacy map for this draw (0 here, exact lattice)."""
        return opendp_sensitivity_slack(sigma, n, self.lattice(sigma, n))


class OpenDPLatticeGaussianSampler(OpenDPGaussianSampler):
    """OpenDP's vetted Gaussian on a σ-relative lattice: the default sampler.

    The same mechanism as :class:`OpenDPGaussianSampler` with the granularity argument ``k`` of
    ``make_gaussian``: the input vector is rounded to the nearest multiple of 2^k, an exact
    discrete Gaussian on 2^k·ℤ is added (rational arithmetic, OS entropy), the exact sum is
    rounded once to a float. k is chosen per draw from the public σ and entry count n
    (:func:`lattice_exponent`: 2^k·√n ≤ 2⁻⁴¹·σ), so σ/2^k ≈ 2⁴¹·√n lattice steps: the
    arithmetic stays within a few machine words instead of OpenDP's ≈ 1,075-bit integers at
    k = −1074, ≈ 4× faster per core (docs/benchmarks.md "Lattice sampler").

    Rounding moves two neighbouring inputs apart by up to s = (2^k − 2^−1074)·√n in L2, and
    OpenDP's privacy map says so: ρ = (Δ + s)²/(2σ²). Before every draw this sampler asks
    OpenDP's map for s (:meth:`sensitivity_slack`) and refuses to draw unless
    s ≤ ROUNDING_SLACK·σ, the term every :class:`~streamdp.privacy.events.GaussianEvent` is
    charged for (docs/privacy.md "Noise"). The parallel chunks all use the whole vector's k.
    """

    name = OPENDP_LATTICE_NAME

    def lattice(self, sigma: float, n: int) -> int:
        return lattice_exponent(sigma, n)

    def add_noise(self, value, sigma: float) -> np.ndarray:
        """``value`` rounded to 2^k·ℤ + exact discrete Gaussian noise, by OpenDP (float64)."""
        x = np.asarray(value, dtype=np.float64)
        _check_vetted_input(x, sigma, "OpenDP lattice Gaussian")
        if x.size == 0:
            return x.copy()
        sigma = float(sigma)
        k = self.lattice(sigma, x.size)
        slack = opendp_sensitivity_slack(sigma, x.size, k)
        if not slack <= ROUNDING_SLACK * sigma:
            raise RuntimeError(f"OpenDP lattice 2^{k} for n={x.size}, σ={sigma}: rounding term "
                               f"{slack:.3g} exceeds the charged {ROUNDING_SLACK * sigma:.3g}")
        return _parallel_add_noise("opendp", x, sigma, self.workers, self.min_parallel, k)
