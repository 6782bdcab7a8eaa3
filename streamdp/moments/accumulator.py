"""One chunked, compensated accumulator: the summation that the moment sketch, the warm-up
sketch and the refinement sketch share (docs/privacy.md, "Floating point").

Why chunks: the rounding of a chunk's sum depends on which documents share the chunk.
Counting chunks of exactly ``chunk`` rows in the owner's *own* document sequence (not per
``update`` call) makes every sum a deterministic function of that sequence, whatever the
callers' batches. Why compensated: every accumulator is a pair (hi, lo) whose value is
hi + lo, updated with TwoSum (Sum2, :func:`streamdp.privacy.rounding.accumulate`), so the
rounding error of a sum of ≤ N_max chunks stays within the proven bound R_b.

The open (partial, last) chunk is held in one of two ways, chosen by the owner:

- **rows** (``rows_of=d``): the open chunk's rows wait, with their user-level weights, until
  later rows complete it; the owner computes a chunk's contributions when it closes (the
  moment and warm-up sketches: a chunk's sums depend on its rows alone);
- **running sums** (``rows_of=None``): the owner adds each row's terms to the open chunk's
  running sums as it arrives (the refinement sketch: a document is folded into the model of
  the moment it arrives, so the open chunk needs no model).

Either way the open chunk is as secret as the sums and is checkpointed with them; readers
close it on a copy, so reading never changes the accumulator.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np
import scipy.sparse as sp

from streamdp import serialization as ser
from streamdp.documents import PendingRows
from streamdp.privacy import rounding

#: ``update(rows, weights)``: the owner's sums of one chunk, added with :meth:`add`
ChunkUpdate = Callable[[sp.csr_matrix, np.ndarray], None]


class ChunkedAccumulator:
    """Named compensated sums of one document sequence cut into chunks of ``chunk`` rows.

    Parameters
    ----------
    shapes : {name: shape}   the accumulators (shape ``()`` for a scalar sum)
    chunk : int              rows per chunk, counted in this sequence
    rows_of : int, optional  vocabulary size d: the open chunk is held as rows (see module)

    Attributes
    ----------
    hi, lo : {name: array}   the compensated pairs of the closed chunks (value = hi + lo)
    pending : PendingRows    rows mode: the open chunk's rows (``pending_weights`` theirs)
    open : {name: array}     running-sums mode: the open chunk's sums (None when empty)
    open_rows : int          rows in the open chunk
    """

    def __init__(self, shapes: Mapping[str, tuple], chunk: int, rows_of: int | None = None) -> None:
        self.chunk = int(chunk)
        self.hi = {n: np.zeros(s) for n, s in shapes.items()}
        self.lo = {n: np.zeros(s) for n, s in shapes.items()}
        self.pending = None if rows_of is None else PendingRows(rows_of, self.chunk)
        self.pending_weights = np.ones(0)
        self.open: dict[str, np.ndarray] | None = None
        self._open_rows = 0

    @property
    def open_rows(self) -> int:
        return self.pending.n if self.pending is not None else self._open_rows

    # ----------------------------------------------------------------- adding
    def add(self, name: str, x) -> None:
        """One compensated (Sum2) step of accumulator ``name``."""
        rounding.accumulate(self.hi[name], self.lo[name], x)

    def feed(self, X: sp.csr_matrix, weights: np.ndarray | None, update: ChunkUpdate) -> None:
        """Rows mode: cut ``X`` (weights None: all 1) at this sequence's chunk ends, call
        ``update`` on every chunk it completes and keep the rest as the open chunk."""
        self.pending_weights = self.pending.feed_weighted(X, weights, self.pending_weights,
                                                          update)

    def segments(self, n: int) -> Iterator[tuple[int, int]]:
        """Running-sums mode: the pieces ``(a, b)`` of a batch of ``n`` rows, each ending
        where this sequence's chunks end. For each piece the owner sets :attr:`open` to the
        open chunk's running sums with rows a:b added (:meth:`open_sums` gives the sums so
        far, None for a new chunk); a piece that completes the chunk closes it."""
        a = 0
        while a < n:
            b = a + min(self.chunk - self._open_rows, n - a)
            yield a, b
            self._open_rows += b - a
            if self._open_rows == self.chunk:
                self.close()
            a = b

    def open_sums(self) -> dict[str, np.ndarray] | None:
        """The open chunk's running sums (None when no row is open yet)."""
        return self.open if self._open_rows else None

    def load_open(self, sums: dict[str, np.ndarray], rows: int) -> None:
        """Running-sums mode: restore a checkpoint's open chunk (``rows`` < chunk rows)."""
        if not 0 < rows < self.chunk:
            raise ValueError(f"an open chunk has 1 to {self.chunk - 1} rows, not {rows}")
        self.open, self._open_rows = dict(sums), int(rows)

    def close(self, update: ChunkUpdate | None = None) -> None:
        """Close the open chunk as this sequence's final chunk (a merge does this): its
        running sums are added, or its rows go through ``update``."""
        if self.pending is not None:
            if self.pending.n:
                update(self.pending.take(), self.pending_weights)
                self.pending_weights = np.ones(0)
            return
        if self._open_rows and self.open is not None:
            for name, x in self.open.items():
                self.add(name, x)
        self.open, self._open_rows = None, 0

    def merge(self, other: "ChunkedAccumulator") -> None:
        """Add another sequence's sums (compensated). Each side's open chunk is its own final
        chunk, never one chunk of both: this side's and (rows mode) the other's must be
        closed already (only their owners compute a chunk's sums); the other's running sums
        are closed here, on a copy."""
        if self.open_rows or (other.pending is not None and other.pending.n):
            raise ValueError("close the open chunks before merging (each side's own final chunk)")
        other = other.closed()
        for name in self.hi:
            rounding.merge_into(self.hi[name], self.lo[name], other.hi[name], other.lo[name])

    # ---------------------------------------------------------------- reading
    def closed(self) -> "ChunkedAccumulator":
        """Running-sums mode: this accumulator with its open chunk closed, on a copy when
        there is one (self otherwise). Rows mode: the owner closes a copy itself."""
        if not self._open_rows:
            return self
        out = self.copy()
        out.close()
        return out

    def value(self, name: str) -> np.ndarray:
        """The closed chunks' sum ``name``: the compensated pair rounded once."""
        return rounding.collapse(self.hi[name], self.lo[name])

    def copy(self) -> "ChunkedAccumulator":
        out = object.__new__(ChunkedAccumulator)
        out.chunk, out._open_rows = self.chunk, self._open_rows
        out.hi = {n: v.copy() for n, v in self.hi.items()}
        out.lo = {n: v.copy() for n, v in self.lo.items()}
        out.pending = None if self.pending is None else self.pending.copy()
        out.pending_weights = self.pending_weights.copy()
        out.open = None if self.open is None else {n: v.copy() for n, v in self.open.items()}
        return out

    @property
    def nbytes(self) -> int:
        return (sum(v.nbytes for v in self.hi.values()) + sum(v.nbytes for v in self.lo.values())
                + (self.pending.nbytes if self.pending is not None else 0)
                + (sum(v.nbytes for v in self.open.values()) if self.open else 0))

    # ---------------------------------------------------------- rows' checkpoint
    def rows_to_dict(self) -> dict:
        """Rows mode: the open chunk's fields of a checkpoint: its rows (raw counts) and,
        only when some is not 1, their user-level weights."""
        out = {"pending": self.pending.to_dict()}
        if np.any(self.pending_weights != 1.0):
            out["pending_weights"] = ser.pack_array(self.pending_weights)
        return out

    def load_rows(self, obj: dict) -> None:
        """Rows mode: the open chunk of a checkpoint written by :meth:`rows_to_dict`."""
        self.pending = PendingRows.from_dict(obj["pending"], self.pending.d, self.chunk)
        self.pending_weights = _pending_weights_from(obj.get("pending_weights"), self.pending.n)


def _pending_weights_from(obj, n: int) -> np.ndarray:
    """Pending rows' weights of a checkpoint (absent: all 1, see :meth:`rows_to_dict`)."""
    if obj is None:
        return np.ones(n)
    w = ser.unpack_array(obj, name="pending_weights").astype(np.float64)
    if w.shape != (n,) or not np.all((w > 0) & (w <= 1)):
        raise ser.SchemaError(f"pending weights: {w.shape} for {n} pending rows, or out of (0, 1]")
    return w


class Part:
    """An owner's attribute for one part of its accumulator ``acc`` (``sketch.m1``: the high
    part, ``Part("yacc", low=True)``: a low part): the array itself, so in-place changes
    reach the accumulator."""

    def __init__(self, name: str | None = None, *, low: bool = False) -> None:
        self.name, self.low = name, low

    def __set_name__(self, owner, attr: str) -> None:
        self.name = self.name or attr

    def _parts(self, obj) -> dict:
        return obj.acc.lo if self.low else obj.acc.hi

    def __get__(self, obj, owner=None):
        return self if obj is None else self._parts(obj)[self.name]

    def __set__(self, obj, value) -> None:
        self._parts(obj)[self.name] = value
