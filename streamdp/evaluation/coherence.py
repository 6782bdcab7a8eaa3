"""NPMI topic coherence through gensim's ``CoherenceModel`` (needs the ``eval`` extra).

Definition used (Röder et al., 2015, as implemented by gensim ≥ 4.3):
``CoherenceModel(topics=..., texts=reference_texts, dictionary=..., coherence="c_npmi",
topn=10, window_size=10, processes=1)``. For each topic, its 10 most probable words w_1..w_10
(by the topic-word matrix, ties by column order) form the 45 ordered pairs (w_i, w_j), j < i
(gensim's ``one_pre`` segmentation); P(w) and P(w_i, w_j) are the fractions of sliding windows
of 10 consecutive token positions of the reference texts that contain the word(s) (positions of
tokens outside the vocabulary still occupy window slots); NPMI = log(P(w_i,w_j)/(P(w_i)P(w_j)))
/ −log P(w_i, w_j) (with gensim's ε = 10⁻¹² inside the logarithms); the topic's coherence is the
mean over its pairs and the model's the mean over topics. Range [−1, 1], higher is better.

**Reference corpus.** The comparison (``benchmarks/compare.py``) uses the *held-out documents of
the same corpus* — the test split that no model was trained on — tokenised by the same
tokenizer (stop words removed), as ``reference_texts``.

**Words absent from the reference corpus.** gensim returns ±inf/nan for a pair whose word never
occurs in the reference (its probability is 0). Such pairs are given NPMI = −1, the value NPMI
takes for words that never co-occur: gensim scores the topic restricted to its present words
(P pairs, mean S), and the topic's score is (P·S − (45 − P)) / 45. The count of such words is
reported (``n_absent_words``); with a 5,000-word vocabulary built on the whole corpus it is 0 for
all but very noisy topics.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def top_words(topic_word, vocabulary: Sequence[str], topn: int = 10) -> list[list[str]]:
    """The ``topn`` most probable words of every topic (ties by column order)."""
    B = np.asarray(topic_word, dtype=float)
    if B.ndim != 2 or B.shape[1] != len(vocabulary):
        raise ValueError(f"topic_word shape {B.shape} does not match a vocabulary of "
                         f"{len(vocabulary)} words")
    return [[vocabulary[j] for j in np.argsort(-row, kind="stable")[:topn]] for row in B]


def npmi_coherence(topic_word, vocabulary: Sequence[str], reference_texts: Sequence[Sequence[str]],
                   *, topn: int = 10, window_size: int = 10) -> dict:
    """Mean and per-topic NPMI of the top-``topn`` words (see the module docstring).

    Parameters
    ----------
    topic_word : (k, d) array, rows on the simplex (any model)
    vocabulary : the d words of the columns
    reference_texts : token lists of the reference corpus (held-out documents)

    Returns ``{"npmi": mean, "per_topic": [...], "n_absent_words": int, "topn", "window_size"}``.
    """
    if int(topn) < 2:
        raise ValueError(f"topn must be >= 2 (NPMI scores word pairs), got {topn!r}")
    from gensim.corpora import Dictionary
    from gensim.models import CoherenceModel

    topics = top_words(topic_word, vocabulary, topn)
    texts = [list(t) for t in reference_texts]
    present_words: set[str] = set()
    for t in texts:
        present_words.update(t)
    present = [[w for w in topic if w in present_words] for topic in topics]
    n_pairs = [len(t) * (len(t) - 1) // 2 for t in topics]
    scores = np.full(len(topics), -1.0)
    scorable = [i for i, t in enumerate(present) if len(t) >= 2]
    if scorable:
        dictionary = Dictionary([list(vocabulary)])
        cm = CoherenceModel(topics=[present[i] for i in scorable], texts=texts,
                            dictionary=dictionary, coherence="c_npmi", topn=topn,
                            window_size=window_size, processes=1)
        for i, s in zip(scorable, cm.get_coherence_per_topic()):
            p = len(present[i]) * (len(present[i]) - 1) // 2
            scores[i] = (p * float(s) - (n_pairs[i] - p)) / n_pairs[i]
    n_absent = sum(len(t) - len(p) for t, p in zip(topics, present))
    return {"npmi": float(scores.mean()), "per_topic": scores.tolist(),
            "n_absent_words": int(n_absent), "topn": int(topn), "window_size": int(window_size)}
