"""Input-document messages (schema v1): decoding, validation, encoding, batching, DLQ headers.

A document arrives on the docs topic as a msgpack map (DESIGN §6; docs/schemas.md)::

    {"v": 1, "id": str, "ts": float | int,
     and exactly one of
       "text": str                                   raw text, tokenized by the sketcher
       "tokens": [str, ...]                          pre-tokenized, matched verbatim
       "counts": {"ids": [int], "counts": [int],     word counts over the public vocabulary
                  "vocab": str (optional)}}          ... whose vocabulary_id this must equal

:func:`decode_document` turns bytes into a :class:`Document` or raises :class:`InvalidMessage`
with a stable ``error_class`` (the sketcher sends such messages to the dead-letter topic with
:func:`dlq_headers`). :func:`documents_to_counts` turns a batch of decoded documents into one
CSR count batch, validating everything first and returning the bad documents separately, so
a bad document never half-updates a sketch.

Error messages describe types, positions and bounds, never the document's words, so they can
be logged and put in headers without copying private text around (the DLQ record itself still
carries the raw message: the DLQ topic needs the same access control as the docs topic).
"""
from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import msgpack
import numpy as np
import scipy.sparse as sp

from streamdp import serialization as ser
from streamdp.documents import as_count_batch
from streamdp.text.tokenizer import Tokenizer
from streamdp.text.vocabulary import Vocabulary

SCHEMA_VERSION = 1
MAX_ID_CHARS = 256
DEFAULT_MAX_BYTES = 1 << 20         # 1 MiB per document message
DEFAULT_MAX_TOKENS = 100_000        # tokens per document (text after tokenizing, tokens, Σcounts)
MAX_DLQ_MESSAGE_BYTES = 1024
PAYLOAD_KINDS = ("text", "tokens", "counts")

# Stable error classes (part of the operational interface: DLQ headers, metric labels).
MALFORMED_MSGPACK = "malformed_msgpack"
UNSUPPORTED_VERSION = "unsupported_version"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
INVALID_UTF8 = "invalid_utf8"
EMPTY_DOCUMENT = "empty_document"
TOO_LARGE = "too_large"
INVALID_VALUE = "invalid_value"
ERROR_CLASSES = (MALFORMED_MSGPACK, UNSUPPORTED_VERSION, MISSING_FIELD, WRONG_TYPE, INVALID_UTF8,
                 EMPTY_DOCUMENT, TOO_LARGE, INVALID_VALUE)
# Record-level classes of the user-level unit (privacy_unit: user; not decoding errors: the
# message is a valid document, refused by the sketcher; docs/privacy.md "The user-level unit"):
MISSING_USER = "missing_user"                      # no ``user`` field in user mode
USER_PARTITION_MISMATCH = "user_partition_mismatch"  # not on partition_for_user(user, n)
USER_ERROR_CLASSES = (MISSING_USER, USER_PARTITION_MISMATCH)
# A valid document whose id this partition already counted (streamdp.services.dedup):
DUPLICATE_ID = "duplicate_id"

# Dead-letter record headers (values are UTF-8 bytes; partition and offset in decimal).
HEADER_ERROR_CLASS = "streamdp.error.class"
HEADER_ERROR_MESSAGE = "streamdp.error.message"
HEADER_SOURCE_TOPIC = "streamdp.source.topic"
HEADER_SOURCE_PARTITION = "streamdp.source.partition"
HEADER_SOURCE_OFFSET = "streamdp.source.offset"
DLQ_HEADERS = (HEADER_ERROR_CLASS, HEADER_ERROR_MESSAGE, HEADER_SOURCE_TOPIC,
               HEADER_SOURCE_PARTITION, HEADER_SOURCE_OFFSET)


class InvalidMessage(ser.SchemaError):
    """A document message that cannot be used; ``error_class`` is one of ERROR_CLASSES."""

    def __init__(self, error_class: str, message: str):
        if error_class not in ERROR_CLASSES:
            raise ValueError(f"unknown error class {error_class!r}")
        super().__init__(error_class, message)
        self.error_class = error_class
        self.message = message

    def __str__(self) -> str:
        return f"{self.error_class}: {self.message}"

    @classmethod
    def user(cls, error_class: str, message: str) -> "InvalidMessage":
        """A record refused by the user-level unit (one of ``USER_ERROR_CLASSES``)."""
        if error_class not in USER_ERROR_CLASSES:
            raise ValueError(f"unknown user-level error class {error_class!r}")
        exc = cls.__new__(cls)
        ser.SchemaError.__init__(exc, error_class, message)
        exc.error_class, exc.message = error_class, message
        return exc

    @classmethod
    def duplicate(cls, message: str) -> "InvalidMessage":
        """A valid document refused because its id was already counted (``duplicate_id``)."""
        exc = cls.__new__(cls)
        ser.SchemaError.__init__(exc, DUPLICATE_ID, message)
        exc.error_class, exc.message = DUPLICATE_ID, message
        return exc

    def __repr__(self) -> str:
        return f"InvalidMessage({self.error_class!r}, {self.message!r})"


Kind = Literal["text", "tokens", "counts"]
Payload = Union[str, tuple[str, ...], tuple[tuple[int, ...], tuple[int, ...]]]


@dataclass(frozen=True)
class Document:
    """A validated input document.

    ``payload`` by ``kind``: ``"text"`` -> str (not blank); ``"tokens"`` -> tuple of non-empty
    str; ``"counts"`` -> ``(ids, counts)``, two equally long tuples of int with distinct ids ≥ 0
    and counts ≥ 1. ``vocabulary_id`` is the optional ``counts.vocab`` field (else None).
    """

    id: str
    ts: float
    kind: Kind
    payload: Payload = field(repr=False)  # document content stays out of logs
    vocabulary_id: str | None = None
    user: str | None = field(default=None, repr=False)   # optional user id (the producer's)


def _type_name(x: Any) -> str:
    return {bytes: "bin", str: "str", bool: "bool", int: "int", float: "float", list: "array",
            dict: "map", type(None): "nil"}.get(type(x), type(x).__name__)


def _require(obj: Mapping, key: str, where: str = "") -> Any:
    if key not in obj:
        raise InvalidMessage(MISSING_FIELD, f"missing field {where}{key!r}")
    return obj[key]


def _check_str(value: Any, name: str) -> str:
    if isinstance(value, (bytes, bytearray)):
        try:
            bytes(value).decode("utf-8")
            how = "valid UTF-8, but sent as msgpack bin"
        except UnicodeDecodeError:
            how = "not valid UTF-8"
        raise InvalidMessage(INVALID_UTF8, f"{name} must be a msgpack str; got bin ({how})")
    if type(value) is not str:
        raise InvalidMessage(WRONG_TYPE, f"{name} must be a str, got {_type_name(value)}")
    return value


def _check_int_list(value: Any, name: str) -> list[int]:
    if type(value) is not list:
        raise InvalidMessage(WRONG_TYPE, f"{name} must be an array of int, got {_type_name(value)}")
    for i, x in enumerate(value):
        if type(x) is not int:
            raise InvalidMessage(WRONG_TYPE, f"{name}[{i}] must be an int, got {_type_name(x)}")
    return value


def _unpack(raw: Any, max_bytes: int) -> Any:
    if raw is None:
        raise InvalidMessage(MALFORMED_MSGPACK, "null message value (tombstone)")
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise TypeError(f"raw must be bytes, got {type(raw).__name__}")
    if len(raw) > max_bytes:
        raise InvalidMessage(TOO_LARGE, f"message of {len(raw)} bytes exceeds the limit of {max_bytes}")
    try:
        return ser.loads(bytes(raw), max_bytes=max_bytes)
    except ser.SchemaError as exc:
        if isinstance(exc.__cause__, UnicodeDecodeError):
            raise InvalidMessage(INVALID_UTF8, "a msgpack str is not valid UTF-8 "
                                 f"(at byte {exc.__cause__.start} of that string)") from None
        raise InvalidMessage(MALFORMED_MSGPACK, _describe(exc.__cause__ or exc)) from None
    except (TypeError, OverflowError, RecursionError, MemoryError, msgpack.UnpackException) as exc:
        raise InvalidMessage(MALFORMED_MSGPACK, _describe(exc)) from None


def _describe(exc: BaseException) -> str:
    detail = str(exc)
    return f"not valid msgpack: {type(exc).__name__}{': ' + detail if detail else ''}"[:200]


def validate_document(obj: Any, *, max_tokens: int = DEFAULT_MAX_TOKENS,
                      vocabulary: Vocabulary | None = None) -> Document:
    """Validate an already unpacked message (see :func:`decode_document`)."""
    if not isinstance(obj, dict):
        raise InvalidMessage(WRONG_TYPE, f"a document must be a msgpack map, got {_type_name(obj)}")
    v = _require(obj, "v")
    if type(v) is not int:
        raise InvalidMessage(WRONG_TYPE, f"'v' must be an int, got {_type_name(v)}")
    if v != SCHEMA_VERSION:
        raise InvalidMessage(UNSUPPORTED_VERSION,
                             f"unsupported schema version {v} (this build reads v{SCHEMA_VERSION})")

    doc_id = _check_str(_require(obj, "id"), "'id'")
    if not doc_id:
        raise InvalidMessage(INVALID_VALUE, "'id' must not be empty")
    if len(doc_id) > MAX_ID_CHARS:
        raise InvalidMessage(INVALID_VALUE, f"'id' has {len(doc_id)} characters (limit {MAX_ID_CHARS})")

    ts = _require(obj, "ts")
    if type(ts) not in (int, float):
        raise InvalidMessage(WRONG_TYPE, f"'ts' must be a number, got {_type_name(ts)}")
    ts = float(ts)
    if not math.isfinite(ts) or ts < 0:
        raise InvalidMessage(INVALID_VALUE, f"'ts' must be finite and >= 0, got {ts!r}")

    user = None
    if "user" in obj:       # optional: who wrote it (the user-level unit; docs/privacy.md)
        user = _check_str(obj["user"], "'user'")
        if not user or len(user) > MAX_ID_CHARS:
            raise InvalidMessage(INVALID_VALUE, f"'user' must have 1 to {MAX_ID_CHARS} "
                                                f"characters, got {len(user)}")

    present = [k for k in PAYLOAD_KINDS if k in obj]
    if not present:
        raise InvalidMessage(MISSING_FIELD, "missing payload: one of 'text', 'tokens', 'counts'")
    if len(present) > 1:
        raise InvalidMessage(INVALID_VALUE, f"exactly one of 'text', 'tokens', 'counts' allowed, "
                                            f"got {', '.join(map(repr, present))}")
    kind = present[0]
    value = obj[kind]

    if kind == "text":
        text = _check_str(value, "'text'")
        if not text.strip():
            raise InvalidMessage(EMPTY_DOCUMENT, "'text' is empty or blank")
        return Document(doc_id, ts, "text", text, user=user)

    if kind == "tokens":
        if type(value) is not list:
            raise InvalidMessage(WRONG_TYPE, f"'tokens' must be an array of str, got {_type_name(value)}")
        if not value:
            raise InvalidMessage(EMPTY_DOCUMENT, "'tokens' is empty")
        if len(value) > max_tokens:
            raise InvalidMessage(TOO_LARGE, f"{len(value)} tokens exceed the limit of {max_tokens}")
        for i, tok in enumerate(value):
            _check_str(tok, f"'tokens'[{i}]")
            if not tok:
                raise InvalidMessage(INVALID_VALUE, f"'tokens'[{i}] is an empty string")
        return Document(doc_id, ts, "tokens", tuple(value), user=user)

    # counts
    if type(value) is not dict:
        raise InvalidMessage(WRONG_TYPE, f"'counts' must be a map {{ids, counts}}, got {_type_name(value)}")
    ids = _check_int_list(_require(value, "ids", "'counts'."), "'counts'.'ids'")
    counts = _check_int_list(_require(value, "counts", "'counts'."), "'counts'.'counts'")
    vocab_id = _check_str(value["vocab"], "'counts'.'vocab'") if "vocab" in value else None
    if len(ids) != len(counts):
        raise InvalidMessage(INVALID_VALUE, f"'counts' has {len(ids)} ids but {len(counts)} counts")
    if not ids:
        raise InvalidMessage(EMPTY_DOCUMENT, "'counts' is empty")
    if len(ids) > max_tokens:
        raise InvalidMessage(TOO_LARGE, f"{len(ids)} distinct words exceed the limit of {max_tokens} tokens")
    _check_counts(ids, counts, vocab_id, max_tokens, vocabulary)
    return Document(doc_id, ts, "counts", (tuple(ids), tuple(counts)), vocab_id, user=user)


def _all_at_least(values: Sequence, bound: int) -> bool:
    """True only if no value is ``< bound``, proven by one C-level ``min``; False means "scan".

    A hot-path shortcut for :func:`_check_counts` (called twice per counts document): when it
    returns False the caller runs the original per-element scan, which finds (and names) the
    first offending position, so results and errors are exactly those of the scan alone. min()
    can only return a value ``>= bound`` if no element is ``< bound`` (NaN never passes), and
    anything min() cannot compare falls back to the scan.
    """
    try:
        return len(values) == 0 or bool(min(values) >= bound)
    except Exception:       # noqa: BLE001 — the scan decides, and raises what it always raised
        return False


def _all_below(values: Sequence, bound: int) -> bool:
    """True only if no value is ``>= bound`` (one C-level ``max``); see :func:`_all_at_least`."""
    try:
        return len(values) == 0 or bool(max(values) < bound)
    except Exception:       # noqa: BLE001
        return False


def _check_counts(ids: Sequence[int], counts: Sequence[int], vocab_id: str | None,
                  max_tokens: float, vocabulary: Vocabulary | None) -> None:
    bad = None if _all_at_least(counts, 1) else next((i for i, c in enumerate(counts) if c < 1), None)
    if bad is not None:
        raise InvalidMessage(INVALID_VALUE, f"'counts'.'counts'[{bad}] = {counts[bad]} is not a positive count")
    bad = None if _all_at_least(ids, 0) else next((i for i, j in enumerate(ids) if j < 0), None)
    if bad is not None:
        raise InvalidMessage(INVALID_VALUE, f"'counts'.'ids'[{bad}] = {ids[bad]} is negative")
    total = sum(counts)  # Python ints: no overflow
    if total > max_tokens:
        raise InvalidMessage(TOO_LARGE, f"{total} tokens exceed the limit of {max_tokens}")
    if len(set(ids)) != len(ids):
        raise InvalidMessage(INVALID_VALUE, "'counts'.'ids' contains duplicates")
    if vocabulary is not None:
        d = len(vocabulary)
        bad = None if _all_below(ids, d) else next((i for i, j in enumerate(ids) if j >= d), None)
        if bad is not None:
            raise InvalidMessage(INVALID_VALUE, f"'counts'.'ids'[{bad}] = {ids[bad]} is out of range "
                                                f"for a vocabulary of {d} words")
        if vocab_id is not None and vocab_id != vocabulary.id:
            raise InvalidMessage(INVALID_VALUE, f"counts are over vocabulary {vocab_id[:64]!r}, "
                                                f"this service uses {vocabulary.id!r}")


def decode_document(raw: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES,
                    max_tokens: int = DEFAULT_MAX_TOKENS,
                    vocabulary: Vocabulary | None = None) -> Document:
    """Decode and validate one input-document message.

    Parameters
    ----------
    raw : the Kafka message value (``None``, a tombstone, is ``malformed_msgpack``)
    max_bytes : larger messages are ``too_large`` (checked before unpacking)
    max_tokens : more ``tokens``, or a larger Σ``counts``, is ``too_large``. For ``text`` the
        limit applies after tokenizing, in :func:`documents_to_counts`.
    vocabulary : if given, ``counts`` ids are range-checked and ``counts.vocab`` must match
        its id here already (otherwise :func:`documents_to_counts` does it)

    Raises
    ------
    InvalidMessage — and nothing else for any bytes input. Keys other than ``v``, ``id``,
    ``ts``, the optional ``user`` and the payload are ignored (room for additive extensions
    within v1).
    """
    return validate_document(_unpack(raw, max_bytes), max_tokens=max_tokens, vocabulary=vocabulary)


def encode_document(id: str, ts: float, *, text: str | None = None,
                    tokens: Iterable[str] | None = None,
                    counts: Mapping[int, int] | tuple[Sequence[int], Sequence[int]] | None = None,
                    vocabulary_id: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                    max_tokens: int = DEFAULT_MAX_TOKENS, user: str | None = None) -> bytes:
    """Encode one document message (v1) for producers; exactly one of text/tokens/counts.

    ``counts`` is ``{word_id: count}`` or ``(ids, counts)`` (numpy arrays accepted);
    ``vocabulary_id`` (counts only) is sent as ``counts.vocab``; ``user`` (optional) is the
    id of the document's author (the user-level unit). The result is validated with
    :func:`decode_document` under the given limits, so this raises :class:`InvalidMessage`
    (a ValueError) for anything a sketcher would reject.
    """
    given = [name for name, val in (("text", text), ("tokens", tokens), ("counts", counts))
             if val is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of text, tokens, counts (got {given or 'none'})")
    if vocabulary_id is not None and counts is None:
        raise ValueError("vocabulary_id only applies to counts documents")
    if isinstance(ts, (int, float, np.integer, np.floating)) and not isinstance(ts, bool):
        ts = float(ts)
    msg: dict[str, Any] = {"v": SCHEMA_VERSION, "id": id, "ts": ts}
    if user is not None:
        msg["user"] = user
    if text is not None:
        msg["text"] = text
    elif tokens is not None:
        if isinstance(tokens, str):
            raise TypeError("tokens must be a list of str, not a str (use text=)")
        msg["tokens"] = list(tokens)
    else:
        if isinstance(counts, Mapping):
            ids, cnt = list(counts.keys()), list(counts.values())
        else:
            ids, cnt = counts
        # operator.index: numpy integers are fine, floats are refused rather than truncated
        body: dict[str, Any] = {"ids": [operator.index(i) for i in ids],
                                "counts": [operator.index(c) for c in cnt]}
        if vocabulary_id is not None:
            body["vocab"] = vocabulary_id
        msg["counts"] = body
    try:
        raw = ser.dumps(msg)
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. lone surrogates, huge ints
        raise ValueError(f"cannot encode document: {exc}") from exc
    decode_document(raw, max_bytes=max_bytes, max_tokens=max_tokens)
    return raw


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
                _check_counts(ids, cnt, doc.vocabulary_id, limit, vocabulary)
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


def _truncate_utf8(text: str, limit: int) -> bytes:
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return data
    return data[:limit].decode("utf-8", errors="ignore").encode("utf-8")


def dlq_headers(error: InvalidMessage, topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    """Kafka headers for a dead-letter record (message truncated to 1 KiB at a UTF-8 boundary)."""
    if not isinstance(error, InvalidMessage):
        raise TypeError(f"error must be an InvalidMessage, got {type(error).__name__}")
    return [
        (HEADER_ERROR_CLASS, error.error_class.encode("ascii")),
        (HEADER_ERROR_MESSAGE, _truncate_utf8(error.message, MAX_DLQ_MESSAGE_BYTES)),
        (HEADER_SOURCE_TOPIC, str(topic).encode("utf-8", errors="replace")),
        (HEADER_SOURCE_PARTITION, str(int(partition)).encode("ascii")),
        (HEADER_SOURCE_OFFSET, str(int(offset)).encode("ascii")),
    ]


# --------------------------------------------------------------------------- bulk decoding
#: Σcounts per document is summed in int64: the bulk path needs max_tokens² < 2⁶³
_BULK_MAX_TOKENS = 1 << 31


def _ints_fit(values: Sequence) -> bool:
    """Every element an exact ``int`` (not bool) that fits int64 (a slow per-document check,
    used only when the batch-wide check of :class:`DocumentBatch` failed)."""
    return (not values or (set(map(type, values)) == {int}
                           and -(1 << 63) <= min(values) and max(values) < (1 << 63)))


class DocumentBatch:
    """The document messages of one poll batch, decoded and validated in bulk.

    Same results as :func:`decode_document` per message followed by
    :func:`documents_to_counts` — the same documents, the same CSR rows bit for bit, the same
    error class and message for every rejected message — at a fraction of the per-message
    Python work (the sketcher's hot path, docs/benchmarks.md "End-to-end sketcher speed"):

    * every message is unpacked once (arrays as tuples) and its header (``v``, ``id``, ``ts``,
      the optional ``user``) and payload *shape* checked inline; ``counts`` documents keep
      their id and count tuples;
    * all ids and counts of the batch are then checked at once: exact ``int`` types (one
      ``set(map(type, …))`` over the concatenation), counts in [1, max_tokens], ids in
      [0, d), Σcounts ≤ max_tokens, ids strictly increasing within a document (so no
      duplicates; unsorted documents get a set-based duplicate check and a sorted row), the
      ``counts.vocab`` id; the CSR batch is built directly from the concatenated arrays;
    * anything the bulk checks do not prove valid — every malformed message, every bad
      value, every ``tokens`` payload not of plain non-empty str — is decoded again by
      :func:`decode_document` and, if valid, goes through :func:`documents_to_counts`,
      so a bad message gets exactly the error it always got, at its own position, and never
      affects the other rows.

    Order of checks (and so which error a message that is wrong in several ways gets) is the
    per-message one: decoding (message, schema, counts ≥ 1, ids ≥ 0, Σcounts, duplicates),
    then whatever the caller rejects with :meth:`reject` (the sketcher: record time in the
    future), then :meth:`to_counts` (text too long, ids outside the vocabulary, vocabulary id).

    Parameters
    ----------
    values : message values (bytes); positions are the batch positions
    vocabulary : the service's vocabulary (the ids' range and ``counts.vocab``)
    rejected : position → error for messages refused before decoding (not decoded)
    """

    def __init__(self, values: Sequence[Any], vocabulary: Vocabulary, *,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_tokens: int = DEFAULT_MAX_TOKENS,
                 rejected: Mapping[int, InvalidMessage] | None = None) -> None:
        n = len(values)
        self.n, self.vocabulary = n, vocabulary
        self.max_bytes, self.max_tokens = max_bytes, max_tokens
        self.errors: dict[int, InvalidMessage] = dict(rejected or {})
        self.docs: dict[int, Document] = {}        # position -> Document (text, tokens, slow counts)
        self.ts = np.full(n, np.nan)
        loads = msgpack.unpackb
        errors, docs, ts_out = self.errors, self.docs, self.ts
        bulk = max_tokens <= _BULK_MAX_TOKENS
        # the compiled parser takes the valid token-id messages of the common shape; the
        # loop below decodes every message it declines (and only those)
        parsed = _parse_counts_fast(values, self.errors, vocabulary, max_bytes, max_tokens) \
            if bulk and n else None
        f_pos: list[int] = []
        f_id: list[str] = []
        f_ts: list[float] = []
        f_ids: list[tuple] = []
        f_cnt: list[tuple] = []
        f_voc: list[tuple[int, str]] = []            # (fast row, counts.vocab) where given
        slow: list[int] = []
        self._f_user = f_user = {}                   # fast counts position -> its user id
        inf = math.inf
        todo = range(n) if parsed is None else parsed.declined.tolist()
        for i in todo:
            if i in errors:
                continue
            raw = values[i]
            obj = None
            if type(raw) is bytes and len(raw) <= max_bytes:
                try:
                    # ser.loads' decoder settings, with arrays as tuples (fewer allocations)
                    obj = loads(raw, raw=False, use_list=False, strict_map_key=True,
                                max_bin_len=max_bytes, max_str_len=max_bytes)
                except Exception:       # noqa: BLE001 — decode_document names the error below
                    obj = None
            if type(obj) is dict:
                v, did, ts, user = obj.get("v"), obj.get("id"), obj.get("ts"), obj.get("user")
                if (type(v) is int and v == SCHEMA_VERSION and type(did) is str
                        and 0 < len(did) <= MAX_ID_CHARS and (type(ts) is float or type(ts) is int)
                        and (user is None and "user" not in obj
                             or type(user) is str and 0 < len(user) <= MAX_ID_CHARS)):
                    ts = float(ts)
                    if 0.0 <= ts < inf:
                        has_text, has_tokens = "text" in obj, "tokens" in obj
                        if "counts" in obj:
                            c = obj["counts"]
                            if not (has_text or has_tokens) and type(c) is dict and bulk:
                                ids, cnt = c.get("ids"), c.get("counts")
                                if (type(ids) is tuple and type(cnt) is tuple
                                        and 0 < len(ids) == len(cnt) <= max_tokens):
                                    if "vocab" in c:    # must be this vocabulary's id
                                        f_voc.append((len(f_pos), c["vocab"]))
                                    f_pos.append(i)
                                    if user is not None:
                                        f_user[i] = user
                                    f_id.append(did)
                                    f_ts.append(ts)
                                    f_ids.append(ids)
                                    f_cnt.append(cnt)
                                    continue
                        elif has_text and not has_tokens:
                            text = obj["text"]
                            if type(text) is str and text.strip():
                                docs[i] = Document(did, ts, "text", text, user=user)
                                ts_out[i] = ts
                                continue
                        elif has_tokens and not has_text:
                            toks = obj["tokens"]
                            if (type(toks) is tuple and 0 < len(toks) <= max_tokens
                                    and set(map(type, toks)) == {str} and all(toks)):
                                docs[i] = Document(did, ts, "tokens", toks, user=user)
                                ts_out[i] = ts
                                continue
            slow.append(i)
        bad_rows = self._check_counts_bulk(f_ids, f_cnt, f_voc)
        if bad_rows.size:
            slow.extend(f_pos[j] for j in bad_rows)
            keep = np.ones(len(f_pos), dtype=bool)
            keep[bad_rows] = False
            f_pos = [p for p, k in zip(f_pos, keep.tolist()) if k]
            f_id = [x for x, k in zip(f_id, keep.tolist()) if k]
            f_ts = [x for x, k in zip(f_ts, keep.tolist()) if k]
        self._f_pos = np.asarray(f_pos, dtype=np.intp)
        self._f_id = f_id
        self._f_ts = np.asarray(f_ts, dtype=np.float64)
        if parsed is not None and parsed.pos.size:
            self._merge_parsed(parsed)
        self._f_alive = np.ones(self._f_pos.size, dtype=bool)
        if self._f_pos.size:
            ts_out[self._f_pos] = self._f_ts
        for i in sorted(slow):
            try:
                doc = decode_document(values[i], max_bytes=max_bytes, max_tokens=max_tokens)
            except InvalidMessage as exc:
                errors[i] = exc
                continue
            docs[i] = doc
            ts_out[i] = doc.ts

    # -- the bulk checks of the counts documents ------------------------------------------
    def _check_counts_bulk(self, f_ids: list, f_cnt: list, f_voc: list) -> np.ndarray:
        """Check the ``counts`` documents found by the decoding loop all at once; keep their
        arrays (``_ids``, ``_cnt``, ``_lens``, ``_sort``) and return the rows that the bulk
        checks cannot prove valid (decoded again, one by one, by the caller)."""
        nf = len(f_ids)
        self._lens = lens = np.fromiter(map(len, f_ids), dtype=np.int64, count=nf)
        flat_ids = list(itertools.chain.from_iterable(f_ids))
        flat_cnt = list(itertools.chain.from_iterable(f_cnt))
        suspect = np.zeros(nf, dtype=bool)
        # exact int types (a bool is not an id) ...
        ok = not flat_ids or set(map(type, flat_ids)) == {int} == set(map(type, flat_cnt))
        if ok:
            try:            # ... that fit int64 (fromiter raises OverflowError otherwise)
                ids = np.fromiter(flat_ids, dtype=np.int64, count=len(flat_ids))
                cnt = np.fromiter(flat_cnt, dtype=np.int64, count=len(flat_cnt))
            except OverflowError:
                ok = False
        if not ok:
            # a bool, float, str, array or huge int somewhere: find its documents
            suspect = np.fromiter((not (_ints_fit(a) and _ints_fit(b)) for a, b in zip(f_ids, f_cnt)),
                                  dtype=bool, count=nf)
            keep = np.repeat(~suspect, lens).tolist()
            flat_ids = list(itertools.compress(flat_ids, keep))
            flat_cnt = list(itertools.compress(flat_cnt, keep))
            ids = np.fromiter(flat_ids, dtype=np.int64, count=len(flat_ids))
            cnt = np.fromiter(flat_cnt, dtype=np.int64, count=len(flat_cnt))
        ok_rows = np.flatnonzero(~suspect)
        ok_lens = lens[ok_rows]
        bad = suspect.copy()
        sort_rows = np.zeros(nf, dtype=bool)
        if ids.size:
            d = len(self.vocabulary)
            starts = np.concatenate([[0], np.cumsum(ok_lens)[:-1]])
            elem_bad = (cnt < 1) | (cnt > self.max_tokens) | (ids < 0) | (ids >= d)
            row_bad = np.add.reduceat(elem_bad, starts) > 0
            row_bad |= np.add.reduceat(cnt, starts) > self.max_tokens
            # ids strictly increasing inside each document: no duplicates, already CSR order
            down = np.ones(ids.size, dtype=bool)
            down[1:] = ids[1:] <= ids[:-1]
            down[starts] = False
            unsorted = (np.add.reduceat(down, starts) > 0) & ~row_bad
            bad[ok_rows] = row_bad
            for r in ok_rows[unsorted].tolist():
                if len(set(f_ids[r])) != len(f_ids[r]):
                    bad[r] = True                   # duplicates: decode_document names them
                else:
                    sort_rows[r] = True
        vid = self.vocabulary.id
        for r, voc in f_voc:
            if voc != vid:
                bad[r] = True
        # arrays of the rows that stay (suspect rows were never in ids/cnt)
        keep_elems = np.repeat(~bad[ok_rows], ok_lens)
        self._ids, self._cnt = ids[keep_elems], cnt[keep_elems]
        self._lens, self._sort = lens[~bad], sort_rows[~bad]
        return np.flatnonzero(bad)

    # -- after decoding --------------------------------------------------------------------
    def _merge_parsed(self, parsed: "_ParsedCounts") -> None:
        """Put the rows of the compiled parser and those of the Python loop (already in
        ``_f_pos`` … ``_sort``) into one set of arrays, rows in batch order."""
        if not self._f_pos.size:
            self._f_pos, self._f_id, self._f_ts = parsed.pos, parsed.doc_ids, parsed.ts
            self._ids, self._cnt, self._lens = parsed.ids, parsed.cnt, parsed.lens
            self._sort = np.zeros(parsed.pos.size, dtype=bool)
            return
        pos = np.concatenate([parsed.pos, self._f_pos])
        order = np.argsort(pos, kind="stable")
        lens = np.concatenate([parsed.lens, self._lens])
        src = np.zeros(lens.size, dtype=np.int64)            # each row's first element ...
        np.cumsum(lens[:-1], out=src[1:])                    # ... in the concatenation
        lens = lens[order]
        dst = np.zeros(lens.size, dtype=np.int64)
        np.cumsum(lens[:-1], out=dst[1:])
        take = np.repeat(src[order] - dst, lens) + np.arange(int(lens.sum()))
        self._ids = np.concatenate([parsed.ids, self._ids])[take]
        self._cnt = np.concatenate([parsed.cnt, self._cnt])[take]
        self._lens = lens
        self._sort = np.concatenate([np.zeros(parsed.pos.size, dtype=bool), self._sort])[order]
        self._f_pos = pos[order]
        self._f_ts = np.concatenate([parsed.ts, self._f_ts])[order]
        all_ids = parsed.doc_ids + self._f_id
        self._f_id = [all_ids[j] for j in order.tolist()]

    def _fast_row(self, i: int) -> int | None:
        """Row of position ``i`` among the token-id rows built in bulk (None if not one)."""
        r = int(np.searchsorted(self._f_pos, i))
        return r if r < self._f_pos.size and self._f_pos[r] == i else None

    @property
    def valid(self) -> np.ndarray:
        """Positions of the messages decoded and not rejected so far (ascending)."""
        pos = self._f_pos[self._f_alive]
        if self.docs:
            pos = np.sort(np.concatenate([pos, np.fromiter(self.docs, dtype=np.intp, count=len(self.docs))]))
        return np.asarray(pos, dtype=np.intp)

    def user(self, i: int) -> str | None:
        """The ``user`` field of the decoded message at position ``i`` (None if absent)."""
        doc = self.docs.get(i)
        return doc.user if doc is not None else self._f_user.get(i)

    def reject(self, i: int, exc: InvalidMessage) -> None:
        """Refuse the decoded message at position ``i`` (e.g. its time is in the future)."""
        r = self._fast_row(i)
        if r is not None and self._f_alive[r]:
            self._f_alive[r] = False
        elif self.docs.pop(i, None) is None:
            raise KeyError(f"position {i} is not a decoded document")
        self.errors[i] = exc
        self.ts[i] = np.nan

    def to_counts(self, tokenizer: Tokenizer) -> CountBatch:
        """One CSR count batch of every document still valid, rows in batch order; ``index``
        holds batch positions and ``errors`` every rejected position (ascending), as
        :func:`documents_to_counts` would for the decoded documents."""
        vocabulary, d = self.vocabulary, len(self.vocabulary)
        alive = self._f_alive
        nf = int(alive.sum())
        if nf:
            lens = self._lens[alive]
            elems = np.repeat(alive, self._lens) if nf < alive.size else slice(None)
            indptr = np.zeros(nf + 1, dtype=np.int64)
            np.cumsum(lens, out=indptr[1:])
            idx_dtype = np.int32 if max(d, int(indptr[-1])) < (1 << 31) else np.int64
            Xf = sp.csr_matrix((self._cnt[elems].astype(np.float64), self._ids[elems].astype(idx_dtype),
                                indptr.astype(idx_dtype)), shape=(nf, d))
            if self._sort[alive].any():
                Xf.has_sorted_indices = False
                Xf.sort_indices()
            else:
                Xf.has_sorted_indices = True
            Xf.has_canonical_format = True
            f_tokens = np.add.reduceat(self._cnt[elems], indptr[:-1]) if lens.size else np.zeros(0, np.int64)
            f_pos = self._f_pos[alive]
            f_ts = self._f_ts[alive]
            f_ids = list(self._f_id) if nf == alive.size else \
                [x for x, a in zip(self._f_id, alive.tolist()) if a]
        errors = dict(self.errors)
        if self.docs:
            slow_pos = sorted(self.docs)
            cb = documents_to_counts([self.docs[i] for i in slow_pos], tokenizer, vocabulary,
                                     max_tokens=self.max_tokens)
            for j, exc in cb.errors:
                errors[slow_pos[j]] = exc
            s_pos = np.asarray(slow_pos, dtype=np.intp)[cb.index]
        if not self.docs or cb.n_docs == 0:
            if nf:
                out_X, pos, ts, ids = Xf, f_pos, f_ts, tuple(f_ids)
                n_tok, n_unk = f_tokens.astype(np.int64), np.zeros(nf, dtype=np.int64)
            else:
                out_X = sp.csr_matrix((0, d), dtype=np.float64)
                pos, ts, ids = np.zeros(0, np.intp), np.zeros(0), ()
                n_tok = n_unk = np.zeros(0, dtype=np.int64)
        elif not nf:
            out_X, pos, ts, ids = cb.counts, s_pos, cb.timestamps, cb.doc_ids
            n_tok, n_unk = cb.n_tokens, cb.n_unknown
        else:                               # both kinds: merge the rows into batch order
            pos_all = np.concatenate([f_pos, s_pos])
            order = np.argsort(pos_all, kind="stable")
            out_X = sp.vstack([Xf, cb.counts], format="csr")[order]
            out_X = as_count_batch(out_X, n_features=d)
            out_X.sort_indices()
            pos = pos_all[order]
            ts = np.concatenate([f_ts, cb.timestamps])[order]
            all_ids = f_ids + list(cb.doc_ids)
            ids = tuple(all_ids[j] for j in order.tolist())
            n_tok = np.concatenate([f_tokens.astype(np.int64), cb.n_tokens])[order]
            n_unk = np.concatenate([np.zeros(nf, np.int64), cb.n_unknown])[order]
        return CountBatch(counts=out_X, timestamps=np.asarray(ts, dtype=np.float64), doc_ids=ids,
                          index=np.asarray(pos, dtype=np.intp), n_tokens=n_tok, n_unknown=n_unk,
                          errors=tuple(sorted(errors.items())))


# --------------------------------------------------------------------------- compiled fast path
@dataclass(frozen=True, eq=False)
class _ParsedCounts:
    """What the compiled parser accepted: rows in batch order (see :func:`_parse_counts_fast`)."""

    pos: np.ndarray             # intp (m,): batch positions
    ts: np.ndarray              # float64 (m,)
    doc_ids: list[str]
    lens: np.ndarray            # int64 (m,): words per document
    ids: np.ndarray             # int64 (Σ lens,): word ids, document after document
    cnt: np.ndarray             # int64 (Σ lens,)
    declined: np.ndarray        # intp: positions left to the Python loop (not in ``errors``)


def _counts_kernel():
    """The compiled parser (:mod:`streamdp._counts_decode_kernel`), imported on first use so
    that ``import streamdp`` does not pay for numba."""
    from streamdp._counts_decode_kernel import parse_counts_messages
    return parse_counts_messages


def warm_bulk_decoder() -> None:
    """Load (or compile) the compiled parser now (≈ 0.1–0.5 s once per process, ≈ 3 s to
    compile): a service pays it at start-up, not inside its first batch."""
    DocumentBatch([b""], Vocabulary(["x"]))


def _parse_counts_fast(values: Sequence[Any], errors: Mapping[int, InvalidMessage],
                       vocabulary: Vocabulary, max_bytes: int, max_tokens: int) -> _ParsedCounts:
    """Run the compiled parser over the batch: every valid token-id message of the common
    shape (:mod:`streamdp._counts_decode_kernel`) is parsed and checked there; the others are
    returned in ``declined`` for the full path."""
    n = len(values)
    raws = values if set(map(type, values)) == {bytes} else [v if type(v) is bytes else b"" for v in values]
    joined = b"".join(raws)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, raws), dtype=np.int64, count=n), out=starts[1:])
    skip = np.zeros(n, dtype=bool)
    if errors:
        skip[np.fromiter(errors, dtype=np.intp, count=len(errors))] = True
    ok = np.zeros(n, dtype=bool)
    ts = np.empty(n)
    id_span = np.empty((n, 2), dtype=np.int64)
    lens = np.empty(n, dtype=np.int64)
    cap = len(joined) // 2 + 1              # each (id, count) pair takes ≥ 2 bytes
    ids, cnt = np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.int64)
    used = _counts_kernel()(np.frombuffer(joined, dtype=np.uint8), starts, skip, max_bytes,
                            max_tokens, MAX_ID_CHARS, len(vocabulary),
                            np.frombuffer(vocabulary.id.encode("utf-8"), dtype=np.uint8),
                            ok, ts, id_span, lens, ids, cnt)
    pos = np.flatnonzero(ok)
    text = joined.decode("latin-1")         # accepted ids are ASCII: one char per byte
    doc_ids = [text[a:b] for a, b in id_span[pos].tolist()]
    return _ParsedCounts(pos=pos, ts=ts[pos], doc_ids=doc_ids, lens=lens[pos], ids=ids[:used],
                         cnt=cnt[:used], declined=np.flatnonzero(~ok & ~skip))
