"""Topic recovery on synthetic LDA: error vs ε, mechanism, stream size and clip bound.

Setting (issue 2 / DESIGN §7): d = 1000, k = 10, α0 = 1, topic-word Dirichlet(0.05),
lengths Poisson(50)+3, warm-up 100k, stream 200k, δ = 1e-6. Error = mean
Hungarian-matched L2 distance per topic (topics have L2 norm ≈ 0.15).

    python benchmarks/recovery.py                    # all tables
    python benchmarks/recovery.py --tables main --seeds 1 --json out.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, parse_args, progress, write_json  # noqa: E402

from streamdp import ClipBounds, StreamingSpectralLDA  # noqa: E402
from streamdp.evaluation import matched_topic_error  # noqa: E402
from streamdp.privacy.events import EventLog  # noqa: E402
from streamdp.synthetic import make_lda_model, sample_documents  # noqa: E402

EPSILONS = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, None]
BATCH = 8192


def corpus(seed: int, n_docs: int, d: int, k: int):
    model = make_lda_model(d, k, alpha0=1.0, beta=0.05, seed=1000 + seed)
    X = sample_documents(model, n_docs, mean_length=50, length_offset=3, seed=2000 + seed)
    return model, X


def sketch(X, n_warm, n_stream, k, eps, seed, **kw):
    # Budgets are checked by a real accountant elsewhere; here each configuration
    # is an independent experiment with its own (ε, δ).
    est = StreamingSpectralLDA(k, 1.0, epsilon=eps, delta=1e-6, seed=seed, noise_seed=10_000 + seed,
                               accountant=EventLog(), **kw)
    for s in range(0, n_warm, BATCH):
        est.warmup(X[s:min(s + BATCH, n_warm)])
    for s in range(n_warm, n_warm + n_stream, BATCH):
        est.partial_fit(X[s:min(s + BATCH, n_warm + n_stream)])
    return est


def capture(est, topics):
    Q = est.subspace_.Q
    return float(np.mean(np.linalg.norm(Q.T @ topics.T, axis=0) / np.linalg.norm(topics, axis=1)))


def main_table(seeds, d, k, n_warm, n_stream):
    rows = []
    for eps in progress(EPSILONS, "main table: ε"):
        res = {"tensor": [], "iterative": []}
        caps = []
        for seed in seeds:
            model, X = corpus(seed, n_warm + n_stream, d, k)
            est = sketch(X, n_warm, n_stream, k, eps, seed)
            caps.append(capture(est, model.topics))
            for mech in ("tensor", "iterative") if eps is not None else ("tensor",):
                est.mechanism = mech
                snap = est.release()
                res[mech].append(matched_topic_error(model.topics, snap.topic_word)["l2_mean"])
        row = {"epsilon": "none" if eps is None else eps,
               "tensor": float(np.mean(res["tensor"])), "tensor_sd": float(np.std(res["tensor"])),
               "iterative": float(np.mean(res["iterative"])) if res["iterative"] else None,
               "iterative_sd": float(np.std(res["iterative"])) if res["iterative"] else None,
               "warmup_capture": float(np.mean(caps))}
        rows.append(row)
        print(row, flush=True)
    return rows


def size_table(seed, d, k, n_warm, sizes):
    model, X = corpus(seed, n_warm + max(sizes), d, k)
    rows = []
    for n in progress(sizes, "stream sizes"):
        row = {"stream_docs": n}
        for eps in (None, 1.0, 4.0):
            snap = sketch(X, n_warm, n, k, eps, seed).release()
            row["none" if eps is None else f"eps={eps:g}"] = matched_topic_error(
                model.topics, snap.topic_word)["l2_mean"]
        rows.append(row)
        print(row, flush=True)
    return rows


def clip_table(seed, d, k, n_warm, n_stream, lengths):
    model, X = corpus(seed, n_warm + n_stream, d, k)
    rows = []
    for L in progress(lengths, "clip lengths"):
        row = {"clip_length": L}
        for eps in (1.0, 4.0, 64.0):
            clip = ClipBounds.unclipped() if L is None else ClipBounds.for_length(L)
            est = sketch(X, n_warm, n_stream, k, eps, seed, clip=clip)
            row[f"eps={eps:g}"] = matched_topic_error(model.topics, est.release().topic_word)["l2_mean"]
            row["clipped_fraction"] = est.sketch_.n_clipped / est.sketch_.n_docs
        row["clip_length"] = "none (bounds = 1)" if L is None else L
        rows.append(row)
        print(row, flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", default="main,size,clip")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--d", type=int, default=1000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--warmup", type=int, default=100_000)
    p.add_argument("--stream", type=int, default=200_000)
    p.add_argument("--sizes", default="50000,100000,200000,500000,1000000")
    p.add_argument("--json", default=None)
    a = parse_args(p, argv)         # + --no-progress
    tables = a.tables.split(",")
    out = {"setting": vars(a)}
    t0 = time.time()
    if "main" in tables:
        rows = main_table(list(range(a.seeds)), a.d, a.k, a.warmup, a.stream)
        print("\n## Mean matched L2 error vs ε (mean ± sd over seeds)\n")
        print(markdown_table(rows, ["epsilon", "tensor", "tensor_sd", "iterative", "iterative_sd",
                                    "warmup_capture"]))
        out["main"] = rows
    if "size" in tables:
        rows = size_table(0, a.d, a.k, a.warmup, [int(s) for s in a.sizes.split(",")])
        print("\n## Error vs stream size (tensor mechanism, seed 0)\n")
        print(markdown_table(rows, ["stream_docs", "none", "eps=1", "eps=4"]))
        out["size"] = rows
    if "clip" in tables:
        rows = clip_table(0, a.d, a.k, a.warmup, a.stream, [10, 15, 20, 30, 50, None])
        print("\n## Clipping bias: error vs clip reference length (tensor, seed 0)\n")
        print(markdown_table(rows, ["clip_length", "clipped_fraction", "eps=1", "eps=4", "eps=64"]))
        out["clip"] = rows
    print(f"\ntotal {time.time() - t0:.0f} s")
    write_json(a.json, out)


if __name__ == "__main__":
    main()
