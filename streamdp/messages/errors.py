"""Why a document message was refused: stable error classes, :class:`InvalidMessage`, DLQ headers.

The error classes are part of the operational interface (dead-letter headers, metric labels).
Messages describe types, positions and bounds, never the document's words, so they can be
logged and put in headers without copying private text around (the DLQ record itself still
carries the raw message: the DLQ topic needs the same access control as the docs topic).
"""
from __future__ import annotations

from streamdp import serialization as ser

MAX_DLQ_MESSAGE_BYTES = 1024      # the error message header is truncated to this (UTF-8)

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
