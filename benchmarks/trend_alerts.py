"""Topic-share change test (issue 27): false-positive rate on stationary streams and detection
delay when one topic's share doubles.

Synthetic LDA (d = 300, k = 6, α0 = 1, topics Dirichlet(0.1), lengths Poisson(40) + 3), a
continual release (refinement lag 2, ε = 4, the fast sampler with a fixed noise seed per run),
``--per-epoch`` documents per epoch. Stationary runs: ``--epochs`` releases from one
distribution; every release with a trend point and a predecessor is one test of the k topics
at family-wise level α = 1 % (streamdp.trends). Change runs: from epoch ``--change-at`` on,
topic 0's expected share doubles (1/6 → 1/3, the others shrink alike); the delay is the first
release reporting a significant change of that topic minus the change epoch (0 = the release
of the change epoch itself).

    nice python benchmarks/trend_alerts.py --seeds 10 --json benchmarks/results/trend_alerts.json
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, parse_args, progress, write_json  # noqa: E402

import streamdp  # noqa: E402
from streamdp import trends as T  # noqa: E402
from streamdp.synthetic import LDAModel, make_lda_model, sample_documents  # noqa: E402

K, D, WARMUP = 6, 300, 8000


def doubled(model: LDAModel, topic: int = 0) -> LDAModel:
    """``model`` with topic ``topic``'s expected share doubled (the others scaled alike)."""
    a = model.alpha / model.alpha0
    new = a * (1 - 2 * a[topic]) / (1 - a[topic])
    new[topic] = 2 * a[topic]
    return LDAModel(model.topics, new * model.alpha0)


def stream_snapshots(epochs: int, *, per_epoch: int = 3000, change_at: int | None = None,
                     seed: int = 0, aggregator: str = "blt", epsilon: float = 4.0,
                     lag: int = 2) -> tuple[list, int | None]:
    """The published snapshots of a continual release over a synthetic stream; the true
    (generating) index of the changed topic is mapped to the released numbering by
    refinement.topic_order, returned second (None without a change)."""
    base = make_lda_model(D, K, alpha0=1.0, beta=0.1, seed=3)
    after = doubled(base)
    est = streamdp.StreamingSpectralLDA(
        K, 1.0, epsilon=epsilon, seed=0, noise_seed=seed, sampler="fast", non_production=True,
        epochs=streamdp.EpochClock(0.0, 10.0), horizon=epochs, continual_aggregator=aggregator,
        refinement=streamdp.RefinementConfig(model_lag=lag))
    snaps = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.warmup(sample_documents(base, WARMUP, mean_length=40, seed=100 + seed))
        for t in range(1, epochs + 1):
            model = base if change_at is None or t < change_at else after
            X = sample_documents(model, per_epoch, mean_length=40, seed=1000 * seed + t)
            est.partial_fit(X, np.full(per_epoch, 10.0 * t - 5.0))
            snaps += est.close_epochs(10.0 * t)
    changed = None
    if change_at is not None:
        from streamdp.refinement import topic_order
        perm = topic_order(snaps[-1].topic_word, base.topics)   # true topic i <- released perm[i]
        changed = int(perm[0])
    return snaps, changed


def real_stream_snapshots(corpus, epochs: int, *, per_epoch: int, warmup: int, k: int,
                          seed: int = 0, aggregator: str = "blt", epsilon: float = 4.0,
                          lag: int = 2) -> list:
    """A stationary stream from a real corpus: its documents shuffled (seed), the first
    ``warmup`` warm up, then ``per_epoch`` per epoch. Real text is not LDA: this measures the
    false-alarm rate where the test's sampling model (α0 = 1) is only an approximation."""
    X = corpus.counts[np.random.default_rng(seed).permutation(corpus.counts.shape[0])]
    est = streamdp.StreamingSpectralLDA(
        k, 1.0, epsilon=epsilon, seed=0, noise_seed=seed, sampler="fast", non_production=True,
        epochs=streamdp.EpochClock(0.0, 10.0), horizon=epochs, continual_aggregator=aggregator,
        refinement=streamdp.RefinementConfig(model_lag=lag))
    snaps = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.warmup(X[:warmup])
        for t in range(1, epochs + 1):
            rows = X[warmup + (t - 1) * per_epoch: warmup + t * per_epoch]
            est.partial_fit(rows, np.full(rows.shape[0], 10.0 * t - 5.0))
            snaps += est.close_epochs(10.0 * t)
    return snaps


def main_real(a) -> None:
    from streamdp.evaluation.corpora import debian_descriptions_corpus
    corpus = debian_descriptions_corpus(max_words=a.words)
    rows = []
    for seed in progress(range(a.seeds), "debian"):
        snaps = real_stream_snapshots(corpus, a.epochs, per_epoch=a.per_epoch, warmup=a.warmup,
                                      k=a.topics, seed=seed)
        tr = T.trends(snaps)
        tests = [cs for cs in tr.changes if cs]
        alarms = [cs[0].epoch for cs in tests if any(c.significant for c in cs)]
        worst = max((abs(c.z) for cs in tests for c in cs), default=None)
        rows.append({"seed": seed, "stationary releases tested": len(tests),
                     "releases with a false alarm": len(alarms),
                     "false alarms at epochs": " ".join(map(str, alarms)) or None,
                     "largest |z|": worst, "z*": tests[0][0].threshold if tests else None})
        print(markdown_table(rows[-1:], list(rows[-1])), flush=True)
    tested = sum(r["stationary releases tested"] for r in rows)
    fired = sum(r["releases with a false alarm"] for r in rows)
    print(md := markdown_table(rows, list(rows[0])))
    print(f"false-positive rate: {fired}/{tested} = {fired / max(tested, 1):.3f}")
    write_json(a.json, {"corpus": "debian", "rows": rows, "markdown": md, "k": a.topics,
                        "words": a.words, "per_epoch": a.per_epoch, "epochs": a.epochs,
                        "alpha": T.CHANGE_ALPHA, "false_positive_rate": fired / max(tested, 1)})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--per-epoch", type=int, default=3000)
    p.add_argument("--change-at", type=int, default=11)
    p.add_argument("--aggregators", default="blt,tree")
    p.add_argument("--corpus", choices=("synthetic", "debian"), default="synthetic",
                   help="debian: stationary runs only, on the shuffled Debian descriptions")
    p.add_argument("--topics", type=int, default=10, help="k (debian)")
    p.add_argument("--words", type=int, default=2000, help="vocabulary size (debian)")
    p.add_argument("--warmup", type=int, default=10000, help="warm-up documents (debian)")
    p.add_argument("--json", default=None)
    a = parse_args(p, argv)
    if a.corpus == "debian":
        return main_real(a)
    rows = []
    for agg in a.aggregators.split(","):
        tests = fired = 0
        delays, alarm_epochs = [], []
        for seed in progress(range(a.seeds), f"{agg}"):
            snaps, _ = stream_snapshots(a.epochs, per_epoch=a.per_epoch, seed=seed, aggregator=agg)
            tr = T.trends(snaps)
            for cs in tr.changes:
                if cs:
                    tests += 1
                    fired += any(c.significant for c in cs)
                    alarm_epochs += [cs[0].epoch] if any(c.significant for c in cs) else []
            snaps, topic = stream_snapshots(a.change_at + 4, per_epoch=a.per_epoch,
                                            change_at=a.change_at, seed=100 + seed, aggregator=agg)
            tr = T.trends(snaps)
            first = next((p.epoch for p, cs in zip(tr.points, tr.changes)
                          if any(c.significant and c.topic == topic for c in cs)), None)
            delays.append(None if first is None else first - a.change_at)
        found = [d for d in delays if d is not None]
        rows.append({"aggregator": agg, "stationary releases tested": tests,
                     "releases with a false alarm": fired,
                     "false-positive rate": fired / tests if tests else None,
                     "changes detected": f"{len(found)}/{len(delays)}",
                     "delay best (epochs)": min(found) if found else None,
                     "delay worst (epochs)": max(found) if found else None,
                     "false alarms at epochs": " ".join(map(str, sorted(alarm_epochs))) or None})
        print(markdown_table(rows[-1:], list(rows[-1])), flush=True)
    print(md := markdown_table(rows, list(rows[0])))
    write_json(a.json, {"rows": rows, "markdown": md, "k": K, "d": D, "alpha": T.CHANGE_ALPHA,
                        "per_epoch": a.per_epoch, "epochs": a.epochs, "change_at": a.change_at})


if __name__ == "__main__":
    main()
