"""A private clustering start in the public warm-up subspace (issue 22, DESIGN §9).

At 20–50k stream documents the private tensor start is noise, and refinement cannot repair a
bad start. This start needs k′×k noisy sums per iteration instead of a k′³ tensor:

1. every stream document c is projected into the public subspace Q (d × k′, released by the
   warm-up): y = clip₁(Qᵀ c/‖c‖₂), a k′-vector of norm ≤ 1;
2. Lloyd iterations: each document is assigned to one of k clusters by a rule of y and of
   *released* values only, and the per-cluster sums S_j = Σ y (k × k′) and counts n_j (k) are
   released with Gaussian noise. Iteration 1 assigns by public random directions
   (argmax_j y·g_j, g from the public seed); later iterations by the centred cosine
   argmax_j (y − μ)·(S_j/n_j − μ)/‖·‖, μ = Σ_j S_j / Σ_j n_j of the previous iteration;
3. one mapping pass: each document, assigned by the last released centres, adds c/‖c‖₂ to its
   cluster's row of a k × d sum — a refinement sum (:mod:`streamdp.refinement`) whose
   responsibilities are one-hot — released once and denoised like any refinement sum.

The default refinement passes then start from the mapped topics.

Sensitivity (docs/privacy.md, "The clustering start"). Under add/remove of one document x,
the assignment of every *other* document is unchanged (it reads that document and released
values only), so each released sum changes by x's own term: S by y_x in one row (‖y_x‖ ≤ 1,
enforced by the clip on the computed vector), the counts by 1 in one entry, the mapping sum by
c/‖c‖₂ in one row (norm exactly 1, rescaled if rounding makes it larger). The sensitivities
are :func:`streamdp.privacy.sensitivity.block_sensitivities`' ``cluster_sums``, ``cluster_counts`` and
``topic_word`` (clip 1 plus the float64 rounding headroom of a sum of ≤ N_max documents:
chunk products of ≤ BATCH_ROWS_MAX rows, chunks added compensated). Choosing the next
assignment from released values is adaptive composition (zCDP composes).

Pure numerics: no Kafka, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp

from streamdp.documents import as_count_batch
from streamdp.privacy import rounding
from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.events import STREAM, GaussianEvent, sigma_for_rho
from streamdp.privacy.sensitivity import block_sensitivities

SUMS_BLOCK = "cluster_sums"
COUNTS_BLOCK = "cluster_counts"
#: rows per chunk product of the cluster sums (the rounding analysis' BATCH_ROWS_MAX)
CHUNK = rounding.BATCH_ROWS_MAX


@dataclass(frozen=True)
class ClusterStartConfig:
    """The clustering start's public choices (measured defaults: docs/estimator.md).

    iterations : int       Lloyd iterations (each releases k×k′ sums and k counts)
    lloyd_share : float    share of the start's ρ spent on the iterations (split evenly); the
                           mapping pass gets the rest
    count_share : float    share of each iteration's ρ spent on the counts
    """

    iterations: int = 4
    lloyd_share: float = 0.5
    count_share: float = 0.2

    def __post_init__(self) -> None:
        if isinstance(self.iterations, bool) or not isinstance(self.iterations, int) \
                or self.iterations < 1:
            raise ValueError(f"cluster start iterations must be an integer >= 1, got {self.iterations!r}")
        for name in ("lloyd_share", "count_share"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (0 < v < 1):
                raise ValueError(f"cluster start {name} must be in (0, 1), got {v!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def cluster_sensitivities(max_documents: int = rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM) -> dict:
    """Δ of the cluster sums and counts (the one place: privacy.sensitivity.block_sensitivities)."""
    s = block_sensitivities(ClipBounds.unclipped(), max_documents=max_documents)
    return {SUMS_BLOCK: s[SUMS_BLOCK], COUNTS_BLOCK: s[COUNTS_BLOCK]}


def plan_iteration(rho: float, count_share: float, *, partition: str = STREAM,
                   max_documents: int = rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM) -> list[GaussianEvent]:
    """The two Gaussian events of one Lloyd iteration at total zCDP cost ``rho``."""
    if not (rho > 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    sens = cluster_sensitivities(max_documents)
    r_counts = rho * count_share
    return [GaussianEvent(SUMS_BLOCK, sens[SUMS_BLOCK], sigma_for_rho(sens[SUMS_BLOCK], rho - r_counts),
                          partition=partition, mechanism="cluster"),
            GaussianEvent(COUNTS_BLOCK, sens[COUNTS_BLOCK], sigma_for_rho(sens[COUNTS_BLOCK], r_counts),
                          partition=partition, mechanism="cluster")]


# ------------------------------------------------------------------------ per document
def project(X: sp.csr_matrix, Q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """y = clip₁(Qᵀ c/‖c‖₂) for every row (each row from that row and Q alone), and a mask of
    the non-empty rows. The clip acts on the *computed* vector, so ‖y‖ ≤ 1 holds exactly."""
    X = as_count_batch(X, Q.shape[0])
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    nonempty = norms > 0
    Xn = sp.diags(np.where(nonempty, 1.0 / np.where(nonempty, norms, 1.0), 0.0)) @ X
    Y = np.asarray(Xn @ Q)
    yn = np.sqrt(np.einsum("ij,ij->i", Y, Y))
    over = yn > 1.0
    if over.any():
        Y[over] /= yn[over, None]
    return Y, nonempty


@dataclass(frozen=True, eq=False)
class Assignment:
    """A public assignment rule: argmax_j (y − mean)·D_j with D_j unit directions (k × k′)."""

    directions: np.ndarray
    mean: np.ndarray

    @classmethod
    def random(cls, k: int, k_prime: int, seed: int) -> "Assignment":
        """Iteration 1: public random directions (the seed is public), no centring."""
        G = np.random.default_rng([int(seed), 0x5EED]).standard_normal((k, k_prime))
        return cls(G / np.linalg.norm(G, axis=1, keepdims=True), np.zeros(k_prime))

    @classmethod
    def from_released(cls, sums: np.ndarray, counts: np.ndarray,
                      previous: "Assignment | None" = None) -> "Assignment":
        """From released (noised) sums and counts: centres S_j/n_j, mean ΣS/Σn, directions the
        centred centres normalised. A cluster whose noised count is below 1 keeps its previous
        direction (its centre would be noise over a near-zero count). Post-processing only."""
        sums, counts = np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)
        total = max(float(counts.sum()), 1.0)
        mean = sums.sum(axis=0) / total
        D = sums / np.maximum(counts, 1.0)[:, None] - mean[None, :]
        norms = np.linalg.norm(D, axis=1)
        ok = (counts >= 1.0) & (norms > 0)
        out = np.zeros_like(D)
        out[ok] = D[ok] / norms[ok, None]
        if previous is not None:
            out[~ok] = previous.directions[~ok]
        return cls(out, mean)

    def labels(self, Y: np.ndarray) -> np.ndarray:
        return np.argmax((Y - self.mean[None, :]) @ self.directions.T, axis=1)


def cluster_sums(batches, Q: np.ndarray, rule: Assignment) -> tuple[np.ndarray, np.ndarray, int]:
    """Σ y per cluster (k × k′), the counts (k) and the number of non-empty documents of a
    sequence of count batches. Chunks of ≤ CHUNK rows of the concatenated sequence (so the
    rounding does not depend on the callers' batches), chunk sums added compensated."""
    k, kp = rule.directions.shape
    S_hi, S_lo = np.zeros((k, kp)), np.zeros((k, kp))
    counts = np.zeros(k)
    n = 0
    for Xc in _chunks(batches, Q.shape[0]):
        Y, nonempty = project(Xc, Q)
        Y, lab = Y[nonempty], rule.labels(Y[nonempty])
        onehot = sp.csr_matrix((np.ones(lab.size), (lab, np.arange(lab.size))), shape=(k, lab.size))
        rounding.accumulate(S_hi, S_lo, np.asarray(onehot @ Y))
        counts += np.bincount(lab, minlength=k)         # integers: exact in float64
        n += int(lab.size)
    return rounding.collapse(S_hi, S_lo), counts, n


def _chunks(batches, d: int):
    X = sp.vstack([as_count_batch(b, d) for b in batches], format="csr")
    for a in range(0, X.shape[0], CHUNK):
        yield X[a:a + CHUNK]


class ClusterMappingModel:
    """The mapping pass as a refinement model: one-hot responsibilities from the assignment.

    :class:`streamdp.refinement.RefinementSketch` sums its ``document_terms``: document c adds
    c/‖c‖₂ to the row of its cluster (Frobenius norm 1 — the refinement's sensitivity)."""

    def __init__(self, Q: np.ndarray, rule: Assignment) -> None:
        self.Q, self.rule = np.asarray(Q, dtype=np.float64), rule

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rule.directions.shape[0], self.Q.shape[0])

    def document_terms(self, Xb: sp.csr_matrix) -> tuple[np.ndarray, int]:
        k = self.shape[0]
        if Xb.nnz == 0:
            return np.zeros((0, k)), 0
        Y, nonempty = project(Xb, self.Q)
        lab = self.rule.labels(Y)
        counts_per_row = np.diff(Xb.indptr)
        rows = np.repeat(np.arange(Xb.shape[0]), counts_per_row)
        norms = np.sqrt(np.add.reduceat(Xb.data * Xb.data, Xb.indptr[:-1][counts_per_row > 0]))
        row_norm = np.ones(Xb.shape[0])
        row_norm[counts_per_row > 0] = norms
        vals = np.zeros((Xb.nnz, k))
        v = Xb.data / row_norm[rows]
        # floating-point guard: a document whose computed norm exceeds 1 is scaled to 1
        fro = np.sqrt(np.bincount(rows, weights=v * v, minlength=Xb.shape[0]))
        v = v / np.maximum(fro, 1.0)[rows]
        vals[np.arange(Xb.nnz), lab[rows]] = v
        return vals, int(nonempty.sum())
