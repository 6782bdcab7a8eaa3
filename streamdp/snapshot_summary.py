"""A topic snapshot as plain JSON: ``streamdp topics --json``, the release service's
``latest.json`` and ``GET /snapshot/latest`` (docs/consumers.md).

Pure post-processing of a released snapshot. It sits beside :mod:`streamdp.snapshot`, below
both the release service that writes it and the reader library :mod:`streamdp.snapshots`
that exports it.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from streamdp.snapshot import TopicSnapshot

#: Version of the JSON summary (:func:`summary`: ``streamdp topics --json``, ``GET /snapshot/latest``).
SUMMARY_VERSION = 1


def privacy_summary(privacy: dict) -> dict:
    """The guarantee a snapshot was released under, in a few stable keys (the full report stays
    in ``snap.privacy``, documented in docs/privacy.md)."""
    non_private = bool(privacy.get("non_private")) or (
        privacy.get("mechanism") == "none" and privacy.get("epsilon") is None)
    insecure = bool(privacy.get("insecure_reproducible_noise")) or "INSECURE" in str(
        privacy.get("sampler"))
    if non_private:
        warning = "NON-PRIVATE snapshot (no clipping, no noise): no privacy guarantee"
    elif insecure:
        warning = (f"INSECURE reproducible noise ({privacy.get('sampler')}): no privacy "
                   "guarantee")
    else:
        warning = None
    return {"private": not non_private and not insecure and privacy.get("epsilon") is not None,
            "epsilon": privacy.get("epsilon"), "delta": privacy.get("delta"),
            "unit": privacy.get("unit"), "neighbouring": privacy.get("neighbouring"),
            "epochs_covered": privacy.get("epochs_covered"), "horizon": privacy.get("horizon"),
            "warning": warning}


def summary(snap: TopicSnapshot, vocabulary: Sequence[str] | None = None, n: int = 10) -> dict:
    """The snapshot as plain JSON (``streamdp topics --json``; the release service's
    ``latest.json`` and ``GET /snapshot/latest``). Keys are stable within ``v``
    (docs/consumers.md); non-finite numbers are ``null``."""
    if vocabulary is not None:
        tops = snap.top_words(vocabulary, n)
        topics = [[{"word": w, "p": p} for w, p in top] for top in tops]
    else:
        topics = [[{"word": None, "p": float(row[j])}
                   for j in np.argsort(-row, kind="stable")[:n]] for row in snap.topic_word]
    # the column id of each word: readers with their own copy of the vocabulary need no words
    for row, top in zip(snap.topic_word, topics):
        for entry, j in zip(top, np.argsort(-row, kind="stable")[:n]):
            entry["id"] = int(j)
    return _jsonable({
        "kind": "topic_summary", "v": SUMMARY_VERSION, "schema_version": snap.schema_version,
        "release_id": snap.release_id, "epoch": snap.epoch, "created_at": snap.created_at,
        "stage": snap.stage, "topic_source": snap.topic_source,
        "mechanism": snap.mechanism, "subspace_id": snap.subspace_id,
        "vocabulary_id": snap.vocabulary_id, "n_docs": snap.n_docs, "n_topics": snap.n_topics,
        "alpha": snap.alpha, "noise_to_signal": snap.noise_to_signal,
        "quality_note": snap.quality_note, "topics": topics,
        # issue 22: per-topic distinct / background / near-copy flag from released values
        "topic_flags": [f.to_dict() for f in snap.topic_flags], "n_distinct": snap.n_distinct,
        "distinct_note": snap.distinct_note,
        "documents_to_tell_apart": snap.documents_to_tell_apart,
        "topic_change": snap.topic_change, "new_topics": snap.new_topics,
        "guarantee": privacy_summary(snap.privacy), "privacy": snap.privacy})


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, (bytes, bytearray)):
        return obj.hex()
    return obj
