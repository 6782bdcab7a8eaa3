"""Documents as sparse count rows over a fixed public vocabulary.

A batch of documents is a ``scipy.sparse.csr_array``/``csr_matrix`` of shape
(n_docs, d) with non-negative integer counts. Documents with fewer than
``MIN_DOC_LENGTH`` tokens are skipped: the LDA moment estimators need three
distinct token positions, and whether a document is skipped depends on that
document alone, so skipping never couples neighbouring datasets.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

MIN_DOC_LENGTH = 3


def as_count_batch(X, n_features: int | None = None) -> sp.csr_matrix:
    """Validate and convert a batch of documents to canonical CSR float64.

    Parameters
    ----------
    X : sparse matrix or array-like, shape (n_docs, d)
        Word counts; must be finite, non-negative and integral.
    n_features : int, optional
        Expected vocabulary size d.

    Returns
    -------
    csr_matrix, shape (n_docs, d), float64, with sorted, summed indices.
    """
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64, copy=True)
    else:
        arr = np.asarray(X, dtype=np.float64)
        if arr.ndim != 2:
            raise ValueError(f"documents must be a 2-D (n_docs, d) count matrix, got shape {arr.shape}")
        X = sp.csr_matrix(arr)
    if X.ndim != 2:
        raise ValueError("documents must be a 2-D (n_docs, d) count matrix")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(
            f"documents have {X.shape[1]} columns but the vocabulary has {n_features} words; "
            "use the same public vocabulary for warm-up and stream")
    X.sum_duplicates()
    X.eliminate_zeros()
    data = X.data
    if data.size:
        if not np.all(np.isfinite(data)):
            raise ValueError("document counts must be finite")
        if data.min() < 0:
            raise ValueError("document counts must be non-negative")
        if not np.all(data == np.round(data)):
            raise ValueError("document counts must be integers (word counts, not weights)")
    return X


def keep_long_documents(X: sp.csr_matrix) -> tuple[sp.csr_matrix, np.ndarray]:
    """Drop documents shorter than MIN_DOC_LENGTH.

    Returns the filtered batch and the lengths (float64, shape (n_kept,)).
    """
    lengths = np.asarray(X.sum(axis=1)).ravel()
    keep = lengths >= MIN_DOC_LENGTH
    if not keep.all():
        X = X[keep]
        lengths = lengths[keep]
    return X, lengths
