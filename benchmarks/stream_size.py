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
        --json benchmarks/results/stream_size_auto_<date>.json

The start is the one ``streamdp.fit`` picks (``--start auto``, the default); the 2026-11-23
record ``benchmarks/results/stream_size.json`` was made with ``--start tensor`` (then the
default): add it to reproduce that record.

Two code versions on the same sampling model (``--truth``: the first run fits and saves it, the
second loads it), then the stream size where each seed first reaches 10 distinct topics::

    PYTHONPATH=<base> python benchmarks/stream_size.py --start auto --truth /tmp/truth.npz \\
        --json base.json
    PYTHONPATH=. python benchmarks/stream_size.py --start auto --truth /tmp/truth.npz --json n.json
    python benchmarks/stream_size.py --documents-needed base.json n.json
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
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


def ground_truth(corpus, k: int, seed: int, truth_path: str | None = None):
    """The sampling model, its documents' lengths and the held-out reference texts.

    The model is fitted by the ``streamdp`` being measured, so two code versions would sample
    their streams from different topics; ``truth_path`` fixes it: loaded when the file exists,
    else fitted and saved there (the lengths and reference depend only on the corpus).
    """
    train, test = shuffle_split(corpus.n_docs, seed=seed, test_fraction=0.1)
    X = corpus.counts[train]
    n = X.shape[0]
    if truth_path and Path(truth_path).exists():
        with np.load(truth_path) as z:
            topics, alpha = z["topics"], z["alpha"]
        if topics.shape != (k, X.shape[1]):
            raise SystemExit(f"--truth {truth_path}: topics {topics.shape}, "
                             f"expected {(k, X.shape[1])}")
    else:
        ts = np.r_[np.zeros(int(0.3 * n)), np.ones(n - int(0.3 * n))]
        snap = streamdp.fit(X, k, epsilon=None, seed=seed, timestamps=ts, stream_start=0.5,
                            refinement=streamdp.RefinementConfig(passes=1))
        topics, alpha = snap.topic_word, snap.alpha
        if truth_path:
            np.savez(truth_path, topics=topics, alpha=alpha)
    lengths = np.asarray(X.sum(axis=1)).ravel().astype(int)
    lengths = lengths[lengths >= 3]
    return (LDAModel(topics=topics, alpha=alpha), lengths, [corpus.tokens[i] for i in test])


def documents_needed(runs: list[dict], seed: int, target: float) -> tuple[float | None, str]:
    """Stream size at which one seed's refined_distinct first reaches ``target``: linear
    interpolation between the measured size before it (below target) and the first size at or
    above it. None with a reason when the sizes do not bracket the crossing."""
    pts = sorted((r["n_stream"], r["refined_distinct"]) for r in runs
                 if r["seed"] == seed and "refined_distinct" in r)
    for i, (n, dist) in enumerate(pts):
        if dist >= target:
            if i == 0:
                return None, f"≤ {n:,} (the smallest size measured)"
            n0, d0 = pts[i - 1]
            x = n0 + (n - n0) * (target - d0) / (dist - d0)
            return x, f"{x:,.0f} (between {n0:,}: {d0} and {n:,}: {dist})"
    return None, f"> {pts[-1][0]:,} (the largest size measured)" if pts else "no runs"


def print_documents_needed(paths: list[str], target: float) -> None:
    """Documents needed per seed in each JSON written by --json, and each file's ratio to the
    first one's (no fitting)."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    seeds = sorted({r["seed"] for res in results for r in res["runs"]})
    table = []
    for seed in seeds:
        row = {"seed": seed}
        found = [documents_needed(res["runs"], seed, target) for res in results]
        for p, (_, text) in zip(paths, found):
            row[Path(p).stem] = text
        for p, (x, _) in zip(paths[1:], found[1:]):
            row[f"{Path(p).stem} / {Path(paths[0]).stem}"] = (
                f"{x / found[0][0]:.2f}" if x is not None and found[0][0] is not None else "–")
        table.append(row)
    print(f"\n### Stream documents needed for ≥ {target:g} distinct topics (per seed)\n")
    print(markdown_table(table, list(table[0])))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="25000,50000,100000,200000,400000")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--start", default="auto", choices=("tensor", "auto", "cluster"),
                   help="the refinement's start: as streamdp.fit picks it ('auto', the default, "
                        "issue 22), or forced: 'tensor' (the spectral start, the 2026-11-23 "
                        "record's) or 'cluster'")
    p.add_argument("--debian-list", default=None, metavar="PATH",
                   help="a Translation-en list (default: the one apt-get update fetched)")
    p.add_argument("--truth", default=None, metavar="PATH.npz",
                   help="the sampling model's topics and alpha: loaded if PATH exists, else fitted "
                        "(by the streamdp imported) and saved there, so that two code versions "
                        "are measured on the same model")
    p.add_argument("--json", default=None)
    p.add_argument("--documents-needed", nargs="+", metavar="JSON",
                   help="print, per seed, the stream size where runs written by --json first "
                        "reach --target distinct topics, and each file's ratio to the first "
                        "(no fitting)")
    p.add_argument("--target", type=float, default=10.0)
    a = parse_args(p, argv)         # + --no-progress
    if a.documents_needed:
        print_documents_needed(a.documents_needed, a.target)
        return 0
    logging.getLogger("gensim").setLevel(logging.ERROR)
    corpus = debian_descriptions_corpus(path=a.debian_list)
    truth, lengths, ref = ground_truth(corpus, a.k, 0, a.truth)
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
                        "truth_npmi": truth_npmi, "truth": a.truth,
                        "runs": runs, "table": table, "markdown": md})
    return 0


if __name__ == "__main__":
    sys.exit(main())
