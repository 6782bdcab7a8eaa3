"""Input-document messages (schema v1): decoding, validation, encoding, batching, DLQ headers.

Four modules, one idea each (docs/schemas.md):

:mod:`~streamdp.messages.schema`
    The v1 message: :func:`decode_document` turns bytes into a :class:`Document` or raises
    :class:`InvalidMessage`; :func:`encode_document` is the producers' side.
:mod:`~streamdp.messages.errors`
    The stable error classes, :class:`InvalidMessage` and the dead-letter record's headers
    (:func:`dlq_headers`). Error messages describe types, positions and bounds, never the
    document's words.
:mod:`~streamdp.messages.counts`
    :func:`documents_to_counts`: decoded documents to one CSR count batch, validating
    everything first and returning the bad documents separately, so a bad document never
    half-updates a sketch.
:mod:`~streamdp.messages.bulk`
    :class:`DocumentBatch`: the sketcher's hot path, the same results for a whole poll batch.

This package re-exports their public names.
"""
from streamdp.messages.bulk import DocumentBatch, _parse_counts_fast, warm_bulk_decoder
from streamdp.messages.counts import CountBatch, documents_to_counts
from streamdp.messages.errors import (
    DLQ_HEADERS, DUPLICATE_ID, EMPTY_DOCUMENT, ERROR_CLASSES, HEADER_ERROR_CLASS,
    HEADER_ERROR_MESSAGE, HEADER_SOURCE_OFFSET, HEADER_SOURCE_PARTITION, HEADER_SOURCE_TOPIC,
    INVALID_UTF8, INVALID_VALUE, MALFORMED_MSGPACK, MAX_DLQ_MESSAGE_BYTES, MISSING_FIELD,
    MISSING_USER, TOO_LARGE, UNSUPPORTED_VERSION, USER_ERROR_CLASSES, USER_PARTITION_MISMATCH,
    WRONG_TYPE, InvalidMessage, dlq_headers)
from streamdp.messages.schema import (
    DEFAULT_MAX_BYTES, DEFAULT_MAX_TOKENS, MAX_ID_CHARS, PAYLOAD_KINDS, SCHEMA_VERSION, Document,
    Kind, Payload, decode_document, encode_document, validate_document)

__all__ = [
    "DocumentBatch", "warm_bulk_decoder", "CountBatch", "documents_to_counts",
    "DLQ_HEADERS", "DUPLICATE_ID", "EMPTY_DOCUMENT", "ERROR_CLASSES", "HEADER_ERROR_CLASS",
    "HEADER_ERROR_MESSAGE", "HEADER_SOURCE_OFFSET", "HEADER_SOURCE_PARTITION",
    "HEADER_SOURCE_TOPIC", "INVALID_UTF8", "INVALID_VALUE", "MALFORMED_MSGPACK",
    "MAX_DLQ_MESSAGE_BYTES", "MISSING_FIELD", "MISSING_USER", "TOO_LARGE", "UNSUPPORTED_VERSION",
    "USER_ERROR_CLASSES", "USER_PARTITION_MISMATCH", "WRONG_TYPE", "InvalidMessage",
    "dlq_headers", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_TOKENS", "MAX_ID_CHARS", "PAYLOAD_KINDS",
    "SCHEMA_VERSION", "Document", "Kind", "Payload", "decode_document", "encode_document",
    "validate_document",
    "_parse_counts_fast",   # tests/test_counts_decoder.py drives the compiled parser directly
]
