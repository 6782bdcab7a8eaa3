"""Compiled per-document fold-in (numba): the E-step of :func:`streamdp.refinement.fold_in`.

Imported lazily by :mod:`streamdp.refinement` (numba's import and the first compilation cost
time; ``cache=True`` keeps the machine code in ``__pycache__`` for later processes).

Each document is processed on its own, from its own entries and the model only: the loops
never read another row, so a document's results do not depend on the block or batch it is in
(tests/test_batch_invariance.py). No fastmath: every sum is added in a fixed order (topics
0..k−1, the document's entries in order), the same for every document.

Why CVB0 and not a point estimate of θ (issue 22 item 4). With Φ fixed, the exact posterior's
expected topic-word counts, summed over documents, have the true model's counts as their
expectation (the tower property), so an EM step from the true topics stays there. A point
estimate θ̂ that counts each token in its own prior (θ̂ ∝ α + Σ_w c_w r_·w, the previous
kernel) over-assigns every token to its document's dominant topic. CVB0 (Asuncion et al. 2009,
zero-order collapsed variational Bayes) leaves the token out of its own document's counts:
γ_w ∝ Φ_·w ⊙ (α + N − γ_w), N = Σ_w c_w γ_w. Measured on synthetic LDA (d = 1000, k = 10, 200k
documents, one pass from the *true* topics, 5 sweeps): the point estimate lands 0.0030 from the
truth, CVB0 0.0015 with parallel sweeps (0.0014 updating N after every word; the spectral
estimator's sampling error is 0.0015). The sweeps are parallel (every word of a sweep reads the
same N) because that vectorises like the old kernel: at k = 20 the in-place variant ran at
≈ 0.6× the old kernel's documents/s, the parallel one at its speed.
"""
from __future__ import annotations

import numpy as np
from numba import njit


# error_model="numpy": no zero-division checks (they keep LLVM from vectorising the loops); no
# division here can be by zero — a_sum ≥ k·10⁻³ (α floored), and every normalisation is by a
# sum checked > 0 first or of terms ≥ α_t > 0
@njit(cache=True, nogil=True, error_model="numpy")
def fold_in_rows(indptr, indices, counts, phiT, alpha, n_iter, theta_out, resp_out):
    """θ (n, k) and responsibilities (nnz, k) of the CSR documents (indptr, indices, counts)
    under Φᵀ = ``phiT`` (d, k) and prior ``alpha`` (k,, already floored), written into
    ``theta_out`` and ``resp_out``.

    Per document (c its counts, l = Σ c, A = Σ α): γ_w ∝ α ⊙ Φ_·w (γ_w = α/A where every
    topic gives word w probability 0), N = Σ_w c_w γ_w; then ``n_iter`` parallel sweeps, each
    γ_w ← normalise(Φ_·w ⊙ (α + N − γ_w)) for every entry w from the same N (normalise(α + N −
    γ_w) where that is 0), then N ← Σ_w c_w γ_w. ``resp_out`` is γ, θ = (α + N) / (A + l).
    """
    n = indptr.shape[0] - 1
    k = phiT.shape[1]
    a_sum = 0.0
    for t in range(k):
        a_sum += alpha[t]
    longest = 0
    for i in range(n):
        longest = max(longest, indptr[i + 1] - indptr[i])
    phi = np.empty((max(longest, 1), k))      # the document's Φ columns, gathered once
    # the document's γ, swept in this small local buffer (in cache) and written to resp_out
    # once at the end, not swept in resp_out itself (a block's nnz × k: megabytes)
    gam = np.empty((max(longest, 1), k))
    v = np.empty(k)
    N = np.empty(k)
    N_next = np.empty(k)
    aN = np.empty(k)
    for i in range(n):
        a, b = indptr[i], indptr[i + 1]
        m = b - a
        length = 0.0
        for t in range(k):
            N[t] = 0.0
        for j in range(m):                    # start: the prior mean's responsibilities
            c = counts[a + j]
            length += c
            w = indices[a + j]
            s = 0.0
            for t in range(k):
                phi[j, t] = phiT[w, t]
                v[t] = alpha[t] * phi[j, t]
                s += v[t]
            if s > 0.0:
                inv = 1.0 / s
                for t in range(k):
                    gam[j, t] = v[t] * inv
            else:       # a word every topic gives probability 0: the prior mean
                for t in range(k):
                    gam[j, t] = alpha[t] / a_sum
            for t in range(k):
                N[t] += c * gam[j, t]
        for _ in range(n_iter):
            for t in range(k):
                N_next[t] = 0.0
                aN[t] = alpha[t] + N[t]
            for j in range(m):
                # aN − γ_w ≥ α > 0: N ≥ c_w γ_w (c_w ≥ 1) from the same sweep, up to rounding
                # far below α's floor 10⁻³, so no positive part is needed (and loops vectorise)
                s = 0.0
                for t in range(k):
                    v[t] = phi[j, t] * (aN[t] - gam[j, t])
                    s += v[t]
                if not s > 0.0:     # unemittable word: the leave-one-out topic shares
                    s = 0.0
                    for t in range(k):
                        v[t] = aN[t] - gam[j, t]
                        s += v[t]
                inv = 1.0 / s
                c = counts[a + j]
                for t in range(k):
                    g = v[t] * inv
                    gam[j, t] = g
                    N_next[t] += c * g
            for t in range(k):
                N[t] = N_next[t]
        for j in range(m):
            for t in range(k):
                resp_out[a + j, t] = gam[j, t]
        for t in range(k):
            theta_out[i, t] = (alpha[t] + N[t]) / (a_sum + length)
