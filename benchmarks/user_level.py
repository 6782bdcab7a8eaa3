"""User-level unit (issue 16): topic error against m and the weight schedule, next to the
document-level error at the same ε.

Synthetic LDA (d = 1000, k = 10, α0 = 1, lengths Poisson(50) + 3, topics Dirichlet(0.05)) with
users: user sizes (documents per user) from a Zipf law P(n) ∝ n^(−a), truncated at 10,000,
drawn until the corpus is full; each document is an independent LDA draw (users share no topic
preference: the weights are then the only difference) and arrives at a uniform random time, so
a user's documents fall on both sides of the warm-up boundary (30% of the time range warms up).
For each ε: one document-level fit (``streamdp.fit`` with a timestamp boundary: warm-up and
stream in parallel, full ρ each) and user-level fits (``privacy_unit="user"``: each user's
documents weighted in arrival order, one epoch so M = m; the warm-up takes 25% of ρ on the
stream partition) for every m and schedule. Reported: mean matched L2 error of the refined
release against the true topics (Hungarian matching), its ratio to the document-level error,
and the share of the stream's weight the bounding keeps (Σ weights / stream documents).

    nice python benchmarks/user_level.py --stream-docs 200000 --json benchmarks/results/user_level.json
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, parse_args, progress, write_json  # noqa: E402

import streamdp  # noqa: E402
from streamdp.evaluation import topic_recovery_metrics  # noqa: E402
from streamdp.privacy.user_bounding import UserBounder  # noqa: E402
from streamdp.synthetic import make_lda_model, sample_documents  # noqa: E402

DELTA = 1e-6
WARMUP_FRACTION = 0.3
MAX_USER_DOCS = 10_000


def zipf_users(n_docs: int, a: float, rng) -> np.ndarray:
    """A user id per document: user sizes from a Zipf(a) law truncated at MAX_USER_DOCS, in a
    random arrival order."""
    sizes = []
    total = 0
    while total < n_docs:
        s = rng.zipf(a, size=max(1024, n_docs // 4))
        s = s[s <= MAX_USER_DOCS]
        sizes.append(s)
        total += int(s.sum())
    sizes = np.concatenate(sizes)
    cut = int(np.searchsorted(np.cumsum(sizes), n_docs)) + 1
    sizes = sizes[:cut]
    ids = np.repeat(np.arange(sizes.size), sizes)[:n_docs]
    return rng.permutation(ids)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stream-docs", type=int, default=200_000)
    p.add_argument("--epsilons", default="4,1")
    p.add_argument("--m", default="1,2,5,10")
    p.add_argument("--schedules", default="uniform,decaying")
    p.add_argument("--zipf", type=float, default=2.0, help="Zipf exponent of documents per user")
    p.add_argument("--seeds", default="0")
    p.add_argument("--d", type=int, default=1000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--matched-control", action="store_true",
                   help="also fit document-level on a random subset of the stream with as many "
                        "documents as the user-level weight kept (what the same weight would "
                        "give as whole documents)")
    p.add_argument("--corpus", choices=("synthetic", "debian"), default="synthetic",
                   help="debian: real Debian package descriptions (d = 5000, k = 20) with "
                        "synthetic Zipf users (the Translation list carries no source or "
                        "maintainer); quality = NPMI on held-out descriptions")
    p.add_argument("--json", default=None)
    a = parse_args(p, argv)
    if a.corpus == "debian":
        return debian(a)
    epsilons = [float(e) for e in a.epsilons.split(",")]
    ms = [int(m) for m in a.m.split(",")]
    schedules = a.schedules.split(",")
    seeds = [int(s) for s in a.seeds.split(",")]
    runs = []
    settings = [(s, e, cfg) for s in seeds for e in epsilons
                for cfg in [("document", None, None)] + [("user", m, sch) for m in ms
                                                         for sch in schedules]]
    data = {}
    for seed, eps, (unit, m, sch) in progress(settings, "seed × ε × setting"):
        if seed not in data:
            truth = make_lda_model(a.d, a.k, alpha0=1.0, seed=seed)
            n_total = int(round(a.stream_docs / (1 - WARMUP_FRACTION)))
            X = sample_documents(truth, n_total, seed=100 + seed)
            rng = np.random.default_rng(1000 + seed)
            users = zipf_users(n_total, a.zipf, rng)
            # arrival times from their own stream: the same warm-up/stream split for every law
            ts = np.random.default_rng(2000 + seed).uniform(0.0, 1.0, n_total)
            data[seed] = (truth, X, users, ts)
            n_users = np.unique(users).size
            stream = ts >= WARMUP_FRACTION
            per_user = np.bincount(users)
            print(f"seed {seed}: {n_total} documents ({int(stream.sum())} stream), {n_users} "
                  f"users, documents per user: median {np.median(per_user[per_user > 0]):.0f}, "
                  f"max {per_user.max()}, share of documents from users with > 5: "
                  f"{per_user[per_user > 5].sum() / n_total:.2f}", flush=True)
        truth, X, users, ts = data[seed]
        kw = dict(epsilon=eps, delta=DELTA, seed=seed, timestamps=ts,
                  stream_start=WARMUP_FRACTION, sampler="fast", noise_seed=7 + seed)
        t0 = time.perf_counter()
        if unit == "document":
            snap = streamdp.fit(X, a.k, **kw)
            kept = 1.0
        else:
            snap = streamdp.fit(X, a.k, privacy_unit="user", users=users.astype(str),
                                max_docs_per_user_epoch=m, user_weights=sch, **kw)
            stream = ts >= WARMUP_FRACTION
            w, _ = UserBounder(max_docs_per_epoch=m, max_docs=m, schedule=sch).assign(
                users[stream].astype(str))
            kept = float(w.sum() / stream.sum())
        seconds = time.perf_counter() - t0
        err = topic_recovery_metrics(truth.topics, snap.topic_word)["l2_mean"]
        row = {"seed": seed, "epsilon": eps, "unit": unit, "m": m, "weights": sch,
               "l2_error": err, "weight_kept": kept, "seconds": seconds}
        if a.matched_control and unit == "user":
            stream_rows = np.flatnonzero(ts >= WARMUP_FRACTION)
            sub = np.random.default_rng(5 + seed).choice(
                stream_rows, size=int(round(kept * stream_rows.size)), replace=False)
            rows = np.sort(np.r_[np.flatnonzero(ts < WARMUP_FRACTION), sub])
            ctl = streamdp.fit(X[rows], a.k, **{**kw, "timestamps": ts[rows]})
            row["doc_level_same_weight_l2"] = topic_recovery_metrics(
                truth.topics, ctl.topic_word)["l2_mean"]
        runs.append(row)
        print({c: (round(v, 4) if isinstance(v, float) else v) for c, v in row.items()},
              flush=True)
    table = []
    for eps in epsilons:
        doc = float(np.mean([r["l2_error"] for r in runs
                             if r["epsilon"] == eps and r["unit"] == "document"]))
        table.append({"ε": eps, "unit": "document", "m": None, "weights": None,
                      "L2 error": doc, "× document": 1.0, "weight kept": 1.0})
        for m in ms:
            for sch in schedules:
                rs = [r for r in runs if r["epsilon"] == eps and r["m"] == m
                      and r["weights"] == sch]
                e = float(np.mean([r["l2_error"] for r in rs]))
                row = {"ε": eps, "unit": "user", "m": m, "weights": sch, "L2 error": e,
                       "× document": e / doc,
                       "weight kept": float(np.mean([r["weight_kept"] for r in rs]))}
                if a.matched_control:
                    row["document-level, same weight"] = float(np.mean(
                        [r["doc_level_same_weight_l2"] for r in rs]))
                table.append(row)
    print(f"\n### User-level vs document-level error (synthetic LDA d={a.d}, k={a.k}, "
          f"{a.stream_docs} stream documents, Zipf({a.zipf}) documents per user; seeds "
          f"{a.seeds})\n")
    print(md := markdown_table(table, list(table[-1])))
    write_json(a.json, {"delta": DELTA, "stream_docs": a.stream_docs, "zipf": a.zipf,
                        "d": a.d, "k": a.k, "runs": runs, "table": table, "markdown": md})
    return 0


def debian(a) -> int:
    """Debian descriptions, synthetic users: NPMI of document- vs user-level releases."""
    from streamdp.evaluation.coherence import npmi_coherence
    from streamdp.evaluation.corpora import debian_descriptions_corpus, shuffle_split
    k = 20 if a.k == 10 else a.k
    corpus = debian_descriptions_corpus()
    train, test = shuffle_split(corpus.n_docs, seed=0, test_fraction=0.1)
    X = corpus.counts[train]
    ref = [corpus.tokens[i] for i in test]
    words = corpus.vocabulary.words
    seeds = [int(x) for x in a.seeds.split(",")]
    settings = [("document", None, None)] + [
        ("user", int(m), sch) for m in a.m.split(",") for sch in a.schedules.split(",")]
    rows, runs = [], []
    for eps in [float(e) for e in a.epsilons.split(",")]:
        for seed in seeds:
            rng = np.random.default_rng(1000 + seed)
            users = zipf_users(X.shape[0], a.zipf, rng)
            ts = np.random.default_rng(2000 + seed).uniform(0.0, 1.0, X.shape[0])
            per_user = np.bincount(users)
            print(f"debian seed {seed}: {X.shape[0]} training descriptions, "
                  f"{np.unique(users).size} synthetic users (Zipf {a.zipf}), share of documents "
                  f"from users with > 5: {per_user[per_user > 5].sum() / X.shape[0]:.2f}",
                  flush=True)
            kw = dict(epsilon=eps, delta=DELTA, seed=seed, timestamps=ts,
                      stream_start=WARMUP_FRACTION, sampler="fast", noise_seed=7 + seed)
            for unit, m, sch in settings:
                t0 = time.perf_counter()
                if unit == "document":
                    snap = streamdp.fit(X, k, **kw)
                else:
                    snap = streamdp.fit(X, k, privacy_unit="user", users=users.astype(str),
                                        max_docs_per_user_epoch=m, user_weights=sch, **kw)
                npmi = npmi_coherence(snap.topic_word, words, ref, topn=10,
                                      window_size=10)["npmi"]
                run = {"epsilon": eps, "seed": seed, "unit": unit, "m": m, "weights": sch,
                       "npmi": npmi, "seconds": time.perf_counter() - t0}
                runs.append(run)
                print(run, flush=True)
        doc = float(np.mean([r["npmi"] for r in runs
                             if r["epsilon"] == eps and r["unit"] == "document"]))
        for unit, m, sch in settings:
            v = float(np.mean([r["npmi"] for r in runs if r["epsilon"] == eps
                               and r["unit"] == unit and r["m"] == m and r["weights"] == sch]))
            rows.append({"ε": eps, "unit": unit, "m": m, "weights": sch, "NPMI": v,
                         "NPMI − document": v - doc})
    print(f"\n### User-level vs document-level NPMI (Debian descriptions, k = {k}, synthetic "
          f"Zipf({a.zipf}) users; mean over seeds {a.seeds})\n")
    print(md := markdown_table(rows, list(rows[0])))
    write_json(a.json, {"corpus": "debian", "k": k, "zipf": a.zipf, "runs": runs,
                        "table": rows, "markdown": md})
    return 0


if __name__ == "__main__":
    sys.exit(main())
