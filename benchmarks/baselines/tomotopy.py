"""Non-private peer: tomotopy's collapsed Gibbs sampler for LDA (C++, PyPI ``tomotopy``).

Same vocabulary and k as every other model of ``benchmarks/compare.py``: each document is handed
to ``tomotopy.LDAModel.add_doc`` as its tokens, a token being the *column index* of the counts
matrix written as a string (``"0"`` … ``"d-1"``), so tomotopy's own vocabulary is exactly ours
(words that never occur in the training documents are absent from tomotopy's model and get
probability 0 here). One thread: ``train(..., workers=1)``. Priors: document-topic α = 1/k per
topic (α0 = 1, as streamdp, gensim and scikit-learn are configured in the comparison), kept fixed
(``optim_interval = 0``: tomotopy would otherwise re-estimate α every 10 sweeps); topic-word
η = 0.01, tomotopy's default and the usual value for collapsed Gibbs (Griffiths & Steyvers 2004).

    topic_word, info = fit_tomotopy(counts_csr, 20, seed=0, sweeps=100)

``topic_word`` is (k, d), rows on the simplex: tomotopy's ``get_topic_word_dist`` (the smoothed
posterior mean (n_kw + η) / (n_k + V η) over its V used words) placed in our columns. ``info``
times the three stages separately: ``ingest_seconds`` (model construction + ``add_doc`` of every
document), ``init_seconds`` (``train(0)``: tomotopy's random initial assignment) and
``train_seconds`` (the ``sweeps`` Gibbs sweeps). ``fit_seconds`` is their sum, ``docs_per_s``
the documents per second overall (n / fit_seconds, the model at the configured number of sweeps)
and ``sweep_docs_per_s`` the documents sampled per second within the sweeps
(n × sweeps / train_seconds). tomotopy's own ``perplexity`` / ``ll_per_word`` are of the
*training* tokens under its sampled state: reported as ``own_*`` and not comparable with the
held-out document-completion perplexity that ``compare.py`` computes from ``topic_word``.
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

DEFAULT_SWEEPS = 100
DEFAULT_ETA = 0.01


def _documents(X: sp.csr_matrix, names: list[str]):
    """Row i as a list of tokens (column names repeated by count), in column order."""
    indptr, indices, data = X.indptr, X.indices, X.data.astype(np.int64)
    for i in range(X.shape[0]):
        s, e = indptr[i], indptr[i + 1]
        yield [names[j] for j, c in zip(indices[s:e], data[s:e]) for _ in range(c)]


def fit_tomotopy(counts, n_topics: int, *, seed: int, sweeps: int = DEFAULT_SWEEPS,
                 alpha: float | None = None, eta: float = DEFAULT_ETA, optim_interval: int = 0,
                 workers: int = 1, **kw):
    """Collapsed Gibbs LDA, ``sweeps`` sweeps over every training document (see module doc).

    Empty documents are skipped (tomotopy would raise), as they carry no tokens. ``counts``
    must hold non-negative integer counts. Extra keyword arguments go to ``LDAModel``.
    """
    import tomotopy as tp

    X = sp.csr_matrix(counts)
    if X.nnz and (X.data.min() < 0 or not np.all(X.data == np.round(X.data))):
        raise ValueError("tomotopy needs non-negative integer counts")
    n, d = X.shape
    k = int(n_topics)
    alpha = 1.0 / k if alpha is None else float(alpha)
    names = [str(j) for j in range(d)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    model = tp.LDAModel(k=k, alpha=alpha, eta=eta, seed=int(seed), **kw)
    model.optim_interval = int(optim_interval)
    n_added = 0
    for words in _documents(X, names):
        if words:
            model.add_doc(words)
            n_added += 1
    t1 = time.perf_counter()
    model.train(0, workers=workers)
    t2 = time.perf_counter()
    model.train(int(sweeps), workers=workers)
    t3 = time.perf_counter()
    cpu = time.process_time() - cpu0

    B = np.zeros((k, d))
    cols = np.fromiter((int(w) for w in model.used_vocabs), dtype=np.int64,
                       count=len(model.used_vocabs))
    for t in range(k):
        B[t, cols] = np.asarray(model.get_topic_word_dist(t, normalize=True), dtype=float)
    B /= B.sum(axis=1, keepdims=True)
    fit = t3 - t0
    return B, {
        "library": "tomotopy", "version": tp.__version__, "isa": tp.isa,
        "fit_seconds": fit, "ingest_seconds": t1 - t0, "init_seconds": t2 - t1,
        "train_seconds": t3 - t2, "cpu_seconds": cpu, "cpu_per_wall": cpu / fit,
        "docs_per_s": n / fit, "sweep_docs_per_s": n * sweeps / (t3 - t2) if sweeps else None,
        "sweep_tokens_per_s": float(X.sum()) * sweeps / (t3 - t2) if sweeps else None,
        "n_docs": n, "n_docs_nonempty": n_added, "sweeps": int(sweeps),
        "own_training_perplexity": float(model.perplexity),
        "own_ll_per_word": float(model.ll_per_word),
        "settings": {"alpha": alpha, "eta": eta, "optim_interval": int(optim_interval),
                     "workers": workers, "sweeps": int(sweeps), "tw": "one", **kw}}
