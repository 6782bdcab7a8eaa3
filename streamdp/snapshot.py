"""Versioned topic snapshots: what a release publishes for downstream consumers."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from streamdp import serialization as ser
from streamdp.evaluation.distinct import DISTINCT, TopicFlag, topic_flags

SCHEMA_VERSION = 1
#: a topic that moved more than this share of its mass since the previous release is *new*
NEW_TOPIC_MOVE = 0.5


@dataclass(frozen=True, eq=False)
class TopicSnapshot:
    """One released topic model.

    Attributes
    ----------
    topic_word : (k, d) ndarray    rows on the probability simplex
    alpha : (k,) ndarray           Dirichlet topic weights α_i (Σ ≈ α0)
    eigenvalues : (k,) ndarray     λ_i of the whitened tensor
    n_docs : float                 (noised) weighted number of stream documents
    privacy : dict                 privacy report (unit, ε, δ, ρ by partition, events, ...)
    mechanism : str                "tensor", "iterative" or "none"
    subspace_id : str              basis the sketch was expressed in
    release_id : str
    created_at : float             UNIX seconds
    epoch : int | None             last epoch covered (continual release)
    vocabulary_id : str | None     content hash of the public vocabulary (services)
    subspace_topics : (k', k) ndarray or None
                                   topics in the whitening subspace, U = Qᵀμ (spectral
                                   releases; what the next refinement folds documents into)
    noise_to_signal : (k,) ndarray or None
                                   estimated noise-to-signal ratio of each topic (refined
                                   releases; post-processing of released values). Above 1
                                   the topic is mostly noise: the stream is too small for
                                   the budget (see ``quality_note``)
    fold_in_topics : (k, d) ndarray or None
                                   refined releases: the sharper topics (soft threshold at
                                   the universal noise level) that the next refinement folds
                                   documents into; ``topic_word`` is the smoother estimate
                                   for reading and for perplexity
    stage : str                    "spectral" or "refined": whether the release has refinement
                                   sums (from the first refined epoch on; topic i then continues
                                   row i of those sums)
    topic_source : str or None     continual releases: which estimate ``topic_word`` is —
                                   "refinement" (the refined topics) or "spectral" (the
                                   spectral decomposition of the same released sums), chosen by
                                   the continual selection rule (streamdp.start.
                                   choose_continual_topics; its record in
                                   ``privacy["topic_selection"]``). None: not a continual release
    topic_change : (k,) ndarray or None
                                   continual releases: the mass each topic moved since the
                                   same index of the release published before (total
                                   variation, 0…1; None for the first). Above
                                   ``NEW_TOPIC_MOVE`` (½) the topic is marked *new*
                                   (:attr:`new_topics`): the index did not swap (docs/consumers.md
                                   §Following a topic over time), the topic itself changed
    topic_mass : (k,) ndarray or None
                                   refined / refinement-carrying releases: the row sums of the
                                   released (noised) refinement sums T, i.e. each topic's
                                   noised mass over the epochs covered (post-processing of a
                                   released value, no budget; each entry of T carries noise of
                                   sd ``privacy["noise_sd"]["topic_word"]``). What topic
                                   trends and their error bars are computed from
                                   (:mod:`streamdp.trends`)
    """

    topic_word: np.ndarray
    alpha: np.ndarray
    eigenvalues: np.ndarray
    n_docs: float
    privacy: dict
    mechanism: str
    subspace_id: str
    release_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: float = field(default_factory=time.time)
    epoch: int | None = None
    vocabulary_id: str | None = None
    subspace_topics: np.ndarray | None = None
    noise_to_signal: np.ndarray | None = None
    fold_in_topics: np.ndarray | None = None
    stage: str = "spectral"
    topic_change: np.ndarray | None = None
    topic_mass: np.ndarray | None = None
    topic_source: str | None = None

    @property
    def new_topics(self) -> list[int]:
        """Topics that moved more than half their mass since the previous release."""
        if self.topic_change is None:
            return []
        return [int(i) for i in np.flatnonzero(np.asarray(self.topic_change) > NEW_TOPIC_MOVE)]

    @property
    def background(self) -> np.ndarray:
        """The released model's corpus word distribution, M1 = Σ_i α_i β_i / Σ_i α_i (LDA's
        first moment): released values only, so anyone holding the snapshot gets the same."""
        a = np.clip(np.asarray(self.alpha, dtype=np.float64), 0.0, None)
        w = a / a.sum() if a.sum() > 0 else np.full(a.shape, 1.0 / max(a.size, 1))
        return w @ np.asarray(self.topic_word, dtype=np.float64)

    @property
    def topic_flags(self) -> list[TopicFlag]:
        """Each topic's flag — distinct, background or near-copy of topic j — by the one
        definition (streamdp.evaluation.distinct.topic_flags) against :attr:`background`:
        a function of the released topic_word and alpha only (post-processing, no budget)."""
        return topic_flags(self.topic_word, self.background)

    @property
    def n_distinct(self) -> int:
        return sum(f.kind == DISTINCT for f in self.topic_flags)

    @property
    def documents_to_tell_apart(self) -> float | None:
        """About how many more documents would let the topics that are not distinct be told
        apart, by the documented rule (docs/consumers.md §Honest snapshots): at a fixed budget
        the noise is fixed and a topic's signal grows with the documents, so its released
        noise-to-signal ratio r falls as 1/N; the median r of the non-distinct topics (finite
        ones) reaches 1 after N·r documents, i.e. M = N·(r − 1) more. None when the snapshot
        has no noise-to-signal ratios or those topics are not noise-limited (r ≤ 1)."""
        if self.noise_to_signal is None:
            return None
        nts = np.asarray(self.noise_to_signal, dtype=np.float64)
        r = [nts[i] for i, f in enumerate(self.topic_flags)
             if f.kind != DISTINCT and np.isfinite(nts[i])]
        if not r or float(np.median(r)) <= 1.0:
            return None
        return float(max(self.n_docs, 0.0)) * (float(np.median(r)) - 1.0)

    @property
    def distinct_note(self) -> str | None:
        """"N of k topics can be told apart at this budget, about M more documents would
        help" when some topics are background or near-copies (None when all are distinct)."""
        flags = self.topic_flags
        n = sum(f.kind == DISTINCT for f in flags)
        if n == len(flags):
            return None
        bg = sum(f.kind == "background" for f in flags)
        note = (f"{n} of {len(flags)} topics can be told apart at this budget ({bg} show the "
                f"corpus background, {len(flags) - n - bg} repeat another topic)")
        more = self.documents_to_tell_apart
        if more is not None:
            note += f", about {more:,.0f} more documents would help"
        return note

    @property
    def quality_note(self) -> str | None:
        """Plain warnings: topics that cannot be told apart (:attr:`distinct_note`) and topics
        whose noise exceeds their signal (None when neither)."""
        notes = [self.distinct_note] if self.distinct_note else []
        if self.new_topics:
            notes.append(f"topic(s) {', '.join(map(str, self.new_topics))} are new: they moved "
                         "more than half their mass since the previous release")
        if self.noise_to_signal is not None:
            bad = int(np.sum(~(np.asarray(self.noise_to_signal) < 1.0)))
            if bad:
                notes.append(f"{bad} of {self.n_topics} topics have estimated noise above their "
                             "signal: the stream is small for this privacy budget (more documents "
                             "per epoch, a larger ε, fewer topics or a smaller vocabulary help)")
        return "; ".join(notes) if notes else None

    @property
    def n_topics(self) -> int:
        return self.topic_word.shape[0]

    @property
    def schema_version(self) -> int:
        """The snapshot schema version (``v``; ``from_bytes`` reads only this one)."""
        return SCHEMA_VERSION

    def top_words(self, vocabulary, n: int = 10) -> list[list[tuple[str, float]]]:
        """The ``n`` most probable words of every topic, with their probabilities.

        ``vocabulary``: the snapshot's vocabulary (a ``Vocabulary`` or a word sequence); a
        ``Vocabulary`` with another id, or a sequence of another length, is refused: its words
        would be wrong, silently."""
        vid = getattr(vocabulary, "vocabulary_id", None)
        if vid is not None and self.vocabulary_id is not None and vid != self.vocabulary_id:
            raise ValueError(f"the snapshot refers to vocabulary {self.vocabulary_id}, this one "
                             f"is {vid}: use the vocabulary the snapshot was released with")
        if len(vocabulary) != self.topic_word.shape[1]:
            raise ValueError(f"the snapshot has {self.topic_word.shape[1]} words per topic, the "
                             f"vocabulary {len(vocabulary)}: use the vocabulary the snapshot was "
                             "released with")
        out = []
        for row in self.topic_word:
            idx = np.argsort(-row, kind="stable")[:n]
            out.append([(vocabulary[i], float(row[i])) for i in idx])
        return out

    def to_dict(self) -> dict:
        return {"kind": "topic_snapshot", "v": SCHEMA_VERSION,
                "topic_word": ser.pack_array(self.topic_word), "alpha": ser.pack_array(self.alpha),
                "eigenvalues": ser.pack_array(self.eigenvalues), "n_docs": float(self.n_docs),
                "privacy": self.privacy, "mechanism": self.mechanism,
                "subspace_id": self.subspace_id, "release_id": self.release_id,
                "created_at": float(self.created_at), "epoch": self.epoch,
                "vocabulary_id": self.vocabulary_id, "stage": self.stage,
                "topic_source": self.topic_source,
                "subspace_topics": (None if self.subspace_topics is None
                                    else ser.pack_array(self.subspace_topics)),
                "noise_to_signal": (None if self.noise_to_signal is None
                                    else ser.pack_array(self.noise_to_signal)),
                "fold_in_topics": (None if self.fold_in_topics is None
                                   else ser.pack_array(self.fold_in_topics.astype(np.float32))),
                "quality_note": self.quality_note,
                "topic_change": (None if self.topic_change is None
                                 else ser.pack_array(np.asarray(self.topic_change, dtype=np.float64))),
                "topic_mass": (None if self.topic_mass is None
                               else ser.pack_array(np.asarray(self.topic_mass, dtype=np.float64))),
                # derived from topic_word and alpha (ignored when read back): for readers
                "topic_flags": [f.to_dict() for f in self.topic_flags]}

    def to_bytes(self) -> bytes:
        return ser.dumps(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes) -> "TopicSnapshot":
        obj = ser.loads(data)
        ser.check_header(obj, "topic_snapshot", SCHEMA_VERSION)
        return cls(topic_word=ser.unpack_array(obj["topic_word"], name="topic_word"),
                   alpha=ser.unpack_array(obj["alpha"], name="alpha"),
                   eigenvalues=ser.unpack_array(obj["eigenvalues"], name="eigenvalues"),
                   n_docs=float(obj["n_docs"]), privacy=obj["privacy"],
                   mechanism=obj["mechanism"], subspace_id=obj["subspace_id"],
                   release_id=obj["release_id"], created_at=float(obj["created_at"]),
                   epoch=obj.get("epoch"), vocabulary_id=obj.get("vocabulary_id"),
                   stage=obj.get("stage", "spectral"), topic_source=obj.get("topic_source"),
                   subspace_topics=(None if obj.get("subspace_topics") is None else
                                    ser.unpack_array(obj["subspace_topics"], name="subspace_topics")),
                   noise_to_signal=(None if obj.get("noise_to_signal") is None else
                                    ser.unpack_array(obj["noise_to_signal"], name="noise_to_signal")),
                   topic_change=(None if obj.get("topic_change") is None else
                                 ser.unpack_array(obj["topic_change"], name="topic_change")),
                   topic_mass=(None if obj.get("topic_mass") is None else
                               ser.unpack_array(obj["topic_mass"], name="topic_mass")),
                   fold_in_topics=(None if obj.get("fold_in_topics") is None else
                                   ser.unpack_array(obj["fold_in_topics"], name="fold_in_topics")
                                   .astype(np.float64)))
