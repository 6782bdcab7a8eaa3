"""Post-processing of released refinement sums, measured on cached fits (issue 22 item 2).

    OMP_NUM_THREADS=1 nice python benchmarks/postprocess.py --corpora debian,reviews \\
        --seeds 0,1,2 --epsilons 4,1,none --cache /tmp/pp --json benchmarks/results/postprocess.json

The fits are those of benchmarks/compare.py (``fit_streamdp``: d = 5000, k = 20, 10% held
out, 30% of the rest warm up by order, δ = 1e-6, α0 = 1, the start rule and the default
passes, ``sampler="fast"`` with ``noise_seed``). During each fit every input to
``refined_topics`` — the noised sums of the start's mapping and of each pass, their σ and α0,
all released or public — is recorded and cached (``--cache``, one .npz per corpus, seed and ε;
a later run reuses it). Every post-processing variant (:data:`VARIANTS`) is then a function of
the final pass's (T, σ) — the ``*_pooled`` ones also of the earlier releases' column sums — and
is scored in seconds: distinct topics, mean and median NPMI, background share and diversity
(streamdp.evaluation.distinct), held-out document-completion perplexity and zero-probability
tokens, next to the **background-only model** (k copies of the training word counts + 0.5).
Row ``landed`` is what the fit published (checked equal to the cached snapshot's topics; a cache
written before js_eb landed, 5840f78, holds the plain James–Stein topics, which row ``js`` is).
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, write_json  # noqa: E402

from streamdp import refinement_topics as rt  # noqa: E402
from streamdp.empirical_bayes import npmle_posterior_mean  # noqa: E402

FLOOR = rt.FLOOR


# ------------------------------------------------------------------------------- variants
# A variant = a row estimate (T, σ, b) → k × d, a background b(T, σ), and optionally a data
# fission mixture toward b; rows the sparse-topic rule picks stay hard-thresholded, as in
# refined_topics. All are functions of released T, σ and a public seed only.
def _publish(S, b, floor=FLOOR):
    """Rows normalised, then ``floor`` of the background mixed in (every word possible)."""
    S = S / np.maximum(S.sum(axis=1, keepdims=True), 1e-300)
    S = (1.0 - floor) * S + floor * b[None, :]
    return S / S.sum(axis=1, keepdims=True)


def _cut_background(T, sd, floor=FLOOR):
    """The landed background: column sums, entries below 2σ√k cut to 0, the uniform floor."""
    return rt.background_distribution(T, sd, floor)


def _full_background(T, sd, floor=FLOOR):
    """Column sums' positive part, no 2σ√k cut (every word that the noise left > 0)."""
    return rt.normalised_background(np.maximum(T.sum(axis=0), 0.0), floor)


def _smooth_background(T, sd, floor=FLOOR):
    """Column sums' positive part + σ√k (the noise level): smoothing like the +0.5 of counts."""
    return rt.normalised_background(np.maximum(T.sum(axis=0), 0.0) + sd * np.sqrt(T.shape[0]), floor)


def _js(T, sd, b):
    """Variant a: the plain James–Stein shrink (the landed rule before js_eb) with this background."""
    return rt.shrink_topic_word(T, sd, b, T)[0]


def _hetero(T, sd, b):
    """Variant b: per-entry shrink; D_iw's signal variance ∝ b_w, so w_iw = s_i²b_w /
    (s_i²b_w + σ²) with s_i² = (‖D_i‖² − dσ²)₊ (Xie–Kou–Brown style)."""
    m, D, _, _ = rt.james_stein_weights(T, sd, b)
    if sd > 0:
        s2 = np.maximum(np.einsum("ij,ij->i", D, D) - T.shape[1] * sd ** 2, 0.0)
        sig = s2[:, None] * b[None, :]
        W = sig / np.maximum(sig + sd ** 2, 1e-300)
    else:
        W = np.ones_like(D)
    return _publish(np.maximum(m[:, None] * b[None, :] + W * D, 0.0), b)


def _eb_rows(T, sd, b):
    """Each row's empirical Bayes posterior mean (prior fitted per row)."""
    if sd <= 0:
        return _publish(np.maximum(T, 0.0), b)
    return _publish(np.array([npmle_posterior_mean(row, sd) for row in T]), b)


def _js_eb(T, sd, b):
    """The JS row weight w_i kept, the raw row replaced by its EB posterior mean:
    topic_i ∝ (1 − w_i)·m_i·b + w_i·EB(T_i) (refinement_topics.denoise_topic_word, landed)."""
    return rt.denoise_topic_word(T, sd, background=b)[0]


LAMBDAS = np.linspace(0.0, 1.0, 101)


def _fission_mix(T, sd, seed, estimate, background):
    """Variant c, data fission (Leiner et al. 2023): T1 = T + Z, T2 = T − Z with Z ~ N(0, σ²)
    from a public seed are independent, σ√2 each. Per row, λ_i maximises the split
    log-likelihood Σ_w T2_iw log((1 − λ)φ̂_iw(T1) + λ b_w(T1)) on a grid of 101;
    publish (1 − λ_i)φ̂_i(T) + λ_i b(T)."""
    b = background(T, sd)
    if sd <= 0:
        return estimate(T, sd, b)
    Z = np.random.default_rng(seed).normal(0.0, sd, size=T.shape)
    T1, T2 = T + Z, T - Z
    s1 = sd * np.sqrt(2.0)
    b1 = background(T1, s1)
    phi1 = estimate(T1, s1, b1)
    logs = np.log((1.0 - LAMBDAS)[None, :, None] * phi1[:, None, :]
                  + LAMBDAS[None, :, None] * b1[None, None, :])      # k × L × d
    lam = LAMBDAS[np.argmax(np.einsum("ild,id->il", logs, T2), axis=1)]
    S = (1.0 - lam)[:, None] * estimate(T, sd, b) + lam[:, None] * b[None, :]
    return S / S.sum(axis=1, keepdims=True)


def landed(T, sd, seed):
    """What refined_topics publishes (whatever refinement_topics holds in this checkout)."""
    return rt.refined_topics(T, sd, 1.0)[0]


#: name → (row estimate, background, data fission mixture toward the background)
RECIPES = {
    "js": (_js, _cut_background, False),
    "hetero": (_hetero, _cut_background, False),
    "hetero_smooth": (_hetero, _smooth_background, False),
    "js_full": (_js, _full_background, False),
    "js_smooth": (_js, _smooth_background, False),
    "fission_js": (_js, _cut_background, True),
    "fission_hetero": (_hetero, _cut_background, True),
    "fission_js_smooth": (_js, _smooth_background, True),
    "fission_hetero_smooth": (_hetero, _smooth_background, True),
    "eb_row": (_eb_rows, rt.eb_background, False),
    "eb_row_cut": (_eb_rows, _cut_background, False),
    "hetero_eb": (_hetero, rt.eb_background, False),
    "fission_eb_row": (_eb_rows, rt.eb_background, True),
    "js_eb": (_js_eb, rt.eb_background, False),
    "js_eb_cut": (_js_eb, _cut_background, False),
}


def pooled_background(releases, sds):
    """A background from the column sums of *every* release of the fit (the clustering start's
    mapping and each pass: all released), each rescaled to the last one's total and weighted by
    inverse noise variance, then denoised by EB. Returns b(T, σ) for :func:`variant`."""
    releases = [np.asarray(R, dtype=np.float64) for R in releases]
    k = releases[-1].shape[0]
    total = releases[-1].sum()
    cols = [R.sum(axis=0) * total / R.sum() for R in releases]
    var = np.array([(s * np.sqrt(k) * total / R.sum()) ** 2 for R, s in zip(releases, sds)])
    if not np.all(var > 0):
        return lambda T, sd: rt.eb_background(T, sd)
    wts = (1.0 / var) / (1.0 / var).sum()
    col = sum(w * c for w, c in zip(wts, cols))
    b = rt.normalised_background(npmle_posterior_mean(col, float(np.sqrt(1.0 / (1.0 / var).sum()))))
    return lambda T, sd: b


#: variants whose background pools every release of the fit (they need ``releases``)
POOLED = {"js_eb_pooled": (_js_eb, False), "hetero_eb_pooled": (_hetero, False)}


def variant(name: str, T: np.ndarray, sd: float, seed: int, releases=None) -> np.ndarray:
    """The published topics of variant ``name`` from released T and σ (public ``seed``);
    ``releases`` = (every release's sums, their σ) for the pooled variants."""
    if name == "landed":
        return landed(T, sd, seed)
    if name in POOLED:
        if releases is None:
            raise ValueError(f"{name} needs every release of the fit: a cache written by this "
                             "version of the script (or no --cache)")
        estimate, fission = POOLED[name]
        background = pooled_background(*releases)
    else:
        estimate, background, fission = RECIPES[name]
    S = (_fission_mix(T, sd, seed, estimate, background) if fission
         else estimate(T, sd, background(T, sd)))
    sparse_tw, sparse = rt.sparse_topic_word(T, sd)
    S = S.copy()
    S[sparse] = sparse_tw[sparse]
    return S


VARIANTS = ("landed", *RECIPES, *POOLED)


# ------------------------------------------------------------------------------- fits
def cached_fit(corpus_name: str, X, n_warm: int, k: int, eps, seed: int,
               cache: Path | None) -> dict:
    """The final pass's (T, σ, α0) and published topics of compare.py's fit (cached)."""
    path = cache and cache / f"v2_{corpus_name}_d{X.shape[1]}_k{k}_n{X.shape[0]}_s{seed}_e{eps}.npz"
    if path and path.exists():
        z = np.load(path)
        return {key: z[key] for key in z.files}
    import compare
    import streamdp.estimator as estimator_module
    calls = []
    original = estimator_module.refined_topics

    def recording(T, sd, alpha0):
        calls.append((np.array(T, dtype=np.float64), float(sd), float(alpha0)))
        return original(T, sd, alpha0)

    estimator_module.refined_topics = recording
    try:
        t0 = time.perf_counter()
        B, info = compare.fit_streamdp(X, n_warm, k, eps, seed, refine=True)
        fit_s = time.perf_counter() - t0
    finally:
        estimator_module.refined_topics = original
    T, sd, alpha0 = calls[-1]                    # the final pass publishes from these
    out = {"T": T, "sd": np.float64(sd), "alpha0": np.float64(alpha0), "published": B,
           "releases": np.stack([c[0] for c in calls]),
           "release_sds": np.array([c[1] for c in calls]),
           "fit_seconds": np.float64(fit_s), "start": np.array(info.get("start", ""))}
    if path:
        cache.mkdir(parents=True, exist_ok=True)
        np.savez(path, **out)
    return out


def load_corpus(name: str, a):
    from streamdp.evaluation.corpora import debian_descriptions_corpus, movie_reviews_corpus
    if name == "debian":
        return debian_descriptions_corpus(path=a.debian_list, limit=a.limit, max_words=a.max_words)
    if name == "reviews":
        return movie_reviews_corpus(limit=a.limit, max_words=a.max_words)
    raise SystemExit(f"unknown corpus {name!r}: debian or reviews")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpora", default="debian,reviews")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epsilons", default="4,1,none", help="comma-separated; 'none' = non-private")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"from {','.join(VARIANTS)}")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--max-words", type=int, default=5000)
    p.add_argument("--limit", type=int, default=None, help="first N documents of the corpus")
    p.add_argument("--debian-list", default=None, help="a Translation-en list (default: apt's)")
    p.add_argument("--cache", default=None,
                   help="fit cache directory (default: none, every fit is run)")
    p.add_argument("--fission-seed", type=int, default=0,
                   help="public seed of the fission draw (added to the run seed)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    for logger in ("absl", "gensim"):
        logging.getLogger(logger).setLevel(logging.ERROR)
    from streamdp.evaluation.coherence import npmi_coherence
    from streamdp.evaluation.corpora import shuffle_split
    from streamdp.evaluation.distinct import reader_metrics
    from streamdp.evaluation.metrics import background_only_topics, document_completion_perplexity
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    epsilons = [None if e.strip() == "none" else float(e) for e in a.epsilons.split(",")]
    cache = Path(a.cache) if a.cache else None
    rows, checks = [], []
    for name in [c.strip() for c in a.corpora.split(",") if c.strip()]:
        corpus = load_corpus(name, a)
        for seed in [int(s) for s in a.seeds.split(",")]:
            train, test = shuffle_split(corpus.n_docs, seed=seed, test_fraction=0.1)
            X, X_test = corpus.counts[train], corpus.counts[test]
            ref = [corpus.tokens[i] for i in test]
            n_warm = int(round(0.3 * len(train)))
            wc = np.asarray(X.sum(axis=0)).ravel()
            bg_ppl = document_completion_perplexity(background_only_topics(wc, a.k), X_test, seed=seed)
            print(f"[{name} seed {seed}] background-only perplexity {bg_ppl['perplexity']:.1f}",
                  flush=True)
            for eps in epsilons:
                fit = cached_fit(name, X, n_warm, a.k, eps, seed, cache)
                T, sd = fit["T"], float(fit["sd"])
                same = np.allclose(landed(T, sd, 0), fit["published"], rtol=0, atol=1e-12)
                checks.append({"corpus": name, "seed": seed, "epsilon": eps,
                               "landed_equals_published": bool(same)})
                for v in variants:
                    t0 = time.perf_counter()
                    B = variant(v, T, sd, a.fission_seed + seed, releases=(
                        (fit["releases"], fit["release_sds"]) if "releases" in fit else None))
                    post_s = time.perf_counter() - t0
                    coh = npmi_coherence(B, corpus.vocabulary, ref, topn=10, window_size=10)
                    ppl = document_completion_perplexity(B, X_test, seed=seed)
                    r = reader_metrics(B, wc, npmi_per_topic=coh["per_topic"])
                    rows.append({
                        "corpus": name, "seed": seed, "epsilon": "none" if eps is None else f"{eps:g}",
                        "variant": v, "distinct": r["distinct"], "npmi": coh["npmi"],
                        "npmi_median": r["npmi_median"], "background_share": r["background_share"],
                        "diversity": r["diversity"], "perplexity": ppl["perplexity"],
                        "background_only_perplexity": bg_ppl["perplexity"],
                        "zero_prob_tokens": ppl["zero_probability_tokens"],
                        "min_probability": float(B.min()), "post_seconds": post_s,
                        "sd": sd, "start": str(fit["start"])})
                    print({c: (round(x, 4) if isinstance(x, float) else x)
                           for c, x in rows[-1].items()}, flush=True)
    cols = ["corpus", "epsilon", "variant", "distinct", "npmi", "npmi_median", "background_share",
            "diversity", "perplexity", "background_only_perplexity", "zero_prob_tokens"]
    means = []
    for key in dict.fromkeys((r["corpus"], r["epsilon"], r["variant"]) for r in rows):
        rs = [r for r in rows if (r["corpus"], r["epsilon"], r["variant"]) == key]
        m = {"corpus": key[0], "epsilon": key[1], "variant": key[2], "n_seeds": len(rs)}
        for c in cols[3:]:
            m[c] = float(np.mean([r[c] for r in rs]))
        m["distinct_min"] = min(r["distinct"] for r in rs)
        m["distinct_max"] = max(r["distinct"] for r in rs)
        m["perplexity_worst"] = max(r["perplexity"] for r in rs)
        m["ppl_over_background_worst"] = max(r["perplexity"] / r["background_only_perplexity"]
                                             for r in rs)
        means.append(m)
    print("\n### Mean over seeds (worst seed's perplexity / background-only)\n")
    print(markdown_table(means, cols + ["distinct_min", "distinct_max", "ppl_over_background_worst"]))
    print(f"\nlanded equals the published topics: {all(c['landed_equals_published'] for c in checks)}")
    write_json(a.json, {"rows": rows, "means": means, "checks": checks, "variants": variants})
    return 0


if __name__ == "__main__":
    sys.exit(main())
