"""Synthetic LDA corpora (topic-word Dirichlet, Dirichlet mixtures, Poisson lengths)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class LDAModel:
    """topics (k, d) rows on the simplex; alpha (k,) Dirichlet prior of mixtures."""

    topics: np.ndarray
    alpha: np.ndarray

    @property
    def alpha0(self) -> float:
        return float(self.alpha.sum())


def make_lda_model(vocab_size: int, n_topics: int, *, alpha0: float = 1.0,
                   beta: float = 0.05, alpha: np.ndarray | None = None, seed: int = 0) -> LDAModel:
    """Topics ~ Dirichlet(beta) over the vocabulary; α uniform with sum α0 unless given."""
    if n_topics < 1 or vocab_size < 2:
        raise ValueError(f"need n_topics >= 1 and vocab_size >= 2, got {n_topics}, {vocab_size}")
    if not (alpha0 > 0 and beta > 0):
        raise ValueError(f"alpha0 and beta must be > 0, got {alpha0}, {beta}")
    rng = np.random.default_rng(seed)
    topics = rng.dirichlet(np.full(vocab_size, beta), size=n_topics)
    a = np.full(n_topics, alpha0 / n_topics) if alpha is None else np.asarray(alpha, float)
    if a.shape != (n_topics,) or np.any(a <= 0):
        raise ValueError("alpha must be a positive vector of length n_topics")
    return LDAModel(topics=topics, alpha=a)


def sample_documents(model: LDAModel, n_docs: int, *, mean_length: float = 50.0,
                     length_offset: int = 3, seed: int = 0, chunk: int = 20000,
                     lengths=None, progress=None) -> sp.csr_matrix:
    """Draw ``n_docs`` documents; lengths Poisson(mean_length) + length_offset, or drawn
    with replacement from ``lengths`` (an empirical length distribution, e.g. a real corpus's).
    ``progress`` (optional) is called with the number of documents of each finished chunk.

    Vectorised per token (topic by inverse CDF of the document's mixture, word by
    inverse CDF of the topic), in chunks of documents. Returns CSR (n_docs, d).
    """
    rng = np.random.default_rng(seed)
    k, d = model.topics.shape
    cum_topics = np.cumsum(model.topics, axis=1)
    cum_topics[:, -1] = 1.0
    parts = []
    for start in range(0, n_docs, chunk):
        n = min(chunk, n_docs - start)
        h = rng.dirichlet(model.alpha, size=n)                       # (n, k)
        if lengths is None:
            doc_lengths = rng.poisson(mean_length, size=n) + length_offset
        else:
            doc_lengths = rng.choice(np.asarray(lengths, dtype=np.int64), size=n)
        doc = np.repeat(np.arange(n), doc_lengths)
        ch = np.cumsum(h, axis=1)
        ch[:, -1] = 1.0
        u = rng.random(doc.size)
        topic = np.minimum((u[:, None] > ch[doc]).sum(axis=1), k - 1)
        words = np.empty(doc.size, dtype=np.int64)
        v = rng.random(doc.size)
        for t in range(k):
            sel = topic == t
            words[sel] = np.searchsorted(cum_topics[t], v[sel], side="right")
        np.minimum(words, d - 1, out=words)
        X = sp.csr_matrix((np.ones(doc.size), (doc, words)), shape=(n, d))
        X.sum_duplicates()
        parts.append(X)
        if progress is not None:
            progress(n)
    return sp.vstack(parts, format="csr")
