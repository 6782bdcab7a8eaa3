"""Compiled Sum2 step (numba) for :func:`streamdp.privacy.rounding.accumulate`.

The same floating-point operations as the numpy path, element by element and in the same
order (TwoSum: s = h + x, b' = s − h, e = (h − (s − b')) + (x − b'); l += e; h = s), so the
results are bit-identical (no fastmath: nothing is reassociated or contracted); one pass over
memory instead of the numpy path's eight. Imported lazily (numba's import costs time).
"""
from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def sum2_inplace(h, lo, x):
    """h, lo, x: contiguous float64 vectors of one length; h ← fl(h + x), lo += its error."""
    for i in range(h.shape[0]):
        a = h[i]
        b = x[i]
        s = a + b
        bp = s - a
        lo[i] += (a - (s - bp)) + (b - bp)
        h[i] = s
