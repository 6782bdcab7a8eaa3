"""Model-agnostic topic-model metrics: recovery errors, diversity, document-completion perplexity.

Every function takes plain topic-word matrices (k, d) — rows on the simplex, as returned by
streamdp, scikit-learn, gensim or any private baseline — so all models are scored by the same
code. Library-specific quantities (sklearn's ``perplexity``, gensim's ``log_perplexity``) use
each library's own variational bound and are **not** comparable across models; use
:func:`document_completion_perplexity` instead.

Recovery against true topics (synthetic data), :func:`topic_recovery_metrics`
    Estimated topics are matched to the true ones by the Hungarian algorithm on the L2 distance
    (:func:`streamdp.evaluation.matching.match_topics`). Reported: mean/max L2 and L1 distance
    per matched topic, RMSE over all k·d entries, and Kendall τ-b of the top-10 words: for each
    matched pair, the union S of the true topic's and the estimate's 10 most probable words
    (10–20 words) is ranked by the true and by the estimated probabilities and τ-b of the two
    rankings is taken (1 = same order; an undefined τ, e.g. a constant estimate on S, counts as
    0); ``kendall_tau_mean`` averages over topics.

Topic diversity, :func:`topic_diversity`
    Fraction of distinct words among the top-25 words of all topics (k·25 slots): 1 = no two
    topics share a top word, 1/k = all topics identical (Dieng et al., 2020).

Document-completion perplexity, :func:`document_completion_perplexity`
    The exact procedure, identical for every model:

    1. **Smoothing.** Negative entries of the topic-word matrix are set to 0, each row is
       renormalised (an all-zero row becomes uniform) and mixed with the uniform distribution:
       β ← (1 − η)·β + η/d with η = 10⁻⁶ (:func:`smooth_topics`), so that no held-out word has
       probability 0 under any model and every model is smoothed by the same amount.
    2. **Split.** Each held-out document's tokens are put in a random order drawn from
       ``numpy.random.default_rng(seed)`` (one uniform key per token, ties impossible in
       practice; the split depends only on the count matrix and ``seed``, never on the model).
       The first ⌊n/2⌋ tokens are the *observed* half, the other ⌈n/2⌉ the *completion* half
       (:func:`split_document_halves`). Documents with fewer than ``min_length`` = 2 tokens are
       left out.
    3. **Fold-in.** For each document, θ starts uniform (1/k) and ``n_iter`` = 100 EM steps
       are run on the observed half with the topics fixed:
       r_wk ∝ θ_k β_kw,  θ_k ← (Σ_w c_w r_wk + α) / (n_obs + k·α),
       a symmetric Dirichlet prior with α = 1/k by default (α0 = 1, the prior every model of the
       comparison is configured with) — the EM iteration for the MAP θ under Dirichlet(α + 1),
       i.e. α pseudo-counts per topic, well defined for α < 1 (:func:`fold_in`). The number of
       iterations is fixed, not a convergence tolerance, so all models get the same work.
    4. **Score.** perplexity = exp(− Σ_docs Σ_w c'_w log Σ_k θ_k β_kw / Σ_docs Σ_w c'_w) over
       the completion halves c'.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from streamdp.evaluation.matching import match_topics

DEFAULT_SMOOTHING = 1e-6
DEFAULT_FOLD_IN_ITERATIONS = 100
DEFAULT_MIN_LENGTH = 2


# ------------------------------------------------------------------------- helpers
def _as_topics(topic_word) -> np.ndarray:
    B = np.asarray(topic_word, dtype=float)
    if B.ndim != 2 or B.shape[0] < 1 or B.shape[1] < 1:
        raise ValueError(f"topic_word must be a (k, d) matrix, got shape {B.shape}")
    if not np.all(np.isfinite(B)):
        raise ValueError("topic_word has non-finite entries")
    return B


def _as_counts(X) -> sp.csr_matrix:
    X = sp.csr_matrix(X, dtype=float)
    X.sum_duplicates()
    if X.nnz and (np.any(X.data < 0) or np.any(X.data != np.round(X.data))):
        raise ValueError("counts must be non-negative integers")
    return X


def _top_words(row: np.ndarray, n: int) -> np.ndarray:
    return np.argsort(-row, kind="stable")[:n]


# ------------------------------------------------------------------- recovery
def topic_recovery_metrics(true, est, *, topn: int = 10) -> dict:
    """Hungarian-matched L1/L2 errors, RMSE and top-``topn`` Kendall τ-b (see module doc).

    Returns a dict with ``l2_mean``, ``l2_max``, ``l1_mean``, ``l1_max``, ``rmse``,
    ``kendall_tau_mean`` (floats), ``l2``, ``l1``, ``kendall_tau`` (per true topic) and
    ``permutation`` (``est[permutation[i]]`` is matched to ``true[i]``).
    """
    from scipy.stats import kendalltau   # scipy.stats is slow to import; only needed here

    true, est = _as_topics(true), _as_topics(est)
    p = match_topics(true, est)
    matched = est[p]
    diff = true - matched
    l2 = np.linalg.norm(diff, axis=1)
    l1 = np.abs(diff).sum(axis=1)
    taus = np.empty(true.shape[0])
    for i in range(true.shape[0]):
        S = np.union1d(_top_words(true[i], topn), _top_words(matched[i], topn))
        tau = kendalltau(true[i, S], matched[i, S]).statistic
        taus[i] = 0.0 if not np.isfinite(tau) else float(tau)
    return {"l2_mean": float(l2.mean()), "l2_max": float(l2.max()),
            "l1_mean": float(l1.mean()), "l1_max": float(l1.max()),
            "rmse": float(np.sqrt(np.mean(diff ** 2))), "kendall_tau_mean": float(taus.mean()),
            "l2": l2, "l1": l1, "kendall_tau": taus, "permutation": p}


def topic_diversity(topic_word, topn: int = 25) -> float:
    """Distinct words among the top-``topn`` words of all topics / (k · topn)."""
    B = _as_topics(topic_word)
    topn = min(int(topn), B.shape[1])
    top = np.concatenate([_top_words(row, topn) for row in B])
    return float(np.unique(top).size / top.size)


# ----------------------------------------------------------------- perplexity
def smooth_topics(topic_word, smoothing: float = DEFAULT_SMOOTHING) -> np.ndarray:
    """Clip negatives, renormalise rows (zero rows → uniform), mix with η·uniform."""
    B = np.clip(_as_topics(topic_word), 0.0, None)
    d = B.shape[1]
    if not 0 <= smoothing < 1:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing!r}")
    s = B.sum(axis=1, keepdims=True)
    B = np.where(s > 0, B / np.where(s > 0, s, 1.0), 1.0 / d)
    return (1.0 - smoothing) * B + smoothing / d


def split_document_halves(X, *, seed: int = 0) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Split every document's tokens at random into (observed ⌊n/2⌋, completion ⌈n/2⌉).

    Deterministic in (X, seed); independent of any model. Both outputs have X's shape.
    """
    X = _as_counts(X)
    n, d = X.shape
    counts = X.data.astype(np.int64)
    nnz_rows = np.repeat(np.arange(n), np.diff(X.indptr))
    rows = np.repeat(nnz_rows, counts)
    cols = np.repeat(X.indices.astype(np.int64), counts)
    keys = np.random.default_rng(seed).random(rows.size)
    order = np.lexsort((keys, rows))
    rows, cols = rows[order], cols[order]
    lengths = np.bincount(rows, minlength=n)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    pos = np.arange(rows.size) - starts[rows]
    first = pos < (lengths // 2)[rows]

    def build(mask):
        M = sp.csr_matrix((np.ones(int(mask.sum())), (rows[mask], cols[mask])), shape=(n, d))
        M.sum_duplicates()
        return M

    return build(first), build(~first)


def fold_in(topic_word, X_observed, *, alpha: float | None = None,
            n_iter: int = DEFAULT_FOLD_IN_ITERATIONS, smoothing: float = DEFAULT_SMOOTHING,
            chunk: int = 4096) -> np.ndarray:
    """θ (n, k) of each document by ``n_iter`` fixed-topic EM steps (module doc, step 3).

    ``topic_word`` is smoothed with :func:`smooth_topics` first. Documents with no observed
    token get the uniform θ.
    """
    B = smooth_topics(topic_word, smoothing)
    k, d = B.shape
    X = _as_counts(X_observed)
    if X.shape[1] != d:
        raise ValueError(f"counts have {X.shape[1]} columns but the topics {d}")
    alpha = 1.0 / k if alpha is None else float(alpha)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha!r}")
    n_iter = int(n_iter)
    theta = np.full((X.shape[0], k), 1.0 / k)
    BT = np.ascontiguousarray(B.T)                  # (d, k)
    for s in range(0, X.shape[0], chunk):
        Xc = X[s:s + chunk]
        m = Xc.shape[0]
        rows = np.repeat(np.arange(m), np.diff(Xc.indptr))
        P = BT[Xc.indices]                          # (nnz, k): β_kw at each nonzero
        n_obs = np.asarray(Xc.sum(axis=1)).ravel()
        th = theta[s:s + m]
        for _ in range(n_iter):
            denom = np.einsum("nk,nk->n", th[rows], P)
            M = sp.csr_matrix((Xc.data / denom, Xc.indices, Xc.indptr), shape=Xc.shape)
            expected = th * (M @ BT)                 # Σ_w c_w r_wk
            th = (expected + alpha) / (n_obs[:, None] + k * alpha)
        theta[s:s + m] = th
    return theta


def completion_log_likelihood(topic_word, theta, X_completion, *,
                              smoothing: float = DEFAULT_SMOOTHING) -> np.ndarray:
    """Σ_w c'_w log Σ_k θ_k β_kw for each document (n,)."""
    B = smooth_topics(topic_word, smoothing)
    X = _as_counts(X_completion)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    p = np.einsum("nk,nk->n", np.asarray(theta)[rows], B.T[X.indices])
    return np.bincount(rows, weights=X.data * np.log(p), minlength=X.shape[0])


def background_only_topics(word_counts, k: int, *, pseudo_count: float = 0.5) -> np.ndarray:
    """The model with no topics (issue 22's yardstick): ``k`` copies of the training corpus's
    word frequencies, each count + ``pseudo_count``. A topic model whose held-out perplexity is
    above this one's predicts the held-out words worse than the corpus word frequencies do."""
    c = np.asarray(word_counts, dtype=np.float64).ravel() + float(pseudo_count)
    return np.tile(c / c.sum(), (int(k), 1))


def document_completion_perplexity(topic_word, X_test, *, alpha: float | None = None,
                                   n_iter: int = DEFAULT_FOLD_IN_ITERATIONS, seed: int = 0,
                                   smoothing: float = DEFAULT_SMOOTHING,
                                   min_length: int = DEFAULT_MIN_LENGTH) -> dict:
    """Document-completion perplexity of held-out documents (module doc, steps 1–4).

    Returns ``perplexity``, ``log_likelihood`` (total nats), ``n_tokens`` (completion tokens
    scored), ``n_docs`` (documents with ≥ ``min_length`` tokens), ``zero_probability_tokens``
    (fraction of completion tokens whose word has probability 0 in every topic before
    smoothing — each costs about log(d/η) ≈ 22 nats at d = 5000, so a few percent of them
    dominate the perplexity of a sparse model), and the settings used.
    """
    X = _as_counts(X_test)
    lengths = np.asarray(X.sum(axis=1)).ravel()
    X = X[lengths >= max(int(min_length), 2)]
    if X.shape[0] == 0:
        raise ValueError(f"no held-out document has at least {min_length} tokens")
    obs, comp = split_document_halves(X, seed=seed)
    theta = fold_in(topic_word, obs, alpha=alpha, n_iter=n_iter, smoothing=smoothing)
    ll = completion_log_likelihood(topic_word, theta, comp, smoothing=smoothing)
    n_tokens = float(comp.sum())
    k = np.shape(topic_word)[0]
    unsupported = ~(np.clip(_as_topics(topic_word), 0.0, None).max(axis=0) > 0)
    zero = float(comp[:, unsupported].sum()) / n_tokens if unsupported.any() else 0.0
    return {"perplexity": float(np.exp(-ll.sum() / n_tokens)), "log_likelihood": float(ll.sum()),
            "n_tokens": int(n_tokens), "n_docs": int(X.shape[0]), "zero_probability_tokens": zero,
            "alpha": 1.0 / k if alpha is None else float(alpha), "n_iter": int(n_iter),
            "seed": int(seed), "smoothing": float(smoothing)}
