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
    T3   += (w3 ⊙ Y)ᵀ (Y ⊙_row Y)_{j≤k}       (Σ w3 y⊗y⊗y, one GEMM per batch; only
                                              the k'(k'+1)/2 pairs j ≤ k, y⊗y is symmetric)

and expand only when the sums are read (:meth:`WhitenedSketch.sums`, O(d·k'³)).
Per document that is O(nnz·k' + k'³) work, all of it BLAS or sparse kernels.
All accumulators are sums, so sketches of disjoint document sets merge by
addition, exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import scipy.sparse as sp

from streamdp import serialization as ser
from streamdp.documents import as_count_batch, keep_long_documents
from streamdp.moments import clipping
from streamdp.moments.clipping import ClipBounds
from streamdp.whitening.subspace import Subspace

SCHEMA_VERSION = 1

# Rows of the (batch × k'²) Khatri–Rao product materialised at once (~32 MB).
_KR_ELEMENTS = 1 << 22


@dataclass(frozen=True)
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
    """

    count: float
    m1: np.ndarray
    z: np.ndarray
    s1: np.ndarray
    s2: np.ndarray
    s3: np.ndarray

    def __add__(self, other: "SketchSums") -> "SketchSums":
        if not isinstance(other, SketchSums):
            return NotImplemented
        return SketchSums(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                             for f in fields(self)})

    def replace(self, **changes) -> "SketchSums":
        vals = {f.name: getattr(self, f.name) for f in fields(self)}
        vals.update(changes)
        return SketchSums(**vals)

    def to_dict(self) -> dict:
        out = {"count": float(self.count)}
        out.update({f.name: ser.pack_array(getattr(self, f.name))
                    for f in fields(self) if f.name != "count"})
        return out

    @classmethod
    def from_dict(cls, obj: dict) -> "SketchSums":
        return cls(count=float(obj["count"]),
                   **{n: ser.unpack_array(obj[n], name=n) for n in ("m1", "z", "s1", "s2", "s3")})


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
        Documents whose contribution was scaled down. Internal diagnostics.
    """

    def __init__(self, subspace: Subspace, clip: ClipBounds | None = None) -> None:
        if not isinstance(subspace, Subspace):
            subspace = Subspace(np.asarray(subspace))
        self.subspace = subspace
        self.clip = clip or ClipBounds.unclipped()
        d, k = subspace.d, subspace.dim
        self.n_docs = 0
        self.n_clipped = 0
        self.weight_sum = 0.0
        self.m1 = np.zeros(d)
        self.zacc = np.zeros((d, k))
        self.a2 = np.zeros(d)
        self.b3 = np.zeros((d, k))
        self.a3 = np.zeros(d)
        self._pairs = np.triu_indices(k)
        self.t3 = np.zeros((k, len(self._pairs[0])))

    # ------------------------------------------------------------------ update
    def update(self, X) -> "WhitenedSketch":
        """Add a batch of documents (CSR counts, shape (n, d)). Returns self."""
        X = as_count_batch(X, self.subspace.d)
        X, lengths = keep_long_documents(X)
        if X.shape[0] == 0:
            return self
        Q = self.subspace.Q
        Y = X @ Q                                    # (n, k') — y = Qᵀc per document
        scale = self.document_scale(X, lengths, Y)
        w1 = scale / lengths
        w2 = w1 / (lengths - 1)
        w3 = w2 / (lengths - 2)
        Xt = X.T.tocsr()
        self.m1 += Xt @ w1
        self.zacc += Xt @ (Y * w2[:, None])
        self.a2 += Xt @ w2
        W3Y = Y * w3[:, None]
        self.b3 += Xt @ W3Y
        self.a3 += Xt @ w3
        j, kk = self._pairs
        step = max(1, _KR_ELEMENTS // len(j))
        for s in range(0, Y.shape[0], step):
            Ys = Y[s:s + step]
            self.t3 += W3Y[s:s + step].T @ (Ys[:, j] * Ys[:, kk])
        self.n_docs += X.shape[0]
        self.n_clipped += int(np.count_nonzero(scale < 1.0))
        self.weight_sum += float(scale.sum())
        return self

    def document_scale(self, X: sp.csr_matrix, lengths: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """Clipping factor per document (see :mod:`streamdp.moments.clipping`)."""
        c = self.clip
        if c.m1 >= 1 and c.z >= 1 and c.s3 >= 1:
            return np.ones(X.shape[0])   # every block norm is ≤ 1: nothing to clip
        rn2 = self.subspace.row_norm2
        yy = np.einsum("ij,ij->i", Y, Y)
        ynorm = np.sqrt(yy)
        p2 = clipping.row_sums(X, X.data**2)
        n_m1 = np.sqrt(p2) / lengths
        n_z = clipping.projected_e2_norm(X, lengths, Y, self.subspace.Q, rn2)
        tri = (yy * ynorm + 3.0 * ynorm * (X @ rn2) + 2.0 * (X @ rn2**1.5)) / (
            lengths * (lengths - 1) * (lengths - 2))
        n_s3 = np.minimum(clipping.e3_norm(X, lengths), tri)
        return clipping.scale_factor({"m1": n_m1, "z": n_z, "s3": n_s3},
                                     {"m1": c.m1, "z": c.z, "s3": c.s3})

    # ------------------------------------------------------------------- merge
    def _check_compatible(self, other: "WhitenedSketch") -> None:
        if other.subspace.id != self.subspace.id:
            raise ValueError("cannot merge sketches built on different subspaces "
                             f"({self.subspace.id} vs {other.subspace.id})")
        if other.clip != self.clip:
            raise ValueError(f"cannot merge sketches with different clip bounds "
                             f"({self.clip} vs {other.clip}): their sensitivities differ")

    def merge(self, other: "WhitenedSketch") -> "WhitenedSketch":
        """Add another sketch (disjoint documents) into this one, exactly."""
        self._check_compatible(other)
        for name in _ACCUMULATORS:
            getattr(self, name).__iadd__(getattr(other, name))
        self.n_docs += other.n_docs
        self.n_clipped += other.n_clipped
        self.weight_sum += other.weight_sum
        return self

    def copy(self) -> "WhitenedSketch":
        out = WhitenedSketch(self.subspace, self.clip)
        return out.merge(self)

    # -------------------------------------------------------------------- read
    def sums(self) -> SketchSums:
        """Expand the accumulators into the block sums (O(d·k'³))."""
        Q = self.subspace.Q
        d, k = Q.shape
        z = self.zacc - self.a2[:, None] * Q
        s2 = Q.T @ z
        s2 = 0.5 * (s2 + s2.T)
        s1 = Q.T @ self.m1
        # P[a,b,c] = Σ_i Q_ia Q_ib B3_ic and D[a,b,c] = Σ_i a3_i Q_ia Q_ib Q_ic,
        # in chunks of words so the d × k'² Khatri–Rao block stays small.
        P = np.zeros((k * k, k))
        D = np.zeros((k * k, k))
        step = max(1, _KR_ELEMENTS // (k * k))
        for s in range(0, d, step):
            kr = khatri_rao_rows(Q[s:s + step], Q[s:s + step])
            P += kr.T @ self.b3[s:s + step]
            D += kr.T @ (Q[s:s + step] * self.a3[s:s + step, None])
        P = P.reshape(k, k, k)
        D = D.reshape(k, k, k)
        # term order: q⊗q⊗B → P[a,b,c]; q⊗B⊗q → P[a,c,b]; B⊗q⊗q → P[b,c,a]
        yyy = np.empty((k, k, k))
        j, kk = self._pairs
        yyy[:, j, kk] = self.t3
        yyy[:, kk, j] = self.t3
        s3 = (yyy
              - (P + P.transpose(0, 2, 1) + P.transpose(2, 0, 1)) + 2.0 * D)
        return SketchSums(count=self.weight_sum, m1=self.m1.copy(), z=z, s1=s1, s2=s2, s3=s3)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, n).nbytes for n in _ACCUMULATORS)

    # --------------------------------------------------------------- serialise
    def to_dict(self) -> dict:
        return {"kind": "whitened_sketch", "v": SCHEMA_VERSION,
                "subspace_id": self.subspace.id, "clip": self.clip.to_dict(),
                "n_docs": self.n_docs, "n_clipped": self.n_clipped,
                "weight_sum": self.weight_sum,
                "acc": {n: ser.pack_array(getattr(self, n)) for n in _ACCUMULATORS}}

    def to_bytes(self) -> bytes:
        return ser.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, obj: dict, subspace: Subspace) -> "WhitenedSketch":
        ser.check_header(obj, "whitened_sketch", SCHEMA_VERSION)
        if obj.get("subspace_id") != subspace.id:
            raise ser.SchemaError(f"sketch was built on subspace {obj.get('subspace_id')}, "
                                  f"not on {subspace.id}")
        out = cls(subspace, ClipBounds.from_dict(obj["clip"]))
        for n in _ACCUMULATORS:
            a = ser.unpack_array(obj["acc"][n], name=n)
            if a.shape != getattr(out, n).shape:
                raise ser.SchemaError(f"sketch block {n}: shape {a.shape}, expected {getattr(out, n).shape}")
            setattr(out, n, a.astype(np.float64, copy=False))
        out.n_docs = int(obj["n_docs"])
        out.n_clipped = int(obj["n_clipped"])
        out.weight_sum = float(obj["weight_sum"])
        return out

    @classmethod
    def from_bytes(cls, data: bytes, subspace: Subspace) -> "WhitenedSketch":
        return cls.from_dict(ser.loads(data), subspace)
