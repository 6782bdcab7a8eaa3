"""The reader's count of distinct topics (streamdp.evaluation.distinct): known answers."""
import numpy as np
import pytest

from streamdp.evaluation.distinct import (BACKGROUND, DISTINCT, NEAR_COPY, reader_metrics,
                                          topic_flags)


def _topic(d, words, base=1e-6):
    row = np.full(d, base)
    for rank, w in enumerate(words):
        row[w] = 1.0 - 0.01 * rank
    return row / row.sum()


def test_background_near_copy_and_distinct_by_the_definition():
    d = 100
    bg = np.zeros(d); bg[:10] = np.arange(10, 0, -1)          # words 0..9 are the most frequent
    topics = np.stack([
        _topic(d, [0, 1, 2, 3, 4, 50, 51, 52, 53, 54]),        # 5 background words: background
        _topic(d, [0, 1, 2, 3, 60, 61, 62, 63, 64, 65]),       # 4: distinct
        _topic(d, [60, 61, 62, 63, 64, 65, 66, 0, 1, 2]),      # J = 9/11 >= 0.5 with topic 1
        _topic(d, [70, 71, 72, 73, 74, 75, 60, 61, 62, 63]),   # J = 4/16 with topic 1: distinct
    ])
    flags = topic_flags(topics, bg)
    assert [f.kind for f in flags] == [BACKGROUND, DISTINCT, NEAR_COPY, DISTINCT]
    assert flags[0].n_background == 5 and flags[1].n_background == 4
    assert flags[2].copy_of == 1 and flags[2].max_jaccard == pytest.approx(9 / 11)
    m = reader_metrics(topics, bg, npmi_per_topic=[0.1, 0.2, 0.3, -1.0])
    assert m["distinct"] == 2 and m["background_share"] == 0.25
    assert m["npmi_median"] == pytest.approx(0.15)
    assert m["diversity"] == pytest.approx(len(set(range(5)) | set(range(50, 55))
                                               | set(range(60, 67)) | set(range(70, 76))) / 40)


def test_a_near_copy_of_a_background_topic_is_not_a_copy():
    """Only distinct topics are compared against: two identical background topics are both
    background, and a topic that overlaps only a background topic is distinct."""
    d = 50
    bg = np.arange(d, 0, -1).astype(float)
    t_bg = _topic(d, list(range(10)))
    t_mid = _topic(d, [0, 1, 2, 3, 20, 21, 22, 23, 24, 25])
    flags = topic_flags(np.stack([t_bg, t_bg, t_mid]), bg)
    assert [f.kind for f in flags] == [BACKGROUND, BACKGROUND, DISTINCT]


def test_repeated_topics_count_once():
    d = 40
    bg = np.zeros(d); bg[30:40] = 1.0
    t = _topic(d, list(range(10)))
    assert reader_metrics(np.stack([t] * 5), bg)["distinct"] == 1


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="columns"):
        topic_flags(np.ones((2, 5)), np.ones(4))
