"""Load a corpus file into the documents topic (``streamdp produce``).

Input: JSONL (one ``{"id", "ts", "text" | "tokens" | "counts"}`` object per
line) or msgpack (a stream of such maps). Each record's Kafka timestamp is the
document's ``ts`` (replay mode), so record times are non-decreasing per
partition when the file is in timestamp order — the release service's
completeness rule relies on it (docs/services.md). Records are keyed by id.

On a documents topic with ``message.timestamp.type=LogAppendTime`` (what
``--create-topics`` and ``streamdp topics`` create) a real Kafka broker replaces
that timestamp with its own append time, and production sketchers accept only
such records: replay mode then applies to ``non_production`` runs on the
embedded broker, which ignores LogAppendTime (docs/operations.md §Time).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterable, Iterator

import msgpack
from confluent_kafka import Producer

from streamdp import messages
from streamdp.kafka.topics import client_config

log = logging.getLogger("streamdp.produce")


def read_corpus(path: str | Path) -> Iterator[dict]:
    if str(path) == "-":
        import sys
        for lineno, line in enumerate(sys.stdin, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"<stdin>:{lineno}: not a JSON object ({exc})") from None
        return
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no corpus file at {str(path)!r}")
    if path.suffix in (".msgpack", ".mp"):
        with path.open("rb") as f:
            yield from msgpack.Unpacker(f, raw=False, strict_map_key=True)
        return
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not a JSON object ({exc})") from None


def encode_record(obj: dict) -> tuple[str, float, bytes]:
    kw = {k: obj[k] for k in ("text", "tokens", "counts") if k in obj}
    if isinstance(kw.get("counts"), dict) and "ids" in kw["counts"]:
        kw["counts"] = (kw["counts"]["ids"], kw["counts"]["counts"])
    raw = messages.encode_document(str(obj["id"]), float(obj["ts"]), **kw)
    return str(obj["id"]), float(obj["ts"]), raw


def produce(bootstrap: str, topic: str, records: Iterable[dict | tuple[str, float, bytes]], *,
            producer: Producer | None = None, producer_config: dict | None = None,
            progress=None) -> int:
    """Produce documents; returns how many were acknowledged. Raises on delivery failure."""
    own = producer is None
    base = producer_config if producer_config is not None else client_config(bootstrap, "producer")
    producer = producer or Producer({**base, "enable.idempotence": True, "acks": "all",
                                     "linger.ms": 20, "queue.buffering.max.messages": 200_000})
    failures: list[str] = []
    delivered = 0

    def on_delivery(err, _msg):
        nonlocal delivered
        if err is not None:
            failures.append(str(err))
        else:
            delivered += 1

    n, last_ts = 0, None
    for rec in records:
        doc_id, ts, raw = rec if isinstance(rec, tuple) else encode_record(rec)
        if last_ts is not None and ts < last_ts:
            log.warning("document %s is out of timestamp order (%s < %s): record times must be "
                        "non-decreasing per partition for epochs to close correctly", doc_id, ts, last_ts)
        last_ts = ts
        while True:
            try:
                producer.produce(topic, key=doc_id.encode(), value=raw, timestamp=int(ts * 1000),
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        n += 1
        if n % 10_000 == 0:
            producer.poll(0)
            if progress:
                progress(n)
    producer.flush(60)
    if failures:
        raise RuntimeError(f"{len(failures)} of {n} documents were not delivered; first: {failures[0]}")
    if delivered != n:
        raise RuntimeError(f"only {delivered} of {n} documents were acknowledged")
    return n
