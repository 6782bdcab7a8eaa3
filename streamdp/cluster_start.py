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
from streamdp.refinement import plan_refinement

SUMS_BLOCK = "cluster_sums"
COUNTS_BLOCK = "cluster_counts"
MOMENT_BLOCK = "cluster_moment"
#: share of the centre draw's ρ (after its count) spent on the second moment Σ y yᵀ
MOMENT_SHARE = 2.0 / 3.0
#: a few directions dominate the centred cloud when one of the top k // 4 eigenvalues is this
#: many times the next (measured on the released covariance: the movie reviews' gap after its
#: two review-site directions is 25–86× at ε = 4; Debian's largest among its top 5 is ≤ 2×)
DOMINANCE_GAP = 4.0
#: smallest whitening eigenvalue, relative to the largest (a direction of no variance is not
#: blown up without bound)
WHITEN_FLOOR = 1e-3
#: the summand's radius, in root-mean-square norms of the centred, whitened documents (from the
#: released covariance): a document nearer the centre than RADIUS_RMS × that norm adds
#: (y − μ)·frame / radius, shorter than 1, instead of a unit vector. Generic documents (only the
#: corpus background, near the centre) then weigh less in the centres than distinctive ones;
#: as unit vectors their arbitrary directions blended small subjects into one cluster (Debian
#: ε = 4, 3 seeds: NPMI 0.089 -> 0.107). Measured on seeds 0-2 of Debian and the movie reviews
#: at 1.5 (docs/benchmarks.md, "The summand radius"). This is the radius at high noise ...
RADIUS_RMS = 1.5
#: ... and this one when the released covariance says the noise is small (its noise-to-signal,
#: the noise's spectral norm over the largest eigenvalue, at most NOISE_TO_SIGNAL_SMALL). A
#: larger radius shortens more summands, so the Lloyd sums carry less mass above the same
#: noise: worth it only when the noise is small (docs/benchmarks.md, "The radius by released
#: noise-to-signal": Debian ε = 4 noise-to-signal 0.12, movie reviews 0.19; ε = 1: 0.51, 0.72)
RADIUS_RMS_LOW_NOISE = 2.0
NOISE_TO_SIGNAL_SMALL = 0.3
#: rows per chunk product of the cluster sums (the rounding analysis' BATCH_ROWS_MAX)
CHUNK = rounding.BATCH_ROWS_MAX


@dataclass(frozen=True)
class ClusterStartConfig:
    """The clustering start's public choices (measured defaults: docs/estimator.md).

    iterations : int       Lloyd iterations (each releases k×k′ sums and k counts)
    lloyd_share : float    share of the start's ρ spent on the iterations (split evenly); the
                           mapping pass gets the rest
    count_share : float    share of each iteration's ρ spent on the counts
    centre_share : float   share of the iterations' ρ spent first on the centre draw (Σy and
                           n over all documents, from which documents enter the Lloyd sums
                           centred and of unit norm: :meth:`Assignment.summand`); 0 = none
    """

    iterations: int = 4
    lloyd_share: float = 0.5
    count_share: float = 0.2
    centre_share: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.iterations, bool) or not isinstance(self.iterations, int) \
                or self.iterations < 1:
            raise ValueError(f"cluster start iterations must be an integer >= 1, got {self.iterations!r}")
        for name in ("lloyd_share", "count_share"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (0 < v < 1):
                raise ValueError(f"cluster start {name} must be in (0, 1), got {v!r}")
        v = self.centre_share
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v < 1):
            raise ValueError(f"cluster start centre_share must be in [0, 1), got {v!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def cluster_sensitivities(max_documents: int = rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM) -> dict:
    """Δ of the cluster sums, counts and second moment (the one place:
    privacy.sensitivity.block_sensitivities)."""
    s = block_sensitivities(ClipBounds.unclipped(), max_documents=max_documents)
    return {b: s[b] for b in (SUMS_BLOCK, COUNTS_BLOCK, MOMENT_BLOCK)}


def plan_centre(rho: float, count_share: float, *, partition: str = STREAM,
                max_documents: int = rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM) -> list[GaussianEvent]:
    """The three Gaussian events of the centre draw (Σy, n, Σ y yᵀ) at total zCDP cost ``rho``."""
    if not (rho > 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    sens = cluster_sensitivities(max_documents)
    r_counts = rho * count_share
    r_moment = (rho - r_counts) * MOMENT_SHARE
    r_sums = rho - r_counts - r_moment
    return [GaussianEvent(b, sens[b], sigma_for_rho(sens[b], r), partition=partition,
                          mechanism="cluster")
            for b, r in ((SUMS_BLOCK, r_sums), (COUNTS_BLOCK, r_counts), (MOMENT_BLOCK, r_moment))]


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


@dataclass(frozen=True)
class StartPlan:
    """Every draw of the clustering start after its premise check, planned before the first:
    the centre draw's events (empty: ``centre_share`` 0), each Lloyd iteration's, the
    mapping pass's. The estimator draws exactly these, in this order, and has the accountant
    admit them all before its first draw (a refusal then comes before any draw)."""

    centre: tuple[GaussianEvent, ...]
    iterations: tuple[tuple[GaussianEvent, ...], ...]
    mapping: GaussianEvent

    def draws(self) -> list[tuple[str, tuple[GaussianEvent, ...]]]:
        """(kind of draw — ``cluster`` or ``cluster-map`` —, its events), in drawing order."""
        return ([("cluster", self.centre)] if self.centre else []) \
            + [("cluster", it) for it in self.iterations] + [("cluster-map", (self.mapping,))]


def plan_start(rho: float, cfg: ClusterStartConfig, *,
               max_documents: int = rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM) -> StartPlan:
    """The start's draws at total zCDP cost ``rho`` (what is left after its premise check):
    ``lloyd_share`` of it on the centre draw (``centre_share`` of that) and the iterations
    (split evenly), the rest on the mapping pass."""
    lloyd_rho = rho * cfg.lloyd_share
    centre = (tuple(plan_centre(lloyd_rho * cfg.centre_share, cfg.count_share,
                                max_documents=max_documents)) if cfg.centre_share > 0 else ())
    it_rho = lloyd_rho * (1.0 - cfg.centre_share) / cfg.iterations
    iteration = tuple(plan_iteration(it_rho, cfg.count_share, max_documents=max_documents))
    mapping = plan_refinement(rho * (1.0 - cfg.lloyd_share), partition=STREAM,
                              mechanism="cluster", max_documents=max_documents)
    return StartPlan(centre, (iteration,) * cfg.iterations, mapping)


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
    """A public assignment rule: argmax_j (u(y) − mean)·D_j with D_j unit directions (k × k′).

    ``centre`` (k′,) and ``frame`` (k′ × k′), from the centre draw (:func:`centred_frame`), or
    None: the vector a document adds to its cluster's sum is u(y) = v/max(‖v‖, radius) with
    v = (y − centre)·frame — centred, whitened and of norm ≤ 1 (unit beyond the radius; radius
    0: always unit; :data:`RADIUS_RMS`): the shared corpus direction
    (most of ‖y‖) is removed, the few directions of largest variance (on the movie reviews:
    the review site's style) no longer decide every assignment, and the clip radius 1 is spent
    on what tells documents apart. Without a centre u(y) = y."""

    directions: np.ndarray
    mean: np.ndarray
    centre: np.ndarray | None = None
    frame: np.ndarray | None = None
    radius: float = 0.0

    @classmethod
    def random(cls, k: int, k_prime: int, seed: int, centre: np.ndarray | None = None,
               frame: np.ndarray | None = None, radius: float = 0.0) -> "Assignment":
        """Iteration 1: public random directions (the seed is public), no centring of u."""
        r = k_prime if frame is None else frame.shape[1]
        G = np.random.default_rng([int(seed), 0x5EED]).standard_normal((k, r))
        return cls(G / np.linalg.norm(G, axis=1, keepdims=True), np.zeros(r), centre, frame,
                   radius)

    @classmethod
    def from_released(cls, sums: np.ndarray, counts: np.ndarray,
                      previous: "Assignment | None" = None) -> "Assignment":
        """From released (noised) sums and counts: centres S_j/n_j, mean ΣS/Σn, directions the
        centred centres normalised. A cluster whose noised count is below 1 keeps its previous
        direction (its centre would be noise over a near-zero count). The centre is kept from
        ``previous``. Post-processing only."""
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
        if previous is None:
            return cls(out, mean)
        return cls(out, mean, previous.centre, previous.frame, previous.radius)

    def summand(self, Y: np.ndarray) -> np.ndarray:
        """What each document adds to its cluster's sum: u(y), norm ≤ 1 on the computed value
        (v/max(‖v‖, radius); radius 0: v/‖v‖)."""
        if self.centre is None:
            return Y
        U = Y - self.centre[None, :]
        if self.frame is not None:
            U = U @ self.frame
        un = np.sqrt(np.einsum("ij,ij->i", U, U))
        # a document exactly at the centre adds 0; the max(·, 1) guard keeps ‖u‖ ≤ 1 under rounding
        U = U / np.where(un > 0, np.maximum(un, self.radius), 1.0)[:, None]
        un = np.sqrt(np.einsum("ij,ij->i", U, U))
        return U / np.maximum(un, 1.0)[:, None]

    def labels(self, Y: np.ndarray) -> np.ndarray:
        return np.argmax((self.summand(Y) - self.mean[None, :]) @ self.directions.T, axis=1)


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
        Y = Y[nonempty]
        lab = rule.labels(Y)
        Y = rule.summand(Y)
        onehot = sp.csr_matrix((np.ones(lab.size), (lab, np.arange(lab.size))), shape=(k, lab.size))
        rounding.accumulate(S_hi, S_lo, np.asarray(onehot @ Y))
        counts += np.bincount(lab, minlength=k)         # integers: exact in float64
        n += int(lab.size)
    return rounding.collapse(S_hi, S_lo), counts, n


def centre_sums(batches, Q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The centre draw's sums over every non-empty document: Σy (1 × k′), the count (1) and
    Σ y yᵀ (k′ × k′); chunked and compensated as :func:`cluster_sums`. ‖y yᵀ‖_F = ‖y‖² ≤ 1."""
    kp = Q.shape[1]
    S_hi, S_lo = np.zeros((1, kp)), np.zeros((1, kp))
    M_hi, M_lo = np.zeros((kp, kp)), np.zeros((kp, kp))
    n = 0
    for Xc in _chunks(batches, Q.shape[0]):
        Y, nonempty = project(Xc, Q)
        Y = Y[nonempty]
        rounding.accumulate(S_hi, S_lo, Y.sum(axis=0, keepdims=True))
        rounding.accumulate(M_hi, M_lo, Y.T @ Y)
        n += int(Y.shape[0])
    return rounding.collapse(S_hi, S_lo), np.array([float(n)]), rounding.collapse(M_hi, M_lo), n


def centred_frame(sums: np.ndarray, counts: np.ndarray, moment: np.ndarray,
                  moment_sd: float = 0.0, n_clusters: int | None = None, *,
                  with_radius: bool = False):
    """The centre μ = Σy/n and the whitening frame V Λ^{-1/2} of the covariance
    C = Σ y yᵀ/n − μμᵀ, from the centre draw's released values (post-processing only).

    Only a few dominant directions are equalised (a shared style: on the movie reviews two
    directions, the review site's, carry 80% of the variance and would decide every
    assignment): when one of the top max(1, k // 4) eigenvalues is DOMINANCE_GAP times the
    next, the directions above the gap are scaled down to the next one's level;
    directions below keep their scale, so sampling noise is not blown up, and a corpus whose
    variance decays smoothly (Debian) is left as it is. Eigenvalues are first read as a
    spiked model: those above the noise's spectral norm
    (≈ σ√(2k′)/n after symmetrising) are kept; the others, which the noise decides one by one,
    are all set to their mean (trace(C) minus the kept ones, over their number — the trace's
    noise is only ≈ σ√k′/n), so that subspace is scaled as a whole and its noisy eigenvectors
    do not matter. No eigenvalue goes below WHITEN_FLOOR × the largest.

    With ``with_radius``, also the summand radius: :func:`radius_rms` (of the released
    noise-to-signal) × the root-mean-square norm of the centred, whitened documents that this
    spectrum implies (√Σ rest_i/λ_i)."""
    n = max(float(np.asarray(counts).ravel()[0]), 1.0)
    mu = np.asarray(sums, dtype=np.float64).ravel() / n
    M = np.asarray(moment, dtype=np.float64)
    C = (M + M.T) / (2.0 * n) - np.outer(mu, mu)
    lam, V = np.linalg.eigh(C)
    kp = lam.size
    noise = float(moment_sd) * math.sqrt(2.0 * kp) / n
    spike = lam > noise
    top = max(float(lam.max()), 1e-300)
    if spike.all():
        rest = lam
    else:
        level = max(float(np.trace(C)) - float(lam[spike].sum()), 0.0) / int((~spike).sum())
        rest = np.where(spike, lam, level)
    floor = top                     # no dominance: every direction keeps its scale (u is unit norm)
    if n_clusters is not None:
        # a few directions dominate when one of the top max(1, k // 4) eigenvalues is
        # DOMINANCE_GAP times the next: those are scaled down to the next one's level
        m = min(max(1, n_clusters // 4), kp - 1)
        srt = np.sort(rest)[::-1]
        gaps = srt[:m] / np.maximum(srt[1:m + 1], 1e-300)
        i = int(np.argmax(gaps))
        if gaps[i] >= DOMINANCE_GAP:
            floor = float(srt[i + 1])
    lam = np.maximum(rest, max(floor, WHITEN_FLOOR * top))
    frame = V / np.sqrt(lam)[None, :]
    if not with_radius:
        return mu, frame
    rms = math.sqrt(max(float(np.sum(np.maximum(rest, 0.0) / lam)), 0.0))
    return mu, frame, radius_rms(noise / top) * rms


def radius_rms(noise_to_signal: float) -> float:
    """The summand radius in root-mean-square norms, from the centre draw's released
    noise-to-signal (the noise's spectral norm over the covariance's largest eigenvalue; 0
    without noise): :data:`RADIUS_RMS_LOW_NOISE` when it is at most
    :data:`NOISE_TO_SIGNAL_SMALL`, else :data:`RADIUS_RMS`. Public rule of released values."""
    return RADIUS_RMS_LOW_NOISE if noise_to_signal <= NOISE_TO_SIGNAL_SMALL else RADIUS_RMS


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
