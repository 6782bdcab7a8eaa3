"""Sketch updates per second on one thread, and memory, over a long stream.

    OMP_NUM_THREADS=1 python benchmarks/throughput.py                 # full grid, 1M docs
    python benchmarks/throughput.py --d 10000 --k 20 --docs 200000 --json out.json

Documents: synthetic LDA (topic-word Dirichlet(0.05)), lengths Poisson(50)+3,
k' = 2k. ``--refine`` adds each document's refinement contribution (fold-in into a public model,
the true topics here; 10 iterations) to a RefinementSketch, as a continual epoch does. A pool of pre-generated batches is cycled so the measurement covers
only WhitenedSketch.update (vectorise → clip → accumulate), not data generation.
RSS is sampled as documents flow: state is O(d·k' + k'³), so it must stay flat.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, parse_args, progress, write_json  # noqa: E402

from streamdp import ClipBounds, Subspace, WhitenedSketch  # noqa: E402
from streamdp.refinement import RefinementModel, RefinementSketch  # noqa: E402
from streamdp.synthetic import make_lda_model, sample_documents  # noqa: E402
from streamdp.whitening.warmup import test_matrix  # noqa: E402


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def run(d: int, k: int, n_docs: int, batch: int, pool_batches: int, seed: int = 0,
        refine: bool = False) -> dict:
    model = make_lda_model(d, k, alpha0=1.0, beta=0.05, seed=seed)
    pool_X = sample_documents(model, batch * pool_batches, mean_length=50, length_offset=3, seed=seed + 1)
    pool = [pool_X[i * batch:(i + 1) * batch] for i in range(pool_batches)]
    k_prime = 2 * k
    sub = Subspace(test_matrix(d, k_prime, seed))
    sk = WhitenedSketch(sub, ClipBounds.for_length(20))
    rmodel = RefinementModel(model.topics, model.alpha) if refine else None
    rsk = RefinementSketch(k, d) if refine else None
    rss_start = rss_mb()
    samples = []
    done, i = 0, 0
    t0 = time.perf_counter()
    checkpoints = {n_docs // 4, n_docs // 2, n_docs}
    while done < n_docs:
        X = pool[i % pool_batches]
        if done + X.shape[0] > n_docs:
            X = X[: n_docs - done]
        sk.update(X)
        if rsk is not None:
            rsk.update(X, rmodel)
        done += X.shape[0]
        i += 1
        if any(done >= c > done - X.shape[0] for c in checkpoints):
            samples.append((done, rss_mb()))
    elapsed = time.perf_counter() - t0
    t1 = time.perf_counter()
    sk.sums()
    close = time.perf_counter() - t1
    return {"d": d, "k": k, "k_prime": k_prime, "refine": refine, "docs": n_docs,
            "docs_per_s": n_docs / elapsed, "seconds": elapsed, "sums_seconds": close,
            "state_MB": (sk.nbytes + (rsk.sums.nbytes if rsk is not None else 0)) / 2**20,
            "rss_start_MB": rss_start,
            "rss_25pct_MB": samples[0][1], "rss_50pct_MB": samples[1][1], "rss_end_MB": samples[-1][1],
            "peak_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "nnz_per_doc": pool_X.nnz / pool_X.shape[0]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d", default="10000,50000")
    p.add_argument("--k", default="10,20,50")
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--pool-batches", type=int, default=16)
    p.add_argument("--refine", default="0", help="0, 1 or 0,1: without / with refinement")
    p.add_argument("--json", default=None)
    a = parse_args(p, argv)         # + --no-progress
    rows = []
    with threadpool_limits(1):
        settings = [(int(d), int(k), bool(int(r))) for d in a.d.split(",") for k in a.k.split(",")
                    for r in a.refine.split(",")]
        for d, k, refine in progress(settings, "d × k × refine"):
            r = run(d, k, a.docs, a.batch, a.pool_batches, refine=refine)
            rows.append(r)
            print({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in r.items()}, flush=True)
    cols = ["d", "k", "k_prime", "refine", "docs", "docs_per_s", "sums_seconds", "state_MB", "rss_start_MB",
            "rss_25pct_MB", "rss_50pct_MB", "rss_end_MB", "peak_rss_MB"]
    print("\n## Sketch throughput, one thread\n")
    print(markdown_table(rows, cols))
    write_json(a.json, {"rows": rows})


if __name__ == "__main__":
    main()
