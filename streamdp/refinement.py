"""Private refinement: one EM step on top of a released (public) topic model (DESIGN §8).

Given a released model (topic-word matrix Φ, k × d, rows on the simplex, and weights α),
each document c (counts, length l) is folded in: its topic posterior θ and, for every
word w of the document, the responsibilities

    r_iw = θ_i Φ_iw / Σ_j θ_j Φ_jw            (Σ_i r_iw = 1)

are computed from Φ, α and the document alone. The released statistic is the sum over
documents of the expected topic-word counts, normalised per document:

    R_d[i, w] = c_w · r_iw / ‖c‖₂              (k × d)
    T = Σ_d R_d + N(0, σ²)^{k×d}

Sensitivity. ‖R_d‖_F² = Σ_w c_w² Σ_i r_iw² / ‖c‖² ≤ Σ_w c_w² / ‖c‖² = 1, because
Σ_i r_iw² ≤ (Σ_i r_iw)² = 1. So under add/remove of one document T changes by at most 1
in Frobenius norm, for every dataset and every public model — no data-dependent clip is
needed. The code still rescales any R_d whose computed norm exceeds 1 (floating-point
guard) and the planned event uses the sensitivity of
:func:`streamdp.privacy.sensitivity.block_sensitivities` (block ``topic_word``): 1 + 10⁻⁹ plus twice the
rounding bound of the computed sum of ≤ N_max documents (sequential sums over chunks of
REFINE_CHUNK documents of the sketch's own sequence, chunks added compensated;
:mod:`streamdp.privacy.rounding`). Φ and α may be any released values (earlier snapshots): choosing what to
compute from earlier outputs is adaptive composition, covered by zCDP's composition.

Why ‖c‖₂ and not l: the per-document weight 1/‖c‖₂ puts every document exactly at the
sensitivity bound when its words are distinct, which maximises released mass per unit of
noise; a document carries token mass l/‖c‖₂ ∈ [1, √l], so longer documents count more.

Each row T_i is topic i's expected word counts: topic identity is the model's, so topic i
of a refined release is the refinement of topic i of the model it started from.

Which model a document is folded into is :mod:`streamdp.refinement_rule`; the sums,
:mod:`streamdp.refinement_sketch`; what a refined snapshot publishes from the released sums,
:mod:`streamdp.refinement_topics`. This module re-exports their names.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp

from streamdp import serialization as ser
from streamdp.documents import as_count_batch
from streamdp.privacy import rounding
from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.events import STREAM, GaussianEvent, sigma_for_rho
from streamdp.privacy.sensitivity import block_sensitivities
from streamdp.refinement_rule import (  # noqa: F401 (re-exported)
    DEFAULT_MODEL_LAG, PUBLIC_START_EPOCH, ModelNotDecided, check_model_lag, epoch_refined,
    model_epoch_for)
from streamdp.refinement_sketch import (  # noqa: F401 (re-exported)
    FOLD_IN_BLOCK, SKETCH_VERSION, RefinementSketch, row_ids)
from streamdp.refinement_sketch import column_sum_kernel as _column_sum_kernel
from streamdp.refinement_sketch import sequential_column_sum as _sequential_column_sum
from streamdp.refinement_topics import (  # noqa: F401 (re-exported)
    background_distribution, denoise_topic_word, refined_topics, sparse_topic_word)

# the public names: this module's own, then the ones imported above that other modules and
# tests import from here (re-exports)
__all__ = ["BLOCK", "refinement_sensitivity", "SENSITIVITY", "SCHEMA_VERSION", "RefinementConfig",
           "fold_in", "RefinementModel", "topic_order", "align_topics", "FoldInModels",
           "plan_refinement", "public_start_models", "PUBLIC_START_SHARE", "DEFAULT_MODEL_LAG", "ModelNotDecided", "PUBLIC_START_EPOCH",
           "RefinementSketch", "SKETCH_VERSION", "background_distribution", "denoise_topic_word",
           "epoch_refined", "model_epoch_for", "refined_topics", "sparse_topic_word"]

BLOCK = "topic_word"


def refinement_sensitivity(max_documents: int = rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM) -> float:
    """Δ of the refinement sums: ‖R_d‖_F ≤ 1 (1 + 10⁻⁹ covers the per-document norm's rounding,
    relative error ≲ nnz·2⁻⁵²) plus twice the rounding bound of a sum of ≤ N_max documents."""
    return block_sensitivities(ClipBounds.unclipped(), max_documents=max_documents)[BLOCK]


#: the sensitivity at the default premise N_max (what :func:`plan_refinement` uses by default)
SENSITIVITY = refinement_sensitivity()
SCHEMA_VERSION = 1
#: the share of each continual node's ρ spent on the refinement sums when the chain starts from
#: a public start (the services' ``refinement_share_public`` default, the estimator's with
#: ``start=PublicStart`` and ``epochs=``): every epoch is refined from the first, and the
#: continual selection rule almost never publishes the spectral half of such a release
#: (docs/privacy.md "The public start's node plan")
PUBLIC_START_SHARE = 0.9


@dataclass(frozen=True)
class RefinementConfig:
    """How refinement runs (all public choices; measured defaults in docs/estimator.md).

    share : float        fraction of the stream ρ spent on refinement sums; the spectral
                         start gets the rest
    passes : int         one-shot path: EM passes over the stream, each releasing a new T
                         under the previous pass's model (the share split evenly)
    fold_in_iter : int   fixed-point iterations of θ per document (5: measured on Debian as good
                         as 10 — NPMI 0.076/0.043 vs 0.060/0.042 at ε = 4/1, one seed — at
                         1.5–1.8× the speed; 3 lost 0.026 at ε = 1)
    model_lag : int      continual release: L of :func:`model_epoch_for` — documents of epoch e
                         are folded into the snapshot of epoch e − L (the one-shot path ignores it)
    """

    share: float = 0.5
    passes: int = 2
    fold_in_iter: int = 5
    model_lag: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.share, bool) or not (0 < self.share < 1):
            raise ValueError(f"refinement share must be in (0, 1), got {self.share!r}")
        if isinstance(self.passes, bool) or not (isinstance(self.passes, int) and self.passes >= 1):
            raise ValueError(f"refinement passes must be an integer >= 1, got {self.passes!r}")
        if isinstance(self.fold_in_iter, bool) or not (
                isinstance(self.fold_in_iter, int) and self.fold_in_iter >= 1):
            raise ValueError(f"fold_in_iter must be an integer >= 1, got {self.fold_in_iter!r}")
        check_model_lag(self.model_lag)

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------ per document
def _segment_sum(values: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """Per-row sums of (nnz, …) values grouped by CSR ``indptr`` (empty rows → 0)."""
    n = indptr.size - 1
    out = np.zeros((n,) + values.shape[1:], dtype=values.dtype)
    nonempty = np.flatnonzero(np.diff(indptr) > 0)
    if nonempty.size:
        out[nonempty] = np.add.reduceat(values, indptr[nonempty], axis=0)
    return out


def _kernel():
    """The compiled per-document kernel (:mod:`streamdp._fold_in_kernel`), imported on first
    use so that ``import streamdp`` does not pay for numba."""
    from streamdp._fold_in_kernel import fold_in_rows
    return fold_in_rows


def _warm_kernel() -> None:
    """Load (or compile) the kernels for scipy's usual int32 CSR indices now, once per process
    (≈ 0.4 s from numba's cache, ≈ 1.5 s to compile): a service pays it when it gets its
    model, not on its first batch of documents."""
    one = np.zeros(1, dtype=np.int32)
    _kernel()(one, one[:0], np.zeros(0), np.zeros((1, 1)), np.ones(1), 1,
              np.empty((0, 1)), np.empty((0, 1)), np.ones(0), True)
    _column_sum_kernel()(np.zeros((1, 1)), one[:0], np.zeros((0, 1)))


def _fold_in_canonical(X: sp.csr_matrix, phiT: np.ndarray, alpha: np.ndarray, n_iter: int,
                       norms: np.ndarray | None = None):
    """:func:`fold_in` of a canonical CSR batch (:func:`as_count_batch`), Φᵀ C-contiguous
    float64 (d, k), α already floored. ``norms`` (n,), the rows' ‖c‖₂: ``resp`` is scaled to
    the R_d entries c_w · r_·w / ‖c‖₂ as the kernel writes it (one pass fewer)."""
    n, k = X.shape[0], phiT.shape[1]
    theta, resp = np.empty((n, k)), np.empty((X.nnz, k))
    _kernel()(X.indptr, X.indices, X.data, phiT, alpha, int(n_iter), theta, resp,
              np.ones(0) if norms is None else norms, norms is not None)
    return theta, resp


def _fold_in_alpha(alpha, k: int) -> np.ndarray:
    alpha = np.maximum(np.asarray(alpha, dtype=np.float64).ravel(), 1e-3)
    if alpha.shape[0] != k:
        raise ValueError(f"alpha has {alpha.shape[0]} entries, the model has {k} topics")
    return alpha


def fold_in(X, topic_word: np.ndarray, alpha: np.ndarray, *, n_iter: int = 10,
            topic_word_t: np.ndarray | None = None):
    """Topic posteriors and word responsibilities of each document under a fixed model.

    The EM fixed point of LDA's θ with Φ held fixed: θ ∝ α + Σ_w c_w r_·w, r_iw ∝ θ_i Φ_iw
    (α floored at 10⁻³), started at θ = α / Σα, n_iter updates of θ; ``resp`` is the last
    update's responsibilities. A word every topic gives probability 0 takes r_·w = θ.

    Compiled, one document at a time (:func:`streamdp._fold_in_kernel.fold_in_rows`,
    O(n_iter · nnz · k)): each row's results depend on that row and the model only.
    ``topic_word_t``: Φᵀ as a C-contiguous (d, k) float64 array, to reuse across batches.

    Returns
    -------
    theta : (n, k)       rows on the simplex (the prior mean for empty documents)
    resp : (nnz, k)      responsibilities of every stored entry of X, rows sum to 1
    """
    X = as_count_batch(X, topic_word.shape[1])
    k = topic_word.shape[0]
    alpha = _fold_in_alpha(alpha, k)
    if topic_word_t is None:
        phiT = np.ascontiguousarray(topic_word.T, dtype=np.float64)
    else:
        phiT = np.ascontiguousarray(topic_word_t, dtype=np.float64)
        if phiT.shape != (topic_word.shape[1], k):
            raise ValueError(f"topic_word_t has shape {phiT.shape}, expected {(topic_word.shape[1], k)}")
    return _fold_in_canonical(X, phiT, alpha, n_iter)


@dataclass(frozen=True, eq=False)
class RefinementModel:
    """The public model documents are folded into: a released snapshot's topics and α.

    For a refined snapshot that is its ``fold_in_topics`` (sharper than ``topic_word``);
    for a spectral one its ``topic_word``. Any released values give the same sensitivity.
    """

    topic_word: np.ndarray                  # (k, d), rows on the simplex
    alpha: np.ndarray                       # (k,)
    model_id: str = ""
    fold_in_iter: int = 5
    epoch: int | None = None                # the snapshot's epoch (continual release)

    def __post_init__(self) -> None:
        _warm_kernel()

    @classmethod
    def from_snapshot(cls, snap, fold_in_iter: int = 5) -> "RefinementModel":
        phi = snap.fold_in_topics if snap.fold_in_topics is not None else snap.topic_word
        return cls(np.asarray(phi, dtype=np.float64), np.asarray(snap.alpha, dtype=np.float64),
                   snap.release_id, fold_in_iter,
                   None if snap.epoch is None else int(snap.epoch))

    def to_dict(self) -> dict:
        """The public values of the model (what its snapshot published), for the release state."""
        return {"kind": "refinement_model", "v": SCHEMA_VERSION, "epoch": self.epoch,
                "release_id": self.model_id, "topic_word": ser.pack_array(self.topic_word),
                "alpha": ser.pack_array(self.alpha)}

    @classmethod
    def from_dict(cls, obj: dict, fold_in_iter: int = 5) -> "RefinementModel":
        ser.check_header(obj, "refinement_model", SCHEMA_VERSION)
        return cls(np.asarray(ser.unpack_array(obj["topic_word"], name="topic_word"), dtype=np.float64),
                   np.asarray(ser.unpack_array(obj["alpha"], name="alpha"), dtype=np.float64),
                   str(obj["release_id"]), fold_in_iter,
                   None if obj["epoch"] is None else int(obj["epoch"]))

    @property
    def shape(self) -> tuple[int, int]:
        return self.topic_word.shape

    def document_terms(self, Xb: sp.csr_matrix) -> tuple[np.ndarray, int]:
        """Every document's R_d entries of a canonical CSR block: (nnz, k) values, row j the
        k topics' share of stored entry j (word ``Xb.indices[j]``), each document's Frobenius
        norm ≤ 1; and the number of non-empty documents. Row by row: a document's values do
        not depend on the other rows of the block."""
        phiT = self.__dict__.get("_phiT")
        if phiT is None:        # Φᵀ once per model (frozen dataclass: cache in __dict__)
            phiT = np.ascontiguousarray(self.topic_word.T, dtype=np.float64)
            self.__dict__["_phiT"] = phiT
        if Xb.nnz == 0:
            return np.zeros((0, self.topic_word.shape[0])), 0
        alpha = self.__dict__.get("_alpha")
        if alpha is None:
            alpha = _fold_in_alpha(self.alpha, self.topic_word.shape[0])
            self.__dict__["_alpha"] = alpha
        norms = np.sqrt(_segment_sum(Xb.data * Xb.data, Xb.indptr))
        # (nnz, k): c_w · r_·w / ‖c‖₂, scaled by the kernel as it writes the responsibilities
        _, vals = _fold_in_canonical(Xb, phiT, alpha, self.fold_in_iter,
                                     np.where(norms > 0, norms, 1.0))
        # floating-point guard: any document whose computed norm exceeds 1 is scaled to 1
        fro = np.sqrt(_segment_sum(np.einsum("ij,ij->i", vals, vals), Xb.indptr))
        over = fro > 1.0
        if over.any():
            vals *= np.where(over, 1.0 / np.where(over, fro, 1.0), 1.0)[row_ids(Xb)][:, None]
        return vals, int((norms > 0).sum())

    def contributions(self, X) -> tuple[np.ndarray, int]:
        """Σ_d R_d (k × d) over a batch, each ‖R_d‖_F ≤ 1, and the number of non-empty documents."""
        k, d = self.topic_word.shape
        X = as_count_batch(X, d)
        if X.nnz == 0:
            return np.zeros((k, d)), 0
        T, T_lo = np.zeros((d, k)), np.zeros((d, k))      # blocks added compensated
        n = 0
        for a in range(0, X.shape[0], FOLD_IN_BLOCK):
            Xb = X[a:a + FOLD_IN_BLOCK]
            if Xb.nnz == 0:
                continue
            vals, nb = self.document_terms(Xb)
            # Σ over documents: (d × nnz) · (nnz × k) as one sparse product
            rounding.accumulate(T, T_lo, _sequential_column_sum(Xb.indices, vals, d))
            n += nb
        return np.ascontiguousarray(rounding.collapse(T, T_lo).T), n


def topic_order(topic_word: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """THE topic-identity rule (docs/consumers.md §Topic identity): the permutation ``perm``
    such that ``topic_word[perm]`` numbers its topics as ``reference`` does — the assignment
    (Hungarian) of minimum total L1 distance between matched rows. Used for every published
    spectral snapshot against the snapshot published before it (ContinualRelease) and for the
    fold-in models (FoldInModels.add_snapshot), so published rows, models and refinement sums
    share one numbering. Pure post-processing of released values."""
    from scipy.optimize import linear_sum_assignment
    ref = np.asarray(reference, dtype=np.float64)
    B = np.asarray(topic_word, dtype=np.float64)
    cost = np.abs(ref[:, None, :] - B[None, :, :]).sum(axis=2)
    _, perm = linear_sum_assignment(cost)        # reference row i <- row perm[i]
    return perm


def align_topics(model: RefinementModel, reference: RefinementModel) -> RefinementModel:
    """``model`` with its topics (rows of Φ and entries of α) permuted to the best match of
    ``reference``'s (:func:`topic_order`)."""
    perm = topic_order(model.topic_word, reference.topic_word)
    return RefinementModel(np.ascontiguousarray(model.topic_word[perm]), model.alpha[perm].copy(),
                           model.model_id, model.fold_in_iter, model.epoch)


class FoldInModels:
    """The public models a continual pass folds documents into, keyed by snapshot epoch, and
    the epoch through which the release is closed (which decides :func:`model_epoch_for`).

    Only the models documents can still need are kept: an on-time document has an epoch
    e > ``closed_through``, so it needs the model of e − L ≥ closed_through + 1 − L; older
    ones are dropped (:meth:`prune`). ``lag`` is L.
    """

    def __init__(self, lag: int = DEFAULT_MODEL_LAG, public_start: bool | None = False) -> None:
        self.lag = check_model_lag(lag)
        self.models: dict[int, RefinementModel] = {}
        self.closed_through = 0
        # whether epochs e ≤ L are folded into a public start (model epoch 0); None: not known
        # yet (``start: auto`` with a public start: the release service decides at the warm-up
        # close and says so in the public release record), so those epochs are not decided
        self.public_start = public_start

    def model_epoch(self, epoch: int) -> int | None:
        if self.public_start is None and int(epoch) - self.lag < 1:
            raise ModelNotDecided(f"documents of epoch {epoch} are folded into the deployment's "
                                  "start, not chosen yet (start: auto): hold them until it is")
        return model_epoch_for(epoch, self.lag, bool(self.public_start))

    def decided(self, epoch: int) -> bool:
        """Whether documents of stream epoch ``epoch`` can be folded now: no model (e − L < 1,
        tensor start), epoch e − L is closed (its model can no longer change), or the public
        start's model (epoch 0) is loaded."""
        try:
            m = self.model_epoch(epoch)
        except ModelNotDecided:
            return False
        if m == PUBLIC_START_EPOCH:
            return m in self.models
        return m is None or m <= self.closed_through

    def model_for(self, epoch: int) -> RefinementModel | None:
        """The model of stream epoch ``epoch``'s documents; raises :class:`ModelNotDecided` if
        it is not decided yet. None: no refinement term — e − L < 1, or the model of a closed
        epoch was never kept (only after an upgrade from a release state that kept the last
        snapshot alone: a public fact, the same for every run)."""
        m = self.model_epoch(epoch)
        if m is None:
            return None
        if m == PUBLIC_START_EPOCH and m not in self.models:
            raise ModelNotDecided(f"documents of epoch {epoch} are folded into the public start "
                                  "(model epoch 0), not loaded yet: hold them until it is")
        if m > self.closed_through:
            raise ModelNotDecided(
                f"documents of epoch {epoch} are folded into the snapshot of epoch {m} "
                f"(lag {self.lag}); the release is closed through {self.closed_through}: "
                "hold these documents until it is")
        return self.models.get(m)

    def add_snapshot(self, snap, fold_in_iter: int = 5, closed_through: int | None = None) -> RefinementModel:
        """Epoch ``snap.epoch`` is closed and released as ``snap``: keep its model.

        Topic identity: the refinement sums of all epochs are added row by row, so every model
        must number its topics alike. A refined snapshot continues the rows of those sums; a
        spectral one (snapshots 1 … L, before the first refined epoch) is published already
        aligned to the snapshot before it (:func:`topic_order`, ContinualRelease); its model is
        aligned by the same rule to the newest model kept — the previous snapshot's — which is
        then the identity, and guards a snapshot published before the rule. Post-processing of
        public snapshots: the rule's privacy argument is unchanged."""
        model = RefinementModel.from_snapshot(snap, fold_in_iter=fold_in_iter)
        if getattr(snap, "stage", "spectral") != "refined" and self.models:
            model = align_topics(model, self.models[max(self.models)])
        self.released(model, closed_through)
        return model

    def released(self, model: RefinementModel, closed_through: int | None = None) -> None:
        """Epoch ``model.epoch`` (or ``closed_through``, if later) is closed, with that model."""
        if model.epoch is None:
            raise ValueError("a continual model needs the epoch of its snapshot")
        self.models[int(model.epoch)] = model
        self.close_through(int(model.epoch) if closed_through is None else closed_through)

    def close_through(self, epoch: int) -> None:
        self.closed_through = max(self.closed_through, int(epoch))
        self.prune()

    def prune(self) -> None:
        oldest = self.closed_through + 1 - self.lag
        for m in [m for m in self.models if m < oldest]:
            del self.models[m]


def public_start_models(refinement: RefinementConfig, public_start) -> FoldInModels:
    """The fold-in models of a continual chain from a public start (a
    :class:`streamdp.PublicStart`): epochs 1 … L are folded into it, model epoch 0
    (:func:`model_epoch_for` with ``public_start=True``). The services and the estimator
    both start such a chain from this."""
    models = FoldInModels(refinement.model_lag, public_start=True)
    models.models[PUBLIC_START_EPOCH] = RefinementModel(
        public_start.topic_word, public_start.alpha, public_start.start_id,
        refinement.fold_in_iter, PUBLIC_START_EPOCH)
    return models


# ----------------------------------------------------------------------------- release
def plan_refinement(rho: float, partition: str = STREAM, mechanism: str = "refine", *,
                    max_documents: int = rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM) -> GaussianEvent:
    """The one Gaussian event of a refinement release at zCDP cost ``rho`` (sensitivity for
    sums of at most ``max_documents`` documents, the premise N_max)."""
    if not (rho > 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    sens = refinement_sensitivity(max_documents)
    return GaussianEvent(BLOCK, sens, sigma_for_rho(sens, rho),
                         partition=partition, mechanism=mechanism)
