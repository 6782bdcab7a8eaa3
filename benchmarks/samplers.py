"""Gaussian samplers: draws per second for each option (issue 13, item 4).

Each option noises one float64 vector of ``--n`` entries with ``add_noise(x, σ)`` (the call every
release path makes), best of ``--repeats`` runs after one warm-up call (which starts worker
processes and builds the mechanisms). Options:

* ``google`` — Google's secure-noise Gaussian through python-dp (vetted), one process, and
  ``google×W`` on W processes (chunks of the vector, each an independent draw);
* ``opendp-lattice`` — OpenDP ``make_gaussian`` with granularity 2^k, 2^k·√n ≤ 2⁻⁴¹σ (the
  default sampler; its rounding charged by the accountant), one process and ``opendp-lattice×W``;
* ``opendp`` — OpenDP ``make_gaussian`` on the float vector domain (vetted; exact lattice
  2⁻¹⁰⁷⁴), one process and ``opendp×W``; ``opendp-k-40``: the same on the fixed lattice 2⁻⁴⁰;
* ``fast`` — numpy PCG64 seeded from the OS CSPRNG (not vetted: a naive float sampler).

The machine is shared: ``uptime``'s load average is recorded before and after, and the samples
per CPU second (this process and its noise workers) are reported next to the samples per second.

``--lattice`` instead sweeps OpenDP's granularity, one process: 2^k = σ·2^−r for r in
``--rel`` (the lattice relative to σ) and the fixed k in ``--fixed-k``, at each vector size in
``--sizes``, reporting draws per CPU second and OpenDP's rounding term s (its privacy map is
(Δ + s)²/(2σ²)) relative to σ.

    python benchmarks/samplers.py --n 400000 --json benchmarks/results/samplers.json
    python benchmarks/samplers.py --lattice --json benchmarks/results/samplers_lattice.json
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
                                    OpenDPGaussianSampler, OpenDPLatticeGaussianSampler,
                                    _opendp_measurement, default_workers, lattice_exponent,
                                    opendp_sensitivity_slack)

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
    if "opendp-lattice" in which:
        out.append(("opendp-lattice", "vetted (Δ + 2⁻⁴⁰σ charged)", 1,
                    OpenDPLatticeGaussianSampler(workers=1)))
        if workers > 1:
            out.append((f"opendp-lattice×{workers}", "vetted (Δ + 2⁻⁴⁰σ charged)", workers,
                        OpenDPLatticeGaussianSampler(workers=workers)))
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


def lattice_sweep(sizes: list[int], rels: list[int], fixed_ks: list[int], repeats: int) -> list[dict]:
    """Draws per CPU second of OpenDP ``make_gaussian`` (one process) by granularity 2^k."""
    import resource

    def cpu():
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    rows = []
    for n in sizes:
        x = np.random.default_rng(0).normal(size=n).tolist()
        ks = [("exact (2⁻¹⁰⁷⁴)", -1074), ("default: 2^k·√n ≤ 2⁻⁴¹σ", lattice_exponent(SIGMA, n))]
        ks += [(f"σ·2^-{r}", int(np.floor(np.log2(SIGMA))) - r) for r in rels]
        ks += [(f"k = {k}", k) for k in fixed_ks]
        for label, k in ks:
            m = _opendp_measurement(SIGMA, n, k)
            best = float("inf")
            for _ in range(repeats):
                c = cpu()
                y = m(x)
                best = min(best, cpu() - c)
            assert len(y) == n
            slack = opendp_sensitivity_slack(SIGMA, n, k)
            rows.append({"n": n, "lattice": label, "k": k, "log2(σ/2^k)": np.log2(SIGMA) - k,
                         "draws per CPU s": n / best, "slack s/σ": f"{slack / SIGMA:.2e}"})
            print(f"n={n} {label} k={k}: {n / best:,.0f} draws per CPU s, s/σ = {slack / SIGMA:.3g}",
                  flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=400_000, help="entries per draw")
    ap.add_argument("--opendp-n", type=int, default=100_000, help="entries per draw for OpenDP (slow)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--only", default="opendp-lattice,google,opendp,fast")
    ap.add_argument("--lattice", action="store_true", help="sweep OpenDP's granularity k instead")
    ap.add_argument("--sizes", default="1000,20000,200000", help="--lattice: vector sizes")
    ap.add_argument("--rel", default="20,30,40,50,60,80,120",
                    help="--lattice: r of the lattices 2^k ≈ σ·2^-r")
    ap.add_argument("--fixed-k", default="-40,-60", help="--lattice: fixed k")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    if args.lattice:
        rows = lattice_sweep([int(v) for v in args.sizes.split(",")],
                             [int(v) for v in args.rel.split(",")],
                             [int(v) for v in args.fixed_k.split(",")], args.repeats)
        load_after = os.getloadavg()
        print()
        print(markdown_table(rows, ["n", "lattice", "k", "log2(σ/2^k)", "draws per CPU s",
                                    "slack s/σ"]))
        print(f"\nσ = {SIGMA}, one process; load average before {load_before}, after {load_after}")
        write_json(args.json, {"sigma": SIGMA, "lattice_rows": rows, "load_before": load_before,
                               "load_after": load_after})
        return 0
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
