"""The services' start rule on real text (issue 22 item 3): does it pick the better start?

Each run is what the release service runs, without Kafka: a private warm-up, the services'
start rule (``streamdp.services.release_start.start_rule``, THE rule of
``streamdp.start.choose_service_start``) on the warm-up's released values — its noised clip
histogram total (the count index) and its noised range sum (the subspace noise-to-signal r_w,
threshold ``WARMUP_MAX_NTS``) — then R continual releases (BLT, refinement with lag 2) from
**both** starts side by side, so one can see whether the rule picked the better one:

* ``tensor``: epochs 1, 2 spectral, epoch e ≥ 3 folded into the snapshot of e − 2, each node's
  ρ split ``refinement_share`` 0.5 (``StreamingSpectralLDA.close_epochs``, the services' rule);
* ``public``: epochs 1 … L folded into a public start (model epoch 0, as
  ``release_start.fold_in_models``), every epoch refined, each node's ρ split
  ``refinement_share_public`` 0.9 (``ServiceConfig.refinement_config(public_start=True)``).

Corpora and protocol as ``benchmarks/compare.py`` (d = 5000, k = 20, δ = 1e-6, α0 = 1, 10% held
out for NPMI and perplexity). **Declared public:** the last ``--public-docs`` (5,000) rows of
the shuffled training rows are removed from the warm-up and the stream and treated as documents
the operator declares public: the public start is fitted on them without privacy with
``streamdp.PublicStart.fit`` on those with ≥ 3 vocabulary words (what ``streamdp public-start``
runs). Of the remaining rows the
first 30% warm up ("by timestamp": rows are in stream order), the rest is the stream, cut into R
epochs of equal length in stream order (horizon T = R, one ε for warm-up + stream).

Both starts share the seeds (``seed``, ``noise_seed = 20,000 + seed``), so their warm-ups — and
the rule's inputs — are the same draws. Reported per release evaluated (``--eval``; default 1, 2,
R/2, R − 1, R): distinct topics, mean / median NPMI, background share, diversity (the reader
metrics of ``streamdp.evaluation.distinct``, the definitions of compare.py) and held-out
document-completion perplexity.

    OMP_NUM_THREADS=1 nice python benchmarks/service_start.py --corpora debian,reviews \\
        --epsilons 1,4 --seeds 0,1 --releases 8 --json benchmarks/results/service_start.json
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, parse_args, progress, write_json  # noqa: E402

from streamdp import EpochClock, PublicStart, RefinementConfig, StreamingSpectralLDA  # noqa: E402
from streamdp.estimator_continual import epoch_released  # noqa: E402
from streamdp.evaluation import document_completion_perplexity  # noqa: E402
from streamdp.evaluation.coherence import npmi_coherence  # noqa: E402
from streamdp.evaluation.corpora import (debian_descriptions_corpus, movie_reviews_corpus,  # noqa: E402
                                         shuffle_split)
from streamdp.evaluation.distinct import reader_metrics  # noqa: E402
from streamdp.refinement import epoch_refined  # noqa: E402
from streamdp.services import release_start  # noqa: E402
from streamdp.start import WARMUP_MAX_NTS  # noqa: E402
from streamdp.whitening.warmup import WarmupSketch  # noqa: E402

DELTA = 1e-6
BATCH = 8192
#: the services' defaults (docs/configuration.md): refinement_share, refinement_share_public
SHARE_TENSOR, SHARE_PUBLIC = 0.5, 0.9


def evaluated(R: int, spec: str | None) -> list[int]:
    if spec:
        return sorted({min(max(int(t), 1), R) for t in spec.split(",")})
    return sorted({1, 2, max(R // 2, 1), max(R - 1, 1), R})


@contextlib.contextmanager
def warmup_draws(into: dict):
    """Record the warm-up's released values as the release service persists them
    (``WarmupDraw``: the noised clip histogram, the noised range sum Y and its σ)."""
    hist0, range0 = WarmupSketch.draw_histogram, WarmupSketch.draw_range

    def draw_histogram(self, *a, **kw):
        out = hist0(self, *a, **kw)
        into["hist"] = out[0]
        return out

    def draw_range(self, *a, **kw):
        Y, events = range0(self, *a, **kw)
        into["Y"], into["sigma"] = Y, (events[0].sigma if events else None)
        return Y, events

    WarmupSketch.draw_histogram, WarmupSketch.draw_range = draw_histogram, draw_range
    try:
        yield into
    finally:
        WarmupSketch.draw_histogram, WarmupSketch.draw_range = hist0, range0


def split(corpus, seed: int, n_public: int):
    """compare.py's split (10% held out, 30% of the training rows warm up) after the last
    ``n_public`` training rows are taken out as the declared-public documents."""
    train, test = shuffle_split(corpus.n_docs, seed=seed, test_fraction=0.1)
    if not 0 < n_public < len(train) // 2:
        raise SystemExit(f"--public-docs {n_public}: needs 0 < n < {len(train) // 2}")
    public, train = train[-n_public:], train[:-n_public]
    n_warm = int(round(0.3 * len(train)))
    return train[:n_warm], train[n_warm:], public, test


def continual(X_warm, X_stream, R: int, eps, seed: int, k: int, start: str, public_start,
              score, want: set[int]) -> tuple[dict, list[dict]]:
    """R continual releases from ``start`` ("tensor" or "public"), as the services run them;
    returns the rule's choice on this run's warm-up draws and the evaluated releases."""
    public = start == "public"
    refinement = RefinementConfig(share=SHARE_PUBLIC if public else SHARE_TENSOR)
    est = StreamingSpectralLDA(k, 1.0, epsilon=eps, delta=DELTA, seed=seed,
                               noise_seed=20_000 + seed, sampler="fast",
                               epochs=EpochClock(0.0, 1.0), horizon=R, refinement=refinement,
                               continual_aggregator="blt")
    with warmup_draws({}) as drawn:
        for s in range(0, X_warm.shape[0], BATCH):
            est.warmup(X_warm[s:s + BATCH])
        est.partial_fit(X_stream[:0], np.zeros(0))          # fixes the subspace (the draws)
    # THE services' rule at the warm-up close, on the released values (a public start exists)
    cfg = SimpleNamespace(start="auto", n_topics=k)
    choice = release_start.start_rule(cfg, public_start, refinement, drawn.get("hist"),
                                      est.stream_rho_, est.subspace_dim_, drawn.get("Y"),
                                      drawn.get("sigma"))
    lag = refinement.model_lag
    if public:
        # epochs 1 … L are folded into the public start, model epoch 0 (the services' models)
        est._epoch_sketches.models = release_start.fold_in_models(refinement, public_start, True)
    n = X_stream.shape[0]
    ts = (np.arange(n) * R / n).astype(float)
    rows = []
    for t in range(1, R + 1):
        idx = np.flatnonzero((ts >= t - 1) & (ts < t))
        for s in range(0, idx.size, BATCH):
            part = idx[s:s + BATCH]
            est.partial_fit(X_stream[part], ts[part])
        if public:
            # estimator_continual.close_epochs with the services' rule for a public start:
            # refined iff model_epoch_for(t, L, public_start=True) — every epoch
            ((_, sums),) = est._epoch_sketches.pop_through(t)
            est.continual_.draw_epoch(sums, refined=epoch_refined(t, lag, public_start=True))
            snap = epoch_released(est, est.continual_.post_process())
        else:
            (snap,) = est.close_epochs(float(t))
        if t in want:
            rows.append({"epoch": t, "stage": snap.stage, "topic_source": snap.topic_source,
                         **score(snap.topic_word)})
    return choice, rows


def run(corpus, name: str, R: int, eps, seed: int, k: int, n_public: int, want: set[int]) -> dict:
    warm, stream, public, test = split(corpus, seed, n_public)
    X_warm, X_stream = corpus.counts[warm], corpus.counts[stream]
    X_test = corpus.counts[test]
    ref = [corpus.tokens[i] for i in test]
    # the corpus background of issue 22's definition: the private training rows' word counts
    word_counts = np.asarray(X_warm.sum(axis=0)).ravel() + np.asarray(X_stream.sum(axis=0)).ravel()

    def score(B) -> dict:
        coh = npmi_coherence(B, corpus.vocabulary, ref, topn=10, window_size=10)
        r = reader_metrics(B, word_counts, npmi_per_topic=coh["per_topic"])
        ppl = document_completion_perplexity(B, X_test, seed=seed)
        return {"distinct": r["distinct"], "npmi": coh["npmi"], "npmi_median": r["npmi_median"],
                "background_share": r["background_share"], "diversity": r["diversity"],
                "perplexity": ppl["perplexity"]}

    t0 = time.perf_counter()
    X_public = corpus.counts[public]
    keep = np.asarray(X_public.sum(axis=1)).ravel() >= 3      # as `streamdp public-start` does
    start = PublicStart.fit(X_public[keep], k, seed=seed,
                            source=f"benchmark: {n_public:,} {name} documents declared public")
    out = {"corpus": name, "R": R, "epsilon": eps, "seed": seed, "n_warmup": int(len(warm)),
           "n_stream": int(len(stream)), "n_public": int(len(public)),
           "n_public_fitted": int(keep.sum()), "n_test": int(len(test)),
           "public_start_itself": score(start.topic_word),
           "public_fit_seconds": time.perf_counter() - t0}
    for which in ("tensor", "public"):
        t0 = time.perf_counter()
        choice, rows = continual(X_warm, X_stream, R, eps, seed, k, which, start, score, want)
        out[which] = {"releases": rows, "seconds": time.perf_counter() - t0}
        out.setdefault("choice", choice)
        if choice != out["choice"]:        # same seeds, same warm-up draws: never expected
            raise RuntimeError(f"the rule saw other warm-up draws: {choice} vs {out['choice']}")
    c = out["choice"]
    out["rule"] = {"count_index": c.get("index"), "r_w": c.get("warmup_nts"),
                   "n_docs_noised": c.get("n_docs_noised"), "rule_choice": c.get("rule_choice"),
                   "start": c["start"]}
    return out


def r_w_shown(r: dict):
    """r_w as the table shows it: None in the choice means ∞ (the k-th direction is noise)."""
    return "∞" if r["rule"]["r_w"] is None else r["rule"]["r_w"]


def rows_of(r: dict) -> list[dict]:
    """One table row per evaluated release: the tensor and the public start side by side."""
    out = []
    for a, b in zip(r["tensor"]["releases"], r["public"]["releases"]):
        row = {"corpus": r["corpus"], "ε": r["epsilon"], "seed": r["seed"],
               "index": r["rule"]["count_index"], "r_w": r_w_shown(r),
               "rule": r["rule"]["start"], "epoch": a["epoch"]}
        for tag, rel in (("T", a), ("P", b)):
            row.update({f"{tag} distinct": rel["distinct"], f"{tag} NPMI": rel["npmi"],
                        f"{tag} med": rel["npmi_median"], f"{tag} bg": rel["background_share"],
                        f"{tag} div": rel["diversity"], f"{tag} ppl": rel["perplexity"]})
        out.append(row)
    return out


def verdict(r: dict) -> dict:
    """Which start is better from epoch 3 on (where both chains are refined), by distinct
    topics, then NPMI, then perplexity, each on the mean over those releases; and the rule's."""
    def later(which):
        rel = [x for x in r[which]["releases"] if x["epoch"] >= 3] or r[which]["releases"]
        return {m: float(np.mean([x[m] for x in rel])) for m in ("distinct", "npmi", "perplexity")}
    T, P = later("tensor"), later("public")
    votes = {"distinct": "tensor" if T["distinct"] > P["distinct"] else
             "public" if P["distinct"] > T["distinct"] else "tie",
             "npmi": "tensor" if T["npmi"] > P["npmi"] else "public",
             "perplexity": "tensor" if T["perplexity"] < P["perplexity"] else "public"}
    return {"corpus": r["corpus"], "ε": r["epsilon"], "seed": r["seed"],
            "index": r["rule"]["count_index"], "r_w": r_w_shown(r), "rule": r["rule"]["start"],
            "T distinct": T["distinct"], "P distinct": P["distinct"], "T NPMI": T["npmi"],
            "P NPMI": P["npmi"], "T ppl": T["perplexity"], "P ppl": P["perplexity"],
            "better (distinct/NPMI/ppl)": "/".join(votes.values())}


METRICS = (("distinct", "distinct"), ("NPMI", "npmi"), ("median NPMI", "npmi_median"),
           ("background", "background_share"), ("diversity", "diversity"),
           ("perplexity", "perplexity"))


def summary(runs: list[dict]) -> list[dict]:
    """Mean over seeds per (corpus, ε, release), tensor / public side by side, at the first,
    the middle and the last release evaluated; the rule's inputs as their range over seeds."""
    out = []
    for corpus, eps in sorted({(r["corpus"], r["epsilon"]) for r in runs}):
        rs = [r for r in runs if r["corpus"] == corpus and r["epsilon"] == eps]
        epochs = [x["epoch"] for x in rs[0]["tensor"]["releases"]]
        idx = [r["rule"]["count_index"] for r in rs]
        r_w = [math.inf if r["rule"]["r_w"] is None else r["rule"]["r_w"] for r in rs]
        picks = sorted({r["rule"]["start"] for r in rs})
        for t in sorted({epochs[0], epochs[len(epochs) // 2], epochs[-1]}):
            row = {"corpus": corpus, "ε": eps, "seeds": len(rs),
                   "index": f"{min(idx):.3g}–{max(idx):.3g}",
                   "r_w": "–".join(dict.fromkeys("∞" if math.isinf(v) else f"{v:.3g}"
                                                 for v in (min(r_w), max(r_w)))), "rule": "/".join(picks), "epoch": t}
            for label, key in METRICS:
                v = {w: float(np.mean([next(x[key] for x in r[w]["releases"] if x["epoch"] == t)
                                       for r in rs])) for w in ("tensor", "public")}
                fmt = "{:.1f}" if key == "distinct" else "{:,.0f}" if key == "perplexity" \
                    else "{:.3f}" if "npmi" in key else "{:.2f}"
                row[f"{label} T / P"] = f"{fmt.format(v['tensor'])} / {fmt.format(v['public'])}"
            out.append(row)
    return out


def print_tables(runs: list[dict], releases: int, public_docs: int) -> tuple[str, str, str]:
    table = [row for r in runs for row in rows_of(r)]
    verdicts = [verdict(r) for r in runs]
    means = summary(runs)
    print(f"\n### The services' start rule on real text (R = {releases}, BLT, lag 2; rule: tensor "
          f"iff count index ≥ 15 and r_w ≤ {WARMUP_MAX_NTS:g}; T = tensor start, P = public start "
          f"fitted on {public_docs:,} declared-public documents)\n")
    print(md := markdown_table(table, list(table[0])))
    print("\n### Which start is better (mean over the evaluated releases from epoch 3)\n")
    print(md2 := markdown_table(verdicts, list(verdicts[0])))
    print("\n### Mean over seeds: first, middle and last release (tensor / public)\n")
    print(md3 := markdown_table(means, list(means[0])))
    # the public start's own topics (non-private, no stream document): what the chain starts from
    starts = {(r["corpus"], r["n_public"], r["seed"]): r["public_start_itself"] for r in runs}
    own = [{"corpus": c, "public docs": n, "seeds": len(v),
            **{label: float(np.mean([x[key] for x in v])) for label, key in METRICS}}
           for c, n in sorted({(c, n) for c, n, _ in starts})
           for v in [[x for (c2, n2, _), x in starts.items() if (c2, n2) == (c, n)]]]
    print("\n### The public start itself (fitted on the declared-public documents, mean over seeds)\n")
    print(md4 := markdown_table(own, list(own[0])))
    return md, md2, md3, md4


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", default="debian,reviews")
    p.add_argument("--releases", type=int, default=8)
    p.add_argument("--epsilons", default="1,4")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--eval", default=None, help="epochs to evaluate (default 1,2,R/2,R-1,R)")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--max-words", type=int, default=5000)
    p.add_argument("--public-docs", type=int, default=5000,
                   help="training rows declared public (the public start's documents)")
    p.add_argument("--limit", type=int, default=None, help="documents per corpus (smoke runs)")
    p.add_argument("--debian-list", default=None, metavar="PATH",
                   help="a Translation-en list (default: the one apt-get update fetched)")
    p.add_argument("--json", default=None)
    p.add_argument("--tables-from", default=None, metavar="JSON[,JSON]",
                   help="print the tables of runs written before by --json (no run)")
    a = parse_args(p, argv)         # + --no-progress
    logging.getLogger("gensim").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    if a.tables_from:
        # the tables again from runs written before (one or several --json files)
        runs = [r for path in a.tables_from.split(",")
                for r in json.loads(Path(path).read_text())["runs"]]
        print_tables(runs, runs[0]["R"], runs[0]["n_public"])
        return 0
    want = set(evaluated(a.releases, a.eval))
    runs = []
    for name in a.corpora.split(","):
        if name == "debian":
            corpus = debian_descriptions_corpus(path=a.debian_list, limit=a.limit,
                                                max_words=a.max_words)
        elif name == "reviews":
            corpus = movie_reviews_corpus(limit=a.limit, max_words=a.max_words)
        else:
            raise SystemExit(f"--corpora: debian or reviews, got {name!r}")
        settings = [(float(e), int(s)) for e in a.epsilons.split(",") for s in a.seeds.split(",")]
        for eps, seed in progress(settings, f"{name}: ε × seed"):
            r = run(corpus, name, a.releases, eps, seed, a.k, a.public_docs, want)
            runs.append(r)
            print({"corpus": name, "epsilon": eps, "seed": seed, **r["rule"],
                   "seconds": round(r["tensor"]["seconds"] + r["public"]["seconds"], 1)}, flush=True)
            print(markdown_table(rows_of(r), list(rows_of(r)[0])), flush=True)
    md = print_tables(runs, a.releases, a.public_docs)
    write_json(a.json, {"delta": DELTA, "k": a.k, "releases": a.releases,
                        "public_docs": a.public_docs, "warmup_max_nts": WARMUP_MAX_NTS,
                        "runs": runs, "table": [row for r in runs for row in rows_of(r)],
                        "verdicts": [verdict(r) for r in runs], "summary": summary(runs),
                        "markdown": "\n\n".join(md)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
