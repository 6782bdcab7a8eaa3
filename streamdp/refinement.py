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

Denoising (:func:`denoise_topic_word`) keeps every word possible: negative and sub-threshold
entries are shrunk, and each row is mixed with a background distribution estimated from
the column sums of T (the private corpus word frequencies, released for free) and a small
uniform floor, in proportion to the row's estimated noise-to-signal ratio.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp

from streamdp import serialization as ser
from streamdp.documents import as_count_batch
from streamdp.privacy import rounding
from streamdp.moments.accumulator import ChunkedAccumulator, Part
from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.events import STREAM, GaussianEvent, sigma_for_rho
from streamdp.privacy.sensitivity import block_sensitivities

BLOCK = "topic_word"


def refinement_sensitivity(max_documents: int = rounding.DEFAULT_MAX_DOCUMENTS_PER_SUM) -> float:
    """Δ of the refinement sums: ‖R_d‖_F ≤ 1 (1 + 10⁻⁹ covers the per-document norm's rounding,
    relative error ≲ nnz·2⁻⁵²) plus twice the rounding bound of a sum of ≤ N_max documents."""
    return block_sensitivities(ClipBounds.unclipped(), max_documents=max_documents)[BLOCK]


#: the sensitivity at the default premise N_max (what :func:`plan_refinement` uses by default)
SENSITIVITY = refinement_sensitivity()
SCHEMA_VERSION = 1
#: the refinement sketch's state. v2: the compensation ``sums_lo`` present; v1 states are
#: migrated (:func:`_sketch_v1_to_v2`). ``pending`` is written only for an open chunk (both).
SKETCH_VERSION = 2
# uniform probability mass mixed into every released topic: keeps every word possible
# (finite perplexity) at a bias of ≈ FLOOR·‖μ − b‖ (measured: 0.01 cost 0.001 of L2 error)
FLOOR = 1e-3


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


# ------------------------------------------------------------------------ the model rule
#: L of :func:`model_epoch_for` by default: documents are refined against a model two epochs old
DEFAULT_MODEL_LAG = 2


def check_model_lag(lag) -> int:
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 1:
        raise ValueError(f"the refinement model lag must be an integer number of epochs >= 1, "
                         f"got {lag!r}")
    return lag


#: the epoch a public start's model is kept under (:func:`model_epoch_for`): the warm-up's
PUBLIC_START_EPOCH = 0


def model_epoch_for(epoch: int, lag: int, public_start: bool = False) -> int | None:
    """THE refinement-model rule (docs/privacy.md §The refinement model rule), used by the
    sketchers, the release service and the estimator's continual path.

    A stream document of epoch ``epoch`` (e ≥ 1, from its own timestamp by the routing rule)
    is folded into the model of the latest snapshot whose epoch is ≤ e − L, where a
    snapshot's epoch is the last epoch it covers. A continual release publishes exactly one
    snapshot per closed epoch, 1, 2, 3, … (the warm-up, epoch 0, publishes none), so that
    snapshot is the one of epoch e − L. Returns e − L, or None when e − L < 1: no snapshot
    can ever qualify, the document has no refinement term (and the epoch is not refined).

    ``public_start`` (the deployment's start is an operator-supplied public model, issue 22):
    documents of epochs e ≤ L are folded into that model instead, kept as the model of epoch
    :data:`PUBLIC_START_EPOCH` (0); so every epoch is refined from epoch 1 on.

    The choice depends on the document's own epoch and on public snapshots only, never on
    when the document arrived or on other documents. It is *decided* once epoch e − L is
    closed (:meth:`FoldInModels.decided`); before that a sketcher holds the document.
    """
    m = int(epoch) - check_model_lag(lag)
    if m >= 1:
        return m
    return PUBLIC_START_EPOCH if public_start else None


def epoch_refined(epoch: int, lag: int, public_start: bool = False) -> bool:
    """Whether stream epoch ``epoch``'s documents carry refinement terms (public: the rule)."""
    return model_epoch_for(epoch, lag, public_start) is not None


# ------------------------------------------------------------------------ per document
def _row_ids(X: sp.csr_matrix) -> np.ndarray:
    return np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))


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


#: documents per fold-in block in :meth:`RefinementModel.contributions`: keeps the
#: (nnz, k) temporaries in cache (measured 2× faster than whole 5000-document batches)
FOLD_IN_BLOCK = 512
#: documents per fold-in call inside a summation chunk of :meth:`RefinementSketch.update`:
#: their (nnz, k) values (≈ 1 MB at 50 words, k = 20) are summed while still in cache
TERMS_BLOCK = 128
#: documents per summation chunk of a :class:`RefinementSketch`, counted in the sketch's own
#: document sequence (docs/privacy.md, "Floating point")
REFINE_CHUNK = FOLD_IN_BLOCK


def _column_sum_kernel():
    """The compiled in-order column sum (:mod:`streamdp._column_sum_kernel`), imported on first use."""
    from streamdp._column_sum_kernel import add_rows_by_column
    return add_rows_by_column


def _sequential_column_sum(cols: np.ndarray, vals: np.ndarray, d: int,
                           start: np.ndarray | None = None) -> np.ndarray:
    """(d, k) sums of the rows of ``vals`` (nnz, k) grouped by word ``cols``, added one entry
    at a time in entry (document) order onto ``start`` (zeros if None).

    Each output entry is the left-to-right sum in document order, so a sum continued from
    ``start`` is bit-identical to one sum over all the rows. That is what lets a summation
    chunk span several ``update`` calls (tests/test_batch_invariance.py checks it bit for bit).
    Compiled (:func:`streamdp._column_sum_kernel.add_rows_by_column`; the same additions as the
    CSC product it replaced). ``start`` (float64, C-contiguous (d, k)) is updated in place."""
    out = np.zeros((d, vals.shape[1])) if start is None else start
    _column_sum_kernel()(out, cols, np.ascontiguousarray(vals, dtype=np.float64))
    return out


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
            vals *= np.where(over, 1.0 / np.where(over, fro, 1.0), 1.0)[_row_ids(Xb)][:, None]
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


class ModelNotDecided(RuntimeError):
    """A document's model (:func:`model_epoch_for`) is not decided yet: its caller must hold it."""


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


class RefinementSketch:
    """Additive k × d refinement sums of a set of documents (mergeable by addition).

    Chunks (docs/privacy.md, "Floating point"): the documents are summed in chunks of exactly
    REFINE_CHUNK rows counted in this sketch's own sequence, each chunk a left-to-right sum in
    document order (:func:`_sequential_column_sum`), chunks added compensated. The partial last
    chunk is kept as its running sum (``pending``, d × k, with ``pending_rows``): the model a
    document is folded into is applied when it arrives, so the pending state needs no model —
    a model change inside a chunk changes only those documents' own terms — and the release
    service can read it without one. So the sums are a deterministic function of the sketch's
    sequence of (document, model) pairs, whatever the callers' batches.

    Attributes
    ----------
    sums : (k, d)   Σ_d R_d, rounded once (``sums_lo`` is the remainder, carried to later
                    additions: chunks and merges add compensated); read with the pending
                    chunk added as the final chunk, without changing the sketch
    n_docs : int    documents added (non-empty), pending ones included
    """

    def __init__(self, k: int, d: int) -> None:
        rounding.check_vocabulary(d)
        self._k, self._d = int(k), int(d)
        # closed chunks: a compensated pair (Sum2 steps in place), kept d × k like the chunk
        # sums; read as the renormalised k × d double-double. The open chunk: its running sum
        self.acc = ChunkedAccumulator({"sums": (self._d, self._k)}, REFINE_CHUNK)
        self.n_docs = 0

    # the closed chunks' pair and the open chunk's (d, k) running sum (None when empty)
    _acc, _comp = Part("sums"), Part("sums", low=True)

    @property
    def pending(self) -> np.ndarray | None:
        return (self.acc.open_sums() or {}).get("sums")

    @pending.setter
    def pending(self, value: np.ndarray) -> None:
        self.acc.open = {"sums": value}

    @property
    def pending_rows(self) -> int:
        return self.acc.open_rows

    @property
    def shape(self) -> tuple[int, int]:
        return (self._k, self._d)

    def total(self) -> tuple[np.ndarray, np.ndarray]:
        """(sums, sums_lo), k × d: the sum rounded once and its remainder, with the pending
        chunk added as the final chunk; the sketch is unchanged."""
        closed = self.acc.closed()
        hi, lo = rounding.two_sum(closed.hi["sums"], closed.lo["sums"])
        return np.ascontiguousarray(hi.T), np.ascontiguousarray(lo.T)

    @property
    def sums(self) -> np.ndarray:
        return self.total()[0]

    @property
    def sums_lo(self) -> np.ndarray:
        return self.total()[1]

    def update(self, X, model: RefinementModel, weights=None) -> "RefinementSketch":
        """Fold documents into ``model`` and add their R_d. ``weights`` (n,), optional:
        user-level weights in [0, 1] (:mod:`streamdp.privacy.user_bounding`) multiplying each
        R_d (rows of weight 0 are not added), so a user's total stays ≤ Σ w ≤ 1."""
        if model.shape != self.shape:
            raise ValueError(f"model has shape {model.shape}, the sketch {self.shape}")
        d = self._d
        X = as_count_batch(X, d)
        w = None
        if weights is not None:
            from streamdp.moments.sketch import weighted_rows
            X, w = weighted_rows(X, weights)
        for a, b in self.acc.segments(X.shape[0]):     # they end where this sketch's chunks end
            # the chunk's running sum continues entry after entry, so folding it in sub-blocks
            # gives the same bits, with each block's (nnz, k) values still in cache when summed
            total = self.pending if self.pending is not None else self._zeroed_chunk_sums()
            for a1 in range(a, b, TERMS_BLOCK):
                b1 = min(a1 + TERMS_BLOCK, b)
                Xb = X[a1:b1]
                if Xb.nnz:
                    vals, nb = model.document_terms(Xb)
                    if w is not None:
                        vals = vals * w[a1:b1][_row_ids(Xb)][:, None]
                    total = _sequential_column_sum(Xb.indices, vals, d, total)
                    self.n_docs += nb
            self.pending = total
        return self

    def _zeroed_chunk_sums(self) -> np.ndarray:
        """Zeros (d, k) for a new chunk's running sum: the array of the chunk before it, which
        the accumulator added and let go when it closed, refilled with zeros (only called when
        no chunk is open). A fresh (d, k) array per chunk cost its page faults: ≈ 1.7 µs per
        document at d = 10,000, k = 20, more than the column sums themselves."""
        buf = getattr(self, "_spare", None)
        if buf is None:
            buf = self._spare = np.zeros((self._d, self._k))
        else:
            buf.fill(0.0)
        return buf

    def merge(self, other: "RefinementSketch") -> "RefinementSketch":
        """Add another sketch's sums (compensated). Each side's partial chunk is closed as its
        own final chunk first (never one chunk of two sketches): the result depends only on
        the two sequences and the merge order."""
        if other.shape != self.shape:
            raise ValueError("cannot merge refinement sketches of different shapes")
        self.acc.close()
        self.acc.merge(other.acc)
        self.n_docs += other.n_docs
        return self

    def to_dict(self) -> dict:
        # "sums"/"sums_lo": the compensated pair, k × d (value = sums + sums_lo; exact transposes)
        out = {"kind": "refinement_sketch", "v": SKETCH_VERSION, "n_docs": int(self.n_docs),
               "sums": ser.pack_array(self._acc.T), "sums_lo": ser.pack_array(self._comp.T)}
        if self.pending_rows:       # the partial chunk's running sum (secret, like the sums)
            out["pending"] = {"rows": int(self.pending_rows), "sum": ser.pack_array(self.pending)}
        return out

    @classmethod
    def from_dict(cls, obj: dict) -> "RefinementSketch":
        obj = ser.upgrade(obj, "refinement_sketch", SKETCH_VERSION, {1: _sketch_v1_to_v2})
        ser.require(obj, "refinement_sketch", "n_docs", "sums", "sums_lo")
        sums = ser.unpack_array(obj["sums"], name="sums")
        out = cls(*sums.shape)
        out._acc, out.n_docs = np.array(sums.T, dtype=np.float64, order="C"), int(obj["n_docs"])
        lo = ser.unpack_array(obj["sums_lo"], name="sums_lo")
        if lo.shape != sums.shape:
            raise ser.SchemaError(f"refinement compensation: shape {lo.shape}, expected {sums.shape}")
        out.acc.lo["sums"] = np.array(lo.T, dtype=np.float64, order="C")
        pend = obj.get("pending")       # written only for an open chunk
        if pend:
            rows = int(pend["rows"])
            acc = ser.unpack_array(pend["sum"], name="pending.sum")
            if not 0 < rows < REFINE_CHUNK or acc.shape != sums.shape[::-1]:
                raise ser.SchemaError(f"refinement pending chunk: {rows} rows of shape {acc.shape}, "
                                      f"expected < {REFINE_CHUNK} rows of {sums.shape[::-1]}")
            out.acc.load_open({"sums": np.array(acc, dtype=np.float64, order="C")}, rows)
        return out


def _sketch_v1_to_v2(obj: dict) -> dict:
    """A v1 refinement sketch state as v2 (the one migration of this kind): v1 states written
    before the rounding work carry no compensation (their value is exact as is)."""
    if "sums_lo" in obj:
        return obj
    return {**obj, "sums_lo": ser.pack_array(np.zeros_like(ser.unpack_array(obj["sums"], name="sums")))}


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


def background_distribution(T: np.ndarray, sd: float, floor: float = FLOOR) -> np.ndarray:
    """Corpus word frequencies from the column sums of released T (free), with a uniform floor.

    Σ_i T_iw = Σ_d c_w/‖c‖ (responsibilities sum to 1) plus noise of sd σ√k: entries below
    2σ√k are treated as zero, then ``floor`` of the uniform distribution is mixed in so that
    no word ever gets probability 0.
    """
    k, d = T.shape
    col = np.maximum(T.sum(axis=0) - 2.0 * sd * math.sqrt(k), 0.0)
    b = col / col.sum() if col.sum() > 0 else np.full(d, 1.0 / d)
    return (1.0 - floor) * b + floor / d


def denoise_topic_word(T: np.ndarray, sd: float, *, floor: float = FLOOR):
    """Topics from noised sums T by positive-part James–Stein shrinkage toward the background.

    Row i has mass m_i = Σ_w T_iw and deviation D_i = T_i − m_i b from the background b
    (:func:`background_distribution`). With d·σ² the expected noise energy of a row,
    w_i = max(0, 1 − dσ²/‖D_i‖²) and  topic_i ∝ max(m_i b + w_i D_i, 0) + floor. A row the
    noise swamps falls back to b; a row with strong signal keeps its shape. Every word keeps
    probability > 0, so held-out perplexity stays finite. Pure post-processing.

    Returns
    -------
    topic_word : (k, d)          rows on the simplex, all entries > 0
    noise_to_signal : (k,)       √(dσ²) / √(‖D_i‖² − dσ²)  (∞ when the noise explains all)
    """
    T = np.asarray(T, dtype=np.float64)
    k, d = T.shape
    b = background_distribution(T, sd, floor)
    m = np.maximum(T.sum(axis=1), 0.0)
    D = T - m[:, None] * b[None, :]
    energy = np.einsum("ij,ij->i", D, D)
    noise = d * float(sd) ** 2
    w = np.clip(1.0 - noise / np.maximum(energy, 1e-300), 0.0, 1.0) if sd > 0 else np.ones(k)
    S = np.maximum(m[:, None] * b[None, :] + w[:, None] * D, 0.0)
    S = S / np.maximum(S.sum(axis=1, keepdims=True), 1e-300)
    S = (1.0 - floor) * S + floor * b[None, :]
    excess = energy - noise
    nts = np.where(excess > 0, math.sqrt(noise) / np.sqrt(np.maximum(excess, 1e-300)), np.inf)
    return S / S.sum(axis=1, keepdims=True), nts


def model_topic_word(T: np.ndarray, sd: float, *, floor: float = FLOOR) -> np.ndarray:
    """The sharper topics used *between* passes: soft threshold at the universal level.

    Entries below σ√(2 ln d) (the largest of d pure-noise entries, w.h.p.) are dropped and
    the rest shrunk by that much, then mixed with the background in proportion to the
    row's noise mass σ√d, so responsibilities of the next pass follow significant words
    only (measured better for the next pass than :func:`denoise_topic_word`).
    """
    T = np.asarray(T, dtype=np.float64)
    k, d = T.shape
    b = background_distribution(T, sd, floor)
    tau = math.sqrt(2.0 * math.log(max(d, 2))) * sd
    S = np.maximum(T - tau, 0.0) + sd * math.sqrt(d) * b[None, :] + 1e-300
    return S / S.sum(axis=1, keepdims=True)


def alpha_from_sums(T: np.ndarray, alpha0: float) -> np.ndarray:
    """α_i ∝ the row masses of T (each topic's share of the tokens), summing to α0."""
    k = T.shape[0]
    mass = np.maximum(np.asarray(T).sum(axis=1), 0.0)
    share = mass / mass.sum() if mass.sum() > 0 else np.full(k, 1.0 / k)
    share = np.maximum(share, 1e-3 / k)
    return alpha0 * share / share.sum()


#: the sparse-topic rule (:func:`sparse_topic_word`): entries above SPARSE_TAU·σ are kept ...
SPARSE_TAU = 2.0
#: ... and a row is published that way when they hold at least this share of its noised mass
SPARSE_MASS = 0.95


def sparse_topic_word(T: np.ndarray, sd: float, *, floor: float = FLOOR):
    """Hard threshold at SPARSE_TAU·σ, and which rows the sparse-topic rule keeps it for.

    Entries T_iw ≤ τσ are set to 0, the row renormalised and ``floor`` of the background
    (:func:`background_distribution`) mixed in, so every word stays possible. The rule: row i
    is sparse when its kept entries, less what pure noise would put there, hold ≥ SPARSE_MASS
    of the row's noised mass Σ_w T_iw.
    Then nearly all the topic's mass stands above the noise, and zeroing the rest removes
    noise, not signal: on synthetic LDA (d = 1000, k = 10, 200k documents, ε = 1) the sums of
    the true topics come back 0.0021 from the truth this way against 0.0040 by
    :func:`denoise_topic_word` (whose shrink toward the background keeps the noise of the
    ≈ 950 empty words). A topic of real text at ε ≤ 4 has most of its mass in words below the
    noise and keeps the James–Stein estimate. Without noise (σ = 0) both are T's positive
    part, renormalised, with the same floor. Reads released values and σ only.

    Returns
    -------
    topic_word : (k, d)     rows on the simplex, all entries > 0
    sparse : (k,) bool      rows the rule picks this estimate for
    """
    T = np.asarray(T, dtype=np.float64)
    k, d = T.shape
    b = background_distribution(T, sd, floor)
    H = np.where(T > SPARSE_TAU * float(sd), T, 0.0)
    kept = H.sum(axis=1)
    mass = T.sum(axis=1)
    # pure noise puts d·σ·φ(τ) in the kept entries (E[Z·1(Z > τ)] = φ(τ) for Z ~ N(0, 1)):
    # only the rest counts as kept signal, so a row of little mass is never called sparse
    noise_kept = d * float(sd) * math.exp(-0.5 * SPARSE_TAU ** 2) / math.sqrt(2.0 * math.pi)
    sparse = (kept > 0) & (mass > 0) & (kept - noise_kept >= SPARSE_MASS * mass)
    S = H / np.where(kept > 0, kept, 1.0)[:, None]
    S = (1.0 - floor) * S + floor * b[None, :]
    return S / S.sum(axis=1, keepdims=True), sparse


def refined_topics(T_noisy: np.ndarray, sd: float, alpha0: float):
    """Everything a refined snapshot publishes from released sums (post-processing only).

    Rows the sparse-topic rule picks (:func:`sparse_topic_word`) are published, and folded into
    by the next pass, hard-thresholded; the others James–Stein shrunk (:func:`denoise_topic_word`,
    published) and soft-thresholded (:func:`model_topic_word`, the next pass's model).

    Returns topic_word (k, d), alpha (k,), noise_to_signal (k,), fold_in_topics (k, d).
    """
    topic_word, nts = denoise_topic_word(T_noisy, sd)
    fold_in = model_topic_word(T_noisy, sd)
    sparse_tw, sparse = sparse_topic_word(T_noisy, sd)
    topic_word[sparse] = sparse_tw[sparse]
    fold_in[sparse] = sparse_tw[sparse]
    return topic_word, alpha_from_sums(T_noisy, alpha0), nts, fold_in
