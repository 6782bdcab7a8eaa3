"""The input-document message, schema v1: decoding, validation and encoding of one message.

A document arrives on the docs topic as a msgpack map (DESIGN §6; docs/schemas.md)::

    {"v": 1, "id": str, "ts": float | int,
     and exactly one of
       "text": str                                   raw text, tokenized by the sketcher
       "tokens": [str, ...]                          pre-tokenized, matched verbatim
       "counts": {"ids": [int], "counts": [int],     word counts over the public vocabulary
                  "vocab": str (optional)}}          ... whose vocabulary_id this must equal

:func:`decode_document` turns bytes into a :class:`Document` or raises
:class:`~streamdp.messages.errors.InvalidMessage` with a stable ``error_class``;
:func:`encode_document` is the producers' side.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import msgpack
import numpy as np

from streamdp import serialization as ser
from streamdp.messages.errors import (EMPTY_DOCUMENT, INVALID_UTF8, INVALID_VALUE, InvalidMessage,
                                      MALFORMED_MSGPACK, MISSING_FIELD, TOO_LARGE,
                                      UNSUPPORTED_VERSION, WRONG_TYPE)
from streamdp.text.vocabulary import Vocabulary

SCHEMA_VERSION = 1
MAX_ID_CHARS = 256
DEFAULT_MAX_BYTES = 1 << 20         # 1 MiB per document message
DEFAULT_MAX_TOKENS = 100_000        # tokens per document (text after tokenizing, tokens, Σcounts)
PAYLOAD_KINDS = ("text", "tokens", "counts")

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
    check_counts(ids, counts, vocab_id, max_tokens, vocabulary)
    return Document(doc_id, ts, "counts", (tuple(ids), tuple(counts)), vocab_id, user=user)


def _all_at_least(values: Sequence, bound: int) -> bool:
    """True only if no value is ``< bound``, proven by one C-level ``min``; False means "scan".

    A hot-path shortcut for :func:`check_counts` (called twice per counts document): when it
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


def check_counts(ids: Sequence[int], counts: Sequence[int], vocab_id: str | None,
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
