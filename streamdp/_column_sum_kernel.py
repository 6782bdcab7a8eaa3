"""Compiled in-order column sums (numba) for :func:`streamdp.refinement_sketch.sequential_column_sum`.

``out[cols[j], :] += vals[j, :]`` for j = 0, 1, 2, … in order, in place: each output entry is
the left-to-right sum of its terms in entry (document) order, continued from what ``out``
held — the additions the CSC product and ``np.add.at`` paths made, bit for bit, without
forming a (d × nnz) matrix or copying a (d, k) start per call. Imported lazily (numba's import
costs time); ``cache=True`` keeps the machine code for later processes.
"""
from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def add_rows_by_column(out, cols, vals):
    """out (d, k) += the rows of vals (nnz, k) at rows ``cols`` (nnz,), one row after another."""
    k = vals.shape[1]
    for j in range(cols.shape[0]):
        w = cols[j]
        for t in range(k):
            out[w, t] += vals[j, t]
