"""Load a corpus file into the documents topic (``streamdp produce``).

Input: JSONL (one ``{"id", "ts", "text" | "tokens" | "counts"}`` object per
line) or msgpack (a stream of such maps). Each record's Kafka timestamp is the
document's ``ts`` (replay mode), so record times are non-decreasing per
partition when the file is in timestamp order — the release service's
completeness rule relies on it (docs/services.md). Records are keyed by their ``user`` when they
have one, else by id; for a ``privacy_unit: user`` deployment each record's partition is set
explicitly by ``partition_for_user`` (all documents of a user in one partition, in order; the
sketchers dead-letter any document found elsewhere).

On a documents topic with ``message.timestamp.type=LogAppendTime`` (what
``--create-topics`` and ``streamdp topics`` create) a real Kafka broker replaces
that timestamp with its own append time, and production sketchers accept only
such records: replay mode then applies to ``non_production`` runs on the
embedded broker, which ignores LogAppendTime (docs/operations.md §Time).
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Iterable, Iterator

import msgpack
from confluent_kafka import Producer

from streamdp import messages
from streamdp.kafka.topics import client_config
from streamdp.privacy.user_bounding import partition_for_user
from streamdp.services.dedup import IdHasher, SeenIds

log = logging.getLogger("streamdp.produce")


MAX_REPORTED = 20     # rejected lines printed one by one; later ones are only counted


class Rejections:
    """Input lines refused by :func:`encoded_records`: counted, the first few described.

    ``streamdp produce`` skips a bad line (it is never sent), reports it with its line
    number and the field at fault, sends every good line, and exits with status 2 if any
    line was rejected (docs/operations.md §Loading documents)."""

    def __init__(self, report=None, max_reported: int = MAX_REPORTED) -> None:
        self.count = 0
        self.first: list[str] = []
        self.report = report
        self.max_reported = max_reported

    def add(self, where: str, why: str) -> None:
        self.count += 1
        msg = f"{where}: {why}; line skipped"
        if len(self.first) < self.max_reported:
            self.first.append(msg)
            if self.report:
                self.report(msg)
        elif self.count == self.max_reported + 1 and self.report:
            self.report(f"more than {self.max_reported} lines rejected: the rest are only counted")


def read_corpus(path: str | Path) -> Iterator[tuple[str, object]]:
    """(where, parsed object) per record; ``where`` is ``FILE:LINE`` (msgpack: ``FILE#RECORD``).
    A line that is not JSON gives a ValueError as its object (the caller reports it)."""
    def parse_lines(lines, name):
        for lineno, line in enumerate(lines, 1):
            if line.strip():
                try:
                    yield f"{name}:{lineno}", json.loads(line)
                except json.JSONDecodeError as exc:
                    yield f"{name}:{lineno}", ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})")

    if str(path) == "-":
        import sys
        yield from parse_lines(sys.stdin, "<stdin>")
        return
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no corpus file at {str(path)!r}")
    if path.suffix in (".msgpack", ".mp"):
        with path.open("rb") as f:
            try:
                for i, obj in enumerate(msgpack.Unpacker(f, raw=False, strict_map_key=True), 1):
                    yield f"{path}#{i}", obj
            except (ValueError, msgpack.UnpackException) as exc:
                raise ValueError(f"{path}: not a msgpack stream of maps ({exc}); records before "
                                 "the damage were queued") from None
        return
    with path.open("r", encoding="utf-8") as f:
        yield from parse_lines(f, str(path))


def count_lines(path: str | Path) -> int | None:
    """Lines of a JSONL corpus file (a progress bar's total: each is a document or a rejected
    line), or None for standard input and msgpack files. One pass over the bytes (≈ 1 s/GB)."""
    if str(path) == "-" or Path(path).suffix in (".msgpack", ".mp") or not Path(path).is_file():
        return None
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def encode_record(obj: dict) -> tuple[str, float, bytes]:
    """(id, ts, message) of one input object; ValueError naming the field at fault."""
    if not isinstance(obj, dict):
        raise ValueError(f"a document must be a JSON object with id, ts and text/tokens/counts, "
                         f"got {type(obj).__name__}")
    for name in ("id", "ts"):
        if name not in obj:
            raise ValueError(f"missing field {name!r} (each document needs 'id', 'ts' (unix "
                             "seconds) and one of 'text', 'tokens', 'counts'; docs/schemas.md)")
    doc_id = obj["id"]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or str(doc_id) == "":
        raise ValueError(f"field 'id' must be a non-empty string or an integer, got {doc_id!r}")
    ts = obj["ts"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise ValueError(f"field 'ts' must be a number (unix seconds), got {ts!r}")
    kw = {k: obj[k] for k in ("text", "tokens", "counts") if k in obj}
    if isinstance(kw.get("counts"), dict) and "ids" in kw["counts"]:
        kw["counts"] = (kw["counts"]["ids"], kw["counts"]["counts"])
    if "user" in obj:
        user = obj["user"]
        if isinstance(user, bool) or not isinstance(user, (str, int)) or str(user) == "":
            raise ValueError(f"field 'user' must be a non-empty string or an integer, got {user!r}")
        kw["user"] = str(user)
    try:
        raw = messages.encode_document(str(doc_id), float(ts), **kw)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"document {str(doc_id)!r}: {exc}") from None
    return str(doc_id), float(ts), raw


def record_key(obj: dict) -> str:
    """The Kafka key of an input object: its ``user`` if it has one (every document of a user
    then reaches the same partition, in order: the user-level unit needs it), else its id."""
    return str(obj["user"]) if "user" in obj else str(obj["id"])


def encoded_records(path: str | Path, rejections: Rejections, *, require_user: bool = False
                    ) -> Iterator[tuple[str, float, bytes, str, str | None]]:
    """The valid documents of a corpus file, encoded, with their Kafka key and user (or None);
    bad lines go to ``rejections``. ``require_user`` (a ``privacy_unit: user`` deployment): a
    document without ``user`` is rejected here rather than dead-lettered by the sketcher."""
    for where, obj in read_corpus(path):
        if isinstance(obj, Exception):
            rejections.add(where, str(obj))
            continue
        try:
            if require_user and isinstance(obj, dict) and "user" not in obj:
                raise ValueError("missing field 'user': this deployment's unit of privacy is the "
                                 "user (privacy_unit: user), so every document needs one")
            rec = encode_record(obj)
            yield (*rec, record_key(obj), str(obj["user"]) if "user" in obj else None)
        except ValueError as exc:
            rejections.add(where, str(exc))


class SentIds:
    """What ``streamdp produce`` knows about ids it already sent (issue 25 item 3).

    Without a state file: only repeats within this run (the later copies are sent, and the
    sketchers dead-letter them as ``duplicate_id``; produce warns). With ``--dedup-state FILE``:
    the ids of earlier runs too, and a document whose id is in the file is *not sent* again
    (counted and reported). The file holds 8-byte hashes of the ids (streamdp.services.dedup's
    format, under a fixed public key: anyone who can read it can test guessed ids against it;
    keep it where the corpus is). It is updated only after every document of a run was
    acknowledged: a failed run re-sends, and the sketchers deduplicate what arrives twice.
    The key is the id, or (user, id) for a ``privacy_unit: user`` deployment (as the sketchers)."""

    KEY = b"streamdp produce --dedup-state"

    def __init__(self, path: str | Path | None = None, *, user_mode: bool = False) -> None:
        self.path = None if path is None else Path(path)
        self.user_mode = user_mode
        self.hasher = IdHasher(self.KEY)
        data = self.path.read_bytes() if self.path is not None and self.path.is_file() else b""
        try:
            self.before = SeenIds.from_bytes(data)
        except ValueError as exc:
            raise ValueError(f"--dedup-state {str(self.path)!r} is not a produce dedup-state "
                             f"file ({exc})") from None
        self.this_run = SeenIds()
        self.skipped = 0            # in the state file: not sent
        self.repeated = 0           # repeated within this run: sent, dead-lettered by sketchers

    def filter(self, records):
        """The records of ``encoded_records`` minus those the state file says were sent."""
        for rec in records:
            doc_id, user = rec[0], rec[4] if len(rec) > 4 else None
            h = self.hasher.hashes([f"{user}\x00{doc_id}" if self.user_mode and user else doc_id])
            if self.path is not None and self.before.duplicates(h)[0]:
                self.skipped += 1
                continue
            if self.this_run.duplicates(h)[0]:
                self.repeated += 1
            else:
                self.this_run.add(h)
            yield rec

    def save(self) -> None:
        """Add this run's ids to the state file (atomically: write, fsync, rename)."""
        if self.path is None:
            return
        merged = SeenIds.from_bytes(self.before.to_bytes() + self.this_run.to_bytes())
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(merged.to_bytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def warnings(self) -> list[str]:
        out = []
        if self.skipped:
            out.append(f"{self.skipped:,} document(s) were not sent: their ids were sent before "
                       f"(--dedup-state {self.path})")
        if self.repeated:
            out.append(f"{self.repeated:,} document(s) repeat an id sent earlier in this run: the "
                       "sketchers count the first and dead-letter the others as duplicate_id")
        return out


def produce(bootstrap: str, topic: str, records: Iterable[dict | tuple[str, float, bytes]], *,
            producer: Producer | None = None, producer_config: dict | None = None,
            progress=None, stats: dict | None = None,
            user_partitions: int | None = None) -> int:
    """Produce documents; returns how many were acknowledged. Raises on delivery failure.

    ``user_partitions`` (a ``privacy_unit: user`` deployment: the documents topic's partition
    count): a document with a user is written to partition
    :func:`~streamdp.privacy.user_bounding.partition_for_user` explicitly — the rule the
    sketchers check — whatever the client's default partitioner would do with its key.
    Records are dicts, or tuples ``(id, ts, message[, key[, user]])``.

    Whatever stops the loop (a bad record, an exception of ``records``, Ctrl-C), the
    documents already queued are flushed first; ``stats`` (if given) then holds
    ``queued``, ``delivered`` and ``failed``. ``progress`` (e.g. a progress bar's
    ``update``) is called with the number of documents newly acknowledged by the broker."""
    base = producer_config if producer_config is not None else client_config(bootstrap, "producer")
    producer = producer or Producer({**base, "enable.idempotence": True, "acks": "all",
                                     "linger.ms": 20, "queue.buffering.max.messages": 200_000})
    failures: list[str] = []
    delivered = 0
    stats = {} if stats is None else stats

    def on_delivery(err, _msg):
        nonlocal delivered
        if err is not None:
            failures.append(str(err))
        else:
            delivered += 1
            if progress is not None:
                progress(1)

    n, last_ts = 0, None
    try:
        for rec in records:
            if isinstance(rec, tuple):      # (id, ts, message[, key[, user]]): key defaults to the id
                doc_id, ts, raw, *rest = rec
                key = rest[0] if rest else doc_id
                user = rest[1] if len(rest) > 1 else None
            else:
                doc_id, ts, raw = encode_record(rec)
                key = record_key(rec)
                user = str(rec["user"]) if "user" in rec else None
            where = ({} if user_partitions is None or user is None
                     else {"partition": partition_for_user(user, user_partitions)})
            if last_ts is not None and ts < last_ts:
                log.warning("document %s is out of timestamp order (%s < %s): record times must be "
                            "non-decreasing per partition for epochs to close correctly", doc_id, ts,
                            last_ts)
            last_ts = ts
            while True:
                try:
                    producer.produce(topic, key=key.encode(), value=raw, timestamp=int(ts * 1000),
                                     on_delivery=on_delivery, **where)
                    break
                except BufferError:
                    producer.poll(0.1)
            n += 1
            if n % 1000 == 0:
                producer.poll(0)        # serve delivery reports (and so the progress bar)
    finally:
        left = producer.flush(60)      # what was queued is sent even if the input broke off
        stats.update(queued=n, delivered=delivered, failed=len(failures), undelivered=left)
    if failures:
        raise RuntimeError(f"{len(failures)} of {n} documents were not delivered; first: {failures[0]}")
    if delivered != n:
        raise RuntimeError(f"only {delivered} of {n} documents were acknowledged")
    return n
