"""How many documents a deployment needs: stream size against quality at one ε.

Semi-synthetic data with known topics (issue 10): a non-private streamdp model is fitted on
Debian package descriptions (d = 5000, k = 20: spectral, then one exact refinement pass), and
documents are sampled from it (LDA with its topics and α) with lengths drawn from Debian's real
length distribution (in-vocabulary tokens, median ≈ 29). For each stream size N a fresh sample of
N stream documents plus 0.3·N warm-up documents (a disjoint, timestamp-routed partition) is fitted
with ``streamdp.fit`` at ε (default 1, δ = 1e-6): the refined release and its spectral start.
Reported: mean matched L2 error against the known topics and NPMI on held-out real Debian
descriptions (the co-occurrence reference a user would judge by).

    python benchmarks/stream_size.py --sizes 25000,50000,100000,200000,400000 --seeds 0,1,2 \\
        --json benchmarks/results/stream_size.json
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, parse_args, progress, write_json  # noqa: E402

import streamdp  # noqa: E402
from streamdp.evaluation import topic_recovery_metrics  # noqa: E402
from streamdp.evaluation.coherence import npmi_coherence  # noqa: E402
from streamdp.evaluation.corpora import debian_descriptions_corpus, shuffle_split  # noqa: E402
from streamdp.evaluation.distinct import reader_metrics  # noqa: E402
from streamdp.synthetic import LDAModel, sample_documents  # noqa: E402

DELTA = 1e-6


def ground_truth(corpus, k: int, seed: int):
    train, test = shuffle_split(corpus.n_docs, seed=seed, test_fraction=0.1)
    X = corpus.counts[train]
    n = X.shape[0]
    ts = np.r_[np.zeros(int(0.3 * n)), np.ones(n - int(0.3 * n))]
    snap = streamdp.fit(X, k, epsilon=None, seed=seed, timestamps=ts, stream_start=0.5,
                        refinement=streamdp.RefinementConfig(passes=1))
    lengths = np.asarray(X.sum(axis=1)).ravel().astype(int)
    lengths = lengths[lengths >= 3]
    return (LDAModel(topics=snap.topic_word, alpha=snap.alpha), lengths,
            [corpus.tokens[i] for i in test])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="25000,50000,100000,200000,400000")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--start", default="tensor", choices=("tensor", "auto", "cluster"),
                   help="the refinement's start: 'tensor' (the spectral start, as recorded in "
                        "docs/benchmarks.md), or as streamdp.fit picks it ('auto', issue 22)")
    p.add_argument("--debian-list", default=None, metavar="PATH",
                   help="a Translation-en list (default: the one apt-get update fetched)")
    p.add_argument("--json", default=None)
    a = parse_args(p, argv)         # + --no-progress
    logging.getLogger("gensim").setLevel(logging.ERROR)
    corpus = debian_descriptions_corpus(path=a.debian_list)
    truth, lengths, ref = ground_truth(corpus, a.k, 0)
    vocab = corpus.vocabulary
    runs = []
    settings = [(int(n), int(s)) for n in a.sizes.split(",") for s in a.seeds.split(",")]
    for n, seed in progress(settings, "stream size × seed"):
        n_warm = int(0.3 * n)
        X = sample_documents(truth, n_warm + n, seed=100 + seed, lengths=lengths)
        est = streamdp.StreamingSpectralLDA(a.k, 1.0, epsilon=a.epsilon, delta=DELTA, seed=seed,
                                            noise_seed=7 + seed, sampler="fast",
                                            **({} if a.start == "tensor" else {"start": a.start}))
        for s in range(0, n_warm, 8192):
            est.warmup(X[s:min(s + 8192, n_warm)])
        stream = [X[s:s + 8192] for s in range(n_warm, n_warm + n, 8192)]
        for b in stream:
            est.partial_fit(b)
        cfg = est.refinement
        if a.start == "tensor":
            start = est.release(1 - cfg.share, split=streamdp.BudgetSplit.spectral_start())
            passes_share = cfg.share
        else:                                   # as streamdp.fit: the start rule, then the passes
            passes_share = est.release_start(stream, 1 - cfg.share)
            start = est.snapshot_
        for _ in range(cfg.passes):
            snap = est.refine(stream, budget_fraction=passes_share / cfg.passes)
        row = {"n_stream": n, "seed": seed}
        for name, B in (("refined", snap.topic_word), ("start", start.topic_word)):
            row[f"{name}_l2"] = topic_recovery_metrics(truth.topics, B)["l2_mean"]
            row[f"{name}_npmi"] = npmi_coherence(B, vocab, ref, topn=10, window_size=10)["npmi"]
        row["noise_to_signal_median"] = float(np.median(snap.noise_to_signal))
        # issue 22: topics a reader can tell apart, against the sample's own word counts
        row["refined_distinct"] = reader_metrics(snap.topic_word,
                                                 np.asarray(X[n_warm:].sum(axis=0)).ravel())["distinct"]
        runs.append(row)
        print({c: (round(v, 4) if isinstance(v, float) else v) for c, v in row.items()},
              flush=True)
    truth_npmi = npmi_coherence(truth.topics, vocab, ref, topn=10, window_size=10)["npmi"]
    table = []
    for n in sorted({r["n_stream"] for r in runs}):
        rs = [r for r in runs if r["n_stream"] == n]
        table.append({"n_stream": n, "seeds": len(rs), **{
            c: float(np.mean([r[c] for r in rs])) for c in
            ("refined_l2", "start_l2", "refined_npmi", "start_npmi", "noise_to_signal_median",
             "refined_distinct") if all(c in r for r in rs)}})
    print(f"\n### Stream size vs quality at ε = {a.epsilon} (semi-synthetic Debian; true topics' "
          f"NPMI {truth_npmi:.3f}; mean over seeds)\n")
    print(md := markdown_table(table, list(table[0])))
    write_json(a.json, {"epsilon": a.epsilon, "delta": DELTA, "start": a.start,
                        "truth_npmi": truth_npmi,
                        "runs": runs, "table": table, "markdown": md})
    return 0


if __name__ == "__main__":
    sys.exit(main())
