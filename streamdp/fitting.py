"""The one-call ``fit`` (``streamdp.fit``): warm up, sketch the stream, release and refine a
:class:`~streamdp.estimator.StreamingSpectralLDA` over a whole count matrix, or over token lists
with a privately selected vocabulary. Which rows warm up decides the accounting (its docstring).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from streamdp.documents import as_count_batch
from streamdp.estimator import StreamingSpectralLDA
from streamdp.estimator_params import check_positive_int, spend_session
from streamdp.privacy.accountant import Accountant
from streamdp.privacy.memory_ledger import MemoryLedger
from streamdp.privacy.noise import DEFAULT_SAMPLER, make_sampler
from streamdp.refinement import RefinementConfig
from streamdp.snapshot import TopicSnapshot
from streamdp.text.vocab_selection import (SelectionConfig, default_candidates, document_key,
                                           in_selection_slice, select_from_documents)


def fit(counts, n_topics: int, *, alpha0: float = 1.0, epsilon: float | None = None,
        delta: float = 1e-6, warmup_docs: int | None = None, seed: int | None = None,
        batch_size: int = 4096, timestamps=None, stream_start: float | None = None,
        refinement: RefinementConfig | bool | None = True, vocabulary_selection=None,
        candidates=None, users=None, **kwargs) -> TopicSnapshot:
    """Fit on a count matrix: warm up, sketch the stream, release, refine.

    Which rows warm up (used only for the whitening subspace) decides the accounting:

    * ``timestamps`` (n_docs,) and ``stream_start``: rows with ``ts < stream_start`` warm
      up. The role of a row depends on that row alone, so warm-up and stream are disjoint
      partitions and each document pays once (parallel composition) — the full ε for both;
    * ``warmup_docs``: rows ``[:warmup_docs]`` warm up. Adding a row shifts another across
      that boundary, so the warm-up is charged to the stream documents too, at replace
      sensitivity (sequential composition; ``warmup_share`` of ρ, default 0.25) — a
      smaller stream budget, but the stated (ε, δ) holds (docs/privacy.md).

    With ``refinement`` (default on) the stream budget is split: the spectral start gets
    ``1 − share`` and each of ``passes`` refinement passes over the stream rows gets
    ``share / passes`` (:class:`RefinementConfig`, docs/estimator.md).

    ``vocabulary_selection`` (a :class:`~streamdp.text.vocab_selection.SelectionConfig`, or
    True for the defaults): select the vocabulary privately from the warm-up documents first.
    ``counts`` is then a list of token lists (``Tokenizer.tokenize`` of each text), the
    boundary must be per document (``timestamps=``, ``stream_start=``), and the warm-up rows
    whose content hash falls in ``slice_share`` (:func:`in_selection_slice`) form the selection
    slice: an accounting atom of their own ("vocabulary", parallel composition with the
    warm-up and the stream; docs/privacy.md), used for nothing else. ``candidates``: the public
    candidate list (default: wordfreq's top 100,000). The snapshot's ``vocabulary_id`` names
    the selected vocabulary; its words and the selection's report are in
    ``snapshot.privacy["vocabulary_selection"]``.

    ``users`` (n_docs,) with ``privacy_unit="user"``: one user id per row; the unit is then
    the user (rows weighted per user in row order; docs/privacy.md, "The user-level unit").

    Returns the released :class:`TopicSnapshot` (``.topic_word`` (k, d), ``.alpha`` (k,)).
    Extra keyword arguments go to :class:`StreamingSpectralLDA`.
    """
    user_mode = kwargs.get("privacy_unit", "document") == "user"
    if user_mode and users is None:
        raise ValueError("privacy_unit='user': pass users= (one user id per row)")
    if users is not None and not user_mode:
        raise ValueError("users= is for privacy_unit='user'")
    if user_mode and vocabulary_selection not in (None, False):
        raise ValueError("vocabulary_selection is per document: with privacy_unit='user' use a "
                         "public vocabulary (streamdp vocab public); a user-level selection is "
                         "not implemented")
    if user_mode and warmup_docs is not None:
        raise ValueError("privacy_unit='user' needs a per-document boundary (timestamps= and "
                         "stream_start=), not warmup_docs (a row count)")
    if vocabulary_selection is not None and vocabulary_selection is not False:
        return _fit_selecting_vocabulary(
            counts, n_topics, vocabulary_selection, candidates, alpha0=alpha0, epsilon=epsilon,
            delta=delta, warmup_docs=warmup_docs, seed=seed, batch_size=batch_size,
            timestamps=timestamps, stream_start=stream_start, refinement=refinement, **kwargs)
    X = as_count_batch(counts)
    n = X.shape[0]
    batch_size = check_positive_int("batch_size", batch_size)
    if timestamps is not None or stream_start is not None:
        if timestamps is None or stream_start is None:
            raise ValueError("a timestamp boundary needs both timestamps= and stream_start=")
        if warmup_docs is not None:
            raise ValueError("give either warmup_docs (a row count) or timestamps= and "
                             "stream_start= (a per-document boundary), not both")
        ts = np.asarray(timestamps, dtype=np.float64).ravel()
        if ts.shape[0] != n or not np.all(np.isfinite(ts)):
            raise ValueError(f"timestamps must be {n} finite numbers, one per row")
        warm_rows = np.flatnonzero(ts < float(stream_start))
        stream_rows = np.flatnonzero(ts >= float(stream_start))
        boundary = "document"
    else:
        if warmup_docs is None:
            raise ValueError("give warmup_docs (rows [:warmup_docs] warm up) or timestamps= "
                             "and stream_start= (rows with ts < stream_start warm up)")
        warmup_docs = check_positive_int("warmup_docs", warmup_docs)
        warm_rows, stream_rows = np.arange(min(warmup_docs, n)), np.arange(warmup_docs, n)
        boundary = "count"
    # private: an empty side is drawn from noise like any other (how many rows fall on each side
    # is data: refusing would publish an exact count); non-private: say what is missing
    if epsilon is None and (warm_rows.size == 0 or stream_rows.size == 0):
        raise ValueError(f"the boundary leaves {warm_rows.size} warm-up and {stream_rows.size} "
                         f"stream rows out of {n}: both must be non-empty (no stream documents "
                         "or no warm-up documents)")
    kwargs.setdefault("warmup_boundary", boundary)
    model = StreamingSpectralLDA(n_topics, alpha0, epsilon=epsilon, delta=delta, seed=seed,
                                 refinement=refinement, **kwargs)
    if users is not None:
        users = np.asarray(list(users), dtype=object)
        if users.shape != (n,):
            raise ValueError(f"users must be {n} user ids, one per row")

    def ids(rows):
        return None if users is None else list(users[rows])

    # at least one (maybe empty) batch per side: the calls, not the row counts, are the schedule
    for s in range(0, max(warm_rows.size, 1), batch_size):
        model.warmup(X[warm_rows[s:s + batch_size]], users=ids(warm_rows[s:s + batch_size]))
    cuts = range(0, max(stream_rows.size, 1), batch_size)
    stream = [X[stream_rows[s:s + batch_size]] for s in cuts]
    stream_users = None if users is None else [ids(stream_rows[s:s + batch_size]) for s in cuts]
    for i, batch in enumerate(stream):
        model.partial_fit(batch, users=None if users is None else stream_users[i])
    cfg = model.refinement
    if cfg is None:
        return model.release()
    passes_share = model.release_start(stream, 1.0 - cfg.share, users=stream_users)
    snap = None
    for _ in range(cfg.passes):
        snap = model.refine(stream, budget_fraction=passes_share / cfg.passes, users=stream_users)
    return snap


def _fit_selecting_vocabulary(documents, n_topics, config, candidates, *, epsilon, delta,
                              warmup_docs, timestamps, stream_start, **kwargs) -> TopicSnapshot:
    """:func:`fit` with a privately selected vocabulary (see its docstring)."""
    if epsilon is None:
        raise ValueError("vocabulary_selection needs a private fit (epsilon=...): without "
                         "privacy, build the vocabulary with Vocabulary.build")
    if warmup_docs is not None or timestamps is None or stream_start is None:
        raise ValueError("vocabulary_selection needs a per-document boundary (timestamps= and "
                         "stream_start=), so the selection slice is a partition of documents by "
                         "their own content; warmup_docs (a row count) cannot give that")
    cfg = SelectionConfig() if config is True else config
    if not isinstance(cfg, SelectionConfig):
        raise TypeError(f"vocabulary_selection must be a SelectionConfig or True, got {config!r}")
    docs = list(documents)
    if any(isinstance(d, str) for d in docs) or hasattr(documents, "tocsr"):
        raise TypeError("with vocabulary_selection, pass token lists (Tokenizer.tokenize of each "
                        "text), not a count matrix or raw strings")
    ts = np.asarray(timestamps, dtype=np.float64).ravel()
    if ts.shape[0] != len(docs) or not np.all(np.isfinite(ts)):
        raise ValueError(f"timestamps must be {len(docs)} finite numbers, one per document")
    warm = ts < float(stream_start)
    in_slice = np.array([bool(w) and in_selection_slice(document_key(d), cfg.slice_share)
                         for d, w in zip(docs, warm)], dtype=bool)
    accountant = kwargs.pop("accountant", None)
    if accountant is None:
        accountant = Accountant(float(epsilon), float(delta), MemoryLedger())
    sampler = kwargs.get("sampler", DEFAULT_SAMPLER)
    noise_seed = kwargs.get("noise_seed")
    # a reproducible (test) seed must not make the selection's noise a copy of the model's
    sel_sampler = sampler if not isinstance(sampler, str) else make_sampler(
        sampler, None if noise_seed is None else int(noise_seed) + 7919)
    sel = select_from_documents([docs[i] for i in np.flatnonzero(in_slice)], epsilon=epsilon,
                                delta=delta, config=cfg,
                                candidates=candidates if candidates is not None
                                else default_candidates(),
                                spender=spend_session(accountant,
                                                      kwargs.get("run_id")),  # keyed, as fit's draws
                                sampler=sel_sampler)
    rest = np.flatnonzero(~in_slice)
    X, _ = sel.vocabulary.vectorize([docs[i] for i in rest])
    snap = fit(X, n_topics, epsilon=epsilon, delta=delta, timestamps=ts[rest],
               stream_start=stream_start, accountant=accountant, **kwargs)
    privacy = dict(snap.privacy)
    privacy["vocabulary_selection"] = {**sel.report, "words": list(sel.vocabulary.words),
                                       "slice": f"warm-up documents with SHA-256(content) in the "
                                                f"first {cfg.slice_share:g} of the hash range"}
    if hasattr(accountant, "report"):
        privacy["accountant"] = accountant.report()
    return dataclasses.replace(snap, privacy=privacy, vocabulary_id=sel.vocabulary.vocabulary_id)
