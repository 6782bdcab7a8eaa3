"""Exceptions raised by a lower layer and caught by name in a higher one.

They live here, at the bottom of the import graph, so that e.g. the Kafka connectivity code
can raise a configuration error and recognise a state-store failure without importing the
service configuration or the state store (docs/architecture.md, "Layers").
"""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message says which and how to fix it."""


class StateStoreError(RuntimeError):
    """Base class of state store failures."""


# ------------------------------------------------------------------ a strategy's records
# A processing strategy (streamdp.services.sketch_strategy) raises these, after it processed
# what it could of a batch, as one ExceptionGroup; the stream processor
# (streamdp.services.processor) decides what each means, in one place: as Sentry arroyo's
# InvalidMessage (dead-letter it) and MessageRejected (pause, offer it again later).

class InvalidRecord(Exception):
    """A record that can never be processed (bad input): the processor dead-letters it, with
    ``error`` (a ``streamdp.messages.InvalidMessage``) saying why, before any checkpoint
    covers its offset."""

    def __init__(self, record, error) -> None:
        super().__init__(f"{getattr(error, 'error_class', 'invalid')}: {error}")
        self.record, self.error = record, error


class NotReady(Exception):
    """A record that cannot be processed yet: the strategy processed the partition's records
    before ``offset``; the processor pauses the partition at ``offset`` (the record is read
    again after resuming) until the strategy says ``need`` is there. ``what`` names it in logs."""

    def __init__(self, partition: int, offset: int, need: str, what: str | None = None) -> None:
        super().__init__(f"partition {partition} waits at offset {offset} for the {what or need}")
        self.partition, self.offset, self.need, self.what = partition, offset, need, what
