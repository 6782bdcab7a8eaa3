"""The deployment's vocabulary in the services (issue 11): a file, a public list, or a DP selection.

``vocabulary_mode`` (docs/configuration.md §The vocabulary):

* ``file``    — today's path: every service loads the file. It must say that it is public: a
  sidecar ``<file>.json`` (written by ``streamdp vocab public`` / ``vocab private``) whose
  ``vocabulary_id`` is the file's and whose ``selection`` is ``public`` or a DP selection — or
  the configuration declares it public in so many words (``vocabulary_public_by_assumption``,
  e.g. a corpus-built list in a benchmark).
* ``public``  — the release service builds the ``vocabulary_size`` most frequent wordfreq words
  at start-up (no budget) and persists them as the deployment's vocabulary record.
* ``private`` — documents with ``ts < selection_end`` (one public per-document value) form the
  selection window; sketchers add each one's clipped set of distinct words to a per-partition
  :class:`SelectionHistogram` (checkpointed with the partition state); when the window closes
  the release service merges them and runs the DP selection through the spend protocol
  (key ``vocabulary``), then persists the vocabulary record.

The vocabulary record (state topic, key :data:`~streamdp.services.control.VOCABULARY_KEY`):
payload = the vocabulary's canonical bytes, meta = ``vocabulary_id`` (checked against the payload
by every reader), ``mode``, provenance and, for a private selection, the ledger head. Sketchers of
``public``/``private`` deployments take their vocabulary from it and nowhere else, so every
service agrees on one content id.

The numerics (candidate lists, clipping, noise, top-d) are :mod:`streamdp.text`'s; this module
is the services' thin adapter (no Kafka here either).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from streamdp import serialization as ser
from streamdp.services import control
from streamdp.text import public_vocab
from streamdp.text.public_vocab import public_words
from streamdp.text.tokenizer import ENGLISH_STOP_WORDS
from streamdp.text.vocab_selection import (CandidateHistogram, InsufficientSelection,
                                           SelectionConfig, plan_selection, select_vocabulary)
from streamdp.text.vocabulary import Vocabulary

KIND = "selection_histogram"       # the checkpointed wrapper of a CandidateHistogram
VERSION = 1
SPEND_KEY = "vocabulary"           # idempotency key of the selection's reservation(s)
#: vocabulary-record ``status`` of a selection that was drawn but is unusable (too small)
FAILED = "failed"


class VocabularyError(ValueError):
    """The deployment's vocabulary cannot be used (the message says what to fix)."""


class SelectionTooSmall(VocabularyError):
    """The selection window is too small for the budget: the noisy counts do not single out
    enough words. The message gives the numbers and the fix."""


# ------------------------------------------------------------------ tokenizer and candidates
def selection_tokenizer(cfg):
    """The deployment's tokenizer with the English stop words added: public lists and
    candidates are tokenised like the documents, minus stop words."""
    tok = cfg.tokenizer_()
    return replace(tok, stop_words=frozenset(tok.stop_words) | ENGLISH_STOP_WORDS)


_CANDIDATES: dict = {}


def candidates(cfg) -> Vocabulary:
    """The public candidate list of a private selection: the ``vocabulary_candidates`` most
    frequent wordfreq words of ``vocabulary_lang`` (as a Vocabulary, for its content id)."""
    tok = selection_tokenizer(cfg)
    key = (cfg.vocabulary_lang, cfg.vocabulary_candidates, json.dumps(tok.config(), sort_keys=True))
    if key not in _CANDIDATES:
        try:
            _CANDIDATES[key] = Vocabulary(public_words(cfg.vocabulary_lang,
                                                       size=cfg.vocabulary_candidates, tokenizer=tok))
        except (ValueError, ImportError) as exc:
            raise VocabularyError(f"configuration fields 'vocabulary_lang'/'vocabulary_candidates': "
                                  f"{exc}") from None
    return _CANDIDATES[key]


def public_vocabulary(cfg) -> tuple[Vocabulary, dict]:
    """``vocabulary_mode: public``: the ``vocabulary_size`` most frequent wordfreq words."""
    try:
        vocab, meta = public_vocab.public_vocabulary(cfg.vocabulary_lang,
                                                     size=cfg.vocabulary_size,
                                                     tokenizer=selection_tokenizer(cfg))
    except (ValueError, ImportError) as exc:
        raise VocabularyError(f"configuration fields 'vocabulary_lang'/'vocabulary_size': {exc}") from None
    return vocab, {**meta, "mode": "public"}


# ------------------------------------------------------------------ file mode
#: sidecar ``selection`` values of `streamdp vocab public` and `streamdp vocab private`
PUBLIC_SELECTIONS = ("public", "private")


def file_provenance(path: str | Path, vocab: Vocabulary) -> dict | None:
    """The sidecar ``<path>.json`` if it describes this very file as public or DP-selected,
    else None. A sidecar naming another vocabulary id is an error (a stale sidecar)."""
    side = Path(f"{path}.json")
    if not side.is_file():
        return None
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise VocabularyError(f"vocabulary sidecar {str(side)!r} is not readable JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise VocabularyError(f"vocabulary sidecar {str(side)!r} must hold one JSON object")
    if meta.get("vocabulary_id") != vocab.id:
        raise VocabularyError(
            f"vocabulary sidecar {str(side)!r} describes vocabulary {meta.get('vocabulary_id')!r}, "
            f"but {str(path)!r} is {vocab.id}: the file was changed after it was built; rebuild it "
            "(streamdp vocab public / vocab private) or remove the stale sidecar")
    if meta.get("selection") in PUBLIC_SELECTIONS:
        return meta
    return None


# ------------------------------------------------------------------ the selection histogram
class SelectionHistogram:
    """One partition's clipped document-frequency histogram of the selection window: a
    checkpointable wrapper of :class:`streamdp.text.vocab_selection.CandidateHistogram`
    (the clipping rule and its sensitivity live there). Decoded from a checkpoint it holds
    the plain dict until it meets the candidate list (:meth:`histogram`)."""

    def __init__(self, inner=None, raw: dict | None = None) -> None:
        self._inner, self._raw = inner, raw

    @classmethod
    def for_config(cls, cfg, cands: Vocabulary) -> "SelectionHistogram":
        return cls(CandidateHistogram.for_config(cands, selection_config(cfg)))

    def histogram(self, cands: Vocabulary):
        """The CandidateHistogram over ``cands`` (a mismatch is a VocabularyError)."""
        if self._inner is None:
            try:
                self._inner = CandidateHistogram.from_dict(self._raw, cands)
            except (ValueError, KeyError) as exc:
                raise VocabularyError(
                    f"a partition's selection histogram does not fit this service's candidate "
                    f"list ({exc}): every sketcher and the release service must run the same "
                    "vocabulary_* configuration and wordfreq version") from None
            self._raw = None
        elif self._inner.candidates_id != cands.id:
            raise VocabularyError(f"selection histogram over candidates {self._inner.candidates_id}, "
                                  f"this service's candidate list is {cands.id}")
        return self._inner

    @property
    def n_docs(self) -> int:
        return int(self._inner.n_docs if self._inner is not None else self._raw["n_docs"])

    def add(self, token_lists, cands: Vocabulary) -> "SelectionHistogram":
        self.histogram(cands).add_documents(token_lists)
        return self

    def to_bytes(self) -> bytes:
        return ser.dumps({"kind": KIND, "v": VERSION,
                          "histogram": self._inner.to_dict() if self._inner is not None else self._raw})

    @classmethod
    def from_bytes(cls, data: bytes) -> "SelectionHistogram":
        obj = ser.loads(data)
        ser.check_header(obj, KIND, VERSION)
        return cls(raw=dict(obj["histogram"]))


def merge_histograms(hists, cands: Vocabulary):
    """Σ of the partitions' histograms (a new CandidateHistogram), or None if there is none."""
    out = None
    for h in hists:
        if h is None:
            continue
        inner = h.histogram(cands)
        if out is None:
            out = CandidateHistogram(cands, max_words_per_doc=inner.max_words_per_doc,
                                     max_new_words_per_doc=inner.max_new_words_per_doc,
                                     new_words=inner.new_words)
        try:
            out.merge(inner)
        except ValueError as exc:
            raise VocabularyError(f"cannot merge the partitions' selection histograms: {exc}") from None
    return out


# ------------------------------------------------------------------ the DP selection
def selection_config(cfg):
    """The public parameters of the selection (streamdp.text.vocab_selection.SelectionConfig)."""
    return SelectionConfig(size=cfg.vocabulary_size, max_words_per_doc=cfg.vocabulary_max_words_per_document,
                           candidates="noisy", new_words=cfg.vocabulary_out_of_list,
                           min_words=min(cfg.vocabulary_size, max(cfg.n_topics, 10)))


@dataclass
class Selection:
    vocabulary: Vocabulary
    meta: dict
    events: list


def select(cfg, merged, *, accountant, sampler, spender) -> Selection:
    """The DP selection on the merged histogram with the selection atom's whole budget
    (parallel composition): reserve (``spender``, key ``vocabulary``) → draw → keep.
    Raises :class:`SelectionTooSmall` *after* the draw (the caller persists that outcome)."""
    conf = selection_config(cfg)
    if conf.new_words:
        rho = accountant.vocabulary_rho_limit(conf.new_words_delta_share * cfg.delta)
    else:
        rho = accountant.rho_budget
    plan = plan_selection(conf, epsilon=cfg.epsilon, delta=cfg.delta, rho=rho)
    try:
        sel = select_vocabulary(merged, plan, spender=spender, sampler=sampler, label=SPEND_KEY)
    except InsufficientSelection as exc:
        raise SelectionTooSmall(
            f"{exc} In this deployment: the selection window is the documents with ts < "
            f"selection_end={cfg.selection_end!r}; move selection_end later (more documents), "
            "raise epsilon, lower vocabulary_max_words_per_document, or use vocabulary_mode: "
            "public. This deployment's selection is spent: start a new deployment (new "
            "topic_prefix and ledger).") from None
    meta = {k: v for k, v in sel.report.items() if k != "plan"}
    meta.update(mode="private", lang=cfg.vocabulary_lang, candidates=meta.get("n_candidates"),
                max_words_per_document=cfg.vocabulary_max_words_per_document,
                sigma=plan.sigma_candidates)
    return Selection(sel.vocabulary, meta, list(sel.events))


# ------------------------------------------------------------------ the vocabulary record
def record_vocabulary(rec) -> Vocabulary:
    """The Vocabulary of a vocabulary record, its content id checked against the meta."""
    vocab = Vocabulary.from_bytes(rec.payload, source="the deployment's vocabulary record")
    if vocab.id != rec.meta.get("vocabulary_id"):
        raise VocabularyError(f"the vocabulary record's content is {vocab.id}, its manifest says "
                              f"{rec.meta.get('vocabulary_id')}: refusing a corrupt record")
    return vocab


def load_record(store, *, key: str | None = None, auth=None):
    """(Vocabulary, meta) of the deployment's vocabulary record, or None if there is none.
    A failed selection raises :class:`SelectionTooSmall` with its message. ``key``: the
    release service's record (default) or the public one sketchers read
    (``public/vocabulary``); ``auth``: its StateAuth — a record without a valid MAC raises
    :class:`~streamdp.services.state_auth.StateIntegrityError`."""
    key = control.VOCABULARY_KEY if key is None else key
    rec = store.read_latest(key)
    if rec is None:
        return None
    if auth is not None:
        auth.verify(key, rec)
    if rec.meta.get("status") == FAILED:
        raise SelectionTooSmall(rec.meta.get("error") or "the vocabulary selection failed")
    return record_vocabulary(rec), dict(rec.meta)
