"""The public vocabulary: an immutable, content-addressed word list.

Column ``j`` of every count matrix is word ``words[j]``. The vocabulary must be **public**:
build it from a public corpus (or take a published list), never from the private stream —
which words exist would otherwise leak (docs/privacy.md). Its identity is
``vocabulary_id``: the first 16 hex characters of the SHA-256 of the canonical file (below),
so snapshots and state records can say which word list their columns mean.

File format (``save``/``load``; docs/schemas.md): UTF-8 text, one word per line, ``\\n`` line
ends (``\\r\\n`` is accepted on load), an optional first line ``# streamdp vocabulary v1``.
Every other line is a word verbatim: empty lines, duplicates, and lines with leading or
trailing whitespace are errors that name the line number. ``save`` always writes the header and
a final newline, and that exact byte string is the canonical encoding, so
``sha256sum vocab.txt | cut -c1-16`` equals ``vocabulary_id`` for a saved file.
"""
from __future__ import annotations

import hashlib
import itertools
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import scipy.sparse as sp

HEADER = "# streamdp vocabulary v1"
ID_HEX_CHARS = 16
# Characters that would break the one-word-per-line format (str.splitlines separators).
_LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")


def _check_word(word: object, where: str) -> str:
    if not isinstance(word, str):
        raise TypeError(f"{where}: vocabulary words must be str, got {type(word).__name__}")
    if not word:
        raise ValueError(f"{where}: empty word")
    if any(ch in _LINE_BREAKS for ch in word):
        raise ValueError(f"{where}: word contains a line break")
    if word != word.strip():
        raise ValueError(f"{where}: word {word!r} has leading or trailing whitespace")
    if word == HEADER:
        raise ValueError(f"{where}: the header line cannot be a word")
    return word


class Vocabulary:
    """Immutable ordered list of distinct public words; ``words[j]`` is column ``j``.

    ``Vocabulary(words)`` validates: every word a non-empty str without line breaks or
    surrounding whitespace, no duplicates. Behaves as a read-only sequence of str
    (``vocab[j]``, ``len``, iteration, ``in``), as used by ``TopicSnapshot.top_words``.
    Two vocabularies are equal iff their word lists are equal (same order); the hash is the
    content id, so a vocabulary can key a dict.
    """

    __slots__ = ("_words", "_index", "_id")

    def __init__(self, words: Iterable[str]):
        words = tuple(words)
        index: dict[str, int] = {}
        for j, w in enumerate(words):
            _check_word(w, f"word {j}")
            if index.setdefault(w, j) != j:
                raise ValueError(f"word {j}: duplicate of word {index[w]} ({w!r})")
        self._words = words
        self._index = index
        self._id = hashlib.sha256(self.canonical_bytes()).hexdigest()[:ID_HEX_CHARS]

    # -- identity --------------------------------------------------------------------------
    def canonical_bytes(self) -> bytes:
        """The canonical encoding: header line, then every word, each followed by ``\\n``."""
        return "".join(itertools.chain((HEADER, "\n"),
                                       itertools.chain.from_iterable(
                                           (w, "\n") for w in self._words))).encode("utf-8")

    @property
    def vocabulary_id(self) -> str:
        """First 16 hex characters of SHA-256 of :meth:`canonical_bytes`."""
        return self._id

    id = vocabulary_id

    @property
    def words(self) -> tuple[str, ...]:
        return self._words

    # -- sequence / mapping ----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._words)

    def __getitem__(self, j):
        return self._words[j]

    def __iter__(self) -> Iterator[str]:
        return iter(self._words)

    def __contains__(self, word: object) -> bool:
        return word in self._index

    def index(self, word: str) -> int:
        """Column of ``word``; ``KeyError`` if it is not in the vocabulary."""
        try:
            return self._index[word]
        except KeyError:
            raise KeyError(f"{word!r} is not in vocabulary {self._id}") from None

    def get(self, word: str, default: int | None = None) -> int | None:
        return self._index.get(word, default)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocabulary):
            return NotImplemented
        return self._id == other._id and self._words == other._words

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        return f"Vocabulary({len(self._words)} words, id={self._id})"

    # -- files -----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the canonical file (header + one word per line), atomically via a temp file."""
        path = os.fspath(path)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(self.canonical_bytes())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocabulary":
        """Read a vocabulary file; errors name the 1-based line number."""
        with open(path, "rb") as fh:
            data = fh.read()
        return cls.from_bytes(data, source=os.fspath(path))

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "<bytes>") -> "Vocabulary":
        if data.startswith(b"\xef\xbb\xbf"):  # tolerate a UTF-8 byte-order mark
            data = data[3:]
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":  # the final newline terminates the last line
            lines.pop()
        words: list[str] = []
        seen: dict[str, int] = {}
        for lineno, raw in enumerate(lines, start=1):
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{source}:{lineno}: not valid UTF-8 ({exc.reason})") from None
            if lineno == 1 and line == HEADER:
                continue
            if line == "":
                raise ValueError(f"{source}:{lineno}: empty line")
            if line in seen:
                raise ValueError(f"{source}:{lineno}: duplicate word {line!r} "
                                 f"(first on line {seen[line]})")
            try:
                _check_word(line, f"{source}:{lineno}")
            except (TypeError, ValueError) as exc:
                raise ValueError(str(exc)) from None
            seen[line] = lineno
            words.append(line)
        return cls(words)

    # -- building from a public corpus -----------------------------------------------------
    @classmethod
    def build(cls, documents: Iterable[Iterable[str]], *, max_words: int | None = None,
              min_df: int = 1) -> "Vocabulary":
        """Vocabulary of the most widespread words of a **public** corpus.

        Parameters
        ----------
        documents : iterable of token iterables (e.g. ``map(tokenizer.tokenize, texts)``)
        max_words : keep at most this many words (None: all that pass ``min_df``)
        min_df : keep only words occurring in at least this many documents

        Words are ranked by document frequency (descending), ties broken by the word's code
        points (ascending), and the vocabulary is in that rank order, so the result depends only
        on the multiset of documents — not on their order or on hash seeds. Never call this on
        the private stream: the vocabulary is published with every snapshot.
        """
        if isinstance(min_df, bool) or not isinstance(min_df, int) or min_df < 1:
            raise ValueError(f"min_df must be a positive int, got {min_df!r}")
        if max_words is not None and (isinstance(max_words, bool) or not isinstance(max_words, int)
                                      or max_words < 1):
            raise ValueError(f"max_words must be a positive int or None, got {max_words!r}")
        if isinstance(documents, str):
            raise TypeError("documents must be an iterable of token lists, not a str")
        df: Counter[str] = Counter()
        for doc in documents:
            if isinstance(doc, str):
                raise TypeError("each document must be an iterable of tokens, not a str "
                                "(tokenize the text first)")
            df.update(set(doc))
        ranked = sorted((w for w, c in df.items() if c >= min_df), key=lambda w: (-df[w], w))
        if max_words is not None:
            ranked = ranked[:max_words]
        return cls(ranked)

    # -- counting ---------------------------------------------------------------------------
    def lookup(self, tokens: Iterable[str]) -> np.ndarray:
        """Column of every token (``intp``), ``-1`` for tokens not in the vocabulary."""
        if not isinstance(tokens, (list, tuple)):
            tokens = list(tokens)
        return np.fromiter(map(self._index.get, tokens, itertools.repeat(-1)),
                           dtype=np.intp, count=len(tokens))

    def vectorize(self, documents: Iterable[Sequence[str]]) -> tuple[sp.csr_matrix, np.ndarray]:
        """Count rows for token lists.

        Returns
        -------
        counts : csr_matrix (n_docs, len(self)) float64, canonical (sorted, summed indices,
            no explicit zeros — see ``streamdp.documents.as_count_batch``)
        n_unknown : int64 array (n_docs,), tokens of each document not in the vocabulary
            (dropped from the counts)

        A document may end up as an all-zero row; the engine skips rows shorter than
        ``MIN_DOC_LENGTH`` by itself.
        """
        docs = documents if isinstance(documents, list) else list(documents)
        n, d = len(docs), len(self._words)
        for i, doc in enumerate(docs):
            if isinstance(doc, str):
                raise TypeError(f"document {i} is a str; pass token lists (tokenize first)")
        lengths = np.fromiter(map(len, docs), dtype=np.int64, count=n)
        cols = self.lookup(list(itertools.chain.from_iterable(docs)))
        rows = np.repeat(np.arange(n, dtype=np.int64), lengths)
        known = cols >= 0
        n_unknown = np.bincount(rows[~known], minlength=n).astype(np.int64)
        rows, cols = rows[known], cols[known]
        # Sort by (row, col) through one int64 key, then count runs of equal keys.
        width = max(d, 1)
        key = rows * width + cols
        key.sort(kind="stable")
        if key.size:
            starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
            uniq = key[starts]
            counts = np.diff(np.append(starts, key.size)).astype(np.float64)
        else:
            uniq = key
            counts = np.zeros(0, dtype=np.float64)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(uniq // width, minlength=n), out=indptr[1:])
        X = sp.csr_matrix((counts, uniq % width, indptr), shape=(n, d))
        X.has_sorted_indices = True
        return X, n_unknown
