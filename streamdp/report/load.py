"""Thin loaders for ``streamdp report``: snapshots and their vocabulary from a folder, one
file or the snapshots topic. Every failure is a :class:`ReportInputError` with a one-line
message that names the input and the fix (the CLI prints it; no traceback)."""
from __future__ import annotations

from pathlib import Path

from streamdp.snapshot import TopicSnapshot
from streamdp.text.vocabulary import Vocabulary

SNAPSHOT_GLOB = "epoch-*.msgpack"
VOCABULARY_FILE = "vocabulary.txt"


class ReportInputError(ValueError):
    """The report's input is missing or is not what it should be."""


def decode_snapshot(data: bytes, where: str) -> TopicSnapshot:
    """A snapshot from its bytes; anything else is a ReportInputError naming ``where``."""
    try:
        return TopicSnapshot.from_bytes(data)
    except Exception as exc:            # msgpack, schema, array errors: all mean "not a snapshot"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ReportInputError(f"{where} is not a streamdp topic snapshot ({first[:200]})") from None


def snapshots_from_path(path: str | Path) -> list[TopicSnapshot]:
    """A folder's ``epoch-*.msgpack`` snapshots (the release service's ``snapshot_dir``), or one
    snapshot file."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob(SNAPSHOT_GLOB))
        if not files:
            raise ReportInputError(f"no snapshots in {p} (expected {SNAPSHOT_GLOB} files, as the "
                                   "release service writes to its snapshot_dir)")
        return [decode_snapshot(f.read_bytes(), str(f)) for f in files]
    if p.is_file():
        data = p.read_bytes()
        if data.lstrip()[:1] == b"{":
            raise ReportInputError(f"{p} is JSON, not a snapshot (latest.json holds only the top "
                                   "words): pass the snapshot folder or an epoch-*.msgpack file")
        return [decode_snapshot(data, str(p))]
    raise ReportInputError(f"no snapshot folder or file at {str(p)!r}: pass the release service's "
                           "snapshot_dir, one epoch-*.msgpack file, or --bootstrap for the "
                           "snapshots topic")


def snapshots_from_topic(bootstrap: str, topic: str, *, timeout: float = 30.0) -> list[TopicSnapshot]:
    """Every snapshot on ``topic`` (from the beginning to the end offsets read at the start)."""
    from streamdp.kafka.connectivity import check_bootstrap
    from streamdp.kafka.topics import client_config
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
    import time
    import uuid

    try:
        check_bootstrap(client_config(bootstrap, "admin"), timeout=min(timeout, 10.0))
    except ValueError as exc:
        raise ReportInputError(str(exc).splitlines()[0]) from None
    # the end of each partition is its EOF event, not the ListOffsets watermark: the embedded
    # broker answers ListOffsets wrongly (docs/kafka.md), fetch responses carry the true one
    consumer = Consumer(client_config(bootstrap, "consumer", **{
        "group.id": f"streamdp-report-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "enable.partition.eof": True}))
    try:
        try:
            meta = consumer.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise ReportInputError(f"cannot read topic {topic!r} at {bootstrap}: {exc}") from None
        tmeta = meta.topics.get(topic)
        if tmeta is None or tmeta.error is not None or not tmeta.partitions:
            raise ReportInputError(f"no topic {topic!r} at {bootstrap} (the snapshots topic is "
                                   "<topic_prefix>.snapshots, e.g. streamdp.snapshots)")
        todo = set(tmeta.partitions)
        consumer.assign([TopicPartition(topic, pid, OFFSET_BEGINNING) for pid in todo])
        out, deadline = [], time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    todo.discard(msg.partition())
                    continue
                raise ReportInputError(f"reading {topic!r} at {bootstrap}: {msg.error()}")
            if msg.value() is not None:
                out.append(decode_snapshot(msg.value(), f"message {msg.partition()}:{msg.offset()} "
                                                        f"of {topic!r}"))
        if todo:
            raise ReportInputError(f"read only part of {topic!r} at {bootstrap} within {timeout:g} s")
        if not out:
            raise ReportInputError(f"topic {topic!r} at {bootstrap} holds no snapshots yet")
        return out
    finally:
        consumer.close()


def load_vocabulary(path: str | Path | None, *, near: str | Path | None = None) -> Vocabulary:
    """The vocabulary file ``path``, or ``vocabulary.txt`` next to the snapshots (``near``)."""
    if path is None:
        if near is None:
            raise ReportInputError("the snapshots topic does not carry the vocabulary: pass "
                                   "--vocabulary FILE (the release service writes it to "
                                   "<snapshot_dir>/vocabulary.txt)")
        base = Path(near)
        path = (base if base.is_dir() else base.parent) / VOCABULARY_FILE
    p = Path(path)
    if not p.is_file():
        raise ReportInputError(f"no vocabulary file at {str(p)!r}: pass --vocabulary FILE, the "
                               "vocabulary the snapshots were released with (the release service "
                               "writes <snapshot_dir>/vocabulary.txt; the demo <workdir>/vocabulary.txt)")
    try:
        return Vocabulary.load(p)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReportInputError(f"cannot read the vocabulary file {str(p)!r}: "
                               f"{str(exc).splitlines()[0]}") from None
