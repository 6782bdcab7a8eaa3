"""The refinement-model rule (docs/privacy.md §The refinement model rule): which public
model a stream document of epoch e is folded into — the snapshot of epoch e − L — and
whether that model is decided yet. Public: the document's own epoch, the lag and whether the
start is public decide it, never when the document arrived or other documents.
"""
from __future__ import annotations


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


class ModelNotDecided(RuntimeError):
    """A document's model (:func:`model_epoch_for`) is not decided yet: its caller must hold it."""
