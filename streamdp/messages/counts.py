"""Decoded documents of mixed kinds to one CSR count batch over the vocabulary.

:func:`documents_to_counts` tokenizes text, matches tokens and checks counts against the
vocabulary, validating every document first and returning the bad ones separately
(:class:`CountBatch`), so a bad document never half-updates a sketch.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from streamdp.documents import as_count_batch
from streamdp.messages.errors import INVALID_VALUE, InvalidMessage, TOO_LARGE
from streamdp.messages.schema import DEFAULT_MAX_TOKENS, Document, check_counts
from streamdp.text.tokenizer import Tokenizer
from streamdp.text.vocabulary import Vocabulary


@dataclass(frozen=True, eq=False)
class CountBatch:
    """The usable part of a batch of documents, plus what was wrong with the rest.

    Attributes
    ----------
    counts : csr_matrix (n_good, d) float64, canonical; row r is document ``index[r]``
    timestamps : float64 (n_good,)
    doc_ids : tuple of str (n_good)
    index : intp (n_good,), position of each row in the input sequence
    n_tokens : int64 (n_good,), tokens per document before the vocabulary lookup (after the
        tokenizer for text; Σcounts for counts)
    n_unknown : int64 (n_good,), of those, tokens not in the vocabulary (dropped)
    errors : tuple of (input position, InvalidMessage) for the rejected documents

    Rows may be all zero or shorter than MIN_DOC_LENGTH (every word unknown, text of only
    stop words, ...). That is the document's own content, not an error: the engine skips such
    rows (``streamdp.documents.keep_long_documents``), and whether it does depends only on
    the document itself. These statistics are internal operational metrics, not DP releases.
    """

    counts: sp.csr_matrix
    timestamps: np.ndarray
    doc_ids: tuple[str, ...]
    index: np.ndarray
    n_tokens: np.ndarray
    n_unknown: np.ndarray
    errors: tuple[tuple[int, InvalidMessage], ...]

    @property
    def n_docs(self) -> int:
        return self.counts.shape[0]

    @property
    def total_tokens(self) -> int:
        return int(self.n_tokens.sum())

    @property
    def total_unknown(self) -> int:
        return int(self.n_unknown.sum())

    @property
    def n_empty(self) -> int:
        """Rows with no vocabulary word at all."""
        return int(np.count_nonzero(np.diff(self.counts.indptr) == 0))


def documents_to_counts(docs: Sequence[Document], tokenizer: Tokenizer, vocabulary: Vocabulary,
                        *, max_tokens: int | None = DEFAULT_MAX_TOKENS) -> CountBatch:
    """One CSR count batch from decoded documents of mixed kinds.

    Every document is validated completely before anything is assembled: ``text`` longer than
    ``max_tokens`` tokens after tokenizing is ``too_large``; ``counts`` with ids outside the
    vocabulary, or a ``counts.vocab`` that is not ``vocabulary.id``, is ``invalid_value``.
    Rejected documents are listed in ``errors`` and contribute nothing; the rest form the
    rows of ``counts`` in input order. ``tokens`` documents are matched verbatim (producers
    must normalise like the tokenizer). Nothing here mutates any state.
    """
    d = len(vocabulary)
    limit = math.inf if max_tokens is None else max_tokens
    errors: list[tuple[int, InvalidMessage]] = []
    good: list[tuple[int, Document]] = []
    token_lists: list[Sequence[str]] = []
    token_rows: list[int] = []
    count_rows: list[int] = []
    count_ids: list[tuple[int, ...]] = []
    count_vals: list[tuple[int, ...]] = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, Document):
            raise TypeError(f"docs[{i}] is a {type(doc).__name__}, expected a Document")
        try:
            if doc.kind == "text":
                toks: Sequence[str] = tokenizer.tokenize(doc.payload)  # type: ignore[arg-type]
                if max_tokens is not None and len(toks) > max_tokens:
                    raise InvalidMessage(TOO_LARGE, f"text has {len(toks)} tokens, "
                                                    f"the limit is {max_tokens}")
            elif doc.kind == "tokens":
                toks = doc.payload  # type: ignore[assignment]
            elif doc.kind == "counts":
                ids, cnt = doc.payload  # type: ignore[misc]
                check_counts(ids, cnt, doc.vocabulary_id, limit, vocabulary)
            else:
                raise InvalidMessage(INVALID_VALUE, f"unknown document kind {doc.kind!r}")
        except InvalidMessage as exc:
            errors.append((i, exc))
            continue
        row = len(good)
        good.append((i, doc))
        if doc.kind == "counts":
            count_rows.append(row)
            count_ids.append(ids)
            count_vals.append(cnt)
        else:
            token_rows.append(row)
            token_lists.append(toks)

    n = len(good)
    n_tokens = np.zeros(n, dtype=np.int64)
    n_unknown = np.zeros(n, dtype=np.int64)
    # Token documents: one vectorised lookup for the whole batch.
    lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
    tok_row_idx = np.asarray(token_rows, dtype=np.int64)
    n_tokens[tok_row_idx] = lengths
    cols = vocabulary.lookup(list(itertools.chain.from_iterable(token_lists)))
    rows = np.repeat(tok_row_idx, lengths)
    known = cols >= 0
    n_unknown += np.bincount(rows[~known], minlength=n).astype(np.int64)
    rows, cols = rows[known], cols[known].astype(np.int64)
    data = np.ones(rows.size, dtype=np.float64)
    # Count documents: already ids over the vocabulary.
    if count_rows:
        c_len = np.fromiter(map(len, count_ids), dtype=np.int64, count=len(count_ids))
        c_rows = np.repeat(np.asarray(count_rows, dtype=np.int64), c_len)
        c_cols = np.fromiter(itertools.chain.from_iterable(count_ids), dtype=np.int64, count=int(c_len.sum()))
        c_data = np.fromiter(itertools.chain.from_iterable(count_vals), dtype=np.float64, count=int(c_len.sum()))
        n_tokens[np.asarray(count_rows, dtype=np.int64)] = [sum(c) for c in count_vals]
        rows = np.concatenate([rows, c_rows])
        cols = np.concatenate([cols, c_cols])
        data = np.concatenate([data, c_data])
    X = sp.coo_matrix((data, (rows, cols)), shape=(n, d)).tocsr()
    X = as_count_batch(X, n_features=d)
    X.sort_indices()
    return CountBatch(
        counts=X,
        timestamps=np.fromiter((doc.ts for _, doc in good), dtype=np.float64, count=n),
        doc_ids=tuple(doc.id for _, doc in good),
        index=np.fromiter((i for i, _ in good), dtype=np.intp, count=n),
        n_tokens=n_tokens, n_unknown=n_unknown, errors=tuple(errors))
