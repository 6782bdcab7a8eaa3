"""Sketch updates per second on one thread, and memory, over a long stream.

    OMP_NUM_THREADS=1 python benchmarks/throughput.py                 # full grid, 1M docs
    python benchmarks/throughput.py --d 10000 --k 20 --docs 200000 --json out.json
    python benchmarks/throughput.py --sections gensim --repeats 5      # ratio to gensim, Debian

Documents: synthetic LDA (topic-word Dirichlet(0.05)), lengths Poisson(50)+3,
k' = 2k. ``--refine`` adds each document's refinement contribution (fold-in into a public model,
the true topics here; 10 iterations) to a RefinementSketch, as a continual epoch does. A pool of pre-generated batches is cycled so the measurement covers
only WhitenedSketch.update (vectorise → clip → accumulate), not data generation.
RSS is sampled as documents flow: state is O(d·k' + k'³), so it must stay flat.
``docs_per_cpu_s``: documents per CPU-second of this process (less sensitive to other
processes' load on a shared machine than the wall-clock ``docs_per_s``).

Section ``gensim``: the sketch against gensim's online LDA *in the same run*, on the same block
of real documents (Debian bookworm package descriptions, d = 5000, k = 20, as
``benchmarks/compare.py``'s throughput section: seed-0 split, 10% held out, the first 30% of
the rest warm up a private estimator, ε = 1; the next ``--gensim-docs`` documents are the
block). Repeats run interleaved (streamdp, gensim, streamdp, gensim, …) so both see the same
load on a shared machine; the table gives each model's median, min and max documents/s, the
ratio of the medians and the worst and best ratio of adjacent (same-repeat) pairs, and the
ratio of median CPU-time rates (``x_gensim_cpu``: less sensitive to other processes' load).
``state_MB`` is the sketch's state (accumulators, compensation, pending rows) and
``chunk_peak_MB`` the peak of the temporaries one 4,096-document chunk allocates (tracemalloc).
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
# measure this checkout's streamdp (not whichever the environment installed, e.g. another worktree)
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from _common import markdown_table, parse_args, progress, write_json  # noqa: E402

from streamdp import ClipBounds, StreamingSpectralLDA, Subspace, WhitenedSketch  # noqa: E402
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
    t0, c0 = time.perf_counter(), time.process_time()
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
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    t1 = time.perf_counter()
    sk.sums()
    close = time.perf_counter() - t1
    return {"d": d, "k": k, "k_prime": k_prime, "refine": refine, "docs": n_docs,
            "docs_per_s": n_docs / elapsed, "docs_per_cpu_s": n_docs / cpu, "seconds": elapsed, "sums_seconds": close,
            "state_MB": (sk.nbytes + (rsk.sums.nbytes if rsk is not None else 0)) / 2**20,
            "rss_start_MB": rss_start,
            "rss_25pct_MB": samples[0][1], "rss_50pct_MB": samples[1][1], "rss_end_MB": samples[-1][1],
            "peak_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "nnz_per_doc": pool_X.nnz / pool_X.shape[0]}


def chunk_peak_mb(sketch: WhitenedSketch, X) -> float:
    """Peak of the temporaries one chunk of ``X`` allocates (numpy reports to tracemalloc)."""
    import tracemalloc
    from streamdp.privacy.rounding import BATCH_ROWS_MAX
    work = sketch.copy()
    rows = X[:BATCH_ROWS_MAX]
    tracemalloc.start()
    work._update_chunk(rows)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def versus_gensim(n_block: int, repeats: int, seed: int = 0, batch: int = 8192) -> dict:
    """Interleaved sketch vs gensim online LDA on one block of Debian descriptions (module doc)."""
    import logging
    import warnings
    from baselines.nonprivate import fit_gensim
    from streamdp.evaluation.corpora import debian_descriptions_corpus, shuffle_split

    logging.getLogger("gensim").setLevel(logging.ERROR)
    k = 20
    corpus = debian_descriptions_corpus(max_words=5000)
    train, _ = shuffle_split(corpus.n_docs, seed=seed, test_fraction=0.1)
    X = corpus.counts[train]
    n_warm = int(round(0.3 * len(train)))
    block = X[n_warm:n_warm + n_block]
    with warnings.catch_warnings():     # the reproducible (insecure) noise seed: benchmark only
        warnings.simplefilter("ignore")
        est = StreamingSpectralLDA(k, 1.0, epsilon=1.0, delta=1e-6, seed=seed,
                                   noise_seed=20_000 + seed, sampler="fast")
    for s0 in range(0, n_warm, batch):
        est.warmup(X[s0:min(s0 + batch, n_warm)])
    est.partial_fit(X[:0])
    batches = [block[s0:s0 + batch] for s0 in range(0, block.shape[0], batch)]
    n = block.shape[0]
    sketch_rates, gensim_rates, sketch_cpu, gensim_cpu = [], [], [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for B in batches:
            est.partial_fit(B)
        sketch_rates.append(n / (time.perf_counter() - t0))
        sketch_cpu.append(n / (time.process_time() - c0))
        c0 = time.process_time()
        gensim_rates.append(fit_gensim(block, k, seed=seed)[1]["docs_per_s"])
        gensim_cpu.append(n / (time.process_time() - c0))     # includes its input conversion
        print(f"[gensim] sketch {sketch_rates[-1]:,.0f}/s, gensim {gensim_rates[-1]:,.0f}/s, "
              f"ratio {sketch_rates[-1] / gensim_rates[-1]:.1f} (CPU time: "
              f"{sketch_cpu[-1] / gensim_cpu[-1]:.1f}), load {os.getloadavg()[0]:.2f}", flush=True)
    pairs = [a / b for a, b in zip(sketch_rates, gensim_rates)]
    cpu_pairs = [a / b for a, b in zip(sketch_cpu, gensim_cpu)]
    med_s, med_g = float(np.median(sketch_rates)), float(np.median(gensim_rates))
    sk = est.sketch_
    return {"setting": f"debian d={X.shape[1]} k={k} (k'={sk.subspace.dim})", "docs": n,
            "repeats": repeats, "sketch_docs_per_s": med_s, "sketch_min": min(sketch_rates),
            "sketch_max": max(sketch_rates), "gensim_docs_per_s": med_g,
            "gensim_min": min(gensim_rates), "gensim_max": max(gensim_rates),
            "x_gensim": med_s / med_g, "x_gensim_worst": min(pairs), "x_gensim_best": max(pairs),
            "x_gensim_cpu": float(np.median(sketch_cpu)) / float(np.median(gensim_cpu)),
            "x_gensim_cpu_worst": min(cpu_pairs), "x_gensim_cpu_best": max(cpu_pairs),
            "sketch_cpu_all": sketch_cpu, "gensim_cpu_all": gensim_cpu,
            "state_MB": sk.nbytes / 2**20, "chunk_peak_MB": chunk_peak_mb(sk, block),
            "sketch_all": sketch_rates, "gensim_all": gensim_rates, "x_gensim_pairs": pairs,
            "load_avg": os.getloadavg(), "streamdp": str(Path(sys.modules["streamdp"].__file__).parent)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d", default="10000,50000")
    p.add_argument("--k", default="10,20,50")
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--pool-batches", type=int, default=16)
    p.add_argument("--refine", default="0", help="0, 1 or 0,1: without / with refinement")
    p.add_argument("--sections", default="grid", help="grid, gensim or grid,gensim")
    p.add_argument("--repeats", type=int, default=5, help="gensim section: interleaved repeats")
    p.add_argument("--gensim-docs", type=int, default=30_000, help="gensim section: block size")
    p.add_argument("--json", default=None)
    a = parse_args(p, argv)         # + --no-progress
    sections = set(a.sections.split(","))
    if not sections <= {"grid", "gensim"}:
        p.error(f"--sections: unknown {sorted(sections - {'grid', 'gensim'})}")
    rows, vs = [], []
    with threadpool_limits(1):
        if "gensim" in sections:
            vs.append(versus_gensim(a.gensim_docs, a.repeats))
        settings = [(int(d), int(k), bool(int(r))) for d in a.d.split(",") for k in a.k.split(",")
                    for r in a.refine.split(",")] if "grid" in sections else []
        for d, k, refine in progress(settings, "d × k × refine"):
            r = run(d, k, a.docs, a.batch, a.pool_batches, refine=refine)
            rows.append(r)
            print({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in r.items()}, flush=True)
    if rows:
        cols = ["d", "k", "k_prime", "refine", "docs", "docs_per_s", "docs_per_cpu_s", "sums_seconds", "state_MB",
                "rss_start_MB", "rss_25pct_MB", "rss_50pct_MB", "rss_end_MB", "peak_rss_MB"]
        print("\n## Sketch throughput, one thread\n")
        print(markdown_table(rows, cols))
    if vs:
        print(f"\n## Sketch vs gensim online LDA, one thread, {a.repeats} interleaved repeats "
              f"(load average {', '.join(f'{x:.2f}' for x in os.getloadavg())})\n")
        print(markdown_table(vs, ["setting", "docs", "sketch_docs_per_s", "sketch_min",
                                  "sketch_max", "gensim_docs_per_s", "gensim_min", "gensim_max",
                                  "x_gensim", "x_gensim_worst", "x_gensim_best", "x_gensim_cpu",
                                  "state_MB", "chunk_peak_MB"]))
    write_json(a.json, {"rows": rows, "versus_gensim": vs})


if __name__ == "__main__":
    main()
