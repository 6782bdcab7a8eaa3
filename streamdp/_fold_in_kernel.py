"""Compiled per-document fold-in (numba): the EM fixed point of :func:`streamdp.refinement.fold_in`.

Imported lazily by :mod:`streamdp.refinement` (numba's import and the first compilation cost
time; ``cache=True`` keeps the machine code in ``__pycache__`` for later processes).

Each document is processed on its own, from its own entries and the model only: the loops
never read another row, so a document's results do not depend on the block or batch it is in
(tests/test_batch_invariance.py). No fastmath: every sum is added in a fixed order (topics
0..k−1 for s_w, the document's entries in order for Σ_w), the same for every document.
"""
from __future__ import annotations

import numpy as np
from numba import njit


# error_model="numpy": no zero-division checks (they keep LLVM from vectorising the loops); no
# division here can be by zero — a_sum ≥ k·10⁻³ (α floored), denom ≥ a_sum, and c_w / s_w only
# where s_w > 0 — so the results are bit-identical to the checked build (≈ 10% faster)
@njit(cache=True, nogil=True, error_model="numpy")
def fold_in_rows(indptr, indices, counts, phiT, alpha, n_iter, theta_out, resp_out):
    """θ (n, k) and responsibilities (nnz, k) of the CSR documents (indptr, indices, counts)
    under Φᵀ = ``phiT`` (d, k) and prior ``alpha`` (k,, already floored), written into
    ``theta_out`` and ``resp_out``.

    Per document (c its counts, l = Σ c, A = Σ α): θ⁰ = α / A; n_iter − 1 times
    θ ← (α + θ ⊙ (Σ_{w: s_w>0} (c_w / s_w) Φ_·w + Σ_{w: s_w=0} c_w)) / (A + l), s_w = Σ_i θ_i Φ_iw;
    then r_iw = θ_i Φ_iw / s_w (θ_i where s_w = 0) and θ ← (α + Σ_w c_w r_·w) / (A + l).
    """
    n = indptr.shape[0] - 1
    k = phiT.shape[1]
    a_sum = 0.0
    for t in range(k):
        a_sum += alpha[t]
    longest = 0
    for i in range(n):
        longest = max(longest, indptr[i + 1] - indptr[i])
    # the document's Φ columns, gathered once, in both layouts: (k, m) for s (vectorised over
    # words, each s_w summed over topics in order) and (m, k) for the Σ over words
    phi_tw = np.empty((k, max(longest, 1)))
    phi_wt = np.empty((max(longest, 1), k))
    s = np.empty(max(longest, 1))
    theta = np.empty(k)
    acc = np.empty(k)
    for i in range(n):
        a, b = indptr[i], indptr[i + 1]
        m = b - a
        length = 0.0
        for j in range(m):
            length += counts[a + j]
            w = indices[a + j]
            for t in range(k):
                v = phiT[w, t]
                phi_wt[j, t] = v
                phi_tw[t, j] = v
        denom = a_sum + length
        for t in range(k):
            theta[t] = alpha[t] / a_sum
        for _ in range(n_iter - 1):
            for j in range(m):
                s[j] = 0.0
            for t in range(k):
                th = theta[t]
                for j in range(m):
                    s[j] += phi_tw[t, j] * th
            for t in range(k):
                acc[t] = 0.0
            dead = 0.0
            for j in range(m):
                if s[j] > 0.0:
                    g = counts[a + j] / s[j]
                    for t in range(k):
                        acc[t] += g * phi_wt[j, t]
                else:       # a word every topic gives probability 0: its responsibilities are θ
                    dead += counts[a + j]
            for t in range(k):
                theta[t] = (alpha[t] + theta[t] * (acc[t] + dead)) / denom
        for j in range(m):
            s[j] = 0.0
        for t in range(k):
            th = theta[t]
            for j in range(m):
                s[j] += phi_tw[t, j] * th
        for t in range(k):
            acc[t] = 0.0
        for j in range(m):
            c = counts[a + j]
            if s[j] > 0.0:
                for t in range(k):
                    r = phi_wt[j, t] * theta[t] / s[j]
                    resp_out[a + j, t] = r
                    acc[t] += c * r
            else:
                for t in range(k):
                    resp_out[a + j, t] = theta[t]
                    acc[t] += c * theta[t]
        for t in range(k):
            theta_out[i, t] = (alpha[t] + acc[t]) / denom
