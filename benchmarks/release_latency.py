"""Release latency: warm-up, release and refinement time by vocabulary size d and topics k.

For each (d, k) a synthetic LDA corpus (``--warmup-docs`` warm-up and ``--stream-docs`` stream
documents, mean length 60) goes through ``StreamingSpectralLDA(k, epsilon=1)`` (k' = 2k, the
tensor mechanism, the default full-space budget split), and three private steps are timed:

* **warm-up** — the subspace release: the clip bounds' noised norm histogram, the DP range
  finder's noised Y (d × k') and its QR (``partial_fit``'s first call, minus its sketching);
* **release** — ``release()``: noise count, m1, z (d × k'), s3 (k'³), whitening, power method,
  un-whitening and denoising;
* **refinement** — ``refine(stream)``: fold every stream document into the released model, noise
  the k × d sums, denoise.

Every draw goes through the accountant (the spend protocol) as in production; the sampler is
wrapped to time the noise separately (``noise s``, ``entries``), so the rest of each step is
visible, and the CPU time of each step (this process and the noise workers: ``cpu s``) is
recorded next to the wall time, since wall time on a shared machine depends on its load.
Sketching the documents is not part of the latency (docs/benchmarks.md, throughput).

    python benchmarks/release_latency.py --json benchmarks/results/release_latency.json
    python benchmarks/release_latency.py --d 50000 --k 50 --sampler opendp   # exact OpenDP
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

from streamdp import RefinementConfig, StreamingSpectralLDA  # noqa: E402
from streamdp.privacy.noise import DEFAULT_SAMPLER, SAMPLER_KINDS, make_sampler  # noqa: E402
from streamdp.synthetic import make_lda_model, sample_documents  # noqa: E402


def cpu_seconds() -> float:
    """CPU time of this process (all its threads) and of the noise worker processes: the
    work a step needs whatever else the machine runs (wall time depends on the load)."""
    import resource

    import psutil

    from streamdp.privacy import noise
    ru = resource.getrusage(resource.RUSAGE_SELF)
    total = ru.ru_utime + ru.ru_stime
    for w in noise._WORKERS:
        try:
            t = psutil.Process(w.proc.pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


class TimedSampler:
    """Wraps a sampler: the time spent in ``add_noise`` and the entries drawn, per phase."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self.reproducible = getattr(inner, "reproducible", False)
        self.seconds, self.entries = 0.0, 0

    def add_noise(self, value, sigma):
        t = time.perf_counter()
        out = self.inner.add_noise(value, sigma)
        self.seconds += time.perf_counter() - t
        self.entries += int(np.size(value))
        return out

    def sample(self, sigma, shape):
        return self.add_noise(np.zeros(shape), sigma)

    def take(self) -> tuple[float, int]:
        out = (self.seconds, self.entries)
        self.seconds, self.entries = 0.0, 0
        return out


def run(d: int, k: int, sampler_kind: str, n_warm: int, n_stream: int, seed: int = 0) -> dict:
    model = make_lda_model(d, k, seed=seed)
    X = sample_documents(model, n_warm + n_stream, mean_length=60, seed=seed)
    Xw, Xs = X[:n_warm], X[n_warm:]
    sampler = TimedSampler(make_sampler(sampler_kind))
    sampler.inner.add_noise(np.zeros(300_000), 1.0)    # start worker processes outside the timing
    est = StreamingSpectralLDA(k, 1.0, epsilon=1.0, seed=seed, clip_length=60,
                               sampler=sampler, refinement=RefinementConfig(),
                               non_production=True)   # a benchmark: --sampler google/fast allowed
    row = {"d": d, "k": k, "k'": est.oversampling + k, "docs": f"{n_warm}+{n_stream}"}
    est.warmup(Xw)

    t, c = time.perf_counter(), cpu_seconds()
    est.partial_fit(Xs[:0])           # fixes the subspace: the warm-up's private release
    row["warm-up s"] = time.perf_counter() - t
    row["warm-up cpu s"] = cpu_seconds() - c
    row["warm-up noise s"], row["warm-up entries"] = sampler.take()
    est.partial_fit(Xs)

    t, c = time.perf_counter(), cpu_seconds()
    # the full-space spectral release (z, m1 noised: the release whose topics are un-whitened
    # through z; the spectral start of a refinement would skip z and m1)
    from streamdp import BudgetSplit
    snap = est.release(0.5, split=BudgetSplit())
    row["release s"] = time.perf_counter() - t
    row["release cpu s"] = cpu_seconds() - c
    row["release noise s"], row["release entries"] = sampler.take()

    t, c = time.perf_counter(), cpu_seconds()
    snap = est.refine(Xs, budget_fraction=0.5)
    row["refinement s"] = time.perf_counter() - t
    row["refinement cpu s"] = cpu_seconds() - c
    row["refinement noise s"], row["refinement entries"] = sampler.take()
    assert snap.topic_word.shape == (k, d)
    row["total s"] = row["warm-up s"] + row["release s"] + row["refinement s"]
    row["sampler"] = sampler.name
    return row


COLUMNS = ["d", "k", "k'", "warm-up s", "warm-up noise s", "warm-up cpu s", "warm-up entries",
           "release s", "release noise s", "release cpu s", "release entries", "refinement s",
           "refinement noise s", "refinement cpu s", "refinement entries", "total s"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", default="5000,10000,50000")
    ap.add_argument("--k", default="20,50")
    ap.add_argument("--sampler", default=DEFAULT_SAMPLER, choices=SAMPLER_KINDS)
    ap.add_argument("--warmup-docs", type=int, default=2000)
    ap.add_argument("--stream-docs", type=int, default=5000)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    rows = []
    for d in map(int, args.d.split(",")):
        for k in map(int, args.k.split(",")):
            row = run(d, k, args.sampler, args.warmup_docs, args.stream_docs)
            rows.append(row)
            print(", ".join(f"{c}={row[c]:.2f}" if isinstance(row[c], float) else f"{c}={row[c]}"
                            for c in COLUMNS), flush=True)
    load_after = os.getloadavg()
    print()
    print(markdown_table(rows, COLUMNS))
    print(f"\nsampler {rows[0]['sampler']}; load average before {load_before}, after "
          f"{load_after}; {os.cpu_count()} CPUs")
    write_json(args.json, {"sampler": args.sampler, "rows": rows, "load_before": load_before,
                           "load_after": load_after})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
