"""What a state-store write or read fails with, and which Kafka errors mean a fenced writer.

:class:`WriterFenced`: a newer writer with the same ``transactional.id`` took over (stop
writing); :class:`WriterReinitialised`: a fatal producer error that is not fencing;
:class:`StateTopicMissing`: a setup error the CLI prints as one line.
"""
from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from streamdp.errors import StateStoreError


class StateWriteError(StateStoreError):
    """A state record could not be written completely (no manifest was written
    unless the message says otherwise; the previous state is still the latest)."""


class WriterFenced(StateWriteError):
    """A newer writer with the same ``transactional.id`` fenced this one: stop writing."""


class WriterReinitialised(StateWriteError):
    """The transactional producer hit a fatal error that is not fencing: it was re-created
    with the same ``transactional.id`` (``init_transactions`` bumps the producer epoch and
    aborts whatever the old one left open). Nothing of the failed write is committed; the
    caller re-validates its state against Kafka before writing again."""


FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
                 KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError behind ``exc`` (confluent-kafka may wrap it in a SystemError)."""
    for e in (exc, exc.__cause__, exc.__context__):
        if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
            return e.args[0]
    return None


class StateReadError(StateStoreError):
    """The state topic could not be read to its end offsets."""


class StateTopicMissing(StateReadError, ValueError):
    """The state topic does not exist: a setup error (the CLI prints it as one line, exit 2)."""
