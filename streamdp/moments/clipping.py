"""Per-document norm bounds and clipping factors.

Every block a document contributes to is scaled by one factor
``scale = min(1, C_m1/‖m1‖, C_z/U_z, C_s3/U_s3)`` where each ``U`` is an upper bound
on the block's Frobenius norm. Hence every block's contribution has norm at
most its clip bound ``C_b`` — that is the L2 sensitivity of the block sum under
adding or removing one document — and all blocks of one document carry the *same*
weight, so the released sums stay one consistent weighted average (the moment
identities M2 = E2 − a M1⊗M1 etc. hold for weighted averages too).

Why upper bounds and not exact norms: the exact Frobenius norm of s3 needs the
Gram matrix of the document's word rows of Q (O(nnz²·k') per document). Scaling
by any upper bound of the norm still bounds the sensitivity; it only clips a
little more. The bounds used (proofs in docs/privacy.md):

* ``‖m1‖ = ‖c‖₂ / l`` (exact) and ``‖s1‖ = ‖Qᵀc‖/l ≤ ‖m1‖``.
* ``‖z‖² = Σ_i c_i² ‖y − q_i‖² / (l(l−1))²`` (exact, O(nnz·k')) and
  ``‖s2‖ = ‖Qᵀ z‖ ≤ ‖z‖``.
* ``‖s3‖ ≤ min(‖e3‖_F, (‖y‖³ + 3‖y‖Σ c_i‖q_i‖² + 2Σ c_i‖q_i‖³)/(l(l−1)(l−2)))``:
  the first because s3 = e3(Q,Q,Q) and Q has orthonormal columns (a contraction),
  the second by the triangle inequality; ``‖e3‖_F`` has a closed form in the
  power sums of c (O(nnz)).

Every block's norm is at most 1 for every document (m1: ‖c‖₂ ≤ ‖c‖₁ = l;
e2, e3: non-negative entries summing to one), so bounds ≥ 1 never clip.
"""
from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np
import scipy.sparse as sp

from streamdp.privacy.rounding import CLIP_HEADROOM, gamma

# Floating-point headroom: the norm expansions below can undershoot the true norm
# by a few ulps; inflating them by this factor keeps the enforced bound a bound.
_NORM_HEADROOM = 1.0 + CLIP_HEADROOM

# Warm-up bound that scales every realistic document (‖e2 Ω‖ ≥ 1e-6 needs a
# vocabulary of ~10^12 words) to the same norm.
WARMUP_NORMALISING_CLIP = 1e-6


@dataclass(frozen=True)
class ClipBounds:
    """Public per-block Frobenius-norm bounds C_b (= L2 sensitivities).

    Attributes
    ----------
    m1 : float   bound for c/l (and s1 = Qᵀc/l)
    z : float    bound for e2·Q (and s2 = Qᵀe2Q)
    s3 : float   bound for e3(Q,Q,Q)
    warmup : float   bound for e2·Ω in the whitening warm-up
    """

    m1: float
    z: float
    s3: float
    warmup: float

    def __post_init__(self) -> None:
        for name in ("m1", "z", "s3", "warmup"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"clip bound {name!r} must be a finite number > 0, got {v!r}")

    @classmethod
    def for_length(cls, reference_length: float, warmup: float = WARMUP_NORMALISING_CLIP) -> "ClipBounds":
        """Stream bounds equal to the norms of a document of ``reference_length``
        distinct words: such documents, and longer ones without heavy repetition,
        are never clipped. ``reference_length`` is public configuration (a
        typical document length), never measured on the private data.

        The warm-up bound defaults to :data:`WARMUP_NORMALISING_CLIP`, small enough
        that every warm-up document is scaled to the same norm. The range finder
        only needs span(E2), which per-document weights do not change, and once
        every document is clipped the signal-to-noise ratio no longer depends on
        the bound (signal N·C_w, noise ∝ C_w) — so clipping everything is free
        (measured: docs/benchmarks.md)."""
        L = float(reference_length)
        if not (math.isfinite(L) and L >= 3):
            raise ValueError(f"clip reference length must be >= 3, got {reference_length!r}")
        return cls(m1=1.0 / math.sqrt(L), z=1.0 / math.sqrt(L * (L - 1)),
                   s3=1.0 / math.sqrt(L * (L - 1) * (L - 2)), warmup=warmup)

    @classmethod
    def unclipped(cls) -> "ClipBounds":
        """Bounds of 1: no document is ever scaled (every block norm is ≤ 1)."""
        return cls(m1=1.0, z=1.0, s3=1.0, warmup=1.0)

    def to_dict(self) -> dict[str, float]:
        return {"m1": self.m1, "z": self.z, "s3": self.s3, "warmup": self.warmup}

    @classmethod
    def from_dict(cls, d: dict) -> "ClipBounds":
        return cls(m1=float(d["m1"]), z=float(d["z"]), s3=float(d["s3"]), warmup=float(d["warmup"]))


def row_sums(X: sp.csr_matrix, values: np.ndarray) -> np.ndarray:
    """Per-row sums of ``values`` (aligned with X.data). Rows must be non-empty."""
    return np.add.reduceat(values, X.indptr[:-1]) if values.size else np.zeros(X.shape[0])


def power_sums(X: sp.csr_matrix, powers=(2, 4, 6)) -> dict[int, np.ndarray]:
    # even powers by multiplication (faster than the float pow; this runs per chunk): exact
    # for counts below 2^(53/p), ≤ 3 roundings otherwise (the callers' headroom counts 10)
    c = X.data
    c2 = c * c
    pw = {2: c2}
    if any(p > 2 for p in powers):
        pw[4] = c2 * c2
        pw[6] = pw[4] * c2
    return {p: row_sums(X, pw[p] if p in pw else c**p) for p in powers}


def _squared(X: sp.csr_matrix) -> sp.csr_matrix:
    """X with its entries squared (shares X's index arrays: no copy of the structure)."""
    return sp.csr_matrix((X.data * X.data, X.indices, X.indptr), shape=X.shape)


def e2_norm(X: sp.csr_matrix, lengths: np.ndarray) -> np.ndarray:
    """Exact ‖e2‖_F per document (closed form in power sums)."""
    c = X.data
    p = power_sums(X, (2, 4))
    diag = row_sums(X, (c * (c - 1)) ** 2)
    sq = p[2] ** 2 - p[4] + diag
    return np.sqrt(np.maximum(sq, 0.0)) / (lengths * (lengths - 1))


def e3_norm(X: sp.csr_matrix, lengths: np.ndarray) -> np.ndarray:
    """Exact ‖e3‖_F per document.

    The unnormalised e3 has entries c_i(c_j − [i=j])(c_k − [k=i] − [k=j]) (ordered
    triples of distinct token positions), so its squared norm splits into
    all-distinct, exactly-two-equal (three patterns) and all-equal index triples.
    """
    c = X.data
    p = power_sums(X, (2, 4, 6))
    u = (c * (c - 1)) ** 2
    distinct = p[2] ** 3 - 3 * p[2] * p[4] + 2 * p[6]
    pairs = 3 * (row_sums(X, u) * p[2] - row_sums(X, u * c**2))
    same = row_sums(X, (c * (c - 1) * (c - 2)) ** 2)
    sq = distinct + pairs + same
    # the expansion cancels (p2³ − 3p2p4 + 2p6): add its worst-case rounding error (every
    # term passes ≤ nnz + 10 ≤ d + 10 roundings) so the result stays an upper bound
    magnitude = (p[2] ** 3 + 3 * p[2] * p[4] + 2 * p[6]
                 + 3 * (row_sums(X, u) * p[2] + row_sums(X, u * c**2)) + same)
    sq = np.maximum(sq, 0.0) + gamma(X.shape[1] + 10) * magnitude
    return np.sqrt(sq) / (lengths * (lengths - 1) * (lengths - 2))


def projected_e2_norm(X: sp.csr_matrix, lengths: np.ndarray, Y: np.ndarray,
                      P: np.ndarray, row_norm2: np.ndarray) -> np.ndarray:
    """Exact ‖e2·P‖_F per document for any d×k' matrix P.

    ``Y = X P`` and ``row_norm2[i] = ‖P_i‖²``. Row i of the unnormalised e2·P is
    c_i (y − p_i), so the squared norm is Σ c_i² (‖y‖² − 2 p_i·y + ‖p_i‖²).
    """
    X2 = _squared(X)
    yy = np.einsum("ij,ij->i", Y, Y)
    cross = np.einsum("ij,ij->i", X2 @ P, Y)
    p2 = np.asarray(X2.sum(axis=1)).ravel()
    sq = p2 * yy - 2.0 * cross + X2 @ row_norm2
    # the expansion cancels when y ≈ p_i: add its worst-case rounding error (|p_i·y| ≤
    # ‖p_i‖‖y‖; every term passes ≤ d + k' + 8 roundings) so the result stays an upper bound
    magnitude = p2 * yy + 2.0 * np.sqrt(yy) * (X2 @ np.sqrt(row_norm2)) + X2 @ row_norm2
    sq = np.maximum(sq, 0.0) + gamma(X.shape[1] + Y.shape[1] + 8) * magnitude
    return np.sqrt(sq) / (lengths * (lengths - 1))


def projected_e2_magnitude(X: sp.csr_matrix, lengths: np.ndarray, Y: np.ndarray,
                           row_norm2: np.ndarray) -> np.ndarray:
    """Pre-cancellation magnitude of e2·P per document (P = Q or Ω, Y = X P).

    The accumulators hold c yᵀ/(l(l−1)) and diag(c) P/(l(l−1)) separately (their difference is
    e2·P, formed at read time), so rounding scales with the Frobenius norm of the entrywise
    absolute terms: ≤ (‖c‖‖y‖ + √(Σ c_i²‖p_i‖²)) / (l(l−1)) ≤ (l+1)/(l−1) ≤ 2.
    """
    X2 = _squared(X)
    ynorm = np.sqrt(np.einsum("ij,ij->i", Y, Y))
    return (np.sqrt(row_sums(X, X.data**2)) * ynorm + np.sqrt(X2 @ row_norm2)) / (
        lengths * (lengths - 1))


def scale_factor(norms: dict[str, np.ndarray], bounds: dict[str, float]) -> np.ndarray:
    """min(1, min_b C_b / (U_b · headroom)) per document."""
    scale = None
    for name, U in norms.items():
        U = U * _NORM_HEADROOM
        with np.errstate(divide="ignore"):
            s = np.where(U > 0, bounds[name] / np.where(U > 0, U, 1.0), np.inf)
        scale = s if scale is None else np.minimum(scale, s)
    return np.minimum(scale, 1.0)
