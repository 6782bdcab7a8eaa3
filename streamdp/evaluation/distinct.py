"""Topics a reader can tell apart (issue 22): the one definition, used by the benchmarks and by
the per-topic flags a snapshot carries.

A topic is **background** when ``max_background`` (5) or more of its top-``topn`` (10) words are
among the ``topn`` most frequent words of the corpus (``background``: any vector over the
vocabulary whose order ranks the words by frequency — the corpus's word counts in a benchmark,
the released background distribution in a snapshot). Otherwise it is a **near-copy of j** when
its top-``topn`` has Jaccard similarity ≥ ``max_jaccard`` (0.5) with the top-``topn`` of an
earlier *distinct* topic j; otherwise it is **distinct**. Topics are taken in index order, so the
count is that of the issue: "fewer than 5 of its top-10 words among the corpus's 10 most frequent
words, and Jaccard < 0.5 with every distinct topic already counted".

Pure post-processing: from released topic-word rows and a released background, the flags cost
no budget. Ties in a row are broken by the lower word index (stable), so the flags are a
deterministic function of the values.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DISTINCT = "distinct"
BACKGROUND = "background"
NEAR_COPY = "near_copy"

TOPN = 10
MAX_BACKGROUND = 5
MAX_JACCARD = 0.5


@dataclass(frozen=True)
class TopicFlag:
    """One topic's flag: ``kind`` ∈ {distinct, background, near_copy}; ``copy_of`` is the
    distinct topic it repeats (near_copy only); ``n_background`` how many of its top words are
    background words; ``max_jaccard`` its largest top-word overlap with an earlier distinct
    topic."""
    kind: str
    copy_of: int | None
    n_background: int
    max_jaccard: float

    def to_dict(self) -> dict:
        return {"kind": self.kind, "copy_of": self.copy_of, "n_background": self.n_background,
                "max_jaccard": round(self.max_jaccard, 6)}


def _top(row: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n largest entries, largest first, ties by lower index."""
    return np.argsort(-np.asarray(row, dtype=np.float64), kind="stable")[:n]


def topic_flags(topic_word, background, *, topn: int = TOPN, max_background: int = MAX_BACKGROUND,
                max_jaccard: float = MAX_JACCARD) -> list[TopicFlag]:
    """Flags for each row of ``topic_word`` (k × d) against ``background`` (d,). See module."""
    B = np.asarray(topic_word, dtype=np.float64)
    if B.ndim != 2:
        raise ValueError(f"topic_word must be 2-D (k × d), got shape {B.shape}")
    bg = np.asarray(background, dtype=np.float64).ravel()
    if bg.shape[0] != B.shape[1]:
        raise ValueError(f"background has {bg.shape[0]} entries, topic_word {B.shape[1]} columns")
    n = min(int(topn), B.shape[1])
    bg_top = set(_top(bg, n).tolist())
    kept: list[tuple[int, set]] = []
    flags = []
    for i, row in enumerate(B):
        top = set(_top(row, n).tolist())
        n_bg = len(top & bg_top)
        best_j, best = None, 0.0
        for j, other in kept:
            jac = len(top & other) / len(top | other)
            if jac > best:
                best_j, best = j, jac
        if n_bg >= max_background:
            flags.append(TopicFlag(BACKGROUND, None, n_bg, best))
        elif kept and best >= max_jaccard:
            flags.append(TopicFlag(NEAR_COPY, best_j, n_bg, best))
        else:
            kept.append((i, top))
            flags.append(TopicFlag(DISTINCT, None, n_bg, best))
    return flags


def reader_metrics(topic_word, background, *, npmi_per_topic=None, topn: int = TOPN) -> dict:
    """What a reader sees, for a benchmark row: ``distinct`` (count), ``background_share``
    (share of topics flagged background), ``diversity`` (unique top-``topn`` words / (k·topn))
    and, given per-topic NPMI, ``npmi_median``."""
    B = np.asarray(topic_word, dtype=np.float64)
    flags = topic_flags(B, background, topn=topn)
    n = min(int(topn), B.shape[1])
    tops = np.concatenate([_top(row, n) for row in B])
    out = {"distinct": sum(f.kind == DISTINCT for f in flags),
           "background_share": sum(f.kind == BACKGROUND for f in flags) / len(flags),
           "diversity": float(np.unique(tops).size / tops.size)}
    if npmi_per_topic is not None:
        out["npmi_median"] = float(np.median(np.asarray(npmi_per_topic, dtype=np.float64)))
    return out
