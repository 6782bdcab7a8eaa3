"""Open per-epoch sketches of a continual release: stream documents routed to the epoch of their
own timestamp, and, with refinement, folded into their epoch's model (or held until it is
decided); closing an epoch hands over its :class:`~streamdp.epoch_sums.EpochSums`."""
from __future__ import annotations

import numpy as np

from streamdp.documents import as_count_batch
from streamdp.epoch_sums import EpochSums
from streamdp.moments.clipping import ClipBounds
from streamdp.moments.sketch import WhitenedSketch
from streamdp.privacy.epochs import WARMUP_EPOCH, EpochClock
from streamdp.refinement import (DEFAULT_MODEL_LAG, FoldInModels, RefinementModel,
                                 RefinementSketch)
from streamdp.whitening.subspace import Subspace


class EpochSketches:
    """Open per-epoch sketches: stream documents routed by their own timestamp.

    Documents whose epoch is already closed are *late*: dropped and counted in
    ``late_documents`` (moving them to another epoch would change their atom).
    Warm-up-timestamped documents arriving here are late too.

    Refinement (``n_topics`` given): a document of epoch e is folded into the model of the
    snapshot of epoch e − L (:func:`streamdp.refinement.model_epoch_for`, L = ``model_lag``),
    never into whatever model is newest when it arrives. A document whose model is not
    decided yet (epoch e − L still open) is *held* — its counts kept in arrival order — and
    folded by :meth:`model_released` when the caller closes e − L and hands over its model,
    before any later document of the same epoch: each epoch's refinement sums see their
    documents in arrival order whatever the calls' batches.
    """

    def __init__(self, subspace: Subspace, clip: ClipBounds, clock: EpochClock,
                 n_topics: int | None = None, model_lag: int = DEFAULT_MODEL_LAG) -> None:
        self.subspace, self.clip, self.clock = subspace, clip, clock
        self.n_topics = n_topics          # None: no refinement sums
        self.open: dict[int, WhitenedSketch] = {}
        self.refine: dict[int, RefinementSketch] = {}
        self.models = FoldInModels(model_lag)
        self.held: dict[int, list] = {}     # epoch -> (counts, weights) awaiting their model
        self.closed_through = 0
        self.late_documents = 0

    def add(self, X, timestamps, weights=None) -> "EpochSketches":
        """Route documents to their epochs; with refinement also fold them into their epoch's
        model (:class:`FoldInModels`), or hold them until it is decided.
        ``weights``: user-level weights, one per row (streamdp.privacy.user_bounding)."""
        X = as_count_batch(X, self.subspace.d)
        ts = np.asarray(timestamps, dtype=np.float64).ravel()
        if ts.shape[0] != X.shape[0]:
            raise ValueError(f"{X.shape[0]} documents but {ts.shape[0]} timestamps")
        epochs = self.clock.epochs(ts)
        for e in np.unique(epochs):
            rows = np.flatnonzero(epochs == e)
            if e == WARMUP_EPOCH or e <= self.closed_through:
                self.late_documents += rows.size
                continue
            sk = self.open.get(int(e))
            if sk is None:
                sk = self.open[int(e)] = WhitenedSketch(self.subspace, self.clip)
            w = None if weights is None else np.asarray(weights, dtype=np.float64)[rows]
            sk.update(X[rows], weights=w)
            if self.n_topics is not None:
                self._refine(int(e), X[rows], w)
        return self

    def _refine(self, e: int, X, w=None) -> None:
        if e in self.held or not self.models.decided(e):
            self.held.setdefault(e, []).append((X, w))   # after any earlier held ones: in order
            return
        model = self.models.model_for(e)
        if model is None:
            return                                     # e − L < 1: no refinement term
        rs = self.refine.get(e)
        if rs is None:
            rs = self.refine[e] = RefinementSketch(self.n_topics, self.subspace.d)
        rs.update(X, model, weights=w)

    def model_released(self, snap, fold_in_iter: int = 5) -> None:
        """Epoch ``snap.epoch`` is closed and released as ``snap`` (a TopicSnapshot, or a
        RefinementModel with its epoch): keep its model (:meth:`FoldInModels.add_snapshot`)
        and fold every held document whose model is now decided, in arrival order."""
        if isinstance(snap, RefinementModel):
            self.models.released(snap, self.closed_through)
        else:
            self.models.add_snapshot(snap, fold_in_iter, self.closed_through)
        for e in sorted(self.held):
            if self.models.decided(e):
                for X, w in self.held.pop(e):
                    self._refine(e, X, w)

    def pop_through(self, epoch: int) -> list[tuple[int, EpochSums | None]]:
        """Close epochs closed_through+1 … epoch in order; empty ones give None."""
        out = []
        for e in range(self.closed_through + 1, int(epoch) + 1):
            if e in self.held:
                raise RuntimeError(
                    f"epoch {e} has documents still waiting for their refinement model (the "
                    f"snapshot of epoch {self.models.model_epoch(e)}): close epochs one at a time "
                    "and pass each snapshot's model to model_released() before the next")
            sk, rs = self.open.pop(e, None), self.refine.pop(e, None)
            if sk is None:
                out.append((e, None))
                continue
            hi, lo = (None, None) if rs is None else rs.total()
            out.append((e, EpochSums(sk.sums(), hi, lo)))
        self.closed_through = max(self.closed_through, int(epoch))
        return out
