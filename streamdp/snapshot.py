"""Versioned topic snapshots: what a release publishes for downstream consumers."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from streamdp import serialization as ser

SCHEMA_VERSION = 1


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
    stage : str                    "spectral" or "refined" (how the topics were made)
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

    @property
    def quality_note(self) -> str | None:
        """A plain warning when most topics are noise-dominated (None otherwise)."""
        if self.noise_to_signal is None:
            return None
        bad = int(np.sum(~(np.asarray(self.noise_to_signal) < 1.0)))
        if bad == 0:
            return None
        return (f"{bad} of {self.n_topics} topics have estimated noise above their signal: the "
                "stream is small for this privacy budget (more documents per epoch, a larger "
                "ε, fewer topics or a smaller vocabulary help)")

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
                "subspace_topics": (None if self.subspace_topics is None
                                    else ser.pack_array(self.subspace_topics)),
                "noise_to_signal": (None if self.noise_to_signal is None
                                    else ser.pack_array(self.noise_to_signal)),
                "fold_in_topics": (None if self.fold_in_topics is None
                                   else ser.pack_array(self.fold_in_topics.astype(np.float32))),
                "quality_note": self.quality_note}

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
                   stage=obj.get("stage", "spectral"),
                   subspace_topics=(None if obj.get("subspace_topics") is None else
                                    ser.unpack_array(obj["subspace_topics"], name="subspace_topics")),
                   noise_to_signal=(None if obj.get("noise_to_signal") is None else
                                    ser.unpack_array(obj["noise_to_signal"], name="noise_to_signal")),
                   fold_in_topics=(None if obj.get("fold_in_topics") is None else
                                   ser.unpack_array(obj["fold_in_topics"], name="fold_in_topics")
                                   .astype(np.float64)))
