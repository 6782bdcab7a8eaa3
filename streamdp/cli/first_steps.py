"""``streamdp simulate`` and ``streamdp demo``: the first two commands a newcomer runs.

simulate: the in-process engine (``StreamingSpectralLDA``) on a synthetic LDA stream, compared
with the truth; demo: the embedded broker, sketchers and the release service on a readable
corpus (:mod:`streamdp.services.demo`).
"""
from __future__ import annotations

import argparse
import json
import logging
import time

import numpy as np

from streamdp import progress
from streamdp.cli.common import (HelpFormatter, epsilon_type, positive_float, positive_int,
                                 probability, progress_flag)
from streamdp.estimator import StreamingSpectralLDA
from streamdp.evaluation import matched_topic_error
from streamdp.privacy.noise import DEFAULT_SAMPLER, SAMPLER_KINDS
from streamdp.synthetic import make_lda_model, sample_documents


def _simulate(a: argparse.Namespace) -> int:
    progress.apply_flag(a)
    # every argument is checked (argparse types, then the estimator's own checks) before
    # seconds of data generation
    est = StreamingSpectralLDA(a.topics, a.alpha0, epsilon=a.epsilon, delta=a.delta,
                               mechanism=a.mechanism, seed=a.seed, sampler=a.sampler,
                               non_private=a.epsilon is None,   # --non-private said so
                               non_production=a.non_production)
    if a.topics > a.vocab:
        raise ValueError(f"--topics {a.topics} is more than --vocab {a.vocab}: a model needs at "
                         "least as many words as topics")
    say = (lambda *_: None) if a.json else print       # --json: one JSON object, nothing else
    t0 = time.time()
    model = make_lda_model(a.vocab, a.topics, alpha0=a.alpha0, beta=a.beta, seed=a.seed)
    with progress.bar(total=a.warmup + a.stream, desc="generating documents", unit="doc") as bar:
        X = sample_documents(model, a.warmup + a.stream, mean_length=a.mean_length,
                             seed=a.seed + 1, progress=bar.update)
    t_generate = time.time() - t0
    say(f"generated {X.shape[0]:,} synthetic documents over {a.vocab:,} words ({t_generate:.1f} s)")
    t1 = time.time()
    with progress.bar(total=X.shape[0], desc="warm-up + sketch", unit="doc") as bar:
        for s in range(0, a.warmup, a.batch):
            est.warmup(X[s:min(s + a.batch, a.warmup)])
            bar.update(min(s + a.batch, a.warmup) - s)
        for s in range(a.warmup, X.shape[0], a.batch):
            est.partial_fit(X[s:s + a.batch])
            bar.update(min(s + a.batch, X.shape[0]) - s)
    t2 = time.time()
    snap = est.release()
    t3 = time.time()
    err = matched_topic_error(model.topics, snap.topic_word)
    say(f"warm-up + sketch: {t2 - t1:.1f} s ({a.stream / max(t2 - t1, 1e-9):,.0f} docs/s incl. warm-up); "
        f"release: {t3 - t2:.2f} s")
    words = [f"w{i}" for i in range(a.vocab)]
    p = err["permutation"]
    topics = []
    for i, top in enumerate(snap.top_words(words, 8)):
        true_i = int(np.flatnonzero(p == i)[0])
        l2 = float(np.linalg.norm(model.topics[true_i] - snap.topic_word[i]))
        topics.append({"topic": i, "true_topic": true_i, "alpha": float(snap.alpha[i]),
                       "l2_error": l2, "top_words": [w for w, _ in top]})
        say(f"topic {i:2d}  α={snap.alpha[i]:.3f}  L2 err={l2:.4f}  " + " ".join(w for w, _ in top))
    norm = float(np.linalg.norm(model.topics, axis=1).mean())
    say(f"\nmean matched L2 error {err['l2_mean']:.4f} (topic norms ≈ {norm:.3f})")
    pr = {k: snap.privacy.get(k) for k in ("unit", "neighbouring", "mechanism", "epsilon", "delta",
                                          "rho_budget", "rho_by_partition", "clip_bounds")}
    say("privacy:", json.dumps(pr, indent=2, default=float))
    if a.json:
        print(json.dumps({
            "documents": {"warmup": a.warmup, "stream": a.stream}, "vocab": a.vocab,
            "topics": a.topics, "seed": a.seed, "mechanism": a.mechanism,
            "seconds": {"generate": t_generate, "warmup_and_sketch": t2 - t1, "release": t3 - t2},
            "stream_docs_per_s": a.stream / max(t2 - t1, 1e-9),
            "mean_matched_l2_error": float(err["l2_mean"]), "mean_true_topic_norm": norm,
            "per_topic": topics, "privacy": pr}, indent=2, default=float))
    return 0


def _demo(a) -> int:
    from streamdp.services.demo import run_demo       # the services: loaded when it runs
    progress.apply_flag(a)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run_demo(epsilon=None if a.non_private else a.epsilon, warmup_docs=a.warmup_docs,
             stream_docs=a.stream_docs, epochs=a.epochs, sketchers=a.sketchers,
             bootstrap=a.bootstrap, workdir=a.workdir, sampler=a.sampler, seed=a.seed,
             vocabulary=a.vocabulary, selection_docs=a.selection_docs,
             privacy_unit=a.privacy_unit, max_docs_per_user_epoch=a.max_docs_per_user_epoch,
             start=a.start, public_docs=a.public_docs,
             refinement_share_public=a.refinement_share_public, noise_seed=a.noise_seed)
    return 0


def add_simulate(sub) -> None:
    """``streamdp simulate``."""
    s = sub.add_parser("simulate", help="in-process engine on a synthetic LDA stream",
                       formatter_class=HelpFormatter,
                       description="Generate a synthetic LDA corpus, warm up, sketch the stream, "
                                   "release private topics and compare them with the truth.")
    s.add_argument("--epsilon", type=epsilon_type, default=1.0, help="total ε per document")
    s.add_argument("--non-private", dest="epsilon", action="store_const", const=None,
                   help="no clipping, no noise (instead of --epsilon)")
    s.add_argument("--delta", type=probability, default=1e-6, help="total δ")
    s.add_argument("--mechanism", choices=("tensor", "iterative"), default="tensor",
                   help="tensor: noised whitened third moment; iterative: noised power iterations "
                        "(docs/estimator.md)")
    s.add_argument("--sampler", choices=SAMPLER_KINDS, default=DEFAULT_SAMPLER,
                   help="noise sampler: opendp-lattice (OpenDP's Gaussian on a σ-relative lattice, "
                        "vetted, rounding charged, default, ≈8·10⁴ draws/s per core), opendp (OpenDP's "
                        "exact Gaussian, vetted, ≈2·10⁴ draws/s per core), google (Google's secure Gaussian via python-dp, ≈4·10⁵/s, "
                        "opt-in: its per-draw failure probability ≈2⁻⁴⁵ is not charged) "
                        "or fast (CSPRNG-seeded numpy, not vetted; docs/privacy_accounting.md); "
                        "google and fast need --non-production")
    s.add_argument("--non-production", action="store_true",
                   help="allow an unvetted --sampler (fast, google): tests and benchmarks only")
    s.add_argument("--vocab", type=positive_int, default=1000, help="vocabulary size d")
    s.add_argument("--topics", type=positive_int, default=10, help="number of topics k")
    s.add_argument("--alpha0", type=positive_float, default=1.0,
                   help="sum of the Dirichlet topic-proportion parameters α₀")
    s.add_argument("--beta", type=positive_float, default=0.05, help="topic-word Dirichlet parameter")
    s.add_argument("--mean-length", type=positive_float, default=50,
                   help="mean document length (words)")
    s.add_argument("--warmup", type=positive_int, default=100_000, help="warm-up documents")
    s.add_argument("--stream", type=positive_int, default=200_000, help="stream documents")
    s.add_argument("--batch", type=positive_int, default=8192, help="documents per partial_fit call")
    s.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    s.add_argument("--json", action="store_true",
                   help="print one JSON object (errors, timings, privacy) instead of the text")
    progress_flag(s)
    s.set_defaults(func=_simulate)


def add_demo(sub) -> None:
    """``streamdp demo``."""
    d = sub.add_parser("demo", help="broker + sketchers + release service on a readable demo corpus",
                       formatter_class=HelpFormatter,
                       description="Start the embedded broker (or use --bootstrap), two sketchers "
                                   "and the release service; produce a readable synthetic corpus "
                                   "(six everyday topics); close the warm-up and the epochs; print "
                                   "the released topics and the privacy spent; stop cleanly.")
    d.add_argument("--epsilon", type=epsilon_type, default=1.0, help="ε for all releases together")
    d.add_argument("--non-private", action="store_true", help="no clipping, no noise")
    d.add_argument("--vocabulary", choices=("private", "public", "corpus"), default=None,
                   help="private (default; non-private demo: public): DP selection from the "
                        "selection-window documents; public: wordfreq's top 20,000 words; corpus: "
                        "the generator's word list, public by assumption")
    d.add_argument("--selection-docs", type=positive_int, default=10_000,
                   help="documents before selection_end, used only to select the vocabulary")
    d.add_argument("--warmup-docs", type=positive_int, default=20_000,
                   help="warm-up documents (before stream_start)")
    d.add_argument("--stream-docs", type=positive_int, default=60_000,
                   help="stream documents, spread over the epochs")
    d.add_argument("--epochs", type=positive_int, default=4, help="hourly epochs (= the horizon)")
    d.add_argument("--sketchers", type=positive_int, default=2, help="sketcher services")
    d.add_argument("--bootstrap", help="use an existing Kafka instead of the embedded broker")
    d.add_argument("--workdir", help="where the vocabulary, ledger and snapshots go (default: a "
                                     "new temporary folder)")
    d.add_argument("--sampler", choices=SAMPLER_KINDS, default=DEFAULT_SAMPLER,
                   help="noise sampler (docs/privacy_accounting.md)")
    d.add_argument("--seed", type=int, default=0, help="seed of the demo corpus")
    d.add_argument("--noise-seed", dest="noise_seed", type=int, default=None,
                   help="INSECURE: seed the noise (reproducible releases, for tests; anyone who "
                        "knows the seed can subtract the noise). Default: unseeded")
    d.add_argument("--privacy-unit", choices=("document", "user"), default="document",
                   help="document: add/remove one document; user: add/remove every document of "
                        "one user (the demo's documents get authors, documents per user from a "
                        "Zipf law; each user's documents bounded and weighted; docs/privacy.md)")
    d.add_argument("--start", choices=("auto", "tensor", "public"), default="auto",
                   help="the start of the refinement: public fits topics without privacy on "
                        "--public-docs other documents declared public (needs --vocabulary public "
                        "or corpus); docs/services.md 'The start'")
    d.add_argument("--public-docs", dest="public_docs", type=positive_int, default=5_000,
                   help="documents of the public start (--start public)")
    d.add_argument("--refinement-share-public", dest="refinement_share_public", type=float,
                   default=None, help="share of each release's budget on the refinement sums "
                                      "with a public start (default: the configuration's, 0.9)")
    d.add_argument("--max-docs-per-user-epoch", type=positive_int, default=None,
                   help="user unit: m, a user's documents kept per epoch (default 5)")
    progress_flag(d)
    d.set_defaults(func=_demo)
