"""Packed symmetric third-order sums: only the k(k+1)(k+2)/6 distinct entries of a k×k×k tensor.

The sketch's y⊗y⊗y term T[a,b,c] = Σ_n w_n y_na y_nb y_nc is symmetric in (a, b, c), so it
is stored and updated only on the index triples a ≤ b ≤ c (about 1/6 of k³; 11,480 instead of
64,000 entries at k = 40) and expanded to the full tensor when the sums are read.

Packed layout, grouped by the middle index b: for b = 0 … k−1 a C-ordered block of shape
(b + 1, k − b) holding T[a, b, c] for a ≤ b (rows) and c ≥ b (columns). Each block is one
matrix product over the documents, written straight into the packed vector:

    T[:b+1, b, b:] = (w ⊙ y_{:b+1} ⊙ y_b)ᵀ y_{b:}     (documents as the inner dimension)

The elementwise factor y_b is folded into the smaller of the two operands, so the
temporaries total ≈ k²/4 rows of length n instead of the k(k+1)/2 of a Khatri–Rao product
over pairs, and the products do ≈ k³/6·n multiply-adds instead of k·k(k+1)/2·n.

Rounding: every packed entry is a sum over the n documents of one product w·y_a·y_b·y_c
formed with three roundings (the weight product, the factor y_b, the product in the GEMM),
exactly as the pair layout did, so the rounding analysis of :mod:`streamdp.privacy.rounding`
(ROUNDING_DEPTH) is unchanged. The operations depend only on (k, n) and the data, so equal
chunks give bit-identical results (the batch-invariance premise).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np


def packed_size(k: int) -> int:
    """Number of distinct entries of a symmetric k×k×k tensor: k(k+1)(k+2)/6."""
    return k * (k + 1) * (k + 2) // 6


@lru_cache(maxsize=64)
def _offsets(k: int) -> np.ndarray:
    """Start of block b (the entries with middle index b) in the packed vector, b = 0 … k."""
    sizes = np.array([(b + 1) * (k - b) for b in range(k)], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    offsets.setflags(write=False)
    return offsets


def triples(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, c) with a ≤ b ≤ c of every packed position, in packed order."""
    a, b, c = [], [], []
    for m in range(k):
        aa, cc = np.meshgrid(np.arange(m + 1), np.arange(m, k), indexing="ij")
        a.append(aa.ravel()); b.append(np.full(aa.size, m)); c.append(cc.ravel())
    return np.concatenate(a), np.concatenate(b), np.concatenate(c)


#: documents per block of :func:`cube_sums`: the operands of one block (2·k rows of this
#: length) stay in a core's L2 cache (≈ 30% faster than one pass over 4,096 documents)
ROWS_PER_BLOCK = 1024


def cube_sums(Yt: np.ndarray, WYt: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Packed Σ_n WYt[a,n]·Yt[b,n]·Yt[c,n] over a ≤ b ≤ c.

    ``Yt`` (k, n) and ``WYt`` (k, n): one column per document (WYt = Yt scaled per document
    by its weight). Returns (or fills) a packed vector of :func:`packed_size` (k) entries.
    Documents are taken in blocks of :data:`ROWS_PER_BLOCK`, the block sums added in order:
    an entry passes ≤ ROWS_PER_BLOCK + ⌈n/ROWS_PER_BLOCK⌉ ≤ n + 1 additions.
    """
    k, n = Yt.shape
    if WYt.shape != (k, n):
        raise ValueError(f"WYt has shape {WYt.shape}, expected {(k, n)}")
    Yt = np.ascontiguousarray(Yt, dtype=np.float64)
    WYt = np.ascontiguousarray(WYt, dtype=np.float64)
    offsets = _offsets(k)
    if out is None:
        out = np.empty(packed_size(k))
    elif out.shape != (packed_size(k),) or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous vector of {packed_size(k)} entries")
    if n == 0:
        out[...] = 0.0
        return out
    step = min(n, ROWS_PER_BLOCK)
    buf = np.empty((max(1, (k + 1) // 2), step))
    part = np.empty(packed_size(k)) if n > step else out
    for s in range(0, n, step):
        e = min(n, s + step)
        # contiguous copies of the block (strided views make the products ≈ 10% slower)
        Ys, Ws, m = np.ascontiguousarray(Yt[:, s:e]), np.ascontiguousarray(WYt[:, s:e]), e - s
        target = out if s == 0 else part
        for b in range(k):
            block = target[offsets[b]:offsets[b + 1]].reshape(b + 1, k - b)
            if b + 1 <= k - b:                  # fold y_b into the (b+1)-row left operand
                left = np.multiply(Ws[:b + 1], Ys[b], out=buf[:b + 1, :m])
                np.matmul(left, Ys[b:].T, out=block)
            else:                               # fold it into the (k−b)-row right operand
                right = np.multiply(Ys[b:], Ys[b], out=buf[:k - b, :m])
                np.matmul(Ws[:b + 1], right.T, out=block)
        if s:
            out += part
    return out


def expand(packed: np.ndarray, k: int) -> np.ndarray:
    """The full symmetric (k, k, k) tensor of a packed vector (a copy)."""
    packed = np.asarray(packed)
    if packed.shape != (packed_size(k),):
        raise ValueError(f"packed vector of shape {packed.shape}, expected ({packed_size(k)},)")
    offsets = _offsets(k)
    full = np.empty((k, k, k), dtype=packed.dtype)
    for b in range(k):
        B = packed[offsets[b]:offsets[b + 1]].reshape(b + 1, k - b)    # [a, c], a ≤ b ≤ c
        # the six placements of (a, b, c); ties (a = b or b = c) write the same value twice
        full[:b + 1, b, b:] = B
        full[:b + 1, b:, b] = B
        full[b, :b + 1, b:] = B
        full[b, b:, :b + 1] = B.T
        full[b:, :b + 1, b] = B.T
        full[b:, b, :b + 1] = B.T
    return full


def pack(T: np.ndarray) -> np.ndarray:
    """The packed entries T[a,b,c], a ≤ b ≤ c, of a (k, k, k) tensor (its other entries are
    ignored)."""
    k = T.shape[0]
    if T.shape != (k, k, k):
        raise ValueError(f"expected a cubic tensor, got shape {T.shape}")
    a, b, c = triples(k)
    return T[a, b, c].copy()


def from_pair_layout(t3: np.ndarray, k: int) -> np.ndarray:
    """Packed entries from the pair layout used before (k, k(k+1)/2): row a, column = the
    position of the pair (b ≤ c) in ``np.triu_indices(k)``; keeps the a ≤ b ≤ c entries."""
    pairs = k * (k + 1) // 2
    if t3.shape != (k, pairs):
        raise ValueError(f"pair-layout t3 of shape {t3.shape}, expected {(k, pairs)}")
    col = np.full((k, k), -1, dtype=np.int64)
    j, kk = np.triu_indices(k)
    col[j, kk] = np.arange(pairs)
    a, b, c = triples(k)
    return t3[a, col[b, c]].copy()
