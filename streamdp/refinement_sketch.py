"""The refinement sums of a stream (DESIGN §8): Σ_d R_d over the documents a sketch has seen,
each folded into its model as it arrives, summed in chunks of the sketch's own document
sequence and the chunks added compensated (docs/privacy.md, "Floating point"). The per-document
terms R_d and their bound ‖R_d‖_F ≤ 1 are the model's
(:meth:`streamdp.refinement.RefinementModel.document_terms`).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np
import scipy.sparse as sp

from streamdp import serialization as ser
from streamdp.documents import as_count_batch
from streamdp.privacy import rounding
from streamdp.moments.accumulator import ChunkedAccumulator, Part
from streamdp.moments.sketch import weighted_rows

#: the refinement sketch's state. v2: the compensation ``sums_lo`` present; v1 states are
#: migrated (:func:`_sketch_v1_to_v2`). ``pending`` is written only for an open chunk (both).
SKETCH_VERSION = 2


def row_ids(X: sp.csr_matrix) -> np.ndarray:
    """The row of each stored entry of a CSR batch."""
    return np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))


#: documents per fold-in block in :meth:`RefinementModel.contributions`: keeps the
#: (nnz, k) temporaries in cache (measured 2× faster than whole 5000-document batches)
FOLD_IN_BLOCK = 512
#: documents per fold-in call inside a summation chunk of :meth:`RefinementSketch.update`:
#: their (nnz, k) values (≈ 1 MB at 50 words, k = 20) are summed while still in cache
TERMS_BLOCK = 128
#: documents per summation chunk of a :class:`RefinementSketch`, counted in the sketch's own
#: document sequence (docs/privacy.md, "Floating point")
REFINE_CHUNK = FOLD_IN_BLOCK


def column_sum_kernel():
    """The compiled in-order column sum (:mod:`streamdp._column_sum_kernel`), imported on first use
    (numba: ``import streamdp`` does not pay for it)."""
    from streamdp._column_sum_kernel import add_rows_by_column
    return add_rows_by_column


def sequential_column_sum(cols: np.ndarray, vals: np.ndarray, d: int,
                           start: np.ndarray | None = None) -> np.ndarray:
    """(d, k) sums of the rows of ``vals`` (nnz, k) grouped by word ``cols``, added one entry
    at a time in entry (document) order onto ``start`` (zeros if None).

    Each output entry is the left-to-right sum in document order, so a sum continued from
    ``start`` is bit-identical to one sum over all the rows. That is what lets a summation
    chunk span several ``update`` calls (tests/test_batch_invariance.py checks it bit for bit).
    Compiled (:func:`streamdp._column_sum_kernel.add_rows_by_column`; the same additions as the
    CSC product it replaced). ``start`` (float64, C-contiguous (d, k)) is updated in place."""
    out = np.zeros((d, vals.shape[1])) if start is None else start
    column_sum_kernel()(out, cols, np.ascontiguousarray(vals, dtype=np.float64))
    return out


class TermsModel(Protocol):
    """What the sketch needs of the model documents are folded into
    (:class:`streamdp.refinement.RefinementModel`; named here, not imported: it imports this)."""

    @property
    def shape(self) -> tuple[int, int]: ...

    def document_terms(self, Xb: sp.csr_matrix) -> tuple[np.ndarray, int]: ...


class RefinementSketch:
    """Additive k × d refinement sums of a set of documents (mergeable by addition).

    Chunks (docs/privacy.md, "Floating point"): the documents are summed in chunks of exactly
    REFINE_CHUNK rows counted in this sketch's own sequence, each chunk a left-to-right sum in
    document order (:func:`sequential_column_sum`), chunks added compensated. The partial last
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

    def update(self, X, model: TermsModel, weights=None) -> "RefinementSketch":
        """Fold documents into ``model`` and add their R_d. ``weights`` (n,), optional:
        user-level weights in [0, 1] (:mod:`streamdp.privacy.user_bounding`) multiplying each
        R_d (rows of weight 0 are not added), so a user's total stays ≤ Σ w ≤ 1."""
        if model.shape != self.shape:
            raise ValueError(f"model has shape {model.shape}, the sketch {self.shape}")
        d = self._d
        X = as_count_batch(X, d)
        w = None
        if weights is not None:
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
                        vals = vals * w[a1:b1][row_ids(Xb)][:, None]
                    total = sequential_column_sum(Xb.indices, vals, d, total)
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
