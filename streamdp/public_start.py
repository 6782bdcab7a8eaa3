"""``streamdp.PublicStart``: a public start that can also be fitted on public documents.

The start's data and the start rule live in :mod:`streamdp.start`, below the estimator, which
reads them; fitting a public start runs the estimator itself (non-private), so that one
constructor lives here, above it, and the import graph keeps no cycle (docs/architecture.md).
"""
from __future__ import annotations

from streamdp import start
from streamdp.documents import as_count_batch
from streamdp.fitting import fit


class PublicStart(start.PublicStart):
    __doc__ = start.PublicStart.__doc__

    @classmethod
    def fit(cls, public_counts, n_topics: int, *, source: str, alpha0: float = 1.0,
            seed: int | None = None, warmup_fraction: float = 0.3, **kwargs) -> "PublicStart":
        """Fit topics on public documents with :func:`streamdp.fit` without privacy (warm-up
        the first ``warmup_fraction`` of the rows; the refinement at its defaults)."""
        X = as_count_batch(public_counts)
        n = X.shape[0]
        n_warm = min(max(int(round(warmup_fraction * n)), 1), n - 1)
        if n < 2:
            raise ValueError("a public start needs at least 2 public documents")
        snap = fit(X, n_topics, alpha0=alpha0, warmup_docs=n_warm, seed=seed, non_private=True,
                   **kwargs)
        return cls(snap.topic_word, snap.alpha, source, n, {"release_id": snap.release_id})
