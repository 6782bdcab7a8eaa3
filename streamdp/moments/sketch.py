"""Whitened moment sketches in O(d·k' + k'³) memory (DESIGN §3).

Per document with counts c (length l ≥ 3), y = Qᵀc and q_i = Qᵀe_i:

    m1 = c / l                                                     (d)
    z  = (c yᵀ − diag(c) Q) / (l(l−1))            = e2·Q           (d × k')
    s1 = Qᵀ m1,   s2 = Qᵀ z                                         (k'), (k' × k')
    s3 = (y⊗y⊗y − Σ_i c_i (q_i⊗q_i⊗y + q_i⊗y⊗q_i + y⊗q_i⊗q_i)
          + 2 Σ_i c_i q_i⊗q_i⊗q_i) / (l(l−1)(l−2))  = e3(Q,Q,Q)     (k' × k' × k')

each multiplied by the document's clipping factor (see :mod:`.clipping`).

The per-word terms of z and s3 are linear in per-word weights, so instead of
expanding them per document we accumulate, with w2 = scale/(l(l−1)) and
w3 = scale/(l(l−1)(l−2)):

    Zacc += Xᵀ (w2 ⊙ Y),  a2 += Xᵀ w2        (z = Zacc − diag(a2) Q)
    B3   += Xᵀ (w3 ⊙ Y),  a3 += Xᵀ w3        (Σ_i q_i⊗q_i⊗B3_i, Σ_i a3_i q_i^{⊗3})
    T3   += Σ_n w3 y⊗y⊗y on a ≤ b ≤ c          (symmetric: only the k'(k'+1)(k'+2)/6
                                              distinct entries, packed; :mod:`.symmetric3`)

and expand only when the sums are read (:meth:`WhitenedSketch.sums`, O(d·k'³); T3 is
expanded there to the full symmetric k'³ tensor, so the released s3 is the same tensor).
Per document that is O(nnz·k' + k'³/6) work, all of it BLAS or sparse kernels.
All accumulators are sums, so sketches of disjoint document sets merge by
addition.

Rounding (docs/privacy.md, "Floating point"; :mod:`streamdp.privacy.rounding`): each
product runs over one chunk of exactly BATCH_ROWS_MAX documents counted in the sketch's own
document sequence (the rows of a partial chunk wait as pending rows, whatever the callers'
batches: the computed sums are a deterministic function of that sequence), every accumulator
is a compensated pair (value, compensation) updated with TwoSum (Sum2), and read-time
products run over at most READ_CHUNK_MAX words, chunks added compensated — so the rounding
error of every released sum is ≤ R_b, whatever N ≤ N_max, d and k'.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import scipy.sparse as sp

from streamdp import serialization as ser
from streamdp.documents import MIN_DOC_LENGTH, as_count_batch, keep_long_documents
from streamdp.moments import clipping, symmetric3
from streamdp.moments.accumulator import ChunkedAccumulator, Part
from streamdp.moments.clipping import ClipBounds
from streamdp.privacy import rounding
from streamdp.privacy.rounding import BATCH_ROWS_MAX, READ_CHUNK_MAX, MAGNITUDE_FACTOR
from streamdp.whitening.subspace import Subspace

#: v2: t3 holds the packed distinct entries (a ≤ b ≤ c, :mod:`.symmetric3`), and every
#: field is present. v1 states are migrated by :func:`_sketch_v1_to_v2`
SCHEMA_VERSION = 2

# Elements of the read-time (words × k'²) Khatri–Rao block materialised at once (~32 MB).
_KR_ELEMENTS = 1 << 22


_BLOCKS = ("count", "m1", "z", "s1", "s2", "s3")


@dataclass(frozen=True, eq=False)
class SketchSums:
    """Closed block sums of a set of documents (what gets noised and released).

    Attributes (k' = subspace dimension, d = vocabulary size)
    ----------
    count : float            Σ scale (the document count when nothing is clipped)
    m1 : (d,)                Σ scale · c/l
    z : (d, k')              Σ scale · e2·Q
    s1 : (k',)               Σ scale · Qᵀc/l
    s2 : (k', k')            Σ scale · Qᵀ e2 Q
    s3 : (k', k', k')        Σ scale · e3(Q, Q, Q)
    n_docs : int             documents offered to the sums (exact; checked against the
                             premise max_documents_per_sum before noising)
    lo : dict or None        low parts of a double-double sum (``+`` is compensated: each
                             block value is the sum rounded once, ``lo`` the remainder)
    """

    count: float
    m1: np.ndarray
    z: np.ndarray
    s1: np.ndarray
    s2: np.ndarray
    s3: np.ndarray
    n_docs: int = 0
    lo: dict | None = None

    def __add__(self, other: "SketchSums") -> "SketchSums":
        """Compensated (double-double) addition: partition merges and epoch/tree-node sums
        add only a second-order rounding error (streamdp.privacy.rounding)."""
        if not isinstance(other, SketchSums):
            return NotImplemented
        vals, lo = {}, {}
        for name in _BLOCKS:
            a, b = getattr(self, name), getattr(other, name)
            if name == "count":
                a, b = float(a), float(b)
            hi, low = rounding.dd_add(a, (self.lo or {}).get(name), b, (other.lo or {}).get(name))
            vals[name], lo[name] = (float(hi), float(low)) if name == "count" else (hi, low)
        return SketchSums(**vals, n_docs=int(self.n_docs) + int(other.n_docs), lo=lo)

    def replace(self, **changes) -> "SketchSums":
        vals = {f.name: getattr(self, f.name) for f in fields(self)}
        vals.update(changes)
        if vals["lo"] is not None and set(changes) & set(_BLOCKS):
            vals["lo"] = {k: v for k, v in vals["lo"].items() if k not in changes}
        return SketchSums(**vals)

    def to_dict(self) -> dict:
        out = {"count": float(self.count), "n_docs": int(self.n_docs)}
        out.update({n: ser.pack_array(getattr(self, n)) for n in _BLOCKS if n != "count"})
        if self.lo:
            out["lo"] = {n: (float(v) if n == "count" else ser.pack_array(v))
                         for n, v in self.lo.items()}
        return out

    @classmethod
    def from_dict(cls, obj: dict) -> "SketchSums":
        lo = obj.get("lo")
        if lo is not None:
            lo = {n: (float(v) if n == "count" else ser.unpack_array(v, name=f"lo.{n}"))
                  for n, v in lo.items()}
        return cls(count=float(obj["count"]),
                   **{n: ser.unpack_array(obj[n], name=n) for n in ("m1", "z", "s1", "s2", "s3")},
                   n_docs=int(obj["n_docs"]), lo=lo)


def khatri_rao_rows(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Row-wise Kronecker product: (n, p), (n, q) → (n, p·q)."""
    return (A[:, :, None] * B[:, None, :]).reshape(A.shape[0], -1)


def symmetrize3(T: np.ndarray) -> np.ndarray:
    """Average of a 3-tensor over the 6 permutations of its axes."""
    return (T + T.transpose(0, 2, 1) + T.transpose(1, 0, 2) + T.transpose(1, 2, 0)
            + T.transpose(2, 0, 1) + T.transpose(2, 1, 0)) / 6.0


_ACCUMULATORS = ("m1", "zacc", "a2", "b3", "a3", "t3")


class WhitenedSketch:
    """Mergeable, clipped moment sketch of a document stream in a fixed subspace.

    Parameters
    ----------
    subspace : Subspace
        Public basis Q (d × k').
    clip : ClipBounds, optional
        Public per-block norm bounds; defaults to :meth:`ClipBounds.unclipped`.

    Attributes
    ----------
    n_docs : int
        Documents accepted (length ≥ 3). Internal state: never released as is.
    n_clipped : int
        Documents whose contribution was scaled down (pending rows included). Internal
        diagnostics.

    Chunks (docs/privacy.md, "Floating point"): documents are processed in chunks of exactly
    BATCH_ROWS_MAX long documents counted in this sketch's own sequence; the partial last
    chunk waits as pending rows (in the state and in checkpoints). :meth:`sums` processes
    them as one final chunk on a copy, so reading never changes the sketch, and the sums
    depend on the document sequence alone, not on how it was cut into ``update`` calls.
    """

    def __init__(self, subspace: Subspace, clip: ClipBounds | None = None) -> None:
        if not isinstance(subspace, Subspace):
            subspace = Subspace(np.asarray(subspace))
        self.subspace = subspace
        self.clip = clip or ClipBounds.unclipped()
        d, k = subspace.d, subspace.dim
        rounding.check_vocabulary(d)
        self.n_docs = 0
        self.n_rows = 0            # every row offered (also short documents): the premise count
        self._n_clipped = 0           # in processed chunks
        # "count": Σ scale (a scalar sum); t3: Σ w3 y⊗y⊗y, packed a ≤ b ≤ c
        self.acc = ChunkedAccumulator(
            {"count": (), "m1": (d,), "zacc": (d, k), "a2": (d,), "b3": (d, k), "a3": (d,),
             "t3": (symmetric3.packed_size(k),)}, BATCH_ROWS_MAX, rows_of=d)

    # the accumulators' high parts as attributes (the arrays themselves)
    m1, zacc, a2, b3, a3, t3 = Part(), Part(), Part(), Part(), Part(), Part()

    @property
    def comp(self) -> dict[str, np.ndarray]:
        """The compensation (low) part of every accumulator: value = accumulator + comp."""
        return self.acc.lo

    @property
    def pending(self):
        """The open chunk's rows (raw counts)."""
        return self.acc.pending

    @property
    def pending_weights(self) -> np.ndarray:
        return self.acc.pending_weights

    @property
    def weight_sum(self) -> float:
        return float(self.acc.hi["count"])

    @property
    def weight_sum_lo(self) -> float:
        return float(self.acc.lo["count"])

    # ------------------------------------------------------------------ update
    def update(self, X, weights=None) -> "WhitenedSketch":
        """Add a batch of documents (CSR counts, shape (n, d)). Returns self.

        ``weights`` (n,), optional: user-level weights in [0, 1]
        (:mod:`streamdp.privacy.user_bounding`); each document's clip factor is multiplied by
        its weight, rows of weight 0 are not added at all."""
        X = as_count_batch(X, self.subspace.d)
        X, w = weighted_rows(X, weights)
        self.n_rows += X.shape[0]
        X, w = keep_long_weighted(X, w)
        self.n_docs += X.shape[0]
        # exactly BATCH_ROWS_MAX terms per product, chunks counted in this sketch's sequence
        self.acc.feed(X, w, self._update_chunk)
        return self

    def _flush_pending(self) -> None:
        """Process the pending rows as this sketch's final chunk (ends its chunk sequence)."""
        self.acc.close(self._update_chunk)

    @property
    def n_clipped(self) -> int:
        n = self._n_clipped
        if self.pending.n:      # the pending rows' clip factors (row by row, as in their chunk)
            X = self.pending.rows()
            lengths = np.asarray(X.sum(axis=1)).ravel()
            n += int(np.count_nonzero(self.document_scale(X, lengths, X @ self.subspace.Q) < 1.0))
        return n

    def _update_chunk(self, X: sp.csr_matrix, weights: np.ndarray | None = None) -> None:
        if X.shape[0] == 0:
            return
        lengths = np.asarray(X.sum(axis=1)).ravel()
        Q = self.subspace.Q
        Y = X @ Q                                    # (n, k') — y = Qᵀc per document
        scale = self.document_scale(X, lengths, Y)
        if weights is not None:
            # user-level weight: the factor fl(w·ŝ) ≤ w·ŝ·(1 + u) stays within w·C_b thanks to
            # the clip headroom (docs/privacy.md, "The user-level unit")
            scale = scale * weights
        w1 = scale / lengths
        w2 = w1 / (lengths - 1)
        w3 = w2 / (lengths - 2)
        Xt = X.T.tocsr()
        add = self.acc.add
        add("m1", Xt @ w1)
        add("zacc", Xt @ (Y * w2[:, None]))
        add("a2", Xt @ w2)
        W3Y = Y * w3[:, None]
        add("b3", Xt @ W3Y)
        add("a3", Xt @ w3)
        # only the distinct entries a ≤ b ≤ c of the symmetric Σ w3 y⊗y⊗y (documents in
        # blocks summed plainly: a term passes ≤ n + 1 additions)
        add("t3", symmetric3.cube_sums(np.ascontiguousarray(Y.T), np.ascontiguousarray(W3Y.T)))
        self._n_clipped += int(np.count_nonzero(scale < 1.0))
        add("count", float(scale.sum()))

    def document_scale(self, X: sp.csr_matrix, lengths: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """Clipping factor per document (see :mod:`streamdp.moments.clipping`).

        Besides the block norms (≤ C_b), the pre-cancellation magnitudes P_b of the terms a
        document adds to the accumulators are bounded by MAGNITUDE_FACTOR·C_b: the rounding
        bound R_b of :mod:`streamdp.privacy.rounding` scales with them. Every P_b is ≤ 10
        (s3 at length 3), so bounds C_b ≥ 1 clip nothing.

        ``Y`` is the computed XQ: the contributions are defined with it (z = e2·Q with y = Ŷ
        exactly), so the bounds below are bounds for the computed ŷ.
        """
        c = self.clip
        if c.m1 >= 1 and c.z >= 1 and c.s3 >= 1:
            return np.ones(X.shape[0])   # every block norm is ≤ 1 and every P_b ≤ 10: no clip
        rn2 = self.subspace.row_norm2
        rn1 = np.sqrt(rn2)
        yy = np.einsum("ij,ij->i", Y, Y)
        ynorm = np.sqrt(yy)
        p2 = clipping.row_sums(X, X.data**2)
        n_m1 = np.sqrt(p2) / lengths
        n_z = clipping.projected_e2_norm(X, lengths, Y, self.subspace.Q, rn2)
        l3 = lengths * (lengths - 1) * (lengths - 2)
        crn2 = X @ rn2
        a1 = X @ rn1                                   # Σ c_i ‖q_i‖ ≥ ‖Σ c_i |q_i|‖
        tri = (yy * ynorm + 3.0 * ynorm * crn2 + 2.0 * (X @ rn2**1.5)) / l3
        # ‖e3‖_F bounds the exact-y tensor; the computed ŷ differs by ‖δ‖ ≤ γ_d·a1 (dot
        # products of ≤ d terms), which moves the tensor by ≤ 3‖δ‖((‖ŷ‖+‖δ‖)² + Σc_i‖q_i‖²)/l3
        dy = rounding.gamma(self.subspace.d + 2) * a1
        e3 = clipping.e3_norm(X, lengths) + 3.0 * dy * ((ynorm + dy) ** 2 + crn2) / l3
        n_s3 = np.minimum(e3, tri)
        l2 = lengths * (lengths - 1)
        # pre-cancellation magnitudes: s1 = Qᵀm1, z = Zacc − a2Q, s2 = Qᵀz, s3 = t3 − P + 2D
        mag_s1 = a1 / lengths
        mag_z = np.maximum(clipping.projected_e2_magnitude(X, lengths, Y, rn2),
                           (a1 * ynorm + crn2) / l2)
        k = MAGNITUDE_FACTOR
        return clipping.scale_factor(
            {"m1": n_m1, "z": n_z, "s3": n_s3, "m1_mag": mag_s1, "z_mag": mag_z, "s3_mag": tri},
            {"m1": c.m1, "z": c.z, "s3": c.s3,
             "m1_mag": k * c.m1, "z_mag": k * c.z, "s3_mag": k * c.s3})

    # ------------------------------------------------------------------- merge
    def _check_compatible(self, other: "WhitenedSketch") -> None:
        if other.subspace.id != self.subspace.id:
            raise ValueError("cannot merge sketches built on different subspaces "
                             f"({self.subspace.id} vs {other.subspace.id})")
        if other.clip != self.clip:
            raise ValueError(f"cannot merge sketches with different clip bounds "
                             f"({self.clip} vs {other.clip}): their sensitivities differ")

    def merge(self, other: "WhitenedSketch") -> "WhitenedSketch":
        """Add another sketch (disjoint documents) into this one (compensated).

        Determinism rule: each side's pending rows are processed as that side's own final
        chunk first (``other`` on a copy; pending rows of two sketches are never put in one
        chunk), so the result depends only on the two document sequences and the merge order.
        """
        self._check_compatible(other)
        self._flush_pending()
        if other.pending.n:
            other = other.copy()
            other._flush_pending()
        self.acc.merge(other.acc)
        self.n_docs += other.n_docs
        self.n_rows += other.n_rows
        self._n_clipped += other._n_clipped      # other: flushed above
        return self

    def copy(self) -> "WhitenedSketch":
        """An independent copy of the whole state (accumulators, counters, pending rows)."""
        out = WhitenedSketch(self.subspace, self.clip)
        out.n_docs, out.n_rows, out._n_clipped = self.n_docs, self.n_rows, self._n_clipped
        out.acc = self.acc.copy()
        return out

    # -------------------------------------------------------------------- read
    def value(self, name: str) -> np.ndarray:
        """An accumulator's value: the compensated pair rounded once."""
        return self.acc.value(name)

    def sums(self) -> SketchSums:
        """Expand the accumulators into the block sums (O(d·k'³)).

        Products over words run on ≤ READ_CHUNK_MAX rows at a time, chunks added compensated.
        Pending rows are processed as one final chunk on a copy: the sketch is not changed, so
        reading twice, or reading and then adding more documents, gives the same sums as
        adding everything first.
        """
        if self.pending.n:
            work = self.copy()
            work._flush_pending()
            return work.sums()
        Q = self.subspace.Q
        d, k = Q.shape
        m1, a2, a3 = self.value("m1"), self.value("a2"), self.value("a3")
        b3 = self.value("b3")
        z = self.value("zacc") - a2[:, None] * Q
        s1, s1_lo = np.zeros(k), np.zeros(k)
        s2, s2_lo = np.zeros((k, k)), np.zeros((k, k))
        # P[a,b,c] = Σ_i Q_ia Q_ib B3_ic and D[a,b,c] = Σ_i a3_i Q_ia Q_ib Q_ic are symmetric
        # in (a, b): only the pairs a ≤ b are computed (half the O(d·k'³) work, which dominates
        # a release at large d; issue 13), both in one product per chunk of words, chunks
        # small enough that the d × k'(k'+1)/2 Khatri–Rao block stays small.
        ia, ib = np.triu_indices(k)
        PD, PD_lo = np.zeros((len(ia), 2 * k)), np.zeros((len(ia), 2 * k))
        step = max(1, min(READ_CHUNK_MAX, _KR_ELEMENTS // len(ia)))
        for s in range(0, d, step):
            Qs = Q[s:s + step]
            rounding.accumulate(s1, s1_lo, Qs.T @ m1[s:s + step])
            rounding.accumulate(s2, s2_lo, Qs.T @ z[s:s + step])
            kr = Qs[:, ia] * Qs[:, ib]                       # rows: q_i,a · q_i,b for a ≤ b
            rhs = np.concatenate([b3[s:s + step], Qs * a3[s:s + step, None]], axis=1)
            rounding.accumulate(PD, PD_lo, kr.T @ rhs)
        s1 = rounding.collapse(s1, s1_lo)
        s2 = rounding.collapse(s2, s2_lo)
        s2 = 0.5 * (s2 + s2.T)
        PD = rounding.collapse(PD, PD_lo)
        P, D = np.empty((k, k, k)), np.empty((k, k, k))
        P[ia, ib], P[ib, ia] = PD[:, :k], PD[:, :k]
        D[ia, ib], D[ib, ia] = PD[:, k:], PD[:, k:]
        # term order: q⊗q⊗B → P[a,b,c]; q⊗B⊗q → P[a,c,b]; B⊗q⊗q → P[b,c,a]
        yyy = symmetric3.expand(self.value("t3"), k)     # the full symmetric tensor
        s3 = (yyy
              - (P + P.transpose(0, 2, 1) + P.transpose(2, 0, 1)) + 2.0 * D)
        return SketchSums(count=self.weight_sum + self.weight_sum_lo, m1=m1, z=z, s1=s1, s2=s2,
                          s3=s3, n_docs=self.n_rows)

    @property
    def nbytes(self) -> int:
        return self.acc.nbytes

    # --------------------------------------------------------------- serialise
    def to_dict(self) -> dict:
        return {"kind": "whitened_sketch", "v": SCHEMA_VERSION,
                "subspace_id": self.subspace.id, "clip": self.clip.to_dict(),
                "n_docs": self.n_docs, "n_rows": self.n_rows, "n_clipped": self._n_clipped,
                "weight_sum": self.weight_sum, "weight_sum_lo": self.weight_sum_lo,
                "acc": {n: ser.pack_array(getattr(self, n)) for n in _ACCUMULATORS},
                "comp": {n: ser.pack_array(self.comp[n]) for n in _ACCUMULATORS},
                # rows of the partial last chunk (n_docs already counts them), their weights
                **self.acc.rows_to_dict()}

    def to_bytes(self) -> bytes:
        return ser.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, obj: dict, subspace: Subspace) -> "WhitenedSketch":
        obj = ser.upgrade(obj, "whitened_sketch", SCHEMA_VERSION,
                          {1: lambda o: _sketch_v1_to_v2(o, subspace.dim)})
        ser.require(obj, "whitened_sketch", "subspace_id", "clip", "acc", "comp", "n_docs",
                    "n_rows", "n_clipped", "weight_sum", "weight_sum_lo", "pending")
        if obj["subspace_id"] != subspace.id:
            raise ser.SchemaError(f"sketch was built on subspace {obj['subspace_id']}, "
                                  f"not on {subspace.id}")
        out = cls(subspace, ClipBounds.from_dict(obj["clip"]))
        for n in _ACCUMULATORS:
            a = ser.unpack_array(obj["acc"][n], name=n)
            if a.shape != getattr(out, n).shape:
                raise ser.SchemaError(f"sketch block {n}: shape {a.shape}, expected {getattr(out, n).shape}")
            setattr(out, n, a.astype(np.float64, copy=False))
            c = ser.unpack_array(obj["comp"][n], name=f"comp.{n}")
            if c.shape != a.shape:
                raise ser.SchemaError(f"sketch compensation {n}: shape {c.shape}, expected {a.shape}")
            out.comp[n] = c.astype(np.float64, copy=True)
        out.n_docs = int(obj["n_docs"])
        out.n_rows = int(obj["n_rows"])
        out._n_clipped = int(obj["n_clipped"])      # processed chunks; pending recounted
        out.acc.hi["count"] = np.array(float(obj["weight_sum"]))
        out.acc.lo["count"] = np.array(float(obj["weight_sum_lo"]))
        out.acc.load_rows(obj)
        return out

    @classmethod
    def from_bytes(cls, data: bytes, subspace: Subspace) -> "WhitenedSketch":
        return cls.from_dict(ser.loads(data), subspace)


def _sketch_v1_to_v2(obj: dict, k: int) -> dict:
    """A v1 sketch state as v2 (the one migration of this kind): t3 and its compensation over
    (a, pair b ≤ c) become packed entries (each keeps the same stored pair); what v1 states
    written before the rounding work lack is filled as it was then — no compensation (their
    value is exact as is), every row a long document (n_rows = n_docs), no pending rows
    (their chunks were all processed)."""
    out = dict(obj, acc=dict(obj["acc"]))
    out["acc"]["t3"] = _t3_from_pair_layout(obj["acc"]["t3"], k)
    if "comp" in obj:
        out["comp"] = dict(obj["comp"], t3=_t3_from_pair_layout(obj["comp"]["t3"], k))
    else:
        out["comp"] = {n: ser.pack_array(np.zeros_like(ser.unpack_array(a, name=n)))
                       for n, a in out["acc"].items()}
    out.setdefault("n_rows", obj["n_docs"])
    out.setdefault("weight_sum_lo", 0.0)
    out.setdefault("pending", {"n": 0})
    return out


def _t3_from_pair_layout(packed: dict, k: int) -> dict:
    """A v1 state's t3 (k', k'(k'+1)/2), packed as the distinct entries."""
    try:
        t3 = symmetric3.from_pair_layout(ser.unpack_array(packed, name="t3"), k)
    except ValueError as e:
        raise ser.SchemaError(f"sketch block t3 (v1 layout): {e}") from None
    return ser.pack_array(t3)


def weighted_rows(X: sp.csr_matrix, weights):
    """(X, w) without the rows of weight 0; ``w`` None when no weights were given."""
    if weights is None:
        return X, None
    w = np.asarray(weights, dtype=np.float64).ravel()
    if w.shape[0] != X.shape[0]:
        raise ValueError(f"{X.shape[0]} documents but {w.shape[0]} weights")
    if not np.all((w >= 0) & (w <= 1)):
        raise ValueError("user-level weights must be in [0, 1]")
    keep = w > 0
    if not keep.all():
        X, w = X[keep], w[keep]
    return X, w


def keep_long_weighted(X: sp.csr_matrix, w: np.ndarray | None):
    """:func:`keep_long_documents` carrying the weights along: (X, w)."""
    if w is None:
        return keep_long_documents(X)[0], None
    keep = np.asarray(X.sum(axis=1)).ravel() >= MIN_DOC_LENGTH
    return (X, w) if keep.all() else (X[keep], w[keep])
