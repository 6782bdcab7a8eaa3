"""Dense brute-force LDA moments (DESIGN §2), for tests and small vocabularies.

O(d³) memory: only for d up to a few hundred. These are the definitions the
sketch path is tested against, written as literally as possible. The small
helpers (``lda_coefficients``, ``whiten3``) are shared with the release.
"""
from __future__ import annotations

import numpy as np


def lda_coefficients(alpha0: float) -> tuple[float, float, float]:
    """(a, b, c) of M2 = E2 − a M1⊗M1 and M3 = E3 − b(...) + c M1^{⊗3}."""
    a = alpha0 / (alpha0 + 1)
    b = alpha0 / (alpha0 + 2)
    c = 2 * alpha0**2 / ((alpha0 + 1) * (alpha0 + 2))
    return a, b, c


def doc_e2(c: np.ndarray) -> np.ndarray:
    l = c.sum()
    return (np.outer(c, c) - np.diag(c)) / (l * (l - 1))


def doc_e3(c: np.ndarray) -> np.ndarray:
    """Literal DESIGN §2 formula for one count vector c (d,)."""
    d = c.size
    l = c.sum()
    T = np.einsum("i,j,k->ijk", c, c, c)
    I = np.eye(d)
    # Σ_ij c_i c_j (e_i⊗e_i⊗e_j + e_i⊗e_j⊗e_i + e_j⊗e_i⊗e_i)
    cc = np.einsum("i,j->ij", c, c)
    corr = (np.einsum("ij,ia,ib,jc->abc", cc, I, I, I)
            + np.einsum("ij,ia,jb,ic->abc", cc, I, I, I)
            + np.einsum("ij,ja,ib,ic->abc", cc, I, I, I))
    diag3 = np.einsum("i,ia,ib,ic->abc", c, I, I, I)
    return (T - corr + 2 * diag3) / (l * (l - 1) * (l - 2))


def empirical_moments(counts: np.ndarray, weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Weighted averages of m1, e2, e3 over documents (rows of a dense (n, d) array)."""
    counts = np.asarray(counts, dtype=np.float64)
    n, d = counts.shape
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    M1 = np.zeros(d)
    E2 = np.zeros((d, d))
    E3 = np.zeros((d, d, d))
    for c, wi in zip(counts, w):
        M1 += wi * c / c.sum()
        E2 += wi * doc_e2(c)
        E3 += wi * doc_e3(c)
    W = w.sum()
    return {"M1": M1 / W, "E2": E2 / W, "E3": E3 / W, "weight": W}


def lda_moments(M1: np.ndarray, E2: np.ndarray, E3: np.ndarray, alpha0: float):
    """M2, M3 from the empirical averages (DESIGN §2)."""
    a, b, c = lda_coefficients(alpha0)
    M2 = E2 - a * np.outer(M1, M1)
    pair = (np.einsum("ij,k->ijk", E2, M1) + np.einsum("ik,j->ijk", E2, M1)
            + np.einsum("jk,i->ijk", E2, M1))
    M3 = E3 - b * pair + c * np.einsum("i,j,k->ijk", M1, M1, M1)
    return M2, M3


def population_moments(topics: np.ndarray, alpha: np.ndarray):
    """Exact M2, M3 of an LDA model: topics (k, d) rows on the simplex, alpha (k,)."""
    a0 = alpha.sum()
    w2 = alpha / (a0 * (a0 + 1))
    w3 = 2 * alpha / (a0 * (a0 + 1) * (a0 + 2))
    M2 = np.einsum("t,ti,tj->ij", w2, topics, topics)
    M3 = np.einsum("t,ti,tj,tk->ijk", w3, topics, topics, topics)
    return M2, M3


def whiten3(T: np.ndarray, A: np.ndarray) -> np.ndarray:
    """T(A, A, A) for T (d,d,d), A (d, m)."""
    return np.einsum("ijk,ia,jb,kc->abc", T, A, A, A, optimize=True)
