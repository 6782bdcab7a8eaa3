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

from streamdp import serialization as ser

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


class PendingRows:
    """Cuts a sketch's own document sequence into chunks of exactly ``chunk`` rows.

    Why (docs/privacy.md, "Floating point", "Sums that do not contain the document"): the
    rounding of a chunk's products depends on which rows share the chunk. Counting chunks in
    the sketch's *own* sequence (not per ``update`` call) makes every sum a deterministic
    function of that sequence, whatever the callers' batches were. The rows of the partial
    last chunk wait here (raw counts, as secret as the sketch; checkpointed with it) until
    later rows complete it; readers process them as one final chunk on a copy.
    """

    def __init__(self, d: int, chunk: int) -> None:
        self.d, self.chunk = int(d), int(chunk)
        self._pieces: list[sp.csr_matrix] = []
        self.n = 0

    def feed(self, X: sp.csr_matrix):
        """Yield, in order, the full chunks that the rows of ``X`` (canonical CSR) complete;
        keep the rest pending. Consume the generator fully."""
        start, n = 0, X.shape[0]
        if self.n:
            need = self.chunk - self.n
            if n < need:
                self._keep(X)
                return
            pieces, self._pieces, self.n = self._pieces + [X[:need]], [], 0
            start = need
            yield _stack(pieces, self.d)
        while n - start >= self.chunk:
            yield X[start:start + self.chunk]
            start += self.chunk
        if start < n:
            self._keep(X[start:] if start else X)

    def feed_weighted(self, X: sp.csr_matrix, weights: np.ndarray | None,
                      pending_weights: np.ndarray, update) -> np.ndarray:
        """:meth:`feed` with per-row weights (``None``: all 1): calls ``update(chunk,
        chunk_weights)`` for every full chunk and returns the weights of the rows left pending
        (the caller keeps them beside this object, as ``pending_weights``)."""
        w_all = np.concatenate([pending_weights,
                                np.ones(X.shape[0]) if weights is None else weights])
        pos = 0
        for chunk in self.feed(X):
            update(chunk, w_all[pos:pos + chunk.shape[0]])
            pos += chunk.shape[0]
        return w_all[pos:]

    def _keep(self, X: sp.csr_matrix) -> None:
        if X.shape[0]:
            self._pieces.append(X)
            self.n += X.shape[0]

    def rows(self) -> sp.csr_matrix:
        """The pending rows as one CSR matrix (not consumed)."""
        if len(self._pieces) != 1:
            self._pieces = [_stack(self._pieces, self.d)] if self._pieces else []
        return self._pieces[0] if self._pieces else sp.csr_matrix((0, self.d))

    def take(self) -> sp.csr_matrix:
        """The pending rows as one CSR matrix, consumed (they become a final chunk)."""
        out = self.rows()
        self._pieces, self.n = [], 0
        return out

    def copy(self) -> "PendingRows":
        out = PendingRows(self.d, self.chunk)
        out._pieces, out.n = list(self._pieces), self.n      # pieces are never modified
        return out

    @property
    def nbytes(self) -> int:
        return sum(p.data.nbytes + p.indices.nbytes + p.indptr.nbytes for p in self._pieces)

    def to_dict(self) -> dict:
        X = self.rows()
        return {"n": self.n, "data": ser.pack_array(X.data),
                "indices": ser.pack_array(X.indices.astype(np.int64)),
                "indptr": ser.pack_array(X.indptr.astype(np.int64))}

    @classmethod
    def from_dict(cls, obj: dict, d: int, chunk: int) -> "PendingRows":
        """Pending rows of a checkpoint (:meth:`to_dict`; ``{"n": 0}``: none)."""
        out = cls(d, chunk)
        if not int(obj["n"]):
            return out
        n = int(obj["n"])
        indptr = ser.unpack_array(obj["indptr"], name="pending.indptr")
        indices = ser.unpack_array(obj["indices"], name="pending.indices")
        data = ser.unpack_array(obj["data"], name="pending.data")
        if not (0 < n < chunk and indptr.shape == (n + 1,) and indices.shape == data.shape
                and indptr[0] == 0 and indptr[-1] == data.size):
            raise ser.SchemaError(f"pending rows: inconsistent CSR arrays for {n} rows "
                                  f"(chunk {chunk})")
        X = sp.csr_matrix((data.astype(np.float64), indices, indptr), shape=(n, d))
        out._keep(as_count_batch(X, d))
        return out


def _stack(pieces: list[sp.csr_matrix], d: int) -> sp.csr_matrix:
    if len(pieces) == 1:
        return pieces[0]
    return sp.csr_matrix(sp.vstack(pieces, format="csr"), dtype=np.float64)
