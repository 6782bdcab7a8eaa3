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
