"""Plausibility of a sketcher's sums before the release service noises them (pure, no Kafka).

The noise of a release is calibrated to the clip bounds: one document moves block b by at most
Δ_b (:func:`streamdp.privacy.sensitivity.block_sensitivities`). The release service cannot re-check that each
document was clipped, since it never sees documents. What it can check is the consequence for the
sums: a sum over n documents, each scaled into its bound (scale and user weight ≤ 1), satisfies

    0 ≤ count ≤ n,   ‖block_b‖_F ≤ n·Δ_b     (triangle inequality; Δ_b covers the rounding)

and the identities of the blocks' definitions hold, up to rounding:

    m1 ≥ 0 and Σ_w m1_w = count   (each c/l has non-negative entries summing to 1)
    s1 = Qᵀ m1,  s2 = Qᵀ z        (linearity; Q the deployment's subspace)

for every block (count, m1, s1, z, s2, s3; the refinement sums with Δ = 1; the warm-up range sum
with the deployment's warm-up clip, and its norm histogram with one entry per document per
row). A sum that breaks one was not built by the clipping code: a buggy sketcher, or someone who
wrote the state topic. The check is necessary, not sufficient: a writer who puts n·C_b of mass
into one document's share passes it (docs/privacy.md §Trust boundary). ``SLACK`` only absorbs the
float64 rounding of the norm computation itself.

Each function returns None (plausible) or a sentence saying which bound broke.
"""
from __future__ import annotations

import math

import numpy as np

from streamdp.moments.clipping import ClipBounds
from streamdp.privacy.sensitivity import block_sensitivities
from streamdp.refinement import refinement_sensitivity

#: relative slack on every bound (the norm's own float64 rounding; documents are never this close)
SLACK = 1e-6


def _norm(a) -> float:
    a = np.asarray(a, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        return math.inf
    return float(np.linalg.norm(a.ravel()))


def _rows(n, what: str) -> tuple[int | None, str | None]:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        return None, f"{what}: n_docs {n!r} is not a count"
    return int(n), None


def _over(name: str, value: float, n: int, per_doc: float) -> str | None:
    bound = n * per_doc * (1 + SLACK)
    if not value <= bound:                 # NaN/inf fail too
        return (f"block {name}: ‖sum‖ = {value:.6g} > n_docs·Δ = {n}·{per_doc:.6g} "
                f"(the documents cannot have been clipped to the release's bounds)")
    return None


def _differ(name: str, got, want, scale: float) -> str | None:
    err = _norm(np.asarray(got, dtype=np.float64) - np.asarray(want, dtype=np.float64))
    if not err <= SLACK * scale + 1e-12:
        return f"block {name} is not what its definition gives from the other blocks (off by {err:.6g})"
    return None


def check_epoch_sums(sums, clip: ClipBounds, max_documents: int, Q=None) -> str | None:
    """``sums``: a partition's :class:`~streamdp.moments.sketch.SketchSums` of one epoch;
    ``Q`` (d × k'), the deployment's subspace basis, enables the identities s1 = Qᵀm1, s2 = Qᵀz."""
    n, why = _rows(sums.n_docs, "epoch sums")
    if why:
        return why
    count = float(sums.count)
    if not (math.isfinite(count) and -SLACK <= count <= n * (1 + SLACK)):
        return f"block count: {count!r} is not within [0, n_docs = {n}]"
    sens = block_sensitivities(clip, max_documents=max_documents)
    for name in ("m1", "s1", "z", "s2", "s3"):
        why = _over(name, _norm(getattr(sums, name)), n, sens[name])
        if why:
            return why
    m1 = np.asarray(sums.m1, dtype=np.float64)
    if m1.size and (m1.min() < -SLACK * max(n, 1) * sens["m1"]):
        return f"block m1: a negative entry {m1.min():.6g} (every c/l is non-negative)"
    why = _differ("m1 (Σ m1 = count)", m1.sum(), count, max(n, 1))
    if why is None and Q is not None:
        why = (_differ("s1 (= Qᵀm1)", sums.s1, Q.T @ m1, max(n, 1) * sens["m1"])
               or _differ("s2 (= Qᵀz)", sums.s2, Q.T @ np.asarray(sums.z), max(n, 1) * sens["z"]))
    return why


def check_refine_sums(sums: np.ndarray, n_docs, max_documents: int) -> str | None:
    """A partition's refinement sums (k × d) of one epoch over ``n_docs`` documents."""
    n, why = _rows(n_docs, "refinement sums")
    if why:
        return why
    sums = np.asarray(sums, dtype=np.float64)
    if sums.size and not sums.min() >= -SLACK * max(n, 1):
        return "refinement sums: a negative entry (every R_d = c·r/‖c‖ is non-negative)"
    return _over("topic_word", _norm(sums), n, refinement_sensitivity(max_documents))


def check_warmup(w, warmup_clip: float, max_documents: int) -> str | None:
    """A partition's :class:`~streamdp.whitening.warmup.WarmupSketch`, which must be clipped
    with the deployment's ``warmup_clip`` (its own ``clip`` field is the writer's claim)."""
    n, why = _rows(w.n_docs, "warm-up")
    if why:
        return why
    if float(w.clip) != float(warmup_clip):
        return f"warm-up clip {w.clip!r} is not the deployment's warmup_clip {warmup_clip!r}"
    hist = np.asarray(w.norm_hist, dtype=np.float64)
    if not np.all(np.isfinite(hist)) or np.any(hist < 0) or np.any(hist.sum(axis=1) > n * (1 + SLACK)):
        return f"warm-up norm histogram: a row holds more than n_docs = {n} documents or a negative count"
    sens = block_sensitivities(ClipBounds(1.0, 1.0, 1.0, float(warmup_clip)),
                               max_documents=max_documents)["warmup"]
    return _over("warmup", _norm(w.range_sum()), n, sens)
