"""Honest snapshots (issue 22 item 6): each topic carries a distinct / background / near-copy
flag computed from released values only (topic_word and alpha, by the one definition in
streamdp.evaluation.distinct); the quality note counts them and `streamdp topics` shows the
distinct topics first with "N of k topics can be told apart at this budget, about M more
documents would help"."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from streamdp.cli import main as cli_main
from streamdp.evaluation.distinct import topic_flags
from streamdp.snapshot import TopicSnapshot
from streamdp.text.vocabulary import Vocabulary

D = 60
WORDS = [f"w{j:02d}" for j in range(D)]


def _topic(words, rest=1e-4):
    row = np.full(D, rest)
    row[list(words)] = 1.0
    return row / row.sum()


def snapshot(**kw) -> TopicSnapshot:
    """k = 4: topics 0 and 2 distinct, topic 1 a near-copy of 0, topic 3 made of the words
    with the largest released background mass (the heavy topic 3 dominates α)."""
    B = np.stack([_topic(range(10, 20)), _topic(list(range(10, 17)) + [40, 41, 42]),
                  _topic(range(20, 30)), _topic(range(0, 10))])
    base = dict(topic_word=B, alpha=np.array([0.1, 0.1, 0.1, 0.7]), eigenvalues=np.ones(4),
                n_docs=10_000.0, privacy={"epsilon": 1.0, "delta": 1e-6}, mechanism="tensor",
                subspace_id="s", epoch=3, stage="refined",
                noise_to_signal=np.array([0.5, 3.0, 0.4, 3.0]))
    base.update(kw)
    return TopicSnapshot(**base)


def test_flags_follow_the_one_definition_on_the_released_background():
    snap = snapshot()
    kinds = [f.kind for f in snap.topic_flags]
    assert kinds == ["distinct", "near_copy", "distinct", "background"]
    assert snap.topic_flags[1].copy_of == 0
    background = snap.alpha @ snap.topic_word / snap.alpha.sum()
    assert snap.topic_flags == topic_flags(snap.topic_word, background)
    assert snap.n_distinct == 2
    # M = N (median noise-to-signal of the non-distinct topics − 1) = 10,000 · (3 − 1)
    assert snap.documents_to_tell_apart == 20_000.0
    assert snap.quality_note.startswith("2 of 4 topics can be told apart at this budget "
                                        "(1 show the corpus background, 1 repeat another topic), "
                                        "about 20,000 more documents would help")
    written = TopicSnapshot.from_bytes(snap.to_bytes())
    assert written.topic_flags == snap.topic_flags
    assert snap.to_dict()["topic_flags"][1] == {"kind": "near_copy", "copy_of": 0,
                                                "n_background": 0, "max_jaccard": 0.538462}


def test_flags_depend_on_released_values_only():
    """Everything a snapshot holds besides its released topics and α — eigenvalues, the
    subspace topics, the sharper fold-in topics, the report, ids and times, i.e. what differs
    when the unreleased documents differ but the released topics do not — leaves the flags and
    the note unchanged; changing a released topic changes them."""
    a = snapshot()
    rng = np.random.default_rng(0)
    b = dataclasses.replace(a, eigenvalues=rng.random(4), subspace_topics=rng.random((5, 4)),
                            fold_in_topics=rng.dirichlet(np.ones(D), size=4),
                            privacy={"epsilon": 1.0, "events": ["other"]}, release_id="x",
                            created_at=1.0, subspace_id="t")
    assert b.topic_flags == a.topic_flags and b.quality_note == a.quality_note
    c = dataclasses.replace(a, topic_word=np.stack([a.topic_word[0], _topic(range(30, 40)),
                                                    a.topic_word[2], a.topic_word[3]]))
    assert [f.kind for f in c.topic_flags] == ["distinct", "distinct", "distinct", "background"]


def test_no_note_when_every_topic_is_distinct_and_no_estimate_without_noise_ratios():
    # five topics whose two leading words are the corpus's most frequent: 2 of 10 each
    B = np.stack([_topic(range(10 * i, 10 * i + 10)) for i in range(5)])
    for i in range(5):
        B[i, 10 * i:10 * i + 2] *= 4.0
    B /= B.sum(axis=1, keepdims=True)
    snap = snapshot(topic_word=B, alpha=np.full(5, 0.2), eigenvalues=np.ones(5),
                    noise_to_signal=np.full(5, 0.5))
    assert snap.n_distinct == 5 and snap.distinct_note is None and snap.quality_note is None
    plain = snapshot(noise_to_signal=None)
    assert plain.documents_to_tell_apart is None
    assert plain.quality_note == ("2 of 4 topics can be told apart at this budget (1 show the "
                                  "corpus background, 1 repeat another topic)")


def test_topics_command_shows_distinct_topics_first(tmp_path, capsys):
    snap = snapshot(vocabulary_id=Vocabulary(WORDS).id)
    d = tmp_path / "snaps"
    d.mkdir()
    (d / f".{snap.release_id}.tmp").write_bytes(snap.to_bytes())
    os.replace(d / f".{snap.release_id}.tmp", d / f"epoch-000003-{snap.release_id}.msgpack")
    Vocabulary(WORDS).save(d / "vocabulary.txt")
    assert cli_main(["topics", "--snapshot-dir", str(d), "-n", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert ("2 of 4 topics can be told apart at this budget, about 20,000 more documents "
            "would help") in out
    lines = [line for line in out if line.startswith("topic ")]
    assert [line.split()[1] for line in lines] == ["0", "2", "1", "3"]
    assert "[near-copy of topic 0]" in lines[2] and "[background]" in lines[3]
    assert cli_main(["topics", "--snapshot-dir", str(d), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [f["kind"] for f in doc["topic_flags"]] == ["distinct", "near_copy", "distinct",
                                                      "background"]
    assert doc["n_distinct"] == 2 and doc["documents_to_tell_apart"] == 20_000.0
    assert doc["distinct_note"] == snap.distinct_note


def test_new_topics_are_marked_kept_on_the_wire_and_shown(tmp_path, capsys):
    snap = snapshot(topic_change=np.array([0.1, 0.7, 0.2, 0.05]),
                    vocabulary_id=Vocabulary(WORDS).id)
    assert snap.new_topics == [1]
    assert "topic(s) 1 are new" in snap.quality_note
    again = TopicSnapshot.from_bytes(snap.to_bytes())
    np.testing.assert_array_equal(again.topic_change, snap.topic_change)
    assert snapshot().topic_change is None and snapshot().new_topics == []
    d = tmp_path / "snaps"
    d.mkdir()
    (d / f"epoch-000003-{snap.release_id}.msgpack").write_bytes(snap.to_bytes())
    Vocabulary(WORDS).save(d / "vocabulary.txt")
    assert cli_main(["topics", "--snapshot-dir", str(d)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("topic  1"))
    assert "[new since the previous release]" in line
