"""Non-private online LDA baselines: scikit-learn and gensim, same vocabulary and k as streamdp.

Both are *streaming* variational Bayes (Hoffman, Blei & Bach, 2010) fed the documents once, in
mini-batches, in the order given — the setting streamdp is built for (one pass, bounded memory).
Priors are the libraries' defaults, which coincide: document-topic α = 1/k (α0 = 1, as streamdp is
configured in the comparison) and topic-word η = 1/k. Single thread: scikit-learn gets
``n_jobs=1``; gensim's ``LdaModel`` is single-process; BLAS threads are limited by the caller
(``OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1`` and ``threadpoolctl`` in
``benchmarks/compare.py``).

    topic_word, info = fit_sklearn(counts_csr, 20, seed=0)
    topic_word, info = fit_gensim(counts_csr, 20, seed=0)

``topic_word`` is (k, d), rows on the simplex; ``info`` has ``fit_seconds``, ``docs_per_s``
(documents × passes / fit time, excluding the conversion of the input), ``n_docs``, ``passes``,
the library and its version, and the settings used.
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp


def _normalise(B: np.ndarray) -> np.ndarray:
    B = np.clip(np.asarray(B, dtype=float), 0.0, None)
    return B / B.sum(axis=1, keepdims=True)


def fit_sklearn(counts, n_topics: int, *, seed: int, batch_size: int = 4096, passes: int = 1,
                learning_decay: float = 0.7, learning_offset: float = 10.0,
                max_doc_update_iter: int = 100, mean_change_tol: float = 1e-3, **kw):
    """``sklearn.decomposition.LatentDirichletAllocation(learning_method="online")`` fed with
    ``partial_fit`` over consecutive batches of ``batch_size`` rows (``passes`` times).

    ``total_samples`` is the number of documents (the scale of the stochastic updates).
    Extra keyword arguments go to the constructor (e.g. ``doc_topic_prior``).
    """
    import sklearn
    from sklearn.decomposition import LatentDirichletAllocation

    X = sp.csr_matrix(counts, dtype=np.float64)
    n = X.shape[0]
    model = LatentDirichletAllocation(
        n_components=n_topics, learning_method="online", learning_decay=learning_decay,
        learning_offset=learning_offset, batch_size=batch_size, total_samples=n,
        max_doc_update_iter=max_doc_update_iter, mean_change_tol=mean_change_tol,
        evaluate_every=-1, n_jobs=1, random_state=seed, **kw)
    t0 = time.perf_counter()
    for _ in range(passes):
        for s in range(0, n, batch_size):
            model.partial_fit(X[s:s + batch_size])
    seconds = time.perf_counter() - t0
    return _normalise(model.components_), {
        "library": "scikit-learn", "version": sklearn.__version__, "fit_seconds": seconds,
        "docs_per_s": n * passes / seconds, "n_docs": n, "passes": passes,
        "settings": {"learning_method": "online", "batch_size": batch_size,
                     "learning_decay": learning_decay, "learning_offset": learning_offset,
                     "max_doc_update_iter": max_doc_update_iter, "n_jobs": 1,
                     "doc_topic_prior": model.doc_topic_prior_,
                     "topic_word_prior": model.topic_word_prior_, **kw}}


def fit_gensim(counts, n_topics: int, *, seed: int, chunksize: int = 4096, passes: int = 1,
               iterations: int = 50, decay: float = 0.5, offset: float = 1.0,
               vocabulary=None, **kw):
    """``gensim.models.LdaModel`` online (``update_every=1``: one M-step per chunk of
    ``chunksize`` documents), ``passes`` passes, α = η = ``"symmetric"``/default 1/k.

    ``vocabulary`` (optional) names the columns; the corpus is ``Sparse2Corpus`` over the CSR
    rows. ``eval_every=None`` (no perplexity estimates during training). Extra keyword
    arguments go to ``LdaModel``.
    """
    import gensim
    from gensim.matutils import Sparse2Corpus
    from gensim.models import LdaModel

    X = sp.csr_matrix(counts, dtype=np.float64)
    n, d = X.shape
    id2word = {j: (str(vocabulary[j]) if vocabulary is not None else str(j)) for j in range(d)}
    corpus = Sparse2Corpus(X, documents_columns=False)
    t0 = time.perf_counter()
    model = LdaModel(corpus=corpus, num_topics=n_topics, id2word=id2word, chunksize=chunksize,
                     passes=passes, update_every=1, alpha="symmetric", eta=None, decay=decay,
                     offset=offset, iterations=iterations, eval_every=None, random_state=seed,
                     dtype=np.float64, **kw)
    seconds = time.perf_counter() - t0
    return _normalise(model.get_topics()), {
        "library": "gensim", "version": gensim.__version__, "fit_seconds": seconds,
        "docs_per_s": n * passes / seconds, "n_docs": n, "passes": passes,
        "settings": {"online": True, "update_every": 1, "chunksize": chunksize,
                     "iterations": iterations, "decay": decay, "offset": offset,
                     "alpha": "symmetric (1/k)", "eta": "default (1/k)", **kw}}


BASELINES = {"sklearn": fit_sklearn, "gensim": fit_gensim}
