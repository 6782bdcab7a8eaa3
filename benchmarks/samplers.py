"""Gaussian samplers: draws per second for each option (issue 13, item 4).

Each option noises one float64 vector of ``--n`` entries with ``add_noise(x, σ)`` (the call every
release path makes), best of ``--repeats`` runs after one warm-up call (which starts worker
processes and builds the mechanisms). Options:

* ``google`` — Google's secure-noise Gaussian through python-dp (vetted), one process, and
  ``google×W`` on W processes (chunks of the vector, each an independent draw);
* ``opendp`` — OpenDP ``make_gaussian`` on the float vector domain (vetted; default lattice
  2⁻¹⁰⁷⁴), one process and ``opendp×W``; ``opendp-k-40``: the same on the coarser lattice 2⁻⁴⁰
  (its privacy map then carries the rounding, so σ would have to grow slightly);
* ``fast`` — numpy PCG64 seeded from the OS CSPRNG (not vetted: a naive float sampler).

The machine is shared: ``uptime``'s load average is recorded before and after, and the samples
per CPU second (this process and its noise workers) are reported next to the samples per second.

    python benchmarks/samplers.py --n 400000 --json benchmarks/results/samplers.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, write_json  # noqa: E402

from streamdp.privacy.noise import (CSPRNGGaussianSampler, GoogleDPGaussianSampler,  # noqa: E402
                                    OpenDPGaussianSampler, default_workers)

SIGMA = 3.0


class _OpenDPCoarse:
    """OpenDP on the lattice 2^k (k = −40): faster, but rounding costs sensitivity."""

    name = "opendp-k-40"

    def add_noise(self, x, sigma):
        import opendp.prelude as dp
        dp.enable_features("contrib")
        m = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T=float, nan=False), size=x.size),
                               dp.l2_distance(T=float), scale=sigma, k=-40)
        return np.asarray(m(x.ravel().tolist())).reshape(x.shape)


def options(workers: int, which: set[str]):
    out = []
    if "google" in which:
        out.append(("google", "vetted", 1, GoogleDPGaussianSampler(workers=1)))
        if workers > 1:
            out.append((f"google×{workers}", "vetted", workers, GoogleDPGaussianSampler(workers=workers)))
    if "opendp" in which:
        out.append(("opendp", "vetted", 1, OpenDPGaussianSampler(workers=1)))
        if workers > 1:
            out.append((f"opendp×{workers}", "vetted", workers, OpenDPGaussianSampler(workers=workers)))
        out.append(("opendp-k-40", "vetted (Δ + 2⁻⁴⁰√n)", 1, _OpenDPCoarse()))
    if "fast" in which:
        out.append(("fast", "NOT vetted (naive float)", 1, CSPRNGGaussianSampler()))
    return out


def cpu_seconds() -> float:
    """CPU time of this process and of the noise worker processes."""
    import resource

    import psutil

    from streamdp.privacy import noise
    ru = resource.getrusage(resource.RUSAGE_SELF)
    total = ru.ru_utime + ru.ru_stime
    for w in noise._WORKERS:
        t = psutil.Process(w.proc.pid).cpu_times()
        total += t.user + t.system
    return total


def measure(sampler, n: int, repeats: int) -> tuple[float, float]:
    """(samples per wall second, samples per CPU second), best of ``repeats``."""
    x = np.random.default_rng(0).normal(size=n)
    sampler.add_noise(x[: min(n, 50_000)], SIGMA)      # warm-up: workers, imports, mechanisms
    sampler.add_noise(x, SIGMA)
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        t, c = time.perf_counter(), cpu_seconds()
        y = sampler.add_noise(x, SIGMA)
        best = min(best, time.perf_counter() - t)
        best_cpu = min(best_cpu, cpu_seconds() - c)
    assert y.shape == x.shape and abs(float(np.std(y - x)) / SIGMA - 1) < 0.05
    return n / best, n / best_cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=400_000, help="entries per draw")
    ap.add_argument("--opendp-n", type=int, default=100_000, help="entries per draw for OpenDP (slow)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--only", default="google,opendp,fast")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    rows = []
    for name, vetted, w, sampler in options(args.workers, set(args.only.split(","))):
        n = args.opendp_n if name.startswith("opendp") else args.n
        rate, per_cpu = measure(sampler, n, args.repeats)
        rows.append({"option": name, "vetted": vetted, "processes": w, "entries": n,
                     "samples/s": rate, "samples per CPU s": per_cpu, "s per 10^7": 1e7 / rate})
        print(f"{name}: {rate:,.0f} samples/s, {per_cpu:,.0f} per CPU second", flush=True)
    load_after = os.getloadavg()
    print()
    print(markdown_table(rows, ["option", "vetted", "processes", "entries", "samples/s",
                                "samples per CPU s", "s per 10^7"]))
    print(f"\nload average (1, 5, 15 min) before {load_before}, after {load_after}; "
          f"{os.cpu_count()} CPUs")
    write_json(args.json, {"sigma": SIGMA, "rows": rows, "load_before": load_before,
                           "load_after": load_after})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
