"""Floating-point rounding of the noised sums: the proven bound and its public premise.

Every noised sum is computed in float64. For neighbouring datasets D and D' = D + x the
*computed* sums differ by x's contribution plus a change in rounding error. With Ŝ(D) = S(D)
+ E(D), where S is the exact sum of the per-document contributions the code defines (each
with Frobenius norm ≤ C_b, enforced by clipping) and E the total rounding error,

    ‖Ŝ(D') − Ŝ(D)‖_F ≤ C_b + ‖E(D)‖_F + ‖E(D')‖_F ≤ C_b + 2·R_b

so the Gaussian mechanism is calibrated to Δ_b = C_b·(1 + 10⁻⁹) + 2·R_b
(:func:`streamdp.privacy.sensitivity.block_sensitivities`, the only place sensitivities are formed).

The bound R_b (proof in docs/privacy.md, "Floating point")
--------------------------------------------------------------
Standard error analysis (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1, §4.3):
a sum of products evaluated in any order, each term passing through at most m roundings,
has error ≤ γ_m·Σ|terms| entrywise, γ_m = m·u/(1 − m·u), u = 2⁻⁵³. The code keeps m small
and independent of N, d and k':

* per-batch products run on at most :data:`BATCH_ROWS_MAX` documents (chunks of exactly that
  many documents of each sketch's own sequence, the partial last one pending — so the rounding
  does not depend on the callers' batches), so a sparse or BLAS product of one chunk has
  ≤ BATCH_ROWS_MAX terms per entry;
* chunks, sketch merges, partition merges and epoch/tree-node sums are added with
  error-free transformations (Knuth's TwoSum; Ogita–Rump–Oishi Sum2, double-double), whose
  error is second order: ≤ γ_{h+1}γ_h·Σ|terms| per stage, h ≤ max(N_max, d) summands;
* read-time expansions (z = Zacc − a2·Q, s1 = Qᵀm1, s2 = Qᵀz, the P/D terms of s3) run
  over at most :data:`READ_CHUNK_MAX` words per product, chunks again added compensated.

Hence every term of every released block passes through at most :data:`ROUNDING_DEPTH`
first-order roundings and ‖E‖_F ≤ (γ_DEPTH + 3γ_N²)·‖A‖_F, where A is the entrywise sum of
|terms| (the *pre-cancellation* magnitudes). By the triangle inequality over documents
‖A‖_F ≤ N·M_b with M_b the largest per-document pre-cancellation magnitude, which the clip
rule bounds (:func:`per_document_magnitude`). With N ≤ N_max (the premise):

    R_b = (γ_DEPTH + 4·γ_h²) · N_max · M_b,     h = max(N_max, VOCABULARY_MAX)

The premise
-----------
N_max (``max_documents_per_sum``) is public configuration: the largest number of documents
in any one raw sum that is ever noised. A float64 pipeline cannot avoid it (the last
rounding of a sum of N terms alone is u·|S| ∝ N). Every streamdp path decides it by a noised,
charged check instead of the exact count (streamdp.privacy.plan.PremiseCheck,
streamdp.privacy.premise; docs/privacy.md "The premise check"): continual epochs, the warm-up
and the estimator's one-shot calls. :func:`require_within_premise` refuses, before any noise is
drawn, a sum with more documents: the default of the library functions (release_topics,
noise_sums, WarmupSketch.draw_range) for a caller that has not run the check.
"""
from __future__ import annotations

import numbers

import numpy as np

#: unit roundoff of IEEE double precision (round to nearest)
UNIT_ROUNDOFF = 2.0 ** -53
#: most document rows in one sketch product (WhitenedSketch, WarmupSketch; refinement uses
#: its FOLD_IN_BLOCK ≤ this): bounds the summation length inside a batch
BATCH_ROWS_MAX = 4096
#: most words (rows of Q) in one read-time product
READ_CHUNK_MAX = 4096
#: first-order roundings any term of any released block passes through, at most: a chunk
#: product (≤ BATCH_ROWS_MAX terms + the per-document weights), a read-time product
#: (≤ READ_CHUNK_MAX terms), and ≤ 32 single roundings (weights w1..w3, products with counts,
#: collapses of compensated sums, z = Zacc − a2·Q, the s3 assembly, symmetrisation)
ROUNDING_DEPTH = BATCH_ROWS_MAX + READ_CHUNK_MAX + 32
#: the clip rule also bounds each document's pre-cancellation magnitude P_b (the Frobenius
#: norm of the absolute values of the terms it adds to an accumulator) by this × C_b; the
#: largest possible P_b of any document is 10 (s3 at length 3), so unclipped bounds (C_b = 1)
#: never clip on magnitude
MAGNITUDE_FACTOR = 10.0
#: headroom on the clipped per-document norms (the enforced bound C_b, see moments.clipping)
CLIP_HEADROOM = 1e-9
#: default premise: at most 10⁹ documents in any one noised sum
DEFAULT_MAX_DOCUMENTS_PER_SUM = 10 ** 9
#: largest accepted premise (γ_m needs m·u < 1; beyond 10¹² the inflation exceeds C_b)
MAX_DOCUMENTS_LIMIT = 10 ** 12

#: largest vocabulary the analysis covers: γ_{d+k'+8} stays below the 10⁻⁹ norm headroom, and
#: the number of read-time chunks (≤ d) stays below max(N_max, VOCABULARY_MAX)
VOCABULARY_MAX = 4_000_000

#: blocks whose per-document terms are all non-negative (no cancellation): M_b = C_b
_NON_NEGATIVE = ("count", "m1", "topic_word", "cluster_counts")
#: blocks whose per-document terms are the entries of the clipped, computed vector itself
#: (signed, but the pre-cancellation magnitude ‖|y|‖ = ‖y‖ ≤ C_b), or of its outer product
#: y yᵀ (‖|y yᵀ|‖_F = ‖y‖² ≤ C_b = 1; the product is one more rounding): M_b = C_b
_DIRECT = ("cluster_sums", "cluster_moment")


def gamma(m: int) -> float:
    """γ_m = m·u / (1 − m·u): relative error bound of m roundings (Higham Lemma 3.1)."""
    mu = m * UNIT_ROUNDOFF
    if not 0 <= mu < 1:
        raise ValueError(f"gamma({m}) undefined: m·u must be < 1")
    return mu / (1.0 - mu)


def check_max_documents(n, name: str = "max_documents_per_sum") -> int:
    """Validate the premise N_max: an integer in [1, 10¹²]."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= MAX_DOCUMENTS_LIMIT:
        raise ValueError(f"{name} must be an integer in [1, {MAX_DOCUMENTS_LIMIT:.0e}] (the most "
                         f"documents in any one noised sum), got {n!r}")
    return int(n)


def per_document_magnitude(block: str, clip_value: float) -> float:
    """M_b: the largest per-document pre-cancellation magnitude the clip rule allows.

    Non-negative blocks (count, m1, refinement topic_word) have no cancellation: M_b = C_b.
    The others (s1, z, s2, s3, warmup) are enforced by the magnitude clip at
    :data:`MAGNITUDE_FACTOR` × C_b (:mod:`streamdp.moments.clipping`).
    """
    c = float(clip_value) * (1.0 + CLIP_HEADROOM)
    return c if block in _NON_NEGATIVE + _DIRECT else MAGNITUDE_FACTOR * c


def rounding_bound(block: str, clip_value: float,
                   max_documents: int = DEFAULT_MAX_DOCUMENTS_PER_SUM) -> float:
    """R_b: bound on the Frobenius norm of the total rounding error of one computed block sum."""
    n = check_max_documents(max_documents)
    # second order: compensated stages of ≤ h summands each, h ≤ N (documents) or ≤ d (chunks)
    h = max(n, VOCABULARY_MAX)
    return (gamma(ROUNDING_DEPTH) + 4.0 * gamma(h) ** 2) * n * per_document_magnitude(block, clip_value)


def check_vocabulary(d: int) -> None:
    """The rounding analysis covers vocabularies up to VOCABULARY_MAX words."""
    if int(d) > VOCABULARY_MAX:
        raise ValueError(f"vocabulary size {d} exceeds {VOCABULARY_MAX}, the largest the float64 "
                         "rounding analysis of the sensitivities covers (docs/privacy.md)")


def sensitivity(block: str, clip_value: float,
                max_documents: int = DEFAULT_MAX_DOCUMENTS_PER_SUM) -> float:
    """Δ_b = C_b·(1 + 10⁻⁹) + 2·R_b (use through :func:`streamdp.privacy.sensitivity.block_sensitivities`)."""
    return float(clip_value) * (1.0 + CLIP_HEADROOM) + 2.0 * rounding_bound(block, clip_value,
                                                                            max_documents)


class DocumentCountExceeded(ValueError):
    """A raw sum holds more documents than the premise ``max_documents_per_sum``; nothing noised."""


def require_within_premise(n_docs: int, max_documents: int, what: str) -> None:
    """Refuse (before any noise) a raw sum of more than N_max documents.

    The exact check of the premise, for a caller of the library functions that did not run the
    noised check (streamdp.privacy.premise); streamdp's own paths never reach it.
    """
    n_max = check_max_documents(max_documents)
    if int(n_docs) > n_max:
        raise DocumentCountExceeded(
            f"{what}: the raw sum holds {int(n_docs)} documents, more than "
            f"max_documents_per_sum={n_max}, the premise its sensitivity's rounding headroom "
            "covers; nothing was noised. Set max_documents_per_sum above any sum this deployment "
            "will release (docs/privacy.md, 'Floating point'); the noise grows by a factor "
            "1 + 2R_b/C_b that is still below 2% at 10⁹ documents")


# ------------------------------------------------------------------ compensated summation
_BLOCK = 1 << 14      # elements per cache block of :func:`accumulate` (3 × 128 KiB temporaries)

def two_sum(a, b):
    """Knuth's TwoSum: s = fl(a + b) and e with a + b = s + e exactly (any magnitudes)."""
    s = a + b
    bp = s - a
    e = (a - (s - bp)) + (b - bp)
    return s, e


#: vectors at least this long take the compiled Sum2 step (:mod:`streamdp._sum2_kernel`)
_COMPILED_MIN = 1 << 12


def _sum2_kernel():
    from streamdp._sum2_kernel import sum2_inplace     # numba: imported on first use
    return sum2_inplace


def warm_compiled() -> None:
    """Load (or compile) the compiled Sum2 step now, once per process (a service pays it at
    start-up, not inside its first batch)."""
    accumulate(*np.zeros((3, _COMPILED_MIN)))


def accumulate(hi: np.ndarray, lo: np.ndarray, x) -> None:
    """Sum2 step in place: hi ← fl(hi + x), lo += the exact rounding error of that addition.

    The value represented is hi + lo (read it with :func:`collapse`); the error of any
    sequence of such steps and merges is ≤ 3·γ_n²·Σ|x| plus the final rounding.
    """
    x = np.asarray(x, dtype=np.float64)
    if not (hi.flags.c_contiguous and lo.flags.c_contiguous and x.shape == hi.shape):
        s = hi + x
        bp = s - hi
        t = s - bp
        np.subtract(hi, t, out=t)          # hi − (s − bp)
        np.subtract(x, bp, out=bp)         # x − bp
        t += bp
        lo += t
        hi[...] = s
        return
    h, l, xv = hi.reshape(-1), lo.reshape(-1), np.ascontiguousarray(x).reshape(-1)
    n = h.size
    if n >= _COMPILED_MIN and hi.dtype == lo.dtype == np.float64:
        # the same operations, element by element, in one compiled pass (bit-identical)
        _sum2_kernel()(h, l, xv)
        return
    # the same in cache-sized blocks: the temporaries stay in cache (memory traffic ≈ ⅓)
    blk = min(n, _BLOCK)
    s_buf, bp_buf, t_buf = np.empty(blk), np.empty(blk), np.empty(blk)
    for a in range(0, n, blk):
        b = min(n, a + blk)
        hs, xs = h[a:b], xv[a:b]
        s_, bp, t = s_buf[:b - a], bp_buf[:b - a], t_buf[:b - a]
        np.add(hs, xs, out=s_)
        np.subtract(s_, hs, out=bp)
        np.subtract(s_, bp, out=t)
        np.subtract(hs, t, out=t)
        np.subtract(xs, bp, out=bp)
        t += bp
        l[a:b] += t
        hs[...] = s_


def merge_into(hi: np.ndarray, lo: np.ndarray, other_hi, other_lo) -> None:
    """Add another compensated pair (hi', lo') into (hi, lo) in place."""
    accumulate(hi, lo, other_hi)
    lo += other_lo


def collapse(hi, lo):
    """The represented value hi + lo rounded once to float64."""
    return hi + lo


def accumulate_scalar(hi: float, lo: float, x: float) -> tuple[float, float]:
    s, e = two_sum(float(hi), float(x))
    return s, lo + e


def dd_add(a_hi, a_lo, b_hi, b_lo):
    """Double-double addition, renormalised: returns (hi, lo) with hi = fl(hi + lo).

    Used for values that are read directly (SketchSums, refinement sums): hi alone is the
    sum rounded once, lo the remainder carried to later additions.
    """
    s, e = two_sum(a_hi, b_hi)
    a_lo = 0.0 if a_lo is None else a_lo
    b_lo = 0.0 if b_lo is None else b_lo
    t = (a_lo + b_lo) + e
    return two_sum(s, t)


def inflation_table(clip: dict[str, float], max_documents: int) -> dict[str, float]:
    """Δ_b / C_b − 1 per block: how much more noise the rounding headroom costs."""
    return {b: sensitivity(b, c, max_documents) / c - 1.0 for b, c in clip.items()}


class RoundingNotCoveredWarning(UserWarning):
    """A private path whose float rounding the sensitivity proof does not yet bound."""


def warn_not_covered(what: str) -> None:
    """Say, once per call site, that ``what`` is outside the rounding proof (docs/privacy.md)."""
    import warnings
    warnings.warn(f"{what}: its float64 rounding is not covered by the sensitivity proof "
                  "(docs/privacy.md, 'Floating point'); use mechanism='tensor' (the default) "
                  "for the full guarantee", RoundingNotCoveredWarning, stacklevel=3)


__all__ = ["RoundingNotCoveredWarning", "warn_not_covered", "UNIT_ROUNDOFF", "BATCH_ROWS_MAX", "READ_CHUNK_MAX", "ROUNDING_DEPTH",
           "MAGNITUDE_FACTOR", "DEFAULT_MAX_DOCUMENTS_PER_SUM", "gamma", "check_max_documents",
           "per_document_magnitude", "rounding_bound", "sensitivity", "DocumentCountExceeded",
           "require_within_premise", "two_sum", "accumulate", "merge_into", "collapse",
           "accumulate_scalar", "dd_add", "inflation_table"]
